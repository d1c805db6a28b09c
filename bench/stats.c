/* Run plan, speeds and paired bootstrap for the benchmark; see stats.h. */
#include "bench/stats.h"
#include "common/rng.h"
#include <math.h>
#include <string.h>

int bench_combos_default(BenchCombo *out, int cap, int with_ar) {
    static const char *dec[] = {"draft", "pearl", "rootdraw", "root"};
    static const int budgets[] = {8, 59};
    int n = 0;
    RS_ASSERT(cap >= 16 + (with_ar ? 2 : 0));
    for (int d = 0; d < 4; d++)
        for (int t = 0; t < 2; t++)
            for (int b = 0; b < 2; b++) {
                memset(&out[n], 0, sizeof out[n]);
                snprintf(out[n].decoder, BENCH_DEC_MAX, "%s", dec[d]);
                out[n].temp = t;
                out[n].budget = budgets[b];
                n++;
            }
    if (with_ar)
        for (int t = 0; t < 2; t++) {
            memset(&out[n], 0, sizeof out[n]);
            snprintf(out[n].decoder, BENCH_DEC_MAX, "ar");
            out[n].temp = t;
            n++;
        }
    return n;
}

/* Splits a comma list into at most cap tokens of at most 31 bytes. Returns count or -1. */
static int split_list(const char *s, char tok[][32], int cap) {
    int n = 0;
    const char *p = s;
    for (;;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len == 0 || len >= 32 || n == cap) return -1;
        memcpy(tok[n], p, len);
        tok[n][len] = 0;
        n++;
        if (!c) break;
        p = c + 1;
    }
    return n;
}

static int parse_int(const char *s, long lo, long hi, int *v) {
    char *end;
    long x = strtol(s, &end, 10);
    if (end == s || *end || x < lo || x > hi) return -1;
    *v = (int)x;
    return 0;
}

int bench_combos_parse(const char *decoders, const char *temps, const char *budgets,
                       BenchCombo **out, int *n, RsErr *e) {
    char dt[16][32], tt[4][32], bt[16][32];
    int nd = split_list(decoders, dt, 16), nt = split_list(temps, tt, 4),
        nb = split_list(budgets, bt, 16);
    *out = NULL;
    *n = 0;
    if (nd < 0) return rs_err(e, RS_EINVAL, "bad decoder list \"%s\" (comma list, <= 16)", decoders);
    if (nt < 0) return rs_err(e, RS_EINVAL, "bad temperature list \"%s\"", temps);
    if (nb < 0) return rs_err(e, RS_EINVAL, "bad budget list \"%s\"", budgets);
    int tv[4], bv[16];
    for (int i = 0; i < nt; i++)
        if (parse_int(tt[i], 0, 1, &tv[i]))
            return rs_err(e, RS_EINVAL, "temperature \"%s\" must be 0 or 1", tt[i]);
    for (int i = 0; i < nb; i++)
        if (!strcmp(bt[i], "auto")) bv[i] = BENCH_BUDGET_AUTO;
        else if (parse_int(bt[i], 1, 64, &bv[i]))
            return rs_err(e, RS_EINVAL, "budget \"%s\" must be auto or an integer in 1..64",
                          bt[i]);
    for (int i = 0; i < nd; i++) {
        if (strlen(dt[i]) >= BENCH_DEC_MAX)
            return rs_err(e, RS_EINVAL, "decoder name \"%s\" longer than %d bytes", dt[i],
                          BENCH_DEC_MAX - 1);
        for (const char *q = dt[i]; *q; q++)
            if (!((*q >= 'a' && *q <= 'z') || (*q >= '0' && *q <= '9') || *q == '_'))
                return rs_err(e, RS_EINVAL, "decoder name \"%s\" must be [a-z0-9_]", dt[i]);
    }
    BenchCombo *c = rs_xcalloc((size_t)(nd * nt * nb), sizeof *c);
    int k = 0;
    for (int d = 0; d < nd; d++)
        for (int t = 0; t < nt; t++)
            for (int b = 0; b < nb; b++) {
                int is_ar = strcmp(dt[d], "ar") == 0;
                if (is_ar && b > 0) break;
                BenchCombo x;
                memset(&x, 0, sizeof x);
                snprintf(x.decoder, BENCH_DEC_MAX, "%.15s", dt[d]);
                x.temp = tv[t];
                x.budget = is_ar ? 0 : bv[b];
                for (int j = 0; j < k; j++)
                    if (bench_combo_eq(&c[j], &x)) {
                        free(c);
                        return rs_err(e, RS_EINVAL, "combination %s T=%d B=%s listed twice",
                                      x.decoder, x.temp, bench_budget_str(x.budget, (char[16]){0}));
                    }
                c[k++] = x;
            }
    *out = c;
    *n = k;
    return RS_OK;
}

