/* EAGLE-3 head loader (see eagle3.h for the convention): config.json fields, the published
 * tensor names and shapes through the shared safetensors reader (hf.h), d2t/t2d checks,
 * the fit-to-target check, and random heads for runs without downloads. */
#include "eagle3.h"
#include "hf.h"
#include "randmodel.h"
#include <math.h>
#include <string.h>
#include <sys/mman.h>

static int has_arch(const cJSON *j, const char **name) {
    static const char *ok[] = {"LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM"};
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "architectures"), *it;
    *name = "(none)";
    cJSON_ArrayForEach(it, a) {
        if (!cJSON_IsString(it)) continue;
        *name = it->valuestring;
        for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
            if (!strcmp(it->valuestring, ok[i])) return 1;
    }
    return 0;
}

static int json_int(const cJSON *j, const char *key, int def, int *v, const char *path, RsErr *e) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!x || cJSON_IsNull(x)) {
        *v = def;
        return RS_OK;
    }
    if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < 1 ||
        x->valuedouble > (double)(1 << 24))
        return rs_err(e, RS_EFORMAT, "'%s': \"%s\" is not a positive integer", path, key);
    *v = (int)x->valuedouble;
    return RS_OK;
}

/* eagle_aux_hidden_state_layer_ids at the top level or in eagle_config (vLLM looks in
 * both, in that order); absent: -1s (the target's default applies). */
static int read_feature_layers(const cJSON *j, Eagle3Config *h, const char *path, RsErr *e) {
    const cJSON *ec = cJSON_GetObjectItemCaseSensitive(j, "eagle_config");
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(j, "eagle_aux_hidden_state_layer_ids");
    if (!ids && cJSON_IsObject(ec))
        ids = cJSON_GetObjectItemCaseSensitive(ec, "eagle_aux_hidden_state_layer_ids");
    for (int i = 0; i < EAGLE3_N_FEATURES; i++) h->feature_layers[i] = -1;
    if (!ids || cJSON_IsNull(ids)) return RS_OK;
    if (!cJSON_IsArray(ids) || cJSON_GetArraySize(ids) != EAGLE3_N_FEATURES)
        return rs_err(e, RS_EUNSUPPORTED,
                      "'%s': eagle_aux_hidden_state_layer_ids must list %d layers (fc takes "
                      "%d feature vectors)", path, EAGLE3_N_FEATURES, EAGLE3_N_FEATURES);
    int k = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, ids) {
        if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) ||
            it->valuedouble < 0 || it->valuedouble > 1024)
            return rs_err(e, RS_EFORMAT, "'%s': eagle_aux_hidden_state_layer_ids[%d] is not a "
                          "layer index", path, k);
        h->feature_layers[k++] = (int)it->valuedouble;
    }
    return RS_OK;
}

/* Refuses variants the forward does not implement, naming the key. */
static int refuse_variants(const cJSON *j, const char *path, RsErr *e) {
    const cJSON *ec = cJSON_GetObjectItemCaseSensitive(j, "eagle_config");
    if (cJSON_IsObject(ec) && cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(ec, "use_aux_hidden_state")))
        return rs_err(e, RS_EUNSUPPORTED, "'%s': eagle_config.use_aux_hidden_state false (an "
                      "EAGLE-1/2 style head without fc) is not supported", path);
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "norm_before_residual")))
        return rs_err(e, RS_EUNSUPPORTED, "'%s': norm_before_residual true is not supported "
                      "(the residual here is the un-normed hidden state)", path);
    return RS_OK;
}

