/* bench_stats suite: benchmark statistics, run plan, log formats, summary and prompt files.
 * Known answers come from hand computation (two-point and constant-ratio bootstraps,
 * percentiles), from an independent numpy computation committed as a fixture
 * (tools/gen_bench_fixture.py), and from round trips through the files. */
#include "bench/analyze.h"
#include "bench/benchlog.h"
#include "common/prompts.h"
#include "bench/stats.h"
#include "bench/summary.h"
#include "target_proc/timing.h"
#include "testutil.h"
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers ---- */

static char *tmp_dir(void) {
    static char buf[8][64];
    static int k = 0;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "/tmp/rs_bench_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(buf[k]));
    return buf[k];
}

static void rm_dir(const char *dir) {
    if (getenv("ROOTSPEC_KEEP_TMP")) {
        fprintf(stderr, "kept %s\n", dir);
        return;
    }
    static const char *names[] = {"rounds.jsonl", "decodes.csv", "summary.md", "summary.ref",
                                  "speeds.png", "round_breakdown.png", "p.jsonl",
                                  "rounds.jsonl.tmp"};
    char p[512];
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        remove(p);
    }
    rmdir(dir);
}

static void write_text(const char *path, const char *text, size_t n) {
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(text, 1, n, f), n);
    fclose(f);
}

static char *slurp(const char *path, size_t *n) {
    char *buf;
    RsErr e = {0};
    ck_assert_msg(rs_read_file(path, &buf, n, &e) == RS_OK, "%s", e.msg);
    return buf;
}

/* ---- bootstrap ---- */

START_TEST(test_percentile_by_hand) {
    double v[4] = {1, 2, 3, 4};
    ck_assert_double_eq_tol(bench_percentile(v, 4, 0.025), 1.075, 1e-12);
    ck_assert_double_eq_tol(bench_percentile(v, 4, 0.975), 3.925, 1e-12);
    ck_assert_double_eq_tol(bench_percentile(v, 4, 0.5), 2.5, 1e-12);
    ck_assert_double_eq(bench_percentile(v, 4, 0.0), 1.0);
    ck_assert_double_eq(bench_percentile(v, 4, 1.0), 4.0);
    ck_assert_double_eq(bench_percentile(v, 1, 0.3), 1.0);
}
END_TEST

START_TEST(test_boot_constant_ratio) {
    /* A is exactly 1.25x faster than B on every prompt: every resample has gain 0.25. */
    enum { N = 9 };
    double ta[N], na[N], tb[N], nb[N];
    for (int i = 0; i < N; i++) {
        ta[i] = tb[i] = 50 + 17 * i;
        nb[i] = 5e8 * (i + 3);
        na[i] = nb[i] * 4 / 5;
    }
    BenchInterval iv;
    RsErr e = {0};
    ck_assert_int_eq(bench_gain_bootstrap(ta, na, tb, nb, N, 2000, 42, &iv, &e), RS_OK);
    ck_assert_double_eq_tol(iv.est, 0.25, 1e-12);
    ck_assert_double_eq_tol(iv.lo, 0.25, 1e-12);
    ck_assert_double_eq_tol(iv.hi, 0.25, 1e-12);
    ck_assert_int_eq(iv.n, N);
}
END_TEST

START_TEST(test_boot_two_point) {
    /* Prompt 0: A twice as fast (gain 1); prompt 1: equal (gain 0); mixed resample: A 20 tok in
     * 2 s, B 20 tok in 3 s, gain 0.5. Resample gains are 0 (p=1/4), 0.5 (1/2), 1 (1/4), so with
     * 2000 resamples each extreme has ~500 >> 51 copies and the 2.5th / 97.5th percentiles
     * (ranks 49.975 and 1949.025) are exactly 0 and 1. */
    double ta[2] = {10, 10}, na[2] = {1e9, 1e9}, tb[2] = {10, 10}, nb[2] = {2e9, 1e9};
    BenchInterval iv;
    RsErr e = {0};
    ck_assert_int_eq(bench_gain_bootstrap(ta, na, tb, nb, 2, 2000, 7, &iv, &e), RS_OK);
    ck_assert_double_eq_tol(iv.est, (20.0 / 2) / (20.0 / 3) - 1, 1e-12);
    ck_assert_double_eq(iv.lo, 0.0);
    ck_assert_double_eq(iv.hi, 1.0);
    /* deterministic per seed */
    BenchInterval iv2;
    double tc[3] = {10, 20, 30}, nc[3] = {1e9, 3e9, 2e9};
    ck_assert_int_eq(bench_speed_bootstrap(tc, nc, 3, 500, 11, &iv, &e), RS_OK);
    ck_assert_int_eq(bench_speed_bootstrap(tc, nc, 3, 500, 11, &iv2, &e), RS_OK);
    ck_assert(iv.lo == iv2.lo && iv.hi == iv2.hi);
    ck_assert_double_eq_tol(iv.est, 60.0 / 6.0, 1e-12);
    /* errors name the value */
    nc[1] = 0;
    ck_assert_int_eq(bench_speed_bootstrap(tc, nc, 3, 500, 11, &iv, &e), RS_EINVAL);
    ck_assert_str_eq(e.msg, "prompt 1 has a non-positive decode time");
    ck_assert_int_eq(bench_speed_bootstrap(tc, nc, 0, 500, 11, &iv, &e), RS_EINVAL);
    ck_assert_str_eq(e.msg, "bootstrap needs at least one prompt (got 0)");
}
END_TEST

START_TEST(test_boot_vs_numpy) {
    size_t len;
    char *buf = slurp(tu_fixture("bench_bootstrap.txt"), &len);
    char *p = buf;
    char magic[32];
    int ver, n, nres, off;
    unsigned long long seed;
    ck_assert_int_eq(sscanf(p, "%31s %d%n", magic, &ver, &off), 2);
    ck_assert_str_eq(magic, "ROOTSPEC-BENCH-BOOT");
    ck_assert_int_eq(ver, 1);
    p += off;
    ck_assert_int_eq(sscanf(p, "%d %d %llu%n", &n, &nres, &seed, &off), 3);
    p += off;
    ck_assert(n > 0 && n <= 64);
    double ta[64], na[64], tb[64], nb[64];
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(sscanf(p, "%lf %lf %lf %lf%n", &ta[i], &na[i], &tb[i], &nb[i], &off), 4);
        p += off;
    }
    double g[3], s[3];
    ck_assert_int_eq(sscanf(p, " gain %lf %lf %lf%n", &g[0], &g[1], &g[2], &off), 3);
    p += off;
    ck_assert_int_eq(sscanf(p, " speed %lf %lf %lf%n", &s[0], &s[1], &s[2], &off), 3);
    BenchInterval iv;
    RsErr e = {0};
    ck_assert_int_eq(bench_gain_bootstrap(ta, na, tb, nb, n, nres, seed, &iv, &e), RS_OK);
    ck_assert_msg(fabs(iv.est - g[0]) < 1e-12 && fabs(iv.lo - g[1]) < 1e-12 &&
                      fabs(iv.hi - g[2]) < 1e-12,
                  "gain %.17g [%.17g, %.17g] vs numpy %.17g [%.17g, %.17g]", iv.est, iv.lo, iv.hi,
                  g[0], g[1], g[2]);
    ck_assert_int_eq(bench_speed_bootstrap(ta, na, n, nres, seed, &iv, &e), RS_OK);
    ck_assert_msg(fabs(iv.est - s[0]) < 1e-9 && fabs(iv.lo - s[1]) < 1e-9 &&
                      fabs(iv.hi - s[2]) < 1e-9,
                  "speed %.17g [%.17g, %.17g] vs numpy %.17g [%.17g, %.17g]", iv.est, iv.lo,
                  iv.hi, s[0], s[1], s[2]);
    free(buf);
}
END_TEST

