/*
 * cli_run.h — the options of `attn run` (tools/attn/cli_run.c), parsed apart from the run, so
 *             that a test or a fuzzer can call the parser without reading any file. The
 *             options themselves (run_args) are run_args.h's, shared with `attn viz`.
 */
#ifndef ATTN_CLI_RUN_H
#define ATTN_CLI_RUN_H

#include "attn.h"
#include "run_args.h"

/* Parses argv[1..argc) into *a and the options they set into *opt (both zeroed first).
 * Returns 0, or the exit status of a usage error after printing it on stderr. Reads no
 * file and does not check that the files exist. */
int cli_run_parse(int argc, char **argv, run_args *a, attn_options *opt);

#endif /* ATTN_CLI_RUN_H */
