/* The model kind of Drafter (a drafter model of its own, or a layer subset of the target).
 * Pool growth is draft_proc/pool_grow.h's (DESIGN.md §2): the commit pass gives the 10
 * depth-1 candidates, 7 expansion passes of 10 nodes run on the drafter's backend, 8 passes
 * in all counting the commit pass. Expanded nodes stay pending in the drafter's KV cache
 * for the round; the next commit keeps the rows of the tokens it commits and drops the
 * rest (but for rows grown ahead below its end, which stay for the next pool). A pass's
 * logits stay in the backend (kept rows): backend_rows_topk reduces each row to its 10
 * children where it lives, so no whole row crosses to the host.
 *
 * Run-ahead (drafter_ahead, DESIGN.md §5): between a pool and the next commit the drafter
 * guesses that commit (the pool's best path to its first unexpanded node, then that node's
 * best child as the continuation), commits the guess and grows the pool below it. The
 * next commit either is the guess (the pool, or at least the commit pass, is ready) or is
 * not: the guess is taken back (backend_kv_truncate) to the prefix it shares with the
 * commit, and the commit runs as ever. The pool is what the commit alone would have grown:
 * rows a guess computed are the rows its commit would compute. While guesses seldom hit,
 * it grows the last pool ahead instead (its own copy: best unexpanded nodes first, a few
 * rows a pass), and a commit keeps the rows of every committed token that ran in the pool
 * or ahead of it: one that ends on such a node needs no commit pass at all. */
#include "model_drafter.h"
#include "drafter_impl.h"
#include "kernels/prefill.h"
#include "pool_grow.h"
#include <math.h>
#include <string.h>

/* Most tokens in one forward(): the prefill chunk (prefill_chunk()). */
#define MAX_BATCH 64
/* Nodes a pass of growth ahead expands: up to 4 rows cost about one on the CPU kernels
 * (QK_GROUP), more a second pass over the weights. */
#define AHEAD_ROWS 4
/* Pending rows at most: a pool's expansions and a commit chunk, or growth ahead. */
#define MAX_PENDING (POOL_N_EXPANDED + MAX_BATCH)

typedef struct {
    const Model *m;
    Model *view;        /* a model it owns (m == view): the self-drafter's layer view, or
                           an adopted model */
    Backend *b;
    int vocab;
    int depth, width;    /* drafter_set_shape's, POOL_MAX_DEPTH and POOL_EXPAND by default */
    float lse[POOL_EXPAND]; /* rows_topk's log-sum-exp of the last pass's rows */
    uint64_t backend_ns; /* this growth's time inside backend forward/commit calls */
    int rows;            /* logits rows this growth reduced */
    SyncGrowth g;       /* grow_begin's outcome for grow_end */
    /* run-ahead */
    int ahead_ok;        /* its backend can take a guess back (backend_kv_truncate) */
    Pool *last;          /* the last pool grown (and grown ahead, below) */
    int have_last;
    int last_pending;    /* its rows are still pending (no commit, guess or reset since) */
    int *slot;           /* (POOL_MAX) pending row of each node of last whose row ran, -1 */
    int *grow_slot;      /* (POOL_MAX) the same for the pool being grown (expand() sets it) */
    /* Rows that ran ahead below the last commit's end, kept pending for the growth of the
     * next pool (commit_stay): stay_node[r] is the node of last whose row is pending row r
     * (r < n_stay), stay_row the inverse (-1: none); stay_root the commit's end, -1: none. */
    int stay_root, n_stay, stay_node[MAX_PENDING];
    int *stay_row;       /* (POOL_MAX) */
    int guess_n, guess[POOL_MAX_DEPTH + 1]; /* the committed guess, 0: none */
    int guess_ids[POOL_TOPK];  /* the top 10 below the guess: the next pool's first level */
    float guess_lq[POOL_TOPK];
    Pool *next;          /* grown below the guess, of shape next_depth x next_width (0: none) */
    int next_depth, next_width;
    int (*stop)(void *); /* during run-ahead: 1 when a request waits */
    void *stop_arg;
    double hit_rate;     /* running rate of guesses that were the commit */
    int skipped;         /* chances to run ahead passed over since the last guess */
    DrafterAheadStats st;
} ModelDrafter;

