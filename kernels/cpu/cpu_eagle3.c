/* The CPU implementation of kernels/eagle3_layer.h: an EAGLE-3 head's decoder layer, its
 * products against the weights in their stored type through the CPU backend's kernel
 * family (BackendParams.cpu_kernels as there; "ref" is f32 throughout) split by output rows over
 * a thread pool of its own, attention with the family's kernel over (row, head) items on
 * the same pool, the rest with the backend's reference operations
 * (kernels/cpu/cpu_ops.h) so the head's arithmetic is the target's; written after SGLang
 * llama_eagle3.py LlamaDecoderLayer.forward and EAGLE cnets.py
 * LlamaDecoderLayeremb.forward:
 *   h   = fc(features)  or the parent's output state
 *   x   = cat(input_layernorm(embed(token)), hidden_norm(h))      (2*dim)
 *   h  += o_proj(attention(rope(q_proj x), rope(k_proj x), v_proj x))
 *   h  += mlp(post_attention_layernorm(h))                        -> the output state
 *   logits = lm_head(norm(h))                                     (draft vocabulary)
 * A published head's 16-bit weights stay 16-bit (a Llama-3.1-8B head streams 0.85 GB a
 * pass instead of 1.7), and each output row's value does not depend on the thread count.
 * Buffers are allocated once. */
#include "kernels/eagle3_layer.h"
#include "cpu_ops.h"
#include "cpu_qmatmul.h"
#include "threadpool.h"
#include <stdlib.h>
#include <string.h>

struct Eagle3Layer {
    const Eagle3Head *h;
    const QkFamily *fam;
    ThreadPool *pool;
    ModelDims dims;
    int cap, max_batch, max_in;
    float *scratch;     // (threads, max_in) the generic path's dequantized rows
    float *kc, *vc;     // (cap, kvd) RoPE applied to keys
    float *hs;          // (max_batch, dim) state / residual stream
    float *x;           // (max_batch, 2*dim) attention input
    float *q, *att_out; // (max_batch, qd)
    float *xb;          // (max_batch, dim)
    float *hb, *hb2;    // (max_batch, hidden)
    float *att;         // (threads, QK_ATT_G * cap) attention scratch
    float *inv_freq;    // (hd/2)
    float *cs, *sn;     // (max_batch, hd/2)
    int *vis;           // (max_batch, cap) pending rows each new row sees
    int *n_vis;         // (max_batch)
};

static int imax(int a, int b) { return a > b ? a : b; }

/* The family and the pool; every matrix must take f32 activations in that family (the
 * loader gives F32, F16 and BF16 only). */
static int cpu_engine(Eagle3Layer *r, const BackendParams *bp, RsErr *e) {
    const Eagle3Head *h = r->h;
    r->fam = qk_family_pick(bp->cpu_kernels, e);
    if (!r->fam) return e ? e->code : RS_EINVAL;
    const QTensor *ms[EAGLE3_N_MATRICES];
    eagle3_head_matrices(h, ms);
    for (int i = 0; i < EAGLE3_N_MATRICES; i++) {
        RS_ASSERT(ms[i]->data);
        if (qk_wants_act(r->fam, ms[i]->type) != QK_ACT_F32)
            return rs_err(e, RS_EUNSUPPORTED, "EAGLE-3 head '%s': a matrix of ggml type %u "
                          "(F32, F16 or BF16 expected)", h->path, (unsigned)ms[i]->type);
        r->max_in = imax(r->max_in, ms[i]->cols);
    }
    int rc = threadpool_create(bp->threads > 0 ? bp->threads : 1, !bp->sw.cpu_unpinned, &r->pool, e);
    if (rc) return rc;
    r->scratch = rs_xmalloc(sizeof(float) * (size_t)threadpool_size(r->pool) * r->max_in);
    return RS_OK;
}

static void cpu_destroy(Eagle3Layer **pr);

