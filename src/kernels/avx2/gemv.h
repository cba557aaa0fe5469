/*
 * gemv.h — the AVX2 one-row bfloat16 products of the decoding step (gemv.c), which the
 *          avx2, avx512 and avx512bf16 tables all take as their gemv_*_bf16 entries
 *          (kernels.h). Their contract is the portable loops' of mha_gemv.c, bit for bit.
 *
 * What it is not: the callers' side (mha_gemv.h) or a public API.
 */
#ifndef ATTN_KERNELS_AVX2_GEMV_H
#define ATTN_KERNELS_AVX2_GEMV_H

#include <stdint.h>

#include "core/attn_internal.h"

/* acc[0 .. n) += Σ_{r0 <= r < r1} a[r] · w[r·ld + 0 .. n) over bfloat16 rows, each
 * element's products and sums in row order, each product rounded to float32 before its
 * sum (no fused multiply-add): bit for bit the portable loop of mha_gemv.c. */
ATTN_PRIVATE void ai_gemv_rows_bf16_avx2(float *acc, const uint16_t *w, int64_t ld,
                                         int64_t r0, int64_t r1, int64_t n, const float *a);
/* dot[r - r0] = Σ_{j < n} w[r·ld + j] · a[j] for r0 <= r < r1, in the portable dots
 * loop's eight lanes and order (mha_gemv.c), bit for bit. */
ATTN_PRIVATE void ai_gemv_dots_bf16_avx2(float *dot, const uint16_t *w, int64_t ld,
                                         int64_t r0, int64_t r1, int64_t n, const float *a);

#endif /* ATTN_KERNELS_AVX2_GEMV_H */
