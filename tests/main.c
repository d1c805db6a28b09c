/* Runs every Check suite in one runner so `make test` ends with one summary line.
 * The suite list is generated from tests/test_*.c file names (build/suites.inc). */
#include <check.h>
#include <stdlib.h>

#define SUITE(name) Suite *suite_##name(void);
#include "build/suites.inc"
#undef SUITE

int main(void) {
    SRunner *sr = srunner_create(NULL);
#define SUITE(name) srunner_add_suite(sr, suite_##name());
#include "build/suites.inc"
#undef SUITE
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
