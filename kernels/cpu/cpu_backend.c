/* CPU backend: the whole transformer forward in f32 activations against weights kept in
 * their stored type (QTensor), llama2.c style. Every buffer lives in a RunState allocated
 * once in create(); forward() never allocates. Matrix products go through the kernel
 * family picked at create() (kernels/cpu/cpu_qmatmul.h: AVX-512, AVX2, scalar, or the f32
 * "ref" path the golden tests hold to transformers' tolerances), split across output rows
 * in chunks the backend's own threads claim; attention (the family's, or the reference
 * loops) is split over (token, head) pairs. A layer is five parallel regions (q|k|v,
 * attention, wo, gate|up, down); the elementwise work that feeds a product (SwiGLU,
 * quantizing the attention and MLP outputs) runs inside the region that produced its
 * input, so only norms, RoPE and residual adds run between them.
 *
 * A row's logits are bitwise the same whatever batch it is computed in (alone, in a
 * prefill chunk, in a masked tree pass) at a given kernel family: every product reduces
 * each output element in an order fixed by the weight row alone (cpu_qmatmul.h), norms
 * and RoPE are per row, and attention walks the entries a row sees in cache order.
 * The per-step operations are kernels/cpu/cpu_ops.c (shared with the CUDA kernel tests). */
#include "kernels/backend_impl.h"
#include "cpu_ops.h"
#include "cpu_qmatmul.h"
#include "cpu_topk.h"
#include "cpu_rowstats.h"
#include "threadpool.h"
#include "kernels/cpu/x86/x4_pack.h"
#include "cpu_backend.h"
#include "kernels/eagle3_layer.h"
#include <math.h>
#include <sched.h>
#include <string.h>

typedef struct {
    float *x;           // (max_batch, dim) residual stream
    float *xb;          // (max_batch, dim) normed input / sublayer output
    float *q;           // (max_batch, n_heads*head_dim)
    float *att_out;     // (max_batch, n_heads*head_dim)
    float *hb;          // (max_batch, hidden_dim) gate, then silu(gate)*up
    float *hb2;         // (max_batch, hidden_dim) up
    float *att;         // (threads, QK_ATT_G, kv_capacity) scores of one run of heads per thread
    float *scratch;     // (threads, max_cols) a dequantized weight row per thread
    QkQ8 *xq;           // (max_batch, max_cols/32) activations quantized for integer weights
    QkQ8 *hq;           // (max_batch, hidden_dim/32) hb quantized for w_down
    QkQ8K *xqk;         // (max_batch, max_cols/256) activations per 256 (x86 K-quant kernels)
    /* The caches hold each KV head's entries contiguously: attention streams one head's
     * rows (with the heads interleaved in every entry it took 27 instead of 23 ns per
     * (entry, head), rootspec-kbench --attn). Elements are f32, or f16 (kv_es 2) when the
     * family reads f16 caches (attn_f16). */
    uint8_t *key_cache;   // (n_layers, n_kv_heads, slots, head_dim), RoPE already applied
    uint8_t *value_cache; // (n_layers, n_kv_heads, slots, head_dim)
    size_t kv_es;         /* bytes per element: 4 or 2 */
    size_t kv_bytes;      /* of each cache (rs_huge_alloc) */
    float *knew, *vnew; // (max_batch, kv_dim) the batch's new k/v rows before kv_store
    float *kv_tmp;      // (2, max_pending, head_dim) staging for kv_commit
    float *inv_freq;    // (head_dim/2) RoPE inverse frequencies (llama3-scaled if asked)
    float *rope_cos;    // (max_batch, head_dim/2)
    float *rope_sin;    // (max_batch, head_dim/2)
    int *pend_idx;      // (max_batch, max_pending) pending entries each new token attends to
    /* The cache slots each new token attends to, in order: att_cnt[t] of them from
     * att_idx + att_off[t]. The rows of a causal segment share one list (each row reads a
     * prefix), so the lists take about the batch's context, not rows x context. */
    int *att_idx;       // (att_cap) grown by forward when a batch needs more
    size_t att_cap;
    size_t *att_off;    // (max_batch)
    int *att_cnt;       // (max_batch) entries of each row's list
    int *row_slot;      // (max_batch) the cache slot of each new token's entry
    uint8_t *keep_seen; // (max_pending) duplicate check in kv_commit
    float *logits;      // (max_kept, vocab) the kept rows of the last forward
    /* EAGLE-3 features, allocated when recording starts (backend_set_feature_layers) */
    float *feat_pend;   // (max_pending, feat_n*dim) of each pending entry
    float *feat_out;    // (max_pending, feat_n*dim) of the last commit's kept entries
    CpuTopkPart *parts; // (max_kept) rows_topk scratch; the fused head's row states
} RunState;

/* A sequence of the shared cache (backend.h: Sequences): entry i lives in slot
 * blocks[i / BACKEND_KV_BLOCK] * BACKEND_KV_BLOCK + i % BACKEND_KV_BLOCK. */
typedef struct {
    int open;
    int nc, np;         /* committed and pending entries */
    int n_blocks;
    int *blocks;        // (blocks_total) the block table
    int *pend_pos;      // (max_pending) position of each pending entry
} CpuSeq;

typedef struct {
    Backend base; /* must stay first: Backend * is cast to CpuBackend * */
    RunState s;
    CpuSeq *seqs;       // (n_seqs); seqs[0] is always open
    int n_seqs;
    int blocks_total, n_free;
    int *free_blocks;   // (blocks_total) a stack of free block ids
    /* The prefix cache (backend.h: Prefix cache): per block, its holders, and when cached
     * the hash chain and tokens it was published under (and the chain before it) and its
     * last use. A cached block no sequence holds is idle: not on the free list, taken back
     * least recently used. */
    int prefix_on, n_idle;
    int *ref;           // (blocks_total) sequences holding the block
    uint8_t *cached;    // (blocks_total)
    uint64_t *hash, *phash, *used; // (blocks_total)
    int *btok;          // (blocks_total, BACKEND_KV_BLOCK)
    uint64_t tick;
    int slots;          /* blocks_total * BACKEND_KV_BLOCK: cache rows per (layer, KV head) */
    int q_dim, kv_dim, max_cols;
    int max_kept; /* min(max_batch, max_pending): a forward's n_out never exceeds it */
    CpuTopkRun topk_run; /* the fused head's reduction (BackendParams.topk_hint) */
    int topk_ready;      /* topk_run holds the kept rows' states */
    uint64_t fused_topk_ns; /* BackendStats.fused_topk_ns */
    const QkFamily *fam;
    ThreadPool *pool;
    double *rows_scratch; // (cpu_rows_scratch) chunk sums of the row queries
} CpuBackend;




/* ---- parallel regions ---- */

/* Up to three products sharing one input (q|k|v): their output rows are one range split
 * evenly across the threads; a region may cover part of it, [r0, r1) (the output head's
 * column tiles). */
typedef struct {
    CpuBackend *b;
    int nm;
    const QTensor *w[3];
    float *y[3];
    int ldy[3];
    QkActs x;
    int r0, r1;
} MmJob;

/* Chunks per thread of a region: threads claim chunks as they come (threadpool.h), so a
 * thread that starts late or runs slow takes fewer; a chunk's rows are fixed by its index. */
#define CHUNKS_PER_THREAD 4

/* Chunks for `items` units of work: one without threads, else up to CHUNKS_PER_THREAD per
 * thread. */
static int region_chunks(const CpuBackend *b, int items) {
    int nth = threadpool_size(b->pool), c = nth == 1 ? 1 : CHUNKS_PER_THREAD * nth;
    return items < c ? (items > 0 ? items : 1) : c;
}

static int mm_rows(const MmJob *j) {
    int total = 0;
    for (int i = 0; i < j->nm; i++) total += j->w[i]->rows;
    return total;
}

/* A chunk boundary of the job's rows, moved down to a whole tile of QK_ROWS rows (x4
 * matrices start at multiples of it) unless it is the end. */
static int mm_edge(const MmJob *j, int share) {
    int r = j->r0 + share;
    return r == j->r1 ? r : (r / QK_ROWS * QK_ROWS > j->r0 ? r / QK_ROWS * QK_ROWS : j->r0);
}

