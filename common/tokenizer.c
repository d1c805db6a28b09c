/* Byte-level BPE tokenizer (GPT-2 byte<->unicode alphabet, merges applied by rank) built
 * either from GGUF metadata (tokenizer.ggml.*) or from a Hugging Face tokenizer.json.
 * The pipeline follows HF `tokenizers`: added/special tokens are split out of the raw text
 * first (leftmost-longest), then each remaining segment is normalized (NFC etc. through
 * utf8proc), pre-tokenized (Split/Digits/ByteLevel regexes through PCRE2 with UTF+UCP), and
 * each piece is BPE-merged. Tokens are stored as their raw bytes, so decoding is a copy and
 * the vocabulary lookup works on raw bytes (the byte-level spelling is only a file format). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer.h"
#include "model.h"
#include "model_internal.h"
#include <cjson/cJSON.h>
#include <limits.h>
#include <pcre2.h>
#include <string.h>
#include <utf8proc.h>

/* Pre-tokenizer regexes. GPT-2's is what HF's ByteLevel(use_regex=true) uses; the others
 * are the Split patterns transformers installs for a GGUF's tokenizer.ggml.pre. */
#define RE_GPT2 \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define RE_LLAMA3                                                                          \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"               \
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                           \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"                    \
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN35                                                                          \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}"            \
    "| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_GPT4O                                                                           \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"                                                        \
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"                                                        \
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

enum { TOKF_ADDED = 1, TOKF_SPECIAL = 2, TOKF_EOG = 4 };
enum { PRE_SPLIT = 1, PRE_PREFIX_SPACE = 2 };
enum { BEH_ISOLATED, BEH_REMOVED, BEH_MERGED_PREV, BEH_MERGED_NEXT, BEH_CONTIGUOUS };
#define MAX_PRE 16
#define MAX_NORM 8
#define MAX_VOCAB (1 << 24) /* ids beyond this are a malformed file, not a big model */

typedef struct {
    int kind;
    pcre2_code *re;
    int behavior, invert;
} PreStep;

struct Tokenizer {
    int n_vocab;
    char *bytes;       // all tokens' raw bytes, concatenated
    uint32_t *off;     // (n_vocab + 1) offsets into bytes
    uint8_t *flags;    // (n_vocab) TOKF_*
    int32_t *vmap;     // open-addressing raw bytes -> id, -1 empty
    uint32_t vmap_cap; // power of two
    uint64_t *mkey;    // merges: (a << 32 | b) -> rank, result; key ~0 = empty
    int32_t *mrank, *mres;
    uint32_t mcap;
    int n_merges;
    int byte_tok[256]; /* id of each single byte, -1 if absent */
    int *added;        /* added-token ids sorted by first byte */
    int n_added;
    int added_start[257];
    int norm[MAX_NORM]; /* utf8proc option sets applied in order */
    int n_norm;
    PreStep pre[MAX_PRE];
    int n_pre;
    int ignore_merges;
    int bos_id, eos_id, add_bos;
    uint64_t hash;
};

/* ---- GPT-2 byte <-> unicode alphabet ---- */

static int g_byte_cp[256];  /* byte -> code point */
static int g_cp_byte[324];  /* code point -> byte, -1 if outside the alphabet */

static void alphabet_init(void) {
    static int done = 0;
    if (done) return;
    for (int i = 0; i < 324; i++) g_cp_byte[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        g_byte_cp[b] = printable ? b : 256 + n++;
        g_cp_byte[g_byte_cp[b]] = b;
    }
    done = 1;
}

/* Byte-level spelling -> raw bytes in out (capacity >= len). Returns the byte count, or -1
 * if a character lies outside the alphabet (the string is then kept as it is, like HF). */
static int bytelevel_decode(const char *s, size_t len, char *out) {
    size_t i = 0;
    int n = 0;
    while (i < len) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(len - i), &cp);
        if (k <= 0 || cp < 0 || cp >= 324 || g_cp_byte[cp] < 0) return -1;
        out[n++] = (char)g_cp_byte[cp];
        i += (size_t)k;
    }
    return n;
}

/* ---- hashing ---- */

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return h;
}
#define FNV_INIT 14695981039346656037ull

