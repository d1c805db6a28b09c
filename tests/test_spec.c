/* Speculative core: T=0 token identity with AR for every decoder, T=1 exactness of the
 * first three tokens against the target's law computed by enumeration (and a wrong
 * verifier that must fail), tree properties on real pools, and realised acceptance vs tau.
 * Models are tiny random ones built in memory, so the reference is plain AR decoding of the
 * same target (an independent code path: one-token passes, no pool, no tree mask). */
#include "common/logits.h"
#include "draft_proc/drafter_impl.h"
#include "draft_proc/model_drafter.h"
#include "draft_proc/suffix_drafter.h"
/* The instrumented backend below (counting_ops) is a backend of its own: it fills an ops
 * table, so like any backend it includes the implementation header. */
#include "kernels/backend_impl.h"
#include "target_proc/decode.h"
#include "testutil.h"
#include <math.h>
#include <string.h>

typedef struct {
    Model *tm, *dm;
    int dm_is_view;
    Target *t;
    Drafter *d;     /* the model drafter (owned by front when threaded) */
    Drafter *front; /* what the decode gets: d, or the threaded kind around it */
} Pair;

/* kind 0: independent random drafter; 1: layer-0 view of a 2-layer target;
 * 2: the target itself as drafter (deep acceptance); 3: the suffix drafter. threaded: the engine's worker-thread
 * client (identity tests) or the synchronous one (the 100,000 tiny exactness decodes). */
static void pair_open_kv(Pair *p, int kind, int vocab, int dim, uint64_t seed, int threaded,
                         int kv) {
    memset(p, 0, sizeof *p);
    RsErr e = {0};
    p->tm = tu_random_model(ARCH_LLAMA, dim, 2 * dim, 2, 4, 2, vocab, seed);
    if (kind == 0) p->dm = tu_random_model(ARCH_LLAMA, dim, 2 * dim, 1, 4, 2, vocab, seed + 99);
    else if (kind == 1) {
        ck_assert_int_eq(model_layer_view(p->tm, "0", &p->dm, &e), 0);
        p->dm_is_view = 1;
    }
    int eog = -1;
    ck_assert_msg(target_create(p->tm, &cpu_backend_ops, TU_BP(kv, 1), &eog, 0, &p->t, &e) == 0,
                  "%s", e.msg);
    if (kind == 3)
        ck_assert_msg(drafter_suffix_create(vocab, NULL, 0, NULL, &p->d, &e) == 0, "%s", e.msg);
    else
        ck_assert_msg(drafter_model_create(kind == 2 ? p->tm : p->dm, &cpu_backend_ops,
                                           TU_BP(kv, 1), &p->d, &e) == 0,
                      "%s", e.msg);
    p->front = p->d;
    if (threaded) ck_assert_int_eq(drafter_threaded_create(p->d, &p->front, &e), 0);
}

static void pair_open_t(Pair *p, int kind, int vocab, int dim, uint64_t seed, int threaded) {
    pair_open_kv(p, kind, vocab, dim, seed, threaded, 512);
}

static void pair_open(Pair *p, int kind, int vocab, int dim, uint64_t seed) {
    pair_open_t(p, kind, vocab, dim, seed, 1);
}

static void pair_close(Pair *p) {
    drafter_destroy(&p->front); /* and p->d, which it owns or is */
    p->d = NULL;
    target_destroy(&p->t);
    model_destroy(&p->dm);
    model_destroy(&p->tm);
}

/* --budget auto in the tests below: run_law() gives decodes this planner (NULL: fixed B). */
static Planner *g_planner;
/* --pool-shape in the tests below: depth and width run_law() asks for (0: the defaults). */
static int g_depth, g_width;
/* exactness_law(): the drafter behind the threaded kind (it runs ahead between rounds), and
 * that drafter's run-ahead counters when it closes */
static int g_threaded;
static DrafterAheadStats g_ahead;

/* One decode under the law smp. */
static int run_law(Pair *p, DecoderKind decoder, int B, const Sampling *smp, uint64_t seed, uint64_t pid,
                   const int *prompt, int n, int max_new, int *out, const DecodeHooks *h,
                   int wrong) {
    DecodeOpts opts = {.decoder = decoder, .budget = B, .sampling = *smp, .seed = seed, .prompt_id = pid,
                       .max_new = max_new, .test_wrong_x1 = wrong,
                       .planner = decoder == DECODER_AR ? NULL : g_planner, .pool_depth = g_depth,
                       .pool_width = g_width};
    DecodeResult res = {0};
    int buf[512];
    res.tokens = buf;
    res.cap = max_new + ROUND_MAX_EMIT;
    RsErr e = {0};
    int rc = decode_run(p->t, decoder == DECODER_AR ? NULL : p->front, prompt, n, &opts, h, &res, &e);
    ck_assert_msg(rc == 0, "decode failed: %s", e.msg);
    int m = res.n_tokens < max_new ? res.n_tokens : max_new;
    memcpy(out, buf, sizeof(int) * (size_t)m);
    return m;
}

/* One decode at the 0/1 temperature. */
static int run(Pair *p, DecoderKind decoder, int B, int temp, uint64_t seed, uint64_t pid, const int *prompt,
               int n, int max_new, int *out, const DecodeHooks *h, int wrong) {
    Sampling smp = sampling_from_temp(temp);
    return run_law(p, decoder, B, &smp, seed, pid, prompt, n, max_new, out, h, wrong);
}

START_TEST(test_greedy_identity) {
    /* Every decoder at B=8 and B=59 emits exactly AR's greedy tokens on 8 prompts, for an
     * independent drafter, a layer-subset drafter, and a perfect drafter. */
    const DecoderKind rules[] = {DECODER_DRAFT, DECODER_PEARL, DECODER_ROOTDRAW, DECODER_ROOT};
    for (int kind = 0; kind < 3; kind++) {
        Pair p;
        pair_open(&p, kind, 64, 32, 1234 + kind);
        Rng r;
        rng_seed(&r, 77 + kind);
        for (int pr = 0; pr < 8; pr++) {
            int prompt[12], n = 3 + pr % 8;
            for (int i = 0; i < n; i++) prompt[i] = (int)(rng_next(&r) % 64);
            int ref[64], got[64];
            int nref = run(&p, DECODER_AR, 8, 0, 1, pr, prompt, n, 40, ref, NULL, 0);
            ck_assert_int_eq(nref, 40);
            for (int ri = 0; ri < 4; ri++)
                for (int b = 0; b < 2; b++) {
                    int B = b ? 59 : 8;
                    int ng = run(&p, rules[ri], B, 0, 1, pr, prompt, n, 40, got, NULL, 0);
                    ck_assert_int_eq(ng, nref);
                    for (int i = 0; i < nref; i++)
                        ck_assert_msg(got[i] == ref[i],
                                      "drafter kind %d, %s B=%d prompt %d: token %d is %d, AR %d",
                                      kind, decoder_name(rules[ri]), B, pr, i, got[i], ref[i]);
                }
        }
        pair_close(&p);
    }
}
END_TEST

/* Exact law of the first three tokens after `prompt` under target sampling with the law
 * smp (the plain reference tu_sampling_probs of each full row), by enumeration with
 * one-token passes on a fresh backend. law: (V^3). */
static void exact_law(const Model *m, const int *prompt, int n, const Sampling *smp, double *law) {
    int V = m->cfg.vocab_size;
    RsErr e = {0};
    Backend *b;
    BackendParams bp = {.kv_capacity = 64, .max_batch = 16, .max_pending = 16, .threads = 1};
    ck_assert(backend_create(&cpu_backend_ops, m, &bp, &b, &e) == 0);
    float *row = malloc(sizeof(float) * V);
    double *p1 = malloc(sizeof(double) * V), *p2 = malloc(sizeof(double) * V),
           *p3 = malloc(sizeof(double) * V);
    int pos[16], keep[16], toks[16];
    for (int i = 0; i < n; i++) {
        pos[i] = i;
        keep[i] = i;
        toks[i] = prompt[i];
    }
    int last = n - 1;
    ck_assert(backend_forward(b, toks, pos, n, NULL, &last, 1, row, &e) == 0);
    ck_assert(backend_kv_commit(b, keep, n, &e) == 0);
    tu_sampling_probs(row, V, smp, p1);
    for (int a = 0; a < V; a++) {
        int pa = n, z = 0;
        ck_assert(backend_forward(b, &a, &pa, 1, NULL, &z, 1, row, &e) == 0);
        ck_assert(backend_kv_commit(b, &z, 1, &e) == 0);
        tu_sampling_probs(row, V, smp, p2);
        for (int c = 0; c < V; c++) {
            int pc = n + 1;
            ck_assert(backend_forward(b, &c, &pc, 1, NULL, &z, 1, row, &e) == 0);
            ck_assert(backend_kv_commit(b, NULL, 0, &e) == 0);
            tu_sampling_probs(row, V, smp, p3);
            for (int d = 0; d < V; d++) law[(a * V + c) * V + d] = p1[a] * p2[c] * p3[d];
        }
        /* drop the committed `a`: rebuild the prompt */
        backend_kv_reset(b);
        ck_assert(backend_forward(b, toks, pos, n, NULL, NULL, 0, NULL, &e) == 0);
        ck_assert(backend_kv_commit(b, keep, n, &e) == 0);
    }
    free(row);
    free(p1);
    free(p2);
    free(p3);
    backend_destroy(&b);
}

/* Upper tail of chi-square via the Wilson-Hilferty normal approximation (df >= 10). */
static double chi2_sf(double x, int df) {
    double k = df, z = (cbrt(x / k) - (1 - 2 / (9 * k))) / sqrt(2 / (9 * k));
    return 0.5 * erfc(z / sqrt(2.0));
}

/* Chi-square of counts vs law, pooling cells with expected count < 5 into one bin. */
static double chi2_pvalue(const long *count, const double *law, int cells, long N, int *df_out) {
    double x = 0, pooled_e = 0;
    long pooled_o = 0;
    int bins = 0;
    for (int i = 0; i < cells; i++) {
        double ex = law[i] * N;
        if (ex < 5) {
            pooled_e += ex;
            pooled_o += count[i];
            continue;
        }
        x += (count[i] - ex) * (count[i] - ex) / ex;
        bins++;
    }
    if (pooled_e > 0) {
        x += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
        bins++;
    }
    *df_out = bins - 1;
    return chi2_sf(x, bins - 1);
}

#define EXACT_N 20000
/* Decodes of 3 tokens under smp with drafter `kind` (pair_open_kv; the suffix drafter gets
 * a prompt that repeats, so its pools are not empty; with g_planner set, B is the
 * planner's cap) vs the exact law of smp: *pval; with plain_pval, also the p-value of the
 * same counts against plain T=1 sampling (the test can tell the laws apart). */
