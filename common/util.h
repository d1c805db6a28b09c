/* Shared status codes, error reporting and small helpers used by every module.
 * Two kinds of errors: programming errors abort via RS_ASSERT; I/O, network,
 * protocol and user-input errors return a negative RsStatus with a message in RsErr. */
#ifndef ROOTSPEC_UTIL_H
#define ROOTSPEC_UTIL_H
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>

/* Marks a header-inline helper that host code and CUDA kernels share (the same source, so
 * both compute the same bits). */
#ifdef __CUDACC__
#define RS_HOSTDEV __host__ __device__
#else
#define RS_HOSTDEV
#endif

typedef enum {
    RS_OK = 0,
    RS_EIO = -1,          /* file or socket I/O failed */
    RS_EFORMAT = -2,      /* malformed / truncated input (model file, message, prompt file) */
    RS_EUNSUPPORTED = -3, /* well-formed but not supported (dtype, architecture, version) */
    RS_EINVAL = -4,       /* bad user argument (option value, prompt too long, ...) */
    RS_EPROTO = -5,       /* protocol violation by a peer */
    RS_ETIMEOUT = -6,     /* peer did not answer in time */
    RS_EPEER = -7,        /* peer reported an error or refused */
    RS_ENOMEM = -8,       /* allocation failed */
    RS_EFULL = -9,        /* a shared pool is used up for now (KV blocks): retry later */
    RS_ESTOPPED = -10,    /* the caller's stop check ended the call (backend_set_stop) */
} RsStatus;

typedef struct {
    int code;       /* RsStatus of the last failure, RS_OK if none */
    char msg[1024]; /* human-readable, names the offending value */
} RsErr;

/* Sets e (if non-NULL) and returns code, so callers can `return rs_err(e, RS_EIO, "...")`. */
int rs_err(RsErr *e, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
const char *rs_status_name(int code);

/* Programming errors: abort with expression, file and line. */
#define RS_ASSERT(cond)                                                                    \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "rootspec: assertion failed: %s (%s:%d)\n", #cond, __FILE__,   \
                    __LINE__);                                                             \
            abort();                                                                       \
        }                                                                                  \
    } while (0)

/* Allocation that aborts on failure (start-up buffers only). */
void *rs_xmalloc(size_t n);
void *rs_xcalloc(size_t n, size_t size);
/* rs_xcalloc at a 64-byte (cache line) boundary, freed with free(): rows of activations a
 * kernel loads 64 bytes at a time then never straddle two lines (calloc gives 16 bytes,
 * which splits every such load of rows whose size is a multiple of 64). */
void *rs_xcalloc_lines(size_t n, size_t size);

/* Zeroed anonymous memory for `bytes` that the kernels stream, 2 MiB-aligned and advised
 * for transparent huge pages: one TLB entry then covers 2 MiB instead of 4 KiB (in a VM
 * a TLB miss walks two page tables; a read stream measured 12.0 vs 14.6-16.1 GB/s on the
 * dev machine). Pages still come in on first touch. NULL when the mapping fails; free
 * with rs_huge_free(p, bytes). Without THP (or "never") it is ordinary memory. */
void *rs_huge_alloc(size_t bytes);
/* Makes the kernel back all of rs_huge_alloc's `bytes` now (a write to every page), so
 * that no later first touch pays a page fault. */
void rs_huge_touch(void *p, size_t bytes);
void rs_huge_free(void *p, size_t bytes);

/* Monotonic clock in nanoseconds (CLOCK_MONOTONIC). */
uint64_t rs_now_ns(void);
/* The wall-clock time ms milliseconds from now (CLOCK_REALTIME): the absolute deadline
 * pthread_cond_timedwait takes. */
struct timespec rs_deadline_ms(long ms);

/* Opens path for reading only if it is a regular file: it is opened non-blocking and
 * checked with fstat, so a FIFO, device or directory is refused instead of blocking the
 * open or a read forever. Missing or non-regular files are bad input (RS_EINVAL, the
 * message names the path); other failures RS_EIO. *fd is blocking again on return;
 * *size (if non-NULL) gets the file size. */
int rs_open_regular(const char *path, int *fd, size_t *size, RsErr *e);

/* Reads a whole regular file (rs_open_regular) into a NUL-terminated malloc'd buffer;
 * caller frees *out. */
int rs_read_file(const char *path, char **out, size_t *len, RsErr *e);

#endif
