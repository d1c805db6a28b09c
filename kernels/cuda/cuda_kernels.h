/* CUDA kernels of the transformer forward, callable from C; one file per operation, each
 * naming its CPU reference: kernels/cuda/cuda_kernels.cu (norms and elementwise, the launch
 * counter), cuda_attention.cu, cuda_gemm.cu (own GEMV/GEMM, fused q|k|v), cuda_sample.cu
 * (argmax, sampling); cuda_topk.cu and cuda_rowstats.cu have headers of their own.
 * Every launcher takes device pointers and a stream and only enqueues work, so the
 * backend can capture a whole forward in a CUDA graph. bf16 values cross this C interface
 * as raw uint16_t bits (the device side reads them as __nv_bfloat16).
 *
 * Per-call scalars that change between decode calls (batch size, cache offsets, mask
 * stride) are read by the kernels from a device-resident CuMeta, never passed by value:
 * a graph captured once then stays valid for every later call of the same padded size.
 * Rows >= meta->n of a padded batch are computed or skipped but never written to the
 * KV cache. */
#ifndef ROOTSPEC_CUDA_KERNELS_H
#define ROOTSPEC_CUDA_KERNELS_H
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "common/model.h"

typedef uint16_t rs_bf16; /* raw bfloat16 bits */

/* Entries per block of a paged cache (backend.h: BACKEND_KV_BLOCK). */
#define CUK_KV_BLOCK 16

/* Query rows of one sequence that k_attention serves together (a row tile): rows
 * [r0, r0 + nr) of the batch see that sequence's committed entries [0, nc) always and its
 * entries [nc, n_ctx) (pending ones, then the rows' own) where their mask bits allow; its
 * entry i lives in cache slot tables[table + i / CUK_KV_BLOCK] * CUK_KV_BLOCK +
 * i % CUK_KV_BLOCK. */
typedef struct {
    int r0, nr, nc, n_ctx, table, pad_;
} CuAttTile;

/* Rows of several sequences over a paged cache (CuMeta.paged): rows of one sequence are
 * consecutive and never share a tile with another's. */
typedef struct {
    const int *row_slot;    /* (n) cache slot each row's k and v go to */
    const CuAttTile *tiles; /* (n_tiles) the rows' tiles, cuk_attention_tile_rows rows at most */
    const int *tables;      /* the sequences' block tables, concatenated */
    int n_tiles, pad_;
} CuPaged;

typedef struct {
    int n;           /* real tokens in this batch; rows [n, nb) are padding */
    int kv_base;     /* cache slot of this batch's first token (n_committed + n_pending) */
    int n_committed; /* committed entries: always visible */
    int mask_stride; /* mask row length = pending before this batch + n (paged: words * 64) */
    /* NULL: one sequence in contiguous slots (the fields above). Otherwise a device
     * CuPaged: every row's slot, tile and visible entries come from it, the mask rows have
     * mask_stride / 64 words each, and kv_base and n_committed serve only the EAGLE-3
     * feature rows (sequence 0). */
    const CuPaged *paged;
} CuMeta;

/* The one kernel-launch form of the .cu files. Under nvcc it is exactly the <<<>>> launch;
 * under the CPU emulator (ROOTSPEC_CUEMU, tests/cuemu/) it enqueues the kernel on the
 * emulated stream with the same argument conversions. It counts nothing: cuda_device.cuh's
 * CUK_LAUNCH counts each launch, the other files call cuk_count_launches. */
