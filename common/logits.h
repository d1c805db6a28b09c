/* Row statistics over one row of logits (argmax, top-k, log-sum-exp, softmax) and the draws
 * verification makes from a row: argmax when greedy, else exact inverse-CDF sampling of
 * the row's sampling law (Sampling, below). Every sum is accumulated in double,
 * max-shifted, so a row gives the same result on every platform. */
#ifndef ROOTSPEC_LOGITS_H
#define ROOTSPEC_LOGITS_H
#include "rng.h"
#include "util.h"
#include <math.h>
#include <stdint.h>
#include <string.h>

/* ---- Sampling: the law a decode draws each token from ----
 * Applied in this order (Hugging Face's warper order):
 *   1. temperature: z_i = l_i / T (T = 0: greedy, the argmax, lowest index on a tie);
 *   2. top-k: keep the tokens whose z is at least the k-th largest z (ties kept);
 *   3. top-p: of those, keep token i iff the softmax mass of the kept tokens with z
 *      strictly above z_i is below top_p (the fewest largest tokens reaching top_p, ties
 *      kept); the masses are summed in fixed point, in units of 2^-40 of the largest
 *      weight, so the cut is the same for any summation order (threads, GPU blocks);
 *   4. min-p: keep token i iff z_i - z_max >= log(min_p) (p_i >= min_p * p_max).
 * The law is softmax(z) over the kept tokens. Each filter keeps the tokens at or above a
 * value, so the kept set is {i : l_i >= cut} for one logit `cut` (RowStats.cut).
 * A zeroed Sampling is greedy; SAMPLING_PLAIN (T = 1, no filter) is softmax(l), the law of
 * plain sampling, computed bit for bit as it is without a Sampling. The seed stays with the
 * caller (DecodeOpts.seed). */
typedef struct {
    double temperature; /* 0 (greedy) or SAMPLING_TEMP_MIN..SAMPLING_TEMP_MAX */
    int top_k;          /* >= 0; 0 (or >= the vocabulary): off; 1: greedy */
    double top_p;       /* in [0, 1]; 0 or 1: off */
    double min_p;       /* in [0, 1]; 0: off */
} Sampling;

#define SAMPLING_GREEDY ((Sampling){0.0, 0, 0.0, 0.0})
#define SAMPLING_PLAIN ((Sampling){1.0, 0, 0.0, 0.0})
/* The two laws of the 0/1 temperature flag (--temp 0/1 of the bench's combinations). */
static inline Sampling sampling_from_temp(int temp) {
    return temp ? SAMPLING_PLAIN : SAMPLING_GREEDY;
}
/* The temperatures a decode takes besides 0. Below SAMPLING_TEMP_MIN, 1/T (and a logit
 * times it) may overflow, so the row's log-sum-exp would be inf - inf; such a temperature,
 * down to subnormal numbers and 0 itself, is taken as greedy by sampling_normalize, the
 * limit T -> 0 of the law (ties aside: greedy takes the lowest index). The same floor as
 * vLLM's, so a client sees the same law from either server. */
#define SAMPLING_TEMP_MIN 1e-5
#define SAMPLING_TEMP_MAX 1e6
/* RS_EINVAL naming the field and value when s is outside the ranges above (0 < T <
 * SAMPLING_TEMP_MIN included: what a decode is given has been through sampling_normalize). */
int sampling_check(const Sampling *s, RsErr *e);
/* The one check of a sampling law from outside (command lines, request bodies): finite
 * values in range, and a temperature in [0, SAMPLING_TEMP_MIN) set to 0 (greedy). RS_EINVAL
 * naming the field and value otherwise; s is left as it was then. */