/* expand()'s status when run-ahead stopped for a request (never an RsStatus) */
#define AHEAD_STOPPED 1
/* Run-ahead keeps a running rate of guesses that were the commit (weight HIT_EWMA a guess,
 * HIT_MIN to go on): work ahead is not free where the two sides share memory bandwidth,
 * and a drafter whose chains are seldom accepted whole gains little from it. Below the
 * rate it still guesses every PROBE_EVERY-th pool, so the rate follows the text. */
#define HIT_EWMA 0.1
#define HIT_MIN 0.4
#define PROBE_EVERY 4

/* The top-10 ids and draft log-probs of every row the last pass kept, (n_kept, 10). */
static int reduce(ModelDrafter *d, int *ids, float *logq, RsErr *e) {
    d->rows += backend_n_kept(d->b);
    return backend_rows_topk(d->b, POOL_TOPK, ids, logq, d->lse, e);
}

/* An expanded node's children: its row's top 10, ids and log q, best first. */
static void node_children(const Pool *p, int u, int *ids, float *logq) {
    for (int c = 0; c < POOL_TOPK; c++) {
        ids[c] = p->token[p->first_child[u] + c];
        logq[c] = p->logq[p->first_child[u] + c];
    }
}

/* The node of the last pool a pass node of the pool being grown below stay_root stands
 * for (the child with its token of the node its parent stands for), when its row stayed
 * pending; -1 otherwise. */
static int stayed(const ModelDrafter *d, int parent_row, int tok) {
    int par = parent_row < 0 ? d->stay_root : parent_row < d->n_stay ? d->stay_node[parent_row] : -1;
    if (par < 0 || d->slot[par] < 0) return -1;
    const Pool *p = d->last;
    for (int c = p->first_child[par]; c < p->first_child[par] + p->n_children[par]; c++)
        if (p->token[c] == tok) return d->stay_row[c] >= 0 ? c : -1;
    return -1;
}

/* When every node of the pass ran ahead (its row stayed pending, its top 10 are its
 * children in the last pool): those rows and children, and 1; else 0. */
static int reuse_pass(ModelDrafter *d, const PoolPass *pass, int *ids, float *logq) {
    if (d->stay_root < 0) return 0;
    int old[POOL_EXPAND];
    for (int k = 0; k < pass->n; k++)
        if ((old[k] = stayed(d, pass->parent_row[k], pass->token[k])) < 0) return 0;
    const Pool *p = d->last;
    for (int k = 0; k < pass->n; k++) {
        pass->row[k] = d->stay_row[old[k]];
        node_children(p, old[k], ids + k * POOL_TOPK, logq + k * POOL_TOPK);
    }
    return 1;
}

/* pool_grow's callback: runs a pass's nodes through the drafter under the pass's tree mask
 * and reads each row's top 10, or takes what ran ahead. */
static int expand(void *ctx, const PoolPass *pass, int *ids, float *logq, RsErr *e) {
    ModelDrafter *d = ctx;
    Backend *b = d->b;
    if (d->stop && d->stop(d->stop_arg)) return AHEAD_STOPPED;
    if (reuse_pass(d, pass, ids, logq)) {
        for (int k = 0; k < pass->n; k++) d->grow_slot[pass->node[k]] = pass->row[k];
        d->st.expansions_free += pass->n;
        return POOL_ROWS_REUSED;
    }
    int n = pass->n, pos[POOL_EXPAND], rows[POOL_EXPAND];
    RS_ASSERT(n <= POOL_EXPAND && backend_n_pending(b) == pass->n_pending);
    for (int k = 0; k < n; k++) {
        pos[k] = backend_n_committed(b) - 1 + pass->depth;
        rows[k] = k;
    }
    uint64_t t0 = rs_now_ns();
    int rc = backend_forward(b, pass->token, pos, n, pass->mask, rows, n, NULL, e);
    d->backend_ns += rs_now_ns() - t0;
    if (rc == RS_ESTOPPED) return AHEAD_STOPPED;
    for (int k = 0; !rc && k < n; k++) d->grow_slot[pass->node[k]] = pass->n_pending + k;
    return rc ? rc : reduce(d, ids, logq, e);
}

