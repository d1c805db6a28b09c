/* Thread pool of the CPU backend (see threadpool.h). A job is published by bumping `gen`;
 * workers spin on it (pause) for SPIN_NS, then sleep on it with FUTEX_WAIT. A job is
 * n chunks that threads claim one at a time from `claim` (generation, chunk count and
 * the unclaimed range in one word, so a claim can never mix two jobs); the caller claims
 * too and waits until every chunk is done, spinning: a region ends microseconds after the
 * last chunk. A worker that is slow to wake (descheduled on a busy machine) leaves its
 * chunks to the others instead of holding the region up. */
#include "threadpool.h"
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define SPIN_NS 200000 /* 0.2 ms: longer than the gap between a forward's regions */

typedef struct {
    ThreadPool *pool;
    int tid;
    int cpu; /* -1: not pinned */
    pthread_t th;
} Worker;

/* claim word: gen (20 bits) | chunk count (14) | unclaimed chunks [lo, hi) (14 + 14). The
 * caller claims from the front and the workers from the back, so each walks a contiguous
 * run of chunks (the streams the prefetchers see) until they meet. */
#define CB 14
#define CM ((1u << CB) - 1)
#define CLAIM(g, n, lo, hi)                                                                 \
    ((((uint64_t)(g) & 0xfffff) << (3 * CB)) | ((uint64_t)(n) << (2 * CB)) |                \
     ((uint64_t)(lo) << CB) | (uint64_t)(hi))
_Static_assert(THREADPOOL_MAX_CHUNKS == CM, "the claim word holds THREADPOOL_MAX_CHUNKS");

struct ThreadPool {
    int n;
    Worker *w;    // (n); w[0] is the caller and has no thread
    _Atomic uint32_t gen;   /* bumped once per job; futex word */
    _Atomic uint64_t claim; /* CLAIM(gen, chunks, next) of the current job */
    _Atomic int done;       /* chunks of the current job finished */
    _Atomic int sleepers;   /* workers in FUTEX_WAIT (the caller wakes only if > 0) */
    _Atomic int quit;
    TpFn fn;          /* threadpool_run's function, or NULL */
    TpChunkFn cfn;    /* threadpool_run_chunks's */
    void *arg;
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void futex_wait(_Atomic uint32_t *addr, uint32_t val) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *addr) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
}

/* Returns once gen differs from `seen`: spin first, then sleep. */
static uint32_t wait_job(ThreadPool *tp, uint32_t seen) {
    uint64_t t0 = 0;
    for (unsigned i = 1;; i++) {
        uint32_t g = atomic_load_explicit(&tp->gen, memory_order_acquire);
        if (g != seen) return g;
        cpu_relax();
        if (i % 64) continue;
        uint64_t now = rs_now_ns();
        if (!t0) t0 = now;
        else if (now - t0 > SPIN_NS) {
            atomic_fetch_add(&tp->sleepers, 1);
            futex_wait(&tp->gen, seen);
            atomic_fetch_sub(&tp->sleepers, 1);
            t0 = 0;
        }
    }
}

/* Claims and runs chunks of job `g` until none is left (or a newer job replaced it). A
 * successful claim keeps job g from finishing until its chunk is done, so fn and arg,
 * written before g's claim word, stay valid while it runs. */
