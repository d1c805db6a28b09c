/* summary.md and the gnuplot plots from decodes + rounds; see summary.h.
 * Everything is computed from integer fields (tokens, ns) and sorted keys, with a fixed
 * bootstrap seed and fixed number formats, so the same logs always give the same bytes. */
#include "bench/summary.h"
#include "bench/outdir.h"
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *const bench_part_names[BENCH_N_PARTS] = {"send",   "root pass", "wait for pool",
                                                     "select", "tree pass", "other"};

static int has(int64_t t) { return t != ROUNDLOG_NULL; }
static double pos_ms(int64_t ns) { return ns > 0 ? (double)ns / 1e6 : 0.0; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

int bench_round_parts(const RoundRecord *r, double p[BENCH_N_PARTS]) {
    if (!has(r->t_round_start) || !has(r->t_commit)) return -1;
    int64_t s = r->t_round_start;
    int64_t root_end = has(r->t_root_end) ? r->t_root_end : s;
    int64_t grow = has(r->t_grow_sent) ? r->t_grow_sent : s;
    p[0] = has(r->t_grow_sent) ? pos_ms(r->t_grow_sent - s) : 0;
    p[1] = has(r->t_root_start) && has(r->t_root_end) ? pos_ms(r->t_root_end - r->t_root_start)
                                                     : 0;
    p[2] = has(r->t_pool_recv) ? pos_ms(r->t_pool_recv - max64(grow, root_end)) : 0;
    int64_t ready = max64(has(r->t_pool_recv) ? r->t_pool_recv : s, root_end);
    p[3] = has(r->t_select_done) ? pos_ms(r->t_select_done - ready) : 0;
    p[4] = has(r->t_tree_start) && has(r->t_tree_end) ? pos_ms(r->t_tree_end - r->t_tree_start)
                                                     : 0;
    double sum = p[0] + p[1] + p[2] + p[3] + p[4];
    double whole = (double)(r->t_commit - s) / 1e6;
    p[5] = whole - sum > 0 ? whole - sum : 0;
    return 0;
}

/* ---- grouping ---- */

typedef struct {
    double *v;
    int n, cap;
} DVec;

static void dvec_push(DVec *d, double x) {
    if (d->n == d->cap) {
        d->cap = d->cap ? 2 * d->cap : 64;
        d->v = realloc(d->v, (size_t)d->cap * sizeof *d->v);
        RS_ASSERT(d->v);
    }
    d->v[d->n++] = x;
}

typedef struct {
    const char *pid;
    double tok, ns;
    double tau_sum; /* the rule's expected acceptance, summed over the prompt's rounds */
    int tau_n;      /* rounds with a tau (every repetition's, not only the median's) */
} Entry;

enum { M_DRAFT, M_ROOT, M_TREE, M_RTT, M_SEL, M_ROUND, N_MED };

typedef struct {
    BenchCombo c;
    int n;
    Entry *e; // (n) sorted by pid, unique
    int rounds;
    double sum_acc, sum_emit, sum_tree, sum_tau;
    int n_tau, n_x1, n_x1_true;
    DVec med[N_MED];
    double parts[BENCH_N_PARTS];
    int n_parts;
    int64_t replays, eager;
} Group;

typedef struct {
    int ng;
    Group *g;
    int n_prompts, n_dupes, n_orphans, nd, nr;
    int max_reps; /* most repetitions of one (prompt, decoder, T, B) */
} Analysis;

/* qsort has no context argument in C11; the summary is built on one thread. */
static const BenchDecode *sort_base;
static int dec_idx_cmp(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    const BenchDecode *x = &sort_base[i], *y = &sort_base[j];
    BenchCombo cx, cy;
    memset(&cx, 0, sizeof cx);
    memset(&cy, 0, sizeof cy);
    memcpy(cx.decoder, x->decoder, BENCH_DEC_MAX);
    memcpy(cy.decoder, y->decoder, BENCH_DEC_MAX);
    cx.temp = x->temp, cx.budget = x->budget, cy.temp = y->temp, cy.budget = y->budget;
    int c = bench_combo_cmp(&cx, &cy);
    if (c) return c;
    c = strcmp(x->prompt_id, y->prompt_id);
    if (c) return c;
    if (x->rep != y->rep) return x->rep - y->rep;
    return i < j ? -1 : i > j;
}

static int entry_cmp(const void *a, const void *b) {
    return strcmp(((const Entry *)a)->pid, ((const Entry *)b)->pid);
}

static int str_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int same_key(const BenchDecode *x, const BenchDecode *y) {
    return !strcmp(x->decoder, y->decoder) && x->temp == y->temp && x->budget == y->budget &&
           !strcmp(x->prompt_id, y->prompt_id);
}

static double decode_speed(const BenchDecode *x) {
    return x->time_ns > 0 ? (double)x->tokens / (double)x->time_ns : 0;
}

/* The median decode by speed of the repetitions idx[0..n) (distinct reps; the slower of
 * the middle two for an even count). */
static const BenchDecode *median_decode(const BenchDecode *d, int *idx, int n) {
    for (int i = 1; i < n; i++) /* insertion sort: a handful of repetitions */
        for (int j = i; j > 0 && decode_speed(&d[idx[j]]) < decode_speed(&d[idx[j - 1]]); j--) {
            int t = idx[j];
            idx[j] = idx[j - 1];
            idx[j - 1] = t;
        }
    return &d[idx[(n - 1) / 2]];
}

/* Groups the decodes by (decoder, T, B), each group's entries sorted by prompt id. The
 * repetitions of a (prompt, decoder, T, B) make one entry, their median decode; a repeated
 * (prompt, decoder, T, B, rep) row is counted and skipped (the first is kept). */
static void group_decodes(Analysis *an, const BenchDecode *d, int nd) {
    int *idx = rs_xmalloc((size_t)(nd ? nd : 1) * sizeof *idx);
    for (int i = 0; i < nd; i++) idx[i] = i;
    sort_base = d;
    qsort(idx, (size_t)nd, sizeof *idx, dec_idx_cmp);
    an->g = rs_xcalloc((size_t)(nd ? nd : 1), sizeof *an->g);
    for (int k = 0; k < nd;) {
        int end = k + 1, m = 1; /* idx[k..end): one key; its distinct reps to idx[k..k+m) */
        for (; end < nd && same_key(&d[idx[k]], &d[idx[end]]); end++) {
            if (d[idx[end]].rep == d[idx[k + m - 1]].rep) an->n_dupes++;
            else idx[k + m++] = idx[end];
        }
        const BenchDecode *x = median_decode(d, idx + k, m);
        if (m > an->max_reps) an->max_reps = m;
        k = end;
        Group *g = an->ng ? &an->g[an->ng - 1] : NULL;
        if (!g || strcmp(g->c.decoder, x->decoder) || g->c.temp != x->temp ||
            g->c.budget != x->budget) {
            g = &an->g[an->ng++];
            memcpy(g->c.decoder, x->decoder, BENCH_DEC_MAX);
            g->c.temp = x->temp;
            g->c.budget = x->budget;
            g->e = rs_xmalloc(sizeof *g->e);
        }
        g->e = realloc(g->e, (size_t)(g->n + 1) * sizeof *g->e);
        RS_ASSERT(g->e);
        g->e[g->n++] = (Entry){x->prompt_id, (double)x->tokens, (double)x->time_ns, 0, 0};
    }
    free(idx);
}

static int count_prompts(const BenchDecode *d, int nd) {
    const char **ids = rs_xmalloc((size_t)(nd ? nd : 1) * sizeof *ids);
    for (int i = 0; i < nd; i++) ids[i] = d[i].prompt_id;
    qsort(ids, (size_t)nd, sizeof *ids, str_cmp);
    int n = 0;
    for (int i = 0; i < nd; i++)
        if (i == 0 || strcmp(ids[i], ids[i - 1])) n++;
    free(ids);
    return n;
}

/* Adds one round's counts and timings to its group. */
static void group_add_round(Group *g, const RoundRecord *x) {
    g->rounds++;
    g->sum_acc += x->accepted;
    g->sum_emit += x->emitted;
    g->sum_tree += x->tree_size;
    if (isfinite(x->tau)) g->sum_tau += x->tau, g->n_tau++;
    if (x->x1_in_pool >= 0) g->n_x1++, g->n_x1_true += x->x1_in_pool;
    if (has(x->draft_ns)) dvec_push(&g->med[M_DRAFT], x->draft_ns / 1e6);
    if (has(x->t_root_start) && has(x->t_root_end))
        dvec_push(&g->med[M_ROOT], (x->t_root_end - x->t_root_start) / 1e6);
    if (has(x->t_tree_start) && has(x->t_tree_end))
        dvec_push(&g->med[M_TREE], (x->t_tree_end - x->t_tree_start) / 1e6);
    if (has(x->t_grow_sent) && has(x->t_pool_recv))
        dvec_push(&g->med[M_RTT], (x->t_pool_recv - x->t_grow_sent) / 1e6);
    if (has(x->t_select_done) && (has(x->t_pool_recv) || has(x->t_root_end))) {
        int64_t ready = max64(has(x->t_pool_recv) ? x->t_pool_recv : 0,
                              has(x->t_root_end) ? x->t_root_end : 0);
        dvec_push(&g->med[M_SEL], (x->t_select_done - ready) / 1e6);
    }
    if (has(x->t_round_start) && has(x->t_commit))
        dvec_push(&g->med[M_ROUND], (x->t_commit - x->t_round_start) / 1e6);
    double p[BENCH_N_PARTS];
    if (bench_round_parts(x, p) == 0) {
        for (int k = 0; k < BENCH_N_PARTS; k++) g->parts[k] += p[k];
        g->n_parts++;
    }
    g->replays += x->graph_replays;
    g->eager += x->eager_launches;
}

static void analysis_build(Analysis *an, const BenchDecode *d, int nd, const RoundRecord *r,
                           int nr) {
    memset(an, 0, sizeof *an);
    an->nd = nd;
    an->nr = nr;
    group_decodes(an, d, nd);
    an->n_prompts = count_prompts(d, nd);
    /* rounds: only those of logged decodes count */
    for (int i = 0; i < nr; i++) {
        const RoundRecord *x = &r[i];
        Group *g = NULL;
        for (int k = 0; k < an->ng; k++)
            if (!strcmp(an->g[k].c.decoder, x->decoder) && an->g[k].c.temp == x->temp &&
                an->g[k].c.budget == x->budget)
                g = &an->g[k];
        Entry key = {x->prompt_id, 0, 0, 0, 0};
        Entry *en = g ? bsearch(&key, g->e, (size_t)g->n, sizeof key, entry_cmp) : NULL;
        if (!en) {
            an->n_orphans++;
            continue;
        }
        group_add_round(g, x);
        if (isfinite(x->tau)) en->tau_sum += x->tau, en->tau_n++;
    }
    for (int k = 0; k < an->ng; k++)
        for (int m = 0; m < N_MED; m++)
            if (an->g[k].med[m].n)
                bench_sort(an->g[k].med[m].v, an->g[k].med[m].n);
}

static void analysis_free(Analysis *an) {
    for (int k = 0; k < an->ng; k++) {
        free(an->g[k].e);
        for (int m = 0; m < N_MED; m++) free(an->g[k].med[m].v);
    }
    free(an->g);
    memset(an, 0, sizeof *an);
}

static const Group *find_group(const Analysis *an, const char *dec, int temp, int budget) {
    for (int k = 0; k < an->ng; k++)
        if (!strcmp(an->g[k].c.decoder, dec) && an->g[k].c.temp == temp &&
            (budget < 0 || an->g[k].c.budget == budget))
            return &an->g[k];
    return NULL;
}

/* Pairs two groups on common prompt ids (merge of sorted lists): each side's tokens and
 * time, or with `tau` its summed expected acceptance and rounds with one (prompts where
 * either side has none are left out). Arrays malloc'd (4 * n). */
static int pair_on(const Group *a, const Group *b, int tau, double **buf) {
    int cap = a->n < b->n ? a->n : b->n;
    double *v = rs_xmalloc((size_t)(4 * (cap ? cap : 1)) * sizeof *v);
    int i = 0, j = 0, n = 0;
    while (i < a->n && j < b->n) {
        int c = strcmp(a->e[i].pid, b->e[j].pid);
        if (c < 0) i++;
        else if (c > 0) j++;
        else if (tau && (!a->e[i].tau_n || !b->e[j].tau_n)) i++, j++;
        else {
            const Entry *x = &a->e[i], *y = &b->e[j];
            v[n] = tau ? x->tau_sum : x->tok, v[cap + n] = tau ? x->tau_n : x->ns;
            v[2 * cap + n] = tau ? y->tau_sum : y->tok, v[3 * cap + n] = tau ? y->tau_n : y->ns;
            n++, i++, j++;
        }
    }
    /* compact the four columns to stride n */
    for (int k = 0; k < n; k++) v[n + k] = v[cap + k];
    for (int k = 0; k < n; k++) v[2 * n + k] = v[2 * cap + k];
    for (int k = 0; k < n; k++) v[3 * n + k] = v[3 * cap + k];
    *buf = v;
    return n;
}

static void group_speed(const Group *g, BenchInterval *iv) {
    double *tok = rs_xmalloc((size_t)g->n * sizeof *tok), *ns = rs_xmalloc((size_t)g->n * sizeof *ns);
    for (int i = 0; i < g->n; i++) tok[i] = g->e[i].tok, ns[i] = g->e[i].ns;
    RsErr e;
    if (bench_speed_bootstrap(tok, ns, g->n, BENCH_RESAMPLES, BENCH_BOOT_SEED, iv, &e) != RS_OK)
        iv->est = iv->lo = iv->hi = NAN; /* only zero-time rows, which the reader refuses */
    free(tok);
    free(ns);
}

static int pair_groups(const Group *a, const Group *b, double **buf) {
    return pair_on(a, b, 0, buf);
}

/* Gain of a over b on common prompts, in speed or (tau) in expected acceptance a round;
 * returns the pair count (0: none). */
static int group_gain_on(const Group *a, const Group *b, int tau, BenchInterval *iv) {
    double *v;
    int n = pair_on(a, b, tau, &v);
    RsErr e;
    if (n == 0 || bench_gain_bootstrap(v, v + n, v + 2 * n, v + 3 * n, n, BENCH_RESAMPLES,
                                       BENCH_BOOT_SEED, iv, &e) != RS_OK) {
        iv->est = iv->lo = iv->hi = NAN;
        iv->n = n;
    }
    free(v);
    return n;
}

static int group_gain(const Group *a, const Group *b, BenchInterval *iv) {
    return group_gain_on(a, b, 0, iv);
}

static void put_num(FILE *f, const char *fmt, double x) {
    if (isfinite(x)) fprintf(f, fmt, x);
    else fputs("-", f);
}

static void put_med(FILE *f, const DVec *d) {
    fputs(" | ", f);
    if (d->n) fprintf(f, "%.3f", bench_percentile(d->v, d->n, 0.5));
    else fputs("-", f);
}

/* " est [lo, hi]" with each number in fmt (or "-"). */
static void put_interval(FILE *f, const char *fmt, double est, double lo, double hi) {
    put_num(f, fmt, est);
    fputs(" [", f);
    put_num(f, fmt, lo);
    fputs(", ", f);
    put_num(f, fmt, hi);
    fputs("]", f);
}

static void write_header(FILE *f, const Analysis *an) {
    fprintf(f, "# rootspec benchmark summary\n\n");
    fprintf(f, "- prompts: %d; decodes: %d; rounds: %d; settings: %d\n", an->n_prompts, an->nd,
            an->nr, an->ng);
    if (an->max_reps > 1)
        fprintf(f, "- repetitions: up to %d decodes of each (prompt, decoder, T, B); each "
                   "counts as its median decode by speed (the slower middle one of an even "
                   "count)\n", an->max_reps);
    if (an->n_dupes)
        fprintf(f, "- note: %d repeated (prompt, decoder, T, B, rep) rows ignored (first kept)\n",
                an->n_dupes);
    if (an->n_orphans)
        fprintf(f, "- note: %d rounds without a logged decode ignored\n", an->n_orphans);
    fprintf(f, "- speed of a decode = tokens up to and including the first EOS / (last commit - "
               "start of the target prefill); speed of a run = summed tokens / summed time\n");
    fprintf(f, "- intervals: 95%% paired bootstrap over prompts, %d resamples, seed 0x%" PRIx64
               ", 2.5th/97.5th percentiles by linear interpolation between order statistics "
               "(numpy's default)\n\n",
            BENCH_RESAMPLES, (uint64_t)BENCH_BOOT_SEED);
}

/* The AR columns of a speed row: AR's speed on the shared prompts, the speedup interval, and
 * the median and lowest per-prompt speedups (the lowest says whether any prompt lost to
 * AR); "-" when g is AR or has no prompt in common with it. */
static void write_speedup_cells(FILE *f, const Analysis *an, const Group *g) {
    const Group *ar = find_group(an, "ar", g->c.temp, -1);
    BenchInterval gi;
    int n = ar && ar != g ? group_gain(g, ar, &gi) : 0;
    if (n == 0) {
        fputs("- | - | - | - |\n", f);
        return;
    }
    double *v;
    pair_groups(g, ar, &v);
    double ta = 0, na = 0;
    for (int i = 0; i < n; i++) ta += v[2 * n + i], na += v[3 * n + i];
    double *ratio = rs_xmalloc((size_t)n * sizeof *ratio);
    bench_speedup_per_prompt(v, v + n, v + 2 * n, v + 3 * n, n, ratio);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(ratio[i])) ratio[m++] = ratio[i];
    bench_sort(ratio, m);
    put_num(f, "%.2f", ta * 1e9 / na);
    fputs(" | ", f);
    put_interval(f, "%.3f", gi.est + 1, gi.lo + 1, gi.hi + 1);
    fputs(" | ", f);
    put_num(f, "%.3f", m ? bench_percentile(ratio, m, 0.5) : NAN);
    fputs(" | ", f);
    put_num(f, "%.3f", m ? ratio[0] : NAN);
    fputs(" |\n", f);
    free(ratio);
    free(v);
}