static uint32_t pow2_at_least(uint32_t n) {
    uint32_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

static const char *tok_str(const Tokenizer *tok, int id, size_t *len) {
    *len = tok->off[id + 1] - tok->off[id];
    return tok->bytes + tok->off[id];
}

static int vmap_find(const Tokenizer *tok, const char *s, size_t len) {
    uint32_t mask = tok->vmap_cap - 1, h = (uint32_t)fnv(FNV_INIT, s, len) & mask;
    for (;;) {
        int id = tok->vmap[h];
        if (id < 0) return -1;
        size_t l;
        const char *p = tok_str(tok, id, &l);
        if (l == len && memcmp(p, s, len) == 0) return id;
        h = (h + 1) & mask;
    }
}

/* Inserts id under its raw bytes. A regular token wins over an added one with the same
 * bytes, so BPE results (and ignore_merges look-ups) resolve to the model's own entry. */
static void vmap_insert(Tokenizer *tok, int id) {
    size_t len;
    const char *s = tok_str(tok, id, &len);
    if (len == 0) return;
    uint32_t mask = tok->vmap_cap - 1, h = (uint32_t)fnv(FNV_INIT, s, len) & mask;
    for (;;) {
        int cur = tok->vmap[h];
        if (cur < 0) {
            tok->vmap[h] = id;
            return;
        }
        size_t l;
        const char *p = tok_str(tok, cur, &l);
        if (l == len && memcmp(p, s, len) == 0) {
            if ((tok->flags[cur] & TOKF_ADDED) && !(tok->flags[id] & TOKF_ADDED)) tok->vmap[h] = id;
            return;
        }
        h = (h + 1) & mask;
    }
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static int merge_find(const Tokenizer *tok, int a, int b, int *res) {
    if (!tok->mcap) return INT_MAX;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint32_t mask = tok->mcap - 1, h = (uint32_t)mix64(key) & mask;
    for (;;) {
        if (tok->mkey[h] == ~0ull) return INT_MAX;
        if (tok->mkey[h] == key) {
            *res = tok->mres[h];
            return tok->mrank[h];
        }
        h = (h + 1) & mask;
    }
}

/* Adds a merge unless the pair is already known (HF keeps the first, lowest rank). */
static void merge_insert(Tokenizer *tok, int a, int b, int rank, int res) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint32_t mask = tok->mcap - 1, h = (uint32_t)mix64(key) & mask;
    while (tok->mkey[h] != ~0ull) {
        if (tok->mkey[h] == key) return;
        h = (h + 1) & mask;
    }
    tok->mkey[h] = key;
    tok->mrank[h] = rank;
    tok->mres[h] = res;
}

/* ---- construction helpers ---- */

/* Token table under construction: strings in the file's spelling, resolved to raw bytes. */
typedef struct {
    int n;
    char **raw;   /* malloc'd raw bytes per id, NULL for a gap */
    size_t *len;
    uint8_t *flags;
} TokTable;

static void toktable_init(TokTable *tt, int n) {
    tt->n = n;
    tt->raw = rs_xcalloc((size_t)n, sizeof(char *));
    tt->len = rs_xcalloc((size_t)n, sizeof(size_t));
    tt->flags = rs_xcalloc((size_t)n, 1);
}

static void toktable_free(TokTable *tt) {
    if (tt->raw)
        for (int i = 0; i < tt->n; i++) free(tt->raw[i]);
    free(tt->raw);
    free(tt->len);
    free(tt->flags);
    memset(tt, 0, sizeof *tt);
}

/* Sets entry id from its spelling: byte-level decoded when every character is in the
 * alphabet (and the token is not an added one), else the UTF-8 text itself. */
static void toktable_set(TokTable *tt, int id, const char *s, size_t len, int added) {
    free(tt->raw[id]);
    char *buf = rs_xmalloc(len + 1);
    int n = added ? -1 : bytelevel_decode(s, len, buf);
    if (n < 0) {
        memcpy(buf, s, len);
        n = (int)len;
    }
    buf[n] = 0;
    tt->raw[id] = buf;
    tt->len[id] = (size_t)n;
}

static int cmp_added(const void *a, const void *b, void *ctx);

static Tokenizer *tokenizer_from_table(TokTable *tt) {
    Tokenizer *tok = rs_xcalloc(1, sizeof(Tokenizer));
    tok->n_vocab = tt->n;
    size_t total = 0;
    for (int i = 0; i < tt->n; i++) total += tt->len[i];
    tok->bytes = rs_xmalloc(total + 1);
    tok->off = rs_xmalloc(((size_t)tt->n + 1) * sizeof(uint32_t));
    tok->flags = rs_xcalloc((size_t)tt->n, 1);
    size_t o = 0;
    uint64_t h = FNV_INIT;
    for (int i = 0; i < tt->n; i++) {
        tok->off[i] = (uint32_t)o;
        if (tt->len[i]) memcpy(tok->bytes + o, tt->raw[i], tt->len[i]);
        o += tt->len[i];
        tok->flags[i] = tt->flags[i];
        uint32_t l = (uint32_t)tt->len[i];
        h = fnv(h, &l, sizeof l);
        h = fnv(h, tok->bytes + tok->off[i], l);
    }
    tok->off[tt->n] = (uint32_t)o;
    tok->hash = h;
    tok->vmap_cap = pow2_at_least((uint32_t)tt->n * 2u + 16u);
    tok->vmap = rs_xmalloc(tok->vmap_cap * sizeof(int32_t));
    memset(tok->vmap, 0xff, tok->vmap_cap * sizeof(int32_t));
    for (int i = 0; i < tt->n; i++) vmap_insert(tok, i);
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        tok->byte_tok[b] = vmap_find(tok, &c, 1);
    }
    /* Added tokens, bucketed by first byte, longest first inside a bucket. */
    int na = 0;
    for (int i = 0; i < tt->n; i++)
        if ((tt->flags[i] & TOKF_ADDED) && tt->len[i] > 0) na++;
    tok->added = rs_xcalloc((size_t)na + 1, sizeof(int));
    for (int i = 0; i < tt->n; i++)
        if ((tt->flags[i] & TOKF_ADDED) && tt->len[i] > 0) tok->added[tok->n_added++] = i;
    qsort_r(tok->added, (size_t)tok->n_added, sizeof(int), cmp_added, tok);
    int k = 0;
    for (int b = 0; b <= 256; b++) {
        while (k < tok->n_added && (uint8_t)tok->bytes[tok->off[tok->added[k]]] < b) k++;
        tok->added_start[b] = k;
    }
    tok->bos_id = tok->eos_id = -1;
    return tok;
}

static int cmp_added(const void *a, const void *b, void *ctx) {
    const Tokenizer *tok = ctx;
    int ia = *(const int *)a, ib = *(const int *)b;
    uint8_t ca = (uint8_t)tok->bytes[tok->off[ia]], cb = (uint8_t)tok->bytes[tok->off[ib]];
    if (ca != cb) return ca < cb ? -1 : 1;
    uint32_t la = tok->off[ia + 1] - tok->off[ia], lb = tok->off[ib + 1] - tok->off[ib];
    if (la != lb) return la > lb ? -1 : 1;
    return ia < ib ? -1 : ia > ib;
}

/* Adds merge `rank` given its two parts in the file's spelling. */
static int add_merge(Tokenizer *tok, const char *a, size_t la, const char *b, size_t lb, int rank,
                     const char *src, RsErr *e) {
    char *buf = rs_xmalloc(la + lb + 1);
    int ra = bytelevel_decode(a, la, buf);
    if (ra < 0) {
        memcpy(buf, a, la);
        ra = (int)la;
    }
    int ida = vmap_find(tok, buf, (size_t)ra);
    int rb = bytelevel_decode(b, lb, buf + ra);
    if (rb < 0) {
        memcpy(buf + ra, b, lb);
        rb = (int)lb;
    }
    int idb = vmap_find(tok, buf + ra, (size_t)rb);
    int idm = vmap_find(tok, buf, (size_t)(ra + rb));
    free(buf);
    if (ida < 0 || idb < 0 || idm < 0)
        return rs_err(e, RS_EFORMAT, "%s: merge %d '%.*s %.*s' uses a token missing from the vocabulary",
                      src, rank, (int)la, a, (int)lb, b);
    merge_insert(tok, ida, idb, rank, idm);
    uint32_t p[2] = {(uint32_t)ida, (uint32_t)idb};
    tok->hash = fnv(tok->hash, p, sizeof p);
    tok->n_merges++;
    return RS_OK;
}

