/* Kept logits rows on the CPU backend (kernels/backend.h) and their top-k: a forward
 * without a logits pointer keeps its rows inside the backend; backend_rows_copy reads them
 * back whole and BackendStats.d2h_full_rows counts every whole row that reaches the host
 * (backend_kept_row reads one in place);
 * backend_rows_topk (kernels/cpu/cpu_topk.h) reduces them where they are, checked against
 * the full-row reference of common/logits.h. */
#include "testutil.h"
#include "common/logits.h"
#include "common/rng.h"
#include "draft_proc/model_drafter.h"
#include "kernels/backend.h"
#include "kernels/backend_impl.h"
#include "kernels/cpu/cpu_topk.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define VOCAB 96

static Backend *make_backend(const Model *m, int threads) {
    BackendParams bp = {.kv_capacity = 64, .max_batch = 16, .max_pending = 32,
                        .threads = threads};
    Backend *b = NULL;
    RsErr e = {0};
    ck_assert_msg(backend_create(&cpu_backend_ops, m, &bp, &b, &e) == RS_OK, "%s", e.msg);
    return b;
}

/* Kept rows equal the rows a logits pointer receives, bit for bit; copies count. */
START_TEST(test_kept_rows_copy) {
    Model *m = tu_random_model(ARCH_LLAMA, 32, 48, 2, 4, 2, VOCAB, 77);
    Backend *b = make_backend(m, 1);
    int tok[6] = {1, 5, 9, 2, 7, 3}, pos[6] = {0, 1, 2, 3, 4, 5}, rows[3] = {5, 0, 3};
    float ref[3 * VOCAB], got[3 * VOCAB];
    RsErr e = {0};
    ck_assert_msg(backend_forward(b, tok, pos, 6, NULL, rows, 3, ref, &e) == RS_OK, "%s", e.msg);
    ck_assert_int_eq(backend_stats(b).d2h_full_rows, 3);
    ck_assert_int_eq(backend_n_kept(b), 3);
    backend_kv_reset(b);
    ck_assert_int_eq(backend_n_kept(b), 0);
    ck_assert_msg(backend_forward(b, tok, pos, 6, NULL, rows, 3, NULL, &e) == RS_OK, "%s", e.msg);
    ck_assert_int_eq(backend_stats(b).d2h_full_rows, 3); /* kept, nothing copied */
    ck_assert_int_eq(backend_n_kept(b), 3);
    int want[3] = {2, 0, 1};
    ck_assert_msg(backend_rows_copy(b, want, 3, got, &e) == RS_OK, "%s", e.msg);
    for (int i = 0; i < 3; i++)
        ck_assert_msg(memcmp(got + i * VOCAB, ref + want[i] * VOCAB, sizeof(float) * VOCAB) == 0,
                      "kept row %d differs from the copied one", want[i]);
    ck_assert_int_eq(backend_stats(b).d2h_full_rows, 6);
    /* Read in place: the same bits, nothing counted; none outside the kept rows. */
    for (int i = 0; i < 3; i++) {
        const float *row = backend_kept_row(b, i);
        ck_assert_ptr_nonnull(row);
        ck_assert_msg(memcmp(row, ref + i * VOCAB, sizeof(float) * VOCAB) == 0,
                      "kept row %d read in place differs", i);
    }
    ck_assert_ptr_null(backend_kept_row(b, 3));
    ck_assert_ptr_null(backend_kept_row(b, -1));
    ck_assert_int_eq(backend_stats(b).d2h_full_rows, 6);
    int bad = 3;
    ck_assert_int_eq(backend_rows_copy(b, &bad, 1, got, &e), RS_EINVAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "rows[0] = 3 outside the 3 kept rows"));
    ck_assert_int_eq(backend_stats(b).d2h_full_rows, 6);
    /* A forward without output rows keeps none; a failed one changes nothing. */
    int p2[1] = {6}, big = VOCAB;
    ck_assert_int_eq(backend_forward(b, &big, p2, 1, NULL, NULL, 0, NULL, &e), RS_EINVAL);
    ck_assert_int_eq(backend_n_kept(b), 3);
    ck_assert_msg(backend_forward(b, tok, p2, 1, NULL, NULL, 0, NULL, &e) == RS_OK, "%s", e.msg);
    ck_assert_int_eq(backend_n_kept(b), 0);
    ck_assert_int_eq(backend_rows_copy(b, want + 1, 1, got, &e), RS_EINVAL);
    ck_assert_ptr_null(backend_kept_row(b, 0));
    backend_destroy(&b);
    model_destroy(&m);
}
END_TEST

