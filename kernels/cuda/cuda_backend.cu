/* CUDA backend: the same forward as kernels/cpu/cpu_backend.c on an NVIDIA GPU. Weights are
 * bf16 (converted from the Model's f32 arrays at create), the KV cache is bf16
 * (layer, slot, kv_dim) and paged as the CPU backend's (kernels/backend.h: Sequences; the
 * block tables live on the host, cuda_pages.h, and each call stages the rows' slots, row
 * tiles and tables, CuPaged), activations and softmax are f32. q/k/v and gate/up are
 * concatenated into one matrix each, so a layer has 4 projections over the whole batch:
 * by default, in calls of several rows, q|k|v, o, gate|up and down are cublasGemmEx (bf16
 * in, f32 accumulate, f32 out), 9 launches a layer; a one-row call runs q|k|v as one fused
 * kernel with its RMSNorm and everything up to the KV store, o and down on the own GEMV and
 * gate|up on the own GEMM with the FFN RMSNorm and SwiGLU fused in, 5 launches a layer
 * (docs/DESIGN.md lists them), as the batch-invariant mode in every call.
 *
 * Every buffer is allocated in create(); forward() only enqueues work. Calls of at most
 * 65 tokens are padded to a bucket (1, 2, 4, 8, 16, 32, 48, 65) and, unless
 * BackendSwitches.cuda_eager (ROOTSPEC_CUDA_GRAPHS=0), replayed from a CUDA graph captured on the bucket's first use:
 * per-call scalars live in device memory (CuMeta), so the graph stays valid; it is
 * re-captured only when a buffer pointer or shape it baked in changes. Larger batches
 * (prefill chunks) run eagerly without padding. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/randmodel.h"
#include "cuda_backend.h"
#include "cuda_feat.h"
#include "cuda_kernels.h"
#include "cuda_pages.h"
#include "cuda_topk.h"
#include "cuda_rowstats.h"
extern "C" {
#include "kernels/backend_impl.h"
#include "kernels/eagle3_layer.h"
}

static const int kBuckets[] = {1, 2, 4, 8, 16, 32, 48, 65};
#define N_BUCKETS ((int)(sizeof kBuckets / sizeof kBuckets[0]))
#define GRAPH_MAX_TOKENS 65
#define N_GRAPH_KEYS 12

typedef struct {
    rs_bf16 *wqkv;    // (q_dim + 2*kv_dim, dim)
    rs_bf16 *wo;      // (dim, q_dim)
    rs_bf16 *wgu;     // (2*hidden, dim): gate rows then up rows
    rs_bf16 *wdown;   // (dim, hidden)
    float *attn_norm; // (dim)
    float *ffn_norm;  // (dim)
    float *bqkv;      // (q_dim + 2*kv_dim) or NULL
    float *q_norm;    // (head_dim) or NULL
    float *k_norm;    // (head_dim) or NULL
} CuLayer;

/* One batch of row queries (backend_rows_stats, backend_rows_gather), the same layout on
 * the device and in pinned host memory: arguments go up, results come down, never a row.
 * Longer query lists run in batches of these sizes. */
#define ROWQ_STATS 128
#define ROWQ_GATHER 1024
typedef struct {
    int rows[ROWQ_GATHER];
    int ids[ROWQ_GATHER];
    double u[ROWQ_STATS];
    RowStats st[ROWQ_STATS];
    float val[ROWQ_GATHER];
} RowQuery;

typedef struct {
    int valid;
    cudaGraphExec_t exec;
    const void *key[N_GRAPH_KEYS]; /* pointers and shape the capture baked in */
    int launches_layer, launches_pass; /* kernels enqueued while it was captured */
    int kernel_nodes, nodes;           /* counted in the captured graph itself */
} CuGraph;

typedef struct {
    Backend base; /* must stay first */
    ModelDims dims;
    int rows;
    float eps;
    cudaStream_t stream;
    cudaEvent_t in_copied; /* the last forward's input block has reached the device */
    cublasHandle_t blas;
    void *blas_ws;
    size_t blas_ws_bytes;
    CuLayer *layers;   // (nl) host array of device pointers
    rs_bf16 *emb;      // (vocab, dim)
    rs_bf16 *wcls;     // (vocab, dim); == emb when tied
    float *final_norm; // (dim)
    float *inv_freq;   // (hd/2)
    /* activations, `rows` = padded max batch */
    float *x;          // (rows, dim) residual stream
    rs_bf16 *xb;       // (rows, dim) normed, GEMM input
    float *qkv;        // (rows, qkv_w)
    rs_bf16 *att;      // (rows, q_dim)
    float *tmp;        // (rows, dim) sublayer output
    float *gu;         // (rows, 2*hidden)
    rs_bf16 *hb;       // (rows, hidden)
    float *logits;     // (rows, vocab); rows 0..n_kept-1 are the kept rows
    /* rows_topk results, packed for one copy: ids (n, k), logq (n, k), lse (n), sized
     * for rows x BACKEND_TOPK_MAX */
    void *d_red, *h_red;
    void *topk_scratch; // (cuk_topk_scratch_bytes(rows, vocab)) zeroed at create
    float *cos_t, *sin_t; // (rows, hd/2)
    rs_bf16 *kc, *vc;  // (nl, slots, kv_dim)
    CuPages pages;     // the sequences and their block tables
    int slots;         // cache slots per layer: pages.blocks_total * CUK_KV_BLOCK
    int max_tiles;     // attention row tiles the input block holds
    rs_bf16 *kv_scratch; // (nl, max_pending, kv_dim)
    /* Per-call inputs, packed so one host-to-device copy carries them all: meta, the paged
     * layout (CuPaged), tokens, positions, out rows and cache slots (rows each), the
     * attention row tiles (max_tiles), the block tables (blocks_total), then the ancestor
     * bitmask (max_batch, mask_words). d_in / h_in (pinned) hold the block; the other
     * pointers point into it. */
    void *d_in, *h_in;
    size_t in_tiles_off, in_tables_off, in_mask_off, in_bytes;
    int *d_tokens, *d_pos, *d_rows, *d_slot, *d_tables;
    uint64_t *d_mask;
    CuMeta *d_meta;
    CuPaged *d_paged;
    CuAttTile *d_tiles;
    int *h_tokens, *h_pos, *h_rows, *h_slot, *h_tables;
    uint64_t *h_mask;
    CuMeta *h_meta;
    CuPaged *h_paged;
    CuAttTile *h_tiles;
    int *d_keep, *h_keep; // (3 * max_pending) a commit's keep list, then the slots it moves
                          // from, then those it moves to
    float *att_scratch; // split-KV partials (cuk_attention_scratch_floats)
    unsigned *att_cnt;  // (cuk_attention_counters) split blocks done per attention tile
    unsigned *qkv_cnt;  // (cuk_qkv_counters) parts done per q|k|v head and row group
    int mask_words;    // (max_pending + 63) / 64
    int batch_inv;     // BackendParams.batch_invariant: own GEMMs, fixed attention splits
    int launches_layer, launches_pass; // of the last forward enqueued (eager or captured)
    int launches_pre;  // of those, the kernels before the first layer
    uint8_t *keep_seen; // (max_pending)
    int use_graphs;
    int fused_qkv;      // default mode: largest call (rows) that takes k_qkv_fused
    int own_gemv;       // default mode: one-row calls and one-row heads on cuk_gemv
    int graph_kernel_nodes, graph_nodes; // of the graph the last forward replayed; -1: eager
    CuGraph graphs[N_BUCKETS];
    uint64_t n_captures, n_graph_replays, n_eager_launches;
    size_t weight_bytes;
    /* EAGLE-3 features (backend.h), allocated when recording starts */
    rs_bf16 *feat_pend; // (max_pending, feat_n*dim) device, per pending entry
    rs_bf16 *feat_out;  // (max_pending, feat_n*dim) device, the last commit's kept rows
    rs_bf16 *h_feat;    // (max_pending, feat_n*dim) pinned host copy of feat_out
    RowQuery *d_rq, *h_rq; /* the row queries' arguments and results (device, pinned) */
    void *d_rowq_scratch;  // (cuk_rows_stats_scratch_bytes(ROWQ_STATS, vocab)) zeroed at create
} CudaBackend;

static int cuda_create(const Model *m, const BackendParams *bp, Backend **out, RsErr *e);
static void cuda_destroy(Backend **pb);
static int cuda_forward(Backend *bb, const int *tokens, const int *pos, int n,
                        const uint8_t *mask, const int *out_rows, int n_out, float *logits,
                        RsErr *e);
