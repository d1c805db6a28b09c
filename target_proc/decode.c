/* Target-side decoding. One round (DESIGN.md §3-§5):
 *   send the commit to the drafter; [root-pass rules] forward the continuation alone to
 *   get the root row p0 and draw X1; wait for the pool; select a tree; one tree-masked
 *   pass; exhaustive target sampling; keep root + accepted path in the KV cache.
 * Pending KV layout in a round: entry 0 = the root (continuation), entry 1+k = pass node k,
 * for both the draft rule (root and tree in one batch) and the root-pass rules. */
#include "decode.h"
#include "draft_proc/drafter.h"
#include <math.h>
#include <string.h>

#define PREFILL_CHUNK 256
#define PASS_MAX DECODE_PASS_MAX

struct Target {
    const Model *m;
    Backend *b;
    int vocab;
    uint8_t *eog;      // (vocab) 1 = ends a decode
    float *root_row;   // (vocab) logits at the root
    float *p0;         // (vocab) softmax of root_row
    float *rows;       // (PASS_MAX + 1, vocab) logits of a tree pass
    uint8_t *mask;     // (PASS_MAX + 1, PASS_MAX + 2)
    int *tmp_pos;      // (PREFILL_CHUNK)
    int *tmp_keep;     // (PREFILL_CHUNK)
    Pool *pool;
    /* Time spent on measurements that are not decoding (tau, root_margin) in this decode;
     * dec_now() leaves it off the round timestamps and the decode's time (DESIGN.md §6 speed). */
    uint64_t clock_skip;
};

int target_create(const Model *m, const BackendOps *ops, int kv_capacity, int threads,
                  int device, const int *eog, int n_eog, Target **out, RsErr *e) {
    *out = NULL;
    Target *t = rs_xcalloc(1, sizeof *t);
    t->m = m;
    t->vocab = m->cfg.vocab_size;
    BackendParams bp = {.kv_capacity = kv_capacity,
                        .max_batch = PREFILL_CHUNK,
                        .max_pending = PASS_MAX + 2,
                        .threads = threads,
                        .device = device};
    int rc = ops->create(m, &bp, &t->b, e);
    if (rc) {
        free(t);
        return rc;
    }
    t->eog = rs_xcalloc((size_t)t->vocab, 1);
    for (int i = 0; i < n_eog; i++)
        if (eog[i] >= 0 && eog[i] < t->vocab) t->eog[eog[i]] = 1;
    t->root_row = backend_host_alloc(t->b, sizeof(float) * (size_t)t->vocab);
    t->p0 = rs_xmalloc(sizeof(float) * (size_t)t->vocab);
    t->rows = backend_host_alloc(t->b, sizeof(float) * (size_t)(PASS_MAX + 1) * t->vocab);
    t->mask = rs_xmalloc((size_t)(PASS_MAX + 1) * (PASS_MAX + 2));
    t->tmp_pos = rs_xmalloc(sizeof(int) * PREFILL_CHUNK);
    t->tmp_keep = rs_xmalloc(sizeof(int) * PREFILL_CHUNK);
    t->pool = rs_xmalloc(sizeof(Pool));
    *out = t;
    return RS_OK;
}

void target_free(Target **pt) {
    if (!pt || !*pt) return;
    Target *t = *pt;
    backend_host_free(t->b, t->root_row);
    backend_host_free(t->b, t->rows);
    backend_destroy(&t->b);
    free(t->eog);
    free(t->p0);
    free(t->mask);
    free(t->tmp_pos);
    free(t->tmp_keep);
    free(t->pool);
    free(t);
    *pt = NULL;
}

Backend *target_backend(Target *t) { return t->b; }
/* The decode's clock: monotonic ns less the measurement time skipped so far. Nothing else
 * of the decode runs while a measurement does (the pool is in, the drafter waits for the
 * next commit), so this is the timeline the decode would have without measuring. */
static uint64_t dec_now(const Target *t) { return rs_now_ns() - t->clock_skip; }

/* Runs a measurement's code off the decode's clock. */
#define OFF_CLOCK(t, ...)                                 \
    do {                                                  \
        uint64_t off_clock_t0_ = rs_now_ns();             \
        __VA_ARGS__;                                      \
        (t)->clock_skip += rs_now_ns() - off_clock_t0_;   \
    } while (0)

