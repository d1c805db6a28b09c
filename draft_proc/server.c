/* Drafter request loop. ROUTER framing: [peer identity, payload]; the payload is one
 * proto message. Anything else (extra frames, garbage, wrong version, a request outside
 * the current session) gets an ERROR reply to that peer; the loop never exits on bad input. */
#include "server.h"
#include "proto/proto.h"
#include "proto/secure.h"
#include <inttypes.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

typedef struct {
    void *sock;
    uint8_t peer[256];
    size_t peer_len;
    msgpack_sbuffer sb;
} Conn;

static int send_to(Conn *c, const uint8_t *peer, size_t peer_len, const ProtoMsg *m) {
    RsErr e = {0};
    msgpack_sbuffer_clear(&c->sb);
    if (proto_encode(m, &c->sb, &e) != 0) {
        fprintf(stderr, "rootspec-draft: cannot encode reply: %s\n", e.msg);
        return -1;
    }
    if (zmq_send(c->sock, peer, peer_len, ZMQ_SNDMORE) < 0) return -1;
    return zmq_send(c->sock, c->sb.data, c->sb.size, 0) < 0 ? -1 : 0;
}

static void reply_error(Conn *c, const uint8_t *peer, size_t plen, const ProtoMsg *req, int code,
                        const char *msg) {
    ProtoMsg r = {0};
    RsErr cause = {.code = code};
    snprintf(cause.msg, sizeof cause.msg, "%s", msg);
    proto_error_reply(&r, req, &cause);
    send_to(c, peer, plen, &r);
}

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