static int cuda_kv_commit(Backend *bb, const int *keep, int n_keep, RsErr *e);
static void cuda_kv_reset(Backend *bb);
static void *cuda_host_alloc(Backend *bb, size_t bytes);
static void cuda_host_free(Backend *bb, void *p);
static void cuda_stats(const Backend *bb, BackendStats *out);
static void cuda_rows_stats(Backend *bb, const int *rows, int n, const Sampling *smp,
                            const double *u, RowStats *out);
static void cuda_rows_gather(Backend *bb, const int *rows, const int *ids, int n, float *out);
static int cuda_rows_copy(Backend *bb, const int *rows, int n, float *logits, RsErr *e);
static int cuda_set_features(Backend *bb, RsErr *e);
static const void *cuda_read_features(Backend *bb, BackendFeatType *t);
static int cuda_rows_topk(Backend *bb, int k, int *ids, float *logq, float *lse, RsErr *e);
static void capture_all(CudaBackend *b);
static void stage_meta(CudaBackend *b, int n, int kv_base, int nc, int n_tiles);
static int cuda_seq_open(Backend *bb, int *seq, RsErr *e);
static void cuda_seq_close(Backend *bb, int seq);
static int cuda_forward_batch(Backend *bb, const BackendSeg *segs, int n_segs,
                              const int *out_rows, int n_out, float *logits, RsErr *e);
static int cuda_seq_commit(Backend *bb, int seq, const int *keep, int n_keep, RsErr *e);
static void cuda_seq_counts(const Backend *bb, int seq, int *nc, int *np);
static void cuda_kv_usage(const Backend *bb, BackendKvUsage *u);

/* C++ has no tentative definitions: the table comes first, after the prototypes. */
static const BackendOps cuda_ops = {
    .name = "cuda",
    .makes_random_weights = 1,
    .dear_round_trip = 1,
    .create = cuda_create,
    .destroy = cuda_destroy,
    .forward = cuda_forward,
    .kv_commit = cuda_kv_commit,
    .kv_reset = cuda_kv_reset,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .rows_copy = cuda_rows_copy,
    .rows_topk = cuda_rows_topk,
    .stats = cuda_stats,
    .set_features = cuda_set_features,
    .read_features = cuda_read_features,
    .rows_stats = cuda_rows_stats,
    .rows_gather = cuda_rows_gather,
    .eagle3_layer = &cuda_eagle3_layer,
    .seq_open = cuda_seq_open,
    .seq_close = cuda_seq_close,
    .forward_batch = cuda_forward_batch,
    .seq_commit = cuda_seq_commit,
    .seq_counts = cuda_seq_counts,
    .kv_usage = cuda_kv_usage,
};


/* ---- allocation helpers: failures become RS_ENOMEM, not aborts (a too-large model or
 * context is a user error) ---- */

static int dalloc(void *pp, size_t bytes, const char *what, RsErr *e) {
    void **p = (void **)pp;
    *p = NULL;
    if (!bytes) bytes = 16;
    cudaError_t rc = cudaMalloc(p, bytes);
    if (rc != cudaSuccess) {
        *p = NULL;
        cudaGetLastError(); /* clear the sticky-free error state */
        return rs_err(e, RS_ENOMEM, "cudaMalloc of %zu bytes for %s failed: %s", bytes, what,
                      cudaGetErrorString(rc));
    }
    return RS_OK;
}

static int halloc(void *pp, size_t bytes, const char *what, RsErr *e) {
    void **p = (void **)pp;
    *p = NULL;
    if (!bytes) bytes = 16;
    cudaError_t rc = cudaMallocHost(p, bytes);
    if (rc != cudaSuccess) {
        *p = NULL;
        cudaGetLastError();
        return rs_err(e, RS_ENOMEM, "cudaMallocHost of %zu bytes for %s failed: %s", bytes, what,
                      cudaGetErrorString(rc));
    }
    return RS_OK;
}

#define HFREE(p) do { if (p) cudaFreeHost(p); (p) = NULL; } while (0)

static void graphs_drop(CudaBackend *b) {
    for (int i = 0; i < N_BUCKETS; i++) {
        if (b->graphs[i].valid) CUDA_CHECK(cudaGraphExecDestroy(b->graphs[i].exec));
        b->graphs[i].valid = 0;
    }
}

static void cuda_destroy(Backend **pb) {
    if (!pb || !*pb) return;
    CudaBackend *b = (CudaBackend *)*pb;
    cudaSetDevice(b->base.params.device);
    if (b->stream) cudaStreamSynchronize(b->stream);
    graphs_drop(b);
    if (b->layers) {
        for (int l = 0; l < b->dims.nl; l++) {
            CuLayer *L = &b->layers[l];
            DFREE(L->wqkv); DFREE(L->wo); DFREE(L->wgu); DFREE(L->wdown);
            DFREE(L->attn_norm); DFREE(L->ffn_norm); DFREE(L->bqkv);
            DFREE(L->q_norm); DFREE(L->k_norm);
        }
        free(b->layers);
    }
    if (b->wcls != b->emb) DFREE(b->wcls);
    DFREE(b->emb);
    DFREE(b->final_norm); DFREE(b->inv_freq);
    DFREE(b->x); DFREE(b->xb); DFREE(b->qkv); DFREE(b->att); DFREE(b->tmp); DFREE(b->gu);
    DFREE(b->hb); DFREE(b->logits); DFREE(b->cos_t); DFREE(b->sin_t);
    DFREE(b->kc); DFREE(b->vc); DFREE(b->kv_scratch);
    DFREE(b->d_red); HFREE(b->h_red); DFREE(b->topk_scratch);
    DFREE(b->d_in); DFREE(b->d_keep); DFREE(b->att_scratch); DFREE(b->att_cnt); DFREE(b->qkv_cnt); DFREE(b->blas_ws);
    HFREE(b->h_in); HFREE(b->h_keep);
    DFREE(b->feat_pend); DFREE(b->feat_out); HFREE(b->h_feat);
    DFREE(b->d_rq); HFREE(b->h_rq); DFREE(b->d_rowq_scratch);
    cu_pages_free(&b->pages);
    free(b->keep_seen);
    if (b->blas) cublasDestroy(b->blas);
    if (b->in_copied) cudaEventDestroy(b->in_copied);
    if (b->stream) cudaStreamDestroy(b->stream);
    free(b);
    *pb = NULL;
}

static int bucket_of(int n) {
    for (int i = 0; i < N_BUCKETS; i++)
        if (n <= kBuckets[i]) return i;
    return -1;
}

/* Weight source: the Model's weights (matrices in their stored type, dequantized row by
 * row on the host, uploaded through a staging buffer and converted to bf16 on the device)
 * or the seeded device-side fill of common/randmodel.h. Both walk the tensors with
 * model_random_walk(), so a random model here equals the CPU backend's materialised copy
 * of it (up to the bf16 rounding). */
typedef struct {
    CudaBackend *b;
    const Model *m; /* NULL: random */
    float *stage;   // (stage_floats) device f32 staging
    float *host;    // (stage_floats) host f32 rows dequantized for one upload
    size_t stage_floats;
} WeightSrc;

/* Uploads logical rows of a stored matrix as bf16, a staging buffer's worth at a time. */
static void put_matrix(WeightSrc *ws, const QTensor *q, rs_bf16 *dst) {
    CudaBackend *b = ws->b;
    int per = (int)(ws->stage_floats / (size_t)q->cols);
    RS_ASSERT(per > 0);
    for (int r0 = 0; r0 < q->rows; r0 += per) {
        int k = q->rows - r0 < per ? q->rows - r0 : per;
        size_t nf = (size_t)k * q->cols;
        qtensor_dequantize_rows(q, r0, k, ws->host);
        CUDA_CHECK(cudaMemcpyAsync(ws->stage, ws->host, nf * sizeof(float),
                                   cudaMemcpyHostToDevice, b->stream));
        cuk_f32_to_bf16(b->stream, ws->stage, dst + (size_t)r0 * q->cols, nf);
        CUDA_CHECK(cudaStreamSynchronize(b->stream)); /* ws->host is reused */
    }
}

