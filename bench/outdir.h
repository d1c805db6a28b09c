/* rootspec-bench --out policy: a new run writes into a new or empty directory, so nothing
 * there is mistaken for its own logs, resumed from, truncated or overwritten; a directory
 * holding a run continues only with --resume DIR (settings from its run.json). */
#ifndef ROOTSPEC_BENCH_OUTDIR_H
#define ROOTSPEC_BENCH_OUTDIR_H
#include "common/util.h"

/* RS_OK when dir does not exist, is not a directory (reported elsewhere) or holds nothing
 * but FIFOs; RS_EINVAL naming an entry it holds otherwise. */
int bench_outdir_check(const char *dir, RsErr *e);

#endif
