/* rootspec-cuda-bench: per-pass timing of the CUDA backend on random-weight models shaped
 * like Llama-3.1-8B (target) and Llama-3.2-1B (drafter), built on the device in memory
 * (no downloads, no host copy of the weights). For n = 1, 9, 60, 65 tokens (--ns) on top of
 * a committed context, graph replay vs eager launch: milliseconds per pass (wall clock,
 * including the logits copy to the host), and weight bandwidth achieved (bf16 weight
 * bytes / pass time) as a share of the device-to-device copy bandwidth measured here; the
 * q|k|v path each n takes (fused kernel or cuBLAS, ROOTSPEC_CUDA_FUSED_QKV moves the bound)
 * and the kernel nodes of its captured graph per layer.
 *   rootspec-cuda-bench [--iters N] [--ctx N] [--only target|drafter] [--model SPEC]
 *                       [--copy-mib N] [--device D] [--ns N,N,...] [--batch-invariant]
 * --model times one other model instead (a file or random:PRESET, see common/randmodel.h). */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/randmodel.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_kernels.h"

typedef struct {
    const char *name, *spec, *tag;
} Shape;

static const Shape kShapes[] = {
    {"target Llama-3.1-8B-shaped", "random:llama3-8b,seed=1234", "target8B"},
    {"drafter Llama-3.2-1B-shaped", "random:llama3-1b,seed=1235", "drafter1B"},
};

/* Device-to-device copy bandwidth (bytes read + written per second) of one buffer. */
static double copy_bandwidth(size_t bytes) {
    void *a, *b;
    CUDA_CHECK(cudaMalloc(&a, bytes));
    CUDA_CHECK(cudaMalloc(&b, bytes));
    CUDA_CHECK(cudaMemset(a, 1, bytes));
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    for (int i = 0; i < 3; i++) CUDA_CHECK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    int reps = 10;
    CUDA_CHECK(cudaEventRecord(e0));
    for (int i = 0; i < reps; i++) CUDA_CHECK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaEventRecord(e1));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    CUDA_CHECK(cudaFree(a));
    CUDA_CHECK(cudaFree(b));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return 2.0 * bytes * reps / (ms * 1e-3);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median wall time (ms) of `iters` passes of n tokens (tree-like mask NULL = causal) on
 * top of the committed context; every pass is dropped again (kv_commit of nothing). */
static double time_pass(Backend *b, int n, int n_out, int iters, float *logits) {
    int tok[65], pos[65], rows[65];
    int base = backend_n_committed(b);
    int vocab = backend_model(b)->cfg.vocab_size;
    for (int i = 0; i < n; i++) tok[i] = (i * 7919 + 13) % vocab, pos[i] = base + i, rows[i] = i;
    RsErr e = {0};
    double *t = (double *)malloc(sizeof(double) * iters);
    for (int i = -3; i < iters; i++) { /* 3 warm-ups (graph capture happens here) */
        uint64_t t0 = rs_now_ns();
        if (backend_forward(b, tok, pos, n, NULL, rows, n_out, logits, &e) != RS_OK) {
            fprintf(stderr, "rootspec-cuda-bench: forward: %s\n", e.msg);
            exit(1);
        }
        uint64_t t1 = rs_now_ns();
        if (backend_kv_commit(b, NULL, 0, &e) != RS_OK) {
            fprintf(stderr, "rootspec-cuda-bench: kv_commit: %s\n", e.msg);
            exit(1);
        }
        if (i >= 0) t[i] = (t1 - t0) * 1e-6;
    }
    qsort(t, iters, sizeof(double), cmp_double);
    double med = t[iters / 2];
    free(t);
    return med;
}

/* Times one model: made on the device, an eager prefill of ctx tokens, then graph vs eager
 * passes for each n. *logits (pinned host memory) grows to the model's vocabulary. Returns 0
 * or the exit status (reported). */
static int g_batch_inv; /* --batch-invariant: BackendParams.batch_invariant */
static int g_ns[8] = {1, 9, 60, 65}, g_n_ns = 4; /* --ns */

