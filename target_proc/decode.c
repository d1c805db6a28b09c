/* Target-side decoding (DESIGN.md §3-§5), one round at a time, in named steps:
 *   drafter_ask    send the drafter last round's tokens; it starts growing the pool
 *   round_root     [root-pass rules] forward the continuation alone, draw X1 from p0
 *   round_receive  wait for the pool
 *   round_select   pick the rule's tree and lay out the tree pass
 *   round_verify   one tree-masked pass, then exhaustive target sampling down the tree
 *   round_commit   keep root + accepted path in the KV cache, output the tokens
 * round_ar is the autoregressive round: plain AR, and the fallback once a drafter fails.
 * The target's passes themselves are in target.c. */
#include "decode.h"
#include "common/logits.h"
#include "kernels/prefill.h"
#include "planner.h"
#include <math.h>
#include <string.h>

/* Target log-probabilities of (pass slot, token) pairs (slot -1: the root), asked of the
 * backend in batches: one rows_stats over the rows not yet reduced, and when sampling one
 * gather of the pairs' logits (log p under the sampling law: row_stats_logp). Greedy, the
 * target's law is the point mass on the row's argmax (log p 0 or -inf). Pairs are listed
 * per slot, so a lookup scans a node's children. */
#define PROBE_MAX (POOL_MAX + 1) /* every pool node under its parent, and X1 */
typedef struct {
    int n;
    int slot[PROBE_MAX], tok[PROBE_MAX], next[PROBE_MAX];
    double logp[PROBE_MAX];          /* NAN until resolved */
    int head[DECODE_PASS_MAX + 1];   /* by 1 + slot: first pair, -1 none */
    int have_st[DECODE_PASS_MAX + 1];
    RowStats st[DECODE_PASS_MAX + 1]; /* by 1 + slot, where have_st */
} Probe;

/* One decode's state across rounds. */
typedef struct {
    Target *t;
    Drafter *drafter;
    const DecodeOpts *opts;
    const DecodeHooks *h;
    DecodeResult *res;
    Rng rng;
    int use_drafter;   /* 0 for AR, and from a drafter failure on */
    int reserve;       /* KV entries a round may need (decode_round_reserve) */
    int root;          /* the continuation: the context's last token, not yet in the KV */
    /* What the next grow request sends: every token committed since the last request
     * (the prompt before the first; rounds the planner decoded without the drafter add
     * theirs). synced: the drafter has this decode's context (the first request resets). */
    int *pend;         // (pend_cap)
    int n_pend, pend_cap, synced;
    int depth, width;  /* the pool shape last set on the drafter, 0: none yet */
    /* The growth asked for and not yet taken by a round: when, and how many tokens it
     * committed (the first request goes out before the prefill, decode_ask_early). */
    int asked;
    uint64_t t_asked;
    int n_asked;
    /* EAGLE-3 drafters: the target's features of the pending rows (row i: the token before
     * pend[i]); NULL for a drafter that needs none */
    float *feat;       // (feat_rows, feat_w)
    int feat_w, feat_rows;
    int done;
    /* Time spent on measurements that are not decoding (tau, root_margin) in this decode;
     * dec_now() leaves it off the round timestamps and the decode's time (DESIGN.md §6 speed). */
    uint64_t clock_skip;
    TreePass ps;
    Probe probe;              /* this round's target probabilities */
    double root_logp[POOL_MAX]; /* root-pass rules: log p0 of each first-level pool node */
    float *root_logits; /* with DecodeHooks.on_rows: the last root row (vocab) */
} Decode;

/* One round's state. emitted[j] is the round's j-th token; keep[j] the pending KV entry of
 * the token before it (keep[0] = 0, the root), so the first m tokens leave keep[0..m). */
typedef struct {
    RoundInfo info;
    int emitted[ROUND_MAX_EMIT], keep[ROUND_MAX_EMIT], n_emit, accepted;
    int row[ROUND_MAX_EMIT]; /* the kept target row emitted[j] was drawn from */
    int have_root; /* the root pass ran: its row is kept in the target's backend */
    RowStats root_st; /* that row's statistics (T=1: with the draw of x1) */
    int x1;        /* the draw from the root row (root-pass rules, AR) */
    Selection sel;
    int with_root; /* the tree pass carries the root (draft rule: no root pass) */
    int x1_node;   /* root rule: tree index of X1 on the first level, -1 if off it */
    int skip;      /* root rule with X1 off the tree, or a planner's empty tree after the
                      root pass: no tree pass, X1 is the continuation */
    int acc[ROUND_MAX_EMIT], n_acc; /* tree indices accepted by the walk (X1's node of an
                                       X1-rooted tree left out) */
    int asked;     /* the drafter was asked this round */
    int n_sent;    /* tokens the request committed */
    uint64_t skip0;
} Round;

/* The decode's clock: monotonic ns less the measurement time skipped so far. Nothing else
 * of the decode runs while a measurement does (the pool is in, the drafter waits for the
 * next commit), so this is the timeline the decode would have without measuring. */
static uint64_t dec_now(const Decode *dec) { return rs_now_ns() - dec->clock_skip; }

/* Runs a measurement's code off the decode's clock. */
#define OFF_CLOCK(dec, ...)                               \
    do {                                                  \
        uint64_t off_clock_t0_ = rs_now_ns();             \
        __VA_ARGS__;                                      \
        (dec)->clock_skip += rs_now_ns() - off_clock_t0_; \
    } while (0)

int decode_round_reserve(const DecodeOpts *opts) {
    if (opts->decoder == DECODER_AR) return 1; /* the root alone */
    /* the root, the tree (X1 off the pool is one of its B nodes) or the scoring pass */
    return 1 + (opts->score_all ? DECODE_PASS_MAX : opts->budget);
}

/* ---- target probabilities from a round's rows (selection, tau, offline scoring) ------ */


static void probe_init(Probe *pr) {
    pr->n = 0;
    for (int i = 0; i <= DECODE_PASS_MAX; i++) pr->head[i] = -1, pr->have_st[i] = 0;
}

static int probe_find(const Probe *pr, int slot, int tok) {
    for (int i = pr->head[1 + slot]; i >= 0; i = pr->next[i])
        if (pr->tok[i] == tok) return i;
    return -1;
}

