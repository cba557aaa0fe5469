/*
 * exp.h — what the files of the avx2 folder share (kernels.c, decode.c; compiled with
 *         the folder's AVX2 flags, include it nowhere else): the vectorized exp and the
 *         unroll and inline spellings. Its error bound is tested by tests/test_kernels.c
 *         through the table's exp entry.
 */
#ifndef ATTN_EXP_AVX2_H
#define ATTN_EXP_AVX2_H

#include <immintrin.h>

#include "kernels/kernels.h"

#define UNROLL _Pragma("GCC unroll 16")
#define INLINE ATTN_KERNEL_INLINE

/* exp(x): n = round(x log2 e), r = x - n ln 2 (Cody-Waite, two steps), e^r by its
 * degree-7 Taylor polynomial, 2^n built in the exponent bits. The kernels call it only
 * with x <= 0 (a logit minus its row max); x is clamped to [-87.33, 88] so that 2^n is a
 * normal number, and below -87.33 the result is flushed to 0 (the exact value is below
 * 2^-126 there: at most 1.2e-38 absolute error, nothing next to a softmax sum >= 1).
 * max(lo, x) returns x when x is NaN, so NaN stays NaN; -inf gives exactly 0.
 * The rounding to an integer is the shifter's: t = x log2 e + (1.5 * 2^23 + 127) in one
 * FMA leaves n + 127 in t's low mantissa bits (|n| < 2^22), so n = t - that constant
 * exactly and t's bits shifted left by 23 are 2^n: three operations where a round, a
 * conversion, an add and a shift were five (the exp is most of the softmax's work).
 * Measured against float64 exp on [-87.33, 0]: see tests/test_kernels.c. */
INLINE __m256 exp_avx2(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33654f);
    const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(lo, x);
    x = _mm256_min_ps(_mm256_set1_ps(88.0f), x);
    const __m256 shifter = _mm256_set1_ps(12582912.0f + 127.0f);  // 1.5 * 2^23 + 127
    const __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), shifter);
    const __m256 n = _mm256_sub_ps(t, shifter);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606820309417e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    /* 2^n for n in [-126, 127]: (n + 127) << 23, from t's bits */
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(t), 23);
    return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

#endif /* ATTN_EXP_AVX2_H */