/* One BENCH line (tools/gpu-check.sh reads it) for the last graph-replayed pass of n rows. */
static void bench_line(Backend *b, const Shape *sh, int n, double tg, double te, double tg1,
                       double bw, double copy_bw) {
    int per_layer = 0, per_pass = 0, g_kern = -1, g_nodes = -1;
    double g_layer = -1.0;
    cuda_backend_launches(b, &per_layer, &per_pass);
    cuda_backend_graph_launches(b, &g_layer, &g_kern, &g_nodes);
    printf("BENCH model=%s bi=%d n=%d graph_ms=%.4f eager_ms=%.4f graph_nout1_ms=%.4f "
           "weight_GBps=%.1f copy_GBps=%.1f share=%.3f launches_layer=%d launches_pass=%d "
           "graph_kernels_layer=%.2f graph_kernels=%d graph_nodes=%d qkv=%s\n",
           sh->tag, g_batch_inv, n, tg, te, tg1, bw / 1e9, copy_bw / 1e9, bw / copy_bw,
           per_layer, per_pass, g_layer, g_kern, g_nodes,
           cuda_backend_qkv_fused(b, n) ? "fused" : "cublas");
}

/* --ns: up to 8 comma-separated sizes in 1..65; 0 when malformed. */
static int parse_ns(const char *s) {
    int n = 0;
    for (const char *p = s; *p && n < 8;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 65 || (*end && *end != ',')) return 0;
        g_ns[n++] = (int)v;
        p = *end ? end + 1 : end;
    }
    g_n_ns = n;
    return n;
}

static int time_shape(const Shape *sh, int ctx, int iters, int device, double copy_bw,
                      float **logits, size_t *logits_cap) {
    Model *m = NULL;
    RsErr e = {0};
    /* random models are made on the device by cuda_ops.create (no host copy) */
    if (backend_model_load(cuda_backend_ops_get(), sh->spec, NULL, &m, &e) != RS_OK) {
        fprintf(stderr, "rootspec-cuda-bench: %s\n", e.msg);
        return 2;
    }
    size_t need = sizeof(float) * 65 * (size_t)m->cfg.vocab_size;
    if (need > *logits_cap) {
        if (*logits) cudaFreeHost(*logits);
        CUDA_CHECK(cudaMallocHost((void **)logits, need));
        *logits_cap = need;
    }
    BackendParams p = {.kv_capacity = ctx + 128, .max_batch = ctx > 65 ? ctx : 65,
                       .max_pending = ctx > 65 ? ctx : 65, .threads = 0, .device = device,
                       .batch_invariant = g_batch_inv};
    Backend *b = NULL;
    uint64_t t0 = rs_now_ns();
    if (backend_create(cuda_backend_ops_get(), m, &p, &b, &e) != RS_OK) {
        fprintf(stderr, "rootspec-cuda-bench: %s: %s\n", sh->name, e.msg);
        return 1;
    }
    double wbytes = (double)cuda_backend_weight_bytes(b);
    printf("\n%s%s: %.2f GB bf16 weights per pass, created in %.1f s\n", sh->name,
           g_batch_inv ? " (batch-invariant kernels)" : "", wbytes / 1e9,
           (rs_now_ns() - t0) * 1e-9);
    /* committed context: one eager prefill */
    int *tok = (int *)malloc(sizeof(int) * ctx), *pos = (int *)malloc(sizeof(int) * ctx);
    for (int i = 0; i < ctx; i++) tok[i] = (i * 31 + 7) % m->cfg.vocab_size, pos[i] = i;
    int last = ctx - 1;
    t0 = rs_now_ns();
    if (backend_forward(b, tok, pos, ctx, NULL, &last, 1, *logits, &e) != RS_OK ||
        backend_kv_commit(b, pos, ctx, &e) != RS_OK) {
        fprintf(stderr, "rootspec-cuda-bench: prefill: %s\n", e.msg);
        return 1;
    }
    printf("prefill %d tokens (eager): %.2f ms\n", ctx, (rs_now_ns() - t0) * 1e-6);
    printf("%4s  %10s %10s %8s  %10s %8s  %12s\n", "n", "graph ms", "eager ms", "speedup",
           "weight GB/s", "of copy", "graph ms n_out=1");
    for (int k = 0; k < g_n_ns; k++) {
        int n = g_ns[k];
        cuda_backend_set_graphs(b, 1);
        double tg = time_pass(b, n, n, iters, *logits);
        double tg1 = time_pass(b, n, 1, iters, *logits);
        cuda_backend_set_graphs(b, 0);
        double te = time_pass(b, n, n, iters, *logits);
        cuda_backend_set_graphs(b, 1);
        time_pass(b, n, 1, 1, *logits); /* a replay again, for the graph's counts */
        double bw = wbytes / (tg1 * 1e-3);
        printf("%4d  %10.3f %10.3f %7.2fx  %10.0f %7.1f%%  %12.3f\n", n, tg, te, te / tg,
               bw / 1e9, 100.0 * bw / copy_bw, tg1);
        bench_line(b, sh, n, tg, te, tg1, bw, copy_bw);
    }
    BackendStats bs = backend_stats(b);
    printf("graph replays %llu, eager launches %llu, captures %llu\n",
           (unsigned long long)bs.graph_replays, (unsigned long long)bs.eager_launches,
           (unsigned long long)bs.graph_captures);
    free(tok), free(pos);
    backend_destroy(&b);
    model_destroy(&m);
    return 0;
}

