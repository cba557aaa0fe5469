/*
 * backward.c — the backward pass's entry points: attn_backward and its workspace query,
 *               the argument checks beyond the forward's, the choice of path (the float64
 *               reference, reference_backward.c, the fused one, backward_fused.c, or the
 *               fused float64 one, backward_f64.c), and
 *               16-bit tensors, which take the float32 path on float32 copies
 *               (backward_half, below).
 *
 * What it is not: the fused path's arithmetic (backward_fused.c) or a gradient for the
 * ALiBi slopes or the mask (constants here). The bias's gradient (options.d_bias) is
 * formed by the paths, tile by tile; its reduction over broadcast dimensions is
 * d_bias.c's.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "backward.h"
#include "forward/mask_summary.h"
#include "core/half.h"

/* ---- argument checks ------------------------------------------------------------------
 * ai_params_init (params.c) checks q, k, v, o and the options exactly as the forward call
 * does; what follows checks the tensors only the backward has. */

/* d_o, lse and the gradients: sound (ai_check_tensor), of the expected shape. */
static attn_status check_extra(const attn_tensor *t, const char *name, const int64_t want[4],
                             const char *const what[4], bool f64, bool need_data) {
    /* a float64 call (q float64): d_o and the gradients float64, the LSE float32 or
     * float64 (CONTRACT "float64") */
    const bool is_lse = strcmp(name, "lse") == 0;
    const attn_dtype dt = is_lse ? (f64 && t && t->dtype == ATTN_F64 ? ATTN_F64 : ATTN_F32)
                                 : (f64 ? ATTN_F64 : ATTN_DTYPE_COUNT);
    TRY(ai_check_tensor(t, name, dt, need_data));
    for (int d = 0; d < 4; d++)
        if (t->shape[d] != want[d])
            return ai_fail(ATTN_ERR_SHAPE, "%s: shape[%d] (%s) is %lld, expected %lld", name,
                           d, what[d], (long long)t->shape[d], (long long)want[d]);
    return ATTN_OK;
}



