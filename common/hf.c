/* Hugging Face directory loader: config.json (cJSON) + model.safetensors or a sharded
 * model.safetensors.index.json. Safetensors files are mmapped; each header (8-byte LE
 * length + JSON) is validated (offsets inside the data, byte counts matching dtype x
 * shape) before any tensor is read. Matrices stay in the mapping in their F32/F16/BF16
 * dtype (the Model keeps the mappings); vectors become f32 in the arena. The reader and the
 * config-field parser are exported (hf.h) for the EAGLE-3 head loader. */
#include "hf.h"
#include "model_internal.h"
#include "quant.h"
#include "textsafe.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define HF_MAX_SHARDS 256
#define ST_MAX_HEADER (100u << 20) /* the safetensors spec's own 100 MB header limit */
/* cJSON spends ~0.6 KB per value: without these bounds a few shards with 1.5 M unused
 * entries each took 3.9 GB before any check ran. A real checkpoint has a few hundred to a
 * few thousand tensors; a tensor entry is ~8 JSON values. */
#define ST_MAX_ENTRIES (1u << 16)          /* tensors in one shard's header */
#define ST_MAX_VALUES (1u << 20)           /* JSON values in one shard's header */
#define HF_MAX_ENTRIES_TOTAL (1u << 18)    /* tensors in all shards together */
#define HF_MAX_HEADER_TOTAL (256u << 20)   /* header bytes in all shards together */

typedef struct {
    char path[1100];
    const uint8_t *map;
    size_t size;
    size_t data_off; /* 8 + header length */
    cJSON *hdr;
} StFile;

typedef struct {
    const char *name;  /* points into its file's cJSON tree */
    const char *dtype; /* ditto */
    int file;
    int nd;
    int64_t shape[8];
    uint64_t begin, end; /* absolute byte range in the mapping */
} StTensor;

struct HfTensors {
    const char *dir;
    char dirbuf[1024];
    StFile files[HF_MAX_SHARDS];
    int n_files;
    StTensor *t;
    size_t n_t, cap_t;
    size_t header_bytes, entries; /* over the shards opened so far */
};
typedef struct HfTensors HfCtx;

static size_t dtype_size(const char *d) {
    static const struct { const char *n; size_t s; } T[] = {
        {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2},
        {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"U16", 2},
        {"U32", 4}, {"U64", 8}};
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++)
        if (strcmp(T[i].n, d) == 0) return T[i].s;
    return 0;
}

static void ctx_free(HfCtx *c) {
    for (int i = 0; i < c->n_files; i++) {
        if (c->files[i].map) munmap((void *)c->files[i].map, c->files[i].size);
        cJSON_Delete(c->files[i].hdr);
    }
    free(c->t);
}

/* Counts a JSON text's top-level members and all its values without building it, so a
 * header's size is judged before cJSON allocates for it. Counts commas and openings
 * outside strings: exact for valid JSON, a bound for anything else. */
static void json_count(const char *p, size_t n, size_t *members, size_t *values) {
    size_t m = 0, v = 1;
    int depth = 0, in_str = 0, any = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = p[i];
        if (in_str) {
            if (ch == '\\') i++;
            else if (ch == '"') in_str = 0;
            continue;
        }
        if (ch == '"') in_str = 1, any |= depth == 1;
        else if (ch == '{' || ch == '[') depth++, v++;
        else if (ch == '}' || ch == ']') depth--;
        else if (ch == ',') {
            v++;
            m += depth == 1;
        }
    }
    *members = any ? m + 1 : 0;
    *values = v;
}

/* Refuses a header over the per-shard or whole-model limits, naming the limit. */
static int st_header_bounds(HfCtx *c, const StFile *f, size_t hlen, RsErr *e) {
    size_t members, values;
    json_count((const char *)f->map + 8, hlen, &members, &values);
    c->header_bytes += hlen;
    c->entries += members;
    if (members > ST_MAX_ENTRIES || values > ST_MAX_VALUES)
        return rs_err(e, RS_EFORMAT,
                      "'%s': safetensors header has %zu entries (%zu JSON values); the limit is "
                      "%u entries and %u values per file",
                      f->path, members, values, ST_MAX_ENTRIES, ST_MAX_VALUES);
    if (c->entries > HF_MAX_ENTRIES_TOTAL || c->header_bytes > HF_MAX_HEADER_TOTAL)
        return rs_err(e, RS_EFORMAT,
                      "'%s': the safetensors headers of its %d shards so far hold %zu entries in "
                      "%zu bytes; the limit is %u entries and %u bytes per model",
                      c->dir, c->n_files, c->entries, c->header_bytes, HF_MAX_ENTRIES_TOTAL,
                      HF_MAX_HEADER_TOTAL);
    return RS_OK;
}

