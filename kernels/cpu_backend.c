/* CPU reference backend: the whole transformer forward in f32, llama2.c style. Every
 * buffer lives in a RunState allocated once in create(); forward() never allocates.
 * Matrix products run over the whole batch with OpenBLAS sgemm; attention is plain loops
 * (it is a small share of the work at the batch sizes the engine uses). It is the
 * reference the CUDA backend and the golden tests are checked against, so it favours
 * matching transformers' arithmetic over speed. */
#include "backend.h"
#include "cpu_matmul.h"
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


static void rmsnorm(float *o, const float *x, const float *w, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) o[i] = w[i] * (x[i] * r);
}

/* Rotate-half RoPE on one head vector: pairs (i, i + half). */
static void rope_apply(float *v, const float *cs, const float *sn, int half) {
    for (int i = 0; i < half; i++) {
        float a = v[i], b = v[i + half];
        v[i] = a * cs[i] - b * sn[i];
        v[i + half] = b * cs[i] + a * sn[i];
    }
}

/* Dot product with 8 independent partial sums: a single running sum is one long
 * dependency chain that the compiler may not reorder (no -ffast-math), which made
 * attention a large share of a 65-token pass. */
static float dot(const float *a, const float *b, int n) {
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += a[i + k] * b[i + k];
    float d = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; i++) d += a[i] * b[i];
    return d;
}

/* Y (n, out) = X (n, in) @ W^T with W (out, in) row-major. One token: OpenBLAS sgemv
 * (streams W once, threaded); a few tokens: our streaming kernel, since sgemm would first
 * pack (copy) all of W; larger batches: sgemm. Measured on SmolLM2 (rootspec-micro,
 * OPENBLAS_CORETYPE=SkylakeX, 1 thread): n = 9 pass 154 ms vs 186 ms with sgemm. */