static void mm_task(void *arg, int chunk, int n_chunks, int tid) {
    MmJob *j = arg;
    int lo, hi;
    threadpool_share(j->r1 - j->r0, chunk, n_chunks, &lo, &hi);
    lo = mm_edge(j, lo);
    hi = mm_edge(j, hi);
    float *scratch = j->b->s.scratch + (size_t)tid * j->b->max_cols;
    for (int i = 0, off = 0; i < j->nm; off += j->w[i]->rows, i++) {
        int a = lo > off ? lo - off : 0, z = hi - off < j->w[i]->rows ? hi - off : j->w[i]->rows;
        if (a < z) qk_matmul_rows(j->b->fam, j->w[i], &j->x, j->y[i], j->ldy[i], a, z, scratch);
    }
}

/* The product job y_i (n, w_i->rows) = x (n, in) @ w_i^T for the nm matrices, over all
 * their rows. xq: x already quantized per 32 by the region that made it (NULL: quantized
 * here if a weight wants it); the per-256 form, when a weight wants it, is made here. */
static MmJob mm_job(CpuBackend *b, const float *x, const QkQ8 *xq, int n, int nm,
                    const QTensor *const *w, float *const *y) {
    MmJob j = {.b = b, .nm = nm, .x = {.f32 = x, .q8 = xq, .n = n, .in = w[0]->cols}};
    int acts = 0;
    for (int i = 0; i < nm; i++) {
        RS_ASSERT(w[i]->cols == w[0]->cols);
        j.w[i] = w[i];
        j.y[i] = y[i];
        j.ldy[i] = w[i]->rows;
        acts |= qk_wants_act(b->fam, w[i]->type);
    }
    qk_acts_quantize(b->fam, &j.x, xq ? acts & ~QK_ACT_Q8 : acts, b->s.xq, b->s.xqk);
    j.r1 = mm_rows(&j);
    return j;
}

/* Weight bytes a chunk of a large product takes at most: the threads finish within about
 * one chunk of each other, and the output head's 30 MB in 8 chunks left one thread idle
 * for half of a 3.7 MB chunk. */
#define MM_CHUNK_BYTES (256 << 10)

/* Rows [r0, r1) of the job, on every thread. */
static void mm_run(CpuBackend *b, MmJob *j, int r0, int r1) {
    j->r0 = r0;
    j->r1 = r1;
    int c = region_chunks(b, r1 - r0);
    size_t bytes = (size_t)(r1 - r0) * j->w[0]->row_bytes;
    if (c > 1 && bytes / MM_CHUNK_BYTES > (size_t)c) {
        size_t most = (size_t)(r1 - r0) / QK_ROWS;
        most = most < THREADPOOL_MAX_CHUNKS ? most : THREADPOOL_MAX_CHUNKS;
        c = (int)(bytes / MM_CHUNK_BYTES < most ? bytes / MM_CHUNK_BYTES : most);
    }
    threadpool_run_chunks(b->pool, mm_task, j, c);
}

static void matmul(CpuBackend *b, const float *x, const QkQ8 *xq, int n, int nm,
                   const QTensor *const *w, float *const *y) {
    MmJob j = mm_job(b, x, xq, n, nm, w, y);
    mm_run(b, &j, 0, j.r1);
}

static void matmul1(CpuBackend *b, const float *x, const QkQ8 *xq, int n, const QTensor *w,
                    float *y) {
    matmul(b, x, xq, n, 1, &w, &y);
}

typedef struct {
    CpuBackend *b;
    const uint8_t *kc, *vc; // (n_kv_heads, slots, head_dim) this layer's caches (kv_es)
    int n;
    QkQ8 *oq; // (n, q_dim/32) the output quantized for wo, or NULL
} AttnJob;

/* Softmax attention of heads [h, h + g) of token t, one KV group, over the slots att_idx
 * lists for it: its sequence's committed entries, then the pending ones its mask row
 * allows, in sequence order (the order a row alone would see them in, wherever the
 * blocks lie). */
static void attend(CpuBackend *b, const AttnJob *j, int t, int h, int g, float *att) {
    const Config *c = &b->base.model->cfg;
    RunState *s = &b->s;
    int hd = c->head_dim, qd = b->q_dim;
    size_t off = (size_t)(h / (c->n_heads / c->n_kv_heads)) * b->slots * hd * s->kv_es;
    size_t at = (size_t)t * qd + (size_t)h * hd;
    qk_attention(b->fam, s->kv_es == 2, s->att_out + at, s->q + at, j->kc + off, j->vc + off, hd,
                 0, s->att_idx + s->att_off[t], s->att_cnt[t], hd, g, att);
}

/* (token, head) items [lo, hi) of the chunk, as runs of heads that share a KV group: a
 * run reads its cache rows once (QkAttnFn), and a head's output does not depend on its
 * run. */
static void attn_task(void *arg, int chunk, int n_chunks, int tid) {
    AttnJob *j = arg;
    const Config *c = &j->b->base.model->cfg;
    int nh = c->n_heads, group = nh / c->n_kv_heads, lo, hi;
    threadpool_share(j->n * nh, chunk, n_chunks, &lo, &hi);
    float *att = j->b->s.att + (size_t)tid * QK_ATT_G * j->b->base.params.kv_capacity;
    int hd = c->head_dim, qd = j->b->q_dim;
    for (int i = lo, g; i < hi; i += g) {
        int t = i / nh, h = i % nh, end = (h / group + 1) * group; /* the group's end */
        g = (end < nh ? end : nh) - h;
        g = g < hi - i ? g : hi - i;
        g = g < QK_ATT_G ? g : QK_ATT_G;
        attend(j->b, j, t, h, g, att);
        /* whole blocks of these heads (hd % 32 == 0 when oq is set): wo's input needs no
         * serial quantization between the regions */
        size_t at = (size_t)t * qd + (size_t)h * hd;
        if (j->oq) qk_quantize(j->b->fam, j->b->s.att_out + at, 1, g * hd, j->oq + at / QK_BLOCK);
    }
}

/* Chunks of the attention region: a chunk is a contiguous run of (token, head) items, so
 * chunks of about two KV groups keep a group's heads in one call; at least one chunk per
 * thread, at most region_chunks' count. */
static int attn_chunks(const CpuBackend *b, int n) {
    const Config *c = &b->base.model->cfg;
    int items = n * c->n_heads, group = c->n_heads / c->n_kv_heads;
    int nth = threadpool_size(b->pool), want = items / (2 * group);
    want = want > nth ? want : nth;
    int most = region_chunks(b, items);
    return want < most ? want : most;
}

/* W_gate and W_up over one hidden range per thread (whole Q8 blocks), then SwiGLU on it
 * and, when W_down takes Q8, its quantization: the MLP's elementwise work runs inside the
 * parallel region instead of between two. */
typedef struct {
    CpuBackend *b;
    const LayerWeights *L;
    QkActs x;
    QkQ8 *hq; // (n, hidden/32) or NULL
} UpJob;

/* Units of up_task's split: whole Q8 blocks of the hidden vector when it has them. */
static int up_unit(const CpuBackend *b) {
    return b->base.model->cfg.hidden_dim % QK_BLOCK ? 1 : QK_BLOCK;
}

static void up_task(void *arg, int chunk, int n_chunks, int tid) {
    UpJob *j = arg;
    RunState *s = &j->b->s;
    int hidden = j->b->base.model->cfg.hidden_dim, g = up_unit(j->b), lo, hi;
    threadpool_share(hidden / g, chunk, n_chunks, &lo, &hi);
    lo *= g;
    hi *= g;
    if (lo == hi) return;
    float *scratch = s->scratch + (size_t)tid * j->b->max_cols;
    qk_matmul_rows(j->b->fam, &j->L->w_gate, &j->x, s->hb, hidden, lo, hi, scratch);
    qk_matmul_rows(j->b->fam, &j->L->w_up, &j->x, s->hb2, hidden, lo, hi, scratch);
    for (int t = 0; t < j->x.n; t++) {
        float *h = s->hb + (size_t)t * hidden + lo;
        qk_swiglu(j->b->fam, h, s->hb2 + (size_t)t * hidden + lo, hi - lo);
        if (j->hq)
            qk_quantize(j->b->fam, h, 1, hi - lo, j->hq + ((size_t)t * hidden + lo) / QK_BLOCK);
    }
}

static void cpu_destroy(Backend **pb);

