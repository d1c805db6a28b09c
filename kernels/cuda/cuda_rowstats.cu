/* Row queries on the device; see cuda_rowstats.h. One block per row: a strided maximum per
 * thread merged in a shared-memory tree (ties to the lower index, so the first argmax),
 * then whole ROW_CHUNK chunks per thread summed in index order, then thread 0 adds the
 * chunk sums in chunk order and draws: the order of common/logits.c's row_stats. */
#include "cuda_rowstats.h"
#include "cuda_kernels.h" /* CUDA_CHECK, cuk_count_launches */
#include <cuda_runtime.h>
#include <math.h>

#define ROWQ_THREADS 256

/* row_max_merge (common/logits.c) on the device. */
__device__ static void rowmax_merge(RowMax *acc, const RowMax *m) {
    if (m->argmax < 0) return;
    if (acc->argmax < 0) {
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
        float v = row[i];
        if (m.argmax < 0 || v > m.max) {
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
__device__ static int chunk_draw_dev(const float *row, int V, float mx, const double *csum,
                                     double thr) {
    int nc = (V + ROW_CHUNK - 1) / ROW_CHUNK, last_c = 0;
    double acc = 0.0;
    for (int c = 0; c < nc; c++) {
        if (csum[c] > 0) last_c = c;
        if (!(thr < acc + csum[c])) {
            acc += csum[c];
            continue;
        }
        for (int i = c * ROW_CHUNK; i < chunk_end(c, V); i++) {
            acc += exp((double)row[i] - mx);
            if (thr < acc) return i;
        }
        last_c = c;
        break;
    }
    int last = last_c * ROW_CHUNK;
    for (int i = last_c * ROW_CHUNK; i < chunk_end(last_c, V); i++)
        if (exp((double)row[i] - mx) > 0) last = i;
    return last;
}

__global__ void __launch_bounds__(ROWQ_THREADS)
k_rows_stats(const float *logits, int V, const int *rows, int temp, const double *u,
             double *csum, RowStats *out) {
    int r = blockIdx.x, nc = (V + ROW_CHUNK - 1) / ROW_CHUNK;
    const float *row = logits + (size_t)rows[r] * V;
    double *cs = csum + (size_t)r * nc;
    RowMax m = block_rowmax(row, V);
    if (temp)
        for (int c = threadIdx.x; c < nc; c += blockDim.x) {
            double s = 0.0;
            for (int i = c * ROW_CHUNK; i < chunk_end(c, V); i++) s += exp((double)row[i] - m.max);
            cs[c] = s;
        }
    __syncthreads();
    if (threadIdx.x != 0) return;
    RowStats st;
    st.argmax = m.argmax;
    st.max = m.max;
    st.second = m.second;
    st.lse = NAN;
    st.draw = temp == 0 ? m.argmax : -1;
    if (temp) {
        double total = 0.0;
        for (int c = 0; c < nc; c++) total += cs[c];
        st.lse = (double)m.max + log(total);
        double ur = u ? u[r] : -1.0;
        if (ur >= 0) st.draw = chunk_draw_dev(row, V, m.max, cs, ur * total);
    }
    out[r] = st;
}

__global__ void k_rows_gather(const float *logits, int V, const int *rows, const int *ids, int n,
                              float *out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = logits[(size_t)rows[i] * V + ids[i]];
}

extern "C" void cuk_rows_stats(cudaStream_t s, const float *logits, int V, const int *rows,
                               int n, int temp, const double *u, double *csum, RowStats *out) {
    if (n <= 0) return;
    CUK_KERNEL_LAUNCH(k_rows_stats, n, ROWQ_THREADS, s, logits, V, rows, temp, u, csum, out);
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
