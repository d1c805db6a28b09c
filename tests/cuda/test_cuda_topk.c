/* Kept logits rows on the CUDA backend (kernels/backend.h) and their top-k: a forward
 * without a logits pointer leaves its rows in device memory; backend_rows_copy brings them
 * back whole, bit for bit what a logits pointer would have received, and d2h_full_rows
 * counts both; the device top-k (kernels/cuda/cuda_topk.h) agrees with the CPU's. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_testutil.h"
#include "common/logits.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_topk.h"
#include "kernels/cpu/cpu_topk.h"
#include "tests/testutil.h"

#define VOCAB 96

START_TEST(test_cuda_kept_rows_copy) {
    CU_REQUIRE_DEVICE();
    const BackendOps *ops = cuda_backend_ops_get();
    Model *m = tu_random_model(ARCH_LLAMA, 32, 48, 2, 4, 2, VOCAB, 77);
    Backend *b = cu_backend_make(ops, m, 64, 16, 32);
    int tok[6] = {1, 5, 9, 2, 7, 3}, pos[6] = {0, 1, 2, 3, 4, 5}, rows[3] = {5, 0, 3};
    float ref[3 * VOCAB], got[3 * VOCAB];
    RsErr e = {0};
    ck_assert_msg(backend_forward(b, tok, pos, 6, NULL, rows, 3, ref, &e) == RS_OK, "%s", e.msg);
    ck_assert_int_eq(backend_stats(b).d2h_full_rows, 3);
    backend_kv_reset(b);
    ck_assert_int_eq(backend_n_kept(b), 0);
    ck_assert_msg(backend_forward(b, tok, pos, 6, NULL, rows, 3, NULL, &e) == RS_OK, "%s", e.msg);
    ck_assert_int_eq(backend_stats(b).d2h_full_rows, 3);
    ck_assert_int_eq(backend_n_kept(b), 3);
    int want[4] = {2, 0, 1, 2}; /* a run (0, 1) and repeats */
    float got4[4 * VOCAB];
    ck_assert_msg(backend_rows_copy(b, want, 4, got4, &e) == RS_OK, "%s", e.msg);
    for (int i = 0; i < 4; i++)
        ck_assert_msg(memcmp(got4 + i * VOCAB, ref + want[i] * VOCAB, sizeof(float) * VOCAB) == 0,
                      "kept row %d differs from the copied one", want[i]);
    ck_assert_int_eq(backend_stats(b).d2h_full_rows, 7);
    int bad = 3;
    ck_assert_int_eq(backend_rows_copy(b, &bad, 1, got, &e), RS_EINVAL);
    ck_assert_int_eq(backend_stats(b).d2h_full_rows, 7);
    backend_destroy(&b);
    model_destroy(&m);
}
END_TEST

/* The top-k kernel on rows uploaded as they are, against the CPU's fused pass on the same
 * rows: ids exact, lse within 1e-5 * max(1, |lse|), log q within the same plus the lse's
 * difference (log q = row[id] - lse in float on both sides). Rows: noise, heavy ties,
 * -inf columns, one dominant column, all equal, a NaN row; widths around the block size. */
