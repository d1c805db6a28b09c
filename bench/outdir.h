/* rootspec-bench's run directory and the files it writes there. A new run writes into a new
 * or empty directory, so nothing there is mistaken for its own logs, resumed from, truncated
 * or overwritten; a directory holding a run continues only with --resume DIR (settings from
 * its run.json). Whatever a run directory holds, the bench follows no symbolic link in it and
 * writes no file that has another name elsewhere (a hard link): it checks every file it
 * would write before its first write, and opens each without following a link. A directory
 * whose name holds a control character is refused, so no name can end a line of the plot
 * script gnuplot runs (summary.c) or of a terminal's output. */
#ifndef ROOTSPEC_BENCH_OUTDIR_H
#define ROOTSPEC_BENCH_OUTDIR_H
#include "common/util.h"
#include <stdio.h>

/* RS_OK when dir does not exist, is not a directory (reported elsewhere) or holds nothing
 * but FIFOs; RS_EINVAL naming an entry it holds otherwise. */
int bench_outdir_check(const char *dir, RsErr *e);
/* RS_EINVAL when path holds a control character (bytes 1-31 and 127; the message shows it
 * escaped, after opt). */
int bench_path_check(const char *opt, const char *path, RsErr *e);
/* RS_EINVAL naming path when something is there that is not a regular file with one link. */
int bench_file_check(const char *path, RsErr *e);
/* Every file the bench writes in dir (run.json, the logs, summary.md, the plots and their
 * temporaries): each must be absent or a regular file with one link; RS_EINVAL naming the
 * first that is not (a symbolic link, a FIFO, a directory, a hard link). */
int bench_run_files_check(const char *dir, RsErr *e);

typedef enum {
    BENCH_FILE_NEW,    /* created: nothing may be there (a temporary) */
    BENCH_FILE_TRUNC,  /* created or emptied (a FIFO is opened as it is) */
    BENCH_FILE_APPEND, /* created or appended to */
    BENCH_FILE_CUT,    /* an existing file, to be cut shorter (ftruncate) */
} BenchFileMode;
/* Opens path for writing without following a symbolic link: a regular file with one link
 * (or, BENCH_FILE_TRUNC, a FIFO), nothing else. RS_EINVAL naming it otherwise, RS_EIO on an
 * I/O failure. */
int bench_file_open(const char *path, BenchFileMode mode, FILE **out, RsErr *e);

#endif
