/*
 * kernels_avx512.c — the AVX-512F micro-kernels (contracts in kernels.h; design notes
 *                    and the exp error bound in docs/KERNELS.md).
 *
 * Only this file is compiled with AVX-512 flags; dispatch.c calls it only on a CPU that
 * has AVX-512F/DQ/BW/VL and FMA. One zmm holds 16 query rows of S^T, so the softmax's
 * row max and row sum are element-wise across keys. The register tiles:
 *   qk: up to 4 zmm of rows x KC keys (24 accumulators at 64 rows), K broadcast from
 *       its natural layout, Q^T loaded as vectors;
 *   pv: 4 rows x 4 zmm of value columns (16 accumulators), P broadcast, V loaded;
 *       the last column chunk is masked, so any Dv works.
 */
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include <math.h>

#include "kernels.h"

#define UNROLL _Pragma("GCC unroll 16")
#define INLINE static inline __attribute__((always_inline))

/* exp(x) for a vector: n = round(x log2 e), r = x - n ln 2 in two steps (Cody-Waite),
 * e^r by its degree-7 Taylor polynomial on |r| <= ln2/2 (truncation < 1.2e-8 relative),
 * then scalef by 2^n, which rounds correctly into subnormals and 0 and saturates to inf.
 * x is clamped below at -104, where exp is already 0 in float32; max(-104, x) returns x
 * when x is NaN, so NaN stays NaN and -inf gives exactly 0. Measured against float64 exp
 * over [-104, 88]: at most 2 ulp (tests/test_kernels.c). */
INLINE __m512 exp_avx512(__m512 x) {
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

/* S^T for RV zmm of rows (16 RV rows) and KC keys starting at key c0. */
INLINE void qk_tile(int RV, int KC, int64_t dk, const float *qt, int64_t ldq, const float *k,
                    int64_t ldk, __m512 scale, float *s, int64_t lds) {
    __m512 acc[4][12];
    UNROLL for (int a = 0; a < RV; a++)
        UNROLL for (int c = 0; c < KC; c++) acc[a][c] = _mm512_setzero_ps();
    for (int64_t d = 0; d < dk; d++) {
        __m512 q[4];
        UNROLL for (int a = 0; a < RV; a++) q[a] = _mm512_loadu_ps(qt + d * ldq + 16 * a);
        UNROLL for (int c = 0; c < KC; c++) {
            const __m512 kb = _mm512_set1_ps(k[c * ldk + d]);
            UNROLL for (int a = 0; a < RV; a++) acc[a][c] = _mm512_fmadd_ps(kb, q[a], acc[a][c]);
        }
    }
    UNROLL for (int c = 0; c < KC; c++)
        UNROLL for (int a = 0; a < RV; a++)
            _mm512_storeu_ps(s + c * lds + 16 * a, _mm512_mul_ps(acc[a][c], scale));
}

/* keys in groups of KC (more keys when there are fewer row vectors, to keep enough
 * independent accumulators in flight), the remainder one key at a time */
#define QK_ROWS(RV, KC)                                                                  \
    static void qk_rows##RV(int64_t nk, int64_t dk, const float *qt, int64_t ldq,       \
                            const float *k, int64_t ldk, __m512 scale, float *s,        \
                            int64_t lds) {                                              \
        int64_t c = 0;                                                                   \
        for (; c + KC <= nk; c += KC)                                                    \
            qk_tile(RV, KC, dk, qt, ldq, k + c * ldk, ldk, scale, s + c * lds, lds);     \
        for (; c < nk; c++)                                                              \
            qk_tile(RV, 1, dk, qt, ldq, k + c * ldk, ldk, scale, s + c * lds, lds);      \
    }
QK_ROWS(1, 12)
QK_ROWS(2, 8)
QK_ROWS(3, 6)
QK_ROWS(4, 6)

/* The dot-product form for a few query rows (decoding): each key row is streamed once
 * along Dk, in its natural layout, against NR query rows held in L1; KC keys at a time,
 * each (row, key) sum reduced across its lanes at the end. Cheaper than padding the rows
 * to a vector of 16 when there are at most 4 of them, and kinder to the prefetchers. */
