/* The CPU backend's own thread pool: a fixed set of workers (pinned to distinct CPUs of the
 * process's affinity set unless ROOTSPEC_CPU_PIN=0) that run one parallel region at a
 * time. A forward() runs a dozen regions per layer, microseconds apart, so workers spin
 * on the job counter for a while before they sleep on a futex: waking a sleeping thread
 * costs more than a small region takes. The calling thread is worker 0 and takes its
 * share, so a pool of 1 runs everything inline with no threads at all. */
#ifndef ROOTSPEC_THREADPOOL_H
#define ROOTSPEC_THREADPOOL_H
#include "common/util.h"

typedef struct ThreadPool ThreadPool;

/* fn(arg, tid, n_threads) runs once on every worker, tid 0 being the caller. */
typedef void (*TpFn)(void *arg, int tid, int n_threads);

/* n_threads >= 1 (the caller counts as one). RS_EIO when a thread cannot be started. */
int threadpool_create(int n_threads, ThreadPool **out, RsErr *e);
void threadpool_destroy(ThreadPool **p);
/* Runs fn on all workers and returns when every one has finished. Not reentrant: one
 * caller thread at a time. */
void threadpool_run(ThreadPool *p, TpFn fn, void *arg);
int threadpool_size(const ThreadPool *p);

/* [*lo, *hi): tid's contiguous share of n items split n_threads ways. */
static inline void threadpool_share(int n, int tid, int n_threads, int *lo, int *hi) {
    *lo = (int)((long long)n * tid / n_threads);
    *hi = (int)((long long)n * (tid + 1) / n_threads);
}

#endif
