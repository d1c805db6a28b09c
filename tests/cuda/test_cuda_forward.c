/* Whole-forward tests of the CUDA backend: parity with the CPU reference backend on
 * tu_random_model models (Llama, Qwen2 bias, Qwen3 q/k norm) through prefill, tree pass
 * with a mask, out-of-order kv_commit and decode; the golden fixtures (transformers'
 * logits); the default model; and graph replay == eager launch.
 *
 * Tolerance: the CUDA backend rounds weights, GEMM inputs and the KV cache to bf16 (8 bit
 * mantissa), so logits may differ from the f32 reference by |d| <= CU_TOL_FRAC * max|ref|
 * (max over the compared rows). Calibrated on the CPU by rounding only the weights to bf16
 * in the CPU backend: max|d| / max|ref| = 0.005 (random models), 0.003 (golden llama),
 * 0.009 (SmolLM2, 0.28 of 31); 0.03 leaves room for the activation and KV rounding while a
 * real defect (mask, RoPE, cache slot) moves logits by O(max|ref|). The largest |d| is
 * printed. Top-1 must be identical unless the reference's own gap between its best logit
 * and ours is within that tolerance (a bf16-level tie). */
#include <cuda_runtime_api.h>
#include <math.h>
#include <string.h>
#include <unistd.h>
#include "common/rng.h"
#include "cuda_testutil.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/testutil.h"

/* One scripted round trip on both backends: prefill 9 (causal), commit all; tree pass of 6
 * tokens with a tree mask, commit {0, 3, 1} out of place; a 1-token pass with mask NULL;
 * commit; a 3-token pass on top of 2 pending (pending 0 visible to two of its rows);
 * drop all. */
typedef struct {
    int n, np_expect;
    int tokens[9], pos[9];
    int use_mask;
    uint8_t mask[9 * 16];
    int n_out, out_rows[9];
    int n_keep, keep[9]; /* -1: no commit after this step */
} Step;

static int run_script(Backend *b, const Model *m, float **out, int *n_rows) {
    int vocab = m->cfg.vocab_size;
    Step st[5];
    memset(st, 0, sizeof st);
    st[0].n = 9;
    for (int i = 0; i < 9; i++) st[0].tokens[i] = (i * 37 + 5) % vocab, st[0].pos[i] = i;
    st[0].n_out = 9;
    for (int i = 0; i < 9; i++) st[0].out_rows[i] = i;
    st[0].n_keep = 9;
    for (int i = 0; i < 9; i++) st[0].keep[i] = i;
    /* tree: 0 root, 1,2 children of 0; 3 child of 1; 4 child of 3; 5 child of 2 */
    int par[6] = {-1, 0, 0, 1, 3, 2}, depth[6] = {0, 1, 1, 2, 3, 2};
    st[1].n = 6;
    st[1].use_mask = 1;
    for (int i = 0; i < 6; i++) {
        st[1].tokens[i] = (i * 91 + 11) % vocab;
        st[1].pos[i] = 9 + depth[i];
        for (int a = i; a >= 0; a = par[a]) st[1].mask[i * 6 + a] = 1;
    }
    st[1].n_out = 4;
    int o1[4] = {5, 0, 3, 3};
    memcpy(st[1].out_rows, o1, sizeof o1);
    st[1].n_keep = 3;
    int k1[3] = {0, 3, 1}; /* root, then out of order: exercises the staged compaction */
    memcpy(st[1].keep, k1, sizeof k1);
    st[2].n = 2;
    st[2].tokens[0] = 7 % vocab, st[2].tokens[1] = 8 % vocab;
    st[2].pos[0] = 12, st[2].pos[1] = 13;
    st[2].n_out = 2;
    st[2].out_rows[0] = 1, st[2].out_rows[1] = 0;
    st[2].n_keep = -1;
    st[3].n = 3;
    /* stride 5: never pending 1; pending 0 (the slot right after the committed ones) for
     * rows 0 and 2 only, so a mask index off by one at that boundary changes row 1 */
    st[3].use_mask = 1;
    for (int i = 0; i < 3; i++) {
        st[3].tokens[i] = (i * 13 + 3) % vocab;
        st[3].pos[i] = 13 + i;
        st[3].mask[i * 5 + 0] = i != 1;
        for (int j = 0; j <= i; j++) st[3].mask[i * 5 + 2 + j] = 1;
    }
    st[3].n_out = 3;
    for (int i = 0; i < 3; i++) st[3].out_rows[i] = i;
    st[3].n_keep = 0;
    st[4].n = 1;
    st[4].tokens[0] = 1;
    st[4].pos[0] = 12;
    st[4].n_out = 1;
    st[4].n_keep = 1;
    int total = 0;
    for (int s = 0; s < 5; s++) total += st[s].n_out;
    *out = malloc(sizeof(float) * (size_t)total * vocab);
    *n_rows = total;
    float *o = *out;
    RsErr e = {0};
    for (int s = 0; s < 5; s++) {
        int rc = backend_forward(b, st[s].tokens, st[s].pos, st[s].n,
                                 st[s].use_mask ? st[s].mask : NULL, st[s].out_rows, st[s].n_out,
                                 o, &e);
        ck_assert_msg(rc == RS_OK, "%s step %d: %s", backend_name(b), s, e.msg);
        o += (size_t)st[s].n_out * vocab;
        if (st[s].n_keep >= 0)
            ck_assert_msg(backend_kv_commit(b, st[s].keep, st[s].n_keep, &e) == RS_OK, "%s", e.msg);
    }
    return total;
}