/* Rows of every shape the fused pass must get right: plain noise, heavy ties (values on a
 * coarse grid, so top-k ties break by column), -inf columns, one dominant logit, widths
 * around the block and chunk sizes. */
static void fill_row(float *row, int V, int kind, Rng *r) {
    for (int i = 0; i < V; i++) {
        float u = (float)rng_uniform(r);
        switch (kind) {
        case 0: row[i] = 8.0f * u - 4.0f; break;
        case 1: row[i] = floorf(6.0f * u); break;          /* ties everywhere */
        case 2: row[i] = u < 0.3f ? -INFINITY : 20.0f * u; break;
        case 3: row[i] = i == V / 3 ? 60.0f : -30.0f * u; break;
        case 5: /* a trained model's row: a few likely tokens, a bulk 20-40 below */
            row[i] = i % 997 == 5 ? 25.0f * u : -10.0f * u - 5.0f * (float)rng_uniform(r);
            break;
        default: row[i] = 1.0f; break;                     /* all equal */
        }
    }
}

static const int widths[] = {10, 63, 96, 2047, 2049, 5000, 49152};
#define N_WIDTHS ((int)(sizeof widths / sizeof widths[0]))

/* cpu_topk.h's bound on lse: the skipped columns' 2^-20, the exp's 2.5e-7, the float
 * rounding of the result. */
static double lse_tol(double ref) { return 1.3e-6 + 0x1p-23 * fabs(ref); }

/* The fused pass against the straightforward full-row code (common/logits.c, the
 * drafter's reduction before it): ids exact, lse within lse_tol. */
START_TEST(test_topk_vs_full_row) {
    int V = widths[_i], n = 6, k = V < 10 ? V : 10;
    float *rows = malloc(sizeof(float) * (size_t)n * V);
    CpuTopkPart *parts = malloc(sizeof(CpuTopkPart) * (size_t)n);
    int ids[6 * 10], ref[10];
    float logq[6 * 10], lse[6];
    Rng r;
    rng_seed(&r, 1234 + V);
    for (int i = 0; i < n; i++) fill_row(rows + (size_t)i * V, V, i, &r);
    cpu_topk(NULL, rows, n, V, k, ids, logq, lse, parts);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        const float *row = rows + (size_t)i * V;
        row_topk(row, V, k, ref);
        for (int j = 0; j < k; j++)
            ck_assert_msg(ids[i * k + j] == ref[j], "V %d row %d: top-%d id %d, reference %d", V,
                          i, j, ids[i * k + j], ref[j]);
        double want = row_lse(row, V), d = fabs((double)lse[i] - want);
        ck_assert_msg(d <= lse_tol(want), "V %d row %d: lse %.9g, reference %.9g", V, i,
                      (double)lse[i], want);
        worst = fmax(worst, d / fmax(1.0, fabs(want)));
        for (int j = 0; j < k; j++)
            ck_assert(logq[i * k + j] == row[ids[i * k + j]] - lse[i]);
    }
    if (V == 49152) printf("topk: fused lse vs double row_lse, worst relative %.2g\n", worst);
    free(parts);
    free(rows);
}
END_TEST

/* The columns left out of the sum: a row whose max is 0 and whose other columns all sit
 * at -(cut + delta), cut = log V + 20 log 2. Just below the cut (delta > 0) they may go
 * (together 2^-20 at most); above it (delta < 0) they must count: leaving them out would
 * miss 2^-20 * e^-delta, past lse_tol. */
START_TEST(test_topk_skip_bound) {
    static const double deltas[] = {0.01, 3.0, -1.0, -4.0};
    int V = 49152, k = 10;
    double cut = log((double)V) + 20 * log(2.0);
    float *row = malloc(sizeof(float) * V);
    CpuTopkPart part;
    for (int t = 0; t < 4; t++) {
        for (int i = 0; i < V; i++) row[i] = (float)-(cut + deltas[t]);
        row[777] = 0.0f;
        int ids[10];
        float logq[10], lse;
        cpu_topk(NULL, row, 1, V, k, ids, logq, &lse, &part);
        double want = row_lse(row, V);
        ck_assert_msg(fabs(lse - want) <= lse_tol(want), "delta %g: lse %.9g, reference %.9g",
                      deltas[t], (double)lse, want);
        ck_assert_int_eq(ids[0], 777);
        ck_assert_int_eq(ids[1], 0);
    }
    free(row);
}
END_TEST

