/* The two-process pipeline, end to end with the real binaries: T=0 token identity with AR
 * across the process boundary for every decoder, and the process faults (drafter
 * unreachable, killed or stalled mid-decode, target killed, garbage frames, wrong protocol
 * version, wrong vocabulary). Uses the tiny golden Llama (HF directory with tokenizer.json)
 * with a layer-0 self-drafter (its greedy output is varied; tiny llama's repeats one id), so each run takes well under a second. */
#include "draft_proc/model_drafter.h"
#include "target_proc/engine.h"
#include "target_proc/engine_cli.h"
#include "kernels/cpu/cpu_backend.h"
#include "draft_proc/remote_drafter.h"
#include "proto/proto.h"
#include "testutil.h"
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#define TINY "tests/fixtures/golden/llama3_rope"
#define PROMPT "10,20,30,40,50,60" /* its greedy continuation does not repeat early */

static char g_dir[256];

static void make_dir(void) { tu_dir_make(g_dir, sizeof g_dir, "rs-2p"); }

static void endpoint(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "ipc://%s/%s.sock", g_dir, name);
}

static pid_t spawn_to(char *const argv[], const char *tag, const char *out_path, int group) {
    return tu_spawn(g_dir, argv, tag, out_path, group, 0);
}
static pid_t spawn(char *const argv[], const char *tag) { return spawn_to(argv, tag, NULL, 0); }
static char *slurp(const char *tag, const char *ext) { return tu_slurp(g_dir, tag, ext); }
#define wait_exit tu_wait_exit

/* rootspec-draft on `model` (with --draft-layers when layers != NULL), once bound. */
static pid_t start_drafter_on(const char *ep, const char *model, const char *layers) {
    char *argv[] = {"build/rootspec-draft", "--bind", (char *)ep, "--model", (char *)model,
                    layers ? "--draft-layers" : NULL, (char *)layers, NULL};
    pid_t pid = spawn(argv, "draft");
    const char *path = ep + strlen("ipc://");
    for (int t = 0; t < 10000; t += 10) { /* wait for the socket file */
        if (access(path, F_OK) == 0) return pid;
        usleep(10000);
    }
    kill(pid, SIGKILL);
    ck_abort_msg("drafter did not bind %s", ep);
    return -1;
}

static pid_t start_drafter(const char *ep) { return start_drafter_on(ep, TINY, "0"); }

/* rootspec-draft serving the suffix kind (the model lends its vocabulary). */
static pid_t start_suffix_drafter(const char *ep) {
    char *argv[] = {"build/rootspec-draft", "--bind", (char *)ep, "--model", TINY,
                    "--drafter", "suffix", NULL};
    pid_t pid = spawn(argv, "draft-suffix");
    for (int t = 0; t < 10000 && access(ep + strlen("ipc://"), F_OK); t += 10) usleep(10000);
    return pid;
}

static void stop(pid_t pid) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* Runs rootspec-target to completion; returns exit code; tag names its output files. */
static int run_target(const char *tag, const char *decoder, const char *ep, int max_new,
                      const char *timeout_ms, pid_t *pid_out) {
    char mn[16];
    snprintf(mn, sizeof mn, "%d", max_new);
    char *argv[24];
    int k = 0;
    argv[k++] = "build/rootspec-target";
    argv[k++] = "--model";
    argv[k++] = TINY;
    argv[k++] = "--prompt-ids";
    argv[k++] = PROMPT;
    argv[k++] = "--decoder";
    argv[k++] = (char *)decoder;
    argv[k++] = "--max-new";
    argv[k++] = mn;
    argv[k++] = "--output-ids";
    argv[k++] = "--budget";
    argv[k++] = "8";
    if (ep) {
        argv[k++] = "--draft-endpoint";
        argv[k++] = (char *)ep;
        argv[k++] = "--draft-timeout-ms";
        argv[k++] = (char *)(timeout_ms ? timeout_ms : "5000");
    }
    argv[k] = NULL;
    pid_t pid = spawn(argv, tag);
    if (pid_out) {
        *pid_out = pid;
        return 0;
    }
    return wait_exit(pid, 60000);
}

/* 1 if `got` (space-separated ids) is a prefix of `ref` with at least min_ids ids (AR runs
 * longer than the decode it checks). */
static int ids_prefix(const char *got, const char *ref, int min_ids) {
    size_t n = strcspn(got, "\n");
    if (strncmp(got, ref, n) != 0 || (ref[n] != ' ' && ref[n] != '\n')) return 0;
    int k = 0, in = 0;
    for (size_t i = 0; i < n; i++) {
        int d = got[i] >= '0' && got[i] <= '9';
        k += d && !in;
        in = d;
    }
    return k >= min_ids;
}

/* Number of emitted ids written so far to tag.out */
static int count_ids(const char *tag) {
    char *s = slurp(tag, "out");
    int n = 0, in = 0;
    for (char *p = s; *p; p++) {
        int d = *p >= '0' && *p <= '9';
        n += d && !in;
        in = d;
    }
    free(s);
    return n;
}

START_TEST(test_identity_across_processes) {
    make_dir();
    char ep[300];
    endpoint(ep, sizeof ep, "d");
    pid_t d = start_drafter(ep);
    ck_assert_int_eq(run_target("ar", "ar", NULL, 120, NULL, NULL), 0);
    char *ref = slurp("ar", "out");
    ck_assert_msg(strlen(ref) > 10, "AR printed no ids: '%s'", ref);
    const char *decs[] = {"draft", "pearl", "rootdraw", "root"};
    for (int i = 0; i < 4; i++) {
        int rc = run_target(decs[i], decs[i], ep, 40, NULL, NULL);
        char *err = slurp(decs[i], "err");
        ck_assert_msg(rc == 0, "%s exited %d: %s", decs[i], rc, err);
        ck_assert_msg(!strstr(err, "drafter failed"), "%s: drafter failed: %s", decs[i], err);
        char *got = slurp(decs[i], "out");
        ck_assert_msg(ids_prefix(got, ref, 40), "%s over ZeroMQ:\n%s\nAR:\n%s", decs[i], got, ref);
        /* --max-new is exact across processes too: AR's first 40 ids, not a round more */
        ck_assert_msg(count_ids(decs[i]) == 40, "%s printed %d ids under --max-new 40", decs[i],
                      count_ids(decs[i]));
        free(got);
        free(err);
    }
    free(ref);
    stop(d);
}
END_TEST

/* Once decode "rd" (drafter d, reply timeout 700 ms) has emitted, sends sig to the drafter
 * and checks that the target t finishes with exit 0, reports the fallback, and keeps AR's
 * ids ("ar", T=0) for the first n; returns the ids "rd" printed. */
static int fault_mid_decode(pid_t d, pid_t t, int sig, int n) {
    for (int w = 0; w < 20000 && count_ids("rd") < 3; w += 5) usleep(5000);
    ck_assert_msg(count_ids("rd") >= 3, "target emitted nothing");
    kill(d, sig);
    int rc = wait_exit(t, 60000);
    char *err = slurp("rd", "err"), *got = slurp("rd", "out"), *ref = slurp("ar", "out");
    ck_assert_msg(rc == 0, "target exited %d: %s", rc, err);
    ck_assert_msg(strstr(err, "drafter failed") && strstr(err, "did not answer within 700 ms"),
                  "no fallback event in: %s", err);
    ck_assert_msg(ids_prefix(got, ref, n), "ids after the fault differ from AR:\n%s\nvs\n%s",
                  got, ref);
    free(err);
    free(got);
    free(ref);
    return count_ids("rd");
}

/* kill -9 (i = 0) or SIGSTOP (i = 1) of the drafter mid-decode: the target finishes
 * autoregressively, keeps every token (T=0: same ids as AR) and reports the event. */
START_TEST(test_drafter_dies_mid_decode) {
    make_dir();
    char ep[300];
    endpoint(ep, sizeof ep, "d");
    pid_t d = start_drafter(ep);
    const int N = 600;
    ck_assert_int_eq(run_target("ar", "ar", NULL, N + 80, NULL, NULL), 0);
    pid_t t;
    run_target("rd", "rootdraw", ep, N, "700", &t);
    ck_assert_msg(fault_mid_decode(d, t, _i == 0 ? SIGKILL : SIGSTOP, N) < N + 20,
                  "too many ids");
    if (_i == 1) kill(d, SIGCONT);
    stop(d);
}
END_TEST

