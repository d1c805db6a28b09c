/* cuemu_selftest.cu: checks of the CPU emulator itself (build/cuda-emu/cuemu-selftest, run
 * by make cuda-emu-test before the CUDA suites): barrier and shuffle semantics, that the
 * defects it promises to catch really abort (deadlock, shuffle with an exited lane, launch
 * limits, static shared memory over 48 KiB in a kernel, a misaligned 16-byte access, host
 * dereference of device memory), blocks in a seeded random order, stream asynchrony (pageable vs pinned copies),
 * allocation tracking and cublasGemmEx against a naive reference. Compiled only for the
 * emulator (it calls a C++ kernel launcher directly); a case that must abort runs in a
 * forked child. Exit 0 when every check passes. */
#include <cublas_v2.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define LAUNCH(k, g, b, s, ...) cuemu_launch(#k, k, (g), (b), 0, (s), __VA_ARGS__)

static int n_fail = 0, n_pass = 0;
#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        if (cond) n_pass++;                                                                \
        else {                                                                             \
            n_fail++;                                                                      \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            printf(__VA_ARGS__);                                                           \
            printf("\n");                                                                  \
        }                                                                                  \
    } while (0)

__global__ void k_block_sum(const float *x, float *out) {
    __shared__ float part[32];
    float v = x[blockIdx.x * blockDim.x + threadIdx.x];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0;
        for (unsigned w = 0; w < blockDim.x / 32; w++) t += part[w];
        out[blockIdx.x] = t;
    }
}

/* Lanes 0-15 shuffle with a full mask while 16-31 wait at __syncthreads: no progress. */
__global__ void k_deadlock(int *x) {
    if (threadIdx.x < 16) x[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
    else __syncthreads();
}

__global__ void k_exited_lane(int *x) {
    if (threadIdx.x >= 16) return;
    x[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}

__global__ void k_noop(int *x) {}

__global__ void k_copy(const int *in, int *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i];
}

/* Block b records its place in the launch's run order. */
__global__ void k_order(unsigned *ctr, unsigned *out) {
    if (threadIdx.x == 0) out[blockIdx.x] = atomicAdd(ctr, 1u);
}

/* 52,000 bytes of static shared memory written by one block: over the 48 KiB a block may
 * have statically. */
__global__ void k_big_shared(float *out) {
    __shared__ float big[13000];
    for (int i = threadIdx.x; i < 13000; i += blockDim.x) big[i] = (float)i;
    __syncthreads();
    if (threadIdx.x == 0) out[0] = big[12999];
}

/* A 16-byte access 4 bytes past an aligned address. */
__global__ void k_misaligned(const float *p, float *out) {
    float v[4];
    CUEMU_ASSERT_ALIGNED(p + 1, 16, "selftest 16-byte load");
    memcpy(v, p + 1, 16);
    out[0] = v[0];
}

/* The order 64 blocks ran in with CUEMU_BLOCKS=random and this seed, in a child (the
 * setting is read at the first launch, so before any in this process). Returns the run
 * order of block 0..63 packed as a checksum-like fingerprint; ~0 when the child failed,
 * the order was not a permutation, or it was the index order. */
static unsigned long long random_order(const char *seed) {
    int fd[2];
    if (pipe(fd)) return ~0ull;
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) {
        close(fd[0]);
        setenv("CUEMU_QUIET", "1", 1);
        setenv("CUEMU_BLOCKS", "random", 1);
        setenv("CUEMU_SEED", seed, 1);
        unsigned *d, h[65] = {0};
        cudaMalloc((void **)&d, 65 * 4);
        cudaMemset(d, 0, 65 * 4);
        LAUNCH(k_order, 64, 32, 0, d, d + 1);
        cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
        unsigned long long fp = 0, seen = 0;
        int identity = 1;
        for (int b = 0; b < 64; b++) {
            seen |= 1ull << (h[1 + b] & 63);
            identity &= h[1 + b] == (unsigned)b;
            fp = fp * 1000003ull + h[1 + b];
        }
        if (h[0] != 64 || seen != ~0ull || identity) fp = ~0ull;
        if (write(fd[1], &fp, sizeof fp) != (ssize_t)sizeof fp) _exit(1);
        _exit(0);
    }
    close(fd[1]);
    unsigned long long fp = ~0ull;
    if (read(fd[0], &fp, sizeof fp) != (ssize_t)sizeof fp) fp = ~0ull;
    close(fd[0]);
    waitpid(p, NULL, 0);
    return fp;
}

