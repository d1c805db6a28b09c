/* CPU kernel families (kernels/cpu/cpu_qmatmul.h) and the thread pool: every family that runs on
 * this CPU against a double-precision product of the dequantized operands, for every weight
 * type; a row's result bitwise independent of the batch it is in and of the thread count;
 * permuted (GGUF q/k) rows landing where they belong; attention bitwise equal to plain
 * one-entry loops; and the whole forward's batch invariance: a row's logits bitwise
 * equal whether computed alone, in a prefill chunk or in a 65-row masked tree pass (random
 * typed models, 1 and 2 threads, and the default model). */
#include "testutil.h"
#include "common/quant.h"
#include "common/rng.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_qmatmul.h"
#include "kernels/cpu/threadpool.h"
#include "qk_avx512_emu.h"
#include "kernels/cpu/cpu_backend.h"
#include <math.h>
#include <stdatomic.h>
#include <string.h>

static const uint32_t kTypes[] = {QT_F32,  QT_F16,  QT_BF16, QT_Q8_0, QT_Q4_0, QT_Q4_1,
                                   QT_Q5_0, QT_Q5_1, QT_Q4_K, QT_Q5_K, QT_Q6_K};
#define N_TYPES ((int)(sizeof kTypes / sizeof kTypes[0]))
/* avx512-emu / amx-emu: the AVX-512 / AMX families' source with their VNNI and AMX
 * instructions emulated (qk_avx512_emu.h) */
static const char *kFams[] = {"ref", "scalar", "avx2", "avx512", "amx", "avx512-emu", "amx-emu"};
#define N_FAMS 7

/* A family if this CPU runs it, else NULL (the test then checks nothing for it). */
static const QkFamily *family(const char *name) {
    RsErr e = {0};
    if (!strcmp(name, "avx512-emu"))
        return qk_family_pick("avx2", &e) ? &qk_family_avx512_emu : NULL;
    if (!strcmp(name, "amx-emu"))
        return qk_family_pick("avx2", &e) ? &qk_family_amx_emu : NULL;
    return qk_family_pick(name, &e);
}

/* K-quant (rows, cols) of random bytes, every super-block's f16 scales set to small
 * values (any bytes are a valid K-quant block), in *buf. */
static QTensor qk_weights(uint32_t type, uint64_t seed, int rows, int cols, uint8_t **buf) {
    size_t be, bb;
    ck_assert_int_eq(quant_type_geometry(type, &be, &bb), 0);
    size_t rb = cols / be * bb;
    Rng r;
    rng_seed(&r, seed);
    *buf = rs_xmalloc(rows * rb);
    for (size_t i = 0; i < rows * rb; i++) (*buf)[i] = (uint8_t)rng_next(&r);
    for (size_t o = 0; o < rows * rb; o += bb) {
        uint8_t *p = *buf + o + (type == QT_Q6_K ? 208 : 0);
        for (int k = 0; k < (type == QT_Q6_K ? 1 : 2); k++) { /* d (and dmin) in [2^-9, 2^-8) */
            uint16_t h = (uint16_t)(0x1800 | (rng_next(&r) & 0x3ff));
            p[2 * k] = (uint8_t)h, p[2 * k + 1] = (uint8_t)(h >> 8);
        }
    }
    return (QTensor){type, *buf, rows, cols, rb, 0, 0};
}

/* A random weight matrix of `type`. F32..Q5_1: a 1-layer typed test model's w_down (64,
 * 96: an odd count of 32-blocks), in *m. K-quants (no test quantizer): qk_weights (45,
 * 512) in *buf. */
static QTensor weights(uint32_t type, uint64_t seed, Model **m, uint8_t **buf) {
    *m = NULL;
    *buf = NULL;
    if (type != QT_Q4_K && type != QT_Q5_K && type != QT_Q6_K) {
        *m = tu_random_model_typed(ARCH_LLAMA, 64, 96, 1, 4, 2, 64, seed, type);
        return (*m)->w.layers[0].w_down;
    }
    return qk_weights(type, seed, 45, 512, buf);
}

static void weights_free(Model **m, uint8_t **buf) {
    model_destroy(m);
    free(*buf);
    *buf = NULL;
}

/* y = x W^T of n random rows against double sums of the operands the kernel sees
 * (dequantized weights; activations in the kernel's quantized form when it takes one). */
static void check_vs_double(const QkFamily *f, const QTensor *w, int n, uint64_t seed) {
    int in = w->cols, out = w->rows;
    Rng r;
    rng_seed(&r, seed);
    float *x = rs_xmalloc(sizeof(float) * n * in), *y = rs_xmalloc(sizeof(float) * n * out);
    float *wf = tu_f32(w), *xd = rs_xmalloc(sizeof(float) * n * in);
    float *scratch = rs_xmalloc(sizeof(float) * in);
    for (int i = 0; i < n * in; i++) x[i] = (float)(rng_uniform(&r) * 2 - 1);
    QkActs a = tu_acts(x, n, in);
    int act = qk_wants_act(f, w->type);
    int kq = w->type == QT_Q4_K || w->type == QT_Q5_K || w->type == QT_Q6_K;
    int fl = w->type == QT_F32 || w->type == QT_F16 || w->type == QT_BF16;
    int x86 = strcmp(f->name, "ref") && strcmp(f->name, "scalar");
    /* every integer type has its own kernel outside "ref": per 256 for the x86 K-quants */
    ck_assert_int_eq(act, !strcmp(f->name, "ref") || fl ? QK_ACT_F32
                          : kq && x86                 ? QK_ACT_Q8K
                                                      : QK_ACT_Q8);
    for (int t = 0; t < n; t++)
        for (int k = 0; k < in; k++) xd[t * in + k] = (float)tu_act_seen(&a, act, t, k, NULL);
    qk_matmul_rows(f, w, &a, y, out, 0, out, scratch);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < out; j++) {
            double s = 0, mag = 0;
            for (int k = 0; k < in; k++) {
                s += (double)wf[j * in + k] * xd[t * in + k];
                mag += fabs((double)wf[j * in + k] * xd[t * in + k]);
            }
            ck_assert_msg(fabs(y[t * out + j] - s) <= 1e-5 * mag + 1e-6,
                          "%s %s in %d t %d j %d: %.9g vs %.9g", f->name,
                          quant_type_name(w->type), in, t, j, y[t * out + j], s);
        }
    free(x);
    free(y);
    free(xd);
    tu_acts_free(&a);
    free(scratch);
}

/* A token's outputs are the same bits alone, at any offset of a batch of n and for a
 * split of the output rows at `split`. */
static void check_batch_invariant(const QkFamily *f, const QTensor *w, int n, int split,
                                  uint64_t seed) {
    int in = w->cols, out = w->rows;
    Rng r;
    rng_seed(&r, seed);
    float *x = rs_xmalloc(sizeof(float) * n * in), *y = rs_xmalloc(sizeof(float) * n * out);
    float *y1 = rs_xmalloc(sizeof(float) * out), *scratch = rs_xmalloc(sizeof(float) * in);
    for (int i = 0; i < n * in; i++) x[i] = (float)(rng_uniform(&r) * 2 - 1);
    QkActs a = tu_acts(x, n, in);
    qk_matmul_rows(f, w, &a, y, out, 0, split, scratch);
    qk_matmul_rows(f, w, &a, y, out, split, out, scratch);
    for (int t = 0; t < n; t++) {
        QkActs a1 = tu_acts_row(&a, t);
        qk_matmul_rows(f, w, &a1, y1, out, 0, out, scratch);
        ck_assert_msg(memcmp(y1, y + t * out, sizeof(float) * out) == 0,
                      "%s %s in %d: token %d differs", f->name, quant_type_name(w->type), in, t);
    }
    free(x);
    free(y);
    free(y1);
    free(scratch);
    tu_acts_free(&a);
}

/* Each family and type against double sums (check_vs_double). */
START_TEST(test_kernels_vs_double) {
    const QkFamily *f = family(kFams[_i]);
    if (!f) return;
    for (int ti = 0; ti < N_TYPES; ti++) {
        Model *m;
        uint8_t *buf;
        QTensor w = weights(kTypes[ti], 7 + ti, &m, &buf);
        check_vs_double(f, &w, 9, 3);
        weights_free(&m, &buf);
    }
}
END_TEST

/* check_batch_invariant for each family and type: the split at 37 puts rows in other tile
 * slots and pads a tile; n = 11 gives token groups of 4, 4 and 3. */
START_TEST(test_kernels_batch_invariant) {
    const QkFamily *f = family(kFams[_i]);
    if (!f) return;
    for (int ti = 0; ti < N_TYPES; ti++) {
        Model *m;
        uint8_t *buf;
        QTensor w = weights(kTypes[ti], 40 + ti, &m, &buf);
        check_batch_invariant(f, &w, 11, 37, 5);
        weights_free(&m, &buf);
    }
}
END_TEST

