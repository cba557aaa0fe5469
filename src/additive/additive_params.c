/*
 * additive_params.c — additive (Bahdanau) attention's params and what its paths share:
 *                     the one filler of attn_additive_params (argument checking, on top
 *                     of the dot-product call's ai_params_init), the scoring kernels'
 *                     choice, each batch's key range, and v's normalization and its
 *                     gradient (the fused forward, additive.c; the backward,
 *                     additive_backward.c; the float64 path, additive_reference.c; the
 *                     projections, additive_proj.c).
 *
 * What it is not: a path or a public call.
 */
#include <math.h>
#include <string.h>

#include "additive.h"
#include "kernels/kernels.h"

/* ---- kernels ------------------------------------------------------------------------- */

const attn_additive_kernels *ai_additive_kernels_named(const char *name) {
    const attn_kernels *k = ai_kernels_named(name);
    return k ? k->additive : NULL;
}

/* The additive table of the kernel the dot-product path chose (probed once, in dispatch.c) */
const attn_additive_kernels *ai_additive_select(void) {
    const attn_kernels *k = ai_select_kernels(NULL);
    return k ? k->additive : NULL;
}

void ai_additive_read_keys(const attn_additive_params *p, int64_t b, int64_t *j0,
                           int64_t *j1) {
    /* lo_i and hi_i grow by at most 1 a row, and only the first and last rows can be
     * empty, so the nonempty ranges overlap or touch: their union is [min lo, max hi) */
    const int64_t lk_b = attn_key_len(&p->m, b);
    *j0 = lk_b;
    *j1 = 0;
    for (int64_t i = 0; i < p->m.Lq; i++) {
        int64_t lo, hi;
        attn_row_range(&p->m, lk_b, i, &lo, &hi);
        if (lo >= hi) continue;
        if (lo < *j0) *j0 = lo;
        if (hi > *j1) *j1 = hi;
    }
    if (*j1 <= *j0) *j0 = *j1 = 0;
}

/* ---- ṽ and its gradient ----------------------------------------------------------------- */

static double v_norm(const attn_additive_params *p) {
    double s = 0.0;
    for (int64_t a = 0; a < p->A; a++) s += (double)p->v[a] * (double)p->v[a];
    return sqrt(s);
}

void ai_additive_effective_v(const attn_additive_params *p, float *vt) {
    /* ṽ = g v / ‖v‖; ‖v‖ = 0 gives ṽ = 0 (the direction is undefined, 0 is its limit
     * along any path that keeps g finite) */
    const double n = p->normalize ? v_norm(p) : 1.0;
    const double f = p->normalize ? (n > 0 ? (double)p->g / n : 0.0) : 1.0;
    for (int64_t a = 0; a < p->A; a++) vt[a] = (float)(f * (double)p->v[a]);
}

void ai_additive_v_grad(const attn_additive_params *p, const double *dvt, float *dv,
                        float *dg) {
    if (!p->normalize) {
        for (int64_t a = 0; dv && a < p->A; a++) dv[a] = (float)dvt[a];
        if (dg) *dg = 0.0f;
        return;
    }
    /* from ṽ = g v / n:  dv = (g / n) (dṽ - v (v·dṽ) / n²),  dg = (v·dṽ) / n */
    const double n = v_norm(p);
    double vd = 0.0;
    for (int64_t a = 0; a < p->A; a++) vd += (double)p->v[a] * dvt[a];
    for (int64_t a = 0; dv && a < p->A; a++)
        dv[a] = n > 0 ? (float)((double)p->g / n * (dvt[a] - (double)p->v[a] * vd / (n * n)))
                      : 0.0f;
    if (dg) *dg = n > 0 ? (float)(vd / n) : 0.0f;
}

/* ---- argument checking ------------------------------------------------------------------ */

