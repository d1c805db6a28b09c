/* Runner of an EAGLE-3 head (see eagle3_forward.h for rows and positions): the cache
 * bookkeeping, the token embeddings (rows dequantized from the table in its stored type,
 * per call) and the pool growth; the layer's arithmetic is a kernels/eagle3_layer.h
 * implementation (the CPU's, or CUDA's). */
#include "eagle3_forward.h"
#include "common/randmodel.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_topk.h"
#include "kernels/eagle3_layer.h"
#include "pool_grow.h"
#include <string.h>

struct Eagle3Runner {
    const Eagle3Head *h;
    Eagle3Embed embed;
    const Eagle3LayerOps *ops;
    Eagle3Layer *layer;
    int cap, max_batch, n_committed, n_pending, dim;
    float *emb;         // (max_batch, dim) the batch's token embeddings
    float *last_state;  // (dim) commit's last row when the caller wants no state
    /* pool growth (eagle3_grow_pool) */
    float *node_state;  // (POOL_N_EXPANDED, dim) output state of each pending tree row
    float *grow_logits; // (POOL_EXPAND, draft_vocab)
    float *grow_state;  // (POOL_EXPAND, dim) parents' states of one pass
    const float *grow_root; // (dim) the root's state during eagle3_grow_pool
    uint64_t run_ns;    /* time inside the implementation's run(), for the host share */
    int rows_reduced;   /* logits rows eagle3_grow_pool reduced to top-10s */
};

const Eagle3LayerOps *eagle3_layer_for(const BackendOps *backend, RsErr *e) {
    const Eagle3LayerOps *ops = backend_eagle3_layer(backend);
    if (!ops)
        rs_err(e, RS_EUNSUPPORTED, "EAGLE-3 heads run on the cpu and cuda backends only");
    return ops;
}

int eagle3_runner_create_on(const Eagle3Head *h, const Eagle3Embed *embed,
                            const Eagle3LayerOps *ops, const BackendParams *bp,
                            Eagle3Runner **out, RsErr *e) {
    *out = NULL;
    RS_ASSERT(h && embed && ops && bp && h->lm_head.data);
    RS_ASSERT(embed->table.rows == h->cfg.c.vocab_size && embed->table.cols == h->cfg.c.dim);
    int kv_capacity = bp->kv_capacity, max_batch = bp->max_batch;
    if (kv_capacity < 1 || max_batch < 1 || max_batch > kv_capacity)
        return rs_err(e, RS_EINVAL, "EAGLE-3 runner: kv_capacity %d / max_batch %d",
                      kv_capacity, max_batch);
    Eagle3Layer *layer = NULL;
    int rc = ops->create(h, bp, &layer, e);
    if (rc) return rc;
    Eagle3Runner *r = rs_xcalloc(1, sizeof *r);
    r->h = h;
    r->embed = *embed;
    r->ops = ops;
    r->layer = layer;
    r->cap = kv_capacity;
    r->max_batch = max_batch;
    r->dim = h->cfg.c.dim;
    r->emb = rs_xmalloc(sizeof(float) * (size_t)max_batch * r->dim);
    r->last_state = rs_xmalloc(sizeof(float) * (size_t)r->dim);
    r->node_state = rs_xmalloc(sizeof(float) * POOL_N_EXPANDED * r->dim);
    r->grow_logits = rs_xmalloc(sizeof(float) * POOL_EXPAND * (size_t)h->cfg.draft_vocab);
    r->grow_state = rs_xmalloc(sizeof(float) * POOL_EXPAND * r->dim);
    *out = r;
    return RS_OK;
}

int eagle3_runner_create(const Eagle3Head *h, const float *embed, int kv_capacity,
                         int max_batch, Eagle3Runner **out, RsErr *e) {
    RS_ASSERT(embed);
    Eagle3Embed em = {.table = qtensor_f32(embed, h->cfg.c.vocab_size, h->cfg.c.dim)};
    BackendParams bp = {.kv_capacity = kv_capacity, .max_batch = max_batch, .threads = 1};
    return eagle3_runner_create_on(h, &em, &cpu_eagle3_layer, &bp, out, e);
}

void eagle3_runner_destroy(Eagle3Runner **pr) {
    if (!pr || !*pr) return;
    Eagle3Runner *r = *pr;
    r->ops->destroy(&r->layer);
    free(r->emb);
    free(r->last_state);
    free(r->node_state);
    free(r->grow_logits);
    free(r->grow_state);
    free(r);
    *pr = NULL;
}

const char *eagle3_runner_backend(const Eagle3Runner *r) { return r->ops->name; }
void eagle3_reset(Eagle3Runner *r) { r->n_committed = r->n_pending = 0; }
int eagle3_n_committed(const Eagle3Runner *r) { return r->n_committed; }
int eagle3_n_pending(const Eagle3Runner *r) { return r->n_pending; }
uint64_t eagle3_run_ns(const Eagle3Runner *r) { return r->run_ns; }

