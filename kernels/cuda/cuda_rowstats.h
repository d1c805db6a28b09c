/* The verifier's row queries on the device (kernels/cuda/cuda_rowstats.cu), callable from C: what
 * backend_rows_stats and backend_rows_gather compute on the CUDA backend, over logits rows
 * that stay in device memory. Same canonical order as common/logits.h (row_stats), so the
 * CPU emulator reproduces the CPU reference bit for bit; on a GPU only the device's exp
 * and log differ (<= 1 ulp each). */
#ifndef ROOTSPEC_CUDA_ROWSTATS_H
#define ROOTSPEC_CUDA_ROWSTATS_H
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "common/logits.h"

/* Bytes of cuk_rows_stats' scratch for n rows of V logits. */
size_t cuk_rows_stats_scratch_bytes(int n, int V);
/* out[i] = row_stats of logits row rows[i] (logits: (*, V) f32) under the sampling law
 * smp (a host pointer, passed by value); u: NULL or (n) uniforms (u[i] < 0: no draw).
 * scratch: cuk_rows_stats_scratch_bytes(n, V) device bytes, ZEROED once before the first
 * use (each launch leaves its counters at zero). Up to 16 256-thread blocks per row; one
 * launch when greedy, two when sampling, and a filter's cut between them: four launches
 * for each of top-k's and top-p's radix selects (min-p rides on the first, or has one of
 * its own), each over all n rows. The other pointers are device memory. */
void cuk_rows_stats(cudaStream_t s, const float *logits, int V, const int *rows, int n,
                    const Sampling *smp, const double *u, void *scratch, RowStats *out);
/* out[i] = logits[rows[i] * V + ids[i]], i < n. */
void cuk_rows_gather(cudaStream_t s, const float *logits, int V, const int *rows,
                     const int *ids, int n, float *out);

#ifdef __cplusplus
}
#endif
#endif