static void probe_add(Probe *pr, int slot, int tok) {
    if (probe_find(pr, slot, tok) >= 0) return;
    int i = pr->n++;
    RS_ASSERT(i < PROBE_MAX && slot >= -1 && slot < DECODE_PASS_MAX);
    pr->slot[i] = slot;
    pr->tok[i] = tok;
    pr->logp[i] = NAN;
    pr->next[i] = pr->head[1 + slot];
    pr->head[1 + slot] = i;
}

/* Reduces the kept rows of the slots that have unresolved pairs and no stats yet. */
static int probe_stats(Probe *pr, const Target *t, const Sampling *smp, RsErr *e) {
    int rows[DECODE_PASS_MAX + 1], idx[DECODE_PASS_MAX + 1], nr = 0;
    for (int i = 0; i < pr->n; i++) {
        int k = 1 + pr->slot[i];
        if (!isnan(pr->logp[i]) || pr->have_st[k]) continue;
        pr->have_st[k] = 1; /* listed once */
        idx[nr] = k;
        rows[nr++] = target_row(t, pr->slot[i]);
    }
    if (nr == 0) return RS_OK;
    RowStats st[DECODE_PASS_MAX + 1];
    int rc = backend_rows_stats(t->b, rows, nr, smp, NULL, st, e);
    for (int j = 0; j < nr; j++) pr->st[idx[j]] = st[j];
    return rc;
}

/* Every pair still NAN gets its log-probability from the kept rows of the last pass. */
static int probe_resolve(Probe *pr, const Target *t, const Sampling *smp, RsErr *e) {
    int rc = probe_stats(pr, t, smp, e);
    if (rc) return rc;
    int pend[PROBE_MAX], rows[PROBE_MAX], ids[PROBE_MAX], np = 0;
    for (int i = 0; i < pr->n; i++) {
        if (!isnan(pr->logp[i])) continue;
        const RowStats *st = &pr->st[1 + pr->slot[i]];
        if (sampling_greedy(smp)) {
            pr->logp[i] = pr->tok[i] == st->argmax ? 0.0 : -INFINITY;
            continue;
        }
        pend[np] = i;
        rows[np] = target_row(t, pr->slot[i]);
        ids[np++] = pr->tok[i];
    }
    if (np == 0) return RS_OK;
    float val[PROBE_MAX];
    rc = backend_rows_gather(t->b, rows, ids, np, val, e);
    for (int j = 0; !rc && j < np; j++)
        pr->logp[pend[j]] = row_stats_logp(&pr->st[1 + pr->slot[pend[j]]], val[j]);
    return rc;
}

/* Target probability of `tok` at the prefix ending in pass slot `slot` (-1: the root). */
static double probe_prob(const Probe *pr, int slot, int tok) {
    int i = probe_find(pr, slot, tok);
    RS_ASSERT(i >= 0 && !isnan(pr->logp[i]));
    return exp(pr->logp[i]);
}

/* ---- the tree pass's layout --------------------------------------------------------- */

static void pass_init(TreePass *ps, const Pool *p) {
    ps->n = 0;
    ps->x1_slot = -1;
    for (int i = 0; i < p->n; i++) ps->slot_of_pool[i] = -1;
}

/* Adds pool node u to the pass unless there already; its parent must be there. */
static void pass_add_node(TreePass *ps, const Pool *p, int u) {
    if (ps->slot_of_pool[u] >= 0) return;
    int i = ps->n++;
    RS_ASSERT(i < DECODE_PASS_MAX);
    ps->token[i] = p->token[u];
    int par = p->parent[u];
    ps->parent[i] = par < 0 ? -1 : ps->slot_of_pool[par];
    RS_ASSERT(par < 0 || ps->parent[i] >= 0);
    ps->depth[i] = p->depth[u];
    ps->pool_node[i] = u;
    ps->slot_of_pool[u] = i;
}

/* Adds a selection's nodes to the pass (shared nodes once). */
static void pass_add(TreePass *ps, const Pool *p, const Selection *sel) {
    for (int k = 0; k < sel->t.n; k++) {
        int u = sel->t.node[k];
        if (u != TREE_X1_OFFPOOL) {
            pass_add_node(ps, p, u);
        } else if (ps->x1_slot < 0) {
            int i = ps->n++;
            ps->token[i] = sel->x1_token;
            ps->parent[i] = -1;
            ps->depth[i] = 1;
            ps->pool_node[i] = u;
            ps->x1_slot = i;
        }
    }
}

/* Adds every expanded pool node (creation order puts parents first). Every candidate's
 * parent is the root or expanded, so with these rows the pass knows each candidate's
 * target probability: what scoring any tree, and finding the oracle's, needs. */
static void pass_add_expanded(TreePass *ps, const Pool *p) {
    for (int u = 0; u < p->n; u++)
        if (p->n_children[u] > 0) pass_add_node(ps, p, u);
}

static int pass_slot(const TreePass *ps, const Selection *sel, int k) {
    int u = sel->t.node[k];
    return u == TREE_X1_OFFPOOL ? ps->x1_slot : ps->slot_of_pool[u];
}

/* ---- measurements (off the decode's clock) ------------------------------------------ */

/* The (slot, token) pairs a selection's tau reads: each node under its parent's row. */
static void probe_add_selection(Probe *pr, const TreePass *ps, const Pool *pool,
                                const Selection *sel) {
    for (int k = 0; k < sel->t.n; k++) {
        int pk = sel->t.parent[k];
        int tok = sel->t.node[k] == TREE_X1_OFFPOOL ? sel->x1_token : pool->token[sel->t.node[k]];
        probe_add(pr, pk < 0 ? -1 : pass_slot(ps, sel, pk), tok);
    }
}

/* Expected acceptance of a selection from the probe (its pairs resolved): tree_tau, or
 * with x1_node >= 0 (root selection's tree, X1 on its first level at that tree index) the
 * value given X1 (tree_tau_given_x1). */
static double selection_tau(const Probe *pr, const TreePass *ps, const Pool *pool,
                            const Selection *sel, int x1_node) {
    double trans[TREE_MAX];
    for (int k = 0; k < sel->t.n; k++) {
        int pk = sel->t.parent[k];
        int tok = sel->t.node[k] == TREE_X1_OFFPOOL ? sel->x1_token : pool->token[sel->t.node[k]];
        trans[k] = probe_prob(pr, pk < 0 ? -1 : pass_slot(ps, sel, pk), tok);
    }
    return x1_node >= 0 ? tree_tau_given_x1(sel, trans, x1_node) : tree_tau(sel, trans);
}

