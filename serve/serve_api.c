/* The OpenAI API's JSON: requests in, responses, stream chunks and errors out. Unknown
 * request fields are ignored (clients send many); known ones must have the right type and
 * range, and a field the engine cannot honour is refused rather than silently dropped. */
#include "serve.h"
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

/* ---- errors -------------------------------------------------------------------------- */

static const char *error_type(int status) {
    switch (status) {
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 500: case 503: return "server_error";
    default: return "invalid_request_error";
    }
}

int serve_error(ServeError *se, int status, const char *param, const char *fmt, ...) {
    se->status = status;
    se->type = error_type(status);
    se->code = NULL;
    snprintf(se->param, sizeof se->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(se->msg, sizeof se->msg, fmt, ap);
    va_end(ap);
    return status;
}

/* Adds s as valid UTF-8: messages quote client bytes, which may be invalid or cut inside a
 * character by a length limit (JSON must be UTF-8, and clients' decoders refuse it). */
static void add_clean_string(cJSON *o, const char *name, const char *s) {
    size_t n;
    char *clean = serve_utf8_clean(s, strlen(s), &n);
    cJSON_AddStringToObject(o, name, clean);
    free(clean);
}

char *serve_error_json(const ServeError *se) {
    cJSON *root = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(root, "error");
    add_clean_string(err, "message", se->msg);
    cJSON_AddStringToObject(err, "type", se->type ? se->type : error_type(se->status));
    if (se->param[0]) add_clean_string(err, "param", se->param);
    else cJSON_AddNullToObject(err, "param");
    if (se->code) cJSON_AddStringToObject(err, "code", se->code);
    else cJSON_AddNullToObject(err, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

/* ---- request fields ------------------------------------------------------------------ */

static int get_int(const cJSON *o, const char *name, long lo, long hi, int *out, int *has,
                   ServeError *se) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!v || cJSON_IsNull(v)) return 0;
    double x = v->valuedouble;
    if (!cJSON_IsNumber(v) || x != floor(x))
        return serve_error(se, 400, name, "'%s' must be an integer", name);
    if (x < lo || x > hi)
        return serve_error(se, 400, name, "'%s' = %.0f is outside %ld..%ld", name, x, lo, hi);
    *out = (int)x;
    if (has) *has = 1;
    return 0;
}

static int get_num(const cJSON *o, const char *name, double *out, int *has, ServeError *se) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return serve_error(se, 400, name, "'%s' must be a finite number", name);
    *out = v->valuedouble;
    *has = 1;
    return 0;
}

static int get_bool(const cJSON *o, const char *name, int *out, ServeError *se) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) return serve_error(se, 400, name, "'%s' must be true or false", name);
    *out = cJSON_IsTrue(v);
    return 0;
}

static int add_stop(ServeRequest *r, const cJSON *s, ServeError *se) {
    if (!cJSON_IsString(s)) return serve_error(se, 400, "stop", "'stop' must be a string or an array of strings");
    size_t n = strlen(s->valuestring);
    if (n == 0 || n > SERVE_STOP_LEN)
        return serve_error(se, 400, "stop", "a stop string must have 1..%d bytes, not %zu", SERVE_STOP_LEN, n);
    if (r->n_stop == SERVE_STOP_MAX)
        return serve_error(se, 400, "stop", "at most %d stop strings", SERVE_STOP_MAX);
    r->stop[r->n_stop++] = strdup(s->valuestring);
    return 0;
}

static int parse_stop(const cJSON *o, ServeRequest *r, ServeError *se) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "stop"), *s;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsArray(v)) return add_stop(r, v, se);
    cJSON_ArrayForEach(s, v) {
        int rc = add_stop(r, s, se);
        if (rc) return rc;
    }
    return 0;
}

/* Fields that change what is returned in ways this server does not implement: only their
 * neutral values pass. */
static int parse_refused(const cJSON *o, ServeRequest *r, ServeError *se) {
    int has = 0;
    double pen = 0;
    int rc = get_bool(o, "echo", &r->echo, se);
    if (!rc && r->echo && r->kind == SERVE_CHAT)
        rc = serve_error(se, 400, "echo", "'echo' is a completions field (chat answers do not repeat "
                         "the conversation)");
    static const char *const zero[] = {"presence_penalty", "frequency_penalty"};
    for (int i = 0; i < 2 && !rc; i++) {
        rc = get_num(o, zero[i], &pen, &has, se);
        if (!rc && pen != 0)
            rc = serve_error(se, 400, zero[i], "'%s' = %g is not supported by this build (only 0)",
                             zero[i], pen);
    }
    return rc;
}

