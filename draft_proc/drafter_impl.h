/* The inside of a Drafter, for implementations only (draft_proc/model_drafter.c,
 * thread_drafter.c, remote_drafter.c, suffix_drafter.c, tests' wrappers): the ops table a kind fills and
 * the handle that carries it. Callers use draft_proc/drafter.h. drafter.c checks what every
 * kind would otherwise check itself (features given with a size, grow_end after a
 * grow_begin), so the ops see only well-formed calls. */
#ifndef ROOTSPEC_DRAFTER_IMPL_H
#define ROOTSPEC_DRAFTER_IMPL_H
#include "drafter.h"

/* Every op gets the kind's ctx. Contracts are those of the drafter_* functions of the same
 * name in drafter.h; reset's n may be 0, grow_begin's reset flag is handled by drafter.c
 * (it calls reset with no tokens first). */
typedef struct {
    int (*reset)(void *ctx, const int *prompt, int n, const void *features, size_t feat_bytes,
                 RsErr *e);
    int (*grow_begin)(void *ctx, const int *tokens, int n, const void *features,
                      size_t feat_bytes, RsErr *e);
    int (*grow_end)(void *ctx, Pool *out, RsErr *e);
    /* Waits for any outstanding work, frees ctx and what it owns. */
    void (*destroy)(void *ctx);
    /* As drafter_append (n >= 1); optional: NULL makes drafter_append RS_EUNSUPPORTED. */
    int (*append)(void *ctx, const int *tokens, int n, const void *features, size_t feat_bytes,
                  RsErr *e);
    /* As drafter_set_shape, called only while no growth is outstanding; optional: NULL
     * keeps the kind's full shape. */
    void (*set_shape)(void *ctx, int depth, int width);
    /* As drafter_ahead, called only while no growth is outstanding; optional: NULL does
     * nothing. ahead_stats fills what it did (optional: NULL reports zeros). */
    void (*ahead)(void *ctx, int (*stop)(void *), void *arg);
    void (*ahead_stats)(const void *ctx, DrafterAheadStats *st);
} DrafterOps;

struct Drafter {
    const DrafterOps *ops;
    void *ctx;
    DrafterInfo info;  /* its strings point into ctx (they live as long as it does) */
    int growing;       /* a grow_begin succeeded and its grow_end has not run */
};

/* The outcome of a growth that a kind runs inside grow_begin (model, eagle3, suffix): the
 * status waits for grow_end, as a worker thread's or a peer's would. */
typedef struct {
    Pool *pool; /* sync_growth_init's, freed by sync_growth_free */
    int rc;
    RsErr err;
} SyncGrowth;

void sync_growth_init(SyncGrowth *g);
void sync_growth_free(SyncGrowth *g);
/* grow_end of such a kind: the growth's error as it happened, or its pool copied to out. */
int sync_growth_end(const SyncGrowth *g, Pool *out, RsErr *e);

/* A handle for a kind's ctx (owned by the handle from here on; *info copied). Never fails:
 * a kind's constructor builds ctx first and wraps it last. */
Drafter *drafter_wrap(const DrafterOps *ops, void *ctx, const DrafterInfo *info);

#endif
