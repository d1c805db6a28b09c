/* One-off timing of an EAGLE-3 head round on the CPU (not a Check suite): a commit of
 * --commit rows with target features, then the DESIGN.md §2 pool growth (7 expansion passes of
 * 10 nodes), repeated --rounds times on THREADS threads, with the bytes of the head's
 * matrices per pass and the rate they stream at. HEAD: a random:eagle3-* preset (f32
 * weights) or a head directory (weights in their stored type). The target's embedding
 * table is calloc'd (zero rows, only the looked-up pages become resident), so a
 * Llama-3-vocabulary head runs without a 2 GiB table. Build and run from the repository
 * root after `make`:
 *   cc -O2 -std=c11 -D_GNU_SOURCE -I. $(pkg-config --cflags libcjson) \
 *      tests/eagle3_timing.c build/librootspec.a -o build/eagle3-timing \
 *      $(pkg-config --libs libzmq libcjson libpcre2-8 libutf8proc) -lmsgpackc -lm -pthread
 *   ./build/eagle3-timing random:eagle3-llama3-8b 4 3 [THREADS] */
#include "draft_proc/eagle3_forward.h"
#include "common/randmodel.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    const char *spec = argc > 1 ? argv[1] : "random:eagle3-tiny";
    int n_commit = argc > 2 ? atoi(argv[2]) : 4, rounds = argc > 3 ? atoi(argv[3]) : 3;
    int threads = argc > 4 ? atoi(argv[4]) : 1;
    RsErr e = {0};
    Eagle3Head *h;
    uint64_t t0 = rs_now_ns();
    if (eagle3_path_is_random(spec) ? eagle3_head_random(spec, 1, &h, &e)
                                    : eagle3_head_load(spec, &h, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 2;
    }
    int D = h->cfg.c.dim, F = 3 * h->cfg.target_hidden, DV = h->cfg.draft_vocab;
    float *emb = calloc((size_t)h->cfg.c.vocab_size * D, sizeof(float));
    float *feats = malloc(sizeof(float) * (size_t)n_commit * F), *st = malloc(sizeof(float) * D);
    float *lg = malloc(sizeof(float) * DV);
    Pool *p = calloc(1, sizeof *p);
    for (size_t i = 0; i < (size_t)n_commit * F; i++) feats[i] = rs_rand_unit(5, i);
    Eagle3Runner *r;
    Eagle3Embed em = {.table = qtensor_f32(emb, h->cfg.c.vocab_size, D)};
    BackendParams bp = {.kv_capacity = 4096, .max_batch = 16, .threads = threads};
    if (!emb || eagle3_runner_create_on(h, &em, &cpu_eagle3_rows, &bp, &r, &e)) {
        fprintf(stderr, "runner: %s\n", e.msg);
        return 1;
    }
    const QTensor *ms[] = {&h->fc, &h->wq, &h->wk, &h->wv, &h->wo, &h->w_gate, &h->w_up,
                           &h->w_down, &h->lm_head};
    double gb = 0; /* a pass's matrices (fc only in a commit; expansions skip it) */
    for (int i = 1; i < 9; i++) gb += (double)ms[i]->rows * ms[i]->row_bytes / 1e9;
    printf("%s: made in %.1f s (dim %d, draft vocab %d, %d threads, %.3f GB of matrices a "
           "pass, fc aside)\n", spec, (rs_now_ns() - t0) / 1e9, D, DV, threads, gb);
    int toks[64];
    for (int round = 0; round < rounds; round++) {
        for (int i = 0; i < n_commit; i++) toks[i] = h->d2t[(round * 7 + i) % DV];
        uint64_t a = rs_now_ns();
        if (eagle3_commit(r, toks, feats, n_commit, st, lg, &e) ||
            eagle3_grow_pool(r, st, lg, p, &e)) {
            fprintf(stderr, "round %d: %s\n", round, e.msg);
            return 1;
        }
        uint64_t b = rs_now_ns();
        printf("round %d: commit %d rows + pool growth (%d passes, %d candidates): %.1f ms "
               "(growth %.1f ms: %.1f GB/s of matrices)\n", round, n_commit, p->n_passes - 1,
               p->n, (b - a) / 1e6, p->draft_ns / 1e6, gb * 7 / (p->draft_ns / 1e9));
    }
    eagle3_runner_destroy(&r);
    eagle3_head_destroy(&h);
    free(emb);
    free(feats);
    free(st);
    free(lg);
    free(p);
    return 0;
}
