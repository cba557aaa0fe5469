/*
 * kernels_avx2.c — the AVX2 + FMA micro-kernels (contracts in kernels.h; design notes
 *                  and the exp error bound in docs/KERNELS.md).
 *
 * Only this file is compiled with AVX2 flags; dispatch.c calls it only on a CPU that has
 * AVX2 and FMA. The same design as the AVX-512 kernels at half the width and with 16
 * vector registers: one ymm holds 8 query rows of S^T. The register tiles:
 *   qk: 2 ymm of rows x 6 keys (12 accumulators); for at most 4 rows (decoding) the
 *       dot-product form, 4 rows x 2 keys reduced by one hadd tree;
 *   pv: 4 rows x 2 ymm of value columns (8 accumulators); a column tail narrower than
 *       8 goes through a masked load/store.
 */
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include <math.h>

#include "half.h"
#include "kernels.h"

#define UNROLL _Pragma("GCC unroll 16")
#define INLINE static inline __attribute__((always_inline))

/* exp(x): n = round(x log2 e), r = x - n ln 2 (Cody-Waite, two steps), e^r by its
 * degree-7 Taylor polynomial, 2^n built in the exponent bits. The kernels call it only
 * with x <= 0 (a logit minus its row max); x is clamped to [-87.33, 88] so that 2^n is a
 * normal number, and below -87.33 the result is flushed to 0 (the exact value is below
 * 2^-126 there: at most 1.2e-38 absolute error, nothing next to a softmax sum >= 1).
 * max(lo, x) returns x when x is NaN, so NaN stays NaN; -inf gives exactly 0.
 * Measured against float64 exp on [-87.33, 0]: see tests/test_kernels.c. */
INLINE __m256 exp_avx2(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33654f);
    const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(lo, x);
    x = _mm256_min_ps(_mm256_set1_ps(88.0f), x);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
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
    /* 2^n for n in [-126, 127]: (n + 127) << 23 read as float bits */
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

INLINE void qk_tile(int RV, int KC, int64_t dk, const float *qt, int64_t ldq, const float *k,
                    int64_t ldk, __m256 scale, float *s, int64_t lds) {
    __m256 acc[2][6];
    UNROLL for (int a = 0; a < RV; a++)
        UNROLL for (int c = 0; c < KC; c++) acc[a][c] = _mm256_setzero_ps();
    for (int64_t d = 0; d < dk; d++) {
        __m256 q[2];
        UNROLL for (int a = 0; a < RV; a++) q[a] = _mm256_loadu_ps(qt + d * ldq + 8 * a);
        UNROLL for (int c = 0; c < KC; c++) {
            const __m256 kb = _mm256_broadcast_ss(k + c * ldk + d);
            UNROLL for (int a = 0; a < RV; a++) acc[a][c] = _mm256_fmadd_ps(kb, q[a], acc[a][c]);
        }
    }
    UNROLL for (int c = 0; c < KC; c++)
        UNROLL for (int a = 0; a < RV; a++)
            _mm256_storeu_ps(s + c * lds + 8 * a, _mm256_mul_ps(acc[a][c], scale));
}

/* The dot-product form for at most 4 query rows (decoding), as in the AVX-512 kernels:
 * each key row streamed once along Dk against the rows in L1, 2 keys at a time (8
 * accumulators), the 8 (row, key) sums reduced together by one hadd tree: lane 4c + r of
 * the result is row r of key c. The 16-row tile would do 4x the FMAs on padding. */
INLINE void qk_dot2(int NR, int KC, int64_t dk, const float *q, const float *k, int64_t ldk,
                    float scale, float *s, int64_t lds) {
    __m256 acc[2][4];  // [key][row]
    UNROLL for (int c = 0; c < 2; c++)
        UNROLL for (int r = 0; r < 4; r++) acc[c][r] = _mm256_setzero_ps();
    const int64_t d8 = dk / 8 * 8;
    for (int64_t d = 0; d < d8; d += 8) {
        __m256 kv[2];
        UNROLL for (int c = 0; c < KC; c++) kv[c] = _mm256_loadu_ps(k + c * ldk + d);
        UNROLL for (int r = 0; r < NR; r++) {
            const __m256 qv = _mm256_loadu_ps(q + r * dk + d);
            UNROLL for (int c = 0; c < KC; c++) acc[c][r] = _mm256_fmadd_ps(qv, kv[c], acc[c][r]);
        }
    }
    if (d8 < dk) {  // the last dk % 8 columns: masked loads, zero past dk
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256i mk = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(dk - d8)), lane);
        __m256 kv[2];
        UNROLL for (int c = 0; c < KC; c++) kv[c] = _mm256_maskload_ps(k + c * ldk + d8, mk);
        UNROLL for (int r = 0; r < NR; r++) {
            const __m256 qv = _mm256_maskload_ps(q + r * dk + d8, mk);
            UNROLL for (int c = 0; c < KC; c++) acc[c][r] = _mm256_fmadd_ps(qv, kv[c], acc[c][r]);
        }
    }
    const __m256 h01 = _mm256_hadd_ps(acc[0][0], acc[0][1]), h23 = _mm256_hadd_ps(acc[0][2], acc[0][3]);
    const __m256 h45 = _mm256_hadd_ps(acc[1][0], acc[1][1]), h67 = _mm256_hadd_ps(acc[1][2], acc[1][3]);
    const __m256 a = _mm256_hadd_ps(h01, h23), b = _mm256_hadd_ps(h45, h67);
    const __m256 sum = _mm256_mul_ps(_mm256_set1_ps(scale),
                                     _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20),
                                                   _mm256_permute2f128_ps(a, b, 0x31)));
    _mm_storeu_ps(s, _mm256_castps256_ps128(sum));
    if (KC == 2) _mm_storeu_ps(s + lds, _mm256_extractf128_ps(sum, 1));
}