static const Arch kArchs[3] = {ARCH_LLAMA, ARCH_QWEN2, ARCH_QWEN3};

START_TEST(test_cuda_random_parity) {
    CU_REQUIRE_DEVICE();
    Model *m = tu_random_model(kArchs[_i], 128, 256, 3, 4, 2, 512, 77 + _i);
    Backend *cpu = cu_backend_make(&cpu_backend_ops, m, 64, 16, 16);
    Backend *gpu = cu_backend_make(cuda_backend_ops_get(), m, 64, 16, 16);
    float *a, *g;
    int na, ng;
    run_script(cpu, m, &a, &na);
    run_script(gpu, m, &g, &ng);
    ck_assert_int_eq(na, ng);
    float worst = 0;
    char label[64];
    snprintf(label, sizeof label, "random arch %d", (int)kArchs[_i]);
    int bad = cu_compare_logits(label, g, a, na, 512, &worst);
    ck_assert_int_eq(bad, 0);
    ck_assert_int_eq(backend_n_committed(gpu), backend_n_committed(cpu));
    free(a), free(g);
    backend_destroy(&cpu);
    backend_destroy(&gpu);
    model_destroy(&m);
}
END_TEST

/* Graph replay must equal eager launch of the same padded batch (same kernels, same
 * cuBLAS shapes): |d| <= 1e-6 (bitwise expected; the max is printed). Also checks the
 * counters and that repeated buckets are not re-captured. */
START_TEST(test_cuda_graph_vs_eager) {
    CU_REQUIRE_DEVICE();
    Model *m = tu_random_model(ARCH_LLAMA, 128, 256, 2, 4, 2, 512, 99);
    Backend *gr = cu_backend_make(cuda_backend_ops_get(), m, 64, 16, 16);
    Backend *ea = cu_backend_make(cuda_backend_ops_get(), m, 64, 16, 16);
    cuda_backend_set_graphs(gr, 1);
    cuda_backend_set_graphs(ea, 0);
    float *a, *b;
    int na, nb;
    run_script(gr, m, &a, &na);
    run_script(ea, m, &b, &nb);
    float mx = 0;
    int bad = tu_compare("graph vs eager", a, b, (size_t)na * 512, 1e-6f, 0.0f, &mx);
    fprintf(stderr, "graph vs eager: max |d| %.3g (%s), replays %llu captures %llu, eager %llu\n",
            mx, memcmp(a, b, sizeof(float) * na * 512) ? "not bitwise" : "bitwise",
            (unsigned long long)backend_stats(gr).graph_replays, (unsigned long long)backend_stats(gr).graph_captures,
            (unsigned long long)backend_stats(ea).eager_launches);
    ck_assert_int_eq(bad, 0);
    ck_assert_int_eq(backend_stats(gr).graph_replays, 5);
    ck_assert_int_eq(backend_stats(gr).eager_launches, 0);
    ck_assert_int_eq(backend_stats(ea).eager_launches, 5);
    ck_assert_int_eq(backend_stats(ea).graph_replays, 0);
    /* buckets used: 16 (9), 8 (6), 2 (2), 4 (3), 1 (1): five captures, then replays only */
    ck_assert_int_eq(backend_stats(gr).graph_captures, 5);
    backend_kv_reset(gr);
    free(a);
    run_script(gr, m, &a, &na);
    ck_assert_int_eq(backend_stats(gr).graph_captures, 5);
    ck_assert_int_eq(backend_stats(gr).graph_replays, 10);
    ck_assert_int_eq(tu_compare("graph replay again", a, b, (size_t)na * 512, 1e-6f, 0.0f, NULL), 0);
    free(a), free(b);
    backend_destroy(&gr);
    backend_destroy(&ea);
    model_destroy(&m);
}
END_TEST

