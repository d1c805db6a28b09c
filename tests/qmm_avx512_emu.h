/* The AVX-512 family's source built with vpdpbusd emulated (tests/qmm_avx512_emu.c). Its
 * code is AVX2: only hand it out where the AVX2 family runs. */
#ifndef ROOTSPEC_TESTS_QMM_AVX512_EMU_H
#define ROOTSPEC_TESTS_QMM_AVX512_EMU_H
#include "kernels/cpu_qmatmul.h"

extern const QkFamily qk_family_avx512_emu;

#endif
