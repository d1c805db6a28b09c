/* K-quant x Q8 (per 32) dot kernels of the portable family (see cpu_kquant.h). Element order
 * and scale layout as quant.c's dequantization (ggml's). Integer ranges per 32-element
 * sub-block: Q5_K 32 * 31 * 127 * 63 < 2^23; Q6_K 2 * 16 * 32 * 127 * 128 < 2^24, so the
 * sums are exact in int32 and in their f32 conversion. */
#include "cpu_kquant.h"
#include "cpu_qmatmul.h"
#include "common/util.h"

#if defined(__GNUC__) && !defined(__clang__)
/* Uninstrumented and optimised even in the sanitizer build (as cpu_qk_*.c): the accesses
 * are the row ranges qk_matmul_rows computes. */
#define QK_HOT __attribute__((optimize("O3"), no_sanitize("address", "undefined")))
#define QK_INLINE static inline __attribute__((always_inline, no_sanitize_address, no_sanitize_undefined))
#else
#define QK_HOT
#define QK_INLINE static inline
#endif

QK_INLINE float f16_at(const uint8_t *p) { return quant_f16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }

/* The 8 sub-block scales and minimums of a Q4_K/Q5_K block from its 12 packed bytes: the
 * one place both kernel families unpack them. */
QK_INLINE void k4_scales(const uint8_t *packed, uint8_t sc[8], uint8_t m[8]) {
    for (int j = 0; j < 8; j++) quant_k4_scale_min(j, packed, &sc[j], &m[j]);
}

/* Q6_K quant k (0..3) of a 128-element half at position l (0..31): ql, qh are the half's
 * low-nibble and high-bit bytes; 0..63, the stored value plus 32. */
QK_INLINE int q6_quant(const uint8_t *ql, const uint8_t *qh, int k, int l) {
    return ((ql[l + 32 * (k & 1)] >> (4 * (k >> 1))) & 0xf) | (((qh[l] >> (2 * k)) & 3) << 4);
}

/* ---- portable ---- */

/* One Q4_K/Q5_K block against the 8 QkQ8 blocks of one token, added to acc in sub-block
 * order. */
QK_INLINE float q45_block_scalar(const uint8_t *w, const QkQ8 *x, int five, float acc) {
    uint8_t sc[8], m[8];
    k4_scales(w + 4, sc, m);
    float d = f16_at(w), dmin = f16_at(w + 2);
    const uint8_t *qh = w + 16, *qs = w + (five ? 48 : 16);
    for (int s = 0; s < 8; s++) {
        const uint8_t *q = qs + (s / 2) * 32;
        int shift = (s % 2) * 4, isum = 0;
        if (five) /* branch-free bodies the compiler can vectorize */
            for (int l = 0; l < 32; l++)
                isum += (((q[l] >> shift) & 0xf) | (((qh[l] >> s) & 1) << 4)) * x[s].q[l];
        else
            for (int l = 0; l < 32; l++) isum += ((q[l] >> shift) & 0xf) * x[s].q[l];
        acc += d * x[s].d * (float)(sc[s] * isum) - dmin * (float)m[s] * x[s].s;
    }
    return acc;
}

QK_INLINE void q45_scalar(const uint8_t *w, const void *const *xs, int nt, int in, float *out,
                          int five) {
    RS_ASSERT(in % QK_K == 0);
    size_t bb = five ? QK5_K_BYTES : QK4_K_BYTES;
    for (int t = 0; t < nt; t++) {
        const QkQ8 *x = xs[t];
        float acc = 0;
        for (int b = 0; b < in / QK_K; b++) acc = q45_block_scalar(w + bb * b, x + 8 * b, five, acc);
        out[t] = acc;
    }
}

QK_HOT void qk_dot_q4_K_scalar(const uint8_t *w, const void *const *xs, int nt, int in, float *out) {
    q45_scalar(w, xs, nt, in, out, 0);
}

QK_HOT void qk_dot_q5_K_scalar(const uint8_t *w, const void *const *xs, int nt, int in, float *out) {
    q45_scalar(w, xs, nt, in, out, 1);
}

/* Q6_K: sub-block s = 4h + k of half h has the scales of its two 16-element groups at
 * 8h + 2k and 8h + 2k + 1. */
QK_HOT void qk_dot_q6_K_scalar(const uint8_t *w, const void *const *xs, int nt, int in, float *out) {
    RS_ASSERT(in % QK_K == 0);
    for (int t = 0; t < nt; t++) {
        const QkQ8 *x = xs[t];
        float acc = 0;
        for (int b = 0; b < in / QK_K; b++) {
            const uint8_t *p = w + (size_t)QK6_K_BYTES * b;
            const int8_t *sc = (const int8_t *)(p + 192);
            float d = f16_at(p + 208);
            for (int s = 0; s < 8; s++) {
                int h = s / 4, k = s % 4, ia = 0, ib = 0;
                const QkQ8 *xb = &x[8 * b + s];
                for (int l = 0; l < 16; l++) {
                    ia += (q6_quant(p + 64 * h, p + 128 + 32 * h, k, l) - 32) * xb->q[l];
                    ib += (q6_quant(p + 64 * h, p + 128 + 32 * h, k, l + 16) - 32) * xb->q[l + 16];
                }
                acc += d * xb->d * (float)(sc[8 * h + 2 * k] * ia + sc[8 * h + 2 * k + 1] * ib);
            }
        }
        out[t] = acc;
    }
}
