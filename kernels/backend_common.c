/* The public backend functions (kernels/backend.h) over the ops table, and the pieces every
 * backend shares so they agree exactly: argument checks of forward() (same messages on CPU
 * and CUDA), model loading per backend and the backend-by-name lookup. */
#include "backend_impl.h"
#include "common/quant.h"
#include "kernels/cpu/cpu_topk.h"
#include "common/randmodel.h"
#include <math.h>
#include <string.h>

int backend_check_segment(const Backend *b, int nc, int np, const int *tokens, const int *pos,
                          int n, const uint8_t *mask, RsErr *e) {
    const BackendParams *bp = &b->params;
    int vocab = b->model->cfg.vocab_size;
    if (n <= 0) return rs_err(e, RS_EINVAL, "forward of %d tokens: need at least 1", n);
    if (n > bp->max_batch)
        return rs_err(e, RS_EINVAL, "batch of %d tokens exceeds max_batch %d (chunk the prefill)",
                      n, bp->max_batch);
    if (nc + np + n > bp->kv_capacity)
        return rs_err(e, RS_EINVAL,
                      "batch of %d tokens exceeds KV capacity %d (committed %d, pending %d)", n,
                      bp->kv_capacity, nc, np);
    if (np + n > bp->max_pending)
        return rs_err(e, RS_EINVAL, "batch of %d tokens exceeds max_pending %d (pending %d)", n,
                      bp->max_pending, np);
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= vocab)
            return rs_err(e, RS_EINVAL, "token %d at batch index %d outside vocabulary [0, %d)",
                          tokens[i], i, vocab);
        if (pos[i] < 0)
            return rs_err(e, RS_EINVAL, "position %d at batch index %d is negative", pos[i], i);
        if (mask && !mask[(size_t)i * (np + n) + np + i])
            return rs_err(e, RS_EINVAL, "mask row %d does not attend to its own token", i);
    }
    return RS_OK;
}

static int check_out_rows(const int *out_rows, int n_out, int n, RsErr *e) {
    if (n_out < 0 || n_out > n)
        return rs_err(e, RS_EINVAL, "n_out %d outside [0, %d] for a batch of %d tokens", n_out,
                      n, n);
    for (int i = 0; i < n_out; i++)
        if (out_rows[i] < 0 || out_rows[i] >= n)
            return rs_err(e, RS_EINVAL, "out_rows[%d] = %d outside [0, %d)", i, out_rows[i], n);
    return RS_OK;
}

int backend_check_forward(const Backend *b, const int *tokens, const int *pos, int n,
                          const uint8_t *mask, const int *out_rows, int n_out, RsErr *e) {
    int rc = backend_check_segment(b, b->n_committed, b->n_pending, tokens, pos, n, mask, e);
    return rc ? rc : check_out_rows(out_rows, n_out, n, e);
}

int backend_model_load(const BackendOps *ops, const char *path, const BackendParams *bp,
                       Model **out, RsErr *e) {
    int rc = model_load(path, out, e);
    if (rc) return rc;
    if ((*out)->random_weights && !ops->makes_random_weights) rc = model_random_materialize(*out, e);
    if (!rc && ops->streams_host_weights) rc = model_make_resident(*out, e);
    if (!rc && ops->prepare_weights) rc = ops->prepare_weights(*out, bp, e);
    if (rc) model_destroy(out);
    return rc;
}

const BackendOps *backend_ops_by_name(const char *name, RsErr *e) {
    if (!name || strcmp(name, "cpu") == 0) return &cpu_backend_ops;
    if (strcmp(name, "cuda") == 0) {
        const BackendOps *ops = cuda_backend_ops_get();
        if (!ops) rs_err(e, RS_EUNSUPPORTED, "this binary was built without CUDA (use build/cuda/)");
        return ops;
    }
    rs_err(e, RS_EINVAL, "--backend: unknown backend '%s' (cpu, cuda)", name);
    return NULL;
}

