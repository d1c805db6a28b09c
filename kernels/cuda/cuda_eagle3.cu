/* The CUDA implementation of kernels/eagle3_layer.h: an EAGLE-3 head's decoder layer on the
 * GPU with the CUDA backend's conventions (kernels/cuda/cuda_backend.cu): bf16 weights, GEMM
 * inputs and KV cache, f32 residual stream, norms and softmax, every projection one
 * cublasGemmEx (bf16 in, f32 accumulate), and the backend's kernels (cuda_kernels.h) for
 * the norms, RoPE, cache stores, attention and SwiGLU. The head's q/k/v take the 2*dim
 * concatenation [input_layernorm(embed), hidden_norm(h)]: instead of building it, each
 * half is normed into a buffer of its own and the projection runs as two GEMMs over the
 * matching column halves of W (the second accumulating), which is the same product.
 *
 * Runs eagerly (no graphs): a head pass is one layer, and its inputs (embedding rows and
 * states) come from the host each call. Outputs (states, logits) go back to the host, where
 * the runner grows the pool. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
extern "C" {
#include "kernels/backend.h" /* BACKEND_TOPK_MAX */
}
#include "cuda_kernels.h"
#include "cuda_topk.h"
#include "kernels/eagle3_layer.h"

struct Eagle3Layer {
    const Eagle3Head *h;
    ModelDims dims;
    int F, DV, cap, maxb, device, mask_words;
    float eps;
    cudaStream_t s;
    cublasHandle_t blas;
    void *blas_ws;
    rs_bf16 *fc;      // (dim, F)
    rs_bf16 *wqkv;    // (qkv_w, 2*dim): q rows, k rows, v rows
    rs_bf16 *wo;      // (dim, qd)
    rs_bf16 *wgu;     // (2*hidden, dim): gate rows then up rows
    rs_bf16 *wdown;   // (dim, hidden)
    rs_bf16 *lm;      // (DV, dim)
    float *in_norm, *hid_norm, *post_norm, *norm; // (dim)
    float *inv_freq;  // (hd/2)
    rs_bf16 *kc, *vc; // (cap, kvd)
    float *hs;        // (maxb, dim) state / residual stream
    float *emb;       // (maxb, dim) the batch's embedding rows
    float *feat;      // (maxb, F) f32 features
    rs_bf16 *featb;   // (maxb, F)
    rs_bf16 *xa, *xh, *xb; // (maxb, dim) normed GEMM inputs
    float *qkv;       // (maxb, qkv_w)
    rs_bf16 *att;     // (maxb, qd)
    float *gu;        // (maxb, 2*hidden)
    rs_bf16 *hb;      // (maxb, hidden)
    float *logits;    // (maxb, DV)
    int *top_ids;     // (maxb, BACKEND_TOPK_MAX) the topk op's results on the device
    float *top_logq;  // (maxb, BACKEND_TOPK_MAX)
    float *top_lse;   // (maxb)
    void *top_scratch; // (cuk_topk_scratch_bytes(maxb, DV)) zeroed once
    float *cos_t, *sin_t; // (maxb, hd/2)
    float *att_scratch;
    unsigned *att_cnt; // (cuk_attention_counters) split blocks done per attention tile
    CuMeta *d_meta;
    int *d_pos;       // (maxb)
    uint64_t *d_mask; // (maxb, mask_words)
    uint64_t *h_mask; // (maxb, mask_words)
    uint8_t *h_causal; // (maxb, cap) bytes of the default mask
};


static void e3_destroy(Eagle3Layer **pr) {
    if (!pr || !*pr) return;
    Eagle3Layer *r = *pr;
    cudaSetDevice(r->device);
    if (r->s) cudaStreamSynchronize(r->s);
    void *dev[] = {r->blas_ws, r->fc, r->wqkv, r->wo, r->wgu, r->wdown, r->lm, r->in_norm,
                   r->hid_norm, r->post_norm, r->norm, r->inv_freq, r->kc, r->vc, r->hs,
                   r->emb, r->feat, r->featb, r->xa, r->xh, r->xb, r->qkv, r->att, r->gu,
                   r->hb, r->logits, r->cos_t, r->sin_t, r->att_scratch, r->att_cnt, r->d_meta,
                   r->d_pos, r->d_mask, r->top_ids, r->top_logq, r->top_lse, r->top_scratch};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) DFREE(dev[i]);
    free(r->h_mask);
    free(r->h_causal);
    if (r->blas) cublasDestroy(r->blas);
    if (r->s) cudaStreamDestroy(r->s);
    free(r);
    *pr = NULL;
}

