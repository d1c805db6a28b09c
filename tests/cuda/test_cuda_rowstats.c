/* The verifier's row queries on the CUDA backend (kernels/cuda/cuda_rowstats.cu) against the CPU
 * reference (common/logits.c row_stats, the same canonical order): argmax, runner-up and
 * draws exact (same index at the same uniform); log-sum-exp bitwise on the emulator, and
 * within 1e-12 relative on a GPU (its exp/log differ from the host's by an ulp, its fused
 * multiply-adds round once) and on the emulator built with FMA contraction; gathers
 * exact. Then the backend: backend_rows_stats / backend_rows_gather over the rows a
 * keeping forward left on the device equal the reference over the rows a copying forward
 * of the same batch returns, also for queries longer than the backend stages at once; a
 * CUDA target's decodes copy no whole row, and its walk down the tree makes one row query a
 * round with the tokens of one query per draw. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <string.h>
#include "common/logits.h"
#include "common/rng.h"
#include "cuda_testutil.h"
#include "draft_proc/model_drafter.h"
#include "target_proc/decode.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_rowstats.h"
#include "tests/testutil.h"

/* The emulator runs the kernels with the host's exp and log: bitwise equal, unless built
 * with FMA contraction (CUEMU_FMA), which rounds as a GPU's fused multiply-adds do. */
#if defined(ROOTSPEC_CUEMU) && !defined(CUEMU_FMA)
#define LSE_RTOL 0.0
#else
#define LSE_RTOL 1e-12
#endif