/* Q5_0 / Q5_1 at their extremes: every element 31 (or 0) against activations of +-127,
 * where a 4-row sum of two blocks no longer fits the i16 lanes the 4-bit path reduces in
 * (2 * 32 * 31 * 127 > 2^15): each result against the exact sum. */
START_TEST(test_kernels_q5_extremes) {
    const QkFamily *f = family(kFams[_i]);
    if (!f) return;
    enum { ROWS = 8, IN = 128, NB = IN / 32 };
    for (int one = 0; one < 2; one++) {
        uint32_t type = one ? QT_Q5_1 : QT_Q5_0;
        size_t bb = one ? 24 : 22, rb = NB * bb;
        uint8_t w[ROWS * NB * 24];
        memset(w, 0, sizeof w);
        for (int r = 0; r < ROWS; r++)
            for (int b = 0; b < NB; b++) {
                uint8_t *p = w + r * rb + b * bb;
                p[1] = 0x3c; /* d = 1.0 (f16), m = 0 */
                memset(p + (one ? 4 : 2), r % 2 ? 0xff : 0x00, 4 + 16); /* qh and qs */
            }
        QTensor qt = {type, w, ROWS, IN, rb, 0, 0};
        float x[2 * IN], y[2 * ROWS], scratch[IN];
        for (int k = 0; k < IN; k++) x[k] = 1.0f, x[IN + k] = -1.0f;
        QkQ8 q8[2 * NB];
        qk_quantize_rows(x, 2, IN, q8);
        QkActs a = {.f32 = x, .q8 = q8, .n = 2, .in = IN};
        qk_matmul_rows(f, &qt, &a, y, ROWS, 0, ROWS, scratch);
        for (int tk = 0; tk < 2; tk++)
            for (int r = 0; r < ROWS; r++) {
                /* q8 of +-1.0 is exactly +-127 * (1/127); weights 31 or 0, Q5_0 minus 16 */
                double wv = (r % 2 ? 31.0 : 0.0) - (one ? 0.0 : 16.0);
                double want = IN * wv * (tk ? -1.0 : 1.0) * 127.0 * q8[0].d;
                ck_assert_msg(fabs(y[tk * ROWS + r] - want) <= 1e-4 * fabs(want) + 1e-3,
                              "%s %s token %d row %d: %.6g, want %.6g", f->name,
                              quant_type_name(type), tk, r, y[tk * ROWS + r], want);
            }
    }
}
END_TEST

/* Rows longer than the x86 Q4 tiles lay out on the stack (QK_XPAIR_IN = 4096 columns:
 * they assemble their activation pairs in each tile instead) and an odd block count among
 * them: W_down (64, 4128) of the block-of-32 types and (13, 4352) and (6, 16896) K-quants
 * (the x86 K-quant tiles gather 64 super-blocks' scales at a time), against double sums
 * and batch-invariant. */
START_TEST(test_kernels_wide_rows) {
    const QkFamily *f = family(kFams[_i]);
    if (!f) return;
    static const uint32_t types[] = {QT_Q8_0, QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1};
    for (int ti = 0; ti < 5; ti++) {
        Model *m = tu_random_model_typed(ARCH_LLAMA, 64, 4128, 1, 4, 2, 64, 90 + ti, types[ti]);
        const QTensor *w = &m->w.layers[0].w_down;
        ck_assert_int_eq(w->cols, 4128);
        check_vs_double(f, w, 5, 11);
        check_batch_invariant(f, w, 5, 21, 12);
        model_destroy(&m);
    }
    for (uint32_t t = QT_Q4_K; t <= QT_Q6_K; t++) { /* 17 super-blocks, then 66 */
        uint8_t *buf;
        QTensor w = qk_weights(t, 95 + t, 13, 4352, &buf);
        check_vs_double(f, &w, 5, 13);
        check_batch_invariant(f, &w, 5, 6, 14);
        free(buf);
        w = qk_weights(t, 97 + t, 6, 66 * QK_K, &buf); /* the x86 tiles go 64 at a time */
        check_vs_double(f, &w, 5, 15);
        check_batch_invariant(f, &w, 5, 3, 16);
        free(buf);
    }
}
END_TEST

/* The AVX-512 and AMX families' code (VNNI block sums and AMX tile products, emulated)
 * gives the AVX2 family's bits for every type: their integer sums are exact where AVX2's
 * are (no i16 saturation in any), and the float steps after them are the same
 * operations. 21 tokens: an AMX group of 16, then 5 (AMX again), then singles. */
START_TEST(test_kernels_emu_bitwise_avx2) {
    const QkFamily *f2 = family("avx2"), *f5 = family(_i ? "amx-emu" : "avx512-emu");
    if (!f2) {
        fprintf(stderr, "cpu_kernels: no AVX2 on this CPU, %s not compared\n",
                _i ? "amx-emu" : "avx512-emu");
        return;
    }
    enum { N = 21 };
    for (int ti = 0; ti < N_TYPES; ti++) {
        Model *m;
        uint8_t *buf;
        QTensor w = weights(kTypes[ti], 70 + ti, &m, &buf);
        int in = w.cols, out = w.rows;
        Rng r;
        rng_seed(&r, 80 + ti);
        float *x = rs_xmalloc(sizeof(float) * N * in), *scratch = rs_xmalloc(sizeof(float) * in);
        float *y2 = rs_xmalloc(sizeof(float) * N * out), *y5 = rs_xmalloc(sizeof(float) * N * out);
        for (int i = 0; i < N * in; i++) x[i] = (float)(rng_uniform(&r) * 2 - 1);
        QkActs a = tu_acts(x, N, in);
        qk_matmul_rows(f2, &w, &a, y2, out, 0, out, scratch);
        qk_matmul_rows(f5, &w, &a, y5, out, 0, out, scratch);
        check_batch_invariant(f5, &w, N, 17, 90 + ti); /* each token alone, rows split */
        ck_assert_msg(memcmp(y2, y5, sizeof(float) * N * out) == 0, "%s: %s != avx2",
                      quant_type_name(w.type), f5->name);
        free(x), free(scratch), free(y2), free(y5);
        tu_acts_free(&a);
        weights_free(&m, &buf);
    }
}
END_TEST

/* y = w x through f2 and f5 for n random tokens: the same bits. */
static void check_float_same(const QkFamily *f2, const QkFamily *f5, const QTensor *w, int n,
                             uint64_t seed) {
    int in = w->cols, out = w->rows;
    Rng r;
    rng_seed(&r, seed);
    float *x = rs_xmalloc(sizeof(float) * n * in), *scratch = rs_xmalloc(sizeof(float) * in);
    float *y2 = rs_xmalloc(sizeof(float) * n * out), *y5 = rs_xmalloc(sizeof(float) * n * out);
    for (int i = 0; i < n * in; i++) x[i] = (float)(rng_uniform(&r) * 2 - 1);
    QkActs a = {.f32 = x, .n = n, .in = in}; /* float weights take f32 rows only */
    qk_matmul_rows(f2, w, &a, y2, out, 0, out, scratch);
    qk_matmul_rows(f5, w, &a, y5, out, 0, out, scratch);
    ck_assert_msg(memcmp(y2, y5, sizeof(float) * n * out) == 0, "%s %d columns n=%d: %s != avx2",
                  quant_type_name(w->type), in, n, f5->name);
    free(x), free(scratch), free(y2), free(y5);
}

/* The AVX-512 families' float tiles (512-bit registers, a whole chunk of tokens a read of
 * the weights in blocks of up to 6) give the AVX2 family's bits for F32, F16 and BF16 at
 * every token count from 1 to 21, each token alone as in the batch, and with rows that end
 * in a half step and single columns; run where the CPU has them. */
