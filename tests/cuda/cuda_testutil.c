/* CUDA test helpers; see cuda_testutil.h. */
#include "cuda_testutil.h"
#include <cuda_runtime_api.h>
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
