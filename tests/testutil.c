/* Shared test helpers: fixture paths, tolerant comparison, in-memory random models. */
#include "testutil.h"
#include "common/quant.h"
#include "common/rng.h"
#include "draft_proc/draft_server.h"
#include <pthread.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

const char *tu_default_model_path(void) {
    static const char *p = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (access(p, R_OK) != 0)
        ck_abort_msg("default model %s is missing: run `make setup` (it fetches it)", p);
    return p;
}

const char *tu_fixture(const char *rel) {
    static char buf[4][1024];
    static int k = 0;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "tests/fixtures/%s", rel);
    return buf[k];
}

int tu_compare(const char *label, const float *got, const float *ref, size_t n, float atol,
               float rtol, float *max_abs) {
    int bad = 0;
    float mx = 0;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(got[i] - ref[i]);
        if (!(d <= mx)) mx = d; /* also catches NaN */
        if (!(d <= atol + rtol * fabsf(ref[i]))) {
            if (bad < 5)
                fprintf(stderr, "%s: mismatch at %zu: got %.8g ref %.8g (|d|=%.3g)\n", label, i,
                        got[i], ref[i], d);
            bad++;
        }
    }
    if (max_abs) *max_abs = mx;
    return bad;
}

static float gauss(Rng *r) {
    double u1 = rng_uniform(r), u2 = rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

Model *tu_random_model(Arch arch, int dim, int hidden_dim, int n_layers, int n_heads,
                       int n_kv_heads, int vocab, uint64_t seed) {
    Model *m = calloc(1, sizeof(Model));
    Config *c = &m->cfg;
    c->arch = arch;
    c->dim = dim;
    c->hidden_dim = hidden_dim;
    c->n_layers = n_layers;
    c->n_heads = n_heads;
    c->n_kv_heads = n_kv_heads;
    c->head_dim = dim / n_heads;
    c->vocab_size = vocab;
    c->max_seq_len = 4096;
    c->norm_eps = 1e-5f;
    c->rope_theta = 10000.0f;
    c->has_qkv_bias = arch == ARCH_QWEN2;
    c->has_qk_norm = arch == ARCH_QWEN3;
    c->bos_id = -1;
    c->eos_id = -1;
    int hd = c->head_dim, q = n_heads * hd, kv = n_kv_heads * hd;
    size_t per_layer = (size_t)dim * 2 + (size_t)q * dim * 2 + (size_t)kv * dim * 2 + q + 2 * kv +
                       2 * hd + 3 * (size_t)hidden_dim * dim;
    size_t total = (size_t)vocab * dim * 2 + dim + per_layer * n_layers;
    m->arena = malloc(total * sizeof(float));
    m->arena_floats = total;
    Rng r;
    rng_seed(&r, seed);
    float *p = m->arena;
#define TAKE(ptr, count, scale, base)                                                          \
    do {                                                                                       \
        ptr = p;                                                                               \
        for (size_t i_ = 0; i_ < (size_t)(count); i_++) p[i_] = (base) + (scale)*gauss(&r);    \
        p += (count);                                                                          \
    } while (0)
#define TAKEM(qt, rows, cols, scale)                                                           \
    do {                                                                                       \
        const float *p0_;                                                                      \
        TAKE(p0_, (size_t)(rows) * (cols), scale, 0.0f);                                       \
        qt = qtensor_f32(p0_, rows, cols);                                                     \
    } while (0)
    float s = 1.0f / sqrtf((float)dim);
    TAKEM(m->w.tok_embeddings, vocab, dim, 1.0f);
    m->w.layers = calloc((size_t)n_layers, sizeof(LayerWeights));
    for (int l = 0; l < n_layers; l++) {
        LayerWeights *L = &m->w.layers[l];
        TAKE(L->attn_norm, dim, 0.1f, 1.0f);
        TAKEM(L->wq, q, dim, s);
        TAKEM(L->wk, kv, dim, s);
        TAKEM(L->wv, kv, dim, s);
        TAKEM(L->wo, dim, q, 1.0f / sqrtf((float)q));
        if (c->has_qkv_bias) {
            TAKE(L->bq, q, 0.1f, 0.0f);
            TAKE(L->bk, kv, 0.1f, 0.0f);
            TAKE(L->bv, kv, 0.1f, 0.0f);
        }
        if (c->has_qk_norm) {
            TAKE(L->q_norm, hd, 0.1f, 1.0f);
            TAKE(L->k_norm, hd, 0.1f, 1.0f);
        }
        TAKE(L->ffn_norm, dim, 0.1f, 1.0f);
        TAKEM(L->w_gate, hidden_dim, dim, s);
        TAKEM(L->w_up, hidden_dim, dim, s);
        TAKEM(L->w_down, dim, hidden_dim, 1.0f / sqrtf((float)hidden_dim));
    }
    TAKE(m->w.final_norm, dim, 0.1f, 1.0f);
    TAKEM(m->w.wcls, vocab, dim, s * 3.0f);
#undef TAKEM
#undef TAKE
    RS_ASSERT((size_t)(p - m->arena) <= total);
    snprintf(m->fingerprint, sizeof m->fingerprint, "random-%llu", (unsigned long long)seed);
    snprintf(m->path, sizeof m->path, "<random seed %llu>", (unsigned long long)seed);
    return m;
}

/* f32 -> f16 bits, round to nearest even (normal and zero results only: test weights). */
static uint16_t to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    int exp = (int)((u >> 23) & 0xff) - 127 + 15;
    if (exp <= 0) return (uint16_t)sign;
    uint32_t man = u & 0x7fffffu, h = ((uint32_t)exp << 10) | (man >> 13), rest = man & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) h++;
    return (uint16_t)(sign | (h > 0x7bffu ? 0x7bffu : h));
}

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* One Q5_0 / Q5_1 block of x as ggml's quantize_row_q5_{0,1}_ref (mx: the element of
 * largest magnitude; mn / hi: min / max). */
