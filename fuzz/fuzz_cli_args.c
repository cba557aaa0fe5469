/*
 * fuzz_cli_args.c — libFuzzer harness of the option parsing of `attn run`
 * (cli_run_parse in tools/attn/cli_run.c, over cli_scan in tools/attn/cliopt.c).
 *
 * The input is split at its NUL bytes into arguments (at most 64) after "run". The parser
 * must return 0 or the usage status 2, never read past an argument, and on success give
 * what the options promise: the four required files named, every string pointing into
 * argv, a finite scale, a finite softcap >= 0, window sides >= -1, threads >= 0, and
 * only the enum values the options name. Parsing the same arguments twice gives the same
 * result. Usage errors print on stderr: run with -close_fd_mask=2 (make fuzz does).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_run.h"

/* The parser's usage messages go to stderr, which libFuzzer closes (-close_fd_mask=2);
 * a broken rule is reported on a copy of stderr taken before that. */
static FILE *g_report;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const int fd = dup(2);
    g_report = fd >= 0 ? fdopen(fd, "w") : NULL;
    return 0;
}

#define REQUIRE(cond)                                                                     \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(g_report ? g_report : stderr, "fuzz_cli_args: %s:%d: %s\n", __FILE__, \
                    __LINE__, #cond);                                                     \
            fflush(g_report);                                                             \
            abort();                                                                      \
        }                                                                                 \
    } while (0)

enum { MAX_ARGS = 64 };

/* s is NULL or points into one of the arguments */
static int in_argv(const char *s, int argc, char **argv) {
    if (!s) return 1;
    for (int i = 0; i < argc; i++)
        if (s >= argv[i] && s <= argv[i] + strlen(argv[i])) return 1;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* one copy of the input, NUL-terminated, cut into arguments at each NUL */
    char *buf = malloc(size + 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    char *argv[MAX_ARGS + 2];
    int argc = 0;
    argv[argc++] = "run";
    for (size_t at = 0; at < size && argc <= MAX_ARGS;) {
        argv[argc++] = buf + at;
        at += strlen(buf + at) + 1;
    }
    argv[argc] = NULL;

    run_args a, a2;
    attn_options opt, opt2;
    const int rc = cli_run_parse(argc, argv, &a, &opt);
    REQUIRE(rc == 0 || rc == 2);
    const int rc2 = cli_run_parse(argc, argv, &a2, &opt2);
    REQUIRE(rc2 == rc);
    if (rc == 0) {
        REQUIRE(memcmp(&a, &a2, sizeof a) == 0);
        REQUIRE(a.q && a.k && a.v && a.out);
        const char *all[] = {a.q, a.k, a.v, a.out, a.mask, a.kv_len, a.alibi, a.lse, a.weights,
                             a.align, a.scale, a.softcap, a.window, a.threads, a.dtype,
                             a.precision};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) REQUIRE(in_argv(all[i], argc, argv));
        REQUIRE(opt.causal == a.causal);
        REQUIRE(opt.path == (a.reference ? ATTN_PATH_REFERENCE : ATTN_PATH_AUTO));
        REQUIRE(opt.has_scale == (a.scale != NULL) && isfinite(opt.scale));
        REQUIRE(isfinite(opt.softcap) && opt.softcap >= 0);
        REQUIRE(opt.has_window == (a.window != NULL));
        REQUIRE(opt.window_left >= -1 && opt.window_right >= -1);
        REQUIRE(opt.threads >= 0);
        REQUIRE(opt.align == ATTN_ALIGN_TOP_LEFT || opt.align == ATTN_ALIGN_BOTTOM_RIGHT);
        REQUIRE(opt.precision == ATTN_PRECISION_DEFAULT || opt.precision == ATTN_PRECISION_FAST);
        REQUIRE(!a.dtype || !strcmp(a.dtype, "f32") || !strcmp(a.dtype, "f16") ||
                !strcmp(a.dtype, "bf16") || !strcmp(a.dtype, "f64"));
        REQUIRE(!opt.mask && !opt.bias && !opt.kv_len && !opt.alibi_slopes && !opt.lse &&
                !opt.weights && !opt.workspace);
    }
    free(buf);
    return 0;
}
