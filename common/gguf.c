/* GGUF v3 (and v2, same layout) reader: mmaps the file, parses header, metadata and tensor
 * table with every read bounds-checked against the mapping, then builds a llama, qwen2 or
 * qwen3 Model: config from <arch>.* keys, matrices left in the mapping in their stored type
 * (QTensor; llama q/k rows looked up in the Hugging Face, rotate-half RoPE, order), vectors
 * dequantized to f32 into the arena. The file stays mapped in Model.gguf: the weights and
 * the tokenizer's tokenizer.ggml.* metadata point into it. */
#include "loader.h"
#include "model_internal.h"
#include "quant.h"
#include "textsafe.h"
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <strings.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

enum {
    GV_U8 = 0, GV_I8 = 1, GV_U16 = 2, GV_I16 = 3, GV_U32 = 4, GV_I32 = 5, GV_F32 = 6,
    GV_BOOL = 7, GV_STR = 8, GV_ARR = 9, GV_U64 = 10, GV_I64 = 11, GV_F64 = 12, GV_COUNT
};
#define GGUF_MAX_DEPTH 8 /* nested arrays deeper than this are refused (stack safety) */

typedef struct {
    const char *key;
    size_t key_len;
    uint32_t type;
    const uint8_t *val;  /* the value; for arrays the first element */
    uint32_t arr_type;   /* arrays only */
    uint64_t arr_n;      /* arrays only */
    uint64_t *str_off;   /* string arrays: entry i's length prefix is at val + str_off[i] */
} GGUFKV;

typedef struct {
    const char *name;
    size_t name_len;
    uint32_t n_dims;
    uint64_t ne[4];
    uint32_t type;
    uint64_t offset, nbytes;
    const uint8_t *data;
} GGUFTensor;

struct GGUFFile {
    char path[1024];
    const uint8_t *map;
    size_t size;
    uint32_t version;
    GGUFKV *kv;
    size_t n_kv;
    GGUFTensor *t;
    size_t n_t;
    uint64_t alignment, data_off;
    size_t kv_end; /* where the metadata ends and the tensor infos begin */
};

/* ---- bounds-checked reader ---- */

typedef struct {
    const uint8_t *base;
    size_t size, pos;
    const char *path;
    RsErr *e;
} Rd;

static int rd_need(Rd *r, uint64_t n, const char *what) {
    if (n > r->size - r->pos)
        return rs_err(r->e, RS_EFORMAT,
                      "'%s' is truncated: %s at byte %zu needs %llu bytes, file has %zu", r->path,
                      what, r->pos, (unsigned long long)n, r->size);
    return RS_OK;
}

static uint64_t le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static int rd_u32(Rd *r, uint32_t *v, const char *what) {
    int rc = rd_need(r, 4, what);
    if (rc) return rc;
    *v = (uint32_t)le(r->base + r->pos, 4);
    r->pos += 4;
    return RS_OK;
}

static int rd_u64(Rd *r, uint64_t *v, const char *what) {
    int rc = rd_need(r, 8, what);
    if (rc) return rc;
    *v = le(r->base + r->pos, 8);
    r->pos += 8;
    return RS_OK;
}

static int rd_str(Rd *r, const char **s, size_t *len, const char *what) {
    uint64_t n;
    int rc = rd_u64(r, &n, what);
    if (rc) return rc;
    if ((rc = rd_need(r, n, what))) return rc;
    *s = (const char *)r->base + r->pos;
    *len = (size_t)n;
    r->pos += (size_t)n;
    return RS_OK;
}

static size_t scalar_size(uint32_t t) {
    switch (t) {
    case GV_U8: case GV_I8: case GV_BOOL: return 1;
    case GV_U16: case GV_I16: return 2;
    case GV_U32: case GV_I32: case GV_F32: return 4;
    case GV_U64: case GV_I64: case GV_F64: return 8;
    default: return 0;
    }
}

/* Skips one value of type t; `key` only names the metadata entry in messages. */
static int skip_value(Rd *r, uint32_t t, int depth, const char *key, size_t klen) {
    if (t == GV_STR) {
        const char *s;
        size_t n;
        return rd_str(r, &s, &n, "metadata string");
    }
    if (t == GV_ARR) {
        if (depth >= GGUF_MAX_DEPTH)
            return rs_err(r->e, RS_EFORMAT, "'%s': metadata '%.*s' nests arrays deeper than %d",
                          r->path, (int)klen, key, GGUF_MAX_DEPTH);
        uint32_t at;
        uint64_t n;
        int rc = rd_u32(r, &at, "array type");
        if (!rc) rc = rd_u64(r, &n, "array length");
        if (rc) return rc;
        if (at >= GV_COUNT)
            return rs_err(r->e, RS_EFORMAT, "'%s': metadata '%.*s' has unknown array type %u",
                          r->path, (int)klen, key, at);
        size_t es = scalar_size(at);
        /* minimum bytes per element: a string has its 8-byte length, an array 12 bytes */
        size_t min_es = es ? es : (at == GV_STR ? 8 : 12);
        if (n > (r->size - r->pos) / min_es)
            return rs_err(r->e, RS_EFORMAT,
                          "'%s' is truncated or corrupt: metadata '%.*s' claims %llu array "
                          "elements, more than the remaining %zu bytes hold",
                          r->path, (int)klen, key, (unsigned long long)n, r->size - r->pos);
        if (es) {
            r->pos += (size_t)(n * es);
            return RS_OK;
        }
        for (uint64_t i = 0; i < n; i++) {
            rc = skip_value(r, at, depth + 1, key, klen);
            if (rc) return rc;
        }
        return RS_OK;
    }
    size_t es = scalar_size(t);
    if (!es)
        return rs_err(r->e, RS_EFORMAT, "'%s': metadata '%.*s' has unknown value type %u",
                      r->path, (int)klen, key, t);
    int rc = rd_need(r, es, "metadata value");
    if (rc) return rc;
    r->pos += es;
    return RS_OK;
}

