/*
 * backward.h — what the backward pass's parts share and users never see: the backward
 *              params (the forward's, extended by dO, LSE and the three gradients), the
 *              entry points of its two paths, and the float64 helpers the tests use to
 *              check gradients against finite differences.
 *
 * What it is not: a second place that validates arguments. attn_backward (backward.c)
 * fills attn_bwd_params once, through ai_params_init for everything the forward call
 * shares, and the paths trust it.
 */
#ifndef ATTN_BACKWARD_H
#define ATTN_BACKWARD_H

#include "core/attn_internal.h"

/* The forward params (q, k, v, o, masks, scale, softcap, path, threads ... exactly as in
 * the forward call; fwd.lse and fwd.weights are NULL) and what only the backward has. */
typedef struct attn_bwd_params {
    attn_params fwd;
    const float *d_o;  int64_t do_s[4];    /* (B, Hq,  Lq, Dv)  dLoss/dO            */
    const float *lse;  int64_t lse_s[3];   /* (B, Hq,  Lq)      the forward's LSE   */
    float *dq;         int64_t dq_s[4];    /* (B, Hq,  Lq, Dk)  written             */
    float *dk;         int64_t dk_s[4];    /* (B, Hkv, Lk, Dk)  written             */
    float *dv;         int64_t dv_s[4];    /* (B, Hkv, Lk, Dv)  written             */
    /* the sinks' gradient (options.d_sinks), written when not NULL; fwd.sinks is set */
    float *d_sinks;    int64_t d_sinks_s;  /* (Hq)                                  */
    /* the bias's gradient (options.d_bias), written when not NULL; fwd's bias was given.
     * d_bias_n: its shape (the bias's, 1 where it broadcasts), d_bias_s its strides.
     * d_bias_full: no dimension broadcast, so each logit's gradient is its own element.
     * The fused float32 path writes a full one, or one broadcast over the batch alone, in
     * place; otherwise the paths write every logit's into a [B, Hq, Lq, Lk] array of their
     * workspace, reduced by ai_d_bias_reduce after. */
    float *d_bias;     int64_t d_bias_s[4], d_bias_n[4];
    bool d_bias_full;
} attn_bwd_params;

/* Every element of d_bias: the sum, over the logits (b, h, i, j) it broadcasts to, of
 * g [B, Hq, Lq, Lk] (float, or double when f64), in the order b, h, i, j; summed in
 * double, rounded once. Parallel over d_bias's elements: the same bits for any thread
 * count. */
ATTN_PRIVATE void ai_d_bias_reduce(const attn_bwd_params *bp, const void *g, bool f64);
/* The bytes of the [B, Hq, Lq, Lk] array of elem-byte elements a broadcast d_bias needs
 * (0 without d_bias or when it is full); (size_t)-1 on overflow. */
ATTN_PRIVATE size_t ai_d_bias_scratch(const attn_bwd_params *bp, size_t elem);

/* The backward's rule of overlap.c: dq, dk, dv (t[5..7] of t = {q, k, v, o, d_o, dq, dk,
 * dv}), opt->d_sinks, opt->d_bias and the first ws_need bytes of opt->workspace share no byte with an
 * input (the first five, lse, the masks, the sinks) or each other; ATTN_ERR_STRIDE
 * otherwise. */
ATTN_PRIVATE attn_status ai_check_backward_aliasing(const attn_tensor *const t[8],
                                                    const attn_tensor *lse,
                                                    const attn_options *opt, size_t ws_need);

/* The paths. Each returns ATTN_OK (the workspace was sized by the matching function,
 * which returns (size_t)-1 when the size overflows). */
ATTN_PRIVATE size_t ai_fused_backward_workspace(const attn_bwd_params *bp);
ATTN_PRIVATE attn_status ai_fused_backward(const attn_bwd_params *bp, void *ws);
/* float64 q, k, v, o, d_o and gradients (backward_f64.c): the pointers of bp hold doubles */
ATTN_PRIVATE size_t ai_fused_f64_backward_workspace(const attn_bwd_params *bp);
ATTN_PRIVATE attn_status ai_fused_f64_backward(const attn_bwd_params *bp, void *ws);
ATTN_PRIVATE size_t ai_reference_backward_workspace(const attn_bwd_params *bp);
ATTN_PRIVATE attn_status ai_reference_backward(const attn_bwd_params *bp, void *ws);

/* ---- float64 helpers for the tests (reference_backward.c) -----------------------------
 * The reference's own arithmetic on dense float64 arrays, so that a test can perturb an
 * input by 1e-6 (impossible in float32) and difference the forward. The options (scale,
 * softcap, masks, bias, kv_len, ALiBi, alignment, window, threads) come from p, filled by
 * ai_params_init; p's data pointers are not read. Dense C order:
 *   q, dq [B, Hq, Lq, Dk]   k, dk [B, Hkv, Lk, Dk]   v, dv [B, Hkv, Lk, Dv]
 *   o, d_o [B, Hq, Lq, Dv]  lse [B, Hq, Lq] (may be NULL)
 * They allocate their scratch themselves: ATTN_OK or ATTN_ERR_NOMEM.
 * magnitudes: the backward's sums over absolute values instead, the normalizer of the
 * gradients' error bound (tests/support/backward_case.h): |dP_ij| = Σ_d |dO_id v_jd|,
 * |D_i| = Σ_j P_ij |dP_ij|, |dS_ij| = |scale| P_ij (|dP_ij| + |D_i|) (softcap's factor,
 * at most 1, taken as 1), then dQ, dK, dV over |K|, |Q|, |dO|. */
ATTN_PRIVATE attn_status ai_ref64_forward(const attn_params *p, const double *q,
                                          const double *k, const double *v, double *o,
                                          double *lse);
ATTN_PRIVATE attn_status ai_ref64_backward(const attn_params *p, const double *q,
                                           const double *k, const double *v,
                                           const double *d_o, double *dq, double *dk,
                                           double *dv, bool magnitudes);
/* The same, with the bias's gradient (or its magnitude) into d_bias, dense float64 of the
 * bias's shape d_bias_n (1 where it broadcasts); d_bias NULL: none */
ATTN_PRIVATE attn_status ai_ref64_backward_bias(const attn_params *p, const double *q,
                                                const double *k, const double *v,
                                                const double *d_o, double *dq, double *dk,
                                                double *dv, double *d_bias,
                                                const int64_t d_bias_n[4], bool magnitudes);

#endif /* ATTN_BACKWARD_H */
