/* `rootspec-bench --analyze DIR` (rebuild summary.md and plots from the logs alone) and the
 * progress reporter the bench main prints while it runs. */
#ifndef ROOTSPEC_BENCH_ANALYZE_H
#define ROOTSPEC_BENCH_ANALYZE_H
#include "common/util.h"
#include <stdio.h>

/* Reads dir/decodes.csv and dir/rounds.jsonl, writes dir/summary.md, then the plots (a
 * missing gnuplot only warns; a failing one is reported on stderr but does not fail the call,
 * since summary.md is already written). The bench main should end its run with this call, so
 * the summary it writes is by construction the one --analyze reproduces. */
int bench_analyze(const char *dir, RsErr *e);

/* The --help paragraph on output files, --resume and --analyze (static string). */
const char *bench_help_outputs(void);

/* Progress of n_total decodes. On a terminal: a redrawn bar with count, percent, elapsed and
 * ETA (at most 10 redraws a second). Otherwise: one plain line per interval_s seconds
 * (default 30 when <= 0) and one at the end, so logs stay readable. */
typedef struct BenchProgress BenchProgress;
BenchProgress *bench_progress_create(FILE *out, int n_total, double interval_s);
/* n_done decodes finished; label names the current one (may be NULL). */
void bench_progress_update(BenchProgress *p, int n_done, const char *label);
/* Prints the final line and frees. */
void bench_progress_destroy(BenchProgress **p);
/* Formats seconds as "1h02m03s" / "2m03s" / "3s" into buf (>= 16 bytes). */
const char *bench_format_duration(double s, char *buf, size_t cap);

#endif
