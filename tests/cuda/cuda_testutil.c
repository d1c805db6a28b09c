/* CUDA test helpers; see cuda_testutil.h. */
#include "cuda_testutil.h"
#include <cuda_runtime_api.h>
#include <math.h>
#include "common/logits.h"
#include "kernels/backend.h"
#include "tests/testutil.h"
#include <limits.h>
#include <string.h>
#include <unistd.h>

int cu_n_skipped = 0;
static int probed = 0, have = 0;
static char reason[256];

static void probe(void) {
    if (probed) return;
    probed = 1;
    int n = 0;
    cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess) {
        snprintf(reason, sizeof reason, "cudaGetDeviceCount: %s", cudaGetErrorString(rc));
        cudaGetLastError();
        return;
    }
    if (n == 0) {
        snprintf(reason, sizeof reason, "cudaGetDeviceCount found 0 devices");
        return;
    }
    have = 1;
}

int cu_have_device(void) {
    probe();
    return have;
}

const char *cu_no_device_reason(void) {
    probe();
    return have ? "" : reason;
}

const char *cu_fixture(const char *rel) {
    static char buf[4][PATH_MAX];
    static int k = 0;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "tests/fixtures/%s", rel);
    if (access(buf[k], R_OK) == 0) return buf[k];
    char exe[PATH_MAX - 64];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return NULL;
    exe[len] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash) return NULL;
    *slash = 0;
    snprintf(buf[k], sizeof buf[k], "%s/tests/fixtures/%s", exe, rel);
    return access(buf[k], R_OK) == 0 ? buf[k] : NULL;
}

int cu_bits_report(const char *label, const float *got, const float *want, int rows, int cols) {
    int bad_rows = 0, fr = -1, fc = -1, mr = -1, mc = -1;
    double worst = -1.0;
    for (int r = 0; r < rows; r++) {
        const float *g = got + (size_t)r * cols, *w = want + (size_t)r * cols;
        if (!memcmp(g, w, sizeof(float) * cols)) continue;
        bad_rows++;
        for (int c = 0; c < cols; c++) {
            if (!memcmp(&g[c], &w[c], sizeof(float))) continue;
            if (fr < 0) fr = r, fc = c;
            double d = fabs((double)g[c] - (double)w[c]);
            if (d != d) d = INFINITY; /* a NaN on either side */
            if (d > worst) worst = d, mr = r, mc = c;
        }
    }
    if (!bad_rows) return 0;
    printf("MISMATCH %s: %d of %d rows differ; first at row %d col %d (got %.9g, want %.9g); "
           "largest |difference| %.3g at row %d col %d\n", label, bad_rows, rows, fr, fc,
           got[(size_t)fr * cols + fc], want[(size_t)fr * cols + fc], worst, mr, mc);
    fflush(stdout);
    return bad_rows;
}

float cu_round_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t lsb = (u >> 16) & 1u;
    u = (u + 0x7fffu + lsb) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

float cu_randf(uint64_t *s, float lo, float hi) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    float u = (float)(*s >> 40) * (1.0f / 16777216.0f);
    return lo + (hi - lo) * u;
}

/* The environment's switches (ROOTSPEC_CUDA_GRAPHS=0, ...), read once, as a program does. */
static BackendSwitches env_switches(void) {
    static int read;
    static BackendSwitches sw;
    if (!read) {
        const char *kernels = NULL;
        RsErr e = {0};
        ck_assert_msg(cli_backend_env(&kernels, &sw, &e) == RS_OK, "%s", e.msg);
        read = 1;
    }
    return sw;
}

