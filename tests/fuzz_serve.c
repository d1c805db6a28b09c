/* libFuzzer target for rootspec-serve's request handling (`make fuzz-serve`, `make
 * fuzz-short`): the input is a request as the socket delivers it — a request line, header
 * lines up to a blank line, then the body — cut into the parts libmicrohttpd hands the
 * server and passed through the same calls a connection makes: the gate (Host, key, method,
 * size, Content-Type), then for the completion routes the request parser and the sampling
 * law. Every refusal must be a 4xx whose error body is valid JSON and valid UTF-8; a request
 * that parses must keep serve.h's promises (a prompt, stop strings within their limits). */
#include "common/util.h"
#include "serve/serve.h"
#include <cjson/cJSON.h>
#include <string.h>
#include <utf8proc.h>

#define MAX_BODY 65536

static int utf8_ok(const char *s) {
    utf8proc_ssize_t n = (utf8proc_ssize_t)strlen(s);
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)s;
    while (n > 0) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(p, n, &cp);
        if (k < 0) return 0;
        p += k;
        n -= k;
    }
    return 1;
}

/* The next line of [*p, end) (without CR LF), NUL-terminated in a copy; NULL at the end. */
static char *next_line(const char **p, const char *end) {
    if (*p >= end) return NULL;
    const char *nl = memchr(*p, '\n', (size_t)(end - *p));
    const char *e = nl ? nl : end;
    size_t n = (size_t)(e - *p);
    if (n && (*p)[n - 1] == '\r') n--;
    char *s = strndup(*p, n);
    RS_ASSERT(s);
    *p = nl ? nl + 1 : end;
    return s;
}

static void check_request(const ServeRequest *r, ServeKind kind) {
    RS_ASSERT(kind == SERVE_CHAT ? r->n_msgs >= 1 : (r->text != NULL) != (r->ids != NULL));
    RS_ASSERT(r->n_stop <= SERVE_STOP_MAX);
    for (int i = 0; i < r->n_stop; i++)
        RS_ASSERT(strlen(r->stop[i]) >= 1 && strlen(r->stop[i]) <= SERVE_STOP_LEN);
    RS_ASSERT(r->max_tokens >= 0);
}

/* The request's route and body through what a connection runs; the status. */
static int handle(const ServeGate *g, const ServeHead *h, const char *body, size_t n, ServeError *se) {
    ServeRoute rt;
    int rc = serve_gate_check(g, h, &rt, se);
    if (rc || (rt != ROUTE_CHAT && rt != ROUTE_COMPLETION)) return rc;
    ServeKind kind = rt == ROUTE_CHAT ? SERVE_CHAT : SERVE_COMPLETION;
    ServeRequest r;
    rc = serve_request_parse(body, n, kind, "m", &r, se);
    if (rc) return rc;
    check_request(&r, kind);
    DecodeOpts opts = {.decoder = DECODER_AR, .seed = 1, .max_new = 16, .sampling = {.temperature = 1, .top_p = 1}};
    rc = serve_sampling_map(&r, &opts, se);
    serve_request_free(&r);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *p = (const char *)data, *end = p + size;
    char *line = next_line(&p, end), *hdr[3] = {NULL, NULL, NULL};
    if (!line) return 0;
    char *sp = strchr(line, ' ');
    char *url = sp ? sp + 1 : line + strlen(line);
    if (sp) *sp = 0;
    static const char *const names[3] = {"host:", "content-type:", "authorization:"};
    char *l;
    while ((l = next_line(&p, end)) && *l) {
        for (int i = 0; i < 3; i++)
            if (!strncasecmp(l, names[i], strlen(names[i])) && !hdr[i]) {
                const char *v = l + strlen(names[i]);
                while (*v == ' ') v++;
                hdr[i] = strdup(v);
            }
        free(l);
    }
    free(l);
    size_t n = (size_t)(end - p);
    ServeGate g = {.max_body = MAX_BODY};
    RsErr e = {0};
    RS_ASSERT(serve_gate_hosts(&g, NULL, "127.0.0.1", &e) == 0);
    serve_gate_add_key(&g, "sk-fuzz");
    ServeHead h = {line, url, hdr[0], hdr[1], hdr[2], n > MAX_BODY};
    ServeError se;
    int rc = handle(&g, &h, p, n > MAX_BODY ? MAX_BODY : n, &se);
    if (rc) {
        RS_ASSERT(rc >= 400 && rc < 500 && se.status == rc);
        char *js = serve_error_json(&se);
        cJSON *o = cJSON_Parse(js);
        RS_ASSERT(o && utf8_ok(js));
        cJSON_Delete(o);
        free(js);
    }
    serve_gate_free(&g);
    for (int i = 0; i < 3; i++) free(hdr[i]);
    free(line);
    return 0;
}
