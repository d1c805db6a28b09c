/* Seeded random generator (xoshiro256**, seeded by splitmix64); deterministic across
 * platforms for a given seed. The draws from a row of logits are in logits.h. */
#ifndef ROOTSPEC_RNG_H
#define ROOTSPEC_RNG_H
#include <stdint.h>

typedef struct {
    uint64_t s[4];
} Rng;

void rng_seed(Rng *r, uint64_t seed);
/* Derives a stream from (seed, prompt id, decoder tag, ...) so runs never share draws. */
void rng_seed_mix(Rng *r, uint64_t seed, uint64_t a, uint64_t b);
uint64_t rng_next(Rng *r);
/* Uniform double in [0, 1). */
double rng_uniform(Rng *r);

#endif
