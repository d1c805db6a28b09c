/* rootspec-kbench: micro-benchmark of the CPU matrix kernels alone (kernels/cpu/cpu_qmatmul.h),
 * one weight type and token count at a time, on one thread. For each case it times
 * qk_matmul_rows over a whole synthetic matrix, min of --reps runs (the machine may be
 * shared, so the minimum is the figure that means something):
 *   stream  a matrix far larger than the caches (--mb MiB at n = 1): GB/s of weights read;
 *           for n > 1 also GFLOP/s (2 * rows * cols * n per pass)
 *   hot     a matrix that stays in the caches (--hot-kb, default 192 KiB: L2), at each n: TSC cycles and ns per 32-weight block and
 *           token, i.e. the kernel's instruction cost without the memory system.
 *   attn    (--attn CTX) one token's attention over CTX cache entries in every head of
 *           SmolLM2-135M's 30 layers (9 heads sharing 3 KV heads of 64), with the KV cache
 *           type the backend picks (ROOTSPEC_CPU_KV=f32 forces f32): ns per (entry, head)
 *           and GB/s of cache read, the caches far larger than L2 as in a decode step.
 * Output: one "kbench key=value ..." line per case. Hardware cycle counters are not
 * always available (VMs), hence the TSC, which ticks at a fixed rate. */
#include "kweights.h"
#include "common/cli.h"
#include "common/model.h"
#include "common/quant.h"
#include "common/rng.h"
#include "kernels/cpu/cpu_qmatmul.h"
#include "kernels/cpu/x86/x4_pack.h"
#include <stdio.h>
#include <string.h>
#include <x86intrin.h>

static const uint32_t kAll[] = {QT_Q4_1, QT_Q4_0, QT_Q8_0, QT_F16, QT_BF16, QT_F32,
                                QT_Q5_0, QT_Q5_1, QT_Q4_K, QT_Q5_K, QT_Q6_K};
#define N_ALL ((int)(sizeof kAll / sizeof kAll[0]))

typedef struct {
    const char *family;
    uint32_t types[N_ALL];
    int n_types, ns[8], n_ns, reps, mb, cols, hot_kb;
    int x4; /* --layout: 1 x4 tiles where the family has them (the backend's), 0 rows */
    int attn[8], n_attn; /* --attn: cache lengths (then no matrix cases) */
    BackendSwitches sw;  /* the environment's: sw.cpu_kv_f32 for --attn */
} Opts;

static void usage(FILE *f) {
    fprintf(f, "usage: rootspec-kbench [--family NAME] [--types LIST] [--n LIST] [--reps K]\n"
               "                       [--mb M] [--cols C] [--layout rows|x4]\n"
               "  --family NAME  ref|scalar|avx2|avx512|amx (default: the best this CPU runs)\n"
               "  --types LIST   comma-separated ggml type names (default: all kernel types)\n"
               "  --n LIST       token counts (default 1,4,9,65)\n"
               "  --reps K       timed runs per case, the minimum is reported (default 9)\n"
               "  --mb M         weight MiB of the streamed matrix at n = 1 (default 64)\n"
               "  --hot-kb K     weight KiB of the cache-resident matrix (default 192: L2)\n"
               "  --layout L     rows | x4: weights in rows or, for the types the family\n"
               "                 has x4 kernels for, in tiles of 4 rows as the CPU backend\n"
               "                 loads them (default x4)\n"
               "  --cols C       columns (input size; default 576, SmolLM2-135M's dim;\n"
               "                 rounded up to whole 256-blocks for the K-quants)\n"
               "  --attn LIST    instead: attention of one token over LIST cache entries\n"
               "                 (SmolLM2-135M's heads and layers; comma-separated)\n");
}

/* A --n or --attn list of integers in [1, max] into vals (at most 8). */
static int parse_ints(const char *opt, const char *v, int max, int *vals, int *n, RsErr *e) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", v);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (*n == 8) return rs_err(e, RS_EINVAL, "%s: at most 8 values", opt);
        int rc = cli_int(opt, t, 1, max, &vals[(*n)++], e);
        if (rc) return rc;
    }
    return RS_OK;
}

