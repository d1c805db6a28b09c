/* Row queries on the device; see cuda_rowstats.h. CPU reference: common/logits.c's
 * row_stats. A row is split into up to ROWQ_BLOCKS blocks of whole ROW_CHUNK chunks (about
 * ROWQ_COLS columns each), in up to three launches over all the queried rows:
 *  1. k_rows_max: each block the RowMax of its columns (strided, merged in a shared-memory
 *     tree, ties and NaNs to the lower index, so the first argmax and the first NaN); the
 *     row's last block to finish (a self-resetting counter per row) merges the blocks' parts
 *     in block order and writes the row's greedy (or lawless) RowStats.
 *  2. k_rows_cut (a filter on only): the sampling law's cut by the radix select of
 *     common/logits.c's row_cut, one launch per step (a digit of top-k's select, then of
 *     top-p's; min-p rides on the first): every block adds its columns' part (histogram of
 *     integer counts or fixed-point masses, top-p's total mass, min-p's least key) into the
 *     row's scratch with integer atomics (any order gives the same bits), and the row's
 *     last block takes the step's decision, which the next launch reads.
 *  3. k_rows_sums: each block's chunks summed in index order, a thread per chunk; the row's
 *     last block adds the chunk sums in chunk order and draws: the order of row_stats, so
 *     the bits do not depend on which block finishes when. */
#include "cuda_rowstats.h"
#include "cuda_kernels.h" /* CUDA_CHECK, cuk_count_launches */
#include <cuda_runtime.h>
#include <math.h>
#include <string.h>

#define ROWQ_THREADS 256
#define ROWQ_COLS 4096 /* columns per block, rounded up to whole chunks */
#define ROWQ_BLOCKS 16 /* at most, per row */

/* A row's cut in the making (k_rows_cut): the select under way and what the steps so far
 * decided. hist is zero between launches (the deciding block clears it). */
typedef struct {
    unsigned long long hist[256]; /* this digit's counts or fixed-point masses */
    unsigned long long above;     /* of the entries above the digit being chosen */
    unsigned long long z;         /* top-p: the mass of the keys >= floor */
    uint32_t prefix, mask;        /* the select's digits chosen so far */
    uint32_t floor;               /* top-k's key, below which top-p weighs nothing */
    uint32_t cut;                 /* the largest key a finished select gave (0: none) */
    uint32_t kmin;                /* min-p: the least key it keeps */
    unsigned done;                /* blocks of this launch counted in */
} RowqCut;

/* A row's scratch: the passes' counters, the blocks' RowMax parts, the cut; then the chunk
 * sums. */
typedef struct {
    unsigned max_done, sums_done, pad[2];
    RowMax part[ROWQ_BLOCKS];
    RowqCut cut;
} RowqHead;

static int rowq_blocks(int V) {
    int b = (V + ROWQ_COLS - 1) / ROWQ_COLS;
    return b < 1 ? 1 : b > ROWQ_BLOCKS ? ROWQ_BLOCKS : b;
}

__host__ __device__ static size_t rowq_row_bytes(int V) {
    return sizeof(RowqHead) + (size_t)((V + ROW_CHUNK - 1) / ROW_CHUNK) * sizeof(double);
}

