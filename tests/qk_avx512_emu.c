/* The AVX-512 kernel family's code (kernels/cpu/x86/cpu_qk_x86.inc with QK_VNNI) built for AVX2
 * machines with VNNI's one instruction, vpdpbusd, emulated in C: no AVX-512 machine was at
 * hand, so the tests check this build of the family's own source (its dpbusd block sums
 * in the Q8_0 and block-pair tiles) against double sums and bitwise against the AVX2
 * family. What it cannot check is the compiler's AVX-512 code generation. */
#include "kernels/cpu/cpu_qmatmul.h"
#include "common/quant.h"
#include "qk_avx512_emu.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* vpdpbusd (256-bit): each i32 lane of acc plus the four products of a's unsigned bytes
 * and b's signed bytes in it, in i32 without saturation (Intel SDM, VPDPBUSD). Also the
 * AMX family's emulation's (qk_amx_emu.c). */
__attribute__((no_sanitize_address, no_sanitize_undefined)) __m256i
qk_emu_dpbusd(__m256i acc, __m256i a, __m256i b) {
    uint8_t ua[32];
    int8_t sb[32];
    int32_t r[8];
    memcpy(ua, &a, 32);
    memcpy(sb, &b, 32);
    memcpy(r, &acc, 32);
    for (int i = 0; i < 8; i++)
        for (int k = 0; k < 4; k++) r[i] += (int32_t)ua[4 * i + k] * (int32_t)sb[4 * i + k];
    __m256i out;
    memcpy(&out, r, 32);
    return out;
}
#undef _mm256_dpbusd_epi32 /* GCC's own is a macro */
#define _mm256_dpbusd_epi32 qk_emu_dpbusd
#define QK_FAMILY_VAR qk_family_avx512_emu
#define QK_FAMILY_NAME "avx512-emu"
#define QK_VNNI 1
#define QK_REGS32 1 /* the real family's wider attention steps (spilled here, same bits) */
#include "kernels/cpu/x86/cpu_qk_x86.inc"
#pragma GCC pop_options
#else
const QkFamily qk_family_avx512_emu = {"avx512-emu", NULL, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
#endif
