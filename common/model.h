/* Model description shared by loaders and backends: Config (hyper-parameters), Weights
 * (matrices in their stored type: QTensor; norm vectors and biases f32) and Model (owns the
 * memory). Loaders: GGUF v3 (common/gguf.c) and Hugging Face directories (common/hf.c);
 * model_load() picks by path. */
#ifndef ROOTSPEC_MODEL_H
#define ROOTSPEC_MODEL_H
#include "util.h"

typedef enum { ARCH_LLAMA = 0, ARCH_QWEN2 = 1, ARCH_QWEN3 = 2 } Arch;

typedef struct {
    Arch arch;
    int dim;          /* model width (hidden_size) */
    int hidden_dim;   /* MLP width (intermediate_size) */
    int n_layers;
    int n_heads;      /* query heads */
    int n_kv_heads;   /* key/value heads (GQA) */
    int head_dim;     /* usually dim / n_heads; Qwen3 may differ */
    int vocab_size;
    int max_seq_len;  /* context length the model was trained for (informational) */
    float norm_eps;   /* RMSNorm epsilon */
    float rope_theta;
    /* Llama-3 rope scaling ("rope_type": "llama3"); rope_scaling == 0 means none. */
    int rope_scaling;
    float rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_orig_max_pos;
    int tied_embeddings; /* output head shares tok_embeddings */
    int has_qkv_bias;    /* Qwen2 */
    int has_qk_norm;     /* Qwen3: per-head RMSNorm on q and k before RoPE */
    int bos_id, eos_id;  /* -1 when unknown */
} Config;

/* The sizes a backend cuts its buffers and launches to, in the short names its code uses,
 * derived from Config in one place so that no backend works out a q or kv width its own
 * way. Plain C, so the CUDA sources (C++) include it too. */
typedef struct {
    int dim;    /* model width */
    int hd;     /* head size */
    int nh;     /* query heads */
    int nkv;    /* key/value heads */
    int qd;     /* nh * hd: a row of q, and the input width of wo */
    int kvd;    /* nkv * hd: a row of k or v in the cache */
    int qkv_w;  /* qd + 2 * kvd: a row of the concatenated q|k|v projection */
    int hidden; /* MLP width */
    int vocab;
    int nl;     /* layers */
} ModelDims;

static inline ModelDims model_dims(const Config *c) {
    ModelDims d;
    d.dim = c->dim;
    d.hd = c->head_dim;
    d.nh = c->n_heads;
    d.nkv = c->n_kv_heads;
    d.qd = c->n_heads * c->head_dim;
    d.kvd = c->n_kv_heads * c->head_dim;
    d.qkv_w = d.qd + 2 * d.kvd;
    d.hidden = c->hidden_dim;
    d.vocab = c->vocab_size;
    d.nl = c->n_layers;
    return d;
}

/* A weight matrix in the type it is stored in (a GGUF mapping, a safetensors mapping or an
 * f32 arena), never expanded: the CPU kernels read it as is, so a token streams the file's
 * bytes, not a 4x larger f32 copy. Logical row j (the Hugging Face row) is stored at
 * qtensor_row(t, j): GGUF llama q/k matrices keep llama.cpp's per-head interleaved row
 * order (perm_hd = head_dim), which the lookup undoes, so RoPE stays rotate-half. */
typedef struct {
    uint32_t type;     /* ggml type id (common/quant.h) */
    const void *data;  // (rows, row_bytes), NULL when absent
    int rows, cols;    /* (out_features, in_features) */
    size_t row_bytes;  /* stored bytes of one row */
    int perm_hd;       /* 0, or the head size of a GGUF llama q/k row interleave */
    /* 1: rows in logical order four at a time in x4 tiles (common/quant.h; model_pack_x4 in kernels/cpu/x86/x4_pack.h):
     * row j lies in the tile at data + (j / 4) * 4 * row_bytes, not at qtensor_row. */
    int packed;
} QTensor;

/* One transformer block. All matrices row-major (out_features, in_features), the
 * Hugging Face layout (see QTensor for GGUF q/k). */
typedef struct {
    float *attn_norm; // (dim)
    QTensor wq;       // (n_heads*head_dim, dim)
    QTensor wk;       // (n_kv_heads*head_dim, dim)
    QTensor wv;       // (n_kv_heads*head_dim, dim)
    QTensor wo;       // (dim, n_heads*head_dim)
    float *bq;        // (n_heads*head_dim) or NULL
    float *bk;        // (n_kv_heads*head_dim) or NULL
    float *bv;        // (n_kv_heads*head_dim) or NULL
    float *q_norm;    // (head_dim) or NULL
    float *k_norm;    // (head_dim) or NULL
    float *ffn_norm;  // (dim)
    QTensor w_gate;   // (hidden_dim, dim)
    QTensor w_up;     // (hidden_dim, dim)
    QTensor w_down;   // (dim, hidden_dim)
} LayerWeights;

typedef struct {
    QTensor tok_embeddings; // (vocab_size, dim)
    LayerWeights *layers;   // (n_layers)
    float *final_norm;      // (dim)
    QTensor wcls;           // (vocab_size, dim); same data as tok_embeddings when tied
} Weights;