/* score_all: the tau of every rule's tree for this round's pool and X1, and the oracle's
 * (DESIGN.md §3), whose B-set is chosen from every candidate's target path probability. Needs
 * a pass that holds the expanded nodes (pass_add_expanded). Only these numbers per node
 * leave the backend: every candidate's logit and its parent row's log-sum-exp. */
static int score_rules(Decode *dec, int x1, RoundInfo *ri, RsErr *e) {
    const Target *t = dec->t;
    const Pool *pool = t->pool;
    const TreePass *ps = &dec->ps;
    Probe *pr = &dec->probe;
    int B = dec->opts->budget;
    Selection sel[DECODER_COUNT];
    select_draft(pool, B, &sel[DECODER_DRAFT]);
    select_pearl(pool, B, x1, &sel[DECODER_PEARL]);
    select_rootdraw(pool, B, x1, &sel[DECODER_ROOTDRAW]);
    select_root_logp(pool, B, dec->root_logp, x1, &sel[DECODER_ROOT]);
    for (int u = 0; u < pool->n; u++) {
        int par = pool->parent[u];
        int slot = par < 0 ? -1 : ps->slot_of_pool[par];
        RS_ASSERT(par < 0 || slot >= 0);
        probe_add(pr, slot, pool->token[u]);
    }
    for (int r = DECODER_DRAFT; r <= DECODER_ROOT; r++) probe_add_selection(pr, ps, pool, &sel[r]);
    int rc = probe_resolve(pr, t, &dec->opts->sampling, e);
    if (rc) return rc;
    double path[POOL_MAX]; /* p(u | c): product of target transitions along u's path */
    for (int u = 0; u < pool->n; u++) {
        int par = pool->parent[u];
        int slot = par < 0 ? -1 : ps->slot_of_pool[par];
        path[u] = (par < 0 ? 1.0 : path[par]) * probe_prob(pr, slot, pool->token[u]);
    }
    select_oracle(pool, B, path, &sel[DECODER_ORACLE]);
    ri->have_tau_rule = 1;
    for (int r = DECODER_DRAFT; r <= DECODER_ORACLE; r++) {
        ri->tau_rule[r] = selection_tau(pr, ps, pool, &sel[r], -1);
        ri->tree_size_rule[r] = sel[r].t.n;
    }
    return RS_OK;
}

/* tau is an offline measure of the tree (DESIGN.md §4), not part of decoding. */
static int round_measure(Decode *dec, Round *r, RsErr *e) {
    Probe *pr = &dec->probe;
    const Pool *pool = dec->t->pool;
    if (!r->skip) probe_add_selection(pr, &dec->ps, pool, &r->sel);
    int rc = dec->opts->score_all ? score_rules(dec, r->x1, &r->info, e)
                             : probe_resolve(pr, dec->t, &dec->opts->sampling, e);
    if (!rc && !r->skip) r->info.tau = selection_tau(pr, &dec->ps, pool, &r->sel, r->x1_node);
    return rc;
}

/* ---- the drafter -------------------------------------------------------------------- */

static void emit_event(const DecodeHooks *h, const char *ev, const char *detail) {
    if (h && h->on_event) h->on_event(h->user, ev, detail);
}

/* The decode goes on autoregressively; every emitted token is kept. */
static void drafter_failed(Decode *dec, const RsErr *e) {
    char msg[1100];
    snprintf(msg, sizeof msg, "drafter failed (%s); finishing autoregressively", e ? e->msg : "?");
    emit_event(dec->h, "drafter_failed", msg);
    dec->res->drafter_failed = 1;
    dec->use_drafter = 0;
}

/* Sends the drafter the tokens it has not committed (the whole prompt first, resetting its
 * context) and lets it grow the next pool, `depth` levels deep, `width` nodes expanded a
 * level. 0: the drafter failed. */
static int drafter_ask(Decode *dec, int depth, int width, RsErr *e) {
    if (depth != dec->depth || width != dec->width) drafter_set_shape(dec->drafter, depth, width);
    dec->depth = depth;
    dec->width = width;
    dec->t_asked = dec_now(dec);
    size_t fb = dec->feat ? sizeof(float) * (size_t)dec->n_pend * dec->feat_w : 0;
    int rc = drafter_grow_begin(dec->drafter, dec->pend, dec->n_pend, !dec->synced,
                                fb ? dec->feat : NULL, fb, e);
    if (rc) {
        drafter_failed(dec, e);
        return 0;
    }
    dec->synced = 1;
    dec->n_asked = dec->n_pend;
    dec->n_pend = 0;
    dec->asked = 1;
    return 1;
}

/* The round takes the growth asked for. */
static void round_take_ask(Decode *dec, Round *r) {
    r->info.t_grow_sent = dec->t_asked;
    r->n_sent = dec->n_asked;
    r->asked = 1;
    r->info.plan_depth = dec->depth;
    r->info.plan_width = dec->width;
    dec->asked = 0;
}

/* The pool shape --pool-shape fixes, the full shape where it does not. */
static void fixed_shape(const Decode *dec, int *depth, int *width) {
    *depth = dec->opts->pool_depth ? dec->opts->pool_depth : POOL_MAX_DEPTH;
    *width = dec->opts->pool_width ? dec->opts->pool_width : POOL_EXPAND;
}

/* A drafter that needs nothing from the target's prefill (no features) gets its first
 * request before that prefill: its own prefill of the prompt and the first pool then run
 * while the target's prefill does, not after it. The pool is the same. Not with the
 * planner, whose first round may go without the drafter. */
static void decode_ask_early(Decode *dec, RsErr *e) {
    if (!dec->use_drafter || dec->feat || dec->opts->planner) return;
    int depth, width;
    fixed_shape(dec, &depth, &width);
    drafter_ask(dec, depth, width, e);
}

/* A growth asked for that no round took (the decode stopped before its first round, or
 * failed): its pool is read and dropped, so the next decode finds the drafter idle. */
static void drop_ask(Decode *dec) {
    if (!dec->asked) return;
    RsErr ignored = {0};
    drafter_grow_end(dec->drafter, dec->t->pool, &ignored);
    dec->asked = 0;
}

