/* Continuous batching (target_proc/batch.h): decodes on a batcher's views, several at once
 * on threads of their own, joining mid-decode, with prompts of different lengths, chunked
 * prefill, a row budget that splits passes and a KV cache too small for all of them
 * (preemption and restart), must emit exactly the tokens of the same decode run alone on a
 * target of its own: AR and the draft rule with a suffix drafter, T=0 and seeded T=1.
 * Model and remote drafters keep one context per sequence: a self-drafter per view, and
 * one rootspec-draft session (a server thread here) holding a sequence per view, must give
 * every decode the pools of its solo run, so its tokens, rounds and accepted counts match. */
#include "testutil.h"
#include "common/rng.h"
#include "draft_proc/draft_server.h"
#include "draft_proc/model_drafter.h"
#include "draft_proc/remote_drafter.h"
#include "draft_proc/suffix_drafter.h"
#include "target_proc/batch.h"
#include "target_proc/decode.h"
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#define VOCAB 48
#define NREQ 8
#define MAXNEW 24

typedef struct {
    int prompt[64], n_prompt;
    DecodeOpts opts;
    int out[MAXNEW + ROUND_MAX_EMIT], n_out;
    int restarts;
    int rounds;
    long accepted;
} Req;

/* Request i: a prompt of 3..42 tokens made of a few repeated runs (so the suffix drafter
 * finds continuations), and one of four decoders. */
static void req_make(Req *r, int i) {
    Rng g;
    rng_seed(&g, 900 + i);
    memset(r, 0, sizeof *r);
    r->n_prompt = 3 + (i * 13) % 40;
    for (int k = 0; k < r->n_prompt; k++)
        r->prompt[k] = k >= 6 && rng_next(&g) % 3 ? r->prompt[k - 6] : (int)(rng_next(&g) % VOCAB);
    int kind = i % 4;
    r->opts = (DecodeOpts){.decoder = kind < 2 ? DECODER_AR : DECODER_DRAFT, .budget = 6, .seed = 5 + i,
                           .max_new = MAXNEW - i % 5, .ignore_eos = 1};
    if (kind % 2) r->opts.sampling = (Sampling){.temperature = 1.0};
}

/* One decode on t with `keep` (a view's drafter, kept between its decodes), or else a fresh
 * suffix drafter; RS_EFULL when preempted. */
static int req_run(Target *t, Drafter *keep, Req *r, RsErr *e) {
    Drafter *d = NULL;
    if (r->opts.decoder != DECODER_AR && !keep)
        ck_assert_int_eq(drafter_suffix_create(VOCAB, NULL, 0, NULL, &d, e), RS_OK);
    DecodeResult res = {.tokens = r->out, .cap = MAXNEW + ROUND_MAX_EMIT};
    int rc = decode_run(t, keep ? keep : d, r->prompt, r->n_prompt, &r->opts, NULL, &res, e);
    drafter_destroy(&d);
    r->n_out = res.n_tokens;
    r->rounds = res.rounds;
    r->accepted = res.accepted_total;
    return rc;
}

typedef struct {
    Batcher *bt;
    Req *reqs;
    int n_reqs;
    Drafter *d; /* the view's drafter; NULL: a suffix drafter per request */
    int first, step;
    int fail;
    char why[1100];
} Worker;

/* A view's decodes: requests first, first + step, ...; a preempted one restarts once
 * blocks are free, from the start, as a server does. */
static void *worker_main(void *arg) {
    Worker *w = arg;
    Target *t = NULL;
    RsErr e = {0};
    if (batcher_target(w->bt, NULL, 0, &t, &e)) {
        snprintf(w->why, sizeof w->why, "%s", e.msg);
        w->fail = 1;
        return NULL;
    }
    for (int i = w->first; i < w->n_reqs && !w->fail; i += w->step) {
        Req *r = &w->reqs[i];
        for (;;) {
            int rc = req_run(t, w->d, r, &e);
            batcher_leave(t);
            if (rc == RS_EFULL && batcher_preempted(t)) {
                r->restarts++;
                batcher_wait_blocks(w->bt, backend_kv_blocks_for(r->n_prompt + 8), 1000);
                continue;
            }
            if (rc) {
                snprintf(w->why, sizeof w->why, "request %d: %s", i, e.msg);
                w->fail = 1;
            }
            break;
        }
    }
    target_destroy(&t);
    return NULL;
}

