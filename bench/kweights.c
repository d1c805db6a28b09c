/* Synthetic weights for the kernel benchmarks (see kweights.h). */
#include "kweights.h"
#include "common/quant.h"
#include "common/util.h"
#include <string.h>

static void put_f16(uint8_t *p, uint16_t h) { p[0] = (uint8_t)h, p[1] = (uint8_t)(h >> 8); }

void kweights_fill(uint32_t type, uint8_t *d, size_t bytes, Rng *r) {
    for (size_t i = 0; i < bytes; i++) d[i] = (uint8_t)rng_next(r);
    size_t be, bb;
    RS_ASSERT(quant_type_geometry(type, &be, &bb) == 0);
    for (size_t o = 0; o + bb <= bytes; o += bb) {
        uint8_t *p = d + o;
        switch (type) {
        case QT_F32:
            for (size_t k = 0; k < bb; k += 4) {
                float v = (float)(rng_uniform(r) - 0.5);
                memcpy(p + k, &v, 4);
            }
            break;
        case QT_F16: put_f16(p, (uint16_t)(0x2000 | (rng_next(r) & 0x83ff))); break;
        case QT_BF16: put_f16(p, (uint16_t)(0x3c00 | (rng_next(r) & 0x807f))); break;
        case QT_Q6_K: put_f16(p + 208, 0x2000); break;
        case QT_Q4_1: case QT_Q5_1: case QT_Q4_K: case QT_Q5_K: put_f16(p + 2, 0x2000); /* fall through */
        default: put_f16(p, 0x2000); break;
        }
    }
}
