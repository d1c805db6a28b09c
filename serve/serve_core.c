/* The decode worker, its queue and the jobs (serve_core.h). */
#include "serve_core.h"
#include "draft_proc/drafter_open.h"
#include "draft_proc/remote_drafter.h"
#include "draft_proc/suffix_drafter.h"
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

/* A worker: the engine's target and drafter (parallel 1), or a batcher view with a
 * planner and a drafter of its own. */
typedef struct Slot {
    struct ServeCore *c;
    Target *t;
    Drafter *d;
    Planner *planner;
    ServeJob *job; /* under c->mu: the job it decodes */
    pthread_t thread;
} Slot;

struct ServeCore {
    Engine *en;
    ServeConfig cfg;
    ServeMetrics *metrics;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ServeJob **queue; /* ring of cfg.queue_max */
    int head, count;
    int n_running;    /* slots with a job */
    int quit;
    uint64_t next_id;
    pthread_mutex_t enc_mu; /* tokenizer calls from connection threads, one at a time */
    Batcher *bt;      /* parallel > 1 */
    Slot *slots;      // (parallel)
    int n_slots;
    SuffixIndex *shared; /* cfg.suffix_global > 0: the earlier outputs the drafters search */
    pthread_mutex_t log_mu; /* cfg.round_log: one writer at a time, whole lines */
    int log_failed;         /* under log_mu: a write failed (said once) */
    Model *draft_model;  /* parallel > 1 with a model drafter: its weights, loaded once */
};

struct ServeJob {
    ServeRequest req;
    ServeMeta meta;
    DecodeOpts opts;
    int *ids, n_ids;
    uint64_t t_arrival, seq;
    ServeCore *core;
    atomic_int cancelled;
    atomic_int refs;
    /* under mu: the output as it grows, and how the job ended */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ServeText text;
    ServeLogprobs lp; /* when the request asks for them: one entry per output token */
    int done, failed, n_out;
    int n_cached; /* the prompt's tokens the prefix cache supplied */
    int n_echo;   /* echo with logprobs: lp's first n_echo entries are the prompt's */
    int prefilled; /* its prompt is in the KV cache (and published): its first tokens came */
    ServeJob *leader; /* choice 1.. of a request: waits for choice 0's prefill (a reference) */
    /* choice 0: the later choices (references, dropped once it forked them or ended) */
    ServeJob *followers[SERVE_N_MAX];
    int n_followers;
    struct Slot *slot; /* the worker's own: the slot decoding it */
    struct Slot *waiting; /* a later choice, under its leader's mu: its slot, waiting */
    int forked; /* under its leader's mu: its slot's target holds the prompt (batcher_fork) */
    int lp_taken; /* streams: entries serve_job_wait handed out */
    const char *finish_reason;
    ServeError err;
    /* the worker's own */
    uint64_t t_last;
    int drafter_failed;
    RoundLog lg; /* cfg.round_log: the decode as its log lines name it */
};

/* ---- jobs ------------------------------------------------------------------------------ */

/* Drops choice 0's references to the later choices (under its mu). */
static void followers_drop(ServeJob *j) {
    for (int i = 0; i < j->n_followers; i++) serve_job_unref(&j->followers[i]);
    j->n_followers = 0;
}

