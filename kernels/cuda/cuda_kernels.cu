/* CUDA kernels of the forward pass; see cuda_kernels.h. Arithmetic follows the CPU
 * reference (kernels/cpu/cpu_ops.c) step by step: f32 RMSNorm with the same formula,
 * cos/sin in double of a float angle, f32 softmax, so the two backends differ only by
 * the bf16 weights, the bf16 KV cache and summation order. */
#include "cuda_kernels.h"
extern "C" {
#include "kernels/cpu/cpu_ops.h" /* rope_inv_freq */
}
#include "common/randmodel.h" /* rs_rand_value: the random-model weights, shared with the CPU */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <string.h>

typedef __nv_bfloat16 bf16;

#define LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

/* Every launch is counted (host side, when enqueued or captured): launches per layer are
 * asserted by the tests and reported by tools/gpu-check.sh. */
static uint64_t g_launches;
#define CUK_LAUNCH(...) \
    (__atomic_fetch_add(&g_launches, 1, __ATOMIC_RELAXED), CUK_KERNEL_LAUNCH(__VA_ARGS__))

extern "C" uint64_t cuk_launch_count(void) { return __atomic_load_n(&g_launches, __ATOMIC_RELAXED); }
extern "C" void cuk_count_launches(int k) { __atomic_fetch_add(&g_launches, (uint64_t)k, __ATOMIC_RELAXED); }

#ifdef ROOTSPEC_CUEMU
/* The emulator's warp barrier is a shuffle (every lane must arrive). */
#define __syncwarp() ((void)__shfl_xor_sync(0xffffffffu, 0, 1))
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

/* One warp's post-projection work on head h of token t's q|k|v row (v: that head's hd
 * floats): bias, per-head RMSNorm (q/k), RoPE (q/k), in the order and formulas of the
 * separate kernels above. k_qkv_post and k_qkv_fused both call it, so the two are bitwise
 * equal. Leaves the warp synchronised. */
__device__ __forceinline__ void qkv_head_post(float *v, int h, int t, int n_heads,
                                              int n_kv_heads, int hd, const float *bias,
                                              const float *q_norm, const float *k_norm,
                                              float eps, const float *ct, const float *st,
                                              int lane) {
    int half = hd / 2, is_q = h < n_heads, is_k = !is_q && h < n_heads + n_kv_heads;
    if (bias)
        for (int i = lane; i < hd; i += 32) v[i] += bias[(size_t)h * hd + i];
    const float *w = is_q ? q_norm : is_k ? k_norm : NULL;
    if (w) {
        __syncwarp();
        float ss = 0.0f;
        for (int i = lane; i < hd; i += 32) ss += v[i] * v[i];
        ss = warp_sum(ss);
        float inv = 1.0f / sqrtf(ss / (float)hd + eps);
        for (int i = lane; i < hd; i += 32) v[i] = w[i] * (v[i] * inv);
    }
    __syncwarp();
    if (is_q || is_k)
        for (int i = lane; i < half; i += 32) {
            float c = ct[(size_t)t * half + i], sn = st[(size_t)t * half + i];
            float a = v[i], b = v[i + half];
            v[i] = a * c - b * sn;
            v[i + half] = b * c + a * sn;
        }
    __syncwarp();
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
    size_t slot = (size_t)(meta->kv_base + t) * kv_dim;
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

/* ---- attention ---- */

/* Tiled split-KV attention (flash-decoding). A block owns one KV head, a tile of query
 * rows times that head's GQA group (up to ATT_QV query vectors, their q in shared memory)
 * and one split of the cache slots, so each key and value row it reads serves every query
 * vector of the tile: a one-row decode spreads the cache over many splits, a tree pass
 * reads the committed prefix once per row tile instead of once per (head, row). K and V
 * rows are read 8 bf16 (16 bytes) at a time. Per slot tile of ATT_C slots: warp w scores
 * query vectors w, w + 4, ... against one slot per lane, an online softmax per query
 * vector, then the output items (query vector, 8 dims) accumulate p * v. Splits leave
 * (max, sum, acc) partials; the last of a tile's split blocks to finish (a counter per tile
 * in the scratch) merges them in split order, so the combine costs no second launch; with
 * one split the block writes the output itself.
 *
 * Every per-query-vector quantity is computed in an order fixed by the slot's absolute
 * position and the split bounds alone (never by which other rows share the block), so a
 * row's output depends on the batch only through the split bounds: fixed bounds
 * (AttGeom.chunk > 0) make the kernel batch-invariant. */
#define ATT_C 32       /* slots per tile: one per lane */
#define ATT_THREADS 128
#define ATT_WARPS (ATT_THREADS / 32)
#define ATT_QV 64      /* query vectors per block */
#define ATT_QF 4096    /* floats of q per block: query vectors * head_dim */
#define ATT_IT (ATT_QF / 8 / ATT_THREADS) /* output items per thread */
#define ATT_QW (ATT_QV / ATT_WARPS)       /* query vectors per warp */
#define ATT_MAX_SPLITS 32
#define ATT_BI_CHUNK 256 /* slots per split in batch-invariant mode */

typedef struct {
    int rows_pb, heads_pb, n_hgroups, splits, chunk; /* chunk 0: derived from the context */
} AttGeom;

/* 16 bytes at p (16-byte aligned): ld16g through the read-only data path (global memory
 * that no thread of the launch writes), ld16 from any memory space (shared included). */
__device__ __forceinline__ uint4 ld16g(const bf16 *p) {
    uint4 u;
#ifdef ROOTSPEC_CUEMU
    CUEMU_ASSERT_ALIGNED(p, 16, "ld16g");
    memcpy(&u, p, 16);
#else
    u = __ldg(reinterpret_cast<const uint4 *>(p));
#endif
    return u;
}

__device__ __forceinline__ uint4 ld16(const bf16 *p) {
    uint4 u;
#ifdef ROOTSPEC_CUEMU
    CUEMU_ASSERT_ALIGNED(p, 16, "ld16");
    memcpy(&u, p, 16);
#else
    u = *reinterpret_cast<const uint4 *>(p);
#endif
    return u;
}

/* The 8 bf16 of u as floats. */
__device__ __forceinline__ void unpack8(uint4 u, float *f) {
    uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint32_t lo = w[i] << 16, hi = w[i] & 0xffff0000u;
#ifdef ROOTSPEC_CUEMU
        memcpy(&f[2 * i], &lo, 4);
        memcpy(&f[2 * i + 1], &hi, 4);
#else
        f[2 * i] = __uint_as_float(lo);
        f[2 * i + 1] = __uint_as_float(hi);
#endif
    }
}

