/*
 * check.h — the test suites' small framework: counted checks, a closing
 *           "<suite>: N passed, N failed" line, the contract's float32 tolerance on a
 *           float64 reference (the rule itself is tools/common/tolerance.h), and xcalloc.
 * Header-only; each test program includes it once.
 */
#ifndef ATTN_TEST_CHECK_H
#define ATTN_TEST_CHECK_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "tolerance.h"

static int g_pass, g_fail;

static inline void check_failed(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* CHECK(condition, "printf-style message shown on failure", ...) */
#define CHECK(cond, ...)                                          \
    do {                                                          \
        if (cond) {                                               \
            g_pass++;                                             \
        } else {                                                  \
            g_fail++;                                             \
            check_failed(__FILE__, __LINE__, __VA_ARGS__);        \
        }                                                         \
    } while (0)

static inline int check_summary(const char *suite) {
    printf("%s: %d passed, %d failed\n", suite, g_pass, g_fail);
    return g_fail != 0;
}

/* The contract's float32 tolerance (tools/common/tolerance.h) against a float64 reference:
 * 1 when within it; fills *r (when not NULL) for messages. */
static inline int within_f32_tol(const float *got, const double *ref, int64_t n, tol_result *r) {
    tol_acc a = tol_start();
    for (int64_t i = 0; i < n; i++) tol_add(&a, i, got[i], ref[i]);
    return tol_pass(&a, r);
}

/* ATTN_TEST_EVERY=n (scripts/check.sh sets it for the emulated AArch64 run, where the
 * portable build is what is tested; the sanitizer run, where the memory errors are, not
 * the size of the case matrix; and the kernels dispatch does not pick on this CPU, whose
 * numbers the picked kernel's full run and theirs share out): the big case loops run one
 * case in n, in a fixed order, the cases c with c % n == ATTN_TEST_PHASE (0 when unset;
 * all when n is unset or 1). test_case_skipped is true when this case is one to skip; the
 * loops call it once per case. test_sampling gives n and the phase, for a suite that picks
 * its cases by another count (test_fwd_geom). */
static inline void test_sampling(int64_t *every_out, int64_t *phase_out) {
    static int64_t every = -1, phase = 0;
    if (every < 0) {
        const char *e = getenv("ATTN_TEST_EVERY"), *ph = getenv("ATTN_TEST_PHASE");
        every = e && atoi(e) > 1 ? atoi(e) : 1;
        phase = ph && atoi(ph) > 0 ? atoi(ph) % every : 0;
        if (every > 1)
            printf("ATTN_TEST_EVERY=%lld: the case matrices run one case in %lld (from case "
                   "%lld)\n", (long long)every, (long long)every, (long long)phase);
    }
    *every_out = every;
    *phase_out = phase;
}

static inline int test_case_skipped(void) {
    static int64_t seen = 0;
    int64_t every, phase;
    test_sampling(&every, &phase);
    return seen++ % every != phase;
}

/* calloc of n (at least 1) elements, or the suite exits 2 when out of memory */
static inline void *xcalloc(int64_t n, size_t size) {
    void *p = calloc((size_t)(n > 0 ? n : 1), size);
    if (!p) {
        fprintf(stderr, "test: out of memory\n");
        exit(2);
    }
    return p;
}

/* The contract's LSE bound (tools/common/tolerance.h: tol_lse_bound) on every row, mag[i]
 * the row's logit magnitude (oracle.h: oracle_logit_mag), n_keys the keys of a row (Lk,
 * or more where sinks or merged parts add terms). */
static inline int within_lse_tol(const float *got, const double *ref, const double *mag, int64_t n,
                                 int64_t dk, int64_t n_keys, tol_result *r) {
    return tol_lse_pass(got, ref, mag, n, dk, n_keys, 1.0, r);
}

/* The same between two float32 results, each within the bound of the exact LSE. */
static inline int within_lse_tol_pair(const float *got, const float *other, const double *mag,
                                      int64_t n, int64_t dk, int64_t n_keys, tol_result *r) {
    double *ref = (double *)xcalloc(n, sizeof(double));
    for (int64_t i = 0; i < n; i++) ref[i] = other[i];
    const int ok = tol_lse_pass(got, ref, mag, n, dk, n_keys, 2.0, r);
    free(ref);
    return ok;
}

#endif /* ATTN_TEST_CHECK_H */
