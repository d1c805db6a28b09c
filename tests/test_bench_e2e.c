/* bench_e2e suite: runs the real build/rootspec-bench binary (fork/exec, from the repo root)
 * on the tiny golden Llama (HF directory, vocab 258) with a 1-layer self-drafter, and checks
 * the run directory from the outside: every output file, one decodes.csv row per planned
 * (prompt, combination), rounds.jsonl consistent with decodes.csv, --analyze reproducing
 * summary.md byte for byte, --resume (nothing to do / re-running exactly the deleted rows /
 * after SIGINT), --launch-drafter, and the exit status and message of bad input. */
#include "bench/benchlog.h"
#include "testutil.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BENCH_BIN "build/rootspec-bench"
#define TINY "tests/fixtures/golden/llama"

/* ---- helpers ---- */

static char *tmp_dir(void) {
    static char buf[4][64];
    static int k = 0;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "/tmp/rs_e2e_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(buf[k]));
    return buf[k];
}

static void rm_tree(const char *dir) {
    if (getenv("ROOTSPEC_KEEP_TMP")) {
        fprintf(stderr, "kept %s\n", dir);
        return;
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_ge(fputs(text, f), 0);
    fclose(f);
}

static char *slurp(const char *path, size_t *n) {
    char *buf;
    size_t len;
    RsErr e = {0};
    ck_assert_msg(rs_read_file(path, &buf, &len, &e) == RS_OK, "%s", e.msg);
    if (n) *n = len;
    return buf;
}

static int file_exists(const char *dir, const char *name) {
    char p[512];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0 && st.st_size > 0;
}

static void check_binary(void) {
    ck_assert_msg(access(BENCH_BIN, X_OK) == 0,
                  "%s not found: build it first (make test-bin); tests run from the repo root",
                  BENCH_BIN);
}

/* Starts the bench with stdout/stderr into dir/NAME.out and dir/NAME.err. */
static pid_t bench_spawn(const char *logdir, const char *name, const char *const *args) {
    check_binary();
    const char *argv[64];
    int a = 0;
    argv[a++] = BENCH_BIN;
    for (int i = 0; args[i]; i++) {
        ck_assert_int_lt(a, 62);
        argv[a++] = args[i];
    }
    argv[a] = NULL;
    char op[512], ep[512];
    snprintf(op, sizeof op, "%s/%s.out", logdir, name);
    snprintf(ep, sizeof ep, "%s/%s.err", logdir, name);
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fo = open(op, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int fe = open(ep, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fo < 0 || fe < 0) _exit(126);
        dup2(fo, 1);
        dup2(fe, 2);
        unsetenv("ROOTSPEC_GNUPLOT");
        execv(BENCH_BIN, (char *const *)argv);
        _exit(127);
    }
    return pid;
}

static int bench_wait(pid_t pid) {
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    if (WIFSIGNALED(st)) return 1000 + WTERMSIG(st);
    return WEXITSTATUS(st);
}

/* Runs the bench to completion; returns its exit status; *err gets its stderr (malloc'd). */
static int bench_run(const char *logdir, const char *name, const char *const *args, char **err) {
    int rc = bench_wait(bench_spawn(logdir, name, args));
    if (err) {
        char p[512];
        snprintf(p, sizeof p, "%s/%s.err", logdir, name);
        *err = slurp(p, NULL);
    }
    return rc;
}

/* decodes.csv rows (header skipped) as "prompt_id,decoder,temp,budget" keys and their
 * repetition, plus the per-row round count; returns the row count. Parsed here, not with
 * the bench's reader. */
#define MAXROWS 512
typedef struct {
    char key[128];
    int rep, rounds, tokens, hit_eos;
} Row;

static int read_rows(const char *dir, Row *rows) {
    char p[512];
    snprintf(p, sizeof p, "%s/decodes.csv", dir);
    char *text = slurp(p, NULL);
    int n = 0, line = 0;
    for (char *save, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        if (line++ == 0) {
            ck_assert_msg(strncmp(l, "prompt_id,prompt_pos,decoder,temp,budget,", 41) == 0,
                          "unexpected header '%s'", l);
            continue;
        }
        char *f[16];
        int nf = 0;
        for (char *s2, *t = strtok_r(l, ",", &s2); t && nf < 16; t = strtok_r(NULL, ",", &s2))
            f[nf++] = t;
        ck_assert_msg(nf == 13, "decodes.csv row %d has %d fields", line, nf);
        ck_assert_int_lt(n, MAXROWS);
        snprintf(rows[n].key, sizeof rows[n].key, "%s,%s,%s,%s", f[0], f[2], f[3], f[4]);
        rows[n].rounds = atoi(f[8]);
        rows[n].tokens = atoi(f[5]);
        rows[n].hit_eos = atoi(f[10]);
        rows[n].rep = atoi(f[12]);
        ck_assert_int_gt(atoi(f[5]), 0);  /* tokens */
        ck_assert_int_gt(atol(f[6]), 0);  /* time_ns */
        n++;
    }
    free(text);
    return n;
}

static int row_find_rep(const Row *rows, int n, const char *key, int rep) {
    for (int i = 0; i < n; i++)
        if (!strcmp(rows[i].key, key) && rows[i].rep == rep) return i;
    return -1;
}

static int row_find(const Row *rows, int n, const char *key) { return row_find_rep(rows, n, key, 0); }

/* Every row's key is unique, and rounds.jsonl holds exactly `rounds` lines for each decode
 * (no rounds of dropped or repeated decodes), with round indices 0..rounds-1, whose tokens
 * less the dropped ones (past --max-new or EOS) are the decode's tokens, which its speed
 * counts. */
static void check_consistent(const char *dir, const Row *rows, int n) {
    for (int i = 0; i < n; i++)
        ck_assert_msg(row_find_rep(rows, i, rows[i].key, rows[i].rep) < 0,
                      "decode %s rep %d logged twice", rows[i].key, rows[i].rep);
    char p[512];
    snprintf(p, sizeof p, "%s/rounds.jsonl", dir);
    RoundRecord *r = NULL;
    int nr = 0;
    RsErr e = {0};
    ck_assert_msg(roundlog_read(p, &r, &nr, &e) == RS_OK, "%s", e.msg);
    int *seen = calloc((size_t)n, sizeof(int)), *kept = calloc((size_t)n, sizeof(int));
    for (int i = 0; i < nr; i++) {
        char key[128];
        snprintf(key, sizeof key, "%s,%s,%d,%d", r[i].prompt_id, r[i].decoder, r[i].temp,
                 r[i].budget);
        int k = row_find_rep(rows, n, key, r[i].rep);
        ck_assert_msg(k >= 0, "round %d of %s has no decodes.csv row", r[i].round, key);
        ck_assert_msg(r[i].round == seen[k], "%s: round %d where %d was expected", key,
                      r[i].round, seen[k]);
        seen[k]++;
        ck_assert_int_ge(r[i].t_commit, r[i].t_round_start);
        ck_assert_int_ge(r[i].emitted, 1);
        ck_assert_msg(r[i].dropped == 0 || r[i].round == rows[k].rounds - 1,
                      "%s: round %d dropped %d tokens but was not the last", key, r[i].round,
                      r[i].dropped);
        kept[k] += r[i].emitted - r[i].dropped;
        if (!strcmp(r[i].decoder, "ar")) {
            ck_assert_int_eq(r[i].x1_in_pool, ROUNDLOG_NULL);
            ck_assert_int_eq(r[i].t_grow_sent, ROUNDLOG_NULL);
        } else {
            ck_assert_int_ne(r[i].t_grow_sent, ROUNDLOG_NULL);
            ck_assert_int_ge(r[i].t_pool_recv, r[i].t_grow_sent);
        }
    }
    for (int k = 0; k < n; k++) {
        ck_assert_msg(seen[k] == rows[k].rounds, "%s: %d rounds logged, decodes.csv says %d",
                      rows[k].key, seen[k], rows[k].rounds);
        ck_assert_msg(kept[k] == rows[k].tokens, "%s: rounds output %d tokens, decodes.csv %d",
                      rows[k].key, kept[k], rows[k].tokens);
    }
    free(seen);
    free(kept);
    free(r);
}

static const char *PROMPTS3 =
    "{\"question_id\": 81, \"category\": \"writing\", \"turns\": [\"Write a short poem about the sea.\", \"again\"]}\n"
    "\n"
    "{\"question_id\": 82, \"category\": \"math\", \"turns\": [\"What is 12 times 7?\"]}\n"
    "{\"task_id\": \"HumanEval/0\", \"prompt\": \"def add(a, b):\\n    \"}\n";

/* 3 prompts x (draft, rootdraw) x T {0,1} x B {8} + AR per T = 3 x 6 decodes. */
#define N_COMBOS 6

static void write_many(const char *path, int n) {
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < n; i++)
        fprintf(f, "{\"question_id\": %d, \"turns\": [\"Prompt number %d: tell me a story.\"]}\n",
                100 + i, i);
    fclose(f);
}

