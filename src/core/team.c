/*
 * team.c — the work threshold below which a call runs on the calling thread (team.h).
 */
#include <pthread.h>
#include <stdlib.h>

#include "team.h"

static double g_min_flops = ATTN_TEAM_MIN_FLOPS_DEFAULT;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* ATTN_TEAM_MIN_FLOPS=x (a number >= 0; 0: every call takes its threads) replaces the
 * default; anything else is ignored */
static void read_env(void) {
    const char *s = getenv("ATTN_TEAM_MIN_FLOPS");
    if (!s || !*s) return;
    char *end;
    const double x = strtod(s, &end);
    if (*end == '\0' && x >= 0.0 && x <= 1e30) g_min_flops = x;
}

double ai_team_min_flops(void) {
    pthread_once(&g_once, read_env);
    return g_min_flops;
}
