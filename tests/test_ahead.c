/* Work a model drafter keeps between rounds. Run-ahead (drafter_ahead, DESIGN.md §5): a model drafter that guesses the next commit and
 * grows below it between requests must hand out exactly the pools a drafter without
 * run-ahead grows for the same commits: when the commit is the guess (pool ready, or only
 * the guess's first level ready because run-ahead was stopped or the shape changed), and
 * when it is not (the guess taken back to the prefix it shares with the commit, or all of
 * it). A reference drafter on the same model never runs ahead; a probe drafter finds the
 * guess's continuation so that the test can commit exactly the guess. Commits that follow
 * the last pool: the rows its expansions computed for the committed tokens are kept, and
 * the pools must be those of a drafter given the whole context afresh. */
#include "draft_proc/model_drafter.h"
#include "kernels/cpu/cpu_backend.h"
#include "testutil.h"
#include <string.h>

#define HIST_MAX 512

/* drafter_ahead's stop: nonzero once *left passes have been allowed. */
static int stop_after(void *arg) {
    int *left = arg;
    return (*left)-- <= 0;
}

static void check_same(const Pool *a, const Pool *r, int round) {
    ck_assert_msg(a->n == r->n, "round %d: %d candidates, reference %d", round, a->n, r->n);
    for (int i = 0; i < a->n; i++)
        ck_assert_msg(a->token[i] == r->token[i] && a->parent[i] == r->parent[i] &&
                          a->depth[i] == r->depth[i] &&
                          !memcmp(&a->logq[i], &r->logq[i], sizeof a->logq[i]),
                      "round %d: candidate %d is (%d, parent %d, %.9g), reference (%d, parent "
                      "%d, %.9g)", round, i, a->token[i], a->parent[i], a->logq[i], r->token[i],
                      r->parent[i], r->logq[i]);
}

/* The guess the drafter makes below pool p: its best path to the first unexpanded node,
 * then that node's best child, found by growing the probe on the whole context. */
static int guess_of(Drafter *probe, const Pool *p, const int *hist, int nh, int *out) {
    int n = 0, u = p->root_first_child;
    for (; p->n_children[u] > 0; u = p->first_child[u]) out[n++] = p->token[u];
    out[n++] = p->token[u];
    static int ctx[HIST_MAX];
    memcpy(ctx, hist, sizeof(int) * (size_t)nh);
    memcpy(ctx + nh, out, sizeof(int) * (size_t)n);
    static Pool q;
    RsErr e = {0};
    ck_assert_msg(drafter_grow_begin(probe, ctx, nh + n, 1, NULL, 0, &e) == 0, "%s", e.msg);
    ck_assert_msg(drafter_grow_end(probe, &q, &e) == 0, "%s", e.msg);
    out[n++] = q.token[q.root_first_child];
    return n;
}

/* The next commit below pool p, by kind: 0 the guess, 1 the guess's first token then a
 * sibling of its second (shared prefix of one), 2 off the guess from its first token. */
static int next_commit(int kind, Drafter *probe, const Pool *p, const int *hist, int nh,
                       int *out) {
    int u = p->root_first_child;
    if (kind == 0) return guess_of(probe, p, hist, nh, out);
    if (kind == 1 && p->n_children[u] > 0) {
        out[0] = p->token[u];
        out[1] = p->token[p->first_child[u] + 1];
        return 2;
    }
    out[0] = p->token[u + 1];
    out[1] = p->token[u + 2];
    return 2;
}

static const int SHAPE_SEQ[][2] = {{5, 1}, {5, 1}, {3, 2}, {8, 10}, {1, 10}, {5, 1}, {4, 3}};

/* 28 rounds through every case (the shape changes every third round; run-ahead runs to the
 * end every fourth, else stops after 0 to 12 checks of its stop: before the guess, inside a
 * pass (the backend asks between layers), after the guess's first row, or during the pool
 * below it); returns the run-ahead drafter's counters. */