/* 8 bf16 at p (16-byte aligned, read-only global) as floats: one 16-byte load. */
__device__ __forceinline__ void ld8(const bf16 *p, float *f) { unpack8(ld16g(p), f); }

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ int mask_bit(const uint64_t *mask, int words, int row, int col) {
    return (int)(mask[(size_t)row * words + (col >> 6)] >> (col & 63)) & 1;
}

/* Block coordinates of k_attention: the tile's rows, heads and slot range. */
typedef struct {
    int r0, nr, h0, nhb, nq, lo, hi, nc, words;
} AttTile;

__device__ AttTile att_tile(const CuMeta *meta, int n_heads, int n_kv_heads, AttGeom g) {
    AttTile t;
    int G = n_heads / n_kv_heads, kvh = blockIdx.y / g.n_hgroups, hg = blockIdx.y % g.n_hgroups;
    int n = meta->n, n_ctx = meta->kv_base + n;
    t.r0 = blockIdx.z * g.rows_pb;
    t.nr = max(0, min(g.rows_pb, n - t.r0));
    t.h0 = kvh * G + hg * g.heads_pb;
    t.nhb = min(g.heads_pb, G - hg * g.heads_pb);
    t.nq = t.nr * t.nhb;
    int chunk = g.chunk;
    if (!chunk) chunk = ((n_ctx + g.splits - 1) / g.splits + ATT_C - 1) / ATT_C * ATT_C;
    t.lo = blockIdx.x * chunk;
    t.hi = min(t.lo + chunk, n_ctx);
    t.nc = meta->n_committed;
    t.words = (meta->mask_stride + 63) >> 6;
    return t;
}

/* Scores of slot tile t0 for this warp's query vectors, online-softmax state update;
 * leaves p in p_sh and each vector's rescale factor in a_sh. */
__device__ void att_scores(const AttTile &T, int t0, const float *q_sh, const bf16 *kc,
                           int kv_dim, int kvh, int hd, float scale, const uint64_t *mask,
                           float (*p_sh)[ATT_C], float *m_sh, float *l_sh, float *a_sh) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, j = t0 + lane;
    float s[ATT_QW];
#pragma unroll
    for (int k = 0; k < ATT_QW; k++) s[k] = 0.0f;
    if (j < T.hi) {
        const bf16 *kr = kc + (size_t)j * kv_dim + (size_t)kvh * hd;
        for (int d8 = 0; d8 < hd; d8 += 8) {
            float kf[8];
            ld8(kr + d8, kf);
#pragma unroll
            for (int k = 0; k < ATT_QW; k++) {
                int qv = warp + ATT_WARPS * k;
                if (qv >= T.nq) break;
                const float *qq = q_sh + qv * hd + d8;
                float a = s[k];
#pragma unroll
                for (int e = 0; e < 8; e++) a += qq[e] * kf[e];
                s[k] = a;
            }
        }
    }