INLINE void qk_dot_tile(int NR, int KC, int64_t dk, const float *q, const float *k, int64_t ldk,
                        float scale, float *s, int64_t lds) {
    __m512 acc[4][4];
    UNROLL for (int r = 0; r < NR; r++)
        UNROLL for (int c = 0; c < KC; c++) acc[r][c] = _mm512_setzero_ps();
    for (int64_t d = 0; d < dk; d += 16) {
        const __mmask16 mk = dk - d >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (dk - d)) - 1);
        __m512 kv[4];
        UNROLL for (int c = 0; c < KC; c++) kv[c] = _mm512_maskz_loadu_ps(mk, k + c * ldk + d);
        UNROLL for (int r = 0; r < NR; r++) {
            const __m512 qv = _mm512_maskz_loadu_ps(mk, q + r * dk + d);
            UNROLL for (int c = 0; c < KC; c++) acc[r][c] = _mm512_fmadd_ps(qv, kv[c], acc[r][c]);
        }
    }
    if (NR == 4 && KC == 4) {
        /* the 16 lane sums at once, by a transposing tree (45 operations rather than 16
         * reductions of 8): with A_(4r+c) = acc[r][c], pairs of vectors are folded by
         * 256-bit halves, then 128-bit lanes, then within lanes; 128-bit lane c of the
         * result holds rows 0..3 of key c, the layout of S^T */
        __m512 t[8], u[4];
        UNROLL for (int j = 0; j < 8; j++) {
            const __m512 a = acc[(2 * j) / 4][(2 * j) % 4], b = acc[(2 * j + 1) / 4][(2 * j + 1) % 4];
            t[j] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
        }
        UNROLL for (int j = 0; j < 4; j++)
            u[j] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * j], t[2 * j + 1], 0x88),
                                 _mm512_shuffle_f32x4(t[2 * j], t[2 * j + 1], 0xDD));
        const __m512 v0 = _mm512_add_ps(_mm512_unpacklo_ps(u[0], u[1]), _mm512_unpackhi_ps(u[0], u[1]));
        const __m512 v1 = _mm512_add_ps(_mm512_unpacklo_ps(u[2], u[3]), _mm512_unpackhi_ps(u[2], u[3]));
        const __m512 w = _mm512_mul_ps(_mm512_set1_ps(scale),
                                       _mm512_add_ps(_mm512_shuffle_ps(v0, v1, 0x44),
                                                     _mm512_shuffle_ps(v0, v1, 0xEE)));
        _mm_storeu_ps(s, _mm512_castps512_ps128(w));
        _mm_storeu_ps(s + lds, _mm512_extractf32x4_ps(w, 1));
        _mm_storeu_ps(s + 2 * lds, _mm512_extractf32x4_ps(w, 2));
        _mm_storeu_ps(s + 3 * lds, _mm512_extractf32x4_ps(w, 3));
        return;
    }
    UNROLL for (int c = 0; c < KC; c++)
        UNROLL for (int r = 0; r < NR; r++) s[c * lds + r] = scale * _mm512_reduce_add_ps(acc[r][c]);
}

#define QK_DOT(NR)                                                                          \
    static void qk_dot##NR(int64_t nk, int64_t dk, const float *q, const float *k,          \
                           int64_t ldk, float scale, float *s, int64_t lds) {              \
        int64_t c = 0;                                                                      \
        for (; c + 4 <= nk; c += 4) qk_dot_tile(NR, 4, dk, q, k + c * ldk, ldk, scale, s + c * lds, lds); \
        for (; c < nk; c++) qk_dot_tile(NR, 1, dk, q, k + c * ldk, ldk, scale, s + c * lds, lds); \
    }
QK_DOT(1)
QK_DOT(2)
QK_DOT(3)
QK_DOT(4)

void attn_qk_avx512(int64_t n, int64_t npad, int64_t nk, int64_t dk, const float *q,
                      const float *qt, int64_t ldq, const float *k, int64_t ldk, float scale,
                      float *s, int64_t lds) {
    if (n <= 4) {
        switch (n) {
        case 1: qk_dot1(nk, dk, q, k, ldk, scale, s, lds); break;
        case 2: qk_dot2(nk, dk, q, k, ldk, scale, s, lds); break;
        case 3: qk_dot3(nk, dk, q, k, ldk, scale, s, lds); break;
        default: qk_dot4(nk, dk, q, k, ldk, scale, s, lds); break;
        }
        for (int64_t c = 0; c < nk; c++)  // the padding rows: finite, unused
            for (int64_t r = n; r < npad; r++) s[c * lds + r] = 0.0f;
        return;
    }
    const __m512 vs = _mm512_set1_ps(scale);
    int64_t a = 0;
    for (; a + 4 <= npad / 16; a += 4) qk_rows4(nk, dk, qt + 16 * a, ldq, k, ldk, vs, s + 16 * a, lds);
    switch (npad / 16 - a) {
    case 3: qk_rows3(nk, dk, qt + 16 * a, ldq, k, ldk, vs, s + 16 * a, lds); break;
    case 2: qk_rows2(nk, dk, qt + 16 * a, ldq, k, ldk, vs, s + 16 * a, lds); break;
    case 1: qk_rows1(nk, dk, qt + 16 * a, ldq, k, ldk, vs, s + 16 * a, lds); break;
    default: break;
    }
}

