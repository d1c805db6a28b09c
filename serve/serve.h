/* rootspec-serve: an OpenAI-compatible HTTP front end to the engine. The pieces:
 *   serve_api.c     request JSON -> ServeRequest (every rejected field named), the response,
 *                   chunk, model list and error JSON, the sampling fields -> DecodeOpts
 *   serve_text.c    detokenized output: stop strings (a partial match is held back while
 *                   streaming), UTF-8 that is never cut inside a character
 *   serve_metrics.c Prometheus counters and histograms
 *   serve_core.c    the one decode worker, its bounded queue and the jobs it runs
 *   serve_gate.c    what a request must show before a route answers it: an allowed Host,
 *                   an API key, a JSON Content-Type (no sockets: the fuzzer calls it too)
 *   serve_http.c    libmicrohttpd: routes, body limits, SSE, client disconnects
 * The engine decodes --parallel requests at once (one, or a batcher's views: batch.h);
 * the rest wait in a bounded queue (429 when full). */
#ifndef ROOTSPEC_SERVE_H
#define ROOTSPEC_SERVE_H
#include "common/tokenizer.h"
#include "target_proc/decode.h"
#include "target_proc/engine.h"
#include "target_proc/batch.h"
#include <stddef.h>
#include <stdint.h>

/* ---- requests and errors ------------------------------------------------------------ */

typedef enum { SERVE_CHAT, SERVE_COMPLETION } ServeKind;

#define SERVE_STOP_MAX 4     /* OpenAI's limit on stop strings */
#define SERVE_MSGS_MAX 256   /* turns in one chat request */
#define SERVE_STOP_LEN 256   /* bytes per stop string */
#define SERVE_N_MAX 16       /* choices in one request ("n") */

/* An OpenAI-style error: HTTP status, the error object's type/code/param and message. */
typedef struct {
    int status;
    const char *type, *code; /* static strings; code may be NULL */
    char param[64];          /* "" for none */
    char msg[1024];
} ServeError;

