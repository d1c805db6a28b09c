/* The shared pool growth (pool_grow.h): the candidates' bookkeeping, the tree masks and the
 * choice of the nodes to expand; the kinds forward the nodes. */
#include "pool_grow.h"
#include <string.h>

void pool_add_children(Pool *p, const int *ids, const float *logq, int parent, int depth) {
    for (int k = 0; k < POOL_TOPK; k++) {
        int i = p->n++;
        p->token[i] = ids[k];
        p->parent[i] = parent;
        p->logq[i] = logq[k] > 0 ? 0 : logq[k]; /* rounding can push the top token a hair above 0 */
        p->depth[i] = (uint8_t)depth;
        p->score[i] = (parent >= 0 ? p->score[parent] : 0) + p->logq[i];
    }
}

/* The `width` best of the candidates from `first` on (all of one depth) by the ranking,
 * returned in pool order so children stay in creation order by parent. */
static void best_new(const Pool *p, int first, int width, int *nodes) {
    int cand[POOL_EXPAND * POOL_TOPK], nc = p->n - first;
    for (int i = 0; i < nc; i++) cand[i] = first + i;
    for (int k = 0; k < width; k++) { /* partial selection sort */
        int best = k;
        for (int i = k + 1; i < nc; i++)
            if (pool_rank_cmp(p, cand[i], cand[best]) < 0) best = i;
        int t = cand[k];
        cand[k] = cand[best];
        cand[best] = t;
        nodes[k] = cand[k];
    }
    for (int k = 1; k < width; k++)
        for (int j = k; j > 0 && nodes[j] < nodes[j - 1]; j--) {
            int t = nodes[j];
            nodes[j] = nodes[j - 1];
            nodes[j - 1] = t;
        }
}

/* One pass over `nodes` (one depth): mask rows naming each node's pending ancestors and
 * itself, the kind's forward, then the nodes' children. slot_of: pending row of every
 * expanded node so far. Returns RS_OK (n rows added), POOL_ROWS_REUSED (none) or an
 * error. */
static int expand_pass(Pool *p, const int *nodes, int n, int np, int *slot_of, uint8_t *m,
                       PoolExpandFn expand, void *ctx, RsErr *e) {
    int cols = np + n, tokens[POOL_EXPAND], prow[POOL_EXPAND];
    int ids[POOL_EXPAND * POOL_TOPK];
    float lq[POOL_EXPAND * POOL_TOPK];
    memset(m, 0, (size_t)n * cols);
    for (int k = 0; k < n; k++) {
        int u = nodes[k];
        tokens[k] = p->token[u];
        prow[k] = p->parent[u] < 0 ? -1 : slot_of[p->parent[u]];
        m[(size_t)k * cols + np + k] = 1;
        for (int a = p->parent[u]; a >= 0; a = p->parent[a]) {
            RS_ASSERT(slot_of[a] >= 0);
            m[(size_t)k * cols + slot_of[a]] = 1;
        }
    }
    int row[POOL_EXPAND];
    PoolPass pass = {.n = n, .node = nodes, .token = tokens, .depth = p->depth[nodes[0]],
                     .parent_row = prow, .mask = m, .n_pending = np, .row = row};
    int rc = expand(ctx, &pass, ids, lq, e);
    if (rc != RS_OK && rc != POOL_ROWS_REUSED) return rc;
    for (int k = 0; k < n; k++) slot_of[nodes[k]] = rc == POOL_ROWS_REUSED ? row[k] : np + k;
    for (int k = 0; k < n; k++)
        pool_add_children(p, ids + k * POOL_TOPK, lq + k * POOL_TOPK, nodes[k], p->depth[nodes[k]] + 1);
    return rc;
}

int pool_grow(Pool *p, const int *root_ids, const float *root_logq, int n_pending0,
              int max_depth, int width, PoolExpandFn expand, void *ctx, int vocab, const char *who,
              RsErr *e) {
    int slot_of[POOL_MAX], nodes[POOL_EXPAND], passes = 1, expanded = 0, np = n_pending0;
    for (int i = 0; i < POOL_MAX; i++) slot_of[i] = -1;
    p->n = 0;
    pool_add_children(p, root_ids, root_logq, -1, 1);
    RS_ASSERT(width >= 1 && width <= POOL_EXPAND);
    for (int k = 0; k < width; k++) nodes[k] = k; /* the root's top `width`, best first */
    uint8_t mask[POOL_EXPAND * POOL_N_EXPANDED];
    /* the mask's columns cover the rows pending before the growth too */
    uint8_t *m = n_pending0 ? rs_xmalloc(POOL_EXPAND * ((size_t)n_pending0 + POOL_N_EXPANDED))
                            : mask;
    RS_ASSERT(max_depth >= 1 && max_depth <= POOL_MAX_DEPTH);
    for (int depth = 1; depth < max_depth; depth++) {
        int first_new = p->n;
        int rc = expand_pass(p, nodes, width, np, slot_of, m, expand, ctx, e);
        if (rc != RS_OK && rc != POOL_ROWS_REUSED) {
            if (m != mask) free(m);
            return rc;
        }
        passes++;
        expanded += width;
        if (rc == RS_OK) np += width;
        if (depth + 1 < max_depth) best_new(p, first_new, width, nodes);
    }
    if (m != mask) free(m);
    RS_ASSERT(p->n == POOL_TOPK + (max_depth - 1) * width * POOL_TOPK &&
              expanded == (max_depth - 1) * width);
    /* The shape is right by construction; log q is not when the model's logits are not
     * finite (NaN / inf weights, fp16 overflow): an error for the target, not an abort. */
    RsErr pe = {0};
    if (pool_finalize(p, vocab, &pe) != RS_OK)
        return rs_err(e, RS_EFORMAT, "%s produced an invalid pool (non-finite logits?): %s", who,
                      pe.msg);
    p->n_passes = passes;
    p->n_expanded = expanded;
    return RS_OK;
}
