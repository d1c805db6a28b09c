/* What the AMX family costs outside its tile instructions, measured on any AVX2 machine:
 * the family's own source (tests/qk_amx_emu.c) built with every tile load, store and
 * product a no-op, so what remains is the work around them (weights into B tiles, token
 * tiles, the float steps after each product). Set against the AVX2 family's whole
 * computation on the same packed weights, old and new alternating: an AMX path whose
 * overhead alone exceeds the register tiles' total cannot win on an AMX machine.
 * Outputs are meaningless (the products are not computed); only time is reported.
 * `make amx-overhead`; usage: build/amx-overhead [TOKENS] [ROWS] [REPS]. */
#define QK_AMX_NULL 1
#include "qk_amx_emu.c"

#include "bench/kweights.h"
#include "bench/stats.h"
#include "common/quant.h"
#include "common/rng.h"
#include "common/util.h"
#include "kernels/cpu/x86/x4_pack.h"
#include <stdio.h>
#include <stdlib.h>
#include <x86intrin.h>

/* Median TSC a (row, 32 weights, token) of the two families on one matrix, alternating. */
static void measure(uint32_t type, int n, int rows, int reps, const QkFamily *f2, const QkFamily *fa) {
    int cols = type >= QT_Q4_K && type <= QT_Q6_K ? 1024 : 576;
    size_t be, bb;
    quant_type_geometry(type, &be, &bb);
    size_t rb = (size_t)cols / be * bb;
    Rng r;
    rng_seed(&r, 7);
    uint8_t *data = rs_huge_alloc((size_t)rows * rb);
    kweights_fill(type, data, (size_t)rows * rb, &r);
    QTensor w = {type, data, rows, cols, rb, 0, 0};
    qtensor_pack_x4(&w);
    float *x = rs_xmalloc(sizeof(float) * n * cols), *y = rs_xmalloc(sizeof(float) * n * rows);
    float *scr = rs_xmalloc(sizeof(float) * cols);
    for (int i = 0; i < n * cols; i++) x[i] = (float)(rng_uniform(&r) * 2 - 1);
    QkQ8 *q8 = rs_xmalloc(sizeof(QkQ8) * n * (cols / 32));
    QkQ8K *q8k = rs_xmalloc(sizeof(QkQ8K) * n * (cols / 256 + 1));
    QkActs a = {.f32 = x, .n = n, .in = cols};
    qk_acts_quantize(f2, &a, qk_wants_act(f2, type), q8, q8k);
    double *t[2] = {rs_xmalloc(sizeof(double) * reps), rs_xmalloc(sizeof(double) * reps)};
    for (int k = 0; k < 2 * reps + 2; k++) {
        const QkFamily *f = k & 1 ? fa : f2;
        uint64_t c0 = __rdtsc();
        qk_matmul_rows(f, &w, &a, y, rows, 0, rows, scr);
        if (k >= 2) t[k & 1][(k - 2) / 2] = (double)(__rdtsc() - c0);
    }
    double bt = (double)rows * cols / 32 * n;
    for (int i = 0; i < 2; i++) bench_sort(t[i], reps);
    printf("amx_overhead type=%s n=%d rows=%d cols=%d avx2_tsc=%.3f amx_without_tiles_tsc=%.3f ratio=%.2f\n",
           quant_type_name(type), n, rows, cols, t[0][reps / 2] / bt, t[1][reps / 2] / bt,
           t[1][reps / 2] / t[0][reps / 2]);
    free(t[0]), free(t[1]), free(x), free(y), free(scr), free(q8), free(q8k);
    rs_huge_free(data, (size_t)rows * rb);
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 16, rows = argc > 2 ? atoi(argv[2]) : 2048;
    int reps = argc > 3 ? atoi(argv[3]) : 9;
    RsErr e = {0};
    const QkFamily *f2 = qk_family_pick("avx2", &e);
    if (!f2 || n < 1 || n > 64 || rows < 16 || rows % 16 || reps < 1) {
        fprintf(stderr, "usage: amx-overhead [TOKENS 1..64] [ROWS, a multiple of 16] [REPS]%s%s\n",
                f2 ? "" : "; this CPU has no AVX2: ", f2 ? "" : e.msg);
        return 2;
    }
    printf("# TSC a (row, 32 weights, token), median of %d; cpu family avx2; amx = the amx family's "
           "source with its tile instructions as no-ops\n", reps);
    static const uint32_t types[] = {QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1, QT_Q8_0, QT_Q4_K, QT_Q5_K, QT_Q6_K};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        measure(types[i], n, rows, reps, f2, &qk_family_amx_emu);
    return 0;
}
