/* The model kind of Drafter (a drafter model of its own, or a layer subset of the target).
 * Pool growth is draft_proc/pool_grow.h's (DESIGN.md §2): the commit pass gives the 10
 * depth-1 candidates, 7 expansion passes of 10 nodes run on the drafter's backend, 8 passes
 * in all counting the commit pass. Expanded nodes stay pending in the drafter's KV cache
 * for the round; the next commit drops them. A pass's logits stay in the backend (kept
 * rows): backend_rows_topk reduces each row to its 10 children where it lives, so no whole
 * row crosses to the host. */
#include "model_drafter.h"
#include "drafter_impl.h"
#include "kernels/prefill.h"
#include "pool_grow.h"
#include <math.h>
#include <string.h>

/* Most tokens in one forward(): the prefill chunk (prefill_chunk()). */
#define MAX_BATCH 64

typedef struct {
    const Model *m;
    Model *view;        /* a model it owns (m == view): the self-drafter's layer view, or
                           an adopted model */
    Backend *b;
    int vocab;
    int depth, width;    /* drafter_set_shape's, POOL_MAX_DEPTH and POOL_EXPAND by default */
    float lse[POOL_EXPAND]; /* rows_topk's log-sum-exp of the last pass's rows */
    uint64_t backend_ns; /* this growth's time inside backend forward/commit calls */
    int rows;            /* logits rows this growth reduced */
    SyncGrowth g;       /* grow_begin's outcome for grow_end */
} ModelDrafter;

/* The top-10 ids and draft log-probs of every row the last pass kept, (n_kept, 10). */
static int reduce(ModelDrafter *d, int *ids, float *logq, RsErr *e) {
    d->rows += backend_n_kept(d->b);
    return backend_rows_topk(d->b, POOL_TOPK, ids, logq, d->lse, e);
}

/* pool_grow's callback: runs a pass's nodes through the drafter under the pass's tree mask
 * and reads each row's top 10. */
static int expand(void *ctx, const PoolPass *pass, int *ids, float *logq, RsErr *e) {
    ModelDrafter *d = ctx;
    Backend *b = d->b;
    int n = pass->n, pos[POOL_EXPAND], rows[POOL_EXPAND];
    RS_ASSERT(n <= POOL_EXPAND && backend_n_pending(b) == pass->n_pending);
    for (int k = 0; k < n; k++) {
        pos[k] = backend_n_committed(b) - 1 + pass->depth;
        rows[k] = k;
    }
    uint64_t t0 = rs_now_ns();
    int rc = backend_forward(b, pass->token, pos, n, pass->mask, rows, n, NULL, e);
    d->backend_ns += rs_now_ns() - t0;
    return rc ? rc : reduce(d, ids, logq, e);
}

/* Checks a commit of n tokens, drops last round's tree entries and appends the tokens to
 * the committed context (backend_prefill). want_row: the last token's row stays in the
 * backend as its kept row 0. */
static int commit_tokens(ModelDrafter *d, const int *tokens, int n, int want_row, RsErr *e) {
    Backend *b = d->b;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= d->vocab)
            return rs_err(e, RS_EINVAL, "token id %d at %d outside drafter vocabulary of %d",
                          tokens[i], i, d->vocab);
    int need = backend_n_committed(b) + n + POOL_N_EXPANDED;
    if (need > backend_kv_capacity(b))
        return rs_err(e, RS_EINVAL,
                      "drafter KV cache full: %d committed + %d new + %d tree entries > "
                      "capacity %d",
                      backend_n_committed(b), n, POOL_N_EXPANDED, backend_kv_capacity(b));
    uint64_t t0 = rs_now_ns();
    int rc = backend_kv_commit(b, NULL, 0, e); /* drop last round's tree entries */
    /* The commit pass; only the final row is needed. */
    if (!rc)
        rc = want_row ? backend_prefill_keep(b, tokens, n, e) : backend_prefill(b, tokens, n, NULL, e);
    d->backend_ns += rs_now_ns() - t0;
    return rc;
}

/* Commits `tokens` and grows the pool below the last of them into *p. */
static int grow(ModelDrafter *d, const int *tokens, int n, Pool *p, RsErr *e) {
    uint64_t t0 = rs_now_ns(), fused0 = backend_stats(d->b).fused_topk_ns;
    if (n < 1) return rs_err(e, RS_EINVAL, "commit of %d tokens: need at least one", n);
    d->backend_ns = 0;
    d->rows = 0;
    int ids[POOL_TOPK];
    float lq[POOL_TOPK];
    int rc = commit_tokens(d, tokens, n, 1, e);
    if (!rc) rc = reduce(d, ids, lq, e);
    if (rc) return rc;
    p->commit_pass_ns = rs_now_ns() - t0;
    rc = pool_grow(p, ids, lq, backend_n_pending(d->b), d->depth, d->width, expand, d, d->vocab, "drafter", e);
    if (rc) return rc;
    p->draft_ns = rs_now_ns() - t0;
    /* The top-k reduction is host work wherever it ran: in rows_topk, or (CPU backend)
     * fused into the forwards' output head. */
    uint64_t fwd = d->backend_ns - (backend_stats(d->b).fused_topk_ns - fused0);
    p->draft_host_ns = p->draft_ns > fwd ? p->draft_ns - fwd : 0;
    p->draft_rows = d->rows;
    return RS_OK;
}

