/* rootspec-micro: forward-pass micro-benchmark of the CPU backend. After a 128-token
 * prefill it times tree-shaped pending batches of n = 1, 9 and 65 tokens (the root pass,
 * a B=8 and a B=64 tree pass) and relates them to the machine: weight streaming as a share
 * of a memcpy bandwidth measured in the same run (n = 1 is bandwidth-bound) and GFLOP/s
 * (n = 65 is closer to compute-bound). */
#include "common/cli.h"
#include "common/model.h"
#include "common/rng.h"
#include "kernels/backend.h"
#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define PREFILL 128
#define MAX_N 65

static void usage(FILE *f) {
    fprintf(f,
            "usage: rootspec-micro --model PATH [--threads N] [--iters K]\n"
            "  --model PATH   GGUF file or Hugging Face directory\n"
            "  --threads N    OpenBLAS threads, also used for the memcpy figure (default 1)\n"
            "  --iters K      timed passes per batch size (default 20; 2 warm-up passes)\n"
            "Times the CPU backend's forward() for n = 1, 9, 65 pending tree tokens after a\n"
            "%d-token prefill; logits are computed for every row.\n",
            PREFILL);
}

typedef struct {
    char *dst;
    const char *src;
    size_t n;
} CopyJob;

static void *copy_thread(void *arg) {
    CopyJob *j = arg;
    memcpy(j->dst, j->src, j->n);
    return NULL;
}

/* Best-of-5 memcpy bandwidth over a 256 MiB buffer split across `threads` threads, counted
 * as bytes read + bytes written (STREAM "copy" convention). Returns GB/s. */
static double memcpy_gbs(int threads) {
    size_t sz = (size_t)256 << 20;
    char *a = rs_xmalloc(sz), *b = rs_xmalloc(sz);
    memset(a, 1, sz);
    memset(b, 2, sz); /* fault the pages in before timing */
    pthread_t tid[64];
    CopyJob job[64];
    size_t chunk = sz / threads;
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        uint64_t t0 = rs_now_ns();
        for (int t = 0; t < threads; t++) {
            job[t] = (CopyJob){b + t * chunk, a + t * chunk, t == threads - 1 ? sz - t * chunk : chunk};
            RS_ASSERT(pthread_create(&tid[t], NULL, copy_thread, &job[t]) == 0);
        }
        for (int t = 0; t < threads; t++) pthread_join(tid[t], NULL);
        double gbs = 2.0 * sz / (double)(rs_now_ns() - t0);
        if (gbs > best) best = gbs;
    }
    free(a);
    free(b);
    return best;
}

/* Returns -1 when the run goes on, else the exit status (0 after --help, 2 for bad usage). */
static int parse_args(int argc, char **argv, const char **model_path, int *threads, int *iters) {
    RsErr e = {0};
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int rc = RS_OK;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--model")) {
            rc = cli_value(argc, argv, i++, model_path, &e);
        } else if (!strcmp(argv[i], "--threads")) {
            if (!(rc = cli_value(argc, argv, i++, &v, &e)))
                rc = cli_int("--threads", v, 1, 64, threads, &e);
        } else if (!strcmp(argv[i], "--iters")) {
            if (!(rc = cli_value(argc, argv, i++, &v, &e)))
                rc = cli_int("--iters", v, 1, 100000, iters, &e);
        } else {
            rc = rs_err(&e, RS_EINVAL, "unknown option '%s' (see --help)", argv[i]);
        }
        if (rc) {
            fprintf(stderr, "rootspec-micro: %s\n", e.msg);
            return 2;
        }
    }
    if (!*model_path) {
        fprintf(stderr, "rootspec-micro: --model PATH is required (see --help)\n");
        return 2;
    }
    return -1;
}

/* A random tree of n pending tokens below the prefill: tokens, positions and the tree mask
 * (n, n). Returns the entries attended summed over the tokens (for the attention flops). */
static long random_tree(Rng *r, int vocab, int n, int *tokens, int *pos, uint8_t *mask) {
    int parent[MAX_N], depth[MAX_N];
    long attended = 0;
    memset(mask, 0, (size_t)n * n);
    for (int i = 0; i < n; i++) {
        parent[i] = i == 0 ? -1 : (int)(rng_next(r) % (uint64_t)i);
        depth[i] = parent[i] < 0 ? 0 : depth[parent[i]] + 1;
        pos[i] = PREFILL + depth[i];
        tokens[i] = (int)(rng_next(r) % (uint64_t)vocab);
        for (int u = i; u >= 0; u = parent[u]) {
            mask[i * n + u] = 1;
            attended++;
        }
        attended += PREFILL;
    }
    return attended;
}

/* Times forward() on a random n-token tree (2 warm-up passes, then iters) and prints its
 * row. Returns 0, or 1 after reporting a failed pass. */
