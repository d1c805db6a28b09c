/* The per-round log's writer and reader; see roundlog.h and docs/DESIGN.md §6. Lines are
 * written with fprintf in a fixed key order (%.17g for doubles, so they read back exactly)
 * and read with cJSON. Timestamps are the target process's monotonic ns; phases a decoder
 * does not have are null, so a reader never mistakes 0 for a time. */
#include "roundlog.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <string.h>

int roundlog_name_ok(const char *s, size_t cap) {
    size_t n = strnlen(s, cap);
    if (n == 0 || n >= cap) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == '/' || c == ':' || c == '+' || c == '-'))
            return 0;
    }
    return 1;
}

/* ---- writer ---- */

void roundlog_begin(RoundLog *lg, const BackendStats *st) {
    lg->graph0 = st->graph_replays;
    lg->eager0 = st->eager_launches;
    lg->d2h0 = st->d2h_full_rows;
}

/* An unsigned count or time; 0 is written as null when zero_null. */
static void put_u(FILE *f, const char *k, uint64_t v, int zero_null) {
    if (!v && zero_null) fprintf(f, ",\"%s\":null", k);
    else fprintf(f, ",\"%s\":%" PRIu64, k, v);
}

static void put_d(FILE *f, const char *k, double v) {
    if (!isfinite(v)) fprintf(f, ",\"%s\":null", k);
    else fprintf(f, ",\"%s\":%.17g", k, v);
}

/* The tree size the planner chose (0: an AR step; null without a planner, --budget B), the pool depth and width
 * asked (0: the drafter was not asked), and the round's predicted and realised tokens per second
 * (predicted: null without a planner). */
static void put_plan(FILE *f, const RoundLog *lg, const RoundInfo *r) {
    if (lg->budget != ROUNDLOG_BUDGET_AUTO) fprintf(f, ",\"budget_chosen\":null");
    else fprintf(f, ",\"budget_chosen\":%d", r->plan_k < 0 ? 0 : r->plan_k);
    fprintf(f, ",\"depth_asked\":%d,\"width_asked\":%d", r->plan_depth, r->plan_width);
    put_d(f, "pred_tok_s", r->plan_ns > 0 ? r->plan_tokens / r->plan_ns * 1e9 : NAN);
    uint64_t ns = r->t_commit - r->t_round_start;
    put_d(f, "real_tok_s", ns ? (double)r->emitted / (double)ns * 1e9 : NAN);
}

static void put_head(FILE *f, const RoundLog *lg, const RoundInfo *r) {
    fprintf(f, "{\"decoder\":\"%s\",\"temp\":%d", lg->decoder, lg->temp);
    if (lg->budget == ROUNDLOG_BUDGET_AUTO) fprintf(f, ",\"budget\":\"auto\"");
    else fprintf(f, ",\"budget\":%d", lg->budget);
    fprintf(f, ",\"prompt_id\":\"%s\",\"rep\":%d,\"round\":%d,\"emitted\":%d,\"dropped\":%d,"
               "\"accepted\":%d,\"tree_size\":%d",
            lg->prompt_id, lg->rep, r->round, r->emitted, r->dropped, r->accepted, r->tree_size);
    put_plan(f, lg, r);
    if (!lg->sampling) fprintf(f, ",\"sampling\":null");
    else
        fprintf(f, ",\"sampling\":{\"temperature\":%.17g,\"top_k\":%d,\"top_p\":%.17g,"
                   "\"min_p\":%.17g}",
                lg->sampling->temperature, lg->sampling->top_k, lg->sampling->top_p,
                lg->sampling->min_p);
    if (r->x1_in_pool < 0) fprintf(f, ",\"x1_in_pool\":null");
    else fprintf(f, ",\"x1_in_pool\":%s", r->x1_in_pool ? "true" : "false");
    put_d(f, "tau", r->tau);
    put_d(f, "root_margin", r->root_margin);
    fprintf(f, ",\"tree_pass_skipped\":%s,\"fallback_ar\":%s",
            r->tree_pass_skipped ? "true" : "false", r->fallback_ar ? "true" : "false");
}

