/* Chunked prefill; see prefill.h. */
#include "prefill.h"

int prefill_chunk(const BackendParams *bp) {
    int c = bp->max_batch < bp->max_pending ? bp->max_batch : bp->max_pending;
    c = c < PREFILL_CHUNK_MAX ? c : PREFILL_CHUNK_MAX;
    if (bp->prefill_chunk > 0 && bp->prefill_chunk < c) c = bp->prefill_chunk;
    RS_ASSERT(c >= 1);
    return c;
}

/* Copies the chunk's kept rows (all m of them, kept rows 0..m-1) to the host a few at a time
 * and hands them to fn: rows predicting tokens first+1.. of the prefill. */
#define ROWS_AT_ONCE 16
static int prefill_report(Backend *b, int first, int m, PrefillRowsFn fn, void *user, RsErr *e) {
    int vocab = backend_model(b)->cfg.vocab_size;
    float *buf = rs_xmalloc(sizeof(float) * (size_t)vocab * ROWS_AT_ONCE);
    int rows[ROWS_AT_ONCE], rc = RS_OK;
    for (int r0 = 0; r0 < m && !rc; r0 += ROWS_AT_ONCE) {
        int k = m - r0 < ROWS_AT_ONCE ? m - r0 : ROWS_AT_ONCE;
        for (int i = 0; i < k; i++) rows[i] = r0 + i;
        rc = backend_rows_copy(b, rows, k, buf, e);
        if (!rc) fn(user, buf, first + r0, k, vocab);
    }
    free(buf);
    return rc;
}

/* want_last: the last token's row is computed (copied to last_row unless NULL, else kept in
 * the backend); feats: see backend_prefill_features; fn: see backend_prefill_rows. */
static int prefill(Backend *b, const int *tokens, int n, int want_last, float *last_row,
                   float *feats, PrefillRowsFn fn, void *user, RsErr *e) {
    RS_ASSERT(n >= 0 && backend_n_pending(b) == 0);
    BackendParams bp = backend_params(b);
    int chunk = prefill_chunk(&bp);
    int pos[PREFILL_CHUNK_MAX], keep[PREFILL_CHUNK_MAX];
    for (int i = 0; i < chunk; i++) keep[i] = i;
    for (int off = 0; off < n; off += chunk) {
        int m = n - off < chunk ? n - off : chunk;
        for (int i = 0; i < m; i++) pos[i] = backend_n_committed(b) + i;
        int last = m - 1, want = want_last && off + m == n;
        int rc = fn ? backend_forward(b, tokens + off, pos, m, NULL, keep, m, NULL, e)
                    : backend_forward(b, tokens + off, pos, m, NULL, &last, want, last_row, e);
        if (!rc && fn) rc = prefill_report(b, off, m, fn, user, e);
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
    return prefill(b, tokens, n, last_row != NULL, last_row, NULL, NULL, NULL, e);
}

int backend_prefill_features(Backend *b, const int *tokens, int n, float *last_row, float *feats,
                             RsErr *e) {
    return prefill(b, tokens, n, last_row != NULL, last_row, feats, NULL, NULL, e);
}

int backend_prefill_keep(Backend *b, const int *tokens, int n, RsErr *e) {
    RS_ASSERT(n >= 1);
    return prefill(b, tokens, n, 1, NULL, NULL, NULL, NULL, e);
}

int backend_prefill_rows(Backend *b, const int *tokens, int n, float *feats, PrefillRowsFn fn,
                         void *user, RsErr *e) {
    RS_ASSERT(fn);
    return prefill(b, tokens, n, 0, NULL, feats, fn, user, e);
}
