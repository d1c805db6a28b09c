/* ggml tensor types as stored in GGUF files, and their dequantization to f32.
 * rootspec computes in f32, so quantized weights are expanded once at load. The block
 * layouts follow ggml (ggml-common.h): Q4_0/Q4_1/Q8_0 blocks of 32 with f16 scales. */
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
    QT_Q8_0 = 8,
    QT_BF16 = 30,
};

/* Block geometry of any known ggml type id: elements per block and bytes per block.
 * Returns 0 if known, -1 for an unknown id (then the outputs are untouched). */
int quant_type_geometry(uint32_t type, size_t *block_elems, size_t *block_bytes);
/* "Q4_1", "F32", ... or NULL for an unknown id. */
const char *quant_type_name(uint32_t type);
/* 1 if quant_dequantize handles this type (F32, F16, BF16, Q8_0, Q4_0, Q4_1). */
int quant_type_supported(uint32_t type);

float quant_f16_to_f32(uint16_t h);
float quant_bf16_to_f32(uint16_t h);

/* Expands n elements (a multiple of the type's block size) of a supported type from src
 * (any alignment, exactly n/block_elems*block_bytes bytes) into dst. */
void quant_dequantize(uint32_t type, const void *src, float *dst, size_t n);

#endif
