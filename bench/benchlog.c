/* The writer and reader of decodes.csv, and --resume support over it and rounds.jsonl (whose
 * lines target_proc/roundlog.c writes and reads); see benchlog.h. Rows are written with
 * fprintf and read with a strict CSV splitter. */
#include "bench/benchlog.h"
#include "bench/outdir.h"
#include "common/textsafe.h"
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

/* The round log's names (decoder, prompt id) and decodes.csv's are the same. */
_Static_assert(BENCH_DEC_MAX == ROUNDLOG_DECODER_MAX, "decoder names fit both logs");
_Static_assert(BENCH_BUDGET_AUTO == ROUNDLOG_BUDGET_AUTO, "auto is one budget in both logs");

int benchlog_decode_write_header(FILE *f) {
    if (fprintf(f, "%s\n", DECODES_HEADER) < 0) return RS_EIO;
    return fflush(f) == 0 ? RS_OK : RS_EIO;
}

int benchlog_decode_write_row(FILE *f, const BenchDecode *d) {
    RS_ASSERT(roundlog_name_ok(d->decoder, sizeof d->decoder) && roundlog_name_ok(d->prompt_id, sizeof d->prompt_id));
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
    if (!roundlog_name_ok(f[0], sizeof d.prompt_id))
        return rs_err(e, RS_EFORMAT, "%s:%d: bad prompt_id \"%s\"", path, lineno,
                      rs_escape(esc, sizeof esc, f[0], strlen(f[0]), 1));
    snprintf(d.prompt_id, sizeof d.prompt_id, "%s", f[0]);
    if (!roundlog_name_ok(f[2], sizeof d.decoder))
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

/* Rewrites rounds.jsonl keeping only the lines of decodes in the done set, byte for byte. */
typedef struct {
    FILE *f;
    const BenchDoneSet *done;
    const char *tmp;
} Filter;

static int keep_done(void *ctx, const RoundRecord *r, const char *line, size_t n, RsErr *e) {
    Filter *fl = ctx;
    BenchCombo c;
    memset(&c, 0, sizeof c);
    snprintf(c.decoder, BENCH_DEC_MAX, "%s", r->decoder);
    c.temp = r->temp;
    c.budget = r->budget;
    if (!bench_done_has(fl->done, r->prompt_id, &c, r->rep)) return RS_OK;
    if (fwrite(line, 1, n, fl->f) != n || fputc('\n', fl->f) == EOF)
        return rs_err(e, RS_EIO, "cannot write '%s': %s", fl->tmp, strerror(errno));
    return RS_OK;
}

static int filter_rounds(const char *path, const BenchDoneSet *done, RsErr *e) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    remove(tmp); /* a crash's leftover: a regular file (checked), or nothing */
    FILE *f = NULL;
    int rc = bench_file_open(tmp, BENCH_FILE_NEW, &f, e);
    if (rc) return rc;
    Filter fl = {f, done, tmp};
    rc = roundlog_scan(path, keep_done, &fl, e);
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
    RoundRecord *r = NULL;
    int nr = 0;
    struct stat st;
    int have_r = stat(rp, &st) == 0, have_d = stat(dp, &st) == 0;
    if ((rc = bench_resume_load(dir, &done, e))) return rc;
    if (have_r && (rc = roundlog_read(rp, &r, &nr, e))) goto out;
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