static void job_free(ServeJob *j) {
    serve_job_unref(&j->leader);
    followers_drop(j);
    serve_text_free(&j->text);
    serve_logprobs_free(&j->lp);
    serve_request_free(&j->req);
    free(j->ids);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

void serve_job_unref(ServeJob **pj) {
    if (!pj || !*pj) return;
    if (atomic_fetch_sub(&(*pj)->refs, 1) == 1) job_free(*pj);
    *pj = NULL;
}

void serve_job_follow(ServeJob *j, ServeJob *leader) {
    atomic_fetch_add(&leader->refs, 1);
    j->leader = leader;
    atomic_fetch_add(&j->refs, 1);
    pthread_mutex_lock(&leader->mu);
    leader->followers[leader->n_followers++] = j;
    pthread_mutex_unlock(&leader->mu);
    j->meta.index = j->req.choice;
    memcpy(j->meta.id, leader->meta.id, sizeof j->meta.id);
}

void serve_job_cancel(ServeJob *j) {
    atomic_store(&j->cancelled, 1);
}

const ServeMeta *serve_job_meta(const ServeJob *j) { return &j->meta; }
const ServeRequest *serve_job_request(const ServeJob *j) { return &j->req; }

/* The prompt's token ids: the client's, or the text encoded (through the chat template
 * for chat requests). */
static int job_prompt(ServeCore *c, ServeJob *j, ServeError *se) {
    if (j->req.ids) {
        j->ids = j->req.ids;
        j->n_ids = j->req.n_ids;
        j->req.ids = NULL;
        for (int i = 0; i < j->n_ids; i++)
            if (j->ids[i] >= c->en->target->vocab)
                return serve_error(se, 400, "prompt", "prompt token %d is outside the vocabulary of %d",
                                   j->ids[i], c->en->target->vocab);
        return 0;
    }
    RsErr e = {0};
    int rc = RS_OK;
    int chat = j->req.kind == SERVE_CHAT;
    if (chat && c->en->chat == CHAT_NONE && j->req.n_msgs > 0 && c->en->tok)
        rc = rs_err(&e, RS_EUNSUPPORTED, "model '%s' has no known chat template",
                    c->en->target_model->path);
    pthread_mutex_lock(&c->enc_mu);
    if (!rc && chat) rc = engine_chat_ids(c->en, j->req.msgs, j->req.n_msgs, &j->ids, &j->n_ids, &e);
    else if (!rc) rc = engine_prompt_ids(c->en, j->req.text, 0, &j->ids, &j->n_ids, &e);
    pthread_mutex_unlock(&c->enc_mu);
    if (rc) return serve_error(se, 400, j->req.kind == SERVE_CHAT ? "messages" : "prompt", "%s", e.msg);
    if (j->n_ids == 0) return serve_error(se, 400, "prompt", "the prompt encodes to no tokens");
    return 0;
}

/* Decoder, budget and output length for this request; the context must hold the prompt,
 * one round's reserve and the requested tokens. */
static int job_options(ServeCore *c, ServeJob *j, ServeError *se) {
    const ServeRequest *r = &j->req;
    j->opts = c->cfg.opts_default;
    if (r->decoder >= 0) j->opts.decoder = (DecoderKind)r->decoder;
    if (r->budget) j->opts.budget = r->budget;
    if (j->opts.decoder != DECODER_AR && !c->en->drafter)
        return serve_error(se, 400, "rootspec.decoder",
                           "decoder '%s' needs a drafter; this server runs without one",
                           decoder_name(j->opts.decoder));
    int rc = serve_sampling_map(r, &j->opts, se);
    if (rc) return rc;
    if (j->opts.budget == 0) { /* --budget auto: the engine's planner, up to the largest tree */
        j->opts.planner = c->en->planner;
        j->opts.budget = TREE_MAX;
    }
    /* unseeded requests: a stream each; seeded: one per choice, the same on every call */
    j->opts.prompt_id = r->has_seed ? (uint64_t)r->choice : j->seq;
    int room = target_kv_capacity(c->en->target) - decode_round_reserve(&j->opts) - j->n_ids + 1;
    if (room < 1 || (r->max_tokens && r->max_tokens > room)) {
        serve_error(se, 400, r->kind == SERVE_CHAT ? "messages" : "prompt",
                    "this model's context is %d tokens; the prompt has %d and %d more are "
                    "requested (a %s round reserves %d)", target_kv_capacity(c->en->target),
                    j->n_ids, r->max_tokens ? r->max_tokens : 1, decoder_name(j->opts.decoder),
                    decode_round_reserve(&j->opts));
        se->code = "context_length_exceeded";
        return 400;
    }
    j->opts.max_new = r->max_tokens ? r->max_tokens : (c->cfg.opts_default.max_new < room ? c->cfg.opts_default.max_new : room);
    return 0;
}

/* Completions echo: the prompt's tokens' text leads the output, and with logprobs the
 * first prompt token's (nothing predicts it) leads the entries; on_prompt_rows adds the
 * others during the prefill. */
static void job_echo(ServeCore *c, ServeJob *j) {
    for (int i = 0; i < j->n_ids; i++) {
        size_t k = 0;
        char num[16];
        const char *b = c->en->tok ? tokenizer_token_text(c->en->tok, j->ids[i], &k) : NULL;
        if (!c->en->tok) k = (size_t)snprintf(num, sizeof num, " %d", j->ids[i]), b = num;
        if (b) serve_text_prefix(&j->text, b, k);
    }
    if (!j->req.logprobs) return;
    serve_logprobs_add_none(&j->lp, j->ids[0]);
    j->n_echo = j->n_ids;
}

int serve_job_create(ServeCore *c, ServeRequest *r, ServeJob **out, ServeError *se) {
    ServeJob *j = rs_xcalloc(1, sizeof *j);
    j->req = *r;
    memset(r, 0, sizeof *r);
    j->core = c;
    j->t_arrival = rs_now_ns();
    atomic_init(&j->refs, 1);
    atomic_init(&j->cancelled, 0);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    serve_text_init(&j->text, (const char *const *)j->req.stop, j->req.n_stop);
    j->lp.top_n = j->req.top_logprobs;
    j->lp.tok = c->en->tok;
    pthread_mutex_lock(&c->mu);
    j->seq = ++c->next_id;
    pthread_mutex_unlock(&c->mu);
    j->meta = (ServeMeta){.kind = j->req.kind, .created = (long)time(NULL), .model = c->cfg.model_name};
    snprintf(j->meta.id, sizeof j->meta.id, "%s-%llx%04llx", j->req.kind == SERVE_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)j->meta.created, (unsigned long long)j->seq);
    int rc = job_prompt(c, j, se);
    if (!rc) rc = job_options(c, j, se);
    if (rc) {
        job_free(j);
        return rc;
    }
    if (j->req.echo) job_echo(c, j);
    *out = j;
    return 0;
}

