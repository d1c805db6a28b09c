/* Runner of the CUDA Check suites (build/cuda/rootspec-cuda-tests). Suites come from
 * tests/cuda/test_cuda_*.c (build/cuda/suites.inc). No fork mode: a CUDA context does not
 * survive fork(). Without a GPU every test prints its own SKIP line, the runner prints a
 * SKIP summary, and the exit status is 0. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include "cuda_testutil.h"

/* The emulator build (make cuda-emu) keeps its own suite list. */
#ifndef CUDA_SUITES_INC
#define CUDA_SUITES_INC "build/cuda/suites.inc"
#endif

#define SUITE(name) Suite *suite_##name(void);
#include CUDA_SUITES_INC
#undef SUITE

int main(void) {
#ifdef ROOTSPEC_CUEMU
    printf("NOTE: CUDA emulator on the CPU: these tests run kernels/cuda/*.cu on tests/cuemu/, not "
           "on a GPU (logic only: indexing, masks, cache slots, stream order, graph capture)\n");
#endif
    if (!cu_have_device())
        printf("SKIP: no CUDA device (%s): every CUDA test below is skipped\n",
               cu_no_device_reason());
    fflush(stdout);
    SRunner *sr = srunner_create(NULL);
    srunner_set_fork_status(sr, CK_NOFORK);
#define SUITE(name) srunner_add_suite(sr, suite_##name());
#include CUDA_SUITES_INC
#undef SUITE
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    if (cu_n_skipped)
        printf("SKIP: %d CUDA test%s skipped: no CUDA device (%s)\n", cu_n_skipped,
               cu_n_skipped == 1 ? "" : "s", cu_no_device_reason());
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
