/*
 * mha.c — the multi-head attention module's forward (attn_mha_forward and its workspace
 *         query) and the parts its backward and decoding step share: the checked plan,
 *         the operands handed to the BLAS door, the projections, the heads' attention.
 *
 * The layer is a composition of parts that exist: Q = x_q W_Q + b_Q (ai_gemm_f32),
 * RoPE (rope.c), O = attn_forward on [B, L, H, D] views, y = O W_O + b_O. What it is not:
 * a GEMM of its own (bfloat16 operands are widened to float32 copies, then multiplied by
 * the BLAS), or a kernel. Extra memory is the projections and O, O(B·L·E), plus copies of
 * operands the BLAS cannot read in place; never a Lq x Lk matrix unless the attention
 * weights are asked for (their mean over heads takes a batch row's heads at a time,
 * mha_weights.c).
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/half.h"
#include "mha.h"

/* ---- argument checks ----------------------------------------------------------------- */

/* A [B, L, C] activation (shape {B, L, C, 1}) of float32 or bfloat16. */
static attn_status check_rows(const attn_tensor *x, const char *name, bool need_data) {
    if (!x) return ai_fail(ATTN_ERR_NULL, "%s: tensor pointer is NULL", name);
    if (x->dtype != ATTN_F32 && x->dtype != ATTN_BF16)
        return ai_fail(ATTN_ERR_DTYPE, "%s: dtype is %s, expected float32 or bfloat16",
                       name, attn_dtype_name(x->dtype));
    TRY(ai_check_tensor(x, name, x->dtype, need_data));
    if (x->shape[3] != 1)
        return ai_fail(ATTN_ERR_SHAPE, "%s: shape[3] is %lld, expected 1 (a [B, L, C] "
                       "tensor is {B, L, C, 1})", name, (long long)x->shape[3]);
    return ATTN_OK;
}

/* A weight, logical [in, out] (shape {in, out, 1, 1}), or a bias {out, 1, 1, 1}. */
static attn_status check_matrix(const attn_tensor *t, const char *name, int64_t in,
                                int64_t out, bool need_data) {
    TRY(check_rows(t, name, need_data));
    const bool bias = in < 0;
    const int64_t want0 = bias ? out : in, want1 = bias ? 1 : out;
    if (t->shape[0] != want0 || t->shape[1] != want1 || t->shape[2] != 1)
        return ai_fail(ATTN_ERR_SHAPE, "%s: shape [%lld, %lld, %lld, %lld], expected "
                       "[%lld, %lld, 1, 1]", name, (long long)t->shape[0],
                       (long long)t->shape[1], (long long)t->shape[2],
                       (long long)t->shape[3], (long long)want0, (long long)want1);
    return ATTN_OK;
}

static bool fits_int(int64_t x) { return x >= 0 && x <= INT_MAX; }

