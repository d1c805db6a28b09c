/* rootspec-serve's pieces without HTTP (tests/serve_test.sh drives the whole server):
 * the output text against a whole-string reference for random texts, stop strings and
 * token splits (what streaming sends is always a prefix of the final answer, never a stop
 * string's start, never half a character); request parsing (field types and ranges, each
 * refusal naming its field); the sampling mapping; the response JSON read back; the metric
 * histograms' cumulative buckets. */
#include "testutil.h"
#include "common/rng.h"
#include "serve/serve.h"
#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>
#include <utf8proc.h>

/* ---- output text ------------------------------------------------------------------------ */

/* The answer a stop-string cut gives: text up to the earliest match of any stop string. */
static size_t reference_cut(const char *text, size_t n, char stops[][8], int n_stop) {
    size_t cut = n;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < n_stop; k++) {
            size_t l = strlen(stops[k]);
            if (i + l <= n && !memcmp(text + i, stops[k], l) && i < cut) cut = i;
        }
    return cut;
}

/* Random UTF-8 from a small alphabet (so stop strings match often): a, b, é (2 bytes),
 * € (3 bytes). */
static size_t random_text(Rng *r, char *buf, int chars) {
    static const char *const alpha[] = {"a", "b", "\xc3\xa9", "\xe2\x82\xac"};
    size_t n = 0;
    for (int i = 0; i < chars; i++) {
        const char *c = alpha[(int)(rng_uniform(r) * 4)];
        memcpy(buf + n, c, strlen(c));
        n += strlen(c);
    }
    return n;
}

START_TEST(test_text_stops) {
    Rng r;
    rng_seed(&r, 5);
    char text[512], stops[3][8], got[2048];
    for (int rep = 0; rep < 3000; rep++) {
        size_t n = random_text(&r, text, 1 + (int)(rng_uniform(&r) * 40));
        int n_stop = (int)(rng_uniform(&r) * 3);
        const char *sp[3];
        for (int k = 0; k < n_stop; k++) {
            size_t l = random_text(&r, stops[k], 1 + (int)(rng_uniform(&r) * 2));
            stops[k][l] = 0;
            sp[k] = stops[k];
        }
        size_t cut = reference_cut(text, n, stops, n_stop), len = 0, pos = 0;
        ServeText t;
        serve_text_init(&t, sp, n_stop);
        while (pos < n) { /* tokens of 1..4 bytes, cutting through characters */
            size_t k = 1 + (size_t)(rng_uniform(&r) * 4);
            if (k > n - pos) k = n - pos;
            serve_text_push(&t, text + pos, k);
            pos += k;
            size_t m;
            char *s = serve_text_take(&t, &m);
            if (s) {
                ck_assert_msg(!strstr(s, "\xef\xbf\xbd"), "rep %d: a character was cut", rep);
                memcpy(got + len, s, m);
                len += m;
                free(s);
            }
            ck_assert_msg(len <= cut && !memcmp(got, text, len),
                          "rep %d: streamed %zu bytes that are not the answer's prefix (cut %zu)", rep, len, cut);
        }
        serve_text_finish(&t);
        size_t m;
        char *s = serve_text_take(&t, &m);
        if (s) memcpy(got + len, s, m), len += m;
        free(s);
        ck_assert_msg(len == cut && !memcmp(got, text, cut), "rep %d: answer of %zu bytes, want %zu", rep, len, cut);
        ck_assert_int_eq(t.matched, cut < n);
        serve_text_free(&t);
    }
}
END_TEST

START_TEST(test_utf8_clean) {
    size_t n;
    char *s = serve_utf8_clean("a\xff" "b\xc3", 4, &n);
    ck_assert_str_eq(s, "a\xef\xbf\xbd" "b\xef\xbf\xbd");
    ck_assert_uint_eq(n, 8);
    free(s);
    s = serve_utf8_clean("x\0y", 3, &n); /* a NUL would end the JSON string */
    ck_assert_str_eq(s, "x\xef\xbf\xbdy");
    free(s);
}
END_TEST

/* ---- requests ---------------------------------------------------------------------------- */

static int parse(const char *body, ServeKind kind, ServeRequest *r, ServeError *se) {
    return serve_request_parse(body, strlen(body), kind, "m", r, se);
}

/* Completions echo, and n > 1 streamed, are taken. */
START_TEST(test_request_echo_n_stream) {
    ServeRequest r;
    ServeError se;
    ck_assert_int_eq(parse("{\"prompt\": \"x\", \"echo\": true, \"logprobs\": 2, \"n\": 3, \"stream\": true}",
                           SERVE_COMPLETION, &r, &se), 0);
    ck_assert(r.echo && r.logprobs && r.top_logprobs == 2 && r.n == 3 && r.stream);
    serve_request_free(&r);
}
END_TEST

