/* Top-k and log-sum-exp of logits rows on the device (see cuda_topk.h): one block of
 * TOPK_THREADS threads per row, so only n * (2k + 1) numbers leave the GPU instead of the
 * n whole rows. Each thread walks columns t, t + TOPK_THREADS, ... keeping its own top-k
 * (the insertion of common/logits.c row_topk) and an online (max, sum of exp) pair; the
 * threads' partials are then merged pairwise in a fixed tree in shared memory, so the
 * result does not depend on scheduling. The top-k order (value desc, column asc) is total,
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

__global__ void __launch_bounds__(TOPK_THREADS)
k_topk(const float *logits, int vocab, int k, int *ids, float *logq, float *lse) {
    __shared__ float sv[TOPK_THREADS * KMAX];
    __shared__ int si[TOPK_THREADS * KMAX];
    __shared__ int sc[TOPK_THREADS];
    __shared__ float sm[TOPK_THREADS];
    __shared__ double ss[TOPK_THREADS];
    int r = blockIdx.x, t = threadIdx.x;
    const float *row = logits + (size_t)r * vocab;
    float v[KMAX];
    int id[KMAX], cnt = 0;
    float m = -INFINITY;
    double s = 0;
    for (int i = t; i < vocab; i += TOPK_THREADS) {
        float x = row[i];
        topk_insert(v, id, &cnt, k, x, i);
        if (x > m) { /* online: rescale the sum to the new max */
            s = (m == -INFINITY ? 0.0 : s * (double)expf(m - x)) + 1.0;
            m = x;
        } else if (x != -INFINITY) { /* a NaN lands here and poisons s, as in row_lse */
            s += (double)expf(x - m);
        }
    }
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
    if (t == 0) {
        float M = sm[0];
        double S = ss[0];
        float l = isnan(S) || !isfinite(M) ? NAN : (float)((double)M + log(S));
        lse[r] = l;
        for (int j = 0; j < k; j++) {
            ids[(size_t)r * k + j] = si[j];
            logq[(size_t)r * k + j] = sv[j] - l;
        }
    }
}

extern "C" void cuk_topk(cudaStream_t s, const float *logits, int n, int vocab, int k,
                         int *ids, float *logq, float *lse) {
    if (n <= 0) return;
    CUK_KERNEL_LAUNCH(k_topk, dim3(n), dim3(TOPK_THREADS), s, logits, vocab, k, ids, logq, lse);
    CUDA_CHECK(cudaGetLastError());
    cuk_count_launches(1);
}
