/* rootspec-micro: forward-pass micro-benchmark of the CPU backend. For each thread count it
 * runs a 128-token prefill, then greedy AR decoding (one token per pass, its argmax from
 * the kept row as rootspec-target takes it, commit: the AR tok/s figure), then times
 * tree-shaped pending batches of n = 1, 5, 9 and 65 tokens (the root pass, a chain of
 * four, a B=8 and a B=64 tree pass). Bytes streamed per token (weights in their stored type + the KV cache read)
 * are set against a memcpy bandwidth and a read-only stream measured in the same run (n = 1
 * reads; the read stream is its bound) and against the kernels' compute roof
 * (bench/micro_roof.c), and the drafter's host work per logits row while a self-drafter
 * grows pools (bench/micro_draft.c). Output: a human table plus one "micro key=value ..."
 * line per thread count for scripts (tools/ compares it with llama.cpp). --eagle3 HEAD
 * times an EAGLE-3 head's drafting rounds instead (bench/micro_eagle3.c). */
#include "common/cli.h"
#include "common/model.h"
#include "common/rng.h"
#include "kernels/backend.h"
#include "kernels/prefill.h"
#include "micro_draft.h"
#include "micro_eagle3.h"
#include "micro_roof.h"
#include "stats.h"
#include "kernels/cpu/cpu_backend.h"
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#define PREFILL 128 /* --ctx default: entries committed before the timed passes */
#define MAX_N 65
#define MAX_THREADS 8

static void usage(FILE *f) {
    fprintf(f,
            "usage: rootspec-micro --model PATH [--threads LIST] [--iters K] [--ar-tokens N]\n"
            "                      [--ctx N] [--rss-ctx N] [--draft-rounds N]\n"
            "  --model PATH     GGUF file, Hugging Face directory or random:PRESET\n"
            "  --threads LIST   comma-separated CPU thread counts (default 1,2)\n"
            "  --iters K        timed passes per batch size (default 20; 2 warm-up passes)\n"
            "  --ar-tokens N    greedy tokens decoded for the AR figure (default 64)\n"
            "  --ctx N          context committed before AR decoding and the timed passes\n"
            "                   (default %d; attention's share grows with it; past the\n"
            "                   model's trained context a note says the timings are all)\n"
            "  --rss-ctx N      also fill an N-entry KV cache (e.g. the engine's default 2048)\n"
            "                   and check resident memory <= file + KV cache + 64 MB\n"
            "  --draft-rounds N pools a self-drafter (first half of the layers) grows for\n"
            "                   the drafter's host work per row (default 8; 0: skip)\n"
            "  --eagle3 HEAD    instead: an EAGLE-3 head (directory or random:eagle3-*) for\n"
            "                   the target --model, after a --ctx-row context, --draft-rounds\n"
            "                   rounds of a 4-row commit and pool growth (7 passes of 10\n"
            "                   rows) per thread count, set against the read stream and the\n"
            "                   compute roof\n"
            "After an N-token prefill: AR tok/s, then forward() of n = 1, 5, 9, 65 pending tree\n"
            "tokens with logits for every row, each set against a memcpy and a read stream\n"
            "measured in the run and against the compute roof (the same kernels on a slice\n"
            "of each matrix in cache, one thread).\n"
            "ROOTSPEC_CPU_KERNELS=ref|scalar|avx2|avx512|amx forces a kernel family;\n"
            "ROOTSPEC_CPU_KV=f32 keeps the KV cache in f32 (the x86 families use f16);\n"
            "ROOTSPEC_CPU_PACK=0 keeps the weights in rows (the x86 families read Q4_0..Q8_0\n"
            "in x4 tiles of four rows).\n",
            PREFILL);
}

typedef struct {
    char *dst;
    const char *src;
    size_t n;
    uint64_t sum; /* read_thread: keeps the loads */
    int prefetch; /* read_thread: READ_PF_* */
} CopyJob;

