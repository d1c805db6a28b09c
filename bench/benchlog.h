/* Benchmark output files and their readers (for --analyze and --resume):
 *   rounds.jsonl: one JSON object per round with every DESIGN.md §6 field;
 *   decodes.csv:  one row per decode.
 * Writers emit each record as one line ending in '\n' and flush it, so the newline marks a
 * complete record: readers ignore a final line without one (an interrupted write). */
#ifndef ROOTSPEC_BENCH_BENCHLOG_H
#define ROOTSPEC_BENCH_BENCHLOG_H
#include "common/prompts.h"
#include "bench/stats.h"
#include <stdio.h>

#define BENCH_NULL_NS (-1)   /* timestamp / draft_ns absent: written as JSON null */
#define BENCH_X1_NULL (-1)   /* x1_in_pool not applicable (draft, ar) */

typedef struct {
    char decoder[BENCH_DEC_MAX];
    int temp, budget;
    char prompt_id[PROMPT_ID_MAX];
    int rep;         /* repetition of the decode (--repeats; 0 in logs without it) */
    int round;       /* 0-based within the decode */
    int emitted;     /* tokens the round verified (accepted + continuation) */
    int dropped;     /* of emitted, the last ones past --max-new or the first EOS: not in
                        the output, not in the decode's tokens or speed (0 when absent) */
    int accepted;    /* accepted tree tokens (X1 counts for pearl/rootdraw) */
    int tree_size;   /* non-root nodes of the selected tree (root rule: also when its pass
                        is skipped, tree_pass_skipped; pearl/rootdraw: X1 included) */
    int x1_in_pool;  /* 1, 0, or BENCH_X1_NULL */
    double tau;      /* expected acceptance of the tree; NAN = null (not computed) */
    /* CLOCK_MONOTONIC ns, BENCH_NULL_NS where the decoder has no such phase. JSON numbers
     * are read back as doubles: exact below 2^53 ns (104 days of uptime). */
    int64_t t_round_start, t_grow_sent, t_root_start, t_root_end, t_pool_recv, t_select_done,
        t_tree_start, t_tree_end, t_commit;
    int64_t draft_ns;       /* drafter's own time from the POOL reply, or BENCH_NULL_NS */
    int64_t graph_replays;  /* CUDA graph replays this round */
    int64_t eager_launches; /* uncaptured launches this round */
} BenchRound;

typedef struct {
    char prompt_id[PROMPT_ID_MAX];
    int prompt_pos;  /* position in the shuffled prompt order */
    char decoder[BENCH_DEC_MAX];
    int temp, budget;
    int64_t tokens;  /* emitted up to and including the first EOS */
    int64_t time_ns; /* last commit - start of the target prefill */
    double speed;    /* tokens / s (written for humans; analysis recomputes it) */
    int rounds;
    double mean_accepted;
    int hit_eos;
    int run_index;
    int rep;         /* repetition of (prompt, decoder, T, B); logs without the column: 0 */
} BenchDecode;

/* Fills a round with nulls (timestamps, draft_ns, x1_in_pool, tau) and zeros. */
void benchlog_round_init(BenchRound *r);

/* Each writes one complete line and flushes. Return RS_OK or RS_EIO (errno is set). */
int benchlog_round_write(FILE *f, const BenchRound *r);
int benchlog_decode_write_header(FILE *f);
int benchlog_decode_write_row(FILE *f, const BenchDecode *d);

/* Readers: *out malloc'd (caller frees), *n records. A final line without '\n' is ignored;
 * any other malformed line is an RS_EFORMAT error naming the file and line. */
int benchlog_rounds_read(const char *path, BenchRound **out, int *n, RsErr *e);
int benchlog_decodes_read(const char *path, BenchDecode **out, int *n, RsErr *e);

/* --resume support: the set of (prompt_id, decoder, temp, budget, rep) already in
 * decodes.csv. */
typedef struct BenchDoneSet BenchDoneSet;
/* Reads dir/decodes.csv; a missing file gives an empty set. */
int bench_resume_load(const char *dir, BenchDoneSet **out, RsErr *e);
int bench_done_has(const BenchDoneSet *s, const char *prompt_id, const BenchCombo *c,
                   int rep);
int bench_done_count(const BenchDoneSet *s);
void bench_done_destroy(BenchDoneSet **s);

/* Opens dir/rounds.jsonl and dir/decodes.csv for appending, creating dir if needed, never
 * through a symbolic link (bench/outdir.h). With resume = 0 the files are truncated (fresh
 * run). With resume = 1 every file of the run is checked (bench_run_files_check) and both
 * logs are read whole before anything is written; then a partial final line is cut from
 * both files, and rounds of decodes absent from decodes.csv (the decode that was
 * interrupted) are dropped, so a rerun of that decode does not duplicate them. Writes the
 * CSV header when decodes.csv is empty. RS_EINVAL for a file that is not the bench's to
 * write (a link, a FIFO, a hard link), RS_EFORMAT for a log that does not parse. */
int benchlog_open(const char *dir, int resume, FILE **rounds, FILE **decodes, RsErr *e);

#endif