static void quantize_q5(uint32_t type, const float *x, float mx, float mn, float hi, uint8_t *o) {
    int one = type == QT_Q5_1;
    float d = one ? (hi - mn) / 31.0f : mx / -16.0f, id = d ? 1.0f / d : 0.0f;
    put16(o, to_f16(d));
    if (one) put16(o + 2, to_f16(mn));
    uint8_t *h = o + (one ? 4 : 2), *qs = h + 4;
    uint32_t qh = 0;
    for (int i = 0; i < 16; i++) {
        float a = one ? (x[i] - mn) * id + 0.5f : x[i] * id + 16.5f;
        float c = one ? (x[i + 16] - mn) * id + 0.5f : x[i + 16] * id + 16.5f;
        int qa = (int)a > 31 ? 31 : (int)a, qc = (int)c > 31 ? 31 : (int)c;
        qs[i] = (uint8_t)((qa & 15) | (qc & 15) << 4);
        qh |= (uint32_t)(qa >> 4) << i | (uint32_t)(qc >> 4) << (i + 16);
    }
    for (int k = 0; k < 4; k++) h[k] = (uint8_t)(qh >> (8 * k));
}

/* One row of n values in `type`, as ggml's reference quantizers. */
static void quantize_row(uint32_t type, const float *x, int n, uint8_t *o) {
    if (type == QT_F32) { memcpy(o, x, 4 * (size_t)n); return; }
    if (type == QT_F16 || type == QT_BF16) {
        for (int i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &x[i], 4);
            put16(o + 2 * i, type == QT_F16 ? to_f16(x[i]) : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16));
        }
        return;
    }
    for (int b = 0; b < n / 32; b++, x += 32) {
        float amax = 0, mx = 0, mn = x[0], hi = x[0];
        for (int i = 0; i < 32; i++) {
            if (fabsf(x[i]) > amax) amax = fabsf(x[i]), mx = x[i];
            mn = fminf(mn, x[i]);
            hi = fmaxf(hi, x[i]);
        }
        if (type == QT_Q8_0) {
            float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
            put16(o, to_f16(d));
            for (int i = 0; i < 32; i++) o[2 + i] = (uint8_t)(int8_t)roundf(x[i] * id);
            o += 34;
        } else if (type == QT_Q4_0) {
            float d = mx / -8.0f, id = d ? 1.0f / d : 0.0f;
            put16(o, to_f16(d));
            for (int i = 0; i < 16; i++) {
                int a = (int)(x[i] * id + 8.5f), c = (int)(x[i + 16] * id + 8.5f);
                o[2 + i] = (uint8_t)((a > 15 ? 15 : a) | (c > 15 ? 15 : c) << 4);
            }
            o += 18;
        } else if (type == QT_Q5_0 || type == QT_Q5_1) {
            quantize_q5(type, x, mx, mn, hi, o);
            o += type == QT_Q5_0 ? 22 : 24;
        } else {
            RS_ASSERT(type == QT_Q4_1);
            float d = (hi - mn) / 15.0f, id = d ? 1.0f / d : 0.0f;
            put16(o, to_f16(d));
            put16(o + 2, to_f16(mn));
            for (int i = 0; i < 16; i++) {
                int a = (int)((x[i] - mn) * id + 0.5f), c = (int)((x[i + 16] - mn) * id + 0.5f);
                o[4 + i] = (uint8_t)((a > 15 ? 15 : a) | (c > 15 ? 15 : c) << 4);
            }
            o += 20;
        }
    }
}

