/*
 * mha_backward.c — the multi-head module's gradients (attn_mha_backward): the forward
 *                  recomputed (mha.c), then each line of it differentiated, the heads'
 *                  part through attn_backward and every product through ai_gemm_f32.
 *
 * What it is not: a store of activations between calls (attn_mha_backward recomputes
 * the forward's Q, K, V, O and LSE, one extra forward; attn_mha_backward_saved reads
 * them from the caller's buffer that attn_mha_forward_save filled, mha_saved.c), or an
 * accumulator (every gradient asked for is overwritten). Determinism: each GEMM's sums
 * run in the BLAS's fixed order for any thread count; the bias sums are one column per thread in row order; attn_backward
 * is bit-identical for any thread count.
 *
 * With M = B·L rows, G = dLoss/dy [B·Lq, E], the forward's lines and their gradients:
 *   y = O W_O + b_O            dO = G W_Oᵀ     dW_O = Oᵀ G     db_O = Σ_rows G
 *   O = attention(Q, K, V)     dQ, dK, dV = attn_backward(..., dO)
 *   Q = rope(x_q W_Q + b_Q)    dQ' = rope⁻¹(dQ)  dW_Q = x_qᵀ dQ'  db_Q = Σ dQ'
 *                              dx_q = dQ' W_Qᵀ
 *   K = rope(x_kv W_K + b_K)   dK' = rope⁻¹(dK)  dW_K = x_kvᵀ dK'  db_K = Σ dK'
 *   V = x_kv W_V + b_V         dW_V = x_kvᵀ dV   db_V = Σ dV
 *                              dx_kv = dK' W_Kᵀ + dV W_Vᵀ  (added to dx_q in self-attention)
 */
#include <string.h>

#include "mha.h"

/* A gradient: float32, of the shape of what it differentiates, no element twice. */
static attn_status check_grad(const attn_tensor *t, const char *name, const int64_t want[4],
                              int dims, bool need_data) {
    if (!t) return ATTN_OK;
    TRY(ai_check_tensor(t, name, ATTN_F32, need_data));
    for (int d = 0; d < 4; d++)
        if (t->shape[d] != want[d])
            return ai_fail(ATTN_ERR_SHAPE, "%s: shape[%d] is %lld, expected %lld", name, d,
                           (long long)t->shape[d], (long long)want[d]);
    return ai_check_output_strides(t, name, dims);
}

static attn_status check_grads(const mha_plan *pl, const attn_tensor *dy,
                               const attn_mha_grads *g, bool self, bool need_data) {
    if (!dy) return ai_fail(ATTN_ERR_NULL, "dy: tensor pointer is NULL");
    if (dy->dtype != ATTN_F32 && dy->dtype != ATTN_BF16)
        return ai_fail(ATTN_ERR_DTYPE, "dy: dtype is %s, expected float32 or bfloat16",
                       attn_dtype_name(dy->dtype));
    TRY(ai_check_tensor(dy, "dy", dy->dtype, need_data));
    const int64_t ydims[4] = {pl->B, pl->Lq, pl->E, 1};
    for (int d = 0; d < 4; d++)
        if (dy->shape[d] != ydims[d])
            return ai_fail(ATTN_ERR_SHAPE, "dy: shape[%d] is %lld, expected %lld (as y)", d,
                           (long long)dy->shape[d], (long long)ydims[d]);
    if (!g) return ai_fail(ATTN_ERR_NULL, "g: NULL gradients");
    if (self && g->dx_kv)
        return ai_fail(ATTN_ERR_VALUE, "g->dx_kv must be NULL in self-attention (x_kv "
                       "NULL): dx_q gets both paths' gradient");
    TRY(check_grad(g->dx_q, "dx_q", ydims, 3, need_data));
    TRY(check_grad(g->dx_kv, "dx_kv", (const int64_t[4]){pl->B, pl->Lk, pl->Ekv, 1}, 3,
                   need_data));
    const attn_tensor *const dw[MHA_N] = {g->dw_q, g->dw_k, g->dw_v, g->dw_o};
    const attn_tensor *const db[MHA_N] = {g->db_q, g->db_k, g->db_v, g->db_o};
    static const char *const wname[MHA_N] = {"dw_q", "dw_k", "dw_v", "dw_o"};
    static const char *const bname[MHA_N] = {"db_q", "db_k", "db_v", "db_o"};
    for (int n = 0; n < MHA_N; n++) {
        TRY(check_grad(dw[n], wname[n], (const int64_t[4]){pl->in[n], pl->out[n], 1, 1}, 2,
                       need_data));
        TRY(check_grad(db[n], bname[n], (const int64_t[4]){pl->out[n], 1, 1, 1}, 1,
                       need_data));
    }
    return ATTN_OK;
}