/* Threads for bp->threads == 0: the CPUs this process may run on. */
static int default_threads(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    return 1;
}

static int cpu_check(const Model *m, const BackendParams *bp, RsErr *e) {
    const Config *c = &m->cfg;
    if (bp->kv_capacity <= 0 || bp->max_batch <= 0 || bp->max_pending <= 0)
        return rs_err(e, RS_EINVAL,
                      "backend sizes must be positive (kv_capacity %d, max_batch %d, "
                      "max_pending %d)",
                      bp->kv_capacity, bp->max_batch, bp->max_pending);
    if (c->head_dim % 2 || c->n_heads % c->n_kv_heads)
        return rs_err(e, RS_EUNSUPPORTED, "head_dim %d must be even and n_heads %d a multiple "
                      "of n_kv_heads %d", c->head_dim, c->n_heads, c->n_kv_heads);
    if (m->random_weights && !m->arena)
        return rs_err(e, RS_EINVAL, "random model '%s' has no host weights (load it with "
                      "backend_model_load)", m->path);
    if (bp->threads < 0 || bp->threads > 1024)
        return rs_err(e, RS_EINVAL, "CPU threads %d outside [0, 1024]", bp->threads);
    return RS_OK;
}

static void alloc_state(CpuBackend *b, const Config *c, const BackendParams *bp, int nth) {
    size_t B = (size_t)bp->max_batch, cap = (size_t)bp->kv_capacity, P = (size_t)bp->max_pending;
    size_t half = (size_t)c->head_dim / 2, mc = (size_t)b->max_cols;
    RunState *s = &b->s;
    /* the activation rows the products and the elementwise kernels load */
    s->x = rs_xcalloc_lines(B * c->dim, sizeof(float));
    s->xb = rs_xcalloc_lines(B * c->dim, sizeof(float));
    s->q = rs_xcalloc_lines(B * b->q_dim, sizeof(float));
    s->att_out = rs_xcalloc_lines(B * b->q_dim, sizeof(float));
    s->hb = rs_xcalloc_lines(B * c->hidden_dim, sizeof(float));
    s->hb2 = rs_xcalloc_lines(B * c->hidden_dim, sizeof(float));
    s->att = rs_xcalloc((size_t)nth * QK_ATT_G * cap, sizeof(float));
    s->scratch = rs_xcalloc((size_t)nth * mc, sizeof(float));
    s->xq = rs_xcalloc(B * (mc / QK_BLOCK + 1), sizeof(QkQ8));
    s->hq = rs_xcalloc(B * ((size_t)c->hidden_dim / QK_BLOCK + 1), sizeof(QkQ8));
    s->xqk = rs_xcalloc(B * (mc / QK_K + 1), sizeof(QkQ8K));
    s->kv_tmp = rs_xcalloc(2 * P * (size_t)c->head_dim, sizeof(float)); /* either kv_es */
    s->knew = rs_xcalloc(B * b->kv_dim, sizeof(float));
    s->vnew = rs_xcalloc(B * b->kv_dim, sizeof(float));
    s->inv_freq = rs_xcalloc(half, sizeof(float));
    s->rope_cos = rs_xcalloc(B * half, sizeof(float));
    s->rope_sin = rs_xcalloc(B * half, sizeof(float));
    s->pend_idx = rs_xcalloc(B * P, sizeof(int));
    s->att_off = rs_xcalloc(B, sizeof(size_t));
    s->att_cnt = rs_xcalloc(B, sizeof(int));
    s->row_slot = rs_xcalloc(B, sizeof(int));
    s->keep_seen = rs_xcalloc(P, 1);
    s->logits = rs_xcalloc((size_t)b->max_kept * c->vocab_size, sizeof(float));
    s->parts = rs_xcalloc((size_t)b->max_kept, sizeof(CpuTopkPart));
}

/* The sequences and the block free list; sets slots, which sizes the caches. */
static void alloc_seqs(CpuBackend *b, const BackendParams *bp) {
    b->blocks_total = backend_kv_blocks_for(bp->kv_capacity);
    b->slots = b->blocks_total * BACKEND_KV_BLOCK;
    b->free_blocks = rs_xcalloc((size_t)b->blocks_total, sizeof(int));
    /* a stack: the lowest block ids go first */
    for (int i = 0; i < b->blocks_total; i++) b->free_blocks[i] = b->blocks_total - 1 - i;
    b->n_free = b->blocks_total;
    b->seqs = rs_xcalloc((size_t)b->n_seqs, sizeof(CpuSeq));
    for (int i = 0; i < b->n_seqs; i++) {
        b->seqs[i].blocks = rs_xcalloc((size_t)b->blocks_total, sizeof(int));
        b->seqs[i].pend_pos = rs_xcalloc((size_t)bp->max_pending, sizeof(int));
    }
    b->seqs[0].open = 1;
    b->prefix_on = bp->prefix_cache != 0;
    b->ref = rs_xcalloc((size_t)b->blocks_total, sizeof(int));
    b->cached = rs_xcalloc((size_t)b->blocks_total, 1);
    b->hash = rs_xcalloc((size_t)b->blocks_total, sizeof(uint64_t));
    b->phash = rs_xcalloc((size_t)b->blocks_total, sizeof(uint64_t));
    b->used = rs_xcalloc((size_t)b->blocks_total, sizeof(uint64_t));
    b->btok = rs_xcalloc((size_t)b->blocks_total * BACKEND_KV_BLOCK, sizeof(int));
}

static int cpu_create(const Model *m, const BackendParams *bp, Backend **out, RsErr *e) {
    *out = NULL;
    const Config *c = &m->cfg;
    int rc = cpu_check(m, bp, e);
    if (rc) return rc;
    const QkFamily *fam = qk_family_pick(bp->cpu_kernels, e);
    if (!fam) return e ? e->code : RS_EINVAL;
    CpuBackend *b = rs_xcalloc(1, sizeof *b);
    b->base.ops = &cpu_backend_ops;
    b->base.model = m;
    b->base.params = *bp;
    b->fam = fam;
    ModelDims d = model_dims(c);
    b->q_dim = d.qd;
    b->kv_dim = d.kvd;
    int mc = c->dim > c->hidden_dim ? c->dim : c->hidden_dim;
    b->max_cols = mc > b->q_dim ? mc : b->q_dim;
    int nth = bp->threads > 0 ? bp->threads : default_threads();
    b->n_seqs = bp->max_seqs > 1 ? bp->max_seqs : 1;
    /* one sequence forwards at most max_pending rows; several fill max_batch */
    b->max_kept = bp->max_batch < bp->max_pending || b->n_seqs > 1 ? bp->max_batch : bp->max_pending;
    alloc_state(b, c, bp, nth);
    alloc_seqs(b, bp);
    /* The KV cache grows with --ctx: a size the host cannot hold is an error, not an abort. */
    RunState *s = &b->s;
    size_t kv_n = (size_t)c->n_layers * b->slots * b->kv_dim;
    /* f16 where the family reads it; sw.cpu_kv_f32 keeps f32 (the golden tests hold the
     * f32 caches to tighter bounds) */
    s->kv_es = qk_kv_f16(fam, c->head_dim, bp->sw.cpu_kv_f32) ? 2 : sizeof(float);
    s->kv_bytes = kv_n * s->kv_es; /* huge pages: attention streams it (util.h) */
    s->key_cache = rs_huge_alloc(s->kv_bytes);
    s->value_cache = s->key_cache ? rs_huge_alloc(s->kv_bytes) : NULL;
    Backend *bb = &b->base;
    if (!s->value_cache) {
        cpu_destroy(&bb);
        return rs_err(e, RS_ENOMEM,
                      "cannot allocate the KV cache: %d entries x %d layers need %zu MiB "
                      "(lower --ctx)",
                      bp->kv_capacity, c->n_layers, 2 * s->kv_bytes >> 20);
    }
    /* The cache is backed now, at creation: a block's entries lie in every layer's and KV
     * head's region, so the first prompt (a server's first burst) would otherwise take the
     * page faults (each zeroing a 2 MiB page) inside its passes. */
    rs_huge_touch(s->key_cache, s->kv_bytes);
    rs_huge_touch(s->value_cache, s->kv_bytes);
    /* Workers are pinned to their cores, except in a backend many sequences share: its
     * process runs a thread for each of them beside the passes (a server's), and a pinned
     * worker would wait out whatever else runs on its core while the pass waits for it. */
    int pin = !bp->sw.cpu_unpinned && b->n_seqs <= 1;
    if ((rc = threadpool_create(nth, pin, &b->pool, e))) {
        cpu_destroy(&bb);
        return rc;
    }
    rope_inv_freq(c, s->inv_freq);
    b->rows_scratch = rs_xmalloc(sizeof(double) * cpu_rows_scratch(c->vocab_size, nth));
    *out = bb;
    return RS_OK;
}

