/* The CPU implementation of kernels/eagle3_rows.h: an EAGLE-3 head's decoder layer in f32,
 * built from the CPU backend's reference operations (kernels/cpu_ops.h) so the head's
 * arithmetic is the target's; written after SGLang llama_eagle3.py
 * LlamaDecoderLayer.forward and EAGLE cnets.py LlamaDecoderLayeremb.forward:
 *   h   = fc(features)  or the parent's output state
 *   x   = cat(input_layernorm(embed(token)), hidden_norm(h))      (2*dim)
 *   h  += o_proj(attention(rope(q_proj x), rope(k_proj x), v_proj x))
 *   h  += mlp(post_attention_layernorm(h))                        -> the output state
 *   logits = lm_head(norm(h))                                     (draft vocabulary)
 * Buffers are allocated once. */
#include "eagle3_rows.h"
#include "cpu_ops.h"
#include <string.h>

struct Eagle3Rows {
    const Eagle3Head *h;
    int cap, max_batch, dim, qd, kvd, hd, hidden;
    float *kc, *vc;     // (cap, kvd) RoPE applied to keys
    float *hs;          // (max_batch, dim) state / residual stream
    float *x;           // (max_batch, 2*dim) attention input
    float *q, *att_out; // (max_batch, qd)
    float *xb;          // (max_batch, dim)
    float *hb, *hb2;    // (max_batch, hidden)
    float *att;         // (2 * cap) attention scratch
    float *inv_freq;    // (hd/2)
    float *cs, *sn;     // (max_batch, hd/2)
    int *vis;           // (max_batch, cap) pending rows each new row sees
    int *n_vis;         // (max_batch)
};

static int cpu_create(const Eagle3Head *h, int kv_capacity, int max_batch, int device,
                      Eagle3Rows **out, RsErr *e) {
    *out = NULL;
    RS_ASSERT(h && h->arena);
    const Config *c = &h->cfg.c;
    Eagle3Rows *r = rs_xcalloc(1, sizeof *r);
    r->h = h;
    r->cap = kv_capacity;
    r->max_batch = max_batch;
    r->dim = c->dim;
    r->hd = c->head_dim;
    r->qd = c->n_heads * c->head_dim;
    r->kvd = c->n_kv_heads * c->head_dim;
    r->hidden = c->hidden_dim;
    size_t B = (size_t)max_batch, half = (size_t)r->hd / 2;
    r->kc = rs_xmalloc(sizeof(float) * (size_t)kv_capacity * r->kvd);
    r->vc = rs_xmalloc(sizeof(float) * (size_t)kv_capacity * r->kvd);
    r->hs = rs_xmalloc(sizeof(float) * B * r->dim);
    r->x = rs_xmalloc(sizeof(float) * B * 2 * r->dim);
    r->q = rs_xmalloc(sizeof(float) * B * r->qd);
    r->att_out = rs_xmalloc(sizeof(float) * B * r->qd);
    r->xb = rs_xmalloc(sizeof(float) * B * r->dim);
    r->hb = rs_xmalloc(sizeof(float) * B * r->hidden);
    r->hb2 = rs_xmalloc(sizeof(float) * B * r->hidden);
    r->att = rs_xmalloc(sizeof(float) * 2 * (size_t)kv_capacity);
    r->inv_freq = rs_xmalloc(sizeof(float) * half);
    r->cs = rs_xmalloc(sizeof(float) * B * half);
    r->sn = rs_xmalloc(sizeof(float) * B * half);
    r->vis = rs_xmalloc(sizeof(int) * B * (size_t)kv_capacity);
    r->n_vis = rs_xmalloc(sizeof(int) * B);
    rope_inv_freq(c, r->inv_freq);
    *out = r;
    return RS_OK;
}

static void cpu_destroy(Eagle3Rows **pr) {
    if (!pr || !*pr) return;
    Eagle3Rows *r = *pr;
    float *bufs[] = {r->kc, r->vc, r->hs, r->x, r->q, r->att_out, r->xb, r->hb, r->hb2,
                     r->att, r->inv_freq, r->cs, r->sn};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(r->vis);
    free(r->n_vis);
    free(r);
    *pr = NULL;
}

