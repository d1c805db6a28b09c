/* Matrix products of the CPU backend against weights in their stored type (QTensor):
 * Y (n, out) = X (n, in) @ W^T, one output row range at a time so callers can split rows
 * across threads. Kernels come in families, one per instruction set, picked at run time
 * from cpuid (or forced with ROOTSPEC_CPU_KERNELS=ref|scalar|avx2|avx512):
 *   ref     every type dequantized to f32 and multiplied in f32 (the golden tests' path)
 *   scalar  portable C; integer weight types against Q8 activations
 *   avx2    AVX2+FMA+F16C
 *   avx512  AVX-512 F/BW/VL + VNNI: tested natively where the CPU has it, and on AVX2
 *           machines with vpdpbusd emulated (tests/qk_avx512_emu.c); groups of 9 or more
 *           tokens (K-quants 12) of the integer types through cpu_qk_amx.inc's tile
 *           structure with the tile products in 512-bit VNNI registers (QK_VTILE)
 *   amx     avx512 + AMX-INT8 tiles for groups of more than QK_GROUP tokens of every
 *           integer type (cpu_qk_amx.inc; bitwise avx512's results); likewise only
 *           tested with the tile instructions emulated (tests/qk_amx_emu.c)
 * Integer weight types take activations quantized per row: in blocks of 32 (QkQ8, as
 * llama.cpp's Q8_1) for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and, in the portable families, the
 * K-quants (cpu_kquant.h); the x86 families take K-quants against blocks of 256 (QkQ8K, as
 * llama.cpp's Q8_K), so a super-block's sub-block sums add up in integers and meet one
 * float step. F32/F16/BF16 weights take f32 activations. A type without a kernel in a family
 * (every type in "ref") runs through the generic path: its row is dequantized into a
 * scratch row and multiplied by the family's f32 kernel. Adding a type's dot kernel is one
 * entry in its family's table.
 *
 * Batch invariance: out[t] depends on weight row j and activation row t only. Tokens are
 * taken QK_GROUP at a time by one kernel instantiated for 1..QK_GROUP tokens with the same
 * per-token instruction sequence (explicit intrinsics, no reassociation); a family's tile
 * kernel (QK_ROWS weight rows per call, the x86 ones of every integer type) takes every
 * row of the type, short tiles padded, with the same lane operations in every slot. Integer
 * sums are exact, so how a kernel reduces them may depend on the token count (the x86
 * K-quant tiles reduce one token's lanes differently from four's); every float operation
 * may not. So a row's result is bitwise the same whatever n, the group it lands in and the
 * thread split.
 * Attention likewise: a family's attn (FMA lanes on x86) works on one (token, head) with
 * an order fixed by the entries it sees, whatever the batch. */
#ifndef ROOTSPEC_CPU_QMATMUL_H
#define ROOTSPEC_CPU_QMATMUL_H
#include "common/model.h"
#include "common/quant.h"

#define QK_GROUP 4 /* tokens per kernel call */
#define QK_BLOCK 32

/* One activation block: x[i] ~ d * q[i]; s = d * sum(q) (for Q4_0/Q4_1 offsets). */
typedef struct {
    float d, s;
    int8_t q[QK_BLOCK];
} QkQ8;

/* One activation super-block of QK_K (256) elements: x[i] ~ d * q[i]; bsums[j] = the sum
 * of q[16j .. 16j + 16). */
typedef struct {
    float d;
    int16_t bsums[16];
    int8_t q[256];
} QkQ8K;

/* The activation form a kernel takes (QkKernel.act; bits, so a product job can ask for
 * both). */
enum { QK_ACT_F32 = 0, QK_ACT_Q8 = 1, QK_ACT_Q8K = 2 };

/* out[t] = <weight row, x_t> for t < nt (1..QK_GROUP). xs[t] is an f32 row (in), a QkQ8 row
 * (in/32 blocks) or a QkQ8K row (in/256) as the kernel's entry says; wrow is the stored
 * row (any alignment). */
typedef void (*QkDotFn)(const uint8_t *wrow, const void *const *xs, int nt, int in,
                        float *out);