/* Prefill larger than the largest bucket runs eagerly (and unpadded). */
START_TEST(test_cuda_large_prefill_eager) {
    CU_REQUIRE_DEVICE();
    Model *m = tu_random_model(ARCH_LLAMA, 64, 128, 2, 4, 1, 300, 5);
    int n = 100;
    Backend *cpu = cu_backend_make(&cpu_backend_ops, m, 128, n, n), *gpu = cu_backend_make(cuda_backend_ops_get(), m, 128, n, n);
    int tok[100], pos[100], rows[3] = {99, 0, 50};
    for (int i = 0; i < n; i++) tok[i] = (i * 7) % 300, pos[i] = i;
    float a[3 * 300], g[3 * 300], worst = 0;
    RsErr e = {0};
    ck_assert_int_eq(backend_forward(cpu, tok, pos, n, NULL, rows, 3, a, &e), RS_OK);
    ck_assert_msg(backend_forward(gpu, tok, pos, n, NULL, rows, 3, g, &e) == RS_OK, "%s", e.msg);
    ck_assert_int_eq(backend_stats(gpu).eager_launches, 1);
    ck_assert_int_eq(backend_stats(gpu).graph_replays, 0);
    int bad = cu_compare_logits("prefill 100", g, a, 3, 300, &worst);
    fprintf(stderr, "cuda prefill 100 tokens: max |d| %.4g\n", worst);
    ck_assert_int_eq(bad, 0);
    backend_destroy(&cpu), backend_destroy(&gpu), model_destroy(&m);
}
END_TEST

/* User errors are reported with messages, and a failed call changes nothing. */
START_TEST(test_cuda_errors) {
    CU_REQUIRE_DEVICE();
    Model *m = tu_random_model(ARCH_LLAMA, 64, 128, 1, 4, 2, 100, 6);
    const BackendOps *ops = cuda_backend_ops_get();
    BackendParams bp = {.kv_capacity = 8, .max_batch = 4, .max_pending = 6, .device = 999};
    Backend *b = NULL;
    RsErr e = {0};
    ck_assert_int_eq(backend_create(ops, m, &bp, &b, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "CUDA device 999 does not exist"), "%s", e.msg);
    ck_assert_ptr_null(b);
    bp.device = 0;
    b = cu_backend_make(ops, m, 8, 4, 6);
    int tok[5] = {1, 2, 3, 4, 5}, pos[5] = {0, 1, 2, 3, 4}, rows[1] = {0};
    float lg[100];
    ck_assert_int_eq(backend_forward(b, tok, pos, 5, NULL, rows, 1, lg, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "exceeds max_batch 4"), "%s", e.msg);
    tok[0] = 100;
    ck_assert_int_eq(backend_forward(b, tok, pos, 1, NULL, rows, 1, lg, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "token 100 at batch index 0"), "%s", e.msg);
    tok[0] = 1;
    uint8_t mask[4] = {0, 0, 0, 0};
    ck_assert_int_eq(backend_forward(b, tok, pos, 2, mask, rows, 1, lg, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "mask row 0 does not attend to its own token"), "%s", e.msg);
    ck_assert_int_eq(backend_n_pending(b), 0);
    ck_assert_int_eq(backend_forward(b, tok, pos, 4, NULL, rows, 1, lg, &e), RS_OK);
    ck_assert_int_eq(backend_forward(b, tok, pos, 3, NULL, rows, 1, lg, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "exceeds max_pending 6"), "%s", e.msg);
    int keep[2] = {1, 1};
    ck_assert_int_eq(backend_kv_commit(b, keep, 2, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "keeps pending entry 1 twice"), "%s", e.msg);
    ck_assert_int_eq(backend_kv_commit(b, keep, 1, &e), RS_OK);
    ck_assert_int_eq(backend_n_committed(b), 1);
    backend_destroy(&b);
    ck_assert_ptr_null(b);
    model_destroy(&m);
}
END_TEST

static const char *kGolden[] = {"llama", "llama/llama.gguf", "llama3_rope", "qwen2", "qwen3"};
static const char *kGoldenLogits[] = {"llama/logits.bin", "llama/logits.bin",
                                      "llama3_rope/logits.bin", "qwen2/logits.bin",
                                      "qwen3/logits.bin"};

