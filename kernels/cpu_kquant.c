/* K-quant x Q8_K dot products, portable and AVX2. Per 256-element block both families
 * form the same exact integer sums (weight quants times activation quants, weighted by the
 * 6/8-bit sub-block scales; the Q4_K/Q5_K minimums and Q6_K's offset of 32 go through the
 * activation block sums) and then do the same f32 operations in the same order
 * (block_finish_*), which makes them bitwise interchangeable. Integer ranges: a Q5_K
 * block sums at most 256 * 31 * 127 * 63 < 2^31, a Q6_K block 256 * 32 * 127 * 128 < 2^31. */
#include "cpu_kquant.h"
#include "common/util.h"
#include <immintrin.h>
#include <math.h>
#include <string.h>

static inline float f16_at(const uint8_t *p) { return quant_f16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }

void quantize_row_q8_K(const float *x, BlockQ8K *y, int n) {
    RS_ASSERT(n % QK_K == 0);
    for (int b = 0; b < n / QK_K; b++, x += QK_K, y++) {
        float amax = 0, max = 0;
        for (int j = 0; j < QK_K; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        memset(y, 0, sizeof *y);
        if (amax == 0) continue;
        /* -127 / max (ggml's sign convention): the largest element maps to -127 exactly,
         * so every quant fits int8 without clamping to -128 (AVX2 maddubs stays in s16) */
        float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; j++) {
            long v = lrintf(iscale * x[j]);
            y->qs[j] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
            y->bsums[j / 16] = (int16_t)(y->bsums[j / 16] + y->qs[j]);
        }
        y->d = 1.0f / iscale;
    }
}

/* Unpacks the 8 sub-block scales into sc and returns the sum over sub-blocks of min[s]
 * times the activation sum of sub-block s (32 elements). */
static inline int32_t k4_unpack(const uint8_t *scales, const BlockQ8K *y, uint8_t sc[8]) {
    int32_t s = 0;
    for (int j = 0; j < 8; j++) {
        uint8_t m;
        quant_k4_scale_min(j, scales, &sc[j], &m);
        s += (int32_t)m * (y->bsums[2 * j] + y->bsums[2 * j + 1]);
    }
    return s;
}

/* A rounded product the compiler may not fuse into a multiply-add: the AVX2 functions are
 * compiled with FMA enabled, the portable ones maybe not, and under -ffp-contract=fast a
 * fused tail in one family only would break their bitwise agreement. */
static inline float rounded(float v) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    __asm__("" : "+x"(v));
#endif
    return v;
}

/* Shared f32 tail of one block: the only rounding steps, identical for every family. */
static inline float block_finish_k4(float acc, const uint8_t *w, const BlockQ8K *y, int32_t sumi,
                                    int32_t summ) {
    float d = rounded(f16_at(w) * y->d), dmin = rounded(f16_at(w + 2) * y->d);
    float a = rounded(d * (float)sumi), b = rounded(dmin * (float)summ);
    return acc + (a - b);
}

static inline float block_finish_q6(float acc, const uint8_t *w, const BlockQ8K *y, int32_t sumi) {
    float d = rounded(f16_at(w + 208) * y->d);
    return acc + rounded(d * (float)sumi);
}

/* ---- portable ---- */

/* Q4_K / Q5_K block: sum over sub-blocks s of scale[s] * sum_l q[s][l] * y[32s + l]. */
static int32_t q45_sumi_scalar(const uint8_t *w, const BlockQ8K *y, int five, const uint8_t *sc) {
    const uint8_t *qh = w + 16, *qs = w + (five ? 48 : 16);
    int32_t sumi = 0;
    for (int s = 0; s < 8; s++) {
        const uint8_t *q = qs + (s / 2) * 32;
        const int8_t *a = y->qs + 32 * s;
        int shift = (s % 2) * 4;
        int32_t isum = 0;
        /* branch-free bodies the compiler can vectorize */
        if (five)
            for (int l = 0; l < 32; l++)
                isum += (((q[l] >> shift) & 0x0f) | (((qh[l] >> s) & 1) << 4)) * a[l];
        else
            for (int l = 0; l < 32; l++) isum += ((q[l] >> shift) & 0x0f) * a[l];
        sumi += (int32_t)sc[s] * isum;
    }
    return sumi;
}