static int parse_sampling(const cJSON *o, ServeRequest *r, ServeError *se) {
    int rc = get_num(o, "temperature", &r->temperature, &r->has_temperature, se);
    if (!rc) rc = get_num(o, "top_p", &r->top_p, &r->has_top_p, se);
    if (!rc) rc = get_num(o, "min_p", &r->min_p, &r->has_min_p, se);
    if (!rc) rc = get_int(o, "top_k", -1, 1 << 30, &r->top_k, &r->has_top_k, se);
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(o, "seed");
    if (!rc && seed && !cJSON_IsNull(seed)) {
        double x = seed->valuedouble;
        if (!cJSON_IsNumber(seed) || x != floor(x) || fabs(x) > 9007199254740992.0)
            return serve_error(se, 400, "seed", "'seed' must be an integer");
        r->seed = (uint64_t)(int64_t)x;
        r->has_seed = 1;
    }
    return rc;
}

/* The "rootspec" extension object: {"decoder": "ar|draft|pearl|rootdraw|root", "budget": B}. */
static int parse_extension(const cJSON *o, ServeRequest *r, ServeError *se) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, "rootspec");
    if (!x || cJSON_IsNull(x)) return 0;
    if (!cJSON_IsObject(x)) return serve_error(se, 400, "rootspec", "'rootspec' must be an object");
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(x, "decoder");
    if (dec && !cJSON_IsNull(dec)) {
        int rule = cJSON_IsString(dec) ? decoder_parse(dec->valuestring) : -1;
        if (rule < 0 || rule == DECODER_ORACLE)
            return serve_error(se, 400, "rootspec.decoder",
                               "'rootspec.decoder' must be one of ar, draft, pearl, rootdraw, root");
        r->decoder = rule;
    }
    return get_int(x, "budget", 1, TREE_MAX, &r->budget, NULL, se);
}

/* ---- prompts ------------------------------------------------------------------------- */

/* A message's content: a string, or an array of {"type": "text", "text": ...} parts. */
static int content_text(const cJSON *c, char **out, ServeError *se) {
    if (cJSON_IsString(c)) {
        *out = strdup(c->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(c))
        return serve_error(se, 400, "messages", "a message's 'content' must be a string or an array of text parts");
    size_t len = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, c) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(p, "type");
        const cJSON *tx = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "text") || !cJSON_IsString(tx))
            return serve_error(se, 400, "messages", "only text content parts are supported");
        len += strlen(tx->valuestring);
    }
    char *s = rs_xmalloc(len + 1);
    s[0] = 0;
    cJSON_ArrayForEach(p, c) strcat(s, cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring);
    *out = s;
    return 0;
}

/* The conversation, as the OpenAI API sends it: each message's role and text content, in
 * a shape the chat templates render (system first, ending with the user's turn). */
static int parse_messages(const cJSON *o, ServeRequest *r, ServeError *se) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "messages"), *msg;
    int n = cJSON_IsArray(m) ? cJSON_GetArraySize(m) : 0;
    if (n == 0) return serve_error(se, 400, "messages", "'messages' must be a non-empty array");
    if (n > SERVE_MSGS_MAX)
        return serve_error(se, 400, "messages", "%d messages, at most %d", n, SERVE_MSGS_MAX);
    r->msgs = rs_xcalloc((size_t)n, sizeof *r->msgs);
    cJSON_ArrayForEach(msg, m) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        if (!cJSON_IsString(role))
            return serve_error(se, 400, "messages", "message %d: 'role' must be a string", r->n_msgs);
        char *text = NULL;
        if (content_text(cJSON_GetObjectItemCaseSensitive(msg, "content"), &text, se)) return 400;
        r->msgs[r->n_msgs].role = strdup(role->valuestring);
        r->msgs[r->n_msgs++].content = text;
    }
    RsErr e = {0};
    if (chat_conversation_check(r->msgs, r->n_msgs, &e))
        return serve_error(se, 400, "messages", "%s", e.msg);
    return 0;
}

