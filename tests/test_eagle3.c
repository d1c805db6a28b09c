/* EAGLE-3 head tests: forward parity against the torch reference written from the
 * published model code (tools/gen_eagle3_fixture.py -> tests/fixtures/eagle3/: logits,
 * output states and top-10 target ids over a drafting script of commits with target
 * features and tree expansions with the head's own states), loader refusals (missing
 * tensor, wrong draft vocabulary, d2t out of range, not a head), the fit-to-target check
 * (hidden size, vocabulary, feature layers), and the random presets. */
#include "common/eagle3.h"
#include "common/hf.h"
#include "common/quant.h"
#include "common/randmodel.h"
#include "common/rng.h"
#include "draft_proc/eagle3_drafter.h"
#include "draft_proc/drafter_impl.h"
#include "draft_proc/eagle3_forward.h"
#include "draft_proc/draft_server.h"
#include "kernels/backend.h"
#include "proto/proto.h"
#include "target_proc/decode.h"
#include "draft_proc/remote_drafter.h"
#include "testutil.h"
#include <pthread.h>
#include <zmq.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Parity tolerance of the f32 forward against the float64 reference. */
#define E3_ATOL 1e-4f
#define E3_RTOL 1e-5f

static cJSON *load_expected(void) {
    char *txt;
    size_t len;
    RsErr e = {0};
    ck_assert_msg(rs_read_file(tu_fixture("eagle3/expected.json"), &txt, &len, &e) == 0, "%s", e.msg);
    cJSON *j = cJSON_ParseWithLength(txt, len);
    free(txt);
    ck_assert_ptr_nonnull(j);
    ck_assert_str_eq(cJSON_GetObjectItem(j, "magic")->valuestring, "RSE3FX01");
    ck_assert_int_eq(cJSON_GetObjectItem(j, "version")->valueint, 1);
    return j;
}

/* Flattens a JSON array (of arrays) of numbers into floats; returns the count. */
static size_t flat_floats(const cJSON *a, float *out, size_t cap) {
    size_t n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, a) {
        if (cJSON_IsArray(it)) n += flat_floats(it, out + n, cap - n);
        else {
            ck_assert(n < cap);
            out[n++] = (float)it->valuedouble;
        }
    }
    return n;
}

static int flat_ints(const cJSON *a, int *out, int cap) {
    int n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, a) {
        if (cJSON_IsArray(it)) n += flat_ints(it, out + n, cap - n);
        else {
            ck_assert(n < cap);
            out[n++] = it->valueint;
        }
    }
    return n;
}

/* The target's embeddings in f32, read straight from its safetensors. */
static float *target_embeddings(const char *dir, const Config *t) {
    HfTensors *ts;
    RsErr e = {0};
    ck_assert_msg(hf_tensors_create(dir, &ts, &e) == 0, "%s", e.msg);
    float *emb = malloc(sizeof(float) * (size_t)t->vocab_size * t->dim);
    WeightReq w = {.hf_name = "model.embed_tokens.weight", .slot = &emb, .rows = t->vocab_size,
                   .cols = t->dim};
    uint64_t fp = 0;
    ck_assert_msg(hf_tensors_load(ts, &w, &fp, &e) == 0, "%s", e.msg);
    hf_tensors_destroy(&ts);
    return emb;
}

#define MAX_ROWS 8
typedef struct {
    Eagle3Runner *r;
    const Eagle3Head *h;
    float *states[16]; /* per step: (rows, dim) outputs of this C run */
    int depth[16][MAX_ROWS]; /* tree depth of each step's rows (0 = committed) */
    float max_logit_diff, max_state_diff;
} Run;

/* Compares one step's outputs with the fixture's; n rows. */
static void check_rows(Run *run, const cJSON *s, const float *logits, const float *state, int n,
                       const char *label) {
    const Eagle3Head *h = run->h;
    int DV = h->cfg.draft_vocab, D = h->cfg.c.dim;
    float *ref = malloc(sizeof(float) * (size_t)n * (DV > D ? DV : D));
    float mx;
    ck_assert_int_eq(flat_floats(cJSON_GetObjectItem(s, "logits"), ref, (size_t)n * DV), (size_t)n * DV);
    ck_assert_int_eq(tu_compare(label, logits, ref, (size_t)n * DV, E3_ATOL, E3_RTOL, &mx), 0);
    if (mx > run->max_logit_diff) run->max_logit_diff = mx;
    ck_assert_int_eq(flat_floats(cJSON_GetObjectItem(s, "state"), ref, (size_t)n * D), (size_t)n * D);
    ck_assert_int_eq(tu_compare(label, state, ref, (size_t)n * D, E3_ATOL, E3_RTOL, &mx), 0);
    if (mx > run->max_state_diff) run->max_state_diff = mx;
    int want[MAX_ROWS * 10];
    ck_assert_int_eq(flat_ints(cJSON_GetObjectItem(s, "top10"), want, MAX_ROWS * 10), n * 10);
    for (int i = 0; i < n; i++) {
        int got[10];
        float lq[10];
        eagle3_topk(h, logits + (size_t)i * DV, 10, got, lq);
        for (int k = 0; k < 10; k++)
            ck_assert_msg(got[k] == want[i * 10 + k], "%s row %d top-%d: got target id %d, ref %d",
                          label, i, k, got[k], want[i * 10 + k]);
        for (int k = 1; k < 10; k++) ck_assert(lq[k] <= lq[k - 1] && lq[k] <= 0);
    }
    free(ref);
}

static void run_step(Run *run, const cJSON *s, int si, const char *head) {
    const Eagle3Head *h = run->h;
    int DV = h->cfg.draft_vocab, D = h->cfg.c.dim, F = 3 * h->cfg.target_hidden;
    int tokens[MAX_ROWS], pos[MAX_ROWS], parents[2 * MAX_ROWS];
    int n = flat_ints(cJSON_GetObjectItem(s, "tokens"), tokens, MAX_ROWS);
    float *logits = malloc(sizeof(float) * (size_t)n * DV);
    run->states[si] = malloc(sizeof(float) * (size_t)n * D);
    char label[96];
    snprintf(label, sizeof label, "%s step %d", head, si);
    RsErr e = {0};
    if (!strcmp(cJSON_GetObjectItem(s, "op")->valuestring, "commit")) {
        float *feats = malloc(sizeof(float) * (size_t)n * F);
        ck_assert_int_eq(flat_floats(cJSON_GetObjectItem(s, "features"), feats, (size_t)n * F), (size_t)n * F);
        ck_assert_msg(eagle3_commit(run->r, tokens, feats, n, run->states[si], logits, &e) == 0, "%s", e.msg);
        run->depth[si][0] = 0;
        ck_assert_int_eq(eagle3_n_pending(run->r), 0);
        free(feats);
        n = 1; /* the last row's outputs */
    } else {
        ck_assert_int_eq(flat_ints(cJSON_GetObjectItem(s, "pos"), pos, MAX_ROWS), n);
        flat_ints(cJSON_GetObjectItem(s, "parents"), parents, 2 * MAX_ROWS);
        float *st = malloc(sizeof(float) * (size_t)n * D);
        for (int i = 0; i < n; i++) { /* the parent's state from this C run, not the fixture */
            int ps = parents[2 * i], pr = parents[2 * i + 1];
            memcpy(st + (size_t)i * D, run->states[ps] + (size_t)pr * D, sizeof(float) * D);
            run->depth[si][i] = run->depth[ps][pr] + 1;
            ck_assert_int_eq(pos[i], eagle3_node_pos(run->r, run->depth[si][i]));
        }
        int cols = eagle3_n_pending(run->r) + n, m[MAX_ROWS * 64];
        ck_assert_int_eq(flat_ints(cJSON_GetObjectItem(s, "mask"), m, MAX_ROWS * 64), n * cols);
        uint8_t mask[MAX_ROWS * 64];
        for (int i = 0; i < n * cols; i++) mask[i] = (uint8_t)m[i];
        ck_assert_msg(eagle3_expand(run->r, tokens, st, pos, mask, n, logits, run->states[si], &e) == 0,
                      "%s", e.msg);
        free(st);
    }
    check_rows(run, s, logits, run->states[si], n, label);
    free(logits);
}

/* The fixture's steps through the C runner on `threads` threads against the Python
 * reference's outputs; the head's matrices must stay in the checkpoint's 16-bit type,
 * pointing into the file's mapping (want_type). */
