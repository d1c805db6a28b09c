/* The verifier's row reductions (common/logits.h, kernels/cpu/cpu_rowstats.h, backend_rows_stats
 * and backend_rows_gather) against the full-row computations of common/logits.c: argmax,
 * runner-up and draws exact (same index for the same uniform), log-sum-exp within 1e-12
 * relative of the sequential double sum; the threaded CPU pass bitwise equal to the
 * one-thread reference for any thread count; the backend's queries over the rows a
 * forward kept equal to the same reductions of the rows a copying forward returns; and a
 * decode, every decoder and offline scoring, copying no whole row to the host. */
#include "testutil.h"
#include "common/logits.h"
#include "common/rng.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_rowstats.h"
#include "kernels/cpu/threadpool.h"
/* The instrumented backend (full_rows_ops) fills an ops table, so it includes the
 * implementation header as any backend does. */
#include "kernels/backend_impl.h"
#include "draft_proc/model_drafter.h"
#include "target_proc/decode.h"
#include <math.h>
#include <string.h>

/* A row with the shapes that matter: planted ties at the top, a near point mass at the
 * end, or plain random values. */
static void fill_row(float *row, int n, int kind, Rng *r) {
    for (int i = 0; i < n; i++) row[i] = (float)(rng_uniform(r) * 6.0 - 3.0);
    if (kind == 1) {
        int a = (int)(rng_uniform(r) * n), b = (int)(rng_uniform(r) * n);
        row[a] = row[b] = 10.0f;
    }
    if (kind == 2) row[n - 1] = 60.0f;
}

static int stats_equal(const RowStats *a, const RowStats *b) {
    return a->argmax == b->argmax && a->draw == b->draw && a->max == b->max &&
           a->second == b->second &&
           (memcmp(&a->lse, &b->lse, sizeof a->lse) == 0 || (isnan(a->lse) && isnan(b->lse)));
}

START_TEST(test_rows_reference) {
    int sizes[] = {1, 7, 256, 257, 1000, 49152};
    Rng r;
    rng_seed(&r, 11);
    double *csum = malloc(sizeof(double) * row_chunks(49152));
    float *row = malloc(sizeof(float) * 49152);
    for (int si = 0; si < 6; si++) {
        int n = sizes[si];
        for (int rep = 0; rep < 30; rep++) {
            fill_row(row, n, rep % 3, &r);
            RowStats s0, s1;
            row_stats(row, n, 0, -1, csum, &s0);
            ck_assert_int_eq(s0.argmax, row_argmax(row, n));
            ck_assert_int_eq(s0.draw, s0.argmax);
            ck_assert(isnan(s0.lse));
            if (n >= 2)
                ck_assert_msg((double)s0.max - s0.second == row_top_margin(row, n),
                              "n %d: margin %g vs %g", n, (double)s0.max - s0.second,
                              row_top_margin(row, n));
            Rng a = r, b = r;
            double u = rng_uniform(&a);
            row_stats(row, n, 1, u, csum, &s1);
            int want = row_sample(row, n, &b);
            ck_assert_msg(s1.draw == want, "n %d rep %d u %.17g: draw %d, row_sample %d", n, rep,
                          u, s1.draw, want);
            double lse = row_lse(row, n);
            ck_assert_msg(fabs(s1.lse - lse) <= 1e-12 * fabs(lse) + 1e-12, "n %d: lse %.17g vs %.17g",
                          n, s1.lse, lse);
            ck_assert_int_eq(s1.argmax, s0.argmax);
            r = a;
        }
    }
    /* u at the very top of [0, 1): the last index with a positive weight. */
    for (int i = 0; i < 1000; i++) row[i] = i < 999 ? 0.0f : -INFINITY;
    RowStats s;
    row_stats(row, 1000, 1, 0.9999999999999999, csum, &s);
    ck_assert_int_eq(s.draw, 998);
    free(row);
    free(csum);
}
END_TEST

