/* Row statistics and row draws; see logits.h. */
#include "logits.h"
#include "util.h"
#include <math.h>

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
