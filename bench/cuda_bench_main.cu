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
 *   rootspec-cuda-bench --preflight [--device D]
 *   rootspec-cuda-bench --gemv [--gemv-div N] [--iters N] [--device D]
 *   rootspec-cuda-bench --seqs N [--ctx N] [--iters N] [--only ...] [--model SPEC]
 *                       [--batch-invariant] [--device D]
 * --model times one other model instead (a file or random:PRESET, see common/randmodel.h).
 * --gemv times the own one-row GEMV (cuk_gemv) beside cuBLAS (cublasGemmEx, bf16 in, f32
 * out, as the backend calls it) on the Llama-3.1-8B matrices of a decode step (o, gate|up,
 * down, LM head; each dimension divided by --gemv-div): one GEMV line per shape with the
 * median microseconds and weight GB/s of each.
 * --seqs N times the paged path (kernels/backend.h: Sequences): N sequences, each with its
 * own committed context of --ctx tokens, one decode row each in one backend_forward_batch
 * (graph replay), against the same rows one sequence per pass; one SEQS line per shape with
 * both medians, their ratio (the aggregate gain of batching N users) and the largest
 * |difference| of a row's logits between the two (with --batch-invariant: bitwise=same or
 * differs, as the bits must be equal).
 * --preflight times nothing: it prints key=value lines of the driver's and the runtime's
 * CUDA versions, the cuBLAS version loaded and the device, and exits 3 when the driver is
 * older than the runtime linked in (nothing else could run), 1 without a usable device. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
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
static BackendSwitches g_sw; /* the environment's (ROOTSPEC_CUDA_FUSED_QKV, ...), read in main */
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
    BackendParams bp = {.kv_capacity = ctx + 128, .max_batch = ctx > 65 ? ctx : 65,
                        .max_pending = ctx > 65 ? ctx : 65, .threads = 0, .device = device,
                        .batch_invariant = g_batch_inv, .sw = g_sw};
    Backend *b = NULL;
    uint64_t t0 = rs_now_ns();
    if (backend_create(cuda_backend_ops_get(), m, &bp, &b, &e) != RS_OK) {
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

/* --seqs: one decode row of each of ns sequences (pos ctx); batch: one pass of them all,
 * else one pass per sequence. Median ms of `iters` rounds; the pass is dropped again. The
 * last round's logits (ns, vocab) land in out. */
static double time_seq_rows(Backend *b, const int *ids, int ns, int ctx, int batch, int iters,
                            float *out) {
    int V = backend_model(b)->cfg.vocab_size, tok[64], pos[64], rows[64];
    BackendSeg g[64];
    for (int k = 0; k < ns; k++) {
        tok[k] = (k * 977 + 5) % V, pos[k] = ctx, rows[k] = k;
        g[k] = (BackendSeg){ids[k], &tok[k], &pos[k], 1, NULL};
    }
    RsErr e = {0};
    double *t = (double *)malloc(sizeof(double) * iters);
    for (int i = -3; i < iters; i++) {
        uint64_t t0 = rs_now_ns();
        for (int k = 0; k < (batch ? 1 : ns); k++) {
            int rc = batch ? backend_forward_batch(b, g, ns, rows, ns, out, &e)
                           : backend_forward_batch(b, &g[k], 1, rows, 1, out + (size_t)k * V, &e);
            if (rc != RS_OK) {
                fprintf(stderr, "rootspec-cuda-bench: forward_batch: %s\n", e.msg);
                exit(1);
            }
        }
        uint64_t t1 = rs_now_ns();
        for (int k = 0; k < ns; k++)
            if (backend_seq_commit(b, ids[k], NULL, 0, &e) != RS_OK) exit(1);
        if (i >= 0) t[i] = (t1 - t0) * 1e-6;
    }
    qsort(t, iters, sizeof(double), cmp_double);
    double med = t[iters / 2];
    free(t);
    return med;
}

/* Opens ns sequences (sequence 0 first) and prefills each with its own ctx tokens. */
static int seqs_prefill(Backend *b, int *ids, int ns, int ctx, float *logits) {
    int V = backend_model(b)->cfg.vocab_size, last = ctx - 1;
    int *tok = (int *)malloc(sizeof(int) * ctx), *pos = (int *)malloc(sizeof(int) * ctx);
    RsErr e = {0};
    int rc = RS_OK;
    for (int k = 0; k < ns && !rc; k++) {
        ids[k] = 0;
        if (k) rc = backend_seq_open(b, &ids[k], &e);
        for (int i = 0; i < ctx; i++) tok[i] = (i * 31 + 7 * k + 7) % V, pos[i] = i;
        BackendSeg g = {ids[k], tok, pos, ctx, NULL};
        if (!rc) rc = backend_forward_batch(b, &g, 1, &last, 1, logits, &e);
        if (!rc) rc = backend_seq_commit(b, ids[k], pos, ctx, &e);
    }
    if (rc) fprintf(stderr, "rootspec-cuda-bench: --seqs prefill: %s\n", e.msg);
    free(tok), free(pos);
    return rc;
}

static int time_seqs(const Shape *sh, int ns, int ctx, int iters, int device) {
    Model *m = NULL;
    RsErr e = {0};
    if (backend_model_load(cuda_backend_ops_get(), sh->spec, NULL, &m, &e) != RS_OK) {
        fprintf(stderr, "rootspec-cuda-bench: %s\n", e.msg);
        return 2;
    }
    int V = m->cfg.vocab_size, big = ctx > 65 ? ctx : 65, ids[64];
    BackendParams bp = {.kv_capacity = ns * (ctx + 16), .max_batch = big, .max_pending = big,
                        .device = device, .batch_invariant = g_batch_inv, .sw = g_sw, .max_seqs = ns};
    Backend *b = NULL;
    float *batch = NULL, *solo = NULL;
    CUDA_CHECK(cudaMallocHost((void **)&batch, sizeof(float) * (size_t)ns * V));
    CUDA_CHECK(cudaMallocHost((void **)&solo, sizeof(float) * (size_t)ns * V));
    int rc = backend_create(cuda_backend_ops_get(), m, &bp, &b, &e);
    if (rc) fprintf(stderr, "rootspec-cuda-bench: %s: %s\n", sh->name, e.msg);
    if (!rc) rc = seqs_prefill(b, ids, ns, ctx, batch);
    if (!rc) {
        double tb = time_seq_rows(b, ids, ns, ctx, 1, iters, batch);
        double ts = time_seq_rows(b, ids, ns, ctx, 0, iters, solo);
        double worst = 0;
        size_t differ = 0;
        for (size_t i = 0; i < (size_t)ns * V; i++) {
            double d = fabs((double)batch[i] - (double)solo[i]);
            differ += memcmp(&batch[i], &solo[i], 4) != 0;
            if (d > worst || d != d) worst = d;
        }
        printf("SEQS model=%s bi=%d seqs=%d ctx=%d batch_ms=%.4f solo_ms=%.4f speedup=%.2f "
               "max_abs_diff=%g bitwise=%s\n", sh->tag, g_batch_inv, ns, ctx, tb, ts, ts / tb,
               worst, differ ? "differs" : "same");
    }
    backend_destroy(&b);
    cudaFreeHost(batch), cudaFreeHost(solo);
    model_destroy(&m);
    return rc ? 1 : 0;
}

/* Median microseconds of `iters` launches of one GEMV (own kernel or cuBLAS), events
 * around each. */
static double time_gemv(int own, cublasHandle_t h, const rs_bf16 *W, int out, int in,
                        const rs_bf16 *x, float *y, int iters) {
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    double *t = (double *)malloc(sizeof(double) * iters);
    const float alpha = 1.0f, beta = 0.0f;
    for (int i = -3; i < iters; i++) {
        CUDA_CHECK(cudaEventRecord(e0, 0));
        if (own) cuk_gemv(0, W, out, in, x, 0, y);
        else CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, out, 1, in, &alpha, W,
                                       CUDA_R_16BF, in, x, CUDA_R_16BF, in, &beta, y,
                                       CUDA_R_32F, out, CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT));
        CUDA_CHECK(cudaEventRecord(e1, 0));
        CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 0) t[i] = ms * 1e3;
    }
    qsort(t, iters, sizeof(double), cmp_double);
    double med = t[iters / 2];
    free(t);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return med;
}