static int cpu_create(const Eagle3Head *h, const BackendParams *bp, Eagle3Layer **out, RsErr *e) {
    *out = NULL;
    RS_ASSERT(h && bp);
    const Config *c = &h->cfg.c;
    Eagle3Layer *r = rs_xcalloc(1, sizeof *r);
    r->h = h;
    r->cap = bp->kv_capacity;
    r->max_batch = bp->max_batch;
    r->dims = model_dims(c);
    int rc = cpu_engine(r, bp, e);
    if (rc) {
        cpu_destroy(&r);
        return rc;
    }
    size_t B = (size_t)r->max_batch, half = (size_t)r->dims.hd / 2, cap = (size_t)r->cap;
    r->kc = rs_xmalloc(sizeof(float) * cap * r->dims.kvd);
    r->vc = rs_xmalloc(sizeof(float) * cap * r->dims.kvd);
    r->hs = rs_xmalloc(sizeof(float) * B * r->dims.dim);
    r->x = rs_xmalloc(sizeof(float) * B * 2 * r->dims.dim);
    r->q = rs_xmalloc(sizeof(float) * B * r->dims.qd);
    r->att_out = rs_xmalloc(sizeof(float) * B * r->dims.qd);
    r->xb = rs_xmalloc(sizeof(float) * B * r->dims.dim);
    r->hb = rs_xmalloc(sizeof(float) * B * r->dims.hidden);
    r->hb2 = rs_xmalloc(sizeof(float) * B * r->dims.hidden);
    r->att = rs_xmalloc(sizeof(float) * (size_t)threadpool_size(r->pool) * QK_ATT_G * cap);
    r->inv_freq = rs_xmalloc(sizeof(float) * half);
    r->cs = rs_xmalloc(sizeof(float) * B * half);
    r->sn = rs_xmalloc(sizeof(float) * B * half);
    r->vis = rs_xmalloc(sizeof(int) * B * cap);
    r->n_vis = rs_xmalloc(sizeof(int) * B);
    rope_inv_freq(c, r->inv_freq);
    *out = r;
    return RS_OK;
}

static void cpu_destroy(Eagle3Layer **pr) {
    if (!pr || !*pr) return;
    Eagle3Layer *r = *pr;
    float *bufs[] = {r->kc, r->vc, r->hs, r->x, r->q, r->att_out, r->xb, r->hb, r->hb2,
                     r->att, r->inv_freq, r->cs, r->sn};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(r->vis);
    free(r->n_vis);
    free(r->scratch);
    threadpool_destroy(&r->pool);
    free(r);
    *pr = NULL;
}

/* ---- products: rows of W split over the pool ---- */

#define MM_UNIT 16 /* output rows a chunk starts on a multiple of (whole register tiles) */

typedef struct {
    Eagle3Layer *r;
    const QTensor *w;
    QkActs x;
    float *y;
} MmJob;

static void mm_task(void *arg, int i, int n_chunks, int tid) {
    MmJob *j = arg;
    int units = (j->w->rows + MM_UNIT - 1) / MM_UNIT, lo, hi;
    threadpool_share(units, i, n_chunks, &lo, &hi);
    lo *= MM_UNIT;
    hi = hi * MM_UNIT < j->w->rows ? hi * MM_UNIT : j->w->rows;
    if (lo < hi)
        qk_matmul_rows(j->r->fam, j->w, &j->x, j->y, j->w->rows, lo, hi,
                       j->r->scratch + (size_t)tid * j->r->max_in);
}

/* y (n, w->rows) = x (n, w->cols) @ w^T. A row's value is the kernel's for that row
 * whatever chunk computes it (cpu_qmatmul.h), so the thread count changes no bit. */
static void matmul(Eagle3Layer *r, float *y, const float *x, const QTensor *w, int n) {
    MmJob j = {r, w, {.f32 = x, .n = n, .in = w->cols}, y};
    int nth = threadpool_size(r->pool), units = (w->rows + MM_UNIT - 1) / MM_UNIT;
    int chunks = nth == 1 ? 1 : 4 * nth;
    threadpool_run_chunks(r->pool, mm_task, &j, chunks < units ? chunks : units);
}

/* ---- attention: (row, head) items over the pool ---- */

typedef struct {
    Eagle3Layer *r;
    int n, n_committed;
} AttJob;

/* The chunk's (row, head) items as runs of heads that share a KV group (qk_attention reads
 * the group's cache rows once for the run); a head's output does not depend on its run. */
static void att_task(void *arg, int chunk, int n_chunks, int tid) {
    AttJob *j = arg;
    Eagle3Layer *r = j->r;
    const ModelDims *d = &r->dims;
    int nh = d->nh, group = nh / d->nkv, lo, hi;
    threadpool_share(j->n * nh, chunk, n_chunks, &lo, &hi);
    float *att = r->att + (size_t)tid * QK_ATT_G * r->cap;
    for (int i = lo, g; i < hi; i += g) {
        int t = i / nh, h = i % nh, end = (h / group + 1) * group;
        g = (end < nh ? end : nh) - h;
        g = g < hi - i ? g : hi - i;
        g = g < QK_ATT_G ? g : QK_ATT_G;
        size_t at = (size_t)t * d->qd + (size_t)h * d->hd, off = (size_t)(h / group) * d->hd;
        qk_attention(r->fam, 0, r->att_out + at, r->q + at, r->kc + off, r->vc + off, d->kvd,
                     j->n_committed, r->vis + (size_t)t * r->cap, j->n_committed + r->n_vis[t],
                     d->hd, g, att);
    }
}

