/* Strict numeric option parsing (no silent truncation of "12abc" or overflow). */
#include "cli.h"
#include <errno.h>
#include <math.h>
#include <string.h>

int cli_int(const char *opt, const char *val, long min, long max, int *out, RsErr *e) {
    char *end;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (!*val || *end || errno)
        return rs_err(e, RS_EINVAL, "%s: '%s' is not an integer", opt, val);
    if (v < min || v > max)
        return rs_err(e, RS_EINVAL, "%s: %ld is outside %ld..%ld", opt, v, min, max);
    *out = (int)v;
    return RS_OK;
}

int cli_double(const char *opt, const char *val, double min, double max, double *out, RsErr *e) {
    char *end;
    errno = 0;
    double v = strtod(val, &end);
    if (!*val || *end || errno || !isfinite(v))
        return rs_err(e, RS_EINVAL, "%s: '%s' is not a finite number", opt, val);
    if (v < min || v > max)
        return rs_err(e, RS_EINVAL, "%s: %g is outside %g..%g", opt, v, min, max);
    *out = v;
    return RS_OK;
}

int cli_u64(const char *opt, const char *val, uint64_t *out, RsErr *e) {
    char *end;
    errno = 0;
    if (!*val || *val == '-') return rs_err(e, RS_EINVAL, "%s: '%s' is not a non-negative integer", opt, val);
    unsigned long long v = strtoull(val, &end, 10);
    if (*end || errno) return rs_err(e, RS_EINVAL, "%s: '%s' is not a non-negative integer", opt, val);
    *out = v;
    return RS_OK;
}

int cli_value(int argc, char **argv, int i, const char **out, RsErr *e) {
    if (i + 1 >= argc) return rs_err(e, RS_EINVAL, "option %s needs a value", argv[i]);
    *out = argv[i + 1];
    return RS_OK;
}

int cli_exit_status(int rc) {
    return rc == RS_EINVAL || rc == RS_EFORMAT || rc == RS_EUNSUPPORTED ? 2 : 1;
}
