/* Loader tests: GGUF and Hugging Face directories against independent references written
 * by tools/gen_loader_fixtures.py (numpy, gguf-py, safetensors), the default model against
 * values dumped by gguf-py, refusals of corrupted inputs (message text checked), GGUF
 * metadata accessors, and model_layer_view. Corrupted files go to a mkdtemp directory. */
#include "common/model.h"
#include "common/model_internal.h"
#include "common/quant.h"
#include "common/randmodel.h"
#include "common/tokenizer.h"
#include "testutil.h"
#include "kernels/cpu/x86/x4_pack.h"
#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- fixture: JSON index + binary f32 blob (magic "RSLDFX01", u32 version 1) ---- */

typedef struct {
    cJSON *j;
    float *data; // (n)
    size_t n;
} Fx;

static void fx_load(Fx *f, const char *stem) {
    char rel[128], *txt, *bin;
    size_t len, blen;
    RsErr e = {0};
    snprintf(rel, sizeof rel, "loader/%s.json", stem);
    ck_assert_msg(rs_read_file(tu_fixture(rel), &txt, &len, &e) == 0, "%s", e.msg);
    f->j = cJSON_Parse(txt);
    free(txt);
    ck_assert_ptr_nonnull(f->j);
    ck_assert_str_eq(cJSON_GetObjectItem(f->j, "magic")->valuestring, "RSLDFX01");
    ck_assert_int_eq(cJSON_GetObjectItem(f->j, "version")->valueint, 1);
    snprintf(rel, sizeof rel, "loader/%s", cJSON_GetObjectItem(f->j, "bin")->valuestring);
    ck_assert_msg(rs_read_file(tu_fixture(rel), &bin, &blen, &e) == 0, "%s", e.msg);
    ck_assert(blen >= 12 && memcmp(bin, "RSLDFX01", 8) == 0);
    uint32_t ver;
    memcpy(&ver, bin + 8, 4);
    ck_assert_int_eq(ver, 1);
    f->n = (blen - 12) / 4;
    ck_assert_int_eq(f->n, (size_t)cJSON_GetObjectItem(f->j, "floats")->valuedouble);
    f->data = malloc(f->n * sizeof(float));
    memcpy(f->data, bin + 12, f->n * sizeof(float));
    free(bin);
}

static void fx_free(Fx *f) {
    cJSON_Delete(f->j);
    free(f->data);
}

/* Values of fixture tensor `name` or NULL; *n gets the element count. */
static const float *fx_get(const Fx *f, const char *name, size_t *n) {
    cJSON *t = cJSON_GetObjectItem(cJSON_GetObjectItem(f->j, "tensors"), name);
    if (!t) return NULL;
    size_t off = (size_t)cJSON_GetObjectItem(t, "offset")->valuedouble, cnt = 1;
    cJSON *d;
    cJSON_ArrayForEach(d, cJSON_GetObjectItem(t, "shape")) cnt *= (size_t)d->valuedouble;
    ck_assert(off + cnt <= f->n);
    *n = cnt;
    return f->data + off;
}

/* Our weight for a Hugging Face tensor name (the test's own mapping, not the loader's);
 * matrices dequantized by tu_f32 (logical row order). */
static float *hf_ptr(const Model *m, const char *name) {
    if (!strcmp(name, "model.embed_tokens.weight")) return tu_f32(&m->w.tok_embeddings);
    if (!strcmp(name, "model.norm.weight")) return m->w.final_norm;
    if (!strcmp(name, "lm_head.weight")) return tu_f32(&m->w.wcls);
    int l;
    char rest[64];
    if (sscanf(name, "model.layers.%d.%63s", &l, rest) != 2 || l >= m->cfg.n_layers) return NULL;
    LayerWeights *L = &m->w.layers[l];
    static const struct { const char *n; size_t off; int mat; } T[] = {
        {"input_layernorm.weight", offsetof(LayerWeights, attn_norm), 0},
        {"self_attn.q_proj.weight", offsetof(LayerWeights, wq), 1},
        {"self_attn.k_proj.weight", offsetof(LayerWeights, wk), 1},
        {"self_attn.v_proj.weight", offsetof(LayerWeights, wv), 1},
        {"self_attn.o_proj.weight", offsetof(LayerWeights, wo), 1},
        {"self_attn.q_proj.bias", offsetof(LayerWeights, bq), 0},
        {"self_attn.k_proj.bias", offsetof(LayerWeights, bk), 0},
        {"self_attn.v_proj.bias", offsetof(LayerWeights, bv), 0},
        {"self_attn.q_norm.weight", offsetof(LayerWeights, q_norm), 0},
        {"self_attn.k_norm.weight", offsetof(LayerWeights, k_norm), 0},
        {"post_attention_layernorm.weight", offsetof(LayerWeights, ffn_norm), 0},
        {"mlp.gate_proj.weight", offsetof(LayerWeights, w_gate), 1},
        {"mlp.up_proj.weight", offsetof(LayerWeights, w_up), 1},
        {"mlp.down_proj.weight", offsetof(LayerWeights, w_down), 1},
    };
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++)
        if (!strcmp(rest, T[i].n))
            return T[i].mat ? tu_f32((const QTensor *)(const void *)((char *)L + T[i].off))
                            : *(float **)((char *)L + T[i].off);
    return NULL;
}

static void gguf_name_of(const char *hf, char *out, size_t n) {
    static const char *map[][2] = {
        {"input_layernorm.weight", "attn_norm.weight"}, {"self_attn.q_proj.weight", "attn_q.weight"},
        {"self_attn.k_proj.weight", "attn_k.weight"},   {"self_attn.v_proj.weight", "attn_v.weight"},
        {"self_attn.o_proj.weight", "attn_output.weight"},
        {"post_attention_layernorm.weight", "ffn_norm.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},    {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"}};
    if (!strcmp(hf, "model.embed_tokens.weight")) snprintf(out, n, "token_embd.weight");
    else if (!strcmp(hf, "model.norm.weight")) snprintf(out, n, "output_norm.weight");
    else if (!strcmp(hf, "lm_head.weight")) snprintf(out, n, "output.weight");
    else {
        int l;
        char rest[64];
        ck_assert(sscanf(hf, "model.layers.%d.%63s", &l, rest) == 2);
        for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
            if (!strcmp(rest, map[i][0])) snprintf(out, n, "blk.%d.%s", l, map[i][1]);
    }
}

static Model *load_ok(const char *path) {
    Model *m = NULL;
    RsErr e = {0};
    int rc = model_load(path, &m, &e);
    ck_assert_msg(rc == RS_OK, "loading %s: %s", path, e.msg);
    return m;
}

/* Every original tensor (names without a "prefix:") against model weights. */
static int compare_originals(const Model *m, const Fx *f, int skip_lm_head) {
    int checked = 0;
    cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(f->j, "tensors")) {
        if (strchr(t->string, ':')) continue;
        if (skip_lm_head && !strcmp(t->string, "lm_head.weight")) continue;
        size_t n;
        const float *ref = fx_get(f, t->string, &n);
        float *got = hf_ptr(m, t->string), mx;
        ck_assert_msg(got != NULL, "no weight for %s", t->string);
        ck_assert_msg(tu_compare(t->string, got, ref, n, 0, 0, &mx) == 0, "%s differs (max %g)",
                      t->string, mx);
        checked++;
    }
    return checked;
}

/* ---- tiny GGUF ---- */

