/* Tree selection rules (DESIGN.md §3) and expected acceptance tau (DESIGN.md §4). Pure functions
 * over a finalized Pool: no model, no I/O, so properties are testable on random pools. */
#ifndef ROOTSPEC_SELECT_H
#define ROOTSPEC_SELECT_H
#include "common/pool.h"

/* What --decoder picks (the "decoder" of the round log and of a server request): plain
 * autoregressive decoding, or a speculative round named by its selection rule. */
typedef enum {
    DECODER_AR = 0,   /* plain autoregressive decoding: no pool */
    DECODER_DRAFT,    /* top-B by draft score, verified with the continuation in one pass */
    DECODER_PEARL,    /* draw X1 ~ p0, keep the draft tree's part beneath X1 */
    DECODER_ROOTDRAW, /* draw X1 ~ p0, keep X1 and its B-1 best pool descendants */
    DECODER_ROOT,     /* replace q(u1) by p0(u1), top-B */
    DECODER_ORACLE,   /* offline: maximises tau given every target row */
    DECODER_COUNT
} DecoderKind;

const char *decoder_name(DecoderKind k);
/* Parses "ar", "draft", ...; returns -1 when unknown. */
int decoder_parse(const char *s);
/* Whether the decoder's rule runs the one-token root pass before selecting (pearl,
 * rootdraw, root). */
int decoder_needs_root_pass(DecoderKind k);

/* Tree whose node[0] may be a synthetic X1 that is not in the pool (rootdraw/pearl when
 * the draw is off the first level): then node[0] == TREE_X1_OFFPOOL and x1_token holds it. */
#define TREE_X1_OFFPOOL (-2)
typedef struct {
    Tree t;
    int x1_token;   /* pearl/rootdraw/root: the drawn first token; -1 otherwise */
    int x1_in_pool; /* 1 if X1 is on the pool's first level */
    int rooted_at_x1; /* 1: node[0] is X1 (accepted), verification starts at X1's row */
} Selection;

/* draft: top-B pool candidates by the ranking. */
void select_draft(const Pool *p, int B, Selection *out);
/* pearl: the draft tree's part beneath x1 (x1 first), or x1 alone. */
void select_pearl(const Pool *p, int B, int x1, Selection *out);
/* rootdraw: x1 and its B-1 highest-ranked pool descendants, or x1 alone. */
void select_rootdraw(const Pool *p, int B, int x1, Selection *out);
/* root: top-B after replacing each first factor by p0(u1). p0: (vocab) probabilities;
 * x1 is the token drawn from p0 (recorded; the caller skips the tree pass when the tree's
 * first level lacks it). */
void select_root(const Pool *p, int B, const float *p0, int x1, Selection *out);
/* select_root from what the decode has of p0: logp1 (p->root_n_children) = log p0 of each
 * first-level node in pool order (-inf where p0 is 0), from the backend's row queries. */
void select_root_logp(const Pool *p, int B, const double *logp1, int x1, Selection *out);
/* oracle: top-B by target path probability. path_prob: (pool n) = p(u | c) for every
 * candidate (product of target transitions along its path). */
void select_oracle(const Pool *p, int B, const double *path_prob, Selection *out);

/* Index into sel->t.node of the child of tree node `at` (-1 = tree root) with `token`,
 * or -1. */
int tree_child_with_token(const Pool *p, const Selection *sel, int at, int token);

/* Expected acceptance of a selection. trans[i] = target probability of tree node i's token
 * given its parent's prefix (for rooted_at_x1 trees node 0's entry is ignored: X1 counts 1).
 * tau = sum over non-root nodes of the product of trans along the path. */
double tree_tau(const Selection *sel, const double *trans);
/* Expected acceptance given the round's first draw X1 when X1 labels first-level tree node
 * k1 (a root-row tree: root selection draws X1 before its tree pass): X1 counts 1, plus the
 * path mass of k1's descendants measured from X1. Averaged over X1 ~ p0 (0 when X1 lies off
 * the first level) it is tree_tau, and unlike tree_tau it is known in a round that skips
 * the tree pass, so a mean over every round matches realised acceptance (DESIGN.md §4). */
double tree_tau_given_x1(const Selection *sel, const double *trans, int k1);

#endif
