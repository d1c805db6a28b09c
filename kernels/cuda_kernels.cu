/* CUDA kernels of the forward pass; see cuda_kernels.h. Arithmetic follows the CPU
 * reference (kernels/cpu_ops.c) step by step: f32 RMSNorm with the same formula,
 * cos/sin in double of a float angle, f32 softmax, so the two backends differ only by
 * the bf16 weights, the bf16 KV cache and summation order. */
#include "cuda_kernels.h"
extern "C" {
#include "cpu_ops.h" /* rope_inv_freq */
}
#include "common/randmodel.h" /* rs_rand_value: the random-model weights, shared with the CPU */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <string.h>

typedef __nv_bfloat16 bf16;

#define LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

/* The one kernel-launch form of this file. Under nvcc it is exactly the <<<>>> launch;
 * under the CPU emulator (ROOTSPEC_CUEMU, tests/cuemu/) it enqueues the kernel on the
 * emulated stream with the same argument conversions. */
#ifdef ROOTSPEC_CUEMU
#define CUK_LAUNCH(k, grid, block, stream, ...) \
    cuemu_launch(#k, k, (grid), (block), 0, (stream), __VA_ARGS__)
#else
#define CUK_LAUNCH(k, grid, block, stream, ...) k<<<(grid), (block), 0, (stream)>>>(__VA_ARGS__)
#endif

static inline unsigned blocks_for(size_t n, unsigned threads) {
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b > 65535u * 16u ? 65535u * 16u : (b ? b : 1));
}

/* ---- host helpers ---- */

extern "C" void cuk_rope_inv_freq(const Config *c, float *inv_freq) { rope_inv_freq(c, inv_freq); }

extern "C" rs_bf16 cuk_f32_to_bf16_host(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return (rs_bf16)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (rs_bf16)(u >> 16);
}

extern "C" float cuk_bf16_to_f32_host(rs_bf16 h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- conversions and random fill ---- */

__global__ void k_f32_to_bf16(const float *in, bf16 *out, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16_rn(in[i]);
}

extern "C" void cuk_f32_to_bf16(cudaStream_t s, const float *in, rs_bf16 *out, size_t n) {
    if (!n) return;
    CUK_LAUNCH(k_f32_to_bf16, blocks_for(n, 256), 256, s, in, (bf16 *)out, n);
    LAUNCH_CHECK();
}

__global__ void k_fill_bf16(bf16 *out, size_t n, uint64_t seed, float scale, float base) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16_rn(rs_rand_value(seed, i, scale, base));
}

__global__ void k_fill_f32(float *out, size_t n, uint64_t seed, float scale, float base) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = rs_rand_value(seed, i, scale, base);
}

extern "C" void cuk_fill_random_bf16(cudaStream_t s, rs_bf16 *out, size_t n, uint64_t seed,
                                     float scale, float base) {
    if (!n) return;
    CUK_LAUNCH(k_fill_bf16, blocks_for(n, 256), 256, s, (bf16 *)out, n, seed, scale, base);
    LAUNCH_CHECK();
}

extern "C" void cuk_fill_random_f32(cudaStream_t s, float *out, size_t n, uint64_t seed,
                                    float scale, float base) {
    if (!n) return;
    CUK_LAUNCH(k_fill_f32, blocks_for(n, 256), 256, s, out, n, seed, scale, base);
    LAUNCH_CHECK();
}

/* ---- block reductions ---- */

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the total. */
__device__ float block_sum(float v) {
    __shared__ float part[32];
    __shared__ float total;
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); /* part[] may still be read by a previous call */
    if (lane == 0) part[wid] = v;
    __syncthreads();
    if (wid == 0) {
        float t = lane < nw ? part[lane] : 0.0f;
        t = warp_sum(t);
        if (lane == 0) total = t;
    }
    __syncthreads();
    return total;
}

/* ---- embedding, norms, bias ---- */

__global__ void k_embed(const bf16 *emb, const int *tokens, int dim, float *x) {
    int t = blockIdx.x;
    const bf16 *e = emb + (size_t)tokens[t] * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) x[(size_t)t * dim + i] = __bfloat162float(e[i]);
}

extern "C" void cuk_embed(cudaStream_t s, const rs_bf16 *emb, const int *tokens, int nb, int dim,
                          float *x) {
    CUK_LAUNCH(k_embed, nb, 256, s, (const bf16 *)emb, tokens, dim, x);
    LAUNCH_CHECK();
}