START_TEST(test_gguf_tiny_config) {
    Model *m = load_ok(tu_fixture("loader/tiny.gguf"));
    Config *c = &m->cfg;
    ck_assert_int_eq(c->arch, ARCH_LLAMA);
    ck_assert_int_eq(c->dim, 32);
    ck_assert_int_eq(c->hidden_dim, 64);
    ck_assert_int_eq(c->n_layers, 2);
    ck_assert_int_eq(c->n_heads, 4);
    ck_assert_int_eq(c->n_kv_heads, 2);
    ck_assert_int_eq(c->head_dim, 8);
    ck_assert_int_eq(c->vocab_size, 64); /* from the token list: no llama.vocab_size */
    ck_assert_int_eq(c->max_seq_len, 2048);
    ck_assert_float_eq_tol(c->norm_eps, 1e-5f, 1e-12f);
    ck_assert_float_eq(c->rope_theta, 500000.0f);
    ck_assert_int_eq(c->rope_scaling, 0);
    ck_assert_int_eq(c->tied_embeddings, 0);
    ck_assert_int_eq(c->has_qkv_bias, 0);
    ck_assert_int_eq(c->has_qk_norm, 0);
    ck_assert_int_eq(c->bos_id, 1);
    ck_assert_int_eq(c->eos_id, 2);
    ck_assert_int_eq(m->tok_source, TOKSRC_GGUF);
    ck_assert_ptr_nonnull(m->gguf);
    ck_assert_str_eq(m->chat_hint, "llama3");
    ck_assert_int_eq(strlen(m->fingerprint), 16);
    ck_assert_ptr_ne(m->w.wcls.data, m->w.tok_embeddings.data);
    /* only the norms are copied: the matrices stay in the mapping in their stored type */
    ck_assert_int_eq(m->arena_floats, 32 + 2 * (2 * 32));
    model_destroy(&m);
    ck_assert_ptr_null(m);
}
END_TEST

/* Dequantized values equal gguf.quants.dequantize (quantized) or the originals
 * (F32/F16/BF16) exactly, in HF layout: q/k un-permuted. */
START_TEST(test_gguf_tiny_weights) {
    Fx f;
    fx_load(&f, "expected");
    Model *m = load_ok(tu_fixture("loader/tiny.gguf"));
    int n_quant = 0, n_exact = 0;
    cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(f.j, "tensors")) {
        if (strchr(t->string, ':')) continue;
        char gname[96], key[128];
        gguf_name_of(t->string, gname, sizeof gname);
        snprintf(key, sizeof key, "gguf:%s", gname);
        size_t n, nq;
        const float *orig = fx_get(&f, t->string, &n), *deq = fx_get(&f, key, &nq);
        float *got = hf_ptr(m, t->string), mx;
        ck_assert_ptr_nonnull(got);
        if (deq) {
            ck_assert_int_eq(n, nq);
            ck_assert_msg(tu_compare(key, got, deq, n, 0, 0, &mx) == 0, "%s differs from gguf-py (max %g)",
                          key, mx);
            n_quant++;
        } else {
            ck_assert_msg(tu_compare(t->string, got, orig, n, 0, 0, &mx) == 0, "%s differs (max %g)",
                          gname, mx);
            n_exact++;
        }
    }
    ck_assert_int_eq(n_quant, 10); /* Q8_0/Q4_0/Q4_1 tensors in the fixture */
    ck_assert_int_eq(n_exact, 11);
    /* Quantized q (Q4_1) and k (Q8_0) of layer 1 against the HF-layout originals the script
     * permuted: a wrong un-permute would be off by ~1, quantization error is below these
     * bounds (Q4_1: half a step of range/15 for |w| <= 2; Q8_0: half of max/127). */
    size_t n;
    const float *q = fx_get(&f, "model.layers.1.self_attn.q_proj.weight", &n);
    float mx;
    ck_assert_int_eq(tu_compare("wq1", tu_f32(&m->w.layers[1].wq), q, n, 0.14f, 0, &mx), 0);
    const float *k = fx_get(&f, "model.layers.1.self_attn.k_proj.weight", &n);
    ck_assert_int_eq(tu_compare("wk1", tu_f32(&m->w.layers[1].wk), k, n, 0.008f, 0, &mx), 0);
    model_destroy(&m);
    fx_free(&f);
}
END_TEST

START_TEST(test_gguf_metadata) {
    Model *m = load_ok(tu_fixture("loader/tiny.gguf"));
    const GGUFFile *g = m->gguf;
    const char *s;
    size_t len, n;
    long long v;
    double d;
    ck_assert_int_eq(gguf_get_str(g, "general.name", &s, &len), 0);
    ck_assert_int_eq(len, 9);
    ck_assert(memcmp(s, "tiny-test", 9) == 0);
    ck_assert_int_eq(gguf_get_str(g, "general.nonexistent", &s, &len), -1);
    ck_assert_int_eq(gguf_get_str(g, "llama.block_count", &s, &len), -1); /* not a string */
    ck_assert_int_eq(gguf_get_int(g, "llama.block_count", &v), 0);
    ck_assert_int_eq(v, 2);
    ck_assert_int_eq(gguf_get_int(g, "test.i8", &v), 0);
    ck_assert_int_eq(v, -5);
    ck_assert_int_eq(gguf_get_int(g, "test.i16", &v), 0);
    ck_assert_int_eq(v, -300);
    ck_assert_int_eq(gguf_get_int(g, "test.u64", &v), 0);
    ck_assert(v == (1ll << 40));
    ck_assert_int_eq(gguf_get_int(g, "test.i64", &v), 0);
    ck_assert(v == -(1ll << 40));
    ck_assert_int_eq(gguf_get_int(g, "test.bool", &v), 0);
    ck_assert_int_eq(v, 1);
    ck_assert_int_eq(gguf_get_int(g, "test.f64", &v), -1);
    ck_assert_int_eq(gguf_get_int(g, "general.name", &v), -1);
    ck_assert_int_eq(gguf_get_arr_n(g, "tokenizer.ggml.tokens", &n), 0);
    ck_assert_int_eq(n, 64);
    ck_assert_int_eq(gguf_arr_str(g, "tokenizer.ggml.tokens", 37, &s, &len), 0);
    ck_assert_int_eq(len, 5);
    ck_assert(memcmp(s, "tok37", 5) == 0);
    ck_assert_int_eq(gguf_arr_str(g, "tokenizer.ggml.tokens", 63, &s, &len), 0);
    ck_assert(len == 5 && memcmp(s, "tok63", 5) == 0);
    ck_assert_int_eq(gguf_arr_str(g, "tokenizer.ggml.tokens", 64, &s, &len), -1);
    ck_assert_int_eq(gguf_arr_num(g, "tokenizer.ggml.token_type", 63, &d), 0);
    ck_assert(d == 3.0);
    ck_assert_int_eq(gguf_arr_num(g, "tokenizer.ggml.token_type", 0, &d), 0);
    ck_assert(d == 1.0);
    ck_assert_int_eq(gguf_arr_num(g, "tokenizer.ggml.scores", 10, &d), 0);
    ck_assert(d == -10.0);
    ck_assert_int_eq(gguf_arr_num(g, "tokenizer.ggml.scores", 64, &d), -1);
    ck_assert_int_eq(gguf_arr_num(g, "tokenizer.ggml.tokens", 0, &d), -1); /* strings */
    ck_assert_int_eq(gguf_get_arr_n(g, "test.nested", &n), 0);               /* arrays of arrays */
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(gguf_arr_num(g, "test.nested", 0, &d), -1);
    ck_assert_int_eq(gguf_arr_str(g, "test.nested", 0, &s, &len), -1);
    ck_assert_int_eq(gguf_get_arr_n(g, "general.name", &n), -1);
    model_destroy(&m);
}
END_TEST

/* Llama-3.1-style GGUF: rope scaling recovered from rope_freqs.weight; F16 weights. */
START_TEST(test_gguf_llama3_rope) {
    Fx f;
    fx_load(&f, "expected");
    Model *m = load_ok(tu_fixture("loader/tiny_llama3.gguf"));
    Config *c = &m->cfg;
    ck_assert_int_eq(c->rope_scaling, 1);
    ck_assert_float_eq(c->rope_factor, 8.0f);
    ck_assert_float_eq(c->rope_low_freq_factor, 1.0f);
    ck_assert_float_eq(c->rope_high_freq_factor, 4.0f);
    ck_assert_int_eq(c->rope_orig_max_pos, 8192);
    ck_assert_int_eq(c->vocab_size, 64); /* llama.vocab_size */
    ck_assert_int_eq(c->head_dim, 8);    /* llama.attention.key_length */
    ck_assert_int_eq(c->max_seq_len, 131072);
    ck_assert_int_eq(c->bos_id, 60);
    ck_assert_int_eq(c->eos_id, 63);
    ck_assert_int_eq(compare_originals(m, &f, 0), 21);
    model_destroy(&m);
    fx_free(&f);
}
END_TEST

