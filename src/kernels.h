/*
 * kernels.h — the micro-kernels of the fused forward pass and their contracts.
 *
 * A micro-kernel computes one tile and knows nothing of batches, heads, masks, threads
 * or workspace: fused.c (the framework) packs the operands, applies masks and owns the
 * loops. All buffers are float32, row-major, with the leading dimension given; kernels
 * read only the elements named in their contract and write only their outputs.
 *
 * One table of kernels per instruction set; today only the portable C one exists
 * ("generic"). Later ISA variants fill the same table and must give results within the
 * contract's tolerance of the float64 reference (they need not be bit-identical to the
 * generic kernels, but each is bit-identical to itself for any thread count).
 */
#ifndef ATTN_KERNELS_H
#define ATTN_KERNELS_H

#include <stdint.h>

#include "attn_internal.h"

typedef struct attn_kernels {
    const char *name;

    /* S = scale * Q Kᵀ for one tile.
     *   q  (n, dk),   row stride ldq     rows of the query block
     *   kt (dk, nk),  row stride ldk     the key block, packed transposed
     *   s  (n, nk),   row stride lds     written, every element
     * 1 <= n, 1 <= nk <= ldk, 0 <= dk. With dk = 0 every s is 0 (times scale). */
    void (*qk)(int64_t n, int64_t nk, int64_t dk, const float *q, int64_t ldq,
               const float *kt, int64_t ldk, float scale, float *s, int64_t lds);

    /* Online-softmax step for one tile of final logits (masked ones are -inf):
     *   s (n, nk) in: logits, out: p_rc = exp(s_rc - m_new_r)  (0 where s = -inf)
     *   m (n)     in: running max, out: new running max (NaN once any logit is NaN)
     *   l (n)     in: running sum, out: l * alpha + sum_c p_rc
     *   alpha (n) out: exp(m_old - m_new), the factor the row's accumulator needs;
     *             rows that are still fully masked (m_new = -inf) get alpha = 1 and p = 0.
     */
    void (*softmax)(int64_t n, int64_t nk, float *s, int64_t lds, float *m, float *l,
                    float *alpha);

    /* acc = acc * alpha + P V for one tile, P V summed over the tile first so that the
     * rounding error grows with sqrt(nk) + sqrt(Lk / nk), not sqrt(Lk).
     *   p (n, nk),   row stride lds    probabilities; exact zeros are skipped, so a masked
     *                                  key's value row is never multiplied
     *   v (nk, dv),  row stride ldv    the value block, packed
     *   acc (n, dv), row stride ldo    the running accumulator
     *   tmp (dv)                       scratch */
    void (*pv)(int64_t n, int64_t nk, int64_t dv, const float *p, int64_t lds,
               const float *v, int64_t ldv, const float *alpha, float *acc, int64_t ldo,
               float *tmp);
} attn_kernels;

ATTN_PRIVATE extern const attn_kernels attn_kernels_generic;

#endif /* ATTN_KERNELS_H */
