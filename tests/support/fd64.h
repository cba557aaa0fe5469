/*
 * fd64.h — what the gradient suites (test_backward.c, test_dropout_backward.c) share to
 *          check the float64 reference backward against its own forward: the loss
 *          L = Σ dO ∘ O of ai_ref64_forward, its central differences in one input (step
 *          1e-5), and the relative Frobenius error that compares them.
 *
 * What it is not: the float32 tolerances (check.h, backward_case.h) or a gradient of its
 * own: the forward is the library's float64 path (src/backward/backward.h).
 */
#ifndef ATTN_TEST_FD64_H
#define ATTN_TEST_FD64_H

#include <math.h>
#include <stdint.h>

#include "backward/backward.h"

/* ‖got - ref‖ / ‖ref‖ (or ‖got - ref‖ when ref = 0) */
static inline double rel_frob(const double *got, const double *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += (got[i] - ref[i]) * (got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* L = Σ dO ∘ O of the float64 forward (o: scratch of no elements) */
static inline double fd_loss(const attn_params *p, const double *q, const double *k,
                             const double *v, const double *d_o, double *o, int64_t no) {
    ai_ref64_forward(p, q, k, v, o, NULL);
    double l = 0;
    for (int64_t e = 0; e < no; e++) l += d_o[e] * o[e];
    return l;
}

/* central differences of fd_loss with respect to x[0..n) (x is one of q, k, v) */
static inline void fd_grad(const attn_params *p, double *q, double *k, double *v,
                           const double *d_o, double *o, int64_t no, double *x, int64_t n,
                           double *g) {
    for (int64_t e = 0; e < n; e++) {
        const double x0 = x[e], h = 1e-5;
        x[e] = x0 + h;
        const double lp = fd_loss(p, q, k, v, d_o, o, no);
        x[e] = x0 - h;
        const double lm = fd_loss(p, q, k, v, d_o, o, no);
        x[e] = x0;
        g[e] = (lp - lm) / (2 * h);
    }
}

#endif /* ATTN_TEST_FD64_H */
