/* The decode side of rootspec-serve: worker threads take jobs from a bounded queue;
 * connection threads create jobs, submit them and wait for their output. With parallel 1
 * one worker owns the engine's target and runs one job at a time; with parallel N, N
 * workers each decode on a view of a batcher (batch.h), whose passes carry the rows of
 * every running decode (continuous batching), each with a planner and a drafter of its
 * own (a suffix, self or model drafter, or a sequence of the engine's remote drafter's
 * session). A job is shared by its connection and the core (reference counted), so
 * either side may go first: a client that disconnects cancels its job, which the worker
 * skips if it is still queued or stops before its next round. */
#ifndef ROOTSPEC_SERVE_CORE_H
#define ROOTSPEC_SERVE_CORE_H
#include "serve.h"
#include "target_proc/batch.h"
#include "target_proc/roundlog.h"

typedef struct {
    const char *model_name;
    int queue_max;     /* jobs that may wait while one decodes */
    DecodeOpts opts_default;   /* decoder, budget, temp, seed, max_new when a request omits them */
    int parallel;      /* decodes at once (>= 1); > 1 runs them on a batcher */
    BatchOpts batch;   /* parallel > 1: the batcher's sizes (batch.parallel = parallel) */
    /* parallel > 1 with a drafter: what each worker opens (not an EAGLE-3 head; a remote
     * spec shares the engine's connection, a sequence per worker); NULL: none */
    const DrafterSpec *slot_drafter;
    /* > 0: the workers' suffix drafters also search the last suffix_global tokens of the
     * earlier requests' outputs (one index they share); 0: each request sees its own */
    int suffix_global;
    /* --log-rounds: one line per round of every decode, the round log of rootspec-target
     * and rootspec-bench (target_proc/roundlog.h), the request id as its prompt_id and a
     * recompute after preemption as its rep; NULL: none. Borrowed: the caller closes it
     * after serve_core_destroy. */
    FILE *round_log;
} ServeConfig;

typedef struct ServeCore ServeCore;
typedef struct ServeJob ServeJob;

/* Starts the workers. Borrows en, m and cfg's strings (they outlive the core). Fails
 * (with e set) only when the batcher or a worker's drafter cannot be made, or when
 * suffix_global is asked of a drafter that is not the suffix kind. */
int serve_core_create(Engine *en, const ServeConfig *cfg, ServeMetrics *m, ServeCore **out,
                      RsErr *e);
/* Stops the workers: the running jobs are cancelled, queued ones end with a 503, later
 * submissions get a 503. Connections may still read their jobs. Idempotent. */
void serve_core_stop(ServeCore *c);
/* serve_core_stop, then frees the core (no connection may use it any more). Clears *c. */
void serve_core_destroy(ServeCore **c);
/* Jobs waiting and decoding now. */
void serve_core_counts(ServeCore *c, int *queued, int *running);
ServeMetrics *serve_core_metrics(ServeCore *c);
/* The /metrics text: serve_metrics_render's, and the batcher's gauges when there is one. */
char *serve_core_metrics_text(ServeCore *c);
const char *serve_core_model(const ServeCore *c);
/* The model's context length in tokens. */
int serve_core_context(const ServeCore *c);
/* /tokenize: text's token ids (BOS first when add_special and the tokenizer adds one);
 * pieces (when not NULL): each token's bytes, malloc'd. /detokenize: the text of ids,
 * malloc'd, *len bytes. Both 400 on a model without a tokenizer or ids outside its
 * vocabulary; 0 on success. */
int serve_core_tokenize(ServeCore *c, const char *text, int add_special, int **ids, int *n,
                        char ***pieces, ServeError *se);
int serve_core_detokenize(ServeCore *c, const int *ids, int n, char **text, size_t *len, ServeError *se);

/* A job for a parsed request (its contents move into the job; r is left empty): encodes
 * the prompt, checks it against the context and the decoder options. Returns 0, or the
 * HTTP status with se set. The caller holds the one reference. */
int serve_job_create(ServeCore *c, ServeRequest *r, ServeJob **out, ServeError *se);
/* Queues the job (the core takes a reference of its own). 429 when the queue is full, 503
 * when the server is stopping; 0 on success. */
int serve_core_submit(ServeCore *c, ServeJob *j, ServeError *se);
/* j is choice j's request.choice (1..) of the request whose choice 0 is leader, created
 * and not yet submitted; leader is submitted first. j shares leader's response id, and
 * starts decoding once leader has its prompt in the KV cache, so the prompt's whole blocks
 * are computed once and shared (the prefix cache). */
void serve_job_follow(ServeJob *j, ServeJob *leader);
/* The client is gone: skip or stop the decode. */
void serve_job_cancel(ServeJob *j);
/* Drops the caller's reference; clears *j. */
void serve_job_unref(ServeJob **j);
const ServeMeta *serve_job_meta(const ServeJob *j);
const ServeRequest *serve_job_request(const ServeJob *j);

/* What serve_job_wait reports. */
typedef struct {
    char *text;          /* new output (malloc'd; caller frees) or NULL */
    size_t n;
    int done;            /* the job ended: finish_reason or failed is set */
    const char *finish_reason; /* "stop" or "length" */
    int failed;          /* the decode failed: err says why */
    ServeError err;
    ServeUsage usage;
    const ServeLogprobs *lp; /* done and asked for: the tokens' log-probabilities (the job's,
                                valid while the caller holds its reference) */
    ServeLogprobs *lp_new;   /* streams asking for them: the entries not taken before
                                (malloc'd: serve_logprobs_free, then free), or NULL */
} ServeOutput;

/* Waits up to timeout_ms for new output or the end of the job. Returns 1 when out has
 * something (text, done or both), 0 on timeout. */
int serve_job_wait(ServeJob *j, int timeout_ms, ServeOutput *out);

#endif
