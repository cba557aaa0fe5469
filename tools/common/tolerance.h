/*
 * tolerance.h — the contract's float32 tolerance (docs/CONTRACT.md), written once for the
 *               test suites (tests/support/check.h: within_f32_tol) and the bench's answer check
 *               (bench/cli_bench.c):
 *
 *   ||got - ref||_F / ||ref||_F <= 1e-6   and   max |got - ref| <= 1e-5 * (1 + max |ref|)
 *
 * Non-finite reference entries must match exactly (NaN where NaN, the same infinity), and
 * a non-finite result where the reference is finite fails.
 *
 * And the log-sum-exp's bound, derived from the float32 error model (docs/CONTRACT.md,
 * "The float32 error model": the constants TOL_* below are its only copy in the tests):
 *
 *   |lse - ref| <= u [ (Dk + 5) A + 2E + min(n, BK_MAX) + (2E + 2) ceil(n / BK_MIN) + 2 ]
 *
 * per row, with A the row's logit magnitude (max over its keys of
 * |scale| sum_d |q_d k_d| + |bias| + |ALiBi term| + softcap) and n its key count.
 * Header-only; not the library.
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

/* ---- the float32 error model (docs/CONTRACT.md, "The float32 error model") ---------- */

#define TOL_U32 0x1p-24     /* float32's unit roundoff */
#define TOL_EXP_ULP 2.0     /* the kernels' exp: at most 2 ulp (docs/KERNELS.md), so a relative
                             * error of at most 2 E u (an ulp is at most 2u of the value) */
#define TOL_BK_MIN 16.0     /* the key blocks of every kernel lie in [16, 128] (kernels/list.h) */
#define TOL_BK_MAX 128.0

/* A float32 dot product of n terms times a scale, with or without FMA, in any order:
 * its error relative to its magnitude (|scale| sum |a_d b_d|) is at most (n + 2) u. */
static inline double tol_dot_rel(int64_t n) { return ((double)n + 2.0) * TOL_U32; }

/* A float32 sum of n terms (products or not, each rounded once), in any order: its error
 * relative to the sum of the terms' magnitudes is at most (n + 1) u. */
static inline double tol_sum_rel(int64_t n) { return ((double)n + 1.0) * TOL_U32; }

/* The bound on one row's LSE error (an absolute one: ln l's error is relative to l):
 *  - each logit is a dot of Dk products: Dk u of its magnitude A (tol_dot_rel), and 5 u
 *    more for the scale, the bias or ALiBi term's addition, softcap, the final m + ln l
 *    and ln's own error (ln l <= |lse| + A);
 *  - the row sum l of n exp values, each at most E ulps (2E u) off, summed in blocks of
 *    at most BK_MAX keys (BK_MAX additions in a block), each block's sum added to the
 *    running one and that rescaled by one more exp, once per block of at least BK_MIN
 *    keys (2E + 2 a block); the split-key and merged partials are such blocks too;
 *  - and 2 for ln of an l near 1. */
static inline double tol_lse_bound(int64_t dk, int64_t n_keys, double mag) {
    const double n = n_keys > 0 ? (double)n_keys : 1.0;
    const double sum = 2.0 * TOL_EXP_ULP + (n < TOL_BK_MAX ? n : TOL_BK_MAX) +
                       (2.0 * TOL_EXP_ULP + 2.0) * ceil(n / TOL_BK_MIN);
    return TOL_U32 * (((double)dk + 5.0) * mag + sum + 2.0);
}

/* The relative error of one weight P_ij = exp(s_ij - lse_i) of a float32 path, the logit
 * and the LSE each off by their bounds, exp's 2E u and the subtraction's u: what a row of
 * weights (its sum, each element) is within, relative to itself. */
static inline double tol_weight_rel(int64_t dk, int64_t n_keys, double mag) {
    return ((double)dk + 5.0) * TOL_U32 * mag + tol_lse_bound(dk, n_keys, mag) +
           (2.0 * TOL_EXP_ULP + 1.0) * TOL_U32;
}

/* The LSE rule over n rows: non-finite references matched exactly (as tol_add), each
 * finite row within times * tol_lse_bound(dk, n_keys, mag[i]) (times 1 against a float64
 * reference, 2 between two float32 results). *r: max_err is the largest error, rel_err
 * the largest error / bound (1 at the bound), worst its row. */
static inline int tol_lse_pass(const float *got, const double *ref, const double *mag, int64_t n,
                               int64_t dk, int64_t n_keys, double times, tol_result *r) {
    tol_result x = {0, 0, 0, -1, 0};
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(ref[i]) || !isfinite(got[i])) {
            if (!((isnan(ref[i]) && isnan(got[i])) || got[i] == ref[i])) {
                x.nonfinite_mismatch++;
                if (x.worst < 0) x.worst = i;
            }
            continue;
        }
        const double d = fabs(got[i] - ref[i]), ratio = d / (times * tol_lse_bound(dk, n_keys, mag[i]));
        if (fabs(ref[i]) > x.max_ref) x.max_ref = fabs(ref[i]);
        if (d > x.max_err) x.max_err = d;
        if (!(ratio <= x.rel_err)) x.rel_err = isnan(ratio) ? INFINITY : ratio, x.worst = i;
    }
    if (r) *r = x;
    return x.nonfinite_mismatch == 0 && x.rel_err <= 1.0;
}

#endif /* ATTN_TOOLS_TOLERANCE_H */