/* Waits for the pool into t->pool. 0: the drafter failed. */
static int round_receive(Decode *dec, Round *r, RsErr *e) {
    const Pool *pool = dec->t->pool;
    int rc = drafter_grow_end(dec->drafter, dec->t->pool, e);
    r->info.t_pool_recv = dec_now(dec);
    if (rc) {
        drafter_failed(dec, e);
        return 0;
    }
    if (!sampling_greedy(&dec->opts->sampling)) pool_temper(dec->t->pool, dec->opts->sampling.temperature);
    r->info.draft_ns = pool->draft_ns;
    r->info.draft_commit_ns = pool->commit_pass_ns;
    r->info.draft_host_ns = pool->draft_host_ns;
    r->info.draft_rows = pool->draft_rows;
    return 1;
}

/* ---- the round's steps -------------------------------------------------------------- */

static void round_begin(Decode *dec, Round *r, int round) {
    memset(r, 0, sizeof *r);
    r->info.round = round;
    r->info.x1_in_pool = -1;
    r->info.tau = NAN;
    r->info.root_margin = NAN;
    for (int k = 0; k < DECODER_COUNT; k++) r->info.tau_rule[k] = NAN;
    r->info.t_round_start = dec_now(dec);
    r->skip0 = dec->clock_skip;
    r->x1 = r->x1_node = -1;
    r->info.plan_k = -1;
    r->info.plan_tokens = r->info.plan_ns = NAN;
}

/* The root pass; its draw from the root row is X1 (or AR's next token). */
static int round_root(Decode *dec, Round *r, RsErr *e) {
    Target *t = dec->t;
    r->info.t_root_start = dec_now(dec);
    int rc = target_root_pass(t, dec->root, e);
    r->info.t_root_end = dec_now(dec);
    if (rc) return rc;
    /* X1 (AR's next token) drawn where the row lives: its argmax, or when sampling the draw
     * at the decode's next uniform (one per draw, as ever, so a seed gives the same stream). */
    int row = target_row(t, -1), temp = sampling_temp(&dec->opts->sampling);
    double u = temp ? rng_uniform(&dec->rng) : -1.0;
    rc = backend_rows_stats(t->b, &row, 1, &dec->opts->sampling, temp ? &u : NULL, &r->root_st, e);
    if (rc) return rc;
    OFF_CLOCK(dec, r->info.root_margin = (double)r->root_st.max - (double)r->root_st.second);
    r->have_root = 1;
    r->x1 = r->root_st.draw;
    if (dec->h && dec->h->on_rows) { /* X1's row: a tree pass may replace it before the commit */
        if (!dec->root_logits) dec->root_logits = rs_xmalloc(sizeof(float) * (size_t)t->vocab);
        rc = backend_rows_copy(t->b, &row, 1, dec->root_logits, e);
    }
    return rc;
}

/* Autoregressive round: the root pass alone (unless it ran already); its draw is the
 * continuation. */
static int round_ar(Decode *dec, Round *r, RsErr *e) {
    r->info.fallback_ar = dec->opts->decoder != DECODER_AR && !dec->use_drafter;
    if (!r->have_root) {
        int rc = round_root(dec, r, e);
        if (rc) return rc;
    }
    r->row[r->n_emit] = -1;
    r->emitted[r->n_emit++] = r->x1;
    r->keep[0] = 0;
    return RS_OK;
}

/* Tests only (test_wrong_x1): X1 drawn from the drafter's first level instead of p0. */
static void wrong_x1(Decode *dec, Round *r) {
    const Pool *pool = dec->t->pool;
    double z = 0, u;
    for (int k = 0; k < pool->root_n_children; k++) z += exp(pool->logq[k]);
    u = rng_uniform(&dec->rng) * z;
    for (int k = 0; k < pool->root_n_children; k++) {
        r->x1 = pool->token[k];
        if ((u -= exp(pool->logq[k])) < 0) break;
    }
}

/* Root-pass rules, while the root pass's row is still kept (the tree pass replaces it):
 * log p0 of every first-level pool token and of X1, for root selection and for tau. */
static int root_probe(Decode *dec, Round *r, RsErr *e) {
    const Pool *pool = dec->t->pool;
    Probe *pr = &dec->probe;
    pr->have_st[0] = 1;
    pr->st[0] = r->root_st;
    for (int k = 0; k < pool->root_n_children; k++)
        probe_add(pr, -1, pool->token[pool->root_first_child + k]);
    probe_add(pr, -1, r->x1);
    int rc = probe_resolve(pr, dec->t, &dec->opts->sampling, e);
    /* Root selection ranks by log of p0 rounded to float, as it did when p0 was a float
     * softmax of the copied row: a seed keeps selecting the same trees. */
    for (int k = 0; !rc && k < pool->root_n_children; k++) {
        double lp = pr->logp[probe_find(pr, -1, pool->token[pool->root_first_child + k])];
        float p0 = (float)exp(lp);
        dec->root_logp[k] = p0 > 0 ? log((double)p0) : -INFINITY;
    }
    return rc;
}

/* ---- the cost-aware budget (planner.h) -------------------------------------------- */

/* Cuts the rule's selection (made at the cap) to the planner's size: a prefix of its
 * ranked nodes, which is a tree. */
static void plan_size(Decode *dec, Round *r) {
    const DecodeOpts *opts = dec->opts;
    PlanChoice c = planner_choose(opts->planner, opts->decoder, sampling_temp(&opts->sampling),
                                  dec->t->pool, &r->sel, r->have_root ? r->x1 : -1, dec->depth);
    r->sel.t.n = c.k;
    r->info.plan_k = c.k;
    r->info.plan_tokens = c.tokens;
    r->info.plan_ns = c.ns;
}

/* What the round measured, for the planner's next choices. */
static void plan_observe(Decode *dec, const Round *r) {
    Planner *pl = dec->opts->planner;
    const RoundInfo *ri = &r->info;
    if (ri->t_root_end) planner_observe_pass(pl, 1, ri->t_root_end - ri->t_root_start);
    if (ri->t_tree_end && !dec->opts->score_all)
        planner_observe_pass(pl, dec->ps.n + r->with_root, ri->t_tree_end - ri->t_tree_start);
    if (r->asked) {
        uint64_t own = ri->t_root_end > ri->t_grow_sent ? ri->t_root_end : ri->t_grow_sent;
        planner_observe_pool(pl, dec->t->pool, r->n_sent, ri->t_pool_recv - ri->t_grow_sent,
                             ri->t_pool_recv > own ? ri->t_pool_recv - own : 0);
        planner_observe_accept(pl, dec->opts->decoder, sampling_temp(&dec->opts->sampling),
                               dec->t->pool, &r->sel, r->sel.t.n, r->acc, r->n_acc);
    }
    planner_observe_round(pl, dec->opts->decoder, sampling_temp(&dec->opts->sampling), r->n_emit,
                          ri->t_commit - ri->t_round_start, r->asked);
}

