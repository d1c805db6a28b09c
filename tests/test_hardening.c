/* What an attacker and a careless user broke, each with the real binaries: a flood
 * of idle connections against a drafter with few descriptors, ipc:// paths that are not
 * sockets (and the socket file left after a clean exit), bench --out holding another run,
 * terminal controls in a drafter's ERROR text, a target without a drafter, session
 * takeovers (reported to the target, logged at a bounded rate), and key file modes. */
#include "common/textsafe.h"
#include "common/tokenizer.h"
#include "proto/proto.h"
#include "testutil.h"
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#define TINY "tests/fixtures/golden/llama3_rope"
#define PROMPT "10,20,30,40,50,60"

static char g_dir[256];

static void make_dir(void) { tu_dir_make(g_dir, sizeof g_dir, "rs-hard"); }
static void rm_dir(void) { tu_dir_remove(g_dir); }
static pid_t spawn_lim(char *const argv[], const char *tag, int nofile) {
    return tu_spawn(g_dir, argv, tag, NULL, 0, nofile);
}
static pid_t spawn(char *const argv[], const char *tag) { return spawn_lim(argv, tag, 0); }
static char *slurp(const char *tag, const char *ext) { return tu_slurp(g_dir, tag, ext); }
#define wait_exit tu_wait_exit

/* 1 while pid runs; its exit status is reported (and reaped) otherwise. */
static int alive(pid_t pid, const char *tag) {
    static pid_t reaped = -1;
    int st;
    if (pid == reaped) return 0;
    if (waitpid(pid, &st, WNOHANG) != pid) return 1;
    reaped = pid;
    char *err = slurp(tag, "err");
    fprintf(stderr, "%s exited (%s %d): %.2000s\n", tag, WIFEXITED(st) ? "status" : "signal",
            WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), err);
    free(err);
    return 0;
}

/* Waits for "rootspec-draft: serving" in tag.err. */
static void wait_serving(pid_t pid, const char *tag) {
    for (int t = 0; t < 20000; t += 20) {
        char *err = slurp(tag, "err");
        int ok = strstr(err, "rootspec-draft: serving ") != NULL;
        free(err);
        if (ok) return;
        ck_assert_msg(alive(pid, tag), "%s died before serving", tag);
        usleep(20000);
    }
    ck_abort_msg("%s never reported serving", tag);
}

static pid_t start_drafter(const char *ep, const char *tag, int nofile) {
    char *argv[] = {"build/rootspec-draft", "--bind", (char *)ep, "--model", TINY,
                    "--draft-layers", "0", NULL};
    pid_t pid = spawn_lim(argv, tag, nofile);
    wait_serving(pid, tag);
    return pid;
}

static int run_target(const char *tag, const char *decoder, const char *ep, const char *tmo) {
    char *argv[] = {"build/rootspec-target", "--model", TINY, "--prompt-ids", PROMPT,
                    "--decoder", (char *)decoder, "--max-new", "20", "--output-ids", "--budget",
                    "8", ep ? "--draft-endpoint" : NULL, (char *)ep, "--draft-timeout-ms",
                    (char *)(tmo ? tmo : "10000"), NULL};
    return wait_exit(spawn(argv, tag), 60000);
}

/* 1 if `got` (ids) starts with ref's first 20 ids, as a speculative decode's output does. */
static int same_ids(const char *got, const char *ref) {
    const char *a = got, *b = ref;
    for (int k = 0; k < 20; k++) {
        char *ea, *eb;
        long x = strtol(a, &ea, 10), y = strtol(b, &eb, 10);
        if (ea == a || eb == b || x != y) return 0;
        a = ea;
        b = eb;
    }
    return 1;
}

/* ---- item 1: idle connection flood ---- */

/* With `ulimit -n 1024` about 1,100 idle DEALERs aborted a drafter on ipc:// inside libzmq
 * (EMFILE trips an assertion in its ipc listener). Here: a drafter limited to 48
 * descriptors (so the flood outruns its evictions at times: EMFILE must not abort it), 400
 * idle DEALERs kept connected (evicted ones reconnect: a steady flood);
 * it must stay up, serve a real target through the flood, and exit cleanly on SIGTERM,
 * removing its socket file. Bounded: 400 sockets, well under 45 s. */
