/* Per-kernel tests of kernels/cuda/ (cuda_kernels.cu, cuda_attention.cu, cuda_gemm.cu,
 * cuda_sample.cu) on random inputs, each against the CPU
 * backend's own operation (kernels/cpu/cpu_ops.h) as its reference (llm.c style), so a kernel
 * is held to exactly what the CPU reference computes. Tolerances are stated per test as
 * |got - ref| <= atol + rtol*|ref|; tu_compare prints the first mismatches. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <string.h>
#include "common/logits.h"
#include "cuda_testutil.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/testutil.h"

static void *dnew(size_t bytes) {
    void *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 16));
    return p;
}
static void *dput(const void *h, size_t bytes) {
    void *p = dnew(bytes);
    CUDA_CHECK(cudaMemcpy(p, h, bytes, cudaMemcpyHostToDevice));
    return p;
}
static void dget(void *h, const void *d, size_t bytes) {
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}
static float *randv(size_t n, uint64_t *st, float lo, float hi) {
    float *v = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) v[i] = cu_randf(st, lo, hi);
    return v;
}
static rs_bf16 *to_bf16(const float *v, size_t n) {
    rs_bf16 *o = malloc(n * sizeof(rs_bf16));
    for (size_t i = 0; i < n; i++) {
        float r = cu_round_bf16(v[i]);
        uint32_t u;
        memcpy(&u, &r, 4);
        o[i] = (rs_bf16)(u >> 16);
    }
    return o;
}
static float bf16f(rs_bf16 h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* f32 copy of a bf16 array (the CPU ops run in f32 over the values the device holds). */
static float *from_bf16(const rs_bf16 *h, size_t n) {
    float *o = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) o[i] = bf16f(h[i]);
    return o;
}

START_TEST(test_cuda_bf16_convert) {
    CU_REQUIRE_DEVICE();
    uint64_t st = 1;
    size_t n = 10007;
    float *x = randv(n, &st, -100.0f, 100.0f);
    x[0] = 0.0f, x[1] = -0.0f, x[2] = 1.0f + 1.0f / 256.0f; /* exact tie: rounds to even */
    x[3] = INFINITY, x[4] = 3.3895314e38f;
    float *dx = dput(x, n * 4);
    rs_bf16 *dy = dnew(n * 2), *y = malloc(n * 2);
    cuk_f32_to_bf16(0, dx, dy, n);
    dget(y, dy, n * 2);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        float want = cu_round_bf16(x[i]);
        if (!(bf16f(y[i]) == want || (isinf(want) && isinf(bf16f(y[i]))))) {
            if (bad++ < 5) fprintf(stderr, "bf16 %zu: %g -> %g want %g\n", i, x[i], bf16f(y[i]), want);
        }
        /* host helper must agree with the device */
        if (cuk_f32_to_bf16_host(x[i]) != y[i] && bad++ < 5)
            fprintf(stderr, "bf16 host helper %zu: %g -> %04x device %04x\n", i, x[i],
                    cuk_f32_to_bf16_host(x[i]), y[i]);
    }
    ck_assert_int_eq(bad, 0);
    cudaFree(dx), cudaFree(dy), free(x), free(y);
}
END_TEST

START_TEST(test_cuda_embed_rmsnorm) {
    CU_REQUIRE_DEVICE();
    uint64_t st = 2;
    int vocab = 50, dim = 300, nb = 7;
    float *emb = randv((size_t)vocab * dim, &st, -2, 2), *w = randv(dim, &st, 0.5f, 1.5f);
    rs_bf16 *embh = to_bf16(emb, (size_t)vocab * dim);
    int tok[7] = {3, 49, 0, 3, 17, 25, 8}, rows[3] = {6, 0, 3};
    rs_bf16 *de = dput(embh, (size_t)vocab * dim * 2);
    int *dt = dput(tok, sizeof tok), *dr = dput(rows, sizeof rows);
    float *dw = dput(w, dim * 4), *dx = dnew((size_t)nb * dim * 4), *dof = dnew((size_t)nb * dim * 4);
    rs_bf16 *dob = dnew((size_t)nb * dim * 2);
    cuk_embed(0, de, dt, nb, dim, dx);
    float *x = malloc((size_t)nb * dim * 4), *ref = malloc((size_t)nb * dim * 4),
          *got = malloc((size_t)nb * dim * 4);
    rs_bf16 *gotb = malloc((size_t)nb * dim * 2);
    dget(x, dx, (size_t)nb * dim * 4);
    float *embf = from_bf16(embh, (size_t)vocab * dim);
    cpu_embed(ref, embf, tok, nb, dim);
    ck_assert_int_eq(memcmp(x, ref, (size_t)nb * dim * 4), 0);
    /* all rows, f32 + bf16 outputs: atol 1e-5, rtol 1e-5 (summation order only) */
    cuk_rmsnorm(0, dx, NULL, dw, nb, dim, 1e-5f, dof, dob);
    dget(got, dof, (size_t)nb * dim * 4);
    dget(gotb, dob, (size_t)nb * dim * 2);
    for (int t = 0; t < nb; t++) cpu_rmsnorm(ref + (size_t)t * dim, x + (size_t)t * dim, w, dim, 1e-5f);
    ck_assert_int_eq(tu_compare("rmsnorm", got, ref, (size_t)nb * dim, 1e-5f, 1e-5f, NULL), 0);
    for (size_t i = 0; i < (size_t)nb * dim; i++) ck_assert_float_eq(bf16f(gotb[i]), cu_round_bf16(got[i]));
    /* gathered rows (final norm of out_rows) */
    cuk_rmsnorm(0, dx, dr, dw, 3, dim, 1e-5f, dof, NULL);
    dget(got, dof, (size_t)3 * dim * 4);
    for (int r = 0; r < 3; r++) cpu_rmsnorm(ref + (size_t)r * dim, x + (size_t)rows[r] * dim, w, dim, 1e-5f);
    ck_assert_int_eq(tu_compare("rmsnorm rows", got, ref, (size_t)3 * dim, 1e-5f, 1e-5f, NULL), 0);
    cudaFree(de), cudaFree(dt), cudaFree(dr), cudaFree(dw), cudaFree(dx), cudaFree(dof), cudaFree(dob);
    free(emb), free(embf), free(w), free(embh), free(x), free(ref), free(got), free(gotb);
}
END_TEST

