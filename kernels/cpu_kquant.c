/* K-quant x Q8 (per 32) dot kernels, portable and AVX2 (see cpu_kquant.h). Element order
 * and scale layout as quant.c's dequantization (ggml's). Integer ranges per 32-element
 * sub-block: Q5_K 32 * 31 * 127 * 63 < 2^23; Q6_K 2 * 16 * 32 * 127 * 128 < 2^24, so the
 * sums are exact in int32 and in their f32 conversion. */
#include "cpu_kquant.h"
#include "cpu_qmatmul.h"
#include "common/util.h"
#include <immintrin.h>
#include <string.h>

#if defined(__GNUC__) && !defined(__clang__)
/* Uninstrumented and optimised even in the sanitizer build (as cpu_qmm_*.c): the accesses
 * are the row ranges qk_matmul_rows computes. */
#define KQ_HOT __attribute__((optimize("O3"), no_sanitize("address", "undefined")))
#define KQ_INLINE static inline __attribute__((always_inline, no_sanitize_address, no_sanitize_undefined))
#else
#define KQ_HOT
#define KQ_INLINE static inline
#endif

KQ_INLINE float f16_at(const uint8_t *p) { return quant_f16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }

/* The 8 sub-block scales and minimums of a Q4_K/Q5_K block from its 12 packed bytes: the
 * one place both kernel families unpack them. */
KQ_INLINE void k4_scales(const uint8_t *packed, uint8_t sc[8], uint8_t m[8]) {
    for (int j = 0; j < 8; j++) quant_k4_scale_min(j, packed, &sc[j], &m[j]);
}

/* Q6_K quant k (0..3) of a 128-element half at position l (0..31): ql, qh are the half's
 * low-nibble and high-bit bytes; 0..63, the stored value plus 32. */
KQ_INLINE int q6_quant(const uint8_t *ql, const uint8_t *qh, int k, int l) {
    return ((ql[l + 32 * (k & 1)] >> (4 * (k >> 1))) & 0xf) | (((qh[l] >> (2 * k)) & 3) << 4);
}

/* ---- portable ---- */

/* One Q4_K/Q5_K block against the 8 QkQ8 blocks of one token, added to acc in sub-block
 * order. */