int server_run(Drafter *d, uint64_t tok_hash, const ServerOpts *o, RsErr *e) {
    int rc = secure_check_endpoint(o->endpoint, o->insecure, o->curve_dir, e);
    if (rc) return rc;
    void *ctx = zmq_ctx_new();
    Conn c = {0};
    c.sock = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0, one = 1;
    zmq_setsockopt(c.sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(c.sock, ZMQ_ROUTER_HANDOVER, &one, sizeof one);
    int64_t max_frame = PROTO_FRAME_MAX; /* a peer cannot make us buffer more */
    zmq_setsockopt(c.sock, ZMQ_MAXMSGSIZE, &max_frame, sizeof max_frame);
    int use_curve = o->curve_dir && !strncmp(o->endpoint, "tcp://", 6);
    if (use_curve && (rc = secure_server_setup(ctx, c.sock, o->curve_dir, e))) goto done;
    if (!strncmp(o->endpoint, "ipc://", 6) && ipc_in_use(o->endpoint + 6)) {
        rc = rs_err(e, RS_EIO,
                    "cannot bind '%s': another process is serving on that socket (stop it or "
                    "choose another path)",
                    o->endpoint);
        goto done;
    }
    if (zmq_bind(c.sock, o->endpoint) != 0) {
        rc = rs_err(e, RS_EIO, "cannot bind '%s': %s", o->endpoint, zmq_strerror(zmq_errno()));
        goto done;
    }
    msgpack_sbuffer_init(&c.sb);
    const DrafterInfo *info = drafter_info(d);
    int vocab = info->vocab_size;
    Pool *pool = rs_xmalloc(sizeof(Pool));
    ProtoMsg req = {0}, rep = {0};
    req.vocab_size = vocab;
    uint8_t sess_peer[256];
    size_t sess_peer_len = 0;
    uint64_t session = 0;
    int have_session = 0, served = 0;
    /* Set when the session's context may differ from the target's: a COMMIT_GROW or RESET
     * that failed, or a frame of the session that could not be decoded (its tokens are
     * lost). COMMIT_GROW is refused until RESET or HELLO starts the context again. */
    int ctx_lost = 0;
    char ctx_lost_why[256] = "";
    char bound[512] = "";
    size_t bl = sizeof bound;
    if (zmq_getsockopt(c.sock, ZMQ_LAST_ENDPOINT, bound, &bl) != 0 || !*bound)
        snprintf(bound, sizeof bound, "%s", o->endpoint);
    fprintf(stderr, "rootspec-draft: serving %s on %s (vocab %d)\n", info->name, bound, vocab);
    while (!(o->stop && *o->stop)) {
        zmq_pollitem_t it = {.socket = c.sock, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, 200) <= 0) continue;
        /* frame 1: identity */
        uint8_t peer[256];
        int pl = zmq_recv(c.sock, peer, sizeof peer, ZMQ_DONTWAIT);
        if (pl < 0) continue;
        size_t plen = (size_t)pl < sizeof peer ? (size_t)pl : sizeof peer;
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        int more = 0;
        size_t ml = sizeof more;
        zmq_getsockopt(c.sock, ZMQ_RCVMORE, &more, &ml);
        if (!more) {
            zmq_msg_close(&msg);
            continue;
        }
        zmq_msg_recv(&msg, c.sock, 0);
        int extra = 0;
        while (zmq_msg_more(&msg)) { /* drain extra frames */
            zmq_msg_t junk;
            zmq_msg_init(&junk);
            zmq_msg_recv(&junk, c.sock, 0);
            extra++;
            int m2 = zmq_msg_more(&junk);
            zmq_msg_close(&junk);
            if (!m2) break;
        }
        RsErr de = {0};
        if (extra) {
            zmq_msg_close(&msg);
            char t[128];
            snprintf(t, sizeof t, "multi-part message (%d frames), expected one frame", extra + 1);
            reply_error(&c, peer, plen, NULL, RS_EPROTO, t);
            continue;
        }
        rc = proto_decode(zmq_msg_data(&msg), zmq_msg_size(&msg), &req, &de);
        zmq_msg_close(&msg);
        served++;
        int same_peer = have_session && plen == sess_peer_len && !memcmp(peer, sess_peer, plen);
        if (rc) {
            fprintf(stderr, "rootspec-draft: rejected frame: %s\n", de.msg);
            if (same_peer && req.session == session && !ctx_lost) {
                ctx_lost = 1;
                snprintf(ctx_lost_why, sizeof ctx_lost_why, "a frame was rejected (seq %" PRIu64 ")",
                         req.seq);
            }
            reply_error(&c, peer, plen, &req, rc, de.msg);
            continue;
        }
        switch (req.type) {
        case PROTO_HELLO: {
            char why[512] = "";
            if (req.u.hello.vocab_size != (uint32_t)vocab || req.u.hello.tokenizer_hash != tok_hash)
                snprintf(why, sizeof why,
                         "tokenizer mismatch: target vocab %u (tokenizer %016" PRIx64
                         "), drafter vocab %d (tokenizer %016" PRIx64 ")",
                         req.u.hello.vocab_size, req.u.hello.tokenizer_hash, vocab, tok_hash);
            else if (req.u.hello.topk != POOL_TOPK || req.u.hello.depth != POOL_MAX_DEPTH ||
                     req.u.hello.expand != POOL_EXPAND)
                snprintf(why, sizeof why, "pool shape %u/%u/%u requested, drafter grows %d/%d/%d",
                         req.u.hello.topk, req.u.hello.depth, req.u.hello.expand, POOL_TOPK,
                         POOL_MAX_DEPTH, POOL_EXPAND);
            if (*why) {
                fprintf(stderr, "rootspec-draft: refused HELLO: %s\n", why);
                reply_error(&c, peer, plen, &req, RS_EPEER, why);
                break;
            }
            if (have_session && !same_peer)
                fprintf(stderr, "rootspec-draft: new target session replaces the old one\n");
            memcpy(sess_peer, peer, plen);
            sess_peer_len = plen;
            session = req.session;
            have_session = 1;
            ctx_lost = 0;
            RsErr re = {0};
            drafter_reset(d, NULL, 0, NULL, 0, &re); /* a model drafter cannot fail here */
            memset(&rep, 0, sizeof rep);
            rep.type = PROTO_HELLO_OK;
            rep.session = req.session;
            rep.seq = req.seq;
            snprintf(rep.u.hello_ok.fingerprint, sizeof rep.u.hello_ok.fingerprint, "%s",
                     info->fingerprint);
            rep.u.hello_ok.tokenizer_hash = tok_hash;
            rep.u.hello_ok.vocab_size = (uint32_t)vocab;
            rep.u.hello_ok.caps = PROTO_CAP_POOL_V1 | o->caps;
            snprintf(rep.u.hello_ok.name, sizeof rep.u.hello_ok.name, "%s",
                     o->name ? o->name : "rootspec-draft");
            send_to(&c, peer, plen, &rep);
            break;
        }
        case PROTO_RESET:
        case PROTO_COMMIT_GROW: {
            if (!same_peer || req.session != session) {
                reply_error(&c, peer, plen, &req, RS_EPROTO,
                            "no session: send HELLO first (or another target took over)");
                break;
            }
            RsErr ge = {0};
            if (req.type == PROTO_RESET) { /* drop the KV, prefill the new prompt */
                ctx_lost = 0;
                rc = drafter_reset(d, req.u.tokens.ids, req.u.tokens.n, NULL, 0, &ge);
                if (rc) {
                    RsErr ignored = {0};
                    drafter_reset(d, NULL, 0, NULL, 0, &ignored);
                    ctx_lost = 1;
                    snprintf(ctx_lost_why, sizeof ctx_lost_why, "RESET seq %" PRIu64 " failed",
                             req.seq);
                    reply_error(&c, peer, plen, &req, rc, ge.msg);
                }
                break; /* no reply unless it fails */
            }
            if (ctx_lost) {
                char t[400];
                snprintf(t, sizeof t,
                         "drafter context lost (%s): send RESET with the prompt, then COMMIT_GROW",
                         ctx_lost_why);
                reply_error(&c, peer, plen, &req, RS_EPROTO, t);
                break;
            }
            rc = drafter_commit_grow(d, req.u.tokens.ids, req.u.tokens.n, pool, &ge);
            if (rc) {
                ctx_lost = 1;
                snprintf(ctx_lost_why, sizeof ctx_lost_why, "COMMIT_GROW seq %" PRIu64 " failed",
                         req.seq);
                reply_error(&c, peer, plen, &req, rc, ge.msg);
                break;
            }
            memset(&rep, 0, sizeof rep);
            rep.type = PROTO_POOL;
            rep.session = req.session;
            rep.seq = req.seq;
            rep.u.pool.pool = pool;
            rep.u.pool.commit_pass_ns = pool->commit_pass_ns;
            send_to(&c, peer, plen, &rep);
            break;
        }
        case PROTO_BYE:
            memset(&rep, 0, sizeof rep);
            rep.type = PROTO_BYE;
            rep.session = req.session;
            rep.seq = req.seq;
            send_to(&c, peer, plen, &rep);
            if (same_peer) have_session = 0;
            break;
        default: {
            char t[96];
            snprintf(t, sizeof t, "unexpected %s message from a target", proto_type_name(req.type));
            reply_error(&c, peer, plen, &req, RS_EPROTO, t);
        }
        }
        if (o->max_requests > 0 && served >= o->max_requests) break;
    }
    rc = RS_OK;
    free(pool);
    proto_msg_clear(&req);
    msgpack_sbuffer_destroy(&c.sb);
done:
    zmq_close(c.sock);
    zmq_ctx_shutdown(ctx);
    if (use_curve) secure_server_shutdown();
    zmq_ctx_term(ctx);
    return rc;
}
