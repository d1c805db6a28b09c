/* Drafter request loop. ROUTER framing: [peer identity, payload]; the payload is one
 * proto message. Anything else (extra frames, garbage, wrong version, a request outside
 * the current session) gets an ERROR reply to that peer; the loop never exits on bad input.
 * The state lives in one Session, one Seq per sequence id it holds; each message type has
 * its handler (on_*), and the loop only reads a request and dispatches it. */
#include "draft_server.h"
#include "proto/proto.h"
#include "proto/secure.h"
#include "draft_server_guard.h"
#include <inttypes.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

/* A sequence of the session: its drafter and whether its context is known. */
typedef struct {
    uint32_t sid;
    int used;    /* holds sequence sid */
    Drafter *d;  /* seqs[0]: the borrowed drafter, kept while unused; others: open_seq's,
                    freed with the sequence */
    /* Set when the context may differ from the target's: a COMMIT_GROW or RESET that
     * failed, or a frame of the sequence that could not be decoded (its tokens are lost).
     * COMMIT_GROW is refused until RESET or HELLO starts the context again. */
    int ctx_lost;
    char ctx_lost_why[256];
} Seq;

typedef struct {
    /* the service */
    Seq *seqs; // (n_seqs)
    int n_seqs;
    Seq *cur;  /* the request's sequence (its handler's) */
    const DrafterInfo *info;
    uint64_t tok_hash;
    const DraftServerOpts *o;
    void *zctx, *sock;
    int use_curve;
    DraftServerGuard *guard;   /* ipc path, connection bound, takeover log (server_guard.h) */
    msgpack_sbuffer sb;
    Pool *pool;           /* COMMIT_GROW's pool, sent from here */
    float *feat;          // (feat_cap) the request's features widened to f32
    size_t feat_cap;
    int served;           /* requests decoded (well-formed or not) */
    /* the request being served */
    uint8_t peer[256];
    size_t peer_len;
    int srcfd;            /* the request's connection (ZMQ_SRCFD) */
    ProtoMsg req, rep;
    int same_peer;        /* from the session's peer */
    /* the target session: one at a time, a new HELLO takes over */
    int have_session;
    uint8_t sess_peer[256];
    size_t sess_peer_len;
    uint64_t session;
} Session;

/* Sends m to the current request's peer. */
static int send_reply(Session *s, const ProtoMsg *m) {
    RsErr e = {0};
    msgpack_sbuffer_clear(&s->sb);
    if (proto_encode(m, &s->sb, &e) != 0) {
        fprintf(stderr, "rootspec-draft: cannot encode reply: %s\n", e.msg);
        return -1;
    }
    if (zmq_send(s->sock, s->peer, s->peer_len, ZMQ_SNDMORE) < 0) return -1;
    return zmq_send(s->sock, s->sb.data, s->sb.size, 0) < 0 ? -1 : 0;
}

/* req: the request's header for the reply's session/seq; NULL when none was readable. */
static void reply_error(Session *s, const ProtoMsg *req, int code, const char *msg) {
    ProtoMsg r = {0};
    RsErr cause = {.code = code};
    snprintf(cause.msg, sizeof cause.msg, "%s", msg);
    proto_error_reply(&r, req, &cause);
    send_reply(s, &r);
}

/* s->rep, cleared, as the reply of `type` to the current request. */
static ProtoMsg *start_reply(Session *s, ProtoType type) {
    memset(&s->rep, 0, sizeof s->rep);
    s->rep.type = type;
    s->rep.session = s->req.session;
    s->rep.seq = s->req.seq;
    s->rep.sid = s->req.sid;
    return &s->rep;
}

static void lose_context(Session *s, const char *what) {
    s->cur->ctx_lost = 1;
    snprintf(s->cur->ctx_lost_why, sizeof s->cur->ctx_lost_why, "%s seq %" PRIu64 " failed",
             what, s->req.seq);
}

/* ---- the session's sequences ------------------------------------------------------------- */

/* Frees sequence q: an opened drafter goes, the borrowed one is reset for the next. */
static void seq_free(Seq *q) {
    RsErr ignored = {0};
    if (q->d && q->used) drafter_reset(q->d, NULL, 0, NULL, 0, &ignored);
    q->used = 0;
    q->ctx_lost = 0;
}

static void seqs_free_all(Session *s) {
    for (int i = 0; i < s->n_seqs; i++) {
        seq_free(&s->seqs[i]);
        if (i > 0) drafter_destroy(&s->seqs[i].d);
    }
}