#pragma unroll
    for (int k = 0; k < ATT_QW; k++) {
        int qv = warp + ATT_WARPS * k;
        if (qv >= T.nq) break; /* warp-uniform */
        int row = T.r0 + qv / T.nhb;
        int vis = j < T.hi && (j < T.nc || mask_bit(mask, T.words, row, j - T.nc));
        float sc = vis ? s[k] * scale : -INFINITY;
        float tm = warp_max(sc), m_old = m_sh[qv];
        float mn = fmaxf(m_old, tm);
        float alpha = tm == -INFINITY ? 1.0f : expf(m_old - mn); /* m_old = -inf: 0 */
        float p = vis ? expf(sc - mn) : 0.0f;
        float ps = warp_sum(p);
        p_sh[qv][lane] = p;
        /* every lane has read m_sh[qv] above; lane 0 writes it: an explicit warp barrier
         * between, since the shuffles alone do not order shared memory for the tools */
        __syncwarp();
        if (lane == 0) {
            a_sh[qv] = alpha;
            if (tm != -INFINITY) {
                l_sh[qv] = l_sh[qv] * alpha + ps;
                m_sh[qv] = mn;
            }
        }
    }
}

/* acc (ATT_IT items of 8 dims) *= alpha, += p * v over the slot tile at t0. */
__device__ void att_values(const AttTile &T, int t0, const bf16 *vc, int kv_dim, int kvh,
                           int hd, float (*p_sh)[ATT_C], const float *a_sh,
                           float (*acc)[8]) {
    int per = hd / 8;
#pragma unroll
    for (int k = 0; k < ATT_IT; k++) {
        int it = threadIdx.x + ATT_THREADS * k, qv = it / per, d8 = (it % per) * 8;
        if (qv >= T.nq) break;
        float al = a_sh[qv];
#pragma unroll
        for (int e = 0; e < 8; e++) acc[k][e] *= al;
        int nt = min(ATT_C, T.hi - t0);
        for (int jj = 0; jj < nt; jj++) {
            float p = p_sh[qv][jj];
            if (p == 0.0f) continue; /* masked: never read (a stale slot may hold NaN) */
            float vf[8];
            ld8(vc + (size_t)(t0 + jj) * kv_dim + (size_t)kvh * hd + d8, vf);
#pragma unroll
            for (int e = 0; e < 8; e++) acc[k][e] += p * vf[e];
        }
    }
}

/* Output of one block: partials, or with one split the normalised rows (zeros for padding
 * rows of the tile). */
__device__ void att_write(const AttTile &T, AttGeom g, int nb, int n_heads, int hd,
                          const float *m_sh, const float *l_sh, float (*acc)[8], float *part,
                          bf16 *ob, float *of) {
    int per = hd / 8, qd = n_heads * hd;
    size_t part_rows = (size_t)nb * n_heads;
    for (int k = 0; k < ATT_IT; k++) {
        int it = threadIdx.x + ATT_THREADS * k, qv = it / per, d8 = (it % per) * 8;
        int r = qv / T.nhb, hh = qv % T.nhb;
        if (r >= g.rows_pb || T.r0 + r >= nb) break;
        int row = T.r0 + r, h = T.h0 + hh;
        int real = qv < T.nq;
        if (g.splits > 1) {
            if (!real) break; /* the combine writes padding rows */
            size_t pr = (size_t)blockIdx.x * part_rows + (size_t)row * n_heads + h;
            if (d8 == 0) {
                part[2 * pr] = m_sh[qv];
                part[2 * pr + 1] = l_sh[qv];
            }
            float *pa = part + 2 * part_rows * g.splits + pr * hd + d8;
            for (int e = 0; e < 8; e++) pa[e] = acc[k][e];
            continue;
        }
        float l = real ? l_sh[qv] : 0.0f;
        for (int e = 0; e < 8; e++) {
            float o = l > 0.0f ? acc[k][e] / l : 0.0f; /* sees nothing: zeros, not NaN */
            size_t off = (size_t)row * qd + (size_t)h * hd + d8 + e;
            if (ob) ob[off] = __float2bfloat16_rn(o);
            if (of) of[off] = o;
        }
    }
}

/* A partial written by another block of this launch: read through L2 (not a stale L1 line). */
__device__ __forceinline__ float ld_part(const float *p) {
#ifdef ROOTSPEC_CUEMU
    return *p;
#else
    return __ldcg(p);
#endif
}

/* Merge of a tile's split partials by the tile's last block, in split order with the
 * formulas of a separate combine pass: per query vector M = max m_s, L = sum l_s e^(m_s-M),
 * out = sum acc_s e^(m_s-M) / L (zeros for padding rows and rows that see nothing). */