START_TEST(test_kernels_float_wide_bitwise) {
    const QkFamily *f2 = family("avx2"), *f5 = family(_i ? "amx" : "avx512");
    if (!f2 || !f5) return;
    for (int ti = 0; ti < 3; ti++) {
        Model *m;
        uint8_t *buf;
        QTensor w = weights(kTypes[ti], 110 + ti, &m, &buf);
        int in = w.cols, out = w.rows;
        for (int N = 1; N <= 21; N += N < 16 ? 1 : 5) {
            Rng r;
            rng_seed(&r, 120 + ti * 31 + N);
            float *x = rs_xmalloc(sizeof(float) * N * in), *scratch = rs_xmalloc(sizeof(float) * in);
            float *y2 = rs_xmalloc(sizeof(float) * N * out), *y5 = rs_xmalloc(sizeof(float) * N * out);
            for (int i = 0; i < N * in; i++) x[i] = (float)(rng_uniform(&r) * 2 - 1);
            QkActs a = tu_acts(x, N, in);
            qk_matmul_rows(f2, &w, &a, y2, out, 0, out, scratch);
            qk_matmul_rows(f5, &w, &a, y5, out, 0, out, scratch);
            ck_assert_msg(memcmp(y2, y5, sizeof(float) * N * out) == 0, "%s n=%d: %s != avx2",
                          quant_type_name(w.type), N, f5->name);
            free(x), free(scratch), free(y2), free(y5);
            tu_acts_free(&a);
        }
        check_batch_invariant(f5, &w, 21, 13, 130 + ti);
        weights_free(&m, &buf);
        /* rows whose tokens' activations fill L1: F16 and BF16 keep a tile's converted
         * rows for all the tokens, F32 takes them block by block over all the tiles */
        static const int kCols[] = {1152, 1536}, kN[] = {5, 7, 8, 9, 16};
        for (int ci = 0; ci < 2; ci++) {
            m = tu_random_model_typed(ARCH_LLAMA, 64, kCols[ci], 1, 4, 2, 64, 160 + ti, kTypes[ti]);
            w = m->w.layers[0].w_down;
            for (int ni = 0; ni < 5; ni++) check_float_same(f2, f5, &w, kN[ni], 170 + ni);
            check_batch_invariant(f5, &w, 16, 20, 180 + ti);
            model_destroy(&m);
        }
        /* 76 columns: four 16-column steps, a half step and 4 columns past it */
        m = tu_random_model_typed(ARCH_LLAMA, 64, 76, 1, 4, 2, 64, 140 + ti, kTypes[ti]);
        w = m->w.layers[0].w_down;
        ck_assert_int_eq(w.cols, 76);
        for (int N = 1; N <= 13; N += 4) {
            Rng r;
            rng_seed(&r, 150 + ti * 31 + N);
            int in2 = w.cols, out2 = w.rows;
            float *x = rs_xmalloc(sizeof(float) * N * in2), *scratch = rs_xmalloc(sizeof(float) * in2);
            float *y2 = rs_xmalloc(sizeof(float) * N * out2), *y5 = rs_xmalloc(sizeof(float) * N * out2);
            for (int i = 0; i < N * in2; i++) x[i] = (float)(rng_uniform(&r) * 2 - 1);
            QkActs a = {.f32 = x, .n = N, .in = in2}; /* float weights take f32 rows only */
            qk_matmul_rows(f2, &w, &a, y2, out2, 0, out2, scratch);
            qk_matmul_rows(f5, &w, &a, y5, out2, 0, out2, scratch);
            ck_assert_msg(memcmp(y2, y5, sizeof(float) * N * out2) == 0, "%s 76 columns n=%d: %s != avx2",
                          quant_type_name(w.type), N, f5->name);
            float *wf = tu_f32(&w);
            for (int t = 0; t < N; t++)
                for (int j = 0; j < out2; j++) {
                    double sum = 0, mag = 0;
                    for (int k = 0; k < in2; k++) {
                        sum += (double)wf[j * in2 + k] * x[t * in2 + k];
                        mag += fabs((double)wf[j * in2 + k] * x[t * in2 + k]);
                    }
                    ck_assert_msg(fabs(y5[t * out2 + j] - sum) <= 1e-5 * mag + 1e-6,
                                  "%s 76 columns t %d j %d: %.9g vs %.9g",
                                  quant_type_name(w.type), t, j, y5[t * out2 + j], sum);
                }
            free(wf), free(x), free(scratch), free(y2), free(y5);
        }
        model_destroy(&m);
    }
}
END_TEST

/* The same at the model's columns and around the float tiles' bounds: 576 and 579 (single
 * columns past the last step) at every n from 1 to 72 (blocks of 1 to 6 tokens, reduced 4
 * at a time and in pairs; F32 over all the tiles from 15 tokens) and past a call's 128
 * tokens; 2048 columns keep a tile's converted rows for up to 64 tokens and take 65 over
 * all the tiles; 2056 (a half step past the staged rows' columns) never keep them. */
START_TEST(test_kernels_float_model_cols_bitwise) {
    const QkFamily *f2 = family("avx2"), *f5 = family(_i ? "amx" : "avx512");
    if (!f2 || !f5) return;
    static const int kCols[] = {576, 579, 2048, 2056};
    static const int kNs[][4] = {{129, 130, 0}, {129, 0}, {5, 63, 64, 65}, {5, 9, 16, 0}};
    for (int ti = 0; ti < 3; ti++)
        for (int ci = 0; ci < 4; ci++) {
            Model *m = tu_random_model_typed(ARCH_LLAMA, 64, kCols[ci], 1, 4, 2, 64, 190 + ti,
                                             kTypes[ti]);
            QTensor w = m->w.layers[0].w_down;
            ck_assert_int_eq(w.cols, kCols[ci]);
            for (int n = 1; ci < 2 && n <= 72; n++) check_float_same(f2, f5, &w, n, 200 + n);
            for (int i = 0; i < 4 && kNs[ci][i]; i++) check_float_same(f2, f5, &w, kNs[ci][i], 300 + i);
            model_destroy(&m);
        }
}
END_TEST

/* qk_family_pick: each family by name, or a refusal naming it; the default is the first
 * of amx, avx512, avx2, scalar this CPU runs; a wrong name is refused with the list. */
START_TEST(test_family_pick) {
    static const char *names[] = {"amx", "avx512", "avx2", "scalar", "ref"};
    const QkFamily *best = NULL;
    for (int i = 0; i < 5; i++) {
        RsErr e = {0};
        const QkFamily *f = qk_family_pick(names[i], &e);
        if (f) {
            ck_assert_str_eq(f->name, names[i]);
            if (!best) best = f;
        } else {
            ck_assert_int_eq(e.code, RS_EUNSUPPORTED);
            ck_assert_msg(strstr(e.msg, names[i]) && strstr(e.msg, "lacks"), "%s", e.msg);
        }
    }
    RsErr e = {0};
    ck_assert_ptr_eq(qk_family_pick(NULL, &e), best);
    ck_assert_ptr_eq(qk_family_pick("", &e), best);
    ck_assert_ptr_null(qk_family_pick("avx3", &e));
    ck_assert_int_eq(e.code, RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "avx3") && strstr(e.msg, "amx)"), "%s", e.msg);
}
END_TEST

/* A GGUF q/k matrix (perm_hd: logical row j is stored row qtensor_row(j)) gives each
 * logical row the bits the same stored row gives in an unpermuted matrix, for any split
 * of the rows (the tiled path walks such matrices in stored order). */
START_TEST(test_kernels_perm_rows) {
    const QkFamily *f = family(kFams[_i]);
    if (!f) return;
    for (int ti = 0; ti < N_TYPES; ti++) {
        Model *m = NULL;
        uint8_t *buf = NULL;
        int kq = kTypes[ti] == QT_Q4_K || kTypes[ti] == QT_Q5_K || kTypes[ti] == QT_Q6_K;
        QTensor w = kq ? qk_weights(kTypes[ti], 60 + ti, 64, 512, &buf)
                       : weights(kTypes[ti], 60 + ti, &m, &buf), wp = w;
        wp.perm_hd = 16; /* 4 heads of 16 rows */
        int n = 5, in = w.cols, out = w.rows;
        Rng r;
        rng_seed(&r, 9);
        float *x = rs_xmalloc(sizeof(float) * n * in), *y = rs_xmalloc(sizeof(float) * n * out);
        float *yp = rs_xmalloc(sizeof(float) * n * out), *scratch = rs_xmalloc(sizeof(float) * in);
        for (int i = 0; i < n * in; i++) x[i] = (float)(rng_uniform(&r) * 2 - 1);
        QkActs a = tu_acts(x, n, in);
        qk_matmul_rows(f, &w, &a, y, out, 0, out, scratch);
        qk_matmul_rows(f, &wp, &a, yp, out, 0, 21, scratch); /* splits inside heads */
        qk_matmul_rows(f, &wp, &a, yp, out, 21, 37, scratch);
        qk_matmul_rows(f, &wp, &a, yp, out, 37, out, scratch);
        for (int j = 0; j < out; j++) {
            int s = (int)((qtensor_row(&wp, j) - (const uint8_t *)w.data) / w.row_bytes);
            for (int t = 0; t < n; t++)
                ck_assert_msg(memcmp(&yp[t * out + j], &y[t * out + s], sizeof(float)) == 0,
                              "%s %s: logical row %d (stored %d) token %d: %.9g vs %.9g",
                              f->name, quant_type_name(kTypes[ti]), j, s, t, yp[t * out + j],
                              y[t * out + s]);
        }
        free(x);
        free(y);
        free(yp);
        free(scratch);
        tu_acts_free(&a);
        weights_free(&m, &buf);
    }
}
END_TEST

/* ---- x4 tiles (common/quant.h, QTensor.packed) ---- */