static void write_speeds(FILE *f, const Analysis *an) {
    char bb[16];
    fprintf(f, "## Speed (tokens/s)\n\n");
    fprintf(f, "Speedup over AR is on the prompts both ran, at the same T.\n\n");
    fprintf(f, "| decoder | T | B | prompts | tokens | speed [95%% CI] | AR speed | speedup "
               "over AR [95%% CI] | median per-prompt speedup | lowest per-prompt speedup |\n");
    fprintf(f, "|---|---|---|---|---|---|---|---|---|---|\n");
    for (int k = 0; k < an->ng; k++) {
        const Group *g = &an->g[k];
        BenchInterval sp;
        group_speed(g, &sp);
        double tok = 0;
        for (int i = 0; i < g->n; i++) tok += g->e[i].tok;
        fprintf(f, "| %s | %d | %s | %d | %.0f | ", g->c.decoder, g->c.temp,
                bench_budget_str(g->c.budget, bb), g->n, tok);
        put_interval(f, "%.2f", sp.est, sp.lo, sp.hi);
        fputs(" | ", f);
        write_speedup_cells(f, an, g);
    }
}

/* Every decoder over draft selection at the same T and B, then rootdraw over pearl (the
 * paper's offline comparison, measured): in speed, or (tau) in the rules' expected
 * acceptance a round, the paper's Table 2 quantity. */