static void matmul(float *y, const float *x, const float *w, int n, int in, int out, int ldy) {
    if (n == 1) {
        cblas_sgemv(CblasRowMajor, CblasNoTrans, out, in, 1.0f, w, in, x, 1, 0.0f, y, 1);
        return;
    }
    if (n <= CPU_MATMUL_SMALL_MAX) {
        cpu_matmul_small(y, ldy, x, w, n, in, 0, out);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f, x, in, w, in, 0.0f, y,
                ldy);
}

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
    int group = c->n_heads / c->n_kv_heads;
    float scale = 1.0f / sqrtf((float)hd);

    /* Pending slots (relative to nc) each token may see; shared by all layers. */
    for (int t = 0; t < n; t++) {
        int *idx = s->att_idx + (size_t)t * P, k = 0;
        for (int j = 0; j < np + n; j++) {
            int ok = mask ? mask[(size_t)t * (np + n) + j] != 0 : j < np + t + 1;
            if (ok) idx[k++] = j;
        }
        s->att_cnt[t] = k;
    }
    /* cos/sin per token: angle = float32(pos) * inv_freq in float32, as transformers. */
    for (int t = 0; t < n; t++)
        for (int i = 0; i < half; i++) {
            float ang = (float)pos[t] * s->inv_freq[i];
            s->rope_cos[(size_t)t * half + i] = (float)cos((double)ang);
            s->rope_sin[(size_t)t * half + i] = (float)sin((double)ang);
        }
    for (int t = 0; t < n; t++)
        memcpy(s->x + (size_t)t * dim, w->tok_embeddings + (size_t)tokens[t] * dim,
               dim * sizeof(float));

    for (int l = 0; l < c->n_layers; l++) {
        const LayerWeights *L = &w->layers[l];
        float *kc = s->key_cache + (size_t)l * cap * kvd;   // (cap, kvd)
        float *vc = s->value_cache + (size_t)l * cap * kvd; // (cap, kvd)
        float *knew = kc + (size_t)start * kvd;             // (n, kvd)
        float *vnew = vc + (size_t)start * kvd;             // (n, kvd)
        for (int t = 0; t < n; t++)
            rmsnorm(s->xb + (size_t)t * dim, s->x + (size_t)t * dim, L->attn_norm, dim,
                    c->norm_eps);
        matmul(s->q, s->xb, L->wq, n, dim, qd, qd);
        matmul(knew, s->xb, L->wk, n, dim, kvd, kvd);
        matmul(vnew, s->xb, L->wv, n, dim, kvd, kvd);
        for (int t = 0; t < n; t++) {
            float *qt = s->q + (size_t)t * qd, *kt = knew + (size_t)t * kvd;
            float *vt = vnew + (size_t)t * kvd;
            if (L->bq)
                for (int i = 0; i < qd; i++) qt[i] += L->bq[i];
            if (L->bk)
                for (int i = 0; i < kvd; i++) kt[i] += L->bk[i];
            if (L->bv)
                for (int i = 0; i < kvd; i++) vt[i] += L->bv[i];
            const float *cs = s->rope_cos + (size_t)t * half, *sn = s->rope_sin + (size_t)t * half;
            for (int h = 0; h < c->n_heads; h++) {
                if (L->q_norm) rmsnorm(qt + h * hd, qt + h * hd, L->q_norm, hd, c->norm_eps);
                rope_apply(qt + h * hd, cs, sn, half);
            }
            for (int h = 0; h < c->n_kv_heads; h++) {
                if (L->k_norm) rmsnorm(kt + h * hd, kt + h * hd, L->k_norm, hd, c->norm_eps);
                rope_apply(kt + h * hd, cs, sn, half);
            }
        }
        /* Attention: committed entries [0, nc) plus the allowed pending ones. */
        for (int t = 0; t < n; t++) {
            const int *idx = s->att_idx + (size_t)t * P;
            int cnt = s->att_cnt[t], len = nc + cnt;
            for (int h = 0; h < c->n_heads; h++) {
                const float *qh = s->q + (size_t)t * qd + h * hd;
                int off = (h / group) * hd;
                float *att = s->att, mx = -INFINITY;
                for (int j = 0; j < len; j++) {
                    int slot = j < nc ? j : nc + idx[j - nc];
                    const float *kh = kc + (size_t)slot * kvd + off;
                    att[j] = dot(qh, kh, hd) * scale;
                    if (att[j] > mx) mx = att[j];
                }
                float sum = 0.0f;
                for (int j = 0; j < len; j++) {
                    att[j] = expf(att[j] - mx);
                    sum += att[j];
                }
                float inv = 1.0f / sum;
                float *o = s->att_out + (size_t)t * qd + h * hd;
                memset(o, 0, hd * sizeof(float));
                for (int j = 0; j < len; j++) {
                    int slot = j < nc ? j : nc + idx[j - nc];
                    const float *vh = vc + (size_t)slot * kvd + off;
                    float a = att[j] * inv;
                    for (int i = 0; i < hd; i++) o[i] += a * vh[i];
                }
            }
        }
        matmul(s->xb, s->att_out, L->wo, n, qd, dim, dim);
        for (size_t i = 0; i < (size_t)n * dim; i++) s->x[i] += s->xb[i];
        /* SwiGLU MLP. */
        for (int t = 0; t < n; t++)
            rmsnorm(s->xb + (size_t)t * dim, s->x + (size_t)t * dim, L->ffn_norm, dim,
                    c->norm_eps);
        matmul(s->hb, s->xb, L->w_gate, n, dim, hidden, hidden);
        matmul(s->hb2, s->xb, L->w_up, n, dim, hidden, hidden);
        for (size_t i = 0; i < (size_t)n * hidden; i++) {
            float g = s->hb[i];
            s->hb[i] = g / (1.0f + expf(-g)) * s->hb2[i];
        }
        matmul(s->xb, s->hb, L->w_down, n, hidden, dim, dim);
        for (size_t i = 0; i < (size_t)n * dim; i++) s->x[i] += s->xb[i];
    }
    /* Final norm and head only for the requested rows. */
    for (int r = 0; r < n_out; r++)
        rmsnorm(s->xb + (size_t)r * dim, s->x + (size_t)out_rows[r] * dim, w->final_norm, dim,
                c->norm_eps);
    if (n_out > 0) matmul(logits, s->xb, w->wcls, n_out, dim, c->vocab_size, c->vocab_size);
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
