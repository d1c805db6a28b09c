/* Timing summary over the rounds of one or more decodes. All times come from the target's
 * own monotonic clock except draft_ns, the drafter's own measurement from its POOL reply;
 * the two clocks are never compared (draft_ns is only used as a duration). */
#include "timing.h"
#include <stdlib.h>
#include <string.h>

void timing_create(TimingAcc **out) { *out = rs_xcalloc(1, sizeof **out); }

void timing_add(TimingAcc *t, const RoundInfo *r) {
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 256;
        double **arrs[] = {&t->draft_ms, &t->root_ms, &t->tree_ms, &t->wait_ms,
                           &t->overhead_ms, &t->hidden, &t->round_ms};
        for (size_t i = 0; i < sizeof arrs / sizeof arrs[0]; i++)
            *arrs[i] = realloc(*arrs[i], sizeof(double) * (size_t)t->cap);
    }
    int k = t->n++;
    const double absent = -1; /* all real values are >= 0 */
    t->draft_ms[k] = r->draft_ns ? r->draft_ns * 1e-6 : absent;
    t->root_ms[k] = r->t_root_end ? (double)(r->t_root_end - r->t_root_start) * 1e-6 : absent;
    t->tree_ms[k] = r->t_tree_end ? (double)(r->t_tree_end - r->t_tree_start) * 1e-6 : absent;
    double wait = absent, over = absent;
    if (r->t_pool_recv && r->t_grow_sent && !r->fallback_ar) {
        uint64_t from = r->t_root_end ? r->t_root_end : r->t_grow_sent;
        wait = r->t_pool_recv > from ? (double)(r->t_pool_recv - from) * 1e-6 : 0;
        double span = (double)(r->t_pool_recv - r->t_grow_sent) * 1e-6;
        /* Round trip beyond the drafter's own compute; meaningful only when the target was
         * waiting for the reply: always without a root pass, and after one only when the
         * drafting outlasted it. t_pool_recv is taken when the target asks for the pool,
         * after its root pass, so wait > 0 cannot tell: a pool that arrived during the root
         * pass would count the rest of the root pass as message overhead. */
        if (r->draft_ns && (!r->t_root_end || r->t_grow_sent + r->draft_ns > r->t_root_end))
            over = span - r->draft_ns * 1e-6;
        t->rounds_with_pool++;
        t->rounds_guessed += r->draft_ns > 0 && r->draft_commit_ns == 0;
    }
    t->wait_ms[k] = wait;
    t->overhead_ms[k] = over;
    t->hidden[k] = r->t_root_end && r->t_pool_recv ? timing_hidden_share(r) : absent;
    t->round_ms[k] = (double)(r->t_commit - r->t_round_start) * 1e-6;
    double part[TIMING_N_PARTS];
    timing_round_parts(r, part);
    for (int i = 0; i < TIMING_N_PARTS; i++) t->part_ms[i] += part[i];
}

static double span_ms(uint64_t from, uint64_t to) { return to > from ? (to - from) * 1e-6 : 0; }

void timing_round_parts(const RoundInfo *r, double p[TIMING_N_PARTS]) {
    uint64_t s = r->t_round_start, root_end = r->t_root_end ? r->t_root_end : s;
    uint64_t grow = r->t_grow_sent ? r->t_grow_sent : s;
    uint64_t ready = r->t_pool_recv > root_end ? r->t_pool_recv : root_end;
    p[TIMING_SEND] = r->t_grow_sent ? span_ms(s, r->t_grow_sent) : 0;
    p[TIMING_ROOT] = r->t_root_end ? span_ms(r->t_root_start, r->t_root_end) : 0;
    uint64_t wait_from = grow > root_end ? grow : root_end;
    p[TIMING_WAIT] = r->t_pool_recv ? span_ms(wait_from, r->t_pool_recv) : 0;
    p[TIMING_SELECT] = r->t_select_done ? span_ms(ready, r->t_select_done) : 0;
    p[TIMING_TREE] = r->t_tree_end ? span_ms(r->t_tree_start, r->t_tree_end) : 0;
    double sum = 0, whole = span_ms(s, r->t_commit);
    for (int i = 0; i < TIMING_OTHER; i++) sum += p[i];
    p[TIMING_OTHER] = whole > sum ? whole - sum : 0;
}

