/* The one drafter interface (ggml style: an opaque handle and functions here, the ops table
 * in draft_proc/drafter_impl.h, which only implementations include). A drafter keeps the
 * committed context of one decode and grows the candidate pool (DESIGN.md §2) below its newest
 * token. The target's decode loop, rootspec-draft's server and the tests hold a Drafter and
 * never ask which kind it is.
 *
 * Kinds:
 *   model     a drafter model of its own, or the self-drafter (a layer subset of the
 *             target): draft_proc/model_drafter.h. Grows synchronously in grow_begin.
 *   eagle3    an EAGLE-3 head fed the target's hidden features: draft_proc/eagle3_drafter.h.
 *   suffix    model-free: continuations of earlier occurrences of the context's tail
 *             (draft_proc/suffix_drafter.h).
 *   threaded  an adapter that runs any Drafter's growth on a worker thread, so the target's
 *             root pass overlaps drafting in one process (drafter_threaded_create below).
 *   remote    a rootspec-draft process over ZeroMQ: draft_proc/remote_drafter.h.
 * Programs open one by description through draft_proc/drafter_open.h.
 *
 * Adding a kind: write a DrafterOps (drafter_impl.h) over your own context struct, and a
 * constructor `int drafter_KIND_create(..., Drafter **out, RsErr *e)` that ends with
 * drafter_wrap(), declared in a header of its own; then name it in drafter_open.c. The
 * engine, decode_run and the server take any Drafter. An EAGLE-3 head predicts from the
 * target's hidden features of the committed tokens: the commit calls carry them
 * (`features`, below), which the other kinds ignore.
 *
 * Per-token features: `features` is (n, feat_dim) row-major, feat_bytes bytes in all, the
 * target's hidden features for each token of the commit, in order; NULL with feat_bytes 0
 * when the caller has none. A kind that needs them refuses a commit without them
 * (RS_EINVAL); kinds that do not need them ignore them. DrafterInfo.n_feature_layers > 0
 * says a kind needs them and which target layers they come from. The remote kind sends
 * them as bf16 (protocol v2) and takes the layers from the drafter's HELLO_OK. */
#ifndef ROOTSPEC_DRAFTER_H
#define ROOTSPEC_DRAFTER_H
#include "common/pool.h"
#include <stddef.h>

typedef struct Drafter Drafter;

#define DRAFTER_MAX_FEATURE_LAYERS 8

typedef struct {
    int vocab_size;          /* token ids the drafter accepts and proposes: [0, vocab_size) */
    const char *fingerprint; /* the drafter's weights (HELLO_OK); "" when unknown */
    const char *name;        /* for messages: a model path, or a remote endpoint */
    /* > 0: every commit needs f32 features of the residual stream entering these target
     * layers (ascending), concatenated per token; 0: the kind ignores features. */
    int n_feature_layers;
    int feature_layers[DRAFTER_MAX_FEATURE_LAYERS];
} DrafterInfo;

/* Forgets the committed context, then commits `prompt` (n >= 0) without growing a pool; the
 * next grow continues from it (rootspec-draft's RESET). Errors: RS_EINVAL for a token
 * outside the vocabulary or a full KV cache; I/O errors for the remote kind. After an error
 * the context is unknown: reset again before growing. */
int drafter_reset(Drafter *d, const int *prompt, int n, const void *features, size_t feat_bytes,
                  RsErr *e);

/* Commits `tokens` (n >= 1) after the context without growing a pool: the continuation of
 * a prompt too long for one message (rootspec-draft's APPEND, after a RESET). Errors as
 * drafter_reset's; RS_EUNSUPPORTED for a kind without it (tests' wrappers). */
int drafter_append(Drafter *d, const int *tokens, int n, const void *features, size_t feat_bytes,
                   RsErr *e);

/* Commits `tokens` (n >= 1: the round's emitted tokens) and starts growing the pool below
 * the last of them; it may return before the pool is ready (the threaded and remote kinds
 * do), so the caller's own work overlaps drafting. reset = 1 forgets the context first (as
 * drafter_reset(d, NULL, 0, ...)), so `tokens` is then the whole prompt. The tokens and
 * features are copied or used before it returns. An error here means no growth started:
 * do not call drafter_grow_end. A grow_begin with a growth still outstanding abandons it. */