/* ---- tests ---- */

/* The run's rows: --max-new exact, every (prompt, combination) exactly once. */
static int check_run_rows(const char *out, Row *rows) {
    int n = read_rows(out, rows);
    ck_assert_int_eq(n, 3 * N_COMBOS);
    check_consistent(out, rows, n);
    for (int i = 0; i < n; i++) /* --max-new 12 is exact: speeds count no token past it */
        ck_assert_msg(rows[i].hit_eos ? rows[i].tokens <= 12 : rows[i].tokens == 12,
                      "%s: %d tokens under --max-new 12", rows[i].key, rows[i].tokens);
    const char *pids[] = {"81", "82", "HumanEval/0"};
    const char *combos[] = {"ar,0,0", "ar,1,0", "draft,0,8", "draft,1,8", "rootdraw,0,8",
                            "rootdraw,1,8"};
    for (int p = 0; p < 3; p++)
        for (int c = 0; c < N_COMBOS; c++) {
            char key[128];
            snprintf(key, sizeof key, "%s,%s", pids[p], combos[c]);
            ck_assert_msg(row_find(rows, n, key) >= 0, "no decode %s", key);
        }
    return n;
}

/* stdout (tmp/run.out) echoes summary.md, and --analyze reproduces it byte for byte. */
static void check_summary_analyze(const char *tmp, const char *out) {
    char sp[512], op[512], ref[512];
    snprintf(sp, sizeof sp, "%s/summary.md", out);
    snprintf(op, sizeof op, "%s/run.out", tmp);
    size_t ns, no;
    char *sum = slurp(sp, &ns), *so = slurp(op, &no), *err;
    ck_assert_msg(no >= ns && memcmp(so, sum, ns) == 0, "stdout does not start with summary.md");
    ck_assert_ptr_nonnull(strstr(sum, "prompts: 3; decodes: 18"));
    free(so);
    snprintf(ref, sizeof ref, "%s/summary.ref", tmp);
    ck_assert_int_eq(rename(sp, ref), 0);
    const char *an[] = {"--analyze", out, NULL};
    int rc = bench_run(tmp, "analyze", an, &err);
    ck_assert_msg(rc == 0, "--analyze exited %d: %s", rc, err);
    free(err);
    size_t ns2;
    char *sum2 = slurp(sp, &ns2);
    ck_assert_msg(ns2 == ns && memcmp(sum, sum2, ns) == 0, "--analyze changed summary.md");
    free(sum2);
    free(sum);
}

