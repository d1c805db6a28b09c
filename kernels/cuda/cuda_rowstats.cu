/* Row queries on the device; see cuda_rowstats.h. One block per row: a strided maximum per
 * thread merged in a shared-memory tree (ties to the lower index, so the first argmax),
 * then (a filter on) the sampling law's cut by the radix select of common/logits.c's
 * row_cut, its histograms of integer counts and fixed-point masses added with atomics
 * (integer sums: any order gives the same bits), then whole ROW_CHUNK chunks per thread
 * summed in index order, then thread 0 adds the chunk sums in chunk order and draws: the
 * order of common/logits.c's row_stats. */
#include "cuda_rowstats.h"
#include "cuda_kernels.h" /* CUDA_CHECK, cuk_count_launches */
#include <cuda_runtime.h>
#include <math.h>
#include <string.h>

#define ROWQ_THREADS 256

/* row_max_merge (common/logits.c) on the device: a NaN maximum wins, as there. */
__device__ static void rowmax_merge(RowMax *acc, const RowMax *m) {
    if (m->argmax < 0 || (acc->argmax >= 0 && acc->max != acc->max)) return;
    if (acc->argmax < 0 || m->max != m->max) {
        *acc = *m;
        return;
    }
    float lo = acc->max < m->max ? acc->max : m->max;
    float sec = acc->second > m->second ? acc->second : m->second;
    acc->second = lo > sec ? lo : sec;
    if (m->max > acc->max || (m->max == acc->max && m->argmax < acc->argmax)) {
        acc->max = m->max;
        acc->argmax = m->argmax;
    }
}

/* Block-wide RowMax of the row; the result in every thread. */
__device__ static RowMax block_rowmax(const float *row, int V) {
    __shared__ RowMax part[ROWQ_THREADS];
    int t = threadIdx.x, nt = blockDim.x;
    RowMax m = {-INFINITY, -INFINITY, -1};
    /* Strided (coalesced) loads: the maximum, its first index and the runner-up do not
     * depend on the order entries are seen in, given ties merge to the lower index. */
    for (int i = t; i < V; i += nt) {
        if (m.max != m.max) break; /* a NaN: the row has no maximum (backend_rows_stats) */
        float v = row[i];
        if (m.argmax < 0 || v > m.max || v != v) {
            m.second = m.max;
            m.max = v;
            m.argmax = i;
        } else if (v > m.second) {
            m.second = v;
        }
    }
    part[t] = m;
    __syncthreads();
    for (int o = nt / 2; o > 0; o >>= 1) {
        if (t < o) rowmax_merge(&part[t], &part[t + o]);
        __syncthreads();
    }
    RowMax r = part[0];
    __syncthreads();
    return r;
}

__device__ static int chunk_end(int c, int V) {
    int hi = (c + 1) * ROW_CHUNK;
    return hi < V ? hi : V;
}

/* The inverse-CDF draw over the chunk sums (common/logits.c: chunk_draw). */
__device__ static int chunk_draw_dev(const float *row, int V, float mx, double scale, float cut,
                                     const double *csum, double thr) {
    int nc = (V + ROW_CHUNK - 1) / ROW_CHUNK, last_c = 0;
    double acc = 0.0;
    for (int c = 0; c < nc; c++) {
        if (csum[c] > 0) last_c = c;
        if (!(thr < acc + csum[c])) {
            acc += csum[c];
            continue;
        }
        for (int i = c * ROW_CHUNK; i < chunk_end(c, V); i++) {
            acc += row_weight(row[i], mx, scale, cut);
            if (thr < acc) return i;
        }
        last_c = c;
        break;
    }
    int last = last_c * ROW_CHUNK;
    for (int i = last_c * ROW_CHUNK; i < chunk_end(last_c, V); i++)
        if (row_weight(row[i], mx, scale, cut) > 0) last = i;
    return last;
}

/* ---- the sampling law's cut (common/logits.c: row_cut) ---- */

__device__ static int greedy_dev(const Sampling &s) { return s.temperature == 0 || s.top_k == 1; }

/* common/logits.c's radix_select, block-wide; the result in every thread. */
__device__ static uint32_t block_radix_select(const float *row, int V, float mx, double scale,
                                              uint32_t floor, int by_mass, double need) {
    __shared__ unsigned long long hist[256];
    __shared__ uint32_t sh_prefix;
    __shared__ unsigned long long sh_above;
    int t = threadIdx.x, nt = blockDim.x;
    uint32_t prefix = 0, mask = 0;
    if (t == 0) sh_above = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = t; b < 256; b += nt) hist[b] = 0;
        __syncthreads();
        for (int i = t; i < V; i += nt) {
            uint32_t k = row_logit_key(row[i]);
            if (k < floor || (k & mask) != prefix) continue;
            atomicAdd(&hist[(k >> shift) & 255],
                      by_mass ? row_fixed_weight(row[i], mx, scale) : 1ull);
        }
        __syncthreads();
        if (t == 0) {
            unsigned long long above = sh_above;
            int b = 255;
            for (; b > 0 && !((double)(above + hist[b]) >= need); b--) above += hist[b];
            sh_above = above;
            sh_prefix = prefix | (uint32_t)b << shift;
        }
        __syncthreads();
        prefix = sh_prefix;
        mask |= 0xffu << shift;
    }
    __syncthreads(); /* hist and sh_prefix are free for the next select */
    return prefix;
}

