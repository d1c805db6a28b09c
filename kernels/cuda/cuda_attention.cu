/* Attention over the KV cache (see cuda_kernels.h: cuk_attention), against its CPU
 * reference cpu_attention / cpu_attention_head (kernels/cpu/cpu_ops.c): the same masked
 * softmax(q k^T * scale) v per query row and head, in f32 over the bf16 cache. */
#include "cuda_device.cuh"

/* Tiled split-KV attention (flash-decoding). A block owns one KV head, a tile of query
 * rows times that head's GQA group (up to ATT_QV query vectors, their q in shared memory)
 * and one split of the cache slots, so each key and value row it reads serves every query
 * vector of the tile: a one-row decode spreads the cache over many splits, a tree pass
 * reads the committed prefix once per row tile instead of once per (head, row). K and V
 * rows are read 8 bf16 (16 bytes) at a time, ATT_KU (keys) or ATT_VU (values) loads issued
 * before the first is used. Per slot tile of ATT_C slots: warp w scores query vectors w,
 * w + 4, ... against one slot per lane, an online softmax per query vector, then the
 * output items (query vector, 8 dims) accumulate p * v, the tile's slots split among 2 or 4
 * groups of threads when the items alone would leave threads idle (default mode). In a
 * paged call (CuMeta.paged) a block's rows come from the call's tile list, all of one
 * sequence, and its entries are read through that sequence's block table. Splits leave
 * (max, sum, acc) partials; the last of a tile's split blocks to finish (a counter per tile
 * in the scratch) merges them in split order, so the combine costs no second launch; with
 * one split the block writes the output itself.
 *
 * Every per-query-vector quantity is computed in an order fixed by the slot's absolute
 * position and the split bounds alone (never by which other rows share the block), so a
 * row's output depends on the batch only through the split bounds: fixed bounds
 * (AttGeom.chunk > 0) make the kernel batch-invariant. */
#define ATT_C 32       /* slots per tile: one per lane */
#define ATT_THREADS 128
#define ATT_WARPS (ATT_THREADS / 32)
#define ATT_QV 64      /* query vectors per block */
#define ATT_QF 4096    /* floats of q per block: query vectors * head_dim */
#define ATT_IT (ATT_QF / 8 / ATT_THREADS) /* output items per thread */
#define ATT_QW (ATT_QV / ATT_WARPS)       /* query vectors per warp */
#define ATT_MAX_SPLITS 32
#define ATT_BI_CHUNK 256 /* slots per split in batch-invariant mode */
#define ATT_KU 4 /* 16-byte key loads a lane has in flight */
#define ATT_VU 8 /* 16-byte value loads a thread has in flight */

typedef struct {
    int rows_pb, heads_pb, n_hgroups, splits, chunk; /* chunk 0: derived from the context */
} AttGeom;

__device__ __forceinline__ int mask_bit(const uint64_t *mask, int words, int row, int col) {
    return (int)(mask[(size_t)row * words + (col >> 6)] >> (col & 63)) & 1;
}

/* Block coordinates of k_attention: the tile's rows (nr real ones, nw written: padding
 * rows of an unpaged call get zeros), heads, entry range and, in a paged call, its
 * sequence's block table (tables + table; NULL: entry i is slot i). */
typedef struct {
    int r0, nr, nw, h0, nhb, nq, lo, hi, nc, words, table, skip;
    int vs; /* slot groups of the value phase (att_vgroups) */
    const int *tables;
} AttTile;

/* Slot groups of the value phase for `items` output items (query vector, 8 dims): a tile of
 * few query vectors (a one-row decode: its GQA group) would leave threads idle, so the
 * tile's slots are split among 2 or 4 groups of threads whose partial sums are added at
 * the end. Only in the default mode: the grouping depends on the tile's rows, which
 * batch-invariant results must not. */
__device__ __forceinline__ int att_vgroups(int items) {
    if (items <= 0) return 1;
    return items * 4 <= ATT_THREADS ? 4 : items * 2 <= ATT_THREADS ? 2 : 1;
}