static int dalloc(void *pp, size_t bytes, const char *what, RsErr *e) {
    void **p = (void **)pp;
    cudaError_t rc = cudaMalloc(p, bytes ? bytes : 16);
    if (rc == cudaSuccess) return RS_OK;
    *p = NULL;
    cudaGetLastError();
    return rs_err(e, RS_ENOMEM, "cudaMalloc of %zu bytes for the EAGLE-3 head's %s failed: %s",
                  bytes, what, cudaGetErrorString(rc));
}

#define DA(ptr, bytes, what) if (!rc) rc = dalloc(&(ptr), (bytes), (what), e)

static int alloc_all(Eagle3Layer *r, RsErr *e) {
    const ModelDims *d = &r->dims;
    size_t D = d->dim, B = r->maxb, cap = r->cap, half = d->hd / 2;
    int rc = RS_OK;
    DA(r->blas_ws, (size_t)32 << 20, "cuBLAS workspace");
    DA(r->fc, D * r->F * 2, "fc");
    DA(r->wqkv, (size_t)d->qkv_w * 2 * D * 2, "q|k|v_proj");
    DA(r->wo, D * d->qd * 2, "o_proj");
    DA(r->wgu, 2 * (size_t)d->hidden * D * 2, "gate|up_proj");
    DA(r->wdown, D * d->hidden * 2, "down_proj");
    DA(r->lm, (size_t)r->DV * D * 2, "lm_head");
    DA(r->in_norm, D * 4, "input_layernorm");
    DA(r->hid_norm, D * 4, "hidden_norm");
    DA(r->post_norm, D * 4, "post_attention_layernorm");
    DA(r->norm, D * 4, "norm");
    DA(r->inv_freq, half * 4, "inv_freq");
    DA(r->kc, cap * d->kvd * 2, "key cache");
    DA(r->vc, cap * d->kvd * 2, "value cache");
    DA(r->hs, B * D * 4, "states");
    DA(r->emb, B * D * 4, "embedding rows");
    DA(r->feat, B * r->F * 4, "features");
    DA(r->featb, B * r->F * 2, "features (bf16)");
    DA(r->xa, B * D * 2, "normed embeddings");
    DA(r->xh, B * D * 2, "normed states");
    DA(r->xb, B * D * 2, "normed residual");
    DA(r->qkv, B * d->qkv_w * 4, "q|k|v");
    DA(r->att, B * d->qd * 2, "attention output");
    DA(r->gu, B * 2 * d->hidden * 4, "gate|up");
    DA(r->hb, B * d->hidden * 2, "mlp hidden");
    DA(r->logits, B * r->DV * 4, "logits");
    DA(r->top_ids, B * BACKEND_TOPK_MAX * 4, "top-k ids");
    DA(r->top_logq, B * BACKEND_TOPK_MAX * 4, "top-k log q");
    DA(r->top_lse, B * 4, "log-sum-exp");
    DA(r->top_scratch, cuk_topk_scratch_bytes(r->maxb, r->DV), "top-k chunk partials");
    if (!rc) CUDA_CHECK(cudaMemset(r->top_scratch, 0, cuk_topk_scratch_bytes(r->maxb, r->DV)));
    DA(r->cos_t, B * half * 4, "cos");
    DA(r->sin_t, B * half * 4, "sin");
    DA(r->att_scratch, cuk_attention_scratch_floats(r->maxb, d->nh, d->hd, r->cap) * 4,
       "attention partials");
    DA(r->att_cnt, cuk_attention_counters(r->maxb, d->nh) * 4, "attention tile counters");
    if (!rc) /* the tile counters start at zero; every attention launch leaves them so */
        CUDA_CHECK(cudaMemset(r->att_cnt, 0, cuk_attention_counters(r->maxb, d->nh) * 4));
    DA(r->d_meta, sizeof(CuMeta), "meta");
    DA(r->d_pos, B * 4, "positions");
    DA(r->d_mask, B * r->mask_words * 8, "mask");
    return rc;
}
#undef DA

/* f32 host array (n) -> bf16 device array, through a bounded device staging buffer. */
/* A matrix in its stored type as bf16 at dst, rows dequantized on the host (host: stage_n
 * floats) and converted on the device, a staging buffer's worth at a time. */
