/*
 * params.c — the one place that fills attn_params from the public arguments
 *            (ai_params_init, attn_internal.h), in the order of its parts: the four
 *            tensors and the cache's layout, the logits' options (scale, softcap, causal,
 *            window), the masks, the optional outputs, and how the call runs (precision,
 *            dropout, path, threads). Each part checks what it fills; the paths trust it.
 */
#include <math.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/half.h"
#include "core/pages.h"
#include "core/philox.h"
#include "kernels/kernels.h"
#include "kernels/wisdom.h"

/* A size query (need_data false) may pass tensors without data. What a call asks for
 * must still shape its plan and workspace (weights, a block table, a mask or bias to
 * summarize), so a given tensor's pointer is never NULL in the params: without data it
 * is this placeholder, which nothing reads or writes (a size query touches no data). */
static _Alignas(64) char size_query_placeholder[64];
static void *given(const void *data) { return data ? (void *)data : size_query_placeholder; }


static attn_status expect_dim(const attn_tensor *t, const char *name, int d, int64_t want,
                              const char *what) {
    if (t->shape[d] != want)
        return ai_fail(ATTN_ERR_SHAPE, "%s: shape[%d] (%s) is %lld, expected %lld", name, d, what,
                    (long long)t->shape[d], (long long)want);
    return ATTN_OK;
}

/* A mask or bias: each dimension is 1 (broadcast) or the score's size. */
static attn_status check_broadcast(const attn_tensor *t, const char *name,
                                   const int64_t full[4], int64_t out_stride[4]) {
    static const char *const dim_names[4] = {"B", "Hq", "Lq", "Lk"};
    for (int d = 0; d < 4; d++) {
        if (t->shape[d] != full[d] && t->shape[d] != 1)
            return ai_fail(ATTN_ERR_MASK, "%s: shape[%d] is %lld, expected 1 or %s = %lld", name,
                        d, (long long)t->shape[d], dim_names[d], (long long)full[d]);
        out_stride[d] = t->shape[d] == 1 ? 0 : t->stride[d];
    }
    return ATTN_OK;
}

/* A per-head vector (ALiBi slopes, sinks): float32, shape [Hq, 1, 1, 1]. */
static attn_status head_vector(const attn_tensor *t, const char *name, int64_t Hq,
                               bool need_data) {
    TRY(ai_check_tensor(t, name, ATTN_F32, need_data));
    if (t->shape[0] != Hq || t->shape[1] != 1 || t->shape[2] != 1 || t->shape[3] != 1)
        return ai_fail(ATTN_ERR_SHAPE, "%s: shape [%lld, %lld, %lld, %lld], expected [Hq = "
                       "%lld, 1, 1, 1]", name, (long long)t->shape[0], (long long)t->shape[1],
                       (long long)t->shape[2], (long long)t->shape[3], (long long)Hq);
    return ATTN_OK;
}

/* q, k, v, o: dtypes (float64 never mixed; k and v alike, q8_0 only for them), shapes
 * (contiguous or paged K and V), heads, and the views */
