/* Sequences over the CUDA backend's paged KV cache (kernels/backend.h: Sequences):
 * - the paged attention kernel: rows of three sequences whose blocks lie shuffled in one
 *   cache, against the CPU reference per sequence (tolerance) and, batch-invariant, bitwise
 *   against the unpaged kernel over each sequence alone in contiguous slots; padding rows
 *   are not written;
 * - backend_forward_batch: sequences of different lengths joining and leaving, prefill
 *   chunks and tree passes with tree commits in one pass per round, every kept row against
 *   the CPU backend running the very same batches (cu_compare_logits), and with
 *   --batch-invariant bitwise against each sequence run alone on a backend of its own, also
 *   over a 600-entry context (several split-KV blocks per row);
 * - blocks: a batch that does not fit is RS_EFULL and changes nothing; every block comes
 *   back when the sequences close;
 * - the batcher (target_proc/batch.h, what rootspec-serve --parallel runs) on the CUDA
 *   backend with --batch-invariant: decodes on several views at once, preempted and
 *   restarted when blocks run out, emit exactly their solo decodes' tokens (AR and the
 *   draft rule with a suffix drafter, T=0 and seeded T=1). */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <string.h>
#include "common/randmodel.h"
#include "common/rng.h"
#include "cuda_testutil.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_kernels.h"
#include "draft_proc/suffix_drafter.h"
#include "target_proc/batch.h"
#include "target_proc/decode.h"
#include "tests/testutil.h"

static void *dput(const void *h, size_t bytes) {
    void *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 16));
    CUDA_CHECK(cudaMemcpy(p, h, bytes, cudaMemcpyHostToDevice));
    return p;
}