/* --resume on a completed run runs nothing and leaves decodes.csv as it was; with its
 * last 2 rows deleted it re-runs exactly those two. */
static void check_resume(const char *tmp, const char *out, const Row *rows, int n) {
    char dp[512], *err;
    snprintf(dp, sizeof dp, "%s/decodes.csv", out);
    size_t nd;
    char *dec = slurp(dp, &nd);
    const char *rs[] = {"--resume", out, NULL};
    int rc = bench_run(tmp, "resume1", rs, &err);
    ck_assert_msg(rc == 0, "--resume exited %d: %s", rc, err);
    ck_assert_msg(strstr(err, "0 to run") != NULL, "resume of a complete run: %s", err);
    ck_assert_msg(strstr(err, "progress") == NULL, "a complete run ran decodes: %s", err);
    free(err);
    size_t nd2;
    char *dec2 = slurp(dp, &nd2);
    ck_assert_msg(nd2 == nd && memcmp(dec, dec2, nd) == 0, "--resume changed decodes.csv");
    free(dec2);
    char *cut = dec + nd - 1; /* at the final '\n' */
    for (int k = 0; k < 2; k++) {
        cut--;
        while (*cut != '\n') cut--;
    }
    FILE *f = fopen(dp, "wb");
    ck_assert_ptr_nonnull(f);
    fwrite(dec, 1, (size_t)(cut + 1 - dec), f);
    fclose(f);
    free(dec);
    rc = bench_run(tmp, "resume2", rs, &err);
    ck_assert_msg(rc == 0, "--resume exited %d: %s", rc, err);
    ck_assert_msg(strstr(err, "16 of 18 decodes done, 2 to run") != NULL, "%s", err);
    free(err);
    static Row rows2[MAXROWS];
    int n2 = read_rows(out, rows2);
    ck_assert_int_eq(n2, n);
    for (int i = 0; i < n - 2; i++) ck_assert_str_eq(rows2[i].key, rows[i].key);
    /* the two re-run decodes are the deleted ones (in plan order) */
    ck_assert_str_eq(rows2[n - 2].key, rows[n - 2].key);
    ck_assert_str_eq(rows2[n - 1].key, rows[n - 1].key);
    check_consistent(out, rows2, n2);
}

START_TEST(test_e2e_run_analyze_resume) {
    char *tmp = tmp_dir();
    char pf[256], out[256];
    snprintf(pf, sizeof pf, "%s/prompts.jsonl", tmp);
    snprintf(out, sizeof out, "%s/run", tmp);
    write_text(pf, PROMPTS3);
    const char *args[] = {"--model", TINY, "--draft-layers", "0", "--prompts", pf,
                          "--limit", "10", /* more than the file holds: all 3 are used */
                          "--max-new", "12", "--decoders", "draft,rootdraw", "--temps", "0,1",
                          "--budgets", "8", "--seed", "7", "--ctx", "512", "--out", out, NULL};
    char *err;
    int rc = bench_run(tmp, "run", args, &err);
    ck_assert_msg(rc == 0, "rootspec-bench exited %d: %s", rc, err);
    ck_assert_msg(strstr(err, "no known chat template") != NULL, "no raw-text notice: %s", err);
    free(err);
    static const char *files[] = {"rounds.jsonl", "decodes.csv", "summary.md", "speeds.png",
                                  "round_breakdown.png", "run.json"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++)
        ck_assert_msg(file_exists(out, files[i]), "%s/%s missing or empty", out, files[i]);
    static Row rows[MAXROWS];
    int n = check_run_rows(out, rows);
    check_summary_analyze(tmp, out);
    check_resume(tmp, out, rows, n);
    rm_tree(tmp);
}
END_TEST