static void parity(const char *head_dir, int want_own_embed, uint32_t want_type, int threads) {
    cJSON *j = load_expected();
    const cJSON *hj = NULL, *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(j, "heads"))
        if (!strcmp(cJSON_GetObjectItem(it, "dir")->valuestring, head_dir + strlen("eagle3/"))) hj = it;
    ck_assert_ptr_nonnull(hj);
    char hp[256], tp[256];
    snprintf(hp, sizeof hp, "%s", tu_fixture(head_dir));
    snprintf(tp, sizeof tp, "%s", tu_fixture("eagle3/target"));
    Model *m;
    Eagle3Head *h;
    RsErr e = {0};
    ck_assert_msg(model_load(tp, &m, &e) == 0, "%s", e.msg);
    ck_assert_msg(eagle3_head_load(hp, &h, &e) == 0, "%s", e.msg);
    ck_assert_int_eq(h->embed.data != NULL, want_own_embed);
    const QTensor *mats[EAGLE3_N_MATRICES + 1];
    eagle3_head_matrices(h, mats);
    mats[EAGLE3_N_MATRICES] = want_own_embed ? &h->embed : &h->fc;
    ck_assert_int_eq(h->n_maps, 1);
    for (int i = 0; i <= EAGLE3_N_MATRICES; i++) {
        const uint8_t *d = mats[i]->data, *map = h->maps[0];
        ck_assert_msg(mats[i]->type == want_type, "matrix %d: ggml type %u, want %u", i,
                      (unsigned)mats[i]->type, (unsigned)want_type);
        ck_assert(d > map && d + (size_t)mats[i]->rows * mats[i]->row_bytes <= map + h->map_sizes[0]);
    }
    int layers[3];
    ck_assert_msg(eagle3_head_check(h, &m->cfg, layers, &e) == 0, "%s", e.msg);
    ck_assert(layers[0] == 0 && layers[1] == 1 && layers[2] == 2);
    float *temb = target_embeddings(tp, &m->cfg);
    Run run = {.h = h};
    Eagle3Embed em = {.table = h->embed.data ? h->embed : qtensor_f32(temb, m->cfg.vocab_size,
                                                                       m->cfg.dim)};
    BackendParams bp = {.kv_capacity = 64, .max_batch = 4, .threads = threads};
    ck_assert_msg(eagle3_runner_create_on(h, &em, &cpu_eagle3_layer, &bp, &run.r, &e) == 0,
                  "%s", e.msg);
    int si = 0;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(hj, "steps")) run_step(&run, it, si++, head_dir);
    ck_assert_int_ge(si, 6);
    fprintf(stderr, "eagle3 parity %s: %d steps, max |logit diff| %.3g, max |state diff| %.3g "
            "(tolerance %.0e + %.0e*|ref|)\n", head_dir, si, (double)run.max_logit_diff,
            (double)run.max_state_diff, (double)E3_ATOL, (double)E3_RTOL);
    for (int i = 0; i < si; i++) free(run.states[i]);
    eagle3_runner_destroy(&run.r);
    ck_assert_ptr_null(run.r);
    free(temb);
    eagle3_head_destroy(&h);
    ck_assert_ptr_null(h);
    model_destroy(&m);
    cJSON_Delete(j);
}

START_TEST(test_parity_target_embeddings) { parity("eagle3/head", 0, QT_F16, 1); }
END_TEST

START_TEST(test_parity_own_embeddings_llama3_rope) { parity("eagle3/head_embed", 1, QT_BF16, 2); }
END_TEST

/* Replays one pool node's ancestors alone on a fresh runner (each pass a single row, its
 * mask naming its ancestors) and returns the log q its parent's logits give `token`. */
static float replay_logq(const Eagle3Head *h, const float *emb, const int *toks, const float *feats,
                         int n0, const Pool *p, int node) {
    int chain[POOL_MAX_DEPTH], nch = 0;
    for (int a = p->parent[node]; a >= 0; a = p->parent[a]) chain[nch++] = a;
    Eagle3Runner *r;
    RsErr e = {0};
    ck_assert(eagle3_runner_create(h, emb, 64, 4, &r, &e) == 0);
    int D = h->cfg.c.dim, DV = h->cfg.draft_vocab;
    float *st = malloc(sizeof(float) * D), *st2 = malloc(sizeof(float) * D);
    float *lg = malloc(sizeof(float) * DV);
    ck_assert(eagle3_commit(r, toks, feats, n0, st, lg, &e) == 0);
    for (int i = nch - 1; i >= 0; i--) { /* root's child first */
        uint8_t mask[POOL_MAX_DEPTH];
        int np = eagle3_n_pending(r), u = chain[i], pos = eagle3_node_pos(r, p->depth[u]), tok = p->token[u];
        for (int j = 0; j <= np; j++) mask[j] = 1; /* the chain so far is exactly its ancestors */
        ck_assert_msg(eagle3_expand(r, &tok, st, &pos, mask, 1, lg, st2, &e) == 0, "%s", e.msg);
        memcpy(st, st2, sizeof(float) * D);
    }
    int ids[POOL_TOPK];
    float lq[POOL_TOPK], out = NAN;
    eagle3_topk(h, lg, POOL_TOPK, ids, lq);
    for (int k = 0; k < POOL_TOPK; k++)
        if (ids[k] == p->token[node]) out = lq[k];
    eagle3_runner_destroy(&r);
    free(st);
    free(st2);
    free(lg);
    return out;
}

START_TEST(test_grow_pool) {
    cJSON *j = load_expected();
    const cJSON *s0 = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "heads"), 0), "steps"), 0);
    Model *m;
    Eagle3Head *h;
    RsErr e = {0};
    ck_assert(model_load(tu_fixture("eagle3/target"), &m, &e) == 0);
    ck_assert(eagle3_head_load(tu_fixture("eagle3/head"), &h, &e) == 0);
    float *emb = target_embeddings(tu_fixture("eagle3/target"), &m->cfg);
    int toks[MAX_ROWS], F = 3 * h->cfg.target_hidden, D = h->cfg.c.dim, DV = h->cfg.draft_vocab;
    int n0 = flat_ints(cJSON_GetObjectItem(s0, "tokens"), toks, MAX_ROWS);
    float *feats = malloc(sizeof(float) * (size_t)n0 * F), *st = malloc(sizeof(float) * D);
    float *lg = malloc(sizeof(float) * DV);
    flat_floats(cJSON_GetObjectItem(s0, "features"), feats, (size_t)n0 * F);
    Eagle3Runner *r, *small;
    ck_assert(eagle3_runner_create(h, emb, 96, 10, &r, &e) == 0);
    ck_assert(eagle3_commit(r, toks, feats, n0, st, lg, &e) == 0);
    Pool *p = calloc(1, sizeof *p);
    ck_assert_msg(eagle3_grow_pool(r, st, lg, p, &e) == 0, "%s", e.msg);
    ck_assert_int_eq(p->n, POOL_MAX);
    ck_assert_int_eq(p->n_expanded, POOL_N_EXPANDED);
    ck_assert_int_eq(p->n_passes, 8);
    ck_assert_int_eq(eagle3_n_pending(r), POOL_N_EXPANDED);
    int ids[POOL_TOPK], want[POOL_TOPK];
    eagle3_topk(h, lg, POOL_TOPK, ids, NULL);
    flat_ints(cJSON_GetObjectItem(s0, "top10"), want, POOL_TOPK);
    for (int k = 0; k < POOL_TOPK; k++) ck_assert(p->token[k] == ids[k] && ids[k] == want[k]);
    /* deepest nodes: their log q as a fresh runner gives it from the ancestors alone */
    int checked = 0;
    for (int u = 0; u < p->n && checked < 3; u++) {
        if (p->depth[u] < POOL_MAX_DEPTH - 4) continue;
        float ref = replay_logq(h, emb, toks, feats, n0, p, u);
        ck_assert_msg(fabsf(ref - p->logq[u]) < 1e-4f, "node %d depth %d: logq %g, replay %g", u,
                      p->depth[u], (double)p->logq[u], (double)ref);
        checked++;
    }
    ck_assert_int_eq(checked, 3);
    ck_assert(eagle3_commit(r, toks, feats, 1, NULL, NULL, &e) == 0); /* drops the tree */
    ck_assert_int_eq(eagle3_n_pending(r), 0);
    ck_assert(eagle3_runner_create(h, emb, 96, 4, &small, &e) == 0);
    ck_assert(eagle3_commit(small, toks, feats, n0, st, lg, &e) == 0);
    ck_assert_int_eq(eagle3_grow_pool(small, st, lg, p, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "max_batch >= 10 (have 4)"), "%s", e.msg);
    eagle3_runner_destroy(&small);
    eagle3_runner_destroy(&r);
    free(p);
    free(feats);
    free(st);
    free(lg);
    free(emb);
    eagle3_head_destroy(&h);
    model_destroy(&m);
    cJSON_Delete(j);
}
END_TEST

