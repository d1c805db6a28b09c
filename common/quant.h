/* ggml tensor types as stored in GGUF files, and their dequantization to f32.
 * The block layouts follow ggml (ggml-common.h): Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 blocks of 32 with
 * f16 scales (Q5: the fifth bits of the 32 elements in a u32); the K-quants Q4_K/Q5_K/Q6_K super-blocks of 256 with f16 super-scales and
 * 6-bit (Q4_K, Q5_K) or 8-bit (Q6_K) sub-block scales. */
#ifndef ROOTSPEC_QUANT_H
#define ROOTSPEC_QUANT_H
#include <stddef.h>
#include <stdint.h>

/* ggml type ids (GGMLQuantizationType); only the ones rootspec dequantizes are named. */
enum {
    QT_F32 = 0,
    QT_F16 = 1,
    QT_Q4_0 = 2,
    QT_Q4_1 = 3,
    QT_Q5_0 = 6,
    QT_Q5_1 = 7,
    QT_Q8_0 = 8,
    QT_Q4_K = 12,
    QT_Q5_K = 13,
    QT_Q6_K = 14,
    QT_BF16 = 30,
};

/* Block geometry of any known ggml type id: elements per block and bytes per block.
 * Returns 0 if known, -1 for an unknown id (then the outputs are untouched). */
int quant_type_geometry(uint32_t type, size_t *block_elems, size_t *block_bytes);
/* "Q4_1", "F32", ... or NULL for an unknown id. */
const char *quant_type_name(uint32_t type);
/* 1 if quant_dequantize handles this type (QUANT_SUPPORTED_NAMES). */
int quant_type_supported(uint32_t type);
#define QUANT_SUPPORTED_NAMES "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K"

float quant_f16_to_f32(uint16_t h);
/* The little-endian u32 at p (any alignment): Q5_0 / Q5_1's qh, bit j = element j's fifth
 * bit. */
static inline uint32_t quant_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
float quant_bf16_to_f32(uint16_t h);
/* f32 to f16 / bf16, round to nearest even (F16C's and ggml's rounding; NaN stays NaN). */
uint16_t quant_f32_to_f16(float f);
uint16_t quant_f32_to_bf16(float f);

/* K-quant super-block geometry (QK_K elements; bytes per block). */
#define QK_K 256
#define QK4_K_BYTES 144 /* f16 d, f16 dmin, u8 scales[12], u8 qs[128] */
#define QK5_K_BYTES 176 /* f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 qs[128] */
#define QK6_K_BYTES 210 /* u8 ql[128], u8 qh[64], i8 scales[16], f16 d */

/* Q4_K/Q5_K sub-block j (0..7) 6-bit scale and min from the 12 packed bytes
 * (ggml's get_scale_min_k4). */
static inline void quant_k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Expands n elements (a multiple of the type's block size) of a supported type from src
 * (any alignment, exactly n/block_elems*block_bytes bytes) into dst. */
void quant_dequantize(uint32_t type, const void *src, float *dst, size_t n);

/* ---- the x4 layout: four rows interleaved (CPU kernels; QTensor.packed) ----
 * Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the K-quants' rows can be stored four at a time in one "tile" of
 * exactly their bytes, laid out as the x86 tiles load them: one stream instead of four,
 * each step's scales in one vector and the quants ordered so that the integer products
 * land in the output lanes without a transpose. A tile holds groups of blocks, in order:
 * two blocks b, b + 1 for the Q4/Q5 types (an odd block count's last group has one), one
 * for Q8_0. A group of h blocks holds, field by field in the block's order (4h entries
 * each):
 *   d (and m, Q4_1/Q5_1): the 2-byte fields block-major, [block][row], so a step's scales
 *       are one f16 vector;
 *   qs of Q4_0/Q4_1/Q5_0/Q5_1, lane-major: 4 vectors of 16h bytes; lane L = r + 4i (row
 *       r, the group's block i) is bytes 4L .. 4L + 3 of each, and byte 4L + c of vector
 *       k holds elements 8k + c (low nibble) and 8k + 4 + c (high nibble) of that block;
 *   qh of Q5_0/Q5_1, bit planes of those: 16h bytes, bit v of byte 4L + c the fifth bit
 *       of element 4v + c of lane L's block;
 *   qs of Q8_0, lane-major: 4 vectors of 32 bytes; lane L = r + 4s (row r, half s of the
 *       block), and byte 4L + c of vector k is element 16s + 4k + c.
 * The K-quants' tiles hold super-blocks, one after the other (4 * the block bytes each),
 * whose quants are lane-major as Q4_1's, sub-blocks of 32 taken in pairs (Q6_K: its
 * 16-blocks four at a time): pair p holds the 32-blocks 2p and 2p + 1 of the 4 rows, lane
 * L = r + 4i (block 2p + i), byte 4L + c of vector k = elements 8k + c (low nibble) and
 * 8k + 4 + c (high); vector v (0..7) of a pair is vector v / 2's low or high nibbles. A
 * Q4_K / Q5_K super-block: d [row], dmin [row] (f16), then the 6-bit scales and minimums
 * as 32 bytes of low four bits (scale of (row k % 4, sub-block 2 (k % 16 / 4) + k / 16) in
 * byte k's low nibble, minimum of (row L % 4, sub-block 4 (k / 16) + 2 (L / 4) + k % 2),
 * L = k % 16 / 2, in its high one) and 16 of their top two bits (byte k % 16, bits 0-1 /
 * 2-3 for the scale of byte k < 16 / >= 16, 4-5 / 6-7 for the minimum), Q5_K's fifth bits
 * as bit planes (32 bytes a pair: bit v of byte 4L + c = vector v's), the 4-bit quants
 * (128 bytes a pair). A Q6_K super-block: d [row], the i8 scales (16 bytes a pair:
 * [32-block i][16-block of it][row]), the low four bits (128 bytes a pair), the top two
 * (64 bytes a pair: bits 2k of byte 32a + 4L + c = vector 4a + k's).
 * Block j (super-block j of a K-quant) of row r reads back with quant_x4_block. */
#define QUANT_X4_ROWS 4
/* 1 if `type` has the x4 layout. */
int quant_x4_ok(uint32_t type);
/* Packs 4 rows of `cols` elements (rows[r]: stored row r, cols a multiple of the block) into tile
 * (4 * the row bytes); tile must not overlap the rows. */
void quant_x4_pack(uint32_t type, size_t cols, const uint8_t *const *rows, uint8_t *tile);
/* Block j of row r (< QUANT_X4_ROWS) of a tile, as stored in a plain row, into out (the
 * type's block bytes). */
void quant_x4_block(uint32_t type, size_t cols, const uint8_t *tile, int r, size_t j,
                    uint8_t *out);

#endif