START_TEST(test_request_refusals) {
    static const struct { const char *body; int kind, status; const char *param; } cases[] = {
        {"{", SERVE_COMPLETION, 400, ""},
        {"[1]", SERVE_COMPLETION, 400, ""},
        {"{\"prompt\": \"x\", \"model\": \"other\"}", SERVE_COMPLETION, 404, "model"},
        {"{\"prompt\": \"x\", \"model\": 3}", SERVE_COMPLETION, 400, "model"},
        {"{\"prompt\": 3}", SERVE_COMPLETION, 400, "prompt"},
        {"{\"prompt\": [1, -2]}", SERVE_COMPLETION, 400, "prompt"},
        {"{\"prompt\": \"x\", \"max_tokens\": 0}", SERVE_COMPLETION, 400, "max_tokens"},
        {"{\"prompt\": \"x\", \"max_tokens\": 2.5}", SERVE_COMPLETION, 400, "max_tokens"},
        {"{\"prompt\": \"x\", \"stream\": 1}", SERVE_COMPLETION, 400, "stream"},
        {"{\"prompt\": \"x\", \"stop\": [\"a\", 2]}", SERVE_COMPLETION, 400, "stop"},
        {"{\"prompt\": \"x\", \"stop\": [\"a\",\"b\",\"c\",\"d\",\"e\"]}", SERVE_COMPLETION, 400, "stop"},
        {"{\"prompt\": \"x\", \"temperature\": \"0\"}", SERVE_COMPLETION, 400, "temperature"},
        {"{\"prompt\": \"x\", \"n\": 17}", SERVE_COMPLETION, 400, "n"},
        {"{\"prompt\": \"x\", \"echo\": 1}", SERVE_COMPLETION, 400, "echo"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"echo\": true}", SERVE_CHAT, 400, "echo"},
        {"{\"prompt\": \"x\", \"presence_penalty\": 0.5}", SERVE_COMPLETION, 400, "presence_penalty"},
        {"{\"prompt\": \"x\", \"rootspec\": {\"decoder\": \"oracle\"}}", SERVE_COMPLETION, 400, "rootspec.decoder"},
        {"{\"prompt\": \"x\", \"rootspec\": {\"budget\": 100000}}", SERVE_COMPLETION, 400, "budget"},
        {"{\"messages\": []}", SERVE_CHAT, 400, "messages"},
        {"{\"messages\": [{\"role\": \"system\", \"content\": \"x\"}]}", SERVE_CHAT, 400, "messages"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", SERVE_CHAT, 400, "messages"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}]}",
         SERVE_CHAT, 400, "messages"},
        {"{\"messages\": [{\"role\": \"tool\", \"content\": \"a\"}, {\"role\": \"user\", \"content\": \"b\"}]}",
         SERVE_CHAT, 400, "messages"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ServeRequest r;
        ServeError se;
        int rc = parse(cases[i].body, (ServeKind)cases[i].kind, &r, &se);
        ck_assert_msg(rc == cases[i].status && !strcmp(se.param, cases[i].param),
                      "%s: status %d param '%s' (%s), want %d '%s'", cases[i].body, rc, se.param,
                      se.msg, cases[i].status, cases[i].param);
        ck_assert_ptr_null(r.text);
        ck_assert_ptr_null(r.msgs);
    }
}
END_TEST

START_TEST(test_request_fields) {
    ServeRequest r;
    ServeError se;
    const char *body = "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", "
                       "\"text\": \"ab\"}, {\"type\": \"text\", \"text\": \"c\"}]}], \"max_tokens\": 7, "
                       "\"stream\": true, \"stream_options\": {\"include_usage\": true}, \"stop\": \"\\n\", "
                       "\"temperature\": 1, \"seed\": 42, \"unknown_field\": [1], \"rootspec\": "
                       "{\"decoder\": \"rootdraw\", \"budget\": 16}}";
    ck_assert_int_eq(parse(body, SERVE_CHAT, &r, &se), 0);
    ck_assert_int_eq(r.n_msgs, 1);
    ck_assert_str_eq(r.msgs[0].role, "user");
    ck_assert_str_eq(r.msgs[0].content, "abc");
    ck_assert_int_eq(r.max_tokens, 7);
    ck_assert(r.stream && r.include_usage && r.has_seed && r.seed == 42);
    ck_assert_int_eq(r.n_stop, 1);
    ck_assert_str_eq(r.stop[0], "\n");
    ck_assert_int_eq(r.decoder, DECODER_ROOTDRAW);
    ck_assert_int_eq(r.budget, 16);
    DecodeOpts opts = {.seed = 1, .sampling = {.top_p = 0.5}};
    ck_assert_int_eq(serve_sampling_map(&r, &opts, &se), 0);
    ck_assert(opts.sampling.temperature == 1 && opts.sampling.top_p == 0.5 && opts.seed == 42);
    r.has_top_k = 1;
    r.top_k = -1; /* off, as vLLM spells it */
    r.has_min_p = 1;
    r.min_p = 0.05;
    ck_assert_int_eq(serve_sampling_map(&r, &opts, &se), 0);
    ck_assert(opts.sampling.top_k == 0 && opts.sampling.min_p == 0.05);
    r.has_top_p = 1;
    r.top_p = 1.5; /* out of range: sampling_check's refusal names it */
    ck_assert_int_eq(serve_sampling_map(&r, &opts, &se), 400);
    ck_assert_msg(strstr(se.msg, "top_p"), "%s", se.msg);
    serve_request_free(&r);
    ck_assert_int_eq(parse("{\"prompt\": [3, 4]}", SERVE_COMPLETION, &r, &se), 0);
    ck_assert(r.n_ids == 2 && r.ids[1] == 4 && r.decoder == -1 && !r.max_tokens);
    serve_request_free(&r);
}
END_TEST

/* Bytes a strict UTF-8 decoder takes whole (utf8proc_iterate rejects overlongs, surrogates
 * and cut characters). */
static int valid_utf8(const char *s) {
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)s;
    utf8proc_ssize_t n = (utf8proc_ssize_t)strlen(s);
    while (n > 0) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(p, n, &cp);
        if (k < 0) return 0;
        p += k;
        n -= k;
    }
    return 1;
}