/* Fills *bp from the public arguments; the one place the backward params are set. */
static attn_status bwd_params_init(attn_bwd_params *bp, const attn_tensor *q,
                                   const attn_tensor *k, const attn_tensor *v,
                                   const attn_tensor *o, const attn_tensor *d_o,
                                   const attn_tensor *lse, const attn_tensor *dq,
                                   const attn_tensor *dk, const attn_tensor *dv,
                                   const attn_options *opt, bool need_data,
                                   const attn_tune_config *force) {
    *bp = (attn_bwd_params){0};
    if (opt && opt->block_table)  // paged caches: forward only (CONTRACT, "A paged KV cache")
        return ai_fail(ATTN_ERR_UNSUPPORTED, "attn_backward: options.block_table (a paged "
                       "cache) is forward only");
    if (opt && (opt->lse || opt->weights))
        return ai_fail(ATTN_ERR_VALUE, "options.%s must be NULL in attn_backward (the "
                       "forward's LSE is the lse argument)", opt->lse ? "lse" : "weights");
    attn_params *p = &bp->fwd;
    /* the forward's checks, without d_sinks (the forward's filler refuses it) */
    attn_options fo = opt ? *opt : (attn_options){0};
    fo.d_sinks = NULL;
    fo.d_bias = NULL;
    TRY(ai_params_init_for(p, q, k, v, o, &fo, need_data, true, force));
    if (attn_is_block_dtype(p->kv_dt) || p->kv_dt == ATTN_FP8_E4M3 || p->kv_dt == ATTN_FP8_E5M2)
        /* the forward-only cache dtypes: no gradient path reads them */
        return ai_fail(ATTN_ERR_DTYPE, "k, v: %s is a forward-only KV cache dtype; the "
                       "backward takes float32, float16 or bfloat16",
                       attn_dtype_name(p->kv_dt));
    const bool f64 = p->q_dt == ATTN_F64;
    if (!f64)
        for (int x = 0; x < 4; x++) {
            const attn_tensor *t = (const attn_tensor *[]){d_o, dq, dk, dv}[x];
            if (t && t->dtype == ATTN_F64)
                return ai_fail(ATTN_ERR_DTYPE, "%s: dtype float64 under %s q: float64 needs "
                               "q, k, v, o, d_o and the gradients all float64",
                               (const char *[]){"d_o", "dq", "dk", "dv"}[x],
                               attn_dtype_name(p->q_dt));
        }

    static const char *const q_dims[4] = {"B", "Hq", "Lq", "Dv"};
    static const char *const l_dims[4] = {"B", "Hq", "Lq", "1"};
    static const char *const dq_dims[4] = {"B", "Hq", "Lq", "Dk"};
    static const char *const dk_dims[4] = {"B", "Hkv", "Lk", "Dk"};
    static const char *const dv_dims[4] = {"B", "Hkv", "Lk", "Dv"};
    TRY(check_extra(d_o, "d_o", (const int64_t[4]){p->B, p->Hq, p->Lq, p->Dv}, q_dims, f64, need_data));
    TRY(check_extra(lse, "lse", (const int64_t[4]){p->B, p->Hq, p->Lq, 1}, l_dims, f64, need_data));
    TRY(check_extra(dq, "dq", (const int64_t[4]){p->B, p->Hq, p->Lq, p->Dk}, dq_dims, f64, need_data));
    TRY(check_extra(dk, "dk", (const int64_t[4]){p->B, p->Hkv, p->Lk, p->Dk}, dk_dims, f64, need_data));
    TRY(check_extra(dv, "dv", (const int64_t[4]){p->B, p->Hkv, p->Lk, p->Dv}, dv_dims, f64, need_data));
    TRY(ai_check_output_strides(dq, "dq", 4));
    TRY(ai_check_output_strides(dk, "dk", 4));
    TRY(ai_check_output_strides(dv, "dv", 4));
    if (opt && opt->d_sinks) {
        const attn_tensor *t = opt->d_sinks;
        if (!opt->sinks)
            return ai_fail(ATTN_ERR_VALUE, "options.d_sinks is given without options.sinks "
                           "(there is no sink to differentiate)");
        TRY(ai_check_tensor(t, "d_sinks", ATTN_F32, need_data));
        if (t->shape[0] != p->Hq || t->shape[1] != 1 || t->shape[2] != 1 || t->shape[3] != 1)
            return ai_fail(ATTN_ERR_SHAPE, "d_sinks: shape [%lld, %lld, %lld, %lld], "
                           "expected [Hq = %lld, 1, 1, 1]", (long long)t->shape[0],
                           (long long)t->shape[1], (long long)t->shape[2],
                           (long long)t->shape[3], (long long)p->Hq);
        TRY(ai_check_output_strides(t, "d_sinks", 1));
        bp->d_sinks = (float *)ai_view_data(t, &bp->d_sinks_s, 1);
    }

    if (opt && opt->score_mod && !opt->score_mod_grad)
        return ai_fail(ATTN_ERR_VALUE, "options.score_mod is given without score_mod_grad, "
                       "its derivative, which attn_backward needs");
    if (opt && opt->d_bias) {
        const attn_tensor *t = opt->d_bias, *bias = opt->bias;
        if (!bias)
            return ai_fail(ATTN_ERR_VALUE, "options.d_bias is given without options.bias "
                           "(there is no bias to differentiate)");
        TRY(ai_check_tensor(t, "d_bias", ATTN_F32, need_data));
        for (int d = 0; d < 4; d++)
            if (t->shape[d] != bias->shape[d])
                return ai_fail(ATTN_ERR_SHAPE, "d_bias: shape[%d] is %lld, expected %lld "
                               "(the bias's shape)", d, (long long)t->shape[d],
                               (long long)bias->shape[d]);
        TRY(ai_check_output_strides(t, "d_bias", 4));
        bp->d_bias = (float *)ai_view_data(t, bp->d_bias_s, 4);
        const int64_t full[4] = {p->B, p->Hq, p->Lq, p->Lk};
        bp->d_bias_full = true;
        for (int d = 0; d < 4; d++) {
            bp->d_bias_n[d] = t->shape[d];
            bp->d_bias_full &= t->shape[d] == full[d];
        }
    }

    bp->d_o = ai_view_data(d_o, bp->do_s, 4);
    bp->lse = ai_view_data(lse, bp->lse_s, 3);
    bp->dq = (float *)ai_view_data(dq, bp->dq_s, 4);
    bp->dk = (float *)ai_view_data(dk, bp->dk_s, 4);
    bp->dv = (float *)ai_view_data(dv, bp->dv_s, 4);
    return ATTN_OK;
}