/* The rule's tree (DESIGN.md §3) and the pass that verifies it. */
static int round_select(Decode *dec, Round *r, RsErr *e) {
    Target *t = dec->t;
    const Pool *pool = t->pool;
    int B = dec->opts->budget, x1 = r->x1;
    probe_init(&dec->probe);
    if (r->have_root) {
        int rc = root_probe(dec, r, e);
        if (rc) return rc;
    }
    switch (dec->opts->decoder) {
    case DECODER_DRAFT: select_draft(pool, B, &r->sel); break;
    case DECODER_PEARL: select_pearl(pool, B, x1, &r->sel); break;
    case DECODER_ROOTDRAW: select_rootdraw(pool, B, x1, &r->sel); break;
    case DECODER_ROOT: select_root_logp(pool, B, dec->root_logp, x1, &r->sel); break;
    default: RS_ASSERT(!"rule");
    }
    if (dec->opts->planner) plan_size(dec, r);
    pass_init(&dec->ps, pool);
    pass_add(&dec->ps, pool, &r->sel);
    if (dec->opts->score_all) pass_add_expanded(&dec->ps, pool);
    r->info.t_select_done = dec_now(dec);
    r->info.x1_in_pool = r->have_root ? r->sel.x1_in_pool : -1;
    r->info.tree_size = r->sel.t.n;
    r->with_root = !r->have_root;
    if (dec->opts->decoder == DECODER_ROOT) r->x1_node = tree_child_with_token(pool, &r->sel, -1, x1);
    r->skip = (dec->opts->decoder == DECODER_ROOT && r->x1_node < 0) || (r->have_root && r->sel.t.n == 0);
    r->info.tree_pass_skipped = r->skip;
    /* Root selection's tau is taken given its X1, like pearl's and rootdraw's: with X1
     * off the first level nothing can be accepted. The unconditional tau would be
     * unknown here at T=1 (no tree pass), and a mean over only the rounds that have
     * it overstates acceptance, since those are the rounds X1 landed in the tree. */
    if (r->skip) r->info.tau = 0.0;
    return RS_OK;
}

/* ---- the walk down the tree: exhaustive target sampling (DESIGN.md §4) ----------------
 * Each step draws from the target's row at the current node (its argmax, or when sampling
 * the draw at the decode's next uniform) and descends while the draw labels a child; the
 * first draw that does not is the continuation. Where a row query is a device round trip
 * (backend_batch_queries), one backend_rows_stats reduces every row the walk may visit
 * before it starts, each at the uniform its step would take: the walk's k-th draw takes
 * the k-th uniform, so a node at tree depth d gets uniform d - base (base 1 when the walk
 * starts below the root: X1 accepted, or forced from the root row; 0 from the root row).
 * The generator is then set back and advanced by the draws the walk made, so tokens and
 * the stream of draws are those of one query per draw. */
typedef struct {
    int batched;             /* 1: draws from draw[], else one query per draw */
    int draw[TREE_MAX + 1];  /* by 1 + tree index (0: the root row): the draw at its row */
    Rng rng0;                /* the generator before the walk's first draw */
    int n_draws;             /* draws the walk made */
} Walk;

/* The kept target row of tree node cur (-1: the root). */
static int walk_row(const Decode *dec, const Round *r, int cur) {
    return target_row(dec->t, cur < 0 ? -1 : pass_slot(&dec->ps, &r->sel, cur));
}

/* Fills w->draw with one query over the rows a walk starting at depth `base` may visit
 * and draws the uniforms it may take (w->rng0: the generator before them). */
static int walk_prefetch(Decode *dec, const Round *r, int base, Walk *w, RsErr *e) {
    const Selection *sel = &r->sel;
    const Sampling *smp = &dec->opts->sampling;
    int rows[TREE_MAX + 1], at[TREE_MAX + 1], dep[TREE_MAX], n = 0, max_dep = base;
    double u[TREE_MAX + 1], uu[TREE_MAX + 1];
    for (int k = 0; k < sel->t.n; k++) {
        dep[k] = sel->t.parent[k] < 0 ? 1 : dep[sel->t.parent[k]] + 1;
        if (dep[k] > max_dep) max_dep = dep[k];
    }
    w->rng0 = dec->rng;
    int temp = sampling_temp(smp);
    for (int i = 0; i <= max_dep - base; i++) uu[i] = temp ? rng_uniform(&dec->rng) : -1.0;
    for (int k = base ? 0 : -1; k < sel->t.n; k++) {
        at[n] = 1 + k;
        rows[n] = walk_row(dec, r, k);
        u[n++] = uu[k < 0 ? 0 : dep[k] - base];
    }
    RowStats st[TREE_MAX + 1];
    int rc = backend_rows_stats(dec->t->b, rows, n, smp, temp ? u : NULL, st, e);
    for (int i = 0; !rc && i < n; i++) {
        w->draw[at[i]] = st[i].draw;
        /* the measurements read these rows' statistics too: no query of their own */
        int slot = at[i] ? pass_slot(&dec->ps, sel, at[i] - 1) : -1;
        dec->probe.have_st[1 + slot] = 1;
        dec->probe.st[1 + slot] = st[i];
    }
    return rc;
}

/* The walk's next draw, from tree node cur's kept row `row` (cur -1: the root). */
static int walk_draw(Decode *dec, Walk *w, int cur, int row, int *y, RsErr *e) {
    w->n_draws++;
    if (w->batched) {
        *y = w->draw[1 + cur];
        return RS_OK;
    }
    int temp = sampling_temp(&dec->opts->sampling);
    double u = temp ? rng_uniform(&dec->rng) : -1.0;
    RowStats st;
    int rc = backend_rows_stats(dec->t->b, &row, 1, &dec->opts->sampling, temp ? &u : NULL, &st, e);
    *y = st.draw;
    return rc;
}

/* Sets up the walk (batched where the backend wants it) and returns its first node: -1
 * the root, or 0 when the tree is rooted at X1 (then X1 is emitted here). */