static int read_head_config(const char *path, const cJSON *j, Eagle3Config *h, RsErr *e) {
    memset(h, 0, sizeof *h);
    const char *arch;
    if (!has_arch(j, &arch) && !strcmp(arch, "Eagle3Speculator"))
        return rs_err(e, RS_EUNSUPPORTED, "'%s': the speculators layout (Eagle3Speculator, "
                      "transformer_layer_config) is not supported; the LlamaForCausalLMEagle3 "
                      "layout of the published heads is", path);
    if (strcmp(arch, "LlamaForCausalLMEagle3") && strcmp(arch, "Eagle3LlamaForCausalLM"))
        return rs_err(e, RS_EUNSUPPORTED, "'%s': architecture '%s' is not an EAGLE-3 head "
                      "(LlamaForCausalLMEagle3 is)", path, arch);
    Config *c = &h->c;
    c->arch = ARCH_LLAMA;
    int rc = refuse_variants(j, path, e);
    if (!rc) rc = hf_config_fields(path, j, arch, c, e);
    if (rc) return rc;
    if (c->n_layers != 1)
        return rs_err(e, RS_EUNSUPPORTED, "'%s': num_hidden_layers %d: only one-layer EAGLE-3 "
                      "heads (midlayer) are supported", path, c->n_layers);
    if ((rc = json_int(j, "draft_vocab_size", c->vocab_size, &h->draft_vocab, path, e)) ||
        (rc = json_int(j, "target_hidden_size", c->dim, &h->target_hidden, path, e)) ||
        (rc = read_feature_layers(j, h, path, e)) || (rc = loader_check_config(c, path, e)))
        return rc;
    if (h->draft_vocab > c->vocab_size)
        return rs_err(e, RS_EFORMAT, "'%s': draft_vocab_size %d exceeds vocab_size %d", path,
                      h->draft_vocab, c->vocab_size);
    c->tied_embeddings = 0; /* the head's lm_head is over the draft vocabulary */
    return RS_OK;
}

typedef struct {
    const char *name;
    float **slot; /* a vector's arena pointer, or NULL for a matrix */
    QTensor *qt;  /* a matrix's descriptor, or NULL for a vector */
    int64_t rows, cols;
} HeadTensor;

/* The published tensor names in arena order; embed_tokens last (optional). Matrices get
 * their shape here, their type and data from the loader or the random fill. */
static int head_tensors(Eagle3Head *h, HeadTensor *t) {
    const Config *c = &h->cfg.c;
    int64_t D = c->dim, H = c->hidden_dim, Q = (int64_t)c->n_heads * c->head_dim;
    int64_t KV = (int64_t)c->n_kv_heads * c->head_dim, n = 0;
#define V(nm, sl) t[n++] = (HeadTensor){nm, &h->sl, NULL, D, 0}
#define M(nm, sl, r, co) \
    (h->sl.rows = (int)(r), h->sl.cols = (int)(co), t[n++] = (HeadTensor){nm, NULL, &h->sl, r, co})
    M("fc.weight", fc, D, (int64_t)EAGLE3_N_FEATURES * h->cfg.target_hidden);
    V("midlayer.input_layernorm.weight", input_norm);
    V("midlayer.hidden_norm.weight", hidden_norm);
    M("midlayer.self_attn.q_proj.weight", wq, Q, 2 * D);
    M("midlayer.self_attn.k_proj.weight", wk, KV, 2 * D);
    M("midlayer.self_attn.v_proj.weight", wv, KV, 2 * D);
    M("midlayer.self_attn.o_proj.weight", wo, D, Q);
    V("midlayer.post_attention_layernorm.weight", post_norm);
    M("midlayer.mlp.gate_proj.weight", w_gate, H, D);
    M("midlayer.mlp.up_proj.weight", w_up, H, D);
    M("midlayer.mlp.down_proj.weight", w_down, D, H);
    V("norm.weight", norm);
    M("lm_head.weight", lm_head, h->cfg.draft_vocab, D);
    M("embed_tokens.weight", embed, c->vocab_size, D);
#undef V
#undef M
    return (int)n;
}
#define HEAD_MAX_TENSORS 14

/* One new arena for the vectors, and with `matrices` for the matrices too (f32, a random
 * head's); n tensors. */