static void solo_all(Model *m, Req *want) {
    Target *t = NULL;
    RsErr e = {0};
    ck_assert_int_eq(target_create(m, &cpu_backend_ops, TU_BP(128, 1), NULL, 0, &t, &e), RS_OK);
    for (int i = 0; i < NREQ; i++) {
        req_make(&want[i], i);
        ck_assert_msg(req_run(t, NULL, &want[i], &e) == RS_OK, "solo %d: %s", i, e.msg);
    }
    target_destroy(&t);
}

/* Runs every request on `parallel` views of a batcher with these sizes and compares. */
static void batch_check_all(int parallel, int budget, int chunk, int kv, int want_preempt) {
    Model *m = tu_random_model(ARCH_LLAMA, 32, 64, 2, 4, 2, VOCAB, 77);
    static Req want[NREQ], got[NREQ];
    solo_all(m, want);
    BatchOpts o = {.parallel = parallel, .row_budget = budget, .prefill_chunk = chunk,
                   .kv_entries = kv, .seq_capacity = kv < 128 ? kv : 128, .backend = {.threads = 2}};
    Batcher *bt = NULL;
    RsErr e = {0};
    ck_assert_msg(batcher_create(m, &cpu_backend_ops, &o, &bt, &e) == RS_OK, "%s", e.msg);
    for (int i = 0; i < NREQ; i++) req_make(&got[i], i);
    Worker w[8];
    pthread_t th[8];
    for (int k = 0; k < parallel; k++) {
        w[k] = (Worker){.bt = bt, .reqs = got, .n_reqs = NREQ, .first = k, .step = parallel};
        ck_assert_int_eq(pthread_create(&th[k], NULL, worker_main, &w[k]), 0);
    }
    for (int k = 0; k < parallel; k++) pthread_join(th[k], NULL);
    for (int k = 0; k < parallel; k++) ck_assert_msg(!w[k].fail, "%s", w[k].why);
    int restarts = 0;
    for (int i = 0; i < NREQ; i++) {
        ck_assert_int_eq(got[i].n_out, want[i].n_out);
        for (int j = 0; j < want[i].n_out; j++)
            ck_assert_msg(got[i].out[j] == want[i].out[j],
                          "request %d (%s, T=%g) token %d: batched %d, solo %d", i,
                          decoder_name(got[i].opts.decoder), got[i].opts.sampling.temperature, j,
                          got[i].out[j], want[i].out[j]);
        restarts += got[i].restarts;
    }
    BatchStats st = batcher_stats(bt);
    ck_assert_int_eq(st.blocks_used, 0); /* every block back */
    ck_assert_int_eq(st.active, 0);
    ck_assert_msg(st.rows > st.passes, "passes never carried several rows (%llu rows, %llu passes)",
                  (unsigned long long)st.rows, (unsigned long long)st.passes);
    if (want_preempt) ck_assert_msg(st.preemptions > 0 && restarts > 0, "nothing was preempted");
    long prompt = 0, rounds = 0;
    for (int i = 0; i < NREQ; i++) prompt += got[i].n_prompt - 1, rounds += got[i].rounds;
    /* every prompt row once (its last token is the first root pass's), unless recomputed;
     * every round kept at least its root's row */
    if (!want_preempt) ck_assert_int_eq((long)st.prompt_rows, prompt);
    ck_assert_msg((long)st.kept_rows >= rounds, "%llu kept rows for %ld rounds",
                  (unsigned long long)st.kept_rows, rounds);
    batcher_destroy(&bt);
    model_destroy(&m);
}

START_TEST(test_batch_exact) { batch_check_all(4, 64, 16, 1024, 0); }
END_TEST

/* Prefill chunks of 3 rows and passes of at most 8: prompts interleave with decodes. */
START_TEST(test_batch_chunks) { batch_check_all(3, 8, 3, 1024, 0); }
END_TEST

/* Prompts of up to 42 rows forwarded whole into passes of at most 7 rows: each runs over
 * several passes, cut wherever the budget ends, beside other prompts and decodes. */
START_TEST(test_batch_split_prompts) { batch_check_all(4, 7, 64, 1024, 0); }
END_TEST