static void write_gains(FILE *f, const Analysis *an, int tau) {
    if (tau) {
        fprintf(f, "\n## Expected acceptance over draft selection\n\n");
        fprintf(f, "Gain of A over B = tau(A)/tau(B) - 1, tau = the rule's expected accepted "
                   "tokens a round (mean over the rounds of the prompts both ran).\n\n");
    } else {
        fprintf(f, "\n## Gains over draft selection\n\n");
        fprintf(f, "Gain of A over B = speed(A)/speed(B) - 1 on the prompts both ran.\n\n");
    }
    fprintf(f, "| T | B | comparison | prompts | gain [95%% CI] |\n|---|---|---|---|---|\n");
    int any = 0;
    for (int k = 0; k < an->ng; k++) {
        const Group *base = &an->g[k];
        if (strcmp(base->c.decoder, "draft")) continue;
        for (int pass = 0; pass < 2; pass++)
            for (int j = 0; j < an->ng; j++) {
                const Group *a = &an->g[j], *b = base;
                if (a->c.temp != base->c.temp || a->c.budget != base->c.budget) continue;
                if (pass == 0) {
                    if (!strcmp(a->c.decoder, "draft") || !strcmp(a->c.decoder, "ar")) continue;
                } else {
                    if (strcmp(a->c.decoder, "rootdraw")) continue;
                    b = find_group(an, "pearl", a->c.temp, a->c.budget);
                    if (!b) continue;
                }
                BenchInterval gi;
                int n = group_gain_on(a, b, tau, &gi);
                char bb[16];
                fprintf(f, "| %d | %s | %s vs %s | %d | ", a->c.temp,
                        bench_budget_str(a->c.budget, bb), a->c.decoder, b->c.decoder, n);
                put_interval(f, "%+.2f%%", 100 * gi.est, 100 * gi.lo, 100 * gi.hi);
                fputs(" |\n", f);
                any = 1;
            }
    }
    if (!any) fprintf(f, "| - | - | (no draft runs) | 0 | - |\n");
}