static int alloc_arena(Eagle3Head *h, HeadTensor *t, int n, int matrices, RsErr *e) {
    size_t total = 0;
    for (int i = 0; i < n; i++)
        if (t[i].slot || matrices) total += (size_t)t[i].rows * (size_t)(t[i].cols ? t[i].cols : 1);
    h->arena = malloc(total * sizeof(float));
    if (!h->arena)
        return rs_err(e, RS_ENOMEM, "cannot allocate %zu MiB for the EAGLE-3 head '%s'",
                      total * sizeof(float) >> 20, h->path);
    float *p = h->arena;
    for (int i = 0; i < n; i++) {
        if (t[i].slot) *t[i].slot = p;
        else if (matrices) *t[i].qt = qtensor_f32(p, (int)t[i].rows, (int)t[i].cols);
        else continue;
        p += (size_t)t[i].rows * (size_t)(t[i].cols ? t[i].cols : 1);
    }
    return RS_OK;
}

/* Integer vector tensor (I64 or I32) of n entries into out; name it in errors. */
static int read_ints(const HfTensors *ts, const char *name, int64_t n, int64_t *out,
                     const char *dir, RsErr *e) {
    HfTensorInfo ti;
    if (!hf_tensor_find(ts, name, &ti))
        return rs_err(e, RS_EFORMAT, "'%s': missing tensor '%s'", dir, name);
    size_t es = !strcmp(ti.dtype, "I64") ? 8 : !strcmp(ti.dtype, "I32") ? 4 : 0;
    if (!es)
        return rs_err(e, RS_EUNSUPPORTED, "'%s': tensor '%s' has dtype %s (I64 or I32 expected)",
                      ti.file, name, ti.dtype);
    if (ti.nd != 1 || ti.shape[0] != n)
        return rs_err(e, RS_EFORMAT, "'%s': tensor '%s' has %lld entries, expected %lld "
                      "(draft_vocab_size)", ti.file, name, ti.nd == 1 ? (long long)ti.shape[0] : -1LL,
                      (long long)n);
    const uint8_t *b = ti.data;
    for (int64_t i = 0; i < n; i++) {
        if (es == 8) memcpy(&out[i], b + 8 * i, 8);
        else {
            int32_t v;
            memcpy(&v, b + 4 * i, 4);
            out[i] = v;
        }
    }
    return RS_OK;
}

/* d2t (offsets) -> absolute target ids, each inside the vocabulary and used once; t2d, when
 * present, must mark exactly those ids. Without d2t the draft vocabulary must be the
 * target's (identity map, as vLLM and SGLang do). */
static int load_maps(Eagle3Head *h, const HfTensors *ts, RsErr *e) {
    int V = h->cfg.c.vocab_size, DV = h->cfg.draft_vocab;
    HfTensorInfo ti;
    h->d2t = rs_xmalloc(sizeof(int32_t) * (size_t)DV);
    if (!hf_tensor_find(ts, "d2t", &ti)) {
        if (DV != V)
            return rs_err(e, RS_EFORMAT, "'%s': missing tensor 'd2t' (draft_vocab_size %d != "
                          "vocab_size %d needs the draft-to-target map)", h->path, DV, V);
        for (int i = 0; i < DV; i++) h->d2t[i] = i;
        return RS_OK;
    }
    int64_t *off = rs_xmalloc(sizeof(int64_t) * (size_t)DV);
    uint8_t *seen = rs_xcalloc((size_t)V, 1);
    int rc = read_ints(ts, "d2t", DV, off, h->path, e);
    for (int i = 0; i < DV && !rc; i++) {
        int64_t t = (int64_t)i + off[i];
        if (t < 0 || t >= V)
            rc = rs_err(e, RS_EFORMAT, "'%s': d2t[%d] = %lld maps draft id %d to target id %lld, "
                        "outside the vocabulary of %d", h->path, i, (long long)off[i], i,
                        (long long)t, V);
        else if (seen[t]++)
            rc = rs_err(e, RS_EFORMAT, "'%s': d2t maps two draft ids to target id %lld (draft "
                        "id %d is the second)", h->path, (long long)t, i);
        else h->d2t[i] = (int32_t)t;
    }
    if (!rc && hf_tensor_find(ts, "t2d", &ti)) {
        if (ti.nd != 1 || ti.shape[0] != V || ti.bytes != (size_t)V)
            rc = rs_err(e, RS_EFORMAT, "'%s': tensor 't2d' (%s) is not %d one-byte flags "
                        "(vocab_size)", ti.file, ti.dtype, V);
        const uint8_t *f = ti.data;
        for (int t = 0; t < V && !rc; t++)
            if ((f[t] != 0) != (seen[t] != 0))
                rc = rs_err(e, RS_EFORMAT, "'%s': t2d[%d] = %d but d2t %s target id %d", h->path,
                            t, f[t] != 0, seen[t] ? "maps a draft id to" : "maps nothing to", t);
    }
    free(off);
    free(seen);
    return rc;
}