#define QK_DOT(NR)                                                                          \
    static void qk_dot_rows##NR(int64_t nk, int64_t dk, const float *q, const float *k,     \
                                int64_t ldk, float scale, float *s, int64_t lds) {         \
        int64_t c = 0;                                                                      \
        for (; c + 2 <= nk; c += 2) qk_dot2(NR, 2, dk, q, k + c * ldk, ldk, scale, s + c * lds, lds); \
        if (c < nk) qk_dot2(NR, 1, dk, q, k + c * ldk, ldk, scale, s + c * lds, lds);      \
    }
QK_DOT(1)
QK_DOT(2)
QK_DOT(3)
QK_DOT(4)

static void qk_avx2(int64_t n, int64_t npad, int64_t nk, int64_t dk, const float *q,
                    const float *qt, int64_t ldq, const float *k, int64_t ldk, float scale, float *s, int64_t lds) {
    if (n <= 4) {
        switch (n) {
        case 1: qk_dot_rows1(nk, dk, q, k, ldk, scale, s, lds); break;
        case 2: qk_dot_rows2(nk, dk, q, k, ldk, scale, s, lds); break;
        case 3: qk_dot_rows3(nk, dk, q, k, ldk, scale, s, lds); break;
        default: qk_dot_rows4(nk, dk, q, k, ldk, scale, s, lds); break;
        }
        for (int64_t c = 0; c < nk; c++)  // the padding rows: finite, unused
            for (int64_t r = n; r < npad; r++) s[c * lds + r] = 0.0f;
        return;
    }
    const __m256 vs = _mm256_set1_ps(scale);
    for (int64_t r = 0; r < npad; r += 16) {  // npad is a multiple of 16: two ymm
        int64_t c = 0;
        for (; c + 6 <= nk; c += 6)
            qk_tile(2, 6, dk, qt + r, ldq, k + c * ldk, ldk, vs, s + c * lds + r, lds);
        for (; c < nk; c++)
            qk_tile(2, 1, dk, qt + r, ldq, k + c * ldk, ldk, vs, s + c * lds + r, lds);
    }
}

static void softmax_avx2(int64_t npad, int64_t nk, float *s, int64_t lds, float *m, float *l,
                         float *alpha) {
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY), zero = _mm256_setzero_ps();
    for (int64_t r = 0; r < npad; r += 8) {
        const __m256 m_old = _mm256_loadu_ps(m + r);
        __m256 mx = m_old;
        __m256 nan = _mm256_cmp_ps(m_old, m_old, _CMP_UNORD_Q);
        for (int64_t c = 0; c < nk; c++) {
            const __m256 x = _mm256_loadu_ps(s + c * lds + r);
            mx = _mm256_max_ps(mx, x);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
        }
        mx = _mm256_blendv_ps(mx, _mm256_set1_ps(NAN), nan);  // a NaN logit poisons its row
        const __m256 shift = _mm256_blendv_ps(mx, zero, _mm256_cmp_ps(mx, neg_inf, _CMP_EQ_OQ));
        __m256 sum = zero;
        for (int64_t c = 0; c < nk; c++) {
            const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + c * lds + r), shift));
            _mm256_storeu_ps(s + c * lds + r, e);
            sum = _mm256_add_ps(sum, e);
        }
        const __m256 a = exp_avx2(_mm256_sub_ps(m_old, shift));
        _mm256_storeu_ps(alpha + r, a);
        _mm256_storeu_ps(l + r, _mm256_fmadd_ps(_mm256_loadu_ps(l + r), a, sum));
        _mm256_storeu_ps(m + r, mx);
    }
}