static Seq *seq_find(Session *s, uint32_t sid) {
    for (int i = 0; i < s->n_seqs; i++)
        if (s->seqs[i].used && s->seqs[i].sid == sid) return &s->seqs[i];
    return NULL;
}

/* The request's sequence, made on its first message; NULL (after an ERROR reply) when the
 * session holds max_seqs already or the drafter cannot be made. */
static Seq *seq_get(Session *s) {
    uint32_t sid = s->req.sid;
    Seq *q = seq_find(s, sid);
    for (int i = 0; !q && i < s->n_seqs; i++)
        if (!s->seqs[i].used) q = &s->seqs[i];
    if (!q) {
        char t[300];
        snprintf(t, sizeof t, "sequence %" PRIu32 ": the drafter holds %d sequences already "
                 "(rootspec-draft --max-seqs %d): CLOSE one first", sid, s->n_seqs, s->n_seqs);
        reply_error(s, &s->req, RS_EFULL, t);
        return NULL;
    }
    if (!q->used && !q->d) {
        RsErr oe = {0};
        if (s->o->open_seq(s->o->open_arg, &q->d, &oe)) {
            char t[1100];
            snprintf(t, sizeof t, "sequence %" PRIu32 ": cannot open its drafter: %s", sid, oe.msg);
            reply_error(s, &s->req, oe.code ? oe.code : RS_EIO, t);
            return NULL;
        }
    }
    if (!q->used) *q = (Seq){.sid = sid, .used = 1, .d = q->d};
    return q;
}

/* ---- one handler per message type ------------------------------------------------------- */

/* Why a HELLO cannot be served ("" when it can). */
static void hello_refusal(const Session *s, char *why, size_t cap) {
    const ProtoHello *h = &s->req.u.hello;
    int vocab = s->info->vocab_size;
    *why = 0;
    if (h->vocab_size != (uint32_t)vocab || h->tokenizer_hash != s->tok_hash)
        snprintf(why, cap,
                 "tokenizer mismatch: target vocab %u (tokenizer %016" PRIx64
                 "), drafter vocab %d (tokenizer %016" PRIx64 ")",
                 h->vocab_size, h->tokenizer_hash, vocab, s->tok_hash);
    else if (h->topk != POOL_TOPK || h->depth != POOL_MAX_DEPTH || h->expand != POOL_EXPAND)
        snprintf(why, cap, "pool shape %u/%u/%u requested, drafter grows %d/%d/%d", h->topk,
                 h->depth, h->expand, POOL_TOPK, POOL_MAX_DEPTH, POOL_EXPAND);
    else if (s->info->n_feature_layers > 0 && !(h->caps & PROTO_CAP_FEATURES))
        snprintf(why, cap, "drafter %s needs the target's features (an EAGLE-3 head), target's "
                 "HELLO capabilities 0x%x lack FEATURES (0x%x)", s->info->name, h->caps,
                 PROTO_CAP_FEATURES);
}

/* HELLO: checks the target's vocabulary, tokenizer and pool shape, then starts a session
 * with an empty context (taking over from any other target). */
static void on_hello(Session *s) {
    char why[512];
    hello_refusal(s, why, sizeof why);
    if (*why) {
        fprintf(stderr, "rootspec-draft: refused HELLO: %s\n", why);
        reply_error(s, &s->req, RS_EPEER, why);
        return;
    }
    draft_server_guard_hello(s->guard, s->srcfd, s->have_session && !s->same_peer, s->session);
    memcpy(s->sess_peer, s->peer, s->peer_len);
    s->sess_peer_len = s->peer_len;
    s->session = s->req.session;
    s->have_session = 1;
    seqs_free_all(s); /* the new peer's sequences start empty */
    RsErr re = {0};
    int rc = drafter_reset(s->seqs[0].d, NULL, 0, NULL, 0, &re);
    if (rc) { /* a remote drafter behind this one may fail; a model drafter cannot */
        reply_error(s, &s->req, rc, re.msg);
        return;
    }
    ProtoHelloOk *h = &start_reply(s, PROTO_HELLO_OK)->u.hello_ok;
    snprintf(h->fingerprint, sizeof h->fingerprint, "%s", s->info->fingerprint);
    h->tokenizer_hash = s->tok_hash;
    h->vocab_size = (uint32_t)s->info->vocab_size;
    h->caps = PROTO_CAP_POOL_V1 | s->o->caps;
    snprintf(h->name, sizeof h->name, "%s", s->o->name ? s->o->name : "rootspec-draft");
    h->n_feat_layers = s->info->n_feature_layers;
    memcpy(h->feat_layers, s->info->feature_layers, sizeof(int) * (size_t)h->n_feat_layers);
    if (h->n_feat_layers) h->caps |= PROTO_CAP_FEATURES;
    send_reply(s, &s->rep);
}