static void merges_alloc(Tokenizer *tok, size_t n) {
    tok->mcap = pow2_at_least((uint32_t)(n * 2 + 16));
    tok->mkey = rs_xmalloc(tok->mcap * sizeof(uint64_t));
    memset(tok->mkey, 0xff, tok->mcap * sizeof(uint64_t));
    tok->mrank = rs_xmalloc(tok->mcap * sizeof(int32_t));
    tok->mres = rs_xmalloc(tok->mcap * sizeof(int32_t));
}

static int add_regex_step(Tokenizer *tok, const char *pattern, size_t plen, int literal, int behavior,
                          int invert, const char *src, RsErr *e) {
    if (tok->n_pre >= MAX_PRE)
        return rs_err(e, RS_EUNSUPPORTED, "%s: more than %d pre-tokenizer steps", src, MAX_PRE);
    int errc;
    PCRE2_SIZE erroff;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, plen, opts, &errc, &erroff, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(errc, msg, sizeof msg);
        return rs_err(e, RS_EFORMAT, "%s: pre-tokenizer regex '%.*s' does not compile at offset %zu: %s",
                      src, (int)plen, pattern, (size_t)erroff, (char *)msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* optional speed-up; interpreter otherwise */
    PreStep *p = &tok->pre[tok->n_pre++];
    p->kind = PRE_SPLIT;
    p->re = re;
    p->behavior = behavior;
    p->invert = invert;
    return RS_OK;
}

/* Marks end-of-generation tokens: EOS plus the end-of-turn markers the supported families use. */
static void mark_eog(Tokenizer *tok) {
    static const char *names[] = {"<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end_of_text|>",
                                  "<|eom_id|>", "<end_of_turn>", "</s>"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        int id = vmap_find(tok, names[i], strlen(names[i]));
        if (id >= 0 && (tok->flags[id] & TOKF_ADDED)) tok->flags[id] |= TOKF_EOG;
        /* an added token that shares its bytes with a regular one sits behind it in vmap */
        for (int k = 0; k < tok->n_added; k++) {
            size_t l;
            const char *s = tok_str(tok, tok->added[k], &l);
            if (l == strlen(names[i]) && memcmp(s, names[i], l) == 0) tok->flags[tok->added[k]] |= TOKF_EOG;
        }
    }
    if (tok->eos_id >= 0 && tok->eos_id < tok->n_vocab) tok->flags[tok->eos_id] |= TOKF_EOG;
}

/* ---- GGUF source ---- */

/* The model kind and the array lengths, checked before anything is allocated for them. */
static int gguf_tok_check(const GGUFFile *g, const char *src, size_t *n, size_t *nm, int *have_tt,
                          RsErr *e) {
    const char *s;
    size_t len, ntt = 0;
    if (gguf_get_str(g, "tokenizer.ggml.model", &s, &len) != 0)
        return rs_err(e, RS_EFORMAT, "%s: no tokenizer.ggml.model in the GGUF metadata", src);
    if (!(len == 4 && memcmp(s, "gpt2", 4) == 0))
        return rs_err(e, RS_EUNSUPPORTED,
                      "%s: tokenizer.ggml.model '%.*s' is not supported (only 'gpt2' byte-level BPE)",
                      src, (int)len, s);
    if (gguf_get_arr_n(g, "tokenizer.ggml.tokens", n) != 0 || *n == 0)
        return rs_err(e, RS_EFORMAT, "%s: no tokenizer.ggml.tokens array", src);
    if (*n > MAX_VOCAB)
        return rs_err(e, RS_EFORMAT, "%s: tokenizer.ggml.tokens has %zu entries (max %d)", src, *n, MAX_VOCAB);
    if (gguf_get_arr_n(g, "tokenizer.ggml.merges", nm) != 0)
        return rs_err(e, RS_EFORMAT, "%s: no tokenizer.ggml.merges array", src);
    *have_tt = gguf_get_arr_n(g, "tokenizer.ggml.token_type", &ntt) == 0;
    if (*have_tt && ntt != *n)
        return rs_err(e, RS_EFORMAT, "%s: tokenizer.ggml.token_type has %zu entries, tokens %zu", src,
                      ntt, *n);
    return RS_OK;
}

/* The vocabulary with its added/special flags; on failure tt is freed. */
static int gguf_tok_table(const GGUFFile *g, const char *src, size_t n, int have_tt, TokTable *tt,
                          RsErr *e) {
    const char *s;
    size_t len;
    toktable_init(tt, (int)n);
    for (size_t i = 0; i < n; i++) {
        if (gguf_arr_str(g, "tokenizer.ggml.tokens", i, &s, &len) != 0) {
            toktable_free(tt);
            return rs_err(e, RS_EFORMAT, "%s: cannot read tokenizer.ggml.tokens[%zu]", src, i);
        }
        int type = 1;
        double v;
        if (have_tt && gguf_arr_num(g, "tokenizer.ggml.token_type", i, &v) == 0) type = (int)v;
        /* Like transformers' converter: control tokens (3) become special added tokens when
         * spelled in the byte alphabet; user-defined ones (4) become plain added tokens. */
        int added = 0;
        if (type == 3 || type == 4) {
            char *tmp = rs_xmalloc(len + 1);
            int in_alpha = bytelevel_decode(s, len, tmp) >= 0;
            free(tmp);
            if (type == 4 || in_alpha) added = 1;
            tt->flags[i] = (uint8_t)(added ? (TOKF_ADDED | (type == 3 ? TOKF_SPECIAL : 0)) : 0);
        }
        toktable_set(tt, (int)i, s, len, 0);
    }
    return RS_OK;
}

/* The BPE merges, each "a b" in rank order. */
static int gguf_tok_merges(const GGUFFile *g, const char *src, Tokenizer *tok, size_t nm, RsErr *e) {
    const char *s;
    size_t len;
    merges_alloc(tok, nm);
    for (size_t i = 0; i < nm; i++) {
        if (gguf_arr_str(g, "tokenizer.ggml.merges", i, &s, &len) != 0)
            return rs_err(e, RS_EFORMAT, "%s: cannot read tokenizer.ggml.merges[%zu]", src, i);
        const char *sp = memchr(s, ' ', len);
        if (!sp || sp == s || sp == s + len - 1)
            return rs_err(e, RS_EFORMAT, "%s: merge %zu '%.*s' is not 'a b'", src, i, (int)len, s);
        int rc = add_merge(tok, s, (size_t)(sp - s), sp + 1, len - (size_t)(sp - s) - 1, (int)i, src, e);
        if (rc) return rc;
    }
    return RS_OK;
}

/* Pre-tokenizer: the regex transformers picks for tokenizer.ggml.pre; anything else
 * (including "smollm", "gpt2", "default") gets GPT-2's ByteLevel regex, as in HF. */
static const char *gguf_tok_pre_regex(const GGUFFile *g) {
    const char *s, *re = RE_GPT2;
    size_t len;
    if (gguf_get_str(g, "tokenizer.ggml.pre", &s, &len) == 0) {
        static const struct { const char *name, *re; } pre[] = {
            {"llama3", RE_LLAMA3},     {"llama-v3", RE_LLAMA3},   {"llama-bpe", RE_LLAMA3},
            {"falcon3", RE_LLAMA3},    {"smaug-bpe", RE_LLAMA3},  {"dbrx", RE_LLAMA3},
            {"qwen2", RE_QWEN2},       {"deepseek-r1-qwen", RE_QWEN2}, {"qwen35", RE_QWEN35},
            {"gpt-4o", RE_GPT4O},      {"llama4", RE_GPT4O},
        };
        for (size_t i = 0; i < sizeof pre / sizeof pre[0]; i++)
            if (strlen(pre[i].name) == len && memcmp(pre[i].name, s, len) == 0) re = pre[i].re;
    }
    return re;
}

/* BOS/EOS/EOT ids; out-of-range ids from the file are ignored rather than trusted. */
static void gguf_tok_special_ids(const GGUFFile *g, Tokenizer *tok) {
    long long v;
    if (gguf_get_int(g, "tokenizer.ggml.bos_token_id", &v) == 0 && v >= 0 && v < tok->n_vocab)
        tok->bos_id = (int)v;
    if (gguf_get_int(g, "tokenizer.ggml.eos_token_id", &v) == 0 && v >= 0 && v < tok->n_vocab)
        tok->eos_id = (int)v;
    if (gguf_get_int(g, "tokenizer.ggml.add_bos_token", &v) == 0) tok->add_bos = v != 0 && tok->bos_id >= 0;
    if (gguf_get_int(g, "tokenizer.ggml.eot_token_id", &v) == 0 && v >= 0 && v < tok->n_vocab)
        tok->flags[v] |= TOKF_EOG;
    mark_eog(tok);
}

static int load_gguf(const GGUFFile *g, const char *src, Tokenizer **out, RsErr *e) {
    size_t n = 0, nm = 0;
    int have_tt = 0;
    int rc = gguf_tok_check(g, src, &n, &nm, &have_tt, e);
    if (rc) return rc;
    TokTable tt;
    if ((rc = gguf_tok_table(g, src, n, have_tt, &tt, e))) return rc;
    Tokenizer *tok = tokenizer_from_table(&tt);
    toktable_free(&tt);
    rc = gguf_tok_merges(g, src, tok, nm, e);
    if (!rc) {
        const char *re = gguf_tok_pre_regex(g);
        rc = add_regex_step(tok, re, strlen(re), 0, BEH_ISOLATED, 0, src, e);
    }
    if (rc) {
        tokenizer_destroy(&tok);
        return rc;
    }
    gguf_tok_special_ids(g, tok);
    *out = tok;
    return RS_OK;
}

/* ---- tokenizer.json source ---- */

static const char *jstr(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int jbool(const cJSON *o, const char *key, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
    return dflt;
}

static int parse_normalizer(Tokenizer *tok, const cJSON *n, const char *src, RsErr *e) {
    if (!n || cJSON_IsNull(n)) return RS_OK;
    const char *type = jstr(n, "type");
    if (!type) return rs_err(e, RS_EFORMAT, "%s: normalizer without a type", src);
    if (!strcmp(type, "Sequence")) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(n, "normalizers"), *it;
        if (!cJSON_IsArray(arr)) return rs_err(e, RS_EFORMAT, "%s: Sequence normalizer without a list", src);
        cJSON_ArrayForEach(it, arr) {
            int rc = parse_normalizer(tok, it, src, e);
            if (rc) return rc;
        }
        return RS_OK;
    }
    int opt;
    if (!strcmp(type, "NFC")) opt = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    else if (!strcmp(type, "NFD")) opt = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
    else if (!strcmp(type, "NFKC")) opt = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    else if (!strcmp(type, "NFKD")) opt = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    else
        return rs_err(e, RS_EUNSUPPORTED, "%s: normalizer type '%s' is not supported (NFC/NFD/NFKC/NFKD, Sequence)",
                      src, type);
    if (tok->n_norm >= MAX_NORM) return rs_err(e, RS_EUNSUPPORTED, "%s: too many normalizers", src);
    tok->norm[tok->n_norm++] = opt;
    return RS_OK;
}

static int parse_behavior(const char *b, int *out) {
    static const char *names[] = {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    for (int i = 0; i < 5; i++)
        if (b && !strcmp(b, names[i])) {
            *out = i;
            return 0;
        }
    return -1;
}

/* Fills t->pre; *bytelevel is set once a ByteLevel step is seen (it must come last). */
static int parse_pre(Tokenizer *tok, const cJSON *p, int *bytelevel, const char *src, RsErr *e) {
    if (!p || cJSON_IsNull(p)) return RS_OK;
    const char *type = jstr(p, "type");
    if (!type) return rs_err(e, RS_EFORMAT, "%s: pre_tokenizer without a type", src);
    if (*bytelevel)
        return rs_err(e, RS_EUNSUPPORTED, "%s: pre_tokenizer '%s' after ByteLevel is not supported", src, type);
    if (!strcmp(type, "Sequence")) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers"), *it;
        if (!cJSON_IsArray(arr)) return rs_err(e, RS_EFORMAT, "%s: Sequence pre_tokenizer without a list", src);
        cJSON_ArrayForEach(it, arr) {
            int rc = parse_pre(tok, it, bytelevel, src, e);
            if (rc) return rc;
        }
        return RS_OK;
    }
    if (!strcmp(type, "ByteLevel")) {
        *bytelevel = 1;
        if (jbool(p, "add_prefix_space", 0)) {
            if (tok->n_pre >= MAX_PRE) return rs_err(e, RS_EUNSUPPORTED, "%s: too many pre-tokenizer steps", src);
            tok->pre[tok->n_pre++].kind = PRE_PREFIX_SPACE;
        }
        if (jbool(p, "use_regex", 1))
            return add_regex_step(tok, RE_GPT2, strlen(RE_GPT2), 0, BEH_ISOLATED, 0, src, e);
        return RS_OK;
    }
    if (!strcmp(type, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const char *rx = jstr(pat, "Regex"), *lit = jstr(pat, "String");
        int beh;
        if (!rx && !lit) return rs_err(e, RS_EFORMAT, "%s: Split pre_tokenizer without a pattern", src);
        if (parse_behavior(jstr(p, "behavior"), &beh) != 0)
            return rs_err(e, RS_EUNSUPPORTED, "%s: Split behavior '%s' is not supported", src,
                          jstr(p, "behavior") ? jstr(p, "behavior") : "(none)");
        const char *pt = rx ? rx : lit;
        return add_regex_step(tok, pt, strlen(pt), rx == NULL, beh, jbool(p, "invert", 0), src, e);
    }
    if (!strcmp(type, "Digits")) {
        /* Rust char::is_numeric == \p{N}; individual digits are isolated one by one,
         * otherwise runs of digits stay together (Contiguous). */
        const char *re = jbool(p, "individual_digits", 0) ? "\\p{N}" : "\\p{N}+";
        return add_regex_step(tok, re, strlen(re), 0, BEH_ISOLATED, 0, src, e);
    }
    return rs_err(e, RS_EUNSUPPORTED, "%s: pre_tokenizer type '%s' is not supported (ByteLevel, Split, Digits, Sequence)",
                  src, type);
}

/* Looks for a TemplateProcessing whose single template starts with a special token. */
static void parse_post(const cJSON *p, int *bos_id, int *add_bos) {
    if (!p || cJSON_IsNull(p)) return;
    const char *type = jstr(p, "type");
    if (!type) return;
    if (!strcmp(type, "Sequence")) {
        const cJSON *it, *arr = cJSON_GetObjectItemCaseSensitive(p, "processors");
        cJSON_ArrayForEach(it, arr) parse_post(it, bos_id, add_bos);
        return;
    }
    if (strcmp(type, "TemplateProcessing") != 0) return;
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(p, "single");
    const cJSON *first = cJSON_IsArray(single) ? cJSON_GetArrayItem(single, 0) : NULL;
    const cJSON *sp = first ? cJSON_GetObjectItemCaseSensitive(first, "SpecialToken") : NULL;
    const char *name = sp ? jstr(sp, "id") : NULL;
    if (!name) return;
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(p, "special_tokens");
    const cJSON *ent = cJSON_GetObjectItemCaseSensitive(st, name);
    const cJSON *ids = ent ? cJSON_GetObjectItemCaseSensitive(ent, "ids") : NULL;
    const cJSON *id0 = cJSON_IsArray(ids) ? cJSON_GetArrayItem(ids, 0) : NULL;
    if (cJSON_IsNumber(id0)) {
        *bos_id = id0->valueint;
        *add_bos = 1;
    }
}

/* tokenizer_config.json token fields are a string or {"content": ...}. */
static const char *config_token(const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) return jstr(v, "content");
    return NULL;
}

/* Reads bos/eos/add_bos from tokenizer_config.json next to the tokenizer.json, if any. */
static void apply_config(Tokenizer *tok, const char *json_path) {
    char path[1100];
    const char *slash = strrchr(json_path, '/');
    int dirlen = slash ? (int)(slash - json_path) : 0;
    snprintf(path, sizeof path, "%.*s%stokenizer_config.json", dirlen, json_path, slash ? "/" : "");
    char *txt;
    size_t len;
    if (rs_read_file(path, &txt, &len, NULL) != 0) return;
    cJSON *cfg = cJSON_ParseWithLength(txt, len);
    free(txt);
    if (!cfg) return;
    const char *b = config_token(cfg, "bos_token"), *eo = config_token(cfg, "eos_token");
    if (b) tok->bos_id = vmap_find(tok, b, strlen(b));
    if (eo) tok->eos_id = vmap_find(tok, eo, strlen(eo));
    const cJSON *ab = cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token");
    if (cJSON_IsBool(ab)) tok->add_bos = cJSON_IsTrue(ab);
    if (tok->bos_id < 0) tok->add_bos = 0;
    cJSON_Delete(cfg);
}

static int merge_parts(const cJSON *m, const char **a, size_t *la, const char **b, size_t *lb) {
    if (cJSON_IsString(m)) {
        const char *s = m->valuestring, *sp = strchr(s, ' ');
        if (!sp || sp == s || !sp[1]) return -1;
        *a = s;
        *la = (size_t)(sp - s);
        *b = sp + 1;
        *lb = strlen(sp + 1);
        return 0;
    }
    if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2) {
        const cJSON *x = cJSON_GetArrayItem(m, 0), *y = cJSON_GetArrayItem(m, 1);
        if (!cJSON_IsString(x) || !cJSON_IsString(y)) return -1;
        *a = x->valuestring;
        *la = strlen(*a);
        *b = y->valuestring;
        *lb = strlen(*b);
        return 0;
    }
    return -1;
}

