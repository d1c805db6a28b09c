/* The arithmetic of an EAGLE-3 head's one decoder layer over a batch of rows, per backend:
 * the CPU with the weights in their stored type through the CPU backend's kernel family
 * and thread pool (kernels/cpu/cpu_eagle3.c, the reference; ROOTSPEC_CPU_KERNELS=ref makes it
 * all f32) and CUDA with bf16 weights, GEMM inputs and KV cache (kernels/cuda/cuda_eagle3.cu).
 * An implementation holds the head's weights where it computes and the head's KV cache;
 * the runner (draft_proc/eagle3_forward.h) keeps the cache bookkeeping (which slots are
 * committed or pending), the token embeddings and the pool growth, so both backends grow
 * pools with the same code. */
#ifndef ROOTSPEC_EAGLE3_LAYER_H
#define ROOTSPEC_EAGLE3_LAYER_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
#include "common/eagle3.h"
#include "backend.h"

typedef struct Eagle3Layer Eagle3Layer; /* one implementation's state */

/* n rows written to cache slots [n_committed + n_pending, + n): row t's state is
 * fc(in[t]) when fc (in: (n, 3 * target_hidden) target features) or in[t] itself (in:
 * (n, dim) parent states), its token embedding emb[t] (un-normed), rotary position pos[t].
 * Row t attends to every committed slot and to the pending slots whose mask entries
 * (mask: (n, n_pending + n), 1 = attend; NULL = causal, every earlier pending row) are set.
 * Rows [out_from, n) return their output states and draft-vocabulary logits; with
 * logits_out NULL (only for an implementation with a topk op) the logits stay where they
 * were computed, for topk. */
typedef struct {
    const float *in;
    int fc;
    const float *emb;    // (n, dim)
    const int *pos;      // (n)
    const uint8_t *mask; // (n, n_pending + n) or NULL
    int n, n_committed, n_pending, out_from;
    float *state_out;    // (n - out_from, dim)
    float *logits_out;   // (n - out_from, draft_vocab), or NULL: kept for topk
} Eagle3Batch;

struct Eagle3LayerOps {
    const char *name; /* "cpu" or "cuda", for messages */
    /* Borrows h (keep it alive; its matrices must have data). From p: kv_capacity,
     * max_batch (most rows in one run), threads (the CPU's, 0 = 1) and device (the CUDA
     * ordinal); the rest is ignored. RS_EUNSUPPORTED / RS_ENOMEM / RS_EINVAL with a message
     * when the head cannot run there. */
    int (*create)(const Eagle3Head *h, const BackendParams *bp, Eagle3Layer **out, RsErr *e);
    /* Accepts NULL and a NULL *r; clears the caller's pointer. */
    void (*destroy)(Eagle3Layer **r);
    /* The caller checked the sizes (n <= max_batch, slots inside kv_capacity). Outputs
     * are on the host when it returns. */
    void (*run)(Eagle3Layer *r, const Eagle3Batch *b);
    /* Optional (NULL: the runner reduces logits_out on the host): the k best draft ids of
     * the last run's m output rows and their log-softmax over the draft vocabulary
     * (ids, logq: (m, k), on the host when it returns; ties to the lower id), reduced
     * where the logits are, so whole rows never cross (CUDA: on the device). */
    void (*topk)(Eagle3Layer *r, int m, int k, int *ids, float *logq);
};

/* Each backend's, reached through its BackendOps (backend_eagle3_layer); the CUDA one
 * exists only in the CUDA build. */
extern const Eagle3LayerOps cpu_eagle3_layer;
extern const Eagle3LayerOps cuda_eagle3_layer;

#ifdef __cplusplus
}
#endif
#endif
