/* Portable kernel family (see cpu_qmatmul.h) and the ref family built on it. Plain C:
 * without -ffast-math (and with ISO C's fp-contract=off) the compiler keeps each token's
 * operations in source order, which is what makes the result independent of how many
 * tokens share a call. */
#include "cpu_qmatmul.h"
#include "cpu_kquant.h"
#include "common/quant.h"
#include <string.h>

#if defined(__GNUC__) && !defined(__clang__)
/* Uninstrumented and optimised even in the sanitizer build: the accesses are the row
 * ranges qk_matmul_rows computes, and instrumented inner loops made the tests crawl. */
#define QK_HOT __attribute__((optimize("O3"), no_sanitize("address", "undefined")))
#else
#define QK_HOT
#endif

static inline float ld_f32(const uint8_t *p) {
    float v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float ld_f16(const uint8_t *p) { return quant_f16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }

/* 16 partial sums per token, folded in a fixed tree. */
QK_HOT static void dot_f32(const uint8_t *w, const void *const *xs, int nt, int in, float *out) {
    int in16 = in & ~15;
    for (int t = 0; t < nt; t++) {
        const float *x = xs[t];
        float a[16] = {0};
        for (int k = 0; k < in16; k += 16)
            for (int l = 0; l < 16; l++) a[l] += ld_f32(w + 4 * (size_t)(k + l)) * x[k + l];
        for (int l = 0; l < 8; l++) a[l] += a[l + 8];
        for (int l = 0; l < 4; l++) a[l] += a[l + 4];
        float s = (a[0] + a[2]) + (a[1] + a[3]);
        for (int k = in16; k < in; k++) s += ld_f32(w + 4 * (size_t)k) * x[k];
        out[t] = s;
    }
}

/* Integer blocks: isum = sum(qw * qx) exactly in int, then one float update per block. */
QK_HOT static void dot_q8_0(const uint8_t *w, const void *const *xs, int nt, int in, float *out) {
    int nb = in / QK_BLOCK;
    for (int t = 0; t < nt; t++) {
        const QkQ8 *x = xs[t];
        float acc = 0;
        for (int b = 0; b < nb; b++) {
            const uint8_t *p = w + 34 * (size_t)b;
            const int8_t *q = (const int8_t *)(p + 2);
            int isum = 0;
            for (int i = 0; i < QK_BLOCK; i++) isum += q[i] * x[b].q[i];
            acc += ld_f16(p) * x[b].d * (float)isum;
        }
        out[t] = acc;
    }
}

QK_HOT static void dot_q4_0(const uint8_t *w, const void *const *xs, int nt, int in, float *out) {
    int nb = in / QK_BLOCK;
    for (int t = 0; t < nt; t++) {
        const QkQ8 *x = xs[t];
        float acc = 0;
        for (int b = 0; b < nb; b++) {
            const uint8_t *p = w + 18 * (size_t)b, *q = p + 2;
            int isum = 0;
            for (int i = 0; i < 16; i++)
                isum += (q[i] & 15) * x[b].q[i] + (q[i] >> 4) * x[b].q[i + 16];
            acc += ld_f16(p) * (x[b].d * (float)isum - 8.0f * x[b].s);
        }
        out[t] = acc;
    }
}

QK_HOT static void dot_q4_1(const uint8_t *w, const void *const *xs, int nt, int in, float *out) {
    int nb = in / QK_BLOCK;
    for (int t = 0; t < nt; t++) {
        const QkQ8 *x = xs[t];
        float acc = 0;
        for (int b = 0; b < nb; b++) {
            const uint8_t *p = w + 20 * (size_t)b, *q = p + 4;
            int isum = 0;
            for (int i = 0; i < 16; i++)
                isum += (q[i] & 15) * x[b].q[i] + (q[i] >> 4) * x[b].q[i + 16];
            acc += ld_f16(p) * x[b].d * (float)isum + ld_f16(p + 2) * x[b].s;
        }
        out[t] = acc;
    }
}

/* Q5_0 / Q5_1: Q4's nibbles plus a fifth bit per element from the block's u32 qh. */
QK_HOT static void dot_q5(const uint8_t *w, const void *const *xs, int nt, int in, float *out,
                          int one) {
    int nb = in / QK_BLOCK;
    size_t bytes = one ? 24 : 22;
    for (int t = 0; t < nt; t++) {
        const QkQ8 *x = xs[t];
        float acc = 0;
        for (int b = 0; b < nb; b++) {
            const uint8_t *p = w + bytes * (size_t)b, *h = p + (one ? 4 : 2), *q = h + 4;
            uint32_t qh = quant_le32(h);
            int isum = 0;
            for (int i = 0; i < 16; i++)
                isum += ((q[i] & 15) | (int)((qh >> i) & 1) << 4) * x[b].q[i] +
                        ((q[i] >> 4) | (int)((qh >> (i + 16)) & 1) << 4) * x[b].q[i + 16];
            if (one) acc += ld_f16(p) * x[b].d * (float)isum + ld_f16(p + 2) * x[b].s;
            else acc += ld_f16(p) * (x[b].d * (float)isum - 16.0f * x[b].s);
        }
        out[t] = acc;
    }
}

QK_HOT static void dot_q5_0(const uint8_t *w, const void *const *xs, int nt, int in, float *out) {
    dot_q5(w, xs, nt, in, out, 0);
}

QK_HOT static void dot_q5_1(const uint8_t *w, const void *const *xs, int nt, int in, float *out) {
    dot_q5(w, xs, nt, in, out, 1);
}

static const QkKernel kScalar[] = {
    {QT_F32, 0, dot_f32, NULL, 0, NULL},
    {QT_Q8_0, 1, dot_q8_0, NULL, 0, NULL},
    {QT_Q4_0, 1, dot_q4_0, NULL, 0, NULL},
    {QT_Q4_1, 1, dot_q4_1, NULL, 0, NULL},
    {QT_Q5_0, 1, dot_q5_0, NULL, 0, NULL},
    {QT_Q5_1, 1, dot_q5_1, NULL, 0, NULL},
    {QT_Q4_K, 1, qk_dot_q4_K_scalar, NULL, 0, NULL},
    {QT_Q5_K, 1, qk_dot_q5_K_scalar, NULL, 0, NULL},
    {QT_Q6_K, 1, qk_dot_q6_K_scalar, NULL, 0, NULL},
};

const QkFamily qk_family_scalar = {"scalar", kScalar, (int)(sizeof kScalar / sizeof kScalar[0]),
                                   dot_f32, NULL, NULL, NULL, NULL, NULL, NULL};
/* No kernel of its own: every type is expanded to f32 and multiplied in f32. */
const QkFamily qk_family_ref = {"ref", NULL, 0, dot_f32, NULL, NULL, NULL, NULL, NULL, NULL};
