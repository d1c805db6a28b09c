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
           a->second == b->second && a->cut == b->cut &&
           (memcmp(&a->lse, &b->lse, sizeof a->lse) == 0 || (isnan(a->lse) && isnan(b->lse)));
}

/* Laws the reductions must agree on: greedy, plain, and each filter (with a temperature). */
#define N_LAWS 5
static const Sampling LAWS[N_LAWS] = {
    {0.0, 0, 0, 0}, {1.0, 0, 0, 0}, {0.7, 40, 0.9, 0}, {1.3, 0, 0.5, 0.02}, {0.4, 0, 0, 0.1}};

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
            row_stats(row, n, &SAMPLING_GREEDY, -1, csum, &s0);
            ck_assert_int_eq(s0.argmax, row_argmax(row, n));
            ck_assert_int_eq(s0.draw, s0.argmax);
            ck_assert(isnan(s0.lse));
            if (n >= 2)
                ck_assert_msg((double)s0.max - s0.second == row_top_margin(row, n),
                              "n %d: margin %g vs %g", n, (double)s0.max - s0.second,
                              row_top_margin(row, n));
            Rng a = r, b = r;
            double u = rng_uniform(&a);
            row_stats(row, n, &SAMPLING_PLAIN, u, csum, &s1);
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
    row_stats(row, 1000, &SAMPLING_PLAIN, 0.9999999999999999, csum, &s);
    ck_assert_int_eq(s.draw, 998);
    free(row);
    free(csum);
}
END_TEST

/* The scan that defines RowMax: one pass, the first of equal entries kept, the first NaN
 * winning. */
static void max_scan(const float *row, int lo, int hi, RowMax *m) {
    float a = -INFINITY, b = -INFINITY;
    int ai = -1;
    for (int i = lo; i < hi; i++) {
        float v = row[i];
        if (isnan(v)) {
            m->max = m->second = v;
            m->argmax = i;
            return;
        }
        if (ai < 0 || v > a) b = a, a = v, ai = i;
        else if (v > b) b = v;
    }
    m->max = a, m->second = b, m->argmax = ai;
}

/* Values from a small set, so ties, zeros of both signs and infinities are common. */
static float tie_value(Rng *r, int nan_ok) {
    static const float vals[] = {1.5f, -2.0f, 0.0f, -0.0f, 3.25f, -INFINITY, INFINITY, 1.5f};
    double u = rng_uniform(r);
    if (nan_ok && u < 0.002) return NAN;
    if (u < 0.5) return vals[(int)(rng_uniform(r) * 8)];
    return (float)(rng_uniform(r) * 8.0 - 4.0);
}

START_TEST(test_row_max_part_scan) {
    Rng r;
    rng_seed(&r, 5);
    float *row = malloc(sizeof(float) * 49152);
    for (int rep = 0; rep < 3000; rep++) {
        int n = rep % 10 == 0 ? 49152 : 1 + (int)(rng_uniform(&r) * 90);
        int nan_ok = rep % 3 == 0;
        for (int i = 0; i < n; i++) row[i] = tie_value(&r, nan_ok);
        if (rep % 7 == 0) /* only zeros and smaller: the sign of a zero maximum matters */
            for (int i = 0; i < n; i++) row[i] = row[i] > 0 ? -row[i] : row[i];
        int lo = (int)(rng_uniform(&r) * n / 4), hi = n - (int)(rng_uniform(&r) * n / 4);
        if (hi <= lo) hi = lo + 1;
        RowMax want, got;
        max_scan(row, lo, hi, &want);
        row_max_part(row, lo, hi, &got);
        ck_assert_msg(got.argmax == want.argmax && memcmp(&got.max, &want.max, sizeof(float)) == 0 &&
                          memcmp(&got.second, &want.second, sizeof(float)) == 0,
                      "rep %d [%d, %d): argmax %d max %g second %g, the scan %d %g %g", rep, lo, hi,
                      got.argmax, got.max, got.second, want.argmax, want.max, want.second);
    }
    free(row);
}
END_TEST

/* The sampling law on a row small enough to check by hand: sorted, l = 3, 2, 2, 1, 0, -5,
 * so at T=1 the weights exp(l - 3) are 1, e^-1 (twice), e^-2, e^-3, e^-8 (total 1.9213). */
