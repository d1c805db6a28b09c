/* Fused top-k + log-sum-exp over logits rows on the CPU (see cpu_rows.h). The drafter
 * reduces ten 49152-wide rows per pass; a double-precision exp() per column (the host
 * code this replaces) costs ~0.3 ms a row. Here a chunk is read once, 64 columns at a
 * time: one vector sweep gives a block's max, whether any column beats the chunk's k-th
 * best so far (then a scalar look at the block), and its sum of exp(x - m) against the
 * chunk's max so far. exp is a float polynomial (Cephes expf, ~2 ulp); lane sums are
 * moved into double every block, so the rounding of the sum stays far below the exp's. */
#include "cpu_rows.h"
#include <math.h>
#include <string.h>

/* Every vector helper is inlined: no 32-byte vector crosses a call, whatever the target. */
#pragma GCC diagnostic ignored "-Wpsabi"

#define BLOCK 64 /* columns per block: 8 vectors of 8 */
#define INLINE static inline __attribute__((always_inline))

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint32_t v8u __attribute__((vector_size(32)));

int cpu_rows_chunks(int vocab) { return (vocab + CPU_ROWS_CHUNK - 1) / CPU_ROWS_CHUNK; }

INLINE v8f vload(const float *p) {
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

INLINE v8f vsplat(float f) { return (v8f){f, f, f, f, f, f, f, f}; }

/* m ? a : b, lane by lane (m from a vector comparison: all ones or zero). */
INLINE v8f vsel(v8i m, v8f a, v8f b) { return (v8f)(((v8i)a & m) | ((v8i)b & ~m)); }

/* exp(x) for x <= 0 (Cephes expf: round(x / ln 2) = n, a degree-5 polynomial on the
 * remainder, times 2^n built in the exponent bits); below -87.3 it returns exp(-87.3)
 * (~1e-38, nothing next to a sum >= 1), NaN for NaN. The integer n comes from the rounding
 * constant's bits, unsigned, so no conversion or shift is undefined even for the x > 0 of
 * a block that raised the max (whose sums are thrown away and recomputed). */
INLINE v8f vexp(v8f x) {
    const float lo = -87.33654f, magic = 12582912.0f; /* 1.5 * 2^23 */
    x = vsel(x < vsplat(lo), vsplat(lo), x);
    v8f t = x * 1.44269504088896341f + magic;
    v8f n = t - magic;
    v8f r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    v8f p = vsplat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    v8f y = p * r * r + r + 1.0f;
    v8u e = ((v8u)t - (v8u)vsplat(magic) + 127u) << 23;
    return y * (v8f)e;
}

/* The k-best list: value desc, ties kept in arrival (= ascending id) order; exactly the
 * insertion of common/logits.c row_topk, so ids match it. */
INLINE void topk_insert(CpuRowsPart *p, int k, float v, int id) {
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

/* One block of BLOCK columns (x padded with -inf past nvalid) into the chunk's part and
 * its per-lane double sums sd relative to p->m, in one sweep: exp(x - m) is summed against
 * the chunk's max so far, and recomputed in the rare block that raises it. */
INLINE void block_reduce(CpuRowsPart *p, int k, const float *x, int nvalid, int id0,
                         double *sd) {
    int full = p->cnt == k;
    v8f bm = vsplat(-INFINITY), acc = vsplat(0.0f), mv = vsplat(p->m);
    for (int j = 0; j < BLOCK / 8; j++) {
        v8f v = vload(x + 8 * j);
        bm = vsel(v > bm, v, bm);
        acc += vexp(v - mv);
    }
    float bmax = bm[0];
    for (int j = 1; j < 8; j++)
        if (bm[j] > bmax) bmax = bm[j];
    /* A column beats the k-th best so far iff the block's max does (NaN beats nothing). */
    if (!full || bmax > p->v[k - 1]) { /* rare once the list is full */
        float t = full ? p->v[k - 1] : -INFINITY;
        for (int i = 0; i < nvalid; i++)
            if (!full || x[i] > t) {
                topk_insert(p, k, x[i], id0 + i);
                full = p->cnt == k;
                if (full) t = p->v[k - 1];
            }
    }
    if (bmax > p->m) { /* new chunk max: rescale the sums so far, redo this block's */
        double f = exp((double)p->m - (double)bmax);
        for (int j = 0; j < 8; j++) sd[j] *= f;
        p->m = bmax;
        acc = vsplat(0.0f);
        mv = vsplat(bmax);
        for (int j = 0; j < BLOCK / 8; j++) acc += vexp(vload(x + 8 * j) - mv);
    }
    if (p->m > -INFINITY) {
        for (int j = 0; j < 8; j++) sd[j] += acc[j];
    } else { /* every column so far -inf or NaN: only a NaN must survive */
        for (int i = 0; i < nvalid; i++) p->nan |= x[i] != x[i];
    }
}

/* One chunk (len <= CPU_ROWS_CHUNK columns starting at column id0) into *p. */
INLINE void chunk_body(const float *x, int len, int id0, int k, CpuRowsPart *p) {
    p->m = -INFINITY;
    p->nan = 0;
    p->cnt = 0;
    double sd[8] = {0};
    int i = 0;
    for (; i + BLOCK <= len; i += BLOCK) block_reduce(p, k, x + i, BLOCK, id0 + i, sd);
    if (i < len) {
        float pad[BLOCK];
        for (int j = 0; j < BLOCK; j++) pad[j] = j < len - i ? x[i + j] : -INFINITY;
        block_reduce(p, k, pad, len - i, id0 + i, sd);
    }
    p->s = ((sd[0] + sd[1]) + (sd[2] + sd[3])) + ((sd[4] + sd[5]) + (sd[6] + sd[7]));
}

/* The same code twice: 8-wide AVX2 where the CPU has it, SSE pairs otherwise. */
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) static void chunk_avx2(const float *x, int len, int id0, int k,
                                                       CpuRowsPart *p) {
    chunk_body(x, len, id0, k, p);
}
#endif

static void chunk_generic(const float *x, int len, int id0, int k, CpuRowsPart *p) {
    chunk_body(x, len, id0, k, p);
}

typedef void (*ChunkFn)(const float *, int, int, int, CpuRowsPart *);

static ChunkFn chunk_fn(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) return chunk_avx2;
#endif
    return chunk_generic;
}

