/*
 * cli_tune.c — `attn tune`: the tuner (attn_tune, attn.h) from the command line, and
 *              `attn tune --show`, what a wisdom file chose and why.
 *
 *   attn tune [--quick] [--out FILE] [--threads N]   time, choose, write FILE (default:
 *                                                    $ATTN_WISDOM, $XDG_CACHE_HOME/attn/
 *                                                    wisdom or ~/.cache/attn/wisdom)
 *   attn tune --show [FILE]                          the file's cpu line, each class's
 *                                                    choice with its candidates' times,
 *                                                    and whether this process would use it
 * Exit status 0, 1 when the file cannot be written (or, with --show, read or trusted), 2
 * on a usage error. What it is not: the tuner itself (src/tune/tune.c) or the file's reader
 * (src/kernels/wisdom.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attn.h"
#include "cli.h"
#include "kernels/wisdom.h"

static const char USAGE[] =
    "usage: attn tune [--quick] [--out FILE] [--threads N]\n"
    "       attn tune --show [FILE]\n"
    "\n"
    "  Times the fused path's candidate configurations (kernel, block sizes, decoding\n"
    "  split) for each shape class on this machine and writes the winners to a wisdom\n"
    "  file that later processes read (docs/KERNELS.md, \"Tuner\").\n"
    "  --quick     the common classes only (the full list takes a few times longer: docs/KERNELS.md)\n"
    "  --out FILE  the file to write (default: $ATTN_WISDOM, else $XDG_CACHE_HOME/attn/wisdom,\n"
    "              else ~/.cache/attn/wisdom)\n"
    "  --threads N the threads of the timed calls (default: OpenMP's)\n"
    "  --show      print FILE (default as above): its cpu line, each class's choice and the\n"
    "              times of its candidates, and whether this process would use it\n";

static int show(const char *file) {
    char path[4096];
    if (file) snprintf(path, sizeof path, "%s", file);
    else if (!ai_wisdom_default_path(path, sizeof path)) {
        fprintf(stderr, "attn tune: no wisdom path (none of ATTN_WISDOM, XDG_CACHE_HOME, HOME)\n");
        return 1;
    }
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "attn tune: cannot read %s\n", path);
        return 1;
    }
    const attn_status st = attn_tune_check(path);
    printf("wisdom %s\n", path);
    printf("this CPU: %s\n", ai_wisdom_cpu_line());
    if (st == ATTN_OK) printf("this process would use it\n");
    else printf("this process would ignore it: %s\n", attn_last_error());
    printf("\n");
    char line[1024];
    while (fgets(line, sizeof line, f)) fputs(line, stdout);
    fclose(f);
    return st == ATTN_OK ? 0 : 1;
}

int cli_tune(int argc, char **argv) {
    attn_tune_options opt = {0};
    bool want_show = false;
    const char *show_file = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(USAGE, stdout);
            return 0;
        } else if (strcmp(a, "--quick") == 0) {
            opt.quick = true;
        } else if (strcmp(a, "--show") == 0) {
            want_show = true;
            if (i + 1 < argc && argv[i + 1][0] != '-') show_file = argv[++i];
        } else if (strcmp(a, "--out") == 0 && i + 1 < argc) {
            opt.out = argv[++i];
        } else if (strcmp(a, "--threads") == 0 && i + 1 < argc) {
            char *end;
            const long n = strtol(argv[++i], &end, 10);
            if (*end || n < 1 || n > 512) {
                fprintf(stderr, "attn tune: --threads %s: expected a count from 1 to 512\n", argv[i]);
                return 2;
            }
            opt.threads = (int32_t)n;
        } else {
            fprintf(stderr, "attn tune: unknown or incomplete option '%s' (try attn tune --help)\n", a);
            return 2;
        }
    }
    if (want_show) {
        if (opt.quick || opt.out || opt.threads) {
            fprintf(stderr, "attn tune: --show takes only a FILE\n");
            return 2;
        }
        return show(show_file);
    }
    opt.verbose = true;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const attn_status st = attn_tune(&opt);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (st != ATTN_OK) {
        fprintf(stderr, "%s\n", attn_last_error());  // "attn_tune: ..."
        return 1;
    }
    char path[4096];
    if (opt.out) snprintf(path, sizeof path, "%s", opt.out);
    else ai_wisdom_default_path(path, sizeof path);
    printf("attn tune: wrote %s in %.1f s (attn tune --show%s%s for the times)\n", path,
           (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec),
           opt.out ? " " : "", opt.out ? opt.out : "");
    return 0;
}