START_TEST(test_speed_and_tokens) {
    int out[6] = {5, 9, 2, 7, 2, 3};
    int eos[2] = {2, 99}, hit;
    ck_assert_int_eq(bench_count_tokens(out, 6, eos, 2, &hit), 3);
    ck_assert_int_eq(hit, 1);
    ck_assert_int_eq(bench_count_tokens(out, 2, eos, 2, &hit), 2);
    ck_assert_int_eq(hit, 0);
    ck_assert_double_eq_tol(bench_speed(264, 2000000000), 132.0, 1e-12);
    ck_assert_double_eq(bench_speed(5, 0), 0.0);
    double ta[2] = {10, 30}, na[2] = {1e9, 1e9}, tr[2] = {10, 10}, nr[2] = {2e9, 1e9}, r[2];
    bench_speedup_per_prompt(ta, na, tr, nr, 2, r);
    ck_assert_double_eq_tol(r[0], 2.0, 1e-12);
    ck_assert_double_eq_tol(r[1], 3.0, 1e-12);
}
END_TEST

/* ---- plan ---- */

START_TEST(test_plan_rotation) {
    enum { P = 7, C = 16, W = 2 };
    BenchPlan *pl = bench_plan_create(P, C, W, 1, 1234);
    ck_assert_int_eq(pl->n_runs, (P + W) * C);
    int seen[P] = {0}, grid[P][C];
    memset(grid, 0, sizeof grid);
    for (int i = 0; i < P; i++) seen[pl->order[i]]++;
    for (int i = 0; i < P; i++) ck_assert_int_eq(seen[i], 1); /* a permutation */
    for (int k = 0; k < pl->n_runs; k++) {
        const BenchRun *r = &pl->runs[k];
        if (k < W * C) { /* warm-up first, on the first W shuffled prompts */
            ck_assert_int_eq(r->warmup, 1);
            ck_assert_int_eq(r->run_index, -1);
            ck_assert_int_lt(r->prompt_pos, W);
        } else {
            ck_assert_int_eq(r->warmup, 0);
            ck_assert_int_eq(r->run_index, k - W * C);
            grid[r->prompt][r->combo]++;
            int j = (k - W * C) % C;
            ck_assert_int_eq(r->prompt_pos, (k - W * C) / C);
            ck_assert_int_eq(r->combo, (r->prompt_pos + j) % C); /* rotated by position */
        }
        ck_assert_int_eq(r->prompt, pl->order[r->prompt_pos]);
    }
    for (int i = 0; i < P; i++)
        for (int c = 0; c < C; c++) ck_assert_int_eq(grid[i][c], 1);
    /* deterministic per seed; another seed gives another order (checked for these seeds) */
    BenchPlan *same = bench_plan_create(P, C, W, 1, 1234), *other = bench_plan_create(P, C, W, 1, 99);
    ck_assert_mem_eq(same->order, pl->order, P * sizeof(int));
    ck_assert(memcmp(other->order, pl->order, P * sizeof(int)) != 0);
    bench_plan_destroy(&pl);
    bench_plan_destroy(&same);
    bench_plan_destroy(&other);
    ck_assert_ptr_null(pl);
    /* warm-up is capped at the number of prompts */
    pl = bench_plan_create(1, 3, 2, 1, 5);
    ck_assert_int_eq(pl->n_warmup, 1);
    ck_assert_int_eq(pl->n_runs, 6);
    bench_plan_destroy(&pl);
}
END_TEST

/* Repetitions: a prompt's R rotations follow one another, each shifted by one more, and
 * every (prompt, combination, rep) runs once; the shuffle is the one of R = 1. */
START_TEST(test_plan_repeats) {
    enum { P = 5, C = 4, W = 1, R = 3 };
    BenchPlan *pl = bench_plan_create(P, C, W, R, 77), *one = bench_plan_create(P, C, W, 1, 77);
    ck_assert_int_eq(pl->n_runs, (W + P * R) * C);
    ck_assert_mem_eq(pl->order, one->order, P * sizeof(int));
    int grid[P][C][R];
    memset(grid, 0, sizeof grid);
    for (int k = W * C; k < pl->n_runs; k++) {
        const BenchRun *r = &pl->runs[k];
        int m = k - W * C, j = m % C;
        ck_assert_int_eq(r->warmup, 0);
        ck_assert_int_eq(r->run_index, m);
        ck_assert_int_eq(r->prompt_pos, m / (R * C));
        ck_assert_int_eq(r->rep, (m / C) % R);
        ck_assert_int_eq(r->combo, (r->prompt_pos + r->rep + j) % C);
        grid[r->prompt][r->combo][r->rep]++;
    }
    for (int i = 0; i < P; i++)
        for (int c = 0; c < C; c++)
            for (int q = 0; q < R; q++) ck_assert_int_eq(grid[i][c][q], 1);
    for (int k = 0; k < W * C; k++) ck_assert_int_eq(pl->runs[k].rep, 0);
    bench_plan_destroy(&pl);
    bench_plan_destroy(&one);
}
END_TEST

START_TEST(test_combos) {
    BenchCombo c[18];
    ck_assert_int_eq(bench_combos_default(c, 18, 0), 16);
    ck_assert_str_eq(c[0].decoder, "draft");
    ck_assert_int_eq(c[1].budget, 59);
    ck_assert_int_eq(c[2].temp, 1);
    ck_assert_str_eq(c[15].decoder, "root");
    ck_assert_int_eq(bench_combos_default(c, 18, 1), 18);
    ck_assert_str_eq(c[17].decoder, "ar");
    ck_assert_int_eq(c[17].budget, 0);
    BenchCombo *p;
    int n;
    RsErr e = {0};
    ck_assert_int_eq(bench_combos_parse("ar,draft,root", "0,1", "8,59", &p, &n, &e), RS_OK);
    ck_assert_int_eq(n, 10);
    ck_assert_str_eq(p[0].decoder, "ar");
    ck_assert_int_eq(p[1].temp, 1);
    ck_assert_str_eq(p[2].decoder, "draft");
    ck_assert_int_eq(p[3].budget, 59);
    ck_assert_int_lt(bench_combo_cmp(&p[0], &p[2]), 0);
    ck_assert_int_lt(bench_combo_cmp(&p[2], &p[9]), 0);
    free(p);
    ck_assert_int_eq(bench_combos_parse("draft", "0,2", "8", &p, &n, &e), RS_EINVAL);
    ck_assert_str_eq(e.msg, "temperature \"2\" must be 0 or 1");
    ck_assert_int_eq(bench_combos_parse("draft", "0", "8,65", &p, &n, &e), RS_EINVAL);
    ck_assert_str_eq(e.msg, "budget \"65\" must be auto or an integer in 1..64");
    /* auto: the cost-aware budget, after every number, shown as "auto" */
    ck_assert_int_eq(bench_combos_parse("draft", "0", "auto,8", &p, &n, &e), RS_OK);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(p[0].budget, BENCH_BUDGET_AUTO);
    ck_assert_int_lt(bench_combo_cmp(&p[1], &p[0]), 0);
    char bb[16];
    ck_assert_str_eq(bench_budget_str(p[0].budget, bb), "auto");
    ck_assert_str_eq(bench_budget_str(p[1].budget, bb), "8");
    free(p);
    ck_assert_int_eq(bench_combos_parse("Draft", "0", "8", &p, &n, &e), RS_EINVAL);
    ck_assert_str_eq(e.msg, "decoder name \"Draft\" must be [a-z0-9_]");
    ck_assert_int_eq(bench_combos_parse("draft,draft", "0", "8", &p, &n, &e), RS_EINVAL);
    ck_assert_str_eq(e.msg, "combination draft T=0 B=8 listed twice");
}
END_TEST

/* ---- logs ---- */

/* A record with every field null (timestamps, draft times, x1_in_pool, tau) or zero, as the
 * bench's older logs read back. */
static void record_init(RoundRecord *r) {
    memset(r, 0, sizeof *r);
    r->x1_in_pool = r->budget_chosen = r->depth_asked = ROUNDLOG_NULL;
    r->tau = r->root_margin = r->pred_tok_s = r->real_tok_s = NAN;
    int64_t *t = &r->t_round_start;
    for (int i = 0; i < 9; i++) t[i] = ROUNDLOG_NULL;
    r->draft_ns = r->draft_commit_ns = r->draft_host_ns = ROUNDLOG_NULL;
    r->n_tokens = ROUNDLOG_NULL;
}

/* Writes r through the one round-log writer: the RoundInfo a decode would have reported
 * (0 for a null time, cumulative counters starting from 0) and the decode's RoundLog. */