static void run_claims(ThreadPool *tp, uint32_t g, int tid) {
    uint64_t c = atomic_load_explicit(&tp->claim, memory_order_acquire);
    for (;;) {
        int n = (int)((c >> 2 * CB) & CM), lo = (int)((c >> CB) & CM), hi = (int)(c & CM);
        if ((uint32_t)(c >> 3 * CB) != (g & 0xfffff) || lo >= hi) return;
        int i = tid == 0 ? lo : hi - 1;
        uint64_t next = tid == 0 ? c + ((uint64_t)1 << CB) : c - 1;
        if (!atomic_compare_exchange_weak_explicit(&tp->claim, &c, next, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue; /* c now holds the current word */
        if (tp->cfn) tp->cfn(tp->arg, i, n, tid);
        else tp->fn(tp->arg, i, n);
        atomic_fetch_add_explicit(&tp->done, 1, memory_order_release);
        c = atomic_load_explicit(&tp->claim, memory_order_acquire);
    }
}

static void *worker_main(void *a) {
    Worker *w = a;
    ThreadPool *tp = w->pool;
    if (w->cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(w->cpu, &set);
        pthread_setaffinity_np(pthread_self(), sizeof set, &set); /* best effort */
    }
    uint32_t seen = 0;
    for (;;) {
        seen = wait_job(tp, seen);
        if (atomic_load(&tp->quit)) return NULL;
        run_claims(tp, seen, w->tid);
    }
}

/* CPU of the process's affinity set for worker tid (tid 0, the caller, takes the first),
 * or -1 when there are fewer CPUs than workers. */
static int pin_cpu(int tid, int n) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0 || CPU_COUNT(&set) < n) return -1;
    for (int c = 0, k = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set) && k++ == tid) return c;
    return -1;
}

int threadpool_create(int n_threads, int pin, ThreadPool **out, RsErr *e) {
    *out = NULL;
    RS_ASSERT(n_threads >= 1);
    ThreadPool *tp = rs_xcalloc(1, sizeof *tp);
    tp->n = n_threads;
    tp->w = rs_xcalloc((size_t)n_threads, sizeof(Worker));
    for (int i = 1; i < n_threads; i++) {
        Worker *w = &tp->w[i];
        w->pool = tp;
        w->tid = i;
        w->cpu = pin ? pin_cpu(i, n_threads) : -1;
        int rc = pthread_create(&w->th, NULL, worker_main, w);
        if (rc) {
            tp->n = i; /* destroy joins the ones started */
            threadpool_destroy(&tp);
            return rs_err(e, RS_EIO, "cannot start CPU worker thread %d of %d: %s", i,
                          n_threads, strerror(rc));
        }
    }
    *out = tp;
    return RS_OK;
}

void threadpool_destroy(ThreadPool **pp) {
    if (!pp || !*pp) return;
    ThreadPool *tp = *pp;
    atomic_store(&tp->quit, 1);
    atomic_fetch_add_explicit(&tp->gen, 1, memory_order_release);
    futex_wake_all(&tp->gen);
    for (int i = 1; i < tp->n; i++) pthread_join(tp->w[i].th, NULL);
    free(tp->w);
    free(tp);
    *pp = NULL;
}

/* Publishes a job of n chunks, takes part in it and returns once every chunk is done. */
static void run_job(ThreadPool *tp, TpFn fn, TpChunkFn cfn, void *arg, int n) {
    RS_ASSERT(n >= 1 && n <= THREADPOOL_MAX_CHUNKS);
    if (tp->n == 1) {
        for (int i = 0; i < n; i++) cfn ? cfn(arg, i, n, 0) : fn(arg, i, n);
        return;
    }
    tp->fn = fn;
    tp->cfn = cfn;
    tp->arg = arg;
    atomic_store_explicit(&tp->done, 0, memory_order_relaxed);
    uint32_t g = atomic_load_explicit(&tp->gen, memory_order_relaxed) + 1;
    atomic_store_explicit(&tp->claim, CLAIM(g, n, 0, n), memory_order_release);
    atomic_store(&tp->gen, g); /* seq_cst: ordered before the sleepers load */
    if (atomic_load(&tp->sleepers) > 0) futex_wake_all(&tp->gen);
    run_claims(tp, g, 0);
    for (unsigned i = 1; atomic_load_explicit(&tp->done, memory_order_acquire) < n; i++) {
        cpu_relax();
        if (i > 2048) sched_yield(); /* a descheduled worker may need this core */
    }
}

void threadpool_run(ThreadPool *tp, TpFn fn, void *arg) { run_job(tp, fn, NULL, arg, tp->n); }

void threadpool_run_chunks(ThreadPool *tp, TpChunkFn fn, void *arg, int n_chunks) {
    run_job(tp, NULL, fn, arg, n_chunks);
}

int threadpool_size(const ThreadPool *tp) { return tp->n; }
