/* CPU forward of an EAGLE-3 head in f32 (see eagle3_forward.h for rows and positions).
 * One decoder layer, written after SGLang llama_eagle3.py LlamaDecoderLayer.forward and
 * EAGLE cnets.py LlamaDecoderLayeremb.forward:
 *   h   = fc(features)  or the parent's output state
 *   x   = cat(input_layernorm(embed(token)), hidden_norm(h))      (2*dim)
 *   h  += o_proj(attention(rope(q_proj x), rope(k_proj x), v_proj x))
 *   h  += mlp(post_attention_layernorm(h))                        -> the output state
 *   logits = lm_head(norm(h))                                     (draft vocabulary)
 * Built from the CPU backend's reference operations (kernels/cpu_ops.h), so the head's
 * arithmetic is the target's; buffers are allocated once. */
#include "eagle3_forward.h"
#include "common/logits.h"
#include "kernels/backend.h"
#include "kernels/cpu_ops.h"
#include <string.h>

struct Eagle3Runner {
    const Eagle3Head *h;
    const float *embed; // (vocab, dim)
    int cap, max_batch, n_committed, n_pending;
    int dim, qd, kvd, hd, hidden;
    float *kc, *vc;     // (cap, kvd) RoPE applied to keys
    float *hs;          // (max_batch, dim) state / residual stream
    float *x;           // (max_batch, 2*dim) attention input
    float *q, *att_out; // (max_batch, qd)
    float *xb;          // (max_batch, dim)
    float *hb, *hb2;    // (max_batch, hidden)
    float *att;         // (2 * cap) attention scratch (n_committed + max_pending)
    float *inv_freq;    // (hd/2)
    float *cs, *sn;     // (max_batch, hd/2)
    int *vis;           // (max_batch, cap) pending rows each new row sees
    int *n_vis;         // (max_batch)
    /* pool growth (eagle3_grow_pool) */
    float *node_state;  // (POOL_N_EXPANDED, dim) output state of each pending tree row
    float *grow_logits; // (POOL_EXPAND, draft_vocab)
    float *grow_state;  // (POOL_EXPAND, dim) parents' states of one pass
    int slot_of[POOL_MAX]; /* pending row of an expanded pool node, -1 if none */
};

int eagle3_runner_create(const Eagle3Head *h, const float *embed, int kv_capacity,
                         int max_batch, Eagle3Runner **out, RsErr *e) {
    *out = NULL;
    RS_ASSERT(h && embed && h->arena);
    if (kv_capacity < 1 || max_batch < 1 || max_batch > kv_capacity)
        return rs_err(e, RS_EINVAL, "EAGLE-3 runner: kv_capacity %d / max_batch %d",
                      kv_capacity, max_batch);
    const Config *c = &h->cfg.c;
    Eagle3Runner *r = rs_xcalloc(1, sizeof *r);
    r->h = h;
    r->embed = embed;
    r->cap = kv_capacity;
    r->max_batch = max_batch;
    r->dim = c->dim;
    r->hd = c->head_dim;
    r->qd = c->n_heads * c->head_dim;
    r->kvd = c->n_kv_heads * c->head_dim;
    r->hidden = c->hidden_dim;
    size_t B = (size_t)max_batch, half = (size_t)r->hd / 2;
    r->kc = rs_xmalloc(sizeof(float) * (size_t)kv_capacity * r->kvd);
    r->vc = rs_xmalloc(sizeof(float) * (size_t)kv_capacity * r->kvd);
    r->hs = rs_xmalloc(sizeof(float) * B * r->dim);
    r->x = rs_xmalloc(sizeof(float) * B * 2 * r->dim);
    r->q = rs_xmalloc(sizeof(float) * B * r->qd);
    r->att_out = rs_xmalloc(sizeof(float) * B * r->qd);
    r->xb = rs_xmalloc(sizeof(float) * B * r->dim);
    r->hb = rs_xmalloc(sizeof(float) * B * r->hidden);
    r->hb2 = rs_xmalloc(sizeof(float) * B * r->hidden);
    r->att = rs_xmalloc(sizeof(float) * 2 * (size_t)kv_capacity);
    r->inv_freq = rs_xmalloc(sizeof(float) * half);
    r->cs = rs_xmalloc(sizeof(float) * B * half);
    r->sn = rs_xmalloc(sizeof(float) * B * half);
    r->vis = rs_xmalloc(sizeof(int) * B * (size_t)kv_capacity);
    r->n_vis = rs_xmalloc(sizeof(int) * B);
    r->node_state = rs_xmalloc(sizeof(float) * POOL_N_EXPANDED * r->dim);
    r->grow_logits = rs_xmalloc(sizeof(float) * POOL_EXPAND * (size_t)h->cfg.draft_vocab);
    r->grow_state = rs_xmalloc(sizeof(float) * POOL_EXPAND * r->dim);
    rope_inv_freq(c, r->inv_freq);
    *out = r;
    return RS_OK;
}

