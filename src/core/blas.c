/*
 * blas.c — ai_gemm_f32 / ai_gemm_bf16 over CBLAS, and attn_blas_name(): the
 *          checks CBLAS does not make (sizes that fit its `int`, leading dimensions
 *          that cover a row), then one call. See blas.h.
 */
#include "blas.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#ifdef ATTN_HAVE_CBLAS
#include <cblas.h>
#endif

/* the name `attn --version` gives a CBLAS other than OpenBLAS (the Makefile passes BLAS) */
#ifndef ATTN_BLAS_NAME
#define ATTN_BLAS_NAME "cblas"
#endif

/* The sizes of one product, checked once for both dtypes. */
static attn_status gemm_check(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                              const void *a, int64_t lda, const void *b, int64_t ldb,
                              const void *c, int64_t ldc) {
    if (m < 0 || n < 0 || k < 0) return ATTN_ERR_SHAPE;
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX || ldb > INT_MAX ||
        ldc > INT_MAX)
        return ATTN_ERR_OVERFLOW;
    /* row-major: a row of op-less a holds (trans_a ? m : k) elements, and so on */
    int64_t a_row = trans_a ? m : k, b_row = trans_b ? k : n;
    if (lda < (a_row > 1 ? a_row : 1) || ldb < (b_row > 1 ? b_row : 1) ||
        ldc < (n > 1 ? n : 1))
        return ATTN_ERR_STRIDE;
    if (m && n && (!c || (k && (!a || !b)))) return ATTN_ERR_NULL;
    return ATTN_OK;
}

attn_status ai_gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                        float alpha, const float *a, int64_t lda, const float *b,
                        int64_t ldb, float beta, float *c, int64_t ldc) {
    attn_status st = gemm_check(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
    if (st != ATTN_OK || m == 0 || n == 0) return st;
#ifdef ATTN_HAVE_CBLAS
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, alpha, a,
                (int)lda, b, (int)ldb, beta, c, (int)ldc);
    return ATTN_OK;
#else
    (void)alpha; (void)beta;
    return ATTN_ERR_UNSUPPORTED;
#endif
}

attn_status ai_gemv_f32(bool trans, int64_t rows, int64_t cols, float alpha, const float *a,
                        int64_t lda, const float *x, float beta, float *y) {
    /* the checks of a [rows, cols] · [cols, 1] product (or its transpose) */
    attn_status st = gemm_check(trans, false, trans ? cols : rows, 1, trans ? rows : cols, a,
                                lda, x, 1, y, 1);
    const int64_t ny = trans ? cols : rows;
    if (st != ATTN_OK || ny == 0) return st;
    if (beta == 0.0f) memset(y, 0, (size_t)ny * sizeof(float));  /* y's contents ignored */
#ifdef ATTN_HAVE_CBLAS
    if (!rows || !cols) {  /* an empty sum: y = beta * y */
        for (int64_t i = 0; beta != 0.0f && i < ny; i++) y[i] *= beta;
        return ATTN_OK;
    }
    cblas_sgemv(CblasRowMajor, trans ? CblasTrans : CblasNoTrans, (int)rows, (int)cols,
                alpha, a, (int)lda, x, 1, beta == 0.0f ? 1.0f : beta, y, 1);
    return ATTN_OK;
#else
    (void)alpha;
    return ATTN_ERR_UNSUPPORTED;
#endif
}

bool ai_have_gemm_bf16(void) {
#if defined(ATTN_HAVE_CBLAS) && defined(ATTN_HAVE_SBGEMM)
    return true;
#else
    return false;
#endif
}

attn_status ai_gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                         float alpha, const uint16_t *a, int64_t lda, const uint16_t *b,
                         int64_t ldb, float beta, float *c, int64_t ldc) {
    attn_status st = gemm_check(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
    if (st != ATTN_OK || m == 0 || n == 0) return st;
#if defined(ATTN_HAVE_CBLAS) && defined(ATTN_HAVE_SBGEMM)
    cblas_sbgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                 trans_b ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, alpha,
                 (const bfloat16 *)a, (int)lda, (const bfloat16 *)b, (int)ldb, beta, c,
                 (int)ldc);
    return ATTN_OK;
#else
    (void)alpha; (void)beta;
    return ATTN_ERR_UNSUPPORTED;
#endif
}

#if defined(ATTN_HAVE_CBLAS) && defined(ATTN_BLAS_OPENBLAS)
/* OpenBLAS says its version, build options and core, e.g.
 * "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Zen MAX_THREADS=64" */
static char g_blas_name[160];
static pthread_once_t g_blas_once = PTHREAD_ONCE_INIT;
static void blas_name_once(void) {
    snprintf(g_blas_name, sizeof g_blas_name, "%s", openblas_get_config());
}
#endif

const char *attn_blas_name(void) {
#if defined(ATTN_HAVE_CBLAS) && defined(ATTN_BLAS_OPENBLAS)
    pthread_once(&g_blas_once, blas_name_once);
    return g_blas_name;
#elif defined(ATTN_HAVE_CBLAS)
    return ATTN_BLAS_NAME;
#else
    return "none";
#endif
}