const char *cpu_backend_kernels(const Backend *bb) {
    RS_ASSERT(bb && bb->ops == &cpu_backend_ops);
    return ((const CpuBackend *)bb)->fam->name;
}

const char *cpu_backend_kv(const Backend *bb) {
    RS_ASSERT(bb && bb->ops == &cpu_backend_ops);
    return ((const CpuBackend *)bb)->s.kv_es == 2 ? "f16" : "f32";
}

int cpu_backend_threads(const Backend *bb) {
    RS_ASSERT(bb && bb->ops == &cpu_backend_ops);
    return threadpool_size(((const CpuBackend *)bb)->pool);
}

static void cpu_destroy(Backend **pb) {
    if (!pb || !*pb) return;
    CpuBackend *b = (CpuBackend *)*pb;
    RunState *s = &b->s;
    threadpool_destroy(&b->pool);
    for (int i = 0; i < b->n_seqs && b->seqs; i++) {
        free(b->seqs[i].blocks);
        free(b->seqs[i].pend_pos);
    }
    void *bufs[] = {s->x,       s->xb,       s->q,           s->att_out,  s->hb,
                    s->hb2,     s->att,      s->scratch,     s->xq,       s->hq,  s->xqk,
                    s->kv_tmp, s->knew, s->vnew, s->inv_freq,  s->rope_cos, s->rope_sin,
                    s->att_idx, s->att_off, s->att_cnt,  s->keep_seen, s->pend_idx, s->row_slot, s->logits,
                    b->seqs, b->free_blocks, b->ref, b->cached, b->hash, b->phash, b->used, b->btok,
                    s->feat_pend, s->feat_out, s->parts,
                    b->rows_scratch};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    rs_huge_free(s->key_cache, s->kv_bytes);
    rs_huge_free(s->value_cache, s->kv_bytes);
    free(b);
    *pb = NULL;
}

/* ---- sequences and their blocks ---- */

static size_t seq_slot(const CpuSeq *q, int i) {
    return (size_t)q->blocks[i / BACKEND_KV_BLOCK] * BACKEND_KV_BLOCK + i % BACKEND_KV_BLOCK;
}

/* Blocks sequence q lacks for `entries` entries. */
static int seq_short(const CpuSeq *q, int entries) {
    int need = backend_kv_blocks_for(entries) - q->n_blocks;
    return need > 0 ? need : 0;
}

/* A free block, else the least recently used idle one (its cache entry dropped). */
static int block_take(CpuBackend *b) {
    int blk = -1;
    if (b->n_free > 0) {
        blk = b->free_blocks[--b->n_free];
    } else {
        for (int i = 0; i < b->blocks_total; i++)
            if (b->cached[i] && !b->ref[i] && (blk < 0 || b->used[i] < b->used[blk])) blk = i;
        RS_ASSERT(blk >= 0);
        b->cached[blk] = 0;
        b->n_idle--;
    }
    b->ref[blk] = 1;
    return blk;
}

static void block_release(CpuBackend *b, int blk) {
    RS_ASSERT(b->ref[blk] > 0);
    if (--b->ref[blk]) return;
    if (b->cached[blk]) {
        b->n_idle++;
        b->used[blk] = ++b->tick;
    } else {
        b->free_blocks[b->n_free++] = blk;
    }
}

static void seq_grow(CpuBackend *b, CpuSeq *q, int entries) {
    for (int k = seq_short(q, entries); k > 0; k--) q->blocks[q->n_blocks++] = block_take(b);
}

/* Gives back the blocks past `entries` entries. */
static void seq_shrink(CpuBackend *b, CpuSeq *q, int entries) {
    int keep = backend_kv_blocks_for(entries);
    while (q->n_blocks > keep) block_release(b, q->blocks[--q->n_blocks]);
}

/* Keeps the head's counters equal to sequence 0's (the single-sequence functions). */
static void seq0_sync(CpuBackend *b) {
    b->base.n_committed = b->seqs[0].nc;
    b->base.n_pending = b->seqs[0].np;
}

/* Orders a row's pending entries by position (stable): a tree row then sums its ancestors
 * in sequence order, as a causal prefill of its path does, even when the batch lists a
 * child before its parent. */
static void sort_by_position(const CpuSeq *q, int *idx, int cnt) {
    for (int i = 1; i < cnt; i++) {
        int v = idx[i], k = i;
        for (; k > 0 && q->pend_pos[idx[k - 1]] > q->pend_pos[v]; k--) idx[k] = idx[k - 1];
        idx[k] = v;
    }
}

/* 1 when the rows of segment g share one slot list: no mask, and every new row's position
 * at least that of each entry before it, so row t's entries in position order are a prefix
 * of the last row's. */
static int seg_shared(const CpuSeq *q, const BackendSeg *g) {
    if (g->mask) return 0;
    int mx = 0;
    for (int i = 0; i < q->np; i++) mx = q->pend_pos[i] > mx ? q->pend_pos[i] : mx;
    for (int t = 0; t < g->n; t++) {
        if (g->pos[t] < mx) return 0;
        mx = g->pos[t];
    }
    return 1;
}

/* List entries the segment's rows need (before its forward changes the sequence). */
static size_t seg_list_size(const CpuSeq *q, const BackendSeg *g) {
    size_t all = (size_t)q->nc + q->np + g->n;
    return seg_shared(q, g) ? all : all * g->n;
}

/* Slots rows [r0, r0 + g->n) see (their sequence's committed entries, then the pending
 * ones their mask rows allow, by position), from list entry *at on, and the slot each
 * writes. */
static void seg_index(CpuBackend *b, const BackendSeg *g, int r0, size_t *at) {
    RunState *s = &b->s;
    CpuSeq *q = &b->seqs[g->seq];
    int P = b->base.params.max_pending, shared = seg_shared(q, g);
    int *pidx = s->pend_idx + (size_t)r0 * P;
    cpu_attention_index(g->mask, g->n, q->np, P, pidx, s->att_cnt + r0);
    for (int t = 0; t < g->n; t++) q->pend_pos[q->np + t] = g->pos[t];
    for (int t = shared ? g->n - 1 : 0; t < g->n; t++) { /* shared: the last row's list */
        int *pi = pidx + (size_t)t * P, cnt = s->att_cnt[r0 + t], *ai = s->att_idx + *at;
        sort_by_position(q, pi, cnt);
        for (int j = 0; j < q->nc; j++) ai[j] = (int)seq_slot(q, j);
        for (int j = 0; j < cnt; j++) ai[q->nc + j] = (int)seq_slot(q, q->nc + pi[j]);
        s->att_off[r0 + t] = *at;
        if (!shared) *at += (size_t)q->nc + cnt;
    }
    for (int t = 0; t < g->n; t++) {
        if (shared) s->att_off[r0 + t] = *at;
        s->att_cnt[r0 + t] += q->nc;
        s->row_slot[r0 + t] = (int)seq_slot(q, q->nc + q->np + t);
        RS_ASSERT(b->ref[s->row_slot[r0 + t] / BACKEND_KV_BLOCK] == 1); /* never a shared one */
    }
    if (shared) *at += (size_t)q->nc + q->np + g->n;
}

/* Room for the batch's slot lists; RS_ENOMEM (nothing changed) when it cannot grow. */
static int att_reserve(CpuBackend *b, const BackendSeg *segs, int n_segs, RsErr *e) {
    size_t need = 0;
    for (int i = 0; i < n_segs; i++) need += seg_list_size(&b->seqs[segs[i].seq], &segs[i]);
    if (need <= b->s.att_cap) return RS_OK;
    int *p = realloc(b->s.att_idx, need * sizeof(int));
    if (!p)
        return rs_err(e, RS_ENOMEM, "cannot allocate the attention lists of a batch (%zu MiB)",
                      need * sizeof(int) >> 20);
    b->s.att_idx = p;
    b->s.att_cap = need;
    return RS_OK;
}