/* The same with too few blocks: a prompt part-way through its passes can be preempted. */
START_TEST(test_batch_split_preempt) { batch_check_all(4, 7, 64, 5 * BACKEND_KV_BLOCK, 1); }
END_TEST

/* 5 blocks for 4 decodes of up to 3 blocks each: passes shrink, decodes get preempted and
 * restart, and every output still equals its solo run. */
START_TEST(test_batch_preempt) { batch_check_all(4, 64, 16, 5 * BACKEND_KV_BLOCK, 1); }
END_TEST

/* ---- model and remote drafters, one context per sequence ---- */

#define NSPEC 7      /* requests */
#define NVIEW 3      /* views (sequences at once) */
#define DLAYERS "0"  /* the self-drafter: the first of the model's two layers */
#define TOKHASH 42   /* the random model has no tokenizer: both ends agree on this */

/* Request i: prompts of 3..38 tokens, draft or rootdraw selection (a root pass between the
 * drafter's request and its pool), T=0 or seeded T=1. */
static void spec_make(Req *r, int i) {
    req_make(r, i);
    r->n_prompt = 3 + (i * 11) % 36;
    r->opts.decoder = i % 3 == 2 ? DECODER_ROOTDRAW : DECODER_DRAFT;
    r->opts.sampling = (Sampling){.temperature = i % 2 ? 1.0 : 0.0};
    r->opts.max_new = MAXNEW - i % 4;
}

static int self_open(void *arg, Drafter **out, RsErr *e) {
    return drafter_self_create(arg, DLAYERS, &cpu_backend_ops, TU_BP(256, 1), out, e);
}

/* A rootspec-draft server on a thread of its own, drafting with self-drafters of m. */
typedef struct {
    Model *m;
    Drafter *first;
    char ep[128];
    int max_seqs;
    volatile int stop;
    pthread_t th;
} Server;

static void *server_main(void *arg) {
    Server *s = arg;
    DraftServerOpts o = {.endpoint = s->ep, .stop = &s->stop, .open_seq = self_open,
                         .open_arg = s->m, .max_seqs = s->max_seqs};
    RsErr e = {0};
    ck_assert_msg(draft_server_run(s->first, TOKHASH, &o, &e) == RS_OK, "%s", e.msg);
    return NULL;
}

static void server_start(Server *s, Model *m, int max_seqs) {
    RsErr e = {0};
    *s = (Server){.m = m, .max_seqs = max_seqs};
    snprintf(s->ep, sizeof s->ep, "ipc:///tmp/rs-batch-%d-%d.sock", (int)getpid(), max_seqs);
    ck_assert_int_eq(self_open(m, &s->first, &e), RS_OK);
    ck_assert_int_eq(pthread_create(&s->th, NULL, server_main, s), 0);
}

static void server_stop(Server *s) {
    s->stop = 1;
    pthread_join(s->th, NULL);
    drafter_destroy(&s->first);
}

/* NVIEW views decode the NSPEC requests, each view with drafters[k], and every request must
 * match its solo run with a self-drafter of its own: the same tokens, rounds and accepted
 * nodes (the drafter's pools decide those). */
