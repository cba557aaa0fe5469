/*
 * generic/kernels.c — the portable C micro-kernels (contracts in kernels.h).
 *
 * Written so that a compiler vectorizes them without fast-math: every inner loop runs
 * over independent outputs (query rows of S^T, columns of the accumulator), never a
 * reduction whose order it would have to change. exp is libm's expf. This is the kernel
 * every machine has, the one a non-x86 build runs, and the yardstick of the others.
 */
#include <math.h>
#include <string.h>

#include "core/half.h"
#include "kernels/additive_kernels.h"
#include "kernels/kernels.h"
#include "core/philox.h"

static void qk_generic(int64_t n, int64_t npad, int64_t nk, int64_t dk, const float *q,
                       const float *qt, int64_t ldq, const float *k, int64_t ldk, float scale, float *s, int64_t lds) {
    for (int64_t c = 0; c < nk; c++) {
        float *s_c = s + c * lds;
        const float *k_c = k + c * ldk;
        for (int64_t r = 0; r < npad; r++) s_c[r] = 0.0f;
        /* rank-1 updates over d: the loop over r vectorizes, each s summed in d order */
        for (int64_t d = 0; d < dk; d++) {
            const float k_cd = k_c[d];
            const float *qt_d = qt + d * ldq;
            for (int64_t r = 0; r < npad; r++) s_c[r] += k_cd * qt_d[r];
        }
        for (int64_t r = 0; r < npad; r++) s_c[r] *= scale;
    }
}

static void softmax_generic(int64_t npad, int64_t nk, float *s, int64_t lds, float *m,
                            float *l, float *alpha) {
    for (int64_t r = 0; r < npad; r++) {
        float mx = m[r];
        bool nan = isnan(mx);
        for (int64_t c = 0; c < nk; c++) {
            const float x = s[c * lds + r];
            if (x > mx) mx = x;
            nan |= isnan(x);
        }
        if (nan) mx = NAN;  // a NaN logit poisons its row, as IEEE arithmetic would
        /* Every key so far masked: mx = -inf, and exp(-inf - -inf) would be NaN. Shift by
         * 0 instead: the row's p are exp(-inf) = 0 and its state does not change. */
        const float shift = mx == -INFINITY ? 0.0f : mx;
        float sum = 0.0f;
        for (int64_t c = 0; c < nk; c++) {
            float *x = &s[c * lds + r];
            *x = expf(*x - shift);
            sum += *x;
        }
        alpha[r] = expf(m[r] - shift);  // m = -inf: 0, nothing to rescale
        l[r] = l[r] * alpha[r] + sum;
        m[r] = mx;
    }
}

static void pv_generic(int64_t n, int64_t npad, int64_t nk, int64_t dv, const float *p,
                       int64_t lds, const float *v, int64_t ldv, const float *alpha,
                       float *acc, int64_t ldo, bool skip_zeros) {
    (void)npad;
    float tmp[256];  // the tile's P V for one row, dv in chunks of 256
    for (int64_t r = 0; r < n; r++) {
        float *acc_r = acc + r * ldo;
        for (int64_t d0 = 0; d0 < dv; d0 += 256) {
            const int64_t nd = dv - d0 < 256 ? dv - d0 : 256;
            for (int64_t d = 0; d < nd; d++) tmp[d] = 0.0f;
            for (int64_t c = 0; c < nk; c++) {
                const float p_rc = p[c * lds + r];
                if (skip_zeros && p_rc == 0.0f) continue;  // masked: V is not read
                const float *v_c = v + c * ldv + d0;
                for (int64_t d = 0; d < nd; d++) tmp[d] += p_rc * v_c[d];
            }
            const float a = alpha[r];
            for (int64_t d = 0; d < nd; d++) acc_r[d0 + d] = acc_r[d0 + d] * a + tmp[d];
        }
    }
}

static void exp_array_generic(int64_t n, const float *x, float *y) {
    for (int64_t i = 0; i < n; i++) y[i] = expf(x[i]);
}

/* branch-free: a random mask would mispredict half its branches. The logit's bits are
 * kept, or replaced by -inf's (0xff800000), through an all-ones or all-zeros word (the
 * library is built with -fno-strict-aliasing). */
void ai_mask_bool_generic(int64_t n, int64_t nk, const uint8_t *m, int64_t ldm, float *s,
                              int64_t lds) {
    for (int64_t r = 0; r < n; r++) {
        uint32_t *u_r = (uint32_t *)s + r;
        const uint8_t *m_r = m + r * ldm;
        for (int64_t c = 0; c < nk; c++) {
            const uint32_t keep = 0u - (uint32_t)(m_r[c] != 0);
            u_r[c * lds] = (u_r[c * lds] & keep) | (0xff800000u & ~keep);
        }
    }
}

static void to_f32_generic(attn_dtype dt, int64_t n, const uint16_t *src, float *dst) {
    if (dt == ATTN_BF16)
        for (int64_t i = 0; i < n; i++) dst[i] = attn_bf16_to_f32(src[i]);
    else
        for (int64_t i = 0; i < n; i++) dst[i] = attn_f16_to_f32(src[i]);
}

/* dropout's Philox words (kernels.h): philox.h's simd loop at this ISA's width */
static void dropout_generic(int64_t n, const uint64_t *grp, uint64_t seed, uint64_t offset,
                          uint32_t *u, int64_t ldu) {
    attn_dropout_words(n, grp, seed, offset, u, ldu);
}

const attn_kernels attn_kernels_generic = {
    .name = "generic",
    .geom = ATTN_GEOM(generic),
    .qk = qk_generic,
    .softmax = softmax_generic,
    .pv = pv_generic,
    .mask_bool = ai_mask_bool_generic,
    .to_f32 = to_f32_generic,
    .exp = exp_array_generic,
    .additive = &attn_additive_kernels_generic,
    .dropout = dropout_generic,
    .gemm = ai_gemm_generic,
};
