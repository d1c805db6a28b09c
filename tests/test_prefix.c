/* The CPU backend's prefix cache (kernels/backend.h: Prefix cache): a sequence that attaches
 * another's published blocks computes the same bits as a fresh single-sequence run of its
 * whole path, while the publisher goes on writing its own blocks; decodes through
 * target_prefill emit what they emit without the cache; reference counts keep held
 * blocks, idle ones are taken back least recently used, and every block comes back. */
#include "testutil.h"
#include "common/rng.h"
#include "draft_proc/suffix_drafter.h"
#include "kernels/backend.h"
#include "target_proc/decode.h"
#include <string.h>

#define VOCAB 96
#define CAP 128
#define BLK BACKEND_KV_BLOCK

static Model *prefix_model(void) { return tu_random_model(ARCH_LLAMA, 32, 48, 2, 4, 2, VOCAB, 4242); }

static Backend *prefix_backend(const Model *m, int cap, int seqs, int cache) {
    BackendParams bp = {.kv_capacity = cap, .max_batch = 16, .max_pending = 16, .threads = 2,
                        .max_seqs = seqs, .prefix_cache = cache};
    Backend *b = NULL;
    RsErr e = {0};
    ck_assert_msg(backend_create(&cpu_backend_ops, m, &bp, &b, &e) == RS_OK, "%s", e.msg);
    return b;
}

/* Forwards tokens[0..n) on seq after its committed entries, in chunks of up to 7 rows, and
 * commits them; out (unless NULL) gets the last row's logits. */
static void run_rows(Backend *b, int seq, const int *tokens, int n, float *out) {
    RsErr e = {0};
    int keep[7] = {0, 1, 2, 3, 4, 5, 6};
    for (int off = 0; off < n; off += 7) {
        int m = n - off < 7 ? n - off : 7, pos[7], last = m - 1;
        for (int i = 0; i < m; i++) pos[i] = backend_seq_n_committed(b, seq) + i;
        BackendSeg g = {seq, tokens + off, pos, m, NULL};
        int want = out && off + m == n;
        ck_assert_msg(backend_forward_batch(b, &g, 1, &last, want, want ? out : NULL, &e) == RS_OK,
                      "%s", e.msg);
        ck_assert_msg(backend_seq_commit(b, seq, keep, m, &e) == RS_OK, "%s", e.msg);
    }
}

/* The last row of a fresh causal run of path[0..n) on sequence 0 of ref (no cache). */
static void solo(Backend *ref, const int *path, int n, float *out) {
    backend_kv_reset(ref);
    run_rows(ref, 0, path, n, out);
}

static int same_bits(const char *label, Backend *ref, const int *path, int n, const float *got) {
    float want[VOCAB], mx;
    solo(ref, path, n, want);
    return tu_compare(label, got, want, VOCAB, 0.0f, 0.0f, &mx);
}

static void random_tokens(Rng *r, int *t, int n) {
    for (int i = 0; i < n; i++) t[i] = (int)(rng_next(r) % VOCAB);
}

static int open_seq(Backend *b) {
    int s = -1;
    RsErr e = {0};
    ck_assert_msg(backend_seq_open(b, &s, &e) == RS_OK, "%s", e.msg);
    return s;
}

/* Two sequences share a 2-block prefix: the second attaches it and prefills the rest; both
 * then decode side by side, the publisher writing past the shared blocks. Every row equals
 * a solo run's bits. */
