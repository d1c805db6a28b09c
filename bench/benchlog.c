/* Writers and readers of rounds.jsonl and decodes.csv, and --resume support; see benchlog.h.
 * Lines are written with fprintf (fixed key order, %.17g for doubles so they read back
 * exactly) and read with cJSON / a strict CSV splitter. */
#include "bench/benchlog.h"
#include "bench/outdir.h"
#include "common/textsafe.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *DECODES_HEADER =
    "prompt_id,prompt_pos,decoder,temp,budget,tokens,time_ns,speed,rounds,mean_accepted,"
    "hit_eos,run_index,rep";
#define DECODES_FIELDS 13
/* decodes.csv as written before repetitions: read with rep 0 */
static const char *DECODES_HEADER_V1 =
    "prompt_id,prompt_pos,decoder,temp,budget,tokens,time_ns,speed,rounds,mean_accepted,"
    "hit_eos,run_index";

/* Ids and decoder names are restricted so they need no escaping in JSON or CSV. */
static int name_ok(const char *s, size_t cap) {
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

void benchlog_round_init(BenchRound *r) {
    memset(r, 0, sizeof *r);
    r->x1_in_pool = BENCH_X1_NULL;
    r->tau = NAN;
    r->t_round_start = r->t_grow_sent = r->t_root_start = r->t_root_end = r->t_pool_recv =
        r->t_select_done = r->t_tree_start = r->t_tree_end = r->t_commit = BENCH_NULL_NS;
    r->draft_ns = BENCH_NULL_NS;
}

static void put_ns(char **p, char *end, const char *key, int64_t v) {
    int k = v < 0 ? snprintf(*p, (size_t)(end - *p), ",\"%s\":null", key)
                  : snprintf(*p, (size_t)(end - *p), ",\"%s\":%" PRId64, key, v);
    RS_ASSERT(k > 0 && k < end - *p);
    *p += k;
}

int benchlog_round_write(FILE *f, const BenchRound *r) {
    RS_ASSERT(name_ok(r->decoder, sizeof r->decoder) && name_ok(r->prompt_id, sizeof r->prompt_id));
    char buf[1024], *p = buf, *end = buf + sizeof buf;
    char x1[8], tau[32];
    snprintf(x1, sizeof x1, "%s", r->x1_in_pool < 0 ? "null" : r->x1_in_pool ? "true" : "false");
    if (isfinite(r->tau)) snprintf(tau, sizeof tau, "%.17g", r->tau);
    else snprintf(tau, sizeof tau, "null");
    p += snprintf(p, (size_t)(end - p),
                  "{\"decoder\":\"%s\",\"temp\":%d,\"budget\":%d,\"prompt_id\":\"%s\","
                  "\"rep\":%d,\"round\":%d,\"emitted\":%d,\"dropped\":%d,\"accepted\":%d,"
                  "\"tree_size\":%d,\"x1_in_pool\":%s,\"tau\":%s",
                  r->decoder, r->temp, r->budget, r->prompt_id, r->rep, r->round, r->emitted,
                  r->dropped, r->accepted, r->tree_size, x1, tau);
    put_ns(&p, end, "t_round_start", r->t_round_start);
    put_ns(&p, end, "t_grow_sent", r->t_grow_sent);
    put_ns(&p, end, "t_root_start", r->t_root_start);
    put_ns(&p, end, "t_root_end", r->t_root_end);
    put_ns(&p, end, "t_pool_recv", r->t_pool_recv);
    put_ns(&p, end, "t_select_done", r->t_select_done);
    put_ns(&p, end, "t_tree_start", r->t_tree_start);
    put_ns(&p, end, "t_tree_end", r->t_tree_end);
    put_ns(&p, end, "t_commit", r->t_commit);
    put_ns(&p, end, "draft_ns", r->draft_ns);
    int k = snprintf(p, (size_t)(end - p), ",\"graph_replays\":%" PRId64
                     ",\"eager_launches\":%" PRId64 "}\n", r->graph_replays, r->eager_launches);
    RS_ASSERT(k > 0 && k < end - p);
    p += k;
    if (fwrite(buf, 1, (size_t)(p - buf), f) != (size_t)(p - buf)) return RS_EIO;
    return fflush(f) == 0 ? RS_OK : RS_EIO;
}

int benchlog_decode_write_header(FILE *f) {
    if (fprintf(f, "%s\n", DECODES_HEADER) < 0) return RS_EIO;
    return fflush(f) == 0 ? RS_OK : RS_EIO;
}

int benchlog_decode_write_row(FILE *f, const BenchDecode *d) {
    RS_ASSERT(name_ok(d->decoder, sizeof d->decoder) && name_ok(d->prompt_id, sizeof d->prompt_id));
    if (fprintf(f, "%s,%d,%s,%d,%d,%" PRId64 ",%" PRId64 ",%.6f,%d,%.6f,%d,%d,%d\n",
                d->prompt_id, d->prompt_pos, d->decoder, d->temp, d->budget, d->tokens,
                d->time_ns, d->speed, d->rounds, d->mean_accepted, d->hit_eos, d->run_index,
                d->rep) < 0)
        return RS_EIO;
    return fflush(f) == 0 ? RS_OK : RS_EIO;
}

/* ---- readers ---- */

/* Calls fn on each complete line (ending in '\n'; a trailing '\r' is stripped) of buf.
 * The final line without '\n' is an interrupted write and is skipped. */
typedef int (*LineFn)(void *ctx, const char *path, int lineno, char *line, size_t n, RsErr *e);

static int for_each_line(const char *path, LineFn fn, void *ctx, RsErr *e) {
    char *buf;
    size_t len;
    int rc = rs_read_file(path, &buf, &len, e);
    if (rc) return rc;
    size_t pos = 0;
    int lineno = 0;
    while (pos < len) {
        char *line = buf + pos;
        char *nl = memchr(line, '\n', len - pos);
        if (!nl) break; /* truncated final line */
        lineno++;
        size_t n = (size_t)(nl - line);
        pos += n + 1;
        if (n && line[n - 1] == '\r') n--;
        line[n] = 0;
        rc = fn(ctx, path, lineno, line, n, e);
        if (rc) break;
    }
    free(buf);
    return rc;
}

typedef struct {
    BenchRound *v;
    int n, cap;
} RoundVec;

static int json_int(const cJSON *o, const char *key, int64_t lo, int64_t hi, int nullable,
                    int64_t *out, const char *path, int lineno, RsErr *e) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!it) return rs_err(e, RS_EFORMAT, "%s:%d: missing field \"%s\"", path, lineno, key);
    if (nullable && cJSON_IsNull(it)) {
        *out = BENCH_NULL_NS;
        return RS_OK;
    }
    if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) ||
        it->valuedouble < (double)lo || it->valuedouble > (double)hi)
        return rs_err(e, RS_EFORMAT, "%s:%d: field \"%s\" must be an integer in [%" PRId64
                      ", %" PRId64 "]%s", path, lineno, key, lo, hi, nullable ? " or null" : "");
    *out = (int64_t)it->valuedouble;
    return RS_OK;
}

