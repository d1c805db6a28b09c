/* CPU reference backend: the whole transformer forward in f32, llama2.c style. Every
 * buffer lives in a RunState allocated once in create(); forward() never allocates.
 * The operations themselves are kernels/cpu_ops.c (shared with the CUDA kernel tests as
 * their references); this file owns the buffers, the KV cache and the order of the steps. */
#include "backend_impl.h"
#include "cpu_ops.h"
#include <cblas.h>
#include <math.h>
#include <string.h>
#include <strings.h>

typedef struct {
    float *x;           // (max_batch, dim) residual stream
    float *xb;          // (max_batch, dim) normed input / sublayer output
    float *q;           // (max_batch, n_heads*head_dim)
    float *att_out;     // (max_batch, n_heads*head_dim)
    float *hb;          // (max_batch, hidden_dim) gate, then silu(gate)*up
    float *hb2;         // (max_batch, hidden_dim) up
    float *att;         // (kv_capacity) scores of one (token, head)
    float *key_cache;   // (n_layers, kv_capacity, kv_dim), RoPE already applied
    float *value_cache; // (n_layers, kv_capacity, kv_dim)
    float *kv_tmp;      // (2, max_pending, kv_dim) staging for kv_commit
    float *inv_freq;    // (head_dim/2) RoPE inverse frequencies (llama3-scaled if asked)
    float *rope_cos;    // (max_batch, head_dim/2)
    float *rope_sin;    // (max_batch, head_dim/2)
    int *att_idx;       // (max_batch, max_pending) pending slots each new token attends to
    int *att_cnt;       // (max_batch)
    uint8_t *keep_seen; // (max_pending) duplicate check in kv_commit
} RunState;

typedef struct {
    Backend base; /* must stay first: Backend * is cast to CpuBackend * */
    RunState s;
    int q_dim, kv_dim;
} CpuBackend;


/* OpenBLAS picks its kernels from cpuid at load time; inside some VMs the CPU model is
 * unknown and it falls back to SSE3 "Prescott" kernels, 3-4x slower on an AVX-512 machine.
 * The choice cannot be changed after load (only through OPENBLAS_CORETYPE), so say so once. */
static void blas_core_check(const Model *m) {
    static int done;
    /* Tiny (test) models run in microseconds either way: stay quiet for them. */
    if (done || getenv("OPENBLAS_CORETYPE") || model_weight_bytes(m) < ((size_t)64 << 20)) return;
    done = 1;
    static const char *old_cores[] = {"prescott", "core2", "penryn", "dunnington", "nehalem",
                                      "atom", "sandybridge", "katmai", "northwood", "banias"};
    const char *core = openblas_get_corename();
    const char *want = __builtin_cpu_supports("avx512f") ? "SkylakeX"
                       : __builtin_cpu_supports("avx2")  ? "Haswell"
                                                         : NULL;
    if (!core || !want) return;
    for (size_t i = 0; i < sizeof old_cores / sizeof old_cores[0]; i++)
        if (!strcasecmp(core, old_cores[i])) {
            fprintf(stderr,
                    "rootspec: OpenBLAS chose '%s' kernels on a CPU with %s; set "
                    "OPENBLAS_CORETYPE=%s for much faster matrix products\n",
                    core, want[0] == 'S' ? "AVX-512" : "AVX2", want);
            return;
        }
}

static void cpu_destroy(Backend **pb);