START_TEST(test_prefix_shared_rows_exact) {
    Model *m = prefix_model();
    Backend *b = prefix_backend(m, CAP * 3, 3, 1), *ref = prefix_backend(m, CAP, 1, 0);
    Rng r;
    rng_seed(&r, 77);
    int a[CAP], c[CAP], bad = 0;
    random_tokens(&r, a, CAP);
    memcpy(c, a, sizeof(int) * 2 * BLK + sizeof(int) * 5); /* 37 tokens in common */
    random_tokens(&r, c + 2 * BLK + 5, CAP - 2 * BLK - 5);
    float got[VOCAB];
    int sa = open_seq(b), sc = open_seq(b);
    ck_assert_int_eq(backend_prefix_attach(b, sa, a, 40), 0); /* nothing published yet */
    run_rows(b, sa, a, 40, got);
    bad += same_bits("publisher", ref, a, 40, got);
    backend_prefix_publish(b, sa, a, 40);
    ck_assert_int_eq(backend_kv_usage(b).blocks_cached, 2); /* whole blocks only */
    ck_assert_int_eq(backend_prefix_attach(b, sc, c, 45), 2 * BLK);
    ck_assert_int_eq(backend_seq_n_committed(b, sc), 2 * BLK);
    ck_assert_int_eq(backend_kv_usage(b).blocks_used, 3); /* a's 3, c's 2 of them shared */
    run_rows(b, sc, c + 2 * BLK, 45 - 2 * BLK, got);
    bad += same_bits("attached", ref, c, 45, got);
    for (int len = 40, lc = 45; len < 70; len += 3, lc += 2) { /* both go on */
        run_rows(b, sa, a + len, 3, got);
        bad += same_bits("publisher after sharing", ref, a, len + 3, got);
        run_rows(b, sc, c + lc, 2, got);
        bad += same_bits("attached after sharing", ref, c, lc + 2, got);
    }
    ck_assert_int_eq(bad, 0);
    backend_seq_close(b, sa);
    backend_seq_close(b, sc);
    ck_assert_int_eq(backend_kv_usage(b).blocks_used, 0);
    backend_destroy(&b);
    backend_destroy(&ref);
    model_destroy(&m);
}
END_TEST

/* Past the whole blocks, a prompt takes the run of entries it shares with a published block
 * that follows the same chain, copied into a block of its own: its rows stay exact, the
 * published block stays shared, and without a free block for the copy only the whole
 * blocks are attached. Every block comes back. */
START_TEST(test_prefix_part_rows_exact) {
    Model *m = prefix_model();
    Backend *b = prefix_backend(m, 6 * BLK, 4, 1), *ref = prefix_backend(m, CAP, 1, 0);
    Rng r;
    rng_seed(&r, 13);
    int a[3 * BLK], c[CAP], bad = 0;
    random_tokens(&r, a, 3 * BLK);
    memcpy(c, a, sizeof(int) * (BLK + 9)); /* one block and 9 tokens in common */
    random_tokens(&r, c + BLK + 9, CAP - BLK - 9);
    c[BLK + 9] = (a[BLK + 9] + 1) % VOCAB;
    float got[VOCAB];
    int sa = open_seq(b), sc = open_seq(b), sd = open_seq(b);
    run_rows(b, sa, a, 3 * BLK, NULL);
    backend_prefix_publish(b, sa, a, 3 * BLK);
    ck_assert_int_eq(backend_prefix_attach(b, sc, c, 40), BLK + 9);
    ck_assert_int_eq(backend_kv_usage(b).blocks_used, 4); /* a's 3 and c's copy */
    run_rows(b, sc, c + BLK + 9, 40 - BLK - 9, got);
    bad += same_bits("part attached", ref, c, 40, got);
    ck_assert_int_eq(backend_prefix_attach(b, sd, a, 2 * BLK + 4), 2 * BLK + 4);
    run_rows(b, sd, c + 50, 3, got); /* a's first 36 tokens, then 3 of c's */
    int ad[2 * BLK + 7];
    memcpy(ad, a, sizeof(int) * (2 * BLK + 4));
    memcpy(ad + 2 * BLK + 4, c + 50, sizeof(int) * 3);
    bad += same_bits("part of a full chain", ref, ad, 2 * BLK + 7, got);
    ck_assert_int_eq(bad, 0);
    backend_seq_close(b, sd);
    int se = open_seq(b); /* holds the last free block: c's copy finds none */
    run_rows(b, se, c + 60, BLK, NULL);
    backend_seq_close(b, sc);
    sc = open_seq(b);
    run_rows(b, se, c + 60 + BLK, 2 * BLK, NULL); /* and the two c gave back */
    ck_assert_int_eq(backend_prefix_attach(b, sc, c, 40), BLK);
    backend_seq_close(b, sa);
    backend_seq_close(b, sc);
    backend_seq_close(b, se);
    ck_assert_int_eq(backend_kv_usage(b).blocks_used, 0);
    backend_destroy(&b);
    backend_destroy(&ref);
    model_destroy(&m);
}
END_TEST