/* Each row over the committed entries and the pending ones its mask row allows, with the
 * family's attention kernel (the reference loops for ref and scalar). */
static void attention(Eagle3Layer *r, int n, int n_committed) {
    AttJob j = {r, n, n_committed};
    int items = n * r->dims.nh, nth = threadpool_size(r->pool);
    int chunks = nth == 1 ? 1 : items < 4 * nth ? items : 4 * nth;
    threadpool_run_chunks(r->pool, att_task, &j, chunks);
}

/* q for the batch and k/v into cache slots [start, start + n), RoPE'd at pos. */
static void qkv(Eagle3Layer *r, const float *emb, const int *pos, int n, int start) {
    const Eagle3Head *h = r->h;
    int D = r->dims.dim, hd = r->dims.hd, half = hd / 2, qd = r->dims.qd, kvd = r->dims.kvd;
    float eps = h->cfg.c.norm_eps;
    for (int t = 0; t < n; t++) {
        float *xt = r->x + (size_t)t * 2 * D;
        cpu_rmsnorm(xt, emb + (size_t)t * D, h->input_norm, D, eps);
        cpu_rmsnorm(xt + D, r->hs + (size_t)t * D, h->hidden_norm, D, eps);
    }
    cpu_rope_table(pos, r->inv_freq, n, half, r->cs, r->sn);
    float *knew = r->kc + (size_t)start * kvd, *vnew = r->vc + (size_t)start * kvd;
    matmul(r, r->q, r->x, &h->wq, n);
    matmul(r, knew, r->x, &h->wk, n);
    matmul(r, vnew, r->x, &h->wv, n);
    for (int t = 0; t < n; t++) {
        const float *cs = r->cs + (size_t)t * half, *sn = r->sn + (size_t)t * half;
        for (int k = 0; k < qd; k += hd) cpu_rope(r->q + (size_t)t * qd + k, cs, sn, half);
        for (int k = 0; k < kvd; k += hd) cpu_rope(knew + (size_t)t * kvd + k, cs, sn, half);
    }
}

/* The layer over the batch (states in r->hs): keys/values after the pending rows, output
 * states left in r->hs. */
static void layer(Eagle3Layer *r, const Eagle3Batch *b) {
    const Eagle3Head *h = r->h;
    const Config *c = &h->cfg.c;
    int D = r->dims.dim, H = r->dims.hidden, n = b->n;
    cpu_attention_index(b->mask, n, b->n_pending, r->cap, r->vis, r->n_vis);
    qkv(r, b->emb, b->pos, n, b->n_committed + b->n_pending);
    attention(r, n, b->n_committed);
    matmul(r, r->xb, r->att_out, &h->wo, n);
    cpu_residual_add(r->hs, r->xb, (size_t)n * D); /* the residual is h itself, un-normed */
    for (int t = 0; t < n; t++)
        cpu_rmsnorm(r->xb + (size_t)t * D, r->hs + (size_t)t * D, h->post_norm, D, c->norm_eps);
    matmul(r, r->hb, r->xb, &h->w_gate, n);
    matmul(r, r->hb2, r->xb, &h->w_up, n);
    cpu_swiglu(r->hb, r->hb2, (size_t)n * H);
    matmul(r, r->xb, r->hb, &h->w_down, n);
    cpu_residual_add(r->hs, r->xb, (size_t)n * D);
}

static void cpu_run(Eagle3Layer *r, const Eagle3Batch *b) {
    const Eagle3Head *h = r->h;
    int D = r->dims.dim, n = b->n;
    if (b->fc) matmul(r, r->hs, b->in, &h->fc, n);
    else memcpy(r->hs, b->in, sizeof(float) * (size_t)n * D);
    layer(r, b);
    int m = n - b->out_from;
    if (m <= 0) return;
    const float *hs = r->hs + (size_t)b->out_from * D;
    memcpy(b->state_out, hs, sizeof(float) * (size_t)m * D);
    for (int t = 0; t < m; t++)
        cpu_rmsnorm(r->xb + (size_t)t * D, hs + (size_t)t * D, h->norm, D, h->cfg.c.norm_eps);
    matmul(r, b->logits_out, r->xb, &h->lm_head, m);
}

const Eagle3LayerOps cpu_eagle3_layer = {
    .name = "cpu",
    .create = cpu_create,
    .destroy = cpu_destroy,
    .run = cpu_run,
};