START_TEST(test_cuda_bias_headnorm_rope) {
    CU_REQUIRE_DEVICE();
    uint64_t st = 3;
    int nb = 5, hd = 64, nh = 4, nkv = 2, half = hd / 2, stride = (nh + 2 * nkv) * hd + 3;
    size_t n = (size_t)nb * stride;
    float *x = randv(n, &st, -3, 3), *bias = randv((size_t)(nh + 2 * nkv) * hd, &st, -1, 1);
    float *qn = randv(hd, &st, 0.5f, 1.5f), *ref = malloc(n * 4), *got = malloc(n * 4);
    int pos[5] = {0, 1, 17, 4095, 100000};
    Config c = {0};
    c.head_dim = hd, c.rope_theta = 500000.0f, c.rope_scaling = 1, c.rope_factor = 8.0f;
    c.rope_low_freq_factor = 1.0f, c.rope_high_freq_factor = 4.0f, c.rope_orig_max_pos = 8192;
    float inv[32];
    cuk_rope_inv_freq(&c, inv);
    /* independent inv_freq: HF _compute_llama3_parameters */
    for (int i = 0; i < half; i++) {
        double f = 1.0 / pow(500000.0, (double)(2 * i) / hd), wl = 2 * M_PI / f, r;
        if (wl < 8192.0 / 4.0) r = f;
        else if (wl > 8192.0 / 1.0) r = f / 8.0;
        else {
            double sm = (8192.0 / wl - 1.0) / (4.0 - 1.0);
            r = (1 - sm) * f / 8.0 + sm * f;
        }
        ck_assert_msg(fabs(inv[i] - r) <= 1e-6 * r, "inv_freq[%d] = %g, want %g", i, inv[i], r);
    }
    float *dx = dput(x, n * 4), *db = dput(bias, (size_t)(nh + 2 * nkv) * hd * 4);
    float *dqn = dput(qn, hd * 4), *dinv = dput(inv, sizeof inv);
    float *dc = dnew((size_t)nb * half * 4), *ds = dnew((size_t)nb * half * 4);
    int *dp = dput(pos, sizeof pos);
    cuk_bias_add(0, dx, stride, nb, (nh + 2 * nkv) * hd, db);
    cuk_head_rmsnorm(0, dx, stride, nb, nh, hd, dqn, 1e-6f);
    cuk_rope_table(0, dp, dinv, nb, half, dc, ds);
    cuk_rope(0, dx, stride, nb, nh + nkv, hd, dc, ds);
    dget(got, dx, n * 4);
    memcpy(ref, x, n * 4);
    float cs[5 * 32], sn[5 * 32];
    cpu_rope_table(pos, inv, nb, half, cs, sn);
    for (int t = 0; t < nb; t++) {
        float *r = ref + (size_t)t * stride;
        cpu_bias_add(r, bias, (nh + 2 * nkv) * hd);
        for (int h = 0; h < nh; h++) cpu_rmsnorm(r + h * hd, r + h * hd, qn, hd, 1e-6f);
        for (int h = 0; h < nh + nkv; h++) cpu_rope(r + h * hd, cs + t * half, sn + t * half, half);
    }
    ck_assert_int_eq(tu_compare("bias+headnorm+rope", got, ref, n, 2e-5f, 2e-5f, NULL), 0);
    cudaFree(dx), cudaFree(db), cudaFree(dqn), cudaFree(dinv), cudaFree(dc), cudaFree(ds), cudaFree(dp);
    free(x), free(bias), free(qn), free(ref), free(got);
}
END_TEST