typedef struct {
    const float *logits; // (n, vocab)
    int n, vocab, k, nch;
    CpuRowsPart *parts;  // (n, nch)
    ChunkFn fn;
} TopkJob;

/* Work items are (row, chunk) pairs split evenly: the cut never depends on the thread
 * count, only which thread runs an item does. */
static void topk_task(void *arg, int tid, int nth) {
    TopkJob *j = arg;
    int lo, hi;
    threadpool_share(j->n * j->nch, tid, nth, &lo, &hi);
    for (int it = lo; it < hi; it++) {
        int r = it / j->nch, c0 = (it % j->nch) * CPU_ROWS_CHUNK;
        int len = j->vocab - c0 < CPU_ROWS_CHUNK ? j->vocab - c0 : CPU_ROWS_CHUNK;
        j->fn(j->logits + (size_t)r * j->vocab + c0, len, c0, j->k, j->parts + it);
    }
}

/* A row's chunks, in column order, into its top-k and lse. */
static void combine_row(const CpuRowsPart *P, int nch, int k, int *ids, float *logq,
                        float *lse) {
    float M = -INFINITY;
    int nan = 0;
    for (int c = 0; c < nch; c++) {
        if (P[c].m > M) M = P[c].m;
        nan |= P[c].nan;
    }
    double S = 0;
    for (int c = 0; c < nch; c++)
        if (P[c].m > -INFINITY) S += P[c].s * exp((double)P[c].m - (double)M);
    float l = nan || !isfinite(M) ? NAN : (float)((double)M + log(S)); /* S is NaN after a NaN */
    CpuRowsPart all = {.cnt = 0};
    for (int c = 0; c < nch; c++)
        for (int i = 0; i < P[c].cnt; i++) topk_insert(&all, k, P[c].v[i], P[c].id[i]);
    RS_ASSERT(all.cnt == k);
    for (int i = 0; i < k; i++) {
        ids[i] = all.id[i];
        logq[i] = all.v[i] - l;
    }
    *lse = l;
}

void cpu_rows_topk(ThreadPool *pool, const float *logits, int n, int vocab, int k, int *ids,
                   float *logq, float *lse, CpuRowsPart *scratch) {
    RS_ASSERT(k >= 1 && k <= ROWS_TOPK_MAX && k <= vocab && n >= 0);
    TopkJob j = {logits, n, vocab, k, cpu_rows_chunks(vocab), scratch, chunk_fn()};
    if (pool && n * j.nch > 1) threadpool_run(pool, topk_task, &j);
    else topk_task(&j, 0, 1);
    for (int r = 0; r < n; r++)
        combine_row(scratch + (size_t)r * j.nch, j.nch, k, ids + (size_t)r * k,
                    logq + (size_t)r * k, lse + r);
}