/* The last pool's rows stop being pending (a commit, a guess, a reset): nothing of it is
 * kept from here on. */
static void forget_last(ModelDrafter *d) { d->last_pending = 0; }

static void slots_clear(int *slot) {
    for (int u = 0; u < POOL_MAX; u++) slot[u] = -1;
}


/* Checks a commit of n tokens, keeps the pending rows keep[0 .. n_keep) (the first n_keep
 * tokens' rows, grown in the last pool), drops the rest of last round's tree entries and
 * appends the other tokens to the committed context (backend_prefill). want_row: the last
 * token's row stays in the backend as its kept row 0. */
static int commit_tokens(ModelDrafter *d, const int *keep, int n_keep, const int *tokens, int n,
                         int want_row, RsErr *e) {
    Backend *b = d->b;
    RS_ASSERT(n_keep < n || (!want_row && n_keep == n));
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= d->vocab)
            return rs_err(e, RS_EINVAL, "token id %d at %d outside drafter vocabulary of %d",
                          tokens[i], i, d->vocab);
    int need = backend_n_committed(b) + n + POOL_N_EXPANDED;
    if (need > backend_kv_capacity(b))
        return rs_err(e, RS_EINVAL,
                      "drafter KV cache full: %d committed + %d new + %d tree entries > "
                      "capacity %d",
                      backend_n_committed(b), n, POOL_N_EXPANDED, backend_kv_capacity(b));
    uint64_t t0 = rs_now_ns();
    forget_last(d);
    int rc = backend_kv_commit(b, keep, n_keep, e);
    const int *run = tokens + n_keep;
    int nr = n - n_keep;
    /* The commit pass; only the final row is needed. */
    if (!rc && nr)
        rc = want_row ? backend_prefill_keep(b, run, nr, e) : backend_prefill(b, run, nr, NULL, e);
    d->backend_ns += rs_now_ns() - t0;
    d->st.rows_kept += n_keep;
    d->st.rows_run += nr;
    return rc;
}

/* The pending rows of the last pool's expanded nodes that a commit of `tokens` keeps: the
 * longest prefix that is a path of expanded nodes from the pool's root. Those rows are
 * what a commit pass would compute for the same tokens (the same entries attended to in
 * the same order), so the commit runs only the rest: a chain accepted to depth k costs a
 * pass of one or two rows, not k + 1, and none when the commit ends on an expanded node
 * (its children in the pool are the top 10 of its row). Returns the prefix length, its
 * rows in keep, and in *end the pool node it ends at (-1: the root). */
static int last_path(const ModelDrafter *d, const int *tokens, int n, int *keep, int *end) {
    *end = -1;
    if (!d->last_pending) return 0;
    const Pool *p = d->last;
    int m = 0, first = p->root_first_child, count = p->root_n_children;
    while (m < n && m < POOL_MAX_DEPTH) {
        int u = -1;
        for (int k = 0; k < count && u < 0; k++)
            if (p->token[first + k] == tokens[m]) u = first + k;
        if (u < 0 || d->slot[u] < 0) break;
        keep[m++] = d->slot[u];
        *end = u;
        first = p->first_child[u];
        count = p->n_children[u];
    }
    return m;
}

/* Pending rows of the last pool's nodes below `end` whose rows ran, ascending (a node's
 * ancestors come first), as many as leave room for a pool's expansions. */
static int stay_rows(const ModelDrafter *d, int end, int *rows, int *nodes) {
    const Pool *p = d->last;
    int n = 0;
    for (int u = 0; u < p->n; u++) {
        if (d->slot[u] < 0 || u == end) continue;
        int a = p->parent[u];
        while (a >= 0 && a != end) a = p->parent[a];
        if (a != end) continue;
        int k = n++;
        for (; k > 0 && rows[k - 1] > d->slot[u]; k--) rows[k] = rows[k - 1], nodes[k] = nodes[k - 1];
        rows[k] = d->slot[u];
        nodes[k] = u;
    }
    return n < MAX_PENDING - POOL_N_EXPANDED ? n : MAX_PENDING - POOL_N_EXPANDED;
}

