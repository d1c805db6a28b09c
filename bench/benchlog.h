/* Benchmark output files and their readers (for --analyze and --resume):
 *   rounds.jsonl: one JSON object per round, the round log of target_proc/roundlog.h
 *                 (written and read there, the same schema as rootspec-target --log-rounds);
 *   decodes.csv:  one row per decode.
 * Writers emit each record as one line ending in '\n' and flush it, so the newline marks a
 * complete record: readers ignore a final line without one (an interrupted write). */
#ifndef ROOTSPEC_BENCH_BENCHLOG_H
#define ROOTSPEC_BENCH_BENCHLOG_H
#include "common/prompts.h"
#include "bench/stats.h"
#include "target_proc/roundlog.h"
#include <stdio.h>

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

/* Each writes one complete line and flushes. Return RS_OK or RS_EIO (errno is set). */
int benchlog_decode_write_header(FILE *f);
int benchlog_decode_write_row(FILE *f, const BenchDecode *d);

/* Reader: *out malloc'd (caller frees), *n records. A final line without '\n' is ignored;
 * any other malformed line is an RS_EFORMAT error naming the file and line. */
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
