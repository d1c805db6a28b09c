/* CUDA runtime behaviour the backend relies on, checked the same way on a GPU and on the CPU
 * emulator (tests/cuemu/, make cuda-emu-test): stream capture records work without running
 * it; a graph replay reads device memory at replay time (the backend's per-call CuMeta);
 * synchronising a capturing stream fails and invalidates the capture (allocating or a
 * blocking copy during one: asserted on the emulator, reported on a GPU); only device 0
 * exists on a one-GPU machine. On a GPU these also
 * validate the emulator's model of the driver: a failure there means tests/cuemu/ models
 * the driver wrongly (fix the emulator), not that the backend is wrong. */
#include <cuda_runtime_api.h>
#include <string.h>
#include "cuda_testutil.h"
#include "kernels/cuda/cuda_kernels.h"

static float *dput_f(const float *h, size_t n) {
    float *d = NULL;
    CUDA_CHECK(cudaMalloc((void **)&d, n * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

/* x += y captured once, replayed twice with y changed in between: the replay reads y then. */
START_TEST(test_cuda_graph_reads_memory_at_replay) {
    CU_REQUIRE_DEVICE();
    enum { N = 1000 };
    float x[N], y[N], got[N];
    for (int i = 0; i < N; i++) x[i] = (float)i, y[i] = 1.0f;
    float *dx = dput_f(x, N), *dy = dput_f(y, N);
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    cuk_residual_add(s, dx, dy, N);
    CUDA_CHECK(cudaStreamEndCapture(s, &g));
    CUDA_CHECK(cudaMemcpy(got, dx, sizeof got, cudaMemcpyDeviceToHost));
    ck_assert_msg(memcmp(got, x, sizeof got) == 0, "captured work ran during the capture");
    CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    CUDA_CHECK(cudaGraphDestroy(g)); /* the exec outlives its graph */
    CUDA_CHECK(cudaGraphLaunch(ge, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < N; i++) y[i] = 10.0f;
    /* On s, not with cudaMemcpy: a blocking H2D copy from pageable memory may return once
     * the driver has staged y, before the DMA lands, and the non-blocking s is not ordered
     * after the legacy stream, so the replay could still read the old y. */
    CUDA_CHECK(cudaMemcpyAsync(dy, y, sizeof y, cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaGraphLaunch(ge, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    CUDA_CHECK(cudaMemcpy(got, dx, sizeof got, cudaMemcpyDeviceToHost));
    for (int i = 0; i < N; i++) ck_assert_float_eq(got[i], (float)i + 11.0f);
    CUDA_CHECK(cudaGraphExecDestroy(ge));
    CUDA_CHECK(cudaStreamDestroy(s));
    cudaFree(dx), cudaFree(dy);
}
END_TEST

/* Calls the driver refuses while this thread captures (thread-local mode). */
START_TEST(test_cuda_capture_rules) {
    CU_REQUIRE_DEVICE();
    enum { N = 64 };
    float h[N] = {0};
    float *dx = dput_f(h, N);
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t g = (cudaGraph_t)0x1;
    /* synchronising the capturing stream */
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    cuk_residual_add(s, dx, dx, N);
    ck_assert_int_eq(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
    ck_assert_int_eq(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    ck_assert_ptr_null(g);
    cudaGetLastError();
    /* An allocation (potentially synchronising) and a blocking copy from the capturing
     * thread: the emulator refuses both and invalidates the capture. The backend does
     * neither, so a driver that allows them only means the emulator is stricter than
     * needed: on a GPU that is reported, not failed; on the emulator it is asserted. */
    g = (cudaGraph_t)0x1;
    void *p = NULL;
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    cudaError_t mal = cudaMalloc(&p, 256);
    cudaError_t mal_end = cudaStreamEndCapture(s, &g);
    if (g) cudaGraphDestroy(g);
    if (mal == cudaSuccess) cudaFree(p);
    cudaGetLastError();
    g = (cudaGraph_t)0x1;
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    cudaError_t cpy = cudaMemcpy(h, dx, sizeof h, cudaMemcpyDeviceToHost);
    cudaError_t end = cudaStreamEndCapture(s, &g);
    if (g) cudaGraphDestroy(g);
    int as_emulated = mal == cudaErrorStreamCaptureUnsupported &&
                      mal_end == cudaErrorStreamCaptureInvalidated && cpy != cudaSuccess &&
                      end == cudaErrorStreamCaptureInvalidated;
    printf("INFO: during a thread-local capture: cudaMalloc -> %s (EndCapture %s), blocking "
           "cudaMemcpy -> %s (EndCapture %s): %s\n", cudaGetErrorName(mal),
           cudaGetErrorName(mal_end), cudaGetErrorName(cpy), cudaGetErrorName(end),
           as_emulated ? "as the emulator models it"
                       : "DIFFERS from the emulator's model (tests/cuemu is stricter)");
#ifdef ROOTSPEC_CUEMU
    ck_assert_msg(as_emulated, "the emulator must refuse allocation and blocking copies in a capture");
#endif
    /* Informational: how the driver treats an async copy from pageable memory in a capture
     * (the emulator refuses it; the backend never does it). */
    cudaGetLastError();
    g = NULL;
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    cudaError_t pg = cudaMemcpyAsync(dx, h, sizeof h, cudaMemcpyHostToDevice, s);
    cudaError_t pg_end = cudaStreamEndCapture(s, &g);
    printf("INFO: blocking cudaMemcpy during capture -> EndCapture %s; pageable "
           "cudaMemcpyAsync during capture -> %s, EndCapture %s\n", cudaGetErrorName(end),
           cudaGetErrorName(pg), cudaGetErrorName(pg_end));
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
    /* the stream works normally afterwards */
    cuk_residual_add(s, dx, dx, N);
    CUDA_CHECK(cudaStreamSynchronize(s));
    CUDA_CHECK(cudaStreamDestroy(s));
    cudaFree(dx);
}
END_TEST

START_TEST(test_cuda_device_ordinals) {
    CU_REQUIRE_DEVICE();
    int n = 0;
    CUDA_CHECK(cudaGetDeviceCount(&n));
    ck_assert_int_ge(n, 1);
    ck_assert_int_eq(cudaSetDevice(n), cudaErrorInvalidDevice);
    ck_assert_int_eq(cudaGetLastError(), cudaErrorInvalidDevice);
    ck_assert_int_eq(cudaGetLastError(), cudaSuccess);
    CUDA_CHECK(cudaSetDevice(0));
    struct cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    ck_assert_int_ge(prop.maxThreadsPerBlock, 1024);
    ck_assert_int_eq(prop.warpSize, 32);
    printf("INFO: device 0: %s, cc %d.%d, %d SMs\n", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount);
}
END_TEST

Suite *suite_cuda_runtime(void) {
    Suite *s = suite_create("cuda_runtime");
    TCase *tc = tcase_create("runtime");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_cuda_graph_reads_memory_at_replay);
    tcase_add_test(tc, test_cuda_capture_rules);
    tcase_add_test(tc, test_cuda_device_ordinals);
    suite_add_tcase(s, tc);
    return s;
}
