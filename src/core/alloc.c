/*
 * alloc.c — the counting allocator of a fault-injection build (see alloc.h). In any
 * other build this file is empty: ai_malloc and ai_calloc are malloc and calloc.
 */
#include "alloc.h"

#ifdef ATTN_FAULT_INJECTION
#include <stdatomic.h>

/* atomics, so that allocations from several threads are counted once each */
static _Atomic int64_t g_count, g_fail_at;

void ai_fault_arm(int64_t n) {
    atomic_store(&g_count, 0);
    atomic_store(&g_fail_at, n > 0 ? n : 0);
}

int64_t ai_fault_count(void) { return atomic_load(&g_count); }

static int should_fail(void) {
    const int64_t n = atomic_fetch_add(&g_count, 1) + 1;
    return n == atomic_load(&g_fail_at);
}

void *ai_malloc(size_t n) { return should_fail() ? NULL : malloc(n); }

void *ai_calloc(size_t count, size_t size) { return should_fail() ? NULL : calloc(count, size); }
#else
typedef int attn_alloc_unused; /* ISO C wants at least one declaration per file */
#endif
