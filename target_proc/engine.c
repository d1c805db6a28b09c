/* Engine set-up: model(s), tokenizer, backend choice, drafter wiring. */
#include "engine.h"
#include <string.h>

static void collect_eog(const Engine *en, int **eog, int *n) {
    int V = en->target_model->cfg.vocab_size, k = 0;
    *eog = rs_xcalloc((size_t)V + 1, sizeof(int));
    for (int i = 0; i < V && en->tok; i++)
        if (tokenizer_is_eog(en->tok, i)) (*eog)[k++] = i;
    if (k == 0 && en->target_model->cfg.eos_id >= 0) (*eog)[k++] = en->target_model->cfg.eos_id;
    *n = k;
}

BackendParams engine_backend_params(const EngineOpts *eo) {
    return (BackendParams){.kv_capacity = eo->ctx, .threads = eo->threads, .device = eo->device,
                           .batch_invariant = eo->batch_invariant,
                           .cpu_kernels = eo->cpu_kernels, .sw = eo->sw,
                           .prefix_cache = eo->prefix_cache};
}

/* The one Drafter the engine holds, of the kind the options describe; in-process kinds
 * run on a worker thread so the root pass overlaps drafting. */
static int open_drafter(const EngineOpts *eo, const BackendOps *ops, Engine *en, RsErr *e) {
    DrafterSpec s = {.kind = eo->drafter_kind, .model_path = eo->draft_model_path,
                     .layers = eo->draft_layers, .corpus_path = eo->draft_corpus,
                     .endpoint = eo->draft_endpoint, .timeout_ms = eo->draft_timeout_ms,
                     .insecure = eo->insecure, .curve_dir = eo->curve_dir,
                     .layer_ids = eo->eagle3_layer_ids, .threaded = 1};
    DrafterHost h = {.model = en->target_model, .tok = en->tok, .ops = ops,
                     .backend = engine_backend_params(eo)};
    return drafter_open(&s, &h, &en->drafter, e);
}

/* engine_create's steps on a zeroed Engine; on failure the caller destroys what was made. */
static int engine_build(const EngineOpts *eo, int need_drafter, Engine *en, RsErr *e) {
    const BackendOps *ops = backend_ops_by_name(eo->backend, e);
    if (!ops) return e ? e->code : RS_EINVAL;
    BackendParams bp = engine_backend_params(eo);
    int rc = backend_model_load(ops, eo->model_path, &bp, &en->target_model, e);
    if (rc) return rc;
    rc = tokenizer_load_model(en->target_model, &en->tok, e);
    if (rc) return rc;
    if (en->tok && tokenizer_vocab_size(en->tok) > en->target_model->cfg.vocab_size) {
        rc = rs_err(e, RS_EFORMAT, "tokenizer has %d tokens but the model's vocabulary is %d",
                    tokenizer_vocab_size(en->tok), en->target_model->cfg.vocab_size);
        return rc;
    }
    int nt = en->tok ? tokenizer_vocab_size(en->tok) : 0, V = en->target_model->cfg.vocab_size;
    if (en->tok && nt < V) /* padded (Qwen2.5: 151665 of 151936): load, and say so */
        snprintf(en->vocab_note, sizeof en->vocab_note,
                 "the tokenizer has %d tokens but the model's vocabulary is %d: ids %d..%d "
                 "have no text and print as U+FFFD", nt, V, nt, V - 1);
    en->chat = en->tok ? chat_template_for_model(en->target_model) : CHAT_NONE;
    en->chat_special_tokens = eo->chat_special_tokens;
    int *eog, n_eog;
    collect_eog(en, &eog, &n_eog);
    rc = target_create(en->target_model, ops, &bp, eog, n_eog, &en->target, e);
    free(eog);
    if (rc) return rc;
    if (!need_drafter) return RS_OK;
    rc = open_drafter(eo, ops, en, e);
    if (rc == RS_ETIMEOUT && eo->draft_endpoint && eo->drafter_optional) {
        snprintf(en->drafter_missing, sizeof en->drafter_missing, "%s", e ? e->msg : "");
        return RS_OK; /* en->drafter stays NULL: the caller decodes AR */
    }
    return rc;
}

int engine_create(const EngineOpts *eo, int need_drafter, Engine **out, RsErr *e) {
    *out = NULL;
    Engine *en = rs_xcalloc(1, sizeof *en);
    en->planner = planner_create();
    int rc = engine_build(eo, need_drafter, en, e);
    if (rc) {
        engine_destroy(&en);
        return rc;
    }
    *out = en;
    return RS_OK;
}

void engine_destroy(Engine **pen) {
    if (!pen || !*pen) return;
    Engine *en = *pen;
    drafter_destroy(&en->drafter); /* before the models it borrows */
    planner_destroy(&en->planner);
    target_destroy(&en->target);
    tokenizer_destroy(&en->tok);
    model_destroy(&en->target_model);
    free(en);
    *pen = NULL;
}

static int no_tokenizer(const Engine *en, RsErr *e) {
    return rs_err(e, RS_EINVAL,
                  "model '%s' has no tokenizer (random weights), so a text prompt cannot be "
                  "encoded: rootspec-target takes token ids (--prompt-ids 1,2,3)",
                  en->target_model->path);
}

/* text (plain: tokenizer_encode_plain's flags, or NULL) with BOS when the tokenizer adds it. */
static int encode_with_bos(const Engine *en, const char *text, const uint8_t *plain, int **ids,
                           int *n, RsErr *e) {
    int *raw = NULL, nr = 0;
    int rc = tokenizer_encode_plain(en->tok, text, plain, &raw, &nr, e);
    if (rc) return rc;
    int bos = tokenizer_add_bos(en->tok) ? tokenizer_bos_id(en->tok) : -1;
    int add = bos >= 0 && !(nr > 0 && raw[0] == bos);
    *ids = rs_xmalloc(sizeof(int) * (size_t)(nr + 1));
    if (add) (*ids)[0] = bos;
    memcpy(*ids + add, raw, sizeof(int) * (size_t)nr);
    *n = nr + add;
    free(raw);
    return RS_OK;
}

int engine_chat_ids(const Engine *en, const ChatMsg *m, int n_msgs, int **ids, int *n, RsErr *e) {
    if (!en->tok) return no_tokenizer(en, e);
    uint8_t *plain = NULL;
    char *text = chat_render(en->chat, m, n_msgs, en->chat_special_tokens ? NULL : &plain, e);
    if (!text) return e ? e->code : RS_EINVAL;
    int rc = encode_with_bos(en, text, plain, ids, n, e);
    free(text);
    free(plain);
    return rc;
}

int engine_prompt_ids(const Engine *en, const char *text, int chat, int **ids, int *n, RsErr *e) {
    if (!en->tok) return no_tokenizer(en, e);
    if (!chat) return encode_with_bos(en, text, NULL, ids, n, e);
    if (en->chat == CHAT_NONE)
        return rs_err(e, RS_EUNSUPPORTED, "--chat: no known chat template for model '%s'",
                      en->target_model->path);
    ChatMsg m = {"user", text};
    return engine_chat_ids(en, &m, 1, ids, n, e);
}