/* ---- Hugging Face directories ---- */

START_TEST(test_hf_llama_bf16) {
    Fx f;
    fx_load(&f, "expected");
    Model *m = load_ok(tu_fixture("loader/hf_llama"));
    Config *c = &m->cfg;
    ck_assert_int_eq(c->arch, ARCH_LLAMA);
    ck_assert_int_eq(c->dim, 32);
    ck_assert_int_eq(c->n_layers, 2);
    ck_assert_int_eq(c->n_kv_heads, 2);
    ck_assert_int_eq(c->head_dim, 8);
    ck_assert_int_eq(c->vocab_size, 64);
    ck_assert_int_eq(c->rope_scaling, 1);
    ck_assert_float_eq(c->rope_factor, 8.0f);
    ck_assert_float_eq(c->rope_low_freq_factor, 1.0f);
    ck_assert_float_eq(c->rope_high_freq_factor, 4.0f);
    ck_assert_int_eq(c->rope_orig_max_pos, 1024);
    ck_assert_float_eq(c->rope_theta, 500000.0f);
    ck_assert_int_eq(c->tied_embeddings, 0);
    ck_assert_int_eq(c->bos_id, 1);
    ck_assert_int_eq(c->eos_id, 2); /* [2, 3]: the first */
    ck_assert_int_eq(m->tok_source, TOKSRC_HF_JSON);
    ck_assert_ptr_null(m->gguf);
    ck_assert_str_eq(m->chat_hint, "llama3");
    const char *tj = m->tokenizer_json;
    ck_assert_str_eq(tj + strlen(tj) - strlen("hf_llama/tokenizer.json"), "hf_llama/tokenizer.json");
    ck_assert_int_eq(compare_originals(m, &f, 0), 21);
    model_destroy(&m);
    fx_free(&f);
}
END_TEST

START_TEST(test_hf_sharded_tied) {
    Fx f;
    fx_load(&f, "expected");
    Model *m = load_ok(tu_fixture("loader/hf_sharded"));
    ck_assert_int_eq(m->cfg.tied_embeddings, 1);
    ck_assert_ptr_eq(m->w.wcls.data, m->w.tok_embeddings.data);
    ck_assert_int_eq(m->cfg.eos_id, 2);
    ck_assert_int_eq(m->cfg.rope_scaling, 0);
    ck_assert_str_eq(m->chat_hint, "");
    ck_assert_int_eq(compare_originals(m, &f, 1), 20);
    /* fingerprints: stable across loads, different for different models/formats */
    Model *m2 = load_ok(tu_fixture("loader/hf_sharded"));
    Model *g = load_ok(tu_fixture("loader/tiny.gguf"));
    Model *h = load_ok(tu_fixture("loader/hf_llama"));
    ck_assert_str_eq(m->fingerprint, m2->fingerprint);
    ck_assert_str_ne(m->fingerprint, g->fingerprint);
    ck_assert_str_ne(m->fingerprint, h->fingerprint);
    ck_assert_str_ne(g->fingerprint, h->fingerprint);
    model_destroy(&m);
    model_destroy(&m2);
    model_destroy(&g);
    model_destroy(&h);
    fx_free(&f);
}
END_TEST

START_TEST(test_hf_qwen2_qwen3) {
    Fx f;
    fx_load(&f, "expected");
    Model *m = load_ok(tu_fixture("loader/hf_qwen2"));
    ck_assert_int_eq(m->cfg.arch, ARCH_QWEN2);
    ck_assert_int_eq(m->cfg.has_qkv_bias, 1);
    ck_assert_int_eq(m->cfg.has_qk_norm, 0);
    ck_assert_int_eq(m->cfg.n_layers, 1);
    ck_assert_int_eq(m->cfg.bos_id, -1); /* null in config.json */
    ck_assert_int_eq(m->cfg.eos_id, 5);
    ck_assert_float_eq(m->cfg.rope_theta, 1000000.0f);
    ck_assert_str_eq(m->chat_hint, "qwen2");
    ck_assert_ptr_null(m->w.layers[0].q_norm);
    size_t n;
    float mx;
    const char *bias[] = {"q", "k", "v"};
    for (int i = 0; i < 3; i++) {
        char key[96];
        snprintf(key, sizeof key, "model.layers.0.self_attn.%s_proj.bias", bias[i]);
        char fk[128];
        snprintf(fk, sizeof fk, "qwen2:%s", key);
        const float *ref = fx_get(&f, fk, &n);
        ck_assert_ptr_nonnull(ref);
        ck_assert_int_eq(tu_compare(key, hf_ptr(m, key), ref, n, 0, 0, &mx), 0);
    }
    const float *wq = fx_get(&f, "model.layers.0.self_attn.q_proj.weight", &n);
    ck_assert_int_eq(tu_compare("qwen2 wq", tu_f32(&m->w.layers[0].wq), wq, n, 0, 0, &mx), 0);
    model_destroy(&m);

    m = load_ok(tu_fixture("loader/hf_qwen3"));
    ck_assert_int_eq(m->cfg.arch, ARCH_QWEN3);
    ck_assert_int_eq(m->cfg.head_dim, 16);
    ck_assert_int_eq(m->cfg.has_qk_norm, 1);
    ck_assert_int_eq(m->cfg.has_qkv_bias, 0);
    ck_assert_int_eq(m->cfg.bos_id, 3);
    ck_assert_int_eq(m->cfg.eos_id, 4);
    ck_assert_int_eq(m->cfg.max_seq_len, 40960);
    ck_assert_str_eq(m->chat_hint, "qwen3");
    ck_assert_ptr_null(m->w.layers[0].bq);
    int checked = 0;
    cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(f.j, "tensors")) {
        if (strncmp(t->string, "qwen3:", 6) != 0) continue;
        const float *ref = fx_get(&f, t->string, &n);
        ck_assert_int_eq(tu_compare(t->string, hf_ptr(m, t->string + 6), ref, n, 0, 0, &mx), 0);
        checked++;
    }
    ck_assert_int_eq(checked, 6);
    model_destroy(&m);
    fx_free(&f);
}
END_TEST

/* ---- default model ---- */