static int cpu_create(const Model *m, const BackendParams *p, Backend **out, RsErr *e) {
    *out = NULL;
    const Config *c = &m->cfg;
    if (p->kv_capacity <= 0 || p->max_batch <= 0 || p->max_pending <= 0)
        return rs_err(e, RS_EINVAL,
                      "backend sizes must be positive (kv_capacity %d, max_batch %d, "
                      "max_pending %d)",
                      p->kv_capacity, p->max_batch, p->max_pending);
    if (c->head_dim % 2 || c->n_heads % c->n_kv_heads)
        return rs_err(e, RS_EUNSUPPORTED, "head_dim %d must be even and n_heads %d a multiple "
                      "of n_kv_heads %d", c->head_dim, c->n_heads, c->n_kv_heads);
    if (m->random_weights && !m->arena)
        return rs_err(e, RS_EINVAL, "random model '%s' has no host weights (load it with "
                      "backend_model_load)", m->path);
    CpuBackend *b = rs_xcalloc(1, sizeof *b);
    b->base.ops = &cpu_backend_ops;
    b->base.model = m;
    b->base.params = *p;
    b->q_dim = c->n_heads * c->head_dim;
    b->kv_dim = c->n_kv_heads * c->head_dim;
    size_t B = (size_t)p->max_batch, cap = (size_t)p->kv_capacity, P = (size_t)p->max_pending;
    size_t half = (size_t)c->head_dim / 2;
    RunState *s = &b->s;
    s->x = rs_xcalloc(B * c->dim, sizeof(float));
    s->xb = rs_xcalloc(B * c->dim, sizeof(float));
    s->q = rs_xcalloc(B * b->q_dim, sizeof(float));
    s->att_out = rs_xcalloc(B * b->q_dim, sizeof(float));
    s->hb = rs_xcalloc(B * c->hidden_dim, sizeof(float));
    s->hb2 = rs_xcalloc(B * c->hidden_dim, sizeof(float));
    s->att = rs_xcalloc(cap, sizeof(float));
    /* The KV cache grows with --ctx: a size the host cannot hold is an error, not an abort. */
    size_t kv_n = (size_t)c->n_layers * cap * b->kv_dim;
    s->key_cache = calloc(kv_n, sizeof(float));
    s->value_cache = s->key_cache ? calloc(kv_n, sizeof(float)) : NULL;
    if (!s->value_cache) {
        Backend *bb = &b->base;
        cpu_destroy(&bb);
        return rs_err(e, RS_ENOMEM,
                      "cannot allocate the KV cache: %d entries x %d layers need %zu MiB "
                      "(lower --ctx)",
                      p->kv_capacity, c->n_layers, 2 * kv_n * sizeof(float) >> 20);
    }
    s->kv_tmp = rs_xcalloc(2 * P * b->kv_dim, sizeof(float));
    s->inv_freq = rs_xcalloc(half, sizeof(float));
    s->rope_cos = rs_xcalloc(B * half, sizeof(float));
    s->rope_sin = rs_xcalloc(B * half, sizeof(float));
    s->att_idx = rs_xcalloc(B * P, sizeof(int));
    s->att_cnt = rs_xcalloc(B, sizeof(int));
    s->keep_seen = rs_xcalloc(P, 1);
    rope_inv_freq(c, s->inv_freq);
    if (p->threads > 0) openblas_set_num_threads(p->threads);
    blas_core_check(m);
    *out = &b->base;
    return RS_OK;
}

static void cpu_destroy(Backend **pb) {
    if (!pb || !*pb) return;
    CpuBackend *b = (CpuBackend *)*pb;
    RunState *s = &b->s;
    free(s->x);
    free(s->xb);
    free(s->q);
    free(s->att_out);
    free(s->hb);
    free(s->hb2);
    free(s->att);
    free(s->key_cache);
    free(s->value_cache);
    free(s->kv_tmp);
    free(s->inv_freq);
    free(s->rope_cos);
    free(s->rope_sin);
    free(s->att_idx);
    free(s->att_cnt);
    free(s->keep_seen);
    free(b);
    *pb = NULL;
}


/* Biases, Qwen3 per-head q/k norms and RoPE on this batch's q (n, q_dim) and new k, v
 * rows (n, kv_dim). */
static void qkv_finish(CpuBackend *b, const LayerWeights *L, int n, float *knew, float *vnew) {
    const Config *c = &b->base.model->cfg;
    RunState *s = &b->s;
    int hd = c->head_dim, half = hd / 2, qd = b->q_dim, kvd = b->kv_dim;
    for (int t = 0; t < n; t++) {
        float *qt = s->q + (size_t)t * qd, *kt = knew + (size_t)t * kvd;
        float *vt = vnew + (size_t)t * kvd;
        if (L->bq) cpu_bias_add(qt, L->bq, qd);
        if (L->bk) cpu_bias_add(kt, L->bk, kvd);
        if (L->bv) cpu_bias_add(vt, L->bv, kvd);
        const float *cs = s->rope_cos + (size_t)t * half, *sn = s->rope_sin + (size_t)t * half;
        for (int h = 0; h < c->n_heads; h++) {
            if (L->q_norm) cpu_rmsnorm(qt + h * hd, qt + h * hd, L->q_norm, hd, c->norm_eps);
            cpu_rope(qt + h * hd, cs, sn, half);
        }
        for (int h = 0; h < c->n_kv_heads; h++) {
            if (L->k_norm) cpu_rmsnorm(kt + h * hd, kt + h * hd, L->k_norm, hd, c->norm_eps);
            cpu_rope(kt + h * hd, cs, sn, half);
        }
    }
}

