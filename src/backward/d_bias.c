/*
 * d_bias.c — the bias's gradient (options.d_bias) where the bias broadcasts: the scratch
 *            array of every logit's gradient the backward paths fill, and its reduction
 *            over the broadcast dimensions into d_bias (ai_d_bias_scratch,
 *            ai_d_bias_reduce; backward.h). Shared by the three backward paths.
 *
 * What it is not: the gradient of a logit (each path forms it, tile by tile) or the
 * in-place case of a full or batch-shared bias (backward_fused.c writes those itself).
 */
#include "core/alloc.h"
#include "backward.h"

size_t ai_d_bias_scratch(const attn_bwd_params *bp, size_t elem) {
    if (!bp->d_bias || bp->d_bias_full) return 0;
    const attn_params *p = &bp->fwd;
    int64_t n = 1;
    const int64_t dims[4] = {p->B, p->Hq, p->Lq, p->Lk};
    for (int d = 0; d < 4; d++)
        if (__builtin_mul_overflow(n, dims[d], &n)) return (size_t)-1;
    if ((uint64_t)n > (SIZE_MAX - 64) / elem) return (size_t)-1;
    return (((size_t)n * elem) + 63) & ~(size_t)63;
}

void ai_d_bias_reduce(const attn_bwd_params *bp, const void *g, bool f64) {
    const attn_params *p = &bp->fwd;
    const int64_t *n = bp->d_bias_n, *s = bp->d_bias_s;
    const int64_t full[4] = {p->B, p->Hq, p->Lq, p->Lk};
    /* per dimension: the logits' range an element of d_bias sums (all of it where d_bias
     * is 1 and the logits are not), and the logits' strides */
    int64_t span[4];
    for (int d = 0; d < 4; d++) span[d] = n[d] == full[d] ? 1 : full[d];
    const int64_t gs[4] = {full[1] * full[2] * full[3], full[2] * full[3], full[3], 1};
    const int64_t rows = n[0] * n[1] * n[2];
    /* a row of d_bias at a time (its n[3] sums side by side, over the logits' rows in the
     * order b, h, i and, for a bias of one key, the keys j) */
#pragma omp parallel num_threads(p->threads) if (rows * n[3] > 4096 && p->threads > 1)
    {
        double *acc = ai_malloc((size_t)(n[3] > 0 ? n[3] : 1) * sizeof(double));
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            const int64_t a = r / (n[1] * n[2]), b = r / n[2] % n[1], c = r % n[2];
            float *out = bp->d_bias + a * s[0] + b * s[1] + c * s[2];
            if (!acc) {  // no memory for the row's sums: one element at a time
                for (int64_t x = 0; x < n[3]; x++) {
                    double v = 0.0;
                    for (int64_t i0 = 0; i0 < span[0]; i0++)
                        for (int64_t i1 = 0; i1 < span[1]; i1++)
                            for (int64_t i2 = 0; i2 < span[2]; i2++)
                                for (int64_t i3 = 0; i3 < span[3]; i3++) {
                                    const int64_t at = (span[0] == 1 ? a : i0) * gs[0] + (span[1] == 1 ? b : i1) * gs[1] +
                                                       (span[2] == 1 ? c : i2) * gs[2] + (span[3] == 1 ? x : i3);
                                    v += f64 ? ((const double *)g)[at] : (double)((const float *)g)[at];
                                }
                    out[x * s[3]] = (float)v;
                }
                continue;
            }
            for (int64_t x = 0; x < n[3]; x++) acc[x] = 0.0;
            for (int64_t i0 = 0; i0 < span[0]; i0++)
                for (int64_t i1 = 0; i1 < span[1]; i1++)
                    for (int64_t i2 = 0; i2 < span[2]; i2++) {
                        const int64_t at = (span[0] == 1 ? a : i0) * gs[0] + (span[1] == 1 ? b : i1) * gs[1] +
                                           (span[2] == 1 ? c : i2) * gs[2];
                        if (span[3] == 1) {  // the keys side by side
                            if (f64)
                                for (int64_t x = 0; x < n[3]; x++) acc[x] += ((const double *)g)[at + x];
                            else
                                for (int64_t x = 0; x < n[3]; x++) acc[x] += (double)((const float *)g)[at + x];
                        } else {  // a bias of one key: the row's keys in order
                            for (int64_t j = 0; j < full[3]; j++)
                                acc[0] += f64 ? ((const double *)g)[at + j] : (double)((const float *)g)[at + j];
                        }
                    }
            for (int64_t x = 0; x < n[3]; x++) out[x * s[3]] = (float)acc[x];
        }
        ai_free(acc);
    }
}