START_TEST(test_drafter_unreachable) {
    make_dir();
    char ep[300];
    endpoint(ep, sizeof ep, "nobody");
    uint64_t t0 = rs_now_ns();
    int rc = run_target("t", "rootdraw", ep, 10, "800", NULL);
    double s = (rs_now_ns() - t0) * 1e-9;
    char *err = slurp("t", "err");
    /* as when the drafter fails mid-decode: AR with a warning */
    ck_assert_msg(rc == 0, "target without a drafter: exit %d: %s", rc, err);
    ck_assert_msg(strstr(err, "no answer: wrong server key or no drafter at") &&
                      strstr(err, "HELLO unanswered for 800 ms"),
                  "message: %s", err);
    ck_assert_msg(s < 20, "took %.1f s", s);
    free(err);
}
END_TEST

START_TEST(test_target_dies_drafter_recovers) {
    make_dir();
    char ep[300];
    endpoint(ep, sizeof ep, "d");
    pid_t d = start_drafter(ep);
    ck_assert_int_eq(run_target("ar", "ar", NULL, 140, NULL, NULL), 0);
    pid_t t;
    run_target("t1", "draft", ep, 2000, NULL, &t);
    for (int w = 0; w < 20000 && count_ids("t1") < 3; w += 5) usleep(5000);
    stop(t); /* kill -9 the target mid-decode */
    ck_assert_int_eq(run_target("t2", "draft", ep, 60, NULL, NULL), 0);
    char *got = slurp("t2", "out"), *ref = slurp("ar", "out"), *err = slurp("t2", "err");
    ck_assert_msg(!strstr(err, "drafter failed"), "drafter did not recover: %s", err);
    ck_assert_msg(ids_prefix(got, ref, 60), "after recovery:\n%s\nvs AR\n%s", got, ref);
    free(got);
    free(ref);
    free(err);
    ck_assert_msg(kill(d, 0) == 0, "drafter died");
    stop(d);
}
END_TEST

/* Raw frames to the drafter: each must get an ERROR naming the problem, and the drafter must
 * still serve a proper HELLO afterwards. */
static void send_raw(void *s, const void *buf, size_t n) { ck_assert(zmq_send(s, buf, n, 0) >= 0); }

static void expect_error(void *s, const char *needle) {
    ProtoMsg m = {0};
    RsErr e = {0};
    int rc = proto_recv(s, &m, 5000, &e);
    ck_assert_msg(rc == 0, "no reply: %s", e.msg);
    ck_assert_msg(m.type == PROTO_ERROR, "reply is %s, expected ERROR", proto_type_name(m.type));
    ck_assert_msg(strstr(m.u.error.message, needle), "ERROR '%s' lacks '%s'", m.u.error.message,
                  needle);
    proto_msg_clear(&m);
}

static void encode_hello(msgpack_sbuffer *sb, uint32_t vocab, uint64_t hash) {
    ProtoMsg m = {0};
    m.type = PROTO_HELLO;
    m.session = 7;
    m.seq = 1;
    snprintf(m.u.hello.fingerprint, sizeof m.u.hello.fingerprint, "test");
    m.u.hello.tokenizer_hash = hash;
    m.u.hello.vocab_size = vocab;
    m.u.hello.caps = PROTO_CAP_POOL_V1;
    m.u.hello.topk = POOL_TOPK;
    m.u.hello.depth = POOL_MAX_DEPTH;
    m.u.hello.expand = POOL_EXPAND;
    RsErr e;
    msgpack_sbuffer_clear(sb);
    ck_assert(proto_encode(&m, sb, &e) == 0);
}

START_TEST(test_bad_frames_to_drafter) {
    make_dir();
    char ep[300];
    endpoint(ep, sizeof ep, "d");
    pid_t d = start_drafter(ep);
    void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    ck_assert(zmq_connect(s, ep) == 0);
    send_raw(s, "\xc1\xc1garbage", 9);
    expect_error(s, "proto");
    send_raw(s, "", 0);
    expect_error(s, "proto");
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    /* wrong protocol version: patch the version byte after the magic */
    encode_hello(&sb, 258, 0);
    char *v = memchr(sb.data, PROTO_VERSION, sb.size);
    ck_assert(v && (size_t)(v - sb.data) == 6); /* array header + fixstr "RSPC" */
    *v = 1; /* an older target's HELLO: refused naming both versions */
    send_raw(s, sb.data, sb.size);
    expect_error(s, "the peer speaks protocol version 1, this end version 4 (target features");
    *v = 2;
    send_raw(s, sb.data, sb.size);
    expect_error(s, "the peer speaks protocol version 2, this end version 4 (the pool width in "
                    "COMMIT_GROW, then sequence ids): run the same rootspec release on both ends");
    *v = 3; /* a target without sequence ids */
    send_raw(s, sb.data, sb.size);
    expect_error(s, "the peer speaks protocol version 3, this end version 4 (a sequence id in "
                    "every frame, CLOSE): run the same rootspec release on both ends");
    *v = 5;
    send_raw(s, sb.data, sb.size);
    expect_error(s, "protocol version 5, expected 4");
    /* wrong vocabulary */
    encode_hello(&sb, 999, 0);
    send_raw(s, sb.data, sb.size);
    expect_error(s, "target vocab 999");
    /* wrong tokenizer, right vocabulary size */
    encode_hello(&sb, 258, 0x1234);
    send_raw(s, sb.data, sb.size);
    expect_error(s, "tokenizer mismatch");
    /* COMMIT_GROW outside a session */
    ProtoMsg cg = {0};
    int32_t toks[2] = {1, 2};
    cg.type = PROTO_COMMIT_GROW;
    cg.u.tokens.ids = toks;
    cg.u.tokens.n = 2;
    RsErr e;
    ck_assert(proto_send(s, &cg, &e) == 0);
    expect_error(s, "no session");
    /* multi-part frame */
    zmq_send(s, "a", 1, ZMQ_SNDMORE);
    zmq_send(s, "b", 1, 0);
    expect_error(s, "multi-part");
    msgpack_sbuffer_destroy(&sb);
    zmq_close(s);
    zmq_ctx_term(ctx);
    /* still serving: a real target decodes through it */
    ck_assert_int_eq(run_target("ar", "ar", NULL, 100, NULL, NULL), 0);
    ck_assert_int_eq(run_target("t", "rootdraw", ep, 20, NULL, NULL), 0);
    char *got = slurp("t", "out"), *ref = slurp("ar", "out");
    ck_assert_msg(ids_prefix(got, ref, 20), "%s\nvs AR\n%s", got, ref);
    free(got);
    free(ref);
    stop(d);
}
END_TEST

/* One request over a raw DEALER; returns the reply (caller clears it). */
static void request(void *s, ProtoMsg *req, uint64_t seq, ProtoType want, ProtoMsg *rep,
                    Pool *into) {
    RsErr e = {0};
    req->session = 7;
    req->seq = seq;
    ck_assert_msg(proto_send(s, req, &e) == 0, "%s", e.msg);
    if (want == PROTO_NONE) return;
    rep->pool_into = into;
    int rc = proto_recv(s, rep, 10000, &e);
    ck_assert_msg(rc == 0, "seq %llu: no reply: %s", (unsigned long long)seq, e.msg);
    ck_assert_msg(rep->type == want, "seq %llu: reply %s (%s), expected %s",
                  (unsigned long long)seq, proto_type_name(rep->type),
                  rep->type == PROTO_ERROR ? rep->u.error.message : "", proto_type_name(want));
    ck_assert_uint_eq(rep->seq, seq);
}

/* A token message (RESET, COMMIT_GROW) of ids[0..n) as request `seq`, answered by `want`. */
static void send_tokens(void *s, ProtoType type, const int32_t *ids, int n, uint64_t seq,
                        ProtoType want, ProtoMsg *rep, Pool *into) {
    ProtoMsg m = {.type = type, .u.tokens = {.ids = ids, .n = n}};
    request(s, &m, seq, want, rep, into);
}

/* The same, refused: an ERROR whose message contains `why`. */
static void expect_refusal(void *s, ProtoType type, const int32_t *ids, int n, uint64_t seq,
                           ProtoMsg *rep, const char *why) {
    send_tokens(s, type, ids, n, seq, PROTO_ERROR, rep, NULL);
    ck_assert_msg(strstr(rep->u.error.message, why), "seq %llu: '%s' lacks '%s'",
                  (unsigned long long)seq, rep->u.error.message, why);
}

/* The drafter's context follows the target's through RESET (which prefills its tokens) and
 * COMMIT_GROW; after a request fails it can no longer match, so COMMIT_GROW is refused
 * until RESET (it used to grow silently over a context missing the failed tokens, and
 * RESET's tokens were ignored). */
