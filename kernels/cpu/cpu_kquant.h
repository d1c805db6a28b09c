/* Dot kernels of K-quant weight rows (Q4_K, Q5_K, Q6_K: 256-element super-blocks with
 * 6/8-bit sub-block scales) against activations quantized per 32 elements (QkQ8, the same
 * activations the Q4_0/Q4_1/Q8_0 kernels take), shaped as the kernel families' QkDotFn
 * (kernels/cpu/cpu_qmatmul.h): one weight row against 1..QK_GROUP tokens. These are the
 * portable family's; the x86 families take K-quants against per-256 activations in their
 * own tiles (cpu_qk_x86k.inc).
 *
 * Per 32-element sub-block s the sum of weight quants times activation quants is exact in
 * int32 (with the sub-block scale folded in); the f32 part is one multiply-add per
 * sub-block, d * dx_s * isum_s, plus the Q4_K/Q5_K minimum term dmin * m_s * s_s (s_s =
 * dx_s * sum of the activation quants). Each kernel is bitwise independent of the token
 * count. */
#ifndef ROOTSPEC_CPU_KQUANT_H
#define ROOTSPEC_CPU_KQUANT_H
#include "common/quant.h"
#include <stdint.h>

/* out[t] = <row w, xs[t]> for t < nt (1..QK_GROUP); w holds in / QK_K blocks of the type
 * (any alignment), xs[t] in / 32 QkQ8; in a multiple of QK_K. */
void qk_dot_q4_K_scalar(const uint8_t *w, const void *const *xs, int nt, int in, float *out);
void qk_dot_q5_K_scalar(const uint8_t *w, const void *const *xs, int nt, int in, float *out);
void qk_dot_q6_K_scalar(const uint8_t *w, const void *const *xs, int nt, int in, float *out);

#endif