/* Re-stores one f32 matrix as `type` at *p (advanced). */
static void restore(QTensor *w, uint32_t type, uint8_t **p) {
    size_t be, bb;
    RS_ASSERT(quant_type_geometry(type, &be, &bb) == 0 && w->cols % (int)be == 0);
    size_t rb = (size_t)w->cols / be * bb;
    for (int r = 0; r < w->rows; r++)
        quantize_row(type, (const float *)w->data + (size_t)r * w->cols, w->cols, *p + r * rb);
    w->type = type;
    w->data = *p;
    w->row_bytes = rb;
    *p += (size_t)w->rows * rb;
}

Model *tu_random_model_typed(Arch arch, int dim, int hidden_dim, int n_layers, int n_heads,
                             int n_kv_heads, int vocab, uint64_t seed, uint32_t type) {
    Model *m = tu_random_model(arch, dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab, seed);
    if (type == QT_F32) return m;
    /* the model owns its mappings: an anonymous one holds the re-stored matrices */
    size_t bytes = 4 * m->arena_floats + 4096;
    void *map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    RS_ASSERT(map != MAP_FAILED);
    m->maps = calloc(1, sizeof(void *));
    m->map_sizes = calloc(1, sizeof(size_t));
    m->maps[0] = map;
    m->map_sizes[0] = bytes;
    m->n_maps = 1;
    uint8_t *p = map;
    QTensor **mats = rs_xmalloc(sizeof(QTensor *) * MODEL_MAX_MATRICES(n_layers));
    for (int i = 0, k = model_matrices(m, mats); i < k; i++) restore(mats[i], type, &p);
    free(mats);
    RS_ASSERT((size_t)(p - (uint8_t *)map) <= bytes);
    snprintf(m->fingerprint, sizeof m->fingerprint, "random-%llu-%s", (unsigned long long)seed,
             quant_type_name(type));
    return m;
}

float *tu_f32(const QTensor *w) {
    static float *ring[16];
    static int k;
    k = (k + 1) % 16;
    free(ring[k]);
    ring[k] = malloc((size_t)w->rows * w->cols * sizeof(float));
    RS_ASSERT(ring[k]);
    qtensor_dequantize_rows(w, 0, w->rows, ring[k]);
    return ring[k];
}

