/* The x4 repack (x4_pack.h). */
#include "x4_pack.h"
#include "common/quant.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Packs t in place, G rows at a time through a copy: G = 4, or a GGUF head, whose rows
 * are interleaved within it (qtensor_row), so the tiles come out in logical order. */
static void pack_matrix(QTensor *w) {
    int G = w->perm_hd ? w->perm_hd : QUANT_X4_ROWS;
    uint8_t *tmp = rs_xmalloc((size_t)G * w->row_bytes);
    uint8_t *base = (uint8_t *)(uintptr_t)w->data; /* the resident buffer: ours to rewrite */
    size_t rb = w->row_bytes;
    for (int g0 = 0; g0 < w->rows; g0 += G) {
        uint8_t *grp = base + (size_t)g0 * rb;
        memcpy(tmp, grp, (size_t)G * rb);
        for (int i = 0; i < G; i += QUANT_X4_ROWS) {
            const uint8_t *rows[QUANT_X4_ROWS];
            for (int r = 0; r < QUANT_X4_ROWS; r++)
                rows[r] = tmp + (qtensor_row(w, g0 + i + r) - grp);
            quant_x4_pack(w->type, (size_t)w->cols, rows, grp + (size_t)i * rb);
        }
    }
    free(tmp);
    w->perm_hd = 0;
    w->packed = 1;
}

static int packable(const QTensor *w) {
    return w->data && !w->packed && quant_x4_ok(w->type) && w->rows % QUANT_X4_ROWS == 0 &&
           w->perm_hd % QUANT_X4_ROWS == 0;
}

int qtensor_pack_x4(QTensor *w) {
    if (!packable(w)) return 0;
    pack_matrix(w);
    return 1;
}

int model_pack_x4(Model *m, int (*want)(uint32_t type, const void *ctx), const void *ctx) {
    if (m->is_view || !m->resident) return 0;
    QTensor **mats = rs_xmalloc(sizeof(QTensor *) * MODEL_MAX_MATRICES(m->cfg.n_layers));
    int n = model_matrices(m, mats), packed = 0;
    for (int i = 0; i < n; i++) {
        QTensor *w = mats[i];
        const QTensor *twin = NULL; /* a tied head: the embeddings, already packed */
        for (int k = 0; k < i && !twin; k++)
            if (mats[k]->data == w->data && mats[k]->packed) twin = mats[k];
        if (twin) *w = *twin;
        else if (want(w->type, ctx)) packed += qtensor_pack_x4(w);
    }
    free(mats);
    return packed;
}