static void put_times(FILE *f, const RoundInfo *r) {
    put_u(f, "t_round_start", r->t_round_start, 1);
    put_u(f, "t_grow_sent", r->t_grow_sent, 1);
    put_u(f, "t_root_start", r->t_root_start, 1);
    put_u(f, "t_root_end", r->t_root_end, 1);
    put_u(f, "t_pool_recv", r->t_pool_recv, 1);
    put_u(f, "t_select_done", r->t_select_done, 1);
    put_u(f, "t_tree_start", r->t_tree_start, 1);
    put_u(f, "t_tree_end", r->t_tree_end, 1);
    put_u(f, "t_commit", r->t_commit, 1);
    put_u(f, "measure_ns", r->measure_ns, 0);
    put_u(f, "draft_ns", r->draft_ns, 1);
    /* null, not 0, when the drafter does not report them (a remote drafter, eagle3) */
    if (r->draft_ns) put_u(f, "draft_commit_ns", r->draft_commit_ns, 0);
    else fprintf(f, ",\"draft_commit_ns\":null");
    if (r->draft_rows) put_u(f, "draft_host_ns", r->draft_host_ns, 0);
    else fprintf(f, ",\"draft_host_ns\":null");
    fprintf(f, ",\"draft_rows\":%d", r->draft_rows);
}

/* RoundInfo's backend counters are cumulative; the log has this round's share. */
static void put_counters(FILE *f, RoundLog *lg, const RoundInfo *r) {
    fprintf(f, ",\"graph_replays\":%" PRIu64 ",\"eager_launches\":%" PRIu64
               ",\"d2h_full_rows\":%" PRIu64,
            r->graph_replays - lg->graph0, r->eager_launches - lg->eager0,
            r->d2h_full_rows - lg->d2h0);
    lg->graph0 = r->graph_replays;
    lg->eager0 = r->eager_launches;
    lg->d2h0 = r->d2h_full_rows;
}

static void put_rules(FILE *f, const RoundInfo *r) {
    if (!r->have_tau_rule) return;
    fprintf(f, ",\"tau_rule\":{");
    int first = 1;
    for (int k = RULE_DRAFT; k <= RULE_ORACLE; k++) {
        if (isnan(r->tau_rule[k])) continue;
        fprintf(f, "%s\"%s\":%.17g", first ? "" : ",", rule_name((Rule)k), r->tau_rule[k]);
        first = 0;
    }
    fprintf(f, "},\"tree_size_rule\":{");
    for (int k = RULE_DRAFT; k <= RULE_ORACLE; k++)
        fprintf(f, "%s\"%s\":%d", k == RULE_DRAFT ? "" : ",", rule_name((Rule)k),
                r->tree_size_rule[k]);
    fprintf(f, "}");
}

int roundlog_write(FILE *f, RoundLog *lg, const RoundInfo *r) {
    RS_ASSERT(roundlog_name_ok(lg->decoder, ROUNDLOG_DECODER_MAX) &&
              roundlog_name_ok(lg->prompt_id, PROMPT_ID_MAX));
    put_head(f, lg, r);
    put_times(f, r);
    put_counters(f, lg, r);
    put_rules(f, r);
    fprintf(f, ",\"tokens\":[");
    for (int i = 0; i < r->emitted; i++) fprintf(f, "%s%d", i ? "," : "", r->tokens[i]);
    fprintf(f, "]}\n");
    if (fflush(f) != 0 || ferror(f)) {
        if (!errno) errno = EIO;
        return RS_EIO;
    }
    return RS_OK;
}

/* ---- reader ---- */

typedef struct {
    const cJSON *j;
    const char *path;
    int lineno;
    RsErr *e;
} Line;

enum { OPTIONAL = 1, NULLABLE = 2 };

/* An integer field in [lo, hi] into *out; null (NULLABLE) or absent (OPTIONAL) leave
 * ROUNDLOG_NULL. */
static int get_i64(const Line *l, const char *key, int64_t lo, int64_t hi, int flags,
                   int64_t *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(l->j, key);
    *out = ROUNDLOG_NULL;
    if (!it && (flags & OPTIONAL)) return RS_OK;
    if (!it) return rs_err(l->e, RS_EFORMAT, "%s:%d: missing field \"%s\"", l->path, l->lineno, key);
    if ((flags & NULLABLE) && cJSON_IsNull(it)) return RS_OK;
    if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) ||
        it->valuedouble < (double)lo || it->valuedouble > (double)hi)
        return rs_err(l->e, RS_EFORMAT, "%s:%d: field \"%s\" must be an integer in [%" PRId64
                      ", %" PRId64 "]%s", l->path, l->lineno, key, lo, hi,
                      (flags & NULLABLE) ? " or null" : "");
    *out = (int64_t)it->valuedouble;
    return RS_OK;
}

static int get_int(const Line *l, const char *key, int64_t lo, int64_t hi, int flags, int *out) {
    int64_t v;
    int rc = get_i64(l, key, lo, hi, flags, &v);
    *out = (int)v;
    return rc;
}

