/* CPU reference operations (see cpu_ops.h). They favour matching transformers' arithmetic
 * over speed: this is the reference the CUDA backend and the golden tests are checked
 * against. cpu_matmul is the portable f32 kernel of kernels/cpu/cpu_qmatmul.h (the backend
 * itself multiplies stored-type weights through the dispatched family); attention is
 * one (token, head) at a time so the backend can split pairs across threads, its entries
 * four at a time with each entry's arithmetic that of the plain one-entry loops. */
#include "cpu_ops.h"
#include "cpu_qmatmul.h"
#include <math.h>
#include <string.h>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

/* Exactly as transformers computes them: float32 of 1 / theta^(2i/d), then (optionally)
 * _compute_llama3_parameters' smoothing. */
void rope_inv_freq(const Config *c, float *inv_freq) {
    int half = c->head_dim / 2;
    for (int i = 0; i < half; i++) {
        float expo = (float)(2 * i) / (float)c->head_dim;
        inv_freq[i] = (float)(1.0 / pow((double)c->rope_theta, (double)expo));
    }
    if (!c->rope_scaling) return;
    double factor = c->rope_factor, lo = c->rope_low_freq_factor, hi = c->rope_high_freq_factor;
    double old_ctx = c->rope_orig_max_pos;
    double lo_wavelen = old_ctx / lo, hi_wavelen = old_ctx / hi;
    for (int i = 0; i < half; i++) {
        double f = inv_freq[i];
        double wavelen = 2.0 * M_PI / f;
        double scaled = wavelen > lo_wavelen ? f / factor : f;
        if (!(wavelen < hi_wavelen) && !(wavelen > lo_wavelen)) {
            double smooth = (old_ctx / wavelen - lo) / (hi - lo);
            scaled = (1.0 - smooth) * scaled / factor + smooth * scaled;
        }
        inv_freq[i] = (float)scaled;
    }
}

void cpu_rmsnorm(float *o, const float *x, const float *w, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) o[i] = w[i] * (x[i] * r);
}

void cpu_embed(float *x, const float *emb, const int *tokens, int n, int dim) {
    for (int t = 0; t < n; t++)
        memcpy(x + (size_t)t * dim, emb + (size_t)tokens[t] * dim, dim * sizeof(float));
}

void cpu_bias_add(float *x, const float *bias, int n) {
    for (int i = 0; i < n; i++) x[i] += bias[i];
}

void cpu_rope_table(const int *pos, const float *inv_freq, int n, int half, float *cos_t,
                    float *sin_t) {
    for (int t = 0; t < n; t++)
        for (int i = 0; i < half; i++) {
            float ang = (float)pos[t] * inv_freq[i];
            cos_t[(size_t)t * half + i] = (float)cos((double)ang);
            sin_t[(size_t)t * half + i] = (float)sin((double)ang);
        }
}

void cpu_rope(float *v, const float *cs, const float *sn, int half) {
    for (int i = 0; i < half; i++) {
        float a = v[i], b = v[i + half];
        v[i] = a * cs[i] - b * sn[i];
        v[i + half] = b * cs[i] + a * sn[i];
    }
}

void cpu_matmul(float *y, const float *x, const float *w, int n, int in, int out, int ldy) {
    QTensor qt = qtensor_f32(w, out, in);
    QkActs a = {.f32 = x, .n = n, .in = in};
    qk_matmul_rows(&qk_family_scalar, &qt, &a, y, ldy, 0, out, NULL); /* F32: no scratch */
}

void cpu_attention_index(const uint8_t *mask, int n, int n_pending, int max_pending, int *idx,
                         int *cnt) {
    int np = n_pending;
    for (int t = 0; t < n; t++) {
        int *it = idx + (size_t)t * max_pending, k = 0;
        for (int j = 0; j < np + n; j++) {
            int ok = mask ? mask[(size_t)t * (np + n) + j] != 0 : j < np + t + 1;
            if (ok) it[k++] = j;
        }
        cnt[t] = k;
    }
}

/* Dot product with 8 independent partial sums: a single running sum is one long
 * dependency chain that the compiler may not reorder (no -ffast-math), which made
 * attention a large share of a 65-token pass. Lane k sums elements k, k+8, ... : the same
 * result whether the compiler keeps the lanes in scalars, two SSE or one AVX register. */
static float dot(const float *restrict a, const float *restrict b, int n) {
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += a[i + k] * b[i + k];
    float d = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; i++) d += a[i] * b[i];
    return d;
}

/* o[i] += a * v[i]: element-wise, so vector width does not change the result; restrict
 * lets it vectorize (a scalar loop here dominated attention's time). */
static void axpy(float *restrict o, float a, const float *restrict v, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) /* blocks of 8: -O2 vectorizes straight-line code only */
        for (int k = 0; k < 8; k++) o[i + k] += a * v[i + k];
    for (; i < n; i++) o[i] += a * v[i];
}

/* dot() of a with ATT_E rows b[e] at once, each with exactly dot()'s operations (bitwise
 * equal: SSE lanes are IEEE single operations like the scalar ones, no FMA): the rows'
 * chains interleave and a's loads are shared. */