START_TEST(test_default_model) {
    Fx f;
    fx_load(&f, "default_model");
    uint64_t t0 = rs_now_ns();
    Model *m = load_ok(tu_default_model_path());
    fprintf(stderr, "loader: default model loaded in %.3f s (sanitized build)\n",
            (rs_now_ns() - t0) / 1e9);
    const cJSON *c = cJSON_GetObjectItem(f.j, "config");
#define CFG(field, key) ck_assert_int_eq(m->cfg.field, cJSON_GetObjectItem(c, key)->valueint)
    CFG(dim, "dim");
    CFG(hidden_dim, "hidden_dim");
    CFG(n_layers, "n_layers");
    CFG(n_heads, "n_heads");
    CFG(n_kv_heads, "n_kv_heads");
    CFG(vocab_size, "vocab_size");
    CFG(max_seq_len, "max_seq_len");
    CFG(bos_id, "bos_id");
    CFG(eos_id, "eos_id");
#undef CFG
    ck_assert_int_eq(m->cfg.head_dim, 64);
    ck_assert_float_eq_tol(m->cfg.norm_eps, cJSON_GetObjectItem(c, "norm_eps")->valuedouble, 1e-12);
    ck_assert_float_eq(m->cfg.rope_theta, cJSON_GetObjectItem(c, "rope_theta")->valuedouble);
    ck_assert_int_eq(m->cfg.tied_embeddings, cJSON_IsTrue(cJSON_GetObjectItem(c, "tied")));
    ck_assert_int_eq(m->cfg.tied_embeddings, 1);
    ck_assert_ptr_eq(m->w.wcls.data, m->w.tok_embeddings.data);
    ck_assert_str_eq(m->chat_hint, "smollm2");
    /* rows dumped by gguf-py (q/k un-permuted by numpy) */
    const cJSON *rows;
    int checked = 0;
    cJSON_ArrayForEach(rows, cJSON_GetObjectItem(f.j, "rows")) {
        const char *name = rows->string;
        size_t n;
        const float *ref = fx_get(&f, name, &n);
        float *base = NULL;
        int l = 0, cols = 576;
        char what[32] = "";
        if (!strcmp(name, "token_embd.weight")) base = tu_f32(&m->w.tok_embeddings);
        else {
            ck_assert(sscanf(name, "blk.%d.%31[a-z_]", &l, what) == 2);
            LayerWeights *L = &m->w.layers[l];
            if (!strcmp(what, "attn_q")) base = tu_f32(&L->wq);
            else if (!strcmp(what, "attn_k")) base = tu_f32(&L->wk);
            else if (!strcmp(what, "attn_v")) base = tu_f32(&L->wv);
            else if (!strcmp(what, "ffn_up")) base = tu_f32(&L->w_up);
            else if (!strcmp(what, "ffn_down")) base = tu_f32(&L->w_down), cols = 1536;
        }
        ck_assert_msg(base != NULL, "no mapping for %s", name);
        const cJSON *r;
        int k = 0;
        cJSON_ArrayForEach(r, rows) {
            float mx;
            char label[96];
            snprintf(label, sizeof label, "%s row %d", name, r->valueint);
            ck_assert_int_eq(tu_compare(label, base + (size_t)r->valueint * cols, ref + (size_t)k * cols,
                                        (size_t)cols, 1e-6f, 1e-6f, &mx),
                             0);
            k++;
            checked++;
        }
        ck_assert_int_eq((size_t)k * cols, n);
    }
    ck_assert_int_eq(checked, 20);
    size_t n;
    float mx;
    ck_assert_int_eq(tu_compare("attn_norm0", m->w.layers[0].attn_norm, fx_get(&f, "blk.0.attn_norm.weight", &n), 576, 0, 0, &mx), 0);
    ck_assert_int_eq(tu_compare("output_norm", m->w.final_norm, fx_get(&f, "output_norm.weight", &n), 576, 0, 0, &mx), 0);
    model_destroy(&m);
    fx_free(&f);
}
END_TEST

/* ---- refusals ---- */

static char tmpdir[256];

static void mk_tmp(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/rs_loader_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void rm_tmp(void) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    ck_assert_int_eq(system(cmd), 0);
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *fp = fopen(path, "wb");
    ck_assert_ptr_nonnull(fp);
    ck_assert_int_eq(fwrite(p, 1, n, fp), n);
    fclose(fp);
}

/* Expects model_load(path) to fail with `code` and a message containing each needle. */
static void expect_fail(const char *path, int code, const char *n1, const char *n2) {
    Model *m = (Model *)1;
    RsErr e = {0};
    int rc = model_load(path, &m, &e);
    ck_assert_msg(rc == code, "%s: got %d (%s), want %d", path, rc, e.msg, code);
    ck_assert_ptr_null(m);
    ck_assert_msg(strstr(e.msg, n1) != NULL, "message '%s' lacks '%s'", e.msg, n1);
    if (n2) ck_assert_msg(strstr(e.msg, n2) != NULL, "message '%s' lacks '%s'", e.msg, n2);
}

static char *tiny;
static size_t tiny_len;

static void load_tiny(void) {
    RsErr e = {0};
    ck_assert_msg(rs_read_file(tu_fixture("loader/tiny.gguf"), &tiny, &tiny_len, &e) == 0, "%s", e.msg);
}

/* Offset of the first byte after `needle` in the tiny GGUF. */
static size_t after(const char *needle) {
    const char *p = memmem(tiny, tiny_len, needle, strlen(needle));
    ck_assert_msg(p != NULL, "%s not in tiny.gguf", needle);
    return (size_t)(p - tiny) + strlen(needle);
}

static void put_u32(char *p, uint32_t v) { memcpy(p, &v, 4); }

/* Writes a patched copy of tiny.gguf and returns its path. */
static const char *patched(const char *name, size_t off, const void *bytes, size_t n) {
    static char path[400];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    char *b = malloc(tiny_len);
    memcpy(b, tiny, tiny_len);
    memcpy(b + off, bytes, n);
    write_bytes(path, b, tiny_len);
    free(b);
    return path;
}

START_TEST(test_gguf_truncated) {
    mk_tmp();
    load_tiny();
    char path[400];
    snprintf(path, sizeof path, "%s/cut.gguf", tmpdir);
    /* every cut inside header, metadata and tensor table; every 61st byte inside the data.
     * Cuts go from long to short with truncate(2): rewriting the file each time is slow. */
    size_t data_start = after("blk.1.ffn_down.weight") + 4 + 16 + 4 + 8;
    int cuts = 0;
    write_bytes(path, tiny, tiny_len);
    for (size_t cut = tiny_len - 1; cut + 1 > 0; cut -= cut > data_start + 64 ? 61 : 1) {
        ck_assert_int_eq(truncate(path, (off_t)cut), 0);
        Model *m = NULL;
        RsErr e = {0};
        int rc = model_load(path, &m, &e);
        ck_assert_msg(rc == RS_EFORMAT, "cut at %zu: rc %d (%s)", cut, rc, e.msg);
        ck_assert_msg(strstr(e.msg, "truncated") && strstr(e.msg, path), "cut at %zu: '%s'", cut, e.msg);
        cuts++;
    }
    ck_assert_int_gt(cuts, 3000);
    /* the data section: names the tensor whose bytes are missing */
    write_bytes(path, tiny, tiny_len - 10);
    expect_fail(path, RS_EFORMAT, "truncated: tensor 'blk.1.ffn_down.weight' data ends at byte", NULL);
    free(tiny);
    rm_tmp();
}
END_TEST

