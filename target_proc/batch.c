/* The batcher and its views (batch.h). Two locks: mu guards the views' states and the
 * scheduler's bookkeeping; bk guards the shared backend, whose thread pool takes one caller
 * at a time (a pass, a view's row query, commit or reset). A pass runs only while every
 * active view waits in forward(), so no view reads kept rows while a pass replaces them.
 * A view waits for its pass on a semaphore of its own, not on a condition of mu: woken
 * together, the views would take mu back one after another, each waiting for the one
 * before it to be scheduled, and the next pass would wait for the last of them. */
#include "batch.h"
#include "kernels/backend_impl.h"
#include "kernels/prefill.h"
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <semaphore.h>
#include <string.h>
#include <time.h>

enum { VIEW_IDLE, VIEW_WAITING, VIEW_DONE };

typedef struct {
    Backend base; /* must stay first */
    Batcher *bt;
    int seq;      /* its sequence of the shared backend */
    int active;   /* in a decode: holds passes back until it waits */
    uint64_t ticket; /* when it became active: older views go first */
    uint64_t joined; /* the passes run when it became active (a prompt's age, in passes) */
    int preempted;
    int answered; /* a pass kept logits of its since it became active */
    /* under mu: the forward it waits in, and what it returned */
    int state;
    int wake;     /* its forward is answered: the scheduler posts reply after the pass */
    sem_t reply;
    BackendSeg seg;
    int done;     /* rows of seg that earlier passes ran (a prompt split over passes) */
    int take;     /* rows of seg the pass being built runs */
    const int *out_rows;
    int n_out;
    int kept0; /* its kept rows' first index in the pass's kept rows */
    int rc;
    RsErr err;
    int pass_rows, pass_seqs; /* the pass it ran in: all rows, sequences */
    int pass_prefill;         /* of its rows, prefill chunks' */
    Planner *planner; /* batcher_plan */
    double *csum;     /* (row_chunks(vocab)) row_stats' scratch on the view's thread */
} View;

struct Batcher {
    Backend *b; /* the shared backend */
    BatchOpts o;
    pthread_mutex_t mu, bk;
    pthread_cond_t sched_cv, blocks_cv;
    View **views; // (parallel)
    int n_views, n_active, n_waiting, quit;
    uint64_t tickets;
    BatchStats st;
    Planner *passes; /* the passes' costs by rows, which every view's planner reads */
    pthread_t thread;
    /* the scheduler's scratch */
    View **pass;  // (parallel)
    View **scratch; // (parallel)
    BatchCand *cand; // (parallel)
    int *picked;     // (parallel)
    int *taken;      // (parallel)
    BackendSeg *segs;
    int *out_rows; // (row budget + the largest request)
};

extern const BackendOps batch_view_ops;

/* ---- the scheduler ---- */

/* Within a rank: a prompt waiting BATCH_PREFILL_AGE passes or more goes before the younger
 * ones, oldest first; among the others the fewest rows left go first (shortest remaining
 * prefill first), then the oldest. The other ranks: oldest first. */
static int pick_before(const BatchCand *a, const BatchCand *b) {
    if (a->rank == BATCH_PREFILL) {
        int sa = a->waited >= BATCH_PREFILL_AGE, sb = b->waited >= BATCH_PREFILL_AGE;
        if (sa != sb) return sa;
        if (!sa && a->rows != b->rows) return a->rows < b->rows;
    }
    return a->age < b->age;
}

