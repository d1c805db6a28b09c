/* CPU reference operations (see cpu_ops.h). They favour matching transformers' arithmetic
 * over speed: this is the reference the CUDA backend and the golden tests are checked
 * against. cpu_matmul is the portable f32 kernel of kernels/cpu_qmatmul.h (the backend
 * itself multiplies stored-type weights through the dispatched family); attention is
 * plain loops, one (token, head) at a time so the backend can split pairs across
 * threads. */
#include "cpu_ops.h"
#include "cpu_qmatmul.h"
#include <math.h>
#include <string.h>

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
    QTensor t = qtensor_f32(w, out, in);
    QkActs a = {x, NULL, n, in};
    qk_matmul_rows(&qk_family_scalar, &t, &a, y, ldy, 0, out, NULL); /* F32: no scratch */
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
 * lets it vectorize (a scalar loop here was 60% of attention's time). */
static void axpy(float *restrict o, float a, const float *restrict v, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) /* blocks of 8: -O2 vectorizes straight-line code only */
        for (int k = 0; k < 8; k++) o[i + k] += a * v[i + k];
    for (; i < n; i++) o[i] += a * v[i];
}

void cpu_attention_head(float *o, const float *qh, const float *kh0, const float *vh0,
                           int kvd, int nc, const int *idx, int len, int hd, float *att) {
    float scale = 1.0f / sqrtf((float)hd), mx = -INFINITY;
    for (int j = 0; j < len; j++) {
        int slot = j < nc ? j : nc + idx[j - nc];
        att[j] = dot(qh, kh0 + (size_t)slot * kvd, hd) * scale;
        if (att[j] > mx) mx = att[j];
    }
    float sum = 0.0f;
    for (int j = 0; j < len; j++) {
        att[j] = expf(att[j] - mx);
        sum += att[j];
    }
    float inv = 1.0f / sum;
    memset(o, 0, hd * sizeof(float));
    for (int j = 0; j < len; j++) {
        int slot = j < nc ? j : nc + idx[j - nc];
        axpy(o, att[j] * inv, vh0 + (size_t)slot * kvd, hd);
    }
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
