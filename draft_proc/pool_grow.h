/* The DESIGN.md §2 pool growth, one function for every drafter kind that runs a model over
 * the tree (the model/self drafter on a Backend, the EAGLE-3 head on its runner): the
 * root's top 10 are the depth-1 candidates; 7 expansion passes of 10 nodes each (all of
 * depth 1, then the 10 best new candidates of each of depths 2..7 by pool_rank_cmp, run in
 * pool order so children stay in creation order by parent) add 100 candidates per depth
 * 2..8: 710 candidates, 70 expanded. Expanded nodes stay pending in the kind's KV cache for
 * the round, so later passes attend to them through the tree mask this function builds.
 * What differs between kinds is only how a pass's nodes are forwarded and how a row's top
 * 10 is read: the callback. */
#ifndef ROOTSPEC_POOL_GROW_H
#define ROOTSPEC_POOL_GROW_H
#include "common/pool.h"

/* One expansion pass: n nodes of one depth, in pool order, to run as pending rows
 * n_pending .. n_pending + n - 1 after the committed context. */
typedef struct {
    int n;
    const int *node;       // (n) pool indices
    const int *token;      // (n) their tokens
    int depth;             /* of every node: 1..POOL_MAX_DEPTH-1 */
    const int *parent_row; // (n) pending row of each node's parent; -1: the root (depth 1)
    const uint8_t *mask;   // (n, n_pending + n) 1 = attend: each node's ancestors and itself
    int n_pending;         /* pending rows before the pass */
    int *row;              // (n) out, with POOL_ROWS_REUSED: each node's pending row
} PoolPass;

/* Forwards the pass's nodes and returns, per node, the POOL_TOPK best next tokens (ids in
 * the pool's token space) and their log q (log-softmax), best first: RS_OK, their rows
 * then pending rows n_pending .. n_pending + n - 1. Or, when every node's row is pending
 * already (run ahead), POOL_ROWS_REUSED with those rows in pass->row and no forward. Any
 * other status (an error, or a positive one of the kind's own) stops the growth and is
 * returned as is. */
#define POOL_ROWS_REUSED 2
typedef int (*PoolExpandFn)(void *ctx, const PoolPass *pass, int *top_ids /* (n, POOL_TOPK) */,
                            float *top_logq /* (n, POOL_TOPK) */, RsErr *e);

/* A row's top 10 (ids, log q, best first) as new candidates of `depth` below node `parent`
 * (-1: the root), appended to p with their path scores; log q rounded above 0 is 0. */
void pool_add_children(Pool *p, const int *ids, const float *logq, int parent, int depth);

/* Grows *p from the root's top 10 (root_ids, root_logq: POOL_TOPK each, best first), the
 * kind's pending rows starting at n_pending0, down to depth max_depth (1..POOL_MAX_DEPTH:
 * max_depth - 1 expansion passes), expanding the `width` best nodes of each level (1..
 * POOL_EXPAND; the passes have that many rows): 10 + (max_depth - 1) * width * 10
 * candidates, POOL_MAX_DEPTH and POOL_EXPAND giving the full 710 (DESIGN.md §2, "Pool
 * shape"), then
 * pool_finalize(p, vocab): RS_EFORMAT "<who> produced an invalid pool (non-finite
 * logits?): ..." when log q is not finite. Sets n_passes (the commit pass counted: 8 at
 * full depth) and n_expanded (70); timings are the caller's. */
int pool_grow(Pool *p, const int *root_ids, const float *root_logq, int n_pending0,
              int max_depth, int width, PoolExpandFn expand, void *ctx, int vocab, const char *who,
              RsErr *e);

#endif
