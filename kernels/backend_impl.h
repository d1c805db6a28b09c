/* The backend implementation interface (ggml's ggml-backend-impl.h): the ops table a backend
 * fills with designated initialisers and the common state at the head of its own struct.
 * Only backends include this (kernels/cpu/cpu_backend.c, kernels/cuda/cuda_backend.cu,
 * kernels/backend_common.c and test_spec's instrumented backend); callers use
 * kernels/backend.h. */
#ifndef ROOTSPEC_BACKEND_IMPL_H
#define ROOTSPEC_BACKEND_IMPL_H
#include "backend.h"

struct BackendOps {
    const char *name;
    /* 1: create() makes a random model's weights itself (on the device), so the Model
     * needs no host copy (common/randmodel.h). */
    int makes_random_weights;
    /* 1: the kernels stream the host weights, so backend_model_load makes them resident in
     * huge pages (model_make_resident); a device backend copies them once instead. */
    int streams_host_weights;
    /* 1: every call reaches a device and waits for it (backend_batch_queries). */
    int dear_round_trip;
    /* Optional: after model_make_resident, lays the resident weights out for the kernels
     * (the CPU: x4 tiles, model_pack_x4, for bp's kernel family; bp may be NULL). An error
     * fails backend_model_load. */
    int (*prepare_weights)(Model *m, const BackendParams *bp, RsErr *e);
    /* As backend_create; sets the common head of a zeroed struct (ops, model, params). */
    int (*create)(const Model *m, const BackendParams *bp, Backend **out, RsErr *e);
    void (*destroy)(Backend **b);
    /* As backend_forward; must call backend_check_forward first and add n to n_pending.
     * Keeps the n_out rows' logits (kept rows 0..n_out-1) whatever `logits` is, and copies
     * them there when it is not NULL; backend_forward keeps n_kept and the counters. */
    int (*forward)(Backend *b, const int *tokens, const int *pos, int n, const uint8_t *mask,
                   const int *out_rows, int n_out, float *logits, RsErr *e);
    /* As backend_kv_commit; must call backend_check_commit first; moves n_committed and
     * clears n_pending. */
    int (*kv_commit)(Backend *b, const int *keep, int n_keep, RsErr *e);
    void (*kv_reset)(Backend *b);
    /* Optional: as backend_kv_truncate, n already checked (NULL: RS_EUNSUPPORTED). */
    void (*kv_truncate)(Backend *b, int n_committed);
    /* Optional: as backend_kv_commit_stay, checks its lists (NULL: RS_EUNSUPPORTED). */
    int (*kv_commit_stay)(Backend *b, const int *keep, int n_keep, const int *stay, int n_stay,
                          RsErr *e);
    /* Optional (NULL: malloc/free); see backend_host_alloc. */
    void *(*host_alloc)(Backend *b, size_t bytes);
    void (*host_free)(Backend *b, void *p);
    /* Required: as backend_rows_copy, rows already checked against n_kept (the caller
     * counts them). */
    int (*rows_copy)(Backend *b, const int *rows, int n, float *logits, RsErr *e);
    /* Optional: as backend_rows_topk over the n_kept rows, k already checked. NULL: the
     * rows are copied to the host (counted in d2h_full_rows) and reduced there by
     * kernels/cpu/cpu_topk.c, single-threaded. */
    int (*rows_topk)(Backend *b, int k, int *ids, float *logq, float *lse, RsErr *e);
    /* Optional: fills the backend's own counters (the CUDA ones); backend_stats has
     * already set the common ones and zeroed the rest. */
    void (*stats)(const Backend *b, BackendStats *out);
    /* EAGLE-3 features (backend.h). Optional: NULL refuses to record. set_features is
     * called after the common head's feat_* fields changed (feat_n 0: stop); it sizes the
     * backend's buffers. read_features returns the last commit's kept rows on the host
     * and their element type (F32 or BF16); the common code converts. */
    int (*set_features)(Backend *b, RsErr *e);
    const void *(*read_features)(Backend *b, BackendFeatType *t);
    /* The verifier's row queries, arguments checked by the common wrapper (rows within
     * n_kept, ids within the vocabulary, sampling_check, u in [0, 1) or < 0). */
    void (*rows_stats)(Backend *b, const int *rows, int n, const Sampling *s, const double *u,
                       RowStats *out);
    void (*rows_gather)(Backend *b, const int *rows, const int *ids, int n, float *out);
    /* Optional (NULL: the rows live on a device): backend_kept_row, row within n_kept. */
    const float *(*kept_row)(const Backend *b, int row);
    /* Optional: an EAGLE-3 head's layer on this backend (kernels/eagle3_layer.h); NULL:
     * heads do not run here. */
    const Eagle3LayerOps *eagle3_layer;
    /* Optional, all or none (NULL: one sequence; the common code runs sequence 0's
     * segment through forward and refuses the rest): backend.h's sequence functions,
     * arguments checked by the common wrappers (backend_check_segment per segment, seq
     * ids open, out_rows). forward_batch and seq_commit keep the head's n_committed and
     * n_pending equal to sequence 0's. */
    int (*seq_open)(Backend *b, int *seq, RsErr *e);
    void (*seq_close)(Backend *b, int seq);
    int (*forward_batch)(Backend *b, const BackendSeg *segs, int n_segs, const int *out_rows,
                         int n_out, float *logits, RsErr *e);
    int (*seq_commit)(Backend *b, int seq, const int *keep, int n_keep, RsErr *e);
    void (*seq_counts)(const Backend *b, int seq, int *n_committed, int *n_pending);
    void (*kv_usage)(const Backend *b, BackendKvUsage *out);
    /* Optional (NULL: no prefix cache): backend.h's prefix functions, seq open and empty
     * (attach) or holding n committed entries (publish). */
    int (*prefix_attach)(Backend *b, int seq, const int *tokens, int n);
    void (*prefix_publish)(Backend *b, int seq, const int *tokens, int n);
    /* Optional (NULL: RS_EUNSUPPORTED): backend_seq_fork, arguments checked (dst open and
     * empty, src open with at least n committed entries). */
    int (*seq_fork)(Backend *b, int src, int dst, int n, RsErr *e);
};

