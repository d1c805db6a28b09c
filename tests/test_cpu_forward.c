/* CPU backend KV-cache semantics on tiny random models: a token's logits must not depend on
 * how it was scheduled. Tree passes (explicit masks), multi-pass rounds and compacted caches
 * are checked against a fresh causal run of the same token path; capacity errors by message. */
#include "testutil.h"
#include "common/rng.h"
#include "kernels/backend.h"
#include <string.h>

#define VOCAB 96
#define CAP 96
#define TREE_N 20
#define TOL 0.0f /* bitwise: a row does not depend on its batch (kernels/cpu/cpu_qmatmul.h) */

typedef struct {
    const char *name;
    Arch arch;
    int rope_scaling;
} ArchCase;

static const ArchCase cases[] = {
    {"llama", ARCH_LLAMA, 0},
    {"llama3-rope", ARCH_LLAMA, 1},
    {"qwen2-bias", ARCH_QWEN2, 0},
    {"qwen3-qknorm", ARCH_QWEN3, 0},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

static Model *case_model(int ci) {
    /* 4 query heads over 2 kv heads: exercises GQA grouping. */
    Model *m = tu_random_model(cases[ci].arch, 32, 48, 2, 4, 2, VOCAB, 1000 + ci);
    if (cases[ci].rope_scaling) {
        /* Small original context so positions > 4 already fall in the scaled bands. */
        m->cfg.rope_scaling = 1;
        m->cfg.rope_factor = 8.0f;
        m->cfg.rope_low_freq_factor = 1.0f;
        m->cfg.rope_high_freq_factor = 4.0f;
        m->cfg.rope_orig_max_pos = 32;
    }
    return m;
}

static Backend *make_backend(const Model *m, int cap, int max_batch, int max_pending) {
    BackendParams bp = {.kv_capacity = cap, .max_batch = max_batch, .max_pending = max_pending,
                        .threads = 1};
    Backend *b = NULL;
    RsErr e = {0};
    int rc = backend_create(&cpu_backend_ops, m, &bp, &b, &e);
    ck_assert_msg(rc == RS_OK, "create: %s", e.msg);
    return b;
}

/* Reference: fresh cache, the whole sequence as one causal batch, last row's logits. */
static void fresh_logits(Backend *ref, const int *seq, int len, float *out) {
    int pos[CAP];
    for (int i = 0; i < len; i++) pos[i] = i;
    int last = len - 1;
    RsErr e = {0};
    backend_kv_reset(ref);
    int rc = backend_forward(ref, seq, pos, len, NULL, &last, 1, out, &e);
    ck_assert_msg(rc == RS_OK, "fresh forward: %s", e.msg);
    ck_assert_int_eq(backend_n_pending(ref), len);
}

static void prefill(Backend *b, const int *seq, int len) {
    int pos[CAP], all[CAP];
    for (int i = 0; i < len; i++) {
        pos[i] = backend_n_committed(b) + i;
        all[i] = i;
    }
    RsErr e = {0};
    ck_assert_msg(backend_forward(b, seq, pos, len, NULL, NULL, 0, NULL, &e) == RS_OK, "%s",
                  e.msg);
    ck_assert_msg(backend_kv_commit(b, all, len, &e) == RS_OK, "%s", e.msg);
}

/* Path of node i (root-side first) as indices; returns its length. */
static int node_path(const int *parent, int i, int *path) {
    int n = 0, tmp[TREE_N + 8];
    for (int u = i; u >= 0; u = parent[u]) tmp[n++] = u;
    for (int k = 0; k < n; k++) path[k] = tmp[n - 1 - k];
    return n;
}

/* Compares logits row `got` for node i with a fresh run of ctx + path(i). */
static int check_node(Backend *ref, const int *ctx, int n_ctx, const int *tok, const int *parent,
                      int i, const float *got, const char *what) {
    int seq[CAP], path[TREE_N + 8];
    memcpy(seq, ctx, n_ctx * sizeof(int));
    int d = node_path(parent, i, path);
    for (int k = 0; k < d; k++) seq[n_ctx + k] = tok[path[k]];
    float want[VOCAB], mx;
    fresh_logits(ref, seq, n_ctx + d, want);
    char label[96];
    snprintf(label, sizeof label, "%s node %d (depth %d)", what, i, d);
    return tu_compare(label, got, want, VOCAB, TOL, TOL, &mx);
}

START_TEST(test_tree_mask) {
    Model *m = case_model(_i);
    Backend *b = make_backend(m, CAP, 32, 32), *ref = make_backend(m, CAP, 64, 64);
    Rng r;
    rng_seed(&r, 77 + _i);
    int ctx[8], n_ctx = 8;
    for (int i = 0; i < n_ctx; i++) ctx[i] = (int)(rng_next(&r) % VOCAB);
    prefill(b, ctx, n_ctx);
    int tok[TREE_N], parent[TREE_N], pos[TREE_N], depth[TREE_N], rows[TREE_N];
    uint8_t mask[TREE_N * TREE_N] = {0};
    for (int i = 0; i < TREE_N; i++) {
        tok[i] = (int)(rng_next(&r) % VOCAB);
        parent[i] = i == 0 ? -1 : (int)(rng_next(&r) % (i + 1)) - 1; /* -1 = root level */
        depth[i] = parent[i] < 0 ? 0 : depth[parent[i]] + 1;
        pos[i] = n_ctx + depth[i];
        for (int u = i; u >= 0; u = parent[u]) mask[i * TREE_N + u] = 1;
        rows[i] = i;
    }
    static float logits[TREE_N * VOCAB];
    RsErr e = {0};
    ck_assert_msg(backend_forward(b, tok, pos, TREE_N, mask, rows, TREE_N, logits, &e) == RS_OK,
                  "%s", e.msg);
    int bad = 0, maxd = 0;
    for (int i = 0; i < TREE_N; i++) {
        bad += check_node(ref, ctx, n_ctx, tok, parent, i, logits + i * VOCAB, cases[_i].name);
        if (depth[i] > maxd) maxd = depth[i];
    }
    ck_assert_msg(maxd >= 2, "tree too shallow to test anything (max depth %d)", maxd);
    ck_assert_msg(bad == 0, "%s: %d logits differ from fresh path runs", cases[_i].name, bad);
    backend_destroy(&b);
    backend_destroy(&ref);
    ck_assert_ptr_null(b);
    model_destroy(&m);
}
END_TEST

/* Drafter-style round: pass 1 expands 4 nodes, pass 2 adds children of pass-1 nodes and of
 * its own earlier nodes; pass-2 mask rows span (4 earlier pending + this batch). */
START_TEST(test_multi_pass) {
    Model *m = case_model(_i);
    Backend *b = make_backend(m, CAP, 16, 32), *ref = make_backend(m, CAP, 64, 64);
    Rng r;
    rng_seed(&r, 555 + _i);
    int ctx[6], n_ctx = 6;
    for (int i = 0; i < n_ctx; i++) ctx[i] = (int)(rng_next(&r) % VOCAB);
    prefill(b, ctx, n_ctx);
    /* Global node numbering = pending index. Pass 1: nodes 0..3; pass 2: nodes 4..9. */
    int parent[10] = {-1, -1, 0, 1, 0, 2, 4, 3, -1, 8};
    int tok[10], pos[10], depth[10];
    for (int i = 0; i < 10; i++) {
        tok[i] = (int)(rng_next(&r) % VOCAB);
        depth[i] = parent[i] < 0 ? 0 : depth[parent[i]] + 1;
        pos[i] = n_ctx + depth[i];
    }
    static float logits[10 * VOCAB];
    uint8_t m1[4 * 4] = {0}, m2[6 * 10] = {0};
    for (int i = 0; i < 10; i++)
        for (int u = i; u >= 0; u = parent[u]) {
            if (i < 4) m1[i * 4 + u] = 1;
            else m2[(i - 4) * 10 + u] = 1;
        }
    int rows[6] = {0, 1, 2, 3, 4, 5};
    RsErr e = {0};
    ck_assert_msg(backend_forward(b, tok, pos, 4, m1, rows, 4, logits, &e) == RS_OK, "%s", e.msg);
    ck_assert_msg(backend_forward(b, tok + 4, pos + 4, 6, m2, rows, 6, logits + 4 * VOCAB, &e) ==
                      RS_OK,
                  "%s", e.msg);
    ck_assert_int_eq(backend_n_pending(b), 10);
    int bad = 0;
    for (int i = 0; i < 10; i++)
        bad += check_node(ref, ctx, n_ctx, tok, parent, i, logits + i * VOCAB, cases[_i].name);
    ck_assert_msg(bad == 0, "%s: %d logits differ after a two-pass round", cases[_i].name, bad);
    backend_destroy(&b);
    backend_destroy(&ref);
    model_destroy(&m);
}
END_TEST

/* Tree pass, commit one root-to-leaf path, then one more token: must equal a fresh prefill.
 * The second round orders a child before its parent in the batch, so the keep list is not
 * ascending (exercises the staged copy). */
START_TEST(test_kv_compaction) {
    Model *m = case_model(_i);
    Backend *b = make_backend(m, CAP, 32, 32), *ref = make_backend(m, CAP, 64, 64);
    Rng r;
    rng_seed(&r, 999 + _i);
    int seq[CAP], n_seq = 5;
    for (int i = 0; i < n_seq; i++) seq[i] = (int)(rng_next(&r) % VOCAB);
    prefill(b, seq, n_seq);
    int tok[TREE_N], parent[TREE_N], pos[TREE_N], depth[TREE_N];
    uint8_t mask[TREE_N * TREE_N] = {0};
    for (int i = 0; i < TREE_N; i++) {
        tok[i] = (int)(rng_next(&r) % VOCAB);
        parent[i] = i == 0 ? -1 : (int)(rng_next(&r) % i); /* one root-level node: node 0 */
        depth[i] = parent[i] < 0 ? 0 : depth[parent[i]] + 1;
        pos[i] = n_seq + depth[i];
        for (int u = i; u >= 0; u = parent[u]) mask[i * TREE_N + u] = 1;
    }
    int leaf = 0;
    for (int i = 0; i < TREE_N; i++)
        if (depth[i] > depth[leaf]) leaf = i;
    ck_assert_int_ge(depth[leaf], 2);
    RsErr e = {0};
    ck_assert_msg(backend_forward(b, tok, pos, TREE_N, mask, NULL, 0, NULL, &e) == RS_OK, "%s",
                  e.msg);
    int path[TREE_N + 8], d = node_path(parent, leaf, path);
    ck_assert_msg(backend_kv_commit(b, path, d, &e) == RS_OK, "%s", e.msg);
    ck_assert_int_eq(backend_n_committed(b), n_seq + d);
    ck_assert_int_eq(backend_n_pending(b), 0);
    for (int k = 0; k < d; k++) seq[n_seq++] = tok[path[k]];

    /* Round 2: batch [child c, parent p, sibling s] with c -> p; keep {p, c} = {1, 0}. */
    int t2[3] = {(int)(rng_next(&r) % VOCAB), (int)(rng_next(&r) % VOCAB),
                 (int)(rng_next(&r) % VOCAB)};
    int p2[3] = {n_seq + 1, n_seq, n_seq};
    uint8_t mk2[9] = {1, 1, 0, /**/ 0, 1, 0, /**/ 0, 0, 1};
    ck_assert_msg(backend_forward(b, t2, p2, 3, mk2, NULL, 0, NULL, &e) == RS_OK, "%s", e.msg);
    int keep2[2] = {1, 0};
    ck_assert_msg(backend_kv_commit(b, keep2, 2, &e) == RS_OK, "%s", e.msg);
    seq[n_seq++] = t2[1];
    seq[n_seq++] = t2[0];

    int next = (int)(rng_next(&r) % VOCAB), npos = n_seq, row = 0;
    float got[VOCAB], want[VOCAB], mx;
    ck_assert_msg(backend_forward(b, &next, &npos, 1, NULL, &row, 1, got, &e) == RS_OK, "%s",
                  e.msg);
    seq[n_seq++] = next;
    fresh_logits(ref, seq, n_seq, want);
    int bad = tu_compare(cases[_i].name, got, want, VOCAB, TOL, TOL, &mx);
    ck_assert_msg(bad == 0, "%s: %d logits differ after compaction (max |d| %g)",
                  cases[_i].name, bad, mx);
    /* Dropping all pending entries leaves the committed context as it was. */
    ck_assert_msg(backend_kv_commit(b, NULL, 0, &e) == RS_OK, "%s", e.msg);
    ck_assert_int_eq(backend_n_committed(b), n_seq - 1);
    backend_destroy(&b);
    backend_destroy(&ref);
    model_destroy(&m);
}
END_TEST

static void expect_err(int rc, const RsErr *e, const char *want) {
    ck_assert_int_eq(rc, RS_EINVAL);
    ck_assert_int_eq(e->code, RS_EINVAL);
    ck_assert_msg(strstr(e->msg, want) != NULL, "message '%s' lacks '%s'", e->msg, want);
}

START_TEST(test_capacity_errors) {
    Model *m = case_model(0);
    Backend *b = make_backend(m, 12, 8, 6);
    int tok[16] = {0}, pos[16];
    for (int i = 0; i < 16; i++) pos[i] = i;
    int all[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    RsErr e = {0};
    expect_err(backend_forward(b, tok, pos, 9, NULL, NULL, 0, NULL, &e), &e,
               "batch of 9 tokens exceeds max_batch 8");
    /* 7 tokens fit max_batch but not max_pending 6. */
    expect_err(backend_forward(b, tok, pos, 7, NULL, NULL, 0, NULL, &e), &e,
               "batch of 7 tokens exceeds max_pending 6 (pending 0)");
    ck_assert_int_eq(backend_forward(b, tok, pos, 4, NULL, NULL, 0, NULL, &e), RS_OK);
    expect_err(backend_forward(b, tok, pos + 4, 3, NULL, NULL, 0, NULL, &e), &e,
               "batch of 3 tokens exceeds max_pending 6 (pending 4)");
    ck_assert_int_eq(backend_n_pending(b), 4); /* a failed call changes nothing */
    expect_err(backend_kv_commit(b, (int[]){0, 2, 0}, 3, &e), &e, "keeps pending entry 0 twice");
    expect_err(backend_kv_commit(b, (int[]){4}, 1, &e), &e, "keep[0] = 4 outside the 4 pending");
    expect_err(backend_kv_commit(b, all, 5, &e), &e, "kv_commit of 5 entries with 4 pending");
    ck_assert_int_eq(backend_kv_commit(b, all, 4, &e), RS_OK);
    ck_assert_int_eq(backend_forward(b, tok, pos + 4, 5, NULL, NULL, 0, NULL, &e), RS_OK);
    ck_assert_int_eq(backend_kv_commit(b, all, 5, &e), RS_OK);
    ck_assert_int_eq(backend_n_committed(b), 9);
    expect_err(backend_forward(b, tok, pos + 9, 4, NULL, NULL, 0, NULL, &e), &e,
               "batch of 4 tokens exceeds KV capacity 12 (committed 9, pending 0)");
    tok[1] = VOCAB;
    expect_err(backend_forward(b, tok, pos + 9, 2, NULL, NULL, 0, NULL, &e), &e,
               "token 96 at batch index 1 outside vocabulary [0, 96)");
    tok[1] = 0;
    static float row[VOCAB];
    expect_err(backend_forward(b, tok, pos + 9, 2, NULL, (int[]){2}, 1, row, &e), &e,
               "out_rows[0] = 2 outside [0, 2)");
    uint8_t bad_mask[4] = {1, 0, 1, 0};
    expect_err(backend_forward(b, tok, pos + 9, 2, bad_mask, NULL, 0, NULL, &e), &e,
               "mask row 1 does not attend to its own token");
    ck_assert_int_eq(backend_n_pending(b), 0);
    /* stats: the two successful forwards (4 + 5 tokens) only; no CUDA counters on the CPU */
    BackendStats st = backend_stats(b);
    ck_assert_uint_eq(st.forwards, 2);
    ck_assert_uint_eq(st.tokens, 9);
    ck_assert_uint_eq(st.graph_replays + st.eager_launches + st.graph_captures, 0);
    ck_assert_int_eq(backend_kv_capacity(b), 12);
    ck_assert_int_eq(backend_params(b).max_pending, 6);
    ck_assert_str_eq(backend_name(b), "cpu");
    ck_assert_ptr_eq(backend_model(b), m);
    backend_kv_reset(b);
    ck_assert_int_eq(backend_n_committed(b), 0);
    backend_destroy(&b);
    ck_assert_ptr_null(b);
    backend_destroy(&b); /* NULL *b: no-op */
    backend_destroy(NULL);

    BackendParams bp = {.kv_capacity = 0, .max_batch = 4, .max_pending = 4};
    expect_err(backend_create(&cpu_backend_ops, m, &bp, &b, &e), &e, "kv_capacity 0");
    ck_assert_ptr_null(b);
    model_destroy(&m);
}
END_TEST

Suite *suite_cpu_forward(void) {
    Suite *s = suite_create("cpu_forward");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_tree_mask, 0, N_CASES);
    tcase_add_loop_test(tc, test_multi_pass, 0, N_CASES);
    tcase_add_loop_test(tc, test_kv_compaction, 0, N_CASES);
    tcase_add_test(tc, test_capacity_errors);
    suite_add_tcase(s, tc);
    return s;
}
