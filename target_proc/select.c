/* Selection rules and tau. Every rule ranks with the same total order (pool_rank_cmp_by:
 * score desc, depth asc, pool index asc), which makes any top-k set ancestor-closed because
 * scores never increase along a path; the sorted order also lists parents before children. */
#include "select.h"
#include "common/util.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const DECODER_NAMES[DECODER_COUNT] = {"ar",       "draft", "pearl",
                                                         "rootdraw", "root",  "oracle"};

const char *decoder_name(DecoderKind k) {
    return (k >= 0 && k < DECODER_COUNT) ? DECODER_NAMES[k] : "?";
}

int decoder_parse(const char *s) {
    for (int i = 0; i < DECODER_COUNT; i++)
        if (s && strcmp(s, DECODER_NAMES[i]) == 0) return i;
    return -1;
}

int decoder_needs_root_pass(DecoderKind k) {
    return k == DECODER_PEARL || k == DECODER_ROOTDRAW || k == DECODER_ROOT;
}

typedef struct {
    const Pool *p;
    const double *score; /* (p->n), NULL: the pool's own */
} RankCtx;

static int rank_cmp(const void *a, const void *b, void *vctx) {
    const RankCtx *c = vctx;
    return pool_rank_cmp_by(c->p, c->score, *(const int *)a, *(const int *)b);
}

/* Sorts idx[0..n) by the ranking under `score` (NULL: the pool's own). */
static void rank_sort(const Pool *p, const double *score, int *idx, int n) {
    RankCtx c = {p, score};
    qsort_r(idx, (size_t)n, sizeof(int), rank_cmp, &c);
}

/* Fills sel->t from an ordered, ancestor-closed list of pool indices (parents first).
 * If x1_root >= 0, that pool node must be list[0] and becomes the X1 root of the tree. */
static void build_tree(const Pool *p, const int *list, int n, Selection *sel) {
    int map[POOL_MAX];
    for (int i = 0; i < p->n; i++) map[i] = -1;
    sel->t.n = n;
    for (int k = 0; k < n; k++) {
        int u = list[k];
        sel->t.node[k] = u;
        int par = p->parent[u];
        if (k == 0 && sel->rooted_at_x1) par = -1;
        sel->t.parent[k] = par < 0 ? -1 : map[par];
        RS_ASSERT(par < 0 || map[par] >= 0); /* ancestor-closed, parents first */
        map[u] = k;
    }
}

static void sel_init(Selection *sel) {
    memset(sel, 0, sizeof *sel);
    sel->x1_token = -1;
}

/* Top-B of the pool by `score` (NULL: the pool's own) into list; returns count. */
static int top_b(const Pool *p, const double *score, int B, int *list) {
    int idx[POOL_MAX];
    for (int i = 0; i < p->n; i++) idx[i] = i;
    rank_sort(p, score, idx, p->n);
    int n = B < p->n ? B : p->n;
    memcpy(list, idx, (size_t)n * sizeof(int));
    return n;
}

void select_draft(const Pool *p, int B, Selection *out) {
    RS_ASSERT(B >= 1 && B <= TREE_MAX);
    sel_init(out);
    int list[TREE_MAX];
    build_tree(p, list, top_b(p, NULL, B, list), out);
}

static int first_level_node(const Pool *p, int token) {
    for (int k = 0; k < p->root_n_children; k++) {
        int i = p->root_first_child + k;
        if (p->token[i] == token) return i;
    }
    return -1;
}

static void x1_alone(Selection *out, int x1) {
    out->t.n = 1;
    out->t.node[0] = TREE_X1_OFFPOOL;
    out->t.parent[0] = -1;
}

static int is_descendant(const Pool *p, int u, int anc) {
    while (u >= 0 && u != anc) u = p->parent[u];
    return u == anc;
}