static const uint32_t kX4Types[] = {QT_Q8_0, QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1};
#define N_X4 5

/* (rows, cols) random blocks of 32 of `type` in *buf, d (and Q4_1/Q5_1's m) set to f16 in
 * [2^-9, 2^-8) (m negative on odd blocks); every other byte is any byte. */
static QTensor b32_weights(uint32_t type, uint64_t seed, int rows, int cols, uint8_t **buf) {
    size_t be, bb;
    ck_assert_int_eq(quant_type_geometry(type, &be, &bb), 0);
    size_t rb = cols / be * bb, nblk = (size_t)rows * (cols / be);
    Rng r;
    rng_seed(&r, seed);
    *buf = rs_xmalloc(rows * rb);
    for (size_t i = 0; i < rows * rb; i++) (*buf)[i] = (uint8_t)rng_next(&r);
    int has_m = type == QT_Q4_1 || type == QT_Q5_1;
    for (size_t b = 0; b < nblk; b++)
        for (int k = 0; k <= has_m; k++) {
            uint16_t h = (uint16_t)(0x1800 | (rng_next(&r) & 0x3ff) | (k && b % 2 ? 0x8000 : 0));
            (*buf)[b * bb + 2 * k] = (uint8_t)h, (*buf)[b * bb + 2 * k + 1] = (uint8_t)(h >> 8);
        }
    return (QTensor){type, *buf, rows, cols, rb, 0, 0};
}

/* w's rows in x4 tiles (rows % 4 == 0), into *buf. */
static QTensor x4_copy(const QTensor *w, uint8_t **buf) {
    *buf = rs_xmalloc((size_t)w->rows * w->row_bytes);
    for (int t = 0; t < w->rows / 4; t++) {
        const uint8_t *rows[4];
        for (int r = 0; r < 4; r++) rows[r] = qtensor_row(w, 4 * t + r);
        quant_x4_pack(w->type, (size_t)w->cols, rows, *buf + (size_t)t * 4 * w->row_bytes);
    }
    QTensor p = *w;
    p.data = *buf;
    p.packed = 1;
    p.perm_hd = 0;
    return p;
}

/* quant_x4_block reads back every block of every row after quant_x4_pack, for even and
 * odd block counts (a last group of one block); the scales of a Q4_1 group are
 * block-major at the tile's start (the layout the x86 kernels load as one vector). */
START_TEST(test_x4_layout_round_trip) {
    static const int nbs[] = {1, 2, 3, 18, 19};
    for (int ti = 0; ti < N_X4; ti++)
        for (int ni = 0; ni < 5; ni++) {
            uint8_t *buf, blk[64], tile[4 * 19 * 34];
            QTensor w = b32_weights(kX4Types[ti], 30 + ti, 4, 32 * nbs[ni], &buf);
            const uint8_t *rows[4] = {buf, buf + w.row_bytes, buf + 2 * w.row_bytes,
                                      buf + 3 * w.row_bytes};
            size_t bb = w.row_bytes / (size_t)nbs[ni];
            ck_assert(quant_x4_ok(w.type));
            quant_x4_pack(w.type, (size_t)w.cols, rows, tile);
            for (int r = 0; r < 4; r++)
                for (int j = 0; j < nbs[ni]; j++) {
                    quant_x4_block(w.type, (size_t)w.cols, tile, r, (size_t)j, blk);
                    ck_assert_msg(memcmp(blk, rows[r] + j * bb, bb) == 0, "%s nb %d row %d block %d",
                                  quant_type_name(w.type), nbs[ni], r, j);
                }
            if (w.type == QT_Q4_1 && nbs[ni] >= 2)
                for (int k = 0; k < 8; k++) /* d of (block k / 4, row k % 4), then the m */
                    ck_assert(!memcmp(tile + 2 * k, rows[k % 4] + (k / 4) * bb, 2) &&
                              !memcmp(tile + 16 + 2 * k, rows[k % 4] + (k / 4) * bb + 2, 2));
            free(buf);
        }
    ck_assert(!quant_x4_ok(QT_F16) && !quant_x4_ok(QT_BF16) && !quant_x4_ok(QT_F32));
}
END_TEST

/* The same for the K-quants' super-blocks (any bytes are a valid block: random rows), and
 * the Q4_K layout literally at three places: the f16 scales, one 6-bit scale's low nibble,
 * one quant. */
START_TEST(test_x4_layout_round_trip_k) {
    for (uint32_t type = QT_Q4_K; type <= QT_Q6_K; type++)
        for (int nsb = 1; nsb <= 3; nsb++) {
            uint8_t *buf, blk[256], tile[4 * 3 * 210];
            QTensor w = qk_weights(type, 60 + type, 4, 256 * nsb, &buf);
            const uint8_t *rows[4] = {buf, buf + w.row_bytes, buf + 2 * w.row_bytes,
                                      buf + 3 * w.row_bytes};
            size_t bb = w.row_bytes / (size_t)nsb;
            ck_assert(quant_x4_ok(type));
            quant_x4_pack(type, (size_t)w.cols, rows, tile);
            for (int r = 0; r < 4; r++)
                for (int j = 0; j < nsb; j++) {
                    quant_x4_block(type, (size_t)w.cols, tile, r, (size_t)j, blk);
                    ck_assert_msg(memcmp(blk, rows[r] + j * bb, bb) == 0, "%s nsb %d row %d block %d",
                                  quant_type_name(type), nsb, r, j);
                }
            if (type == QT_Q4_K) {
                uint8_t sc, m;
                quant_k4_scale_min(2, rows[1] + 4, &sc, &m);
                ck_assert(!memcmp(tile, rows[0], 2) && !memcmp(tile + 6, rows[3], 2)); /* d */
                ck_assert(!memcmp(tile + 8, rows[0] + 2, 2)); /* dmin */
                ck_assert_int_eq(tile[16 + 5] & 15, sc & 15); /* k = 5: row 1, sub-block 2 */
                ck_assert_int_eq(tile[64 + 8] & 15, rows[2][16] & 15); /* row 2, element 0 */
            }
            free(buf);
        }
}
END_TEST

/* An x4 copy of a matrix gives every row the bits the row layout gives, in every family
 * (avx2, avx512 and amx through their x4 kernels, amx's AMX tiles for the 6 tokens; ref
 * and scalar unpacking rows), for ranges that
 * start and end inside tiles, more tiles than one kernel call takes (QK_CHUNK), odd
 * block counts and K-quant rows longer than one span of laid-out tokens (QK_KL_SB). */
START_TEST(test_kernels_x4_bitwise) {
    const QkFamily *f = family(kFams[_i]);
    if (!f) return;
    static const int cols[] = {96, 576, 4128}; /* 4128: 129 blocks, past QK_XPAIR_IN */
    static const int kcols[] = {256, 768, 4352}; /* 4352: 17 super-blocks, past QK_KL_SB */
    static const int cuts[] = {0, 3, 10, 64, 70, 72};
    static const uint32_t types[] = {QT_Q8_0, QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1, QT_Q4_K, QT_Q5_K, QT_Q6_K};
    for (int ti = 0; ti < 8; ti++) {
        int x86 = !strcmp(f->name, "avx2") || !strncmp(f->name, "avx512", 6) || !strncmp(f->name, "amx", 3);
        int k = ti >= N_X4;
        ck_assert_int_eq(qk_family_packs(f, types[ti]), x86);
        for (int ci = 0; ci < 3; ci++) {
            uint8_t *buf, *pbuf;
            QTensor w = k ? qk_weights(types[ti], 40 + ti, 72, kcols[ci], &buf)
                          : b32_weights(types[ti], 40 + ti, 72, cols[ci], &buf);
            QTensor p = x4_copy(&w, &pbuf);
            int n = 6, in = w.cols, out = w.rows;
            Rng r;
            rng_seed(&r, 50 + ti);
            float *x = rs_xmalloc(sizeof(float) * n * in), *scratch = rs_xmalloc(sizeof(float) * in);
            float *y = rs_xmalloc(sizeof(float) * n * out), *yp = rs_xmalloc(sizeof(float) * n * out);
            for (int i = 0; i < n * in; i++) x[i] = (float)(rng_uniform(&r) * 2 - 1);
            QkActs a = tu_acts(x, n, in);
            qk_matmul_rows(f, &w, &a, y, out, 0, out, scratch);
            memset(yp, 0xff, sizeof(float) * n * out);
            for (int c = 0; c + 1 < 6; c++) qk_matmul_rows(f, &p, &a, yp, out, cuts[c], cuts[c + 1], scratch);
            for (int i = 0; i < n * out; i++)
                ck_assert_msg(!memcmp(&y[i], &yp[i], sizeof(float)), "%s %s cols %d: token %d row %d: %.9g vs %.9g",
                              f->name, quant_type_name(w.type), in, i / out, i % out, yp[i], y[i]);
            free(x), free(scratch), free(y), free(yp), free(buf), free(pbuf);
            tu_acts_free(&a);
        }
    }
}
END_TEST