int batch_pick(const BatchCand *c, int n, int row_budget, int *out, int *take) {
    int rows = 0, k = 0;
    for (int rank = 0; rank < BATCH_RANKS; rank++) {
        /* A pass that gives first tokens (taken before) carries no prompt rows, so it stays
         * short and the requests whose prompts are in are answered at once; the prompts'
         * rows wait one short pass. */
        if (rank == BATCH_PREFILL && k > 0) continue;
        for (;;) { /* the first candidate of this rank not yet taken that fits */
            int best = -1;
            for (int i = 0; i < n; i++) {
                int taken = 0;
                for (int j = 0; j < k && !taken; j++) taken = out[j] == i;
                if (taken || c[i].rank != rank) continue;
                /* a prompt's rows fit in part while the budget has any left */
                int fits = rank == BATCH_PREFILL ? rows < row_budget : rows + c[i].rows <= row_budget;
                if (k > 0 && !fits) continue;
                if (best < 0 || pick_before(&c[i], &c[best])) best = i;
            }
            if (best < 0) break;
            int r = c[best].rows;
            if (rank == BATCH_PREFILL && rows + r > row_budget) r = row_budget - rows;
            rows += r;
            take[k] = r;
            out[k++] = best;
        }
    }
    for (int i = 1; i < k; i++)
        for (int j = i; j > 0 && c[out[j - 1]].age > c[out[j]].age; j--) {
            int t = out[j], r = take[j];
            out[j] = out[j - 1];
            take[j] = take[j - 1];
            out[j - 1] = t;
            take[j - 1] = r;
        }
    return k;
}

/* The waiting views batch_pick takes, into bt->pass oldest first. Returns how many. */
static int pass_pick(Batcher *bt) {
    int n = 0;
    for (int i = 0; i < bt->n_views; i++) {
        View *v = bt->views[i];
        if (v->state != VIEW_WAITING) continue;
        /* A prompt's rows keep no logits and carry no mask, so any first part of them can
         * run in one pass and the rest in later ones (each row attends to the pending
         * entries before it: the same attention as in one forward); a decode's root or tree
         * pass keeps its rows' and runs whole. */
        int prompt = v->n_out == 0 && !v->seg.mask;
        int rank = prompt ? BATCH_PREFILL : v->answered ? BATCH_DECODE : BATCH_FIRST_TOKEN;
        uint64_t waited = bt->st.passes - v->joined;
        bt->cand[n] = (BatchCand){v->seg.n - v->done, rank, v->ticket,
                                  waited < INT_MAX ? (int)waited : INT_MAX};
        bt->scratch[n++] = v;
    }
    int k = batch_pick(bt->cand, n, bt->o.row_budget, bt->picked, bt->taken);
    for (int i = 0; i < k; i++) {
        bt->pass[i] = bt->scratch[bt->picked[i]];
        bt->pass[i]->take = bt->taken[i];
    }
    return k;
}

/* Empties the youngest active view other than keep and fails its forward (under mu and
 * bk). 0 when there is none. */
static int preempt_youngest(Batcher *bt, const View *keep) {
    View *v = NULL;
    for (int i = 0; i < bt->n_views; i++) {
        View *w = bt->views[i];
        if (w != keep && w->state == VIEW_WAITING && (!v || w->ticket > v->ticket)) v = w;
    }
    if (!v) return 0;
    backend_seq_close(bt->b, v->seq);
    RS_ASSERT(backend_seq_open(bt->b, &v->seq, NULL) == RS_OK);
    v->base.n_committed = v->base.n_pending = 0;
    v->preempted = 1;
    v->active = 0;
    bt->n_active--;
    v->rc = rs_err(&v->err, RS_EFULL, "preempted: the KV blocks went to older sequences");
    v->state = VIEW_DONE;
    v->wake = 1;
    bt->n_waiting--;
    bt->st.preemptions++;
    return 1;
}

/* Runs the first n views of bt->pass in one forward; drops the youngest while their blocks
 * are not free, then preempts. Returns how many ran (their results set). Under mu and bk. */