static int walk_begin(Decode *dec, Round *r, Walk *w, int forced) {
    const Selection *sel = &r->sel;
    RS_ASSERT(!(sel->rooted_at_x1 && forced >= 0));
    w->n_draws = 0;
    w->batched = backend_batch_queries(dec->t->b);
    if (w->batched) {
        RsErr ignored = {0}; /* a row the walk may not read has no law: query per draw */
        if (walk_prefetch(dec, r, sel->rooted_at_x1 || forced >= 0, w, &ignored)) {
            dec->rng = w->rng0;
            w->batched = 0;
        }
    }
    if (!sel->rooted_at_x1) return -1;
    r->row[r->n_emit] = -1;
    r->emitted[r->n_emit++] = r->x1;
    r->accepted++;
    r->keep[r->n_emit] = 1 + pass_slot(&dec->ps, sel, 0);
    return 0;
}

/* A batched walk's generator: as if each draw had taken its uniform as it went. */
static void walk_end(Decode *dec, const Walk *w) {
    if (!w->batched) return;
    dec->rng = w->rng0;
    if (sampling_temp(&dec->opts->sampling))
        for (int i = 0; i < w->n_draws; i++) rng_uniform(&dec->rng);
}

static int round_accept(Decode *dec, Round *r, RsErr *e) {
    const Selection *sel = &r->sel;
    uint64_t calls0 = backend_stats(dec->t->b).rows_stats_calls;
    int forced = dec->opts->decoder == DECODER_ROOT ? r->x1 : -1; /* X1, from the root row */
    Walk w;
    int cur = walk_begin(dec, r, &w, forced), rc = RS_OK;
    for (;;) {
        int y = forced, row = -1;
        if (y < 0) {
            row = walk_row(dec, r, cur);
            if ((rc = walk_draw(dec, &w, cur, row, &y, e))) break;
        }
        forced = -1;
        int child = tree_child_with_token(dec->t->pool, sel, cur, y);
        r->row[r->n_emit] = row;
        r->emitted[r->n_emit++] = y;
        if (child < 0) break; /* y is the continuation */
        r->acc[r->n_acc++] = child;
        r->accepted++;
        r->keep[r->n_emit] = 1 + pass_slot(&dec->ps, sel, child);
        cur = child;
    }
    walk_end(dec, &w);
    r->info.walk_queries = (int)(backend_stats(dec->t->b).rows_stats_calls - calls0);
    return rc;
}

/* The tree pass and the walk down the tree (or, root rule with X1 off its tree, X1). */
static int round_verify(Decode *dec, Round *r, RsErr *e) {
    r->keep[0] = 0; /* the root */
    int pass = !r->skip || dec->opts->score_all, rc = RS_OK;
    if (pass) {
        r->info.t_tree_start = dec_now(dec);
        rc = target_tree_pass(dec->t, &dec->ps, dec->root, r->with_root, e);
        if (rc) return rc;
        r->info.t_tree_end = dec_now(dec);
    }
    if (r->skip) {
        r->row[r->n_emit] = -1;
        r->emitted[r->n_emit++] = r->x1;
    } else {
        rc = round_accept(dec, r, e);
    }
    /* after the walk, whose batched query left its rows' statistics in the probe */
    if (!rc && pass) OFF_CLOCK(dec, rc = round_measure(dec, r, e));
    return rc;
}

static int round_speculative(Decode *dec, Round *r, RsErr *e) {
    /* --pool-shape fixes what it gives; the planner picks the rest (DESIGN.md §5) */
    int depth, width;
    fixed_shape(dec, &depth, &width);
    if (dec->opts->planner && !dec->asked) {
        PlanAsk a = planner_before_round(dec->opts->planner, dec->opts->decoder,
                                         sampling_temp(&dec->opts->sampling), dec->n_pend);
        if (!a.ask) return round_ar(dec, r, e); /* the drafter catches up next time */
        if (!dec->opts->pool_depth) depth = a.depth;
        if (!dec->opts->pool_width) width = a.width;
    }
    if (!dec->asked && !drafter_ask(dec, depth, width, e)) return round_ar(dec, r, e);
    round_take_ask(dec, r);
    if (decoder_needs_root_pass(dec->opts->decoder)) {
        int rc = round_root(dec, r, e);
        if (rc) { /* the growth asked for ends here, so the next decode finds the drafter idle */
            RsErr ignored = {0};
            drafter_grow_end(dec->drafter, dec->t->pool, &ignored);
            return rc;
        }
    }
    if (!round_receive(dec, r, e)) return round_ar(dec, r, e);
    if (dec->opts->test_wrong_x1 && r->have_root) wrong_x1(dec, r);
    int rc = round_select(dec, r, e);
    return rc ? rc : round_verify(dec, r, e);
}

/* How many of the round's tokens the output takes: up to the first EOS, and no more than
 * --max-new (and the caller's buffer) allow. *eos: the last one taken ends the decode. */
static int output_take(const Decode *dec, const Round *r, int *eos) {
    int cap = dec->res->cap < dec->opts->max_new ? dec->res->cap : dec->opts->max_new;
    int room = cap - dec->res->n_tokens, m = 0;
    *eos = 0;
    while (m < r->n_emit && m < room)
        if (dec->t->eog[r->emitted[m++]] && !dec->opts->ignore_eos) {
            *eos = 1;
            break;
        }
    return m;
}

static void output_append(Decode *dec, const int *tok, int m, int eos) {
    DecodeResult *res = dec->res;
    memcpy(res->tokens + res->n_tokens, tok, sizeof(int) * (size_t)m);
    int visible = eos ? m - 1 : m; /* the EOS itself is not streamed */
    if (dec->h && dec->h->on_tokens && visible > 0) dec->h->on_tokens(dec->h->user, tok, visible);
    res->n_tokens += m;
    if (eos) res->hit_eos = 1;
}

/* ---- EAGLE-3 features ---------------------------------------------------------------
 * A drafter whose DrafterInfo names feature layers gets, with each commit, the target's
 * residual stream entering those layers for the token before each committed one. Those
 * are the rows the target commits itself: the prompt less its last token at the prefill
 * (row 0, for the first prompt token, has no token before it and is sent as zeros), then
 * each round's root and accepted path, kept by kv_commit for the round's emitted tokens
 * [a1..ak, c] (root, a1..ak): token p's state pairs with token p+1, as eagle3_forward.h
 * pairs a row's state with the next token's embedding. */

/* Asks the backend to record what the drafter needs (or nothing), after target_reset
 * (nothing pending). RS_EINVAL when the drafter's layers do not exist in this target (the
 * message names both). */