/* A commit whose every token's row ran (keep, ending on node `end`): commits them, and the
 * rows that ran below `end` stay pending for the next pool (the growth takes them instead
 * of running them, expand()); a backend that cannot keep them drops them. */
static int commit_stay(ModelDrafter *d, const int *keep, int nk, int end, RsErr *e) {
    int rows[POOL_MAX], ns = stay_rows(d, end, rows, d->stay_node);
    uint64_t t0 = rs_now_ns();
    forget_last(d);
    d->st.rows_kept += nk;
    int rc = RS_EUNSUPPORTED;
    if (ns && backend_n_committed(d->b) + nk + ns + POOL_N_EXPANDED <= backend_kv_capacity(d->b))
        rc = backend_kv_commit_stay(d->b, keep, nk, rows, ns, e);
    if (rc == RS_EUNSUPPORTED) {
        d->backend_ns += rs_now_ns() - t0;
        return backend_kv_commit(d->b, keep, nk, e);
    }
    d->backend_ns += rs_now_ns() - t0;
    if (rc) return rc;
    d->stay_root = end;
    d->n_stay = ns;
    for (int r = 0; r < ns; r++) d->stay_row[d->stay_node[r]] = r;
    return RS_OK;
}

/* Forgets the rows that stayed for a growth, once it is over. */
static void stay_clear(ModelDrafter *d) {
    for (int r = 0; r < d->n_stay; r++) d->stay_row[d->stay_node[r]] = -1;
    d->n_stay = 0;
    d->stay_root = -1;
}

/* Takes a committed guess back to its first `keep` tokens (and drops what is pending). */
static int guess_undo(ModelDrafter *d, int keep, RsErr *e) {
    forget_last(d);
    int rc = backend_kv_truncate(d->b, backend_n_committed(d->b) - d->guess_n + keep, e);
    d->guess_n = 0;
    d->next_depth = 0;
    return rc;
}

/* With a committed guess: 1 when `tokens` are the guess (what was grown below it stays),
 * else 0 with the guess taken back to the prefix it shares with them (at most n - 1
 * tokens: the last one's row is the commit pass's) and *skip set to that prefix. */
static int guess_check(ModelDrafter *d, const int *tokens, int n, int *skip, RsErr *e) {
    *skip = 0;
    if (!d->guess_n) return 0;
    int hit = n == d->guess_n && !memcmp(tokens, d->guess, sizeof(int) * (size_t)n);
    d->hit_rate += HIT_EWMA * (hit - d->hit_rate);
    if (hit) {
        d->guess_n = 0;
        d->st.hits++;
        return 1;
    }
    int m = 0;
    while (m < n - 1 && m < d->guess_n && tokens[m] == d->guess[m]) m++;
    d->st.misses++;
    *skip = m;
    return guess_undo(d, m, e);
}

/* The first level below the commit, from the guess (*ahead = 1) or from a commit pass. */
static int commit_first_level(ModelDrafter *d, const int *tokens, int n, int *ids, float *lq,
                              int *ahead, RsErr *e) {
    int skip, rc = guess_check(d, tokens, n, &skip, e);
    if (rc < 0) return rc;
    *ahead = rc == 1;
    if (*ahead) {
        memcpy(ids, d->guess_ids, sizeof d->guess_ids);
        memcpy(lq, d->guess_lq, sizeof d->guess_lq);
        return RS_OK;
    }
    int keep[POOL_MAX_DEPTH + 1], end, nk = skip ? 0 : last_path(d, tokens, n, keep, &end);
    if (nk == n) { /* ends on an expanded node: its children are the first level */
        node_children(d->last, end, ids, lq);
        d->st.commits_free++;
        return commit_stay(d, keep, nk, end, e);
    }
    rc = commit_tokens(d, keep, nk, tokens + skip, n - skip, 1, e);
    return rc ? rc : reduce(d, ids, lq, e);
}