__device__ AttTile att_tile(const CuMeta *meta, int nb, int n_heads, int n_kv_heads, int hd,
                            AttGeom g) {
    AttTile t;
    int G = n_heads / n_kv_heads, kvh = blockIdx.y / g.n_hgroups, hg = blockIdx.y % g.n_hgroups;
    const CuPaged *pg = meta->paged;
    int n_ctx;
    t.skip = 0;
    t.tables = NULL;
    t.table = 0;
    if (pg) { /* this block's tile from the list; blocks past the list have none */
        t.skip = (int)blockIdx.z >= pg->n_tiles;
        CuAttTile a = t.skip ? CuAttTile{0, 0, 0, 0, 0, 0} : pg->tiles[blockIdx.z];
        t.r0 = a.r0;
        t.nr = t.nw = a.nr;
        t.nc = a.nc;
        n_ctx = a.n_ctx;
        t.tables = pg->tables;
        t.table = a.table;
    } else {
        t.r0 = blockIdx.z * g.rows_pb;
        t.nr = max(0, min(g.rows_pb, meta->n - t.r0));
        t.nw = min(g.rows_pb, nb - t.r0);
        t.nc = meta->n_committed;
        n_ctx = meta->kv_base + meta->n;
    }
    t.h0 = kvh * G + hg * g.heads_pb;
    t.nhb = min(g.heads_pb, G - hg * g.heads_pb);
    t.nq = t.nr * t.nhb;
    int chunk = g.chunk;
    if (!chunk) chunk = ((n_ctx + g.splits - 1) / g.splits + ATT_C - 1) / ATT_C * ATT_C;
    t.lo = blockIdx.x * chunk;
    t.hi = min(t.lo + chunk, n_ctx);
    t.words = (meta->mask_stride + 63) >> 6;
    t.vs = g.chunk ? 1 : att_vgroups(t.nq * (hd / 8));
    return t;
}

/* Cache slot of the tile's entry j. */
__device__ __forceinline__ int att_slot(const AttTile &T, int j) {
    if (!T.tables) return j;
    return T.tables[T.table + j / CUK_KV_BLOCK] * CUK_KV_BLOCK + j % CUK_KV_BLOCK;
}

/* Scores of entry tile t0 for this warp's query vectors, online-softmax state update;
 * leaves p in p_sh, each vector's rescale factor in a_sh and the entries' cache slots in
 * sl_sh. */
__device__ void att_scores(const AttTile &T, int t0, const float *q_sh, const bf16 *kc,
                           int kv_dim, int kvh, int hd, float scale, const uint64_t *mask,
                           float (*p_sh)[ATT_C], float *m_sh, float *l_sh, float *a_sh,
                           int *sl_sh) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, j = t0 + lane;
    float s[ATT_QW];
#pragma unroll
    for (int k = 0; k < ATT_QW; k++) s[k] = 0.0f;
    if (j < T.hi) {
        int slot = att_slot(T, j);
        if (warp == 0) sl_sh[lane] = slot;
        const bf16 *kr = kc + (size_t)slot * kv_dim + (size_t)kvh * hd;
        for (int d0 = 0; d0 < hd; d0 += 8 * ATT_KU) {
            /* ATT_KU 16-byte loads of the key row issued before any is used (predicated on
             * the head size), then consumed in dimension order: the sums are those of one
             * load at a time */
            uint4 kr4[ATT_KU];
#pragma unroll
            for (int u = 0; u < ATT_KU; u++)
                kr4[u] = d0 + 8 * u < hd ? ld16g(kr + d0 + 8 * u) : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int u = 0; u < ATT_KU; u++) {
                int d8 = d0 + 8 * u;
                if (d8 >= hd) break;
                float kf[8];
                unpack8(kr4[u], kf);
#pragma unroll
                for (int k = 0; k < ATT_QW; k++) {
                    int qv = warp + ATT_WARPS * k;
                    if (qv >= T.nq) break;
                    const float *qq = q_sh + qv * hd + d8;
                    float a = s[k];
#pragma unroll
                    for (int e = 0; e < 8; e++) a += qq[e] * kf[e];
                    s[k] = a;
                }
            }
        }
    }
