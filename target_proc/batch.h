/* Iteration-level continuous batching (Orca, OSDI 2022) over one backend's sequences
 * (kernels/backend.h: Sequences). Each decode runs decode_run unchanged on a Target of its
 * own whose backend is a *view*: a sequence of the shared backend whose forward() does not
 * run alone but joins the batcher's next pass. A scheduler thread runs a pass once every
 * decode that has joined is waiting in forward() (a round boundary: each has finished its
 * host work of the round), taking their rows oldest first up to a row budget; the rest
 * wait for the next pass. Rows, kept logits and the row queries are mapped between the
 * view and the shared pass, so every decode sees exactly what it would see alone, and the
 * backend's batch invariance makes its logits the same bits: a decode's output equals its
 * solo output whatever shares its passes.
 *
 * Chunked prefill (Sarathi-Serve, OSDI 2024): a view forwards a prompt prefill_chunk rows
 * at a time, so a new prompt holds the running decodes' passes back by one chunk at most.
 * A pass serves first the requests whose prompt is in (their first token), then prompt
 * chunks, then the other decodes (batch_pick), so a request that arrives waits for the
 * pass in flight, then its chunks and one more pass give its first token, however many
 * decodes run; in a burst the prompts finish one after another, each answered at once.
 *
 * KV blocks. A pass whose sequences need more blocks than are free runs without its
 * youngest sequences (they wait); when even the oldest alone does not fit, the youngest
 * other decode is preempted: its sequence is emptied and its forward() fails with RS_EFULL
 * (batcher_preempted says so), so its owner restarts it later (recompute). */
#ifndef ROOTSPEC_BATCH_H
#define ROOTSPEC_BATCH_H
#include "planner.h"
#include "target.h"

typedef struct Batcher Batcher;

typedef struct {
    int parallel;      /* decodes at once (views), >= 1 */
    int row_budget;    /* most rows in one pass (a lone larger request still runs) */
    int prefill_chunk; /* prompt rows a decode adds to one pass, 1..PREFILL_CHUNK_MAX */
    int kv_entries;    /* the shared cache's entries (kv_capacity), all sequences together */
    int seq_capacity;  /* the most entries one sequence may hold (a decode's --ctx) */
    BackendParams backend; /* the shared backend's settings (threads, kernel family, ...);
                              its sizes come from the fields above */
} BatchOpts;

typedef struct {
    int active;              /* views in a decode now */
    int blocks_used, blocks_total;
    int blocks_cached; /* in the prefix cache, held or idle */
    uint64_t passes, rows;   /* passes run and the rows they carried */
    uint64_t preemptions;
    uint64_t pass_ns;        /* time the passes took (the rest: decodes' host work) */
    int last_rows;           /* rows of the last pass */
} BatchStats;

/* What a waiting request's rows are for, in the order batch_pick serves them. */
enum {
    BATCH_FIRST_TOKEN, /* the pass after its prompt's last chunk: its first token */
    BATCH_PREFILL,     /* a prompt chunk (keeps no logits) */
    BATCH_DECODE,      /* a later round's pass */
    BATCH_RANKS
};

/* A waiting request's rows, as batch_pick sees them. */
typedef struct {
    int rows;     /* its segment's rows */
    int rank;     /* BATCH_FIRST_TOKEN, BATCH_PREFILL or BATCH_DECODE */
    uint64_t age; /* when it joined: smaller is older */
} BatchCand;

/* The pass over c[0..n): rank by rank, oldest first within a rank, each taken when it fits
 * what row_budget has left (the first taken always: a lone larger request still runs).
 * out (n) gets the taken indices, oldest first. Returns how many were taken (>= 1 when
 * n >= 1). */
int batch_pick(const BatchCand *c, int n, int row_budget, int *out);

/* Creates the shared backend (ops over m) and the scheduler thread. */
int batcher_create(const Model *m, const BackendOps *ops, const BatchOpts *o, Batcher **out,
                   RsErr *e);
/* Every target made by batcher_target must be destroyed first. Accepts NULL; clears *b. */
void batcher_destroy(Batcher **b);
/* A Target whose backend is a view on a sequence of its own (up to o->parallel of them).
 * Destroy it with target_destroy. */
int batcher_target(Batcher *bt, const int *eog, int n_eog, Target **out, RsErr *e);
/* Links a planner (--budget auto) to t's view: after each pass the view records the pass
 * by its total rows and tells the planner what the others brought (planner_set_batch), so
 * the decode prices its rows at the batch's cost and rate. */
void batcher_plan(Target *t, Planner *pl);
/* The decode on t ended (or failed): its sequence is emptied and it stops holding passes
 * back until its next forward(). */
void batcher_leave(Target *t);
/* 1 when t's last forward failed because its decode was preempted (it has left). */
int batcher_preempted(const Target *t);
/* dst's view starts as src's first n committed entries (backend_seq_fork: whole blocks
 * shared, the partial one copied), which dst's next decode keeps as its prompt's first n
 * tokens (Target.n_forked): a request's choices share one prefill. Neither may be in a
 * forward (src's owner calls it between rounds; dst's waits). RS_EFULL: no free block. */
int batcher_fork(Target *dst, Target *src, int n, RsErr *e);
/* Waits until `blocks` KV blocks are free, or timeout_ms passes (0 on timeout). */
int batcher_wait_blocks(Batcher *bt, int blocks, int timeout_ms);
BatchStats batcher_stats(Batcher *bt);

#endif