/* Commits `tokens` and grows the pool below the last of them into *p. */
static int grow(ModelDrafter *d, const int *tokens, int n, Pool *p, RsErr *e) {
    uint64_t t0 = rs_now_ns(), fused0 = backend_stats(d->b).fused_topk_ns;
    if (n < 1) return rs_err(e, RS_EINVAL, "commit of %d tokens: need at least one", n);
    d->have_last = 0;
    d->backend_ns = 0;
    d->rows = 0;
    int ids[POOL_TOPK], ahead;
    float lq[POOL_TOPK];
    stay_clear(d);
    int rc = commit_first_level(d, tokens, n, ids, lq, &ahead, e);
    if (rc) return rc;
    uint64_t commit_ns = ahead ? 0 : rs_now_ns() - t0; /* 0: the guess was the commit */
    if (ahead && d->next_depth == d->depth && d->next_width == d->width) {
        memcpy(p, d->next, sizeof *p); /* grown ahead: its rows are pending from 0 */
        d->st.pools_ready++;
    } else {
        if (ahead) rc = backend_kv_commit(d->b, NULL, 0, e); /* a pool begun ahead, unfinished */
        int np0 = backend_n_pending(d->b);
        slots_clear(d->grow_slot);
        if (!rc)
            rc = pool_grow(p, ids, lq, np0, d->depth, d->width, expand, d, d->vocab,
                           "drafter", e);
    }
    stay_clear(d);
    d->next_depth = 0;
    if (rc) return rc;
    p->commit_pass_ns = commit_ns;
    memcpy(d->last, p, sizeof *p);
    memcpy(d->slot, d->grow_slot, sizeof(int) * POOL_MAX);
    d->have_last = d->last_pending = 1;
    p->draft_ns = rs_now_ns() - t0;
    /* The top-k reduction is host work wherever it ran: in rows_topk, or (CPU backend)
     * fused into the forwards' output head. */
    uint64_t fwd = d->backend_ns - (backend_stats(d->b).fused_topk_ns - fused0);
    p->draft_host_ns = p->draft_ns > fwd ? p->draft_ns - fwd : 0;
    p->draft_rows = d->rows;
    return RS_OK;
}

/* ---- the Drafter ops ------------------------------------------------------------------ */

static int model_reset(void *ctx, const int *prompt, int n, const void *features,
                       size_t feat_bytes, RsErr *e) {
    ModelDrafter *d = ctx;
    backend_kv_reset(d->b);
    d->guess_n = d->have_last = d->next_depth = 0;
    forget_last(d);
    if (n < 0) return rs_err(e, RS_EINVAL, "prefill of %d tokens", n);
    return n ? commit_tokens(d, NULL, 0, prompt, n, 0, e) : RS_OK;
}

static int model_append(void *ctx, const int *tokens, int n, const void *features,
                        size_t feat_bytes, RsErr *e) {
    ModelDrafter *d = ctx;
    d->have_last = 0;
    int rc = d->guess_n ? guess_undo(d, 0, e) : RS_OK;
    return rc ? rc : commit_tokens(d, NULL, 0, tokens, n, 0, e);
}

/* Grows at once; the status waits for grow_end, as a worker thread's or a peer's would. */
static int model_grow_begin(void *ctx, const int *tokens, int n, const void *features,
                            size_t feat_bytes, RsErr *e) {
    ModelDrafter *d = ctx;
    d->g.err = (RsErr){0};
    d->g.rc = grow(d, tokens, n, d->g.pool, &d->g.err);
    return RS_OK;
}

static int model_grow_end(void *ctx, Pool *out, RsErr *e) {
    return sync_growth_end(&((ModelDrafter *)ctx)->g, out, e);
}

/* One token as pending row backend_n_pending(), attending to the committed context, the
 * pending rows anc[0 .. na) and itself: its top 10. */
