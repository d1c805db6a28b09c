/* Small, strict command-line value parsers shared by the programs: every rejected value
 * is named in the message. */
#ifndef ROOTSPEC_CLI_H
#define ROOTSPEC_CLI_H
#include "util.h"
#include <stdint.h>

int cli_int(const char *opt, const char *val, long min, long max, int *out, RsErr *e);
/* A finite decimal or exponent number in [min, max]. */
int cli_double(const char *opt, const char *val, double min, double max, double *out, RsErr *e);
int cli_u64(const char *opt, const char *val, uint64_t *out, RsErr *e);
/* Returns argv[i+1] or sets an error "option X needs a value". */
int cli_value(int argc, char **argv, int i, const char **out, RsErr *e);
/* The exit status of a program that failed with status rc (!= RS_OK): 2 for bad usage or
 * input (RS_EINVAL, RS_EFORMAT, RS_EUNSUPPORTED), 1 for a runtime failure. */
int cli_exit_status(int rc);

#endif
