/* The command-line options that set up an engine and its decoder, shared by the programs
 * that decode (rootspec-target, rootspec-serve): one spelling, one check, one message. */
#ifndef ROOTSPEC_ENGINE_CLI_H
#define ROOTSPEC_ENGINE_CLI_H
#include "common/cli.h"
#include "engine.h"
#include <stdio.h>

/* The option lines for --help (two-space indent, 22-column names). */
void engine_cli_usage(FILE *f);
/* argv[*i] is a model, decoder, sampling or drafter option (or --chat-special-tokens,
 * which takes no value): parses its value into eo/d,
 * moves *i past it and returns 1. 0: not one of these options. A bad value: the RsStatus,
 * e names it. Where the model runs (--threads, --backend, ...) is cli_runtime_option's. */
int engine_cli_option(int argc, char **argv, int *i, EngineOpts *eo, DecodeOpts *opts, RsErr *e);
/* The environment's backend settings into rt (cli_runtime_env: the one place the programs
 * read them), then the runtime options onto eo. A value a variable does not take:
 * RS_EINVAL, e names it. */
int engine_cli_runtime(EngineOpts *eo, CliRuntime *rt, RsErr *e);
/* Drafter options that parse alone but contradict each other, or a sampling law out of
 * range (sampling_normalize, which also takes a temperature below SAMPLING_TEMP_MIN as
 * greedy, as requests to rootspec-serve do); RS_EINVAL with a message. */
int engine_cli_check(const EngineOpts *eo, DecodeOpts *opts, RsErr *e);
/* engine_create for d->rule; a remote drafter that does not answer downgrades d to AR with
 * a warning on stderr (prog: the message's prefix). Returns -1 to go on, else the exit
 * status (cli_exit_status) after printing why. */
int engine_cli_open(const char *prog, EngineOpts *eo, DecodeOpts *opts, Engine **en);

#endif