/* The pending-entry bitmask of the kernels from a byte mask (n, stride), on the device. */
static uint64_t *dmask_bits(const uint8_t *mask, int n, int stride) {
    size_t words = (size_t)n * ((stride + 63) / 64);
    uint64_t *bits = malloc(words * 8 + 8);
    cuk_pack_mask(mask, n, stride, bits);
    uint64_t *d = dput(bits, words * 8 + 8);
    free(bits);
    return d;
}

/* Attention: committed slots always visible, pending slots by a random mask, GQA, padding
 * rows zero, split-KV with fixed (bi) or context-derived split bounds. Reference: cpu_attention
 * over the same bf16 K/V (as f32). atol 1e-4, rtol 1e-3. */
static void attention_case_mode(int hd, int nh, int nkv, int nc, int np, int n, int nb,
                                uint64_t seed, int bi) {
    uint64_t st = seed;
    int kvd = nkv * hd, qd = nh * hd, cap = nc + np + n + 5, stride = np + n;
    int qs = qd + 2 * kvd; /* q rows live in a wider qkv row */
    float *q = randv((size_t)nb * qs, &st, -1, 1);
    float *kf = randv((size_t)cap * kvd, &st, -1, 1), *vf = randv((size_t)cap * kvd, &st, -1, 1);
    rs_bf16 *kb = to_bf16(kf, (size_t)cap * kvd), *vb = to_bf16(vf, (size_t)cap * kvd);
    uint8_t *mask = calloc((size_t)n * stride, 1);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < stride; j++)
            mask[(size_t)t * stride + j] = j == np + t || (j < np + t && cu_randf(&st, 0, 1) < 0.5f);
    CuMeta meta = {n, nc + np, nc, stride, NULL};
    float *dq = dput(q, (size_t)nb * qs * 4), *dof = dnew((size_t)nb * qd * 4);
    rs_bf16 *dk = dput(kb, (size_t)cap * kvd * 2), *dv = dput(vb, (size_t)cap * kvd * 2);
    rs_bf16 *dob = dnew((size_t)nb * qd * 2);
    uint64_t *dm = dmask_bits(mask, n, stride);
    float *scr = dnew(cuk_attention_scratch_floats(nb, nh, hd, cap) * 4);
    unsigned *dcnt = dnew(cuk_attention_counters(nb, nh) * 4);
    CUDA_CHECK(cudaMemset(dcnt, 0, cuk_attention_counters(nb, nh) * 4));
    CuMeta *dmeta = dput(&meta, sizeof meta);
    CUDA_CHECK(cudaMemset(dof, 0xff, (size_t)nb * qd * 4)); /* NaN: padding must be rewritten */
    cuk_attention(0, dq, qs, dk, dv, dm, dmeta, nb, nh, nkv, hd, cap, bi, scr, dcnt, dob, dof);
    float *got = malloc((size_t)nb * qd * 4), *ref = calloc((size_t)nb * qd, 4);
    rs_bf16 *gotb = malloc((size_t)nb * qd * 2);
    dget(got, dof, (size_t)nb * qd * 4);
    dget(gotb, dob, (size_t)nb * qd * 2);
    /* the CPU op reads q as (n, qd) and K/V as f32 rows; padding rows stay zero in ref */
    float *qc = malloc((size_t)n * qd * 4), *kr = from_bf16(kb, (size_t)cap * kvd);
    float *vr = from_bf16(vb, (size_t)cap * kvd), *att = malloc((size_t)(nc + stride) * 4);
    for (int t = 0; t < n; t++) memcpy(qc + (size_t)t * qd, q + (size_t)t * qs, (size_t)qd * 4);
    int *idx = malloc((size_t)n * stride * sizeof(int)), *cnt = malloc((size_t)n * sizeof(int));
    cpu_attention_index(mask, n, np, stride, idx, cnt);
    cpu_attention(ref, qc, kr, vr, nc, idx, cnt, stride, n, nh, nkv, hd, att);
    char label[96];
    snprintf(label, sizeof label, "attention hd=%d nh=%d nkv=%d nc=%d np=%d n=%d nb=%d bi=%d", hd,
             nh, nkv, nc, np, n, nb, bi);
    ck_assert_int_eq(tu_compare(label, got, ref, (size_t)nb * qd, 1e-4f, 1e-3f, NULL), 0);
    for (size_t i = 0; i < (size_t)nb * qd; i++) ck_assert_float_eq(bf16f(gotb[i]), cu_round_bf16(got[i]));
    cudaFree(dq), cudaFree(dof), cudaFree(dk), cudaFree(dv), cudaFree(dob), cudaFree(dm), cudaFree(dmeta), cudaFree(scr), cudaFree(dcnt);
    free(q), free(kf), free(vf), free(kb), free(vb), free(mask), free(got), free(ref), free(gotb), free(qc), free(kr), free(vr), free(att), free(idx), free(cnt);
}

static void attention_case(int hd, int nh, int nkv, int nc, int np, int n, int nb, uint64_t seed) {
    for (int bi = 0; bi < 2; bi++) attention_case_mode(hd, nh, nkv, nc, np, n, nb, seed, bi);
}

