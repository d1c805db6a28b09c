/* Random-weight models: preset shapes, the spec parser, the canonical tensor walk and the
 * host materialisation for the CPU backend (see randmodel.h). */
#include "randmodel.h"
#include "loader.h"
#include <errno.h>
#include <math.h>
#include <string.h>

typedef struct {
    const char *name, *what;
    Config c;
} Preset;

/* Shapes only; the published models' rope settings so position handling is exercised as
 * it would be with the real weights. */
static const Preset kPresets[] = {
    {"llama3-8b", "Llama-3.1-8B shape",
     {.arch = ARCH_LLAMA, .dim = 4096, .hidden_dim = 14336, .n_layers = 32, .n_heads = 32,
      .n_kv_heads = 8, .head_dim = 128, .vocab_size = 128256, .max_seq_len = 131072,
      .norm_eps = 1e-5f, .rope_theta = 500000.0f, .rope_scaling = 1, .rope_factor = 8.0f,
      .rope_low_freq_factor = 1.0f, .rope_high_freq_factor = 4.0f, .rope_orig_max_pos = 8192,
      .tied_embeddings = 0, .bos_id = -1, .eos_id = -1}},
    {"llama3-1b", "Llama-3.2-1B shape",
     {.arch = ARCH_LLAMA, .dim = 2048, .hidden_dim = 8192, .n_layers = 16, .n_heads = 32,
      .n_kv_heads = 8, .head_dim = 64, .vocab_size = 128256, .max_seq_len = 131072,
      .norm_eps = 1e-5f, .rope_theta = 500000.0f, .rope_scaling = 1, .rope_factor = 32.0f,
      .rope_low_freq_factor = 1.0f, .rope_high_freq_factor = 4.0f, .rope_orig_max_pos = 8192,
      .tied_embeddings = 1, .bos_id = -1, .eos_id = -1}},
    {"smollm2-135m", "SmolLM2-135M shape",
     {.arch = ARCH_LLAMA, .dim = 576, .hidden_dim = 1536, .n_layers = 30, .n_heads = 9,
      .n_kv_heads = 3, .head_dim = 64, .vocab_size = 49152, .max_seq_len = 8192,
      .norm_eps = 1e-5f, .rope_theta = 100000.0f, .tied_embeddings = 1, .bos_id = -1,
      .eos_id = -1}},
    {"tiny", "test shape (dim 64, 2 layers, vocab 512)",
     {.arch = ARCH_LLAMA, .dim = 64, .hidden_dim = 128, .n_layers = 2, .n_heads = 4,
      .n_kv_heads = 2, .head_dim = 16, .vocab_size = 512, .max_seq_len = 4096,
      .norm_eps = 1e-5f, .rope_theta = 10000.0f, .tied_embeddings = 0, .bos_id = -1,
      .eos_id = -1}},
};
#define N_PRESETS ((int)(sizeof kPresets / sizeof kPresets[0]))

int model_path_is_random(const char *path) {
    return path && strncmp(path, RANDOM_MODEL_PREFIX, strlen(RANDOM_MODEL_PREFIX)) == 0;
}

static int preset_list_err(RsErr *e, const char *spec, const char *bad) {
    char names[256] = "";
    for (int i = 0; i < N_PRESETS; i++) {
        strncat(names, i ? ", " : "", sizeof names - strlen(names) - 1);
        strncat(names, kPresets[i].name, sizeof names - strlen(names) - 1);
    }
    return rs_err(e, RS_EINVAL, "random model '%s': unknown preset '%s' (presets: %s)", spec,
                  bad, names);
}

static int parse_u64(const char *spec, const char *key, const char *v, uint64_t lo, uint64_t hi,
                     uint64_t *out, RsErr *e) {
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (!*v || *end || errno || *v == '-' || x < lo || x > hi)
        return rs_err(e, RS_EINVAL, "random model '%s': %s=%s is not an integer in %llu..%llu",
                      spec, key, v, (unsigned long long)lo, (unsigned long long)hi);
    *out = x;
    return RS_OK;
}

