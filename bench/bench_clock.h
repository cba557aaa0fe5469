/*
 * bench_clock.h — the clocks and the median every bench program uses: wall time
 *                 (CLOCK_MONOTONIC), the process's CPU time over all threads (the fairer
 *                 figure on a machine other processes share), and the median of n times.
 */
#ifndef ATTN_TOOLS_BENCH_CLOCK_H
#define ATTN_TOOLS_BENCH_CLOCK_H

#include <stdlib.h>
#include <time.h>

static inline double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static inline double cpu_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static inline int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of t[0..n) (n >= 1), which it sorts. */
static inline double median(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

#endif /* ATTN_TOOLS_BENCH_CLOCK_H */