/* A number field (>= lo) into *out; null or absent (OPTIONAL) leave NAN. */
static int get_num(const Line *l, const char *key, double lo, int flags, double *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(l->j, key);
    *out = NAN;
    if ((!it && (flags & OPTIONAL)) || cJSON_IsNull(it)) return RS_OK;
    if (!cJSON_IsNumber(it) || !(it->valuedouble >= lo))
        return rs_err(l->e, RS_EFORMAT, "%s:%d: field \"%s\" must be a number >= %g or null",
                      l->path, l->lineno, key, lo);
    *out = it->valuedouble;
    return RS_OK;
}

/* A boolean field: 1 or 0; null or absent (OPTIONAL) give ROUNDLOG_NULL. */
static int get_bool(const Line *l, const char *key, int flags, int *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(l->j, key);
    *out = ROUNDLOG_NULL;
    if (!it && (flags & OPTIONAL)) return RS_OK;
    if ((flags & NULLABLE) && cJSON_IsNull(it)) return RS_OK;
    if (!cJSON_IsBool(it))
        return rs_err(l->e, RS_EFORMAT, "%s:%d: field \"%s\" must be true or false%s", l->path,
                      l->lineno, key, (flags & NULLABLE) ? " or null" : "");
    *out = cJSON_IsTrue(it) ? 1 : 0;
    return RS_OK;
}

static int get_name(const Line *l, const char *key, char *dst, size_t cap) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(l->j, key);
    if (!cJSON_IsString(it) || !roundlog_name_ok(it->valuestring, cap))
        return rs_err(l->e, RS_EFORMAT, "%s:%d: field \"%s\" must be a name of 1-%zu "
                      "characters [A-Za-z0-9_./:+-]", l->path, l->lineno, key, cap - 1);
    snprintf(dst, cap, "%s", it->valuestring);
    return RS_OK;
}

/* prompt_id: a name, or a number in the target's older logs (*numeric set). */
static int get_prompt_id(const Line *l, RoundRecord *r, int *numeric) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(l->j, "prompt_id");
    *numeric = cJSON_IsNumber(it);
    if (!*numeric) return get_name(l, "prompt_id", r->prompt_id, sizeof r->prompt_id);
    int64_t v;
    int rc = get_i64(l, "prompt_id", 0, INT64_C(1) << 53, 0, &v);
    if (!rc) snprintf(r->prompt_id, sizeof r->prompt_id, "%" PRId64, v);
    return rc;
}

/* budget: 0..TREE_MAX or "auto"; the bench's older logs wrote auto as 1000. */
static int get_budget(const Line *l, RoundRecord *r) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(l->j, "budget");
    if (cJSON_IsString(it) && !strcmp(it->valuestring, "auto")) {
        r->budget = ROUNDLOG_BUDGET_AUTO;
        return RS_OK;
    }
    int rc = get_int(l, "budget", 0, ROUNDLOG_BUDGET_AUTO, 0, &r->budget);
    if (!rc && r->budget > TREE_MAX && r->budget != ROUNDLOG_BUDGET_AUTO)
        rc = rs_err(l->e, RS_EFORMAT, "%s:%d: field \"budget\" must be 0-%d or \"auto\"",
                    l->path, l->lineno, TREE_MAX);
    return rc;
}

static int get_head(const Line *l, RoundRecord *r, int *numeric_id) {
    const int64_t IMAX = 2147483647;
    int rc;
    if ((rc = get_name(l, "decoder", r->decoder, sizeof r->decoder)) ||
        (rc = get_prompt_id(l, r, numeric_id)) || (rc = get_int(l, "temp", 0, 1, 0, &r->temp)) ||
        (rc = get_budget(l, r)) || (rc = get_int(l, "rep", 0, IMAX, OPTIONAL, &r->rep)) ||
        (rc = get_int(l, "round", 0, IMAX, 0, &r->round)) ||
        (rc = get_int(l, "emitted", 0, ROUND_MAX_EMIT, 0, &r->emitted)) ||
        (rc = get_int(l, "dropped", 0, r->emitted, OPTIONAL, &r->dropped)) ||
        (rc = get_int(l, "accepted", 0, ROUND_MAX_EMIT, 0, &r->accepted)) ||
        (rc = get_int(l, "tree_size", 0, IMAX, 0, &r->tree_size)) ||
        (rc = get_bool(l, "x1_in_pool", NULLABLE, &r->x1_in_pool)) ||
        (rc = get_num(l, "tau", 0, 0, &r->tau)) ||
        (rc = get_num(l, "root_margin", 0, OPTIONAL, &r->root_margin)) ||
        (rc = get_bool(l, "tree_pass_skipped", OPTIONAL, &r->tree_pass_skipped)) ||
        (rc = get_bool(l, "fallback_ar", OPTIONAL, &r->fallback_ar)))
        return rc;
    if (r->rep < 0) r->rep = 0;         /* logs without repetitions */
    if (r->dropped < 0) r->dropped = 0; /* logs from before dropped tokens were counted */
    return RS_OK;
}

