/* CUDA kernels of the EAGLE-3 feature recording (kernels/backend.h, feature block), kept
 * out of cuda_kernels.cu so the forward's kernels stay as they are: the residual stream of
 * a batch's rows into their pending entries' feature rows (graph-safe: the batch size and
 * pending offset come from the device CuMeta), and the gather of the kept rows at
 * kv_commit. Values are stored bf16, as the protocol carries them. */
#ifndef ROOTSPEC_CUDA_FEAT_H
#define ROOTSPEC_CUDA_FEAT_H
#include "cuda_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* feat (max_pending, width) bf16: for each real row t < meta->n of x (nb, dim) f32,
 * feat[pending index of t][off .. off + dim) = bf16(x[t]); the pending index is
 * meta->kv_base - meta->n_committed + t. Padding rows write nothing. One launch. */
void cuk_feat_store(cudaStream_t s, const float *x, int nb, int dim, int width, int off,
                    const CuMeta *meta, rs_bf16 *feat);

/* out[i] = pend[keep[i]] for i < n_keep, rows of width bf16 values. One launch (none
 * when n_keep is 0). */
void cuk_feat_gather(cudaStream_t s, const rs_bf16 *pend, const int *keep, int n_keep,
                     int width, rs_bf16 *out);

#ifdef __cplusplus
}
#endif
#endif
