/* The EAGLE-3 kind of Drafter (draft_proc/drafter.h): an EAGLE-3 head (common/eagle3.h) run
 * on the CPU or CUDA by draft_proc/eagle3_forward.h, growing the DESIGN.md §2 pool from the target's
 * features. Growth runs synchronously in drafter_grow_begin (wrap it with
 * drafter_threaded_create to overlap it).
 *
 * Features (the commit calls' `features`): f32, (n, 3 * target_hidden), row i = the target's
 * three feature vectors (layers from eagle3_head_check, ascending) of the token *before*
 * tokens[i], which is what the target has when the drafter commits: a round's emitted tokens
 * [a1..ak, c] come with the features of [previous root, a1..ak] from the target's passes,
 * and a first commit [p0..p(m-1)] with those of [-, p0..p(m-2)] from its prefill. Row 0 of
 * the first commit after a reset is ignored (p0 has no token before it), so growing needs
 * a context of at least two tokens. A commit without features, or with another size, is
 * refused (RS_EINVAL). */
#ifndef ROOTSPEC_EAGLE3_DRAFTER_H
#define ROOTSPEC_EAGLE3_DRAFTER_H
#include "drafter.h"
#include "common/eagle3.h"
#include "eagle3_forward.h"

/* Borrows h and embed ((vocab, dim) f32: the target's embeddings, or the head's own
 * dequantized; eagle3_head_check them first): keep both alive until drafter_destroy. kv_capacity:
 * context rows + the POOL_N_EXPANDED tree rows. layers: the target layers eagle3_head_check
 * resolved (DrafterInfo.feature_layers); NULL: the head config's, which must name them. */
int drafter_eagle3_create(const Eagle3Head *h, const float *embed, int kv_capacity,
                          const int layers[EAGLE3_N_FEATURES], Drafter **out, RsErr *e);
/* The same with the embeddings in any stored type (eagle3_forward.h) and the head's layer
 * on `backend` (NULL or cpu_backend_ops: the CPU, bp->threads threads; cuda_backend_ops_get():
 * CUDA device bp->device), bp->kv_capacity as above (the rest of bp is ignored).
 * RS_EUNSUPPORTED for another backend or a CUDA one this binary lacks. */
int drafter_eagle3_create_on(const Eagle3Head *h, const Eagle3Embed *embed,
                             const BackendOps *backend, const BackendParams *bp,
                             const int layers[EAGLE3_N_FEATURES], Drafter **out, RsErr *e);

/* Loads the head at head_path (a directory or a random:eagle3-* preset), checks that it fits
 * `target` (refusals name both values; layers gets the feature layers it resolved) and
 * gives the token embeddings the head drafts with: its own table, else the target's, read
 * a row per token in their stored type (borrowed: keep target alive). ids: how to read
 * the head's listed feature-layer ids (--eagle3-layer-ids); AUTO keeps what the head
 * states or infers it (common/eagle3.h). *h is the caller's (NULL on error). */
int eagle3_head_open_for(const char *head_path, const Model *target, Eagle3LayerIds ids,
                         Eagle3Head **h, int layers[EAGLE3_N_FEATURES], Eagle3Embed *em,
                         RsErr *e);

/* Loads the head at head_path (a directory or a random:eagle3-* preset), checks that it fits
 * `target` (refusals name both values) and builds the drafter over it with the target's
 * token embeddings (borrowed: keep target alive) unless the head has its own, its layer on
 * `backend` with p (as drafter_eagle3_create_on); ids as eagle3_head_open_for's. The
 * drafter owns the head. */
int drafter_eagle3_open(const char *head_path, const Model *target, Eagle3LayerIds ids,
                        const BackendOps *backend, const BackendParams *bp, Drafter **out,
                        RsErr *e);

#endif