static int pass_run(Batcher *bt, int n) {
    RsErr e = {0};
    for (;;) {
        int n_out = 0, r0 = 0;
        for (int k = 0; k < n; k++) {
            View *v = bt->pass[k];
            RS_ASSERT(v->n_out == 0 || (v->done == 0 && v->take == v->seg.n));
            bt->segs[k] = (BackendSeg){v->seq, v->seg.tokens + v->done, v->seg.pos + v->done,
                                       v->take, v->seg.mask};
            v->kept0 = n_out;
            for (int j = 0; j < v->n_out; j++) bt->out_rows[n_out++] = r0 + v->out_rows[j];
            r0 += v->take;
        }
        uint64_t t0 = rs_now_ns();
        int rc = backend_forward_batch(bt->b, bt->segs, n, bt->out_rows, n_out, NULL, &e);
        uint64_t ns = rs_now_ns() - t0;
        if (rc == RS_EFULL && n > 1) {
            n--;
            continue;
        }
        if (rc == RS_EFULL && preempt_youngest(bt, bt->pass[0])) continue;
        int prefill = 0;
        bt->st.last_rows = 0;
        for (int k = 0; k < n; k++) {
            View *v = bt->pass[k];
            bt->st.last_rows += v->take;
            prefill += v->n_out == 0 ? v->take : 0;
            bt->st.rows += (uint64_t)v->take;
            bt->st.kept_rows += (uint64_t)v->n_out;
            v->done += rc ? 0 : v->take;
            if (!rc && v->done < v->seg.n) continue; /* the rest of its prompt waits */
            v->rc = rc;
            v->err = e;
            v->state = VIEW_DONE;
            v->wake = 1;
            v->answered |= !rc && v->n_out > 0;
            bt->n_waiting--;
        }
        bt->st.passes++;
        /* The planners price rows that keep logits: a prefill row keeps none and costs
         * less, so passes that carried prompt chunks would bend the fitted cost of a row
         * down. */
        if (!rc && !prefill) planner_observe_batch_pass(bt->passes, bt->st.last_rows, ns);
        bt->st.prompt_rows += (uint64_t)prefill;
        bt->st.pass_ns += ns;
        for (int k = 0; k < n; k++) {
            bt->pass[k]->pass_prefill = prefill;
            bt->pass[k]->pass_rows = bt->st.last_rows;
            bt->pass[k]->pass_seqs = n;
        }
        return n;
    }
}

/* Wakes the views whose forward the pass answered (under mu, after bk is free). */
static void views_wake(Batcher *bt) {
    for (int i = 0; i < bt->n_views; i++)
        if (bt->views[i]->wake) {
            bt->views[i]->wake = 0;
            sem_post(&bt->views[i]->reply);
        }
}

static void *sched_main(void *arg) {
    Batcher *bt = arg;
    pthread_mutex_lock(&bt->mu);
    for (;;) {
        while (!bt->quit && !(bt->n_active > 0 && bt->n_waiting == bt->n_active))
            pthread_cond_wait(&bt->sched_cv, &bt->mu);
        if (bt->quit) break;
        int n = pass_pick(bt);
        pthread_mutex_lock(&bt->bk);
        pass_run(bt, n);
        pthread_mutex_unlock(&bt->bk);
        views_wake(bt);
        pthread_cond_broadcast(&bt->blocks_cv);
    }
    pthread_mutex_unlock(&bt->mu);
    return NULL;
}

/* ---- the batcher ---- */

static int batch_check(const BatchOpts *o, RsErr *e) {
    if (o->parallel < 1 || o->parallel > 4096)
        return rs_err(e, RS_EINVAL, "--parallel %d outside [1, 4096]", o->parallel);
    if (o->prefill_chunk < 1 || o->prefill_chunk > PREFILL_CHUNK_MAX)
        return rs_err(e, RS_EINVAL, "--prefill-chunk %d outside [1, %d]", o->prefill_chunk,
                      PREFILL_CHUNK_MAX);
    if (o->row_budget < 1 || o->row_budget > 4096)
        return rs_err(e, RS_EINVAL, "--batch-rows %d outside [1, 4096]", o->row_budget);
    if (o->seq_capacity < 2 || o->kv_entries < o->seq_capacity)
        return rs_err(e, RS_EINVAL, "--kv-entries %d below --ctx %d (one sequence must fit)",
                      o->kv_entries, o->seq_capacity);
    return RS_OK;
}

