/* The EAGLE-3 head on the CUDA backend (kernels/cuda/cuda_eagle3.cu) against the CPU head
 * (kernels/cpu/cpu_eagle3.c, itself checked against the torch reference by tests/test_eagle3.c):
 * random:eagle3-tiny drafting for random:tiny (its embeddings), the same script on both:
 * a chunked commit of target features, three tree-expansion steps with ancestor masks and
 * the parents' own states, then two rounds of commit + full pool growth (710 candidates).
 * Tolerance: cu_compare_logits (|d| <= CU_TOL_FRAC * max|ref|: the CUDA head rounds
 * weights, GEMM inputs and its KV cache to bf16), states likewise against max|ref state|;
 * top-10 draft ids per row identical; pools identical in tokens, parents and depths, log q
 * within CU_TOL_FRAC of the candidates' spread (the CUDA runner's pools take each pass's
 * top-10 from the device-side reduction, Eagle3LayerOps.topk, mapped through d2t). Pools are not compared bit for bit: log q
 * inherits the bf16 rounding, and the ranking that picks the nodes to expand compares
 * those sums. */
#include <math.h>
#include <string.h>
#include "common/logits.h"
#include "common/randmodel.h"
#include "cuda_testutil.h"
#include "draft_proc/eagle3_drafter.h"
#include "draft_proc/eagle3_forward.h"
#include "kernels/backend.h"
#include "tests/testutil.h"

typedef struct {
    Model *m;
    Eagle3Head *h;
    Eagle3Runner *cpu, *gpu;
    int D, DV, F;
    float worst_logit, worst_state;
} Pair;

static void pair_open(Pair *p, int cap, int max_batch) {
    RsErr e = {0};
    memset(p, 0, sizeof *p);
    ck_assert_msg(backend_model_load(&cpu_backend_ops, "random:tiny,seed=21", NULL, &p->m, &e) == 0,
                  "%s", e.msg);
    ck_assert_msg(eagle3_head_random("random:eagle3-tiny,seed=4", 1, &p->h, &e) == 0, "%s", e.msg);
    int layers[EAGLE3_N_FEATURES];
    ck_assert_msg(eagle3_head_check(p->h, &p->m->cfg, layers, &e) == 0, "%s", e.msg);
    Eagle3Embed em = {.table = p->m->w.tok_embeddings};
    const Eagle3LayerOps *cu = eagle3_layer_for(cuda_backend_ops_get(), &e);
    ck_assert_msg(cu != NULL, "%s", e.msg);
    ck_assert_str_eq(cu->name, "cuda");
    BackendParams bp = {.kv_capacity = cap, .max_batch = max_batch, .threads = 1};
    ck_assert(eagle3_runner_create_on(p->h, &em, eagle3_layer_for(NULL, &e), &bp, &p->cpu, &e) == 0);
    ck_assert_msg(eagle3_runner_create_on(p->h, &em, cu, &bp, &p->gpu, &e) == 0, "%s", e.msg);
    ck_assert_str_eq(eagle3_runner_backend(p->gpu), "cuda");
    p->D = p->h->cfg.c.dim;
    p->DV = p->h->cfg.draft_vocab;
    p->F = EAGLE3_N_FEATURES * p->h->cfg.target_hidden;
}

static void pair_close(Pair *p) {
    eagle3_runner_destroy(&p->cpu);
    eagle3_runner_destroy(&p->gpu);
    ck_assert_ptr_null(p->gpu);
    eagle3_head_destroy(&p->h);
    model_destroy(&p->m);
}

/* rows of logits and states (CUDA vs CPU) and each row's top 10 draft ids: identical when
 * strict, else a different id at a rank must be a tie in the CPU's own logits (the two ids'
 * CPU logits within the logits tolerance); *swaps counts those. */