int decode_round_reserve(const DecodeOpts *o) {
    if (o->rule == RULE_AR) return 1; /* the root alone */
    /* the root, the tree (X1 off the pool is one of its B nodes) or the scoring pass */
    return 1 + (o->score_all ? DECODE_PASS_MAX : o->budget);
}

int target_kv_capacity(const Target *t) { return t->b->params.kv_capacity; }

/* ---- helpers ------------------------------------------------------------------------ */

/* Prefills tokens[0..n) as committed context, in chunks. */
static int prefill(Target *t, const int *tokens, int n, RsErr *e) {
    Backend *b = t->b;
    /* Each chunk is pending until its commit, so it must fit max_pending as well. */
    int chunk = b->params.max_pending < PREFILL_CHUNK ? b->params.max_pending : PREFILL_CHUNK;
    for (int off = 0; off < n; off += chunk) {
        int m = n - off < chunk ? n - off : chunk;
        for (int i = 0; i < m; i++) {
            t->tmp_pos[i] = b->n_committed + i;
            t->tmp_keep[i] = i;
        }
        int rc = backend_forward(b, tokens + off, t->tmp_pos, m, NULL, NULL, 0, NULL, e);
        if (rc) return rc;
        rc = backend_kv_commit(b, t->tmp_keep, m, e);
        if (rc) return rc;
    }
    return RS_OK;
}

/* One-token pass on the root: logits into root_row, root left pending at entry 0. */
static int root_pass(Target *t, int root, RsErr *e) {
    Backend *b = t->b;
    int pos = b->n_committed, row = 0;
    uint8_t one = 1;
    return backend_forward(b, &root, &pos, 1, &one, &row, 1, t->root_row, e);
}

/* What row_prob needs of a row, computed once per row: its log-sum-exp (T=1) or its
 * argmax (T=0). */
static double row_stat(const float *row, int V, int temp) {
    return temp ? row_lse(row, V) : (double)row_argmax(row, V);
}

/* Target probability of `tok` under a row (T=1) or the point mass on its argmax (T=0);
 * stat = row_stat(row). */
static double row_prob(const float *row, int tok, int temp, double stat) {
    if (temp == 0) return (int)stat == tok ? 1.0 : 0.0;
    return exp((double)row[tok] - stat);
}

/* The nodes of one tree pass: pool nodes (parents first) plus possibly X1 off the pool. */
typedef struct {
    int n;
    int token[PASS_MAX];
    int parent[PASS_MAX]; /* pass index of parent, -1 = root */
    int depth[PASS_MAX];
    int pool_node[PASS_MAX]; /* pool index or TREE_X1_OFFPOOL */
    int slot_of_pool[POOL_MAX];
    int x1_slot;
} Pass;

static void pass_init(Pass *ps, const Pool *p) {
    ps->n = 0;
    ps->x1_slot = -1;
    for (int i = 0; i < p->n; i++) ps->slot_of_pool[i] = -1;
}

/* Adds pool node u to the pass unless there already; its parent must be there. */
static void pass_add_node(Pass *ps, const Pool *p, int u) {
    if (ps->slot_of_pool[u] >= 0) return;
    int i = ps->n++;
    RS_ASSERT(i < PASS_MAX);
    ps->token[i] = p->token[u];
    int par = p->parent[u];
    ps->parent[i] = par < 0 ? -1 : ps->slot_of_pool[par];
    RS_ASSERT(par < 0 || ps->parent[i] >= 0);
    ps->depth[i] = p->depth[u];
    ps->pool_node[i] = u;
    ps->slot_of_pool[u] = i;
}

