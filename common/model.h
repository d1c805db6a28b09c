/* Model description shared by loaders and backends: Config (hyper-parameters), Weights
 * (f32, dequantized at load) and Model (owns the memory). Loaders: GGUF v3 (common/gguf.c)
 * and Hugging Face directories (common/hf.c); model_load() picks by path. */
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

/* One transformer block. All matrices row-major (out_features, in_features), the
 * Hugging Face layout; GGUF llama q/k rows are un-permuted at load so that RoPE is
 * always the rotate-half (NeoX) form. */
typedef struct {
    float *attn_norm; // (dim)
    float *wq;        // (n_heads*head_dim, dim)
    float *wk;        // (n_kv_heads*head_dim, dim)
    float *wv;        // (n_kv_heads*head_dim, dim)
    float *wo;        // (dim, n_heads*head_dim)
    float *bq;        // (n_heads*head_dim) or NULL
    float *bk;        // (n_kv_heads*head_dim) or NULL
    float *bv;        // (n_kv_heads*head_dim) or NULL
    float *q_norm;    // (head_dim) or NULL
    float *k_norm;    // (head_dim) or NULL
    float *ffn_norm;  // (dim)
    float *w_gate;    // (hidden_dim, dim)
    float *w_up;      // (hidden_dim, dim)
    float *w_down;    // (dim, hidden_dim)
} LayerWeights;

typedef struct {
    float *tok_embeddings; // (vocab_size, dim)
    LayerWeights *layers;  // (n_layers)
    float *final_norm;     // (dim)
    float *wcls;           // (vocab_size, dim); == tok_embeddings when tied
} Weights;

typedef enum { TOKSRC_NONE = 0, TOKSRC_GGUF = 1, TOKSRC_HF_JSON = 2 } TokSource;

typedef struct GGUFFile GGUFFile;

typedef struct Model {
    Config cfg;
    Weights w;
    /* Owned storage. Every weight pointer above points into `arena` (or into the
     * parent's arena for a layer-subset view). */
    float *arena;          // all dequantized weights, f32
    size_t arena_floats;
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
 * On success *out is a new Model the caller owns (free with model_free). */
int model_load(const char *path, Model **out, RsErr *e);

/* A view on `parent` that runs only the listed layers (in that order) with the parent's
 * embeddings, final norm and head: the self-drafter. spec like "0-5,24-29".
 * The view borrows parent's memory: free it before the parent. */
int model_layer_view(const Model *parent, const char *spec, Model **out, RsErr *e);

void model_free(Model **m);

/* Total parameter bytes streamed per token at f32 (for bandwidth figures). */
size_t model_weight_bytes(const Model *m);

#endif