int bench_combo_eq(const BenchCombo *a, const BenchCombo *b) {
    return strcmp(a->decoder, b->decoder) == 0 && a->temp == b->temp && a->budget == b->budget;
}

static int decoder_rank(const char *d) {
    static const char *known[] = {"ar", "draft", "pearl", "rootdraw", "root"};
    for (int i = 0; i < 5; i++)
        if (strcmp(d, known[i]) == 0) return i;
    return 5;
}

int bench_combo_cmp(const BenchCombo *a, const BenchCombo *b) {
    int ra = decoder_rank(a->decoder), rb = decoder_rank(b->decoder);
    if (ra != rb) return ra < rb ? -1 : 1;
    int s = strcmp(a->decoder, b->decoder);
    if (s) return s < 0 ? -1 : 1;
    if (a->temp != b->temp) return a->temp < b->temp ? -1 : 1;
    if (a->budget != b->budget) return a->budget < b->budget ? -1 : 1;
    return 0;
}

/* floor(x * n / 2^64): an unbiased-enough index draw that a script can replicate exactly. */
static int draw_index(Rng *r, int n) {
    return (int)(((unsigned __int128)rng_next(r) * (unsigned)n) >> 64);
}

/* Appends one prompt's runs of one pass: every combination, rotated by pos + rep. */
static void plan_prompt(BenchPlan *p, int *k, int pos, int rep, int warmup, int *measured) {
    for (int j = 0; j < p->n_combos; j++) {
        BenchRun *run = &p->runs[(*k)++];
        run->prompt = p->order[pos];
        run->prompt_pos = pos;
        run->combo = (pos + rep + j) % p->n_combos;
        run->rep = rep;
        run->warmup = warmup;
        run->run_index = warmup ? -1 : (*measured)++;
    }
}

BenchPlan *bench_plan_create(int n_prompts, int n_combos, int n_warmup, int repeats,
                             uint64_t seed) {
    RS_ASSERT(n_prompts > 0 && n_combos > 0 && n_warmup >= 0 && repeats > 0);
    if (n_warmup > n_prompts) n_warmup = n_prompts;
    BenchPlan *p = rs_xcalloc(1, sizeof *p);
    p->n_prompts = n_prompts;
    p->n_combos = n_combos;
    p->n_warmup = n_warmup;
    p->repeats = repeats;
    p->seed = seed;
    p->order = rs_xmalloc((size_t)n_prompts * sizeof *p->order);
    for (int i = 0; i < n_prompts; i++) p->order[i] = i;
    Rng r;
    rng_seed(&r, seed);
    for (int i = n_prompts - 1; i > 0; i--) {
        int j = draw_index(&r, i + 1);
        int t = p->order[i];
        p->order[i] = p->order[j];
        p->order[j] = t;
    }
    p->n_runs = (n_warmup + n_prompts * repeats) * n_combos;
    p->runs = rs_xcalloc((size_t)p->n_runs, sizeof *p->runs);
    int k = 0, measured = 0;
    for (int pos = 0; pos < n_warmup; pos++) plan_prompt(p, &k, pos, 0, 1, &measured);
    for (int pos = 0; pos < n_prompts; pos++)
        for (int rep = 0; rep < repeats; rep++) plan_prompt(p, &k, pos, rep, 0, &measured);
    RS_ASSERT(k == p->n_runs);
    return p;
}

void bench_plan_destroy(BenchPlan **p) {
    if (!p || !*p) return;
    free((*p)->order);
    free((*p)->runs);
    free(*p);
    *p = NULL;
}

int bench_count_tokens(const int *out, int n, const int *eos, int n_eos, int *hit_eos) {
    for (int i = 0; i < n; i++)
        for (int k = 0; k < n_eos; k++)
            if (out[i] == eos[k]) {
                if (hit_eos) *hit_eos = 1;
                return i + 1;
            }
    if (hit_eos) *hit_eos = 0;
    return n;
}

double bench_speed(int64_t tokens, int64_t time_ns) {
    return time_ns > 0 ? (double)tokens * 1e9 / (double)time_ns : 0.0;
}

