/* Seeded generator and row samplers; see rng.h. */
#include "rng.h"
#include "util.h"
#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void rng_seed(Rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

void rng_seed_mix(Rng *r, uint64_t seed, uint64_t a, uint64_t b) {
    uint64_t x = seed;
    uint64_t h = splitmix64(&x);
    x = h ^ (a * 0xd1342543de82ef95ull);
    h = splitmix64(&x);
    x = h ^ (b * 0xaf251af3b0f025b5ull);
    rng_seed(r, splitmix64(&x));
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t rng_next(Rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double rng_uniform(Rng *r) { return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0); }

int row_argmax(const float *logits, int n) {
    RS_ASSERT(n > 0);
    int best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

double row_top_margin(const float *logits, int n) {
    RS_ASSERT(n >= 2);
    float a = logits[0] >= logits[1] ? logits[0] : logits[1];
    float b = logits[0] >= logits[1] ? logits[1] : logits[0];
    for (int i = 2; i < n; i++) {
        if (logits[i] > a) b = a, a = logits[i];
        else if (logits[i] > b) b = logits[i];
    }
    return (double)a - (double)b;
}

void row_softmax(const float *logits, int n, float *probs) {
    float mx = logits[row_argmax(logits, n)];
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += exp((double)logits[i] - mx);
    for (int i = 0; i < n; i++) probs[i] = (float)(exp((double)logits[i] - mx) / sum);
}

double row_lse(const float *logits, int n) {
    float mx = logits[row_argmax(logits, n)];
    double s = 0;
    for (int i = 0; i < n; i++) s += exp((double)logits[i] - mx);
    return mx + log(s);
}

int row_sample(const float *logits, int n, Rng *r) {
    float mx = logits[row_argmax(logits, n)];
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += exp((double)logits[i] - mx);
    double u = rng_uniform(r) * sum, acc = 0.0;
    int last = 0;
    for (int i = 0; i < n; i++) {
        double p = exp((double)logits[i] - mx);
        if (p > 0) last = i;
        acc += p;
        if (u < acc) return i;
    }
    return last; /* rounding: u landed past the final partial sum */
}

int row_draw(const float *logits, int n, int temp, Rng *r) {
    return temp == 0 ? row_argmax(logits, n) : row_sample(logits, n, r);
}

void row_topk(const float *vals, int n, int k, int *idx) {
    RS_ASSERT(k <= n);
    /* k is small (10): insertion into a sorted list of k. */
    int m = 0;
    for (int i = 0; i < n; i++) {
        float v = vals[i];
        if (m == k && !(v > vals[idx[k - 1]])) continue;
        int j = m < k ? m++ : k - 1;
        while (j > 0 && v > vals[idx[j - 1]]) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = i;
    }
}