static int json_name(const cJSON *o, const char *key, char *dst, size_t cap, const char *path,
                     int lineno, RsErr *e) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsString(it) || !name_ok(it->valuestring, cap))
        return rs_err(e, RS_EFORMAT, "%s:%d: field \"%s\" must be a name of 1-%zu characters "
                      "[A-Za-z0-9_./:+-]", path, lineno, key, cap - 1);
    snprintf(dst, cap, "%s", it->valuestring);
    return RS_OK;
}

static int round_line(void *ctx, const char *path, int lineno, char *line, size_t n, RsErr *e) {
    RoundVec *rv = ctx;
    if (n == 0) return rs_err(e, RS_EFORMAT, "%s:%d: empty line", path, lineno);
    cJSON *j = cJSON_ParseWithLength(line, n);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return rs_err(e, RS_EFORMAT, "%s:%d: not a JSON object", path, lineno);
    }
    BenchRound r;
    benchlog_round_init(&r);
    int64_t v;
    int rc;
    const int64_t BIG = INT64_C(1) << 62, IMAX = 2147483647;
#define GETI(key, dst, lo, hi)                                                   \
    if ((rc = json_int(j, key, lo, hi, 0, &v, path, lineno, e))) goto out;        \
    dst = (int)v;
#define GETNS(key, dst)                                                          \
    if ((rc = json_int(j, key, 0, BIG, 1, &v, path, lineno, e))) goto out;        \
    dst = v;
    if ((rc = json_name(j, "decoder", r.decoder, sizeof r.decoder, path, lineno, e))) goto out;
    if ((rc = json_name(j, "prompt_id", r.prompt_id, sizeof r.prompt_id, path, lineno, e)))
        goto out;
    GETI("temp", r.temp, 0, 1);
    GETI("budget", r.budget, 0, 4096);
    if (cJSON_GetObjectItemCaseSensitive(j, "rep")) { /* absent in older logs */
        GETI("rep", r.rep, 0, IMAX);
    }
    GETI("round", r.round, 0, IMAX);
    GETI("emitted", r.emitted, 0, IMAX);
    if (cJSON_GetObjectItemCaseSensitive(j, "dropped")) { /* absent in older logs */
        GETI("dropped", r.dropped, 0, r.emitted);
    }
    GETI("accepted", r.accepted, 0, IMAX);
    GETI("tree_size", r.tree_size, 0, IMAX);
    GETNS("t_round_start", r.t_round_start);
    GETNS("t_grow_sent", r.t_grow_sent);
    GETNS("t_root_start", r.t_root_start);
    GETNS("t_root_end", r.t_root_end);
    GETNS("t_pool_recv", r.t_pool_recv);
    GETNS("t_select_done", r.t_select_done);
    GETNS("t_tree_start", r.t_tree_start);
    GETNS("t_tree_end", r.t_tree_end);
    GETNS("t_commit", r.t_commit);
    GETNS("draft_ns", r.draft_ns);
    if ((rc = json_int(j, "graph_replays", 0, BIG, 0, &r.graph_replays, path, lineno, e))) goto out;
    if ((rc = json_int(j, "eager_launches", 0, BIG, 0, &r.eager_launches, path, lineno, e)))
        goto out;