START_TEST(test_gguf_refusals) {
    mk_tmp();
    load_tiny();
    expect_fail(patched("magic.gguf", 0, "GGUX", 4), RS_EFORMAT, "not a GGUF file: bad magic", "47 47 55 58");
    uint32_t v = 7;
    expect_fail(patched("ver.gguf", 4, &v, 4), RS_EUNSUPPORTED, "unsupported GGUF version 7", NULL);
    uint64_t huge = 1ull << 60;
    expect_fail(patched("count.gguf", 8, &huge, 8), RS_EFORMAT, "claims", "1152921504606846976 tensors");
    /* tensor info of output_norm.weight: name, n_dims=1, ne[0], type, offset */
    size_t on = after("output_norm.weight");
    char b[4];
    put_u32(b, 200);
    expect_fail(patched("type.gguf", on + 4 + 8, b, 4), RS_EFORMAT, "unknown ggml type 200",
                "'output_norm.weight'");
    uint64_t ne16 = 16;
    expect_fail(patched("shape.gguf", on + 4, &ne16, 8), RS_EFORMAT,
                "tensor 'output_norm.weight' has shape [16], expected [32]", NULL);
    /* blk.0.attn_q.weight is F32 [32, 32]; as Q8_1 (a known type rootspec does not expand;
     * the message lists the ones it does) */
    size_t qn = after("blk.0.attn_q.weight");
    put_u32(b, 9);
    expect_fail(patched("q81.gguf", qn + 4 + 16, b, 4), RS_EUNSUPPORTED,
                "tensor 'blk.0.attn_q.weight' has type Q8_1", "supported: F32, F16, BF16, Q8_0");
    expect_fail(patched("arch.gguf", after("general.architecture") + 4 + 8, "mamba", 5),
                RS_EUNSUPPORTED, "architecture 'mamba' is not supported", NULL);
    size_t un = after("blk.1.ffn_up.weight");
    expect_fail(patched("missing.gguf", un - strlen("up.weight"), "xx", 2), RS_EFORMAT,
                "missing tensor 'blk.1.ffn_up.weight'", NULL);
    /* an absurd array length in metadata */
    size_t tk = after("tokenizer.ggml.tokens") + 4 + 4; /* type ARRAY, item type STRING, then n */
    expect_fail(patched("arr.gguf", tk, &huge, 8), RS_EFORMAT, "truncated or corrupt",
                "'tokenizer.ggml.tokens' claims 1152921504606846976 array elements");
    /* misaligned tensor offset */
    uint64_t off;
    memcpy(&off, tiny + on + 4 + 8 + 4, 8);
    off += 4;
    expect_fail(patched("align.gguf", on + 4 + 8 + 4, &off, 8), RS_EFORMAT, "is not aligned to 64", NULL);
    free(tiny);
    /* rope_freqs.weight that is not the llama3 curve: refused, not guessed */
    RsErr e = {0};
    ck_assert_int_eq(rs_read_file(tu_fixture("loader/tiny_llama3.gguf"), &tiny, &tiny_len, &e), 0);
    size_t data = (after("blk.1.ffn_down.weight") + 4 + 16 + 4 + 8 + 31) / 32 * 32;
    float two = 2.0f, one;
    memcpy(&one, tiny + data, 4);
    ck_assert(one == 1.0f); /* rope_freqs.weight[0], first in the data section */
    expect_fail(patched("rope.gguf", data, &two, 4), RS_EUNSUPPORTED,
                "rope_freqs.weight does not match llama3 rope scaling", NULL);
    free(tiny);
    rm_tmp();
}
END_TEST

/* Metadata values that used to be replaced by -1 (the message then named no key), a RoPE
 * size the forward pass does not implement, and a block count below the layers the file
 * holds (it used to load a truncated model). A RoPE size equal to the head size loads, so
 * that refusal is the value's. */
START_TEST(test_gguf_metadata_values) {
    mk_tmp();
    load_tiny();
    uint32_t v = 0;
    size_t kv = after("llama.attention.head_count_kv") + 4; /* after the u32 type */
    expect_fail(patched("kv0.gguf", kv, &v, 4), RS_EFORMAT,
                "metadata 'llama.attention.head_count_kv' = 0 is outside [1, 1024]", NULL);
    v = 5000;
    expect_fail(patched("kvbig.gguf", kv, &v, 4), RS_EFORMAT,
                "metadata 'llama.attention.head_count_kv' = 5000 is outside [1, 1024]", NULL);
    v = 1;
    expect_fail(patched("blocks.gguf", after("llama.block_count") + 4, &v, 4), RS_EFORMAT,
                "holds tensor 'blk.1.attn_norm.weight' but block_count is 1", NULL);
    free(tiny);

    RsErr e = {0};
    ck_assert_int_eq(rs_read_file(tu_fixture("loader/tiny_llama3.gguf"), &tiny, &tiny_len, &e), 0);
    v = 0;
    expect_fail(patched("vocab0.gguf", after("llama.vocab_size") + 4, &v, 4), RS_EFORMAT,
                "metadata 'llama.vocab_size' = 0 is outside [1, 1073741823]", NULL);
    /* llama.attention.key_length (8 = 32 / 4 heads) renamed in place to a key of the same
     * length, llama.rope.dimension_count: the head size stays 8 */
    const char *rk = "llama.rope.dimension_count";
    size_t kl = after("llama.attention.key_length") - strlen(rk);
    ck_assert_int_eq(strlen("llama.attention.key_length"), strlen(rk));
    char rec[64];
    memcpy(rec, rk, strlen(rk));
    memcpy(rec + strlen(rk), tiny + kl + strlen(rk), 4); /* the u32 type as it was */
    v = 4;
    memcpy(rec + strlen(rk) + 4, &v, 4);
    expect_fail(patched("rope4.gguf", kl, rec, strlen(rk) + 8), RS_EUNSUPPORTED,
                "llama.rope.dimension_count 4 differs from the head size 8", "partial RoPE");
    v = 8;
    memcpy(rec + strlen(rk) + 4, &v, 4);
    Model *m = load_ok(patched("rope8.gguf", kl, rec, strlen(rk) + 8));
    ck_assert_int_eq(m->cfg.head_dim, 8);
    model_destroy(&m);
    free(tiny);
    rm_tmp();
}
END_TEST

/* Writes dir/model.safetensors with one tensor (header JSON given) and `data_len` bytes. */
static void write_st(const char *dir, const char *header, size_t data_len) {
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    size_t hl = strlen(header);
    char *b = calloc(1, 8 + hl + data_len);
    uint64_t h64 = hl;
    memcpy(b, &h64, 8);
    memcpy(b + 8, header, hl);
    write_bytes(path, b, 8 + hl + data_len);
    free(b);
}

static void copy_config(const char *from_dir, const char *to_dir, const char *replace_from,
                        const char *replace_to) {
    char *txt;
    size_t len;
    RsErr e = {0};
    char src[512], dst[512];
    snprintf(src, sizeof src, "%s/config.json", tu_fixture(from_dir));
    ck_assert_int_eq(rs_read_file(src, &txt, &len, &e), 0);
    char out[8192];
    char *p = replace_from ? strstr(txt, replace_from) : NULL;
    if (p) {
        *p = 0;
        snprintf(out, sizeof out, "%s%s%s", txt, replace_to, p + strlen(replace_from));
    } else {
        snprintf(out, sizeof out, "%s", txt);
    }
    snprintf(dst, sizeof dst, "%s/config.json", to_dir);
    write_bytes(dst, out, strlen(out));
    free(txt);
}

START_TEST(test_hf_refusals) {
    mk_tmp();
    char d[400];
    snprintf(d, sizeof d, "%s/empty", tmpdir);
    ck_assert_int_eq(mkdir(d, 0700), 0);
    expect_fail(d, RS_EINVAL, "no config.json in", d);
    copy_config("loader/hf_sharded", d, NULL, NULL); /* config but no weights */
    expect_fail(d, RS_EINVAL, "no model.safetensors or model.safetensors.index.json", NULL);

    write_st(d, "{\"model.embed_tokens.weight\":{\"dtype\":\"I32\",\"shape\":[64,32],"
                "\"data_offsets\":[0,8192]}}", 8192);
    expect_fail(d, RS_EUNSUPPORTED, "tensor 'model.embed_tokens.weight' has dtype I32", NULL);
    write_st(d, "{\"model.embed_tokens.weight\":{\"dtype\":\"F8_E4M3FNUZ\",\"shape\":[64,32],"
                "\"data_offsets\":[0,2048]}}", 2048);
    expect_fail(d, RS_EUNSUPPORTED, "has dtype F8_E4M3FNUZ", NULL);
    write_st(d, "{\"model.embed_tokens.weight\":{\"dtype\":\"F32\",\"shape\":[64,32],"
                "\"data_offsets\":[0,8192]}}", 100);
    expect_fail(d, RS_EFORMAT, "data_offsets [0, 8192] run past the end of the data (100 bytes)", NULL);
    write_st(d, "{\"model.embed_tokens.weight\":{\"dtype\":\"F32\",\"shape\":[64,32],"
                "\"data_offsets\":[0,4096]}}", 8192);
    expect_fail(d, RS_EFORMAT, "holds 4096 bytes but F32 x 2048 elements need 8192", NULL);
    write_st(d, "{\"model.embed_tokens.weight\":{\"dtype\":\"F32\",\"shape\":[64,16],"
                "\"data_offsets\":[0,4096]}}", 4096);
    expect_fail(d, RS_EFORMAT, "tensor 'model.embed_tokens.weight' has shape [64, 16], expected [64, 32]", NULL);
    write_st(d, "{\"model.embed_tokens.weight\":{\"dtype\":\"F32\",\"shape\":[64,32],"
                "\"data_offsets\":[0,8192]}}", 8192);
    expect_fail(d, RS_EFORMAT, "missing tensor 'model.layers.0.input_layernorm.weight'", NULL);
    write_st(d, "{\"model.embed_tokens.weight\":", 8);
    expect_fail(d, RS_EFORMAT, "safetensors header is not a JSON object", NULL);
    /* header length beyond the file */
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", d);
    uint64_t big = 1ull << 40;
    write_bytes(path, &big, 8);
    expect_fail(d, RS_EFORMAT, "safetensors header length 1099511627776 exceeds the file size 8", NULL);

    copy_config("loader/hf_sharded", d, "LlamaForCausalLM", "MambaForCausalLM");
    expect_fail(d, RS_EUNSUPPORTED, "architecture 'MambaForCausalLM' is not supported", NULL);
    copy_config("loader/hf_sharded", d, "\"hidden_size\"", "\"hidden_sizes\"");
    expect_fail(d, RS_EFORMAT, "missing \"hidden_size\"", NULL);
    copy_config("loader/hf_sharded", d, "\"silu\"", "\"gelu\"");
    expect_fail(d, RS_EUNSUPPORTED, "hidden_act 'gelu'", NULL);
    copy_config("loader/hf_sharded", d, "\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3");
    expect_fail(d, RS_EFORMAT, "n_heads 4 is not a multiple of n_kv_heads 3", NULL);
    copy_config("loader/hf_llama", d, "\"llama3\"", "\"yarn\"");
    expect_fail(d, RS_EUNSUPPORTED, "rope_scaling type 'yarn'", NULL);
    rm_tmp();
}
END_TEST