/* ---- parsing ---- */

void gguf_destroy(GGUFFile **pg) {
    if (!pg || !*pg) return;
    GGUFFile *g = *pg;
    if (g->kv)
        for (size_t i = 0; i < g->n_kv; i++) free(g->kv[i].str_off);
    free(g->kv);
    free(g->t);
    if (g->map) munmap((void *)g->map, g->size);
    free(g);
    *pg = NULL;
}

static const GGUFKV *find_kv(const GGUFFile *g, const char *key) {
    if (!g) return NULL;
    size_t n = strlen(key);
    for (size_t i = 0; i < g->n_kv; i++)
        if (g->kv[i].key_len == n && memcmp(g->kv[i].key, key, n) == 0) return &g->kv[i];
    return NULL;
}

/* Magic, version and the two counts; the counts are bounded by the file's size before
 * anything is allocated for them, so a corrupt header cannot ask for terabytes. */
static int parse_header(GGUFFile *g, Rd *r, uint64_t *n_t, uint64_t *n_kv) {
    RsErr *e = r->e;
    int rc = rd_need(r, 4, "magic");
    if (rc) return rc;
    if (memcmp(g->map, "GGUF", 4) != 0) {
        char m[20];
        snprintf(m, sizeof m, "%02x %02x %02x %02x", g->map[0], g->map[1], g->map[2], g->map[3]);
        return rs_err(e, RS_EFORMAT, "'%s' is not a GGUF file: bad magic (bytes %s)", g->path, m);
    }
    r->pos = 4;
    if ((rc = rd_u32(r, &g->version, "version"))) return rc;
    if (g->version != 2 && g->version != 3)
        return rs_err(e, RS_EUNSUPPORTED, "'%s': unsupported GGUF version %u (rootspec reads 2 and 3)",
                      g->path, g->version);
    if ((rc = rd_u64(r, n_t, "tensor count"))) return rc;
    if ((rc = rd_u64(r, n_kv, "metadata count"))) return rc;
    /* each metadata entry takes >= 13 bytes, each tensor info >= 28 */
    if (*n_kv > (r->size - r->pos) / 13 || *n_t > (r->size - r->pos) / 28)
        return rs_err(e, RS_EFORMAT,
                      "'%s' is truncated or corrupt: header claims %llu metadata entries and %llu "
                      "tensors, more than the file of %zu bytes holds",
                      g->path, (unsigned long long)*n_kv, (unsigned long long)*n_t, g->size);
    return RS_OK;
}

/* The metadata entries: validated by skip_value once here, so the getters can read them
 * without bounds checks. */
static int parse_kvs(GGUFFile *g, Rd *r, uint64_t n_kv) {
    int rc;
    for (uint64_t i = 0; i < n_kv; i++) {
        GGUFKV *kv = &g->kv[g->n_kv++];
        if ((rc = rd_str(r, &kv->key, &kv->key_len, "metadata key"))) return rc;
        if ((rc = rd_u32(r, &kv->type, "metadata type"))) return rc;
        size_t start = r->pos;
        if (kv->type == GV_ARR) {
            if ((rc = rd_u32(r, &kv->arr_type, "array type"))) return rc;
            if ((rc = rd_u64(r, &kv->arr_n, "array length"))) return rc;
            r->pos = start;
        }
        if ((rc = skip_value(r, kv->type, 0, kv->key, kv->key_len))) return rc;
        kv->val = g->map + start + (kv->type == GV_ARR ? 12 : 0);
        if (kv->type == GV_ARR && kv->arr_type == GV_STR) {
            /* index string entries once so gguf_arr_str is O(1) for 50k-token vocabularies */
            kv->str_off = rs_xmalloc((size_t)kv->arr_n * sizeof(uint64_t) + 1);
            uint64_t off = 0;
            for (uint64_t j = 0; j < kv->arr_n; j++) {
                kv->str_off[j] = off;
                off += 8 + le(kv->val + off, 8); /* validated by skip_value */
            }
        }
    }
    return RS_OK;
}

/* general.alignment, if given, decides where tensor data starts and how offsets align. */
static int parse_alignment(GGUFFile *g, RsErr *e) {
    const GGUFKV *al = find_kv(g, "general.alignment");
    if (al) {
        uint64_t a = al->type == GV_U32 ? le(al->val, 4) : al->type == GV_U64 ? le(al->val, 8) : 0;
        if (a == 0 || a > (1u << 20) || (a & (a - 1)))
            return rs_err(e, RS_EFORMAT,
                          "'%s': general.alignment %llu is not a power of two up to 1 MiB", g->path,
                          (unsigned long long)a);
        g->alignment = a;
    }
    return RS_OK;
}