/* Maps one safetensors file and appends its tensors to c->t. */
/* Appends header entry `it` of file f (the newest of c's files) to c->t, checked: dtype,
 * shape, integral data_offsets inside the data, byte count = dtype x shape. */
static int st_add_tensor(HfCtx *c, const StFile *f, const cJSON *it, RsErr *e) {
    size_t data_len = f->size - f->data_off;
    char nm[200]; /* the name comes from the file: escaped for messages */
    rs_escape_str(nm, sizeof nm, it->string);
    cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
    cJSON *sh = cJSON_GetObjectItemCaseSensitive(it, "shape");
    cJSON *off = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off) ||
        cJSON_GetArraySize(off) != 2)
        return rs_err(e, RS_EFORMAT,
                      "'%s': tensor '%s' lacks dtype, shape or a 2-element data_offsets",
                      f->path, nm);
    if (c->n_t == c->cap_t) {
        c->cap_t = c->cap_t ? 2 * c->cap_t : 256;
        StTensor *nt = realloc(c->t, c->cap_t * sizeof *nt);
        RS_ASSERT(nt);
        c->t = nt;
    }
    StTensor *t = &c->t[c->n_t];
    memset(t, 0, sizeof *t);
    t->name = it->string;
    t->dtype = dt->valuestring;
    t->file = c->n_files - 1;
    t->nd = cJSON_GetArraySize(sh);
    if (t->nd > 8)
        return rs_err(e, RS_EFORMAT, "'%s': tensor '%s' has %d dimensions", f->path,
                      nm, t->nd);
    double numel = 1;
    cJSON *d;
    int k = 0;
    cJSON_ArrayForEach(d, sh) {
        double v = cJSON_IsNumber(d) ? d->valuedouble : -1;
        if (v < 0 || v != floor(v) || v > 1e15)
            return rs_err(e, RS_EFORMAT, "'%s': tensor '%s' has a bad shape entry", f->path,
                          nm);
        t->shape[k++] = (int64_t)v;
        numel *= v;
    }
    if (!cJSON_IsNumber(off->child) || !cJSON_IsNumber(off->child->next))
        return rs_err(e, RS_EFORMAT, "'%s': tensor '%s' data_offsets are not numbers",
                      f->path, nm);
    double b = off->child->valuedouble, en = off->child->next->valuedouble;
    if (b < 0 || en < 0 || b != floor(b) || en != floor(en))
        return rs_err(e, RS_EFORMAT,
                      "'%s': tensor '%s' data_offsets [%.17g, %.17g] are not non-negative "
                      "integers",
                      f->path, nm, b, en);
    if (en < b)
        return rs_err(e, RS_EFORMAT,
                      "'%s': tensor '%s' data_offsets [%.0f, %.0f] end before they begin",
                      f->path, nm, b, en);
    if (en > (double)data_len)
        return rs_err(e, RS_EFORMAT,
                      "'%s': tensor '%s' data_offsets [%.0f, %.0f] run past the end of the "
                      "data (%zu bytes)",
                      f->path, nm, b, en, data_len);
    size_t es = dtype_size(t->dtype);
    if (es && numel * (double)es != en - b)
        return rs_err(e, RS_EFORMAT,
                      "'%s': tensor '%s' holds %.0f bytes but %s x %.0f elements need %.0f",
                      f->path, nm, en - b, t->dtype, numel, numel * (double)es);
    t->begin = f->data_off + (uint64_t)b;
    t->end = f->data_off + (uint64_t)en;
    c->n_t++;
    return RS_OK;
}

