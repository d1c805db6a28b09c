/* The cost-aware budget (planner.h): measured costs, calibrated acceptance, and the two
 * choices of a round. Values are in tokens: a round's value is the tokens it is expected
 * to emit minus its time priced at the reference rate r (tokens per ns), the larger of a
 * plain AR step's rate and the decode's recent rate. */
#include "planner.h"
#include "target.h"
#include <math.h>
#include <pthread.h>
#include <string.h>

#define ROWS_MAX (TARGET_PASS_MAX + 1)
#define N_BUCKETS 16
#define EWMA 0.15        /* weight of a new observation */
#define RATE_EWMA 0.02   /* the same for the rate: the long run's, not the phase's (a run of
                            copied text would otherwise price rows out of the very trees
                            that made it fast) */
#define PRIOR_Q 1.0      /* pseudo-weight of the drafter's own q in the calibration */
#define ROW_SLOPE 0.35   /* a pass's cost per extra row, in one-row passes, until measured */
#define EXPLORE_EVERY 40 /* asks refresh stale estimates at most once per this many times
                            their cost spent in AR steps (so they cost at most 2.5%) */
#define DEEPEN_EVERY 16  /* every this many asks, one level deeper than the best */
#define FIRST_DEPTH 2    /* the first ask's depth: a commit and one expansion level */
#define TIE_TOKENS 0.01  /* depths whose values differ by less are worth the same */
#define COMMIT_LONG 16   /* a drafter commit of more tokens is a prefill (the prompt, or
                            the tokens of a run of AR steps): it tells what a committed token
                            costs, not what a round's commit pass does */
#define BATCH_STEP_SEEN 8 /* passes of a size before its average may show a step */
#define CHAIN_LEVEL 0.125 /* a pool level costing more than this share of a one-row target
                             pass is grown one node wide */

/* Upper edges of the calibration's log q buckets (the last bucket is below -15). */
static const double BUCKET_EDGE[N_BUCKETS - 1] = {-0.02, -0.05, -0.1, -0.2, -0.35, -0.5, -0.7,
                                                  -1.0,  -1.4,  -2.0, -3.0, -4.5, -6.5, -10, -15};

struct Planner {
    double pass_ns[ROWS_MAX + 1]; /* by rows: EWMA of measured passes */
    int pass_n[ROWS_MAX + 1];
    double commit_ns, level_ns, extra_ns; /* drafting: commit pass, per level, overhead */
    /* a level of a chain pool (width 1), measured apart: a full-model drafter's one-row
     * level costs a fraction of its ten-row one, and pricing a chain by the wide levels
     * that decided on the chain would price it out */
    double chain_level_ns;
    int have_chain_level;
    double commit_tok_ns;                 /* commit pass per committed token */
    int have_pool, have_level;
    int have_commit; /* commit_ns measured on a round's commit, not guessed from a prefill */
    double acc_a[2][N_BUCKETS], acc_q[2][N_BUCKETS]; /* accepted, sum of q: by T, bucket */
    double gain[DECODER_COUNT][2][POOL_MAX_DEPTH + 1];  /* excess over an AR step, by depth */
    int gain_n[DECODER_COUNT][2][POOL_MAX_DEPTH + 1];
    double rate_tok[DECODER_COUNT][2], rate_ns[DECODER_COUNT][2]; /* EWMA of rounds' tokens, ns */
    double skipped_ns;        /* time in AR steps since the last ask */
    int asks;
    int fixed;
    double fix_pass1, fix_row, fix_draft;
    int batched, batch_others, batch_seqs; /* planner_set_batch */
    struct Planner *accept; /* where the acceptance calibration lives: itself, or the planner
                               planner_share_accept named (its mu guards it) */
    struct Planner *passes; /* where a batch's pass costs come from: itself, or the planner
                               planner_share_passes named (its mu guards them); copied into
                               pass_ns / pass_n at each decision */
    pthread_mutex_t mu;
};

