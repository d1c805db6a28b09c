/* Implementation of the shared error, allocation, clock and file helpers. */
#define _POSIX_C_SOURCE 200809L
#include "util.h"
#include <errno.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

int rs_err(RsErr *e, int code, const char *fmt, ...) {
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
        e->code = code;
    }
    return code;
}

const char *rs_status_name(int code) {
    switch (code) {
    case RS_OK: return "ok";
    case RS_EIO: return "io";
    case RS_EFORMAT: return "format";
    case RS_EUNSUPPORTED: return "unsupported";
    case RS_EINVAL: return "invalid";
    case RS_EPROTO: return "protocol";
    case RS_ETIMEOUT: return "timeout";
    case RS_EPEER: return "peer";
    case RS_ENOMEM: return "nomem";
    default: return "unknown";
    }
}

void *rs_xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "rootspec: out of memory allocating %zu bytes\n", n);
        abort();
    }
    return p;
}

void *rs_xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) {
        fprintf(stderr, "rootspec: out of memory allocating %zu x %zu bytes\n", n, size);
        abort();
    }
    return p;
}

uint64_t rs_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int rs_read_file(const char *path, char **out, size_t *len, RsErr *e) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return rs_err(e, RS_EIO, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(f);
        return rs_err(e, RS_EIO, "cannot read '%s': it is a directory", path);
    }
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return rs_err(e, RS_EIO, "cannot seek '%s': %s", path, strerror(errno));
    }
    long n = ftell(f);
    if (n < 0) {
        fclose(f);
        return rs_err(e, RS_EIO, "cannot size '%s': %s", path, strerror(errno));
    }
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    if (!buf) {
        fclose(f);
        return rs_err(e, RS_ENOMEM, "cannot allocate %ld bytes for '%s'", n, path);
    }
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    if (got != (size_t)n) {
        free(buf);
        return rs_err(e, RS_EIO, "short read on '%s' (%zu of %ld bytes)", path, got, n);
    }
    buf[n] = 0;
    *out = buf;
    if (len) *len = (size_t)n;
    return RS_OK;
}
