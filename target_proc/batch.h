/* Iteration-level continuous batching (Orca, OSDI 2022) over one backend's sequences
 * (kernels/backend.h: Sequences). Each decode runs decode_run unchanged on a Target of its
 * own whose backend is a *view*: a sequence of the shared backend whose forward() does not
 * run alone but joins the batcher's next pass. A scheduler thread runs a pass once every
 * decode that has joined is waiting in forward() (a round boundary: each has finished its
 * host work of the round), taking their rows in batch_pick's order up to a row budget; the
 * rest wait for the next pass. Rows, kept logits and the row queries are mapped between the
 * view and the shared pass, so every decode sees exactly what it would see alone, and the
 * backend's batch invariance makes its logits the same bits: a decode's output equals its
 * solo output whatever shares its passes.
 *
 * Chunked prefill (Sarathi-Serve, OSDI 2024): a view forwards its prompt prefill_chunk rows
 * at a time, and the batcher runs those rows over as many passes as the row budget needs
 * (a prompt's rows keep no logits and carry no mask, so a first part of them can run in one
 * pass and the rest later: each row attends to the pending entries before it, as in one
 * forward), so no pass outgrows the budget whatever the prompts. A pass serves first the
 * requests whose prompt is in (their first token), then prompt rows, then the other
 * decodes (batch_pick); a pass that gives first tokens carries no prompt rows, so it is
 * short and a request is answered right after its prompt's last pass, not a full pass
 * later (a pass's fixed cost is small against its rows'). Prompt rows go shortest remaining first (SRPT, the rule that
 * minimises mean completion time): the prompt nearest its end takes all the rows it has
 * left, as many chunks' worth as the budget holds, and the next shortest the rest, so in a
 * burst the prompts finish one after another, the short ones first, each answered in the
 * next (short) pass, instead of advancing side by side and finishing together late. A prompt that
 * has waited BATCH_PREFILL_AGE passes goes before the younger ones (oldest first), so a
 * stream of short prompts never starves a long one. The remaining rows the batcher sees are
 * those of the piece in hand (a prompt longer than prefill_chunk shows one piece at a time).
 * A request that arrives while others decode waits for the pass in flight, then its
 * prompt's passes and one more give its first token, however many decodes run; while
 * prompts fill the budget, decodes wait.
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
    int prefill_chunk; /* prompt rows a decode hands the batcher at once (one forward of its
                          view, run over one or more passes), 1..PREFILL_CHUNK_MAX */
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
    uint64_t kept_rows;      /* of those rows, the ones that kept logits (output head) */
    uint64_t prompt_rows;    /* of those rows, prompts' (no logits, no mask) */
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

/* Passes a prompt waits before its rows go ahead of younger prompts' whatever their length. */
#define BATCH_PREFILL_AGE 16

/* A waiting request's rows, as batch_pick sees them. */
typedef struct {
    int rows;     /* its segment's rows not yet run */
    int rank;     /* BATCH_FIRST_TOKEN, BATCH_PREFILL or BATCH_DECODE */
    uint64_t age; /* when it joined: smaller is older */
    int waited;   /* passes run since it joined */
} BatchCand;

/* The pass over c[0..n): rank by rank, BATCH_PREFILL only when no first token was taken.
 * Within BATCH_PREFILL, those that waited
 * BATCH_PREFILL_AGE passes or more first, oldest first, then the fewest rows first (ties:
 * oldest), each taking what the budget has left, all its rows or a first part of them;
 * within the other ranks oldest first, each taken whole when it fits what row_budget has
 * left. The first taken always runs (a lone larger decode whole, a prompt up to the budget).
 * out (n) gets the taken indices, oldest first, and take (n) the rows each runs. Returns
 * how many were taken (>= 1 when n >= 1). */
int batch_pick(const BatchCand *c, int n, int row_budget, int *out, int *take);

/* Creates the shared backend (ops over m) and the scheduler thread. */
int batcher_create(const Model *m, const BackendOps *ops, const BatchOpts *o, Batcher **out,
                   RsErr *e);
/* Every target made by batcher_target must be destroyed first. Accepts NULL; clears *b. */
void batcher_destroy(Batcher **b);
/* A Target whose backend is a view on a sequence of its own (up to o->parallel of them).
 * Destroy it with target_destroy. */
int batcher_target(Batcher *bt, const int *eog, int n_eog, Target **out, RsErr *e);
/* Links a planner (--budget auto) to t's view: the planner reads the batch's pass costs,
 * which the scheduler records once a pass by its total rows (planner_share_passes), and
 * after each pass the view tells it what the others brought (planner_set_batch), so the
 * decode prices its rows at the batch's cost and rate. */
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
