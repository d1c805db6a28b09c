/* The public backend interface: an opaque Backend handle and the functions every caller
 * uses (ggml's ggml-backend.h). The ops table and the state a backend keeps live in
 * kernels/backend_impl.h, which only the backends include; no caller reads a backend's
 * fields.
 *
 * KV cache model. A backend holds a static cache of `kv_capacity` entries sized at
 * creation. Entries [0, n_committed) are committed context. A forward() appends its n
 * tokens as *pending* entries after any earlier pending ones (a round may run several
 * passes: the drafter's expansion steps, the target's root pass then tree pass). Each new
 * token attends to every committed entry, plus the pending entries (earlier ones and
 * this batch's) that its mask row allows. kv_commit() keeps an ordered subset of the
 * pending entries (e.g. root + accepted path), appends them to the committed context and
 * drops the rest.
 *
 * Sequences. The cache is shared by up to BackendParams.max_seqs sequences and paged: it
 * is cut into blocks of BACKEND_KV_BLOCK entries, and each sequence holds a block table
 * that maps its entries (committed, then pending, as above) to blocks taken from a free
 * list as it grows and given back when it commits fewer entries than it forwarded or is
 * closed, so the memory a sequence holds follows its length (PagedAttention, Kwon et al.,
 * SOSP 2023). Sequence 0 is always open: the functions without a sequence argument act on
 * it, so a single-sequence caller sees one cache of kv_capacity entries as before. One
 * backend_forward_batch runs rows of many sequences; each row attends only to its own
 * sequence, and its logits are the same bits whatever else shares the pass (on CUDA with
 * BackendParams.batch_invariant; without it within the tolerance of its tree passes). */
#ifndef ROOTSPEC_BACKEND_H
#define ROOTSPEC_BACKEND_H
#include "../common/cli.h"
#include "../common/logits.h"
#include "../common/model.h"
#include <stdint.h>

typedef struct Backend Backend;       /* opaque: one backend instance */
typedef struct BackendOps BackendOps; /* opaque: one kind of backend (cpu, cuda) */
typedef struct Eagle3LayerOps Eagle3LayerOps; /* an EAGLE-3 head's layer (kernels/eagle3_layer.h) */

typedef struct {
    int kv_capacity;  /* total cache entries (committed + pending) */
    int max_batch;    /* most tokens in one forward() call (prefill is chunked by caller) */
    int max_pending;  /* most pending entries in one round */
    int threads;      /* CPU threads (0 = default) */
    int device;       /* CUDA device ordinal */
    /* CUDA: kernels whose per-element reduction order does not depend on the number of
     * rows (own GEMMs, fixed attention splits), so a row's logits are the same bits alone
     * or in a tree pass (--batch-invariant; default off until its cost is measured on a
     * GPU). The CPU backend ignores it. */
    int batch_invariant;
    /* Optional: the k of the backend_rows_topk calls that will read every forward's kept
     * rows (a drafter's). The CPU backend then reduces its output head's columns tile by
     * tile while they are in cache, and rows_topk(k) returns what the forward computed:
     * the same bits, without reading the rows back from memory. 0: no hint. */
    int topk_hint;
    /* CPU: the kernel family by name (ref, scalar, avx2, avx512, amx; an unknown one or one
     * the CPU lacks is refused at create), NULL: the best the CPU has. Programs take it
     * from ROOTSPEC_CPU_KERNELS once, at start-up (cli_backend_env). Other backends
     * ignore it. */
    const char *cpu_kernels;
    /* The measuring and test switches (common/cli.h); zeroed: the product's choice. */
    BackendSwitches sw;
    /* Sequences open at once, sequence 0 included (0: 1). */
    int max_seqs;
    /* Optional: tokens per backend_prefill chunk (kernels/prefill.h; 0: the largest that
     * max_batch and max_pending allow). */
    int prefill_chunk;
    /* 1: keep published blocks for reuse (backend.h: Prefix cache); 0: no prefix cache. */
    int prefix_cache;
} BackendParams;