/* The path a backward call takes: the reference when it is asked for, else the fused
 * one of the call's dtype (float64: backward_f64.c, float64 throughout, memory
 * independent of Lk; CONTRACT "float64"). */
static bool bwd_reference(const attn_bwd_params *bp) {
    return bp->fwd.path == ATTN_PATH_REFERENCE;
}

/* the key lengths of ai_key_padding (mask_summary.h), after the path's bytes */
static size_t bwd_padding_bytes(const attn_bwd_params *bp) {
    return bwd_reference(bp) ? 0 : ai_key_padding_bytes(&bp->fwd);
}

static size_t bwd_workspace(const attn_bwd_params *bp) {
    const size_t path = bwd_reference(bp)             ? ai_reference_backward_workspace(bp)
                        : bp->fwd.q_dt == ATTN_F64 ? ai_fused_f64_backward_workspace(bp)
                                                       : ai_fused_backward_workspace(bp);
    const size_t pad = bwd_padding_bytes(bp);
    return path == (size_t)-1 || path > SIZE_MAX - pad ? (size_t)-1 : path + pad;
}

/* ---- 16-bit tensors ---------------------------------------------------------------------
 * q, k, v, o, d_o and the gradients may each be float16 or bfloat16 (k and v alike, as in
 * the forward). Such a call runs the float32 path on dense float32 copies: the inputs are
 * widened once (exactly), the gradients are accumulated in float32 and rounded once to
 * their own dtype (to nearest, ties to even). The extra memory is the copies,
 * (Lq (2 Dk + 2 Dv) per query head + Lk (2 Dk + 2 Dv) per key head) floats: never
 * Lq x Lk. The LSE stays float32, as the forward writes it.
 * A 16-bit O is not used: the backward's row sums D = dO · O would inherit its rounding,
 * which can dominate dQ and dK where they are small next to |dO| |O| (several times the
 * error of a naive 16-bit backward). O and its LSE are recomputed instead, by the forward
 * on the 16-bit Q, K, V themselves with a float32 output: the very float32 O (before its
 * rounding) and LSE the caller's forward computed, on every kernel (a forward on the
 * float32 copies would take float32 tiles where the 16-bit call took bf16 dot products:
 * other last bits, so the gradients would depend on which O the caller kept). One forward
 * pass; its workspace is allocated by that call. */
enum { H_Q, H_K, H_V, H_O, H_DO, H_DQ, H_DK, H_DV, H_N };

static bool is_half(const attn_tensor *t) {
    return t && (t->dtype == ATTN_F16 || t->dtype == ATTN_BF16);
}

/* Every element of src (any float dtype, any strides) into dst, through float. */
static void copy_tensor(const attn_tensor *src, const attn_tensor *dst) {
    const int64_t *n = src->shape, *ss = src->stride, *ds = dst->stride;
    for (int64_t a = 0; a < n[0]; a++)
        for (int64_t b = 0; b < n[1]; b++)
            for (int64_t c = 0; c < n[2]; c++)
                for (int64_t x = 0; x < n[3]; x++)
                    attn_store(dst->dtype, dst->data, a * ds[0] + b * ds[1] + c * ds[2] + x * ds[3],
                               attn_load(src->dtype, src->data,
                                         a * ss[0] + b * ss[1] + c * ss[2] + x * ss[3]));
}

/* Checks a 16-bit call (the tensors' dtypes here, the rest through bwd_params_init on
 * float32 stand-ins with the same shapes, strides and pointers), and lays out the dense
 * float32 copies: dense[i] with data = its byte offset (held as a pointer, rebased onto
 * the workspace later), *copy_bytes their total, *inner the float32 call's own workspace. */