static void *copy_thread(void *arg) {
    CopyJob *j = arg;
    memcpy(j->dst, j->src, j->n);
    return NULL;
}

/* Software prefetch of a read stream: none, 1 KB ahead into L1, or 8 KB ahead into L2 (the
 * avx512 kernels' own, QK_PF / QK_PF_HINT). Which one reads most depends on the CPU
 * (docs/PERF.md); a pass whose kernels prefetch their own way must not beat its bound by
 * that alone, so the bound is the best of the three. */
enum { READ_PF_NONE, READ_PF_L1, READ_PF_L2, READ_PF_N };

/* Reads j->n bytes, four 16-byte loads a line, prefetching as j->prefetch says. */
static void *read_thread(void *arg) {
    CopyJob *j = arg;
#if defined(__SSE2__)
    __m128i s0 = _mm_setzero_si128(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 64 <= j->n; i += 64) {
        const char *p = j->src + i;
        if (j->prefetch == READ_PF_L1) _mm_prefetch(p + 1024, _MM_HINT_T0);
        else if (j->prefetch == READ_PF_L2) _mm_prefetch(p + 8192, _MM_HINT_T1);
        s0 = _mm_add_epi64(s0, _mm_loadu_si128((const __m128i *)(const void *)p));
        s1 = _mm_add_epi64(s1, _mm_loadu_si128((const __m128i *)(const void *)(p + 16)));
        s2 = _mm_add_epi64(s2, _mm_loadu_si128((const __m128i *)(const void *)(p + 32)));
        s3 = _mm_add_epi64(s3, _mm_loadu_si128((const __m128i *)(const void *)(p + 48)));
    }
    s0 = _mm_add_epi64(_mm_add_epi64(s0, s1), _mm_add_epi64(s2, s3));
    j->sum = (uint64_t)_mm_cvtsi128_si64(s0);
#else
    uint64_t s = 0, v;
    for (size_t i = 0; i + 8 <= j->n; i += 8) memcpy(&v, j->src + i, 8), s += v;
    j->sum = s;
#endif
    return NULL;
}

/* One pass over sz bytes at a (read; or copied to b) split across `threads` threads:
 * GB/s, a copy counted as bytes read + bytes written (STREAM "copy" convention). */
static double stream_once(char *a, char *b, size_t sz, int threads, int prefetch) {
    pthread_t tid[64];
    CopyJob job[64];
    size_t chunk = sz / threads;
    uint64_t t0 = rs_now_ns();
    for (int t = 0; t < threads; t++) {
        job[t] = (CopyJob){b ? b + t * chunk : NULL, a + t * chunk,
                           t == threads - 1 ? sz - t * chunk : chunk, 0, prefetch};
        RS_ASSERT(pthread_create(&tid[t], NULL, b ? copy_thread : read_thread, &job[t]) == 0);
    }
    for (int t = 0; t < threads; t++) pthread_join(tid[t], NULL);
    return (b ? 2.0 : 1.0) * sz / (double)(rs_now_ns() - t0);
}

/* sz bytes in huge pages, as the weights (model_make_resident): the bound is the best a
 * stream of these bytes gets, not one slowed by TLB misses. Faulted in before timing. */
static char *stream_buffer(size_t sz, int fill) {
    char *a = rs_huge_alloc(sz);
    RS_ASSERT(a);
    memset(a, fill, sz);
    return a;
}

/* Best-of-6 bandwidth over a 256 MiB buffer split across `threads` threads. copy: memcpy;
 * else a read-only stream, counted as bytes read: what a one-row pass, which only reads
 * its weights, can reach at best. Returns GB/s. */
static double stream_gbs(int threads, int copy) {
    size_t sz = (size_t)256 << 20;
    char *a = stream_buffer(sz, 1), *b = copy ? stream_buffer(sz, 2) : NULL;
    double best = 0;
    for (int rep = 0; rep < 2 * READ_PF_N; rep++) { /* a read: each prefetch in turn */
        double gbs = stream_once(a, b, sz, threads, rep % READ_PF_N);
        if (gbs > best) best = gbs;
    }
    rs_huge_free(a, sz);
    rs_huge_free(b, sz);
    return best;
}