/* Device destination of a walk tensor; *bf16 says whether it is a bf16 matrix. */
static void *device_slot(CudaBackend *b, const RandTensor *t, int *bf16) {
    CuLayer *L = t->layer >= 0 ? &b->layers[t->layer] : NULL;
    size_t dim = b->dims.dim, qd = b->dims.qd, kvd = b->dims.kvd, hid = b->dims.hidden;
    *bf16 = 1;
    switch (t->kind) {
    case RT_WQ: return L->wqkv;
    case RT_WK: return L->wqkv + qd * dim;
    case RT_WV: return L->wqkv + (qd + kvd) * dim;
    case RT_WO: return L->wo;
    case RT_W_GATE: return L->wgu;
    case RT_W_UP: return L->wgu + hid * dim;
    case RT_W_DOWN: return L->wdown;
    case RT_TOK_EMBEDDINGS: return b->emb;
    case RT_WCLS: return b->wcls;
    default: break;
    }
    *bf16 = 0;
    switch (t->kind) {
    case RT_ATTN_NORM: return L->attn_norm;
    case RT_FFN_NORM: return L->ffn_norm;
    case RT_BQ: return L->bqkv;
    case RT_BK: return L->bqkv + qd;
    case RT_BV: return L->bqkv + qd + kvd;
    case RT_Q_NORM: return L->q_norm;
    case RT_K_NORM: return L->k_norm;
    case RT_FINAL_NORM: return b->final_norm;
    default: break;
    }
    RS_ASSERT(0 && "tensor kind without a device slot");
    return NULL;
}

static void put_tensor(void *u, const RandTensor *t) {
    WeightSrc *ws = (WeightSrc *)u;
    CudaBackend *b = ws->b;
    int bf16;
    void *dst = device_slot(b, t, &bf16);
    RS_ASSERT(dst);
    if (!ws->m) {
        if (bf16) cuk_fill_random_bf16(b->stream, (rs_bf16 *)dst, t->n, t->seed, t->scale, t->base);
        else cuk_fill_random_f32(b->stream, (float *)dst, t->n, t->seed, t->scale, t->base);
        return;
    }
    float **vec;
    QTensor *mat;
    model_weight_slot((Weights *)&ws->m->w, t, &vec, &mat);
    RS_ASSERT(bf16 ? mat && mat->data && (size_t)mat->rows * mat->cols == t->n : vec && *vec);
    if (!bf16) {
        CUDA_CHECK(cudaMemcpyAsync(dst, *vec, t->n * sizeof(float), cudaMemcpyHostToDevice,
                                   b->stream));
        return;
    }
    put_matrix(ws, mat, (rs_bf16 *)dst);
}

/* The packed per-call input block (d_in or h_in) as pointers into it. */
typedef struct {
    CuMeta *meta;
    CuPaged *paged;
    int *tokens, *pos, *rows, *slot, *tables;
    CuAttTile *tiles;
    uint64_t *mask;
} CuInputs;

#define IN_HEAD 64 /* bytes of CuMeta and CuPaged at the block's start */

static CuInputs in_pointers(void *base, const CudaBackend *b) {
    char *p = (char *)base;
    size_t R = (size_t)b->rows;
    CuInputs in;
    in.meta = (CuMeta *)p;
    in.paged = (CuPaged *)(p + 32);
    in.tokens = (int *)(p + IN_HEAD);
    in.pos = (int *)(p + IN_HEAD + R * 4);
    in.rows = (int *)(p + IN_HEAD + 2 * R * 4);
    in.slot = (int *)(p + IN_HEAD + 3 * R * 4);
    in.tiles = (CuAttTile *)(p + b->in_tiles_off);
    in.tables = (int *)(p + b->in_tables_off);
    in.mask = (uint64_t *)(p + b->in_mask_off);
    return in;
}

/* Refuses what the kernels cannot run and selects the device, before anything is allocated,
 * so that bad sizes or a missing GPU are a status, not an abort. */
static int check_and_select(const Config *c, const BackendParams *bp, RsErr *e) {
    if (bp->max_seqs < 0 || bp->max_seqs > 65536)
        return rs_err(e, RS_EINVAL, "max_seqs %d outside [0, 65536]", bp->max_seqs);
    if (bp->kv_capacity <= 0 || bp->max_batch <= 0 || bp->max_pending <= 0)
        return rs_err(e, RS_EINVAL,
                      "backend sizes must be positive (kv_capacity %d, max_batch %d, "
                      "max_pending %d)",
                      bp->kv_capacity, bp->max_batch, bp->max_pending);
    if (c->head_dim % 2 || c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads)
        return rs_err(e, RS_EUNSUPPORTED, "head_dim %d must be even and n_heads %d a multiple "
                      "of n_kv_heads %d", c->head_dim, c->n_heads, c->n_kv_heads);
    if (bp->batch_invariant && c->dim > CUK_NORM_GEMM_MAX_IN)
        return rs_err(e, RS_EUNSUPPORTED, "dim %d is too wide for the batch-invariant kernels "
                      "(at most %d)", c->dim, CUK_NORM_GEMM_MAX_IN);
    if (c->head_dim > 256 || c->head_dim % 8)
        return rs_err(e, RS_EUNSUPPORTED, "head_dim %d is not supported by the CUDA attention "
                      "kernel (a multiple of 8, at most 256)", c->head_dim);
    int ndev = 0;
    cudaError_t crc = cudaGetDeviceCount(&ndev);
    if (crc != cudaSuccess || ndev == 0) {
        cudaGetLastError();
        return rs_err(e, RS_EUNSUPPORTED, "no CUDA device (%s)",
                      crc != cudaSuccess ? cudaGetErrorString(crc) : "device count 0");
    }
    if (bp->device < 0 || bp->device >= ndev)
        return rs_err(e, RS_EINVAL, "CUDA device %d does not exist (%d device%s)", bp->device, ndev,
                      ndev == 1 ? "" : "s");
    CUDA_CHECK(cudaSetDevice(bp->device));
    return RS_OK;
}

/* The backend's sizes, settings, stream and cuBLAS handle; no device memory yet, so every
 * later failure can go through cuda_destroy. */
static CudaBackend *backend_new(const Model *m, const BackendParams *bp) {
    const Config *c = &m->cfg;
    CudaBackend *b = (CudaBackend *)rs_xcalloc(1, sizeof *b);
    b->base.ops = &cuda_ops;
    b->base.model = m;
    b->base.params = *bp;
    b->graph_kernel_nodes = b->graph_nodes = -1;
    b->dims = model_dims(c);
    b->eps = c->norm_eps;
    /* Padded batches of up to 65 rows need room for the whole bucket. */
    int small = bp->max_batch < GRAPH_MAX_TOKENS ? bp->max_batch : GRAPH_MAX_TOKENS;
    b->rows = bp->max_batch > kBuckets[bucket_of(small)] ? bp->max_batch : kBuckets[bucket_of(small)];
    b->use_graphs = !bp->sw.cuda_eager;
    /* q|k|v through k_qkv_fused in one-row calls; -1: never, 1: every call a graph serves
     * (the A/B switches for measuring on a GPU; a dim the kernel cannot stage: never) */
    int qkv = bp->sw.cuda_fused_qkv;
    b->fused_qkv = qkv < 0 ? 0 : qkv > 0 ? GRAPH_MAX_TOKENS : 1;
    if (c->dim > CUK_NORM_GEMM_MAX_IN) b->fused_qkv = 0;
    /* one-row calls: the own GEMV for o, down and a one-row head, the FFN RMSNorm and
     * SwiGLU fused into gate|up's own GEMM; cuda_blas_onerow puts them back on cuBLAS (A/B
     * on a GPU) */
    b->own_gemv = !bp->sw.cuda_blas_onerow && c->dim <= CUK_NORM_GEMM_MAX_IN;
    b->batch_inv = bp->batch_invariant != 0;
    cu_pages_init(&b->pages, bp->max_seqs, bp->kv_capacity);
    b->slots = b->pages.blocks_total * CUK_KV_BLOCK;
    b->max_tiles = 2 * b->rows; /* cuk_attention_counters: below 2 nb for any nb <= rows */
    CUDA_CHECK(cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&b->in_copied, cudaEventDisableTiming));
    CUBLAS_CHECK(cublasCreate(&b->blas));
    CUBLAS_CHECK(cublasSetStream(b->blas, b->stream));
    /* An explicit workspace: cuBLAS must not allocate while a graph is being captured. */
    b->blas_ws_bytes = 32u << 20;
    return b;
}

/* Each allocation names what it is for, so running out of device memory says which one. */
#define DA(ptr, bytes, what) if (!rc) rc = dalloc(&(ptr), (bytes), (what), e)
#define HA(ptr, bytes, what) if (!rc) rc = halloc(&(ptr), (bytes), (what), e)