/* One key=value override. */
static int apply_override(const char *spec, char *kv, Config *c, uint64_t *seed, RsErr *e) {
    char *eq = strchr(kv, '=');
    if (!eq)
        return rs_err(e, RS_EINVAL, "random model '%s': expected key=value, got '%s'", spec, kv);
    *eq = 0;
    const char *k = kv, *v = eq + 1;
    uint64_t x;
    int rc;
    if (!strcmp(k, "seed")) return parse_u64(spec, k, v, 0, UINT64_MAX, seed, e);
    if (!strcmp(k, "layers")) {
        if ((rc = parse_u64(spec, k, v, 1, 1024, &x, e))) return rc;
        c->n_layers = (int)x;
    } else if (!strcmp(k, "vocab")) {
        if ((rc = parse_u64(spec, k, v, 2, 1 << 24, &x, e))) return rc;
        c->vocab_size = (int)x;
    } else if (!strcmp(k, "tied")) {
        if ((rc = parse_u64(spec, k, v, 0, 1, &x, e))) return rc;
        c->tied_embeddings = (int)x;
    } else if (!strcmp(k, "arch")) {
        if (!strcmp(v, "llama")) c->arch = ARCH_LLAMA;
        else if (!strcmp(v, "qwen2")) c->arch = ARCH_QWEN2;
        else if (!strcmp(v, "qwen3")) c->arch = ARCH_QWEN3;
        else
            return rs_err(e, RS_EINVAL, "random model '%s': arch=%s (llama, qwen2, qwen3)", spec,
                          v);
        c->has_qkv_bias = c->arch == ARCH_QWEN2;
        c->has_qk_norm = c->arch == ARCH_QWEN3;
    } else {
        return rs_err(e, RS_EINVAL,
                      "random model '%s': unknown key '%s' (seed, layers, vocab, arch, tied)",
                      spec, k);
    }
    return RS_OK;
}

int model_random_load(const char *spec, Model **out, RsErr *e) {
    *out = NULL;
    if (!model_path_is_random(spec))
        return rs_err(e, RS_EINVAL, "'%s' does not name a random model (random:PRESET)", spec);
    size_t len = strlen(spec);
    if (len >= sizeof(((Model *)0)->path))
        return rs_err(e, RS_EINVAL, "random model spec of %zu bytes is too long", len);
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", spec + strlen(RANDOM_MODEL_PREFIX));
    char *save = NULL, *part = strtok_r(buf, ",", &save);
    if (!part) return preset_list_err(e, spec, "");
    const Preset *p = NULL;
    for (int i = 0; i < N_PRESETS; i++)
        if (!strcmp(part, kPresets[i].name)) p = &kPresets[i];
    if (!p) return preset_list_err(e, spec, part);
    Config c = p->c;
    uint64_t seed = 1;
    while ((part = strtok_r(NULL, ",", &save))) {
        int rc = apply_override(spec, part, &c, &seed, e);
        if (rc) return rc;
    }
    Model *m = rs_xcalloc(1, sizeof(Model));
    m->cfg = c;
    m->random_weights = 1;
    m->random_seed = seed;
    m->tok_source = TOKSRC_NONE;
    snprintf(m->path, sizeof m->path, "%s", spec);
    uint64_t h = loader_fnv(loader_fnv_config(0xcbf29ce484222325ull, &c), &seed, sizeof seed);
    snprintf(m->fingerprint, sizeof m->fingerprint, "random-%s-%016llx", p->name,
             (unsigned long long)h);
    *out = m;
    return RS_OK;
}

void model_random_walk(const Config *c, uint64_t seed, void (*fn)(void *u, const RandTensor *t),
                       void *u) {
    size_t dim = (size_t)c->dim, qd = (size_t)c->n_heads * c->head_dim;
    size_t kvd = (size_t)c->n_kv_heads * c->head_dim, hid = (size_t)c->hidden_dim;
    float s_in = 1.0f / sqrtf((float)dim);
    uint64_t id = 0;
#define T(kind_, layer_, n_, scale_, base_)                                                   \
    do {                                                                                   \
        RandTensor t_ = {kind_, layer_, n_, scale_, base_, rs_rand_tensor_seed(seed, ++id)}; \
        fn(u, &t_);                                                                        \
    } while (0)
    for (int l = 0; l < c->n_layers; l++) {
        T(RT_WQ, l, qd * dim, s_in, 0.0f);
        T(RT_WK, l, kvd * dim, s_in, 0.0f);
        T(RT_WV, l, kvd * dim, s_in, 0.0f);
        T(RT_WO, l, dim * qd, 1.0f / sqrtf((float)qd), 0.0f);
        T(RT_W_GATE, l, hid * dim, s_in, 0.0f);
        T(RT_W_UP, l, hid * dim, s_in, 0.0f);
        T(RT_W_DOWN, l, dim * hid, 1.0f / sqrtf((float)hid), 0.0f);
        T(RT_ATTN_NORM, l, dim, 0.1f, 1.0f);
        T(RT_FFN_NORM, l, dim, 0.1f, 1.0f);
        if (c->has_qkv_bias) {
            T(RT_BQ, l, qd, 0.1f, 0.0f);
            T(RT_BK, l, kvd, 0.1f, 0.0f);
            T(RT_BV, l, kvd, 0.1f, 0.0f);
        }
        if (c->has_qk_norm) {
            T(RT_Q_NORM, l, (size_t)c->head_dim, 0.1f, 1.0f);
            T(RT_K_NORM, l, (size_t)c->head_dim, 0.1f, 1.0f);
        }
    }
    T(RT_TOK_EMBEDDINGS, -1, (size_t)c->vocab_size * dim, 1.0f, 0.0f);
    /* 3/sqrt(dim): logits with a spread like a trained head's, not a near-uniform row */
    if (!c->tied_embeddings) T(RT_WCLS, -1, (size_t)c->vocab_size * dim, 3.0f * s_in, 0.0f);
    T(RT_FINAL_NORM, -1, dim, 0.1f, 1.0f);
#undef T
}