static void ewma_w(double *v, double x, int first, double w) { *v = first ? x : *v + w * (x - *v); }
static void ewma(double *v, double x, int first) { ewma_w(v, x, first, EWMA); }

Planner *planner_create(void) {
    Planner *pl = rs_xcalloc(1, sizeof(Planner));
    pl->accept = pl;
    pl->passes = pl;
    pthread_mutex_init(&pl->mu, NULL);
    return pl;
}

void planner_destroy(Planner **pl) {
    if (!pl || !*pl) return;
    pthread_mutex_destroy(&(*pl)->mu);
    free(*pl);
    *pl = NULL;
}

void planner_fix_costs(Planner *pl, double pass1_ns, double row_ns, double draft_ns) {
    pl->fixed = 1;
    pl->fix_pass1 = pass1_ns;
    pl->fix_row = row_ns;
    pl->fix_draft = draft_ns;
}

/* ---- costs --------------------------------------------------------------------------- */

/* The shared pass costs into pl's own table, for one decision. */
static void passes_sync(Planner *pl) {
    Planner *t = pl->passes;
    if (t == pl) return;
    pthread_mutex_lock(&t->mu);
    memcpy(pl->pass_ns, t->pass_ns, sizeof pl->pass_ns);
    memcpy(pl->pass_n, t->pass_n, sizeof pl->pass_n);
    pthread_mutex_unlock(&t->mu);
}

/* Weighted least squares of the measured passes: a + b (n - 1); 0 when fewer than two
 * sizes were seen. */
static int pass_fit(const Planner *pl, double *a, double *b) {
    double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    int sizes = 0;
    for (int n = 1; n <= ROWS_MAX; n++) {
        if (!pl->pass_n[n]) continue;
        double w = pl->pass_n[n] < 8 ? pl->pass_n[n] : 8, x = n - 1, y = pl->pass_ns[n];
        sw += w, sx += w * x, sy += w * y, sxx += w * x * x, sxy += w * x * y, sizes++;
    }
    double det = sw * sxx - sx * sx;
    if (sizes < 2 || det <= 0) return 0;
    *b = (sw * sxy - sx * sy) / det;
    if (*b < 0) *b = 0;
    *a = (sy - *b * sx) / sw;
    return 1;
}

/* Expected ns of a target pass of n rows. Before any pass was measured, in units of a
 * one-row pass (the reference rate is then 1 a unit: only ratios matter). In a batch, n
 * of the decode's own rows make a pass of n + others. */
static double table_cost(const Planner *pl, int n);

static double pass_cost(const Planner *pl, int n) { return table_cost(pl, n + pl->batch_others); }

/* A batch's pass of n rows in all. A decision turns on the difference of two large passes
 * a few rows apart, which the per-size averages of a few passes give mostly as noise: the
 * fitted line a + b (n - 1). But a line through every size smooths over the steps the
 * kernels make (four rows read the weights once, a fifth takes the tile products, at
 * nearly twice the cost), and a tree priced below such a step costs the batch more than it
 * brings. So where sizes between the pass the batch runs without this decode's tree
 * (others + 1 rows) and n were each measured BATCH_STEP_SEEN times or more, the rows past
 * it cost at least what those passes exceed the line's rise by: the largest excess up to
 * n, so a pass never costs less for more rows. */
static double batch_cost(const Planner *pl, int n, double a, double b) {
    int m = pl->batch_others + 1;
    double line = a + b * (n - 1), excess = 0;
    if (m > ROWS_MAX || pl->pass_n[m] < BATCH_STEP_SEEN) return line;
    for (int k = m + 1; k <= n && k <= ROWS_MAX; k++) {
        if (pl->pass_n[k] < BATCH_STEP_SEEN) continue;
        double over = pl->pass_ns[k] - pl->pass_ns[m] - b * (k - m);
        if (over > excess) excess = over;
    }
    return line + excess;
}

