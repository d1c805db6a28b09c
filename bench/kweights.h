/* Synthetic weights for the kernel benchmarks (rootspec-kbench, tests/amx_overhead.c):
 * random bytes whose scale fields are set so that no NaN or denormal slows a kernel. */
#ifndef ROOTSPEC_KWEIGHTS_H
#define ROOTSPEC_KWEIGHTS_H
#include "common/rng.h"
#include <stddef.h>
#include <stdint.h>

/* Fills `bytes` bytes (whole blocks of `type`) at d: random quants, every f16 scale field
 * ~0.01 (2^-7), float types small values. Aborts on a type without a geometry. */
void kweights_fill(uint32_t type, uint8_t *d, size_t bytes, Rng *r);

#endif
