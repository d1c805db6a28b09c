/* Shared by the file-format fuzz targets (tests/fuzz_*.c): the input handed over as a memfd
 * that the code under test opens by path like any file, and the rule every refusal must
 * keep: an input code (or ENOMEM for a size the input claims) and a message naming what
 * was read. Test scaffolding, header only: each target is one translation unit. */
#ifndef ROOTSPEC_FUZZ_COMMON_H
#define ROOTSPEC_FUZZ_COMMON_H
#include "common/util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* data[0..size) in a new memfd; path (cap >= 32) gets its /proc/self/fd name. Returns the
 * fd (the caller closes it). */
static inline int fuzz_memfd(const uint8_t *data, size_t size, const char *name, char *path,
                             size_t cap) {
    int fd = memfd_create(name, 0);
    RS_ASSERT(fd >= 0);
    RS_ASSERT(write(fd, data, size) == (ssize_t)size);
    snprintf(path, cap, "/proc/self/fd/%d", fd);
    return fd;
}

/* A refusal of what `what` names: aborts (a libFuzzer finding) unless rc is an input code
 * or ENOMEM, e carries it with a message, and the message names `what`. */
static inline void fuzz_check_refusal(int rc, const RsErr *e, const char *what) {
    RS_ASSERT(rc == RS_EFORMAT || rc == RS_EUNSUPPORTED || rc == RS_EINVAL || rc == RS_ENOMEM);
    RS_ASSERT(e->code == rc && e->msg[0] != 0);
    if (!strstr(e->msg, what)) {
        fprintf(stderr, "fuzz: the message does not name '%s': %s\n", what, e->msg);
        abort();
    }
}

#endif