static int time_size(Backend *b, const Model *m, Rng *r, int n, int iters, double mem) {
    const Config *c = &m->cfg;
    static int tokens[MAX_N], pos[MAX_N], rows[MAX_N];
    static uint8_t mask[MAX_N * MAX_N];
    for (int i = 0; i < n; i++) rows[i] = i;
    long attended = random_tree(r, c->vocab_size, n, tokens, pos, mask);
    float *logits = rs_xmalloc(sizeof(float) * MAX_N * c->vocab_size);
    RsErr e = {0};
    double best = 1e30, sum = 0;
    for (int it = -2; it < iters; it++) {
        uint64_t t0 = rs_now_ns();
        if (backend_forward(b, tokens, pos, n, mask, rows, n, logits, &e)) {
            fprintf(stderr, "rootspec-micro: forward n=%d: %s\n", n, e.msg);
            free(logits);
            return 1;
        }
        double ms = (rs_now_ns() - t0) / 1e6;
        backend_kv_commit(b, NULL, 0, &e); /* drop the tree, keep the prefill */
        if (it < 0) continue;
        sum += ms;
        if (ms < best) best = ms;
    }
    free(logits);
    double wbytes = (double)model_weight_bytes(m), params = wbytes / sizeof(float);
    /* q.k and p.v: 2 flops per multiply-add, head_dim each, per head and layer. */
    double attn = 4.0 * c->n_heads * c->head_dim * (double)attended * c->n_layers;
    double gflops = (2.0 * params * n + attn) / (best * 1e6);
    double gbs = wbytes / (best * 1e6);
    printf("%4d %9.2f %9.2f %11.2f %7.1f%% %9.2f\n", n, sum / iters, best, gbs,
           100.0 * gbs / mem, gflops);
    return 0;
}

/* Loads the model, makes a CPU backend and runs the PREFILL-token prefill that every timed
 * tree attends to. Returns 0 or the exit status (reported). */
static int setup(const char *model_path, int threads, Rng *r, Model **m, Backend **b) {
    RsErr e = {0};
    int lrc = backend_model_load(&cpu_backend_ops, model_path, m, &e); /* random: models too */
    if (lrc) {
        fprintf(stderr, "rootspec-micro: %s\n", e.msg);
        return lrc == RS_EINVAL || lrc == RS_EFORMAT || lrc == RS_EUNSUPPORTED ? 2 : 1;
    }
    BackendParams bp = {.kv_capacity = PREFILL + MAX_N, .max_batch = PREFILL,
                        .max_pending = PREFILL, .threads = threads};
    if (backend_create(&cpu_backend_ops, *m, &bp, b, &e)) {
        fprintf(stderr, "rootspec-micro: %s\n", e.msg);
        return 1;
    }
    static int tokens[PREFILL], pos[PREFILL], rows[PREFILL];
    for (int i = 0; i < PREFILL; i++) {
        tokens[i] = (int)(rng_next(r) % (uint64_t)(*m)->cfg.vocab_size);
        pos[i] = rows[i] = i;
    }
    if (backend_forward(*b, tokens, pos, PREFILL, NULL, NULL, 0, NULL, &e) ||
        backend_kv_commit(*b, rows, PREFILL, &e)) {
        fprintf(stderr, "rootspec-micro: prefill: %s\n", e.msg);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *model_path = NULL;
    int threads = 1, iters = 20;
    int status = parse_args(argc, argv, &model_path, &threads, &iters);
    if (status >= 0) return status;
    Model *m = NULL;
    Backend *b = NULL;
    Rng r;
    rng_seed(&r, 42);
    status = setup(model_path, threads, &r, &m, &b);
    if (status == 0) {
        const Config *c = &m->cfg;
        double mem = memcpy_gbs(threads);
        double wbytes = (double)model_weight_bytes(m);
        printf("model %s: %d layers, dim %d, vocab %d, %.1f M params (%.0f MB f32)\n", model_path,
               c->n_layers, c->dim, c->vocab_size, wbytes / sizeof(float) / 1e6, wbytes / 1e6);
        printf("threads %d, iters %d, prefill %d; memcpy %.1f GB/s (read+write); OpenBLAS core %s\n",
               threads, iters, PREFILL, mem, openblas_get_corename());
        /* Rates use the best pass (least disturbed by other load); the mean is shown too. */
        printf("%4s %9s %9s %11s %8s %9s\n", "n", "ms(mean)", "ms(best)", "weightGB/s", "%memcpy",
               "GFLOP/s");
        const int sizes[3] = {1, 9, MAX_N};
        for (int si = 0; si < 3 && status == 0; si++)
            status = time_size(b, m, &r, sizes[si], iters, mem);
    }
    backend_destroy(&b);
    model_free(&m);
    return status;
}
