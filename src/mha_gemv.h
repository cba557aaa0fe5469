/*
 * mha_gemv.h — what the decoding step's one-row products share (mha_gemv.c, the AVX2
 *              loop kernels/avx2/gemv.c, mha_decode.c) and the step's phase clock that
 *              `attn bench-mha` reads.
 *
 * What it is not: a public API (a one-row bfloat16 product has no CBLAS call; the
 * library's own loop is the module's private business).
 */
#ifndef ATTN_MHA_GEMV_H
#define ATTN_MHA_GEMV_H

#include <stdint.h>

#include "attn_internal.h"
#include "mha.h"

/* c[k][out_k] = beta[k]·c[k] + a · W_k for k < n <= MHA_GEMV_MANY, in one parallel
 * region (one wake-up of the team for all of them), each bit for bit what
 * mha_gemv_bf16 writes for it alone. Only for bfloat16 weights of row-major [in, out]
 * layout whose partials fit their panel (mha_weight_op with rows 1); false, nothing
 * written, for any other. */
#define MHA_GEMV_MANY 4
ATTN_PRIVATE bool mha_gemv_bf16_many(int n, const float *a, const mha_op *const *w,
                                     const float *beta, float *const *c);

/* The decoding step's phases, in the order they run (mha_decode.c):
 *   QKV     x·W_Q, x·W_K, x·W_V and RoPE on the new rows
 *   APPEND  the new K and V rows written into the cache
 *   ATTEND  the heads' attention over the cache (the library's decoding path)
 *   OUT     o·W_O and the store of y */
enum { MHA_DEC_QKV = 0, MHA_DEC_APPEND, MHA_DEC_ATTEND, MHA_DEC_OUT, MHA_DEC_NPHASE };

/* When not NULL, every decoding step adds each phase's wall time in seconds to
 * mha_decode_clock[phase]: bench-mha's breakdown (one caller at a time; the library
 * never sets it). */
ATTN_PRIVATE extern double *mha_decode_clock;

/* acc[0 .. n) += Σ_{r0 <= r < r1} a[r] · w[r·ld + 0 .. n) over bfloat16 rows, each
 * element's products and sums in row order, each product rounded to float32 before its
 * sum (no fused multiply-add): bit for bit the portable loop of mha_gemv.c. */
ATTN_PRIVATE void attn_gemv_rows_bf16_avx2(float *acc, const uint16_t *w, int64_t ld,
                                           int64_t r0, int64_t r1, int64_t n, const float *a);
/* dot[r - r0] = Σ_{j < n} w[r·ld + j] · a[j] for r0 <= r < r1, in the portable dots
 * loop's eight lanes and order (mha_gemv.c), bit for bit. */
ATTN_PRIVATE void attn_gemv_dots_bf16_avx2(float *dot, const uint16_t *w, int64_t ld,
                                           int64_t r0, int64_t r1, int64_t n, const float *a);

#endif /* ATTN_MHA_GEMV_H */