/* Total fixed-point mass of the keys >= floor, in every thread. */
__device__ static unsigned long long block_fixed_mass(const float *row, int V, float mx,
                                                      double scale, uint32_t floor) {
    __shared__ unsigned long long z;
    if (threadIdx.x == 0) z = 0;
    __syncthreads();
    unsigned long long mine = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        if (row_logit_key(row[i]) >= floor) mine += row_fixed_weight(row[i], mx, scale);
    atomicAdd(&z, mine);
    __syncthreads();
    unsigned long long r = z;
    __syncthreads();
    return r;
}

/* Smallest key whose logit passes min-p, in every thread. */
__device__ static uint32_t block_min_p_key(const float *row, int V, float mx, double scale,
                                           double min_p) {
    __shared__ unsigned kmin;
    double lmin = log(min_p);
    if (threadIdx.x == 0) kmin = row_logit_key(mx);
    __syncthreads();
    unsigned mine = 0xffffffffu;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        if (((double)row[i] - mx) * scale >= lmin) {
            unsigned k = row_logit_key(row[i]);
            mine = k < mine ? k : mine;
        }
    atomicMin(&kmin, mine);
    __syncthreads();
    unsigned r = kmin;
    __syncthreads();
    return r;
}

/* row_cut, block-wide; the result in every thread. */
__device__ static float block_cut(const float *row, int V, float mx, const Sampling &s) {
    double scale = 1.0 / s.temperature;
    uint32_t cut = 0, floor = 0;
    if (s.top_k > 0 && s.top_k < V)
        cut = floor = block_radix_select(row, V, mx, scale, 0, 0, (double)s.top_k);
    if (s.top_p > 0 && s.top_p < 1) {
        unsigned long long z = block_fixed_mass(row, V, mx, scale, floor);
        uint32_t k = block_radix_select(row, V, mx, scale, floor, 1, s.top_p * (double)z);
        if (k > cut) cut = k;
    }
    if (s.min_p > 0) {
        uint32_t k = block_min_p_key(row, V, mx, scale, s.min_p);
        if (k > cut) cut = k;
    }
    return cut == 0 ? -INFINITY : row_key_logit(cut);
}


__global__ void __launch_bounds__(ROWQ_THREADS)
k_rows_stats(const float *logits, int V, const int *rows, Sampling smp, const double *u,
             double *csum, RowStats *out) {
    int r = blockIdx.x, nc = (V + ROW_CHUNK - 1) / ROW_CHUNK, greedy = greedy_dev(smp);
    const float *row = logits + (size_t)rows[r] * V;
    double *cs = csum + (size_t)r * nc;
    RowMax m = block_rowmax(row, V);
    float cut = greedy ? -INFINITY : block_cut(row, V, m.max, smp);
    double scale = greedy ? NAN : 1.0 / smp.temperature;
    if (!greedy)
        for (int c = threadIdx.x; c < nc; c += blockDim.x) {
            double s = 0.0;
            for (int i = c * ROW_CHUNK; i < chunk_end(c, V); i++)
                s += row_weight(row[i], m.max, scale, cut);
            cs[c] = s;
        }
    __syncthreads();
    if (threadIdx.x != 0) return;
    RowStats st;
    st.argmax = m.argmax;
    st.max = m.max;
    st.second = m.second;
    st.cut = cut;
    st.scale = scale;
    st.lse = NAN;
    st.draw = greedy ? m.argmax : -1;
    if (!greedy) {
        double total = 0.0;
        for (int c = 0; c < nc; c++) total += cs[c];
        st.lse = (double)m.max * scale + log(total);
        double ur = u ? u[r] : -1.0;
        if (ur >= 0) st.draw = chunk_draw_dev(row, V, m.max, scale, cut, cs, ur * total);
    }
    out[r] = st;
}

__global__ void k_rows_gather(const float *logits, int V, const int *rows, const int *ids, int n,
                              float *out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = logits[(size_t)rows[i] * V + ids[i]];
}

extern "C" void cuk_rows_stats(cudaStream_t s, const float *logits, int V, const int *rows,
                               int n, const Sampling *smp, const double *u, double *csum,
                               RowStats *out) {
    if (n <= 0) return;
    CUK_KERNEL_LAUNCH(k_rows_stats, n, ROWQ_THREADS, s, logits, V, rows, *smp, u, csum, out);
    cuk_count_launches(1);
    CUDA_CHECK(cudaGetLastError());
}

extern "C" void cuk_rows_gather(cudaStream_t s, const float *logits, int V, const int *rows,
                                const int *ids, int n, float *out) {
    if (n <= 0) return;
    CUK_KERNEL_LAUNCH(k_rows_gather, (n + 255) / 256, 256, s, logits, V, rows, ids, n, out);
    cuk_count_launches(1);
    CUDA_CHECK(cudaGetLastError());
}