static int load_json_doc(const cJSON *root, const char *src, Tokenizer **out, RsErr *e) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) return rs_err(e, RS_EFORMAT, "%s: no \"model\" object", src);
    const char *mtype = jstr(model, "type");
    if (mtype && strcmp(mtype, "BPE") != 0)
        return rs_err(e, RS_EUNSUPPORTED, "%s: model type '%s' is not supported (only byte-level BPE)", src, mtype);
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsObject(vocab)) return rs_err(e, RS_EFORMAT, "%s: model.vocab is not an object", src);
    if (!cJSON_IsArray(merges)) return rs_err(e, RS_EFORMAT, "%s: model.merges is not an array", src);
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), *it;
    int maxid = -1;
    cJSON_ArrayForEach(it, vocab) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= MAX_VOCAB ||
            it->valuedouble != (double)it->valueint)
            return rs_err(e, RS_EFORMAT, "%s: vocab entry '%s' has a bad id", src, it->string);
        if (it->valueint > maxid) maxid = it->valueint;
    }
    cJSON_ArrayForEach(it, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= MAX_VOCAB || !jstr(it, "content"))
            return rs_err(e, RS_EFORMAT, "%s: added_tokens entry without a valid id/content", src);
        if (id->valueint > maxid) maxid = id->valueint;
    }
    if (maxid < 0) return rs_err(e, RS_EFORMAT, "%s: empty vocabulary", src);
    TokTable tt;
    toktable_init(&tt, maxid + 1);
    cJSON_ArrayForEach(it, vocab) {
        toktable_set(&tt, it->valueint, it->string, strlen(it->string), 0);
    }
    cJSON_ArrayForEach(it, added) {
        int id = cJSON_GetObjectItemCaseSensitive(it, "id")->valueint;
        const char *c = jstr(it, "content");
        toktable_set(&tt, id, c, strlen(c), 1);
        tt.flags[id] = (uint8_t)(TOKF_ADDED | (jbool(it, "special", 0) ? TOKF_SPECIAL : 0));
    }
    Tokenizer *tok = tokenizer_from_table(&tt);
    toktable_free(&tt);
    tok->ignore_merges = jbool(model, "ignore_merges", 0);
    merges_alloc(tok, (size_t)cJSON_GetArraySize(merges));
    int rank = 0, rc = RS_OK;
    cJSON_ArrayForEach(it, merges) {
        const char *a, *b;
        size_t la, lb;
        if (merge_parts(it, &a, &la, &b, &lb) != 0) {
            char *txt = cJSON_PrintUnformatted(it);
            rc = rs_err(e, RS_EFORMAT, "%s: merge %d %s is neither \"a b\" nor [a, b]", src, rank,
                        txt ? txt : "?");
            free(txt);
            break;
        }
        if ((rc = add_merge(tok, a, la, b, lb, rank, src, e)) != 0) break;
        rank++;
    }
    int bytelevel = 0;
    if (!rc) rc = parse_normalizer(tok, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), src, e);
    if (!rc) rc = parse_pre(tok, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), &bytelevel, src, e);
    if (!rc && !bytelevel)
        rc = rs_err(e, RS_EUNSUPPORTED, "%s: pre_tokenizer has no ByteLevel step (only byte-level BPE is supported)", src);
    if (rc) {
        tokenizer_destroy(&tok);
        return rc;
    }
    parse_post(cJSON_GetObjectItemCaseSensitive(root, "post_processor"), &tok->bos_id, &tok->add_bos);
    if (tok->bos_id >= tok->n_vocab) tok->bos_id = -1, tok->add_bos = 0;
    *out = tok;
    return RS_OK;
}