/* The implementation's run(), its time counted in run_ns (the rest of a growth is host
 * work). */
static void run_timed(Eagle3Runner *r, const Eagle3Batch *b) {
    uint64_t t0 = rs_now_ns();
    r->ops->run(r->layer, b);
    r->run_ns += rs_now_ns() - t0;
}

int eagle3_node_pos(const Eagle3Runner *r, int depth) { return r->n_committed - 1 + depth; }

typedef struct {
    RandTensor t;
    int found;
} FindEmbed;

static void find_embed(void *u, const RandTensor *t) {
    FindEmbed *f = u;
    if (t->kind == RT_TOK_EMBEDDINGS) f->t = *t, f->found = 1;
}

int eagle3_embed_of(const Model *m, Eagle3Embed *out, RsErr *e) {
    memset(out, 0, sizeof *out);
    out->table = m->w.tok_embeddings;
    out->table.rows = m->cfg.vocab_size;
    out->table.cols = m->cfg.dim;
    if (out->table.data) return RS_OK;
    FindEmbed f = {0};
    if (m->random_weights) model_random_walk(&m->cfg, m->random_seed, find_embed, &f);
    if (!f.found)
        return rs_err(e, RS_EUNSUPPORTED, "model %s has no host copy of its token embeddings "
                      "for an EAGLE-3 head", m->path);
    out->rand_seed = f.t.seed;
    out->rand_scale = f.t.scale;
    out->rand_base = f.t.base;
    return RS_OK;
}

void eagle3_embed_row(const Eagle3Embed *em, int token, float *dst) {
    if (em->table.data) {
        qtensor_dequantize_rows(&em->table, token, 1, dst);
        return;
    }
    uint64_t i0 = (uint64_t)token * (uint64_t)em->table.cols;
    for (int i = 0; i < em->table.cols; i++)
        dst[i] = rs_rand_value(em->rand_seed, i0 + (uint64_t)i, em->rand_scale, em->rand_base);
}

/* The batch's token embedding rows into r->emb. */
static void embed_rows(Eagle3Runner *r, const int *tokens, int n) {
    for (int t = 0; t < n; t++) eagle3_embed_row(&r->embed, tokens[t], r->emb + (size_t)t * r->dim);
}

static int check_tokens(const Eagle3Runner *r, const int *tokens, int n, RsErr *e) {
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= r->h->cfg.c.vocab_size)
            return rs_err(e, RS_EINVAL, "token id %d at %d outside the EAGLE-3 head's vocabulary "
                          "of %d", tokens[i], i, r->h->cfg.c.vocab_size);
    return RS_OK;
}

int eagle3_commit(Eagle3Runner *r, const int *tokens, const float *feats, int n,
                  float *hidden_out, float *logits_out, RsErr *e) {
    RS_ASSERT(n >= 0 && (n == 0 || (tokens && feats)));
    if (r->n_committed + n > r->cap)
        return rs_err(e, RS_EINVAL, "EAGLE-3 head KV cache full: %d committed + %d new > "
                      "capacity %d", r->n_committed, n, r->cap);
    int rc = check_tokens(r, tokens, n, e);
    if (rc) return rc;
    int F = EAGLE3_N_FEATURES * r->h->cfg.target_hidden;
    int want = hidden_out || logits_out;
    r->n_pending = 0; /* last round's tree rows */
    for (int off = 0; off < n; off += r->max_batch) {
        int m = n - off < r->max_batch ? n - off : r->max_batch, last = off + m == n;
        int pos[m];
        for (int t = 0; t < m; t++) pos[t] = r->n_committed + t;
        embed_rows(r, tokens + off, m);
        Eagle3Batch b = {.in = feats + (size_t)off * F, .fc = 1, .emb = r->emb, .pos = pos,
                         .mask = NULL, .n = m, .n_committed = r->n_committed, .n_pending = 0,
                         .out_from = last && want ? m - 1 : m,
                         .state_out = hidden_out ? hidden_out : r->last_state,
                         .logits_out = logits_out ? logits_out : r->grow_logits};
        run_timed(r, &b);
        r->n_committed += m;
    }
    return RS_OK;
}

int eagle3_expand(Eagle3Runner *r, const int *tokens, const float *state_in, const int *pos,
                  const uint8_t *mask, int n, float *logits_out, float *state_out, RsErr *e) {
    RS_ASSERT(n >= 1 && tokens && state_in && pos && (logits_out || r->ops->topk) && state_out);
    int np = r->n_pending, cols = np + n;
    if (n > r->max_batch || r->n_committed + cols > r->cap)
        return rs_err(e, RS_EINVAL, "EAGLE-3 expansion of %d rows: max_batch %d, %d committed + "
                      "%d pending, capacity %d", n, r->max_batch, r->n_committed, np, r->cap);
    int rc = check_tokens(r, tokens, n, e);
    if (rc) return rc;
    embed_rows(r, tokens, n);
    Eagle3Batch b = {.in = state_in, .fc = 0, .emb = r->emb, .pos = pos, .mask = mask, .n = n,
                     .n_committed = r->n_committed, .n_pending = np, .out_from = 0,
                     .state_out = state_out, .logits_out = logits_out};
    run_timed(r, &b);
    r->n_pending += n;
    return RS_OK;
}