int serve_job_wait(ServeJob *j, int timeout_ms, ServeOutput *out) {
    memset(out, 0, sizeof *out);
    struct timespec dl = rs_deadline_ms(timeout_ms);
    pthread_mutex_lock(&j->mu);
    while (!j->done && j->text.ready <= j->text.sent)
        if (pthread_cond_timedwait(&j->cv, &j->mu, &dl) == ETIMEDOUT) break;
    out->text = serve_text_take(&j->text, &out->n);
    out->done = j->done;
    out->failed = j->failed;
    out->err = j->err;
    out->finish_reason = j->finish_reason;
    out->usage = (ServeUsage){j->n_ids, j->n_out, j->n_cached};
    out->lp = j->done && j->req.logprobs ? &j->lp : NULL;
    int to = j->lp.n < j->n_echo + j->n_out ? j->lp.n : j->n_echo + j->n_out; /* none past a stop string */
    if (j->req.logprobs && j->req.stream && to > j->lp_taken) {
        out->lp_new = rs_xmalloc(sizeof *out->lp_new);
        serve_logprobs_slice(out->lp_new, &j->lp, j->lp_taken, to);
        j->lp_taken = to;
    }
    pthread_mutex_unlock(&j->mu);
    return out->text || out->done || out->lp_new;
}

/* ---- the decode ------------------------------------------------------------------------ */

/* Choice 0's first tokens (its prompt is committed): the later choices waiting on slots of
 * the batcher start from a fork of its sequence's prompt entries, computing none of them;
 * the others (not started yet, or --parallel 1) attach the published whole blocks. Under
 * j->mu, in j's worker between rounds. */
static void followers_fork(ServeJob *j) {
    ServeCore *c = j->core;
    for (int i = 0; c->bt && j->slot && i < j->n_followers; i++) {
        ServeJob *f = j->followers[i];
        RsErr e = {0};
        if (f->waiting && !f->n_echo && !atomic_load(&f->cancelled))
            f->forked = batcher_fork(f->waiting->t, j->slot->t, j->n_ids - 1, &e) == RS_OK;
    }
    followers_drop(j);
}