/* Runs fn in a child; 1 when the child died of SIGABRT/SIGSEGV as expected. */
static int dies(void (*fn)(void), int sig) {
    fflush(stdout);
    fflush(stderr);
    pid_t p = fork();
    if (p == 0) {
        setenv("CUEMU_QUIET", "1", 1);
        fn();
        _exit(0);
    }
    int st = 0;
    waitpid(p, &st, 0);
    return WIFSIGNALED(st) && WTERMSIG(st) == sig;
}

static void do_deadlock(void) {
    int *d;
    cudaMalloc((void **)&d, 64 * 4);
    LAUNCH(k_deadlock, 1, 32, 0, d);
    cudaDeviceSynchronize();
}
static void do_exited_lane(void) {
    int *d;
    cudaMalloc((void **)&d, 64 * 4);
    LAUNCH(k_exited_lane, 1, 32, 0, d);
    cudaDeviceSynchronize();
}
static void do_big_block(void) {
    int *d;
    cudaMalloc((void **)&d, 64);
    LAUNCH(k_noop, 1, 2048, 0, d);
}
static void do_big_shared(void) {
    float *d;
    cudaMalloc((void **)&d, 64);
    LAUNCH(k_big_shared, 2, 128, 0, d);
    cudaDeviceSynchronize();
}
static void do_misaligned(void) {
    float *d;
    cudaMalloc((void **)&d, 64);
    LAUNCH(k_misaligned, 1, 32, 0, d, d);
    cudaDeviceSynchronize();
}
static void do_host_deref(void) {
    int *d;
    cudaMalloc((void **)&d, 64);
    cudaDeviceSynchronize();
    volatile int v = d[0]; /* a host read of device memory: faults on a GPU machine too */
    (void)v;
}
static void do_overrun(void) {
    int *in, *out;
    cudaMalloc((void **)&in, 4096 * 4);
    cudaMalloc((void **)&out, 1000 * 4); /* kernel writes 4096 ints: runs past the end */
    LAUNCH(k_copy, 16, 256, 0, in, out, 4096);
    cudaDeviceSynchronize();
}