static int parse_types(const char *opt, const char *v, Opts *o, RsErr *e) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", v);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int k = 0;
        while (k < N_ALL && strcasecmp(t, quant_type_name(kAll[k]))) k++;
        if (k == N_ALL) return rs_err(e, RS_EINVAL, "%s: unknown type '%s'", opt, t);
        if (o->n_types == N_ALL) return rs_err(e, RS_EINVAL, "%s: too many types", opt);
        o->types[o->n_types++] = kAll[k];
    }
    return RS_OK;
}

static int parse_opts(int argc, char **argv, Opts *o, RsErr *e) {
    *o = (Opts){.reps = 9, .mb = 64, .cols = 576, .hot_kb = 192, .x4 = 1};
    const char *env_family = NULL; /* --family names the family here */
    int env_rc = cli_backend_env(&env_family, &o->sw, e);
    if (env_rc) return env_rc;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        }
        int rc = cli_value(argc, argv, i++, &v, e);
        if (rc) return rc;
        if (!strcmp(a, "--family")) o->family = v;
        else if (!strcmp(a, "--types")) rc = parse_types(a, v, o, e);
        else if (!strcmp(a, "--n")) rc = parse_ints(a, v, 1024, o->ns, &o->n_ns, e);
        else if (!strcmp(a, "--attn")) rc = parse_ints(a, v, 1 << 16, o->attn, &o->n_attn, e);
        else if (!strcmp(a, "--reps")) rc = cli_int(a, v, 1, 1000, &o->reps, e);
        else if (!strcmp(a, "--mb")) rc = cli_int(a, v, 1, 4096, &o->mb, e);
        else if (!strcmp(a, "--hot-kb")) rc = cli_int(a, v, 4, 65536, &o->hot_kb, e);
        else if (!strcmp(a, "--layout")) {
            if (strcmp(v, "x4") && strcmp(v, "rows"))
                rc = rs_err(e, RS_EINVAL, "--layout %s: expected rows or x4", v);
            o->x4 = !strcmp(v, "x4");
        }
        else if (!strcmp(a, "--cols")) rc = cli_int(a, v, 256, 65536, &o->cols, e);
        else return rs_err(e, RS_EINVAL, "unknown option '%s' (see --help)", a);
        if (rc) return rc;
    }
    if (o->cols % QK_BLOCK)
        return rs_err(e, RS_EINVAL, "--cols %d is not a multiple of %d", o->cols, QK_BLOCK);
    if (!o->n_types) memcpy(o->types, kAll, sizeof kAll), o->n_types = N_ALL;
    if (!o->n_ns) o->ns[0] = 1, o->ns[1] = 4, o->ns[2] = 9, o->ns[3] = 65, o->n_ns = 4;
    return RS_OK;
}

typedef struct {
    double best_ns;
    uint64_t best_tsc;
} Timing;

/* Sum over row chunks (~1 MiB of weights / n) of each chunk's minimum over the runs: with
 * other processes on the machine a whole pass is nearly always preempted, a millisecond
 * chunk often not. A chunk's weights are out of the caches at each run when the matrix is
 * larger than them (the rest of the matrix went through in between). */
static Timing time_pass(const QkFamily *f, const QTensor *w, const QkActs *a, float *y,
                        float *scratch, int reps) {
    int chunk = (int)(((size_t)1 << 20) / w->row_bytes / (size_t)a->n) & ~7;
    /* at least the rows of one kernel call, as the backend's regions give (a call lays
     * out its tokens once for all its tiles) */
    if (chunk < QK_CHUNK * QK_ROWS) chunk = QK_CHUNK * QK_ROWS;
    int nc = (w->rows + chunk - 1) / chunk;
    double *ns = rs_xmalloc(sizeof(double) * nc);
    uint64_t *tsc = rs_xmalloc(sizeof(uint64_t) * nc);
    for (int r = 0; r < reps + 1; r++) /* the first run only warms up */
        for (int c = 0; c < nc; c++) {
            int j0 = c * chunk, j1 = j0 + chunk < w->rows ? j0 + chunk : w->rows;
            uint64_t c0 = __rdtsc(), t0 = rs_now_ns();
            qk_matmul_rows(f, w, a, y, w->rows, j0, j1, scratch);
            uint64_t c1 = __rdtsc(), t1 = rs_now_ns();
            if (r == 1 || (r > 1 && (double)(t1 - t0) < ns[c])) ns[c] = (double)(t1 - t0);
            if (r == 1 || (r > 1 && c1 - c0 < tsc[c])) tsc[c] = c1 - c0;
        }
    Timing t = {0, 0};
    for (int c = 0; c < nc; c++) t.best_ns += ns[c], t.best_tsc += tsc[c];
    free(ns);
    free(tsc);
    return t;
}