/* Error messages quote client bytes: the error body is still valid UTF-8, whether the bytes
 * were invalid or a character was cut by a length limit. */
START_TEST(test_error_utf8) {
    char body[512];
    static const char *const cases[] = {
        "{\"messages\": [{\"role\": \"\xff\", \"content\": \"x\"}]}",
        "{\"messages\": [{\"role\": \"us\xc3\", \"content\": \"x\"}]}",
        NULL, /* a model name cut mid-character (below) */
    };
    char name[260] = {0};
    memset(name, 'a', 199);
    strcat(name, "\xc3\xa9\xc3\xa9"); /* é straddles the 200-byte cut */
    snprintf(body, sizeof body, "{\"model\": \"%s\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", name);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ServeRequest r;
        ServeError se;
        int rc = parse(cases[i] ? cases[i] : body, SERVE_CHAT, &r, &se);
        ck_assert_msg(rc >= 400, "case %zu: status %d", i, rc);
        char *js = serve_error_json(&se);
        ck_assert_msg(valid_utf8(js), "case %zu: error body is not UTF-8: %s", i, js);
        free(js);
    }
    ServeError se;
    serve_error(&se, 400, "a\xe2\x82", "bad \xf0\x9f\x98 bytes"); /* the param too */
    char *js = serve_error_json(&se);
    ck_assert_msg(valid_utf8(js), "%s", js);
    free(js);
}
END_TEST

/* One JSON value, then only whitespace: trailing bytes or a second object are refused. */
START_TEST(test_request_strict_json) {
    static const char *const bad[] = {
        "{\"prompt\": \"x\"} x", "{\"prompt\": \"x\"}{\"prompt\": \"y\"}", "{\"prompt\": \"x\"},",
        "{\"prompt\": \"x\"}\n\n]", "{\"prompt\": \"x\"} // comment",
    };
    ServeRequest r;
    ServeError se;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(parse(bad[i], SERVE_COMPLETION, &r, &se) == 400, "%s accepted", bad[i]);
        ck_assert_msg(strstr(se.msg, "JSON"), "%s", se.msg);
    }
    /* a NUL after the object is trailing data too, whatever strlen would say */
    ck_assert_int_eq(serve_request_parse("{\"prompt\": \"x\"}\0{}", 18, SERVE_COMPLETION, "m", &r, &se), 400);
    ck_assert_int_eq(parse(" \t{\"prompt\": \"x\"} \r\n\t ", SERVE_COMPLETION, &r, &se), 0);
    serve_request_free(&r);
}
END_TEST

/* The gate's order and parsing: Host (port and case aside), route, method, key, size,
 * Content-Type; /health open, /metrics open only when public. */