/* Adds a selection's nodes to the pass (shared nodes once). */
static void pass_add(Pass *ps, const Pool *p, const Selection *s) {
    for (int k = 0; k < s->t.n; k++) {
        int u = s->t.node[k];
        if (u != TREE_X1_OFFPOOL) {
            pass_add_node(ps, p, u);
        } else if (ps->x1_slot < 0) {
            int i = ps->n++;
            ps->token[i] = s->x1_token;
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
static void pass_add_expanded(Pass *ps, const Pool *p) {
    for (int u = 0; u < p->n; u++)
        if (p->n_children[u] > 0) pass_add_node(ps, p, u);
}

static int pass_slot(const Pass *ps, const Selection *s, int k) {
    int u = s->t.node[k];
    return u == TREE_X1_OFFPOOL ? ps->x1_slot : ps->slot_of_pool[u];
}

/* Runs the pass. with_root: the root token is batch entry 0 (draft rule); otherwise it is
 * already pending at entry 0. Logits of node i go to rows[(with_root + i)]; for with_root
 * the root's row is rows[0]. */
static int tree_pass(Target *t, const Pass *ps, int root, int with_root, RsErr *e) {
    Backend *b = t->b;
    int np = b->n_pending, n = ps->n + with_root, cols = np + n;
    RS_ASSERT(np + with_root == 1);
    int tokens[PASS_MAX + 1], pos[PASS_MAX + 1], rows[PASS_MAX + 1];
    int P = b->n_committed;
    memset(t->mask, 0, (size_t)n * cols);
    if (with_root) {
        tokens[0] = root;
        pos[0] = P;
        t->mask[0] = 1;
    }
    for (int i = 0; i < ps->n; i++) {
        int r = with_root + i;
        tokens[r] = ps->token[i];
        pos[r] = P + ps->depth[i];
        uint8_t *m = t->mask + (size_t)r * cols;
        m[0] = 1; /* the root */
        for (int a = i; a >= 0; a = ps->parent[a]) m[1 + a] = 1;
    }
    for (int r = 0; r < n; r++) rows[r] = r;
    return backend_forward(b, tokens, pos, n, t->mask, rows, n, t->rows, e);
}

/* Target probability of `tok` at the prefix ending in pass slot `slot` (-1: the root),
 * from the rows of the pass; each row's row_stat is computed once (stat_slot, NAN: not
 * yet). */
static double slot_prob(Target *t, const float *root_row, int with_root, int slot, int tok,
                        int temp, const double *stat_root, double *stat_slot) {
    if (slot < 0) return row_prob(root_row, tok, temp, *stat_root);
    const float *row = t->rows + (size_t)(with_root + slot) * t->vocab;
    if (isnan(stat_slot[slot])) stat_slot[slot] = row_stat(row, t->vocab, temp);
    return row_prob(row, tok, temp, stat_slot[slot]);
}

/* Expected acceptance of a selection from the rows of the pass: tree_tau, or with
 * x1_node >= 0 (root selection's tree, X1 on its first level at that tree index) the
 * value given X1 (tree_tau_given_x1). */
static double selection_tau(Target *t, const Pass *ps, const Selection *s, const float *root_row,
                            int with_root, int temp, const double *stat_root, double *stat_slot,
                            int x1_node) {
    double trans[TREE_MAX];
    for (int k = 0; k < s->t.n; k++) {
        int pk = s->t.parent[k];
        int tok = s->t.node[k] == TREE_X1_OFFPOOL ? s->x1_token : t->pool->token[s->t.node[k]];
        trans[k] = slot_prob(t, root_row, with_root, pk < 0 ? -1 : pass_slot(ps, s, pk), tok,
                             temp, stat_root, stat_slot);
    }
    return x1_node >= 0 ? tree_tau_given_x1(s, trans, x1_node) : tree_tau(s, trans);
}

/* score_all: the tau of every rule's tree for this round's pool and X1, and the oracle's
 * (DESIGN.md §3), whose B-set is chosen from every candidate's target path probability. Needs
 * a pass that holds the expanded nodes (pass_add_expanded). */
static void score_rules(Target *t, const Pass *ps, int B, int x1, const float *root_row,
                        int with_root, int temp, const double *stat_root, double *stat_slot,
                        RoundInfo *ri) {
    const Pool *pool = t->pool;
    Selection s[RULE_COUNT];
    select_draft(pool, B, &s[RULE_DRAFT]);
    select_pearl(pool, B, x1, &s[RULE_PEARL]);
    select_rootdraw(pool, B, x1, &s[RULE_ROOTDRAW]);
    select_root(pool, B, t->p0, x1, &s[RULE_ROOT]);
    double path[POOL_MAX]; /* p(u | c): product of target transitions along u's path */
    for (int u = 0; u < pool->n; u++) {
        int par = pool->parent[u];
        int slot = par < 0 ? -1 : ps->slot_of_pool[par];
        RS_ASSERT(par < 0 || slot >= 0);
        path[u] = (par < 0 ? 1.0 : path[par]) * slot_prob(t, root_row, with_root, slot,
                                                           pool->token[u], temp, stat_root,
                                                           stat_slot);
    }
    select_oracle(pool, B, path, &s[RULE_ORACLE]);
    ri->have_tau_rule = 1;
    for (int r = RULE_DRAFT; r <= RULE_ORACLE; r++) {
        ri->tau_rule[r] = selection_tau(t, ps, &s[r], root_row, with_root, temp, stat_root,
                                        stat_slot, -1);
        ri->tree_size_rule[r] = s[r].t.n;
    }
}

static void emit_event(const DecodeHooks *h, const char *ev, const char *detail) {
    if (h && h->on_event) h->on_event(h->user, ev, detail);
}

/* The decode goes on autoregressively; every emitted token is kept. */
static void drafter_failed(const DecodeHooks *h, const RsErr *e, DecodeResult *res) {
    char msg[1100];
    snprintf(msg, sizeof msg, "drafter failed (%s); finishing autoregressively", e ? e->msg : "?");
    emit_event(h, "drafter_failed", msg);
    res->drafter_failed = 1;
}

static int timed_root_pass(Target *t, int root, RoundInfo *ri, RsErr *e) {
    ri->t_root_start = dec_now(t);
    int rc = root_pass(t, root, e);
    ri->t_root_end = dec_now(t);
    if (!rc) OFF_CLOCK(t, ri->root_margin = row_top_margin(t->root_row, t->vocab));
    return rc;
}

/* Appends round tokens to the result, stopping at the first EOS. Returns 1 if EOS seen. */
static int take_tokens(Target *t, DecodeResult *res, const DecodeHooks *h, const int *tok, int n) {
    int m = 0, eos = 0;
    while (m < n) {
        if (res->n_tokens + m >= res->cap) break;
        int x = tok[m++];
        if (t->eog[x]) {
            eos = 1;
            break;
        }
    }
    for (int i = 0; i < m; i++) res->tokens[res->n_tokens + i] = tok[i];
    int visible = eos ? m - 1 : m;
    if (h && h->on_tokens && visible > 0) h->on_tokens(h->user, tok, visible);
    res->n_tokens += m;
    if (eos) res->hit_eos = 1;
    return eos;
}

/* ---- the decode loop ---------------------------------------------------------------- */

int decode_run(Target *t, Drafter *dc, const int *prompt, int n_prompt, const DecodeOpts *o,
               const DecodeHooks *h, DecodeResult *res, RsErr *e) {
    Backend *b = t->b;
    int V = t->vocab;
    res->n_tokens = 0;
    res->hit_eos = res->hit_capacity = 0;
    res->rounds = 0;
    res->accepted_total = 0;
    res->tau_total = 0;
    res->drafter_failed = 0;
    if (n_prompt < 1) return rs_err(e, RS_EINVAL, "empty prompt: need at least one token");
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return rs_err(e, RS_EINVAL, "prompt token %d at position %d outside vocabulary of %d",
                          prompt[i], i, V);
    if (o->rule != RULE_AR && !dc)
        return rs_err(e, RS_EINVAL, "decoder '%s' needs a drafter", rule_name(o->rule));
    if (o->rule == RULE_ORACLE)
        return rs_err(e, RS_EINVAL, "'oracle' is an offline scoring rule, not a decoder");
    if (o->score_all && !rule_needs_root(o->rule))
        return rs_err(e, RS_EINVAL,
                      "--score-all-rules needs a root-pass decoder (pearl, rootdraw, root), not "
                      "'%s'", rule_name(o->rule));
    if (o->budget < 1 || o->budget > TREE_MAX)
        return rs_err(e, RS_EINVAL, "budget %d outside 1..%d", o->budget, TREE_MAX);
    int cap = b->params.kv_capacity;
    int reserve = decode_round_reserve(o);
    if (n_prompt + reserve > cap)
        return rs_err(e, RS_EINVAL,
                      "prompt of %d tokens does not fit the KV cache: capacity %d minus %d "
                      "entries reserved for a round leaves %d (raise --ctx)",
                      n_prompt, cap, reserve, cap - reserve);

    Rng rng;
    rng_seed_mix(&rng, o->seed, o->prompt_id,
                 (uint64_t)o->rule * 1000003u + (uint64_t)o->budget * 101u + (uint64_t)o->temp);
    b->ops->kv_reset(b);
    t->clock_skip = 0;
    res->t_start = dec_now(t);
    int use_drafter = o->rule != RULE_AR;
    RoundInfo ri;
    /* The drafter receives the whole prompt in round 0. */
    const int *commit = prompt;
    int n_commit = n_prompt;
    int rc = prefill(t, prompt, n_prompt - 1, e);
    if (rc) return rc;
    int root = prompt[n_prompt - 1];
    int done = 0;
    int commit_buf[ROUND_MAX_EMIT];
    Pool *pool = t->pool;
    double *stat_slot = rs_xmalloc(sizeof(double) * PASS_MAX);
    Pass *ps = rs_xmalloc(sizeof(Pass));

    for (int round = 0; !done; round++) {
        memset(&ri, 0, sizeof ri);
        ri.round = round;
        ri.x1_in_pool = -1;
        ri.tau = NAN;
        ri.root_margin = NAN;
        for (int r = 0; r < RULE_COUNT; r++) ri.tau_rule[r] = NAN;
        ri.t_round_start = dec_now(t);
        uint64_t skip0 = t->clock_skip;
        if (b->n_committed + reserve > cap) {
            res->hit_capacity = 1;
            emit_event(h, "kv_full", "stopped: KV cache full (raise --ctx)");
            break;
        }
        int emitted[ROUND_MAX_EMIT], n_emit = 0, accepted = 0, keep[ROUND_MAX_EMIT], n_keep = 0;
        int ar_round = !use_drafter;
        if (use_drafter) {
            ri.t_grow_sent = dec_now(t);
            rc = drafter_grow_begin(dc, commit, n_commit, round == 0, NULL, 0, e);
            if (rc) {
                drafter_failed(h, e, res);
                use_drafter = 0;
                ar_round = 1;
            }
        }
        if (ar_round) {
            /* AR: the root pass alone; its draw is the continuation. */
            ri.fallback_ar = o->rule != RULE_AR;
            if ((rc = timed_root_pass(t, root, &ri, e))) goto out;
            emitted[n_emit++] = row_draw(t->root_row, V, o->temp, &rng);
            keep[n_keep++] = 0;
        } else {
            int need_root = rule_needs_root(o->rule);
            int x1 = -1;
            const float *root_row = t->root_row;
            if (need_root) {
                if ((rc = timed_root_pass(t, root, &ri, e))) goto out;
                x1 = row_draw(t->root_row, V, o->temp, &rng);
            }
            rc = drafter_grow_end(dc, pool, e);
            ri.t_pool_recv = dec_now(t);
            if (rc) {
                drafter_failed(h, e, res);
                use_drafter = 0;
                ri.fallback_ar = 1;
                if (!need_root) {
                    if ((rc = timed_root_pass(t, root, &ri, e))) goto out;
                    x1 = row_draw(t->root_row, V, o->temp, &rng);
                }
                emitted[n_emit++] = x1;
                keep[n_keep++] = 0;
                goto commit;
            }
            ri.draft_ns = pool->draft_ns;
            ri.draft_commit_ns = pool->commit_pass_ns;
            if (o->test_wrong_x1 && need_root) {
                double z = 0, u;
                for (int k = 0; k < pool->root_n_children; k++) z += exp(pool->logq[k]);
                u = rng_uniform(&rng) * z;
                for (int k = 0; k < pool->root_n_children; k++) {
                    x1 = pool->token[k];
                    if ((u -= exp(pool->logq[k])) < 0) break;
                }
            }
            /* Selection. */
            Selection sel;
            int B = o->budget;
            if (need_root) row_softmax(t->root_row, V, t->p0);
            if (o->temp == 0 && need_root) { /* point mass on the argmax */
                memset(t->p0, 0, sizeof(float) * (size_t)V);
                t->p0[x1] = 1.0f;
            }
            switch (o->rule) {
            case RULE_DRAFT: select_draft(pool, B, &sel); break;
            case RULE_PEARL: select_pearl(pool, B, x1, &sel); break;
            case RULE_ROOTDRAW: select_rootdraw(pool, B, x1, &sel); break;
            case RULE_ROOT: select_root(pool, B, t->p0, x1, &sel); break;
            default: RS_ASSERT(!"rule");
            }
            pass_init(ps, pool);
            pass_add(ps, pool, &sel);
            if (o->score_all) pass_add_expanded(ps, pool);
            ri.t_select_done = dec_now(t);
            ri.x1_in_pool = need_root ? sel.x1_in_pool : -1;
            ri.tree_size = sel.t.n;
            int x1_node = o->rule == RULE_ROOT ? tree_child_with_token(pool, &sel, -1, x1) : -1;
            int skip = o->rule == RULE_ROOT && x1_node < 0;
            ri.tree_pass_skipped = skip;
            /* Root selection's tau is taken given its X1, like pearl's and rootdraw's: with X1
             * off the first level nothing can be accepted. The unconditional tau would be
             * unknown here at T=1 (no tree pass), and a mean over only the rounds that have
             * it overstates acceptance, since those are the rounds X1 landed in the tree. */
            if (skip) ri.tau = 0.0;
            int with_root = !need_root;
            if (!skip || o->score_all) {
                ri.t_tree_start = dec_now(t);
                rc = tree_pass(t, ps, root, with_root, e);
                if (rc) goto out;
                ri.t_tree_end = dec_now(t);
                if (with_root) root_row = t->rows;
                /* tau is an offline measure of the tree (DESIGN.md §4), not part of decoding */
                OFF_CLOCK(t, {
                    double stat_root = row_stat(root_row, V, o->temp);
                    for (int i = 0; i < ps->n; i++) stat_slot[i] = NAN;
                    if (!skip)
                        ri.tau = selection_tau(t, ps, &sel, root_row, with_root, o->temp,
                                               &stat_root, stat_slot, x1_node);
                    if (o->score_all)
                        score_rules(t, ps, B, x1, root_row, with_root, o->temp, &stat_root,
                                    stat_slot, &ri);
                });
            }
            keep[n_keep++] = 0; /* the root */
            if (skip) {
                emitted[n_emit++] = x1; /* X1 is the continuation */
            } else {
                /* Exhaustive target sampling. */
                int cur = -1; /* tree index; -1 = root */
                if (sel.rooted_at_x1) {
                    emitted[n_emit++] = x1;
                    accepted++;
                    cur = 0;
                    keep[n_keep++] = 1 + pass_slot(ps, &sel, 0);
                }
                int forced = o->rule == RULE_ROOT ? x1 : -1;
                for (;;) {
                    const float *row = cur < 0 ? root_row
                                               : t->rows + (size_t)(with_root + pass_slot(ps, &sel, cur)) * V;
                    int y = forced >= 0 ? forced : row_draw(row, V, o->temp, &rng);
                    forced = -1;
                    int child = tree_child_with_token(pool, &sel, cur, y);
                    emitted[n_emit++] = y;
                    if (child < 0) break; /* y is the continuation */
                    accepted++;
                    keep[n_keep++] = 1 + pass_slot(ps, &sel, child);
                    cur = child;
                }
            }
        }
    commit:
        rc = backend_kv_commit(b, keep, n_keep, e);
        if (rc) goto out;
        ri.t_commit = dec_now(t);
        ri.measure_ns = t->clock_skip - skip0;
        ri.emitted = n_emit;
        ri.accepted = accepted;
        ri.graph_replays = b->n_graph_replays;
        ri.eager_launches = b->n_eager_launches;
        memcpy(ri.tokens, emitted, sizeof(int) * (size_t)n_emit);
        res->t_end = ri.t_commit;
        res->rounds++;
        res->accepted_total += accepted;
        if (!isnan(ri.tau)) res->tau_total += ri.tau;
        int eos = take_tokens(t, res, h, emitted, n_emit);
        if (h && h->on_round) h->on_round(h->user, &ri);
        root = emitted[n_emit - 1];
        /* Next round's commit to the drafter: this round's emitted tokens. */
        memcpy(commit_buf, emitted, sizeof(int) * (size_t)n_emit);
        commit = commit_buf;
        n_commit = n_emit;
        if (eos || res->n_tokens >= o->max_new || res->n_tokens >= res->cap) done = 1;
    }
    rc = RS_OK;
out:
    free(stat_slot);
    free(ps);
    return rc;
}
