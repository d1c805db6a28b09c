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
 * BackendParams.sw.cuda_eager (0: on). */
void cuda_backend_set_graphs(Backend *b, int on);
/* Weight bytes one forward streams (bf16 layers + output head), for bandwidth figures. */
size_t cuda_backend_weight_bytes(const Backend *b);

/* Kernel launches of the last forward(), counted on the host as they are enqueued: per
 * layer and for the whole pass (embedding, RoPE table, layers, final norm and head; a
 * replayed graph counts the kernels enqueued while it was captured). Default mode: 5 a
 * layer in a one-row call, 9 with more rows (BackendParams.sw: cuda_fused_qkv -1 or
 * cuda_blas_onerow make a one-row call 7, cuda_fused_qkv 1 makes calls of at most 65 rows
 * 7); batch-invariant mode: 5 (docs/DESIGN.md §7). A cuBLAS call counts as one kernel. */
void cuda_backend_launches(const Backend *b, int *per_layer, int *per_pass);
/* The same counted in the CUDA graph the last forward() replayed (cudaGraphGetNodes):
 * its kernel nodes (cuBLAS's own extra kernels included), all its nodes, and per layer
 * the kernel nodes less those before the first layer, over the layer count (fractional
 * when cuBLAS splits some layers' GEMMs differently). -1 each when the call ran eagerly. */
void cuda_backend_graph_launches(const Backend *b, double *per_layer, int *kernels, int *nodes);
/* 1 when a forward() of n rows computes q|k|v with the fused kernel (k_qkv_fused), 0 when
 * with RMSNorm + cuBLAS + k_qkv_post. */
int cuda_backend_qkv_fused(const Backend *b, int n);
/* 1 while work enqueued on the backend's stream has not finished (cudaStreamQuery): a
 * forward() without logits to return leaves its pass in flight. */
int cuda_backend_busy(const Backend *b);

#ifdef __cplusplus
}
#endif
#endif