START_TEST(test_drafter_context_after_errors) {
    make_dir();
    char ep[300];
    endpoint(ep, sizeof ep, "d");
    char *argv[] = {"build/rootspec-draft", "--bind", ep, "--model", TINY, "--draft-layers", "0",
                    "--ctx", "256", NULL};
    pid_t d = spawn(argv, "draft");
    for (int t = 0; t < 10000 && access(ep + 6, F_OK) != 0; t += 10) usleep(10000);
    void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    ck_assert(zmq_connect(s, ep) == 0);
    /* HELLO with the drafter's tokenizer hash, read from its refusal of hash 0 */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    encode_hello(&sb, 258, 0);
    send_raw(s, sb.data, sb.size);
    ProtoMsg rep = {0};
    RsErr e = {0};
    ck_assert_msg(proto_recv(s, &rep, 10000, &e) == 0, "%s", e.msg);
    ck_assert_int_eq(rep.type, PROTO_ERROR);
    const char *h = strstr(rep.u.error.message, "drafter vocab 258 (tokenizer ");
    ck_assert_msg(h, "%s", rep.u.error.message);
    uint64_t hash = strtoull(h + strlen("drafter vocab 258 (tokenizer "), NULL, 16);
    encode_hello(&sb, 258, hash);
    send_raw(s, sb.data, sb.size);
    ck_assert_msg(proto_recv(s, &rep, 10000, &e) == 0, "%s", e.msg);
    ck_assert_msg(rep.type == PROTO_HELLO_OK, "%s", proto_type_name(rep.type));
    ck_assert_uint_eq(rep.u.hello_ok.caps, PROTO_CAP_POOL_V1); /* a CPU drafter: no CUDA bit */
    msgpack_sbuffer_destroy(&sb);

    static Pool a, b;
    static int32_t many[250];
    for (int i = 0; i < 250; i++) many[i] = (int32_t)(1 + i % 200);
    const int32_t prompt[] = {10, 20, 30, 40, 50}, cont[] = {60},
                  whole[] = {10, 20, 30, 40, 50, 60}, one[] = {1}, bad[] = {300};
    uint64_t seq = 10;
    /* 1. a COMMIT_GROW the KV cache cannot hold (200 + 70 tree entries > 256) */
    send_tokens(s, PROTO_RESET, NULL, 0, seq++, PROTO_NONE, &rep, NULL);
    expect_refusal(s, PROTO_COMMIT_GROW, many, 200, seq++, &rep, "KV cache full");
    expect_refusal(s, PROTO_COMMIT_GROW, one, 1, seq++, &rep,
                   "context lost (COMMIT_GROW seq 11 failed)");
    /* 2. RESET prefills: RESET [prompt] + COMMIT_GROW [60] grows the pool of
     * RESET [] + COMMIT_GROW [prompt, 60] */
    send_tokens(s, PROTO_RESET, prompt, 5, seq++, PROTO_NONE, &rep, NULL);
    send_tokens(s, PROTO_COMMIT_GROW, cont, 1, seq++, PROTO_POOL, &rep, &a);
    send_tokens(s, PROTO_RESET, NULL, 0, seq++, PROTO_NONE, &rep, NULL);
    send_tokens(s, PROTO_COMMIT_GROW, whole, 6, seq++, PROTO_POOL, &rep, &b);
    ck_assert_int_eq(a.n, POOL_MAX);
    ck_assert_int_eq(b.n, POOL_MAX);
    for (int i = 0; i < POOL_MAX; i++) {
        ck_assert_msg(a.token[i] == b.token[i] && a.parent[i] == b.parent[i],
                      "candidate %d: token %d vs %d", i, a.token[i], b.token[i]);
        ck_assert_msg(fabsf(a.logq[i] - b.logq[i]) < 1e-4f, "candidate %d: log q %g vs %g", i,
                      a.logq[i], b.logq[i]);
    }
    /* 3. a RESET whose prompt does not fit answers ERROR, and the context stays lost */
    expect_refusal(s, PROTO_RESET, many, 250, seq++, &rep, "KV cache full");
    expect_refusal(s, PROTO_COMMIT_GROW, one, 1, seq++, &rep, "context lost (RESET seq");
    /* 4. a COMMIT_GROW of the session the decoder rejects (token outside the vocabulary) */
    send_tokens(s, PROTO_RESET, prompt, 5, seq++, PROTO_NONE, &rep, NULL);
    expect_refusal(s, PROTO_COMMIT_GROW, bad, 1, seq++, &rep, "tokens[0] is 300");
    expect_refusal(s, PROTO_COMMIT_GROW, one, 1, seq++, &rep,
                   "context lost (a frame was rejected");
    /* RESET starts over */
    send_tokens(s, PROTO_RESET, prompt, 5, seq++, PROTO_NONE, &rep, NULL);
    send_tokens(s, PROTO_COMMIT_GROW, cont, 1, seq++, PROTO_POOL, &rep, &b);
    ck_assert_int_eq(b.n, POOL_MAX);
    ck_assert(memcmp(a.token, b.token, sizeof a.token) == 0);
    proto_msg_clear(&rep);
    zmq_close(s);
    zmq_ctx_term(ctx);
    ck_assert_msg(kill(d, 0) == 0, "drafter died");
    stop(d);
}
END_TEST

/* A frame over PROTO_FRAME_MAX is dropped by libzmq before the drafter buffers it (the peer
 * is disconnected, no reply); the drafter goes on serving. */
START_TEST(test_oversized_frame_dropped) {
    make_dir();
    char ep[300];
    endpoint(ep, sizeof ep, "d");
    pid_t d = start_drafter(ep);
    void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    ck_assert(zmq_connect(s, ep) == 0);
    size_t big = (size_t)PROTO_FRAME_MAX + 1;
    char *buf = calloc(1, big);
    send_raw(s, buf, big);
    free(buf);
    ProtoMsg m = {0};
    RsErr e = {0};
    int rc = proto_recv(s, &m, 1500, &e);
    ck_assert_msg(rc == RS_ETIMEOUT, "a %zu-byte frame was answered (rc %d, %s: %s)", big, rc,
                  proto_type_name(m.type), m.type == PROTO_ERROR ? m.u.error.message : e.msg);
    zmq_close(s);
    s = zmq_socket(ctx, ZMQ_DEALER);
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    ck_assert(zmq_connect(s, ep) == 0);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    encode_hello(&sb, 999, 0);
    send_raw(s, sb.data, sb.size);
    expect_error(s, "target vocab 999");
    msgpack_sbuffer_destroy(&sb);
    proto_msg_clear(&m);
    zmq_close(s);
    zmq_ctx_term(ctx);
    ck_assert_msg(kill(d, 0) == 0, "drafter died");
    stop(d);
}
END_TEST

START_TEST(test_tokenizer_mismatch_refused) {
    /* target: the default model (vocab 49152) against the tiny drafter (vocab 258) */
    make_dir();
    char ep[300];
    endpoint(ep, sizeof ep, "d");
    pid_t d = start_drafter(ep);
    char *argv[] = {"build/rootspec-target", "--model", (char *)tu_default_model_path(),
                    "--prompt-ids", "1,2,3", "--decoder", "rootdraw", "--draft-endpoint", ep,
                    "--draft-timeout-ms", "20000", NULL};
    int rc = wait_exit(spawn(argv, "mm"), 60000);
    char *err = slurp("mm", "err");
    ck_assert_msg(rc == 2, "exit %d: %s", rc, err);
    ck_assert_msg(strstr(err, "target vocab 49152") && strstr(err, "drafter vocab 258"),
                  "message does not name both sides: %s", err);
    free(err);
    stop(d);
}
END_TEST


/* Random-weight models (what tools/gpu-check.sh times on the GPU) across the process
 * boundary: a drafter process with the target's own random weights must accept several
 * tokens a round (so both processes really built identical weights from the seed), the
 * output equals AR's; a random drafter of another vocabulary, or one facing a target with a
 * real tokenizer, is refused at HELLO. */
static int run_random_target(const char *tag, const char *model, const char *decoder,
                             const char *ep) {
    /* AR runs past the speculative decoders' 48 (they may stop a tree depth later) */
    char *argv[] = {"build/rootspec-target", "--model", (char *)model, "--prompt-ids",
                    "5,17,200,3,99", "--max-new", ep ? "48" : "120", "--decoder", (char *)decoder,
                    "--budget", "59", "--draft-timeout-ms", "20000",
                    ep ? "--draft-endpoint" : NULL, (char *)ep, NULL};
    return wait_exit(spawn(argv, tag), 60000);
}

