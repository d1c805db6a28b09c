/* The EAGLE-3 kind of Drafter: feature rows aligned to the commit's tokens (see
 * eagle3_drafter.h), the head's commit, then its pool growth. */
#include "eagle3_drafter.h"
#include "drafter_impl.h"
#include "eagle3_forward.h"
#include <string.h>

#define EAGLE3_COMMIT_CHUNK 64

typedef struct {
    const Eagle3Head *h;
    Eagle3Runner *r;
    int n_tokens;       /* context tokens, the first (which has no row) included */
    int kv_capacity;
    float *root_state;  // (dim) output state of the last committed row
    float *root_logits; // (draft_vocab)
    SyncGrowth g;       /* grow_begin's outcome for grow_end */
    Eagle3Head *owned;  /* drafter_eagle3_open's head, freed with the drafter */
} Eagle3Drafter;

/* Appends tokens with their features (the last row's state and logits kept for growth);
 * `reserve` rows must stay free after them. Nothing changes on an error. */
static int commit(Eagle3Drafter *d, const int *tokens, int n, const void *features,
                  size_t feat_bytes, int reserve, RsErr *e) {
    size_t F = (size_t)EAGLE3_N_FEATURES * d->h->cfg.target_hidden;
    if (!features || feat_bytes != (size_t)n * F * sizeof(float))
        return rs_err(e, RS_EINVAL, "EAGLE-3 drafter: a commit of %d tokens needs %zu bytes of "
                      "f32 target features (%d x %zu), got %zu", n, (size_t)n * F * sizeof(float),
                      n, F, features ? feat_bytes : 0);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= d->h->cfg.c.vocab_size)
            return rs_err(e, RS_EINVAL, "token id %d at %d outside the EAGLE-3 head's vocabulary "
                          "of %d", tokens[i], i, d->h->cfg.c.vocab_size);
    int skip = d->n_tokens == 0 && n > 0; /* the context's first token has no row */
    int need = eagle3_n_committed(d->r) + n - skip + reserve;
    if (need > d->kv_capacity)
        return rs_err(e, RS_EINVAL, "EAGLE-3 drafter KV cache full: %d committed + %d new + %d "
                      "tree rows > capacity %d", eagle3_n_committed(d->r), n - skip, reserve,
                      d->kv_capacity);
    int rc = eagle3_commit(d->r, tokens + skip, (const float *)features + skip * F, n - skip,
                           d->root_state, d->root_logits, e);
    if (!rc) d->n_tokens += n;
    return rc;
}

static int grow(Eagle3Drafter *d, const int *tokens, int n, const void *features,
                size_t feat_bytes, Pool *p, RsErr *e) {
    uint64_t t0 = rs_now_ns(), run0 = eagle3_run_ns(d->r);
    int rc = commit(d, tokens, n, features, feat_bytes, POOL_N_EXPANDED, e);
    if (rc) return rc;
    if (eagle3_n_committed(d->r) == 0)
        return rs_err(e, RS_EINVAL, "EAGLE-3 drafter: a context of %d token(s) has no row to "
                      "draft from (the first token pairs with nothing)", d->n_tokens);
    uint64_t t1 = rs_now_ns();
    rc = eagle3_grow_pool(d->r, d->root_state, d->root_logits, p, e);
    if (rc) return rc;
    p->commit_pass_ns = t1 - t0;
    p->draft_ns = rs_now_ns() - t0;
    uint64_t fwd = eagle3_run_ns(d->r) - run0; /* the layer's runs; the rest is host work */
    p->draft_host_ns = p->draft_ns > fwd ? p->draft_ns - fwd : 0;
    return RS_OK;
}

static int e3_reset(void *ctx, const int *prompt, int n, const void *features,
                    size_t feat_bytes, RsErr *e) {
    Eagle3Drafter *d = ctx;
    eagle3_reset(d->r);
    d->n_tokens = 0;
    if (n < 0) return rs_err(e, RS_EINVAL, "prefill of %d tokens", n);
    return n ? commit(d, prompt, n, features, feat_bytes, 0, e) : RS_OK;
}

static int e3_append(void *ctx, const int *tokens, int n, const void *features,
                     size_t feat_bytes, RsErr *e) {
    return commit(ctx, tokens, n, features, feat_bytes, 0, e);
}

static int e3_grow_begin(void *ctx, const int *tokens, int n, const void *features,
                         size_t feat_bytes, RsErr *e) {
    Eagle3Drafter *d = ctx;
    d->g.err = (RsErr){0};
    d->g.rc = grow(d, tokens, n, features, feat_bytes, d->g.pool, &d->g.err);
    return RS_OK;
}

static int e3_grow_end(void *ctx, Pool *out, RsErr *e) {
    return sync_growth_end(&((Eagle3Drafter *)ctx)->g, out, e);
}

