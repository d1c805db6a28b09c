/* Top-k and log-sum-exp of logits rows on the device (see cuda_topk.h): blocks of
 * TOPK_THREADS threads, each over one chunk of a row's columns (a chunk per TOPK_COLS
 * columns, at most TOPK_CHUNKS, so a 128k vocabulary keeps 16 blocks per row streaming
 * instead of one), so only n * (2k + 1) numbers leave the GPU instead of the n whole rows.
 * Each thread walks its chunk's columns t, t + TOPK_THREADS, ... keeping its own top-k (the
 * insertion of common/logits.c row_topk) and an online (max, sum of exp) pair; the threads'
 * partials are merged pairwise in a fixed tree in shared memory, and the last of a row's
 * blocks to finish (a self-resetting counter per row) merges the chunks' lists and pairs
 * in chunk order, so the result does not depend on scheduling. The top-k order (value desc, column asc) is total,
 * so the ids equal the CPU's exactly; the sum runs in a different order and with expf, so
 * lse agrees with the CPU to ~1e-6 relative (tests/cuda/test_cuda_topk.c). */
#include "cuda_topk.h"
#include "cuda_kernels.h"
extern "C" {
#include "kernels/backend.h" /* BACKEND_TOPK_MAX */
}
#include <cuda_runtime.h>
#include <math.h>

#define TOPK_THREADS 128
#define KMAX BACKEND_TOPK_MAX
#define TOPK_COLS 4096  /* columns per chunk, rounded up */
#define TOPK_CHUNKS 16  /* at most, per row */

/* One chunk's result, left for the row's last block (272 bytes: rows of parts stay
 * 16-byte aligned). */
typedef struct {
    float v[KMAX];
    int id[KMAX];
    int cnt;
    float m;
    double s;
} TopkPart;

static int topk_chunks(int vocab) {
    int c = (vocab + TOPK_COLS - 1) / TOPK_COLS;
    return c < 1 ? 1 : c > TOPK_CHUNKS ? TOPK_CHUNKS : c;
}

/* The k-best list of one thread: value desc, ties kept in arrival (= ascending id) order. */
__device__ static void topk_insert(float *v, int *id, int *cnt, int k, float x, int i) {
    if (*cnt == k && !(x > v[k - 1])) return;
    int j = *cnt < k ? (*cnt)++ : k - 1;
    while (j > 0 && x > v[j - 1]) {
        v[j] = v[j - 1];
        id[j] = id[j - 1];
        j--;
    }
    v[j] = x;
    id[j] = i;
}

/* Lists a (slot ta) and b (slot tb) merged into slot ta, keeping the best k. */
__device__ static void merge_lists(float *sv, int *si, int *sc, int ta, int tb, int k) {
    float ov[KMAX];
    int oi[KMAX];
    const float *va = sv + ta * KMAX, *vb = sv + tb * KMAX;
    const int *ia = si + ta * KMAX, *ib = si + tb * KMAX;
    int a = 0, b = 0, n = 0, ca = sc[ta], cb = sc[tb];
    while (n < k && (a < ca || b < cb)) {
        int take_a = b >= cb || (a < ca && (va[a] > vb[b] || (va[a] == vb[b] && ia[a] < ib[b])));
        ov[n] = take_a ? va[a] : vb[b];
        oi[n++] = take_a ? ia[a++] : ib[b++];
    }
    for (int j = 0; j < n; j++) {
        sv[ta * KMAX + j] = ov[j];
        si[ta * KMAX + j] = oi[j];
    }
    sc[ta] = n;
}

/* (m, s) pairs with s = sum exp(x - m); m = -inf means no finite column (s = 0). */
__device__ static void merge_lse(float *sm, double *ss, int ta, int tb) {
    float ma = sm[ta], mb = sm[tb], M = ma > mb ? ma : mb;
    double s = 0;
    if (ma != -INFINITY) s += ss[ta] * exp((double)ma - (double)M);
    if (mb != -INFINITY) s += ss[tb] * exp((double)mb - (double)M);
    if (isnan(ss[ta]) || isnan(ss[tb])) s = NAN;
    sm[ta] = M;
    ss[ta] = s;
}

/* Row r's results from the merged list and pair in slot 0 (thread 0). */
__device__ static void topk_finish(const float *sv, const int *si, const float *sm,
                                   const double *ss, int r, int k, int *ids, float *logq,
                                   float *lse) {
    float M = sm[0];
    double S = ss[0];
    float l = isnan(S) || !isfinite(M) ? NAN : (float)((double)M + log(S));
    lse[r] = l;
    for (int j = 0; j < k; j++) {
        ids[(size_t)r * k + j] = si[j];
        logq[(size_t)r * k + j] = sv[j] - l;
    }
}

/* Chunk c's part into slot `slot` of the shared lists (read through L2: written by other
 * blocks of this launch). */