/* dW [in, out] = aᵀ g for a [M, in] (rows a.ld apart) and g [M, out] (dense): straight
 * into dw when one of its strides is 1 (its transpose g ᵀ a when stride[0] is), else
 * through scratch (taken when the workspace only counts, too). */
typedef struct wgrad {
    const attn_tensor *dw;
    float *scratch;
} wgrad;

static bool wgrad_direct(const attn_tensor *dw, bool *transposed) {
    const int64_t in = dw->shape[0], out = dw->shape[1];
    *transposed = false;
    if ((out <= 1 || dw->stride[1] == 1) && dw->stride[0] >= (out > 1 ? out : 1) &&
        dw->stride[0] <= 0x7fffffff)
        return true;
    *transposed = true;
    return (in <= 1 || dw->stride[0] == 1) && dw->stride[1] >= (in > 1 ? in : 1) &&
           dw->stride[1] <= 0x7fffffff;
}

static wgrad wgrad_plan(const attn_tensor *dw, mha_ws *w) {
    bool tr;
    wgrad r = {dw, NULL};
    if (dw && !wgrad_direct(dw, &tr)) r.scratch = mha_take(w, dw->shape[0] * dw->shape[1]);
    return r;
}

static void wgrad_run(const wgrad *r, mha_op a, const float *g, int64_t M) {
    const attn_tensor *dw = r->dw;
    if (!dw) return;
    const int64_t in = dw->shape[0], out = dw->shape[1], ldg = out > 1 ? out : 1;
    bool tr;
    if (!r->scratch && wgrad_direct(dw, &tr)) {
        if (!tr)
            (void)ai_gemm_f32(true, false, in, out, M, 1.0f, a.p, a.ld, g, ldg, 0.0f,
                              (float *)dw->data, dw->stride[0]);
        else
            (void)ai_gemm_f32(true, false, out, in, M, 1.0f, g, ldg, a.p, a.ld, 0.0f,
                              (float *)dw->data, dw->stride[1]);
        return;
    }
    (void)ai_gemm_f32(true, false, in, out, M, 1.0f, a.p, a.ld, g, ldg, 0.0f, r->scratch,
                      ldg);
    for (int64_t i = 0; i < in; i++)
        for (int64_t o = 0; o < out; o++)
            ((float *)dw->data)[i * dw->stride[0] + o * dw->stride[1]] = r->scratch[i * out + o];
}

/* db[c] = Σ_r g[r, c] in row order, in double: a thread takes BIAS_COLS columns and
 * walks the rows, each column's sum the same sequence of additions as one column alone
 * (the bits do not depend on the blocking or the thread count) */
#define BIAS_COLS 64
static void bias_grad(const attn_tensor *db, const float *g, int64_t M, int64_t N) {
    if (!db) return;
    const int64_t nblk = (N + BIAS_COLS - 1) / BIAS_COLS;
#pragma omp parallel for schedule(static)
    for (int64_t blk = 0; blk < nblk; blk++) {
        const int64_t c0 = blk * BIAS_COLS, nc = N - c0 < BIAS_COLS ? N - c0 : BIAS_COLS;
        double s[BIAS_COLS] = {0};
        for (int64_t r = 0; r < M; r++) {
            const float *row = g + r * N + c0;
            for (int64_t c = 0; c < nc; c++) s[c] += row[c];
        }
        for (int64_t c = 0; c < nc; c++)
            ((float *)db->data)[(c0 + c) * db->stride[0]] = (float)s[c];
    }
}

/* dx [M, C] = Σ_t g_t op(w_t)ᵀ over up to three terms (g_t dense [M, N_t]) */
typedef struct xterm {
    const float *g;
    int64_t n;
    mha_op w;
} xterm;

static void xgrad_run(const attn_tensor *dx, const mha_target *t, const xterm *terms,
                      int nterms, int64_t M, int64_t C) {
    if (!dx) return;
    for (int e = 0; e < nterms; e++) {
        const int64_t n = terms[e].n;
        mha_gemm_w(true, M, terms[e].g, n > 1 ? n : 1, &terms[e].w, e ? 1.0f : 0.0f, t->p,
                   t->ld);
    }
    mha_scatter(dx, t);
}

