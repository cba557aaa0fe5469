/*
 * exp.h — the vectorized exp of the AVX-512 kernels, shared by the avx512 and avx512bf16
 *         folders (both compiled with AVX-512 flags; include it nowhere else). Its error
 *         bound is tested by tests/test_kernels.c through each table's exp entry.
 */
#ifndef ATTN_EXP_AVX512_H
#define ATTN_EXP_AVX512_H

#include <immintrin.h>

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

#endif /* ATTN_EXP_AVX512_H */
