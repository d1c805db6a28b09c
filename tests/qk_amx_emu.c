/* The AMX kernel family's code (kernels/cpu/x86/cpu_qk_x86.inc with QK_AMX, cpu_qk_amx.inc) built
 * for AVX2 machines with its AMX tile instructions and its one VNNI instruction emulated in
 * C: no AMX machine was at hand, so the tests run this build of the family's own source
 * through every cpu_kernels check and compare it bitwise with the AVX2 family. What it
 * cannot check is the hardware: the tile configuration's acceptance, the permission
 * request, the compiler's AVX-512 code. */
#include "kernels/cpu/cpu_qmatmul.h"
#include "common/quant.h"
#include "qk_avx512_emu.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define EMU_INLINE static inline __attribute__((always_inline, no_sanitize_address, no_sanitize_undefined))

#undef _mm256_dpbusd_epi32 /* GCC's own is a macro */
#define _mm256_dpbusd_epi32 qk_emu_dpbusd

/* Tile registers as the SDM describes them: up to 16 rows of up to 64 bytes, shaped by the
 * last LDTILECFG (palette 1: rows[t], colsb[t]). */
static __thread struct {
    int rows, colsb;
    uint8_t b[16][64];
} emu_tile[8];

EMU_INLINE void emu_config(const void *cfg) {
    const uint8_t *c = cfg;
    for (int t = 0; t < 8; t++) {
        emu_tile[t].colsb = c[16 + 2 * t] | c[17 + 2 * t] << 8;
        emu_tile[t].rows = c[48 + t];
        memset(emu_tile[t].b, 0, sizeof emu_tile[t].b);
    }
}
EMU_INLINE void emu_load(int t, const void *p, long stride) {
    for (int r = 0; r < emu_tile[t].rows; r++)
        memcpy(emu_tile[t].b[r], (const uint8_t *)p + r * stride, (size_t)emu_tile[t].colsb);
}
EMU_INLINE void emu_store(int t, void *p, long stride) {
    for (int r = 0; r < emu_tile[t].rows; r++)
        memcpy((uint8_t *)p + r * stride, emu_tile[t].b[r], (size_t)emu_tile[t].colsb);
}
/* TDPBxxD: C[m][n] (i32) += sum over k of A[m][k] * B[k / 4][4n + k % 4], K = A's colsb;
 * sa / sb: A's / B's bytes signed. */
EMU_INLINE void emu_dp(int c, int a, int b, int sa, int sb) {
    int K = emu_tile[a].colsb;
    for (int m = 0; m < emu_tile[a].rows; m++)
        for (int n = 0; n < emu_tile[b].colsb / 4; n++) {
            int32_t v;
            memcpy(&v, &emu_tile[c].b[m][4 * n], 4);
            for (int k = 0; k < K; k++) {
                int x = sa ? (int8_t)emu_tile[a].b[m][k] : emu_tile[a].b[m][k];
                int y = sb ? (int8_t)emu_tile[b].b[k / 4][4 * n + k % 4] : emu_tile[b].b[k / 4][4 * n + k % 4];
                v += x * y;
            }
            memcpy(&emu_tile[c].b[m][4 * n], &v, 4);
        }
}
#define QK_AMX_EMU 1
#define AMX_CONFIG(cfg) emu_config(cfg)
#define AMX_RELEASE() ((void)0)
#ifndef QK_AMX_NULL
#define AMX_LOAD(t, p, stride) emu_load(t, p, stride)
#define AMX_ZERO(t) memset(emu_tile[t].b, 0, sizeof emu_tile[t].b)
#define AMX_STORE(t, p, stride) emu_store(t, p, stride)
#define AMX_DPBSSD(c, a, b) emu_dp(c, a, b, 1, 1)
#define AMX_DPBSUD(c, a, b) emu_dp(c, a, b, 1, 0)
#else /* tests/amx_overhead.c: tile instructions cost nothing and compute nothing; the
       * buffers they would read and write are still built and read */
#define AMX_LOAD(t, p, stride) __asm__ __volatile__("" ::"r"(p) : "memory")
#define AMX_ZERO(t) ((void)0)
#define AMX_STORE(t, p, stride) __asm__ __volatile__("" ::"r"(p) : "memory")
#define AMX_DPBSSD(c, a, b) __asm__ __volatile__("" ::: "memory")
#define AMX_DPBSUD(c, a, b) __asm__ __volatile__("" ::: "memory")
#endif

#define QK_FAMILY_VAR qk_family_amx_emu
#define QK_FAMILY_NAME "amx-emu"
#define QK_VNNI 1
#define QK_REGS32 1 /* the real family's wider attention steps (spilled here, same bits) */
#define QK_AMX 1
#include "kernels/cpu/x86/cpu_qk_x86.inc"
#pragma GCC pop_options
#else
const QkFamily qk_family_amx_emu = {"amx-emu", NULL, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
#endif