attn_status mha_plan_init(mha_plan *pl, const attn_mha *m, const attn_tensor *x_q,
                          const attn_tensor *x_kv, const attn_tensor *y, bool need_data) {
    static const char *const wname[MHA_N] = {"w_q", "w_k", "w_v", "w_o"};
    static const char *const bname[MHA_N] = {"b_q", "b_k", "b_v", "b_o"};
    *pl = (mha_plan){0};
    if (!m) return ai_fail(ATTN_ERR_NULL, "m: NULL module");
    TRY(check_rows(x_q, "x_q", need_data));
    if (x_kv) TRY(check_rows(x_kv, "x_kv", need_data));
    pl->xq = x_q;
    pl->xkv = x_kv ? x_kv : x_q;
    pl->self = x_kv == NULL;
    pl->B = x_q->shape[0];
    pl->Lq = x_q->shape[1];
    pl->E = x_q->shape[2];
    pl->Lk = pl->xkv->shape[1];
    pl->Ekv = pl->xkv->shape[2];
    if (pl->xkv->shape[0] != pl->B)
        return ai_fail(ATTN_ERR_SHAPE, "x_kv: shape[0] (B) is %lld, expected %lld as x_q",
                       (long long)pl->xkv->shape[0], (long long)pl->B);

    const attn_tensor *const w[MHA_N] = {m->w_q, m->w_k, m->w_v, m->w_o};
    const attn_tensor *const b[MHA_N] = {m->b_q, m->b_k, m->b_v, m->b_o};
    for (int n = 0; n < MHA_N; n++) {
        if (!w[n]) return ai_fail(ATTN_ERR_NULL, "%s: tensor pointer is NULL", wname[n]);
        pl->w[n] = w[n];
        pl->b[n] = b[n];
    }
    pl->Hq = m->Hq;
    pl->Hkv = m->Hkv ? m->Hkv : m->Hq;
    if (pl->Hq <= 0 || pl->Hkv <= 0 || pl->Hq % pl->Hkv != 0)
        return ai_fail(ATTN_ERR_HEADS, "m: Hq = %lld, Hkv = %lld, expected Hq > 0 a "
                       "multiple of Hkv > 0", (long long)m->Hq, (long long)m->Hkv);
    /* the widths follow from W_Q and W_V's columns, which the heads must divide */
    const int64_t qcols = w[MHA_Q]->shape[1], vcols = w[MHA_V]->shape[1];
    if (qcols % pl->Hq != 0)
        return ai_fail(ATTN_ERR_SHAPE, "w_q: %lld columns are not divisible by Hq = %lld",
                       (long long)qcols, (long long)pl->Hq);
    if (vcols % pl->Hkv != 0)
        return ai_fail(ATTN_ERR_SHAPE, "w_v: %lld columns are not divisible by Hkv = %lld",
                       (long long)vcols, (long long)pl->Hkv);
    pl->Dk = qcols / pl->Hq;
    pl->Dv = vcols / pl->Hkv;
    const int64_t in[MHA_N] = {pl->E, pl->Ekv, pl->Ekv, pl->Hq * pl->Dv};
    const int64_t out[MHA_N] = {pl->Hq * pl->Dk, pl->Hkv * pl->Dk, pl->Hkv * pl->Dv, pl->E};
    for (int n = 0; n < MHA_N; n++) {
        TRY(check_matrix(w[n], wname[n], in[n], out[n], need_data));
        if (b[n]) TRY(check_matrix(b[n], bname[n], -1, out[n], need_data));
        pl->in[n] = in[n];
        pl->out[n] = out[n];
        /* the BLAS takes int sizes: every product's sizes and leading dimensions */
        if (!fits_int(in[n]) || !fits_int(out[n]))
            return ai_fail(ATTN_ERR_OVERFLOW, "%s: [%lld, %lld] does not fit the BLAS's int",
                           wname[n], (long long)in[n], (long long)out[n]);
    }
    int64_t mq, mk;
    if (__builtin_mul_overflow(pl->B, pl->Lq, &mq) || __builtin_mul_overflow(pl->B, pl->Lk, &mk) ||
        !fits_int(mq) || !fits_int(mk))
        return ai_fail(ATTN_ERR_OVERFLOW, "B·L rows do not fit the BLAS's int");
    if (y) {
        TRY(check_rows(y, "y", need_data));
        if (y->shape[0] != pl->B || y->shape[1] != pl->Lq || y->shape[2] != pl->E)
            return ai_fail(ATTN_ERR_SHAPE, "y: shape [%lld, %lld, %lld], expected [B = %lld, "
                           "Lq = %lld, E = %lld]", (long long)y->shape[0],
                           (long long)y->shape[1], (long long)y->shape[2], (long long)pl->B,
                           (long long)pl->Lq, (long long)pl->E);
        TRY(ai_check_output_strides(y, "y", 3));
    }
    TRY(ai_rope_check(&m->rope, pl->Dk, &pl->rdim, &pl->base));
    pl->rope = m->rope.kind;
    pl->offset = m->rope.offset;
    if (strcmp(attn_blas_name(), "none") == 0)
        return ai_fail(ATTN_ERR_UNSUPPORTED, "this build has no BLAS (BLAS=none): the "
                       "module's projections need one");
    return ATTN_OK;
}

