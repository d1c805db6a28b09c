/* The drafter's candidate pool (DESIGN.md §2) and the trees selected from it (DESIGN.md §3).
 * Shared by draft_proc (which grows it), proto (which ships it) and target_proc (which
 * selects and verifies). Pool index = creation order; parent -1 = the root. */
#ifndef ROOTSPEC_POOL_H
#define ROOTSPEC_POOL_H
#include <stdint.h>
#include "util.h"

#define POOL_TOPK 10       /* children per expanded node, and depth-1 candidates */
#define POOL_MAX_DEPTH 8
#define POOL_EXPAND 10     /* nodes expanded per step */
#define POOL_MAX 710       /* 10 + 7*100 */
#define POOL_N_EXPANDED 70 /* 10 depth-1 + 6*10 */
#define TREE_MAX 64        /* largest budget B */

typedef struct {
    int n;                        /* candidates in the pool (710 when full) */
    int32_t token[POOL_MAX];      /* candidate token id */
    int32_t parent[POOL_MAX];     /* pool index of parent, -1 = root */
    float logq[POOL_MAX];         /* draft log-prob of token given its parent's prefix */
    uint8_t depth[POOL_MAX];      /* 1..8 */
    /* derived by pool_finalize(): */
    float score[POOL_MAX];        /* sum of logq along the path */
    int32_t first_child[POOL_MAX];/* pool index of first child or -1 */
    int32_t n_children[POOL_MAX]; /* children are contiguous in creation order */
    int32_t root_first_child, root_n_children;
    /* drafter's own timings for this pool, nanoseconds */
    uint64_t draft_ns;            /* commit pass + growth, measured by the drafter */
    uint64_t commit_pass_ns;      /* the commit pass alone (part of draft_ns) */
    int n_passes;                 /* drafter passes, the commit pass included: 8 = 1 + 7
                                     expansion passes of 10 (70 expanded / 10 a pass) */
    int n_expanded;               /* nodes expanded (70) */
    /* drafter's host-side work: draft_ns minus its time inside its backend's forward and
     * commit calls (the row reductions, masks, selection; on the CPU backend the fused
     * top-k pass too). 0 when the drafter does not say (remote, eagle3). */
    uint64_t draft_host_ns;
    int draft_rows;               /* logits rows it reduced for this pool (71); 0: unknown */
} Pool;

/* A selected tree: ancestor-closed list of pool indices, parents before children. */
typedef struct {
    int n;                    /* non-root nodes */
    int32_t node[TREE_MAX];   /* pool indices */
    int32_t parent[TREE_MAX]; /* index into node[] of parent, -1 = root (or X1 for
                                 pearl/rootdraw trees, where node[0] is X1 itself) */
} Tree;

/* The one gate every pool passes before selection (the drafter's own and those that come
 * over the wire): validates it (parents precede children, depths consistent, tokens in
 * [0, vocab), logq <= 0 and finite, sibling runs contiguous and distinct, at most
 * POOL_N_EXPANDED nodes with children) and fills score / child links. vocab_size <= 0 skips
 * the upper bound on token ids. Returns RS_OK, or RS_EPROTO with the reason in e and the
 * pool emptied (n = 0), so a rejected pool can never be selected from. */
int pool_finalize(Pool *p, int vocab_size, RsErr *e);

/* The drafter's scores at temperature T > 0 (a finalized pool; T = 1 leaves it as it is):
 * each sibling run's log q becomes the log-softmax of log q / T over the run, the mass the
 * drafter's top-k left out counted as one more token, and the path scores follow. The
 * drafter's law then ranks candidates as the target's tempered law will judge them;
 * selection only, never exactness (DESIGN.md §4). */
void pool_temper(Pool *p, double T);

/* The ranking (DESIGN.md §2) every selection and the drafter's growth use: score desc, depth
 * asc, pool index asc. score: (p->n) scores to rank by, or NULL for the pool's own (the
 * path sum of logq). A total order under which any top-k is ancestor-closed when scores
 * never increase along a path. Returns <0 if a ranks before b, >0 after, 0 if a == b. */
int pool_rank_cmp_by(const Pool *p, const double *score, int a, int b);
/* pool_rank_cmp_by with the pool's own scores. */
int pool_rank_cmp(const Pool *p, int a, int b);

#endif