START_TEST(test_gate) {
    ServeGate g = {.max_body = 10};
    RsErr e = {0};
    ck_assert_int_eq(serve_gate_hosts(&g, NULL, "127.0.0.1", &e), 0);
    serve_gate_add_key(&g, "sk-1");
    static const struct { const char *method, *url, *host, *ctype, *auth; int too_large, status; } cases[] = {
        {"POST", "/v1/completions", "127.0.0.1:80", "application/json", "Bearer sk-1", 0, 0},
        {"POST", "/v1/completions", "[::1]:8080", "application/json;charset=utf-8", "bearer  sk-1 ", 0, 0},
        {"POST", "/v1/completions", NULL, "application/json", "Bearer sk-1", 0, 0},
        {"POST", "/v1/completions", "evil:80", "application/json", "Bearer sk-1", 0, 403},
        {"POST", "/v1/completions", "localhost.evil", "application/json", "Bearer sk-1", 0, 403},
        {"GET", "/nope", "localhost", NULL, NULL, 0, 404},
        {"GET", "/v1/completions", "localhost", NULL, "Bearer sk-1", 0, 405},
        {"POST", "/v1/completions", "localhost", "application/json", NULL, 0, 401},
        {"POST", "/v1/completions", "localhost", "application/json", "Bearer sk-", 0, 401},
        {"POST", "/v1/completions", "localhost", "application/json", "Bearer sk-12", 0, 401},
        {"POST", "/v1/completions", "localhost", "application/json", "Basic sk-1", 0, 401},
        {"POST", "/v1/completions", "localhost", "application/json", "Bearer sk-1", 1, 413},
        {"POST", "/v1/completions", "localhost", "text/plain", "Bearer sk-1", 0, 415},
        {"POST", "/v1/chat/completions", "localhost", NULL, "Bearer sk-1", 0, 415},
        {"GET", "/health", "localhost", NULL, NULL, 0, 0},
        {"GET", "/metrics", "localhost", NULL, NULL, 0, 401},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ServeHead h = {cases[i].method, cases[i].url, cases[i].host, cases[i].ctype, cases[i].auth,
                       cases[i].too_large};
        ServeRoute rt;
        ServeError se;
        int rc = serve_gate_check(&g, &h, &rt, &se);
        ck_assert_msg(rc == cases[i].status, "case %zu: %d (%s), want %d", i, rc, rc ? se.msg : "", cases[i].status);
    }
    g.metrics_public = 1;
    ServeHead h = {"GET", "/metrics", "localhost", NULL, NULL, 0};
    ServeRoute rt;
    ServeError se;
    ck_assert_int_eq(serve_gate_check(&g, &h, &rt, &se), 0);
    ck_assert_int_eq(rt, ROUTE_METRICS);
    serve_gate_free(&g);
    ck_assert_int_eq(serve_gate_hosts(&g, NULL, "0.0.0.0", &e), 0); /* not loopback: any Host */
    ck_assert_int_eq(g.n_hosts, 0);
    ck_assert_int_ne(serve_gate_hosts(&g, "a,,b", "127.0.0.1", &e), 0);
    serve_gate_free(&g);
}
END_TEST

/* serve_logprobs_add against the law written out here: log p = l/T - log sum over the k
 * largest of exp(l/T) (top-k), the raw softmax at T = 0; the alternatives are the k most
 * likely in order; a token the law filters out is not listed. */
START_TEST(test_logprobs_law) {
    Rng r;
    rng_seed(&r, 9);
    enum { V = 300 };
    float row[V];
    for (int rep = 0; rep < 50; rep++) {
        for (int i = 0; i < V; i++) row[i] = (float)(rng_uniform(&r) * 12 - 6);
        double T = rep % 3 == 0 ? 0 : 0.3 + rng_uniform(&r);
        int k = rep % 2 ? 0 : 1 + (int)(rng_uniform(&r) * 30);
        Sampling law = {.temperature = T, .top_p = 1, .top_k = k};
        int order[V];
        row_topk(row, V, V, order);
        double t = T == 0 ? 1 : T, lse = 0;
        int kept = T == 0 || k == 0 ? V : k;
        for (int i = 0; i < kept; i++) lse += exp(row[order[i]] / t);
        lse = log(lse);
        ServeLogprobs l = {.top_n = 5};
        int id = order[rep % 4];
        serve_logprobs_add(&l, row, V, &law, id);
        ck_assert_int_eq(l.n, 1);
        ck_assert_msg(fabs(l.lp[0] - (row[id] / t - lse)) < 1e-6, "rep %d: %g vs %g", rep, l.lp[0], row[id] / t - lse);
        for (int i = 0; i < 5; i++) {
            if (i >= kept) {
                ck_assert_int_eq(l.top_ids[i], -1);
                continue;
            }
            ck_assert_int_eq(l.top_ids[i], order[i]);
            ck_assert(fabs(l.top_lp[i] - (row[order[i]] / t - lse)) < 1e-6);
        }
        serve_logprobs_free(&l);
    }
}
END_TEST

