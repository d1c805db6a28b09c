/* rootspec-micro's compute roof (see micro_roof.h): the kernels' speed with the weights in
 * cache, scaled to the whole model. */
#include "micro_roof.h"
#include "common/rng.h"
#include "kernels/cpu/cpu_qmatmul.h"
#include <stdlib.h>

#define ROOF_SLICE_BYTES (128 * 1024)
#define ROOF_MIN_NS 15000000ull /* per timing trial */

/* ns per weight-token product of w's first rows (a slice in L2) against nt tokens: the
 * best of 3 trials, each repeating the product for >= ROOF_MIN_NS. */
static double slice_ns(const QkFamily *f, const QTensor *w, const QkActs *x, float *y,
                       float *scratch) {
    QTensor s = *w;
    s.perm_hd = 0; /* stored order either way; the slice need not hold whole heads */
    s.rows = (int)(ROOF_SLICE_BYTES / w->row_bytes);
    s.rows = s.rows < 64 ? 64 : s.rows / 64 * 64; /* whole 16-tile kernel calls */
    if (s.rows > w->rows) s.rows = w->rows;
    qk_matmul_rows(f, &s, x, y, s.rows, 0, s.rows, scratch); /* warm the cache */
    double best = 0;
    for (int trial = 0; trial < 3; trial++) {
        uint64_t t0 = rs_now_ns(), t;
        long reps = 0;
        do {
            qk_matmul_rows(f, &s, x, y, s.rows, 0, s.rows, scratch);
            reps++;
        } while ((t = rs_now_ns() - t0) < ROOF_MIN_NS);
        double ns = (double)t / ((double)reps * s.rows * s.cols * x->n);
        if (trial == 0 || ns < best) best = ns;
    }
    return best;
}

int micro_roof_mats(const QTensor *const *mats, const double *uses, int n, const char *family,
                    MicroRoof *out, RsErr *e) {
    const QkFamily *f = qk_family_pick(family, e);
    if (!f) return e->code;
    int maxc = 0;
    for (int i = 0; i < n; i++) maxc = mats[i]->cols > maxc ? mats[i]->cols : maxc;
    float *x = rs_xmalloc(sizeof(float) * 4 * (size_t)maxc);
    float *y = rs_xmalloc(sizeof(float) * 4 * (ROOF_SLICE_BYTES / 8 + 64));
    float *scratch = rs_xmalloc(sizeof(float) * (size_t)maxc);
    QkQ8 *q8 = rs_xmalloc(sizeof(QkQ8) * 4 * (size_t)(maxc / QK_BLOCK + 1));
    QkQ8K *q8k = rs_xmalloc(sizeof(QkQ8K) * 4 * (size_t)(maxc / QK_K + 1));
    Rng r;
    rng_seed(&r, 11);
    *out = (MicroRoof){0};
    double params = 0;
    for (int i = 0; i < n; i++) {
        const QTensor *w = mats[i];
        int in = w->cols;
        for (int k = 0; k < 4 * in; k++) x[k] = (float)(rng_uniform(&r) * 2 - 1);
        QkActs a4 = {.f32 = x, .n = 4, .in = in};
        qk_acts_quantize(f, &a4, qk_wants_act(f, w->type), q8, q8k);
        QkActs a1 = a4;
        a1.n = 1;
        double t1 = slice_ns(f, w, &a1, y, scratch), t4 = slice_ns(f, w, &a4, y, scratch);
        double p = (double)w->rows * in * uses[i];
        params += p;
        out->ms_n1 += p * t1 / 1e6;
        out->ms_n65 += p * (64 * t4 + t1) / 1e6;
        out->gw_n4 += p * 4 * t4; /* ns for 4 tokens over all matrices, inverted below */
    }
    out->gw_n1 = params / (out->ms_n1 * 1e6);
    out->gw_n4 = 4 * params / out->gw_n4;
    free(x);
    free(y);
    free(scratch);
    free(q8);
    free(q8k);
    return RS_OK;
}

int micro_compute_roof(const Model *m, const char *family, MicroRoof *out, RsErr *e) {
    const LayerWeights *L = &m->w.layers[0];
    const QTensor *mats[8] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up,
                              &L->w_down, &m->w.wcls};
    double uses[8];
    for (int i = 0; i < 8; i++) uses[i] = i == 7 ? 1 : m->cfg.n_layers;
    return micro_roof_mats(mats, uses, 8, family, out, e);
}
