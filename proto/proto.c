/* Wire protocol codec and ZeroMQ helpers (layout documented in proto.h and PROTOCOL.md).
 * Encoding uses msgpack-c's packer. Decoding uses a small strict reader over the frame
 * instead of msgpack-c's unpacker: the unpacker allocates a zone per message and sizes
 * arrays from their (untrusted) headers before reading them, whereas this reader checks
 * every length against the bytes left and the protocol's limits first, and writes POOL
 * bodies straight into the caller's Pool. */
#include "proto.h"
#include "common/textsafe.h"
#include "common/quant.h"
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>
#ifdef __linux__
#include <linux/sched/types.h>
#include <sys/syscall.h>
#endif

/* ---------------------------------------------------------------- reader */

typedef struct {
    const uint8_t *p; // (len)
    size_t len, off;
    const char *ctx; /* message type name for error messages */
    RsErr *e;
    int code; /* first failure (negative RsStatus), RS_OK while fine */
} Rd;

/* The one error path of the decoder: records the first failure and returns -1 so callers
 * can `return rd_fail(...)` and callers of callers just propagate -1. */
__attribute__((format(printf, 3, 4))) static int rd_fail(Rd *r, int code, const char *fmt, ...) {
    if (r->code == RS_OK) {
        char tmp[900];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(tmp, sizeof tmp, fmt, ap);
        va_end(ap);
        r->code = code;
        rs_err(r->e, code, "proto: %s%s%s", r->ctx ? r->ctx : "", r->ctx ? " " : "", tmp);
    }
    return -1;
}

/* "name" or "name[idx]". */
static const char *fld(char *buf, size_t cap, const char *name, long idx) {
    if (idx < 0) return name;
    snprintf(buf, cap, "%s[%ld]", name, idx);
    return buf;
}
/* The field's name, formatted only on the failure path (a compound literal holds it). */
#define FLD fld((char[64]){0}, 64, name, idx)

/* What the next value is, with its article, for "x is <kind>, expected y" messages. */
static const char *kind_name(uint8_t b) {
    if (b <= 0x7f || b >= 0xe0) return "an int";
    if (b <= 0x8f) return "a map";
    if (b <= 0x9f) return "an array";
    if (b <= 0xbf) return "a str";
    switch (b) {
    case 0xc0: return "nil";
    case 0xc1: return "the reserved byte 0xc1";
    case 0xc2: case 0xc3: return "a bool";
    case 0xc4: case 0xc5: case 0xc6: return "a bin";
    case 0xca: case 0xcb: return "a float";
    case 0xcc: case 0xcd: case 0xce: case 0xcf: return "an int";
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: return "an int";
    case 0xd9: case 0xda: case 0xdb: return "a str";
    case 0xdc: case 0xdd: return "an array";
    case 0xde: case 0xdf: return "a map";
    default: return "an ext"; /* 0xc7-0xc9, 0xd4-0xd8 */
    }
}

static int is_str(uint8_t b) { return (b >= 0xa0 && b <= 0xbf) || (b >= 0xd9 && b <= 0xdb); }
static int is_int(uint8_t b) { return b <= 0x7f || b >= 0xe0 || (b >= 0xcc && b <= 0xd3); }

static int rd_need(Rd *r, size_t k, const char *name, long idx) {
    if (r->len - r->off < k)
        return rd_fail(r, RS_EFORMAT,
                       "truncated frame: %s needs %zu bytes at offset %zu, frame has %zu", FLD, k,
                       r->off, r->len);
    return 0;
}

static uint64_t be(const uint8_t *p, int k) {
    uint64_t v = 0;
    for (int i = 0; i < k; i++) v = (v << 8) | p[i];
    return v;
}

/* Type byte of the next value (not consumed). */
static int rd_peek(Rd *r, const char *name, long idx, uint8_t *b) {
    if (rd_need(r, 1, name, idx)) return -1;
    *b = r->p[r->off];
    return 0;
}

/* Any msgpack integer: *neg = 1 with *sv, or *neg = 0 with *uv. */
static int rd_int_raw(Rd *r, const char *name, long idx, int *neg, int64_t *sv, uint64_t *uv) {
    uint8_t b;
    if (rd_peek(r, name, idx, &b)) return -1;
    *neg = 0;
    *sv = 0;
    *uv = 0;
    if (b <= 0x7f) {
        r->off++;
        *uv = b;
        return 0;
    }
    if (b >= 0xe0) {
        r->off++;
        *neg = 1;
        *sv = (int8_t)b;
        return 0;
    }
    int k, is_signed;
    switch (b) {
    case 0xcc: k = 1; is_signed = 0; break;
    case 0xcd: k = 2; is_signed = 0; break;
    case 0xce: k = 4; is_signed = 0; break;
    case 0xcf: k = 8; is_signed = 0; break;
    case 0xd0: k = 1; is_signed = 1; break;
    case 0xd1: k = 2; is_signed = 1; break;
    case 0xd2: k = 4; is_signed = 1; break;
    case 0xd3: k = 8; is_signed = 1; break;
    default: return rd_fail(r, RS_EPROTO, "%s is %s, expected int", FLD, kind_name(b));
    }
    if (rd_need(r, 1 + (size_t)k, name, idx)) return -1;
    uint64_t v = be(r->p + r->off + 1, k);
    r->off += 1 + (size_t)k;
    if (!is_signed) {
        *uv = v;
        return 0;
    }
    int64_t s;
    switch (k) {
    case 1: s = (int8_t)v; break;
    case 2: s = (int16_t)v; break;
    case 4: s = (int32_t)v; break;
    default: memcpy(&s, &v, 8); break;
    }
    if (s < 0) {
        *neg = 1;
        *sv = s;
    } else {
        *uv = (uint64_t)s;
    }
    return 0;
}

static int rd_u64(Rd *r, const char *name, long idx, uint64_t lo, uint64_t hi, uint64_t *out) {
    int neg;
    int64_t sv;
    uint64_t uv;
    if (rd_int_raw(r, name, idx, &neg, &sv, &uv)) return -1;
    if (neg)
        return rd_fail(r, RS_EPROTO, "%s is %lld, expected %llu..%llu", FLD, (long long)sv,
                       (unsigned long long)lo, (unsigned long long)hi);
    if (uv < lo || uv > hi)
        return rd_fail(r, RS_EPROTO, "%s is %llu, expected %llu..%llu", FLD,
                       (unsigned long long)uv, (unsigned long long)lo, (unsigned long long)hi);
    *out = uv;
    return 0;
}

