/* The threaded kind of Drafter: an adapter that grows any inner drafter's pool on a worker
 * thread, so even in one process the target's root pass overlaps drafting (on a second
 * core), as it does across two processes. grow_begin hands the commit to the worker and
 * returns; grow_end waits. After a growth the worker lets the inner drafter run ahead
 * (drafter_ahead) until the caller wants it again: busy stays set meanwhile, and a caller
 * waiting for the worker (wait_idle) raises `wanted`, which stops run-ahead at its next
 * pass. The inner drafter is touched only by the worker while busy, and only by the
 * caller (under the lock, the worker idle) otherwise. */
#include "drafter_impl.h"
#include <pthread.h>
#include <string.h>

typedef struct {
    Drafter *inner;      /* owned */
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int job, busy, done, quit; /* job: a commit is waiting; busy: until its pool is
                                  ready (done); a new commit waits for the last one */
    int *tokens;         // (cap) the commit, copied: the caller's buffer is reused
    int n, cap;
    uint8_t *features;   // (feat_cap) the commit's features, copied likewise
    size_t feat_bytes, feat_cap;
    Pool *pool;          /* worker's result */
    int rc;
    RsErr err;
    int wanted;          /* a caller waits for the worker (atomic): run-ahead stops */
} ThreadDrafter;

static int caller_waits(void *arg) {
    return __atomic_load_n(&((ThreadDrafter *)arg)->wanted, __ATOMIC_ACQUIRE);
}

static void run_job(ThreadDrafter *td) {
    td->err = (RsErr){0};
    td->rc = drafter_grow(td->inner, td->tokens, td->n, td->feat_bytes ? td->features : NULL,
                          td->feat_bytes, td->pool, &td->err);
}

static void *worker(void *arg) {
    ThreadDrafter *td = arg;
    pthread_mutex_lock(&td->mu);
    for (;;) {
        while (!td->job && !td->quit) pthread_cond_wait(&td->cv, &td->mu);
        if (td->quit) break;
        td->job = 0;
        pthread_mutex_unlock(&td->mu);
        run_job(td); /* tokens, pool, rc, err are the worker's until done is set */
        pthread_mutex_lock(&td->mu);
        td->done = 1;
        pthread_cond_broadcast(&td->cv);
        if (td->rc == RS_OK && !td->quit) {
            pthread_mutex_unlock(&td->mu);
            drafter_ahead(td->inner, caller_waits, td);
            pthread_mutex_lock(&td->mu);
        }
        td->busy = 0;
        pthread_cond_broadcast(&td->cv);
    }
    pthread_mutex_unlock(&td->mu);
    return NULL;
}

/* Called with the lock held: waits out an abandoned round's growth. */
static void wait_idle(ThreadDrafter *td) {
    __atomic_store_n(&td->wanted, 1, __ATOMIC_RELEASE);
    while (td->busy) pthread_cond_wait(&td->cv, &td->mu);
    __atomic_store_n(&td->wanted, 0, __ATOMIC_RELEASE);
}

static int thread_reset(void *ctx, const int *prompt, int n, const void *features,
                        size_t feat_bytes, RsErr *e) {
    ThreadDrafter *td = ctx;
    pthread_mutex_lock(&td->mu);
    wait_idle(td);
    td->done = 0; /* the abandoned growth's pool is not this context's */
    int rc = drafter_reset(td->inner, prompt, n, features, feat_bytes, e);
    pthread_mutex_unlock(&td->mu);
    return rc;
}

static int thread_append(void *ctx, const int *tokens, int n, const void *features,
                         size_t feat_bytes, RsErr *e) {
    ThreadDrafter *td = ctx;
    pthread_mutex_lock(&td->mu);
    wait_idle(td);
    td->done = 0;
    int rc = drafter_append(td->inner, tokens, n, features, feat_bytes, e);
    pthread_mutex_unlock(&td->mu);
    return rc;
}

