/* Model lifetime: load dispatch (GGUF file or Hugging Face directory), the self-drafter
 * layer view, and freeing. The format parsers live in gguf.c and hf.c. */
#include "model.h"
#include "model_internal.h"
#include "quant.h"
#include "randmodel.h"
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int model_load(const char *path, Model **out, RsErr *e) {
    *out = NULL;
    struct stat st;
    if (!path || !*path) return rs_err(e, RS_EINVAL, "no model path given");
    if (model_path_is_random(path)) return model_random_load(path, out, e);
    if (stat(path, &st) != 0) return rs_err(e, RS_EINVAL, "model path '%s' does not exist", path);
    if (S_ISDIR(st.st_mode)) return hf_load_model(path, out, e);
    return gguf_load_model(path, out, e);
}

/* ---- resident weights ---- */

typedef struct {
    const uint8_t *p; /* the matrix's bytes in a file mapping */
    size_t n;
    QTensor *w;
} Span;

static int span_cmp(const void *a, const void *b) {
    const uint8_t *x = ((const Span *)a)->p, *y = ((const Span *)b)->p;
    return x < y ? -1 : x > y;
}

int model_matrices(Model *m, QTensor **out) {
    int n = 0;
    out[n++] = &m->w.tok_embeddings;
    out[n++] = &m->w.wcls;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        LayerWeights *L = &m->w.layers[l];
        QTensor *lw[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++) out[n++] = lw[i];
    }
    return n;
}

/* The matrices whose bytes lie outside the arena (in file mappings), into sp; returns the
 * count. Tied embeddings give two spans of the same bytes. */
static int matrix_spans(Model *m, Span *sp) {
    const uint8_t *a0 = (const uint8_t *)m->arena, *a1 = a0 + m->arena_floats * sizeof(float);
    QTensor **w = rs_xmalloc(sizeof(QTensor *) * MODEL_MAX_MATRICES(m->cfg.n_layers));
    int n = 0, k = model_matrices(m, w);
    for (int i = 0; i < k; i++) {
        const uint8_t *p = w[i]->data;
        if (!p || (a0 && p >= a0 && p < a1)) continue;
        sp[n++] = (Span){p, (size_t)w[i]->rows * w[i]->row_bytes, w[i]};
    }
    free(w);
    return n;
}

/* Copies spans [i, j) (sorted, overlapping or adjacent: one run of file bytes) to dst,
 * repoints them and drops the file pages from the resident set. */
static void copy_run(const Span *sp, int i, int j, const uint8_t *end, uint8_t *dst) {
    const uint8_t *start = sp[i].p;
    memcpy(dst, start, (size_t)(end - start));
    for (int k = i; k < j; k++) sp[k].w->data = dst + (sp[k].p - start);
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)start & ~(uintptr_t)(pg - 1);
    uintptr_t z = ((uintptr_t)end + pg - 1) & ~(uintptr_t)(pg - 1);
    madvise((void *)a, z - a, MADV_DONTNEED); /* read-only file pages: refetched if touched */
}

/* The run of sorted spans that starts at i and touch one another: its end in the file, and
 * in *j the first span after it. */
static const uint8_t *run_end(const Span *sp, int i, int n, int *j) {
    const uint8_t *end = sp[i].p + sp[i].n;
    for (*j = i + 1; *j < n && sp[*j].p <= end; (*j)++)
        if (sp[*j].p + sp[*j].n > end) end = sp[*j].p + sp[*j].n;
    return end;
}

#define RUN_ALIGN(b) (((size_t)(b) + 63) & ~(size_t)63) /* each run on its own cache lines */