static attn_status backward_ws(const mha_plan *pl, const attn_tensor *dy,
                               const attn_mha_grads *g, const attn_options *opt, mha_ws *w) {
    const int64_t B = pl->B, Lq = pl->Lq, Lk = pl->Lk, Hq = pl->Hq, Hkv = pl->Hkv;
    const int64_t mq = B * Lq, mk = B * Lk;
    const bool self = pl->self;
    mha_qkv s;
    float *lse;
    if (pl->keep) {  /* attn_mha_backward_saved: the forward's own, not recomputed */
        mha_qkv_layout(pl, w, &s);
        (void)mha_keep_layout(pl, w->count_only ? NULL : pl->keep, NULL, &lse);
    } else {
        TRY(mha_forward_ws(pl, NULL, NULL, false, opt, w, &s, &lse));
    }
    const mha_op gy = mha_rows_op(dy, w);
    float *gdense = gy.ld != (pl->E > 1 ? pl->E : 1) ? mha_take(w, mq * pl->E) : NULL;
    float *d_o = mha_take(w, mq * Hq * pl->Dv);   /* (B, Lq, Hq, Dv) */
    float *dq = mha_take(w, mq * Hq * pl->Dk);    /* (B, Lq, Hq, Dk) */
    float *dk = mha_take(w, mk * Hkv * pl->Dk);   /* (B, Lk, Hkv, Dk) */
    float *dv = mha_take(w, mk * Hkv * pl->Dv);   /* (B, Lk, Hkv, Dv) */
    const wgrad wg[MHA_N] = {wgrad_plan(g->dw_q, w), wgrad_plan(g->dw_k, w),
                             wgrad_plan(g->dw_v, w), wgrad_plan(g->dw_o, w)};
    mha_target tq = {0}, tkv = {0};
    if (g->dx_q) tq = mha_rows_target(g->dx_q, w);
    if (g->dx_kv) tkv = mha_rows_target(g->dx_kv, w);

    attn_tensor q = mha_heads_view(s.q, B, Lq, Hq, pl->Dk);
    attn_tensor k = mha_heads_view(s.k, B, Lk, Hkv, pl->Dk);
    attn_tensor v = mha_heads_view(s.v, B, Lk, Hkv, pl->Dv);
    attn_tensor o = mha_heads_view(s.o, B, Lq, Hq, pl->Dv);
    attn_tensor vdo = mha_heads_view(d_o, B, Lq, Hq, pl->Dv);
    attn_tensor vdq = mha_heads_view(dq, B, Lq, Hq, pl->Dk);
    attn_tensor vdk = mha_heads_view(dk, B, Lk, Hkv, pl->Dk);
    attn_tensor vdv = mha_heads_view(dv, B, Lk, Hkv, pl->Dv);
    attn_tensor tl = attn_tensor_4d(lse, ATTN_F32, B, Hq, Lq, 1);
    static const attn_options defaults = {0};
    attn_options bo = opt ? *opt : defaults;
    size_t need;
    TRY(attn_backward_workspace_size(&q, &k, &v, &o, &vdo, &tl, &vdq, &vdk, &vdv, &bo, &need));
    bo.workspace = mha_take(w, (int64_t)((need + 3) / 4));
    bo.workspace_bytes = need;
    if (w->overflow) return ai_fail(ATTN_ERR_OVERFLOW, "workspace size overflows size_t");
    if (w->count_only) return ATTN_OK;

    /* dO = G W_Oᵀ */
    const int64_t ho = Hq * pl->Dv;
    mha_gemm_w(true, mq, gy.p, gy.ld, &s.w[MHA_O], 0.0f, d_o, ho > 1 ? ho : 1);
    TRY(attn_backward(&q, &k, &v, &o, &vdo, &tl, &vdq, &vdk, &vdv, &bo));
    /* Q = rope(x_q W_Q + b_Q): the rotation's transpose is the inverse rotation */
    ai_rope_apply(pl->rope, pl->rdim, pl->base, pl->offset, NULL, dq, B, Lq, Hq, pl->Dk, true);
    ai_rope_apply(pl->rope, pl->rdim, pl->base, pl->offset, NULL, dk, B, Lk, Hkv, pl->Dk, true);

    /* every gradient below is written only now, after the last call that can fail */
    if (gdense) {  /* the bias sum and dW_O read G dense */
        for (int64_t r = 0; r < mq; r++)
            memcpy(gdense + r * pl->E, gy.p + r * gy.ld, (size_t)pl->E * sizeof(float));
    }
    const float *gd = gdense ? gdense : gy.p;
    const mha_op oop = {.p = s.o, .ld = ho > 1 ? ho : 1};
    wgrad_run(&wg[MHA_O], oop, gd, mq);
    bias_grad(g->db_o, gd, mq, pl->E);
    wgrad_run(&wg[MHA_Q], s.xq, dq, mq);
    wgrad_run(&wg[MHA_K], s.xkv, dk, mk);
    wgrad_run(&wg[MHA_V], s.xkv, dv, mk);
    bias_grad(g->db_q, dq, mq, pl->out[MHA_Q]);
    bias_grad(g->db_k, dk, mk, pl->out[MHA_K]);
    bias_grad(g->db_v, dv, mk, pl->out[MHA_V]);
    const xterm terms[3] = {{dq, pl->out[MHA_Q], s.w[MHA_Q]},
                            {dk, pl->out[MHA_K], s.w[MHA_K]},
                            {dv, pl->out[MHA_V], s.w[MHA_V]}};
    if (self) {
        xgrad_run(g->dx_q, &tq, terms, 3, mq, pl->E);
    } else {
        xgrad_run(g->dx_q, &tq, terms, 1, mq, pl->E);
        xgrad_run(g->dx_kv, &tkv, terms + 1, 2, mk, pl->Ekv);
    }
    return ATTN_OK;
}

