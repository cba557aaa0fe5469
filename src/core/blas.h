/*
 * blas.h — the library's one door to a BLAS: the matrix products of the projections
 *          (the multi-head module, additive attention) go through CBLAS here, never
 *          through a hand-written GEMM.
 *
 * What it is not: the attention kernels (they are fused and have their own tiles), or a
 * BLAS of its own. Built with ATTN_HAVE_CBLAS (the Makefile's BLAS=..., OpenBLAS through
 * pkg-config by default) these call cblas_sgemm / cblas_sbgemm; built without (BLAS=none)
 * they return ATTN_ERR_UNSUPPORTED and attn_blas_name() is "none".
 *
 * Row-major throughout, leading dimensions in elements. CBLAS sizes are `int` in the
 * usual LP64 builds: a size or leading dimension above INT_MAX is ATTN_ERR_OVERFLOW.
 */
#ifndef ATTN_BLAS_H
#define ATTN_BLAS_H

#include <stdbool.h>
#include <stdint.h>

#include "attn.h"

#define ATTN_BLAS_PRIVATE __attribute__((visibility("hidden")))

/* c[m, n] = alpha * op(a) * op(b) + beta * c, where op(a) is [m, k] (a is [k, m] when
 * trans_a) and op(b) is [k, n] (b is [n, k] when trans_b). beta = 0 ignores c's contents
 * (NaN included), as BLAS does. */
ATTN_BLAS_PRIVATE attn_status ai_gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n,
                                          int64_t k, float alpha, const float *a,
                                          int64_t lda, const float *b, int64_t ldb,
                                          float beta, float *c, int64_t ldc);

/* y = alpha * op(a) x + beta * y for a [rows, cols] (lda): op(a) = a (y has rows
 * elements, x cols) or aᵀ when trans (y has cols, x rows); unit strides. beta = 0
 * ignores y's contents (NaN included). cblas_sgemv: one row of a product (M = 1). */
ATTN_BLAS_PRIVATE attn_status ai_gemv_f32(bool trans, int64_t rows, int64_t cols, float alpha,
                                          const float *a, int64_t lda, const float *x,
                                          float beta, float *y);

/* The same with bfloat16 a and b (as uint16_t) and a float32 c, accumulated in float32:
 * cblas_sbgemm, in a build with ATTN_HAVE_SBGEMM (an OpenBLAS built with BUILD_BFLOAT16;
 * Debian's 0.3.21 declares cblas_sbgemm but does not export it), ATTN_ERR_UNSUPPORTED
 * otherwise: callers then widen bfloat16 operands to float32 and use ai_gemm_f32. */
ATTN_BLAS_PRIVATE attn_status ai_gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n,
                                           int64_t k, float alpha, const uint16_t *a,
                                           int64_t lda, const uint16_t *b, int64_t ldb,
                                           float beta, float *c, int64_t ldc);

/* Whether ai_gemm_bf16 is available in this build. */
ATTN_BLAS_PRIVATE bool ai_have_gemm_bf16(void);

#endif /* ATTN_BLAS_H */
