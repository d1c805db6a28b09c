/* Helpers for the CUDA Check suites (tests/cuda/test_cuda_*.c, run by
 * build/cuda/rootspec-cuda-tests). Without a usable CUDA device every test prints a
 * visible "SKIP: no CUDA device (...)" line and returns: never a silent pass. */
#ifndef ROOTSPEC_CUDA_TESTUTIL_H
#define ROOTSPEC_CUDA_TESTUTIL_H
#include <check.h>
#include <stdio.h>
#include <stdint.h>
#include "kernels/backend.h"

/* 1 when a CUDA device can be used; the reason otherwise (cached after the first call). */
int cu_have_device(void);
const char *cu_no_device_reason(void);
/* Tests skipped so far (printed by the runner's summary). */
extern int cu_n_skipped;

#define CU_REQUIRE_DEVICE()                                                                \
    do {                                                                                   \
        if (!cu_have_device()) {                                                           \
            printf("SKIP: no CUDA device (%s): %s\n", cu_no_device_reason(), __func__);   \
            fflush(stdout);                                                                \
            cu_n_skipped++;                                                                \
            return;                                                                        \
        }                                                                                  \
    } while (0)

/* Like tu_fixture, but falls back to <dir of the executable>/tests/fixtures/ (gpu-bundle).
 * NULL when the file exists in neither place. */
const char *cu_fixture(const char *rel);

/* A backend of ops on m with these sizes (1 thread); the test fails if create does. */
Backend *cu_backend_make(const BackendOps *ops, const Model *m, int cap, int batch, int pend);

/* CUDA vs CPU tolerance: the CUDA backend rounds weights, GEMM inputs and the KV cache to
 * bf16; see tests/cuda/test_cuda_forward.c for the calibration. */
#define CU_TOL_FRAC 0.03f
/* Compares rows (rows, vocab) of logits with atol = CU_TOL_FRAC * max|ref|: returns the
 * mismatches (printing the first), raises *worst to the largest |d|. Top-1 per row must
 * agree unless the reference's own gap is within the tolerance (a bf16-level tie). */
int cu_compare_logits(const char *label, const float *got, const float *ref, int rows, int vocab,
                      float *worst);

/* Causal prefill of tok (n <= 64) on cpu and gpu, commit, then `steps` greedy one-token
 * steps, both fed the CPU's choice; every logits row compared with cu_compare_logits.
 * Returns the mismatches; *agree counts steps whose top-1 agreed (may be NULL). */
int cu_prefill_decode_parity(const char *label, Backend *cpu, Backend *gpu, const int *tok,
                             int n, int steps, int *agree, float *worst);

/* Bitwise comparison of rows x cols floats: 0 when every bit agrees, else the rows that
 * differ, after one line "MISMATCH label: N of M rows differ; first at row R col C (got G,
 * want W); largest |difference| D at row R2 col C2" (NaNs count as differences). The
 * bitwise tests compare everything before failing, so a first GPU run shows how far and
 * where results differ (FMA contraction, libdevice maths), not only that they do. */
int cu_bits_report(const char *label, const float *got, const float *want, int rows, int cols);

/* Independent bf16 round-to-nearest-even (reference for the device conversions). */
float cu_round_bf16(float f);
/* Uniform float in [lo, hi) from a tiny LCG (tests only). */
float cu_randf(uint64_t *state, float lo, float hi);

#endif