static int forward_one(ModelDrafter *d, int tok, int pos, const int *anc, int na, int *ids,
                       float *lq, RsErr *e) {
    int np = backend_n_pending(d->b), row = 0;
    uint8_t m[POOL_N_EXPANDED + MAX_BATCH + 1] = {0};
    RS_ASSERT(np < (int)sizeof m);
    for (int i = 0; i < na; i++) m[anc[i]] = 1;
    m[np] = 1;
    uint64_t t0 = rs_now_ns();
    int rc = backend_forward(d->b, &tok, &pos, 1, m, &row, 1, NULL, e);
    d->backend_ns += rs_now_ns() - t0;
    if (rc == RS_ESTOPPED) return AHEAD_STOPPED;
    return rc ? rc : reduce(d, ids, lq, e);
}

/* The guess: the last pool's best path (each level's first child, best first) down to its
 * first unexpanded node u, then u's best child. Runs u and that child, commits the path.
 * AHEAD_STOPPED when a request came first (nothing committed). */
static int guess_commit(ModelDrafter *d, RsErr *e) {
    const Pool *p = d->last;
    int anc[POOL_MAX_DEPTH + 1], na = 0, ids[POOL_TOPK];
    float lq[POOL_TOPK];
    int u = p->root_first_child, nc = backend_n_committed(d->b);
    for (; d->slot[u] >= 0; u = p->first_child[u]) {
        d->guess[na] = p->token[u];
        anc[na++] = d->slot[u];
    }
    if (nc + na + 2 + POOL_N_EXPANDED > backend_kv_capacity(d->b)) return AHEAD_STOPPED;
    /* a request that waits stops either forward (model_ahead set the backend's check) */
    int rc = forward_one(d, p->token[u], nc - 1 + p->depth[u], anc, na, ids, lq, e);
    if (rc) return rc;
    d->guess[na] = p->token[u];
    anc[na++] = backend_n_pending(d->b) - 1;
    rc = forward_one(d, ids[0], nc + p->depth[u], anc, na, d->guess_ids, d->guess_lq, e);
    if (rc) return rc;
    d->guess[na] = ids[0];
    anc[na++] = backend_n_pending(d->b) - 1;
    forget_last(d);
    rc = backend_kv_commit(d->b, anc, na, e);
    if (!rc) d->guess_n = na;
    return rc;
}

/* Up to AHEAD_ROWS best unexpanded nodes of the last pool by the pool's ranking, best
 * first, that fit below POOL_MAX_DEPTH with their children: where the next commit most
 * likely ends off the rows that ran, by the drafter's own law (the target's draw below
 * the last node it verified: the best path's next node past a tree the budget cut short,
 * or a correction where the target disagrees). */
static int ahead_pick(const Pool *p, int *nodes) {
    int n = 0;
    for (int u = 0; u < p->n; u++) {
        if (p->n_children[u] || p->depth[u] >= POOL_MAX_DEPTH) continue;
        if (n == AHEAD_ROWS && pool_rank_cmp(p, u, nodes[n - 1]) > 0) continue;
        int k = n < AHEAD_ROWS ? n++ : n - 1;
        for (; k > 0 && pool_rank_cmp(p, u, nodes[k - 1]) < 0; k--) nodes[k] = nodes[k - 1];
        nodes[k] = u;
    }
    while (n > 0 && p->n + n * POOL_TOPK > POOL_MAX) n--;
    return n;
}

/* The nodes' rows' top 10 as their children in the last pool (its own copy: the target
 * has the pool as sent), rows from row0 on. */
static void ahead_add(ModelDrafter *d, const int *nodes, int n, int row0, const int *ids,
                      const float *lq) {
    Pool *p = d->last;
    for (int k = 0; k < n; k++) {
        int u = nodes[k];
        d->slot[u] = row0 + k;
        p->first_child[u] = p->n;
        p->n_children[u] = POOL_TOPK;
        pool_add_children(p, ids + k * POOL_TOPK, lq + k * POOL_TOPK, u, p->depth[u] + 1);
        for (int i = p->n - POOL_TOPK; i < p->n; i++) {
            p->first_child[i] = -1;
            p->n_children[i] = 0;
            d->slot[i] = -1;
        }
    }
}