static int record_write(FILE *f, const RoundRecord *r) {
    RoundInfo ri;
    memset(&ri, 0, sizeof ri);
    ri.round = r->round, ri.emitted = r->emitted, ri.dropped = r->dropped;
    ri.accepted = r->accepted, ri.tree_size = r->tree_size;
    ri.x1_in_pool = r->x1_in_pool < 0 ? -1 : r->x1_in_pool;
    ri.tau = r->tau, ri.root_margin = r->root_margin;
    ri.plan_k = -1;
    const int64_t *t = &r->t_round_start;
    uint64_t *u = &ri.t_round_start;
    for (int i = 0; i < 9; i++) u[i] = t[i] < 0 ? 0 : (uint64_t)t[i];
    ri.draft_ns = r->draft_ns < 0 ? 0 : (uint64_t)r->draft_ns;
    ri.graph_replays = (uint64_t)r->graph_replays;
    ri.eager_launches = (uint64_t)r->eager_launches;
    for (int i = 0; i < r->n_tokens; i++) ri.tokens[i] = r->tokens[i];
    RoundLog lg = {.decoder = r->decoder, .temp = r->temp, .budget = r->budget,
                   .prompt_id = r->prompt_id, .rep = r->rep};
    roundlog_begin(&lg, &(BackendStats){0});
    return roundlog_write(f, &lg, &ri);
}

static RoundRecord mk_round(const char *dec, int temp, int budget, const char *pid, int round,
                           int64_t t0) {
    RoundRecord r;
    record_init(&r);
    snprintf(r.decoder, sizeof r.decoder, "%s", dec);
    snprintf(r.prompt_id, sizeof r.prompt_id, "%s", pid);
    r.temp = temp, r.budget = budget, r.round = round;
    int ar = !strcmp(dec, "ar"), root_pass = !ar && strcmp(dec, "draft") != 0;
    int64_t ms = 1000000;
    r.t_round_start = t0;
    if (!ar) {
        r.t_grow_sent = t0 + ms / 10;
        r.t_pool_recv = t0 + 8 * ms + (round % 3) * ms;
        r.t_select_done = r.t_pool_recv + ms / 4;
        r.draft_ns = 7 * ms + (round % 3) * ms;
        r.tree_size = budget;
        r.tau = 1.5 + 0.25 * (round % 4);
        r.graph_replays = 1 + root_pass;
        r.eager_launches = budget > 60;
    }
    if (root_pass) {
        r.t_root_start = t0 + ms / 5;
        r.t_root_end = r.t_root_start + 5 * ms;
    }
    if (!strcmp(dec, "pearl") || !strcmp(dec, "rootdraw")) r.x1_in_pool = round % 5 != 0;
    int64_t ts = ar ? t0 + ms / 10 : r.t_select_done + ms / 10;
    r.t_tree_start = ts;
    r.t_tree_end = ts + (ar ? 5 : 6) * ms;
    r.t_commit = r.t_tree_end + ms / 2;
    r.accepted = ar ? 0 : 1 + (round + budget / 8) % 4;
    r.emitted = r.accepted + 1;
    return r;
}

static void rounds_eq(const RoundRecord *a, const RoundRecord *b) {
    ck_assert_str_eq(a->decoder, b->decoder);
    ck_assert_str_eq(a->prompt_id, b->prompt_id);
    ck_assert_int_eq(a->temp, b->temp);
    ck_assert_int_eq(a->budget, b->budget);
    ck_assert_int_eq(a->rep, b->rep);
    ck_assert_int_eq(a->round, b->round);
    ck_assert_int_eq(a->emitted, b->emitted);
    ck_assert_int_eq(a->accepted, b->accepted);
    ck_assert_int_eq(a->tree_size, b->tree_size);
    ck_assert_int_eq(a->x1_in_pool, b->x1_in_pool);
    ck_assert(isnan(a->tau) ? isnan(b->tau) : a->tau == b->tau);
    const int64_t *ta = &a->t_round_start, *tb = &b->t_round_start;
    for (int i = 0; i < 9; i++) ck_assert_int_eq(ta[i], tb[i]);
    ck_assert_int_eq(a->draft_ns, b->draft_ns);
    ck_assert_int_eq(a->graph_replays, b->graph_replays);
    ck_assert_int_eq(a->eager_launches, b->eager_launches);
}

START_TEST(test_log_roundtrip) {
    char *dir = tmp_dir();
    FILE *fr, *fd;
    RsErr e = {0};
    ck_assert_msg(benchlog_open(dir, 0, &fr, &fd, &e) == RS_OK, "%s", e.msg);
    RoundRecord r[3] = {mk_round("ar", 0, 0, "81", 0, 1000), mk_round("pearl", 1, 59, "82", 3,
                                                                    INT64_C(123456789012345)),
                       mk_round("root", 0, 8, "HumanEval/0", 1, 5)};
    r[2].tau = 1.0 / 3.0; /* needs %.17g to round-trip */
    r[1].rep = 4;
    for (int i = 0; i < 3; i++) ck_assert_int_eq(record_write(fr, &r[i]), RS_OK);
    BenchDecode d[2] = {
        {.prompt_id = "81", .prompt_pos = 3, .decoder = "ar", .temp = 0, .budget = 0,
         .tokens = 264, .time_ns = INT64_C(9876543210), .speed = 26.73, .rounds = 264,
         .mean_accepted = 0, .hit_eos = 0, .run_index = 17, .rep = 2},
        {.prompt_id = "HumanEval/0", .prompt_pos = 0, .decoder = "rootdraw", .temp = 1,
         .budget = 59, .tokens = 12, .time_ns = 1, .speed = 1.2e10, .rounds = 3,
         .mean_accepted = 3.333333, .hit_eos = 1, .run_index = 0}};
    for (int i = 0; i < 2; i++) ck_assert_int_eq(benchlog_decode_write_row(fd, &d[i]), RS_OK);
    /* interrupted writes: partial final lines */
    fputs("{\"decoder\":\"root\",\"temp\":0,\"bud", fr);
    fputs("82,1,draft,0,8,100,12", fd);
    fclose(fr);
    fclose(fd);

    char rp[256], dp[256];
    snprintf(rp, sizeof rp, "%s/rounds.jsonl", dir);
    snprintf(dp, sizeof dp, "%s/decodes.csv", dir);
    size_t len;
    char *txt = slurp(rp, &len);
    ck_assert_msg(strstr(txt, "\"x1_in_pool\":null,\"tau\":null,\"root_margin\":null,"
                              "\"tree_pass_skipped\":false,\"fallback_ar\":false,"
                              "\"t_round_start\":1000,\"t_grow_sent\":null") != NULL, "%s", txt);
    free(txt);
    RoundRecord *rr;
    int nr;
    ck_assert_msg(roundlog_read(rp, &rr, &nr, &e) == RS_OK, "%s", e.msg);
    ck_assert_int_eq(nr, 3);
    for (int i = 0; i < 3; i++) rounds_eq(&rr[i], &r[i]);
    free(rr);
    BenchDecode *dd;
    int nd;
    ck_assert_msg(benchlog_decodes_read(dp, &dd, &nd, &e) == RS_OK, "%s", e.msg);
    ck_assert_int_eq(nd, 2);
    for (int i = 0; i < 2; i++) {
        ck_assert_str_eq(dd[i].prompt_id, d[i].prompt_id);
        ck_assert_str_eq(dd[i].decoder, d[i].decoder);
        ck_assert_int_eq(dd[i].prompt_pos, d[i].prompt_pos);
        ck_assert_int_eq(dd[i].temp, d[i].temp);
        ck_assert_int_eq(dd[i].budget, d[i].budget);
        ck_assert_int_eq(dd[i].tokens, d[i].tokens);
        ck_assert_int_eq(dd[i].time_ns, d[i].time_ns);
        ck_assert_double_eq_tol(dd[i].speed, d[i].speed, 1e-6);
        ck_assert_int_eq(dd[i].rounds, d[i].rounds);
        ck_assert_double_eq_tol(dd[i].mean_accepted, d[i].mean_accepted, 1e-6);
        ck_assert_int_eq(dd[i].hit_eos, d[i].hit_eos);
        ck_assert_int_eq(dd[i].run_index, d[i].run_index);
        ck_assert_int_eq(dd[i].rep, d[i].rep);
    }
    free(dd);

    /* a log written before repetitions: its rows read as rep 0 */
    const char *v1 = "prompt_id,prompt_pos,decoder,temp,budget,tokens,time_ns,speed,rounds,"
                     "mean_accepted,hit_eos,run_index\n81,0,ar,0,0,10,100,1.0,1,0,0,5\n";
    write_text(dp, v1, strlen(v1));
    ck_assert_msg(benchlog_decodes_read(dp, &dd, &nd, &e) == RS_OK, "%s", e.msg);
    ck_assert_int_eq(nd, 1);
    ck_assert_int_eq(dd[0].run_index, 5);
    ck_assert_int_eq(dd[0].rep, 0);
    free(dd);
    /* the current header wants its 13 fields */
    const char *short13 = "prompt_id,prompt_pos,decoder,temp,budget,tokens,time_ns,speed,rounds,"
                          "mean_accepted,hit_eos,run_index,rep\n81,0,ar,0,0,10,100,1.0,1,0,0,5\n";
    write_text(dp, short13, strlen(short13));
    ck_assert_int_eq(benchlog_decodes_read(dp, &dd, &nd, &e), RS_EFORMAT);
    ck_assert_msg(strstr(e.msg, ":2: 12 fields, expected 13"), "%s", e.msg);

    /* a malformed line that is not the last is an error naming file and line */
    const char *bad = "prompt_id,prompt_pos,decoder,temp,budget,tokens,time_ns,speed,rounds,"
                      "mean_accepted,hit_eos,run_index\n81,0,ar,0,0,10,100,1.0,1,0,0,0\n"
                      "81,0,ar,2,0,10,100,1.0,1,0,0,0\n";
    write_text(dp, bad, strlen(bad));
    ck_assert_int_eq(benchlog_decodes_read(dp, &dd, &nd, &e), RS_EFORMAT);
    char want[512];
    snprintf(want, sizeof want, "%s:3: field temp = \"2\" is not an integer in [0, 1]", dp);
    ck_assert_str_eq(e.msg, want);
    const char *badj = "{\"decoder\":\"ar\"}\n";
    write_text(rp, badj, strlen(badj));
    ck_assert_int_eq(roundlog_read(rp, &rr, &nr, &e), RS_EFORMAT);
    snprintf(want, sizeof want, "%s:1: field \"prompt_id\" must be a name of 1-63 characters "
                                "[A-Za-z0-9_./:+-]", rp);
    ck_assert_str_eq(e.msg, want);
    badj = "{\"decoder\":\"ar\",\n";
    write_text(rp, badj, strlen(badj));
    ck_assert_int_eq(roundlog_read(rp, &rr, &nr, &e), RS_EFORMAT);
    snprintf(want, sizeof want, "%s:1: not a JSON object", rp);
    ck_assert_str_eq(e.msg, want);
    rm_dir(dir);
}
END_TEST