static attn_status half_plan(const attn_tensor *const t[H_N], const attn_tensor *lse,
                             const attn_options *opt, bool need_data, attn_tensor dense[H_N + 1],
                             size_t *copy_bytes, size_t *inner) {
    static const char *const names[H_N] = {"q", "k", "v", "o", "d_o", "dq", "dk", "dv"};
    attn_tensor shadow[H_N];
    for (int i = 0; i < H_N; i++) {
        if (!t[i]) return ai_fail(ATTN_ERR_NULL, "%s: tensor pointer is NULL", names[i]);
        if (t[i]->dtype != ATTN_F32 && !is_half(t[i]))
            return ai_fail(ATTN_ERR_DTYPE, "%s: dtype %s, expected float32, float16 or "
                           "bfloat16", names[i], attn_dtype_name(t[i]->dtype));
        shadow[i] = *t[i];
        shadow[i].dtype = ATTN_F32;
        /* a 16-bit tensor is 2-byte aligned, a float32 stand-in must be 4: the stand-in
         * only has to say whether there is data (the real pointers' checks are below) */
        static _Alignas(8) const float g_any;
        if (shadow[i].data) shadow[i].data = (void *)(uintptr_t)&g_any;
    }
    if (t[H_K]->dtype != t[H_V]->dtype)
        return ai_fail(ATTN_ERR_DTYPE, "v: dtype %s, expected %s like k (k and v must have "
                       "one dtype)", attn_dtype_name(t[H_V]->dtype), attn_dtype_name(t[H_K]->dtype));
    attn_bwd_params bp;
    TRY(bwd_params_init(&bp, &shadow[H_Q], &shadow[H_K], &shadow[H_V], &shadow[H_O],
                        &shadow[H_DO], lse, &shadow[H_DQ], &shadow[H_DK], &shadow[H_DV], opt,
                        need_data, NULL));
    size_t at = 0;
    for (int i = 0; i < H_N; i++) {
        const int64_t *n = t[i]->shape;
        dense[i] = attn_tensor_4d((void *)(uintptr_t)at, ATTN_F32, n[0], n[1], n[2], n[3]);
        at += ((size_t)(n[0] * n[1] * n[2] * n[3]) * sizeof(float) + 63) & ~(size_t)63;
    }
    /* the recomputed LSE of a 16-bit O, after the copies */
    dense[H_N] = attn_tensor_4d((void *)(uintptr_t)at, ATTN_F32, lse->shape[0], lse->shape[1],
                                lse->shape[2], 1);
    at += ((size_t)(lse->shape[0] * lse->shape[1] * lse->shape[2]) * sizeof(float) + 63) & ~(size_t)63;
    *copy_bytes = at;
    attn_options o = opt ? *opt : (attn_options){0};
    o.workspace = NULL;
    return attn_backward_workspace_size(&dense[H_Q], &dense[H_K], &dense[H_V], &dense[H_O],
                                        &dense[H_DO], lse, &dense[H_DQ], &dense[H_DK],
                                        &dense[H_DV], &o, inner);
}

