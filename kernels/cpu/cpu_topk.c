/* Fused top-k + log-sum-exp over logits rows on the CPU (see cpu_topk.h). The drafter
 * reduces ten 49152-wide rows per pass, so an exp per column (double or float) would cost
 * more than the rest of its host work (docs/PERF.md); here a row is read once, 64 columns
 * (a block) at a time, in column order:
 *   - the block's max, broadcast in registers, raises the row's running max m (the sums
 *     so far are rescaled, rarely: a tokenizer puts frequent tokens first, so the max
 *     comes early);
 *   - only the 8-column vectors with a lane above m - cut get an exp; the rest are
 *     skipped. On the default model's drafting rows ~20% of the vectors pass. A skipped
 *     column adds less than e^-cut = 2^-20 / V (relative to e^m) to a sum that is >= 1
 *     (the max's own term), so together they move lse by less than 2^-20 (1e-6);
 *   - a block's lanes are looked at one by one only when its max beats the k-th best so
 *     far, which soon stops happening once the list is full (a NaN reaches the sum and
 *     makes lse NaN).
 * exp is a table + polynomial float form (vexp, 2.5e-7 relative) with fused
 * multiply-adds; lane sums move into double every block, so the sum's rounding stays far
 * below the exp's. A row may also be fed in pieces (cpu_topk_begin/feed/end): the CPU
 * backend's output head reduces each tile of columns while it is in cache. */
#include "cpu_topk.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Every vector helper is inlined: no 32-byte vector crosses a call, whatever the target. */
#pragma GCC diagnostic ignored "-Wpsabi"

#define BLOCK CPU_TOPK_BLOCK /* columns per block: 8 vectors of 8 */
#define INLINE static inline __attribute__((always_inline))

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint32_t v8u __attribute__((vector_size(32)));