/* The round log's reader takes the two older shapes: the bench's (budget 1000 for auto, no
 * tokens, no dropped) and rootspec-target's (numeric prompt id, "auto", cumulative backend
 * counters, which it reads as each round's share). */
START_TEST(test_log_older_shapes) {
    char *dir = tmp_dir();
    char rp[256];
    snprintf(rp, sizeof rp, "%s/rounds.jsonl", dir);
    const char *txt =
        "{\"decoder\":\"draft\",\"temp\":0,\"budget\":1000,\"prompt_id\":\"81\",\"round\":0,"
        "\"emitted\":3,\"accepted\":2,\"tree_size\":8,\"x1_in_pool\":null,\"tau\":2.5,"
        "\"t_round_start\":10,\"t_grow_sent\":11,\"t_root_start\":null,\"t_root_end\":null,"
        "\"t_pool_recv\":12,\"t_select_done\":13,\"t_tree_start\":14,\"t_tree_end\":15,"
        "\"t_commit\":16,\"draft_ns\":null,\"graph_replays\":2,\"eager_launches\":1}\n"
        "{\"decoder\":\"root\",\"temp\":1,\"budget\":\"auto\",\"prompt_id\":7,\"round\":0,"
        "\"emitted\":2,\"dropped\":0,\"accepted\":1,\"tree_size\":4,\"budget_chosen\":4,"
        "\"depth_asked\":3,\"pred_tok_s\":null,\"real_tok_s\":10.000000,\"x1_in_pool\":true,"
        "\"tau\":1.250000,\"root_margin\":0.500000,\"tree_pass_skipped\":false,"
        "\"fallback_ar\":false,\"t_round_start\":1,\"t_grow_sent\":2,\"t_root_start\":3,"
        "\"t_root_end\":4,\"t_pool_recv\":5,\"t_select_done\":6,\"t_tree_start\":7,"
        "\"t_tree_end\":8,\"t_commit\":9,\"measure_ns\":0,\"draft_ns\":5,\"draft_commit_ns\":1,"
        "\"draft_host_ns\":null,\"draft_rows\":0,\"graph_replays\":10,\"eager_launches\":3,"
        "\"d2h_full_rows\":4,\"tokens\":[5,6]}\n"
        "{\"decoder\":\"root\",\"temp\":1,\"budget\":\"auto\",\"prompt_id\":7,\"round\":1,"
        "\"emitted\":1,\"dropped\":0,\"accepted\":0,\"tree_size\":4,\"x1_in_pool\":false,"
        "\"tau\":null,\"t_round_start\":1,\"t_grow_sent\":2,\"t_root_start\":3,"
        "\"t_root_end\":4,\"t_pool_recv\":5,\"t_select_done\":6,\"t_tree_start\":7,"
        "\"t_tree_end\":8,\"t_commit\":9,\"draft_ns\":null,\"graph_replays\":13,"
        "\"eager_launches\":3,\"d2h_full_rows\":9,\"tokens\":[8]}\n";
    write_text(rp, txt, strlen(txt));
    RoundRecord *r;
    int n;
    RsErr e = {0};
    ck_assert_msg(roundlog_read(rp, &r, &n, &e) == RS_OK, "%s", e.msg);
    ck_assert_int_eq(n, 3);
    ck_assert_int_eq(r[0].budget, BENCH_BUDGET_AUTO);
    ck_assert_int_eq(r[0].n_tokens, ROUNDLOG_NULL);
    ck_assert_int_eq(r[0].dropped, 0);
    ck_assert_int_eq(r[0].graph_replays, 2); /* the bench's own counters: already per round */
    ck_assert_int_eq(r[0].t_root_start, ROUNDLOG_NULL);
    ck_assert_str_eq(r[1].prompt_id, "7");
    ck_assert_int_eq(r[1].budget, BENCH_BUDGET_AUTO);
    ck_assert_int_eq(r[1].budget_chosen, 4);
    ck_assert_int_eq(r[1].x1_in_pool, 1);
    ck_assert_int_eq(r[1].n_tokens, 2);
    ck_assert_int_eq(r[1].tokens[1], 6);
    ck_assert_int_eq(r[2].graph_replays, 3); /* 13 - 10 */
    ck_assert_int_eq(r[2].eager_launches, 0);
    ck_assert_int_eq(r[2].d2h_full_rows, 5);
    ck_assert(isnan(r[2].tau));
    free(r);
    rm_dir(dir);
}
END_TEST