static void on_tokens(void *u, const int *t, int n) {
    ServeJob *j = u;
    ServeCore *c = j->core;
    uint64_t now = rs_now_ns();
    if (j->t_last == 0) serve_metrics_ttft(c->metrics, (now - j->t_arrival) * 1e-9);
    else serve_metrics_itl(c->metrics, (now - j->t_last) * 1e-9, n);
    j->t_last = now;
    pthread_mutex_lock(&j->mu);
    for (int i = 0; i < n && !j->text.matched; i++) {
        size_t k = 0;
        const char *b = c->en->tok ? tokenizer_token_text(c->en->tok, t[i], &k) : NULL;
        char num[16];
        if (!c->en->tok) k = (size_t)snprintf(num, sizeof num, " %d", t[i]), b = num;
        if (b) serve_text_push(&j->text, b, k);
        j->n_out++;
    }
    if (!j->prefilled) followers_fork(j);
    j->prefilled = 1;
    pthread_mutex_unlock(&j->mu);
    pthread_cond_broadcast(&j->cv);
}

/* The rows the tokens were drawn from: their log-probabilities under the request's law. */
static void on_rows(void *u, const float *const *rows, const int *t, int n, int vocab) {
    ServeJob *j = u;
    pthread_mutex_lock(&j->mu);
    for (int i = 0; i < n; i++) serve_logprobs_add(&j->lp, rows[i], vocab, &j->opts.sampling, t[i]);
    pthread_mutex_unlock(&j->mu);
}

/* The prompt's rows (echo): each prompt token's log-probability under the model's own
 * distribution (T = 1 unfiltered: no law drew them). A prefill that a preemption repeats
 * reports rows already taken: those are skipped. */
static void on_prompt_rows(void *u, const float *rows, int first, int n, int vocab) {
    ServeJob *j = u;
    const Sampling raw = {0};
    pthread_mutex_lock(&j->mu);
    for (int i = 0; i < n; i++) {
        int at = first + i + 1;
        if (at == j->lp.n && at < j->n_echo)
            serve_logprobs_add(&j->lp, rows + (size_t)i * vocab, vocab, &raw, j->ids[at]);
    }
    pthread_mutex_unlock(&j->mu);
}

static void on_round(void *u, const RoundInfo *r) {
    ServeJob *j = u;
    ServeCore *c = j->core;
    serve_metrics_round(c->metrics, r->emitted - r->dropped, r->fallback_ar);
    if (!c->cfg.round_log) return;
    pthread_mutex_lock(&c->log_mu);
    if (roundlog_write(c->cfg.round_log, &j->lg, r) && !c->log_failed) {
        c->log_failed = 1;
        fprintf(stderr, "rootspec-serve: writing the round log failed: %s\n", strerror(errno));
    }
    pthread_mutex_unlock(&c->log_mu);
}

/* The round log's view of the decode about to start (rep: recomputes so far), and the
 * target backend's counters now. */
static void log_begin(const Slot *sl, ServeJob *j, const DecodeOpts *opts, int rep) {
    j->lg = (RoundLog){.decoder = decoder_name(opts->decoder), .temp = sampling_temp(&opts->sampling),
                       .budget = opts->decoder == DECODER_AR ? 0
                                 : opts->planner       ? ROUNDLOG_BUDGET_AUTO
                                                     : opts->budget,
                       .prompt_id = j->meta.id, .rep = rep, .sampling = &j->opts.sampling};
    BackendStats st = backend_stats(target_backend(sl->t));
    roundlog_begin(&j->lg, &st);
}

static void on_event(void *u, const char *ev, const char *detail) {
    ServeJob *j = u;
    if (!strcmp(ev, "drafter_failed")) j->drafter_failed = 1;
    fprintf(stderr, "rootspec-serve: %s: %s: %s\n", j->meta.id, ev, detail);
}

/* A matched stop string ends the decode as a disconnect does. */
static int should_stop(void *u) {
    ServeJob *j = u;
    pthread_mutex_lock(&j->mu);
    int matched = j->text.matched;
    pthread_mutex_unlock(&j->mu);
    return matched || atomic_load(&j->cancelled);
}