static void compare_rows(Pair *p, const char *label, const float *lg, const float *lc,
                         const float *sg, const float *sc, int n, int strict, int *swaps) {
    ck_assert_int_eq(cu_compare_logits(label, lg, lc, n, p->DV, &p->worst_logit), 0);
    float scale = 0, mx = 0, lscale = 0;
    for (size_t i = 0; i < (size_t)n * p->D; i++) scale = fmaxf(scale, fabsf(sc[i]));
    for (size_t i = 0; i < (size_t)n * p->DV; i++) lscale = fmaxf(lscale, fabsf(lc[i]));
    ck_assert_int_eq(tu_compare(label, sg, sc, (size_t)n * p->D, CU_TOL_FRAC * scale, 0, &mx), 0);
    p->worst_state = fmaxf(p->worst_state, mx / scale);
    for (int r = 0; r < n; r++) {
        const float *c = lc + (size_t)r * p->DV;
        int ig[10], ic[10];
        row_topk(lg + (size_t)r * p->DV, p->DV, 10, ig);
        row_topk(c, p->DV, 10, ic);
        for (int k = 0; k < 10; k++) {
            if (ig[k] == ic[k]) continue;
            ck_assert_msg(!strict && fabsf(c[ig[k]] - c[ic[k]]) <= CU_TOL_FRAC * lscale,
                          "%s row %d top-%d: cuda draft id %d, cpu %d (cpu logits %g, %g)", label,
                          r, k, ig[k], ic[k], (double)c[ig[k]], (double)c[ic[k]]);
            ++*swaps;
        }
    }
}

static void feats_of(float *f, const int *tok, int n, int F) {
    for (int i = 0; i < n; i++)
        for (int k = 0; k < F; k++) f[(size_t)i * F + k] = rs_rand_unit(1000 + (uint64_t)tok[i], k);
}

/* Commit on both, compare the last row. */
static void commit_both(Pair *p, const int *tok, int n, float *sc, float *lc, float *sg, float *lg,
                        const char *label, int strict) {
    float *f = malloc(sizeof(float) * (size_t)n * p->F);
    feats_of(f, tok, n, p->F);
    RsErr e = {0};
    ck_assert_msg(eagle3_commit(p->cpu, tok, f, n, sc, lc, &e) == 0, "%s", e.msg);
    ck_assert_msg(eagle3_commit(p->gpu, tok, f, n, sg, lg, &e) == 0, "%s", e.msg);
    int swaps = 0;
    compare_rows(p, label, lg, lc, sg, sc, 1, strict, &swaps);
    free(f);
}

START_TEST(test_cuda_eagle3_layer_match_cpu) {
    CU_REQUIRE_DEVICE();
    Pair p;
    pair_open(&p, 128, 10);
    int D = p.D, DV = p.DV, tok[12];
    for (int i = 0; i < 12; i++) tok[i] = (i * 37 + 5) % 512;
    float *sc = malloc(sizeof(float) * 8 * D), *sg = malloc(sizeof(float) * 8 * D);
    float *lc = malloc(sizeof(float) * 8 * DV), *lg = malloc(sizeof(float) * 8 * DV);
    commit_both(&p, tok, 12, sc, lc, sg, lg, "eagle3 cuda commit (2 chunks)", 1);
    /* three drafting steps: 2 roots' children, then 2 grandchildren, then 3 rows */
    float *root = malloc(sizeof(float) * D), *prev_c = malloc(sizeof(float) * 8 * D);
    float *prev_g = malloc(sizeof(float) * 8 * D);
    memcpy(root, sc, sizeof(float) * D);
    int ntok[3][3] = {{7, 300}, {41, 42}, {5, 6, 511}}, nrow[3] = {2, 2, 3};
    /* mask rows over [pending before, this step]: ancestors and self */
    uint8_t m0[2 * 2] = {1, 0, 0, 1};
    uint8_t m1[2 * 4] = {1, 0, 1, 0, 0, 1, 0, 1};
    uint8_t m2[3 * 7] = {1, 0, 1, 0, 1, 0, 0, /**/ 0, 1, 0, 1, 0, 1, 0, /**/ 1, 0, 1, 0, 0, 0, 1};
    const uint8_t *masks[3] = {m0, m1, m2};
    int parent[3][3] = {{-1, -1}, {0, 1}, {0, 1, 0}}; /* rows of the previous step */
    RsErr e = {0};
    for (int s = 0; s < 3; s++) {
        int n = nrow[s], pos[3];
        float *inc = malloc(sizeof(float) * n * D), *ing = malloc(sizeof(float) * n * D);
        for (int i = 0; i < n; i++) {
            pos[i] = eagle3_node_pos(p.cpu, s + 1);
            memcpy(inc + (size_t)i * D, parent[s][i] < 0 ? root : prev_c + (size_t)parent[s][i] * D,
                   sizeof(float) * D);
            memcpy(ing + (size_t)i * D, parent[s][i] < 0 ? sg : prev_g + (size_t)parent[s][i] * D,
                   sizeof(float) * D);
        }
        ck_assert(eagle3_expand(p.cpu, ntok[s], inc, pos, masks[s], n, lc, sc, &e) == 0);
        ck_assert(eagle3_expand(p.gpu, ntok[s], ing, pos, masks[s], n, lg, sg, &e) == 0);
        char label[64];
        snprintf(label, sizeof label, "eagle3 cuda drafting step %d", s + 1);
        int swaps = 0;
        compare_rows(&p, label, lg, lc, sg, sc, n, 1, &swaps);
        memcpy(prev_c, sc, sizeof(float) * n * D);
        memcpy(prev_g, sg, sizeof(float) * n * D);
        free(inc);
        free(ing);
    }
    ck_assert_int_eq(eagle3_n_pending(p.gpu), 7);
    fprintf(stderr, "eagle3 cuda vs cpu: max |logit d| %.4g, max |state d| / max|state| %.4g\n",
            (double)p.worst_logit, (double)p.worst_state);
    free(root), free(prev_c), free(prev_g), free(sc), free(sg), free(lc), free(lg);
    pair_close(&p);
}
END_TEST