static int rd_i64(Rd *r, const char *name, long idx, int64_t lo, int64_t hi, int64_t *out) {
    int neg;
    int64_t sv;
    uint64_t uv;
    if (rd_int_raw(r, name, idx, &neg, &sv, &uv)) return -1;
    if (!neg && uv > (uint64_t)INT64_MAX)
        return rd_fail(r, RS_EPROTO, "%s is %llu, expected %lld..%lld", FLD,
                       (unsigned long long)uv, (long long)lo, (long long)hi);
    int64_t v = neg ? sv : (int64_t)uv;
    if (v < lo || v > hi)
        return rd_fail(r, RS_EPROTO, "%s is %lld, expected %lld..%lld", FLD, (long long)v,
                       (long long)lo, (long long)hi);
    *out = v;
    return 0;
}

static int rd_f32(Rd *r, const char *name, long idx, float *out) {
    uint8_t b;
    if (rd_peek(r, name, idx, &b)) return -1;
    if (b == 0xca) {
        if (rd_need(r, 5, name, idx)) return -1;
        uint32_t u = (uint32_t)be(r->p + r->off + 1, 4);
        memcpy(out, &u, 4);
        r->off += 5;
        return 0;
    }
    if (b == 0xcb) { /* a peer that packs doubles: narrowed here, range checked later */
        if (rd_need(r, 9, name, idx)) return -1;
        uint64_t u = be(r->p + r->off + 1, 8);
        double d;
        memcpy(&d, &u, 8);
        *out = (float)d;
        r->off += 9;
        return 0;
    }
    return rd_fail(r, RS_EPROTO, "%s is %s, expected float", FLD, kind_name(b));
}

/* Array header with at most max elements (RS_EPROTO beyond), each needing >= 1 byte. */
static int rd_arr(Rd *r, const char *name, long idx, uint32_t max, uint32_t *n) {
    uint8_t b;
    if (rd_peek(r, name, idx, &b)) return -1;
    uint32_t v;
    size_t hdr;
    if (b >= 0x90 && b <= 0x9f) {
        v = b & 0x0f;
        hdr = 1;
    } else if (b == 0xdc || b == 0xdd) {
        hdr = b == 0xdc ? 3 : 5;
        if (rd_need(r, hdr, name, idx)) return -1;
        v = (uint32_t)be(r->p + r->off + 1, (int)hdr - 1);
    } else {
        return rd_fail(r, RS_EPROTO, "%s is %s, expected array", FLD, kind_name(b));
    }
    if (v > max) return rd_fail(r, RS_EPROTO, "%s has %u entries, limit %u", FLD, v, max);
    r->off += hdr;
    if (r->len - r->off < v)
        return rd_fail(r, RS_EFORMAT,
                       "truncated frame: %s has %u entries but only %zu bytes remain", FLD, v,
                       r->len - r->off);
    *n = v;
    return 0;
}

static int rd_arr_exact(Rd *r, const char *name, uint32_t want) {
    uint32_t n;
    long idx = -1;
    if (rd_arr(r, name, idx, 0xffffffffu, &n)) return -1;
    if (n != want)
        return rd_fail(r, RS_EPROTO, "%s has %u fields, expected %u", FLD, n, want);
    return 0;
}

/* Str header; returns pointer and length into the frame. */
static int rd_str_raw(Rd *r, const char *name, long idx, const uint8_t **s, uint32_t *n) {
    uint8_t b;
    if (rd_peek(r, name, idx, &b)) return -1;
    size_t hdr;
    uint32_t v;
    if (b >= 0xa0 && b <= 0xbf) {
        hdr = 1;
        v = b & 0x1f;
    } else if (b >= 0xd9 && b <= 0xdb) {
        hdr = b == 0xd9 ? 2 : b == 0xda ? 3 : 5;
        if (rd_need(r, hdr, name, idx)) return -1;
        v = (uint32_t)be(r->p + r->off + 1, (int)hdr - 1);
    } else {
        return rd_fail(r, RS_EPROTO, "%s is %s, expected str", FLD, kind_name(b));
    }
    if (rd_need(r, hdr + v, name, idx)) return -1;
    *s = r->p + r->off + hdr;
    *n = v;
    r->off += hdr + v;
    return 0;
}

/* Str into a fixed NUL-terminated buffer of max+1 bytes; embedded NULs are rejected so
 * that the C string is the whole value. */
static int rd_str(Rd *r, const char *name, long idx, char *dst, uint32_t max) {
    const uint8_t *s;
    uint32_t n;
    if (rd_str_raw(r, name, idx, &s, &n)) return -1;
    if (n > max) return rd_fail(r, RS_EPROTO, "%s is %u bytes, max %u", FLD, n, max);
    if (memchr(s, 0, n)) return rd_fail(r, RS_EPROTO, "%s contains a NUL byte", FLD);
    memcpy(dst, s, n);
    dst[n] = 0;
    return 0;
}

/* Bin header of at most max bytes (checked before the payload, with `what` naming the
 * limit); returns pointer and length into the frame. */
static int rd_bin_raw(Rd *r, const char *name, long idx, uint32_t max, const char *what,
                      const uint8_t **s, uint32_t *n) {
    uint8_t b;
    if (rd_peek(r, name, idx, &b)) return -1;
    if (b < 0xc4 || b > 0xc6)
        return rd_fail(r, RS_EPROTO, "%s is %s, expected bin", FLD, kind_name(b));
    size_t hdr = b == 0xc4 ? 2 : b == 0xc5 ? 3 : 5;
    if (rd_need(r, hdr, name, idx)) return -1;
    uint32_t v = (uint32_t)be(r->p + r->off + 1, (int)hdr - 1);
    if (v > max)
        return rd_fail(r, RS_EPROTO, "%s is %u bytes, over the %u-byte limit (%s)", FLD, v, max,
                       what);
    if (rd_need(r, hdr + v, name, idx)) return -1;
    *s = r->p + r->off + hdr;
    *n = v;
    r->off += hdr + v;
    return 0;
}

/* ---------------------------------------------------------------- decoder */

