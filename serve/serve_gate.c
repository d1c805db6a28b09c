/* The checks a request passes before its route runs (serve.h): Host, API key, method,
 * body size and Content-Type, in an order that tells a client the first thing to fix. */
#include "serve.h"
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct {
    const char *path, *method;
    ServeRoute route;
    int open; /* answered without a key */
} ROUTES[] = {
    {"/health", "GET", ROUTE_HEALTH, 1},        {"/v1/models", "GET", ROUTE_MODELS, 0},
    {"/metrics", "GET", ROUTE_METRICS, 0},      {"/v1/chat/completions", "POST", ROUTE_CHAT, 0},
    {"/v1/completions", "POST", ROUTE_COMPLETION, 0}, {"/tokenize", "POST", ROUTE_TOKENIZE, 0},
    {"/detokenize", "POST", ROUTE_DETOKENIZE, 0},
};

/* The Host header's name without its port: "a.b:80" -> "a.b", "[::1]:80" -> "[::1]". */
static size_t host_name_len(const char *h) {
    if (h[0] == '[') {
        const char *e = strchr(h, ']');
        return e ? (size_t)(e - h) + 1 : strlen(h);
    }
    const char *c = strchr(h, ':');
    return c ? (size_t)(c - h) : strlen(h);
}

static int host_allowed(const ServeGate *g, const char *host) {
    if (g->n_hosts == 0 || !host) return 1; /* HTTP/1.0 may omit it; browsers never do */
    size_t n = host_name_len(host);
    for (int i = 0; i < g->n_hosts; i++)
        if (strlen(g->hosts[i]) == n && !strncasecmp(g->hosts[i], host, n)) return 1;
    return 0;
}

/* Equal without an early exit: the time depends on the key's length, not on how much of
 * it the guess got right. */
static int same_secret(const char *guess, size_t ng, const char *key) {
    size_t nk = strlen(key);
    unsigned char d = ng != nk;
    for (size_t i = 0; i < nk; i++) d |= (unsigned char)(key[i] ^ (i < ng ? guess[i] : 0));
    return d == 0;
}

/* "Bearer KEY" naming one of the keys (every key compared, whichever matches). */
static int key_ok(const ServeGate *g, const char *auth) {
    if (!auth || strncasecmp(auth, "Bearer ", 7)) return 0;
    const char *k = auth + 7;
    while (*k == ' ') k++;
    size_t n = strlen(k);
    while (n && (k[n - 1] == ' ' || k[n - 1] == '\t')) n--;
    int ok = 0;
    for (int i = 0; i < g->n_keys; i++) ok |= same_secret(k, n, g->keys[i]);
    return ok;
}

/* application/json, any case, optionally with parameters (charset=utf-8). */
static int json_type(const char *ct) {
    if (!ct) return 0;
    while (*ct == ' ') ct++;
    if (strncasecmp(ct, "application/json", 16)) return 0;
    ct += 16;
    while (*ct == ' ') ct++;
    return *ct == 0 || *ct == ';';
}

int serve_gate_check(const ServeGate *g, const ServeHead *h, ServeRoute *route, ServeError *se) {
    if (!host_allowed(g, h->host))
        return serve_error(se, 403, NULL, "Host '%.100s' is not allowed (rootspec-serve --allowed-hosts)",
                           h->host);
    size_t i = 0, n = sizeof ROUTES / sizeof ROUTES[0];
    while (i < n && strcmp(h->url, ROUTES[i].path)) i++;
    if (i == n) return serve_error(se, 404, NULL, "no route %.200s", h->url);
    if (strcmp(h->method, ROUTES[i].method))
        return serve_error(se, 405, NULL, "%s takes %s, not %.32s", ROUTES[i].path, ROUTES[i].method,
                           h->method);
    int open = ROUTES[i].open || (ROUTES[i].route == ROUTE_METRICS && g->metrics_public);
    if (g->n_keys && !open && !key_ok(g, h->authorization)) {
        serve_error(se, 401, NULL, "%s", h->authorization ? "Incorrect API key provided."
                    : "You didn't provide an API key: send it as 'Authorization: Bearer KEY'.");
        se->code = "invalid_api_key";
        return 401;
    }
    if (h->too_large)
        return serve_error(se, 413, NULL, "the request body is larger than %zu bytes (--max-body)", g->max_body);
    if (!strcmp(ROUTES[i].method, "POST") && !json_type(h->content_type))
        return serve_error(se, 415, NULL, "Content-Type must be application/json, not '%.100s'",
                           h->content_type ? h->content_type : "(none)");
    *route = ROUTES[i].route;
    return 0;
}