static int st_open(HfCtx *c, const char *fname, RsErr *e) {
    if (c->n_files >= HF_MAX_SHARDS)
        return rs_err(e, RS_EFORMAT, "'%s': more than %d safetensors shards", c->dir, HF_MAX_SHARDS);
    StFile *f = &c->files[c->n_files];
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s/%s", c->dir, fname);
    int fd;
    size_t fsize;
    int rc = rs_open_regular(f->path, &fd, &fsize, e);
    if (rc) return rc;
    if (fsize < 8) {
        close(fd);
        return rs_err(e, RS_EFORMAT, "'%s' is truncated: %zu bytes, too short for a safetensors header",
                      f->path, fsize);
    }
    void *map = mmap(NULL, fsize, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    close(fd);
    if (map == MAP_FAILED) return rs_err(e, RS_EIO, "cannot mmap '%s': %s", f->path, strerror(err));
    f->map = map;
    f->size = fsize;
    c->n_files++;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | f->map[i];
    if (hlen > f->size - 8 || hlen > ST_MAX_HEADER)
        return rs_err(e, RS_EFORMAT,
                      "'%s': safetensors header length %llu exceeds the file size %zu", f->path,
                      (unsigned long long)hlen, f->size);
    f->data_off = 8 + (size_t)hlen;
    if ((rc = st_header_bounds(c, f, (size_t)hlen, e))) return rc;
    f->hdr = cJSON_ParseWithLength((const char *)f->map + 8, (size_t)hlen);
    if (!f->hdr || !cJSON_IsObject(f->hdr))
        return rs_err(e, RS_EFORMAT, "'%s': safetensors header is not a JSON object", f->path);
    const cJSON *it;
    cJSON_ArrayForEach(it, f->hdr) {
        if (strcmp(it->string, "__metadata__") == 0) continue;
        if ((rc = st_add_tensor(c, f, it, e))) return rc;
    }
    return RS_OK;
}

static const StTensor *find(const HfCtx *c, const char *name) {
    for (size_t i = 0; i < c->n_t; i++)
        if (strcmp(c->t[i].name, name) == 0) return &c->t[i];
    return NULL;
}

/* Integer field of config.json; `def` < 0 with the key absent means required. */
static int cfg_int(const cJSON *j, const char *key, int def, int *v, const char *path, RsErr *e) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!x || cJSON_IsNull(x)) {
        if (def < 0) return rs_err(e, RS_EFORMAT, "'%s': missing \"%s\"", path, key);
        *v = def;
        return RS_OK;
    }
    if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < 0 ||
        x->valuedouble > (double)(1 << 30))
        return rs_err(e, RS_EFORMAT, "'%s': \"%s\" is not a non-negative integer", path, key);
    *v = (int)x->valuedouble;
    return RS_OK;
}

static int cfg_num(const cJSON *j, const char *key, double def, double *v, const char *path,
                   RsErr *e) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!x || cJSON_IsNull(x)) {
        *v = def;
        return RS_OK;
    }
    if (!cJSON_IsNumber(x)) return rs_err(e, RS_EFORMAT, "'%s': \"%s\" is not a number", path, key);
    *v = x->valuedouble;
    return RS_OK;
}

/* bos/eos: an int, a list of ints (first taken) or null/absent (-1). */
static int cfg_token(const cJSON *j, const char *key, int *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, key);
    if (cJSON_IsArray(x)) x = x->child;
    *v = cJSON_IsNumber(x) && x->valuedouble >= 0 && x->valuedouble < (1 << 30) ? (int)x->valuedouble : -1;
    return RS_OK;
}

static int read_config(const char *path, const cJSON *j, Config *c, char *hint, size_t hint_n,
                       RsErr *e) {
    memset(c, 0, sizeof *c);
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(j, "architectures");
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    const char *arch = cJSON_IsArray(archs) && cJSON_IsString(archs->child) ? archs->child->valuestring : NULL;
    const char *mts = cJSON_IsString(mt) ? mt->valuestring : "";
    if (!arch)
        arch = !strcmp(mts, "llama") ? "LlamaForCausalLM" : !strcmp(mts, "qwen2") ? "Qwen2ForCausalLM"
             : !strcmp(mts, "qwen3") ? "Qwen3ForCausalLM" : "(none)";
    if (!strcmp(arch, "LlamaForCausalLM")) c->arch = ARCH_LLAMA;
    else if (!strcmp(arch, "Qwen2ForCausalLM")) c->arch = ARCH_QWEN2, c->has_qkv_bias = 1;
    else if (!strcmp(arch, "Qwen3ForCausalLM")) c->arch = ARCH_QWEN3, c->has_qk_norm = 1;
    else
        return rs_err(e, RS_EUNSUPPORTED,
                      "'%s': architecture '%s' is not supported (LlamaForCausalLM, "
                      "Qwen2ForCausalLM, Qwen3ForCausalLM are)",
                      path, arch);
    int rc = hf_config_fields(path, j, arch, c, e);
    if (rc) return rc;
    const char *h = "";
    if (c->arch == ARCH_QWEN2) h = "qwen2";
    else if (c->arch == ARCH_QWEN3) h = "qwen3";
    else if (c->rope_scaling) h = "llama3";
    snprintf(hint, hint_n, "%s", h);
    return loader_check_config(c, path, e);
}

