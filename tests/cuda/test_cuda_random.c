/* Random-weight models on the CUDA backend and the no-allocation rule:
 * - a "random:" model whose weights the CUDA backend makes on the device from the seed
 *   must equal the CPU backend running the host-materialised copy of the same spec (the
 *   GPU pipeline timing relies on it); a wrong seed, order or scale moves logits by
 *   O(max|ref|), far beyond the bf16 tolerance;
 * - once every bucket's graph is captured, the decode loop (forwards of every size, tree
 *   masks, out-of-order commits, resets) allocates no device memory: cudaMemGetInfo's free
 *   bytes move by at most FREE_SLACK = 2 MiB (the driver's own bookkeeping, e.g. graph
 *   launch resources, may move a few pages on a real GPU; an allocation per forward would
 *   pass the bound over the loop's 30 forwards unless under ~70 KB; the emulator moves by
 *   exactly 0).
 * Tolerance: cu_compare_logits (|d| <= CU_TOL_FRAC * max|ref| over the compared rows, top-1
 * identical unless the reference's own gap is within that tolerance). */
#include <cuda_runtime_api.h>
#include <math.h>
#include <string.h>
#include "common/randmodel.h"
#include "common/rng.h"
#include "cuda_testutil.h"
#include "kernels/backend.h"
#include "tests/testutil.h"

static const char *kSpecs[] = {
    "random:tiny,seed=11",
    "random:tiny,seed=12,arch=qwen2,tied=1",
    "random:tiny,seed=13,arch=qwen3,layers=3",
};

START_TEST(test_cuda_random_model_matches_cpu) {
    CU_REQUIRE_DEVICE();
    const char *spec = kSpecs[_i];
    Model *host = NULL, *dev = NULL;
    RsErr e = {0};
    ck_assert_msg(backend_model_load(&cpu_backend_ops, spec, NULL,
                                     &host, &e) == RS_OK, "%s", e.msg);
    ck_assert_msg(backend_model_load(cuda_backend_ops_get(), spec, NULL, &dev, &e) == RS_OK, "%s",
                  e.msg);
    ck_assert_ptr_nonnull(host->arena);
    ck_assert_ptr_null(dev->arena); /* the CUDA backend must make these weights itself */
    Backend *cpu = cu_backend_make(&cpu_backend_ops, host, 64, 16, 16);
    Backend *gpu = cu_backend_make(cuda_backend_ops_get(), dev, 64, 16, 16);
    int V = host->cfg.vocab_size, n = 12, tok[12];
    for (int i = 0; i < n; i++) tok[i] = (i * 41 + 3) % V;
    float worst = 0;
    ck_assert_int_eq(cu_prefill_decode_parity(spec, cpu, gpu, tok, n, 4, NULL, &worst), 0);
    backend_destroy(&cpu), backend_destroy(&gpu);
    model_destroy(&dev), model_destroy(&host);
}
END_TEST

/* One decode-loop round of n tokens on top of `pending` earlier ones: a tree mask (each node
 * sees its parent chain: node i's parent is (i - 1) / 2) then an out-of-order commit. */
static void tree_round(Backend *b, int n, int base_pos, float *logits) {
    int tok[65], pos[65], rows[65], keep[3];
    uint8_t mask[65 * 65];
    memset(mask, 0, sizeof mask);
    int V = backend_model(b)->cfg.vocab_size;
    for (int i = 0; i < n; i++) {
        int d = 0;
        for (int a = i; a > 0; a = (a - 1) / 2) d++;
        tok[i] = (i * 13 + base_pos) % V, pos[i] = base_pos + d, rows[i] = i;
        for (int a = i;; a = (a - 1) / 2) {
            mask[i * n + a] = 1;
            if (a == 0) break;
        }
    }
    RsErr e = {0};
    ck_assert_msg(backend_forward(b, tok, pos, n, mask, rows, n, logits, &e) == RS_OK, "%s",
                  e.msg);
    int nk = n >= 3 ? 3 : 1; /* root, then a deeper node before a shallower one */
    keep[0] = 0, keep[1] = n - 1, keep[2] = 1;
    ck_assert_msg(backend_kv_commit(b, keep, nk, &e) == RS_OK, "%s", e.msg);
}

#define FREE_SLACK (2 << 20) /* bytes of driver-side movement tolerated */

START_TEST(test_cuda_no_alloc_in_decode_loop) {
    CU_REQUIRE_DEVICE();
    Model *m = NULL;
    RsErr e = {0};
    ck_assert_int_eq(backend_model_load(cuda_backend_ops_get(), "random:tiny,seed=3", NULL, &m, &e),
                     RS_OK);
    Backend *b = cu_backend_make(cuda_backend_ops_get(), m, 1024, 128, 128);
    float *lg = malloc(sizeof(float) * 128 * (size_t)m->cfg.vocab_size);
    int sizes[] = {1, 2, 3, 5, 9, 17, 33, 40, 60, 65};
    int ns = (int)(sizeof sizes / sizeof sizes[0]);
    /* warm-up: every bucket captured once, and every call the loop makes (a reset too) made
     * once, so lazily loaded kernel modules (CUDA_MODULE_LOADING=LAZY, the default) are in */
    for (int k = 0; k < ns; k++) tree_round(b, sizes[k], backend_n_committed(b), lg);
    backend_kv_reset(b);
    tree_round(b, sizes[0], backend_n_committed(b), lg);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    size_t free0 = 0, total0 = 0, free1 = 0, total1 = 0;
    ck_assert_int_eq(cudaMemGetInfo(&free0, &total0), cudaSuccess);
    uint64_t replays0 = backend_stats(b).graph_replays;
    for (int r = 0; r < 3; r++) {
        for (int k = 0; k < ns; k++) tree_round(b, sizes[(k * 7 + r) % ns], backend_n_committed(b), lg);
        backend_kv_reset(b);
    }
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    ck_assert_int_eq(cudaMemGetInfo(&free1, &total1), cudaSuccess);
    fprintf(stderr, "decode loop: %d forwards, %llu graph replays, device free %zu -> %zu bytes\n",
            3 * ns, (unsigned long long)(backend_stats(b).graph_replays - replays0), free0, free1);
    size_t moved = free1 > free0 ? free1 - free0 : free0 - free1;
    fprintf(stderr, "decode loop: free memory moved by %zu bytes (bound %d)\n", moved, FREE_SLACK);
    ck_assert_msg(moved <= FREE_SLACK, "device memory moved in the decode loop: %zu -> %zu free",
                  free0, free1);
    if (backend_stats(b).graph_replays == replays0)
        fprintf(stderr, "(graphs off: BackendSwitches.cuda_eager, ROOTSPEC_CUDA_GRAPHS=0)\n");
    free(lg);
    backend_destroy(&b);
    model_destroy(&m);
}
END_TEST

Suite *suite_cuda_random(void) {
    Suite *s = suite_create("cuda_random");
    TCase *tc = tcase_create("random");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_cuda_random_model_matches_cpu, 0, 3);
    tcase_add_test(tc, test_cuda_no_alloc_in_decode_loop);
    suite_add_tcase(s, tc);
    return s;
}