static void exactness_law(int kind, DecoderKind decoder, int B, const Sampling *smp, long N, int wrong,
                          double *pval, double *plain_pval) {
    Pair p;
    const int V = 10;
    pair_open_t(&p, kind, V, 16, 4242, g_threaded);
    int rep[] = {1, 5, 7, 2, 1, 5, 7, 2, 1, 5, 7}, n_prompt = kind == 3 ? 11 : 3;
    const int *prompt = kind == 3 ? rep : (const int[]){1, 5, 7};
    double *law = malloc(sizeof(double) * V * V * V);
    exact_law(p.tm, prompt, n_prompt, smp, law);
    long *count = calloc(V * V * V, sizeof(long));
    for (long s = 0; s < N; s++) {
        int out[3];
        int n = run_law(&p, decoder, B, smp, 1000 + (uint64_t)s, 0, prompt, n_prompt, 3, out, NULL,
                        wrong);
        ck_assert_int_eq(n, 3);
        count[(out[0] * V + out[1]) * V + out[2]]++;
    }
    int df;
    char what[SAMPLING_STR];
    *pval = chi2_pvalue(count, law, V * V * V, N, &df);
    char shape[32] = "";
    if (g_depth) snprintf(shape, sizeof shape, " pools %d,%d", g_depth, g_width);
    fprintf(stderr, "exactness %s %s B=%d%s %s%s: %ld decodes, chi-square df=%d, p=%.4g\n",
            kind == 3 ? "suffix" : "model", decoder_name(decoder), B, shape,
            sampling_str(smp, what, sizeof what),
            wrong ? " (WRONG verifier)" : g_planner ? " auto" : "", N, df, *pval);
    if (plain_pval) {
        exact_law(p.tm, prompt, n_prompt, &SAMPLING_PLAIN, law);
        *plain_pval = chi2_pvalue(count, law, V * V * V, N, &df);
        fprintf(stderr, "  the same counts against plain T=1 sampling: p=%.4g\n", *plain_pval);
    }
    free(count);
    free(law);
    g_ahead = drafter_ahead_stats(p.front);
    pair_close(&p);
}

static void exactness_case(DecoderKind decoder, int B, int wrong, double *pval) {
    exactness_law(1, decoder, B, &SAMPLING_PLAIN, EXACT_N, wrong, pval, NULL);
}

static const DecoderKind ALL_RULES[] = {DECODER_AR, DECODER_DRAFT, DECODER_PEARL, DECODER_ROOTDRAW, DECODER_ROOT};

START_TEST(test_t1_exactness) {
    double pv;
    exactness_case(ALL_RULES[_i], _i % 2 ? 8 : 4, 0, &pv);
    ck_assert_msg(pv > 1e-3, "%s: T=1 law differs from the target's (p=%g)",
                  decoder_name(ALL_RULES[_i]), pv);
}
END_TEST

/* Filtered laws, scaled to the 10-token vocabulary: T=0.7 with top-k 6 and top-p 0.9, and
 * T=1.3 with min-p 0.1; each decoder's first three tokens follow the transformed law, and
 * the counts tell it from plain sampling's. */
#define SAMPLED_N 4000
static const Sampling SAMPLED_LAWS[2] = {{0.7, 6, 0.9, 0}, {1.3, 0, 0, 0.1}};

START_TEST(test_sampling_exactness) {
    const Sampling *smp = &SAMPLED_LAWS[_i / 5];
    DecoderKind decoder = ALL_RULES[_i % 5];
    double pv, plain;
    exactness_law(1, decoder, _i % 2 ? 8 : 4, smp, SAMPLED_N, 0, &pv, &plain);
    char what[SAMPLING_STR];
    sampling_str(smp, what, sizeof what);
    ck_assert_msg(pv > 1e-3, "%s %s: law differs from the target's transformed one (p=%g)",
                  decoder_name(decoder), what, pv);
    ck_assert_msg(plain < 1e-3, "%s %s: counts fit plain T=1 sampling too (p=%g): the law's "
                  "filters do not bite here", decoder_name(decoder), what, plain);
}
END_TEST

START_TEST(test_t1_wrong_verifier_fails) {
    double pv;
    exactness_case(DECODER_ROOTDRAW, 4, 1, &pv);
    ck_assert_msg(pv < 1e-3, "a verifier drawing X1 from the draft row passed (p=%g)", pv);
}
END_TEST

/* ---- properties on real pools ---------------------------------------------------- */

static int ancestor_closed(const Pool *p, const Selection *sel) {
    for (int k = 0; k < sel->t.n; k++) {
        int par = sel->t.parent[k];
        if (par >= k) return 0; /* parents first */
        if (k == 0 && sel->rooted_at_x1) continue;
        int u = sel->t.node[k];
        if (u < 0) return 0;
        int pu = p->parent[u];
        if (par < 0 ? pu != -1 : sel->t.node[par] != pu) return 0;
    }
    return 1;
}

/* DESIGN.md §2 counts of a grown pool: 10 at depth 1, 100 at depths 2-8, 70 expanded. */
static void check_pool_counts(const Pool *p) {
    ck_assert_int_eq(p->n, POOL_MAX);
    ck_assert_int_eq(p->n_expanded, POOL_N_EXPANDED);
    int per_depth[POOL_MAX_DEPTH + 1] = {0}, expanded = 0;
    for (int i = 0; i < p->n; i++) per_depth[p->depth[i]]++;
    for (int i = 0; i < p->n; i++) expanded += p->n_children[i] > 0;
    ck_assert_int_eq(per_depth[1], 10);
    for (int dd = 2; dd <= 8; dd++) ck_assert_int_eq(per_depth[dd], 100);
    ck_assert_int_eq(expanded, 70);
}

/* A random target: rowp (n + 1, 50) a distribution at the root (row 0) and below each
 * node i (row 1 + i); path[i] = the target probability of node i's whole path. */
static void random_target(const Pool *p, Rng *r, double *rowp, double *path) {
    for (int i = 0; i <= p->n; i++) {
        double z = 0;
        for (int v = 0; v < 50; v++) z += (rowp[i * 50 + v] = pow(rng_uniform(r), 3));
        for (int v = 0; v < 50; v++) rowp[i * 50 + v] /= z;
    }
    for (int i = 0; i < p->n; i++) {
        int par = p->parent[i];
        double tp = rowp[(par + 1) * 50 + p->token[i]];
        path[i] = (par < 0 ? 1 : path[par]) * tp;
    }
}

/* rootdraw's tree: X1 and min(B - 1, X1's descendants) when X1 is in the pool, else X1
 * alone (and PEARL's too). */
static void check_rootdraw_size(const Pool *p, const Selection *sel, int B) {
    if (!sel[DECODER_ROOTDRAW].x1_in_pool) {
        ck_assert_int_eq(sel[DECODER_ROOTDRAW].t.n, 1);
        ck_assert_int_eq(sel[DECODER_PEARL].t.n, 1);
        return;
    }
    int x1n = sel[DECODER_ROOTDRAW].t.node[0], nd = 0;
    for (int i = 0; i < p->n; i++) {
        int a = i;
        while (a >= 0 && a != x1n) a = p->parent[a];
        nd += a == x1n && i != x1n;
    }
    ck_assert_int_eq(sel[DECODER_ROOTDRAW].t.n, 1 + (nd < B - 1 ? nd : B - 1));
}

/* Expected acceptance of selection s under the target rows rowp (random_target). */
static double selection_tau(const Pool *p, const Selection *sel, const double *rowp, int x1) {
    double tr[TREE_MAX];
    for (int j = 0; j < sel->t.n; j++) {
        int u = sel->t.node[j];
        int tok = u < 0 ? x1 : p->token[u];
        int par = sel->t.parent[j];
        int prow = par < 0 ? 0 : 1 + sel->t.node[par];
        if (j == 0 && sel->rooted_at_x1) prow = 0;
        tr[j] = rowp[prow * 50 + tok];
    }
    return tree_tau(sel, tr);
}

/* Tie-breaking: the draft tree is exactly the first B of a brute-force ranking. */
static void check_draft_order(const Pool *p, const Selection *draft, int B) {
    int idx[POOL_MAX];
    for (int i = 0; i < p->n; i++) idx[i] = i;
    for (int i = 1; i < p->n; i++) /* insertion sort by pool_rank_cmp */
        for (int j = i; j > 0 && pool_rank_cmp(p, idx[j], idx[j - 1]) < 0; j--) {
            int t = idx[j];
            idx[j] = idx[j - 1];
            idx[j - 1] = t;
        }
    for (int j = 0; j < B; j++) ck_assert_int_eq(draft->t.node[j], idx[j]);
}

/* Every rule's tree at budget B against one pool and random target: ancestor-closed,
 * sized as DESIGN.md says, and ordered by expected acceptance where theory orders it. */
static void check_rules(const Pool *p, const double *rowp, const double *path, int x1,
                        int B, int round) {
    float p0[50];
    for (int v = 0; v < 50; v++) p0[v] = (float)rowp[v];
    Selection sel[DECODER_COUNT];
    select_draft(p, B, &sel[DECODER_DRAFT]);
    select_pearl(p, B, x1, &sel[DECODER_PEARL]);
    select_rootdraw(p, B, x1, &sel[DECODER_ROOTDRAW]);
    select_root(p, B, p0, x1, &sel[DECODER_ROOT]);
    select_oracle(p, B, path, &sel[DECODER_ORACLE]);
    for (int k = DECODER_DRAFT; k < DECODER_COUNT; k++)
        ck_assert_msg(ancestor_closed(p, &sel[k]), "%s tree not ancestor-closed",
                      decoder_name((DecoderKind)k));
    ck_assert_int_eq(sel[DECODER_DRAFT].t.n, B);
    ck_assert_int_eq(sel[DECODER_ROOT].t.n, B);
    ck_assert_int_eq(sel[DECODER_ORACLE].t.n, B);
    ck_assert_int_le(sel[DECODER_PEARL].t.n, B);
    check_rootdraw_size(p, sel, B);
    double tau[DECODER_COUNT];
    for (int k = DECODER_DRAFT; k < DECODER_COUNT; k++) tau[k] = selection_tau(p, &sel[k], rowp, x1);
    ck_assert_msg(tau[DECODER_ROOTDRAW] >= tau[DECODER_PEARL] - 1e-12,
                  "round %d B=%d: rootdraw tau %g < pearl tau %g", round, B,
                  tau[DECODER_ROOTDRAW], tau[DECODER_PEARL]);
    ck_assert_msg(tau[DECODER_DRAFT] <= tau[DECODER_ORACLE] + 1e-12,
                  "round %d B=%d: draft tau %g > oracle tau %g", round, B, tau[DECODER_DRAFT],
                  tau[DECODER_ORACLE]);
    ck_assert_msg(tau[DECODER_ROOT] <= tau[DECODER_ORACLE] + 1e-12, "root tau > oracle");
    check_draft_order(p, &sel[DECODER_DRAFT], B);
}

