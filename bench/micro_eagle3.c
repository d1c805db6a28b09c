/* rootspec-micro's EAGLE-3 figure (see micro_eagle3.h). A round is what a drafter process
 * does per decoding round with a head: commit the round's tokens with the target's
 * features, then grow the pool; its expansion passes stream every matrix but fc for 10
 * rows, which is compute-bound on a CPU, so the pass is set against both bounds. */
#include "micro_eagle3.h"
#include "common/eagle3.h"
#include "common/pool.h"
#include "common/quant.h"
#include "common/randmodel.h"
#include "draft_proc/eagle3_drafter.h"
#include "draft_proc/eagle3_forward.h"
#include "micro_roof.h"
#include "stats.h"
#include <stdio.h>
#include <stdlib.h>

#define E3_COMMIT 4 /* rows a round commits (an accepted path and its continuation) */

typedef struct {
    Eagle3Head *h;
    Eagle3Embed em;
    double pass_gb;  /* bytes of the matrices an expansion pass reads (all but fc) */
    double roof_ms;  /* compute roof of a 10-row pass, one thread */
    const char *type; /* ggml type name of lm_head: the head's stored type */
    const char *family; /* BackendParams.cpu_kernels of the head's layer and its roof */
    BackendSwitches sw; /* BackendParams.sw of the head's layer */
} E3Bench;

static int e3_open(const char *path, const Model *target, E3Bench *b, RsErr *e) {
    int layers[EAGLE3_N_FEATURES];
    int rc = eagle3_head_open_for(path, target, EAGLE3_IDS_AUTO, &b->h, layers, &b->em, e);
    if (rc) return rc;
    const Eagle3Head *h = b->h;
    const QTensor *all[EAGLE3_N_MATRICES], **mats = all + 1; /* an expansion skips fc */
    eagle3_head_matrices(h, all);
    double uses[8] = {1, 1, 1, 1, 1, 1, 1, 1}, params = 0;
    for (int i = 0; i < 8; i++) {
        b->pass_gb += (double)mats[i]->rows * mats[i]->row_bytes / 1e9;
        params += (double)mats[i]->rows * mats[i]->cols;
    }
    MicroRoof roof;
    rc = micro_roof_mats(mats, uses, 8, b->family, &roof, e);
    b->roof_ms = rc ? 0 : POOL_EXPAND * params / roof.gw_n4 / 1e6;
    b->type = quant_type_name(h->lm_head.type);
    return rc;
}

/* One round: commit E3_COMMIT rows, grow the pool; *round_ms / *grow_ms. */
static int e3_round(Eagle3Runner *r, const Eagle3Head *h, int round, float *feats, Pool *p,
                    double *round_ms, double *grow_ms, RsErr *e) {
    int D = h->cfg.c.dim, DV = h->cfg.draft_vocab, toks[E3_COMMIT];
    float *st = rs_xmalloc(sizeof(float) * (size_t)D), *lg = rs_xmalloc(sizeof(float) * DV);
    for (int i = 0; i < E3_COMMIT; i++) toks[i] = h->d2t[(round * 7 + i) % DV];
    uint64_t t0 = rs_now_ns();
    int rc = eagle3_commit(r, toks, feats, E3_COMMIT, st, lg, e);
    if (!rc) rc = eagle3_grow_pool(r, st, lg, p, e);
    *round_ms = (rs_now_ns() - t0) / 1e6;
    *grow_ms = p->draft_ns / 1e6;
    free(st);
    free(lg);
    return rc;
}

/* A ctx-row context (E3_CTX_CHUNK rows a commit, untimed): what the rounds attend to. */
#define E3_CTX_CHUNK 64
static int e3_context(Eagle3Runner *r, const Eagle3Head *h, int ctx, RsErr *e) {
    size_t F = (size_t)EAGLE3_N_FEATURES * h->cfg.target_hidden;
    float *feats = rs_xmalloc(sizeof(float) * E3_CTX_CHUNK * F);
    int toks[E3_CTX_CHUNK], rc = RS_OK;
    for (size_t i = 0; i < E3_CTX_CHUNK * F; i++) feats[i] = rs_rand_unit(7, i);
    for (int i = 0; i < E3_CTX_CHUNK; i++) toks[i] = h->d2t[(i * 13) % h->cfg.draft_vocab];
    for (int done = 0; done < ctx && !rc; done += E3_CTX_CHUNK) {
        int k = ctx - done < E3_CTX_CHUNK ? ctx - done : E3_CTX_CHUNK;
        rc = eagle3_commit(r, toks, feats, k, NULL, NULL, e);
    }
    free(feats);
    return rc;
}