/* One pass of growth ahead: the best unexpanded nodes of the last pool run as pending rows
 * after its others, under its tree mask, and their top 10 join it as their children. A
 * commit that ends on a node whose row ran needs no commit pass (commit_first_level): its
 * rows are those a commit pass would compute. AHEAD_STOPPED when a request came first or
 * nothing more fits. */
static int ahead_pass(ModelDrafter *d, RsErr *e) {
    Pool *p = d->last;
    Backend *b = d->b;
    int nodes[AHEAD_ROWS], n = ahead_pick(p, nodes), np = backend_n_pending(b);
    int nc = backend_n_committed(b), cols = np + n;
    if (!n || cols > MAX_PENDING ||
        nc + cols + POOL_MAX_DEPTH + 1 + POOL_N_EXPANDED > backend_kv_capacity(b))
        return AHEAD_STOPPED;
    int tok[AHEAD_ROWS], pos[AHEAD_ROWS], rows[AHEAD_ROWS];
    uint8_t *m = rs_xcalloc((size_t)n * cols, 1);
    for (int k = 0; k < n; k++) {
        int u = nodes[k];
        tok[k] = p->token[u];
        pos[k] = nc - 1 + p->depth[u];
        rows[k] = k;
        m[(size_t)k * cols + np + k] = 1;
        for (int a = p->parent[u]; a >= 0; a = p->parent[a]) m[(size_t)k * cols + d->slot[a]] = 1;
    }
    int ids[AHEAD_ROWS * POOL_TOPK];
    float lq[AHEAD_ROWS * POOL_TOPK];
    /* a request that waits stops it (model_ahead set the backend's stop check) */
    int rc = backend_forward(b, tok, pos, n, m, rows, n, NULL, e);
    if (!rc) rc = backend_rows_topk(b, POOL_TOPK, ids, lq, d->lse, e);
    free(m);
    if (rc == RS_ESTOPPED) return AHEAD_STOPPED;
    if (rc) return rc;
    ahead_add(d, nodes, n, np, ids, lq);
    d->st.ahead_passes++;
    return RS_OK;
}

/* drafter_ahead: the guess, then the pool below it, until stop() says a request waits;
 * while guesses seldom hit, growth ahead of the last pool instead. A failure takes the guess back; one that
 * cannot be taken back forgets the context (the next commit then fails and the target goes
 * on without the drafter). */
static void model_ahead(void *ctx, int (*stop)(void *), void *arg) {
    ModelDrafter *d = ctx;
    if (!d->ahead_ok || !d->have_last || d->guess_n) return;
    d->have_last = 0; /* one guess per pool */
    d->stop = stop;
    d->stop_arg = arg;
    backend_set_stop(d->b, stop, arg); /* a request waits a layer, not a pass */
    RsErr e = {0};
    int rc;
    if (d->hit_rate < HIT_MIN && ++d->skipped < PROBE_EVERY) {
        rc = RS_OK;
        while (!rc && d->last_pending) rc = ahead_pass(d, &e);
    } else {
        d->skipped = 0;
        rc = guess_commit(d, &e);
    }
    if (!rc && d->guess_n) {
        d->st.guesses++;
        slots_clear(d->grow_slot);
        rc = pool_grow(d->next, d->guess_ids, d->guess_lq, 0, d->depth, d->width, expand, d,
                       d->vocab, "drafter", &e);
        if (!rc) d->next_depth = d->depth, d->next_width = d->width;
    }
    if (rc == AHEAD_STOPPED) rc = RS_OK;
    d->stop = NULL;
    backend_set_stop(d->b, NULL, NULL);
    if (rc && d->guess_n && guess_undo(d, 0, &e)) backend_kv_reset(d->b);
    if (rc) forget_last(d);
}

static void model_ahead_stats(const void *ctx, DrafterAheadStats *st) {
    *st = ((const ModelDrafter *)ctx)->st;
}