static void dget(void *h, const void *d, size_t bytes) {
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

static float bf16f(rs_bf16 h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static rs_bf16 bf16_of(float v) {
    float r = cu_round_bf16(v);
    uint32_t u;
    memcpy(&u, &r, 4);
    return (rs_bf16)(u >> 16);
}

/* ---- the paged attention kernel ---- */

#define PA_SEQS 3
#define PA_BLOCKS 40
#define PA_CAP (PA_BLOCKS * CUK_KV_BLOCK)

typedef struct {
    int nc, np, n;      /* committed, pending before the rows, rows */
    int r0;             /* first row in the batch */
    int n_blocks, blocks[PA_BLOCKS];
    uint8_t mask[16 * 32]; /* (n, np + n) */
} PaSeq;

/* Sequence k's shape, its blocks taken from the shuffled list at *next, its mask rows
 * (itself, and each earlier column with probability 1/2). */
static void pa_seq(PaSeq *s, int k, const int *perm, int *next, uint64_t *st) {
    static const int shape[PA_SEQS][3] = {{300, 5, 3}, {0, 0, 9}, {40, 0, 1}};
    s->nc = shape[k][0], s->np = shape[k][1], s->n = shape[k][2];
    s->n_blocks = (s->nc + s->np + s->n + CUK_KV_BLOCK - 1) / CUK_KV_BLOCK;
    for (int i = 0; i < s->n_blocks; i++) s->blocks[i] = perm[(*next)++];
    int stride = s->np + s->n;
    for (int t = 0; t < s->n; t++)
        for (int j = 0; j < stride; j++)
            s->mask[t * stride + j] = j == s->np + t || (j < s->np + t && cu_randf(st, 0, 1) < 0.5f);
}

static int pa_slot(const PaSeq *s, int i) {
    return s->blocks[i / CUK_KV_BLOCK] * CUK_KV_BLOCK + i % CUK_KV_BLOCK;
}

/* The device inputs of one paged call: meta (paged), tiles, tables, mask rows of W words. */
typedef struct {
    CuMeta *meta;
    CuPaged *paged;
    CuAttTile *tiles;
    int *tables, *slots;
    uint64_t *mask;
} PaDev;

static PaDev pa_stage(const PaSeq *seqs, int n, int nb, int nh, int nkv, int hd, int W) {
    int rows_pb = cuk_attention_tile_rows(nb, nh, nkv, hd), nt = 0, ntab = 0;
    CuAttTile tiles[64];
    int tables[PA_BLOCKS], slots[64] = {0};
    uint64_t mask[64 * 2] = {0};
    for (int k = 0; k < PA_SEQS; k++) {
        const PaSeq *s = &seqs[k];
        int stride = s->np + s->n;
        memcpy(tables + ntab, s->blocks, sizeof(int) * (size_t)s->n_blocks);
        for (int t0 = 0; t0 < s->n; t0 += rows_pb)
            tiles[nt++] = (CuAttTile){s->r0 + t0, s->n - t0 < rows_pb ? s->n - t0 : rows_pb,
                                      s->nc, s->nc + s->np + s->n, ntab, 0};
        for (int t = 0; t < s->n; t++)
            for (int j = 0; j < stride; j++)
                if (s->mask[t * stride + j])
                    mask[(size_t)(s->r0 + t) * W + j / 64] |= 1ull << (j % 64);
        ntab += s->n_blocks;
    }
    PaDev d;
    d.tiles = dput(tiles, sizeof tiles);
    d.tables = dput(tables, sizeof tables);
    d.slots = dput(slots, sizeof slots);
    d.mask = dput(mask, sizeof mask);
    CuPaged pg = {d.slots, d.tiles, d.tables, nt, 0};
    d.paged = dput(&pg, sizeof pg);
    CuMeta m = {n, 0, 0, W * 64, d.paged};
    d.meta = dput(&m, sizeof m);
    return d;
}

static void pa_free(PaDev *d) {
    cudaFree(d->meta), cudaFree(d->paged), cudaFree(d->tiles), cudaFree(d->tables);
    cudaFree(d->slots), cudaFree(d->mask);
}

/* Sequence s alone in contiguous slots through cuk_attention (bi) and cpu_attention:
 * its K/V entries gathered from the paged cache. Returns the mismatches of got (the
 * paged rows) against both. */
static int pa_check_seq(const PaSeq *s, const rs_bf16 *kc, const rs_bf16 *vc, const float *q,
                        const float *got, int nh, int nkv, int hd, int bi) {
    int kvd = nkv * hd, qd = nh * hd, ctx = s->nc + s->np + s->n, stride = s->np + s->n;
    rs_bf16 *kb = calloc((size_t)PA_CAP * kvd, 2), *vb = calloc((size_t)PA_CAP * kvd, 2);
    float *kf = malloc((size_t)ctx * kvd * 4), *vf = malloc((size_t)ctx * kvd * 4);
    for (int i = 0; i < ctx; i++)
        for (int c = 0; c < kvd; c++) {
            size_t from = (size_t)pa_slot(s, i) * kvd + c, to = (size_t)i * kvd + c;
            kb[to] = kc[from], vb[to] = vc[from];
            kf[to] = bf16f(kc[from]), vf[to] = bf16f(vc[from]);
        }
    const float *qs = q + (size_t)s->r0 * qd;
    float *ref = malloc((size_t)s->n * qd * 4), *att = malloc((size_t)(ctx + 16) * 4);
    int *idx = malloc(sizeof(int) * (size_t)s->n * stride), *cnt = malloc(sizeof(int) * (size_t)s->n);
    cpu_attention_index(s->mask, s->n, s->np, stride, idx, cnt);
    cpu_attention(ref, qs, kf, vf, s->nc, idx, cnt, stride, s->n, nh, nkv, hd, att);
    const float *mine = got + (size_t)s->r0 * qd;
    char label[128];
    snprintf(label, sizeof label, "paged attention seq nc=%d np=%d n=%d bi=%d vs cpu", s->nc,
             s->np, s->n, bi);
    int bad = tu_compare(label, mine, ref, (size_t)s->n * qd, 1e-4f, 1e-3f, NULL) != 0;
    if (bi) { /* the unpaged kernel over the sequence alone: the same bits */
        uint64_t mbits[16] = {0};
        cuk_pack_mask(s->mask, s->n, stride, mbits);
        CuMeta m = {s->n, s->nc + s->np, s->nc, stride, NULL};
        CuMeta *dm = dput(&m, sizeof m);
        uint64_t *dmask = dput(mbits, sizeof mbits);
        rs_bf16 *dk = dput(kb, (size_t)PA_CAP * kvd * 2), *dv = dput(vb, (size_t)PA_CAP * kvd * 2);
        float *dq = dput(qs, (size_t)s->n * qd * 4), *dout = dput(ref, (size_t)s->n * qd * 4);
        float *scr = NULL;
        unsigned *dc = NULL;
        CUDA_CHECK(cudaMalloc((void **)&scr, cuk_attention_scratch_floats(s->n, nh, hd, PA_CAP) * 4));
        CUDA_CHECK(cudaMalloc((void **)&dc, cuk_attention_counters(s->n, nh) * 4));
        CUDA_CHECK(cudaMemset(dc, 0, cuk_attention_counters(s->n, nh) * 4));
        cuk_attention(0, dq, qd, dk, dv, dmask, dm, s->n, nh, nkv, hd, PA_CAP, 1, scr, dc, NULL, dout);
        float *alone = malloc((size_t)s->n * qd * 4);
        dget(alone, dout, (size_t)s->n * qd * 4);
        snprintf(label, sizeof label, "paged attention seq nc=%d rows vs the sequence alone", s->nc);
        bad += cu_bits_report(label, mine, alone, s->n, qd) > 0;
        free(alone);
        cudaFree(dm), cudaFree(dmask), cudaFree(dk), cudaFree(dv), cudaFree(dq), cudaFree(dout);
        cudaFree(scr), cudaFree(dc);
    }
    free(kb), free(vb), free(kf), free(vf), free(ref), free(att), free(idx), free(cnt);
    return bad;
}

static void paged_attention_case(int hd, int nh, int nkv, int bi, uint64_t seed) {
    uint64_t st = seed;
    int kvd = nkv * hd, qd = nh * hd, perm[PA_BLOCKS], next = 0, n = 0, nb = 16;
    for (int i = 0; i < PA_BLOCKS; i++) perm[i] = i;
    for (int i = PA_BLOCKS - 1; i > 0; i--) { /* the blocks in a shuffled order */
        int j = (int)(cu_randf(&st, 0, 1) * (float)(i + 1)) % (i + 1), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    PaSeq seqs[PA_SEQS];
    for (int k = 0; k < PA_SEQS; k++) {
        pa_seq(&seqs[k], k, perm, &next, &st);
        seqs[k].r0 = n;
        n += seqs[k].n;
    }
    rs_bf16 *kc = malloc((size_t)PA_CAP * kvd * 2), *vc = malloc((size_t)PA_CAP * kvd * 2);
    for (size_t i = 0; i < (size_t)PA_CAP * kvd; i++)
        kc[i] = bf16_of(cu_randf(&st, -1, 1)), vc[i] = bf16_of(cu_randf(&st, -1, 1));
    float *q = malloc((size_t)nb * qd * 4), *got = malloc((size_t)nb * qd * 4);
    for (size_t i = 0; i < (size_t)nb * qd; i++) q[i] = cu_randf(&st, -1, 1);
    int W = 2;
    PaDev d = pa_stage(seqs, n, nb, nh, nkv, hd, W);
    rs_bf16 *dk = dput(kc, (size_t)PA_CAP * kvd * 2), *dv = dput(vc, (size_t)PA_CAP * kvd * 2);
    float *dq = dput(q, (size_t)nb * qd * 4);
    memset(got, 0xff, (size_t)nb * qd * 4); /* NaN: padding rows must keep it */
    float *dout = dput(got, (size_t)nb * qd * 4), *scr = NULL;
    unsigned *dc = NULL;
    CUDA_CHECK(cudaMalloc((void **)&scr, cuk_attention_scratch_floats(nb, nh, hd, PA_CAP) * 4));
    CUDA_CHECK(cudaMalloc((void **)&dc, cuk_attention_counters(nb, nh) * 4));
    CUDA_CHECK(cudaMemset(dc, 0, cuk_attention_counters(nb, nh) * 4));
    cuk_attention_paged(0, dq, qd, dk, dv, d.mask, d.meta, nb, 4, nh, nkv, hd, PA_CAP, bi, scr,
                        dc, NULL, dout);
    dget(got, dout, (size_t)nb * qd * 4);
    int bad = 0;
    for (int k = 0; k < PA_SEQS; k++) bad += pa_check_seq(&seqs[k], kc, vc, q, got, nh, nkv, hd, bi);
    for (size_t i = (size_t)n * qd; i < (size_t)nb * qd; i++) bad += got[i] == got[i];
    ck_assert_msg(bad == 0, "paged attention hd=%d nh=%d nkv=%d bi=%d: %d mismatches", hd, nh,
                  nkv, bi, bad);
    unsigned cnt[2 * 16 * 8];
    dget(cnt, dc, cuk_attention_counters(nb, nh) * 4);
    for (size_t i = 0; i < cuk_attention_counters(nb, nh); i++) ck_assert_uint_eq(cnt[i], 0);
    pa_free(&d);
    cudaFree(dk), cudaFree(dv), cudaFree(dq), cudaFree(dout), cudaFree(scr), cudaFree(dc);
    free(kc), free(vc), free(q), free(got);
}

START_TEST(test_cuda_paged_attention) {
    CU_REQUIRE_DEVICE();
    for (int bi = 0; bi < 2; bi++) {
        paged_attention_case(64, 8, 2, bi, 31);  /* GQA 4: tiles of 8 rows */
        paged_attention_case(128, 8, 1, bi, 32); /* GQA 8 */
        paged_attention_case(32, 4, 4, bi, 33);  /* MHA, small heads */
    }
}
END_TEST

/* ---- backend_forward_batch ---- */

#define NSEQ 3
#define SEQ_CAP 160
#define SPEC "random:tiny,seed=41,arch=qwen3"

static Backend *make(const BackendOps *ops, const Model *m, int cap, int seqs, int bi) {
    BackendParams bp = {.kv_capacity = cap, .max_batch = 24, .max_pending = 24, .threads = 1,
                        .batch_invariant = bi, .max_seqs = seqs};
    Backend *b = NULL;
    RsErr e = {0};
    ck_assert_msg(backend_create(ops, m, &bp, &b, &e) == RS_OK, "%s", e.msg);
    return b;
}

static Model *load(const BackendOps *ops) {
    Model *m = NULL;
    RsErr e = {0};
    ck_assert_msg(backend_model_load(ops, SPEC, NULL, &m, &e) == RS_OK, "%s", e.msg);
    return m;
}

typedef struct {
    int id, len, want; /* sequence in the shared backends, committed tokens, final length */
    Backend *solo;     /* the same rows alone (batch-invariant mode), or NULL */
    int tok[8], pos[8], n, tree;
    uint8_t mask[8 * 8];
} Seq;

/* This round's rows of s: a chunk of 1..5 tokens, or a tree of two siblings at the next
 * position and a child of the second (the commit keeps the second and its child). */
static void seq_plan(Seq *s, Rng *r, int V) {
    s->tree = s->len > 0 && rng_next(r) % 3 == 0 && s->len + 2 <= s->want;
    memset(s->mask, 0, sizeof s->mask);
    if (s->tree) {
        s->n = 3;
        for (int i = 0; i < 3; i++) s->tok[i] = (int)(rng_next(r) % (uint64_t)V);
        s->pos[0] = s->pos[1] = s->len;
        s->pos[2] = s->len + 1;
        s->mask[0] = 1;
        s->mask[3 + 1] = 1;
        s->mask[6 + 1] = s->mask[6 + 2] = 1;
        return;
    }
    int room = s->want - s->len;
    s->n = 1 + (int)(rng_next(r) % 5);
    s->n = s->n < room ? s->n : room;
    for (int i = 0; i < s->n; i++) {
        s->tok[i] = (int)(rng_next(r) % (uint64_t)V);
        s->pos[i] = s->len + i;
    }
}

static void seq_commit(Backend *b, int id, const Seq *s) {
    RsErr e = {0};
    int keep[8];
    for (int i = 0; i < s->n; i++) keep[i] = s->tree ? i + 1 : i;
    int n = s->tree ? 2 : s->n;
    ck_assert_msg(backend_seq_commit(b, id, keep, n, &e) == RS_OK, "%s", e.msg);
}

/* Kept rows of a round: every row but the first of a chunk of 3 or more (logits only for
 * the rows that need them), last rows first. */
static int round_rows(const Seq *seqs, const int *live, int n_live, int *rows) {
    int nr = 0, r0 = 0, n_out = 0;
    for (int k = 0; k < n_live; r0 += seqs[live[k]].n, k++)
        for (int i = 0; i < seqs[live[k]].n; i++, nr++)
            if (!(i == 0 && !seqs[live[k]].tree && seqs[live[k]].n >= 3)) rows[n_out++] = nr;
    for (int i = 0; i < n_out / 2; i++) {
        int t = rows[i];
        rows[i] = rows[n_out - 1 - i], rows[n_out - 1 - i] = t;
    }
    return n_out;
}

/* Each live sequence's rows alone on its solo backend; kept row j of the batch against
 * its row there, bitwise. */
static int round_solo(Seq *seqs, const int *live, int n_live, const int *rows, int n_out,
                      const float *got, int V) {
    static float one[8 * 1024];
    int bad = 0, r0 = 0;
    for (int k = 0; k < n_live; r0 += seqs[live[k]].n, k++) {
        Seq *s = &seqs[live[k]];
        int all[8];
        for (int i = 0; i < s->n; i++) all[i] = i;
        RsErr e = {0};
        ck_assert_msg(backend_forward(s->solo, s->tok, s->pos, s->n, s->tree ? s->mask : NULL,
                                      all, s->n, one, &e) == RS_OK, "%s", e.msg);
        for (int j = 0; j < n_out; j++) {
            int i = rows[j] - r0;
            if (i < 0 || i >= s->n) continue;
            char label[96];
            snprintf(label, sizeof label, "seq %d row %d (len %d) in the batch vs alone", live[k],
                     i, s->len);
            bad += cu_bits_report(label, got + (size_t)j * V, one + (size_t)i * V, 1, V) > 0;
        }
    }
    return bad;
}

/* One round: every live sequence's rows in one pass on the GPU and on the CPU. */
static int seq_round(Backend *gpu, Backend *cpu, Seq *seqs, const int *live, int n_live,
                     Rng *r, int V) {
    BackendSeg g[NSEQ];
    int rows[NSEQ * 8];
    for (int k = 0; k < n_live; k++) {
        Seq *s = &seqs[live[k]];
        seq_plan(s, r, V);
        g[k] = (BackendSeg){s->id, s->tok, s->pos, s->n, s->tree ? s->mask : NULL};
    }
    int n_out = round_rows(seqs, live, n_live, rows);
    float *got = malloc(sizeof(float) * (size_t)n_out * V), *ref = malloc(sizeof(float) * (size_t)n_out * V);
    RsErr e = {0};
    ck_assert_msg(backend_forward_batch(gpu, g, n_live, rows, n_out, got, &e) == RS_OK, "%s", e.msg);
    ck_assert_msg(backend_forward_batch(cpu, g, n_live, rows, n_out, ref, &e) == RS_OK, "%s", e.msg);
    ck_assert_int_eq(backend_n_kept(gpu), n_out);
    float worst = 0;
    int bad = cu_compare_logits("forward_batch vs cpu", got, ref, n_out, V, &worst) > 0;
    if (seqs[live[0]].solo) bad += round_solo(seqs, live, n_live, rows, n_out, got, V);
    for (int k = 0; k < n_live; k++) {
        Seq *s = &seqs[live[k]];
        seq_commit(gpu, s->id, s);
        seq_commit(cpu, s->id, s);
        if (s->solo) seq_commit(s->solo, 0, s);
        s->len += s->tree ? 2 : s->n;
        ck_assert_int_eq(backend_seq_n_committed(gpu, s->id), s->len);
    }
    free(got), free(ref);
    return bad;
}

/* Opens sequence k on both backends (the same id: both hand out the lowest closed one). */
static void seq_join(Backend *gpu, Backend *cpu, Seq *s, const Model *dev, int bi) {
    RsErr e = {0};
    int other = -1;
    ck_assert_msg(backend_seq_open(gpu, &s->id, &e) == RS_OK, "%s", e.msg);
    ck_assert_msg(backend_seq_open(cpu, &other, &e) == RS_OK, "%s", e.msg);
    ck_assert_int_eq(other, s->id);
    if (bi) {
        setenv("ROOTSPEC_CUDA_GRAPHS", "0", 1); /* the reference runs eagerly */
        s->solo = make(cuda_backend_ops_get(), dev, SEQ_CAP, 1, 1);
        unsetenv("ROOTSPEC_CUDA_GRAPHS");
    }
}

START_TEST(test_cuda_forward_batch) {
    CU_REQUIRE_DEVICE();
    int bi = _i;
    Model *host = load(&cpu_backend_ops), *dev = load(cuda_backend_ops_get());
    int V = host->cfg.vocab_size;
    Backend *gpu = make(cuda_backend_ops_get(), dev, SEQ_CAP, NSEQ + 1, bi);
    Backend *cpu = make(&cpu_backend_ops, host, SEQ_CAP, NSEQ + 1, 0);
    Rng r;
    rng_seed(&r, 700 + bi);
    Seq seqs[NSEQ] = {{.want = 30}, {.want = 17}, {.want = 41}};
    int opened[NSEQ] = {0}, bad = 0, rounds = 0;
    for (;; rounds++) {
        int live[NSEQ], n_live = 0;
        for (int k = 0; k < NSEQ; k++) {
            if (!opened[k] && rounds >= 3 * k) { /* joins mid-decode */
                seq_join(gpu, cpu, &seqs[k], dev, bi);
                opened[k] = 1;
            }
            if (opened[k] == 1 && seqs[k].len == seqs[k].want) { /* leaves */
                backend_seq_close(gpu, seqs[k].id);
                backend_seq_close(cpu, seqs[k].id);
                backend_destroy(&seqs[k].solo);
                opened[k] = 2;
            }
            if (opened[k] == 1) live[n_live++] = k;
        }
        if (!n_live) break;
        bad += seq_round(gpu, cpu, seqs, live, n_live, &r, V);
    }
    ck_assert_msg(bad == 0, "%d comparisons over %d rounds differ (lines above)", bad, rounds);
    BackendKvUsage u = backend_kv_usage(gpu);
    ck_assert_int_eq(u.blocks_used, 0);
    ck_assert_int_eq(u.seqs_open, 1);
    backend_destroy(&gpu), backend_destroy(&cpu);
    model_destroy(&dev), model_destroy(&host);
}
END_TEST

/* A batch whose blocks are not free is RS_EFULL and changes nothing: the sequences keep
 * their counts, and the same batch runs once a sequence closes, in other blocks, to the same
 * logits. */
START_TEST(test_cuda_seq_blocks) {
    CU_REQUIRE_DEVICE();
    Model *dev = load(cuda_backend_ops_get());
    Backend *gpu = make(cuda_backend_ops_get(), dev, 3 * CUK_KV_BLOCK, 3, 0);
    int tok[20], pos[20], a, c, last = 19;
    for (int i = 0; i < 20; i++) tok[i] = 3 * i + 1, pos[i] = i;
    RsErr e = {0};
    ck_assert_int_eq(backend_seq_open(gpu, &a, &e), RS_OK);
    ck_assert_int_eq(backend_seq_open(gpu, &c, &e), RS_OK);
    ck_assert_int_eq(backend_seq_open(gpu, &c, &e), RS_EFULL); /* max_seqs 3 */
    BackendSeg g0 = {0, tok, pos, 20, NULL}, ga = {a, tok, pos, 20, NULL};
    float *l1 = malloc(sizeof(float) * (size_t)dev->cfg.vocab_size);
    float *l2 = malloc(sizeof(float) * (size_t)dev->cfg.vocab_size);
    ck_assert_msg(backend_forward_batch(gpu, &g0, 1, &last, 1, l1, &e) == RS_OK, "%s", e.msg);
    ck_assert_int_eq(backend_kv_usage(gpu).blocks_used, 2);
    ck_assert_int_eq(backend_forward_batch(gpu, &ga, 1, &last, 1, l2, &e), RS_EFULL);
    ck_assert_int_eq(backend_seq_n_pending(gpu, a), 0);
    ck_assert_int_eq(backend_kv_usage(gpu).blocks_used, 2);
    backend_seq_close(gpu, 0);
    ck_assert_int_eq(backend_kv_usage(gpu).blocks_used, 0);
    ck_assert_msg(backend_forward_batch(gpu, &ga, 1, &last, 1, l2, &e) == RS_OK, "%s", e.msg);
    /* the same prompt in other blocks: the same logits (the graph's bucket, one sequence) */
    ck_assert_int_eq(cu_bits_report("seq a vs seq 0, same prompt", l2, l1, 1, dev->cfg.vocab_size), 0);
    backend_seq_close(gpu, a);
    ck_assert_int_eq(backend_kv_usage(gpu).blocks_used, 0);
    free(l1), free(l2);
    backend_destroy(&gpu);
    model_destroy(&dev);
}
END_TEST

/* Batch-invariant rows over long contexts (several split-KV blocks per row): a sequence of
 * 600 committed entries and one of 20, a tree of three rows and a chunk of four in one pass,
 * each row the bits of its sequence alone and within tolerance of the CPU backend's batch. */
static Backend *make_long(const BackendOps *ops, const Model *m, int cap, int seqs) {
    BackendParams bp = {.kv_capacity = cap, .max_batch = 600, .max_pending = 600, .threads = 1,
                        .batch_invariant = 1, .max_seqs = seqs};
    Backend *b = NULL;
    RsErr e = {0};
    ck_assert_msg(backend_create(ops, m, &bp, &b, &e) == RS_OK, "%s", e.msg);
    return b;
}

/* Prefill of len tokens (seeded by k) on sequence seq of b, committed. */
static void prefill(Backend *b, int seq, int len, int k, int V) {
    static int tok[600], pos[600];
    for (int i = 0; i < len; i++) tok[i] = (i * 37 + 11 * k + 5) % V, pos[i] = i;
    BackendSeg g = {seq, tok, pos, len, NULL};
    int last = len - 1;
    RsErr e = {0};
    ck_assert_msg(backend_forward_batch(b, &g, 1, &last, 0, NULL, &e) == RS_OK, "%s", e.msg);
    ck_assert_msg(backend_seq_commit(b, seq, pos, len, &e) == RS_OK, "%s", e.msg);
}

START_TEST(test_cuda_forward_batch_long) {
    CU_REQUIRE_DEVICE();
    setenv("ROOTSPEC_CUDA_GRAPHS", "0", 1); /* a 600-row prefill bucket is eager anyway */
    const BackendOps *cu = cuda_backend_ops_get();
    Model *dev = load(cu), *host = load(&cpu_backend_ops);
    int V = dev->cfg.vocab_size, a = 0, ca = 0, len[2] = {600, 20};
    Backend *gpu = make_long(cu, dev, 1400, 3), *cpu = make_long(&cpu_backend_ops, host, 1400, 3);
    Backend *solo[2] = {make_long(cu, dev, 704, 1), make_long(cu, dev, 704, 1)};
    unsetenv("ROOTSPEC_CUDA_GRAPHS");
    RsErr e = {0};
    ck_assert_int_eq(backend_seq_open(gpu, &a, &e), RS_OK);
    ck_assert_int_eq(backend_seq_open(cpu, &ca, &e), RS_OK);
    ck_assert_int_eq(ca, a);
    int ids[2] = {a, 0};
    for (int k = 0; k < 2; k++) {
        prefill(gpu, ids[k], len[k], k, V);
        prefill(cpu, ids[k], len[k], k, V);
        prefill(solo[k], 0, len[k], k, V);
    }
    int tok[7] = {3, 9, 27, 81, 243, 217, 139}, pos[7] = {600, 600, 601, 20, 21, 22, 23};
    uint8_t mask[9] = {1, 0, 0, 0, 1, 0, 0, 1, 1}; /* two siblings, a child of the second */
    BackendSeg g[2] = {{a, tok, pos, 3, mask}, {0, tok + 3, pos + 3, 4, NULL}};
    int rows[7] = {6, 5, 4, 3, 2, 1, 0}, all[4] = {0, 1, 2, 3};
    float *got = malloc(sizeof(float) * 7 * (size_t)V), *one = malloc(sizeof(float) * 4 * (size_t)V);
    float *ref = malloc(sizeof(float) * 7 * (size_t)V), worst = 0;
    ck_assert_msg(backend_forward_batch(gpu, g, 2, rows, 7, got, &e) == RS_OK, "%s", e.msg);
    ck_assert_msg(backend_forward_batch(cpu, g, 2, rows, 7, ref, &e) == RS_OK, "%s", e.msg);
    int differ = cu_compare_logits("long contexts vs cpu", got, ref, 7, V, &worst) > 0;
    for (int k = 0; k < 2; k++) {
        ck_assert_msg(backend_forward_batch(solo[k], &(BackendSeg){0, g[k].tokens, g[k].pos, g[k].n, g[k].mask}, 1,
                                            all, g[k].n, one, &e) == RS_OK, "%s", e.msg);
        for (int j = 0; j < 7; j++) {
            int i = rows[j] - (k ? 3 : 0);
            if (i < 0 || i >= g[k].n) continue;
            char label[80];
            snprintf(label, sizeof label, "long seq %d row %d in the batch vs alone", k, i);
            differ += cu_bits_report(label, got + (size_t)j * V, one + (size_t)i * V, 1, V) > 0;
        }
    }
    ck_assert_msg(differ == 0, "%d comparisons differ (lines above)", differ);
    free(got), free(one), free(ref);
    backend_destroy(&gpu), backend_destroy(&cpu), backend_destroy(&solo[0]), backend_destroy(&solo[1]);
    model_destroy(&dev), model_destroy(&host);
}
END_TEST

/* ---- the batcher on the CUDA backend ---- */

#define NREQ 6
#define MAXNEW 16

typedef struct {
    int prompt[48], n_prompt, vocab;
    DecodeOpts opts;
    int out[MAXNEW + ROUND_MAX_EMIT], n_out;
    int restarts;
} Req;

/* Request i: a prompt of 3..38 tokens of repeated runs (the suffix drafter finds
 * continuations), one of four decoders. */
static void req_make(Req *r, int i, int V) {
    Rng g;
    rng_seed(&g, 950 + i);
    memset(r, 0, sizeof *r);
    r->vocab = V;
    r->n_prompt = 3 + (i * 13) % 36;
    for (int k = 0; k < r->n_prompt; k++)
        r->prompt[k] = k >= 5 && rng_next(&g) % 3 ? r->prompt[k - 5] : (int)(rng_next(&g) % (uint64_t)V);
    int kind = i % 4;
    r->opts = (DecodeOpts){.decoder = kind < 2 ? DECODER_AR : DECODER_DRAFT, .budget = 6, .seed = 5 + i,
                           .max_new = MAXNEW - i % 3, .ignore_eos = 1};
    if (kind % 2) r->opts.sampling = (Sampling){.temperature = 1.0};
}

static int req_run(Target *t, Req *r, RsErr *e) {
    Drafter *d = NULL;
    if (r->opts.decoder != DECODER_AR)
        ck_assert_int_eq(drafter_suffix_create(r->vocab, NULL, 0, NULL, &d, e), RS_OK);
    DecodeResult res = {.tokens = r->out, .cap = MAXNEW + ROUND_MAX_EMIT};
    int rc = decode_run(t, d, r->prompt, r->n_prompt, &r->opts, NULL, &res, e);
    drafter_destroy(&d);
    r->n_out = res.n_tokens;
    return rc;
}

typedef struct {
    Batcher *bt;
    Req *reqs;
    int first, step, fail;
    char why[1100];
} Worker;

/* A view's decodes first, first + step, ...; a preempted one restarts once blocks free. */
static void *worker_main(void *arg) {
    Worker *w = arg;
    Target *t = NULL;
    RsErr e = {0};
    if (batcher_target(w->bt, NULL, 0, &t, &e)) {
        snprintf(w->why, sizeof w->why, "%s", e.msg);
        w->fail = 1;
        return NULL;
    }
    for (int i = w->first; i < NREQ && !w->fail; i += w->step) {
        Req *r = &w->reqs[i];
        for (;;) {
            int rc = req_run(t, r, &e);
            batcher_leave(t);
            if (rc == RS_EFULL && batcher_preempted(t)) {
                r->restarts++;
                batcher_wait_blocks(w->bt, backend_kv_blocks_for(r->n_prompt + 8), 1000);
                continue;
            }
            if (rc) {
                snprintf(w->why, sizeof w->why, "request %d: %s", i, e.msg);
                w->fail = 1;
            }
            break;
        }
    }
    target_destroy(&t);
    return NULL;
}

START_TEST(test_cuda_batcher_exact) {
    CU_REQUIRE_DEVICE();
    Model *m = load(cuda_backend_ops_get());
    int V = m->cfg.vocab_size, parallel = 3;
    static Req want[NREQ], got[NREQ];
    Target *t = NULL;
    RsErr e = {0};
    BackendParams bp = {.kv_capacity = 128, .threads = 1, .batch_invariant = 1};
    ck_assert_msg(target_create(m, cuda_backend_ops_get(), &bp, NULL, 0, &t, &e) == RS_OK, "%s", e.msg);
    for (int i = 0; i < NREQ; i++) {
        req_make(&want[i], i, V);
        ck_assert_msg(req_run(t, &want[i], &e) == RS_OK, "solo %d: %s", i, e.msg);
    }
    target_destroy(&t);
    /* 6 blocks for 3 decodes of up to 4 blocks each: some are preempted and restart; in
     * the second run prompts are forwarded whole and cut into passes of at most 7 rows */
    BatchOpts o = {.parallel = parallel, .row_budget = _i ? 7 : 64, .prefill_chunk = _i ? 64 : 16,
                   .kv_entries = 6 * BACKEND_KV_BLOCK, .seq_capacity = 6 * BACKEND_KV_BLOCK,
                   .backend = {.threads = 1, .batch_invariant = 1}};
    Batcher *bt = NULL;
    ck_assert_msg(batcher_create(m, cuda_backend_ops_get(), &o, &bt, &e) == RS_OK, "%s", e.msg);
    for (int i = 0; i < NREQ; i++) req_make(&got[i], i, V);
    Worker w[3];
    pthread_t th[3];
    for (int k = 0; k < parallel; k++) {
        w[k] = (Worker){.bt = bt, .reqs = got, .first = k, .step = parallel};
        ck_assert_int_eq(pthread_create(&th[k], NULL, worker_main, &w[k]), 0);
    }
    for (int k = 0; k < parallel; k++) pthread_join(th[k], NULL);
    for (int k = 0; k < parallel; k++) ck_assert_msg(!w[k].fail, "%s", w[k].why);
    int restarts = 0;
    for (int i = 0; i < NREQ; i++) {
        ck_assert_int_eq(got[i].n_out, want[i].n_out);
        for (int j = 0; j < want[i].n_out; j++)
            ck_assert_msg(got[i].out[j] == want[i].out[j],
                          "request %d (%s, T=%g) token %d: batched %d, solo %d", i,
                          decoder_name(got[i].opts.decoder), got[i].opts.sampling.temperature, j,
                          got[i].out[j], want[i].out[j]);
        restarts += got[i].restarts;
    }
    BatchStats st = batcher_stats(bt);
    fprintf(stderr, "cuda batcher: %llu passes, %llu rows, %llu preemptions, %d restarts\n",
            (unsigned long long)st.passes, (unsigned long long)st.rows,
            (unsigned long long)st.preemptions, restarts);
    ck_assert_int_eq(st.blocks_used, 0);
    ck_assert_msg(st.rows > st.passes, "passes never carried several rows");
    batcher_destroy(&bt);
    model_destroy(&m);
}
END_TEST

Suite *suite_cuda_seqs(void) {
    Suite *s = suite_create("cuda_seqs");
    TCase *tc = tcase_create("seqs");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_cuda_paged_attention);
    tcase_add_loop_test(tc, test_cuda_forward_batch, 0, 2);
    tcase_add_test(tc, test_cuda_forward_batch_long);
    tcase_add_test(tc, test_cuda_seq_blocks);
    tcase_add_loop_test(tc, test_cuda_batcher_exact, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}