int drafter_grow_begin(Drafter *d, const int *tokens, int n, int reset, const void *features,
                       size_t feat_bytes, RsErr *e);

/* Waits for the pool that the last successful drafter_grow_begin started and copies it to
 * *out (pool_finalize'd; its draft_ns and commit_pass_ns set). Errors of the commit or the
 * growth (RS_EINVAL: token outside the vocabulary or KV cache full, nothing committed;
 * RS_EFORMAT: non-finite logits, tokens committed; RS_ETIMEOUT / RS_EPEER / RS_EPROTO /
 * RS_EIO: remote) come here or from grow_begin; after one, reset before growing again.
 * Calling it without an outstanding grow_begin is a programming error (aborts). */
int drafter_grow_end(Drafter *d, Pool *out, RsErr *e);

/* grow_begin (no reset) then grow_end: for callers with nothing to overlap (the threaded
 * kind's worker, rootspec-draft's server). */
int drafter_grow(Drafter *d, const int *tokens, int n, const void *features, size_t feat_bytes,
                 Pool *out, RsErr *e);
/* drafter_grow without features. */
int drafter_commit_grow(Drafter *d, const int *tokens, int n, Pool *out, RsErr *e);

/* The shape of the next growths' pools (DESIGN.md §2, "Pool shape"): the deepest level
 * they may reach, 1..POOL_MAX_DEPTH, and how many nodes a level expands, 1..POOL_EXPAND (a
 * cost-aware decoder asks for shallower or narrower pools when deep or wide candidates do
 * not pay for their passes): a model kind runs depth - 1 expansion passes of `width` rows,
 * the suffix kind follows matches that far (its matches decide the width). Kinds without
 * the op keep the full shape (8, 10). Call it between growths (not while one is
 * outstanding); the remote kind sends it with the next commit. */
void drafter_set_shape(Drafter *d, int depth, int width);

/* Run-ahead (DESIGN.md §5): work done between a pool and the next commit, while the
 * target verifies. A model kind guesses the next commit (the pool's best path, then its
 * best continuation), commits the guess and grows the pool below it; the next grow keeps
 * that work when its tokens are the guess and takes the guess back otherwise, so every
 * pool is the one the commit alone would grow. stop(arg) is asked before each pass and
 * returns nonzero when the caller has a request waiting: run-ahead then returns at once.
 * Call it after a grow_end (or drafter_grow), never while a growth is outstanding; kinds
 * without it do nothing. Errors are its own: a guess it cannot keep is taken back. */
void drafter_ahead(Drafter *d, int (*stop)(void *), void *arg);

typedef struct {
    long guesses;     /* guesses committed */
    long hits;        /* commits that were the guess */
    long misses;      /* commits that were not (the guess taken back) */
    long pools_ready; /* hits whose pool was grown whole before the commit came */
    /* Committed tokens whose rows a model kind kept from the last pool's expansions, and
     * those it ran in commit passes (prompts included). */
    long rows_kept, rows_run;
    /* Passes of growth ahead of the last pool (while guesses seldom hit), and commits
     * that ran no commit pass: they ended on a node whose row had run. */
    long ahead_passes, commits_free;
    long expansions_free; /* pool expansions taken from rows that ran ahead */
} DrafterAheadStats;
/* What run-ahead did so far (zeros for a kind without it). */
DrafterAheadStats drafter_ahead_stats(const Drafter *d);

/* Size, weights and name; valid until drafter_destroy. */
const DrafterInfo *drafter_info(const Drafter *d);

/* Waits for an outstanding growth, frees the drafter and whatever it owns (an inner
 * drafter, a layer view); accepts NULL and a NULL *d and clears the caller's pointer. */
void drafter_destroy(Drafter **out);

/* The threaded kind: runs `inner`'s grow_begin + grow_end on a worker thread, so that
 * drafter_grow_begin returns at once. Takes ownership of inner (also on failure). */
int drafter_threaded_create(Drafter *inner, Drafter **out, RsErr *e);

#endif