/* ---- operands ------------------------------------------------------------------------ */

/* Whether x [B, L, C] is float32 rows the BLAS reads in place: unit last stride, rows a
 * constant positive stride apart (across batches too). */
static bool rows_in_place(const attn_tensor *x) {
    const int64_t B = x->shape[0], L = x->shape[1], C = x->shape[2];
    if (x->dtype != ATTN_F32) return false;
    if (C > 1 && x->stride[2] != 1) return false;
    const int64_t ld = L > 1 ? x->stride[1] : (B > 1 ? x->stride[0] : C);
    if (ld < (C > 1 ? C : 1) || !fits_int(ld)) return false;
    return B <= 1 || L <= 1 || x->stride[0] == L * x->stride[1];
}

/* d [R, C] dense = t's elements widened to float32: row r = (r / L, r % L) starts at
 * offset (r / L)·s_outer + (r % L)·s_inner, its elements cs apart. Rows in parallel; a
 * bfloat16 row of unit stride is widened by its bits (the top half of a float32). */
static void widen(float *d, const attn_tensor *t, int64_t R, int64_t C, int64_t L,
                  int64_t s_outer, int64_t s_inner, int64_t cs) {
#pragma omp parallel for schedule(static) if (R * C > (1 << 16))
    for (int64_t r = 0; r < R; r++) {
        const int64_t off = (r / L) * s_outer + (r % L) * s_inner;
        float *dr = d + r * C;
        if (t->dtype == ATTN_BF16 && cs == 1) {
            const uint16_t *src = (const uint16_t *)t->data + off;
            for (int64_t c = 0; c < C; c++) {
                const uint32_t bits = (uint32_t)src[c] << 16;
                memcpy(&dr[c], &bits, sizeof bits);
            }
        } else {
            for (int64_t c = 0; c < C; c++) dr[c] = attn_load(t->dtype, t->data, off + c * cs);
        }
    }
}

static int64_t rows_ld(const attn_tensor *x) {
    const int64_t B = x->shape[0], L = x->shape[1], C = x->shape[2];
    return L > 1 ? x->stride[1] : (B > 1 ? x->stride[0] : (C > 1 ? C : 1));
}

mha_op mha_rows_op(const attn_tensor *x, mha_ws *w) {
    const int64_t B = x->shape[0], L = x->shape[1], C = x->shape[2];
    if (rows_in_place(x)) return (mha_op){.p = (const float *)x->data, .ld = rows_ld(x)};
    float *d = mha_take(w, B * L * C);  /* (B·L, C) */
    if (d) widen(d, x, B * L, C, L, x->stride[0], x->stride[1], x->stride[2]);
    return (mha_op){.p = d, .ld = C > 1 ? C : 1};
}

mha_op mha_weight_op(const attn_tensor *wt, int64_t rows, mha_ws *w) {
    const int64_t in = wt->shape[0], out = wt->shape[1];
    if (wt->dtype == ATTN_F32) {
        /* row-major [in, out]: unit stride along out, rows stride[0] >= out apart */
        if ((out <= 1 || wt->stride[1] == 1) && wt->stride[0] >= (out > 1 ? out : 1) &&
            fits_int(wt->stride[0]))
            return (mha_op){(const float *)wt->data, wt->stride[0], false, NULL, in, out, 0};
        /* PyTorch's [out, in] rows: unit stride along in */
        if ((in <= 1 || wt->stride[0] == 1) && wt->stride[1] >= (in > 1 ? in : 1) &&
            fits_int(wt->stride[1]))
            return (mha_op){(const float *)wt->data, wt->stride[1], true, NULL, in, out, 0};
    }
    int64_t n = (in < MHA_PANEL ? in : MHA_PANEL) * out;  /* (MHA_PANEL, out) */
    if (rows == 1 && mha_gemv_reads(wt)) {  /* only the one-row products' partials */
        const int64_t parts = MHA_GEMV_PARTS * (in > out ? in : out);
        n = parts < n ? parts : n;
    }
    float *panel = mha_take(w, n);
    return (mha_op){panel, out > 1 ? out : 1, false, wt, in, out, n};
}