START_TEST(test_cuda_attention) {
    CU_REQUIRE_DEVICE();
    attention_case(64, 9, 3, 40, 0, 1, 1, 11);     /* SmolLM2 heads, one decode token */
    attention_case(128, 8, 2, 300, 11, 60, 64, 12); /* tree pass, padded to 64 rows */
    attention_case(128, 4, 4, 0, 0, 65, 65, 13);    /* no committed context, MHA */
    attention_case(256, 4, 1, 5, 20, 9, 16, 14);    /* widest head, earlier pending */
    attention_case(32, 2, 1, 1000, 3, 2, 2, 15);    /* long committed context */
    attention_case(128, 32, 8, 700, 0, 1, 1, 16);   /* Llama-8B heads, decode over many splits */
    attention_case(128, 32, 8, 90, 40, 65, 65, 17); /* Llama-8B tree pass, 105 pending columns */
    attention_case(64, 16, 1, 33, 1, 64, 64, 18);   /* GQA 16: a tile of 4 rows x 16 heads */
    attention_case(16, 8, 1, 3, 0, 65, 65, 19);     /* tiny heads, one tile of 8 rows */
    attention_case(128, 64, 1, 50, 2, 3, 4, 20);    /* GQA 64: the group over two blocks */
}
END_TEST

/* Batch invariance of the attention kernel: with fixed split bounds a row computed alone
 * (n = 1, its mask row, its cache slot) is bitwise the same row inside a 65-row tree pass
 * (several row tiles, another split count without bi). */
START_TEST(test_cuda_attention_batch_invariant) {
    CU_REQUIRE_DEVICE();
    uint64_t st = 21;
    int hd = 64, nh = 8, nkv = 2, nc = 2000, n = 65, cap = nc + n + 3, kvd = nkv * hd, qd = nh * hd;
    float *q = randv((size_t)n * qd, &st, -2, 2), *kf = randv((size_t)cap * kvd, &st, -2, 2);
    float *vf = randv((size_t)cap * kvd, &st, -1, 1);
    rs_bf16 *kb = to_bf16(kf, (size_t)cap * kvd), *vb = to_bf16(vf, (size_t)cap * kvd);
    uint8_t *mask = calloc((size_t)n * n, 1);
    for (int t = 0; t < n; t++) /* a random tree: each row sees itself and some ancestors */
        for (int j = 0; j <= t; j++) mask[(size_t)t * n + j] = j == t || cu_randf(&st, 0, 1) < 0.3f;
    float *dq = dput(q, (size_t)n * qd * 4), *dall = dnew((size_t)n * qd * 4), *done = dnew((size_t)qd * 4);
    rs_bf16 *dk = dput(kb, (size_t)cap * kvd * 2), *dv = dput(vb, (size_t)cap * kvd * 2);
    float *scr = dnew(cuk_attention_scratch_floats(n, nh, hd, cap) * 4);
    unsigned *cnt = dnew(cuk_attention_counters(n, nh) * 4);
    CUDA_CHECK(cudaMemset(cnt, 0, cuk_attention_counters(n, nh) * 4));
    uint64_t *dm = dmask_bits(mask, n, n);
    CuMeta meta = {n, nc, nc, n, NULL};
    CuMeta *dmeta = dput(&meta, sizeof meta);
    cuk_attention(0, dq, qd, dk, dv, dm, dmeta, n, nh, nkv, hd, cap, 1, scr, cnt, NULL, dall);
    float *all = malloc((size_t)n * qd * 4), *one = malloc((size_t)qd * 4);
    dget(all, dall, (size_t)n * qd * 4);
    int rows[4] = {0, 17, 37, 64}, differ = 0;
    for (int r = 0; r < 4; r++) {
        int t = rows[r];
        CuMeta m1 = {1, nc + t, nc, t + 1, NULL};
        uint64_t *dm1 = dmask_bits(mask + (size_t)t * n, 1, t + 1);
        CUDA_CHECK(cudaMemcpy(dmeta, &m1, sizeof m1, cudaMemcpyHostToDevice));
        cuk_attention(0, dq + (size_t)t * qd, qd, dk, dv, dm1, dmeta, 1, nh, nkv, hd, cap, 1, scr,
                      cnt, NULL, done);
        dget(one, done, (size_t)qd * 4);
        char label[96];
        snprintf(label, sizeof label, "attention row %d alone vs the 65-row pass", t);
        differ += cu_bits_report(label, one, all + (size_t)t * qd, 1, qd) > 0;
        cudaFree(dm1);
    }
    ck_assert_msg(differ == 0, "%d of 4 rows differ alone from the 65-row pass", differ);
    cudaFree(dq), cudaFree(dall), cudaFree(done), cudaFree(dk), cudaFree(dv), cudaFree(scr);
    cudaFree(dm), cudaFree(dmeta), cudaFree(cnt);
    free(q), free(kf), free(vf), free(kb), free(vb), free(mask), free(all), free(one);
}
END_TEST