/* num_hidden_layers below the layers the checkpoint holds: refused, not truncated. */
START_TEST(test_hf_fewer_layers_than_weights) {
    mk_tmp();
    char d[400], src[PATH_MAX], dst[512];
    snprintf(d, sizeof d, "%s/hf", tmpdir);
    ck_assert_int_eq(mkdir(d, 0700), 0);
    ck_assert_ptr_nonnull(realpath(tu_fixture("loader/hf_llama/model.safetensors"), src));
    snprintf(dst, sizeof dst, "%s/model.safetensors", d);
    ck_assert_int_eq(symlink(src, dst), 0);
    copy_config("loader/hf_llama", d, NULL, NULL);
    Model *m = load_ok(d); /* the copy as it is loads */
    ck_assert_int_eq(m->cfg.n_layers, 2);
    model_destroy(&m);
    copy_config("loader/hf_llama", d, "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 1");
    expect_fail(d, RS_EFORMAT,
                "holds tensor 'model.layers.1.input_layernorm.weight' but num_hidden_layers is 1",
                NULL);
    rm_tmp();
}
END_TEST

/* A directory where a file is expected is refused as such (it used to reach a huge
 * allocation, or a seek error, depending on the file system). */
START_TEST(test_read_file_directory) {
    mk_tmp();
    char *buf = (char *)1;
    size_t n = 7;
    RsErr e = {0};
    ck_assert_int_eq(rs_read_file(tmpdir, &buf, &n, &e), RS_EINVAL);
    ck_assert_ptr_null(buf);
    ck_assert_msg(strstr(e.msg, "is a directory, expected a regular file") && strstr(e.msg, tmpdir),
                  "%s", e.msg);
    rm_tmp();
}
END_TEST

START_TEST(test_load_missing_path) {
    /* bad input (exit status 2), like a missing config.json or tokenizer.json */
    expect_fail("tests/fixtures/loader/nope.gguf", RS_EINVAL, "'tests/fixtures/loader/nope.gguf' does not exist", NULL);
}
END_TEST


/* ---- hostile files: FIFOs, header bounds, offset messages ---- */

/* A FIFO where a file is expected used to block open() forever (no writer): the model file,
 * config.json, tokenizer.json, a safetensors shard and any rs_read_file. Each is refused
 * at once, naming the path; Check's test timeout catches a hang. */
START_TEST(test_fifo_refused) {
    mk_tmp();
    char f[400], d[400], p[512], src[PATH_MAX];
    snprintf(f, sizeof f, "%s/fifo.gguf", tmpdir);
    ck_assert_int_eq(mkfifo(f, 0600), 0);
    expect_fail(f, RS_EINVAL, "is a FIFO, expected a regular file", f);
    char *buf = NULL;
    RsErr e = {0};
    ck_assert_int_eq(rs_read_file(f, &buf, NULL, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "is a FIFO"), "%s", e.msg);
    /* an HF directory: links to the fixture's files, one at a time a FIFO */
    const char *names[] = {"config.json", "model.safetensors", "tokenizer.json"};
    for (int k = 0; k < 3; k++) {
        snprintf(d, sizeof d, "%s/hf%d", tmpdir, k);
        ck_assert_int_eq(mkdir(d, 0700), 0);
        for (int i = 0; i < 3; i++) {
            snprintf(p, sizeof p, "%s/%s", d, names[i]);
            if (i == k) {
                ck_assert_int_eq(mkfifo(p, 0600), 0);
                continue;
            }
            char rel[256];
            snprintf(rel, sizeof rel, "golden/llama3_rope/%s", names[i]);
            ck_assert_ptr_nonnull(realpath(tu_fixture(rel), src));
            ck_assert_int_eq(symlink(src, p), 0);
        }
        snprintf(p, sizeof p, "%s/%s", d, names[k]);
        Model *m = NULL;
        int rc = model_load(d, &m, &e);
        if (k < 2) {
            ck_assert_msg(rc == RS_EINVAL && strstr(e.msg, "is a FIFO") && strstr(e.msg, p),
                          "%s: %d %s", names[k], rc, e.msg);
            continue;
        }
        ck_assert_msg(rc == 0, "%s", e.msg); /* the tokenizer is read by tokenizer_load_model */
        Tokenizer *tok = NULL;
        rc = tokenizer_load_model(m, &tok, &e);
        ck_assert_msg(rc == RS_EINVAL && strstr(e.msg, "is a FIFO") && strstr(e.msg, p), "%d %s",
                      rc, e.msg);
        model_destroy(&m);
    }
    rm_tmp();
}
END_TEST

/* Writes a safetensors file at path with `n` unused 4-byte tensor entries (and their data). */
static void write_st_entries(const char *path, int n) {
    size_t cap = (size_t)n * 80 + 64, hl = 0;
    char *h = malloc(cap);
    hl += (size_t)snprintf(h, cap, "{");
    for (int i = 0; i < n; i++)
        hl += (size_t)snprintf(h + hl, cap - hl,
                               "%s\"unused.%d\":{\"dtype\":\"F32\",\"shape\":[1],"
                               "\"data_offsets\":[%d,%d]}",
                               i ? "," : "", i, 4 * i, 4 * i + 4);
    hl += (size_t)snprintf(h + hl, cap - hl, "}");
    size_t total = 8 + hl + 4 * (size_t)n;
    char *b = calloc(1, total);
    uint64_t h64 = hl;
    memcpy(b, &h64, 8);
    memcpy(b + 8, h, hl);
    write_bytes(path, b, total);
    free(b);
    free(h);
}

/* Headers full of unused entries used to be parsed whole (3 shards x 1.5 M entries: 3.9 GB,
 * or "not a JSON object" under a memory limit). The entry count is bounded per file before
 * parsing, and the entries of all shards together, each message naming its limit. */
