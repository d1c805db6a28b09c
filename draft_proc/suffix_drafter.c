/* The suffix kind of Drafter (suffix_drafter.h): an n-gram index over the context and the
 * corpus, the matches of the context's tail, their continuations as a weighted trie, and
 * the trie laid out as a pool. */
#include "suffix_drafter.h"
#include "drafter_impl.h"
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

#define HASH_BITS 16
#define HASH_SIZE (1 << HASH_BITS)
#define CHAIN_VISITS 512 /* earlier occurrences looked at per key and sequence */
#define TRIE_MAX (1 + SUFFIX_OCC_MAX * POOL_MAX_DEPTH)

/* ---- a token sequence with its 1-gram and 2-gram occurrence chains ------------------ */

/* Positions are absolute (the n-th token pushed is at n - 1). A windowed sequence keeps
 * only its last `window` tokens in a ring: a chain that reaches below seq_lo has ended.
 * A negative token separates documents: it never matches and never continues one. */
typedef struct {
    int *tok;           // (cap)
    int *prev1, *prev2; // (cap) the previous position with the same 1-gram / 2-gram, -1
    size_t n, cap;
    size_t window;      /* 0: unbounded */
    int head1[HASH_SIZE], head2[HASH_SIZE]; /* the last position with each key, -1 */
} Seq;

static unsigned key1(int a) { return ((uint32_t)a * 2654435761u) >> (32 - HASH_BITS); }
static unsigned key2(int a, int b) {
    return (((uint32_t)a * 2654435761u) ^ ((uint32_t)b * 40503u + 0x9e3779b9u)) >> (32 - HASH_BITS)
           & (HASH_SIZE - 1);
}

/* The first position still held. */
static size_t seq_lo(const Seq *s) { return s->window && s->n > s->window ? s->n - s->window : 0; }
/* Where position p lives (before the ring first wraps, n <= cap <= window and p < n). */
static size_t seq_slot(const Seq *s, size_t p) { return s->window ? p % s->window : p; }
static int seq_tok(const Seq *s, size_t p) { return s->tok[seq_slot(s, p)]; }

static void seq_clear(Seq *s) {
    s->n = 0;
    memset(s->head1, 0xff, sizeof s->head1);
    memset(s->head2, 0xff, sizeof s->head2);
}

/* Room for one more token: unbounded sequences double; a windowed one grows up to its
 * window and then overwrites its oldest token. */
static void seq_reserve(Seq *s) {
    if (s->n < s->cap || (s->window && s->cap == s->window)) return;
    size_t cap = s->cap ? 2 * s->cap : 1024;
    if (s->window && cap > s->window) cap = s->window;
    s->cap = cap;
    s->tok = realloc(s->tok, s->cap * sizeof(int));
    s->prev1 = realloc(s->prev1, s->cap * sizeof(int));
    s->prev2 = realloc(s->prev2, s->cap * sizeof(int));
    RS_ASSERT(s->tok && s->prev1 && s->prev2 && "out of memory");
}

static void seq_push(Seq *s, int t) {
    seq_reserve(s);
    size_t p = s->n++, i = seq_slot(s, p);
    s->tok[i] = t;
    unsigned h = key1(t);
    s->prev1[i] = s->head1[h];
    s->head1[h] = (int)p;
    s->prev2[i] = -1;
    if (p == seq_lo(s)) return;
    h = key2(seq_tok(s, p - 1), t);
    s->prev2[i] = s->head2[h];
    s->head2[h] = (int)p;
}

static void seq_free(Seq *s) {
    free(s->tok);
    free(s->prev1);
    free(s->prev2);
}

/* ---- matches of the context's tail --------------------------------------------------- */

typedef struct {
    const Seq *s;
    int pos;    /* the occurrence's last token; its continuation starts at pos + 1 */
    int len;    /* tokens it agrees with the context's tail, <= SUFFIX_MATCH_MAX */
} Match;

typedef struct {
    Match m[SUFFIX_OCC_MAX];
    int n;
} Matches;

