/* Dequantization of the ggml tensor types rootspec accepts (QUANT_SUPPORTED_NAMES), plus
 * the geometry table of every ggml type so the GGUF parser can bounds-check tensors it
 * will later refuse. Reads go through memcpy/byte loads: block fields are
 * only 2-byte aligned inside a mapping and UBSan rejects misaligned loads. */
#include "quant.h"
#include "util.h"
#include <string.h>

typedef struct {
    uint32_t id;
    const char *name;
    uint16_t block_elems, block_bytes;
} TypeInfo;

/* From gguf-py's GGML_QUANT_SIZES (gguf 0.19). */
static const TypeInfo TYPES[] = {
    {0, "F32", 1, 4},         {1, "F16", 1, 2},          {2, "Q4_0", 32, 18},
    {3, "Q4_1", 32, 20},      {6, "Q5_0", 32, 22},       {7, "Q5_1", 32, 24},
    {8, "Q8_0", 32, 34},      {9, "Q8_1", 32, 40},       {10, "Q2_K", 256, 84},
    {11, "Q3_K", 256, 110},   {12, "Q4_K", 256, 144},    {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},   {15, "Q8_K", 256, 292},    {16, "IQ2_XXS", 256, 66},
    {17, "IQ2_XS", 256, 74},  {18, "IQ3_XXS", 256, 98},  {19, "IQ1_S", 256, 50},
    {20, "IQ4_NL", 32, 18},   {21, "IQ3_S", 256, 110},   {22, "IQ2_S", 256, 82},
    {23, "IQ4_XS", 256, 136}, {24, "I8", 1, 1},          {25, "I16", 1, 2},
    {26, "I32", 1, 4},        {27, "I64", 1, 8},         {28, "F64", 1, 8},
    {29, "IQ1_M", 256, 56},   {30, "BF16", 1, 2},        {34, "TQ1_0", 256, 54},
    {35, "TQ2_0", 256, 66},   {39, "MXFP4", 32, 17},
};

static const TypeInfo *type_info(uint32_t type) {
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++)
        if (TYPES[i].id == type) return &TYPES[i];
    return NULL;
}

int quant_type_geometry(uint32_t type, size_t *block_elems, size_t *block_bytes) {
    const TypeInfo *t = type_info(type);
    if (!t) return -1;
    *block_elems = t->block_elems;
    *block_bytes = t->block_bytes;
    return 0;
}

const char *quant_type_name(uint32_t type) {
    const TypeInfo *t = type_info(type);
    return t ? t->name : NULL;
}

int quant_type_supported(uint32_t type) {
    return type == QT_F32 || type == QT_F16 || type == QT_BF16 || type == QT_Q8_0 ||
           type == QT_Q4_0 || type == QT_Q4_1 || type == QT_Q5_0 || type == QT_Q5_1 ||
           type == QT_Q4_K || type == QT_Q5_K || type == QT_Q6_K;
}