static attn_status backward_half(const attn_tensor *const t[H_N], const attn_tensor *lse,
                                 const attn_options *opt, const attn_drop_layout *drop) {
    attn_tensor dense[H_N + 1];
    size_t copies, inner;
    TRY(half_plan(t, lse, opt, true, dense, &copies, &inner));
    TRY(ai_check_backward_aliasing(t, lse, opt, copies + inner + 64));
    void *ws, *owned;
    TRY(ai_workspace_acquire(opt, copies + inner + 64, &ws, &owned));
    char *base = (char *)(((uintptr_t)ws + 63) & ~(uintptr_t)63);
    for (int i = 0; i <= H_N; i++) dense[i].data = base + (uintptr_t)dense[i].data;
    for (int i = H_Q; i <= H_DO; i++)
        if (i != H_O || !is_half(t[H_O])) copy_tensor(t[i], &dense[i]);
    attn_options o = opt ? *opt : (attn_options){0};
    attn_status st = ATTN_OK;
    const attn_tensor *lse_used = lse;
    if (is_half(t[H_O])) {  // O and its LSE again, in float32 (see above)
        attn_options f = o;
        f.workspace = NULL;
        f.workspace_bytes = 0;
        f.d_sinks = NULL;  // the backward's outputs
        f.d_bias = NULL;
        f.lse = &dense[H_N];
        st = ai_forward_piece(t[H_Q], t[H_K], t[H_V], &dense[H_O], &f, drop);
        lse_used = &dense[H_N];
    }
    o.workspace = inner ? base + copies : NULL;
    o.workspace_bytes = inner;
    if (st == ATTN_OK)
        st = ai_backward_piece(&dense[H_Q], &dense[H_K], &dense[H_V], &dense[H_O],
                               &dense[H_DO], lse_used, &dense[H_DQ], &dense[H_DK],
                               &dense[H_DV], &o, drop);
    if (st == ATTN_OK)
        for (int i = H_DQ; i <= H_DV; i++) copy_tensor(&dense[i], t[i]);
    ai_free(owned);
    return st;
}

/* the entries of an array (the inputs and outputs below, each with its name) */
#define COUNT(a) ((int)(sizeof(a) / sizeof *(a)))

/* the backward's lists for the overlap rule (core/overlap.c) */
attn_status ai_check_backward_aliasing(const attn_tensor *const t[8], const attn_tensor *lse,
                                       const attn_options *opt, size_t ws_need) {
    static const char *const in_names[] = {"q", "k", "v", "o", "d_o", "lse", "mask", "bias",
                                           "kv_len", "alibi_slopes", "sinks"};
    static const char *const out_names[] = {"dq", "dk", "dv", "d_sinks", "d_bias"};
    const attn_tensor *in[] = {t[0], t[1], t[2], t[3], t[4], lse,
                               opt ? opt->mask : NULL, opt ? opt->bias : NULL,
                               opt ? opt->kv_len : NULL, opt ? opt->alibi_slopes : NULL,
                               opt ? opt->sinks : NULL};
    const attn_tensor *out[] = {t[5], t[6], t[7], opt ? opt->d_sinks : NULL,
                                opt ? opt->d_bias : NULL};
    return ai_check_aliasing(in, in_names, COUNT(in), out, out_names, COUNT(out), opt, ws_need);
}

attn_status attn_backward_workspace_size(const attn_tensor *q, const attn_tensor *k,
                                         const attn_tensor *v, const attn_tensor *o,
                                         const attn_tensor *d_o, const attn_tensor *lse,
                                         const attn_tensor *dq, const attn_tensor *dk,
                                         const attn_tensor *dv, const attn_options *opt,
                                         size_t *bytes) {
    attn_bwd_params bp;
    if (!bytes) return ai_fail(ATTN_ERR_NULL, "bytes: NULL output pointer");
    const attn_tensor *const t[H_N] = {q, k, v, o, d_o, dq, dk, dv};
    bool half = false;
    for (int i = 0; i < H_N; i++) half |= is_half(t[i]);
    if (half) {
        attn_tensor dense[H_N + 1];
        size_t copies, inner;
        TRY(half_plan(t, lse, opt, false, dense, &copies, &inner));
        *bytes = copies + inner + 64;
        ai_fail(ATTN_OK, "%s", "");
        return ATTN_OK;
    }
    TRY(bwd_params_init(&bp, q, k, v, o, d_o, lse, dq, dk, dv, opt, false, NULL));
    const size_t n = bwd_workspace(&bp);
    if (n == (size_t)-1) return ai_fail(ATTN_ERR_OVERFLOW, "workspace size overflows size_t");
    *bytes = n;
    ai_fail(ATTN_OK, "%s", "");
    return ATTN_OK;
}

attn_status attn_backward(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                          const attn_tensor *o, const attn_tensor *d_o, const attn_tensor *lse,
                          const attn_tensor *dq, const attn_tensor *dk, const attn_tensor *dv,
                          const attn_options *opt) {
    return ai_backward_piece(q, k, v, o, d_o, lse, dq, dk, dv, opt, NULL);
}