/* The fused attention input (RMSNorm, q|k|v projection, bias, q/k norm, RoPE, KV store):
 * bitwise equal to cuk_gemm_bi (norm prologue) + cuk_qkv_post, the two launches it
 * replaces, and within atol 2e-4, rtol 2e-3 of the CPU ops (normed input rounded to bf16,
 * as the device feeds it to the projection). Padding rows t >= n are computed but never
 * reach the cache. The fused kernel runs twice on the same head counters: the second
 * launch's heads are only finished if the first left its counters at zero. */
static void qkv_fused_case(int dim, int nh, int nkv, int hd, int nb, int n, int with_bias,
                           int with_norm, uint64_t seed) {
    uint64_t st = seed;
    int half = hd / 2, kvd = nkv * hd, w = (nh + 2 * nkv) * hd, base = 7, cap = base + nb + 3;
    float eps = 1e-5f;
    float *x = randv((size_t)nb * dim, &st, -2, 2), *nw = randv(dim, &st, 0.5f, 1.5f);
    float *wf = randv((size_t)w * dim, &st, -0.1f, 0.1f), *bias = randv(w, &st, -0.5f, 0.5f);
    float *qn = randv(hd, &st, 0.5f, 1.5f), *kn = randv(hd, &st, 0.5f, 1.5f);
    rs_bf16 *wb = to_bf16(wf, (size_t)w * dim);
    float *wr = from_bf16(wb, (size_t)w * dim);
    int pos[65];
    for (int t = 0; t < nb; t++) pos[t] = 3 + 5 * t;
    Config c = {0};
    c.head_dim = hd, c.rope_theta = 10000.0f;
    float inv[128], cs[65 * 128], sn[65 * 128];
    cuk_rope_inv_freq(&c, inv);
    cpu_rope_table(pos, inv, nb, half, cs, sn);
    float *dx = dput(x, (size_t)nb * dim * 4), *dnw = dput(nw, dim * 4), *db = dput(bias, w * 4);
    float *dqn = dput(qn, hd * 4), *dkn = dput(kn, hd * 4);
    float *dcs = dput(cs, (size_t)nb * half * 4), *dsn = dput(sn, (size_t)nb * half * 4);
    rs_bf16 *dw = dput(wb, (size_t)w * dim * 2);
    CuMeta meta = {n, base, 2, n, NULL};
    CuMeta *dmeta = dput(&meta, sizeof meta);
    float *dqa = dnew((size_t)nb * w * 4), *dqb = dnew((size_t)nb * w * 4);
    size_t cb = (size_t)cap * kvd * 2;
    rs_bf16 *kca = dnew(cb), *vca = dnew(cb), *kcb = dnew(cb), *vcb = dnew(cb);
    CUDA_CHECK(cudaMemset(kca, 0, cb));
    CUDA_CHECK(cudaMemset(vca, 0, cb));
    CUDA_CHECK(cudaMemset(kcb, 0, cb));
    CUDA_CHECK(cudaMemset(vcb, 0, cb));
    const float *b_ = with_bias ? db : NULL, *q_ = with_norm ? dqn : NULL, *k_ = with_norm ? dkn : NULL;
    size_t nct = cuk_qkv_counters(nb, nh, nkv) * sizeof(unsigned);
    unsigned *dct = dnew(nct);
    CUDA_CHECK(cudaMemset(dct, 0, nct));
    for (int rep = 0; rep < 2; rep++) {
        CUDA_CHECK(cudaMemset(dqa, 0, (size_t)nb * w * 4));
        cuk_qkv_fused(0, dw, dx, dnw, dim, eps, nb, nh, nkv, hd, b_, q_, k_, dcs, dsn, dmeta, dqa,
                      kca, vca, dct);
    }
    cuk_gemm_bi(0, dw, w, dim, nb, NULL, dx, NULL, dnw, eps, 0, 0, dqb, NULL);
    cuk_qkv_post(0, dqb, w, nb, nh, nkv, hd, b_, q_, k_, eps, dcs, dsn, dmeta, kcb, vcb);
    float *ga = malloc((size_t)nb * w * 4), *gb = malloc((size_t)nb * w * 4);
    rs_bf16 *ka = malloc(cb), *va = malloc(cb), *kb2 = malloc(cb), *vb2 = malloc(cb);
    dget(ga, dqa, (size_t)nb * w * 4), dget(gb, dqb, (size_t)nb * w * 4);
    dget(ka, kca, cb), dget(va, vca, cb), dget(kb2, kcb, cb), dget(vb2, vcb, cb);
    char label[96];
    snprintf(label, sizeof label, "qkv_fused dim=%d nh=%d nkv=%d hd=%d nb=%d n=%d", dim, nh, nkv,
             hd, nb, n);
    /* every comparison runs (and reports) before the test fails on any */
    char what[160];
    snprintf(what, sizeof what, "%s: fused vs gemm_bi+qkv_post", label);
    int differ = cu_bits_report(what, ga, gb, nb, w);
    size_t ce = cb / 2;
    float *cf[4];
    const rs_bf16 *csrc[4] = {ka, kb2, va, vb2};
    for (int i = 0; i < 4; i++) {
        cf[i] = malloc(ce * 4);
        for (size_t j = 0; j < ce; j++) cf[i][j] = cuk_bf16_to_f32_host(csrc[i][j]);
    }
    snprintf(what, sizeof what, "%s: K cache", label);
    int kd = cu_bits_report(what, cf[0], cf[1], 1, (int)ce);
    snprintf(what, sizeof what, "%s: V cache", label);
    int vd = cu_bits_report(what, cf[2], cf[3], 1, (int)ce);
    for (int i = 0; i < 4; i++) free(cf[i]);
    ck_assert_msg(differ == 0, "%s: %d rows differ from gemm_bi+qkv_post", label, differ);
    ck_assert_msg(kd == 0 && vd == 0, "%s: caches differ", label);
    float *ref = malloc((size_t)nb * w * 4), *xn = malloc((size_t)dim * 4);
    for (int t = 0; t < nb; t++) {
        float *r = ref + (size_t)t * w;
        cpu_rmsnorm(xn, x + (size_t)t * dim, nw, dim, eps);
        for (int i = 0; i < dim; i++) xn[i] = cu_round_bf16(xn[i]);
        cpu_matmul(r, xn, wr, 1, dim, w, w);
        if (with_bias) cpu_bias_add(r, bias, w);
        for (int h = 0; h < nh + nkv && with_norm; h++)
            cpu_rmsnorm(r + h * hd, r + h * hd, h < nh ? qn : kn, hd, eps);
        for (int h = 0; h < nh + nkv; h++) cpu_rope(r + h * hd, cs + t * half, sn + t * half, half);
    }
    ck_assert_int_eq(tu_compare(label, ga, ref, (size_t)nb * w, 2e-4f, 2e-3f, NULL), 0);
    for (int sl = 0; sl < cap; sl++)
        for (int i = 0; i < kvd; i++) {
            int t = sl - base, live = t >= 0 && t < n;
            const float *r = ga + (size_t)(live ? t : 0) * w + nh * hd;
            ck_assert_float_eq(bf16f(ka[(size_t)sl * kvd + i]), live ? cu_round_bf16(r[i]) : 0.0f);
            ck_assert_float_eq(bf16f(va[(size_t)sl * kvd + i]), live ? cu_round_bf16(r[kvd + i]) : 0.0f);
        }
    cudaFree(dx), cudaFree(dnw), cudaFree(db), cudaFree(dqn), cudaFree(dkn), cudaFree(dcs);
    cudaFree(dsn), cudaFree(dw), cudaFree(dmeta), cudaFree(dqa), cudaFree(dqb);
    cudaFree(kca), cudaFree(vca), cudaFree(kcb), cudaFree(vcb), cudaFree(dct);
    free(x), free(nw), free(wf), free(bias), free(qn), free(kn), free(wb), free(wr), free(ga);
    free(gb), free(ka), free(va), free(kb2), free(vb2), free(ref), free(xn);
}