static const char *const type_names[] = {"NONE",        "HELLO", "HELLO_OK", "RESET",
                                         "COMMIT_GROW", "POOL",  "ERROR",    "BYE",
                                         "APPEND", "CLOSE"};

const char *proto_type_name(int type) {
    if (type < 0 || type > PROTO_TYPE_LAST) return "UNKNOWN";
    return type_names[type];
}

static int dec_hello_common(Rd *r, char *fp, uint64_t *hash, uint32_t *vocab, uint32_t *caps) {
    uint64_t v;
    if (rd_str(r, "fingerprint", -1, fp, PROTO_FP_MAX)) return -1;
    if (rd_u64(r, "tokenizer_hash", -1, 0, UINT64_MAX, hash)) return -1;
    if (rd_u64(r, "vocab_size", -1, 0, INT32_MAX, &v)) return -1;
    *vocab = (uint32_t)v;
    if (rd_u64(r, "capabilities", -1, 0, UINT32_MAX, &v)) return -1;
    *caps = (uint32_t)v;
    return 0;
}

static int dec_hello(Rd *r, ProtoHello *h) {
    uint64_t v;
    if (rd_arr_exact(r, "body", 5)) return -1;
    if (dec_hello_common(r, h->fingerprint, &h->tokenizer_hash, &h->vocab_size, &h->caps))
        return -1;
    if (rd_arr_exact(r, "pool shape", 3)) return -1;
    if (rd_u64(r, "topk", -1, 0, UINT32_MAX, &v)) return -1;
    h->topk = (uint32_t)v;
    if (rd_u64(r, "depth", -1, 0, UINT32_MAX, &v)) return -1;
    h->depth = (uint32_t)v;
    if (rd_u64(r, "expand", -1, 0, UINT32_MAX, &v)) return -1;
    h->expand = (uint32_t)v;
    return 0;
}

static int dec_hello_ok(Rd *r, ProtoHelloOk *h) {
    uint32_t n;
    uint64_t v;
    if (rd_arr_exact(r, "body", 6)) return -1;
    if (dec_hello_common(r, h->fingerprint, &h->tokenizer_hash, &h->vocab_size, &h->caps))
        return -1;
    if (rd_str(r, "drafter_name", -1, h->name, PROTO_NAME_MAX)) return -1;
    if (rd_arr(r, "feature_layers", -1, PROTO_FEAT_LAYERS_MAX, &n)) return -1;
    for (uint32_t i = 0; i < n; i++) {
        if (rd_u64(r, "feature_layers", (long)i, 0, 65535, &v)) return -1;
        h->feat_layers[i] = (int)v;
    }
    h->n_feat_layers = (int)n;
    if ((n > 0) != ((h->caps & PROTO_CAP_FEATURES) != 0))
        return rd_fail(r, RS_EPROTO, "feature_layers has %u entries but capabilities 0x%x %s "
                       "FEATURES (0x%x)", n, h->caps, n ? "lack" : "have", PROTO_CAP_FEATURES);
    return 0;
}

static int64_t tok_hi(const ProtoMsg *m) {
    return m->vocab_size > 0 ? m->vocab_size - 1 : INT32_MAX;
}

/* The features field of RESET / COMMIT_GROW for n tokens, into out->feat_store. */
static int dec_features(Rd *r, ProtoMsg *out, uint32_t n) {
    uint32_t k, len = 0;
    uint64_t type, width;
    const uint8_t *data = NULL;
    ProtoTokens *t = &out->u.tokens;
    if (rd_arr(r, "features", -1, 3, &k)) return -1;
    if (k == 0) return 0;
    if (k != 3) return rd_fail(r, RS_EPROTO, "features has %u fields, expected 0 or 3", k);
    if (rd_u64(r, "features dtype", -1, PROTO_FEAT_BF16, PROTO_FEAT_F16, &type)) return -1;
    if (rd_u64(r, "features width", -1, 1, PROTO_FEAT_WIDTH_MAX, &width)) return -1;
    if (rd_bin_raw(r, "features data", -1, PROTO_MAX_FEAT_BYTES, "PROTO_MAX_FEAT_BYTES", &data,
                   &len))
        return -1;
    uint64_t want = (uint64_t)n * width * 2;
    if (len != want)
        return rd_fail(r, RS_EPROTO, "features data is %u bytes, expected %llu (%u tokens x "
                       "width %llu x 2)", len, (unsigned long long)want, n,
                       (unsigned long long)width);
    size_t vals = len / 2;
    if (vals > out->feat_cap) {
        uint16_t *f = realloc(out->feat_store, vals * sizeof *f);
        if (!f) return rd_fail(r, RS_ENOMEM, "cannot allocate %zu feature values", vals);
        out->feat_store = f;
        out->feat_cap = vals;
    }
    for (size_t i = 0; i < vals; i++)
        out->feat_store[i] = (uint16_t)(data[2 * i] | data[2 * i + 1] << 8);
    t->feat_type = (ProtoFeatType)type;
    t->feat_width = (int)width;
    t->feat = out->feat_store;
    return 0;
}

/* grow: a COMMIT_GROW, whose body may carry a third and a fourth element, the pool depth
 * and width. */
static int dec_tokens(Rd *r, ProtoMsg *out, int min_n, int grow) {
    uint32_t n, parts;
    if (rd_arr(r, "body", -1, 4, &parts)) return -1;
    if (parts != 2 && !(grow && (parts == 3 || parts == 4)))
        return rd_fail(r, RS_EPROTO, "body has %u fields, expected 2%s", parts,
                       grow ? " to 4" : "");
    if (rd_arr(r, "tokens", -1, PROTO_MAX_TOKENS, &n)) return -1;
    if ((int)n < min_n)
        return rd_fail(r, RS_EPROTO, "tokens has %u entries, expected at least %d", n, min_n);
    if ((int)n > out->tok_cap) {
        int cap = out->tok_cap ? out->tok_cap : 256;
        while (cap < (int)n) cap *= 2;
        int32_t *t = realloc(out->tok_store, (size_t)cap * sizeof *t);
        if (!t) return rd_fail(r, RS_ENOMEM, "cannot allocate %d token ids", cap);
        out->tok_store = t;
        out->tok_cap = cap;
    }
    int64_t hi = tok_hi(out), v;
    for (uint32_t i = 0; i < n; i++) {
        if (rd_i64(r, "tokens", (long)i, 0, hi, &v)) return -1;
        out->tok_store[i] = (int32_t)v;
    }
    out->u.tokens.ids = out->tok_store;
    out->u.tokens.n = (int)n;
    if (dec_features(r, out, n)) return -1;
    if (parts < 3) return 0;
    if (rd_i64(r, "depth", -1, 1, POOL_MAX_DEPTH, &v)) return -1;
    out->u.tokens.depth = (int)v;
    if (parts < 4) return 0;
    if (rd_i64(r, "width", -1, 1, POOL_EXPAND, &v)) return -1;
    out->u.tokens.width = (int)v;
    return 0;
}

