/*
 * reference.c — the float64 reference path: the oracle of every test, selectable at run
 *               time with ATTN_PATH_REFERENCE.
 *
 * Straightforward on purpose: for each (batch, head) it materializes the Lq x Lk score
 * matrix in float64, takes the row softmax with the max subtracted, and forms O = P V
 * in float64. It is not fast and needs Lq * Lk * 8 bytes of workspace; its virtue is
 * that each line can be checked against docs/CONTRACT.md by eye. Rows run in parallel;
 * each row is computed by one thread in a fixed order, so results do not depend on the
 * thread count.
 */
#include <math.h>
#include <stdlib.h>

#include "core/attn_internal.h"
#include "core/half.h"
#include "core/philox.h"

size_t ai_reference_workspace(const attn_params *p) {
    int64_t n;
    if (__builtin_mul_overflow(p->Lq, p->Lk, &n) || n > (int64_t)(SIZE_MAX / sizeof(double)))
        return (size_t)-1;
    return (size_t)n * sizeof(double);
}

double ai_ref_finish(const attn_params *p, double raw, int64_t b, int64_t h, int64_t i,
                     int64_t j, int64_t d_i, double *cap) {
    double s = raw, g = 1.0;
    if (p->score_mod) {  // the user's function is float32's: on the logit rounded to float
        const float r = (float)raw;
        s = (double)p->score_mod(r, b, h, i, j, p->score_mod_ctx);
        if (cap) g = p->score_mod_grad ? (double)p->score_mod_grad(r, b, h, i, j, p->score_mod_ctx) : 1.0;
    }
    if (cap) *cap = g;
    if (p->softcap > 0.0f) {
        const double t = tanh(s / (double)p->softcap);
        s = (double)p->softcap * t;
        if (cap) *cap = g * (1.0 - t * t);
    }
    if (p->bias) {  // a -inf bias masks its key whatever raw is (NaN and +inf included)
        const double x =
            p->bias[b * p->bias_s[0] + h * p->bias_s[1] + i * p->bias_s[2] + j * p->bias_s[3]];
        if (x == -INFINITY) return -INFINITY;
        s += x;
    }
    if (p->alibi) s -= (double)p->alibi[h * p->alibi_s] * (double)llabs(d_i - j);
    if (p->mask &&
        !p->mask[b * p->mask_s[0] + h * p->mask_s[1] + i * p->mask_s[2] + j * p->mask_s[3]])
        s = -INFINITY;
    if (p->block && !attn_block_keep(p->block, b, h, i, j)) s = -INFINITY;
    return s;
}

/* s_ij in float64, CONTRACT order: scale * dot, then ai_ref_finish. */
/* A key or value element in float64: the value the cache stands for, an fp8 byte times
 * its head's scale rounded once to float32 (attn.h), exactly as the fused path reads it */
static double ref_kv(const attn_params *p, const void *base, int64_t idx, float scale) {
    if (attn_is_fp8(p->kv_dt)) return (double)(attn_load(p->kv_dt, base, idx) * scale);
    return attn_load_f64(p->kv_dt, base, idx);
}

static double ref_logit(const attn_params *p, int64_t q_bhi, int64_t k_bgj, int64_t b,
                        int64_t h, int64_t i, int64_t j, int64_t d_i) {
    const float ks = attn_kv_scale(p->k_scale, p->k_scale_s, h / p->group);
    double dot = 0.0;
    if (p->kv_dt == ATTN_U4) {  // each code with its channel's scale and zero (u4.c)
        for (int64_t d = 0; d < p->Dk; d++)
            dot += attn_load_f64(p->q_dt, p->q, q_bhi + d * p->q_s[3]) *
                   (double)ai_u4_load(p, false, b, h / p->group, j, d);
        return ai_ref_finish(p, p->scale64 * dot, b, h, i, j, d_i, NULL);
    }
    for (int64_t d = 0; d < p->Dk; d++)
        dot += attn_load_f64(p->q_dt, p->q, q_bhi + d * p->q_s[3]) *
               ref_kv(p, p->k, k_bgj + d * p->k_s[3], ks);
    return ai_ref_finish(p, p->scale64 * dot, b, h, i, j, d_i, NULL);
}

