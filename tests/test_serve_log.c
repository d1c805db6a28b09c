/* rootspec-serve's round log (--log-rounds): the server's decodes, one at a time and
 * batched, write the round log of rootspec-target and rootspec-bench, read back here with
 * the same reader (roundlog_read): every request's rounds under its id, numbered from 0,
 * emitting exactly the tokens its answer reports. */
#include "testutil.h"
#include "serve/serve_core.h"
#include "target_proc/roundlog.h"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LOG_JOBS 3

/* Runs LOG_JOBS completions (prompt token ids, no tokenizer needed) through a core with
 * `parallel` workers and a round log; ids[i] and tokens[i]: each request's id and the
 * completion tokens its answer reports. */
static void serve_jobs(Engine *en, const DecodeOpts *opts, int parallel, FILE *log,
                       char ids[][48], int *tokens) {
    EngineOpts eo = {.ctx = 256, .threads = 1};
    ServeConfig cfg = {.model_name = "m", .queue_max = LOG_JOBS, .opts_default = *opts,
                       .parallel = parallel, .round_log = log,
                       .batch = {.row_budget = 64, .prefill_chunk = 16, .kv_entries = 512,
                                 .seq_capacity = 256, .backend = engine_backend_params(&eo)}};
    ServeMetrics *m = NULL;
    serve_metrics_create(&m);
    ServeCore *c = NULL;
    RsErr e = {0};
    ck_assert_msg(serve_core_create(en, &cfg, m, &c, &e) == RS_OK, "%s", e.msg);
    ServeJob *jobs[LOG_JOBS];
    for (int i = 0; i < LOG_JOBS; i++) {
        char body[128];
        snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":[%d,%d,%d],\"max_tokens\":%d}",
                 1 + i, 7, 3 * i, 9 + 4 * i);
        ServeRequest r;
        ServeError se = {0};
        ck_assert_int_eq(serve_request_parse(body, strlen(body), SERVE_COMPLETION, "m", &r, &se), 0);
        ck_assert_int_eq(serve_job_create(c, &r, &jobs[i], &se), 0);
        ck_assert_int_eq(serve_core_submit(c, jobs[i], &se), 0);
    }
    for (int i = 0; i < LOG_JOBS; i++) {
        ServeOutput out = {0};
        do {
            free(out.text);
            out = (ServeOutput){0};
            serve_job_wait(jobs[i], 1000, &out);
        } while (!out.done);
        free(out.text);
        ck_assert_msg(!out.failed, "%s", out.err.msg);
        snprintf(ids[i], 48, "%s", serve_job_meta(jobs[i])->id);
        tokens[i] = out.usage.completion_tokens;
        ck_assert_int_gt(tokens[i], 0);
        serve_job_unref(&jobs[i]);
    }
    serve_core_destroy(&c);
    serve_metrics_destroy(&m);
}

/* The log of the jobs, checked request by request against their answers. */
static void check_log(const char *path, const char *decoder, int budget, char ids[][48],
                      const int *tokens) {
    RoundRecord *rr = NULL;
    int n = 0;
    RsErr e = {0};
    ck_assert_msg(roundlog_read(path, &rr, &n, &e) == RS_OK, "%s", e.msg);
    int seen = 0;
    for (int i = 0; i < LOG_JOBS; i++) {
        int rounds = 0, emitted = 0;
        for (int k = 0; k < n; k++) {
            if (strcmp(rr[k].prompt_id, ids[i])) continue;
            ck_assert_int_eq(rr[k].round, rounds);
            ck_assert_int_eq(rr[k].rep, 0);
            ck_assert_str_eq(rr[k].decoder, decoder);
            ck_assert_int_eq(rr[k].budget, budget);
            ck_assert(rr[k].has_sampling);
            ck_assert_int_eq(rr[k].n_tokens, rr[k].emitted);
            emitted += rr[k].emitted - rr[k].dropped;
            rounds++;
        }
        ck_assert_msg(rounds > 0, "no round of request %s in the log", ids[i]);
        ck_assert_int_eq(emitted, tokens[i]);
        seen += rounds;
    }
    ck_assert_int_eq(seen, n); /* every line belongs to one of the requests */
    free(rr);
}

static void run_case(int parallel, DecoderKind decoder, int need_drafter) {
    char path[] = "/tmp/rootspec-serve-log-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    FILE *log = fdopen(fd, "a");
    EngineOpts eo = {.model_path = "random:tiny", .backend = "cpu", .threads = 1, .ctx = 256,
                     .draft_layers = need_drafter ? "0" : NULL};
    Engine *en = NULL;
    RsErr e = {0};
    ck_assert_msg(engine_create(&eo, need_drafter, &en, &e) == RS_OK, "%s", e.msg);
    DecodeOpts opts = {.decoder = decoder, .budget = decoder == DECODER_AR ? 0 : 8, .seed = 3,
                       .max_new = 16, .sampling = {.temperature = 1, .top_p = 1}};
    char ids[LOG_JOBS][48];
    int tokens[LOG_JOBS];
    serve_jobs(en, &opts, parallel, log, ids, tokens);
    ck_assert_int_eq(fclose(log), 0);
    check_log(path, decoder_name(decoder), opts.budget, ids, tokens);
    engine_destroy(&en);
    unlink(path);
}

START_TEST(test_log_one_at_a_time) { run_case(1, DECODER_DRAFT, 1); }
END_TEST

START_TEST(test_log_batched) { run_case(2, DECODER_AR, 0); }
END_TEST

Suite *suite_serve_log(void) {
    Suite *s = suite_create("serve_log");
    TCase *tc = tcase_create("serve_log");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_log_one_at_a_time);
    tcase_add_test(tc, test_log_batched);
    suite_add_tcase(s, tc);
    return s;
}