static void thread_set_shape(void *ctx, int depth, int width) {
    ThreadDrafter *td = ctx;
    pthread_mutex_lock(&td->mu);
    wait_idle(td);
    drafter_set_shape(td->inner, depth, width);
    pthread_mutex_unlock(&td->mu);
}

static void copy_commit(ThreadDrafter *td, const int *tokens, int n, const void *features,
                        size_t feat_bytes) {
    if (n > td->cap) {
        td->cap = n;
        td->tokens = realloc(td->tokens, sizeof(int) * (size_t)n);
        RS_ASSERT(td->tokens);
    }
    if (n > 0) memcpy(td->tokens, tokens, sizeof(int) * (size_t)n);
    td->n = n;
    if (feat_bytes > td->feat_cap) {
        td->feat_cap = feat_bytes;
        td->features = realloc(td->features, feat_bytes);
        RS_ASSERT(td->features);
    }
    if (feat_bytes) memcpy(td->features, features, feat_bytes);
    td->feat_bytes = feat_bytes;
}

static int thread_grow_begin(void *ctx, const int *tokens, int n, const void *features,
                             size_t feat_bytes, RsErr *e) {
    ThreadDrafter *td = ctx;
    pthread_mutex_lock(&td->mu);
    wait_idle(td);
    copy_commit(td, tokens, n, features, feat_bytes);
    td->done = 0;
    td->busy = 1;
    td->job = 1;
    pthread_cond_broadcast(&td->cv);
    pthread_mutex_unlock(&td->mu);
    return RS_OK;
}

static int thread_grow_end(void *ctx, Pool *out, RsErr *e) {
    ThreadDrafter *td = ctx;
    pthread_mutex_lock(&td->mu);
    while (!td->done) pthread_cond_wait(&td->cv, &td->mu);
    int rc = td->rc;
    if (rc && e) *e = td->err;
    if (!rc) memcpy(out, td->pool, sizeof(Pool));
    pthread_mutex_unlock(&td->mu);
    return rc;
}

static void thread_destroy(void *ctx) {
    ThreadDrafter *td = ctx;
    pthread_mutex_lock(&td->mu);
    wait_idle(td); /* let a running job finish */
    td->quit = 1;
    pthread_cond_broadcast(&td->cv);
    pthread_mutex_unlock(&td->mu);
    pthread_join(td->th, NULL);
    pthread_mutex_destroy(&td->mu);
    pthread_cond_destroy(&td->cv);
    drafter_destroy(&td->inner);
    free(td->tokens);
    free(td->features);
    free(td->pool);
    free(td);
}

static void thread_ahead_stats(const void *ctx, DrafterAheadStats *st) {
    ThreadDrafter *td = (ThreadDrafter *)ctx;
    pthread_mutex_lock(&td->mu);
    wait_idle(td);
    *st = drafter_ahead_stats(td->inner);
    pthread_mutex_unlock(&td->mu);
}

static const DrafterOps thread_ops = {
    .reset = thread_reset,
    .grow_begin = thread_grow_begin,
    .grow_end = thread_grow_end,
    .destroy = thread_destroy,
    .append = thread_append,
    .set_shape = thread_set_shape,
    .ahead_stats = thread_ahead_stats,
};

int drafter_threaded_create(Drafter *inner, Drafter **out, RsErr *e) {
    *out = NULL;
    ThreadDrafter *td = rs_xcalloc(1, sizeof *td);
    td->inner = inner;
    td->pool = rs_xmalloc(sizeof(Pool));
    pthread_mutex_init(&td->mu, NULL);
    pthread_cond_init(&td->cv, NULL);
    if (pthread_create(&td->th, NULL, worker, td) != 0) {
        pthread_mutex_destroy(&td->mu);
        pthread_cond_destroy(&td->cv);
        drafter_destroy(&td->inner);
        free(td->pool);
        free(td);
        return rs_err(e, RS_ENOMEM, "cannot start the drafter's worker thread");
    }
    *out = drafter_wrap(&thread_ops, td, drafter_info(inner));
    return RS_OK;
}
