/* The CPU backend's reference operations, one per step of the transformer forward, in f32.
 * kernels/cpu/cpu_backend.c composes them per layer; the CUDA kernel tests
 * (tests/cuda/test_cuda_kernels.c) use the same functions as their references, so a CUDA
 * kernel is checked against exactly what the CPU reference computes (llm.c style).
 * No function allocates; none keeps state. */
#ifndef ROOTSPEC_CPU_OPS_H
#define ROOTSPEC_CPU_OPS_H
#include "common/model.h"
#include <stddef.h>
#include <stdint.h>

/* RoPE inverse frequencies (head_dim/2), incl. Llama-3 scaling: the one table every backend
 * and the CUDA kernels use, so they are bit-identical. */
void rope_inv_freq(const Config *c, float *inv_freq);
/* o (n) = w * x / rms(x), f32 sum of squares as transformers. o may equal x. */
void cpu_rmsnorm(float *o, const float *x, const float *w, int n, float eps);
/* x (n, dim) = rows tokens[t] of emb (vocab, dim). */
void cpu_embed(float *x, const float *emb, const int *tokens, int n, int dim);
/* x[i] += bias[i], i < n. */
void cpu_bias_add(float *x, const float *bias, int n);
/* cos_t, sin_t (n, half): angle = float32(pos[t]) * inv_freq[i] in float32, cos/sin in
 * double rounded to float, as transformers. */
void cpu_rope_table(const int *pos, const float *inv_freq, int n, int half, float *cos_t,
                    float *sin_t);
/* Rotate-half RoPE in place on one head vector v (2*half): pairs (i, i + half); cs, sn
 * (half) are one token's row of the tables. */
void cpu_rope(float *v, const float *cs, const float *sn, int half);
/* y (n, out) with row stride ldy = x (n, in) @ w^T, w (out, in) row-major (f32; the
 * scalar family's kernel, so a row's result does not depend on n). */
void cpu_matmul(float *y, const float *x, const float *w, int n, int in, int out, int ldy);
/* The pending entries each of n new tokens attends to, from forward()'s mask (n,
 * n_pending + n) (NULL: causal, all earlier pending): idx (n, max_pending) holds each
 * token's pending indices (0 = first pending) ascending, cnt (n) how many. */
void cpu_attention_index(const uint8_t *mask, int n, int n_pending, int max_pending, int *idx,
                         int *cnt);
/* out (n, n_heads*hd) = softmax(q k^T / sqrt(hd)) v per token and head (GQA) over cache
 * entries [0, n_committed) plus n_committed + idx[t][j] for j < cnt[t]. q (n, n_heads*hd);
 * kc, vc (entries, n_kv_heads*hd); idx, cnt as cpu_attention_index; att: scratch of
 * n_committed + max_pending floats. */
void cpu_attention(float *out, const float *q, const float *kc, const float *vc,
                   int n_committed, const int *idx, const int *cnt, int max_pending, int n,
                   int n_heads, int n_kv_heads, int hd, float *att);
/* One (token, head) of cpu_attention: o (hd) over cache entries [0, nc) then
 * nc + idx[j - nc], len in all; kh0, vh0 point at the head's KV group in entry 0 (rows of
 * kvd floats); att: scratch of len floats. */
void cpu_attention_head(float *o, const float *qh, const float *kh0, const float *vh0, int kvd,
                        int nc, const int *idx, int len, int hd, float *att);
/* The cache slot of a row's entry j in cpu_attention_head's order: committed entries, then
 * the pending ones idx names (every attention kernel walks the entries through it). */
static inline size_t cpu_attention_slot(int nc, const int *idx, int j) {
    return (size_t)(j < nc ? j : nc + idx[j - nc]);
}
/* The f32 cache row of a head's entry j (rows of kvd floats from h0). */
static inline const float *cpu_attention_entry(const float *h0, int kvd, int nc, const int *idx,
                                               int j) {
    return h0 + cpu_attention_slot(nc, idx, j) * kvd;
}
/* gate[i] = silu(gate[i]) * up[i], i < n. */
void cpu_swiglu(float *gate, const float *up, size_t n);
/* x[i] += y[i], i < n. */
void cpu_residual_add(float *x, const float *y, size_t n);

#endif