/* Expected ns of a pass of n rows in all. */
static double table_cost(const Planner *pl, int n) {
    if (pl->fixed) return pl->fix_pass1 + (n - 1) * pl->fix_row;
    double a, b;
    if (pl->batched && pass_fit(pl, &a, &b)) return batch_cost(pl, n, a, b);
    if (n > ROWS_MAX) n = ROWS_MAX;
    if (pl->pass_n[n] >= 3) return pl->pass_ns[n];
    int lo = n, hi = n;
    while (lo > 0 && !pl->pass_n[lo]) lo--;
    while (hi <= ROWS_MAX && !pl->pass_n[hi]) hi++;
    if (lo > 0 && hi <= ROWS_MAX && lo != hi)
        return pl->pass_ns[lo] + (pl->pass_ns[hi] - pl->pass_ns[lo]) * (n - lo) / (hi - lo);
    if (pass_fit(pl, &a, &b)) return a + b * (n - 1);
    int m = lo > 0 ? lo : hi; /* the one size seen */
    if (m < 1 || m > ROWS_MAX) return 1 + ROW_SLOPE * (n - 1);
    return pl->pass_ns[m] * (1 + ROW_SLOPE * (n - 1)) / (1 + ROW_SLOPE * (m - 1));
}

/* Expected ns the target waits for a pool of `depth` levels beyond its own work, when the
 * drafter has n_pend tokens to commit first (many after a run of AR steps: a long commit
 * costs like a prefill, which is what keeps an expensive drafter from being asked again
 * once it has lost). */
static int pool_width(const Planner *pl);

/* What a level of the pools asked next costs: a chain's once measured (until then a tenth
 * of a wide one: optimistic, and the next ask measures it), else a wide one's. */
static double level_cost(const Planner *pl) {
    if (pool_width(pl) > 1) return pl->have_level ? pl->level_ns : 0;
    if (pl->have_chain_level) return pl->chain_level_ns;
    return pl->have_level ? pl->level_ns / POOL_EXPAND : 0;
}

static double wait_cost(const Planner *pl, DecoderKind decoder, int depth, int n_pend) {
    if (pl->fixed) return pl->fix_draft;
    if (!pl->have_pool) return NAN;
    double commit = pl->commit_tok_ns * n_pend > pl->commit_ns ? pl->commit_tok_ns * n_pend
                                                              : pl->commit_ns;
    double d = commit + (depth - 1) * level_cost(pl) + pl->extra_ns;
    if (decoder_needs_root_pass(decoder)) d -= pass_cost(pl, 1); /* the root pass runs meanwhile */
    return d > 0 ? d : 0;
}

/* The reference rate, tokens per ns: an AR step's, or this rule's recent one if higher. */
static double ref_rate(const Planner *pl, DecoderKind decoder, int temp) {
    /* a batch's rate is every sequence's; its AR step is a pass of one row a sequence (not
     * one row beside the others' trees: their speculation must not cheapen the rows) */
    int seqs = pl->batch_seqs > 1 ? pl->batch_seqs : 1;
    double c1 = pl->batched ? table_cost(pl, seqs) : pass_cost(pl, 1), r = c1 > 0 ? 1 / c1 : 0;
    if (pl->fixed) return seqs * r; /* nothing measured may move a fixed planner */
    double tok = pl->rate_tok[decoder][temp != 0], ns = pl->rate_ns[decoder][temp != 0];
    if (ns > 0 && tok / ns > r) r = tok / ns;
    return seqs * r;
}

/* ns priced in tokens at rate r; free while nothing is measured. */
static double price(double r, double ns) { return r > 0 && !isnan(ns) ? r * ns : 0; }

/* ---- acceptance ---------------------------------------------------------------------- */

static int bucket_of(double logq) {
    int b = 0;
    while (b < N_BUCKETS - 1 && logq < BUCKET_EDGE[b]) b++;
    return b;
}

/* The probability that a candidate of draft log-probability logq is the target's draw
 * when its parent is reached: the drafter's q, scaled by what its bucket showed. */