int backend_create(const BackendOps *ops, const Model *m, const BackendParams *bp, Backend **out,
                   RsErr *e) {
    RS_ASSERT(ops && m && bp && out);
    *out = NULL;
    if (bp->topk_hint < 0 || bp->topk_hint > BACKEND_TOPK_MAX || bp->topk_hint > m->cfg.vocab_size)
        return rs_err(e, RS_EINVAL, "topk_hint = %d outside [0, %d]", bp->topk_hint,
                      m->cfg.vocab_size < BACKEND_TOPK_MAX ? m->cfg.vocab_size
                                                           : BACKEND_TOPK_MAX);
    int rc = ops->create(m, bp, out, e);
    if (!rc) (*out)->dear_round_trip = ops->dear_round_trip;
    return rc;
}

void backend_destroy(Backend **b) {
    if (b && *b) (*b)->ops->destroy(b);
}

const char *backend_name(const Backend *b) { return b->ops->name; }

const Eagle3LayerOps *backend_eagle3_layer(const BackendOps *ops) {
    return (ops ? ops : &cpu_backend_ops)->eagle3_layer;
}
const Model *backend_model(const Backend *b) { return b->model; }
BackendParams backend_params(const Backend *b) { return b->params; }
int backend_n_committed(const Backend *b) { return b->n_committed; }
int backend_n_pending(const Backend *b) { return b->n_pending; }
int backend_kv_capacity(const Backend *b) { return b->params.kv_capacity; }

void backend_set_stop(Backend *b, int (*stop)(void *), void *arg) {
    b->stop = stop;
    b->stop_arg = arg;
}

int backend_stopped(const Backend *b, RsErr *e) {
    if (!b->stop || !b->stop(b->stop_arg)) return RS_OK;
    return rs_err(e, RS_ESTOPPED, "forward stopped: the caller no longer wants it");
}

int backend_forward(Backend *b, const int *tokens, const int *pos, int n, const uint8_t *mask,
                    const int *out_rows, int n_out, float *logits, RsErr *e) {
    int rc = backend_stopped(b, e);
    if (!rc) rc = b->ops->forward(b, tokens, pos, n, mask, out_rows, n_out, logits, e);
    if (rc == RS_OK) {
        b->n_forwards++;
        b->n_tokens += (uint64_t)n;
        b->n_kept = n_out;
        if (logits) b->n_d2h_full_rows += (uint64_t)n_out;
    }
    return rc;
}

int backend_n_kept(const Backend *b) { return b->n_kept; }

int backend_rows_copy(Backend *b, const int *rows, int n, float *logits, RsErr *e) {
    RS_ASSERT(n <= 0 || (rows && logits));
    if (n < 0) return rs_err(e, RS_EINVAL, "rows_copy of %d rows", n);
    for (int i = 0; i < n; i++)
        if (rows[i] < 0 || rows[i] >= b->n_kept)
            return rs_err(e, RS_EINVAL, "rows_copy: rows[%d] = %d outside the %d kept rows", i,
                          rows[i], b->n_kept);
    if (n == 0) return RS_OK;
    int rc = b->ops->rows_copy(b, rows, n, logits, e);
    if (rc == RS_OK) b->n_d2h_full_rows += (uint64_t)n;
    return rc;
}

int backend_check_keep(int np, const int *keep, int n_keep, uint8_t *seen, int *identity,
                       RsErr *e) {
    RS_ASSERT(keep || n_keep == 0);
    if (n_keep < 0 || n_keep > np)
        return rs_err(e, RS_EINVAL, "kv_commit of %d entries with %d pending", n_keep, np);
    memset(seen, 0, (size_t)np);
    *identity = 1;
    for (int i = 0; i < n_keep; i++) {
        if (keep[i] < 0 || keep[i] >= np)
            return rs_err(e, RS_EINVAL, "kv_commit keep[%d] = %d outside the %d pending entries",
                          i, keep[i], np);
        if (seen[keep[i]])
            return rs_err(e, RS_EINVAL, "kv_commit keeps pending entry %d twice", keep[i]);
        seen[keep[i]] = 1;
        *identity &= keep[i] == i;
    }
    return RS_OK;
}

int backend_check_commit(const Backend *b, const int *keep, int n_keep, uint8_t *seen,
                         int *identity, RsErr *e) {
    return backend_check_keep(b->n_pending, keep, n_keep, seen, identity, e);
}