void eagle3_runner_destroy(Eagle3Runner **pr) {
    if (!pr || !*pr) return;
    Eagle3Runner *r = *pr;
    float *bufs[] = {r->kc, r->vc, r->hs, r->x, r->q, r->att_out, r->xb, r->hb, r->hb2,
                     r->att, r->inv_freq, r->cs, r->sn, r->node_state, r->grow_logits,
                     r->grow_state};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(r->vis);
    free(r->n_vis);
    free(r);
    *pr = NULL;
}

void eagle3_reset(Eagle3Runner *r) { r->n_committed = r->n_pending = 0; }
int eagle3_n_committed(const Eagle3Runner *r) { return r->n_committed; }
int eagle3_n_pending(const Eagle3Runner *r) { return r->n_pending; }
int eagle3_node_pos(const Eagle3Runner *r, int depth) { return r->n_committed - 1 + depth; }

/* q for the batch and k/v into cache slots [start, start + n), RoPE'd at pos. */
static void qkv(Eagle3Runner *r, const int *tokens, const int *pos, int n, int start) {
    const Eagle3Head *h = r->h;
    int D = r->dim, half = r->hd / 2;
    float eps = h->cfg.c.norm_eps;
    for (int t = 0; t < n; t++) {
        float *xt = r->x + (size_t)t * 2 * D;
        cpu_rmsnorm(xt, r->embed + (size_t)tokens[t] * D, h->input_norm, D, eps);
        cpu_rmsnorm(xt + D, r->hs + (size_t)t * D, h->hidden_norm, D, eps);
    }
    cpu_rope_table(pos, r->inv_freq, n, half, r->cs, r->sn);
    float *knew = r->kc + (size_t)start * r->kvd, *vnew = r->vc + (size_t)start * r->kvd;
    cpu_matmul(r->q, r->x, h->wq, n, 2 * D, r->qd, r->qd);
    cpu_matmul(knew, r->x, h->wk, n, 2 * D, r->kvd, r->kvd);
    cpu_matmul(vnew, r->x, h->wv, n, 2 * D, r->kvd, r->kvd);
    for (int t = 0; t < n; t++) {
        const float *cs = r->cs + (size_t)t * half, *sn = r->sn + (size_t)t * half;
        for (int k = 0; k < r->qd; k += r->hd) cpu_rope(r->q + (size_t)t * r->qd + k, cs, sn, half);
        for (int k = 0; k < r->kvd; k += r->hd) cpu_rope(knew + (size_t)t * r->kvd + k, cs, sn, half);
    }
}

/* The layer over n rows whose states are in r->hs and visible pending rows in r->vis;
 * writes their keys/values after the pending rows, leaves the output states in r->hs. */
static void layer(Eagle3Runner *r, const int *tokens, const int *pos, int n) {
    const Eagle3Head *h = r->h;
    const Config *c = &h->cfg.c;
    int D = r->dim, H = r->hidden;
    qkv(r, tokens, pos, n, r->n_committed + r->n_pending);
    cpu_attention(r->att_out, r->q, r->kc, r->vc, r->n_committed, r->vis, r->n_vis, r->cap, n,
                  c->n_heads, c->n_kv_heads, r->hd, r->att);
    cpu_matmul(r->xb, r->att_out, h->wo, n, r->qd, D, D);
    cpu_residual_add(r->hs, r->xb, (size_t)n * D); /* the residual is h itself, un-normed */
    for (int t = 0; t < n; t++)
        cpu_rmsnorm(r->xb + (size_t)t * D, r->hs + (size_t)t * D, h->post_norm, D, c->norm_eps);
    cpu_matmul(r->hb, r->xb, h->w_gate, n, D, H, H);
    cpu_matmul(r->hb2, r->xb, h->w_up, n, D, H, H);
    cpu_swiglu(r->hb, r->hb2, (size_t)n * H);
    cpu_matmul(r->xb, r->hb, h->w_down, n, H, D, D);
    cpu_residual_add(r->hs, r->xb, (size_t)n * D);
}