START_TEST(test_tree_properties) {
    RsErr e = {0};
    Model *dm = tu_random_model(ARCH_LLAMA, 32, 64, 1, 4, 2, 50, 9);
    Drafter *d;
    ck_assert(drafter_model_create(dm, &cpu_backend_ops, TU_BP(512, 1), &d, &e) == 0);
    Pool *p = malloc(sizeof(Pool));
    Rng r;
    rng_seed(&r, 5);
    int toks[4] = {3, 4, 5, 6};
    double *rowp = malloc(sizeof(double) * 50 * (POOL_MAX + 1)), path[POOL_MAX];
    for (int round = 0; round < 30; round++) {
        toks[0] = (int)(rng_next(&r) % 50);
        ck_assert_msg(drafter_commit_grow(d, toks, round == 0 ? 4 : 1, p, &e) == 0, "%s",
                      e.msg);
        check_pool_counts(p);
        random_target(p, &r, rowp, path);
        int x1 = round % 3 == 0 ? 49 - p->token[0] % 5 : p->token[round % 10];
        static const int budgets[] = {8, 59, 64};
        for (int b = 0; b < 3; b++) check_rules(p, rowp, path, x1, budgets[b], round);
    }
    free(rowp);
    free(p);
    drafter_destroy(&d);
    model_destroy(&dm);
}
END_TEST


/* ---- pool shape (DESIGN.md §2) and the oracle (DESIGN.md §3) ---- */

/* The CPU backend with every forward() recorded, to count the drafter's passes. */
static int g_fwd_n, g_fwd_tokens[32];
static BackendOps counting_ops;
static int counting_create(const Model *m, const BackendParams *bp, Backend **out, RsErr *e) {
    int rc = cpu_backend_ops.create(m, bp, out, e);
    if (!rc) (*out)->ops = &counting_ops;
    return rc;
}
static int counting_forward(Backend *b, const int *tokens, const int *pos, int n,
                            const uint8_t *mask, const int *out_rows, int n_out, float *logits,
                            RsErr *e) {
    if (g_fwd_n < 32) g_fwd_tokens[g_fwd_n] = n;
    g_fwd_n++;
    return cpu_backend_ops.forward(b, tokens, pos, n, mask, out_rows, n_out, logits, e);
}

/* DESIGN.md §2: the commit pass, then 7 passes of 10 tokens (all 10 depth-1 candidates, then the
 * 10 best new candidates by draft score after each of steps 1..6): 8 passes counting the
 * commit pass, 70 expanded; the expanded nodes of each depth are exactly its top 10 by
 * score (ties by pool index), none at depth 8; between rounds the drafter's KV cache holds
 * only committed tokens. */
/* Pool shapes (depth, width), the full one first. */
static const int SHAPES[][2] = {{8, 10}, {5, 1}, {4, 3}, {1, 10}};

/* Tokens of a commit whose rows the drafter keeps from pool p: the longest prefix that
 * follows expanded nodes from the root. */
static int expanded_prefix(const Pool *p, const int *toks, int n) {
    int m = 0, first = p->root_first_child, count = p->root_n_children;
    while (m < n) {
        int u = -1;
        for (int k = 0; k < count && u < 0; k++)
            if (p->token[first + k] == toks[m]) u = first + k;
        if (u < 0 || !p->n_children[u]) break;
        m++;
        first = p->first_child[u];
        count = p->n_children[u];
    }
    return m;
}

/* drafter_set_shape: depth - 1 expansion passes of `width` rows; the depth-1 level's
 * `width` best and then each level's `width` best by the ranking get 10 children each,
 * no other node any; every candidate of depth <= the asked depth. The commit pass runs the
 * tokens whose rows the last pool's expansions did not compute. */
START_TEST(test_pool_growth_shape) {
    int depth = SHAPES[_i][0], width = SHAPES[_i][1];
    counting_ops = cpu_backend_ops;
    counting_ops.create = counting_create;
    counting_ops.forward = counting_forward;
    RsErr e = {0};
    Model *dm = tu_random_model(ARCH_LLAMA, 32, 64, 1, 4, 2, 50, 21);
    Drafter *d;
    ck_assert(drafter_model_create(dm, &counting_ops, TU_BP(512, 1), &d, &e) == 0);
    if (_i) drafter_set_shape(d, depth, width);
    Pool *p = malloc(sizeof(Pool));
    int toks[4] = {3, 4, 5, 6}, committed = 0, kept = 0;
    for (int round = 0; round < 6; round++) {
        int n = round == 0 ? 4 : 1 + round % 3, keep = round ? expanded_prefix(p, toks, n) : 0;
        kept += keep;
        g_fwd_n = 0;
        ck_assert_msg(drafter_commit_grow(d, toks, n, p, &e) == 0, "%s", e.msg);
        committed += n;
        ck_assert_int_eq(model_drafter_n_committed(d), committed);
        int pass = keep < n; /* a commit ending on an expanded node runs no commit pass */
        ck_assert_int_eq(g_fwd_n, depth - 1 + pass);
        if (pass) ck_assert_int_eq(g_fwd_tokens[0], n - keep);
        for (int k = 1; k < depth; k++) ck_assert_int_eq(g_fwd_tokens[k - 1 + pass], width);
        ck_assert_int_eq(p->n_passes, depth);
        ck_assert_int_eq(p->n_expanded, (depth - 1) * width);
        ck_assert_int_eq(p->n, POOL_TOPK + (depth - 1) * width * POOL_TOPK);
        for (int dep = 1; dep <= POOL_MAX_DEPTH; dep++) {
            int idx[POOL_MAX], m = 0;
            for (int i = 0; i < p->n; i++)
                if (p->depth[i] == dep) idx[m++] = i;
            for (int i = 1; i < m; i++) /* insertion sort: score desc, pool index asc */
                for (int j = i; j > 0 && (p->score[idx[j]] > p->score[idx[j - 1]] ||
                                          (p->score[idx[j]] == p->score[idx[j - 1]] &&
                                           idx[j] < idx[j - 1]));
                     j--) {
                    int t = idx[j];
                    idx[j] = idx[j - 1];
                    idx[j - 1] = t;
                }
            for (int r = 0; r < m; r++) {
                int want = dep < depth && r < width ? POOL_TOPK : 0;
                ck_assert_msg(p->n_children[idx[r]] == want,
                              "depth %d rank %d (pool %d): %d children, want %d", dep, r, idx[r],
                              p->n_children[idx[r]], want);
            }
        }
        /* pool index = creation order: depth never decreases along the pool */
        for (int i = 1; i < p->n; i++) ck_assert_int_ge(p->depth[i], p->depth[i - 1]);
        for (int k = 0; k < 4; k++) toks[k] = p->token[(round * 7 + k) % 10];
    }
    ck_assert_int_eq(drafter_ahead_stats(d).rows_kept, kept);
    ck_assert_msg(kept > 0 || _i, "full pools: no commit followed an expansion");
    free(p);
    drafter_destroy(&d);
    model_destroy(&dm);
}
END_TEST

/* The oracle against brute force: on small pools, the largest expected acceptance of any
 * ancestor-closed set of B candidates, with continuous path masses and with 0/1 masses
 * (greedy, many ties). */
START_TEST(test_oracle_brute_force) {
    static const int parent[] = {-1, -1, -1, -1, 0, 0, 0, 1, 1, 4, 4, 7, 9, 9, 12, 12};
    enum { N = 16 };
    Pool *p = calloc(1, sizeof(Pool));
    Rng r;
    rng_seed(&r, 8);
    for (int trial = 0; trial < 60; trial++) {
        p->n = N;
        for (int i = 0; i < N; i++) {
            p->parent[i] = parent[i];
            p->depth[i] = parent[i] < 0 ? 1 : p->depth[parent[i]] + 1;
            p->token[i] = i;
            p->logq[i] = (float)log(0.05 + rng_uniform(&r));
            if (p->logq[i] > 0) p->logq[i] = 0;
        }
        ck_assert(pool_finalize(p, 64, NULL) == 0);
        double trans[N], path[N];
        for (int i = 0; i < N; i++) {
            trans[i] = trial % 3 == 2 ? (double)(rng_next(&r) % 2) : rng_uniform(&r);
            path[i] = (parent[i] < 0 ? 1.0 : path[parent[i]]) * trans[i];
        }
        for (int B = 1; B <= 9; B++) {
            double best = -1;
            for (unsigned mask = 1; mask < (1u << N); mask++) {
                if (__builtin_popcount(mask) != B) continue;
                double v = 0;
                int ok = 1;
                for (int i = 0; i < N && ok; i++)
                    if (mask >> i & 1) {
                        ok = parent[i] < 0 || (mask >> parent[i] & 1);
                        v += path[i];
                    }
                if (ok && v > best) best = v;
            }
            Selection sel;
            select_oracle(p, B, path, &sel);
            ck_assert_int_eq(sel.t.n, B);
            ck_assert(ancestor_closed(p, &sel));
            double tr[TREE_MAX];
            for (int k = 0; k < sel.t.n; k++) tr[k] = trans[sel.t.node[k]];
            double got = tree_tau(&sel, tr);
            ck_assert_msg(fabs(got - best) <= 1e-12, "trial %d B=%d: oracle %g, best %g", trial,
                          B, got, best);
        }
    }
    free(p);
}
END_TEST

typedef struct {
    double sum_acc, sum_acc2, sum_tau;
    long n;
} AccStats;

static void on_round_acc(void *u, const RoundInfo *r) {
    AccStats *s = u;
    if (isnan(r->tau) || r->fallback_ar) return;
    s->sum_acc += r->accepted;
    s->sum_acc2 += (double)r->accepted * r->accepted;
    s->sum_tau += r->tau;
    s->n++;
}