static void spec_check(Model *m, Drafter **drafters) {
    static Req want[NSPEC], got[NSPEC];
    RsErr e = {0};
    Target *t = NULL;
    Drafter *solo = NULL;
    ck_assert_int_eq(target_create(m, &cpu_backend_ops, TU_BP(128, 1), NULL, 0, &t, &e), RS_OK);
    ck_assert_int_eq(self_open(m, &solo, &e), RS_OK);
    for (int i = 0; i < NSPEC; i++) {
        spec_make(&want[i], i);
        ck_assert_msg(req_run(t, solo, &want[i], &e) == RS_OK, "solo %d: %s", i, e.msg);
    }
    drafter_destroy(&solo);
    target_destroy(&t);
    BatchOpts o = {.parallel = NVIEW, .row_budget = 64, .prefill_chunk = 8, .kv_entries = 1024,
                   .seq_capacity = 128, .backend = {.threads = 2}};
    Batcher *bt = NULL;
    ck_assert_msg(batcher_create(m, &cpu_backend_ops, &o, &bt, &e) == RS_OK, "%s", e.msg);
    for (int i = 0; i < NSPEC; i++) spec_make(&got[i], i);
    Worker w[NVIEW];
    pthread_t th[NVIEW];
    for (int k = 0; k < NVIEW; k++) {
        w[k] = (Worker){.bt = bt, .reqs = got, .n_reqs = NSPEC, .d = drafters[k], .first = k,
                        .step = NVIEW};
        ck_assert_int_eq(pthread_create(&th[k], NULL, worker_main, &w[k]), 0);
    }
    for (int k = 0; k < NVIEW; k++) pthread_join(th[k], NULL);
    for (int k = 0; k < NVIEW; k++) ck_assert_msg(!w[k].fail, "%s", w[k].why);
    for (int i = 0; i < NSPEC; i++) {
        const Req *g = &got[i], *s = &want[i];
        ck_assert_int_eq(g->n_out, s->n_out);
        for (int j = 0; j < s->n_out; j++)
            ck_assert_msg(g->out[j] == s->out[j], "request %d (%s, T=%g) token %d: batched %d, "
                          "solo %d", i, decoder_name(g->opts.decoder), g->opts.sampling.temperature, j,
                          g->out[j], s->out[j]);
        ck_assert_msg(g->rounds == s->rounds && g->accepted == s->accepted,
                      "request %d (%s, T=%g): batched %d rounds, %ld accepted; solo %d, %ld: its "
                      "drafter's pools differ", i, decoder_name(g->opts.decoder), g->opts.sampling.temperature,
                      g->rounds, g->accepted, s->rounds, s->accepted);
    }
    long acc = 0;
    for (int i = 0; i < NSPEC; i++) acc += want[i].accepted;
    ck_assert_msg(acc > 0, "the self-drafter never had a node accepted: the test sees nothing");
    batcher_destroy(&bt);
}

/* In process: a self-drafter per view. */
START_TEST(test_batch_model_drafters) {
    Model *m = tu_random_model(ARCH_LLAMA, 32, 64, 2, 4, 2, VOCAB, 77);
    Drafter *d[NVIEW] = {0};
    RsErr e = {0};
    for (int k = 0; k < NVIEW; k++) ck_assert_int_eq(self_open(m, &d[k], &e), RS_OK);
    spec_check(m, d);
    for (int k = 0; k < NVIEW; k++) drafter_destroy(&d[k]);
    model_destroy(&m);
}
END_TEST

/* One drafter process session, a sequence id per view (drafter_remote_share). */
START_TEST(test_batch_remote_drafter) {
    Model *m = tu_random_model(ARCH_LLAMA, 32, 64, 2, 4, 2, VOCAB, 77);
    Server srv;
    server_start(&srv, m, NVIEW);
    Drafter *d[NVIEW] = {0};
    RsErr e = {0};
    ck_assert_msg(drafter_remote_create(srv.ep, m, TOKHASH, 20000, 0, NULL, &d[0], &e) == RS_OK,
                  "%s", e.msg);
    for (int k = 1; k < NVIEW; k++) ck_assert_int_eq(drafter_remote_share(d[0], &d[k], &e), RS_OK);
    spec_check(m, d);
    for (int k = NVIEW - 1; k >= 0; k--) drafter_destroy(&d[k]);
    server_stop(&srv);
    model_destroy(&m);
}
END_TEST

/* The drafter holds at most max_seqs sequences: one more is refused by name (its decode
 * would go on autoregressively) until a handle's destroy CLOSEs its sequence, or another
 * client's HELLO frees them all. */