attn_status ai_backward_piece(const attn_tensor *q, const attn_tensor *k,
                              const attn_tensor *v, const attn_tensor *o,
                              const attn_tensor *d_o, const attn_tensor *lse,
                              const attn_tensor *dq, const attn_tensor *dk,
                              const attn_tensor *dv, const attn_options *opt,
                              const attn_drop_layout *drop) {
    attn_bwd_params bp;
    const attn_tensor *const t[H_N] = {q, k, v, o, d_o, dq, dk, dv};
    for (int i = 0; i < H_N; i++)
        if (is_half(t[i])) return backward_half(t, lse, opt, drop);
    TRY(bwd_params_init(&bp, q, k, v, o, d_o, lse, dq, dk, dv, opt, true, NULL));
    attn_set_drop_layout(&bp.fwd, drop);
    const size_t need = bwd_workspace(&bp);
    TRY(ai_check_backward_aliasing(t, lse, opt, need == (size_t)-1 ? 0 : need));
    ai_fail(ATTN_OK, "%s", "");
    /* Empty sizes need no special case: with Lq = 0 (or Hq = 0) no row reads a key and
     * dk, dv are written as 0; with Lk = 0 every row is fully masked and dq is 0. */
    void *ws, *owned;
    TRY(ai_workspace_acquire(opt, need, &ws, &owned));
    /* key padding runs as the key lengths it is, on the fused paths (mask_summary.h) */
    const size_t pad = bwd_padding_bytes(&bp);
    attn_bwd_params padded = bp;
    if (pad && ai_key_padding(&bp.fwd, (char *)ws + (need - pad), &padded.fwd) == &padded.fwd)
        bp = padded;
    const attn_status st = bwd_reference(&bp)          ? ai_reference_backward(&bp, ws)
                           : bp.fwd.q_dt == ATTN_F64 ? ai_fused_f64_backward(&bp, ws)
                                                     : ai_fused_backward(&bp, ws);
    ai_free(owned);
    return st;
}

attn_status ai_backward_forced_workspace_size(const attn_tune_config *force,
                                              const attn_tensor *q, const attn_tensor *k,
                                              const attn_tensor *v, const attn_tensor *o,
                                              const attn_tensor *d_o, const attn_tensor *lse,
                                              const attn_tensor *dq, const attn_tensor *dk,
                                              const attn_tensor *dv, const attn_options *opt,
                                              size_t *bytes) {
    attn_bwd_params bp;
    TRY(bwd_params_init(&bp, q, k, v, o, d_o, lse, dq, dk, dv, opt, false, force));
    *bytes = bwd_workspace(&bp);
    if (*bytes == (size_t)-1) return ai_fail(ATTN_ERR_OVERFLOW, "workspace size overflows size_t");
    return ai_ok();
}

attn_status ai_backward_forced(const attn_tune_config *force, const attn_tensor *q,
                               const attn_tensor *k, const attn_tensor *v,
                               const attn_tensor *o, const attn_tensor *d_o,
                               const attn_tensor *lse, const attn_tensor *dq,
                               const attn_tensor *dk, const attn_tensor *dv,
                               const attn_options *opt) {
    attn_bwd_params bp;
    TRY(bwd_params_init(&bp, q, k, v, o, d_o, lse, dq, dk, dv, opt, true, force));
    if (bwd_reference(&bp) || bp.fwd.q_dt == ATTN_F64 || bwd_padding_bytes(&bp) != 0)
        return ai_fail(ATTN_ERR_UNSUPPORTED, "ai_backward_forced: float32 fused calls "
                       "without key padding only");
    const size_t need = bwd_workspace(&bp);
    if (need == (size_t)-1) return ai_fail(ATTN_ERR_OVERFLOW, "workspace size overflows size_t");
    void *ws, *owned;
    TRY(ai_workspace_acquire(opt, need, &ws, &owned));
    const attn_status st = ai_fused_backward(&bp, ws);
    ai_free(owned);
    return st;
}