/* Records how the job ended and wakes its connection; status and why: FINISH_ERROR's. */
static void job_end(ServeJob *j, ServeFinish f, const char *reason, int status, const char *why) {
    pthread_mutex_lock(&j->mu);
    followers_drop(j); /* the later choices attach what it published, if anything */
    serve_text_finish(&j->text);
    if (j->lp.n > j->n_echo + j->n_out) j->lp.n = j->n_echo + j->n_out; /* a round's tokens past a stop string */
    j->finish_reason = reason;
    if (f == FINISH_ERROR) {
        j->failed = 1;
        serve_error(&j->err, status, NULL, "%s", why);
    }
    /* Counted before the connection can see the end: a client that reads /metrics after
     * its answer finds it there. */
    serve_metrics_finish(j->core->metrics, f, f == FINISH_CANCELLED && j->n_out == 0 ? 0 : j->n_ids,
                         j->n_out, j->drafter_failed);
    j->done = 1;
    pthread_mutex_unlock(&j->mu);
    pthread_cond_broadcast(&j->cv);
}

/* A cancel from serve_core_stop rather than from the client: the client is still there and
 * gets a 503 (a stream: an error event), not an answer that looks complete. */
static int core_stopping(ServeCore *c) {
    pthread_mutex_lock(&c->mu);
    int quit = c->quit;
    pthread_mutex_unlock(&c->mu);
    return quit;
}

/* Waits until the batcher has the blocks the job's prompt and first round need beyond those
 * a fork gave its target (other decodes finish or grow); 0 when the job was cancelled
 * meanwhile. */
static int job_admit(ServeCore *c, ServeJob *j, const Target *t, int n_prompt) {
    int need = backend_kv_blocks_for(n_prompt + decode_round_reserve(&j->opts)) -
               backend_kv_blocks_for(t->n_forked);
    while (!batcher_wait_blocks(c->bt, need, 100))
        if (atomic_load(&j->cancelled)) return 0;
    return 1;
}

/* The decode on the slot; a preempted one goes on from what it emitted (the prompt and
 * its output so far as the new prompt: recompute), so nothing streamed is repeated. */
static int job_decode(ServeCore *c, Slot *sl, ServeJob *j, DecodeResult *res, RsErr *e) {
    DecodeHooks h = {on_tokens, on_round, on_event, j, should_stop, j->req.logprobs ? on_rows : NULL,
                     j->n_echo ? on_prompt_rows : NULL};
    DecodeOpts opts = j->opts;
    if (opts.planner && sl->planner) opts.planner = sl->planner;
    int *ids = rs_xmalloc(sizeof(int) * (size_t)(j->n_ids + opts.max_new + ROUND_MAX_EMIT));
    memcpy(ids, j->ids, sizeof(int) * (size_t)j->n_ids);
    int n_ids = j->n_ids, done = 0, rc;
    res->hit_eos = 0;
    for (int rep = 0;; rep++) {
        if (c->bt && !job_admit(c, j, sl->t, n_ids)) {
            if (sl->t->n_forked) target_reset(sl->t); /* the fork's blocks go back */
            rc = RS_OK;
            break;
        }
        DecodeResult part = {.tokens = ids + n_ids, .cap = res->cap - done};
        if (done > 0) h.on_prompt_rows = NULL; /* the prompt's rows are all taken */
        opts.max_new = j->opts.max_new - done;
        if (c->cfg.round_log) log_begin(sl, j, &opts, rep);
        rc = decode_run(sl->t, sl->d, ids, n_ids, &opts, &h, &part, e);
        serve_metrics_prompt(c->metrics, part.prompt_cached, n_ids - part.prompt_cached);
        if (!done) {
            pthread_mutex_lock(&j->mu);
            j->n_cached = part.prompt_cached;
            pthread_mutex_unlock(&j->mu);
        }
        if (c->bt) batcher_leave(sl->t);
        sl->t->n_forked = 0; /* whatever the decode did not take went with the sequence */
        done += part.n_tokens;
        n_ids += part.n_tokens;
        res->hit_eos = part.hit_eos;
        if (!(rc == RS_EFULL && c->bt && batcher_preempted(sl->t)) || done >= j->opts.max_new) break;
        fprintf(stderr, "rootspec-serve: %s: preempted after %d tokens; recomputing\n",
                j->meta.id, done);
    }
    res->n_tokens = done;
    /* only the output: the prompt is already in the next request's context when it repeats */
    if (c->shared && done > 0) suffix_index_add(c->shared, ids + j->n_ids, (size_t)done);
    free(ids);
    return rc;
}

/* A later choice starts once the first has its prompt in the KV cache: its prefill then
 * attaches the prompt's whole blocks (the prefix cache shares them) and computes only the
 * last partial block. The first was queued before it, so it runs or has ended. */
