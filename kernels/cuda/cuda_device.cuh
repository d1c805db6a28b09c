/* Device helpers the CUDA kernel files share (each kernel file includes it; not a public
 * interface): the bf16 type, the counted launch and its check, warp reductions,
 * 16-byte loads of bf16 (aligned, asserted on the emulator), reads of other blocks'
 * partials through L2, and one warp's post-projection work on a q/k/v head. */
#ifndef ROOTSPEC_CUDA_DEVICE_CUH
#define ROOTSPEC_CUDA_DEVICE_CUH
#include "cuda_kernels.h"
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <string.h>

typedef __nv_bfloat16 bf16;

#define LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

/* Every launch is counted (host side, when enqueued or captured): launches per layer are
 * asserted by the tests and reported by tools/gpu-check.sh. */
#define CUK_LAUNCH(...) (cuk_count_launches(1), CUK_KERNEL_LAUNCH(__VA_ARGS__))

#ifdef ROOTSPEC_CUEMU
/* The emulator's warp barrier is a shuffle (every lane must arrive). */
#define __syncwarp() ((void)__shfl_xor_sync(0xffffffffu, 0, 1))
#endif

static inline unsigned blocks_for(size_t n, unsigned threads) {
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b > 65535u * 16u ? 65535u * 16u : (b ? b : 1));
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

/* Cache slot of row t's new k and v (cuda_kernels.h: CuMeta). */
__device__ __forceinline__ size_t kv_row_slot(const CuMeta *meta, int t) {
    const CuPaged *pg = meta->paged;
    return pg ? (size_t)pg->row_slot[t] : (size_t)(meta->kv_base + t);
}

/* ---- reductions ---- */

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* ---- 16-byte loads ---- */

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

/* A partial written by another block of this launch: read through L2 (not a stale L1 line). */
__device__ __forceinline__ float ld_part(const float *p) {
#ifdef ROOTSPEC_CUEMU
    return *p;
#else
    return __ldcg(p);
#endif
}


/* ---- q/k/v head post-processing ---- */

/* One warp's post-projection work on head h of token t's q|k|v row (v: that head's hd
 * floats): bias, per-head RMSNorm (q/k), RoPE (q/k), in the order and formulas of the
 * separate kernels of cuda_kernels.cu. k_qkv_post and k_qkv_fused both call it, so the two are bitwise
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

#endif