/* Per-batch tables shared by all layers: the slots each token sees and writes, cos/sin
 * per token (angle = float32(pos) * inv_freq in float32, as transformers), and the
 * embeddings. */
static void fwd_prepare(CpuBackend *b, const BackendSeg *segs, int n_segs) {
    const Config *c = &b->base.model->cfg;
    RunState *s = &b->s;
    size_t at = 0;
    for (int i = 0, r0 = 0; i < n_segs; r0 += segs[i].n, i++) {
        const BackendSeg *g = &segs[i];
        CpuSeq *q = &b->seqs[g->seq];
        seq_grow(b, q, q->nc + q->np + g->n);
        seg_index(b, g, r0, &at);
        cpu_rope_table(g->pos, s->inv_freq, g->n, c->head_dim / 2,
                       s->rope_cos + (size_t)r0 * (c->head_dim / 2),
                       s->rope_sin + (size_t)r0 * (c->head_dim / 2));
        /* the embeddings in their stored type: cpu_embed takes an f32 table */
        for (int t = 0; t < g->n; t++)
            qtensor_dequantize_rows(&b->base.model->w.tok_embeddings, g->tokens[t], 1,
                                    s->x + (size_t)(r0 + t) * c->dim);
    }
}

/* Biases, q/k norms and RoPE of the batch's new q and k rows [t0, t1). */
static void fwd_qk_post(CpuBackend *b, const LayerWeights *L, float *knew, float *vnew, int t0,
                        int t1) {
    const Config *c = &b->base.model->cfg;
    RunState *s = &b->s;
    int hd = c->head_dim, half = hd / 2, qd = b->q_dim, kvd = b->kv_dim;
    for (int t = t0; t < t1; t++) {
        float *qt = s->q + (size_t)t * qd, *kt = knew + (size_t)t * kvd;
        float *vt = vnew + (size_t)t * kvd;
        if (L->bq) cpu_bias_add(qt, L->bq, qd);
        if (L->bk) cpu_bias_add(kt, L->bk, kvd);
        if (L->bv) cpu_bias_add(vt, L->bv, kvd);
        const float *cs = s->rope_cos + (size_t)t * half, *sn = s->rope_sin + (size_t)t * half;
        for (int h = 0; h < c->n_heads; h++) {
            if (L->q_norm)
                qk_rmsnorm(b->fam, qt + h * hd, qt + h * hd, L->q_norm, hd, c->norm_eps);
            cpu_rope(qt + h * hd, cs, sn, half);
        }
        for (int h = 0; h < c->n_kv_heads; h++) {
            if (L->k_norm)
                qk_rmsnorm(b->fam, kt + h * hd, kt + h * hd, L->k_norm, hd, c->norm_eps);
            cpu_rope(kt + h * hd, cs, sn, half);
        }
    }
}

/* Rows [t0, t1) of x (n, kv_dim) into their slots (row_slot) of a layer's cache
 * (n_kv_heads, slots, head_dim), converted to f16 for an f16 cache. */
static void kv_store(const CpuBackend *b, uint8_t *cache, const float *x, int t0, int t1) {
    int hd = b->base.model->cfg.head_dim, cap = b->slots;
    size_t es = b->s.kv_es;
    for (int h = 0; h < b->base.model->cfg.n_kv_heads; h++)
        for (int t = t0; t < t1; t++) {
            uint8_t *dst = cache + ((size_t)h * cap + b->s.row_slot[t]) * hd * es;
            const float *src = x + (size_t)t * b->kv_dim + h * hd;
            if (es == 2) b->fam->to_f16((uint16_t *)(void *)dst, src, hd);
            else memcpy(dst, src, sizeof(float) * hd);
        }
}

/* EAGLE-3 features: the residual stream of the batch's rows, as it enters layer l (l ==
 * n_layers: the last layer's output), into the pending entries' feature rows. */
static void feat_record(CpuBackend *b, int l, int n) {
    const Backend *bb = &b->base;
    int dim = bb->model->cfg.dim, W = bb->feat_n * dim;
    for (int k = 0; k < bb->feat_n; k++) {
        if (bb->feat_layers[k] != l) continue;
        float *dst = b->s.feat_pend + (size_t)bb->n_pending * W + (size_t)k * dim;
        for (int t = 0; t < n; t++)
            memcpy(dst + (size_t)t * W, b->s.x + (size_t)t * dim, sizeof(float) * (size_t)dim);
    }
}

/* ---- row regions: the per-row steps between the products ----
 * Each row's operations are the serial loops' (a row depends on itself only), so a region
 * gives the same bits however its rows are split; it spares the other threads waiting
 * through those steps. Fewer than ROWS_PARALLEL rows run inline: a region's start and end
 * cost more than the steps of a row or two. */
#define ROWS_PARALLEL 4

/* Rows [0, n) through fn(arg, chunk, n_chunks, tid), chunks of whole rows. */
static void rows_run(CpuBackend *b, TpChunkFn fn, void *arg, int n) {
    if (n < ROWS_PARALLEL) fn(arg, 0, 1, 0);
    else threadpool_run_chunks(b->pool, fn, arg, region_chunks(b, n));
}

/* A layer half's entry: x += add (the previous half's output; NULL: none), xb =
 * rmsnorm(x) and, with q8, xb quantized per 32 for the products that take it. */
typedef struct {
    CpuBackend *b;
    const float *add, *norm;
    QkQ8 *q8;
    int n;
} NormJob;

static void norm_task(void *arg, int chunk, int n_chunks, int tid) {
    NormJob *j = arg;
    const Config *c = &j->b->base.model->cfg;
    RunState *s = &j->b->s;
    int dim = c->dim, lo, hi;
    (void)tid;
    threadpool_share(j->n, chunk, n_chunks, &lo, &hi);
    for (int t = lo; t < hi; t++) {
        float *x = s->x + (size_t)t * dim, *xb = s->xb + (size_t)t * dim;
        if (j->add) cpu_residual_add(x, j->add + (size_t)t * dim, (size_t)dim);
        qk_rmsnorm(j->b->fam, xb, x, j->norm, dim, c->norm_eps);
        if (j->q8) qk_quantize(j->b->fam, xb, 1, dim, j->q8 + (size_t)t * (dim / QK_BLOCK));
    }
}

/* x += add; xb = rmsnorm(x) with weights norm for the n rows; returns xb quantized per 32
 * when one of the nw products wants it (else NULL: they take xb as it is). */
static const QkQ8 *norm_rows(CpuBackend *b, const float *add, const float *norm, int n,
                             const QTensor *const *w, int nw) {
    int acts = 0;
    NormJob j = {b, add, norm, NULL, n};
    for (int i = 0; i < nw; i++) acts |= qk_wants_act(b->fam, w[i]->type);
    if ((acts & QK_ACT_Q8) && b->base.model->cfg.dim % QK_BLOCK == 0) j.q8 = b->s.xq;
    rows_run(b, norm_task, &j, n);
    return j.q8;
}

/* The new q / k rows' post steps and both caches' stores (the attention reads them). */
typedef struct {
    CpuBackend *b;
    const LayerWeights *L;
    uint8_t *kc, *vc;
    int n;
} QkPostJob;

static void qk_post_task(void *arg, int chunk, int n_chunks, int tid) {
    QkPostJob *j = arg;
    RunState *s = &j->b->s;
    int lo, hi;
    (void)tid;
    threadpool_share(j->n, chunk, n_chunks, &lo, &hi);
    fwd_qk_post(j->b, j->L, s->knew, s->vnew, lo, hi);
    kv_store(j->b, j->kc, s->knew, lo, hi);
    kv_store(j->b, j->vc, s->vnew, lo, hi);
}

/* x += add (the previous layer's MLP output, NULL for the first), then x += Wo
 * attention(rmsnorm(x)) for layer l, Wo's output left in xb for the MLP to add; new k/v
 * rows land in the cache. */