/* Logits of rows [0, n) of r->hs into out (n, draft_vocab). */
static void head_logits(Eagle3Runner *r, int n, float *out) {
    const Eagle3Head *h = r->h;
    for (int t = 0; t < n; t++)
        cpu_rmsnorm(r->xb + (size_t)t * r->dim, r->hs + (size_t)t * r->dim, h->norm, r->dim,
                h->cfg.c.norm_eps);
    cpu_matmul(out, r->xb, h->lm_head, n, r->dim, h->cfg.draft_vocab, h->cfg.draft_vocab);
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
    const Eagle3Head *h = r->h;
    int D = r->dim, F = EAGLE3_N_FEATURES * h->cfg.target_hidden;
    r->n_pending = 0; /* last round's tree rows */
    for (int off = 0; off < n; off += r->max_batch) {
        int m = n - off < r->max_batch ? n - off : r->max_batch;
        int pos[m];
        for (int t = 0; t < m; t++) pos[t] = r->n_committed + t;
        cpu_attention_index(NULL, m, 0, r->cap, r->vis, r->n_vis); /* causal in the chunk */
        cpu_matmul(r->hs, feats + (size_t)off * F, h->fc, m, F, D, D);
        layer(r, tokens + off, pos, m);
        r->n_committed += m;
        if (off + m == n) {
            if (hidden_out) memcpy(hidden_out, r->hs + (size_t)(m - 1) * D, sizeof(float) * D);
            if (logits_out) {
                memmove(r->hs, r->hs + (size_t)(m - 1) * D, sizeof(float) * D);
                head_logits(r, 1, logits_out);
            }
        }
    }
    return RS_OK;
}

int eagle3_expand(Eagle3Runner *r, const int *tokens, const float *state_in, const int *pos,
                  const uint8_t *mask, int n, float *logits_out, float *state_out, RsErr *e) {
    RS_ASSERT(n >= 1 && tokens && state_in && pos && logits_out && state_out);
    int np = r->n_pending, cols = np + n;
    if (n > r->max_batch || r->n_committed + cols > r->cap)
        return rs_err(e, RS_EINVAL, "EAGLE-3 expansion of %d rows: max_batch %d, %d committed + "
                      "%d pending, capacity %d", n, r->max_batch, r->n_committed, np, r->cap);
    int rc = check_tokens(r, tokens, n, e);
    if (rc) return rc;
    cpu_attention_index(mask, n, np, r->cap, r->vis, r->n_vis);
    memcpy(r->hs, state_in, sizeof(float) * (size_t)n * r->dim);
    layer(r, tokens, pos, n);
    r->n_pending += n;
    memcpy(state_out, r->hs, sizeof(float) * (size_t)n * r->dim);
    head_logits(r, n, logits_out);
    return RS_OK;
}

void eagle3_topk(const Eagle3Head *h, const float *logits, int k, int *target_ids, float *logq) {
    int DV = h->cfg.draft_vocab;
    RS_ASSERT(k >= 1 && k <= DV);
    int idx[k];
    row_topk(logits, DV, k, idx);
    float lse = (float)row_lse(logits, DV);
    for (int i = 0; i < k; i++) {
        target_ids[i] = h->d2t[idx[i]];
        if (logq) logq[i] = logits[idx[i]] - lse;
    }
}

/* The row's top 10 as new candidates below `parent`. */
static void add_children(const Eagle3Head *h, Pool *p, const float *row, int parent, int depth) {
    int ids[POOL_TOPK];
    float lq[POOL_TOPK];
    eagle3_topk(h, row, POOL_TOPK, ids, lq);
    for (int k = 0; k < POOL_TOPK; k++) {
        int i = p->n++;
        p->token[i] = ids[k];
        p->parent[i] = parent;
        p->logq[i] = lq[k] > 0 ? 0 : lq[k]; /* rounding can push the top token a hair above 0 */
        p->depth[i] = (uint8_t)depth;
        p->score[i] = (parent >= 0 ? p->score[parent] : 0) + p->logq[i];
    }
}

/* One pass over `nodes` (pool indices of one depth): parents' states in, ancestors in the
 * mask, outputs kept for their children; then their children join the pool. */