static void job_follow_wait(ServeJob *j, Slot *sl) {
    ServeJob *l = j->leader;
    pthread_mutex_lock(&l->mu);
    j->waiting = sl;
    while (!l->prefilled && !l->done && !atomic_load(&j->cancelled)) {
        struct timespec dl = rs_deadline_ms(100);
        pthread_cond_timedwait(&l->cv, &l->mu, &dl);
    }
    j->waiting = NULL;
    pthread_mutex_unlock(&l->mu);
}

static void job_run(ServeCore *c, Slot *sl, ServeJob *j) {
    j->slot = sl;
    if (j->leader) job_follow_wait(j, sl);
    if (atomic_load(&j->cancelled)) {
        if (sl->t->n_forked) target_reset(sl->t); /* the fork's blocks go back */
        job_end(j, FINISH_CANCELLED, NULL, 0, NULL);
        return;
    }
    DecodeResult res = {0};
    res.cap = j->opts.max_new + ROUND_MAX_EMIT;
    RsErr e = {0};
    int rc = job_decode(c, sl, j, &res, &e);
    char why[1100];
    snprintf(why, sizeof why, "decode failed: %s", e.msg);
    if (rc) job_end(j, FINISH_ERROR, NULL, 500, why);
    else if (atomic_load(&j->cancelled) && core_stopping(c))
        job_end(j, FINISH_ERROR, NULL, 503, "the server is stopping");
    else if (atomic_load(&j->cancelled)) job_end(j, FINISH_CANCELLED, NULL, 0, NULL);
    else if (j->text.matched || res.hit_eos) job_end(j, FINISH_STOP, "stop", 0, NULL);
    else job_end(j, FINISH_LENGTH, "length", 0, NULL);
}

static void *worker_main(void *arg) {
    Slot *sl = arg;
    ServeCore *c = sl->c;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->count && !c->quit) pthread_cond_wait(&c->cv, &c->mu);
        if (c->quit) break;
        ServeJob *j = c->queue[c->head];
        c->head = (c->head + 1) % c->cfg.queue_max;
        c->count--;
        sl->job = j;
        c->n_running++;
        pthread_mutex_unlock(&c->mu);
        job_run(c, sl, j);
        pthread_mutex_lock(&c->mu);
        sl->job = NULL;
        c->n_running--;
        serve_job_unref(&j);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* ---- the core -------------------------------------------------------------------------- */

/* The index the workers' drafters share, when cfg.suffix_global asks for one. */
static int shared_make(ServeCore *c, RsErr *e) {
    if (c->cfg.suffix_global <= 0) return RS_OK;
    int rc = suffix_index_create((size_t)c->cfg.suffix_global, &c->shared, e);
    for (int i = 0; !rc && i < c->n_slots; i++) {
        if (!c->slots[i].d)
            return rs_err(e, RS_EINVAL, "--suffix-global needs a suffix drafter; this server "
                          "runs without one");
        rc = drafter_suffix_share(c->slots[i].d, c->shared, e);
    }
    return rc;
}

/* A batched worker's drafter, a sequence of its own: an in-process kind opened anew, or
 * another sequence on the engine's remote drafter's connection (one session, one drafter
 * context per sequence id at the drafter process). */
static int slot_drafter_open(ServeCore *c, const BackendOps *ops, Drafter **out, RsErr *e) {
    Engine *en = c->en;
    const DrafterSpec *spec = c->cfg.slot_drafter;
    if (drafter_spec_kind(spec) != DRAFTER_KIND_REMOTE) {
        DrafterHost host = {.model = en->target_model, .tok = en->tok, .ops = ops,
                            .backend = c->cfg.batch.backend};
        DrafterSpec s = *spec;
        if (drafter_spec_kind(spec) == DRAFTER_KIND_MODEL && spec->model_path) {
            /* the workers share the weights (the engine's drafter checked its tokenizer) */
            int rc = c->draft_model ? RS_OK
                                    : backend_model_load(ops, spec->model_path, &host.backend,
                                                         &c->draft_model, e);
            if (rc) return rc;
            s.model = c->draft_model;
            s.model_path = NULL;
        }
        return drafter_open(&s, &host, out, e);
    }
    if (!en->drafter) return RS_OK; /* it did not answer: requests are refused as with one */
    if (drafter_info(en->drafter)->n_feature_layers > 0)
        return rs_err(e, RS_EINVAL, "--parallel %d: the remote drafter %s needs the target's "
                      "features (an EAGLE-3 head), which batched decodes do not send: use "
                      "--parallel 1", c->n_slots, drafter_info(en->drafter)->name);
    return drafter_remote_share(en->drafter, out, e);
}

