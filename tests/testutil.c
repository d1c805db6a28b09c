/* Shared test helpers: fixture paths, tolerant comparison, in-memory random models. */
#include "testutil.h"
#include "common/rng.h"
#include <math.h>
#include <string.h>
#include <unistd.h>

const char *tu_default_model_path(void) {
    static const char *p = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (access(p, R_OK) != 0)
        ck_abort_msg("default model %s is missing: run `make setup` (it fetches it)", p);
    return p;
}

const char *tu_fixture(const char *rel) {
    static char buf[4][1024];
    static int k = 0;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "tests/fixtures/%s", rel);
    return buf[k];
}

int tu_compare(const char *label, const float *got, const float *ref, size_t n, float atol,
               float rtol, float *max_abs) {
    int bad = 0;
    float mx = 0;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(got[i] - ref[i]);
        if (!(d <= mx)) mx = d; /* also catches NaN */
        if (!(d <= atol + rtol * fabsf(ref[i]))) {
            if (bad < 5)
                fprintf(stderr, "%s: mismatch at %zu: got %.8g ref %.8g (|d|=%.3g)\n", label, i,
                        got[i], ref[i], d);
            bad++;
        }
    }
    if (max_abs) *max_abs = mx;
    return bad;
}

static float gauss(Rng *r) {
    double u1 = rng_uniform(r), u2 = rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

Model *tu_random_model(Arch arch, int dim, int hidden_dim, int n_layers, int n_heads,
                       int n_kv_heads, int vocab, uint64_t seed) {
    Model *m = calloc(1, sizeof(Model));
    Config *c = &m->cfg;
    c->arch = arch;
    c->dim = dim;
    c->hidden_dim = hidden_dim;
    c->n_layers = n_layers;
    c->n_heads = n_heads;
    c->n_kv_heads = n_kv_heads;
    c->head_dim = dim / n_heads;
    c->vocab_size = vocab;
    c->max_seq_len = 4096;
    c->norm_eps = 1e-5f;
    c->rope_theta = 10000.0f;
    c->has_qkv_bias = arch == ARCH_QWEN2;
    c->has_qk_norm = arch == ARCH_QWEN3;
    c->bos_id = -1;
    c->eos_id = -1;
    int hd = c->head_dim, q = n_heads * hd, kv = n_kv_heads * hd;
    size_t per_layer = (size_t)dim * 2 + (size_t)q * dim * 2 + (size_t)kv * dim * 2 + q + 2 * kv +
                       2 * hd + 3 * (size_t)hidden_dim * dim;
    size_t total = (size_t)vocab * dim * 2 + dim + per_layer * n_layers;
    m->arena = malloc(total * sizeof(float));
    m->arena_floats = total;
    Rng r;
    rng_seed(&r, seed);
    float *p = m->arena;
#define TAKE(ptr, count, scale, base)                                                          \
    do {                                                                                       \
        ptr = p;                                                                               \
        for (size_t i_ = 0; i_ < (size_t)(count); i_++) p[i_] = (base) + (scale)*gauss(&r);    \
        p += (count);                                                                          \
    } while (0)
    float s = 1.0f / sqrtf((float)dim);
    TAKE(m->w.tok_embeddings, (size_t)vocab * dim, 1.0f, 0.0f);
    m->w.layers = calloc((size_t)n_layers, sizeof(LayerWeights));
    for (int l = 0; l < n_layers; l++) {
        LayerWeights *L = &m->w.layers[l];
        TAKE(L->attn_norm, dim, 0.1f, 1.0f);
        TAKE(L->wq, (size_t)q * dim, s, 0.0f);
        TAKE(L->wk, (size_t)kv * dim, s, 0.0f);
        TAKE(L->wv, (size_t)kv * dim, s, 0.0f);
        TAKE(L->wo, (size_t)dim * q, 1.0f / sqrtf((float)q), 0.0f);
        if (c->has_qkv_bias) {
            TAKE(L->bq, q, 0.1f, 0.0f);
            TAKE(L->bk, kv, 0.1f, 0.0f);
            TAKE(L->bv, kv, 0.1f, 0.0f);
        }
        if (c->has_qk_norm) {
            TAKE(L->q_norm, hd, 0.1f, 1.0f);
            TAKE(L->k_norm, hd, 0.1f, 1.0f);
        }
        TAKE(L->ffn_norm, dim, 0.1f, 1.0f);
        TAKE(L->w_gate, (size_t)hidden_dim * dim, s, 0.0f);
        TAKE(L->w_up, (size_t)hidden_dim * dim, s, 0.0f);
        TAKE(L->w_down, (size_t)dim * hidden_dim, 1.0f / sqrtf((float)hidden_dim), 0.0f);
    }
    TAKE(m->w.final_norm, dim, 0.1f, 1.0f);
    TAKE(m->w.wcls, (size_t)vocab * dim, s * 3.0f, 0.0f);
#undef TAKE
    RS_ASSERT((size_t)(p - m->arena) <= total);
    snprintf(m->fingerprint, sizeof m->fingerprint, "random-%llu", (unsigned long long)seed);
    snprintf(m->path, sizeof m->path, "<random seed %llu>", (unsigned long long)seed);
    return m;
}

void tu_golden_read(const char *path, TuGolden *g) {
    char *buf = NULL;
    size_t len = 0;
    RsErr e = {0};
    ck_assert_msg(rs_read_file(path, &buf, &len, &e) == RS_OK, "%s", e.msg);
    uint32_t hdr[3];
    ck_assert_msg(len >= 16 && memcmp(buf, "RSGL", 4) == 0, "%s: not an RSGL file", path);
    memcpy(hdr, buf + 4, sizeof hdr);
    ck_assert_msg(hdr[0] == 1, "%s: RSGL version %u, want 1", path, hdr[0]);
    ck_assert_msg(hdr[1] > 0 && hdr[1] < 4096 && hdr[2] > 0 && hdr[2] < (1u << 20),
                  "%s: bad sizes n=%u vocab=%u", path, hdr[1], hdr[2]);
    g->n = (int)hdr[1];
    g->vocab = (int)hdr[2];
    size_t need = 16 + 4 * (size_t)g->n + 4 * (size_t)g->n * g->vocab;
    ck_assert_msg(len == need, "%s: %zu bytes, want %zu", path, len, need);
    g->tokens = rs_xmalloc(4 * (size_t)g->n);
    g->logits = rs_xmalloc(4 * (size_t)g->n * g->vocab);
    memcpy(g->tokens, buf + 16, 4 * (size_t)g->n);
    memcpy(g->logits, buf + 16 + 4 * (size_t)g->n, 4 * (size_t)g->n * g->vocab);
    free(buf);
}

void tu_golden_free(TuGolden *g) {
    free(g->tokens);
    free(g->logits);
    g->tokens = NULL;
    g->logits = NULL;
}