#pragma unroll
    for (int k = 0; k < ATT_QW; k++) {
        int qv = warp + ATT_WARPS * k;
        if (qv >= T.nq) break; /* warp-uniform */
        int row = T.r0 + qv / T.nhb;
        int vis = j < T.hi && (j < T.nc || mask_bit(mask, T.words, row, j - T.nc));
        float sc = vis ? s[k] * scale : -INFINITY;
        float tm = warp_max(sc), m_old = m_sh[qv];
        float mn = fmaxf(m_old, tm);
        float alpha = tm == -INFINITY ? 1.0f : expf(m_old - mn); /* m_old = -inf: 0 */
        float p = vis ? expf(sc - mn) : 0.0f;
        float ps = warp_sum(p);
        p_sh[qv][lane] = p;
        /* every lane has read m_sh[qv] above; lane 0 writes it: an explicit warp barrier
         * between, since the shuffles alone do not order shared memory for the tools */
        __syncwarp();
        if (lane == 0) {
            a_sh[qv] = alpha;
            if (tm != -INFINITY) {
                l_sh[qv] = l_sh[qv] * alpha + ps;
                m_sh[qv] = mn;
            }
        }
    }
}

/* acc (ATT_IT items of 8 dims) *= alpha, += p * v over the entry tile at t0 (with T.vs
 * slot groups: this thread's group's share of the tile, its one item's partial sum). */
__device__ void att_values(const AttTile &T, int t0, const bf16 *vc, int kv_dim, int kvh,
                           int hd, float (*p_sh)[ATT_C], const float *a_sh, const int *sl_sh,
                           float (*acc)[8]) {
    int per = hd / 8, items = T.nq * per;
#pragma unroll
    for (int k = 0; k < ATT_IT; k++) {
        int it = threadIdx.x + ATT_THREADS * k, sg = 0;
        if (T.vs > 1) { /* items * vs <= ATT_THREADS: k = 0 only */
            sg = it / items;
            it -= sg * items;
            if (sg >= T.vs) break;
        }
        int qv = it / per, d8 = (it % per) * 8;
        if (qv >= T.nq) break;
        float al = a_sh[qv];
#pragma unroll
        for (int e = 0; e < 8; e++) acc[k][e] *= al;
        int gs = ATT_C / T.vs, nt = min(min(ATT_C, T.hi - t0), (sg + 1) * gs);
        const bf16 *vr = vc + (size_t)kvh * hd + d8;
        for (int j0 = sg * gs; j0 < nt; j0 += ATT_VU) {
            /* the value chunks of ATT_VU slots loaded before any is used, each predicated
             * on its weight (a masked slot is never read: a stale one may hold NaN), then
             * accumulated in slot order: the sums of one slot at a time */
            uint4 vr4[ATT_VU];
            float pu[ATT_VU];
#pragma unroll
            for (int u = 0; u < ATT_VU; u++) {
                pu[u] = j0 + u < nt ? p_sh[qv][j0 + u] : 0.0f;
                vr4[u] = pu[u] != 0.0f ? ld16g(vr + (size_t)sl_sh[j0 + u] * kv_dim)
                                       : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < ATT_VU; u++) {
                if (pu[u] == 0.0f) continue;
                float vf[8];
                unpack8(vr4[u], vf);
#pragma unroll
                for (int e = 0; e < 8; e++) acc[k][e] += pu[u] * vf[e];
            }
        }
    }
}

/* With slot groups (T.vs > 1): the groups' partial sums added, in group order, into group
 * 0's threads (which then hold items 0.. as without groups), through the q buffer. */
__device__ void att_vgroups_merge(const AttTile &T, int hd, float (*acc)[8], float *buf) {
    int items = T.nq * (hd / 8), sg = threadIdx.x / max(items, 1), it = threadIdx.x - sg * items;
    __syncthreads(); /* the q buffer is read no more */
    if (sg > 0 && sg < T.vs)
        for (int e = 0; e < 8; e++) buf[((size_t)(sg - 1) * items + it) * 8 + e] = acc[0][e];
    __syncthreads();
    if (sg == 0)
        for (int g = 1; g < T.vs; g++)
            for (int e = 0; e < 8; e++) acc[0][e] += buf[((size_t)(g - 1) * items + it) * 8 + e];
}

