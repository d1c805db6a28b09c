/* Row statistics over one row of logits (argmax, top-k, log-sum-exp, softmax) and the draws
 * verification makes from a row: argmax at T=0, exact inverse-CDF sampling of
 * softmax(logits) at T=1. Every sum is accumulated in double, max-shifted, so a row gives
 * the same result on every platform. */
#ifndef ROOTSPEC_LOGITS_H
#define ROOTSPEC_LOGITS_H
#include "rng.h"

/* Index of the largest logit; ties go to the lowest index. */
int row_argmax(const float *logits, int n);
/* Best logit minus the runner-up (n >= 2): how near a tie a greedy choice is. */
double row_top_margin(const float *logits, int n);
/* Top-k indices by descending value, ties by ascending index; k <= n. */
void row_topk(const float *vals, int n, int k, int *idx);
/* log(sum exp(logits)), max-shifted, accumulated in double. */
double row_lse(const float *logits, int n);
/* Softmax probabilities (double precision accumulation) into probs (n). */
void row_softmax(const float *logits, int n, float *probs);
/* One draw from softmax(logits). */
int row_sample(const float *logits, int n, Rng *r);
/* T == 0: argmax; T == 1: sample. */
int row_draw(const float *logits, int n, int temp, Rng *r);

#endif
