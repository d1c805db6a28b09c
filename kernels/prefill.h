/* Prefill: appends a run of tokens to a backend's committed context, in chunks. The one
 * chunk rule the target (prompt) and the drafter (prompt and every round's commit) share. */
#ifndef ROOTSPEC_PREFILL_H
#define ROOTSPEC_PREFILL_H
#include "backend.h"

/* Most tokens a prefill chunk holds on any backend (bounds its stack scratch). */
#define PREFILL_CHUNK_MAX 256

/* Tokens per prefill chunk on a backend with these parameters: a chunk is one forward()
 * (at most max_batch tokens) whose entries stay pending until its commit (at most
 * max_pending), so the smaller of the two, capped at PREFILL_CHUNK_MAX and at
 * BackendParams.prefill_chunk when set. */
int prefill_chunk(const BackendParams *bp);

/* Forwards tokens[0..n) (n >= 0) at positions n_committed.. and commits them, chunk by
 * chunk; nothing may be pending. last_row != NULL: the last token's logits (vocab) go
 * there. Errors are the backend's; after one the context holds an unknown prefix of the
 * tokens (reset it). */
int backend_prefill(Backend *b, const int *tokens, int n, float *last_row, RsErr *e);
/* backend_prefill that also reads, chunk by chunk, the EAGLE-3 features the backend records
 * (backend_set_feature_layers) into feats (n, backend_feature_width) f32. */
int backend_prefill_features(Backend *b, const int *tokens, int n, float *last_row, float *feats,
                             RsErr *e);
/* backend_prefill (n >= 1) whose last token's logits stay in the backend as its kept row 0
 * (backend.h), for a reduction where they live; nothing is copied to the host. */
int backend_prefill_keep(Backend *b, const int *tokens, int n, RsErr *e);

/* Rows of a prefill, on the host: rows (n, vocab) are the logits after tokens first..
 * first+n-1 of the prefill (row i predicts token first+i+1). Valid during the call only. */
typedef void (*PrefillRowsFn)(void *user, const float *rows, int first, int n, int vocab);
/* backend_prefill (feats as backend_prefill_features, or NULL) that computes every token's
 * logits and hands them to fn chunk by chunk (a prompt's own log-probabilities: the
 * server's echo). Each row costs the output head, and crosses to the host. */
int backend_prefill_rows(Backend *b, const int *tokens, int n, float *feats, PrefillRowsFn fn,
                         void *user, RsErr *e);

#endif
