/* The cost-aware budget (`--budget auto`, DESIGN.md §5 "Cost-aware rounds"). A tree only
 * pays when the tokens it is expected to add are worth more than the time its rows and its
 * drafting take, and both sides depend on the machine: on a GPU a 65-row pass costs about
 * a one-row pass, on a 2-core CPU about 28 of them; a model drafter may cost more than the
 * target. So the planner measures, while decoding, what a pass of n rows costs, what the
 * drafter costs per pool level and how often a candidate of a given draft log-probability
 * is accepted, and picks each round
 *   before asking the drafter: whether to ask at all (no: a plain AR step, the drafter
 *     catches up with the next request) and how deep a pool to grow;
 *   with the pool: how many of the rule's ranked nodes to verify (0..the cap), the size
 *     that maximises expected tokens minus time priced at the decode's running rate
 *     (Dinkelbach's criterion for the best long-run tokens per second).
 * The choices depend only on the past and the pool, never on a draw of the round, so the
 * output law is unchanged (DESIGN.md §4). Times are measured, so at T=1 two runs may pick
 * other trees and draw other (equally distributed) text; at T=0 the ids equal AR's.
 * One planner serves any number of decodes in turn (what it learnt carries over). */
#ifndef ROOTSPEC_PLANNER_H
#define ROOTSPEC_PLANNER_H
#include "select.h"
#include <stdint.h>

typedef struct Planner Planner;

/* Before a round: ask the drafter (depth 1..POOL_MAX_DEPTH, width 1..POOL_EXPAND nodes
 * expanded a level) or decode one AR step. */
typedef struct {
    int ask;
    int depth, width;
    int explore; /* asked to refresh stale estimates, not because it looked better */
} PlanAsk;

/* With the pool: verify the first k nodes of the rule's ranked selection. */
typedef struct {
    int k;
    double tokens; /* expected tokens the round emits with k */
    double ns;     /* expected time of the round with k */
} PlanChoice;

Planner *planner_create(void);
/* Accepts NULL and a NULL *pl; clears the pointer. */
void planner_destroy(Planner **pl);

/* Tests: costs fixed instead of measured (a pass of n rows: pass1_ns + (n-1) * row_ns; a
 * pool: draft_ns at any depth, none of it hidden), so every choice is reproducible. */
void planner_fix_costs(Planner *pl, double pass1_ns, double row_ns, double draft_ns);

/* The round's first decision, for `rule` at temperature class temp (0 greedy, else 1);
 * n_pend: the tokens the drafter would commit before growing. */
PlanAsk planner_before_round(Planner *pl, DecoderKind decoder, int temp, int n_pend);

/* The size to verify. sel: the rule's selection at the largest budget, nodes in rank order
 * (every prefix is a tree); x1: the round's first token when drawn already (root-pass
 * rules), else -1; depth: the pool depth asked. Records what each pool depth would have
 * been worth, for later planner_before_round calls. */
PlanChoice planner_choose(Planner *pl, DecoderKind decoder, int temp, const Pool *pool,
                          const Selection *sel, int x1, int depth);

/* A decode in a batch (batch.h) shares every pass with others: its rows cost what they
 * add to the batch's pass, and the time they take is priced at the batch's rate, so a
 * full batch verifies only what is likely to be accepted and speculation fades as it
 * fills. others: the rows the other sequences bring to a pass; seqs: the sequences
 * sharing it (1 and 0: alone). From the first call on, the decode's own
 * planner_observe_pass calls are ignored (they time a shared pass by one sequence's rows);
 * planner_observe_batch_pass records the passes by their total rows instead. */
void planner_set_batch(Planner *pl, int others, int seqs);
/* pl's acceptance calibration (how often a candidate of a given draft probability is
 * accepted: a property of the drafter and the text, not of one decode) becomes with's, so
 * the planners of a batch's decodes learn it together instead of each from its own rounds.
 * Thread-safe on with; with must outlive pl. NULL: pl's own again. */
void planner_share_accept(Planner *pl, Planner *with);
/* pl's pass costs in a batch become with's: what a pass of the shared backend costs is a
 * property of the batch, not of one decode, and a decode's planner alone would learn it
 * again from few passes for every slot. planner_observe_batch_pass on with, once a pass,
 * feeds them. Thread-safe on with; with must outlive pl. NULL: pl learns on from its
 * last copy. */
void planner_share_passes(Planner *pl, Planner *with);
void planner_observe_batch_pass(Planner *pl, int total_rows, uint64_t ns);

/* Observations. A pass of `rows` rows took ns. */
void planner_observe_pass(Planner *pl, int rows, uint64_t ns);
/* A pool arrived after a commit of n_commit tokens: its own timings; total_ns from the
 * request to its arrival, of which waited_ns the target spent waiting after its own work
 * (the root pass) was done. */
void planner_observe_pool(Planner *pl, const Pool *pool, int n_commit, uint64_t total_ns,
                          uint64_t waited_ns);
/* Verification of the first k nodes of sel: acc[0..n_acc) are the tree indices accepted
 * (in path order; for X1-rooted trees node 0 is not a prediction and is left out). */
void planner_observe_accept(Planner *pl, DecoderKind decoder, int temp, const Pool *pool,
                            const Selection *sel, int k, const int *acc, int n_acc);
/* A whole round of `rule` at temp: tokens emitted in ns; asked: whether it asked the
 * drafter. */
void planner_observe_round(Planner *pl, DecoderKind decoder, int temp, int tokens, uint64_t ns,
                           int asked);

#endif