/* A prompt that is all cached blocks attaches all of them; its next row is still exact. */
START_TEST(test_prefix_whole_prompt) {
    Model *m = prefix_model();
    Backend *b = prefix_backend(m, CAP * 2, 2, 1), *ref = prefix_backend(m, CAP, 1, 0);
    Rng r;
    rng_seed(&r, 5);
    int a[3 * BLK + 1];
    random_tokens(&r, a, 3 * BLK + 1);
    float got[VOCAB];
    run_rows(b, 0, a, 3 * BLK, NULL); /* sequence 0: the single-sequence path */
    backend_prefix_publish(b, 0, a, 3 * BLK);
    backend_kv_reset(b);
    ck_assert_int_eq(backend_kv_usage(b).blocks_used, 0);
    ck_assert_int_eq(backend_prefix_attach(b, 0, a, 3 * BLK), 3 * BLK);
    ck_assert_int_eq(backend_n_committed(b), 3 * BLK);
    run_rows(b, 0, a + 3 * BLK, 1, got);
    ck_assert_int_eq(same_bits("all cached", ref, a, 3 * BLK + 1, got), 0);
    backend_destroy(&b);
    backend_destroy(&ref);
    model_destroy(&m);
}
END_TEST

/* Without BackendParams.prefix_cache nothing is published or attached. */
START_TEST(test_prefix_off) {
    Model *m = prefix_model();
    Backend *b = prefix_backend(m, CAP, 2, 0);
    int a[2 * BLK] = {0};
    run_rows(b, 0, a, 2 * BLK, NULL);
    backend_prefix_publish(b, 0, a, 2 * BLK);
    ck_assert_int_eq(backend_kv_usage(b).blocks_cached, 0);
    backend_kv_reset(b);
    ck_assert_int_eq(backend_prefix_attach(b, 0, a, 2 * BLK), 0);
    backend_destroy(&b);
    model_destroy(&m);
}
END_TEST

/* Prefills p[0..n) on a fresh sequence (attaching what it can), publishes it, closes it. */
static int cache_prompt(Backend *b, const int *p, int n) {
    int s = open_seq(b), got = backend_prefix_attach(b, s, p, n);
    run_rows(b, s, p + got, n - got, NULL);
    backend_prefix_publish(b, s, p, n);
    backend_seq_close(b, s);
    return got;
}

/* 4 blocks in all. Reference counts keep held blocks; idle ones go least recently used
 * first; a batch that needs blocks held by others fails; every block comes back. */
START_TEST(test_prefix_refcount_lru) {
    Model *m = prefix_model();
    Backend *b = prefix_backend(m, 4 * BLK, 3, 1);
    Rng r;
    rng_seed(&r, 9);
    int p1[2 * BLK], p2[2 * BLK], p3[BLK];
    random_tokens(&r, p1, 2 * BLK);
    random_tokens(&r, p2, 2 * BLK);
    random_tokens(&r, p3, BLK);
    ck_assert_int_eq(cache_prompt(b, p1, 2 * BLK), 0);
    ck_assert_int_eq(cache_prompt(b, p2, 2 * BLK), 0);
    BackendKvUsage u = backend_kv_usage(b);
    ck_assert_int_eq(u.blocks_used, 0);
    ck_assert_int_eq(u.blocks_cached, 4);
    /* two holders of p1: closing one keeps its blocks */
    int s1 = open_seq(b), s2 = open_seq(b);
    ck_assert_int_eq(backend_prefix_attach(b, s1, p1, 2 * BLK), 2 * BLK);
    ck_assert_int_eq(backend_prefix_attach(b, s2, p1, 2 * BLK), 2 * BLK);
    ck_assert_int_eq(backend_kv_usage(b).blocks_used, 2);
    backend_seq_close(b, s1);
    ck_assert_int_eq(backend_kv_usage(b).blocks_used, 2);
    backend_seq_close(b, s2);
    ck_assert_int_eq(backend_kv_usage(b).blocks_used, 0);
    /* p1 was used last: p3's block evicts p2's least recently used one, its second */
    ck_assert_int_eq(cache_prompt(b, p3, BLK), 0);
    s1 = open_seq(b);
    ck_assert_int_eq(backend_prefix_attach(b, s1, p2, 2 * BLK), BLK);
    backend_seq_close(b, s1);
    s1 = open_seq(b);
    ck_assert_int_eq(backend_prefix_attach(b, s1, p1, 2 * BLK), 2 * BLK);
    /* held: p1's 2; s2 takes the 2 idle ones, and a third block is not there */
    s2 = open_seq(b);
    int t[2 * BLK + 1];
    random_tokens(&r, t, 2 * BLK + 1);
    run_rows(b, s2, t, 2 * BLK, NULL);
    int pos = 2 * BLK, row = 0;
    BackendSeg g = {s2, t + 2 * BLK, &pos, 1, NULL};
    RsErr e = {0};
    ck_assert_int_eq(backend_forward_batch(b, &g, 1, &row, 1, NULL, &e), RS_EFULL);
    ck_assert_int_eq(backend_kv_usage(b).blocks_used, 4);
    ck_assert_int_eq(backend_kv_usage(b).blocks_cached, 2); /* p1's: p2 and p3 were evicted */
    backend_seq_close(b, s1);
    backend_seq_close(b, s2);
    u = backend_kv_usage(b);
    ck_assert_int_eq(u.blocks_used, 0);
    ck_assert_int_eq(u.seqs_open, 1);
    backend_destroy(&b);
    model_destroy(&m);
}
END_TEST