static attn_status fill_tensors(attn_params *p, const attn_tensor *q, const attn_tensor *k,
                                const attn_tensor *v, const attn_tensor *o,
                                const attn_options *opt, bool need_data) {
    /* float64 (CONTRACT "float64"): q, k, v and o all float64, never mixed with the other
     * floating types (a float64 call accumulates in float64 on a path of its own) */
    const bool f64 = q && q->dtype == ATTN_F64;
    if (!f64) {
        const attn_tensor *const qkvo[4] = {q, k, v, o};
        static const char *const names[4] = {"q", "k", "v", "o"};
        for (int x = 1; x < 4; x++)
            if (qkvo[x] && qkvo[x]->dtype == ATTN_F64 && q)
                return ai_fail(ATTN_ERR_DTYPE, "%s: dtype is float64 but q is %s: float64 "
                               "needs q, k, v and o all float64", names[x],
                               attn_dtype_name(q->dtype));
    }
    /* ATTN_DTYPE_COUNT here: any of float32, float16, bfloat16; k and v may instead both
     * be q8_0, q4_0, u4 or one fp8 dtype (the only inputs that may), under queries of those three */
    const attn_dtype want = f64 ? ATTN_F64 : ATTN_DTYPE_COUNT;
    TRY(ai_check_tensor(q, "q", want, need_data));
    const bool cache_dt = k && (attn_is_block_dtype(k->dtype) || k->dtype == ATTN_FP8_E4M3 ||
                                k->dtype == ATTN_FP8_E5M2);
    TRY(ai_check_tensor(k, "k", !f64 && cache_dt ? k->dtype : want, need_data));
    if (v && v->dtype != k->dtype)
        return ai_fail(ATTN_ERR_DTYPE, "v: dtype is %s, expected %s like k (k and v must "
                       "have one dtype)", attn_dtype_name(v->dtype), attn_dtype_name(k->dtype));
    TRY(ai_check_tensor(v, "v", k->dtype, need_data));
    TRY(ai_check_tensor(o, "o", want, need_data));
    p->q_dt = q->dtype;
    p->kv_dt = k->dtype;
    p->o_dt = o->dtype;

    p->B = q->shape[0];
    p->Hq = q->shape[1];
    p->Lq = q->shape[2];
    p->Dk = q->shape[3];
    p->Hkv = k->shape[1];
    p->Lk = k->shape[2];
    p->Dv = v->shape[3];

    if (opt->block_table && p->q_dt == ATTN_F64)  // fused_f64.c reads contiguous K and V
        return ai_fail(ATTN_ERR_UNSUPPORTED, "block_table: float64 calls take a contiguous "
                       "cache (the paged one is float32, float16, bfloat16 or q8_0)");
    if (opt->block_table) {  // page pools: [num_pages, Hkv, page_size, D] (core/pages.h)
        ai_pages pg;
        TRY(ai_pages_init(&pg, opt->block_table, "block_table", p->B, k->shape[0], k->shape[2],
                          need_data));
        p->num_pages = pg.num_pages;
        p->page_size = pg.page_size;
        p->Lk = pg.rows;
        TRY(expect_dim(v, "v", 0, p->num_pages, "num_pages, as k"));
        TRY(expect_dim(v, "v", 2, p->page_size, "page_size, as k"));
        p->block_table = given(pg.bt);
        memcpy(p->bt_s, pg.bt_s, sizeof p->bt_s);
    } else {
        TRY(expect_dim(k, "k", 0, p->B, "B, as q"));
        TRY(expect_dim(v, "v", 0, p->B, "B, as q"));
        TRY(expect_dim(v, "v", 2, p->Lk, "Lk, as k"));
    }
    TRY(expect_dim(k, "k", 3, p->Dk, "Dk, as q"));
    TRY(expect_dim(v, "v", 1, p->Hkv, "Hkv, as k"));
    TRY(expect_dim(o, "o", 0, p->B, "B, as q"));
    TRY(expect_dim(o, "o", 1, p->Hq, "Hq, as q"));
    TRY(expect_dim(o, "o", 2, p->Lq, "Lq, as q"));
    TRY(expect_dim(o, "o", 3, p->Dv, "Dv, as v"));
    TRY(ai_check_output_strides(o, "o", 4));

    if (p->Hkv == 0 ? p->Hq != 0 : p->Hq % p->Hkv != 0)
        return ai_fail(ATTN_ERR_HEADS, "q: Hq = %lld is not a multiple of k's Hkv = %lld",
                    (long long)p->Hq, (long long)p->Hkv);
    p->group = p->Hkv ? p->Hq / p->Hkv : 1;

    /* an fp8 cache's scales: per tensor or per key/value head; a u4 cache's scales and
     * zeros (u4.c), which also refuses k_zero, v_zero and kv_group with another dtype */
    if (p->kv_dt != ATTN_U4) {
        TRY(ai_check_kv_scale(opt->k_scale, "k_scale", p->kv_dt, p->Hkv, need_data,
                              &p->k_scale, &p->k_scale_s));
        TRY(ai_check_kv_scale(opt->v_scale, "v_scale", p->kv_dt, p->Hkv, need_data,
                              &p->v_scale, &p->v_scale_s));
    } else {
        p->k_scale = p->v_scale = NULL;  // the fp8 scales: 1 (the u4 ones are apart)
        p->k_scale_s = p->v_scale_s = 0;
    }
    TRY(ai_u4_fill(p, opt, need_data));
    p->kv_scale_folds = true;
    for (int64_t g = 0; need_data && p->kv_dt == ATTN_FP8_E4M3 && g < p->Hkv; g++)
        if (attn_kv_scale(p->k_scale, p->k_scale_s, g) > 0x1p100f ||
            attn_kv_scale(p->v_scale, p->v_scale_s, g) > 0x1p100f)
            p->kv_scale_folds = false;

    p->q = ai_view_data(q, p->q_s, 4);
    p->k = ai_view_data(k, p->k_s, 4);
    p->v = ai_view_data(v, p->v_s, 4);
    p->o = (void *)ai_view_data(o, p->o_s, 4);
    return ATTN_OK;
}