__global__ void k_rmsnorm(const float *x, const int *rows, const float *w, int dim, float eps,
                          float *of, bf16 *ob) {
    int r = blockIdx.x;
    const float *xr = x + (size_t)(rows ? rows[r] : r) * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss);
    float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = w[i] * (xr[i] * inv);
        if (of) of[(size_t)r * dim + i] = v;
        if (ob) ob[(size_t)r * dim + i] = __float2bfloat16_rn(v);
    }
}

extern "C" void cuk_rmsnorm(cudaStream_t s, const float *x, const int *rows, const float *w, int nb,
                            int dim, float eps, float *out_f32, rs_bf16 *out_bf16) {
    CUK_LAUNCH(k_rmsnorm, nb, 256, s, x, rows, w, dim, eps, out_f32, (bf16 *)out_bf16);
    LAUNCH_CHECK();
}

/* One warp per (row, head). */
__global__ void k_head_rmsnorm(float *x, int row_stride, int nb, int n_heads, int hd,
                               const float *w, float eps) {
    int gw = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (gw >= nb * n_heads) return;
    float *v = x + (size_t)(gw / n_heads) * row_stride + (size_t)(gw % n_heads) * hd;
    float ss = 0.0f;
    for (int i = lane; i < hd; i += 32) ss += v[i] * v[i];
    ss = warp_sum(ss);
    float inv = 1.0f / sqrtf(ss / (float)hd + eps);
    for (int i = lane; i < hd; i += 32) v[i] = w[i] * (v[i] * inv);
}

extern "C" void cuk_head_rmsnorm(cudaStream_t s, float *x, int row_stride, int nb, int n_heads,
                                 int hd, const float *w, float eps) {
    int warps = nb * n_heads;
    CUK_LAUNCH(k_head_rmsnorm, (warps + 7) / 8, 256, s, x, row_stride, nb, n_heads, hd, w, eps);
    LAUNCH_CHECK();
}

__global__ void k_bias_add(float *x, int row_stride, int width, const float *bias) {
    float *r = x + (size_t)blockIdx.x * row_stride;
    for (int i = threadIdx.x; i < width; i += blockDim.x) r[i] += bias[i];
}

extern "C" void cuk_bias_add(cudaStream_t s, float *x, int row_stride, int nb, int width,
                             const float *bias) {
    CUK_LAUNCH(k_bias_add, nb, 256, s, x, row_stride, width, bias);
    LAUNCH_CHECK();
}

/* ---- RoPE ---- */

__global__ void k_rope_table(const int *pos, const float *inv_freq, int nb, int half, float *ct,
                             float *st) {
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= nb * half) return;
    int t = k / half, i = k % half;
    float ang = (float)pos[t] * inv_freq[i];
    ct[k] = (float)cos((double)ang);
    st[k] = (float)sin((double)ang);
}

extern "C" void cuk_rope_table(cudaStream_t s, const int *pos, const float *inv_freq, int nb,
                               int half, float *cos_t, float *sin_t) {
    int n = nb * half;
    CUK_LAUNCH(k_rope_table, (n + 255) / 256, 256, s, pos, inv_freq, nb, half, cos_t, sin_t);
    LAUNCH_CHECK();
}

__global__ void k_rope(float *x, int row_stride, int n_heads, int hd, const float *ct,
                       const float *st) {
    int t = blockIdx.x, half = hd / 2;
    float *r = x + (size_t)t * row_stride;
    for (int k = threadIdx.x; k < n_heads * half; k += blockDim.x) {
        int h = k / half, i = k % half;
        float *v = r + (size_t)h * hd;
        float c = ct[(size_t)t * half + i], sn = st[(size_t)t * half + i];
        float a = v[i], b = v[i + half];
        v[i] = a * c - b * sn;
        v[i + half] = b * c + a * sn;
    }
}

extern "C" void cuk_rope(cudaStream_t s, float *x, int row_stride, int nb, int n_heads, int hd,
                         const float *cos_t, const float *sin_t) {
    CUK_LAUNCH(k_rope, nb, 256, s, x, row_stride, n_heads, hd, cos_t, sin_t);
    LAUNCH_CHECK();
}

/* ---- KV cache ---- */