START_TEST(test_cuda_qkv_fused) {
    CU_REQUIRE_DEVICE();
    qkv_fused_case(576, 9, 3, 64, 1, 1, 0, 0, 31);   /* SmolLM2 shape, one decode row */
    qkv_fused_case(256, 4, 2, 64, 19, 13, 1, 1, 32); /* 3 row groups, padding, bias, q/k norm */
    qkv_fused_case(128, 2, 1, 256, 9, 9, 0, 1, 33);  /* widest head */
    qkv_fused_case(64, 4, 4, 16, 65, 60, 1, 0, 34);  /* MHA, tiny heads, a 65-row pass */
    qkv_fused_case(64, 16, 8, 16, 65, 65, 0, 1, 35); /* enough blocks: one per head */
    /* rows staged into shared memory 4 at a time (8 rows a group) */
    qkv_fused_case(CUK_NORM_GEMM_MAX_IN / 4, 2, 1, 64, 9, 9, 1, 1, 36);
}
END_TEST

/* cuk_gemv against cpu_matmul on the bf16 values the device holds (|d| <= 1e-5 of the sum of
 * |w x|), bitwise equal to cuk_gemm_bi of one row without a prologue (the same lane split
 * and order), and accumulating adds exactly the same values; shapes whose in is not a
 * multiple of the 2048 elements a warp loads per step and whose out is not of 8. */
