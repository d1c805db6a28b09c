/* Benchmark statistics (DESIGN.md §6): the run plan (seeded prompt shuffle and per-prompt
 * rotation of the decoder/T/B combinations), decode and run speeds, and the paired
 * bootstrap over prompts for gains and speedups. Independent of any decoder. */
#ifndef ROOTSPEC_BENCH_STATS_H
#define ROOTSPEC_BENCH_STATS_H
#include "common/util.h"
#include <stdint.h>

#define BENCH_DEC_MAX 16          /* decoder name buffer */
#define BENCH_RESAMPLES 2000      /* bootstrap resamples (DESIGN.md §6) */
#define BENCH_BOOT_SEED 0x5eedb007ull /* fixed, so --analyze reproduces summary.md */

/* The budget of a --budget auto combination (the cost-aware budget) in combos and logs:
 * above any real B, so auto sorts after them and logs keep a numeric column. */
#define BENCH_BUDGET_AUTO 1000

/* One benchmark setting. AR decodes use budget 0. */
typedef struct {
    char decoder[BENCH_DEC_MAX]; /* "ar", "draft", "pearl", "rootdraw", "root", ... */
    int temp;                    /* 0 or 1 */
    int budget;                  /* B; 0 for "ar"; BENCH_BUDGET_AUTO for auto */
} BenchCombo;

/* The 16 combinations of DESIGN.md §6, {draft,pearl,rootdraw,root} x T {0,1} x B {8,59},
 * decoder-major (then T, then B); with_ar appends ("ar", 0, 0) and ("ar", 1, 0). Returns
 * the count written (16 or 18); cap must be >= that. */
int bench_combos_default(BenchCombo *out, int cap, int with_ar);
/* Cross product of comma lists, e.g. ("ar,draft,root", "0,1", "8,59,auto"): decoder-major;
 * "ar" appears once per T with budget 0. Temps must be 0 or 1, budgets 1..64 or auto
 * (BENCH_BUDGET_AUTO), decoder names
 * [a-z0-9_] and at most 15 bytes. *out is malloc'd (caller frees). */
int bench_combos_parse(const char *decoders, const char *temps, const char *budgets,
                       BenchCombo **out, int *n, RsErr *e);
int bench_combo_eq(const BenchCombo *a, const BenchCombo *b);
/* A budget as the summary and messages show it: "-" (AR), "auto", or the number; buf
 * holds at least 16 bytes. */
const char *bench_budget_str(int budget, char *buf);
/* Canonical display order: ar, draft, pearl, rootdraw, root, others by name; then T, B. */
int bench_combo_cmp(const BenchCombo *a, const BenchCombo *b);

/* One planned decode. */
typedef struct {
    int prompt;     /* index into the prompt file */
    int prompt_pos; /* position in the shuffled prompt order */
    int combo;      /* index into the combination list */
    int run_index;  /* index among measured runs (-1 for warm-up runs) */
    int rep;        /* repetition of this (prompt, combination), 0..repeats-1 */
    int warmup;     /* 1: warm-up decode, not logged */
} BenchRun;

typedef struct {
    int n_prompts, n_combos, n_warmup, repeats;
    uint64_t seed;
    int *order;     // (n_prompts) prompt index at shuffled position k
    int n_runs;     /* n_warmup*n_combos warm-up runs first, then
                       n_prompts*repeats*n_combos */
    BenchRun *runs; // (n_runs)
} BenchPlan;

/* Shuffles prompts with Fisher-Yates driven by rng_seed(seed); the prompt at position k
 * runs combinations (k + r + j) mod n_combos for j = 0..n_combos-1 in its repetition r =
 * 0..repeats-1 (the repetitions of a prompt follow one another, so a decoder and its AR
 * pair stay close in time, each repetition in another order). Warm-up: the prompts at
 * positions 0..n_warmup-1 first run every combination once more, in the order of their
 * first repetition, flagged warmup (DESIGN.md §6 uses n_warmup = 2; capped at n_prompts). */
BenchPlan *bench_plan_create(int n_prompts, int n_combos, int n_warmup, int repeats,
                             uint64_t seed);
void bench_plan_destroy(BenchPlan **p);

/* Tokens counted for speed: output up to and including the first token in eos (n_eos ids);
 * *hit_eos (if non-NULL) says whether one was found. */
int bench_count_tokens(const int *out, int n, const int *eos, int n_eos, int *hit_eos);
/* tokens / seconds; 0 when time_ns == 0. */
double bench_speed(int64_t tokens, int64_t time_ns);

/* Percentile of sorted values (n >= 1), p in [0, 1], by linear interpolation between closest
 * ranks: h = (n-1) p, v[floor h] + (h - floor h)(v[floor h + 1] - v[floor h]) (numpy's
 * default "linear" method, Hyndman-Fan type 7). */
double bench_percentile(const double *sorted, int n, double p);
/* v (n) sorted ascending, in place. */
void bench_sort(double *v, int n);

/* Resample draw: index in [0, n) from one rng_next() as floor(x * n / 2^64). */
typedef struct {
    double est;     /* point estimate on all prompts */
    double lo, hi;  /* 95% percentile interval (2.5th and 97.5th percentiles) */
    int n;          /* prompts */
} BenchInterval;

/* Paired bootstrap of prompts for the gain of A over B: speed(A)/speed(B) - 1, where speed is
 * the run speed (summed tokens / summed time) over the resampled prompts with multiplicity.
 * tok_*, ns_* are per prompt (n), paired by index; times must be > 0. Each resample draws n
 * indices. Deterministic for (seed, n_resamples, data). */
int bench_gain_bootstrap(const double *tok_a, const double *ns_a, const double *tok_b,
                         const double *ns_b, int n, int n_resamples, uint64_t seed,
                         BenchInterval *out, RsErr *e);
/* Bootstrap of prompts for one run speed (tokens/s), for interval bars. */
int bench_speed_bootstrap(const double *tok, const double *ns, int n, int n_resamples,
                          uint64_t seed, BenchInterval *out, RsErr *e);
/* Per-prompt speedup over AR: ratio[i] = speed_i(A) / speed_i(AR). */
void bench_speedup_per_prompt(const double *tok_a, const double *ns_a, const double *tok_ar,
                              const double *ns_ar, int n, double *ratio);

#endif
