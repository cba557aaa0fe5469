/*
 * avx512bf16/kernels.c — the AVX-512 kernels plus the bfloat16 dot-product entries
 *                        (contracts in kernels.h; notes in docs/KERNELS.md).
 *
 * vdpbf16ps multiplies pairs of bfloat16 values, exactly in float32, and adds both
 * products to a float32 accumulator: twice the multiply-adds of a float32 FMA per
 * instruction. qk_bf16 uses it on Q·Kᵀ (bfloat16 inputs, so nothing is rounded that
 * was not already); pv_bf16 on bf16(P)·V for the FAST precision. The float32 entries are
 * the avx512 kernels'. Compiled with -mavx512bf16; dispatch.c picks this table only on
 * a CPU that has AVX512-BF16.
 */
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/avx512/softmax.h"
#include "kernels/additive_kernels.h"
#include "kernels/kernels.h"
#include "kernels/avx2/gemv.h"
#include "core/philox.h"

#define UNROLL _Pragma("GCC unroll 16")
#define INLINE ATTN_KERNEL_INLINE

static inline uint32_t load_u32(const uint16_t *p) {  // two bf16, unaligned
    uint32_t x;
    memcpy(&x, p, sizeof x);
    return x;
}

/* RV zmm of rows (16 RV rows) x KC keys, over dk/2 pairs (+ one half pair if dk is odd) */
INLINE void qk_bf16_tile(int RV, int KC, int64_t dk, const uint32_t *qp, int64_t ldq,
                         const uint16_t *k, int64_t ldk, __m512 scale, float *s, int64_t lds) {
    __m512 acc[4][6];
    UNROLL for (int a = 0; a < RV; a++)
        UNROLL for (int c = 0; c < KC; c++) acc[a][c] = _mm512_setzero_ps();
    const int64_t pairs = dk / 2;
    for (int64_t t = 0; t <= pairs; t++) {
        if (t == pairs && (dk & 1) == 0) break;
        __m512bh q[4];
        UNROLL for (int a = 0; a < RV; a++)
            q[a] = (__m512bh)_mm512_loadu_si512(qp + t * ldq + 16 * a);
        UNROLL for (int c = 0; c < KC; c++) {
            /* the key pair (2t, 2t+1); past dk only the low half, never a read past the row */
            const uint32_t kk = t < pairs ? load_u32(k + c * ldk + 2 * t) : k[c * ldk + 2 * t];
            const __m512bh kb = (__m512bh)_mm512_set1_epi32((int)kk);
            UNROLL for (int a = 0; a < RV; a++) acc[a][c] = _mm512_dpbf16_ps(acc[a][c], q[a], kb);
        }
    }
    UNROLL for (int c = 0; c < KC; c++)
        UNROLL for (int a = 0; a < RV; a++)
            _mm512_storeu_ps(s + c * lds + 16 * a, _mm512_mul_ps(acc[a][c], scale));
}

#define QK_ROWS(RV, KC)                                                                      \
    static void qk_bf16_rows##RV(int64_t nk, int64_t dk, const uint32_t *qp, int64_t ldq,   \
                                 const uint16_t *k, int64_t ldk, __m512 scale, float *s,    \
                                 int64_t lds) {                                             \
        int64_t c = 0;                                                                       \
        for (; c + KC <= nk; c += KC)                                                        \
            qk_bf16_tile(RV, KC, dk, qp, ldq, k + c * ldk, ldk, scale, s + c * lds, lds);    \
        for (; c < nk; c++)                                                                  \
            qk_bf16_tile(RV, 1, dk, qp, ldq, k + c * ldk, ldk, scale, s + c * lds, lds);     \
    }
QK_ROWS(1, 6)
QK_ROWS(2, 6)
QK_ROWS(3, 6)
QK_ROWS(4, 6)

static void qk_bf16_avx512(int64_t npad, int64_t nk, int64_t dk, const uint32_t *qp,
                           int64_t ldq, const uint16_t *k, int64_t ldk, float scale, float *s,
                           int64_t lds) {
    const __m512 vs = _mm512_set1_ps(scale);
    int64_t a = 0;
    for (; a + 4 <= npad / 16; a += 4)
        qk_bf16_rows4(nk, dk, qp + 16 * a, ldq, k, ldk, vs, s + 16 * a, lds);
    switch (npad / 16 - a) {
    case 3: qk_bf16_rows3(nk, dk, qp + 16 * a, ldq, k, ldk, vs, s + 16 * a, lds); break;
    case 2: qk_bf16_rows2(nk, dk, qp + 16 * a, ldq, k, ldk, vs, s + 16 * a, lds); break;
    case 1: qk_bf16_rows1(nk, dk, qp + 16 * a, ldq, k, ldk, vs, s + 16 * a, lds); break;
    default: break;
    }
}

