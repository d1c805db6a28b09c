/* HTTP for rootspec-serve on libmicrohttpd. Each connection has a thread of its own, so a
 * handler may block while its job waits in the queue or decodes; it polls its socket
 * between waits, and a client that went away cancels its job. */
#include "serve_http.h"
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>

#define WAIT_MS 100 /* how often a waiting handler looks at its socket */

struct ServeHttp {
    struct MHD_Daemon *d;
    ServeCore *core;
    ServeHttpOpts o;
    int port;
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

/* The client closed its end (or the socket failed): nobody will read the answer. */
static int peer_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 1;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return 1;
    char b;
    ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* ---- streaming (server-sent events) ------------------------------------------------------- */

typedef struct {
    ServeHttp *h;
    ServeJob *job;
    struct MHD_Connection *conn;
    int started, finished;
    char *pending; /* SSE frames not yet handed to the connection */
    size_t plen, poff;
} Stream;

static void frame(FILE *f, char *json) {
    fprintf(f, "data: %s\n\n", json);
    free(json);
}

/* The frames for what the job produced: a text delta, and at the end the finish chunk (or
 * the error), the usage chunk when asked for, and [DONE]. */
static void stream_frames(Stream *s, const ServeOutput *o) {
    const ServeMeta *m = serve_job_meta(s->job);
    FILE *f = open_memstream(&s->pending, &s->plen);
    RS_ASSERT(f);
    if (!s->started && m->kind == SERVE_CHAT) frame(f, serve_chunk_json(m, 1, NULL, 0, NULL, NULL));
    s->started = 1;
    if (o && o->text) frame(f, serve_chunk_json(m, 0, o->text, o->n, NULL, NULL));
    if (o && o->done) {
        if (o->failed) frame(f, serve_error_json(&o->err));
        else frame(f, serve_chunk_json(m, 0, NULL, 0, o->finish_reason, NULL));
        if (!o->failed && serve_job_request(s->job)->include_usage)
            frame(f, serve_chunk_json(m, 0, NULL, 0, NULL, &o->usage));
        fputs("data: [DONE]\n\n", f);
        s->finished = 1;
    }
    int rc = fclose(f);
    RS_ASSERT(rc == 0);
    s->poff = 0;
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
            stream_frames(s, NULL);
            continue;
        }
        ServeOutput o;
        int got = serve_job_wait(s->job, WAIT_MS, &o);
        if (got) stream_frames(s, &o);
        free(o.text);
        if (!got && peer_gone(s->conn)) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

static void stream_free(void *cls) {
    Stream *s = cls;
    serve_job_cancel(s->job); /* a no-op for a job that ended */
    serve_job_unref(&s->job);
    free(s->pending);
    free(s);
}

static enum MHD_Result start_stream(ServeHttp *h, struct MHD_Connection *c, ServeJob *j) {
    Stream *s = rs_xcalloc(1, sizeof *s);
    s->h = h;
    s->job = j;
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

/* Waits for the whole answer. MHD_NO (the connection closes) when the client went away. */
static enum MHD_Result finish_whole(ServeHttp *h, struct MHD_Connection *c, ServeJob *j) {
    char *acc = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&acc, &len);
    RS_ASSERT(f);
    ServeOutput o;
    for (;;) {
        int got = serve_job_wait(j, WAIT_MS, &o);
        if (o.text) fwrite(o.text, 1, o.n, f);
        free(o.text);
        if (got && o.done) break;
        if (peer_gone(c)) {
            serve_job_cancel(j);
            fclose(f);
            free(acc);
            return MHD_NO;
        }
    }
    int rc = fclose(f);
    RS_ASSERT(rc == 0);
    enum MHD_Result ok = o.failed ? reply_error(h, c, &o.err)
                                  : reply(h, c, 200, serve_response_json(serve_job_meta(j), acc, len,
                                                                         o.finish_reason, &o.usage),
                                          "application/json");
    free(acc);
    return ok;
}

static enum MHD_Result handle_completion(ServeHttp *h, struct MHD_Connection *c, ServeKind kind,
                                         const ConnState *cs) {
    ServeRequest r;
    ServeError se;
    ServeJob *j = NULL;
    int rc = serve_request_parse(cs->body ? cs->body : "", cs->len, kind, serve_core_model(h->core),
                                 &r, &se);
    if (!rc) rc = serve_job_create(h->core, &r, &j, &se);
    if (!rc) rc = serve_core_submit(h->core, j, &se);
    if (rc) {
        serve_request_free(&r);
        serve_job_unref(&j);
        return reply_error(h, c, &se);
    }
    /* The idle timeout is for clients that stall; a job may wait and decode for longer
     * than that without a byte on the wire, and the connection must outlive it. */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    if (serve_job_request(j)->stream) return start_stream(h, c, j); /* the stream owns j */
    enum MHD_Result ok = finish_whole(h, c, j);
    serve_job_unref(&j);
    return ok;
}

/* ---- routes ------------------------------------------------------------------------------- */

static enum MHD_Result route(ServeHttp *h, struct MHD_Connection *c, const char *url,
                             const char *method, const ConnState *cs) {
    static const struct { const char *path, *method; int what; } routes[] = {
        {"/health", "GET", 0}, {"/v1/models", "GET", 1}, {"/metrics", "GET", 2},
        {"/v1/chat/completions", "POST", 3}, {"/v1/completions", "POST", 4},
    };
    ServeError se;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        if (strcmp(url, routes[i].path)) continue;
        if (strcmp(method, routes[i].method))
            return reply_error(h, c, (serve_error(&se, 405, NULL, "%s takes %s, not %.32s", url,
                                                  routes[i].method, method), &se));
        if (cs->too_large)
            return reply_error(h, c, (serve_error(&se, 413, NULL, "the request body is larger than %zu bytes (--max-body)",
                                                  h->o.max_body), &se));
        switch (routes[i].what) {
        case 0: return reply(h, c, 200, strdup("{\"status\":\"ok\"}"), "application/json");
        case 1: return reply(h, c, 200, serve_models_json(serve_core_model(h->core), 0), "application/json");
        case 2:
            return reply(h, c, 200, serve_core_metrics_text(h->core),
                         "text/plain; version=0.0.4");
        default: return handle_completion(h, c, routes[i].what == 3 ? SERVE_CHAT : SERVE_COMPLETION, cs);
        }
    }
    return reply_error(h, c, (serve_error(&se, 404, NULL, "no route %.200s", url), &se));
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
    return route(h, c, url, method, cs);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode why) {
    ConnState *cs = *con_cls;
    if (!cs) return;
    free(cs->body);
    free(cs);
    *con_cls = NULL;
}