/* The fixture's commit step `si` of head/ through the Drafter interface: its root children
 * must be the reference's top 10. first: the commit starts the context (a token before the
 * fixture's rows, with an ignored feature row, leads it). */
static void drafter_round(Drafter *d, const cJSON *steps, int si, int first, int reset, Pool *p) {
    const cJSON *s = cJSON_GetArrayItem(steps, si);
    int toks[MAX_ROWS + 1], want[POOL_TOPK], F = 3 * 32;
    int n = flat_ints(cJSON_GetObjectItem(s, "tokens"), toks + first, MAX_ROWS) + first;
    float *feats = calloc((size_t)n * F, sizeof(float));
    flat_floats(cJSON_GetObjectItem(s, "features"), feats + (size_t)first * F, (size_t)(n - first) * F);
    if (first) {
        toks[0] = 11;
        for (int i = 0; i < F; i++) feats[i] = NAN; /* must not be read */
    }
    RsErr e = {0};
    ck_assert_msg(drafter_grow_begin(d, toks, n, reset, feats, sizeof(float) * (size_t)n * F, &e) == 0,
                  "%s", e.msg);
    ck_assert_msg(drafter_grow_end(d, p, &e) == 0, "%s", e.msg);
    ck_assert_int_eq(p->n, POOL_MAX);
    ck_assert(p->commit_pass_ns > 0 && p->draft_ns >= p->commit_pass_ns);
    flat_ints(cJSON_GetObjectItem(s, "top10"), want, POOL_TOPK);
    for (int k = 0; k < POOL_TOPK; k++)
        ck_assert_msg(p->token[k] == want[k] && p->parent[k] == -1, "step %d child %d: %d, ref %d",
                      si, k, p->token[k], want[k]);
    free(feats);
}

START_TEST(test_drafter_kind) {
    cJSON *j = load_expected();
    const cJSON *steps = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "heads"), 0), "steps");
    Model *m;
    Eagle3Head *h;
    Drafter *d;
    RsErr e = {0};
    ck_assert(model_load(tu_fixture("eagle3/target"), &m, &e) == 0);
    ck_assert(eagle3_head_load(tu_fixture("eagle3/head"), &h, &e) == 0);
    float *emb = target_embeddings(tu_fixture("eagle3/target"), &m->cfg);
    int L[EAGLE3_N_FEATURES];
    ck_assert_msg(eagle3_head_check(h, &m->cfg, L, &e) == 0, "%s", e.msg);
    ck_assert_msg(drafter_eagle3_create(h, emb, 96, L, &d, &e) == 0, "%s", e.msg);
    ck_assert_int_eq(drafter_info(d)->n_feature_layers, 3);
    ck_assert_int_eq(drafter_info(d)->feature_layers[2], L[2]);
    ck_assert_int_eq(drafter_info(d)->vocab_size, 96);
    ck_assert_str_eq(drafter_info(d)->fingerprint, h->fingerprint);
    Pool *p = malloc(sizeof *p);
    drafter_round(d, steps, 0, 1, 1, p); /* the prompt: a leading token + the fixture's 5 rows */
    /* its host work is reported as the model drafter's: 71 rows reduced, the layer's runs
     * not counted */
    ck_assert_int_eq(p->draft_rows, 1 + POOL_N_EXPANDED);
    ck_assert(p->draft_host_ns > 0 && p->draft_host_ns < p->draft_ns);
    /* refusals: no features, a wrong size, a full cache; none commits anything */
    int tok[2] = {1, 2};
    float f[2 * 96] = {0};
    ck_assert_int_eq(drafter_grow_begin(d, tok, 2, 0, NULL, 0, &e), 0);
    ck_assert_int_eq(drafter_grow_end(d, p, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "needs 768 bytes of f32 target features"), "%s", e.msg);
    ck_assert_int_eq(drafter_grow_begin(d, tok, 2, 0, f, sizeof f - 4, &e), 0);
    ck_assert_int_eq(drafter_grow_end(d, p, &e), RS_EINVAL);
    int many[40] = {0};
    float *fm = calloc(40 * 96, sizeof(float));
    ck_assert_int_eq(drafter_grow_begin(d, many, 25, 0, fm, sizeof(float) * 25 * 96, &e), 0);
    ck_assert_int_eq(drafter_grow_end(d, p, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "KV cache full: 5 committed + 25 new + 70 tree rows > capacity 96"), "%s", e.msg);
    drafter_round(d, steps, 4, 0, 0, p); /* next round as the fixture's: the tree dropped */
    /* an empty context whose first commit is refused still has its first token to skip */
    ck_assert_int_eq(drafter_reset(d, NULL, 0, NULL, 0, &e), 0);
    ck_assert_int_eq(drafter_grow_begin(d, tok, 2, 0, NULL, 0, &e), 0);
    ck_assert_int_eq(drafter_grow_end(d, p, &e), RS_EINVAL);
    drafter_round(d, steps, 0, 1, 0, p);
    drafter_round(d, steps, 0, 1, 1, p); /* a reset (grow_begin's flag) replays the fixture */
    drafter_round(d, steps, 4, 0, 0, p);
    /* a one-token context has no row to draft from */
    ck_assert_int_eq(drafter_grow_begin(d, tok, 1, 1, f, sizeof(float) * 96, &e), 0);
    ck_assert_int_eq(drafter_grow_end(d, p, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "no row to draft from"), "%s", e.msg);
    free(fm);
    free(p);
    drafter_destroy(&d);
    ck_assert_ptr_null(d);
    free(emb);
    eagle3_head_destroy(&h);
    model_destroy(&m);
    cJSON_Delete(j);
}
END_TEST

/* ---- decoding with an EAGLE-3 drafter ----
 * With the target's own features (decode_run sends them) this is tests/test_feat.c's; here
 * a test adapter (a Drafter kind of its own) replaces them: the feature row of
 * a token is a fixed pseudo-random function of the token before it. Exactness never depends
 * on what the features are, only on the pools being well formed. */
typedef struct {
    Drafter *inner; /* the EAGLE-3 kind */
    int F, prev;    /* feature width; the last committed token, -1 after a reset */
    float *feats;   // (ROUND_MAX_EMIT + 512, F)
} FeatAdapter;

static const void *adapter_feats(FeatAdapter *a, const int *tokens, int n, size_t *bytes) {
    for (int i = 0; i < n; i++) {
        int before = i ? tokens[i - 1] : a->prev;
        for (int k = 0; k < a->F; k++)
            a->feats[(size_t)i * a->F + k] = before < 0 ? 0.0f : rs_rand_unit((uint64_t)before, (uint64_t)k);
    }
    if (n) a->prev = tokens[n - 1];
    *bytes = sizeof(float) * (size_t)n * a->F;
    return a->feats;
}

static int ad_reset(void *ctx, const int *prompt, int n, const void *f, size_t fb, RsErr *e) {
    FeatAdapter *a = ctx;
    a->prev = -1;
    size_t bytes;
    const void *ff = adapter_feats(a, prompt, n, &bytes);
    return drafter_reset(a->inner, prompt, n, n ? ff : NULL, n ? bytes : 0, e);
}

static int ad_grow_begin(void *ctx, const int *tokens, int n, const void *f, size_t fb, RsErr *e) {
    size_t bytes;
    const void *ff = adapter_feats(ctx, tokens, n, &bytes);
    return drafter_grow_begin(((FeatAdapter *)ctx)->inner, tokens, n, 0, ff, bytes, e);
}

static int ad_grow_end(void *ctx, Pool *out, RsErr *e) {
    return drafter_grow_end(((FeatAdapter *)ctx)->inner, out, e);
}

static void ad_destroy(void *ctx) {
    FeatAdapter *a = ctx;
    drafter_destroy(&a->inner);
    free(a->feats);
    free(a);
}