static int dec_pool_arr(Rd *r, const char *name, uint32_t n) {
    uint32_t k;
    long idx = -1;
    if (rd_arr(r, name, idx, POOL_MAX, &k)) return -1;
    if (k != n) return rd_fail(r, RS_EPROTO, "%s has %u entries, n is %u", FLD, k, n);
    return 0;
}

static int dec_pool(Rd *r, ProtoMsg *out) {
    Pool *p = out->pool_into;
    if (!p) {
        if (!out->pool_own) {
            out->pool_own = malloc(sizeof(Pool));
            if (!out->pool_own) return rd_fail(r, RS_ENOMEM, "cannot allocate a Pool");
        }
        p = out->pool_own;
    }
    p->n = 0;
    p->draft_host_ns = 0; /* the optional fields absent: "not reported" */
    p->draft_rows = 0;
    out->u.pool.pool = p;
    uint64_t v;
    int64_t s;
    uint32_t nf;
    const char *name = "body";
    long idx = -1;
    if (rd_arr(r, name, idx, 0xffffffffu, &nf)) return -1;
    if (nf != 9 && nf != 11) /* 11: the optional draft_host_ns, draft_rows */
        return rd_fail(r, RS_EPROTO, "%s has %u fields, expected 9 or 11", FLD, nf);
    if (rd_u64(r, "n", -1, 0, POOL_MAX, &v)) return -1;
    uint32_t n = (uint32_t)v;
    int64_t hi = tok_hi(out);
    if (dec_pool_arr(r, "tokens", n)) return -1;
    for (uint32_t i = 0; i < n; i++) {
        if (rd_i64(r, "tokens", (long)i, 0, hi, &s)) return -1;
        p->token[i] = (int32_t)s;
    }
    if (dec_pool_arr(r, "parents", n)) return -1;
    for (uint32_t i = 0; i < n; i++) {
        if (rd_i64(r, "parents", (long)i, -1, POOL_MAX - 1, &s)) return -1;
        p->parent[i] = (int32_t)s;
    }
    if (dec_pool_arr(r, "logq", n)) return -1;
    for (uint32_t i = 0; i < n; i++)
        if (rd_f32(r, "logq", (long)i, &p->logq[i])) return -1;
    if (dec_pool_arr(r, "depths", n)) return -1;
    for (uint32_t i = 0; i < n; i++) {
        if (rd_u64(r, "depths", (long)i, 1, POOL_MAX_DEPTH, &v)) return -1;
        p->depth[i] = (uint8_t)v;
    }
    if (rd_u64(r, "draft_ns", -1, 0, UINT64_MAX, &p->draft_ns)) return -1;
    if (rd_u64(r, "commit_pass_ns", -1, 0, UINT64_MAX, &out->u.pool.commit_pass_ns)) return -1;
    if (rd_u64(r, "n_passes", -1, 0, INT32_MAX, &v)) return -1;
    p->n_passes = (int)v;
    if (rd_u64(r, "n_expanded", -1, 0, INT32_MAX, &v)) return -1;
    p->n_expanded = (int)v;
    if (nf == 11) {
        if (rd_u64(r, "draft_host_ns", -1, 0, UINT64_MAX, &p->draft_host_ns)) return -1;
        if (rd_u64(r, "draft_rows", -1, 0, INT32_MAX, &v)) return -1;
        /* sent only with rows to report: 0 here would not survive a re-encoding */
        if (v == 0) return rd_fail(r, RS_EPROTO, "draft_rows is 0 in an 11-field POOL (the "
                                                 "optional fields come only when it is > 0)");
        p->draft_rows = (int)v;
    }
    p->n = (int)n;
    RsErr pe = {0};
    if (pool_finalize(p, out->vocab_size, &pe) != RS_OK)
        return rd_fail(r, RS_EPROTO, "%s", pe.msg);
    return 0;
}

static int dec_error(Rd *r, ProtoError *er) {
    int64_t c;
    if (rd_arr_exact(r, "body", 2)) return -1;
    if (rd_i64(r, "code", -1, INT32_MIN, INT32_MAX, &c)) return -1;
    er->code = (int32_t)c;
    return rd_str(r, "message", -1, er->message, PROTO_MSG_MAX);
}

/* What the versions after `ver` added, for the message that refuses an older peer. */
static const char *proto_version_news(uint64_t ver) {
    return ver == 1   ? "target features for EAGLE-3 drafters, the pool width, then sequence ids"
           : ver == 2 ? "the pool width in COMMIT_GROW, then sequence ids"
                      : "a sequence id in every frame, CLOSE";
}

