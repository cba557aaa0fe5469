/*
 * dispatch.c — the run-time choice of micro-kernels: the CPU is probed once, the best
 *              kernel of the list (kernels.h) that it can run is taken, and ATTN_ISA
 *              can force another. ATTN_VERBOSE=1 says on stderr which one was chosen.
 *
 * The library itself is compiled for the baseline ISA; only the kernel files get ISA
 * flags, so nothing here may touch a vector type.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
/* F16C is CPUID leaf 1, ECX bit 29 (gcc 12's __builtin_cpu_supports has no name for it) */
static bool cpu_has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#endif

static bool cpu_can_run(const char *name) {
#if defined(__x86_64__) || defined(_M_X64)
    __builtin_cpu_init();
    if (strcmp(name, "avx512bf16") == 0)
        return cpu_can_run("avx512") && __builtin_cpu_supports("avx512bf16");
    if (strcmp(name, "avx512") == 0)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("fma");
    if (strcmp(name, "avx2") == 0)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               cpu_has_f16c();
#endif
    return strcmp(name, "generic") == 0;
}

static const attn_kernels *const g_list[] = {
#define ATTN_X_ENTRY(name) &attn_kernels_##name,
    ATTN_KERNEL_LIST(ATTN_X_ENTRY)
#undef ATTN_X_ENTRY
};
enum { N_KERNELS = sizeof g_list / sizeof g_list[0] };

static const attn_kernels *g_chosen;
static char g_why[200];

static void choose(void) {
    const char *want = getenv("ATTN_ISA");
    if (want && *want) {
        for (int i = 0; i < N_KERNELS; i++) {
            if (strcmp(want, g_list[i]->name) != 0) continue;
            if (cpu_can_run(want))
                g_chosen = g_list[i];
            else
                snprintf(g_why, sizeof g_why, "ATTN_ISA=%s: this CPU cannot run it", want);
            break;
        }
        if (!g_chosen && !g_why[0])
            snprintf(g_why, sizeof g_why, "ATTN_ISA=%s: no such kernel (this build has "
                     "avx512bf16, avx512, avx2, generic on x86-64; generic elsewhere)", want);
    } else {
        for (int i = 0; i < N_KERNELS && !g_chosen; i++)
            if (cpu_can_run(g_list[i]->name)) g_chosen = g_list[i];
    }
    const char *verbose = getenv("ATTN_VERBOSE");
    if (verbose && *verbose && strcmp(verbose, "0") != 0)
        fprintf(stderr, "attn: kernel %s%s%s\n", g_chosen ? g_chosen->name : "(none)",
                g_chosen ? "" : ": ", g_chosen ? "" : g_why);
}

/* pthread_once: the probe and getenv run once, whichever thread calls first */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

const attn_kernels *attn_select_kernels(const char **why) {
    pthread_once(&g_once, choose);
    if (why) *why = g_why;
    return g_chosen;
}

const char *attn_kernel_name(void) {
    const attn_kernels *k = attn_select_kernels(NULL);
    return k ? k->name : "none";
}

bool attn_kernel_supported(const char *name) {
    if (!name) return false;
    for (int i = 0; i < N_KERNELS; i++)
        if (strcmp(name, g_list[i]->name) == 0) return cpu_can_run(name);
    return false;
}