START_TEST(test_sampling_by_hand) {
    const float row[6] = {3, 1, 2, 2, 0, -5};
    double csum[1];
    struct {
        Sampling s;
        float cut;
    } cases[] = {
        {{1, 0, 0, 0}, -INFINITY}, /* plain */
        {{1, 2, 0, 0}, 2},         /* the 2nd largest is 2: both 2s kept */
        {{1, 4, 0, 0}, 1},
        {{1, 0, 0.5, 0}, 3},       /* 1 >= 0.5 * 1.9213 */
        {{1, 0, 0.6, 0}, 2},       /* 1 < 1.153: the 2s join, as a tie */
        {{1, 0, 0.9, 0}, 2},       /* 1 + 2e^-1 = 1.7358 >= 0.9 * 1.9212 */
        {{1, 0, 0.92, 0}, 1},      /* 1.7358 < 0.92 * 1.9212: the 1 joins */
        {{1, 0, 0, 0.3}, 2},       /* e^-1 = 0.368 >= 0.3 */
        {{1, 0, 0, 0.4}, 3},
        {{2, 0, 0, 0.4}, 2},       /* e^-0.5 = 0.607 >= 0.4 > e^-1 */
        {{0.5, 0, 0.9, 0}, 2},     /* weights 1, e^-2 (twice), e^-4: 1 < 0.9 * 1.289 */
        {{1, 4, 0.6, 0.4}, 3},     /* the strictest filter wins */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        RowStats st;
        row_stats(row, 6, &cases[c].s, 0.0, csum, &st);
        ck_assert_msg(st.cut == cases[c].cut, "case %zu: cut %g, want %g", c, st.cut, cases[c].cut);
        ck_assert_int_eq(st.draw, 0); /* u = 0: the first kept token (index order) */
        double T = cases[c].s.temperature, z = 0;
        for (int i = 0; i < 6; i++)
            if (row[i] >= cases[c].cut) z += exp(row[i] / T);
        for (int i = 0; i < 6; i++) {
            double want = row[i] >= cases[c].cut ? row[i] / T - log(z) : -INFINITY;
            double got = row_stats_logp(&st, row[i]);
            ck_assert_msg(got == want || fabs(got - want) < 1e-12, "case %zu token %d: log p %.17g, "
                          "want %.17g", c, i, got, want);
        }
    }
    /* top_k = 1 and T = 0 are the argmax path: no lse, the draw is the argmax */
    Sampling k1 = {0.8, 1, 0, 0};
    RowStats st;
    row_stats(row, 6, &k1, 0.7, csum, &st);
    ck_assert(isnan(st.lse) && st.draw == 0);
    char buf[SAMPLING_STR];
    Sampling all = {0.7, 40, 0.9, 0.05};
    ck_assert_str_eq(sampling_str(&all, buf, sizeof buf), "T=0.7 top_k=40 top_p=0.9 min_p=0.05");
    ck_assert_str_eq(sampling_str(&SAMPLING_PLAIN, buf, sizeof buf), "T=1");
    ck_assert_str_eq(sampling_str(&k1, buf, sizeof buf), "greedy");
}
END_TEST

/* Random rows (ties, near point masses) under many laws: the fused reduction keeps exactly
 * the reference's tokens, its log p match, and its draws over a fine grid of uniforms land
 * on each token as often as the reference probability says (inverse CDF). */