static double accept_prob(const Planner *pl, int temp, double logq) {
    int b = bucket_of(logq), t = temp != 0;
    double q = exp(logq);
    Planner *a = pl->accept;
    pthread_mutex_lock(&a->mu);
    double v = q * (a->acc_a[t][b] + PRIOR_Q * q) / (a->acc_q[t][b] + PRIOR_Q * q);
    pthread_mutex_unlock(&a->mu);
    return v < 1 ? v : 1;
}

/* ---- choosing the size ------------------------------------------------------------- */

/* Per node of sel (rank order), the probability the walk reaches and accepts it. */
static void path_probs(const Planner *pl, DecoderKind decoder, int temp, const Pool *pool,
                       const Selection *sel, int x1, double *pp) {
    for (int i = 0; i < sel->t.n; i++) {
        int u = sel->t.node[i], par = sel->t.parent[i];
        if (sel->rooted_at_x1 && i == 0) pp[i] = 1; /* X1, drawn already */
        else if (par < 0 && decoder == DECODER_ROOT) pp[i] = pool->token[u] == x1;
        else pp[i] = (par < 0 ? 1 : pp[par]) * accept_prob(pl, temp, pool->logq[u]);
    }
}

static int node_depth(const Pool *pool, const Selection *sel, int i) {
    int u = sel->t.node[i];
    return u == TREE_X1_OFFPOOL ? 1 : pool->depth[u];
}

/* Expected ns of the tree pass over n nodes (0: none), given which rule verifies them;
 * root selection skips the pass when X1's node is not among them (x1_in). */
static double tree_cost(const Planner *pl, DecoderKind decoder, int n, int x1_in) {
    if (decoder == DECODER_DRAFT) return pass_cost(pl, 1 + n);
    if (n == 0 || (decoder == DECODER_ROOT && !x1_in)) return 0;
    return pass_cost(pl, n);
}

/* The best prefix of sel's nodes of depth <= max_depth: *k nodes of the whole list (the
 * last one taken ends the prefix), value tokens - r * ns. */
static double best_prefix(const Planner *pl, DecoderKind decoder, const Pool *pool, const Selection *sel,
                          const double *pp, int x1, int max_depth, double r, PlanChoice *c) {
    double tokens = 1, best = 1 - price(r, tree_cost(pl, decoder, 0, 0));
    int n = 0, x1_in = 0;
    *c = (PlanChoice){.k = 0, .tokens = 1, .ns = tree_cost(pl, decoder, 0, 0)};
    for (int i = 0; i < sel->t.n; i++) {
        if (node_depth(pool, sel, i) > max_depth) continue;
        int u = sel->t.node[i];
        x1_in |= decoder == DECODER_ROOT && sel->t.parent[i] < 0 && pool->token[u] == x1;
        tokens += pp[i];
        double ns = tree_cost(pl, decoder, ++n, x1_in), v = tokens - price(r, ns);
        if (v > best + 1e-9) best = v, *c = (PlanChoice){.k = i + 1, .tokens = tokens, .ns = ns};
    }
    return best;
}

PlanChoice planner_choose(Planner *pl, DecoderKind decoder, int temp, const Pool *pool,
                          const Selection *sel, int x1, int depth) {
    passes_sync(pl);
    double pp[TREE_MAX], r = ref_rate(pl, decoder, temp);
    path_probs(pl, decoder, temp, pool, sel, x1, pp);
    /* what an AR step would have been worth instead of this round's tree */
    double base = decoder == DECODER_DRAFT ? 1 - price(r, pass_cost(pl, 1)) : 1;
    PlanChoice best;
    for (int d = 1; d <= depth; d++) {
        double v = best_prefix(pl, decoder, pool, sel, pp, x1, d, r, &best);
        int *n = &pl->gain_n[decoder][temp != 0][d];
        ewma(&pl->gain[decoder][temp != 0][d], v - base, (*n)++ == 0);
    }
    /* every node counts here: a drafter may grow deeper than asked */
    best_prefix(pl, decoder, pool, sel, pp, x1, POOL_MAX_DEPTH, r, &best);
    if (decoder_needs_root_pass(decoder)) best.ns += pass_cost(pl, 1);
    double w = wait_cost(pl, decoder, depth, 0);
    if (!isnan(w)) best.ns += w;
    return best;
}