START_TEST(test_idle_flood) {
    make_dir();
    struct rlimit rl;
    ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl); /* our own end of the flood needs ~2 fds a socket */
    int n = rl.rlim_max > 1200 ? 400 : (int)(rl.rlim_max - 200) / 2;
    ck_assert_msg(n > 300, "descriptor limit %llu too low for the flood test",
                  (unsigned long long)rl.rlim_max);
    char ep[300];
    snprintf(ep, sizeof ep, "ipc://%s/d.sock", g_dir);
    ck_assert_int_eq(run_target("ar", "ar", NULL, NULL), 0);
    pid_t d = start_drafter(ep, "draft", 48);
    uint64_t t0 = rs_now_ns();
    void *ctx = zmq_ctx_new();
    zmq_ctx_set(ctx, ZMQ_MAX_SOCKETS, n + 16);
    void **socks = calloc((size_t)n, sizeof *socks);
    int zero = 0;
    for (int i = 0; i < n; i++) {
        socks[i] = zmq_socket(ctx, ZMQ_DEALER);
        ck_assert_ptr_nonnull(socks[i]);
        zmq_setsockopt(socks[i], ZMQ_LINGER, &zero, sizeof zero);
        ck_assert_int_eq(zmq_connect(socks[i], ep), 0);
    }
    for (int t = 0; t < 20 && alive(d, "draft"); t++) usleep(100000); /* let them connect */
    ck_assert_msg(alive(d, "draft"), "the drafter died under %d idle connections", n);
    /* The target competes with 400 reconnecting peers for the drafter's 24 connection
     * slots: 0.4-5 s to its HELLO on 2 idle cores, so a loaded CI machine gets 30 s. */
    int rc = run_target("t", "rootdraw", ep, "30000");
    char *got = slurp("t", "out"), *ref = slurp("ar", "out"), *err = slurp("t", "err");
    ck_assert_msg(alive(d, "draft"), "the drafter died serving a target through the flood");
    ck_assert_msg(rc == 0 && !strstr(err, "drafter failed") && !strstr(err, "warning") &&
                      same_ids(got, ref),
                  "target through the flood: exit %d\n%s\n%s\nvs AR %s", rc, err, got, ref);
    for (int i = 0; i < n; i++) zmq_close(socks[i]);
    zmq_ctx_term(ctx);
    free(socks);
    kill(d, SIGTERM);
    ck_assert_int_eq(wait_exit(d, 10000), 0);
    double s = (rs_now_ns() - t0) * 1e-9;
    char *derr = slurp("draft", "err");
    ck_assert_msg(strstr(derr, "idle connection(s) closed"), "%s", derr);
    ck_assert_msg(access(ep + 6, F_OK) != 0, "socket file left after SIGTERM");
    ck_assert_msg(s < 45, "flood test took %.1f s", s);
    free(got);
    free(ref);
    free(err);
    free(derr);
    rm_dir();
}
END_TEST

/* ---- item 2: ipc paths that are not sockets; clean exit ---- */

