/* Top-k and log-sum-exp of logits rows on the device (kernels/cuda/cuda_topk.cu), used by the
 * CUDA backend's backend_rows_topk and the EAGLE-3 head on CUDA, so that only the n * (2k + 1)
 * numbers a drafter needs leave the GPU. Launchers only enqueue; device pointers throughout. */
#ifndef ROOTSPEC_CUDA_TOPK_H
#define ROOTSPEC_CUDA_TOPK_H
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Blocks over chunks of each row of logits (n, vocab): ids (n, k) the top-k columns (value
 * desc, ties to the lower column), lse (n) log(sum exp(row)) (NaN for a row with a NaN or
 * +inf, or all -inf), logq (n, k) row[id] - lse. 1 <= k <= BACKEND_TOPK_MAX. One launch.
 * scratch: cuk_topk_scratch_bytes(n, vocab) bytes, ZEROED once before its first use (every
 * launch leaves it ready again); it serves any call of at most n rows of that vocab. */
void cuk_topk(cudaStream_t s, const float *logits, int n, int vocab, int k, void *scratch,
              int *ids, float *logq, float *lse);
size_t cuk_topk_scratch_bytes(int n, int vocab);

#ifdef __cplusplus
}
#endif
#endif
