/* The CPU backend's own thread pool: a fixed set of workers (pinned to distinct CPUs of the
 * process's affinity set when asked to) that run one parallel region at a
 * time. A forward() runs a dozen regions per layer, microseconds apart, so workers spin
 * on the job counter for a while before they sleep on a futex: waking a sleeping thread
 * costs more than a small region takes. The calling thread is worker 0 and takes part, so
 * a pool of 1 runs everything inline with no threads at all. A region is a number of
 * chunks that the threads claim one by one: which thread runs a chunk is not fixed (a
 * late or descheduled worker's chunks go to the others), so a chunk's result must depend
 * on its index only, never on the thread. */
#ifndef ROOTSPEC_THREADPOOL_H
#define ROOTSPEC_THREADPOOL_H
#include "common/util.h"

typedef struct ThreadPool ThreadPool;

/* fn(arg, i, n) for every share i < n = the pool size, each exactly once, on whichever
 * worker claims it; returns when all are done. Not reentrant: one caller thread at a
 * time. */
typedef void (*TpFn)(void *arg, int i, int n);
#define THREADPOOL_MAX_CHUNKS 16383 /* chunks one region takes at most */
/* fn(arg, i, n_chunks, tid) for every chunk i < n_chunks (1..THREADPOOL_MAX_CHUNKS), each
 * exactly once; tid (< the pool size) names the thread running it, for per-thread scratch. */
typedef void (*TpChunkFn)(void *arg, int i, int n_chunks, int tid);

/* n_threads >= 1 (the caller counts as one). pin: worker i runs on the i-th CPU of the
 * process's affinity set (none when the set has fewer CPUs than workers); 0: wherever the
 * scheduler puts it (BackendSwitches.cpu_unpinned). RS_EIO when a thread cannot be
 * started. */
int threadpool_create(int n_threads, int pin, ThreadPool **out, RsErr *e);
void threadpool_destroy(ThreadPool **p);
void threadpool_run(ThreadPool *tp, TpFn fn, void *arg);
void threadpool_run_chunks(ThreadPool *tp, TpChunkFn fn, void *arg, int n_chunks);
int threadpool_size(const ThreadPool *tp);

/* [*lo, *hi): share tid's contiguous part of n items split n_threads ways. */
static inline void threadpool_share(int n, int tid, int n_threads, int *lo, int *hi) {
    *lo = (int)((long long)n * tid / n_threads);
    *hi = (int)((long long)n * (tid + 1) / n_threads);
}

#endif
