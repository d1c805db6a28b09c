/* One-off timing of an EAGLE-3 head round on the CPU (not a Check suite): a commit of
 * --commit rows with target features, then the DESIGN.md §2 pool growth (7 expansion passes of
 * 10 nodes), repeated --rounds times. The target's embedding table is calloc'd (zero rows,
 * only the looked-up pages become resident), so a Llama-3-vocabulary head runs without a
 * 2 GiB table. Build and run from the repository root after `make`:
 *   cc -O2 -std=c11 -D_GNU_SOURCE -I. $(pkg-config --cflags cjson) \
 *      tests/eagle3_timing.c build/librootspec.a -o build/eagle3-timing \
 *      $(pkg-config --libs libzmq libcjson libpcre2-8 libutf8proc) -lmsgpackc -lm -pthread
 *   ./build/eagle3-timing random:eagle3-llama3-8b 4 3 */
#include "draft_proc/eagle3_forward.h"
#include "common/randmodel.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    const char *spec = argc > 1 ? argv[1] : "random:eagle3-tiny";
    int n_commit = argc > 2 ? atoi(argv[2]) : 4, rounds = argc > 3 ? atoi(argv[3]) : 3;
    RsErr e = {0};
    Eagle3Head *h;
    uint64_t t0 = rs_now_ns();
    if (eagle3_head_random(spec, 1, &h, &e)) {
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
    if (!emb || eagle3_runner_create(h, emb, 4096, 16, &r, &e)) {
        fprintf(stderr, "runner: %s\n", e.msg);
        return 1;
    }
    printf("%s: made in %.1f s (dim %d, draft vocab %d)\n", spec, (rs_now_ns() - t0) / 1e9, D, DV);
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
               "(growth %.1f ms)\n", round, n_commit, p->n_passes - 1, p->n, (b - a) / 1e6,
               p->draft_ns / 1e6);
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
