/* Benchmark report: summary.md (speeds, speedups over AR, gains over draft selection with
 * bootstrap intervals, acceptance, median round timings) and gnuplot plots (speeds.png,
 * round_breakdown.png). Output depends only on the decodes and rounds given, never on their
 * order in the files or on the clock, so --analyze reproduces it byte for byte. */
#ifndef ROOTSPEC_BENCH_SUMMARY_H
#define ROOTSPEC_BENCH_SUMMARY_H
#include "bench/benchlog.h"

/* Writes the Markdown summary. Decodes are grouped by (decoder, T, B) and paired across
 * groups by prompt id; if one (prompt, decoder, T, B) appears twice only the first row counts
 * (noted in the output). Bootstrap: BENCH_RESAMPLES resamples, seed BENCH_BOOT_SEED. */
int bench_summary_write(FILE *f, const BenchDecode *d, int nd, const RoundRecord *r, int nr,
                        RsErr *e);
/* Same, into dir/summary.md. */
int bench_summary_file(const char *dir, const BenchDecode *d, int nd, const RoundRecord *r,
                       int nr, RsErr *e);

/* Writes dir/speeds.png and dir/round_breakdown.png with gnuplot (pngcairo). The gnuplot
 * binary is $ROOTSPEC_GNUPLOT if set, else "gnuplot" on $PATH. Returns RS_OK, 1 when gnuplot
 * is not found (a warning is printed on stderr and no plot is made), or a negative RsStatus
 * when gnuplot fails. */
int bench_plots_write(const char *dir, const BenchDecode *d, int nd, const RoundRecord *r,
                      int nr, RsErr *e);

/* Per-round time breakdown used by the plot and summary (ms, means over rounds whose
 * t_round_start and t_commit are set). Components, in time order within a round:
 * send = grow_sent - round_start; root = root_end - root_start; wait = pool_recv -
 * max(grow_sent, root_end); select = select_done - max(pool_recv, root_end); tree =
 * tree_end - tree_start; other = the rest up to t_commit. Absent phases count 0; each part is
 * clamped at 0. Returns 0, or -1 when the round lacks t_round_start or t_commit. */
#define BENCH_N_PARTS 6
extern const char *const bench_part_names[BENCH_N_PARTS];
int bench_round_parts(const RoundRecord *r, double parts_ms[BENCH_N_PARTS]);

#endif
