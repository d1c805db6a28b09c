/* Seeded random generator (xoshiro256**, seeded by splitmix64) and the row samplers
 * used by verification: argmax for T=0, exact inverse-CDF sampling of softmax(logits)
 * for T=1. Deterministic across platforms for a given seed. */
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

/* Index of the largest logit; ties go to the lowest index. */
int row_argmax(const float *logits, int n);
/* Best logit minus the runner-up (n >= 2): how near a tie a greedy choice is. */
double row_top_margin(const float *logits, int n);
/* Softmax probabilities (double precision accumulation) into probs (n). */
void row_softmax(const float *logits, int n, float *probs);
/* log(sum exp(logits)), max-shifted, accumulated in double. */
double row_lse(const float *logits, int n);
/* One draw from softmax(logits). */
int row_sample(const float *logits, int n, Rng *r);
/* T == 0: argmax; T == 1: sample. */
int row_draw(const float *logits, int n, int temp, Rng *r);
/* Top-k indices by descending value, ties by ascending index; k <= n. */
void row_topk(const float *vals, int n, int k, int *idx);

#endif