START_TEST(test_resume) {
    char *dir = tmp_dir();
    FILE *fr, *fd;
    RsErr e = {0};
    ck_assert_int_eq(benchlog_open(dir, 0, &fr, &fd, &e), RS_OK);
    /* decode 1 (p1, draft T0 B8) complete, decode 2 (p2, root T1 B59) interrupted */
    for (int k = 0; k < 3; k++) {
        RoundRecord r = mk_round("draft", 0, 8, "p1", k, 100 * k);
        record_write(fr, &r);
    }
    BenchDecode d = {.prompt_id = "p1", .decoder = "draft", .temp = 0, .budget = 8,
                     .tokens = 9, .time_ns = 1000, .rounds = 3};
    benchlog_decode_write_row(fd, &d);
    for (int k = 0; k < 2; k++) {
        RoundRecord r = mk_round("root", 1, 59, "p2", k, 100 * k);
        record_write(fr, &r);
    }
    fputs("{\"decoder\":\"ro", fr);
    fputs("p2,1,root,1,59,", fd);
    fclose(fr);
    fclose(fd);

    BenchDoneSet *done;
    ck_assert_msg(bench_resume_load(dir, &done, &e) == RS_OK, "%s", e.msg);
    ck_assert_int_eq(bench_done_count(done), 1);
    BenchCombo c1 = {"draft", 0, 8}, c2 = {"root", 1, 59}, c3 = {"draft", 1, 8};
    ck_assert(bench_done_has(done, "p1", &c1, 0));
    ck_assert(!bench_done_has(done, "p1", &c1, 1)); /* another repetition */
    ck_assert(!bench_done_has(done, "p2", &c2, 0));
    ck_assert(!bench_done_has(done, "p1", &c3, 0));
    bench_done_destroy(&done);
    ck_assert_ptr_null(done);

    /* reopen for resume: partial lines cut, the interrupted decode's rounds dropped */
    ck_assert_msg(benchlog_open(dir, 1, &fr, &fd, &e) == RS_OK, "%s", e.msg);
    RoundRecord r = mk_round("root", 1, 59, "p2", 0, 7);
    record_write(fr, &r);
    d = (BenchDecode){.prompt_id = "p2", .decoder = "root", .temp = 1, .budget = 59,
                      .tokens = 4, .time_ns = 50, .rounds = 1};
    benchlog_decode_write_row(fd, &d);
    fclose(fr);
    fclose(fd);
    char p[256];
    snprintf(p, sizeof p, "%s/rounds.jsonl", dir);
    RoundRecord *rr;
    int nr;
    ck_assert_msg(roundlog_read(p, &rr, &nr, &e) == RS_OK, "%s", e.msg);
    ck_assert_int_eq(nr, 4);
    ck_assert_str_eq(rr[3].prompt_id, "p2");
    ck_assert_int_eq(rr[3].t_round_start, 7);
    for (int k = 0; k < 3; k++) ck_assert_str_eq(rr[k].prompt_id, "p1");
    free(rr);
    snprintf(p, sizeof p, "%s/decodes.csv", dir);
    size_t len;
    char *txt = slurp(p, &len);
    ck_assert_str_eq(txt, "prompt_id,prompt_pos,decoder,temp,budget,tokens,time_ns,speed,rounds,"
                          "mean_accepted,hit_eos,run_index,rep\n"
                          "p1,0,draft,0,8,9,1000,0.000000,3,0.000000,0,0,0\n"
                          "p2,0,root,1,59,4,50,0.000000,1,0.000000,0,0,0\n");
    free(txt);
    /* missing directory contents: empty done set */
    char *empty = tmp_dir();
    ck_assert_int_eq(bench_resume_load(empty, &done, &e), RS_OK);
    ck_assert_int_eq(bench_done_count(done), 0);
    bench_done_destroy(&done);
    rm_dir(empty);
    rm_dir(dir);
}
END_TEST

/* ---- summary / analyze ---- */

/* Synthetic run: 6 prompts x 18 settings. AR speed 20+i tok/s on prompt i; draft 1.5x AR;
 * root exactly 1.1x draft at T=0 B=8 (so the interval collapses); others vary by prompt. */
static void synth(BenchDecode **dout, int *nd, RoundRecord **rout, int *nr) {
    BenchCombo c[18];
    int nc = bench_combos_default(c, 18, 1);
    BenchPlan *pl = bench_plan_create(6, nc, 0, 1, 2024);
    BenchDecode *d = rs_xcalloc((size_t)pl->n_runs, sizeof *d);
    RoundRecord *r = NULL;
    int n = 0, m = 0, cap = 0;
    for (int k = 0; k < pl->n_runs; k++) {
        const BenchRun *run = &pl->runs[k];
        const BenchCombo *cb = &c[run->combo];
        int i = run->prompt;
        double f = 1.0;
        if (!strcmp(cb->decoder, "draft")) f = 1.5;
        else if (!strcmp(cb->decoder, "pearl")) f = 1.5 * (1.02 + 0.01 * i);
        else if (!strcmp(cb->decoder, "rootdraw")) f = 1.5 * (1.04 + 0.015 * ((i * 7) % 5));
        else if (!strcmp(cb->decoder, "root"))
            f = 1.5 * (cb->temp == 0 && cb->budget == 8 ? 1.1 : 1.03 + 0.02 * (i % 3));
        if (cb->temp) f *= 0.9;
        BenchDecode *x = &d[n++];
        snprintf(x->prompt_id, sizeof x->prompt_id, "q%d", 80 + i);
        snprintf(x->decoder, sizeof x->decoder, "%s", cb->decoder);
        x->prompt_pos = run->prompt_pos;
        x->temp = cb->temp;
        x->budget = cb->budget;
        x->tokens = 100 + 10 * i + (cb->temp ? 5 : 0);
        x->time_ns = (int64_t)llround((double)x->tokens * 1e9 / ((20 + i) * f));
        x->speed = bench_speed(x->tokens, x->time_ns);
        x->hit_eos = i % 2;
        x->run_index = run->run_index;
        int64_t t0 = INT64_C(1000000000000) + (int64_t)k * 10000000000;
        int64_t emitted = 0;
        double acc = 0;
        for (int q = 0; emitted < x->tokens; q++) {
            if (m == cap) {
                cap = cap ? 2 * cap : 1024;
                r = realloc(r, (size_t)cap * sizeof *r);
            }
            r[m] = mk_round(cb->decoder, cb->temp, cb->budget, x->prompt_id, q,
                            t0 + (int64_t)q * 20000000);
            emitted += r[m].emitted;
            acc += r[m].accepted;
            m++;
            x->rounds++;
        }
        x->mean_accepted = acc / x->rounds;
    }
    bench_plan_destroy(&pl);
    *dout = d;
    *nd = n;
    *rout = r;
    *nr = m;
}

static void write_logs(const char *dir, const BenchDecode *d, int nd, const RoundRecord *r,
                       int nr) {
    FILE *fr, *fd;
    RsErr e = {0};
    ck_assert_msg(benchlog_open(dir, 0, &fr, &fd, &e) == RS_OK, "%s", e.msg);
    for (int i = 0; i < nr; i++) ck_assert_int_eq(record_write(fr, &r[i]), RS_OK);
    for (int i = 0; i < nd; i++) ck_assert_int_eq(benchlog_decode_write_row(fd, &d[i]), RS_OK);
    fclose(fr);
    fclose(fd);
}

/* --analyze refuses what is not one run's log: a binary header is quoted escaped
 * (it used to reach the terminal raw), a repeated decode row is refused naming both lines
 * (it was counted silently), and an empty rounds.jsonl beside decodes is refused. */
START_TEST(test_analyze_refusals) {
    setenv("ROOTSPEC_GNUPLOT", "/nonexistent/gnuplot", 1);
    char *dir = tmp_dir();
    BenchDecode *d;
    RoundRecord *r;
    int nd, nr;
    synth(&d, &nd, &r, &nr);
    RsErr e = {0};
    char dp[256], rp[256];
    snprintf(dp, sizeof dp, "%s/decodes.csv", dir);
    snprintf(rp, sizeof rp, "%s/rounds.jsonl", dir);
    write_logs(dir, d, nd, r, nr);
    write_text(dp, "\x1b[2J\x07prompt_id\n", 15);
    ck_assert_int_eq(bench_analyze(dir, &e), RS_EFORMAT);
    ck_assert_msg(!strchr(e.msg, 0x1b) && !strchr(e.msg, 0x07) &&
                  strstr(e.msg, "header is \"\\x1b[2J\\x07prompt_id\""), "%s", e.msg);
    d[5] = d[2]; /* row index 5 (line 7) repeats row 2 (line 4) */
    write_logs(dir, d, nd, r, nr);
    ck_assert_int_eq(bench_analyze(dir, &e), RS_EFORMAT);
    ck_assert_msg(strstr(e.msg, "decodes.csv:7 repeats the decode of line 4"), "%s", e.msg);
    free(d);
    free(r);
    synth(&d, &nd, &r, &nr);
    write_logs(dir, d, nd, r, 0);
    ck_assert_int_eq(bench_analyze(dir, &e), RS_EFORMAT);
    ck_assert_msg(strstr(e.msg, "no rounds") && strstr(e.msg, rp), "%s", e.msg);
    free(d);
    free(r);
    rm_dir(dir);
}
END_TEST

