/* rootspec-convert's conversion (gguf_convert, common/model.h) and the f32 -> f16 / bf16
 * rounding it uses (common/quant.h). */
#include "common/model.h"
#include "common/quant.h"
#include "common/rng.h"
#include "testutil.h"
#include <check.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Every f16 value converts back to itself; halfway cases go to the even neighbour; overflow
 * and underflow at their edges; NaN stays NaN. */
START_TEST(test_f16_rounding) {
    for (uint32_t h = 0; h < 65536; h++) {
        float f = quant_f16_to_f32((uint16_t)h);
        if (isnan(f)) ck_assert(isnan(quant_f16_to_f32(quant_f32_to_f16(f))));
        else ck_assert_msg(quant_f32_to_f16(f) == h, "f16 %04x -> %g -> %04x", h, f,
                           quant_f32_to_f16(f));
    }
    /* halfway between 1 (0x3c00) and 1 + 2^-10 goes down to even, above it up */
    ck_assert_uint_eq(quant_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
    ck_assert_uint_eq(quant_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
    ck_assert_uint_eq(quant_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02); /* odd below: up */
    ck_assert_uint_eq(quant_f32_to_f16(65504.0f), 0x7bff);
    ck_assert_uint_eq(quant_f32_to_f16(65519.0f), 0x7bff);
    ck_assert_uint_eq(quant_f32_to_f16(65520.0f), 0x7c00); /* halfway to 2^16: to infinity */
    ck_assert_uint_eq(quant_f32_to_f16(-1e30f), 0xfc00);
    ck_assert_uint_eq(quant_f32_to_f16(0x1p-25f), 0x0000);  /* halfway to the least: even */
    ck_assert_uint_eq(quant_f32_to_f16(0x1.8p-25f), 0x0001);
    ck_assert_uint_eq(quant_f32_to_f16(0x1.8p-24f), 0x0002); /* 1.5 least: up to even */
    ck_assert_uint_eq(quant_f32_to_f16(0x1.ffcp-15f), 0x0400); /* rounds up to the least normal */
    /* bf16: the top half, rounded to nearest even */
    ck_assert_uint_eq(quant_f32_to_bf16(1.0f), 0x3f80);
    ck_assert_uint_eq(quant_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    ck_assert_uint_eq(quant_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    ck_assert(isnan(quant_bf16_to_f32(quant_f32_to_bf16(NAN))));
}
END_TEST

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("f16c"))) static uint16_t f16c(float f) { return (uint16_t)_cvtss_sh(f, 0); }
#endif

/* On random f32 bit patterns the portable rounding is F16C's (where the CPU has it). */
START_TEST(test_f16_rounding_vs_f16c) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (!__builtin_cpu_supports("f16c")) return;
    Rng r;
    rng_seed(&r, 16);
    for (int i = 0; i < 2000000; i++) {
        uint32_t b = (uint32_t)rng_next(&r);
        if (i % 2) b = (b & 0x87ffffffu) | 0x38000000u; /* most in f16's range */
        float f;
        memcpy(&f, &b, 4);
        if (isnan(f)) continue;
        ck_assert_msg(quant_f32_to_f16(f) == f16c(f), "%a: %04x, F16C %04x", (double)f,
                      quant_f32_to_f16(f), f16c(f));
    }
#endif
}
END_TEST

/* The converted file loads with the same configuration, and every matrix element is the
 * input's dequantized element rounded to the new type; vectors keep their values. */
static void check_convert(const char *fixture, uint32_t type) {
    char dir[256], out[300];
    tu_dir_make(dir, sizeof dir, "rs-convert");
    snprintf(out, sizeof out, "%s/out.gguf", dir);
    RsErr e = {0};
    ck_assert_msg(gguf_convert(tu_fixture(fixture), out, type, &e) == 0, "%s", e.msg);
    Model *a, *b;
    ck_assert_msg(model_load(tu_fixture(fixture), &a, &e) == 0, "%s", e.msg);
    ck_assert_msg(model_load(out, &b, &e) == 0, "%s", e.msg);
    ck_assert_int_eq(a->cfg.dim, b->cfg.dim);
    ck_assert_int_eq(a->cfg.n_layers, b->cfg.n_layers);
    ck_assert_int_eq(a->cfg.vocab_size, b->cfg.vocab_size);
    ck_assert_int_eq(a->cfg.tied_embeddings, b->cfg.tied_embeddings);
    ck_assert_str_eq(a->chat_hint, b->chat_hint);
    QTensor *ma[MODEL_MAX_MATRICES(64)], *mb[MODEL_MAX_MATRICES(64)];
    int n = model_matrices(a, ma);
    ck_assert_int_eq(model_matrices(b, mb), n);
    int converted = 0;
    for (int i = 0; i < n; i++) {
        ck_assert_uint_eq(mb[i]->type, type);
        ck_assert_int_eq(ma[i]->rows, mb[i]->rows);
        ck_assert_int_eq(ma[i]->perm_hd, mb[i]->perm_hd);
        int cols = ma[i]->cols;
        float *x = rs_xmalloc(sizeof(float) * cols);
        for (int j = 0; j < ma[i]->rows; j++) {
            qtensor_dequantize_rows(ma[i], j, 1, x);
            const uint8_t *row = qtensor_row(mb[i], j);
            for (int c = 0; c < cols; c++) {
                uint16_t want = type == QT_F16 ? quant_f32_to_f16(x[c]) : quant_f32_to_bf16(x[c]);
                uint16_t got = (uint16_t)(row[2 * c] | row[2 * c + 1] << 8);
                ck_assert_msg(got == want, "%s matrix %d row %d col %d: %04x, want %04x",
                              fixture, i, j, c, got, want);
            }
        }
        free(x);
        converted += ma[i]->type != type;
    }
    ck_assert_int_gt(converted, 0);
    ck_assert_mem_eq(a->w.final_norm, b->w.final_norm, sizeof(float) * (size_t)a->cfg.dim);
    ck_assert_mem_eq(a->w.layers[0].attn_norm, b->w.layers[0].attn_norm,
                     sizeof(float) * (size_t)a->cfg.dim);
    model_destroy(&a);
    model_destroy(&b);
    tu_dir_remove(dir);
}

START_TEST(test_convert_round_trip) {
    check_convert("golden/llama_q4km/model.gguf", QT_F16); /* K-quants and Q5_0 */
    check_convert("golden/llama_q4km/model.gguf", QT_BF16);
    check_convert("golden/qwen2/qwen2.gguf", QT_BF16);
}
END_TEST

/* A file the engine does not load is not converted, and nothing is left at the output. */
START_TEST(test_convert_refuses) {
    char dir[256], out[300], bad[300];
    tu_dir_make(dir, sizeof dir, "rs-convert");
    snprintf(out, sizeof out, "%s/out.gguf", dir);
    snprintf(bad, sizeof bad, "%s/bad.gguf", dir);
    FILE *f = fopen(bad, "wb");
    fputs("GGUF but not really", f);
    fclose(f);
    RsErr e = {0};
    ck_assert_int_ne(gguf_convert(bad, out, QT_F16, &e), 0);
    ck_assert_msg(strstr(e.msg, "bad.gguf") != NULL, "%s", e.msg);
    ck_assert_int_ne(access(out, F_OK), 0);
    ck_assert_int_eq(gguf_convert(tu_fixture("golden/llama_q4km/model.gguf"), out, QT_Q8_0, &e),
                     RS_EINVAL);
    tu_dir_remove(dir);
}
END_TEST

Suite *suite_convert(void) {
    Suite *s = suite_create("convert");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_f16_rounding);
    tcase_add_test(tc, test_f16_rounding_vs_f16c);
    tcase_add_test(tc, test_convert_round_trip);
    tcase_add_test(tc, test_convert_refuses);
    suite_add_tcase(s, tc);
    return s;
}