static void put_bf16(Eagle3Layer *r, const QTensor *q, rs_bf16 *dst, float *stage, float *host,
                     size_t stage_n) {
    int per = (int)(stage_n / (size_t)q->cols);
    RS_ASSERT(per > 0 && q->data);
    for (int r0 = 0; r0 < q->rows; r0 += per) {
        int k = q->rows - r0 < per ? q->rows - r0 : per;
        size_t nf = (size_t)k * q->cols;
        qtensor_dequantize_rows(q, r0, k, host);
        CUDA_CHECK(cudaMemcpyAsync(stage, host, nf * 4, cudaMemcpyHostToDevice, r->s));
        cuk_f32_to_bf16(r->s, stage, dst + (size_t)r0 * q->cols, nf);
        CUDA_CHECK(cudaStreamSynchronize(r->s)); /* host is reused */
    }
}

static void put_f32(Eagle3Layer *r, const float *src, size_t n, float *dst) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n * 4, cudaMemcpyHostToDevice, r->s));
}

/* The head's weights as the backend keeps a layer's (q|k|v and gate|up fused). */
static int upload(Eagle3Layer *r, RsErr *e) {
    const Eagle3Head *h = r->h;
    size_t D = r->dims.dim, stage_n = (size_t)4 << 20;
    float *stage = NULL;
    int rc = dalloc(&stage, stage_n * 4, "weight upload staging", e);
    if (rc) return rc;
    size_t D2 = 2 * D;
    float *host = (float *)rs_xmalloc(stage_n * 4);
    put_bf16(r, &h->fc, r->fc, stage, host, stage_n);
    put_bf16(r, &h->wq, r->wqkv, stage, host, stage_n);
    put_bf16(r, &h->wk, r->wqkv + (size_t)r->dims.qd * D2, stage, host, stage_n);
    put_bf16(r, &h->wv, r->wqkv + (size_t)(r->dims.qd + r->dims.kvd) * D2, stage, host, stage_n);
    put_bf16(r, &h->wo, r->wo, stage, host, stage_n);
    put_bf16(r, &h->w_gate, r->wgu, stage, host, stage_n);
    put_bf16(r, &h->w_up, r->wgu + (size_t)r->dims.hidden * D, stage, host, stage_n);
    put_bf16(r, &h->w_down, r->wdown, stage, host, stage_n);
    put_bf16(r, &h->lm_head, r->lm, stage, host, stage_n);
    free(host);
    put_f32(r, h->input_norm, D, r->in_norm);
    put_f32(r, h->hidden_norm, D, r->hid_norm);
    put_f32(r, h->post_norm, D, r->post_norm);
    put_f32(r, h->norm, D, r->norm);
    float *inv = (float *)rs_xmalloc(sizeof(float) * (size_t)(r->dims.hd / 2));
    cuk_rope_inv_freq(&h->cfg.c, inv);
    put_f32(r, inv, (size_t)r->dims.hd / 2, r->inv_freq);
    /* defined cache contents: a masked-out slot is never NaN from stale memory */
    CUDA_CHECK(cudaMemsetAsync(r->kc, 0, (size_t)r->cap * r->dims.kvd * 2, r->s));
    CUDA_CHECK(cudaMemsetAsync(r->vc, 0, (size_t)r->cap * r->dims.kvd * 2, r->s));
    CUDA_CHECK(cudaStreamSynchronize(r->s));
    free(inv);
    DFREE(stage);
    return RS_OK;
}

/* Refuses what the backend's kernels cannot run, and a missing device, before allocating. */
static int check_device(const Config *c, int device, RsErr *e) {
    if (c->head_dim > 256 || c->head_dim % 8 || c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads)
        return rs_err(e, RS_EUNSUPPORTED, "EAGLE-3 head on CUDA: head_dim %d must be a multiple "
                      "of 8 up to 256 and n_heads %d a multiple of n_kv_heads %d", c->head_dim,
                      c->n_heads, c->n_kv_heads);
    int ndev = 0;
    cudaError_t crc = cudaGetDeviceCount(&ndev);
    if (crc != cudaSuccess || ndev == 0) {
        cudaGetLastError();
        return rs_err(e, RS_EUNSUPPORTED, "no CUDA device for the EAGLE-3 head (%s)",
                      crc != cudaSuccess ? cudaGetErrorString(crc) : "device count 0");
    }
    if (device < 0 || device >= ndev)
        return rs_err(e, RS_EINVAL, "CUDA device %d does not exist (%d device%s)", device, ndev,
                      ndev == 1 ? "" : "s");
    CUDA_CHECK(cudaSetDevice(device));
    return RS_OK;
}