int backend_kv_commit(Backend *b, const int *keep, int n_keep, RsErr *e) {
    int rc = b->ops->kv_commit(b, keep, n_keep, e);
    if (rc == RS_OK) b->feat_rows = n_keep; /* the op kept their features, when recording */
    return rc;
}

/* Fallback of a backend without rows_topk: one row at a time through the host. */
static int rows_topk_host(Backend *b, int k, int *ids, float *logq, float *lse, RsErr *e) {
    int V = b->model->cfg.vocab_size, rc = RS_OK;
    float *row = rs_xmalloc(sizeof(float) * (size_t)V);
    CpuTopkPart *parts = rs_xmalloc(sizeof(CpuTopkPart));
    for (int r = 0; r < b->n_kept && !rc; r++) {
        rc = backend_rows_copy(b, &r, 1, row, e);
        if (!rc)
            cpu_topk(NULL, row, 1, V, k, ids + (size_t)r * k, logq + (size_t)r * k, lse + r,
                     parts);
    }
    free(parts);
    free(row);
    return rc;
}

int backend_rows_topk(Backend *b, int k, int *ids, float *logq, float *lse, RsErr *e) {
    int V = b->model->cfg.vocab_size;
    if (k < 1 || k > BACKEND_TOPK_MAX || k > V)
        return rs_err(e, RS_EINVAL, "rows_topk: k = %d outside [1, %d]", k,
                      V < BACKEND_TOPK_MAX ? V : BACKEND_TOPK_MAX);
    if (b->n_kept == 0) return RS_OK;
    RS_ASSERT(ids && logq && lse);
    if (!b->ops->rows_topk) return rows_topk_host(b, k, ids, logq, lse, e);
    return b->ops->rows_topk(b, k, ids, logq, lse, e);
}

void backend_kv_reset(Backend *b) {
    b->ops->kv_reset(b);
    b->n_kept = 0;
    b->feat_rows = 0;
}

int backend_kv_truncate(Backend *b, int n_committed, RsErr *e) {
    if (!b->ops->kv_truncate)
        return rs_err(e, RS_EUNSUPPORTED, "the %s backend cannot truncate its KV cache",
                      b->ops->name);
    if (n_committed < 0 || n_committed > b->n_committed)
        return rs_err(e, RS_EINVAL, "kv_truncate to %d entries: %d are committed", n_committed,
                      b->n_committed);
    b->ops->kv_truncate(b, n_committed);
    b->n_kept = 0;
    b->feat_rows = 0;
    return RS_OK;
}

int backend_kv_commit_stay(Backend *b, const int *keep, int n_keep, const int *stay, int n_stay,
                           RsErr *e) {
    if (!b->ops->kv_commit_stay || b->feat_n)
        return rs_err(e, RS_EUNSUPPORTED, "the %s backend cannot keep entries pending across a "
                      "commit%s", b->ops->name, b->feat_n ? " while it records features" : "");
    int rc = b->ops->kv_commit_stay(b, keep, n_keep, stay, n_stay, e);
    if (rc == RS_OK) b->n_kept = b->feat_rows = 0;
    return rc;
}

BackendStats backend_stats(const Backend *b) {
    BackendStats st = {.forwards = b->n_forwards, .tokens = b->n_tokens,
                       .d2h_full_rows = b->n_d2h_full_rows, .rows_stats_calls = b->n_rows_stats};
    if (b->ops->stats) b->ops->stats(b, &st);
    return st;
}

int backend_batch_queries(const Backend *b) {
    int sw = b->params.sw.rows_batched;
    return sw ? sw > 0 : b->dear_round_trip;
}

void *backend_host_alloc(Backend *b, size_t bytes) {
    return b->ops->host_alloc ? b->ops->host_alloc(b, bytes) : rs_xmalloc(bytes);
}

void backend_host_free(Backend *b, void *p) {
    if (!p) return;
    if (b->ops->host_free) b->ops->host_free(b, p);
    else free(p);
}

/* ---- EAGLE-3 features ---- */