int tokenizer_load_json(const char *path, Tokenizer **out, RsErr *e) {
    *out = NULL;
    alphabet_init();
    char *txt;
    size_t len;
    int rc = rs_read_file(path, &txt, &len, e);
    if (rc) return rc;
    cJSON *root = cJSON_ParseWithLength(txt, len);
    if (!root) {
        const char *where = cJSON_GetErrorPtr();
        size_t off = where && where >= txt && where <= txt + len ? (size_t)(where - txt) : 0;
        free(txt);
        return rs_err(e, RS_EFORMAT, "%s: malformed JSON near byte %zu", path, off);
    }
    free(txt);
    rc = load_json_doc(root, path, out, e);
    cJSON_Delete(root);
    if (rc) return rc;
    apply_config(*out, path);
    mark_eog(*out);
    return RS_OK;
}

int tokenizer_load_model(const struct Model *m, Tokenizer **out, RsErr *e) {
    *out = NULL;
    if (m->random_weights) return RS_OK;
    alphabet_init();
    int rc;
    switch (m->tok_source) {
    case TOKSRC_GGUF:
        if (!m->gguf) return rs_err(e, RS_EINVAL, "model '%s': GGUF tokenizer source but no open GGUF", m->path);
        rc = load_gguf(m->gguf, m->path, out, e);
        break;
    case TOKSRC_HF_JSON:
        rc = tokenizer_load_json(m->tokenizer_json, out, e);
        if (!rc) {
            Tokenizer *tok = *out;
            /* config.json ids fill what tokenizer_config.json did not say */
            if (tok->bos_id < 0 && m->cfg.bos_id >= 0 && m->cfg.bos_id < tok->n_vocab) tok->bos_id = m->cfg.bos_id;
            if (tok->eos_id < 0 && m->cfg.eos_id >= 0 && m->cfg.eos_id < tok->n_vocab) {
                tok->eos_id = m->cfg.eos_id;
                tok->flags[tok->eos_id] |= TOKF_EOG;
            }
        }
        break;
    default: return rs_err(e, RS_EINVAL, "model '%s' has no tokenizer source", m->path);
    }
    return rc;
}

