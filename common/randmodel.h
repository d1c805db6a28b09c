/* Random-weight models named by a spec instead of a file: "random:PRESET[,key=value...]",
 * e.g. "random:llama3-8b" (Llama-3.1-8B shape), "random:llama3-1b" (Llama-3.2-1B shape),
 * "random:tiny,seed=7". They let the two-process pipeline be timed on GPU machines that
 * have no model files and no network: the CUDA backend makes the weights on the device
 * (no host copy), the CPU backend gets the same weights materialised in f32 on the host
 * (QT_F32 matrices over the arena).
 *
 * One definition of the weights serves both backends: every tensor, in the order
 * model_random_walk() lists them, is filled with rs_rand_value(tseed, i, scale, base) =
 * base + scale * rs_rand_unit(tseed, i), tseed = rs_rand_tensor_seed(model seed, tensor id).
 * Both are header-inline functions so the CUDA kernels call this very code (RS_HOSTDEV).
 * A random model has no tokenizer (tokenizer_load_model gives NULL, tokenizer_identity
 * covers it): prompts are token ids (--prompt-ids) and output is ids (--output-ids). */
#ifndef ROOTSPEC_RANDMODEL_H
#define ROOTSPEC_RANDMODEL_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
#include "util.h" /* RS_HOSTDEV */
#ifdef __cplusplus
}
#endif

/* splitmix64 finaliser of (seed, i): counter based, so a value depends on its index only,
 * never on launch shape or thread count. Returns U(-sqrt3, sqrt3) (unit variance) with 24
 * random bits. */
static inline RS_HOSTDEV float rs_rand_unit(uint64_t seed, uint64_t i) {
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + i * 0xbf58476d1ce4e5b9ull + 1;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    float u = (float)(z >> 40) * (1.0f / 16777216.0f); /* [0, 1) */
    return (2.0f * u - 1.0f) * 1.7320508f;
}

/* base + scale * rs_rand_unit(seed, i), rounded twice (product, then sum) on the device as
 * on the host: nvcc contracts a*b+c into one fma by default (one rounding), which would make
 * a GPU norm weight (base 1) differ from the CPU backend's copy in the last bit. (The fma
 * nvcc forms in rs_rand_unit, 2u - 1, is exact: 2u is.) */
static inline RS_HOSTDEV float rs_rand_value(uint64_t seed, uint64_t i, float scale, float base) {
    float r = rs_rand_unit(seed, i);
#if defined(__CUDA_ARCH__)
    return __fadd_rn(base, __fmul_rn(scale, r));
#else
    return base + scale * r;
#endif
}

static inline RS_HOSTDEV uint64_t rs_rand_tensor_seed(uint64_t model_seed, uint64_t tensor_id) {
    return model_seed * 1000003ull + tensor_id;
}

#ifdef __cplusplus
extern "C" {
#endif
#include "model.h"

#define RANDOM_MODEL_PREFIX "random:"
/* Host arrays for the CPU backend are refused above this (use the CUDA backend). */
#define RANDOM_MODEL_HOST_LIMIT ((size_t)8 << 30)

typedef enum {
    RT_WQ, RT_WK, RT_WV, RT_WO, RT_W_GATE, RT_W_UP, RT_W_DOWN, RT_ATTN_NORM, RT_FFN_NORM,
    RT_BQ, RT_BK, RT_BV, RT_Q_NORM, RT_K_NORM, RT_TOK_EMBEDDINGS, RT_WCLS, RT_FINAL_NORM
} RandTensorKind;

typedef struct {
    RandTensorKind kind;
    int layer;          /* -1 for embeddings, head and final norm */
    size_t n;           /* elements */
    float scale, base;  /* value = rs_rand_value(seed, i, scale, base) */
    uint64_t seed;      /* rs_rand_tensor_seed(model seed, 1-based position in the walk) */
} RandTensor;

/* 1 when path names a random model ("random:..."). */
int model_path_is_random(const char *path);
/* Parses "random:PRESET[,key=value...]" into a Model with a Config and no weights
 * (random_weights = 1, arena NULL). Keys: seed, layers, vocab, arch (llama|qwen2|qwen3),
 * tied (0|1). Errors (RS_EINVAL) name the offending part and list the presets. */
int model_random_load(const char *spec, Model **out, RsErr *e);
/* Calls fn for every tensor of c in the canonical order (see above). */
void model_random_walk(const Config *c, uint64_t seed, void (*fn)(void *u, const RandTensor *t),
                       void *u);
/* Where the walk's tensor t lives in w (w->layers must have the walk's layer count): a
 * vector's arena pointer (*vec) or a matrix's descriptor (*mat); the other gets NULL. */
void model_weight_slot(Weights *w, const RandTensor *t, float ***vec, QTensor **mat);
/* (rows, cols) of the walk's matrix kind under c; 0 rows for a vector kind. */
void model_weight_shape(const Config *c, RandTensorKind kind, int *rows, int *cols);
/* Fills f32 host weights (arena) for a random model; RS_ENOMEM with the size when it would
 * exceed RANDOM_MODEL_HOST_LIMIT. No-op when already materialised. */
int model_random_materialize(Model *m, RsErr *e);

#ifdef __cplusplus
}
#endif
#endif