/* Device memory for the weights (bf16 matrices, f32 vectors) and the cuBLAS workspace. */
static int alloc_weights(CudaBackend *b, const Model *m, int random, RsErr *e) {
    const ModelDims *d = &b->dims;
    const Config *c = &m->cfg;
    size_t dim = d->dim, nl = d->nl;
    int rc = RS_OK;
    DA(b->blas_ws, b->blas_ws_bytes, "cuBLAS workspace");
    b->layers = (CuLayer *)rs_xcalloc(nl, sizeof(CuLayer));
    for (size_t l = 0; l < nl && !rc; l++) {
        CuLayer *L = &b->layers[l];
        DA(L->wqkv, (size_t)d->qkv_w * dim * 2, "wq|wk|wv");
        DA(L->wo, dim * d->qd * 2, "wo");
        DA(L->wgu, 2 * (size_t)d->hidden * dim * 2, "w_gate|w_up");
        DA(L->wdown, dim * d->hidden * 2, "w_down");
        DA(L->attn_norm, dim * 4, "attn_norm");
        DA(L->ffn_norm, dim * 4, "ffn_norm");
        if (c->has_qkv_bias) DA(L->bqkv, (size_t)d->qkv_w * 4, "q/k/v bias");
        if (c->has_qk_norm) {
            DA(L->q_norm, d->hd * 4, "q_norm");
            DA(L->k_norm, d->hd * 4, "k_norm");
        }
    }
    DA(b->emb, (size_t)d->vocab * dim * 2, "token embeddings");
    /* Tied head: one bf16 copy serves both (the Model marks it by sharing the pointer). */
    if (random ? c->tied_embeddings : m->w.wcls.data == m->w.tok_embeddings.data) b->wcls = b->emb;
    else DA(b->wcls, (size_t)d->vocab * dim * 2, "output head");
    DA(b->final_norm, dim * 4, "final_norm");
    return rc;
}

/* Activations for b->rows rows, the KV caches and the packed per-call input blocks. */
static int alloc_buffers(CudaBackend *b, const BackendParams *bp, RsErr *e) {
    const ModelDims *d = &b->dims;
    size_t R = (size_t)b->rows, cap = (size_t)b->slots, P = (size_t)bp->max_pending;
    size_t dim = d->dim, half = d->hd / 2, nl = d->nl;
    int rc = RS_OK;
    DA(b->inv_freq, half * 4, "inv_freq");
    DA(b->x, R * dim * 4, "x");
    DA(b->xb, R * dim * 2, "xb");
    DA(b->qkv, R * d->qkv_w * 4, "qkv");
    DA(b->att, R * d->qd * 2, "attention output");
    DA(b->tmp, R * dim * 4, "tmp");
    DA(b->gu, R * 2 * d->hidden * 4, "gate|up");
    DA(b->hb, R * d->hidden * 2, "hb");
    DA(b->logits, R * d->vocab * 4, "logits");
    DA(b->cos_t, R * half * 4, "cos");
    DA(b->sin_t, R * half * 4, "sin");
    DA(b->kc, nl * cap * d->kvd * 2, "key cache");
    DA(b->vc, nl * cap * d->kvd * 2, "value cache");
    DA(b->kv_scratch, nl * P * d->kvd * 2, "kv_commit scratch");
    b->mask_words = (int)((P + 63) / 64);
    b->in_tiles_off = (IN_HEAD + 4 * R * 4 + 15) / 16 * 16;
    b->in_tables_off = b->in_tiles_off + (size_t)b->max_tiles * sizeof(CuAttTile);
    b->in_mask_off = (b->in_tables_off + (size_t)b->pages.blocks_total * 4 + 15) / 16 * 16;
    b->in_bytes = b->in_mask_off + (size_t)bp->max_batch * b->mask_words * 8;
    DA(b->d_in, b->in_bytes, "per-call inputs");
    HA(b->h_in, b->in_bytes, "per-call inputs (host)");
    DA(b->d_keep, 3 * P * 4, "keep");
    HA(b->h_keep, 3 * P * 4, "keep (host)");
    DA(b->att_scratch, cuk_attention_scratch_floats(b->rows, d->nh, d->hd, (int)cap) * 4,
       "attention partials");
    DA(b->att_cnt, cuk_attention_counters(b->rows, d->nh) * 4, "attention tile counters");
    DA(b->qkv_cnt, cuk_qkv_counters(b->rows, d->nh, d->nkv) * 4, "q|k|v head counters");
    DA(b->d_rq, sizeof(RowQuery), "row queries");
    HA(b->h_rq, sizeof(RowQuery), "row queries (host)");
    size_t rq_bytes = cuk_rows_stats_scratch_bytes(ROWQ_STATS, d->vocab);
    DA(b->d_rowq_scratch, rq_bytes, "row statistics partials");
    if (!rc) CUDA_CHECK(cudaMemset(b->d_rowq_scratch, 0, rq_bytes));
    if (!rc) {
        CuInputs d = in_pointers(b->d_in, b), h = in_pointers(b->h_in, b);
        b->d_meta = d.meta, b->d_paged = d.paged, b->d_tokens = d.tokens, b->d_pos = d.pos;
        b->d_rows = d.rows, b->d_slot = d.slot, b->d_tiles = d.tiles, b->d_tables = d.tables;
        b->d_mask = d.mask;
        b->h_meta = h.meta, b->h_paged = h.paged, b->h_tokens = h.tokens, b->h_pos = h.pos;
        b->h_rows = h.rows, b->h_slot = h.slot, b->h_tiles = h.tiles, b->h_tables = h.tables;
        b->h_mask = h.mask;
    }
    return rc;
}
#undef DA
#undef HA

/* Fills the weights (uploaded, or made on the device for a random model), the RoPE
 * frequencies, and zeroes caches and inputs so that padding rows never read NaN from stale
 * memory. The only failure is the staging buffer's allocation. */
static int upload_weights(CudaBackend *b, const Model *m, int random, RsErr *e) {
    const ModelDims *d = &b->dims;
    const Config *c = &m->cfg;
    size_t cap = (size_t)b->slots, half = d->hd / 2, nl = d->nl;
    WeightSrc ws = {b, random ? NULL : m, NULL, NULL, 0};
    if (!random) {
        ws.stage_floats = (size_t)16 << 20; /* 64 MiB of f32 per upload */
        ws.host = (float *)rs_xmalloc(ws.stage_floats * sizeof(float));
        int rc = dalloc(&ws.stage, ws.stage_floats * 4, "weight upload staging", e);
        if (rc) {
            free(ws.host);
            return rc;
        }
    }
    Config wc = *c; /* a loaded model is tied when its head is its embedding array */
    wc.tied_embeddings = b->wcls == b->emb;
    model_random_walk(&wc, m->random_seed, put_tensor, &ws);
    float *inv = (float *)rs_xcalloc(half, sizeof(float));
    cuk_rope_inv_freq(c, inv);
    CUDA_CHECK(cudaMemcpyAsync(b->inv_freq, inv, half * 4, cudaMemcpyHostToDevice, b->stream));
    /* Defined contents for padding rows and caches (never NaN from stale memory). */
    CUDA_CHECK(cudaMemsetAsync(b->kc, 0, nl * cap * d->kvd * 2, b->stream));
    CUDA_CHECK(cudaMemsetAsync(b->vc, 0, nl * cap * d->kvd * 2, b->stream));
    CUDA_CHECK(cudaMemsetAsync(b->d_in, 0, b->in_bytes, b->stream));
    /* padding rows' attention output is never written: finite from the start */
    CUDA_CHECK(cudaMemsetAsync(b->att, 0, (size_t)b->rows * d->qd * 2, b->stream));
    CUDA_CHECK(cudaMemsetAsync(b->att_cnt, 0, cuk_attention_counters(b->rows, d->nh) * 4,
                               b->stream)); /* the attention tile counters start at zero */
    CUDA_CHECK(cudaMemsetAsync(b->qkv_cnt, 0, cuk_qkv_counters(b->rows, d->nh, d->nkv) * 4,
                               b->stream));
    memset(b->h_in, 0, b->in_bytes);
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
    free(inv);
    free(ws.host);
    DFREE(ws.stage);
    return RS_OK;
}

/* A "random:" model without host weights gets them made on the device (no host copy of an
 * 8B model); one that has host weights (materialised, or a layer view) is uploaded. */
static int cuda_create(const Model *m, const BackendParams *bp, Backend **out, RsErr *e) {
    *out = NULL;
    int random = m->random_weights && !m->arena;
    int rc = check_and_select(&m->cfg, bp, e);
    if (rc) return rc;
    CudaBackend *b = backend_new(m, bp);
    rc = alloc_weights(b, m, random, e);
    if (!rc) rc = alloc_buffers(b, bp, e);
    size_t red_bytes = (size_t)b->rows * (2 * BACKEND_TOPK_MAX + 1) * 4;
    if (!rc) rc = dalloc(&b->d_red, red_bytes, "row reductions", e);
    if (!rc) rc = halloc(&b->h_red, red_bytes, "row reductions (host)", e);
    size_t tk_bytes = cuk_topk_scratch_bytes(b->rows, b->dims.vocab);
    if (!rc) rc = dalloc(&b->topk_scratch, tk_bytes, "top-k chunk partials", e);
    if (!rc) CUDA_CHECK(cudaMemset(b->topk_scratch, 0, tk_bytes));
    if (!rc) {
        CUBLAS_CHECK(cublasSetWorkspace(b->blas, b->blas_ws, b->blas_ws_bytes));
        b->keep_seen = (uint8_t *)rs_xcalloc((size_t)bp->max_pending, 1);
        rc = upload_weights(b, m, random, e);
    }
    if (rc) {
        Backend *bb = &b->base;
        cuda_destroy(&bb);
        return rc;
    }
    if (b->use_graphs) capture_all(b);
    const ModelDims *d = &b->dims;
    size_t dim = d->dim;
    size_t per_layer = ((size_t)d->qkv_w * dim + dim * d->qd + 3 * (size_t)d->hidden * dim) * 2;
    b->weight_bytes = per_layer * d->nl + (size_t)d->vocab * dim * 2;
    *out = &b->base;
    return RS_OK;
}