/* lm_head rows against draft_vocab_size, with a message naming both (the shape check
 * would only say "expected [..]"). */
static int check_lm_head(const Eagle3Head *h, const HfTensors *ts, RsErr *e) {
    HfTensorInfo ti;
    if (!hf_tensor_find(ts, "lm_head.weight", &ti))
        return rs_err(e, RS_EFORMAT, "'%s': missing tensor 'lm_head.weight'", h->path);
    if (ti.nd == 2 && ti.shape[0] != h->cfg.draft_vocab)
        return rs_err(e, RS_EFORMAT, "'%s': lm_head.weight has %lld rows but config.json "
                      "draft_vocab_size is %d", ti.file, (long long)ti.shape[0], h->cfg.draft_vocab);
    return RS_OK;
}

static int load_weights(Eagle3Head *h, const HfTensors *ts, RsErr *e) {
    HeadTensor t[HEAD_MAX_TENSORS];
    int n = head_tensors(h, t);
    HfTensorInfo ti;
    if (!hf_tensor_find(ts, "embed_tokens.weight", &ti)) n--; /* borrowed from the target */
    int rc = check_lm_head(h, ts, e);
    if (!rc) rc = alloc_arena(h, t, n, 0, e);
    uint64_t fp = loader_fnv_config(0xcbf29ce484222325ull, &h->cfg.c);
    fp = loader_fnv(fp, &h->cfg.draft_vocab, sizeof h->cfg.draft_vocab);
    fp = loader_fnv(fp, &h->cfg.target_hidden, sizeof h->cfg.target_hidden);
    for (int i = 0; i < n && !rc; i++) {
        WeightReq w;
        memset(&w, 0, sizeof w);
        snprintf(w.hf_name, sizeof w.hf_name, "%s", t[i].name);
        w.slot = t[i].slot;
        w.qt = t[i].qt;
        w.rows = t[i].rows;
        w.cols = t[i].cols;
        rc = hf_tensors_load(ts, &w, &fp, e);
    }
    if (!rc) rc = load_maps(h, ts, e);
    if (!rc) fp = loader_fnv(fp, h->d2t, sizeof(int32_t) * (size_t)h->cfg.draft_vocab);
    snprintf(h->fingerprint, sizeof h->fingerprint, "eagle3-%016llx", (unsigned long long)fp);
    return rc;
}

int eagle3_head_load(const char *dir, Eagle3Head **out, RsErr *e) {
    *out = NULL;
    cJSON *j;
    int rc = hf_read_config_json(dir, &j, e);
    if (rc) return rc;
    Eagle3Head *h = rs_xcalloc(1, sizeof *h);
    snprintf(h->path, sizeof h->path, "%s", dir);
    char cfg_path[1100];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    rc = read_head_config(cfg_path, j, &h->cfg, e);
    cJSON_Delete(j);
    HfTensors *ts = NULL;
    if (!rc) rc = hf_tensors_create(dir, &ts, e);
    if (!rc) rc = load_weights(h, ts, e);
    if (ts) hf_tensors_take_maps(ts, &h->maps, &h->map_sizes, &h->n_maps); /* the matrices' */
    hf_tensors_destroy(&ts);
    if (rc) {
        eagle3_head_destroy(&h);
        return rc;
    }
    *out = h;
    return RS_OK;
}