/* --bind ipc://PATH used to delete a regular file at PATH (libzmq unlinks what it finds). */
START_TEST(test_ipc_bind_not_a_socket) {
    make_dir();
    char path[300], ep[320];
    snprintf(path, sizeof path, "%s/precious.txt", g_dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("keep me\n", f);
    fclose(f);
    snprintf(ep, sizeof ep, "ipc://%s", path);
    char *argv[] = {"build/rootspec-draft", "--bind", ep, "--model", TINY, NULL};
    int rc = wait_exit(spawn(argv, "d1"), 20000);
    char *err = slurp("d1", "err"), *keep = NULL;
    ck_assert_msg(rc == 2 && strstr(err, "exists and is a regular file, not a socket") &&
                      strstr(err, path),
                  "exit %d: %s", rc, err);
    RsErr e;
    ck_assert_int_eq(rs_read_file(path, &keep, NULL, &e), 0);
    ck_assert_str_eq(keep, "keep me\n");
    free(err);
    free(keep);
    /* a directory too */
    snprintf(ep, sizeof ep, "ipc://%s", g_dir);
    char *argv2[] = {"build/rootspec-draft", "--bind", ep, "--model", TINY, NULL};
    rc = wait_exit(spawn(argv2, "d2"), 20000);
    err = slurp("d2", "err");
    ck_assert_msg(rc == 2 && strstr(err, "is a directory, not a socket"), "exit %d: %s", rc, err);
    free(err);
    /* SIGINT: the socket file goes with the drafter */
    snprintf(ep, sizeof ep, "ipc://%s/ok.sock", g_dir);
    pid_t d = start_drafter(ep, "d3", 0);
    ck_assert_int_eq(access(ep + 6, F_OK), 0);
    kill(d, SIGINT);
    ck_assert_int_eq(wait_exit(d, 10000), 0);
    ck_assert_msg(access(ep + 6, F_OK) != 0, "socket file left after SIGINT");
    rm_dir();
}
END_TEST

/* ---- item 3: bench --out holding another run's files ---- */

static void put_file(const char *name, const char *text) {
    char p[400];
    snprintf(p, sizeof p, "%s/out/%s", g_dir, name);
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

START_TEST(test_bench_out_not_empty) {
    make_dir();
    char out[300], pf[300];
    snprintf(out, sizeof out, "%s/out", g_dir);
    snprintf(pf, sizeof pf, "%s/p.jsonl", g_dir);
    ck_assert_int_eq(mkdir(out, 0700), 0);
    FILE *f = fopen(pf, "w");
    fputs("{\"question_id\": 1, \"turns\": [\"Hi.\"]}\n", f);
    fclose(f);
    const char *rounds = "{\"not\":\"ours\"}\n";
    put_file("rounds.jsonl", rounds);
    put_file("decodes.csv", "prompt_id,prompt_pos,decoder,temp,budget,tokens,time_ns,speed,"
                            "rounds,mean_accepted,hit_eos,run_index\n");
    put_file("summary.md", "old\n");
    char *argv[] = {"build/rootspec-bench", "--model", TINY, "--draft-layers", "0", "--prompts",
                    pf, "--max-new", "4", "--decoders", "draft", "--temps", "0", "--budgets",
                    "8", "--warmup", "0", "--out", out, NULL};
    int rc = wait_exit(spawn(argv, "b"), 60000);
    char *err = slurp("b", "err");
    ck_assert_msg(rc == 2 && strstr(err, "is not empty") && strstr(err, out), "exit %d: %s", rc,
                  err);
    free(err);
    char p[400], *txt = NULL;
    RsErr e;
    snprintf(p, sizeof p, "%s/rounds.jsonl", out);
    ck_assert_int_eq(rs_read_file(p, &txt, NULL, &e), 0);
    ck_assert_str_eq(txt, rounds); /* not truncated */
    free(txt);
    snprintf(p, sizeof p, "%s/summary.md", out);
    ck_assert_int_eq(rs_read_file(p, &txt, NULL, &e), 0);
    ck_assert_str_eq(txt, "old\n");
    free(txt);
    snprintf(p, sizeof p, "%s/run.json", out);
    ck_assert(access(p, F_OK) != 0);
    rm_dir();
}
END_TEST

/* ---- a drafter stand-in: answers HELLO, then ERROR with chosen text to COMMIT_GROW ---- */

typedef struct {
    char ep[300];
    const char *error_text;
    uint64_t tok_hash;
    uint32_t vocab;
    volatile int stop, ready;
} Fake;

static void fake_reply(void *s, const uint8_t *id, size_t idl, const ProtoMsg *m) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    RsErr e = {0};
    ck_assert_int_eq(proto_encode(m, &sb, &e), 0);
    zmq_send(s, id, idl, ZMQ_SNDMORE);
    zmq_send(s, sb.data, sb.size, 0);
    msgpack_sbuffer_destroy(&sb);
}

static void *fake_main(void *arg) {
    Fake *f = arg;
    void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    RS_ASSERT(zmq_bind(s, f->ep) == 0);
    f->ready = 1;
    ProtoMsg req = {0};
    req.vocab_size = (int)f->vocab;
    while (!f->stop) {
        zmq_pollitem_t it = {.socket = s, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, 50) <= 0) continue;
        uint8_t id[256], buf[1 << 16];
        int idl = zmq_recv(s, id, sizeof id, 0), n = zmq_recv(s, buf, sizeof buf, 0);
        RsErr e = {0};
        if (idl < 0 || n < 0 || proto_decode(buf, (size_t)n, &req, &e)) continue;
        ProtoMsg rep = {0};
        if (req.type == PROTO_HELLO) {
            rep.type = PROTO_HELLO_OK;
            rep.session = req.session;
            rep.seq = req.seq;
            rep.u.hello_ok.tokenizer_hash = f->tok_hash;
            rep.u.hello_ok.vocab_size = f->vocab;
            rep.u.hello_ok.caps = PROTO_CAP_POOL_V1;
            snprintf(rep.u.hello_ok.name, sizeof rep.u.hello_ok.name, "fake");
        } else if (req.type == PROTO_COMMIT_GROW) {
            RsErr cause = {.code = RS_EPROTO};
            snprintf(cause.msg, sizeof cause.msg, "%s", f->error_text);
            proto_error_reply(&rep, &req, &cause);
        } else {
            continue;
        }
        fake_reply(s, id, (size_t)idl, &rep);
    }
    proto_msg_clear(&req);
    zmq_close(s);
    zmq_ctx_term(ctx);
    return NULL;
}

