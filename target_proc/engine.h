/* Engine set-up shared by rootspec-target and rootspec-bench: loads the target (and the
 * drafter: a model of its own, a layer subset of the target, or a remote drafter process),
 * the tokenizer, and builds prompt token ids. */
#ifndef ROOTSPEC_ENGINE_H
#define ROOTSPEC_ENGINE_H
#include "common/tokenizer.h"
#include "decode.h"
#include "draft_proc/drafter_open.h"

typedef struct {
    const char *model_path;
    DrafterKind drafter_kind;     /* DRAFTER_KIND_AUTO: inferred from the fields below */
    const char *draft_model_path; /* NULL: self-drafter from draft_layers */
    const char *draft_layers;     /* NULL: DRAFTER_DEFAULT_LAYERS */
    const char *draft_endpoint;   /* NULL: in-process drafter */
    const char *draft_corpus;     /* suffix drafter: a text file it also looks in */
    Eagle3LayerIds eagle3_layer_ids; /* --eagle3-layer-ids (AUTO: as the head says) */
    const char *backend;          /* "cpu" (default) or "cuda" */
    int threads, device, ctx;
    int batch_invariant;          /* BackendParams.batch_invariant for every backend */
    int prefix_cache;             /* BackendParams.prefix_cache for every backend */
    const char *cpu_kernels;      /* BackendParams.cpu_kernels for every backend */
    BackendSwitches sw;           /* BackendParams.sw for every backend */
    int draft_timeout_ms;         /* remote drafter reply timeout */
    int insecure;                 /* allow plain tcp:// */
    const char *curve_dir;        /* key files for tcp:// */
    int drafter_optional;         /* a remote drafter that does not answer the HELLO: open
                                   * without one (Engine.drafter_missing) instead of failing */
    int chat_special_tokens;      /* special tokens spelled in chat content become their ids
                                   * (trusted callers); 0: plain text (engine_chat_ids) */
} EngineOpts;

typedef struct {
    Model *target_model;
    Tokenizer *tok;
    ChatTemplate chat;
    Target *target;
    Drafter *drafter;    /* NULL without a drafter (--decoder ar); any kind: decode_run's */
    Planner *planner;    /* --budget auto's: one for the engine, so what it measures carries
                            over from one decode to the next */
    char drafter_missing[1024]; /* drafter_optional: why there is no drafter, else "" */
    int chat_special_tokens;    /* EngineOpts' */
    char vocab_note[256];       /* a tokenizer smaller than the vocabulary: the ids without
                                   text, said once at start-up (engine_cli_open), else "" */
} Engine;

/* need_drafter: 0 for --decoder ar (no drafter is loaded or contacted). *out is a new
 * Engine the caller owns (engine_destroy), NULL on error. */
/* The settings every backend of the engine shares (the target's, an in-process drafter's,
 * a batcher's): context, threads, device, kernel family, batch invariance; each backend
 * sets its own batch sizes. */
BackendParams engine_backend_params(const EngineOpts *eo);
int engine_create(const EngineOpts *eo, int need_drafter, Engine **out, RsErr *e);
/* Frees the drafter, target, tokenizer and models; accepts NULL, clears the pointer. */
void engine_destroy(Engine **en);
/* Encodes a user prompt (through the chat template when chat != 0), adding BOS when the
 * model's tokenizer does. *ids is malloc'd; caller frees. */
int engine_prompt_ids(const Engine *en, const char *text, int chat, int **ids, int *n, RsErr *e);
/* A conversation through the model's chat template (chat_render), adding BOS as above. The
 * turns' contents are the caller's words: a special token spelled there (<|im_end|>, ...)
 * encodes as the text it is, so content cannot close its turn and forge another, unless
 * the engine was opened with chat_special_tokens. Also engine_prompt_ids' chat path. */
int engine_chat_ids(const Engine *en, const ChatMsg *m, int n_msgs, int **ids, int *n, RsErr *e);

#endif