START_TEST(test_st_header_bounds) {
    mk_tmp();
    char d[400], p[512];
    snprintf(d, sizeof d, "%s/one", tmpdir);
    ck_assert_int_eq(mkdir(d, 0700), 0);
    copy_config("loader/hf_sharded", d, NULL, NULL);
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    write_st_entries(p, 70000);
    expect_fail(d, RS_EFORMAT, "safetensors header has 70000 entries", "limit is 65536 entries");
    /* five shards of 60,000 entries: each within the per-file bound, 300,000 in all */
    snprintf(d, sizeof d, "%s/five", tmpdir);
    ck_assert_int_eq(mkdir(d, 0700), 0);
    copy_config("loader/hf_sharded", d, NULL, NULL);
    char idx[1024] = "{\"weight_map\":{";
    for (int s = 0; s < 5; s++) {
        snprintf(p, sizeof p, "%s/s%d.safetensors", d, s);
        write_st_entries(p, 60000);
        snprintf(idx + strlen(idx), sizeof idx - strlen(idx), "%s\"t%d\":\"s%d.safetensors\"",
                 s ? "," : "", s, s);
    }
    strcat(idx, "}}");
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", d);
    write_bytes(p, idx, strlen(idx));
    expect_fail(d, RS_EFORMAT, "hold 300000 entries", "limit is 262144 entries");
    rm_tmp();
}
END_TEST

/* Offsets reported as they are: 2^64 - 64 used to read "data ends at byte 1992992" (the sum
 * wrapped), and safetensors offsets [0.5, 8192.5] were printed as [0, 8192]. */
START_TEST(test_offset_messages) {
    mk_tmp();
    load_tiny();
    size_t on = after("output_norm.weight");
    uint64_t off = UINT64_MAX - 63;
    expect_fail(patched("wrap.gguf", on + 4 + 8 + 4, &off, 8), RS_EFORMAT,
                "tensor 'output_norm.weight' offset 18446744073709551552 lies past the end of "
                "the file", NULL);
    free(tiny);
    char d[400];
    snprintf(d, sizeof d, "%s/hf", tmpdir);
    ck_assert_int_eq(mkdir(d, 0700), 0);
    copy_config("loader/hf_sharded", d, NULL, NULL);
    write_st(d, "{\"model.embed_tokens.weight\":{\"dtype\":\"F32\",\"shape\":[64,32],"
                "\"data_offsets\":[0.5,8192.5]}}", 8200);
    expect_fail(d, RS_EFORMAT, "data_offsets [0.5, 8192.5] are not non-negative integers", NULL);
    /* a tensor name with terminal controls is escaped in the message */
    write_st(d, "{\"evil\\u001b[2J\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8);
    expect_fail(d, RS_EFORMAT, "tensor 'evil\\x1b[2J' holds 8 bytes", NULL);
    rm_tmp();
}
END_TEST

/* ---- layer views ---- */

START_TEST(test_layer_view) {
    Model *m = load_ok(tu_fixture("loader/tiny.gguf"));
    Model *v = NULL;
    RsErr e = {0};
    ck_assert_int_eq(model_layer_view(m, "0-1", &v, &e), RS_OK);
    ck_assert_int_eq(v->cfg.n_layers, 2);
    ck_assert_ptr_eq(v->w.layers[0].wq.data, m->w.layers[0].wq.data);
    ck_assert_ptr_eq(v->w.layers[1].w_down.data, m->w.layers[1].w_down.data);
    ck_assert_ptr_eq(v->w.tok_embeddings.data, m->w.tok_embeddings.data);
    ck_assert_ptr_eq(v->w.wcls.data, m->w.wcls.data);
    ck_assert_int_eq(v->is_view, 1);
    ck_assert_str_ne(v->fingerprint, m->fingerprint);
    model_destroy(&v);
    ck_assert_int_eq(model_layer_view(m, "1,0", &v, &e), RS_OK);
    ck_assert_int_eq(v->cfg.n_layers, 2);
    ck_assert_ptr_eq(v->w.layers[0].wq.data, m->w.layers[1].wq.data);
    ck_assert_ptr_eq(v->w.layers[1].wq.data, m->w.layers[0].wq.data);
    model_destroy(&v);
    ck_assert_int_eq(model_layer_view(m, "1", &v, &e), RS_OK);
    ck_assert_int_eq(v->cfg.n_layers, 1);
    ck_assert_ptr_eq(v->w.layers[0].wk.data, m->w.layers[1].wk.data);
    model_destroy(&v);
    /* presets on a 30-layer model (SmolLM2-135M's depth): the first 15, the first 4 */
    Model *deep = NULL;
    ck_assert_msg(model_load("random:tiny,layers=30", &deep, &e) == RS_OK, "%s", e.msg);
    ck_assert_msg(model_random_materialize(deep, &e) == RS_OK, "%s", e.msg);
    static const struct { const char *spec; int n; } want[] = {{"half", 15}, {"short", 4}};
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(model_layer_view(deep, want[i].spec, &v, &e) == RS_OK, "%s", e.msg);
        ck_assert_int_eq(v->cfg.n_layers, want[i].n);
        for (int l = 0; l < want[i].n; l++)
            ck_assert_ptr_eq(v->w.layers[l].wq.data, deep->w.layers[l].wq.data);
        model_destroy(&v);
    }
    model_destroy(&deep);
    /* presets on this 2-layer model: half and short are both layer 0 */
    static const char *presets[] = {"half", "short"};
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(model_layer_view(m, presets[i], &v, &e) == RS_OK, "%s", e.msg);
        ck_assert_int_eq(v->cfg.n_layers, 1);
        ck_assert_ptr_eq(v->w.layers[0].wq.data, m->w.layers[0].wq.data);
        model_destroy(&v);
    }
    static const struct { const char *spec, *msg; } bad[] = {
        {"", "empty --draft-layers spec"},
        {"2", "range 2-2 outside 0-1"},
        {"0-2", "range 0-2 outside 0-1"},
        {"1-0", "range 1-0 is reversed (write 0-1)"},
        {"0-", "bad --draft-layers range in '0-'"},
        {"a", "bad --draft-layers spec 'a' at 'a'"},
        {"0-1x", "bad --draft-layers spec '0-1x' at 'x'"},
        {"0,1,0", "lists more than 2 layers"},
        {"shorter", "bad --draft-layers spec 'shorter' at 'shorter'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        e.msg[0] = 0;
        v = (Model *)1;
        ck_assert_int_eq(model_layer_view(m, bad[i].spec, &v, &e), RS_EINVAL);
        ck_assert_ptr_null(v);
        ck_assert_msg(strstr(e.msg, bad[i].msg), "spec '%s': '%s' lacks '%s'", bad[i].spec, e.msg, bad[i].msg);
    }
    model_destroy(&m);
}
END_TEST

/* model_make_resident moves every matrix into its huge-page buffer with the file's bytes
 * (against a second, mapped load of the same file), keeps tied embeddings tied, is a no-op
 * the second time, and a view made afterwards points into the buffer too. A GGUF (one
 * mapping) and a sharded, tied Hugging Face directory (several). */
START_TEST(test_make_resident) {
    static const char *paths[] = {"loader/tiny.gguf", "loader/hf_sharded"};
    for (int pi = 0; pi < 2; pi++) {
        Model *m = load_ok(tu_fixture(paths[pi])), *ref = load_ok(tu_fixture(paths[pi]));
        QTensor *w[MODEL_MAX_MATRICES(8)], *rw[MODEL_MAX_MATRICES(8)];
        ck_assert_int_le(m->cfg.n_layers, 8);
        int n = model_matrices(m, w), moved = 0;
        model_matrices(ref, rw);
        RsErr e = {0};
        ck_assert_int_eq(model_make_resident(m, &e), RS_OK);
        ck_assert_ptr_nonnull(m->resident);
        const uint8_t *r0 = m->resident, *r1 = r0 + m->resident_bytes;
        for (int i = 0; i < n; i++) {
            const uint8_t *p = w[i]->data;
            size_t bytes = (size_t)w[i]->rows * w[i]->row_bytes;
            ck_assert_msg(rw[i]->data == NULL || (p >= r0 && p + bytes <= r1),
                          "%s matrix %d not in the resident buffer", paths[pi], i);
            if (!p) continue;
            ck_assert_int_eq(w[i]->type, rw[i]->type);
            ck_assert_msg(memcmp(p, rw[i]->data, bytes) == 0, "%s matrix %d: bytes differ",
                          paths[pi], i);
            moved++;
        }
        ck_assert_int_ge(moved, 2 + 7 * m->cfg.n_layers - 1);
        if (m->cfg.tied_embeddings) ck_assert_ptr_eq(m->w.wcls.data, m->w.tok_embeddings.data);
        const void *before = m->w.layers[0].wq.data;
        ck_assert_int_eq(model_make_resident(m, &e), RS_OK);
        ck_assert_ptr_eq(m->w.layers[0].wq.data, before);
        Model *v = NULL;
        ck_assert_int_eq(model_layer_view(m, "1", &v, &e), RS_OK);
        ck_assert_ptr_eq(v->w.layers[0].w_up.data, m->w.layers[1].w_up.data);
        ck_assert_int_eq(model_make_resident(v, &e), RS_OK); /* a view owns nothing */
        ck_assert_ptr_null(v->resident);
        model_destroy(&v);
        model_destroy(&m);
        model_destroy(&ref);
    }
}
END_TEST

