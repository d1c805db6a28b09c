/* rootspec-micro's EAGLE-3 figure (--eagle3 HEAD): the head's pool growth on the CPU, in
 * the same run as the read stream and the kernels' compute roof it is set against. */
#ifndef ROOTSPEC_MICRO_EAGLE3_H
#define ROOTSPEC_MICRO_EAGLE3_H
#include "common/cli.h"
#include "common/model.h"

/* Loads HEAD (a directory or random:eagle3-*) for `target` (its embeddings, read a row at a
 * time; a random target needs no host weights) and, for each of the n thread counts,
 * commits a ctx-row context (untimed: what the passes attend to), then runs `rounds` timed
 * rounds after one warm-up: a 4-row commit with random features, then the DESIGN.md §2
 * growth (7 expansion passes of 10 rows). Prints the median round, the
 * expansion pass, the bytes of the matrices it streams against read_gbs[i] (the read
 * stream at threads[i]) and against the compute roof of a 10-row pass (one thread,
 * weights in cache, divided by the thread count), and a "micro eagle3 ..." key=value line
 * per thread count. family, sw: BackendParams.cpu_kernels and .sw of the head's layer. Errors: the
 * head's (load, misfit) or the runner's. */
int micro_eagle3(const char *head_path, const Model *target, const char *family,
                 const BackendSwitches *sw, const int *threads, const double *read_gbs, int n, int ctx, int rounds,
                 RsErr *e);

#endif