START_TEST(test_analyze_reproduces_summary) {
    setenv("ROOTSPEC_GNUPLOT", "/nonexistent/gnuplot", 1); /* plots have their own test */
    char *dir = tmp_dir();
    BenchDecode *d;
    RoundRecord *r;
    int nd, nr;
    synth(&d, &nd, &r, &nr);
    write_logs(dir, d, nd, r, nr);
    RsErr e = {0};
    /* the summary the bench would write from its in-memory records */
    ck_assert_msg(bench_summary_file(dir, d, nd, r, nr, &e) == RS_OK, "%s", e.msg);
    char sp[256], rp[256];
    snprintf(sp, sizeof sp, "%s/summary.md", dir);
    snprintf(rp, sizeof rp, "%s/summary.ref", dir);
    ck_assert_int_eq(rename(sp, rp), 0);
    ck_assert_msg(bench_analyze(dir, &e) == RS_OK, "%s", e.msg);
    size_t la, lb;
    char *a = slurp(rp, &la), *b = slurp(sp, &lb);
    ck_assert_uint_eq(la, lb);
    ck_assert_mem_eq(a, b, la);
    /* known answers */
    ck_assert_msg(strstr(a, "| 0 | 8 | root vs draft | 6 | +10.00% [+10.00%, +10.00%] |"), "%.2000s", a);
    ck_assert_msg(strstr(a, "- prompts: 6; decodes: 108;"), "%.2000s", a);
    /* AR T=0 run speed = sum tokens / sum time = 750 / sum((100+10i)/(20+i)) */
    double t = 0;
    for (int i = 0; i < 6; i++) t += (100.0 + 10 * i) / (20 + i);
    char want[128];
    snprintf(want, sizeof want, "| ar | 0 | - | 6 | 750 | %.2f [", 750 / t);
    ck_assert_msg(strstr(a, want), "missing %s in\n%.2000s", want, a);
    /* draft is exactly 1.5x AR on every prompt */
    ck_assert_msg(strstr(a, "| 1.500 [1.500, 1.500] | 1.500 |"), "%.2000s", a);
    /* rounds: pearl T0 B8 x1_in_pool is true except every 5th round */
    ck_assert_msg(strstr(a, "## Median round timings (ms)"), "%.2000s", a);
    if (getenv("ROOTSPEC_KEEP_TMP")) fputs(a, stderr);
    free(a);
    free(b);
    /* analyze is independent of row order in the files: reversed logs, same bytes */
    for (int i = 0; i < nd / 2; i++) {
        BenchDecode t2 = d[i];
        d[i] = d[nd - 1 - i];
        d[nd - 1 - i] = t2;
    }
    write_logs(dir, d, nd, r, nr);
    ck_assert_int_eq(bench_analyze(dir, &e), RS_OK);
    a = slurp(rp, &la);
    b = slurp(sp, &lb);
    ck_assert_uint_eq(la, lb);
    ck_assert_mem_eq(a, b, la);
    free(a);
    free(b);
    /* the plot step warns and skips without gnuplot */
    ck_assert_int_eq(bench_plots_write(dir, d, nd, r, nr, &e), 1);
    free(d);
    free(r);
    /* missing logs: error names the file */
    remove(sp);
    snprintf(sp, sizeof sp, "%s/decodes.csv", dir);
    remove(sp);
    ck_assert_int_eq(bench_analyze(dir, &e), RS_EINVAL); /* bad input: exit status 2 */
    ck_assert_msg(strstr(e.msg, sp) != NULL, "%s", e.msg);
    rm_dir(dir);
}
END_TEST

/* Repetitions: each (prompt, decoder, T, B) counts as its median decode by speed, and a
 * row repeating a (prompt, decoder, T, B, rep) is a noted duplicate. */
static void rep_row(BenchDecode *x, const char *pid, const char *dec, int rep, double tok_s) {
    memset(x, 0, sizeof *x);
    snprintf(x->prompt_id, sizeof x->prompt_id, "%s", pid);
    snprintf(x->decoder, sizeof x->decoder, "%s", dec);
    x->budget = strcmp(dec, "ar") ? 8 : 0;
    x->tokens = 100;
    x->time_ns = (int64_t)llround(100e9 / tok_s);
    x->speed = tok_s;
    x->rounds = 100;
    x->rep = rep;
}

START_TEST(test_summary_repeats) {
    /* q1: AR 10, 20, 30 tok/s (median 20), draft 5, 15, 30 (median 15): 0.75;
     * q2: AR 40 thrice, draft 50, 60, 44 (median 50): 1.25 */
    static const double sp[2][2][3] = {{{10, 20, 30}, {30, 5, 15}}, {{40, 40, 40}, {50, 60, 44}}};
    BenchDecode d[13];
    int n = 0;
    for (int p = 0; p < 2; p++)
        for (int k = 0; k < 2; k++)
            for (int q = 0; q < 3; q++)
                rep_row(&d[n++], p ? "q2" : "q1", k ? "draft" : "ar", q, sp[p][k][q]);
    rep_row(&d[n++], "q1", "draft", 1, 1000); /* rep 1 again: ignored, the first kept */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    RsErr e = {0};
    ck_assert_msg(bench_summary_write(f, d, n, NULL, 0, &e) == RS_OK, "%s", e.msg);
    fclose(f);
    ck_assert_msg(strstr(buf, "- repetitions: up to 3 decodes of each"), "%s", buf);
    ck_assert_msg(strstr(buf, "1 repeated (prompt, decoder, T, B, rep) rows ignored"), "%s", buf);
    /* run speed of AR over its median decodes: 200 tokens in 5 s + 2.5 s */
    ck_assert_msg(strstr(buf, "| ar | 0 | - | 2 | 200 | 26.67 ["), "%s", buf);
    /* median per-prompt speedup 1.000, lowest 0.750 */
    ck_assert_msg(strstr(buf, "| 1.000 | 0.750 |"), "%s", buf);
    free(buf);
}
END_TEST

/* Expected acceptance: each rule's tau pooled over its prompts' rounds, paired over
 * prompts. q1: pearl tau 1.0, 1.0, rootdraw 1.5, 1.5; q2: pearl 2.0, 2.0, rootdraw 2.2, 2.2;
 * pooled 7.4 / 4 over 6 / 4 = +23.33%, and every resample lies between q2's +10% and q1's
 * +50%. A rootdraw round without a tau (NaN) does not count. */
START_TEST(test_summary_tau_gain) {
    BenchDecode d[6];
    const char *dec[3] = {"draft", "pearl", "rootdraw"};
    int n = 0;
    for (int p = 0; p < 2; p++)
        for (int k = 0; k < 3; k++) {
            rep_row(&d[n], p ? "q2" : "q1", dec[k], 0, 50);
            d[n++].temp = 1;
        }
    static const double tau[2][3] = {{1.0, 1.0, 1.5}, {2.0, 2.0, 2.2}};
    RoundRecord r[2 * 3 * 3];
    int m = 0;
    for (int p = 0; p < 2; p++)
        for (int k = 0; k < 3; k++)
            for (int q = 0; q < 3; q++) {
                r[m] = mk_round(dec[k], 1, 8, p ? "q2" : "q1", q, 1000000000LL * (m + 1));
                r[m++].tau = q < 2 ? tau[p][k] : k == 2 ? NAN : tau[p][k];
            }
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    RsErr e = {0};
    ck_assert_msg(bench_summary_write(f, d, n, r, m, &e) == RS_OK, "%s", e.msg);
    fclose(f);
    const char *sec = strstr(buf, "## Expected acceptance over draft selection");
    ck_assert_msg(sec, "%s", buf);
    const char *row = strstr(sec, "| 1 | 8 | rootdraw vs pearl | 2 | +23.33% [");
    ck_assert_msg(row, "%s", sec);
    double lo, hi;
    ck_assert_int_eq(sscanf(row + strlen("| 1 | 8 | rootdraw vs pearl | 2 | +23.33% ["),
                            "%lf%%, %lf%%]", &lo, &hi), 2);
    ck_assert_msg(lo >= 10.0 - 1e-9 && hi <= 50.0 + 1e-9 && lo < hi, "[%g, %g]", lo, hi);
    ck_assert_msg(strstr(sec, "| 1 | 8 | pearl vs draft | 2 | +0.00% [+0.00%, +0.00%] |"), "%s",
                  sec);
    free(buf);
}
END_TEST

