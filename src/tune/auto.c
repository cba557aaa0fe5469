/*
 * auto.c — attn_tune_auto (attn.h): ATTN_TUNE=auto's quick tune, once a process, when
 *          there is no wisdom file at the default path: `attn tune --quick` written there.
 *
 * What it is not: anything an attention call runs. A call only reads the wisdom
 * (wisdom.c), so that what times the calls (tune.c) never sits under a call; the program
 * asks for this tuning at its start: the attn command before its subcommand, the Python
 * package when it is imported, a C program by calling attn_tune_auto before its first
 * attention call (docs/KERNELS.md, "Tuner").
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/wisdom.h"

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static attn_status g_status = ATTN_OK;
static char g_why[512];

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The classes of the file just written (the one line on stderr says how many). */
static int classes_in(const char *path) {
    attn_wisdom *w = malloc(sizeof *w);
    char why[512];
    int n = 0;
    if (w && ai_wisdom_parse(path, w, why, sizeof why) == ATTN_OK)
        for (int i = 0; i < ATTN_TUNE_CLASSES; i++) n += w->has[i];
    free(w);
    return n;
}

/* The tuning and its one line on stderr; an existing file (readable or not) is never
 * rewritten: the wisdom's loader reads it, or says why it ignores it. */
static void run(void) {
    const char *tune = getenv("ATTN_TUNE");
    if (!tune || strcmp(tune, "auto") != 0) return;
    char path[4096];
    attn_status st;
    const double t0 = now_s();
    if (!ai_wisdom_default_path(path, sizeof path)) {
        st = ai_fail(ATTN_ERR_VALUE, "no wisdom path: none of ATTN_WISDOM, XDG_CACHE_HOME, "
                     "HOME is set");
    } else {
        FILE *probe = fopen(path, "r");
        if (probe || errno != ENOENT) {
            if (probe) fclose(probe);
            return;
        }
        const attn_tune_options opt = {.quick = true, .out = path};
        st = attn_tune(&opt);
    }
    if (st != ATTN_OK) {
        g_status = st;
        snprintf(g_why, sizeof g_why, "%s", attn_last_error());
        fprintf(stderr, "attn: ATTN_TUNE=auto: not tuned, the static choices: %s\n", g_why);
        return;
    }
    fprintf(stderr, "attn: ATTN_TUNE=auto: tuned %d classes in %.1f s, wrote %s\n",
            classes_in(path), now_s() - t0, path);
}

attn_status attn_tune_auto(void) {
    pthread_once(&g_once, run);
    if (g_status != ATTN_OK) return ai_fail(g_status, "attn_tune_auto: %s", g_why);
    return ai_ok();
}
