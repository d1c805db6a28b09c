/* The one backend interface (ggml style): a struct of function pointers that the CPU
 * reference (kernels/cpu_backend.c) and CUDA (kernels/cuda_backend.cu) fill with
 * designated initialisers.
 *
 * KV cache model. A backend holds a static cache of `kv_capacity` entries sized at
 * creation. Entries [0, n_committed) are committed context. A forward() appends its n
 * tokens as *pending* entries after any earlier pending ones (a round may run several
 * passes: the drafter's expansion steps, the target's root pass then tree pass). Each new
 * token attends to every committed entry, plus the pending entries (earlier ones and
 * this batch's) that its mask row allows. kv_commit() keeps an ordered subset of the
 * pending entries (e.g. root + accepted path), appends them to the committed context and
 * drops the rest. */
#ifndef ROOTSPEC_BACKEND_H
#define ROOTSPEC_BACKEND_H
#include "../common/model.h"
#include <stdint.h>

typedef struct Backend Backend;

typedef struct {
    int kv_capacity;  /* total cache entries (committed + pending) */
    int max_batch;    /* most tokens in one forward() call (prefill is chunked by caller) */
    int max_pending;  /* most pending entries in one round */
    int threads;      /* CPU threads (0 = default) */
    int device;       /* CUDA device ordinal */
} BackendParams;

typedef struct {
    const char *name;
    /* 1: create() makes a random model's weights itself (on the device), so the Model
     * needs no host copy (common/randmodel.h). */
    int makes_random_weights;
    /* Allocates every buffer once. The backend borrows `m`: keep it alive. */
    int (*create)(const Model *m, const BackendParams *p, Backend **out, RsErr *e);
    void (*destroy)(Backend **b);
    /* tokens, pos: (n). mask: (n, n_pending + n) row-major, 1 = attend; mask == NULL means
     * causal within the batch and attend to every earlier pending entry. out_rows: indices
     * in [0, n) whose logits to return, in that order, into logits (n_out, vocab_size).
     * Errors: RS_EINVAL when the batch would overflow kv_capacity, max_batch or max_pending. */
    int (*forward)(Backend *b, const int *tokens, const int *pos, int n, const uint8_t *mask,
                   const int *out_rows, int n_out, float *logits, RsErr *e);
    /* keep: indices into the pending entries (0 = first pending), ascending not required
     * but each at most once. n_keep may be 0 (drop all pending). */
    int (*kv_commit)(Backend *b, const int *keep, int n_keep, RsErr *e);
    /* Forget everything (new prompt). */
    void (*kv_reset)(Backend *b);
    /* Optional: host memory that forward() copies logits into fastest (CUDA: pinned, so the
     * device-to-host copy runs at full speed instead of through the driver's pageable
     * staging). NULL: malloc/free. Start-up buffers only; aborts on failure. */
    void *(*host_alloc)(Backend *b, size_t bytes);
    void (*host_free)(Backend *b, void *p);
} BackendOps;

/* Common state every backend keeps at the head of its own struct. */
struct Backend {
    const BackendOps *ops;
    const Model *model;
    BackendParams params;
    int n_committed; /* committed entries */
    int n_pending;   /* pending entries after the committed ones */
    /* counters for the round log */
    uint64_t n_graph_replays, n_eager_launches;
};

extern const BackendOps cpu_backend_ops;
/* NULL when built without CUDA (see kernels/cuda_stub.c). */
const BackendOps *cuda_backend_ops_get(void);

/* Shared by the backends (kernels/backend_common.c). Checks every forward() argument
 * against the cache state before anything is touched, so a failed call changes nothing. */
int backend_check_forward(const Backend *b, const int *tokens, const int *pos, int n,
                          const uint8_t *mask, const int *out_rows, int n_out, RsErr *e);
/* "cpu" (also NULL) or "cuda"; NULL with a message in e when unknown or not built in. */
const BackendOps *backend_ops_by_name(const char *name, RsErr *e);
/* model_load() for this backend: a random model ("random:...") gets host weights unless
 * the backend makes its own. *out as model_load. */
int backend_model_load(const BackendOps *ops, const char *path, Model **out, RsErr *e);
/* RoPE inverse frequencies (head_dim/2), incl. Llama-3 scaling, bit-identical everywhere. */
void rope_inv_freq(const Config *c, float *inv_freq);

/* Convenience wrappers. */
static inline int backend_forward(Backend *b, const int *tokens, const int *pos, int n,
                                  const uint8_t *mask, const int *out_rows, int n_out,
                                  float *logits, RsErr *e) {
    return b->ops->forward(b, tokens, pos, n, mask, out_rows, n_out, logits, e);
}
static inline int backend_kv_commit(Backend *b, const int *keep, int n_keep, RsErr *e) {
    return b->ops->kv_commit(b, keep, n_keep, e);
}
/* Logits buffers for forward(): the caller owns them; free with backend_host_free on the
 * same backend, before destroying it. */
static inline void *backend_host_alloc(Backend *b, size_t bytes) {
    return b->ops->host_alloc ? b->ops->host_alloc(b, bytes) : rs_xmalloc(bytes);
}
static inline void backend_host_free(Backend *b, void *p) {
    if (!p) return;
    if (b->ops->host_free) b->ops->host_free(b, p);
    else free(p);
}
static inline void backend_destroy(Backend **b) {
    if (b && *b) (*b)->ops->destroy(b);
}

#endif
