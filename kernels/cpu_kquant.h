/* Dot products of K-quant weight rows (Q4_K, Q5_K, Q6_K) with activations quantized per
 * 256-element block to int8 (Q8_K, ggml's block_q8_K layout), the way llama.cpp's CPU
 * path multiplies integer weights: integer sums per block, one f32 multiply-add per block.
 *
 * Each type has a portable (_scalar) and an AVX2 (_avx2, compiled with a function target
 * attribute so the binary runs on any x86-64; call it only where the CPU has AVX2) kernel.
 * Both compute the same exact integer sums per block and accumulate blocks in the same
 * f32 order, so for a given input they return bitwise the same value: a row's result does
 * not depend on which kernel family the dispatcher picked. */
#ifndef ROOTSPEC_CPU_KQUANT_H
#define ROOTSPEC_CPU_KQUANT_H
#include "common/quant.h"
#include <stdint.h>

/* One block of activations: x[i] ~= d * qs[i], |qs| <= 127, bsums[g] = sum of qs[16g..16g+15]
 * (the weight minimums and Q6_K's offset of 32 are applied through bsums). 292 bytes. */
typedef struct {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
} BlockQ8K;

/* x (n) -> y (n / QK_K blocks); n a multiple of QK_K. Round to nearest (ties to even). */
void quantize_row_q8_K(const float *x, BlockQ8K *y, int n);

/* sum_i w[i] * x[i] over n elements (a multiple of QK_K): w_row holds n / QK_K weight
 * blocks of the named type (any alignment), x_q8 n / QK_K BlockQ8K. */
float dot_q4_K_q8_K_scalar(int n, const void *w_row, const void *x_q8);
float dot_q5_K_q8_K_scalar(int n, const void *w_row, const void *x_q8);
float dot_q6_K_q8_K_scalar(int n, const void *w_row, const void *x_q8);
float dot_q4_K_q8_K_avx2(int n, const void *w_row, const void *x_q8);
float dot_q5_K_q8_K_avx2(int n, const void *w_row, const void *x_q8);
float dot_q6_K_q8_K_avx2(int n, const void *w_row, const void *x_q8);

typedef float (*KquantDotFn)(int n, const void *w_row, const void *x_q8);
/* The kernel for a K-quant ggml type (QT_Q4_K/QT_Q5_K/QT_Q6_K), AVX2 when avx2 != 0;
 * NULL for other types. */
KquantDotFn kquant_dot_fn(uint32_t type, int avx2);
/* 1 if this CPU runs the _avx2 kernels (AVX2 and FMA). */
int kquant_cpu_has_avx2(void);

#endif