typedef struct bwd_ctx {
    mha_plan pl;
    const attn_tensor *dy;
    const attn_mha_grads *g;
} bwd_ctx;

static attn_status backward_body(const void *ctx, const attn_options *opt, mha_ws *w) {
    const bwd_ctx *b = ctx;
    return backward_ws(&b->pl, b->dy, b->g, opt, w);
}

/* attn_mha_backward and its variants: saved NULL recomputes the forward; bytes not NULL
 * is the workspace query */
static attn_status backward_call(const attn_mha *m, const attn_tensor *x_q,
                                 const attn_tensor *x_kv, const attn_tensor *dy,
                                 const attn_mha_grads *g, const attn_options *opt,
                                 const void *saved, size_t saved_bytes, size_t *bytes) {
    bwd_ctx b = {.dy = dy, .g = g};
    if (opt && opt->dropout_p != 0.0f)  // as the forward (mha.c, mha_attend)
        return ai_fail(ATTN_ERR_UNSUPPORTED, "options.dropout_p = %g: the multi-head module "
                       "has no dropout", (double)opt->dropout_p);
    if (opt && opt->d_bias)  // the heads' calls would each write it: not summed over them
        return ai_fail(ATTN_ERR_UNSUPPORTED, "options.d_bias: the multi-head module does "
                       "not return the bias's gradient");
    TRY(mha_plan_init(&b.pl, m, x_q, x_kv, NULL, bytes == NULL));
    TRY(check_grads(&b.pl, dy, g, x_kv == NULL, bytes == NULL));
    if (saved) TRY(mha_keep_check(&b.pl, saved, saved_bytes, bytes == NULL));
    mha_io io;
    mha_io_init(&io, &b.pl, opt);
    mha_io_add(&io, false, dy, "dy");
    mha_io_bytes(&io, false, saved, saved_bytes, "saved");
    if (g) {
        const attn_tensor *const out[] = {g->dx_q, g->dx_kv, g->dw_q, g->dw_k, g->dw_v,
                                          g->dw_o, g->db_q, g->db_k, g->db_v, g->db_o};
        static const char *const name[] = {"dx_q", "dx_kv", "dw_q", "dw_k", "dw_v",
                                           "dw_o", "db_q", "db_k", "db_v", "db_o"};
        for (int a = 0; a < 10; a++) mha_io_add(&io, true, out[a], name[a]);
    }
    return mha_two_pass(backward_body, &b, opt, &io, bytes);
}

attn_status attn_mha_backward(const attn_mha *m, const attn_tensor *x_q, const attn_tensor *x_kv,
                              const attn_tensor *dy, const attn_mha_grads *g,
                              const attn_options *opt) {
    return backward_call(m, x_q, x_kv, dy, g, opt, NULL, 0, NULL);
}

attn_status attn_mha_backward_saved(const attn_mha *m, const attn_tensor *x_q,
                                    const attn_tensor *x_kv, const attn_tensor *dy,
                                    const attn_mha_grads *g, const attn_options *opt,
                                    const void *saved, size_t saved_bytes) {
    if (!saved) return ai_fail(ATTN_ERR_NULL, "saved: NULL buffer");
    return backward_call(m, x_q, x_kv, dy, g, opt, saved, saved_bytes, NULL);
}

attn_status attn_mha_backward_workspace_size(const attn_mha *m, const attn_tensor *x_q,
                                             const attn_tensor *x_kv, const attn_tensor *dy,
                                             const attn_mha_grads *g, const attn_options *opt,
                                             const void *saved, size_t saved_bytes,
                                             size_t *bytes) {
    if (!bytes) return ai_fail(ATTN_ERR_NULL, "bytes: NULL output pointer");
    return backward_call(m, x_q, x_kv, dy, g, opt, saved, saved_bytes, bytes);
}
