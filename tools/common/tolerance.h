/*
 * tolerance.h — the contract's float32 tolerance (docs/CONTRACT.md), written once for the
 *               test suites (tests/support/check.h: within_f32_tol) and the bench's answer check
 *               (bench/cli_bench.c):
 *
 *   ||got - ref||_F / ||ref||_F <= 1e-6   and   max |got - ref| <= 1e-5 * (1 + max |ref|)
 *
 * Non-finite reference entries must match exactly (NaN where NaN, the same infinity), and
 * a non-finite result where the reference is finite fails. Header-only; not the library.
 */
#ifndef ATTN_TOOLS_TOLERANCE_H
#define ATTN_TOOLS_TOLERANCE_H

#include <math.h>
#include <stdint.h>

typedef struct tol_result {
    double max_err, rel_err, max_ref;
    int64_t worst;     /* index of the largest error (or first non-finite mismatch), -1 if none */
    int nonfinite_mismatch;
} tol_result;

/* The sums the rule needs, one element at a time (tol_add), then the verdict (tol_pass). */
typedef struct tol_acc {
    double num, den, max_err, max_ref;
    int64_t worst;
    int bad;
} tol_acc;

static inline tol_acc tol_start(void) { return (tol_acc){0, 0, 0, 0, -1, 0}; }

static inline void tol_add(tol_acc *a, int64_t i, double got, double ref) {
    if (!isfinite(ref) || !isfinite(got)) {
        const int same = (isnan(ref) && isnan(got)) || got == ref;
        if (!same) {
            a->bad++;
            if (a->worst < 0) a->worst = i;
        }
        return;
    }
    const double d = fabs(got - ref);
    a->num += d * d;
    a->den += ref * ref;
    if (fabs(ref) > a->max_ref) a->max_ref = fabs(ref);
    if (d > a->max_err) a->max_err = d, a->worst = i;
}

/* 1 when within the tolerance; fills *r (when not NULL) for messages */
static inline int tol_pass(const tol_acc *a, tol_result *r) {
    const double rel = a->den > 0 ? sqrt(a->num / a->den) : sqrt(a->num);
    if (r) {
        r->max_err = a->max_err, r->rel_err = rel, r->max_ref = a->max_ref;
        r->worst = a->worst, r->nonfinite_mismatch = a->bad;
    }
    return a->bad == 0 && rel <= 1e-6 && a->max_err <= 1e-5 * (1.0 + a->max_ref);
}

#endif /* ATTN_TOOLS_TOLERANCE_H */
