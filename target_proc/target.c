/* The target model's backend, buffers and passes; see target.h. */
#include "target.h"
#include "kernels/prefill.h"
#include <string.h>

#define MAX_BATCH TARGET_MAX_BATCH

int target_create(const Model *m, const BackendOps *ops, const BackendParams *params,
                  const int *eog, int n_eog, Target **out, RsErr *e) {
    *out = NULL;
    BackendParams bp = *params;
    bp.max_batch = MAX_BATCH;
    bp.max_pending = TARGET_PASS_MAX + 2;
    Backend *b = NULL;
    int rc = backend_create(ops, m, &bp, &b, e);
    if (rc) return rc;
    target_create_on(b, eog, n_eog, out);
    return RS_OK;
}

void target_create_on(Backend *b, const int *eog, int n_eog, Target **out) {
    Target *t = rs_xcalloc(1, sizeof *t);
    t->b = b;
    t->m = backend_model(b);
    t->vocab = t->m->cfg.vocab_size;
    t->eog = rs_xcalloc((size_t)t->vocab, 1);
    for (int i = 0; i < n_eog; i++)
        if (eog[i] >= 0 && eog[i] < t->vocab) t->eog[eog[i]] = 1;
    t->kept_pass = -1;
    t->mask = rs_xmalloc((size_t)(TARGET_PASS_MAX + 1) * (TARGET_PASS_MAX + 2));
    t->pool = rs_xmalloc(sizeof(Pool));
    *out = t;
}

void target_destroy(Target **pt) {
    if (!pt || !*pt) return;
    Target *t = *pt;
    backend_destroy(&t->b);
    free(t->eog);
    free(t->mask);
    free(t->pool);
    free(t);
    *pt = NULL;
}

Backend *target_backend(Target *t) { return t->b; }

int target_kv_capacity(const Target *t) { return backend_kv_capacity(t->b); }

void target_reset(Target *t) {
    backend_kv_reset(t->b);
    t->n_cached = t->n_forked = 0;
}

int target_prefill(Target *t, const int *tokens, int n, RsErr *e) {
    t->kept_pass = -1;
    int have = backend_n_committed(t->b); /* a fork's entries, else none */
    RS_ASSERT(have <= n);
    t->n_cached = have ? have : backend_prefix_attach(t->b, 0, tokens, n);
    t->n_forked = 0;
    int rc = backend_prefill(t->b, tokens + t->n_cached, n - t->n_cached, NULL, e);
    if (!rc) backend_prefix_publish(t->b, 0, tokens, n);
    return rc;
}

int target_prefill_rows(Target *t, const int *tokens, int n, float *feats, PrefillRowsFn fn,
                        void *user, RsErr *e) {
    t->kept_pass = -1;
    t->n_cached = 0;
    int rc = backend_prefill_rows(t->b, tokens, n, feats, fn, user, e);
    if (!rc) backend_prefix_publish(t->b, 0, tokens, n);
    return rc;
}

void target_publish(Target *t, const int *tokens, int n) {
    int nc = backend_n_committed(t->b);
    backend_prefix_publish(t->b, 0, tokens, n < nc ? n : nc);
}

int target_root_pass(Target *t, int root, RsErr *e) {
    Backend *b = t->b;
    int pos = backend_n_committed(b), row = 0;
    uint8_t one = 1;
    t->kept_pass = -1;
    int rc = backend_forward(b, &root, &pos, 1, &one, &row, 1, NULL, e);
    if (!rc) t->kept_pass = 0;
    return rc;
}

int target_tree_pass(Target *t, const TreePass *ps, int root, int with_root, RsErr *e) {
    Backend *b = t->b;
    int np = backend_n_pending(b), n = ps->n + with_root, cols = np + n;
    RS_ASSERT(np + with_root == 1);
    int tokens[TARGET_PASS_MAX + 1], pos[TARGET_PASS_MAX + 1], rows[TARGET_PASS_MAX + 1];
    int P = backend_n_committed(b);
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
    t->kept_pass = -1;
    int rc = backend_forward(b, tokens, pos, n, t->mask, rows, n, NULL, e);
    if (!rc) {
        t->kept_pass = 1;
        t->kept_with_root = with_root;
    }
    return rc;
}

int target_commit(Target *t, const int *keep, int n, RsErr *e) {
    return backend_kv_commit(t->b, keep, n, e);
}

int target_row(const Target *t, int slot) {
    if (slot < 0) {
        RS_ASSERT(t->kept_pass == 0 || (t->kept_pass == 1 && t->kept_with_root));
        return 0;
    }
    RS_ASSERT(t->kept_pass == 1);
    return t->kept_with_root + slot;
}