int batcher_create(const Model *m, const BackendOps *ops, const BatchOpts *o, Batcher **out,
                   RsErr *e) {
    *out = NULL;
    int rc = batch_check(o, e);
    if (rc) return rc;
    /* the shared pass's most rows: the budget, or one view's largest request alone */
    int rows = o->row_budget > TARGET_MAX_BATCH ? o->row_budget : TARGET_MAX_BATCH;
    BackendParams bp = o->backend;
    bp.kv_capacity = o->kv_entries;
    bp.max_batch = rows;
    /* a round's passes, or a view's prompt piece: pending until its commit */
    bp.max_pending = o->prefill_chunk > TARGET_PASS_MAX + 2 ? o->prefill_chunk : TARGET_PASS_MAX + 2;
    bp.max_seqs = o->parallel + 1;
    Batcher *bt = rs_xcalloc(1, sizeof *bt);
    if ((rc = backend_create(ops, m, &bp, &bt->b, e))) {
        free(bt);
        return rc;
    }
    if (!bt->b->ops->forward_batch) {
        backend_destroy(&bt->b);
        free(bt);
        return rs_err(e, RS_EUNSUPPORTED, "--parallel: the %s backend runs one sequence at a "
                      "time (use --parallel 1)", ops->name);
    }
    bt->o = *o;
    bt->views = rs_xcalloc((size_t)o->parallel, sizeof *bt->views);
    bt->pass = rs_xcalloc((size_t)o->parallel, sizeof *bt->pass);
    bt->scratch = rs_xcalloc((size_t)o->parallel, sizeof *bt->scratch);
    bt->cand = rs_xcalloc((size_t)o->parallel, sizeof *bt->cand);
    bt->picked = rs_xcalloc((size_t)o->parallel, sizeof *bt->picked);
    bt->taken = rs_xcalloc((size_t)o->parallel, sizeof *bt->taken);
    bt->segs = rs_xcalloc((size_t)o->parallel, sizeof *bt->segs);
    bt->out_rows = rs_xcalloc((size_t)rows + TARGET_MAX_BATCH, sizeof(int));
    pthread_mutex_init(&bt->mu, NULL);
    pthread_mutex_init(&bt->bk, NULL);
    pthread_cond_init(&bt->sched_cv, NULL);
    pthread_cond_init(&bt->blocks_cv, NULL);
    bt->passes = planner_create();
    RS_ASSERT(pthread_create(&bt->thread, NULL, sched_main, bt) == 0);
    *out = bt;
    return RS_OK;
}

void batcher_destroy(Batcher **pb) {
    if (!pb || !*pb) return;
    Batcher *bt = *pb;
    RS_ASSERT(bt->n_views == 0);
    pthread_mutex_lock(&bt->mu);
    bt->quit = 1;
    pthread_cond_broadcast(&bt->sched_cv);
    pthread_mutex_unlock(&bt->mu);
    pthread_join(bt->thread, NULL);
    backend_destroy(&bt->b);
    planner_destroy(&bt->passes);
    pthread_mutex_destroy(&bt->mu);
    pthread_mutex_destroy(&bt->bk);
    pthread_cond_destroy(&bt->sched_cv);
    pthread_cond_destroy(&bt->blocks_cv);
    free(bt->views);
    free(bt->pass);
    free(bt->scratch);
    free(bt->cand);
    free(bt->picked);
    free(bt->taken);
    free(bt->segs);
    free(bt->out_rows);
    free(bt);
    *pb = NULL;
}

