/* AVX-512 kernel family (see cpu_qmatmul.h; kernels in cpu_qk_x86.inc): the AVX2 kernels
 * recompiled with AVX-512 F/BW/VL enabled (the compiler may use the extra registers) and
 * VNNI's dpbusd for the integer block sums (Q8_0, the block-pair tiles, the K-quant x4
 * tiles). The tests run it natively where the CPU has it, and everywhere with AVX2 they run
 * this same source with vpdpbusd emulated (tests/qk_avx512_emu.c), which must give the
 * AVX2 family's bits. */
#include "kernels/cpu/cpu_qmatmul.h"
#include "common/quant.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#define QK_FAMILY_VAR qk_family_avx512
#define QK_FAMILY_NAME "avx512"
#define QK_VNNI 1
#define QK_REGS32 1 /* AVX-512 VL: 32 vector registers */
#define QK_ZMM 1    /* 512-bit registers (the emulated builds leave them out) */
/* Weights prefetched 8 KB ahead into L2 rather than the AVX2 default of 4 KB into L1: the
 * weights are read once, so L1 needs them only when the L1 prefetchers bring them, and the
 * one-row pass measured faster this way (docs/PERF.md, the avx512 family natively). */
#define QK_PF 8192
#define QK_PF_HINT _MM_HINT_T1
/* Groups of more tokens through cpu_qk_amx.inc's tile products, computed in 512-bit VNNI
 * registers (QK_VTILE): a block's products for 16 rows a vpdpbusd, 16 tokens a load of the
 * weights. */
#define QK_AMX 1
#define QK_VTILE 1
/* Where the tile products win over the register tiles (docs/PERF.md, tile products from
 * five tokens): Q4_0, Q4_1 and Q8_0 from 5 tokens, Q5_0 and Q5_1 (kinds 2-3) from 9, the
 * K-quants (kinds 4-6) from 12; below, the register tiles, 4 tokens a call. */
#define QK_AMX_MIN(kind) ((kind) >= 4 && (kind) <= 6 ? 12 : (kind) == 2 || (kind) == 3 ? 9 : 5)
#include "cpu_qk_x86.inc"
#pragma GCC pop_options
#else
const QkFamily qk_family_avx512 = {"avx512", NULL, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
#endif