int sampling_normalize(Sampling *s, RsErr *e);
/* The argmax path: T = 0 or top_k = 1. */
int sampling_greedy(const Sampling *s);
/* T = 1 and no filter: plain softmax. */
int sampling_plain(const Sampling *s);
/* 0 greedy, 1 sampling: the `temp` of logs and of the Rng stream's derivation. */
static inline int sampling_temp(const Sampling *s) { return !sampling_greedy(s); }
/* "greedy", or e.g. "T=0.7 top_k=40 top_p=0.9 min_p=0.05" (filters that are off left out;
 * "T=1" for plain sampling); buf of at least SAMPLING_STR bytes. Returns buf. */
#define SAMPLING_STR 96
const char *sampling_str(const Sampling *s, char *buf, size_t n);

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
    int draw;     /* greedy: argmax; sampling with a uniform: the inverse-CDF draw of the
                     sampling law; -1: none asked */
    float max;    /* the largest logit */
    float second; /* runner-up (== max on a tie; -INFINITY for a one-entry row) */
    float cut;    /* sampling: the smallest logit the filters keep (-INFINITY: all kept) */
    double scale; /* sampling: 1 / T */
    double lse;   /* sampling: log(sum over kept i of exp(l_i / T)), computed as
                     max * scale + log(sum exp((l_i - max) * scale)); NAN when greedy */
} RowStats;

/* log p of a token whose logit is `logit` under the row's sampling law (-INFINITY when
 * filtered out); the row's stats must be a sampling one (lse not NAN). */
double row_stats_logp(const RowStats *st, float logit);

/* Maximum, first index of it and runner-up of a range of a row. A NaN logit makes the
 * maximum NaN (and the argmax its index): a row holding one has no law, and a check of the
 * maximum alone finds it. */
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
/* One unit of top-p's fixed-point masses (2^40): the largest weight, exp(0). */
#define ROW_FIXED_ONE 1099511627776.0
/* Helpers the CPU reduction and the CUDA kernel share (host and device code). */
#ifdef __CUDACC__
#define ROW_HD __host__ __device__
#else
#define ROW_HD
#endif
/* The key of a logit: unsigned order = float order (-0 is +0; NaN is not a logit). */
static inline ROW_HD uint32_t row_logit_key(float f) {
    uint32_t u;
    f = f == 0 ? 0.0f : f;
    memcpy(&u, &f, 4);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
static inline ROW_HD float row_key_logit(uint32_t k) {
    uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* A weight in fixed point: sums of these are exact, so their order does not matter. */
static inline ROW_HD uint64_t row_fixed_weight(float l, float mx, double scale) {
    return (uint64_t)(exp(((double)l - mx) * scale) * ROW_FIXED_ONE);
}
/* The law's unnormalised weight of logit l (scale 1, no cut: exp(l - mx) to the bit). */
static inline ROW_HD double row_weight(float l, float mx, double scale, float cut) {
    return l >= cut ? exp(((double)l - mx) * scale) : 0.0;
}
/* The sampling law's cut (RowStats.cut) of a row whose maximum is mx: top-k and top-p by
 * a radix select over the logits' order-preserving keys (four 8-bit digits, a count or a
 * fixed-point mass histogram per digit), min-p from its closed form. -INFINITY when no
 * filter is on. Not greedy. */
float row_cut(const float *row, int n, float mx, const Sampling *s);
/* csum[c - c0] = the chunk sums of the sampling law's weights: as row_chunk_sums with
 * exp(((double)row[i] - mx) * scale), 0 below cut. */
void row_chunk_wsums(const float *row, int n, float mx, double scale, float cut, int c0, int c1,
                     double *csum);
/* RowStats from a row's RowMax and (sampling) its cut and chunk sums csum (row_chunks(n)):
 * u in [0, 1) draws, u < 0 draws nothing. */
void row_stats_finish(const float *row, int n, const RowMax *m, const double *csum,
                      const Sampling *s, float cut, double u, RowStats *out);
/* All of the above on one thread; csum: (row_chunks(n)) scratch, unused when greedy. */
void row_stats(const float *row, int n, const Sampling *s, double u, double *csum,
               RowStats *out);

#endif