static const DrafterOps adapter_ops = {ad_reset, ad_grow_begin, ad_grow_end, ad_destroy, NULL, NULL,
                                       NULL, NULL};

START_TEST(test_decode_identity_with_eagle3) {
    /* Every decoder at B=8 and B=40 emits exactly AR's greedy tokens with the fixture head
     * drafting for the fixture target (its embeddings), and never falls back to AR. */
    Model *tm;
    Eagle3Head *h;
    Target *t;
    RsErr e = {0};
    ck_assert(model_load(tu_fixture("eagle3/target"), &tm, &e) == 0);
    ck_assert(eagle3_head_load(tu_fixture("eagle3/head"), &h, &e) == 0);
    float *emb = target_embeddings(tu_fixture("eagle3/target"), &tm->cfg);
    int eog = -1;
    ck_assert_msg(target_create(tm, &cpu_backend_ops, TU_BP(512, 1), &eog, 0, &t, &e) == 0, "%s", e.msg);
    FeatAdapter *a = calloc(1, sizeof *a);
    a->F = 3 * h->cfg.target_hidden;
    a->feats = malloc(sizeof(float) * (size_t)(ROUND_MAX_EMIT + 512) * a->F);
    int L[EAGLE3_N_FEATURES];
    ck_assert_msg(eagle3_head_check(h, &tm->cfg, L, &e) == 0, "%s", e.msg);
    ck_assert(drafter_eagle3_create(h, emb, 512, L, &a->inner, &e) == 0);
    DrafterInfo info = *drafter_info(a->inner);
    Drafter *d = drafter_wrap(&adapter_ops, a, &info), *threaded;
    ck_assert_int_eq(drafter_threaded_create(d, &threaded, &e), 0);
    const DecoderKind rules[] = {DECODER_DRAFT, DECODER_PEARL, DECODER_ROOTDRAW, DECODER_ROOT};
    Rng r;
    rng_seed(&r, 5);
    long accepted = 0;
    for (int pr = 0; pr < 4; pr++) {
        int prompt[12], n = 2 + pr * 3, ref[64], got[64], buf[128];
        for (int i = 0; i < n; i++) prompt[i] = (int)(rng_next(&r) % 96);
        for (int ri = -1; ri < 4; ri++)
            for (int b = 0; b < (ri < 0 ? 1 : 2); b++) {
                DecoderKind decoder = ri < 0 ? DECODER_AR : rules[ri];
                DecodeOpts opts = {.decoder = decoder, .budget = b ? 40 : 8, .sampling = SAMPLING_GREEDY, .seed = 1,
                                   .prompt_id = (uint64_t)pr, .max_new = 30};
                DecodeResult res = {0};
                res.tokens = buf;
                res.cap = 30 + ROUND_MAX_EMIT;
                ck_assert_msg(decode_run(t, ri < 0 ? NULL : threaded, prompt, n, &opts, NULL, &res, &e) == 0,
                              "%s", e.msg);
                ck_assert_int_eq(res.drafter_failed, 0);
                ck_assert_int_ge(res.n_tokens, 30);
                memcpy(ri < 0 ? ref : got, buf, sizeof(int) * 30);
                if (ri >= 0) accepted += res.accepted_total;
                for (int i = 0; ri >= 0 && i < 30; i++)
                    ck_assert_msg(got[i] == ref[i], "%s B=%d prompt %d: token %d is %d, AR %d",
                                  decoder_name(decoder), opts.budget, pr, i, got[i], ref[i]);
            }
    }
    fprintf(stderr, "eagle3 decode identity: %ld draft tokens accepted over 32 decodes\n", accepted);
    drafter_destroy(&threaded);
    target_destroy(&t);
    free(emb);
    eagle3_head_destroy(&h);
    model_destroy(&tm);
}
END_TEST

/* Expects eagle3_head_load(dir) to fail with code and a message containing each needle. */
static void expect_refusal(const char *dir, int code, const char *n1, const char *n2) {
    Eagle3Head *h = (Eagle3Head *)1;
    RsErr e = {0};
    int rc = eagle3_head_load(tu_fixture(dir), &h, &e);
    ck_assert_msg(rc == code, "%s: rc %d (%s), want %d", dir, rc, e.msg, code);
    ck_assert_ptr_null(h);
    ck_assert_msg(strstr(e.msg, n1), "'%s' lacks '%s'", e.msg, n1);
    ck_assert_msg(!n2 || strstr(e.msg, n2), "'%s' lacks '%s'", e.msg, n2);
}

START_TEST(test_loader_refusals) {
    expect_refusal("eagle3/bad_missing", RS_EFORMAT, "missing tensor", "midlayer.mlp.up_proj.weight");
    expect_refusal("eagle3/bad_draft_vocab", RS_EFORMAT, "lm_head.weight has 40 rows",
                   "draft_vocab_size is 48");
    expect_refusal("eagle3/bad_d2t", RS_EFORMAT, "d2t[7]", "target id 96, outside the vocabulary of 96");
    expect_refusal("eagle3/target", RS_EUNSUPPORTED, "'LlamaForCausalLM' is not an EAGLE-3 head", NULL);
    expect_refusal("eagle3/no_such_dir", RS_EINVAL, "no config.json", NULL); /* bad input */
}
END_TEST

/* A copy of eagle3/head in a temporary directory whose config.json has `key` set to the
 * JSON `value` (the weights are linked), loaded and expected to fail with code/needle. */
static void expect_config_refusal(const char *key, const char *value, int code, const char *needle) {
    char dir[64] = "/tmp/rs_eagle3_XXXXXX", p[128], src[1024], *txt;
    ck_assert_ptr_nonnull(mkdtemp(dir));
    ck_assert_ptr_nonnull(realpath(tu_fixture("eagle3/head/model.safetensors"), src));
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    ck_assert_int_eq(symlink(src, p), 0);
    size_t len;
    RsErr e = {0};
    ck_assert(rs_read_file(tu_fixture("eagle3/head/config.json"), &txt, &len, &e) == 0);
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    cJSON_DeleteItemFromObject(j, key);
    cJSON_AddItemToObject(j, key, cJSON_Parse(value));
    txt = cJSON_Print(j);
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    fputs(txt, f);
    fclose(f);
    free(txt);
    cJSON_Delete(j);
    Eagle3Head *h = (Eagle3Head *)1;
    int rc = eagle3_head_load(dir, &h, &e);
    ck_assert_msg(rc == code && strstr(e.msg, needle), "%s=%s: rc %d '%s', want %d '%s'", key,
                  value, rc, e.msg, code, needle);
    ck_assert_ptr_null(h);
    snprintf(p, sizeof p, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(p), 0);
}

START_TEST(test_config_refusals) {
    expect_config_refusal("architectures", "[\"LlamaForCausalLM\"]", RS_EUNSUPPORTED,
                          "not an EAGLE-3 head");
    expect_config_refusal("architectures", "[\"Eagle3Speculator\"]", RS_EUNSUPPORTED,
                          "speculators layout");
    expect_config_refusal("num_hidden_layers", "2", RS_EUNSUPPORTED, "num_hidden_layers 2");
    expect_config_refusal("norm_before_residual", "true", RS_EUNSUPPORTED, "norm_before_residual");
    expect_config_refusal("eagle_config", "{\"use_aux_hidden_state\": false}", RS_EUNSUPPORTED,
                          "use_aux_hidden_state");
    expect_config_refusal("eagle_config", "{\"eagle_aux_hidden_state_layer_ids\": [1, 2]}",
                          RS_EUNSUPPORTED, "must list 3 layers");
    expect_config_refusal("draft_vocab_size", "97", RS_EFORMAT, "draft_vocab_size 97 exceeds vocab_size 96");
    expect_config_refusal("target_hidden_size", "48", RS_EFORMAT, "'fc.weight' has shape [32, 96], expected [32, 144]");
    expect_config_refusal("hidden_size", "40", RS_EFORMAT, "expected [40, 120]");
}
END_TEST

static void expect_misfit(const Eagle3Head *h, const Config *t, const char *n1, const char *n2) {
    int layers[3];
    RsErr e = {0};
    ck_assert_int_eq(eagle3_head_check(h, t, layers, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, n1) && strstr(e.msg, n2), "'%s' lacks '%s' or '%s'", e.msg, n1, n2);
}

