/* In-process DraftClient: the drafter grows its pool on a worker thread, so even in one
 * process the target's root pass overlaps drafting (on a second core), as it does across
 * two processes. grow_begin hands the commit to the worker and returns; grow_end waits. */
#include "decode.h"
#include "draft_proc/drafter.h"
#include <pthread.h>
#include <string.h>

typedef struct {
    Drafter *d;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int job, busy, done, quit; /* job: a commit is waiting; busy: until its pool is
                                  ready (done); a new commit waits for the last one */
    int *tokens;         // (cap) the commit, copied: the caller's buffer is reused
    int n, cap, reset;
    int threaded;        /* 0: no worker; grow_begin runs the job itself */
    Pool *pool;          /* worker's result */
    int rc;
    RsErr err;
} LocalClient;

static void run_job(LocalClient *lc) {
    if (lc->reset) drafter_reset(lc->d);
    lc->rc = drafter_commit_grow(lc->d, lc->tokens, lc->n, lc->pool, &lc->err);
}

static void *worker(void *arg) {
    LocalClient *lc = arg;
    pthread_mutex_lock(&lc->mu);
    for (;;) {
        while (!lc->job && !lc->quit) pthread_cond_wait(&lc->cv, &lc->mu);
        if (lc->quit) break;
        lc->job = 0;
        pthread_mutex_unlock(&lc->mu);
        run_job(lc); /* tokens, pool, rc, err are the worker's until done is set */
        pthread_mutex_lock(&lc->mu);
        lc->done = 1;
        lc->busy = 0;
        pthread_cond_broadcast(&lc->cv);
    }
    pthread_mutex_unlock(&lc->mu);
    return NULL;
}

static int local_begin(DraftClient *c, const int *tokens, int n, int reset, RsErr *e) {
    LocalClient *lc = c->self;
    pthread_mutex_lock(&lc->mu);
    while (lc->busy) pthread_cond_wait(&lc->cv, &lc->mu); /* an abandoned round's growth */
    if (n > lc->cap) {
        lc->cap = n;
        lc->tokens = realloc(lc->tokens, sizeof(int) * (size_t)n);
        RS_ASSERT(lc->tokens);
    }
    memcpy(lc->tokens, tokens, sizeof(int) * (size_t)n);
    lc->n = n;
    lc->reset = reset;
    if (!lc->threaded) {
        pthread_mutex_unlock(&lc->mu);
        run_job(lc);
        lc->done = 1;
        return RS_OK;
    }
    lc->done = 0;
    lc->busy = 1;
    lc->job = 1;
    pthread_cond_broadcast(&lc->cv);
    pthread_mutex_unlock(&lc->mu);
    return RS_OK;
}

static int local_end(DraftClient *c, Pool *out, RsErr *e) {
    LocalClient *lc = c->self;
    pthread_mutex_lock(&lc->mu);
    while (!lc->done) pthread_cond_wait(&lc->cv, &lc->mu);
    int rc = lc->rc;
    if (rc && e) *e = lc->err;
    if (!rc) memcpy(out, lc->pool, sizeof(Pool));
    pthread_mutex_unlock(&lc->mu);
    return rc;
}

void draftclient_local_init(DraftClient *c, Drafter *d, int threaded) {
    LocalClient *lc = rs_xcalloc(1, sizeof *lc);
    lc->d = d;
    lc->threaded = threaded;
    lc->pool = rs_xmalloc(sizeof(Pool));
    pthread_mutex_init(&lc->mu, NULL);
    pthread_cond_init(&lc->cv, NULL);
    if (threaded) RS_ASSERT(pthread_create(&lc->th, NULL, worker, lc) == 0);
    c->grow_begin = local_begin;
    c->grow_end = local_end;
    c->self = lc;
}

void draftclient_local_free(DraftClient *c) {
    LocalClient *lc = c->self;
    if (!lc) return;
    pthread_mutex_lock(&lc->mu);
    while (lc->busy) pthread_cond_wait(&lc->cv, &lc->mu); /* let a running job finish */
    lc->quit = 1;
    pthread_cond_broadcast(&lc->cv);
    pthread_mutex_unlock(&lc->mu);
    if (lc->threaded) pthread_join(lc->th, NULL);
    pthread_mutex_destroy(&lc->mu);
    pthread_cond_destroy(&lc->cv);
    free(lc->tokens);
    free(lc->pool);
    free(lc);
    c->self = NULL;
}