__global__ void k_kv_store(const float *k, const float *v, int row_stride, int kv_dim,
                           const CuMeta *meta, bf16 *kc, bf16 *vc) {
    int t = blockIdx.x;
    if (t >= meta->n) return;
    size_t slot = (size_t)(meta->kv_base + t) * kv_dim;
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        kc[slot + i] = __float2bfloat16_rn(k[(size_t)t * row_stride + i]);
        vc[slot + i] = __float2bfloat16_rn(v[(size_t)t * row_stride + i]);
    }
}

extern "C" void cuk_kv_store(cudaStream_t s, const float *k, const float *v, int row_stride, int nb,
                             int kv_dim, const CuMeta *meta, rs_bf16 *kc, rs_bf16 *vc) {
    CUK_LAUNCH(k_kv_store, nb, 256, s, k, v, row_stride, kv_dim, meta, (bf16 *)kc, (bf16 *)vc);
    LAUNCH_CHECK();
}

__global__ void k_kv_gather(const bf16 *cache, int cap, int kv_dim, int nc, const int *keep,
                            int n_keep, bf16 *scratch) {
    int l = blockIdx.y, i = blockIdx.x;
    const bf16 *src = cache + ((size_t)l * cap + nc + keep[i]) * kv_dim;
    bf16 *dst = scratch + ((size_t)l * n_keep + i) * kv_dim;
    for (int d = threadIdx.x; d < kv_dim; d += blockDim.x) dst[d] = src[d];
}

__global__ void k_kv_scatter(bf16 *cache, int cap, int kv_dim, int nc, int n_keep,
                             const bf16 *scratch) {
    int l = blockIdx.y, i = blockIdx.x;
    const bf16 *src = scratch + ((size_t)l * n_keep + i) * kv_dim;
    bf16 *dst = cache + ((size_t)l * cap + nc + i) * kv_dim;
    for (int d = threadIdx.x; d < kv_dim; d += blockDim.x) dst[d] = src[d];
}

extern "C" void cuk_kv_compact(cudaStream_t s, rs_bf16 *cache, int n_layers, int cap, int kv_dim,
                               int n_committed, const int *keep, int n_keep, rs_bf16 *scratch) {
    if (n_keep <= 0) return;
    dim3 grid(n_keep, n_layers);
    CUK_LAUNCH(k_kv_gather, grid, 128, s, (const bf16 *)cache, cap, kv_dim, n_committed, keep,
               n_keep, (bf16 *)scratch);
    LAUNCH_CHECK();
    CUK_LAUNCH(k_kv_scatter, grid, 128, s, (bf16 *)cache, cap, kv_dim, n_committed, n_keep,
               (const bf16 *)scratch);
    LAUNCH_CHECK();
}

/* ---- attention ---- */

#define ATT_WARPS 4

/* One block per (head, query row); each warp runs an online softmax over a strided share
 * of the visible slots with the head vector split across lanes (PER = hd/32 rounded up),
 * then the warps' partial (max, sum, acc) are merged. No score buffer, so the cache
 * length is unbounded by shared memory. */
template <int PER>
__global__ void k_attention(const float *q, int q_stride, const bf16 *kc, const bf16 *vc,
                            const uint8_t *mask, const CuMeta *meta, int n_heads, int n_kv_heads,
                            int hd, float scale, bf16 *ob, float *of) {
    __shared__ float sm_m[ATT_WARPS], sm_l[ATT_WARPS];
    __shared__ float sm_acc[ATT_WARPS][PER * 32];
    int h = blockIdx.x, t = blockIdx.y;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    size_t o_off = (size_t)t * n_heads * hd + (size_t)h * hd;
    int n = meta->n;
    if (t >= n) { /* padding row: defined zeros */
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            if (ob) ob[o_off + d] = __float2bfloat16_rn(0.0f);
            if (of) of[o_off + d] = 0.0f;
        }
        return;
    }
    int kv_dim = n_kv_heads * hd, kvh = h / (n_heads / n_kv_heads);
    int nc = meta->n_committed, n_ctx = meta->kv_base + n;
    const uint8_t *mrow = mask + (size_t)t * meta->mask_stride;
    const float *qh = q + (size_t)t * q_stride + (size_t)h * hd;
    float qr[PER], acc[PER];