START_TEST(test_fit_to_target) {
    Model *m;
    Eagle3Head *h, *he;
    RsErr e = {0};
    ck_assert_msg(model_load(tu_fixture("eagle3/target"), &m, &e) == 0, "%s", e.msg);
    ck_assert_msg(eagle3_head_load(tu_fixture("eagle3/head"), &h, &e) == 0, "%s", e.msg);
    ck_assert_msg(eagle3_head_load(tu_fixture("eagle3/head_embed"), &he, &e) == 0, "%s", e.msg);
    Config c = m->cfg;
    c.dim = 48; /* the head borrows embeddings of width 32 and takes 32-wide features */
    expect_misfit(h, &c, "width 32", "hidden size is 48");
    expect_misfit(he, &c, "width 32", "hidden size is 48");
    c = m->cfg;
    c.vocab_size = 128;
    expect_misfit(h, &c, "vocab_size 96", "128 tokens");
    c = m->cfg;
    c.n_layers = 1;
    expect_misfit(h, &c, "entering layer 2", "has 1 layers");
    /* a config without layer ids gets the default (2, N/2, N-3) */
    Eagle3Head copy = *h;
    for (int i = 0; i < 3; i++) copy.cfg.feature_layers[i] = -1;
    c = m->cfg;
    c.n_layers = 32;
    int L[3];
    ck_assert_msg(eagle3_head_check(&copy, &c, L, &e) == 0, "%s", e.msg);
    ck_assert(L[0] == 2 && L[1] == 16 && L[2] == 29);
    c.n_layers = 6; /* 2, 3, 3 */
    expect_misfit(&copy, &c, "2, 3, 3", "not strictly ascending");
    /* own embeddings: a head wider than the target fits it */
    ck_assert_msg(eagle3_head_check(he, &m->cfg, L, &e) == 0, "%s", e.msg);
    Eagle3Head no_embed = *he; /* the same head without embed_tokens cannot borrow them */
    no_embed.embed.data = NULL;
    expect_misfit(&no_embed, &m->cfg, "no embed_tokens and hidden_size 48", "width 32");
    eagle3_head_destroy(&h);
    eagle3_head_destroy(&he);
    model_destroy(&m);
}
END_TEST

/* Listed feature-layer ids, read either way. Expectations come from the two conventions'
 * definitions against the default (2, N/2, N-3): vLLM's id i is the stream entering
 * layer i (the backend's index), SGLang's the output of layer i, i.e. entering i + 1. */
static void expect_layers(const Eagle3Head *h, int n_layers, int a, int b, int c) {
    Config t = {0};
    RsErr e = {0};
    int L[3];
    t.vocab_size = h->cfg.c.vocab_size;
    t.dim = h->cfg.target_hidden;
    t.n_layers = n_layers;
    ck_assert_msg(eagle3_head_check(h, &t, L, &e) == 0, "%s", e.msg);
    ck_assert_msg(L[0] == a && L[1] == b && L[2] == c, "layers %d %d %d, expected %d %d %d",
                  L[0], L[1], L[2], a, b, c);
}

START_TEST(test_layer_id_conventions) {
    Eagle3Head *h;
    RsErr e = {0};
    ck_assert_msg(eagle3_head_load(tu_fixture("eagle3/head"), &h, &e) == 0, "%s", e.msg);
    ck_assert_int_eq(h->cfg.layer_ids, EAGLE3_IDS_AUTO); /* a file does not say */
    Eagle3Head copy = *h;
    int def[3], sg[3];
    eagle3_default_layers(32, def);
    for (int i = 0; i < 3; i++) sg[i] = def[i] - 1; /* what an SGLang-trained head lists */
    /* auto: the default's ids are entering-layer ids, ids one below it output ids */
    memcpy(copy.cfg.feature_layers, def, sizeof def);
    expect_layers(&copy, 32, def[0], def[1], def[2]);
    memcpy(copy.cfg.feature_layers, sg, sizeof sg);
    expect_layers(&copy, 32, def[0], def[1], def[2]);
    /* other ids give nothing away: read as vLLM reads them */
    int odd[3] = {3, 10, 20};
    memcpy(copy.cfg.feature_layers, odd, sizeof odd);
    expect_layers(&copy, 32, 3, 10, 20);
    /* a head that states its convention is read that way */
    copy.cfg.layer_ids = EAGLE3_IDS_OUTPUT;
    expect_layers(&copy, 32, 4, 11, 21);
    /* --eagle3-layer-ids sets the convention (eagle3_head_open_for): it wins over the
     * inference and over what the head states */
    copy.cfg.layer_ids = EAGLE3_IDS_INPUT;
    expect_layers(&copy, 32, 3, 10, 20);
    memcpy(copy.cfg.feature_layers, sg, sizeof sg);
    expect_layers(&copy, 32, sg[0], sg[1], sg[2]);
    copy.cfg.layer_ids = EAGLE3_IDS_OUTPUT;
    memcpy(copy.cfg.feature_layers, odd, sizeof odd);
    expect_layers(&copy, 32, 4, 11, 21);
    /* output ids reach the last layer's output (entering index N), not past it */
    int last[3] = {0, 1, 31};
    memcpy(copy.cfg.feature_layers, last, sizeof last);
    expect_layers(&copy, 32, 1, 2, 32);
    Config t = {.vocab_size = h->cfg.c.vocab_size, .dim = h->cfg.target_hidden, .n_layers = 31};
    int L[3];
    ck_assert_int_eq(eagle3_head_check(&copy, &t, L, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "entering layer 32"), "%s", e.msg);
    /* the option's values; bad ones are refused, naming them, and change nothing */
    Eagle3LayerIds ids = EAGLE3_IDS_OUTPUT;
    ck_assert_int_eq(eagle3_layer_ids_parse("outputs", &ids, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "'outputs'"), "%s", e.msg);
    ck_assert_int_eq(ids, EAGLE3_IDS_OUTPUT);
    ck_assert_int_eq(eagle3_layer_ids_parse("input", &ids, &e), 0);
    ck_assert_int_eq(ids, EAGLE3_IDS_INPUT);
    ck_assert_int_eq(eagle3_layer_ids_parse("auto", &ids, &e), 0);
    ck_assert_int_eq(ids, EAGLE3_IDS_AUTO);
    /* eagle3_head_open_for reads the fixture head's ids (0, 1, 2) the way it is told: as
     * entering-layer ids they fit the 2-layer target, as output ids the last one is past it */
    Model *tm;
    ck_assert_msg(model_load(tu_fixture("eagle3/target"), &tm, &e) == 0, "%s", e.msg);
    Eagle3Head *ho;
    Eagle3Embed em;
    ck_assert_msg(eagle3_head_open_for(tu_fixture("eagle3/head"), tm, EAGLE3_IDS_AUTO, &ho, L,
                                       &em, &e) == 0, "%s", e.msg);
    ck_assert(L[0] == 0 && L[1] == 1 && L[2] == 2);
    eagle3_head_destroy(&ho);
    ck_assert_int_eq(eagle3_head_open_for(tu_fixture("eagle3/head"), tm, EAGLE3_IDS_OUTPUT, &ho,
                                          L, &em, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "entering layer 3"), "%s", e.msg);
    ck_assert_ptr_null(ho);
    model_destroy(&tm);
    eagle3_head_destroy(&h);
}
END_TEST

START_TEST(test_topk_maps_draft_ids) {
    Eagle3Head *h;
    RsErr e = {0};
    ck_assert_msg(eagle3_head_load(tu_fixture("eagle3/head"), &h, &e) == 0, "%s", e.msg);
    int DV = h->cfg.draft_vocab;
    float *row = calloc((size_t)DV, sizeof(float));
    row[DV - 1] = 5.0f;
    row[3] = 4.0f;
    row[7] = 4.0f; /* tie: lower draft id first */
    int ids[3];
    float lq[3];
    eagle3_topk(h, row, 3, ids, lq);
    ck_assert_int_eq(ids[0], h->d2t[DV - 1]);
    ck_assert_int_eq(ids[1], h->d2t[3]);
    ck_assert_int_eq(ids[2], h->d2t[7]);
    ck_assert(ids[0] != DV - 1 || ids[1] != 3); /* the fixture's d2t is not the identity */
    double z = exp(5.0) + 2 * exp(4.0) + (DV - 3);
    ck_assert_float_eq_tol(lq[0], (float)(5.0 - log(z)), 1e-5f);
    free(row);
    eagle3_head_destroy(&h);
}
END_TEST