/* MB of a CPU KV cache of `entries` (keys and values) of es-byte elements. */
static double kv_mb(const Config *c, int entries, size_t es) {
    return 2.0 * c->n_layers * entries * c->n_kv_heads * c->head_dim * (double)es / 1e6;
}

/* Bytes per KV cache element of a CPU backend (cpu_backend_kv). */
static size_t backend_kv_es(const Backend *b) { return strcmp(cpu_backend_kv(b), "f16") ? 4 : 2; }

/* Process CPU time: on a loaded machine the wall clock measures the queue, this the work
 * (all threads; spinning pool workers count too). */
static double cpu_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static long vm_rss_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb;
}

typedef struct {
    const char *model_path;
    int threads[MAX_THREADS], n_threads, iters, ar_tokens, ctx, rss_ctx, draft_rounds;
    const char *eagle3; /* --eagle3 HEAD: only the head's figure, --model its target */
    const char *cpu_kernels; /* cli_backend_env: BackendParams.cpu_kernels */
    BackendSwitches sw;      /* cli_backend_env: BackendParams.sw */
} Opts;

static int parse_threads(const char *v, Opts *o, RsErr *e) {
    char buf[128];
    snprintf(buf, sizeof buf, "%s", v);
    o->n_threads = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (o->n_threads == MAX_THREADS)
            return rs_err(e, RS_EINVAL, "--threads '%s': at most %d counts", v, MAX_THREADS);
        int rc = cli_int("--threads", t, 1, 256, &o->threads[o->n_threads++], e);
        if (rc) return rc;
    }
    if (!o->n_threads) return rs_err(e, RS_EINVAL, "--threads '%s': no thread count", v);
    return RS_OK;
}

static int parse_opts(int argc, char **argv, Opts *o, RsErr *e) {
    *o = (Opts){.threads = {1, 2}, .n_threads = 2, .iters = 20, .ar_tokens = 64,
                .ctx = PREFILL, .draft_rounds = 8};
    int env_rc = cli_backend_env(&o->cpu_kernels, &o->sw, e);
    if (env_rc) return env_rc;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int rc = RS_OK;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(argv[i], "--model")) {
            rc = cli_value(argc, argv, i++, &o->model_path, e);
        } else if (!strcmp(argv[i], "--threads")) {
            if (!(rc = cli_value(argc, argv, i++, &v, e))) rc = parse_threads(v, o, e);
        } else if (!strcmp(argv[i], "--iters")) {
            if (!(rc = cli_value(argc, argv, i++, &v, e)))
                rc = cli_int("--iters", v, 1, 100000, &o->iters, e);
        } else if (!strcmp(argv[i], "--ctx")) {
            if (!(rc = cli_value(argc, argv, i++, &v, e)))
                rc = cli_int("--ctx", v, 1, 1 << 20, &o->ctx, e);
        } else if (!strcmp(argv[i], "--rss-ctx")) {
            if (!(rc = cli_value(argc, argv, i++, &v, e)))
                rc = cli_int("--rss-ctx", v, PREFILL, 1 << 20, &o->rss_ctx, e);
        } else if (!strcmp(argv[i], "--draft-rounds")) {
            if (!(rc = cli_value(argc, argv, i++, &v, e)))
                rc = cli_int("--draft-rounds", v, 0, 10000, &o->draft_rounds, e);
        } else if (!strcmp(argv[i], "--eagle3")) {
            rc = cli_value(argc, argv, i++, &o->eagle3, e);
        } else if (!strcmp(argv[i], "--ar-tokens")) {
            if (!(rc = cli_value(argc, argv, i++, &v, e)))
                rc = cli_int("--ar-tokens", v, 1, 4096, &o->ar_tokens, e);
        } else {
            rc = rs_err(e, RS_EINVAL, "unknown option '%s' (see --help)", argv[i]);
        }
        if (rc) return rc;
    }
    if (!o->model_path) return rs_err(e, RS_EINVAL, "--model PATH is required (see --help)");
    return RS_OK;
}