/* ---- asking the drafter ------------------------------------------------------------ */

/* What asking at depth d is worth, in tokens over an AR step, and the depth tried last at
 * or below d (*tried, 0: none). A depth never tried is worth what the deepest tried below it
 * showed: a deeper pool holds the shallower one, so that is a lower bound. */
static double depth_value(const Planner *pl, DecoderKind decoder, int t, int d, int *tried) {
    if (pl->gain_n[decoder][t][d]) *tried = d;
    return *tried ? pl->gain[decoder][t][*tried] : NAN;
}

/* Nodes a pool level expands. All ten while a level costs little next to a target pass
 * (an EAGLE-3 head; the suffix kind, which ignores it): the wide pool's siblings then come
 * nearly free. One when a level costs like a pass of a full model (a quantized twin of the
 * target): its passes cost per row, and a confident drafter's best node carries most of
 * the acceptance, so the pool is a chain of best nodes with their siblings (DESIGN.md §2,
 * "Pool shape"). Unmeasured: the full width. */
static int pool_width(const Planner *pl) {
    if (pl->fixed || !pl->have_level) return POOL_EXPAND;
    return pl->level_ns > CHAIN_LEVEL * pass_cost(pl, 1) ? 1 : POOL_EXPAND;
}

PlanAsk planner_before_round(Planner *pl, DecoderKind decoder, int temp, int n_pend) {
    passes_sync(pl);
    double r = ref_rate(pl, decoder, temp), best = -INFINITY;
    int t = temp != 0, best_d = 0, tried = 0;
    /* a root-pass decoder's depth-1 pool holds nothing below X1: never worth an ask */
    for (int d = decoder_needs_root_pass(decoder) ? 2 : 1; d <= POOL_MAX_DEPTH; d++) {
        double g = depth_value(pl, decoder, t, d, &tried);
        if (isnan(g)) continue;
        double v = g - price(r, wait_cost(pl, decoder, d, n_pend));
        /* near ties to the deeper: a level that costs nothing measurable may pay */
        if (v >= best - TIE_TOKENS) best_d = d, best = v > best ? v : best;
    }
    /* Nothing known: a shallow first ask (a commit and one level, whose costs it measures);
     * a deep one from a slow drafter would cost several passes before anything is known. */
    int w = pool_width(pl);
    if (!tried || isnan(best))
        return (PlanAsk){.ask = 1, .depth = FIRST_DEPTH, .width = w, .explore = 1};
    if (best > 0) {
        int deeper = ++pl->asks % DEEPEN_EVERY == 0 && best_d < POOL_MAX_DEPTH;
        return (PlanAsk){.ask = 1, .depth = best_d + deeper, .width = w, .explore = deeper};
    }
    /* Refresh the depth that came closest to paying. An ask costs only its wait: with a
     * useless pool the round still makes its AR step. */
    double cost = wait_cost(pl, decoder, best_d, n_pend);
    if (pl->skipped_ns >= EXPLORE_EVERY * (isnan(cost) ? 0 : cost))
        return (PlanAsk){.ask = 1, .depth = best_d, .width = w, .explore = 1};
    return (PlanAsk){.ask = 0, .depth = 0};
}

/* ---- observations ------------------------------------------------------------------ */

void planner_share_accept(Planner *pl, Planner *with) { pl->accept = with ? with : pl; }

void planner_share_passes(Planner *pl, Planner *with) { pl->passes = with ? with : pl; }

void planner_set_batch(Planner *pl, int others, int seqs) {
    pl->batched = 1;
    pl->batch_others = others > 0 ? others : 0;
    pl->batch_seqs = seqs;
}

static void observe_rows(Planner *pl, int rows, uint64_t ns) {
    if (rows < 1) return;
    if (rows > ROWS_MAX) rows = ROWS_MAX;
    ewma(&pl->pass_ns[rows], (double)ns, pl->pass_n[rows]++ == 0);
}

