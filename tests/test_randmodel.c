/* Random-weight models ("random:PRESET"): presets against the published configurations of
 * the models they imitate, spec errors, the generator's statistics, the tensor walk, host
 * materialisation (deterministic, scales as documented, tied head), and the CPU backend
 * running one (what the GPU pipeline timing relies on: both processes rebuild identical
 * weights from the seed). */
#include "common/randmodel.h"
#include "kernels/backend.h"
#include "testutil.h"
#include <math.h>
#include <string.h>

static Model *load_ok(const char *spec) {
    Model *m = NULL;
    RsErr e = {0};
    ck_assert_msg(model_load(spec, &m, &e) == RS_OK, "%s: %s", spec, e.msg);
    return m;
}

/* Values from the models' Hugging Face config.json files (meta-llama/Llama-3.1-8B,
 * meta-llama/Llama-3.2-1B, HuggingFaceTB/SmolLM2-135M). */
START_TEST(test_random_presets) {
    Model *m = load_ok("random:llama3-8b");
    const Config *c = &m->cfg;
    ck_assert_int_eq(c->dim, 4096);
    ck_assert_int_eq(c->hidden_dim, 14336);
    ck_assert_int_eq(c->n_layers, 32);
    ck_assert_int_eq(c->n_heads, 32);
    ck_assert_int_eq(c->n_kv_heads, 8);
    ck_assert_int_eq(c->head_dim, 128);
    ck_assert_int_eq(c->vocab_size, 128256);
    ck_assert_float_eq(c->rope_theta, 500000.0f);
    ck_assert_int_eq(c->rope_scaling, 1);
    ck_assert_float_eq(c->rope_factor, 8.0f);
    ck_assert_int_eq(c->rope_orig_max_pos, 8192);
    ck_assert_int_eq(c->tied_embeddings, 0);
    ck_assert(m->random_weights && !m->arena && !m->w.layers);
    /* 8.03e9 parameters: Llama-3.1-8B's published count */
    double params = model_weight_bytes(m) / 4.0 + (double)c->vocab_size * c->dim;
    ck_assert_msg(fabs(params - 8.03e9) < 0.01e9, "params %.4g", params);
    model_destroy(&m);

    m = load_ok("random:llama3-1b");
    c = &m->cfg;
    ck_assert_int_eq(c->dim, 2048);
    ck_assert_int_eq(c->hidden_dim, 8192);
    ck_assert_int_eq(c->n_layers, 16);
    ck_assert_int_eq(c->head_dim, 64);
    ck_assert_int_eq(c->vocab_size, 128256);
    ck_assert_float_eq(c->rope_factor, 32.0f);
    ck_assert_int_eq(c->tied_embeddings, 1);
    model_destroy(&m);

    m = load_ok("random:smollm2-135m,seed=4,layers=3,arch=qwen3,tied=0,vocab=1000");
    c = &m->cfg;
    ck_assert_int_eq(c->dim, 576);
    ck_assert_int_eq(c->n_layers, 3);
    ck_assert_int_eq(c->vocab_size, 1000);
    ck_assert_int_eq(c->arch, ARCH_QWEN3);
    ck_assert(c->has_qk_norm && !c->has_qkv_bias && !c->tied_embeddings);
    ck_assert_uint_eq(m->random_seed, 4);
    model_destroy(&m);
}
END_TEST