/* Random prompt of ctx tokens, committed (chunk by chunk, as the engine's prefill). */
static int prefill(Backend *b, Rng *r, int ctx, RsErr *e) {
    int *tokens = rs_xmalloc(sizeof(int) * (size_t)ctx);
    int vocab = backend_model(b)->cfg.vocab_size;
    for (int i = 0; i < ctx; i++) tokens[i] = (int)(rng_next(r) % (uint64_t)vocab);
    backend_kv_reset(b);
    int rc = backend_prefill(b, tokens, ctx, NULL, e);
    free(tokens);
    return rc;
}

/* Greedy AR decoding of n tokens after the prefill, as rootspec-target's AR decoder does
 * it (target_root_pass, then backend_rows_stats): the row's logits stay in the backend and
 * its argmax comes from the backend's threaded reduction. Returns tok/s (wall clock) and
 * sets *cpu_tok_s to tokens per second of process CPU time (the figure a loaded machine
 * distorts least at 1 thread; at 2 the pool's spinning counts too). */
static double ar_tok_s(Backend *b, int n, double *cpu_tok_s, RsErr *e) {
    int tok = 1, zero = 0;
    uint8_t one = 1;
    double c0 = cpu_ms();
    uint64_t t0 = rs_now_ns();
    for (int i = 0; i < n; i++) {
        int p = backend_n_committed(b);
        RowStats st;
        if (backend_forward(b, &tok, &p, 1, &one, &zero, 1, NULL, e) ||
            backend_rows_stats(b, &zero, 1, &SAMPLING_GREEDY, NULL, &st, e) || backend_kv_commit(b, &zero, 1, e))
            return -1;
        tok = st.draw;
    }
    *cpu_tok_s = n / ((cpu_ms() - c0) / 1e3);
    return n / ((rs_now_ns() - t0) / 1e9);
}

/* A random tree of n nodes after a ctx-token prefill: mask, positions, tokens; *attended
 * gets the sum over nodes of entries attended (for attention flops). */
static void make_tree(Rng *r, int n, int ctx, int vocab, uint8_t *mask, int *pos, int *tokens,
                      long *attended) {
    int parent[MAX_N], depth[MAX_N];
    memset(mask, 0, (size_t)n * n);
    *attended = 0;
    for (int i = 0; i < n; i++) {
        parent[i] = i == 0 ? -1 : (int)(rng_next(r) % (uint64_t)i);
        depth[i] = parent[i] < 0 ? 0 : depth[parent[i]] + 1;
        pos[i] = ctx + depth[i];
        tokens[i] = (int)(rng_next(r) % (uint64_t)vocab);
        for (int u = i; u >= 0; u = parent[u]) {
            mask[i * n + u] = 1;
            (*attended)++;
        }
        *attended += ctx;
    }
}

/* Best and mean ms of `iters` tree passes of n nodes (2 warm-up passes). */
static int time_passes(Backend *b, Rng *r, int n, int iters, float *logits, double *best,
                       double *mean, double *best_cpu, long *attended, RsErr *e) {
    int ctx = backend_n_committed(b);
    static uint8_t mask[MAX_N * MAX_N];
    int pos[MAX_N], tokens[MAX_N], rows[MAX_N];
    for (int i = 0; i < n; i++) rows[i] = i;
    make_tree(r, n, ctx, backend_model(b)->cfg.vocab_size, mask, pos, tokens, attended);
    double sum = 0;
    *best = *best_cpu = 1e30;
    for (int it = -2; it < iters; it++) {
        uint64_t t0 = rs_now_ns();
        double c0 = cpu_ms();
        int rc = backend_forward(b, tokens, pos, n, mask, rows, n, logits, e);
        if (rc) return rc;
        double ms = (rs_now_ns() - t0) / 1e6, cms = cpu_ms() - c0;
        if (it >= 0 && cms < *best_cpu) *best_cpu = cms;
        backend_kv_commit(b, NULL, 0, e); /* drop the tree, keep the prefill */
        if (it < 0) continue;
        sum += ms;
        if (ms < *best) *best = ms;
    }
    *mean = sum / iters;
    return RS_OK;
}