/* The chain hash depends on every earlier block, not only the block's own tokens. */
START_TEST(test_prefix_hash_chain) {
    int x[BLK] = {1, 2, 3}, y[BLK] = {1, 2, 4};
    uint64_t hx = backend_prefix_hash(0, x), hy = backend_prefix_hash(0, y);
    ck_assert(hx != hy);
    ck_assert(backend_prefix_hash(hx, x) != backend_prefix_hash(hy, x));
    ck_assert(backend_prefix_hash(hx, x) == backend_prefix_hash(backend_prefix_hash(0, x), x));
}
END_TEST

/* One decode of prompt on t (rule: AR or the draft rule with a fresh suffix drafter). */
static int decode_once(Target *t, const int *prompt, int n, int rule, int sample, int *out,
                       int *cached) {
    Drafter *d = NULL;
    RsErr e = {0};
    if (rule != DECODER_AR) ck_assert_int_eq(drafter_suffix_create(VOCAB, NULL, 0, NULL, &d, &e), RS_OK);
    DecodeOpts opts = {.decoder = rule, .budget = 6, .seed = 3, .max_new = 20, .ignore_eos = 1};
    if (sample) opts.sampling = (Sampling){.temperature = 1.0};
    DecodeResult res = {.tokens = out, .cap = 20 + ROUND_MAX_EMIT};
    ck_assert_msg(decode_run(t, d, prompt, n, &opts, NULL, &res, &e) == RS_OK, "%s", e.msg);
    drafter_destroy(&d);
    *cached = res.prompt_cached;
    return res.n_tokens;
}

/* Decodes through target_prefill (the --parallel 1 server's path): prompts sharing 40
 * tokens, AR and speculative, T=0 and seeded T=1, emit on a target with the cache exactly
 * what they emit on one without, and report the whole blocks they reused. */
START_TEST(test_prefix_decodes_unchanged) {
    Model *m = prefix_model();
    BackendParams bp = {.kv_capacity = 256, .threads = 2, .prefix_cache = 1};
    Target *on = NULL, *off = NULL;
    RsErr e = {0};
    ck_assert_int_eq(target_create(m, &cpu_backend_ops, &bp, NULL, 0, &on, &e), RS_OK);
    bp.prefix_cache = 0;
    ck_assert_int_eq(target_create(m, &cpu_backend_ops, &bp, NULL, 0, &off, &e), RS_OK);
    Rng r;
    rng_seed(&r, 31);
    int prompt[60];
    random_tokens(&r, prompt, 40);
    for (int i = 0; i < 8; i++) {
        int n = 41 + i * 2;
        random_tokens(&r, prompt + 40, n - 40);
        int want[20 + ROUND_MAX_EMIT], got[20 + ROUND_MAX_EMIT], c_on, c_off;
        int rule = i % 2 ? DECODER_DRAFT : DECODER_AR, sample = (i / 2) % 2;
        int nw = decode_once(off, prompt, n, rule, sample, want, &c_off);
        int ng = decode_once(on, prompt, n, rule, sample, got, &c_on);
        ck_assert_int_eq(c_off, 0);
        ck_assert_int_eq(c_on, i == 0 ? 0 : 40); /* 2 whole blocks, 8 entries copied */
        ck_assert_int_eq(ng, nw);
        ck_assert_msg(!memcmp(got, want, sizeof(int) * (size_t)nw), "decode %d differs", i);
    }
    target_destroy(&on);
    target_destroy(&off);
    model_destroy(&m);
}
END_TEST