/* "prompt": a string, an array of one string, or an array of token ids. */
static int parse_prompt(const cJSON *o, ServeRequest *r, ServeError *se) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "prompt"), *x;
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(p->child)) p = p->child;
    if (cJSON_IsString(p)) {
        r->text = strdup(p->valuestring);
        return 0;
    }
    int n = cJSON_IsArray(p) ? cJSON_GetArraySize(p) : 0;
    if (n == 0)
        return serve_error(se, 400, "prompt", "'prompt' must be a string or a non-empty array of token ids");
    r->ids = rs_xmalloc(sizeof(int) * (size_t)n);
    cJSON_ArrayForEach(x, p) {
        double v = x->valuedouble;
        if (!cJSON_IsNumber(x) || v != floor(v) || v < 0 || v > 0x7fffffff)
            return serve_error(se, 400, "prompt", "'prompt' token ids must be non-negative integers");
        r->ids[r->n_ids++] = (int)v;
    }
    return 0;
}

/* Chat: "logprobs": bool, "top_logprobs": 0..20 (with logprobs). Completions:
 * "logprobs": N, 0..20 (the top N too). */
static int parse_logprobs(const cJSON *o, ServeRequest *r, ServeError *se) {
    int rc, has = 0;
    if (r->kind == SERVE_CHAT) {
        rc = get_bool(o, "logprobs", &r->logprobs, se);
        if (!rc) rc = get_int(o, "top_logprobs", 0, SERVE_TOP_LOGPROBS, &r->top_logprobs, &has, se);
        if (!rc && has && r->top_logprobs && !r->logprobs)
            rc = serve_error(se, 400, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    } else {
        rc = get_int(o, "logprobs", 0, SERVE_TOP_LOGPROBS, &r->top_logprobs, &r->logprobs, se);
    }
    return rc;
}

static int parse_common(const cJSON *o, ServeRequest *r, ServeError *se) {
    int has = 0, rc = get_int(o, "max_tokens", 1, 1 << 20, &r->max_tokens, &has, se);
    if (!rc) rc = get_int(o, "max_completion_tokens", 1, 1 << 20, &r->max_tokens, &has, se);
    if (!rc) rc = get_bool(o, "stream", &r->stream, se);
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(o, "stream_options");
    if (!rc && so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so))
            return serve_error(se, 400, "stream_options", "'stream_options' must be an object");
        rc = get_bool(so, "include_usage", &r->include_usage, se);
    }
    if (!rc) rc = parse_stop(o, r, se);
    if (!rc) rc = parse_sampling(o, r, se);
    if (!rc) rc = parse_refused(o, r, se);
    if (!rc) rc = get_int(o, "n", 1, SERVE_N_MAX, &r->n, NULL, se);
    if (!rc) rc = parse_logprobs(o, r, se);
    return rc ? rc : parse_extension(o, r, se);
}

static int parse_object(const cJSON *o, ServeKind kind, const char *model_name,
                        ServeRequest *r, ServeError *se) {
    if (!cJSON_IsObject(o)) return serve_error(se, 400, NULL, "the request body must be a JSON object");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(o, "model");
    if (model && !cJSON_IsNull(model) && !cJSON_IsString(model))
        return serve_error(se, 400, "model", "'model' must be a string");
    if (cJSON_IsString(model) && strcmp(model->valuestring, model_name)) {
        serve_error(se, 404, "model", "the model '%.200s' does not exist (this server serves '%s')",
                    model->valuestring, model_name);
        se->code = "model_not_found";
        return 404;
    }
    int rc = kind == SERVE_CHAT ? parse_messages(o, r, se) : parse_prompt(o, r, se);
    return rc ? rc : parse_common(o, r, se);
}

int serve_request_parse(const char *body, size_t len, ServeKind kind, const char *model_name,
                        ServeRequest *r, ServeError *se) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->decoder = -1;
    r->n = 1;
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!o) return serve_error(se, 400, NULL, "the request body is not valid JSON");
    /* One value and nothing after it but whitespace: a second object or trailing bytes
     * mean the client and this server disagree on what was asked. */
    while (end < body + len && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')) end++;
    if (end != body + len) {
        cJSON_Delete(o);
        return serve_error(se, 400, NULL, "the request body has bytes after its JSON value (at offset %zu)",
                           (size_t)(end - body));
    }
    int rc = parse_object(o, kind, model_name, r, se);
    cJSON_Delete(o);
    if (rc) serve_request_free(r);
    return rc;
}