__device__ void att_combine_tile(const AttTile &T, AttGeom g, int nb, int n_heads, int hd,
                                 const float *part, float *m_sh, float *l_sh, bf16 *ob,
                                 float *of) {
    size_t part_rows = (size_t)nb * n_heads;
    const float *pa = part + 2 * part_rows * g.splits;
    for (int qv = threadIdx.x; qv < T.nq; qv += ATT_THREADS) {
        size_t pr = (size_t)(T.r0 + qv / T.nhb) * n_heads + T.h0 + qv % T.nhb;
        float M = -INFINITY, L = 0.0f;
        for (int s = 0; s < g.splits; s++) M = fmaxf(M, ld_part(part + 2 * (s * part_rows + pr)));
        for (int s = 0; s < g.splits; s++) {
            float m = ld_part(part + 2 * (s * part_rows + pr));
            if (m > -INFINITY) L += ld_part(part + 2 * (s * part_rows + pr) + 1) * expf(m - M);
        }
        m_sh[qv] = M;
        l_sh[qv] = L;
    }
    __syncthreads();
    int nr = min(g.rows_pb, nb - T.r0), qd = n_heads * hd;
    for (int i = threadIdx.x; i < nr * T.nhb * hd; i += ATT_THREADS) {
        int qv = i / hd, d = i % hd, row = T.r0 + qv / T.nhb, h = T.h0 + qv % T.nhb;
        size_t pr = (size_t)row * n_heads + h;
        float o = 0.0f, L = qv < T.nq ? l_sh[qv] : 0.0f;
        for (int s = 0; qv < T.nq && s < g.splits; s++) {
            float m = ld_part(part + 2 * (s * part_rows + pr));
            if (m > -INFINITY) o += ld_part(pa + (s * part_rows + pr) * hd + d) * expf(m - m_sh[qv]);
        }
        o = L > 0.0f ? o / L : 0.0f;
        size_t off = (size_t)row * qd + (size_t)h * hd + d;
        if (ob) ob[off] = __float2bfloat16_rn(o);
        if (of) of[off] = o;
    }
}

__global__ void __launch_bounds__(ATT_THREADS)
k_attention(const float *q, int q_stride, const bf16 *kc, const bf16 *vc, const uint64_t *mask,
            const CuMeta *meta, int nb, int n_heads, int n_kv_heads, int hd, float scale,
            AttGeom g, float *part, unsigned *tile_cnt, bf16 *ob, float *of) {
    __shared__ float q_sh[ATT_QF];
    __shared__ int last;
    __shared__ float p_sh[ATT_QV][ATT_C];
    __shared__ float m_sh[ATT_QV], l_sh[ATT_QV], a_sh[ATT_QV];
    AttTile T = att_tile(meta, n_heads, n_kv_heads, g);
    int kvh = blockIdx.y / g.n_hgroups, kv_dim = n_kv_heads * hd;
    for (int i = threadIdx.x; i < T.nq * hd; i += ATT_THREADS) {
        int qv = i / hd, d = i % hd;
        q_sh[i] = q[(size_t)(T.r0 + qv / T.nhb) * q_stride + (size_t)(T.h0 + qv % T.nhb) * hd + d];
    }
    for (int i = threadIdx.x; i < ATT_QV; i += ATT_THREADS) {
        m_sh[i] = -INFINITY;
        l_sh[i] = 0.0f;
    }
    float acc[ATT_IT][8];
#pragma unroll
    for (int k = 0; k < ATT_IT; k++)
#pragma unroll
        for (int e = 0; e < 8; e++) acc[k][e] = 0.0f;
    __syncthreads();
    for (int t0 = T.lo; t0 < T.hi && T.nq > 0; t0 += ATT_C) {
        att_scores(T, t0, q_sh, kc, kv_dim, kvh, hd, scale, mask, p_sh, m_sh, l_sh, a_sh);
        __syncthreads();
        att_values(T, t0, vc, kv_dim, kvh, hd, p_sh, a_sh, acc);
        __syncthreads();
    }
    att_write(T, g, nb, n_heads, hd, m_sh, l_sh, acc, part, ob, of);
    if (g.splits == 1) return;
    /* Publish the partials, then count this split in; the block that completes the count
     * sees every split's partials and merges them (the threadFenceReduction pattern). */
    __threadfence();
    __syncthreads();
    unsigned *cnt = tile_cnt + (size_t)blockIdx.z * gridDim.y + blockIdx.y;
    if (threadIdx.x == 0) last = atomicAdd(cnt, 1u) == (unsigned)g.splits - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    att_combine_tile(T, g, nb, n_heads, hd, part, m_sh, l_sh, ob, of);
    if (threadIdx.x == 0) *cnt = 0; /* ready for the next launch (graph replays included) */
}

static AttGeom att_geom(int nb, int n_heads, int n_kv_heads, int hd, int cap, int batch_inv) {
    AttGeom g;
    int G = n_heads / n_kv_heads;
    g.heads_pb = min(G, min(ATT_QV, ATT_QF / hd));
    g.n_hgroups = (G + g.heads_pb - 1) / g.heads_pb;
    g.rows_pb = max(1, min(nb, min(ATT_QV / g.heads_pb, ATT_QF / (g.heads_pb * hd))));
    int tiles = (nb + g.rows_pb - 1) / g.rows_pb;
    if (batch_inv) { /* bounds fixed by slot position alone */
        g.chunk = ATT_BI_CHUNK;
        g.splits = max(1, (cap + ATT_BI_CHUNK - 1) / ATT_BI_CHUNK);
    } else { /* about two blocks per SM of a large GPU */
        g.chunk = 0;
        g.splits = max(1, min(ATT_MAX_SPLITS, 264 / (n_kv_heads * g.n_hgroups * tiles)));
    }
    return g;
}

