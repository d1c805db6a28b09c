/* Small-batch matrix product for the CPU backend: Y (n, out) = X (n, in) @ W^T. For the
 * few-token passes of speculative decoding (root pass, drafter expansion of 10 nodes)
 * OpenBLAS's sgemm spends most of its time packing (copying) W; this kernel streams each
 * weight row once and reuses it for all n tokens from L1. */
#ifndef ROOTSPEC_CPU_MATMUL_H
#define ROOTSPEC_CPU_MATMUL_H

#define CPU_MATMUL_SMALL_MAX 16 /* largest n the small kernel handles */

/* Rows [j0, j1) of the output only (callers may split rows across threads). */
void cpu_matmul_small(float *y, int ldy, const float *x, const float *w, int n, int in, int j0,
                      int j1);

#endif
