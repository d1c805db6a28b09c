/* The suffix drafter: its pools are valid pools (the same gate as a peer's), it proposes
 * what followed the context's tail before (in the context and in its corpus), longer
 * matches rank first, the depth asked is kept, and bad ids are refused. The reference for
 * "what followed" is a brute-force scan written here. */
#include "draft_proc/drafter.h"
#include "draft_proc/suffix_drafter.h"
#include "common/rng.h"
#include "testutil.h"
#include <string.h>

static Drafter *open_suffix(int vocab, const int *corpus, size_t n) {
    Drafter *d = NULL;
    RsErr e = {0};
    ck_assert_msg(drafter_suffix_create(vocab, corpus, n, NULL, &d, &e) == RS_OK, "%s", e.msg);
    return d;
}

static void grow(Drafter *d, const int *toks, int n, int reset, Pool *p) {
    RsErr e = {0};
    ck_assert_msg(drafter_grow_begin(d, toks, n, reset, NULL, 0, &e) == RS_OK, "%s", e.msg);
    ck_assert_msg(drafter_grow_end(d, p, &e) == RS_OK, "%s", e.msg);
}

/* The pool's best chain from the root (each level's first child: the heaviest). */
static int best_chain(const Pool *p, int *out) {
    int n = 0;
    for (int u = p->root_n_children ? p->root_first_child : -1; u >= 0;
         u = p->n_children[u] ? p->first_child[u] : -1)
        out[n++] = p->token[u];
    return n;
}

START_TEST(test_suffix_continues_repeat) {
    /* 10 11 12 13 14 15 16 17 18 19 20 ... then 10 11 12: the drafter must propose 13.. */
    int ctx[40], n = 0;
    for (int i = 0; i < 15; i++) ctx[n++] = 10 + i;
    for (int i = 0; i < 3; i++) ctx[n++] = 10 + i;
    Drafter *d = open_suffix(64, NULL, 0);
    Pool *p = calloc(1, sizeof *p);
    grow(d, ctx, n, 1, p);
    int chain[POOL_MAX_DEPTH], k = best_chain(p, chain);
    ck_assert_int_eq(k, POOL_MAX_DEPTH);
    for (int i = 0; i < k; i++) ck_assert_int_eq(chain[i], 13 + i);
    RsErr e = {0};
    Pool q = *p;
    ck_assert_msg(pool_finalize(&q, 64, &e) == RS_OK, "%s", e.msg); /* as a peer would */
    /* the depth asked is kept */
    drafter_set_shape(d, 3, POOL_EXPAND);
    int one = 13;
    grow(d, &one, 1, 0, p); /* context ... 10 11 12 13: continues 14 15 16 */
    k = best_chain(p, chain);
    ck_assert_int_eq(k, 3);
    ck_assert_int_eq(chain[0], 14);
    for (int i = 0; i < p->n; i++) ck_assert_int_le(p->depth[i], 3);
    free(p);
    drafter_destroy(&d);
    ck_assert_ptr_null(d);
}
END_TEST

/* Brute force: the tokens that followed each earlier occurrence of the last two tokens. */
static int followers(const int *s, int n, int *out) {
    int k = 0;
    for (int i = 1; i + 1 < n; i++)
        if (s[i - 1] == s[n - 2] && s[i] == s[n - 1]) {
            int dup = 0;
            for (int j = 0; j < k; j++) dup |= out[j] == s[i + 1];
            if (!dup) out[k++] = s[i + 1];
        }
    return k;
}

START_TEST(test_suffix_first_level_matches_scan) {
    /* On random low-entropy sequences the first level is exactly the brute-force set of
     * followers of the last 2-gram (when there is one), and every pool is valid. */
    Rng r;
    rng_seed(&r, 99);
    Pool *p = calloc(1, sizeof *p);
    for (int trial = 0; trial < 200; trial++) {
        int s[300], n = 20 + (int)(rng_next(&r) % 200), V = 3 + (int)(rng_next(&r) % 6);
        for (int i = 0; i < n; i++) s[i] = (int)(rng_next(&r) % (uint64_t)V);
        Drafter *d = open_suffix(V, NULL, 0);
        grow(d, s, n, 1, p);
        int want[16], nw = followers(s, n, want);
        if (nw > 0) {
            ck_assert_int_eq(p->root_n_children, nw < POOL_TOPK ? nw : POOL_TOPK);
            for (int k = 0; k < p->root_n_children; k++) {
                int t = p->token[p->root_first_child + k], found = 0;
                for (int j = 0; j < nw; j++) found |= want[j] == t;
                ck_assert_msg(found, "trial %d: token %d never followed the tail", trial, t);
            }
        }
        for (int i = 0; i < p->n; i++) ck_assert(p->logq[i] < 0 && p->logq[i] > -1e30f);
        drafter_destroy(&d);
    }
    free(p);
}
END_TEST

