/* Continuous batching (target_proc/batch.h): decodes on a batcher's views, several at once
 * on threads of their own, joining mid-decode, with prompts of different lengths, chunked
 * prefill, a row budget that splits passes and a KV cache too small for all of them
 * (preemption and restart), must emit exactly the tokens of the same decode run alone on a
 * target of its own: AR and the draft rule with a suffix drafter, T=0 and seeded T=1. */
#include "testutil.h"
#include "common/rng.h"
#include "draft_proc/suffix_drafter.h"
#include "target_proc/batch.h"
#include "target_proc/decode.h"
#include <pthread.h>
#include <string.h>

#define VOCAB 48
#define NREQ 8
#define MAXNEW 24

typedef struct {
    int prompt[64], n_prompt;
    DecodeOpts o;
    int out[MAXNEW + ROUND_MAX_EMIT], n_out;
    int restarts;
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
    r->o = (DecodeOpts){.rule = kind < 2 ? RULE_AR : RULE_DRAFT, .budget = 6, .seed = 5 + i,
                        .max_new = MAXNEW - i % 5, .ignore_eos = 1};
    if (kind % 2) r->o.sampling = (Sampling){.temperature = 1.0};
}

/* One decode on t with a fresh suffix drafter; RS_EFULL when preempted. */
static int req_run(Target *t, Req *r, RsErr *e) {
    Drafter *d = NULL;
    if (r->o.rule != RULE_AR)
        ck_assert_int_eq(drafter_suffix_create(VOCAB, NULL, 0, NULL, &d, e), RS_OK);
    DecodeResult res = {.tokens = r->out, .cap = MAXNEW + ROUND_MAX_EMIT};
    int rc = decode_run(t, d, r->prompt, r->n_prompt, &r->o, NULL, &res, e);
    drafter_destroy(&d);
    r->n_out = res.n_tokens;
    return rc;
}

typedef struct {
    Batcher *bt;
    Req *reqs;
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
    for (int i = w->first; i < NREQ && !w->fail; i += w->step) {
        Req *r = &w->reqs[i];
        for (;;) {
            int rc = req_run(t, r, &e);
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
        ck_assert_msg(req_run(t, &want[i], &e) == RS_OK, "solo %d: %s", i, e.msg);
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
        w[k] = (Worker){.bt = bt, .reqs = got, .first = k, .step = parallel};
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
                          rule_name(got[i].o.rule), got[i].o.sampling.temperature, j,
                          got[i].out[j], want[i].out[j]);
        restarts += got[i].restarts;
    }
    BatchStats st = batcher_stats(bt);
    ck_assert_int_eq(st.blocks_used, 0); /* every block back */
    ck_assert_int_eq(st.active, 0);
    ck_assert_msg(st.rows > st.passes, "passes never carried several rows (%llu rows, %llu passes)",
                  (unsigned long long)st.rows, (unsigned long long)st.passes);
    if (want_preempt) ck_assert_msg(st.preemptions > 0 && restarts > 0, "nothing was preempted");
    batcher_destroy(&bt);
    model_destroy(&m);
}

START_TEST(test_batch_exact) { batch_check_all(4, 64, 16, 1024, 0); }
END_TEST

/* Prefill chunks of 3 rows and passes of at most 8: prompts interleave with decodes. */
START_TEST(test_batch_chunks) { batch_check_all(3, 8, 3, 1024, 0); }
END_TEST

/* 5 blocks for 4 decodes of up to 3 blocks each: passes shrink, decodes get preempted and
 * restart, and every output still equals its solo run. */
START_TEST(test_batch_preempt) { batch_check_all(4, 64, 16, 5 * BACKEND_KV_BLOCK, 1); }
END_TEST

START_TEST(test_batch_options) {
    Model *m = tu_random_model(ARCH_LLAMA, 32, 64, 2, 4, 2, VOCAB, 77);
    BatchOpts o = {.parallel = 2, .row_budget = 4, .prefill_chunk = 8, .kv_entries = 256,
                   .seq_capacity = 128, .backend = {.threads = 1}};
    Batcher *bt = NULL;
    RsErr e = {0};
    ck_assert_int_eq(batcher_create(m, &cpu_backend_ops, &o, &bt, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "--batch-rows 4 outside [--prefill-chunk 8"), "%s", e.msg);
    o.row_budget = 16;
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

/* Picks k indices from c by batch_pick and compares them with want (oldest first). */
static void pick_is(const BatchCand *c, int n, int budget, const int *want, int k) {
    int out[8];
    int got = batch_pick(c, n, budget, out);
    ck_assert_int_eq(got, k);
    for (int i = 0; i < k; i++) ck_assert_int_eq(out[i], want[i]);
}

/* A first token goes before prompt chunks, a chunk before older decodes; whatever does not
 * fit is skipped, not a stop; the first taken runs even when larger than the budget. */
START_TEST(test_batch_pick) {
    enum { F = BATCH_FIRST_TOKEN, P = BATCH_PREFILL, D = BATCH_DECODE };
    /* two decodes of 1 row, then two prompts' chunks of 8: budget 9 takes the older chunk
     * and one decode (the oldest), not both decodes without any prompt */
    BatchCand c[] = {{1, D, 1}, {1, D, 2}, {8, P, 3}, {8, P, 4}};
    pick_is(c, 4, 9, (int[]){0, 2}, 2);
    pick_is(c, 4, 10, (int[]){0, 1, 2}, 3);
    pick_is(c, 4, 18, (int[]){0, 1, 2, 3}, 4);
    pick_is(c, 4, 16, (int[]){2, 3}, 2);
    /* a prompt just in gets its first token before the chunks of the others and the
     * decodes: budget 9 takes it and the older chunk */
    BatchCand g[] = {{1, D, 1}, {8, P, 2}, {8, P, 3}, {1, F, 4}};
    pick_is(g, 4, 9, (int[]){1, 3}, 2);
    /* a tree of 4 rows does not fit beside the chunk; the younger 1-row decode does */
    BatchCand d[] = {{4, D, 2}, {8, P, 1}, {1, D, 3}};
    pick_is(d, 3, 10, (int[]){1, 2}, 2);
    /* a lone request larger than the budget runs; beside a chunk it waits */
    BatchCand e[] = {{20, D, 1}};
    pick_is(e, 1, 10, (int[]){0}, 1);
    BatchCand f[] = {{20, D, 1}, {8, P, 2}};
    pick_is(f, 2, 10, (int[]){1}, 1);
    ck_assert_int_eq(batch_pick(f, 0, 10, (int[2]){0}), 0);
}
END_TEST

Suite *suite_batch(void) {
    Suite *s = suite_create("batch");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_batch_exact);
    tcase_add_test(tc, test_batch_chunks);
    tcase_add_test(tc, test_batch_preempt);
    tcase_add_test(tc, test_batch_options);
    tcase_add_test(tc, test_batch_pick);
    suite_add_tcase(s, tc);
    return s;
}