static void *dcopy(const void *h, size_t bytes) {
    void *d = NULL;
    CUDA_CHECK(cudaMalloc(&d, bytes));
    if (h) CUDA_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

/* Laws the device must reduce as the CPU does: greedy, plain, and each filter. */
#define N_LAWS 5
static const Sampling LAWS[N_LAWS] = {
    {0.0, 0, 0, 0}, {1.0, 0, 0, 0}, {0.7, 40, 0.9, 0}, {1.3, 0, 0.5, 0.02}, {0.4, 0, 0, 0.1}};

static void expect_stats(const RowStats *got, const RowStats *want, const char *what, int i) {
    ck_assert_msg(got->argmax == want->argmax && got->draw == want->draw &&
                      got->max == want->max && got->second == want->second &&
                      got->cut == want->cut,
                  "%s %d: argmax %d/%d draw %d/%d max %g/%g second %g/%g cut %g/%g", what, i,
                  got->argmax, want->argmax, got->draw, want->draw, got->max, want->max,
                  got->second, want->second, got->cut, want->cut);
    if (isnan(want->lse)) {
        ck_assert_msg(isnan(got->lse), "%s %d: lse %g, want NAN", what, i, got->lse);
        return;
    }
    ck_assert_msg(fabs(got->lse - want->lse) <= LSE_RTOL * fabs(want->lse),
                  "%s %d: lse %.17g vs %.17g", what, i, got->lse, want->lse);
}

/* Random rows with planted ties, near point masses and a one-entry-per-chunk tail;
 * vocabularies below one chunk, across a chunk edge, the default model's and Llama 3's. */
START_TEST(test_cuda_rows_kernels) {
    CU_REQUIRE_DEVICE();
    int sizes[] = {5, 257, 49152, 128256};
    Rng r;
    rng_seed(&r, 21);
    for (int si = 0; si < 4; si++) {
        int V = sizes[si], R = 9;
        float *h = malloc(sizeof(float) * (size_t)V * R);
        for (size_t i = 0; i < (size_t)V * R; i++) h[i] = (float)(rng_uniform(&r) * 8 - 4);
        h[(size_t)1 * V + V / 3] = h[(size_t)1 * V + V / 2] = 20.0f; /* tie: first wins */
        h[(size_t)2 * V + V - 1] = 80.0f;                            /* near point mass */
        for (int i = 0; i < V; i++) h[(size_t)3 * V + i] = 1.0f;    /* all equal */
        int rows[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 2, 1, 0}, n = 12;
        double u[12];
        for (int i = 0; i < n; i++) u[i] = rng_uniform(&r);
        u[3] = 0.0;
        u[4] = 0.9999999999999999;
        u[5] = -1.0; /* no draw */
        float *dl = dcopy(h, sizeof(float) * (size_t)V * R);
        int *dr = dcopy(rows, sizeof rows);
        double *du = dcopy(u, sizeof u);
        void *dc = dcopy(NULL, cuk_rows_stats_scratch_bytes(n, V));
        CUDA_CHECK(cudaMemset(dc, 0, cuk_rows_stats_scratch_bytes(n, V)));
        RowStats *ds = dcopy(NULL, sizeof(RowStats) * n), got[12], want;
        double *cs = malloc(sizeof(double) * row_chunks(V));
        for (int l = 0; l < N_LAWS; l++) {
            int temp = sampling_temp(&LAWS[l]);
            char what[SAMPLING_STR + 8];
            sampling_str(&LAWS[l], what, SAMPLING_STR);
            strcat(what, " row");
            cuk_rows_stats(0, dl, V, dr, n, &LAWS[l], temp ? du : NULL, dc, ds);
            CUDA_CHECK(cudaMemcpy(got, ds, sizeof(RowStats) * n, cudaMemcpyDeviceToHost));
            for (int i = 0; i < n; i++) {
                row_stats(h + (size_t)rows[i] * V, V, &LAWS[l], temp ? u[i] : -1, cs, &want);
                expect_stats(&got[i], &want, what, i);
            }
        }
        int ids[12];
        float gv[12];
        for (int i = 0; i < n; i++) ids[i] = (int)(rng_uniform(&r) * V);
        int *di = dcopy(ids, sizeof ids);
        float *dg = dcopy(NULL, sizeof gv);
        cuk_rows_gather(0, dl, V, dr, di, n, dg);
        CUDA_CHECK(cudaMemcpy(gv, dg, sizeof gv, cudaMemcpyDeviceToHost));
        for (int i = 0; i < n; i++) ck_assert(gv[i] == h[(size_t)rows[i] * V + ids[i]]);
        cudaFree(dl), cudaFree(dr), cudaFree(du), cudaFree(dc), cudaFree(ds), cudaFree(di),
            cudaFree(dg);
        free(cs), free(h);
    }
}
END_TEST

/* Rows with no law: a NaN anywhere (each thread of a block may meet it first), +inf, or
 * nothing but -inf give a non-finite maximum under every law, and a sampling law's
 * log-sum-exp is not finite either, so backend_rows_stats refuses the row. */
START_TEST(test_cuda_rows_nonfinite) {
    CU_REQUIRE_DEVICE();
    const int V = 1000, R = 5;
    float *h = malloc(sizeof(float) * V * R);
    for (int i = 0; i < V * R; i++) h[i] = (float)((i * 37) % 101) * 0.01f;
    h[0 * V + 0] = NAN;
    h[1 * V + 513] = NAN;
    h[2 * V + 999] = NAN;
    h[3 * V + 7] = INFINITY;
    for (int i = 0; i < V; i++) h[4 * V + i] = -INFINITY;
    int rows[5] = {0, 1, 2, 3, 4};
    double u[5] = {0.5, 0.5, 0.5, 0.5, 0.5};
    float *dl = dcopy(h, sizeof(float) * V * R);
    int *dr = dcopy(rows, sizeof rows);
    double *du = dcopy(u, sizeof u);
    void *dc = dcopy(NULL, cuk_rows_stats_scratch_bytes(R, V));
    CUDA_CHECK(cudaMemset(dc, 0, cuk_rows_stats_scratch_bytes(R, V)));
    RowStats *ds = dcopy(NULL, sizeof(RowStats) * R), got[5];
    for (int l = 0; l < N_LAWS; l++) {
        int temp = sampling_temp(&LAWS[l]);
        cuk_rows_stats(0, dl, V, dr, R, &LAWS[l], temp ? du : NULL, dc, ds);
        CUDA_CHECK(cudaMemcpy(got, ds, sizeof got, cudaMemcpyDeviceToHost));
        for (int i = 0; i < R; i++) {
            ck_assert_msg(!isfinite(got[i].max), "law %d row %d: max %g", l, i, got[i].max);
            if (temp)
                ck_assert_msg(!isfinite(got[i].lse), "law %d row %d: lse %g", l, i, got[i].lse);
        }
    }
    cudaFree(dl), cudaFree(dr), cudaFree(du), cudaFree(dc), cudaFree(ds);
    free(h);
}
END_TEST

/* Equal floats, NaN equal to NaN (a lawless row's maximum). */
static int same_f(double a, double b) { return a == b || (isnan(a) && isnan(b)); }

static void expect_stats_nf(const RowStats *got, const RowStats *want, const char *what, int i) {
    ck_assert_msg(got->argmax == want->argmax && got->draw == want->draw &&
                      same_f(got->max, want->max) && same_f(got->second, want->second) &&
                      same_f(got->cut, want->cut) && same_f(got->scale, want->scale),
                  "%s %d: argmax %d/%d draw %d/%d max %g/%g second %g/%g cut %g/%g", what, i,
                  got->argmax, want->argmax, got->draw, want->draw, got->max, want->max,
                  got->second, want->second, got->cut, want->cut);
    ck_assert_msg(isnan(got->lse) == isnan(want->lse), "%s %d: lse %g, want %g", what, i,
                  got->lse, want->lse);
    if (!isnan(want->lse))
        ck_assert_msg(fabs(got->lse - want->lse) <= LSE_RTOL * fabs(want->lse),
                      "%s %d: lse %.17g vs %.17g", what, i, got->lse, want->lse);
}

/* Rows of 70,000 columns: split over the most blocks a row gets, their parts merged by
 * the row's last block. The maximum in the last block, a tie across blocks and mass in
 * the last ones, NaNs in two blocks and two in one (the first wins, as on the CPU), +inf
 * in two blocks, all -inf: the whole RowStats as the CPU's, every law; twice, into
 * poisoned outputs each time, so each launch's counters were left at zero by the last. */
START_TEST(test_cuda_rows_split) {
    CU_REQUIRE_DEVICE();
    const int V = 70000, R = 6;
    Rng r;
    rng_seed(&r, 5);
    float *h = malloc(sizeof(float) * (size_t)V * R);
    for (size_t i = 0; i < (size_t)V * R; i++) h[i] = (float)(rng_uniform(&r) * 8 - 4);
    h[(size_t)0 * V + 69500] = 9.0f; /* the maximum in the last block */
    h[(size_t)1 * V + 65000] = h[(size_t)1 * V + 5000] = 30.0f;
    for (int i = 60000; i < V; i++) h[(size_t)1 * V + i] += 6.0f;
    h[(size_t)2 * V + 69999] = h[(size_t)2 * V + 40000] = NAN;
    h[(size_t)3 * V + 60000] = h[(size_t)3 * V + 10] = INFINITY;
    for (int i = 0; i < V; i++) h[(size_t)4 * V + i] = -INFINITY;
    h[(size_t)5 * V + 4100] = NAN;
    h[(size_t)5 * V + 300] = NAN; /* both in block 0; a lower thread meets the later */
    int rows[8] = {0, 1, 2, 3, 4, 5, 1, 0}, n = 8;
    double u[8];
    for (int i = 0; i < n; i++) u[i] = rng_uniform(&r);
    u[7] = 0.9999999999999999;
    float *dl = dcopy(h, sizeof(float) * (size_t)V * R);
    int *dr = dcopy(rows, sizeof rows);
    double *du = dcopy(u, sizeof u);
    size_t sb = cuk_rows_stats_scratch_bytes(n, V);
    void *dc = dcopy(NULL, sb);
    CUDA_CHECK(cudaMemset(dc, 0, sb));
    RowStats *ds = dcopy(NULL, sizeof(RowStats) * n), got[8], want;
    double *cs = malloc(sizeof(double) * row_chunks(V));
    for (int pass = 0; pass < 2; pass++)
        for (int l = 0; l < N_LAWS; l++) {
            int temp = sampling_temp(&LAWS[l]);
            char what[SAMPLING_STR + 16];
            sampling_str(&LAWS[l], what, SAMPLING_STR);
            strcat(what, pass ? " poisoned" : " split");
            CUDA_CHECK(cudaMemset(ds, 0xff, sizeof(RowStats) * n));
            cuk_rows_stats(0, dl, V, dr, n, &LAWS[l], temp ? du : NULL, dc, ds);
            CUDA_CHECK(cudaMemcpy(got, ds, sizeof got, cudaMemcpyDeviceToHost));
            for (int i = 0; i < n; i++) {
                row_stats(h + (size_t)rows[i] * V, V, &LAWS[l], temp ? u[i] : -1, cs, &want);
                expect_stats_nf(&got[i], &want, what, i);
            }
        }
    cudaFree(dl), cudaFree(dr), cudaFree(du), cudaFree(dc), cudaFree(ds);
    free(cs), free(h);
}
END_TEST

/* One call reduces all its rows in the same launches, however many: one when greedy, two
 * for plain sampling, and with a filter the cut's steps between them (four a select of
 * top-k or top-p, min-p riding on the first or alone in one). */
START_TEST(test_cuda_rows_launches) {
    CU_REQUIRE_DEVICE();
    const int V = 70000, R = 40;
    float *h = malloc(sizeof(float) * (size_t)V * R);
    for (size_t i = 0; i < (size_t)V * R; i++) h[i] = (float)((i * 7919) % 1000) * 0.001f;
    int rows[R];
    for (int i = 0; i < R; i++) rows[i] = i;
    float *dl = dcopy(h, sizeof(float) * (size_t)V * R);
    int *dr = dcopy(rows, sizeof rows);
    size_t sb = cuk_rows_stats_scratch_bytes(R, V);
    void *dc = dcopy(NULL, sb);
    CUDA_CHECK(cudaMemset(dc, 0, sb));
    RowStats *ds = dcopy(NULL, sizeof(RowStats) * R);
    const int want[N_LAWS] = {1, 2, 2 + 8, 2 + 4, 2 + 1};
    for (int l = 0; l < N_LAWS; l++)
        for (int n = 1; n <= R; n += R - 1) {
            uint64_t before = cuk_launch_count();
            cuk_rows_stats(0, dl, V, dr, n, &LAWS[l], NULL, dc, ds);
            int got = (int)(cuk_launch_count() - before);
            ck_assert_msg(got == want[l], "law %d, %d rows: %d launches, want %d", l, n, got,
                          want[l]);
        }
    CUDA_CHECK(cudaDeviceSynchronize());
    cudaFree(dl), cudaFree(dr), cudaFree(dc), cudaFree(ds);
    free(h);
}
END_TEST

/* Queries longer than the backend stages at once (cuda_backend.cu's RowQuery holds 128
 * stats and 1024 gathers): every batch's results land at their own entries. full: the
 * (n_kept, V) rows a copying forward returned. */
static void check_long_queries(Backend *gpu, const float *full, int n_kept, int V) {
    enum { NS = 300, NG = 2100 };
    static int rows[NG], ids[NG];
    static double u[NS];
    static RowStats got[NS];
    static float g[NG];
    double cs[8];
    Rng r;
    rng_seed(&r, 29);
    for (int i = 0; i < NG; i++) {
        rows[i] = (int)(rng_next(&r) % (uint64_t)n_kept);
        ids[i] = (int)(rng_next(&r) % (uint64_t)V);
    }
    for (int i = 0; i < NS; i++) u[i] = rng_uniform(&r);
    RsErr e = {0};
    ck_assert_msg(backend_rows_stats(gpu, rows, NS, &LAWS[3], u, got, &e) == 0, "%s", e.msg);
    for (int i = 0; i < NS; i++) {
        RowStats want;
        row_stats(full + (size_t)rows[i] * V, V, &LAWS[3], u[i], cs, &want);
        expect_stats(&got[i], &want, "long query", i);
    }
    ck_assert(backend_rows_gather(gpu, rows, ids, NG, g, &e) == 0);
    for (int i = 0; i < NG; i++)
        ck_assert_msg(g[i] == full[(size_t)rows[i] * V + ids[i]], "long gather %d", i);
}

/* Keeping forward + queries vs copying forward + reference, through the backend API. */
START_TEST(test_cuda_rows_backend) {
    CU_REQUIRE_DEVICE();
    const int V = 1000, n = 7;
    Model *m = tu_random_model(ARCH_LLAMA, 64, 128, 2, 4, 2, V, 17);
    Backend *gpu = cu_backend_make(cuda_backend_ops_get(), m, 64, 16, 16);
    RsErr e = {0};
    int tok[7] = {3, 1, 4, 1, 5, 9, 2}, pos[7] = {0, 1, 2, 3, 4, 5, 6};
    int out_rows[5] = {6, 0, 2, 5, 3};
    float *full = malloc(sizeof(float) * 5 * V);
    ck_assert(backend_forward(gpu, tok, pos, n, NULL, out_rows, 5, full, &e) == 0);
    ck_assert(backend_kv_commit(gpu, NULL, 0, &e) == 0);
    ck_assert(backend_forward(gpu, tok, pos, n, NULL, out_rows, 5, NULL, &e) == 0);
#ifdef ROOTSPEC_CUEMU
    /* the emulator runs a stream's work only at a synchronisation: a forward() that keeps
     * its rows on the device must have left its pass queued (no device sync), and the
     * queries below read them behind it */
    ck_assert_msg(cuda_backend_busy(gpu), "forward() without logits synchronised the device");
#endif
    int rows[6] = {4, 0, 2, 1, 3, 0};
    double u[6] = {0.25, 0.5, 0.0, 0.99, 0.125, 0.75};
    double cs[8];
    for (int l = 0; l < N_LAWS; l++) {
        RowStats got[6], want;
        ck_assert_msg(backend_rows_stats(gpu, rows, 6, &LAWS[l], u, got, &e) == 0, "%s", e.msg);
        for (int i = 0; i < 6; i++) {
            row_stats(full + (size_t)rows[i] * V, V, &LAWS[l], u[i], cs, &want);
            expect_stats(&got[i], &want, "backend query", i);
        }
    }
    int ids[6] = {0, 999, 5, 500, 17, 17};
    float g[6];
    ck_assert(backend_rows_gather(gpu, rows, ids, 6, g, &e) == 0);
    for (int i = 0; i < 6; i++) ck_assert(g[i] == full[(size_t)rows[i] * V + ids[i]]);
    check_long_queries(gpu, full, 5, V);
    free(full);
    backend_destroy(&gpu);
    model_destroy(&m);
}
END_TEST

/* A CUDA target decoding with every decoder at T=0 and T=1 (and --score-all-rules) copies
 * no whole logits row to the host (the backend's d2h_full_rows stays 0), and in
 * batch-invariant mode every decoder's T=0 ids equal AR's. */
START_TEST(test_cuda_rowstats_decode) {
    CU_REQUIRE_DEVICE();
    RsErr e = {0};
    Model *tm = tu_random_model(ARCH_LLAMA, 64, 128, 2, 4, 2, 300, 51);
    Model *dm = tu_random_model(ARCH_LLAMA, 64, 128, 1, 4, 2, 300, 52);
    Target *t;
    Drafter *d;
    int eog = -1;
    BackendParams bi = {.kv_capacity = 256, .threads = 1, .batch_invariant = 1};
    ck_assert_msg(target_create(tm, cuda_backend_ops_get(), &bi, &eog, 0, &t, &e) == 0, "%s",
                  e.msg);
    ck_assert_msg(drafter_model_create(dm, &cpu_backend_ops, TU_BP(256, 1),
                                       &d, &e) == 0, "%s", e.msg);
    const DecoderKind rules[] = {DECODER_AR, DECODER_DRAFT, DECODER_PEARL, DECODER_ROOTDRAW, DECODER_ROOT};
    int prompt[4] = {7, 70, 170, 270}, ar[16], buf[48];
    for (int k = 0; k < 5; k++)
        for (int l = 0; l < 3; l++)
            for (int sa = 0; sa <= (l > 0 && decoder_needs_root_pass(rules[k])); sa++) {
                int temp = sampling_temp(&LAWS[l]);
                DecodeOpts opts = {.decoder = rules[k], .budget = 8, .sampling = LAWS[l], .seed = 3,
                                   .max_new = 12, .score_all = sa};
                DecodeResult res = {.tokens = buf, .cap = 48};
                ck_assert_msg(decode_run(t, rules[k] == DECODER_AR ? NULL : d, prompt, 4, &opts, NULL,
                                         &res, &e) == 0, "%s", e.msg);
                ck_assert_int_ge(res.n_tokens, 12);
                if (temp == 0 && k == 0) memcpy(ar, buf, sizeof(int) * 12);
                if (temp == 0)
                    for (int i = 0; i < 12; i++)
                        ck_assert_msg(buf[i] == ar[i], "%s T=0: token %d is %d, AR %d",
                                      decoder_name(rules[k]), i, buf[i], ar[i]);
                ck_assert_msg(backend_stats(target_backend(t)).d2h_full_rows == 0,
                              "%s law %d%s: whole rows copied to the host", decoder_name(rules[k]),
                              l, sa ? " score-all" : "");
            }
    drafter_destroy(&d);
    target_destroy(&t);
    model_destroy(&dm);
    model_destroy(&tm);
}
END_TEST

/* The CUDA backend batches its row queries (backend_batch_queries): the walk down the tree
 * makes one backend_rows_stats call a round (RoundInfo.walk_queries; with the root pass's,
 * every call the decode makes: the measurements read the walk's), and its tokens equal
 * a CUDA target's that makes one call per draw (BackendParams.sw.rows_batched = -1), for
 * every decoder at T=0 and at T=1 with a seed: a row's draw does not depend on what else
 * the call reduces. The drafter is the target's model on the CPU, so walks descend. */
typedef struct {
    int walks, roots, bad;
} WalkSeen;

static void walk_round(void *user, const RoundInfo *ri) {
    WalkSeen *w = user;
    int walked = !ri->tree_pass_skipped && !ri->fallback_ar && ri->tree_size > 0;
    w->walks += walked;
    w->roots += ri->t_root_end > 0;
    w->bad += ri->walk_queries != walked;
}

START_TEST(test_cuda_walk_batched) {
    CU_REQUIRE_DEVICE();
    RsErr e = {0};
    Model *tm = tu_random_model(ARCH_LLAMA, 64, 128, 2, 4, 2, 300, 61);
    Target *t[2];
    Drafter *d;
    int eog = -1;
    for (int k = 0; k < 2; k++) {
        BackendParams bp = {.kv_capacity = 256, .threads = 1, .sw.rows_batched = k ? 0 : -1};
        ck_assert_msg(target_create(tm, cuda_backend_ops_get(), &bp, &eog, 0, &t[k], &e) == 0,
                      "%s", e.msg);
    }
    ck_assert_int_eq(backend_batch_queries(target_backend(t[0])), 0);
    ck_assert_int_eq(backend_batch_queries(target_backend(t[1])), 1); /* CUDA's own choice */
    ck_assert_msg(drafter_model_create(tm, &cpu_backend_ops, TU_BP(256, 1), &d, &e) == 0, "%s",
                  e.msg);
    const DecoderKind rules[] = {DECODER_DRAFT, DECODER_PEARL, DECODER_ROOTDRAW, DECODER_ROOT};
    int prompt[4] = {7, 70, 170, 270}, buf[2][48];
    WalkSeen seen = {0};
    uint64_t calls0 = backend_stats(target_backend(t[1])).rows_stats_calls;
    for (int k = 0; k < 4; k++)
        for (int l = 0; l < 2; l++) {
            DecodeOpts opts = {.decoder = rules[k], .budget = 8, .sampling = LAWS[l], .seed = 5,
                               .max_new = 16};
            DecodeResult res[2] = {{.tokens = buf[0], .cap = 48}, {.tokens = buf[1], .cap = 48}};
            DecodeHooks h = {.on_round = walk_round, .user = &seen};
            for (int b = 0; b < 2; b++)
                ck_assert_msg(decode_run(t[b], d, prompt, 4, &opts, b ? &h : NULL, &res[b], &e) == 0,
                              "%s", e.msg);
            ck_assert_int_eq(res[0].n_tokens, res[1].n_tokens);
            for (int i = 0; i < res[0].n_tokens; i++)
                ck_assert_msg(buf[0][i] == buf[1][i], "%s law %d: token %d is %d batched, %d per "
                              "draw", decoder_name(rules[k]), l, i, buf[1][i], buf[0][i]);
        }
    fprintf(stderr, "cuda walk: %d batched walks\n", seen.walks);
    ck_assert_int_gt(seen.walks, 8);
    ck_assert_msg(seen.bad == 0, "%d walks made other than one row query", seen.bad);
    int calls = (int)(backend_stats(target_backend(t[1])).rows_stats_calls - calls0);
    ck_assert_msg(calls == seen.roots + seen.walks, "%d row queries for %d root passes and %d "
                  "walks", calls, seen.roots, seen.walks);
    drafter_destroy(&d);
    for (int k = 0; k < 2; k++) target_destroy(&t[k]);
    model_destroy(&tm);
}
END_TEST

Suite *suite_cuda_rowstats(void) {
    Suite *s = suite_create("cuda_rowstats");
    TCase *tc = tcase_create("rows");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_cuda_rows_kernels);
    tcase_add_test(tc, test_cuda_rows_nonfinite);
    tcase_add_test(tc, test_cuda_rows_backend);
    suite_add_tcase(s, tc);
    TCase *sp = tcase_create("split");
    tcase_set_timeout(sp, 300);
    tcase_add_test(sp, test_cuda_rows_split);
    tcase_add_test(sp, test_cuda_rows_launches);
    suite_add_tcase(s, sp);
    /* Whole decodes: the emulator's main run, not its ASan and FMA reruns of the kernels
     * (tests/cuemu/cuemu.mk excludes the tag), where they would cost minutes and check the
     * same kernels again. */
    TCase *wk = tcase_create("walk");
    tcase_set_timeout(wk, 300);
    tcase_set_tags(wk, "decode");
    tcase_add_test(wk, test_cuda_rowstats_decode);
    tcase_add_test(wk, test_cuda_walk_batched);
    suite_add_tcase(s, wk);
    return s;
}
