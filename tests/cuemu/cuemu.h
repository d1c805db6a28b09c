/* cuemu.h: device-code side of the rootspec CUDA emulator (tests/cuemu/). The CUDA
 * sources (the .cu files of kernels/cuda/) are compiled by g++ with `-x c++ -DROOTSPEC_CUEMU -include
 * tests/cuemu/cuemu.h`, so this header turns the CUDA C++ dialect they use into plain
 * C++17: __shared__ becomes `static` (valid because the emulator runs one block at a time
 * on one OS thread), threadIdx & co. read the current fiber's coordinates, __syncthreads
 * and warp shuffles yield to the block scheduler (cuemu_device.cc), and CUK_LAUNCH (see
 * kernels/cuda/cuda_device.cuh) enqueues a kernel with its argument values converted to the
 * parameter types at launch time, as the <<<>>> syntax does. The real toolkit headers
 * supply the host-side types (dim3, cudaError_t, __nv_bfloat16 with host conversions).
 * It is a logic harness (indexing, barriers, stream order), not a performance model. */
#ifndef ROOTSPEC_CUEMU_H
#define ROOTSPEC_CUEMU_H
#ifdef __cplusplus
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <functional>
#include <memory>
#include <string.h>
#include <stdint.h>
#include <tuple>
#include <type_traits>
#include <utility>

/* Host mode of the toolkit headers already empties these; redefine in case a toolkit
 * version does not, and make __shared__ a static (one block runs at a time). The section
 * lets the emulator poison shared memory at block start and bound its total
 * (cuemu_device.cc; GCC ignores the section for statics of templates). */
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __forceinline__
#undef __launch_bounds__
#define __global__
#define __device__
#define __launch_bounds__(...) /* a register budget for ptxas: nothing to do on the host */
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __shared__ static __attribute__((section("cuemu_shared")))

/* The current fiber's thread coordinates; the block scheduler updates these pointers. */
typedef struct {
    uint3 tid;
} cuemu_lane_t;
extern cuemu_lane_t *cuemu_cur_lane;
extern uint3 cuemu_cur_block;
extern dim3 cuemu_cur_block_dim, cuemu_cur_grid_dim;

#define threadIdx (static_cast<const uint3 &>(cuemu_cur_lane->tid))
#define blockIdx (static_cast<const uint3 &>(cuemu_cur_block))
#define blockDim (static_cast<const dim3 &>(cuemu_cur_block_dim))
#define gridDim (static_cast<const dim3 &>(cuemu_cur_grid_dim))

void cuemu_syncthreads(void);
/* Exchanges 8 bytes among the lanes of mask (a warp-level barrier); returns the value of
 * lane ^ lane_mask within groups of width lanes. */
uint64_t cuemu_shfl_xor_bits(unsigned mask, uint64_t bits, int lane_mask, int width);
/* Enqueues a launch of body (run once per thread) on stream s; checks the launch limits. */
void cuemu_launch_impl(const char *name, dim3 grid, dim3 block, size_t shmem, cudaStream_t s,
                       std::function<void()> body);

#define __syncthreads() cuemu_syncthreads()

/* A 16-byte vector access must be 16-byte aligned on a GPU (a misaligned one faults there,
 * while memcpy here would not): the kernels' vector loads and stores assert it. */
[[noreturn]] void cuemu_misaligned(const void *p, unsigned align, const char *what);
#define CUEMU_ASSERT_ALIGNED(p, align, what)                                                \
    do {                                                                                   \
        if ((uintptr_t)(const void *)(p) & ((align) - 1u)) cuemu_misaligned((p), (align), (what)); \
    } while (0)

template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value,
                  "cuemu: __shfl_xor_sync of a type wider than 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    b = cuemu_shfl_xor_bits(mask, b, lane_mask, width);
    T r;
    memcpy(&r, &b, sizeof r);
    return r;
}

/* Blocks run one at a time on one OS thread, so a device atomic is a plain
 * read-modify-write and a memory fence has nothing to order. */
static inline unsigned atomicAdd(unsigned *p, unsigned v) {
    unsigned old = *p;
    *p = old + v;
    return old;
}
static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
    unsigned long long old = *p;
    *p = old + v;
    return old;
}
static inline unsigned atomicMin(unsigned *p, unsigned v) {
    unsigned old = *p;
    if (v < old) *p = v;
    return old;
}
static inline void __threadfence(void) {}

/* Device-side integer min/max of the CUDA math library (host C++ has only std::min). */
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }

/* The emulator's kernel launch: arguments are converted to the kernel's parameter types
 * now (their values are baked in, as a captured graph node bakes them). */
template <typename... P, typename... A>
static inline void cuemu_launch(const char *name, void (*k)(P...), dim3 grid, dim3 block,
                                size_t shmem, cudaStream_t s, A &&...a) {
    static_assert(sizeof...(P) == sizeof...(A), "cuemu: kernel argument count mismatch");
    auto args = std::make_shared<std::tuple<typename std::decay<P>::type...>>(
        std::forward<A>(a)...);
    cuemu_launch_impl(name, grid, block, shmem, s, [k, args]() { std::apply(k, *args); });
}

#endif /* __cplusplus */
#endif