START_TEST(test_sampling_vs_reference) {
    const int n = 700, grid = 2000;
    const Sampling laws[] = {{0.7, 40, 0.9, 0}, {1.0, 0, 0.95, 0}, {1.5, 300, 0, 0},
                             {0.3, 0, 0, 0.05}, {2.0, 25, 0.5, 0.2}, {1.0, 699, 0.999, 0}};
    Rng r;
    rng_seed(&r, 91);
    float *row = malloc(sizeof(float) * n);
    double *ref = malloc(sizeof(double) * n), *freq = malloc(sizeof(double) * n);
    double csum[4];
    for (int rep = 0; rep < 8; rep++) {
        fill_row(row, n, rep % 3, &r);
        if (rep % 4 == 3) /* coarse values: many ties at every cut */
            for (int i = 0; i < n; i++) row[i] = floorf(row[i] * 2) / 2;
        for (size_t l = 0; l < sizeof laws / sizeof laws[0]; l++) {
            tu_sampling_probs(row, n, &laws[l], ref);
            RowStats st;
            row_stats(row, n, &laws[l], -1, csum, &st);
            for (int i = 0; i < n; i++) {
                double lp = row_stats_logp(&st, row[i]);
                ck_assert_msg((ref[i] > 0) == (row[i] >= st.cut), "rep %d law %zu token %d: "
                              "kept %d, reference p %g", rep, l, i, row[i] >= st.cut, ref[i]);
                ck_assert_msg(ref[i] == 0 ? lp == -INFINITY : fabs(lp - log(ref[i])) < 1e-9,
                              "rep %d law %zu token %d: log p %.12g vs %.12g", rep, l, i, lp,
                              log(ref[i]));
                freq[i] = 0;
            }
            for (int g = 0; g < grid; g++) {
                row_stats(row, n, &laws[l], (g + 0.5) / grid, csum, &st);
                freq[st.draw] += 1.0 / grid;
            }
            for (int i = 0; i < n; i++)
                ck_assert_msg(fabs(freq[i] - ref[i]) <= 1.0 / grid + 1e-9, "rep %d law %zu token "
                              "%d: drawn %g of the grid, p %g", rep, l, i, freq[i], ref[i]);
        }
    }
    free(freq);
    free(ref);
    free(row);
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
    for (int l = 0; l < N_LAWS; l++) {
        const Sampling *smp = &LAWS[l];
        int temp = sampling_temp(smp);
        RowStats want[R];
        for (int i = 0; i < R; i++)
            row_stats(rows[i], n, smp, temp ? u[i] : -1, ref_scratch, &want[i]);
        for (int nth = 1; nth <= 3; nth++) {
            ThreadPool *tp;
            RsErr e = {0};
            ck_assert_int_eq(threadpool_create(nth, 1, &tp, &e), 0);
            double *scratch = malloc(sizeof(double) * cpu_rows_scratch(n, nth));
            for (int k = 1; k <= R; k++) { /* 1 row (split) up to all of them */
                RowStats got[R];
                cpu_rows_stats(tp, rows, k, n, smp, temp ? u : NULL, scratch, got);
                for (int i = 0; i < k; i++)
                    ck_assert_msg(stats_equal(&got[i], &want[i]),
                                  "law %d, %d threads, %d rows: row %d differs (draw %d vs %d, "
                                  "lse %.17g vs %.17g)", l, nth, k, i, got[i].draw,
                                  want[i].draw, got[i].lse, want[i].lse);
            }
            for (int i = 0; i < R; i++) { /* each row alone: split across the threads */
                RowStats got;
                cpu_rows_stats(tp, rows + i, 1, n, smp, temp ? u + i : NULL, scratch, &got);
                ck_assert_msg(stats_equal(&got, &want[i]), "law %d, %d threads, row %d alone "
                              "differs (argmax %d vs %d)", l, nth, i, got.argmax,
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
    for (int l = 0; l < N_LAWS; l++) {
        RowStats got[5], want;
        ck_assert_msg(backend_rows_stats(b, rows, 5, &LAWS[l], u, got, &e) == 0, "%s", e.msg);
        for (int i = 0; i < 5; i++) {
            row_stats(full + (size_t)rows[i] * V, V, &LAWS[l], u[i], csum, &want);
            ck_assert_msg(stats_equal(&got[i], &want), "law %d query %d", l, i);
        }
    }
    int ids[5] = {0, 299, 17, 5, 17};
    float g[5];
    ck_assert(backend_rows_gather(b, rows, ids, 5, g, &e) == 0);
    for (int i = 0; i < 5; i++) ck_assert(g[i] == full[(size_t)rows[i] * V + ids[i]]);
    RowStats st;
    int bad_row = 4, bad_id = V;
    double bad_u = 1.0;
    ck_assert_int_eq(backend_rows_stats(b, &bad_row, 1, &SAMPLING_GREEDY, NULL, &st, &e),
                     RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "rows[0] = 4 outside the 4 rows the last forward kept"), "%s", e.msg);
    Sampling bad = {-0.5, 0, 0, 0};
    ck_assert_int_eq(backend_rows_stats(b, rows, 1, &bad, NULL, &st, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "temperature -0.5"), "%s", e.msg);
    bad = (Sampling){1, 0, 1.5, 0};
    ck_assert_int_eq(backend_rows_stats(b, rows, 1, &bad, NULL, &st, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "top_p 1.5"), "%s", e.msg);
    ck_assert_int_eq(backend_rows_stats(b, rows, 1, &SAMPLING_PLAIN, &bad_u, &st, &e), RS_EINVAL);
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
    ck_assert_msg(target_create(tm, &full_rows_ops, TU_BP(512, 2), &eog, 0, &t, &e) == 0, "%s", e.msg);
    ck_assert_msg(drafter_model_create(dm, &cpu_backend_ops, TU_BP(512, 1), &d, &e) == 0, "%s", e.msg);
    const DecoderKind rules[] = {DECODER_AR, DECODER_DRAFT, DECODER_PEARL, DECODER_ROOTDRAW, DECODER_ROOT};
    int prompt[5] = {3, 14, 15, 92, 65}, buf[64];
    for (int k = 0; k < 5; k++)
        for (int l = 0; l < 3; l++)
            for (int sa = 0; sa <= decoder_needs_root_pass(rules[k]); sa++) {
                DecodeOpts opts = {.decoder = rules[k], .budget = 8, .sampling = LAWS[l], .seed = 7,
                                   .max_new = 24, .score_all = sa};
                DecodeResult res = {.tokens = buf, .cap = 64};
                g_full_rows = 0;
                uint64_t d0 = backend_stats(target_backend(t)).d2h_full_rows;
                ck_assert_msg(decode_run(t, rules[k] == DECODER_AR ? NULL : d, prompt, 5, &opts, NULL,
                                         &res, &e) == 0, "%s", e.msg);
                ck_assert_int_ge(res.n_tokens, 1);
                ck_assert_msg(g_full_rows == 0, "%s law %d%s: %ld whole rows copied to the host",
                              decoder_name(rules[k]), l, sa ? " score-all" : "", g_full_rows);
                ck_assert_msg(backend_stats(target_backend(t)).d2h_full_rows == d0,
                              "%s law %d: d2h_full_rows moved", decoder_name(rules[k]), l);
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
    tcase_add_test(tc, test_row_max_part_scan);
    tcase_add_test(tc, test_sampling_by_hand);
    tcase_add_test(tc, test_sampling_vs_reference);
    tcase_add_test(tc, test_rows_threaded);
    tcase_add_test(tc, test_rows_backend_queries);
    tcase_add_test(tc, test_rows_decode_no_full_rows);
    suite_add_tcase(s, tc);
    return s;
}