START_TEST(test_random_presets) {
    Model *m, *t8;
    Eagle3Head *h, *h8;
    RsErr e = {0};
    ck_assert_msg(model_random_load("random:tiny", &m, &e) == 0, "%s", e.msg);
    ck_assert_msg(model_random_materialize(m, &e) == 0, "%s", e.msg);
    ck_assert_msg(eagle3_head_random("random:eagle3-tiny", 1, &h, &e) == 0, "%s", e.msg);
    int L[3];
    ck_assert_msg(eagle3_head_check(h, &m->cfg, L, &e) == 0, "%s", e.msg);
    ck_assert(L[0] == 0 && L[1] == 1 && L[2] == 2);
    uint8_t *seen = calloc((size_t)m->cfg.vocab_size, 1);
    for (int d = 0; d < h->cfg.draft_vocab; d++) {
        ck_assert(h->d2t[d] >= 0 && h->d2t[d] < m->cfg.vocab_size && !seen[h->d2t[d]]);
        seen[h->d2t[d]] = 1;
    }
    free(seen);
    ck_assert_int_ge(h->d2t[h->cfg.draft_vocab - 1], m->cfg.vocab_size / 2); /* spread, not d */
    /* one commit and one expansion run, finite, deterministic across two runners */
    Eagle3Runner *r;
    ck_assert_msg(eagle3_runner_create(h, tu_f32(&m->w.tok_embeddings), 32, 10, &r, &e) == 0, "%s", e.msg);
    int F = 3 * h->cfg.target_hidden, D = h->cfg.c.dim, DV = h->cfg.draft_vocab;
    float *feats = malloc(sizeof(float) * 3 * F), st[64], lg[256], st2[2 * 64], lg2[2 * 256];
    for (int i = 0; i < 3 * F; i++) feats[i] = rs_rand_unit(7, (uint64_t)i);
    int toks[3] = {1, 2, 3}, ids[10];
    ck_assert_msg(eagle3_commit(r, toks, feats, 3, st, lg, &e) == 0, "%s", e.msg);
    eagle3_topk(h, lg, 10, ids, NULL);
    float sin2[2 * 64];
    memcpy(sin2, st, sizeof(float) * D);
    memcpy(sin2 + D, st, sizeof(float) * D);
    int pos[2] = {3, 3}, nt[2] = {ids[0], ids[1]};
    const uint8_t sib[4] = {1, 0, 0, 1}; /* siblings: each sees itself */
    ck_assert_msg(eagle3_expand(r, nt, sin2, pos, sib, 2, lg2, st2, &e) == 0, "%s", e.msg);
    for (int i = 0; i < 2 * DV; i++) ck_assert(isfinite(lg2[i]));
    ck_assert_int_eq(eagle3_n_pending(r), 2);
    /* a too-large expansion and an out-of-vocabulary token are refused, nothing changed */
    ck_assert_int_eq(eagle3_expand(r, nt, sin2, pos, sib, 11, lg2, st2, &e), RS_EINVAL);
    int bad[1] = {m->cfg.vocab_size};
    ck_assert_int_eq(eagle3_commit(r, bad, feats, 1, NULL, NULL, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "token id 512"), "%s", e.msg);
    ck_assert_int_eq(eagle3_n_pending(r), 2);
    ck_assert_int_eq(eagle3_n_committed(r), 3);
    eagle3_runner_destroy(&r);
    free(feats);
    /* the Llama-3.1-8B head's shape, checked against random:llama3-8b without weights */
    ck_assert_msg(model_random_load("random:llama3-8b", &t8, &e) == 0, "%s", e.msg);
    ck_assert_msg(eagle3_head_random("random:eagle3-llama3-8b,seed=3", 0, &h8, &e) == 0, "%s", e.msg);
    ck_assert_ptr_null(h8->arena);
    ck_assert_int_eq(h8->cfg.draft_vocab, 32000);
    ck_assert_int_eq(h8->cfg.c.hidden_dim, 14336);
    ck_assert_msg(eagle3_head_check(h8, &t8->cfg, L, &e) == 0, "%s", e.msg);
    ck_assert(L[0] == 2 && L[1] == 16 && L[2] == 29);
    expect_misfit(h8, &m->cfg, "vocab_size 128256", "512 tokens");
    Eagle3Head *x = (Eagle3Head *)1;
    ck_assert_int_eq(eagle3_head_random("random:eagle3-huge", 0, &x, &e), RS_EINVAL);
    ck_assert_ptr_null(x);
    ck_assert_msg(strstr(e.msg, "eagle3-tiny, eagle3-llama3-8b"), "%s", e.msg);
    ck_assert_int_eq(eagle3_head_random("random:eagle3-tiny,seed=x", 0, &x, &e), RS_EINVAL);
    eagle3_head_destroy(&h8);
    eagle3_head_destroy(&h);
    model_destroy(&t8);
    model_destroy(&m);
}
END_TEST

/* ---- across the protocol (v2) ---- */

/* f32 features as they arrive across the protocol: rounded to bf16 and widened back. */
static void bf16_round(const float *f, float *out, size_t n) {
    uint16_t *b = malloc(n * sizeof *b);
    proto_f32_to_bf16(f, b, n);
    proto_feat_to_f32(PROTO_FEAT_BF16, b, out, n);
    free(b);
}

static void pools_equal(const Pool *a, const Pool *b) {
    ck_assert_int_eq(a->n, b->n);
    for (int i = 0; i < a->n; i++)
        ck_assert_msg(a->token[i] == b->token[i] && a->parent[i] == b->parent[i] &&
                          memcmp(&a->logq[i], &b->logq[i], sizeof(float)) == 0 &&
                          a->depth[i] == b->depth[i],
                      "candidate %d: %d/%d/%g vs %d/%d/%g", i, a->token[i], a->parent[i],
                      (double)a->logq[i], b->token[i], b->parent[i], (double)b->logq[i]);
}

/* One round of drafting (a 6-token prompt with fixed features) on an EAGLE-3 drafter. */
static void grow_fixed(Drafter *d, int F, Pool *p) {
    int tok[6] = {3, 77, 500, 12, 256, 9};
    float *f = malloc(sizeof(float) * 6 * F);
    for (int i = 0; i < 6 * F; i++) f[i] = rs_rand_unit(31, (uint64_t)i);
    RsErr e = {0};
    ck_assert_msg(drafter_grow_begin(d, tok, 6, 1, f, sizeof(float) * 6 * F, &e) == 0, "%s", e.msg);
    ck_assert_msg(drafter_grow_end(d, p, &e) == 0, "%s", e.msg);
    free(f);
}

/* The CPU layer splits each product's rows over its thread pool: the pools a head grows
 * must be the same bits on 1 and 3 threads (rows of 64..256 split 12 ways) and agree with
 * the f32 reference family's within rounding (BackendParams.cpu_kernels "ref": every
 * product in f32 loops) on tokens. */
START_TEST(test_threads_and_family) {
    Model *mat;
    RsErr e = {0};
    ck_assert(backend_model_load(&cpu_backend_ops, "random:tiny,seed=21", NULL, &mat, &e) == 0);
    int F = 3 * mat->cfg.dim;
    Drafter *d1, *d3, *dref;
    Pool *p1 = malloc(sizeof *p1), *p3 = malloc(sizeof *p3), *pr = malloc(sizeof *pr);
    BackendParams one = {.kv_capacity = 256, .threads = 1}, three = {.kv_capacity = 256, .threads = 3};
    ck_assert_msg(drafter_eagle3_open("random:eagle3-tiny", mat, EAGLE3_IDS_AUTO,
                                      NULL, &one, &d1, &e) == 0, "%s", e.msg);
    ck_assert_msg(drafter_eagle3_open("random:eagle3-tiny", mat, EAGLE3_IDS_AUTO,
                                      NULL, &three, &d3, &e) == 0, "%s", e.msg);
    BackendParams ref = {.kv_capacity = 256, .threads = 1, .cpu_kernels = "ref"};
    ck_assert_msg(drafter_eagle3_open("random:eagle3-tiny", mat, EAGLE3_IDS_AUTO,
                                      NULL, &ref, &dref, &e) == 0, "%s", e.msg);
    grow_fixed(d1, F, p1);
    grow_fixed(d3, F, p3);
    grow_fixed(dref, F, pr);
    pools_equal(p1, p3);
    ck_assert_int_eq(p1->n, pr->n);
    int same = 0;
    for (int i = 0; i < p1->n; i++) {
        same += p1->token[i] == pr->token[i];
        ck_assert_msg(fabsf(p1->logq[i] - pr->logq[i]) <= 1e-3f + 1e-4f * fabsf(pr->logq[i]) ||
                          p1->token[i] != pr->token[i],
                      "candidate %d: logq %g vs the reference's %g", i, (double)p1->logq[i],
                      (double)pr->logq[i]);
    }
    ck_assert_msg(same >= p1->n * 9 / 10, "%d of %d candidates as the reference's", same, p1->n);
    drafter_destroy(&d1);
    drafter_destroy(&d3);
    drafter_destroy(&dref);
    free(p1);
    free(p3);
    free(pr);
    model_destroy(&mat);
}
END_TEST