/* RESET, APPEND and COMMIT_GROW belong to the session and to a sequence, which s->cur
 * names; 0 (after an ERROR reply) when not. */
static int in_session(Session *s) {
    if (!(s->same_peer && s->req.session == s->session)) {
        reply_error(s, &s->req, RS_EPROTO, draft_server_guard_no_session(s->guard, s->req.session));
        return 0;
    }
    return (s->cur = seq_get(s)) != NULL;
}

/* The request's features as f32 in s->feat (*bytes 0 and NULL when it has none). */
static const float *request_features(Session *s, size_t *bytes) {
    const ProtoTokens *t = &s->req.u.tokens;
    size_t n = (size_t)t->n * (size_t)t->feat_width;
    *bytes = 0;
    if (t->feat_type == PROTO_FEAT_NONE || n == 0) return NULL;
    if (n > s->feat_cap) {
        free(s->feat);
        s->feat = rs_xmalloc(n * sizeof(float)); /* bounded by PROTO_MAX_FEAT_BYTES x 2 */
        s->feat_cap = n;
    }
    proto_feat_to_f32(t->feat_type, t->feat, s->feat, n);
    *bytes = n * sizeof(float);
    return s->feat;
}

/* RESET: drops the context and prefills the new prompt; no reply unless it fails. */
static void on_reset(Session *s) {
    if (!in_session(s)) return;
    Drafter *d = s->cur->d;
    s->cur->ctx_lost = 0;
    RsErr ge = {0};
    size_t fb;
    const float *f = request_features(s, &fb);
    int rc = drafter_reset(d, s->req.u.tokens.ids, s->req.u.tokens.n, f, fb, &ge);
    if (rc) {
        RsErr ignored = {0};
        drafter_reset(d, NULL, 0, NULL, 0, &ignored); /* no unknown prefix left behind */
        lose_context(s, "RESET");
        reply_error(s, &s->req, rc, ge.msg);
    }
}

/* 1 (after an ERROR reply) when an earlier failure lost the context: only RESET helps. */
static int refuse_lost(Session *s) {
    if (!s->cur->ctx_lost) return 0;
    char t[400];
    snprintf(t, sizeof t, "drafter context lost (%s): send RESET with the prompt, then %s",
             s->cur->ctx_lost_why, proto_type_name(s->req.type));
    reply_error(s, &s->req, RS_EPROTO, t);
    return 1;
}

/* APPEND: the next part of a context too long for one message; no reply unless it fails. */
static void on_append(Session *s) {
    if (!in_session(s) || refuse_lost(s)) return;
    RsErr ge = {0};
    size_t fb;
    const float *f = request_features(s, &fb);
    int rc = drafter_append(s->cur->d, s->req.u.tokens.ids, s->req.u.tokens.n, f, fb, &ge);
    if (rc) {
        lose_context(s, "APPEND");
        reply_error(s, &s->req, rc, ge.msg);
    }
}

/* drafter_ahead's stop: a frame waits, or the server is told to stop. */
static int request_waiting(void *arg) {
    Session *s = arg;
    zmq_pollitem_t it = {.socket = s->sock, .events = ZMQ_POLLIN};
    return (s->o->stop && *s->o->stop) || zmq_poll(&it, 1, 0) != 0;
}

/* COMMIT_GROW: commits the round's tokens and answers with the pool grown below them; then
 * the drafter runs ahead while the target verifies. */
static void on_commit_grow(Session *s) {
    if (!in_session(s) || refuse_lost(s)) return;
    RsErr ge = {0};
    size_t fb;
    const float *f = request_features(s, &fb);
    Drafter *d = s->cur->d;
    int depth = s->req.u.tokens.depth, width = s->req.u.tokens.width;
    drafter_set_shape(d, depth ? depth : POOL_MAX_DEPTH, width ? width : POOL_EXPAND);
    int rc = drafter_grow(d, s->req.u.tokens.ids, s->req.u.tokens.n, f, fb, s->pool, &ge);
    if (rc) {
        lose_context(s, "COMMIT_GROW");
        reply_error(s, &s->req, rc, ge.msg);
        return;
    }
    ProtoMsg *r = start_reply(s, PROTO_POOL);
    r->u.pool.pool = s->pool;
    r->u.pool.commit_pass_ns = s->pool->commit_pass_ns;
    if (send_reply(s, r) == RS_OK && !s->o->no_ahead) drafter_ahead(d, request_waiting, s);
}

