/* Family selection, activation quantization and the row loop shared by every kernel family
 * (see cpu_qmatmul.h); the kernels themselves live in cpu_qk_<family>.c. */
#include "cpu_qmatmul.h"
#include "common/quant.h"
#include "cpu_ops.h"
#include <math.h>
#include <string.h>
#if defined(__SSE4_1__)
#include <immintrin.h>
#endif

#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
/* AMX-TILE and AMX-INT8 in cpuid, and the kernel's leave to use the tile state
 * (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA: Linux hands it out per process,
 * on request, before the first tile instruction). */
static int amx_usable(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25)))
        return 0;
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
}
#else
static int amx_usable(void) { return 0; }
#endif

static int cpu_runs(const char *name) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (!strcmp(name, "amx")) return cpu_runs("avx512") && amx_usable();
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
    static const QkFamily *all[] = {&qk_family_amx, &qk_family_avx512, &qk_family_avx2,
                                    &qk_family_scalar, &qk_family_ref};
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
               "avx2, avx512, amx)", name);
    return NULL;
}

static const QkKernel *find_kernel(const QkFamily *f, uint32_t type) {
    for (int i = 0; i < f->n_kernels; i++)
        if (f->kernels[i].type == type) return &f->kernels[i];
    return NULL;
}

int qk_family_packs(const QkFamily *f, uint32_t type) {
    const QkKernel *k = find_kernel(f, type);
    return k && k->packed;
}

int qk_wants_act(const QkFamily *f, uint32_t type) {
    const QkKernel *k = find_kernel(f, type);
    return k ? k->act : QK_ACT_F32;
}

/* roundf (ties away from zero) without the libm call or a branch: r = x - trunc(x) is
 * exact for |x| < 2^23 and trunc(2r) is +-1 exactly when |r| >= 0.5, so the result is
 * bitwise roundf's. */
static inline float round_away(float x) {
    float t = truncf(x);
    return t + truncf(2.0f * (x - t));
}

/* q[i] = round_away(v[i] * id) clamped to +-127 for a block; returns sum(q). -O2 left
 * this loop scalar (a sixtieth of a one-row pass); the SSE4.1 lanes (the x86-64-v2
 * baseline) do the same operations, so the bits are the same. */