attn_status ai_additive_params_init(attn_additive_params *p, const attn_tensor *q,
                                    const attn_tensor *k, const attn_tensor *val,
                                    const attn_additive_weights *w, const attn_tensor *o,
                                    const attn_options *opt, bool need_data) {
    *p = (attn_additive_params){0};
    TRY(ai_check_tensor(q, "q", ATTN_F32, need_data));
    TRY(ai_check_tensor(k, "k", ATTN_F32, need_data));
    TRY(ai_check_tensor(val, "v", ATTN_F32, need_data));
    TRY(ai_check_tensor(o, "o", ATTN_F32, need_data));
    if (!w) return ai_fail(ATTN_ERR_NULL, "weights: NULL");
    if (q->shape[1] != 1 || k->shape[1] != 1 || val->shape[1] != 1 || o->shape[1] != 1)
        return ai_fail(ATTN_ERR_SHAPE, "q, k, v, o: shape[1] must be 1 (one head: [B, 1, L, D])");
    /* The masks, outputs, path and threads are the dot-product call's: its filler checks
     * them on a stand-in q of k's width (the additive q may be of another width). */
    attn_tensor q_as_k = *q;
    q_as_k.shape[3] = k->shape[3];
    q_as_k.stride[3] = 1;
    for (int d = 0; d < 3; d++) q_as_k.stride[d] = 0;
    if (!need_data) q_as_k.data = NULL;
    else if (!q_as_k.data) q_as_k.data = (void *)k->data;  /* q is empty: checked above */
    if (opt && opt->block_table)
        return ai_fail(ATTN_ERR_UNSUPPORTED, "additive attention: options.block_table (a "
                       "paged cache) is not supported");
    TRY(ai_params_init(&p->m, &q_as_k, k, val, o, opt, need_data));
    if (opt && (opt->has_scale || opt->softcap != 0.0f || opt->bias || opt->alibi_slopes ||
                opt->sinks || opt->block_mask || opt->score_mod))
        return ai_fail(ATTN_ERR_UNSUPPORTED, "additive attention: options.has_scale, "
                       "softcap, bias, alibi_slopes, sinks, block_mask and score_mod are "
                       "not supported");
    if (p->m.dropout)
        return ai_fail(ATTN_ERR_UNSUPPORTED, "additive attention: options.dropout_p = %g is "
                       "not supported (dropout is the dot-product calls')", (double)opt->dropout_p);
    if (opt && opt->workspace)
        return ai_fail(ATTN_ERR_UNSUPPORTED, "additive attention: options.workspace is not "
                       "supported (the call allocates its own)");

    p->Dq = q->shape[3];
    p->A = w->units;
    if (p->A < 0) return ai_fail(ATTN_ERR_SHAPE, "weights.units = %lld is negative", (long long)p->A);
    int64_t n;
    if (__builtin_mul_overflow(p->Dq > p->m.Dk ? p->Dq : p->m.Dk, p->A, &n))
        return ai_fail(ATTN_ERR_OVERFLOW, "weights: D x A overflows int64");
    if (need_data && p->A > 0 && (!w->v || (p->Dq > 0 && !w->w_query) || (p->m.Dk > 0 && !w->w_key)))
        return ai_fail(ATTN_ERR_NULL, "weights: w_query, w_key or v is NULL");
    if (w->normalize && !isfinite(w->g))
        return ai_fail(ATTN_ERR_VALUE, "weights.g is %g, expected a finite number", (double)w->g);
    p->q = q->data;  memcpy(p->q_s, q->stride, sizeof p->q_s);
    p->k = k->data;  memcpy(p->k_s, k->stride, sizeof p->k_s);
    p->val = val->data;  memcpy(p->val_s, val->stride, sizeof p->val_s);
    p->o = o->data;  memcpy(p->o_s, o->stride, sizeof p->o_s);
    p->w_query = w->w_query;
    p->w_key = w->w_key;
    p->v = w->v;
    p->bias = w->bias;
    p->normalize = w->normalize;
    p->g = w->g;
    if (p->m.path == ATTN_PATH_FUSED) {
        p->kern = ai_additive_select();
        if (!p->kern) return ai_fail(ATTN_ERR_UNSUPPORTED, "additive attention: no scoring "
                                     "kernel for the kernel '%s'", attn_kernel_name());
        if (strcmp(attn_blas_name(), "none") == 0)
            return ai_fail(ATTN_ERR_UNSUPPORTED, "additive attention: this build has no BLAS "
                           "for the projections (use ATTN_PATH_REFERENCE)");
    }
    return ATTN_OK;
}