START_TEST(test_random_models_across_processes) {
    make_dir();
    char ep[300];
    endpoint(ep, sizeof ep, "d");
    const char *model = "random:tiny,seed=9";
    pid_t d = start_drafter_on(ep, model, NULL);
    ck_assert_int_eq(run_random_target("rar", model, "ar", NULL), 0);
    char *ref = slurp("rar", "out");
    ck_assert_msg(strlen(ref) > 10, "AR printed no ids: '%s'", ref);
    const char *decs[] = {"draft", "rootdraw"};
    for (int i = 0; i < 2; i++) {
        int rc = run_random_target(decs[i], model, decs[i], ep);
        char *err = slurp(decs[i], "err"), *got = slurp(decs[i], "out");
        ck_assert_msg(rc == 0, "%s exited %d: %s", decs[i], rc, err);
        ck_assert_msg(ids_prefix(got, ref, 48), "%s over ZeroMQ:\n%s\nAR:\n%s", decs[i], got,
                      ref);
        const char *acc = strstr(err, "mean accepted ");
        ck_assert_msg(acc, "no summary line: %s", err);
        double mean = atof(acc + strlen("mean accepted "));
        ck_assert_msg(mean >= 2.0, "%s: drafter with the target's seed accepted only %.3f per "
                      "round: the two processes built different weights? %s", decs[i], mean, err);
        free(got);
        free(err);
    }
    free(ref);
    stop(d);

    /* vocabulary mismatch: drafter random:tiny,vocab=600 against the 512-token target */
    endpoint(ep, sizeof ep, "v");
    d = start_drafter_on(ep, "random:tiny,vocab=600", NULL);
    int rc = run_random_target("rv", model, "rootdraw", ep);
    char *err = slurp("rv", "err");
    ck_assert_msg(rc == 2 && strstr(err, "target vocab 512") && strstr(err, "drafter vocab 600"),
                  "exit %d: %s", rc, err);
    free(err);
    stop(d);

    /* no tokenizer vs a real one of the same size (the tiny golden llama has 258 tokens) */
    endpoint(ep, sizeof ep, "t");
    d = start_drafter_on(ep, "random:tiny,vocab=258", NULL);
    rc = run_random_target("rt", TINY, "rootdraw", ep);
    err = slurp("rt", "err");
    ck_assert_msg(rc == 2 && strstr(err, "tokenizer"), "exit %d: %s", rc, err);
    free(err);
    stop(d);
}
END_TEST

/* tools/pipeline-timing.sh (the GPU check's two-process timing) on the CPU with tiny
 * random models: it must finish, report every decoder's identity with AR and the table. */
START_TEST(test_pipeline_timing_script) {
    make_dir();
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "PIPE_BIN=build PIPE_BACKEND=cpu PIPE_TARGET=random:tiny,seed=5 "
             "PIPE_DRAFT=random:tiny,seed=6,layers=1 PIPE_MAX_NEW=24 PIPE_PROMPT_LEN=10 "
             "PIPE_OUT=%s/pipe LD_PRELOAD= "
             "bash tools/pipeline-timing.sh > %s/pipe.log 2>&1", g_dir, g_dir);
    int rc = system(cmd);
    char *log = slurp("pipe", "log");
    ck_assert_msg(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "pipeline-timing.sh: %d\n%s", rc, log);
    const char *decs[] = {"draft", "pearl", "rootdraw"};
    for (int i = 0; i < 3; i++) {
        char want[128];
        snprintf(want, sizeof want, "IDENTITY ok: %s's first 24 ids equal AR's", decs[i]);
        ck_assert_msg(strstr(log, want), "missing '%s' in:\n%s", want, log);
        snprintf(want, sizeof want, "\n  %-9s ", decs[i]);
        ck_assert_msg(strstr(log, want), "no summary row for %s:\n%s", decs[i], log);
        snprintf(want, sizeof want, "\nidentity_%s=ok\n", decs[i]); /* the GPU check's recap */
        ck_assert_msg(strstr(log, want), "missing '%s' in:\n%s", want + 1, log);
    }
    ck_assert_msg(!strstr(log, "FAIL"), "%s", log);
    free(log);
    /* an EAGLE-3 head as the drafter: the script gives rootspec-draft --target-model */
    snprintf(cmd, sizeof cmd,
             "PIPE_BIN=build PIPE_BACKEND=cpu PIPE_TARGET=random:tiny,seed=5 "
             "PIPE_DRAFT=random:eagle3-tiny PIPE_DECODERS=rootdraw PIPE_MAX_NEW=24 "
             "PIPE_PROMPT_LEN=10 PIPE_OUT=%s/pipe3 OPENBLAS_NUM_THREADS=1 LD_PRELOAD= "
             "bash tools/pipeline-timing.sh > %s/pipe3.log 2>&1", g_dir, g_dir);
    rc = system(cmd);
    log = slurp("pipe3", "log");
    ck_assert_msg(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "pipeline-timing.sh: %d\n%s", rc, log);
    ck_assert_msg(strstr(log, "IDENTITY ok: rootdraw's first 24 ids equal AR's"), "%s", log);
    ck_assert_msg(!strstr(log, "drafter failed") && !strstr(log, "FAIL"), "%s", log);
    free(log);
}
END_TEST

/* In-process drafter with another vocabulary: refused, naming both sizes. */
/* A drafter model whose logits are not finite answers COMMIT_GROW with an error (an
 * ERROR reply, an AR fallback in process) instead of aborting the drafter process. */
START_TEST(test_drafter_nonfinite_logits) {
    Model *m = tu_random_model(ARCH_LLAMA, 32, 64, 1, 4, 2, 64, 3);
    m->w.final_norm[0] = NAN;
    Drafter *d = NULL;
    RsErr e = {0};
    ck_assert_msg(drafter_model_create(m, &cpu_backend_ops, TU_BP(256, 1), &d, &e) == 0, "%s", e.msg);
    static Pool p;
    const int toks[] = {1, 2, 3};
    int rc = drafter_commit_grow(d, toks, 3, &p, &e);
    ck_assert_msg(rc == RS_EFORMAT, "rc %d: %s", rc, e.msg);
    ck_assert_msg(strstr(e.msg, "invalid pool") && strstr(e.msg, "log q nan"), "%s", e.msg);
    ck_assert_int_eq(p.n, 0);
    drafter_destroy(&d);
    model_destroy(&m);
}
END_TEST

START_TEST(test_inprocess_vocab_mismatch) {
    make_dir();
    char *argv[] = {"build/rootspec-target", "--model", TINY, "--draft-model",
                    (char *)tu_default_model_path(), "--prompt-ids", "1,2", "--decoder", "draft",
                    NULL};
    int rc = wait_exit(spawn(argv, "ip"), 60000);
    char *err = slurp("ip", "err");
    ck_assert_msg(rc == 2, "exit %d: %s", rc, err);
    ck_assert_msg(strstr(err, "drafter vocabulary (49152 tokens") && strstr(err, "target's (258 tokens"),
                  "message: %s", err);
    free(err);
}
END_TEST

/* tcp:// needs CURVE or --insecure; with keys the pipeline works, with another client key
 * the drafter's ZAP handler refuses and the target reports a timeout. */
START_TEST(test_tcp_curve) {
    make_dir();
    char keys[300], other[300];
    snprintf(keys, sizeof keys, "%s/keys", g_dir);
    snprintf(other, sizeof other, "%s/other", g_dir);
    char *gen1[] = {"build/rootspec-draft", "--gen-keys", keys, NULL};
    char *gen2[] = {"build/rootspec-draft", "--gen-keys", other, NULL};
    ck_assert_int_eq(wait_exit(spawn(gen1, "g1"), 10000), 0);
    ck_assert_int_eq(wait_exit(spawn(gen2, "g2"), 10000), 0);
    /* `other` knows the real server key but has its own client key: only ZAP can refuse it */
    char cmd[700];
    snprintf(cmd, sizeof cmd, "cp %s/server.pub %s/server.pub", keys, other);
    ck_assert_int_eq(system(cmd), 0);
    int port = 20000 + (int)(getpid() % 20000);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    char *plain[] = {"build/rootspec-draft", "--model", TINY, "--bind", ep, NULL};
    ck_assert_int_eq(wait_exit(spawn(plain, "plain"), 20000), 2);
    char *err = slurp("plain", "err");
    ck_assert_msg(strstr(err, "plain tcp://"), "message: %s", err);
    free(err);
    char *srv[] = {"build/rootspec-draft", "--model", TINY, "--draft-layers", "0", "--bind", ep,
                   "--curve-dir", keys, NULL};
    pid_t d = spawn(srv, "draft");
    usleep(500000);
    ck_assert_int_eq(run_target("ar", "ar", NULL, 60, NULL, NULL), 0);
    char *ok[] = {"build/rootspec-target", "--model", TINY, "--prompt-ids", PROMPT, "--decoder",
                  "rootdraw", "--max-new", "20", "--output-ids", "--draft-endpoint", ep,
                  "--curve-dir", keys, "--draft-timeout-ms", "10000", NULL};
    int rc = wait_exit(spawn(ok, "ok"), 60000);
    char *got = slurp("ok", "out"), *ref = slurp("ar", "out"), *oerr = slurp("ok", "err");
    ck_assert_msg(rc == 0 && !strstr(oerr, "drafter failed"), "curve run: %d %s", rc, oerr);
    ck_assert_msg(ids_prefix(got, ref, 20), "%s vs %s", got, ref);
    char *bad[] = {"build/rootspec-target", "--model", TINY, "--prompt-ids", PROMPT, "--decoder",
                   "rootdraw", "--max-new", "20", "--draft-endpoint", ep, "--curve-dir", other,
                   "--draft-timeout-ms", "1500", NULL};
    rc = wait_exit(spawn(bad, "bad"), 60000);
    char *berr = slurp("bad", "err");
    ck_assert_msg(rc == 0 && strstr(berr, "no answer: wrong server key or no drafter at") &&
                      strstr(berr, "decoding autoregressively"),
                  "wrong key accepted: %d %s", rc, berr);
    free(got);
    free(ref);
    free(oerr);
    free(berr);
    stop(d);
}
END_TEST

