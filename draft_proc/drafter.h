/* The drafter: keeps a static KV cache of committed tokens and grows the EAGLE-3-shaped
 * candidate pool (SPEC §2) below the newest continuation token. Used in-process by
 * rootspec-target and behind ZeroMQ by rootspec-draft. */
#ifndef ROOTSPEC_DRAFTER_H
#define ROOTSPEC_DRAFTER_H
#include "common/pool.h"
#include "kernels/backend.h"

typedef struct Drafter Drafter;

/* Borrows `m` (keep it alive); creates its own backend from `ops`. */
int drafter_create(const Model *m, const BackendOps *ops, int kv_capacity, int threads,
                   int device, Drafter **out, RsErr *e);
void drafter_free(Drafter **d);
/* Forget every committed token (new prompt). */
void drafter_reset(Drafter *d);
/* Appends `tokens` (the round's emitted tokens; for the first round the whole prompt)
 * to the committed context, then grows the pool below the last of them into *out.
 * Errors: RS_EINVAL when the KV cache would overflow (nothing changed), RS_EFORMAT when the
 * model's logits are not finite (the tokens are committed, no pool). */
int drafter_commit_grow(Drafter *d, const int *tokens, int n, Pool *out, RsErr *e);
/* Appends `tokens` (n >= 0) to the committed context without growing a pool (RESET's
 * prompt); the next drafter_commit_grow continues from them. Errors as above; after an
 * error the context holds an unknown prefix of the tokens (reset it). */
int drafter_prefill(Drafter *d, const int *tokens, int n, RsErr *e);
int drafter_n_committed(const Drafter *d);
const Model *drafter_model(const Drafter *d);

#endif