/* ---- responses and metrics ---------------------------------------------------------------- */

START_TEST(test_response_json) {
    ServeMeta m = {.kind = SERVE_CHAT, .id = "chatcmpl-1", .created = 5, .model = "m"};
    ServeUsage u = {3, 4, 2};
    char *s = serve_response_json(&m, "hi \"there\"", 10, "stop", &u);
    cJSON *o = cJSON_Parse(s);
    ck_assert_ptr_nonnull(o);
    cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "message"), "content")->valuestring, "hi \"there\"");
    ck_assert_str_eq(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "stop");
    ck_assert_int_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "total_tokens")->valueint, 7);
    ck_assert_int_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"),
                                                              "prompt_tokens_details"),
                                         "cached_tokens")->valueint, 2);
    ck_assert_str_eq(cJSON_GetObjectItem(o, "object")->valuestring, "chat.completion");
    cJSON_Delete(o);
    free(s);
    s = serve_chunk_json(&m, 0, "x", 1, NULL, NULL);
    o = cJSON_Parse(s);
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "delta"), "content")->valuestring, "x");
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(c0, "finish_reason")));
    cJSON_Delete(o);
    free(s);
    ServeError se;
    serve_error(&se, 429, NULL, "busy %d", 3);
    s = serve_error_json(&se);
    o = cJSON_Parse(s);
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "error"), "message")->valuestring, "busy 3");
    cJSON_Delete(o);
    free(s);
}
END_TEST

/* The value of the line that starts with `name ` in Prometheus text; -1 if absent. */
static double metric_value(const char *text, const char *name) {
    size_t l = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, name, l) && p[l] == ' ') return atof(p + l + 1);
    return -1;
}

START_TEST(test_metrics) {
    ServeMetrics *m = NULL;
    serve_metrics_create(&m);
    serve_metrics_itl(m, 0.03, 3);   /* 3 samples of 0.01 */
    serve_metrics_itl(m, 2.0, 1);    /* above every bucket */
    serve_metrics_round(m, 4, 0);
    serve_metrics_round(m, 1, 1);
    serve_metrics_finish(m, FINISH_STOP, 10, 5, 1);
    serve_metrics_request(m, 429);
    char *t = serve_metrics_render(m, 2, 1);
    ck_assert(metric_value(t, "rootspec_inter_token_latency_seconds_bucket{le=\"0.005\"}") == 0);
    ck_assert(metric_value(t, "rootspec_inter_token_latency_seconds_bucket{le=\"0.01\"}") == 3);
    ck_assert(metric_value(t, "rootspec_inter_token_latency_seconds_bucket{le=\"1\"}") == 3);
    ck_assert(metric_value(t, "rootspec_inter_token_latency_seconds_bucket{le=\"+Inf\"}") == 4);
    ck_assert(metric_value(t, "rootspec_inter_token_latency_seconds_count") == 4);
    ck_assert(metric_value(t, "rootspec_tokens_per_round_bucket{le=\"3\"}") == 1);
    ck_assert(metric_value(t, "rootspec_tokens_per_round_sum") == 5);
    ck_assert(metric_value(t, "rootspec_drafter_fallback_rounds_total") == 1);
    ck_assert(metric_value(t, "rootspec_drafter_fallbacks_total") == 1);
    ck_assert(metric_value(t, "rootspec_requests_total{code=\"429\"}") == 1);
    ck_assert(metric_value(t, "rootspec_queue_depth") == 2);
    free(t);
    serve_metrics_destroy(&m);
    ck_assert_ptr_null(m);
}
END_TEST

Suite *suite_serve(void) {
    Suite *s = suite_create("serve");
    TCase *tc = tcase_create("serve");
    tcase_add_test(tc, test_text_stops);
    tcase_add_test(tc, test_utf8_clean);
    tcase_add_test(tc, test_request_refusals);
    tcase_add_test(tc, test_request_echo_n_stream);
    tcase_add_test(tc, test_request_fields);
    tcase_add_test(tc, test_error_utf8);
    tcase_add_test(tc, test_request_strict_json);
    tcase_add_test(tc, test_gate);
    tcase_add_test(tc, test_logprobs_law);
    tcase_add_test(tc, test_response_json);
    tcase_add_test(tc, test_metrics);
    suite_add_tcase(s, tc);
    return s;
}