/* Embeddings read a row per token instead of an f32 copy of the target's table: a random
 * target without host weights gives its rows from the generator, bit-identical to the
 * materialised table, so the drafter opened on it grows the same pools; and a quantized
 * (Q8_0) table read in place grows the pools of its dequantized f32 copy. */
START_TEST(test_embeddings_by_row) {
    Model *lazy, *mat;
    RsErr e = {0};
    BackendParams bp = {.kv_capacity = 256, .threads = 1};
    ck_assert(model_load("random:tiny,seed=21", &lazy, &e) == 0);
    ck_assert(backend_model_load(&cpu_backend_ops, "random:tiny,seed=21", NULL, &mat, &e) == 0);
    Eagle3Embed a, b;
    ck_assert_msg(eagle3_embed_of(lazy, &a, &e) == 0, "%s", e.msg);
    ck_assert_msg(eagle3_embed_of(mat, &b, &e) == 0, "%s", e.msg);
    ck_assert(a.table.data == NULL && b.table.data == mat->w.tok_embeddings.data);
    int D = mat->cfg.dim, V = mat->cfg.vocab_size, F = 3 * D;
    float ra[64], rb[64];
    for (int t = 0; t < V; t += 73) {
        eagle3_embed_row(&a, t, ra);
        eagle3_embed_row(&b, t, rb);
        ck_assert_msg(memcmp(ra, rb, sizeof(float) * D) == 0, "row %d differs", t);
    }
    Drafter *d, *dm, *dq, *df;
    Pool *p = malloc(sizeof *p), *pm = malloc(sizeof *pm);
    ck_assert_msg(drafter_eagle3_open("random:eagle3-tiny", lazy, EAGLE3_IDS_AUTO,
                                      NULL, &bp, &d, &e) == 0, "%s", e.msg);
    ck_assert_msg(drafter_eagle3_open("random:eagle3-tiny", mat, EAGLE3_IDS_AUTO,
                                      NULL, &bp, &dm, &e) == 0, "%s", e.msg);
    grow_fixed(d, F, p);
    grow_fixed(dm, F, pm);
    pools_equal(p, pm);
    /* Q8_0 rows (2 blocks of 32: f16 scale 2^-6 = 0x2400, 32 int8) of the same table */
    size_t rb_bytes = 2 * 34;
    uint8_t *q = calloc((size_t)V, rb_bytes);
    const float *src = b.table.data;
    for (int r = 0; r < V; r++)
        for (int k = 0; k < 2; k++) {
            uint8_t *blk = q + r * rb_bytes + k * 34;
            blk[0] = 0x00, blk[1] = 0x24;
            for (int i = 0; i < 32; i++) {
                float v = roundf(src[(size_t)r * D + k * 32 + i] * 64.0f);
                blk[2 + i] = (uint8_t)(int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
            }
        }
    Eagle3Embed qe = {.table = {.type = QT_Q8_0, .data = q, .rows = V, .cols = D, .row_bytes = rb_bytes}};
    float *deq = malloc(sizeof(float) * (size_t)V * D);
    qtensor_dequantize_rows(&qe.table, 0, V, deq);
    ck_assert(memcmp(deq, src, sizeof(float) * D) != 0); /* quantization changed the values */
    Eagle3Head *h;
    int L[3];
    ck_assert(eagle3_head_random("random:eagle3-tiny", 1, &h, &e) == 0);
    ck_assert(eagle3_head_check(h, &mat->cfg, L, &e) == 0);
    ck_assert_msg(drafter_eagle3_create_on(h, &qe, &cpu_backend_ops, &bp, L, &dq, &e) == 0, "%s", e.msg);
    ck_assert(drafter_eagle3_create(h, deq, 256, L, &df, &e) == 0);
    grow_fixed(dq, F, p);
    grow_fixed(df, F, pm);
    pools_equal(p, pm);
    drafter_destroy(&d), drafter_destroy(&dm), drafter_destroy(&dq), drafter_destroy(&df);
    eagle3_head_destroy(&h);
    free(q), free(deq), free(p), free(pm);
    model_destroy(&lazy), model_destroy(&mat);
}
END_TEST

/* An EAGLE-3 drafter served by rootspec-draft's Session, reached through the remote kind:
 * HELLO_OK hands the target the head's feature layers, the f32 features travel as bf16, and
 * the pools equal those of the same head in process given the bf16-rounded features. A
 * target whose HELLO lacks the FEATURES bit is refused by name. */
/* A served drafter that counts the APPEND messages it is given (the chunked variant). */
typedef struct {
    Drafter *inner;
    int appends, append_rows;
} CountAppend;

static int ca_reset(void *c, const int *p, int n, const void *f, size_t fb, RsErr *e) {
    return drafter_reset(((CountAppend *)c)->inner, p, n, f, fb, e);
}
static int ca_grow_begin(void *c, const int *t, int n, const void *f, size_t fb, RsErr *e) {
    return drafter_grow_begin(((CountAppend *)c)->inner, t, n, 0, f, fb, e);
}
static int ca_grow_end(void *c, Pool *out, RsErr *e) {
    return drafter_grow_end(((CountAppend *)c)->inner, out, e);
}
static void ca_destroy(void *c) {
    drafter_destroy(&((CountAppend *)c)->inner);
    free(c);
}
static int ca_append(void *c, const int *t, int n, const void *f, size_t fb, RsErr *e) {
    CountAppend *ca = c;
    ca->appends++;
    ca->append_rows += n;
    return drafter_append(ca->inner, t, n, f, fb, e);
}
static const DrafterOps count_append_ops = {ca_reset, ca_grow_begin, ca_grow_end, ca_destroy,
                                            ca_append, NULL, NULL, NULL};

/* _i = 1: the features' bound per message lowered to 2 rows, so the 6-token RESET travels
 * as RESET + 2 APPENDs and the 3-token commit as APPEND + COMMIT_GROW; the pools must be
 * those of one message each. */
START_TEST(test_eagle3_over_protocol) {
    Model *tm;
    Eagle3Head *h;
    RsErr e = {0};
    ck_assert(model_load(tu_fixture("eagle3/target"), &tm, &e) == 0);
    ck_assert(eagle3_head_load(tu_fixture("eagle3/head"), &h, &e) == 0);
    float *emb = target_embeddings(tu_fixture("eagle3/target"), &tm->cfg);
    int L[EAGLE3_N_FEATURES];
    ck_assert_msg(eagle3_head_check(h, &tm->cfg, L, &e) == 0, "%s", e.msg);
    Drafter *served, *local, *remote;
    ck_assert(drafter_eagle3_create(h, emb, 256, L, &served, &e) == 0);
    ck_assert(drafter_eagle3_create(h, emb, 256, L, &local, &e) == 0);
    CountAppend *ca = calloc(1, sizeof *ca);
    ca->inner = served;
    served = drafter_wrap(&count_append_ops, ca, drafter_info(ca->inner));
    if (_i) remote_set_feat_chunk_bytes(2 * 2 * 3 * (size_t)h->cfg.target_hidden);
    char ep[128];
    snprintf(ep, sizeof ep, "ipc:///tmp/rs-e3-proto-%d.sock", (int)getpid());
    TuServer *st = tu_serve(served, ep, "e3-test");
    ck_assert_msg(drafter_remote_create(ep, tm, 42, 10000, 1, NULL, &remote, &e) == 0, "%s", e.msg);
    const DrafterInfo *ri = drafter_info(remote);
    ck_assert_int_eq(ri->n_feature_layers, 3);
    for (int i = 0; i < 3; i++) ck_assert_int_eq(ri->feature_layers[i], L[i]);
    int F = 3 * h->cfg.target_hidden;
    int toks[12] = {11, 5, 17, 40, 2, 63, 9, 31, 8, 70, 1, 4};
    float *f = malloc(sizeof(float) * 12 * (size_t)F), *fq = malloc(sizeof(float) * 12 * (size_t)F);
    for (size_t i = 0; i < 12 * (size_t)F; i++) f[i] = 2.0f * rs_rand_unit(7, i);
    bf16_round(f, fq, 12 * (size_t)F);
    Pool *pa = malloc(sizeof *pa), *pb = malloc(sizeof *pb);
    ck_assert_msg(drafter_reset(remote, toks, 6, f, sizeof(float) * 6 * F, &e) == 0, "%s", e.msg);
    ck_assert(drafter_reset(local, toks, 6, fq, sizeof(float) * 6 * F, &e) == 0);
    static const int round_at[] = {6, 7, 10, 12};
    for (int r = 0; r + 1 < 4; r++) {
        int a = round_at[r], n = round_at[r + 1] - a;
        size_t off = (size_t)a * F, bytes = sizeof(float) * (size_t)n * F;
        ck_assert_msg(drafter_grow_begin(remote, toks + a, n, 0, f + off, bytes, &e) == 0, "%s", e.msg);
        ck_assert_msg(drafter_grow_end(remote, pa, &e) == 0, "%s", e.msg);
        ck_assert(drafter_grow_begin(local, toks + a, n, 0, fq + off, bytes, &e) == 0);
        ck_assert(drafter_grow_end(local, pb, &e) == 0);
        ck_assert_int_eq(pa->n, POOL_MAX);
        pools_equal(pa, pb);
    }
    ck_assert_int_eq(ca->appends, (_i ? 3 : 0)); /* RESET 2+2+2, commits 1, 2+1, 2 */
    ck_assert_int_eq(ca->append_rows, (_i ? 6 : 0));
    remote_set_feat_chunk_bytes(0);
    /* without features the served head refuses, and the session's context is lost */
    ck_assert(drafter_grow_begin(remote, toks, 1, 0, NULL, 0, &e) == 0);
    ck_assert_int_eq(drafter_grow_end(remote, pa, &e), RS_EPEER);
    ck_assert_msg(strstr(e.msg, "needs 384 bytes of f32 target features"), "%s", e.msg);
    drafter_destroy(&remote);
    /* a HELLO without the FEATURES capability */
    void *zc = zmq_ctx_new(), *s = zmq_socket(zc, ZMQ_DEALER);
    ck_assert(zmq_connect(s, ep) == 0);
    ProtoMsg m = {0}, rep = {0};
    m.type = PROTO_HELLO;
    m.session = 9;
    m.seq = 1;
    m.u.hello.tokenizer_hash = 42;
    m.u.hello.vocab_size = 96;
    m.u.hello.caps = PROTO_CAP_POOL_V1;
    m.u.hello.topk = POOL_TOPK;
    m.u.hello.depth = POOL_MAX_DEPTH;
    m.u.hello.expand = POOL_EXPAND;
    ck_assert(proto_send(s, &m, &e) == 0);
    ck_assert_msg(proto_recv(s, &rep, 5000, &e) == 0, "%s", e.msg);
    ck_assert_int_eq(rep.type, PROTO_ERROR);
    ck_assert_msg(strstr(rep.u.error.message, "needs the target's features (an EAGLE-3 head), "
                                              "target's HELLO capabilities 0x1 lack FEATURES (0x4)"),
                  "%s", rep.u.error.message);
    proto_msg_clear(&rep);
    zmq_close(s);
    zmq_ctx_term(zc);
    ck_assert_int_eq(tu_serve_stop(&st), 0);
    free(f);
    free(fq);
    free(pa);
    free(pb);
    drafter_destroy(&served);
    drafter_destroy(&local);
    free(emb);
    eagle3_head_destroy(&h);
    model_destroy(&tm);
}
END_TEST

/* An older drafter's HELLO_OK (version 1: 5 fields, version 2: 6) fails the target's
 * handshake with a message naming both versions (the other direction, an older HELLO to
 * rootspec-draft, is in test_twoproc). */
typedef struct {
    void *s;
    unsigned version;
} OldDrafter;

static void *old_drafter(void *arg) {
    const OldDrafter *od = arg;
    void *s = od->s;
    uint8_t id[256], req[4096];
    int il = zmq_recv(s, id, sizeof id, 0);
    zmq_recv(s, req, sizeof req, 0);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 6);
    msgpack_pack_str(&pk, 4);
    msgpack_pack_str_body(&pk, "RSPC", 4);
    msgpack_pack_uint32(&pk, od->version);
    msgpack_pack_uint32(&pk, PROTO_HELLO_OK);
    msgpack_pack_uint64(&pk, 0); /* an older reply; session/seq never judged */
    msgpack_pack_uint64(&pk, 1);
    msgpack_pack_array(&pk, od->version == 1 ? 5 : 6);
    msgpack_pack_str(&pk, 0);
    msgpack_pack_uint64(&pk, 42);
    msgpack_pack_uint32(&pk, 96);
    msgpack_pack_uint32(&pk, PROTO_CAP_POOL_V1);
    msgpack_pack_str(&pk, 3);
    msgpack_pack_str_body(&pk, "old", 3);
    if (od->version >= 2) msgpack_pack_array(&pk, 0); /* no feature layers */
    zmq_send(s, id, (size_t)il, ZMQ_SNDMORE);
    zmq_send(s, sb.data, sb.size, 0);
    msgpack_sbuffer_destroy(&sb);
    return NULL;
}

