/* AVX2+FMA+F16C kernel family (see cpu_qmatmul.h; kernels in cpu_qk_x86.inc). Compiled
 * for these extensions through a target pragma (the build stays -march=x86-64-v2);
 * qk_family_pick only hands it out when cpuid reports them. */
#include "kernels/cpu/cpu_qmatmul.h"
#include "common/quant.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define QK_FAMILY_VAR qk_family_avx2
#define QK_FAMILY_NAME "avx2"
#include "cpu_qk_x86.inc"
#pragma GCC pop_options
#else /* not x86-64: the family exists but qk_family_pick never selects it */
const QkFamily qk_family_avx2 = {"avx2", NULL, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
#endif