int hf_config_fields(const char *path, const cJSON *j, const char *arch, Config *c, RsErr *e) {
    int rc;
    if ((rc = cfg_int(j, "hidden_size", -1, &c->dim, path, e)) ||
        (rc = cfg_int(j, "intermediate_size", -1, &c->hidden_dim, path, e)) ||
        (rc = cfg_int(j, "num_hidden_layers", -1, &c->n_layers, path, e)) ||
        (rc = cfg_int(j, "num_attention_heads", -1, &c->n_heads, path, e)) ||
        (rc = cfg_int(j, "num_key_value_heads", c->n_heads, &c->n_kv_heads, path, e)) ||
        (rc = cfg_int(j, "head_dim", c->n_heads ? c->dim / c->n_heads : 0, &c->head_dim, path, e)) ||
        (rc = cfg_int(j, "vocab_size", -1, &c->vocab_size, path, e)) ||
        (rc = cfg_int(j, "max_position_embeddings", 4096, &c->max_seq_len, path, e)))
        return rc;
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(j, "hidden_act");
    if (cJSON_IsString(act) && strcmp(act->valuestring, "silu") != 0)
        return rs_err(e, RS_EUNSUPPORTED, "'%s': hidden_act '%s' is not supported (silu is)", path,
                      act->valuestring);
    if ((c->arch != ARCH_QWEN2 && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "attention_bias"))) ||
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "mlp_bias")))
        return rs_err(e, RS_EUNSUPPORTED, "'%s': attention_bias/mlp_bias true is not supported for %s",
                      path, arch);
    double d;
    if ((rc = cfg_num(j, "rms_norm_eps", 1e-6, &d, path, e))) return rc;
    c->norm_eps = (float)d;
    /* transformers >= 4.5x may move rope settings into "rope_parameters" */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    if (!cJSON_IsObject(rs) && cJSON_IsObject(rp)) rs = rp;
    if ((rc = cfg_num(cJSON_IsObject(rp) && cJSON_GetObjectItemCaseSensitive(rp, "rope_theta") ? rp : j,
                      "rope_theta", 10000.0, &d, path, e)))
        return rc;
    c->rope_theta = (float)d;
    if (cJSON_IsObject(rs)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
        if (!cJSON_IsString(ty)) ty = cJSON_GetObjectItemCaseSensitive(rs, "type");
        const char *t = cJSON_IsString(ty) ? ty->valuestring : "default";
        if (!strcmp(t, "llama3")) {
            double f, lo, hi;
            int orig;
            if ((rc = cfg_num(rs, "factor", 8.0, &f, path, e)) ||
                (rc = cfg_num(rs, "low_freq_factor", 1.0, &lo, path, e)) ||
                (rc = cfg_num(rs, "high_freq_factor", 4.0, &hi, path, e)) ||
                (rc = cfg_int(rs, "original_max_position_embeddings", 8192, &orig, path, e)))
                return rc;
            if (!(f >= 1.0 && lo > 0 && hi > lo && orig > 0))
                return rs_err(e, RS_EFORMAT,
                              "'%s': bad llama3 rope_scaling (factor %g, low %g, high %g, original %d)",
                              path, f, lo, hi, orig);
            c->rope_scaling = 1;
            c->rope_factor = (float)f;
            c->rope_low_freq_factor = (float)lo;
            c->rope_high_freq_factor = (float)hi;
            c->rope_orig_max_pos = orig;
        } else if (strcmp(t, "default") != 0) {
            return rs_err(e, RS_EUNSUPPORTED, "'%s': rope_scaling type '%s' is not supported", path, t);
        }
    }
    c->tied_embeddings = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings"));
    cfg_token(j, "bos_token_id", &c->bos_id);
    cfg_token(j, "eos_token_id", &c->eos_id);
    return RS_OK;
}