int backend_set_feature_layers(Backend *b, const int *layers, int n, RsErr *e) {
    int nl = b->model->cfg.n_layers;
    if (n < 0 || n > BACKEND_MAX_FEATURE_LAYERS)
        return rs_err(e, RS_EINVAL, "%d feature layers: at most %d", n, BACKEND_MAX_FEATURE_LAYERS);
    if (n > 0 && !b->ops->set_features)
        return rs_err(e, RS_EUNSUPPORTED, "the %s backend cannot record feature layers",
                      b->ops->name);
    if (b->n_pending)
        return rs_err(e, RS_EINVAL, "feature layers changed with %d entries pending",
                      b->n_pending);
    for (int i = 0; i < n; i++) {
        if (layers[i] < 0 || layers[i] > nl)
            return rs_err(e, RS_EINVAL, "feature layer %d outside [0, %d] (the target has %d "
                          "layers)", layers[i], nl, nl);
        if (i && layers[i] <= layers[i - 1])
            return rs_err(e, RS_EINVAL, "feature layers must ascend: %d after %d", layers[i],
                          layers[i - 1]);
    }
    if (n == b->feat_n && (!n || !memcmp(layers, b->feat_layers, sizeof(int) * (size_t)n)))
        return RS_OK;
    int old_n = b->feat_n, old[BACKEND_MAX_FEATURE_LAYERS];
    memcpy(old, b->feat_layers, sizeof old);
    b->feat_n = n;
    if (n) memcpy(b->feat_layers, layers, sizeof(int) * (size_t)n);
    b->feat_rows = 0;
    int rc = b->ops->set_features ? b->ops->set_features(b, e) : RS_OK;
    if (rc) { /* as before the call */
        b->feat_n = old_n;
        memcpy(b->feat_layers, old, sizeof old);
    }
    return rc;
}

int backend_n_feature_layers(const Backend *b) { return b->feat_n; }

int backend_feature_width(const Backend *b) { return b->feat_n * b->model->cfg.dim; }

int backend_feature_rows(const Backend *b) { return b->feat_n ? b->feat_rows : 0; }

/* f32 -> bf16, round to nearest even; NaN stays NaN (quiet). */
static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

void backend_read_features(Backend *b, BackendFeatType t, void *out) {
    size_t n = (size_t)backend_feature_rows(b) * backend_feature_width(b);
    if (!n) return;
    BackendFeatType have;
    const void *src = b->ops->read_features(b, &have);
    if (have == t) {
        memcpy(out, src, n * (t == BACKEND_FEAT_F32 ? 4 : 2));
    } else if (have == BACKEND_FEAT_F32) {
        for (size_t i = 0; i < n; i++) ((uint16_t *)out)[i] = f32_to_bf16(((const float *)src)[i]);
    } else {
        for (size_t i = 0; i < n; i++) ((float *)out)[i] = quant_bf16_to_f32(((const uint16_t *)src)[i]);
    }
}

/* ---- the verifier's row queries ---- */

static int check_rows(const Backend *b, const char *what, const int *rows, int n, RsErr *e) {
    if (n < 0) return rs_err(e, RS_EINVAL, "%s of %d rows", what, n);
    for (int i = 0; i < n; i++)
        if (rows[i] < 0 || rows[i] >= b->n_kept)
            return rs_err(e, RS_EINVAL, "%s: rows[%d] = %d outside the %d rows the last "
                          "forward kept", what, i, rows[i], b->n_kept);
    return RS_OK;
}

/* A row with an inf or NaN logit has no law to draw from: its maximum (NaN wins the row
 * reduction, +inf is the maximum, all -inf leaves max - max = NaN) or, sampling, its
 * log-sum-exp is not finite. Weights that overflow (a model file holding inf) end here,
 * as an error of this decode rather than an abort. */
static int rows_finite(const int *rows, int n, const Sampling *s, const RowStats *st,
                       RsErr *e) {
    int greedy = sampling_greedy(s);
    for (int i = 0; i < n; i++)
        if (!isfinite(st[i].max) || (!greedy && !isfinite(st[i].lse)))
            return rs_err(e, RS_EFORMAT, "non-finite logits in row %d (max %g): the model's "
                          "weights or activations overflow", rows[i], (double)st[i].max);
    return RS_OK;
}