static void fwd_attention(CpuBackend *b, int l, int n, const float *add) {
    const Config *c = &b->base.model->cfg;
    const LayerWeights *L = &b->base.model->w.layers[l];
    RunState *s = &b->s;
    int kvd = b->kv_dim;
    size_t layer = (size_t)l * b->slots * kvd * s->kv_es;
    uint8_t *kc = s->key_cache + layer;   // (n_kv_heads, slots, head_dim)
    uint8_t *vc = s->value_cache + layer; // (n_kv_heads, slots, head_dim)
    const QTensor *w[3] = {&L->wq, &L->wk, &L->wv};
    float *y[3] = {s->q, s->knew, s->vnew};
    const QkQ8 *xq = norm_rows(b, add, L->attn_norm, n, w, 3);
    if (b->base.feat_n) feat_record(b, l, n); /* x as it enters layer l */
    matmul(b, s->xb, xq, n, 3, w, y);
    QkPostJob pj = {b, L, kc, vc, n};
    rows_run(b, qk_post_task, &pj, n);
    int oq = qk_wants_act(b->fam, L->wo.type) == QK_ACT_Q8 && c->head_dim % QK_BLOCK == 0;
    AttnJob aj = {b, kc, vc, n, oq ? s->xq : NULL};
    threadpool_run_chunks(b->pool, attn_task, &aj, attn_chunks(b, n));
    matmul1(b, s->att_out, aj.oq, n, &L->wo, s->xb);
}

/* x += the attention's output (xb), then xb = W_down (silu(W_gate h) * W_up h), h =
 * rmsnorm(x): the SwiGLU MLP of layer l, its output left in xb for the next layer (or the
 * head) to add. */
static void fwd_mlp(CpuBackend *b, int l, int n) {
    const Config *c = &b->base.model->cfg;
    const LayerWeights *L = &b->base.model->w.layers[l];
    RunState *s = &b->s;
    const QTensor *w[2] = {&L->w_gate, &L->w_up};
    int acts = qk_wants_act(b->fam, L->w_gate.type) | qk_wants_act(b->fam, L->w_up.type);
    UpJob uj = {b, L, {.f32 = s->xb, .n = n, .in = c->dim}, NULL};
    uj.x.q8 = norm_rows(b, s->xb, L->ffn_norm, n, w, 2);
    qk_acts_quantize(b->fam, &uj.x, uj.x.q8 ? acts & ~QK_ACT_Q8 : acts, s->xq, s->xqk);
    if (qk_wants_act(b->fam, L->w_down.type) == QK_ACT_Q8) uj.hq = s->hq;
    threadpool_run_chunks(b->pool, up_task, &uj, region_chunks(b, c->hidden_dim / up_unit(b)));
    matmul1(b, s->hb, uj.hq, n, &L->w_down, s->xb);
}

static int cpu_set_features(Backend *bb, RsErr *e) {
    CpuBackend *b = (CpuBackend *)bb;
    free(b->s.feat_pend);
    free(b->s.feat_out);
    b->s.feat_pend = b->s.feat_out = NULL;
    if (!bb->feat_n) return RS_OK;
    size_t n = (size_t)bb->params.max_pending * bb->feat_n * bb->model->cfg.dim;
    b->s.feat_pend = calloc(n, sizeof(float));
    b->s.feat_out = b->s.feat_pend ? calloc(n, sizeof(float)) : NULL;
    if (!b->s.feat_out) {
        free(b->s.feat_pend);
        b->s.feat_pend = NULL;
        return rs_err(e, RS_ENOMEM, "cannot allocate feature rows (2 x %zu floats)", n);
    }
    return RS_OK;
}

static const void *cpu_read_features(Backend *bb, BackendFeatType *t) {
    *t = BACKEND_FEAT_F32;
    return ((CpuBackend *)bb)->s.feat_out;
}

/* ---- the output head with the drafter's top-k (BackendParams.topk_hint) ---- */

/* The head over the n normed rows in s.xb, a tile of columns at a time, each tile reduced
 * (cpu_topk_feed) while its logits are still in cache: 1024 columns a thread (measured on
 * the default model: 2048 to 6528 at one thread left more of them to be read back from
 * memory), at least 64 KB of logits (few rows: fewer thread-pool rounds). */
static void head_topk(CpuBackend *b, int n) {
    RunState *s = &b->s;
    const QTensor *w = &b->base.model->w.wcls;
    MmJob j = mm_job(b, s->xb, NULL, n, 1, &w, &s->logits);
    int V = w->rows, tile = 1024 * threadpool_size(b->pool);
    if (tile < 16384 / n) tile = 16384 / n;
    tile = tile / CPU_TOPK_BLOCK * CPU_TOPK_BLOCK;
    b->topk_run = cpu_topk_begin(s->parts, n, V, b->base.params.topk_hint);
    for (int c0 = 0, c1; c0 < V; c0 = c1) {
        c1 = V - c0 < tile ? V : c0 + tile;
        mm_run(b, &j, c0, c1);
        uint64_t t0 = rs_now_ns();
        cpu_topk_feed(b->pool, &b->topk_run, s->logits, V, c0, c1);
        b->fused_topk_ns += rs_now_ns() - t0;
    }
    b->topk_ready = 1;
}

/* Blocks the batch needs beyond those its sequences hold. */
static int batch_short(const CpuBackend *b, const BackendSeg *segs, int n_segs) {
    int need = 0;
    for (int i = 0; i < n_segs; i++) {
        const CpuSeq *q = &b->seqs[segs[i].seq];
        need += seq_short(q, q->nc + q->np + segs[i].n);
    }
    return need;
}

/* A pass stopped between layers (backend_set_stop): the rows it wrote lie past the
 * pending entries, which stay as they were, as do the kept rows; the blocks taken for it
 * go back. */
static int fwd_stop(CpuBackend *b, const BackendSeg *segs, int n_segs) {
    for (int i = 0; i < n_segs; i++) {
        CpuSeq *q = &b->seqs[segs[i].seq];
        seq_shrink(b, q, q->nc + q->np);
    }
    return RS_ESTOPPED;
}

/* The whole forward over checked segments (backend_forward_batch). */
static int cpu_forward_batch(Backend *bb, const BackendSeg *segs, int n_segs,
                             const int *out_rows, int n_out, float *logits, RsErr *e) {
    CpuBackend *b = (CpuBackend *)bb;
    const Model *m = bb->model;
    const Config *c = &m->cfg;
    RunState *s = &b->s;
    int n = 0, need = batch_short(b, segs, n_segs);
    for (int i = 0; i < n_segs; i++) n += segs[i].n;
    RS_ASSERT(n_out <= 0 || out_rows);
    if (bb->feat_n && (n_segs > 1 || segs[0].seq != 0))
        return rs_err(e, RS_EUNSUPPORTED, "EAGLE-3 features are recorded for sequence 0 only");
    if (need > b->n_free + b->n_idle)
        return rs_err(e, RS_EFULL, "the batch needs %d more KV blocks; %d of %d are free", need,
                      b->n_free + b->n_idle, b->blocks_total);
    int rc = att_reserve(b, segs, n_segs, e);
    if (rc) return rc;
    fwd_prepare(b, segs, n_segs);
    for (int l = 0; l < c->n_layers; l++) {
        if ((rc = backend_stopped(bb, e))) return fwd_stop(b, segs, n_segs);
        fwd_attention(b, l, n, l ? s->xb : NULL);
        fwd_mlp(b, l, n);
    }
    cpu_residual_add(s->x, s->xb, (size_t)n * c->dim); /* the last MLP's output */
    if (bb->feat_n) feat_record(b, c->n_layers, n);
    /* Final norm and head only for the requested rows. */
    for (int r = 0; r < n_out; r++)
        qk_rmsnorm(b->fam, s->xb + (size_t)r * c->dim, s->x + (size_t)out_rows[r] * c->dim,
                m->w.final_norm, c->dim, c->norm_eps);
    /* The head writes the kept rows; a caller's buffer gets a copy of them. */
    RS_ASSERT(n_out <= b->max_kept);
    b->topk_ready = 0;
    if (n_out > 0 && bb->params.topk_hint) head_topk(b, n_out);
    else if (n_out > 0) matmul1(b, s->xb, NULL, n_out, &m->w.wcls, s->logits);
    if (n_out > 0 && logits)
        memcpy(logits, s->logits, (size_t)n_out * c->vocab_size * sizeof(float));
    for (int i = 0; i < n_segs; i++) b->seqs[segs[i].seq].np += segs[i].n;
    seq0_sync(b);
    return RS_OK;
}