START_TEST(test_old_drafter_refused) {
    static const char *const want[] = {
        NULL, "the peer speaks protocol version 1, this end version 4 (target features",
        "the peer speaks protocol version 2, this end version 4 (the pool width in "
        "COMMIT_GROW, then sequence ids): run the same rootspec release on both ends",
        "the peer speaks protocol version 3, this end version 4 (a sequence id in every frame, "
        "CLOSE): run the same rootspec release on both ends"};
    unsigned version = (unsigned)_i;
    Model *m;
    RsErr e = {0};
    ck_assert(model_load(tu_fixture("eagle3/target"), &m, &e) == 0);
    char ep[128];
    snprintf(ep, sizeof ep, "ipc:///tmp/rs-e3-v%u-%d.sock", version, (int)getpid());
    void *zc = zmq_ctx_new(), *s = zmq_socket(zc, ZMQ_ROUTER);
    ck_assert(zmq_bind(s, ep) == 0);
    pthread_t th;
    OldDrafter od = {s, version};
    ck_assert(pthread_create(&th, NULL, old_drafter, &od) == 0);
    Drafter *d = NULL;
    ck_assert_int_eq(drafter_remote_create(ep, m, 42, 5000, 1, NULL, &d, &e), RS_EUNSUPPORTED);
    ck_assert_msg(strstr(e.msg, want[version]), "%s", e.msg);
    ck_assert_ptr_null(d);
    pthread_join(th, NULL);
    zmq_close(s);
    zmq_ctx_term(zc);
    model_destroy(&m);
}
END_TEST

Suite *suite_eagle3(void) {
    Suite *s = suite_create("eagle3");
    TCase *tc = tcase_create("eagle3");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_parity_target_embeddings);
    tcase_add_test(tc, test_parity_own_embeddings_llama3_rope);
    tcase_add_test(tc, test_grow_pool);
    tcase_add_test(tc, test_drafter_kind);
    tcase_add_test(tc, test_decode_identity_with_eagle3);
    tcase_add_test(tc, test_loader_refusals);
    tcase_add_test(tc, test_config_refusals);
    tcase_add_test(tc, test_fit_to_target);
    tcase_add_test(tc, test_layer_id_conventions);
    tcase_add_test(tc, test_topk_maps_draft_ids);
    tcase_add_test(tc, test_random_presets);
    tcase_add_test(tc, test_embeddings_by_row);
    tcase_add_test(tc, test_threads_and_family);
    tcase_add_loop_test(tc, test_eagle3_over_protocol, 0, 2);
    tcase_add_loop_test(tc, test_old_drafter_refused, 1, 4);
    suite_add_tcase(s, tc);
    return s;
}
