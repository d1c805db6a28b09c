/* EAGLE-3 feature kernels; see cuda_feat.h. */
#include "cuda_feat.h"
#include <cuda_bf16.h>
#include <cuda_runtime.h>

typedef __nv_bfloat16 bf16;

__global__ void k_feat_store(const float *x, int dim, int width, int off, const CuMeta *meta,
                             bf16 *feat) {
    int t = blockIdx.x;
    if (t >= meta->n) return;
    const float *src = x + (size_t)t * dim;
    bf16 *dst = feat + (size_t)(meta->kv_base - meta->n_committed + t) * width + off;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = __float2bfloat16_rn(src[i]);
}

extern "C" void cuk_feat_store(cudaStream_t s, const float *x, int nb, int dim, int width,
                               int off, const CuMeta *meta, rs_bf16 *feat) {
    cuk_count_launches(1);
    CUK_KERNEL_LAUNCH(k_feat_store, nb, 256, s, x, dim, width, off, meta, (bf16 *)feat);
    CUDA_CHECK(cudaGetLastError());
}

__global__ void k_feat_gather(const bf16 *pend, const int *keep, int width, bf16 *out) {
    const bf16 *src = pend + (size_t)keep[blockIdx.x] * width;
    bf16 *dst = out + (size_t)blockIdx.x * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) dst[i] = src[i];
}

extern "C" void cuk_feat_gather(cudaStream_t s, const rs_bf16 *pend, const int *keep,
                                int n_keep, int width, rs_bf16 *out) {
    if (n_keep <= 0) return;
    cuk_count_launches(1);
    CUK_KERNEL_LAUNCH(k_feat_gather, n_keep, 256, s, (const bf16 *)pend, keep, width, (bf16 *)out);
    CUDA_CHECK(cudaGetLastError());
}