void eagle3_head_matrices(const Eagle3Head *h, const QTensor *out[EAGLE3_N_MATRICES]) {
    const QTensor *m[EAGLE3_N_MATRICES] = {&h->fc, &h->wq, &h->wk, &h->wv, &h->wo,
                                           &h->w_gate, &h->w_up, &h->w_down, &h->lm_head};
    memcpy(out, m, sizeof m);
}

void eagle3_head_destroy(Eagle3Head **ph) {
    if (!ph || !*ph) return;
    Eagle3Head *h = *ph;
    free(h->arena);
    for (int i = 0; i < h->n_maps; i++) munmap(h->maps[i], h->map_sizes[i]);
    free(h->maps);
    free(h->map_sizes);
    free(h->d2t);
    free(*ph);
    *ph = NULL;
}

void eagle3_default_layers(int n_layers, int layers[EAGLE3_N_FEATURES]) {
    layers[0] = 2;
    layers[1] = n_layers / 2;
    layers[2] = n_layers - 3;
}

/* ---- feature-layer ids: whose convention ---- */

int eagle3_layer_ids_parse(const char *s, Eagle3LayerIds *out, RsErr *e) {
    static const char *const names[] = {"auto", "input", "output"};
    for (int i = 0; i < 3; i++)
        if (s && !strcmp(s, names[i])) {
            *out = (Eagle3LayerIds)i;
            return RS_OK;
        }
    return rs_err(e, RS_EINVAL, "--eagle3-layer-ids '%s': expected input (vLLM: the stream "
                  "entering layer i), output (SGLang: the output of layer i) or auto",
                  s ? s : "(null)");
}

void eagle3_resolve_layers(const int listed[EAGLE3_N_FEATURES], int n_layers, Eagle3LayerIds ids,
                           int layers[EAGLE3_N_FEATURES], Eagle3LayerIds *used, int *guessed) {
    int def[EAGLE3_N_FEATURES], is_in = 1, is_out = 1;
    eagle3_default_layers(n_layers, def);
    for (int i = 0; i < EAGLE3_N_FEATURES; i++) {
        is_in &= listed[i] == def[i];
        is_out &= listed[i] + 1 == def[i];
    }
    int guess = 0;
    if (ids == EAGLE3_IDS_AUTO) {
        guess = !is_in && !is_out;
        ids = is_out ? EAGLE3_IDS_OUTPUT : EAGLE3_IDS_INPUT;
    }
    for (int i = 0; i < EAGLE3_N_FEATURES; i++)
        layers[i] = listed[i] + (ids == EAGLE3_IDS_OUTPUT);
    if (used) *used = ids;
    if (guessed) *guessed = guess;
}

int eagle3_head_check(const Eagle3Head *h, const Config *t, int layers_out[EAGLE3_N_FEATURES],
                      RsErr *e) {
    const Eagle3Config *c = &h->cfg;
    if (c->c.vocab_size != t->vocab_size)
        return rs_err(e, RS_EINVAL, "EAGLE-3 head '%s' has vocab_size %d but the target's "
                      "vocabulary has %d tokens", h->path, c->c.vocab_size, t->vocab_size);
    if (c->target_hidden != t->dim)
        return rs_err(e, RS_EINVAL, "EAGLE-3 head '%s' takes target features of width %d "
                      "(target_hidden_size) but the target's hidden size is %d", h->path,
                      c->target_hidden, t->dim);
    if (!h->embed.data && c->c.dim != t->dim)
        return rs_err(e, RS_EINVAL, "EAGLE-3 head '%s' has no embed_tokens and hidden_size %d, "
                      "so it cannot use the target's embeddings of width %d", h->path, c->c.dim,
                      t->dim);
    int L[EAGLE3_N_FEATURES];
    int guessed = 0;
    if (c->feature_layers[0] < 0) eagle3_default_layers(t->n_layers, L);
    else eagle3_resolve_layers(c->feature_layers, t->n_layers,
                               c->layer_ids, L, NULL, &guessed);
    if (guessed)
        fprintf(stderr, "rootspec: note: EAGLE-3 head '%s' lists feature layers %d, %d, %d "
                "without saying whose convention; read as vLLM reads them (the stream entering "
                "each layer); --eagle3-layer-ids output reads them as SGLang does\n", h->path,
                c->feature_layers[0], c->feature_layers[1], c->feature_layers[2]);
    for (int i = 0; i < EAGLE3_N_FEATURES; i++) {
        if (L[i] < 0 || L[i] > t->n_layers)
            return rs_err(e, RS_EINVAL, "EAGLE-3 head '%s' wants the features entering layer %d "
                          "but the target has %d layers", h->path, L[i], t->n_layers);
        if (i && L[i] <= L[i - 1])
            return rs_err(e, RS_EINVAL, "EAGLE-3 head '%s': feature layers %d, %d, %d of a "
                          "%d-layer target are not strictly ascending", h->path, L[0], L[1],
                          L[2], t->n_layers);
    }
    memcpy(layers_out, L, sizeof L);
    return RS_OK;
}