/* Runs a rootdraw target against a Fake answering COMMIT_GROW with `text`; returns stderr. */
static char *target_vs_fake(const char *text, int *rc) {
    Fake f = {.error_text = text};
    snprintf(f.ep, sizeof f.ep, "ipc://%s/fake.sock", g_dir);
    Model *m = NULL;
    Tokenizer *tok = NULL;
    RsErr e = {0};
    ck_assert_msg(model_load(TINY, &m, &e) == 0 && tokenizer_load_model(m, &tok, &e) == 0, "%s",
                  e.msg);
    f.vocab = (uint32_t)m->cfg.vocab_size;
    f.tok_hash = tokenizer_identity(tok, m->cfg.vocab_size);
    tokenizer_destroy(&tok);
    model_destroy(&m);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, fake_main, &f), 0);
    while (!f.ready) usleep(1000);
    *rc = run_target("tf", "rootdraw", f.ep, NULL);
    f.stop = 1;
    pthread_join(th, NULL);
    return slurp("tf", "err");
}

/* ---- item 6: terminal controls in a drafter's ERROR text ---- */

START_TEST(test_peer_text_escaped) {
    make_dir();
    int rc;
    char *err = target_vs_fake("\x1b[2J\x1b[H\rrootspec-target: decoder=ar emitted 999 tokens\n"
                               "rootspec-target: forged line", &rc);
    ck_assert_msg(rc == 0, "exit %d: %s", rc, err);
    ck_assert_msg(!strchr(err, 0x1b) && !strchr(err, '\r'), "raw controls reached stderr: %s", err);
    ck_assert_msg(!strstr(err, "\nrootspec-target: forged line") &&
                      strstr(err, "\\x1b[2J\\x1b[H\\x0drootspec-target: decoder=ar emitted 999 "
                                  "tokens\\x0arootspec-target: forged line"),
                  "%s", err);
    free(err);
    rm_dir();
}
END_TEST

/* ---- item 7: no drafter at start-up ---- */

/* It used to exit 1 with only "did not answer within N ms"; now, as when a drafter fails
 * mid-decode: AR with a warning naming both causes, exit 0, AR's ids. */