int model_make_resident(Model *m, RsErr *e) {
    if (m->is_view || m->random_weights || m->resident || !m->w.layers) return RS_OK;
    Span *sp = rs_xmalloc(sizeof(Span) * MODEL_MAX_MATRICES(m->cfg.n_layers));
    int n = matrix_spans(m, sp), j;
    qsort(sp, (size_t)n, sizeof(Span), span_cmp);
    size_t total = 0, off = 0;
    for (int i = 0; i < n; i = j) total += RUN_ALIGN(run_end(sp, i, n, &j) - sp[i].p);
    uint8_t *buf = n ? rs_huge_alloc(total) : NULL;
    if (n && !buf) {
        free(sp);
        return rs_err(e, RS_EIO, "cannot map %zu bytes for the weights of '%s'", total, m->path);
    }
    for (int i = 0; i < n; i = j) {
        const uint8_t *end = run_end(sp, i, n, &j);
        copy_run(sp, i, j, end, buf + off);
        off += RUN_ALIGN(end - sp[i].p);
    }
    free(sp);
    m->resident = buf;
    m->resident_bytes = total;
    return RS_OK;
}

/* A named subset: "half" the first half of the layers, "short" the first eighth (at least
 * one), so a preset means the same share on any depth of model. -1: not a preset. */
static int layer_preset(const char *spec, int n_layers) {
    if (!strcmp(spec, "half")) return n_layers / 2 > 0 ? n_layers / 2 : 1;
    if (!strcmp(spec, "short")) return (n_layers + 7) / 8;
    return -1;
}

/* Parses "0-5,24-29" (or a preset) into a list of layer indices < n_layers. */
static int parse_layer_spec(const char *spec, int n_layers, int *idx, int *n, RsErr *e) {
    *n = 0;
    const char *s = spec;
    if (!s || !*s) return rs_err(e, RS_EINVAL, "empty --draft-layers spec");
    int first = layer_preset(spec, n_layers);
    if (first > 0) {
        for (; *n < first; (*n)++) idx[*n] = *n;
        return RS_OK;
    }
    while (*s) {
        char *end;
        long a = strtol(s, &end, 10);
        if (end == s) return rs_err(e, RS_EINVAL, "bad --draft-layers spec '%s' at '%s'", spec, s);
        long b = a;
        s = end;
        if (*s == '-') {
            s++;
            b = strtol(s, &end, 10);
            if (end == s) return rs_err(e, RS_EINVAL, "bad --draft-layers range in '%s'", spec);
            s = end;
        }
        if (b >= 0 && b < a && a < n_layers)
            return rs_err(e, RS_EINVAL, "--draft-layers '%s': range %ld-%ld is reversed (write "
                          "%ld-%ld)", spec, a, b, b, a);
        if (a < 0 || b < a || b >= n_layers)
            return rs_err(e, RS_EINVAL, "--draft-layers '%s': range %ld-%ld outside 0-%d", spec,
                          a, b, n_layers - 1);
        for (long i = a; i <= b; i++) {
            if (*n >= n_layers)
                return rs_err(e, RS_EINVAL, "--draft-layers '%s' lists more than %d layers", spec,
                              n_layers);
            idx[(*n)++] = (int)i;
        }
        if (*s == ',') s++;
        else if (*s) return rs_err(e, RS_EINVAL, "bad --draft-layers spec '%s' at '%s'", spec, s);
    }
    return RS_OK;
}

int model_layer_view(const Model *parent, const char *spec, Model **out, RsErr *e) {
    *out = NULL;
    if (parent->random_weights && !parent->arena)
        return rs_err(e, RS_EUNSUPPORTED,
                      "--draft-layers on random model '%s': its weights exist only on the "
                      "device; use a random drafter of its own (--draft-model random:...)",
                      parent->path);
    int *idx = rs_xcalloc((size_t)parent->cfg.n_layers, sizeof(int));
    int n = 0;
    int rc = parse_layer_spec(spec, parent->cfg.n_layers, idx, &n, e);
    if (rc) {
        free(idx);
        return rc;
    }
    Model *m = rs_xcalloc(1, sizeof(Model));
    *m = *parent;
    m->is_view = 1;
    m->gguf = NULL; /* borrowed through parent; never freed by a view */
    m->resident = NULL;
    m->resident_bytes = 0;
    m->cfg.n_layers = n;
    m->w.layers = rs_xcalloc((size_t)n, sizeof(LayerWeights));
    for (int i = 0; i < n; i++) m->w.layers[i] = parent->w.layers[idx[i]];
    snprintf(m->fingerprint, sizeof m->fingerprint, "%.40s-L%s", parent->fingerprint, spec);
    free(idx);
    *out = m;
    return RS_OK;
}