/* scale (float32, and float64 for a float64 call), softcap, causal, alignment, window */
static attn_status fill_logits(attn_params *p, const attn_options *opt) {
    const bool f64 = p->q_dt == ATTN_F64;
    if (opt->has_scale) {
        if (!isfinite(opt->scale))
            return ai_fail(ATTN_ERR_VALUE, "options.scale is %g, expected a finite number",
                        (double)opt->scale);
        p->scale = opt->scale;
    } else {
        /* An empty dot product (Dk = 0) is 0; its default scale is taken as 1 so that the
         * logits are 0, not inf * 0. */
        p->scale = p->Dk > 0 ? (float)(1.0 / sqrt((double)p->Dk)) : 1.0f;
    }
    p->scale64 = (double)p->scale;
    if (f64) {
        if (opt->has_scale && opt->scale_f64 != 0.0) {
            if (!isfinite(opt->scale_f64))
                return ai_fail(ATTN_ERR_VALUE, "options.scale_f64 is %g, expected a finite "
                               "number", opt->scale_f64);
            p->scale64 = opt->scale_f64;
        } else if (!opt->has_scale) {
            p->scale64 = p->Dk > 0 ? 1.0 / sqrt((double)p->Dk) : 1.0;
        }
    }
    if (!(opt->softcap >= 0.0f) || isinf(opt->softcap))
        return ai_fail(ATTN_ERR_VALUE, "options.softcap is %g, expected 0 (off) or a finite "
                    "positive number", (double)opt->softcap);
    p->softcap = opt->softcap;

    /* causal, alignment, window */
    if ((unsigned)opt->align > (unsigned)ATTN_ALIGN_BOTTOM_RIGHT)
        return ai_fail(ATTN_ERR_VALUE, "options.align is %d, expected ATTN_ALIGN_TOP_LEFT or "
                    "ATTN_ALIGN_BOTTOM_RIGHT", (int)opt->align);
    p->causal = opt->causal;
    p->align = opt->align;
    p->win_left = p->win_right = -1;
    if (opt->has_window) {
        if (opt->window_left < -1 || opt->window_right < -1)
            return ai_fail(ATTN_ERR_VALUE, "options.window = (%lld, %lld), expected each >= -1 "
                        "(-1 = unbounded)", (long long)opt->window_left,
                        (long long)opt->window_right);
        p->win_left = opt->window_left;
        p->win_right = opt->window_right;
    }
    return ATTN_OK;
}

/* the bool mask and the bias (broadcast), key lengths, the block table's entries, ALiBi
 * slopes and sinks */