static void write_acceptance(FILE *f, const Analysis *an) {
    char bb[16];
    fprintf(f, "\n## Acceptance per round\n\n");
    fprintf(f, "| decoder | T | B | rounds | mean accepted | mean emitted | mean tree size | "
               "mean tau | X1 in pool |\n|---|---|---|---|---|---|---|---|---|\n");
    for (int k = 0; k < an->ng; k++) {
        const Group *g = &an->g[k];
        double nr_ = g->rounds;
        fprintf(f, "| %s | %d | %s | %d | ", g->c.decoder, g->c.temp, bench_budget_str(g->c.budget, bb),
                g->rounds);
        put_num(f, "%.3f", g->rounds ? g->sum_acc / nr_ : NAN);
        fputs(" | ", f);
        put_num(f, "%.3f", g->rounds ? g->sum_emit / nr_ : NAN);
        fputs(" | ", f);
        put_num(f, "%.2f", g->rounds ? g->sum_tree / nr_ : NAN);
        fputs(" | ", f);
        put_num(f, "%.3f", g->n_tau ? g->sum_tau / g->n_tau : NAN);
        fputs(" | ", f);
        put_num(f, "%.1f%%", g->n_x1 ? 100.0 * g->n_x1_true / g->n_x1 : NAN);
        fputs(" |\n", f);
    }
}

