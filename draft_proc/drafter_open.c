/* The drafter factory (drafter_open.h): the kind, then its constructor. */
#include "drafter_open.h"
#include "common/eagle3.h"
#include "eagle3_drafter.h"
#include "model_drafter.h"
#include "remote_drafter.h"
#include "suffix_drafter.h"
#include <string.h>

static const char *const KIND_NAMES[] = {"auto", "self", "model", "eagle3", "suffix", "remote"};

const char *drafter_kind_name(DrafterKind k) {
    return k >= 0 && k <= DRAFTER_KIND_REMOTE ? KIND_NAMES[k] : "?";
}

int drafter_kind_parse(const char *name) {
    for (int k = DRAFTER_KIND_SELF; k <= DRAFTER_KIND_REMOTE; k++)
        if (name && !strcmp(name, KIND_NAMES[k])) return k;
    return -1;
}

int drafter_kind_option(const char *val, DrafterKind *k, RsErr *e) {
    int kind = drafter_kind_parse(val);
    if (kind < 0 || kind == DRAFTER_KIND_REMOTE)
        return rs_err(e, RS_EINVAL, "--drafter '%s': expected self, model, eagle3 or suffix", val);
    *k = (DrafterKind)kind;
    return RS_OK;
}

DrafterKind drafter_spec_kind(const DrafterSpec *s) {
    if (s->kind != DRAFTER_KIND_AUTO) return s->kind;
    if (s->endpoint) return DRAFTER_KIND_REMOTE;
    if (s->model) return DRAFTER_KIND_MODEL;
    if (s->model_path)
        return eagle3_path_is_head(s->model_path) ? DRAFTER_KIND_EAGLE3 : DRAFTER_KIND_MODEL;
    if (s->corpus_path) return DRAFTER_KIND_SUFFIX;
    return DRAFTER_KIND_SELF;
}

/* A drafter model must speak the host's tokens: same vocabulary, same tokenizer. */
static int check_same_tokens(const Model *dm, const DrafterHost *h, RsErr *e) {
    const Model *tm = h->model;
    if (dm->cfg.vocab_size != tm->cfg.vocab_size)
        return rs_err(e, RS_EINVAL,
                      "drafter vocabulary (%d tokens, %s) differs from the target's (%d "
                      "tokens, %s): they must share a tokenizer",
                      dm->cfg.vocab_size, dm->path, tm->cfg.vocab_size, tm->path);
    Tokenizer *dt = NULL;
    int rc = tokenizer_load_model(dm, &dt, e);
    if (rc) return rc;
    uint64_t h1 = tokenizer_identity(h->tok, tm->cfg.vocab_size);
    uint64_t h2 = tokenizer_identity(dt, dm->cfg.vocab_size);
    tokenizer_destroy(&dt);
    if (h1 != h2)
        return rs_err(e, RS_EINVAL,
                      "drafter tokenizer (hash %016llx, %s) differs from the target's (hash "
                      "%016llx, %s)",
                      (unsigned long long)h2, dm->path, (unsigned long long)h1, tm->path);
    return RS_OK;
}

static int open_model(const DrafterSpec *s, const DrafterHost *h, Drafter **out, RsErr *e) {
    if (s->model)
        return drafter_model_create(s->model, h->ops, &h->backend, out, e);
    if (!s->model_path) return rs_err(e, RS_EINVAL, "a model drafter needs a model path");
    Model *dm = NULL;
    int rc = backend_model_load(h->ops, s->model_path, &h->backend, &dm, e);
    if (!rc && h->model) rc = check_same_tokens(dm, h, e);
    if (rc) {
        model_destroy(&dm);
        return rc;
    }
    return drafter_model_adopt(dm, h->ops, &h->backend, out, e);
}

/* The corpus file as the host tokenizer's ids (NULL path: none). */
static int suffix_open(const DrafterSpec *s, const DrafterHost *h, Drafter **out, RsErr *e) {
    int *ids = NULL, n = 0, rc;
    char name[300] = "suffix";
    if (s->corpus_path) {
        if (!h->tok)
            return rs_err(e, RS_EINVAL, "suffix drafter corpus %s: model '%s' has no tokenizer "
                          "to read it with", s->corpus_path, h->model->path);
        char *text = NULL;
        size_t len = 0;
        if ((rc = rs_read_file(s->corpus_path, &text, &len, e))) return rc;
        rc = tokenizer_encode(h->tok, text, &ids, &n, e);
        free(text);
        if (rc) return rc;
        snprintf(name, sizeof name, "suffix+%s", s->corpus_path);
    }
    rc = drafter_suffix_create(h->model->cfg.vocab_size, ids, (size_t)n, name, out, e);
    free(ids);
    return rc;
}

static int open_local(const DrafterSpec *s, const DrafterHost *h, Drafter **out, RsErr *e) {
    switch (drafter_spec_kind(s)) {
    case DRAFTER_KIND_SELF:
        return drafter_self_create(h->model, s->layers ? s->layers : DRAFTER_DEFAULT_LAYERS,
                                   h->ops, &h->backend, out, e);
    case DRAFTER_KIND_MODEL: return open_model(s, h, out, e);
    case DRAFTER_KIND_EAGLE3: {
        /* the head's vocabulary is the target's (eagle3_head_check), its tokenizer too */
        BackendParams hp = h->backend;
        hp.kv_capacity += POOL_N_EXPANDED;
        return drafter_eagle3_open(s->model_path, h->model, s->layer_ids, h->ops, &hp, out, e);
    }
    case DRAFTER_KIND_SUFFIX: return suffix_open(s, h, out, e);
    default: RS_ASSERT(!"drafter kind");
    }
    return RS_EINVAL;
}

int drafter_open(const DrafterSpec *s, const DrafterHost *h, Drafter **out, RsErr *e) {
    *out = NULL;
    if (drafter_spec_kind(s) == DRAFTER_KIND_REMOTE)
        return drafter_remote_create(s->endpoint, h->model,
                                     tokenizer_identity(h->tok, h->model->cfg.vocab_size),
                                     s->timeout_ms, s->insecure, s->curve_dir, out, e);
    Drafter *local = NULL;
    int rc = open_local(s, h, &local, e);
    /* The suffix kind grows in microseconds: a worker thread's hand-off would cost more
     * than the overlap it buys. */
    if (rc || !s->threaded || drafter_spec_kind(s) == DRAFTER_KIND_SUFFIX) {
        *out = local;
        return rc;
    }
    return drafter_threaded_create(local, out, e);
}