/* n rows (n, V) of fill_row's kinds in turn. */
static float *make_rows(int n, int V, uint64_t seed) {
    float *rows = malloc(sizeof(float) * (size_t)n * V);
    Rng r;
    rng_seed(&r, seed);
    for (int i = 0; i < n; i++) fill_row(rows + (size_t)i * V, V, i % 6, &r);
    return rows;
}

/* One reduction of 7 rows, as the variant asks: threads, and the portable build. */
typedef struct {
    int ids[7 * 10];
    float logq[7 * 10], lse[7];
    double sum[7][8]; /* the raw lane sums: any difference in an exp shows there */
} TopkOut;

static void topk_variant(const float *rows, int n, int V, int threads, int portable,
                         TopkOut *o) {
    ThreadPool *pool = NULL;
    RsErr e = {0};
    ck_assert(threadpool_create(threads, 1, &pool, &e) == RS_OK);
    CpuTopkPart *parts = malloc(sizeof(CpuTopkPart) * (size_t)n);
    CpuTopkRun run = cpu_topk_begin(parts, n, V, 10);
    if (portable) cpu_topk_portable(&run);
    cpu_topk_feed(pool, &run, rows, V, 0, V);
    cpu_topk_end(&run, o->ids, o->logq, o->lse);
    for (int i = 0; i < n; i++) memcpy(o->sum[i], parts[i].sd, sizeof o->sum[i]);
    free(parts);
    threadpool_destroy(&pool);
}

/* Same bits on 1, 2 and 3 threads (a row is one thread's, whichever), and in the portable
 * build (cpu_topk_portable) as in the AVX2 + FMA one. */
START_TEST(test_topk_same_bits) {
    int V = 49152, n = 7;
    float *rows = make_rows(n, V, 99);
    static const int threads[4] = {1, 2, 3, 1}, portable[4] = {0, 0, 0, 1};
    TopkOut o[4];
    for (int t = 0; t < 4; t++) topk_variant(rows, n, V, threads[t], portable[t], &o[t]);
    for (int t = 1; t < 4; t++) {
        for (int i = 0; i < n; i++)
            ck_assert_msg(memcmp(o[0].sum[i], o[t].sum[i], sizeof o[0].sum[i]) == 0 &&
                              memcmp(&o[0].lse[i], &o[t].lse[i], sizeof(float)) == 0,
                          "%d threads%s, row %d: lane-0 sum %.17g lse %.9g, vs %.17g %.9g",
                          threads[t], portable[t] ? " (portable)" : "", i, o[t].sum[i][0],
                          (double)o[t].lse[i], o[0].sum[i][0], (double)o[0].lse[i]);
        ck_assert(memcmp(o[0].ids, o[t].ids, sizeof o[0].ids) == 0);
        ck_assert(memcmp(o[0].logq, o[t].logq, sizeof o[0].logq) == 0);
    }
    free(rows);
}
END_TEST

/* Non-finite rows give NaN like row_lse (the drafter then rejects its pool). */
START_TEST(test_topk_nonfinite) {
    float row[3][300];
    for (int i = 0; i < 300; i++) row[0][i] = row[1][i] = (float)(i % 7), row[2][i] = -INFINITY;
    row[0][250] = NAN;
    row[1][3] = INFINITY;
    CpuTopkPart parts[3];
    int ids[3 * 4];
    float logq[3 * 4], lse[3];
    cpu_topk(NULL, &row[0][0], 3, 300, 4, ids, logq, lse, parts);
    for (int i = 0; i < 3; i++) {
        ck_assert_msg(isnan(lse[i]), "row %d: lse %g, want NaN", i, (double)lse[i]);
        ck_assert(isnan(row_lse(row[i], 300)));
    }
}
END_TEST

/* Fed in pieces (irregular, at block boundaries; the last ending mid-block), the
 * reduction gives the whole rows' bits. */
