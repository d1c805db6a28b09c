/* The remote kind of Drafter: a rootspec-draft process over ZeroMQ (DEALER). reset sends
 * RESET (no reply unless it fails; features over one message's bound continue in APPEND
 * messages, as do a long commit's leading parts); grow_begin sends COMMIT_GROW and returns at once so the
 * target's root pass overlaps the drafting; grow_end waits for the POOL whose seq matches,
 * discarding stale replies from an earlier timeout. After a failure the next reset
 * re-handshakes (the drafter may have restarted).
 *
 * One connection (a Remote, the session) serves several Drafter handles, one sequence id
 * each (drafter_remote_share), used from threads of their own: a lock guards the socket,
 * and whichever handle waits in grow_end reads the replies, handing each POOL or ERROR to
 * the handle its sid names. A re-handshake starts a new session, in which the drafter holds
 * no sequence: the other handles' contexts are gone, so their next grow fails (their decodes
 * finish autoregressively) and their next reset starts them again. */
#include "remote_drafter.h"
#include "draft_proc/drafter_impl.h"
#include "proto/proto.h"
#include "proto/secure.h"
#include "common/textsafe.h"
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

typedef struct RemoteSeq RemoteSeq;

typedef struct {
    pthread_mutex_t mu; /* the socket, the counters, every handle's reply fields */
    pthread_cond_t cv;  /* a reply was handed to its handle */
    int refs;           /* handles */
    uint32_t next_sid;
    uint64_t generation; /* handshakes so far: a handle's context lives in one */
    RemoteSeq **seqs;   // (n_seqs) the handles, for routing replies
    int n_seqs;
    void *ctx, *sock;
    char endpoint[512];
    int timeout_ms, insecure;
    char curve_dir[512];
    int have_curve;
    const Model *target;
    uint64_t tok_hash;
    uint64_t session, seq, pending_seq;
    int healthy;
    char fingerprint[PROTO_FP_MAX + 1]; /* the drafter's, from its last HELLO_OK */
    ProtoMsg in;
    msgpack_sbuffer sb;
    uint16_t *feat; // (feat_cap) bf16 features of the message being sent
    size_t feat_cap;
    int began; /* a handshake succeeded: a later HELLO_OK must want the same layers */
    int n_feat_layers, feat_layers[DRAFTER_MAX_FEATURE_LAYERS]; /* from HELLO_OK */
} Remote;

/* One sequence on a Remote: the Drafter handle's ctx. Its reply fields are under r->mu. */
struct RemoteSeq {
    Remote *r;
    uint32_t sid;
    uint64_t generation; /* the session its context lives in; 0: none yet */
    int depth, width; /* drafter_set_shape's, sent with each COMMIT_GROW; 0: never set */
    uint64_t pending_seq; /* the COMMIT_GROW whose POOL grow_end waits for */
    int replied;          /* its reply came: rc, err and (on success) got */
    int rc;
    RsErr err;
    Pool *got;
    uint64_t commit_pass_ns;
};

/* Puts the f32 features (n rows, feat_bytes in all) on m as bf16; RS_EINVAL when they do not
 * split into n rows or exceed the protocol's bound (named). */
static int attach_features(Remote *r, ProtoMsg *m, int n, const void *features,
                           size_t feat_bytes, RsErr *e) {
    if (!features) return RS_OK;
    size_t vals = feat_bytes / sizeof(float);
    if (n <= 0 || feat_bytes % (sizeof(float) * (size_t)n) || vals / (size_t)n > PROTO_FEAT_WIDTH_MAX)
        return rs_err(e, RS_EINVAL, "%zu bytes of features do not make %d f32 rows of at most "
                      "%d values", feat_bytes, n, PROTO_FEAT_WIDTH_MAX);
    if (vals * 2 > PROTO_MAX_FEAT_BYTES)
        return rs_err(e, RS_EINVAL, "features of %d tokens are %zu bytes as bf16, over the "
                      "protocol's %u-byte limit (PROTO_MAX_FEAT_BYTES): use a shorter prompt",
                      n, vals * 2, PROTO_MAX_FEAT_BYTES);
    if (vals > r->feat_cap) {
        free(r->feat);
        r->feat = rs_xmalloc(vals * sizeof(uint16_t));
        r->feat_cap = vals;
    }
    proto_f32_to_bf16(features, r->feat, vals);
    m->u.tokens.feat_type = PROTO_FEAT_BF16;
    m->u.tokens.feat_width = (int)(vals / (size_t)n);
    m->u.tokens.feat = r->feat;
    return RS_OK;
}