/* Multiply-adds per token in the matrices (layers and head). */
static double matrix_params(const Config *c) {
    double q = (double)c->n_heads * c->head_dim, kv = (double)c->n_kv_heads * c->head_dim;
    double layer = (q + 2 * kv) * c->dim + c->dim * q + 3.0 * c->hidden_dim * c->dim;
    return layer * c->n_layers + (double)c->vocab_size * c->dim;
}

/* The one-row pass against a read stream of as many bytes (256 MiB at most), round by
 * round: each round reads them (each prefetch of read_thread, the best counts) right
 * before two passes and times the second (the stream's threads leave the pool's workers
 * asleep), so a neighbour's load moves both alike. *frac: the median over `rounds` of
 * pass GB/s / stream GB/s. (The best pass against the best stream, the table's %read,
 * pairs two moments.) */
static int paired_read_frac(Backend *b, int threads, double bytes, int rounds, float *logits,
                            double *frac, RsErr *e) {
    size_t sz = ((size_t)bytes + 4095) & ~(size_t)4095, most = (size_t)256 << 20;
    sz = sz < most ? sz : most; /* a larger model's GB/s from 256 MiB, not a third copy */
    /* Two regions read in turn: a region read twice in a row streams part of itself from a
     * large L3 (docs/PERF.md), which the pass, reading its weights after the stream, never
     * gets. */
    char *a = stream_buffer(2 * sz, 1);
    double *ratio = rs_xmalloc(sizeof(double) * (size_t)rounds);
    int tok = 1, zero = 0, pos = backend_n_committed(b), rc = RS_OK;
    for (int i = -1; i < rounds && !rc; i++) { /* round -1 warms up */
        double best = 0, gbs = 0;
        for (int pf = 0; pf < READ_PF_N; pf++) {
            double g = stream_once(a + (pf & 1) * sz, NULL, sz, threads, pf);
            best = g > best ? g : best;
        }
        for (int k = 0; k < 2 && !rc; k++) { /* the first wakes the pool's sleeping workers */
            uint64_t t0 = rs_now_ns();
            rc = backend_forward(b, &tok, &pos, 1, NULL, &zero, 1, logits, e);
            gbs = bytes / (double)(rs_now_ns() - t0);
            if (!rc) rc = backend_kv_commit(b, NULL, 0, e);
        }
        if (i >= 0) ratio[i] = gbs / best;
    }
    bench_sort(ratio, rounds);
    *frac = ratio[rounds / 2];
    free(ratio);
    rs_huge_free(a, 2 * sz);
    return rc;
}

/* One thread count: AR figure, pass table, the key=value line. *rss_kb: VmRSS with the
 * backend still alive (weights, KV cache, buffers); *kv_es: its KV cache's element bytes. */
