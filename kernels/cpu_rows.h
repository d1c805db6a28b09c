/* Per-row reductions of logits on the CPU: top-k and log-sum-exp of each row in one fused
 * pass (kernels/cpu_rows.c). The CPU backend runs it on its kept rows (backend_rows_topk),
 * and backend_rows_topk's fallback for a backend without its own runs it on copied rows.
 *
 * Determinism: a row is reduced whole by one thread, in column order, so the result is
 * the same bits on 1 or N threads, and with or without AVX2/FMA (the portable build does
 * the same IEEE operations: fmaf, no contraction under -std=c11; ROOTSPEC_CPU_KERNELS=ref
 * or scalar forces it). */
#ifndef ROOTSPEC_CPU_ROWS_H
#define ROOTSPEC_CPU_ROWS_H
#include "backend.h"
#include "threadpool.h"

#define ROWS_TOPK_MAX BACKEND_TOPK_MAX

/* One row's partial result (scratch of cpu_rows_topk). */
typedef struct {
    float m;     /* row max (-inf: none finite or larger) */
    int nan;     /* a NaN was seen */
    double s;    /* sum of exp(x - m) over the row (columns far below m left out) */
    int cnt;     /* entries in id/v */
    int id[ROWS_TOPK_MAX];
    float v[ROWS_TOPK_MAX];
} CpuRowsPart;

/* For each of the n rows of logits (n, vocab): ids (n, k) the top-k columns by value,
 * ties to the lower id (as common/logits.h row_topk); lse (n) log(sum exp(row)) rounded
 * to float, NaN when the row holds a NaN or +inf, or is all -inf (as row_lse); logq (n, k)
 * row[id] - lse in float. Columns more than log(vocab) + 20 log 2 below the max are left
 * out of the sum, so it is within 2^-20 relative of the exact one, and lse within
 * ~1.3e-6 (that, plus the exp's 2.5e-7) and its float rounding of the exact value.
 * pool may be NULL (the caller's thread only); threads take whole rows. scratch: (n).
 * 1 <= k <= min(ROWS_TOPK_MAX, vocab). */
void cpu_rows_topk(ThreadPool *pool, const float *logits, int n, int vocab, int k, int *ids,
                   float *logq, float *lse, CpuRowsPart *scratch);

#endif