static int cpu_forward(Backend *bb, const int *tokens, const int *pos, int n,
                       const uint8_t *mask, const int *out_rows, int n_out, float *logits,
                       RsErr *e) {
    RS_ASSERT(tokens && pos && (n_out <= 0 || out_rows));
    int rc = backend_check_forward(bb, tokens, pos, n, mask, out_rows, n_out, e);
    if (rc) return rc;
    BackendSeg g = {0, tokens, pos, n, mask};
    return cpu_forward_batch(bb, &g, 1, out_rows, n_out, logits, e);
}

/* Moves sequence q's pending entries keep[i] to its entry nc + i in every (layer, KV
 * head). Staged through kv_tmp because keep need not be ascending (in place could
 * clobber). */
static void kv_compact(CpuBackend *b, const CpuSeq *q, const int *keep, int n_keep) {
    RunState *s = &b->s;
    const Config *c = &b->base.model->cfg;
    int nc = q->nc, hd = c->head_dim, cap = b->slots;
    size_t row = (size_t)hd * s->kv_es;
    uint8_t *tk = (uint8_t *)s->kv_tmp, *tv = tk + (size_t)b->base.params.max_pending * row;
    for (int lh = 0; lh < c->n_layers * c->n_kv_heads; lh++) {
        uint8_t *kc = s->key_cache + (size_t)lh * cap * row;
        uint8_t *vc = s->value_cache + (size_t)lh * cap * row;
        for (int i = 0; i < n_keep; i++) {
            size_t from = seq_slot(q, nc + keep[i]) * row;
            memcpy(tk + (size_t)i * row, kc + from, row);
            memcpy(tv + (size_t)i * row, vc + from, row);
        }
        for (int i = 0; i < n_keep; i++) {
            size_t to = seq_slot(q, nc + i) * row;
            memcpy(kc + to, tk + (size_t)i * row, row);
            memcpy(vc + to, tv + (size_t)i * row, row);
        }
    }
}

static int cpu_seq_commit(Backend *bb, int seq, const int *keep, int n_keep, RsErr *e) {
    CpuBackend *b = (CpuBackend *)bb;
    RunState *s = &b->s;
    CpuSeq *q = &b->seqs[seq];
    int identity, rc = backend_check_keep(q->np, keep, n_keep, s->keep_seen, &identity, e);
    if (rc) return rc;
    /* keep = 0, 1, ... (AR steps, prefill chunks): the entries are in place already. */
    if (!identity) kv_compact(b, q, keep, n_keep);
    if (bb->feat_n && seq == 0) { /* kept rows' features in keep order */
        size_t W = (size_t)bb->feat_n * bb->model->cfg.dim;
        for (int i = 0; i < n_keep; i++)
            memcpy(s->feat_out + i * W, s->feat_pend + (size_t)keep[i] * W, W * sizeof(float));
    }
    q->nc += n_keep;
    q->np = 0;
    seq_shrink(b, q, q->nc);
    seq0_sync(b);
    return RS_OK;
}

static int cpu_kv_commit(Backend *bb, const int *keep, int n_keep, RsErr *e) {
    return cpu_seq_commit(bb, 0, keep, n_keep, e);
}

/* kv_compact of keep then stay: the first n_keep commit, the rest follow as pending. */
static int cpu_kv_commit_stay(Backend *bb, const int *keep, int n_keep, const int *stay,
                              int n_stay, RsErr *e) {
    CpuBackend *b = (CpuBackend *)bb;
    CpuSeq *q = &b->seqs[0];
    if (n_keep < 0 || n_stay < 0 || n_keep + n_stay > q->np)
        return rs_err(e, RS_EINVAL, "kv_commit of %d entries, %d staying, with %d pending",
                      n_keep, n_stay, q->np);
    int *all = rs_xmalloc(sizeof(int) * (size_t)(n_keep + n_stay + 1)), identity;
    memcpy(all, keep, sizeof(int) * (size_t)n_keep);
    memcpy(all + n_keep, stay, sizeof(int) * (size_t)n_stay);
    int rc = backend_check_keep(q->np, all, n_keep + n_stay, b->s.keep_seen, &identity, e);
    if (!rc && !identity) kv_compact(b, q, all, n_keep + n_stay);
    for (int i = 0; !rc && i < n_stay; i++) all[i] = q->pend_pos[stay[i]];
    if (!rc) memcpy(q->pend_pos, all, sizeof(int) * (size_t)n_stay); /* positions go along */
    free(all);
    if (rc) return rc;
    q->nc += n_keep;
    q->np = n_stay;
    seq_shrink(b, q, q->nc + q->np);
    seq0_sync(b);
    return RS_OK;
}

static int cpu_seq_open(Backend *bb, int *seq, RsErr *e) {
    CpuBackend *b = (CpuBackend *)bb;
    for (int i = 1; i < b->n_seqs; i++)
        if (!b->seqs[i].open) {
            b->seqs[i] = (CpuSeq){.open = 1, .blocks = b->seqs[i].blocks,
                                  .pend_pos = b->seqs[i].pend_pos};
            *seq = i;
            return RS_OK;
        }
    return rs_err(e, RS_EFULL, "all %d sequences are open (max_seqs)", b->n_seqs);
}

static void cpu_seq_close(Backend *bb, int seq) {
    CpuBackend *b = (CpuBackend *)bb;
    CpuSeq *q = &b->seqs[seq];
    seq_shrink(b, q, 0);
    q->nc = q->np = 0;
    q->open = seq == 0;
    seq0_sync(b);
}

static void cpu_seq_counts(const Backend *bb, int seq, int *nc, int *np) {
    const CpuSeq *q = &((const CpuBackend *)bb)->seqs[seq];
    *nc = q->open ? q->nc : -1;
    *np = q->np;
}

static void cpu_kv_usage(const Backend *bb, BackendKvUsage *u) {
    const CpuBackend *b = (const CpuBackend *)bb;
    u->blocks_used = b->blocks_total - b->n_free - b->n_idle;
    u->blocks_cached = 0;
    for (int i = 0; i < b->blocks_total; i++) u->blocks_cached += b->cached[i];
    u->seqs_open = 0;
    for (int i = 0; i < b->n_seqs; i++) u->seqs_open += b->seqs[i].open;
}

static int cpu_rows_copy(Backend *bb, const int *rows, int n, float *logits, RsErr *e) {
    CpuBackend *b = (CpuBackend *)bb;
    size_t V = (size_t)bb->model->cfg.vocab_size;
    for (int i = 0; i < n; i++)
        memcpy(logits + (size_t)i * V, b->s.logits + (size_t)rows[i] * V, V * sizeof(float));
    return RS_OK;
}

static int cpu_rows_topk_op(Backend *bb, int k, int *ids, float *logq, float *lse, RsErr *e) {
    CpuBackend *b = (CpuBackend *)bb;
    if (b->topk_ready && k == bb->params.topk_hint) /* the forward's head reduced them */
        cpu_topk_end(&b->topk_run, ids, logq, lse);
    else
        cpu_topk(b->pool, b->s.logits, bb->n_kept, bb->model->cfg.vocab_size, k, ids, logq, lse,
                 b->s.parts);
    return RS_OK;
}

static void cpu_stats(const Backend *bb, BackendStats *st) {
    st->fused_topk_ns = ((const CpuBackend *)bb)->fused_topk_ns;
}

static void cpu_kv_reset(Backend *bb) { cpu_seq_close(bb, 0); }

static void cpu_kv_truncate(Backend *bb, int n_committed) {
    CpuBackend *b = (CpuBackend *)bb;
    CpuSeq *q = &b->seqs[0];
    q->nc = n_committed;
    q->np = 0;
    seq_shrink(b, q, q->nc);
    seq0_sync(b);
}

/* ---- the prefix cache ---- */

/* The cached block published under hash h with these tokens, or -1. */
static int prefix_find(const CpuBackend *b, uint64_t h, const int *tokens) {
    for (int i = 0; i < b->blocks_total; i++)
        if (b->cached[i] && b->hash[i] == h &&
            !memcmp(b->btok + (size_t)i * BACKEND_KV_BLOCK, tokens,
                    BACKEND_KV_BLOCK * sizeof(int)))
            return i;
    return -1;
}

