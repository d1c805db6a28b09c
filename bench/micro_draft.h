/* rootspec-micro's drafter figure: host work per logits row while a drafter grows pools
 * (the round log's draft_host_ns / draft_rows), in the same run as the forward timings. */
#ifndef ROOTSPEC_MICRO_DRAFT_H
#define ROOTSPEC_MICRO_DRAFT_H
#include "common/cli.h"
#include "common/model.h"

/* The self-drafter on the first half of m's layers, on `threads` CPU threads: commits a
 * fixed English paragraph (random ids for a model without a tokenizer: flatter rows, so
 * more exps), then `rounds` pools, each after committing the last pool's best first
 * child. Prints a line and "drafter_host_us_row_t<threads>=" (the median round's host
 * work per row); *us_row gets that figure. family, sw: BackendParams.cpu_kernels
 * and .sw. */
int micro_drafter_host(const Model *m, int threads, const char *family,
                       const BackendSwitches *sw, int rounds,
                       double *us_row, RsErr *e);

#endif