/* One (type, n) case: a matrix of about `bytes` weight bytes, n random activation rows. */
static void run_case(const QkFamily *f, uint32_t type, int n, size_t bytes, int cols, int reps,
                     int hot, int x4, Rng *r) {
    size_t be, bb;
    RS_ASSERT(quant_type_geometry(type, &be, &bb) == 0);
    cols = (int)((cols + be - 1) / be * be); /* K-quants: whole 256-blocks */
    size_t row_bytes = (size_t)cols / be * bb;
    int rows = (int)(bytes / row_bytes);
    rows = rows < 8 ? 8 : rows & ~7;
    uint8_t *data = rs_huge_alloc((size_t)rows * row_bytes); /* as model_make_resident */
    RS_ASSERT(data);
    kweights_fill(type, data, (size_t)rows * row_bytes, r);
    QTensor w = {type, data, rows, cols, row_bytes, 0, 0};
    if (x4 && qk_family_packs(f, type)) qtensor_pack_x4(&w); /* as the CPU backend's load */
    float *x = rs_xcalloc_lines((size_t)n * cols, sizeof(float)); /* as the backend's rows */
    float *y = rs_xmalloc(sizeof(float) * n * rows);
    float *scratch = rs_xmalloc(sizeof(float) * cols);
    QkQ8 *q8 = rs_xmalloc(sizeof(QkQ8) * n * (cols / QK_BLOCK));
    QkQ8K *q8k = rs_xmalloc(sizeof(QkQ8K) * n * (cols / QK_K + 1));
    for (int i = 0; i < n * cols; i++) x[i] = (float)(rng_uniform(r) * 2 - 1);
    QkActs a = {.f32 = x, .n = n, .in = cols};
    qk_acts_quantize(f, &a, qk_wants_act(f, type), q8, q8k);
    Timing t = time_pass(f, &w, &a, y, scratch, reps);
    double blocks = (double)rows * cols / QK_BLOCK * n, wbytes = (double)rows * row_bytes;
    printf("kbench family=%s type=%s layout=%s n=%d mode=%s rows=%d cols=%d ms=%.3f gbs=%.2f "
           "gflops=%.2f ns_per_block=%.3f tsc_per_block=%.2f\n",
           f->name, quant_type_name(type), w.packed ? "x4" : "rows", n, hot ? "hot" : "stream", rows, cols,
           t.best_ns / 1e6, wbytes / t.best_ns, 2.0 * rows * cols * n / t.best_ns,
           t.best_ns / blocks, (double)t.best_tsc / blocks);
    fflush(stdout);
    rs_huge_free(data, (size_t)rows * row_bytes);
    free(x);
    free(y);
    free(scratch);
    free(q8);
    free(q8k);
}

/* SmolLM2-135M's attention geometry: the --attn cases time what its decode step does. */
enum { ATT_LAYERS = 30, ATT_HEADS = 9, ATT_KV_HEADS = 3, ATT_HD = 64 };

/* One sweep: every layer's groups, as the backend calls them. kc/vc hold f32 or, when
 * es == 2, f16 rows (the backend's layout: (layers, kv_heads, ctx, hd)). */
static void attn_sweep(const QkFamily *f, const uint8_t *kc, const uint8_t *vc, size_t es,
                       int ctx, const float *q, float *o, float *att) {
    int group = ATT_HEADS / ATT_KV_HEADS;
    for (int l = 0; l < ATT_LAYERS; l++)
        for (int h = 0; h < ATT_HEADS; h += group) {
            size_t off = ((size_t)l * ATT_KV_HEADS + h / group) * ctx * ATT_HD * es;
            qk_attention(f, es == 2, o + h * ATT_HD, q + h * ATT_HD, kc + off, vc + off, ATT_HD,
                         ctx, NULL, ctx, ATT_HD, group, att);
        }
}