static int run_threads(const Model *m, const Opts *o, int threads, double wbytes,
                       const MicroRoof *roof, long *rss_kb, size_t *kv_es, RsErr *e) {
    const Config *c = &m->cfg;
    BackendParams bp = {.kv_capacity = o->ctx + MAX_N + o->ar_tokens, .max_batch = PREFILL,
                        .max_pending = PREFILL, .threads = threads,
                        .cpu_kernels = o->cpu_kernels, .sw = o->sw};
    Backend *b = NULL;
    int rc = backend_create(&cpu_backend_ops, m, &bp, &b, e);
    if (rc) return rc;
    Rng r;
    rng_seed(&r, 42);
    float *logits = rs_xmalloc(sizeof(float) * MAX_N * c->vocab_size);
    double mem = stream_gbs(threads, 1), rd = stream_gbs(threads, 0), ar = -1, ar_cpu = -1;
    if (!(rc = prefill(b, &r, o->ctx, e)) &&
        (ar = ar_tok_s(b, o->ar_tokens, &ar_cpu, e)) < 0)
        rc = e->code;
    if (!rc) rc = prefill(b, &r, o->ctx, e);
    /* per token: the weights once, plus K and V of every layer over the context read */
    *kv_es = backend_kv_es(b);
    double kv = kv_mb(c, o->ctx + 1, *kv_es) * 1e6;
    printf("\nthreads %d, kernels %s, KV cache %s: AR %.1f tok/s (%.1f per CPU second); memcpy "
           "%.1f GB/s (read+write), read stream %.1f GB/s\n", threads, cpu_backend_kernels(b),
           cpu_backend_kv(b), ar, ar_cpu, mem, rd);
    printf("%4s %9s %9s %9s %12s %8s %7s %9s\n", "n", "ms(mean)", "ms(best)", "cpu_ms",
           "streamGB/s", "%memcpy", "%read", "GFLOP/s");
    /* 5: a root pass's chain of four (a full-model drafter's tree), against 1 */
    static const int sizes[4] = {1, 5, 9, MAX_N};
    double best[4] = {0}, bcpu[4] = {0}, means[4] = {0}, mean;
    for (int si = 0; si < 4 && !rc; si++) {
        long att;
        rc = time_passes(b, &r, sizes[si], o->iters, logits, &best[si], &mean, &bcpu[si], &att,
                         e);
        if (rc) break;
        means[si] = mean;
        double attn = 4.0 * c->n_heads * c->head_dim * (double)att * c->n_layers;
        double flops = 2.0 * matrix_params(c) * sizes[si] + attn;
        double gbs = (wbytes + kv) / (best[si] * 1e6);
        printf("%4d %9.2f %9.2f %9.2f %12.2f %7.1f%% %6.1f%% %9.2f\n", sizes[si], mean, best[si],
               bcpu[si], gbs, 100.0 * gbs / mem, 100.0 * gbs / rd, flops / (best[si] * 1e6));
    }
    double paired = 0;
    if (!rc) rc = paired_read_frac(b, threads, wbytes + kv, o->iters, logits, &paired, e);
    if (!rc)
        printf("one-row pass against a read stream of its bytes just before it: median %.1f%% "
               "over %d rounds%s\n", 100.0 * paired, o->iters,
               wbytes + kv < 64e6 ? " (bytes a cache may hold: not a memory figure)" : "");
    if (!rc)
        printf("micro threads=%d kernels=%s ar_tok_s=%.2f pass_ms_n1=%.3f pass_ms_n9=%.3f "
               "pass_ms_n65=%.3f cpu_ms_n1=%.3f cpu_ms_n9=%.3f cpu_ms_n65=%.3f "
               "bytes_per_token=%.0f copy_gbs=%.2f bw_frac_n1=%.3f read_gbs=%.2f "
               "read_frac_n1=%.3f read_pair_frac_n1=%.3f vmrss_kb=%ld\n",
               threads, cpu_backend_kernels(b), ar, best[0], best[2], best[3], bcpu[0], bcpu[2],
               bcpu[3], wbytes + kv, mem,
               (wbytes + kv) / (best[0] * 1e6) / mem, rd, (wbytes + kv) / (best[0] * 1e6) / rd,
               paired, *rss_kb = vm_rss_kb());
    /* against the roof on `threads` cores: near 1 = the kernels' arithmetic is the limit */
    if (!rc)
        printf("roof_frac_n1_t%d=%.3f\nroof_frac_n65_t%d=%.3f\n", threads,
               roof->ms_n1 / threads / best[0], threads, roof->ms_n65 / threads / best[3]);
    /* a memory-bound tree pass of a few rows costs about a one-row pass (best of each) */
    if (!rc)
        printf("pass_ratio_n5_n1_t%d=%.3f\n", threads, best[1] / best[0]);
    /* against the read stream (the one-row pass's bound), both ways */
    if (!rc)
        printf("read_frac_n1_t%d=%.3f\nread_pair_frac_n1_t%d=%.3f\n", threads,
               (wbytes + kv) / (best[0] * 1e6) / rd, threads, paired);
    /* the keys tools/llama_peer.py prints, for tools/peer-compare.sh */
    if (!rc) {
        printf("ar_tok_s_t%d=%.2f\nar_cpu_tok_s_t%d=%.2f\nkernels_t%d=%s\n", threads, ar, threads,
               ar_cpu, threads, cpu_backend_kernels(b));
        for (int si = 0; si < 4; si++)
            printf("pass_ms_n%d_t%d=%.2f\npass_best_ms_n%d_t%d=%.2f\n", sizes[si], threads,
                   means[si], sizes[si], threads, best[si]);
    }
    free(logits);
    backend_destroy(&b);
    return rc;
}