START_TEST(test_e2e_bad_input) {
    char *tmp = tmp_dir();
    char pf[256], good[256], out[256];
    snprintf(pf, sizeof pf, "%s/bad.jsonl", tmp);
    snprintf(good, sizeof good, "%s/good.jsonl", tmp);
    snprintf(out, sizeof out, "%s/run", tmp);
    write_text(pf, "{\"question_id\": 1, \"turns\": [\"fine\"]}\n"
                   "{\"question_id\": 2, \"turns\": [\"unterminated}\n");
    write_text(good, PROMPTS3);
    char *err;
    const char *a1[] = {"--model", TINY, "--prompts", pf, "--out", out, NULL};
    int rc = bench_run(tmp, "bad1", a1, &err);
    ck_assert_int_eq(rc, 2);
    char want[300];
    snprintf(want, sizeof want, "%s:2", pf);
    ck_assert_msg(strstr(err, want) != NULL, "message lacks '%s': %s", want, err);
    free(err);
    ck_assert_msg(!file_exists(out, "run.json"), "a refused run left run.json behind");

    const char *a2[] = {"--model", TINY, "--prompts", good, "--decoders", "draft,bogus",
                        "--out", out, NULL};
    rc = bench_run(tmp, "bad2", a2, &err);
    ck_assert_int_eq(rc, 2);
    ck_assert_msg(strstr(err, "'bogus'") != NULL, "%s", err);
    free(err);

    const char *a3[] = {"--model", TINY, "--prompts", good, "--temps", "0,2", "--out", out, NULL};
    rc = bench_run(tmp, "bad3", a3, &err);
    ck_assert_int_eq(rc, 2);
    ck_assert_msg(strstr(err, "\"2\"") != NULL, "%s", err);
    free(err);

    const char *a4[] = {"--model", TINY, "--prompts", good, "--budgets", "8,65", "--out", out, NULL};
    rc = bench_run(tmp, "bad4", a4, &err);
    ck_assert_int_eq(rc, 2);
    ck_assert_msg(strstr(err, "\"65\"") != NULL, "%s", err);
    free(err);

    const char *a5[] = {"--model", TINY, "--prompts", good, "--max-new", "12x", "--out", out, NULL};
    rc = bench_run(tmp, "bad5", a5, &err);
    ck_assert_int_eq(rc, 2);
    ck_assert_msg(strstr(err, "'12x'") != NULL, "%s", err);
    free(err);

    const char *a6[] = {"--resume", out, NULL}; /* no run there */
    rc = bench_run(tmp, "bad6", a6, &err);
    ck_assert_int_eq(rc, 2);
    ck_assert_msg(strstr(err, "run.json") != NULL, "%s", err);
    free(err);

    const char *a7[] = {"--resume", out, "--max-new", "5", NULL};
    rc = bench_run(tmp, "bad7", a7, &err);
    ck_assert_int_eq(rc, 2);
    ck_assert_msg(strstr(err, "--max-new") != NULL, "%s", err);
    free(err);

    /* an --out that cannot be made is refused before the models load (it used to fail with
     * exit 1 only once the engine was up and the prompts tokenized) */
    char under_file[300], no_parent[300];
    snprintf(under_file, sizeof under_file, "%s/run", good);
    snprintf(no_parent, sizeof no_parent, "%s/missing/run", tmp);
    const char *a8[] = {"--model", TINY, "--draft-layers", "0", "--prompts", good, "--out",
                        under_file, NULL};
    rc = bench_run(tmp, "bad8", a8, &err);
    ck_assert_msg(rc == 2, "exit %d: %s", rc, err);
    ck_assert_msg(strstr(err, "not a directory") && !strstr(err, "decodes"), "%s", err);
    free(err);
    const char *a9[] = {"--model", TINY, "--draft-layers", "0", "--prompts", good, "--out",
                        no_parent, NULL};
    rc = bench_run(tmp, "bad9", a9, &err);
    ck_assert_msg(rc == 2, "exit %d: %s", rc, err);
    ck_assert_msg(strstr(err, "no such directory") && !strstr(err, "decodes"), "%s", err);
    free(err);
    rm_tree(tmp);
}
END_TEST

/* Exit status of `rootspec-micro --model random:tiny ARGS` (-1: did not exit); *text: its
 * stdout and stderr, which the caller frees. */
static int micro_run(const char *out, const char *args, char **text) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "build/rootspec-micro --model random:tiny %s > '%s' 2>&1", args,
             out);
    int rc = system(cmd);
    *text = slurp(out, NULL);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* ARGS refused with exit 2 and a message holding `want` and, unless NULL, `want2`. */
static void micro_refused(const char *out, const char *args, const char *want,
                          const char *want2) {
    char *text;
    int rc = micro_run(out, args, &text);
    ck_assert_msg(rc == 2, "%s accepted (exit %d): %s", args, rc, text);
    ck_assert_msg(strstr(text, want) && (!want2 || strstr(text, want2)), "%s: %s", args, text);
    free(text);
}

/* bytes_per_token of one micro run at --ctx ctx (1 thread); *text: its output. */
static double micro_bytes_at(const char *out, int ctx, char **text) {
    char args[200];
    snprintf(args, sizeof args, "--threads 1 --iters 1 --ar-tokens 2 --draft-rounds 0 --ctx %d",
             ctx);
    int rc = micro_run(out, args, text);
    ck_assert_msg(rc == 0, "--ctx %d: %s", ctx, *text);
    const char *b = strstr(*text, "bytes_per_token=");
    ck_assert_msg(b != NULL, "no bytes_per_token at --ctx %d:\n%s", ctx, *text);
    return atof(b + 16);
}

/* --ctx: a longer context streams more KV bytes per token; past the model's trained context
 * (random:tiny: 4096) a note says so; 0 is refused by name. */
static void micro_ctx_checks(const char *out) {
    char *t1, *t2;
    double b1 = micro_bytes_at(out, 128, &t1), b2 = micro_bytes_at(out, 300, &t2);
    ck_assert_msg(b2 > b1, "bytes per token %g at ctx 300, %g at 128", b2, b1);
    ck_assert_msg(!strstr(t1, "trained for") && !strstr(t2, "trained for"), "%s", t2);
    free(t1);
    free(t2);
    micro_bytes_at(out, 4032, &t1);
    ck_assert_msg(strstr(t1, "reach 4097 positions, past the 4096"), "no note:\n%s", t1);
    free(t1);
    micro_refused(out, "--ctx 0", "--ctx: 0 is outside", NULL);
}

/* rootspec-micro prints every figure the CPU comparison needs in one run (AR at 1 and 2
 * threads, pass times, copy and read bandwidth, the compute roof, kernel family, resident
 * memory against its budget, the drafter's host work per row), refuses a --rss-ctx smaller
 * than its own prefill, a negative --draft-rounds or --ctx 0 with exit 2, and times passes
 * after the context --ctx asks for. */