static void add_host(ServeGate *g, const char *s, size_t n) {
    g->hosts = realloc(g->hosts, sizeof *g->hosts * (size_t)(g->n_hosts + 1));
    RS_ASSERT(g->hosts);
    char *h = strndup(s, n);
    RS_ASSERT(h);
    for (char *p = h; *p; p++) *p = (char)tolower((unsigned char)*p);
    g->hosts[g->n_hosts++] = h;
}

int serve_gate_hosts(ServeGate *g, const char *list, const char *bind, RsErr *e) {
    if (!list) {
        struct in_addr a;
        if (inet_pton(AF_INET, bind, &a) != 1 || (ntohl(a.s_addr) >> 24) != 127) return RS_OK;
        static const char *const loop[] = {"localhost", "127.0.0.1", "[::1]"};
        for (int i = 0; i < 3; i++) add_host(g, loop[i], strlen(loop[i]));
        add_host(g, bind, strlen(bind));
        return RS_OK;
    }
    if (!strcmp(list, "*")) return RS_OK;
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        for (size_t k = 0; k < n; k++)
            if (!isgraph((unsigned char)p[k]) || p[k] == '/')
                return rs_err(e, RS_EINVAL, "--allowed-hosts: '%.*s' is not a host name", (int)n, p);
        if (n == 0) return rs_err(e, RS_EINVAL, "--allowed-hosts '%s' has an empty name", list);
        add_host(g, p, n);
        p += n + (p[n] == ',');
    }
    return RS_OK;
}

void serve_gate_add_key(ServeGate *g, const char *key) {
    g->keys = realloc(g->keys, sizeof *g->keys * (size_t)(g->n_keys + 1));
    RS_ASSERT(g->keys);
    g->keys[g->n_keys] = strdup(key);
    RS_ASSERT(g->keys[g->n_keys]);
    g->n_keys++;
}

int serve_gate_key_file(ServeGate *g, const char *path, RsErr *e) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st)) {
        int err = errno;
        if (fd >= 0) close(fd);
        return rs_err(e, RS_EIO, "--api-key-file '%s': %s", path, strerror(err));
    }
    FILE *f = fdopen(fd, "r");
    RS_ASSERT(f);
    if (st.st_mode & 077) {
        fclose(f);
        return rs_err(e, RS_EINVAL, "--api-key-file '%s' is readable by others (mode %04o): chmod 600 it",
                      path, (unsigned)(st.st_mode & 07777));
    }
    char line[4096];
    int before = g->n_keys;
    while (fgets(line, sizeof line, f)) {
        size_t n = strlen(line);
        while (n && isspace((unsigned char)line[n - 1])) line[--n] = 0;
        char *k = line;
        while (isspace((unsigned char)*k)) k++;
        if (*k && *k != '#') serve_gate_add_key(g, k);
    }
    fclose(f);
    if (g->n_keys == before) return rs_err(e, RS_EINVAL, "--api-key-file '%s' holds no key", path);
    return RS_OK;
}

void serve_gate_free(ServeGate *g) {
    for (int i = 0; i < g->n_hosts; i++) free(g->hosts[i]);
    for (int i = 0; i < g->n_keys; i++) free(g->keys[i]);
    free(g->hosts);
    free(g->keys);
    memset(g, 0, sizeof *g);
}