double bench_percentile(const double *v, int n, double p) {
    RS_ASSERT(n >= 1 && p >= 0 && p <= 1);
    double h = (n - 1) * p;
    int lo = (int)floor(h);
    if (lo >= n - 1) return v[n - 1];
    double f = h - lo;
    return v[lo] + f * (v[lo + 1] - v[lo]);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

void bench_sort(double *v, int n) { qsort(v, (size_t)n, sizeof *v, cmp_double); }

/* Shared driver: stat = (sum tok_a / sum ns_a) / (sum tok_b / sum ns_b) - 1, or the plain
 * speed of a when tok_b is NULL. Sums are accumulated in resample order, the same order a
 * replicating script uses. */
static double stat_of(const double *tok_a, const double *ns_a, const double *tok_b,
                      const double *ns_b, const int *idx, int n) {
    double ta = 0, na = 0, tb = 0, nb = 0;
    for (int i = 0; i < n; i++) {
        int k = idx ? idx[i] : i;
        ta += tok_a[k];
        na += ns_a[k];
        if (tok_b) {
            tb += tok_b[k];
            nb += ns_b[k];
        }
    }
    double sa = ta * 1e9 / na;
    if (!tok_b) return sa;
    return sa / (tb * 1e9 / nb) - 1.0;
}

static int bootstrap(const double *tok_a, const double *ns_a, const double *tok_b,
                     const double *ns_b, int n, int n_resamples, uint64_t seed,
                     BenchInterval *out, RsErr *e) {
    memset(out, 0, sizeof *out);
    if (n < 1) return rs_err(e, RS_EINVAL, "bootstrap needs at least one prompt (got %d)", n);
    if (n_resamples < 1)
        return rs_err(e, RS_EINVAL, "bootstrap needs at least one resample (got %d)",
                      n_resamples);
    for (int i = 0; i < n; i++) {
        if (!(ns_a[i] > 0) || (ns_b && !(ns_b[i] > 0)))
            return rs_err(e, RS_EINVAL, "prompt %d has a non-positive decode time", i);
        if (!(tok_a[i] >= 0) || (tok_b && !(tok_b[i] >= 0)))
            return rs_err(e, RS_EINVAL, "prompt %d has a negative token count", i);
    }
    if (tok_b) {
        double tb = 0;
        for (int i = 0; i < n; i++) tb += tok_b[i];
        if (tb <= 0) return rs_err(e, RS_EINVAL, "baseline emitted no tokens on %d prompts", n);
    }
    int *idx = rs_xmalloc((size_t)n * sizeof *idx);
    double *s = rs_xmalloc((size_t)n_resamples * sizeof *s);
    Rng r;
    rng_seed(&r, seed);
    int m = 0;
    for (int b = 0; b < n_resamples; b++) {
        for (int i = 0; i < n; i++) idx[i] = draw_index(&r, n);
        double v = stat_of(tok_a, ns_a, tok_b, ns_b, idx, n);
        /* A resample whose baseline drew only zero-token prompts has no ratio; skip it
         * (only possible with zero-token decodes, which real runs do not produce). */
        if (isfinite(v)) s[m++] = v;
    }
    bench_sort(s, m);
    out->est = stat_of(tok_a, ns_a, tok_b, ns_b, NULL, n);
    out->lo = bench_percentile(s, m, 0.025);
    out->hi = bench_percentile(s, m, 0.975);
    out->n = n;
    free(idx);
    free(s);
    return RS_OK;
}

int bench_gain_bootstrap(const double *tok_a, const double *ns_a, const double *tok_b,
                         const double *ns_b, int n, int n_resamples, uint64_t seed,
                         BenchInterval *out, RsErr *e) {
    RS_ASSERT(tok_b && ns_b);
    return bootstrap(tok_a, ns_a, tok_b, ns_b, n, n_resamples, seed, out, e);
}

int bench_speed_bootstrap(const double *tok, const double *ns, int n, int n_resamples,
                          uint64_t seed, BenchInterval *out, RsErr *e) {
    return bootstrap(tok, ns, NULL, NULL, n, n_resamples, seed, out, e);
}

void bench_speedup_per_prompt(const double *tok_a, const double *ns_a, const double *tok_ar,
                              const double *ns_ar, int n, double *ratio) {
    for (int i = 0; i < n; i++) {
        double sa = tok_a[i] * 1e9 / ns_a[i], sr = tok_ar[i] * 1e9 / ns_ar[i];
        ratio[i] = sr > 0 ? sa / sr : NAN;
    }
}

const char *bench_budget_str(int budget, char *buf) {
    if (budget == 0) return "-";
    if (budget == BENCH_BUDGET_AUTO) return "auto";
    snprintf(buf, 16, "%d", budget);
    return buf;
}
