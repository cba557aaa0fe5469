/*
 * pages.h — what the paged-cache suites (test_paged.c, test_kv_append_q8.c) share: the
 *           pool's page numbers in a shuffled order, so that a block table never maps
 *           logical pages to physical ones in order by accident.
 *
 * What it is not: a block table (each suite fills its own from this order) or a source
 * of randomness: the draws are the suite's own stream (u).
 */
#ifndef ATTN_TEST_PAGES_H
#define ATTN_TEST_PAGES_H

#include <stdint.h>
#include <stdlib.h>

/* 0..n-1 shuffled (Fisher-Yates, u() uniform in [0, 1)); malloc'd, NULL when out of
 * memory */
static inline int32_t *shuffled_pages(int64_t n, double (*u)(void)) {
    int32_t *perm = malloc((size_t)n * sizeof(int32_t));
    if (!perm) return NULL;
    for (int64_t a = 0; a < n; a++) perm[a] = (int32_t)a;
    for (int64_t a = n - 1; a > 0; a--) {
        const int64_t z = (int64_t)(u() * (double)(a + 1));
        const int32_t t = perm[a]; perm[a] = perm[z]; perm[z] = t;
    }
    return perm;
}

#endif /* ATTN_TEST_PAGES_H */