extern "C" size_t cuk_attention_scratch_floats(int nb, int n_heads, int hd, int cap) {
    int splits = max(ATT_MAX_SPLITS, (cap + ATT_BI_CHUNK - 1) / ATT_BI_CHUNK);
    return (size_t)splits * nb * n_heads * (hd + 2);
}

/* One per block tile; tiles never outnumber query vectors. */
extern "C" size_t cuk_attention_counters(int nb, int n_heads) { return (size_t)nb * n_heads; }

extern "C" void cuk_pack_mask(const uint8_t *mask, int n, int stride, uint64_t *out) {
    int words = (stride + 63) / 64;
    memset(out, 0, (size_t)n * words * sizeof(uint64_t));
    for (int t = 0; t < n; t++)
        for (int j = 0; j < stride; j++)
            if (mask[(size_t)t * stride + j]) out[(size_t)t * words + j / 64] |= 1ull << (j % 64);
}

extern "C" void cuk_attention(cudaStream_t s, const float *q, int q_stride, const rs_bf16 *kc,
                              const rs_bf16 *vc, const uint64_t *mask, const CuMeta *meta, int nb,
                              int n_heads, int n_kv_heads, int hd, int cap, int batch_inv,
                              float *scratch, unsigned *counters, rs_bf16 *out_bf16,
                              float *out_f32) {
    if (hd % 8 || hd > 256 || n_heads % n_kv_heads) {
        fprintf(stderr, "rootspec: cuk_attention needs head_dim %% 8 == 0 and <= 256 (got %d) "
                        "and n_heads %d a multiple of n_kv_heads %d\n", hd, n_heads, n_kv_heads);
        abort();
    }
    AttGeom g = att_geom(nb, n_heads, n_kv_heads, hd, cap, batch_inv);
    dim3 grid(g.splits, n_kv_heads * g.n_hgroups, (nb + g.rows_pb - 1) / g.rows_pb);
    float scale = 1.0f / sqrtf((float)hd);
    CUK_LAUNCH(k_attention, grid, ATT_THREADS, s, q, q_stride, (const bf16 *)kc,
               (const bf16 *)vc, mask, meta, nb, n_heads, n_kv_heads, hd, scale, g, scratch,
               counters, (bf16 *)out_bf16, out_f32);
    LAUNCH_CHECK();
}

/* ---- batch-invariant GEMM ---- */

/* Warp w of a block computes outputs o = o0 + w, o0 + w + 8, ... for a group of up to
 * GEMM_RB rows (blockIdx.y): lane l sums W[o, k] * x[r, k] over k = 8l, 8l + 256, ...
 * (16-byte loads, GEMM_U of them in flight per weight row; each W chunk serves the group's
 * rows), then a fixed butterfly across the lanes. Each (row, output) element is reduced in
 * an order that depends on `in` alone, never on the number of rows, on which rows share
 * the group or on how outputs are spread over blocks, so a row's result is the same bits
 * in any batch (cuBLAS picks kernels, split-K and tiles by shape). Prologue: with norm_w
 * the input is the f32 residual row (gathered through rows when given), RMS-normed and
 * rounded to bf16 once per block into shared memory (as k_rmsnorm then the bf16 GEMM
 * input), GEMM_XSH elements at a time; epilogue: y =, y += (residual), or with gated W
 * (2*out rows: gate then up) yb = bf16(silu(g) * u). */
#define GEMM_RB 8
#define GEMM_U 4
#define GEMM_XSH CUK_NORM_GEMM_MAX_IN /* bf16 of normed input a block holds (16 KiB) */
#define GEMM_BLOCKS 264 /* about two blocks per SM of a large GPU */
#if GEMM_XSH % 8
#error "GEMM_XSH must hold whole 16-byte chunks"
#endif

/* 4 floats at p (16-byte aligned, not written during the launch). */
__device__ __forceinline__ void ld_f4(const float *p, float *v) {
#ifdef ROOTSPEC_CUEMU
    CUEMU_ASSERT_ALIGNED(p, 16, "ld_f4");
    memcpy(v, p, 16);
#else
    float4 u = __ldg(reinterpret_cast<const float4 *>(p));
    v[0] = u.x, v[1] = u.y, v[2] = u.z, v[3] = u.w;
#endif
}

/* Rows [r0, r0 + nr) of xf (through rows when given) RMS-normed with norm_w and eps,
 * rounded to bf16, into xs (nr, in): warp i % 8 sums row i's squares (16-byte loads, an
 * order fixed by `in`), then each thread converts 8 elements at a time. Every thread of
 * the block must call it; it ends with a barrier. */