/* Collects the shard names of an index's weight_map (each once, in first-seen order). */
static int open_shards(HfCtx *c, const char *index_path, RsErr *e) {
    char *txt;
    size_t len;
    int rc = rs_read_file(index_path, &txt, &len, e);
    if (rc) return rc;
    cJSON *j = cJSON_ParseWithLength(txt, len);
    free(txt);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(j, "weight_map");
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(j);
        return rs_err(e, RS_EFORMAT, "'%s': no \"weight_map\" object", index_path);
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, wm) {
        if (!cJSON_IsString(it) || strchr(it->valuestring, '/') || !*it->valuestring) {
            char nm[200];
            rc = rs_err(e, RS_EFORMAT, "'%s': weight_map entry '%s' is not a plain file name",
                        index_path, rs_escape_str(nm, sizeof nm, it->string));
            break;
        }
        int seen = 0;
        for (int i = 0; i < c->n_files && !seen; i++) {
            const char *p = strrchr(c->files[i].path, '/');
            seen = strcmp(p + 1, it->valuestring) == 0;
        }
        if (!seen && (rc = st_open(c, it->valuestring, e))) break;
    }
    cJSON_Delete(j);
    return rc;
}

static int load_tensor(const HfCtx *c, const WeightReq *w, uint64_t *fp, RsErr *e) {
    const StTensor *t = find(c, w->hf_name);
    if (!t) return rs_err(e, RS_EFORMAT, "'%s': missing tensor '%s'", c->dir, w->hf_name);
    int want_nd = w->cols ? 2 : 1;
    if (t->nd != want_nd || t->shape[0] != w->rows || (want_nd == 2 && t->shape[1] != w->cols)) {
        char a[128] = "[";
        for (int i = 0; i < t->nd && strlen(a) < 96; i++)
            snprintf(a + strlen(a), sizeof a - strlen(a), "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        strcat(a, "]");
        char b[64];
        if (w->cols) snprintf(b, sizeof b, "[%lld, %lld]", (long long)w->rows, (long long)w->cols);
        else snprintf(b, sizeof b, "[%lld]", (long long)w->rows);
        return rs_err(e, RS_EFORMAT, "'%s': tensor '%s' has shape %s, expected %s",
                      c->files[t->file].path, w->hf_name, a, b);
    }
    uint32_t qt;
    if (!strcmp(t->dtype, "F32")) qt = QT_F32;
    else if (!strcmp(t->dtype, "F16")) qt = QT_F16;
    else if (!strcmp(t->dtype, "BF16")) qt = QT_BF16;
    else
        return rs_err(e, RS_EUNSUPPORTED,
                      "'%s': tensor '%s' has dtype %s (rootspec reads F32, F16, BF16)",
                      c->files[t->file].path, w->hf_name, t->dtype);
    *fp = loader_fnv(*fp, w->hf_name, strlen(w->hf_name));
    *fp = loader_fnv(*fp, &qt, sizeof qt);
    *fp = loader_fnv(*fp, t->shape, sizeof(int64_t) * (size_t)t->nd);
    const uint8_t *src = c->files[t->file].map + t->begin;
    if (w->qt) {
        w->qt->type = qt;
        w->qt->data = src;
        w->qt->row_bytes = (size_t)w->cols * dtype_size(t->dtype);
        return RS_OK;
    }
    /* a vector, or a matrix a caller wants in f32 (hf_tensors_load with no qt) */
    quant_dequantize(qt, src, *w->slot, (size_t)w->rows * (size_t)(w->cols ? w->cols : 1));
    return RS_OK;
}

int hf_read_config_json(const char *dir, cJSON **out, RsErr *e) {
    *out = NULL;
    char p[1100];
    struct stat st;
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (stat(p, &st) != 0) return rs_err(e, RS_EINVAL, "no config.json in '%s'", dir);
    char *txt;
    size_t len;
    int rc = rs_read_file(p, &txt, &len, e);
    if (rc) return rc;
    cJSON *j = cJSON_ParseWithLength(txt, len);
    free(txt);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return rs_err(e, RS_EFORMAT, "'%s' is not a JSON object", p);
    }
    *out = j;
    return RS_OK;
}

