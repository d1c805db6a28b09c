/* Strict numeric option parsing (no silent truncation of "12abc" or overflow). */
#include "cli.h"
#include "pool.h"
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

int cli_budget(const char *val, int *out, RsErr *e) {
    if (val && !strcmp(val, "auto")) {
        *out = 0;
        return RS_OK;
    }
    RsErr ie = {0};
    if (cli_int("--budget", val, 1, TREE_MAX, out, &ie) == RS_OK) return RS_OK;
    return rs_err(e, RS_EINVAL, "--budget '%s': expected auto or a number 1..%d", val, TREE_MAX);
}

int cli_pool_shape(const char *val, int *depth, int *width, RsErr *e) {
    char dep[32], wid[32];
    const char *comma = strchr(val, ',');
    if (!comma || (size_t)(comma - val) >= sizeof dep || strlen(comma + 1) >= sizeof wid)
        return rs_err(e, RS_EINVAL, "--pool-shape: '%s' is not DEPTH,WIDTH (e.g. 5,1)", val);
    snprintf(dep, sizeof dep, "%.*s", (int)(comma - val), val);
    snprintf(wid, sizeof wid, "%s", comma + 1);
    int rc = cli_int("--pool-shape depth", dep, 1, POOL_MAX_DEPTH, depth, e);
    return rc ? rc : cli_int("--pool-shape width", wid, 1, POOL_EXPAND, width, e);
}

CliRuntime cli_runtime_defaults(void) {
    return (CliRuntime){.backend = "cpu", .threads = 1, .ctx = 2048, .device = 0};
}

int cli_runtime_option(int argc, char **argv, int *i, CliRuntime *rt, RsErr *e) {
    const char *a = argv[*i], *v = NULL;
    int *num = NULL;
    long lo = 0, hi = 0;
    if (!strcmp(a, "--batch-invariant")) return rt->batch_invariant = 1;
    if (!strcmp(a, "--insecure")) return rt->insecure = 1;
    if (!strcmp(a, "--threads")) num = &rt->threads, lo = 1, hi = 256;
    else if (!strcmp(a, "--ctx")) num = &rt->ctx, lo = 256, hi = 1 << 20;
    else if (!strcmp(a, "--device")) num = &rt->device, lo = 0, hi = 64;
    else if (strcmp(a, "--backend") && strcmp(a, "--curve-dir")) return 0;
    int rc = cli_value(argc, argv, *i, &v, e);
    if (rc) return rc;
    ++*i;
    if (num) return (rc = cli_int(a, v, lo, hi, num, e)) ? rc : 1;
    if (!strcmp(a, "--backend")) rt->backend = v;
    else rt->curve_dir = v;
    return 1;
}