static void write_timings(FILE *f, const Analysis *an) {
    char bb[16];
    fprintf(f, "\n## Median round timings (ms)\n\n");
    fprintf(f, "drafter = draft_ns from the POOL reply; round trip = t_pool_recv - t_grow_sent; "
               "selection = t_select_done - max(t_pool_recv, t_root_end); round = t_commit - "
               "t_round_start.\n\n");
    fprintf(f, "| decoder | T | B | drafter | root pass | tree pass | round trip | selection | "
               "round | graph replays | eager launches |\n"
               "|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int k = 0; k < an->ng; k++) {
        const Group *g = &an->g[k];
        fprintf(f, "| %s | %d | %s", g->c.decoder, g->c.temp, bench_budget_str(g->c.budget, bb));
        put_med(f, &g->med[M_DRAFT]);
        put_med(f, &g->med[M_ROOT]);
        put_med(f, &g->med[M_TREE]);
        put_med(f, &g->med[M_RTT]);
        put_med(f, &g->med[M_SEL]);
        put_med(f, &g->med[M_ROUND]);
        fprintf(f, " | %" PRId64 " | %" PRId64 " |\n", g->replays, g->eager);
    }
}

static void write_breakdown(FILE *f, const Analysis *an) {
    char bb[16];
    fprintf(f, "\n## Mean round breakdown (ms)\n\n| decoder | T | B");
    for (int p = 0; p < BENCH_N_PARTS; p++) fprintf(f, " | %s", bench_part_names[p]);
    fprintf(f, " |\n|---|---|---");
    for (int p = 0; p < BENCH_N_PARTS; p++) fputs("|---", f);
    fputs("|\n", f);
    for (int k = 0; k < an->ng; k++) {
        const Group *g = &an->g[k];
        fprintf(f, "| %s | %d | %s", g->c.decoder, g->c.temp, bench_budget_str(g->c.budget, bb));
        for (int p = 0; p < BENCH_N_PARTS; p++) {
            fputs(" | ", f);
            put_num(f, "%.3f", g->n_parts ? g->parts[p] / g->n_parts : NAN);
        }
        fputs(" |\n", f);
    }
}