int backend_rows_stats(Backend *b, const int *rows, int n, const Sampling *s, const double *u,
                       RowStats *out, RsErr *e) {
    int rc = check_rows(b, "rows_stats", rows, n, e);
    if (!rc) rc = sampling_check(s, e);
    if (rc) return rc;
    for (int i = 0; u && i < n; i++)
        if (!(u[i] < 1.0) || isnan(u[i]))
            return rs_err(e, RS_EINVAL, "rows_stats: u[%d] = %g outside [0, 1)", i, u[i]);
    if (n > 0) {
        b->ops->rows_stats(b, rows, n, s, u, out);
        b->n_rows_stats++;
    }
    return rows_finite(rows, n, s, out, e);
}

const float *backend_kept_row(const Backend *b, int row) {
    if (!b->ops->kept_row || row < 0 || row >= b->n_kept) return NULL;
    return b->ops->kept_row(b, row);
}

int backend_rows_gather(Backend *b, const int *rows, const int *ids, int n, float *out,
                        RsErr *e) {
    int rc = check_rows(b, "rows_gather", rows, n, e);
    if (rc) return rc;
    int vocab = b->model->cfg.vocab_size;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return rs_err(e, RS_EINVAL, "rows_gather: ids[%d] = %d outside vocabulary [0, %d)",
                          i, ids[i], vocab);
    if (n > 0) b->ops->rows_gather(b, rows, ids, n, out);
    return RS_OK;
}

/* ---- sequences ---- */

static int max_seqs(const Backend *b) {
    return b->params.max_seqs > 1 && b->ops->forward_batch ? b->params.max_seqs : 1;
}

static int seq_valid(const Backend *b, int seq) {
    if (seq == 0) return 1;
    if (seq < 0 || seq >= max_seqs(b)) return 0;
    int nc = -1, np;
    b->ops->seq_counts(b, seq, &nc, &np);
    return nc >= 0;
}

int backend_kv_blocks_for(int entries) {
    return (entries + BACKEND_KV_BLOCK - 1) / BACKEND_KV_BLOCK;
}

int backend_seq_open(Backend *b, int *seq, RsErr *e) {
    if (!b->ops->seq_open)
        return rs_err(e, RS_EUNSUPPORTED, "the %s backend runs one sequence at a time",
                      b->ops->name);
    return b->ops->seq_open(b, seq, e);
}

void backend_seq_close(Backend *b, int seq) {
    if (seq == 0 && !b->ops->seq_close) {
        backend_kv_reset(b);
        return;
    }
    RS_ASSERT(seq_valid(b, seq));
    b->ops->seq_close(b, seq);
}

int backend_seq_n_committed(const Backend *b, int seq) {
    if (seq == 0) return b->n_committed;
    RS_ASSERT(seq_valid(b, seq));
    int nc, np;
    b->ops->seq_counts(b, seq, &nc, &np);
    return nc;
}

int backend_seq_n_pending(const Backend *b, int seq) {
    if (seq == 0) return b->n_pending;
    RS_ASSERT(seq_valid(b, seq));
    int nc, np;
    b->ops->seq_counts(b, seq, &nc, &np);
    return np;
}

static int check_batch(const Backend *b, const BackendSeg *segs, int n_segs, const int *out_rows,
                       int n_out, RsErr *e) {
    int total = 0;
    if (n_segs < 1) return rs_err(e, RS_EINVAL, "forward_batch of %d segments", n_segs);
    for (int i = 0; i < n_segs; i++) {
        const BackendSeg *g = &segs[i];
        if (!seq_valid(b, g->seq))
            return rs_err(e, RS_EINVAL, "segment %d: sequence %d is not open", i, g->seq);
        for (int k = 0; k < i; k++)
            if (segs[k].seq == g->seq)
                return rs_err(e, RS_EINVAL, "sequence %d appears twice in one batch", g->seq);
        int rc = backend_check_segment(b, backend_seq_n_committed(b, g->seq),
                                       backend_seq_n_pending(b, g->seq), g->tokens, g->pos, g->n,
                                       g->mask, e);
        if (rc) return rc;
        total += g->n;
    }
    if (total > b->params.max_batch)
        return rs_err(e, RS_EINVAL, "batch of %d rows exceeds max_batch %d", total,
                      b->params.max_batch);
    return check_out_rows(out_rows, n_out, total, e);
}