static int want_all(uint32_t type, const void *ctx) {
    (void)type, (void)ctx;
    return 1;
}

static int want_none(uint32_t type, const void *ctx) {
    (void)type, (void)ctx;
    return 0;
}

/* model_pack_x4 rewrites every matrix of an x4 type with whole tiles (and GGUF heads) in
 * place: each logical row reads back (qtensor_row_bytes, qtensor_dequantize_rows) as a
 * second, unpacked load of the file has it, q/k rows in logical order; other types keep
 * their bytes; tied embeddings stay tied; nothing happens before make_resident, for types
 * the caller does not want, or a second time. tiny.gguf: Q8_0, Q4_0, Q4_1 of one and two
 * blocks a row, GGUF q/k among them; the Q4_K_M fixture: Q5_0 q, Q5_1 gate. */
START_TEST(test_pack_x4) {
    static const char *paths[] = {"loader/tiny.gguf", "golden/llama_q4km/model.gguf"};
    for (int pi = 0; pi < 2; pi++) {
        Model *m = load_ok(tu_fixture(paths[pi])), *ref = load_ok(tu_fixture(paths[pi]));
        QTensor *w[MODEL_MAX_MATRICES(8)], *rw[MODEL_MAX_MATRICES(8)];
        ck_assert_int_le(m->cfg.n_layers, 8);
        int n = model_matrices(m, w), perm = 0, packed = 0;
        model_matrices(ref, rw);
        RsErr e = {0};
        ck_assert_int_eq(model_pack_x4(m, want_all, NULL), 0); /* not resident yet */
        ck_assert_int_eq(model_make_resident(m, &e), RS_OK);
        ck_assert_int_eq(model_pack_x4(m, want_none, NULL), 0);
        int np = model_pack_x4(m, want_all, NULL);
        ck_assert_int_eq(model_pack_x4(m, want_all, NULL), 0);
        uint8_t *row = rs_xmalloc(4096), *rrow = rs_xmalloc(4096);
        float *f = rs_xmalloc(sizeof(float) * 1024), *rf = rs_xmalloc(sizeof(float) * 1024);
        for (int i = 0; i < n; i++) {
            if (!w[i]->data) continue;
            int x4 = quant_x4_ok(w[i]->type) && w[i]->rows % 4 == 0;
            ck_assert_msg(w[i]->packed == x4, "%s matrix %d (%s): packed %d", paths[pi], i,
                          quant_type_name(w[i]->type), w[i]->packed);
            packed += x4;
            perm += x4 && rw[i]->perm_hd;
            ck_assert_int_eq(w[i]->perm_hd, x4 ? 0 : rw[i]->perm_hd);
            ck_assert(w[i]->row_bytes <= 4096 && w[i]->cols <= 1024);
            for (int j = 0; j < w[i]->rows; j++) {
                qtensor_row_bytes(w[i], j, row);
                ck_assert_msg(!memcmp(row, qtensor_row(rw[i], j), w[i]->row_bytes),
                              "%s matrix %d row %d", paths[pi], i, j);
                qtensor_dequantize_rows(w[i], j, 1, f);
                qtensor_dequantize_rows(rw[i], j, 1, rf);
                ck_assert(!memcmp(f, rf, sizeof(float) * w[i]->cols));
            }
        }
        ck_assert_int_ge(np, 3);
        ck_assert_int_ge(packed, np);
        ck_assert_int_ge(perm, 1);
        ck_assert_int_eq(m->w.wcls.data == m->w.tok_embeddings.data, m->cfg.tied_embeddings);
        free(row), free(rrow), free(f), free(rf);
        model_destroy(&m);
        model_destroy(&ref);
    }
}
END_TEST


START_TEST(test_half_floats) {
    /* IEEE binary16 / bfloat16 reference values */
    ck_assert(quant_f16_to_f32(0x3c00) == 1.0f);
    ck_assert(quant_f16_to_f32(0xc000) == -2.0f);
    ck_assert(quant_f16_to_f32(0x7bff) == 65504.0f);
    ck_assert(quant_f16_to_f32(0x0001) == ldexpf(1.0f, -24)); /* smallest subnormal */
    ck_assert(quant_f16_to_f32(0x03ff) == ldexpf(1023.0f, -24));
    ck_assert(quant_f16_to_f32(0x8000) == 0.0f && signbit(quant_f16_to_f32(0x8000)));
    ck_assert(isinf(quant_f16_to_f32(0x7c00)));
    ck_assert(isnan(quant_f16_to_f32(0x7e00)));
    ck_assert(quant_f16_to_f32(0x3555) == 0.333251953125f);
    ck_assert(quant_bf16_to_f32(0x3f80) == 1.0f);
    ck_assert(quant_bf16_to_f32(0xc2f7) == -123.5f);
    ck_assert_str_eq(quant_type_name(QT_Q4_1), "Q4_1");
    ck_assert_ptr_null(quant_type_name(200));
    ck_assert(!quant_type_supported(10)); /* Q2_K */
    ck_assert(quant_type_supported(QT_Q4_K) && quant_type_supported(QT_Q6_K));
}
END_TEST

Suite *suite_loader(void) {
    Suite *s = suite_create("loader");
    TCase *fmt = tcase_create("formats"), *bad = tcase_create("refusals");
    TCase *def = tcase_create("default_model");
    tcase_set_timeout(fmt, 60);
    tcase_set_timeout(bad, 120);
    tcase_set_timeout(def, 120); /* ~2-3 s under ASan; generous for a loaded machine */
    tcase_add_test(fmt, test_half_floats);
    tcase_add_test(fmt, test_gguf_tiny_config);
    tcase_add_test(fmt, test_gguf_tiny_weights);
    tcase_add_test(fmt, test_gguf_metadata);
    tcase_add_test(fmt, test_gguf_llama3_rope);
    tcase_add_test(fmt, test_hf_llama_bf16);
    tcase_add_test(fmt, test_hf_sharded_tied);
    tcase_add_test(fmt, test_hf_qwen2_qwen3);
    tcase_add_test(fmt, test_layer_view);
    tcase_add_test(fmt, test_make_resident);
    tcase_add_test(fmt, test_pack_x4);
    tcase_add_test(bad, test_gguf_truncated);
    tcase_add_test(bad, test_gguf_refusals);
    tcase_add_test(bad, test_hf_refusals);
    tcase_add_test(bad, test_gguf_metadata_values);
    tcase_add_test(bad, test_hf_fewer_layers_than_weights);
    tcase_add_test(bad, test_read_file_directory);
    tcase_add_test(bad, test_load_missing_path);

    tcase_add_test(bad, test_fifo_refused);
    tcase_add_test(bad, test_st_header_bounds);
    tcase_add_test(bad, test_offset_messages);
    tcase_add_test(def, test_default_model);
    suite_add_tcase(s, fmt);
    suite_add_tcase(s, bad);
    suite_add_tcase(s, def);
    return s;
}