void tokenizer_destroy(Tokenizer **pt) {
    if (!pt || !*pt) return;
    Tokenizer *tok = *pt;
    for (int i = 0; i < tok->n_pre; i++) pcre2_code_free(tok->pre[i].re);
    free(tok->bytes);
    free(tok->off);
    free(tok->flags);
    free(tok->vmap);
    free(tok->mkey);
    free(tok->mrank);
    free(tok->mres);
    free(tok->added);
    free(tok);
    *pt = NULL;
}

int tokenizer_vocab_size(const Tokenizer *tok) { return tok->n_vocab; }
int tokenizer_eos_id(const Tokenizer *tok) { return tok->eos_id; }
int tokenizer_bos_id(const Tokenizer *tok) { return tok->bos_id; }
int tokenizer_add_bos(const Tokenizer *tok) { return tok->add_bos; }
uint64_t tokenizer_hash(const Tokenizer *tok) { return tok->hash; }

uint64_t tokenizer_identity(const Tokenizer *tok, int vocab_size) {
    if (tok) return tok->hash;
    const char tag[] = "rootspec: no tokenizer, token ids only";
    return fnv(fnv(FNV_INIT, tag, sizeof tag), &vocab_size, sizeof vocab_size);
}

int tokenizer_is_eog(const Tokenizer *tok, int id) {
    return id >= 0 && id < tok->n_vocab && (tok->flags[id] & TOKF_EOG) != 0;
}

/* ---- encoding ---- */

typedef struct {
    int *v;
    int n, cap;
} IdVec;

static void ids_push(IdVec *o, int id) {
    if (o->n == o->cap) {
        o->cap = o->cap ? o->cap * 2 : 64;
        int *nv = realloc(o->v, (size_t)o->cap * sizeof(int));
        if (!nv) abort();
        o->v = nv;
    }
    o->v[o->n++] = id;
}

/* Pieces of text: spans into a byte buffer. */
typedef struct {
    size_t off, len;
} Span;

typedef struct {
    char *buf;
    size_t len, cap;
    Span *sp;
    int n, spcap;
} Pieces;