START_TEST(test_no_drafter_at_start) {
    make_dir();
    char ep[300];
    snprintf(ep, sizeof ep, "ipc://%s/nobody.sock", g_dir);
    ck_assert_int_eq(run_target("ar", "ar", NULL, NULL), 0);
    uint64_t t0 = rs_now_ns();
    int rc = run_target("t", "rootdraw", ep, "800");
    double s = (rs_now_ns() - t0) * 1e-9;
    char *err = slurp("t", "err"), *got = slurp("t", "out"), *ref = slurp("ar", "out");
    char want[400];
    snprintf(want, sizeof want, "warning: no answer: wrong server key or no drafter at %s", ep);
    ck_assert_msg(rc == 0 && strstr(err, want) && strstr(err, "decoding autoregressively") &&
                      strstr(err, "no drafter (decoded autoregressively)"),
                  "exit %d: %s", rc, err);
    ck_assert_msg(strcmp(got, ref) == 0, "%s vs AR %s", got, ref);
    ck_assert_msg(s < 20, "took %.1f s", s);
    free(err);
    free(got);
    free(ref);
    rm_dir();
}
END_TEST

/* ---- item 8: session takeover ---- */

static void hello(void *s, uint64_t session, uint32_t vocab, uint64_t hash) {
    ProtoMsg m = {0};
    m.type = PROTO_HELLO;
    m.session = session;
    m.seq = 1;
    m.u.hello.tokenizer_hash = hash;
    m.u.hello.vocab_size = vocab;
    m.u.hello.caps = PROTO_CAP_POOL_V1;
    m.u.hello.topk = POOL_TOPK;
    m.u.hello.depth = POOL_MAX_DEPTH;
    m.u.hello.expand = POOL_EXPAND;
    RsErr e = {0};
    ck_assert_int_eq(proto_send(s, &m, &e), 0);
}

static void expect_reply(void *s, ProtoMsg *in, ProtoType type) {
    RsErr e = {0};
    int rc = proto_recv(s, in, 5000, &e);
    ck_assert_msg(rc == 0 && in->type == type, "rc %d type %d (%s) %s", rc, in->type,
                  in->type == PROTO_ERROR ? in->u.error.message : "", e.msg);
}

/* Any client's HELLO replaces the session (the ipc trust model, PROTOCOL.md): the replaced
 * target now hears why ("session taken over ..."), and 400 takeovers log a few lines, not
 * 400. The target side: a decode told so reports it in its summary. */