void select_pearl(const Pool *p, int B, int x1, Selection *out) {
    Selection sel;
    select_draft(p, B, &sel);
    sel_init(out);
    out->x1_token = x1;
    out->rooted_at_x1 = 1;
    int x1n = first_level_node(p, x1);
    out->x1_in_pool = x1n >= 0;
    int list[TREE_MAX], n = 0;
    for (int k = 0; k < sel.t.n; k++)
        if (x1n >= 0 && is_descendant(p, sel.t.node[k], x1n)) list[n++] = sel.t.node[k];
    if (n == 0) {
        x1_alone(out, x1);
        return;
    }
    RS_ASSERT(list[0] == x1n);
    build_tree(p, list, n, out);
}

void select_rootdraw(const Pool *p, int B, int x1, Selection *out) {
    RS_ASSERT(B >= 1 && B <= TREE_MAX);
    sel_init(out);
    out->x1_token = x1;
    out->rooted_at_x1 = 1;
    int x1n = first_level_node(p, x1);
    out->x1_in_pool = x1n >= 0;
    if (x1n < 0) {
        x1_alone(out, x1);
        return;
    }
    /* Descendants of x1n: children are contiguous, so walk breadth-first. */
    int desc[POOL_MAX], nd = 0, head = 0;
    desc[nd++] = x1n;
    while (head < nd) {
        int u = desc[head++];
        for (int c = 0; c < p->n_children[u]; c++) desc[nd++] = p->first_child[u] + c;
    }
    rank_sort(p, NULL, desc + 1, nd - 1);
    int n = nd < B ? nd : B;
    build_tree(p, desc, n, out);
}

void select_root(const Pool *p, int B, const float *p0, int x1, Selection *out) {
    double logp1[POOL_MAX];
    for (int k = 0; k < p->root_n_children; k++) {
        double pr = p0[p->token[p->root_first_child + k]];
        logp1[k] = pr > 0 ? log(pr) : -INFINITY;
    }
    select_root_logp(p, B, logp1, x1, out);
}

void select_root_logp(const Pool *p, int B, const double *logp1, int x1, Selection *out) {
    RS_ASSERT(B >= 1 && B <= TREE_MAX);
    sel_init(out);
    out->x1_token = x1;
    out->x1_in_pool = first_level_node(p, x1) >= 0;
    double score[POOL_MAX];
    for (int i = 0; i < p->n; i++) {
        int a = i;
        while (p->parent[a] >= 0) a = p->parent[a];
        score[i] = logp1[a - p->root_first_child] + ((double)p->score[i] - p->logq[a]);
    }
    int list[TREE_MAX];
    build_tree(p, list, top_b(p, score, B, list), out);
}

void select_oracle(const Pool *p, int B, const double *path_prob, Selection *out) {
    RS_ASSERT(B >= 1 && B <= TREE_MAX);
    sel_init(out);
    int list[TREE_MAX];
    build_tree(p, list, top_b(p, path_prob, B, list), out);
}

int tree_child_with_token(const Pool *p, const Selection *sel, int at, int token) {
    for (int k = (at < 0 ? 0 : at + 1); k < sel->t.n; k++) {
        if (sel->t.parent[k] != at) continue;
        int u = sel->t.node[k];
        int tok = u == TREE_X1_OFFPOOL ? sel->x1_token : p->token[u];
        if (tok == token) return k;
    }
    return -1;
}

double tree_tau(const Selection *sel, const double *trans) {
    double path[TREE_MAX], tau = 0;
    for (int k = 0; k < sel->t.n; k++) {
        double par = sel->t.parent[k] < 0 ? 1.0 : path[sel->t.parent[k]];
        path[k] = (k == 0 && sel->rooted_at_x1) ? 1.0 : par * trans[k];
        tau += path[k];
    }
    return tau;
}

double tree_tau_given_x1(const Selection *sel, const double *trans, int k1) {
    RS_ASSERT(k1 >= 0 && k1 < sel->t.n && sel->t.parent[k1] < 0);
    double path[TREE_MAX], tau = 0;
    int below[TREE_MAX]; /* parents come first, so one sweep marks k1's subtree */
    for (int k = 0; k < sel->t.n; k++) {
        int par = sel->t.parent[k];
        below[k] = k == k1 || (par >= 0 && below[par]);
        if (!below[k]) continue;
        path[k] = k == k1 ? 1.0 : path[par] * trans[k];
        tau += path[k];
    }
    return tau;
}