int batcher_target(Batcher *bt, const int *eog, int n_eog, Target **out, RsErr *e) {
    *out = NULL;
    pthread_mutex_lock(&bt->mu);
    int full = bt->n_views == bt->o.parallel;
    pthread_mutex_unlock(&bt->mu);
    if (full) return rs_err(e, RS_EFULL, "all %d views are in use (--parallel)", bt->o.parallel);
    View *v = rs_xcalloc(1, sizeof *v);
    v->csum = rs_xmalloc(sizeof(double) * (size_t)row_chunks(backend_model(bt->b)->cfg.vocab_size));
    v->base.ops = &batch_view_ops;
    v->base.model = backend_model(bt->b);
    v->base.params = backend_params(bt->b);
    v->base.dear_round_trip = backend_batch_queries(bt->b);
    v->base.params.kv_capacity = bt->o.seq_capacity;
    v->base.params.max_batch = TARGET_MAX_BATCH;
    v->base.params.prefill_chunk = bt->o.prefill_chunk;
    v->base.params.max_seqs = 1;
    v->bt = bt;
    pthread_mutex_lock(&bt->bk);
    int rc = backend_seq_open(bt->b, &v->seq, e);
    pthread_mutex_unlock(&bt->bk);
    if (rc) {
        free(v->csum);
        free(v);
        return rc;
    }
    RS_ASSERT(sem_init(&v->reply, 0, 0) == 0);
    pthread_mutex_lock(&bt->mu);
    bt->views[bt->n_views++] = v;
    pthread_mutex_unlock(&bt->mu);
    target_create_on(&v->base, eog, n_eog, out);
    return RS_OK;
}

/* Stops holding passes back (under mu). */
static void view_deactivate(View *v) {
    if (!v->active) return;
    v->active = 0;
    v->bt->n_active--;
    pthread_cond_signal(&v->bt->sched_cv);
}

static void view_reset(Backend *bb) {
    View *v = (View *)bb;
    pthread_mutex_lock(&v->bt->bk);
    backend_seq_close(v->bt->b, v->seq);
    RS_ASSERT(backend_seq_open(v->bt->b, &v->seq, NULL) == RS_OK);
    pthread_mutex_unlock(&v->bt->bk);
    bb->n_committed = bb->n_pending = 0;
    pthread_cond_broadcast(&v->bt->blocks_cv);
}

void batcher_leave(Target *t) {
    View *v = (View *)t->b;
    RS_ASSERT(v->base.ops == &batch_view_ops);
    /* Blocks first: a pass that ran once the view stopped holding passes back, but before
     * its blocks were free, could find the oldest decode short of blocks with nobody left
     * to preempt. No pass runs meanwhile: the view is active and not waiting. */
    view_reset(&v->base);
    pthread_mutex_lock(&v->bt->mu);
    view_deactivate(v);
    pthread_mutex_unlock(&v->bt->mu);
}

void batcher_plan(Target *t, Planner *pl) {
    View *v = (View *)t->b;
    RS_ASSERT(v->base.ops == &batch_view_ops);
    v->planner = pl;
    if (!pl) return;
    planner_set_batch(pl, 0, 1);
    planner_share_passes(pl, v->bt->passes);
}

int batcher_preempted(const Target *t) {
    const View *v = (const View *)t->b;
    return v->base.ops == &batch_view_ops && v->preempted;
}

int batcher_fork(Target *dst, Target *src, int n, RsErr *e) {
    View *d = (View *)dst->b, *s = (View *)src->b;
    RS_ASSERT(d->base.ops == &batch_view_ops && s->base.ops == &batch_view_ops && d->bt == s->bt);
    pthread_mutex_lock(&d->bt->bk);
    int rc = backend_seq_fork(d->bt->b, s->seq, d->seq, n, e);
    pthread_mutex_unlock(&d->bt->bk);
    if (!rc) d->base.n_committed = dst->n_forked = n;
    return rc;
}

int batcher_wait_blocks(Batcher *bt, int blocks, int timeout_ms) {
    struct timespec dl = rs_deadline_ms(timeout_ms);
    pthread_mutex_lock(&bt->mu);
    int ok = 0;
    for (;;) {
        pthread_mutex_lock(&bt->bk);
        BackendKvUsage u = backend_kv_usage(bt->b);
        pthread_mutex_unlock(&bt->bk);
        if ((ok = u.blocks_total - u.blocks_used >= blocks)) break;
        if (pthread_cond_timedwait(&bt->blocks_cv, &bt->mu, &dl) == ETIMEDOUT) break;
    }
    pthread_mutex_unlock(&bt->mu);
    return ok;
}

