/*
 * merge.c — merging partial attention results: the one per-row merge of softmax states
 *           (ai_merge_row, also the split-KV path's in fused.c) and the public
 *           attn_merge over (O, LSE) tensors.
 *
 * A partial result is attention over a subset of the keys: O_c normalized over that
 * subset and LSE_c the natural log-sum-exp of its logits. Over the union of the subsets
 *   LSE = m + ln sum_c exp(LSE_c - m),   O = sum_c O_c exp(LSE_c - LSE),   m = max_c LSE_c,
 * which is the state merge with log-weights LSE_c and masses 1. What is not here:
 * computing the partials (attn_forward with an lse output does that).
 */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/half.h"
#include "merge.h"

float ai_merge_row(int64_t n, const float *a, int64_t a_s, const float *mass, int64_t mass_s,
                   const float *const *x, const int64_t *x_s, int64_t dv, float *acc,
                   float *l_out) {
    float m = -INFINITY;
    bool nan = false;
    for (int64_t c = 0; c < n; c++) {
        const float ac = a[c * a_s];
        if (ac > m) m = ac;
        nan |= isnan(ac);
    }
    if (nan) m = NAN;  // a NaN never wins a comparison: kept apart so no order hides it
    float l = 0.0f;
    memset(acc, 0, (size_t)dv * sizeof(float));
    if (m != -INFINITY) {
        for (int64_t c = 0; c < n; c++) {
            const float ac = a[c * a_s];
            if (ac == -INFINITY) continue;  // empty: exp(-inf - m) would be 0, 0 * O not
            const float f = expf(ac - m);
            l += (mass ? mass[c * mass_s] : 1.0f) * f;
            const float *xc = x[c];
            const int64_t s = x_s ? x_s[c] : 1;
            for (int64_t d = 0; d < dv; d++) acc[d] += xc[d * s] * f;
        }
    }
    *l_out = l;
    return m;
}

void ai_merge_sink(float *m, float *l, float *acc, int64_t dv, float sink) {
    if (sink == -INFINITY) return;  // empty: no sink
    const float m0 = *m;
    const float M = isnan(m0) || isnan(sink) ? NAN : m0 > sink ? m0 : sink;
    /* the row's own state; a fully masked row's (m = -inf) is empty, as in the merge:
     * neither its mass nor its vector is read */
    const float alpha = m0 == -INFINITY ? 0.0f : expf(m0 - M);
    *l = (m0 == -INFINITY ? 0.0f : *l * alpha) + expf(sink - M);
    if (m0 == -INFINITY)
        memset(acc, 0, (size_t)dv * sizeof(float));
    else if (alpha != 1.0f)
        for (int64_t d = 0; d < dv; d++) acc[d] *= alpha;
    *m = M;
}

/* ---- the public merge --------------------------------------------------------------- */

static attn_status same_shape(const attn_tensor *t, const char *name, int64_t c,
                              const int64_t want[4]) {
    for (int d = 0; d < 4; d++)
        if (t->shape[d] != want[d])
            return ai_fail(ATTN_ERR_SHAPE, "%s[%lld]: shape[%d] = %lld, expected %lld", name,
                           (long long)c, d, (long long)t->shape[d], (long long)want[d]);
    return ATTN_OK;
}

/* a and b (of one shape) are the same elements in the same order: the in-place case */
static bool same_view(const attn_tensor *a, const attn_tensor *b) {
    if (a->data != b->data || a->dtype != b->dtype) return false;
    for (int d = 0; d < 4; d++)
        if (a->shape[d] > 1 && a->stride[d] != b->stride[d]) return false;
    return true;
}

