/* Per-row reductions of logits on the CPU: top-k and log-sum-exp of each row in one fused
 * pass (kernels/cpu_rows.c). The CPU backend runs it on its kept rows (backend_rows_topk),
 * and backend_rows_topk's fallback for a backend without its own runs it on copied rows.
 *
 * Determinism: a row is cut into fixed chunks of CPU_ROWS_CHUNK columns whatever the
 * thread count; each chunk is reduced in a fixed lane order and the chunks are combined in
 * column order, so the result is the same bits on 1 or N threads (and with or without
 * AVX2: the same IEEE operations, no contraction under -std=c11). */
#ifndef ROOTSPEC_CPU_ROWS_H
#define ROOTSPEC_CPU_ROWS_H
#include "backend.h"
#include "threadpool.h"

/* Columns per work item: 6 for a 49152-token row, enough to share one row between
 * threads, few enough that the k-th best of a chunk soon stops letting columns through. */
#define CPU_ROWS_CHUNK 8192
#define ROWS_TOPK_MAX BACKEND_TOPK_MAX

/* One chunk's partial result (scratch of cpu_rows_topk). */
typedef struct {
    float m;     /* chunk max (-inf: none finite or larger) */
    int nan;     /* a NaN was seen */
    double s;    /* sum of exp(x - m) over the chunk */
    int cnt;     /* entries in id/v (< k only for a chunk narrower than k) */
    int id[ROWS_TOPK_MAX];
    float v[ROWS_TOPK_MAX];
} CpuRowsPart;

/* Chunks per row of `vocab` columns: the scratch holds n_rows * this many parts. */
int cpu_rows_chunks(int vocab);

/* For each of the n rows of logits (n, vocab): ids (n, k) the top-k columns by value,
 * ties to the lower id (as common/logits.h row_topk); lse (n) log(sum exp(row)) rounded to
 * float (NaN when the row holds a NaN or +inf, or is all -inf, as row_lse); logq (n, k)
 * row[id] - lse in float. pool may be NULL (the caller's thread only). scratch:
 * (n * cpu_rows_chunks(vocab)). 1 <= k <= min(ROWS_TOPK_MAX, vocab). */
void cpu_rows_topk(ThreadPool *pool, const float *logits, int n, int vocab, int k, int *ids,
                   float *logq, float *lse, CpuRowsPart *scratch);

#endif