/* The avx512 family natively against avx2, bit for bit, for every integer type in rows and
 * in x4 tiles, at token counts on both sides of where groups leave the register tiles for
 * the tile products in 512-bit VNNI registers (cpu_qk_amx.inc, QK_VTILE) and past a group
 * of 16; odd block counts, rows past one span, a short last group of 16 rows. Reported,
 * not passed, on a CPU without AVX-512 VNNI. */
START_TEST(test_kernels_vtile_bitwise_avx2) {
    const QkFamily *f2 = family("avx2"), *f5 = family("avx512");
    if (!f2 || !f5) {
        fprintf(stderr, "cpu_kernels: no AVX-512 VNNI on this CPU, the avx512 family's tile "
                        "products not compared with avx2\n");
        return;
    }
    static const int cols[] = {96, 4128}, kcols[] = {768, 4352}, ns[] = {1, 4, 5, 7, 8, 9, 12, 16, 17, 21, 33};
    static const uint32_t types[] = {QT_Q8_0, QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1, QT_Q4_K, QT_Q5_K, QT_Q6_K};
    for (int ti = 0; ti < 8; ti++)
        for (int ci = 0; ci < 2; ci++) {
            uint8_t *buf, *pbuf;
            QTensor w = ti >= N_X4 ? qk_weights(types[ti], 200 + ti, 72, kcols[ci], &buf)
                                   : b32_weights(types[ti], 200 + ti, 72, cols[ci], &buf);
            QTensor p = x4_copy(&w, &pbuf);
            for (int ni = 0; ni < (int)(sizeof ns / sizeof ns[0]); ni++) {
                int n = ns[ni], in = w.cols, out = w.rows;
                Rng r;
                rng_seed(&r, 210 + 16 * ti + ni);
                float *x = rs_xmalloc(sizeof(float) * n * in), *scratch = rs_xmalloc(sizeof(float) * in);
                float *y2 = rs_xmalloc(sizeof(float) * n * out), *y5 = rs_xmalloc(sizeof(float) * n * out);
                for (int i = 0; i < n * in; i++) x[i] = (float)(rng_uniform(&r) * 2 - 1);
                QkActs a = tu_acts(x, n, in);
                qk_matmul_rows(f2, &w, &a, y2, out, 0, out, scratch);
                for (int l = 0; l < 2; l++) {
                    memset(y5, 0xff, sizeof(float) * n * out);
                    qk_matmul_rows(f5, l ? &p : &w, &a, y5, out, 0, out, scratch);
                    for (int i = 0; i < n * out; i++)
                        ck_assert_msg(!memcmp(&y2[i], &y5[i], sizeof(float)),
                                      "%s %s cols %d n=%d: token %d row %d: avx512 %.9g, avx2 %.9g",
                                      quant_type_name(w.type), l ? "x4" : "rows", in, n, i / out,
                                      i % out, y5[i], y2[i]);
                }
                free(x), free(scratch), free(y2), free(y5);
                tu_acts_free(&a);
            }
            free(buf), free(pbuf);
        }
}
END_TEST

/* cpu_attention_head as one entry at a time in the plainest loops: scores with 8 lane
 * sums folded ((0+4)+(1+5))+((2+6)+(3+7)), then softmax, then o += p_j v_j in entry
 * order. The kernel takes entries four at a time and must give the same bits. */
static void attention_plain(float *o, const float *q, const float *k, const float *v, int kvd,
                            int nc, const int *idx, int len, int hd, float *att) {
    float mx = -INFINITY, sum = 0;
    for (int j = 0; j < len; j++) {
        const float *kr = k + (size_t)(j < nc ? j : nc + idx[j - nc]) * kvd;
        float acc[8] = {0}, d;
        int i = 0;
        for (; i + 8 <= hd; i += 8)
            for (int l = 0; l < 8; l++) acc[l] += q[i + l] * kr[i + l];
        d = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        for (; i < hd; i++) d += q[i] * kr[i];
        att[j] = d * (1.0f / sqrtf((float)hd));
        mx = att[j] > mx ? att[j] : mx;
    }
    for (int j = 0; j < len; j++) sum += att[j] = expf(att[j] - mx);
    float inv = 1.0f / sum;
    memset(o, 0, sizeof(float) * hd);
    for (int j = 0; j < len; j++) {
        const float *vr = v + (size_t)(j < nc ? j : nc + idx[j - nc]) * kvd;
        for (int i = 0; i < hd; i++) o[i] += att[j] * inv * vr[i];
    }
}

START_TEST(test_attention_matches_plain_loops) {
    Rng r;
    rng_seed(&r, 11);
    static const int hds[] = {64, 36, 128, 8};
    for (int trial = 0; trial < 40; trial++) {
        int hd = hds[trial % 4], kvd = 3 * hd, nc = (int)(rng_next(&r) % 23), np = 1 + trial % 7;
        int idx[8], len = nc;
        for (int j = 0; j < np; j++)
            if (rng_next(&r) % 3) idx[len++ - nc] = j; /* a masked row's pending entries */
        size_t sz = (size_t)(nc + np) * kvd;
        float *k = rs_xmalloc(sizeof(float) * sz), *v = rs_xmalloc(sizeof(float) * sz);
        float q[128], o[128], want[128], att[32];
        for (size_t i = 0; i < sz; i++)
            k[i] = (float)(rng_uniform(&r) * 2 - 1), v[i] = (float)(rng_uniform(&r) * 2 - 1);
        for (int i = 0; i < hd; i++) q[i] = (float)(rng_uniform(&r) * 6 - 3);
        if (len > 0) {
            cpu_attention_head(o, q, k + hd, v + hd, kvd, nc, idx, len, hd, att);
            attention_plain(want, q, k + hd, v + hd, kvd, nc, idx, len, hd, att);
            ck_assert_msg(memcmp(o, want, sizeof(float) * hd) == 0,
                          "trial %d (hd %d, %d entries): %.9g vs %.9g", trial, hd, len, o[0],
                          want[0]);
        }
        free(k);
        free(v);
    }
}
END_TEST

/* A family's own attention (FMA lanes) against the reference loops, within float
 * rounding: head sizes with a partial 64-column slice (40, 48, 32, 16: the value pass's
 * odd and even register counts) and the reference fallback (36),
 * contexts beyond one 512-row pass, masked pending entries, 1-3 heads a call; and each
 * head of a call bitwise as the same kernel alone (the backend groups heads freely). */
START_TEST(test_family_attention_vs_reference) {
    const QkFamily *f = family(kFams[_i]);
    if (!f || !f->attn) return;
    Rng r;
    rng_seed(&r, 23);
    static const int hds[] = {64, 128, 40, 36, 48, 32, 16, 56}, ncs[] = {0, 5, 130, 700};
    for (int trial = 0; trial < 32; trial++) {
        int hd = hds[trial % 8], kvd = 2 * hd, nc = ncs[trial / 8], np = 1 + trial % 5;
        int g = 1 + trial % 3, idx[8], len = nc;
        for (int j = 0; j < np; j++)
            if (j == 0 || rng_next(&r) % 2) idx[len++ - nc] = j;
        size_t sz = (size_t)(nc + np) * kvd;
        float *k = rs_xmalloc(sizeof(float) * sz), *v = rs_xmalloc(sizeof(float) * sz);
        float *att = rs_xmalloc(sizeof(float) * g * (len + 1)), q[3 * 128], o[3 * 128];
        float want[128], alone[128];
        for (size_t i = 0; i < sz; i++)
            k[i] = (float)(rng_uniform(&r) * 2 - 1), v[i] = (float)(rng_uniform(&r) * 2 - 1);
        for (int i = 0; i < g * hd; i++) q[i] = (float)(rng_uniform(&r) * 4 - 2);
        f->attn(o, q, k + hd, v + hd, kvd, nc, idx, len, hd, g, att);
        for (int h = 0; h < g; h++) {
            const float *qh = q + h * hd, *oh = o + h * hd;
            cpu_attention_head(want, qh, k + hd, v + hd, kvd, nc, idx, len, hd, att);
            f->attn(alone, qh, k + hd, v + hd, kvd, nc, idx, len, hd, 1, att);
            ck_assert_msg(memcmp(alone, oh, sizeof(float) * hd) == 0,
                          "%s trial %d: head %d of %d differs from the head alone", f->name,
                          trial, h, g);
            for (int i = 0; i < hd; i++)
                ck_assert_msg(fabsf(oh[i] - want[i]) <= 1e-6f + 1e-4f * fabsf(want[i]),
                              "%s trial %d (hd %d, %d entries, head %d of %d) o[%d]: %.9g vs "
                              "%.9g", f->name, trial, hd, len, h, g, i, oh[i], want[i]);
        }
        if (f->attn_f16 && hd % 8 == 0) { /* f16 caches: the f32 kernel's bits on the rounded rows */
            uint16_t *kh = rs_xmalloc(2 * sz), *vh = rs_xmalloc(2 * sz);
            f->to_f16(kh, k, (int)sz);
            f->to_f16(vh, v, (int)sz);
            for (size_t i = 0; i < sz; i++) k[i] = quant_f16_to_f32(kh[i]), v[i] = quant_f16_to_f32(vh[i]);
            float o16[3 * 128];
            f->attn_f16(o16, q, kh + hd, vh + hd, kvd, nc, idx, len, hd, g, att);
            f->attn(o, q, k + hd, v + hd, kvd, nc, idx, len, hd, g, att);
            ck_assert_msg(memcmp(o16, o, sizeof(float) * g * hd) == 0,
                          "%s trial %d: f16 caches differ from f32 ones holding the same values",
                          f->name, trial);
            free(kh);
            free(vh);
        }
        free(k);
        free(v);
        free(att);
    }
}
END_TEST

