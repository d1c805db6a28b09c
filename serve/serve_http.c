/* HTTP for rootspec-serve on libmicrohttpd. Each connection has a thread of its own, so a
 * handler may block while its job waits in the queue or decodes; it polls its socket
 * between waits, and a client that went away cancels its job. libmicrohttpd's idle timeout
 * restarts with every byte, so a client sending a byte a second would hold its thread for
 * ever: a watchdog thread shuts down connections whose request has not fully arrived by
 * the deadline (serve_http.h). */
#include "serve_http.h"
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#define WAIT_MS 100 /* how often a waiting handler looks at its socket */
#define WATCH_MS 200 /* how often the watchdog looks at the deadlines */

/* A connection as the watchdog sees it (libmicrohttpd's socket context). */
typedef struct Conn {
    int fd;
    uint64_t since; /* ns: the start of the current request's arrival */
    int answering;  /* the request has arrived: no deadline until its answer is done */
    int dropped;    /* the watchdog shut it down */
    struct Conn *prev, *next;
} Conn;

struct ServeHttp {
    struct MHD_Daemon *d;
    ServeCore *core;
    ServeHttpOpts o;
    int port;
    pthread_mutex_t mu; /* conns, answering, stop */
    pthread_cond_t cv;
    Conn *conns;
    int n_answering;
    int stop;
    pthread_t watchdog;
    int listen_fd; /* once quiesced: ours to close after the daemon stops */
    pthread_mutex_t log_mu; /* on_log's rate limit */
    uint64_t log_sec;
    int log_n, log_dropped;
};

/* A request's body as it arrives. */
typedef struct {
    char *body;
    size_t len;
    int too_large; /* declared_too_large, or 1 once the body outgrew --max-body */
} ConnState;

/* ---- replies ----------------------------------------------------------------------------- */

/* Queues body (malloc'd, taken) with status and content type; counts it. */
static enum MHD_Result reply(ServeHttp *h, struct MHD_Connection *c, int status, char *body,
                             const char *ctype) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", ctype);
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    serve_metrics_request(serve_core_metrics(h->core), status);
    return ok;
}

static enum MHD_Result reply_error(ServeHttp *h, struct MHD_Connection *c, const ServeError *se) {
    return reply(h, c, se->status, serve_error_json(se), "application/json");
}

/* The socket failed or was reset: nobody will read the answer. An end of input is not
 * that: a client may shut down its sending side and wait for the answer (and one that
 * closed the socket is found when the answer, or a stream's next chunk, meets a reset). */
static int peer_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 1;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLHUP | POLLERR)) return 1;
    char b;
    ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

/* ---- streaming (server-sent events) ------------------------------------------------------- */

typedef struct {
    ServeHttp *h;
    ServeJob *jobs[SERVE_N_MAX]; /* the request's choices ("n"), choice i at i */
    int n, next;                 /* choices; the one to wait on next */
    int ended[SERVE_N_MAX], n_ended;
    ServeUsage usage;            /* the prompt once, every choice's tokens */
    struct MHD_Connection *conn;
    int started, finished;
    char *pending; /* SSE frames not yet handed to the connection */
    size_t plen, poff;
} Stream;

static void frame(FILE *f, char *json) {
    fprintf(f, "data: %s\n\n", json);
    free(json);
}

/* The frames for what choice i produced: a text delta, and at its end its finish chunk;
 * once every choice ended (or one failed: the error), the usage chunk when asked for and
 * [DONE]. o NULL: the stream's start (chat: each choice's role chunk). */
static void stream_frames(Stream *s, int i, const ServeOutput *o) {
    const ServeMeta *m = o ? serve_job_meta(s->jobs[i]) : NULL;
    FILE *f = open_memstream(&s->pending, &s->plen);
    RS_ASSERT(f);
    for (int k = 0; !s->started && k < s->n; k++)
        if (serve_job_meta(s->jobs[k])->kind == SERVE_CHAT)
            frame(f, serve_chunk_json(serve_job_meta(s->jobs[k]), 1, NULL, 0, NULL, NULL));
    s->started = 1;
    if (o && o->lp_new) frame(f, serve_chunk_logprobs_json(m, o->text, o->n, o->lp_new));
    else if (o && o->text) frame(f, serve_chunk_json(m, 0, o->text, o->n, NULL, NULL));
    if (o && o->done) {
        s->ended[i] = 1;
        s->n_ended++;
        if (i == 0) s->usage = (ServeUsage){o->usage.prompt_tokens, 0, o->usage.cached_tokens};
        s->usage.completion_tokens += o->usage.completion_tokens;
        if (o->failed) frame(f, serve_error_json(&o->err));
        else frame(f, serve_chunk_json(m, 0, NULL, 0, o->finish_reason, NULL));
    }
    if (o && o->done && (o->failed || s->n_ended == s->n)) {
        if (!o->failed && serve_job_request(s->jobs[0])->include_usage)
            frame(f, serve_chunk_json(serve_job_meta(s->jobs[0]), 0, NULL, 0, NULL, &s->usage));
        fputs("data: [DONE]\n\n", f);
        s->finished = 1;
    }
    int rc = fclose(f);
    RS_ASSERT(rc == 0);
    s->poff = 0;
}

