/*
 * mha_gemv.h — the decoding step's several one-row products in one parallel region
 *              (mha_gemv.c, called by mha_decode.c). The AVX2 loops are declared in
 *              kernels/avx2/gemv.h, the step's phase clock in mha_clock.h.
 *
 * What it is not: a public API (a one-row bfloat16 product has no CBLAS call; the
 * library's own loop is the module's private business).
 */
#ifndef ATTN_MHA_GEMV_H
#define ATTN_MHA_GEMV_H

#include <stdint.h>

#include "core/attn_internal.h"
#include "mha.h"

/* c[k][out_k] = beta[k]·c[k] + a · W_k for k < n <= MHA_GEMV_MANY, in one parallel
 * region (one wake-up of the team for all of them), each bit for bit what
 * mha_gemv_bf16 writes for it alone. Only for bfloat16 weights of row-major [in, out]
 * layout whose partials fit their panel (mha_weight_op with rows 1); false, nothing
 * written, for any other. */
#define MHA_GEMV_MANY 4
ATTN_PRIVATE bool mha_gemv_bf16_many(int n, const float *a, const mha_op *const *w,
                                     const float *beta, float *const *c);

#endif /* ATTN_MHA_GEMV_H */
