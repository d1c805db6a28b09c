/* The CPU backend's row queries (kernels/backend.h: backend_rows_stats) as one fused,
 * threaded pass over each row: maximum, first argmax and runner-up, then (sampling) the
 * filters' cut, the chunked exp-sum of the law's weights, log-sum-exp and an inverse-CDF
 * draw, in the canonical order of
 * common/logits.h, so the result does not depend on the thread count. */
#ifndef ROOTSPEC_CPU_ROWSTATS_H
#define ROOTSPEC_CPU_ROWSTATS_H
#include "common/logits.h"
#include "threadpool.h"

/* Scratch doubles cpu_rows_stats needs for rows of n entries on a pool of n_threads. */
size_t cpu_rows_scratch(int n, int n_threads);
/* out[i] = RowStats of row[i] (n entries each) under s; u: (n_rows) uniforms for the
 * draws when sampling, or NULL (none; u[i] < 0 skips row i's). Many rows: one row per
 * thread at a time; fewer rows than threads: each row is split across the threads (the
 * filters' cut, when a filter is on, on one thread). */
void cpu_rows_stats(ThreadPool *tp, const float *const *row, int n_rows, int n,
                    const Sampling *s, const double *u, double *scratch, RowStats *out);

#endif
