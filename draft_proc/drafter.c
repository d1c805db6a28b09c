/* The Drafter interface's dispatch: the drafter_* functions of drafter.h call the kind's
 * ops (drafter_impl.h) after the checks every kind shares. */
#include "drafter_impl.h"
#include <string.h>

Drafter *drafter_wrap(const DrafterOps *ops, void *ctx, const DrafterInfo *info) {
    RS_ASSERT(ops && ops->reset && ops->grow_begin && ops->grow_end && ops->destroy);
    Drafter *d = rs_xcalloc(1, sizeof *d);
    d->ops = ops;
    d->ctx = ctx;
    d->info = *info;
    return d;
}

void sync_growth_init(SyncGrowth *g) {
    g->pool = rs_xcalloc(1, sizeof(Pool));
    g->rc = RS_OK;
    g->err = (RsErr){0};
}

void sync_growth_free(SyncGrowth *g) {
    free(g->pool);
    g->pool = NULL;
}

int sync_growth_end(const SyncGrowth *g, Pool *out, RsErr *e) {
    if (g->rc) {
        if (e) *e = g->err;
        return g->rc;
    }
    memcpy(out, g->pool, sizeof(Pool));
    return RS_OK;
}

/* A size without data (or data without a size) is the caller's bug, not bad input. */
static void check_features(const void *features, size_t feat_bytes) {
    RS_ASSERT((features == NULL) == (feat_bytes == 0));
}

int drafter_reset(Drafter *d, const int *prompt, int n, const void *features, size_t feat_bytes,
                  RsErr *e) {
    check_features(features, feat_bytes);
    d->growing = 0; /* a reset abandons an outstanding growth, as grow_begin does */
    return d->ops->reset(d->ctx, prompt, n, features, feat_bytes, e);
}

int drafter_append(Drafter *d, const int *tokens, int n, const void *features, size_t feat_bytes,
                   RsErr *e) {
    check_features(features, feat_bytes);
    d->growing = 0;
    if (n < 1) return rs_err(e, RS_EINVAL, "append of %d tokens: need at least one", n);
    if (!d->ops->append)
        return rs_err(e, RS_EUNSUPPORTED, "drafter %s cannot take its context in parts",
                      d->info.name ? d->info.name : "?");
    return d->ops->append(d->ctx, tokens, n, features, feat_bytes, e);
}

int drafter_grow_begin(Drafter *d, const int *tokens, int n, int reset, const void *features,
                       size_t feat_bytes, RsErr *e) {
    check_features(features, feat_bytes);
    d->growing = 0;
    int rc = reset ? d->ops->reset(d->ctx, NULL, 0, NULL, 0, e) : RS_OK;
    if (!rc) rc = d->ops->grow_begin(d->ctx, tokens, n, features, feat_bytes, e);
    d->growing = rc == RS_OK;
    return rc;
}

int drafter_grow_end(Drafter *d, Pool *out, RsErr *e) {
    RS_ASSERT(d->growing && "drafter_grow_end without a successful drafter_grow_begin");
    d->growing = 0;
    return d->ops->grow_end(d->ctx, out, e);
}

int drafter_grow(Drafter *d, const int *tokens, int n, const void *features, size_t feat_bytes,
                 Pool *out, RsErr *e) {
    int rc = drafter_grow_begin(d, tokens, n, 0, features, feat_bytes, e);
    return rc ? rc : drafter_grow_end(d, out, e);
}

int drafter_commit_grow(Drafter *d, const int *tokens, int n, Pool *out, RsErr *e) {
    return drafter_grow(d, tokens, n, NULL, 0, out, e);
}

void drafter_set_shape(Drafter *d, int depth, int width) {
    RS_ASSERT(depth >= 1 && depth <= POOL_MAX_DEPTH && width >= 1 && width <= POOL_EXPAND &&
              !d->growing);
    if (d->ops->set_shape) d->ops->set_shape(d->ctx, depth, width);
}

void drafter_ahead(Drafter *d, int (*stop)(void *), void *arg) {
    RS_ASSERT(!d->growing && stop);
    if (d->ops->ahead) d->ops->ahead(d->ctx, stop, arg);
}

DrafterAheadStats drafter_ahead_stats(const Drafter *d) {
    DrafterAheadStats st = {0};
    if (d->ops->ahead_stats) d->ops->ahead_stats(d->ctx, &st);
    return st;
}

const DrafterInfo *drafter_info(const Drafter *d) { return &d->info; }

void drafter_destroy(Drafter **pd) {
    if (!pd || !*pd) return;
    Drafter *d = *pd;
    d->ops->destroy(d->ctx);
    free(d);
    *pd = NULL;
}
