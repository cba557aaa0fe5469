/*
 * alloc.h — the library's one door to the heap: ai_malloc, ai_calloc and ai_free.
 *
 * What it is: plain malloc, calloc and free in every ordinary build (inline, no cost).
 * Built with -DATTN_FAULT_INJECTION (the sanitizer run of scripts/check.sh), every
 * allocation is counted and a test can make the n-th one from now fail
 * (ai_fault_arm), to see each failure point of a call return ATTN_ERR_NOMEM, write
 * nothing and leak nothing (tests/test_nomem.c). What it is not: an allocator, a pool,
 * or a place for alignment rules; memory the BLAS or OpenMP allocate is not seen here.
 * Every library file that allocates includes this header and calls these three only.
 */
#ifndef ATTN_ALLOC_H
#define ATTN_ALLOC_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#ifdef ATTN_FAULT_INJECTION
/* Counted; NULL when this is the allocation ai_fault_arm asked to fail. */
void *ai_malloc(size_t n);
void *ai_calloc(size_t count, size_t size);
/* n > 0: the n-th allocation from now fails (1 = the next one), the others succeed;
 * n = 0: none fails. Either way the count restarts at 0. */
void ai_fault_arm(int64_t n);
/* Allocations made (tried, the failed one included) since the last ai_fault_arm. */
int64_t ai_fault_count(void);
#else
static inline void *ai_malloc(size_t n) { return malloc(n); }
static inline void *ai_calloc(size_t count, size_t size) { return calloc(count, size); }
#endif

static inline void ai_free(void *p) { free(p); }

#endif /* ATTN_ALLOC_H */