/* Entries per KV block (backend.h: Sequences). */
#define BACKEND_KV_BLOCK 16

/* Counters since create(), for the round log and benchmarks. A counter a backend does not
 * have reads zero (the CUDA ones on the CPU backend). */
typedef struct {
    uint64_t forwards;       /* successful forward() calls */
    uint64_t tokens;         /* tokens those calls processed */
    uint64_t graph_replays;  /* CUDA: forwards replayed from a captured graph */
    uint64_t eager_launches; /* CUDA: forwards launched kernel by kernel */
    uint64_t graph_captures; /* CUDA: graph captures (a re-capture after a shape change counts) */
    /* Whole logits rows copied to the host: n_out per forward() given a logits pointer,
     * n per backend_rows_copy(). Reductions of the kept rows copy none; a decode that
     * only reduces keeps this at 0 (on a GPU the logits stay on the device). */
    uint64_t d2h_full_rows;
    /* CPU with BackendParams.topk_hint: the part of forward() spent reducing the output
     * head's tiles to top-k (work a rows_topk call would otherwise do after it). */
    uint64_t fused_topk_ns;
    /* backend_rows_stats calls that reached the backend (n > 0): on a device, each is one
     * round trip (backend_batch_queries). */
    uint64_t rows_stats_calls;
} BackendStats;

extern const BackendOps cpu_backend_ops;
/* The CPU backend's own accessors: kernels/cpu/cpu_backend.h. */
/* NULL when built without CUDA (see kernels/cuda/cuda_stub.c). */
const BackendOps *cuda_backend_ops_get(void);
/* The EAGLE-3 head's layer on backend ops (NULL: the CPU's), or NULL when heads do not run
 * there. */
const Eagle3LayerOps *backend_eagle3_layer(const BackendOps *ops);
/* "cpu" (also NULL) or "cuda"; NULL with a message in e when unknown or not built in. */
const BackendOps *backend_ops_by_name(const char *name, RsErr *e);
/* model_load() for this backend: a random model ("random:...") gets host weights unless
 * the backend makes its own; a backend that streams host weights (CPU) gets them resident
 * in huge pages (model_make_resident), laid out for its kernels (the CPU: x4 tiles,
 * model_pack_x4, for the kernel family p names; p NULL: defaults). *out as model_load. */
int backend_model_load(const BackendOps *ops, const char *path, const BackendParams *bp,
                       Model **out, RsErr *e);

/* Allocates every buffer once. The backend borrows `m`: keep it alive. *out = NULL on
 * error (RS_EINVAL for bad sizes, RS_ENOMEM when the KV cache does not fit, ...). */
int backend_create(const BackendOps *ops, const Model *m, const BackendParams *bp, Backend **out,
                   RsErr *e);
/* Accepts NULL and a NULL *b; clears the caller's pointer. */
void backend_destroy(Backend **b);
/* "cpu" or "cuda". */
const char *backend_name(const Backend *b);
/* The model create() borrowed, and the sizes it was created with. */
const Model *backend_model(const Backend *b);
BackendParams backend_params(const Backend *b);

/* tokens, pos: (n). mask: (n, n_pending + n) row-major, 1 = attend; mask == NULL means
 * causal within the batch and attend to every earlier pending entry. out_rows: indices
 * in [0, n) whose logits to compute, in that order. They become the backend's *kept rows*
 * 0..n_out-1 (device memory on CUDA, the backend's own buffer on the CPU) until the next
 * forward() or kv_reset(); with logits != NULL they are also copied to logits
 * (n_out, vocab_size), which counts n_out in BackendStats.d2h_full_rows. logits == NULL
 * copies nothing: read the kept rows with backend_rows_copy or reduce them where they are.
 * Errors: RS_EINVAL when the batch would overflow kv_capacity, max_batch or max_pending;
 * a failed call changes nothing (the kept rows included). */
int backend_forward(Backend *b, const int *tokens, const int *pos, int n, const uint8_t *mask,
                    const int *out_rows, int n_out, float *logits, RsErr *e);
