/* Extras of the CUDA backend beyond kernels/backend.h (kernels/cuda/cuda_backend.cu), for tests
 * and the GPU benchmark; its counters come through backend_stats(). Only available in the CUDA build (make cuda): the CPU library does
 * not define these. */
#ifndef ROOTSPEC_CUDA_BACKEND_H
#define ROOTSPEC_CUDA_BACKEND_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "kernels/backend.h"

/* Turns CUDA graphs on (1) or off (0) for later forward() calls; the default comes from
 * ROOTSPEC_CUDA_GRAPHS (unset or not "0": on). */
void cuda_backend_set_graphs(Backend *b, int on);
/* Weight bytes one forward streams (bf16 layers + output head), for bandwidth figures. */
size_t cuda_backend_weight_bytes(const Backend *b);

/* Kernel launches of the last forward(): per layer and for the whole pass (embedding,
 * RoPE table, layers, final norm and head; a replayed graph counts the kernels it holds).
 * Default mode: 7 a layer, or 9 with ROOTSPEC_CUDA_FUSED_QKV=0 (read at create) and in
 * calls of more than 65 rows; batch-invariant mode: 5 (docs/DESIGN.md §7). */
void cuda_backend_launches(const Backend *b, int *per_layer, int *per_pass);

#ifdef __cplusplus
}
#endif
#endif