START_TEST(test_takeover_reported_and_rate_limited) {
    make_dir();
    char ep[300];
    snprintf(ep, sizeof ep, "ipc://%s/d.sock", g_dir);
    pid_t d = start_drafter(ep, "draft", 0);
    Model *m = NULL;
    Tokenizer *tok = NULL;
    RsErr e = {0};
    ck_assert_msg(model_load(TINY, &m, &e) == 0 && tokenizer_load_model(m, &tok, &e) == 0, "%s",
                  e.msg);
    uint32_t V = (uint32_t)m->cfg.vocab_size;
    uint64_t H = tokenizer_identity(tok, m->cfg.vocab_size);
    tokenizer_destroy(&tok);
    model_destroy(&m);
    void *ctx = zmq_ctx_new(), *a = zmq_socket(ctx, ZMQ_DEALER), *b = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(a, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(b, ZMQ_LINGER, &zero, sizeof zero);
    ck_assert_int_eq(zmq_connect(a, ep), 0);
    ck_assert_int_eq(zmq_connect(b, ep), 0);
    ProtoMsg in = {0};
    in.vocab_size = (int)V;
    hello(a, 1, V, H);
    expect_reply(a, &in, PROTO_HELLO_OK);
    hello(b, 2, V, H);
    expect_reply(b, &in, PROTO_HELLO_OK);
    ProtoMsg g = {0};
    int32_t token = 5;
    g.type = PROTO_COMMIT_GROW;
    g.session = 1;
    g.seq = 2;
    g.u.tokens.ids = &token;
    g.u.tokens.n = 1;
    ck_assert_int_eq(proto_send(a, &g, &e), 0);
    expect_reply(a, &in, PROTO_ERROR);
    ck_assert_msg(!strncmp(in.u.error.message, PROTO_TAKEN_OVER, strlen(PROTO_TAKEN_OVER)), "%s",
                  in.u.error.message);
    for (int i = 0; i < 400; i++) { /* each HELLO displaces the other socket's session */
        void *s = i % 2 ? b : a;
        hello(s, 10 + (uint64_t)i, V, H);
        expect_reply(s, &in, PROTO_HELLO_OK);
    }
    proto_msg_clear(&in);
    zmq_close(a);
    zmq_close(b);
    zmq_ctx_term(ctx);
    kill(d, SIGTERM);
    ck_assert_int_eq(wait_exit(d, 10000), 0);
    char *derr = slurp("draft", "err");
    int lines = 0;
    for (const char *p = derr; (p = strstr(p, "replaces the old one")); p++) lines++;
    ck_assert_msg(lines >= 1 && lines <= 5 && strstr(derr, "(401 in all)"),
                  "%d takeover lines:\n%.800s", lines, derr);
    free(derr);
    /* the target told its session was taken over says so in its summary */
    int rc;
    char *err = target_vs_fake(PROTO_TAKEN_OVER " (its HELLO replaced this session)", &rc);
    ck_assert_msg(rc == 0 && strstr(err, "SESSION TAKEN OVER by another client"), "exit %d: %s",
                  rc, err);
    free(err);
    rm_dir();
}
END_TEST

/* ---- item 9: key files ---- */

START_TEST(test_key_files) {
    make_dir();
    char keys[300], p[400], target[400];
    snprintf(keys, sizeof keys, "%s/keys", g_dir);
    ck_assert_int_eq(mkdir(keys, 0700), 0);
    /* a dangling symlink at the secret key's path is not followed */
    snprintf(p, sizeof p, "%s/server.key", keys);
    snprintf(target, sizeof target, "%s/planted", g_dir);
    ck_assert_int_eq(symlink(target, p), 0);
    char *gen[] = {"build/rootspec-draft", "--gen-keys", keys, NULL};
    int rc = wait_exit(spawn(gen, "g1"), 10000);
    char *err = slurp("g1", "err");
    ck_assert_msg(rc == 2 && strstr(err, "exists already"), "exit %d: %s", rc, err);
    ck_assert_msg(access(target, F_OK) != 0, "the symlink was followed");
    free(err);
    ck_assert_int_eq(unlink(p), 0);
    mode_t old = umask(0); /* the mode must come from the code, not the umask */
    rc = wait_exit(spawn(gen, "g2"), 10000);
    umask(old);
    ck_assert_int_eq(rc, 0);
    const char *names[] = {"server.key", "client.key", "server.pub", "client.pub"};
    for (int i = 0; i < 4; i++) {
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", keys, names[i]);
        ck_assert_int_eq(lstat(p, &st), 0);
        ck_assert_msg((st.st_mode & 0777) == (i < 2 ? 0600 : 0644), "%s has mode %o", names[i],
                      st.st_mode & 0777);
    }
    /* a world-readable secret key is warned about */
    snprintf(p, sizeof p, "%s/server.key", keys);
    ck_assert_int_eq(chmod(p, 0644), 0);
    int port = 21000 + (int)(getpid() % 20000);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    char *srv[] = {"build/rootspec-draft", "--model", TINY, "--draft-layers", "0", "--bind", ep,
                   "--curve-dir", keys, NULL};
    pid_t d = spawn(srv, "d");
    wait_serving(d, "d");
    kill(d, SIGTERM);
    ck_assert_int_eq(wait_exit(d, 10000), 0);
    err = slurp("d", "err");
    ck_assert_msg(strstr(err, "warning: secret key file") && strstr(err, p) &&
                      strstr(err, "mode 0644"),
                  "%s", err);
    free(err);
    rm_dir();
}
END_TEST

/* ---- item 6, the escaper itself ---- */

START_TEST(test_rs_escape) {
    char b[64];
    ck_assert_str_eq(rs_escape(b, sizeof b, "a\x1b[2Jb\r\n\\", 9, 0), "a\\x1b[2Jb\\x0d\\x0a\\x5c");
    ck_assert_str_eq(rs_escape(b, sizeof b, "say \"hi\"", 8, 1), "say \\x22hi\\x22");
    ck_assert_str_eq(rs_escape_str(b, sizeof b, "caf\xc3\xa9 \xe2\x82\xac"), "caf\xc3\xa9 \xe2\x82\xac");
    /* C1 CSI (U+009B), a lone continuation byte, an overlong '/', a raw 0x9b, DEL */
    ck_assert_str_eq(rs_escape_str(b, sizeof b, "\xc2\x9b\x80\xc0\xaf\x9b\x7f"),
                     "\\xc2\\x9b\\x80\\xc0\\xaf\\x9b\\x7f");
    char small[12];
    ck_assert_str_eq(rs_escape_str(small, sizeof small, "\x01\x02\x03"), "\\x01\\x02...");
    ck_assert_str_eq(rs_escape_str(b, sizeof b, NULL), "");
    char four[4]; /* an exact fit is not cut */
    ck_assert_str_eq(rs_escape_str(four, sizeof four, "abc"), "abc");
    ck_assert_str_eq(rs_escape_str(four, sizeof four, "abcd"), "...");
}
END_TEST

/* ---- item 10: missing inputs are bad input, exit 2 ---- */

START_TEST(test_missing_inputs_exit_2) {
    make_dir();
    char hf[300], p[400], src[PATH_MAX], keys[300];
    snprintf(hf, sizeof hf, "%s/hf", g_dir);
    ck_assert_int_eq(mkdir(hf, 0700), 0);
    char *t1[] = {"build/rootspec-target", "--model", hf, "--prompt", "hi", NULL};
    ck_assert_int_eq(wait_exit(spawn(t1, "noconfig"), 20000), 2); /* no config.json */
    const char *names[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "golden/llama3_rope/%s", names[i]);
        ck_assert_ptr_nonnull(realpath(tu_fixture(rel), src));
        snprintf(p, sizeof p, "%s/%s", hf, names[i]);
        ck_assert_int_eq(symlink(src, p), 0);
    }
    ck_assert_int_eq(wait_exit(spawn(t1, "notok"), 20000), 2); /* no tokenizer.json */
    char *err = slurp("notok", "err");
    ck_assert_msg(strstr(err, "tokenizer.json' does not exist"), "%s", err);
    free(err);
    snprintf(p, sizeof p, "%s/none.gguf", g_dir);
    char *t2[] = {"build/rootspec-target", "--model", p, "--prompt", "hi", NULL};
    ck_assert_int_eq(wait_exit(spawn(t2, "nomodel"), 20000), 2);
    snprintf(keys, sizeof keys, "%s/keys", g_dir); /* a key directory without keys */
    ck_assert_int_eq(mkdir(keys, 0700), 0);
    char *d[] = {"build/rootspec-draft", "--model", TINY, "--bind", "tcp://127.0.0.1:1",
                 "--curve-dir", keys, NULL};
    ck_assert_int_eq(wait_exit(spawn(d, "dkey"), 20000), 2);
    err = slurp("dkey", "err");
    ck_assert_msg(strstr(err, "server.key' does not exist"), "%s", err);
    free(err);
    char *t3[] = {"build/rootspec-target", "--model", TINY, "--prompt-ids", PROMPT, "--decoder",
                  "rootdraw", "--draft-endpoint", "tcp://127.0.0.1:1", "--curve-dir", keys, NULL};
    ck_assert_int_eq(wait_exit(spawn(t3, "tkey"), 20000), 2);
    rm_dir();
}
END_TEST

Suite *suite_hardening(void) {
    Suite *s = suite_create("hardening");
    TCase *tc = tcase_create("programs");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_idle_flood);
    tcase_add_test(tc, test_ipc_bind_not_a_socket);
    tcase_add_test(tc, test_bench_out_not_empty);
    tcase_add_test(tc, test_peer_text_escaped);
    tcase_add_test(tc, test_no_drafter_at_start);
    tcase_add_test(tc, test_takeover_reported_and_rate_limited);
    tcase_add_test(tc, test_key_files);
    tcase_add_test(tc, test_rs_escape);
    tcase_add_test(tc, test_missing_inputs_exit_2);
    suite_add_tcase(s, tc);
    return s;
}
