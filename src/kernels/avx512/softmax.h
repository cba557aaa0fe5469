/*
 * softmax.h — the online softmax's first and last steps over the 16 rows of an S^T tile
 *             in zmm registers (the running max with NaN kept, and the rescaled sums),
 *             shared by the avx512 softmax and the avx512bf16 softmax_pairs, which must
 *             agree bit for bit. AVX-512 flags only; include it nowhere else.
 */
#ifndef ATTN_SOFTMAX_AVX512_H
#define ATTN_SOFTMAX_AVX512_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "exp.h"

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

#endif /* ATTN_SOFTMAX_AVX512_H */