static int dec_header(Rd *r, ProtoMsg *out, uint64_t *type) {
    uint8_t b;
    uint32_t n;
    if (rd_peek(r, "frame", -1, &b)) return -1;
    if (rd_arr(r, "frame", -1, 0xffffffffu, &n)) return -1;
    /* an older peer's 6-element frame is judged by its version below */
    if (n != 6 && n != 7)
        return rd_fail(r, RS_EPROTO, "frame is an array of %u elements, expected 7", n);
    /* magic */
    if (rd_peek(r, "magic", -1, &b)) return -1;
    if (is_str(b)) {
        const uint8_t *s;
        uint32_t len;
        if (rd_str_raw(r, "magic", -1, &s, &len)) return -1;
        if (len != 4 || memcmp(s, PROTO_MAGIC, 4) != 0) {
            char rep[64];
            rs_escape(rep, sizeof rep, s, len < 12 ? len : 12, 1);
            return rd_fail(r, RS_EPROTO, "bad magic \"%s\"%s, expected \"RSPC\"", rep,
                           len > 12 ? "..." : "");
        }
    } else if (is_int(b)) {
        uint64_t m;
        if (rd_u64(r, "magic", -1, 0, UINT64_MAX, &m)) return -1;
        if (m != PROTO_MAGIC_U32)
            return rd_fail(r, RS_EPROTO, "bad magic 0x%llx, expected \"RSPC\"",
                           (unsigned long long)m);
    } else {
        return rd_fail(r, RS_EPROTO, "magic is %s, expected str \"RSPC\"", kind_name(b));
    }
    /* Session and seq are read before version and type are judged, so that an ERROR reply
     * to a frame from a newer or confused peer can still name its request. */
    uint64_t ver;
    if (rd_u64(r, "version", -1, 0, UINT64_MAX, &ver)) return -1;
    if (rd_u64(r, "type", -1, 0, UINT64_MAX, type)) return -1;
    if (rd_u64(r, "session", -1, 0, UINT64_MAX, &out->session)) return -1;
    if (rd_u64(r, "seq", -1, 0, UINT64_MAX, &out->seq)) return -1;
    if (ver >= 1 && ver < PROTO_VERSION)
        return rd_fail(r, RS_EUNSUPPORTED, "the peer speaks protocol version %llu, this end "
                       "version %d (%s): run the same rootspec release on both ends",
                       (unsigned long long)ver, PROTO_VERSION, proto_version_news(ver));
    if (ver != PROTO_VERSION)
        return rd_fail(r, RS_EUNSUPPORTED, "protocol version %llu, expected %d",
                       (unsigned long long)ver, PROTO_VERSION);
    if (n != 7) return rd_fail(r, RS_EPROTO, "frame is an array of %u elements, expected 7", n);
    uint64_t sid;
    if (rd_u64(r, "sid", -1, 0, UINT32_MAX, &sid)) return -1;
    out->sid = (uint32_t)sid;
    if (*type < PROTO_HELLO || *type > PROTO_TYPE_LAST)
        return rd_fail(r, RS_EPROTO, "unknown message type %llu", (unsigned long long)*type);
    return 0;
}

int proto_decode(const void *buf, size_t len, ProtoMsg *out, RsErr *e) {
    RS_ASSERT(out && (buf || len == 0));
    Rd r = {.p = buf, .len = len, .off = 0, .ctx = NULL, .e = e, .code = RS_OK};
    out->type = PROTO_NONE;
    out->session = out->seq = 0;
    out->sid = 0;
    memset(&out->u, 0, sizeof out->u);
    uint64_t type = 0;
    int rc = -1;
    if (dec_header(&r, out, &type)) goto fail;
    r.ctx = proto_type_name((int)type);
    switch ((ProtoType)type) {
    case PROTO_HELLO: rc = dec_hello(&r, &out->u.hello); break;
    case PROTO_HELLO_OK: rc = dec_hello_ok(&r, &out->u.hello_ok); break;
    case PROTO_RESET: rc = dec_tokens(&r, out, 0, 0); break;
    case PROTO_COMMIT_GROW: rc = dec_tokens(&r, out, 1, 1); break;
    case PROTO_APPEND: rc = dec_tokens(&r, out, 1, 0); break;
    case PROTO_POOL: rc = dec_pool(&r, out); break;
    case PROTO_ERROR: rc = dec_error(&r, &out->u.error); break;
    case PROTO_BYE:
    case PROTO_CLOSE: rc = rd_arr_exact(&r, "body", 0); break;
    default: RS_ASSERT(0);
    }
    if (rc) goto fail;
    r.ctx = NULL;
    if (r.off != r.len) {
        rd_fail(&r, RS_EFORMAT, "%zu trailing bytes after the message (frame of %zu bytes)",
                r.len - r.off, r.len);
        goto fail;
    }
    out->type = (ProtoType)type;
    return RS_OK;
fail:
    RS_ASSERT(r.code != RS_OK);
    if (type == PROTO_POOL && out->u.pool.pool) out->u.pool.pool->n = 0;
    memset(&out->u, 0, sizeof out->u);
    out->type = PROTO_NONE;
    return r.code;
}

void proto_msg_clear(ProtoMsg *m) {
    if (!m) return;
    free(m->tok_store);
    free(m->feat_store);
    free(m->pool_own);
    memset(m, 0, sizeof *m);
}

/* ---------------------------------------------------------------- encoder */

static int enc_str(msgpack_packer *pk, const char *s, size_t len) {
    return msgpack_pack_str(pk, len) | msgpack_pack_str_body(pk, s, len);
}

/* Length of a NUL-terminated field of at most max bytes, or -1 if it is not terminated. */
static long fixed_strlen(const char *s, size_t max) {
    const char *z = memchr(s, 0, max + 1);
    return z ? (long)(z - s) : -1;
}