/* ---- robustness: long prompts, a busy ipc:// path, lost output, conflicting options, a
 * drafter that cannot start under deploy/launch.sh ---- */

/* The default model with a 300-token prompt: more than the target's pending entries in one
 * round, so the prompt is prefilled in several chunks (it used to be refused with "batch of
 * 256 tokens exceeds max_pending"). */
START_TEST(test_default_model_long_prompt) {
    make_dir();
    char ids[300 * 8] = "";
    for (int i = 0, k = 0; i < 300; i++)
        k += snprintf(ids + k, sizeof ids - k, "%s%d", i ? "," : "", 100 + (i * 7919) % 49000);
    char *argv[] = {"build/rootspec-target", "--model", (char *)tu_default_model_path(),
                    "--prompt-ids", ids, "--max-new", "4", "--output-ids", NULL};
    int rc = wait_exit(spawn(argv, "long"), 120000);
    char *err = slurp("long", "err");
    ck_assert_msg(rc == 0, "300-token prompt: exit %d: %s", rc, err);
    ck_assert_msg(strstr(err, "prompt=300 tokens"), "summary: %s", err);
    ck_assert_int_eq(count_ids("long"), 4);
    free(err);
}
END_TEST

/* Waits for drafter `pid`'s "serving MODEL on EP" line in tag.err, up to 20 s. */
static void wait_serving(pid_t pid, const char *tag) {
    for (int t = 0; t < 20000; t += 20) {
        char *err = slurp(tag, "err");
        int ok = strstr(err, "rootspec-draft: serving ") != NULL, st;
        if (!ok && waitpid(pid, &st, WNOHANG) == pid)
            ck_abort_msg("%s exited (status %d) before serving: %s", tag,
                         WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), err);
        free(err);
        if (ok) return;
        usleep(20000);
    }
    ck_abort_msg("%s never reported serving", tag);
}

/* libzmq's ipc bind unlinks an existing socket file: a second drafter on the path of a live
 * one used to take it over silently (new targets reached the second, the first was
 * orphaned). It is refused now, and the first keeps serving. A stale socket file that
 * nothing listens on is still reused. */
START_TEST(test_ipc_endpoint_in_use) {
    make_dir();
    char ep[300];
    endpoint(ep, sizeof ep, "d");
    pid_t d = start_drafter(ep);
    wait_serving(d, "draft");
    char *argv2[] = {"build/rootspec-draft", "--bind", ep, "--model", TINY, "--draft-layers", "0",
                     NULL};
    int rc = wait_exit(spawn(argv2, "draft2"), 20000);
    char *err = slurp("draft2", "err");
    ck_assert_msg(rc == 1 && strstr(err, "another process is serving"), "second drafter: exit %d: %s",
                  rc, err);
    free(err);
    ck_assert_msg(kill(d, 0) == 0, "first drafter died");
    ck_assert_int_eq(run_target("ar", "ar", NULL, 60, NULL, NULL), 0);
    ck_assert_int_eq(run_target("t", "rootdraw", ep, 20, NULL, NULL), 0);
    char *got = slurp("t", "out"), *ref = slurp("ar", "out"), *terr = slurp("t", "err");
    ck_assert_msg(!strstr(terr, "drafter failed") && ids_prefix(got, ref, 20),
                  "through the first drafter: %s\nvs AR\n%s\n%s", got, ref, terr);
    free(got);
    free(terr);
    stop(d);

    /* a socket file left by a dead process: bound, never listening */
    char sp[300];
    endpoint(sp, sizeof sp, "stale");
    const char *path = sp + strlen("ipc://");
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    ck_assert(fd >= 0 && strlen(path) < sizeof a.sun_path);
    memcpy(a.sun_path, path, strlen(path) + 1);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    close(fd);
    ck_assert_int_eq(access(path, F_OK), 0);
    char *argv3[] = {"build/rootspec-draft", "--bind", sp, "--model", TINY, "--draft-layers", "0",
                     NULL};
    d = spawn(argv3, "draft3");
    wait_serving(d, "draft3");
    ck_assert_int_eq(run_target("t2", "rootdraw", sp, 20, NULL, NULL), 0);
    got = slurp("t2", "out");
    terr = slurp("t2", "err");
    ck_assert_msg(!strstr(terr, "drafter failed") && ids_prefix(got, ref, 20),
                  "through the drafter on a stale socket: %s\n%s", got, terr);
    free(got);
    free(terr);
    free(ref);
    stop(d);
}
END_TEST

/* Output that cannot be written (a full disk: /dev/full) is a failure, not a silent exit 0:
 * --log-rounds to /dev/full, and stdout to /dev/full. */
START_TEST(test_target_lost_output) {
    make_dir();
    char *a1[] = {"build/rootspec-target", "--model", TINY, "--prompt-ids", PROMPT, "--max-new",
                  "20", "--output-ids", "--log-rounds", "/dev/full", NULL};
    int rc = wait_exit(spawn(a1, "log"), 60000);
    char *err = slurp("log", "err");
    ck_assert_msg(rc == 1 && strstr(err, "writing --log-rounds '/dev/full' failed"),
                  "--log-rounds /dev/full: exit %d: %s", rc, err);
    free(err);
    char *a2[] = {"build/rootspec-target", "--model", TINY, "--prompt-ids", PROMPT, "--max-new",
                  "20", "--output-ids", NULL};
    rc = wait_exit(spawn_to(a2, "full", "/dev/full", 0), 60000);
    err = slurp("full", "err");
    ck_assert_msg(rc == 1 && strstr(err, "writing the output to stdout failed"),
                  "stdout to /dev/full: exit %d: %s", rc, err);
    free(err);
}
END_TEST

/* Drafter options that contradict each other are bad usage (exit 2) instead of one of them
 * being ignored. */
START_TEST(test_target_conflicting_draft_options) {
    make_dir();
    char ep[300];
    endpoint(ep, sizeof ep, "nobody");
    char *a1[] = {"build/rootspec-target", "--model", TINY, "--prompt-ids", PROMPT, "--decoder",
                  "draft", "--max-new", "4", "--draft-model", TINY, "--draft-layers", "0", NULL};
    int rc = wait_exit(spawn(a1, "ml"), 60000);
    char *err = slurp("ml", "err");
    ck_assert_msg(rc == 2 && strstr(err, "give --draft-model or --draft-layers"),
                  "--draft-model with --draft-layers: exit %d: %s", rc, err);
    free(err);
    char *a2[] = {"build/rootspec-target", "--model", TINY, "--prompt-ids", PROMPT, "--decoder",
                  "draft", "--max-new", "4", "--draft-endpoint", ep, "--draft-model", TINY,
                  "--draft-timeout-ms", "500", NULL};
    rc = wait_exit(spawn(a2, "em"), 60000);
    err = slurp("em", "err");
    ck_assert_msg(rc == 2 && strstr(err, "drop --draft-model"),
                  "--draft-endpoint with --draft-model: exit %d: %s", rc, err);
    free(err);
}
END_TEST

/* A KV cache the host cannot hold (--ctx 1048576 under a 400 MB address-space limit: 512 MiB
 * of K and V in f32, forced with ROOTSPEC_CPU_KV: the f16 cache would fit) is an error naming
 * the size and --ctx, exit 1, not an abort. The same limit with --ctx 4096 decodes, so the
 * limit alone is not what fails. The release binary runs under `ulimit -v` (the sanitized
 * test binary cannot: ASan reserves terabytes). */