void serve_request_free(ServeRequest *r) {
    free(r->text);
    for (int i = 0; i < r->n_msgs; i++) {
        free((char *)r->msgs[i].role);
        free((char *)r->msgs[i].content);
    }
    free(r->msgs);
    free(r->ids);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    memset(r, 0, sizeof *r);
}

/* The one place the request's sampling fields meet the decoder's options. */
int serve_sampling_map(const ServeRequest *r, DecodeOpts *opts, ServeError *se) {
    Sampling *s = &opts->sampling;
    if (r->has_temperature) s->temperature = r->temperature;
    if (r->has_top_k) s->top_k = r->top_k < 0 ? 0 : r->top_k; /* -1: off, as in vLLM */
    if (r->has_top_p) s->top_p = r->top_p;
    if (r->has_min_p) s->min_p = r->min_p;
    if (r->has_seed) opts->seed = r->seed;
    RsErr e = {0};
    if (!sampling_normalize(s, &e)) return 0;
    char field[16] = ""; /* the message starts with the field's name, the request's too */
    sscanf(e.msg, "%15[a-z_]", field);
    return serve_error(se, 400, field, "%s", e.msg);
}

/* ---- responses ----------------------------------------------------------------------- */

static cJSON *meta_object(const ServeMeta *m, int chunk) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", m->id);
    cJSON_AddStringToObject(o, "object", m->kind == SERVE_COMPLETION ? "text_completion"
                                         : chunk ? "chat.completion.chunk" : "chat.completion");
    cJSON_AddNumberToObject(o, "created", (double)m->created);
    cJSON_AddStringToObject(o, "model", m->model);
    return o;
}

static void add_usage(cJSON *o, const ServeUsage *u) {
    cJSON *x = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(x, "prompt_tokens", u->prompt_tokens);
    cJSON_AddNumberToObject(x, "completion_tokens", u->completion_tokens);
    cJSON_AddNumberToObject(x, "total_tokens", u->prompt_tokens + u->completion_tokens);
    cJSON *d = cJSON_AddObjectToObject(x, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", u->cached_tokens);
}

/* text may hold NUL bytes a model emitted, so it goes in by length, not as a C string. */
static cJSON *string_n(const char *text, size_t n) {
    char *s = rs_xmalloc(n + 1);
    memcpy(s, text, n);
    s[n] = 0;
    cJSON *v = cJSON_CreateString(s);
    free(s);
    return v;
}

/* One choice: chat's message/delta or a completion's text. */
static cJSON *choice_at(const ServeMeta *m, int index, int chunk, int role, const char *text,
                        size_t n, const char *finish) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", index);
    if (m->kind == SERVE_CHAT) {
        cJSON *msg = cJSON_AddObjectToObject(c, chunk ? "delta" : "message");
        if (role || !chunk) cJSON_AddStringToObject(msg, "role", "assistant");
        if (text || role) cJSON_AddItemToObject(msg, "content", string_n(text ? text : "", n));
    } else {
        cJSON_AddItemToObject(c, "text", string_n(text ? text : "", n));
        cJSON_AddNullToObject(c, "logprobs");
    }
    if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
    else cJSON_AddNullToObject(c, "finish_reason");
    return c;
}

static cJSON *choice(const ServeMeta *m, int chunk, int role, const char *text, size_t n,
                     const char *finish) {
    return choice_at(m, m->index, chunk, role, text, n, finish);
}

static char *print_delete(cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    RS_ASSERT(s);
    return s;
}

char *serve_response_json(const ServeMeta *m, const char *text, size_t n,
                          const char *finish_reason, const ServeUsage *u) {
    return serve_response_logprobs_json(m, text, n, finish_reason, u, NULL);
}

/* ---- log-probabilities ---------------------------------------------------------------- */