static void test_gemm(void) {
    cublasHandle_t h;
    CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS, "cublasCreate");
    int m = 7, n = 5, k = 9;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
            int lda = ar + 3, ldb = br + 2, ldc = m + 1;
            uint16_t A[(9 + 3) * 9], B[(9 + 2) * 9];
            float Af[(9 + 3) * 9], Bf[(9 + 2) * 9], C[6 * 8], ref[6 * 8];
            for (int i = 0; i < lda * ac; i++) {
                float f = (float)((i * 37) % 19 - 9) / 8.0f; /* exact in bf16 */
                uint32_t u;
                memcpy(&u, &f, 4);
                A[i] = (uint16_t)(u >> 16), Af[i] = f;
            }
            for (int i = 0; i < ldb * bc; i++) {
                float f = (float)((i * 11) % 13 - 6) / 4.0f;
                uint32_t u;
                memcpy(&u, &f, 4);
                B[i] = (uint16_t)(u >> 16), Bf[i] = f;
            }
            for (int i = 0; i < ldc * n; i++) C[i] = (float)(i % 5);
            float alpha = 0.5f, beta = 2.0f;
            for (int j = 0; j < n; j++)
                for (int i = 0; i < ldc; i++) {
                    if (i >= m) { ref[j * ldc + i] = C[j * ldc + i]; continue; }
                    double s = 0;
                    for (int p = 0; p < k; p++)
                        s += (double)(ta ? Af[i * lda + p] : Af[p * lda + i]) *
                             (tb ? Bf[p * ldb + j] : Bf[j * ldb + p]);
                    ref[j * ldc + i] = (float)(alpha * s + beta * C[j * ldc + i]);
                }
            void *dA, *dB, *dC;
            cudaMalloc(&dA, sizeof A), cudaMalloc(&dB, sizeof B), cudaMalloc(&dC, sizeof C);
            cudaMemcpy(dA, A, sizeof A, cudaMemcpyHostToDevice);
            cudaMemcpy(dB, B, sizeof B, cudaMemcpyHostToDevice);
            cudaMemcpy(dC, C, sizeof C, cudaMemcpyHostToDevice);
            cublasStatus_t st = cublasGemmEx(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                             m, n, k, &alpha, dA, CUDA_R_16BF, lda, dB, CUDA_R_16BF, ldb,
                                             &beta, dC, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                             CUBLAS_GEMM_DEFAULT);
            CHECK(st == CUBLAS_STATUS_SUCCESS, "gemm status %d", (int)st);
            cudaMemcpy(C, dC, sizeof C, cudaMemcpyDeviceToHost);
            float worst = 0;
            for (int i = 0; i < ldc * n; i++) worst = fmaxf(worst, fabsf(C[i] - ref[i]));
            CHECK(worst < 1e-4f, "gemm ta=%d tb=%d: max |d| %g", ta, tb, worst);
            cudaFree(dA), cudaFree(dB), cudaFree(dC);
        }
    float alpha = 1, beta = 0;
    CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &alpha, NULL, CUDA_R_16F, 2, NULL,
                       CUDA_R_16F, 2, &beta, NULL, CUDA_R_16F, 2, CUBLAS_COMPUTE_16F,
                       CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED, "fp16 must be refused");
    cublasDestroy(h);
}

/* A captured graph lists its nodes by type, as cudaGraphGetNodes does on a GPU (the backend
 * counts a layer's kernel nodes from it): here a kernel, a copy, a memset, a kernel. */
static void test_graph_nodes(cudaStream_t s, float *dx, float *dout, int *d1) {
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess, "capture");
    LAUNCH(k_block_sum, 1, 256, s, dx, dout);
    cudaMemcpyAsync(dout + 1, dout, 4, cudaMemcpyDeviceToDevice, s);
    cudaMemsetAsync(d1, 0, 16, s);
    LAUNCH(k_block_sum, 2, 256, s, dx, dout);
    CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess, "end capture");
    size_t n = 0;
    CHECK(cudaGraphGetNodes(g, NULL, &n) == cudaSuccess && n == 4, "graph nodes: %zu, want 4", n);
    cudaGraphNode_t nodes[6];
    n = 6;
    CHECK(cudaGraphGetNodes(g, nodes, &n) == cudaSuccess && n == 4 && !nodes[4], "node list");
    const enum cudaGraphNodeType want[4] = {cudaGraphNodeTypeKernel, cudaGraphNodeTypeMemcpy,
                                            cudaGraphNodeTypeMemset, cudaGraphNodeTypeKernel};
    for (int i = 0; i < 4; i++) {
        enum cudaGraphNodeType t;
        CHECK(cudaGraphNodeGetType(nodes[i], &t) == cudaSuccess && t == want[i],
              "node %d type %d, want %d", i, (int)t, (int)want[i]);
    }
    cudaGraphDestroy(g);
}