/* A family's f32 -> f16 conversion (its KV caches) rounds to the nearest f16, ties to
 * even, over magnitudes from subnormal to beyond the largest f16 (inf). */
START_TEST(test_family_to_f16_rounds) {
    const QkFamily *f = family(kFams[_i]);
    if (!f || !f->to_f16) return;
    Rng r;
    rng_seed(&r, 29);
    float x[203];
    uint16_t h[203];
    for (int i = 0; i < 200; i++)
        x[i] = (float)((rng_uniform(&r) - 0.5) * pow(2.0, (double)(i % 40) - 26.0));
    x[200] = 70000.0f, x[201] = 1.0f + 1.0f / 2048, x[202] = 1.0f + 3.0f / 2048; /* inf; ties */
    f->to_f16(h, x, 203);
    for (int i = 0; i < 200; i++) {
        double got = quant_f16_to_f32(h[i]), d = fabs(got - x[i]), near = INFINITY;
        for (int k = -1; k <= 1; k += 2) { /* the codes either side (NaN past 0: none) */
            double n = quant_f16_to_f32((uint16_t)(h[i] + k));
            if (!isnan(n) && fabs(n - x[i]) < near) near = fabs(n - x[i]);
        }
        ck_assert_msg(d <= near,
                      "%s: %.9g -> %.9g, a neighbour is nearer", f->name, x[i], got);
    }
    ck_assert_int_eq(h[200], 0x7c00);
    ck_assert_int_eq(h[201], 0x3c00); /* 1 + 2^-11 ties to even: 1 */
    ck_assert_int_eq(h[202], 0x3c02); /* 1 + 3 * 2^-11 ties to even: 1 + 2^-9 */
}
END_TEST

/* A family's SwiGLU (qk_swiglu) against silu(g) * u in double, within a few ulp, over
 * |g| from 2^-20 to 100 (both sides of exp's overflow for -g); NaN and the infinities as
 * cpu_swiglu gives them; and each element's bits the same however the range is split
 * (callers split the hidden vector by thread). */
START_TEST(test_family_swiglu) {
    const QkFamily *f = family(kFams[_i]);
    if (!f) return;
    enum { N = 1003 };
    float g[N], u[N], got[N], part[N];
    Rng r;
    rng_seed(&r, 31);
    for (int i = 0; i < N; i++) {
        double mag = pow(2.0, -20.0 + 27.0 * rng_uniform(&r)); /* 2^-20 .. 2^7 */
        g[i] = (float)((i & 1 ? -1 : 1) * (mag > 100 ? 100 : mag));
        u[i] = (float)(rng_uniform(&r) * 6.0 - 3.0);
    }
    g[0] = 0.0f, g[1] = -0.0f, g[2] = 88.8f, g[3] = -88.8f, g[4] = -87.0f, g[5] = 87.0f;
    memcpy(got, g, sizeof g);
    qk_swiglu(f, got, u, N);
    for (int i = 0; i < N; i++) {
        double ref = (double)g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        ck_assert_msg(fabs(got[i] - ref) <= 1e-37 + 1e-6 * fabs(ref),
                      "%s: swiglu(%.9g, %.9g) = %.9g, want %.9g", f->name, g[i], u[i], got[i], ref);
    }
    memcpy(part, g, sizeof g);
    static const int cuts[] = {0, 5, 13, 16, 99, 100, 517, 1000, N};
    for (int k = 0; k + 1 < (int)(sizeof cuts / sizeof cuts[0]); k++)
        qk_swiglu(f, part + cuts[k], u + cuts[k], cuts[k + 1] - cuts[k]);
    ck_assert_msg(memcmp(part, got, sizeof got) == 0, "%s: swiglu depends on the split", f->name);
    float sg[3] = {NAN, INFINITY, -INFINITY}, su[3] = {1.0f, 2.0f, 1.0f};
    qk_swiglu(f, sg, su, 3);
    ck_assert_msg(isnan(sg[0]) && sg[1] == INFINITY && isnan(sg[2]),
                  "%s: swiglu(nan, inf, -inf) = %g %g %g", f->name, sg[0], sg[1], sg[2]);
}
END_TEST

/* A family's RMS norm (qk_rmsnorm) against the double-precision norm for row lengths on
 * and off its lanes, in place as out of place. */
START_TEST(test_family_rmsnorm) {
    const QkFamily *f = family(kFams[_i]);
    if (!f) return;
    static const int ns[] = {1, 7, 64, 100, 576, 1003};
    float x[1003], w[1003], o[1003], io[1003];
    Rng r;
    rng_seed(&r, 37);
    for (int k = 0; k < (int)(sizeof ns / sizeof ns[0]); k++) {
        int n = ns[k];
        double ss = 0;
        for (int i = 0; i < n; i++) {
            x[i] = (float)((rng_uniform(&r) - 0.5) * (k + 1) * 3.0);
            w[i] = (float)(rng_uniform(&r) * 2.0);
            ss += (double)x[i] * x[i];
        }
        double rr = 1.0 / sqrt(ss / n + 1e-5);
        qk_rmsnorm(f, o, x, w, n, 1e-5f);
        memcpy(io, x, sizeof(float) * (size_t)n);
        qk_rmsnorm(f, io, io, w, n, 1e-5f);
        for (int i = 0; i < n; i++) {
            double ref = w[i] * (x[i] * rr);
            ck_assert_msg(fabs(o[i] - ref) <= 1e-30 + 2e-6 * fabs(ref),
                          "%s: n %d, element %d: %.9g, want %.9g", f->name, n, i, o[i], ref);
        }
        ck_assert_msg(memcmp(o, io, sizeof(float) * (size_t)n) == 0, "%s: in place differs", f->name);
    }
}
END_TEST

/* n values for quantizer trial `trial`: magnitude 10^(trial % 7 - 3), exact halves of the
 * scale when trial % 5 == 1, and with `zero` the first block of every row of `row` values
 * all zeros. */
static void quant_trial_values(Rng *r, int trial, float *x, int n, int row, int zero) {
    float mag = powf(10.0f, (float)(trial % 7) - 3.0f);
    for (int i = 0; i < n; i++) {
        float u = (float)(rng_uniform(r) * 2 - 1) * mag;
        x[i] = trial % 5 == 1 ? (float)((int)(u / mag * 254) / 2) : u; /* halves */
        if (zero && i % row < QK_BLOCK) x[i] = 0; /* an all-zero block */
    }
}

/* A family's quantizer (qk_quantize) gives the portable loops' bits (which the tests
 * below hold to the plainest loop): magnitudes from 1e-3 to 1e3, exact halves of the
 * scale, blocks of zeros, a block with a NaN, several rows a call. */
START_TEST(test_family_quantize_bits) {
    const QkFamily *f = family(kFams[_i]);
    if (!f) return;
    enum { IN = 288, ROWS = 3, NB = IN / QK_BLOCK };
    float x[ROWS * IN];
    QkQ8 got[ROWS * NB], want[ROWS * NB];
    Rng r;
    rng_seed(&r, 41);
    for (int trial = 0; trial < 60; trial++) {
        quant_trial_values(&r, trial, x, ROWS * IN, IN, trial % 4 == 3);
        if (trial % 6 == 2) x[IN + 40] = NAN; /* row 1, block 1 */
        qk_quantize(f, x, ROWS, IN, got);
        qk_quantize_rows(x, ROWS, IN, want);
        for (int b = 0; b < ROWS * NB; b++)
            ck_assert_msg(memcmp(&got[b], &want[b], sizeof got[b]) == 0,
                          "%s trial %d block %d: d %.9g s %.9g q0 %d, portable %.9g %.9g %d",
                          f->name, trial, b, got[b].d, got[b].s, got[b].q[0], want[b].d,
                          want[b].s, want[b].q[0]);
    }
}
END_TEST

