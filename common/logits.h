/* Row statistics over one row of logits (argmax, top-k, log-sum-exp, softmax) and the draws
 * verification makes from a row: argmax at T=0, exact inverse-CDF sampling of
 * softmax(logits) at T=1. Every sum is accumulated in double, max-shifted, so a row gives
 * the same result on every platform. */
#ifndef ROOTSPEC_LOGITS_H
#define ROOTSPEC_LOGITS_H
#include "rng.h"

/* Index of the largest logit; ties go to the lowest index. */
int row_argmax(const float *logits, int n);
/* Best logit minus the runner-up (n >= 2): how near a tie a greedy choice is. */
double row_top_margin(const float *logits, int n);
/* Top-k indices by descending value, ties by ascending index; k <= n. */
void row_topk(const float *vals, int n, int k, int *idx);
/* log(sum exp(logits)), max-shifted, accumulated in double. */
double row_lse(const float *logits, int n);
/* Softmax probabilities (double precision accumulation) into probs (n). */
void row_softmax(const float *logits, int n, float *probs);
/* One draw from softmax(logits). */
int row_sample(const float *logits, int n, Rng *r);
/* T == 0: argmax; T == 1: sample. */
int row_draw(const float *logits, int n, int temp, Rng *r);

/* ---- Fused row reductions: what the backends' row queries return (kernels/backend.h) ----
 * One canonical order, so every backend and thread count gives the same bits for the same
 * logits: the maximum, its first index and the runner-up do not depend on order; the
 * exp-sum runs over chunks of ROW_CHUNK entries, each summed in index order in double from
 * exp((double)l - max), and the chunk sums are added in chunk order. A draw at u finds the
 * chunk whose running sum passes u * total, then scans that chunk in order (the inverse CDF
 * of row_sample, summed in this order). A CPU backend splits a row across threads by
 * chunks; a CUDA block gives each thread whole chunks. */
#define ROW_CHUNK 256

typedef struct {
    int argmax;   /* first index of the largest logit */
    int draw;     /* T=0: argmax; T=1 with a uniform: the inverse-CDF draw; -1: none asked */
    float max;    /* the largest logit */
    float second; /* runner-up (== max on a tie; -INFINITY for a one-entry row) */
    double lse;   /* T=1: log(sum exp(logits)); NAN at T=0 */
} RowStats;

/* Maximum, first index of it and runner-up of a range of a row. */
typedef struct {
    float max, second;
    int argmax; /* -1: empty range */
} RowMax;

static inline int row_chunks(int n) { return (n + ROW_CHUNK - 1) / ROW_CHUNK; }
/* *m = RowMax of row[lo, hi). */
void row_max_part(const float *row, int lo, int hi, RowMax *m);
/* Folds m into *acc (any order: ties go to the lower index). */
void row_max_merge(RowMax *acc, const RowMax *m);
/* csum[c - c0] = sum in index order of exp((double)row[i] - mx) over chunk c, c0 <= c < c1. */
void row_chunk_sums(const float *row, int n, float mx, int c0, int c1, double *csum);
/* RowStats from a row's RowMax and (T=1) its chunk sums csum (row_chunks(n)): u in [0, 1)
 * draws at T=1, u < 0 draws nothing. */
void row_stats_finish(const float *row, int n, const RowMax *m, const double *csum, int temp,
                      double u, RowStats *out);
/* All of the above on one thread; csum: (row_chunks(n)) scratch, unused at T=0. */
void row_stats(const float *row, int n, int temp, double u, double *csum, RowStats *out);

#endif