static void e3_destroy(void *ctx) {
    Eagle3Drafter *d = ctx;
    eagle3_runner_destroy(&d->r);
    free(d->root_state);
    free(d->root_logits);
    sync_growth_free(&d->g);
    eagle3_head_destroy(&d->owned);
    free(d);
}

static const DrafterOps eagle3_ops = {
    .reset = e3_reset,
    .grow_begin = e3_grow_begin,
    .grow_end = e3_grow_end,
    .destroy = e3_destroy,
    .append = e3_append,
};

int drafter_eagle3_create_on(const Eagle3Head *h, const Eagle3Embed *embed,
                             const BackendOps *backend, const BackendParams *bp,
                             const int layers[EAGLE3_N_FEATURES], Drafter **out, RsErr *e) {
    *out = NULL;
    if (!layers) layers = h->cfg.feature_layers;
    for (int i = 0; i < EAGLE3_N_FEATURES; i++)
        if (layers[i] < 0)
            return rs_err(e, RS_EINVAL, "EAGLE-3 head %s names no feature layers: give the ones "
                          "eagle3_head_check resolved for its target", h->path);
    if (h->cfg.draft_vocab < POOL_TOPK)
        return rs_err(e, RS_EUNSUPPORTED, "EAGLE-3 draft vocabulary of %d tokens is smaller "
                      "than %d", h->cfg.draft_vocab, POOL_TOPK);
    const Eagle3LayerOps *ops = eagle3_layer_for(backend, e);
    if (!ops) return e ? e->code : RS_EUNSUPPORTED;
    Eagle3Drafter *d = rs_xcalloc(1, sizeof *d);
    d->h = h;
    d->kv_capacity = bp->kv_capacity;
    BackendParams rp = {.kv_capacity = bp->kv_capacity, .max_batch = EAGLE3_COMMIT_CHUNK,
                        .threads = bp->threads, .device = bp->device};
    int rc = eagle3_runner_create_on(h, embed, ops, &rp, &d->r, e);
    if (rc) {
        free(d);
        return rc;
    }
    d->root_state = rs_xmalloc(sizeof(float) * (size_t)h->cfg.c.dim);
    d->root_logits = rs_xmalloc(sizeof(float) * (size_t)h->cfg.draft_vocab);
    sync_growth_init(&d->g);
    DrafterInfo info = {.vocab_size = h->cfg.c.vocab_size, .fingerprint = h->fingerprint,
                        .name = h->path, .n_feature_layers = EAGLE3_N_FEATURES};
    memcpy(info.feature_layers, layers, sizeof(int) * EAGLE3_N_FEATURES);
    *out = drafter_wrap(&eagle3_ops, d, &info);
    return RS_OK;
}

int drafter_eagle3_create(const Eagle3Head *h, const float *embed, int kv_capacity,
                          const int layers[EAGLE3_N_FEATURES], Drafter **out, RsErr *e) {
    Eagle3Embed em = {.table = qtensor_f32(embed, h->cfg.c.vocab_size, h->cfg.c.dim)};
    BackendParams bp = {.kv_capacity = kv_capacity, .threads = 1};
    return drafter_eagle3_create_on(h, &em, NULL, &bp, layers, out, e);
}

int eagle3_head_open_for(const char *head_path, const Model *target, Eagle3LayerIds ids,
                         Eagle3Head **h, int layers[EAGLE3_N_FEATURES], Eagle3Embed *em,
                         RsErr *e) {
    *h = NULL;
    int rc = eagle3_path_is_random(head_path) ? eagle3_head_random(head_path, 1, h, e)
                                                : eagle3_head_load(head_path, h, e);
    if (!rc && ids != EAGLE3_IDS_AUTO) (*h)->cfg.layer_ids = ids; /* the user's word wins */
    if (!rc) rc = eagle3_head_check(*h, &target->cfg, layers, e);
    /* no f32 copy of either table */
    if (!rc && (*h)->embed.data) *em = (Eagle3Embed){.table = (*h)->embed};
    else if (!rc) rc = eagle3_embed_of(target, em, e);
    if (rc) eagle3_head_destroy(h);
    return rc;
}

int drafter_eagle3_open(const char *head_path, const Model *target, Eagle3LayerIds ids,
                        const BackendOps *backend, const BackendParams *bp, Drafter **out,
                        RsErr *e) {
    *out = NULL;
    Eagle3Head *h;
    int layers[EAGLE3_N_FEATURES];
    Eagle3Embed em;
    int rc = eagle3_head_open_for(head_path, target, ids, &h, layers, &em, e);
    if (!rc) rc = drafter_eagle3_create_on(h, &em, backend, bp, layers, out, e);
    if (rc) {
        eagle3_head_destroy(&h);
        return rc;
    }
    ((Eagle3Drafter *)(*out)->ctx)->owned = h;
    return RS_OK;
}