/* ---- random heads ---- */

#define EAGLE3_RANDOM_PREFIX "random:eagle3-"

typedef struct {
    const char *name;
    Eagle3Config c;
} HeadPreset;

static const HeadPreset kHeadPresets[] = {
    /* random:tiny's width and vocabulary; its 2 layers give features entering 0, 1, 2 */
    {"eagle3-tiny",
     {.c = {.arch = ARCH_LLAMA, .dim = 64, .hidden_dim = 128, .n_layers = 1, .n_heads = 4,
            .n_kv_heads = 2, .head_dim = 16, .vocab_size = 512, .max_seq_len = 2048,
            .norm_eps = 1e-5f, .rope_theta = 10000.0f, .bos_id = -1, .eos_id = -1},
      .target_hidden = 64, .draft_vocab = 256, .feature_layers = {0, 1, 2},
      .layer_ids = EAGLE3_IDS_INPUT}},
    /* yuhuili/EAGLE3-LLaMA3.1-Instruct-8B's config.json: no rope_theta (10000 applies) */
    {"eagle3-llama3-8b",
     {.c = {.arch = ARCH_LLAMA, .dim = 4096, .hidden_dim = 14336, .n_layers = 1, .n_heads = 32,
            .n_kv_heads = 8, .head_dim = 128, .vocab_size = 128256, .max_seq_len = 2048,
            .norm_eps = 1e-5f, .rope_theta = 10000.0f, .bos_id = -1, .eos_id = -1},
      .target_hidden = 4096, .draft_vocab = 32000, .feature_layers = {-1, -1, -1}}},
};
#define N_HEAD_PRESETS ((int)(sizeof kHeadPresets / sizeof kHeadPresets[0]))

int eagle3_path_is_head(const char *path) {
    if (eagle3_path_is_random(path)) return 1;
    cJSON *j = NULL;
    RsErr e = {0};
    if (hf_read_config_json(path, &j, &e) != RS_OK) return 0; /* a file, or no config */
    const char *arch;
    int yes = has_arch(j, &arch);
    cJSON_Delete(j);
    return yes;
}

int eagle3_path_is_random(const char *path) {
    return path && !strncmp(path, EAGLE3_RANDOM_PREFIX, strlen(EAGLE3_RANDOM_PREFIX));
}

/* "random:PRESET[,seed=S]" -> preset and seed. */
static int parse_random_spec(const char *spec, const HeadPreset **p, uint64_t *seed, RsErr *e) {
    const char *name = spec + strlen("random:");
    size_t len = strcspn(name, ",");
    *p = NULL;
    for (int i = 0; i < N_HEAD_PRESETS; i++)
        if (strlen(kHeadPresets[i].name) == len && !strncmp(name, kHeadPresets[i].name, len))
            *p = &kHeadPresets[i];
    if (!*p)
        return rs_err(e, RS_EINVAL, "random EAGLE-3 head '%s': unknown preset (presets: "
                      "eagle3-tiny, eagle3-llama3-8b)", spec);
    *seed = 1;
    const char *rest = name + len;
    if (!*rest) return RS_OK;
    char *end;
    unsigned long long v = strncmp(rest, ",seed=", 6) ? 0 : strtoull(rest + 6, &end, 10);
    if (strncmp(rest, ",seed=", 6) || !rest[6] || *end || rest[6] == '-')
        return rs_err(e, RS_EINVAL, "random EAGLE-3 head '%s': expected ',seed=N' after the "
                      "preset, got '%s'", spec, rest);
    *seed = v;
    return RS_OK;
}