/* New output of some choice: each not ended is asked without waiting, then the next one
 * in turn is waited on for up to WAIT_MS. The choice it came from, or -1. */
static int stream_poll(Stream *s, ServeOutput *o) {
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < s->n; k++) {
            int i = (s->next + k) % s->n;
            if (s->ended[i]) continue;
            if (serve_job_wait(s->jobs[i], pass ? WAIT_MS : 0, o)) return i;
            if (pass) {
                s->next = (i + 1) % s->n;
                return -1;
            }
        }
    return -1;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    Stream *s = cls;
    for (;;) {
        if (s->pending && s->poff < s->plen) {
            size_t n = s->plen - s->poff < max ? s->plen - s->poff : max;
            memcpy(buf, s->pending + s->poff, n);
            s->poff += n;
            return (ssize_t)n;
        }
        free(s->pending);
        s->pending = NULL;
        if (s->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        if (!s->started) {
            stream_frames(s, 0, NULL);
            continue;
        }
        ServeOutput o;
        int i = stream_poll(s, &o);
        if (i >= 0) stream_frames(s, i, &o);
        free(o.text);
        if (o.lp_new) serve_logprobs_free(o.lp_new);
        free(o.lp_new);
        if (i < 0 && peer_gone(s->conn)) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

static void stream_free(void *cls) {
    Stream *s = cls;
    for (int i = 0; i < s->n; i++) {
        serve_job_cancel(s->jobs[i]); /* a no-op for a job that ended */
        serve_job_unref(&s->jobs[i]);
    }
    free(s->pending);
    free(s);
}

/* The stream takes the n jobs' references. */
static enum MHD_Result start_stream(ServeHttp *h, struct MHD_Connection *c, ServeJob **jobs, int n) {
    Stream *s = rs_xcalloc(1, sizeof *s);
    s->h = h;
    memcpy(s->jobs, jobs, sizeof(ServeJob *) * (size_t)n);
    s->n = n;
    s->conn = c;
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read,
                                                               s, stream_free);
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result ok = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    serve_metrics_request(serve_core_metrics(h->core), 200);
    return ok;
}

/* ---- completions ------------------------------------------------------------------------- */

/* Waits for the whole answer into *acc (malloc'd, *len bytes) and *o. -1 when the client
 * went away (the job is cancelled), else 0. */
static int wait_whole(struct MHD_Connection *c, ServeJob *j, char **acc, size_t *len, ServeOutput *o) {
    *acc = NULL;
    *len = 0;
    FILE *f = open_memstream(acc, len);
    RS_ASSERT(f);
    for (;;) {
        int got = serve_job_wait(j, WAIT_MS, o);
        if (o->text) fwrite(o->text, 1, o->n, f);
        free(o->text);
        o->text = NULL;
        if (got && o->done) break;
        if (peer_gone(c)) {
            serve_job_cancel(j);
            fclose(f);
            free(*acc);
            *acc = NULL;
            return -1;
        }
    }
    int rc = fclose(f);
    RS_ASSERT(rc == 0);
    return 0;
}

/* The n choices' whole answers, together (usage: the prompt once, every choice's tokens).
 * MHD_NO (the connection closes) when the client went away. */
static enum MHD_Result finish_whole(ServeHttp *h, struct MHD_Connection *c, ServeJob **jobs, int n) {
    char *acc[SERVE_N_MAX] = {0};
    ServeChoice ch[SERVE_N_MAX];
    ServeUsage u = {0};
    ServeOutput o;
    int gone = 0, failed = -1;
    for (int i = 0; i < n && !gone && failed < 0; i++) {
        size_t len;
        if ((gone = wait_whole(c, jobs[i], &acc[i], &len, &o) != 0)) break;
        if (o.failed) failed = i;
        ch[i] = (ServeChoice){acc[i], len, o.finish_reason, o.lp};
        if (i == 0) u = (ServeUsage){o.usage.prompt_tokens, 0, o.usage.cached_tokens};
        u.completion_tokens += o.usage.completion_tokens;
    }
    for (int i = 0; (gone || failed >= 0) && i < n; i++) serve_job_cancel(jobs[i]);
    enum MHD_Result ok = gone ? MHD_NO
                         : failed >= 0 ? reply_error(h, c, &o.err)
                                       : reply(h, c, 200, serve_response_choices_json(serve_job_meta(jobs[0]), ch, n, &u),
                                               "application/json");
    for (int i = 0; i < n; i++) free(acc[i]);
    return ok;
}

/* The request's n jobs: choice 0 from r (emptied), the others from the body parsed again (a
 * job owns its request), following choice 0; all submitted, in order. 0, or the HTTP status
 * with se set (the jobs made are dropped, those queued cancelled). */
static int make_choices(ServeHttp *h, ServeKind kind, const ConnState *cs, ServeRequest *r,
                        ServeJob **jobs, ServeError *se) {
    int n = r->n, rc = serve_job_create(h->core, r, &jobs[0], se);
    for (int i = 1; !rc && i < n; i++) {
        ServeRequest ri;
        rc = serve_request_parse(cs->body ? cs->body : "", cs->len, kind, serve_core_model(h->core), &ri, se);
        ri.choice = i;
        if (!rc) rc = serve_job_create(h->core, &ri, &jobs[i], se);
        serve_request_free(&ri);
        if (!rc) serve_job_follow(jobs[i], jobs[0]);
    }
    for (int i = 0; !rc && i < n; i++) rc = serve_core_submit(h->core, jobs[i], se);
    for (int i = 0; rc && i < n; i++)
        if (jobs[i]) {
            serve_job_cancel(jobs[i]);
            serve_job_unref(&jobs[i]);
        }
    return rc;
}

static enum MHD_Result handle_completion(ServeHttp *h, struct MHD_Connection *c, ServeKind kind,
                                         const ConnState *cs) {
    ServeRequest r;
    ServeError se;
    ServeJob *jobs[SERVE_N_MAX] = {0};
    int rc = serve_request_parse(cs->body ? cs->body : "", cs->len, kind, serve_core_model(h->core),
                                 &r, &se);
    int n = rc ? 0 : r.n;
    if (!rc) rc = make_choices(h, kind, cs, &r, jobs, &se);
    serve_request_free(&r);
    if (rc) return reply_error(h, c, &se);
    /* The idle timeout is for clients that stall; a job may wait and decode for longer
     * than that without a byte on the wire, and the connection must outlive it (on_completed
     * restores the timeout). */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    if (serve_job_request(jobs[0])->stream) return start_stream(h, c, jobs, n); /* it owns them */
    enum MHD_Result ok = finish_whole(h, c, jobs, n);
    for (int i = 0; i < n; i++) serve_job_unref(&jobs[i]);
    return ok;
}

/* ---- /tokenize and /detokenize -------------------------------------------------------------- */

static enum MHD_Result handle_tokenize(ServeHttp *h, struct MHD_Connection *c, const ConnState *cs) {
    char *text = NULL, **pieces = NULL;
    int add_special, with_pieces, *ids = NULL, n = 0;
    ServeError se;
    int rc = serve_tokenize_parse(cs->body ? cs->body : "", cs->len, &text, &add_special, &with_pieces, &se);
    if (!rc) rc = serve_core_tokenize(h->core, text, add_special, &ids, &n, with_pieces ? &pieces : NULL, &se);
    enum MHD_Result ok = rc ? reply_error(h, c, &se)
                            : reply(h, c, 200, serve_tokens_json(ids, n, pieces), "application/json");
    for (int i = 0; pieces && i < n; i++) free(pieces[i]);
    free(pieces);
    free(ids);
    free(text);
    return ok;
}

static enum MHD_Result handle_detokenize(ServeHttp *h, struct MHD_Connection *c, const ConnState *cs) {
    int *ids = NULL, n = 0;
    char *text = NULL;
    size_t len = 0;
    ServeError se;
    int rc = serve_detokenize_parse(cs->body ? cs->body : "", cs->len, &ids, &n, &se);
    if (!rc) rc = serve_core_detokenize(h->core, ids, n, &text, &len, &se);
    enum MHD_Result ok = rc ? reply_error(h, c, &se)
                            : reply(h, c, 200, serve_content_json(text, len), "application/json");
    free(text);
    free(ids);
    return ok;
}

/* ---- routes ------------------------------------------------------------------------------- */

static enum MHD_Result route(ServeHttp *h, struct MHD_Connection *c, const char *url,
                             const char *method, const ConnState *cs) {
    ServeHead hd = {
        .method = method, .url = url, .too_large = cs->too_large,
        .host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST),
        .content_type = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE),
        .authorization = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION),
    };
    ServeError se;
    ServeRoute rt;
    if (serve_gate_check(h->o.gate, &hd, &rt, &se)) return reply_error(h, c, &se);
    switch (rt) {
    case ROUTE_HEALTH: return reply(h, c, 200, strdup("{\"status\":\"ok\"}"), "application/json");
    case ROUTE_MODELS:
        return reply(h, c, 200, serve_models_json(serve_core_model(h->core), 0, serve_core_context(h->core)),
                     "application/json");
    case ROUTE_METRICS:
        return reply(h, c, 200, serve_core_metrics_text(h->core), "text/plain; version=0.0.4");
    case ROUTE_TOKENIZE: return handle_tokenize(h, c, cs);
    case ROUTE_DETOKENIZE: return handle_detokenize(h, c, cs);
    default: return handle_completion(h, c, rt == ROUTE_CHAT ? SERVE_CHAT : SERVE_COMPLETION, cs);
    }
}

