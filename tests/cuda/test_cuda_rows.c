/* Kept logits rows on the CUDA backend (kernels/backend.h): a forward without a logits
 * pointer leaves its rows in device memory; backend_rows_copy brings them back whole, bit
 * for bit what a logits pointer would have received, and d2h_full_rows counts both. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_testutil.h"
#include "kernels/backend.h"
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

Suite *suite_cuda_rows(void) {
    Suite *s = suite_create("cuda_rows");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_cuda_kept_rows_copy);
    suite_add_tcase(s, tc);
    return s;
}
