/*
 * avx512/gemm.c — the AVX-512F plain matrix product of the kernel table (kernels.h:
 *                 gemm), the backward's dV += Pᵀ dO, dK += dSᵀ Q and dQ += dS K; the
 *                 avx512bf16 table shares it.
 *
 * The AVX2 kernel's design (avx2/gemm.c) at twice the width: 8 rows of C x 2 zmm (32
 * columns), 16 accumulators, B copied one 32-column panel at a time into a contiguous
 * buffer that also tells whether it holds a NaN or an Inf; the last panel of an n that
 * is not a multiple of 32 is zero-padded and stored under lane masks. Compiled only with
 * this folder's AVX-512 flags; dispatch calls it only where the CPU has them.
 */
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "kernels/kernels.h"

#define UNROLL _Pragma("GCC unroll 16")
#define INLINE ATTN_KERNEL_INLINE

/* MR rows x 32 columns of C += op(A) B from the panel bp (k rows of 32 floats, zero past
 * the real columns); op(A)(i, kk) = a[kk * lda + i] (TRANS) or a[i * lda + kk]. The lanes
 * of m0, m1 are C's real columns of the two vectors: no other column is read or written. */
INLINE void gemm_tile(int MR, bool TRANS, bool SKIP, int64_t k, const float *a, int64_t lda,
                      const float *bp, float *c, int64_t ldc, __mmask16 m0, __mmask16 m1) {
    __m512 t[8][2];
    UNROLL for (int i = 0; i < MR; i++) t[i][0] = t[i][1] = _mm512_setzero_ps();
    for (int64_t kk = 0; kk < k; kk++) {
        const __m512 b0 = _mm512_load_ps(bp + 32 * kk), b1 = _mm512_load_ps(bp + 32 * kk + 16);
        UNROLL for (int i = 0; i < MR; i++) {
            const __m512 ab = _mm512_set1_ps(TRANS ? a[kk * lda + i] : a[i * lda + kk]);
            if (SKIP) {  // a zero of op(A) leaves the sums as they are
                const __mmask16 live = _mm512_cmp_ps_mask(ab, _mm512_setzero_ps(), _CMP_NEQ_UQ);
                t[i][0] = _mm512_mask3_fmadd_ps(ab, b0, t[i][0], live);
                t[i][1] = _mm512_mask3_fmadd_ps(ab, b1, t[i][1], live);
            } else {
                t[i][0] = _mm512_fmadd_ps(ab, b0, t[i][0]);
                t[i][1] = _mm512_fmadd_ps(ab, b1, t[i][1]);
            }
        }
    }
    UNROLL for (int i = 0; i < MR; i++) {
        float *o = c + i * ldc;
        _mm512_mask_storeu_ps(o, m0, _mm512_add_ps(_mm512_maskz_loadu_ps(m0, o), t[i][0]));
        _mm512_mask_storeu_ps(o + 16, m1, _mm512_add_ps(_mm512_maskz_loadu_ps(m1, o + 16), t[i][1]));
    }
}

/* every row of C for one panel: 8 rows a tile, the m % 8 left in one narrower tile */
#define GEMM_ROWS(NAME, TRANS, SKIP)                                                          \
    static void NAME(int64_t m, int64_t k, const float *a, int64_t lda, const float *bp,      \
                     float *c, int64_t ldc, __mmask16 m0, __mmask16 m1) {                     \
        int64_t i = 0;                                                                        \
        for (; i + 8 <= m; i += 8)                                                            \
            gemm_tile(8, TRANS, SKIP, k, TRANS ? a + i : a + i * lda, lda, bp, c + i * ldc,   \
                      ldc, m0, m1);                                                           \
        const float *ai = TRANS ? a + i : a + i * lda;                                        \
        float *ci = c + i * ldc;                                                              \
        switch (m - i) {                                                                      \
        case 7: gemm_tile(7, TRANS, SKIP, k, ai, lda, bp, ci, ldc, m0, m1); break;            \
        case 6: gemm_tile(6, TRANS, SKIP, k, ai, lda, bp, ci, ldc, m0, m1); break;            \
        case 5: gemm_tile(5, TRANS, SKIP, k, ai, lda, bp, ci, ldc, m0, m1); break;            \
        case 4: gemm_tile(4, TRANS, SKIP, k, ai, lda, bp, ci, ldc, m0, m1); break;            \
        case 3: gemm_tile(3, TRANS, SKIP, k, ai, lda, bp, ci, ldc, m0, m1); break;            \
        case 2: gemm_tile(2, TRANS, SKIP, k, ai, lda, bp, ci, ldc, m0, m1); break;            \
        case 1: gemm_tile(1, TRANS, SKIP, k, ai, lda, bp, ci, ldc, m0, m1); break;            \
        default: break;                                                                       \
        }                                                                                     \
    }
GEMM_ROWS(gemm_rows_nn, false, false)
GEMM_ROWS(gemm_rows_nn_skip, false, true)
GEMM_ROWS(gemm_rows_tn, true, false)
GEMM_ROWS(gemm_rows_tn_skip, true, true)

void ai_gemm_avx512(bool trans_a, int64_t m, int64_t n, int64_t k, const float *a,
                    int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc,
                    bool skip_zeros) {
    _Alignas(64) float panel[ATTN_BK_LIMIT * 32];
    const __m512i expo = _mm512_set1_epi32(0x7f800000);
    if (m <= 0 || k <= 0) return;
    for (int64_t j0 = 0; j0 < n; j0 += 32) {
        const int64_t nd = n - j0 < 32 ? n - j0 : 32;
        /* lanes of the real columns: the first min(nd, 16), then the rest */
        const __mmask16 m0 = (__mmask16)(nd >= 16 ? 0xffffu : (1u << nd) - 1u);
        const __mmask16 m1 = (__mmask16)(nd >= 32 ? 0xffffu : nd <= 16 ? 0u : (1u << (nd - 16)) - 1u);
        __mmask16 bad = 0;  // lanes whose exponent bits are all ones (NaN, Inf)
        for (int64_t kk = 0; kk < k; kk++) {
            const float *b_k = b + kk * ldb + j0;
            const __m512 x0 = _mm512_maskz_loadu_ps(m0, b_k), x1 = _mm512_maskz_loadu_ps(m1, b_k + 16);
            _mm512_store_ps(panel + 32 * kk, x0);
            _mm512_store_ps(panel + 32 * kk + 16, x1);
            if (skip_zeros)
                bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(x0), expo), expo) |
                       _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(x1), expo), expo);
        }
        const bool skip = skip_zeros && bad != 0;
        float *cj = c + j0;
        if (trans_a) {
            if (skip) gemm_rows_tn_skip(m, k, a, lda, panel, cj, ldc, m0, m1);
            else gemm_rows_tn(m, k, a, lda, panel, cj, ldc, m0, m1);
        } else {
            if (skip) gemm_rows_nn_skip(m, k, a, lda, panel, cj, ldc, m0, m1);
            else gemm_rows_nn(m, k, a, lda, panel, cj, ldc, m0, m1);
        }
    }
}
#endif