#ifdef ROOTSPEC_CUEMU
#define CUK_KERNEL_LAUNCH(k, grid, block, stream, ...) \
    cuemu_launch(#k, k, (grid), (block), 0, (stream), __VA_ARGS__)
#else
#define CUK_KERNEL_LAUNCH(k, grid, block, stream, ...) \
    k<<<(grid), (block), 0, (stream)>>>(__VA_ARGS__)
#endif

/* Aborts with the expression, file, line and CUDA's message. */
#define CUDA_CHECK(expr)                                                                   \
    do {                                                                                   \
        cudaError_t err_ = (expr);                                                         \
        if (err_ != cudaSuccess) {                                                         \
            fprintf(stderr, "rootspec: CUDA error %s: %s (%s:%d)\n", cudaGetErrorName(err_), \
                    #expr, __FILE__, __LINE__);                                            \
            fprintf(stderr, "rootspec:   %s\n", cudaGetErrorString(err_));                  \
            abort();                                                                       \
        }                                                                                  \
    } while (0)

/* The same for a cuBLAS call (only in files that include cublas_v2.h). */
#define CUBLAS_CHECK(expr)                                                                 \
    do {                                                                                   \
        cublasStatus_t st_ = (expr);                                                       \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                \
            fprintf(stderr, "rootspec: cuBLAS error %s: %s (%s:%d)\n",                     \
                    cublasGetStatusString(st_), #expr, __FILE__, __LINE__);                \
            abort();                                                                       \
        }                                                                                  \
    } while (0)

/* Frees device memory when set and clears the pointer. */
#define DFREE(p) do { if (p) cudaFree(p); (p) = NULL; } while (0)

/* Host helpers (no device needed). */
/* RoPE inverse frequencies (head_dim/2), exactly as the CPU backend computes them (rope_inv_freq). */
void cuk_rope_inv_freq(const Config *c, float *inv_freq);
/* Round-to-nearest-even f32 -> bf16 and back, as the device converts. */
rs_bf16 cuk_f32_to_bf16_host(float f);
float cuk_bf16_to_f32_host(rs_bf16 h);

/* Conversions and initialisation. */
void cuk_f32_to_bf16(cudaStream_t s, const float *in, rs_bf16 *out, size_t n);
/* out[i] = base + scale * U(-sqrt3, sqrt3) from a counter hash of (seed, i): unit variance
 * noise for random-weight benchmark models, made on the device (no host arrays). */
void cuk_fill_random_bf16(cudaStream_t s, rs_bf16 *out, size_t n, uint64_t seed, float scale,
                          float base);
void cuk_fill_random_f32(cudaStream_t s, float *out, size_t n, uint64_t seed, float scale,
                         float base);

/* Kernel launches enqueued (or captured) so far by this process, all streams; the backend
 * adds its cuBLAS calls through cuk_count_launches. */
uint64_t cuk_launch_count(void);
void cuk_count_launches(int k);

/* x (nb, dim) = bf16 embedding rows of tokens (nb). */
void cuk_embed(cudaStream_t s, const rs_bf16 *emb, const int *tokens, int nb, int dim,
               float *x);
/* out row r = w * x[row r'] / rms(x[row r']) with r' = rows ? rows[r] : r, for r < nb.
 * Writes out_f32 and/or out_bf16 (either may be NULL); both (nb, dim). */
void cuk_rmsnorm(cudaStream_t s, const float *x, const int *rows, const float *w, int nb,
                 int dim, float eps, float *out_f32, rs_bf16 *out_bf16);
/* In place per-head RMSNorm (Qwen3 q/k norm): x rows of row_stride floats, n_heads heads of
 * hd each starting at x; w (hd). */
void cuk_head_rmsnorm(cudaStream_t s, float *x, int row_stride, int nb, int n_heads, int hd,
                      const float *w, float eps);
/* x[t, i] += bias[i] for i < width (rows of row_stride floats). */
void cuk_bias_add(cudaStream_t s, float *x, int row_stride, int nb, int width,
                  const float *bias);
/* cos/sin tables (nb, hd/2): angle = float(pos[t]) * inv_freq[i]; cos/sin in double, as the
 * CPU reference. */
void cuk_rope_table(cudaStream_t s, const int *pos, const float *inv_freq, int nb, int half,
                    float *cos_t, float *sin_t);
/* Rotate-half RoPE in place on n_heads heads of hd at the start of each row. */
void cuk_rope(cudaStream_t s, float *x, int row_stride, int nb, int n_heads, int hd,
              const float *cos_t, const float *sin_t);
/* Writes k and v rows t < meta->n (f32, at k / v with row_stride) as bf16 into cache slots
 * meta->kv_base + t (paged: meta->paged->row_slot[t]) of kc / vc (cap, kv_dim) (one layer).
 * cuk_qkv_post and cuk_qkv_fused store to the same slots. */
void cuk_kv_store(cudaStream_t s, const float *k, const float *v, int row_stride, int nb,
                  int kv_dim, const CuMeta *meta, rs_bf16 *kc, rs_bf16 *vc);
/* Attention of query rows t < meta->n over cache slots [0, kv_base + n): committed slots
 * always, pending slot j (relative to n_committed) where bit j of mask row t is set (rows
 * of (mask_stride + 63) / 64 words, cuk_pack_mask). GQA, scale 1/sqrt(hd), f32 online
 * softmax, split-KV merged in the same launch (cuda_attention.cu): always one launch. q rows
 * of q_stride floats (n_heads*hd used); out (nb, n_heads*hd) bf16 and/or f32; padding rows
 * get zeros. hd % 8 == 0, hd <= 256. cap: the cache's slots (bounds the splits); batch_inv:
 * split bounds fixed by slot position, so a row's result does not depend on nb or n.
 * scratch: cuk_attention_scratch_floats(nb, n_heads, hd, cap) floats (split partials);
 * counters: cuk_attention_counters(nb, n_heads) unsigned, ZEROED once before their first
 * use (every launch leaves them at zero again). Both serve any call of at most nb rows. */
void cuk_attention(cudaStream_t s, const float *q, int q_stride, const rs_bf16 *kc,
                   const rs_bf16 *vc, const uint64_t *mask, const CuMeta *meta, int nb,
                   int n_heads, int n_kv_heads, int hd, int cap, int batch_inv, float *scratch,
                   unsigned *counters, rs_bf16 *out_bf16, float *out_f32);
/* The same over a paged cache of rows of up to max_seqs sequences (meta->paged set; cap:
 * the slots of the cache, which bounds a sequence's entries): the grid holds the most tiles
 * nb rows of max_seqs sequences can need, and blocks past meta->paged->n_tiles return at
 * once, so one captured graph serves every mix of sequences. Padding rows are not written.
 * In batch-invariant mode the split bounds are fixed by entry index, so a row's output is
 * the same bits whatever sequences and rows share the call. */
void cuk_attention_paged(cudaStream_t s, const float *q, int q_stride, const rs_bf16 *kc,
                         const rs_bf16 *vc, const uint64_t *mask, const CuMeta *meta, int nb,
                         int max_seqs, int n_heads, int n_kv_heads, int hd, int cap,
                         int batch_inv, float *scratch, unsigned *counters, rs_bf16 *out_bf16,
                         float *out_f32);
/* Rows of one tile of cuk_attention_paged (the host cuts each sequence's rows into tiles of
 * at most this many). */
int cuk_attention_tile_rows(int nb, int n_heads, int n_kv_heads, int hd);
size_t cuk_attention_scratch_floats(int nb, int n_heads, int hd, int cap);
/* Counters for any call of at most nb rows, paged or not. */
size_t cuk_attention_counters(int nb, int n_heads);
/* out (n, (stride + 63) / 64) = the bytes of mask (n, stride) as bits, bit j of word j / 64. */
void cuk_pack_mask(const uint8_t *mask, int n, int stride, uint64_t *out);
/* gu (nb, 2*hidden): gate then up. out (nb, hidden) = silu(gate) * up, bf16 and/or f32. */
void cuk_swiglu(cudaStream_t s, const float *gu, int nb, int hidden, rs_bf16 *out_bf16,
                float *out_f32);
/* x[i] += y[i], i < n. */
void cuk_residual_add(cudaStream_t s, float *x, const float *y, size_t n);
/* y (out) (+)= W x for one bf16 row x (in), W (out, in) bf16 (cuda_gemm.cu): one warp per
 * output, 8 16-byte weight and 8 input loads in flight per lane, each output's bits those
 * of cuk_gemm_bi with one row and no prologue. in % 8 == 0. */
void cuk_gemv(cudaStream_t s, const rs_bf16 *W, int out, int in, const rs_bf16 *x,
              int accumulate, float *y);

/* Batch-invariant y (nb, out) = op(x) @ W^T, W (out, in) bf16 (cuda_gemm.cu): each output
 * element reduced over in in an order fixed by `in` alone. Input: xb (nb, in) bf16, or with
 * norm_w the f32 rows xf (rows ? rows[r] : r) RMS-normed with norm_w, eps and rounded to
 * bf16 (in <= CUK_NORM_GEMM_MAX_IN). Output: y (nb, out) f32, added to y when accumulate; or
 * with gated (W of 2*out rows, gate then up) yb (nb, out) = bf16(silu(gate) * up).
 * in % 8 == 0. */
#define CUK_NORM_GEMM_MAX_IN 8192
void cuk_gemm_bi(cudaStream_t s, const rs_bf16 *W, int out, int in, int nb, const rs_bf16 *xb,
                 const float *xf, const int *rows, const float *norm_w, float eps, int gated,
                 int accumulate, float *y, rs_bf16 *yb);
/* *out = index of the largest of row (n), ties to the lowest index (row_argmax). */
void cuk_argmax(cudaStream_t s, const float *row, int n, int *out);
/* *out = one draw from softmax(row) by inverse CDF at u in [0,1) (row_sample with the
 * host Rng's uniform). */
void cuk_sample(cudaStream_t s, const float *row, int n, double u, int *out);
/* One launch for what follows the q|k|v projection: per row t < nb of qkv (row_stride
 * floats: n_heads q heads, n_kv_heads k heads, n_kv_heads v heads of hd), bias add (bias
 * NULL: none), per-head RMSNorm of q and k heads (q_norm/k_norm NULL: none), RoPE of q and
 * k heads from cos_t/sin_t (nb, hd/2), then k and v of rows t < meta->n stored as bf16 in
 * cache slots meta->kv_base + t of kc / vc (cap, n_kv_heads*hd). Same arithmetic as
 * cuk_bias_add + cuk_head_rmsnorm + cuk_rope + cuk_kv_store. */
void cuk_qkv_post(cudaStream_t s, float *qkv, int row_stride, int nb, int n_heads,
                  int n_kv_heads, int hd, const float *bias, const float *q_norm,
                  const float *k_norm, float eps, const float *cos_t, const float *sin_t,
                  const CuMeta *meta, rs_bf16 *kc, rs_bf16 *vc);
/* One launch for the whole attention input of a layer: x (nb, dim) f32 rows RMS-normed with
 * norm_w and eps and rounded to bf16, times W (q_dim + 2*kv_dim, dim) bf16 (q, k, v rows),
 * then what cuk_qkv_post does (bias, q/k norm, RoPE, k and v of rows t < meta->n into the
 * cache); qkv (nb, q_dim + 2*kv_dim) f32 receives the processed rows. Bitwise equal to
 * cuk_gemm_bi (norm prologue) followed by cuk_qkv_post, hence batch-invariant.
 * dim % 8 == 0 and <= CUK_NORM_GEMM_MAX_IN, hd even and <= 256. counters:
 * cuk_qkv_counters(nb, n_heads, n_kv_heads) unsigned, ZEROED once before their first use
 * (every launch leaves them at zero again); they serve any call of at most nb rows. */
void cuk_qkv_fused(cudaStream_t s, const rs_bf16 *W, const float *x, const float *norm_w,
                   int dim, float eps, int nb, int n_heads, int n_kv_heads, int hd,
                   const float *bias, const float *q_norm, const float *k_norm,
                   const float *cos_t, const float *sin_t, const CuMeta *meta, float *qkv,
                   rs_bf16 *kc, rs_bf16 *vc, unsigned *counters);
size_t cuk_qkv_counters(int nb, int n_heads, int n_kv_heads);
/* KV compaction for one cache (n_layers, cap, kv_dim): for every layer, slot
 * n_committed + i <- slot n_committed + keep[i] for i < n_keep (keep on the device),
 * staged through scratch (n_layers, n_keep, kv_dim) so any order is safe. */
void cuk_kv_compact(cudaStream_t s, rs_bf16 *cache, int n_layers, int cap, int kv_dim,
                    int n_committed, const int *keep, int n_keep, rs_bf16 *scratch);
/* The same between any slots (a paged cache): slot to[i] <- slot from[i], i < n (both
 * lists on the device), staged through scratch (n_layers, n, kv_dim). */
void cuk_kv_move(cudaStream_t s, rs_bf16 *cache, int n_layers, int cap, int kv_dim,
                 const int *from, const int *to, int n, rs_bf16 *scratch);

#ifdef __cplusplus
}
#endif
#endif