static void logprobs_grow(ServeLogprobs *l) {
    if (l->n < l->cap) return;
    l->cap = l->cap ? 2 * l->cap : 64;
    l->ids = realloc(l->ids, sizeof(int) * (size_t)l->cap);
    l->lp = realloc(l->lp, sizeof(double) * (size_t)l->cap);
    l->top_ids = realloc(l->top_ids, sizeof(int) * (size_t)l->cap * (size_t)(l->top_n + 1));
    l->top_lp = realloc(l->top_lp, sizeof(double) * (size_t)l->cap * (size_t)(l->top_n + 1));
    RS_ASSERT(l->ids && l->lp && l->top_ids && l->top_lp);
}

void serve_logprobs_add_none(ServeLogprobs *l, int id) {
    logprobs_grow(l);
    l->ids[l->n] = id;
    l->lp[l->n] = NAN;
    for (int i = 0; i < l->top_n; i++) {
        l->top_ids[(size_t)l->n * l->top_n + i] = -1;
        l->top_lp[(size_t)l->n * l->top_n + i] = -INFINITY;
    }
    l->n++;
}

void serve_logprobs_add(ServeLogprobs *l, const float *row, int vocab, const Sampling *law, int id) {
    Sampling raw = {.temperature = 1, .top_p = 1};
    const Sampling *s = sampling_greedy(law) ? &raw : law;
    double *csum = rs_xmalloc(sizeof(double) * (size_t)row_chunks(vocab));
    RowStats st;
    row_stats(row, vocab, s, -1.0, csum, &st);
    free(csum);
    logprobs_grow(l);
    l->ids[l->n] = id;
    l->lp[l->n] = row_stats_logp(&st, row[id]);
    int idx[SERVE_TOP_LOGPROBS];
    int k = l->top_n < vocab ? l->top_n : vocab;
    if (k) row_topk(row, vocab, k, idx);
    for (int i = 0; i < l->top_n; i++) {
        double lp = i < k ? row_stats_logp(&st, row[idx[i]]) : -INFINITY;
        l->top_ids[(size_t)l->n * l->top_n + i] = isfinite(lp) ? idx[i] : -1;
        l->top_lp[(size_t)l->n * l->top_n + i] = lp;
    }
    l->n++;
}

static char *token_text(const ServeLogprobs *l, int id, const char **b, size_t *n);

void serve_logprobs_slice(ServeLogprobs *dst, const ServeLogprobs *src, int from, int to) {
    int n = to - from, k = src->top_n;
    *dst = (ServeLogprobs){.n = n, .cap = n, .top_n = k, .tok = src->tok, .offset0 = src->offset0};
    for (int i = 0; i < from; i++) {
        const char *b;
        size_t len;
        free(token_text(src, src->ids[i], &b, &len));
        dst->offset0 += len;
    }
    dst->ids = rs_xmalloc(sizeof(int) * (size_t)(n + 1));
    dst->lp = rs_xmalloc(sizeof(double) * (size_t)(n + 1));
    dst->top_ids = rs_xmalloc(sizeof(int) * (size_t)(n * k + 1));
    dst->top_lp = rs_xmalloc(sizeof(double) * (size_t)(n * k + 1));
    memcpy(dst->ids, src->ids + from, sizeof(int) * (size_t)n);
    memcpy(dst->lp, src->lp + from, sizeof(double) * (size_t)n);
    memcpy(dst->top_ids, src->top_ids + (size_t)from * k, sizeof(int) * (size_t)(n * k));
    memcpy(dst->top_lp, src->top_lp + (size_t)from * k, sizeof(double) * (size_t)(n * k));
}

void serve_logprobs_free(ServeLogprobs *l) {
    free(l->ids);
    free(l->lp);
    free(l->top_ids);
    free(l->top_lp);
    memset(l, 0, sizeof *l);
}

/* A token's text: its bytes (b, n) and a UTF-8-clean string of them. */
static char *token_text(const ServeLogprobs *l, int id, const char **b, size_t *n) {
    static __thread char num[16];
    *b = l->tok ? tokenizer_token_view(l->tok, id, n) : NULL;
    if (!*b) {
        *n = (size_t)snprintf(num, sizeof num, " %d", id);
        *b = num;
    }
    size_t m;
    return serve_utf8_clean(*b, *n, &m);
}