int main(void) {
    /* blocks in a seeded random order: a permutation, not the index order, the same for
     * one seed and another for another (children: the setting is read once) */
    unsigned long long o1 = random_order("1"), o1b = random_order("1"), o2 = random_order("2");
    CHECK(o1 != ~0ull && o2 != ~0ull, "CUEMU_BLOCKS=random did not run the blocks in a shuffled order");
    CHECK(o1 == o1b && o1 != o2, "block order not reproducible per seed or not seed-dependent");
    /* barrier + shuffle arithmetic */
    float x[4 * 256], out[4];
    for (int i = 0; i < 4 * 256; i++) x[i] = (float)(i % 7);
    float *dx, *dout;
    cudaMalloc((void **)&dx, sizeof x), cudaMalloc((void **)&dout, sizeof out);
    cudaMemcpy(dx, x, sizeof x, cudaMemcpyHostToDevice);
    LAUNCH(k_block_sum, 4, 256, 0, dx, dout);
    CHECK(cudaGetLastError() == cudaSuccess, "launch");
    cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost);
    for (int b = 0; b < 4; b++) {
        float want = 0;
        for (int i = 0; i < 256; i++) want += x[b * 256 + i];
        CHECK(out[b] == want, "block %d sum %g want %g", b, out[b], want);
    }
    /* defects that must abort */
    CHECK(dies(do_deadlock, SIGABRT), "deadlock not detected");
    CHECK(dies(do_exited_lane, SIGABRT), "shuffle with an exited lane not detected");
    CHECK(dies(do_big_block, SIGABRT), "2048-thread block not refused");
    CHECK(dies(do_big_shared, SIGABRT), "a block writing 52,000 bytes of static shared memory not refused");
    CHECK(dies(do_misaligned, SIGABRT), "a misaligned 16-byte access not refused");
    if (!getenv("CUEMU_PROTECT") || strcmp(getenv("CUEMU_PROTECT"), "0")) {
#if !defined(__SANITIZE_ADDRESS__)
        CHECK(dies(do_host_deref, SIGSEGV), "host read of device memory did not fault");
        CHECK(dies(do_overrun, SIGSEGV), "kernel write past an allocation did not fault");
#endif
    }
    /* asynchrony: pageable H2D is staged at enqueue, pinned H2D reads at execution, D2H to
     * pinned memory lands only at a synchronisation */
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    int *pin, page[4] = {1, 2, 3, 4}, *d1, *d2, got[4];
    cudaMallocHost((void **)&pin, 4 * sizeof(int));
    for (int i = 0; i < 4; i++) pin[i] = 10 + i;
    cudaMalloc((void **)&d1, 16), cudaMalloc((void **)&d2, 16);
    cudaMemcpyAsync(d1, page, 16, cudaMemcpyHostToDevice, s);
    cudaMemcpyAsync(d2, pin, 16, cudaMemcpyHostToDevice, s);
    page[0] = -1, pin[0] = -2; /* after enqueue, before the stream runs */
    cudaStreamSynchronize(s);
    cudaMemcpy(got, d1, 16, cudaMemcpyDeviceToHost);
    CHECK(got[0] == 1, "pageable H2D must snapshot at enqueue (got %d)", got[0]);
    cudaMemcpy(got, d2, 16, cudaMemcpyDeviceToHost);
    CHECK(got[0] == -2, "pinned H2D must read at execution (got %d)", got[0]);
    for (int i = 0; i < 4; i++) pin[i] = 0;
    cudaMemcpyAsync(pin, d1, 16, cudaMemcpyDeviceToHost, s);
    CHECK(pin[1] == 0, "D2H into pinned memory must not land before a sync");
    cudaStreamSynchronize(s);
    CHECK(pin[1] == 2, "D2H into pinned memory after sync (got %d)", pin[1]);
    int pg[4] = {0};
    cudaMemcpyAsync(pg, d1, 16, cudaMemcpyDeviceToHost, s);
    CHECK(pg[1] == 2, "D2H into pageable memory completes before returning");
    /* allocation tracking */
    int stackvar;
    CHECK(cudaFree(&stackvar) == cudaErrorInvalidValue, "cudaFree of a host pointer");
    CHECK(cudaFree(d1 + 1) == cudaErrorInvalidValue, "cudaFree of an interior pointer");
    CHECK(cudaMemcpy(d1, page, 32, cudaMemcpyHostToDevice) == cudaErrorInvalidValue,
          "copy past the end of an allocation");
    CHECK(cudaMemset(d2, 0, 17) == cudaErrorInvalidValue, "memset past the end");
    cudaGetLastError();
    test_graph_nodes(s, dx, dout, d1);
    test_gemm();
    cudaFreeHost(pin), cudaFree(d1), cudaFree(d2), cudaFree(dx), cudaFree(dout);
    cudaStreamDestroy(s);
    printf("cuemu-selftest: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