START_TEST(test_random_spec_errors) {
    struct {
        const char *spec, *want;
    } bad[] = {
        {"random:", "presets: llama3-8b"},
        {"random:gpt5", "unknown preset 'gpt5'"},
        {"random:tiny,seed", "expected key=value"},
        {"random:tiny,seed=-1", "seed=-1"},
        {"random:tiny,seed=12x", "seed=12x"},
        {"random:tiny,layers=0", "layers=0 is not an integer in 1..1024"},
        {"random:tiny,vocab=1", "vocab=1"},
        {"random:tiny,tied=2", "tied=2"},
        {"random:tiny,arch=gpt2", "arch=gpt2"},
        {"random:tiny,depth=3", "unknown key 'depth'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        Model *m = NULL;
        RsErr e = {0};
        ck_assert_int_eq(model_load(bad[i].spec, &m, &e), RS_EINVAL);
        ck_assert_ptr_null(m);
        ck_assert_msg(strstr(e.msg, bad[i].want), "%s: message '%s' lacks '%s'", bad[i].spec,
                      e.msg, bad[i].want);
    }
}
END_TEST

/* Uniform on (-sqrt3, sqrt3): mean 0, variance 1, fourth moment 9/5; neighbouring indices
 * and neighbouring seeds uncorrelated. */
START_TEST(test_random_generator_stats) {
    const int n = 200000;
    double s1 = 0, s2 = 0, s4 = 0, cross = 0, cseed = 0, lim = sqrt(3.0);
    for (int i = 0; i < n; i++) {
        double x = rs_rand_unit(77, (uint64_t)i), y = rs_rand_unit(77, (uint64_t)i + 1);
        double z = rs_rand_unit(78, (uint64_t)i);
        ck_assert(x > -lim - 1e-6 && x < lim + 1e-6);
        s1 += x, s2 += x * x, s4 += x * x * x * x, cross += x * y, cseed += x * z;
    }
    double se = 1.0 / sqrt(n);
    ck_assert_msg(fabs(s1 / n) < 5 * se, "mean %g", s1 / n);
    ck_assert_msg(fabs(s2 / n - 1.0) < 5 * se * sqrt(0.8), "variance %g", s2 / n);
    ck_assert_msg(fabs(s4 / n - 1.8) < 0.03, "fourth moment %g", s4 / n);
    ck_assert_msg(fabs(cross / n) < 5 * se, "lag-1 correlation %g", cross / n);
    ck_assert_msg(fabs(cseed / n) < 5 * se, "seed-to-seed correlation %g", cseed / n);
    ck_assert(rs_rand_unit(1, 5) == rs_rand_unit(1, 5));
}
END_TEST

typedef struct {
    int n;
    uint64_t seeds[64];
    size_t total;
} WalkLog;
static void log_tensor(void *u, const RandTensor *t) {
    WalkLog *w = u;
    if (w->n < 64) w->seeds[w->n] = t->seed;
    w->n++;
    w->total += t->n;
}

START_TEST(test_random_materialize) {
    Model *m = load_ok("random:tiny,arch=qwen2,seed=3");
    WalkLog w = {0};
    model_random_walk(&m->cfg, m->random_seed, log_tensor, &w);
    /* 2 layers x (7 matrices + 2 norms + 3 biases) + embeddings + head + final norm */
    ck_assert_int_eq(w.n, 2 * 12 + 3);
    for (int i = 0; i < w.n; i++)
        for (int j = 0; j < i; j++) ck_assert(w.seeds[i] != w.seeds[j]);
    RsErr e = {0};
    ck_assert_int_eq(model_random_materialize(m, &e), RS_OK);
    ck_assert_uint_eq(m->arena_floats, w.total);
    const Config *c = &m->cfg;
    /* documented scales: wq ~ U with std 1/sqrt(dim), norms 1 + 0.1 U, biases 0.1 U */
    double s2 = 0, nm = 0;
    size_t nq = (size_t)c->n_heads * c->head_dim * c->dim;
    ck_assert_int_eq(m->w.layers[1].wq.type, 0); /* QT_F32 */
    const float *wq = m->w.layers[1].wq.data;
    for (size_t i = 0; i < nq; i++) s2 += (double)wq[i] * wq[i];
    double want = 1.0 / c->dim;
    ck_assert_msg(fabs(s2 / nq - want) < 0.1 * want, "wq variance %g want %g", s2 / nq, want);
    for (int i = 0; i < c->dim; i++) {
        nm += m->w.layers[0].attn_norm[i];
        ck_assert(fabsf(m->w.layers[0].attn_norm[i] - 1.0f) <= 0.1f * 1.7320509f);
    }
    ck_assert_msg(fabs(nm / c->dim - 1.0) < 0.05, "attn_norm mean %g", nm / c->dim);
    ck_assert_ptr_nonnull(m->w.layers[0].bq);
    ck_assert_ptr_null(m->w.layers[0].q_norm);
    ck_assert(m->w.wcls.data != m->w.tok_embeddings.data);
    /* a second load rebuilds the same weights bit for bit (what two processes rely on) */
    Model *m2 = load_ok("random:tiny,arch=qwen2,seed=3");
    ck_assert_int_eq(model_random_materialize(m2, &e), RS_OK);
    ck_assert(memcmp(m->arena, m2->arena, m->arena_floats * sizeof(float)) == 0);
    ck_assert_str_eq(m->fingerprint, m2->fingerprint);
    model_destroy(&m2);
    m2 = load_ok("random:tiny,arch=qwen2,seed=4");
    ck_assert_int_eq(model_random_materialize(m2, &e), RS_OK);
    ck_assert(memcmp(m->arena, m2->arena, m->arena_floats * sizeof(float)) != 0);
    ck_assert_str_ne(m->fingerprint, m2->fingerprint);
    model_destroy(&m2);
    model_destroy(&m);

    m = load_ok("random:tiny,tied=1");
    ck_assert_int_eq(model_random_materialize(m, &e), RS_OK);
    ck_assert_ptr_eq(m->w.wcls.data, m->w.tok_embeddings.data);
    ck_assert_uint_eq(m->arena_floats,
                      w.total - 2 * (size_t)(64 + 2 * 32) - (size_t)512 * 64); /* no head, no biases */
    model_destroy(&m);
}
END_TEST

START_TEST(test_random_refusals) {
    Model *m = load_ok("random:llama3-8b"), *v = NULL;
    RsErr e = {0};
    ck_assert_int_eq(model_random_materialize(m, &e), RS_ENOMEM);
    ck_assert_msg(strstr(e.msg, "29.9 GiB") && strstr(e.msg, "--backend cuda"), "%s", e.msg);
    ck_assert_ptr_null(m->arena);
    ck_assert_int_eq(model_layer_view(m, "0-3", &v, &e), RS_EUNSUPPORTED);
    ck_assert_msg(strstr(e.msg, "--draft-model random:"), "%s", e.msg);
    /* the CPU backend refuses a random model without host weights instead of crashing */
    Backend *b = NULL;
    BackendParams bp = {.kv_capacity = 64, .max_batch = 8, .max_pending = 8, .threads = 1};
    ck_assert_int_eq(backend_create(&cpu_backend_ops, m, &bp, &b, &e), RS_EINVAL);
    ck_assert_ptr_null(b);
    model_destroy(&m);
    ck_assert_int_eq(backend_model_load(&cpu_backend_ops, "random:llama3-8b", NULL,
                                        &m, &e), RS_ENOMEM);
    ck_assert_ptr_null(m);
}
END_TEST

/* backend_model_load gives the CPU backend host weights; a layer view of them works; the
 * forward is finite and the head's logits have the spread the 3/sqrt(dim) scale promises. */
START_TEST(test_random_cpu_forward) {
    Model *m = NULL, *v = NULL;
    RsErr e = {0};
    ck_assert_int_eq(backend_model_load(&cpu_backend_ops, "random:tiny,seed=2", NULL,
                                        &m, &e), RS_OK);
    ck_assert_ptr_nonnull(m->arena);
    ck_assert_int_eq(model_layer_view(m, "1", &v, &e), RS_OK);
    const Model *ms[2] = {m, v};
    for (int k = 0; k < 2; k++) {
        Backend *b = NULL;
        BackendParams bp = {.kv_capacity = 64, .max_batch = 8, .max_pending = 8, .threads = 1};
        ck_assert_int_eq(backend_create(&cpu_backend_ops, ms[k], &bp, &b, &e), RS_OK);
        int tok[4] = {1, 200, 33, 511}, pos[4] = {0, 1, 2, 3}, rows[1] = {3};
        int V = m->cfg.vocab_size;
        float *lg = malloc(sizeof(float) * V);
        ck_assert_int_eq(backend_forward(b, tok, pos, 4, NULL, rows, 1, lg, &e), RS_OK);
        double s = 0, s2 = 0;
        for (int i = 0; i < V; i++) {
            ck_assert(isfinite(lg[i]));
            s += lg[i], s2 += (double)lg[i] * lg[i];
        }
        double sd = sqrt(s2 / V - (s / V) * (s / V));
        ck_assert_msg(sd > 0.5 && sd < 20, "logit spread %g", sd);
        free(lg);
        backend_destroy(&b);
    }
    model_destroy(&v);
    model_destroy(&m);
}
END_TEST

Suite *suite_randmodel(void) {
    Suite *s = suite_create("randmodel");
    TCase *tc = tcase_create("randmodel");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_random_presets);
    tcase_add_test(tc, test_random_spec_errors);
    tcase_add_test(tc, test_random_generator_stats);
    tcase_add_test(tc, test_random_materialize);
    tcase_add_test(tc, test_random_refusals);
    tcase_add_test(tc, test_random_cpu_forward);
    suite_add_tcase(s, tc);
    return s;
}