__device__ void stage_normed(const float *xf, const int *rows, int r0, int nr, int in,
                             const float *norm_w, float eps, bf16 *xs, float *inv_sh) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int i = warp; i < nr; i += nw) {
        const float *xr = xf + (size_t)(rows ? rows[r0 + i] : r0 + i) * in;
        float ss = 0.0f, v[4];
        for (int k = lane * 4; k < in; k += 128) {
            ld_f4(xr + k, v);
#pragma unroll
            for (int e = 0; e < 4; e++) ss += v[e] * v[e];
        }
        ss = warp_sum(ss);
        if (lane == 0) inv_sh[i] = 1.0f / sqrtf(ss / (float)in + eps);
    }
    __syncthreads();
    for (int j = threadIdx.x * 8; j < nr * in; j += blockDim.x * 8) {
        int i = j / in, k = j % in;
        const float *xr = xf + (size_t)(rows ? rows[r0 + i] : r0 + i) * in;
        float xv[8], wv[8], inv = inv_sh[i];
        ld_f4(xr + k, xv), ld_f4(xr + k + 4, xv + 4);
        ld_f4(norm_w + k, wv), ld_f4(norm_w + k + 4, wv + 4);
        uint32_t pk[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            bf16 lo = __float2bfloat16_rn(wv[2 * e] * (xv[2 * e] * inv));
            bf16 hi = __float2bfloat16_rn(wv[2 * e + 1] * (xv[2 * e + 1] * inv));
            uint16_t l16, h16;
            memcpy(&l16, &lo, 2), memcpy(&h16, &hi, 2);
            pk[e] = (uint32_t)l16 | (uint32_t)h16 << 16;
        }
#ifdef ROOTSPEC_CUEMU
        CUEMU_ASSERT_ALIGNED(xs + j, 16, "16-byte store of the normed input");
        memcpy(xs + j, pk, 16);
#else
        *reinterpret_cast<uint4 *>(xs + j) = make_uint4(pk[0], pk[1], pk[2], pk[3]);
#endif
    }
    __syncthreads();
}

/* acc[i] (and with wu, accu[i]) += this lane's part of W row . x row i, i < nr (x rows of
 * `in` bf16, shared or global memory): chunks k = 8 lane + 256 j in ascending order, the
 * 8 products of a chunk in order. GEMM_U weight chunks are loaded before any is used. */
__device__ __forceinline__ void dot_rows(const bf16 *w, const bf16 *wu, const bf16 *x, int nr,
                                         int in, int lane, float *acc, float *accu) {
    for (int k0 = lane * 8; k0 < in; k0 += 256 * GEMM_U) {
        uint4 wr[GEMM_U], ur[GEMM_U];
#pragma unroll
        for (int u = 0; u < GEMM_U; u++) {
            wr[u] = ur[u] = make_uint4(0, 0, 0, 0);
            if (k0 + 256 * u < in) {
                wr[u] = ld16g(w + k0 + 256 * u);
                if (wu) ur[u] = ld16g(wu + k0 + 256 * u);
            }
        }
#pragma unroll
        for (int u = 0; u < GEMM_U; u++) {
            int k = k0 + 256 * u;
            if (k >= in) break;
            float wv[8], uv[8];
            unpack8(wr[u], wv);
            if (wu) unpack8(ur[u], uv);
#pragma unroll
            for (int i = 0; i < GEMM_RB; i++) {
                if (i >= nr) break;
                float xv[8];
                unpack8(ld16(x + (size_t)i * in + k), xv);
#pragma unroll
                for (int e = 0; e < 8; e++) acc[i] += wv[e] * xv[e];
                if (wu) {
#pragma unroll
                    for (int e = 0; e < 8; e++) accu[i] += uv[e] * xv[e];
                }
            }
        }
    }
}

/* Hints the L2 to start fetching this block's weight rows [w, w + n) while it stages its
 * input (a no-op where the hint does not exist). */
__device__ __forceinline__ void prefetch_l2(const bf16 *w, size_t n) {
#ifndef ROOTSPEC_CUEMU
    const char *p = reinterpret_cast<const char *>(w);
    for (size_t off = (size_t)threadIdx.x * 128; off < n * 2; off += (size_t)blockDim.x * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off));
#endif
}

/* Outputs [o0, o0 + opb) of k_gemm_bi for rows r .. r + nr of its group, x their input. */
__device__ void gemm_bi_outputs(const bf16 *W, int out, int in, int o0, int opb, int r, int nr,
                                const bf16 *x, int gated, int accumulate, float *y, bf16 *yb) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = o0 + warp; o < min(out, o0 + opb); o += 8) {
        float ag[GEMM_RB], au[GEMM_RB];
#pragma unroll
        for (int i = 0; i < GEMM_RB; i++) ag[i] = au[i] = 0.0f;
        dot_rows(W + (size_t)o * in, gated ? W + ((size_t)out + o) * in : NULL, x, nr, in, lane,
                 ag, au);
#pragma unroll
        for (int i = 0; i < GEMM_RB; i++) {
            if (i >= nr) break;
            float g = warp_sum(ag[i]), u = gated ? warp_sum(au[i]) : 0.0f;
            size_t off = (size_t)(r + i) * out + o;
            if (lane) continue;
            if (gated) yb[off] = __float2bfloat16_rn(g / (1.0f + expf(-g)) * u);
            else if (accumulate) y[off] += g;
            else y[off] = g;
        }
    }
}

/* Block (blockIdx.x, blockIdx.y): outputs [opb * blockIdx.x, + opb), rows of group
 * blockIdx.y; with norm_w the group's rows are staged GEMM_XSH / in at a time. */