int backend_forward_batch(Backend *b, const BackendSeg *segs, int n_segs, const int *out_rows,
                          int n_out, float *logits, RsErr *e) {
    if (!b->ops->forward_batch) {
        if (n_segs != 1 || segs[0].seq != 0)
            return rs_err(e, RS_EUNSUPPORTED, "the %s backend runs one sequence at a time",
                          b->ops->name);
        return backend_forward(b, segs[0].tokens, segs[0].pos, segs[0].n, segs[0].mask,
                               out_rows, n_out, logits, e);
    }
    int rc = check_batch(b, segs, n_segs, out_rows, n_out, e);
    if (!rc) rc = b->ops->forward_batch(b, segs, n_segs, out_rows, n_out, logits, e);
    if (rc == RS_OK) {
        b->n_forwards++;
        for (int i = 0; i < n_segs; i++) b->n_tokens += (uint64_t)segs[i].n;
        b->n_kept = n_out;
        if (logits) b->n_d2h_full_rows += (uint64_t)n_out;
    }
    return rc;
}

int backend_seq_commit(Backend *b, int seq, const int *keep, int n_keep, RsErr *e) {
    if (seq == 0) return backend_kv_commit(b, keep, n_keep, e);
    RS_ASSERT(seq_valid(b, seq));
    return b->ops->seq_commit(b, seq, keep, n_keep, e);
}

int backend_seq_fork(Backend *b, int src, int dst, int n, RsErr *e) {
    RS_ASSERT(src != dst && (src == 0 || seq_valid(b, src)) && (dst == 0 || seq_valid(b, dst)));
    RS_ASSERT(n >= 0 && n <= backend_seq_n_committed(b, src));
    RS_ASSERT(backend_seq_n_committed(b, dst) == 0 && backend_seq_n_pending(b, dst) == 0);
    if (!b->ops->seq_fork)
        return rs_err(e, RS_EUNSUPPORTED, "the %s backend cannot fork a sequence", b->ops->name);
    return b->ops->seq_fork(b, src, dst, n, e);
}

/* ---- the prefix cache ---- */

uint64_t backend_prefix_hash(uint64_t prev, const int *tokens) {
    uint64_t h = prev ^ 0x9e3779b97f4a7c15u; /* FNV-1a over the block, seeded by the chain */
    for (int i = 0; i < BACKEND_KV_BLOCK; i++) {
        uint32_t t = (uint32_t)tokens[i];
        for (int k = 0; k < 4; k++) h = (h ^ ((t >> (8 * k)) & 0xffu)) * 0x100000001b3u;
    }
    return h;
}

int backend_prefix_attach(Backend *b, int seq, const int *tokens, int n) {
    RS_ASSERT(n >= 0 && (n == 0 || tokens));
    RS_ASSERT(backend_seq_n_committed(b, seq) == 0 && backend_seq_n_pending(b, seq) == 0);
    if (n > b->params.kv_capacity) n = b->params.kv_capacity;
    return b->ops->prefix_attach ? b->ops->prefix_attach(b, seq, tokens, n) : 0;
}

void backend_prefix_publish(Backend *b, int seq, const int *tokens, int n) {
    RS_ASSERT(n >= 0 && n <= backend_seq_n_committed(b, seq) && (n == 0 || tokens));
    if (b->ops->prefix_publish) b->ops->prefix_publish(b, seq, tokens, n);
}

BackendKvUsage backend_kv_usage(const Backend *b) {
    BackendKvUsage u = {.block_size = BACKEND_KV_BLOCK,
                        .blocks_total = backend_kv_blocks_for(b->params.kv_capacity),
                        .seqs_open = 1};
    if (b->ops->kv_usage) b->ops->kv_usage(b, &u);
    else u.blocks_used = backend_kv_blocks_for(b->n_committed + b->n_pending);
    return u;
}