/* How many tokens before and at s[pos] equal the context's tail. */
static int match_len(const Seq *s, int pos, const Seq *ctx) {
    int k = 0;
    int lo = (int)seq_lo(s);
    while (k < SUFFIX_MATCH_MAX && pos - k >= lo && (int)ctx->n - 1 - k >= 0 &&
           seq_tok(s, (size_t)(pos - k)) == ctx->tok[ctx->n - 1 - k])
        k++;
    return k;
}

/* Keeps the SUFFIX_OCC_MAX longest matches (the earlier-found, i.e. more recent, on ties). */
static void matches_add(Matches *ms, const Seq *s, int pos, int len) {
    int i = ms->n;
    if (i == SUFFIX_OCC_MAX && ms->m[--i].len >= len) return;
    if (ms->n < SUFFIX_OCC_MAX) ms->n++;
    for (; i > 0 && ms->m[i - 1].len < len; i--) ms->m[i] = ms->m[i - 1];
    ms->m[i] = (Match){s, pos, len};
}

/* Walks one occurrence chain of s (the 2-gram one when bigram) for the context's tail. */
static void matches_scan(Matches *ms, const Seq *s, const Seq *ctx, int bigram) {
    int a = ctx->tok[ctx->n - 1];
    int p = bigram ? s->head2[key2(ctx->tok[ctx->n - 2], a)] : s->head1[key1(a)];
    int lo = (int)seq_lo(s);
    for (int visits = 0; p >= lo && visits < CHAIN_VISITS; visits++) {
        /* an occurrence needs a continuation; the context's own tail has none */
        int cont = (size_t)p + 1 < s->n && seq_tok(s, (size_t)p + 1) >= 0;
        int len = cont ? match_len(s, p, ctx) : 0;
        if (len >= 1 + bigram) matches_add(ms, s, p, len);
        size_t i = seq_slot(s, (size_t)p);
        p = bigram ? s->prev2[i] : s->prev1[i];
    }
}

/* ---- the continuations' trie, laid out as a pool ------------------------------------ */

typedef struct {
    int n;
    int tok[TRIE_MAX], first[TRIE_MAX], next[TRIE_MAX];
    double w[TRIE_MAX];
} Trie;

static int trie_child(Trie *t, int u, int tok) {
    for (int c = t->first[u]; c >= 0; c = t->next[c])
        if (t->tok[c] == tok) return c;
    int c = t->n++;
    RS_ASSERT(c < TRIE_MAX);
    t->tok[c] = tok;
    t->first[c] = -1;
    t->next[c] = t->first[u];
    t->w[c] = 0;
    t->first[u] = c;
    return c;
}

static void trie_build(Trie *t, const Matches *ms, int depth) {
    t->n = 1;
    t->first[0] = -1;
    t->w[0] = 0;
    for (int i = 0; i < ms->n; i++) {
        const Match *m = &ms->m[i];
        double w = (double)m->len * m->len * m->len;
        t->w[0] += w;
        for (int u = 0, k = 1; k <= depth && (size_t)(m->pos + k) < m->s->n; k++) {
            int tok = seq_tok(m->s, (size_t)(m->pos + k));
            if (tok < 0) break; /* a document's end */
            u = trie_child(t, u, tok);
            t->w[u] += w;
        }
    }
}

/* Whether trie node a ranks before b: heavier, then the lower token id. */
static int trie_before(const Trie *t, int a, int b) {
    return t->w[a] > t->w[b] || (t->w[a] == t->w[b] && t->tok[a] < t->tok[b]);
}

/* u's children, best first, at most POOL_TOPK. */
static int trie_sorted_children(const Trie *t, int u, int *out) {
    int n = 0;
    for (int c = t->first[u]; c >= 0; c = t->next[c]) {
        int i = n;
        if (i == POOL_TOPK && !trie_before(t, c, out[--i])) continue;
        if (n < POOL_TOPK) n++;
        for (; i > 0 && trie_before(t, c, out[i - 1]); i--) out[i] = out[i - 1];
        out[i] = c;
    }
    return n;
}

