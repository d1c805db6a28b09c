/* Runner of an EAGLE-3 head (common/eagle3.h) with its own KV cache for the head's single
 * layer, whose arithmetic runs on a backend's Eagle3LayerOps (kernels/eagle3_layer.h: the
 * CPU or CUDA): the pieces a Drafter kind needs (reset, commit target features, expand
 * pending tree nodes under an ancestor mask, top-k mapped to target ids).
 *
 * Rows and positions follow the EAGLE reference (SafeAILab/EAGLE eagle/model/cnets.py
 * Model.topK_genrate, which feeds input_ids[:, 1:] beside the target's hidden states): a
 * row pairs the state that describes token x_p (the target's features of x_p, or the
 * head's own output for it) with the embedding of the token after it, x_{p+1}, at
 * rotary position p. So the head's cache holds one entry fewer than the target's (the
 * first prompt token has no row), and a tree node at depth d below the last committed
 * row runs at position n_committed - 1 + d with its parent's output as its state.
 * Drafting tokens are target ids (draft ids mapped through d2t), embedded with the
 * target-vocabulary table, as topK_genrate does. */
#ifndef ROOTSPEC_EAGLE3_FORWARD_H
#define ROOTSPEC_EAGLE3_FORWARD_H
#include "common/eagle3.h"
#include "common/pool.h"
#include "kernels/backend.h"
#include "kernels/eagle3_layer.h"
#include <stdint.h>

typedef struct Eagle3Runner Eagle3Runner;

/* The head's token embeddings: a (vocab, dim) table in its stored type (qtensor_f32 over
 * an f32 array, or the target's own tensor, quantized or not, often a file mapping), one
 * row dequantized per token on demand, so no f32 copy of the target's table is made and
 * only the rows drafting touches become resident. A random model's table without host
 * weights (table.data NULL) gives rows from its generator (common/randmodel.h), the same
 * values model_random_materialize would store. Borrowed: keep the data alive. */
typedef struct {
    QTensor table;
    uint64_t rand_seed;           /* table.data NULL: rs_rand_value(rand_seed, row * cols + i, */
    float rand_scale, rand_base;  /*                  rand_scale, rand_base) */
} Eagle3Embed;

/* The token embeddings of model m as an Eagle3Embed (nothing copied: borrows m).
 * RS_EUNSUPPORTED, naming the model, when it has neither host weights nor a generator. */
int eagle3_embed_of(const Model *m, Eagle3Embed *out, RsErr *e);
/* Row `token` of the table into dst (cols). */
void eagle3_embed_row(const Eagle3Embed *em, int token, float *dst);

/* Borrows h and embed (keep both alive). embed: (vocab, dim) token embeddings, h->embed
 * when the head has its own, else the target's (eagle3_head_check verified the width).
 * kv_capacity: committed + pending rows; max_batch: most rows in one call (commits are
 * chunked by it, expansions must fit). */
int eagle3_runner_create(const Eagle3Head *h, const float *embed, int kv_capacity,
                         int max_batch, Eagle3Runner **out, RsErr *e);
/* The same on a backend's implementation of the layer (eagle3_layer_for: NULL or the CPU
 * backend's ops: the CPU's kernels on bp->threads threads; the CUDA backend's: bf16 on
 * device bp->device), with bp->kv_capacity and bp->max_batch as above. RS_EUNSUPPORTED for
 * another backend, or the implementation's error (no device, no memory). */
int eagle3_runner_create_on(const Eagle3Head *h, const Eagle3Embed *embed,
                            const Eagle3LayerOps *ops, const BackendParams *bp,
                            Eagle3Runner **out, RsErr *e);
const Eagle3LayerOps *eagle3_layer_for(const BackendOps *backend, RsErr *e);
/* "cpu" or "cuda". */
const char *eagle3_runner_backend(const Eagle3Runner *r);
void eagle3_runner_destroy(Eagle3Runner **r);
/* Forget every row (new prompt). */
void eagle3_reset(Eagle3Runner *r);
int eagle3_n_committed(const Eagle3Runner *r);
int eagle3_n_pending(const Eagle3Runner *r);

/* Drops the pending (tree) rows, then appends n committed rows: row i embeds tokens[i] and
 * takes feats[i] (3 * target_hidden: the target's three feature vectors of the token
 * *before* tokens[i], layers ascending), at position n_committed + i. The last row's
 * output state goes to hidden_out (dim) and its draft-vocabulary logits to logits_out
 * (draft_vocab); either may be NULL. RS_EINVAL (nothing changed) when the cache would
 * overflow or a token is outside the vocabulary. */
int eagle3_commit(Eagle3Runner *r, const int *tokens, const float *feats, int n,
                  float *hidden_out, float *logits_out, RsErr *e);

/* Runs n tree nodes as pending rows: tokens (n) target ids, state_in (n, dim) each node's
 * parent output state, pos (n), mask (n, n_pending + n) row-major, 1 = attend, over the
 * pending rows before this call and this batch (committed rows are always visible); NULL
 * = causal (every earlier pending row), as the backends' forward(). Outputs (n, draft_vocab)
 * logits (logits_out NULL: left with the implementation for its topk op, which it must
 * have) and (n, dim) states. The rows stay pending until the next commit or reset. */
int eagle3_expand(Eagle3Runner *r, const int *tokens, const float *state_in, const int *pos,
                  const uint8_t *mask, int n, float *logits_out, float *state_out, RsErr *e);

/* Grows the DESIGN.md §2 pool below the last committed row with draft_proc/pool_grow.h (the
 * model drafter's growth: 710 candidates, 70 expanded in 7 passes of 10): depth-1
 * candidates are root_logits' top 10, each expanded node runs with its parent's output
 * state (root_state for depth 1) and its ancestors in the mask. Candidate tokens are
 * target ids, logq the log-softmax over the draft vocabulary. Needs max_batch >=
 * POOL_EXPAND, no pending rows (a commit drops them) and room for POOL_N_EXPANDED
 * (RS_EINVAL otherwise, nothing changed); leaves the 70 rows pending. RS_EFORMAT when the
 * logits are not finite. Sets p's draft_ns, draft_host_ns (growth only) and draft_rows. */
int eagle3_grow_pool(Eagle3Runner *r, const float *root_state, const float *root_logits,
                     Pool *p, RsErr *e);

/* Time spent inside the layer implementation's run() since create: the forward part of
 * a round; the rest of draft_ns is the drafter's host work (draft_host_ns). */
uint64_t eagle3_run_ns(const Eagle3Runner *r);

/* Rotary position of a tree node at depth d >= 1 below the last committed row:
 * n_committed - 1 + d (topK_genrate's position_ids = len_posi + i). */
int eagle3_node_pos(const Eagle3Runner *r, int depth);

/* The k best draft ids of a logits row (draft_vocab), mapped to target ids through d2t,
 * with their log-softmax over the draft vocabulary; ties go to the lower draft id. */
void eagle3_topk(const Eagle3Head *h, const float *logits, int k, int *target_ids, float *logq);

#endif