void attn_softmax_avx512(int64_t npad, int64_t nk, float *s, int64_t lds, float *m, float *l,
                           float *alpha) {
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY), zero = _mm512_setzero_ps();
    for (int64_t r = 0; r < npad; r += 16) {
        const __m512 m_old = _mm512_loadu_ps(m + r);
        __m512 mx = m_old;
        __mmask16 nan = _mm512_cmp_ps_mask(m_old, m_old, _CMP_UNORD_Q);
        for (int64_t c = 0; c < nk; c++) {
            const __m512 x = _mm512_loadu_ps(s + c * lds + r);
            mx = _mm512_max_ps(mx, x);
            nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
        }
        /* a NaN logit poisons its row (max_ps alone would drop it) */
        mx = _mm512_mask_mov_ps(mx, nan, _mm512_set1_ps(NAN));
        /* rows with every key masked so far: shift by 0, so exp(-inf - 0) = 0 rather
         * than exp(-inf - -inf) = NaN */
        const __m512 shift = _mm512_mask_mov_ps(mx, _mm512_cmp_ps_mask(mx, neg_inf, _CMP_EQ_OQ), zero);
        __m512 sum = zero;
        for (int64_t c = 0; c < nk; c++) {
            const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(s + c * lds + r), shift));
            _mm512_storeu_ps(s + c * lds + r, e);
            sum = _mm512_add_ps(sum, e);
        }
        const __m512 a = exp_avx512(_mm512_sub_ps(m_old, shift));
        _mm512_storeu_ps(alpha + r, a);
        _mm512_storeu_ps(l + r, _mm512_fmadd_ps(_mm512_loadu_ps(l + r), a, sum));
        _mm512_storeu_ps(m + r, mx);
    }
}

/* RR rows x DC zmm of value columns starting at column d0; the last zmm loads and
 * stores under `tail`. SKIP: a p of exactly 0 leaves the accumulator untouched. */
INLINE void pv_tile(int RR, int DC, bool SKIP, int64_t nk, const float *p, int64_t lds,
                    const float *v, int64_t ldv, const float *alpha, float *acc, int64_t ldo,
                    __mmask16 tail) {
    __m512 t[4][4];
    UNROLL for (int i = 0; i < RR; i++)
        UNROLL for (int j = 0; j < DC; j++) t[i][j] = _mm512_setzero_ps();
    for (int64_t c = 0; c < nk; c++) {
        __m512 vv[4];
        UNROLL for (int j = 0; j < DC; j++)
            vv[j] = j == DC - 1 ? _mm512_maskz_loadu_ps(tail, v + c * ldv + 16 * j)
                                : _mm512_loadu_ps(v + c * ldv + 16 * j);
        UNROLL for (int i = 0; i < RR; i++) {
            const __m512 pb = _mm512_set1_ps(p[c * lds + i]);
            if (SKIP) {
                const __mmask16 live = _mm512_cmp_ps_mask(pb, _mm512_setzero_ps(), _CMP_NEQ_UQ);
                UNROLL for (int j = 0; j < DC; j++)
                    t[i][j] = _mm512_mask3_fmadd_ps(pb, vv[j], t[i][j], live);
            } else {
                UNROLL for (int j = 0; j < DC; j++) t[i][j] = _mm512_fmadd_ps(pb, vv[j], t[i][j]);
            }
        }
    }
    UNROLL for (int i = 0; i < RR; i++) {
        const __m512 a = _mm512_set1_ps(alpha[i]);
        UNROLL for (int j = 0; j < DC; j++) {
            float *o = acc + i * ldo + 16 * j;
            const __mmask16 mk = j == DC - 1 ? tail : (__mmask16)0xFFFF;
            _mm512_mask_storeu_ps(o, mk, _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, o), a, t[i][j]));
        }
    }
}