START_TEST(test_target_kv_alloc_failure) {
    make_dir();
    const char *ctx[2] = {"4096", "1048576"};
    for (int i = 0; i < 2; i++) {
        char cmd[600];
        snprintf(cmd, sizeof cmd,
                 "ulimit -v 400000 && ROOTSPEC_CPU_KV=f32 exec build/rootspec-target --model %s "
                 "--prompt-ids %s --max-new 4 --output-ids --ctx %s",
                 TINY, PROMPT, ctx[i]);
        char *argv[] = {"/bin/sh", "-c", cmd, NULL};
        int rc = wait_exit(spawn(argv, "kv"), 60000);
        char *err = slurp("kv", "err");
        if (i == 0)
            ck_assert_msg(rc == 0, "--ctx 4096 under the limit: exit %d: %s", rc, err);
        else
            ck_assert_msg(rc == 1 && strstr(err, "cannot allocate the KV cache: 1048576 entries") &&
                              strstr(err, "lower --ctx"),
                          "--ctx 1048576 under the limit: exit %d: %s", rc, err);
        free(err);
    }
}
END_TEST

/* deploy/launch.sh: a drafter that cannot start (a layer range the model lacks) stops the
 * run at once with the drafter's status 2, rather than after the target's --draft-timeout-ms
 * (60 s here); an option without its value is bad usage. */