/* ntiles register tiles of QK_ROWS weight rows each: w (ntiles * QK_ROWS) row pointers,
 * out[t * ldo + i * QK_ROWS + r] = <w[i * QK_ROWS + r], x_t> for t < nt. Each (row, token)
 * result must not depend on nt, ntiles, the row's slot or the other rows, so a row's output
 * is the same whichever tile it lands in; callers pad a short tile by repeating a row. Many
 * tiles per call: a one-token pass costs a call, a switch and a store loop per tile
 * otherwise (a tenth of a 576-column product). A family gives each type dot or tile. */
#define QK_ROWS 4
#define QK_CHUNK 16 /* tiles per call at most: their weights stay in L1/L2 across groups */
typedef void (*QkTileFn)(const uint8_t *const *w, int ntiles, const void *const *xs, int nt,
                         int in, float *out, int ldo);

/* The same over x4 tiles (common/quant.h, QTensor.packed): tiles points at the first of
 * ntiles tiles (QK_ROWS rows each); out as QkTileFn. Each output is bitwise the tile
 * kernel's for the same row, so packing changes the speed only. */
typedef void (*QkPackedFn)(const uint8_t *tiles, int ntiles, const void *const *xs, int nt,
                           int in, float *out, int ldo);

typedef struct {
    uint32_t type; /* ggml type id */
    int act;       /* QK_ACT_*: the activation rows xs points to */
    QkDotFn dot;   /* one row at a time, or NULL when tile is given */
    QkTileFn tile;
    int group;     /* tokens per tile call, up to QK_GROUP_MAX (0: QK_GROUP) */
    /* Optional (NULL: a packed matrix's rows are unpacked one at a time for dot or tile,
     * the same bits, slowly): the kernel over x4 tiles, with tile's group. A family that
     * has one for a type gets that type's matrices packed at load (qk_family_packs). */
    QkPackedFn packed;
} QkKernel;
/* Most tokens a kernel's group may be: the AVX-512 float tiles take a prefill chunk or a
 * tree pass of up to this many in one call (their converted rows then serve them all). */
#define QK_GROUP_MAX 128

/* Softmax attention of g consecutive heads of one token that share a KV group: o (g, hd),
 * q (g, hd), the rest as cpu_attention_head (kernels/cpu/cpu_ops.h); att: scratch of g * len
 * floats. Each head's output is bitwise that of the same function with g = 1, so a caller
 * may group the heads of a run however it splits the work. */
typedef void (*QkAttnFn)(float *o, const float *q, const float *kh0, const float *vh0,
                         int kvd, int nc, const int *idx, int len, int hd, int g, float *att);
#define QK_ATT_G 4 /* most heads one QkAttnFn call takes */
/* The same over f16 caches (kh0, vh0: uint16_t rows of kvd): each head's output is bitwise
 * that of QkAttnFn on the rows converted to f32. hd % 8 == 0, hd <= QK_ATT_HD16. */
typedef void (*QkAttn16Fn)(float *o, const float *q, const uint16_t *kh0, const uint16_t *vh0,
                           int kvd, int nc, const int *idx, int len, int hd, int g, float *att);
#define QK_ATT_HD16 256
/* n floats into f16 (round to nearest even), the f16 caches' rows. */
typedef void (*QkToF16Fn)(uint16_t *dst, const float *src, int n);
/* gate[i] = silu(gate[i]) * up[i], each element by the same operations wherever it lies
 * in the range (a tail goes through the vector steps padded), so an element's bits do not
 * depend on how a caller splits the hidden vector. Within a few ulp of cpu_swiglu. */
typedef void (*QkSwigluFn)(float *gate, const float *up, int n);
/* o = w * (x * r), r = 1/sqrt(mean(x^2) + eps), the sum of squares in a fixed lane order:
 * cpu_rmsnorm's operations but for that order (its serial sum is a chain of n dependent
 * adds). o may be x. */
typedef void (*QkRmsnormFn)(float *o, const float *x, const float *w, int n, float eps);
/* x (n, in) -> dst (n, in/32), in % 32 == 0: qk_quantize_rows' bits, faster. */
typedef void (*QkQuantizeFn)(const float *x, int n, int in, QkQ8 *dst);