int main(int argc, char **argv) {
    int iters = 20, ctx = 512, device = 0, copy_mib = 2048;
    const char *only = NULL, *model_spec = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ctx") && i + 1 < argc) ctx = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) device = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--model") && i + 1 < argc) model_spec = argv[++i];
        else if (!strcmp(argv[i], "--copy-mib") && i + 1 < argc) copy_mib = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch-invariant")) g_batch_inv = 1;
        else if (!strcmp(argv[i], "--ns") && i + 1 < argc && parse_ns(argv[i + 1])) i++;
        else {
            fprintf(stderr, "usage: %s [--iters N] [--ctx N] [--only target|drafter] "
                    "[--model SPEC] [--copy-mib N] [--device D] [--ns N,N,...] "
                    "[--batch-invariant]\n", argv[0]);
            return 2;
        }
    }
    if (iters < 1 || ctx < 1 || ctx > 8192 || copy_mib < 1 || copy_mib > 65536) {
        fprintf(stderr, "rootspec-cuda-bench: --iters %d / --ctx %d / --copy-mib %d out of range\n",
                iters, ctx, copy_mib);
        return 2;
    }
    int ndev = 0;
    cudaError_t rc = cudaGetDeviceCount(&ndev);
    if (rc != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device (%s): rootspec-cuda-bench\n",
               rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices");
        return 0;
    }
    CUDA_CHECK(cudaSetDevice(device));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    printf("device %d: %s, %d SMs, %.1f GiB, cc %d.%d\n", device, prop.name,
           prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0, prop.major, prop.minor);
    double copy_bw = copy_bandwidth((size_t)copy_mib << 20);
    printf("device-to-device copy bandwidth: %.0f GB/s (read + write, %d MiB buffer)\n",
           copy_bw / 1e9, copy_mib);
    printf("context %d committed tokens; median of %d passes; logits of all n rows copied "
           "to the host unless noted\n", ctx, iters);
    Shape custom = {model_spec, model_spec, "model"};
    const Shape *shapes = model_spec ? &custom : kShapes;
    size_t n_shapes = model_spec ? 1 : sizeof kShapes / sizeof kShapes[0];
    float *logits = NULL;
    size_t logits_cap = 0;
    for (size_t si = 0; si < n_shapes; si++) {
        if (only && !strstr(shapes[si].name, only)) continue;
        int st = time_shape(&shapes[si], ctx, iters, device, copy_bw, &logits, &logits_cap);
        if (st) return st;
    }
    printf("\n(the pipelined two-process timing is tools/pipeline-timing.sh)\n");
    if (logits) cudaFreeHost(logits);
    return 0;
}