static int enc_tokens(msgpack_packer *pk, const ProtoTokens *t, int min_n, int grow, RsErr *e) {
    if (t->n < min_n || t->n > PROTO_MAX_TOKENS || (t->n > 0 && !t->ids))
        return rs_err(e, RS_EINVAL, "proto: cannot encode a token list of %d entries (%d..%d)",
                      t->n, min_n, PROTO_MAX_TOKENS);
    for (int i = 0; i < t->n; i++)
        if (t->ids[i] < 0)
            return rs_err(e, RS_EINVAL, "proto: cannot encode token %d at index %d", t->ids[i],
                          i);
    size_t fbytes = (size_t)t->n * (size_t)(t->feat_width > 0 ? t->feat_width : 0) * 2;
    int none = t->feat_type == PROTO_FEAT_NONE;
    int typed = t->feat_type == PROTO_FEAT_BF16 || t->feat_type == PROTO_FEAT_F16;
    if (none ? (t->feat_width != 0 || t->feat != NULL)
             : (!typed || t->feat_width < 1 || t->feat_width > PROTO_FEAT_WIDTH_MAX ||
                (t->n > 0 && !t->feat)))
        return rs_err(e, RS_EINVAL, "proto: cannot encode features of type %d, width %d "
                      "(1..%d)", (int)t->feat_type, t->feat_width, PROTO_FEAT_WIDTH_MAX);
    if (fbytes > PROTO_MAX_FEAT_BYTES)
        return rs_err(e, RS_EINVAL, "proto: features of %d tokens x width %d are %zu bytes, over "
                      "the %u-byte limit (PROTO_MAX_FEAT_BYTES)", t->n, t->feat_width, fbytes,
                      PROTO_MAX_FEAT_BYTES);
    if (t->depth < 0 || t->depth > POOL_MAX_DEPTH || (t->depth && !grow))
        return rs_err(e, RS_EINVAL, "proto: cannot encode pool depth %d", t->depth);
    if (t->width < 0 || t->width > POOL_EXPAND || (t->width && !t->depth))
        return rs_err(e, RS_EINVAL, "proto: cannot encode pool width %d (depth %d)", t->width,
                      t->depth);
    int rc = msgpack_pack_array(pk, t->width ? 4 : t->depth ? 3 : 2) |
             msgpack_pack_array(pk, (size_t)t->n);
    for (int i = 0; i < t->n; i++) rc |= msgpack_pack_int32(pk, t->ids[i]);
    if (t->feat_type == PROTO_FEAT_NONE) {
        rc |= msgpack_pack_array(pk, 0);
    } else {
        rc |= msgpack_pack_array(pk, 3) | msgpack_pack_uint32(pk, (uint32_t)t->feat_type);
        rc |= msgpack_pack_uint32(pk, (uint32_t)t->feat_width) | msgpack_pack_bin(pk, fbytes);
        uint8_t buf[512]; /* little-endian on the wire, whatever the host */
        for (size_t i = 0; i < fbytes / 2; i += sizeof buf / 2) {
            size_t k = fbytes / 2 - i < sizeof buf / 2 ? fbytes / 2 - i : sizeof buf / 2;
            for (size_t j = 0; j < k; j++) {
                buf[2 * j] = (uint8_t)t->feat[i + j];
                buf[2 * j + 1] = (uint8_t)(t->feat[i + j] >> 8);
            }
            rc |= msgpack_pack_bin_body(pk, buf, 2 * k);
        }
    }
    if (t->depth) rc |= msgpack_pack_uint32(pk, (uint32_t)t->depth);
    if (t->width) rc |= msgpack_pack_uint32(pk, (uint32_t)t->width);
    return rc ? rs_err(e, RS_ENOMEM, "proto: out of memory encoding %d tokens", t->n) : RS_OK;
}

static int enc_pool(msgpack_packer *pk, const ProtoPool *pp, RsErr *e) {
    const Pool *p = pp->pool;
    if (!p || p->n < 0 || p->n > POOL_MAX || p->n_passes < 0 || p->n_expanded < 0)
        return rs_err(e, RS_EINVAL, "proto: cannot encode a pool of %d candidates (0..%d)",
                      p ? p->n : -1, POOL_MAX);
    size_t n = (size_t)p->n;
    /* The two optional fields only when the drafter reports them: a pool without them
     * encodes exactly as before. */
    int extra = p->draft_rows > 0;
    int rc = msgpack_pack_array(pk, extra ? 11 : 9) | msgpack_pack_uint32(pk, (uint32_t)n);
    rc |= msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++) rc |= msgpack_pack_int32(pk, p->token[i]);
    rc |= msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++) rc |= msgpack_pack_int32(pk, p->parent[i]);
    rc |= msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++) rc |= msgpack_pack_float(pk, p->logq[i]);
    rc |= msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++) rc |= msgpack_pack_uint8(pk, p->depth[i]);
    rc |= msgpack_pack_uint64(pk, p->draft_ns);
    rc |= msgpack_pack_uint64(pk, pp->commit_pass_ns);
    rc |= msgpack_pack_uint32(pk, (uint32_t)p->n_passes);
    rc |= msgpack_pack_uint32(pk, (uint32_t)p->n_expanded);
    if (extra) {
        rc |= msgpack_pack_uint64(pk, p->draft_host_ns);
        rc |= msgpack_pack_uint32(pk, (uint32_t)p->draft_rows);
    }
    return rc ? rs_err(e, RS_ENOMEM, "proto: out of memory encoding a pool") : RS_OK;
}

static int enc_body(msgpack_packer *pk, const ProtoMsg *m, RsErr *e) {
    int rc = 0;
    long l1, l2;
    switch (m->type) {
    case PROTO_HELLO: {
        const ProtoHello *h = &m->u.hello;
        if ((l1 = fixed_strlen(h->fingerprint, PROTO_FP_MAX)) < 0 || h->vocab_size > INT32_MAX)
            return rs_err(e, RS_EINVAL, "proto: HELLO fingerprint unterminated or vocab %u",
                          h->vocab_size);
        rc |= msgpack_pack_array(pk, 5) | enc_str(pk, h->fingerprint, (size_t)l1);
        rc |= msgpack_pack_uint64(pk, h->tokenizer_hash) | msgpack_pack_uint32(pk, h->vocab_size);
        rc |= msgpack_pack_uint32(pk, h->caps) | msgpack_pack_array(pk, 3);
        rc |= msgpack_pack_uint32(pk, h->topk) | msgpack_pack_uint32(pk, h->depth) |
              msgpack_pack_uint32(pk, h->expand);
        break;
    }
    case PROTO_HELLO_OK: {
        const ProtoHelloOk *h = &m->u.hello_ok;
        l1 = fixed_strlen(h->fingerprint, PROTO_FP_MAX);
        l2 = fixed_strlen(h->name, PROTO_NAME_MAX);
        if (l1 < 0 || l2 < 0 || h->vocab_size > INT32_MAX)
            return rs_err(e, RS_EINVAL,
                          "proto: HELLO_OK fingerprint/name unterminated or vocab %u",
                          h->vocab_size);
        if (h->n_feat_layers < 0 || h->n_feat_layers > PROTO_FEAT_LAYERS_MAX ||
            (h->n_feat_layers > 0) != ((h->caps & PROTO_CAP_FEATURES) != 0))
            return rs_err(e, RS_EINVAL, "proto: HELLO_OK with %d feature layers and "
                          "capabilities 0x%x", h->n_feat_layers, h->caps);
        rc |= msgpack_pack_array(pk, 6) | enc_str(pk, h->fingerprint, (size_t)l1);
        rc |= msgpack_pack_uint64(pk, h->tokenizer_hash) | msgpack_pack_uint32(pk, h->vocab_size);
        rc |= msgpack_pack_uint32(pk, h->caps) | enc_str(pk, h->name, (size_t)l2);
        rc |= msgpack_pack_array(pk, (size_t)h->n_feat_layers);
        for (int i = 0; i < h->n_feat_layers; i++) {
            if (h->feat_layers[i] < 0 || h->feat_layers[i] > 65535)
                return rs_err(e, RS_EINVAL, "proto: feature layer %d", h->feat_layers[i]);
            rc |= msgpack_pack_uint32(pk, (uint32_t)h->feat_layers[i]);
        }
        break;
    }
    case PROTO_RESET: return enc_tokens(pk, &m->u.tokens, 0, 0, e);
    case PROTO_COMMIT_GROW: return enc_tokens(pk, &m->u.tokens, 1, 1, e);
    case PROTO_APPEND: return enc_tokens(pk, &m->u.tokens, 1, 0, e);
    case PROTO_POOL: return enc_pool(pk, &m->u.pool, e);
    case PROTO_ERROR:
        if ((l1 = fixed_strlen(m->u.error.message, PROTO_MSG_MAX)) < 0)
            return rs_err(e, RS_EINVAL, "proto: ERROR message unterminated");
        rc |= msgpack_pack_array(pk, 2) | msgpack_pack_int32(pk, m->u.error.code);
        rc |= enc_str(pk, m->u.error.message, (size_t)l1);
        break;
    case PROTO_BYE:
    case PROTO_CLOSE: rc |= msgpack_pack_array(pk, 0); break;
    default: return rs_err(e, RS_EINVAL, "proto: cannot encode message type %d", (int)m->type);
    }
    return rc ? rs_err(e, RS_ENOMEM, "proto: out of memory encoding %s", proto_type_name(m->type))
              : RS_OK;
}