START_TEST(test_cuda_gemv) {
    CU_REQUIRE_DEVICE();
    int shapes[3][2] = {{37, 96}, {130, 2056}, {8, 4608}};
    uint64_t st = 77;
    for (int si = 0; si < 3; si++) {
        int out = shapes[si][0], in = shapes[si][1];
        float *wf = randv((size_t)out * in, &st, -0.2f, 0.2f), *xf = randv(in, &st, -1.0f, 1.0f);
        float *y0 = randv(out, &st, -1.0f, 1.0f);
        rs_bf16 *wb = to_bf16(wf, (size_t)out * in), *xb = to_bf16(xf, in);
        float *wr = from_bf16(wb, (size_t)out * in), *xr = from_bf16(xb, in);
        rs_bf16 *dw = dput(wb, (size_t)out * in * 2), *dx = dput(xb, (size_t)in * 2);
        float *dy = dnew((size_t)out * 4), *dz = dnew((size_t)out * 4), *dacc = dput(y0, (size_t)out * 4);
        cuk_gemv(0, dw, out, in, dx, 0, dy);
        cuk_gemm_bi(0, dw, out, in, 1, dx, NULL, NULL, NULL, 0.0f, 0, 0, dz, NULL);
        cuk_gemv(0, dw, out, in, dx, 1, dacc);
        float *y = malloc((size_t)out * 4), *z = malloc((size_t)out * 4), *acc = malloc((size_t)out * 4);
        float *ref = malloc((size_t)out * 4), *want = malloc((size_t)out * 4);
        dget(y, dy, (size_t)out * 4), dget(z, dz, (size_t)out * 4), dget(acc, dacc, (size_t)out * 4);
        cpu_matmul(ref, xr, wr, 1, in, out, out);
        for (int o = 0; o < out; o++) {
            double mag = 0;
            for (int k = 0; k < in; k++) mag += fabs((double)wr[(size_t)o * in + k] * xr[k]);
            ck_assert_msg(fabs(y[o] - ref[o]) <= 1e-5 * mag + 1e-7, "gemv %dx%d out %d: %g vs %g",
                          out, in, o, y[o], ref[o]);
            want[o] = y0[o] + y[o];
        }
        char label[64];
        snprintf(label, sizeof label, "gemv %dx%d vs gemm_bi", out, in);
        int d1 = cu_bits_report(label, y, z, 1, out);
        snprintf(label, sizeof label, "gemv %dx%d accumulate", out, in);
        int d2 = cu_bits_report(label, acc, want, 1, out);
        ck_assert_msg(d1 == 0 && d2 == 0, "gemv %dx%d: bits differ from gemm_bi or y0 + y", out, in);
        cudaFree(dw), cudaFree(dx), cudaFree(dy), cudaFree(dz), cudaFree(dacc);
        free(wf), free(xf), free(y0), free(wb), free(xb), free(wr), free(xr);
        free(y), free(z), free(acc), free(ref), free(want);
    }
}
END_TEST

START_TEST(test_cuda_kv_store_swiglu_residual) {
    CU_REQUIRE_DEVICE();
    uint64_t st = 4;
    int nb = 8, n = 5, kvd = 96, stride = 4 * kvd, cap = 30, base = 17;
    float *qkv = randv((size_t)nb * stride, &st, -4, 4);
    float *dqkv = dput(qkv, (size_t)nb * stride * 4);
    rs_bf16 *dk = dnew((size_t)cap * kvd * 2), *dv = dnew((size_t)cap * kvd * 2);
    CUDA_CHECK(cudaMemset(dk, 0, (size_t)cap * kvd * 2));
    CUDA_CHECK(cudaMemset(dv, 0, (size_t)cap * kvd * 2));
    CuMeta meta = {n, base, 3, 20, NULL};
    CuMeta *dmeta = dput(&meta, sizeof meta);
    cuk_kv_store(0, dqkv + 2 * kvd, dqkv + 3 * kvd, stride, nb, kvd, dmeta, dk, dv);
    rs_bf16 *k = malloc((size_t)cap * kvd * 2), *v = malloc((size_t)cap * kvd * 2);
    dget(k, dk, (size_t)cap * kvd * 2);
    dget(v, dv, (size_t)cap * kvd * 2);
    for (int s = 0; s < cap; s++)
        for (int i = 0; i < kvd; i++) {
            int t = s - base, live = t >= 0 && t < n; /* padding rows never reach the cache */
            float wk = live ? cu_round_bf16(qkv[(size_t)t * stride + 2 * kvd + i]) : 0.0f;
            float wv = live ? cu_round_bf16(qkv[(size_t)t * stride + 3 * kvd + i]) : 0.0f;
            ck_assert_float_eq(bf16f(k[(size_t)s * kvd + i]), wk);
            ck_assert_float_eq(bf16f(v[(size_t)s * kvd + i]), wv);
        }
    /* SwiGLU: atol 1e-6 rtol 1e-5 */
    int hidden = 333;
    float *gu = randv((size_t)nb * 2 * hidden, &st, -8, 8), *dgu = dput(gu, (size_t)nb * 2 * hidden * 4);
    float *dof = dnew((size_t)nb * hidden * 4), *got = malloc((size_t)nb * hidden * 4),
          *ref = malloc((size_t)nb * hidden * 4);
    cuk_swiglu(0, dgu, nb, hidden, NULL, dof);
    dget(got, dof, (size_t)nb * hidden * 4);
    float *up = malloc((size_t)nb * hidden * 4);
    for (int t = 0; t < nb; t++) {
        memcpy(ref + (size_t)t * hidden, gu + (size_t)t * 2 * hidden, (size_t)hidden * 4);
        memcpy(up + (size_t)t * hidden, gu + (size_t)t * 2 * hidden + hidden, (size_t)hidden * 4);
    }
    cpu_swiglu(ref, up, (size_t)nb * hidden);
    ck_assert_int_eq(tu_compare("swiglu", got, ref, (size_t)nb * hidden, 1e-6f, 1e-5f, NULL), 0);
    /* residual add: exact */
    size_t m = 5000;
    float *a = randv(m, &st, -1, 1), *b = randv(m, &st, -1, 1), *da = dput(a, m * 4), *db = dput(b, m * 4);
    float *sum = malloc(m * 4);
    cuk_residual_add(0, da, db, m);
    dget(sum, da, m * 4);
    cpu_residual_add(a, b, m);
    ck_assert_int_eq(memcmp(sum, a, m * 4), 0);
    cudaFree(dqkv), cudaFree(dk), cudaFree(dv), cudaFree(dmeta), cudaFree(dgu), cudaFree(dof);
    cudaFree(da), cudaFree(db);
    free(qkv), free(k), free(v), free(gu), free(up), free(got), free(ref), free(a), free(b), free(sum);
}
END_TEST