/* q for the batch and k/v into cache slots [start, start + n), RoPE'd at pos. */
static void qkv(Eagle3Rows *r, const float *emb, const int *pos, int n, int start) {
    const Eagle3Head *h = r->h;
    int D = r->dim, half = r->hd / 2;
    float eps = h->cfg.c.norm_eps;
    for (int t = 0; t < n; t++) {
        float *xt = r->x + (size_t)t * 2 * D;
        cpu_rmsnorm(xt, emb + (size_t)t * D, h->input_norm, D, eps);
        cpu_rmsnorm(xt + D, r->hs + (size_t)t * D, h->hidden_norm, D, eps);
    }
    cpu_rope_table(pos, r->inv_freq, n, half, r->cs, r->sn);
    float *knew = r->kc + (size_t)start * r->kvd, *vnew = r->vc + (size_t)start * r->kvd;
    cpu_matmul(r->q, r->x, h->wq, n, 2 * D, r->qd, r->qd);
    cpu_matmul(knew, r->x, h->wk, n, 2 * D, r->kvd, r->kvd);
    cpu_matmul(vnew, r->x, h->wv, n, 2 * D, r->kvd, r->kvd);
    for (int t = 0; t < n; t++) {
        const float *cs = r->cs + (size_t)t * half, *sn = r->sn + (size_t)t * half;
        for (int k = 0; k < r->qd; k += r->hd) cpu_rope(r->q + (size_t)t * r->qd + k, cs, sn, half);
        for (int k = 0; k < r->kvd; k += r->hd) cpu_rope(knew + (size_t)t * r->kvd + k, cs, sn, half);
    }
}

/* The layer over the batch (states in r->hs): keys/values after the pending rows, output
 * states left in r->hs. */
static void layer(Eagle3Rows *r, const Eagle3Batch *b) {
    const Eagle3Head *h = r->h;
    const Config *c = &h->cfg.c;
    int D = r->dim, H = r->hidden, n = b->n;
    cpu_attention_index(b->mask, n, b->n_pending, r->cap, r->vis, r->n_vis);
    qkv(r, b->emb, b->pos, n, b->n_committed + b->n_pending);
    cpu_attention(r->att_out, r->q, r->kc, r->vc, b->n_committed, r->vis, r->n_vis, r->cap, n,
                  c->n_heads, c->n_kv_heads, r->hd, r->att);
    cpu_matmul(r->xb, r->att_out, h->wo, n, r->qd, D, D);
    cpu_residual_add(r->hs, r->xb, (size_t)n * D); /* the residual is h itself, un-normed */
    for (int t = 0; t < n; t++)
        cpu_rmsnorm(r->xb + (size_t)t * D, r->hs + (size_t)t * D, h->post_norm, D, c->norm_eps);
    cpu_matmul(r->hb, r->xb, h->w_gate, n, D, H, H);
    cpu_matmul(r->hb2, r->xb, h->w_up, n, D, H, H);
    cpu_swiglu(r->hb, r->hb2, (size_t)n * H);
    cpu_matmul(r->xb, r->hb, h->w_down, n, H, D, D);
    cpu_residual_add(r->hs, r->xb, (size_t)n * D);
}

static void cpu_run(Eagle3Rows *r, const Eagle3Batch *b) {
    const Eagle3Head *h = r->h;
    int D = r->dim, n = b->n, F = EAGLE3_N_FEATURES * h->cfg.target_hidden;
    if (b->fc) cpu_matmul(r->hs, b->in, h->fc, n, F, D, D);
    else memcpy(r->hs, b->in, sizeof(float) * (size_t)n * D);
    layer(r, b);
    int m = n - b->out_from;
    if (m <= 0) return;
    const float *hs = r->hs + (size_t)b->out_from * D;
    memcpy(b->state_out, hs, sizeof(float) * (size_t)m * D);
    for (int t = 0; t < m; t++)
        cpu_rmsnorm(r->xb + (size_t)t * D, hs + (size_t)t * D, h->norm, D, h->cfg.c.norm_eps);
    cpu_matmul(b->logits_out, r->xb, h->lm_head, m, D, h->cfg.draft_vocab, h->cfg.draft_vocab);
}

const Eagle3RowsOps cpu_eagle3_rows = {
    .name = "cpu",
    .create = cpu_create,
    .destroy = cpu_destroy,
    .run = cpu_run,
};