/* The first `count` entries of block src copied into block dst, in every (layer, KV head). */
static void block_copy(CpuBackend *b, int dst, int src, int count) {
    const Config *c = &b->base.model->cfg;
    size_t row = (size_t)c->head_dim * b->s.kv_es, cap = (size_t)b->slots;
    for (int lh = 0; lh < c->n_layers * c->n_kv_heads; lh++) {
        size_t base = (size_t)lh * cap * row, to = (size_t)dst * BACKEND_KV_BLOCK * row;
        size_t from = (size_t)src * BACKEND_KV_BLOCK * row;
        memcpy(b->s.key_cache + base + to, b->s.key_cache + base + from, count * row);
        memcpy(b->s.value_cache + base + to, b->s.value_cache + base + from, count * row);
    }
}

/* Past q's attached whole blocks (chain value h): the cached block after that chain that
 * shares the longest run with tokens[0 .. min(n, BACKEND_KV_BLOCK)) gives that run's
 * entries, copied into a block of q's own (K and V of a position depend only on the tokens
 * up to it, so they are the bits a prefill would write). Returns the entries added. */
static int prefix_attach_part(CpuBackend *b, CpuSeq *q, uint64_t h, const int *tokens, int n) {
    int src = -1, best = 0, lim = n < BACKEND_KV_BLOCK ? n : BACKEND_KV_BLOCK;
    for (int i = 0; i < b->blocks_total; i++) {
        if (!b->cached[i] || b->phash[i] != h) continue;
        const int *t = b->btok + (size_t)i * BACKEND_KV_BLOCK;
        int m = 0;
        while (m < lim && t[m] == tokens[m]) m++;
        if (m > best) best = m, src = i;
    }
    if (src < 0 || b->n_free + b->n_idle - !b->ref[src] < 1) return 0;
    if (!b->ref[src]++) b->n_idle--; /* held, so taking a block cannot evict it */
    int blk = block_take(b);
    block_copy(b, blk, src, best);
    block_release(b, src);
    b->used[src] = ++b->tick;
    q->blocks[q->n_blocks++] = blk;
    return best;
}

static int cpu_prefix_attach(Backend *bb, int seq, const int *tokens, int n) {
    CpuBackend *b = (CpuBackend *)bb;
    CpuSeq *q = &b->seqs[seq];
    RS_ASSERT(q->nc == 0 && q->np == 0 && q->n_blocks == 0);
    if (!b->prefix_on) return 0;
    uint64_t h = 0; /* the chain of the blocks attached */
    for (int k = 0; k < n / BACKEND_KV_BLOCK; k++) {
        const int *t = tokens + (size_t)k * BACKEND_KV_BLOCK;
        uint64_t next = backend_prefix_hash(h, t);
        int blk = prefix_find(b, next, t);
        if (blk < 0) break;
        if (!b->ref[blk]++) b->n_idle--;
        b->used[blk] = ++b->tick;
        q->blocks[q->n_blocks++] = blk;
        h = next;
    }
    q->nc = q->n_blocks * BACKEND_KV_BLOCK;
    if (q->nc < n) q->nc += prefix_attach_part(b, q, h, tokens + q->nc, n - q->nc);
    seq0_sync(b);
    return q->nc;
}

static void cpu_prefix_publish(Backend *bb, int seq, const int *tokens, int n) {
    CpuBackend *b = (CpuBackend *)bb;
    const CpuSeq *q = &b->seqs[seq];
    RS_ASSERT(n <= q->nc);
    if (!b->prefix_on) return;
    uint64_t h = 0;
    for (int k = 0; k < n / BACKEND_KV_BLOCK; k++) {
        const int *t = tokens + (size_t)k * BACKEND_KV_BLOCK;
        uint64_t prev = h;
        h = backend_prefix_hash(h, t);
        int blk = q->blocks[k];
        if (b->cached[blk] || prefix_find(b, h, t) >= 0) continue; /* one copy is enough */
        b->cached[blk] = 1;
        b->hash[blk] = h;
        b->phash[blk] = prev;
        memcpy(b->btok + (size_t)blk * BACKEND_KV_BLOCK, t, BACKEND_KV_BLOCK * sizeof(int));
        b->used[blk] = ++b->tick;
    }
}

/* backend_seq_fork: src's whole blocks get one more holder; the partial block's entries are
 * copied in every (layer, KV head). */
static int cpu_seq_fork(Backend *bb, int src, int dst, int n, RsErr *e) {
    CpuBackend *b = (CpuBackend *)bb;
    const CpuSeq *from = &b->seqs[src];
    CpuSeq *to = &b->seqs[dst];
    int whole = n / BACKEND_KV_BLOCK, part = n % BACKEND_KV_BLOCK;
    if (part && b->n_free + b->n_idle == 0)
        return rs_err(e, RS_EFULL, "no free KV block to copy a partial block into");
    for (int k = 0; k < whole; k++) {
        b->ref[from->blocks[k]]++;
        to->blocks[to->n_blocks++] = from->blocks[k];
    }
    if (part) {
        int blk = block_take(b);
        block_copy(b, blk, from->blocks[whole], part);
        to->blocks[to->n_blocks++] = blk;
    }
    to->nc = n;
    seq0_sync(b);
    return RS_OK;
}

/* ---- the verifier's row queries over the kept rows ---- */

static void cpu_rows_stats_op(Backend *bb, const int *rows, int n, const Sampling *s,
                              const double *u, RowStats *out) {
    CpuBackend *b = (CpuBackend *)bb;
    int V = bb->model->cfg.vocab_size;
    const float *rp[256];
    for (int i0 = 0; i0 < n; i0 += 256) { /* in groups: no allocation */
        int k = n - i0 < 256 ? n - i0 : 256;
        for (int i = 0; i < k; i++) rp[i] = b->s.logits + (size_t)rows[i0 + i] * V;
        cpu_rows_stats(b->pool, rp, k, V, s, u ? u + i0 : NULL, b->rows_scratch, out + i0);
    }
}

static const float *cpu_kept_row(const Backend *bb, int row) {
    return ((const CpuBackend *)bb)->s.logits + (size_t)row * bb->model->cfg.vocab_size;
}

static void cpu_rows_gather_op(Backend *bb, const int *rows, const int *ids, int n, float *out) {
    const CpuBackend *b = (const CpuBackend *)bb;
    size_t V = (size_t)bb->model->cfg.vocab_size;
    for (int i = 0; i < n; i++) out[i] = b->s.logits[rows[i] * V + (size_t)ids[i]];
}

static int packs_type(uint32_t type, const void *fam) { return qk_family_packs(fam, type); }

/* BackendOps.prepare_weights: the resident matrices of every type the family has an x4
 * kernel for, packed (model_pack_x4); sw.cpu_unpacked keeps the file's row layout. */
static int cpu_prepare_weights(Model *m, const BackendParams *bp, RsErr *e) {
    if (bp && bp->sw.cpu_unpacked) return RS_OK;
    const QkFamily *fam = qk_family_pick(bp ? bp->cpu_kernels : NULL, e);
    if (!fam) return e && e->code ? e->code : RS_EINVAL;
    model_pack_x4(m, packs_type, fam);
    return RS_OK;
}

const BackendOps cpu_backend_ops = {
    .name = "cpu",
    .streams_host_weights = 1,
    .prepare_weights = cpu_prepare_weights,
    .create = cpu_create,
    .destroy = cpu_destroy,
    .forward = cpu_forward,
    .kv_commit = cpu_kv_commit,
    .kv_reset = cpu_kv_reset,
    .kv_truncate = cpu_kv_truncate,
    .kv_commit_stay = cpu_kv_commit_stay,
    .rows_copy = cpu_rows_copy,
    .set_features = cpu_set_features,
    .read_features = cpu_read_features,
    .rows_topk = cpu_rows_topk_op,
    .stats = cpu_stats,
    .rows_stats = cpu_rows_stats_op,
    .kept_row = cpu_kept_row,
    .rows_gather = cpu_rows_gather_op,
    .eagle3_layer = &cpu_eagle3_layer,
    .seq_open = cpu_seq_open,
    .seq_close = cpu_seq_close,
    .forward_batch = cpu_forward_batch,
    .seq_commit = cpu_seq_commit,
    .seq_counts = cpu_seq_counts,
    .kv_usage = cpu_kv_usage,
    .prefix_attach = cpu_prefix_attach,
    .prefix_publish = cpu_prefix_publish,
    .seq_fork = cpu_seq_fork,
};