int bench_summary_write(FILE *f, const BenchDecode *d, int nd, const RoundRecord *r, int nr,
                        RsErr *e) {
    Analysis an;
    analysis_build(&an, d, nd, r, nr);
    write_header(f, &an);
    write_speeds(f, &an);
    write_gains(f, &an, 0);
    write_acceptance(f, &an);
    write_gains(f, &an, 1);
    write_timings(f, &an);
    write_breakdown(f, &an);
    analysis_free(&an);
    if (ferror(f)) return rs_err(e, RS_EIO, "cannot write the summary: %s", strerror(errno));
    return RS_OK;
}

int bench_summary_file(const char *dir, const BenchDecode *d, int nd, const RoundRecord *r,
                       int nr, RsErr *e) {
    char path[4096];
    snprintf(path, sizeof path, "%s/summary.md", dir);
    FILE *f = NULL;
    int rc = bench_file_open(path, BENCH_FILE_TRUNC, &f, e);
    if (rc) return rc;
    rc = bench_summary_write(f, d, nd, r, nr, e);
    if (fclose(f) != 0 && rc == RS_OK)
        rc = rs_err(e, RS_EIO, "cannot write '%s': %s", path, strerror(errno));
    return rc;
}

/* ---- plots ---- */

/* Finds the gnuplot binary: $ROOTSPEC_GNUPLOT (a tool's path, read here only), else
 * "gnuplot" in $PATH. Not found: -1, and out holds what was tried ($ROOTSPEC_GNUPLOT, or
 * "not on $PATH"). */
