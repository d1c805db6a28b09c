/* Top-k and log-sum-exp of logits rows on the CPU, both from one fused pass over each row
 * (kernels/cpu/cpu_topk.c): what a drafter needs to expand a row into its children. The CPU
 * backend runs it on its kept rows (backend_rows_topk), and backend_rows_topk's fallback for
 * a backend without its own runs it on copied rows. The verifier's per-row statistics are
 * another reduction (kernels/cpu/cpu_rowstats.h).
 *
 * Determinism: a row is reduced whole by one thread, in column order, so the result is
 * the same bits on 1 or N threads, and with or without AVX2/FMA (the portable build does
 * the same IEEE operations: fmaf, no contraction under -std=c11; cpu_topk_portable forces
 * it). */
#ifndef ROOTSPEC_CPU_TOPK_H
#define ROOTSPEC_CPU_TOPK_H
#include "kernels/backend.h"
#include "threadpool.h"

#define CPU_TOPK_MAX BACKEND_TOPK_MAX

/* Columns per block: the pieces cpu_topk_feed takes start at multiples of it. */
#define CPU_TOPK_BLOCK 64

/* One row's state so far (scratch of cpu_topk, cpu_topk_begin/feed/end). */
typedef struct {
    float m;       /* max so far (-inf: none finite or larger) */
    int nan;       /* a NaN was seen */
    double sd[8];  /* per-lane sums of exp(x - m) (columns far below m left out) */
    int cnt;       /* entries in id/v */
    int id[CPU_TOPK_MAX];
    float v[CPU_TOPK_MAX];
} CpuTopkPart;

/* For each of the n rows of logits (n, vocab): ids (n, k) the top-k columns by value,
 * ties to the lower id (as common/logits.h row_topk); lse (n) log(sum exp(row)) rounded
 * to float, NaN when the row holds a NaN or +inf, or is all -inf (as row_lse); logq (n, k)
 * row[id] - lse in float. Columns more than log(vocab) + 20 log 2 below the max are left
 * out of the sum, so it is within 2^-20 relative of the exact one, and lse within
 * ~1.3e-6 (that, plus the exp's 2.5e-7) and its float rounding of the exact value.
 * pool may be NULL (the caller's thread only); threads take whole rows. scratch: (n).
 * 1 <= k <= min(CPU_TOPK_MAX, vocab). */
void cpu_topk(ThreadPool *pool, const float *logits, int n, int vocab, int k, int *ids,
              float *logq, float *lse, CpuTopkPart *scratch);

/* The same reduction fed a piece of the columns at a time, while each piece is in cache
 * (the CPU backend's output head, one column tile after another): begin for n rows of
 * `vocab` columns, then feed columns [c0, c1) of them (logits (n, ld), row r at
 * logits + r * ld; c0 a multiple of CPU_TOPK_BLOCK, each piece starting where the last
 * ended, the last ending at vocab), then end. The results are the bits cpu_topk
 * gives for the whole rows. */
typedef struct {
    void (*fn)(void); /* the row kernel begin chose (AVX2 + FMA or portable) */
    float cut;        /* columns this far below the running max are left out */
    int n, vocab, k;
    CpuTopkPart *parts; // (n)
} CpuTopkRun;

CpuTopkRun cpu_topk_begin(CpuTopkPart *parts, int n, int vocab, int k);
/* Tests: the run takes the portable row kernel instead of the AVX2 + FMA one (both give
 * the same bits). */
void cpu_topk_portable(CpuTopkRun *run);
void cpu_topk_feed(ThreadPool *pool, const CpuTopkRun *run, const float *logits, int ld,
                   int c0, int c1);
void cpu_topk_end(const CpuTopkRun *run, int *ids, float *logq, float *lse);

#endif