int proto_encode(const ProtoMsg *m, msgpack_sbuffer *out, RsErr *e) {
    RS_ASSERT(m && out);
    size_t start = out->size;
    msgpack_packer pk;
    msgpack_packer_init(&pk, out, msgpack_sbuffer_write);
    if (m->type < PROTO_HELLO || m->type > PROTO_TYPE_LAST)
        return rs_err(e, RS_EINVAL, "proto: cannot encode message type %d", (int)m->type);
    int rc = msgpack_pack_array(&pk, 7) | enc_str(&pk, PROTO_MAGIC, 4);
    rc |= msgpack_pack_uint32(&pk, PROTO_VERSION) | msgpack_pack_uint32(&pk, (uint32_t)m->type);
    rc |= msgpack_pack_uint64(&pk, m->session) | msgpack_pack_uint64(&pk, m->seq);
    rc |= msgpack_pack_uint32(&pk, m->sid);
    int st = rc ? rs_err(e, RS_ENOMEM, "proto: out of memory encoding a header")
                : enc_body(&pk, m, e);
    if (st != RS_OK) out->size = start; /* leave no half message behind */
    return st;
}

/* ---------------------------------------------------------------- helpers */

int proto_msg_equal(const ProtoMsg *a, const ProtoMsg *b) {
    if (a->type != b->type || a->session != b->session || a->seq != b->seq || a->sid != b->sid)
        return 0;
    switch (a->type) {
    case PROTO_HELLO: {
        const ProtoHello *x = &a->u.hello, *y = &b->u.hello;
        return strcmp(x->fingerprint, y->fingerprint) == 0 &&
               x->tokenizer_hash == y->tokenizer_hash && x->vocab_size == y->vocab_size &&
               x->caps == y->caps && x->topk == y->topk && x->depth == y->depth &&
               x->expand == y->expand;
    }
    case PROTO_HELLO_OK: {
        const ProtoHelloOk *x = &a->u.hello_ok, *y = &b->u.hello_ok;
        return strcmp(x->fingerprint, y->fingerprint) == 0 &&
               x->tokenizer_hash == y->tokenizer_hash && x->vocab_size == y->vocab_size &&
               x->caps == y->caps && strcmp(x->name, y->name) == 0 &&
               x->n_feat_layers == y->n_feat_layers &&
               memcmp(x->feat_layers, y->feat_layers,
                      (size_t)x->n_feat_layers * sizeof x->feat_layers[0]) == 0;
    }
    case PROTO_RESET:
    case PROTO_COMMIT_GROW:
    case PROTO_APPEND: {
        const ProtoTokens *x = &a->u.tokens, *y = &b->u.tokens;
        size_t nf = (size_t)x->n * (size_t)x->feat_width;
        return x->n == y->n &&
               (x->n == 0 || memcmp(x->ids, y->ids, (size_t)x->n * sizeof(int32_t)) == 0) &&
               x->feat_type == y->feat_type && x->feat_width == y->feat_width &&
               x->depth == y->depth && x->width == y->width && (nf == 0 || memcmp(x->feat, y->feat, nf * sizeof(uint16_t)) == 0);
    }
    case PROTO_POOL: {
        const Pool *x = a->u.pool.pool, *y = b->u.pool.pool;
        if (!x || !y) return x == y;
        size_t n = (size_t)x->n;
        return x->n == y->n && a->u.pool.commit_pass_ns == b->u.pool.commit_pass_ns &&
               x->draft_ns == y->draft_ns && x->n_passes == y->n_passes &&
               x->draft_host_ns == y->draft_host_ns && x->draft_rows == y->draft_rows &&
               x->n_expanded == y->n_expanded &&
               memcmp(x->token, y->token, n * sizeof x->token[0]) == 0 &&
               memcmp(x->parent, y->parent, n * sizeof x->parent[0]) == 0 &&
               memcmp(x->logq, y->logq, n * sizeof x->logq[0]) == 0 &&
               memcmp(x->depth, y->depth, n * sizeof x->depth[0]) == 0;
    }
    case PROTO_ERROR:
        return a->u.error.code == b->u.error.code &&
               strcmp(a->u.error.message, b->u.error.message) == 0;
    default: return 1;
    }
}

void proto_error_reply(ProtoMsg *out, const ProtoMsg *req, const RsErr *cause) {
    uint64_t session = req ? req->session : 0, seq = req ? req->seq : 0;
    int code = cause && cause->code != RS_OK ? cause->code : RS_EPROTO;
    char msg[PROTO_MSG_MAX + 1];
    snprintf(msg, sizeof msg, "%.*s", PROTO_MSG_MAX,
             cause && cause->msg[0] ? cause->msg : "malformed message");
    out->type = PROTO_ERROR;
    out->session = session;
    out->seq = seq;
    out->sid = req ? req->sid : 0;
    memset(&out->u, 0, sizeof out->u);
    out->u.error.code = code;
    memcpy(out->u.error.message, msg, sizeof msg);
}