static void pieces_add(Pieces *p, const char *s, size_t len) {
    if (len == 0) return;
    if (p->len + len > p->cap) {
        size_t nc = p->cap ? p->cap : 256;
        while (nc < p->len + len) nc *= 2;
        char *nb = realloc(p->buf, nc);
        if (!nb) abort();
        p->buf = nb;
        p->cap = nc;
    }
    memcpy(p->buf + p->len, s, len);
    if (p->n == p->spcap) {
        p->spcap = p->spcap ? p->spcap * 2 : 32;
        Span *ns = realloc(p->sp, (size_t)p->spcap * sizeof(Span));
        if (!ns) abort();
        p->sp = ns;
    }
    p->sp[p->n++] = (Span){p->len, len};
    p->len += len;
}

static void pieces_free(Pieces *p) {
    free(p->buf);
    free(p->sp);
    memset(p, 0, sizeof *p);
}

typedef struct {
    size_t s, e;
    int m;
} MSpan;

/* One Split step on one piece, with HF's behaviours (tokenizers/src/normalizer.rs split). */
static void split_piece(const PreStep *st, const char *s, size_t len, pcre2_match_data *md, Pieces *out) {
    MSpan stack_sp[64], *sp = stack_sp;
    int n = 0, cap = 64;
    size_t pos = 0, prev = 0;
#define PUSH_SPAN(a, b, mm)                                                                \
    do {                                                                                   \
        if (n == cap) {                                                                    \
            cap *= 2;                                                                      \
            MSpan *ns = sp == stack_sp ? malloc((size_t)cap * sizeof(MSpan))               \
                                       : realloc(sp, (size_t)cap * sizeof(MSpan));         \
            if (!ns) abort();                                                              \
            if (sp == stack_sp) memcpy(ns, stack_sp, sizeof stack_sp);                     \
            sp = ns;                                                                       \
        }                                                                                  \
        sp[n++] = (MSpan){(a), (b), (mm)};                                                 \
    } while (0)
    while (pos <= len) {
        int rc = pcre2_match(st->re, (PCRE2_SPTR)s, len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc < 0) break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* empty match: step one character on */
            if (ms >= len) break;
            pos = ms + 1;
            while (pos < len && ((uint8_t)s[pos] & 0xC0) == 0x80) pos++;
            continue;
        }
        if (ms > prev) PUSH_SPAN(prev, ms, 0);
        PUSH_SPAN(ms, me, 1);
        prev = pos = me;
    }
    if (prev < len) PUSH_SPAN(prev, len, 0);
#undef PUSH_SPAN
    if (st->invert)
        for (int i = 0; i < n; i++) sp[i].m = !sp[i].m;
    /* Apply the behaviour in place over sp[0..n) producing sp[0..k). */
    int k = 0;
    switch (st->behavior) {
    case BEH_ISOLATED: k = n; break;
    case BEH_REMOVED:
        for (int i = 0; i < n; i++)
            if (!sp[i].m) sp[k++] = sp[i];
        break;
    case BEH_MERGED_PREV: {
        int prevm = 0;
        for (int i = 0; i < n; i++) {
            int m = sp[i].m;
            if (m && !prevm && k > 0) sp[k - 1].e = sp[i].e;
            else sp[k++] = sp[i];
            prevm = m;
        }
        break;
    }
    case BEH_MERGED_NEXT: { /* walk backwards: a match joins the span after it */
        int prevm = 0, w = n;
        for (int i = n - 1; i >= 0; i--) {
            int m = sp[i].m;
            if (m && !prevm && w < n) sp[w].s = sp[i].s;
            else sp[--w] = sp[i];
            prevm = m;
        }
        for (int i = w; i < n; i++) sp[k++] = sp[i];
        break;
    }
    case BEH_CONTIGUOUS: {
        int prevm = -1;
        for (int i = 0; i < n; i++) {
            int m = sp[i].m;
            if (m == prevm && k > 0) sp[k - 1].e = sp[i].e;
            else sp[k++] = sp[i];
            prevm = m;
        }
        break;
    }
    }
    for (int i = 0; i < k; i++) pieces_add(out, s + sp[i].s, sp[i].e - sp[i].s);
    if (sp != stack_sp) free(sp);
}

/* A mergeable adjacent pair: symbols left and right (indices into the piece), their ids
 * when queued, the merge's rank and result. */
typedef struct {
    int rank, left, right, a, b, res;
} BpePair;

static int pair_before(const BpePair *x, const BpePair *y) {
    return x->rank != y->rank ? x->rank < y->rank : x->left < y->left;
}