/* ---- the daemon ------------------------------------------------------------------------------ */

int serve_http_start(ServeCore *core, const ServeHttpOpts *o, ServeHttp **out, RsErr *e) {
    *out = NULL;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->port)};
    if (inet_pton(AF_INET, o->host, &sa.sin_addr) != 1)
        return rs_err(e, RS_EINVAL, "--host '%s' is not an IPv4 address", o->host);
    ServeHttp *h = rs_xcalloc(1, sizeof *h);
    h->core = core;
    h->o = *o;
    h->d = MHD_start_daemon(MHD_USE_AUTO | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                                MHD_USE_ERROR_LOG,
                            (uint16_t)o->port, NULL, NULL, on_request, h,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_conn,
                            MHD_OPTION_CONNECTION_TIMEOUT, o->timeout,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_END);
    if (!h->d) {
        free(h);
        return rs_err(e, RS_EIO, "cannot listen on %s:%d (%s)", o->host, o->port, strerror(errno));
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : o->port;
    *out = h;
    return RS_OK;
}

int serve_http_port(const ServeHttp *h) { return h->port; }

void serve_http_stop(ServeHttp **ph) {
    if (!ph || !*ph) return;
    MHD_stop_daemon((*ph)->d);
    free(*ph);
    *ph = NULL;
}