static int expand_nodes(Eagle3Runner *r, Pool *p, const int *nodes, int n, const float *root_state,
                        RsErr *e) {
    int np = r->n_pending, cols = np + n, D = r->dim;
    int tokens[POOL_EXPAND], pos[POOL_EXPAND];
    uint8_t mask[POOL_EXPAND * POOL_N_EXPANDED];
    float *st = r->grow_state;
    memset(mask, 0, (size_t)n * cols);
    for (int k = 0; k < n; k++) {
        int u = nodes[k], par = p->parent[u];
        tokens[k] = p->token[u];
        pos[k] = eagle3_node_pos(r, p->depth[u]);
        mask[(size_t)k * cols + np + k] = 1;
        for (int a = par; a >= 0; a = p->parent[a]) mask[(size_t)k * cols + r->slot_of[a]] = 1;
        memcpy(st + (size_t)k * D, par < 0 ? root_state : r->node_state + (size_t)r->slot_of[par] * D,
               sizeof(float) * D);
    }
    float *out = r->node_state + (size_t)np * D;
    int rc = eagle3_expand(r, tokens, st, pos, mask, n, r->grow_logits, out, e);
    if (rc) return rc;
    for (int k = 0; k < n; k++) r->slot_of[nodes[k]] = np + k;
    for (int k = 0; k < n; k++)
        add_children(r->h, p, r->grow_logits + (size_t)k * r->h->cfg.draft_vocab, nodes[k],
                     p->depth[nodes[k]] + 1);
    return RS_OK;
}

/* The POOL_EXPAND best of the candidates from `first` on (all of one depth) by the ranking,
 * returned in pool order so children stay in creation order by parent. */
static void best_new(const Pool *p, int first, int *nodes) {
    int cand[POOL_EXPAND * POOL_TOPK], nc = p->n - first;
    for (int i = 0; i < nc; i++) cand[i] = first + i;
    for (int k = 0; k < POOL_EXPAND; k++) {
        int best = k;
        for (int i = k + 1; i < nc; i++)
            if (pool_rank_cmp(p, cand[i], cand[best]) < 0) best = i;
        int t = cand[k];
        cand[k] = cand[best];
        cand[best] = t;
        nodes[k] = cand[k];
    }
    for (int k = 1; k < POOL_EXPAND; k++)
        for (int j = k; j > 0 && nodes[j] < nodes[j - 1]; j--) {
            int t = nodes[j];
            nodes[j] = nodes[j - 1];
            nodes[j - 1] = t;
        }
}

int eagle3_grow_pool(Eagle3Runner *r, const float *root_state, const float *root_logits,
                     Pool *p, RsErr *e) {
    if (r->max_batch < POOL_EXPAND || r->n_committed + r->n_pending + POOL_N_EXPANDED > r->cap ||
        r->h->cfg.draft_vocab < POOL_TOPK)
        return rs_err(e, RS_EINVAL, "EAGLE-3 pool growth needs max_batch >= %d (have %d), room "
                      "for %d tree rows (%d committed + %d pending of %d) and a draft vocabulary "
                      "of at least %d", POOL_EXPAND, r->max_batch, POOL_N_EXPANDED,
                      r->n_committed, r->n_pending, r->cap, POOL_TOPK);
    uint64_t t0 = rs_now_ns();
    p->n = 0;
    for (int i = 0; i < POOL_MAX; i++) r->slot_of[i] = -1;
    add_children(r->h, p, root_logits, -1, 1);
    int nodes[POOL_EXPAND], passes = 0;
    for (int k = 0; k < POOL_EXPAND; k++) nodes[k] = k;
    for (int depth = 1; depth < POOL_MAX_DEPTH; depth++) {
        int first_new = p->n, rc = expand_nodes(r, p, nodes, POOL_EXPAND, root_state, e);
        if (rc) return rc;
        passes++;
        if (depth + 1 < POOL_MAX_DEPTH) best_new(p, first_new, nodes);
    }
    RS_ASSERT(p->n == POOL_MAX && r->n_pending >= POOL_N_EXPANDED);
    RsErr pe = {0};
    if (pool_finalize(p, r->h->cfg.c.vocab_size, &pe) != RS_OK)
        return rs_err(e, RS_EFORMAT, "EAGLE-3 head produced an invalid pool (non-finite "
                      "logits?): %s", pe.msg);
    p->n_passes = passes + 1; /* the commit pass counts, as for the model drafter */
    p->n_expanded = passes * POOL_EXPAND;
    p->draft_ns = rs_now_ns() - t0;
    return RS_OK;
}