static void model_set_shape(void *ctx, int depth, int width) {
    ModelDrafter *d = ctx;
    d->depth = depth;
    d->width = width;
}

static void md_destroy(void *ctx) {
    ModelDrafter *d = ctx;
    backend_destroy(&d->b);
    model_destroy(&d->view); /* after the backend that borrowed it */
    sync_growth_free(&d->g);
    free(d->last);
    free(d->slot);
    free(d->grow_slot);
    free(d->stay_row);
    free(d->next);
    free(d);
}

static const DrafterOps model_ops = {
    .reset = model_reset,
    .grow_begin = model_grow_begin,
    .grow_end = model_grow_end,
    .destroy = md_destroy,
    .append = model_append,
    .set_shape = model_set_shape,
    .ahead = model_ahead,
    .ahead_stats = model_ahead_stats,
};

/* Builds the kind's state on `m`; takes ownership of `view` (NULL or m itself). */
static int model_kind_create(const Model *m, Model *view, const BackendOps *ops,
                             const BackendParams *params, Drafter **out, RsErr *e) {
    *out = NULL;
    if (m->cfg.vocab_size < POOL_TOPK) {
        model_destroy(&view);
        return rs_err(e, RS_EUNSUPPORTED, "drafter vocabulary of %d tokens is smaller than %d",
                      m->cfg.vocab_size, POOL_TOPK);
    }
    ModelDrafter *d = rs_xcalloc(1, sizeof *d);
    d->m = m;
    d->view = view;
    d->vocab = m->cfg.vocab_size;
    d->depth = POOL_MAX_DEPTH;
    d->width = POOL_EXPAND;
    BackendParams bp = *params;
    bp.max_batch = MAX_BATCH;
    bp.max_pending = MAX_PENDING;
    bp.topk_hint = POOL_TOPK; /* every pass is read by reduce() */
    int rc = backend_create(ops, m, &bp, &d->b, e);
    if (rc) {
        model_destroy(&d->view);
        free(d);
        return rc;
    }
    sync_growth_init(&d->g);
    d->last = rs_xcalloc(1, sizeof(Pool));
    d->slot = rs_xcalloc(POOL_MAX, sizeof(int));
    d->grow_slot = rs_xcalloc(POOL_MAX, sizeof(int));
    d->stay_row = rs_xcalloc(POOL_MAX, sizeof(int));
    slots_clear(d->stay_row);
    d->stay_root = -1;
    d->next = rs_xcalloc(1, sizeof(Pool));
    RsErr te = {0};
    d->ahead_ok = backend_kv_truncate(d->b, 0, &te) == RS_OK;
    d->hit_rate = 1; /* until guesses say otherwise */
    DrafterInfo info = {.vocab_size = d->vocab, .fingerprint = m->fingerprint, .name = m->path};
    *out = drafter_wrap(&model_ops, d, &info);
    return RS_OK;
}

int drafter_model_create(const Model *m, const BackendOps *ops, const BackendParams *bp,
                         Drafter **out, RsErr *e) {
    return model_kind_create(m, NULL, ops, bp, out, e);
}

int drafter_model_adopt(Model *m, const BackendOps *ops, const BackendParams *bp,
                        Drafter **out, RsErr *e) {
    return model_kind_create(m, m, ops, bp, out, e);
}

int drafter_self_create(const Model *target, const char *layers, const BackendOps *ops,
                        const BackendParams *bp, Drafter **out, RsErr *e) {
    *out = NULL;
    Model *view = NULL;
    int rc = model_layer_view(target, layers, &view, e);
    if (rc) return rc;
    return model_kind_create(view, view, ops, bp, out, e);
}

int model_drafter_n_committed(const Drafter *d) {
    RS_ASSERT(d->ops == &model_ops);
    const ModelDrafter *md = d->ctx;
    return backend_n_committed(md->b) - md->guess_n;
}

BackendStats model_drafter_backend_stats(const Drafter *d) {
    RS_ASSERT(d->ops == &model_ops);
    const ModelDrafter *md = d->ctx;
    return backend_stats(md->b);
}