/* The resident-memory target: fills an o->rss_ctx-entry KV cache through the engine's
 * chunked prefill (at the largest thread count asked for) and sets VmRSS against model
 * file + KV cache + 64 MB. Returns 1 when over budget, -1 on a backend error. */
static int rss_check(const Model *m, const Opts *o, double file_mb, RsErr *e) {
    int th = 1;
    for (int i = 0; i < o->n_threads; i++) th = o->threads[i] > th ? o->threads[i] : th;
    BackendParams bp = {.kv_capacity = o->rss_ctx, .max_batch = PREFILL, .max_pending = PREFILL,
                        .threads = th, .cpu_kernels = o->cpu_kernels, .sw = o->sw};
    Backend *b = NULL;
    if (backend_create(&cpu_backend_ops, m, &bp, &b, e)) return -1;
    int *tokens = rs_xmalloc(sizeof(int) * o->rss_ctx);
    for (int i = 0; i < o->rss_ctx; i++) tokens[i] = (int)(((uint64_t)i * 7919) % m->cfg.vocab_size);
    uint64_t t0 = rs_now_ns();
    int rc = backend_prefill(b, tokens, o->rss_ctx, NULL, e);
    free(tokens);
    double rss = vm_rss_kb() / 1e3, kv = kv_mb(&m->cfg, o->rss_ctx, backend_kv_es(b));
    double budget = file_mb + kv + 64;
    backend_destroy(&b);
    if (rc) return -1;
    printf("\nKV cache of %d entries filled (%.1f s, %d threads): VmRSS %.1f MB vs file %.1f + "
           "KV %.1f + 64 = %.1f MB: %s\nrss_ctx=%d\nrss_full_mb=%.0f\nrss_budget_mb=%.0f\n",
           o->rss_ctx, (rs_now_ns() - t0) / 1e9, th, rss, file_mb, kv, budget,
           rss <= budget ? "within" : "OVER", o->rss_ctx, rss, budget);
    return rss > budget;
}

/* --eagle3: the target without its weights (embedding rows are read on demand), the read
 * stream at each thread count, then the head's rounds (bench/micro_eagle3.c). */
static int eagle3_main(const Opts *o) {
    RsErr e = {0};
    Model *m = NULL;
    int rc = model_load(o->model_path, &m, &e);
    if (rc) {
        fprintf(stderr, "rootspec-micro: %s\n", e.msg);
        return cli_exit_status(rc);
    }
    double gbs[MAX_THREADS];
    for (int i = 0; i < o->n_threads; i++) gbs[i] = stream_gbs(o->threads[i], 0);
    rc = micro_eagle3(o->eagle3, m, o->cpu_kernels, &o->sw, o->threads, gbs, o->n_threads,
                      o->ctx, o->draft_rounds > 0 ? o->draft_rounds : 1, &e);
    model_destroy(&m);
    if (rc) fprintf(stderr, "rootspec-micro: %s\n", e.msg);
    return rc ? cli_exit_status(rc) : 0;
}

