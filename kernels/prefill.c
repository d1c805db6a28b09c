/* Chunked prefill; see prefill.h. */
#include "prefill.h"

int prefill_chunk(const BackendParams *p) {
    int c = p->max_batch < p->max_pending ? p->max_batch : p->max_pending;
    c = c < PREFILL_CHUNK_MAX ? c : PREFILL_CHUNK_MAX;
    RS_ASSERT(c >= 1);
    return c;
}

int backend_prefill(Backend *b, const int *tokens, int n, float *last_row, RsErr *e) {
    return backend_prefill_features(b, tokens, n, last_row, NULL, e);
}

int backend_prefill_features(Backend *b, const int *tokens, int n, float *last_row, float *feats,
                             RsErr *e) {
    RS_ASSERT(n >= 0 && backend_n_pending(b) == 0);
    BackendParams bp = backend_params(b);
    int chunk = prefill_chunk(&bp);
    int pos[PREFILL_CHUNK_MAX], keep[PREFILL_CHUNK_MAX];
    for (int i = 0; i < chunk; i++) keep[i] = i;
    for (int off = 0; off < n; off += chunk) {
        int m = n - off < chunk ? n - off : chunk;
        for (int i = 0; i < m; i++) pos[i] = backend_n_committed(b) + i;
        int last = m - 1, want = last_row && off + m == n;
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
