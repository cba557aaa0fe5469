/*
 * run_args.h — the inputs of an attention call as `attn run` takes them (Q, K, V .npy
 *              files, every mask and option), shared by `attn run` and `attn viz`.
 *
 * What it is: the option table of those inputs (appended to by each command's own
 * options), their loading and checking (one line on stderr naming the file or option),
 * and the tensors and attn_options built from them. What it is not: the outputs of
 * either command (each writes its own) or the scanner (cliopt.h).
 */
#ifndef ATTN_RUN_ARGS_H
#define ATTN_RUN_ARGS_H

#include <stdbool.h>

#include "attn.h"
#include "cliopt.h"
#include "npy.h"

enum { EXIT_DATA = 1, EXIT_USAGE = 2 };

typedef struct run_args {
    const char *q, *k, *v, *out, *mask, *kv_len, *alibi, *lse, *weights;
    const char *align, *scale, *softcap, *window, *threads, *dtype, *precision;
    bool causal, reference;
    /* --block-table (attn run only): K and V are then page pools */
    const char *block_table;
} run_args;

/* The inputs of one call, loaded: the arrays own the data the tensors point into, and
 * opt's mask, bias, kv_len and alibi_slopes point into this struct (do not copy it). */
typedef struct run_inputs {
    npy_array q, k, v, mask, kvl, alibi;
    attn_tensor tq, tk, tv, tmask, tkvl, talibi;
    attn_options opt;
    attn_dtype o_dtype;  /* O's dtype by attn run's rule */
    int64_t B, Hq, Lq, Dk, Hkv, Lk, Dv;  /* Lk: max_pages * page_size when paged */
    /* a paged cache (--block-table): the table, int32 [B, max_pages] */
    npy_array bt;
    attn_tensor tbt;
} run_inputs;

enum { RUN_INPUT_OPTS = 15 };

/* Writes the RUN_INPUT_OPTS input options (--q, --k, --v, --mask, ..., --reference) into
 * opts, bound to a; returns RUN_INPUT_OPTS. */
int run_input_opts(run_args *a, cli_opt *opts);

/* 0, or EXIT_USAGE after a line naming the first of --q, --k, --v missing. */
int run_require_inputs(const run_args *a, const char *cmd);

/* Parses the option values, loads and checks the files, builds in's tensors and options.
 * 0, or the exit status after a line on stderr; run_inputs_free releases what was loaded
 * either way. */
int run_load_inputs(const run_args *a, run_inputs *in);
void run_inputs_free(run_inputs *in);

/* A failed library call's line on stderr ("attn: detail (status)"); returns EXIT_DATA. */
int run_library_error(attn_status st);

/* Prints usage on stdout and returns true when an argument is --help or -h. */
bool run_help(int argc, char **argv, const char *usage);

/* "attn: " + the message + newline on stderr; returns code. */
int run_say(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif /* ATTN_RUN_ARGS_H */