static int cpu_forward(Backend *bb, const int *tokens, const int *pos, int n,
                       const uint8_t *mask, const int *out_rows, int n_out, float *logits,
                       RsErr *e) {
    CpuBackend *b = (CpuBackend *)bb;
    RS_ASSERT(tokens && pos && (n_out <= 0 || (out_rows && logits)));
    int rc = backend_check_forward(bb, tokens, pos, n, mask, out_rows, n_out, e);
    if (rc) return rc;
    const Model *m = bb->model;
    const Config *c = &m->cfg;
    const Weights *w = &m->w;
    RunState *s = &b->s;
    int dim = c->dim, hd = c->head_dim, half = hd / 2, qd = b->q_dim, kvd = b->kv_dim;
    int hidden = c->hidden_dim, cap = bb->params.kv_capacity, P = bb->params.max_pending;
    int nc = bb->n_committed, np = bb->n_pending, start = nc + np;
    /* Pending slots (relative to nc) each token may see; shared by all layers. */
    cpu_attention_index(mask, n, np, P, s->att_idx, s->att_cnt);
    cpu_rope_table(pos, s->inv_freq, n, half, s->rope_cos, s->rope_sin);
    cpu_embed(s->x, w->tok_embeddings, tokens, n, dim);
    for (int l = 0; l < c->n_layers; l++) {
        const LayerWeights *L = &w->layers[l];
        float *kc = s->key_cache + (size_t)l * cap * kvd;   // (cap, kvd)
        float *vc = s->value_cache + (size_t)l * cap * kvd; // (cap, kvd)
        float *knew = kc + (size_t)start * kvd;             // (n, kvd)
        float *vnew = vc + (size_t)start * kvd;             // (n, kvd)
        for (int t = 0; t < n; t++)
            cpu_rmsnorm(s->xb + (size_t)t * dim, s->x + (size_t)t * dim, L->attn_norm, dim,
                        c->norm_eps);
        cpu_matmul(s->q, s->xb, L->wq, n, dim, qd, qd);
        cpu_matmul(knew, s->xb, L->wk, n, dim, kvd, kvd);
        cpu_matmul(vnew, s->xb, L->wv, n, dim, kvd, kvd);
        qkv_finish(b, L, n, knew, vnew);
        /* Attention: committed entries [0, nc) plus the allowed pending ones. */
        cpu_attention(s->att_out, s->q, kc, vc, nc, s->att_idx, s->att_cnt, P, n, c->n_heads,
                      c->n_kv_heads, hd, s->att);
        cpu_matmul(s->xb, s->att_out, L->wo, n, qd, dim, dim);
        cpu_residual_add(s->x, s->xb, (size_t)n * dim);
        /* SwiGLU MLP. */
        for (int t = 0; t < n; t++)
            cpu_rmsnorm(s->xb + (size_t)t * dim, s->x + (size_t)t * dim, L->ffn_norm, dim,
                        c->norm_eps);
        cpu_matmul(s->hb, s->xb, L->w_gate, n, dim, hidden, hidden);
        cpu_matmul(s->hb2, s->xb, L->w_up, n, dim, hidden, hidden);
        cpu_swiglu(s->hb, s->hb2, (size_t)n * hidden);
        cpu_matmul(s->xb, s->hb, L->w_down, n, hidden, dim, dim);
        cpu_residual_add(s->x, s->xb, (size_t)n * dim);
    }
    /* Final norm and head only for the requested rows. */
    for (int r = 0; r < n_out; r++)
        cpu_rmsnorm(s->xb + (size_t)r * dim, s->x + (size_t)out_rows[r] * dim, w->final_norm,
                    dim, c->norm_eps);
    if (n_out > 0) cpu_matmul(logits, s->xb, w->wcls, n_out, dim, c->vocab_size, c->vocab_size);
    bb->n_pending += n;
    return RS_OK;
}

static int cpu_kv_commit(Backend *bb, const int *keep, int n_keep, RsErr *e) {
    CpuBackend *b = (CpuBackend *)bb;
    RS_ASSERT(keep || n_keep == 0);
    RunState *s = &b->s;
    int np = bb->n_pending, nc = bb->n_committed, kvd = b->kv_dim;
    int cap = bb->params.kv_capacity;
    if (n_keep < 0 || n_keep > np)
        return rs_err(e, RS_EINVAL, "kv_commit of %d entries with %d pending", n_keep, np);
    memset(s->keep_seen, 0, (size_t)np);
    for (int i = 0; i < n_keep; i++) {
        if (keep[i] < 0 || keep[i] >= np)
            return rs_err(e, RS_EINVAL, "kv_commit keep[%d] = %d outside the %d pending entries",
                          i, keep[i], np);
        if (s->keep_seen[keep[i]])
            return rs_err(e, RS_EINVAL, "kv_commit keeps pending entry %d twice", keep[i]);
        s->keep_seen[keep[i]] = 1;
    }
    /* Staged through kv_tmp because keep need not be ascending (in place could clobber). */
    size_t row = (size_t)kvd * sizeof(float);
    float *tk = s->kv_tmp, *tv = s->kv_tmp + (size_t)bb->params.max_pending * kvd;
    for (int l = 0; l < bb->model->cfg.n_layers; l++) {
        float *kc = s->key_cache + ((size_t)l * cap + nc) * kvd;
        float *vc = s->value_cache + ((size_t)l * cap + nc) * kvd;
        for (int i = 0; i < n_keep; i++) {
            memcpy(tk + (size_t)i * kvd, kc + (size_t)keep[i] * kvd, row);
            memcpy(tv + (size_t)i * kvd, vc + (size_t)keep[i] * kvd, row);
        }
        memcpy(kc, tk, n_keep * row);
        memcpy(vc, tv, n_keep * row);
    }
    bb->n_committed += n_keep;
    bb->n_pending = 0;
    return RS_OK;
}

static void cpu_kv_reset(Backend *bb) {
    bb->n_committed = 0;
    bb->n_pending = 0;
}

const BackendOps cpu_backend_ops = {
    .name = "cpu",
    .create = cpu_create,
    .destroy = cpu_destroy,
    .forward = cpu_forward,
    .kv_commit = cpu_kv_commit,
    .kv_reset = cpu_kv_reset,
};