static attn_status fill_masks(attn_params *p, const attn_options *opt, bool need_data) {
    const int64_t full[4] = {p->B, p->Hq, p->Lq, p->Lk};
    if (opt->mask) {
        TRY(ai_check_tensor(opt->mask, "mask", ATTN_BOOL, need_data));
        TRY(check_broadcast(opt->mask, "mask", full, p->mask_s));
        int64_t unused[4];
        p->mask = ai_view_data(opt->mask, unused, 4);
        if (p->mask != opt->mask->data) memset(p->mask_s, 0, sizeof p->mask_s);
        p->mask = given(p->mask);
    }
    if (opt->bias) {
        TRY(ai_check_tensor(opt->bias, "bias", ATTN_F32, need_data));
        TRY(check_broadcast(opt->bias, "bias", full, p->bias_s));
        int64_t unused[4];
        p->bias = ai_view_data(opt->bias, unused, 4);
        if ((const void *)p->bias != opt->bias->data) memset(p->bias_s, 0, sizeof p->bias_s);
        p->bias = given(p->bias);
    }
    if (opt->kv_len) {
        const attn_tensor *t = opt->kv_len;
        if (!t) return ai_fail(ATTN_ERR_NULL, "kv_len: NULL");
        attn_dtype dt = t->dtype == ATTN_I32 ? ATTN_I32 : ATTN_I64;
        TRY(ai_check_tensor(t, "kv_len", dt, need_data));
        if (t->shape[0] != p->B || t->shape[1] != 1 || t->shape[2] != 1 || t->shape[3] != 1)
            return ai_fail(ATTN_ERR_SHAPE, "kv_len: shape [%lld, %lld, %lld, %lld], expected "
                        "[B = %lld, 1, 1, 1]", (long long)t->shape[0], (long long)t->shape[1],
                        (long long)t->shape[2], (long long)t->shape[3], (long long)p->B);
        p->kv_len = ai_view_data(t, &p->kv_len_s, 1);
        p->kv_len_dtype = dt;
        for (int64_t b = 0; need_data && b < p->B; b++) {
            int64_t len = attn_key_len(p, b);
            if (len < 0 || len > p->Lk)
                return ai_fail(ATTN_ERR_VALUE, "kv_len[%lld] = %lld, expected 0 <= kv_len <= "
                            "Lk = %lld", (long long)b, (long long)len, (long long)p->Lk);
        }
    }
    /* the table entries of the pages that hold valid keys, and no other: an entry past
     * them (-1, garbage) is never read */
    for (int64_t b = 0; need_data && p->block_table && b < p->B; b++) {
        const ai_pages pg = {.bt = p->block_table, .bt_s = {p->bt_s[0], p->bt_s[1]},
                             .num_pages = p->num_pages, .page_size = p->page_size};
        TRY(ai_pages_check(&pg, "block_table", b, 0, attn_key_len(p, b)));
    }
    if (opt->alibi_slopes) {
        TRY(head_vector(opt->alibi_slopes, "alibi_slopes", p->Hq, need_data));
        p->alibi = ai_view_data(opt->alibi_slopes, &p->alibi_s, 1);
    }
    if (opt->sinks) {
        TRY(head_vector(opt->sinks, "sinks", p->Hq, need_data));
        p->sinks = ai_view_data(opt->sinks, &p->sinks_s, 1);
    }
    if (opt->block_mask) {  // its B and H the call's or 1 (shared); Lq and Lk the call's
        const attn_block_mask *m = opt->block_mask;
        if ((m->nb != 1 && m->nb != p->B) || (m->nh != 1 && m->nh != p->Hq) ||
            m->Lq != p->Lq || m->Lk != p->Lk)
            return ai_fail(ATTN_ERR_MASK, "options.block_mask is [%lld, %lld, %lld, %lld], "
                           "expected [B = %lld or 1, Hq = %lld or 1, Lq = %lld, Lk = %lld]",
                           (long long)m->nb, (long long)m->nh, (long long)m->Lq,
                           (long long)m->Lk, (long long)p->B, (long long)p->Hq,
                           (long long)p->Lq, (long long)p->Lk);
        p->block = m;
    }
    if (opt->score_mod_grad && !opt->score_mod)
        return ai_fail(ATTN_ERR_VALUE, "options.score_mod_grad is given without "
                       "options.score_mod");
    p->score_mod = opt->score_mod;
    p->score_mod_grad = opt->score_mod_grad;
    p->score_mod_ctx = opt->score_mod_ctx;
    /* the sinks' gradient is attn_backward's alone: it checks it and calls this filler
     * without it */
    if (opt->d_sinks || opt->d_bias)
        return ai_fail(ATTN_ERR_VALUE, "options.%s must be NULL here (it is an output "
                       "of attn_backward only)", opt->d_sinks ? "d_sinks" : "d_bias");
    return ATTN_OK;
}

