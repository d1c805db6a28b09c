/* Small-batch X @ W^T (see cpu_matmul.h). Compiled for AVX-512, AVX2+FMA and baseline x86-64
 * with GCC target_clones, chosen at load time from cpuid, so one binary runs everywhere. The
 * 16 independent accumulators let the compiler vectorise without -ffast-math (the lanes are
 * never reassociated across a reduction it has to preserve). */
#include "cpu_matmul.h"
#include <stddef.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define RS_CLONES __attribute__((target_clones("avx512f", "arch=haswell", "default")))
#else
#define RS_CLONES
#endif
/* The sanitizer build (make test) leaves this inner loop uninstrumented and optimised: its
 * only memory accesses are the row ranges computed below, and instrumenting every
 * multiply-add made the 100,000 tiny exactness decodes five times slower. */
#if defined(__GNUC__) && !defined(__clang__)
#define RS_HOT __attribute__((optimize("O3"), no_sanitize("address", "undefined")))
#else
#define RS_HOT
#endif

/* Four tokens against one weight row: each loaded weight vector feeds four FMAs. */
RS_HOT static inline __attribute__((always_inline)) void dot4(const float *wr, const float *x0, const float *x1, const float *x2,
                        const float *x3, int in, float *d) {
    int in16 = in & ~15;
    float a0[16] = {0}, a1[16] = {0}, a2[16] = {0}, a3[16] = {0};
    for (int k = 0; k < in16; k += 16)
        for (int l = 0; l < 16; l++) {
            float wv = wr[k + l];
            a0[l] += wv * x0[k + l];
            a1[l] += wv * x1[k + l];
            a2[l] += wv * x2[k + l];
            a3[l] += wv * x3[k + l];
        }
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int l = 0; l < 16; l++) {
        s0 += a0[l];
        s1 += a1[l];
        s2 += a2[l];
        s3 += a3[l];
    }
    for (int k = in16; k < in; k++) {
        s0 += wr[k] * x0[k];
        s1 += wr[k] * x1[k];
        s2 += wr[k] * x2[k];
        s3 += wr[k] * x3[k];
    }
    d[0] = s0;
    d[1] = s1;
    d[2] = s2;
    d[3] = s3;
}

RS_CLONES RS_HOT
void cpu_matmul_small(float *y, int ldy, const float *x, const float *w, int n, int in, int j0,
                      int j1) {
    int n4 = (n + 3) / 4;
    for (int j = j0; j < j1; j++) {
        const float *wr = w + (size_t)j * in;
        for (int b = 0; b < n4; b++) {
            /* a short last block repeats its last token; only real outputs are stored */
            const float *xs[4];
            for (int q = 0; q < 4; q++) {
                int t = 4 * b + q < n ? 4 * b + q : n - 1;
                xs[q] = x + (size_t)t * in;
            }
            float d[4];
            dot4(wr, xs[0], xs[1], xs[2], xs[3], in, d);
            for (int q = 0; q < 4 && 4 * b + q < n; q++) y[(size_t)(4 * b + q) * ldy + j] = d[q];
        }
    }
}