START_TEST(test_e2e_micro_report) {
    char *tmp = tmp_dir(), out[256], *text;
    snprintf(out, sizeof out, "%s/micro.txt", tmp);
    int rc = micro_run(out, "--threads 1,2 --iters 1 --ar-tokens 2 --rss-ctx 256", &text);
    ck_assert_msg(rc == 0, "micro failed: %s", text);
    static const char *keys[] = {"ar_tok_s_t1=", "ar_tok_s_t2=", "ar_cpu_tok_s_t2=",
                                 "pass_ms_n1_t1=", "pass_ms_n9_t2=", "pass_ms_n65_t2=",
                                 "kernels_t1=", "bytes_per_token=", "copy_gbs=", "rss_mb=",
                                 "rss_full_mb=", "rss_budget_mb=", "drafter_host_us_row_t1=",
                                 "drafter_host_us_row_t2=", "read_gbs=", "read_frac_n1=",
                                 "roof_ms_n1=", "roof_ms_n65=", "roof_frac_n65_t2="};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        ck_assert_msg(strstr(text, keys[i]) != NULL, "micro output lacks %s:\n%s", keys[i], text);
    /* the roof scales with the rows: 65 rows cost more than one, neither is free */
    double r1 = atof(strstr(text, "roof_ms_n1=") + 11), r65 = atof(strstr(text, "roof_ms_n65=") + 12);
    ck_assert_msg(r1 > 0 && r65 > 4 * r1, "roof n1 %g ms, n65 %g ms:\n%s", r1, r65, text);
    ck_assert_msg(strstr(text, ": within") != NULL, "tiny model over its RSS budget:\n%s", text);
    free(text);
    micro_refused(out, "--rss-ctx 5", "--rss-ctx", " 5 ");
    micro_refused(out, "--draft-rounds -1", "--draft-rounds", NULL);
    micro_ctx_checks(out);
    rm_tree(tmp);
}
END_TEST

/* --eagle3: a head's rounds after a 40-row context on 1 and 2 threads, each against the
 * read stream and the compute roof, as key=value lines with positive figures; a head that does not fit the
 * target is refused by name with exit 2. */
START_TEST(test_e2e_micro_eagle3) {
    char *tmp = tmp_dir(), out[256], *text;
    snprintf(out, sizeof out, "%s/micro.txt", tmp);
    int rc = micro_run(out, "--eagle3 random:eagle3-tiny --threads 1,2 --draft-rounds 2 --ctx 40",
                       &text);
    ck_assert_msg(rc == 0, "micro --eagle3 failed: %s", text);
    for (int t = 1; t <= 2; t++) {
        char key[64];
        snprintf(key, sizeof key, "micro eagle3 threads=%d ctx=40 round_ms=", t);
        const char *l = strstr(text, key);
        ck_assert_msg(l != NULL, "no %s line:\n%s", key, text);
        double round = atof(l + strlen(key)), pass = atof(strstr(l, "pass_ms=") + 8);
        double gbs = atof(strstr(l, "gbs=") + 4), roof = atof(strstr(l, "roof_ms=") + 8);
        /* a round holds its expansion passes (medians of each: round >= 7 passes); the
         * key=value line carries enough digits for a tiny head's fractions of a ms */
        ck_assert_msg(round > 6 * pass && pass > 0 && gbs > 0 && roof > 0, "%s", l);
    }
    ck_assert_msg(strstr(text, "AR ") == NULL && strstr(text, "ar_tok_s") == NULL,
                  "--eagle3 ran the model's own timings:\n%s", text);
    free(text);
    micro_refused(out, "--eagle3 random:eagle3-llama3-8b", "vocab", "random:eagle3-llama3-8b");
    rm_tree(tmp);
}
END_TEST

/* A resumed run must measure the same prompts: editing the prompt file is refused. A second
 * run into a directory that holds one is refused too (it would truncate the logs). */
START_TEST(test_e2e_resume_refuses_changed_prompts) {
    char *tmp = tmp_dir();
    char pf[256], out[256];
    snprintf(pf, sizeof pf, "%s/p.jsonl", tmp);
    snprintf(out, sizeof out, "%s/run", tmp);
    write_text(pf, "{\"question_id\": 5, \"turns\": [\"One prompt.\"]}\n");
    const char *args[] = {"--model", TINY, "--draft-layers", "0", "--prompts", pf, "--max-new",
                          "4", "--decoders", "draft", "--temps", "0", "--budgets", "8",
                          "--warmup", "0", "--ctx", "512", "--out", out, NULL};
    char *err;
    int rc = bench_run(tmp, "run", args, &err);
    ck_assert_msg(rc == 0, "exit %d: %s", rc, err);
    free(err);
    rc = bench_run(tmp, "again", args, &err);
    ck_assert_int_eq(rc, 2);
    ck_assert_msg(strstr(err, "already holds a run") != NULL, "%s", err);
    free(err);
    write_text(pf, "{\"question_id\": 5, \"turns\": [\"One prompt, edited.\"]}\n");
    const char *rs[] = {"--resume", out, NULL};
    rc = bench_run(tmp, "resume", rs, &err);
    ck_assert_int_eq(rc, 2);
    ck_assert_msg(strstr(err, "changed since the run started") != NULL && strstr(err, pf),
                  "%s", err);
    free(err);
    rm_tree(tmp);
}
END_TEST

/* --launch-drafter: the decodes go through a rootspec-draft child over ipc://, which is gone
 * when the bench exits. */
