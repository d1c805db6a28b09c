/* rootspec-serve's HTTP side (libmicrohttpd, a thread per connection): the OpenAI routes,
 * /health and /metrics, request body and connection limits, server-sent events. */
#ifndef ROOTSPEC_SERVE_HTTP_H
#define ROOTSPEC_SERVE_HTTP_H
#include "serve_core.h"

typedef struct {
    const char *host;  /* IPv4 address to bind */
    int port;          /* 0: any free port (serve_http_port says which) */
    size_t max_body;   /* bytes; a larger request body is a 413 */
    int max_conn;      /* connections at once; more are refused by the listener */
    unsigned timeout;  /* seconds a connection may sit idle (not while its request waits or
                          decodes) */
} ServeHttpOpts;

typedef struct ServeHttp ServeHttp;

/* Listens on o->host:o->port and answers from c (borrowed; it outlives the server). */
int serve_http_start(ServeCore *c, const ServeHttpOpts *o, ServeHttp **out, RsErr *e);
int serve_http_port(const ServeHttp *h);
/* Stops listening and closes every connection; clears *h. */
void serve_http_stop(ServeHttp **h);

#endif