/* One token's attention over ctx committed entries in every head of ATT_LAYERS layers,
 * with the caches the backend would give this family (f16 where it has f16 attention,
 * unless kv_f32, ROOTSPEC_CPU_KV=f32): the minimum over reps of the whole sweep. */
static void run_attn(const QkFamily *f, int kv_f32, int ctx, int reps, Rng *r) {
    size_t es = qk_kv_f16(f, ATT_HD, kv_f32) ? 2 : sizeof(float);
    size_t n = (size_t)ctx * ATT_KV_HEADS * ATT_HD * ATT_LAYERS;
    uint8_t *kc = rs_huge_alloc(es * n), *vc = rs_huge_alloc(es * n);
    float *row = rs_xmalloc(sizeof(float) * n), q[ATT_HEADS * ATT_HD], o[ATT_HEADS * ATT_HD];
    RS_ASSERT(kc && vc); /* huge pages, as the backend's caches */
    for (size_t i = 0; i < n; i++) row[i] = (float)(rng_uniform(r) - 0.5);
    if (es == 2) f->to_f16((uint16_t *)(void *)kc, row, (int)n);
    else memcpy(kc, row, sizeof(float) * n);
    memcpy(vc, kc, es * n);
    for (int i = 0; i < ATT_HEADS * ATT_HD; i++) q[i] = (float)(rng_uniform(r) - 0.5);
    float *att = rs_xmalloc(sizeof(float) * ATT_HEADS * ctx);
    double best = 0;
    for (int rep = 0; rep < reps + 1; rep++) { /* the first run only warms up */
        uint64_t t0 = rs_now_ns();
        attn_sweep(f, kc, vc, es, ctx, q, o, att);
        double ns = (double)(rs_now_ns() - t0);
        if (rep == 1 || (rep > 1 && ns < best)) best = ns;
    }
    double eh = (double)ctx * ATT_HEADS * ATT_LAYERS;
    printf("kbench family=%s attn kv=%s ctx=%d layers=%d heads=%d kv_heads=%d hd=%d ms=%.3f "
           "ns_per_entry_head=%.3f cache_gbs=%.2f\n",
           f->name, es == 2 ? "f16" : "f32", ctx, ATT_LAYERS, ATT_HEADS, ATT_KV_HEADS, ATT_HD,
           best / 1e6, best / eh, 2.0 * es * (double)n / best);
    fflush(stdout);
    rs_huge_free(kc, es * n);
    rs_huge_free(vc, es * n);
    free(row);
    free(att);
}

int main(int argc, char **argv) {
    Opts o;
    RsErr e = {0};
    if (parse_opts(argc, argv, &o, &e)) {
        fprintf(stderr, "rootspec-kbench: %s\n", e.msg);
        return 2;
    }
    const QkFamily *f = qk_family_pick(o.family, &e);
    if (!f) {
        fprintf(stderr, "rootspec-kbench: %s\n", e.msg);
        return 2;
    }
    Rng r;
    rng_seed(&r, 1);
    for (int k = 0; k < o.n_attn; k++) run_attn(f, o.sw.cpu_kv_f32, o.attn[k], o.reps, &r);
    if (o.n_attn) return 0;
    for (int ti = 0; ti < o.n_types; ti++) {
        for (int k = 0; k < o.n_ns; k++) {
            int n = o.ns[k];
            run_case(f, o.types[ti], n, (size_t)o.hot_kb << 10, o.cols, o.reps * 20, 1, o.x4, &r);
            size_t bytes = ((size_t)o.mb << 20) / (n < 4 ? 1 : (size_t)n / 4);
            if (bytes < ((size_t)2 << 20)) bytes = (size_t)2 << 20;
            run_case(f, o.types[ti], n, bytes, o.cols, o.reps, 0, o.x4, &r);
        }
    }
    return 0;
}