int hf_tensors_create(const char *dir, HfTensors **out, RsErr *e) {
    *out = NULL;
    HfCtx *c = rs_xcalloc(1, sizeof *c);
    snprintf(c->dirbuf, sizeof c->dirbuf, "%s", dir);
    c->dir = c->dirbuf;
    char p[1100];
    struct stat st;
    int rc;
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    if (stat(p, &st) == 0) rc = open_shards(c, p, e);
    else {
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        if (stat(p, &st) != 0)
            rc = rs_err(e, RS_EINVAL, "no model.safetensors or model.safetensors.index.json in '%s'", dir);
        else rc = st_open(c, "model.safetensors", e);
    }
    if (rc) {
        hf_tensors_destroy(&c);
        return rc;
    }
    *out = c;
    return RS_OK;
}

void hf_tensors_destroy(HfTensors **pc) {
    if (!pc || !*pc) return;
    ctx_free(*pc);
    free(*pc);
    *pc = NULL;
}

int hf_tensor_find(const HfTensors *c, const char *name, HfTensorInfo *info) {
    const StTensor *t = find(c, name);
    if (!t) return 0;
    memset(info, 0, sizeof *info);
    info->dtype = t->dtype;
    info->nd = t->nd;
    memcpy(info->shape, t->shape, sizeof t->shape);
    info->data = c->files[t->file].map + t->begin;
    info->bytes = (size_t)(t->end - t->begin);
    info->file = c->files[t->file].path;
    return 1;
}

int hf_tensors_load(const HfTensors *c, const WeightReq *w, uint64_t *fp, RsErr *e) {
    return load_tensor(c, w, fp, e);
}

void hf_tensors_take_maps(HfTensors *c, void ***maps, size_t **sizes, int *n) {
    *maps = rs_xcalloc((size_t)c->n_files + 1, sizeof(void *));
    *sizes = rs_xcalloc((size_t)c->n_files + 1, sizeof(size_t));
    *n = 0;
    for (int i = 0; i < c->n_files; i++) {
        if (!c->files[i].map) continue;
        (*maps)[*n] = (void *)c->files[i].map;
        (*sizes)[(*n)++] = c->files[i].size;
        c->files[i].map = NULL;
    }
}

int hf_load_model(const char *dir, Model **out, RsErr *e) {
    *out = NULL;
    char p[1100];
    snprintf(p, sizeof p, "%s/config.json", dir);
    cJSON *j;
    int rc = hf_read_config_json(dir, &j, e);
    if (rc) return rc;
    Model *m = rs_xcalloc(1, sizeof(Model));
    snprintf(m->path, sizeof m->path, "%s", dir);
    m->tok_source = TOKSRC_HF_JSON;
    snprintf(m->tokenizer_json, sizeof m->tokenizer_json, "%s/tokenizer.json", dir);
    rc = read_config(p, j, &m->cfg, m->chat_hint, sizeof m->chat_hint, e);
    cJSON_Delete(j);
    HfCtx *c = NULL;
    if (!rc) rc = hf_tensors_create(dir, &c, e);
    WeightReq *reqs = NULL;
    int n = 0;
    if (!rc) rc = loader_plan(m, &reqs, &n, e);
    uint64_t fp = loader_fnv_config(0xcbf29ce484222325ull, &m->cfg);
    for (int i = 0; i < n && !rc; i++) rc = load_tensor(c, &reqs[i], &fp, e);
    free(reqs);
    char extra[96];
    snprintf(extra, sizeof extra, "model.layers.%d.input_layernorm.weight", m->cfg.n_layers);
    if (!rc && find(c, extra))
        rc = rs_err(e, RS_EFORMAT, "'%s': holds tensor '%s' but num_hidden_layers is %d", dir,
                    extra, m->cfg.n_layers);
    if (!rc) { /* the matrices point into the mappings: the Model keeps them */
        if (m->cfg.tied_embeddings) m->w.wcls = m->w.tok_embeddings;
        hf_tensors_take_maps(c, &m->maps, &m->map_sizes, &m->n_maps);
    }
    hf_tensors_destroy(&c);
    if (rc) {
        model_destroy(&m);
        return rc;
    }
    snprintf(m->fingerprint, sizeof m->fingerprint, "%016llx", (unsigned long long)fp);
    *out = m;
    return RS_OK;
}
