/* AVX-512 kernel family (see cpu_qmatmul.h; kernels in cpu_qmm_x86.inc): the AVX2 kernels
 * recompiled with AVX-512 F/BW/VL enabled (the compiler may use the extra registers) and
 * VNNI's dpbusd for the integer block sums. UNVERIFIED: written on a machine without
 * AVX-512; it is compiled everywhere and selected by cpuid only. Tests compare it with the
 * scalar family when it runs (ROOTSPEC_CPU_KERNELS=avx512). */
#include "cpu_qmatmul.h"
#include "common/quant.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#define QK_FAMILY_VAR qk_family_avx512
#define QK_FAMILY_NAME "avx512"
#define QK_VNNI 1
#include "cpu_qmm_x86.inc"
#pragma GCC pop_options
#else
const QkFamily qk_family_avx512 = {"avx512", NULL, 0, NULL, NULL};
#endif