static attn_status check_merge(int64_t n, const attn_tensor *o_parts,
                               const attn_tensor *lse_parts, const attn_tensor *o,
                               const attn_tensor *lse, int32_t threads) {
    if (n < 0) return ai_fail(ATTN_ERR_VALUE, "n = %lld partials, expected >= 0", (long long)n);
    if (threads < 0)
        return ai_fail(ATTN_ERR_VALUE, "threads is %d, expected >= 0 (0 = default)", (int)threads);
    if (n > 0 && !o_parts) return ai_fail(ATTN_ERR_NULL, "o_parts is NULL for %lld partials", (long long)n);
    if (n > 0 && !lse_parts) return ai_fail(ATTN_ERR_NULL, "lse_parts is NULL for %lld partials", (long long)n);
    TRY(ai_check_tensor(o, "o", ATTN_DTYPE_COUNT, true));
    TRY(ai_check_output_strides(o, "o", 4));
    const int64_t rows[4] = {o->shape[0], o->shape[1], o->shape[2], 1};
    if (lse) {
        TRY(ai_check_tensor(lse, "lse", ATTN_F32, true));
        TRY(same_shape(lse, "lse", 0, rows));
        TRY(ai_check_output_strides(lse, "lse", 3));
    }
    for (int64_t c = 0; c < n; c++) {
        TRY(ai_check_tensor(&o_parts[c], "o_parts[c]", ATTN_F32, true));
        TRY(same_shape(&o_parts[c], "o_parts", c, o->shape));
        TRY(ai_check_tensor(&lse_parts[c], "lse_parts[c]", ATTN_F32, true));
        TRY(same_shape(&lse_parts[c], "lse_parts", c, rows));
    }
    /* o and lse share no byte with each other, nor with a partial unless they are that
     * partial itself (in place: each row reads every partial before it writes) */
    if (lse && ai_views_overlap(o, lse))
        return ai_fail(ATTN_ERR_STRIDE, "lse: overlaps the output o in memory");
    for (int64_t c = 0; c < n; c++) {
        if (ai_views_overlap(o, &lse_parts[c]))
            return ai_fail(ATTN_ERR_STRIDE, "o: overlaps lse_parts[%lld] in memory", (long long)c);
        if (!same_view(o, &o_parts[c]) && ai_views_overlap(o, &o_parts[c]))
            return ai_fail(ATTN_ERR_STRIDE, "o: overlaps o_parts[%lld] in memory and is not "
                           "that partial itself", (long long)c);
        if (lse && ai_views_overlap(lse, &o_parts[c]))
            return ai_fail(ATTN_ERR_STRIDE, "lse: overlaps o_parts[%lld] in memory", (long long)c);
        if (lse && !same_view(lse, &lse_parts[c]) && ai_views_overlap(lse, &lse_parts[c]))
            return ai_fail(ATTN_ERR_STRIDE, "lse: overlaps lse_parts[%lld] in memory and is "
                           "not that partial itself", (long long)c);
    }
    return ATTN_OK;
}

attn_status attn_merge(int64_t n, const attn_tensor *o_parts, const attn_tensor *lse_parts,
                       const attn_tensor *o, const attn_tensor *lse, int32_t threads) {
    TRY(check_merge(n, o_parts, lse_parts, o, lse, threads));
    const int64_t B = o->shape[0], H = o->shape[1], L = o->shape[2], dv = o->shape[3];
    const int64_t nrows = B * H * L;  // within int64: o's element count is
    if (nrows == 0) return ai_ok();
    int nt = 1;
#ifdef _OPENMP
    nt = threads > 0 ? threads : omp_get_max_threads();
#endif
    if (nt > ATTN_MAX_THREADS) nt = ATTN_MAX_THREADS;
    if (nt < 1) nt = 1;
    if (nt > nrows) nt = (int)nrows;
    /* per thread: the row's n log-weights and vector pointers, and its accumulator */
    if ((size_t)n > SIZE_MAX / 64 || (size_t)dv > SIZE_MAX / 64)
        return ai_fail(ATTN_ERR_OVERFLOW, "merge scratch overflows size_t");
    const size_t per = ((size_t)n * (sizeof(float) + sizeof(float *)) + (size_t)dv * sizeof(float) + 63) &
                       ~(size_t)63;
    const size_t x_s_bytes = ((size_t)n * sizeof(int64_t) + 63) & ~(size_t)63;
    if (per > (SIZE_MAX - x_s_bytes - 16) / (size_t)nt)
        return ai_fail(ATTN_ERR_OVERFLOW, "merge scratch overflows size_t");
    char *scratch = ai_malloc(x_s_bytes + (size_t)nt * per + 16);
    if (!scratch) return ai_fail(ATTN_ERR_NOMEM, "merge scratch: could not allocate");
    int64_t *x_s = (int64_t *)scratch;
    for (int64_t c = 0; c < n; c++) x_s[c] = o_parts[c].stride[3];

#pragma omp parallel num_threads(nt)
    {
        char *mine = scratch + x_s_bytes + (size_t)attn_thread_num() * per;
        const float **x = (const float **)mine;
        float *a = (float *)(mine + (size_t)n * sizeof(float *));
        float *acc = a + n;
#pragma omp for schedule(static)
        for (int64_t row = 0; row < nrows; row++) {
            const int64_t b = row / (H * L), h = row / L % H, i = row % L;
            for (int64_t c = 0; c < n; c++) {
                const attn_tensor *t = &lse_parts[c], *u = &o_parts[c];
                a[c] = ((const float *)t->data)[b * t->stride[0] + h * t->stride[1] + i * t->stride[2]];
                x[c] = (const float *)u->data + b * u->stride[0] + h * u->stride[1] + i * u->stride[2];
            }
            float l;
            const float m = ai_merge_row(n, a, 1, NULL, 0, x, x_s, dv, acc, &l);
            /* every partial has been read: o and lse may be one of them (in place) */
            const bool empty = m == -INFINITY;
            const int64_t o_bhi = b * o->stride[0] + h * o->stride[1] + i * o->stride[2];
            for (int64_t d = 0; d < dv; d++)
                attn_store(o->dtype, o->data, o_bhi + d * o->stride[3], empty ? 0.0f : acc[d] / l);
            if (lse)
                ((float *)lse->data)[b * lse->stride[0] + h * lse->stride[1] + i * lse->stride[2]] =
                    empty ? -INFINITY : m + logf(l);
        }
    }
    ai_free(scratch);
    return ai_ok();
}