START_TEST(test_realised_vs_tau) {
    const DecoderKind rules[] = {DECODER_DRAFT, DECODER_ROOTDRAW, DECODER_PEARL};
    Pair p;
    pair_open(&p, 1, 32, 32, 99);
    for (int ri = 0; ri < 3; ri++) {
        AccStats st = {0};
        DecodeHooks h = {.on_round = on_round_acc, .user = &st};
        int prompt[4] = {1, 2, 3, 4}, out[64];
        for (int s = 0; s < 150; s++) run(&p, rules[ri], 8, 1, 500 + s, s, prompt, 4, 24, out, &h, 0);
        double ma = st.sum_acc / st.n, mt = st.sum_tau / st.n;
        double sd = sqrt(st.sum_acc2 / st.n - ma * ma), se = sd / sqrt((double)st.n);
        fprintf(stderr, "%s: %ld rounds, mean accepted %.4f, mean tau %.4f, se %.4f\n",
                decoder_name(rules[ri]), st.n, ma, mt, se);
        ck_assert_msg(fabs(ma - mt) <= 3 * se, "%s: mean accepted %.4f vs tau %.4f (se %.4f)",
                      decoder_name(rules[ri]), ma, mt, se);
    }
    pair_close(&p);
}
END_TEST


/* ---- round-level SPEC checks: stop rule, X1, root skip, KV contents, pool shape ---- */

typedef struct {
    int max_new, rounds, total, after_limit, max_emit, bad;
    int last_emit;       /* tokens the output took from the last round */
    int produced, dropped; /* tokens the rounds verified; of them, not output */
    DecoderKind decoder;
    int B, skips, x1_off, rounds_tree;
    char why[200];
} RoundCheck;

static void round_check(void *u, const RoundInfo *r) {
    RoundCheck *s = u;
    /* DESIGN.md §6: no round starts once the output has reached the limit */
    if (s->total >= s->max_new) s->after_limit++;
#define BAD(...) do { if (!s->bad) snprintf(s->why, sizeof s->why, __VA_ARGS__); s->bad++; } while (0)
    /* dropped tokens (past --max-new or an EOS) end the decode, and the output takes >= 1 */
    if (s->dropped) BAD("round %d after a round that dropped tokens", r->round);
    if (r->dropped < 0 || r->dropped >= r->emitted)
        BAD("round %d: %d of %d tokens dropped", r->round, r->dropped, r->emitted);
    s->total += r->emitted - r->dropped;
    s->last_emit = r->emitted - r->dropped;
    s->produced += r->emitted;
    s->dropped += r->dropped;
    s->rounds++;
    if (r->emitted > s->max_emit) s->max_emit = r->emitted;
    if (r->fallback_ar) BAD("round %d fell back to AR", r->round);
    /* DESIGN.md §4: the round emits accepted tokens + the continuation */
    if (r->emitted != r->accepted + 1) BAD("round %d: emitted %d, accepted %d", r->round, r->emitted, r->accepted);
    if (s->decoder == DECODER_AR) return;
    if (r->tree_size < 1 || r->tree_size > s->B) BAD("round %d: tree size %d", r->round, r->tree_size);
    if (r->draft_ns == 0) BAD("round %d: no drafter time from the pool", r->round);
    int rooted = s->decoder == DECODER_PEARL || s->decoder == DECODER_ROOTDRAW;
    if (s->decoder == DECODER_DRAFT) {
        /* no root pass: the continuation is verified with the tree in one pass */
        if (r->t_root_start || r->x1_in_pool != -1 || !r->t_tree_start)
            BAD("draft round %d: root pass %d, x1_in_pool %d, tree pass %d", r->round,
                r->t_root_start != 0, r->x1_in_pool, r->t_tree_start != 0);
    } else if (!r->t_root_start || r->t_root_end < r->t_root_start) {
        BAD("round %d: no root pass", r->round);
    }
    if (rooted) {
        /* DESIGN.md §3: X1 counts as one accepted token; off the first level: X1 alone */
        if (r->accepted < 1) BAD("round %d: X1 not counted as accepted", r->round);
        if (r->x1_in_pool != 0 && r->x1_in_pool != 1) BAD("round %d: x1_in_pool %d", r->round, r->x1_in_pool);
        if (r->x1_in_pool == 0 && r->tree_size != 1) BAD("round %d: X1 off the pool, tree %d", r->round, r->tree_size);
        if (!r->t_tree_start) BAD("round %d: no tree pass", r->round);
        s->x1_off += r->x1_in_pool == 0;
    }
    if (s->decoder == DECODER_ROOT) {
        if (r->tree_size != s->B) BAD("root round %d: tree size %d", r->round, r->tree_size);
        /* DESIGN.md §3: X1 off the tree's first level is the continuation, no tree pass */
        if (r->tree_pass_skipped) {
            s->skips++;
            if (r->t_tree_start || r->emitted != 1 || r->accepted != 0)
                BAD("skipped root round %d: tree pass %d, emitted %d", r->round,
                    r->t_tree_start != 0, r->emitted);
        } else if (!r->t_tree_start || r->accepted < 1) {
            BAD("root round %d: X1 on the first level but tree pass %d, accepted %d", r->round,
                r->t_tree_start != 0, r->accepted);
        }
    }
#undef BAD
}

static int decode_logged(Pair *p, Target *t, DecoderKind decoder, int B, int temp, uint64_t seed,
                         const int *prompt, int n, int max_new, RoundCheck *lg, DecodeResult *res,
                         int *buf) {
    memset(lg, 0, sizeof *lg);
    lg->max_new = max_new;
    lg->decoder = decoder;
    lg->B = B;
    DecodeOpts opts = {.decoder = decoder, .budget = B, .sampling = sampling_from_temp(temp), .seed = seed, .prompt_id = 3,
                       .max_new = max_new};
    DecodeHooks h = {.on_round = round_check, .user = lg};
    memset(res, 0, sizeof *res);
    res->tokens = buf;
    res->cap = max_new + ROUND_MAX_EMIT;
    RsErr e = {0};
    int rc = decode_run(t, decoder == DECODER_AR ? NULL : p->front, prompt, n, &opts, &h, res, &e);
    ck_assert_msg(rc == 0, "decode failed: %s", e.msg);
    ck_assert_msg(lg->bad == 0, "%s T=%d B=%d: %s", decoder_name(decoder), temp, B, lg->why);
    return res->n_tokens;
}

/* Stop rule: a decode stops after the round in which its output reaches the limit (that
 * round verifies at most limit - 1 + 9 tokens: 8 accepted + the continuation), never
 * earlier, and no round starts after it; --max-new is an exact cap: the output is cut back
 * to the limit and the round log counts the tokens dropped.
 * DESIGN.md §4/§2 KV contents: the target keeps root + accepted path (its committed context is
 * the prompt and the output minus its last token: nothing past the cut is committed), the
 * drafter keeps only committed tokens (every round's tokens but the last, which it is
 * never sent). */
START_TEST(test_stop_rule_and_kv) {
    for (int kind = 2; kind >= 0; kind -= 2) {
        Pair p;
        pair_open(&p, kind, 64, 32, 555 + kind);
        int prompt[5] = {3, 9, 27, 17, 51}, buf[512];
        int limits[3] = {1, 10, 23};
        int overshoot = 0;
        for (int ri = 0; ri < 5; ri++)
            for (int temp = 0; temp < 2; temp++)
                for (int b = 0; b < 2; b++)
                    for (int li = 0; li < 3; li++) {
                        int B = b ? 59 : 8, lim = limits[li];
                        RoundCheck lg;
                        DecodeResult res;
                        decode_logged(&p, p.t, ALL_RULES[ri], B, temp, 7 + li, prompt, 5, lim,
                                      &lg, &res, buf);
                        const char *nm = decoder_name(ALL_RULES[ri]);
                        ck_assert_msg(lg.after_limit == 0, "%s: a round started after the limit", nm);
                        ck_assert_int_eq(res.n_tokens, lg.total);
                        ck_assert_int_eq(res.rounds, lg.rounds);
                        ck_assert_msg(lg.total == lim, "%s T=%d B=%d limit %d: %d tokens", nm,
                                      temp, B, lim, lg.total);
                        ck_assert_msg(lg.produced >= lim &&
                                          lg.produced <= lim - 1 + POOL_MAX_DEPTH + 1,
                                      "%s T=%d B=%d limit %d: %d tokens verified", nm, temp, B,
                                      lim, lg.produced);
                        ck_assert_int_eq(lg.produced - lg.dropped, lg.total);
                        ck_assert_int_le(lg.max_emit, POOL_MAX_DEPTH + 1);
                        overshoot |= lg.produced > lim;
                        Backend *tb = target_backend(p.t);
                        ck_assert_int_eq(backend_n_pending(tb), 0);
                        ck_assert_msg(backend_n_committed(tb) == 5 - 1 + lg.total,
                                      "%s: target KV holds %d entries, want %d", nm,
                                      backend_n_committed(tb), 5 - 1 + lg.total);
                        if (ALL_RULES[ri] != DECODER_AR)
                            ck_assert_msg(model_drafter_n_committed(p.d) ==
                                              5 + lg.total - lg.last_emit,
                                          "%s: drafter KV holds %d committed, want %d", nm,
                                          model_drafter_n_committed(p.d),
                                          5 + lg.total - lg.last_emit);
                    }
        if (kind == 2) ck_assert_msg(overshoot, "no decode verified past its limit in its last round");
        pair_close(&p);
    }
}
END_TEST

/* DESIGN.md §6: stop at the first end-of-sequence token, counting tokens up to (and including)
 * it; tokens the round emitted after it are dropped. */
START_TEST(test_stop_at_first_eos) {
    Pair p;
    pair_open(&p, 2, 64, 32, 31);
    int prompt[4] = {5, 6, 7, 8}, ref[64], buf[512];
    int nref = run(&p, DECODER_AR, 8, 0, 1, 0, prompt, 4, 40, ref, NULL, 0);
    ck_assert_int_eq(nref, 40);
    int eos = ref[6], first = 0;
    while (ref[first] != eos) first++;
    Target *t2;
    RsErr e = {0};
    ck_assert(target_create(p.tm, &cpu_backend_ops, TU_BP(512, 1), &eos, 1, &t2, &e) == 0);
    for (int ri = 0; ri < 5; ri++)
        for (int b = 0; b < 2; b++) {
            RoundCheck lg;
            DecodeResult res;
            decode_logged(&p, t2, ALL_RULES[ri], b ? 59 : 8, 0, 1, prompt, 4, 40, &lg, &res, buf);
            ck_assert_msg(res.hit_eos && res.n_tokens == first + 1, "%s: %d tokens (EOS at %d)",
                          decoder_name(ALL_RULES[ri]), res.n_tokens, first);
            for (int i = 0; i <= first; i++) ck_assert_int_eq(buf[i], ref[i]);
            /* the EOS came in the last round */
            ck_assert_int_le(lg.total - lg.last_emit, first);
        }
    /* ignore_eos (rootspec-bench --ignore-eos): every decoder goes on past the EOS to
     * max_new tokens, AR's tokens all the way */
    for (int ri = 0; ri < 5; ri++) {
        DecodeOpts opts = {.decoder = ALL_RULES[ri], .budget = 8, .seed = 1, .max_new = 40,
                           .ignore_eos = 1};
        DecodeResult res = {.tokens = buf, .cap = 40 + ROUND_MAX_EMIT};
        Drafter *d = ALL_RULES[ri] == DECODER_AR ? NULL : p.front;
        ck_assert_msg(decode_run(t2, d, prompt, 4, &opts, NULL, &res, &e) == 0, "%s", e.msg);
        ck_assert_msg(!res.hit_eos && res.n_tokens == 40, "%s --ignore-eos: %d tokens, eos %d",
                      decoder_name(ALL_RULES[ri]), res.n_tokens, res.hit_eos);
        for (int i = 0; i < 40; i++) ck_assert_int_eq(buf[i], ref[i]);
    }
    target_destroy(&t2);
    pair_close(&p);
}
END_TEST

