/* cuemu_runtime.cc: the subset of the CUDA runtime API that rootspec uses, emulated on
 * the CPU with C linkage, so the unchanged CUDA backend and the C test files link against
 * it instead of libcudart. What it models, because the code under test depends on it:
 *  - asynchrony: work queued on a stream runs only at a synchronisation point
 *    (cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize, blocking
 *    cudaMemcpy/cudaMemset, cudaFree), in stream order; the legacy default stream orders
 *    against blocking streams, non-blocking streams are independent. A H2D copy from
 *    pageable memory snapshots the source at enqueue (the driver stages it), from pinned
 *    memory it reads at execution; a D2H copy into pageable memory completes before the
 *    call returns, into pinned memory only at a later synchronisation.
 *  - stream capture: queued work of a capturing stream is recorded into a graph; the
 *    calls the driver refuses during capture (synchronising it, blocking copies, malloc /
 *    free, pageable copies, the legacy stream) fail with the driver's error codes and
 *    invalidate the capture, so cudaStreamEndCapture fails afterwards.
 *  - device memory: every allocation is tracked; copies and memsets must stay inside one
 *    allocation; fresh allocations hold 0xff bytes (NaN floats, -1 ints), not zeros. Outside
 *    emulated device work device memory is mapped PROT_NONE, so host code dereferencing a
 *    device pointer faults as on a GPU; a guard page follows every allocation, so a kernel
 *    running past the end of a buffer faults (under ASan: plain heap blocks with redzones).
 * Environment: CUEMU_DEVICES=0 (pretend no device), CUEMU_QUIET=1 (no banner),
 * CUEMU_PROTECT=0 (no PROT_NONE toggling), CUEMU_MEM_GB (device memory, default 16). */
#include "cuemu.h"
#include "cuemu_internal.h"
#include <chrono>
#include <deque>
#include <map>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <thread>
#include <unistd.h>
#include <vector>
#if defined(__SANITIZE_ADDRESS__)
#define CUEMU_HEAP_DEVMEM 1
#else
#define CUEMU_HEAP_DEVMEM 0
#endif

std::mutex cuemu_mu;

struct CUstream_st {
    std::deque<std::pair<uint64_t, cuemu_op_p>> q; /* (global enqueue seq, op) */
    unsigned flags;
    int legacy;
    /* capture state */
    int capturing, capture_bad;
    cudaStreamCaptureMode mode;
    std::thread::id capture_thread;
    std::vector<cuemu_op_p> *capture_ops;
};

struct CUevent_st {
    cudaStream_t stream;
    uint64_t seq; /* op that records it */
    int recorded, done, timing;
    std::chrono::steady_clock::time_point t;
};

struct CUgraphNode_st {
    enum cudaGraphNodeType type;
};
struct CUgraph_st {
    std::vector<cuemu_op_p> ops; /* one stream captured: a chain */
    std::vector<CUgraphNode_st> nodes; /* one per op, for cudaGraphGetNodes */
};
struct CUgraphExec_st {
    std::vector<cuemu_op_p> ops;
};

typedef struct {
    size_t size;
    char *map;      /* mmap base (NULL under ASan: heap block) */
    size_t map_len; /* bytes mapped before the guard page */
    int pinned;
} alloc_t;

static struct CUstream_st s_legacy_stream;
static std::vector<cudaStream_t> s_streams; /* every live stream incl. legacy */
static std::map<uintptr_t, alloc_t> s_dev, s_pinned;
static size_t s_dev_bytes, s_dev_limit;
static uint64_t s_seq;
static int s_inited, s_protect, s_devices = 1, s_exec_depth;
static thread_local cudaError_t t_last_error = cudaSuccess;
static int s_current_device; /* only device 0 exists */

void cuemu_set_last_error(cudaError_t e) {
    if (e != cudaSuccess) t_last_error = e;
}