/* all rows for one chunk of at most 64 value columns */
#define PV_COLS(DC)                                                                         \
    static void pv_cols##DC(int64_t n, int64_t nk, const float *p, int64_t lds,           \
                            const float *v, int64_t ldv, const float *alpha, float *acc,   \
                            int64_t ldo, __mmask16 tail, bool skip) {                      \
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
PV_COLS(3)
PV_COLS(4)

void attn_pv_avx512(int64_t n, int64_t npad, int64_t nk, int64_t dv, const float *p,
                      int64_t lds, const float *v, int64_t ldv, const float *alpha,
                      float *acc, int64_t ldo, bool skip_zeros) {
    (void)npad;
    for (int64_t d0 = 0; d0 < dv; d0 += 64) {
        const int64_t nd = dv - d0 < 64 ? dv - d0 : 64;
        const int dc = (int)((nd + 15) / 16);
        const int rem = (int)(nd - 16 * (dc - 1));
        const __mmask16 tail = (__mmask16)(rem == 16 ? 0xFFFF : (1u << rem) - 1);
        switch (dc) {
        case 4: pv_cols4(n, nk, p, lds, v + d0, ldv, alpha, acc + d0, ldo, tail, skip_zeros); break;
        case 3: pv_cols3(n, nk, p, lds, v + d0, ldv, alpha, acc + d0, ldo, tail, skip_zeros); break;
        case 2: pv_cols2(n, nk, p, lds, v + d0, ldv, alpha, acc + d0, ldo, tail, skip_zeros); break;
        default: pv_cols1(n, nk, p, lds, v + d0, ldv, alpha, acc + d0, ldo, tail, skip_zeros); break;
        }
    }
}

void attn_exp_array_avx512(int64_t n, const float *x, float *y) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 mk = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, mk, exp_avx512(_mm512_maskz_loadu_ps(mk, x + i)));
    }
}

/* The bool mask over 16 rows at a time: one gather brings 4 mask bytes (keys c..c+3) of
 * each of the 16 rows (two 8-lane gathers: row offsets are 64-bit), then each key's byte
 * becomes a lane mask that sets the masked logits to -inf. Keys left over (nk not a
 * multiple of 4) and rows past a multiple of 16 take the portable loop. */
void attn_mask_bool_avx512(int64_t n, int64_t nk, const uint8_t *m, int64_t ldm, float *s,
                           int64_t lds) {
    const int64_t n16 = n / 16 * 16, nk4 = nk / 4 * 4;
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
    for (int64_t r = 0; r < n16; r += 16) {
        const __m512i lanes = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
        const __m512i off_lo = _mm512_mullo_epi64(_mm512_add_epi64(lanes, _mm512_set1_epi64(r)),
                                                  _mm512_set1_epi64(ldm));
        const __m512i off_hi = _mm512_add_epi64(off_lo, _mm512_set1_epi64(8 * ldm));
        for (int64_t c = 0; c < nk4; c += 4) {
            const __m256i lo = _mm512_i64gather_epi32(off_lo, m + c, 1);
            const __m256i hi = _mm512_i64gather_epi32(off_hi, m + c, 1);
            const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            UNROLL for (int t = 0; t < 4; t++) {
                const __mmask16 masked = _mm512_testn_epi32_mask(w, _mm512_set1_epi32((int)(0xffu << (8 * t))));
                float *x = s + (c + t) * lds + r;
                _mm512_mask_storeu_ps(x, masked, neg_inf);
            }
        }
        if (nk4 < nk) attn_mask_bool_generic(16, nk - nk4, m + r * ldm + nk4, ldm, s + nk4 * lds + r, lds);
    }
    if (n16 < n) attn_mask_bool_generic(n - n16, nk, m + n16 * ldm, ldm, s + n16, lds);
}

/* 16-bit rows to float32: F16C's vcvtph2ps (exact), bfloat16 by a 16-bit shift. */
void attn_to_f32_avx512(attn_dtype dt, int64_t n, const uint16_t *src, float *dst) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 mk = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m256i h = _mm256_maskz_loadu_epi16(mk, src + i);
        const __m512 f = dt == ATTN_BF16
                             ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
                             : _mm512_cvtph_ps(h);
        _mm512_mask_storeu_ps(dst + i, mk, f);
    }
}

const attn_kernels attn_kernels_avx512 = {
    .name = "avx512",
    .qk = attn_qk_avx512,
    .softmax = attn_softmax_avx512,
    .pv = attn_pv_avx512,
    .mask_bool = attn_mask_bool_avx512,
    .to_f32 = attn_to_f32_avx512,
    .exp = attn_exp_array_avx512,
};
#endif