extern "C" void cuda_backend_set_graphs(Backend *bb, int on) {
    RS_ASSERT(bb && bb->ops == &cuda_ops);
    ((CudaBackend *)bb)->use_graphs = on != 0;
}

extern "C" size_t cuda_backend_weight_bytes(const Backend *bb) {
    RS_ASSERT(bb && bb->ops == &cuda_ops);
    return ((const CudaBackend *)bb)->weight_bytes;
}

static void cuda_stats(const Backend *bb, BackendStats *out) {
    const CudaBackend *b = (const CudaBackend *)bb;
    out->graph_replays = b->n_graph_replays;
    out->eager_launches = b->n_eager_launches;
    out->graph_captures = b->n_captures;
}

/* Y (n, out) f32 = X (n, in) bf16 @ W^T (+ Y when beta = 1), W (out, in) row-major bf16.
 * cuBLAS is column-major: A = W as a column-major (in, out) matrix, transposed; B = X as a
 * column-major (in, n) matrix. */
static void gemm(CudaBackend *b, const rs_bf16 *W, int out, int in, const rs_bf16 *X, int n,
                 float *Y, float beta) {
    const float alpha = 1.0f;
    CUBLAS_CHECK(cublasGemmEx(b->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &alpha, W,
                              CUDA_R_16BF, in, X, CUDA_R_16BF, in, &beta, Y, CUDA_R_32F, out,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    cuk_count_launches(1); /* one kernel for these shapes; split-K variants may add one */
}

/* The attention half of a layer, shared by both modes: RMSNorm + q|k|v projection + bias,
 * q/k norm, RoPE and KV store in one launch (cuk_qkv_fused), then attention with its
 * split-KV merge in the same launch: 2 launches. In the default mode only one-row calls
 * take the fused kernel (CUDA cores, one pass over the weights); calls of more rows, where
 * cuBLAS's tensor cores reuse each weight across rows, take RMSNorm + cuBLAS +
 * cuk_qkv_post: 4 launches (b->fused_qkv moves the bound for measurements). */
static void layer_attn_in(CudaBackend *b, int l, int nb) {
    const ModelDims *d = &b->dims;
    cudaStream_t s = b->stream;
    const CuLayer *L = &b->layers[l];
    int cap = b->slots;
    rs_bf16 *kc = b->kc + (size_t)l * cap * d->kvd, *vc = b->vc + (size_t)l * cap * d->kvd;
    if (b->batch_inv || nb <= b->fused_qkv) {
        cuk_qkv_fused(s, L->wqkv, b->x, L->attn_norm, d->dim, b->eps, nb, d->nh, d->nkv, d->hd,
                      L->bqkv, L->q_norm, L->k_norm, b->cos_t, b->sin_t, b->d_meta, b->qkv, kc,
                      vc, b->qkv_cnt);
    } else {
        cuk_rmsnorm(s, b->x, NULL, L->attn_norm, nb, d->dim, b->eps, NULL, b->xb);
        gemm(b, L->wqkv, d->qkv_w, d->dim, b->xb, nb, b->qkv, 0.0f);
        cuk_qkv_post(s, b->qkv, d->qkv_w, nb, d->nh, d->nkv, d->hd, L->bqkv, L->q_norm,
                     L->k_norm, b->eps, b->cos_t, b->sin_t, b->d_meta, kc, vc);
    }
    cuk_attention_paged(s, b->qkv, d->qkv_w, kc, vc, b->d_mask, b->d_meta, nb, b->pages.n_seqs,
                        d->nh, d->nkv, d->hd, cap, b->batch_inv, b->att_scratch, b->att_cnt,
                        b->att, NULL);
}

/* One layer in the default mode, 5 launches in a one-row call (9 with more rows): the
 * attention half, then cuBLAS for the o, gate|up and down projections, the o and down ones
 * adding into the residual stream themselves (beta = 1), with the FFN RMSNorm and SwiGLU
 * between them. A cuBLAS GEMM cannot take the RMSNorm, and between two cuBLAS GEMMs at
 * least one kernel must turn the f32 result into the next bf16 input, so four cuBLAS
 * GEMMs cost at least 8 launches a layer; the fused q|k|v kernel saves two. A one-row call
 * reads each weight once whatever the kernel, so there o and down run on the own GEMV
 * (8 16-byte weight loads in flight per lane) and gate|up on the own GEMM with the RMSNorm
 * in its prologue and SwiGLU in its epilogue (the batch-invariant mode's kernels). */
static void layer_blas(CudaBackend *b, int l, int nb) {
    const ModelDims *d = &b->dims;
    cudaStream_t s = b->stream;
    const CuLayer *L = &b->layers[l];
    layer_attn_in(b, l, nb);
    if (nb == 1 && b->own_gemv) {
        cuk_gemv(s, L->wo, d->dim, d->qd, b->att, 1, b->x);
        cuk_gemm_bi(s, L->wgu, d->hidden, d->dim, nb, NULL, b->x, NULL, L->ffn_norm, b->eps, 1,
                    0, NULL, b->hb);
        cuk_gemv(s, L->wdown, d->dim, d->hidden, b->hb, 1, b->x);
        return;
    }
    gemm(b, L->wo, d->dim, d->qd, b->att, nb, b->x, 1.0f);
    cuk_rmsnorm(s, b->x, NULL, L->ffn_norm, nb, d->dim, b->eps, NULL, b->xb);
    gemm(b, L->wgu, 2 * d->hidden, d->dim, b->xb, nb, b->gu, 0.0f);
    cuk_swiglu(s, b->gu, nb, d->hidden, b->hb, NULL);
    gemm(b, L->wdown, d->dim, d->hidden, b->hb, nb, b->x, 1.0f);
}

/* One layer in batch-invariant mode, 5 launches: the attention half, then cuk_gemm_bi for
 * o (+= residual), gate|up (RMSNorm prologue, SwiGLU epilogue) and down (+= residual). */
static void layer_bi(CudaBackend *b, int l, int nb) {
    const ModelDims *d = &b->dims;
    cudaStream_t s = b->stream;
    const CuLayer *L = &b->layers[l];
    layer_attn_in(b, l, nb);
    cuk_gemm_bi(s, L->wo, d->dim, d->qd, nb, b->att, NULL, NULL, NULL, 0.0f, 0, 1, b->x, NULL);
    cuk_gemm_bi(s, L->wgu, d->hidden, d->dim, nb, NULL, b->x, NULL, L->ffn_norm, b->eps, 1, 0,
                NULL, b->hb);
    cuk_gemm_bi(s, L->wdown, d->dim, d->hidden, nb, b->hb, NULL, NULL, NULL, 0.0f, 0, 1, b->x,
                NULL);
}

/* EAGLE-3 features: the residual stream entering layer l into the pending entries' rows. */
static void feat_store(CudaBackend *b, int l, int nb) {
    const Backend *bb = &b->base;
    int D = b->dims.dim;
    for (int k = 0; k < bb->feat_n; k++)
        if (bb->feat_layers[k] == l)
            cuk_feat_store(b->stream, b->x, nb, D, bb->feat_n * D, k * D, b->d_meta, b->feat_pend);
}

/* Enqueues the layers of one forward of nb rows (device inputs already staged); the head
 * is separate (head()), so a graph holds no padding rows' logits. May be captured. */
static void enqueue_forward(CudaBackend *b, int nb) {
    const ModelDims *d = &b->dims;
    cudaStream_t s = b->stream;
    uint64_t c0 = cuk_launch_count();
    cuk_rope_table(s, b->d_pos, b->inv_freq, nb, d->hd / 2, b->cos_t, b->sin_t);
    cuk_embed(s, b->emb, b->d_tokens, nb, d->dim, b->x);
    uint64_t c1 = cuk_launch_count();
    for (int l = 0; l < d->nl; l++) {
        if (b->base.feat_n) feat_store(b, l, nb);
        if (b->batch_inv) layer_bi(b, l, nb);
        else layer_blas(b, l, nb);
    }
    if (b->base.feat_n) feat_store(b, d->nl, nb);
    uint64_t c2 = cuk_launch_count();
    b->launches_pre = (int)(c1 - c0);
    b->launches_layer = (int)((c2 - c1) / (uint64_t)d->nl);
    b->launches_pass = (int)(c2 - c0);
}

/* Final norm and output head of the n_out rows d_rows names, only those: 1 launch in
 * batch-invariant mode, 2 otherwise (a one-row head on the own GEMV), none when no logits
 * are wanted. */
static int head(CudaBackend *b, int n_out) {
    const ModelDims *d = &b->dims;
    if (n_out <= 0) return 0;
    uint64_t c0 = cuk_launch_count();
    if (b->batch_inv) {
        cuk_gemm_bi(b->stream, b->wcls, d->vocab, d->dim, n_out, NULL, b->x, b->d_rows,
                    b->final_norm, b->eps, 0, 0, b->logits, NULL);
    } else {
        cuk_rmsnorm(b->stream, b->x, b->d_rows, b->final_norm, n_out, d->dim, b->eps, NULL, b->xb);
        if (n_out == 1 && b->own_gemv) cuk_gemv(b->stream, b->wcls, d->vocab, d->dim, b->xb, 0, b->logits);
        else gemm(b, b->wcls, d->vocab, d->dim, b->xb, n_out, b->logits, 0.0f);
    }
    return (int)(cuk_launch_count() - c0);
}

static void graph_key(CudaBackend *b, int nb, const void **key) {
    const void *k[N_GRAPH_KEYS] = {b->x,      b->qkv,    b->kc,     b->vc,
                                   b->att,    b->d_in,   b->att_scratch, b->emb,
                                   b->hb,     b->blas_ws, (const void *)(intptr_t)nb,
                                   (const void *)(intptr_t)b->base.params.kv_capacity};
    memcpy(key, k, sizeof k);
}

/* Kernel nodes of a captured graph (what a replay launches: cuBLAS's split-K reductions
 * included, which the host-side counter cannot see); *nodes gets all its nodes (copies and
 * memsets too). */
static int graph_kernel_nodes(cudaGraph_t graph, int *nodes) {
    size_t n = 0;
    CUDA_CHECK(cudaGraphGetNodes(graph, NULL, &n));
    cudaGraphNode_t *list = (cudaGraphNode_t *)rs_xcalloc(n ? n : 1, sizeof *list);
    CUDA_CHECK(cudaGraphGetNodes(graph, list, &n));
    int kernels = 0;
    for (size_t i = 0; i < n; i++) {
        enum cudaGraphNodeType t;
        CUDA_CHECK(cudaGraphNodeGetType(list[i], &t));
        kernels += t == cudaGraphNodeTypeKernel;
    }
    free(list);
    *nodes = (int)n;
    return kernels;
}

static void launch_graph(CudaBackend *b, int bi) {
    CuGraph *g = &b->graphs[bi];
    int nb = kBuckets[bi];
    const void *key[N_GRAPH_KEYS];
    graph_key(b, nb, key);
    if (g->valid && memcmp(key, g->key, sizeof key) != 0) {
        CUDA_CHECK(cudaGraphExecDestroy(g->exec));
        g->valid = 0;
    }
    if (!g->valid) {
        /* One eager run first: cuBLAS picks and loads its kernels (lazy module loading)
         * outside the capture, where loading is always allowed. The run is idempotent (same
         * cache slots), so the replay below simply recomputes it. */
        enqueue_forward(b, nb);
        cudaGraph_t graph;
        CUDA_CHECK(cudaStreamBeginCapture(b->stream, cudaStreamCaptureModeThreadLocal));
        enqueue_forward(b, nb);
        CUDA_CHECK(cudaStreamEndCapture(b->stream, &graph));
        g->kernel_nodes = graph_kernel_nodes(graph, &g->nodes);
        CUDA_CHECK(cudaGraphInstantiate(&g->exec, graph, 0));
        CUDA_CHECK(cudaGraphDestroy(graph));
        memcpy(g->key, key, sizeof key);
        g->launches_layer = b->launches_layer;
        g->launches_pass = b->launches_pass;
        g->valid = 1;
        b->n_captures++;
    }
    CUDA_CHECK(cudaGraphLaunch(g->exec, b->stream));
    b->launches_layer = g->launches_layer;
    b->launches_pass = g->launches_pass;
    b->graph_kernel_nodes = g->kernel_nodes;
    b->graph_nodes = g->nodes;
}

/* Every bucket a forward() can use is captured now, not in the middle of a decode. The
 * inputs say n = 0 rows, so the warm-up and replay touch no cache slot. */
static void capture_all(CudaBackend *b) {
    int small = b->base.params.max_batch < GRAPH_MAX_TOKENS ? b->base.params.max_batch
                                                            : GRAPH_MAX_TOKENS;
    stage_meta(b, 0, 0, 0, 0);
    CUDA_CHECK(cudaMemcpyAsync(b->d_in, b->h_in, IN_HEAD, cudaMemcpyHostToDevice, b->stream));
    for (int bi = 0; bi <= bucket_of(small); bi++) launch_graph(b, bi);
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
}

extern "C" void cuda_backend_graph_launches(const Backend *bb, double *per_layer, int *kernels,
                                           int *nodes) {
    RS_ASSERT(bb && bb->ops == &cuda_ops);
    const CudaBackend *b = (const CudaBackend *)bb;
    *kernels = b->graph_kernel_nodes;
    *nodes = b->graph_nodes;
    /* the graph holds the layers plus what precedes them (RoPE table, embedding) */
    *per_layer = b->graph_kernel_nodes < 0 ? -1.0
                 : (double)(b->graph_kernel_nodes - b->launches_pre) / b->dims.nl;
}

extern "C" int cuda_backend_qkv_fused(const Backend *bb, int n) {
    RS_ASSERT(bb && bb->ops == &cuda_ops);
    const CudaBackend *b = (const CudaBackend *)bb;
    int nb = n <= GRAPH_MAX_TOKENS ? kBuckets[bucket_of(n)] : n;
    return b->batch_inv || nb <= b->fused_qkv;
}

extern "C" int cuda_backend_busy(const Backend *bb) {
    RS_ASSERT(bb && bb->ops == &cuda_ops);
    cudaError_t rc = cudaStreamQuery(((const CudaBackend *)bb)->stream);
    if (rc == cudaErrorNotReady) return 1;
    CUDA_CHECK(rc);
    return 0;
}

extern "C" void cuda_backend_launches(const Backend *bb, int *per_layer, int *per_pass) {
    RS_ASSERT(bb && bb->ops == &cuda_ops);
    const CudaBackend *b = (const CudaBackend *)bb;
    *per_layer = b->launches_layer;
    *per_pass = b->launches_pass;
}

/* The block's head: meta (the rows, sequence 0's cache offsets for the EAGLE-3 feature
 * rows, the mask row length in words * 64) and the paged layout's pointers and tile count. */
static void stage_meta(CudaBackend *b, int n, int kv_base, int nc, int n_tiles) {
    CuMeta m = {n, kv_base, nc, b->mask_words * 64, b->d_paged};
    CuPaged pg = {b->d_slot, b->d_tiles, b->d_tables, n_tiles, 0};
    *b->h_meta = m;
    *b->h_paged = pg;
}

/* Rows r0.. of segment g: tokens, positions, cache slots (its sequence holds their blocks
 * already), mask rows (mask_words words each; NULL: causal, every earlier pending entry
 * visible), its block table at *ntab and its row tiles at *nt. */
static void stage_segment(CudaBackend *b, const BackendSeg *g, int r0, int rows_pb, int *nt,
                          int *ntab) {
    const CuSeq *q = &b->pages.seqs[g->seq];
    int np = q->np, stride = np + g->n, W = b->mask_words;
    for (int t = 0; t < g->n; t++) {
        b->h_tokens[r0 + t] = g->tokens[t];
        b->h_pos[r0 + t] = g->pos[t];
        b->h_slot[r0 + t] = cu_pages_slot(&b->pages, g->seq, q->nc + np + t);
        uint64_t *row = b->h_mask + (size_t)(r0 + t) * W;
        memset(row, 0, (size_t)W * 8);
        for (int j = 0; j < stride; j++)
            if (g->mask ? g->mask[(size_t)t * stride + j] : j < np + t + 1)
                row[j / 64] |= 1ull << (j % 64);
    }
    memcpy(b->h_tables + *ntab, q->blocks, (size_t)q->n_blocks * sizeof(int));
    for (int t0 = 0; t0 < g->n; t0 += rows_pb) {
        RS_ASSERT(*nt < b->max_tiles);
        CuAttTile a = {r0 + t0, g->n - t0 < rows_pb ? g->n - t0 : rows_pb, q->nc,
                       q->nc + np + g->n, *ntab, 0};
        b->h_tiles[(*nt)++] = a;
    }
    *ntab += q->n_blocks;
}

/* Fills the packed input block (host side) for one call of the segments' rows padded to
 * nb; returns the bytes to copy. */
static size_t stage_inputs(CudaBackend *b, const BackendSeg *segs, int n_segs, int nb,
                           const int *out_rows, int n_out) {
    const ModelDims *d = &b->dims;
    int rows_pb = cuk_attention_tile_rows(nb, d->nh, d->nkv, d->hd), r = 0, nt = 0, ntab = 0;
    for (int i = 0; i < n_segs; r += segs[i].n, i++)
        stage_segment(b, &segs[i], r, rows_pb, &nt, &ntab);
    for (int i = r; i < nb; i++) b->h_tokens[i] = b->h_pos[i] = b->h_slot[i] = 0;
    for (int i = 0; i < n_out; i++) b->h_rows[i] = out_rows[i];
    const CuSeq *q0 = &b->pages.seqs[segs[0].seq];
    stage_meta(b, r, q0->nc + q0->np, q0->nc, nt);
    return b->in_mask_off + (size_t)r * b->mask_words * 8;
}

/* Blocks the segments need beyond those their sequences hold. */
static int batch_short(const CudaBackend *b, const BackendSeg *segs, int n_segs) {
    int need = 0;
    for (int i = 0; i < n_segs; i++) {
        const CuSeq *q = &b->pages.seqs[segs[i].seq];
        need += cu_pages_short(&b->pages, segs[i].seq, q->nc + q->np + segs[i].n);
    }
    return need;
}

/* Keeps the head's counters equal to sequence 0's (the single-sequence functions). */
static void seq0_sync(CudaBackend *b) {
    b->base.n_committed = b->pages.seqs[0].nc;
    b->base.n_pending = b->pages.seqs[0].np;
}

/* The forward over checked segments (backend_forward_batch; backend_forward is one
 * segment of sequence 0). */
static int cuda_forward_batch(Backend *bb, const BackendSeg *segs, int n_segs,
                              const int *out_rows, int n_out, float *logits, RsErr *e) {
    CudaBackend *b = (CudaBackend *)bb;
    int n = 0, need = batch_short(b, segs, n_segs);
    for (int i = 0; i < n_segs; i++) n += segs[i].n;
    if (bb->feat_n && (n_segs > 1 || segs[0].seq != 0))
        return rs_err(e, RS_EUNSUPPORTED, "EAGLE-3 features are recorded for sequence 0 only");
    if (need > b->pages.n_free)
        return rs_err(e, RS_EFULL, "the batch needs %d more KV blocks; %d of %d are free", need,
                      b->pages.n_free, b->pages.blocks_total);
    CUDA_CHECK(cudaSetDevice(bb->params.device));
    /* Small calls are padded to their bucket (graph or not, so replay == eager exactly). */
    int bi = n <= GRAPH_MAX_TOKENS ? bucket_of(n) : -1;
    int nb = bi >= 0 ? kBuckets[bi] : n;
    RS_ASSERT(nb <= b->rows);
    /* the previous call's input copy may still read the pinned block staged anew here */
    CUDA_CHECK(cudaEventSynchronize(b->in_copied));
    for (int i = 0; i < n_segs; i++) {
        const CuSeq *q = &b->pages.seqs[segs[i].seq];
        cu_pages_grow(&b->pages, segs[i].seq, q->nc + q->np + segs[i].n);
    }
    size_t bytes = stage_inputs(b, segs, n_segs, nb, out_rows, n_out);
    cudaStream_t s = b->stream;
    CUDA_CHECK(cudaMemcpyAsync(b->d_in, b->h_in, bytes, cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaEventRecord(b->in_copied, s));
    if (bi >= 0 && b->use_graphs) {
        launch_graph(b, bi);
        b->n_graph_replays++;
    } else {
        enqueue_forward(b, nb);
        b->n_eager_launches++;
        b->graph_kernel_nodes = b->graph_nodes = -1;
    }
    b->launches_pass += head(b, n_out);
    /* Without logits to return the pass stays in flight: the rows stay on the device, and
     * every later call that reads the device (row queries, kv_commit, copies) runs behind it
     * on the same stream and synchronises itself. */
    if (n_out > 0 && logits) {
        CUDA_CHECK(cudaMemcpyAsync(logits, b->logits, (size_t)n_out * b->dims.vocab * 4,
                                   cudaMemcpyDeviceToHost, s));
        CUDA_CHECK(cudaStreamSynchronize(s));
    }
    for (int i = 0; i < n_segs; i++) b->pages.seqs[segs[i].seq].np += segs[i].n;
    seq0_sync(b);
    return RS_OK;
}

static int cuda_forward(Backend *bb, const int *tokens, const int *pos, int n,
                        const uint8_t *mask, const int *out_rows, int n_out, float *logits,
                        RsErr *e) {
    int rc = backend_check_forward(bb, tokens, pos, n, mask, out_rows, n_out, e);
    if (rc) return rc;
    BackendSeg g = {0, tokens, pos, n, mask};
    return cuda_forward_batch(bb, &g, 1, out_rows, n_out, logits, e);
}

/* One copy per run of consecutive kept rows (a whole pass's rows are usually one run). */
static int cuda_rows_copy(Backend *bb, const int *rows, int n, float *logits, RsErr *e) {
    CudaBackend *b = (CudaBackend *)bb;
    CUDA_CHECK(cudaSetDevice(bb->params.device));
    size_t V = (size_t)b->dims.vocab;
    for (int i = 0, run; i < n; i += run) {
        for (run = 1; i + run < n && rows[i + run] == rows[i] + run; run++) {}
        CUDA_CHECK(cudaMemcpyAsync(logits + i * V, b->logits + (size_t)rows[i] * V,
                                   run * V * sizeof(float), cudaMemcpyDeviceToHost, b->stream));
    }
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
    return RS_OK;
}

/* One kernel over the kept rows; only the (2k + 1) numbers a row crosses to the host. */
static int cuda_rows_topk(Backend *bb, int k, int *ids, float *logq, float *lse, RsErr *e) {
    CudaBackend *b = (CudaBackend *)bb;
    int n = bb->n_kept;
    CUDA_CHECK(cudaSetDevice(bb->params.device));
    size_t nk = (size_t)n * k;
    int *d_ids = (int *)b->d_red;
    float *d_logq = (float *)b->d_red + nk, *d_lse = (float *)b->d_red + 2 * nk;
    cuk_topk(b->stream, b->logits, n, b->dims.vocab, k, b->topk_scratch, d_ids, d_logq, d_lse);
    CUDA_CHECK(cudaMemcpyAsync(b->h_red, b->d_red, (2 * nk + n) * 4, cudaMemcpyDeviceToHost,
                               b->stream));
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
    memcpy(ids, b->h_red, nk * 4);
    memcpy(logq, (float *)b->h_red + nk, nk * 4);
    memcpy(lse, (float *)b->h_red + 2 * nk, (size_t)n * 4);
    return RS_OK;
}

/* Keeps seq's pending entries keep[i] as its entries nc + i: the K/V rows move between
 * their slots (none when keep is 0, 1, ...), sequence 0's feature rows are gathered in keep
 * order, and the blocks past the committed entries go back. */
static int cuda_seq_commit(Backend *bb, int seq, const int *keep, int n_keep, RsErr *e) {
    CudaBackend *b = (CudaBackend *)bb;
    CuSeq *q = &b->pages.seqs[seq];
    int identity, rc = backend_check_keep(q->np, keep, n_keep, b->keep_seen, &identity, e);
    if (rc) return rc;
    int feats = bb->feat_n && seq == 0;
    if (!identity || feats) {
        CUDA_CHECK(cudaSetDevice(bb->params.device));
        int P = bb->params.max_pending, nl = b->dims.nl, kvd = b->dims.kvd;
        for (int i = 0; i < n_keep; i++) {
            b->h_keep[i] = keep[i];
            b->h_keep[P + i] = cu_pages_slot(&b->pages, seq, q->nc + keep[i]);
            b->h_keep[2 * P + i] = cu_pages_slot(&b->pages, seq, q->nc + i);
        }
        CUDA_CHECK(cudaMemcpyAsync(b->d_keep, b->h_keep, (size_t)3 * P * 4,
                                   cudaMemcpyHostToDevice, b->stream));
        if (!identity) {
            const int *from = b->d_keep + P, *to = b->d_keep + 2 * P;
            cuk_kv_move(b->stream, b->kc, nl, b->slots, kvd, from, to, n_keep, b->kv_scratch);
            cuk_kv_move(b->stream, b->vc, nl, b->slots, kvd, from, to, n_keep, b->kv_scratch);
        }
        if (feats)
            cuk_feat_gather(b->stream, b->feat_pend, b->d_keep, n_keep, bb->feat_n * b->dims.dim,
                            b->feat_out);
        CUDA_CHECK(cudaStreamSynchronize(b->stream)); /* h_keep is staged anew next time */
    }
    q->nc += n_keep;
    q->np = 0;
    cu_pages_shrink(&b->pages, seq, q->nc);
    seq0_sync(b);
    return RS_OK;
}

static int cuda_kv_commit(Backend *bb, const int *keep, int n_keep, RsErr *e) {
    return cuda_seq_commit(bb, 0, keep, n_keep, e);
}

static int cuda_seq_open(Backend *bb, int *seq, RsErr *e) {
    CudaBackend *b = (CudaBackend *)bb;
    int s = cu_pages_open(&b->pages);
    if (s < 0) return rs_err(e, RS_EFULL, "all %d sequences are open (max_seqs)", b->pages.n_seqs);
    *seq = s;
    return RS_OK;
}

/* The blocks go back at once: later work on the stream that reuses them runs behind every
 * kernel that read them. */
static void cuda_seq_close(Backend *bb, int seq) {
    CudaBackend *b = (CudaBackend *)bb;
    cu_pages_close(&b->pages, seq);
    seq0_sync(b);
}

static void cuda_seq_counts(const Backend *bb, int seq, int *nc, int *np) {
    const CuSeq *q = &((const CudaBackend *)bb)->pages.seqs[seq];
    *nc = q->open ? q->nc : -1;
    *np = q->np;
}

static void cuda_kv_usage(const Backend *bb, BackendKvUsage *u) {
    const CuPages *pg = &((const CudaBackend *)bb)->pages;
    u->blocks_used = cu_pages_used(pg);
    u->blocks_cached = 0;
    u->seqs_open = 0;
    for (int i = 0; i < pg->n_seqs; i++) u->seqs_open += pg->seqs[i].open;
}

/* Pinned, so forward()'s logits copy is one DMA at full speed (a tree pass returns up to
 * 65 rows x vocab floats: 33 MB for a 128k vocabulary). */
static void *cuda_host_alloc(Backend *bb, size_t bytes) {
    void *p = NULL;
    CUDA_CHECK(cudaSetDevice(bb->params.device));
    CUDA_CHECK(cudaMallocHost(&p, bytes ? bytes : 16));
    return p;
}

static void cuda_host_free(Backend *bb, void *p) {
    CUDA_CHECK(cudaSetDevice(bb->params.device));
    CUDA_CHECK(cudaFreeHost(p));
}

/* Buffers for recording (none when it stops); the captured graphs change with it. */
static int cuda_set_features(Backend *bb, RsErr *e) {
    CudaBackend *b = (CudaBackend *)bb;
    CUDA_CHECK(cudaSetDevice(bb->params.device));
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
    graphs_drop(b);
    DFREE(b->feat_pend);
    DFREE(b->feat_out);
    HFREE(b->h_feat);
    size_t bytes = (size_t)bb->params.max_pending * bb->feat_n * b->dims.dim * 2;
    int rc = RS_OK;
    if (bb->feat_n) {
        rc = dalloc(&b->feat_pend, bytes, "feature rows", e);
        if (!rc) rc = dalloc(&b->feat_out, bytes, "kept feature rows", e);
        if (!rc) rc = halloc(&b->h_feat, bytes, "kept feature rows (host)", e);
        if (rc) {
            DFREE(b->feat_pend);
            DFREE(b->feat_out);
        }
    }
    if (b->use_graphs) capture_all(b);
    return rc;
}

static const void *cuda_read_features(Backend *bb, BackendFeatType *t) {
    CudaBackend *b = (CudaBackend *)bb;
    *t = BACKEND_FEAT_BF16;
    CUDA_CHECK(cudaSetDevice(bb->params.device));
    size_t bytes = (size_t)bb->feat_rows * bb->feat_n * b->dims.dim * 2;
    CUDA_CHECK(cudaMemcpyAsync(b->h_feat, b->feat_out, bytes, cudaMemcpyDeviceToHost, b->stream));
    CUDA_CHECK(cudaStreamSynchronize(b->stream));
    return b->h_feat;
}

static void cuda_kv_reset(Backend *bb) { cuda_seq_close(bb, 0); }

/* ---- the verifier's row queries over the kept rows (b->logits, in out_rows order) ---- */

/* One array of a row query, staged through the RowQuery field at offset `off` (the same
 * offset in the pinned host copy and on the device): `up` sends entries of `size` bytes
 * before the kernel, `down` receives them after it; neither: the query leaves it out. */
typedef struct {
    const void *up;
    void *down;
    size_t size, off;
} RowqArray;

/* Enqueues a query's kernel over the k entries staged in the device RowQuery d. */
typedef void (*RowqKernel)(CudaBackend *b, RowQuery *d, int k, const void *arg);

/* The loop both row queries share: n entries in batches of at most `batch` (the RowQuery
 * sizes of the arrays they use); arguments go up, the kernel runs, results come down, one
 * stream sync a batch. Only these arrays cross, never a logits row. */
static void rowq_run(CudaBackend *b, int n, int batch, const RowqArray *a, int n_a,
                     RowqKernel kernel, const void *arg) {
    cudaStream_t s = b->stream;
    char *h = (char *)b->h_rq, *d = (char *)b->d_rq;
    CUDA_CHECK(cudaSetDevice(b->base.params.device));
    for (int i0 = 0; i0 < n; i0 += batch) {
        size_t k = (size_t)(n - i0 < batch ? n - i0 : batch);
        for (int j = 0; j < n_a; j++) {
            if (!a[j].up) continue;
            memcpy(h + a[j].off, (const char *)a[j].up + a[j].size * i0, a[j].size * k);
            CUDA_CHECK(cudaMemcpyAsync(d + a[j].off, h + a[j].off, a[j].size * k,
                                       cudaMemcpyHostToDevice, s));
        }
        kernel(b, b->d_rq, (int)k, arg);
        for (int j = 0; j < n_a; j++)
            if (a[j].down)
                CUDA_CHECK(cudaMemcpyAsync(h + a[j].off, d + a[j].off, a[j].size * k,
                                           cudaMemcpyDeviceToHost, s));
        CUDA_CHECK(cudaStreamSynchronize(s));
        for (int j = 0; j < n_a; j++)
            if (a[j].down) memcpy((char *)a[j].down + a[j].size * i0, h + a[j].off, a[j].size * k);
    }
}

typedef struct {
    const Sampling *smp;
    int with_u; /* u went up: draw with it */
} StatsArg;

static void rows_stats_kernel(CudaBackend *b, RowQuery *d, int k, const void *arg) {
    const StatsArg *sa = (const StatsArg *)arg;
    cuk_rows_stats(b->stream, b->logits, b->dims.vocab, d->rows, k, sa->smp,
                   sa->with_u ? d->u : NULL, b->d_rowq_scratch, d->st);
}

static void cuda_rows_stats(Backend *bb, const int *rows, int n, const Sampling *smp,
                            const double *u, RowStats *out) {
    StatsArg sa = {smp, u != NULL};
    RowqArray a[] = {{rows, NULL, sizeof(int), offsetof(RowQuery, rows)},
                     {u, NULL, sizeof(double), offsetof(RowQuery, u)},
                     {NULL, out, sizeof(RowStats), offsetof(RowQuery, st)}};
    rowq_run((CudaBackend *)bb, n, ROWQ_STATS, a, 3, rows_stats_kernel, &sa);
}

static void rows_gather_kernel(CudaBackend *b, RowQuery *d, int k, const void *arg) {
    cuk_rows_gather(b->stream, b->logits, b->dims.vocab, d->rows, d->ids, k, d->val);
}

static void cuda_rows_gather(Backend *bb, const int *rows, const int *ids, int n, float *out) {
    RowqArray a[] = {{rows, NULL, sizeof(int), offsetof(RowQuery, rows)},
                     {ids, NULL, sizeof(int), offsetof(RowQuery, ids)},
                     {NULL, out, sizeof(float), offsetof(RowQuery, val)}};
    rowq_run((CudaBackend *)bb, n, ROWQ_GATHER, a, 3, rows_gather_kernel, NULL);
}

extern "C" const BackendOps *cuda_backend_ops_get(void) { return &cuda_ops; }
