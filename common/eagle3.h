/* EAGLE-3 drafter heads in the layout the published checkpoints use (a Hugging Face
 * directory: config.json with architectures ["LlamaForCausalLMEagle3"] and
 * draft_vocab_size, safetensors with fc, midlayer.*, norm, lm_head, d2t, t2d and an
 * optional embed_tokens), matrices kept in their stored type (F32, F16, BF16), and the
 * check that a head fits its target.
 *
 * Convention followed (checked against SGLang python/sglang/srt/models/llama_eagle3.py
 * LlamaDecoderLayer.forward / LlamaModel.forward, vLLM
 * vllm/model_executor/models/llama_eagle3.py, and the EAGLE reference
 * SafeAILab/EAGLE eagle/model/cnets.py LlamaDecoderLayeremb.forward / Model.forward):
 *  - fc: (hidden, 3 * target_hidden), no bias, applied to the concatenation of three target
 *    feature vectors, in ascending layer order. The features are the target's residual
 *    stream *entering* decoder layers (2, N/2, N-3) (EAGLE modeling_llama_kv.py captures
 *    `hidden_states` before calling layer idx; vLLM/SGLang append `hidden_states + residual`
 *    before layer i): i.e. the outputs of layers 1, N/2-1, N-4, before the final norm.
 *    An explicit `eagle_aux_hidden_state_layer_ids` (top level or inside `eagle_config`)
 *    means "entering layer i" to vLLM (gpu_model_runner._get_eagle3_aux_layers_from_config)
 *    and "output of layer i" to SGLang (set_eagle3_layers_to_capture adds 1): see
 *    Eagle3LayerIds for how rootspec tells them apart. rootspec also accepts index 0 (the
 *    embeddings) and N (the last layer's output, before the final norm), which the random
 *    preset for 2-layer test targets needs.
 *  - one decoder layer whose q/k/v take 2*hidden inputs: cat([input_layernorm(embed),
 *    hidden_norm(h)]); the residual is h itself (not normed; vLLM's optional
 *    norm_before_residual is refused); post_attention_layernorm and a SwiGLU MLP; the
 *    layer output (before `norm`) is the next step's h; logits = lm_head(norm(out)).
 *  - d2t holds offsets: target id = draft id + d2t[draft id] (SGLang load_weights
 *    "hot_token_id = d2t + arange"); t2d marks the target ids that have a draft id.
 *  - rope from the head's own config (a published Llama-3.1-8B head gives no rope_theta,
 *    so transformers' LlamaConfig default 10000 applies, not the target's 500000). */
#ifndef ROOTSPEC_EAGLE3_H
#define ROOTSPEC_EAGLE3_H
#include "model.h"

#define EAGLE3_N_FEATURES 3

/* How a head's listed feature-layer ids are read. vLLM (and the EAGLE reference) take id i
 * as the residual stream *entering* layer i; SGLang and SpecForge, which train many of the
 * published heads, as the *output* of layer i (entering i + 1). The config does not say
 * which unless the head says (a random preset does), so AUTO infers it from the ids where they give it away: ids equal to the target's
 * default (2, N/2, N-3) are entering-layer ids, ids one below it are output ids (a head
 * trained at the default layers by SGLang); any other list is read as vLLM reads it, with a
 * note on stderr that names the option that settles it (--eagle3-layer-ids). */
typedef enum { EAGLE3_IDS_AUTO = 0, EAGLE3_IDS_INPUT, EAGLE3_IDS_OUTPUT } Eagle3LayerIds;

typedef struct {
    Config c;            /* the head's decoder layer: dim = hidden_size, vocab = target vocab,
                            n_layers = 1 */
    int target_hidden;   /* width of each target feature (target_hidden_size or hidden) */
    int draft_vocab;     /* rows of lm_head */
    /* eagle_aux_hidden_state_layer_ids as the config lists them, or -1 each when it names
     * none (then the default (2, N/2, N-3) of the target applies). What an id means is
     * the head's Eagle3LayerIds convention (eagle3_head_check resolves it). */
    int feature_layers[EAGLE3_N_FEATURES];
    Eagle3LayerIds layer_ids; /* their convention where the head states it, else AUTO */
} Eagle3Config;


