/* Row statistics and row draws; see logits.h. */
#include "logits.h"
#include "util.h"
#include <math.h>
#include <stdint.h>
#include <string.h>

/* ---- the sampling law ---- */

int sampling_check(const Sampling *s, RsErr *e) {
    double t = s->temperature;
    if (!(t >= 0) || !isfinite(t))
        return rs_err(e, RS_EINVAL, "temperature %g: need a finite value >= 0", t);
    if (t > SAMPLING_TEMP_MAX)
        return rs_err(e, RS_EINVAL, "temperature %g: at most %g", t, SAMPLING_TEMP_MAX);
    if (t > 0 && t < SAMPLING_TEMP_MIN)
        return rs_err(e, RS_EINVAL, "temperature %g: below %g, which is greedy (0)", t,
                      SAMPLING_TEMP_MIN);
    if (s->top_k < 0) return rs_err(e, RS_EINVAL, "top_k %d: need >= 0 (0: off)", s->top_k);
    if (!(s->top_p >= 0 && s->top_p <= 1))
        return rs_err(e, RS_EINVAL, "top_p %g outside [0, 1] (0 or 1: off)", s->top_p);
    if (!(s->min_p >= 0 && s->min_p <= 1))
        return rs_err(e, RS_EINVAL, "min_p %g outside [0, 1] (0: off)", s->min_p);
    return RS_OK;
}

int sampling_normalize(Sampling *s, RsErr *e) {
    Sampling n = *s;
    if (n.temperature >= 0 && n.temperature < SAMPLING_TEMP_MIN) n.temperature = 0;
    int rc = sampling_check(&n, e);
    if (!rc) *s = n;
    return rc;
}

int sampling_greedy(const Sampling *s) { return s->temperature == 0 || s->top_k == 1; }

static int top_p_on(const Sampling *s) { return s->top_p > 0 && s->top_p < 1; }

int sampling_plain(const Sampling *s) {
    return s->temperature == 1 && s->top_k == 0 && !top_p_on(s) && s->min_p == 0;
}

const char *sampling_str(const Sampling *s, char *buf, size_t n) {
    if (sampling_greedy(s)) {
        snprintf(buf, n, "greedy");
        return buf;
    }
    int k = snprintf(buf, n, "T=%g", s->temperature);
    if (s->top_k > 0 && k >= 0 && (size_t)k < n)
        k += snprintf(buf + k, n - (size_t)k, " top_k=%d", s->top_k);
    if (top_p_on(s) && k >= 0 && (size_t)k < n)
        k += snprintf(buf + k, n - (size_t)k, " top_p=%g", s->top_p);
    if (s->min_p > 0 && k >= 0 && (size_t)k < n)
        snprintf(buf + k, n - (size_t)k, " min_p=%g", s->min_p);
    return buf;
}

double row_stats_logp(const RowStats *st, float logit) {
    RS_ASSERT(!isnan(st->lse));
    if (logit < st->cut) return -INFINITY;
    return (double)logit * st->scale - st->lse;
}

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

/* RowMax by its definition: one pass, branching on every entry. row_max_part gives the
 * same fields from loops the compiler vectorizes, and this where a NaN or a short range
 * makes them no faster. */