/* ---- the Drafter ops ------------------------------------------------------------------ */

static int model_reset(void *ctx, const int *prompt, int n, const void *features,
                       size_t feat_bytes, RsErr *e) {
    ModelDrafter *d = ctx;
    backend_kv_reset(d->b);
    if (n < 0) return rs_err(e, RS_EINVAL, "prefill of %d tokens", n);
    return n ? commit_tokens(d, prompt, n, 0, e) : RS_OK;
}

static int model_append(void *ctx, const int *tokens, int n, const void *features,
                        size_t feat_bytes, RsErr *e) {
    return commit_tokens(ctx, tokens, n, 0, e);
}

/* Grows at once; the status waits for grow_end, as a worker thread's or a peer's would. */
static int model_grow_begin(void *ctx, const int *tokens, int n, const void *features,
                            size_t feat_bytes, RsErr *e) {
    ModelDrafter *d = ctx;
    d->g.err = (RsErr){0};
    d->g.rc = grow(d, tokens, n, d->g.pool, &d->g.err);
    return RS_OK;
}

static int model_grow_end(void *ctx, Pool *out, RsErr *e) {
    return sync_growth_end(&((ModelDrafter *)ctx)->g, out, e);
}

static void model_set_shape(void *ctx, int depth, int width) {
    ModelDrafter *d = ctx;
    d->depth = depth;
    d->width = width;
}

static void md_destroy(void *ctx) {
    ModelDrafter *d = ctx;
    backend_destroy(&d->b);
    model_destroy(&d->view); /* after the backend that borrowed it */
    sync_growth_free(&d->g);
    free(d);
}

static const DrafterOps model_ops = {
    .reset = model_reset,
    .grow_begin = model_grow_begin,
    .grow_end = model_grow_end,
    .destroy = md_destroy,
    .append = model_append,
    .set_shape = model_set_shape,
};

/* Builds the kind's state on `m`; takes ownership of `view` (NULL or m itself). */
static int model_kind_create(const Model *m, Model *view, const BackendOps *ops,
                             const BackendParams *params, Drafter **out, RsErr *e) {
    *out = NULL;
    if (m->cfg.vocab_size < POOL_TOPK) {
        model_destroy(&view);
        return rs_err(e, RS_EUNSUPPORTED, "drafter vocabulary of %d tokens is smaller than %d",
                      m->cfg.vocab_size, POOL_TOPK);
    }
    ModelDrafter *d = rs_xcalloc(1, sizeof *d);
    d->m = m;
    d->view = view;
    d->vocab = m->cfg.vocab_size;
    d->depth = POOL_MAX_DEPTH;
    d->width = POOL_EXPAND;
    BackendParams bp = *params;
    bp.max_batch = MAX_BATCH;
    bp.max_pending = POOL_N_EXPANDED + MAX_BATCH;
    bp.topk_hint = POOL_TOPK; /* every pass is read by reduce() */
    int rc = backend_create(ops, m, &bp, &d->b, e);
    if (rc) {
        model_destroy(&d->view);
        free(d);
        return rc;
    }
    sync_growth_init(&d->g);
    DrafterInfo info = {.vocab_size = d->vocab, .fingerprint = m->fingerprint, .name = m->path};
    *out = drafter_wrap(&model_ops, d, &info);
    return RS_OK;
}

int drafter_model_create(const Model *m, const BackendOps *ops, const BackendParams *bp,
                         Drafter **out, RsErr *e) {
    return model_kind_create(m, NULL, ops, bp, out, e);
}

int drafter_model_adopt(Model *m, const BackendOps *ops, const BackendParams *bp,
                        Drafter **out, RsErr *e) {
    return model_kind_create(m, m, ops, bp, out, e);
}

int drafter_self_create(const Model *target, const char *layers, const BackendOps *ops,
                        const BackendParams *bp, Drafter **out, RsErr *e) {
    *out = NULL;
    Model *view = NULL;
    int rc = model_layer_view(target, layers, &view, e);
    if (rc) return rc;
    return model_kind_create(view, view, ops, bp, out, e);
}

int model_drafter_n_committed(const Drafter *d) {
    RS_ASSERT(d->ops == &model_ops);
    const ModelDrafter *md = d->ctx;
    return backend_n_committed(md->b);
}

BackendStats model_drafter_backend_stats(const Drafter *d) {
    RS_ASSERT(d->ops == &model_ops);
    const ModelDrafter *md = d->ctx;
    return backend_stats(md->b);
}