/* A caller's check that the forward() in progress is no longer wanted (a drafter growing
 * ahead when the next request comes, which should wait for a layer, not a pass): forward()
 * asks it before the pass and, on a backend that can stop one (the CPU's), between layers;
 * nonzero ends the call with RS_ESTOPPED, changing nothing (as any failed call). NULL:
 * none. */
void backend_set_stop(Backend *b, int (*stop)(void *), void *arg);
/* Rows the last forward() kept (its n_out; 0 after kv_reset or before any forward). */
int backend_n_kept(const Backend *b);
/* Copies kept rows rows[0..n) (each in [0, backend_n_kept)) whole to the host, logits
 * (n, vocab_size), and counts n in d2h_full_rows: for offline scoring and tests, not for a
 * decode's hot path. RS_EINVAL for a row outside the kept ones (nothing copied). */
int backend_rows_copy(Backend *b, const int *rows, int n, float *logits, RsErr *e);
/* Largest k of backend_rows_topk. */
#define BACKEND_TOPK_MAX 32
/* For every kept row r (n = backend_n_kept): ids (n, k) its k largest logits' columns,
 * ties to the lower column (as common/logits.h row_topk: ids are exact); lse (n)
 * log(sum exp(row)) (NaN when the row holds a NaN or +inf or is all -inf, as row_lse);
 * logq (n, k) row[id] - lse, both in float. Computed where the rows live: one fused
 * threaded pass on the CPU, one kernel on CUDA; only the n * (2k + 1) numbers cross. The
 * sum is not today's double-precision row_lse: |lse - row_lse| <= 1e-5 * max(1, |lse|)
 * (tests/test_topk.c), and the same bits whatever the CPU thread count. RS_EINVAL when
 * k is outside [1, min(BACKEND_TOPK_MAX, vocab)]. */
int backend_rows_topk(Backend *b, int k, int *ids, float *logq, float *lse, RsErr *e);
/* keep: indices into the pending entries (0 = first pending), ascending not required
 * but each at most once. n_keep may be 0 (drop all pending). */
int backend_kv_commit(Backend *b, const int *keep, int n_keep, RsErr *e);
/* Forget sequence 0's context (new prompt); other sequences keep theirs. */
void backend_kv_reset(Backend *b);
/* Drops sequence 0's pending entries and its committed entries from n_committed on (0 <=
 * n_committed <= backend_n_committed): a drafter that committed a guess takes it back.
 * RS_EINVAL for n outside that range; RS_EUNSUPPORTED for a backend without it (CUDA). */
int backend_kv_truncate(Backend *b, int n_committed, RsErr *e);
/* backend_kv_commit of keep, and the pending entries stay[0 .. n_stay) stay pending as
 * entries 0 .. n_stay - 1 (each index in keep and stay at most once): a drafter that ran
 * rows ahead below what is now committed keeps them for its next pool. RS_EUNSUPPORTED
 * for a backend without it (CUDA) or while it records features. */
int backend_kv_commit_stay(Backend *b, const int *keep, int n_keep, const int *stay, int n_stay,
                           RsErr *e);
int backend_n_committed(const Backend *b); /* committed cache entries */
int backend_n_pending(const Backend *b);   /* pending entries after the committed ones */
int backend_kv_capacity(const Backend *b); /* committed + pending never exceed this */
BackendStats backend_stats(const Backend *b);
/* 1: each row query (backend_rows_stats, _gather, _topk) is a round trip to a device
 * (tens of microseconds whatever its size), so a caller gathers what it may read into one
 * call, rows it ends up not reading included; 0: a call is cheap and reduces only the rows
 * asked for (the CPU), so one per row read costs least. BackendParams.sw.rows_batched
 * overrides the backend's choice (tests compare both paths on one backend). */
int backend_batch_queries(const Backend *b);

/* ---- Sequences (see the top of this file) ---- */

/* Rows of one sequence in a batch: what backend_forward takes, for sequence seq (mask:
 * (n, n_pending(seq) + n) over that sequence's pending entries and these rows). */
typedef struct {
    int seq;
    const int *tokens, *pos;
    int n;
    const uint8_t *mask;
} BackendSeg;

