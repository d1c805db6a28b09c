/* Per-round timing summary printed by rootspec-target (`make run`): medians of the phases
 * of DESIGN.md §6 and the share of the root pass hidden behind drafting. */
#ifndef ROOTSPEC_TIMING_H
#define ROOTSPEC_TIMING_H
#include "decode.h"
#include <stdio.h>

typedef struct {
    int n, cap;
    double *draft_ms, *root_ms, *tree_ms, *wait_ms, *overhead_ms, *hidden, *round_ms;
    int rounds_with_pool;
} TimingAcc;

void timing_init(TimingAcc *t);
void timing_add(TimingAcc *t, const RoundInfo *r);
void timing_print(FILE *f, TimingAcc *t);
void timing_free(TimingAcc *t);
/* Fraction of [root_start, root_end] that lies inside the drafting, taken as
 * [grow_sent, min(pool_recv, grow_sent + draft_ns)] (draft_ns: the drafter's own time). */
double timing_hidden_share(const RoundInfo *r);

#endif