/* --max-new N is an exact cap for every decoder: at T=0, for N from 1 to B + 2 (B = 4: a
 * round verifies up to 5 tokens, so rounds often cross N), the output is AR's first N
 * tokens, count included. Tokens past N are dropped: counted in the round log, in neither
 * the output nor the token count speeds divide (n_tokens), and neither KV cache holds
 * anything past the cut. */
START_TEST(test_max_new_exact) {
    enum { B = 4, NP = 6 };
    int dropping = 0, decodes = 0;
    for (int kind = 0; kind < 3; kind++) {
        Pair p;
        pair_open(&p, kind, 64, 32, 900 + kind);
        for (int pr = 0; pr < 3; pr++) {
            int prompt[NP] = {3 + pr, 9, 27, 17, 51, 8 * pr}, ref[64], buf[512];
            int nref = run(&p, DECODER_AR, B, 0, 1, pr, prompt, NP, 40, ref, NULL, 0);
            ck_assert_int_eq(nref, 40);
            for (int ri = 0; ri < 5; ri++)
                for (int lim = 1; lim <= B + 2; lim++) {
                    RoundCheck lg;
                    DecodeResult res;
                    decode_logged(&p, p.t, ALL_RULES[ri], B, 0, 1, prompt, NP, lim, &lg, &res,
                                  buf);
                    const char *nm = decoder_name(ALL_RULES[ri]);
                    ck_assert_msg(res.n_tokens == lim && !res.hit_eos,
                                  "drafter %d %s --max-new %d: %d tokens", kind, nm, lim,
                                  res.n_tokens);
                    for (int i = 0; i < lim; i++)
                        ck_assert_msg(buf[i] == ref[i],
                                      "drafter %d %s --max-new %d: token %d is %d, AR %d", kind,
                                      nm, lim, i, buf[i], ref[i]);
                    ck_assert_int_eq(lg.total, lim);
                    ck_assert_int_eq(lg.produced - lg.dropped, res.n_tokens);
                    dropping += lg.dropped > 0;
                    decodes++;
                    Backend *tb = target_backend(p.t);
                    ck_assert_msg(tb->n_committed == NP - 1 + lim,
                                  "%s --max-new %d: target KV holds %d entries, want %d", nm,
                                  lim, tb->n_committed, NP - 1 + lim);
                    if (ALL_RULES[ri] != DECODER_AR)
                        ck_assert_msg(model_drafter_n_committed(p.d) == NP + lim - lg.last_emit,
                                      "%s: drafter KV holds %d committed, want %d", nm,
                                      model_drafter_n_committed(p.d), NP + lim - lg.last_emit);
                }
        }
        pair_close(&p);
    }
    fprintf(stderr, "max-new cap: %d of %d decodes dropped tokens in their last round\n",
            dropping, decodes);
    ck_assert_int_gt(dropping, 20);
}
END_TEST

/* A prompt several times longer than a round's pending entries (the target backend holds at
 * most DECODE_PASS_MAX + 2 pending; prompts over that were refused as "batch of N tokens
 * exceeds max_pending"): prefilled in chunks that fit, the output at T=0 equals AR's and
 * both KV caches hold the whole prompt. */
START_TEST(test_long_prompt) {
    enum { N = 700, MAX_NEW = 30 };
    ck_assert_int_gt(N, 2 * (DECODE_PASS_MAX + 2));
    Pair p;
    pair_open_kv(&p, 1, 64, 32, 808, 1, 1024);
    int prompt[N], ref[64], buf[512];
    Rng rg;
    rng_seed(&rg, 21);
    for (int i = 0; i < N; i++) prompt[i] = (int)(rng_next(&rg) % 64);
    int nref = run(&p, DECODER_AR, 8, 0, 1, 0, prompt, N, MAX_NEW, ref, NULL, 0);
    ck_assert_int_eq(nref, MAX_NEW);
    const DecoderKind rules[] = {DECODER_DRAFT, DECODER_ROOTDRAW}; /* root+tree in one pass; a root pass */
    for (int ri = 0; ri < 2; ri++) {
        RoundCheck lg;
        DecodeResult res;
        decode_logged(&p, p.t, rules[ri], 59, 0, 1, prompt, N, MAX_NEW, &lg, &res, buf);
        const char *nm = decoder_name(rules[ri]);
        ck_assert_int_ge(res.n_tokens, MAX_NEW);
        for (int i = 0; i < MAX_NEW; i++)
            ck_assert_msg(buf[i] == ref[i], "%s, %d-token prompt: token %d is %d, AR %d", nm, N,
                          i, buf[i], ref[i]);
        Backend *tb = target_backend(p.t);
        ck_assert_msg(backend_n_committed(tb) == N - 1 + lg.total, "%s: target KV holds %d, want %d", nm,
                      backend_n_committed(tb), N - 1 + lg.total);
        ck_assert_msg(model_drafter_n_committed(p.d) == N + lg.total - lg.last_emit,
                      "%s: drafter KV holds %d committed, want %d (the prompt and the output)",
                      nm, model_drafter_n_committed(p.d), N + lg.total - lg.last_emit);
    }
    pair_close(&p);
}
END_TEST

/* DESIGN.md §3 per-round behaviour with an independent drafter (X1 often off the first level):
 * pearl/rootdraw count X1 as accepted and verify X1 alone off the pool; root skips the
 * tree pass exactly when X1 is off its tree's first level, under T=0 and T=1. */
START_TEST(test_round_rules) {
    Pair p;
    pair_open(&p, 0, 64, 32, 4321);
    int buf[512];
    Rng rg;
    rng_seed(&rg, 12);
    int skips[2] = {0, 0}, off = 0;
    for (int pr = 0; pr < 6; pr++) {
        int prompt[6];
        for (int i = 0; i < 6; i++) prompt[i] = (int)(rng_next(&rg) % 64);
        for (int ri = 1; ri < 5; ri++)
            for (int temp = 0; temp < 2; temp++)
                for (int b = 0; b < 2; b++) {
                    RoundCheck lg;
                    DecodeResult res;
                    decode_logged(&p, p.t, ALL_RULES[ri], b ? 59 : 8, temp, 40 + pr, prompt, 6,
                                  30, &lg, &res, buf);
                    if (ALL_RULES[ri] == DECODER_ROOT) skips[temp] += lg.skips;
                    off += lg.x1_off;
                }
    }
    ck_assert_msg(skips[0] > 0 && skips[1] > 0 && off > 0,
                  "test never exercised the edge cases: root skips %d/%d, X1 off pool %d",
                  skips[0], skips[1], off);
    pair_close(&p);
}
END_TEST

/* DESIGN.md §4: realised acceptance matches tau on average, for the root rule too: it has the
 * largest gap between rounds (a skipped round accepts nothing). Every round must carry a
 * tau, or a mean over the rounds that have one is biased. */
START_TEST(test_realised_vs_tau_root) {
    Pair p;
    pair_open(&p, 1, 32, 32, 99);
    for (int B = 2; B <= 8; B += 6) {
        AccStats st = {0};
        long rounds = 0;
        int prompt[4] = {1, 2, 3, 4};
        DecodeHooks h = {.on_round = on_round_acc, .user = &st};
        for (int s = 0; s < 300; s++) {
            DecodeOpts opts = {.decoder = DECODER_ROOT, .budget = B, .sampling = SAMPLING_PLAIN, .seed = 900 + s,
                               .prompt_id = s, .max_new = 24};
            DecodeResult res = {0};
            int bb[128];
            res.tokens = bb;
            res.cap = 128;
            RsErr e = {0};
            ck_assert(decode_run(p.t, p.front, prompt, 4, &opts, &h, &res, &e) == 0);
            rounds += res.rounds;
        }
        double ma = st.sum_acc / st.n, mt = st.sum_tau / st.n;
        double sd = sqrt(st.sum_acc2 / st.n - ma * ma), se = sd / sqrt((double)st.n);
        fprintf(stderr, "root B=%d: %ld of %ld rounds with tau, mean accepted %.4f, mean tau %.4f, se %.4f\n",
                B, st.n, rounds, ma, mt, se);
        ck_assert_msg(st.n == rounds, "root B=%d: %ld of %ld rounds have no tau", B, rounds - st.n, rounds);
        ck_assert_msg(fabs(ma - mt) <= 3 * se, "root: mean accepted %.4f vs tau %.4f (se %.4f)", ma, mt, se);
    }
    pair_close(&p);
}
END_TEST

/* --score-all-rules (DESIGN.md §3's offline oracle): every rule's tau and the oracle's from one
 * pass that also covers the expanded pool nodes. The pool is captured on its way to the
 * target. At T=0 the oracle's tau has an independent value: the length (at most B) of the
 * path through the pool that spells plain greedy decoding's next tokens. At T=1 the oracle
 * is no worse than any unconditional tree, and the decoder's own tau is its rule's entry. */