/* RR rows x DC ymm of value columns; the last ymm under the lane mask `tail`. */
INLINE void pv_tile(int RR, int DC, bool SKIP, int64_t nk, const float *p, int64_t lds,
                    const float *v, int64_t ldv, const float *alpha, float *acc, int64_t ldo,
                    __m256i tail) {
    __m256 t[4][2];
    UNROLL for (int i = 0; i < RR; i++)
        UNROLL for (int j = 0; j < DC; j++) t[i][j] = _mm256_setzero_ps();
    for (int64_t c = 0; c < nk; c++) {
        __m256 vv[2];
        UNROLL for (int j = 0; j < DC; j++)
            vv[j] = j == DC - 1 ? _mm256_maskload_ps(v + c * ldv + 8 * j, tail)
                                : _mm256_loadu_ps(v + c * ldv + 8 * j);
        UNROLL for (int i = 0; i < RR; i++) {
            const float p_ic = p[c * lds + i];
            if (SKIP && p_ic == 0.0f) continue;  // masked: V is not multiplied
            const __m256 pb = _mm256_set1_ps(p_ic);
            UNROLL for (int j = 0; j < DC; j++) t[i][j] = _mm256_fmadd_ps(pb, vv[j], t[i][j]);
        }
    }
    UNROLL for (int i = 0; i < RR; i++) {
        const __m256 a = _mm256_set1_ps(alpha[i]);
        UNROLL for (int j = 0; j < DC; j++) {
            float *o = acc + i * ldo + 8 * j;
            if (j == DC - 1)
                _mm256_maskstore_ps(o, tail, _mm256_fmadd_ps(_mm256_maskload_ps(o, tail), a, t[i][j]));
            else
                _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_loadu_ps(o), a, t[i][j]));
        }
    }
}

#define PV_COLS(DC)                                                                         \
    static void pv_cols##DC(int64_t n, int64_t nk, const float *p, int64_t lds,           \
                            const float *v, int64_t ldv, const float *alpha, float *acc,   \
                            int64_t ldo, __m256i tail, bool skip) {                        \
        int64_t r = 0;                                                                      \
        if (skip) {                                                                         \
            for (; r + 4 <= n; r += 4)                                                      \
                pv_tile(4, DC, true, nk, p + r, lds, v, ldv, alpha + r, acc + r * ldo, ldo, tail); \
            for (; r < n; r++)                                                              \
                pv_tile(1, DC, true, nk, p + r, lds, v, ldv, alpha + r, acc + r * ldo, ldo, tail); \
        } else {                                                                            \
            for (; r + 4 <= n; r += 4)                                                      \
                pv_tile(4, DC, false, nk, p + r, lds, v, ldv, alpha + r, acc + r * ldo, ldo, tail); \
            for (; r < n; r++)                                                              \
                pv_tile(1, DC, false, nk, p + r, lds, v, ldv, alpha + r, acc + r * ldo, ldo, tail); \
        }                                                                                   \
    }
PV_COLS(1)
PV_COLS(2)

static void pv_avx2(int64_t n, int64_t npad, int64_t nk, int64_t dv, const float *p,
                    int64_t lds, const float *v, int64_t ldv, const float *alpha, float *acc,
                    int64_t ldo, bool skip_zeros) {
    (void)npad;
    for (int64_t d0 = 0; d0 < dv; d0 += 16) {
        const int64_t nd = dv - d0 < 16 ? dv - d0 : 16;
        const int dc = nd > 8 ? 2 : 1;
        const int rem = (int)(nd - 8 * (dc - 1));
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32(rem), lane);
        if (dc == 2)
            pv_cols2(n, nk, p, lds, v + d0, ldv, alpha, acc + d0, ldo, tail, skip_zeros);
        else
            pv_cols1(n, nk, p, lds, v + d0, ldv, alpha, acc + d0, ldo, tail, skip_zeros);
    }
}

static void exp_array_avx2(int64_t n, const float *x, float *y) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp_avx2(_mm256_loadu_ps(x + i)));
    if (i < n) {
        float in[8] = {0}, out[8];
        for (int64_t j = i; j < n; j++) in[j - i] = x[j];
        _mm256_storeu_ps(out, exp_avx2(_mm256_loadu_ps(in)));
        for (int64_t j = i; j < n; j++) y[j] = out[j - i];
    }
}

/* 16-bit rows to float32: F16C's vcvtph2ps (exact), bfloat16 by a 16-bit shift. */
static void to_f32_avx2(attn_dtype dt, int64_t n, const uint16_t *src, float *dst) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm_loadu_si128((const __m128i *)(src + i));
        const __m256 f = dt == ATTN_BF16
                             ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                             : _mm256_cvtph_ps(h);
        _mm256_storeu_ps(dst + i, f);
    }
    for (; i < n; i++)
        dst[i] = dt == ATTN_BF16 ? attn_bf16_to_f32(src[i]) : attn_f16_to_f32(src[i]);
}

const attn_kernels attn_kernels_avx2 = {
    .name = "avx2",
    .qk = qk_avx2,
    .softmax = softmax_avx2,
    .pv = pv_avx2,
    .mask_bool = attn_mask_bool_generic,
    .to_f32 = to_f32_avx2,
    .exp = exp_array_avx2,
};
#endif