BatchStats batcher_stats(Batcher *bt) {
    pthread_mutex_lock(&bt->mu);
    BatchStats s = bt->st;
    s.active = bt->n_active;
    pthread_mutex_unlock(&bt->mu);
    pthread_mutex_lock(&bt->bk);
    BackendKvUsage u = backend_kv_usage(bt->b);
    pthread_mutex_unlock(&bt->bk);
    s.blocks_used = u.blocks_used;
    s.blocks_total = u.blocks_total;
    s.blocks_cached = u.blocks_cached;
    return s;
}

/* ---- the view's backend ops ---- */

static int view_forward(Backend *bb, const int *tokens, const int *pos, int n,
                        const uint8_t *mask, const int *out_rows, int n_out, float *logits,
                        RsErr *e) {
    View *v = (View *)bb;
    Batcher *bt = v->bt;
    int rc = backend_check_forward(bb, tokens, pos, n, mask, out_rows, n_out, e);
    if (rc) return rc;
    RS_ASSERT(!logits); /* decodes reduce their rows where they live */
    pthread_mutex_lock(&bt->mu);
    if (!v->active) {
        v->active = 1;
        v->preempted = 0;
        v->answered = 0;
        v->ticket = ++bt->tickets;
        v->joined = bt->st.passes;
        bt->n_active++;
    }
    v->seg = (BackendSeg){v->seq, tokens, pos, n, mask};
    v->done = 0;
    v->out_rows = out_rows;
    v->n_out = n_out;
    v->state = VIEW_WAITING;
    bt->n_waiting++;
    if (bt->n_waiting == bt->n_active) pthread_cond_signal(&bt->sched_cv); /* what it waits for */
    pthread_mutex_unlock(&bt->mu);
    while (sem_wait(&v->reply)) RS_ASSERT(errno == EINTR);
    rc = v->rc; /* written before the post */
    if (rc && e) *e = v->err;
    if (!rc) bb->n_pending += n;
    if (!rc && v->planner) {
        /* what the others bring next: their decodes' rows (a prompt chunk passes) */
        int others = v->pass_rows - v->pass_prefill - (n_out ? n : 0);
        planner_set_batch(v->planner, others, v->pass_seqs);
    }
    return rc;
}

static int view_commit(Backend *bb, const int *keep, int n_keep, RsErr *e) {
    View *v = (View *)bb;
    pthread_mutex_lock(&v->bt->bk);
    int rc = backend_seq_commit(v->bt->b, v->seq, keep, n_keep, e);
    pthread_mutex_unlock(&v->bt->bk);
    if (!rc) {
        bb->n_committed += n_keep;
        bb->n_pending = 0;
    }
    return rc;
}

/* Rows of the view (kept rows 0..n_kept of its last forward) in the pass's kept rows. */
static void view_rows(const View *v, const int *rows, int n, int *mapped) {
    for (int i = 0; i < n; i++) mapped[i] = v->kept0 + rows[i];
}

static int view_rows_copy(Backend *bb, const int *rows, int n, float *logits, RsErr *e) {
    View *v = (View *)bb;
    int *m = rs_xmalloc(sizeof(int) * (size_t)n);
    view_rows(v, rows, n, m);
    pthread_mutex_lock(&v->bt->bk);
    int rc = backend_rows_copy(v->bt->b, m, n, logits, e);
    pthread_mutex_unlock(&v->bt->bk);
    free(m);
    return rc;
}

/* Rows the view reduces on its own thread, at most: a decode's root row or a few tree
 * rows. More go through the shared backend's threads. */
#define VIEW_LOCAL_ROWS 4

/* A view's rows on its own thread where the shared backend keeps them in host memory: the
 * batch's decodes then reduce theirs side by side after a pass, where one after another
 * through the shared backend's thread pool (its lock and a pool call a decode) they held
 * the next pass back. No pass runs until this view waits again, so the rows stay put.
 * row_stats is the pool's reduction of one row (cpu_rows_stats: the same bits on any
 * number of threads). 0 when the rows are not there to read. */
