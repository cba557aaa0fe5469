/*
 * alloc.h — the library's one door to the heap: attn_malloc, attn_calloc and attn_free.
 *
 * What it is: plain malloc, calloc and free in every ordinary build (inline, no cost).
 * Built with -DATTN_FAULT_INJECTION (the sanitizer run of scripts/check.sh), every
 * allocation is counted and a test can make the n-th one from now fail
 * (attn_fault_arm), to see each failure point of a call return ATTN_ERR_NOMEM, write
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
/* Counted; NULL when this is the allocation attn_fault_arm asked to fail. */
void *attn_malloc(size_t n);
void *attn_calloc(size_t count, size_t size);
/* n > 0: the n-th allocation from now fails (1 = the next one), the others succeed;
 * n = 0: none fails. Either way the count restarts at 0. */
void attn_fault_arm(int64_t n);
/* Allocations made (tried, the failed one included) since the last attn_fault_arm. */
int64_t attn_fault_count(void);
#else
static inline void *attn_malloc(size_t n) { return malloc(n); }
static inline void *attn_calloc(size_t count, size_t size) { return calloc(count, size); }
#endif

static inline void attn_free(void *p) { free(p); }

#endif /* ATTN_ALLOC_H */