typedef struct {
    Drafter *inner;
    Pool last;
} PoolTap;
static int tap_reset(void *c, const int *t, int n, const void *f, size_t fb, RsErr *e) {
    PoolTap *tp = c;
    return drafter_reset(tp->inner, t, n, f, fb, e);
}
static int tap_begin(void *c, const int *t, int n, const void *f, size_t fb, RsErr *e) {
    PoolTap *tp = c;
    return drafter_grow_begin(tp->inner, t, n, 0, f, fb, e);
}
static int tap_end(void *c, Pool *out, RsErr *e) {
    PoolTap *tp = c;
    int rc = drafter_grow_end(tp->inner, out, e);
    if (!rc) tp->last = *out;
    return rc;
}
static void tap_destroy(void *c) { (void)c; /* the test owns the tap and its inner */ }
static const DrafterOps tap_ops = {tap_reset, tap_begin, tap_end, tap_destroy, NULL, NULL, NULL, NULL};
typedef struct {
    PoolTap *tap;
    const int *ar;  /* greedy reference tokens */
    int n_ar, pos;  /* tokens emitted before this round */
    int B, decoder, rounds, checked, deep, bad; /* deep: checked rounds with a path of 2+ */
    char why[200];
} OracleLog;
static void oracle_round(void *u, const RoundInfo *r) {
    OracleLog *g = u;
    const Pool *p = &g->tap->last;
    const double *tr = r->tau_rule;
    g->rounds++;
    if (!r->have_tau_rule) {
        snprintf(g->why, sizeof g->why, "round %d: no tau_rule", r->round);
        g->bad++;
    } else if (r->tree_size_rule[DECODER_ORACLE] != (g->B < p->n ? g->B : p->n)) {
        snprintf(g->why, sizeof g->why, "round %d: oracle tree of %d nodes", r->round,
                 r->tree_size_rule[DECODER_ORACLE]);
        g->bad++;
    } else if (fabs(tr[g->decoder] - r->tau) > 1e-9) {
        snprintf(g->why, sizeof g->why, "round %d: own tau %g vs tau_rule %g", r->round, r->tau,
                 tr[g->decoder]);
        g->bad++;
    } else if (tr[DECODER_ORACLE] < tr[DECODER_DRAFT] - 1e-9 || tr[DECODER_ORACLE] < tr[DECODER_ROOT] - 1e-9) {
        snprintf(g->why, sizeof g->why, "round %d: oracle %g below draft %g or root %g",
                 r->round, tr[DECODER_ORACLE], tr[DECODER_DRAFT], tr[DECODER_ROOT]);
        g->bad++;
    } else if (g->ar) {
        int at = -1, L = 0; /* follow the greedy tokens down the pool */
        while (L < g->B && g->pos + L < g->n_ar) {
            int first = at < 0 ? p->root_first_child : p->first_child[at];
            int nc = at < 0 ? p->root_n_children : p->n_children[at], next = -1;
            for (int k = first; k < first + nc && first >= 0; k++)
                if (p->token[k] == g->ar[g->pos + L]) next = k;
            if (next < 0) break;
            at = next;
            L++;
        }
        if (g->pos + 8 < g->n_ar) { /* the reference reaches past the pool's depth */
            g->checked++;
            g->deep += L >= 2;
            if (tr[DECODER_ORACLE] != (double)L) {
                snprintf(g->why, sizeof g->why, "round %d: oracle tau %g, greedy path in pool %d",
                         r->round, tr[DECODER_ORACLE], L);
                g->bad++;
            }
        }
    }
    g->pos += r->emitted;
}

START_TEST(test_score_all_oracle) {
    Pair p;
    pair_open(&p, 1, 64, 32, 4242);
    PoolTap tap = {.inner = p.front};
    Drafter *d = drafter_wrap(&tap_ops, &tap, drafter_info(p.front));
    int prompt[5] = {3, 9, 27, 17, 51};
    long checked = 0, deep = 0;
    for (int temp = 0; temp <= 1; temp++) {
        for (int B = 4; B <= 59; B += 55) {
            for (int rule = DECODER_PEARL; rule <= DECODER_ROOTDRAW; rule++) {
                for (int s = 0; s < 6; s++) {
                    int ar[256], n_ar = 0;
                    if (temp == 0) {
                        prompt[0] = 3 + s;
                        n_ar = run(&p, DECODER_AR, B, 0, 1, s, prompt, 5, 120, ar, NULL, 0);
                    }
                    OracleLog g = {.tap = &tap, .ar = temp == 0 ? ar : NULL, .n_ar = n_ar,
                                   .B = B, .decoder = rule};
                    DecodeHooks h = {.on_round = oracle_round, .user = &g};
                    DecodeOpts opts = {.decoder = rule, .budget = B, .sampling = sampling_from_temp(temp), .seed = 50 + s,
                                       .prompt_id = s, .max_new = 96, .score_all = 1};
                    DecodeResult res = {0};
                    int buf[256];
                    res.tokens = buf;
                    res.cap = 256;
                    RsErr e = {0};
                    ck_assert_msg(decode_run(p.t, d, prompt, 5, &opts, &h, &res, &e) == 0, "%s", e.msg);
                    ck_assert_msg(g.bad == 0, "%s T=%d B=%d: %s", decoder_name(rule), temp, B, g.why);
                    ck_assert_int_eq(g.rounds, res.rounds);
                    if (temp == 0) /* the wider pass must not disturb greedy identity */
                        for (int i = 0; i < 96 && i < res.n_tokens; i++) ck_assert_int_eq(buf[i], ar[i]);
                    checked += g.checked;
                    deep += g.deep;
                }
            }
        }
    }
    fprintf(stderr, "score-all oracle: %ld rounds checked against greedy paths through the pool "
            "(%ld of 2+ tokens)\n", checked, deep);
    ck_assert_int_gt(checked, 50);
    ck_assert_int_gt(deep, 10);
    drafter_destroy(&d);
    pair_close(&p);
}
END_TEST

/* A full KV cache stops a decode only when the next round might not fit: AR keeps one
 * entry free, a tree of B nodes 1 + B, so AR runs the cache to its last entry. */
START_TEST(test_kv_full_reserve) {
    Pair p;
    pair_open(&p, 1, 64, 32, 77);
    int cap = target_kv_capacity(p.t), prompt[3] = {5, 6, 7};
    const DecoderKind rules[] = {DECODER_AR, DECODER_ROOTDRAW, DECODER_DRAFT};
    for (int k = 0; k < 3; k++) {
        for (int B = 4; B <= 59; B += 55) {
            DecodeOpts opts = {.decoder = rules[k], .budget = B, .max_new = 4 * cap};
            DecodeResult res = {0};
            int buf[2048];
            res.tokens = buf;
            res.cap = 2048;
            RsErr e = {0};
            ck_assert_msg(decode_run(p.t, rules[k] == DECODER_AR ? NULL : p.front, prompt, 3, &opts, NULL,
                                     &res, &e) == 0, "%s", e.msg);
            int reserve = decode_round_reserve(&opts), used = 3 - 1 + res.n_tokens;
            ck_assert_int_eq(reserve, rules[k] == DECODER_AR ? 1 : 1 + B);
            ck_assert_msg(res.hit_capacity, "%s B=%d: no KV-full stop", decoder_name(rules[k]), B);
            /* stopped because the next round might not fit, not earlier */
            ck_assert_msg(used + reserve > cap && used + reserve <= cap + ROUND_MAX_EMIT,
                          "%s B=%d: stopped with %d of %d entries used (reserve %d)",
                          decoder_name(rules[k]), B, used, cap, reserve);
            if (rules[k] == DECODER_AR) ck_assert_int_eq(used, cap);
        }
    }
    pair_close(&p);
}
END_TEST

/* Measurements (tau, root_margin) are kept off the decode's clock: a round reports what it
 * spent on them, and the decode's time plus that never exceeds the wall time around it. A
 * clock that forgot to skip them would exceed it by their sum. */
typedef struct {
    int rounds, tree_rounds, measured_trees, measured_ar;
    uint64_t measure_ns;
} MeasureLog;
static void measure_round(void *u, const RoundInfo *r) {
    MeasureLog *m = u;
    m->rounds++;
    m->measure_ns += r->measure_ns;
    if (r->t_tree_end) m->tree_rounds++, m->measured_trees += r->measure_ns > 0;
    if (!r->t_tree_end && r->t_root_end) m->measured_ar += r->measure_ns > 0;
}

START_TEST(test_measurement_off_clock) {
    Pair p;
    pair_open(&p, 1, 4096, 32, 31);
    int prompt[4] = {11, 22, 33, 44};
    const DecoderKind rules[] = {DECODER_DRAFT, DECODER_ROOTDRAW, DECODER_AR};
    for (int k = 0; k < 3; k++) {
        MeasureLog m = {0};
        DecodeHooks h = {.on_round = measure_round, .user = &m};
        DecodeOpts opts = {.decoder = rules[k], .budget = 59, .sampling = SAMPLING_PLAIN, .seed = 3, .max_new = 48};
        DecodeResult res = {0};
        int buf[256];
        res.tokens = buf;
        res.cap = 256;
        RsErr e = {0};
        uint64_t w0 = rs_now_ns();
        ck_assert_msg(decode_run(p.t, rules[k] == DECODER_AR ? NULL : p.front, prompt, 4, &opts, &h, &res,
                                 &e) == 0, "%s", e.msg);
        uint64_t wall = rs_now_ns() - w0, took = res.t_end - res.t_start;
        if (rules[k] == DECODER_AR) ck_assert_msg(m.measured_ar == m.rounds, "AR: %d of %d rounds measured", m.measured_ar, m.rounds);
        ck_assert_msg(m.measured_trees == m.tree_rounds, "%s: %d of %d tree rounds measured",
                      decoder_name(rules[k]), m.measured_trees, m.tree_rounds);
        ck_assert_msg(took + m.measure_ns <= wall,
                      "%s: decode %.3f ms + measurements %.3f ms > wall %.3f ms",
                      decoder_name(rules[k]), took * 1e-6, m.measure_ns * 1e-6, wall * 1e-6);
        fprintf(stderr, "%s: decode %.2f ms, measurements kept off it %.2f ms, wall %.2f ms\n",
                decoder_name(rules[k]), took * 1e-6, m.measure_ns * 1e-6, wall * 1e-6);
    }
    pair_close(&p);
}
END_TEST

START_TEST(test_decode_errors) {
    Pair p;
    pair_open(&p, 1, 32, 16, 3);
    DecodeOpts opts = {.decoder = DECODER_DRAFT, .budget = 8, .max_new = 4};
    DecodeResult res = {0};
    int buf[64], big[600];
    res.tokens = buf;
    res.cap = 64;
    RsErr e = {0};
    for (int i = 0; i < 600; i++) big[i] = 1;
    ck_assert_int_eq(decode_run(p.t, p.front, big, 600, &opts, NULL, &res, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "prompt of 600 tokens does not fit the KV cache"), "%s", e.msg);
    int bad[2] = {1, 32};
    ck_assert_int_eq(decode_run(p.t, p.front, bad, 2, &opts, NULL, &res, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "prompt token 32 at position 1 outside vocabulary of 32"), "%s", e.msg);
    opts.budget = 65;
    ck_assert_int_eq(decode_run(p.t, p.front, bad, 1, &opts, NULL, &res, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "budget 65 outside 1..64"), "%s", e.msg);
    opts.budget = 8;
    opts.score_all = 1;
    ck_assert_int_eq(decode_run(p.t, p.front, bad, 1, &opts, NULL, &res, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "needs a root-pass decoder"), "%s", e.msg);
    pair_close(&p);
}
END_TEST

