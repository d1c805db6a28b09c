/* Per-round timing summary printed by rootspec-target (`make run`): medians of the phases
 * of DESIGN.md §6 and the share of the root pass hidden behind drafting. */
#ifndef ROOTSPEC_TIMING_H
#define ROOTSPEC_TIMING_H
#include "decode.h"
#include <stdio.h>

/* The parts a round's time splits into, in round order; they add up to the round. */
enum { TIMING_SEND, TIMING_ROOT, TIMING_WAIT, TIMING_SELECT, TIMING_TREE, TIMING_OTHER,
       TIMING_N_PARTS };

typedef struct {
    int n, cap;
    double *draft_ms, *root_ms, *tree_ms, *wait_ms, *overhead_ms, *hidden, *round_ms;
    int rounds_with_pool;
    int rounds_guessed; /* of those, the drafter had guessed the commit ahead (run-ahead:
                           no commit pass, draft_commit_ns 0) */
    double part_ms[TIMING_N_PARTS]; /* summed over the rounds */
} TimingAcc;

/* An empty accumulator; timing_destroy frees it (accepts NULL, clears the pointer). */
void timing_create(TimingAcc **out);
void timing_add(TimingAcc *t, const RoundInfo *r);
/* The medians, then one line saying where a round's time goes (means of the parts). */
void timing_print(FILE *f, TimingAcc *t);
/* Splits a round into the parts (ms): grow request sent, root pass, waiting for the pool
 * after the root pass (or, without one, after the request), selection, tree pass, and the
 * rest (sampling, commit, log). A part the round lacks is 0. */
void timing_round_parts(const RoundInfo *r, double part_ms[TIMING_N_PARTS]);
void timing_destroy(TimingAcc **t);
/* Fraction of [root_start, root_end] that lies inside the drafting, taken as
 * [grow_sent, min(pool_recv, grow_sent + draft_ns)] (draft_ns: the drafter's own time). */
double timing_hidden_share(const RoundInfo *r);

#endif