/* rows k0 .. k0 + kc of a panelled weight, widened into its panel (kc, out) */
static float *widen_panel(const mha_op *w, int64_t k0, int64_t kc) {
    const attn_tensor *t = w->src;
    const attn_tensor rows = {(char *)t->data + (size_t)(k0 * t->stride[0]) *
                                                    (t->dtype == ATTN_F32 ? 4 : 2),
                              t->dtype, {kc, w->out, 1, 1}, {t->stride[0], t->stride[1], 1, 1}};
    float *panel = (float *)w->p;
    widen(panel, &rows, kc, w->out, kc, 0, t->stride[0], t->stride[1]);
    return panel;
}

/* mha_gemm_w for M = 1: c[out] = wᵀ a (or c[in] = w a when transposed). The stored
 * matrix is [in, out] (rows ld apart) unless w->trans ([out, in]); a panel is [kc, out]. */
static void gemv_w(bool transposed, const float *a, const mha_op *w, float beta, float *c) {
    const int64_t in = w->in, out = w->out;
    if (!w->src) {
        const bool gt = transposed ? w->trans : !w->trans;
        (void)ai_gemv_f32(gt, w->trans ? out : in, w->trans ? in : out, 1.0f, w->p, w->ld, a,
                          beta, c);
        return;
    }
    if (mha_gemv_bf16(transposed, a, w, beta, c)) return;  /* bfloat16 read in place */
    if (in == 0 && !transposed) {
        (void)ai_gemv_f32(true, 0, out, 1.0f, w->p, w->ld, a, beta, c);
        return;
    }
    for (int64_t k0 = 0; k0 < in; k0 += MHA_PANEL) {
        const int64_t kc = in - k0 < MHA_PANEL ? in - k0 : MHA_PANEL;
        float *panel = widen_panel(w, k0, kc);
        if (!transposed)  /* c += panelᵀ a[k0 .. k0 + kc) */
            (void)ai_gemv_f32(true, kc, out, 1.0f, panel, w->ld, a + k0, k0 ? 1.0f : beta, c);
        else  /* c[k0 .. k0 + kc) = panel a */
            (void)ai_gemv_f32(false, kc, out, 1.0f, panel, w->ld, a, beta, c + k0);
    }
}

void mha_gemm_w(bool transposed, int64_t M, const float *a, int64_t lda, const mha_op *w,
                float beta, float *c, int64_t ldc) {
    /* sizes and leading dimensions were checked by mha_plan_init: these cannot fail */
    const int64_t in = w->in, out = w->out;
    if (M == 1) {  /* one row: a matrix-vector product (a GEMM of M = 1 packs all of w) */
        gemv_w(transposed, a, w, beta, c);
        return;
    }
    if (!w->src) {
        if (!transposed)
            (void)ai_gemm_f32(false, w->trans, M, out, in, 1.0f, a, lda, w->p, w->ld, beta, c, ldc);
        else
            (void)ai_gemm_f32(false, !w->trans, M, in, out, 1.0f, a, lda, w->p, w->ld, beta, c, ldc);
        return;
    }
    if (in == 0 && !transposed) {  /* an empty sum: c = beta · c */
        (void)ai_gemm_f32(false, false, M, out, 0, 1.0f, a, lda, w->p, w->ld, beta, c, ldc);
        return;
    }
    for (int64_t k0 = 0; k0 < in; k0 += MHA_PANEL) {
        const int64_t kc = in - k0 < MHA_PANEL ? in - k0 : MHA_PANEL;
        float *panel = widen_panel(w, k0, kc);
        if (!transposed)  /* c += a[:, k0 .. k0 + kc) · panel */
            (void)ai_gemm_f32(false, false, M, out, kc, 1.0f, a + k0, lda, panel, w->ld,
                              k0 ? 1.0f : beta, c, ldc);
        else  /* c[:, k0 .. k0 + kc) = a · panelᵀ */
            (void)ai_gemm_f32(false, true, M, kc, out, 1.0f, a, lda, panel, w->ld, beta,
                              c + k0, ldc);
    }
}