__device__ static void topk_load_part(const volatile TopkPart *p, float *sv, int *si, int *sc,
                                      float *sm, double *ss, int slot) {
    sc[slot] = p->cnt;
    for (int j = 0; j < sc[slot]; j++) {
        sv[slot * KMAX + j] = p->v[j];
        si[slot * KMAX + j] = p->id[j];
    }
    sm[slot] = p->m;
    ss[slot] = p->s;
}

/* The last of row r's blocks: the chunks' parts merged in chunk order, the results
 * written, the counter reset for the next launch (thread 0). */
__device__ static void topk_merge_chunks(const TopkPart *parts, int chunks, int r, int k,
                                         float *sv, int *si, int *sc, float *sm, double *ss,
                                         int *ids, float *logq, float *lse) {
    const volatile TopkPart *p = parts;
    topk_load_part(p, sv, si, sc, sm, ss, 0);
    for (int c = 1; c < chunks; c++) {
        topk_load_part(p + c, sv, si, sc, sm, ss, 1);
        merge_lists(sv, si, sc, 0, 1, k);
        merge_lse(sm, ss, 0, 1);
    }
    topk_finish(sv, si, sm, ss, r, k, ids, logq, lse);
}

__global__ void __launch_bounds__(TOPK_THREADS)
k_topk(const float *logits, int vocab, int k, int chunks, char *scratch, int *ids, float *logq,
       float *lse) {
    __shared__ float sv[TOPK_THREADS * KMAX];
    __shared__ int si[TOPK_THREADS * KMAX];
    __shared__ int sc[TOPK_THREADS];
    __shared__ float sm[TOPK_THREADS];
    __shared__ double ss[TOPK_THREADS];
    __shared__ int last;
    int c = blockIdx.x, r = blockIdx.y, t = threadIdx.x;
    int per = (vocab + chunks - 1) / chunks, c0 = c * per, c1 = min(vocab, c0 + per);
    /* row r's scratch: its counter, then its chunks' parts (topk_row_bytes) */
    char *rs = scratch + (size_t)r * (16 + (size_t)chunks * sizeof(TopkPart));
    unsigned *done = (unsigned *)rs;
    TopkPart *parts = (TopkPart *)(rs + 16);
    const float *row = logits + (size_t)r * vocab;
    float v[KMAX];
    int id[KMAX], cnt = 0;
    float m = -INFINITY;
    double s = 0;
    int nan_seen = 0; /* a NaN poisons the sum, as in row_lse, even before a finite max */
    for (int i = c0 + t; i < c1; i += TOPK_THREADS) {
        float x = row[i];
        topk_insert(v, id, &cnt, k, x, i);
        if (x > m) { /* online: rescale the sum to the new max */
            s = (m == -INFINITY ? 0.0 : s * (double)expf(m - x)) + 1.0;
            m = x;
        } else if (x != -INFINITY) {
            nan_seen |= x != x;
            s += (double)expf(x - m);
        }
    }
    if (nan_seen) s = NAN;
    for (int j = 0; j < cnt; j++) {
        sv[t * KMAX + j] = v[j];
        si[t * KMAX + j] = id[j];
    }
    sc[t] = cnt;
    sm[t] = m;
    ss[t] = s;
    for (int stride = TOPK_THREADS / 2; stride > 0; stride /= 2) {
        __syncthreads();
        if (t < stride) {
            merge_lists(sv, si, sc, t, t + stride, k);
            merge_lse(sm, ss, t, t + stride);
        }
    }
    __syncthreads();
    if (chunks == 1) {
        if (t == 0) topk_finish(sv, si, sm, ss, r, k, ids, logq, lse);
        return;
    }
    if (t == 0) { /* publish this chunk, then count it in (the threadFenceReduction pattern) */
        TopkPart *p = parts + c;
        p->cnt = sc[0];
        for (int j = 0; j < sc[0]; j++) p->v[j] = sv[j], p->id[j] = si[j];
        p->m = sm[0];
        p->s = ss[0];
        __threadfence();
        last = atomicAdd(done, 1u) == (unsigned)chunks - 1;
    }
    __syncthreads();
    if (!last || t != 0) return;
    __threadfence();
    topk_merge_chunks(parts, chunks, r, k, sv, si, sc, sm, ss, ids, logq, lse);
    *done = 0; /* every chunk has counted: ready for the next launch */
}

extern "C" size_t cuk_topk_scratch_bytes(int n, int vocab) {
    return (size_t)n * (16 + (size_t)topk_chunks(vocab) * sizeof(TopkPart));
}

extern "C" void cuk_topk(cudaStream_t s, const float *logits, int n, int vocab, int k,
                         void *scratch, int *ids, float *logq, float *lse) {
    if (n <= 0) return;
    int chunks = topk_chunks(vocab);
    CUK_KERNEL_LAUNCH(k_topk, dim3(chunks, n), dim3(TOPK_THREADS), s, logits, vocab, k, chunks,
                      (char *)scratch, ids, logq, lse);
    CUDA_CHECK(cudaGetLastError());
    cuk_count_launches(1);
}