/* --gemv: the 8B decode matrices, own kernel beside cuBLAS. */
static int bench_gemv(int div, int iters) {
    static const int shapes[4][2] = {{4096, 4096}, {28672, 4096}, {4096, 14336}, {128256, 4096}};
    static const char *names[4] = {"o", "gate_up", "down", "lm_head"};
    cublasHandle_t h;
    CUBLAS_CHECK(cublasCreate(&h));
    for (int i = 0; i < 4; i++) {
        int out = shapes[i][0] / div, in = shapes[i][1] / div / 8 * 8;
        rs_bf16 *W, *x;
        float *y;
        CUDA_CHECK(cudaMalloc((void **)&W, (size_t)out * in * 2));
        CUDA_CHECK(cudaMalloc((void **)&x, (size_t)in * 2));
        CUDA_CHECK(cudaMalloc((void **)&y, (size_t)out * 4));
        cuk_fill_random_bf16(0, W, (size_t)out * in, 11 + i, 0.05f, 0.0f);
        cuk_fill_random_bf16(0, x, (size_t)in, 21 + i, 1.0f, 0.0f);
        double own = time_gemv(1, h, W, out, in, x, y, iters);
        double cb = time_gemv(0, h, W, out, in, x, y, iters);
        double bytes = (double)out * in * 2;
        printf("GEMV shape=%s out=%d in=%d own_us=%.2f cublas_us=%.2f own_GBps=%.0f "
               "cublas_GBps=%.0f\n", names[i], out, in, own, cb, bytes / own * 1e-3,
               bytes / cb * 1e-3);
        cudaFree(W), cudaFree(x), cudaFree(y);
    }
    cublasDestroy(h);
    return 0;
}