void mha_project(float *out, int64_t ldc, int64_t M, mha_op a, mha_op w,
                 const attn_tensor *bias) {
    const int64_t N = w.out;
    if (M == 0 || N == 0) return;
    if (bias && bias->dtype == ATTN_F32 && (bias->stride[0] == 1 || N == 1)) {
        /* the common case: row 0 copied from the bias, the others from row 0 */
        memcpy(out, bias->data, (size_t)N * sizeof(float));
        for (int64_t r = 1; r < M; r++) memcpy(out + r * ldc, out, (size_t)N * sizeof(float));
    } else if (bias) {
        for (int64_t r = 0; r < M; r++)
            for (int64_t c = 0; c < N; c++)
                out[r * ldc + c] = attn_load(bias->dtype, bias->data, c * bias->stride[0]);
    }
    mha_gemm_w(false, M, a.p, a.ld, &w, bias ? 1.0f : 0.0f, out, ldc);
}

mha_target mha_rows_target(const attn_tensor *y, mha_ws *w) {
    const int64_t B = y->shape[0], L = y->shape[1], C = y->shape[2];
    if (rows_in_place(y)) return (mha_target){(float *)y->data, rows_ld(y), false};
    return (mha_target){mha_take(w, B * L * C), C > 1 ? C : 1, true};
}

void mha_scatter(const attn_tensor *y, const mha_target *t) {
    if (!t->scatter) return;
    const int64_t B = y->shape[0], L = y->shape[1], C = y->shape[2];
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < L; i++)
            for (int64_t c = 0; c < C; c++)
                attn_store(y->dtype, y->data,
                           b * y->stride[0] + i * y->stride[1] + c * y->stride[2],
                           t->p[(b * L + i) * t->ld + c]);
}

/* ---- the heads' attention ------------------------------------------------------------- */