/* Children [first, first + 10) of one expanded node against the CPU head's logits `row`
 * for the same node: each child's log q within tol of the CPU's log q of the same token,
 * and of the CPU's rank-k log q (so a different id at a rank is a tie; counted in swaps).
 * Returns the largest |log q d|. */
static float check_children(Pair *p, const Pool *g, int first, const float *row, float tol,
                            int *swaps) {
    int ids[POOL_TOPK];
    float lq[POOL_TOPK], mx = 0, lse = (float)row_lse(row, p->DV);
    eagle3_topk(p->h, row, POOL_TOPK, ids, lq);
    for (int k = 0; k < POOL_TOPK; k++) {
        int c = first + k, dv = 0;
        while (dv < p->DV && p->h->d2t[dv] != g->token[c]) dv++;
        ck_assert_int_lt(dv, p->DV);
        float same = fabsf(fminf(row[dv] - lse, 0) - g->logq[c]);
        float rank = fabsf(fminf(lq[k], 0) - g->logq[c]);
        ck_assert_msg(same <= tol && rank <= tol, "node %d (token %d): cuda log q %g, cpu %g, "
                      "cpu rank-%d %g (tol %g)", c, g->token[c], (double)g->logq[c],
                      (double)(row[dv] - lse), k, (double)lq[k], (double)tol);
        mx = fmaxf(mx, fmaxf(same, rank));
        *swaps += ids[k] != g->token[c];
    }
    return mx;
}

/* Replays the CUDA pool's tree on the CPU runner (same expanded nodes per pass, masks,
 * positions; each node's state is its parent's CPU output) and checks every expanded node's
 * children against the CPU's top 10 (check_children). */
static void replay_pool(Pair *p, const Pool *g, const float *root_state, const float *root_logits) {
    int D = p->D, DV = p->DV, slot[POOL_MAX], swaps = 0, n_exp = 0;
    float *st = malloc(sizeof(float) * POOL_N_EXPANDED * D), *in = malloc(sizeof(float) * 10 * D);
    float *lg = malloc(sizeof(float) * 10 * DV), tol = 0, mx;
    for (int i = 0; i < DV; i++) tol = fmaxf(tol, fabsf(root_logits[i]));
    tol *= CU_TOL_FRAC;
    mx = check_children(p, g, 0, root_logits, tol, &swaps);
    RsErr e = {0};
    for (int depth = 1; depth < POOL_MAX_DEPTH; depth++) {
        int nodes[10], n = 0, tok[10], pos[10], np = eagle3_n_pending(p->cpu), cols;
        for (int u = 0; u < g->n; u++) /* expanded = has children; pool order */
            if (g->depth[u] == depth && u + 1 < g->n)
                for (int c = u + 1; c < g->n; c++)
                    if (g->parent[c] == u) { nodes[n++] = u; break; }
        ck_assert_int_eq(n, POOL_EXPAND);
        cols = np + n;
        uint8_t *mask = calloc((size_t)n * cols, 1);
        for (int k = 0; k < n; k++) {
            int u = nodes[k];
            tok[k] = g->token[u];
            pos[k] = eagle3_node_pos(p->cpu, depth);
            mask[k * cols + np + k] = 1;
            for (int a = g->parent[u]; a >= 0; a = g->parent[a]) mask[k * cols + slot[a]] = 1;
            memcpy(in + (size_t)k * D, g->parent[u] < 0 ? root_state : st + (size_t)slot[g->parent[u]] * D,
                   sizeof(float) * D);
        }
        ck_assert_msg(eagle3_expand(p->cpu, tok, in, pos, mask, n, lg, st + (size_t)np * D, &e) == 0,
                      "%s", e.msg);
        for (int k = 0; k < n; k++) {
            slot[nodes[k]] = np + k;
            int first = 0;
            while (g->parent[first] != nodes[k]) first++;
            mx = fmaxf(mx, check_children(p, g, first, lg + (size_t)k * DV, tol, &swaps));
            n_exp++;
        }
        free(mask);
    }
    fprintf(stderr, "eagle3 cuda pool replayed on the cpu: %d expanded nodes, max |log q d| %.4g "
            "(tol %.4g), %d of %d ranks hold a tie-swapped id\n", n_exp, (double)mx, (double)tol,
            swaps, POOL_MAX);
    free(st), free(in), free(lg);
}