#undef GETI
#undef GETNS
    const cJSON *x1 = cJSON_GetObjectItemCaseSensitive(j, "x1_in_pool");
    if (cJSON_IsNull(x1)) r.x1_in_pool = BENCH_X1_NULL;
    else if (cJSON_IsBool(x1)) r.x1_in_pool = cJSON_IsTrue(x1) ? 1 : 0;
    else {
        rc = rs_err(e, RS_EFORMAT, "%s:%d: field \"x1_in_pool\" must be true, false or null",
                    path, lineno);
        goto out;
    }
    const cJSON *tau = cJSON_GetObjectItemCaseSensitive(j, "tau");
    if (cJSON_IsNull(tau)) r.tau = NAN;
    else if (cJSON_IsNumber(tau) && tau->valuedouble >= 0) r.tau = tau->valuedouble;
    else {
        rc = rs_err(e, RS_EFORMAT, "%s:%d: field \"tau\" must be a number >= 0 or null", path,
                    lineno);
        goto out;
    }
    if (rv->n == rv->cap) {
        rv->cap = rv->cap ? 2 * rv->cap : 256;
        rv->v = realloc(rv->v, (size_t)rv->cap * sizeof *rv->v);
        RS_ASSERT(rv->v);
    }
    rv->v[rv->n++] = r;
out:
    cJSON_Delete(j);
    return rc;
}

int benchlog_rounds_read(const char *path, BenchRound **out, int *n, RsErr *e) {
    RoundVec rv = {0};
    int rc = for_each_line(path, round_line, &rv, e);
    if (rc) {
        free(rv.v);
        *out = NULL;
        *n = 0;
        return rc;
    }
    *out = rv.v;
    *n = rv.n;
    return RS_OK;
}

typedef struct {
    BenchDecode *v;
    int n, cap;
    int nf; /* fields a row has: DECODES_FIELDS, or one less in a log without rep */
} DecodeVec;

static int csv_int(const char *s, int64_t lo, int64_t hi, int64_t *v) {
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (end == s || *end || errno || x < lo || x > hi) return -1;
    *v = x;
    return 0;
}

/* Splits a row at commas into f (at most DECODES_FIELDS); the number of fields, or -1 when
 * there are more. */
static int csv_split(char *p, char **f) {
    int nf = 0;
    for (;;) {
        if (nf == DECODES_FIELDS) return -1;
        f[nf++] = p;
        char *c = strchr(p, ',');
        if (!c) return nf;
        *c = 0;
        p = c + 1;
    }
}