START_TEST(test_topk_pieces) {
    int V = 12000, n = 6, k = 10;
    float *rows = make_rows(n, V, 7);
    CpuTopkPart *parts = malloc(sizeof(CpuTopkPart) * (size_t)n);
    int ids[2][6 * 10];
    float logq[2][6 * 10], lse[2][6];
    cpu_topk(NULL, rows, n, V, k, ids[0], logq[0], lse[0], parts);
    static const int cuts[] = {0, 64, 640, 704, 4096, 11968, 12000};
    CpuTopkRun run = cpu_topk_begin(parts, n, V, k);
    for (int i = 0; i + 1 < (int)(sizeof cuts / sizeof cuts[0]); i++)
        cpu_topk_feed(NULL, &run, rows, V, cuts[i], cuts[i + 1]);
    cpu_topk_end(&run, ids[1], logq[1], lse[1]);
    ck_assert(memcmp(ids[0], ids[1], sizeof ids[0]) == 0);
    ck_assert(memcmp(lse[0], lse[1], sizeof lse[0]) == 0);
    ck_assert(memcmp(logq[0], logq[1], sizeof logq[0]) == 0);
    free(parts);
    free(rows);
}
END_TEST

/* BackendParams.topk_hint: the CPU head reduces its tiles as it goes; rows_topk then gives
 * the bits of the plain backend's, for 1 and 10 kept rows on 1 and 2 threads (the vocabulary
 * spans several tiles and ends mid-block), the logits are the same, another k still works,
 * and the fused time is reported. A hint outside [0, 32] is refused. */
START_TEST(test_topk_fused_head) {
    int V = 12000;
    Model *m = tu_random_model(ARCH_LLAMA, 32, 48, 2, 4, 2, V, 79);
    int tok[10] = {1, 5, 9, 2, 7, 3, 11, 4, 8, 6}, pos[10], rows[10], kept[10];
    for (int i = 0; i < 10; i++) pos[i] = i, rows[i] = 9 - i, kept[i] = i;
    float *full = malloc(sizeof(float) * 2 * 10 * V);
    for (int threads = 1; threads <= 2; threads++)
        for (int n_out = 1; n_out <= 10; n_out += 9) {
            Backend *b[2];
            int ids[2][100];
            float logq[2][100], lse[2][10];
            RsErr e = {0};
            for (int h = 0; h < 2; h++) {
                BackendParams bp = {.kv_capacity = 64, .max_batch = 16, .max_pending = 32,
                                    .threads = threads, .topk_hint = h ? 10 : 0};
                ck_assert_msg(backend_create(&cpu_backend_ops, m, &bp, &b[h], &e) == RS_OK, "%s",
                              e.msg);
                ck_assert(backend_forward(b[h], tok, pos, 10, NULL, rows, n_out, NULL, &e) == 0);
                ck_assert(backend_rows_topk(b[h], 10, ids[h], logq[h], lse[h], &e) == RS_OK);
                ck_assert(backend_rows_copy(b[h], kept, n_out, full + (size_t)h * 10 * V, &e) ==
                          RS_OK);
            }
            ck_assert(memcmp(ids[0], ids[1], sizeof(int) * 10 * n_out) == 0);
            ck_assert_msg(memcmp(lse[0], lse[1], sizeof(float) * n_out) == 0,
                          "%d threads, %d rows: fused lse %.9g, plain %.9g", threads, n_out,
                          (double)lse[1][0], (double)lse[0][0]);
            ck_assert(memcmp(logq[0], logq[1], sizeof(float) * 10 * n_out) == 0);
            ck_assert(memcmp(full, full + 10 * V, sizeof(float) * n_out * V) == 0);
            ck_assert(backend_stats(b[1]).fused_topk_ns > 0);
            ck_assert(backend_stats(b[0]).fused_topk_ns == 0);
            ck_assert(backend_rows_topk(b[0], 5, ids[0], logq[0], lse[0], &e) == RS_OK);
            ck_assert(backend_rows_topk(b[1], 5, ids[1], logq[1], lse[1], &e) == RS_OK);
            ck_assert(memcmp(ids[0], ids[1], sizeof(int) * 5 * n_out) == 0);
            backend_destroy(&b[0]);
            backend_destroy(&b[1]);
        }
    BackendParams bad = {.kv_capacity = 64, .max_batch = 16, .max_pending = 32, .threads = 1,
                         .topk_hint = 33};
    Backend *nb = NULL;
    RsErr e = {0};
    ck_assert_int_eq(backend_create(&cpu_backend_ops, m, &bad, &nb, &e), RS_EINVAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "topk_hint = 33 outside [0, 32]"));
    ck_assert_ptr_null(nb);
    free(full);
    model_destroy(&m);
}
END_TEST

/* Through the backend: the op and the host fallback (a table without rows_topk) agree
 * bitwise; only the fallback copies whole rows; bad k is refused. */