KQ_INLINE float q45_block_scalar(const uint8_t *w, const QkQ8 *x, int five, float acc) {
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

KQ_INLINE void q45_scalar(const uint8_t *w, const void *const *xs, int nt, int in, float *out,
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

KQ_HOT void kq_dot_q4_K_scalar(const uint8_t *w, const void *const *xs, int nt, int in, float *out) {
    q45_scalar(w, xs, nt, in, out, 0);
}

KQ_HOT void kq_dot_q5_K_scalar(const uint8_t *w, const void *const *xs, int nt, int in, float *out) {
    q45_scalar(w, xs, nt, in, out, 1);
}

/* Q6_K: sub-block s = 4h + k of half h has the scales of its two 16-element groups at
 * 8h + 2k and 8h + 2k + 1. */
KQ_HOT void kq_dot_q6_K_scalar(const uint8_t *w, const void *const *xs, int nt, int in, float *out) {
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

/* ---- AVX2 ---- */

#define AVX2_FN __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE KQ_INLINE AVX2_FN

AVX2_INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Unsigned quants v (32 of sub-block s, element order) times each token's sub-block,
 * scaled: acc[t] += (d dx) * (i32 lanes of sc16 * pair sums). sc16 holds the scale per i16
 * lane pair (Q6_K: two 16-element groups); signed weights come as |q| and their signs. */
AVX2_INLINE void sub_fma(__m256i v, __m256i sign, int use_sign, __m256i sc16, float d,
                         const QkQ8 *const *x, int s, int NT, __m256 *acc) {
    for (int t = 0; t < NT; t++) {
        __m256i xq = _mm256_loadu_si256((const __m256i *)(const void *)x[t][s].q);
        if (use_sign) xq = _mm256_sign_epi8(xq, sign);
        __m256i i32 = _mm256_madd_epi16(_mm256_maddubs_epi16(v, xq), sc16);
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i32), _mm256_set1_ps(d * x[t][s].d), acc[t]);
    }
}

/* One Q6_K block against NT tokens: quants rebuilt unsigned (0..63), minus 32 as signed
 * bytes, multiplied as |q - 32| with the sign moved onto the activations. The two high
 * bits of group k go straight to bits 4-5 (one shift and a mask: a 16-bit shift only moves
 * other bytes' bits into the masked-off ones), and a half's 8 scales are widened once and
 * picked per group by a byte shuffle. */
AVX2_INLINE void q6_block_avx2(const uint8_t *w, const QkQ8 *const *x, int NT, __m256 *acc) {
    const int8_t *sc = (const int8_t *)(w + 192);
    float d = f16_at(w + 208);
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30), k32 = _mm256_set1_epi8(32);
    for (int h = 0; h < 2; h++) {
        __m256i ql0 = _mm256_loadu_si256((const __m256i *)(const void *)(w + 64 * h));
        __m256i ql1 = _mm256_loadu_si256((const __m256i *)(const void *)(w + 64 * h + 32));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(const void *)(w + 128 + 32 * h));
        __m256i lo[4] = {_mm256_and_si256(ql0, m4), _mm256_and_si256(ql1, m4),
                         _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                         _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4)};
        __m256i hi[4] = {_mm256_slli_epi16(qh, 4), _mm256_slli_epi16(qh, 2), qh,
                         _mm256_srli_epi16(qh, 2)};
        /* the half's scales as i16 in both lanes: [s0 .. s7 | s0 .. s7] */
        __m256i s16 = _mm256_broadcastsi128_si256(
            _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)(sc + 8 * h))));
        for (int k = 0; k < 4; k++) {
            __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo[k], _mm256_and_si256(hi[k], m30)), k32);
            /* i16 lanes 0-7 (elements 0-15): scale 2k; lanes 8-15: scale 2k + 1 */
            char a = (char)(4 * k), b = (char)(4 * k + 2);
            __m256i pick = _mm256_setr_epi8(a, a + 1, a, a + 1, a, a + 1, a, a + 1, a, a + 1, a,
                                            a + 1, a, a + 1, a, a + 1, b, b + 1, b, b + 1, b,
                                            b + 1, b, b + 1, b, b + 1, b, b + 1, b, b + 1, b, b + 1);
            __m256i sc16 = _mm256_shuffle_epi8(s16, pick);
            sub_fma(_mm256_sign_epi8(q, q), q, 1, sc16, d, x, 4 * h + k, NT, acc);
        }
    }
}

AVX2_INLINE void q6_avx2(const uint8_t *w, const void *const *xs, int NT, int in, float *out) {
    __m256 acc[QK_GROUP];
    const QkQ8 *x[QK_GROUP];
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps(), x[t] = xs[t];
    for (int b = 0; b < in / QK_K; b++) {
        const QkQ8 *xb[QK_GROUP];
        for (int t = 0; t < NT; t++) xb[t] = x[t] + 8 * b;
        q6_block_avx2(w + (size_t)QK6_K_BYTES * b, xb, NT, acc);
    }
    for (int t = 0; t < NT; t++) out[t] = hsum8(acc[t]);
}

/* Entry points: the body instantiated per token count (same per-token operations). */
#define KQ_ENTRY(name, call)                                                                 \
    KQ_HOT AVX2_FN void name(const uint8_t *w, const void *const *xs, int nt, int in,        \
                             float *out) {                                                   \
        RS_ASSERT(in % QK_K == 0);                                                           \
        switch (nt) {                                                                        \
        case 1: call(1); break;                                                              \
        case 2: call(2); break;                                                              \
        case 3: call(3); break;                                                              \
        default: call(4); break;                                                             \
        }                                                                                    \
    }
#define C_Q6K(N) q6_avx2(w, xs, N, in, out)
KQ_ENTRY(kq_dot_q6_K_avx2, C_Q6K)