/* Activation quantization rounds as roundf (ties away from zero, as llama.cpp): with
 * max|x| = 127 the scale is 1, so exact halves and the float just below 0.5 hit the
 * cases an "add 0.5 and truncate" shortcut gets wrong. */
START_TEST(test_quantize_rounds_ties_away) {
    float x[QK_BLOCK] = {127.0f, -126.5f, 2.5f, -2.5f, 0.5f, -0.5f, 0.49999997f, -0.49999997f,
                         1.4999999f, 3.5000002f, -0.0f, 126.49999f};
    int want[QK_BLOCK] = {127, -127, 3, -3, 1, -1, 0, 0, 1, 4, 0, 126};
    for (int i = 12; i < QK_BLOCK; i++) {
        x[i] = (float)(i - 20) * 0.25f; /* -2 .. 2.75 in quarters: more halves */
        want[i] = (int)roundf(x[i]);
    }
    QkQ8 q;
    qk_quantize_rows(x, 1, QK_BLOCK, &q);
    ck_assert_float_eq(q.d, 1.0f);
    int sum = 0;
    for (int i = 0; i < QK_BLOCK; i++) {
        ck_assert_msg(q.q[i] == want[i], "x[%d] = %.9g quantized to %d, want %d", i, x[i],
                      q.q[i], want[i]);
        sum += want[i];
    }
    ck_assert_float_eq(q.s, (float)sum);
}
END_TEST

/* Random rows (magnitudes from 1e-3 to 1e3, exact halves of the scale, zero blocks)
 * quantize exactly as the plainest loop: d = max|x|/127, q = roundf(x / d) via the
 * reciprocal, clamped, s = d * sum(q). */
START_TEST(test_quantize_matches_plain_loop) {
    Rng r;
    rng_seed(&r, 17);
    int in = 256, nb = in / QK_BLOCK;
    float x[256];
    QkQ8 q[8];
    for (int trial = 0; trial < 200; trial++) {
        quant_trial_values(&r, trial, x, in, in, trial % 11 == 3);
        qk_quantize_rows(x, 1, in, q);
        for (int b = 0; b < nb; b++) {
            const float *v = x + b * QK_BLOCK;
            float amax = 0;
            for (int i = 0; i < QK_BLOCK; i++) amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
            float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
            int sum = 0;
            for (int i = 0; i < QK_BLOCK; i++) {
                float w = roundf(v[i] * id);
                w = w > 127 ? 127 : w < -127 ? -127 : w;
                ck_assert_msg(q[b].q[i] == (int)w, "trial %d block %d: x %.9g -> %d, want %d",
                              trial, b, v[i], q[b].q[i], (int)w);
                sum += (int)w;
            }
            ck_assert(memcmp(&q[b].d, &d, sizeof d) == 0);
            float s = d * (float)sum;
            ck_assert(memcmp(&q[b].s, &s, sizeof s) == 0);
        }
    }
}
END_TEST

static void count_task(void *arg, int tid, int nth) {
    _Atomic int *hits = arg;
    atomic_fetch_add(&hits[tid], 1);
    ck_assert_int_lt(tid, nth);
}

START_TEST(test_threadpool_runs_every_worker) {
    for (int n = 1; n <= 3; n++) {
        ThreadPool *tp = NULL;
        RsErr e = {0};
        ck_assert_int_eq(threadpool_create(n, 1, &tp, &e), RS_OK);
        ck_assert_int_eq(threadpool_size(tp), n);
        _Atomic int hits[4] = {0};
        for (int k = 0; k < 200; k++) threadpool_run(tp, count_task, hits);
        for (int t = 0; t < 4; t++) ck_assert_int_eq(hits[t], t < n ? 200 : 0);
        threadpool_destroy(&tp);
        ck_assert_ptr_null(tp);
    }
    int lo, hi, sum = 0;
    for (int t = 0; t < 3; t++) {
        threadpool_share(10, t, 3, &lo, &hi);
        sum += hi - lo;
    }
    ck_assert_int_eq(sum, 10);
}
END_TEST

typedef struct {
    _Atomic int hits[1000];
    int pool;
} ChunkHits;

static void chunk_task(void *arg, int i, int n, int tid) {
    ChunkHits *h = arg;
    ck_assert_int_lt(i, n);
    ck_assert_int_lt(tid, h->pool);
    atomic_fetch_add(&h->hits[i], 1);
}

/* threadpool_run_chunks runs every chunk exactly once, from 1 chunk to many more chunks
 * than threads, and names a thread of the pool. */
START_TEST(test_threadpool_chunks_each_once) {
    static const int counts[] = {1, 2, 5, 64, 1000};
    for (int n = 1; n <= 3; n++) {
        ThreadPool *tp = NULL;
        RsErr e = {0};
        ck_assert_int_eq(threadpool_create(n, 1, &tp, &e), RS_OK);
        for (int c = 0; c < 5; c++) {
            static ChunkHits h;
            memset(&h, 0, sizeof h);
            h.pool = n;
            for (int k = 0; k < 50; k++) threadpool_run_chunks(tp, chunk_task, &h, counts[c]);
            for (int i = 0; i < 1000; i++)
                ck_assert_msg(h.hits[i] == (i < counts[c] ? 50 : 0),
                              "pool %d, %d chunks: chunk %d ran %d times", n, counts[c], i,
                              (int)h.hits[i]);
        }
        threadpool_destroy(&tp);
    }
}
END_TEST

/* ---- forward invariance ---- */

#define PREFIX 12
#define TREE 65

static Backend *backend(const Model *m, int threads) {
    BackendParams bp = {.kv_capacity = 128, .max_batch = TREE, .max_pending = TREE,
                        .threads = threads};
    Backend *b = NULL;
    RsErr e = {0};
    ck_assert_msg(backend_create(&cpu_backend_ops, m, &bp, &b, &e) == RS_OK, "%s", e.msg);
    return b;
}

/* Logits of a 3-token chain c[0..2] after the prefix, three ways: (A) prefix + chain as one
 * prefill chunk, (B) prefix committed then one token per pass, (C) prefix committed then
 * one 65-row tree pass with the chain at rows 10, 20, 40 (each attending to its chain
 * ancestors only) among random rows with random masks. All bitwise equal. */
static void check_invariance(const Model *m, int threads, uint64_t seed) {
    int V = m->cfg.vocab_size, toks[PREFIX + 3], pos[TREE], rows[TREE];
    Rng r;
    rng_seed(&r, seed);
    for (int i = 0; i < PREFIX + 3; i++) toks[i] = (int)(rng_next(&r) % (uint64_t)V);
    for (int i = 0; i < TREE; i++) pos[i] = rows[i] = i;
    float *la = rs_xmalloc(sizeof(float) * 3 * V), *lb = rs_xmalloc(sizeof(float) * 3 * V);
    float *lc = rs_xmalloc(sizeof(float) * TREE * V);
    Backend *b = backend(m, threads);
    RsErr e = {0};
    int last3[3] = {PREFIX, PREFIX + 1, PREFIX + 2};
    ck_assert_int_eq(backend_forward(b, toks, pos, PREFIX + 3, NULL, last3, 3, la, &e), RS_OK);
    backend_kv_reset(b);
    ck_assert_int_eq(backend_forward(b, toks, pos, PREFIX, NULL, NULL, 0, NULL, &e), RS_OK);
    ck_assert_int_eq(backend_kv_commit(b, rows, PREFIX, &e), RS_OK);
    for (int k = 0; k < 3; k++) {
        int p = PREFIX + k, zero = 0;
        ck_assert_int_eq(backend_forward(b, toks + PREFIX + k, &p, 1, NULL, &zero, 1,
                                         lb + (size_t)k * V, &e), RS_OK);
        ck_assert_int_eq(backend_kv_commit(b, &zero, 1, &e), RS_OK);
    }
    backend_kv_reset(b);
    ck_assert_int_eq(backend_forward(b, toks, pos, PREFIX, NULL, NULL, 0, NULL, &e), RS_OK);
    ck_assert_int_eq(backend_kv_commit(b, rows, PREFIX, &e), RS_OK);
    static uint8_t mask[TREE * TREE];
    int tt[TREE], tp[TREE], chain[3] = {10, 20, 40};
    memset(mask, 0, sizeof mask);
    for (int i = 0; i < TREE; i++) {
        tt[i] = (int)(rng_next(&r) % (uint64_t)V);
        tp[i] = PREFIX + (int)(rng_next(&r) % 5);
        mask[i * TREE + i] = 1;
        for (int j = 0; j < i; j++) mask[i * TREE + j] = rng_next(&r) % 3 == 0;
    }
    for (int k = 0; k < 3; k++) {
        int i = chain[k];
        tt[i] = toks[PREFIX + k];
        tp[i] = PREFIX + k;
        memset(mask + i * TREE, 0, TREE);
        for (int q = 0; q <= k; q++) mask[i * TREE + chain[q]] = 1;
    }
    ck_assert_int_eq(backend_forward(b, tt, tp, TREE, mask, rows, TREE, lc, &e), RS_OK);
    for (int k = 0; k < 3; k++) {
        ck_assert_msg(!memcmp(la + (size_t)k * V, lb + (size_t)k * V, sizeof(float) * V),
                      "%s, %d threads: chain %d differs between prefill chunk and one by one",
                      cpu_backend_kernels(b), threads, k);
        ck_assert_msg(!memcmp(lc + (size_t)chain[k] * V, lb + (size_t)k * V, sizeof(float) * V),
                      "%s, %d threads: chain %d differs between tree pass and one by one",
                      cpu_backend_kernels(b), threads, k);
    }
    backend_destroy(&b);
    free(la);
    free(lb);
    free(lc);
}

