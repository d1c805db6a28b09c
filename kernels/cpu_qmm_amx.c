/* AMX kernel family (see cpu_qmatmul.h): the AVX-512 family's kernels (cpu_qmm_x86.inc)
 * with AMX-INT8 tile products for groups of more than QK_GROUP tokens of every integer
 * type (cpu_qmm_amx.inc), giving the AVX-512 family's bits. Written on a machine without
 * AMX: selected by cpuid and the kernel's tile permission only; the tests run this source
 * with the tile instructions emulated (tests/qmm_amx_emu.c). */
#include "cpu_qmatmul.h"
#include "common/quant.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-int8")
#define QK_FAMILY_VAR qk_family_amx
#define QK_FAMILY_NAME "amx"
#define QK_VNNI 1
#define QK_REGS32 1 /* AVX-512 VL: 32 vector registers */
/* Weights prefetched 8 KB ahead into L2: on an AMD EPYC Zen 4 (AVX-512, no AMX) the
 * one-row pass took 4.4-4.6 ms against 5.1-5.4 with the AVX2 default of 4 KB into L1 (best
 * of 300 passes each, the settings alternating pass by pass in one process; 6 KB / 12 KB /
 * 16 KB into L2 and no prefetch in between); the weights are read once, so L1 needs them
 * only when the L1 prefetchers bring them. */
#define QK_PF 8192
#define QK_PF_HINT _MM_HINT_T1
#define QK_AMX 1
#include "cpu_qmm_x86.inc"
#pragma GCC pop_options
#else
const QkFamily qk_family_amx = {"amx", NULL, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
#endif