/* (x, y) as bfloat16 pairs in 32-bit lanes: x in the low half. Round to nearest even.
 * vcvtne2ps2bf16 gives x in elements 0..15 and y in 16..31; one vpermw interleaves them. */
static inline __m512i pair_bf16(__m512 x, __m512 y) {
    const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(y, x);
    const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                                23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(interleave, both);
}

/* RR rows x DC zmm of value columns over key pairs: t[i][j] += p-pair(row i) . v-pair */
INLINE void pv_bf16_tile(int RR, int DC, int64_t npairs, const uint32_t *pp, int64_t ldp,
                         const uint32_t *vp, int64_t ldv, const float *alpha, float *acc,
                         int64_t ldo, __mmask16 tail) {
    __m512 t[4][4];
    UNROLL for (int i = 0; i < RR; i++)
        UNROLL for (int j = 0; j < DC; j++) t[i][j] = _mm512_setzero_ps();
    for (int64_t c = 0; c < npairs; c++) {
        __m512bh vv[4];
        UNROLL for (int j = 0; j < DC; j++)
            vv[j] = (__m512bh)_mm512_loadu_si512(vp + c * ldv + 16 * j);
        UNROLL for (int i = 0; i < RR; i++) {
            const __m512bh pb = (__m512bh)_mm512_set1_epi32((int)pp[c * ldp + i]);
            UNROLL for (int j = 0; j < DC; j++) t[i][j] = _mm512_dpbf16_ps(t[i][j], pb, vv[j]);
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

#define PV_COLS(DC)                                                                          \
    static void pv_bf16_cols##DC(int64_t n, int64_t npairs, const uint32_t *pp, int64_t ldp, \
                                 const uint32_t *vp, int64_t ldv, const float *alpha,       \
                                 float *acc, int64_t ldo, __mmask16 tail) {                 \
        int64_t r = 0;                                                                       \
        for (; r + 4 <= n; r += 4)                                                           \
            pv_bf16_tile(4, DC, npairs, pp + r, ldp, vp, ldv, alpha + r, acc + r * ldo, ldo, tail); \
        for (; r < n; r++)                                                                   \
            pv_bf16_tile(1, DC, npairs, pp + r, ldp, vp, ldv, alpha + r, acc + r * ldo, ldo, tail); \
    }
PV_COLS(1)
PV_COLS(2)
PV_COLS(3)
PV_COLS(4)

static void pv_bf16_avx512(int64_t n, int64_t npad, int64_t nk, int64_t dv, const float *p,
                           int64_t lds, const uint16_t *v, int64_t ldv, const float *alpha,
                           float *acc, int64_t ldo, uint32_t *pairs) {
    const int64_t npairs = (nk + 1) / 2, ldp = npad, ldvp = (dv + 15) / 16 * 16;
    uint32_t *pp = pairs, *vp = pairs + npairs * ldp;
    /* P pairs along the keys, rounded to bfloat16: pp[c][r] = (p[2c][r], p[2c+1][r]);
     * p = NULL: softmax_pairs left them there already */
    for (int64_t c = 0; c < npairs && p; c++)
        for (int64_t r = 0; r < npad; r += 16) {
            const __m512 x = _mm512_loadu_ps(p + 2 * c * lds + r);
            const __m512 y = 2 * c + 1 < nk ? _mm512_loadu_ps(p + (2 * c + 1) * lds + r)
                                            : _mm512_setzero_ps();
            _mm512_storeu_si512(pp + c * ldp + r, pair_bf16(x, y));
        }
    /* V pairs: vp[c][d] = (v[2c][d], v[2c+1][d]); an odd last key pairs with 0. 32 columns
     * of two rows make 32 pairs with two vpermt2w, the rest 16 columns at a time. */
    const __m512i pair_lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                             39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i pair_hi = _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24,
                                             55, 23, 54, 22, 53, 21, 52, 20, 51, 19, 50, 18, 49, 17, 48, 16);
    const int64_t d32 = dv / 32 * 32;
    for (int64_t c = 0; c < npairs; c++) {
        if (2 * c + 1 < nk)
            for (int64_t d = 0; d < d32; d += 32) {
                const __m512i x = _mm512_loadu_si512(v + 2 * c * ldv + d);
                const __m512i y = _mm512_loadu_si512(v + (2 * c + 1) * ldv + d);
                _mm512_storeu_si512(vp + c * ldvp + d, _mm512_permutex2var_epi16(x, pair_lo, y));
                _mm512_storeu_si512(vp + c * ldvp + d + 16, _mm512_permutex2var_epi16(x, pair_hi, y));
            }
        for (int64_t d = 2 * c + 1 < nk ? d32 : 0; d < dv; d += 16) {
            const __mmask16 mk = dv - d >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (dv - d)) - 1);
            const __m512i x = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, v + 2 * c * ldv + d));
            const __m512i y = 2 * c + 1 < nk
                                  ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, v + (2 * c + 1) * ldv + d))
                                  : _mm512_setzero_si512();
            _mm512_storeu_si512(vp + c * ldvp + d, _mm512_or_si512(x, _mm512_slli_epi32(y, 16)));
        }
    }
    for (int64_t d0 = 0; d0 < dv; d0 += 64) {
        const int64_t nd = dv - d0 < 64 ? dv - d0 : 64;
        const int dc = (int)((nd + 15) / 16), rem = (int)(nd - 16 * (dc - 1));
        const __mmask16 tail = (__mmask16)(rem == 16 ? 0xFFFF : (1u << rem) - 1);
        switch (dc) {
        case 4: pv_bf16_cols4(n, npairs, pp, ldp, vp + d0, ldvp, alpha, acc + d0, ldo, tail); break;
        case 3: pv_bf16_cols3(n, npairs, pp, ldp, vp + d0, ldvp, alpha, acc + d0, ldo, tail); break;
        case 2: pv_bf16_cols2(n, npairs, pp, ldp, vp + d0, ldvp, alpha, acc + d0, ldo, tail); break;
        default: pv_bf16_cols1(n, npairs, pp, ldp, vp + d0, ldvp, alpha, acc + d0, ldo, tail); break;
        }
    }
}

