/* --analyze entry and the progress reporter; see analyze.h. */
#include "bench/analyze.h"
#include "bench/summary.h"
#include <math.h>
#include <string.h>
#include <unistd.h>

static const BenchDecode *sort_rows;

static int row_cmp(const void *a, const void *b) {
    const BenchDecode *x = &sort_rows[*(const int *)a], *y = &sort_rows[*(const int *)b];
    int c = strcmp(x->prompt_id, y->prompt_id);
    if (!c) c = strcmp(x->decoder, y->decoder);
    if (!c) c = x->temp != y->temp ? x->temp - y->temp : x->budget - y->budget;
    if (!c) c = x->rep - y->rep;
    return c ? c : *(const int *)a - *(const int *)b;
}

/* A run logs each (prompt, decoder, T, B, rep) once; a second row means the file is not one
 * run's log (concatenated, edited), so it is refused instead of silently counted. */
static int check_duplicates(const char *path, const BenchDecode *d, int nd, RsErr *e) {
    int *idx = rs_xmalloc(sizeof(int) * (size_t)(nd ? nd : 1)), rc = RS_OK;
    for (int i = 0; i < nd; i++) idx[i] = i;
    sort_rows = d;
    qsort(idx, (size_t)nd, sizeof *idx, row_cmp);
    for (int k = 1; k < nd && !rc; k++) {
        const BenchDecode *x = &d[idx[k - 1]], *y = &d[idx[k]];
        if (!strcmp(x->prompt_id, y->prompt_id) && !strcmp(x->decoder, y->decoder) &&
            x->temp == y->temp && x->budget == y->budget && x->rep == y->rep)
            rc = rs_err(e, RS_EFORMAT,
                        "%s:%d repeats the decode of line %d (prompt %s, %s T=%d B=%d, rep %d): "
                        "not the log of one run",
                        path, idx[k] + 2, idx[k - 1] + 2, y->prompt_id, y->decoder, y->temp,
                        y->budget, y->rep); /* line 1 is the header */
    }
    free(idx);
    return rc;
}

int bench_analyze(const char *dir, RsErr *e) {
    char dp[4096], rp[4096];
    snprintf(dp, sizeof dp, "%s/decodes.csv", dir);
    snprintf(rp, sizeof rp, "%s/rounds.jsonl", dir);
    BenchDecode *d = NULL;
    RoundRecord *r = NULL;
    int nd = 0, nr = 0;
    int rc = benchlog_decodes_read(dp, &d, &nd, e);
    if (rc == RS_OK) rc = roundlog_read(rp, &r, &nr, e);
    if (rc == RS_OK && nd == 0) rc = rs_err(e, RS_EFORMAT, "%s: no complete decode rows", dp);
    if (rc == RS_OK && nr == 0)
        rc = rs_err(e, RS_EFORMAT, "%s: no rounds, but %s has %d decodes", rp, dp, nd);
    if (rc == RS_OK) rc = check_duplicates(dp, d, nd, e);
    if (rc == RS_OK) rc = bench_summary_file(dir, d, nd, r, nr, e);
    if (rc == RS_OK) {
        RsErr pe = {0};
        if (bench_plots_write(dir, d, nd, r, nr, &pe) < 0)
            fprintf(stderr, "rootspec-bench: warning: %s\n", pe.msg);
    }
    free(d);
    free(r);
    return rc;
}

const char *bench_help_outputs(void) {
    return "Outputs (in the run directory):\n"
           "  rounds.jsonl  one JSON object per round, the round log rootspec-target --log-rounds\n"
           "                writes too (docs/DESIGN.md section 6): decoder, temp, budget, prompt_id,\n"
           "                rep, round, emitted, accepted, tree_size, x1_in_pool, tau, monotonic ns\n"
           "                timestamps t_round_start .. t_commit (null where a decoder has no such\n"
           "                phase), draft_ns, the round's backend counters, its tokens, ...\n"
           "  decodes.csv   one row per decode (speed = tokens up to and including the first EOS /\n"
           "                (last commit - start of the target prefill))\n"
           "  summary.md    speeds, speedups over AR, gains in speed and in expected acceptance\n"
           "                with 95% paired bootstrap intervals\n"
           "                (2000 resamples over prompts), acceptance, median round timings\n"
           "  speeds.png, round_breakdown.png  (needs gnuplot; skipped with a warning if absent)\n"
           "Every line is flushed when written; an interrupted run resumes with --resume DIR\n"
           "(completed decodes are skipped, the interrupted one reruns). --analyze DIR rebuilds\n"
           "summary.md and the plots from the two logs alone.\n";
}

struct BenchProgress {
    FILE *out;
    int tty, n_total, last_done;
    double interval_s, t0, t_last;
};

static double now_s(void) { return (double)rs_now_ns() / 1e9; }

const char *bench_format_duration(double s, char *buf, size_t cap) {
    if (!isfinite(s) || s < 0) {
        snprintf(buf, cap, "?");
        return buf;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, cap, "%ldh%02ldm%02lds", t / 3600, t / 60 % 60, t % 60);
    else if (t >= 60) snprintf(buf, cap, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, cap, "%lds", t);
    return buf;
}

BenchProgress *bench_progress_create(FILE *out, int n_total, double interval_s) {
    BenchProgress *p = rs_xcalloc(1, sizeof *p);
    p->out = out;
    p->tty = isatty(fileno(out));
    p->n_total = n_total > 0 ? n_total : 1;
    p->interval_s = interval_s > 0 ? interval_s : 30.0;
    p->t0 = p->t_last = now_s();
    p->last_done = -1;
    return p;
}

static void progress_print(BenchProgress *p, int done, const char *label, double t, int final) {
    char el[32], eta[32];
    double elapsed = t - p->t0;
    double rem = done > 0 ? elapsed / done * (p->n_total - done) : NAN;
    bench_format_duration(elapsed, el, sizeof el);
    bench_format_duration(rem, eta, sizeof eta);
    double pct = 100.0 * done / p->n_total;
    if (p->tty) {
        char bar[31];
        int fill = (int)(30.0 * done / p->n_total);
        for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '-';
        bar[30] = 0;
        fprintf(p->out, "\r\033[K[%s] %d/%d %5.1f%% elapsed %s ETA %s %s%s", bar, done,
                p->n_total, pct, el, eta, label ? label : "", final ? "\n" : "");
    } else {
        fprintf(p->out, "progress: %d/%d decodes (%.1f%%), elapsed %s, ETA %s%s%s\n", done,
                p->n_total, pct, el, eta, final ? ", finished" : label ? ", now " : "",
                final || !label ? "" : label);
    }
    fflush(p->out);
}

void bench_progress_update(BenchProgress *p, int n_done, const char *label) {
    double t = now_s();
    double gap = p->tty ? 0.1 : p->interval_s;
    p->last_done = n_done; /* remembered even when not printed, for the final line */
    if (t - p->t_last < gap) return;
    p->t_last = t;
    progress_print(p, n_done, label, t, 0);
}

void bench_progress_destroy(BenchProgress **pp) {
    if (!pp || !*pp) return;
    BenchProgress *p = *pp;
    int done = p->last_done < 0 ? 0 : p->last_done;
    progress_print(p, done, p->tty ? "done" : NULL, now_s(), 1);
    free(p);
    *pp = NULL;
}