START_TEST(test_remote_sequence_bound) {
    Model *m = tu_random_model(ARCH_LLAMA, 32, 64, 2, 4, 2, VOCAB, 77);
    Server srv;
    server_start(&srv, m, 2);
    Drafter *d[3] = {0};
    RsErr e = {0};
    ck_assert_msg(drafter_remote_create(srv.ep, m, TOKHASH, 20000, 0, NULL, &d[0], &e) == RS_OK,
                  "%s", e.msg);
    for (int k = 1; k < 3; k++) ck_assert_int_eq(drafter_remote_share(d[0], &d[k], &e), RS_OK);
    static Pool pool;
    const int prompt[] = {1, 2, 3, 4, 5};
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(drafter_grow_begin(d[k], prompt, 5, 1, NULL, 0, &e), RS_OK);
        ck_assert_msg(drafter_grow_end(d[k], &pool, &e) == RS_OK, "%s", e.msg);
        ck_assert_int_gt(pool.n, 0);
    }
    ck_assert_int_eq(drafter_grow_begin(d[2], prompt, 5, 1, NULL, 0, &e), RS_OK);
    ck_assert_int_eq(drafter_grow_end(d[2], &pool, &e), RS_EPEER);
    ck_assert_msg(strstr(e.msg, "sequence 2: the drafter holds 2 sequences already "
                                "(rootspec-draft --max-seqs 2)"), "%s", e.msg);
    drafter_destroy(&d[0]); /* CLOSE sequence 0 */
    ck_assert_int_eq(drafter_grow_begin(d[2], prompt, 5, 1, NULL, 0, &e), RS_OK);
    ck_assert_msg(drafter_grow_end(d[2], &pool, &e) == RS_OK, "%s", e.msg);
    ck_assert_int_gt(pool.n, 0);
    /* another client's HELLO frees the sequences the session held: its two fit */
    Drafter *o[2] = {0};
    ck_assert_int_eq(drafter_remote_create(srv.ep, m, TOKHASH, 20000, 0, NULL, &o[0], &e), RS_OK);
    ck_assert_int_eq(drafter_remote_share(o[0], &o[1], &e), RS_OK);
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(drafter_grow_begin(o[k], prompt, 5, 1, NULL, 0, &e), RS_OK);
        ck_assert_msg(drafter_grow_end(o[k], &pool, &e) == RS_OK, "%s", e.msg);
    }
    for (int k = 0; k < 2; k++) drafter_destroy(&o[k]);
    drafter_destroy(&d[2]);
    drafter_destroy(&d[1]);
    server_stop(&srv);
    model_destroy(&m);
}
END_TEST

START_TEST(test_batch_options) {
    Model *m = tu_random_model(ARCH_LLAMA, 32, 64, 2, 4, 2, VOCAB, 77);
    BatchOpts o = {.parallel = 2, .row_budget = 4, .prefill_chunk = PREFILL_CHUNK_MAX + 1,
                   .kv_entries = 256, .seq_capacity = 128, .backend = {.threads = 1}};
    Batcher *bt = NULL;
    RsErr e = {0};
    ck_assert_int_eq(batcher_create(m, &cpu_backend_ops, &o, &bt, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "--prefill-chunk 257 outside [1, 256]"), "%s", e.msg);
    o.prefill_chunk = 8; /* above the budget: a prompt's rows run over several passes */
    o.row_budget = 0;
    ck_assert_int_eq(batcher_create(m, &cpu_backend_ops, &o, &bt, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "--batch-rows 0 outside [1, 4096]"), "%s", e.msg);
    o.row_budget = 4;
    o.kv_entries = 64;
    ck_assert_int_eq(batcher_create(m, &cpu_backend_ops, &o, &bt, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "--kv-entries 64 below --ctx 128"), "%s", e.msg);
    o.kv_entries = 256;
    ck_assert_int_eq(batcher_create(m, &cpu_backend_ops, &o, &bt, &e), RS_OK);
    Target *t[3] = {0};
    ck_assert_int_eq(batcher_target(bt, NULL, 0, &t[0], &e), RS_OK);
    ck_assert_int_eq(batcher_target(bt, NULL, 0, &t[1], &e), RS_OK);
    ck_assert_int_eq(batcher_target(bt, NULL, 0, &t[2], &e), RS_EFULL);
    target_destroy(&t[0]);
    target_destroy(&t[1]);
    batcher_destroy(&bt);
    ck_assert_ptr_null(bt);
    model_destroy(&m);
}
END_TEST

/* Picks k indices from c by batch_pick and compares them with want (oldest first) and the
 * rows each runs with rows (NULL: every candidate's whole rows). */
static void pick_is(const BatchCand *c, int n, int budget, const int *want, const int *rows,
                    int k) {
    int out[8], take[8];
    int got = batch_pick(c, n, budget, out, take);
    ck_assert_int_eq(got, k);
    for (int i = 0; i < k; i++) {
        ck_assert_int_eq(out[i], want[i]);
        ck_assert_int_eq(take[i], rows ? rows[i] : c[want[i]].rows);
    }
}

/* First tokens go before everything and keep prompt rows out of their pass, prompt rows
 * go before older decodes; a decode that does not fit is skipped, not a stop; the first
 * taken runs even when larger than the budget. */