static DrafterAheadStats same_pools(void) {
    RsErr e = {0};
    Model *m = tu_random_model(ARCH_LLAMA, 32, 64, 2, 4, 2, 64, 777);
    Drafter *a = NULL, *r = NULL, *probe = NULL;
    ck_assert_int_eq(drafter_model_create(m, &cpu_backend_ops, TU_BP(HIST_MAX + 128, 1), &a, &e), 0);
    ck_assert_int_eq(drafter_model_create(m, &cpu_backend_ops, TU_BP(HIST_MAX + 128, 1), &r, &e), 0);
    ck_assert_int_eq(drafter_model_create(m, &cpu_backend_ops, TU_BP(HIST_MAX + 128, 1), &probe, &e),
                     0);
    static int hist[HIST_MAX];
    int nh = 6;
    for (int i = 0; i < nh; i++) hist[i] = (i * 13 + 5) % 64;
    static Pool pa, pr;
    int commit[16], nc = nh;
    memcpy(commit, hist, sizeof(int) * (size_t)nh);
    for (int round = 0; round < 28; round++) {
        const int *shape = SHAPE_SEQ[(round / 3) % 7];
        drafter_set_shape(a, shape[0], shape[1]);
        drafter_set_shape(r, shape[0], shape[1]);
        ck_assert_msg(drafter_grow_begin(a, commit, nc, round == 0, NULL, 0, &e) == 0, "%s", e.msg);
        ck_assert_msg(drafter_grow_end(a, &pa, &e) == 0, "%s", e.msg);
        ck_assert_msg(drafter_grow_begin(r, commit, nc, round == 0, NULL, 0, &e) == 0, "%s", e.msg);
        ck_assert_msg(drafter_grow_end(r, &pr, &e) == 0, "%s", e.msg);
        check_same(&pa, &pr, round);
        ck_assert_int_eq(model_drafter_n_committed(a), model_drafter_n_committed(r));
        int left = round % 4 == 1 ? 1000 : (round / 4) % 7 * 2;
        drafter_ahead(a, stop_after, &left);
        if (round) {
            memcpy(hist + nh, commit, sizeof(int) * (size_t)nc);
            nh += nc;
        }
        nc = next_commit(round % 3 == 2 ? 1 + round % 2 : 0, probe, &pr, hist, nh, commit);
        ck_assert(nh + nc < HIST_MAX);
    }
    DrafterAheadStats st = drafter_ahead_stats(a);
    drafter_destroy(&a);
    drafter_destroy(&r);
    drafter_destroy(&probe);
    model_destroy(&m);
    return st;
}

START_TEST(test_ahead_same_pools) {
    DrafterAheadStats st = same_pools();
    fprintf(stderr, "run-ahead: %ld guesses, %ld hits (%ld pools ready), %ld misses; %ld passes "
            "of growth ahead, %ld commits with no commit pass\n", st.guesses, st.hits,
            st.pools_ready, st.misses, st.ahead_passes, st.commits_free);
    ck_assert_msg(st.hits >= 6 && st.pools_ready >= 3 && st.hits > st.pools_ready,
                  "the sequence did not reach every hit case: %ld hits, %ld pools ready",
                  st.hits, st.pools_ready);
    ck_assert_msg(st.misses >= 4, "only %ld misses", st.misses);
}
END_TEST

/* The backend op the guesses rely on: truncation keeps the first n committed entries,
 * refuses more than are committed, and a prefill after it continues at n. */
