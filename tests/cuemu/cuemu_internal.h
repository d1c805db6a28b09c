/* cuemu_internal.h: state shared by the emulator's runtime (cuemu_runtime.cc), block
 * scheduler (cuemu_device.cc) and cuBLAS (cuemu_cublas.cc). Every stream operation is a
 * closure queued on its stream and run only at a synchronisation point, so host code that
 * reads results early sees stale memory, as it would on a GPU. One global mutex serialises
 * all emulator state and all emulated device work (two backends may live on two threads). */
#ifndef ROOTSPEC_CUEMU_INTERNAL_H
#define ROOTSPEC_CUEMU_INTERNAL_H
#include <cuda_runtime_api.h>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

typedef struct {
    std::string what; /* for diagnostics: kernel name, "memcpy H2D", "cublasGemmEx" */
    std::function<void()> run;
    /* what a captured graph holds it as (cudaGraphNodeGetType); an emulated cuBLAS call
     * is one kernel */
    enum cudaGraphNodeType type;
} cuemu_op_t;
typedef std::shared_ptr<cuemu_op_t> cuemu_op_p;

extern std::mutex cuemu_mu;

/* All of these expect cuemu_mu held. */
void cuemu_init_locked(void);
/* Queues op on s (or records it into s's capture). cudaSuccess or the capture error. */
cudaError_t cuemu_enqueue(cudaStream_t s, cuemu_op_p op);
/* 1 when [p, p + n) lies inside one device allocation. */
int cuemu_is_device_range(const void *p, size_t n);
void cuemu_set_last_error(cudaError_t e);
/* Runs one block-scheduled kernel launch (cuemu_device.cc). */
void cuemu_run_kernel(const char *name, dim3 grid, dim3 block,
                      const std::function<void()> &body);
/* Prints "cuemu: ..." (a diagnostic the code under test provoked) to stderr. */
void cuemu_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prints "cuemu: ..." and aborts: an emulator-detected defect in the code under test. */
[[noreturn]] void cuemu_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#endif