/* The declared body size: 0 when there is none or it fits, 1 when it is over the limit
 * (the body is read and dropped, then refused: a reply sent while the client is still
 * sending would meet a reset socket), 2 when it is absurd (refused at once). */
static int declared_too_large(const ServeHttp *h, struct MHD_Connection *c) {
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (!cl) return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(cl, &end, 10);
    if (errno || end == cl || v / 64 > h->o.max_body) return 2;
    return v > h->o.max_body;
}

/* ---- the watchdog ----------------------------------------------------------------------- */

static Conn *conn_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* The request has arrived (answering) or its answer is done (a new arrival starts). */
static void conn_mark(ServeHttp *h, struct MHD_Connection *c, int answering) {
    Conn *k = conn_of(c);
    if (!k) return;
    pthread_mutex_lock(&h->mu);
    if (k->answering != answering) h->n_answering += answering ? 1 : -1;
    k->answering = answering;
    k->since = rs_now_ns();
    pthread_mutex_unlock(&h->mu);
    pthread_cond_broadcast(&h->cv);
}

/* libmicrohttpd closes the socket after CLOSED is notified, and the watchdog shuts sockets
 * down only under mu while their Conn is listed: it never touches a reused descriptor. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    ServeHttp *h = cls;
    Conn *k = *socket_context;
    pthread_mutex_lock(&h->mu);
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        k = rs_xcalloc(1, sizeof *k);
        k->fd = ci ? ci->connect_fd : -1;
        k->since = rs_now_ns();
        k->next = h->conns;
        if (h->conns) h->conns->prev = k;
        h->conns = k;
        *socket_context = k;
    } else if (k) {
        if (k->prev) k->prev->next = k->next;
        else h->conns = k->next;
        if (k->next) k->next->prev = k->prev;
        if (k->answering) h->n_answering--;
        free(k);
        *socket_context = NULL;
    }
    pthread_mutex_unlock(&h->mu);
    pthread_cond_broadcast(&h->cv);
}

/* Shuts down the connections whose request is late: their threads see the end of input
 * and close them. */