/* Tensor names come from the file: escaped before they reach a message. */
#define TNAME(t) (int)sizeof tnb, rs_escape(tnb, sizeof tnb, (t)->name, (t)->name_len, 0)

/* The tensor infos: shape, type and offset, each checked so that sizes cannot overflow. */
static int parse_tensor_infos(GGUFFile *g, Rd *r, uint64_t n_t) {
    RsErr *e = r->e;
    char tnb[200];
    int rc;
    for (uint64_t i = 0; i < n_t; i++) {
        GGUFTensor *t = &g->t[g->n_t++];
        if ((rc = rd_str(r, &t->name, &t->name_len, "tensor name"))) return rc;
        if ((rc = rd_u32(r, &t->n_dims, "tensor dimension count"))) return rc;
        if (t->n_dims < 1 || t->n_dims > 4)
            return rs_err(e, RS_EFORMAT, "'%s': tensor '%.*s' has %u dimensions (1 to 4 allowed)",
                          g->path, TNAME(t), t->n_dims);
        uint64_t nel = 1;
        for (uint32_t d = 0; d < 4; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            if ((rc = rd_u64(r, &t->ne[d], "tensor dimension"))) return rc;
            if (t->ne[d] == 0 || t->ne[d] > (1ull << 40) || nel > (1ull << 48) / t->ne[d])
                return rs_err(e, RS_EFORMAT, "'%s': tensor '%.*s' has absurd dimension ne[%u] = %llu",
                              g->path, TNAME(t), d, (unsigned long long)t->ne[d]);
            nel *= t->ne[d];
        }
        if ((rc = rd_u32(r, &t->type, "tensor type"))) return rc;
        if ((rc = rd_u64(r, &t->offset, "tensor offset"))) return rc;
        size_t be, bb;
        if (quant_type_geometry(t->type, &be, &bb) != 0)
            return rs_err(e, RS_EFORMAT, "'%s': tensor '%.*s' has unknown ggml type %u", g->path,
                          TNAME(t), t->type);
        if (t->ne[0] % be != 0)
            return rs_err(e, RS_EFORMAT,
                          "'%s': tensor '%.*s' row length %llu is not a multiple of the %s block "
                          "size %zu",
                          g->path, TNAME(t), (unsigned long long)t->ne[0],
                          quant_type_name(t->type), be);
        t->nbytes = nel / be * bb;
        if (t->offset % g->alignment != 0)
            return rs_err(e, RS_EFORMAT, "'%s': tensor '%.*s' offset %llu is not aligned to %llu",
                          g->path, TNAME(t), (unsigned long long)t->offset,
                          (unsigned long long)g->alignment);
    }
    return RS_OK;
}

/* Points each tensor into the mapping after checking its data lies inside the file. */
static int place_tensors(GGUFFile *g, size_t header_end, RsErr *e) {
    char tnb[200];
    g->data_off = (header_end + g->alignment - 1) / g->alignment * g->alignment;
    for (size_t i = 0; i < g->n_t; i++) {
        GGUFTensor *t = &g->t[i];
        /* an offset past the file is reported as such: data_off + offset could wrap */
        if (t->offset > g->size)
            return rs_err(e, RS_EFORMAT,
                          "'%s': tensor '%.*s' offset %llu lies past the end of the file (%zu "
                          "bytes)",
                          g->path, TNAME(t), (unsigned long long)t->offset, g->size);
        /* offset <= size < 2^63 and sizes < 2^49 keep this sum from wrapping */
        if (g->data_off + t->offset + t->nbytes > g->size)
            return rs_err(e, RS_EFORMAT,
                          "'%s' is truncated: tensor '%.*s' data ends at byte %llu, file has %zu "
                          "bytes",
                          g->path, TNAME(t),
                          (unsigned long long)(g->data_off + t->offset + t->nbytes), g->size);
        t->data = g->map + g->data_off + t->offset;
    }
    return RS_OK;
}
#undef TNAME

static int parse(GGUFFile *g, RsErr *e) {
    Rd r = {g->map, g->size, 0, g->path, e};
    uint64_t n_t, n_kv;
    int rc = parse_header(g, &r, &n_t, &n_kv);
    if (rc) return rc;
    g->kv = rs_xcalloc((size_t)n_kv, sizeof(GGUFKV));
    g->t = rs_xcalloc((size_t)n_t, sizeof(GGUFTensor));
    g->alignment = 32;
    if ((rc = parse_kvs(g, &r, n_kv))) return rc;
    g->kv_end = r.pos;
    if ((rc = parse_alignment(g, e))) return rc;
    if ((rc = parse_tensor_infos(g, &r, n_t))) return rc;
    return place_tensors(g, r.pos, e);
}