/* OpenAI's chat entry: {"token", "logprob", "bytes"}. */
static cJSON *chat_entry(const ServeLogprobs *l, int id, double lp) {
    const char *b;
    size_t n;
    char *t = token_text(l, id, &b, &n);
    cJSON *e = cJSON_CreateObject(), *bytes;
    cJSON_AddStringToObject(e, "token", t);
    cJSON_AddNumberToObject(e, "logprob", lp);
    bytes = cJSON_AddArrayToObject(e, "bytes");
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)b[i]));
    free(t);
    return e;
}

static cJSON *chat_logprobs(const ServeLogprobs *l) {
    cJSON *o = cJSON_CreateObject(), *content = cJSON_AddArrayToObject(o, "content");
    for (int i = 0; i < l->n; i++) {
        cJSON *e = chat_entry(l, l->ids[i], l->lp[i]), *top = cJSON_AddArrayToObject(e, "top_logprobs");
        for (int k = 0; k < l->top_n; k++)
            if (l->top_ids[(size_t)i * l->top_n + k] >= 0)
                cJSON_AddItemToArray(top, chat_entry(l, l->top_ids[(size_t)i * l->top_n + k],
                                                     l->top_lp[(size_t)i * l->top_n + k]));
        cJSON_AddItemToArray(content, e);
    }
    cJSON_AddNullToObject(o, "refusal");
    return o;
}

/* The completions shape: tokens, token_logprobs, top_logprobs (a map per token) and each
 * token's offset in the text. */
static cJSON *completion_logprobs(const ServeLogprobs *l) {
    cJSON *o = cJSON_CreateObject(), *toks = cJSON_AddArrayToObject(o, "tokens");
    cJSON *lps = cJSON_AddArrayToObject(o, "token_logprobs"), *tops = cJSON_AddArrayToObject(o, "top_logprobs");
    cJSON *offs = cJSON_AddArrayToObject(o, "text_offset");
    size_t off = l->offset0;
    for (int i = 0; i < l->n; i++) {
        const char *b;
        size_t n;
        char *t = token_text(l, l->ids[i], &b, &n);
        cJSON_AddItemToArray(toks, cJSON_CreateString(t));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        off += n;
        free(t);
        if (isnan(l->lp[i])) { /* echo's first prompt token: nothing predicts it */
            cJSON_AddItemToArray(lps, cJSON_CreateNull());
            cJSON_AddItemToArray(tops, cJSON_CreateNull());
            continue;
        }
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(l->lp[i]));
        cJSON *m = cJSON_CreateObject();
        for (int k = 0; k < l->top_n; k++) {
            int id = l->top_ids[(size_t)i * l->top_n + k];
            if (id < 0) continue;
            t = token_text(l, id, &b, &n);
            if (!cJSON_GetObjectItemCaseSensitive(m, t))
                cJSON_AddNumberToObject(m, t, l->top_lp[(size_t)i * l->top_n + k]);
            free(t);
        }
        cJSON_AddItemToArray(tops, m);
    }
    return o;
}

char *serve_response_logprobs_json(const ServeMeta *m, const char *text, size_t n,
                                   const char *finish_reason, const ServeUsage *u,
                                   const ServeLogprobs *lp) {
    ServeChoice c = {text, n, finish_reason, lp};
    return serve_response_choices_json(m, &c, 1, u);
}

char *serve_response_choices_json(const ServeMeta *m, const ServeChoice *ch, int n_choices,
                                  const ServeUsage *u) {
    cJSON *o = meta_object(m, 0);
    cJSON *arr = cJSON_AddArrayToObject(o, "choices");
    for (int i = 0; i < n_choices; i++) {
        cJSON *c = choice_at(m, i, 0, 0, ch[i].text, ch[i].n, ch[i].finish_reason);
        if (ch[i].lp) {
            cJSON_DeleteItemFromObjectCaseSensitive(c, "logprobs");
            cJSON_AddItemToObject(c, "logprobs", m->kind == SERVE_CHAT ? chat_logprobs(ch[i].lp)
                                                                        : completion_logprobs(ch[i].lp));
        }
        cJSON_AddItemToArray(arr, c);
    }
    add_usage(o, u);
    return print_delete(o);
}

