/* The per-round log: one JSON object per round and per line, the same schema from
 * `rootspec-target --log-rounds` and `rootspec-bench` (DIR/rounds.jsonl); every field is
 * described in docs/DESIGN.md §6 ("Per-round log"). One writer (roundlog_write, from the
 * decode's RoundInfo) and one reader (roundlog_read / roundlog_scan, into RoundRecord),
 * which also reads the two older shapes: the bench's (budget 1000 for auto, no tokens)
 * and the target's (numeric prompt ids, cumulative backend counters).
 *
 * A writer emits each record as one line ending in '\n' and flushes it, so an interrupted
 * run keeps every completed round and the newline marks a complete record: readers ignore
 * a final line without one. */
#ifndef ROOTSPEC_ROUNDLOG_H
#define ROOTSPEC_ROUNDLOG_H
#include "common/prompts.h"
#include "decode.h"
#include <stdio.h>

#define ROUNDLOG_NULL (-1)          /* an integer field written as JSON null */
#define ROUNDLOG_BUDGET_AUTO 1000   /* --budget auto; written as "auto" */
#define ROUNDLOG_DECODER_MAX 16     /* decoder name buffer */

/* What the writer knows of a decode beyond its rounds, and the backend counters it last
 * saw (the log has each round's share of them). Set the fields, then roundlog_begin. */
typedef struct {
    const char *decoder;  /* rule_name(); [A-Za-z0-9_./:+-], under ROUNDLOG_DECODER_MAX */
    int temp;             /* 0 greedy, 1 sampling */
    int budget;           /* B; 0 for ar; ROUNDLOG_BUDGET_AUTO */
    const char *prompt_id; /* the prompt file's id, or --prompt-id as a number */
    int rep;              /* repetition of the decode (rootspec-bench --repeats; else 0) */
    const Sampling *sampling; /* the law in full, written as "sampling"; NULL: null */
    uint64_t graph0, eager0, d2h0;
} RoundLog;

/* Before a decode's first round: the target backend's counters now. */
void roundlog_begin(RoundLog *lg, const BackendStats *st);
/* One line for r; RS_OK, or RS_EIO (errno set) when writing or flushing fails. */
int roundlog_write(FILE *f, RoundLog *lg, const RoundInfo *r);

/* One round as read back. Integers ROUNDLOG_NULL and doubles NAN where the line has null
 * or (an older shape) lacks the field. */
typedef struct {
    char decoder[ROUNDLOG_DECODER_MAX];
    int temp, budget;             /* budget as RoundLog's */
    char prompt_id[PROMPT_ID_MAX];
    int rep, round, emitted, dropped, accepted, tree_size;
    int x1_in_pool;               /* 1, 0, or ROUNDLOG_NULL (rules without X1) */
    int tree_pass_skipped, fallback_ar;
    double tau, root_margin;
    int64_t t_round_start, t_grow_sent, t_root_start, t_root_end, t_pool_recv,
        t_select_done, t_tree_start, t_tree_end, t_commit;
    int64_t measure_ns, draft_ns, draft_commit_ns, draft_host_ns;
    int draft_rows;
    int64_t graph_replays, eager_launches, d2h_full_rows; /* this round's share */
    int budget_chosen;            /* --budget auto's pick; ROUNDLOG_NULL without a planner */
    int depth_asked;              /* pool depth asked; 0: the drafter was not asked */
    int width_asked;              /* pool width asked (nodes expanded a level); 0: not asked */
    double pred_tok_s, real_tok_s;
    int has_sampling;             /* 0: "sampling" null or absent */
    Sampling sampling;
    int have_tau_rule;
    double tau_rule[RULE_COUNT];  /* NAN where the line leaves a rule out */
    int tree_size_rule[RULE_COUNT];
    int n_tokens;                 /* ROUNDLOG_NULL: the line has no tokens */
    int tokens[ROUND_MAX_EMIT];
} RoundRecord;

/* Calls fn on each complete line of path with its record and its bytes (line[n] is NUL);
 * a nonzero return from fn stops the scan and is returned. A malformed line is an
 * RS_EFORMAT error naming the file, the line and the field. */
typedef int (*RoundLineFn)(void *ctx, const RoundRecord *r, const char *line, size_t n,
                           RsErr *e);
int roundlog_scan(const char *path, RoundLineFn fn, void *ctx, RsErr *e);
/* Every record of path: *out malloc'd (caller frees), *n records. */
int roundlog_read(const char *path, RoundRecord **out, int *n, RsErr *e);

/* Decoder names and prompt ids in the log need no escaping: 1..cap-1 bytes of
 * [A-Za-z0-9_./:+-]. */
int roundlog_name_ok(const char *s, size_t cap);

#endif