/* The threaded pass, split by rows or within a row, is bitwise the one-thread reference. */
START_TEST(test_rows_threaded) {
    const int n = 49152, R = 5;
    Rng r;
    rng_seed(&r, 5);
    float *buf = malloc(sizeof(float) * (size_t)n * R);
    const float *rows[R];
    double u[R];
    for (int i = 0; i < R; i++) {
        fill_row(buf + (size_t)i * n, n, i % 3, &r);
        rows[i] = buf + (size_t)i * n;
        u[i] = rng_uniform(&r);
    }
    double *ref_scratch = malloc(sizeof(double) * row_chunks(n));
    for (int temp = 0; temp < 2; temp++) {
        RowStats want[R];
        for (int i = 0; i < R; i++)
            row_stats(rows[i], n, temp, temp ? u[i] : -1, ref_scratch, &want[i]);
        for (int nth = 1; nth <= 3; nth++) {
            ThreadPool *tp;
            RsErr e = {0};
            ck_assert_int_eq(threadpool_create(nth, &tp, &e), 0);
            double *scratch = malloc(sizeof(double) * cpu_rows_scratch(n, nth));
            for (int k = 1; k <= R; k++) { /* 1 row (split) up to all of them */
                RowStats got[R];
                cpu_rows_stats(tp, rows, k, n, temp, temp ? u : NULL, scratch, got);
                for (int i = 0; i < k; i++)
                    ck_assert_msg(stats_equal(&got[i], &want[i]),
                                  "T=%d, %d threads, %d rows: row %d differs (draw %d vs %d, "
                                  "lse %.17g vs %.17g)", temp, nth, k, i, got[i].draw,
                                  want[i].draw, got[i].lse, want[i].lse);
            }
            for (int i = 0; i < R; i++) { /* each row alone: split across the threads */
                RowStats got;
                cpu_rows_stats(tp, rows + i, 1, n, temp, temp ? u + i : NULL, scratch, &got);
                ck_assert_msg(stats_equal(&got, &want[i]), "T=%d, %d threads, row %d alone "
                              "differs (argmax %d vs %d)", temp, nth, i, got.argmax,
                              want[i].argmax);
            }
            free(scratch);
            threadpool_destroy(&tp);
        }
    }
    free(ref_scratch);
    free(buf);
}
END_TEST

/* backend_rows_stats / backend_rows_gather over kept rows vs the reference reductions of
 * the rows a copying forward of the same batch returns; argument errors. */
START_TEST(test_rows_backend_queries) {
    const int V = 300, n = 6;
    Model *m = tu_random_model(ARCH_LLAMA, 32, 64, 2, 4, 2, V, 9);
    RsErr e = {0};
    Backend *b;
    BackendParams bp = {.kv_capacity = 64, .max_batch = 16, .max_pending = 16, .threads = 2};
    ck_assert(backend_create(&cpu_backend_ops, m, &bp, &b, &e) == 0);
    int tok[6] = {1, 5, 9, 2, 200, 7}, pos[6] = {0, 1, 2, 3, 4, 5}, out_rows[4] = {5, 0, 3, 2};
    float *full = malloc(sizeof(float) * 4 * V);
    ck_assert(backend_forward(b, tok, pos, n, NULL, out_rows, 4, full, &e) == 0);
    ck_assert(backend_kv_commit(b, NULL, 0, &e) == 0);
    ck_assert(backend_forward(b, tok, pos, n, NULL, out_rows, 4, NULL, &e) == 0);
    int rows[5] = {2, 0, 3, 1, 2};
    double u[5] = {0.1, 0.5, 0.999, 0.0, 0.73};
    double csum[8];
    for (int temp = 0; temp < 2; temp++) {
        RowStats got[5], want;
        ck_assert_msg(backend_rows_stats(b, rows, 5, temp, u, got, &e) == 0, "%s", e.msg);
        for (int i = 0; i < 5; i++) {
            row_stats(full + (size_t)rows[i] * V, V, temp, u[i], csum, &want);
            ck_assert_msg(stats_equal(&got[i], &want), "T=%d query %d", temp, i);
        }
    }
    int ids[5] = {0, 299, 17, 5, 17};
    float g[5];
    ck_assert(backend_rows_gather(b, rows, ids, 5, g, &e) == 0);
    for (int i = 0; i < 5; i++) ck_assert(g[i] == full[(size_t)rows[i] * V + ids[i]]);
    RowStats st;
    int bad_row = 4, bad_id = V;
    double bad_u = 1.0;
    ck_assert_int_eq(backend_rows_stats(b, &bad_row, 1, 0, NULL, &st, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "rows[0] = 4 outside the 4 rows the last forward kept"), "%s", e.msg);
    ck_assert_int_eq(backend_rows_stats(b, rows, 1, 2, NULL, &st, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "temperature 2"), "%s", e.msg);
    ck_assert_int_eq(backend_rows_stats(b, rows, 1, 1, &bad_u, &st, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "u[0] = 1 outside [0, 1)"), "%s", e.msg);
    ck_assert_int_eq(backend_rows_gather(b, rows, &bad_id, 1, g, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "ids[0] = 300 outside vocabulary"), "%s", e.msg);
    /* The queries copy no whole row: only the copying forward counted. */
    ck_assert_int_eq((int)backend_stats(b).d2h_full_rows, 4);
    free(full);
    backend_destroy(&b);
    model_destroy(&m);
}
END_TEST

