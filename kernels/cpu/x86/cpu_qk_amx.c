/* AMX kernel family (see cpu_qmatmul.h): the AVX-512 family's kernels (cpu_qk_x86.inc)
 * with AMX-INT8 tile products for groups of more than QK_GROUP tokens of every integer
 * type (cpu_qk_amx.inc), giving the AVX-512 family's bits. Written on a machine without
 * AMX: selected by cpuid and the kernel's tile permission only; the tests run this source
 * with the tile instructions emulated (tests/qk_amx_emu.c). */
#include "kernels/cpu/cpu_qmatmul.h"
#include "common/quant.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-int8")
#define QK_FAMILY_VAR qk_family_amx
#define QK_FAMILY_NAME "amx"
#define QK_VNNI 1
#define QK_REGS32 1 /* AVX-512 VL: 32 vector registers */
#define QK_ZMM 1    /* 512-bit registers (the emulated builds leave them out) */
/* the avx512 family's weight prefetch (cpu_qk_avx512.c says why) */
#define QK_PF 8192
#define QK_PF_HINT _MM_HINT_T1
#define QK_AMX 1
#include "cpu_qk_x86.inc"
#pragma GCC pop_options
#else
const QkFamily qk_family_amx = {"amx", NULL, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
#endif