attn_status mha_attend(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                       const attn_tensor *o, const attn_tensor *lse, const attn_tensor *weights,
                       bool average, const attn_options *opt_in, mha_ws *w) {
    static const attn_options defaults = {0};
    attn_options opt = opt_in ? *opt_in : defaults;
    if (opt.block_table)  // the module's K and V are its own, never paged
        return ai_fail(ATTN_ERR_UNSUPPORTED, "multi-head layer: options.block_table is not "
                       "supported");
    /* the module may call the attention on batch rows and head chunks (below), whose
     * indices a block mask or a score function would read as the whole call's */
    if (opt.block_mask || opt.score_mod || opt.key_scores)
        return ai_fail(ATTN_ERR_UNSUPPORTED, "multi-head layer: options.%s is not supported",
                       opt.block_mask ? "block_mask" : opt.score_mod ? "score_mod" : "key_scores");
    if (opt.lse || opt.weights)
        return ai_fail(ATTN_ERR_VALUE, "options.%s must be NULL for the module (its weights "
                       "are an argument)", opt.lse ? "lse" : "weights");
    /* the module calls the attention on batch rows and head chunks when it averages the
     * weights, where dropout's (b, h) rows would not be the heads' own: not offered */
    if (opt.dropout_p != 0.0f)
        return ai_fail(ATTN_ERR_UNSUPPORTED, "options.dropout_p = %g: the multi-head "
                       "module has no dropout", (double)opt.dropout_p);
    opt.workspace = NULL;
    opt.workspace_bytes = 0;
    opt.lse = lse;
    const int64_t B = q->shape[0], Hq = q->shape[1], Lq = q->shape[2], Lk = k->shape[2];
    if (weights) {
        const int64_t want[4] = {B, average ? 1 : Hq, Lq, Lk};
        TRY(ai_check_tensor(weights, "weights", ATTN_F32, !w->count_only));
        for (int d = 0; d < 4; d++)
            if (weights->shape[d] != want[d])
                return ai_fail(ATTN_ERR_SHAPE, "weights: shape[%d] is %lld, expected %lld%s",
                               d, (long long)weights->shape[d], (long long)want[d],
                               average ? " (averaged over heads: [B, 1, Lq, Lk])" : "");
        TRY(ai_check_output_strides(weights, "weights", 4));
    }
    if (!weights || !average) {
        /* one call over every head */
        opt.weights = weights;
        size_t need;
        TRY(attn_forward_workspace_size(q, k, v, o, &opt, &need));
        opt.workspace = mha_take(w, (int64_t)((need + 3) / 4));
        opt.workspace_bytes = need;
        if (w->count_only) return ATTN_OK;
        return attn_forward(q, k, v, o, &opt);
    }
    /* averaged weights: a batch row's heads at a time (mha_weights.c) */
    return mha_attend_average(q, k, v, o, lse, weights, &opt, w);
}

/* ---- the forward ------------------------------------------------------------------------ */

void mha_qkv_layout(const mha_plan *pl, mha_ws *w, mha_qkv *s) {
    s->xq = mha_rows_op(pl->xq, w);
    s->xkv = pl->xkv == pl->xq ? s->xq : mha_rows_op(pl->xkv, w);
    /* W_Q and W_O multiply B·Lq rows (forward and backward), W_K and W_V B·Lk */
    for (int n = 0; n < MHA_N; n++)
        s->w[n] = mha_weight_op(pl->w[n], n == MHA_K || n == MHA_V ? pl->B * pl->Lk
                                                                   : pl->B * pl->Lq, w);
    if (pl->keep) {  /* attn_mha_forward_save / attn_mha_backward_saved: the caller's */
        (void)mha_keep_layout(pl, w->count_only ? NULL : pl->keep, s, NULL);
        return;
    }
    s->q = mha_take(w, pl->B * pl->Lq * pl->Hq * pl->Dk);
    s->k = mha_take(w, pl->B * pl->Lk * pl->Hkv * pl->Dk);
    s->v = mha_take(w, pl->B * pl->Lk * pl->Hkv * pl->Dv);
    s->o = mha_take(w, pl->B * pl->Lq * pl->Hq * pl->Dv);
}

size_t mha_keep_layout(const mha_plan *pl, char *keep, mha_qkv *s, float **lse) {
    mha_ws k = {.base = keep, .count_only = keep == NULL};
    (void)mha_take(&k, 16);  /* the header: int64 magic, B, Lq, Lk, Hq, Hkv, Dk, Dv */
    float *q = mha_take(&k, pl->B * pl->Lq * pl->Hq * pl->Dk);
    float *kk = mha_take(&k, pl->B * pl->Lk * pl->Hkv * pl->Dk);
    float *v = mha_take(&k, pl->B * pl->Lk * pl->Hkv * pl->Dv);
    float *o = mha_take(&k, pl->B * pl->Lq * pl->Hq * pl->Dv);
    float *l = mha_take(&k, pl->B * pl->Hq * pl->Lq);
    if (s) s->q = q, s->k = kk, s->v = v, s->o = o;
    if (lse) *lse = l;
    return k.overflow ? SIZE_MAX : k.used;
}