Backend *cu_backend_make(const BackendOps *ops, const Model *m, int cap, int batch, int pend) {
    BackendParams bp = {.kv_capacity = cap, .max_batch = batch, .max_pending = pend, .threads = 1,
                        .sw = env_switches()};
    Backend *b = NULL;
    RsErr e = {0};
    bp.cpu_kernels = ops == &cpu_backend_ops ? "ref" : NULL;
    /* The CPU reference is the f32 path: the fast CPU families multiply Q4/Q8 weights by
     * activations quantized to 8 bits, a rounding of their own that is not the CUDA
     * backend's (bf16 weights and activations). */
    int cpu = ops == &cpu_backend_ops;
    int rc = ops ? backend_create(ops, m, &bp, &b, &e) : RS_EINVAL;
    ck_assert_msg(rc == RS_OK, "%s create: %s", !ops ? "cuda(NULL)" : cpu ? "cpu" : "cuda", e.msg);
    return b;
}

int cu_compare_logits(const char *label, const float *got, const float *ref, int rows, int vocab,
                      float *worst) {
    float mx = 0, scale = 0;
    for (size_t i = 0; i < (size_t)rows * vocab; i++)
        if (fabsf(ref[i]) > scale) scale = fabsf(ref[i]);
    float atol = CU_TOL_FRAC * scale;
    int bad = tu_compare(label, got, ref, (size_t)rows * vocab, atol, 0.0f, &mx);
    if (mx > *worst) *worst = mx;
    for (int r = 0; r < rows; r++) {
        const float *g = got + (size_t)r * vocab, *f = ref + (size_t)r * vocab;
        int ag = row_argmax(g, vocab), af = row_argmax(f, vocab);
        if (ag != af && f[af] - f[ag] > atol) {
            fprintf(stderr, "%s row %d: top-1 %d (ref logit %.5f) vs reference %d (%.5f)\n",
                    label, r, ag, f[ag], af, f[af]);
            bad++;
        }
    }
    fprintf(stderr, "%s: %d rows, max |d| %.4g, tolerance %.4g (%.2f * max|ref| %.4g)\n", label,
            rows, mx, atol, CU_TOL_FRAC, scale);
    return bad;
}

int cu_prefill_decode_parity(const char *label, Backend *cpu, Backend *gpu, const int *tok,
                             int n, int steps, int *agree, float *worst) {
    RS_ASSERT(n > 0 && n <= 64);
    int V = backend_model(cpu)->cfg.vocab_size, pos[64], rows[64], bad, ok = 0;
    for (int i = 0; i < n; i++) pos[i] = rows[i] = i;
    float *a = malloc(sizeof(float) * (size_t)n * V), *g = malloc(sizeof(float) * (size_t)n * V);
    RsErr e = {0};
    char lab[160];
    ck_assert_int_eq(backend_forward(cpu, tok, pos, n, NULL, rows, n, a, &e), RS_OK);
    ck_assert_msg(backend_forward(gpu, tok, pos, n, NULL, rows, n, g, &e) == RS_OK, "%s", e.msg);
    snprintf(lab, sizeof lab, "%s prefill", label);
    bad = cu_compare_logits(lab, g, a, n, V, worst);
    ck_assert_int_eq(backend_kv_commit(cpu, rows, n, &e), RS_OK);
    ck_assert_int_eq(backend_kv_commit(gpu, rows, n, &e), RS_OK);
    int next = row_argmax(a + (size_t)(n - 1) * V, V);
    snprintf(lab, sizeof lab, "%s decode", label);
    for (int s = 0; s < steps; s++) {
        int p = n + s, zero = 0;
        ck_assert_int_eq(backend_forward(cpu, &next, &p, 1, NULL, &zero, 1, a, &e), RS_OK);
        ck_assert_int_eq(backend_forward(gpu, &next, &p, 1, NULL, &zero, 1, g, &e), RS_OK);
        bad += cu_compare_logits(lab, g, a, 1, V, worst);
        ok += row_argmax(g, V) == row_argmax(a, V);
        next = row_argmax(a, V);
        ck_assert_int_eq(backend_kv_commit(cpu, &zero, 1, &e), RS_OK);
        ck_assert_int_eq(backend_kv_commit(gpu, &zero, 1, &e), RS_OK);
    }
    if (agree) *agree = ok;
    free(a), free(g);
    return bad;
}