START_TEST(test_launch_drafter_fails) {
    make_dir();
    char *argv[] = {"/bin/bash", "deploy/launch.sh", "--draft-model", TINY, "--draft-layers",
                    "0-99", "--", "--model", TINY, "--prompt-ids", PROMPT, "--decoder",
                    "rootdraw", "--max-new", "8", "--draft-timeout-ms", "60000", NULL};
    uint64_t t0 = rs_now_ns();
    pid_t pid = spawn_to(argv, "launch", NULL, 1);
    int st = 0, rc = -1;
    while (rs_now_ns() - t0 < 30000000000ull) {
        if (waitpid(pid, &st, WNOHANG) == pid) {
            rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            break;
        }
        usleep(20000);
    }
    double s = (rs_now_ns() - t0) * 1e-9;
    if (rc < 0) { /* the script, the target and the drafter */
        kill(-pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    char *err = slurp("launch", "err");
    ck_assert_msg(rc == 2 && s < 15, "launch.sh: exit %d after %.1f s: %s", rc, s, err);
    ck_assert_msg(strstr(err, "rootspec-draft exited with status 2") && strstr(err, "0-99"),
                  "message: %s", err);
    free(err);
    char *a2[] = {"/bin/bash", "deploy/launch.sh", "--draft-model", NULL};
    rc = wait_exit(spawn_to(a2, "noval", NULL, 1), 20000);
    err = slurp("noval", "err");
    ck_assert_msg(rc == 2 && strstr(err, "option --draft-model needs a value"), "exit %d: %s", rc,
                  err);
    free(err);
}
END_TEST

/* One Drafter interface, every kind behind it: the same commits give bit-identical pools
 * from a model drafter on a layer view, the self-drafter on the same layers, the threaded
 * kind around it and a rootspec-draft process serving those layers (the sequence includes
 * a reset with a prompt, which only rootspec-draft's RESET uses today). */
static void grow_seq(Drafter *d, Pool *out /* (3) */) {
    RsErr e = {0};
    const int prompt[] = {10, 20, 30, 40, 50, 60};
    ck_assert_msg(drafter_grow_begin(d, prompt, 6, 1, NULL, 0, &e) == 0, "%s", e.msg);
    ck_assert_msg(drafter_grow_end(d, &out[0], &e) == 0, "%s", e.msg);
    int two[2] = {out[0].token[0], out[0].token[out[0].first_child[0]]};
    ck_assert_msg(drafter_commit_grow(d, two, 2, &out[1], &e) == 0, "%s", e.msg);
    ck_assert_msg(drafter_reset(d, prompt, 4, NULL, 0, &e) == 0, "%s", e.msg);
    ck_assert_msg(drafter_commit_grow(d, prompt + 4, 2, &out[2], &e) == 0, "%s", e.msg);
}

static int pools_equal(const Pool *a, const Pool *b) {
    size_t n = (size_t)a->n;
    return a->n == b->n && a->n == POOL_MAX &&
           !memcmp(a->token, b->token, n * sizeof a->token[0]) &&
           !memcmp(a->parent, b->parent, n * sizeof a->parent[0]) &&
           !memcmp(a->logq, b->logq, n * sizeof a->logq[0]) && !memcmp(a->depth, b->depth, n);
}

START_TEST(test_each_drafter_kind_same_pools) {
    make_dir();
    char ep[300];
    endpoint(ep, sizeof ep, "k");
    pid_t dp = start_drafter_on(ep, TINY, "0");
    RsErr e = {0};
    Model *m = NULL, *view = NULL;
    Tokenizer *tok = NULL;
    ck_assert_msg(model_load(TINY, &m, &e) == 0, "%s", e.msg);
    ck_assert_msg(tokenizer_load_model(m, &tok, &e) == 0, "%s", e.msg);
    ck_assert_int_eq(model_layer_view(m, "0", &view, &e), 0);
    Drafter *kinds[4] = {0};
    const char *names[4] = {"model on a view", "self", "threaded self", "remote"};
    ck_assert_int_eq(drafter_model_create(view, &cpu_backend_ops, TU_BP(256, 1), &kinds[0], &e), 0);
    ck_assert_int_eq(drafter_self_create(m, "0", &cpu_backend_ops, TU_BP(256, 1), &kinds[1], &e), 0);
    Drafter *inner = NULL;
    ck_assert_int_eq(drafter_self_create(m, "0", &cpu_backend_ops, TU_BP(256, 1), &inner, &e), 0);
    ck_assert_int_eq(drafter_threaded_create(inner, &kinds[2], &e), 0);
    ck_assert_msg(drafter_remote_create(ep, m, tokenizer_identity(tok, m->cfg.vocab_size), 20000,
                                        0, NULL, &kinds[3], &e) == 0,
                  "%s", e.msg);
    static Pool pools[4][3];
    for (int k = 0; k < 4; k++) {
        const DrafterInfo *in = drafter_info(kinds[k]);
        ck_assert_int_eq(in->vocab_size, m->cfg.vocab_size);
        ck_assert_msg(!strcmp(in->fingerprint, view->fingerprint), "%s: fingerprint %s, want %s",
                      names[k], in->fingerprint, view->fingerprint);
        grow_seq(kinds[k], pools[k]);
        for (int r = 0; r < 3; r++)
            ck_assert_msg(pools_equal(&pools[k][r], &pools[0][r]), "%s: pool %d differs",
                          names[k], r);
    }
    ck_assert_msg(!pools_equal(&pools[0][0], &pools[0][1]), "the commits changed nothing");
    ck_assert_int_eq(model_drafter_n_committed(kinds[1]), 6);
    for (int k = 0; k < 4; k++) drafter_destroy(&kinds[k]);
    ck_assert(kinds[3] == NULL);
    drafter_destroy(&kinds[3]); /* NULL: nothing */
    model_destroy(&view);
    tokenizer_destroy(&tok);
    model_destroy(&m);
    stop(dp);
}
END_TEST

/* The engine holds one Drafter and decode_run takes any kind: with a drafter model of its
 * own, the self-drafter and a rootspec-draft process, T=0 output equals AR's. The
 * self-drafter and the remote one serve the same layers, so they accept the same tokens;
 * the target itself as its own drafter accepts more than a one-layer view. */
static int engine_decode(const EngineOpts *eo, DecoderKind decoder, int *out, int cap, long *accepted) {
    Engine *en = NULL;
    RsErr e = {0};
    ck_assert_msg(engine_create(eo, decoder != DECODER_AR, &en, &e) == 0, "%s", e.msg);
    const int prompt[] = {10, 20, 30, 40, 50, 60};
    DecodeOpts opts = {.decoder = decoder, .budget = 8, .sampling = SAMPLING_GREEDY, .max_new = 40};
    DecodeResult res = {.tokens = out, .cap = cap};
    ck_assert_msg(decode_run(en->target, en->drafter, prompt, 6, &opts, NULL, &res, &e) == 0, "%s",
                  e.msg);
    ck_assert_msg(!res.drafter_failed, "the drafter failed");
    engine_destroy(&en);
    ck_assert(en == NULL); /* destroy clears the pointer */
    *accepted = res.accepted_total;
    return res.n_tokens;
}

START_TEST(test_engine_each_drafter_kind) {
    make_dir();
    char ep[300];
    endpoint(ep, sizeof ep, "e");
    pid_t dp = start_drafter_on(ep, TINY, "0");
    char eps[300];
    endpoint(eps, sizeof eps, "es");
    pid_t sp = start_suffix_drafter(eps);
    EngineOpts base = {.model_path = TINY, .threads = 1, .ctx = 512, .draft_timeout_ms = 20000};
    int ref[128], got[128];
    long acc[5], ar_acc;
    int n_ref = engine_decode(&base, DECODER_AR, ref, 128, &ar_acc);
    ck_assert_int_ge(n_ref, 40);
    EngineOpts kinds[5] = {base, base, base, base, base};
    const char *names[5] = {"drafter model", "self-drafter", "remote", "suffix", "remote suffix"};
    kinds[0].draft_model_path = TINY; /* the target as its own drafter */
    kinds[1].draft_layers = "0";
    kinds[2].draft_endpoint = ep; /* serving layer 0 */
    kinds[3].drafter_kind = DRAFTER_KIND_SUFFIX;
    kinds[4].draft_endpoint = eps;
    for (int k = 0; k < 5; k++) {
        int n = engine_decode(&kinds[k], DECODER_ROOTDRAW, got, 128, &acc[k]);
        ck_assert_msg(n >= 40, "%s: %d tokens", names[k], n);
        for (int i = 0; i < 40; i++)
            ck_assert_msg(got[i] == ref[i], "%s: token %d is %d, AR's %d", names[k], i, got[i],
                          ref[i]);
    }
    ck_assert_msg(acc[1] == acc[2], "self-drafter accepted %ld, remote on the same layers %ld",
                  acc[1], acc[2]);
    ck_assert_msg(acc[0] > acc[1], "the target as drafter accepted %ld, layer 0 %ld", acc[0],
                  acc[1]);
    ck_assert_msg(acc[3] == acc[4] && acc[3] > 0,
                  "suffix drafter accepted %ld in process, %ld remote", acc[3], acc[4]);
    stop(dp);
    stop(sp);
}
END_TEST

/* rootspec-draft with an EAGLE-3 head: it needs --target-model (and refuses it without a
 * head), refuses a head that does not fit the target naming both vocabularies, and serves
 * random:eagle3-tiny for random:tiny: the remote kind learns the head's feature layers
 * (0, 1, 2 for a 2-layer target) and grows full pools from features. In process,
 * --draft-model HEAD builds the EAGLE-3 kind the same way. */
START_TEST(test_eagle3_head_wiring) {
    make_dir();
    char ep[300];
    endpoint(ep, sizeof ep, "e3");
    static const struct {
        const char *model, *target, *want;
    } bad[] = {
        {"random:eagle3-tiny", NULL, "--model names an EAGLE-3 head: give --target-model"},
        {"random:tiny", "random:tiny", "--target-model is for an EAGLE-3 head, and --model is not one"},
        {"tests/fixtures/eagle3/head", "random:tiny",
         "has vocab_size 96 but the target's vocabulary has 512 tokens"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *argv[] = {"build/rootspec-draft", "--bind", ep, "--model", (char *)bad[i].model,
                        bad[i].target ? "--target-model" : NULL, (char *)bad[i].target, NULL};
        ck_assert_int_eq(wait_exit(spawn(argv, "e3bad"), 20000), 2);
        char *err = slurp("e3bad", "err");
        ck_assert_msg(strstr(err, bad[i].want), "stderr '%s' lacks '%s'", err, bad[i].want);
        free(err);
    }
    char *argv[] = {"build/rootspec-draft", "--bind", ep, "--model", "random:eagle3-tiny",
                    "--target-model", "random:tiny", NULL};
    pid_t d = spawn(argv, "e3draft");
    wait_serving(d, "e3draft");
    Model *m;
    RsErr e = {0};
    ck_assert(model_load("random:tiny", &m, &e) == 0);
    Drafter *rd;
    ck_assert_msg(drafter_remote_create(ep, m, tokenizer_identity(NULL, 512), 10000, 0, NULL,
                                        &rd, &e) == 0, "%s", e.msg);
    const DrafterInfo *ri = drafter_info(rd);
    ck_assert_int_eq(ri->n_feature_layers, 3);
    ck_assert(ri->feature_layers[0] == 0 && ri->feature_layers[1] == 1 && ri->feature_layers[2] == 2);
    int toks[4] = {5, 9, 200, 31}, F = 3 * m->cfg.dim;
    float *f = malloc(sizeof(float) * 4 * (size_t)F);
    for (int i = 0; i < 4 * F; i++) f[i] = (float)((i * 37) % 11) / 11.0f - 0.5f;
    Pool *p = malloc(sizeof *p);
    ck_assert_msg(drafter_reset(rd, toks, 3, f, sizeof(float) * 3 * F, &e) == 0, "%s", e.msg);
    ck_assert(drafter_grow_begin(rd, toks + 3, 1, 0, f + 3 * F, sizeof(float) * F, &e) == 0);
    ck_assert_msg(drafter_grow_end(rd, p, &e) == 0, "%s", e.msg);
    ck_assert_int_eq(p->n, POOL_MAX);
    drafter_destroy(&rd);
    stop(d);
    /* in process */
    EngineOpts eo = {.model_path = "random:tiny", .draft_model_path = "random:eagle3-tiny",
                     .backend = "cpu", .threads = 1, .ctx = 256};
    Engine *en = NULL;
    ck_assert_msg(engine_create(&eo, 1, &en, &e) == 0, "%s", e.msg);
    ck_assert_int_eq(drafter_info(en->drafter)->n_feature_layers, 3);
    ck_assert_int_eq(drafter_info(en->drafter)->vocab_size, 512);
    engine_destroy(&en);
    eo.draft_model_path = "tests/fixtures/eagle3/head";
    ck_assert_int_eq(engine_create(&eo, 1, &en, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "has vocab_size 96 but the target's vocabulary has 512"), "%s", e.msg);
    free(f);
    free(p);
    model_destroy(&m);
}
END_TEST

/* Settings a user gives travel in parameters, not in process-wide state: --batch-invariant
 * and ROOTSPEC_CPU_KERNELS / ROOTSPEC_CPU_KV (read once, by engine_cli_runtime, into
 * EngineOpts; a value a variable does not take is refused, named) reach the
 * target's backend (BackendParams), --eagle3-layer-ids (DrafterSpec) the head drafter_open
 * loads: the fixture head lists layers 0, 1, 2, which fit the 2-layer fixture target as
 * entering-layer ids and not as output ids. */
START_TEST(test_settings_travel) {
    RsErr e = {0};
    EngineOpts eo = {.model_path = "random:tiny", .backend = "cpu", .threads = 1, .ctx = 256,
                     .batch_invariant = 1};
    Engine *en = NULL;
    ck_assert_msg(engine_create(&eo, 0, &en, &e) == 0, "%s", e.msg);
    ck_assert_int_eq(backend_params(target_backend(en->target)).batch_invariant, 1);
    engine_destroy(&en);
    eo.batch_invariant = 0;
    ck_assert_msg(engine_create(&eo, 0, &en, &e) == 0, "%s", e.msg);
    ck_assert_int_eq(backend_params(target_backend(en->target)).batch_invariant, 0);
    engine_destroy(&en);
    /* the best family keeps f16 caches where it can; ROOTSPEC_CPU_KV=f32 keeps f32 */
    CliRuntime rt = cli_runtime_defaults();
    ck_assert_msg(engine_cli_runtime(&eo, &rt, &e) == 0, "%s", e.msg);
    ck_assert_msg(engine_create(&eo, 0, &en, &e) == 0, "%s", e.msg);
    int f16 = !strcmp(cpu_backend_kv(target_backend(en->target)), "f16");
    engine_destroy(&en);
    setenv("ROOTSPEC_CPU_KV", "f32", 1);
    ck_assert_msg(engine_cli_runtime(&eo, &rt, &e) == 0, "%s", e.msg);
    unsetenv("ROOTSPEC_CPU_KV"); /* read once: what comes after does not look again */
    ck_assert_msg(engine_create(&eo, 0, &en, &e) == 0, "%s", e.msg);
    ck_assert_str_eq(cpu_backend_kv(target_backend(en->target)), "f32");
    engine_destroy(&en);
    if (!f16) fprintf(stderr, "twoproc: the CPU's family keeps f32 caches anyway\n");
    setenv("ROOTSPEC_CPU_KERNELS", "scalar", 1);
    rt = cli_runtime_defaults();
    ck_assert_msg(engine_cli_runtime(&eo, &rt, &e) == 0, "%s", e.msg);
    unsetenv("ROOTSPEC_CPU_KERNELS");
    eo.model_path = "random:tiny";
    ck_assert_msg(engine_create(&eo, 0, &en, &e) == 0, "%s", e.msg);
    ck_assert_str_eq(cpu_backend_kernels(target_backend(en->target)), "scalar");
    engine_destroy(&en);
    const char *bad[][2] = {{"ROOTSPEC_CPU_PACK", "yes"}, {"ROOTSPEC_CPU_KV", "f8"},
                            {"ROOTSPEC_CPU_PIN", "on"}, {"ROOTSPEC_CUDA_GRAPHS", "off"},
                            {"ROOTSPEC_CUDA_FUSED_QKV", "some"}, {"ROOTSPEC_ROWS_BATCHED", "2"}};
    for (int i = 0; i < 6; i++) {
        char want[64];
        snprintf(want, sizeof want, "%s=%s", bad[i][0], bad[i][1]);
        setenv(bad[i][0], bad[i][1], 1);
        ck_assert_int_eq(engine_cli_runtime(&eo, &rt, &e), RS_EINVAL);
        unsetenv(bad[i][0]);
        ck_assert_msg(strstr(e.msg, want), "%s", e.msg);
    }
    BackendSwitches sw;
    const char *kernels = "x";
    setenv("ROOTSPEC_CPU_PIN", "0", 1);
    setenv("ROOTSPEC_CUDA_GRAPHS", "0", 1);
    setenv("ROOTSPEC_CUDA_FUSED_QKV", "all", 1);
    setenv("ROOTSPEC_ROWS_BATCHED", "0", 1);
    ck_assert_int_eq(cli_backend_env(&kernels, &sw, &e), RS_OK);
    unsetenv("ROOTSPEC_ROWS_BATCHED");
    unsetenv("ROOTSPEC_CPU_PIN");
    unsetenv("ROOTSPEC_CUDA_GRAPHS");
    unsetenv("ROOTSPEC_CUDA_FUSED_QKV");
    ck_assert_ptr_null(kernels);
    ck_assert(sw.cpu_unpinned && sw.cuda_eager && sw.cuda_fused_qkv == 1 && !sw.cpu_kv_f32 &&
              sw.rows_batched == -1);
    eo.cpu_kernels = "avx3";
    ck_assert_int_eq(engine_create(&eo, 0, &en, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "avx3"), "%s", e.msg);
    Model *m = NULL;
    ck_assert_msg(model_load(tu_fixture("eagle3/target"), &m, &e) == 0, "%s", e.msg);
    DrafterSpec s = {.kind = DRAFTER_KIND_EAGLE3, .model_path = tu_fixture("eagle3/head")};
    DrafterHost h = {.model = m, .ops = &cpu_backend_ops,
                     .backend = {.kv_capacity = 64, .threads = 1}};
    Drafter *d = NULL;
    ck_assert_msg(drafter_open(&s, &h, &d, &e) == 0, "%s", e.msg);
    drafter_destroy(&d);
    s.layer_ids = EAGLE3_IDS_OUTPUT;
    ck_assert_int_eq(drafter_open(&s, &h, &d, &e), RS_EINVAL);
    ck_assert_msg(strstr(e.msg, "entering layer 3"), "%s", e.msg);
    ck_assert_ptr_null(d);
    model_destroy(&m);
}
END_TEST

/* ---- an EAGLE-3 head fed by the target's features (random:eagle3-tiny for random:tiny) ----
 * rootspec-target on random:tiny: with ep, its drafter is that rootspec-draft; with head,
 * the head in process (--draft-model); neither: AR. */
static int run_e3_target(const char *tag, const char *decoder, const char *ep, const char *head,
                         int max_new, const char *timeout_ms, pid_t *pid_out) {
    char mn[16];
    snprintf(mn, sizeof mn, "%d", max_new);
    char *argv[24] = {"build/rootspec-target", "--model", "random:tiny", "--prompt-ids",
                      "5,17,200,3,99,42,7", "--max-new", mn, "--decoder", (char *)decoder,
                      "--budget", "59", "--output-ids"};
    int k = 12;
    if (ep) {
        argv[k++] = "--draft-endpoint";
        argv[k++] = (char *)ep;
        argv[k++] = "--draft-timeout-ms";
        argv[k++] = (char *)(timeout_ms ? timeout_ms : "20000");
    }
    if (head) {
        argv[k++] = "--draft-model";
        argv[k++] = (char *)head;
    }
    argv[k] = NULL;
    pid_t pid = spawn(argv, tag);
    if (pid_out) {
        *pid_out = pid;
        return 0;
    }
    return wait_exit(pid, 60000);
}

static pid_t start_e3_drafter(const char *ep) {
    char *argv[] = {"build/rootspec-draft", "--bind", (char *)ep, "--model", "random:eagle3-tiny",
                    "--target-model", "random:tiny", NULL};
    pid_t d = spawn(argv, "e3draft");
    wait_serving(d, "e3draft");
    return d;
}

/* Every decoder with the head in process (--draft-model) and in rootspec-draft emits AR's
 * ids (T=0) and never falls back: the features reach the head on both paths. */
START_TEST(test_eagle3_identity_binaries) {
    make_dir();
    char ep[300];
    endpoint(ep, sizeof ep, "e3");
    pid_t d = start_e3_drafter(ep);
    ck_assert_int_eq(run_e3_target("ar", "ar", NULL, NULL, 100, NULL, NULL), 0);
    char *ref = slurp("ar", "out");
    ck_assert_msg(strlen(ref) > 10, "AR printed no ids: '%s'", ref);
    const char *decs[] = {"draft", "pearl", "rootdraw", "root"};
    for (int i = 0; i < 8; i++) {
        const char *dec = decs[i % 4], *where = i < 4 ? "in process" : "rootspec-draft";
        int rc = run_e3_target(dec, dec, i < 4 ? NULL : ep, i < 4 ? "random:eagle3-tiny" : NULL,
                               60, NULL, NULL);
        char *err = slurp(dec, "err"), *got = slurp(dec, "out");
        ck_assert_msg(rc == 0, "%s %s exited %d: %s", dec, where, rc, err);
        ck_assert_msg(!strstr(err, "drafter failed"), "%s %s: %s", dec, where, err);
        ck_assert_msg(ids_prefix(got, ref, 60), "%s %s:\n%s\nAR:\n%s", dec, where, got, ref);
        const char *acc = strstr(err, "mean accepted ");
        ck_assert_msg(acc, "no summary line: %s", err);
        fprintf(stderr, "eagle3 %s %s: mean accepted %.3f a round\n", dec, where,
                atof(acc + strlen("mean accepted ")));
        free(got);
        free(err);
    }
    free(ref);
    stop(d);
}
END_TEST

/* kill -9 of the EAGLE-3 rootspec-draft mid-decode: the target finishes autoregressively
 * and keeps every token (T=0: AR's ids). */
START_TEST(test_eagle3_drafter_killed) {
    make_dir();
    char ep[300];
    endpoint(ep, sizeof ep, "e3k");
    pid_t d = start_e3_drafter(ep);
    const int N = 500;
    ck_assert_int_eq(run_e3_target("ar", "ar", NULL, NULL, N + 80, NULL, NULL), 0);
    pid_t t;
    run_e3_target("rd", "rootdraw", ep, NULL, N, "700", &t);
    int n = fault_mid_decode(d, t, SIGKILL, N);
    ck_assert_msg(n == N, "%d ids, want %d", n, N);
    stop(d);
}
END_TEST

Suite *suite_twoproc(void) {
    Suite *s = suite_create("twoproc");
    TCase *tc = tcase_create("pipeline");
    tcase_set_timeout(tc, 180);
    tcase_add_test(tc, test_identity_across_processes);
    tcase_add_test(tc, test_eagle3_head_wiring);
    tcase_add_test(tc, test_eagle3_identity_binaries);
    tcase_add_test(tc, test_eagle3_drafter_killed);
    tcase_add_loop_test(tc, test_drafter_dies_mid_decode, 0, 2);
    tcase_add_test(tc, test_drafter_unreachable);
    tcase_add_test(tc, test_target_dies_drafter_recovers);
    tcase_add_test(tc, test_bad_frames_to_drafter);
    tcase_add_test(tc, test_tokenizer_mismatch_refused);
    tcase_add_test(tc, test_drafter_context_after_errors);
    tcase_add_test(tc, test_oversized_frame_dropped);
    tcase_add_test(tc, test_inprocess_vocab_mismatch);
    tcase_add_test(tc, test_drafter_nonfinite_logits);
    tcase_add_test(tc, test_random_models_across_processes);
    tcase_add_test(tc, test_pipeline_timing_script);
    tcase_add_test(tc, test_tcp_curve);
    tcase_add_test(tc, test_default_model_long_prompt);
    tcase_add_test(tc, test_ipc_endpoint_in_use);
    tcase_add_test(tc, test_target_lost_output);
    tcase_add_test(tc, test_target_conflicting_draft_options);
    tcase_add_test(tc, test_launch_drafter_fails);
    tcase_add_test(tc, test_target_kv_alloc_failure);
    tcase_add_test(tc, test_each_drafter_kind_same_pools);
    tcase_add_test(tc, test_engine_each_drafter_kind);
    suite_add_tcase(s, tc);
    TCase *ts = tcase_create("settings");
    tcase_add_test(ts, test_settings_travel);
    suite_add_tcase(s, ts);
    return s;
}