/* Breadth first: parents precede children, siblings are contiguous. */
static void trie_to_pool(const Trie *t, Pool *p) {
    int trie_of[POOL_MAX], kids[POOL_TOPK], expanded = 0;
    p->n = 0;
    for (int u = -1, head = 0; u < p->n; u = head++) {
        int tu = u < 0 ? 0 : trie_of[u];
        if (u >= 0 && (t->first[tu] < 0 || expanded == POOL_N_EXPANDED)) continue;
        int nk = trie_sorted_children(t, tu, kids);
        expanded += u >= 0 && nk > 0;
        for (int k = 0; k < nk; k++) {
            int i = p->n++;
            p->token[i] = t->tok[kids[k]];
            p->parent[i] = u;
            p->depth[i] = (uint8_t)(u < 0 ? 1 : p->depth[u] + 1);
            p->logq[i] = (float)log(t->w[kids[k]] / (t->w[tu] + 1.0));
            trie_of[i] = kids[k];
        }
    }
}

/* ---- the index shared across requests -------------------------------------------- */

struct SuffixIndex {
    pthread_rwlock_t lock; /* drafters read under it; suffix_index_add writes */
    Seq seq;               /* windowed: the last max_tokens tokens, separators included */
};

int suffix_index_create(size_t max_tokens, SuffixIndex **out, RsErr *e) {
    *out = NULL;
    if (max_tokens < 2 || max_tokens > SUFFIX_INDEX_MAX)
        return rs_err(e, RS_EINVAL, "suffix index of %zu tokens: give 2..%d", max_tokens,
                      SUFFIX_INDEX_MAX);
    SuffixIndex *ix = rs_xcalloc(1, sizeof *ix);
    RS_ASSERT(pthread_rwlock_init(&ix->lock, NULL) == 0);
    ix->seq.window = max_tokens;
    seq_clear(&ix->seq);
    *out = ix;
    return RS_OK;
}

void suffix_index_destroy(SuffixIndex **pix) {
    if (!pix || !*pix) return;
    seq_free(&(*pix)->seq);
    pthread_rwlock_destroy(&(*pix)->lock);
    free(*pix);
    *pix = NULL;
}

void suffix_index_add(SuffixIndex *ix, const int *tokens, size_t n) {
    if (n == 0) return;
    pthread_rwlock_wrlock(&ix->lock);
    if (ix->seq.n + n + 1 >= INT_MAX) seq_clear(&ix->seq); /* positions are ints */
    for (size_t i = 0; i < n; i++) seq_push(&ix->seq, tokens[i]);
    seq_push(&ix->seq, -1);
    pthread_rwlock_unlock(&ix->lock);
}

size_t suffix_index_tokens(SuffixIndex *ix) {
    pthread_rwlock_rdlock(&ix->lock);
    size_t n = ix->seq.n - seq_lo(&ix->seq);
    pthread_rwlock_unlock(&ix->lock);
    return n;
}

/* ---- the Drafter ops ----------------------------------------------------------------- */

typedef struct {
    int vocab, depth;
    Seq ctx, corpus;
    SuffixIndex *shared; /* borrowed, or NULL */
    Trie trie;
    SyncGrowth g; /* grow_begin's outcome for grow_end */
    char name[256];
} SuffixDrafter;

static int push_tokens(SuffixDrafter *d, const int *tokens, int n, RsErr *e) {
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= d->vocab)
            return rs_err(e, RS_EINVAL, "token id %d at %d outside drafter vocabulary of %d",
                          tokens[i], i, d->vocab);
    for (int i = 0; i < n; i++) seq_push(&d->ctx, tokens[i]);
    return RS_OK;
}

/* The matches point into the shared index too, so it stays read-locked until the trie
 * holds their continuations. */
static void grow(SuffixDrafter *d, Pool *p) {
    Matches ms = {.n = 0};
    if (d->shared) pthread_rwlock_rdlock(&d->shared->lock);
    for (int pass = 0; pass < 2 && ms.n == 0; pass++) { /* 2-grams, else 1-grams */
        int bigram = pass == 0;
        if (bigram && d->ctx.n < 2) continue;
        matches_scan(&ms, &d->ctx, &d->ctx, bigram);
        if (d->corpus.n) matches_scan(&ms, &d->corpus, &d->ctx, bigram);
        if (d->shared && d->shared->seq.n) matches_scan(&ms, &d->shared->seq, &d->ctx, bigram);
    }
    trie_build(&d->trie, &ms, d->depth);
    if (d->shared) pthread_rwlock_unlock(&d->shared->lock);
    trie_to_pool(&d->trie, p);
}