static float tensor_scale(const HeadTensor *t, float *base) {
    *base = t->cols ? 0.0f : 1.0f; /* vectors are norm weights around 1 */
    if (!t->cols) return 0.1f;
    float s = 1.0f / sqrtf((float)t->cols);
    /* logits with a spread like a trained head's (as randmodel.c's wcls) */
    return strcmp(t->name, "lm_head.weight") ? s : 3.0f * s;
}

/* Increasing, hence injective, draft -> target map: stride vocab/draft_vocab plus a seeded
 * offset inside each stride (published heads keep their draft ids in target-id order). */
static void random_d2t(Eagle3Head *h, uint64_t seed) {
    int V = h->cfg.c.vocab_size, DV = h->cfg.draft_vocab, stride = V / DV;
    uint64_t ts = rs_rand_tensor_seed(seed, 99);
    h->d2t = rs_xmalloc(sizeof(int32_t) * (size_t)DV);
    for (int d = 0; d < DV; d++) {
        float u = rs_rand_unit(ts, (uint64_t)d) / 1.7320508f * 0.5f + 0.5f; /* [0, 1) */
        int j = (int)(u * (float)stride);
        h->d2t[d] = d * stride + (j < stride ? j : stride - 1);
    }
}

int eagle3_head_random(const char *spec, int with_weights, Eagle3Head **out, RsErr *e) {
    *out = NULL;
    const HeadPreset *p;
    uint64_t seed;
    if (!eagle3_path_is_random(spec))
        return rs_err(e, RS_EINVAL, "'%s' does not name a random EAGLE-3 head (%sPRESET)", spec,
                      EAGLE3_RANDOM_PREFIX);
    int rc = parse_random_spec(spec, &p, &seed, e);
    if (rc) return rc;
    Eagle3Head *h = rs_xcalloc(1, sizeof *h);
    h->cfg = p->c;
    snprintf(h->path, sizeof h->path, "%s", spec);
    random_d2t(h, seed);
    HeadTensor t[HEAD_MAX_TENSORS];
    int n = head_tensors(h, t) - 1; /* no embed_tokens: the target's are used */
    h->embed.data = NULL;
    if (with_weights && (rc = alloc_arena(h, t, n, 1, e))) {
        eagle3_head_destroy(&h);
        return rc;
    }
    for (int i = 0; i < n && with_weights; i++) {
        float base, scale = tensor_scale(&t[i], &base);
        uint64_t ts = rs_rand_tensor_seed(seed, 100 + (uint64_t)i);
        size_t cnt = (size_t)t[i].rows * (size_t)(t[i].cols ? t[i].cols : 1);
        float *dst = t[i].slot ? *t[i].slot : (float *)t[i].qt->data;
        for (size_t k = 0; k < cnt; k++) dst[k] = rs_rand_value(ts, k, scale, base);
    }
    for (int i = 0; i < n && !with_weights; i++) {
        if (t[i].slot) *t[i].slot = NULL;
        else *t[i].qt = qtensor_f32(NULL, (int)t[i].rows, (int)t[i].cols);
    }
    uint64_t fp = loader_fnv(loader_fnv_config(0xcbf29ce484222325ull, &h->cfg.c), &seed, sizeof seed);
    snprintf(h->fingerprint, sizeof h->fingerprint, "random-%s-%016llx", p->name,
             (unsigned long long)fp);
    *out = h;
    return RS_OK;
}