START_TEST(test_plots) {
    unsetenv("ROOTSPEC_GNUPLOT");
    if (access("/usr/bin/gnuplot", X_OK) != 0) {
        fprintf(stderr, "bench_stats: gnuplot missing, plot test skipped\n");
        return;
    }
    char *dir = tmp_dir();
    BenchDecode *d;
    RoundRecord *r;
    int nd, nr;
    synth(&d, &nd, &r, &nr);
    RsErr e = {0};
    ck_assert_msg(bench_plots_write(dir, d, nd, r, nr, &e) == RS_OK, "%s", e.msg);
    const char *names[2] = {"speeds.png", "round_breakdown.png"};
    for (int i = 0; i < 2; i++) {
        char p[256];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        size_t len;
        char *png = slurp(p, &len);
        ck_assert_msg(len > 1000 && memcmp(png, "\x89PNG\r\n\x1a\n", 8) == 0, "%s not a PNG", p);
        free(png);
    }
    free(d);
    free(r);
    rm_dir(dir);
}
END_TEST

START_TEST(test_round_parts) {
    RoundRecord r = mk_round("pearl", 0, 8, "x", 1, 1000000000);
    double p[BENCH_N_PARTS];
    ck_assert_int_eq(bench_round_parts(&r, p), 0);
    /* send 0.1, root 5.0 (0.2..5.2), wait 9.0-5.2 = 3.8, select 0.25, tree 6, commit 0.5+0.1 */
    ck_assert_double_eq_tol(p[0], 0.1, 1e-9);
    ck_assert_double_eq_tol(p[1], 5.0, 1e-9);
    ck_assert_double_eq_tol(p[2], 3.8, 1e-9);
    ck_assert_double_eq_tol(p[3], 0.25, 1e-9);
    ck_assert_double_eq_tol(p[4], 6.0, 1e-9);
    ck_assert_double_eq_tol(p[5], 0.7, 1e-9); /* gaps: 0.1 before root, 0.1 before tree, 0.5 to commit */
    r.t_commit = ROUNDLOG_NULL;
    ck_assert_int_eq(bench_round_parts(&r, p), -1);
}
END_TEST

/* ---- prompts ---- */

START_TEST(test_prompts_formats) {
    char *dir = tmp_dir();
    char path[256];
    snprintf(path, sizeof path, "%s/p.jsonl", dir);
    const char *txt =
        "{\"question_id\": 81, \"category\": \"writing\", \"turns\": [\"Hi \\u00e9\", \"second\"]}\n"
        "\n"
        "{\"task_id\": \"HumanEval/0\", \"prompt\": \"def f(x):\\n    \\\"\\\"\\\"doc\\\"\\\"\\\"\\n\"}\n"
        "{\"prompt\": \"  verbatim  \"}";
    write_text(path, txt, strlen(txt));
    PromptSet *ps;
    RsErr e = {0};
    ck_assert_msg(prompts_load(path, &ps, &e) == RS_OK, "%s", e.msg);
    ck_assert_int_eq(ps->n, 3);
    ck_assert_str_eq(ps->items[0].id, "81");
    ck_assert_str_eq(ps->items[0].category, "writing");
    ck_assert_str_eq(ps->items[0].text, "Hi \xc3\xa9");
    ck_assert_str_eq(ps->items[1].id, "HumanEval/0");
    ck_assert_str_eq(ps->items[1].text, "def f(x):\n    \"\"\"doc\"\"\"\n");
    ck_assert_int_eq(ps->items[1].line, 3);
    ck_assert_str_eq(ps->items[2].id, "line4");
    ck_assert_str_eq(ps->items[2].text, "  verbatim  ");
    prompts_destroy(&ps);
    ck_assert_ptr_null(ps);

    struct {
        const char *text, *msg;
    } bad[] = {
        {"{\"question_id\":1,\"turns\":[\"a\"]}\n{\"question_id\":2,\"turns\":[\"b\"]}\n{\"question_id\":3,"
         "\"turns\":\"c\"}\n",
         "%s:3: \"turns\" must be an array whose first element is a string"},
        {"{\"prompt\":\"ok\"}\n{\"prompt\":\"caf\xc3\"}\n", "%s:2: invalid UTF-8 at byte 15 of the line"},
        {"{\"prompt\":\"ok\"}\n{\"prompt\":\"a\"} x\n", "%s:2: trailing data after the JSON object"},
        {"{\"prompt\":\"ok\"\n", "%s:1: not valid JSON (near byte 14)"},
        {"{\"question_id\":5,\"turns\":[\"a\"]}\n{\"question_id\":5,\"turns\":[\"b\"]}\n",
         "%s:2: duplicate id \"5\" (first on line 1)"},
        {"{\"text\":\"a\"}\n", "%s:1: neither \"turns\" (Spec-Bench) nor \"prompt\" (HumanEval) present"},
        {"{\"prompt\":\"\"}\n", "%s:1: empty prompt"},
        {"{\"prompt\":\"\\ud800\"}\n", NULL}, /* lone surrogate: refused (cJSON or our check) */
        {"{\"task_id\":\"a b\",\"prompt\":\"x\"}\n",
         "%s:1: id \"a b\" must be 1-63 characters of [A-Za-z0-9_./:+-]"},
        {"\n\n", "%s: no prompts in file"},
        /* cJSON would end the string at the NUL: the rest of the prompt would be lost */
        {"{\"prompt\":\"ok\"}\n{\"prompt\":\"a\\u0000b\"}\n", "%s:2: NUL character (\\u0000) in line"},
        {"{\"prompt\":\"a\\\\\\u0000\"}\n", "%s:1: NUL character (\\u0000) in line"}, /* \\ then \u0000 */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_text(path, bad[i].text, strlen(bad[i].text));
        ck_assert_int_eq(prompts_load(path, &ps, &e), RS_EFORMAT);
        ck_assert_ptr_null(ps);
        char want[512];
        if (bad[i].msg) {
            snprintf(want, sizeof want, bad[i].msg, path);
            ck_assert_str_eq(e.msg, want);
        } else {
            snprintf(want, sizeof want, "%s:1: ", path);
            ck_assert_msg(strncmp(e.msg, want, strlen(want)) == 0, "%s", e.msg);
        }
    }
    /* an escaped backslash followed by the text u0000 is no NUL */
    const char *esc = "{\"prompt\":\"a\\\\u0000b\"}\n";
    write_text(path, esc, strlen(esc));
    ck_assert_msg(prompts_load(path, &ps, &e) == RS_OK, "%s", e.msg);
    ck_assert_str_eq(ps->items[0].text, "a\\u0000b");
    prompts_destroy(&ps);
    /* a directory is refused as one (it used to reach a huge allocation) */
    ck_assert_int_eq(prompts_load(dir, &ps, &e), RS_EINVAL);
    ck_assert_ptr_null(ps);
    ck_assert_msg(strstr(e.msg, "is a directory") && strstr(e.msg, dir), "%s", e.msg);
    const char *bom = "\xEF\xBB\xBF{\"prompt\":\"x\"}\n"; /* a leading BOM is not data */
    write_text(path, bom, strlen(bom));
    ck_assert_msg(prompts_load(path, &ps, &e) == RS_OK, "%s", e.msg);
    ck_assert_str_eq(ps->items[0].text, "x");
    prompts_destroy(&ps);
    ck_assert_int_eq(prompts_load("/nonexistent/p.jsonl", &ps, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "/nonexistent/p.jsonl"), "%s", e.msg);
    ck_assert(strstr(prompts_help(), "refused as a whole"));
    rm_dir(dir);
}
END_TEST

