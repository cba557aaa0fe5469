/*
 * dispatch.c — the run-time choice of micro-kernels: the CPU is probed once, the best
 *              kernel of the list (kernels/list.h) that it can run is taken, and ATTN_ISA
 *              can force another. ATTN_VERBOSE=1 says on stderr which one was chosen.
 *              Also the CPU model the kernels' per-CPU geometry is chosen by
 *              (ai_cpu_model_now, kernels.h).
 *
 * The library itself is compiled for the baseline ISA; only the kernel files get ISA
 * flags, so nothing here may touch a vector type.
 */
#include <pthread.h>
#include <stddef.h>
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
#define ATTN_CPU(feature) __builtin_cpu_supports(#feature)
#define ATTN_CPU_F16C cpu_has_f16c()
#endif

/* This CPU's vendor string (12 characters and a NUL), family and model as CPUID leaf 1
 * gives them (the extended fields folded in for family 0Fh); "unknown", 0, 0 elsewhere. */
void ai_cpu_ident(char vendor[13], unsigned *family, unsigned *model) {
    memcpy(vendor, "unknown", 8);
    *family = *model = 0;
#if defined(__x86_64__) || defined(_M_X64)
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return;
    memcpy(vendor, &b, 4), memcpy(vendor + 4, &d, 4), memcpy(vendor + 8, &c, 4);
    vendor[12] = '\0';
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    const unsigned base = (a >> 8) & 0xF;
    *family = base == 0xF ? base + ((a >> 20) & 0xFF) : base;
    *model = ((a >> 4) & 0xF) | (base == 0xF ? ((a >> 16) & 0xF) << 4 : 0);
#endif
}

/* Which AMD Zen core this is by its CPUID family and model: AuthenticAMD, family 19h;
 * Zen 3 models 00-0Fh (Milan), 20-2Fh (Vermeer), 40-5Fh (Rembrandt, Cezanne); Zen 4
 * models 10-1Fh (Genoa), 60-7Fh (Raphael, Phoenix), A0-AFh (Bergamo, Siena). */
static attn_cpu_model cpu_zen(void) {
    char vendor[13];
    unsigned family, model;
    ai_cpu_ident(vendor, &family, &model);
    if (strcmp(vendor, "AuthenticAMD") != 0 || family != 0x19) return ATTN_CPU_OTHER;
    if (model <= 0x0F || (model >= 0x20 && model <= 0x2F) || (model >= 0x40 && model <= 0x5F))
        return ATTN_CPU_ZEN3;
    if ((model >= 0x10 && model <= 0x1F) || (model >= 0x60 && model <= 0x7F) ||
        (model >= 0xA0 && model <= 0xAF))
        return ATTN_CPU_ZEN4;
    return ATTN_CPU_OTHER;
}

/* the CPU model the kernels' per-CPU geometry is looked up by (kernels.h), probed once */
static attn_cpu_model g_model;
static pthread_once_t g_model_once = PTHREAD_ONCE_INIT;
static void probe_model(void) { g_model = cpu_zen(); }

attn_cpu_model ai_cpu_model_now(void) {
    pthread_once(&g_model_once, probe_model);
    return g_model;
}

/* One entry per line of kernels/list.h: the table and whether this CPU can run it. */
typedef struct kernel_entry {
    const attn_kernels *table;
    bool (*probe)(void);
} kernel_entry;

#define ATTN_X_PROBE(name, flags, row_pad, bq, bk_min, bk_max, probe) \
    static bool probe_##name(void) { return (probe); }
ATTN_KERNEL_LIST(ATTN_X_PROBE)
#undef ATTN_X_PROBE

static const kernel_entry g_list[] = {
#define ATTN_X_ENTRY(name, ...) {&attn_kernels_##name, probe_##name},
    ATTN_KERNEL_LIST(ATTN_X_ENTRY)
#undef ATTN_X_ENTRY
};
enum { N_KERNELS = sizeof g_list / sizeof g_list[0] };

