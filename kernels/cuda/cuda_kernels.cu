/* Norms and elementwise kernels of the forward pass (see cuda_kernels.h), each against its
 * CPU reference in kernels/cpu/cpu_ops.c: embedding (cpu_embed), RMSNorm (cpu_rmsnorm, also
 * per head), bias (cpu_bias_add), RoPE (cpu_rope_table, cpu_rope), the KV cache store and
 * compaction, the q|k|v post-processing of one projection, SwiGLU (cpu_swiglu), the residual
 * add (cpu_residual_add), bf16 conversion and the random-model fill; and the launch counter.
 * Arithmetic follows the CPU reference step by step: f32 RMSNorm with the same formula,
 * cos/sin in double of a float angle, so the two backends differ only by the bf16 weights,
 * the bf16 KV cache and summation order. The other operations have files of their own:
 * cuda_attention.cu, cuda_gemm.cu, cuda_sample.cu, cuda_topk.cu, cuda_rowstats.cu. */
#include "cuda_device.cuh"
extern "C" {
#include "kernels/cpu/cpu_ops.h" /* rope_inv_freq */
}
#include "common/randmodel.h" /* rs_rand_value: the random-model weights, shared with the CPU */

static uint64_t g_launches;

extern "C" uint64_t cuk_launch_count(void) { return __atomic_load_n(&g_launches, __ATOMIC_RELAXED); }
extern "C" void cuk_count_launches(int k) { __atomic_fetch_add(&g_launches, (uint64_t)k, __ATOMIC_RELAXED); }

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

/* ---- block reduction ---- */

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
    size_t slot = kv_row_slot(meta, t) * kv_dim;
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

/* One block per row; warp w takes heads w, w + 8, ... of the q, k and v heads: bias, per-head
 * RMSNorm (q/k), RoPE (q/k) in the order and formulas of the separate kernels above, then
 * k and v of real rows into their cache slots as bf16. */
__global__ void k_qkv_post(float *qkv, int row_stride, int n_heads, int n_kv_heads, int hd,
                           const float *bias, const float *q_norm, const float *k_norm,
                           float eps, const float *ct, const float *st, const CuMeta *meta,
                           bf16 *kc, bf16 *vc) {
    int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int kv_dim = n_kv_heads * hd, live = t < meta->n;
    float *r = qkv + (size_t)t * row_stride;
    size_t slot = live ? kv_row_slot(meta, t) * kv_dim : 0;
    for (int h = warp; h < n_heads + 2 * n_kv_heads; h += nw) {
        float *v = r + (size_t)h * hd;
        int is_q = h < n_heads, is_k = !is_q && h < n_heads + n_kv_heads;
        qkv_head_post(v, h, t, n_heads, n_kv_heads, hd, bias, q_norm, k_norm, eps, ct, st, lane);
        if (!live || is_q) continue;
        bf16 *dst = (is_k ? kc : vc) + slot + (size_t)(h - n_heads - (is_k ? 0 : n_kv_heads)) * hd;
        for (int i = lane; i < hd; i += 32) dst[i] = __float2bfloat16_rn(v[i]);
    }
}

extern "C" void cuk_qkv_post(cudaStream_t s, float *qkv, int row_stride, int nb, int n_heads,
                             int n_kv_heads, int hd, const float *bias, const float *q_norm,
                             const float *k_norm, float eps, const float *cos_t,
                             const float *sin_t, const CuMeta *meta, rs_bf16 *kc, rs_bf16 *vc) {
    CUK_LAUNCH(k_qkv_post, nb, 256, s, qkv, row_stride, n_heads, n_kv_heads, hd, bias, q_norm,
               k_norm, eps, cos_t, sin_t, meta, (bf16 *)kc, (bf16 *)vc);
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

__global__ void k_kv_gather_slots(const bf16 *cache, int cap, int kv_dim, const int *from, int n,
                                  bf16 *scratch) {
    int l = blockIdx.y, i = blockIdx.x;
    const bf16 *src = cache + ((size_t)l * cap + from[i]) * kv_dim;
    bf16 *dst = scratch + ((size_t)l * n + i) * kv_dim;
    for (int d = threadIdx.x; d < kv_dim; d += blockDim.x) dst[d] = src[d];
}

__global__ void k_kv_scatter_slots(bf16 *cache, int cap, int kv_dim, const int *to, int n,
                                   const bf16 *scratch) {
    int l = blockIdx.y, i = blockIdx.x;
    const bf16 *src = scratch + ((size_t)l * n + i) * kv_dim;
    bf16 *dst = cache + ((size_t)l * cap + to[i]) * kv_dim;
    for (int d = threadIdx.x; d < kv_dim; d += blockDim.x) dst[d] = src[d];
}

extern "C" void cuk_kv_move(cudaStream_t s, rs_bf16 *cache, int n_layers, int cap, int kv_dim,
                            const int *from, const int *to, int n, rs_bf16 *scratch) {
    if (n <= 0) return;
    dim3 grid(n, n_layers);
    CUK_LAUNCH(k_kv_gather_slots, grid, 128, s, (const bf16 *)cache, cap, kv_dim, from, n,
               (bf16 *)scratch);
    LAUNCH_CHECK();
    CUK_LAUNCH(k_kv_scatter_slots, grid, 128, s, (bf16 *)cache, cap, kv_dim, to, n,
               (const bf16 *)scratch);
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