void mha_qkv_project(const mha_plan *pl, const mha_qkv *s, const int64_t *pos0) {
    const int64_t mq = pl->B * pl->Lq, mk = pl->B * pl->Lk;
    mha_project(s->q, pl->out[MHA_Q], mq, s->xq, s->w[MHA_Q], pl->b[MHA_Q]);
    mha_project(s->k, pl->out[MHA_K], mk, s->xkv, s->w[MHA_K], pl->b[MHA_K]);
    mha_project(s->v, pl->out[MHA_V], mk, s->xkv, s->w[MHA_V], pl->b[MHA_V]);
    ai_rope_apply(pl->rope, pl->rdim, pl->base, pl->offset, pos0, s->q, pl->B, pl->Lq,
                  pl->Hq, pl->Dk, false);
    ai_rope_apply(pl->rope, pl->rdim, pl->base, pl->offset, pos0, s->k, pl->B, pl->Lk,
                  pl->Hkv, pl->Dk, false);
}

attn_status mha_forward_ws(const mha_plan *pl, const attn_tensor *y,
                           const attn_tensor *weights, bool average, const attn_options *opt,
                           mha_ws *w, mha_qkv *s, float **lse_out) {
    mha_qkv_layout(pl, w, s);
    float *lse = NULL;
    if (pl->keep) (void)mha_keep_layout(pl, w->count_only ? NULL : pl->keep, NULL, &lse);
    else if (lse_out) lse = mha_take(w, pl->B * pl->Hq * pl->Lq);
    mha_target yt = {0};
    if (y) yt = mha_rows_target(y, w);
    if (!w->count_only) mha_qkv_project(pl, s, NULL);
    attn_tensor q = mha_heads_view(s->q, pl->B, pl->Lq, pl->Hq, pl->Dk);
    attn_tensor k = mha_heads_view(s->k, pl->B, pl->Lk, pl->Hkv, pl->Dk);
    attn_tensor v = mha_heads_view(s->v, pl->B, pl->Lk, pl->Hkv, pl->Dv);
    attn_tensor o = mha_heads_view(s->o, pl->B, pl->Lq, pl->Hq, pl->Dv);
    attn_tensor lt = attn_tensor_4d(lse, ATTN_F32, pl->B, pl->Hq, pl->Lq, 1);
    TRY(mha_attend(&q, &k, &v, &o, lse_out || pl->keep ? &lt : NULL, weights, average, opt, w));
    if (w->overflow) return ai_fail(ATTN_ERR_OVERFLOW, "workspace size overflows size_t");
    if (lse_out) *lse_out = lse;
    if (w->count_only || !y) return ATTN_OK;
    mha_out_project(pl, s, y, &yt);
    return ATTN_OK;
}

void mha_out_project(const mha_plan *pl, const mha_qkv *s, const attn_tensor *y,
                     const mha_target *yt) {
    const mha_op ov = {.p = s->o, .ld = pl->Hq * pl->Dv > 1 ? pl->Hq * pl->Dv : 1};
    mha_project(yt->p, yt->ld, pl->B * pl->Lq, ov, s->w[MHA_O], pl->b[MHA_O]);
    mha_scatter(y, yt);
}

void mha_io_add(mha_io *io, bool out, const attn_tensor *t, const char *name) {
    if (!t) return;
    int *n = out ? &io->n_out : &io->n_in;
    if (*n >= MHA_IO_MAX) return;  // the calls below add at most 19
    (out ? io->out : io->in)[*n] = t;
    (out ? io->out_name : io->in_name)[(*n)++] = name;
}

void mha_io_bytes(mha_io *io, bool out, const void *p, size_t n, const char *name) {
    if (!p || n == 0 || io->n_span >= 2) return;
    const int64_t len = n > (size_t)INT64_MAX ? INT64_MAX : (int64_t)n;
    attn_tensor *t = &io->span[io->n_span++];
    *t = (attn_tensor){(void *)p, ATTN_BOOL, {len, 1, 1, 1}, {1, 1, 1, 1}};
    mha_io_add(io, out, t, name);
}