/* the names, NULL-terminated, for attn_kernel_list() */
static const char *const g_names[] = {
#define ATTN_X_NAME(name, ...) #name,
    ATTN_KERNEL_LIST(ATTN_X_NAME)
#undef ATTN_X_NAME
    NULL};

static bool cpu_can_run(const kernel_entry *e) {
#if defined(__x86_64__) || defined(_M_X64)
    __builtin_cpu_init();
#endif
    return e->probe();
}


static const attn_kernels *g_chosen;
static char g_why[200];

static void choose(void) {
    const char *want = getenv("ATTN_ISA");
    if (want && *want) {
        for (int i = 0; i < N_KERNELS; i++) {
            if (strcmp(want, g_list[i].table->name) != 0) continue;
            if (cpu_can_run(&g_list[i]))
                g_chosen = g_list[i].table;
            else
                snprintf(g_why, sizeof g_why, "ATTN_ISA=%s: this CPU cannot run it", want);
            break;
        }
        if (!g_chosen && !g_why[0]) {
            int at = snprintf(g_why, sizeof g_why, "ATTN_ISA=%s: no such kernel (this build has", want);
            for (int i = 0; i < N_KERNELS && at > 0 && (size_t)at < sizeof g_why; i++)
                at += snprintf(g_why + at, sizeof g_why - (size_t)at, " %s", g_names[i]);
            if (at > 0 && (size_t)at < sizeof g_why) snprintf(g_why + at, sizeof g_why - (size_t)at, ")");
        }
    } else {
        for (int i = 0; i < N_KERNELS && !g_chosen; i++)
            if (cpu_can_run(&g_list[i])) g_chosen = g_list[i].table;
    }
    const char *verbose = getenv("ATTN_VERBOSE");
    if (verbose && *verbose && strcmp(verbose, "0") != 0)
        fprintf(stderr, "attn: kernel %s%s%s\n", g_chosen ? g_chosen->name : "(none)",
                g_chosen ? "" : ": ", g_chosen ? "" : g_why);
}

/* pthread_once: the probe and getenv run once, whichever thread calls first */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

const attn_kernels *ai_select_kernels(const char **why) {
    pthread_once(&g_once, choose);
    if (why) *why = g_why;
    return g_chosen;
}

const char *attn_kernel_name(void) {
    const attn_kernels *k = ai_select_kernels(NULL);
    return k ? k->name : "none";
}

bool attn_kernel_supported(const char *name) { return ai_kernels_named(name) != NULL; }

const attn_kernels *ai_kernels_named(const char *name) {
    if (!name) return NULL;
    for (int i = 0; i < N_KERNELS; i++)
        if (strcmp(name, g_list[i].table->name) == 0)
            return cpu_can_run(&g_list[i]) ? g_list[i].table : NULL;
    return NULL;
}

const char *const *attn_kernel_list(void) { return g_names; }

/* kern, or the best kernel after it in the list that this CPU runs and whose table has
 * the flag at byte offset `flag` set (decode_q8_0, decode_fp8, decode_q4_0); kern when none has */
static const attn_kernels *kernels_with(const attn_kernels *kern, size_t flag) {
    int at = 0;
    while (at < N_KERNELS && g_list[at].table != kern) at++;
    for (int i = at; i < N_KERNELS; i++)
        if (*(const bool *)((const char *)g_list[i].table + flag) && cpu_can_run(&g_list[i]))
            return g_list[i].table;
    return kern;
}

const attn_kernels *ai_kernels_for_q8_0(const attn_kernels *kern) {
    return kernels_with(kern, offsetof(attn_kernels, decode_q8_0));
}

const attn_kernels *ai_kernels_for_fp8(const attn_kernels *kern) {
    return kernels_with(kern, offsetof(attn_kernels, decode_fp8));
}

const attn_kernels *ai_kernels_for_q4_0(const attn_kernels *kern) {
    return kernels_with(kern, offsetof(attn_kernels, decode_q4_0));
}