static int get_times(const Line *l, RoundRecord *r) {
    const int64_t BIG = INT64_C(1) << 62;
    struct {
        const char *key;
        int64_t *dst;
        int flags;
    } f[] = {{"t_round_start", &r->t_round_start, NULLABLE},
             {"t_grow_sent", &r->t_grow_sent, NULLABLE},
             {"t_root_start", &r->t_root_start, NULLABLE},
             {"t_root_end", &r->t_root_end, NULLABLE},
             {"t_pool_recv", &r->t_pool_recv, NULLABLE},
             {"t_select_done", &r->t_select_done, NULLABLE},
             {"t_tree_start", &r->t_tree_start, NULLABLE},
             {"t_tree_end", &r->t_tree_end, NULLABLE},
             {"t_commit", &r->t_commit, NULLABLE},
             {"measure_ns", &r->measure_ns, OPTIONAL},
             {"draft_ns", &r->draft_ns, NULLABLE},
             {"draft_commit_ns", &r->draft_commit_ns, NULLABLE | OPTIONAL},
             {"draft_host_ns", &r->draft_host_ns, NULLABLE | OPTIONAL},
             {"graph_replays", &r->graph_replays, 0},
             {"eager_launches", &r->eager_launches, 0},
             {"d2h_full_rows", &r->d2h_full_rows, OPTIONAL}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        int rc = get_i64(l, f[i].key, 0, BIG, f[i].flags, f[i].dst);
        if (rc) return rc;
    }
    int rc = get_int(l, "draft_rows", 0, 2147483647, OPTIONAL, &r->draft_rows);
    if (r->draft_rows < 0) r->draft_rows = 0;
    return rc;
}

static int get_plan(const Line *l, RoundRecord *r) {
    int rc;
    if ((rc = get_int(l, "budget_chosen", 0, TREE_MAX, OPTIONAL | NULLABLE, &r->budget_chosen)) ||
        (rc = get_int(l, "depth_asked", 0, 1 << 20, OPTIONAL, &r->depth_asked)) ||
        (rc = get_int(l, "width_asked", 0, 1 << 20, OPTIONAL, &r->width_asked)) ||
        (rc = get_num(l, "pred_tok_s", 0, OPTIONAL, &r->pred_tok_s)) ||
        (rc = get_num(l, "real_tok_s", 0, OPTIONAL, &r->real_tok_s)))
        return rc;
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(l->j, "sampling");
    if (!s || cJSON_IsNull(s)) return RS_OK;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "temperature"),
                *k = cJSON_GetObjectItemCaseSensitive(s, "top_k"),
                *p = cJSON_GetObjectItemCaseSensitive(s, "top_p"),
                *m = cJSON_GetObjectItemCaseSensitive(s, "min_p");
    if (!cJSON_IsNumber(t) || !cJSON_IsNumber(k) || !cJSON_IsNumber(p) || !cJSON_IsNumber(m))
        return rs_err(l->e, RS_EFORMAT, "%s:%d: field \"sampling\" must be an object of "
                      "numbers temperature, top_k, top_p, min_p", l->path, l->lineno);
    r->has_sampling = 1;
    r->sampling = (Sampling){t->valuedouble, (int)k->valuedouble, p->valuedouble, m->valuedouble};
    return RS_OK;
}

static int get_rules(const Line *l, RoundRecord *r) {
    for (int k = 0; k < RULE_COUNT; k++) r->tau_rule[k] = NAN, r->tree_size_rule[k] = 0;
    const cJSON *tau = cJSON_GetObjectItemCaseSensitive(l->j, "tau_rule"),
                *size = cJSON_GetObjectItemCaseSensitive(l->j, "tree_size_rule");
    if (!tau && !size) return RS_OK;
    if (!cJSON_IsObject(tau) || !cJSON_IsObject(size))
        return rs_err(l->e, RS_EFORMAT, "%s:%d: \"tau_rule\" and \"tree_size_rule\" must be "
                      "objects, both or neither", l->path, l->lineno);
    r->have_tau_rule = 1;
    for (int k = RULE_DRAFT; k <= RULE_ORACLE; k++) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(tau, rule_name((Rule)k)),
                    *s = cJSON_GetObjectItemCaseSensitive(size, rule_name((Rule)k));
        if (cJSON_IsNumber(t)) r->tau_rule[k] = t->valuedouble;
        if (cJSON_IsNumber(s)) r->tree_size_rule[k] = (int)s->valuedouble;
    }
    return RS_OK;
}