START_TEST(test_batch_pick) {
    enum { F = BATCH_FIRST_TOKEN, P = BATCH_PREFILL, D = BATCH_DECODE };
    /* two decodes of 1 row, then two prompts of 8 rows left: the prompts fill the budget,
     * the older first, the other as far as the budget goes */
    BatchCand c[] = {{1, D, 1, 0}, {1, D, 2, 0}, {8, P, 3, 0}, {8, P, 4, 0}};
    pick_is(c, 4, 9, (int[]){2, 3}, (int[]){8, 1}, 2);
    pick_is(c, 4, 10, (int[]){2, 3}, (int[]){8, 2}, 2);
    pick_is(c, 4, 18, (int[]){0, 1, 2, 3}, NULL, 4);
    pick_is(c, 4, 16, (int[]){2, 3}, NULL, 2);
    /* a prompt just in gets its first token in a pass without prompt rows (short, so it
     * is answered at once), with the decodes that fit */
    BatchCand g[] = {{1, D, 1, 0}, {8, P, 2, 0}, {8, P, 3, 0}, {1, F, 4, 0}, {1, F, 5, 0}};
    pick_is(g, 5, 9, (int[]){0, 3, 4}, NULL, 3);
    pick_is(g, 5, 2, (int[]){3, 4}, NULL, 2);
    /* a tree of 4 rows does not fit beside the prompt; the younger 1-row decode does */
    BatchCand d[] = {{4, D, 2, 0}, {8, P, 1, 0}, {1, D, 3, 0}};
    pick_is(d, 3, 10, (int[]){1, 2}, NULL, 2);
    /* a lone decode larger than the budget runs whole; beside a prompt it waits */
    BatchCand e[] = {{20, D, 1, 0}};
    pick_is(e, 1, 10, (int[]){0}, NULL, 1);
    BatchCand f[] = {{20, D, 1, 0}, {8, P, 2, 0}};
    pick_is(f, 2, 10, (int[]){1}, NULL, 1);
    /* a lone prompt larger than the budget runs as much as the budget holds */
    BatchCand l[] = {{40, P, 1, 0}};
    pick_is(l, 1, 32, (int[]){0}, (int[]){32}, 1);
    ck_assert_int_eq(batch_pick(f, 0, 10, (int[2]){0}, (int[2]){0}), 0);
}
END_TEST

/* Prompt rows go shortest remaining first, the shortest all it has left; a prompt that has
 * waited BATCH_PREFILL_AGE passes goes before younger ones whatever their length. */
START_TEST(test_batch_pick_srpt) {
    enum { P = BATCH_PREFILL, D = BATCH_DECODE };
    BatchCand c[] = {{40, P, 1, 3}, {10, P, 2, 2}, {30, P, 3, 1}};
    pick_is(c, 3, 32, (int[]){1, 2}, (int[]){10, 22}, 2);
    pick_is(c, 3, 80, (int[]){0, 1, 2}, NULL, 3);
    /* equal rows: the older */
    BatchCand t[] = {{12, P, 5, 0}, {12, P, 4, 0}};
    pick_is(t, 2, 12, (int[]){1}, NULL, 1);
    /* an old long prompt goes first; a younger one of the same age rank waits */
    BatchCand a[] = {{40, P, 1, BATCH_PREFILL_AGE}, {10, P, 2, 0}, {1, D, 0, 0}};
    pick_is(a, 3, 32, (int[]){0}, (int[]){32}, 1);
    pick_is(a, 3, 45, (int[]){0, 1}, (int[]){40, 5}, 2);
    a[0].waited = BATCH_PREFILL_AGE - 1;
    pick_is(a, 3, 32, (int[]){0, 1}, (int[]){22, 10}, 2);
    /* two old ones: the older first, even when longer */
    BatchCand o[] = {{10, P, 2, BATCH_PREFILL_AGE}, {40, P, 1, BATCH_PREFILL_AGE + 3}};
    pick_is(o, 2, 32, (int[]){1}, (int[]){32}, 1);
}
END_TEST

/* The scheduler's passes over requests that each go prompt -> first token -> decode (one
 * row a pass, until the simulation ends), as pass_pick ranks them: joined[i] is the pass at
 * which request i arrives with a prompt of len[i] rows. first[i] gets the pass that ran
 * its first-token row (-1: none within n_passes). */