/* rounds timed rounds on `threads` threads after a ctx-row context and one warm-up round;
 * medians out. */
static int e3_time(const E3Bench *b, int threads, int ctx, int rounds, double *round_ms,
                   double *pass_ms, RsErr *e) {
    const Eagle3Head *h = b->h;
    size_t F = (size_t)EAGLE3_N_FEATURES * h->cfg.target_hidden;
    BackendParams bp = {.kv_capacity = ctx + E3_COMMIT * (rounds + 1) + POOL_N_EXPANDED + 1,
                        .max_batch = E3_CTX_CHUNK, .threads = threads,
                        .cpu_kernels = b->family, .sw = b->sw};
    Eagle3Runner *r;
    int rc = eagle3_runner_create_on(h, &b->em, &cpu_eagle3_layer, &bp, &r, e);
    if (rc) return rc;
    float *feats = rs_xmalloc(sizeof(float) * E3_COMMIT * F);
    for (size_t i = 0; i < E3_COMMIT * F; i++) feats[i] = rs_rand_unit(5, i);
    Pool *p = rs_xcalloc(1, sizeof *p);
    rc = e3_context(r, h, ctx, e);
    double *rm = rs_xmalloc(sizeof(double) * (size_t)rounds);
    double *gm = rs_xmalloc(sizeof(double) * (size_t)rounds);
    for (int i = 0; i <= rounds && !rc; i++)
        rc = e3_round(r, h, i, feats, p, &rm[i ? i - 1 : 0], &gm[i ? i - 1 : 0], e);
    if (!rc) {
        bench_sort(rm, rounds);
        bench_sort(gm, rounds);
        *round_ms = bench_percentile(rm, rounds, 0.5);
        *pass_ms = bench_percentile(gm, rounds, 0.5) / (POOL_MAX_DEPTH - 1);
    }
    eagle3_runner_destroy(&r);
    free(feats);
    free(p);
    free(rm);
    free(gm);
    return rc;
}

int micro_eagle3(const char *head_path, const Model *target, const char *family,
                 const BackendSwitches *sw, const int *threads, const double *read_gbs, int n, int ctx, int rounds,
                 RsErr *e) {
    E3Bench b = {.family = family, .sw = *sw};
    int rc = e3_open(head_path, target, &b, e);
    if (!rc)
        printf("eagle3 head %s (%s, dim %d, draft vocab %d): %.3f GB of matrices an expansion "
               "pass; compute roof of a %d-row pass %.1f ms (1 thread, weights in cache)\n",
               head_path, b.type, b.h->cfg.c.dim, b.h->cfg.draft_vocab, b.pass_gb,
               POOL_EXPAND, b.roof_ms);
    for (int i = 0; i < n && !rc; i++) {
        double round_ms, pass_ms;
        rc = e3_time(&b, threads[i], ctx, rounds, &round_ms, &pass_ms, e);
        if (rc) break;
        double gbs = b.pass_gb / (pass_ms / 1e3), roof = b.roof_ms / threads[i];
        printf("eagle3 %d thread%s, %d-row context: round (commit %d + %d expansion passes) "
               "%.1f ms, pass %.1f ms: %.1f GB/s of matrices = %.0f%% of the %.1f GB/s read "
               "stream; pass / compute roof %.2f\nmicro eagle3 threads=%d ctx=%d round_ms=%.4f "
               "pass_ms=%.4f gbs=%.2f read_share=%.3f roof_ms=%.2f roof_ratio=%.3f\n",
               threads[i], threads[i] == 1 ? "" : "s", ctx, E3_COMMIT, POOL_MAX_DEPTH - 1,
               round_ms, pass_ms, gbs, 100 * gbs / read_gbs[i], read_gbs[i], pass_ms / roof,
               threads[i], ctx, round_ms, pass_ms, gbs, gbs / read_gbs[i], roof, pass_ms / roof);
    }
    eagle3_head_destroy(&b.h);
    return rc;
}