/* CUDA version number (1000 major + 10 minor) as "major.minor". */
static const char *cuda_ver(int v, char *buf, size_t n) {
    snprintf(buf, n, "%d.%d", v / 1000, v % 1000 / 10);
    return buf;
}

/* The versions and the device, before any timing; see the file comment. */
static int preflight(int device) {
    int drv = 0, rt = 0, ndev = 0, maj = -1, min = -1, pat = -1;
    char a[16], b[16];
    cudaDriverGetVersion(&drv); /* 0 with no driver; never fails on an old one */
    cudaRuntimeGetVersion(&rt);
    cublasGetProperty(MAJOR_VERSION, &maj);
    cublasGetProperty(MINOR_VERSION, &min);
    cublasGetProperty(PATCH_LEVEL, &pat);
    printf("cuda_driver=%s\ncuda_runtime=%s\ncublas=%d.%d.%d\n", cuda_ver(drv, a, sizeof a),
           cuda_ver(rt, b, sizeof b), maj, min, pat);
    if (drv == 0) {
        printf("preflight=FAIL (no CUDA driver: libcuda.so.1 not found or not loadable)\n");
        return 1;
    }
    /* Minor version compatibility lets a runtime run on an older driver of its major
     * version (SASS only, which the binaries carry); an older major cannot run at all. */
    if (drv / 1000 < rt / 1000) {
        printf("preflight=FAIL (the driver supports CUDA %s, older than the CUDA %s runtime "
               "these binaries carry: a driver of CUDA %d or newer is needed)\n", a, b, rt / 1000);
        return 3;
    }
    if (drv < rt) printf("preflight_note=driver CUDA %s < runtime %s: minor version compatibility\n", a, b);
    cudaError_t rc = cudaGetDeviceCount(&ndev);
    if (rc != cudaSuccess || ndev <= device) {
        printf("preflight=FAIL (no CUDA device %d: %s)\n", device,
               rc != cudaSuccess ? cudaGetErrorString(rc) : "too few devices");
        return 1;
    }
    cudaDeviceProp prop;
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaSetDevice(device));
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    for (char *c = prop.name; *c; c++)
        if (*c == ' ') *c = '_';
    printf("device=%s\ncc=%d.%d\nsms=%d\nmem_gib=%.1f\nmem_free_gib=%.1f\npreflight=ok\n",
           prop.name, prop.major, prop.minor, prop.multiProcessorCount, total_b / 1073741824.0,
           free_b / 1073741824.0);
    return 0;
}