/* The KV cache's blocks now. */
typedef struct {
    int block_size;   /* BACKEND_KV_BLOCK */
    int blocks_total; /* kv_capacity / BACKEND_KV_BLOCK, rounded up */
    int blocks_used;  /* held by the open sequences */
    int seqs_open;    /* sequence 0 included */
    int blocks_cached; /* published in the prefix cache (held or idle) */
} BackendKvUsage;

/* Opens an empty sequence: *seq in [1, max_seqs). RS_EFULL when max_seqs are open;
 * RS_EUNSUPPORTED on a backend of one sequence. */
int backend_seq_open(Backend *b, int *seq, RsErr *e);
/* Gives back every block of seq and closes it (seq 0: empties it, it stays open). */
void backend_seq_close(Backend *b, int seq);
/* backend_forward over the rows of several sequences, segs[i] rows following segs[i-1]'s:
 * out_rows index that concatenation (kept rows as backend_forward's). Each sequence at most
 * once; total rows within max_batch; each segment within its sequence's kv_capacity and
 * max_pending. RS_EFULL when the blocks the batch needs are not free (the caller may run
 * fewer sequences, or close one); every failure changes nothing. */
int backend_forward_batch(Backend *b, const BackendSeg *segs, int n_segs, const int *out_rows,
                          int n_out, float *logits, RsErr *e);
/* backend_kv_commit of sequence seq; blocks past its committed entries go back. */
int backend_seq_commit(Backend *b, int seq, const int *keep, int n_keep, RsErr *e);
int backend_seq_n_committed(const Backend *b, int seq);
int backend_seq_n_pending(const Backend *b, int seq);
/* Blocks a sequence holding `entries` entries needs. */
int backend_kv_blocks_for(int entries);
BackendKvUsage backend_kv_usage(const Backend *b);

/* ---- Prefix cache (BackendParams.prefix_cache) ----
 * A sequence publishes its full, committed blocks under the hash chain of the tokens up to
 * and including each (backend_prefix_hash over the blocks in order); a new sequence whose
 * first tokens are a published chain attaches those blocks instead of computing them. An
 * attached block is shared read-only (reference counts): a sequence writes only past its
 * committed entries, and shared blocks are full and committed, so none is ever written.
 * When no sequence holds a published block it stays cached (idle, counted free), and is
 * taken back least recently used when a sequence needs a block and none is free. The
 * block's tokens are stored and compared too, so a hash collision cannot alias two
 * prefixes. Rows are batch-invariant, so attached K/V are the bits a prefill would write:
 * the logits after an attach equal those of a full prefill. A backend without the cache
 * (CUDA) attaches nothing and publishes nothing. */

/* The chain hash of a block of BACKEND_KV_BLOCK tokens following chain value prev (0 for
 * the first block). */
uint64_t backend_prefix_hash(uint64_t prev, const int *tokens);
/* seq must be empty. Attaches the longest published chain of whole blocks that tokens[0..n)
 * starts with, then the longest run of the next tokens that a published block following
 * that chain starts with (those entries copied into a block of seq's own, when one is
 * free); returns the entries now committed (<= n). */
int backend_prefix_attach(Backend *b, int seq, const int *tokens, int n);
/* tokens: seq's first n committed entries' tokens; publishes its whole blocks among them. */
void backend_prefix_publish(Backend *b, int seq, const int *tokens, int n);

/* dst (open and empty) starts as src's first n committed entries, without computing them:
 * the whole blocks among them are shared (reference counts, as attached blocks are, and
 * never written: both sequences write past n only), the partial last block is copied into
 * a block of dst's own. The K and V are src's bits, so dst's rows are those of a prefill
 * of the same tokens (a request's n choices forking from one prompt). RS_EFULL when no
 * block is free for the copy; RS_EUNSUPPORTED on a backend without it (CUDA). Changes
 * nothing on failure. */
int backend_seq_fork(Backend *b, int src, int dst, int n, RsErr *e);