attn_status ai_reference_forward(const attn_params *p, void *ws) {
    double *scores = ws;  // (Lq, Lk), one (b, h) at a time
    for (int64_t b = 0; b < p->B; b++) {
        const int64_t lk_b = attn_key_len(p, b);
        for (int64_t h = 0; h < p->Hq; h++) {
            const int64_t g = h / p->group;
            /* offsets, in elements, of the (b, h) slice and of each key/value row (through
             * the pages of a paged cache: attn_kv_offset); every input is read through
             * attn_load, whatever its dtype, and upcast to float64 */
            const int64_t q_bh = b * p->q_s[0] + h * p->q_s[1];

#pragma omp parallel for schedule(static) num_threads(p->threads)
            for (int64_t i = 0; i < p->Lq; i++) {
                double *s_i = scores + i * p->Lk;
                int64_t lo, hi;
                attn_row_range(p, lk_b, i, &lo, &hi);
                const int64_t d_i = attn_diagonal(p, lk_b, i);

                /* keys outside [lo, hi) are masked by structure: never read */
                double m = -INFINITY;
                for (int64_t j = 0; j < p->Lk; j++) {
                    s_i[j] = (j >= lo && j < hi)
                                 ? ref_logit(p, q_bh + i * p->q_s[2], attn_kv_offset(p, p->k_s, b, g, j),
                                             b, h, i, j, d_i)
                                 : -INFINITY;
                    if (isnan(s_i[j]) || s_i[j] > m) m = s_i[j];  // NaN sticks: a NaN logit poisons its row
                }
                /* the sink: one more logit in the denominator, with no value; the max
                 * is taken over it too (a NaN sink poisons the row like a NaN logit) */
                const double sink = attn_sink(p, h);
                if (isnan(sink) || (!isnan(m) && sink > m)) m = sink;
                /* m = -inf: every key is masked (and there is no sink). Subtracting it
                 * would give -inf - -inf = NaN; the row's answer is decided instead:
                 * O = 0, LSE = -inf, P = 0. */
                const bool masked_row = m == -INFINITY;
                double l = 0.0;
                if (!masked_row) {
                    for (int64_t j = 0; j < p->Lk; j++) {
                        s_i[j] = exp(s_i[j] - m);
                        l += s_i[j];
                    }
                    if (sink != -INFINITY) l += exp(sink - m);
                } else {
                    for (int64_t j = 0; j < p->Lk; j++) s_i[j] = 0.0;
                }
                /* dropout: after l (the softmax's sum is the undropped one, and so is the
                 * LSE), each kept weight times 1 / (1 - p), each dropped one 0 — then,
                 * like a masked key, its V is never multiplied */
                if (p->dropout) {
                    const uint64_t r = attn_drop_row(p, b, h, i);
                    for (int64_t j = lo; j < hi; j++)
                        s_i[j] = attn_dropout_kept(p->drop_seed, p->drop_offset, p->drop_threshold,
                                                   r, attn_drop_keys(p), (uint64_t)j) && p->drop_scale64 != 0.0
                                     ? s_i[j] * p->drop_scale64
                                     : 0.0;
                }

                const int64_t o_bhi = b * p->o_s[0] + h * p->o_s[1] + i * p->o_s[2];
                for (int64_t d = 0; d < p->Dv; d++) {
                    double acc = 0.0;
                    /* a weight of exactly 0 contributes nothing: a masked key's V is
                     * never multiplied, so NaN stored there cannot leak */
                    for (int64_t j = lo; j < hi; j++)
                        if (s_i[j] != 0.0)
                            acc += s_i[j] * (p->kv_dt == ATTN_U4
                                                 ? (double)ai_u4_load(p, true, b, g, j, d)
                                                 : ref_kv(p, p->v,
                                                          attn_kv_offset(p, p->v_s, b, g, j) + d * p->v_s[3],
                                                          attn_kv_scale(p->v_scale, p->v_scale_s, g)));
                    /* float64 -> float32 -> the output dtype: both steps round to nearest
                     * even; the double rounding can differ from a direct one by at most
                     * one ulp of the 16-bit type, only on exact ties. A float64 o takes
                     * acc / l as it is. */
                    attn_store_f64(p->o_dt, p->o, o_bhi + d * p->o_s[3],
                                   masked_row ? 0.0 : acc / l);
                }
                if (p->lse || p->lse64) {
                    double lse = masked_row ? -INFINITY : m + log(l);
                    const int64_t at = b * p->lse_s[0] + h * p->lse_s[1] + i * p->lse_s[2];
                    if (p->lse64)
                        p->lse64[at] = lse;
                    else
                        p->lse[at] = (float)lse;
                }
                if (p->weights) {  // with dropout: the dropped and scaled weights
                    float *w = p->weights + b * p->w_s[0] + h * p->w_s[1] + i * p->w_s[2];
                    for (int64_t j = 0; j < p->Lk; j++)
                        w[j * p->w_s[3]] = masked_row ? 0.0f : (float)(s_i[j] / l);
                }
            }
        }
    }
    return ATTN_OK;
}