START_TEST(test_e2e_launch_drafter) {
    ck_assert_msg(access("build/rootspec-draft", X_OK) == 0, "build/rootspec-draft missing");
    char *tmp = tmp_dir();
    char pf[256], out[256];
    snprintf(pf, sizeof pf, "%s/p.jsonl", tmp);
    snprintf(out, sizeof out, "%s/run", tmp);
    write_text(pf, PROMPTS3);
    const char *args[] = {"--model", TINY, "--draft-layers", "0", "--launch-drafter",
                          "--prompts", pf, "--limit", "2", "--max-new", "12", "--decoders",
                          "root", "--temps", "0", "--budgets", "8", "--warmup", "1", "--ctx",
                          "512", "--out", out, NULL};
    char *err;
    int rc = bench_run(tmp, "run", args, &err);
    ck_assert_msg(rc == 0, "exit %d: %s", rc, err);
    const char *s = strstr(err, "started drafter (pid ");
    ck_assert_msg(s != NULL, "%s", err);
    pid_t child = (pid_t)atoi(s + strlen("started drafter (pid "));
    ck_assert_int_gt(child, 1);
    ck_assert_msg(kill(child, 0) != 0 && errno == ESRCH, "drafter pid %d still running", child);
    free(err);
    Row rows[MAXROWS];
    int n = read_rows(out, rows);
    ck_assert_int_eq(n, 2 * 2); /* 2 prompts x (root T=0 B=8, ar T=0) */
    check_consistent(out, rows, n);
    /* the pool came from the other process: the drafter reported its own time */
    char p[512];
    snprintf(p, sizeof p, "%s/rounds.jsonl", out);
    RoundRecord *r = NULL;
    int nr = 0;
    RsErr e = {0};
    ck_assert_msg(roundlog_read(p, &r, &nr, &e) == RS_OK, "%s", e.msg);
    int n_root = 0;
    for (int i = 0; i < nr; i++)
        if (!strcmp(r[i].decoder, "root")) {
            n_root++;
            ck_assert_msg(r[i].draft_ns > 0, "root round %d of %s without draft_ns", r[i].round,
                          r[i].prompt_id);
        }
    ck_assert_int_gt(n_root, 0);
    free(r);
    rm_tree(tmp);
}
END_TEST

/* The kept tokens (emitted less dropped) of one decode's rounds in a log, in round order. */
static int decode_tokens(const RoundRecord *r, int n, const char *pid, const char *decoder,
                         int *out, int cap) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (strcmp(r[i].prompt_id, pid) || strcmp(r[i].decoder, decoder)) continue;
        ck_assert_msg(r[i].n_tokens == r[i].emitted, "%s %s round %d: %d tokens for %d emitted",
                      pid, decoder, r[i].round, r[i].n_tokens, r[i].emitted);
        for (int j = 0; j < r[i].emitted - r[i].dropped && k < cap; j++) out[k++] = r[i].tokens[j];
    }
    return k;
}

/* A log line's keys in order, comma-separated (the schema a line follows). */
static void line_keys(const char *path, char *keys, size_t cap) {
    char *text = slurp(path, NULL), *nl = strchr(text, '\n');
    ck_assert_ptr_nonnull(nl);
    *nl = 0;
    cJSON *j = cJSON_Parse(text);
    ck_assert_ptr_nonnull(j);
    keys[0] = 0;
    for (const cJSON *it = j->child; it; it = it->next)
        snprintf(keys + strlen(keys), cap - strlen(keys), "%s,", it->string);
    cJSON_Delete(j);
    free(text);
}

/* One round log: a bench run's rounds.jsonl and `rootspec-target --log-rounds` on the same
 * prompts are read by the same reader, name prompts, decoder, T and B alike, follow the
 * same keys, and carry the same T=0 tokens (draft selection is exact, so both equal the
 * bench's AR decode). */
START_TEST(test_e2e_round_log_shared) {
    char *tmp = tmp_dir();
    char pf[256], out[256], tlog[256], rp[512], *err;
    snprintf(pf, sizeof pf, "%s/p.jsonl", tmp);
    snprintf(out, sizeof out, "%s/run", tmp);
    snprintf(tlog, sizeof tlog, "%s/target.jsonl", tmp);
    snprintf(rp, sizeof rp, "%s/rounds.jsonl", out);
    write_text(pf, "{\"question_id\": 81, \"turns\": [\"Write a short poem about the sea.\"]}\n"
                   "{\"question_id\": 82, \"turns\": [\"What is 12 times 7?\"]}\n");
    const char *args[] = {"--model", TINY, "--draft-layers", "0", "--prompts", pf, "--max-new",
                          "6", "--decoders", "draft", "--temps", "0", "--budgets", "8",
                          "--warmup", "0", "--ctx", "512", "--out", out, NULL};
    int rc = bench_run(tmp, "run", args, &err);
    ck_assert_msg(rc == 0, "rootspec-bench exited %d: %s", rc, err);
    free(err);
    char *targv[] = {"build/rootspec-target", "--model", TINY, "--draft-layers", "0", "--prompts",
                     pf, "--max-new", "6", "--decoder", "draft", "--budget", "8", "--temp", "0",
                     "--ctx", "512", "--log-rounds", tlog, NULL};
    rc = tu_wait_exit(tu_spawn(tmp, targv, "target", NULL, 0, 0), 60000);
    err = tu_slurp(tmp, "target", "err");
    ck_assert_msg(rc == 0, "rootspec-target exited %d: %s", rc, err);
    free(err);
    RoundRecord *b = NULL, *t = NULL;
    int nb = 0, nt = 0;
    RsErr e = {0};
    ck_assert_msg(roundlog_read(rp, &b, &nb, &e) == RS_OK, "%s", e.msg);
    ck_assert_msg(roundlog_read(tlog, &t, &nt, &e) == RS_OK, "%s", e.msg);
    ck_assert_int_gt(nt, 0);
    for (int i = 0; i < nt; i++) {
        ck_assert_str_eq(t[i].decoder, "draft");
        ck_assert_int_eq(t[i].temp, 0);
        ck_assert_int_eq(t[i].budget, 8);
        ck_assert_int_eq(t[i].rep, 0);
    }
    const char *pids[] = {"81", "82"};
    for (int p = 0; p < 2; p++) {
        int tb[64], tt[64], ta[64];
        int kb = decode_tokens(b, nb, pids[p], "draft", tb, 64);
        int kt = decode_tokens(t, nt, pids[p], "draft", tt, 64);
        int ka = decode_tokens(b, nb, pids[p], "ar", ta, 64);
        ck_assert_msg(kb == 6 && kt == 6 && ka == 6, "prompt %s: bench %d, target %d, AR %d tokens",
                      pids[p], kb, kt, ka);
        ck_assert_mem_eq(tb, tt, sizeof(int) * 6);
        ck_assert_mem_eq(tb, ta, sizeof(int) * 6);
    }
    char kb[2048], kt[2048];
    line_keys(rp, kb, sizeof kb);
    line_keys(tlog, kt, sizeof kt);
    ck_assert_str_eq(kb, kt);
    free(b);
    free(t);
    rm_tree(tmp);
}
END_TEST