#pragma unroll
    for (int k = 0; k < PER; k++) {
        int d = lane + 32 * k;
        qr[k] = d < hd ? qh[d] : 0.0f;
        acc[k] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int j = warp; j < n_ctx; j += ATT_WARPS) {
        if (j >= nc && !mrow[j - nc]) continue;
        const bf16 *kr = kc + (size_t)j * kv_dim + (size_t)kvh * hd;
        float sdot = 0.0f;
#pragma unroll
        for (int k = 0; k < PER; k++) {
            int d = lane + 32 * k;
            if (d < hd) sdot += qr[k] * __bfloat162float(kr[d]);
        }
        sdot = warp_sum(sdot) * scale;
        float mn = fmaxf(m, sdot);
        float c = expf(m - mn); /* m = -inf on the first slot: c = 0 */
        float p = expf(sdot - mn);
        l = l * c + p;
        const bf16 *vr = vc + (size_t)j * kv_dim + (size_t)kvh * hd;
#pragma unroll
        for (int k = 0; k < PER; k++) {
            int d = lane + 32 * k;
            float vv = d < hd ? __bfloat162float(vr[d]) : 0.0f;
            acc[k] = acc[k] * c + p * vv;
        }
        m = mn;
    }
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
#pragma unroll
    for (int k = 0; k < PER; k++) sm_acc[warp][lane + 32 * k] = acc[k];
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm_m[w]);
    float L = 0.0f;
    for (int w = 0; w < ATT_WARPS; w++)
        if (sm_m[w] > -INFINITY) L += sm_l[w] * expf(sm_m[w] - M);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            if (sm_m[w] > -INFINITY) o += sm_acc[w][d] * expf(sm_m[w] - M);
        o = L > 0.0f ? o / L : 0.0f; /* a row that sees nothing: zeros, not NaN */
        if (ob) ob[o_off + d] = __float2bfloat16_rn(o);
        if (of) of[o_off + d] = o;
    }
}

extern "C" void cuk_attention(cudaStream_t s, const float *q, int q_stride, const rs_bf16 *kc,
                              const rs_bf16 *vc, const uint8_t *mask, const CuMeta *meta, int nb,
                              int n_heads, int n_kv_heads, int hd, rs_bf16 *out_bf16,
                              float *out_f32) {
    dim3 grid(n_heads, nb);
    float scale = 1.0f / sqrtf((float)hd);
#define ATT(PER)                                                                           \
    CUK_LAUNCH(k_attention<PER>, grid, ATT_WARPS * 32, s, q, q_stride, (const bf16 *)kc,   \
               (const bf16 *)vc, mask, meta, n_heads, n_kv_heads, hd, scale,                \
               (bf16 *)out_bf16, out_f32)
    if (hd <= 32) ATT(1);
    else if (hd <= 64) ATT(2);
    else if (hd <= 128) ATT(4);
    else if (hd <= 256) ATT(8);
    else {
        fprintf(stderr, "rootspec: head_dim %d > 256 unsupported by cuk_attention\n", hd);
        abort();
    }
#undef ATT
    LAUNCH_CHECK();
}

/* ---- MLP, residual ---- */

__global__ void k_swiglu(const float *gu, int nb, int hidden, bf16 *ob, float *of) {
    size_t n = (size_t)nb * hidden;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x) {
        size_t t = k / hidden, i = k % hidden;
        float g = gu[t * 2 * hidden + i], u = gu[t * 2 * hidden + hidden + i];
        float o = g / (1.0f + expf(-g)) * u;
        if (ob) ob[k] = __float2bfloat16_rn(o);
        if (of) of[k] = o;
    }
}

extern "C" void cuk_swiglu(cudaStream_t s, const float *gu, int nb, int hidden, rs_bf16 *out_bf16,
                           float *out_f32) {
    CUK_LAUNCH(k_swiglu, blocks_for((size_t)nb * hidden, 256), 256, s, gu, nb, hidden,
               (bf16 *)out_bf16, out_f32);
    LAUNCH_CHECK();
}

__global__ void k_residual_add(float *x, const float *y, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}

extern "C" void cuk_residual_add(cudaStream_t s, float *x, const float *y, size_t n) {
    if (!n) return;
    CUK_LAUNCH(k_residual_add, blocks_for(n, 256), 256, s, x, y, n);
    LAUNCH_CHECK();
}

/* ---- argmax and sampling (one block of 1024 threads per row) ---- */

#define SEL_THREADS 1024

