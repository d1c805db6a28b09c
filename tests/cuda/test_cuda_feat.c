/* EAGLE-3 feature recording on the CUDA backend against the CPU reference (f32 kernels):
 * every layer index 0..N over a graph-bucket prefill, a large eager prefill and a tree
 * round whose commit keeps entries out of order. The CUDA backend stores them bf16 and its
 * forward rounds weights and GEMM inputs to bf16, so a feature may differ by
 * CU_TOL_FRAC * max|ref| of its layer block (the logits' calibration, tests/cuda/
 * test_cuda_forward.c); a wrong row or layer differs by O(max|ref|). Recording must not
 * change the logits (bitwise), and a bf16 read is the f32 read exactly. */
#include <math.h>
#include <string.h>
#include "cuda_testutil.h"
#include "kernels/backend.h"
#include "kernels/prefill.h"
#include "tests/testutil.h"

#define V 96
#define D 64
#define NL 3
#define W ((NL + 1) * D)

/* rows x W features: each (row, layer) block within CU_TOL_FRAC of its max|ref|. */
static void compare_features(const char *label, const float *got, const float *ref, int rows,
                             float *worst) {
    for (int r = 0; r < rows; r++)
        for (int l = 0; l <= NL; l++) {
            const float *g = got + (size_t)r * W + l * D, *f = ref + (size_t)r * W + l * D;
            float mx = 0, d = 0;
            for (int i = 0; i < D; i++) {
                mx = fmaxf(mx, fabsf(f[i]));
                d = fmaxf(d, fabsf(g[i] - f[i]));
            }
            if (d > *worst * (mx > 0 ? mx : 1)) *worst = d / (mx > 0 ? mx : 1);
            ck_assert_msg(d <= CU_TOL_FRAC * mx, "%s row %d layer %d: |d| %g > %g x max|ref| %g",
                          label, r, l, (double)d, (double)CU_TOL_FRAC, (double)mx);
        }
}

/* The scripted run on one backend: prefill 9 (bucket 16), root + a 4-node tree, commit
 * {0, 3, 1}, then prefill 80 more (eager, > 65 rows). Features of each commit into f
 * (9 + 3 + 80 rows), logits of the tree pass into lg (5, V). */
static void script(Backend *b, float *f, float *lg) {
    RsErr e = {0};
    int toks[80];
    for (int i = 0; i < 80; i++) toks[i] = (i * 37 + 5) % V;
    ck_assert_msg(backend_prefill_features(b, toks, 9, NULL, f, &e) == 0, "%s", e.msg);
    int tt[5] = {11, 12, 13, 14, 15}, tp[5] = {9, 10, 10, 11, 11}, rows[5] = {0, 1, 2, 3, 4};
    /* 0 root; 1, 2 children of 0; 3 child of 1; 4 child of 2 */
    uint8_t mask[25] = {1, 0, 0, 0, 0, /**/ 1, 1, 0, 0, 0, /**/ 1, 0, 1, 0, 0,
                        /**/ 1, 1, 0, 1, 0, /**/ 1, 0, 1, 0, 1};
    ck_assert_msg(backend_forward(b, tt, tp, 5, mask, rows, 5, lg, &e) == 0, "%s", e.msg);
    int keep[3] = {0, 3, 1};
    ck_assert(backend_kv_commit(b, keep, 3, &e) == 0);
    ck_assert_int_eq(backend_feature_rows(b), backend_feature_width(b) ? 3 : 0);
    backend_read_features(b, BACKEND_FEAT_F32, f + (size_t)9 * W);
    ck_assert_msg(backend_prefill_features(b, toks, 80, NULL, f + (size_t)12 * W, &e) == 0, "%s",
                  e.msg);
}

START_TEST(test_cuda_features_vs_cpu) {
    CU_REQUIRE_DEVICE();
    Model *m = tu_random_model(ARCH_LLAMA, D, 2 * D, NL, 4, 2, V, 9031);
    Backend *cpu = cu_backend_make(&cpu_backend_ops, m, 128, 96, 96);
    Backend *gpu = cu_backend_make(cuda_backend_ops_get(), m, 128, 96, 96);
    Backend *off = cu_backend_make(cuda_backend_ops_get(), m, 128, 96, 96);
    int layers[NL + 1] = {0, 1, 2, 3};
    RsErr e = {0};
    ck_assert_msg(backend_set_feature_layers(cpu, layers, NL + 1, &e) == 0, "%s", e.msg);
    ck_assert_msg(backend_set_feature_layers(gpu, layers, NL + 1, &e) == 0, "%s", e.msg);
    size_t n = (size_t)92 * W;
    float *fc = calloc(n, sizeof(float)), *fg = calloc(n, sizeof(float)),
          *fo = calloc(n, sizeof(float));
    float lc[5 * V], lgp[5 * V], lo[5 * V], worst = 0;
    script(cpu, fc, lc);
    script(gpu, fg, lgp);
    script(off, fo, lo); /* not recording: no features, same logits */
    compare_features("cuda vs cpu", fg, fc, 92, &worst);
    ck_assert_msg(memcmp(lgp, lo, sizeof lo) == 0, "recording features changed the logits");
    for (size_t i = 0; i < (size_t)92 * W; i++) ck_assert(fo[i] == 0.0f);
    /* the kept rows are the right ones: row 1 of the commit is node 3, not node 1 */
    ck_assert(memcmp(fg + (size_t)10 * W, fg + (size_t)11 * W, sizeof(float) * W) != 0);
    uint16_t *h = malloc(sizeof(uint16_t) * (size_t)3 * W);
    /* the last commit is the 80-token prefill's last chunk */
    int rows = backend_feature_rows(gpu);
    ck_assert_int_gt(rows, 0);
    h = realloc(h, sizeof(uint16_t) * (size_t)rows * W);
    float *fr = malloc(sizeof(float) * (size_t)rows * W);
    backend_read_features(gpu, BACKEND_FEAT_BF16, h);
    backend_read_features(gpu, BACKEND_FEAT_F32, fr);
    for (size_t i = 0; i < (size_t)rows * W; i++) ck_assert(cu_round_bf16(fr[i]) == fr[i]);
    for (size_t i = 0; i < (size_t)rows * W; i++) {
        uint32_t u = (uint32_t)h[i] << 16;
        float v;
        memcpy(&v, &u, 4);
        ck_assert(v == fr[i]);
    }
    printf("cuda features vs cpu: worst |d| / max|ref| = %.4f over 92 rows x %d layers\n",
           (double)worst, NL + 1);
    ck_assert_int_eq(backend_set_feature_layers(gpu, NULL, 0, &e), 0);
    free(h);
    free(fr);
    free(fc);
    free(fg);
    free(fo);
    backend_destroy(&cpu);
    backend_destroy(&gpu);
    backend_destroy(&off);
    model_destroy(&m);
}
END_TEST

Suite *suite_cuda_feat(void) {
    Suite *s = suite_create("cuda_feat");
    TCase *tc = tcase_create("cuda_feat");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_cuda_features_vs_cpu);
    suite_add_tcase(s, tc);
    return s;
}