static inline float bits_to_f32(uint32_t b) {
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

float quant_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24, exact in f32 */
        float f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    if (exp == 31) return bits_to_f32(sign | 0x7f800000u | (man << 13));
    return bits_to_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

float quant_bf16_to_f32(uint16_t h) { return bits_to_f32((uint32_t)h << 16); }

static inline uint32_t f32_to_bits(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

/* Round to nearest, ties to even, as F16C's vcvtps2ph with rounding mode 0: overflow goes
 * to infinity, values below 2^-14 to subnormals, NaNs stay quiet NaNs. */
uint16_t quant_f32_to_f16(float f) {
    uint32_t x = f32_to_bits(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520: rounds past 65504 */
    if (ax <= 0x33000000u) return (uint16_t)sign;             /* <= 2^-25: rounds to zero */
    uint32_t q, rem, half;
    if (ax < 0x38800000u) { /* subnormal: round(m * 2^(e - 126)) */
        uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u, shift = 126u - e;
        q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    } else { /* normal: rebias the exponent (127 - 15), drop 13 mantissa bits */
        uint32_t r = ax - 0x38000000u;
        q = r >> 13, rem = r & 0x1fffu, half = 0x1000u;
    }
    if (rem > half || (rem == half && (q & 1u))) q++; /* a carry moves into the exponent */
    return (uint16_t)(sign | q);
}

uint16_t quant_f32_to_bf16(float f) {
    uint32_t x = f32_to_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* The K-quant expansions below round exactly as ggml's dequantize_row_* and gguf-py do:
 * (d * scale) first, then times q, then minus (dmin * min), each an f32 operation. That
 * relies on no fused multiply-add contraction (GCC's default under -std=c11). */

/* Q4_K / Q5_K (qh == NULL for Q4_K): each 64 elements are two 32-element sub-blocks, the
 * low then the high nibbles of 32 qs bytes; Q5_K's fifth bit of sub-block s is bit s of
 * qh[l]. */
static void deq_q45_K(const uint8_t *p, float *y, size_t nb, int five) {
    size_t bb = five ? QK5_K_BYTES : QK4_K_BYTES;
    for (size_t b = 0; b < nb; b++, p += bb) {
        float d = quant_f16_to_f32(rd16(p)), dmin = quant_f16_to_f32(rd16(p + 2));
        const uint8_t *sc = p + 4, *qh = five ? p + 16 : NULL, *qs = p + (five ? 48 : 16);
        for (int s = 0; s < 8; s++, y += 32) {
            uint8_t scale, min;
            quant_k4_scale_min(s, sc, &scale, &min);
            float dl = d * (float)scale, ml = dmin * (float)min;
            const uint8_t *q = qs + (s / 2) * 32;
            for (int l = 0; l < 32; l++) {
                int v = s % 2 ? q[l] >> 4 : q[l] & 0x0f;
                if (qh) v |= ((qh[l] >> s) & 1) << 4;
                y[l] = dl * (float)v - ml;
            }
        }
    }
}

/* Q6_K: 128-element halves; within one, ql[l] low/high nibbles and ql[l+32] give the four
 * 32-runs, qh[l] bits 0-1/2-3/4-5/6-7 their top two bits; one int8 scale per 16. */
static void deq_q6_K(const uint8_t *p, float *y, size_t nb) {
    for (size_t b = 0; b < nb; b++, p += QK6_K_BYTES) {
        float d = quant_f16_to_f32(rd16(p + 208));
        const uint8_t *ql = p, *qh = p + 128;
        const int8_t *sc = (const int8_t *)(p + 192);
        for (int h = 0; h < 2; h++, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = ((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * (float)sc[is + 0] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
    }
}

/* Q5_0 / Q5_1 blocks: element j's fifth bit is bit j of qh (little-endian u32), above the
 * low (j < 16) or high nibble of qs[j % 16]. */
static void deq_q5(const uint8_t *p, float *dst, size_t nb, int one) {
    size_t bytes = one ? 24 : 22;
    for (size_t b = 0; b < nb; b++, p += bytes, dst += 32) {
        float d = quant_f16_to_f32(rd16(p)), m = one ? quant_f16_to_f32(rd16(p + 2)) : 0.0f;
        const uint8_t *h = p + (one ? 4 : 2), *qs = h + 4;
        uint32_t qh = quant_le32(h);
        for (int j = 0; j < 16; j++) {
            int q0 = (qs[j] & 0x0f) | (int)((qh >> j) & 1) << 4;
            int q1 = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            dst[j] = one ? d * (float)q0 + m : d * (float)(q0 - 16);
            dst[j + 16] = one ? d * (float)q1 + m : d * (float)(q1 - 16);
        }
    }
}

void quant_dequantize(uint32_t type, const void *src, float *dst, size_t n) {
    const uint8_t *p = src;
    switch (type) {
    case QT_F32:
        memcpy(dst, p, n * sizeof(float));
        return;
    case QT_F16:
        for (size_t i = 0; i < n; i++) dst[i] = quant_f16_to_f32(rd16(p + 2 * i));
        return;
    case QT_BF16:
        for (size_t i = 0; i < n; i++) dst[i] = quant_bf16_to_f32(rd16(p + 2 * i));
        return;
    case QT_Q8_0: /* { f16 d; int8 qs[32]; } */
        RS_ASSERT(n % 32 == 0);
        for (size_t b = 0; b < n / 32; b++, p += 34, dst += 32) {
            float d = quant_f16_to_f32(rd16(p));
            const int8_t *qs = (const int8_t *)(p + 2);
            for (int j = 0; j < 32; j++) dst[j] = d * (float)qs[j];
        }
        return;
    case QT_Q4_0: /* { f16 d; u8 qs[16]; }: low nibbles are elements 0..15, high 16..31 */
        RS_ASSERT(n % 32 == 0);
        for (size_t b = 0; b < n / 32; b++, p += 18, dst += 32) {
            float d = quant_f16_to_f32(rd16(p));
            const uint8_t *qs = p + 2;
            for (int j = 0; j < 16; j++) {
                dst[j] = d * (float)((int)(qs[j] & 0x0f) - 8);
                dst[j + 16] = d * (float)((int)(qs[j] >> 4) - 8);
            }
        }
        return;
    case QT_Q4_1: /* { f16 d; f16 m; u8 qs[16]; }: x = d*q + m */
        RS_ASSERT(n % 32 == 0);
        for (size_t b = 0; b < n / 32; b++, p += 20, dst += 32) {
            float d = quant_f16_to_f32(rd16(p)), m = quant_f16_to_f32(rd16(p + 2));
            const uint8_t *qs = p + 4;
            for (int j = 0; j < 16; j++) {
                dst[j] = d * (float)(qs[j] & 0x0f) + m;
                dst[j + 16] = d * (float)(qs[j] >> 4) + m;
            }
        }
        return;
    case QT_Q5_0: /* { f16 d; u8 qh[4]; u8 qs[16]; }: x = d*(q - 16) */
    case QT_Q5_1: /* { f16 d; f16 m; u8 qh[4]; u8 qs[16]; }: x = d*q + m */
        RS_ASSERT(n % 32 == 0);
        deq_q5(p, dst, n / 32, type == QT_Q5_1);
        return;
    case QT_Q4_K:
    case QT_Q5_K:
        RS_ASSERT(n % QK_K == 0);
        deq_q45_K(p, dst, n / QK_K, type == QT_Q5_K);
        return;
    case QT_Q6_K:
        RS_ASSERT(n % QK_K == 0);
        deq_q6_K(p, dst, n / QK_K);
        return;
    default:
        RS_ASSERT(!"quant_dequantize: unsupported type");
    }
}

/* ---- the x4 layout (quant.h) ---- */

/* How a block field lies in a group of h blocks of the 4 rows (X4_*: quant.h's layout). */
enum {
    X4_SCALE, /* 2 bytes: block-major, [block][row] */
    X4_LANE4, /* 4-bit quants, lane-major (quant.h) */
    X4_LANE8, /* 8-bit quants, lane-major */
    X4_LANEH, /* Q5's fifth bits as bit planes of the lane-major nibbles */
};

typedef struct {
    uint8_t off, size, how;
} X4Field;

typedef struct {
    int n_fields, group; /* blocks per group */
    size_t block_bytes;
    X4Field f[4];
} X4Layout;

static int x4_layout(uint32_t type, X4Layout *L) {
    static const X4Layout q4_0 = {2, 2, 18, {{0, 2, X4_SCALE}, {2, 16, X4_LANE4}}};
    static const X4Layout q4_1 = {3, 2, 20, {{0, 2, X4_SCALE}, {2, 2, X4_SCALE}, {4, 16, X4_LANE4}}};
    static const X4Layout q5_0 = {3, 2, 22, {{0, 2, X4_SCALE}, {2, 4, X4_LANEH}, {6, 16, X4_LANE4}}};
    static const X4Layout q5_1 = {
        4, 2, 24, {{0, 2, X4_SCALE}, {2, 2, X4_SCALE}, {4, 4, X4_LANEH}, {8, 16, X4_LANE4}}};
    static const X4Layout q8_0 = {2, 1, 34, {{0, 2, X4_SCALE}, {2, 32, X4_LANE8}}};
    switch (type) {
    case QT_Q4_0: *L = q4_0; return 1;
    case QT_Q4_1: *L = q4_1; return 1;
    case QT_Q5_0: *L = q5_0; return 1;
    case QT_Q5_1: *L = q5_1; return 1;
    case QT_Q8_0: *L = q8_0; return 1;
    default: return 0;
    }
}

static int is_k(uint32_t type) { return type == QT_Q4_K || type == QT_Q5_K || type == QT_Q6_K; }

int quant_x4_ok(uint32_t type) {
    X4Layout L;
    return is_k(type) || x4_layout(type, &L);
}

/* Where block j's group starts in a tile (*h: its block count, *i: j's place in it) and,
 * inside the group, where field k starts: the fields follow one another, 4h entries
 * each. */
static size_t x4_field(const X4Layout *L, size_t nb, int k, size_t j, size_t *h, size_t *i) {
    size_t g0 = j / (size_t)L->group * (size_t)L->group;
    *h = nb - g0 < (size_t)L->group ? nb - g0 : (size_t)L->group;
    *i = j - g0;
    size_t off = QUANT_X4_ROWS * g0 * L->block_bytes;
    for (int q = 0; q < k; q++) off += QUANT_X4_ROWS * *h * L->f[q].size;
    return off;
}

/* A lane-major quant field of block i of a group of h, row r (quant.h): fld, the stored
 * block's qs, to or from the group's field at g. Lane L = r + 4i (4-bit) or r + 4s (8-bit,
 * half s) takes bytes 4L .. 4L + 3 of every vector, so the products of one vector's lane
 * all belong to one (row, block) or (row, half block). */
static void x4_lane(int how, size_t h, size_t i, int r, uint8_t *fld, uint8_t *g, int to_tile) {
    if (how == X4_LANEH) { /* byte 4L + c, bit v: the fifth bit of element 4v + c */
        uint32_t qh = quant_le32(fld), back = 0;
        for (int c = 0; c < 4; c++) {
            uint8_t *t = g + 4 * ((size_t)r + 4 * i) + c;
            if (to_tile) {
                int byte = 0;
                for (int v = 0; v < 8; v++) byte |= (int)((qh >> (4 * v + c)) & 1) << v;
                *t = (uint8_t)byte;
            } else {
                for (int v = 0; v < 8; v++) back |= (uint32_t)((*t >> v) & 1) << (4 * v + c);
            }
        }
        if (!to_tile)
            for (int b = 0; b < 4; b++) fld[b] = (uint8_t)(back >> (8 * b));
        return;
    }
    if (how == X4_LANE8) {
        for (int s = 0; s < 2; s++)
            for (int k = 0; k < 4; k++) {
                uint8_t *t = g + 32 * k + 4 * (r + 4 * s), *q = fld + 16 * s + 4 * k;
                if (to_tile) memcpy(t, q, 4);
                else memcpy(q, t, 4);
            }
        return;
    }
    uint8_t q[32]; /* the block's elements; stored: byte e % 16, nibble e / 16 */
    uint8_t *lane = g + 4 * ((size_t)r + 4 * i);
    if (to_tile)
        for (int e = 0; e < 16; e++) q[e] = fld[e] & 15, q[e + 16] = fld[e] >> 4;
    for (int k = 0; k < 4; k++) /* elements 8k + c (low nibble), 8k + 4 + c (high) */
        for (int c = 0; c < 4; c++) {
            uint8_t *t = lane + 16 * h * (size_t)k + c;
            if (to_tile) *t = (uint8_t)(q[8 * k + c] | q[8 * k + 4 + c] << 4);
            else q[8 * k + c] = *t & 15, q[8 * k + 4 + c] = *t >> 4;
        }
    if (!to_tile)
        for (int e = 0; e < 16; e++) fld[e] = (uint8_t)(q[e] | q[e + 16] << 4);
}

/* Field k (at g in its group of h blocks) of the group's block i, row r, to or from the
 * stored block blk (to_tile: blk -> g; else g -> blk, whose quant bytes the caller
 * zeroed). */
static void x4_move(const X4Field *f, uint8_t *g, size_t h, size_t i, int r, uint8_t *blk,
                    int to_tile) {
    uint8_t *fld = blk + f->off;
    if (f->how != X4_SCALE) {
        x4_lane(f->how, h, i, r, fld, g, to_tile);
        return;
    }
    size_t slot = i * QUANT_X4_ROWS + (size_t)r;
    if (to_tile) memcpy(g + slot * f->size, fld, f->size);
    else memcpy(fld, g + slot * f->size, f->size);
}

/* ---- the x4 layout of the K-quants (quant.h) ----
 * A super-block's fields as plain values: the f16 scales' bytes, the sub-block scales
 * (Q4_K / Q5_K: sc[0..8) and the minimums at sc[8..16), 6 bits each; Q6_K: 16 i8) and the
 * 256 unsigned quants (Q4_K 4 bits, Q5_K 5, Q6_K 6). */
typedef struct {
    uint8_t d[2], dmin[2];
    uint8_t sc[16];
    uint8_t q[QK_K];
} KVals;

/* A stored super-block (ggml's dequantize_row_q*_K order) as values. */
static void k_decode(uint32_t type, const uint8_t *b, KVals *v) {
    if (type == QT_Q6_K) { /* element 128h + 32k + l: ql[64h + l + 32(k & 1)] nibble k >> 1, qh[32h + l] bits 2k */
        for (int e = 0; e < QK_K; e++) {
            int h = e / 128, k = e % 128 / 32, l = e % 32;
            v->q[e] = (uint8_t)(((b[64 * h + l + 32 * (k & 1)] >> (4 * (k >> 1))) & 15) |
                                ((b[128 + 32 * h + l] >> (2 * k)) & 3) << 4);
        }
        memcpy(v->sc, b + 192, 16);
        memcpy(v->d, b + 208, 2);
        return;
    }
    int five = type == QT_Q5_K;
    const uint8_t *qs = b + (five ? 48 : 16);
    memcpy(v->d, b, 2);
    memcpy(v->dmin, b + 2, 2);
    for (int j = 0; j < 8; j++) quant_k4_scale_min(j, b + 4, &v->sc[j], &v->sc[8 + j]);
    for (int e = 0; e < QK_K; e++) { /* sub-block j = e / 32: pair j / 2, nibble j & 1 */
        int j = e / 32, i = e % 32;
        v->q[e] = (uint8_t)((qs[32 * (j / 2) + i] >> (4 * (j & 1))) & 15);
        if (five) v->q[e] |= (uint8_t)(((b[16 + i] >> j) & 1) << 4);
    }
}

/* k_decode's inverse. */
static void k_encode(uint32_t type, const KVals *v, uint8_t *b) {
    if (type == QT_Q6_K) {
        memset(b, 0, 192);
        for (int e = 0; e < QK_K; e++) {
            int h = e / 128, k = e % 128 / 32, l = e % 32;
            b[64 * h + l + 32 * (k & 1)] |= (uint8_t)((v->q[e] & 15) << (4 * (k >> 1)));
            b[128 + 32 * h + l] |= (uint8_t)((v->q[e] >> 4) << (2 * k));
        }
        memcpy(b + 192, v->sc, 16);
        memcpy(b + 208, v->d, 2);
        return;
    }
    int five = type == QT_Q5_K;
    uint8_t *qs = b + (five ? 48 : 16), *s = b + 4;
    memcpy(b, v->d, 2);
    memcpy(b + 2, v->dmin, 2);
    for (int j = 0; j < 4; j++) { /* quant_k4_scale_min's inverse */
        s[j] = (uint8_t)(v->sc[j] | (v->sc[j + 4] >> 4) << 6);
        s[j + 4] = (uint8_t)(v->sc[8 + j] | (v->sc[12 + j] >> 4) << 6);
        s[j + 8] = (uint8_t)((v->sc[j + 4] & 15) | (v->sc[12 + j] & 15) << 4);
    }
    memset(qs, 0, 128);
    if (five) memset(b + 16, 0, 32);
    for (int e = 0; e < QK_K; e++) {
        int j = e / 32, i = e % 32;
        qs[32 * (j / 2) + i] |= (uint8_t)((v->q[e] & 15) << (4 * (j & 1)));
        if (five) b[16 + i] |= (uint8_t)(((v->q[e] >> 4) & 1) << j);
    }
}

/* Bits [sh, sh + n) of *p set to *val (to_tile) or read into *val. */
static void k_bits(uint8_t *p, int sh, int n, uint8_t *val, int to_tile) {
    uint8_t m = (uint8_t)(((1 << n) - 1) << sh);
    if (to_tile) *p = (uint8_t)((*p & ~m) | ((*val << sh) & m));
    else *val = (uint8_t)((*p & m) >> sh);
}

/* Row r's quants in a tile super-block's lane-major fields (quant.h): the low nibbles at
 * nib, the bits above them at hi (Q5_K: planes of one bit, Q6_K: of two; NULL: none). */
static void k_lanes(uint32_t type, uint8_t *nib, uint8_t *hi, int r, KVals *v, int to_tile) {
    for (int e = 0; e < QK_K; e++) {
        int g = e / 64, i = e % 64 / 32, c = e % 4, vec = e % 32 / 4, L = r + 4 * i;
        uint8_t lo = v->q[e] & 15, up = v->q[e] >> 4;
        k_bits(nib + 128 * g + 32 * (vec / 2) + 4 * L + c, 4 * (vec & 1), 4, &lo, to_tile);
        if (type == QT_Q5_K) k_bits(hi + 32 * g + 4 * L + c, vec, 1, &up, to_tile);
        if (type == QT_Q6_K) k_bits(hi + 64 * g + 32 * (vec / 4) + 4 * L + c, 2 * (vec % 4), 2, &up, to_tile);
        if (!to_tile) v->q[e] = (uint8_t)(lo | up << 4);
    }
}

/* Row r's sub-block scales in a tile super-block: Q6_K's i8 at sp, [pair][32-block of
 * it][16-block of that][row]; Q4_K / Q5_K's 6-bit ones as 32 bytes of low nibbles and 16
 * of the top two bits (quant.h). */
static void k_scales(uint32_t type, uint8_t *sp, int r, KVals *v, int to_tile) {
    if (type == QT_Q6_K) {
        for (int j = 0; j < 16; j++) { /* 16-block j: 32-block j / 2 = 2p + half, sub j & 1 */
            int b32 = j / 2, p = b32 / 2, half = b32 % 2;
            uint8_t *q = sp + 16 * p + 8 * half + 4 * (j & 1) + r;
            if (to_tile) *q = v->sc[j];
            else v->sc[j] = *q;
        }
        return;
    }
    for (int k = 0; k < 32; k++) {
        int srow = k % 4, sj = 2 * (k % 16 / 4) + k / 16;                          /* scale */
        int L = k % 16 / 2, mrow = L % 4, mj = 4 * (k / 16) + 2 * (L / 4) + k % 2; /* minimum */
        uint8_t *hb = sp + 32 + k % 16;
        int up = k / 16 ? 2 : 0;
        if (srow == r) {
            uint8_t lo = v->sc[sj] & 15, top = v->sc[sj] >> 4;
            k_bits(sp + k, 0, 4, &lo, to_tile);
            k_bits(hb, up, 2, &top, to_tile);
            if (!to_tile) v->sc[sj] = (uint8_t)(lo | top << 4);
        }
        if (mrow == r) {
            uint8_t lo = v->sc[8 + mj] & 15, top = v->sc[8 + mj] >> 4;
            k_bits(sp + k, 4, 4, &lo, to_tile);
            k_bits(hb, 4 + up, 2, &top, to_tile);
            if (!to_tile) v->sc[8 + mj] = (uint8_t)(lo | top << 4);
        }
    }
}

/* Row r of tile super-block s to or from v. */
static void k_place(uint32_t type, uint8_t *s, int r, KVals *v, int to_tile) {
    uint8_t *d = s + 2 * r;
    if (to_tile) memcpy(d, v->d, 2);
    else memcpy(v->d, d, 2);
    if (type == QT_Q6_K) {
        k_scales(type, s + 8, r, v, to_tile);
        k_lanes(type, s + 72, s + 584, r, v, to_tile);
        return;
    }
    if (to_tile) memcpy(s + 8 + 2 * r, v->dmin, 2);
    else memcpy(v->dmin, s + 8 + 2 * r, 2);
    k_scales(type, s + 16, r, v, to_tile);
    int five = type == QT_Q5_K;
    k_lanes(type, s + 64 + (five ? 128 : 0), five ? s + 64 : NULL, r, v, to_tile);
}

static size_t k_bytes(uint32_t type) {
    return type == QT_Q4_K ? QK4_K_BYTES : type == QT_Q5_K ? QK5_K_BYTES : QK6_K_BYTES;
}

void quant_x4_pack(uint32_t type, size_t cols, const uint8_t *const *rows, uint8_t *tile) {
    X4Layout L;
    if (is_k(type)) {
        RS_ASSERT(cols % QK_K == 0);
        size_t sb = QUANT_X4_ROWS * k_bytes(type);
        for (size_t j = 0; j < cols / QK_K; j++) {
            memset(tile + j * sb, 0, sb);
            for (int r = 0; r < QUANT_X4_ROWS; r++) {
                KVals v;
                k_decode(type, rows[r] + j * k_bytes(type), &v);
                k_place(type, tile + j * sb, r, &v, 1);
            }
        }
        return;
    }
    RS_ASSERT(x4_layout(type, &L) && cols % 32 == 0);
    size_t nb = cols / 32, G = (size_t)L.group;
    for (size_t g0 = 0; g0 < nb; g0 += G) {
        size_t h, first, off = x4_field(&L, nb, 0, g0, &h, &first); /* first: 0 */
        for (int k = 0; k < L.n_fields; off += QUANT_X4_ROWS * h * L.f[k].size, k++)
            for (size_t i = 0; i < h; i++)
                for (int r = 0; r < QUANT_X4_ROWS; r++)
                    x4_move(&L.f[k], tile + off, h, i, r,
                            (uint8_t *)(uintptr_t)(rows[r] + (g0 + i) * L.block_bytes), 1);
    }
}

void quant_x4_block(uint32_t type, size_t cols, const uint8_t *tile, int r, size_t j,
                    uint8_t *out) {
    X4Layout L;
    if (is_k(type)) {
        RS_ASSERT(cols % QK_K == 0 && j < cols / QK_K && r >= 0 && r < QUANT_X4_ROWS);
        KVals v = {0};
        k_place(type, (uint8_t *)(uintptr_t)tile + j * QUANT_X4_ROWS * k_bytes(type), r, &v, 0);
        k_encode(type, &v, out);
        return;
    }
    RS_ASSERT(x4_layout(type, &L) && cols % 32 == 0 && r >= 0 && r < QUANT_X4_ROWS);
    size_t nb = cols / 32, h, i;
    memset(out, 0, L.block_bytes);
    for (int k = 0; k < L.n_fields; k++) {
        size_t off = x4_field(&L, nb, k, j, &h, &i);
        x4_move(&L.f[k], (uint8_t *)(uintptr_t)tile + off, h, i, r, out, 0);
    }
}