void tu_golden_read(const char *path, TuGolden *g) {
    char *buf = NULL;
    size_t len = 0;
    RsErr e = {0};
    ck_assert_msg(rs_read_file(path, &buf, &len, &e) == RS_OK, "%s", e.msg);
    uint32_t hdr[3];
    ck_assert_msg(len >= 16 && memcmp(buf, "RSGL", 4) == 0, "%s: not an RSGL file", path);
    memcpy(hdr, buf + 4, sizeof hdr);
    ck_assert_msg(hdr[0] == 1, "%s: RSGL version %u, want 1", path, hdr[0]);
    ck_assert_msg(hdr[1] > 0 && hdr[1] < 4096 && hdr[2] > 0 && hdr[2] < (1u << 20),
                  "%s: bad sizes n=%u vocab=%u", path, hdr[1], hdr[2]);
    g->n = (int)hdr[1];
    g->vocab = (int)hdr[2];
    size_t need = 16 + 4 * (size_t)g->n + 4 * (size_t)g->n * g->vocab;
    ck_assert_msg(len == need, "%s: %zu bytes, want %zu", path, len, need);
    g->tokens = rs_xmalloc(4 * (size_t)g->n);
    g->logits = rs_xmalloc(4 * (size_t)g->n * g->vocab);
    memcpy(g->tokens, buf + 16, 4 * (size_t)g->n);
    memcpy(g->logits, buf + 16 + 4 * (size_t)g->n, 4 * (size_t)g->n * g->vocab);
    free(buf);
}

void tu_golden_free(TuGolden *g) {
    free(g->tokens);
    free(g->logits);
    g->tokens = NULL;
    g->logits = NULL;
}

/* ---- Child processes ---- */

void tu_dir_make(char *dir, size_t n, const char *prefix) {
    snprintf(dir, n, "/tmp/%s-XXXXXX", prefix);
    ck_assert_msg(mkdtemp(dir) != NULL, "mkdtemp %s failed", dir);
}