static void *watchdog_main(void *arg) {
    ServeHttp *h = arg;
    uint64_t limit = (uint64_t)h->o.request_timeout * 1000000000ull;
    pthread_mutex_lock(&h->mu);
    while (!h->stop) {
        struct timespec dl = rs_deadline_ms(WATCH_MS);
        pthread_cond_timedwait(&h->cv, &h->mu, &dl);
        uint64_t now = rs_now_ns();
        for (Conn *k = h->conns; k; k = k->next)
            if (!k->answering && !k->dropped && k->fd >= 0 && now - k->since > limit) {
                shutdown(k->fd, SHUT_RDWR);
                k->dropped = 1;
            }
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* ---- requests ------------------------------------------------------------------------------- */

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *data,
                                  size_t *data_size, void **con_cls) {
    ServeHttp *h = cls;
    ConnState *cs = *con_cls;
    if (!cs) {
        *con_cls = cs = rs_xcalloc(1, sizeof *cs);
        cs->too_large = declared_too_large(h, c);
        if (cs->too_large < 2) return MHD_YES;
        ServeError se;
        serve_error(&se, 413, NULL, "the request body is larger than %zu bytes (--max-body)", h->o.max_body);
        conn_mark(h, c, 1);
        return reply_error(h, c, &se);
    }
    if (*data_size) {
        if (!cs->too_large && cs->len + *data_size <= h->o.max_body) {
            cs->body = realloc(cs->body, cs->len + *data_size + 1);
            RS_ASSERT(cs->body);
            memcpy(cs->body + cs->len, data, *data_size);
            cs->len += *data_size;
            cs->body[cs->len] = 0;
        } else {
            cs->too_large = 1;
        }
        *data_size = 0;
        return MHD_YES;
    }
    conn_mark(h, c, 1);
    return route(h, c, url, method, cs);
}

/* The answer is done (or the connection failed): the idle timeout a long decode lifted
 * holds again, and the next request's arrival is timed. */
static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode why) {
    ServeHttp *h = cls;
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, h->o.timeout);
    conn_mark(h, c, 0);
    ConnState *cs = *con_cls;
    if (!cs) return;
    free(cs->body);
    free(cs);
    *con_cls = NULL;
}