static float dot_q45_scalar(int n, const uint8_t *w, const BlockQ8K *y, int five) {
    RS_ASSERT(n % QK_K == 0);
    size_t bb = five ? QK5_K_BYTES : QK4_K_BYTES;
    float acc = 0;
    for (int b = 0; b < n / QK_K; b++, w += bb, y++) {
        uint8_t sc[8];
        int32_t summ = k4_unpack(w + 4, y, sc);
        acc = block_finish_k4(acc, w, y, q45_sumi_scalar(w, y, five, sc), summ);
    }
    return acc;
}

float dot_q4_K_q8_K_scalar(int n, const void *w_row, const void *x_q8) {
    return dot_q45_scalar(n, w_row, x_q8, 0);
}

float dot_q5_K_q8_K_scalar(int n, const void *w_row, const void *x_q8) {
    return dot_q45_scalar(n, w_row, x_q8, 1);
}

/* Q6_K block: sum over 16-groups g of scale[g] * sum (q - 32) * y; element order as in
 * quant.c's deq_q6_K (128-element halves, four 32-runs each). */
static int32_t q6_sumi_scalar(const uint8_t *w, const BlockQ8K *y) {
    const uint8_t *ql = w, *qh = w + 128;
    const int8_t *sc = (const int8_t *)(w + 192), *a = y->qs;
    int32_t sumi = 0;
    for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, a += 128) {
        for (int is = 0; is < 2; is++) { /* 16-element groups: plain loops that vectorize */
            int32_t g0 = 0, g1 = 0, g2 = 0, g3 = 0;
            for (int l = 16 * is; l < 16 * is + 16; l++) {
                g0 += (((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32) * a[l];
                g1 += (((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32) * a[l + 32];
                g2 += (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32) * a[l + 64];
                g3 += (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32) * a[l + 96];
            }
            sumi += sc[is] * g0 + sc[is + 2] * g1 + sc[is + 4] * g2 + sc[is + 6] * g3;
        }
    }
    return sumi;
}

float dot_q6_K_q8_K_scalar(int n, const void *w_row, const void *x_q8) {
    RS_ASSERT(n % QK_K == 0);
    const uint8_t *w = w_row;
    const BlockQ8K *y = x_q8;
    float acc = 0;
    for (int b = 0; b < n / QK_K; b++, w += QK6_K_BYTES, y++)
        acc = block_finish_q6(acc, w, y, q6_sumi_scalar(w, y));
    return acc;
}

/* ---- AVX2 ---- */

#define AVX2_FN __attribute__((target("avx2,fma")))

AVX2_FN static inline int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* Bit `s` of every byte of hb moved to bit 4 (Q5_K's fifth bit of sub-block s). A 16-bit
 * shift is fine: the mask keeps only bit 0 of each byte, which came from the same byte. */
AVX2_FN static inline __m256i fifth_bit(__m256i hb, int s) {
    __m256i b = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(s)), _mm256_set1_epi8(1));
    return _mm256_slli_epi16(b, 4);
}

AVX2_FN static int32_t q45_sumi_avx2(const uint8_t *w, const BlockQ8K *y, int five,
                                     const uint8_t *sc) {
    const uint8_t *qs = w + (five ? 48 : 16);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i hb = five ? _mm256_loadu_si256((const __m256i *)(w + 16)) : _mm256_setzero_si256();
    __m256i acc = _mm256_setzero_si256();
    for (int p = 0; p < 4; p++) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * p));
        __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (five) {
            lo = _mm256_or_si256(lo, fifth_bit(hb, 2 * p));
            hi = _mm256_or_si256(hi, fifth_bit(hb, 2 * p + 1));
        }
        /* u8 x s8 pairs into s16: at most 2 * 31 * 127, no saturation */
        __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(y->qs + 64 * p)));
        __m256i p1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(y->qs + 64 * p + 32)));
        p0 = _mm256_madd_epi16(p0, _mm256_set1_epi16(sc[2 * p]));
        p1 = _mm256_madd_epi16(p1, _mm256_set1_epi16(sc[2 * p + 1]));
        acc = _mm256_add_epi32(acc, _mm256_add_epi32(p0, p1));
    }
    return hsum_i32(acc);
}

