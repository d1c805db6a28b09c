/* The own GEMV/GEMM kernels (see cuda_kernels.h: cuk_gemm_bi, cuk_qkv_fused, cuk_gemv), against the
 * CPU reference cpu_matmul (kernels/cpu/cpu_ops.c) with cpu_rmsnorm in the prologue and
 * cpu_swiglu or cpu_residual_add in the epilogue; the fused q|k|v kernel adds the head
 * post-processing of cuk_qkv_post and the KV store. */
#include "cuda_device.cuh"

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
    bf16 *dst = (is_k ? kc : vc) + kv_row_slot(meta, t) * kv_dim +
                (size_t)(h - n_heads - (is_k ? 0 : n_kv_heads)) * hd;
    for (int i = lane; i < hd; i += 32) dst[i] = __float2bfloat16_rn(v[i]);
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

/* ---- one-row GEMV ---- */

/* y[o] (+)= W[o, :] . x for one bf16 row x: warp w of a block takes outputs
 * 8 * blockIdx.x + w, + 8 * gridDim.x, ...; lane l sums chunks k = 8 l + 256 j as
 * dot_rows does, in the same order (so a row's bits equal cuk_gemm_bi's without a
 * prologue), with GEMV_U weight and GEMV_U input loads of 16 bytes in flight per lane
 * before the first product, then the fixed butterfly. */
#define GEMV_U 8

__global__ void __launch_bounds__(256)
k_gemv(const bf16 *W, int out, int in, const bf16 *x, int accumulate, float *y) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = blockIdx.x * 8 + warp; o < out; o += gridDim.x * 8) {
        const bf16 *w = W + (size_t)o * in;
        float acc = 0.0f;
        for (int k0 = lane * 8; k0 < in; k0 += 256 * GEMV_U) {
            uint4 wr[GEMV_U], xr[GEMV_U];
#pragma unroll
            for (int u = 0; u < GEMV_U; u++) {
                int k = k0 + 256 * u;
                wr[u] = k < in ? ld16g(w + k) : make_uint4(0, 0, 0, 0);
                xr[u] = k < in ? ld16g(x + k) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < GEMV_U; u++) {
                if (k0 + 256 * u >= in) break;
                float wv[8], xv[8];
                unpack8(wr[u], wv);
                unpack8(xr[u], xv);
#pragma unroll
                for (int e = 0; e < 8; e++) acc += wv[e] * xv[e];
            }
        }
        acc = warp_sum(acc);
        if (lane == 0) {
            if (accumulate) y[o] += acc;
            else y[o] = acc;
        }
    }
}

extern "C" void cuk_gemv(cudaStream_t s, const rs_bf16 *W, int out, int in, const rs_bf16 *x,
                         int accumulate, float *y) {
    if (in % 8) {
        fprintf(stderr, "rootspec: cuk_gemv needs in %% 8 == 0 (got %d)\n", in);
        abort();
    }
    if (out <= 0) return;
    unsigned blocks = (unsigned)((out + 7) / 8);
    if (blocks > 65535u) blocks = 65535u; /* the warps stride over the rest */
    CUK_LAUNCH(k_gemv, blocks, 256, s, (const bf16 *)W, out, in, (const bf16 *)x, accumulate, y);
    LAUNCH_CHECK();
}