static const char *const DECODE_NAMES[DECODES_FIELDS] = {
    "prompt_id", "prompt_pos", "decoder", "temp", "budget", "tokens", "time_ns",
    "speed", "rounds", "mean_accepted", "hit_eos", "run_index", "rep"};

/* The numeric fields of a row into d; field i of nf. */
static int decode_numbers(char **f, int nf, BenchDecode *d, const char *path, int lineno,
                          RsErr *e) {
    const int64_t IMAX = 2147483647, BIG = INT64_C(1) << 62;
    const int64_t lim[DECODES_FIELDS][2] = {{0, 0}, {0, IMAX}, {0, 0}, {0, 1}, {0, 4096},
                                            {0, BIG}, {1, BIG}, {0, 0}, {0, IMAX}, {0, 0},
                                            {0, 1}, {-1, IMAX}, {0, IMAX}};
    int64_t v[DECODES_FIELDS] = {0};
    char esc[128];
#define ESC(s) rs_escape(esc, sizeof esc, (s), strlen(s), 1)
    for (int i = 0; i < nf; i++) {
        if (i == 0 || i == 2) continue;
        if (i == 7 || i == 9) {
            char *end;
            double x = strtod(f[i], &end);
            if (end == f[i] || *end || !isfinite(x) || x < 0)
                return rs_err(e, RS_EFORMAT, "%s:%d: field %s = \"%s\" is not a number >= 0",
                              path, lineno, DECODE_NAMES[i], ESC(f[i]));
            if (i == 7) d->speed = x;
            else d->mean_accepted = x;
            continue;
        }
        if (csv_int(f[i], lim[i][0], lim[i][1], &v[i]))
            return rs_err(e, RS_EFORMAT, "%s:%d: field %s = \"%s\" is not an integer in "
                          "[%" PRId64 ", %" PRId64 "]", path, lineno, DECODE_NAMES[i], ESC(f[i]),
                          lim[i][0], lim[i][1]);
    }
#undef ESC
    d->prompt_pos = (int)v[1];
    d->temp = (int)v[3];
    d->budget = (int)v[4];
    d->tokens = v[5];
    d->time_ns = v[6];
    d->rounds = (int)v[8];
    d->hit_eos = (int)v[10];
    d->run_index = (int)v[11];
    d->rep = (int)v[12];
    return RS_OK;
}

static int decode_line(void *ctx, const char *path, int lineno, char *line, size_t n,
                       RsErr *e) {
    DecodeVec *dv = ctx;
    char esc[256]; /* the file's bytes, escaped for the terminal */
    if (lineno == 1) {
        dv->nf = !strcmp(line, DECODES_HEADER) ? DECODES_FIELDS
                 : !strcmp(line, DECODES_HEADER_V1) ? DECODES_FIELDS - 1 : 0;
        if (!dv->nf)
            return rs_err(e, RS_EFORMAT, "%s:1: header is \"%s\", expected \"%s\"", path,
                          rs_escape(esc, sizeof esc, line, n, 1), DECODES_HEADER);
        return RS_OK;
    }
    char *f[DECODES_FIELDS];
    int nf = csv_split(line, f);
    if (nf != dv->nf)
        return nf < 0 ? rs_err(e, RS_EFORMAT, "%s:%d: more than %d fields", path, lineno, dv->nf)
                      : rs_err(e, RS_EFORMAT, "%s:%d: %d fields, expected %d", path, lineno,
                               nf, dv->nf);
    BenchDecode d;
    memset(&d, 0, sizeof d);
    if (!name_ok(f[0], sizeof d.prompt_id))
        return rs_err(e, RS_EFORMAT, "%s:%d: bad prompt_id \"%s\"", path, lineno,
                      rs_escape(esc, sizeof esc, f[0], strlen(f[0]), 1));
    snprintf(d.prompt_id, sizeof d.prompt_id, "%s", f[0]);
    if (!name_ok(f[2], sizeof d.decoder))
        return rs_err(e, RS_EFORMAT, "%s:%d: bad decoder \"%s\"", path, lineno,
                      rs_escape(esc, sizeof esc, f[2], strlen(f[2]), 1));
    snprintf(d.decoder, sizeof d.decoder, "%s", f[2]);
    int rc = decode_numbers(f, nf, &d, path, lineno, e);
    if (rc) return rc;
    if (dv->n == dv->cap) {
        dv->cap = dv->cap ? 2 * dv->cap : 256;
        dv->v = realloc(dv->v, (size_t)dv->cap * sizeof *dv->v);
        RS_ASSERT(dv->v);
    }
    dv->v[dv->n++] = d;
    return RS_OK;
}

