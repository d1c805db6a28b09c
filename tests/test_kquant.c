/* K-quants: quant_dequantize of Q4_K/Q5_K/Q6_K (and the Q5_0/Q5_1 blocks Q4_K_M files fall
 * back to) against gguf-py's dequantization
 * (tests/fixtures/kquant/blocks.bin from tools/gen_kquant_fixtures.py), and the kernel
 * families' K-quant products against Q8 (per 32) activations (kernels/cpu/cpu_kquant.c, the
 * x86 tiles of cpu_qk_x86.inc) against dequantize-then-dot. */
#include "testutil.h"
#include "common/quant.h"
#include "common/util.h"
#include "kernels/cpu/cpu_kquant.h"
#include "kernels/cpu/cpu_qmatmul.h"
#include <math.h>
#include <string.h>

typedef struct {
    uint32_t type, n_elems, n_bytes;
    const uint8_t *bytes;
    const float *deq; /* points into the file buffer: read with memcpy */
} QkCase;

typedef struct {
    char *buf;
    size_t len;
    int n;
    QkCase c[16];
} QkFixture;

static uint32_t rd_u32(const char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static void qk_read(QkFixture *f) {
    const char *path = tu_fixture("kquant/blocks.bin");
    RsErr e = {0};
    ck_assert_msg(rs_read_file(path, &f->buf, &f->len, &e) == RS_OK, "%s", e.msg);
    ck_assert_msg(f->len >= 12 && memcmp(f->buf, "RSKQ", 4) == 0 && rd_u32(f->buf + 4) == 1,
                  "%s: not an RSKQ v1 file", path);
    f->n = (int)rd_u32(f->buf + 8);
    ck_assert_int_le(f->n, 16);
    size_t off = 12;
    for (int i = 0; i < f->n; i++) {
        QkCase *c = &f->c[i];
        ck_assert_msg(off + 12 <= f->len, "%s truncated", path);
        c->type = rd_u32(f->buf + off);
        c->n_elems = rd_u32(f->buf + off + 4);
        c->n_bytes = rd_u32(f->buf + off + 8);
        off += 12;
        ck_assert_msg(c->n_elems <= (1u << 20) && c->n_bytes <= (1u << 20) &&
                          off + c->n_bytes + 4ull * c->n_elems <= f->len,
                      "%s: case %d truncated", path, i);
        c->bytes = (const uint8_t *)f->buf + off;
        c->deq = (const float *)(f->buf + off + c->n_bytes);
        off += c->n_bytes + 4ull * c->n_elems;
    }
    ck_assert_uint_eq(off, f->len);
}

/* Every element bitwise equal to gguf-py's float32 result. */
START_TEST(test_kquant_dequant_fixture) {
    QkFixture f;
    qk_read(&f);
    int seen[5] = {0};
    for (int i = 0; i < f.n; i++) {
        QkCase *c = &f.c[i];
        int k = c->type == QT_Q4_K ? 0 : c->type == QT_Q5_K ? 1 : c->type == QT_Q6_K ? 2
              : c->type == QT_Q5_0 ? 3 : c->type == QT_Q5_1 ? 4 : -1;
        ck_assert_msg(k >= 0, "case %d: type %u", i, c->type);
        ck_assert(quant_type_supported(c->type));
        seen[k]++;
        size_t be, bb;
        ck_assert_int_eq(quant_type_geometry(c->type, &be, &bb), 0);
        ck_assert_uint_eq(be, k < 3 ? QK_K : 32);
        ck_assert_uint_eq(c->n_bytes, c->n_elems / be * bb);
        float *got = rs_xmalloc(sizeof(float) * c->n_elems);
        uint8_t *src = rs_xmalloc(c->n_bytes + 1); /* odd address: blocks are unaligned */
        memcpy(src + 1, c->bytes, c->n_bytes);
        quant_dequantize(c->type, src + 1, got, c->n_elems);
        int bad = 0;
        for (uint32_t j = 0; j < c->n_elems; j++) {
            float want;
            memcpy(&want, (const char *)c->deq + 4 * j, 4);
            if (memcmp(&want, &got[j], 4) != 0 && bad++ < 5)
                fprintf(stderr, "%s case %d element %u: got %.9g, gguf-py %.9g\n",
                        quant_type_name(c->type), i, j, got[j], want);
        }
        ck_assert_msg(bad == 0, "%s case %d: %d of %u elements differ from gguf-py",
                      quant_type_name(c->type), i, bad, c->n_elems);
        free(got);
        free(src);
    }
    for (int k = 0; k < 5; k++) ck_assert_int_eq(seen[k], 2);
    free(f.buf);
}
END_TEST

/* Roughly normal (Irwin-Hall of 4 splitmix64 uniforms); any fixed spread will do. */
static float gauss(uint64_t *s) {
    float u = 0;
    for (int k = 0; k < 4; k++) {
        uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        u += (float)((z >> 40) * 0x1p-24) - 0.5f;
    }
    return u * 1.7f;
}

/* The AVX2 family, or NULL where this CPU lacks it. */
static const QkFamily *avx2_family(void) {
    RsErr e = {0};
    return qk_family_pick("avx2", &e);
}

/* The product y = w x of one weight row through a kernel family, for a's tokens. */
static void family_dot(const QkFamily *f, int type, const uint8_t *w, int n, const QkActs *a,
                       float *out) {
    size_t be, bb;
    quant_type_geometry((uint32_t)type, &be, &bb);
    QTensor qt = {(uint32_t)type, w, 1, n, n / be * bb, 0, 0};
    float *scratch = rs_xmalloc(sizeof(float) * n);
    qk_matmul_rows(f, &qt, a, out, 1, 0, 1, scratch);
    free(scratch);
}

/* Weight rows are the fixture's blocks (realistic and random-byte ones) cycled to n
 * elements; 4 activation rows x ~ N(0, 1) with a few outliers, quantized as the family's
 * kernel takes them (per 32, or per 256 on x86: tu_act_seen). Per (type, n, kernel,
 * token):
 *  - kernel vs sum_i deq(w)[i] * (d * q[i]) in double: only f32 rounding of the
 *    per-block products and their accumulation, bound 1e-5 * sum |terms| + 1e-6;
 *  - kernel vs the f32 activations in double: adds the activation rounding, |x - d*q| <=
 *    d/2 per element, so the bound is sum_i |w_i| * d_block(i) / 2 plus the above;
 *  - each token's result bitwise the same when the kernel takes it alone (nt = 1).
 * The scalar and AVX2 families (when the CPU has AVX2) both hold these bounds. */
static void check_dot(int t, const uint8_t *w, int n, const QkActs *a, int rep) {
    float *wd = rs_xmalloc(sizeof(float) * n);
    quant_dequantize((uint32_t)t, w, wd, n);
    RsErr e = {0};
    const QkFamily *fams[2] = {qk_family_pick("scalar", &e), avx2_family()};
    ck_assert_msg(fams[0] != NULL, "%s", e.msg);
    for (int avx2 = 0; avx2 < 2 && fams[avx2]; avx2++) {
        const QkFamily *f = fams[avx2];
        int act = qk_wants_act(f, (uint32_t)t);
        float got[4];
        family_dot(f, t, w, n, a, got);
        for (int k = 0; k < 4; k++) {
            double ref_q = 0, ref_x = 0, mag = 0, qerr = 0;
            for (int i = 0; i < n; i++) {
                double half, xq = tu_act_seen(a, act, k, i, &half);
                ref_q += (double)wd[i] * xq;
                ref_x += (double)wd[i] * a->f32[k * n + i];
                mag += fabs((double)wd[i] * xq);
                qerr += fabs((double)wd[i]) * half;
            }
            double tol = 1e-5 * mag + 1e-6;
            const char *kn = avx2 ? "avx2" : "scalar";
            ck_assert_msg(fabs(got[k] - ref_q) <= tol, "%s n=%d rep %d token %d: %s %.9g, "
                          "dequantized %.9g (tol %g)", quant_type_name(t), n, rep, k, kn, got[k],
                          ref_q, tol);
            ck_assert_msg(fabs(got[k] - ref_x) <= tol + qerr * (1 + 1e-6),
                          "%s n=%d rep %d token %d: %s %.9g, f32 dot %.9g (tol %g)",
                          quant_type_name(t), n, rep, k, kn, got[k], ref_x, tol + qerr);
            float one;
            QkActs a1 = tu_acts_row(a, k);
            family_dot(f, t, w, n, &a1, &one);
            ck_assert_msg(memcmp(&one, &got[k], 4) == 0, "%s n=%d rep %d token %d: %s alone "
                          "%.9g, in a group of 4 %.9g", quant_type_name(t), n, rep, k, kn, one,
                          got[k]);
        }
    }
    free(wd);
}

START_TEST(test_kquant_dot) {
    QkFixture f;
    qk_read(&f);
    const int ns[] = {256, 512, 2048};
    uint64_t seed = 42;
    for (int t = QT_Q4_K; t <= QT_Q6_K; t++) {
        size_t be, bb;
        quant_type_geometry((uint32_t)t, &be, &bb);
        uint8_t *pool = NULL;
        size_t pool_blocks = 0;
        for (int i = 0; i < f.n; i++)
            if (f.c[i].type == (uint32_t)t) {
                pool = realloc(pool, (pool_blocks + f.c[i].n_elems / be) * bb);
                memcpy(pool + pool_blocks * bb, f.c[i].bytes, f.c[i].n_bytes);
                pool_blocks += f.c[i].n_elems / be;
            }
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            int n = ns[k], nb = n / QK_K;
            for (int rep = 0; rep < 8; rep++) {
                uint8_t *w = rs_xmalloc((size_t)nb * bb + 1); /* odd address: unaligned */
                for (int b = 0; b < nb; b++)
                    memcpy(w + 1 + b * bb, pool + ((b + rep * 3) % pool_blocks) * bb, bb);
                float *x = rs_xmalloc(sizeof(float) * 4 * n);
                for (int i = 0; i < 4 * n; i++)
                    x[i] = gauss(&seed) * (i % 97 == 0 ? 8.0f : 1.0f);
                if (rep == 1) memset(x, 0, sizeof(float) * 64); /* all-zero sub-blocks */
                QkActs a = tu_acts(x, 4, n);
                check_dot(t, w + 1, n, &a, rep);
                free(w);
                free(x);
                tu_acts_free(&a);
            }
        }
        free(pool);
    }
    if (!avx2_family()) fprintf(stderr, "kquant: no AVX2 on this CPU, AVX2 kernels not run\n");
    free(f.buf);
}
END_TEST

Suite *suite_kquant(void) {
    Suite *s = suite_create("kquant");
    TCase *tc = tcase_create("kquant");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_kquant_dequant_fixture);
    tcase_add_test(tc, test_kquant_dot);
    suite_add_tcase(s, tc);
    return s;
}