START_TEST(test_cuda_eagle3_pools_match_cpu) {
    CU_REQUIRE_DEVICE();
    Pair p;
    pair_open(&p, 256, 10);
    int D = p.D, DV = p.DV, tok[9];
    float *sc = malloc(sizeof(float) * D), *sg = malloc(sizeof(float) * D);
    float *lc = malloc(sizeof(float) * DV), *lg = malloc(sizeof(float) * DV);
    Pool *pg = malloc(sizeof *pg);
    RsErr e = {0};
    int n = 9;
    for (int i = 0; i < n; i++) tok[i] = (i * 91 + 17) % 512;
    for (int round = 0; round < 3; round++) {
        char label[64];
        snprintf(label, sizeof label, "eagle3 cuda round %d commit", round);
        commit_both(&p, tok, n, sc, lc, sg, lg, label, 0);
        ck_assert_msg(eagle3_grow_pool(p.gpu, sg, lg, pg, &e) == 0, "%s", e.msg);
        ck_assert_int_eq(pg->n, POOL_MAX);
        replay_pool(&p, pg, sc, lc);
        /* next round: the deepest candidate's path as the accepted tokens */
        int u = pg->n - 1, path[POOL_MAX_DEPTH], k = 0;
        for (; u >= 0; u = pg->parent[u]) path[k++] = pg->token[u];
        for (n = 0; n < k && n < 4; n++) tok[n] = path[k - 1 - n];
    }
    free(sc), free(sg), free(lc), free(lg), free(pg);
    pair_close(&p);
}
END_TEST

/* The drafter selects the CUDA head from the backend it is given (in process, the target's
 * backend) and grows a full pool; a missing device ordinal is refused by name. */
START_TEST(test_cuda_eagle3_drafter_backend) {
    CU_REQUIRE_DEVICE();
    Model *m = NULL;
    Drafter *d = NULL;
    RsErr e = {0};
    /* the target as the CUDA backend loads it: no host weights, embedding rows from its seed */
    ck_assert(backend_model_load(cuda_backend_ops_get(), "random:tiny,seed=21", NULL, &m, &e) == 0);
    ck_assert_ptr_null(m->arena);
    BackendParams bp = {.kv_capacity = 256, .device = 0};
    ck_assert_msg(drafter_eagle3_open("random:eagle3-tiny,seed=4", m, EAGLE3_IDS_AUTO,
                                      cuda_backend_ops_get(), &bp,
                                      &d, &e) == 0, "%s", e.msg);
    int tok[6] = {1, 2, 3, 4, 5, 6};
    float *f = calloc(6 * 192, sizeof(float));
    Pool *pool = malloc(sizeof *pool);
    ck_assert_msg(drafter_grow_begin(d, tok, 6, 1, f, sizeof(float) * 6 * 192, &e) == 0, "%s", e.msg);
    ck_assert_msg(drafter_grow_end(d, pool, &e) == 0, "%s", e.msg);
    ck_assert_int_eq(pool->n, POOL_MAX);
    drafter_destroy(&d);
    bp.device = 7;
    ck_assert_int_eq(drafter_eagle3_open("random:eagle3-tiny", m, EAGLE3_IDS_AUTO,
                                         cuda_backend_ops_get(), &bp, &d,
                                         &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "CUDA device 7 does not exist"), "%s", e.msg);
    free(f), free(pool);
    model_destroy(&m);
}
END_TEST

Suite *suite_cuda_eagle3(void) {
    Suite *s = suite_create("cuda_eagle3");
    TCase *tc = tcase_create("eagle3");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_cuda_eagle3_layer_match_cpu);
    tcase_add_test(tc, test_cuda_eagle3_pools_match_cpu);
    tcase_add_test(tc, test_cuda_eagle3_drafter_backend);
    suite_add_tcase(s, tc);
    return s;
}