START_TEST(test_suffix_longer_match_ranks_first) {
    /* "7 1 2 -> 3" once and "5 5 1 2 -> 9" once; the context ends "5 5 1 2": 9 first. */
    int ctx[] = {7, 1, 2, 3, 0, 0, 5, 5, 1, 2, 9, 0, 0, 4, 4, 5, 5, 1, 2};
    Drafter *d = open_suffix(16, NULL, 0);
    Pool *p = calloc(1, sizeof *p);
    grow(d, ctx, (int)(sizeof ctx / sizeof ctx[0]), 1, p);
    ck_assert_int_eq(p->root_n_children, 2);
    ck_assert_int_eq(p->token[p->root_first_child], 9);
    ck_assert_int_eq(p->token[p->root_first_child + 1], 3);
    ck_assert(p->logq[p->root_first_child] > p->logq[p->root_first_child + 1]);
    free(p);
    drafter_destroy(&d);
}
END_TEST

START_TEST(test_suffix_corpus_and_errors) {
    int corpus[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    Drafter *d = open_suffix(16, corpus, 10);
    Pool *p = calloc(1, sizeof *p);
    int ctx[] = {12, 13, 4, 5};
    grow(d, ctx, 4, 1, p);
    int chain[POOL_MAX_DEPTH];
    ck_assert_int_eq(best_chain(p, chain), 5); /* 6 7 8 9 10: the corpus ends there */
    ck_assert_int_eq(chain[0], 6);
    /* nothing matches: an empty pool, still valid */
    int fresh[] = {14, 15};
    grow(d, fresh, 2, 1, p);
    ck_assert_int_eq(p->n, 0);
    RsErr e = {0};
    int bad = 16;
    ck_assert_int_eq(drafter_grow_begin(d, &bad, 1, 0, NULL, 0, &e), RS_OK);
    ck_assert_int_eq(drafter_grow_end(d, p, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "16"), "%s", e.msg);
    drafter_destroy(&d);
    Drafter *d2 = NULL;
    int badc[] = {1, 99};
    ck_assert_int_eq(drafter_suffix_create(16, badc, 2, NULL, &d2, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "99"), "%s", e.msg);
    ck_assert_ptr_null(d2);
    free(p);
}
END_TEST

START_TEST(test_suffix_pool_limits) {
    /* A context where every 2-gram recurs with many followers: the pool keeps the shape
     * limits (10 children, 70 expanded nodes, 710 candidates, depth 8). */
    Rng r;
    rng_seed(&r, 5);
    int s[4000];
    for (int i = 0; i < 4000; i++) s[i] = (int)(rng_next(&r) % 12);
    s[3998] = 1, s[3999] = 2;
    Drafter *d = open_suffix(12, NULL, 0);
    Pool *p = calloc(1, sizeof *p);
    grow(d, s, 4000, 1, p);
    int expanded = 0;
    for (int i = 0; i < p->n; i++) {
        expanded += p->n_children[i] > 0;
        ck_assert_int_le(p->n_children[i], POOL_TOPK);
    }
    ck_assert_int_eq(expanded, POOL_N_EXPANDED); /* the cap is reached, not passed */
    ck_assert_int_le(p->root_n_children, POOL_TOPK);
    ck_assert_int_gt(p->n, POOL_TOPK);
    free(p);
    drafter_destroy(&d);
}
END_TEST

/* ---- the index shared across requests ---- */

static SuffixIndex *open_index(size_t n) {
    SuffixIndex *ix = NULL;
    RsErr e = {0};
    ck_assert_msg(suffix_index_create(n, &ix, &e) == RS_OK, "%s", e.msg);
    return ix;
}

static void share(Drafter *d, SuffixIndex *ix) {
    RsErr e = {0};
    ck_assert_msg(drafter_suffix_share(d, ix, &e) == RS_OK, "%s", e.msg);
}

START_TEST(test_suffix_shared_crosses_requests) {
    /* Request 1's output 20..25 goes to the index; request 2 (another worker's drafter, and
     * the same drafter reset) ends "20 21" and is proposed 22..25, which only request 1
     * saw, up to the document's end. Without the index nothing crosses. */
    int prompt1[] = {1, 2, 3}, out1[] = {20, 21, 22, 23, 24, 25};
    int ctx2[] = {5, 6, 20, 21};
    SuffixIndex *ix = open_index(1000);
    Drafter *a = open_suffix(64, NULL, 0), *b = open_suffix(64, NULL, 0), *off = open_suffix(64, NULL, 0);
    share(a, ix);
    share(b, ix);
    Pool *p = calloc(1, sizeof *p);
    grow(a, prompt1, 3, 1, p);
    grow(a, out1, 6, 0, p);
    grow(off, prompt1, 3, 1, p);
    grow(off, out1, 6, 0, p);
    suffix_index_add(ix, out1, 6);
    int chain[POOL_MAX_DEPTH];
    Drafter *both[] = {a, b};
    for (int i = 0; i < 2; i++) {
        grow(both[i], ctx2, 4, 1, p);
        ck_assert_int_eq(best_chain(p, chain), 4);
        for (int k = 0; k < 4; k++) ck_assert_int_eq(chain[k], 22 + k);
        RsErr e = {0};
        Pool q = *p;
        ck_assert_msg(pool_finalize(&q, 64, &e) == RS_OK, "%s", e.msg);
    }
    grow(off, ctx2, 4, 1, p); /* the option off: request 1 is gone with its reset */
    ck_assert_int_eq(p->n, 0);
    share(a, NULL);
    grow(a, ctx2, 4, 1, p);
    ck_assert_int_eq(p->n, 0);
    free(p);
    drafter_destroy(&a);
    drafter_destroy(&b);
    drafter_destroy(&off);
    suffix_index_destroy(&ix);
    ck_assert_ptr_null(ix);
}
END_TEST

/* Brute force over the index's window (w: its tokens, -1 separators) and the context: the
 * distinct tokens that followed an earlier occurrence of the context's last 2-gram. */
static int followers_shared(const int *w, int nw, const int *s, int n, int *out) {
    int k = followers(s, n, out);
    for (int i = 1; i + 1 < nw; i++)
        if (w[i - 1] == s[n - 2] && w[i] == s[n - 1] && w[i + 1] >= 0) {
            int dup = 0;
            for (int j = 0; j < k; j++) dup |= out[j] == w[i + 1];
            if (!dup) out[k++] = w[i + 1];
        }
    return k;
}

START_TEST(test_suffix_shared_window) {
    /* Three documents of 8 tokens (9 with their separators) in an index of 20: the first
     * is out (its start is not proposed any more), the last two are in, and it holds 20. */
    SuffixIndex *ix = open_index(20);
    Drafter *d = open_suffix(64, NULL, 0);
    share(d, ix);
    for (int doc = 0; doc < 3; doc++) {
        int t[8];
        for (int i = 0; i < 8; i++) t[i] = 30 + 10 * doc + i;
        suffix_index_add(ix, t, 8);
        ck_assert_int_le(suffix_index_tokens(ix), 20);
    }
    ck_assert_int_eq(suffix_index_tokens(ix), 20);
    Pool *p = calloc(1, sizeof *p);
    int old[] = {1, 30, 31}, mid[] = {2, 40, 41}, last[] = {3, 50, 51};
    grow(d, old, 3, 1, p);
    ck_assert_int_eq(p->n, 0);
    int chain[POOL_MAX_DEPTH];
    grow(d, mid, 3, 1, p);
    ck_assert_int_eq(best_chain(p, chain), 6);
    ck_assert_int_eq(chain[0], 42);
    grow(d, last, 3, 1, p);
    ck_assert_int_eq(best_chain(p, chain), 6);
    ck_assert_int_eq(chain[5], 57);
    /* random documents through small windows: the first level is the brute-force set of
     * followers in the context and the window's last max_tokens tokens */
    Rng r;
    rng_seed(&r, 7);
    for (int trial = 0; trial < 200; trial++) {
        int V = 3 + (int)(rng_next(&r) % 5), N = 2 + (int)(rng_next(&r) % 60);
        SuffixIndex *jx = open_index((size_t)N);
        share(d, jx);
        int all[400], na = 0, ndocs = 1 + (int)(rng_next(&r) % 6);
        for (int doc = 0; doc < ndocs; doc++) {
            int t[40], n = 1 + (int)(rng_next(&r) % 40);
            for (int i = 0; i < n; i++) all[na++] = t[i] = (int)(rng_next(&r) % (uint64_t)V);
            all[na++] = -1;
            suffix_index_add(jx, t, (size_t)n);
        }
        int held = na < N ? na : N;
        ck_assert_int_eq(suffix_index_tokens(jx), held);
        int s[40], n = 2 + (int)(rng_next(&r) % 30);
        for (int i = 0; i < n; i++) s[i] = (int)(rng_next(&r) % (uint64_t)V);
        grow(d, s, n, 1, p);
        int want[16], nw = followers_shared(all + na - held, held, s, n, want);
        if (nw > 0) {
            ck_assert_int_eq(p->root_n_children, nw < POOL_TOPK ? nw : POOL_TOPK);
            for (int k = 0; k < p->root_n_children; k++) {
                int t = p->token[p->root_first_child + k], found = 0;
                for (int j = 0; j < nw; j++) found |= want[j] == t;
                ck_assert_msg(found, "trial %d: token %d never followed the tail", trial, t);
            }
        }
        share(d, NULL);
        suffix_index_destroy(&jx);
    }
    RsErr e = {0};
    SuffixIndex *bad = NULL;
    ck_assert_int_eq(suffix_index_create(1, &bad, &e), RS_EINVAL);
    ck_assert_ptr_null(bad);
    free(p);
    drafter_destroy(&d);
    suffix_index_destroy(&ix);
}
END_TEST

Suite *suite_suffix(void) {
    Suite *s = suite_create("suffix");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_suffix_continues_repeat);
    tcase_add_test(tc, test_suffix_first_level_matches_scan);
    tcase_add_test(tc, test_suffix_longer_match_ranks_first);
    tcase_add_test(tc, test_suffix_corpus_and_errors);
    tcase_add_test(tc, test_suffix_pool_limits);
    tcase_add_test(tc, test_suffix_shared_crosses_requests);
    tcase_add_test(tc, test_suffix_shared_window);
    suite_add_tcase(s, tc);
    return s;
}