static Eagle3Layer *rows_new(const Eagle3Head *h, int cap, int maxb, int device) {
    const Config *c = &h->cfg.c;
    Eagle3Layer *r = (Eagle3Layer *)rs_xcalloc(1, sizeof *r);
    r->h = h;
    r->dims = model_dims(c);
    r->F = EAGLE3_N_FEATURES * h->cfg.target_hidden;
    r->DV = h->cfg.draft_vocab;
    r->cap = cap;
    r->maxb = maxb;
    r->device = device;
    r->eps = c->norm_eps;
    r->mask_words = (cap + 63) / 64;
    r->h_mask = (uint64_t *)rs_xcalloc((size_t)maxb * r->mask_words, 8);
    r->h_causal = (uint8_t *)rs_xcalloc((size_t)maxb * cap, 1);
    CUDA_CHECK(cudaStreamCreateWithFlags(&r->s, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&r->blas));
    CUBLAS_CHECK(cublasSetStream(r->blas, r->s));
    return r;
}

static int e3_create(const Eagle3Head *h, const BackendParams *bp, Eagle3Layer **out, RsErr *e) {
    *out = NULL;
    RS_ASSERT(h && bp && h->lm_head.data);
    int rc = check_device(&h->cfg.c, bp->device, e);
    if (rc) return rc;
    Eagle3Layer *r = rows_new(h, bp->kv_capacity, bp->max_batch, bp->device);
    rc = alloc_all(r, e);
    if (!rc) {
        CUBLAS_CHECK(cublasSetWorkspace(r->blas, r->blas_ws, (size_t)32 << 20));
        rc = upload(r, e);
    }
    if (rc) {
        e3_destroy(&r);
        return rc;
    }
    *out = r;
    return RS_OK;
}

/* Y (n, out) f32 (+= when beta = 1) = X (n, in) bf16 @ W^T, W (out, in) read with row
 * stride ldw (a column block of a wider matrix when ldw > in). Column-major as in
 * cuda_backend.cu's gemm(). */
