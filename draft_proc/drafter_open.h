/* One way to open a drafter from what a user said (rootspec-target, rootspec-bench,
 * rootspec-draft, the server): a DrafterSpec names the kind, or leaves it to be inferred
 * from the fields given, and drafter_open builds it beside its host (the target it drafts
 * for, or in rootspec-draft the model whose tokenizer it speaks). The kinds themselves are
 * in their own headers (drafter.h lists them); only this file decides between them. */
#ifndef ROOTSPEC_DRAFTER_OPEN_H
#define ROOTSPEC_DRAFTER_OPEN_H
#include "common/tokenizer.h"
#include "common/eagle3.h"
#include "drafter.h"
#include "kernels/backend.h"

typedef enum {
    DRAFTER_KIND_AUTO = 0, /* infer: endpoint -> remote; model path -> eagle3 when it is an
                              EAGLE-3 head, else model; corpus -> suffix; else self */
    DRAFTER_KIND_SELF,     /* a layer subset of the host model (layers) */
    DRAFTER_KIND_MODEL,    /* a model of its own (model, or model_path) */
    DRAFTER_KIND_EAGLE3,   /* an EAGLE-3 head (model_path) fed the host's features */
    DRAFTER_KIND_SUFFIX,   /* model-free (corpus_path optional) */
    DRAFTER_KIND_REMOTE,   /* a rootspec-draft process (endpoint) */
} DrafterKind;

typedef struct {
    DrafterKind kind;
    const char *model_path;  /* model / eagle3 */
    const Model *model;      /* model: an already loaded drafter model (borrowed), instead
                                of model_path */
    const char *layers;      /* self: model_layer_view's spec; NULL: DRAFTER_DEFAULT_LAYERS */
    const char *corpus_path; /* suffix: a UTF-8 text file tokenized with the host's tokenizer */
    const char *endpoint;    /* remote */
    int timeout_ms, insecure;
    const char *curve_dir;   /* remote over tcp:// */
    Eagle3LayerIds layer_ids; /* eagle3: how to read the head's listed feature-layer ids
                                 (--eagle3-layer-ids; AUTO: as the head says or infers) */
    int threaded;            /* wrap an in-process kind so its growth runs on a worker thread
                                (not the suffix kind: it grows faster than a hand-off) */
} DrafterSpec;

typedef struct {
    const Model *model;     /* the host model: the target (vocabulary, tokenizer, layers for
                               self, embeddings and features for eagle3) */
    const Tokenizer *tok;   /* its tokenizer, NULL for random models (a suffix corpus or a
                               drafter model then cannot be checked: refused) */
    const BackendOps *ops;
    /* what a drafter's backend shares with its host's: kv_capacity (the context),
     * threads, device, batch_invariant; each kind sets its own batch sizes */
    BackendParams backend;
} DrafterHost;

/* Self-drafter default: of the subsets measured with SmolLM2-135M (T=0, B=59, draft
 * selection; 0-2, 0-5, 0-9, 0-14, 0-2+27-29, 0-3+26-29), 0-14 accepted the most tokens per
 * round while costing at most half a target pass. */
#define DRAFTER_DEFAULT_LAYERS "0-14"

/* The kind spec asks for, inferred when DRAFTER_KIND_AUTO (the only place that looks at a
 * model path to tell a head from a model). */
DrafterKind drafter_spec_kind(const DrafterSpec *s);
const char *drafter_kind_name(DrafterKind k);
/* "self", "model", "eagle3", "suffix", "remote"; -1 when unknown. */
int drafter_kind_parse(const char *name);

/* --drafter KIND: a local kind (a remote drafter has an option of its own). */
int drafter_kind_option(const char *val, DrafterKind *k, RsErr *e);

/* Opens the drafter; a drafter model of its own is refused (RS_EINVAL, both paths named)
 * when its vocabulary or tokenizer differs from the host's. Errors of the kind's
 * constructor and loaders as they are. *out borrows h->model: destroy it first. */
int drafter_open(const DrafterSpec *s, const DrafterHost *h, Drafter **out, RsErr *e);

#endif