typedef enum { TOKSRC_NONE = 0, TOKSRC_GGUF = 1, TOKSRC_HF_JSON = 2 } TokSource;

typedef struct GGUFFile GGUFFile;

typedef struct Model {
    Config cfg;
    Weights w;
    /* Owned storage. Vectors (norms, biases) and the matrices of random and test models
     * live in `arena` (f32); GGUF matrices point into gguf's mapping, Hugging Face ones
     * into `maps`. A layer-subset view borrows its parent's. */
    float *arena;          // f32 vectors and f32 host matrices
    size_t arena_floats;
    void **maps;           // (n_maps) read-only file mappings the weights point into
    size_t *map_sizes;     // (n_maps)
    int n_maps;
    void *resident;        /* model_make_resident's copy of the matrices, or NULL */
    size_t resident_bytes;
    int is_view;           /* 1: layer-subset view, does not own arena/gguf */
    /* 1: a "random:" model (common/randmodel.h): weights come from random_seed; arena is
     * NULL until model_random_materialize() fills host copies for the CPU backend. */
    int random_weights;
    uint64_t random_seed;
    char path[1024];       /* file or directory it was loaded from */
    char fingerprint[65];  /* hex sha-256-like digest of config + tensor table (for HELLO) */
    TokSource tok_source;
    GGUFFile *gguf;        /* kept open (owned) when loaded from GGUF: tokenizer metadata */
    char tokenizer_json[1024]; /* path to tokenizer.json for HF directories */
    char chat_hint[64];    /* "smollm2", "qwen2", "qwen3", "llama3" or "" (from name/template) */
} Model;

/* Loads a GGUF file, a Hugging Face directory (config.json + safetensors) or names a
 * random-weight model ("random:llama3-8b", see common/randmodel.h: no weights yet).
 * On success *out is a new Model the caller owns (free with model_destroy). */
int model_load(const char *path, Model **out, RsErr *e);

/* Writes `out`, a GGUF v3 file of the model in GGUF file `in` (which must load) with every
 * matrix stored as `type` (QT_F16 or QT_BF16, common/quant.h): each element is the engine's
 * dequantized value (quant_dequantize) rounded to nearest even; metadata, tokenizer, vectors
 * and tensor order are kept. Written to a temporary name and renamed, so `out` is whole or
 * absent. */
int gguf_convert(const char *in, const char *out, uint32_t type, RsErr *e);

/* Pointers to m's matrix descriptors into out (2 + 7 * n_layers of them): tok_embeddings,
 * wcls, then each layer's wq, wk, wv, wo, w_gate, w_up, w_down. Returns the count; a tied
 * head is listed beside the embeddings it shares. */
#define MODEL_MAX_MATRICES(n_layers) (2 + 7 * (size_t)(n_layers))
int model_matrices(Model *m, QTensor **out);

/* Copies the matrices out of the file mappings into one rs_huge_alloc buffer (m->resident,
 * owned by m) and points the QTensors there, bytes unchanged; the file pages read for it
 * leave the process's resident set again. Kernels that stream the weights from there take
 * a TLB miss per 2 MiB instead of per 4 KiB. The CPU backend's loads do this
 * (backend_model_load); call it before making views (model_layer_view copies the
 * pointers). No-op for random models, views and a model already resident. */
int model_make_resident(Model *m, RsErr *e);


/* A view on `parent` that runs only the listed layers (in that order) with the parent's
 * embeddings, final norm and head: the self-drafter. spec like "0-5,24-29", or a preset:
 * "half" (the first half of the layers), "short" (the first eighth, at least one).
 * The view borrows parent's memory: free it before the parent. */
int model_layer_view(const Model *parent, const char *spec, Model **out, RsErr *e);

void model_destroy(Model **m);

/* Matrix bytes streamed per token as stored (layers + head; for bandwidth figures); a
 * random model without host weights counts f32. */
size_t model_weight_bytes(const Model *m);

/* Stored bytes of logical row j (0 <= j < w->rows) of a row-layout matrix (not packed:
 * see qtensor_row_bytes). */
static inline const uint8_t *qtensor_row(const QTensor *w, int j) {
    RS_ASSERT(!w->packed);
    int r = j;
    if (w->perm_hd) { /* HF row h*hd + k came from GGUF row h*hd + 2k (k < hd/2) or 2(k-hd/2)+1 */
        int hd = w->perm_hd, h = j / hd, k = j % hd, half = hd / 2;
        r = h * hd + (k < half ? 2 * k : 2 * (k - half) + 1);
    }
    return (const uint8_t *)w->data + (size_t)r * w->row_bytes;
}
/* The stored bytes of logical row j as a row-layout matrix holds them, into dst
 * (row_bytes), whatever w's layout. */
void qtensor_row_bytes(const QTensor *w, int j, uint8_t *dst);
/* Logical rows [r0, r0 + n) expanded to f32 into dst (n, cols), any layout. */
void qtensor_dequantize_rows(const QTensor *w, int r0, int n, float *dst);
/* An f32 matrix descriptor over data (rows, cols), e.g. an arena slice. */
QTensor qtensor_f32(const float *data, int rows, int cols);

#endif
