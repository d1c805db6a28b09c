/* Kept logits rows on the CPU backend (kernels/backend.h): a forward without a logits
 * pointer keeps its rows inside the backend; backend_rows_copy reads them back whole and
 * BackendStats.d2h_full_rows counts every whole row that reaches the host. */
#include "testutil.h"
#include "kernels/backend.h"
#include <stdlib.h>
#include <string.h>

#define VOCAB 96

static Backend *make_backend(const Model *m, int threads) {
    BackendParams p = {.kv_capacity = 64, .max_batch = 16, .max_pending = 32,
                       .threads = threads};
    Backend *b = NULL;
    RsErr e = {0};
    ck_assert_msg(backend_create(&cpu_backend_ops, m, &p, &b, &e) == RS_OK, "%s", e.msg);
    return b;
}

/* Kept rows equal the rows a logits pointer receives, bit for bit; copies count. */
START_TEST(test_kept_rows_copy) {
    Model *m = tu_random_model(ARCH_LLAMA, 32, 48, 2, 4, 2, VOCAB, 77);
    Backend *b = make_backend(m, 1);
    int tok[6] = {1, 5, 9, 2, 7, 3}, pos[6] = {0, 1, 2, 3, 4, 5}, rows[3] = {5, 0, 3};
    float ref[3 * VOCAB], got[3 * VOCAB];
    RsErr e = {0};
    ck_assert_msg(backend_forward(b, tok, pos, 6, NULL, rows, 3, ref, &e) == RS_OK, "%s", e.msg);
    ck_assert_int_eq(backend_stats(b).d2h_full_rows, 3);
    ck_assert_int_eq(backend_n_kept(b), 3);
    backend_kv_reset(b);
    ck_assert_int_eq(backend_n_kept(b), 0);
    ck_assert_msg(backend_forward(b, tok, pos, 6, NULL, rows, 3, NULL, &e) == RS_OK, "%s", e.msg);
    ck_assert_int_eq(backend_stats(b).d2h_full_rows, 3); /* kept, nothing copied */
    ck_assert_int_eq(backend_n_kept(b), 3);
    int want[3] = {2, 0, 1};
    ck_assert_msg(backend_rows_copy(b, want, 3, got, &e) == RS_OK, "%s", e.msg);
    for (int i = 0; i < 3; i++)
        ck_assert_msg(memcmp(got + i * VOCAB, ref + want[i] * VOCAB, sizeof(float) * VOCAB) == 0,
                      "kept row %d differs from the copied one", want[i]);
    ck_assert_int_eq(backend_stats(b).d2h_full_rows, 6);
    int bad = 3;
    ck_assert_int_eq(backend_rows_copy(b, &bad, 1, got, &e), RS_EINVAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "rows[0] = 3 outside the 3 kept rows"));
    ck_assert_int_eq(backend_stats(b).d2h_full_rows, 6);
    /* A forward without output rows keeps none; a failed one changes nothing. */
    int p2[1] = {6}, big = VOCAB;
    ck_assert_int_eq(backend_forward(b, &big, p2, 1, NULL, NULL, 0, NULL, &e), RS_EINVAL);
    ck_assert_int_eq(backend_n_kept(b), 3);
    ck_assert_msg(backend_forward(b, tok, p2, 1, NULL, NULL, 0, NULL, &e) == RS_OK, "%s", e.msg);
    ck_assert_int_eq(backend_n_kept(b), 0);
    ck_assert_int_eq(backend_rows_copy(b, want + 1, 1, got, &e), RS_EINVAL);
    backend_destroy(&b);
    model_destroy(&m);
}
END_TEST

Suite *suite_rows(void) {
    Suite *s = suite_create("rows");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_kept_rows_copy);
    suite_add_tcase(s, tc);
    return s;
}