/* Sets se and returns status (so handlers can `return serve_error(...)`); param may be NULL. */
int serve_error(ServeError *se, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* A parsed request: what the prompt is and how to decode it. Fields the client omitted
 * keep their "absent" value (has_* == 0, rule < 0, budget 0, max_tokens 0). */
typedef struct {
    ServeKind kind;
    char *text;            /* completion: the prompt string */
    ChatMsg *msgs;         /* chat: the conversation (roles and contents owned here) */
    int n_msgs;
    int *ids, n_ids;       /* completion given as token ids (ids != NULL; text NULL) */
    int max_tokens;
    int stream, include_usage;
    char *stop[SERVE_STOP_MAX];
    int n_stop;
    int has_temperature, has_top_p, has_top_k, has_min_p, has_seed;
    double temperature, top_p, min_p;
    int top_k;
    uint64_t seed;
    int n;                 /* choices, 1..SERVE_N_MAX (each a job; they share the prompt) */
    int choice;            /* which choice this request decodes: with a seed, its stream */
    int logprobs;          /* chat "logprobs": true / completions "logprobs": N: report them */
    int echo;              /* completions "echo": the prompt's text (and with logprobs, its
                              tokens' log-probabilities) before the output */
    int top_logprobs;      /* alternatives per token (chat "top_logprobs", completions N) */
    int decoder;              /* extension "rootspec": {"decoder": NAME}; -1 absent */
    int budget;            /* extension "rootspec": {"budget": B}; 0 absent */
} ServeRequest;

/* Parses a request body of len bytes (not necessarily NUL-terminated). model_name: the
 * served model's id; a request naming another model is a 404. Returns 0, or the HTTP status
 * with se set (r is then empty). */
int serve_request_parse(const char *body, size_t len, ServeKind kind, const char *model_name,
                        ServeRequest *r, ServeError *se);
/* Frees what serve_request_parse allocated; r is left zeroed. */
void serve_request_free(ServeRequest *r);

/* The request's sampling fields onto the decode's Sampling (common/logits.h: temperature,
 * top_k (-1 or 0: off), top_p, min_p; every decoder follows that law exactly) and seed.
 * Absent fields keep d's values (the server's defaults); a law out of range is a 400.
 * Returns 0 or the HTTP status. */
int serve_sampling_map(const ServeRequest *r, DecodeOpts *opts, ServeError *se);

/* ---- the gate ------------------------------------------------------------------------ */

typedef enum {
    ROUTE_HEALTH, ROUTE_MODELS, ROUTE_METRICS, ROUTE_CHAT, ROUTE_COMPLETION, ROUTE_TOKENIZE,
    ROUTE_DETOKENIZE, ROUTE_COUNT
} ServeRoute;

/* Who may ask: Host names (a browser page on another origin names its own, which is how a
 * loopback server is kept from DNS rebinding), API keys, and whether /metrics needs one. */
typedef struct {
    char **hosts;       /* allowed Host header names, lower case, without the port */
    int n_hosts;        /* 0: any Host */
    char **keys;        /* API keys; n_keys 0: no authentication */
    int n_keys;
    int metrics_public; /* /metrics without a key */
    size_t max_body;    /* for the 413's message */
} ServeGate;

/* A request as far as the gate looks: its line, three headers (NULL when absent) and
 * whether the body outgrew max_body. */
typedef struct {
    const char *method, *url;
    const char *host, *content_type, *authorization;
    int too_large;
} ServeHead;

/* The route h asks for, or an error: 403 a Host not allowed, 404 no such route, 405 the
 * wrong method, 401 a missing or wrong key (/health is open), 413 a body over max_body, 415
 * a POST whose Content-Type is not application/json. Returns 0 or the status. */
int serve_gate_check(const ServeGate *g, const ServeHead *h, ServeRoute *route, ServeError *se);
/* Allowed hosts from a comma-separated list ("*": any); list NULL: the loopback names and
 * bind when bind is a loopback address, else any. */
int serve_gate_hosts(ServeGate *g, const char *list, const char *bind, RsErr *e);
/* Adds one key (copied). */
void serve_gate_add_key(ServeGate *g, const char *key);
/* Keys from a file, one a line (blank lines and lines starting with # skipped); refused
 * when the file is readable by group or others, or holds no key. */
int serve_gate_key_file(ServeGate *g, const char *path, RsErr *e);
void serve_gate_free(ServeGate *g);

/* ---- response JSON (malloc'd strings, caller frees) --------------------------------- */

typedef struct {
    ServeKind kind;
    char id[48];
    long created;
    const char *model;
    int index; /* the choice a stream's chunks carry ("n") */
} ServeMeta;

typedef struct {
    int prompt_tokens, completion_tokens;
    int cached_tokens; /* of the prompt's, taken from the prefix cache */
} ServeUsage;

#define SERVE_TOP_LOGPROBS 20 /* OpenAI's limit on top_logprobs */

/* Each output token's log-probability under the law it was drawn from (the request's
 * sampling law; at temperature 0 the model's own distribution, T = 1 unfiltered), and the
 * top_n most likely tokens of that law with theirs. */
typedef struct {
    int n, cap, top_n;
    int *ids;         /* (n) */
    double *lp;       /* (n) */
    int *top_ids;     /* (n * top_n); -1 past the tokens the law keeps */
    double *top_lp;
    const Tokenizer *tok; /* the tokens' text; NULL: " <id>" */
    size_t offset0;       /* bytes of output before entry 0 (a stream's later chunks) */
} ServeLogprobs;

/* Appends one token: its row of vocab logits and the law (greedy: T = 1 unfiltered). */
void serve_logprobs_add(ServeLogprobs *l, const float *row, int vocab, const Sampling *law, int id);
/* Appends a token nothing predicts (echo's first prompt token): null log-probabilities. */
void serve_logprobs_add_none(ServeLogprobs *l, int id);
void serve_logprobs_free(ServeLogprobs *l);
/* dst (empty) gets src's entries [from, to), copied. */
void serve_logprobs_slice(ServeLogprobs *dst, const ServeLogprobs *src, int from, int to);

char *serve_error_json(const ServeError *se);
/* The model list; context: the model's context length in tokens. */
char *serve_models_json(const char *model, long created, int context);

/* /tokenize and /detokenize (llama-server's shapes): {"content": TEXT, "add_special": bool,
 * "with_pieces": bool} -> {"tokens": [id, ...]} (with pieces: [{"id": id, "piece": text}]);
 * {"tokens": [id, ...]} -> {"content": TEXT}. The parsers return 0 or the HTTP status. */
int serve_tokenize_parse(const char *body, size_t len, char **text, int *add_special,
                         int *with_pieces, ServeError *se);
int serve_detokenize_parse(const char *body, size_t len, int **ids, int *n, ServeError *se);
/* pieces: each token's bytes (NULL: ids only). */
char *serve_tokens_json(const int *ids, int n, char *const *pieces);
char *serve_content_json(const char *text, size_t n);
/* The whole non-streamed answer: text (n bytes, valid UTF-8), finish_reason, usage. */
char *serve_response_json(const ServeMeta *m, const char *text, size_t n,
                          const char *finish_reason, const ServeUsage *u);
/* The same with the tokens' log-probabilities (lp NULL: none asked). */
char *serve_response_logprobs_json(const ServeMeta *m, const char *text, size_t n,
                                   const char *finish_reason, const ServeUsage *u,
                                   const ServeLogprobs *lp);
/* One choice of several ("n"): its text (n bytes, valid UTF-8), finish_reason, logprobs. */
typedef struct {
    const char *text;
    size_t n;
    const char *finish_reason;
    const ServeLogprobs *lp;
} ServeChoice;
char *serve_response_choices_json(const ServeMeta *m, const ServeChoice *ch, int n_choices,
                                  const ServeUsage *u);
/* One streamed chunk: role_only (chat's first chunk: the assistant role, empty content), a
 * text delta (text != NULL), or the last one (finish_reason != NULL, empty delta). u != NULL:
 * the usage chunk (no choices) that stream_options.include_usage asks for. */
char *serve_chunk_json(const ServeMeta *m, int role_only, const char *text, size_t n,
                       const char *finish_reason, const ServeUsage *u);
/* A text delta with the log-probabilities of the tokens that arrived with it (their text may
 * come in this chunk or a later one: stop strings and characters hold text back). */
char *serve_chunk_logprobs_json(const ServeMeta *m, const char *text, size_t n, const ServeLogprobs *lp);

/* ---- output text --------------------------------------------------------------------- */

/* Detokenized output on its way to the client: bytes come in token by token; what may be
 * sent is the prefix that can no longer become part of a stop string and does not end
 * inside a UTF-8 character. A matched stop string ends the text before it. */
typedef struct {
    char *buf;
    size_t len, cap;
    size_t sent;     /* bytes already taken by serve_text_take */
    size_t ready;    /* bytes that may be sent: sent <= ready <= len */
    const char *const *stop;
    int n_stop;
    int matched;     /* a stop string matched: buf ends before it, nothing more is added */
} ServeText;

void serve_text_init(ServeText *t, const char *const *stop, int n_stop);
void serve_text_free(ServeText *t);
/* Appends n bytes of output (ignored once a stop string matched). */
void serve_text_push(ServeText *t, const char *b, size_t n);
/* Text before the output (completions echo): ready at once, never part of a stop match.
 * Only before any serve_text_push. */
void serve_text_prefix(ServeText *t, const char *b, size_t n);
/* The output is complete: everything left becomes ready. */
void serve_text_finish(ServeText *t);
/* The ready bytes not taken yet, as valid UTF-8 (invalid bytes become U+FFFD), malloc'd
 * and NUL-terminated; *n its length. NULL when there is nothing new. */
char *serve_text_take(ServeText *t, size_t *n);
/* Valid UTF-8 copy of s[0..n) (invalid sequences become U+FFFD), malloc'd, NUL-terminated. */
char *serve_utf8_clean(const char *s, size_t n, size_t *out_n);

/* ---- metrics ------------------------------------------------------------------------- */

typedef struct ServeMetrics ServeMetrics;
typedef enum { FINISH_STOP, FINISH_LENGTH, FINISH_CANCELLED, FINISH_ERROR, FINISH_COUNT } ServeFinish;

void serve_metrics_create(ServeMetrics **out);
void serve_metrics_destroy(ServeMetrics **m);
void serve_metrics_request(ServeMetrics *m, int http_status);
void serve_metrics_finish(ServeMetrics *m, ServeFinish f, int prompt_tokens, int tokens,
                          int drafter_failed);
void serve_metrics_ttft(ServeMetrics *m, double seconds);
/* A decode's prompt: cached entries from the prefix cache, computed the rest. */
void serve_metrics_prompt(ServeMetrics *m, int cached, int computed);
/* n tokens arrived together gap seconds after the previous ones: n samples of gap / n. */
void serve_metrics_itl(ServeMetrics *m, double gap, int n);
void serve_metrics_round(ServeMetrics *m, int tokens, int fallback_ar);
/* Prometheus text exposition (version 0.0.4), malloc'd; queued/running: the gauges. */
char *serve_metrics_render(ServeMetrics *m, int queued, int running);
/* The same with a batcher's gauges and counters (batch NULL: none). */
char *serve_metrics_render_batch(ServeMetrics *m, int queued, int running, const BatchStats *batch);

#endif