/* row_max_merge (common/logits.c) on the device: a NaN maximum wins, as there. */
__device__ static void rowmax_merge(RowMax *acc, const RowMax *m) {
    int acc_nan = acc->argmax >= 0 && acc->max != acc->max;
    if (acc_nan && m->max != m->max && m->argmax >= 0 && m->argmax < acc->argmax) {
        *acc = *m; /* the first NaN of the row, as row_max_part stops at */
        return;
    }
    if (m->argmax < 0 || acc_nan) return;
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

/* Block-wide RowMax of row[lo, hi); the result in every thread. */
__device__ static RowMax block_rowmax(const float *row, int lo, int hi) {
    __shared__ RowMax part[ROWQ_THREADS];
    int t = threadIdx.x, nt = blockDim.x;
    RowMax m = {-INFINITY, -INFINITY, -1};
    /* Strided (coalesced) loads: the maximum, its first index and the runner-up do not
     * depend on the order entries are seen in, given ties merge to the lower index. */
    for (int i = lo + t; i < hi; i += nt) {
        float v = row[i];
        if (v != v) { /* a NaN: the row has no maximum (backend_rows_stats) */
            m.max = m.second = v;
            m.argmax = i;
            break;
        }
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
__device__ static int chunk_draw_dev(const float *row, int V, float mx, double scale, float cut,
                                     const volatile double *csum, double thr) {
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

/* One launch of k_rows_cut: what its blocks add up and what the row's last block decides. */
typedef struct {
    int shift;   /* the digit's low bit (24, 16, 8, 0); -1: no digit this launch */
    int by_mass; /* top-p's select (fixed-point masses), else top-k's (counts) */
    int z;       /* also total the mass of the keys >= floor (top-p's first digit) */
    int min_p;   /* also the least key min-p keeps */
    int final;   /* write the cut */
} CutStep;

/* This block's part of a cut step over row[lo, hi), added into the row's RowqCut. */
__device__ static void cut_block_part(const float *row, int lo, int hi, float mx,
                                      const Sampling &smp, const CutStep &st, RowqCut *c) {
    __shared__ unsigned long long hist[256];
    __shared__ unsigned long long zs;
    __shared__ unsigned kmin;
    int t = threadIdx.x, nt = blockDim.x;
    double scale = 1.0 / smp.temperature, lmin = st.min_p ? log(smp.min_p) : 0.0;
    uint32_t prefix = c->prefix, mask = c->mask, floor = c->floor; /* the last launch's */
    for (int b = t; b < 256; b += nt) hist[b] = 0;
    if (t == 0) zs = 0, kmin = 0xffffffffu;
    __syncthreads();
    unsigned long long zm = 0;
    unsigned km = 0xffffffffu;
    for (int i = lo + t; i < hi; i += nt) {
        float v = row[i];
        uint32_t k = row_logit_key(v);
        if (st.min_p && ((double)v - mx) * scale >= lmin && k < km) km = k;
        if (k < floor) continue;
        if (st.z) zm += row_fixed_weight(v, mx, scale);
        if (st.shift >= 0 && (k & mask) == prefix)
            atomicAdd(&hist[(k >> st.shift) & 255],
                      st.by_mass ? row_fixed_weight(v, mx, scale) : 1ull);
    }
    if (st.z) atomicAdd(&zs, zm);
    if (st.min_p) atomicMin(&kmin, km);
    __syncthreads();
    for (int b = t; st.shift >= 0 && b < 256; b += nt)
        if (hist[b]) atomicAdd(&c->hist[b], hist[b]);
    if (t == 0 && st.z) atomicAdd(&c->z, zs);
    if (t == 0 && st.min_p) atomicMin(&c->kmin, kmin);
}

/* The row's last block: the step's digit (common/logits.c's radix_select), the select's key
 * when it was the last digit, and with the final step the cut. */
__device__ static void cut_decide(volatile RowqCut *c, const CutStep &st, const Sampling &smp,
                                  RowStats *o) {
    if (st.shift >= 0) {
        double need = st.by_mass ? smp.top_p * (double)c->z : (double)smp.top_k;
        unsigned long long above = c->above;
        int b = 255;
        for (; b > 0 && !((double)(above + c->hist[b]) >= need); b--) above += c->hist[b];
        for (int i = 0; i < 256; i++) c->hist[i] = 0;
        c->above = above;
        c->prefix |= (uint32_t)b << st.shift;
        c->mask |= 0xffu << st.shift;
    }
    if (st.shift == 0) { /* the select is done: its key */
        uint32_t k = c->prefix;
        if (k > c->cut) c->cut = k;
        if (!st.by_mass) c->floor = k;
        c->prefix = c->mask = 0;
        c->above = 0;
    }
    if (!st.final) return;
    uint32_t cut = c->cut;
    if (smp.min_p > 0 && c->kmin > cut) cut = c->kmin;
    o->cut = cut == 0 ? -INFINITY : row_key_logit(cut);
}

/* A query's cut starts from nothing; min-p's least key from the maximum's, as row_cut. */
__device__ static void cut_init(RowqCut *c, float mx) {
    c->above = c->z = 0;
    c->prefix = c->mask = c->floor = c->cut = 0;
    c->kmin = row_logit_key(mx);
}

/* Row r's scratch (rowq_row_bytes). */
__device__ static RowqHead *rowq_head(char *scratch, int V, int r) {
    return (RowqHead *)(scratch + (size_t)r * rowq_row_bytes(V));
}

/* Block b's chunks [c0, c1) of a row split into `blocks` blocks. */
__device__ static void rowq_span(int V, int blocks, int b, int *c0, int *c1) {
    int nc = (V + ROW_CHUNK - 1) / ROW_CHUNK, per = (nc + blocks - 1) / blocks;
    *c0 = min(nc, b * per);
    *c1 = min(nc, *c0 + per);
}

/* The row's stats as far as the maximum goes: final when greedy or lawless. */
__device__ static void rowq_write_max(RowStats *o, const RowMax *m, const Sampling &smp) {
    int greedy = greedy_dev(smp);
    RowStats st;
    st.argmax = m->argmax;
    st.max = m->max;
    st.second = m->second;
    st.cut = -INFINITY;
    st.scale = greedy ? NAN : 1.0 / smp.temperature;
    st.lse = NAN;
    st.draw = greedy ? m->argmax : -1;
    *o = st;
}

/* Counts this block of row r in (thread 0 published before); 1 in every thread of the
 * row's last block (the threadFenceReduction pattern). */
__device__ static int rowq_last(unsigned *done, int blocks) {
    __shared__ int last;
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(done, 1u) == (unsigned)blocks - 1;
    }
    __syncthreads();
    if (last) __threadfence();
    return last;
}

__global__ void __launch_bounds__(ROWQ_THREADS)
k_rows_max(const float *logits, int V, const int *rows, Sampling smp, int blocks, char *scratch,
           RowStats *out) {
    int b = blockIdx.x, r = blockIdx.y, c0, c1;
    rowq_span(V, blocks, b, &c0, &c1);
    const float *row = logits + (size_t)rows[r] * V;
    RowMax m = block_rowmax(row, c0 * ROW_CHUNK, min(V, c1 * ROW_CHUNK));
    RowqHead *h = rowq_head(scratch, V, r);
    if (blocks == 1) {
        if (threadIdx.x == 0) rowq_write_max(out + r, &m, smp), cut_init(&h->cut, m.max);
        return;
    }
    if (threadIdx.x == 0) h->part[b] = m;
    if (!rowq_last(&h->max_done, blocks) || threadIdx.x != 0) return;
    const volatile RowqHead *vh = h;
    RowMax acc = {-INFINITY, -INFINITY, -1};
    for (int i = 0; i < blocks; i++) {
        RowMax p = {vh->part[i].max, vh->part[i].second, vh->part[i].argmax};
        rowmax_merge(&acc, &p);
    }
    rowq_write_max(out + r, &acc, smp);
    cut_init(&h->cut, acc.max);
    h->max_done = 0; /* every block has counted: ready for the next launch */
}

__global__ void __launch_bounds__(ROWQ_THREADS)
k_rows_cut(const float *logits, int V, const int *rows, Sampling smp, CutStep st, int blocks,
           char *scratch, RowStats *out) {
    int b = blockIdx.x, r = blockIdx.y, c0, c1;
    float mx = out[r].max;
    if (!isfinite(mx)) return; /* no law: row_stats leaves the cut at -inf */
    rowq_span(V, blocks, b, &c0, &c1);
    RowqCut *c = &rowq_head(scratch, V, r)->cut;
    cut_block_part(logits + (size_t)rows[r] * V, c0 * ROW_CHUNK, min(V, c1 * ROW_CHUNK), mx,
                   smp, st, c);
    __threadfence(); /* every thread's atomics before the block counts in */
    __syncthreads();
    if (!rowq_last(&c->done, blocks) || threadIdx.x != 0) return;
    cut_decide(c, st, smp, out + r);
    c->done = 0;
}

__global__ void __launch_bounds__(ROWQ_THREADS)
k_rows_sums(const float *logits, int V, const int *rows, const double *u, int blocks,
            char *scratch, RowStats *out) {
    int b = blockIdx.x, r = blockIdx.y, c0, c1;
    RowStats st = out[r];
    if (!isfinite(st.max)) return; /* every block of the row returns: its counter stays 0 */
    rowq_span(V, blocks, b, &c0, &c1);
    const float *row = logits + (size_t)rows[r] * V;
    RowqHead *h = rowq_head(scratch, V, r);
    double *cs = (double *)(h + 1);
    for (int c = c0 + threadIdx.x; c < c1; c += blockDim.x) {
        double s = 0.0;
        for (int i = c * ROW_CHUNK; i < chunk_end(c, V); i++)
            s += row_weight(row[i], st.max, st.scale, st.cut);
        cs[c] = s;
    }
    __threadfence(); /* every thread's sums before the block counts in */
    __syncthreads();
    if (!rowq_last(&h->sums_done, blocks) || threadIdx.x != 0) return;
    const volatile double *vcs = cs;
    int nc = (V + ROW_CHUNK - 1) / ROW_CHUNK;
    double total = 0.0;
    for (int c = 0; c < nc; c++) total += vcs[c];
    st.lse = (double)st.max * st.scale + log(total);
    double ur = u ? u[r] : -1.0;
    if (ur >= 0) st.draw = chunk_draw_dev(row, V, st.max, st.scale, st.cut, vcs, ur * total);
    out[r] = st;
    h->sums_done = 0;
}

__global__ void k_rows_gather(const float *logits, int V, const int *rows, const int *ids, int n,
                              float *out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = logits[(size_t)rows[i] * V + ids[i]];
}

extern "C" size_t cuk_rows_stats_scratch_bytes(int n, int V) {
    return (size_t)n * rowq_row_bytes(V);
}

/* A filter on: the cut needs its own passes (common/logits.c: row_cut). */
static int rowq_filtered(const Sampling *s, int V) {
    return (s->top_k > 0 && s->top_k < V) || (s->top_p > 0 && s->top_p < 1) || s->min_p > 0;
}

/* The cut's launches (a filter on): top-k's four digits, then top-p's (its total mass with
 * the first), min-p's least key with the first launch; the last writes the cut. */
static int rowq_cut(cudaStream_t s, const float *logits, int V, const int *rows, int n,
                    const Sampling *smp, int blocks, char *scratch, RowStats *out) {
    CutStep steps[8];
    int ns = 0;
    int on[2] = {smp->top_k > 0 && smp->top_k < V, smp->top_p > 0 && smp->top_p < 1};
    for (int sel = 0; sel < 2; sel++)
        for (int shift = 24; on[sel] && shift >= 0; shift -= 8) {
            CutStep st = {shift, sel, sel && shift == 24, 0, 0};
            steps[ns++] = st;
        }
    if (ns == 0) {
        CutStep st = {-1, 0, 0, 0, 0};
        steps[ns++] = st;
    }
    steps[0].min_p = smp->min_p > 0;
    steps[ns - 1].final = 1;
    dim3 grid(blocks, n);
    for (int i = 0; i < ns; i++) {
        CUK_KERNEL_LAUNCH(k_rows_cut, grid, ROWQ_THREADS, s, logits, V, rows, *smp, steps[i],
                          blocks, scratch, out);
        CUDA_CHECK(cudaGetLastError());
    }
    return ns;
}

extern "C" void cuk_rows_stats(cudaStream_t s, const float *logits, int V, const int *rows,
                               int n, const Sampling *smp, const double *u, void *scratch,
                               RowStats *out) {
    if (n <= 0) return;
    int blocks = rowq_blocks(V), launches = 1;
    dim3 grid(blocks, n);
    CUK_KERNEL_LAUNCH(k_rows_max, grid, ROWQ_THREADS, s, logits, V, rows, *smp, blocks,
                      (char *)scratch, out);
    CUDA_CHECK(cudaGetLastError());
    if (!(smp->temperature == 0 || smp->top_k == 1)) { /* greedy_dev */
        if (rowq_filtered(smp, V))
            launches += rowq_cut(s, logits, V, rows, n, smp, blocks, (char *)scratch, out);
        CUK_KERNEL_LAUNCH(k_rows_sums, grid, ROWQ_THREADS, s, logits, V, rows, u, blocks,
                          (char *)scratch, out);
        CUDA_CHECK(cudaGetLastError());
        launches++;
    }
    cuk_count_launches(launches);
}

extern "C" void cuk_rows_gather(cudaStream_t s, const float *logits, int V, const int *rows,
                                const int *ids, int n, float *out) {
    if (n <= 0) return;
    CUK_KERNEL_LAUNCH(k_rows_gather, (n + 255) / 256, 256, s, logits, V, rows, ids, n, out);
    cuk_count_launches(1);
    CUDA_CHECK(cudaGetLastError());
}