static int rows_stats_here(View *v, const int *mapped, int n, const Sampling *s,
                           const double *u, RowStats *out) {
    int V = v->base.model->cfg.vocab_size;
    const float *row[VIEW_LOCAL_ROWS];
    if (n > VIEW_LOCAL_ROWS) return 0;
    for (int i = 0; i < n; i++)
        if (!(row[i] = backend_kept_row(v->bt->b, mapped[i]))) return 0;
    for (int i = 0; i < n; i++) row_stats(row[i], V, s, u ? u[i] : -1.0, v->csum, &out[i]);
    return 1;
}

static void view_rows_stats(Backend *bb, const int *rows, int n, const Sampling *s,
                            const double *u, RowStats *out) {
    View *v = (View *)bb;
    int *m = rs_xmalloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
    view_rows(v, rows, n, m);
    if (rows_stats_here(v, m, n, s, u, out)) {
        free(m);
        return;
    }
    pthread_mutex_lock(&v->bt->bk);
    RS_ASSERT(backend_rows_stats(v->bt->b, m, n, s, u, out, NULL) == RS_OK);
    pthread_mutex_unlock(&v->bt->bk);
    free(m);
}

static void view_rows_gather(Backend *bb, const int *rows, const int *ids, int n, float *out) {
    View *v = (View *)bb;
    int *m = rs_xmalloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
    view_rows(v, rows, n, m);
    pthread_mutex_lock(&v->bt->bk);
    RS_ASSERT(backend_rows_gather(v->bt->b, m, ids, n, out, NULL) == RS_OK);
    pthread_mutex_unlock(&v->bt->bk);
    free(m);
}

/* The prefix cache acts on the view's sequence of the shared backend. */
static int view_prefix_attach(Backend *bb, int seq, const int *tokens, int n) {
    View *v = (View *)bb;
    RS_ASSERT(seq == 0);
    pthread_mutex_lock(&v->bt->bk);
    int got = backend_prefix_attach(v->bt->b, v->seq, tokens, n);
    pthread_mutex_unlock(&v->bt->bk);
    bb->n_committed = got;
    return got;
}

static void view_prefix_publish(Backend *bb, int seq, const int *tokens, int n) {
    View *v = (View *)bb;
    RS_ASSERT(seq == 0);
    pthread_mutex_lock(&v->bt->bk);
    backend_prefix_publish(v->bt->b, v->seq, tokens, n);
    pthread_mutex_unlock(&v->bt->bk);
}

static void view_destroy(Backend **pb) {
    View *v = (View *)*pb;
    Batcher *bt = v->bt;
    /* blocks first, as batcher_leave */
    pthread_mutex_lock(&bt->bk);
    backend_seq_close(bt->b, v->seq);
    pthread_mutex_unlock(&bt->bk);
    pthread_mutex_lock(&bt->mu);
    view_deactivate(v);
    for (int i = 0; i < bt->n_views; i++)
        if (bt->views[i] == v) bt->views[i] = bt->views[--bt->n_views];
    pthread_mutex_unlock(&bt->mu);
    pthread_cond_broadcast(&bt->blocks_cv);
    sem_destroy(&v->reply);
    free(v->csum);
    free(v);
    *pb = NULL;
}

static int view_create(const Model *m, const BackendParams *bp, Backend **out, RsErr *e) {
    *out = NULL;
    return rs_err(e, RS_EUNSUPPORTED, "a batcher view is made by batcher_target");
}

const BackendOps batch_view_ops = {
    .name = "batch",
    .create = view_create,
    .destroy = view_destroy,
    .forward = view_forward,
    .kv_commit = view_commit,
    .kv_reset = view_reset,
    .rows_copy = view_rows_copy,
    .rows_stats = view_rows_stats,
    .rows_gather = view_rows_gather,
    .prefix_attach = view_prefix_attach,
    .prefix_publish = view_prefix_publish,
};