AVX2_FN static float dot_q45_avx2(int n, const uint8_t *w, const BlockQ8K *y, int five) {
    RS_ASSERT(n % QK_K == 0);
    size_t bb = five ? QK5_K_BYTES : QK4_K_BYTES;
    float acc = 0;
    for (int b = 0; b < n / QK_K; b++, w += bb, y++) {
        uint8_t sc[8];
        int32_t summ = k4_unpack(w + 4, y, sc);
        acc = block_finish_k4(acc, w, y, q45_sumi_avx2(w, y, five, sc), summ);
    }
    return acc;
}

AVX2_FN float dot_q4_K_q8_K_avx2(int n, const void *w_row, const void *x_q8) {
    return dot_q45_avx2(n, w_row, x_q8, 0);
}

AVX2_FN float dot_q5_K_q8_K_avx2(int n, const void *w_row, const void *x_q8) {
    return dot_q45_avx2(n, w_row, x_q8, 1);
}

/* Q6_K: the 6-bit quants stay unsigned (0..63) for maddubs; the offset of 32 is taken off
 * afterwards as 32 * sum_g scale[g] * bsums[g]. */
AVX2_FN static int32_t q6_sumi_avx2(const uint8_t *w, const BlockQ8K *y) {
    const int8_t *sc = (const int8_t *)(w + 192);
    const __m256i m4 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(3);
    __m256i acc = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        __m256i ql0 = _mm256_loadu_si256((const __m256i *)(w + 64 * h));
        __m256i ql1 = _mm256_loadu_si256((const __m256i *)(w + 64 * h + 32));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * h));
        __m256i q[4];
        q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
        q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4));
        q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4));
        q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4));
        for (int k = 0; k < 4; k++) {
            const int8_t *s = sc + 8 * h + 2 * k; /* s16 lanes 0-7: elements 0-15, 8-15: 16-31 */
            __m256i scv = _mm256_setr_m128i(_mm_set1_epi16(s[0]), _mm_set1_epi16(s[1]));
            __m256i a = _mm256_loadu_si256((const __m256i *)(y->qs + 128 * h + 32 * k));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], a), scv));
        }
    }
    int32_t off = 0;
    for (int g = 0; g < 16; g++) off += sc[g] * y->bsums[g];
    return hsum_i32(acc) - 32 * off;
}

AVX2_FN float dot_q6_K_q8_K_avx2(int n, const void *w_row, const void *x_q8) {
    RS_ASSERT(n % QK_K == 0);
    const uint8_t *w = w_row;
    const BlockQ8K *y = x_q8;
    float acc = 0;
    for (int b = 0; b < n / QK_K; b++, w += QK6_K_BYTES, y++)
        acc = block_finish_q6(acc, w, y, q6_sumi_avx2(w, y));
    return acc;
}

KquantDotFn kquant_dot_fn(uint32_t type, int avx2) {
    switch (type) {
    case QT_Q4_K: return avx2 ? dot_q4_K_q8_K_avx2 : dot_q4_K_q8_K_scalar;
    case QT_Q5_K: return avx2 ? dot_q5_K_q8_K_avx2 : dot_q5_K_q8_K_scalar;
    case QT_Q6_K: return avx2 ? dot_q6_K_q8_K_avx2 : dot_q6_K_q8_K_scalar;
    default: return NULL;
    }
}

int kquant_cpu_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