START_TEST(test_cuda_golden) {
    CU_REQUIRE_DEVICE();
    char rel[256];
    snprintf(rel, sizeof rel, "golden/%s", kGoldenLogits[_i]);
    const char *lpath = cu_fixture(rel);
    snprintf(rel, sizeof rel, "golden/%s", kGolden[_i]);
    const char *mpath = cu_fixture(rel);
    if (!lpath || !mpath) {
        printf("SKIP: golden fixture %s missing (tests/fixtures/golden)\n", rel);
        cu_n_skipped++;
        return;
    }
    TuGolden g;
    tu_golden_read(lpath, &g);
    int n = g.n, vocab = g.vocab, *tokens = g.tokens;
    float *ref = g.logits;
    Model *m = NULL;
    RsErr e = {0};
    ck_assert_msg(model_load(mpath, &m, &e) == RS_OK, "model_load %s: %s", mpath, e.msg);
    ck_assert_int_eq(m->cfg.vocab_size, vocab);
    Backend *b = cu_backend_make(cuda_backend_ops_get(), m, n, n, n);
    int *pos = malloc(4 * (size_t)n), *rows = malloc(4 * (size_t)n);
    for (int i = 0; i < n; i++) pos[i] = rows[i] = i;
    float *got = malloc(4 * (size_t)n * vocab), worst = 0;
    /* one batch, then token by token (graph path, bucket 1) */
    ck_assert_msg(backend_forward(b, tokens, pos, n, NULL, rows, n, got, &e) == RS_OK, "%s", e.msg);
    int bad = cu_compare_logits(kGolden[_i], got, ref, n, vocab, &worst);
    backend_kv_reset(b);
    for (int i = 0; i < n; i++) {
        int zero = 0;
        ck_assert_int_eq(backend_forward(b, tokens + i, pos + i, 1, NULL, &zero, 1,
                                         got + (size_t)i * vocab, &e), RS_OK);
        ck_assert_int_eq(backend_kv_commit(b, &zero, 1, &e), RS_OK);
    }
    bad += cu_compare_logits(kGolden[_i], got, ref, n, vocab, &worst);
    ck_assert_int_eq(bad, 0);
    free(pos), free(rows), free(got);
    tu_golden_free(&g);
    backend_destroy(&b);
    model_destroy(&m);
}
END_TEST

/* Default model: CUDA vs CPU backend on a prompt + greedy continuation. */
START_TEST(test_cuda_default_model) {
    CU_REQUIRE_DEVICE();
    const char *path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (access(path, R_OK) != 0) {
        printf("SKIP: default model %s missing (run `make setup`): test_cuda_default_model\n", path);
        cu_n_skipped++;
        return;
    }
    Model *m = NULL;
    RsErr e = {0};
    ck_assert_msg(model_load(path, &m, &e) == RS_OK, "%s", e.msg);
    int vocab = m->cfg.vocab_size;
    Backend *cpu = cu_backend_make(&cpu_backend_ops, m, 128, 64, 64);
    Backend *gpu = cu_backend_make(cuda_backend_ops_get(), m, 128, 64, 64);
    int tok[64] = {1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 28, 7018, 411, 46,
                   2, 198, 1, 4093, 198, 21512, 1848, 314, 2254, 30};
    int n = 25, agree = 0;
    for (int i = 0; i < n; i++) tok[i] %= vocab;
    float worst = 0;
    int bad = cu_prefill_decode_parity("default", cpu, gpu, tok, n, 8, &agree, &worst);
    fprintf(stderr, "cuda default model: max |d| %.4g over %d+8 rows, greedy top-1 agree %d/8\n",
            worst, n, agree);
    ck_assert_int_eq(bad, 0);
    backend_destroy(&cpu), backend_destroy(&gpu);
    model_destroy(&m);
}
END_TEST

Suite *suite_cuda_forward(void) {
    Suite *s = suite_create("cuda_forward");
    TCase *tc = tcase_create("forward");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_cuda_random_parity, 0, 3);
    tcase_add_test(tc, test_cuda_graph_vs_eager);
    tcase_add_test(tc, test_cuda_large_prefill_eager);
    tcase_add_test(tc, test_cuda_errors);
    tcase_add_loop_test(tc, test_cuda_golden, 0, 5);
    suite_add_tcase(s, tc);
    /* its own case, so tools/gpu-check.sh --default-model can run it alone (CK_RUN_CASE) */
    TCase *dm = tcase_create("default_model");
    tcase_set_timeout(dm, 300);
    tcase_add_test(dm, test_cuda_default_model);
    suite_add_tcase(s, dm);
    return s;
}