#define ATT_E 4
#if defined(__GNUC__) && !defined(__clang__)
#define ATT_UNROLL _Pragma("GCC unroll 4") /* -O2 leaves the e loops rolled, acc in memory */
#else
#define ATT_UNROLL
#endif
static void dot_e(const float *restrict a, const float *const *b, int n, float *out) {
    float c[ATT_E][8] = {{0}}; /* dot()'s acc per row */
    int i = 0;
#if defined(__SSE2__)
    __m128 lo[ATT_E], hi[ATT_E]; /* lanes 0-3 and 4-7 of acc */
    ATT_UNROLL
    for (int e = 0; e < ATT_E; e++) lo[e] = hi[e] = _mm_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        __m128 a0 = _mm_loadu_ps(a + i), a1 = _mm_loadu_ps(a + i + 4);
        ATT_UNROLL
        for (int e = 0; e < ATT_E; e++) {
            lo[e] = _mm_add_ps(lo[e], _mm_mul_ps(a0, _mm_loadu_ps(b[e] + i)));
            hi[e] = _mm_add_ps(hi[e], _mm_mul_ps(a1, _mm_loadu_ps(b[e] + i + 4)));
        }
    }
    for (int e = 0; e < ATT_E; e++) _mm_storeu_ps(c[e], lo[e]), _mm_storeu_ps(c[e] + 4, hi[e]);
#else
    for (; i + 8 <= n; i += 8)
        for (int e = 0; e < ATT_E; e++)
            for (int k = 0; k < 8; k++) c[e][k] += a[i + k] * b[e][i + k];
#endif
    for (int e = 0; e < ATT_E; e++) {
        const float *v = c[e];
        float d = ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
        for (int j = i; j < n; j++) d += a[j] * b[e][j];
        out[e] = d;
    }
}

/* axpy() of ATT_E rows in entry order, o kept in registers across them: each o[i] sees
 * the same additions in the same order (bitwise equal), with a quarter of the loads and
 * stores (the stores bound the one-row-at-a-time loop). */
static void axpy_e(float *restrict o, const float *w, const float *const *v, int n) {
    int i = 0;
#if defined(__SSE2__)
    for (; i + 4 <= n; i += 4) {
        __m128 x = _mm_loadu_ps(o + i);
        ATT_UNROLL
        for (int e = 0; e < ATT_E; e++)
            x = _mm_add_ps(x, _mm_mul_ps(_mm_set1_ps(w[e]), _mm_loadu_ps(v[e] + i)));
        _mm_storeu_ps(o + i, x);
    }
#endif
    for (; i < n; i++)
        for (int e = 0; e < ATT_E; e++) o[i] += w[e] * v[e][i];
}

/* Rows of the entries [j, j + ATT_E) of one head (kvd-float cache rows from h0). */
static void att_rows(const float *h0, int kvd, int nc, const int *idx, int j, const float **r) {
    for (int e = 0; e < ATT_E; e++) r[e] = cpu_attention_entry(h0, kvd, nc, idx, j + e);
}

/* Entries go ATT_E at a time through dot_e/axpy_e (the rest one by one): the same
 * arithmetic per entry and per output element as one at a time, so results do not depend
 * on how many entries a row sees together. */
void cpu_attention_head(float *o, const float *qh, const float *kh0, const float *vh0,
                           int kvd, int nc, const int *idx, int len, int hd, float *att) {
    float scale = 1.0f / sqrtf((float)hd), mx = -INFINITY;
    const float *r[ATT_E];
    int j = 0;
    for (; j + ATT_E <= len; j += ATT_E) {
        att_rows(kh0, kvd, nc, idx, j, r);
        dot_e(qh, r, hd, att + j);
    }
    for (; j < len; j++) att[j] = dot(qh, cpu_attention_entry(kh0, kvd, nc, idx, j), hd);
    for (j = 0; j < len; j++) {
        att[j] *= scale;
        if (att[j] > mx) mx = att[j];
    }
    float sum = 0.0f;
    for (j = 0; j < len; j++) {
        att[j] = expf(att[j] - mx);
        sum += att[j];
    }
    float inv = 1.0f / sum;
    memset(o, 0, hd * sizeof(float));
    for (j = 0; j + ATT_E <= len; j += ATT_E) {
        float w[ATT_E];
        for (int e = 0; e < ATT_E; e++) w[e] = att[j + e] * inv;
        att_rows(vh0, kvd, nc, idx, j, r);
        axpy_e(o, w, r, hd);
    }
    for (; j < len; j++)
        axpy(o, att[j] * inv, cpu_attention_entry(vh0, kvd, nc, idx, j), hd);
}

void cpu_attention(float *out, const float *q, const float *kc, const float *vc,
                   int n_committed, const int *idx, const int *cnt, int max_pending, int n,
                   int n_heads, int n_kv_heads, int hd, float *att) {
    int qd = n_heads * hd, kvd = n_kv_heads * hd, group = n_heads / n_kv_heads;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < n_heads; h++) {
            int off = (h / group) * hd;
            cpu_attention_head(out + (size_t)t * qd + h * hd, q + (size_t)t * qd + h * hd, kc + off,
                           vc + off, kvd, n_committed, idx + (size_t)t * max_pending,
                           n_committed + cnt[t], hd, att);
        }
}

void cpu_swiglu(float *gate, const float *up, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void cpu_residual_add(float *x, const float *y, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}