/* The CPU backend with every whole row a forward() returns to the host counted. */
static long g_full_rows;
static BackendOps full_rows_ops;
static int full_rows_create(const Model *m, const BackendParams *bp, Backend **out, RsErr *e) {
    int rc = cpu_backend_ops.create(m, bp, out, e);
    if (!rc) (*out)->ops = &full_rows_ops;
    return rc;
}
static int full_rows_forward(Backend *b, const int *tokens, const int *pos, int n,
                             const uint8_t *mask, const int *out_rows, int n_out, float *logits,
                             RsErr *e) {
    if (logits) g_full_rows += n_out;
    return cpu_backend_ops.forward(b, tokens, pos, n, mask, out_rows, n_out, logits, e);
}

/* Every decoder at T=0 and T=1, and offline scoring (--score-all-rules), moves no whole
 * logits row to the host: the decode reads the target's rows only through the row
 * queries. */
START_TEST(test_rows_decode_no_full_rows) {
    full_rows_ops = cpu_backend_ops;
    full_rows_ops.create = full_rows_create;
    full_rows_ops.forward = full_rows_forward;
    RsErr e = {0};
    Model *tm = tu_random_model(ARCH_LLAMA, 32, 64, 2, 4, 2, 300, 41);
    Model *dm = tu_random_model(ARCH_LLAMA, 32, 64, 1, 4, 2, 300, 42);
    Target *t;
    Drafter *d;
    int eog = -1;
    ck_assert_msg(target_create(tm, &full_rows_ops, 512, 2, 0, &eog, 0, &t, &e) == 0, "%s", e.msg);
    ck_assert_msg(drafter_model_create(dm, &cpu_backend_ops, 512, 1, 0, &d, &e) == 0, "%s", e.msg);
    const Rule rules[] = {RULE_AR, RULE_DRAFT, RULE_PEARL, RULE_ROOTDRAW, RULE_ROOT};
    int prompt[5] = {3, 14, 15, 92, 65}, buf[64];
    for (int k = 0; k < 5; k++)
        for (int temp = 0; temp < 2; temp++)
            for (int sa = 0; sa <= rule_needs_root(rules[k]); sa++) {
                DecodeOpts o = {.rule = rules[k], .budget = 8, .temp = temp, .seed = 7,
                                .max_new = 24, .score_all = sa};
                DecodeResult r = {.tokens = buf, .cap = 64};
                g_full_rows = 0;
                uint64_t d0 = backend_stats(target_backend(t)).d2h_full_rows;
                ck_assert_msg(decode_run(t, rules[k] == RULE_AR ? NULL : d, prompt, 5, &o, NULL,
                                         &r, &e) == 0, "%s", e.msg);
                ck_assert_int_ge(r.n_tokens, 1);
                ck_assert_msg(g_full_rows == 0, "%s T=%d%s: %ld whole rows copied to the host",
                              rule_name(rules[k]), temp, sa ? " score-all" : "", g_full_rows);
                ck_assert_msg(backend_stats(target_backend(t)).d2h_full_rows == d0,
                              "%s T=%d: d2h_full_rows moved", rule_name(rules[k]), temp);
            }
    drafter_destroy(&d);
    target_destroy(&t);
    model_destroy(&dm);
    model_destroy(&tm);
}
END_TEST

Suite *suite_rowstats(void) {
    Suite *s = suite_create("rowstats");
    TCase *tc = tcase_create("rows");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_rows_reference);
    tcase_add_test(tc, test_rows_threaded);
    tcase_add_test(tc, test_rows_backend_queries);
    tcase_add_test(tc, test_rows_decode_no_full_rows);
    suite_add_tcase(s, tc);
    return s;
}
