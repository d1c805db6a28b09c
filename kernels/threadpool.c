/* Thread pool of the CPU backend (see threadpool.h). A job is published by bumping `gen`;
 * workers spin on it (pause) for SPIN_NS, then sleep on it with FUTEX_WAIT. The caller
 * waits for `busy` to drop to zero, spinning too: a region ends microseconds after the
 * caller's own share. */
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

struct ThreadPool {
    int n;
    Worker *w;    // (n); w[0] is the caller and has no thread
    _Atomic uint32_t gen;  /* bumped once per job; futex word */
    _Atomic int busy;      /* workers still inside the current job */
    _Atomic int sleepers;  /* workers in FUTEX_WAIT (the caller wakes only if > 0) */
    _Atomic int quit;
    TpFn fn;
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
static uint32_t wait_job(ThreadPool *p, uint32_t seen) {
    uint64_t t0 = 0;
    for (unsigned i = 1;; i++) {
        uint32_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g != seen) return g;
        cpu_relax();
        if (i % 64) continue;
        uint64_t now = rs_now_ns();
        if (!t0) t0 = now;
        else if (now - t0 > SPIN_NS) {
            atomic_fetch_add(&p->sleepers, 1);
            futex_wait(&p->gen, seen);
            atomic_fetch_sub(&p->sleepers, 1);
            t0 = 0;
        }
    }
}

static void *worker_main(void *a) {
    Worker *w = a;
    ThreadPool *p = w->pool;
    if (w->cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(w->cpu, &set);
        pthread_setaffinity_np(pthread_self(), sizeof set, &set); /* best effort */
    }
    uint32_t seen = 0;
    for (;;) {
        seen = wait_job(p, seen);
        if (atomic_load(&p->quit)) return NULL;
        p->fn(p->arg, w->tid, p->n);
        atomic_fetch_sub_explicit(&p->busy, 1, memory_order_release);
    }
}

/* CPU of the process's affinity set for worker tid (tid 0, the caller, takes the first),
 * or -1 when pinning is off or there are fewer CPUs than workers. */
static int pin_cpu(int tid, int n) {
    const char *env = getenv("ROOTSPEC_CPU_PIN");
    if (env && strcmp(env, "0") == 0) return -1;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0 || CPU_COUNT(&set) < n) return -1;
    for (int c = 0, k = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set) && k++ == tid) return c;
    return -1;
}

int threadpool_create(int n_threads, ThreadPool **out, RsErr *e) {
    *out = NULL;
    RS_ASSERT(n_threads >= 1);
    ThreadPool *p = rs_xcalloc(1, sizeof *p);
    p->n = n_threads;
    p->w = rs_xcalloc((size_t)n_threads, sizeof(Worker));
    for (int i = 1; i < n_threads; i++) {
        Worker *w = &p->w[i];
        w->pool = p;
        w->tid = i;
        w->cpu = pin_cpu(i, n_threads);
        int rc = pthread_create(&w->th, NULL, worker_main, w);
        if (rc) {
            p->n = i; /* destroy joins the ones started */
            threadpool_destroy(&p);
            return rs_err(e, RS_EIO, "cannot start CPU worker thread %d of %d: %s", i,
                          n_threads, strerror(rc));
        }
    }
    *out = p;
    return RS_OK;
}

void threadpool_destroy(ThreadPool **pp) {
    if (!pp || !*pp) return;
    ThreadPool *p = *pp;
    atomic_store(&p->quit, 1);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    futex_wake_all(&p->gen);
    for (int i = 1; i < p->n; i++) pthread_join(p->w[i].th, NULL);
    free(p->w);
    free(p);
    *pp = NULL;
}

void threadpool_run(ThreadPool *p, TpFn fn, void *arg) {
    if (p->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->busy, p->n - 1, memory_order_relaxed);
    atomic_fetch_add(&p->gen, 1); /* seq_cst: ordered before the sleepers load */
    if (atomic_load(&p->sleepers) > 0) futex_wake_all(&p->gen);
    fn(arg, 0, p->n);
    for (unsigned i = 1; atomic_load_explicit(&p->busy, memory_order_acquire) > 0; i++) {
        cpu_relax();
        if (i > 2048) sched_yield(); /* a descheduled worker may need this core */
    }
}

int threadpool_size(const ThreadPool *p) { return p->n; }