/* Output of one block: partials, or with one split the normalised rows (zeros for padding
 * rows of the tile). */
__device__ void att_write(const AttTile &T, AttGeom g, int nb, int n_heads, int hd,
                          const float *m_sh, const float *l_sh, float (*acc)[8], float *part,
                          bf16 *ob, float *of) {
    int per = hd / 8, qd = n_heads * hd;
    size_t part_rows = (size_t)nb * n_heads;
    for (int k = 0; k < ATT_IT; k++) {
        int it = threadIdx.x + ATT_THREADS * k, qv = it / per, d8 = (it % per) * 8;
        int r = qv / T.nhb, hh = qv % T.nhb;
        if (r >= T.nw) break;
        int row = T.r0 + r, h = T.h0 + hh;
        int real = qv < T.nq;
        if (g.splits > 1) {
            if (!real) break; /* the combine writes padding rows */
            size_t pr = (size_t)blockIdx.x * part_rows + (size_t)row * n_heads + h;
            if (d8 == 0) {
                part[2 * pr] = m_sh[qv];
                part[2 * pr + 1] = l_sh[qv];
            }
            float *pa = part + 2 * part_rows * g.splits + pr * hd + d8;
            for (int e = 0; e < 8; e++) pa[e] = acc[k][e];
            continue;
        }
        float l = real ? l_sh[qv] : 0.0f;
        for (int e = 0; e < 8; e++) {
            float o = l > 0.0f ? acc[k][e] / l : 0.0f; /* sees nothing: zeros, not NaN */
            size_t off = (size_t)row * qd + (size_t)h * hd + d8 + e;
            if (ob) ob[off] = __float2bfloat16_rn(o);
            if (of) of[off] = o;
        }
    }
}

/* Merge of a tile's split partials by the tile's last block, in split order with the
 * formulas of a separate combine pass: per query vector M = max m_s, L = sum l_s e^(m_s-M),
 * out = sum acc_s e^(m_s-M) / L (zeros for padding rows and rows that see nothing). */
__device__ void att_combine_tile(const AttTile &T, AttGeom g, int nb, int n_heads, int hd,
                                 const float *part, float *m_sh, float *l_sh, bf16 *ob,
                                 float *of) {
    size_t part_rows = (size_t)nb * n_heads;
    const float *pa = part + 2 * part_rows * g.splits;
    for (int qv = threadIdx.x; qv < T.nq; qv += ATT_THREADS) {
        size_t pr = (size_t)(T.r0 + qv / T.nhb) * n_heads + T.h0 + qv % T.nhb;
        float M = -INFINITY, L = 0.0f;
        for (int s = 0; s < g.splits; s++) M = fmaxf(M, ld_part(part + 2 * (s * part_rows + pr)));
        for (int s = 0; s < g.splits; s++) {
            float m = ld_part(part + 2 * (s * part_rows + pr));
            if (m > -INFINITY) L += ld_part(part + 2 * (s * part_rows + pr) + 1) * expf(m - M);
        }
        m_sh[qv] = M;
        l_sh[qv] = L;
    }
    __syncthreads();
    int qd = n_heads * hd;
    for (int i = threadIdx.x; i < T.nw * T.nhb * hd; i += ATT_THREADS) {
        int qv = i / hd, d = i % hd, row = T.r0 + qv / T.nhb, h = T.h0 + qv % T.nhb;
        size_t pr = (size_t)row * n_heads + h;
        float o = 0.0f, L = qv < T.nq ? l_sh[qv] : 0.0f;
        for (int s = 0; qv < T.nq && s < g.splits; s++) {
            float m = ld_part(part + 2 * (s * part_rows + pr));
            if (m > -INFINITY) o += ld_part(pa + (s * part_rows + pr) * hd + d) * expf(m - m_sh[qv]);
        }
        o = L > 0.0f ? o / L : 0.0f;
        size_t off = (size_t)row * qd + (size_t)h * hd + d;
        if (ob) ob[off] = __float2bfloat16_rn(o);
        if (of) of[off] = o;
    }
}