void mha_io_init(mha_io *io, const mha_plan *pl, const attn_options *opt) {
    static const char *const wname[MHA_N] = {"w_q", "w_k", "w_v", "w_o"};
    static const char *const bname[MHA_N] = {"b_q", "b_k", "b_v", "b_o"};
    *io = (mha_io){0};
    mha_io_add(io, false, pl->xq, "x_q");
    if (!pl->self) mha_io_add(io, false, pl->xkv, "x_kv");
    for (int n = 0; n < MHA_N; n++) {
        mha_io_add(io, false, pl->w[n], wname[n]);
        mha_io_add(io, false, pl->b[n], bname[n]);
    }
    if (!opt) return;
    mha_io_add(io, false, opt->mask, "options.mask");
    mha_io_add(io, false, opt->bias, "options.bias");
    mha_io_add(io, false, opt->kv_len, "options.kv_len");
    mha_io_add(io, false, opt->alibi_slopes, "options.alibi_slopes");
    mha_io_add(io, false, opt->sinks, "options.sinks");
}

attn_status mha_io_check(const mha_io *io, const attn_options *opt, size_t ws_need) {
    return ai_check_aliasing(io->in, io->in_name, io->n_in, io->out, io->out_name,
                             io->n_out, opt, ws_need);
}

attn_status mha_two_pass(mha_body body, const void *ctx, const attn_options *opt,
                         const mha_io *io, size_t *bytes) {
    mha_ws w = {.count_only = true};
    TRY(body(ctx, opt, &w));
    if (bytes) {
        *bytes = w.used;
        return ai_ok();
    }
    if (io) TRY(mha_io_check(io, opt, w.used));
    void *ws, *owned;
    TRY(ai_workspace_acquire(opt, w.used, &ws, &owned));
    mha_ws run = {.base = ws};
    attn_status st = body(ctx, opt, &run);
    ai_free(owned);
    return st == ATTN_OK ? ai_ok() : st;  // a success clears attn_last_error()
}

typedef struct fwd_ctx {
    mha_plan pl;
    const attn_tensor *y, *weights;
    bool average;
} fwd_ctx;

static attn_status forward_body(const void *ctx, const attn_options *opt, mha_ws *w) {
    const fwd_ctx *f = ctx;
    mha_qkv s;
    return mha_forward_ws(&f->pl, f->y, f->weights, f->average, opt, w, &s, NULL);
}

static attn_status forward_call(const attn_mha *m, const attn_tensor *x_q,
                                const attn_tensor *x_kv, const attn_tensor *y,
                                const attn_tensor *weights, bool average,
                                const attn_options *opt, size_t *bytes) {
    fwd_ctx f = {.y = y, .weights = weights, .average = average};
    TRY(mha_plan_init(&f.pl, m, x_q, x_kv, y, bytes == NULL));
    mha_io io;
    mha_io_init(&io, &f.pl, opt);
    mha_io_add(&io, true, y, "y");
    mha_io_add(&io, true, weights, "weights");
    return mha_two_pass(forward_body, &f, opt, &io, bytes);
}

attn_status attn_mha_forward(const attn_mha *m, const attn_tensor *x_q, const attn_tensor *x_kv,
                             const attn_tensor *y, const attn_tensor *weights,
                             bool average_weights, const attn_options *opt) {
    return forward_call(m, x_q, x_kv, y, weights, average_weights, opt, NULL);
}

attn_status attn_mha_forward_workspace_size(const attn_mha *m, const attn_tensor *x_q,
                                            const attn_tensor *x_kv, const attn_tensor *y,
                                            const attn_tensor *weights, bool average_weights,
                                            const attn_options *opt, size_t *bytes) {
    if (!bytes) return ai_fail(ATTN_ERR_NULL, "bytes: NULL output pointer");
    return forward_call(m, x_q, x_kv, y, weights, average_weights, opt, bytes);
}
