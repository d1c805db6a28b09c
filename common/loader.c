/* Shared loader plumbing: config checks, the weight plan (names, shapes, arena layout)
 * and the fingerprint hash. Both parsers walk the same plan so that a GGUF file and a
 * Hugging Face directory of one model produce identically laid out Models. */
#include "loader.h"
#include <string.h>

#define CHECK_RANGE(field, lo, hi)                                                         \
    do {                                                                                   \
        if (c->field < (lo) || c->field > (hi))                                            \
            return rs_err(e, RS_EFORMAT, "'%s': " #field " = %d is outside [%d, %d]", src,  \
                          c->field, (int)(lo), (int)(hi));                                 \
    } while (0)

int loader_check_config(const Config *c, const char *src, RsErr *e) {
    CHECK_RANGE(dim, 1, 1 << 16);
    CHECK_RANGE(hidden_dim, 1, 1 << 18);
    CHECK_RANGE(n_layers, 1, 1024);
    CHECK_RANGE(n_heads, 1, 1024);
    CHECK_RANGE(n_kv_heads, 1, 1024);
    CHECK_RANGE(head_dim, 2, 1024);
    CHECK_RANGE(vocab_size, 1, 1 << 22);
    if (c->n_heads % c->n_kv_heads != 0)
        return rs_err(e, RS_EFORMAT, "'%s': n_heads %d is not a multiple of n_kv_heads %d", src,
                      c->n_heads, c->n_kv_heads);
    if (c->head_dim % 2 != 0)
        return rs_err(e, RS_EFORMAT, "'%s': head_dim %d is odd (RoPE needs pairs)", src,
                      c->head_dim);
    if (!(c->norm_eps > 0.0f && c->norm_eps < 1.0f))
        return rs_err(e, RS_EFORMAT, "'%s': RMSNorm epsilon %g is outside (0, 1)", src,
                      (double)c->norm_eps);
    if (!(c->rope_theta > 0.0f))
        return rs_err(e, RS_EFORMAT, "'%s': rope theta %g is not positive", src,
                      (double)c->rope_theta);
    if (c->bos_id >= c->vocab_size || c->eos_id >= c->vocab_size)
        return rs_err(e, RS_EFORMAT, "'%s': bos %d / eos %d outside the vocabulary of %d", src,
                      c->bos_id, c->eos_id, c->vocab_size);
    return RS_OK;
}

static float *take(float **p, size_t n) {
    float *r = *p;
    *p += n;
    return r;
}

static void add(WeightReq *r, int *n, float **slot, QTensor *qt, int64_t rows, int64_t cols,
                int perm, const char *hf, const char *gg) {
    WeightReq *w = &r[(*n)++];
    memset(w, 0, sizeof *w);
    snprintf(w->hf_name, sizeof w->hf_name, "%s", hf);
    snprintf(w->gguf_name, sizeof w->gguf_name, "%s", gg);
    w->slot = slot;
    w->qt = qt;
    if (qt) {
        memset(qt, 0, sizeof *qt);
        qt->rows = (int)rows;
        qt->cols = (int)cols;
    }
    w->rows = rows;
    w->cols = cols;
    w->perm_heads = perm;
}

