/* rootspec-serve's HTTP side (libmicrohttpd, a thread per connection): the OpenAI routes,
 * /health and /metrics, request body and connection limits, server-sent events. No client
 * can hold the server: connections are capped per client address, and a request's headers
 * and body must arrive within a deadline (a slow or idle client is dropped, its thread
 * freed); the decode of a request that arrived is never limited by it. */
#ifndef ROOTSPEC_SERVE_HTTP_H
#define ROOTSPEC_SERVE_HTTP_H
#include "serve_core.h"

typedef struct {
    const char *host;  /* IPv4 address to bind */
    const ServeGate *gate; /* Host, key and Content-Type checks (borrowed) */
    int port;          /* 0: any free port (serve_http_port says which) */
    size_t max_body;   /* bytes; a larger request body is a 413 */
    int max_conn;      /* connections at once; more are refused by the listener */
    int max_conn_ip;   /* connections at once from one client address */
    unsigned timeout;  /* seconds a connection may sit idle (not while its request waits or
                          decodes) */
    unsigned request_timeout; /* seconds a request's headers and body may take to arrive,
                                 from the connection's start or the previous answer's end */
} ServeHttpOpts;

typedef struct ServeHttp ServeHttp;

/* Listens on o->host:o->port and answers from c (borrowed; it outlives the server). */
int serve_http_start(ServeCore *c, const ServeHttpOpts *o, ServeHttp **out, RsErr *e);
int serve_http_port(const ServeHttp *h);
/* Graceful stop, with serve_core_stop between the two: stops accepting connections... */
void serve_http_quiesce(ServeHttp *h);
/* ...then waits up to ms milliseconds for every request being answered to finish (their
 * jobs ended with the core: a 503 or a stream's error event reaches the client). */
void serve_http_drain(ServeHttp *h, int ms);
/* Stops listening and closes every connection; clears *h. */
void serve_http_stop(ServeHttp **h);

#endif