__global__ void __launch_bounds__(ATT_THREADS)
k_attention(const float *q, int q_stride, const bf16 *kc, const bf16 *vc, const uint64_t *mask,
            const CuMeta *meta, int nb, int n_heads, int n_kv_heads, int hd, float scale,
            AttGeom g, float *part, unsigned *tile_cnt, bf16 *ob, float *of) {
    __shared__ float q_sh[ATT_QF];
    __shared__ int last;
    __shared__ float p_sh[ATT_QV][ATT_C];
    __shared__ float m_sh[ATT_QV], l_sh[ATT_QV], a_sh[ATT_QV];
    __shared__ int sl_sh[ATT_C];
    AttTile T = att_tile(meta, nb, n_heads, n_kv_heads, hd, g);
    if (T.skip) return; /* block-uniform: past a paged call's tiles */
    for (int i = threadIdx.x; i < T.nq * hd; i += ATT_THREADS) {
        int qv = i / hd, d = i % hd;
        q_sh[i] = q[(size_t)(T.r0 + qv / T.nhb) * q_stride + (size_t)(T.h0 + qv % T.nhb) * hd + d];
    }
    for (int i = threadIdx.x; i < ATT_QV; i += ATT_THREADS) {
        m_sh[i] = -INFINITY;
        l_sh[i] = 0.0f;
    }
    float acc[ATT_IT][8];
#pragma unroll
    for (int k = 0; k < ATT_IT; k++)
#pragma unroll
        for (int e = 0; e < 8; e++) acc[k][e] = 0.0f;
    __syncthreads();
    for (int t0 = T.lo; t0 < T.hi && T.nq > 0; t0 += ATT_C) {
        /* the KV head read again each tile rather than kept across the tile's warp-sync
         * calls, around which sm_80 would spill it */
        int kvh = block_y() / g.n_hgroups, kv_dim = n_kv_heads * hd;
        att_scores(T, t0, q_sh, kc, kv_dim, kvh, hd, scale, mask, p_sh, m_sh, l_sh, a_sh, sl_sh);
        __syncthreads();
        att_values(T, t0, vc, kv_dim, kvh, hd, p_sh, a_sh, sl_sh, acc);
        __syncthreads();
    }
    if (T.vs > 1) att_vgroups_merge(T, hd, acc, q_sh);
    att_write(T, g, nb, n_heads, hd, m_sh, l_sh, acc, part, ob, of);
    if (g.splits == 1) return;
    /* Publish the partials, then count this split in; the block that completes the count
     * sees every split's partials and merges them (the threadFenceReduction pattern). */
    __threadfence();
    __syncthreads();
    unsigned *cnt = tile_cnt + (size_t)blockIdx.z * gridDim.y + blockIdx.y;
    if (threadIdx.x == 0) last = atomicAdd(cnt, 1u) == (unsigned)g.splits - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    att_combine_tile(T, g, nb, n_heads, hd, part, m_sh, l_sh, ob, of);
    if (threadIdx.x == 0) *cnt = 0; /* ready for the next launch (graph replays included) */
}

/* Row tiles of a call of nb rows of up to max_seqs sequences: each sequence's rows are cut
 * into tiles of rows_pb, so each but one more can end in a partial tile. */
static int att_max_tiles(int nb, int rows_pb, int max_seqs) {
    return (nb + rows_pb - 1) / rows_pb + min(max(max_seqs, 1), nb) - 1;
}

