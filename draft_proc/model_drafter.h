/* The model kind of Drafter (draft_proc/drafter.h): a transformer run on its own backend
 * with a static KV cache of the committed tokens, growing the EAGLE-3-shaped pool (DESIGN.md §2)
 * with one commit pass and 7 tree-masked expansion passes. Its two constructors are the
 * separate drafter model and the self-drafter (a layer subset of the target). Growth runs
 * synchronously inside drafter_grow_begin; wrap it with drafter_threaded_create to overlap
 * it with the caller's work. */
#ifndef ROOTSPEC_MODEL_DRAFTER_H
#define ROOTSPEC_MODEL_DRAFTER_H
#include "drafter.h"
#include "kernels/backend.h"

/* A drafter model of its own. Borrows `m` (keep it alive until drafter_destroy); creates
 * its own backend from `ops` with bp's settings (kv_capacity entries, threads, device,
 * batch_invariant; the drafter sets the batch sizes and its top-k hint). RS_EUNSUPPORTED
 * when the vocabulary is smaller than POOL_TOPK. */
int drafter_model_create(const Model *m, const BackendOps *ops, const BackendParams *bp,
                         Drafter **out, RsErr *e);

/* drafter_model_create that owns m (freed with the drafter, also on failure). */
int drafter_model_adopt(Model *m, const BackendOps *ops, const BackendParams *bp,
                        Drafter **out, RsErr *e);

/* The self-drafter: layers `layers` (model_layer_view's spec, e.g. "0-5") of `target`.
 * Owns the view, which borrows target's weights: destroy the drafter before the target.
 * RS_EINVAL for a bad spec. */
int drafter_self_create(const Model *target, const char *layers, const BackendOps *ops,
                        const BackendParams *bp, Drafter **out, RsErr *e);

/* Tokens in the KV cache (tests check the commit bookkeeping). d must be of this kind. */
int model_drafter_n_committed(const Drafter *d);
/* Its backend's counters (tests assert d2h_full_rows == 0). d must be of this kind. */
BackendStats model_drafter_backend_stats(const Drafter *d);

#endif