/* Logits buffers for forward(): host memory it copies into fastest (CUDA: pinned, so the
 * device-to-host copy runs at full speed; CPU: malloc). The caller owns them; free with
 * backend_host_free on the same backend, before destroying it. Start-up buffers only;
 * aborts on failure. backend_host_free accepts NULL. */
void *backend_host_alloc(Backend *b, size_t bytes);
void backend_host_free(Backend *b, void *p);

/* ---- EAGLE-3 target features (kept apart from the logits-row functions) ----
 * An EAGLE-3 drafter predicts from the target's residual stream entering a few of its
 * layers. Once asked (backend_set_feature_layers), every forward() records those vectors for
 * each row it runs, kept with the row's pending entry, and kv_commit() keeps the kept
 * entries' vectors in keep order: the caller reads them after the commit. Never asked (or
 * asked for none), a backend records nothing and forward() does no extra work. */
#define BACKEND_MAX_FEATURE_LAYERS 8

typedef enum { BACKEND_FEAT_F32 = 0, BACKEND_FEAT_BF16 = 1 } BackendFeatType;

/* layers: n strictly ascending indices in [0, n_layers]; index i is the residual stream
 * entering layer i (0: the token embeddings; n_layers: the last layer's output, before the
 * final norm). n = 0 stops recording. Nothing may be pending. RS_EINVAL names a bad index;
 * RS_ENOMEM when the buffers do not fit. */
int backend_set_feature_layers(Backend *b, const int *layers, int n, RsErr *e);
int backend_n_feature_layers(const Backend *b);
/* Values per row: n * dim, layers in the order given (0 when not recording). */
int backend_feature_width(const Backend *b);
/* Rows the last kv_commit kept (its n_keep), readable until the next kv_commit or
 * kv_reset; 0 after a reset or when not recording. */
int backend_feature_rows(const Backend *b);
/* Copies those rows, (rows, width) row-major, into out as t (bf16: round to nearest even).
 * The CUDA backend records bf16, so its f32 values are bf16 widened. */
void backend_read_features(Backend *b, BackendFeatType t, void *out);

/* ---- The verifier's row queries (target side) ----
 * Over the rows the last forward() kept in the backend (logits == NULL): rows[i] is an
 * index into that call's out_rows. Each returns a few numbers per row, computed where the
 * logits live (CPU: one fused pass split across the backend's threads; CUDA: one block per
 * row), so a decode moves no whole row to the host. Results follow common/logits.h's
 * canonical order: the same bits on every thread count, and on the CUDA emulator.
 * Errors: RS_EINVAL (row index outside the kept rows, id outside the vocabulary, a
 * Sampling outside its ranges, u outside [0, 1)). */
/* out[i] = RowStats of kept row rows[i] under the sampling law s (common/logits.h; greedy:
 * argmax, max, runner-up; sampling: also the filters' cut, 1/T and the log-sum-exp of the
 * kept tokens' l/T, so log p = row_stats_logp). u: NULL, or (n) uniforms from the caller's
 * Rng: when sampling, out[i].draw is the inverse-CDF draw of the law at u[i] (u[i] < 0:
 * none). A row with a non-finite maximum (or, sampling, log-sum-exp) has no law: RS_EFORMAT
 * naming it, so a model whose logits overflow fails its decode instead of the process. */
int backend_rows_stats(Backend *b, const int *rows, int n, const Sampling *s, const double *u,
                       RowStats *out, RsErr *e);
/* Kept row `row` (in [0, backend_n_kept)) where the host reads it in place: the CPU
 * backend's own buffer, valid until the next forward() or kv_reset(). NULL on a backend
 * whose rows live on a device, and for a row outside the kept ones. For callers that reduce
 * a few rows on their own threads rather than through the backend's (a batch's decodes,
 * each on its thread at once: target_proc/batch.c). */
const float *backend_kept_row(const Backend *b, int row);
/* out[i] = logit ids[i] of kept row rows[i] (log p = row_stats_logp of that row's stats). */
int backend_rows_gather(Backend *b, const int *rows, const int *ids, int n, float *out,
                        RsErr *e);

#endif
