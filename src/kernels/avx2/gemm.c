/*
 * avx2/gemm.c — the AVX2 + FMA plain matrix product of the kernel table (kernels.h:
 *               gemm), the backward's dV += Pᵀ dO, dK += dSᵀ Q and dQ += dS K.
 *
 * Register tile: 6 rows of C x 2 ymm (16 columns), 12 accumulators, one broadcast of
 * op(A) per row and key step against two loads of B: 8 loads per 12 FMAs, as qk's tile.
 * B is copied one 16-column panel at a time into a contiguous buffer (64 bytes a row of
 * k): its rows lie a power of two apart in the callers' tensors, and a panel streams
 * where strided rows would share a few L1 sets (docs/KERNELS.md, "The AVX2 kernel on
 * Zen 3"). The copy also finds out whether the panel holds a NaN or an Inf: only then do
 * skip_zeros' zeros need a blend (0 * b is exactly 0 otherwise, and adding it changes
 * no sum). Compiled only with this folder's AVX2 flags; dispatch calls it only where the
 * CPU has them.
 */
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "kernels/kernels.h"

#define UNROLL _Pragma("GCC unroll 16")
#define INLINE ATTN_KERNEL_INLINE

/* MR rows (i0 ..) x 16 columns of C += op(A) B from the panel bp (k rows of 16 floats,
 * zero past the real columns); op(A)(i, kk) = a[kk * lda + i] (TRANS) or a[i * lda + kk].
 * Columns of C past nd (< 16 in the last panel) are neither read nor written. */
INLINE void gemm_tile(int MR, bool TRANS, bool SKIP, int64_t k, const float *a, int64_t lda,
                      const float *bp, float *c, int64_t ldc, int64_t nd, __m256i tail0,
                      __m256i tail1) {
    __m256 t[6][2];
    UNROLL for (int i = 0; i < MR; i++) t[i][0] = t[i][1] = _mm256_setzero_ps();
    for (int64_t kk = 0; kk < k; kk++) {
        const __m256 b0 = _mm256_load_ps(bp + 16 * kk), b1 = _mm256_load_ps(bp + 16 * kk + 8);
        UNROLL for (int i = 0; i < MR; i++) {
            const __m256 ab = _mm256_broadcast_ss(TRANS ? a + kk * lda + i : a + i * lda + kk);
            if (SKIP) {  // a zero of op(A) leaves the sums as they are
                const __m256 live = _mm256_cmp_ps(ab, _mm256_setzero_ps(), _CMP_NEQ_UQ);
                t[i][0] = _mm256_blendv_ps(t[i][0], _mm256_fmadd_ps(ab, b0, t[i][0]), live);
                t[i][1] = _mm256_blendv_ps(t[i][1], _mm256_fmadd_ps(ab, b1, t[i][1]), live);
            } else {
                t[i][0] = _mm256_fmadd_ps(ab, b0, t[i][0]);
                t[i][1] = _mm256_fmadd_ps(ab, b1, t[i][1]);
            }
        }
    }
    UNROLL for (int i = 0; i < MR; i++) {
        float *o = c + i * ldc;
        if (nd == 16) {
            _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), t[i][0]));
            _mm256_storeu_ps(o + 8, _mm256_add_ps(_mm256_loadu_ps(o + 8), t[i][1]));
        } else {
            _mm256_maskstore_ps(o, tail0, _mm256_add_ps(_mm256_maskload_ps(o, tail0), t[i][0]));
            _mm256_maskstore_ps(o + 8, tail1,
                                _mm256_add_ps(_mm256_maskload_ps(o + 8, tail1), t[i][1]));
        }
    }
}

/* every row of C for one panel: 6 rows a tile, the m % 6 left in one narrower tile */
#define GEMM_ROWS(NAME, TRANS, SKIP)                                                          \
    static void NAME(int64_t m, int64_t k, const float *a, int64_t lda, const float *bp,      \
                     float *c, int64_t ldc, int64_t nd, __m256i tail0, __m256i tail1) {      \
        int64_t i = 0;                                                                        \
        for (; i + 6 <= m; i += 6)                                                            \
            gemm_tile(6, TRANS, SKIP, k, TRANS ? a + i : a + i * lda, lda, bp, c + i * ldc,   \
                      ldc, nd, tail0, tail1);                                                 \
        const float *ai = TRANS ? a + i : a + i * lda;                                        \
        float *ci = c + i * ldc;                                                              \
        switch (m - i) {                                                                      \
        case 5: gemm_tile(5, TRANS, SKIP, k, ai, lda, bp, ci, ldc, nd, tail0, tail1); break; \
        case 4: gemm_tile(4, TRANS, SKIP, k, ai, lda, bp, ci, ldc, nd, tail0, tail1); break; \
        case 3: gemm_tile(3, TRANS, SKIP, k, ai, lda, bp, ci, ldc, nd, tail0, tail1); break; \
        case 2: gemm_tile(2, TRANS, SKIP, k, ai, lda, bp, ci, ldc, nd, tail0, tail1); break; \
        case 1: gemm_tile(1, TRANS, SKIP, k, ai, lda, bp, ci, ldc, nd, tail0, tail1); break; \
        default: break;                                                                       \
        }                                                                                     \
    }
GEMM_ROWS(gemm_rows_nn, false, false)
GEMM_ROWS(gemm_rows_nn_skip, false, true)
GEMM_ROWS(gemm_rows_tn, true, false)
GEMM_ROWS(gemm_rows_tn_skip, true, true)

void ai_gemm_avx2(bool trans_a, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                  const float *b, int64_t ldb, float *c, int64_t ldc, bool skip_zeros) {
    _Alignas(32) float panel[ATTN_BK_LIMIT * 16];
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i expo = _mm256_set1_epi32(0x7f800000);
    if (m <= 0 || k <= 0) return;
    for (int64_t j0 = 0; j0 < n; j0 += 16) {
        const int64_t nd = n - j0 < 16 ? n - j0 : 16;
        const __m256i tail0 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)nd), lane);
        const __m256i tail1 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)nd - 8), lane);
        /* the panel, zero past nd; bad: lanes whose exponent bits are all ones */
        __m256i bad = _mm256_setzero_si256();
        for (int64_t kk = 0; kk < k; kk++) {
            const float *b_k = b + kk * ldb + j0;
            const __m256 x0 = nd == 16 ? _mm256_loadu_ps(b_k) : _mm256_maskload_ps(b_k, tail0);
            const __m256 x1 = nd == 16 ? _mm256_loadu_ps(b_k + 8) : _mm256_maskload_ps(b_k + 8, tail1);
            _mm256_store_ps(panel + 16 * kk, x0);
            _mm256_store_ps(panel + 16 * kk + 8, x1);
            if (skip_zeros) {
                bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(x0), expo), expo));
                bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(x1), expo), expo));
            }
        }
        const bool skip = skip_zeros && !_mm256_testz_si256(bad, bad);
        float *cj = c + j0;
        if (trans_a) {
            if (skip) gemm_rows_tn_skip(m, k, a, lda, panel, cj, ldc, nd, tail0, tail1);
            else gemm_rows_tn(m, k, a, lda, panel, cj, ldc, nd, tail0, tail1);
        } else {
            if (skip) gemm_rows_nn_skip(m, k, a, lda, panel, cj, ldc, nd, tail0, tail1);
            else gemm_rows_nn(m, k, a, lda, panel, cj, ldc, nd, tail0, tail1);
        }
    }
}
#endif
