/* Chunked prefill; see prefill.h. */
#include "prefill.h"

int prefill_chunk(const BackendParams *p) {
    int c = p->max_batch < p->max_pending ? p->max_batch : p->max_pending;
    c = c < PREFILL_CHUNK_MAX ? c : PREFILL_CHUNK_MAX;
    if (p->prefill_chunk > 0 && p->prefill_chunk < c) c = p->prefill_chunk;
    RS_ASSERT(c >= 1);
    return c;
}

/* want_last: the last token's row is computed (copied to last_row unless NULL, else kept in
 * the backend); feats: see backend_prefill_features. */
static int prefill(Backend *b, const int *tokens, int n, int want_last, float *last_row,
                   float *feats, RsErr *e) {
    RS_ASSERT(n >= 0 && backend_n_pending(b) == 0);
    BackendParams bp = backend_params(b);
    int chunk = prefill_chunk(&bp);
    int pos[PREFILL_CHUNK_MAX], keep[PREFILL_CHUNK_MAX];
    for (int i = 0; i < chunk; i++) keep[i] = i;
    for (int off = 0; off < n; off += chunk) {
        int m = n - off < chunk ? n - off : chunk;
        for (int i = 0; i < m; i++) pos[i] = backend_n_committed(b) + i;
        int last = m - 1, want = want_last && off + m == n;
        int rc = backend_forward(b, tokens + off, pos, m, NULL, &last, want, last_row, e);
        if (rc) return rc;
        rc = backend_kv_commit(b, keep, m, e);
        if (rc) return rc;
        if (feats)
            backend_read_features(b, BACKEND_FEAT_F32,
                                  feats + (size_t)off * backend_feature_width(b));
    }
    return RS_OK;
}

int backend_prefill(Backend *b, const int *tokens, int n, float *last_row, RsErr *e) {
    return prefill(b, tokens, n, last_row != NULL, last_row, NULL, e);
}

int backend_prefill_features(Backend *b, const int *tokens, int n, float *last_row, float *feats,
                             RsErr *e) {
    return prefill(b, tokens, n, last_row != NULL, last_row, feats, e);
}

int backend_prefill_keep(Backend *b, const int *tokens, int n, RsErr *e) {
    RS_ASSERT(n >= 1);
    return prefill(b, tokens, n, 1, NULL, NULL, e);
}