static void pair_push(const Tokenizer *tok, const int *sym, int l, int r, BpePair *h, int *hn) {
    BpePair p = {.left = l, .right = r, .a = sym[l], .b = sym[r]};
    p.rank = merge_find(tok, p.a, p.b, &p.res);
    if (p.rank == INT_MAX) return;
    int i = (*hn)++;
    while (i > 0 && pair_before(&p, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = p;
}

static BpePair pair_pop(BpePair *h, int *hn) {
    BpePair top = h[0], last = h[--*hn];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *hn) break;
        if (c + 1 < *hn && pair_before(&h[c + 1], &h[c])) c++;
        if (!pair_before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*hn > 0) h[i] = last;
    return top;
}

/* BPE on one piece of raw bytes; appends ids. Repeatedly merges the lowest-ranked adjacent
 * pair, leftmost first (as HF does), with a heap of candidate pairs over a linked list of
 * symbols: O(n log n), so one long run of unmergeable text cannot stall the tokenizer. */
static void bpe_piece(const Tokenizer *tok, const char *s, size_t len, IdVec *out) {
    if (tok->ignore_merges) {
        int id = vmap_find(tok, s, len);
        if (id >= 0) {
            ids_push(out, id);
            return;
        }
    }
    int *sym = rs_xmalloc(len * 3 * sizeof(int) + 1), *nxt = sym + len, *prv = nxt + len;
    int n = 0;
    for (size_t i = 0; i < len; i++) {
        int id = tok->byte_tok[(uint8_t)s[i]];
        if (id >= 0) sym[n++] = id; /* no unk token in byte-level BPE: HF drops it too */
    }
    for (int i = 0; i < n; i++) {
        prv[i] = i - 1;
        nxt[i] = i + 1 < n ? i + 1 : -1;
    }
    /* n - 1 initial pairs, at most 2 more per merge */
    BpePair *heap = rs_xmalloc(sizeof(BpePair) * (size_t)(3 * n + 1));
    int hn = 0;
    for (int i = 0; i + 1 < n; i++) pair_push(tok, sym, i, i + 1, heap, &hn);
    while (hn > 0) {
        BpePair p = pair_pop(heap, &hn);
        int l = p.left, r = p.right;
        if (sym[l] != p.a || nxt[l] != r || sym[r] != p.b) continue; /* stale */
        sym[l] = p.res;
        sym[r] = -1;
        nxt[l] = nxt[r];
        if (nxt[l] >= 0) prv[nxt[l]] = l;
        if (prv[l] >= 0) pair_push(tok, sym, prv[l], l, heap, &hn);
        if (nxt[l] >= 0) pair_push(tok, sym, l, nxt[l], heap, &hn);
    }
    for (int i = n > 0 ? 0 : -1; i >= 0; i = nxt[i]) ids_push(out, sym[i]); /* 0 is never merged away */
    free(heap);
    free(sym);
}

static int encode_segment(const Tokenizer *tok, const char *s, size_t len, pcre2_match_data *md,
                          IdVec *out, RsErr *e) {
    if (len == 0) return RS_OK;
    char *norm = NULL;
    for (int i = 0; i < tok->n_norm; i++) {
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &dst,
                                          (utf8proc_option_t)tok->norm[i]);
        if (r < 0) {
            free(norm);
            return rs_err(e, RS_EINVAL, "cannot normalize text: %s", utf8proc_errmsg(r));
        }
        free(norm);
        norm = (char *)dst;
        s = norm;
        len = (size_t)r;
    }
    Pieces cur = {0}, nxt = {0};
    pieces_add(&cur, s, len);
    for (int i = 0; i < tok->n_pre; i++) {
        const PreStep *st = &tok->pre[i];
        for (int j = 0; j < cur.n; j++) {
            const char *p = cur.buf + cur.sp[j].off;
            size_t pl = cur.sp[j].len;
            if (st->kind == PRE_PREFIX_SPACE) {
                if (p[0] != ' ') {
                    char *tmp = rs_xmalloc(pl + 1);
                    tmp[0] = ' ';
                    memcpy(tmp + 1, p, pl);
                    pieces_add(&nxt, tmp, pl + 1);
                    free(tmp);
                } else {
                    pieces_add(&nxt, p, pl);
                }
            } else {
                split_piece(st, p, pl, md, &nxt);
            }
        }
        Pieces sw = cur;
        cur = nxt;
        nxt = sw;
        nxt.len = 0;
        nxt.n = 0;
    }
    for (int j = 0; j < cur.n; j++) bpe_piece(tok, cur.buf + cur.sp[j].off, cur.sp[j].len, out);
    pieces_free(&cur);
    pieces_free(&nxt);
    free(norm);
    return RS_OK;
}

/* 1 when any of text[at, at + len) is plain (a caller's words, where no special token
 * starts or ends). */
static int overlaps_plain(const uint8_t *plain, size_t at, size_t len) {
    if (!plain) return 0;
    for (size_t i = at; i < at + len; i++)
        if (plain[i]) return 1;
    return 0;
}

int tokenizer_encode(const Tokenizer *tok, const char *text, int **ids, int *n, RsErr *e) {
    return tokenizer_encode_plain(tok, text, NULL, ids, n, e);
}

int tokenizer_encode_plain(const Tokenizer *tok, const char *text, const uint8_t *plain,
                           int **ids, int *n, RsErr *e) {
    *ids = NULL;
    *n = 0;
    size_t len = strlen(text);
    /* PCRE2 runs with PCRE2_NO_UTF_CHECK, so the text is validated here, once. */
    for (size_t i = 0; i < len;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)text + i, (utf8proc_ssize_t)(len - i), &cp);
        if (k <= 0 || cp < 0)
            return rs_err(e, RS_EINVAL, "text is not valid UTF-8 at byte %zu (0x%02x)", i, (uint8_t)text[i]);
        i += (size_t)k;
    }
    IdVec out = {0};
    pcre2_match_data *md = pcre2_match_data_create(4, NULL);
    if (!md) return rs_err(e, RS_ENOMEM, "cannot allocate regex match data");
    size_t pos = 0;
    int rc = RS_OK;
    while (pos < len && rc == RS_OK) {
        /* leftmost-longest added token at or after pos */
        size_t at = len;
        int hit = -1;
        size_t hlen = 0;
        for (size_t i = pos; i < len && hit < 0; i++) {
            uint8_t c = (uint8_t)text[i];
            for (int k = tok->added_start[c]; k < tok->added_start[c + 1]; k++) {
                size_t l;
                const char *s = tok_str(tok, tok->added[k], &l);
                if (l <= len - i && memcmp(text + i, s, l) == 0 && !overlaps_plain(plain, i, l)) {
                    hit = tok->added[k];
                    hlen = l;
                    at = i;
                    break; /* bucket is longest-first */
                }
            }
        }
        rc = encode_segment(tok, text + pos, at - pos, md, &out, e);
        if (hit >= 0) ids_push(&out, hit);
        pos = at + hlen;
    }
    pcre2_match_data_free(md);
    if (rc) {
        free(out.v);
        return rc;
    }
    *ids = out.v ? out.v : rs_xmalloc(sizeof(int));
    *n = out.n;
    return RS_OK;
}

/* ---- decoding ---- */

const char *tokenizer_token_view(const Tokenizer *tok, int id, size_t *len) {
    if (id < 0 || id >= tok->n_vocab) return NULL;
    return tok_str(tok, id, len);
}

const char *tokenizer_token_text(const Tokenizer *tok, int id, size_t *len) {
    const char *s = tokenizer_token_view(tok, id, len);
    if (s) return s;
    *len = 3;
    return "\xef\xbf\xbd";
}

int tokenizer_token_bytes(const Tokenizer *tok, int id, char *buf, int cap) {
    size_t l;
    const char *s = tokenizer_token_view(tok, id, &l);
    if (!s) return -1;
    if (cap < 0) cap = 0;
    int n = (int)(l < (size_t)cap ? l : (size_t)cap);
    if (n > 0) memcpy(buf, s, (size_t)n);
    return n;
}

char *tokenizer_decode(const Tokenizer *tok, const int *ids, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < tok->n_vocab) total += tok->off[ids[i] + 1] - tok->off[ids[i]];
    char *out = rs_xmalloc(total + 1), *p = out;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= tok->n_vocab) continue;
        size_t l;
        const char *s = tok_str(tok, ids[i], &l);
        memcpy(p, s, l);
        p += l;
    }
    *p = 0;
    return out;
}
