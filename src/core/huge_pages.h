/*
 * huge_pages.h — the advice that a block of many MiB be backed by huge pages, shared by
 *                the library's own workspaces (core.c, ai_workspace_acquire), the
 *                Python extension's kept ones (python/attn/_attn_inputs.c) and
 *                attn_huge_pages (core.c: a caller's cache, advised and collapsed).
 *
 * A workspace of many MiB (a prefill's dense copies, the backward's partials) is fresh
 * memory on most calls: asked for on huge pages where the kernel gives them on request
 * (Linux, transparent huge pages "madvise"), its first touch faults once per 2 MiB
 * instead of once per 4 KiB, and a tile's rows need fewer TLB entries. The advice covers
 * the whole 2 MiB pages inside the block; it changes no byte, and a refusal is ignored.
 * Elsewhere, or where the including file did not ask for MADV_HUGEPAGE (_DEFAULT_SOURCE
 * or _GNU_SOURCE before its first system header), it does nothing.
 */
#ifndef ATTN_HUGE_PAGES_H
#define ATTN_HUGE_PAGES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#ifdef __linux__
#include <sys/mman.h>
#endif

/* The whole 2 MiB pages inside [p, p + n): *a and *b, false where there are none */
static inline bool ai_huge_range(const void *p, size_t n, uintptr_t *a, uintptr_t *b) {
    const uintptr_t page = (uintptr_t)2 << 20;
    *a = ((uintptr_t)p + page - 1) & ~(page - 1);
    *b = ((uintptr_t)p + n) & ~(page - 1);
    return *b > *a;
}

static inline void ai_huge_pages(void *p, size_t n) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    uintptr_t a, b;
    if (ai_huge_range(p, n, &a, &b) && b - a >= (uintptr_t)4 << 20)
        (void)madvise((void *)a, b - a, MADV_HUGEPAGE);
#else
    (void)p, (void)n;
#endif
}

#endif /* ATTN_HUGE_PAGES_H */