/* lse (float32, or float64 for a float64 call) and weights */
static attn_status fill_outputs(attn_params *p, const attn_options *opt, bool need_data) {
    const bool f64 = p->q_dt == ATTN_F64;
    const int64_t full[4] = {p->B, p->Hq, p->Lq, p->Lk};
    if (opt->lse) {
        const attn_tensor *t = opt->lse;
        /* float64 calls may also take a float64 LSE */
        const bool lse64 = f64 && t->dtype == ATTN_F64;
        TRY(ai_check_tensor(t, "lse", lse64 ? ATTN_F64 : ATTN_F32, need_data));
        TRY(expect_dim(t, "lse", 0, p->B, "B"));
        TRY(expect_dim(t, "lse", 1, p->Hq, "Hq"));
        TRY(expect_dim(t, "lse", 2, p->Lq, "Lq"));
        TRY(expect_dim(t, "lse", 3, 1, "1"));
        TRY(ai_check_output_strides(t, "lse", 3));
        if (lse64)
            p->lse64 = (double *)ai_view_data(t, p->lse_s, 3);
        else
            p->lse = (float *)ai_view_data(t, p->lse_s, 3);
    }
    if (opt->weights) {
        const attn_tensor *t = opt->weights;
        TRY(ai_check_tensor(t, "weights", ATTN_F32, need_data));
        for (int d = 0; d < 4; d++)
            TRY(expect_dim(t, "weights", d, full[d], (const char *[]){"B", "Hq", "Lq", "Lk"}[d]));
        TRY(ai_check_output_strides(t, "weights", 4));
        p->weights = given(ai_view_data(t, p->w_s, 4));
    }
    /* attn_forward takes it off the options before they come here (forward.c) */
    if (opt->key_scores)
        return ai_fail(ATTN_ERR_UNSUPPORTED, "options.key_scores: an output of attn_forward "
                       "alone (float32, 16-bit and q8_0 calls)");
    return ATTN_OK;
}

