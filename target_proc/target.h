/* The target model's side of a round: its backend, the buffers its passes fill, and the
 * three passes a decode runs (prefill, the one-token root pass, the tree-masked pass).
 * decode.c sequences them into rounds; nothing here knows about drafters or rules.
 * Pending KV layout in a round: entry 0 = the root (continuation), entry 1+k = pass node k,
 * whether the root comes with the tree in one batch (draft rule) or before it (root pass). */
#ifndef ROOTSPEC_TARGET_H
#define ROOTSPEC_TARGET_H
#include "common/pool.h"
#include "kernels/backend.h"
#include "kernels/prefill.h"

/* Nodes of one tree pass: the verified tree (X1 off the pool included) and, for score_all,
 * the expanded pool nodes, whose rows give every candidate's target probability. */
#define TARGET_PASS_MAX (TREE_MAX + 1 + POOL_N_EXPANDED)

/* Most tokens in one forward(): the tree pass (root included) and a prefill chunk. */
#define TARGET_MAX_BATCH 256

/* The nodes of one tree pass: pool nodes (parents first) plus possibly X1 off the pool. */
typedef struct {
    int n;
    int token[TARGET_PASS_MAX];
    int parent[TARGET_PASS_MAX];    /* pass index of parent, -1 = root */
    int depth[TARGET_PASS_MAX];
    int pool_node[TARGET_PASS_MAX]; /* pool index or TREE_X1_OFFPOOL */
    int slot_of_pool[POOL_MAX];     /* pass index of a pool node, -1 if not in the pass */
    int x1_slot;                    /* pass index of X1 off the pool, -1 if none */
} TreePass;

typedef struct Target {
    const Model *m;
    Backend *b;
    int vocab;
    uint8_t *eog;      // (vocab) 1 = ends a decode
    uint8_t *mask;     // (TARGET_PASS_MAX + 1, TARGET_PASS_MAX + 2)
    Pool *pool;        /* this round's pool, filled by the drafter */
    /* The rows the last pass kept in the backend (its logits never cross to the host: the
     * decode asks the backend's row queries): -1 none, 0 the root pass, 1 a tree pass. */
    int kept_pass;
    int kept_with_root; /* tree pass: the root's row is kept row 0 */
    int n_cached;       /* entries the last target_prefill took from the prefix cache */
    int n_forked;       /* entries a fork gave it (batcher_fork): the next decode starts from
                           them (they are its prompt's first tokens) instead of resetting */
} Target;

/* Borrows m; creates a backend with bp's settings (kv_capacity entries, threads, device,
 * batch_invariant; the target sets the batch sizes). eog: tokens that end a decode (n_eog
 * ids; out-of-vocabulary ones are ignored). */
int target_create(const Model *m, const BackendOps *ops, const BackendParams *bp,
                  const int *eog, int n_eog, Target **out, RsErr *e);
/* The same over a backend made elsewhere (a batcher's view, batch.h); the target owns it. */
void target_create_on(Backend *b, const int *eog, int n_eog, Target **out);
void target_destroy(Target **t);
Backend *target_backend(Target *t);
int target_kv_capacity(const Target *t);

/* Forgets the context (new prompt). */
void target_reset(Target *t);
/* Commits tokens[0..n) as context: the entries a fork left (n_forked), else the longest
 * prefix the prefix cache holds, are kept (t->n_cached entries), the rest prefilled
 * (backend_prefill), then its blocks published. */
int target_prefill(Target *t, const int *tokens, int n, RsErr *e);
/* target_prefill without the prefix cache's blocks (every token's row is computed), each
 * row handed to fn (kernels/prefill.h: the prompt's own log-probabilities). feats: as
 * backend_prefill_features, or NULL. */
int target_prefill_rows(Target *t, const int *tokens, int n, float *feats, PrefillRowsFn fn,
                        void *user, RsErr *e);
/* After a decode: publishes the whole blocks of tokens[0..n) (its prompt, then its output)
 * that the context holds, so a later prompt that repeats the conversation attaches them. */
void target_publish(Target *t, const int *tokens, int n);
/* One-token pass on the root: its row kept in the backend, the root left pending at entry 0. */
int target_root_pass(Target *t, int root, RsErr *e);
/* The tree-masked pass over ps. with_root: the root token is batch entry 0 (draft rule);
 * otherwise the root pass left it pending at entry 0. Rows stay in the backend: pass node
 * i's at kept row with_root + i, with_root puts the root's at kept row 0. */
int target_tree_pass(Target *t, const TreePass *ps, int root, int with_root, RsErr *e);
/* Keeps pending entries keep[0..n) (root, accepted path) as context; drops the rest. */
int target_commit(Target *t, const int *keep, int n, RsErr *e);
/* Kept row (backend_rows_stats, backend_rows_gather) of the logits after pass slot `slot`
 * (-1: the root) of the last pass; aborts when that pass did not keep it (the root pass's
 * row is gone once a tree pass ran without the root). */
int target_row(const Target *t, int slot);

#endif