__global__ void __launch_bounds__(256)
k_gemm_bi(const bf16 *W, int out, int in, int nb, const bf16 *xb, const float *xf,
          const int *rows, const float *norm_w, float eps, int gated, int accumulate, float *y,
          bf16 *yb, int opb) {
    __shared__ uint4 xs_raw[GEMM_XSH / 8];
    __shared__ float inv_sh[GEMM_RB];
    bf16 *xs = reinterpret_cast<bf16 *>(xs_raw);
    int o0 = blockIdx.x * opb, r0 = blockIdx.y * GEMM_RB, nr = min(GEMM_RB, nb - r0);
    if (!norm_w) {
        gemm_bi_outputs(W, out, in, o0, opb, r0, nr, xb + (size_t)r0 * in, gated, accumulate, y, yb);
        return;
    }
    size_t nw = (size_t)(min(out, o0 + opb) - o0) * in;
    prefetch_l2(W + (size_t)o0 * in, nw);
    if (gated) prefetch_l2(W + ((size_t)out + o0) * in, nw);
    int rc = min(nr, GEMM_XSH / in);
    for (int c = 0; c < nr; c += rc) {
        int n = min(rc, nr - c);
        stage_normed(xf, rows, r0 + c, n, in, norm_w, eps, xs, inv_sh);
        gemm_bi_outputs(W, out, in, o0, opb, r0 + c, n, xs, gated, accumulate, y, yb);
        __syncthreads(); /* xs and inv_sh are restaged for the next rows */
    }
}

/* ---- fused attention input: RMSNorm, q|k|v projection, bias, q/k norm, RoPE, KV store ---- */

/* One block per (slice of hd / parts outputs of a q, k or v head h, group of up to GEMM_RB
 * rows). The block stages its rows' normed input as k_gemm_bi does and computes its slice
 * with the same lane split and butterfly into qkv. A head's post-processing needs the
 * whole head, so the last of its parts blocks to finish (a self-resetting counter per head
 * and group, as k_attention merges its splits) reads the head back through L2 into shared
 * memory, and warp w takes row w of the group through what k_qkv_post does to a head, with
 * the same formulas and order. The result is bitwise that of cuk_gemm_bi + cuk_qkv_post,
 * in one launch and without the normed input ever written: it depends on the row alone, so
 * it serves the batch-invariant mode as well. Splitting heads into parts spreads a one-row
 * call (48 heads on a Llama-3.1-8B shape) over enough blocks to keep every SM streaming. */
__device__ void qkv_fused_post(const float *qkv, float (*head_sh)[256], int h, int r0, int nr,
                               int stride, int n_heads, int n_kv_heads, int hd,
                               const float *bias, const float *q_norm, const float *k_norm,
                               float eps, const float *ct, const float *st, const CuMeta *meta,
                               float *qkv_out, bf16 *kc, bf16 *vc) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (warp >= nr) return;
    int t = r0 + warp, is_q = h < n_heads, is_k = !is_q && h < n_heads + n_kv_heads;
    float *v = head_sh[warp];
    size_t off = (size_t)t * stride + (size_t)h * hd;
    for (int i = lane; i < hd; i += 32) v[i] = ld_part(qkv + off + i);
    __syncwarp();
    qkv_head_post(v, h, t, n_heads, n_kv_heads, hd, bias, q_norm, k_norm, eps, ct, st, lane);
    for (int i = lane; i < hd; i += 32) qkv_out[off + i] = v[i];
    if (is_q || t >= meta->n) return;
    int kv_dim = n_kv_heads * hd;
    bf16 *dst = (is_k ? kc : vc) + (size_t)(meta->kv_base + t) * kv_dim +
                (size_t)(h - n_heads - (is_k ? 0 : n_kv_heads)) * hd;
    for (int i = lane; i < hd; i += 32) dst[i] = __float2bfloat16_rn(v[i]);
}

/* blockIdx.y, read from its special register each time (never kept in a register). */
__device__ __forceinline__ int block_y(void) {
#ifdef ROOTSPEC_CUEMU
    return blockIdx.y;
#else
    int y;
    asm volatile("mov.u32 %0, %%ctaid.y;" : "=r"(y));
    return y;
#endif
}