/* "auto", "input" or "output" -> *out; RS_EINVAL naming the value otherwise. */
int eagle3_layer_ids_parse(const char *s, Eagle3LayerIds *out, RsErr *e);
/* The entering-layer indices (the backend's feature layers) of listed ids under `ids`
 * for an n_layers target: AUTO resolved as above (*used: the convention applied, may be
 * NULL; *guessed: 1 when AUTO found no hint, may be NULL). */
void eagle3_resolve_layers(const int listed[EAGLE3_N_FEATURES], int n_layers, Eagle3LayerIds ids,
                           int layers[EAGLE3_N_FEATURES], Eagle3LayerIds *used, int *guessed);

typedef struct {
    Eagle3Config cfg;
    /* Matrices in their stored type (F32, F16 or BF16 as the checkpoint has them, pointing
     * into the file's mapping; a random head's are F32 in the arena), vectors in f32. */
    QTensor fc;         // (dim, 3*target_hidden)
    QTensor embed;      // (vocab, dim); data NULL: the target's embeddings are used
    float *input_norm;  // (dim) on the token embedding
    float *hidden_norm; // (dim) on the incoming hidden state
    QTensor wq;         // (n_heads*head_dim, 2*dim)
    QTensor wk;         // (n_kv_heads*head_dim, 2*dim)
    QTensor wv;         // (n_kv_heads*head_dim, 2*dim)
    QTensor wo;         // (dim, n_heads*head_dim)
    float *post_norm;   // (dim)
    QTensor w_gate;     // (hidden_dim, dim)
    QTensor w_up;       // (hidden_dim, dim)
    QTensor w_down;     // (dim, hidden_dim)
    float *norm;        // (dim) before lm_head
    QTensor lm_head;    // (draft_vocab, dim)
    int32_t *d2t;       // (draft_vocab) target id of each draft id (offsets already added)
    float *arena;       // the vectors, and a random head's matrices
    void **maps;        // (n_maps) file mappings the matrices point into
    size_t *map_sizes;  // (n_maps)
    int n_maps;
    char path[1024];
    char fingerprint[65];
} Eagle3Head;

/* The head's nine matrices in the order a pass uses them: fc first (commits only), then
 * wq, wk, wv, wo, w_gate, w_up, w_down, lm_head (every pass). Borrowed from h. */
#define EAGLE3_N_MATRICES 9
void eagle3_head_matrices(const Eagle3Head *h, const QTensor *out[EAGLE3_N_MATRICES]);

/* Loads a head directory. Refuses (naming the values) a config that is not an EAGLE-3
 * head, a missing or misshapen tensor, an lm_head whose rows differ from draft_vocab_size,
 * a d2t entry mapping outside the vocabulary or two draft ids onto one target id, and a
 * t2d that disagrees with d2t. */
int eagle3_head_load(const char *dir, Eagle3Head **out, RsErr *e);
void eagle3_head_destroy(Eagle3Head **h);

/* Checks that the head fits a target of config t: same vocabulary, target_hidden ==
 * t->dim, dim == t->dim when the head has no embed_tokens (it borrows the target's), and
 * feature layers inside [0, t->n_layers], strictly ascending. Fills layers_out (3) with
 * the layers the target must return. Errors (RS_EINVAL) name both values. */
int eagle3_head_check(const Eagle3Head *h, const Config *t, int layers_out[EAGLE3_N_FEATURES],
                      RsErr *e);

/* The three default feature layers of an n-layer target (vLLM/SGLang/EAGLE: 2, N/2, N-3). */
void eagle3_default_layers(int n_layers, int layers[EAGLE3_N_FEATURES]);

/* Random heads ("random:eagle3-tiny" fits random:tiny, "random:eagle3-llama3-8b" has the
 * published Llama-3.1-8B head's shape; ",seed=S" optional): weights from randmodel.h's
 * counter-based generator (tensor i of the head_tensors order gets seed
 * rs_rand_tensor_seed(seed, 100 + i)), d2t a seeded increasing map into the vocabulary.
 * with_weights 0 gives the shapes and d2t only (arena NULL, every matrix's data NULL),
 * e.g. for a backend that makes the weights itself. 1 when path names such a head. */
int eagle3_path_is_random(const char *path);
/* 1 if path names an EAGLE-3 head: a random head preset, or a directory whose config.json
 * lists an EAGLE-3 head architecture (so a model path can be told from a head path). */
int eagle3_path_is_head(const char *path);
int eagle3_head_random(const char *spec, int with_weights, Eagle3Head **out, RsErr *e);

#endif
