/* The AVX-512 family's source built with vpdpbusd emulated (tests/qk_avx512_emu.c). Its
 * code is AVX2: only hand it out where the AVX2 family runs. */
#ifndef ROOTSPEC_TESTS_QK_AVX512_EMU_H
#define ROOTSPEC_TESTS_QK_AVX512_EMU_H
#include "kernels/cpu/cpu_qmatmul.h"

extern const QkFamily qk_family_avx512_emu;
/* The AMX family's source with its tile instructions emulated (tests/qk_amx_emu.c). */
extern const QkFamily qk_family_amx_emu;

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
/* vpdpbusd in C (256-bit), for both emulated families; AVX2 code. */
__attribute__((target("avx2"))) __m256i qk_emu_dpbusd(__m256i acc, __m256i a, __m256i b);
#endif

#endif
