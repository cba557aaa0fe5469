/*
 * exp_avx512.h — the vectorized exp of the AVX-512 kernels and the max pass of their
 *                softmax, shared by kernels_avx512.c and kernels_avx512bf16.c (both
 *                compiled with AVX-512 flags; include it nowhere else).
 */
#ifndef ATTN_EXP_AVX512_H
#define ATTN_EXP_AVX512_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

/* exp(x) for a vector: n = round(x log2 e), r = x - n ln 2 in two steps (Cody-Waite),
 * e^r by its degree-7 Taylor polynomial on |r| <= ln2/2 (truncation < 1.2e-8 relative),
 * then scalef by 2^n, which rounds correctly into subnormals and 0 and saturates to inf.
 * x is clamped below at -104, where exp is already 0 in float32; max(-104, x) returns x
 * when x is NaN, so NaN stays NaN and -inf gives exactly 0. Measured against float64 exp
 * over [-104, 88]: at most 2 ulp (tests/test_kernels.c). */
static inline __attribute__((always_inline)) __m512 exp_avx512(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606820309417e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* The first pass of the online softmax over the 16 rows of an S^T tile at s (nk keys, row
 * stride lds): returns the new running max, max(m_old, the logits), NaN where the old max
 * or any logit of the row is NaN (max_ps alone would drop it); *shift gets the value the
 * exps subtract: the max, or 0 for rows with every key masked so far, so that
 * exp(-inf - 0) = 0 rather than exp(-inf - -inf) = NaN. */
static inline __attribute__((always_inline)) __m512 softmax_max_avx512(const float *s, int64_t lds,
                                                                        int64_t nk, __m512 m_old,
                                                                        __m512 *shift) {
    __m512 mx = m_old;
    __mmask16 nan = _mm512_cmp_ps_mask(m_old, m_old, _CMP_UNORD_Q);
    for (int64_t c = 0; c < nk; c++) {
        const __m512 x = _mm512_loadu_ps(s + c * lds);
        mx = _mm512_max_ps(mx, x);
        nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    }
    mx = _mm512_mask_mov_ps(mx, nan, _mm512_set1_ps(NAN));
    *shift = _mm512_mask_mov_ps(mx, _mm512_cmp_ps_mask(mx, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ),
                                _mm512_setzero_ps());
    return mx;
}

/* The last step of the online softmax over 16 rows: alpha = exp(m_old - shift) rescales
 * the old sum, l = l * alpha + sum, m = the new max (the rows' entries at m, l, alpha). */
static inline __attribute__((always_inline)) void softmax_store_avx512(__m512 m_old, __m512 shift,
                                                                        __m512 mx, __m512 sum,
                                                                        float *m, float *l,
                                                                        float *alpha) {
    const __m512 a = exp_avx512(_mm512_sub_ps(m_old, shift));
    _mm512_storeu_ps(alpha, a);
    _mm512_storeu_ps(l, _mm512_fmadd_ps(_mm512_loadu_ps(l), a, sum));
    _mm512_storeu_ps(m, mx);
}

#endif /* ATTN_EXP_AVX512_H */
