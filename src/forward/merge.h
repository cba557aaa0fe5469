/*
 * merge.h — the one merge of partial softmax states, shared by the public attn_merge
 *           (merge.c) and the fused path's split-KV decoding (fused.c).
 *
 * A partial state of one row is a log-weight a (the running max m of its logits, or its
 * LSE), a mass l (the running sum, or 1 for a normalized partial) and a vector x (the
 * unnormalized accumulator, or the normalized O). What is not here: argument checks,
 * threads, the final division (each caller stores its own way).
 */
#ifndef ATTN_MERGE_H
#define ATTN_MERGE_H

#include "core/attn_internal.h"

/* One row's merge of n partial states c = 0..n-1, in order c = 0, 1, ...:
 *   m = max_c a_c,  l = sum_c l_c exp(a_c - m),  acc[d] = sum_c x_c[d] exp(a_c - m).
 * a_c = a[c * a_s]; l_c = mass[c * mass_s], or 1 when mass is NULL; x_c[d] = x[c][d * x_s[c]]
 * (x_s NULL: unit strides). A state with a_c = -inf is empty: neither its mass nor its
 * vector is read. Every a_c = -inf (or n = 0): m = -inf, l = 0, acc = 0. A NaN a_c makes
 * m NaN and so l and acc; a_c = +inf gives exp(inf - inf) = NaN likewise.
 * acc: (Dv) float32, unit stride. Returns m; *l_out gets l. */
ATTN_PRIVATE float ai_merge_row(int64_t n, const float *a, int64_t a_s, const float *mass,
                                int64_t mass_s, const float *const *x, const int64_t *x_s,
                                int64_t dv, float *acc, float *l_out);

/* One more state folded into a row's (m, l, acc): an attention sink, the state of one
 * logit `sink` of mass 1 and vector 0, by the rules above:
 *   M = max(m, sink),  l = l exp(m - M) + exp(sink - M),  acc[d] *= exp(m - M),  m = M.
 * sink = -inf is empty (nothing changes); a fully masked row (m = -inf) becomes
 * (sink, 1, 0), so that its O is 0 and its LSE is the sink; a NaN on either side makes
 * the row NaN, and sink = +inf gives exp(inf - inf) = NaN. acc: (Dv) float32. */
ATTN_PRIVATE void ai_merge_sink(float *m, float *l, float *acc, int64_t dv, float sink);

#endif /* ATTN_MERGE_H */