static int send_msg(Remote *r, ProtoMsg *m, RsErr *e) {
    m->session = r->session;
    m->seq = ++r->seq;
    return proto_send(r->sock, m, e);
}

/* Waits for a reply to `seq` of type `want`; ERROR replies to it become RS_EPEER. */
static int wait_reply(Remote *r, uint64_t seq, ProtoType want, RsErr *e) {
    uint64_t deadline = rs_now_ns() + (uint64_t)r->timeout_ms * 1000000ull;
    for (;;) {
        uint64_t now = rs_now_ns();
        if (now >= deadline)
            return rs_err(e, RS_ETIMEOUT, "drafter at %s did not answer within %d ms", r->endpoint,
                          r->timeout_ms);
        RsErr re = {0};
        int rc = proto_recv(r->sock, &r->in, (int)((deadline - now) / 1000000ull) + 1, &re);
        if (rc == RS_ETIMEOUT) continue;
        if (rc) return rs_err(e, rc, "bad reply from drafter at %s: %s", r->endpoint, re.msg);
        if (r->in.session != r->session || r->in.seq < seq) continue; /* stale */
        char esc[4 * PROTO_MSG_MAX + 4]; /* the drafter's text: escaped (textsafe.h) */
        if (r->in.type == PROTO_ERROR)
            return rs_err(e, RS_EPEER, "drafter at %s refused: %s", r->endpoint,
                          rs_escape_str(esc, sizeof esc, r->in.u.error.message));
        if (r->in.seq != seq || r->in.type != want)
            return rs_err(e, RS_EPROTO, "drafter at %s sent %s (seq %" PRIu64 "), expected %s (seq %" PRIu64 ")",
                          r->endpoint, proto_type_name(r->in.type), r->in.seq,
                          proto_type_name(want), seq);
        return RS_OK;
    }
}