static void gemm(Eagle3Layer *r, const rs_bf16 *W, int ldw, int out, int in, const rs_bf16 *X,
                 int n, float *Y, float beta) {
    const float alpha = 1.0f;
    CUBLAS_CHECK(cublasGemmEx(r->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &alpha, W,
                              CUDA_R_16BF, ldw, X, CUDA_R_16BF, in, &beta, Y, CUDA_R_32F, out,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    cuk_count_launches(1);
}

/* Positions, mask bits, meta, embedding rows and the state input onto the device. */
static void stage(Eagle3Layer *r, const Eagle3Batch *b) {
    int n = b->n, stride = b->n_pending + n;
    const uint8_t *mask = b->mask;
    if (!mask) { /* causal within the batch, every earlier pending row visible */
        for (int t = 0; t < n; t++)
            for (int j = 0; j < stride; j++)
                r->h_causal[(size_t)t * stride + j] = j < b->n_pending + t + 1;
        mask = r->h_causal;
    }
    cuk_pack_mask(mask, n, stride, r->h_mask);
    CuMeta meta = {n, b->n_committed + b->n_pending, b->n_committed, stride, NULL};
    size_t mbytes = (size_t)n * ((stride + 63) / 64) * 8, D = r->dims.dim;
    /* pageable sources: each copy completes before the call returns to the host */
    CUDA_CHECK(cudaMemcpyAsync(r->d_meta, &meta, sizeof meta, cudaMemcpyHostToDevice, r->s));
    CUDA_CHECK(cudaMemcpyAsync(r->d_pos, b->pos, (size_t)n * 4, cudaMemcpyHostToDevice, r->s));
    CUDA_CHECK(cudaMemcpyAsync(r->d_mask, r->h_mask, mbytes, cudaMemcpyHostToDevice, r->s));
    CUDA_CHECK(cudaMemcpyAsync(r->emb, b->emb, (size_t)n * D * 4, cudaMemcpyHostToDevice, r->s));
    if (b->fc) {
        CUDA_CHECK(cudaMemcpyAsync(r->feat, b->in, (size_t)n * r->F * 4, cudaMemcpyHostToDevice,
                                   r->s));
        cuk_f32_to_bf16(r->s, r->feat, r->featb, (size_t)n * r->F);
        gemm(r, r->fc, r->F, r->dims.dim, r->F, r->featb, n, r->hs, 0.0f);
    } else {
        CUDA_CHECK(cudaMemcpyAsync(r->hs, b->in, (size_t)n * D * 4, cudaMemcpyHostToDevice, r->s));
    }
}

/* The decoder layer over the staged rows; output states left in r->hs. */
static void layer(Eagle3Layer *r, int n) {
    const ModelDims *d = &r->dims;
    cudaStream_t s = r->s;
    int D = d->dim;
    cuk_rope_table(s, r->d_pos, r->inv_freq, n, d->hd / 2, r->cos_t, r->sin_t);
    cuk_rmsnorm(s, r->emb, NULL, r->in_norm, n, D, r->eps, NULL, r->xa);
    cuk_rmsnorm(s, r->hs, NULL, r->hid_norm, n, D, r->eps, NULL, r->xh);
    gemm(r, r->wqkv, 2 * D, d->qkv_w, D, r->xa, n, r->qkv, 0.0f);
    gemm(r, r->wqkv + D, 2 * D, d->qkv_w, D, r->xh, n, r->qkv, 1.0f);
    cuk_qkv_post(s, r->qkv, d->qkv_w, n, d->nh, d->nkv, d->hd, NULL, NULL, NULL, r->eps,
                 r->cos_t, r->sin_t, r->d_meta, r->kc, r->vc);
    cuk_attention(s, r->qkv, d->qkv_w, r->kc, r->vc, r->d_mask, r->d_meta, n, d->nh, d->nkv,
                  d->hd, r->cap, 0, r->att_scratch, r->att_cnt, r->att, NULL);
    gemm(r, r->wo, d->qd, D, d->qd, r->att, n, r->hs, 1.0f); /* the residual is h itself */
    cuk_rmsnorm(s, r->hs, NULL, r->post_norm, n, D, r->eps, NULL, r->xb);
    gemm(r, r->wgu, D, 2 * d->hidden, D, r->xb, n, r->gu, 0.0f);
    cuk_swiglu(s, r->gu, n, d->hidden, r->hb, NULL);
    gemm(r, r->wdown, d->hidden, D, d->hidden, r->hb, n, r->hs, 1.0f);
}

static void e3_run(Eagle3Layer *r, const Eagle3Batch *b) {
    CUDA_CHECK(cudaSetDevice(r->device));
    RS_ASSERT(b->n >= 1 && b->n <= r->maxb);
    stage(r, b);
    layer(r, b->n);
    int m = b->n - b->out_from, D = r->dims.dim;
    if (m > 0) {
        const float *hs = r->hs + (size_t)b->out_from * D;
        cuk_rmsnorm(r->s, hs, NULL, r->norm, m, D, r->eps, NULL, r->xb);
        gemm(r, r->lm, D, r->DV, D, r->xb, m, r->logits, 0.0f);
        CUDA_CHECK(cudaMemcpyAsync(b->state_out, hs, (size_t)m * D * 4, cudaMemcpyDeviceToHost,
                                   r->s));
        if (b->logits_out)
            CUDA_CHECK(cudaMemcpyAsync(b->logits_out, r->logits, (size_t)m * r->DV * 4,
                                       cudaMemcpyDeviceToHost, r->s));
    }
    CUDA_CHECK(cudaStreamSynchronize(r->s));
}

/* One block per row (kernels/cuda/cuda_topk.cu) over the logits the last run left on the
 * device; only (m, k) ids and log q cross. */
static void e3_topk(Eagle3Layer *r, int m, int k, int *ids, float *logq) {
    CUDA_CHECK(cudaSetDevice(r->device));
    RS_ASSERT(m >= 1 && m <= r->maxb && k >= 1 && k <= BACKEND_TOPK_MAX && k <= r->DV);
    cuk_topk(r->s, r->logits, m, r->DV, k, r->top_scratch, r->top_ids, r->top_logq, r->top_lse);
    CUDA_CHECK(cudaMemcpyAsync(ids, r->top_ids, (size_t)m * k * 4, cudaMemcpyDeviceToHost, r->s));
    CUDA_CHECK(cudaMemcpyAsync(logq, r->top_logq, (size_t)m * k * 4, cudaMemcpyDeviceToHost,
                               r->s));
    CUDA_CHECK(cudaStreamSynchronize(r->s));
}

extern "C" const Eagle3LayerOps cuda_eagle3_layer = {
    .name = "cuda",
    .create = e3_create,
    .destroy = e3_destroy,
    .run = e3_run,
    .topk = e3_topk,
};