double timing_hidden_share(const RoundInfo *r) {
    if (!r->t_root_end || r->t_root_end <= r->t_root_start || !r->t_grow_sent || !r->t_pool_recv)
        return 0;
    /* Drafting on the target's clock: from the grow request for the drafter's own draft_ns
     * (it cannot start earlier), and over by the time the pool is received. t_pool_recv
     * alone cannot mark the end: the target asks for the pool only after its root pass, so
     * every root pass would look 100% hidden, however short the drafting. */
    uint64_t draft_end = r->t_pool_recv;
    if (r->draft_ns && r->t_grow_sent + r->draft_ns < draft_end)
        draft_end = r->t_grow_sent + r->draft_ns;
    uint64_t a = r->t_root_start > r->t_grow_sent ? r->t_root_start : r->t_grow_sent;
    uint64_t b = r->t_root_end < draft_end ? r->t_root_end : draft_end;
    return b > a ? (double)(b - a) / (double)(r->t_root_end - r->t_root_start) : 0;
}

static int dcmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of the non-negative entries; -1 when none. */
static double median(const double *v, int n, int *count) {
    double *s = malloc(sizeof(double) * (size_t)(n ? n : 1));
    int m = 0;
    for (int i = 0; i < n; i++)
        if (v[i] >= 0) s[m++] = v[i];
    *count = m;
    if (!m) {
        free(s);
        return -1;
    }
    qsort(s, (size_t)m, sizeof(double), dcmp);
    double r = m % 2 ? s[m / 2] : 0.5 * (s[m / 2 - 1] + s[m / 2]);
    free(s);
    return r;
}

void timing_print(FILE *f, TimingAcc *t) {
    struct {
        const char *name;
        double *v;
        const char *unit;
        double scale;
    } rows[] = {
        {"drafting (drafter's own time)", t->draft_ms, "ms", 1},
        {"root pass (1 token)", t->root_ms, "ms", 1},
        {"tree pass", t->tree_ms, "ms", 1},
        {"wait for pool after root pass", t->wait_ms, "ms", 1},
        {"message round trip beyond drafting", t->overhead_ms, "ms", 1},
        {"root pass hidden behind drafting", t->hidden, "%", 100},
        {"whole round", t->round_ms, "ms", 1},
    };
    fprintf(f, "per-round timing over %d rounds (medians):\n", t->n);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        int c;
        double m = median(rows[i].v, t->n, &c);
        if (m < 0) fprintf(f, "  %-36s       n/a\n", rows[i].name);
        else
            fprintf(f, "  %-36s %9.3f %-2s (%d rounds)\n", rows[i].name, m * rows[i].scale,
                    rows[i].unit, c);
    }
    if (t->rounds_guessed)
        fprintf(f, "  %-36s %9.3f %-2s (%d of %d rounds)\n", "commits the drafter guessed ahead",
                100.0 * t->rounds_guessed / t->rounds_with_pool, "%", t->rounds_guessed,
                t->rounds_with_pool);
    static const char *const names[TIMING_N_PARTS] = {"send", "root pass", "wait for pool",
                                                      "select", "tree pass", "other"};
    double whole = 0;
    for (int i = 0; i < TIMING_N_PARTS; i++) whole += t->part_ms[i];
    if (t->n == 0 || whole <= 0) return;
    fprintf(f, "where a round's time goes (mean %.1f ms):", whole / t->n);
    const char *sep = " ";
    for (int i = 0; i < TIMING_N_PARTS; i++) {
        if (t->part_ms[i] <= 0) continue;
        fprintf(f, "%s%s %.1f ms (%.0f%%)", sep, names[i], t->part_ms[i] / t->n,
                100 * t->part_ms[i] / whole);
        sep = ", ";
    }
    fprintf(f, "\n");
}

void timing_destroy(TimingAcc **pt) {
    if (!pt || !*pt) return;
    TimingAcc *t = *pt;
    free(t->draft_ms);
    free(t->root_ms);
    free(t->tree_ms);
    free(t->wait_ms);
    free(t->overhead_ms);
    free(t->hidden);
    free(t->round_ms);
    free(t);
    *pt = NULL;
}
