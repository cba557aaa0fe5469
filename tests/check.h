/*
 * check.h — the test suites' small framework: counted checks, a closing
 *           "<suite>: N passed, N failed" line, and the contract's float32 tolerance.
 * Header-only; each test program includes it once.
 */
#ifndef ATTN_TEST_CHECK_H
#define ATTN_TEST_CHECK_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

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

/* The contract's float32 tolerance (docs/CONTRACT.md):
 *   ||got - ref||_F / ||ref||_F <= 1e-6   and   max |got - ref| <= 1e-5 * (1 + max |ref|)
 * Non-finite reference entries must match exactly (NaN where NaN, the same infinity).
 * Returns 1 when within tolerance; fills *max_err and *rel_err for messages. */
typedef struct tol_result {
    double max_err, rel_err, max_ref;
    int64_t worst;     /* index of the largest error, -1 if none */
    int nonfinite_mismatch;
} tol_result;

static inline int within_f32_tol(const float *got, const double *ref, int64_t n, tol_result *r) {
    double num = 0, den = 0, max_err = 0, max_ref = 0;
    int64_t worst = -1;
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = got[i], e = ref[i];
        if (!isfinite(e) || !isfinite(g)) {
            int same = (isnan(e) && isnan(g)) || (g == e);
            if (!same) { bad++; if (worst < 0) worst = i; }
            continue;
        }
        double d = fabs(g - e);
        num += d * d;
        den += e * e;
        if (fabs(e) > max_ref) max_ref = fabs(e);
        if (d > max_err) { max_err = d; worst = i; }
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    if (r) {
        r->max_err = max_err; r->rel_err = rel; r->max_ref = max_ref;
        r->worst = worst; r->nonfinite_mismatch = bad;
    }
    return bad == 0 && rel <= 1e-6 && max_err <= 1e-5 * (1.0 + max_ref);
}

#endif /* ATTN_TEST_CHECK_H */
