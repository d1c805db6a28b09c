/* Small, strict command-line value parsers shared by the programs: every rejected value
 * is named in the message. */
#ifndef ROOTSPEC_CLI_H
#define ROOTSPEC_CLI_H
#include "util.h"
#include <stdint.h>

int cli_int(const char *opt, const char *val, long min, long max, int *out, RsErr *e);
/* A finite number, however small: an underflow (1e-400) is the number it rounds to
 * (subnormal or 0); the range is the caller's to check. */
int cli_real(const char *opt, const char *val, double *out, RsErr *e);
/* A finite decimal or exponent number in [min, max]. */
int cli_double(const char *opt, const char *val, double min, double max, double *out, RsErr *e);
int cli_u64(const char *opt, const char *val, uint64_t *out, RsErr *e);
/* --budget: "auto" gives 0 (the cost-aware budget), else B in 1..TREE_MAX. */
int cli_budget(const char *val, int *out, RsErr *e);
/* --pool-shape: "DEPTH,WIDTH", depth 1..POOL_MAX_DEPTH, width 1..POOL_EXPAND (common/pool.h). */
int cli_pool_shape(const char *val, int *depth, int *width, RsErr *e);
/* Switches for measuring one backend path against another and for tests; all zero is the
 * product's choice. A program reads them from the environment once, at start-up
 * (cli_backend_env), and passes them on in BackendParams.sw; a backend ignores the other
 * backends' switches. */
typedef struct {
    int cpu_kv_f32;     /* ROOTSPEC_CPU_KV=f32 (f16: 0): the CPU KV cache in f32 even where
                           the kernel family reads f16 */
    int cpu_unpacked;   /* ROOTSPEC_CPU_PACK=0 (1: 0): the CPU keeps the file's row layout
                           instead of the x4 interleave */
    int cpu_unpinned;   /* ROOTSPEC_CPU_PIN=0 (1: 0): CPU worker threads are not pinned */
    int cuda_eager;     /* ROOTSPEC_CUDA_GRAPHS=0 (1: 0): CUDA forwards launch kernel by
                           kernel instead of replaying captured graphs */
    int cuda_fused_qkv; /* ROOTSPEC_CUDA_FUSED_QKV: 0 (unset or 1): one-row calls take the
                           fused q|k|v kernel, -1 (0): never, 1 (all): every call a graph
                           serves */
    int cuda_blas_onerow; /* ROOTSPEC_CUDA_GEMV=0 (1: 0): a one-row call's o, gate|up, down
                             and head on cuBLAS instead of the own GEMV kernels */
    int rows_batched;   /* ROOTSPEC_ROWS_BATCHED: 0 (unset): the backend's choice
                           (backend_batch_queries), 1 (1): callers gather their row queries
                           into one call, -1 (0): one call per row read */
} BackendSwitches;

/* The options rootspec-target and rootspec-draft share, parsed alike: where the model runs
 * and how the two processes secure their link. */
typedef struct {
    const char *backend;   /* --backend: "cpu" or "cuda" */
    int threads, ctx, device;
    int batch_invariant;   /* --batch-invariant: BackendParams.batch_invariant */
    const char *cpu_kernels; /* ROOTSPEC_CPU_KERNELS: BackendParams.cpu_kernels */
    BackendSwitches sw;      /* the other ROOTSPEC_ variables: BackendParams.sw */
    int insecure;          /* --insecure: plain tcp:// */
    const char *curve_dir; /* --curve-dir */
} CliRuntime;

/* The environment's backend settings, the one place a program reads them (at start-up):
 * ROOTSPEC_CPU_KERNELS into *cpu_kernels (NULL when unset: the best family the CPU has)
 * and the switches into *sw. A value a variable does not take: RS_EINVAL, naming it. */
int cli_backend_env(const char **cpu_kernels, BackendSwitches *sw, RsErr *e);
/* Defaults: cpu, 1 thread, 2048 KV entries, device 0, no environment settings. */
CliRuntime cli_runtime_defaults(void);
/* cli_backend_env into rt->cpu_kernels and rt->sw. */
int cli_runtime_env(CliRuntime *rt, RsErr *e);
/* When argv[*i] is one of CliRuntime's options, parses it and its value (advancing *i past
 * it) and returns 1; 0 when it is another option; RS_EINVAL (named in e) for a bad value. */
int cli_runtime_option(int argc, char **argv, int *i, CliRuntime *rt, RsErr *e);

/* The CPUs this process may run on: its affinity mask, capped by the cgroup CPU quota
 * (cgroup v2 cpu.max along the process's cgroup path, or v1 cpu.cfs_quota_us), rounded
 * up; at least 1. */
int cli_cpus_available(void);
/* Bytes of memory this process may still take: /proc/meminfo's MemAvailable, capped by the
 * room its cgroup leaves (v2 memory.max - memory.current along its path, or v1's limit);
 * 0 when unknown. */
long long cli_mem_available(void);

/* Returns argv[i+1] or sets an error "option X needs a value". */
int cli_value(int argc, char **argv, int i, const char **out, RsErr *e);
/* The exit status of a program that failed with status rc (!= RS_OK): 2 for bad usage or
 * input (RS_EINVAL, RS_EFORMAT, RS_EUNSUPPORTED), 1 for a runtime failure. */
int cli_exit_status(int rc);

#endif