static int connect_sock(Remote *r, RsErr *e) {
    if (r->sock) zmq_close(r->sock);
    r->sock = zmq_socket(r->ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(r->sock, ZMQ_LINGER, &zero, sizeof zero);
    int64_t max_frame = PROTO_FRAME_MAX;
    zmq_setsockopt(r->sock, ZMQ_MAXMSGSIZE, &max_frame, sizeof max_frame);
    if (r->have_curve) {
        int rc = secure_client_setup(r->sock, r->curve_dir, e);
        if (rc) return rc;
    }
    if (zmq_connect(r->sock, r->endpoint) != 0)
        return rs_err(e, RS_EIO, "cannot connect to drafter '%s': %s", r->endpoint,
                      zmq_strerror(zmq_errno()));
    return RS_OK;
}

static int handshake(Remote *r, RsErr *e) {
    int rc = connect_sock(r, e); /* fresh socket: no stale replies, clean reconnect */
    if (rc) return rc;
    r->session = ((uint64_t)getpid() << 32) ^ rs_now_ns();
    ProtoMsg m = {0};
    m.type = PROTO_HELLO;
    snprintf(m.u.hello.fingerprint, sizeof m.u.hello.fingerprint, "%s", r->target->fingerprint);
    m.u.hello.tokenizer_hash = r->tok_hash;
    m.u.hello.vocab_size = (uint32_t)r->target->cfg.vocab_size;
    m.u.hello.caps = PROTO_CAP_POOL_V1 | PROTO_CAP_FEATURES; /* forwards what it is given */
    m.u.hello.topk = POOL_TOPK;
    m.u.hello.depth = POOL_MAX_DEPTH;
    m.u.hello.expand = POOL_EXPAND;
    if ((rc = send_msg(r, &m, e))) return rc;
    if ((rc = wait_reply(r, r->seq, PROTO_HELLO_OK, e))) {
        if (rc == RS_ETIMEOUT) /* CURVE drops a wrong key silently: it looks the same */
            rs_err(e, rc, "no answer: wrong server key or no drafter at %s (HELLO unanswered "
                   "for %d ms)", r->endpoint, r->timeout_ms);
        return rc;
    }
    const ProtoHelloOk *h = &r->in.u.hello_ok;
    if (h->vocab_size != (uint32_t)r->target->cfg.vocab_size || h->tokenizer_hash != r->tok_hash)
        return rs_err(e, RS_EPEER,
                      "drafter at %s has vocab %u (tokenizer %016" PRIx64 "), target has vocab %d "
                      "(tokenizer %016" PRIx64 ")",
                      r->endpoint, h->vocab_size, h->tokenizer_hash, r->target->cfg.vocab_size,
                      r->tok_hash);
    snprintf(r->fingerprint, sizeof r->fingerprint, "%s", h->fingerprint);
    if (r->began && (h->n_feat_layers != r->n_feat_layers ||
                    memcmp(h->feat_layers, r->feat_layers, sizeof(int) * (size_t)h->n_feat_layers)))
        return rs_err(e, RS_EPEER, "drafter at %s restarted wanting features of %d layers, the "
                      "session began with %d", r->endpoint, h->n_feat_layers, r->n_feat_layers);
    r->n_feat_layers = h->n_feat_layers;
    memcpy(r->feat_layers, h->feat_layers, sizeof(int) * (size_t)h->n_feat_layers);
    r->healthy = 1;
    r->began = 1;
    r->generation++;
    return RS_OK;
}

/* Largest feature payload one message carries (tests lower it). */
static size_t g_chunk_bytes = PROTO_MAX_FEAT_BYTES;

void remote_set_feat_chunk_bytes(size_t bytes) {
    g_chunk_bytes = bytes >= 2 && bytes <= PROTO_MAX_FEAT_BYTES ? bytes : PROTO_MAX_FEAT_BYTES;
}


/* Sends tokens [0, n) with their f32 features in as many messages as the payload bound
 * needs: `type` (RESET, APPEND or COMMIT_GROW) says what the whole list is; a RESET starts
 * with a RESET, a COMMIT_GROW ends with one, every other part is an APPEND. Under r->mu. */
static int send_tokens(RemoteSeq *q, ProtoType type, const int *tokens, int n,
                       const void *features, size_t feat_bytes, RsErr *e) {
    Remote *r = q->r;
    size_t width = features && n > 0 ? feat_bytes / sizeof(float) / (size_t)n : 0;
    if (features && (n <= 0 || feat_bytes % (sizeof(float) * (size_t)n) || width < 1 ||
                     width > PROTO_FEAT_WIDTH_MAX))
        return rs_err(e, RS_EINVAL, "%zu bytes of features do not make %d f32 rows of at most "
                      "%d values", feat_bytes, n, PROTO_FEAT_WIDTH_MAX);
    int rows = width ? proto_feat_chunk_rows((int)width, g_chunk_bytes) : PROTO_MAX_TOKENS;
    int off = 0;
    do {
        int m = n - off < rows ? n - off : rows, last = off + m == n;
        ProtoMsg msg = {0};
        msg.type = type == PROTO_RESET && off == 0 ? PROTO_RESET
                   : type == PROTO_COMMIT_GROW && last ? PROTO_COMMIT_GROW : PROTO_APPEND;
        msg.sid = q->sid;
        msg.u.tokens.ids = (const int32_t *)tokens + off;
        msg.u.tokens.n = m;
        if (msg.type == PROTO_COMMIT_GROW) {
            msg.u.tokens.depth = q->depth;
            /* the full width is the default: it is left out when not narrowed */
            msg.u.tokens.width = q->width == POOL_EXPAND ? 0 : q->width;
        }
        const float *f = features ? (const float *)features + (size_t)off * width : NULL;
        int rc = attach_features(r, &msg, m, f, f ? (size_t)m * width * sizeof(float) : 0, e);
        if (rc) return rc;
        if ((rc = send_msg(r, &msg, e))) {
            r->healthy = 0;
            return rc;
        }
        off += m;
    } while (off < n);
    return RS_OK;
}

/* RS_OK when q's context lives in the current session (under r->mu). */
static int seq_live(const RemoteSeq *q, RsErr *e) {
    const Remote *r = q->r;
    if (q->generation == r->generation && r->healthy) return RS_OK;
    return rs_err(e, RS_EPEER, "drafter at %s: sequence %u lost its context (the session was "
                  "restarted%s); reset it", r->endpoint, q->sid,
                  r->healthy ? " for another sequence" : " after a failure");
}

static int remote_reset(void *ctx, const int *prompt, int n, const void *features,
                        size_t feat_bytes, RsErr *e) {
    RemoteSeq *q = ctx;
    Remote *r = q->r;
    pthread_mutex_lock(&r->mu);
    int rc = r->healthy ? RS_OK : handshake(r, e);
    if (!rc) rc = send_tokens(q, PROTO_RESET, prompt, n, features, feat_bytes, e);
    if (!rc) q->generation = r->generation;
    pthread_mutex_unlock(&r->mu);
    return rc;
}

static int remote_append(void *ctx, const int *tokens, int n, const void *features,
                         size_t feat_bytes, RsErr *e) {
    RemoteSeq *q = ctx;
    pthread_mutex_lock(&q->r->mu);
    int rc = seq_live(q, e);
    if (!rc) rc = send_tokens(q, PROTO_APPEND, tokens, n, features, feat_bytes, e);
    pthread_mutex_unlock(&q->r->mu);
    return rc;
}

static int remote_grow_begin(void *ctx, const int *tokens, int n, const void *features,
                             size_t feat_bytes, RsErr *e) {
    RemoteSeq *q = ctx;
    Remote *r = q->r;
    pthread_mutex_lock(&r->mu);
    int rc = seq_live(q, e);
    if (!rc) rc = send_tokens(q, PROTO_COMMIT_GROW, tokens, n, features, feat_bytes, e);
    if (!rc) {
        q->pending_seq = r->seq;
        q->replied = 0;
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

/* Hands the reply in r->in to the handle waiting for it (a reply nobody waits for, from
 * before a timeout, is dropped). Under r->mu. */
static void route_reply(Remote *r) {
    const ProtoMsg *in = &r->in;
    if (in->session != r->session) return;
    for (int i = 0; i < r->n_seqs; i++) {
        RemoteSeq *q = r->seqs[i];
        if (q->sid != in->sid || q->replied || q->pending_seq != in->seq) continue;
        char esc[4 * PROTO_MSG_MAX + 4]; /* the drafter's text: escaped (textsafe.h) */
        q->replied = 1;
        q->rc = RS_OK;
        if (in->type == PROTO_POOL) {
            memcpy(q->got, in->u.pool.pool, sizeof(Pool));
            q->commit_pass_ns = in->u.pool.commit_pass_ns;
        } else if (in->type == PROTO_ERROR)
            q->rc = rs_err(&q->err, RS_EPEER, "drafter at %s refused: %s", r->endpoint,
                           rs_escape_str(esc, sizeof esc, in->u.error.message));
        else
            q->rc = rs_err(&q->err, RS_EPROTO, "drafter at %s sent %s (seq %" PRIu64 "), "
                           "expected POOL", r->endpoint, proto_type_name(in->type), in->seq);
        pthread_cond_broadcast(&r->cv);
        return;
    }
}

/* Waits for q's POOL, reading replies for every handle meanwhile. Under r->mu; a reader
 * that shares the socket gives the lock up between 1 ms polls, so the other handles can
 * send. */
static int await_pool(RemoteSeq *q, RsErr *e) {
    Remote *r = q->r;
    uint64_t deadline = rs_now_ns() + (uint64_t)r->timeout_ms * 1000000ull;
    while (!q->replied) {
        int rc = seq_live(q, e);
        if (rc) return rc;
        uint64_t now = rs_now_ns();
        if (now >= deadline) {
            r->healthy = 0;
            return rs_err(e, RS_ETIMEOUT, "drafter at %s did not answer within %d ms",
                          r->endpoint, r->timeout_ms);
        }
        int wait = r->refs > 1 ? 1 : (int)((deadline - now) / 1000000ull) + 1;
        RsErr re = {0};
        rc = proto_recv(r->sock, &r->in, wait, &re);
        if (rc == RS_ETIMEOUT) {
            pthread_mutex_unlock(&r->mu);
            sched_yield();
            pthread_mutex_lock(&r->mu);
            continue;
        }
        if (rc) {
            r->healthy = 0;
            return rs_err(e, rc, "bad reply from drafter at %s: %s", r->endpoint, re.msg);
        }
        route_reply(r);
    }
    q->replied = 0;
    if (q->rc && e) *e = q->err;
    return q->rc;
}

static int remote_grow_end(void *ctx, Pool *out, RsErr *e) {
    RemoteSeq *q = ctx;
    pthread_mutex_lock(&q->r->mu);
    int rc = await_pool(q, e);
    if (!rc) {
        memcpy(out, q->got, sizeof(Pool));
        out->commit_pass_ns = q->commit_pass_ns;
    }
    pthread_mutex_unlock(&q->r->mu);
    return rc;
}

static void remote_set_shape(void *ctx, int depth, int width) {
    RemoteSeq *q = ctx;
    q->depth = depth;
    q->width = width;
}

/* The connection goes with its last handle; says BYE when the session is healthy, so the
 * drafter can take the next target at once. */
static void remote_free(Remote *r) {
    if (r->sock && r->healthy) {
        ProtoMsg m = {.type = PROTO_BYE};
        RsErr e;
        int hwm_ms = 200;
        zmq_setsockopt(r->sock, ZMQ_LINGER, &hwm_ms, sizeof hwm_ms);
        send_msg(r, &m, &e);
    }
    if (r->sock) zmq_close(r->sock);
    zmq_ctx_term(r->ctx);
    proto_msg_clear(&r->in);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r->seqs);
    free(r->feat);
    free(r);
}

/* A handle's end: CLOSE frees its sequence at the drafter (others may go on). */
static void remote_destroy(void *ctx) {
    RemoteSeq *q = ctx;
    Remote *r = q->r;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n_seqs; i++)
        if (r->seqs[i] == q) r->seqs[i] = r->seqs[--r->n_seqs];
    if (r->sock && r->healthy && q->generation == r->generation) {
        ProtoMsg m = {.type = PROTO_CLOSE, .sid = q->sid};
        RsErr e;
        send_msg(r, &m, &e);
    }
    int last = --r->refs == 0;
    pthread_mutex_unlock(&r->mu);
    free(q->got);
    free(q);
    if (last) remote_free(r);
}

static const DrafterOps remote_ops = {
    .reset = remote_reset,
    .grow_begin = remote_grow_begin,
    .grow_end = remote_grow_end,
    .destroy = remote_destroy,
    .append = remote_append,
    .set_shape = remote_set_shape,
};

/* A new handle on r, with the next sequence id (under r->mu or before r is shared). */
static RemoteSeq *seq_add(Remote *r) {
    RemoteSeq *q = rs_xcalloc(1, sizeof *q);
    q->r = r;
    q->sid = r->next_sid++;
    q->got = rs_xmalloc(sizeof(Pool));
    RemoteSeq **seqs = rs_xcalloc((size_t)r->n_seqs + 1, sizeof *seqs);
    if (r->n_seqs) memcpy(seqs, r->seqs, sizeof *seqs * (size_t)r->n_seqs);
    free(r->seqs);
    r->seqs = seqs;
    r->seqs[r->n_seqs++] = q;
    r->refs++;
    return q;
}

static Drafter *seq_wrap(RemoteSeq *q) {
    const Remote *r = q->r;
    /* vocab_size: the handshake refuses a drafter whose vocabulary differs from target's */
    DrafterInfo info = {.vocab_size = r->target->cfg.vocab_size,
                        .fingerprint = r->fingerprint,
                        .name = r->endpoint,
                        .n_feature_layers = r->n_feat_layers};
    memcpy(info.feature_layers, r->feat_layers, sizeof info.feature_layers);
    return drafter_wrap(&remote_ops, q, &info);
}

int drafter_remote_create(const char *endpoint, const Model *target, uint64_t tok_hash,
                          int timeout_ms, int insecure, const char *curve_dir, Drafter **out,
                          RsErr *e) {
    *out = NULL;
    int rc = secure_check_endpoint(endpoint, insecure, curve_dir, e);
    if (rc) return rc;
    Remote *r = rs_xcalloc(1, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    snprintf(r->endpoint, sizeof r->endpoint, "%s", endpoint);
    r->timeout_ms = timeout_ms > 0 ? timeout_ms : 10000;
    r->insecure = insecure;
    r->have_curve = curve_dir && !strncmp(endpoint, "tcp://", 6);
    if (curve_dir) snprintf(r->curve_dir, sizeof r->curve_dir, "%s", curve_dir);
    r->target = target;
    r->tok_hash = tok_hash;
    r->in.vocab_size = target->cfg.vocab_size;
    r->ctx = proto_ctx_new();
    RemoteSeq *q = seq_add(r);
    rc = handshake(r, e);
    if (rc) {
        remote_destroy(q);
        return rc;
    }
    q->generation = r->generation;
    *out = seq_wrap(q);
    return RS_OK;
}

int drafter_remote_share(Drafter *d, Drafter **out, RsErr *e) {
    *out = NULL;
    if (d->ops != &remote_ops)
        return rs_err(e, RS_EINVAL, "drafter %s is not a remote one: it has no connection to "
                      "share", d->info.name ? d->info.name : "?");
    Remote *r = ((RemoteSeq *)d->ctx)->r;
    pthread_mutex_lock(&r->mu);
    RemoteSeq *q = seq_add(r);
    q->generation = r->generation; /* a new sequence: its context starts empty */
    pthread_mutex_unlock(&r->mu);
    *out = seq_wrap(q);
    return RS_OK;
}
