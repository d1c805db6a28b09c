/* Fused, threaded row reductions of the CPU backend; see cpu_rowstats.h. */
#include "cpu_rowstats.h"
#include <math.h>

#define MAX_SPLIT 64 /* threads one row is split across at most (RowMax partials) */

typedef struct {
    const float *const *row;
    int n_rows, n;
    const Sampling *s;
    const double *u;
    double *scratch;
    RowStats *out;
    /* split mode: the one row being reduced */
    int r;
    RowMax part[MAX_SPLIT];
    float mx, cut;
} RowsJob;

size_t cpu_rows_scratch(int n, int n_threads) {
    return (size_t)row_chunks(n) * (size_t)(n_threads > 0 ? n_threads : 1);
}

static double job_u(const RowsJob *j, int r) { return j->u ? j->u[r] : -1.0; }

/* Whole rows, round-robin over the threads; each thread has its own chunk-sum scratch. */
static void rows_task(void *arg, int tid, int nth) {
    RowsJob *j = arg;
    double *csum = j->scratch + (size_t)tid * row_chunks(j->n);
    for (int r = tid; r < j->n_rows; r += nth)
        row_stats(j->row[r], j->n, j->s, job_u(j, r), csum, &j->out[r]);
}

/* Split mode, phase 1: this thread's share of the row's maximum. */
static void max_task(void *arg, int tid, int nth) {
    RowsJob *j = arg;
    int lo, hi;
    threadpool_share(j->n, tid, nth, &lo, &hi);
    row_max_part(j->row[j->r], lo, hi, &j->part[tid]);
}

/* Split mode, phase 2: this thread's chunks of the exp-sum (chunk sums do not depend on
 * which thread computes them). */
static void sum_task(void *arg, int tid, int nth) {
    RowsJob *j = arg;
    int lo, hi;
    threadpool_share(row_chunks(j->n), tid, nth, &lo, &hi);
    row_chunk_wsums(j->row[j->r], j->n, j->mx, 1.0 / j->s->temperature, j->cut, lo, hi,
                    j->scratch + lo);
}

void cpu_rows_stats(ThreadPool *tp, const float *const *row, int n_rows, int n,
                    const Sampling *s, const double *u, double *scratch, RowStats *out) {
    RS_ASSERT(n > 0 && n_rows >= 0);
    int nth = threadpool_size(tp), greedy = sampling_greedy(s);
    RowsJob j = {.row = row, .n_rows = n_rows, .n = n, .s = s, .u = u,
                 .scratch = scratch, .out = out};
    if (n_rows >= nth || nth > MAX_SPLIT) {
        threadpool_run(tp, rows_task, &j);
        return;
    }
    for (j.r = 0; j.r < n_rows; j.r++) {
        threadpool_run(tp, max_task, &j);
        RowMax m = {.argmax = -1};
        for (int t = 0; t < nth; t++) row_max_merge(&m, &j.part[t]);
        j.mx = m.max;
        j.cut = -INFINITY;
        if (!greedy && isfinite(m.max)) { /* else no law: backend_rows_stats refuses it */
            j.cut = row_cut(row[j.r], n, m.max, s); /* on this thread (filters only) */
            threadpool_run(tp, sum_task, &j);
        }
        row_stats_finish(row[j.r], n, &m, scratch, s, j.cut, job_u(&j, j.r), &out[j.r]);
    }
}
