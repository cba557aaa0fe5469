/*
 * gemm_f64.h — the small float64 matrix product of the float64 fused paths (fused_f64.c,
 *              backward_f64.c): one tile of C = A·B or C += A·B, in portable C.
 *
 * Contract: C[i ldc + j] = (accumulate ? C[i ldc + j] : +0) + Σ_k A[i ar + k ak] B[k ldb + j]
 * for i < m, j < n, the sum over k in order 0 .. kk-1, one rounded multiply and one
 * rounded add per term (no reassociation; no fused multiply-add where the compiler
 * contracts none, gemm_f64.c): each element has the bits of the plain loop
 * `acc += a * b`, whatever the blocking. With skip_zero a term whose
 * A factor is exactly 0 adds +0 instead of its product, so an Inf or NaN in B beside a
 * zero weight (a masked key's row) reaches nothing. Reads only the m x kk elements of A
 * and kk x n of B named; writes only the m x n of C. Any sizes >= 0.
 *
 * What it is not: a general BLAS (the tiles are a few dozen rows and columns, in the
 * caller's scratch), or a kernel chosen at run time.
 */
#ifndef ATTN_GEMM_F64_H
#define ATTN_GEMM_F64_H

#include <stdbool.h>
#include <stdint.h>

#include "attn_internal.h"

ATTN_PRIVATE void ai_gemm_f64(int64_t m, int64_t n, int64_t kk, const double *A, int64_t ar,
                              int64_t ak, const double *B, int64_t ldb, double *C, int64_t ldc,
                              bool accumulate, bool skip_zero);

#endif /* ATTN_GEMM_F64_H */