/* CLOSE: the sequence ended; its drafter goes (a sequence not held is not an error, so a
 * target may close after a takeover or a failure without knowing what the drafter kept). */
static void on_close(Session *s) {
    if (!(s->same_peer && s->req.session == s->session)) {
        reply_error(s, &s->req, RS_EPROTO, draft_server_guard_no_session(s->guard, s->req.session));
        return;
    }
    Seq *q = seq_find(s, s->req.sid);
    if (!q) return;
    seq_free(q);
    if (q != &s->seqs[0]) drafter_destroy(&q->d);
}

/* BYE: answered with BYE; ends the session when it is the session's peer's. */
static void on_bye(Session *s) {
    send_reply(s, start_reply(s, PROTO_BYE));
    if (s->same_peer) s->have_session = 0;
}

static void on_unexpected(Session *s) {
    char t[96];
    snprintf(t, sizeof t, "unexpected %s message from a target", proto_type_name(s->req.type));
    reply_error(s, &s->req, RS_EPROTO, t);
}

/* A frame that did not decode: ERROR reply; if it was the session's, its tokens are lost. */
static void on_bad_frame(Session *s, int rc, const RsErr *de) {
    fprintf(stderr, "rootspec-draft: rejected frame: %s\n", de->msg);
    Seq *q = s->same_peer && s->req.session == s->session ? seq_find(s, s->req.sid) : NULL;
    if (q && !q->ctx_lost) {
        q->ctx_lost = 1;
        snprintf(q->ctx_lost_why, sizeof q->ctx_lost_why, "a frame was rejected (seq %" PRIu64 ")",
                 s->req.seq);
    }
    reply_error(s, &s->req, rc, de->msg);
}

static void dispatch(Session *s) {
    switch (s->req.type) {
    case PROTO_HELLO: on_hello(s); break;
    case PROTO_RESET: on_reset(s); break;
    case PROTO_COMMIT_GROW: on_commit_grow(s); break;
    case PROTO_APPEND: on_append(s); break;
    case PROTO_BYE: on_bye(s); break;
    case PROTO_CLOSE: on_close(s); break;
    default: on_unexpected(s);
    }
}

/* ---- reading requests ------------------------------------------------------------------ */

/* Drains the frames after `msg`; returns how many there were. */
static int drain_extra_frames(Session *s, zmq_msg_t *msg) {
    int extra = 0;
    while (zmq_msg_more(msg)) {
        zmq_msg_t junk;
        zmq_msg_init(&junk);
        zmq_msg_recv(&junk, s->sock, 0);
        extra++;
        int more = zmq_msg_more(&junk);
        zmq_msg_close(&junk);
        if (!more) break;
    }
    return extra;
}

typedef enum { REQ_NONE, REQ_ANSWERED, REQ_READY } ReqStatus;

/* Reads one [identity, payload] request into s->peer and s->req. REQ_NONE: nothing to
 * serve; REQ_ANSWERED: a malformed request, answered with ERROR; REQ_READY: dispatch it.
 * served counts ANSWERED and READY requests that reached the decoder. */
static ReqStatus next_request(Session *s) {
    int pl = zmq_recv(s->sock, s->peer, sizeof s->peer, ZMQ_DONTWAIT); /* frame 1: identity */
    if (pl < 0) return REQ_NONE;
    s->peer_len = (size_t)pl < sizeof s->peer ? (size_t)pl : sizeof s->peer;
    int more = 0;
    size_t ml = sizeof more;
    zmq_getsockopt(s->sock, ZMQ_RCVMORE, &more, &ml);
    if (!more) return REQ_NONE;
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    zmq_msg_recv(&msg, s->sock, 0);
    s->srcfd = zmq_msg_get(&msg, ZMQ_SRCFD);
    draft_server_guard_seen(s->guard, s->srcfd);
    int extra = drain_extra_frames(s, &msg);
    if (extra) {
        zmq_msg_close(&msg);
        char t[128];
        snprintf(t, sizeof t, "multi-part message (%d frames), expected one frame", extra + 1);
        reply_error(s, NULL, RS_EPROTO, t);
        return REQ_ANSWERED;
    }
    RsErr de = {0};
    int rc = proto_decode(zmq_msg_data(&msg), zmq_msg_size(&msg), &s->req, &de);
    zmq_msg_close(&msg);
    s->served++;
    s->same_peer = s->have_session && s->peer_len == s->sess_peer_len &&
                   !memcmp(s->peer, s->sess_peer, s->peer_len);
    if (rc) {
        on_bad_frame(s, rc, &de);
        return REQ_ANSWERED;
    }
    return REQ_READY;
}