static AttGeom att_geom(int nb, int max_seqs, int n_heads, int n_kv_heads, int hd, int cap,
                        int batch_inv) {
    AttGeom g;
    int G = n_heads / n_kv_heads;
    g.heads_pb = min(G, min(ATT_QV, ATT_QF / hd));
    g.n_hgroups = (G + g.heads_pb - 1) / g.heads_pb;
    g.rows_pb = max(1, min(nb, min(ATT_QV / g.heads_pb, ATT_QF / (g.heads_pb * hd))));
    int tiles = att_max_tiles(nb, g.rows_pb, max_seqs);
    if (batch_inv) { /* bounds fixed by slot position alone */
        g.chunk = ATT_BI_CHUNK;
        g.splits = max(1, (cap + ATT_BI_CHUNK - 1) / ATT_BI_CHUNK);
    } else { /* about two blocks per SM of a large GPU */
        g.chunk = 0;
        g.splits = max(1, min(ATT_MAX_SPLITS, 264 / (n_kv_heads * g.n_hgroups * tiles)));
    }
    return g;
}

extern "C" size_t cuk_attention_scratch_floats(int nb, int n_heads, int hd, int cap) {
    int splits = max(ATT_MAX_SPLITS, (cap + ATT_BI_CHUNK - 1) / ATT_BI_CHUNK);
    return (size_t)splits * nb * n_heads * (hd + 2);
}

/* One per block tile: att_max_tiles is below 2 nb, the head blocks at most n_heads. */
extern "C" size_t cuk_attention_counters(int nb, int n_heads) { return 2 * (size_t)nb * n_heads; }

extern "C" int cuk_attention_tile_rows(int nb, int n_heads, int n_kv_heads, int hd) {
    return att_geom(nb, 1, n_heads, n_kv_heads, hd, 0, 0).rows_pb;
}

extern "C" void cuk_pack_mask(const uint8_t *mask, int n, int stride, uint64_t *out) {
    int words = (stride + 63) / 64;
    memset(out, 0, (size_t)n * words * sizeof(uint64_t));
    for (int t = 0; t < n; t++)
        for (int j = 0; j < stride; j++)
            if (mask[(size_t)t * stride + j]) out[(size_t)t * words + j / 64] |= 1ull << (j % 64);
}

extern "C" void cuk_attention_paged(cudaStream_t s, const float *q, int q_stride,
                                    const rs_bf16 *kc, const rs_bf16 *vc, const uint64_t *mask,
                                    const CuMeta *meta, int nb, int max_seqs, int n_heads,
                                    int n_kv_heads, int hd, int cap, int batch_inv,
                                    float *scratch, unsigned *counters, rs_bf16 *out_bf16,
                                    float *out_f32) {
    if (hd % 8 || hd > 256 || n_heads % n_kv_heads) {
        fprintf(stderr, "rootspec: cuk_attention needs head_dim %% 8 == 0 and <= 256 (got %d) "
                        "and n_heads %d a multiple of n_kv_heads %d\n", hd, n_heads, n_kv_heads);
        abort();
    }
    AttGeom g = att_geom(nb, max_seqs, n_heads, n_kv_heads, hd, cap, batch_inv);
    dim3 grid(g.splits, n_kv_heads * g.n_hgroups, att_max_tiles(nb, g.rows_pb, max_seqs));
    float scale = 1.0f / sqrtf((float)hd);
    CUK_LAUNCH(k_attention, grid, ATT_THREADS, s, q, q_stride, (const bf16 *)kc,
               (const bf16 *)vc, mask, meta, nb, n_heads, n_kv_heads, hd, scale, g, scratch,
               counters, (bf16 *)out_bf16, out_f32);
    LAUNCH_CHECK();
}

extern "C" void cuk_attention(cudaStream_t s, const float *q, int q_stride, const rs_bf16 *kc,
                              const rs_bf16 *vc, const uint64_t *mask, const CuMeta *meta, int nb,
                              int n_heads, int n_kv_heads, int hd, int cap, int batch_inv,
                              float *scratch, unsigned *counters, rs_bf16 *out_bf16,
                              float *out_f32) {
    cuk_attention_paged(s, q, q_stride, kc, vc, mask, meta, nb, 1, n_heads, n_kv_heads, hd, cap,
                        batch_inv, scratch, counters, out_bf16, out_f32);
}