/* Block-wide (value, index) max, ties to the lowest index; result in every thread. */
__device__ void block_argmax(float v, int idx, float *out_v, int *out_i) {
    __shared__ float sv[SEL_THREADS];
    __shared__ int si[SEL_THREADS];
    sv[threadIdx.x] = v;
    si[threadIdx.x] = idx;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if (threadIdx.x < o) {
            float v2 = sv[threadIdx.x + o];
            int i2 = si[threadIdx.x + o];
            float v1 = sv[threadIdx.x];
            int i1 = si[threadIdx.x];
            if (i2 >= 0 && (i1 < 0 || v2 > v1 || (v2 == v1 && i2 < i1))) {
                sv[threadIdx.x] = v2;
                si[threadIdx.x] = i2;
            }
        }
        __syncthreads();
    }
    *out_v = sv[0];
    *out_i = si[0];
    __syncthreads();
}

/* Each thread scans a contiguous chunk in order, so within a chunk the first maximum wins,
 * and the block merge prefers lower indices: the global first maximum, as row_argmax. */
__device__ void row_max(const float *row, int n, float *mv, int *mi) {
    int chunk = (n + blockDim.x - 1) / blockDim.x;
    int lo = threadIdx.x * chunk, hi = min(n, lo + chunk);
    float bv = -INFINITY;
    int bi = -1;
    for (int i = lo; i < hi; i++)
        if (bi < 0 || row[i] > bv) {
            bv = row[i];
            bi = i;
        }
    block_argmax(bv, bi, mv, mi);
}

/* Launched with SEL_THREADS (1024) threads: __launch_bounds__ makes ptxas keep the register
 * count within what a 1024-thread block may have, instead of failing at launch. */
__global__ void __launch_bounds__(SEL_THREADS) k_argmax(const float *row, int n, int *out) {
    float mv;
    int mi;
    row_max(row, n, &mv, &mi);
    if (threadIdx.x == 0) *out = mi;
}

extern "C" void cuk_argmax(cudaStream_t s, const float *row, int n, int *out) {
    CUK_LAUNCH(k_argmax, 1, SEL_THREADS, s, row, n, out);
    LAUNCH_CHECK();
}

/* Inverse CDF as row_sample: weights exp(l - max) in double, threshold u * sum; the chunk
 * whose running sum crosses the threshold scans itself in order. If rounding puts the
 * threshold past the end, the last index with a positive weight is returned. */
__global__ void __launch_bounds__(SEL_THREADS) k_sample(const float *row, int n, double u, int *out) {
    __shared__ double csum[SEL_THREADS];
    __shared__ int found;
    float mv;
    int mi;
    row_max(row, n, &mv, &mi);
    double mx = (double)mv;
    int chunk = (n + blockDim.x - 1) / blockDim.x;
    int lo = threadIdx.x * chunk, hi = min(n, lo + chunk);
    double acc = 0.0;
    int last = -1;
    for (int i = lo; i < hi; i++) {
        double p = exp((double)row[i] - mx);
        if (p > 0) last = i;
        acc += p;
    }
    csum[threadIdx.x] = acc;
    if (threadIdx.x == 0) found = -1;
    __syncthreads();
    /* Exclusive prefix of chunk sums: 1024 doubles, done by one thread in order. */
    if (threadIdx.x == 0) {
        double run = 0.0;
        for (int k = 0; k < (int)blockDim.x; k++) {
            double c = csum[k];
            csum[k] = run;
            run += c;
        }
        csum[0] = run; /* slot 0's prefix is 0 by definition; keep the total there */
    }
    __syncthreads();
    double total = csum[0];
    double prefix = threadIdx.x == 0 ? 0.0 : csum[threadIdx.x];
    double thr = u * total;
    if (lo < hi && thr >= prefix && thr < prefix + acc) {
        /* Chunk intervals come from one sequential scan, so exactly one thread is here. */
        double a = prefix;
        int hit = last; /* rounding of a vs prefix + acc: fall back to the chunk's last */
        for (int i = lo; i < hi; i++) {
            a += exp((double)row[i] - mx);
            if (thr < a) {
                hit = i;
                break;
            }
        }
        found = hit;
    }
    __syncthreads();
    int lastmax;
    float dummy;
    block_argmax((float)last, last, &dummy, &lastmax);
    if (threadIdx.x == 0) *out = found >= 0 ? found : lastmax;
}

extern "C" void cuk_sample(cudaStream_t s, const float *row, int n, double u, int *out) {
    CUK_LAUNCH(k_sample, 1, SEL_THREADS, s, row, n, u, out);
    LAUNCH_CHECK();
}