START_TEST(test_forward_batch_invariant) {
    static const uint32_t types[] = {QT_F32, QT_BF16, QT_Q8_0, QT_Q4_1};
    for (int ti = 0; ti < 4; ti++) {
        Model *m = tu_random_model_typed(_i == 0 ? ARCH_LLAMA : ARCH_QWEN2, 64, 96, 2, 4, 2, 80,
                                         11 + ti, types[ti]);
        for (int th = 1; th <= 2; th++) check_invariance(m, th, 100 + ti);
        model_destroy(&m);
    }
}
END_TEST

/* The same on the golden Q4_K_M-style GGUF (Q4_K, Q5_K, Q6_K, Q5_0 and Q5_1 matrices),
 * whose K-quant products take per-256 activations on x86. */
START_TEST(test_forward_batch_invariant_kquant) {
    Model *m = NULL;
    RsErr e = {0};
    ck_assert_msg(model_load("tests/fixtures/golden/llama_q4km/model.gguf", &m, &e) == RS_OK,
                  "%s", e.msg);
    for (int th = 1; th <= 2; th++) check_invariance(m, th, 200 + th);
    model_destroy(&m);
}
END_TEST

START_TEST(test_forward_batch_invariant_default) {
    Model *m = NULL;
    RsErr e = {0};
    ck_assert_msg(model_load(tu_default_model_path(), &m, &e) == RS_OK, "%s", e.msg);
    check_invariance(m, 2, 7);
    model_destroy(&m);
}
END_TEST

/* Logits of every row of a 15-token prefill. */
static float *prefill_logits(const Model *m, int threads) {
    int V = m->cfg.vocab_size, toks[15], pos[15];
    for (int i = 0; i < 15; i++) toks[i] = (int)((i * 7919u + 13) % (unsigned)V), pos[i] = i;
    float *l = rs_xmalloc(sizeof(float) * 15 * V);
    Backend *b = backend(m, threads);
    RsErr e = {0};
    ck_assert_int_eq(backend_forward(b, toks, pos, 15, NULL, pos, 15, l, &e), RS_OK);
    backend_destroy(&b);
    return l;
}

/* backend_model_load lays out the matrices the dispatched family has x4 kernels for
 * (model_pack_x4), and the forward then gives the row layout's logits bit for bit at 1 and
 * 2 threads, a tied head's embeddings read from x4 tiles included (the default model), and
 * stays batch invariant. */
START_TEST(test_forward_x4_same_bits) {
    const char *paths[] = {"tests/fixtures/loader/tiny.gguf",
                           "tests/fixtures/golden/llama_q4km/model.gguf", tu_default_model_path()};
    Model *m = NULL, *p = NULL;
    RsErr e = {0};
    ck_assert_msg(model_load(paths[_i], &m, &e) == RS_OK, "%s", e.msg);
    ck_assert_msg(backend_model_load(&cpu_backend_ops, paths[_i], NULL,
                                     &p, &e) == RS_OK, "%s", e.msg);
    const QkFamily *f = qk_family_pick(NULL, &e); /* the family a NULL BackendParams picks */
    QTensor *w[MODEL_MAX_MATRICES(64)];
    ck_assert_int_le(p->cfg.n_layers, 64);
    int n = model_matrices(p, w), packed = 0, want = 0;
    for (int i = 0; i < n; i++) {
        packed += w[i]->packed;
        want += w[i]->data && qk_family_packs(f, w[i]->type) && w[i]->rows % 4 == 0;
    }
    ck_assert_int_eq(packed, want);
    if (_i == 2) ck_assert_int_ge(packed, 7 * p->cfg.n_layers); /* the default model's */
    for (int th = 1; th <= 2; th++) {
        float *l = prefill_logits(m, th), *lp = prefill_logits(p, th);
        ck_assert_msg(!memcmp(l, lp, sizeof(float) * 15 * m->cfg.vocab_size),
                      "%s, %d threads: x4 logits differ", paths[_i], th);
        free(l), free(lp);
    }
    check_invariance(p, 2, 300 + _i);
    model_destroy(&m);
    model_destroy(&p);
}
END_TEST

/* BackendSwitches.cpu_unpacked (ROOTSPEC_CPU_PACK=0) keeps the file's rows; by default
 * the family's x4 layout. */
START_TEST(test_pack_switch) {
    const char *path = "tests/fixtures/loader/tiny.gguf";
    Model *m = NULL;
    RsErr e = {0};
    BackendParams bp = {0};
    ck_assert_msg(backend_model_load(&cpu_backend_ops, path, &bp, &m, &e) == RS_OK, "%s", e.msg);
    int packs = qk_family_packs(qk_family_pick(NULL, &e), m->w.layers[0].w_up.type);
    ck_assert_int_eq(m->w.layers[0].w_up.packed != 0, packs != 0);
    model_destroy(&m);
    bp.sw.cpu_unpacked = 1;
    ck_assert_msg(backend_model_load(&cpu_backend_ops, path, &bp, &m, &e) == RS_OK, "%s", e.msg);
    ck_assert(m->resident && !m->w.layers[0].w_up.packed && !m->w.wcls.packed);
    model_destroy(&m);
    if (!packs) fprintf(stderr, "cpu_kernels: this family packs no tiny.gguf matrix\n");
}
END_TEST

Suite *suite_cpu_kernels(void) {
    Suite *s = suite_create("cpu_kernels");
    TCase *tc = tcase_create("kernels");
    tcase_add_loop_test(tc, test_kernels_vs_double, 0, N_FAMS);
    tcase_add_loop_test(tc, test_kernels_batch_invariant, 0, N_FAMS);
    tcase_add_loop_test(tc, test_kernels_wide_rows, 0, N_FAMS);
    tcase_add_loop_test(tc, test_kernels_q5_extremes, 0, N_FAMS);
    tcase_add_loop_test(tc, test_kernels_perm_rows, 0, N_FAMS);
    tcase_add_test(tc, test_x4_layout_round_trip);
    tcase_add_test(tc, test_x4_layout_round_trip_k);
    tcase_add_loop_test(tc, test_kernels_x4_bitwise, 0, N_FAMS);
    tcase_add_test(tc, test_kernels_vtile_bitwise_avx2);
    tcase_add_loop_test(tc, test_kernels_emu_bitwise_avx2, 0, 2);
    tcase_add_loop_test(tc, test_kernels_float_wide_bitwise, 0, 2);
    tcase_add_loop_test(tc, test_kernels_float_model_cols_bitwise, 0, 2);
    tcase_add_test(tc, test_family_pick);
    tcase_add_test(tc, test_threadpool_runs_every_worker);
    tcase_add_test(tc, test_threadpool_chunks_each_once);
    tcase_add_test(tc, test_quantize_rounds_ties_away);
    tcase_add_test(tc, test_quantize_matches_plain_loop);
    tcase_add_test(tc, test_attention_matches_plain_loops);
    tcase_add_loop_test(tc, test_family_attention_vs_reference, 0, N_FAMS);
    tcase_add_loop_test(tc, test_family_to_f16_rounds, 0, N_FAMS);
    tcase_add_loop_test(tc, test_family_swiglu, 0, N_FAMS);
    tcase_add_loop_test(tc, test_family_rmsnorm, 0, N_FAMS);
    tcase_add_loop_test(tc, test_family_quantize_bits, 0, N_FAMS);
    tcase_add_loop_test(tc, test_forward_batch_invariant, 0, 2);
    tcase_add_test(tc, test_forward_batch_invariant_kquant);
    suite_add_tcase(s, tc);
    TCase *td = tcase_create("default_model");
    tcase_set_timeout(td, 300);
    tcase_add_test(td, test_forward_batch_invariant_default);
    tcase_add_loop_test(td, test_forward_x4_same_bits, 0, 3);
    tcase_add_test(td, test_pack_switch);
    suite_add_tcase(s, td);
    return s;
}