static int find_gnuplot(char *out, size_t cap) {
    const char *env = getenv("ROOTSPEC_GNUPLOT");
    if (env && *env) {
        snprintf(out, cap, "%s", env);
        return access(out, X_OK) == 0 ? 0 : -1;
    }
    const char *path = getenv("PATH");
    if (!path) path = "/usr/bin:/bin";
    while (*path) {
        const char *c = strchr(path, ':');
        size_t len = c ? (size_t)(c - path) : strlen(path);
        snprintf(out, cap, "%.*s/gnuplot", (int)len, path);
        if (len && access(out, X_OK) == 0) return 0;
        path += len + (c ? 1 : 0);
    }
    snprintf(out, cap, "not on $PATH");
    return -1;
}

/* gnuplot single-quoted string: '' stands for one quote, and nothing else is special but
 * a line's end, which bench_plots_write has refused (no control character in dir). */
static void gp_quote(FILE *f, const char *dir, const char *name) {
    fputc('\'', f);
    for (const char *p = dir; *p; p++) {
        if (*p == '\'') fputc('\'', f);
        fputc(*p, f);
    }
    fprintf(f, "/%s'", name);
}

/* Shell single-quoting for popen. */
static void sh_quote(char *dst, size_t cap, const char *s) {
    size_t k = 0;
    dst[k++] = '\'';
    for (; *s && k + 5 < cap; s++) {
        if (*s == '\'') {
            memcpy(dst + k, "'\\''", 4);
            k += 4;
        } else dst[k++] = *s;
    }
    dst[k++] = '\'';
    dst[k] = 0;
}