static cudaError_t ret(cudaError_t e) {
    cuemu_set_last_error(e);
    return e;
}


void cuemu_init_locked(void) {
    if (s_inited) return;
    s_inited = 1;
    s_legacy_stream.legacy = 1;
    s_streams.push_back(&s_legacy_stream);
    const char *e = getenv("CUEMU_PROTECT");
    s_protect = !CUEMU_HEAP_DEVMEM && !(e && !strcmp(e, "0"));
    e = getenv("CUEMU_DEVICES");
    if (e) s_devices = atoi(e) > 0 ? 1 : 0;
    e = getenv("CUEMU_MEM_GB");
    s_dev_limit = (size_t)((e ? atof(e) : 16.0) * (double)((size_t)1 << 30));
    e = getenv("CUEMU_QUIET");
    if (!(e && !strcmp(e, "1")))
        fprintf(stderr, "NOTE: CUDA emulator on the CPU (tests/cuemu): kernels run as fibers, "
                        "no GPU is used; results check logic, not performance\n");
}

/* ---- device memory ---- */

static const alloc_t *find_range(std::map<uintptr_t, alloc_t> &m, const void *p, size_t n,
                                 uintptr_t *base) {
    uintptr_t a = (uintptr_t)p;
    auto it = m.upper_bound(a);
    if (it == m.begin()) return NULL;
    --it;
    if (a + n > it->first + it->second.size || a < it->first) return NULL;
    if (base) *base = it->first;
    return &it->second;
}

int cuemu_is_device_range(const void *p, size_t n) {
    return find_range(s_dev, p, n ? n : 1, NULL) != NULL;
}

static void protect_all(int prot) {
    if (!s_protect) return;
    for (auto &kv : s_dev)
        if (mprotect(kv.second.map, kv.second.map_len, prot) != 0)
            cuemu_fatal("mprotect of device memory failed");
}

/* Device work runs with device memory accessible; host code runs with it PROT_NONE. */
static void exec_enter(void) {
    if (s_exec_depth++ == 0) protect_all(PROT_READ | PROT_WRITE);
}
static void exec_leave(void) {
    if (--s_exec_depth == 0) protect_all(PROT_NONE);
}

static void run_op(cudaStream_t s, uint64_t seq, const cuemu_op_p &op);

/* Runs the queued ops of s with seq <= upto, honouring the legacy-stream ordering rule. */
static void drain(cudaStream_t s, uint64_t upto) {
    if (s->q.empty() || s->q.front().first > upto) return;
    /* One protection toggle per synchronisation, not per op: mprotect of every allocation
     * per op would dominate the run time. */
    exec_enter();
    while (!s->q.empty() && s->q.front().first <= upto) {
        uint64_t seq = s->q.front().first;
        cuemu_op_p op = s->q.front().second;
        s->q.pop_front();
        /* The legacy stream waits for earlier work of blocking streams and they for it. */
        for (cudaStream_t o : s_streams) {
            if (o == s || (o->flags & cudaStreamNonBlocking)) continue;
            if (!s->legacy && !o->legacy) continue;
            if (s->flags & cudaStreamNonBlocking) continue;
            drain(o, seq - 1);
        }
        run_op(s, seq, op);
    }
    exec_leave();
}

static void run_op(cudaStream_t s, uint64_t seq, const cuemu_op_p &op) { op->run(); }

static void drain_all(void) {
    /* Global enqueue order across streams: a valid schedule of independent streams. */
    int any = 0;
    for (cudaStream_t o : s_streams) any |= !o->q.empty();
    if (!any) return;
    exec_enter();
    for (;;) {
        cudaStream_t best = NULL;
        for (cudaStream_t o : s_streams)
            if (!o->q.empty() && (!best || o->q.front().first < best->q.front().first)) best = o;
        if (!best) break;
        drain(best, best->q.front().first);
    }
    exec_leave();
}

