/* Strict numeric option parsing (no silent truncation of "12abc" or overflow). */
#include "cli.h"
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include "pool.h"
#include <errno.h>
#include <float.h>
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

int cli_real(const char *opt, const char *val, double *out, RsErr *e) {
    char *end;
    errno = 0;
    double v = strtod(val, &end);
    int underflow = errno == ERANGE && fabs(v) <= DBL_MIN;
    if (!*val || *end || (errno && !underflow) || !isfinite(v))
        return rs_err(e, RS_EINVAL, "%s: '%s' is not a finite number", opt, val);
    *out = v;
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

/* *on = 1 when variable `name` holds on_val, 0 when it is unset or holds off_val. */
static int env_choice(const char *name, const char *off_val, const char *on_val, int *on,
                      RsErr *e) {
    const char *v = getenv(name);
    *on = v && !strcmp(v, on_val);
    if (!v || *on || !strcmp(v, off_val)) return RS_OK;
    return rs_err(e, RS_EINVAL, "%s=%s: expected %s or %s", name, v, off_val, on_val);
}

int cli_backend_env(const char **cpu_kernels, BackendSwitches *sw, RsErr *e) {
    *cpu_kernels = getenv("ROOTSPEC_CPU_KERNELS");
    *sw = (BackendSwitches){0};
    int rc = env_choice("ROOTSPEC_CPU_KV", "f16", "f32", &sw->cpu_kv_f32, e);
    if (!rc) rc = env_choice("ROOTSPEC_CPU_PACK", "1", "0", &sw->cpu_unpacked, e);
    if (!rc) rc = env_choice("ROOTSPEC_CPU_PIN", "1", "0", &sw->cpu_unpinned, e);
    if (!rc) rc = env_choice("ROOTSPEC_CUDA_GRAPHS", "1", "0", &sw->cuda_eager, e);
    if (!rc) rc = env_choice("ROOTSPEC_CUDA_GEMV", "1", "0", &sw->cuda_blas_onerow, e);
    const char *rb = getenv("ROOTSPEC_ROWS_BATCHED");
    if (!rc && rb) {
        if (!strcmp(rb, "1") || !strcmp(rb, "0")) sw->rows_batched = rb[0] == '1' ? 1 : -1;
        else return rs_err(e, RS_EINVAL, "ROOTSPEC_ROWS_BATCHED=%s: expected 1 or 0", rb);
    }
    const char *qkv = getenv("ROOTSPEC_CUDA_FUSED_QKV");
    if (rc || !qkv || !strcmp(qkv, "1")) return rc;
    if (!strcmp(qkv, "0")) sw->cuda_fused_qkv = -1;
    else if (!strcmp(qkv, "all")) sw->cuda_fused_qkv = 1;
    else return rs_err(e, RS_EINVAL, "ROOTSPEC_CUDA_FUSED_QKV=%s: expected 0, 1 or all", qkv);
    return RS_OK;
}

/* quota / period from a file holding "QUOTA PERIOD" (v2 cpu.max) or one number (v1, with
 * the period in period_path); 0 when unlimited or unreadable. */
static int cgroup_cpus(const char *path, const char *period_path) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char q[32] = "";
    long long period = 0;
    int n = fscanf(f, "%31s %lld", q, &period);
    fclose(f);
    if (n < 1 || !strcmp(q, "max")) return 0;
    if (period_path) {
        f = fopen(period_path, "r");
        if (!f) return 0;
        if (fscanf(f, "%lld", &period) != 1) period = 0;
        fclose(f);
    }
    long long quota = atoll(q);
    if (quota <= 0 || period <= 0) return 0;
    return (int)((quota + period - 1) / period);
}

/* The smallest cgroup v2 cpu.max quota from the process's cgroup up to the root. */
static int cgroup_v2_cpus(void) {
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return 0;
    char line[4096], dir[4200];
    int best = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "0::", 3)) continue;
        line[strcspn(line, "\n")] = 0;
        snprintf(dir, sizeof dir, "/sys/fs/cgroup%s", line + 3);
        for (;;) {
            char path[4300];
            snprintf(path, sizeof path, "%s/cpu.max", dir);
            int n = cgroup_cpus(path, NULL);
            if (n > 0 && (best == 0 || n < best)) best = n;
            char *slash = strrchr(dir, '/');
            if (!slash || slash - dir < (long)strlen("/sys/fs/cgroup")) break;
            *slash = 0;
        }
    }
    fclose(f);
    return best;
}

int cli_cpus_available(void) {
    cpu_set_t set;
    int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    int q = cgroup_v2_cpus();
    if (!q) q = cgroup_cpus("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us");
    if (q > 0 && q < n) n = q;
    return n > 0 ? n : 1;
}

/* A number from a one-value file (cgroup's "max" reads -1); -1 when unreadable. */
static long long file_number(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char v[32] = "";
    int n = fscanf(f, "%31s", v);
    fclose(f);
    return n == 1 && strcmp(v, "max") ? atoll(v) : -1;
}

/* The least room (memory.max - memory.current) along the process's cgroup v2 path, the v1
 * limit's room, or -1 without a limit. */
static long long cgroup_mem_room(void) {
    long long best = -1;
    long long lim = file_number("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    long long use = file_number("/sys/fs/cgroup/memory/memory.usage_in_bytes");
    if (lim > 0 && use >= 0 && lim < (1LL << 60)) best = lim > use ? lim - use : 0;
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return best;
    char line[4096], dir[4200], path[4300];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "0::", 3)) continue;
        line[strcspn(line, "\n")] = 0;
        snprintf(dir, sizeof dir, "/sys/fs/cgroup%s", line + 3);
        for (;;) {
            snprintf(path, sizeof path, "%s/memory.max", dir);
            lim = file_number(path);
            snprintf(path, sizeof path, "%s/memory.current", dir);
            use = file_number(path);
            if (lim > 0 && use >= 0 && (best < 0 || lim - use < best)) best = lim > use ? lim - use : 0;
            char *slash = strrchr(dir, '/');
            if (!slash || slash - dir < (long)strlen("/sys/fs/cgroup")) break;
            *slash = 0;
        }
    }
    fclose(f);
    return best;
}

long long cli_mem_available(void) {
    long long avail = -1;
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &avail) == 1) {
            avail *= 1024;
            break;
        }
    if (f) fclose(f);
    long long room = cgroup_mem_room();
    if (room >= 0 && (avail < 0 || room < avail)) avail = room;
    return avail > 0 ? avail : 0;
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

int cli_runtime_env(CliRuntime *rt, RsErr *e) {
    return cli_backend_env(&rt->cpu_kernels, &rt->sw, e);
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