/* --repeats 3: every (prompt, combination) logged three times, reps 0..2, each with its own
 * rounds; run.json keeps the setting; the summary says how it counts them; a resume after
 * the last row is deleted re-runs exactly that repetition. */
START_TEST(test_e2e_repeats) {
    char *tmp = tmp_dir();
    char pf[256], out[256], dp[512], *err;
    snprintf(pf, sizeof pf, "%s/p.jsonl", tmp);
    snprintf(out, sizeof out, "%s/run", tmp);
    snprintf(dp, sizeof dp, "%s/decodes.csv", out);
    write_text(pf, PROMPTS3);
    const char *args[] = {"--model", TINY, "--draft-layers", "0", "--prompts", pf, "--limit", "2",
                          "--max-new", "6", "--decoders", "draft", "--temps", "0", "--budgets",
                          "8", "--repeats", "3", "--warmup", "0", "--ctx", "512", "--out", out,
                          NULL};
    int rc = bench_run(tmp, "run", args, &err);
    ck_assert_msg(rc == 0, "rootspec-bench exited %d: %s", rc, err);
    ck_assert_msg(strstr(err, "2 prompts x 2 combinations x 3 = 12 decodes"), "%s", err);
    free(err);
    static Row rows[MAXROWS];
    int n = read_rows(out, rows);
    ck_assert_int_eq(n, 12);
    check_consistent(out, rows, n);
    const char *keys[] = {"81,ar,0,0", "81,draft,0,8", "82,ar,0,0", "82,draft,0,8"};
    for (int k = 0; k < 4; k++)
        for (int q = 0; q < 3; q++)
            ck_assert_msg(row_find_rep(rows, n, keys[k], q) >= 0, "no %s rep %d", keys[k], q);
    char p[512];
    snprintf(p, sizeof p, "%s/run.json", out);
    char *rj = slurp(p, NULL);
    ck_assert_msg(strstr(rj, "\"repeats\":\t3"), "%s", rj);
    free(rj);
    snprintf(p, sizeof p, "%s/summary.md", out);
    char *sum = slurp(p, NULL);
    ck_assert_msg(strstr(sum, "- repetitions: up to 3 decodes of each"), "%s", sum);
    ck_assert_msg(strstr(sum, "prompts: 2; decodes: 12"), "%s", sum);
    free(sum);
    /* drop the last row: the resume runs that repetition alone */
    size_t nd;
    char *dec = slurp(dp, &nd), *cut = dec + nd - 2;
    while (*cut != '\n') cut--;
    FILE *f = fopen(dp, "wb");
    fwrite(dec, 1, (size_t)(cut + 1 - dec), f);
    fclose(f);
    free(dec);
    const char *rs[] = {"--resume", out, NULL};
    rc = bench_run(tmp, "resume", rs, &err);
    ck_assert_msg(rc == 0 && strstr(err, "11 of 12 decodes done, 1 to run"), "exit %d: %s", rc,
                  err);
    free(err);
    static Row rows2[MAXROWS];
    ck_assert_int_eq(read_rows(out, rows2), 12);
    ck_assert_str_eq(rows2[11].key, rows[11].key);
    ck_assert_int_eq(rows2[11].rep, rows[11].rep);
    check_consistent(out, rows2, 12);
    rm_tree(tmp);
}
END_TEST

/* SIGINT mid-run: exit 130 with a --resume hint, only complete decodes on disk, and a resume
 * that finishes the run with every decode exactly once. */
