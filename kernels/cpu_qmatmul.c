/* Family selection, activation quantization and the row loop shared by every kernel family
 * (see cpu_qmatmul.h); the kernels themselves live in cpu_qmm_<family>.c. */
#include "cpu_qmatmul.h"
#include "common/quant.h"
#include <math.h>
#include <string.h>

static int cpu_runs(const char *name) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (!strcmp(name, "avx2"))
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("f16c");
    if (!strcmp(name, "avx512"))
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
               __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
#endif
    return !strcmp(name, "ref") || !strcmp(name, "scalar");
}

const QkFamily *qk_family_pick(const char *name, RsErr *e) {
    static const QkFamily *all[] = {&qk_family_avx512, &qk_family_avx2, &qk_family_scalar,
                                    &qk_family_ref};
    int n = (int)(sizeof all / sizeof all[0]);
    for (int i = 0; i < n; i++) {
        if (name && *name && strcmp(name, all[i]->name) != 0) continue;
        if (cpu_runs(all[i]->name)) return all[i];
        if (name && *name) {
            rs_err(e, RS_EUNSUPPORTED, "ROOTSPEC_CPU_KERNELS=%s: this CPU lacks the %s "
                   "instructions", name, name);
            return NULL;
        }
    }
    if (name && *name)
        rs_err(e, RS_EINVAL, "ROOTSPEC_CPU_KERNELS=%s is not a kernel family (ref, scalar, "
               "avx2, avx512)", name);
    return NULL;
}

static const QkKernel *find_kernel(const QkFamily *f, uint32_t type) {
    for (int i = 0; i < f->n_kernels; i++)
        if (f->kernels[i].type == type) return &f->kernels[i];
    return NULL;
}

int qk_wants_q8(const QkFamily *f, uint32_t type) {
    const QkKernel *k = find_kernel(f, type);
    return k && k->q8;
}

/* roundf (ties away from zero) without the libm call or a branch: r = x - trunc(x) is
 * exact for |x| < 2^23 and trunc(2r) is +-1 exactly when |r| >= 0.5, so the result is
 * bitwise roundf's. */
static inline float round_away(float x) {
    float t = truncf(x);
    return t + truncf(2.0f * (x - t));
}

/* d = max|x|/127 per block, q = round(x/d) ties away from zero (as llama.cpp). Lanes of
 * 8 so -O2 vectorizes it: the libm fmaxf/roundf calls were half of its time. */
static void quantize_block(const float *v, QkQ8 *o) {
    float m[8] = {0};
    for (int i = 0; i < QK_BLOCK; i += 8)
        for (int k = 0; k < 8; k++) {
            float a = fabsf(v[i + k]);
            m[k] = a > m[k] ? a : m[k];
        }
    float amax = 0;
    for (int k = 0; k < 8; k++) amax = m[k] > amax ? m[k] : amax;
    float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int i = 0; i < QK_BLOCK; i += 8)
        for (int k = 0; k < 8; k++) {
            float q = round_away(v[i + k] * id);
            q = q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q;
            o->q[i + k] = (int8_t)q;
            sum += (int)q;
        }
    o->d = d;
    o->s = d * (float)sum;
}

void qk_quantize_rows(const float *x, int n, int in, QkQ8 *dst) {
    RS_ASSERT(in % QK_BLOCK == 0);
    for (int t = 0; t < n; t++)
        for (int b = 0; b < in / QK_BLOCK; b++)
            quantize_block(x + (size_t)t * in + b * QK_BLOCK, dst + (size_t)t * (in / QK_BLOCK) + b);
}

/* Activation row pointers of tokens [t0, t0 + nt). */
static void act_rows(const QkActs *x, int q8, int t0, int nt, const void **xs) {
    int in = x->in;
    for (int t = 0; t < nt; t++)
        xs[t] = q8 ? (const void *)(x->q8 + (size_t)(t0 + t) * (in / QK_BLOCK))
                   : (const void *)(x->f32 + (size_t)(t0 + t) * in);
}

#define QK_CHUNK 16 /* tiles per kernel call: their weights stay in L1/L2 across groups */

/* Rows [j0, j1) QK_ROWS at a time through a tile kernel, QK_CHUNK tiles per call, token
 * groups inside a chunk (the chunk's weights are read from memory once). Whole tiles land
 * in y directly; the last, short tile repeats row j1 - 1 in its spare slots and goes
 * through `out` (its extra outputs are dropped), so no row outside the range is read. */
static void rows_tiled(const QkKernel *k, const QTensor *w, const QkActs *x, float *y, int ldy,
                       int j0, int j1) {
    const uint8_t *wr[QK_CHUNK * QK_ROWS];
    for (int j = j0; j < j1; j += QK_CHUNK * QK_ROWS) {
        int nr = j1 - j < QK_CHUNK * QK_ROWS ? j1 - j : QK_CHUNK * QK_ROWS;
        int full = nr / QK_ROWS, tail = nr % QK_ROWS;
        for (int r = 0; r < nr; r++) wr[r] = qtensor_row(w, j + r);
        for (int r = nr; r < (full + (tail > 0)) * QK_ROWS; r++) wr[r] = wr[nr - 1];
        for (int t0 = 0; t0 < x->n; t0 += QK_GROUP) {
            int nt = x->n - t0 < QK_GROUP ? x->n - t0 : QK_GROUP;
            const void *xs[QK_GROUP];
            float out[QK_GROUP * QK_ROWS];
            act_rows(x, k->q8, t0, nt, xs);
            if (full) k->tile(wr, full, xs, nt, x->in, y + (size_t)t0 * ldy + j, ldy);
            if (!tail) continue;
            k->tile(wr + full * QK_ROWS, 1, xs, nt, x->in, out, QK_ROWS);
            for (int t = 0; t < nt; t++)
                memcpy(y + (size_t)(t0 + t) * ldy + j + full * QK_ROWS, out + t * QK_ROWS,
                       sizeof(float) * tail);
        }
    }
}

void qk_matmul_rows(const QkFamily *f, const QTensor *w, const QkActs *x, float *y, int ldy,
                    int j0, int j1, float *scratch) {
    RS_ASSERT(w->cols == x->in && j0 >= 0 && j1 <= w->rows);
    const QkKernel *k = find_kernel(f, w->type);
    int q8 = k && k->q8, in = x->in;
    RS_ASSERT(!q8 || x->q8);
    if (k && k->tile) {
        rows_tiled(k, w, x, y, ldy, j0, j1);
        return;
    }
    QkDotFn dot = k ? k->dot : f->dot_f32;
    for (int j = j0; j < j1; j++) {
        const uint8_t *wr = qtensor_row(w, j);
        if (!k) { /* generic path: expand the row once for all tokens */
            quant_dequantize(w->type, wr, scratch, (size_t)in);
            wr = (const uint8_t *)scratch;
        }
        for (int t0 = 0; t0 < x->n; t0 += QK_GROUP) {
            int nt = x->n - t0 < QK_GROUP ? x->n - t0 : QK_GROUP;
            const void *xs[QK_GROUP];
            float out[QK_GROUP];
            act_rows(x, q8, t0, nt, xs);
            dot(wr, xs, nt, in, out);
            for (int t = 0; t < nt; t++) y[(size_t)(t0 + t) * ldy + j] = out[t];
        }
    }
}