START_TEST(test_kv_truncate) {
    RsErr e = {0};
    Model *m = tu_random_model(ARCH_LLAMA, 32, 64, 2, 4, 2, 64, 5);
    Backend *b = NULL;
    BackendParams bp = {.kv_capacity = 64, .max_batch = 16, .max_pending = 16, .threads = 1};
    ck_assert_int_eq(backend_create(&cpu_backend_ops, m, &bp, &b, &e), 0);
    int toks[8] = {1, 2, 3, 4, 5, 6, 7, 8}, pos[8], row = 0;
    for (int i = 0; i < 8; i++) pos[i] = i;
    ck_assert_int_eq(backend_forward(b, toks, pos, 8, NULL, NULL, 0, NULL, &e), 0);
    ck_assert_int_eq(backend_kv_commit(b, (int[]){0, 1, 2, 3, 4, 5, 6, 7}, 8, &e), 0);
    ck_assert_int_eq(backend_kv_truncate(b, 9, &e), RS_EINVAL);
    ck_assert_int_eq(backend_kv_truncate(b, 5, &e), 0);
    ck_assert_int_eq(backend_n_committed(b), 5);
    ck_assert_int_eq(backend_n_pending(b), 0);
    /* the token at 5 after truncation sees what a fresh 5-token context gives it */
    int p5 = 5;
    float *l1 = malloc(sizeof(float) * 64), *l2 = malloc(sizeof(float) * 64);
    ck_assert_int_eq(backend_forward(b, &toks[7], &p5, 1, NULL, &row, 1, l1, &e), 0);
    backend_kv_reset(b);
    ck_assert_int_eq(backend_forward(b, toks, pos, 5, NULL, NULL, 0, NULL, &e), 0);
    ck_assert_int_eq(backend_kv_commit(b, (int[]){0, 1, 2, 3, 4}, 5, &e), 0);
    ck_assert_int_eq(backend_forward(b, &toks[7], &p5, 1, NULL, &row, 1, l2, &e), 0);
    ck_assert_msg(!memcmp(l1, l2, sizeof(float) * 64), "logits after truncation differ");
    free(l1);
    free(l2);
    backend_destroy(&b);
    model_destroy(&m);
}
END_TEST

/* backend_kv_commit_stay: entries kept commit, staying ones stay pending with their
 * positions (a token after them sees what it sees with the same tokens committed and
 * pending afresh), and a list naming an entry twice or more entries than are pending is
 * refused. */
