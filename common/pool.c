/* Pool validation and ranking (DESIGN.md §2). pool_finalize() is the one gate every pool passes
 * before selection: the drafter's pools arrive over the wire, so nothing in them is
 * trusted until it has been checked here. */
#include "pool.h"
#include "util.h"
#include <math.h>
#include <string.h>

static int check_and_link(Pool *p, int vocab_size, RsErr *e) {
    if (p->n < 0 || p->n > POOL_MAX)
        return rs_err(e, RS_EPROTO, "bad pool: %d candidates, expected 0..%d", p->n, POOL_MAX);
    int n = p->n, n_expanded = 0;
    p->root_first_child = -1;
    p->root_n_children = 0;
    for (int i = 0; i < n; i++) {
        p->first_child[i] = -1;
        p->n_children[i] = 0;
    }
    for (int i = 0; i < n; i++) {
        int32_t par = p->parent[i];
        /* Parents strictly before children: this makes every path finite and lets one
         * forward sweep compute scores. */
        if (par < -1 || par >= i)
            return rs_err(e, RS_EPROTO,
                          "bad pool: candidate %d has parent %d, which does not precede it", i,
                          (int)par);
        int want = par < 0 ? 1 : p->depth[par] + 1;
        if (p->depth[i] != want || want > POOL_MAX_DEPTH)
            return rs_err(e, RS_EPROTO,
                          "bad pool: candidate %d has depth %d, expected %d (parent %d, max %d)",
                          i, (int)p->depth[i], want, (int)par, POOL_MAX_DEPTH);
        if (p->token[i] < 0 || (vocab_size > 0 && p->token[i] >= vocab_size)) {
            if (vocab_size > 0)
                return rs_err(e, RS_EPROTO, "bad pool: candidate %d has token %d, outside [0, %d)",
                              i, (int)p->token[i], vocab_size);
            return rs_err(e, RS_EPROTO, "bad pool: candidate %d has negative token %d", i,
                          (int)p->token[i]);
        }
        /* NaN fails both comparisons; log q <= 0 is what makes top-B ancestor-closed. */
        if (!(p->logq[i] <= 0.0f) || !isfinite(p->logq[i]))
            return rs_err(e, RS_EPROTO, "bad pool: candidate %d has log q %g, expected finite <= 0",
                          i, (double)p->logq[i]);
        p->score[i] = (par < 0 ? 0.0f : p->score[par]) + p->logq[i];
        /* Child links: a node's children must form one contiguous run of pool indices. */
        int32_t *fc = par < 0 ? &p->root_first_child : &p->first_child[par];
        int32_t *nc = par < 0 ? &p->root_n_children : &p->n_children[par];
        if (*nc == 0) {
            *fc = i;
        } else if (*fc + *nc != i) {
            return rs_err(e, RS_EPROTO,
                          "bad pool: children of node %d are not contiguous (candidate %d after "
                          "run %d..%d)",
                          (int)par, i, (int)*fc, (int)(*fc + *nc - 1));
        } else {
            /* Siblings come from a top-k, so they are distinct; a repeated token would make
             * "the draw labels a child" ambiguous in verification. */
            for (int j = *fc; j < i; j++)
                if (p->token[j] == p->token[i])
                    return rs_err(e, RS_EPROTO,
                                  "bad pool: candidates %d and %d are siblings with the same "
                                  "token %d",
                                  j, i, (int)p->token[i]);
        }
        /* A node's first child makes it an expanded node. The target sizes its tree pass
         * for POOL_N_EXPANDED of them (score_all passes cover every expanded node). */
        if (*nc == 0 && par >= 0 && ++n_expanded > POOL_N_EXPANDED)
            return rs_err(e, RS_EPROTO,
                          "bad pool: candidate %d makes %d expanded nodes (nodes with "
                          "children), at most %d",
                          i, n_expanded, POOL_N_EXPANDED);
        (*nc)++;
    }
    return RS_OK;
}

int pool_finalize(Pool *p, int vocab_size, RsErr *e) {
    RS_ASSERT(p);
    int rc = check_and_link(p, vocab_size, e);
    if (rc) p->n = 0;
    return rc;
}

/* One sibling run [first, first + n): log q_T = log q / T - log(sum over the run of
 * q^(1/T) + R^(1/T)), R the run's missing mass taken as one token. */
static void temper_run(Pool *p, int first, int n, double T) {
    double seen = 0, z = 0;
    for (int i = first; i < first + n; i++) {
        seen += exp((double)p->logq[i]);
        z += exp((double)p->logq[i] / T);
    }
    if (seen < 1) z += pow(1 - seen, 1 / T);
    double lz = log(z);
    for (int i = first; i < first + n; i++) {
        double lq = (double)p->logq[i] / T - lz;
        p->logq[i] = lq < 0 ? (float)lq : 0.0f;
    }
}

void pool_temper(Pool *p, double T) {
    RS_ASSERT(T > 0);
    if (T == 1 || p->n == 0) return;
    temper_run(p, p->root_first_child, p->root_n_children, T);
    for (int u = 0; u < p->n; u++)
        if (p->n_children[u] > 0) temper_run(p, p->first_child[u], p->n_children[u], T);
    for (int i = 0; i < p->n; i++) /* parents come first */
        p->score[i] = (p->parent[i] < 0 ? 0.0f : p->score[p->parent[i]]) + p->logq[i];
}

int pool_rank_cmp_by(const Pool *p, const double *score, int a, int b) {
    RS_ASSERT(a >= 0 && a < p->n && b >= 0 && b < p->n);
    double sa = score ? score[a] : (double)p->score[a], sb = score ? score[b] : (double)p->score[b];
    if (sa > sb) return -1;
    if (sa < sb) return 1;
    if (p->depth[a] != p->depth[b]) return p->depth[a] < p->depth[b] ? -1 : 1;
    return a < b ? -1 : (a > b);
}

int pool_rank_cmp(const Pool *p, int a, int b) { return pool_rank_cmp_by(p, NULL, a, b); }