char *serve_chunk_json(const ServeMeta *m, int role_only, const char *text, size_t n,
                       const char *finish_reason, const ServeUsage *u) {
    cJSON *o = meta_object(m, 1);
    cJSON *ch = cJSON_AddArrayToObject(o, "choices");
    if (u) add_usage(o, u);
    else cJSON_AddItemToArray(ch, choice(m, 1, role_only, text, n, finish_reason));
    return print_delete(o);
}

char *serve_chunk_logprobs_json(const ServeMeta *m, const char *text, size_t n, const ServeLogprobs *lp) {
    cJSON *o = meta_object(m, 1);
    cJSON *ch = cJSON_AddArrayToObject(o, "choices");
    cJSON *c = choice(m, 1, 0, text ? text : "", n, NULL);
    cJSON_DeleteItemFromObjectCaseSensitive(c, "logprobs");
    cJSON_AddItemToObject(c, "logprobs", m->kind == SERVE_CHAT ? chat_logprobs(lp) : completion_logprobs(lp));
    cJSON_AddItemToArray(ch, c);
    return print_delete(o);
}

char *serve_models_json(const char *model, long created, int context) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data"), *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "id", model);
    cJSON_AddStringToObject(e, "object", "model");
    cJSON_AddNumberToObject(e, "created", (double)created);
    cJSON_AddStringToObject(e, "owned_by", "rootspec");
    cJSON_AddNumberToObject(e, "max_model_len", context); /* vLLM's name */
    cJSON_AddItemToArray(data, e);
    return print_delete(o);
}

/* ---- /tokenize and /detokenize --------------------------------------------------------- */

/* body as one JSON object (strict, as serve_request_parse); NULL with se set. */
static cJSON *parse_body_object(const char *body, size_t len, ServeError *se) {
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    while (o && end < body + len && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')) end++;
    if (!o || end != body + len || !cJSON_IsObject(o)) {
        cJSON_Delete(o);
        serve_error(se, 400, NULL, "the request body must be one JSON object");
        return NULL;
    }
    return o;
}

int serve_tokenize_parse(const char *body, size_t len, char **text, int *add_special,
                         int *with_pieces, ServeError *se) {
    *text = NULL;
    *add_special = *with_pieces = 0;
    cJSON *o = parse_body_object(body, len, se);
    if (!o) return 400;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, "content");
    int rc = cJSON_IsString(c) ? 0 : serve_error(se, 400, "content", "'content' must be a string");
    if (!rc) rc = get_bool(o, "add_special", add_special, se);
    if (!rc) rc = get_bool(o, "with_pieces", with_pieces, se);
    if (!rc) *text = strdup(c->valuestring);
    cJSON_Delete(o);
    return rc;
}

int serve_detokenize_parse(const char *body, size_t len, int **ids, int *n, ServeError *se) {
    *ids = NULL;
    *n = 0;
    cJSON *o = parse_body_object(body, len, se);
    if (!o) return 400;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "tokens"), *x;
    int rc = cJSON_IsArray(t) ? 0 : serve_error(se, 400, "tokens", "'tokens' must be an array of token ids");
    if (!rc) *ids = rs_xmalloc(sizeof(int) * (size_t)(cJSON_GetArraySize(t) + 1));
    if (!rc) cJSON_ArrayForEach(x, t) {
        double v = x->valuedouble;
        if (!cJSON_IsNumber(x) || v != floor(v) || v < 0 || v > 0x7fffffff) {
            rc = serve_error(se, 400, "tokens", "'tokens' must hold non-negative integers");
            break;
        }
        (*ids)[(*n)++] = (int)v;
    }
    cJSON_Delete(o);
    if (rc) {
        free(*ids);
        *ids = NULL;
        *n = 0;
    }
    return rc;
}

char *serve_tokens_json(const int *ids, int n, char *const *pieces) {
    cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "tokens");
    for (int i = 0; i < n; i++) {
        if (!pieces) {
            cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
            continue;
        }
        cJSON *p = cJSON_CreateObject();
        cJSON_AddNumberToObject(p, "id", ids[i]);
        add_clean_string(p, "piece", pieces[i]);
        cJSON_AddItemToArray(a, p);
    }
    return print_delete(o);
}

char *serve_content_json(const char *text, size_t n) {
    size_t m;
    char *clean = serve_utf8_clean(text, n, &m);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "content", clean);
    free(clean);
    return print_delete(o);
}