typedef struct {
    int rounds;
    uint64_t sent0, start0; /* round 0's request and start */
} AskLog;
static void ask_round(void *u, const RoundInfo *r) {
    AskLog *g = u;
    if (g->rounds++ == 0) g->sent0 = r->t_grow_sent, g->start0 = r->t_round_start;
}
static int stop_now(void *u) {
    (void)u;
    return 1;
}

/* One rootdraw decode (chain pools, B = 5) of the pair with hooks; the result's tokens. */
static DecodeResult ask_decode(Pair *p, Planner *pl, const DecodeHooks *h, const int *prompt,
                               int n, int *buf) {
    DecodeOpts opts = {.decoder = DECODER_ROOTDRAW, .budget = 5, .sampling = SAMPLING_GREEDY,
                       .max_new = 24, .pool_depth = 5, .pool_width = 1, .planner = pl};
    DecodeResult res = {.tokens = buf, .cap = 64};
    RsErr e = {0};
    ck_assert_msg(decode_run(p->t, p->front, prompt, n, &opts, h, &res, &e) == 0, "%s", e.msg);
    return res;
}

/* A drafter that needs none of the target's features gets its first request before the
 * target's prefill (its own prefill then runs beside the target's), and not with the
 * planner, which may decode round 0 without it. A decode that stops before its first
 * round leaves the drafter idle: the next decode's tokens are AR's. */
START_TEST(test_first_request_early) {
    Pair p;
    pair_open(&p, 1, 64, 32, 71);
    int prompt[24], ref[64], buf[64];
    for (int i = 0; i < 24; i++) prompt[i] = (i * 7 + 1) % 64;
    int nref = run(&p, DECODER_AR, 5, 0, 1, 0, prompt, 24, 24, ref, NULL, 0);
    AskLog g = {0};
    DecodeHooks h = {.on_round = ask_round, .user = &g};
    DecodeResult res = ask_decode(&p, NULL, &h, prompt, 24, buf);
    ck_assert_msg(g.sent0 >= res.t_start && g.sent0 < g.start0,
                  "round 0 asked at %+.3f ms of its start, the decode began at %+.3f ms",
                  ((double)g.sent0 - (double)g.start0) * 1e-6,
                  ((double)res.t_start - (double)g.start0) * 1e-6);
    Planner *pl = planner_create();
    g = (AskLog){0};
    ask_decode(&p, pl, &h, prompt, 24, buf);
    ck_assert_msg(g.sent0 == 0 || g.sent0 >= g.start0, "the planner's round 0 asked before it");
    planner_destroy(&pl);
    DecodeHooks stop = {.should_stop = stop_now};
    res = ask_decode(&p, NULL, &stop, prompt, 24, buf);
    ck_assert_msg(res.stopped && res.rounds == 0, "%d rounds, stopped %d", res.rounds, res.stopped);
    res = ask_decode(&p, NULL, NULL, prompt, 24, buf);
    ck_assert_int_eq(res.n_tokens < 24 ? res.n_tokens : 24, nref);
    for (int i = 0; i < nref; i++)
        ck_assert_msg(buf[i] == ref[i], "after a stopped decode: token %d is %d, AR %d", i, buf[i], ref[i]);
    pair_close(&p);
}
END_TEST

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

typedef struct {
    int rounds, with_margin, bad;
} MarginLog;
static void margin_round(void *u, const RoundInfo *r) {
    MarginLog *m = u;
    m->rounds++;
    int root_pass = r->t_root_end != 0;
    if (root_pass != !isnan(r->root_margin) || (root_pass && !(r->root_margin >= 0))) m->bad++;
    m->with_margin += root_pass;
}

/* row_top_margin against a sort, ties included; the round log's root_margin is set exactly
 * when a root pass ran (what tools/pipeline-timing.sh reads to judge a near-tie). */
START_TEST(test_root_margin) {
    uint64_t st = 5;
    for (int trial = 0; trial < 200; trial++) {
        int n = 2 + (int)(st % 300);
        float v[302], sorted[302];
        for (int i = 0; i < n; i++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            v[i] = (float)((int)(st >> 40) % 64 - 32) / 4.0f; /* coarse: ties are common */
        }
        memcpy(sorted, v, sizeof(float) * n);
        qsort(sorted, n, sizeof(float), cmp_desc);
        ck_assert_msg(row_top_margin(v, n) == (double)sorted[0] - (double)sorted[1],
                      "n %d: %g vs %g", n, row_top_margin(v, n), sorted[0] - sorted[1]);
    }
    Pair p;
    pair_open(&p, 1, 32, 16, 3);
    DecoderKind rules[2] = {DECODER_AR, DECODER_DRAFT};
    for (int k = 0; k < 2; k++) {
        DecodeOpts opts = {.decoder = rules[k], .budget = 8, .max_new = 12};
        int buf[64], prompt[3] = {1, 2, 3};
        DecodeResult res = {.tokens = buf, .cap = 64};
        MarginLog ml = {0};
        DecodeHooks h = {NULL, margin_round, NULL, &ml, NULL, NULL, NULL};
        RsErr e = {0};
        ck_assert_int_eq(decode_run(p.t, p.front, prompt, 3, &opts, &h, &res, &e), RS_OK);
        ck_assert_int_eq(ml.bad, 0);
        if (rules[k] == DECODER_AR) ck_assert_int_eq(ml.with_margin, ml.rounds);
        else ck_assert_int_lt(ml.with_margin, ml.rounds); /* draft rounds have no root pass */
    }
    pair_close(&p);
}
END_TEST

/* ---- pool shapes (--pool-shape) ----------------------------------------------------- */

/* T=0: every decoder with the narrow shapes of SHAPES (a chain of best nodes with their
 * siblings, a three-wide tree, the first level alone) gives AR's tokens, with an
 * independent and a perfect drafter, at the node cap of a chain and at B=8; X1 from the
 * drafter's first level (`wrong`) must break it. Returns mismatches. */
static int shape_identity(int shape, int wrong) {
    const DecoderKind rules[] = {DECODER_DRAFT, DECODER_PEARL, DECODER_ROOTDRAW, DECODER_ROOT};
    int bad = 0;
    g_depth = SHAPES[shape][0], g_width = SHAPES[shape][1];
    for (int kind = 0; kind <= 2; kind += 2) {
        Pair p;
        pair_open(&p, kind, 64, 32, 4321 + kind);
        Rng r;
        rng_seed(&r, 91 + kind);
        for (int pr = 0; pr < 5; pr++) {
            int prompt[12], n = 3 + pr, ref[64], got[64];
            for (int i = 0; i < n; i++) prompt[i] = (int)(rng_next(&r) % 64);
            int nref = run(&p, DECODER_AR, 8, 0, 1, pr, prompt, n, 40, ref, NULL, 0);
            for (int ri = 0; ri < 4; ri++)
                for (int bi = 0; bi < 2; bi++) {
                    int B = bi ? 8 : g_depth;
                    int ng = run(&p, rules[ri], B, 0, 1, pr, prompt, n, 40, got, NULL, wrong);
                    ck_assert_int_eq(ng, nref);
                    for (int i = 0; i < nref; i++) bad += got[i] != ref[i];
                    for (int i = 0; i < nref && !wrong; i++)
                        ck_assert_msg(got[i] == ref[i],
                                      "shape %d,%d kind %d %s B=%d prompt %d: token %d is %d, "
                                      "AR %d", g_depth, g_width, kind, decoder_name(rules[ri]), B,
                                      pr, i, got[i], ref[i]);
                }
        }
        pair_close(&p);
    }
    g_depth = g_width = 0;
    return bad;
}

START_TEST(test_greedy_identity_shapes) {
    shape_identity(1 + _i, 0);
    if (_i == 0) ck_assert_int_gt(shape_identity(1, 1), 0); /* the test can fail */
}
END_TEST

/* T=1: each root-pass rule and draft with a chain pool (5,1) follow the target's law; the
 * same chi-square catches the wrong verifier with that pool. */
START_TEST(test_t1_exactness_shapes) {
    double pv;
    DecoderKind decoder = ALL_RULES[1 + _i % 4];
    int wrong = _i == 4;
    g_depth = SHAPES[1][0], g_width = SHAPES[1][1];
    exactness_law(1, wrong ? DECODER_ROOTDRAW : decoder, 4, &SAMPLING_PLAIN, 8000, wrong, &pv, NULL);
    g_depth = g_width = 0;
    if (wrong) ck_assert_msg(pv < 1e-3, "chain pool: a wrong verifier passed (p=%g)", pv);
    else ck_assert_msg(pv > 1e-3, "%s chain pool: T=1 law differs from the target's (p=%g)",
                       decoder_name(decoder), pv);
}
END_TEST

/* ---- run-ahead (DESIGN.md §5) ------------------------------------------------------ */

/* The threaded kind lets its drafter run ahead between rounds (the target as its own
 * drafter: some guesses are the commit; which pools each case yields is
 * tests/test_ahead.c's). Every rule's T=0 output with a chain (B = its depth,
 * so a whole path can be accepted) and with full pools must be AR's. Returns mismatches
 * (`wrong`: X1 from the drafter's first level must make some); *st: the counters. */
static int ahead_identity(int wrong, DrafterAheadStats *st) {
    const DecoderKind rules[] = {DECODER_DRAFT, DECODER_PEARL, DECODER_ROOTDRAW, DECODER_ROOT};
    static const int shapes[2][2] = {{5, 1}, {8, 10}};
    int bad = 0;
    Pair p;
    pair_open(&p, 2, 64, 32, 9001);
    Rng r;
    rng_seed(&r, 17);
    for (int pr = 0; pr < 4; pr++) {
        int prompt[12], n = 3 + pr, ref[64], got[64];
        for (int i = 0; i < n; i++) prompt[i] = (int)(rng_next(&r) % 64);
        int nref = run(&p, DECODER_AR, 8, 0, 1, pr, prompt, n, 40, ref, NULL, 0);
        for (int s = 0; s < 2; s++)
            for (int ri = 0; ri < 4; ri++) {
                g_depth = shapes[s][0], g_width = shapes[s][1];
                int B = s ? 8 : g_depth;
                int ng = run(&p, rules[ri], B, 0, 1, pr, prompt, n, 40, got, NULL, wrong);
                g_depth = g_width = 0;
                ck_assert_int_eq(ng, nref);
                for (int i = 0; i < nref; i++) bad += got[i] != ref[i];
                for (int i = 0; i < nref && !wrong; i++)
                    ck_assert_msg(got[i] == ref[i], "run-ahead %s pools %d,%d prompt %d: token "
                                  "%d is %d, AR %d", decoder_name(rules[ri]), shapes[s][0],
                                  shapes[s][1], pr, i, got[i], ref[i]);
            }
    }
    *st = drafter_ahead_stats(p.front);
    pair_close(&p);
    return bad;
}