static int gguf_open(const char *path, GGUFFile **out, RsErr *e) {
    *out = NULL;
    int fd;
    size_t fsize;
    int rc0 = rs_open_regular(path, &fd, &fsize, e);
    if (rc0) return rc0;
    if (fsize < 4) {
        close(fd);
        return rs_err(e, RS_EFORMAT, "'%s' is truncated: %zu bytes, too short for a GGUF header",
                      path, fsize);
    }
    void *map = mmap(NULL, fsize, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    close(fd);
    if (map == MAP_FAILED) return rs_err(e, RS_EIO, "cannot mmap '%s': %s", path, strerror(err));
    GGUFFile *g = rs_xcalloc(1, sizeof *g);
    snprintf(g->path, sizeof g->path, "%s", path);
    g->map = map;
    g->size = fsize;
    int rc = parse(g, e);
    if (rc) {
        gguf_destroy(&g);
        return rc;
    }
    *out = g;
    return RS_OK;
}

/* ---- metadata accessors ---- */

int gguf_get_str(const GGUFFile *g, const char *key, const char **s, size_t *len) {
    const GGUFKV *kv = find_kv(g, key);
    if (!kv || kv->type != GV_STR) return -1;
    *len = (size_t)le(kv->val, 8);
    *s = (const char *)kv->val + 8;
    return 0;
}

/* Reads a scalar of numeric type t at p as a double (integers up to 2^53 exactly). */
static int num_at(uint32_t t, const uint8_t *p, double *v) {
    switch (t) {
    case GV_U8: case GV_BOOL: *v = p[0]; return 0;
    case GV_I8: *v = (int8_t)p[0]; return 0;
    case GV_U16: *v = (uint16_t)le(p, 2); return 0;
    case GV_I16: *v = (int16_t)(uint16_t)le(p, 2); return 0;
    case GV_U32: *v = (uint32_t)le(p, 4); return 0;
    case GV_I32: *v = (int32_t)(uint32_t)le(p, 4); return 0;
    case GV_U64: *v = (double)le(p, 8); return 0;
    case GV_I64: *v = (double)(int64_t)le(p, 8); return 0;
    case GV_F32: { uint32_t b = (uint32_t)le(p, 4); float f; memcpy(&f, &b, 4); *v = f; return 0; }
    case GV_F64: { uint64_t b = le(p, 8); double d; memcpy(&d, &b, 8); *v = d; return 0; }
    default: return -1;
    }
}

int gguf_get_int(const GGUFFile *g, const char *key, long long *v) {
    const GGUFKV *kv = find_kv(g, key);
    if (!kv) return -1;
    switch (kv->type) {
    case GV_U64: *v = (long long)le(kv->val, 8); return 0;
    case GV_I64: *v = (long long)(int64_t)le(kv->val, 8); return 0;
    case GV_F32: case GV_F64: case GV_STR: case GV_ARR: return -1;
    default: {
        double d;
        if (num_at(kv->type, kv->val, &d)) return -1;
        *v = (long long)d;
        return 0;
    }
    }
}

static int gguf_get_float(const GGUFFile *g, const char *key, double *v) {
    const GGUFKV *kv = find_kv(g, key);
    if (!kv || kv->type == GV_STR || kv->type == GV_ARR) return -1;
    return num_at(kv->type, kv->val, v);
}

int gguf_get_arr_n(const GGUFFile *g, const char *key, size_t *n) {
    const GGUFKV *kv = find_kv(g, key);
    if (!kv || kv->type != GV_ARR) return -1;
    *n = (size_t)kv->arr_n;
    return 0;
}

int gguf_arr_str(const GGUFFile *g, const char *key, size_t i, const char **s, size_t *len) {
    const GGUFKV *kv = find_kv(g, key);
    if (!kv || kv->type != GV_ARR || kv->arr_type != GV_STR || i >= kv->arr_n) return -1;
    const uint8_t *p = kv->val + kv->str_off[i];
    *len = (size_t)le(p, 8);
    *s = (const char *)p + 8;
    return 0;
}

int gguf_arr_num(const GGUFFile *g, const char *key, size_t i, double *v) {
    const GGUFKV *kv = find_kv(g, key);
    if (!kv || kv->type != GV_ARR || i >= kv->arr_n) return -1;
    size_t es = scalar_size(kv->arr_type);
    if (!es) return -1;
    return num_at(kv->arr_type, kv->val + i * es, v);
}

/* ---- model building ---- */

static const GGUFTensor *find_tensor(const GGUFFile *g, const char *name) {
    size_t n = strlen(name);
    for (size_t i = 0; i < g->n_t; i++)
        if (g->t[i].name_len == n && memcmp(g->t[i].name, name, n) == 0) return &g->t[i];
    return NULL;
}

/* GGUF architectures rootspec reads: the metadata key prefix and the Config they set.
 * qwen2 adds q/k/v biases, qwen3 per-head q/k RMSNorm; both use NeoX (rotate-half) RoPE,
 * so llama.cpp's converter left their q/k rows unpermuted. */
static const struct {
    const char *name;
    Arch arch;
    int qkv_bias, qk_norm, permuted_qk;
} GGUF_ARCHS[] = {
    {"llama", ARCH_LLAMA, 0, 0, 1},
    {"qwen2", ARCH_QWEN2, 1, 0, 0},
    {"qwen3", ARCH_QWEN3, 0, 1, 0},
};

/* "<arch>.<key>" into buf. */
static const char *arch_key(char *buf, size_t n, const char *arch, const char *key) {
    snprintf(buf, n, "%s.%s", arch, key);
    return buf;
}

/* Required integer hyper-parameter `<arch>.<key>`. */
static int need_int(const GGUFFile *g, const char *arch, const char *key, int *v, RsErr *e) {
    char full[128];
    arch_key(full, sizeof full, arch, key);
    long long x;
    if (gguf_get_int(g, full, &x) != 0)
        return rs_err(e, RS_EFORMAT, "'%s': missing or non-integer metadata '%s'", g->path, full);
    if (x < 0 || x > (1 << 30))
        return rs_err(e, RS_EFORMAT, "'%s': metadata '%s' = %lld is out of range", g->path, full, x);
    *v = (int)x;
    return RS_OK;
}

/* Sets c->arch and its flags from general.architecture; *prefix gets the key prefix. */
static int read_arch(const GGUFFile *g, Config *c, const char **prefix, RsErr *e) {
    const char *arch;
    size_t alen;
    if (gguf_get_str(g, "general.architecture", &arch, &alen) != 0)
        return rs_err(e, RS_EFORMAT, "'%s': no general.architecture metadata", g->path);
    for (size_t i = 0; i < sizeof GGUF_ARCHS / sizeof GGUF_ARCHS[0]; i++)
        if (alen == strlen(GGUF_ARCHS[i].name) && memcmp(arch, GGUF_ARCHS[i].name, alen) == 0) {
            memset(c, 0, sizeof *c);
            c->arch = GGUF_ARCHS[i].arch;
            c->has_qkv_bias = GGUF_ARCHS[i].qkv_bias;
            c->has_qk_norm = GGUF_ARCHS[i].qk_norm;
            *prefix = GGUF_ARCHS[i].name;
            return RS_OK;
        }
    return rs_err(e, RS_EUNSUPPORTED,
                  "'%s': architecture '%.*s' is not supported (the GGUF loader reads llama, qwen2, "
                  "qwen3)",
                  g->path, (int)(alen > 64 ? 64 : alen), arch);
}

/* 1 if the converter interleaved this architecture's q/k rows (llama's GPT-J RoPE order). */
static int arch_permuted_qk(Arch a) {
    for (size_t i = 0; i < sizeof GGUF_ARCHS / sizeof GGUF_ARCHS[0]; i++)
        if (GGUF_ARCHS[i].arch == a) return GGUF_ARCHS[i].permuted_qk;
    return 0;
}

static int read_config(const GGUFFile *g, Config *c, RsErr *e) {
    const char *a = NULL;
    char k[128];
    int rc = read_arch(g, c, &a, e);
    if (rc) return rc;
    if ((rc = need_int(g, a, "embedding_length", &c->dim, e))) return rc;
    if ((rc = need_int(g, a, "feed_forward_length", &c->hidden_dim, e))) return rc;
    if ((rc = need_int(g, a, "block_count", &c->n_layers, e))) return rc;
    if ((rc = need_int(g, a, "attention.head_count", &c->n_heads, e))) return rc;
    long long x;
/* An optional integer key outside lo..hi is refused with the value the file holds. */
#define OPT_INT(key, lo, hi, dst)                                                          \
    do {                                                                                   \
        if (gguf_get_int(g, key, &x) == 0) {                                               \
            if (x < (lo) || x > (hi))                                                      \
                return rs_err(e, RS_EFORMAT, "'%s': metadata '%s' = %lld is outside [%d, %d]", \
                              g->path, key, x, (int)(lo), (int)(hi));                      \
            dst = (int)x;                                                                  \
        }                                                                                  \
    } while (0)
    c->n_kv_heads = c->n_heads;
    OPT_INT(arch_key(k, sizeof k, a, "attention.head_count_kv"), 1, 1024, c->n_kv_heads);
    c->head_dim = c->n_heads > 0 ? c->dim / c->n_heads : 0;
    OPT_INT(arch_key(k, sizeof k, a, "attention.key_length"), 1, 4095, c->head_dim);
    /* Partial RoPE (rotating fewer dimensions than a head has) is not implemented. */
    int rope_dim = c->head_dim;
    OPT_INT(arch_key(k, sizeof k, a, "rope.dimension_count"), 1, 4095, rope_dim);
    if (c->head_dim > 0 && rope_dim != c->head_dim)
        return rs_err(e, RS_EUNSUPPORTED,
                      "'%s': %s.rope.dimension_count %d differs from the head size %d "
                      "(partial RoPE is not supported)",
                      g->path, a, rope_dim, c->head_dim);
    size_t nt;
    if (gguf_get_int(g, arch_key(k, sizeof k, a, "vocab_size"), &x) == 0) {
        OPT_INT(k, 1, (1 << 30) - 1, c->vocab_size);
    } else if (gguf_get_arr_n(g, "tokenizer.ggml.tokens", &nt) == 0) c->vocab_size = nt < (1u << 30) ? (int)nt : -1;
    else {
        const GGUFTensor *t = find_tensor(g, "token_embd.weight");
        c->vocab_size = t && t->n_dims == 2 && t->ne[1] < (1u << 30) ? (int)t->ne[1] : -1;
    }
    c->max_seq_len = gguf_get_int(g, arch_key(k, sizeof k, a, "context_length"), &x) == 0 && x > 0 && x < (1 << 30) ? (int)x : 4096;
    double d;
    c->norm_eps = gguf_get_float(g, arch_key(k, sizeof k, a, "attention.layer_norm_rms_epsilon"), &d) == 0 ? (float)d : 1e-5f;
    c->rope_theta = gguf_get_float(g, arch_key(k, sizeof k, a, "rope.freq_base"), &d) == 0 ? (float)d : 10000.0f;
    const char *st;
    size_t stl;
    if (gguf_get_str(g, arch_key(k, sizeof k, a, "rope.scaling.type"), &st, &stl) == 0 &&
        !(stl == 4 && memcmp(st, "none", 4) == 0))
        return rs_err(e, RS_EUNSUPPORTED, "'%s': rope scaling type '%.*s' is not supported",
                      g->path, (int)(stl > 64 ? 64 : stl), st);
    c->bos_id = gguf_get_int(g, "tokenizer.ggml.bos_token_id", &x) == 0 ? (int)x : -1;
    c->eos_id = gguf_get_int(g, "tokenizer.ggml.eos_token_id", &x) == 0 ? (int)x : -1;
#undef OPT_INT
    c->tied_embeddings = find_tensor(g, "output.weight") == NULL;
    return loader_check_config(c, g->path, e);
}

/* Llama-3.x GGUFs carry rope scaling as a rope_freqs.weight tensor of per-frequency
 * divisors. Recover the llama3 parameters by checking the tensor against the llama3 formula
 * with the metadata (or Meta's defaults); anything else is refused rather than guessed. */
static int read_rope_freqs(const GGUFFile *g, Config *c, RsErr *e) {
    const GGUFTensor *t = find_tensor(g, "rope_freqs.weight");
    if (!t) return RS_OK;
    int half = c->head_dim / 2;
    if (t->type != QT_F32 || t->n_dims != 1 || t->ne[0] != (uint64_t)half)
        return rs_err(e, RS_EUNSUPPORTED, "'%s': rope_freqs.weight is not F32 [%d]", g->path, half);
    float *f = rs_xmalloc(sizeof(float) * (size_t)half);
    quant_dequantize(QT_F32, t->data, f, (size_t)half);
    double factor = 0, lo = 1.0, hi = 4.0, orig = 8192, v;
    for (int i = 0; i < half; i++) factor = f[i] > factor ? f[i] : factor;
    if (gguf_get_float(g, "llama.rope.scaling.factor", &v) == 0) factor = v;
    if (gguf_get_float(g, "llama.rope.scaling.original_context_length", &v) == 0) orig = v;
    int ok = factor >= 1.0;
    for (int i = 0; i < half && ok; i++) {
        double freq = 1.0 / pow(c->rope_theta, (2.0 * i) / c->head_dim);
        double wl = 2 * 3.141592653589793 / freq, want;
        if (wl < orig / hi) want = 1.0;
        else if (wl > orig / lo) want = factor;
        else {
            double s = (orig / wl - lo) / (hi - lo);
            want = 1.0 / ((1 - s) / factor + s);
        }
        ok = fabs(f[i] - want) <= 1e-3 * want;
    }
    free(f);
    if (!ok)
        return rs_err(e, RS_EUNSUPPORTED,
                      "'%s': rope_freqs.weight does not match llama3 rope scaling (factor %g, "
                      "low 1, high 4, original context %g)",
                      g->path, factor, orig);
    c->rope_scaling = 1;
    c->rope_factor = (float)factor;
    c->rope_low_freq_factor = (float)lo;
    c->rope_high_freq_factor = (float)hi;
    c->rope_orig_max_pos = (int)orig;
    return RS_OK;
}

static void fmt_shape(char *buf, size_t n, const uint64_t *ne, int nd) {
    int k = snprintf(buf, n, "[");
    for (int d = 0; d < nd && k < (int)n; d++)
        k += snprintf(buf + k, n - (size_t)k, "%s%llu", d ? ", " : "", (unsigned long long)ne[d]);
    if (k < (int)n) snprintf(buf + k, n - (size_t)k, "]");
}

/* Points a planned matrix at its bytes in the mapping, or dequantizes a planned vector.
 * q/k rows were permuted by llama.cpp's converter (HF row h*hd + j*hd/2 + i went to GGUF
 * row h*hd + 2*i + j): a matrix keeps that order and records the head size for
 * qtensor_row; a vector (bias) is scattered to its HF order. */
static int load_tensor(const GGUFFile *g, const WeightReq *w, uint64_t *fp, RsErr *e) {
    const GGUFTensor *t = find_tensor(g, w->gguf_name);
    if (!t) return rs_err(e, RS_EFORMAT, "'%s': missing tensor '%s'", g->path, w->gguf_name);
    uint64_t want[2] = {(uint64_t)(w->cols ? w->cols : w->rows), (uint64_t)w->rows};
    int want_nd = w->cols ? 2 : 1;
    if ((int)t->n_dims != want_nd || t->ne[0] != want[0] || (want_nd == 2 && t->ne[1] != want[1])) {
        char a[96], b[96];
        fmt_shape(a, sizeof a, t->ne, (int)t->n_dims);
        fmt_shape(b, sizeof b, want, want_nd);
        return rs_err(e, RS_EFORMAT,
                      "'%s': tensor '%s' has shape %s, expected %s (GGUF order, ne[0] first)",
                      g->path, w->gguf_name, a, b);
    }
    if (!quant_type_supported(t->type))
        return rs_err(e, RS_EUNSUPPORTED,
                      "'%s': tensor '%s' has type %s, which rootspec cannot dequantize (supported: "
                      QUANT_SUPPORTED_NAMES ")",
                      g->path, w->gguf_name, quant_type_name(t->type));
    *fp = loader_fnv(*fp, w->gguf_name, strlen(w->gguf_name));
    *fp = loader_fnv(*fp, &t->type, sizeof t->type);
    *fp = loader_fnv(*fp, t->ne, sizeof t->ne);
    size_t rows = (size_t)w->rows, cols = (size_t)(w->cols ? w->cols : 1);
    int perm = w->perm_heads && rows % (size_t)w->perm_heads == 0;
    if (w->qt) {
        size_t be, bb;
        quant_type_geometry(t->type, &be, &bb);
        w->qt->type = t->type;
        w->qt->data = t->data;
        w->qt->row_bytes = cols / be * bb;
        w->qt->perm_hd = perm ? (int)(rows / (size_t)w->perm_heads) : 0;
        return RS_OK;
    }
    float *dst = *w->slot;
    if (!perm) {
        quant_dequantize(t->type, t->data, dst, rows);
        return RS_OK;
    }
    /* a vector is permuted element-wise: blocks of 1 only */
    RS_ASSERT(t->type == QT_F32 || t->type == QT_F16 || t->type == QT_BF16);
    size_t hd = rows / (size_t)w->perm_heads;
    float *tmp = rs_xmalloc(rows * sizeof(float));
    quant_dequantize(t->type, t->data, tmp, rows);
    for (size_t r = 0; r < rows; r++)
        dst[(r / hd) * hd + (r % 2) * (hd / 2) + (r % hd) / 2] = tmp[r];
    free(tmp);
    return RS_OK;
}

static int contains(const char *s, size_t n, const char *needle, int icase) {
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (icase ? strncasecmp(s + i, needle, k) == 0 : memcmp(s + i, needle, k) == 0) return 1;
    return 0;
}

static void chat_hint(const GGUFFile *g, char *out, size_t n) {
    const char *name = "", *tmpl = "";
    size_t nl = 0, tl = 0;
    gguf_get_str(g, "general.name", &name, &nl);
    gguf_get_str(g, "tokenizer.chat_template", &tmpl, &tl);
    const char *h = "";
    if (contains(name, nl, "smollm", 1) || contains(tmpl, tl, "SmolLM", 0)) h = "smollm2";
    else if (contains(tmpl, tl, "<|im_start|>", 0) &&
             (contains(name, nl, "qwen3", 1) || contains(tmpl, tl, "<think>", 0)))
        h = "qwen3";
    else if (contains(tmpl, tl, "<|im_start|>", 0) &&
             (contains(name, nl, "qwen", 1) || contains(tmpl, tl, "Qwen", 0)))
        h = "qwen2";
    else if (contains(tmpl, tl, "<|start_header_id|>", 0)) h = "llama3";
    snprintf(out, n, "%s", h);
}

int gguf_load_model(const char *path, Model **out, RsErr *e) {
    *out = NULL;
    GGUFFile *g;
    int rc = gguf_open(path, &g, e);
    if (rc) return rc;
    Model *m = rs_xcalloc(1, sizeof(Model));
    m->gguf = g;
    snprintf(m->path, sizeof m->path, "%s", path);
    m->tok_source = TOKSRC_GGUF;
    WeightReq *reqs = NULL;
    int n = 0;
    if ((rc = read_config(g, &m->cfg, e)) || (rc = read_rope_freqs(g, &m->cfg, e)) ||
        (rc = loader_plan(m, &reqs, &n, e))) {
        model_destroy(&m);
        return rc;
    }
    uint64_t fp = loader_fnv_config(0xcbf29ce484222325ull, &m->cfg);
    if (!arch_permuted_qk(m->cfg.arch))
        for (int i = 0; i < n; i++) reqs[i].perm_heads = 0;
    for (int i = 0; i < n && !rc; i++) rc = load_tensor(g, &reqs[i], &fp, e);
    free(reqs);
    if (m->cfg.tied_embeddings) m->w.wcls = m->w.tok_embeddings;
    char extra[64];
    snprintf(extra, sizeof extra, "blk.%d.attn_norm.weight", m->cfg.n_layers);
    if (!rc && find_tensor(g, extra))
        rc = rs_err(e, RS_EFORMAT,
                    "'%s': holds tensor '%s' but block_count is %d (truncated metadata?)",
                    path, extra, m->cfg.n_layers);
    if (rc) {
        model_destroy(&m);
        return rc;
    }
    snprintf(m->fingerprint, sizeof m->fingerprint, "%016llx", (unsigned long long)fp);
    chat_hint(g, m->chat_hint, sizeof m->chat_hint);
    *out = m;
    return RS_OK;
}

/* ---- conversion to a 16-bit float file ---- */

static void put_le(FILE *f, uint64_t v, int n) {
    for (int i = 0; i < n; i++) fputc((int)((v >> (8 * i)) & 0xff), f);
}

/* The type tensor t gets: matrices (2+ dimensions) `type`, vectors as they are (the loader
 * expands vectors to f32 whatever they are stored in). */
static uint32_t convert_type(const GGUFTensor *t, uint32_t type) {
    return t->n_dims >= 2 ? type : t->type;
}

static uint64_t convert_bytes(const GGUFTensor *t, uint32_t type) {
    if (type == t->type) return t->nbytes;
    uint64_t nel = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    return nel * 2;
}

/* Header and metadata as the input has them (general.file_type says the new type), then
 * the tensor infos with their new types and offsets; returns the data section's size. */
static uint64_t convert_header(const GGUFFile *g, FILE *f, uint32_t type) {
    fwrite("GGUF", 1, 4, f);
    put_le(f, 3, 4);
    put_le(f, g->n_t, 8);
    put_le(f, g->n_kv, 8);
    size_t kv_n = g->kv_end - 24;
    uint8_t *kv = rs_xmalloc(kv_n + 1);
    memcpy(kv, g->map + 24, kv_n);
    const GGUFKV *ft = find_kv(g, "general.file_type");
    if (ft && (ft->type == GV_U32 || ft->type == GV_I32)) {
        uint32_t v = type == QT_F16 ? 1 : 32; /* llama.cpp's MOSTLY_F16, MOSTLY_BF16 */
        for (int i = 0; i < 4; i++) kv[(size_t)(ft->val - g->map) - 24 + i] = (uint8_t)(v >> (8 * i));
    }
    fwrite(kv, 1, kv_n, f);
    free(kv);
    uint64_t off = 0;
    for (size_t i = 0; i < g->n_t; i++) {
        const GGUFTensor *t = &g->t[i];
        uint32_t ty = convert_type(t, type);
        put_le(f, t->name_len, 8);
        fwrite(t->name, 1, t->name_len, f);
        put_le(f, t->n_dims, 4);
        for (uint32_t d = 0; d < t->n_dims; d++) put_le(f, t->ne[d], 8);
        put_le(f, ty, 4);
        put_le(f, off, 8);
        off += (convert_bytes(t, ty) + g->alignment - 1) / g->alignment * g->alignment;
    }
    return off;
}

/* One tensor's data: its bytes, or its rows expanded by the engine's dequantizer and
 * rounded to `type`. */
static void convert_data(const GGUFTensor *t, uint32_t type, FILE *f) {
    if (type == t->type) {
        fwrite(t->data, 1, t->nbytes, f);
        return;
    }
    size_t cols = (size_t)t->ne[0], rows = (size_t)(t->ne[1] * t->ne[2] * t->ne[3]), be, bb;
    quant_type_geometry(t->type, &be, &bb);
    float *x = rs_xmalloc(cols * sizeof(float));
    uint8_t *h = rs_xmalloc(cols * 2);
    for (size_t r = 0; r < rows; r++) {
        quant_dequantize(t->type, t->data + r * (cols / be * bb), x, cols);
        for (size_t c = 0; c < cols; c++) {
            uint16_t v = type == QT_F16 ? quant_f32_to_f16(x[c]) : quant_f32_to_bf16(x[c]);
            h[2 * c] = (uint8_t)v, h[2 * c + 1] = (uint8_t)(v >> 8);
        }
        fwrite(h, 1, cols * 2, f);
    }
    free(h);
    free(x);
}

static void pad_to(FILE *f, uint64_t pos) {
    for (long cur = ftell(f); cur >= 0 && (uint64_t)cur < pos; cur++) fputc(0, f);
}

static int convert_write(const GGUFFile *g, const char *out, uint32_t type, RsErr *e) {
    FILE *f = fopen(out, "wb");
    if (!f) return rs_err(e, RS_EIO, "cannot create '%s': %s", out, strerror(errno));
    convert_header(g, f, type);
    long hdr = ftell(f);
    uint64_t data_off = ((uint64_t)(hdr < 0 ? 0 : hdr) + g->alignment - 1) / g->alignment * g->alignment;
    uint64_t off = 0;
    for (size_t i = 0; i < g->n_t; i++) {
        const GGUFTensor *t = &g->t[i];
        uint32_t ty = convert_type(t, type);
        pad_to(f, data_off + off);
        convert_data(t, ty, f);
        off += (convert_bytes(t, ty) + g->alignment - 1) / g->alignment * g->alignment;
    }
    int bad = ferror(f) || hdr < 0;
    if (fclose(f) != 0 || bad) return rs_err(e, RS_EIO, "cannot write '%s': %s", out, strerror(errno));
    return RS_OK;
}

int gguf_convert(const char *in, const char *out, uint32_t type, RsErr *e) {
    if (type != QT_F16 && type != QT_BF16)
        return rs_err(e, RS_EINVAL, "gguf_convert: type %s is not F16 or BF16",
                      quant_type_name(type) ? quant_type_name(type) : "?");
    Model *m = NULL;
    int rc = gguf_load_model(in, &m, e); /* what the engine cannot load is not converted */
    if (rc) return rc;
    const GGUFFile *g = m->gguf;
    char tnb[200];
    for (size_t i = 0; i < g->n_t && !rc; i++)
        if (convert_type(&g->t[i], type) != g->t[i].type && !quant_type_supported(g->t[i].type))
            rc = rs_err(e, RS_EUNSUPPORTED, "'%s': tensor '%s' has type %s, which rootspec cannot "
                        "dequantize (supported: " QUANT_SUPPORTED_NAMES ")", in,
                        rs_escape(tnb, sizeof tnb, g->t[i].name, g->t[i].name_len, 0),
                        quant_type_name(g->t[i].type));
    if (rc) {
        model_destroy(&m);
        return rc;
    }
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp%ld", out, (long)getpid());
    rc = convert_write(m->gguf, tmp, type, e);
    model_destroy(&m);
    if (!rc && rename(tmp, out) != 0)
        rc = rs_err(e, RS_EIO, "cannot rename '%s' to '%s': %s", tmp, out, strerror(errno));
    if (rc) unlink(tmp);
    return rc;
}