void planner_observe_batch_pass(Planner *pl, int total_rows, uint64_t ns) {
    pthread_mutex_lock(&pl->mu); /* it may be shared (planner_share_passes) */
    observe_rows(pl, total_rows, ns);
    pthread_mutex_unlock(&pl->mu);
}

void planner_observe_pass(Planner *pl, int rows, uint64_t ns) {
    if (pl->batched) return;
    if (rows < 1) return;
    if (rows > ROWS_MAX) rows = ROWS_MAX;
    ewma(&pl->pass_ns[rows], (double)ns, pl->pass_n[rows]++ == 0);
}

void planner_observe_pool(Planner *pl, const Pool *pool, int n_commit, uint64_t total_ns,
                          uint64_t waited_ns) {
    int first = !pl->have_pool;
    if (n_commit > 0) ewma(&pl->commit_tok_ns, (double)pool->commit_pass_ns / n_commit, first);
    /* A first pool after the prompt's prefill would price every later commit like that
     * prefill, and a drafter that costs a quarter of the target would never be asked
     * again; until a round's commit is measured, one token's share stands in (low: the
     * next ask measures it). */
    if (n_commit <= COMMIT_LONG) {
        ewma(&pl->commit_ns, (double)pool->commit_pass_ns, !pl->have_commit);
        pl->have_commit = 1;
    } else if (!pl->have_commit) {
        pl->commit_ns = pl->commit_tok_ns;
    }
    if (pool->n_passes > 1) {
        double lv = (double)(pool->draft_ns - pool->commit_pass_ns) / (pool->n_passes - 1);
        if (pool->n_expanded == pool->n_passes - 1) { /* one node a level: a chain */
            ewma(&pl->chain_level_ns, lv, !pl->have_chain_level);
            pl->have_chain_level = 1;
        } else {
            ewma(&pl->level_ns, lv, !pl->have_level);
            pl->have_level = 1;
        }
    }
    /* the overhead shows only where the target really waited for the pool */
    if (first || waited_ns > 50000) {
        double extra = (double)total_ns - (double)pool->draft_ns;
        ewma(&pl->extra_ns, extra > 0 ? extra : 0, first);
    }
    pl->have_pool = 1;
}

static int in_list(const int *a, int n, int v) {
    for (int i = 0; i < n; i++)
        if (a[i] == v) return 1;
    return 0;
}

void planner_observe_accept(Planner *pl, DecoderKind decoder, int temp, const Pool *pool,
                            const Selection *sel, int k, const int *acc, int n_acc) {
    int t = temp != 0;
    for (int i = 0; i < k; i++) {
        int par = sel->t.parent[i], u = sel->t.node[i];
        if (sel->rooted_at_x1 && i == 0) continue;   /* X1: drawn, not predicted */
        if (decoder == DECODER_ROOT && par < 0) continue;  /* first level: known from X1 */
        int reached = par < 0 || (sel->rooted_at_x1 && par == 0) || in_list(acc, n_acc, par);
        if (!reached) continue;
        int b = bucket_of(pool->logq[u]);
        pthread_mutex_lock(&pl->accept->mu);
        pl->accept->acc_a[t][b] += in_list(acc, n_acc, i);
        pl->accept->acc_q[t][b] += exp(pool->logq[u]);
        pthread_mutex_unlock(&pl->accept->mu);
    }
}

void planner_observe_round(Planner *pl, DecoderKind decoder, int temp, int tokens, uint64_t ns,
                           int asked) {
    double *tok = &pl->rate_tok[decoder][temp != 0], *t_ns = &pl->rate_ns[decoder][temp != 0];
    int first = *t_ns == 0;
    ewma_w(tok, tokens, first, RATE_EWMA);
    ewma_w(t_ns, (double)ns, first, RATE_EWMA);
    pl->skipped_ns = asked ? 0 : pl->skipped_ns + (double)ns;
}