static void write_plot_script(FILE *f, const char *dir, const Analysis *an) {
    /* decoders (columns) and (T, B) settings (rows) for the grouped speed chart; AR has no
     * budget, so its speed at T is repeated in each budget group of that T. */
    const char *decs[32];
    int nd = 0;
    for (int k = 0; k < an->ng && nd < 32; k++)
        if (nd == 0 || strcmp(decs[nd - 1], an->g[k].c.decoder)) decs[nd++] = an->g[k].c.decoder;
    int tb[64][2], ntb = 0;
    char bb[16];
    for (int k = 0; k < an->ng; k++) {
        if (an->g[k].c.budget == 0) continue;
        int seen = 0;
        for (int i = 0; i < ntb; i++)
            if (tb[i][0] == an->g[k].c.temp && tb[i][1] == an->g[k].c.budget) seen = 1;
        if (!seen && ntb < 64) tb[ntb][0] = an->g[k].c.temp, tb[ntb][1] = an->g[k].c.budget, ntb++;
    }
    for (int i = 0; i < ntb; i++) /* sort by (T, B) */
        for (int j = i + 1; j < ntb; j++)
            if (tb[j][0] < tb[i][0] || (tb[j][0] == tb[i][0] && tb[j][1] < tb[i][1])) {
                int t0 = tb[i][0], t1 = tb[i][1];
                tb[i][0] = tb[j][0], tb[i][1] = tb[j][1], tb[j][0] = t0, tb[j][1] = t1;
            }
    if (ntb == 0) /* AR only: one group per T */
        for (int k = 0; k < an->ng && ntb < 64; k++)
            if (ntb == 0 || tb[ntb - 1][0] != an->g[k].c.temp) tb[ntb][0] = an->g[k].c.temp, tb[ntb][1] = 0, ntb++;

    fprintf(f, "set datafile missing '-'\n$speeds << EOD\n");
    for (int i = 0; i < ntb; i++) {
        if (tb[i][1]) fprintf(f, "\"T=%d B=%s\"", tb[i][0], bench_budget_str(tb[i][1], bb));
        else fprintf(f, "\"T=%d\"", tb[i][0]);
        for (int k = 0; k < nd; k++) {
            const Group *g = find_group(an, decs[k], tb[i][0], strcmp(decs[k], "ar") ? tb[i][1] : 0);
            if (!g) {
                fputs(" - - -", f);
                continue;
            }
            BenchInterval iv;
            group_speed(g, &iv);
            fprintf(f, " %.4f %.4f %.4f", iv.est, iv.lo, iv.hi);
        }
        fputc('\n', f);
    }
    fprintf(f, "EOD\n$parts << EOD\n");
    for (int k = 0; k < an->ng; k++) {
        const Group *g = &an->g[k];
        if (g->c.budget)
            fprintf(f, "\"%s T%d B%s\"", g->c.decoder, g->c.temp, bench_budget_str(g->c.budget, bb));
        else fprintf(f, "\"%s T%d\"", g->c.decoder, g->c.temp);
        for (int p = 0; p < BENCH_N_PARTS; p++)
            fprintf(f, " %.4f", g->n_parts ? g->parts[p] / g->n_parts : 0.0);
        fputc('\n', f);
    }
    fprintf(f, "EOD\n");
    fprintf(f, "set terminal pngcairo size 1000,600 font 'sans,10'\nset output ");
    gp_quote(f, dir, "speeds.png");
    fprintf(f, "\nset title 'Decode speed per setting (run speed, 95%% bootstrap interval)'\n"
               "set ylabel 'tokens / s'\nset yrange [0:*]\nset grid ytics\n"
               "set style data histogram\nset style histogram errorbars gap 1 lw 1\n"
               "set style fill solid 0.7 border -1\nset key outside right top\nplot ");
    for (int k = 0; k < nd; k++)
        fprintf(f, "%s$speeds using %d:%d:%d%s title '%s'", k ? ", " : "", 2 + 3 * k,
                3 + 3 * k, 4 + 3 * k, k == 0 ? ":xtic(1)" : "", decs[k]);
    fprintf(f, "\nset output ");
    gp_quote(f, dir, "round_breakdown.png");
    fprintf(f, "\nset title 'Mean per-round time breakdown'\nset ylabel 'ms per round'\n"
               "set style histogram rowstacked\nset boxwidth 0.7\nset xtics rotate by -45\n"
               "plot ");
    for (int p = 0; p < BENCH_N_PARTS; p++)
        fprintf(f, "%s$parts using %d%s title '%s'", p ? ", " : "", 2 + p, p == 0 ? ":xtic(1)" : "",
                bench_part_names[p]);
    fprintf(f, "\nset output\n");
}

int bench_plots_write(const char *dir, const BenchDecode *d, int nd, const RoundRecord *r,
                      int nr, RsErr *e) {
    char gp[4096];
    if (find_gnuplot(gp, sizeof gp) != 0) {
        fprintf(stderr, "rootspec-bench: warning: gnuplot not found (%s); skipping speeds.png "
                        "and round_breakdown.png (summary.md is still written)\n", gp);
        return 1;
    }
    if (nd == 0) return rs_err(e, RS_EINVAL, "no decodes to plot in '%s'", dir);
    /* The script names the plots by path: one with a newline would end its line and start
     * a gnuplot command. Where gnuplot writes, no link may lead elsewhere. */
    char png[4200];
    int rc = bench_path_check("plots in", dir, e);
    for (int i = 0; i < 2 && !rc; i++) {
        snprintf(png, sizeof png, "%s/%s", dir, i ? "round_breakdown.png" : "speeds.png");
        rc = bench_file_check(png, e);
    }
    if (rc) return rc;
    Analysis an;
    analysis_build(&an, d, nd, r, nr);
    char cmd[8300];
    sh_quote(cmd, sizeof cmd, gp);
    FILE *p = popen(cmd, "w");
    if (!p) {
        analysis_free(&an);
        return rs_err(e, RS_EIO, "cannot start gnuplot '%s': %s", gp, strerror(errno));
    }
    write_plot_script(p, dir, &an);
    analysis_free(&an);
    int st = pclose(p);
    if (st != 0)
        return rs_err(e, RS_EIO, "gnuplot '%s' failed (status %d) writing plots in '%s'", gp,
                      st, dir);
    return RS_OK;
}