/* precision, dropout, the path (and its kernels, the tuned configuration), threads */
static attn_status fill_run(attn_params *p, const attn_options *opt, bool backward,
                            const attn_tune_config *force) {
    const bool f64 = p->q_dt == ATTN_F64;
    if ((unsigned)opt->precision > (unsigned)ATTN_PRECISION_FAST)
        return ai_fail(ATTN_ERR_VALUE, "options.precision is %d, expected an "
                       "attn_precision value", (int)opt->precision);
    p->precision = opt->precision;

    /* dropout (philox.h) */
    if (!(opt->dropout_p >= 0.0f && opt->dropout_p <= 1.0f))
        return ai_fail(ATTN_ERR_VALUE, "options.dropout_p is %g, expected 0 <= dropout_p <= 1 "
                       "(0 = off)", (double)opt->dropout_p);
    if (opt->dropout_p > 0.0f && p->q_dt == ATTN_F64)  // fused_f64.c draws no mask
        return ai_fail(ATTN_ERR_UNSUPPORTED, "options.dropout_p = %g: float64 calls have no "
                       "dropout (float32, float16 and bfloat16 do)", (double)opt->dropout_p);
    if (opt->dropout_p > 0.0f) {
        p->dropout = true;
        p->dropout_p = opt->dropout_p;
        p->drop_seed = opt->dropout_seed;
        p->drop_offset = opt->dropout_offset;
        p->drop_threshold = attn_dropout_threshold(opt->dropout_p);
        p->drop_scale64 = opt->dropout_p < 1.0f ? 1.0 / (1.0 - (double)opt->dropout_p) : 0.0;
        p->drop_scale = (float)p->drop_scale64;
    }

    /* path and threads */
    switch (opt->path) {
    case ATTN_PATH_AUTO:
    case ATTN_PATH_FUSED: {
        const char *why = NULL;
        p->path = ATTN_PATH_FUSED;
        if (f64) break;  // fused_f64.c is portable C: no micro-kernels
        p->kernels = ai_select_kernels(&why);
        if (!p->kernels) return ai_fail(ATTN_ERR_UNSUPPORTED, "%s", why);
        /* the shape class's configuration (wisdom.h); every field 0 keeps the static one */
        p->tune = force ? *force
                        : ai_wisdom_lookup(ai_tune_class_of(p, backward, opt->kv_len != NULL));
        if (p->tune.kernels) p->kernels = p->tune.kernels;
        /* a q8_0 cache under few query rows (decoding: the blocks fused_takes_decode
         * gives the one-pass step) runs on a kernel that has the q8_0 step, the whole
         * call, so that its tiles' logits and exps come from one table (kernels.h) */
        if (p->kv_dt == ATTN_Q8_0 && !p->kernels->decode_q8_0 &&
            p->Lq <= ATTN_DECODE_MAX_ROWS && p->group <= ATTN_DECODE_MAX_ROWS &&
            p->Lq * p->group <= ATTN_DECODE_MAX_ROWS)
            p->kernels = ai_kernels_for_q8_0(p->kernels);
        /* the same for an fp8 cache, with its scales or without (fused_takes_decode) */
        if (attn_is_fp8(p->kv_dt) && !p->kernels->decode_fp8 &&
            p->Lq <= ATTN_DECODE_MAX_ROWS && p->group <= ATTN_DECODE_MAX_ROWS &&
            p->Lq * p->group <= ATTN_DECODE_MAX_ROWS)
            p->kernels = ai_kernels_for_fp8(p->kernels);
        if (p->kv_dt == ATTN_Q4_0 && !p->kernels->decode_q4_0 &&
            p->Lq <= ATTN_DECODE_MAX_ROWS && p->group <= ATTN_DECODE_MAX_ROWS &&
            p->Lq * p->group <= ATTN_DECODE_MAX_ROWS)
            p->kernels = ai_kernels_for_q4_0(p->kernels);
        /* FAST pays only on bf16 dot products (the kernel's pv_bf16): elsewhere rounding P
         * is one more pass over each tile and no product gets cheaper (slower than the
         * default level: docs/KERNELS.md), so those kernels run the default level, which is more
         * precise than FAST promises (docs/CONTRACT.md, "Precision") */
        if (p->precision == ATTN_PRECISION_FAST && !p->kernels->pv_bf16)
            p->precision = ATTN_PRECISION_DEFAULT;
        break;
    }
    case ATTN_PATH_REFERENCE: p->path = ATTN_PATH_REFERENCE; break;
    default:
        return ai_fail(ATTN_ERR_VALUE, "options.path is %d, expected an attn_path value",
                    (int)opt->path);
    }
    if (opt->threads < 0)
        return ai_fail(ATTN_ERR_VALUE, "options.threads is %d, expected >= 0 (0 = default)",
                    (int)opt->threads);
#ifdef _OPENMP
    p->threads = opt->threads > 0 ? opt->threads : omp_get_max_threads();
#else
    p->threads = 1;
#endif
    if (p->threads < 1) p->threads = 1;
    /* More threads than this only cost workspace (and can exhaust the OpenMP runtime);
     * the results do not depend on the count. */
    if (p->threads > ATTN_MAX_THREADS) p->threads = ATTN_MAX_THREADS;
    return ATTN_OK;
}

/* need_data = false for the workspace query, which may be asked before any buffer
 * exists. */
attn_status ai_params_init(attn_params *p, const attn_tensor *q, const attn_tensor *k,
                           const attn_tensor *v, const attn_tensor *o,
                           const attn_options *opt_in, bool need_data) {
    return ai_params_init_for(p, q, k, v, o, opt_in, need_data, false, NULL);
}

attn_status ai_params_init_for(attn_params *p, const attn_tensor *q, const attn_tensor *k,
                               const attn_tensor *v, const attn_tensor *o,
                               const attn_options *opt_in, bool need_data, bool backward,
                               const attn_tune_config *force) {
    static const attn_options defaults = {0};
    const attn_options *opt = opt_in ? opt_in : &defaults;
    *p = (attn_params){0};
    TRY(fill_tensors(p, q, k, v, o, opt, need_data));
    TRY(fill_logits(p, opt));
    TRY(fill_masks(p, opt, need_data));
    TRY(fill_outputs(p, opt, need_data));
    return fill_run(p, opt, backward, force);
}
