/*
 * kernels_generic.c — the portable C micro-kernels (contracts in kernels.h).
 *
 * Written so that a compiler vectorizes them without -ffast-math: every inner loop runs
 * over independent outputs (keys of S, columns of the accumulator), never a reduction
 * whose order it would have to change. exp and log are libm's. This is the kernel every
 * machine has and the yardstick the ISA-specific kernels are measured against.
 */
#include <math.h>
#include <string.h>

#include "kernels.h"

static void qk_generic(int64_t n, int64_t nk, int64_t dk, const float *q, int64_t ldq,
                       const float *kt, int64_t ldk, float scale, float *s, int64_t lds) {
    for (int64_t r = 0; r < n; r++) {
        float *s_r = s + r * lds;
        const float *q_r = q + r * ldq;
        for (int64_t c = 0; c < nk; c++) s_r[c] = 0.0f;
        /* rank-1 updates over d: the loop over c vectorizes, each s_rc summed in d order */
        for (int64_t d = 0; d < dk; d++) {
            const float q_rd = q_r[d];
            const float *kt_d = kt + d * ldk;
            for (int64_t c = 0; c < nk; c++) s_r[c] += q_rd * kt_d[c];
        }
        for (int64_t c = 0; c < nk; c++) s_r[c] *= scale;
    }
}

static void softmax_generic(int64_t n, int64_t nk, float *s, int64_t lds, float *m, float *l,
                            float *alpha) {
    for (int64_t r = 0; r < n; r++) {
        float *s_r = s + r * lds;
        float mx = m[r];
        bool nan = isnan(mx);
        for (int64_t c = 0; c < nk; c++) {
            if (s_r[c] > mx) mx = s_r[c];
            nan |= isnan(s_r[c]);
        }
        if (nan) mx = NAN;  // a NaN logit poisons its row, as IEEE arithmetic would
        if (mx == -INFINITY) {
            /* Every key so far is masked. exp(s - mx) would be exp(-inf - -inf) = NaN;
             * the row has nothing to add yet, so its p are 0 and its state unchanged. */
            for (int64_t c = 0; c < nk; c++) s_r[c] = 0.0f;
            alpha[r] = 1.0f;
            continue;
        }
        float sum = 0.0f;
        for (int64_t c = 0; c < nk; c++) {
            s_r[c] = expf(s_r[c] - mx);
            sum += s_r[c];
        }
        alpha[r] = expf(m[r] - mx);  // m[r] = -inf gives 0: nothing to rescale
        l[r] = l[r] * alpha[r] + sum;
        m[r] = mx;
    }
}

static void pv_generic(int64_t n, int64_t nk, int64_t dv, const float *p, int64_t lds,
                       const float *v, int64_t ldv, const float *alpha, float *acc,
                       int64_t ldo, float *tmp) {
    for (int64_t r = 0; r < n; r++) {
        const float *p_r = p + r * lds;
        float *acc_r = acc + r * ldo;
        for (int64_t d = 0; d < dv; d++) tmp[d] = 0.0f;
        for (int64_t c = 0; c < nk; c++) {
            const float p_rc = p_r[c];
            if (p_rc == 0.0f) continue;  // masked (or underflowed): V is not read
            const float *v_c = v + c * ldv;
            for (int64_t d = 0; d < dv; d++) tmp[d] += p_rc * v_c[d];
        }
        const float a = alpha[r];
        for (int64_t d = 0; d < dv; d++) acc_r[d] = acc_r[d] * a + tmp[d];
    }
}

const attn_kernels attn_kernels_generic = {
    .name = "generic",
    .qk = qk_generic,
    .softmax = softmax_generic,
    .pv = pv_generic,
};