/* Captures the calling thread may not break: its own (global / thread-local mode) and
 * other threads' global-mode captures. Returns 1 and invalidates them when an unsafe call
 * (one that may synchronise or allocate) is made while they are active. */
static int unsafe_during_capture(const char *call) {
    int hit = 0;
    for (cudaStream_t o : s_streams) {
        if (!o->capturing) continue;
        int mine = o->capture_thread == std::this_thread::get_id();
        if ((mine && o->mode != cudaStreamCaptureModeRelaxed) ||
            (!mine && o->mode == cudaStreamCaptureModeGlobal)) {
            if (!o->capture_bad)
                cuemu_warn("%s during stream capture: not permitted (the capture is invalidated)", call);
            o->capture_bad = 1;
            hit = 1;
        }
    }
    return hit;
}

static cudaStream_t resolve(cudaStream_t s) {
    if (s == NULL || s == cudaStreamLegacy || s == cudaStreamPerThread) return &s_legacy_stream;
    return s;
}

static int stream_known(cudaStream_t s) {
    for (cudaStream_t o : s_streams)
        if (o == s) return 1;
    return 0;
}

cudaError_t cuemu_enqueue(cudaStream_t s0, cuemu_op_p op) {
    cudaStream_t s = resolve(s0);
    if (!stream_known(s)) return cudaErrorInvalidResourceHandle;
    if (s->capturing) {
        if (s->capture_bad) return cudaErrorStreamCaptureInvalidated;
        s->capture_ops->push_back(op);
        return cudaSuccess;
    }
    if (s->legacy) {
        /* Work on the legacy stream would join a capturing blocking stream. */
        for (cudaStream_t o : s_streams)
            if (o->capturing && !(o->flags & cudaStreamNonBlocking)) {
                cuemu_warn("%s on the legacy stream while a blocking stream captures", op->what.c_str());
                o->capture_bad = 1;
                return cudaErrorStreamCaptureImplicit;
            }
    }
    s->q.emplace_back(++s_seq, op);
    return cudaSuccess;
}

static cuemu_op_p mkop(std::string what, std::function<void()> run,
                       enum cudaGraphNodeType type = cudaGraphNodeTypeEmpty) {
    auto op = std::make_shared<cuemu_op_t>();
    op->what = std::move(what);
    op->run = std::move(run);
    op->type = type;
    return op;
}

/* Enqueue, then run s up to and including this op (synchronous w.r.t. the host). */
static cudaError_t enqueue_and_wait(cudaStream_t s0, cuemu_op_p op) {
    cudaStream_t s = resolve(s0);
    cudaError_t e = cuemu_enqueue(s, op);
    if (e != cudaSuccess) return e;
    drain(s, s_seq);
    return cudaSuccess;
}

#define LOCK() std::lock_guard<std::mutex> lk_(cuemu_mu); cuemu_init_locked()

