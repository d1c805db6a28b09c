/* The walk down the tree (target_proc/decode.c, exhaustive target sampling) with every row
 * it may visit reduced in one backend_rows_stats call before it starts, as on a device
 * backend (backend_batch_queries), against one call per draw, both on the CPU backend
 * (BackendParams.sw.rows_batched picks the path): the same tokens for every decoder, at
 * T=0 and at T=1 and under a filtered law for a seed, rounds after rounds (so the
 * generator must stand where one call per draw leaves it), the same tau (the measurement
 * reads the statistics the walk's call left), and one call per walk where batched
 * (RoundInfo.walk_queries, counted through BackendStats.rows_stats_calls): a round's calls
 * are then its root pass's, if any, and the walk's. */
#include "draft_proc/model_drafter.h"
#include "target_proc/decode.h"
#include "testutil.h"
#include <math.h>
#include <string.h>

#define N_DEC 4
static const DecoderKind DECODERS[N_DEC] = {DECODER_DRAFT, DECODER_PEARL, DECODER_ROOTDRAW,
                                            DECODER_ROOT};

/* What on_round saw of one decode's walks. */
typedef struct {
    int batched;       /* the target batches its walk's row queries */
    DecoderKind decoder;
    int walks, draws;  /* rounds that walked, draws they made */
    int roots;         /* rounds that ran the root pass */
    int bad;           /* rounds whose walk_queries differ from the path's count */
    uint64_t calls;    /* backend_rows_stats calls of the decodes */
    double tau;        /* sum of the rounds' tau */
} WalkCount;

static void count_round(void *user, const RoundInfo *ri) {
    WalkCount *c = user;
    int walked = !ri->tree_pass_skipped && !ri->fallback_ar && ri->emitted > 0 && ri->tree_size > 0;
    /* pearl and rootdraw emit the accepted X1, root forces it: no draw for it */
    int draws = walked ? ri->emitted - (c->decoder != DECODER_DRAFT) : 0;
    int want = c->batched ? walked : draws;
    if (ri->walk_queries != want) {
        fprintf(stderr, "%s round %d: %d walk queries, want %d (%s path, %d draws)\n",
                decoder_name(c->decoder), ri->round, ri->walk_queries, want,
                c->batched ? "batched" : "per-draw", draws);
        c->bad++;
    }
    c->walks += walked;
    c->draws += draws;
    c->roots += ri->t_root_end > 0;
    if (!isnan(ri->tau)) c->tau += ri->tau;
}

static Target *walk_target(const Model *m, int rows_batched) {
    RsErr e = {0};
    Target *t;
    int eog = -1;
    BackendParams bp = {.kv_capacity = 512, .threads = 1, .sw.rows_batched = rows_batched};
    ck_assert_msg(target_create(m, &cpu_backend_ops, &bp, &eog, 0, &t, &e) == 0, "%s", e.msg);
    return t;
}

static int walk_decode(Target *t, Drafter *d, DecoderKind dk, const Sampling *smp,
                       uint64_t seed, const int *prompt, int n, int *out, WalkCount *c) {
    DecodeOpts opts = {.decoder = dk, .budget = 12, .sampling = *smp, .seed = seed,
                       .max_new = 48};
    DecodeHooks h = {.on_round = count_round, .user = c};
    DecodeResult res = {.tokens = out, .cap = 48 + ROUND_MAX_EMIT};
    RsErr e = {0};
    c->decoder = dk;
    c->batched = backend_batch_queries(target_backend(t));
    uint64_t calls0 = backend_stats(target_backend(t)).rows_stats_calls;
    ck_assert_msg(decode_run(t, d, prompt, n, &opts, &h, &res, &e) == 0, "%s", e.msg);
    c->calls += backend_stats(target_backend(t)).rows_stats_calls - calls0;
    return res.n_tokens;
}

/* drafter 0: an independent random model (shallow walks); 1: the target itself (deep). */
START_TEST(test_walk_batched_identity) {
    RsErr e = {0};
    Model *tm = tu_random_model(ARCH_LLAMA, 32, 64, 2, 4, 2, 64, 4321 + _i);
    Model *dm = _i ? NULL : tu_random_model(ARCH_LLAMA, 32, 64, 1, 4, 2, 64, 99);
    Drafter *d;
    ck_assert_msg(drafter_model_create(_i ? tm : dm, &cpu_backend_ops, TU_BP(512, 1), &d, &e) == 0,
                  "%s", e.msg);
    Target *per_draw = walk_target(tm, -1), *batched = walk_target(tm, 1);
    ck_assert_int_eq(backend_batch_queries(target_backend(per_draw)), 0);
    ck_assert_int_eq(backend_batch_queries(target_backend(batched)), 1);
    const Sampling laws[3] = {SAMPLING_GREEDY, SAMPLING_PLAIN, {0.8, 20, 0.9, 0}};
    WalkCount cp = {0}, cb = {0};
    for (int k = 0; k < N_DEC; k++)
        for (int l = 0; l < 3; l++)
            for (uint64_t seed = 1; seed <= 3; seed++) {
                int prompt[4] = {(int)seed, 7, 20 + l, 40 + k}, a[64], b[64];
                int na = walk_decode(per_draw, d, DECODERS[k], &laws[l], seed, prompt, 4, a, &cp);
                int nb = walk_decode(batched, d, DECODERS[k], &laws[l], seed, prompt, 4, b, &cb);
                ck_assert_int_eq(na, nb);
                for (int i = 0; i < na; i++)
                    ck_assert_msg(a[i] == b[i], "%s law %d seed %d: token %d is %d batched, %d "
                                  "per draw", decoder_name(DECODERS[k]), l, (int)seed, i, b[i], a[i]);
            }
    fprintf(stderr, "walk drafter %d: %d walks, %d draws\n", _i, cb.walks, cb.draws);
    ck_assert_int_eq(cp.bad, 0);
    ck_assert_int_eq(cb.bad, 0);
    ck_assert_int_gt(cb.walks, 50);
    ck_assert_int_gt(cb.draws, cb.walks + 20); /* walks that descend: a per-draw count differs */
    ck_assert_msg(cb.tau == cp.tau, "tau sums %.17g batched, %.17g per draw", cb.tau, cp.tau);
    ck_assert_int_eq(cb.roots, cp.roots);
    ck_assert_msg(cb.calls == (uint64_t)(cb.roots + cb.walks), "batched: %d calls for %d root "
                  "passes and %d walks", (int)cb.calls, cb.roots, cb.walks);
    ck_assert_int_gt(cp.calls, cp.roots + cp.draws); /* and the measurements' own */
    target_destroy(&batched);
    target_destroy(&per_draw);
    drafter_destroy(&d);
    model_destroy(&dm);
    model_destroy(&tm);
}
END_TEST

/* The switch: unset leaves the backend's choice (the CPU: one call per draw). */
START_TEST(test_walk_switch) {
    Model *tm = tu_random_model(ARCH_LLAMA, 32, 64, 1, 4, 2, 64, 5);
    Target *t = walk_target(tm, 0);
    ck_assert_int_eq(backend_batch_queries(target_backend(t)), 0);
    target_destroy(&t);
    model_destroy(&tm);
}
END_TEST

Suite *suite_walk(void) {
    Suite *s = suite_create("walk");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_walk_batched_identity, 0, 2);
    tcase_add_test(tc, test_walk_switch);
    suite_add_tcase(s, tc);
    return s;
}