/* Common state every backend keeps at the head of its own struct (a Backend * is cast to
 * the backend's type). */
struct Backend {
    const BackendOps *ops;
    const Model *model;
    BackendParams params;
    int n_committed; /* committed entries */
    int n_pending;   /* pending entries after the committed ones */
    uint64_t n_forwards, n_tokens; /* kept by backend_forward */
    int n_kept;                    /* kept logits rows of the last forward */
    uint64_t n_d2h_full_rows;      /* BackendStats.d2h_full_rows */
    uint64_t n_rows_stats;         /* BackendStats.rows_stats_calls */
    int dear_round_trip;           /* the ops' flag (a view: its backend's), set at create */
    /* EAGLE-3 features: layers recorded (feat_n 0: none) and rows the last commit kept */
    int feat_n, feat_layers[BACKEND_MAX_FEATURE_LAYERS], feat_rows;
    int (*stop)(void *); /* backend_set_stop's check, NULL: none */
    void *stop_arg;
};

/* RS_ESTOPPED (and e) when the caller's stop check (backend_set_stop) says so, else RS_OK:
 * a backend that can stop a pass asks it between layers, before anything is final. */
int backend_stopped(const Backend *b, RsErr *e);

/* Checks every forward() argument against the cache state before anything is touched, so
 * a failed call changes nothing (same messages on every backend). */
int backend_check_forward(const Backend *b, const int *tokens, const int *pos, int n,
                          const uint8_t *mask, const int *out_rows, int n_out, RsErr *e);

/* backend_check_forward's checks of one sequence's rows, given its committed and pending
 * entries (out_rows are checked by the caller). */
int backend_check_segment(const Backend *b, int nc, int np, const int *tokens, const int *pos,
                          int n, const uint8_t *mask, RsErr *e);

/* Checks a kv_commit's keep list (0 <= n_keep <= n_pending, each index a pending entry,
 * none twice; seen: the backend's (max_pending) scratch) and sets *identity when keep is
 * 0, 1, ..., n_keep - 1 (the entries are in place already). Every kv_commit op calls it
 * first, so a refused commit changes nothing and reads the same on every backend. */
int backend_check_commit(const Backend *b, const int *keep, int n_keep, uint8_t *seen,
                         int *identity, RsErr *e);
/* The same against a sequence's np pending entries. */
int backend_check_keep(int np, const int *keep, int n_keep, uint8_t *seen, int *identity,
                       RsErr *e);

#endif