int main(int argc, char **argv) {
    Opts o;
    RsErr e = {0};
    if (parse_opts(argc, argv, &o, &e)) {
        fprintf(stderr, "rootspec-micro: %s\n", e.msg);
        return 2;
    }
    if (o.eagle3) return eagle3_main(&o);
    long rss0 = vm_rss_kb();
    Model *m = NULL;
    BackendParams lp = {.cpu_kernels = o.cpu_kernels, .sw = o.sw};
    int lrc = backend_model_load(&cpu_backend_ops, o.model_path, &lp, &m, &e); /* random: too */
    if (lrc) {
        fprintf(stderr, "rootspec-micro: %s\n", e.msg);
        return cli_exit_status(lrc);
    }
    const Config *c = &m->cfg;
    long span = (long)o.ctx + (o.ar_tokens > MAX_N ? o.ar_tokens : MAX_N);
    if (span > c->max_seq_len) /* speed is still measurable there; the logits are not meant */
        fprintf(stderr, "rootspec-micro: note: --ctx %d, then %d AR tokens or a %d-row tree, "
                "reach %ld positions, past the %d the model was trained for: timings only\n",
                o.ctx, o.ar_tokens, MAX_N, span, c->max_seq_len);
    double wbytes = (double)model_weight_bytes(m);
    struct stat st;
    double file_mb = stat(o.model_path, &st) == 0 && S_ISREG(st.st_mode) ? st.st_size / 1e6 : 0;
    QTensor **mats = rs_xmalloc(sizeof(QTensor *) * MODEL_MAX_MATRICES(c->n_layers));
    int n_mats = model_matrices(m, mats), n_x4 = 0;
    for (int i = 0; i < n_mats; i++) n_x4 += mats[i]->packed;
    free(mats);
    printf("model %s: %d layers, dim %d, vocab %d; %.1f MB of matrices streamed per token "
           "(stored types; %d of %d matrices in x4 tiles), file %.1f MB; VmRSS %.1f MB before "
           "load\nx4_matrices=%d\n", o.model_path, c->n_layers, c->dim, c->vocab_size,
           wbytes / 1e6, n_x4, n_mats, file_mb, rss0 / 1e3, n_x4);
    MicroRoof roof;
    int rc = micro_compute_roof(m, o.cpu_kernels, &roof, &e);
    if (!rc)
        printf("compute roof (1 thread, each matrix's kernel on a slice in L2, scaled to the "
               "model; no attention): n = 1 %.2f ms (%.1f G weight-token products/s), n = 65 "
               "%.1f ms (%.1f G/s in 4-token groups)\nroof_ms_n1=%.3f\nroof_ms_n65=%.3f\n",
               roof.ms_n1, roof.gw_n1, roof.ms_n65, roof.gw_n4, roof.ms_n1, roof.ms_n65);
    long rss = 0, rss_t = 0;
    size_t kv_es = sizeof(float);
    for (int i = 0; i < o.n_threads && !rc; i++) {
        rc = run_threads(m, &o, o.threads[i], wbytes, &roof, &rss_t, &kv_es, &e);
        rss = rss_t > rss ? rss_t : rss;
        double us_row;
        if (!rc && o.draft_rounds)
            rc = micro_drafter_host(m, o.threads[i], o.cpu_kernels, &o.sw, o.draft_rounds,
                                    &us_row, &e);
    }
    if (!rc) {
        double kv = kv_mb(c, o.ctx + MAX_N + o.ar_tokens, kv_es);
        printf("\nVmRSS %.1f MB at most with a backend alive (weights + KV cache + "
               "buffers) vs file %.1f + KV %.1f + 64 = %.1f MB\nrss_mb=%.0f\n",
               rss / 1e3, file_mb, kv, file_mb + kv + 64, rss / 1e3);
    }
    int over = !rc && o.rss_ctx ? rss_check(m, &o, file_mb, &e) : 0;
    if (rc || over < 0) fprintf(stderr, "rootspec-micro: %s\n", e.msg);
    model_destroy(&m);
    return rc || over < 0 ? 1 : 0;
}