/* A fork takes a sequence's first 37 entries (2 whole blocks shared, 5 entries copied) after
 * it went on past them; both then decode on, different tokens each, and every row equals a
 * solo run's bits. Without a free block for the copy the fork fails and changes nothing. */
START_TEST(test_prefix_seq_fork_exact) {
    Model *m = prefix_model();
    Backend *b = prefix_backend(m, 6 * BLK, 4, 1), *ref = prefix_backend(m, CAP, 1, 0);
    Rng r;
    rng_seed(&r, 91);
    int a[CAP], c[CAP], bad = 0;
    random_tokens(&r, a, CAP);
    memcpy(c, a, sizeof(int) * 37);
    random_tokens(&r, c + 37, CAP - 37);
    float got[VOCAB];
    RsErr e = {0};
    int sa = open_seq(b), sc = open_seq(b);
    run_rows(b, sa, a, 40, NULL);
    ck_assert_int_eq(backend_seq_fork(b, sa, sc, 37, &e), RS_OK);
    ck_assert_int_eq(backend_seq_n_committed(b, sc), 37);
    ck_assert_int_eq(backend_kv_usage(b).blocks_used, 4); /* a's 3, c's copy of the third */
    for (int la = 40, lc = 37; la < 52; la += 3, lc += 2) {
        run_rows(b, sc, c + lc, 2, got);
        bad += same_bits("fork", ref, c, lc + 2, got);
        run_rows(b, sa, a + la, 3, got);
        bad += same_bits("forked from", ref, a, la + 3, got);
    }
    ck_assert_int_eq(bad, 0);
    backend_seq_close(b, sc);
    ck_assert_int_eq(backend_kv_usage(b).blocks_used, 4); /* a's 52 entries */
    int sd = open_seq(b), se = open_seq(b);
    ck_assert_int_eq(backend_seq_fork(b, sa, sd, 32, &e), RS_OK); /* whole blocks: no copy */
    ck_assert_int_eq(backend_kv_usage(b).blocks_used, 4);
    run_rows(b, sd, a + 32, 32, NULL); /* 2 blocks of its own: none left free */
    ck_assert_int_eq(backend_kv_usage(b).blocks_used, 6);
    ck_assert_int_eq(backend_seq_fork(b, sa, se, 33, &e), RS_EFULL);
    ck_assert_int_eq(backend_seq_n_committed(b, se), 0);
    ck_assert_int_eq(backend_seq_fork(b, sa, se, 16, &e), RS_OK);
    backend_seq_close(b, se);
    backend_seq_close(b, sa);
    backend_seq_close(b, sd);
    ck_assert_int_eq(backend_kv_usage(b).blocks_used, 0);
    backend_destroy(&b);
    backend_destroy(&ref);
    model_destroy(&m);
}
END_TEST

Suite *suite_prefix(void) {
    Suite *s = suite_create("prefix");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_prefix_shared_rows_exact);
    tcase_add_test(tc, test_prefix_part_rows_exact);
    tcase_add_test(tc, test_prefix_whole_prompt);
    tcase_add_test(tc, test_prefix_off);
    tcase_add_test(tc, test_prefix_refcount_lru);
    tcase_add_test(tc, test_prefix_hash_chain);
    tcase_add_test(tc, test_prefix_decodes_unchanged);
    tcase_add_test(tc, test_prefix_seq_fork_exact);
    suite_add_tcase(s, tc);
    return s;
}