static int suffix_reset(void *ctx, const int *prompt, int n, const void *features,
                        size_t feat_bytes, RsErr *e) {
    SuffixDrafter *d = ctx;
    seq_clear(&d->ctx);
    if (n < 0) return rs_err(e, RS_EINVAL, "prefill of %d tokens", n);
    return push_tokens(d, prompt, n, e);
}

static int suffix_append(void *ctx, const int *tokens, int n, const void *features,
                         size_t feat_bytes, RsErr *e) {
    return push_tokens(ctx, tokens, n, e);
}

static int suffix_grow_begin(void *ctx, const int *tokens, int n, const void *features,
                             size_t feat_bytes, RsErr *e) {
    SuffixDrafter *d = ctx;
    uint64_t t0 = rs_now_ns();
    d->g.err = (RsErr){0};
    d->g.rc = n < 1 ? rs_err(&d->g.err, RS_EINVAL, "commit of %d tokens: need at least one", n)
                    : push_tokens(d, tokens, n, &d->g.err);
    if (d->g.rc) return RS_OK;
    uint64_t t1 = rs_now_ns();
    Pool *p = d->g.pool;
    grow(d, p);
    d->g.rc = pool_finalize(p, d->vocab, &d->g.err);
    p->draft_ns = rs_now_ns() - t0;
    p->commit_pass_ns = t1 - t0;
    p->draft_host_ns = p->draft_ns;
    p->n_passes = 0; /* no model pass */
    p->n_expanded = 0;
    for (int i = 0; i < p->n; i++) p->n_expanded += p->n_children[i] > 0;
    p->draft_rows = 0;
    return RS_OK;
}

static int suffix_grow_end(void *ctx, Pool *out, RsErr *e) {
    return sync_growth_end(&((SuffixDrafter *)ctx)->g, out, e);
}

/* The width is the model kinds': matches decide how many nodes a level expands. */
static void suffix_set_shape(void *ctx, int depth, int width) {
    (void)width;
    ((SuffixDrafter *)ctx)->depth = depth;
}

static void suffix_destroy(void *ctx) {
    SuffixDrafter *d = ctx;
    seq_free(&d->ctx);
    seq_free(&d->corpus);
    sync_growth_free(&d->g);
    free(d);
}

static const DrafterOps suffix_ops = {
    .reset = suffix_reset,
    .grow_begin = suffix_grow_begin,
    .grow_end = suffix_grow_end,
    .destroy = suffix_destroy,
    .append = suffix_append,
    .set_shape = suffix_set_shape,
};

int drafter_suffix_create(int vocab, const int *corpus, size_t n_corpus, const char *name,
                          Drafter **out, RsErr *e) {
    *out = NULL;
    if (vocab < 1) return rs_err(e, RS_EINVAL, "suffix drafter: vocabulary of %d tokens", vocab);
    for (size_t i = 0; i < n_corpus; i++)
        if (corpus[i] < 0 || corpus[i] >= vocab)
            return rs_err(e, RS_EINVAL, "suffix drafter corpus: token id %d at %zu outside the "
                          "vocabulary of %d", corpus[i], i, vocab);
    SuffixDrafter *d = rs_xcalloc(1, sizeof *d);
    d->vocab = vocab;
    d->depth = POOL_MAX_DEPTH;
    seq_clear(&d->ctx);
    seq_clear(&d->corpus);
    for (size_t i = 0; i < n_corpus; i++) seq_push(&d->corpus, corpus[i]);
    sync_growth_init(&d->g);
    snprintf(d->name, sizeof d->name, "%s", name ? name : "suffix");
    DrafterInfo info = {.vocab_size = vocab, .fingerprint = "", .name = d->name};
    *out = drafter_wrap(&suffix_ops, d, &info);
    return RS_OK;
}

int drafter_suffix_share(Drafter *d, SuffixIndex *ix, RsErr *e) {
    if (d->ops != &suffix_ops)
        return rs_err(e, RS_EINVAL, "drafter '%s' is not the suffix kind: it cannot read a "
                      "shared suffix index", d->info.name ? d->info.name : "?");
    ((SuffixDrafter *)d->ctx)->shared = ix;
    return RS_OK;
}