static int quantize_q(const float *v, float id, int8_t *q) {
    int sum = 0, i = 0;
#if defined(__SSE4_1__)
    const __m128 vid = _mm_set1_ps(id), two = _mm_set1_ps(2.0f);
    const __m128 hi = _mm_set1_ps(127.0f), lo = _mm_set1_ps(-127.0f);
    __m128i acc = _mm_setzero_si128();
    for (; i < QK_BLOCK; i += 16) {
        __m128i w[4];
        for (int k = 0; k < 4; k++) {
            __m128 x = _mm_mul_ps(_mm_loadu_ps(v + i + 4 * k), vid);
            __m128 t = _mm_round_ps(x, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            __m128 r = _mm_round_ps(_mm_mul_ps(two, _mm_sub_ps(x, t)),
                                    _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            w[k] = _mm_cvttps_epi32(_mm_min_ps(_mm_max_ps(_mm_add_ps(t, r), lo), hi));
            acc = _mm_add_epi32(acc, w[k]);
        }
        __m128i b = _mm_packs_epi16(_mm_packs_epi32(w[0], w[1]), _mm_packs_epi32(w[2], w[3]));
        _mm_storeu_si128((__m128i *)(void *)(q + i), b);
    }
    acc = _mm_add_epi32(acc, _mm_shuffle_epi32(acc, 0x4e));
    acc = _mm_add_epi32(acc, _mm_shuffle_epi32(acc, 0xb1));
    sum = _mm_cvtsi128_si32(acc);
#endif
    for (; i < QK_BLOCK; i++) {
        float x = round_away(v[i] * id);
        x = x > 127.0f ? 127.0f : x < -127.0f ? -127.0f : x;
        q[i] = (int8_t)x;
        sum += (int)x;
    }
    return sum;
}

/* max |v[i]| over a block of 32, in lanes of 8 so -O2 vectorizes it (the libm fmaxf calls
 * were a large part of quantizing). Also the per-256 form's max, a block at a time. */
static float block_amax(const float *v) {
    float m[8] = {0};
    for (int i = 0; i < QK_BLOCK; i += 8)
        for (int k = 0; k < 8; k++) {
            float a = fabsf(v[i + k]);
            m[k] = a > m[k] ? a : m[k];
        }
    float amax = 0;
    for (int k = 0; k < 8; k++) amax = m[k] > amax ? m[k] : amax;
    return amax;
}

/* d = max|x|/127 per block, q = round(x/d) ties away from zero (as llama.cpp). */
static void quantize_block(const float *v, QkQ8 *o) {
    float amax = block_amax(v);
    float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
    o->d = d;
    o->s = d * (float)quantize_q(v, id, o->q);
}

void qk_quantize_rows(const float *x, int n, int in, QkQ8 *dst) {
    RS_ASSERT(in % QK_BLOCK == 0);
    for (int t = 0; t < n; t++)
        for (int b = 0; b < in / QK_BLOCK; b++)
            quantize_block(x + (size_t)t * in + b * QK_BLOCK, dst + (size_t)t * (in / QK_BLOCK) + b);
}

void qk_quantize_k_rows(const float *x, int n, int in, QkQ8K *dst) {
    RS_ASSERT(in % QK_K == 0);
    for (int t = 0; t < n; t++)
        for (int b = 0; b < in / QK_K; b++) {
            const float *v = x + (size_t)t * in + (size_t)b * QK_K;
            QkQ8K *o = dst + (size_t)t * (in / QK_K) + b;
            float amax = 0;
            for (int i = 0; i < QK_K; i += QK_BLOCK) {
                float a = block_amax(v + i);
                amax = a > amax ? a : amax;
            }
            o->d = amax / 127.0f;
            float id = o->d > 0 ? 1.0f / o->d : 0.0f;
            for (int i = 0; i < QK_K; i += QK_BLOCK) quantize_q(v + i, id, o->q + i);
            for (int j = 0; j < 16; j++) {
                int sum = 0;
                for (int i = 0; i < 16; i++) sum += o->q[16 * j + i];
                o->bsums[j] = (int16_t)sum;
            }
        }
}

void qk_quantize(const QkFamily *f, const float *x, int n, int in, QkQ8 *dst) {
    RS_ASSERT(in % QK_BLOCK == 0);
    if (f->quantize) f->quantize(x, n, in, dst);
    else qk_quantize_rows(x, n, in, dst);
}

void qk_acts_quantize(const QkFamily *f, QkActs *a, int acts, QkQ8 *q8, QkQ8K *q8k) {
    if (acts & QK_ACT_Q8) {
        qk_quantize(f, a->f32, a->n, a->in, q8);
        a->q8 = q8;
    }
    if (acts & QK_ACT_Q8K) {
        qk_quantize_k_rows(a->f32, a->n, a->in, q8k);
        a->q8k = q8k;
    }
}

/* Activation row pointers of tokens [t0, t0 + nt) in form `act`. */
static void act_rows(const QkActs *x, int act, int t0, int nt, const void **xs) {
    int in = x->in;
    for (int t = 0; t < nt; t++) {
        size_t r = (size_t)(t0 + t);
        xs[t] = act == QK_ACT_Q8K ? (const void *)(x->q8k + r * (in / QK_K))
                : act == QK_ACT_Q8 ? (const void *)(x->q8 + r * (in / QK_BLOCK))
                                   : (const void *)(x->f32 + r * in);
    }
}

#define QK_CROWS (QK_CHUNK * QK_ROWS)

/* Up to QK_CROWS rows wr (nr of them) through the tile kernel, token groups inside (the
 * chunk's weights are read from memory once). dst NULL: row i lands in column i of y,
 * whole tiles directly; else in column dst[i], through `out`. The last, short tile
 * repeats row nr - 1 in its spare slots (its extra outputs are dropped), so no row outside
 * the list is read. wr: (QK_CROWS) with room for the padding. */
static void chunk_tiled(const QkKernel *k, const QkActs *x, const uint8_t **wr, int nr,
                        float *y, int ldy, const int *dst) {
    int full = nr / QK_ROWS, tail = nr % QK_ROWS, ntile = full + (tail > 0);
    for (int r = nr; r < ntile * QK_ROWS; r++) wr[r] = wr[nr - 1];
    int g = k->group ? k->group : QK_GROUP;
    for (int t0 = 0; t0 < x->n; t0 += g) {
        int nt = x->n - t0 < g ? x->n - t0 : g;
        const void *xs[QK_GROUP_MAX];
        float out[QK_GROUP_MAX * QK_CROWS]; // (nt, QK_CROWS)
        act_rows(x, k->act, t0, nt, xs);
        float *yt = y + (size_t)t0 * ldy;
        if (!dst) {
            if (full) k->tile(wr, full, xs, nt, x->in, yt, ldy);
            if (!tail) continue;
            k->tile(wr + full * QK_ROWS, 1, xs, nt, x->in, out, QK_ROWS);
            for (int t = 0; t < nt; t++)
                memcpy(yt + (size_t)t * ldy + full * QK_ROWS, out + t * QK_ROWS,
                       sizeof(float) * tail);
            continue;
        }
        k->tile(wr, ntile, xs, nt, x->in, out, QK_CROWS);
        for (int t = 0; t < nt; t++)
            for (int i = 0; i < nr; i++) yt[(size_t)t * ldy + dst[i]] = out[t * QK_CROWS + i];
    }
}

/* Logical rows [j0, j1) of a GGUF q/k matrix (perm_hd, see qtensor_row) in stored order,
 * head by head: logical order would read every other stored row, then come back for the
 * rest, which defeats the prefetchers (it ran at two thirds of wo's GB/s). A row's result
 * does not depend on its tile, so only the speed changes. */
static void rows_tiled_perm(const QkKernel *k, const QTensor *w, const QkActs *x, float *y,
                            int ldy, int j0, int j1) {
    int hd = w->perm_hd, half = hd / 2, n = 0;
    const uint8_t *wr[QK_CROWS];
    int dst[QK_CROWS];
    for (int h = j0 / hd; h * hd < j1; h++)
        for (int p = 0; p < hd; p++) { /* stored row h*hd + p holds logical row h*hd + j */
            int j = h * hd + (p % 2 ? half + p / 2 : p / 2);
            if (j < j0 || j >= j1) continue;
            wr[n] = (const uint8_t *)w->data + (size_t)(h * hd + p) * w->row_bytes;
            dst[n++] = j;
            if (n == QK_CROWS) chunk_tiled(k, x, wr, n, y, ldy, dst), n = 0;
        }
    if (n) chunk_tiled(k, x, wr, n, y, ldy, dst);
}

/* Rows [j0, j1) QK_CROWS at a time through the tile kernel (chunk_tiled). */
static void rows_tiled(const QkKernel *k, const QTensor *w, const QkActs *x, float *y, int ldy,
                       int j0, int j1) {
    if (w->perm_hd) {
        rows_tiled_perm(k, w, x, y, ldy, j0, j1);
        return;
    }
    const uint8_t *wr[QK_CROWS];
    for (int j = j0; j < j1; j += QK_CROWS) {
        int nr = j1 - j < QK_CROWS ? j1 - j : QK_CROWS;
        for (int r = 0; r < nr; r++) wr[r] = (const uint8_t *)w->data + (size_t)(j + r) * w->row_bytes;
        chunk_tiled(k, x, wr, nr, y + j, ldy, NULL);
    }
}

/* The first bytes of a range of tiles, asked for at once (into L2): the kernels prefetch
 * QK_PF bytes ahead of their loads, so a range's first QK_PF bytes came one miss after
 * another, at the start of every chunk of every region (docs/PERF.md, the avx512 family
 * natively). */
#define QK_START_BYTES 8192

static void prefetch_start(const char *p, size_t bytes) {
    bytes = bytes < QK_START_BYTES ? bytes : QK_START_BYTES;
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, 0, 2);
}

/* Rows [j0, j1) of an x4 matrix through the family's x4 kernel, QK_CHUNK tiles a call
 * (their weights read from memory once for all token groups); a range that starts or ends
 * inside a tile computes the whole tile and keeps its own rows. */
static void rows_packed(const QkKernel *k, const QTensor *w, const QkActs *x, float *y, int ldy,
                        int j0, int j1) {
    size_t tile_bytes = QK_ROWS * w->row_bytes;
    prefetch_start((const char *)w->data + (size_t)(j0 / QK_ROWS) * tile_bytes,
                   (size_t)((j1 + QK_ROWS - 1) / QK_ROWS - j0 / QK_ROWS) * tile_bytes);
    int g = k->group ? k->group : QK_GROUP, tz = (j1 + QK_ROWS - 1) / QK_ROWS;
    for (int t0 = j0 / QK_ROWS; t0 < tz; t0 += QK_CHUNK) {
        int t1 = tz - t0 < QK_CHUNK ? tz : t0 + QK_CHUNK, a = t0 * QK_ROWS, z = t1 * QK_ROWS;
        int whole = a >= j0 && z <= j1, r0 = a > j0 ? a : j0, r1 = z < j1 ? z : j1;
        const uint8_t *tiles = (const uint8_t *)w->data + (size_t)t0 * tile_bytes;
        for (int n0 = 0; n0 < x->n; n0 += g) {
            int nt = x->n - n0 < g ? x->n - n0 : g;
            const void *xs[QK_GROUP_MAX];
            float out[QK_GROUP_MAX * QK_CROWS]; // (nt, QK_CROWS)
            act_rows(x, k->act, n0, nt, xs);
            float *yt = y + (size_t)n0 * ldy;
            if (whole) {
                k->packed(tiles, t1 - t0, xs, nt, x->in, yt + a, ldy);
                continue;
            }
            k->packed(tiles, t1 - t0, xs, nt, x->in, out, QK_CROWS);
            for (int t = 0; t < nt; t++)
                for (int j = r0; j < r1; j++) yt[(size_t)t * ldy + j] = out[t * QK_CROWS + j - a];
        }
    }
}

/* Row j of the product, its stored bytes (or f32 values, generic path) at wr, alone: dot,
 * or the tile kernel with the row in every slot (a row's result does not depend on its
 * slot or neighbours, so these are the bits it gets in a tile). */
static void row_alone(const QkFamily *f, const QkKernel *k, const uint8_t *wr, const QkActs *x,
                      float *y, int ldy, int j) {
    int act = k ? k->act : QK_ACT_F32, g = k && k->tile ? (k->group ? k->group : QK_GROUP) : QK_GROUP;
    const uint8_t *wt[QK_ROWS] = {wr, wr, wr, wr};
    for (int t0 = 0; t0 < x->n; t0 += g) {
        int nt = x->n - t0 < g ? x->n - t0 : g;
        const void *xs[QK_GROUP_MAX];
        float out[QK_GROUP_MAX * QK_ROWS];
        act_rows(x, act, t0, nt, xs);
        if (k && k->tile) k->tile(wt, 1, xs, nt, x->in, out, QK_ROWS);
        else (k ? k->dot : f->dot_f32)(wr, xs, nt, x->in, out);
        for (int t = 0; t < nt; t++)
            y[(size_t)(t0 + t) * ldy + j] = out[k && k->tile ? t * QK_ROWS : t];
    }
}

void qk_matmul_rows(const QkFamily *f, const QTensor *w, const QkActs *x, float *y, int ldy,
                    int j0, int j1, float *scratch) {
    RS_ASSERT(w->cols == x->in && j0 >= 0 && j1 <= w->rows);
    const QkKernel *k = find_kernel(f, w->type);
    int act = k ? k->act : QK_ACT_F32;
    RS_ASSERT(act != QK_ACT_Q8 || x->q8);
    RS_ASSERT(act != QK_ACT_Q8K || x->q8k);
    if (k && k->packed && w->packed) {
        rows_packed(k, w, x, y, ldy, j0, j1);
        return;
    }
    if (k && k->tile && !w->packed) {
        rows_tiled(k, w, x, y, ldy, j0, j1);
        return;
    }
    /* One row at a time: dot kernels; the generic path (the row expanded once for all
     * tokens); an x4 matrix in a family without its x4 kernel (the row unpacked). */
    for (int j = j0; j < j1; j++) {
        const uint8_t *wr = (const uint8_t *)scratch;
        if (!k) qtensor_dequantize_rows(w, j, 1, scratch);
        else if (w->packed) qtensor_row_bytes(w, j, (uint8_t *)scratch);
        else wr = qtensor_row(w, j);
        row_alone(f, k, wr, x, y, ldy, j);
    }
}

void qk_swiglu(const QkFamily *f, float *gate, const float *up, int n) {
    if (f->swiglu) f->swiglu(gate, up, n);
    else cpu_swiglu(gate, up, (size_t)n);
}

void qk_rmsnorm(const QkFamily *f, float *o, const float *x, const float *w, int n, float eps) {
    if (f->rmsnorm) f->rmsnorm(o, x, w, n, eps);
    else cpu_rmsnorm(o, x, w, n, eps);
}

int qk_kv_f16(const QkFamily *f, int hd, int f32) {
    return !f32 && f->attn_f16 && hd % 8 == 0 && hd <= QK_ATT_HD16;
}

void qk_attention(const QkFamily *f, int half, float *o, const float *q, const void *kh0,
                  const void *vh0, int kvd, int nc, const int *idx, int len, int hd, int g,
                  float *att) {
    RS_ASSERT(!half || f->attn_f16);
    for (int i = 0; i < g; i += QK_ATT_G) {
        int gi = g - i < QK_ATT_G ? g - i : QK_ATT_G;
        float *oi = o + (size_t)i * hd;
        const float *qi = q + (size_t)i * hd;
        if (half) f->attn_f16(oi, qi, kh0, vh0, kvd, nc, idx, len, hd, gi, att);
        else if (f->attn) f->attn(oi, qi, kh0, vh0, kvd, nc, idx, len, hd, gi, att);
        else
            for (int k = 0; k < gi; k++)
                cpu_attention_head(oi + (size_t)k * hd, qi + (size_t)k * hd, kh0, vh0, kvd, nc,
                                   idx, len, hd, att);
    }
}