/* KV compaction: arbitrary keep order (reversed, gaps) over 3 layers; exact copy. */
START_TEST(test_cuda_kv_compact) {
    CU_REQUIRE_DEVICE();
    int L = 3, cap = 40, kvd = 24, nc = 10, np = 12;
    size_t n = (size_t)L * cap * kvd;
    rs_bf16 *c = malloc(n * 2), *got = malloc(n * 2), *want = malloc(n * 2);
    for (size_t i = 0; i < n; i++) c[i] = (rs_bf16)(i * 2654435761u >> 16);
    int keep[5] = {11, 0, 5, 4, 9};
    rs_bf16 *dc = dput(c, n * 2), *scratch = dnew((size_t)L * np * kvd * 2);
    int *dkeep = dput(keep, sizeof keep);
    cuk_kv_compact(0, dc, L, cap, kvd, nc, dkeep, 5, scratch);
    dget(got, dc, n * 2);
    memcpy(want, c, n * 2);
    for (int l = 0; l < L; l++)
        for (int i = 0; i < 5; i++)
            memcpy(want + ((size_t)l * cap + nc + i) * kvd, c + ((size_t)l * cap + nc + keep[i]) * kvd,
                   (size_t)kvd * 2);
    ck_assert_int_eq(memcmp(got, want, n * 2), 0);
    cudaFree(dc), cudaFree(scratch), cudaFree(dkeep);
    free(c), free(got), free(want);
}
END_TEST

/* argmax vs row_argmax (ties to the lowest index) and sampling vs row_sample with the
 * same uniform: identical indices required. */
START_TEST(test_cuda_argmax_sample) {
    CU_REQUIRE_DEVICE();
    uint64_t st = 5;
    int sizes[3] = {7, 49152, 128256};
    int *dout = dnew(4);
    for (int si = 0; si < 3; si++) {
        int n = sizes[si];
        float *row = randv(n, &st, -3, 3);
        float *drow = dnew((size_t)n * 4);
        for (int rep = 0; rep < 40; rep++) {
            for (int i = 0; i < n; i++) row[i] = cu_randf(&st, -3, 3);
            if (rep % 3 == 0) { /* planted ties */
                int a = (int)cu_randf(&st, 0, (float)n), b = (int)cu_randf(&st, 0, (float)n);
                row[a] = row[b] = 10.0f;
            }
            if (rep % 3 == 1) row[n - 1] = 50.0f; /* near point mass at the end */
            CUDA_CHECK(cudaMemcpy(drow, row, (size_t)n * 4, cudaMemcpyHostToDevice));
            int got;
            cuk_argmax(0, drow, n, dout);
            dget(&got, dout, 4);
            ck_assert_int_eq(got, row_argmax(row, n));
            Rng r1, r2;
            rng_seed(&r1, 1000 + rep);
            r2 = r1;
            double u = rng_uniform(&r1);
            cuk_sample(0, drow, n, u, dout);
            dget(&got, dout, 4);
            int want = row_sample(row, n, &r2);
            ck_assert_msg(got == want, "sample n=%d rep=%d u=%.17g: got %d want %d", n, rep, u, got, want);
        }
        cudaFree(drow), free(row);
    }
    cudaFree(dout);
}
END_TEST

Suite *suite_cuda_kernels(void) {
    Suite *s = suite_create("cuda_kernels");
    TCase *tc = tcase_create("kernels");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_cuda_bf16_convert);
    tcase_add_test(tc, test_cuda_embed_rmsnorm);
    tcase_add_test(tc, test_cuda_bias_headnorm_rope);
    tcase_add_test(tc, test_cuda_attention);
    tcase_add_test(tc, test_cuda_attention_batch_invariant);
    tcase_add_test(tc, test_cuda_qkv_fused);
    tcase_add_test(tc, test_cuda_gemv);
    tcase_add_test(tc, test_cuda_kv_store_swiglu_residual);
    tcase_add_test(tc, test_cuda_kv_compact);
    tcase_add_test(tc, test_cuda_argmax_sample);
    suite_add_tcase(s, tc);
    return s;
}
