/*
 * cliopt.c — the option scanner the `attn` subcommands share (see cliopt.h).
 */
#include "cliopt.h"

#include "attn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_vsay(int code, const char *who, const char *fmt, va_list ap) {
    fprintf(stderr, "attn: %s", who);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    return code;
}

int cli_say(int code, const char *who, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    code = cli_vsay(code, who, fmt, ap);
    va_end(ap);
    return code;
}

int cli_scan(int argc, char **argv, const cli_opt *opts, int nopts, const char *prefix,
             const char *cmd) {
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strncmp(arg, "--", 2) != 0) {
            fprintf(stderr, "attn: %sunexpected argument '%s' (see 'attn %s --help')\n",
                    prefix, arg, cmd);
            return 2;
        }
        const char *eq = strchr(arg, '=');
        const size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        int o = 0;
        while (o < nopts && !(strlen(opts[o].name) == len && strncmp(opts[o].name, arg, len) == 0))
            o++;
        if (o == nopts) {
            fprintf(stderr, "attn: %sunknown option '%.*s' (see 'attn %s --help')\n", prefix,
                    (int)len, arg, cmd);
            return 2;
        }
        const char *name = opts[o].name;
        if (opts[o].flag) {
            const char *why = eq ? "takes no value" : *opts[o].flag ? "given twice" : NULL;
            if (why) {
                fprintf(stderr, "attn: %s%s: %s\n", prefix, name, why);
                return 2;
            }
            *opts[o].flag = true;
            continue;
        }
        const char *value = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        const char *why = !value || (!eq && strncmp(value, "--", 2) == 0) ? "missing value"
                          : *opts[o].value                                 ? "given twice"
                                                                           : NULL;
        if (why) {
            fprintf(stderr, "attn: %s%s: %s\n", prefix, name, why);
            return 2;
        }
        *opts[o].value = value;
    }
    return 0;
}

int bench_part_scan(int argc, char **argv, const char *part, const char *usage, int reps_quick,
                    int reps_full, int reps_max, bench_part_args *a) {
    return bench_part_scan_more(argc, argv, part, usage, reps_quick, reps_full, reps_max, NULL, 0, a);
}

int bench_part_scan_more(int argc, char **argv, const char *part, const char *usage,
                         int reps_quick, int reps_full, int reps_max, const cli_opt *more,
                         int nmore, bench_part_args *a) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return fputs(usage, stdout), 0;
    const char *threads_s = NULL, *reps_s = NULL, *isa = NULL;
    *a = (bench_part_args){0};
    enum { SHARED = 5, MORE_MAX = 8 };
    cli_opt opts[SHARED + MORE_MAX] = {{"--quick", NULL, &a->quick}, {"--plant-error", NULL, &a->plant},
                                       {"--threads", &threads_s, NULL}, {"--reps", &reps_s, NULL},
                                       {"--isa", &isa, NULL}};
    if (nmore < 0 || nmore > MORE_MAX) return fprintf(stderr, "attn: bench %s: too many options\n", part), 2;
    for (int i = 0; i < nmore; i++) opts[SHARED + i] = more[i];
    char prefix[64];
    snprintf(prefix, sizeof prefix, "bench %s: ", part);
    const int rc = cli_scan(argc, argv, opts, SHARED + nmore, prefix, "bench");
    if (rc) return rc;
    if (isa) {  // ATTN_ISA is read once, at the library's first kernel choice: set it now
        if (!attn_kernel_supported(isa)) {
            fprintf(stderr, "attn: bench %s: --isa: '%s' is no kernel this build has and this "
                    "CPU runs (see 'attn --kernels')\n", part, isa);
            return 2;
        }
        setenv("ATTN_ISA", isa, 1);
    }
    a->threads = threads_s ? atoi(threads_s) : 0;
    a->reps = reps_s ? atoi(reps_s) : a->quick ? reps_quick : reps_full;
    if (a->threads < 0 || a->threads > 512 || a->reps < 1 || a->reps > reps_max) {
        fprintf(stderr, "attn: bench %s: --threads 0..512, --reps 1..%d\n", part, reps_max);
        return 2;
    }
    return -1;
}