START_TEST(test_utf8) {
    ck_assert_int_eq(prompts_utf8_invalid_at("a\xc3\xa9\xf0\x9f\x98\x80", 7), -1);
    ck_assert_int_eq(prompts_utf8_invalid_at("ab\xc0\x80", 4), 2);         /* overlong */
    ck_assert_int_eq(prompts_utf8_invalid_at("\xed\xa0\x80", 3), 0);       /* surrogate */
    ck_assert_int_eq(prompts_utf8_invalid_at("x\xf4\x90\x80\x80", 5), 1);  /* > U+10FFFF */
    ck_assert_int_eq(prompts_utf8_invalid_at("x\xe2\x82", 3), 1);          /* truncated */
}
END_TEST

START_TEST(test_prompts_real_files) {
    PromptSet *ps;
    RsErr e = {0};
    ck_assert_msg(prompts_load("deploy/prompts.jsonl", &ps, &e) == RS_OK, "%s", e.msg);
    ck_assert_int_eq(ps->n, 5);
    prompts_destroy(&ps);
    const char *sb = "/work/shared/data/spec_bench_question.jsonl";
    if (access(sb, R_OK) != 0) return; /* the shared data set is not part of the repo */
    ck_assert_msg(prompts_load(sb, &ps, &e) == RS_OK, "%s", e.msg);
    ck_assert_int_eq(ps->n, 480);
    ck_assert_str_eq(ps->items[0].id, "81");
    ck_assert_str_eq(ps->items[0].category, "writing");
    ck_assert(strncmp(ps->items[0].text, "Compose an engaging travel blog post", 36) == 0);
    prompts_destroy(&ps);
}
END_TEST

/* ---- progress ---- */

START_TEST(test_progress) {
    char buf[32];
    ck_assert_str_eq(bench_format_duration(3725, buf, sizeof buf), "1h02m05s");
    ck_assert_str_eq(bench_format_duration(125, buf, sizeof buf), "2m05s");
    ck_assert_str_eq(bench_format_duration(NAN, buf, sizeof buf), "?");
    FILE *f = tmpfile();
    BenchProgress *p = bench_progress_create(f, 10, 1000.0);
    bench_progress_update(p, 5, "q81 draft T0 B8"); /* within the interval: silent */
    bench_progress_destroy(&p);
    ck_assert_ptr_null(p);
    p = bench_progress_create(f, 4, 1e-9); /* every update prints */
    bench_progress_update(p, 1, "x");
    bench_progress_update(p, 2, NULL);
    bench_progress_destroy(&p);
    rewind(f);
    char text[1024] = {0};
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    ck_assert_uint_gt(n, 0);
    ck_assert_msg(strstr(text, "progress: 5/10 decodes (50.0%), elapsed 0s, ETA 0s, finished\n"),
                  "%s", text);
    ck_assert_msg(strstr(text, "progress: 1/4 decodes (25.0%), elapsed 0s, ETA 0s, now x\n"), "%s",
                  text);
    ck_assert_msg(strstr(text, "progress: 2/4 decodes (50.0%)"), "%s", text);
    ck_assert(!strchr(text, '\r')); /* no bar redraws when not a terminal */
    ck_assert(strstr(bench_help_outputs(), "--analyze DIR"));
}
END_TEST

/* rootspec-target's timing summary (target_proc/timing.c). The target asks for the pool only
 * after its root pass, so t_pool_recv is always past t_root_end: the drafting's end must come
 * from the drafter's own draft_ns, or every root pass looks 100% hidden and, when drafting is
 * the shorter, the rest of the root pass is reported as message overhead. */
static RoundInfo timing_round(uint64_t draft_ms, uint64_t root_ms, int with_root) {
    const uint64_t ms = 1000000, t0 = 1000 * ms;
    RoundInfo r;
    memset(&r, 0, sizeof r);
    r.t_round_start = t0;
    r.t_grow_sent = t0 + ms / 100;
    uint64_t t = r.t_grow_sent;
    if (with_root) {
        r.t_root_start = t + ms / 100;
        r.t_root_end = r.t_root_start + root_ms * ms;
        t = r.t_root_end;
    }
    uint64_t ready = r.t_grow_sent + draft_ms * ms + ms / 2; /* + 0.5 ms of messaging */
    r.t_pool_recv = (ready > t ? ready : t) + ms / 1000;     /* asked after the root pass */
    r.t_select_done = r.t_pool_recv + ms / 10;
    r.t_tree_start = r.t_select_done;
    r.t_tree_end = r.t_tree_start + 5 * ms;
    r.t_commit = r.t_tree_end + ms / 10;
    r.draft_ns = draft_ms * ms;
    return r;
}

START_TEST(test_timing_hidden_share) {
    /* drafting 4 ms, root pass 10 ms: at most 40% of the root pass ran beside drafting */
    RoundInfo a = timing_round(4, 10, 1);
    ck_assert_msg(fabs(timing_hidden_share(&a) - 0.399) < 0.002, "hidden %.4f, expected ~0.40",
                  timing_hidden_share(&a));
    /* drafting 20 ms, root pass 10 ms: all of it hidden */
    RoundInfo b = timing_round(20, 10, 1);
    ck_assert_msg(fabs(timing_hidden_share(&b) - 1.0) < 1e-9, "hidden %.4f", timing_hidden_share(&b));

    TimingAcc *t = NULL;
    timing_create(&t);
    timing_add(t, &a);
    ck_assert_msg(fabs(t->hidden[0] - 0.399) < 0.002, "hidden %.4f", t->hidden[0]);
    /* the pool was ready 6 ms before the target asked: no message overhead to report */
    ck_assert_msg(t->overhead_ms[0] < 0, "overhead %.3f ms for a pool that waited for the target",
                  t->overhead_ms[0]);
    timing_add(t, &b);
    ck_assert_msg(fabs(t->overhead_ms[1] - 0.501) < 1e-6, "overhead %.4f ms, expected 0.501",
                  t->overhead_ms[1]);
    RoundInfo c = timing_round(4, 0, 0); /* draft rule: no root pass, the target waits */
    c.draft_commit_ns = 1000000; /* a commit pass: a and b ran none (guessed ahead) */
    timing_add(t, &c);
    ck_assert_msg(fabs(t->overhead_ms[2] - 0.501) < 1e-6, "overhead %.4f ms", t->overhead_ms[2]);
    ck_assert(t->hidden[2] < 0);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    timing_print(f, t);
    fclose(f);
    ck_assert_msg(strstr(buf, "root pass hidden behind drafting        69.950 %  (2 rounds)"), "%s", buf);
    ck_assert_msg(strstr(buf, "message round trip beyond drafting       0.501 ms (2 rounds)"), "%s", buf);
    ck_assert_msg(strstr(buf, "commits the drafter guessed ahead       66.667 %  (2 of 3 rounds)"),
                  "%s", buf);
    free(buf);
    timing_destroy(&t);
}
END_TEST

Suite *suite_bench_stats(void) {
    Suite *s = suite_create("bench_stats");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_percentile_by_hand);
    tcase_add_test(tc, test_boot_constant_ratio);
    tcase_add_test(tc, test_boot_two_point);
    tcase_add_test(tc, test_boot_vs_numpy);
    tcase_add_test(tc, test_speed_and_tokens);
    tcase_add_test(tc, test_plan_rotation);
    tcase_add_test(tc, test_plan_repeats);
    tcase_add_test(tc, test_combos);
    tcase_add_test(tc, test_log_roundtrip);
    tcase_add_test(tc, test_log_older_shapes);
    tcase_add_test(tc, test_resume);
    tcase_add_test(tc, test_round_parts);
    tcase_add_test(tc, test_analyze_reproduces_summary);
    tcase_add_test(tc, test_analyze_refusals);
    tcase_add_test(tc, test_plots);
    tcase_add_test(tc, test_summary_repeats);
    tcase_add_test(tc, test_summary_tau_gain);
    tcase_add_test(tc, test_prompts_formats);
    tcase_add_test(tc, test_utf8);
    tcase_add_test(tc, test_prompts_real_files);
    tcase_add_test(tc, test_progress);
    tcase_add_test(tc, test_timing_hidden_share);
    suite_add_tcase(s, tc);
    return s;
}