static int feat_begin(Decode *dec, int n_prompt, RsErr *e) {
    const DrafterInfo *in = dec->use_drafter ? drafter_info(dec->drafter) : NULL;
    Backend *b = dec->t->b;
    if (!in || in->n_feature_layers == 0) return backend_set_feature_layers(b, NULL, 0, e);
    int rc = backend_set_feature_layers(b, in->feature_layers, in->n_feature_layers, e);
    if (rc) {
        char why[sizeof e->msg];
        snprintf(why, sizeof why, "%s", e ? e->msg : "?");
        return rs_err(e, rc, "drafter %s wants the target's features, but %s", in->name, why);
    }
    dec->feat_w = backend_feature_width(b);
    dec->feat_rows = n_prompt > ROUND_MAX_EMIT ? n_prompt : ROUND_MAX_EMIT;
    dec->feat = calloc((size_t)dec->feat_rows * dec->feat_w, sizeof(float));
    if (!dec->feat)
        return rs_err(e, RS_ENOMEM, "cannot hold the features of a %d-token prompt (%zu MiB)",
                      n_prompt, ((size_t)dec->feat_rows * dec->feat_w * sizeof(float)) >> 20);
    return RS_OK;
}

/* The prompt less its last token into the KV cache; with features, rows 1.. of the first
 * request's features are the prefill's. */
static int feat_prefill(Decode *dec, const int *prompt, int n_prompt, RsErr *e) {
    if (dec->h && dec->h->on_prompt_rows)
        return target_prefill_rows(dec->t, prompt, n_prompt - 1,
                                   dec->feat ? dec->feat + dec->feat_w : NULL,
                                   dec->h->on_prompt_rows, dec->h->user, e);
    if (!dec->feat) return target_prefill(dec->t, prompt, n_prompt - 1, e);
    RS_ASSERT(backend_n_committed(dec->t->b) == 0); /* no fork: features need every row */
    return backend_prefill_features(dec->t->b, prompt, n_prompt - 1, NULL,
                                    dec->feat + dec->feat_w, e);
}

/* After a round's kv_commit (m rows kept): their features join the pending rows for the
 * next request. Once the decode has gone autoregressive, recording stops (nothing is
 * pending now). */
static void feat_after_commit(Decode *dec, int m) {
    if (!dec->use_drafter) {
        backend_set_feature_layers(dec->t->b, NULL, 0, NULL);
        free(dec->feat);
        dec->feat = NULL;
        return;
    }
    RS_ASSERT(backend_feature_rows(dec->t->b) == m);
    if (dec->n_pend + m > dec->feat_rows) {
        dec->feat_rows = 2 * (dec->n_pend + m);
        dec->feat = realloc(dec->feat, sizeof(float) * (size_t)dec->feat_rows * dec->feat_w);
        RS_ASSERT(dec->feat && "out of memory");
    }
    backend_read_features(dec->t->b, BACKEND_FEAT_F32, dec->feat + (size_t)dec->n_pend * dec->feat_w);
}

/* Appends tokens to what the drafter has not committed yet. */
static void pend_push(Decode *dec, const int *tok, int n) {
    if (dec->n_pend + n > dec->pend_cap) {
        dec->pend_cap = 2 * (dec->n_pend + n);
        dec->pend = realloc(dec->pend, sizeof(int) * (size_t)dec->pend_cap);
        RS_ASSERT(dec->pend && "out of memory");
    }
    memcpy(dec->pend + dec->n_pend, tok, sizeof(int) * (size_t)n);
    dec->n_pend += n;
}

/* Keeps the KV entries of the tokens the output takes (root + accepted path, cut where
 * the output is), outputs them, logs the round and sets up the next one. Tokens dropped
 * here (past --max-new or the first EOS) end the decode, so nothing is committed after
 * them: the target's KV holds the prompt and the output less its last token, as after
 * any round. */
/* DecodeHooks.on_rows for the round's first n tokens: the tree rows copied from the
 * backend now (they live until the next forward), X1's from round_root's copy. */
static int round_rows(Decode *dec, const Round *r, int n, RsErr *e) {
    if (!dec->h || !dec->h->on_rows) return RS_OK;
    int vocab = dec->t->vocab, kept[ROUND_MAX_EMIT], nk = 0;
    for (int j = 0; j < n; j++)
        if (r->row[j] >= 0) kept[nk++] = r->row[j];
    float *buf = rs_xmalloc(sizeof(float) * (size_t)vocab * (size_t)(nk ? nk : 1));
    const float *rows[ROUND_MAX_EMIT];
    int rc = nk ? backend_rows_copy(dec->t->b, kept, nk, buf, e) : RS_OK;
    for (int j = 0, k = 0; j < n; j++) {
        RS_ASSERT(r->row[j] >= 0 || dec->root_logits);
        rows[j] = r->row[j] >= 0 ? buf + (size_t)vocab * (size_t)k++ : dec->root_logits;
    }
    if (!rc) dec->h->on_rows(dec->h->user, rows, r->emitted, n, vocab);
    free(buf);
    return rc;
}

static int round_commit(Decode *dec, Round *r, RsErr *e) {
    Target *t = dec->t;
    DecodeResult *res = dec->res;
    RoundInfo *ri = &r->info;
    int eos, m = output_take(dec, r, &eos);
    int rc = m - eos > 0 ? round_rows(dec, r, m - eos, e) : RS_OK;
    if (!rc) rc = target_commit(t, r->keep, m, e);
    if (rc) return rc;
    ri->t_commit = dec_now(dec);
    ri->measure_ns = dec->clock_skip - r->skip0;
    if (dec->opts->planner && dec->opts->decoder != DECODER_AR) plan_observe(dec, r);
    ri->emitted = r->n_emit;
    ri->accepted = r->accepted;
    ri->dropped = r->n_emit - m;
    ri->graph_replays = backend_stats(t->b).graph_replays;
    ri->eager_launches = backend_stats(t->b).eager_launches;
    ri->d2h_full_rows = backend_stats(t->b).d2h_full_rows;
    memcpy(ri->tokens, r->emitted, sizeof(int) * (size_t)r->n_emit);
    res->t_end = ri->t_commit;
    res->rounds++;
    res->accepted_total += r->accepted;
    if (!isnan(ri->tau)) res->tau_total += ri->tau;
    output_append(dec, r->emitted, m, eos);
    if (dec->h && dec->h->on_round) dec->h->on_round(dec->h->user, ri);
    dec->done = eos || m < r->n_emit || res->n_tokens >= dec->opts->max_new || res->n_tokens >= res->cap;
    /* Next round: the continuation is the root, and the drafter commits these tokens. */
    dec->root = r->emitted[r->n_emit - 1];
    if (dec->feat) feat_after_commit(dec, m);
    if (dec->use_drafter) pend_push(dec, r->emitted, r->n_emit);
    return RS_OK;
}