START_TEST(test_e2e_sigint_resume) {
    char *tmp = tmp_dir();
    char pf[256], out[256], dp[512];
    snprintf(pf, sizeof pf, "%s/many.jsonl", tmp);
    snprintf(out, sizeof out, "%s/run", tmp);
    snprintf(dp, sizeof dp, "%s/decodes.csv", out);
    int np = 30;
    write_many(pf, np);
    const char *args[] = {"--model", TINY, "--draft-layers", "0", "--prompts", pf,
                          "--max-new", "64", "--decoders", "draft,rootdraw", "--temps", "0,1",
                          "--budgets", "8", "--warmup", "0", "--ctx", "512", "--out", out, NULL};
    pid_t pid = bench_spawn(tmp, "run", args);
    /* wait for a few logged decodes, then interrupt */
    int lines = 0;
    for (int t = 0; t < 3000 && lines < 4; t++) {
        FILE *f = fopen(dp, "rb");
        lines = 0;
        if (f) {
            int c;
            while ((c = fgetc(f)) != EOF) lines += c == '\n';
            fclose(f);
        }
        if (lines < 4) usleep(5000);
    }
    ck_assert_msg(lines >= 4, "no decodes logged within 15 s");
    ck_assert_int_eq(kill(pid, SIGINT), 0);
    int rc = bench_wait(pid);
    char ep[512];
    snprintf(ep, sizeof ep, "%s/run.err", tmp);
    char *err = slurp(ep, NULL);
    ck_assert_msg(rc == 130, "exit %d after SIGINT (the run may have finished first): %s", rc, err);
    ck_assert_msg(strstr(err, "--resume") != NULL, "no resume hint: %s", err);
    free(err);
    Row rows[MAXROWS];
    int n = read_rows(out, rows);
    ck_assert_int_ge(n, 3);
    ck_assert_int_lt(n, np * N_COMBOS);
    check_consistent(out, rows, n);
    const char *rs[] = {"--resume", out, NULL};
    rc = bench_run(tmp, "resume", rs, &err);
    ck_assert_msg(rc == 0, "--resume exited %d: %s", rc, err);
    free(err);
    int n2 = read_rows(out, rows);
    ck_assert_int_eq(n2, np * N_COMBOS);
    check_consistent(out, rows, n2);
    ck_assert(file_exists(out, "summary.md"));
    rm_tree(tmp);
}
END_TEST

/* SIGINT while the main thread writes a decode's logs (signals blocked there) waits until the
 * decode row is written. A process-directed signal goes to any thread that does not block
 * it, here the in-process drafter's worker, which used to exit at once, leaving the rounds
 * on disk without their decodes.csv row. rounds.jsonl is a FIFO that the test drains only
 * after the signal, so the bench is held inside that write: the first decode (AR, 200
 * rounds, ~90 KB of log) does not fit a 64 KiB pipe. */
START_TEST(test_e2e_sigint_during_log_write) {
    char *tmp = tmp_dir();
    char pf[256], out[256], fifo[512], dp[512];
    snprintf(pf, sizeof pf, "%s/p.jsonl", tmp);
    write_text(pf, PROMPTS3);
    snprintf(out, sizeof out, "%s/run", tmp);
    ck_assert_int_eq(mkdir(out, 0777), 0);
    snprintf(fifo, sizeof fifo, "%s/rounds.jsonl", out);
    snprintf(dp, sizeof dp, "%s/decodes.csv", out);
    ck_assert_int_eq(mkfifo(fifo, 0644), 0);
    int fd = open(fifo, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    ck_assert_int_ge(fd, 0);
    const char *args[] = {"--model", TINY, "--draft-layers", "0", "--prompts", pf,
                          "--max-new", "200", "--decoders", "draft", "--temps", "0",
                          "--budgets", "8", "--warmup", "0", "--out", out, NULL};
    pid_t pid = bench_spawn(tmp, "run", args);
    /* wait until the pipe holds data and has stopped growing: the writer is blocked */
    int avail = 0, last = -1, stable = 0;
    for (int t = 0; t < 3000 && stable < 30; t++) {
        usleep(10000);
        ck_assert_int_eq(ioctl(fd, FIONREAD, &avail), 0);
        stable = avail > 0 && avail == last ? stable + 1 : 0;
        last = avail;
        ck_assert_msg(waitpid(pid, NULL, WNOHANG) == 0, "bench exited before filling the pipe");
    }
    ck_assert_msg(stable >= 30, "the log pipe never filled (%d bytes)", avail);
    ck_assert_int_eq(kill(pid, SIGINT), 0);
    usleep(300000);
    int alive = waitpid(pid, NULL, WNOHANG) == 0;
    /* drain the rounds, counting lines, until the bench closes its end */
    ck_assert_int_eq(fcntl(fd, F_SETFL, 0), 0);
    char buf[4096];
    long lines = 0;
    ssize_t k;
    while ((k = read(fd, buf, sizeof buf)) > 0)
        for (ssize_t i = 0; i < k; i++) lines += buf[i] == '\n';
    close(fd);
    int rc = alive ? bench_wait(pid) : -1;
    ck_assert_msg(alive, "the bench exited on SIGINT in the middle of writing a decode's logs "
                         "(%ld round lines written)", lines);
    ck_assert_msg(rc == 130, "exit %d after SIGINT", rc);
    Row rows[MAXROWS];
    int n = read_rows(out, rows);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(rows[0].rounds, 200);
    ck_assert_int_eq(lines, rows[0].rounds);
    rm_tree(tmp);
}
END_TEST

Suite *suite_bench_e2e(void) {
    Suite *s = suite_create("bench_e2e");
    TCase *tc = tcase_create("e2e");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_e2e_run_analyze_resume);
    tcase_add_test(tc, test_e2e_repeats);
    tcase_add_test(tc, test_e2e_round_log_shared);
    tcase_add_test(tc, test_e2e_bad_input);
    tcase_add_test(tc, test_e2e_micro_report);
    tcase_add_test(tc, test_e2e_micro_eagle3);
    tcase_add_test(tc, test_e2e_resume_refuses_changed_prompts);
    tcase_add_test(tc, test_e2e_launch_drafter);
    tcase_add_test(tc, test_e2e_sigint_resume);
    tcase_add_test(tc, test_e2e_sigint_during_log_write);
    suite_add_tcase(s, tc);
    return s;
}
