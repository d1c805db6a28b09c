/* Implementation of the shared error, allocation, clock and file helpers. */
#define _POSIX_C_SOURCE 200809L
#include "util.h"
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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
    case RS_EFULL: return "full";
    case RS_ESTOPPED: return "stopped";
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

#define HUGE_PAGE ((size_t)2 << 20)

/* The 2 MiB-aligned start inside a mapping of bytes + HUGE_PAGE: the slack before it and
 * after the rounded end is unmapped again. */
void *rs_huge_alloc(size_t bytes) {
    size_t len = (bytes + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    if (!len) len = HUGE_PAGE;
    uint8_t *m = mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
    if (m == MAP_FAILED) return NULL;
    uint8_t *p = (uint8_t *)(((uintptr_t)m + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (p > m) munmap(m, (size_t)(p - m));
    if (m + len + HUGE_PAGE > p + len) munmap(p + len, (size_t)(m + len + HUGE_PAGE - (p + len)));
#ifdef MADV_HUGEPAGE
    madvise(p, len, MADV_HUGEPAGE); /* a hint: EINVAL without THP changes nothing */
#endif
    return p;
}

void rs_huge_touch(void *p, size_t bytes) {
    volatile uint8_t *b = p;
    for (size_t o = 0; o < bytes; o += 4096) b[o] = 0; /* the mapping is zeroed already */
}

void rs_huge_free(void *p, size_t bytes) {
    if (!p) return;
    size_t len = (bytes + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    munmap(p, len ? len : HUGE_PAGE);
}

void *rs_xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) {
        fprintf(stderr, "rootspec: out of memory allocating %zu x %zu bytes\n", n, size);
        abort();
    }
    return p;
}

void *rs_xcalloc_lines(size_t n, size_t size) {
    size_t bytes = (n ? n : 1) * (size ? size : 1);
    RS_ASSERT(bytes / (n ? n : 1) == (size ? size : 1));
    void *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!p) {
        fprintf(stderr, "rootspec: out of memory allocating %zu x %zu bytes\n", n, size);
        abort();
    }
    return memset(p, 0, bytes);
}

uint64_t rs_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

struct timespec rs_deadline_ms(long ms) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_nsec += (ms % 1000) * 1000000L;
    dl.tv_sec += ms / 1000 + dl.tv_nsec / 1000000000L;
    dl.tv_nsec %= 1000000000L;
    return dl;
}

static const char *file_kind(mode_t m) {
    return S_ISDIR(m)    ? "a directory"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISSOCK(m) ? "a socket"
                         : "not a regular file";
}

int rs_open_regular(const char *path, int *fd_out, size_t *size, RsErr *e) {
    *fd_out = -1;
    /* O_NONBLOCK: opening a FIFO for reading would wait for a writer forever */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        int err = errno;
        if (err == ENOENT || err == ENOTDIR)
            return rs_err(e, RS_EINVAL, "'%s' does not exist", path);
        return rs_err(e, err == EACCES || err == ELOOP ? RS_EINVAL : RS_EIO,
                      "cannot open '%s': %s", path, strerror(err));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return rs_err(e, RS_EIO, "cannot stat '%s': %s", path, strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return rs_err(e, RS_EINVAL, "'%s' is %s, expected a regular file", path,
                      file_kind(st.st_mode));
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int err = errno;
        close(fd);
        return rs_err(e, RS_EIO, "cannot read '%s': %s", path, strerror(err));
    }
    *fd_out = fd;
    if (size) *size = (size_t)st.st_size;
    return RS_OK;
}

int rs_read_file(const char *path, char **out, size_t *len, RsErr *e) {
    *out = NULL;
    int fd;
    size_t n;
    int rc = rs_open_regular(path, &fd, &n, e);
    if (rc) return rc;
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return rs_err(e, RS_ENOMEM, "cannot allocate %zu bytes for '%s'", n, path);
    }
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, buf + got, n - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        got += (size_t)k;
    }
    close(fd);
    if (got != n) {
        free(buf);
        return rs_err(e, RS_EIO, "short read on '%s' (%zu of %zu bytes)", path, got, n);
    }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return RS_OK;
}