/* The workers' targets, planners and drafters: the engine's own for parallel 1. */
static int slots_make(ServeCore *c, RsErr *e) {
    Engine *en = c->en;
    c->n_slots = c->cfg.parallel > 1 ? c->cfg.parallel : 1;
    c->slots = rs_xcalloc((size_t)c->n_slots, sizeof(Slot));
    if (c->n_slots == 1) {
        c->slots[0] = (Slot){.c = c, .t = en->target, .d = en->drafter};
        return shared_make(c, e);
    }
    const BackendOps *ops = backend_ops_by_name(backend_name(target_backend(en->target)), e);
    BatchOpts bo = c->cfg.batch;
    bo.parallel = c->n_slots;
    int rc = ops ? batcher_create(en->target_model, ops, &bo, &c->bt, e) : RS_EINVAL;
    for (int i = 0; !rc && i < c->n_slots; i++) {
        Slot *sl = &c->slots[i];
        sl->c = c;
        const uint8_t *eog = en->target->eog;
        int *ids = rs_xmalloc(sizeof(int) * (size_t)en->target->vocab), n = 0;
        for (int v = 0; v < en->target->vocab; v++)
            if (eog[v]) ids[n++] = v;
        rc = batcher_target(c->bt, ids, n, &sl->t, e);
        free(ids);
        sl->planner = planner_create();
        if (!rc) batcher_plan(sl->t, sl->planner);
        planner_share_accept(sl->planner, en->planner);
        if (!rc && c->cfg.slot_drafter) rc = slot_drafter_open(c, ops, &sl->d, e);
    }
    return rc ? rc : shared_make(c, e);
}

static void slots_free(ServeCore *c) {
    if (c->n_slots == 1 && c->slots && c->slots[0].d && c->shared)
        drafter_suffix_share(c->slots[0].d, NULL, NULL); /* the engine's: it outlives the core */
    for (int i = 0; c->bt && i < c->n_slots; i++) {
        drafter_destroy(&c->slots[i].d);
        planner_destroy(&c->slots[i].planner);
        target_destroy(&c->slots[i].t);
    }
    batcher_destroy(&c->bt);
    model_destroy(&c->draft_model); /* after the drafters that borrow it */
    suffix_index_destroy(&c->shared);
    free(c->slots);
    c->slots = NULL;
}

int serve_core_create(Engine *en, const ServeConfig *cfg, ServeMetrics *m, ServeCore **out,
                      RsErr *e) {
    RS_ASSERT(cfg->queue_max >= 1);
    *out = NULL;
    ServeCore *c = rs_xcalloc(1, sizeof *c);
    c->en = en;
    c->cfg = *cfg;
    c->metrics = m;
    int rc = slots_make(c, e);
    if (rc) {
        slots_free(c);
        free(c);
        return rc;
    }
    c->queue = rs_xcalloc((size_t)cfg->queue_max, sizeof *c->queue);
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->enc_mu, NULL);
    pthread_mutex_init(&c->log_mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    for (int i = 0; i < c->n_slots; i++)
        RS_ASSERT(pthread_create(&c->slots[i].thread, NULL, worker_main, &c->slots[i]) == 0);
    *out = c;
    return RS_OK;
}