/* ---- the daemon ------------------------------------------------------------------------------ */

/* libmicrohttpd's messages (a dropped connection, a malformed request) at most LOG_PER_S a
 * second, with a count of those left out: a flood of bad clients must not flood the log. */
#define LOG_PER_S 10
static void on_log(void *cls, const char *fmt, va_list ap) {
    ServeHttp *h = cls;
    uint64_t sec = rs_now_ns() / 1000000000ull;
    pthread_mutex_lock(&h->log_mu);
    if (sec != h->log_sec) {
        if (h->log_dropped) fprintf(stderr, "rootspec-serve: %d more HTTP messages left out\n", h->log_dropped);
        h->log_sec = sec;
        h->log_n = h->log_dropped = 0;
    }
    int print = h->log_n++ < LOG_PER_S;
    if (!print) h->log_dropped++;
    pthread_mutex_unlock(&h->log_mu);
    if (!print) return;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    fprintf(stderr, "rootspec-serve: http: %s%s", msg, msg[0] && msg[strlen(msg) - 1] == '\n' ? "" : "\n");
}

int serve_http_start(ServeCore *core, const ServeHttpOpts *o, ServeHttp **out, RsErr *e) {
    *out = NULL;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->port)};
    if (inet_pton(AF_INET, o->host, &sa.sin_addr) != 1)
        return rs_err(e, RS_EINVAL, "--host '%s' is not an IPv4 address", o->host);
    ServeHttp *h = rs_xcalloc(1, sizeof *h);
    h->core = core;
    h->o = *o;
    h->listen_fd = -1;
    pthread_mutex_init(&h->mu, NULL);
    pthread_mutex_init(&h->log_mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    h->d = MHD_start_daemon(MHD_USE_AUTO | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                                MHD_USE_ITC | MHD_USE_ERROR_LOG,
                            (uint16_t)o->port, NULL, NULL, on_request, h,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_conn,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)o->max_conn_ip,
                            MHD_OPTION_CONNECTION_TIMEOUT, o->timeout,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
                            MHD_OPTION_EXTERNAL_LOGGER, on_log, h,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_END);
    if (!h->d) {
        pthread_mutex_destroy(&h->log_mu);
        pthread_mutex_destroy(&h->mu);
        pthread_cond_destroy(&h->cv);
        free(h);
        return rs_err(e, RS_EIO, "cannot listen on %s:%d (%s)", o->host, o->port, strerror(errno));
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : o->port;
    RS_ASSERT(pthread_create(&h->watchdog, NULL, watchdog_main, h) == 0);
    *out = h;
    return RS_OK;
}

int serve_http_port(const ServeHttp *h) { return h->port; }

void serve_http_quiesce(ServeHttp *h) {
    if (h && h->listen_fd < 0) h->listen_fd = MHD_quiesce_daemon(h->d);
}

void serve_http_drain(ServeHttp *h, int ms) {
    if (!h) return;
    uint64_t end = rs_now_ns() + (uint64_t)ms * 1000000ull;
    pthread_mutex_lock(&h->mu);
    while (h->n_answering > 0 && rs_now_ns() < end) {
        struct timespec dl = rs_deadline_ms(WATCH_MS);
        pthread_cond_timedwait(&h->cv, &h->mu, &dl);
    }
    pthread_mutex_unlock(&h->mu);
}

void serve_http_stop(ServeHttp **ph) {
    if (!ph || !*ph) return;
    ServeHttp *h = *ph;
    pthread_mutex_lock(&h->mu);
    h->stop = 1;
    pthread_mutex_unlock(&h->mu);
    pthread_cond_broadcast(&h->cv);
    pthread_join(h->watchdog, NULL);
    MHD_stop_daemon(h->d);
    if (h->listen_fd >= 0) close(h->listen_fd);
    pthread_mutex_destroy(&h->log_mu);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    free(h);
    *ph = NULL;
}