int benchlog_decodes_read(const char *path, BenchDecode **out, int *n, RsErr *e) {
    DecodeVec dv = {0};
    int rc = for_each_line(path, decode_line, &dv, e);
    if (rc) {
        free(dv.v);
        *out = NULL;
        *n = 0;
        return rc;
    }
    *out = dv.v;
    *n = dv.n;
    return RS_OK;
}

/* ---- resume ---- */

typedef struct {
    char prompt_id[PROMPT_ID_MAX];
    BenchCombo c;
    int rep;
} DoneKey;

struct BenchDoneSet {
    int n;
    DoneKey *k; // (n) sorted by done_cmp
};

static int done_cmp(const void *a, const void *b) {
    const DoneKey *x = a, *y = b;
    int s = strcmp(x->prompt_id, y->prompt_id);
    if (s) return s;
    s = strcmp(x->c.decoder, y->c.decoder);
    if (s) return s;
    if (x->c.temp != y->c.temp) return x->c.temp - y->c.temp;
    if (x->c.budget != y->c.budget) return x->c.budget - y->c.budget;
    return x->rep - y->rep;
}

static void done_from_decodes(BenchDoneSet *s, const BenchDecode *d, int n) {
    s->k = rs_xcalloc((size_t)n, sizeof *s->k);
    for (int i = 0; i < n; i++) {
        snprintf(s->k[i].prompt_id, PROMPT_ID_MAX, "%s", d[i].prompt_id);
        snprintf(s->k[i].c.decoder, BENCH_DEC_MAX, "%s", d[i].decoder);
        s->k[i].c.temp = d[i].temp;
        s->k[i].c.budget = d[i].budget;
        s->k[i].rep = d[i].rep;
    }
    qsort(s->k, (size_t)n, sizeof *s->k, done_cmp);
    int m = 0; /* dedupe: a decode logged twice counts once */
    for (int i = 0; i < n; i++)
        if (m == 0 || done_cmp(&s->k[m - 1], &s->k[i]) != 0) s->k[m++] = s->k[i];
    s->n = m;
}

int bench_resume_load(const char *dir, BenchDoneSet **out, RsErr *e) {
    char path[4096];
    snprintf(path, sizeof path, "%s/decodes.csv", dir);
    BenchDoneSet *s = rs_xcalloc(1, sizeof *s);
    *out = s;
    struct stat st;
    if (stat(path, &st) != 0) return RS_OK; /* nothing done yet */
    BenchDecode *d;
    int n;
    int rc = benchlog_decodes_read(path, &d, &n, e);
    if (rc) {
        bench_done_destroy(out);
        return rc;
    }
    done_from_decodes(s, d, n);
    free(d);
    return RS_OK;
}

int bench_done_has(const BenchDoneSet *s, const char *prompt_id, const BenchCombo *c,
                   int rep) {
    DoneKey k;
    memset(&k, 0, sizeof k);
    snprintf(k.prompt_id, PROMPT_ID_MAX, "%s", prompt_id);
    k.c = *c;
    k.rep = rep;
    return s->n && bsearch(&k, s->k, (size_t)s->n, sizeof k, done_cmp) != NULL;
}

int bench_done_count(const BenchDoneSet *s) { return s->n; }

void bench_done_destroy(BenchDoneSet **s) {
    if (!s || !*s) return;
    free((*s)->k);
    free(*s);
    *s = NULL;
}

/* Cuts the bytes after the last '\n' (an interrupted line), through a descriptor that
 * followed no link (bench_run_files_check ran first). */