void proto_f32_to_bf16(const float *src, uint16_t *dst, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &src[i], 4);
        if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it NaN (quiet), not Inf */
            dst[i] = (uint16_t)((u >> 16) | 0x40);
        else
            dst[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
    }
}

void proto_feat_to_f32(ProtoFeatType t, const uint16_t *src, float *dst, size_t n) {
    RS_ASSERT(t == PROTO_FEAT_BF16 || t == PROTO_FEAT_F16);
    for (size_t i = 0; i < n; i++)
        dst[i] = t == PROTO_FEAT_BF16 ? quant_bf16_to_f32(src[i]) : quant_f16_to_f32(src[i]);
}

static void free_sbuf_data(void *data, void *hint) {
    (void)hint;
    free(data);
}

/* ---- the context ---- */

#if defined(__linux__) && defined(SYS_sched_setattr) && defined(SYS_sched_getattr)
/* sched_setattr(2)'s attributes: sched_runtime is a fair task's slice. */
typedef struct sched_attr SchedAttr;

/* Sets the calling thread's slice to `ns` (0: the default); the slice it had in *old. */
static int slice_set(uint64_t ns, SchedAttr *old) {
    if (syscall(SYS_sched_getattr, 0, old, sizeof *old, 0) != 0) return -1;
    SchedAttr a = *old;
    a.size = sizeof a;
    a.sched_runtime = ns;
    return (int)syscall(SYS_sched_setattr, 0, &a, 0);
}

static void slice_restore(const SchedAttr *old) {
    SchedAttr a = *old;
    a.size = sizeof a;
    (void)syscall(SYS_sched_setattr, 0, &a, 0);
}
#else
typedef int SchedAttr;
static int slice_set(uint64_t ns, SchedAttr *old) {
    (void)ns;
    (void)old;
    return -1;
}
static void slice_restore(const SchedAttr *old) { (void)old; }
#endif

/* The shortest slice Linux grants (100 us). */
#define IO_SLICE_NS 100000

void *proto_ctx_new(void) {
    SchedAttr old;
    int set = slice_set(IO_SLICE_NS, &old) == 0;
    void *ctx = zmq_ctx_new();
    /* the I/O threads start with a context's first socket and take the slice then */
    void *probe = ctx ? zmq_socket(ctx, ZMQ_PAIR) : NULL;
    if (probe) zmq_close(probe);
    if (set) slice_restore(&old);
    return ctx;
}

/* ---- sending and receiving ---- */

int proto_send(void *sock, const ProtoMsg *m, RsErr *e) {
    RS_ASSERT(sock && m);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    int rc = proto_encode(m, &sb, e);
    if (rc != RS_OK) {
        msgpack_sbuffer_destroy(&sb);
        return rc;
    }
    /* Zero-copy: ZeroMQ frees the encoding when it has been sent. */
    zmq_msg_t msg;
    size_t size = sb.size;
    char *data = msgpack_sbuffer_release(&sb);
    if (zmq_msg_init_data(&msg, data, size, free_sbuf_data, NULL) != 0) {
        free(data);
        return rs_err(e, RS_EIO, "proto: zmq_msg_init_data: %s", zmq_strerror(zmq_errno()));
    }
    for (;;) {
        if (zmq_msg_send(&msg, sock, 0) >= 0) return RS_OK;
        int err = zmq_errno();
        if (err == EINTR) continue;
        zmq_msg_close(&msg);
        if (err == EAGAIN)
            return rs_err(e, RS_ETIMEOUT, "proto: sending %s timed out (ZMQ_SNDTIMEO)",
                          proto_type_name(m->type));
        return rs_err(e, RS_EIO, "proto: sending %s: %s", proto_type_name(m->type),
                      zmq_strerror(err));
    }
}

int proto_recv(void *sock, ProtoMsg *out, int timeout_ms, RsErr *e) {
    RS_ASSERT(sock && out);
    uint64_t deadline = timeout_ms < 0 ? 0 : rs_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        long wait = -1;
        if (timeout_ms >= 0) {
            uint64_t now = rs_now_ns();
            wait = now >= deadline ? 0 : (long)((deadline - now + 999999) / 1000000);
        }
        zmq_pollitem_t it = {.socket = sock, .events = ZMQ_POLLIN};
        int np = zmq_poll(&it, 1, wait);
        if (np < 0) {
            if (zmq_errno() == EINTR) continue;
            return rs_err(e, RS_EIO, "proto: zmq_poll: %s", zmq_strerror(zmq_errno()));
        }
        if (np == 0) {
            if (timeout_ms >= 0 && rs_now_ns() >= deadline)
                return rs_err(e, RS_ETIMEOUT, "proto: no message within %d ms", timeout_ms);
            continue;
        }
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, sock, ZMQ_DONTWAIT) < 0) {
            int err = zmq_errno();
            zmq_msg_close(&msg);
            if (err == EAGAIN || err == EINTR) continue;
            return rs_err(e, RS_EIO, "proto: zmq_msg_recv: %s", zmq_strerror(err));
        }
        if (zmq_msg_more(&msg)) {
            /* Parts of one message arrive together: drain them so the next recv is clean. */
            int parts = 1;
            do {
                zmq_msg_close(&msg);
                zmq_msg_init(&msg);
                if (zmq_msg_recv(&msg, sock, ZMQ_DONTWAIT) < 0) break;
                parts++;
            } while (zmq_msg_more(&msg));
            zmq_msg_close(&msg);
            out->type = PROTO_NONE;
            out->session = out->seq = 0;
            return rs_err(e, RS_EPROTO,
                          "proto: multi-part message (%d frames), expected one frame", parts);
        }
        int rc = proto_decode(zmq_msg_data(&msg), zmq_msg_size(&msg), out, e);
        zmq_msg_close(&msg);
        return rc;
    }
}

int proto_feat_chunk_rows(int width, size_t max_bytes) {
    RS_ASSERT(width >= 1 && max_bytes >= 2);
    size_t rows = max_bytes / (2 * (size_t)width);
    if (rows > PROTO_MAX_TOKENS) rows = PROTO_MAX_TOKENS;
    return rows ? (int)rows : 1;
}