int main(int argc, char **argv) {
    int iters = 20, ctx = 512, device = 0, copy_mib = 2048;
    const char *only = NULL, *model_spec = NULL;
    int preflight_only = 0, gemv = 0, gemv_div = 1, seqs = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ctx") && i + 1 < argc) ctx = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) device = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--model") && i + 1 < argc) model_spec = argv[++i];
        else if (!strcmp(argv[i], "--copy-mib") && i + 1 < argc) copy_mib = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch-invariant")) g_batch_inv = 1;
        else if (!strcmp(argv[i], "--preflight")) preflight_only = 1;
        else if (!strcmp(argv[i], "--gemv")) gemv = 1;
        else if (!strcmp(argv[i], "--gemv-div") && i + 1 < argc) gemv_div = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seqs") && i + 1 < argc) seqs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ns") && i + 1 < argc && parse_ns(argv[i + 1])) i++;
        else {
            fprintf(stderr, "usage: %s [--iters N] [--ctx N] [--only target|drafter] "
                    "[--model SPEC] [--copy-mib N] [--device D] [--ns N,N,...] "
                    "[--batch-invariant] [--seqs N] | --preflight [--device D] | --gemv "
                    "[--gemv-div N]\n", argv[0]);
            return 2;
        }
    }
    if (iters < 1 || ctx < 1 || ctx > 8192 || copy_mib < 1 || copy_mib > 65536 || seqs < 0 ||
        seqs > 64) {
        fprintf(stderr, "rootspec-cuda-bench: --iters %d / --ctx %d / --copy-mib %d / --seqs %d "
                "out of range\n", iters, ctx, copy_mib, seqs);
        return 2;
    }
    const char *kernels = NULL;
    RsErr env_err = {0};
    if (cli_backend_env(&kernels, &g_sw, &env_err)) {
        fprintf(stderr, "rootspec-cuda-bench: %s\n", env_err.msg);
        return 2;
    }
    if (preflight_only) return preflight(device);
    int ndev = 0;
    cudaError_t rc = cudaGetDeviceCount(&ndev);
    if (rc != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device (%s): rootspec-cuda-bench\n",
               rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices");
        return 0;
    }
    CUDA_CHECK(cudaSetDevice(device));
    if (gemv) {
        if (gemv_div < 1 || gemv_div > 64) {
            fprintf(stderr, "rootspec-cuda-bench: --gemv-div %d out of range (1..64)\n", gemv_div);
            return 2;
        }
        return bench_gemv(gemv_div, iters);
    }
    Shape custom = {model_spec, model_spec, "model"};
    const Shape *shapes = model_spec ? &custom : kShapes;
    size_t n_shapes = model_spec ? 1 : sizeof kShapes / sizeof kShapes[0];
    for (size_t si = 0; seqs && si < n_shapes; si++) {
        if (only && !strstr(shapes[si].name, only)) continue;
        int st = time_seqs(&shapes[si], seqs, ctx, iters, device);
        if (st) return st;
    }
    if (seqs) return 0;
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    printf("device %d: %s, %d SMs, %.1f GiB, cc %d.%d\n", device, prop.name,
           prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0, prop.major, prop.minor);
    double copy_bw = copy_bandwidth((size_t)copy_mib << 20);
    printf("device-to-device copy bandwidth: %.0f GB/s (read + write, %d MiB buffer)\n",
           copy_bw / 1e9, copy_mib);
    printf("context %d committed tokens; median of %d passes; logits of all n rows copied "
           "to the host unless noted\n", ctx, iters);
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