/* n rows at once through the CPU's fused top-k + log-sum-exp (kernels/cpu/cpu_topk.h): one
 * read of each row, no double-precision exp per column. */
static void topk_rows(const Eagle3Head *h, const float *logits, int n, int k, int *target_ids,
                      float *logq) {
    int DV = h->cfg.draft_vocab;
    RS_ASSERT(k >= 1 && k <= DV && k <= CPU_TOPK_MAX && n >= 1 && n <= POOL_EXPAND);
    CpuTopkPart parts[POOL_EXPAND];
    int idx[POOL_EXPAND * CPU_TOPK_MAX];
    float lq[POOL_EXPAND * CPU_TOPK_MAX], lse[POOL_EXPAND];
    cpu_topk(NULL, logits, n, DV, k, idx, lq, lse, parts);
    for (int i = 0; i < n * k; i++) {
        target_ids[i] = h->d2t[idx[i]];
        if (logq) logq[i] = lq[i];
    }
}

void eagle3_topk(const Eagle3Head *h, const float *logits, int k, int *target_ids, float *logq) {
    topk_rows(h, logits, 1, k, target_ids, logq);
}

/* pool_grow's callback: each node runs with its parent's output state (the root's for
 * depth 1), its outputs kept for its children; top 10 over the draft vocabulary mapped to
 * target ids. */
static int expand_nodes(void *ctx, const PoolPass *pass, int *ids, float *logq, RsErr *e) {
    Eagle3Runner *r = ctx;
    int n = pass->n, np = pass->n_pending, D = r->dim;
    int pos[POOL_EXPAND] = {0};
    RS_ASSERT(n <= POOL_EXPAND && np == r->n_pending && np + n <= POOL_N_EXPANDED);
    float *st = r->grow_state;
    for (int k = 0; k < n; k++) {
        pos[k] = eagle3_node_pos(r, pass->depth);
        int pr = pass->parent_row[k];
        memcpy(st + (size_t)k * D, pr < 0 ? r->grow_root : r->node_state + (size_t)pr * D,
               sizeof(float) * D);
    }
    /* Reduced where the logits are when the implementation can (CUDA: on the device, so
     * only ten ids and log q a row cross), else here on the host. */
    int dev = r->ops->topk != NULL;
    int rc = eagle3_expand(r, pass->token, st, pos, pass->mask, n, dev ? NULL : r->grow_logits,
                           r->node_state + (size_t)np * D, e);
    if (rc) return rc;
    if (dev) {
        uint64_t t0 = rs_now_ns();
        r->ops->topk(r->layer, n, POOL_TOPK, ids, logq);
        r->run_ns += rs_now_ns() - t0;
        for (int i = 0; i < n * POOL_TOPK; i++) ids[i] = r->h->d2t[ids[i]];
    } else {
        topk_rows(r->h, r->grow_logits, n, POOL_TOPK, ids, logq);
    }
    r->rows_reduced += n;
    return RS_OK;
}

int eagle3_grow_pool(Eagle3Runner *r, const float *root_state, const float *root_logits,
                     Pool *p, RsErr *e) {
    if (r->max_batch < POOL_EXPAND || r->n_pending != 0 ||
        r->n_committed + POOL_N_EXPANDED > r->cap || r->h->cfg.draft_vocab < POOL_TOPK)
        return rs_err(e, RS_EINVAL, "EAGLE-3 pool growth needs max_batch >= %d (have %d), room "
                      "for %d tree rows (%d committed + %d pending of %d) and a draft vocabulary "
                      "of at least %d", POOL_EXPAND, r->max_batch, POOL_N_EXPANDED,
                      r->n_committed, r->n_pending, r->cap, POOL_TOPK);
    uint64_t t0 = rs_now_ns(), run0 = r->run_ns;
    int ids[POOL_TOPK];
    float lq[POOL_TOPK];
    eagle3_topk(r->h, root_logits, POOL_TOPK, ids, lq);
    r->rows_reduced = 1;
    r->grow_root = root_state;
    int rc = pool_grow(p, ids, lq, 0, POOL_MAX_DEPTH, POOL_EXPAND, expand_nodes, r, r->h->cfg.c.vocab_size, "EAGLE-3 head", e);
    r->grow_root = NULL;
    if (rc) return rc;
    p->draft_ns = rs_now_ns() - t0;
    uint64_t fwd = r->run_ns - run0;
    p->draft_host_ns = p->draft_ns > fwd ? p->draft_ns - fwd : 0;
    p->draft_rows = r->rows_reduced;
    return RS_OK;
}