void model_destroy(Model **pm) {
    if (!pm || !*pm) return;
    Model *m = *pm;
    free(m->w.layers);
    if (!m->is_view) {
        free(m->arena);
        rs_huge_free(m->resident, m->resident_bytes);
        for (int i = 0; i < m->n_maps; i++) munmap(m->maps[i], m->map_sizes[i]);
        free(m->maps);
        free(m->map_sizes);
        gguf_destroy(&m->gguf);
    }
    free(m);
    *pm = NULL;
}

static size_t qt_bytes(const QTensor *w) { return (size_t)w->rows * w->row_bytes; }

size_t model_weight_bytes(const Model *m) {
    const Config *c = &m->cfg;
    if (!m->w.layers) { /* random model without host weights: f32 */
        size_t q = (size_t)c->n_heads * c->head_dim, kv = (size_t)c->n_kv_heads * c->head_dim;
        size_t per_layer = (q + 2 * kv) * c->dim + c->dim * q + 3 * (size_t)c->hidden_dim * c->dim;
        return sizeof(float) * (per_layer * c->n_layers + (size_t)c->vocab_size * c->dim);
    }
    size_t b = qt_bytes(&m->w.wcls);
    for (int l = 0; l < c->n_layers; l++) {
        const LayerWeights *L = &m->w.layers[l];
        b += qt_bytes(&L->wq) + qt_bytes(&L->wk) + qt_bytes(&L->wv) + qt_bytes(&L->wo) +
             qt_bytes(&L->w_gate) + qt_bytes(&L->w_up) + qt_bytes(&L->w_down);
    }
    return b;
}

/* The x4 tile holding row j of a packed matrix. */
static const uint8_t *x4_tile(const QTensor *w, int j) {
    return (const uint8_t *)w->data + (size_t)(j / QUANT_X4_ROWS) * QUANT_X4_ROWS * w->row_bytes;
}

void qtensor_row_bytes(const QTensor *w, int j, uint8_t *dst) {
    RS_ASSERT(w->data && j >= 0 && j < w->rows);
    if (!w->packed) {
        memcpy(dst, qtensor_row(w, j), w->row_bytes);
        return;
    }
    size_t be, bb;
    RS_ASSERT(quant_type_geometry(w->type, &be, &bb) == 0);
    for (size_t k = 0; k < (size_t)w->cols / be; k++)
        quant_x4_block(w->type, (size_t)w->cols, x4_tile(w, j), j % QUANT_X4_ROWS, k, dst + k * bb);
}

void qtensor_dequantize_rows(const QTensor *w, int r0, int n, float *dst) {
    RS_ASSERT(w->data && r0 >= 0 && n >= 0 && r0 + n <= w->rows);
    for (int i = 0; i < n; i++) {
        float *y = dst + (size_t)i * w->cols;
        if (!w->packed) {
            quant_dequantize(w->type, qtensor_row(w, r0 + i), y, (size_t)w->cols);
            continue;
        }
        uint8_t blk[256]; /* one block of an x4 type (210 bytes at most) */
        size_t be, bb;
        RS_ASSERT(quant_type_geometry(w->type, &be, &bb) == 0 && bb <= sizeof blk);
        for (size_t k = 0; k < (size_t)w->cols / be; k++) {
            quant_x4_block(w->type, (size_t)w->cols, x4_tile(w, r0 + i), (r0 + i) % QUANT_X4_ROWS,
                           k, blk);
            quant_dequantize(w->type, blk, y + be * k, be);
        }
    }
}

QTensor qtensor_f32(const float *data, int rows, int cols) {
    QTensor w = {QT_F32, data, rows, cols, (size_t)cols * sizeof(float), 0, 0};
    return w;
}