extern "C" {

cudaError_t cudaGetDeviceCount(int *count) {
    LOCK();
    if (!count) return ret(cudaErrorInvalidValue);
    *count = s_devices;
    return s_devices ? cudaSuccess : ret(cudaErrorNoDevice);
}

/* Driver and runtime both stand for the CUDA of the headers the emulator is built against. */
cudaError_t cudaDriverGetVersion(int *v) {
    if (!v) return ret(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v) {
    if (!v) return ret(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    LOCK();
    if (device < 0 || device >= s_devices) return ret(cudaErrorInvalidDevice);
    s_current_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
    LOCK();
    if (!device) return ret(cudaErrorInvalidValue);
    if (!s_devices) return ret(cudaErrorNoDevice);
    *device = s_current_device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device) {
    LOCK();
    if (!p) return ret(cudaErrorInvalidValue);
    if (device < 0 || device >= s_devices) return ret(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "rootspec CUDA emulator (CPU)");
    p->totalGlobalMem = s_dev_limit;
    p->sharedMemPerBlock = 48 * 1024;
    p->sharedMemPerBlockOptin = 227 * 1024;
    p->sharedMemPerMultiprocessor = 228 * 1024;
    p->regsPerBlock = 65536;
    p->regsPerMultiprocessor = 65536;
    p->warpSize = 32;
    p->memPitch = (size_t)1 << 31;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsPerMultiProcessor = 2048;
    p->maxThreadsDim[0] = 1024, p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff, p->maxGridSize[1] = 65535, p->maxGridSize[2] = 65535;
    p->totalConstMem = 65536;
    p->major = 9, p->minor = 0;
    p->multiProcessorCount = 132;
    p->l2CacheSize = 50 * 1024 * 1024;
    p->memoryBusWidth = 5120;
    p->unifiedAddressing = 1;
    p->concurrentKernels = 1;
    p->asyncEngineCount = 2;
    p->canMapHostMemory = 1;
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = t_last_error;
    t_last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return t_last_error; }

static const struct {
    cudaError_t e;
    const char *name, *msg;
} kErr[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation cannot be performed in the present state"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported", "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated", "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureMerge, "cudaErrorStreamCaptureMerge", "operation would result in a merge of separate capture sequences"},
    {cudaErrorStreamCaptureUnmatched, "cudaErrorStreamCaptureUnmatched", "capture was not ended in the same stream as it began"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit", "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread", "attempt to terminate a thread-local capture sequence from another thread"},
    {cudaErrorInvalidHostPointer, "cudaErrorInvalidHostPointer", "invalid host pointer"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
};

const char *cudaGetErrorName(cudaError_t e) {
    for (auto &k : kErr)
        if (k.e == e) return k.name;
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e) {
    for (auto &k : kErr)
        if (k.e == e) return k.msg;
    return "unrecognized error code";
}

/* ---- memory ---- */

static void *map_block(size_t size, alloc_t *a) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    a->size = size;
#if CUEMU_HEAP_DEVMEM
    a->map = NULL;
    a->map_len = 0;
    void *p = NULL;
    if (posix_memalign(&p, 256, size)) return NULL;
    return p;
#else
    size_t len = (size + pg - 1) / pg * pg;
    char *m = (char *)mmap(NULL, len + pg, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return NULL;
    mprotect(m + len, pg, PROT_NONE); /* guard page right after the (end-aligned) block */
    a->map = m;
    a->map_len = len;
    return m + ((len - size) & ~(size_t)255); /* 256-aligned, ending within 255 of the guard */
#endif
}

static void unmap_block(void *p, const alloc_t *a) {
#if CUEMU_HEAP_DEVMEM
    free(p);
#else
    munmap(a->map, a->map_len + (size_t)sysconf(_SC_PAGESIZE));
#endif
}

cudaError_t cudaMalloc(void **p, size_t size) {
    LOCK();
    if (!p) return ret(cudaErrorInvalidValue);
    *p = NULL;
    if (unsafe_during_capture("cudaMalloc")) return ret(cudaErrorStreamCaptureUnsupported);
    if (size == 0) return cudaSuccess;
    if (s_dev_bytes + size > s_dev_limit) return ret(cudaErrorMemoryAllocation);
    alloc_t a = {};
    void *m = map_block(size, &a);
    if (!m) return ret(cudaErrorMemoryAllocation);
    memset(m, 0xff, size); /* cudaMalloc memory is not zeroed: make stale reads visible */
    if (s_protect && s_exec_depth == 0) mprotect(a.map, a.map_len, PROT_NONE);
    s_dev[(uintptr_t)m] = a;
    s_dev_bytes += size;
    *p = m;
    return cudaSuccess;
}

/* Free bytes = the CUEMU_MEM_GB limit less the live allocations: a test sees whether the
 * decode loop allocates, as cudaMemGetInfo shows on a GPU. */
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    LOCK();
    if (!free_bytes || !total_bytes) return ret(cudaErrorInvalidValue);
    *total_bytes = s_dev_limit;
    *free_bytes = s_dev_limit - s_dev_bytes;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    LOCK();
    if (!p) return cudaSuccess;
    if (unsafe_during_capture("cudaFree")) return ret(cudaErrorStreamCaptureUnsupported);
    auto it = s_dev.find((uintptr_t)p);
    if (it == s_dev.end()) {
        cuemu_warn("cudaFree(%p): not the start of a live device allocation", p);
        return ret(cudaErrorInvalidValue);
    }
    drain_all(); /* cudaFree synchronises: queued work may still use the block */
    s_dev_bytes -= it->second.size;
    unmap_block(p, &it->second);
    s_dev.erase(it);
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags) {
    LOCK();
    if (!p) return ret(cudaErrorInvalidValue);
    *p = NULL;
    if (unsafe_during_capture("cudaMallocHost")) return ret(cudaErrorStreamCaptureUnsupported);
    void *m = NULL;
    if (posix_memalign(&m, 4096, size ? size : 1)) return ret(cudaErrorMemoryAllocation);
    alloc_t a = {};
    a.size = size ? size : 1;
    a.pinned = 1;
    s_pinned[(uintptr_t)m] = a;
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t size) { return cudaHostAlloc(p, size, 0); }

cudaError_t cudaFreeHost(void *p) {
    LOCK();
    if (!p) return cudaSuccess;
    if (unsafe_during_capture("cudaFreeHost")) return ret(cudaErrorStreamCaptureUnsupported);
    auto it = s_pinned.find((uintptr_t)p);
    if (it == s_pinned.end()) {
        cuemu_warn("cudaFreeHost(%p): not a live cudaMallocHost block", p);
        return ret(cudaErrorInvalidValue);
    }
    drain_all();
    free(p);
    s_pinned.erase(it);
    return cudaSuccess;
}

static const char *kind_name(cudaMemcpyKind k) {
    switch (k) {
    case cudaMemcpyHostToHost: return "H2H";
    case cudaMemcpyHostToDevice: return "H2D";
    case cudaMemcpyDeviceToHost: return "D2H";
    case cudaMemcpyDeviceToDevice: return "D2D";
    default: return "default";
    }
}

/* Validates and enqueues one copy; sync = a blocking cudaMemcpy. */
static cudaError_t memcpy_common(const char *call, void *dst, const void *src, size_t n,
                                 cudaMemcpyKind kind, cudaStream_t s0, int sync) {
    if (n == 0) return cudaSuccess;
    if (!dst || !src) return cudaErrorInvalidValue;
    int dd = cuemu_is_device_range(dst, n), sd = cuemu_is_device_range(src, n);
    if (kind == cudaMemcpyDefault) {
        int dany = find_range(s_dev, dst, 1, NULL) != NULL, sany = find_range(s_dev, src, 1, NULL) != NULL;
        kind = dany ? (sany ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                    : (sany ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
    }
    int want_dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    int want_sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDeviceToDevice)
        return cudaErrorInvalidMemcpyDirection;
    if (want_dd && !dd) {
        cuemu_warn("%s %s: destination %p + %zu bytes is not inside one device allocation", call,
             kind_name(kind), dst, n);
        return cudaErrorInvalidValue;
    }
    if (want_sd && !sd) {
        cuemu_warn("%s %s: source %p + %zu bytes is not inside one device allocation", call,
             kind_name(kind), src, n);
        return cudaErrorInvalidValue;
    }
    if ((!want_dd && find_range(s_dev, dst, 1, NULL)) || (!want_sd && find_range(s_dev, src, 1, NULL))) {
        cuemu_warn("%s %s: a host-side pointer (%p -> %p) is device memory", call, kind_name(kind), src,
             dst);
        return cudaErrorInvalidValue;
    }
    cudaStream_t s = resolve(s0);
    if (!stream_known(s)) return cudaErrorInvalidResourceHandle;
    int src_pinned = find_range(s_pinned, src, n, NULL) != NULL;
    int dst_pinned = find_range(s_pinned, dst, n, NULL) != NULL;
    int pageable_src = !want_sd && !src_pinned, pageable_dst = !want_dd && !dst_pinned;
    if (s->capturing && (sync || pageable_src || pageable_dst)) {
        /* A graph node cannot stage pageable memory, and a blocking copy syncs. */
        cuemu_warn("%s %s %s during capture: not permitted (capture invalidated)", call, kind_name(kind),
             sync ? "(blocking)" : "with pageable host memory");
        s->capture_bad = 1;
        return cudaErrorStreamCaptureUnsupported;
    }
    if (sync && unsafe_during_capture(call)) return cudaErrorStreamCaptureUnsupported;
    std::string what = std::string(call) + " " + kind_name(kind);
    cuemu_op_p op;
    if (kind == cudaMemcpyHostToDevice && pageable_src) {
        /* Staged at enqueue: later host writes to src do not reach the device. */
        auto snap = std::make_shared<std::vector<char>>((const char *)src, (const char *)src + n);
        op = mkop(what, [dst, snap, n]() { memcpy(dst, snap->data(), n); }, cudaGraphNodeTypeMemcpy);
    } else {
        op = mkop(what, [dst, src, n]() { memmove(dst, src, n); }, cudaGraphNodeTypeMemcpy);
    }
    if (sync || (kind == cudaMemcpyDeviceToHost && pageable_dst) || kind == cudaMemcpyHostToHost)
        return enqueue_and_wait(s, op);
    return cuemu_enqueue(s, op);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
    LOCK();
    return ret(memcpy_common("cudaMemcpy", dst, src, n, kind, NULL, 1));
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t s) {
    LOCK();
    return ret(memcpy_common("cudaMemcpyAsync", dst, src, n, kind, s, 0));
}

static cudaError_t memset_common(void *p, int v, size_t n, cudaStream_t s0, int sync) {
    if (n == 0) return cudaSuccess;
    if (!cuemu_is_device_range(p, n)) {
        cuemu_warn("cudaMemset%s: %p + %zu bytes is not inside one device allocation",
             sync ? "" : "Async", p, n);
        return cudaErrorInvalidValue;
    }
    cudaStream_t s = resolve(s0);
    if (sync) {
        if (s_legacy_stream.capturing || unsafe_during_capture("cudaMemset"))
            return cudaErrorStreamCaptureUnsupported;
    }
    auto op = mkop("cudaMemset", [p, v, n]() { memset(p, v, n); }, cudaGraphNodeTypeMemset);
    return sync ? enqueue_and_wait(s, op) : cuemu_enqueue(s, op);
}

cudaError_t cudaMemset(void *p, int v, size_t n) {
    LOCK();
    return ret(memset_common(p, v, n, NULL, 1));
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
    LOCK();
    return ret(memset_common(p, v, n, s, 0));
}

/* ---- streams ---- */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *ps, unsigned int flags) {
    LOCK();
    if (!ps) return ret(cudaErrorInvalidValue);
    cudaStream_t s = new CUstream_st();
    s->flags = flags;
    s_streams.push_back(s);
    *ps = s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *ps) { return cudaStreamCreateWithFlags(ps, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    LOCK();
    if (!s || s == &s_legacy_stream || !stream_known(s)) return ret(cudaErrorInvalidResourceHandle);
    if (s->capturing) return ret(cudaErrorStreamCaptureUnsupported);
    drain(s, s_seq); /* destroy returns at once on a GPU, but queued work still completes */
    for (size_t i = 0; i < s_streams.size(); i++)
        if (s_streams[i] == s) s_streams.erase(s_streams.begin() + i);
    delete s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s0) {
    LOCK();
    cudaStream_t s = resolve(s0);
    if (!stream_known(s)) return ret(cudaErrorInvalidResourceHandle);
    if (s->capturing) {
        cuemu_warn("cudaStreamSynchronize of a capturing stream: not permitted (capture invalidated)");
        s->capture_bad = 1;
        return ret(cudaErrorStreamCaptureUnsupported);
    }
    if (s->legacy && unsafe_during_capture("cudaStreamSynchronize(legacy stream)"))
        return ret(cudaErrorStreamCaptureUnsupported);
    drain(s, s_seq);
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s0) {
    LOCK();
    cudaStream_t s = resolve(s0);
    if (!stream_known(s)) return ret(cudaErrorInvalidResourceHandle);
    if (s->capturing) {
        s->capture_bad = 1;
        return ret(cudaErrorStreamCaptureUnsupported);
    }
    /* Nothing runs in the background here: queued work stays queued until a sync. */
    return s->q.empty() ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaDeviceSynchronize(void) {
    LOCK();
    if (unsafe_during_capture("cudaDeviceSynchronize")) return ret(cudaErrorStreamCaptureUnsupported);
    drain_all();
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s0, enum cudaStreamCaptureMode mode) {
    LOCK();
    cudaStream_t s = resolve(s0);
    if (!stream_known(s)) return ret(cudaErrorInvalidResourceHandle);
    if (s->legacy) return ret(cudaErrorStreamCaptureUnsupported); /* the legacy stream cannot */
    if (s->capturing) return ret(cudaErrorIllegalState);
    s->capturing = 1;
    s->capture_bad = 0;
    s->mode = mode;
    s->capture_thread = std::this_thread::get_id();
    s->capture_ops = new std::vector<cuemu_op_p>();
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s0, cudaGraph_t *g) {
    LOCK();
    cudaStream_t s = resolve(s0);
    if (!stream_known(s) || !g) return ret(cudaErrorInvalidValue);
    if (!s->capturing) return ret(cudaErrorIllegalState);
    if (s->mode != cudaStreamCaptureModeRelaxed && s->capture_thread != std::this_thread::get_id())
        return ret(cudaErrorStreamCaptureWrongThread);
    s->capturing = 0;
    std::vector<cuemu_op_p> *ops = s->capture_ops;
    s->capture_ops = NULL;
    if (s->capture_bad) {
        delete ops;
        *g = NULL;
        s->capture_bad = 0;
        return ret(cudaErrorStreamCaptureInvalidated);
    }
    *g = new CUgraph_st();
    (*g)->ops.swap(*ops);
    for (auto &o : (*g)->ops) (*g)->nodes.push_back(CUgraphNode_st{o->type});
    delete ops;
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s0, enum cudaStreamCaptureStatus *st) {
    LOCK();
    cudaStream_t s = resolve(s0);
    if (!stream_known(s) || !st) return ret(cudaErrorInvalidValue);
    *st = !s->capturing ? cudaStreamCaptureStatusNone
          : s->capture_bad ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

/* ---- graphs ---- */

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *ge, cudaGraph_t g, unsigned long long flags) {
    LOCK();
    if (!ge || !g) return ret(cudaErrorInvalidValue);
    *ge = new CUgraphExec_st();
    (*ge)->ops = g->ops; /* the exec is independent of the graph (may be destroyed first) */
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t ge, cudaStream_t s) {
    LOCK();
    if (!ge) return ret(cudaErrorInvalidValue);
    auto ops = std::make_shared<std::vector<cuemu_op_p>>(ge->ops);
    return ret(cuemu_enqueue(s, mkop("cudaGraphLaunch", [ops]() {
        for (auto &o : *ops) o->run();
    })));
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t ge) {
    LOCK();
    if (!ge) return ret(cudaErrorInvalidValue);
    delete ge; /* launches already queued hold their own copy of the op list */
    return cudaSuccess;
}

/* Nodes of a captured graph: one per captured operation, in capture order. */
cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t *nodes, size_t *n) {
    LOCK();
    if (!g || !n) return ret(cudaErrorInvalidValue);
    size_t have = g->nodes.size();
    if (!nodes) {
        *n = have;
        return cudaSuccess;
    }
    for (size_t i = 0; i < *n; i++) nodes[i] = i < have ? &g->nodes[i] : NULL;
    if (*n > have) *n = have;
    return cudaSuccess;
}

cudaError_t cudaGraphNodeGetType(cudaGraphNode_t node, enum cudaGraphNodeType *type) {
    LOCK();
    if (!node || !type) return ret(cudaErrorInvalidValue);
    *type = node->type;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    LOCK();
    if (!g) return ret(cudaErrorInvalidValue);
    delete g;
    return cudaSuccess;
}

/* ---- events ---- */

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *pe, unsigned int flags) {
    LOCK();
    if (!pe) return ret(cudaErrorInvalidValue);
    cudaEvent_t e = new CUevent_st();
    e->timing = !(flags & cudaEventDisableTiming);
    *pe = e;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *pe) { return cudaEventCreateWithFlags(pe, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    LOCK();
    if (!e) return ret(cudaErrorInvalidResourceHandle);
    /* A record still queued keeps a pointer: leak the event rather than dangle. */
    for (cudaStream_t o : s_streams)
        for (auto &q : o->q)
            if (e->recorded && !e->done && q.first == e->seq) return cudaSuccess;
    delete e;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s0) {
    LOCK();
    if (!e) return ret(cudaErrorInvalidResourceHandle);
    cudaStream_t s = resolve(s0);
    auto op = mkop("cudaEventRecord", [e]() {
        e->t = std::chrono::steady_clock::now();
        e->done = 1;
    });
    cudaError_t rc = cuemu_enqueue(s, op);
    if (rc != cudaSuccess) return ret(rc);
    if (!s->capturing) {
        e->stream = s;
        e->seq = s_seq;
        e->recorded = 1;
        e->done = 0;
    }
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    LOCK();
    if (!e) return ret(cudaErrorInvalidResourceHandle);
    if (!e->recorded) return cudaSuccess;
    if (e->stream->capturing) return ret(cudaErrorStreamCaptureUnsupported);
    drain(e->stream, e->seq);
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
    LOCK();
    if (!e) return ret(cudaErrorInvalidResourceHandle);
    return !e->recorded || e->done ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    LOCK();
    if (!ms || !a || !b) return ret(cudaErrorInvalidValue);
    if (!a->timing || !b->timing) return ret(cudaErrorInvalidResourceHandle);
    if (!a->done || !b->done) return ret(cudaErrorNotReady);
    *ms = std::chrono::duration<float, std::milli>(b->t - a->t).count();
    return cudaSuccess;
}

} /* extern "C" */

/* ---- kernel launch (called from the device-code header's template) ---- */

void cuemu_launch_impl(const char *name, dim3 grid, dim3 block, size_t shmem, cudaStream_t s,
                       std::function<void()> body) {
    std::lock_guard<std::mutex> lk(cuemu_mu);
    cuemu_init_locked();
    unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (!threads || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64 ||
        !grid.x || !grid.y || !grid.z || grid.y > 65535 || grid.z > 65535 ||
        grid.x > 0x7fffffffu || shmem > 48 * 1024)
        cuemu_fatal("launch of %s with grid (%u,%u,%u) block (%u,%u,%u) shmem %zu exceeds the "
                    "hardware limits (cudaErrorInvalidConfiguration on a GPU)",
                    name, grid.x, grid.y, grid.z, block.x, block.y, block.z, shmem);
    std::string nm(name);
    auto op = mkop(nm, [nm, grid, block, body]() { cuemu_run_kernel(nm.c_str(), grid, block, body); },
                   cudaGraphNodeTypeKernel);
    cuemu_set_last_error(cuemu_enqueue(s, op));
}