int serve_core_submit(ServeCore *c, ServeJob *j, ServeError *se) {
    pthread_mutex_lock(&c->mu);
    int rc = 0;
    if (c->quit) rc = serve_error(se, 503, NULL, "the server is stopping");
    else if (c->count == c->cfg.queue_max)
        rc = serve_error(se, 429, NULL, "the server is busy: %d requests are waiting (--queue %d)",
                         c->count, c->cfg.queue_max);
    else {
        atomic_fetch_add(&j->refs, 1);
        c->queue[(c->head + c->count++) % c->cfg.queue_max] = j;
        pthread_cond_signal(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

void serve_core_counts(ServeCore *c, int *queued, int *running) {
    pthread_mutex_lock(&c->mu);
    *queued = c->count;
    *running = c->n_running;
    pthread_mutex_unlock(&c->mu);
}

ServeMetrics *serve_core_metrics(ServeCore *c) { return c->metrics; }
const char *serve_core_model(const ServeCore *c) { return c->cfg.model_name; }
int serve_core_context(const ServeCore *c) { return target_kv_capacity(c->en->target); }

/* ---- the tokenizer routes (tokenizer calls one at a time, as job_prompt's) ------------------ */

int serve_core_tokenize(ServeCore *c, const char *text, int add_special, int **ids, int *n,
                        char ***pieces, ServeError *se) {
    *ids = NULL;
    *n = 0;
    if (!c->en->tok) return serve_error(se, 400, NULL, "this model has no tokenizer");
    RsErr e = {0};
    int *raw = NULL, nr = 0, bos = add_special && tokenizer_add_bos(c->en->tok) ? tokenizer_bos_id(c->en->tok) : -1;
    pthread_mutex_lock(&c->enc_mu);
    int rc = tokenizer_encode(c->en->tok, text, &raw, &nr, &e);
    pthread_mutex_unlock(&c->enc_mu);
    if (rc) return serve_error(se, 400, "content", "%s", e.msg);
    *ids = rs_xmalloc(sizeof(int) * (size_t)(nr + 1));
    if (bos >= 0) (*ids)[(*n)++] = bos;
    memcpy(*ids + *n, raw, sizeof(int) * (size_t)nr);
    *n += nr;
    free(raw);
    if (pieces) {
        *pieces = rs_xcalloc((size_t)*n + 1, sizeof **pieces);
        for (int i = 0; i < *n; i++) {
            size_t k = 0;
            const char *b = tokenizer_token_view(c->en->tok, (*ids)[i], &k);
            (*pieces)[i] = strndup(b ? b : "", b ? k : 0);
        }
    }
    return 0;
}

int serve_core_detokenize(ServeCore *c, const int *ids, int n, char **text, size_t *len, ServeError *se) {
    *text = NULL;
    if (!c->en->tok) return serve_error(se, 400, NULL, "this model has no tokenizer");
    int vocab = tokenizer_vocab_size(c->en->tok);
    for (int i = 0; i < n; i++)
        if (ids[i] >= vocab)
            return serve_error(se, 400, "tokens", "token %d is outside the vocabulary of %d", ids[i], vocab);
    pthread_mutex_lock(&c->enc_mu);
    *text = tokenizer_decode(c->en->tok, ids, n);
    pthread_mutex_unlock(&c->enc_mu);
    *len = strlen(*text);
    return 0;
}

void serve_core_stop(ServeCore *c) {
    pthread_mutex_lock(&c->mu);
    int was = c->quit;
    c->quit = 1;
    for (int i = 0; i < c->n_slots; i++)
        if (c->slots[i].job) serve_job_cancel(c->slots[i].job);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (was) return;
    for (int i = 0; i < c->n_slots; i++) pthread_join(c->slots[i].thread, NULL);
    for (; c->count; c->count--) {
        ServeJob *j = c->queue[c->head];
        c->head = (c->head + 1) % c->cfg.queue_max;
        job_end(j, FINISH_ERROR, NULL, 503, "the server is stopping");
        serve_job_unref(&j);
    }
}

void serve_core_destroy(ServeCore **pc) {
    if (!pc || !*pc) return;
    ServeCore *c = *pc;
    serve_core_stop(c);
    slots_free(c);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->enc_mu);
    pthread_mutex_destroy(&c->log_mu);
    pthread_cond_destroy(&c->cv);
    free(c->queue);
    free(c);
    *pc = NULL;
}

char *serve_core_metrics_text(ServeCore *c) {
    int queued, running;
    serve_core_counts(c, &queued, &running);
    BatchStats bs;
    if (c->bt) bs = batcher_stats(c->bt);
    return serve_metrics_render_batch(c->metrics, queued, running, c->bt ? &bs : NULL);
}