START_TEST(test_ahead_identity) {
    DrafterAheadStats st;
    ck_assert_int_eq(ahead_identity(0, &st), 0);
    fprintf(stderr, "run-ahead T=0: %ld guesses, %ld hits (%ld pools ready), %ld misses\n",
            st.guesses, st.hits, st.pools_ready, st.misses);
    ck_assert_msg(st.guesses > 0 && st.misses > 0, "run-ahead did not run: %ld guesses, %ld "
                  "misses", st.guesses, st.misses);
    ck_assert_int_gt(ahead_identity(1, &st), 0); /* the test can fail */
}
END_TEST

/* T=1: each rule with a chain pool (5,1), B = 5, its drafter running ahead (guessing, and
 * taking most guesses back: a random drafter's chains are seldom accepted whole; the hits
 * are test_ahead_identity's and tests/test_ahead.c's), follows the target's law; the same
 * chi-square catches the wrong verifier. */
START_TEST(test_ahead_t1_exactness) {
    double pv;
    DecoderKind decoder = ALL_RULES[1 + _i % 4];
    int wrong = _i == 4;
    g_depth = 5, g_width = 1, g_threaded = 1;
    exactness_law(1, wrong ? DECODER_ROOTDRAW : decoder, 5, &SAMPLING_PLAIN, 8000, wrong, &pv, NULL);
    g_depth = g_width = g_threaded = 0;
    fprintf(stderr, "  run-ahead: %ld guesses, %ld hits (%ld pools ready), %ld misses\n",
            g_ahead.guesses, g_ahead.hits, g_ahead.pools_ready, g_ahead.misses);
    if (wrong) ck_assert_msg(pv < 1e-3, "run-ahead: a wrong verifier passed (p=%g)", pv);
    else ck_assert_msg(pv > 1e-3, "%s with run-ahead: law differs from the target's (p=%g)",
                       decoder_name(decoder), pv);
    ck_assert_msg(g_ahead.guesses > 0 && g_ahead.misses > 0, "run-ahead did not run: %ld "
                  "guesses, %ld misses", g_ahead.guesses, g_ahead.misses);
}
END_TEST

/* ---- cheap drafters and the cost-aware budget -------------------------------------- */

typedef struct {
    int trees, ar_steps; /* rounds that verified a tree / that the planner made AR steps */
} PlanCount;

static void count_plan(void *u, const RoundInfo *r) {
    PlanCount *c = u;
    c->trees += r->plan_k > 0;
    c->ar_steps += r->plan_depth == 0 && !r->fallback_ar;
}

/* T=0: every decoder with the suffix drafter (fixed B and auto) and with the layer-view
 * drafter under auto gives AR's tokens; the planner is seen both verifying trees and taking
 * AR steps. `wrong` (X1 from the drafter's first level) must break it. Returns mismatches. */
static int cheap_identity(int kind, Planner *pl, int wrong, PlanCount *pc) {
    const DecoderKind rules[] = {DECODER_DRAFT, DECODER_PEARL, DECODER_ROOTDRAW, DECODER_ROOT};
    Pair p;
    pair_open(&p, kind, 64, 32, 555 + kind);
    Rng r;
    rng_seed(&r, 31);
    DecodeHooks h = {.on_round = count_plan, .user = pc};
    int bad = 0;
    for (int pr = 0; pr < 6; pr++) {
        int prompt[16], n = 4 + pr % 8, ref[64], got[64];
        for (int i = 0; i < n; i++) prompt[i] = (int)(rng_next(&r) % 64);
        g_planner = NULL;
        int nref = run(&p, DECODER_AR, 8, 0, 1, pr, prompt, n, 48, ref, NULL, 0);
        g_planner = pl;
        for (int ri = 0; ri < 4; ri++) {
            int ng = run(&p, rules[ri], pl ? TREE_MAX : 8, 0, 1, pr, prompt, n, 48, got, &h, wrong);
            ck_assert_int_eq(ng, nref);
            for (int i = 0; i < nref; i++) bad += got[i] != ref[i];
            if (!wrong)
                for (int i = 0; i < nref; i++)
                    ck_assert_msg(got[i] == ref[i], "kind %d %s%s prompt %d: token %d is %d, AR %d",
                                  kind, decoder_name(rules[ri]), pl ? " auto" : "", pr, i, got[i],
                                  ref[i]);
        }
    }
    g_planner = NULL;
    pair_close(&p);
    return bad;
}

START_TEST(test_greedy_identity_cheap) {
    PlanCount pc = {0};
    cheap_identity(3, NULL, 0, &pc); /* suffix, fixed B */
    Planner *pl = planner_create();  /* measured costs, shared by every decode */
    cheap_identity(3, pl, 0, &pc);
    cheap_identity(1, pl, 0, &pc);   /* a model drafter under the same planner */
    planner_destroy(&pl);
    pl = planner_create();           /* rows at a tenth of a pass: trees pay */
    planner_fix_costs(pl, 1e6, 1e5, 0);
    cheap_identity(3, pl, 0, &pc);
    PlanCount fixed = pc;
    planner_destroy(&pl);
    fprintf(stderr, "cheap identity: %d rounds verified a planned tree, %d were planned AR "
                    "steps\n", pc.trees, pc.ar_steps);
    ck_assert_int_gt(fixed.trees, 20);
    ck_assert_int_gt(pc.ar_steps, 20);
    /* the test can fail: X1 from the drafter's first level breaks it */
    pl = planner_create();
    planner_fix_costs(pl, 1e6, 1e5, 0);
    PlanCount w = {0};
    ck_assert_int_gt(cheap_identity(3, pl, 1, &w), 0);
    planner_destroy(&pl);
}
END_TEST

/* T=1: the suffix drafter (fixed B and auto), and a model drafter under auto, follow the
 * target's law; and the same chi-square catches a wrong verifier with the suffix drafter. */
START_TEST(test_t1_exactness_cheap) {
    double pv;
    DecoderKind decoder = ALL_RULES[1 + _i % 4];
    int mode = _i / 4; /* 0: suffix B=4, 1: suffix auto (rows cheap), 2: model auto measured */
    Planner *pl = mode ? planner_create() : NULL;
    if (mode == 1) planner_fix_costs(pl, 1e6, 1e5, 0);
    g_planner = pl;
    exactness_law(mode == 2 ? 1 : 3, decoder, mode ? TREE_MAX : 4, &SAMPLING_PLAIN, 6000, 0, &pv, NULL);
    g_planner = NULL;
    planner_destroy(&pl);
    ck_assert_msg(pv > 1e-3, "%s mode %d: T=1 law differs from the target's (p=%g)",
                  decoder_name(decoder), mode, pv);
}
END_TEST

START_TEST(test_t1_wrong_verifier_fails_cheap) {
    double pv;
    Planner *pl = planner_create();
    planner_fix_costs(pl, 1e6, 1e5, 0);
    g_planner = pl;
    exactness_law(3, DECODER_ROOTDRAW, TREE_MAX, &SAMPLING_PLAIN, 10000, 1, &pv, NULL);
    g_planner = NULL;
    planner_destroy(&pl);
    ck_assert_msg(pv < 1e-3, "a verifier drawing X1 from the suffix pool passed (p=%g)", pv);
}
END_TEST

Suite *suite_spec(void) {
    Suite *s = suite_create("spec");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_greedy_identity);
    tcase_add_test(tc, test_tree_properties);
    tcase_add_test(tc, test_realised_vs_tau);
    tcase_add_test(tc, test_decode_errors);
    tcase_add_test(tc, test_first_request_early);
    tcase_add_test(tc, test_root_margin);
    suite_add_tcase(s, tc);
    TCase *ts = tcase_create("stop"); /* --max-new, EOS */
    tcase_set_timeout(ts, 600);
    tcase_add_test(ts, test_stop_rule_and_kv);
    tcase_add_test(ts, test_stop_at_first_eos);
    tcase_add_test(ts, test_max_new_exact);
    suite_add_tcase(s, ts);
    TCase *tr = tcase_create("rounds");
    tcase_set_timeout(tr, 600);
    tcase_add_test(tr, test_long_prompt);
    tcase_add_test(tr, test_round_rules);
    tcase_add_test(tr, test_realised_vs_tau_root);
    tcase_add_loop_test(tr, test_pool_growth_shape, 0, 4);
    tcase_add_test(tr, test_oracle_brute_force);
    tcase_add_test(tr, test_score_all_oracle);
    tcase_add_test(tr, test_kv_full_reserve);
    tcase_add_test(tr, test_measurement_off_clock);
    suite_add_tcase(s, tr);
    TCase *tx = tcase_create("exactness");
    tcase_set_timeout(tx, 900);
    tcase_add_loop_test(tx, test_t1_exactness, 0, 5);
    tcase_add_loop_test(tx, test_sampling_exactness, 0, 10);
    tcase_add_test(tx, test_t1_wrong_verifier_fails);
    suite_add_tcase(s, tx);
    TCase *tcheap = tcase_create("cheap"); /* suffix drafter, --budget auto */
    tcase_set_timeout(tcheap, 900);
    tcase_add_test(tcheap, test_greedy_identity_cheap);
    tcase_add_loop_test(tcheap, test_greedy_identity_shapes, 0, 3);
    tcase_add_loop_test(tcheap, test_t1_exactness_shapes, 0, 5);
    tcase_add_loop_test(tcheap, test_t1_exactness_cheap, 0, 12);
    tcase_add_test(tcheap, test_t1_wrong_verifier_fails_cheap);
    suite_add_tcase(s, tcheap);
    TCase *tahead = tcase_create("ahead"); /* the drafter runs ahead between rounds */
    tcase_set_timeout(tahead, 900);
    tcase_add_test(tahead, test_ahead_identity);
    tcase_add_loop_test(tahead, test_ahead_t1_exactness, 0, 5);
    suite_add_tcase(s, tahead);
    return s;
}