__global__ void __launch_bounds__(256)
k_qkv_fused(const bf16 *W, const float *x, const float *norm_w, int dim, float eps, int nb,
            int n_heads, int n_kv_heads, int hd, int parts, const float *bias,
            const float *q_norm, const float *k_norm, const float *ct, const float *st,
            const CuMeta *meta, float *qkv, bf16 *kc, bf16 *vc, unsigned *cnt) {
    __shared__ uint4 xs_raw[GEMM_XSH / 8];
    __shared__ float inv_sh[GEMM_RB];
    __shared__ float head_sh[GEMM_RB][256];
    __shared__ int last;
    bf16 *xs = reinterpret_cast<bf16 *>(xs_raw);
    int h = blockIdx.x / parts, ops = hd / parts, o0 = h * hd + (blockIdx.x % parts) * ops;
    int r0 = blockIdx.y * GEMM_RB, nr = min(GEMM_RB, nb - r0);
    int stride = (n_heads + 2 * n_kv_heads) * hd;
    prefetch_l2(W + (size_t)o0 * dim, (size_t)ops * dim);
    for (int c = 0; c < nr; c += min(nr, GEMM_XSH / dim)) {
        /* the block's coordinates read again in each pass rather than kept across the
         * stage's calls (IEEE division and square root slow paths), which sm_80 spills */
        int y = block_y(), rr = y * GEMM_RB, nn = min(GEMM_RB, nb - rr);
        int n = min(min(nn, GEMM_XSH / dim), nn - c);
        stage_normed(x, NULL, rr + c, n, dim, norm_w, eps, xs, inv_sh);
        gemm_bi_outputs(W, stride, dim, o0, ops, rr + c, n, xs, 0, 0, qkv, NULL);
        __syncthreads();
    }
    if (parts > 1) { /* publish this slice; the block that completes the head goes on */
        __threadfence();
        __syncthreads();
        unsigned *cn = cnt + (size_t)blockIdx.y * (gridDim.x / parts) + h;
        if (threadIdx.x == 0) {
            last = atomicAdd(cn, 1u) == (unsigned)parts - 1;
            if (last) *cn = 0; /* every part has counted: ready for the next launch */
        }
        __syncthreads();
        if (!last) return;
        __threadfence();
    }
    qkv_fused_post(qkv, head_sh, h, r0, nr, stride, n_heads, n_kv_heads, hd, bias, q_norm, k_norm,
                   eps, ct, st, meta, qkv, kc, vc);
}

/* Parts a head's outputs are split into: doubled while the grid has fewer than GEMM_BLOCKS
 * blocks and each part keeps at least 8 outputs (one per warp). */
static int qkv_parts(int heads, int groups, int hd) {
    int parts = 1;
    while (heads * groups * parts < GEMM_BLOCKS && hd % (2 * parts) == 0 && hd / (2 * parts) >= 8)
        parts *= 2;
    return parts;
}

extern "C" size_t cuk_qkv_counters(int nb, int n_heads, int n_kv_heads) {
    return (size_t)(n_heads + 2 * n_kv_heads) * ((nb + GEMM_RB - 1) / GEMM_RB);
}

extern "C" void cuk_qkv_fused(cudaStream_t s, const rs_bf16 *W, const float *x,
                              const float *norm_w, int dim, float eps, int nb, int n_heads,
                              int n_kv_heads, int hd, const float *bias, const float *q_norm,
                              const float *k_norm, const float *cos_t, const float *sin_t,
                              const CuMeta *meta, float *qkv, rs_bf16 *kc, rs_bf16 *vc,
                              unsigned *counters) {
    if (dim % 8 || dim > GEMM_XSH || hd > 256 || hd % 2) {
        fprintf(stderr, "rootspec: cuk_qkv_fused needs dim %% 8 == 0 and <= %d (got %d) and an "
                        "even head_dim <= 256 (got %d)\n", GEMM_XSH, dim, hd);
        abort();
    }
    if (nb <= 0) return;
    int heads = n_heads + 2 * n_kv_heads, groups = (nb + GEMM_RB - 1) / GEMM_RB;
    int parts = qkv_parts(heads, groups, hd);
    dim3 grid(heads * parts, groups);
    CUK_LAUNCH(k_qkv_fused, grid, 256, s, (const bf16 *)W, x, norm_w, dim, eps, nb, n_heads,
               n_kv_heads, hd, parts, bias, q_norm, k_norm, cos_t, sin_t, meta, qkv, (bf16 *)kc,
               (bf16 *)vc, counters);
    LAUNCH_CHECK();
}

extern "C" void cuk_gemm_bi(cudaStream_t s, const rs_bf16 *W, int out, int in, int nb,
                            const rs_bf16 *xb, const float *xf, const int *rows,
                            const float *norm_w, float eps, int gated, int accumulate, float *y,
                            rs_bf16 *yb) {
    if (in % 8 || (norm_w && in > GEMM_XSH)) {
        fprintf(stderr, "rootspec: cuk_gemm_bi needs in %% 8 == 0 (got %d), and <= %d with a "
                        "norm prologue\n", in, GEMM_XSH);
        abort();
    }
    if (nb <= 0) return;
    int groups = (nb + GEMM_RB - 1) / GEMM_RB, opb = 8;
    /* a staging block serves more outputs, while the grid keeps GEMM_BLOCKS blocks */
    while (norm_w && opb < 64 && (out + 2 * opb - 1) / (2 * opb) * groups >= GEMM_BLOCKS) opb *= 2;
    dim3 grid((out + opb - 1) / opb, groups);
    CUK_LAUNCH(k_gemm_bi, grid, 256, s, (const bf16 *)W, out, in, nb, (const bf16 *)xb, xf, rows,
               norm_w, eps, gated, accumulate, y, (bf16 *)yb, opb);
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