static int get_tokens(const Line *l, RoundRecord *r) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(l->j, "tokens");
    r->n_tokens = ROUNDLOG_NULL;
    if (!a) return RS_OK; /* the bench's older logs */
    int n = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : -1;
    if (n != r->emitted)
        return rs_err(l->e, RS_EFORMAT, "%s:%d: field \"tokens\" must be an array of the %d "
                      "emitted token ids", l->path, l->lineno, r->emitted);
    int i = 0;
    for (const cJSON *t = a->child; t; t = t->next, i++) {
        if (!cJSON_IsNumber(t) || t->valuedouble < 0 || t->valuedouble > 2147483647.0 ||
            t->valuedouble != floor(t->valuedouble))
            return rs_err(l->e, RS_EFORMAT, "%s:%d: tokens[%d] is not a token id", l->path,
                          l->lineno, i);
        r->tokens[i] = (int)t->valuedouble;
    }
    r->n_tokens = n;
    return RS_OK;
}

/* One line into r; *numeric_id is set for the target's older shape. */
static int parse_line(const char *path, int lineno, const char *line, size_t n, RoundRecord *r,
                      int *numeric_id, RsErr *e) {
    if (n == 0) return rs_err(e, RS_EFORMAT, "%s:%d: empty line", path, lineno);
    cJSON *j = cJSON_ParseWithLength(line, n);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return rs_err(e, RS_EFORMAT, "%s:%d: not a JSON object", path, lineno);
    }
    memset(r, 0, sizeof *r);
    Line l = {j, path, lineno, e};
    int rc = get_head(&l, r, numeric_id);
    if (!rc) rc = get_times(&l, r);
    if (!rc) rc = get_plan(&l, r);
    if (!rc) rc = get_rules(&l, r);
    if (!rc) rc = get_tokens(&l, r);
    cJSON_Delete(j);
    return rc;
}

int roundlog_scan(const char *path, RoundLineFn fn, void *ctx, RsErr *e) {
    char *buf;
    size_t len;
    int rc = rs_read_file(path, &buf, &len, e);
    if (rc) return rc;
    RoundRecord r;
    int64_t last[3] = {0, 0, 0}; /* the target's older logs: cumulative counters */
    size_t pos = 0;
    for (int lineno = 1; pos < len && rc == RS_OK; lineno++) {
        char *line = buf + pos, *nl = memchr(line, '\n', len - pos);
        if (!nl) break; /* an interrupted final write */
        size_t n = (size_t)(nl - line);
        pos += n + 1;
        if (n && line[n - 1] == '\r') n--;
        line[n] = 0;
        int cumulative = 0;
        rc = parse_line(path, lineno, line, n, &r, &cumulative, e);
        if (rc) break;
        if (cumulative) {
            int64_t now[3] = {r.graph_replays, r.eager_launches, r.d2h_full_rows < 0 ? 0 : r.d2h_full_rows};
            r.graph_replays -= last[0];
            r.eager_launches -= last[1];
            if (r.d2h_full_rows >= 0) r.d2h_full_rows -= last[2];
            memcpy(last, now, sizeof last);
        }
        rc = fn(ctx, &r, line, n, e);
    }
    free(buf);
    return rc;
}

typedef struct {
    RoundRecord *v;
    int n, cap;
} RecordVec;

static int collect(void *ctx, const RoundRecord *r, const char *line, size_t n, RsErr *e) {
    RecordVec *rv = ctx;
    if (rv->n == rv->cap) {
        rv->cap = rv->cap ? 2 * rv->cap : 256;
        rv->v = realloc(rv->v, (size_t)rv->cap * sizeof *rv->v);
        RS_ASSERT(rv->v);
    }
    rv->v[rv->n++] = *r;
    return RS_OK;
}

int roundlog_read(const char *path, RoundRecord **out, int *n, RsErr *e) {
    RecordVec rv = {0};
    int rc = roundlog_scan(path, collect, &rv, e);
    if (rc) {
        free(rv.v);
        rv.v = NULL;
        rv.n = 0;
    }
    *out = rv.v;
    *n = rv.n;
    return rc;
}