int loader_plan(Model *m, WeightReq **out, int *n_out, RsErr *e) {
    const Config *c = &m->cfg;
    int64_t D = c->dim, H = c->hidden_dim, V = c->vocab_size, hd = c->head_dim;
    int64_t Q = (int64_t)c->n_heads * hd, KV = (int64_t)c->n_kv_heads * hd;
    int max_reqs = 4 + c->n_layers * 14, n = 0;
    WeightReq *r = rs_xcalloc((size_t)max_reqs, sizeof *r);
    m->w.layers = rs_xcalloc((size_t)c->n_layers, sizeof(LayerWeights));
    char hf[96], gg[96];
    add(r, &n, NULL, &m->w.tok_embeddings, V, D, 0, "model.embed_tokens.weight",
        "token_embd.weight");
    for (int l = 0; l < c->n_layers; l++) {
        LayerWeights *L = &m->w.layers[l];
#define LAYER(slot, rows, cols, perm, hfs, ggs)                                            \
    do {                                                                                   \
        snprintf(hf, sizeof hf, "model.layers.%d.%s", l, hfs);                             \
        snprintf(gg, sizeof gg, "blk.%d.%s", l, ggs);                                      \
        add(r, &n, cols ? NULL : (float **)(void *)&L->slot,                               \
            cols ? (QTensor *)(void *)&L->slot : NULL, rows, cols, perm, hf, gg);          \
    } while (0)
        LAYER(attn_norm, D, 0, 0, "input_layernorm.weight", "attn_norm.weight");
        LAYER(wq, Q, D, c->n_heads, "self_attn.q_proj.weight", "attn_q.weight");
        LAYER(wk, KV, D, c->n_kv_heads, "self_attn.k_proj.weight", "attn_k.weight");
        LAYER(wv, KV, D, 0, "self_attn.v_proj.weight", "attn_v.weight");
        LAYER(wo, D, Q, 0, "self_attn.o_proj.weight", "attn_output.weight");
        if (c->has_qkv_bias) {
            LAYER(bq, Q, 0, c->n_heads, "self_attn.q_proj.bias", "attn_q.bias");
            LAYER(bk, KV, 0, c->n_kv_heads, "self_attn.k_proj.bias", "attn_k.bias");
            LAYER(bv, KV, 0, 0, "self_attn.v_proj.bias", "attn_v.bias");
        }
        if (c->has_qk_norm) {
            LAYER(q_norm, hd, 0, 0, "self_attn.q_norm.weight", "attn_q_norm.weight");
            LAYER(k_norm, hd, 0, 0, "self_attn.k_norm.weight", "attn_k_norm.weight");
        }
        LAYER(ffn_norm, D, 0, 0, "post_attention_layernorm.weight", "ffn_norm.weight");
        LAYER(w_gate, H, D, 0, "mlp.gate_proj.weight", "ffn_gate.weight");
        LAYER(w_up, H, D, 0, "mlp.up_proj.weight", "ffn_up.weight");
        LAYER(w_down, D, H, 0, "mlp.down_proj.weight", "ffn_down.weight");
#undef LAYER
    }
    add(r, &n, &m->w.final_norm, NULL, D, 0, 0, "model.norm.weight", "output_norm.weight");
    if (!c->tied_embeddings)
        add(r, &n, NULL, &m->w.wcls, V, D, 0, "lm_head.weight", "output.weight");
    RS_ASSERT(n <= max_reqs);

    /* The sizes passed loader_check_config, so this sum fits comfortably in size_t. */
    size_t total = 0;
    for (int i = 0; i < n; i++)
        if (!r[i].qt) total += (size_t)r[i].rows;
    float *arena = malloc((total ? total : 1) * sizeof(float));
    if (!arena) {
        free(r);
        free(m->w.layers);
        m->w.layers = NULL;
        return rs_err(e, RS_ENOMEM, "cannot allocate %zu MiB for the weights of '%s'",
                      total * sizeof(float) >> 20, m->path);
    }
    float *p = arena;
    for (int i = 0; i < n; i++)
        if (!r[i].qt) *r[i].slot = take(&p, (size_t)r[i].rows);
    m->arena = arena;
    m->arena_floats = total;
    *out = r;
    *n_out = n;
    return RS_OK;
}

uint64_t loader_fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

uint64_t loader_fnv_config(uint64_t h, const Config *c) {
    int iv[] = {(int)c->arch,        c->dim,          c->hidden_dim,   c->n_layers,
                c->n_heads,          c->n_kv_heads,   c->head_dim,     c->vocab_size,
                c->rope_scaling,     c->rope_orig_max_pos, c->tied_embeddings,
                c->has_qkv_bias,     c->has_qk_norm,  c->bos_id,       c->eos_id};
    float fv[] = {c->norm_eps, c->rope_theta, c->rope_factor, c->rope_low_freq_factor,
                  c->rope_high_freq_factor};
    h = loader_fnv(h, iv, sizeof iv);
    return loader_fnv(h, fv, sizeof fv);
}