INLINE v8f vload(const float *p) {
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

INLINE v8f vsplat(float f) { return (v8f){f, f, f, f, f, f, f, f}; }

/* m ? a : b, lane by lane (m from a vector comparison: all ones or zero). */
INLINE v8f vsel(v8i m, v8f a, v8f b) { return (v8f)(((v8i)a & m) | ((v8i)b & ~m)); }

/* ---- the few operations whose AVX2 form is an intrinsic ----------------------------- *
 * Each has a portable twin giving the same bits, so the result never depends on the
 * CPU's features, only the speed does. */

INLINE int lane_bits_generic(v8i m) {
    int bits = 0;
    for (int l = 0; l < 8; l++) bits |= (m[l] != 0) << l;
    return bits;
}

INLINE v8f vfma_generic(v8f a, v8f b, v8f c) {
    v8f r;
    for (int l = 0; l < 8; l++) r[l] = fmaf(a[l], b[l], c[l]);
    return r;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
__attribute__((target("avx2"))) static inline int lane_bits_avx2(v8i m) {
    return _mm256_movemask_ps((__m256)m);
}
/* maxps(v, m) returns m when v is NaN or both are zeros: exactly vsel(v > m, v, m). */
__attribute__((target("avx2"))) static inline v8f vmax_avx2(v8f v, v8f m) {
    return (v8f)_mm256_max_ps((__m256)v, (__m256)m);
}
/* !(v <= m): above m, or unordered (NaN), in one compare. */
__attribute__((target("avx2"))) static inline v8i vnle_avx2(v8f v, v8f m) {
    return (v8i)_mm256_cmp_ps((__m256)v, (__m256)m, _CMP_NLE_UQ);
}
__attribute__((target("avx2,fma"))) static inline v8f vfma_avx2(v8f a, v8f b, v8f c) {
    return (v8f)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
}
#define LANE_BITS(avx2, m) ((avx2) ? lane_bits_avx2(m) : lane_bits_generic(m))
#define VMAX(avx2, v, m) ((avx2) ? vmax_avx2(v, m) : vsel((v) > (m), v, m))
#define VFMA(avx2, a, b, c) ((avx2) ? vfma_avx2(a, b, c) : vfma_generic(a, b, c))
#define VNLE(avx2, v, m) ((avx2) ? vnle_avx2(v, m) : ~((v) <= (m)))
#else
#define LANE_BITS(avx2, m) lane_bits_generic(m)
#define VMAX(avx2, v, m) vsel((v) > (m), v, m)
#define VFMA(avx2, a, b, c) vfma_generic(a, b, c)
#define VNLE(avx2, v, m) (~((v) <= (m)))
#endif

/* Lane permutes: VSHUF by constant lanes, VPERM by a vector of lane indices (0..7). */
#if defined(__clang__)
#define VSHUF(v, ...) __builtin_shufflevector(v, v, __VA_ARGS__)
INLINE v8f VPERM(v8f v, v8i idx) {
    v8f r;
    for (int l = 0; l < 8; l++) r[l] = v[idx[l]];
    return r;
}
#else
#define VSHUF(v, ...) __builtin_shuffle(v, (v8i){__VA_ARGS__})
#define VPERM(v, idx) __builtin_shuffle(v, idx)
#endif

/* The max of m's lanes in every lane (NaN-free input: the scan's maxima skip NaNs). */
INLINE v8f vallmax(v8f m, int avx2) {
    m = VMAX(avx2, VSHUF(m, 4, 5, 6, 7, 0, 1, 2, 3), m);
    m = VMAX(avx2, VSHUF(m, 2, 3, 0, 1, 6, 7, 4, 5), m);
    return VMAX(avx2, VSHUF(m, 1, 0, 3, 2, 5, 4, 7, 6), m);
}

/* exp(x) for x <= 0, to ~2.5e-7 relative: x = (k / 8) ln 2 + r with |r| <= ln 2 / 16,
 * exp(x) = 2^(k >> 3) * 2^((k & 7) / 8) * e^r, the middle factor from an 8-entry table
 * (one lane permute), e^r a degree-3 polynomial (r^4 / 24 <= 1.5e-7), the power of two
 * added to the table value's exponent. Seven multiply-adds in all, about half of a
 * Cephes-style expf: the exps are most of the cost of a flat row. Below -87 it returns
 * ~exp(-87) (nothing next to a sum >= 1), NaN for NaN. k comes from the rounding
 * constant's bits (t = 1.5 * 2^23 + k), so no float-to-int conversion is needed. */
INLINE v8f vexp(v8f x, int avx2) {
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    const v8f tab = {1.0f, 1.09050773266525766f, 1.18920711500272107f, 1.29683955465100967f,
                     1.41421356237309505f, 1.54221082540794082f, 1.68179283050742908f,
                     1.83400808640934246f}; /* 2^(j / 8) */
    x = VMAX(avx2, vsplat(-87.0f), x); /* this order keeps a NaN */
    v8f t = VFMA(avx2, x, vsplat(11.5415603271117073f), vsplat(magic)); /* 8 / ln 2 */
    v8f kf = t - magic;
    v8f r = VFMA(avx2, kf, vsplat(-0.086669921875f), x); /* ln 2 / 8, high bits: exact */
    r = VFMA(avx2, kf, vsplat(2.65243056e-5f), r);       /* and the rest */
    v8f p = VFMA(avx2, vsplat(1.0f / 6), r, vsplat(0.5f));
    p = VFMA(avx2, p, r, vsplat(1.0f));
    p = VFMA(avx2, p, r, vsplat(1.0f));
    v8i k = (v8i)t - (v8i)vsplat(magic);
    v8f two = VPERM(tab, k & 7);
    return p * (v8f)((v8u)two + ((v8u)(k >> 3) << 23)); /* unsigned: no signed shift */
}

/* ---- the top-k list -------------------------------------------------------------------- */

/* Value desc, ties kept in arrival (= ascending id) order; exactly the insertion of
 * common/logits.c row_topk, so ids match it. */
INLINE void topk_insert(CpuTopkPart *p, int k, float v, int id) {
    if (p->cnt == k && !(v > p->v[k - 1])) return;
    int j = p->cnt < k ? p->cnt++ : k - 1;
    while (j > 0 && v > p->v[j - 1]) {
        p->v[j] = p->v[j - 1];
        p->id[j] = p->id[j - 1];
        j--;
    }
    p->v[j] = v;
    p->id[j] = id;
}

/* The columns of a block (x, nvalid of them) that may enter the list: every column
 * while it fills (-inf and NaN too, as in row_topk), then only the lanes that pass the
 * vector test against *kth (its k-th value) or are NaN, in column order, so ties keep
 * ascending ids. NaN columns are noted. */
INLINE void block_insert(CpuTopkPart *p, int k, const float *x, int nvalid, int id0, v8f *kth,
                         int avx2) {
    for (int j = 0; j < nvalid; j += 8) {
        int bits = p->cnt < k ? 0xff : LANE_BITS(avx2, VNLE(avx2, vload(x + j), *kth));
        while (bits) {
            int l = __builtin_ctz((unsigned)bits);
            bits &= bits - 1;
            if (j + l >= nvalid) break;
            float v = x[j + l];
            p->nan |= v != v;
            if (p->cnt < k || v > p->v[k - 1]) {
                topk_insert(p, k, v, id0 + j + l);
                if (p->cnt == k) *kth = vsplat(p->v[k - 1]);
            }
        }
    }
}

/* ---- one row ------------------------------------------------------------------------ */

typedef struct {
    v8f m;        /* running max, in every lane */
    v8f kth;      /* the list's k-th value once full, -inf before */
    double sd[8]; /* per-lane sums of exp(x - m) */
    float cut;
} RowState;

/* One block of BLOCK columns (x padded with -inf past nvalid) into the row's state and
 * list. */
INLINE void block_reduce(RowState *st, CpuTopkPart *p, int k, const float *x, int nvalid,
                         int id0, int avx2) {
    v8f bm = vsplat(-INFINITY), cv = st->m - st->cut;
    v8i near = {0};
    for (int j = 0; j < BLOCK / 8; j++) {
        v8f v = vload(x + 8 * j);
        bm = VMAX(avx2, v, bm);
        near |= VNLE(avx2, v, cv); /* within cut of the max so far (a superset), or NaN */
    }
    bm = vallmax(bm, avx2); /* NaN-free: VMAX keeps the old value over a NaN */
    /* A column beats the k-th best only if the block's max does. (A NaN column enters
     * nothing once the list is full; it reaches the sum below, which makes lse NaN.) */
    if (p->cnt < k || bm[0] > st->kth[0]) block_insert(p, k, x, nvalid, id0, &st->kth, avx2);
    if (bm[0] > st->m[0]) { /* a new row max: rescale the sums so far (rare) */
        double f = st->m[0] > -INFINITY ? exp((double)st->m[0] - (double)bm[0]) : 0.0;
        for (int l = 0; l < 8; l++) st->sd[l] *= f;
        st->m = bm;
    }
    if (!LANE_BITS(avx2, near)) return; /* most blocks of a peaked row */
    cv = st->m - st->cut;
    int vec = 0;
    for (int j = 0; j < BLOCK / 8; j++) /* the block is in L1 now; NaN passes */
        vec |= (LANE_BITS(avx2, VNLE(avx2, vload(x + 8 * j), cv)) != 0) << j;
    if (!vec) return;
    v8f acc = vsplat(0.0f);
    while (vec) {
        int j = __builtin_ctz((unsigned)vec);
        vec &= vec - 1;
        acc += vexp(vload(x + 8 * j) - st->m, avx2);
    }
    for (int l = 0; l < 8; l++) st->sd[l] += acc[l];
}

/* Columns [c0, c1) of row x (c0 a multiple of BLOCK) into the row's part p, which holds
 * the state of the columns before c0. */
INLINE void row_reduce(const float *x, int c0, int c1, int k, float cut, CpuTopkPart *p,
                       int avx2) {
    RowState st = {.m = vsplat(p->m), .cut = cut};
    st.kth = vsplat(p->cnt == k ? p->v[k - 1] : -INFINITY);
    memcpy(st.sd, p->sd, sizeof st.sd);
    int i = c0;
    for (; i + BLOCK <= c1; i += BLOCK) block_reduce(&st, p, k, x + i, BLOCK, i, avx2);
    if (i < c1) {
        float pad[BLOCK];
        for (int j = 0; j < BLOCK; j++) pad[j] = j < c1 - i ? x[i + j] : -INFINITY;
        block_reduce(&st, p, k, pad, c1 - i, i, avx2);
    }
    p->m = st.m[0];
    memcpy(p->sd, st.sd, sizeof st.sd);
}

/* The same code twice: 8-wide AVX2 + FMA where the CPU has them, SSE pairs otherwise. */
typedef void (*RowFn)(const float *, int, int, int, float, CpuTopkPart *);

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"))) static void row_avx2(const float *x, int c0, int c1, int k,
                                                         float cut, CpuTopkPart *p) {
    row_reduce(x, c0, c1, k, cut, p, 1);
}
#endif

static void row_generic(const float *x, int c0, int c1, int k, float cut, CpuTopkPart *p) {
    row_reduce(x, c0, c1, k, cut, p, 0);
}

/* AVX2 + FMA where the CPU has them: the same bits as the portable row kernel (the tests
 * compare the two through cpu_topk_portable). */
static RowFn row_fn(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return row_avx2;
#endif
    return row_generic;
}

/* ---- rows over threads --------------------------------------------------------------- */

typedef struct {
    const CpuTopkRun *run;
    const float *logits; // (n, ld)
    int ld, c0, c1;
} TopkJob;

/* Whole rows per thread: a row's result never depends on the thread count. */
static void topk_task(void *arg, int tid, int nth) {
    TopkJob *j = arg;
    const CpuTopkRun *run = j->run;
    RowFn fn = (RowFn)run->fn;
    int lo, hi;
    threadpool_share(run->n, tid, nth, &lo, &hi);
    for (int r = lo; r < hi; r++)
        fn(j->logits + (size_t)r * j->ld, j->c0, j->c1, run->k, run->cut, run->parts + r);
}

CpuTopkRun cpu_topk_begin(CpuTopkPart *parts, int n, int vocab, int k) {
    RS_ASSERT(k >= 1 && k <= CPU_TOPK_MAX && k <= vocab && n >= 0);
    for (int r = 0; r < n; r++) {
        memset(&parts[r], 0, sizeof parts[r]);
        parts[r].m = -INFINITY;
    }
    /* e^-cut * vocab = 2^-20: the skipped columns' share of a sum >= 1. */
    CpuTopkRun run = {(void (*)(void))row_fn(), (float)(log((double)vocab) + 20 * log(2.0)),
                      n, vocab, k, parts};
    return run;
}

void cpu_topk_portable(CpuTopkRun *run) { run->fn = (void (*)(void))row_generic; }

void cpu_topk_feed(ThreadPool *pool, const CpuTopkRun *run, const float *logits, int ld,
                   int c0, int c1) {
    RS_ASSERT(c0 % CPU_TOPK_BLOCK == 0 && c0 <= c1 && c1 <= run->vocab && run->vocab <= ld);
    TopkJob j = {run, logits, ld, c0, c1};
    if (pool && run->n > 1) threadpool_run(pool, topk_task, &j);
    else topk_task(&j, 0, 1);
}

void cpu_topk_end(const CpuTopkRun *run, int *ids, float *logq, float *lse) {
    int k = run->k;
    for (int r = 0; r < run->n; r++) {
        const CpuTopkPart *P = run->parts + r;
        const double *sd = P->sd;
        double s = ((sd[0] + sd[1]) + (sd[2] + sd[3])) + ((sd[4] + sd[5]) + (sd[6] + sd[7]));
        float l = P->nan || !isfinite(P->m) ? NAN : (float)((double)P->m + log(s));
        RS_ASSERT(P->cnt == k);
        for (int i = 0; i < k; i++) {
            ids[(size_t)r * k + i] = P->id[i];
            logq[(size_t)r * k + i] = P->v[i] - l;
        }
        lse[r] = l;
    }
}

void cpu_topk(ThreadPool *pool, const float *logits, int n, int vocab, int k, int *ids,
              float *logq, float *lse, CpuTopkPart *scratch) {
    CpuTopkRun run = cpu_topk_begin(scratch, n, vocab, k);
    cpu_topk_feed(pool, &run, logits, vocab, 0, vocab);
    cpu_topk_end(&run, ids, logq, lse);
}