static BackendOps g_noop_topk;
START_TEST(test_topk_backend_and_fallback) {
    Model *m = tu_random_model(ARCH_LLAMA, 32, 48, 2, 4, 2, VOCAB, 78);
    g_noop_topk = cpu_backend_ops;
    g_noop_topk.rows_topk = NULL;
    Backend *b[2] = {make_backend(m, 2), NULL};
    BackendParams bp = backend_params(b[0]);
    RsErr e = {0};
    ck_assert(backend_create(&g_noop_topk, m, &bp, &b[1], &e) == RS_OK);
    b[1]->ops = &g_noop_topk; /* cpu create() set its own table */
    int tok[6] = {1, 5, 9, 2, 7, 3}, pos[6] = {0, 1, 2, 3, 4, 5}, rows[4] = {5, 0, 3, 1};
    int ids[2][4 * 10], ref[10];
    float logq[2][4 * 10], lse[2][4], full[4 * VOCAB];
    for (int i = 0; i < 2; i++) {
        ck_assert(backend_forward(b[i], tok, pos, 6, NULL, rows, 4, NULL, &e) == RS_OK);
        ck_assert_msg(backend_rows_topk(b[i], 10, ids[i], logq[i], lse[i], &e) == RS_OK, "%s",
                      e.msg);
    }
    ck_assert_int_eq(backend_stats(b[0]).d2h_full_rows, 0);
    ck_assert_int_eq(backend_stats(b[1]).d2h_full_rows, 4);
    ck_assert(memcmp(ids[0], ids[1], sizeof ids[0]) == 0);
    ck_assert(memcmp(lse[0], lse[1], sizeof lse[0]) == 0);
    int all[4] = {0, 1, 2, 3};
    ck_assert(backend_rows_copy(b[0], all, 4, full, &e) == RS_OK);
    for (int r = 0; r < 4; r++) {
        row_topk(full + r * VOCAB, VOCAB, 10, ref);
        ck_assert(memcmp(ref, ids[0] + r * 10, sizeof ref) == 0);
    }
    ck_assert_int_eq(backend_rows_topk(b[0], 0, ids[0], logq[0], lse[0], &e), RS_EINVAL);
    ck_assert_int_eq(backend_rows_topk(b[0], BACKEND_TOPK_MAX + 1, ids[0], logq[0], lse[0], &e),
                     RS_EINVAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "k = 33 outside [1, 32]"));
    backend_destroy(&b[0]);
    backend_destroy(&b[1]);
    model_destroy(&m);
}
END_TEST

/* A drafter round reduces its 71 rows (commit row + 70 expanded) in the backend: no whole
 * row reaches the host, and the pool says how many rows and how much host time it took. */
START_TEST(test_drafter_round_no_full_rows) {
    Model *dm = tu_random_model(ARCH_LLAMA, 32, 64, 1, 4, 2, 300, 31);
    Drafter *d = NULL;
    RsErr e = {0};
    ck_assert(drafter_model_create(dm, &cpu_backend_ops, TU_BP(512, 2), &d, &e) == RS_OK);
    Pool *p = malloc(sizeof(Pool));
    int toks[5] = {3, 4, 5, 6, 7};
    for (int round = 0; round < 3; round++) {
        ck_assert_msg(drafter_commit_grow(d, toks, round ? 2 : 5, p, &e) == RS_OK, "%s", e.msg);
        ck_assert_int_eq(p->n, POOL_MAX);
        ck_assert_int_eq(p->draft_rows, 1 + POOL_N_EXPANDED);
        ck_assert(p->draft_host_ns > 0 && p->draft_host_ns < p->draft_ns);
    }
    BackendStats st = model_drafter_backend_stats(d);
    ck_assert_int_eq(st.d2h_full_rows, 0);
    ck_assert_int_eq(st.forwards, 3 * 8);
    free(p);
    drafter_destroy(&d);
    model_destroy(&dm);
}
END_TEST

Suite *suite_topk(void) {
    Suite *s = suite_create("topk");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_kept_rows_copy);
    tcase_add_loop_test(tc, test_topk_vs_full_row, 0, N_WIDTHS);
    tcase_add_test(tc, test_topk_same_bits);
    tcase_add_test(tc, test_topk_skip_bound);
    tcase_add_test(tc, test_topk_pieces);
    tcase_add_test(tc, test_topk_fused_head);
    tcase_add_test(tc, test_topk_nonfinite);
    tcase_add_test(tc, test_topk_backend_and_fallback);
    tcase_add_test(tc, test_drafter_round_no_full_rows);
    suite_add_tcase(s, tc);
    return s;
}
