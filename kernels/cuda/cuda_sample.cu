/* Greedy and sampled token choice on the device (see cuda_kernels.h: cuk_argmax,
 * cuk_sample), against the CPU references row_argmax and row_sample (common/logits.c):
 * the first maximum, and the inverse CDF of softmax in double. */
#include "cuda_device.cuh"

/* ---- argmax and sampling (one block of 1024 threads per row) ---- */

#define SEL_THREADS 1024

/* Block-wide (value, index) max, ties to the lowest index; result in every thread. */
__device__ void block_argmax(float v, int idx, float *out_v, int *out_i) {
    __shared__ float sv[SEL_THREADS];
    __shared__ int si[SEL_THREADS];
    sv[threadIdx.x] = v;
    si[threadIdx.x] = idx;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if (threadIdx.x < o) {
            float v2 = sv[threadIdx.x + o];
            int i2 = si[threadIdx.x + o];
            float v1 = sv[threadIdx.x];
            int i1 = si[threadIdx.x];
            if (i2 >= 0 && (i1 < 0 || v2 > v1 || (v2 == v1 && i2 < i1))) {
                sv[threadIdx.x] = v2;
                si[threadIdx.x] = i2;
            }
        }
        __syncthreads();
    }
    *out_v = sv[0];
    *out_i = si[0];
    __syncthreads();
}

/* Each thread scans a contiguous chunk in order, so within a chunk the first maximum wins,
 * and the block merge prefers lower indices: the global first maximum, as row_argmax. */
__device__ void row_max(const float *row, int n, float *mv, int *mi) {
    int chunk = (n + blockDim.x - 1) / blockDim.x;
    int lo = threadIdx.x * chunk, hi = min(n, lo + chunk);
    float bv = -INFINITY;
    int bi = -1;
    for (int i = lo; i < hi; i++)
        if (bi < 0 || row[i] > bv) {
            bv = row[i];
            bi = i;
        }
    block_argmax(bv, bi, mv, mi);
}

/* Launched with SEL_THREADS (1024) threads: __launch_bounds__ makes ptxas keep the register
 * count within what a 1024-thread block may have, instead of failing at launch. */
__global__ void __launch_bounds__(SEL_THREADS) k_argmax(const float *row, int n, int *out) {
    float mv;
    int mi;
    row_max(row, n, &mv, &mi);
    if (threadIdx.x == 0) *out = mi;
}

extern "C" void cuk_argmax(cudaStream_t s, const float *row, int n, int *out) {
    CUK_LAUNCH(k_argmax, 1, SEL_THREADS, s, row, n, out);
    LAUNCH_CHECK();
}

/* Inverse CDF as row_sample: weights exp(l - max) in double, threshold u * sum; the chunk
 * whose running sum crosses the threshold scans itself in order. If rounding puts the
 * threshold past the end, the last index with a positive weight is returned. */
__global__ void __launch_bounds__(SEL_THREADS) k_sample(const float *row, int n, double u, int *out) {
    __shared__ double csum[SEL_THREADS];
    __shared__ int found;
    float mv;
    int mi;
    row_max(row, n, &mv, &mi);
    double mx = (double)mv;
    int chunk = (n + blockDim.x - 1) / blockDim.x;
    int lo = threadIdx.x * chunk, hi = min(n, lo + chunk);
    double acc = 0.0;
    int last = -1;
    for (int i = lo; i < hi; i++) {
        double p = exp((double)row[i] - mx);
        if (p > 0) last = i;
        acc += p;
    }
    csum[threadIdx.x] = acc;
    if (threadIdx.x == 0) found = -1;
    __syncthreads();
    /* Exclusive prefix of chunk sums: 1024 doubles, done by one thread in order. */
    if (threadIdx.x == 0) {
        double run = 0.0;
        for (int k = 0; k < (int)blockDim.x; k++) {
            double c = csum[k];
            csum[k] = run;
            run += c;
        }
        csum[0] = run; /* slot 0's prefix is 0 by definition; keep the total there */
    }
    __syncthreads();
    double total = csum[0];
    double prefix = threadIdx.x == 0 ? 0.0 : csum[threadIdx.x];
    double thr = u * total;
    if (lo < hi && thr >= prefix && thr < prefix + acc) {
        /* Chunk intervals come from one sequential scan, so exactly one thread is here. */
        double a = prefix;
        int hit = last; /* rounding of a vs prefix + acc: fall back to the chunk's last */
        for (int i = lo; i < hi; i++) {
            a += exp((double)row[i] - mx);
            if (thr < a) {
                hit = i;
                break;
            }
        }
        found = hit;
    }
    __syncthreads();
    int lastmax;
    float dummy;
    block_argmax((float)last, last, &dummy, &lastmax);
    if (threadIdx.x == 0) *out = found >= 0 ? found : lastmax;
}

extern "C" void cuk_sample(cudaStream_t s, const float *row, int n, double u, int *out) {
    CUK_LAUNCH(k_sample, 1, SEL_THREADS, s, row, n, u, out);
    LAUNCH_CHECK();
}