START_TEST(test_kv_commit_stay) {
    RsErr e = {0};
    Model *m = tu_random_model(ARCH_LLAMA, 32, 64, 2, 4, 2, 64, 6);
    Backend *b = NULL;
    BackendParams bp = {.kv_capacity = 64, .max_batch = 16, .max_pending = 16, .threads = 1};
    ck_assert_int_eq(backend_create(&cpu_backend_ops, m, &bp, &b, &e), 0);
    /* committed 1 2 3 4 at 0..3; pending: 5 at 4, below it 9 at 5 and 6 at 5, 7 at 6 below 6 */
    int ctx[4] = {1, 2, 3, 4}, cpos[4] = {0, 1, 2, 3}, tok[4] = {5, 9, 6, 7}, pos[4] = {4, 5, 5, 6};
    uint8_t mask[16] = {1, 0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 0, 1, 0, 1, 1};
    ck_assert_int_eq(backend_forward(b, ctx, cpos, 4, NULL, NULL, 0, NULL, &e), 0);
    ck_assert_int_eq(backend_kv_commit(b, (int[]){0, 1, 2, 3}, 4, &e), 0);
    ck_assert_int_eq(backend_forward(b, tok, pos, 4, mask, NULL, 0, NULL, &e), 0);
    ck_assert_int_eq(backend_kv_commit_stay(b, (int[]){0}, 1, (int[]){0, 2}, 2, &e), RS_EINVAL);
    ck_assert_int_eq(backend_kv_commit_stay(b, (int[]){0, 2}, 2, (int[]){3, 1, 0}, 3, &e), RS_EINVAL);
    ck_assert_int_eq(backend_kv_commit_stay(b, (int[]){0}, 1, (int[]){3, 2}, 2, &e), 0);
    ck_assert_int_eq(backend_n_committed(b), 5);
    ck_assert_int_eq(backend_n_pending(b), 2);
    /* token 8 at 7 below the staying rows: 7 at 6 (pending 0) and 6 at 5 (pending 1) */
    int t8 = 8, p7 = 7, row = 0;
    uint8_t m3[3] = {1, 1, 1};
    float *l1 = malloc(sizeof(float) * 64), *l2 = malloc(sizeof(float) * 64);
    ck_assert_int_eq(backend_forward(b, &t8, &p7, 1, m3, &row, 1, l1, &e), 0);
    backend_kv_reset(b);
    int all[8] = {1, 2, 3, 4, 5, 6, 7, 8}, apos[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    ck_assert_int_eq(backend_forward(b, all, apos, 8, NULL, (int[]){7}, 1, l2, &e), 0);
    ck_assert_msg(!memcmp(l1, l2, sizeof(float) * 64), "logits after the staying entries differ");
    free(l1);
    free(l2);
    backend_destroy(&b);
    model_destroy(&m);
}
END_TEST

/* A forward stopped by the caller's check (backend_set_stop), before the pass or between
 * any two layers, changes nothing: the pending entries, the kept rows and the KV blocks
 * stay as they were, and the pass run again gives the bits of a backend never stopped. */
START_TEST(test_forward_stop) {
    RsErr e = {0};
    Model *m = tu_random_model(ARCH_LLAMA, 32, 64, 3, 4, 2, 64, 17);
    Backend *b = NULL, *r = NULL;
    BackendParams bp = {.kv_capacity = 64, .max_batch = 16, .max_pending = 32, .threads = 1};
    ck_assert_int_eq(backend_create(&cpu_backend_ops, m, &bp, &b, &e), 0);
    ck_assert_int_eq(backend_create(&cpu_backend_ops, m, &bp, &r, &e), 0);
    int ctx[18], cpos[18];
    for (int i = 0; i < 18; i++) ctx[i] = (i * 7 + 3) % 64, cpos[i] = i;
    float *kept = malloc(sizeof(float) * 64), *l1 = malloc(sizeof(float) * 64 * 3),
          *l2 = malloc(sizeof(float) * 64 * 3), *again = malloc(sizeof(float) * 64);
    /* 15 pending rows kept as row 0; the next pass (3 rows) needs a second KV block */
    ck_assert_int_eq(backend_forward(b, ctx, cpos, 15, NULL, (int[]){14}, 1, kept, &e), 0);
    ck_assert_int_eq(backend_forward(r, ctx, cpos, 15, NULL, (int[]){14}, 1, NULL, &e), 0);
    BackendKvUsage u0 = backend_kv_usage(b);
    for (int left = 0; left <= 3; left++) { /* before the pass, before each of 3 layers */
        int calls = left;
        backend_set_stop(b, stop_after, &calls);
        ck_assert_int_eq(backend_forward(b, ctx + 15, cpos + 15, 3, NULL, (int[]){0, 1, 2}, 3,
                                         l1, &e), RS_ESTOPPED);
        backend_set_stop(b, NULL, NULL);
        BackendKvUsage u = backend_kv_usage(b);
        ck_assert_int_eq(backend_n_pending(b), 15);
        ck_assert_int_eq(backend_n_kept(b), 1);
        ck_assert_int_eq(u.blocks_used, u0.blocks_used);
        ck_assert_int_eq(backend_rows_copy(b, (int[]){0}, 1, again, &e), 0);
        ck_assert_msg(!memcmp(kept, again, sizeof(float) * 64), "stop after %d checks: the "
                      "kept row changed", left);
    }
    ck_assert_int_eq(backend_forward(b, ctx + 15, cpos + 15, 3, NULL, (int[]){0, 1, 2}, 3, l1, &e), 0);
    ck_assert_int_eq(backend_forward(r, ctx + 15, cpos + 15, 3, NULL, (int[]){0, 1, 2}, 3, l2, &e), 0);
    ck_assert_msg(!memcmp(l1, l2, sizeof(float) * 64 * 3), "logits after stopped passes differ");
    free(kept);
    free(l1);
    free(l2);
    free(again);
    backend_destroy(&b);
    backend_destroy(&r);
    model_destroy(&m);
}
END_TEST

/* The next commit below pool p, by kind: 0 down the best path through every expanded node
 * then its first child (a chain accepted whole, plus the bonus token), 1 the best path's
 * first `len` nodes then a sibling of the next (accepted to a depth, then a correction in
 * the pool), 2 a token the pool does not hold. */
static int path_commit(int kind, int len, const Pool *p, int *out) {
    int n = 0, u = p->root_first_child;
    if (kind == 2) {
        for (int tok = 0;; tok++) {
            int in = 0;
            for (int k = 0; k < p->root_n_children; k++) in |= p->token[p->root_first_child + k] == tok;
            if (!in) {
                out[0] = tok;
                out[1] = (tok + 7) % 64;
                return 2;
            }
        }
    }
    for (; (kind == 0 || n < len) && p->n_children[u] > 0; u = p->first_child[u]) out[n++] = p->token[u];
    if (kind == 0) {
        out[n++] = p->token[u];
        return n;
    }
    int sib = u + 1 < p->n && p->parent[u + 1] == p->parent[u] ? u + 1 : u;
    out[n++] = p->token[sib];
    out[n++] = (p->token[sib] + 3) % 64;
    return n;
}

/* Commits along the last pool keep its expansions' rows: every pool equals, bit for bit,
 * the pool of a drafter that gets the whole context afresh each round (no row kept), over
 * chains and wider pools, commits accepted whole, to a depth, and off the pool. */
START_TEST(test_commit_keeps_rows) {
    static const int shapes[][2] = {{5, 1}, {5, 1}, {3, 2}, {8, 10}, {4, 3}};
    RsErr e = {0};
    Model *m = tu_random_model(ARCH_LLAMA, 32, 64, 2, 4, 2, 64, 4242);
    Drafter *a = NULL, *r = NULL;
    ck_assert_int_eq(drafter_model_create(m, &cpu_backend_ops, TU_BP(HIST_MAX + 128, 1), &a, &e), 0);
    ck_assert_int_eq(drafter_model_create(m, &cpu_backend_ops, TU_BP(HIST_MAX + 128, 1), &r, &e), 0);
    static int hist[HIST_MAX];
    static Pool pa, pr;
    int nh = 5, commit[16], nc = 0;
    for (int i = 0; i < nh; i++) hist[i] = (i * 11 + 3) % 64;
    for (int round = 0; round < 30; round++) {
        const int *shape = shapes[round % 5];
        drafter_set_shape(a, shape[0], shape[1]);
        drafter_set_shape(r, shape[0], shape[1]);
        const int *send = round ? commit : hist;
        ck_assert_msg(drafter_grow_begin(a, send, round ? nc : nh, round == 0, NULL, 0, &e) == 0, "%s", e.msg);
        ck_assert_msg(drafter_grow_end(a, &pa, &e) == 0, "%s", e.msg);
        ck_assert_msg(drafter_grow_begin(r, hist, nh, 1, NULL, 0, &e) == 0, "%s", e.msg);
        ck_assert_msg(drafter_grow_end(r, &pr, &e) == 0, "%s", e.msg);
        check_same(&pa, &pr, round);
        nc = path_commit(round % 3, 1 + round % 4, &pa, commit);
        ck_assert(nh + nc < HIST_MAX);
        memcpy(hist + nh, commit, sizeof(int) * (size_t)nc);
        nh += nc;
    }
    DrafterAheadStats st = drafter_ahead_stats(a);
    fprintf(stderr, "commits: %ld rows kept, %ld run\n", st.rows_kept, st.rows_run);
    ck_assert_msg(st.rows_kept >= 30, "only %ld rows kept", st.rows_kept);
    drafter_destroy(&a);
    drafter_destroy(&r);
    model_destroy(&m);
}
END_TEST

/* The best unexpanded node of p by the pool's ranking. */
static int best_unexpanded(const Pool *p) {
    int best = -1;
    for (int u = 0; u < p->n; u++)
        if (!p->n_children[u] && (best < 0 || pool_rank_cmp(p, u, best) < 0)) best = u;
    return best;
}

/* Growth ahead (guesses that seldom hit): between rounds the drafter expands its last
 * pool's best unexpanded nodes. Commits that end on them, or one token past them, must
 * give the pools a drafter given the whole context afresh grows, bit for bit, also where
 * the next pool's expansions are rows that ran ahead (kept pending across the commit,
 * backend_kv_commit_stay); the first ten commits leave the pool, so the guesses' hit rate
 * falls and growth ahead takes over. */
START_TEST(test_growth_ahead_same_pools) {
    RsErr e = {0};
    Model *m = tu_random_model(ARCH_LLAMA, 32, 64, 2, 4, 2, 64, 991);
    Drafter *a = NULL, *r = NULL, *probe = NULL;
    ck_assert_int_eq(drafter_model_create(m, &cpu_backend_ops, TU_BP(HIST_MAX + 128, 1), &a, &e), 0);
    ck_assert_int_eq(drafter_model_create(m, &cpu_backend_ops, TU_BP(HIST_MAX + 128, 1), &r, &e), 0);
    ck_assert_int_eq(drafter_model_create(m, &cpu_backend_ops, TU_BP(HIST_MAX + 128, 1), &probe, &e), 0);
    static int hist[HIST_MAX], ctx[HIST_MAX];
    static Pool pa, pr, q;
    int nh = 5, commit[16], nc = 0;
    for (int i = 0; i < nh; i++) hist[i] = (i * 5 + 2) % 64;
    for (int round = 0; round < 36; round++) {
        int shape = round % 4 == 3 ? 3 : 5; /* chains 5,1 and a narrow tree 3,2 */
        drafter_set_shape(a, shape, shape == 5 ? 1 : 2);
        drafter_set_shape(r, shape, shape == 5 ? 1 : 2);
        ck_assert_msg(drafter_grow_begin(a, round ? commit : hist, round ? nc : nh, round == 0,
                                         NULL, 0, &e) == 0, "%s", e.msg);
        ck_assert_msg(drafter_grow_end(a, &pa, &e) == 0, "%s", e.msg);
        ck_assert_msg(drafter_grow_begin(r, hist, nh, 1, NULL, 0, &e) == 0, "%s", e.msg);
        ck_assert_msg(drafter_grow_end(r, &pr, &e) == 0, "%s", e.msg);
        check_same(&pa, &pr, round);
        int left = 1000;
        drafter_ahead(a, stop_after, &left);
        if (round < 10) {
            nc = path_commit(2, 0, &pa, commit);
        } else { /* the path to the best unexpanded node, then (every other round) its best child */
            int u = best_unexpanded(&pa), n = 0, path[POOL_MAX_DEPTH + 1];
            for (int v = u; v >= 0; v = pa.parent[v]) path[n++] = pa.token[v];
            for (nc = 0; nc < n; nc++) commit[nc] = path[n - 1 - nc];
            if (round % 2) {
                memcpy(ctx, hist, sizeof(int) * (size_t)nh);
                memcpy(ctx + nh, commit, sizeof(int) * (size_t)nc);
                ck_assert_msg(drafter_grow_begin(probe, ctx, nh + nc, 1, NULL, 0, &e) == 0, "%s", e.msg);
                ck_assert_msg(drafter_grow_end(probe, &q, &e) == 0, "%s", e.msg);
                commit[nc++] = q.token[q.root_first_child];
            }
        }
        ck_assert(nh + nc < HIST_MAX);
        memcpy(hist + nh, commit, sizeof(int) * (size_t)nc);
        nh += nc;
    }
    DrafterAheadStats st = drafter_ahead_stats(a);
    fprintf(stderr, "growth ahead: %ld passes, %ld commits with no commit pass, %ld expansions "
            "taken from it, %ld guesses\n", st.ahead_passes, st.commits_free, st.expansions_free,
            st.guesses);
    ck_assert_msg(st.ahead_passes >= 10 && st.commits_free >= 8 && st.expansions_free >= 4,
                  "growth ahead: %ld passes, %ld commits with no commit pass, %ld expansions "
                  "taken", st.ahead_passes, st.commits_free, st.expansions_free);
    drafter_destroy(&a);
    drafter_destroy(&r);
    drafter_destroy(&probe);
    model_destroy(&m);
}
END_TEST

Suite *suite_ahead(void) {
    Suite *s = suite_create("ahead");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_ahead_same_pools);
    tcase_add_test(tc, test_kv_truncate);
    tcase_add_test(tc, test_kv_commit_stay);
    tcase_add_test(tc, test_forward_stop);
    tcase_add_test(tc, test_commit_keeps_rows);
    tcase_add_test(tc, test_growth_ahead_same_pools);
    suite_add_tcase(s, tc);
    return s;
}