/* ---- set-up ------------------------------------------------------------------------------ */

/* 1 if something accepts connections on the unix socket at path. libzmq's ipc bind unlinks
 * an existing socket file, which would silently orphan a drafter already serving there. */
static int ipc_in_use(const char *path) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof a.sun_path) return 0; /* zmq_bind reports it */
    memcpy(a.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    int used = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return used;
}

/* The ROUTER socket, bound to o->endpoint (with CURVE on tcp:// when keys are given). */
static int open_socket(Session *s, RsErr *e) {
    const DraftServerOpts *o = s->o;
    s->zctx = proto_ctx_new();
    s->sock = zmq_socket(s->zctx, ZMQ_ROUTER);
    int zero = 0, one = 1, rc;
    zmq_setsockopt(s->sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s->sock, ZMQ_ROUTER_HANDOVER, &one, sizeof one);
    int64_t max_frame = PROTO_FRAME_MAX; /* a peer cannot make us buffer more */
    zmq_setsockopt(s->sock, ZMQ_MAXMSGSIZE, &max_frame, sizeof max_frame);
    s->use_curve = o->curve_dir && !strncmp(o->endpoint, "tcp://", 6);
    if (s->use_curve && (rc = secure_server_setup(s->zctx, s->sock, o->curve_dir, e))) return rc;
    if (!strncmp(o->endpoint, "ipc://", 6) && ipc_in_use(o->endpoint + 6))
        return rs_err(e, RS_EIO,
                      "cannot bind '%s': another process is serving on that socket (stop it or "
                      "choose another path)",
                      o->endpoint);
    if ((rc = draft_server_guard_create(s->zctx, s->sock, o->endpoint, &s->guard, e))) return rc;
    if (zmq_bind(s->sock, o->endpoint) != 0)
        return rs_err(e, RS_EIO, "cannot bind '%s': %s", o->endpoint, zmq_strerror(zmq_errno()));
    draft_server_guard_bound(s->guard);
    return RS_OK;
}

static void close_socket(Session *s) {
    draft_server_guard_destroy(&s->guard); /* before the socket it monitors */
    zmq_close(s->sock);
    zmq_ctx_shutdown(s->zctx);
    if (s->use_curve) secure_server_shutdown();
    zmq_ctx_term(s->zctx);
}

static void announce(const Session *s) {
    char bound[512] = "";
    size_t bl = sizeof bound;
    if (zmq_getsockopt(s->sock, ZMQ_LAST_ENDPOINT, bound, &bl) != 0 || !*bound)
        snprintf(bound, sizeof bound, "%s", s->o->endpoint);
    fprintf(stderr, "rootspec-draft: serving %s on %s (vocab %d)\n", s->info->name, bound,
            s->info->vocab_size);
}

int draft_server_run(Drafter *d, uint64_t tok_hash, const DraftServerOpts *o, RsErr *e) {
    int rc = secure_check_endpoint(o->endpoint, o->insecure, o->curve_dir, e);
    if (rc) return rc;
    Session s = {.info = drafter_info(d), .tok_hash = tok_hash, .o = o};
    s.n_seqs = o->open_seq && o->max_seqs > 1 ? o->max_seqs : 1;
    s.seqs = rs_xcalloc((size_t)s.n_seqs, sizeof *s.seqs);
    s.seqs[0].d = d;
    rc = open_socket(&s, e);
    if (rc) {
        close_socket(&s);
        free(s.seqs);
        return rc;
    }
    msgpack_sbuffer_init(&s.sb);
    s.pool = rs_xmalloc(sizeof(Pool));
    s.req.vocab_size = s.info->vocab_size;
    announce(&s);
    while (!(o->stop && *o->stop)) {
        zmq_pollitem_t it = {.socket = s.sock, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, 200) <= 0) continue;
        if (next_request(&s) != REQ_READY) continue;
        dispatch(&s);
        if (o->max_requests > 0 && s.served >= o->max_requests) break;
    }
    seqs_free_all(&s);
    free(s.seqs);
    free(s.pool);
    free(s.feat);
    proto_msg_clear(&s.req);
    msgpack_sbuffer_destroy(&s.sb);
    close_socket(&s);
    return RS_OK;
}
