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

/* ---- fused row reductions (canonical order: see logits.h) ---- */

void row_max_part(const float *row, int lo, int hi, RowMax *m) {
    float a = -INFINITY, b = -INFINITY;
    int ai = -1;
    for (int i = lo; i < hi; i++) {
        float v = row[i];
        if (ai < 0 || v > a) {
            b = a;
            a = v;
            ai = i;
        } else if (v > b) {
            b = v;
        }
    }
    m->max = a;
    m->second = b;
    m->argmax = ai;
}

void row_max_merge(RowMax *acc, const RowMax *m) {
    if (m->argmax < 0) return;
    if (acc->argmax < 0) {
        *acc = *m;
        return;
    }
    /* Top two of {acc->max, acc->second, m->max, m->second} (second <= max in each). */
    float lo = acc->max < m->max ? acc->max : m->max;
    float sec = acc->second > m->second ? acc->second : m->second;
    acc->second = lo > sec ? lo : sec;
    if (m->max > acc->max || (m->max == acc->max && m->argmax < acc->argmax)) {
        acc->max = m->max;
        acc->argmax = m->argmax;
    }
}

void row_chunk_sums(const float *row, int n, float mx, int c0, int c1, double *csum) {
    for (int c = c0; c < c1; c++) {
        int lo = c * ROW_CHUNK, hi = lo + ROW_CHUNK < n ? lo + ROW_CHUNK : n;
        double s = 0.0;
        for (int i = lo; i < hi; i++) s += exp((double)row[i] - mx);
        csum[c - c0] = s;
    }
}

/* The inverse-CDF draw at threshold thr over the chunk sums; past the end (rounding), the
 * last entry with a positive weight, as row_sample. */
static int chunk_draw(const float *row, int n, float mx, const double *csum, double thr) {
    int nc = row_chunks(n), last_c = 0;
    double acc = 0.0;
    for (int c = 0; c < nc; c++) {
        if (csum[c] > 0) last_c = c;
        if (!(thr < acc + csum[c])) {
            acc += csum[c];
            continue;
        }
        int lo = c * ROW_CHUNK, hi = lo + ROW_CHUNK < n ? lo + ROW_CHUNK : n;
        for (int i = lo; i < hi; i++) {
            acc += exp((double)row[i] - mx);
            if (thr < acc) return i;
        }
        last_c = c; /* rounding within the chunk: fall through to its last positive entry */
        break;
    }
    int lo = last_c * ROW_CHUNK, hi = lo + ROW_CHUNK < n ? lo + ROW_CHUNK : n, last = lo;
    for (int i = lo; i < hi; i++)
        if (exp((double)row[i] - mx) > 0) last = i;
    return last;
}

void row_stats_finish(const float *row, int n, const RowMax *m, const double *csum, int temp,
                      double u, RowStats *out) {
    out->argmax = m->argmax;
    out->max = m->max;
    out->second = m->second;
    out->lse = NAN;
    out->draw = temp == 0 ? m->argmax : -1;
    if (temp == 0) return;
    double total = 0.0;
    for (int c = 0; c < row_chunks(n); c++) total += csum[c];
    out->lse = (double)m->max + log(total);
    if (u >= 0) out->draw = chunk_draw(row, n, m->max, csum, u * total);
}

void row_stats(const float *row, int n, int temp, double u, double *csum, RowStats *out) {
    RS_ASSERT(n > 0);
    RowMax m;
    row_max_part(row, 0, n, &m);
    if (temp) row_chunk_sums(row, n, m.max, 0, row_chunks(n), csum);
    row_stats_finish(row, n, &m, csum, temp, u, out);
}