static void row_max_scan(const float *row, int lo, int hi, RowMax *m) {
    float a = -INFINITY, b = -INFINITY;
    int ai = -1;
    for (int i = lo; i < hi; i++) {
        float v = row[i];
        if (isnan(v)) { /* no maximum: NaN wins, so the row's check sees it */
            m->max = m->second = v;
            m->argmax = i;
            return;
        }
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

/* Four vectors of four floats a step (GNU C vectors: SSE registers on the baseline). */
typedef float RowLanes __attribute__((vector_size(4 * sizeof(float))));
typedef int RowMask __attribute__((vector_size(4 * sizeof(int))));

static RowLanes lanes_max(RowLanes a, RowLanes v, RowMask *bad) {
    RowMask gt = v > a;
    *bad |= v != v;
    return (RowLanes)(((RowMask)v & gt) | ((RowMask)a & ~gt));
}

/* The largest of row[lo, hi) (-INFINITY when empty), the lanes independent; *nan |= whether
 * a NaN was seen. Equal values may come out as either zero's sign: callers take the bits
 * from the row. */
static float row_lanes_max(const float *row, int lo, int hi, int *nan) {
    const RowLanes low = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    RowLanes m0 = low, m1 = low, m2 = low, m3 = low, v0, v1, v2, v3;
    RowMask bad = {0, 0, 0, 0};
    int i = lo;
    for (; i + 16 <= hi; i += 16) { /* four chains: a max's latency per step, not four */
        memcpy(&v0, row + i, sizeof v0);
        memcpy(&v1, row + i + 4, sizeof v1);
        memcpy(&v2, row + i + 8, sizeof v2);
        memcpy(&v3, row + i + 12, sizeof v3);
        m0 = lanes_max(m0, v0, &bad);
        m1 = lanes_max(m1, v1, &bad);
        m2 = lanes_max(m2, v2, &bad);
        m3 = lanes_max(m3, v3, &bad);
    }
    m0 = lanes_max(lanes_max(m0, m1, &bad), lanes_max(m2, m3, &bad), &bad);
    float r = -INFINITY;
    int any = 0;
    for (int k = 0; k < 4; k++) {
        r = m0[k] > r ? m0[k] : r;
        any |= bad[k];
    }
    for (; i < hi; i++) {
        r = row[i] > r ? row[i] : r;
        any |= row[i] != row[i];
    }
    *nan |= any;
    return r;
}

/* The first i in [lo, hi), other than skip, whose entry equals v (-1: none); sixteen
 * entries a compare until one matches. */
static int row_find(const float *row, int lo, int hi, int skip, float v) {
    const RowLanes w = {v, v, v, v};
    int i = lo;
    for (; i + 16 <= hi; i += 16) {
        RowLanes v0, v1, v2, v3;
        memcpy(&v0, row + i, sizeof v0);
        memcpy(&v1, row + i + 4, sizeof v1);
        memcpy(&v2, row + i + 8, sizeof v2);
        memcpy(&v3, row + i + 12, sizeof v3);
        RowMask eq = (v0 == w) | (v1 == w) | (v2 == w) | (v3 == w);
        if (eq[0] | eq[1] | eq[2] | eq[3]) break;
    }
    for (; i < hi; i++)
        if (row[i] == v && i != skip) return i;
    return -1;
}

void row_max_part(const float *row, int lo, int hi, RowMax *m) {
    int nan = 0;
    float a = row_lanes_max(row, lo, hi, &nan);
    if (nan || hi - lo < 2) { /* the first NaN wins, as the scan has it */
        row_max_scan(row, lo, hi, m);
        return;
    }
    /* as the scan, the first of equal entries: argmax the first maximum, the runner-up the
     * first largest other entry (equal values differ only in a zero's sign: the row's bits) */
    int ai = row_find(row, lo, hi, -1, a);
    float b0 = row_lanes_max(row, lo, ai, &nan), b1 = row_lanes_max(row, ai + 1, hi, &nan);
    float b = b1 > b0 ? b1 : b0;
    int bi = b == 0.0f ? row_find(row, lo, hi, ai, b) : -1;
    m->max = row[ai];
    m->argmax = ai;
    m->second = bi >= 0 ? row[bi] : b;
}

void row_max_merge(RowMax *acc, const RowMax *m) {
    if (m->argmax < 0 || (acc->argmax >= 0 && isnan(acc->max))) return;
    if (acc->argmax < 0 || isnan(m->max)) {
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
    row_chunk_wsums(row, n, mx, 1.0, -INFINITY, c0, c1, csum);
}


void row_chunk_wsums(const float *row, int n, float mx, double scale, float cut, int c0, int c1,
                     double *csum) {
    for (int c = c0; c < c1; c++) {
        int lo = c * ROW_CHUNK, hi = lo + ROW_CHUNK < n ? lo + ROW_CHUNK : n;
        double s = 0.0;
        for (int i = lo; i < hi; i++) s += row_weight(row[i], mx, scale, cut);
        csum[c - c0] = s;
    }
}

/* The inverse-CDF draw at threshold thr over the chunk sums; past the end (rounding), the
 * last entry with a positive weight, as row_sample. */
static int chunk_draw(const float *row, int n, float mx, double scale, float cut,
                      const double *csum, double thr) {
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
            acc += row_weight(row[i], mx, scale, cut);
            if (thr < acc) return i;
        }
        last_c = c; /* rounding within the chunk: fall through to its last positive entry */
        break;
    }
    int lo = last_c * ROW_CHUNK, hi = lo + ROW_CHUNK < n ? lo + ROW_CHUNK : n, last = lo;
    for (int i = lo; i < hi; i++)
        if (row_weight(row[i], mx, scale, cut) > 0) last = i;
    return last;
}

/* ---- the sampling law's cut: a radix select over order-preserving keys ---- */


/* What a radix select measures: entries at or above `floor` (a key), counted or weighed. */
typedef struct {
    const float *row;
    int n;
    float mx;
    double scale;
    uint32_t floor;
    int by_mass;
} CutQuery;

/* The largest key K such that the entries with keys >= K (and >= q->floor) count or weigh
 * at least `need` (which the whole set reaches): four passes, one 8-bit digit each, from
 * the top. */
static uint32_t radix_select(const CutQuery *q, double need) {
    uint32_t prefix = 0, mask = 0;
    uint64_t above = 0; /* of the entries above the digit being chosen */
    for (int shift = 24; shift >= 0; shift -= 8) {
        uint64_t hist[256] = {0};
        for (int i = 0; i < q->n; i++) {
            uint32_t k = row_logit_key(q->row[i]);
            if (k < q->floor || (k & mask) != prefix) continue;
            uint64_t w = q->by_mass ? row_fixed_weight(q->row[i], q->mx, q->scale) : 1;
            hist[(k >> shift) & 255] += w;
        }
        int b = 255;
        for (; b > 0 && !((double)(above + hist[b]) >= need); b--) above += hist[b];
        prefix |= (uint32_t)b << shift;
        mask |= 0xffu << shift;
    }
    return prefix;
}

float row_cut(const float *row, int n, float mx, const Sampling *s) {
    RS_ASSERT(!sampling_greedy(s));
    CutQuery q = {row, n, mx, 1.0 / s->temperature, 0, 0};
    uint32_t cut = 0; /* below every key */
    if (s->top_k > 0 && s->top_k < n) cut = q.floor = radix_select(&q, (double)s->top_k);
    if (top_p_on(s)) {
        uint64_t z = 0;
        for (int i = 0; i < n; i++)
            if (row_logit_key(row[i]) >= q.floor) z += row_fixed_weight(row[i], mx, q.scale);
        q.by_mass = 1;
        uint32_t k = radix_select(&q, s->top_p * (double)z);
        if (k > cut) cut = k;
    }
    if (s->min_p > 0) {
        double lmin = log(s->min_p);
        uint32_t k = row_logit_key(mx);
        for (int i = 0; i < n; i++) {
            uint32_t ki = row_logit_key(row[i]);
            if (ki < k && ((double)row[i] - mx) * q.scale >= lmin) k = ki;
        }
        if (k > cut) cut = k;
    }
    return cut == 0 ? -INFINITY : row_key_logit(cut);
}

void row_stats_finish(const float *row, int n, const RowMax *m, const double *csum,
                      const Sampling *s, float cut, double u, RowStats *out) {
    int greedy = sampling_greedy(s);
    out->argmax = m->argmax;
    out->max = m->max;
    out->second = m->second;
    out->cut = cut;
    out->scale = greedy ? NAN : 1.0 / s->temperature;
    out->lse = NAN;
    out->draw = greedy ? m->argmax : -1;
    if (greedy || !isfinite(m->max)) return; /* no law: lse stays NAN (backend_rows_stats) */
    double total = 0.0;
    for (int c = 0; c < row_chunks(n); c++) total += csum[c];
    out->lse = (double)m->max * out->scale + log(total);
    if (u >= 0) out->draw = chunk_draw(row, n, m->max, out->scale, cut, csum, u * total);
}

void row_stats(const float *row, int n, const Sampling *s, double u, double *csum,
               RowStats *out) {
    RS_ASSERT(n > 0);
    RowMax m;
    row_max_part(row, 0, n, &m);
    float cut = -INFINITY;
    if (!sampling_greedy(s) && isfinite(m.max)) {
        cut = row_cut(row, n, m.max, s);
        row_chunk_wsums(row, n, m.max, 1.0 / s->temperature, cut, 0, row_chunks(n), csum);
    }
    row_stats_finish(row, n, &m, csum, s, cut, u, out);
}