START_TEST(test_cuda_topk_vs_cpu) {
    CU_REQUIRE_DEVICE();
    static const int widths[] = {10, 127, 129, 5000, 70000}; /* 1, 2 and 16 chunks */
    int V = widths[_i], n = 6, k = V < 10 ? V : 10;
    float *rows = malloc(sizeof(float) * (size_t)n * V);
    uint64_t st = 4242 + V;
    for (int r = 0; r < n; r++)
        for (int i = 0; i < V; i++) {
            float u = cu_randf(&st, 0.0f, 1.0f), *x = rows + (size_t)r * V + i;
            *x = r == 0 ? 8 * u - 4 : r == 1 ? floorf(6 * u) : r == 2 ? (u < 0.3f ? -INFINITY : 20 * u)
               : r == 3 ? (i == V / 3 ? 60.0f : -30 * u) : r == 4 ? 1.0f : 0.5f * u;
        }
    rows[(size_t)5 * V + V / 2] = NAN;
    float *d_rows;
    int *d_ids;
    float *d_logq, *d_lse;
    ck_assert(cudaMalloc((void **)&d_rows, sizeof(float) * (size_t)n * V) == cudaSuccess);
    ck_assert(cudaMalloc((void **)&d_ids, sizeof(int) * n * k) == cudaSuccess);
    ck_assert(cudaMalloc((void **)&d_logq, sizeof(float) * n * k) == cudaSuccess);
    ck_assert(cudaMalloc((void **)&d_lse, sizeof(float) * n) == cudaSuccess);
    ck_assert(cudaMemcpy(d_rows, rows, sizeof(float) * (size_t)n * V, cudaMemcpyHostToDevice) ==
              cudaSuccess);
    void *scratch = NULL;
    ck_assert(cudaMalloc(&scratch, cuk_topk_scratch_bytes(n, V)) == cudaSuccess);
    ck_assert(cudaMemset(scratch, 0, cuk_topk_scratch_bytes(n, V)) == cudaSuccess);
    cuk_topk(0, d_rows, n, V, k, scratch, d_ids, d_logq, d_lse);
    int ids[6 * 10], cids[6 * 10];
    float logq[6 * 10], lse[6], clogq[6 * 10], clse[6];
    ck_assert(cudaMemcpy(ids, d_ids, sizeof(int) * n * k, cudaMemcpyDeviceToHost) == cudaSuccess);
    ck_assert(cudaMemcpy(logq, d_logq, sizeof(float) * n * k, cudaMemcpyDeviceToHost) == cudaSuccess);
    ck_assert(cudaMemcpy(lse, d_lse, sizeof(float) * n, cudaMemcpyDeviceToHost) == cudaSuccess);
    /* again on the same scratch: its counters were left ready, the result is the same bits */
    int ids2[6 * 10];
    float lse2[6];
    ck_assert(cudaMemset(d_ids, 0xff, sizeof(int) * n * k) == cudaSuccess);
    ck_assert(cudaMemset(d_lse, 0xff, sizeof(float) * n) == cudaSuccess);
    cuk_topk(0, d_rows, n, V, k, scratch, d_ids, d_logq, d_lse);
    ck_assert(cudaMemcpy(ids2, d_ids, sizeof(int) * n * k, cudaMemcpyDeviceToHost) == cudaSuccess);
    ck_assert(cudaMemcpy(lse2, d_lse, sizeof(float) * n, cudaMemcpyDeviceToHost) == cudaSuccess);
    ck_assert(memcmp(ids, ids2, sizeof(int) * n * k) == 0 && memcmp(lse, lse2, sizeof lse) == 0);
    cudaFree(scratch);
    CpuTopkPart *parts = malloc(sizeof(CpuTopkPart) * (size_t)n);
    cpu_topk(NULL, rows, n, V, k, cids, clogq, clse, parts);
    for (int r = 0; r < n; r++) {
        if (r == 5) { /* NaN row: NaN on both sides, ids unspecified */
            ck_assert_msg(isnan(lse[r]) && isnan(clse[r]), "NaN row: lse %g / %g", (double)lse[r],
                          (double)clse[r]);
            continue;
        }
        for (int j = 0; j < k; j++)
            ck_assert_msg(ids[r * k + j] == cids[r * k + j], "V %d row %d: top-%d id %d, CPU %d",
                          V, r, j, ids[r * k + j], cids[r * k + j]);
        float tol = 1e-5f * fmaxf(1.0f, fabsf(clse[r]));
        ck_assert_msg(fabsf(lse[r] - clse[r]) <= tol, "V %d row %d: lse %.9g, CPU %.9g", V, r,
                      (double)lse[r], (double)clse[r]);
        for (int j = 0; j < k; j++)
            ck_assert(logq[r * k + j] == clogq[r * k + j] || /* -inf columns */
                      fabsf(logq[r * k + j] - clogq[r * k + j]) <= 2 * tol);
    }
    free(parts);
    free(rows);
    cudaFree(d_rows);
    cudaFree(d_ids);
    cudaFree(d_logq);
    cudaFree(d_lse);
}
END_TEST

/* Through the backend: kept rows reduced on the device (no whole row copied) give the ids
 * of the full rows' row_topk. */
START_TEST(test_cuda_backend_topk) {
    CU_REQUIRE_DEVICE();
    const BackendOps *ops = cuda_backend_ops_get();
    Model *m = tu_random_model(ARCH_LLAMA, 32, 48, 2, 4, 2, VOCAB, 79);
    Backend *b = cu_backend_make(ops, m, 64, 16, 32);
    int tok[6] = {1, 5, 9, 2, 7, 3}, pos[6] = {0, 1, 2, 3, 4, 5}, rows[4] = {5, 0, 3, 1};
    int ids[4 * 10], ref[10], all[4] = {0, 1, 2, 3};
    float logq[4 * 10], lse[4], full[4 * VOCAB];
    RsErr e = {0};
    ck_assert(backend_forward(b, tok, pos, 6, NULL, rows, 4, NULL, &e) == RS_OK);
    ck_assert_msg(backend_rows_topk(b, 10, ids, logq, lse, &e) == RS_OK, "%s", e.msg);
    ck_assert_int_eq(backend_stats(b).d2h_full_rows, 0);
    ck_assert(backend_rows_copy(b, all, 4, full, &e) == RS_OK);
    for (int r = 0; r < 4; r++) {
        row_topk(full + r * VOCAB, VOCAB, 10, ref);
        ck_assert(memcmp(ref, ids + r * 10, sizeof ref) == 0);
        double want = row_lse(full + r * VOCAB, VOCAB);
        ck_assert(fabs(lse[r] - want) <= 1e-5 * fmax(1.0, fabs(want)));
    }
    backend_destroy(&b);
    model_destroy(&m);
}
END_TEST

Suite *suite_cuda_topk(void) {
    Suite *s = suite_create("cuda_topk");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_cuda_kept_rows_copy);
    tcase_add_loop_test(tc, test_cuda_topk_vs_cpu, 0, 5);
    tcase_add_test(tc, test_cuda_backend_topk);
    suite_add_tcase(s, tc);
    return s;
}