typedef struct {
    const char *name;
    const QkKernel *kernels; // (n_kernels)
    int n_kernels;
    QkDotFn dot_f32; /* f32 x f32: F32 weights and the generic path's dequantized rows */
    QkAttnFn attn;   /* NULL: cpu_attention_head, the reference loops (qk_attention) */
    /* Optional (NULL: the family's KV caches are f32): attention over f16 caches and the
     * conversion that fills them. Half the bytes a decode step's attention streams. */
    QkAttn16Fn attn_f16;
    QkToF16Fn to_f16;
    /* Optional (NULL: cpu_swiglu / cpu_rmsnorm, the reference's): the elementwise steps of
     * the fast path (qk_swiglu, qk_rmsnorm). */
    QkSwigluFn swiglu;
    QkRmsnormFn rmsnorm;
    QkQuantizeFn quantize; /* NULL: qk_quantize_rows */
} QkFamily;

extern const QkFamily qk_family_ref, qk_family_scalar, qk_family_avx2, qk_family_avx512,
    qk_family_amx;

/* The family named by `name` (ref|scalar|avx2|avx512), or with name NULL/"" the best this
 * CPU runs. NULL with a message naming the value when unknown or not runnable here. */
const QkFamily *qk_family_pick(const char *name, RsErr *e);

/* Activations of one product: f32 rows (n, in) and the quantized forms the weight type's
 * kernel takes (qk_wants_act): q8 (n, in/32) from qk_quantize_rows, q8k (n, in/256) from
 * qk_quantize_k_rows; a form no kernel of the product takes may be NULL. */
typedef struct {
    const float *f32;
    const QkQ8 *q8;
    const QkQ8K *q8k;
    int n, in;
} QkActs;

/* 1 when f has an x4 kernel for `type` (QkKernel.packed): the CPU backend's loads pack
 * such matrices (model_pack_x4). */
int qk_family_packs(const QkFamily *f, uint32_t type);
/* The activation form (QK_ACT_*) weight type `type` takes in family f. */
int qk_wants_act(const QkFamily *f, uint32_t type);
/* x (n, in), in % 32 == 0 -> dst (n, in/32): the portable loops. */
void qk_quantize_rows(const float *x, int n, int in, QkQ8 *dst);
/* The same through f's quantize when it has one (the same bits). */
void qk_quantize(const QkFamily *f, const float *x, int n, int in, QkQ8 *dst);
/* x (n, in), in % 256 == 0 -> dst (n, in/256): d = max|x|/127 per super-block, q rounded
 * as qk_quantize_rows rounds. */
void qk_quantize_k_rows(const float *x, int n, int in, QkQ8K *dst);
/* a->q8 / a->q8k made from a->f32 into q8 / q8k for the forms in `acts` (QK_ACT_* bits;
 * the buffers hold a->n rows), Q8 through qk_quantize(f). */
void qk_acts_quantize(const QkFamily *f, QkActs *a, int acts, QkQ8 *q8, QkQ8K *q8k);
/* y[t * ldy + j] for t < x->n, j in [j0, j1). scratch: (w->cols) floats, for the generic
 * path (one per thread). */
void qk_matmul_rows(const QkFamily *f, const QTensor *w, const QkActs *x, float *y, int ldy,
                    int j0, int j1, float *scratch);
/* f's SwiGLU / RMS norm (QkSwigluFn, QkRmsnormFn), or the reference's when it has none. */
void qk_swiglu(const QkFamily *f, float *gate, const float *up, int n);
void qk_rmsnorm(const QkFamily *f, float *o, const float *x, const float *w, int n, float eps);
/* 1 when f keeps KV caches of head size hd in f16: it has attn_f16, the head fits that
 * kernel, and f32 (BackendSwitches.cpu_kv_f32) is not asked for. */
int qk_kv_f16(const QkFamily *f, int hd, int f32);
/* Attention of g heads over f32 caches (half 0: float rows) or f16 ones (half 1, as
 * qk_kv_f16 chose: uint16_t rows): f's kernel, or the reference loops head by head when it
 * has none; any g >= 1 (calls of at most QK_ATT_G heads). */
void qk_attention(const QkFamily *f, int half, float *o, const float *q, const void *kh0,
                  const void *vh0, int kvd, int nc, const int *idx, int len, int hd, int g,
                  float *att);

#endif