#define SIM_MAX 64
static void sim_run(const int *len, const int *joined, int n, int budget, int n_passes,
                    int *first) {
    int left[SIM_MAX], out[SIM_MAX], take[SIM_MAX], who[SIM_MAX];
    BatchCand c[SIM_MAX];
    ck_assert_int_le(n, SIM_MAX);
    for (int i = 0; i < n; i++) left[i] = len[i], first[i] = -1;
    for (int pass = 0; pass < n_passes; pass++) {
        int m = 0;
        for (int i = 0; i < n; i++) {
            if (joined[i] > pass) continue;
            int rank = left[i] ? BATCH_PREFILL : first[i] < 0 ? BATCH_FIRST_TOKEN : BATCH_DECODE;
            c[m] = (BatchCand){left[i] ? left[i] : 1, rank, (uint64_t)i + 1, pass - joined[i]};
            who[m++] = i;
        }
        int k = batch_pick(c, m, budget, out, take), rows = 0;
        for (int j = 0; j < k; j++) {
            int i = who[out[j]];
            rows += take[j];
            if (c[out[j]].rank == BATCH_PREFILL) left[i] -= take[j];
            else if (c[out[j]].rank == BATCH_FIRST_TOKEN) first[i] = pass;
        }
        ck_assert_int_le(rows, budget);
    }
}

/* A burst of prompts at once: each gets its first token in the order of its length, the
 * shortest in the second pass, and the median long before the last. */
START_TEST(test_batch_burst_order) {
    static const int len[] = {50, 12, 70, 30, 20, 90, 44, 26};
    int n = 8, joined[8] = {0}, first[8];
    sim_run(len, joined, n, 32, 40, first);
    for (int i = 0; i < n; i++) {
        ck_assert_msg(first[i] >= 0, "request %d never answered", i);
        for (int j = 0; j < n; j++)
            ck_assert_msg(len[i] >= len[j] || first[i] <= first[j], "a prompt of %d rows answered "
                          "at pass %d, one of %d at %d", len[i], first[i], len[j], first[j]);
    }
    ck_assert_int_eq(first[1], 1); /* 12 rows: pass 0, then its first token */
    /* the four shortest (12 + 20 + 26 + 30 = 88 rows) take three prompt passes, each but
     * the last followed by a first-token pass: the fourth is answered in pass 5, where
     * oldest first would have run the 50, 12 and 70 rows before the 30 */
    ck_assert_int_eq(first[3], 5);
}
END_TEST

/* A long prompt among a stream of shorter ones that would fill every pass alone: after
 * BATCH_PREFILL_AGE passes it goes first, and is answered once its rows have run. */
START_TEST(test_batch_no_starving) {
    enum { N = 48, BUDGET = 16, LONG = 100 };
    int len[N], joined[N], first[N];
    len[0] = LONG, joined[0] = 0;
    for (int i = 1; i < N; i++) len[i] = BUDGET, joined[i] = i - 1; /* one a pass */
    sim_run(len, joined, N, BUDGET, N + 20, first);
    int bound = BATCH_PREFILL_AGE + (LONG + BUDGET - 1) / BUDGET + 1;
    ck_assert_msg(first[0] >= 0 && first[0] <= bound, "the long prompt answered at pass %d "
                  "(bound %d)", first[0], bound);
    ck_assert_int_eq(first[1], 1); /* before it aged, the short ones went first */
}
END_TEST

Suite *suite_batch(void) {
    Suite *s = suite_create("batch");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_batch_exact);
    tcase_add_test(tc, test_batch_chunks);
    tcase_add_test(tc, test_batch_split_prompts);
    tcase_add_test(tc, test_batch_split_preempt);
    tcase_add_test(tc, test_batch_preempt);
    tcase_add_test(tc, test_batch_options);
    tcase_add_test(tc, test_batch_model_drafters);
    tcase_add_test(tc, test_batch_remote_drafter);
    tcase_add_test(tc, test_remote_sequence_bound);
    tcase_add_test(tc, test_batch_pick);
    tcase_add_test(tc, test_batch_pick_srpt);
    tcase_add_test(tc, test_batch_burst_order);
    tcase_add_test(tc, test_batch_no_starving);
    suite_add_tcase(s, tc);
    return s;
}