static int cut_partial_line(const char *path, RsErr *e) {
    char *buf;
    size_t len;
    int rc = rs_read_file(path, &buf, &len, e);
    if (rc) return rc;
    size_t keep = len;
    while (keep > 0 && buf[keep - 1] != '\n') keep--;
    free(buf);
    if (keep == len) return RS_OK;
    FILE *f = NULL;
    if ((rc = bench_file_open(path, BENCH_FILE_CUT, &f, e))) return rc;
    if (ftruncate(fileno(f), (off_t)keep) != 0)
        rc = rs_err(e, RS_EIO, "cannot truncate '%s': %s", path, strerror(errno));
    fclose(f);
    return rc;
}

/* Rewrites rounds.jsonl keeping only rounds of decodes in the done set. */
static int filter_rounds(const char *path, const BenchDoneSet *done, RsErr *e) {
    BenchRound *r;
    int n;
    int rc = benchlog_rounds_read(path, &r, &n, e);
    if (rc) return rc;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    remove(tmp); /* a crash's leftover: a regular file (checked), or nothing */
    FILE *f = NULL;
    if ((rc = bench_file_open(tmp, BENCH_FILE_NEW, &f, e))) {
        free(r);
        return rc;
    }
    for (int i = 0; i < n && rc == RS_OK; i++) {
        BenchCombo c;
        memset(&c, 0, sizeof c);
        snprintf(c.decoder, BENCH_DEC_MAX, "%s", r[i].decoder);
        c.temp = r[i].temp;
        c.budget = r[i].budget;
        if (bench_done_has(done, r[i].prompt_id, &c, r[i].rep) && benchlog_round_write(f, &r[i]))
            rc = rs_err(e, RS_EIO, "cannot write '%s': %s", tmp, strerror(errno));
    }
    free(r);
    if (fclose(f) != 0 && rc == RS_OK)
        rc = rs_err(e, RS_EIO, "cannot close '%s': %s", tmp, strerror(errno));
    if (rc == RS_OK && rename(tmp, path) != 0)
        rc = rs_err(e, RS_EIO, "cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
    if (rc) remove(tmp);
    return rc;
}

/* --resume: every file checked and both logs read whole before the first write, so a run
 * directory that is not what it claims is refused as it was found. Then the interrupted
 * lines are cut and the rounds of unfinished decodes dropped. */
static int resume_prepare(const char *dir, const char *rp, const char *dp, RsErr *e) {
    int rc = bench_run_files_check(dir, e);
    if (rc) return rc;
    BenchDoneSet *done = NULL;
    BenchRound *r = NULL;
    int nr = 0;
    struct stat st;
    int have_r = stat(rp, &st) == 0, have_d = stat(dp, &st) == 0;
    if ((rc = bench_resume_load(dir, &done, e))) return rc;
    if (have_r && (rc = benchlog_rounds_read(rp, &r, &nr, e))) goto out;
    free(r);
    if (have_d && (rc = cut_partial_line(dp, e))) goto out;
    if (have_r && (rc = cut_partial_line(rp, e))) goto out;
    if (have_r) rc = filter_rounds(rp, done, e);
out:
    bench_done_destroy(&done);
    return rc;
}

int benchlog_open(const char *dir, int resume, FILE **rounds, FILE **decodes, RsErr *e) {
    *rounds = *decodes = NULL;
    char rp[4096], dp[4096];
    snprintf(rp, sizeof rp, "%s/rounds.jsonl", dir);
    snprintf(dp, sizeof dp, "%s/decodes.csv", dir);
    int rc = resume ? resume_prepare(dir, rp, dp, e) : RS_OK;
    if (rc) return rc;
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return rs_err(e, RS_EIO, "cannot create directory '%s': %s", dir, strerror(errno));
    BenchFileMode mode = resume ? BENCH_FILE_APPEND : BENCH_FILE_TRUNC;
    if ((rc = bench_file_open(rp, mode, rounds, e))) return rc;
    if ((rc = bench_file_open(dp, mode, decodes, e))) {
        fclose(*rounds);
        *rounds = NULL;
        return rc;
    }
    /* "a" mode positions at the end only on the first write; seek to learn the size. */
    if (fseek(*decodes, 0, SEEK_END) != 0 ||
        (ftell(*decodes) == 0 && benchlog_decode_write_header(*decodes))) {
        fclose(*rounds);
        fclose(*decodes);
        *rounds = *decodes = NULL;
        return rs_err(e, RS_EIO, "cannot write '%s': %s", dp, strerror(errno));
    }
    return RS_OK;
}