static void count_tensor(void *u, const RandTensor *t) { *(size_t *)u += t->n; }

typedef struct {
    Model *m;
    float *p; /* next free float of the arena */
} FillCtx;

void model_weight_shape(const Config *c, RandTensorKind kind, int *rows, int *cols) {
    int qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    int r = 0, k = c->dim;
    switch (kind) {
    case RT_WQ: r = qd; break;
    case RT_WK: case RT_WV: r = kvd; break;
    case RT_WO: r = c->dim, k = qd; break;
    case RT_W_GATE: case RT_W_UP: r = c->hidden_dim; break;
    case RT_W_DOWN: r = c->dim, k = c->hidden_dim; break;
    case RT_TOK_EMBEDDINGS: case RT_WCLS: r = c->vocab_size; break;
    default: k = 0; break;
    }
    *rows = r;
    *cols = k;
}

void model_weight_slot(Weights *w, const RandTensor *t, float ***vec, QTensor **mat) {
    LayerWeights *L = t->layer >= 0 ? &w->layers[t->layer] : NULL;
    *vec = NULL;
    *mat = NULL;
    switch (t->kind) {
    case RT_WQ: *mat = &L->wq; return;
    case RT_WK: *mat = &L->wk; return;
    case RT_WV: *mat = &L->wv; return;
    case RT_WO: *mat = &L->wo; return;
    case RT_W_GATE: *mat = &L->w_gate; return;
    case RT_W_UP: *mat = &L->w_up; return;
    case RT_W_DOWN: *mat = &L->w_down; return;
    case RT_ATTN_NORM: *vec = &L->attn_norm; return;
    case RT_FFN_NORM: *vec = &L->ffn_norm; return;
    case RT_BQ: *vec = &L->bq; return;
    case RT_BK: *vec = &L->bk; return;
    case RT_BV: *vec = &L->bv; return;
    case RT_Q_NORM: *vec = &L->q_norm; return;
    case RT_K_NORM: *vec = &L->k_norm; return;
    case RT_TOK_EMBEDDINGS: *mat = &w->tok_embeddings; return;
    case RT_WCLS: *mat = &w->wcls; return;
    case RT_FINAL_NORM: *vec = &w->final_norm; return;
    }
    RS_ASSERT(0 && "unknown RandTensorKind");
}

static void fill_tensor(void *u, const RandTensor *t) {
    FillCtx *f = u;
    float *dst = f->p;
    for (size_t i = 0; i < t->n; i++) dst[i] = rs_rand_value(t->seed, i, t->scale, t->base);
    float **vec;
    QTensor *mat;
    model_weight_slot(&f->m->w, t, &vec, &mat);
    if (vec) *vec = dst;
    else {
        int rows, cols;
        model_weight_shape(&f->m->cfg, t->kind, &rows, &cols);
        RS_ASSERT((size_t)rows * cols == t->n);
        *mat = qtensor_f32(dst, rows, cols);
    }
    f->p += t->n;
}

int model_random_materialize(Model *m, RsErr *e) {
    RS_ASSERT(m && m->random_weights);
    if (m->arena) return RS_OK;
    size_t total = 0;
    model_random_walk(&m->cfg, m->random_seed, count_tensor, &total);
    if (total * sizeof(float) > RANDOM_MODEL_HOST_LIMIT)
        return rs_err(e, RS_ENOMEM,
                      "random model '%s' needs %.1f GiB of f32 weights on the host for the CPU "
                      "backend (limit %.0f GiB): use --backend cuda, which makes them on the GPU",
                      m->path, total * 4.0 / (1 << 30), RANDOM_MODEL_HOST_LIMIT / (double)(1 << 30));
    m->arena = malloc(total * sizeof(float));
    if (!m->arena)
        return rs_err(e, RS_ENOMEM, "random model '%s': cannot allocate %zu bytes of weights",
                      m->path, total * sizeof(float));
    m->arena_floats = total;
    m->w.layers = rs_xcalloc((size_t)m->cfg.n_layers, sizeof(LayerWeights));
    FillCtx f = {m, m->arena};
    model_random_walk(&m->cfg, m->random_seed, fill_tensor, &f);
    RS_ASSERT(f.p == m->arena + total);
    if (m->cfg.tied_embeddings) m->w.wcls = m->w.tok_embeddings;
    return RS_OK;
}