void tu_dir_remove(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

pid_t tu_spawn(const char *dir, char *const argv[], const char *tag, const char *out_path,
               int group, int nofile) {
    char out[512], err[512];
    snprintf(out, sizeof out, "%s/%s.out", dir, tag);
    snprintf(err, sizeof err, "%s/%s.err", dir, tag);
    if (out_path) snprintf(out, sizeof out, "%s", out_path);
    pid_t pid = fork();
    ck_assert(pid >= 0);
    if (pid == 0) {
        if (group) setpgid(0, 0);
        int fo = open(out, O_WRONLY | O_CREAT | (out_path ? 0 : O_TRUNC), 0644);
        int fe = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fo, 1);
        dup2(fe, 2);
        if (nofile > 0) {
            struct rlimit rl = {(rlim_t)nofile, (rlim_t)nofile};
            if (setrlimit(RLIMIT_NOFILE, &rl) != 0) _exit(126);
        }
        unsetenv("LD_PRELOAD"); /* the sanitizer runtime of the test binary */
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

char *tu_slurp(const char *dir, const char *tag, const char *ext) {
    char p[512], *buf = NULL;
    snprintf(p, sizeof p, "%s/%s.%s", dir, tag, ext);
    RsErr e;
    if (rs_read_file(p, &buf, NULL, &e)) return strdup("");
    return buf;
}

int tu_wait_exit(pid_t pid, int timeout_ms) {
    for (int t = 0; t < timeout_ms; t += 10) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    ck_abort_msg("process %d did not exit within %d ms", (int)pid, timeout_ms);
    return -1;
}

/* ---- rootspec-draft's server loop on a thread ---- */

struct TuServer {
    Drafter *d;
    DraftServerOpts o;
    volatile int stop;
    int rc;
    pthread_t th;
};

static void *tu_server_main(void *arg) {
    TuServer *s = arg;
    RsErr e = {0};
    s->rc = draft_server_run(s->d, 42, &s->o, &e);
    return NULL;
}

TuServer *tu_serve(Drafter *d, const char *ep, const char *name) {
    TuServer *s = calloc(1, sizeof *s);
    ck_assert_ptr_nonnull(s);
    s->d = d;
    s->o = (DraftServerOpts){.endpoint = ep, .insecure = 1, .name = name, .stop = &s->stop};
    ck_assert(pthread_create(&s->th, NULL, tu_server_main, s) == 0);
    return s;
}

int tu_serve_stop(TuServer **ps) {
    TuServer *s = *ps;
    s->stop = 1;
    pthread_join(s->th, NULL);
    int rc = s->rc;
    free(s);
    *ps = NULL;
    return rc;
}

/* ---- Kernel activations ---- */

QkActs tu_acts(const float *x, int n, int in) {
    QkActs a = {.f32 = x, .n = n, .in = in};
    int acts = QK_ACT_Q8 | (in % QK_K == 0 ? QK_ACT_Q8K : 0);
    QkQ8 *q8 = rs_xmalloc(sizeof(QkQ8) * (size_t)n * (in / QK_BLOCK));
    QkQ8K *q8k = acts & QK_ACT_Q8K ? rs_xmalloc(sizeof(QkQ8K) * (size_t)n * (in / QK_K)) : NULL;
    qk_acts_quantize(&qk_family_ref, &a, acts, q8, q8k);
    return a;
}

void tu_acts_free(QkActs *a) {
    free((void *)a->q8);
    free((void *)a->q8k);
    a->q8 = NULL;
    a->q8k = NULL;
}

QkActs tu_acts_row(const QkActs *a, int t) {
    QkActs r = {a->f32 + (size_t)t * a->in, a->q8 + (size_t)t * (a->in / QK_BLOCK),
                a->q8k ? a->q8k + (size_t)t * (a->in / QK_K) : NULL, 1, a->in};
    return r;
}

double tu_act_seen(const QkActs *a, int act, int t, int i, double *half_step) {
    double v = a->f32[(size_t)t * a->in + i], d = 0;
    if (act == QK_ACT_Q8) {
        const QkQ8 *b = &a->q8[(size_t)t * (a->in / QK_BLOCK) + i / QK_BLOCK];
        d = b->d;
        v = d * b->q[i % QK_BLOCK];
    } else if (act == QK_ACT_Q8K) {
        ck_assert_ptr_nonnull(a->q8k);
        const QkQ8K *b = &a->q8k[(size_t)t * (a->in / QK_K) + i / QK_K];
        d = b->d;
        v = d * b->q[i % QK_K];
    }
    if (half_step) *half_step = d / 2;
    return v;
}

/* ---- the sampling law, the plain way ---- */

static const float *g_sort_row;
static int by_logit_desc(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    float x = g_sort_row[i], y = g_sort_row[j];
    return x > y ? -1 : x < y ? 1 : i - j;
}

void tu_sampling_probs(const float *row, int n, const Sampling *s, double *probs) {
    int *ord = malloc(sizeof(int) * (size_t)n), keep = n;
    for (int i = 0; i < n; i++) ord[i] = i, probs[i] = 0;
    g_sort_row = row;
    qsort(ord, (size_t)n, sizeof(int), by_logit_desc);
    if (s->temperature == 0 || s->top_k == 1) {
        probs[ord[0]] = 1;
        free(ord);
        return;
    }
    double T = s->temperature, zmax = row[ord[0]] / T, tot = 0, cum = 0;
    if (s->top_k > 0 && s->top_k < n) /* the k-th value and every tie of it */
        for (keep = s->top_k; keep < n && row[ord[keep]] == row[ord[s->top_k - 1]]; keep++) {}
    for (int r = 0; r < keep; r++) tot += exp(row[ord[r]] / T - zmax);
    if (s->top_p > 0 && s->top_p < 1) {
        int r = 0;
        while (r < keep && cum < s->top_p * tot) cum += exp(row[ord[r++]] / T - zmax);
        while (r < keep && row[ord[r]] == row[ord[r - 1]]) r++; /* ties of the last kept */
        keep = r;
    }
    if (s->min_p > 0)
        for (int r = 0; r < keep; r++)
            if (row[ord[r]] / T - zmax < log(s->min_p)) {
                keep = r;
                break;
            }
    tot = 0;
    for (int r = 0; r < keep; r++) tot += exp(row[ord[r]] / T - zmax);
    for (int r = 0; r < keep; r++) probs[ord[r]] = exp(row[ord[r]] / T - zmax) / tot;
    free(ord);
}