/* ---- the decode --------------------------------------------------------------------- */

static int decode_check(const Target *t, const Drafter *d, const int *prompt,
                        int n_prompt, const DecodeOpts *opts, RsErr *e) {
    if (n_prompt < 1) return rs_err(e, RS_EINVAL, "empty prompt: need at least one token");
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= t->vocab)
            return rs_err(e, RS_EINVAL, "prompt token %d at position %d outside vocabulary of %d",
                          prompt[i], i, t->vocab);
    if (opts->decoder != DECODER_AR && !d)
        return rs_err(e, RS_EINVAL, "decoder '%s' needs a drafter", decoder_name(opts->decoder));
    if (opts->decoder == DECODER_ORACLE)
        return rs_err(e, RS_EINVAL, "'oracle' is an offline scoring rule, not a decoder");
    if (opts->score_all && opts->planner)
        return rs_err(e, RS_EINVAL, "--score-all-rules needs a fixed budget, not --budget auto");
    if (opts->score_all && !decoder_needs_root_pass(opts->decoder))
        return rs_err(e, RS_EINVAL,
                      "--score-all-rules needs a root-pass decoder (pearl, rootdraw, root), not "
                      "'%s'", decoder_name(opts->decoder));
    if (opts->budget < 1 || opts->budget > TREE_MAX)
        return rs_err(e, RS_EINVAL, "budget %d outside 1..%d", opts->budget, TREE_MAX);
    if (opts->max_new < 1) return rs_err(e, RS_EINVAL, "max_new %d: need at least 1", opts->max_new);
    int rc = sampling_check(&opts->sampling, e);
    if (rc) return rc;
    int cap = target_kv_capacity(t), reserve = decode_round_reserve(opts);
    if (n_prompt + reserve > cap)
        return rs_err(e, RS_EINVAL,
                      "prompt of %d tokens does not fit the KV cache: capacity %d minus %d "
                      "entries reserved for a round leaves %d (raise --ctx)",
                      n_prompt, cap, reserve, cap - reserve);
    return RS_OK;
}

static void decode_begin(Decode *dec, Target *t, Drafter *d, const int *prompt,
                         int n_prompt, const DecodeOpts *opts, const DecodeHooks *h,
                         DecodeResult *res) {
    dec->t = t;
    dec->drafter = d;
    dec->opts = opts;
    dec->h = h;
    dec->res = res;
    rng_seed_mix(&dec->rng, opts->seed, opts->prompt_id,
                 (uint64_t)opts->decoder * 1000003u + (uint64_t)(opts->planner ? 997 : opts->budget) * 101u +
                     (uint64_t)sampling_temp(&opts->sampling));
    dec->use_drafter = opts->decoder != DECODER_AR;
    dec->reserve = decode_round_reserve(opts);
    dec->root = prompt[n_prompt - 1];
    dec->n_pend = 0; /* the drafter receives the whole prompt with its first request */
    if (dec->use_drafter) pend_push(dec, prompt, n_prompt);
    dec->done = 0;
    dec->clock_skip = 0;
}

/* The next round might not fit the KV cache: stop, and say so. */
static int kv_full(Decode *dec) {
    if (backend_n_committed(dec->t->b) + dec->reserve <= target_kv_capacity(dec->t)) return 0;
    dec->res->hit_capacity = 1;
    emit_event(dec->h, "kv_full", "stopped: KV cache full (raise --ctx)");
    return 1;
}

/* The prompt and output the context holds go to the prefix cache: a conversation's next
 * turn resends this answer, and attaches its blocks instead of computing them. */
static void decode_publish(Target *t, const int *prompt, int n_prompt, const DecodeResult *res) {
    int n = n_prompt + res->n_tokens;
    int *all = rs_xmalloc(sizeof(int) * (size_t)n);
    memcpy(all, prompt, sizeof(int) * (size_t)n_prompt);
    memcpy(all + n_prompt, res->tokens, sizeof(int) * (size_t)res->n_tokens);
    target_publish(t, all, n);
    free(all);
}

int decode_run(Target *t, Drafter *d, const int *prompt, int n_prompt, const DecodeOpts *opts,
               const DecodeHooks *h, DecodeResult *res, RsErr *e) {
    res->n_tokens = 0;
    res->hit_eos = res->hit_capacity = 0;
    res->rounds = 0;
    res->accepted_total = 0;
    res->tau_total = 0;
    res->drafter_failed = res->stopped = 0;
    int rc = decode_check(t, d, prompt, n_prompt, opts, e);
    if (rc) return rc;
    Decode *dec = rs_xcalloc(1, sizeof *dec);
    decode_begin(dec, t, d, prompt, n_prompt, opts, h, res);
    if (!t->n_forked || t->n_forked > n_prompt - 1 || (h && h->on_prompt_rows)) target_reset(t);
    rc = feat_begin(dec, n_prompt, e);
    res->t_start = dec_now(dec);
    if (!rc) decode_ask_early(dec, e);
    if (!rc) rc = feat_prefill(dec, prompt, n_prompt, e);
    res->t_prefilled = dec_now(dec);
    res->prompt_cached = t->n_cached;
    /* a prefill of one chunk is a pass of that many rows: the planner's first cost */
    if (!rc && opts->planner && n_prompt > 1 && n_prompt - 1 <= DECODE_PASS_MAX)
        planner_observe_pass(opts->planner, n_prompt - 1, dec_now(dec) - res->t_start);
    for (int round = 0; !rc && !dec->done; round++) {
        Round r;
        round_begin(dec, &r, round);
        if (kv_full(dec)) break;
        if (h && h->should_stop && (res->stopped = h->should_stop(h->user) != 0)) break;
        rc = dec->use_drafter ? round_speculative(dec, &r, e) : round_ar(dec, &r, e);
        if (!rc) rc = round_commit(dec, &r, e);
    }
    drop_ask(dec);
    if (!rc) decode_publish(t, prompt, n_prompt, res);
    /* Recording stays as set: the next decode's feat_begin sets it again (a no-op when
     * unchanged, where a change would re-capture the CUDA backend's graphs). */
    free(dec->feat);
    free(dec->pend);
    free(dec->root_logits);
    free(dec);
    return rc;
}