/* ai_softmax_avx512 with its p written as bfloat16 key pairs (kernels.h): the same
 * exps summed in the same order, so m, l, alpha and the rounded pairs are bit for bit
 * those of softmax followed by pv_bf16's own packing. */
static void softmax_pairs_avx512(int64_t npad, int64_t nk, const float *s, int64_t lds,
                                 float *m, float *l, float *alpha, uint32_t *pp, int64_t ldp) {
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t r = 0; r < npad; r += 16) {
        const __m512 m_old = _mm512_loadu_ps(m + r);
        __m512 shift;
        const __m512 mx = softmax_max_avx512(s + r, lds, nk, m_old, &shift);
        __m512 sum = zero;
        for (int64_t c = 0; c < nk; c += 2) {
            const __m512 e0 = exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(s + c * lds + r), shift));
            sum = _mm512_add_ps(sum, e0);
            __m512 e1 = zero;
            if (c + 1 < nk) {
                e1 = exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(s + (c + 1) * lds + r), shift));
                sum = _mm512_add_ps(sum, e1);
            }
            _mm512_storeu_si512(pp + (c / 2) * ldp + r, pair_bf16(e0, e1));
        }
        softmax_store_avx512(m_old, shift, mx, sum, m + r, l + r, alpha + r);
    }
}

/* dropout's Philox words (kernels.h): philox.h's simd loop at this ISA's width */
static void dropout_avx512bf16(int64_t n, const uint64_t *grp, uint64_t seed, uint64_t offset,
                          uint32_t *u, int64_t ldu) {
    attn_dropout_words(n, grp, seed, offset, u, ldu);
}

const attn_kernels attn_kernels_avx512bf16 = {
    .name = "avx512bf16",
    .geom = ATTN_GEOM(avx512bf16),
    .qk = ai_qk_avx512,
    .qk_q_rows = ATTN_DECODE_MAX_ROWS,  // the dot-product form on q
    .softmax = ai_softmax_avx512,
    .pv = ai_pv_avx512,
    .qk_bf16 = qk_bf16_avx512,
    .pv_bf16 = pv_bf16_avx512,
    .softmax_pairs = softmax_pairs_avx512,
    .mask_bool = ai_mask_bool_avx512,
    .to_f32 = ai_to_f32_avx512,
    .decode = ai_decode_avx512,
    .decode_qk = ai_decode_qk_avx512,
    .decode_q8_0 = true,  // avx512/kernels.c's step, which reads every cache dtype
    .decode_fp8 = true,
    .decode_q4_0 = true,
    .decode_rows = ai_decode_rows_avx512,
    .exp = ai_exp_array_avx512,
    .additive = &attn_additive_kernels_avx512,
    .dropout = dropout_avx512bf16,
    .gemm = ai_gemm_avx512,
    .gemv_rows_bf16 = ai_gemv_rows_bf16_avx2,  // avx2/gemv.c
    .gemv_dots_bf16 = ai_gemv_dots_bf16_avx2,
    .rows_from_st = ai_rows_from_st_avx2,  // avx2/convert.c
};
#endif
