/*
 * additive.c — additive (Bahdanau) attention's public calls and its fused forward: the
 *              projections through the BLAS door and the streaming sweep over key tiles
 *              with the online softmax. Luong's `general` and `concat` forms are thin
 *              callers at the end. The params' filler and the helpers the paths share are
 *              additive_params.c's.
 *
 * What it is not: the scoring arithmetic (additive_body.h, per ISA), the backward
 * (additive_backward.c), the float64 path (additive_reference.c).
 *
 * Per batch, Qp = Q W [Lq, A] and Kpᵀ = Uᵀ Kᵀ + b [A, Lk] are formed once by
 * ai_gemm_f32 (workspace linear in Lq + Lk). Each query row is then one work item: it
 * walks its structural key range [lo, hi) in tiles of ATTN_ADD_TILE keys, scores a tile
 * (A adds, A tanh, A multiply-adds a key), and folds it into (m, l, acc) as the
 * dot-product path does — never more than A x tile of the Lq x Lk x A work at a time.
 * A row is computed by one thread in a fixed order: bit-identical for any thread count.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "additive.h"
#include "additive_proj.h"
#include "core/blas.h"
#include "kernels/kernels.h"

attn_status attn_additive_tanh(int64_t n, const float *x, float *y) {
    if (n < 0) return ai_fail(ATTN_ERR_SHAPE, "n = %lld is negative", (long long)n);
    if (n > 0 && (!x || !y)) return ai_fail(ATTN_ERR_NULL, "x or y is NULL");
    if ((uint64_t)n > (uint64_t)INT64_MAX / sizeof(float))
        return ai_fail(ATTN_ERR_OVERFLOW, "n = %lld floats overflow int64 bytes", (long long)n);
    /* elementwise: y = x (in place) is fine, y over another part of x is not */
    const attn_tensor tx = attn_bytes_view(x, n * (int64_t)sizeof(float));
    const attn_tensor ty = attn_bytes_view(y, n * (int64_t)sizeof(float));
    if (x != y && ai_views_overlap(&tx, &ty))
        return ai_fail(ATTN_ERR_STRIDE, "y: overlaps x in memory (only y = x, in place, "
                       "may share bytes)");
    const attn_additive_kernels *kern = ai_additive_select();
    if (!kern) return ai_fail(ATTN_ERR_UNSUPPORTED, "no kernel this CPU can run (ATTN_ISA)");
    kern->tanh(n, x, y);
    return ai_ok();
}

/* ---- the fused forward -------------------------------------------------------------------- */

/* One row's sweep state: the running max m, the sum l, the accumulator acc (Dv). */
typedef struct row_state {
    float m, l;
    float *acc, *tmp;   /* (Dv) each */
    float *e;           /* (ATTN_ADD_TILE) logits of the tile */
} row_state;

/* The final logits of row i over keys [j0, j0 + nk): the score, then the bool mask. */
static void tile_logits(const attn_additive_params *p, const attn_additive_proj *pr,
                        const float *vt, int64_t b, int64_t i, int64_t d_i, int64_t j0,
                        int64_t nk, float *e) {
    p->kern->score(nk, p->A, attn_proj_qp(pr, b, i), attn_proj_kpt(pr, b) + j0, p->m.Lk, vt,
                   e, NULL);
    if (p->m.mask)
        for (int64_t j = 0; j < nk; j++)
            e[j] = attn_finish_logit(&p->m, e[j], b, 0, i, j0 + j, d_i);
}

static void fold_tile(const attn_additive_params *p, row_state *s, int64_t b, int64_t j0,
                      int64_t nk) {
    const int64_t Dv = p->m.Dv;
    float mt = -INFINITY;
    bool nan = false;
    for (int64_t j = 0; j < nk; j++) {
        if (s->e[j] > mt) mt = s->e[j];
        nan |= isnan(s->e[j]);
    }
    /* a NaN logit makes the row NaN: the running max is kept NaN once seen */
    const float m_new = (nan || isnan(s->m)) ? NAN : (mt > s->m ? mt : s->m);
    if (m_new == -INFINITY) return;  /* nothing unmasked yet: exp(-inf - -inf) is NaN */
    const float alpha = expf(s->m - m_new);
    float ps = 0.0f;
    for (int64_t d = 0; d < Dv; d++) s->tmp[d] = 0.0f;
    for (int64_t j = 0; j < nk; j++) {
        const float pj = expf(s->e[j] - m_new);
        if (pj == 0.0f) continue;  /* masked or underflowed: its V row is not read */
        ps += pj;
        const float *v_j = p->val + b * p->val_s[0] + (j0 + j) * p->val_s[2];
        if (p->val_s[3] == 1)  /* the common layout: the ISA's kernel */
            p->kern->axpy(Dv, pj, v_j, s->tmp);
        else
            for (int64_t d = 0; d < Dv; d++) s->tmp[d] += pj * v_j[d * p->val_s[3]];
    }
    s->l = s->l * alpha + ps;
    for (int64_t d = 0; d < Dv; d++) s->acc[d] = s->acc[d] * alpha + s->tmp[d];
    s->m = m_new;
}

static void forward_row(const attn_additive_params *p, const attn_additive_proj *pr,
                        const float *vt, float *scratch, int64_t b, int64_t i) {
    const attn_params *m = &p->m;
    const int64_t lk_b = attn_key_len(m, b), Dv = m->Dv;
    int64_t lo, hi;
    attn_row_range(m, lk_b, i, &lo, &hi);
    const int64_t d_i = attn_diagonal(m, lk_b, i);
    row_state s = {-INFINITY, 0.0f, scratch, scratch + Dv, scratch + 2 * Dv};
    for (int64_t d = 0; d < Dv; d++) s.acc[d] = 0.0f;
    for (int64_t j0 = lo; j0 < hi; j0 += ATTN_ADD_TILE) {
        const int64_t nk = hi - j0 < ATTN_ADD_TILE ? hi - j0 : ATTN_ADD_TILE;
        tile_logits(p, pr, vt, b, i, d_i, j0, nk, s.e);
        fold_tile(p, &s, b, j0, nk);
    }
    float *o_i = p->o + b * p->o_s[0] + i * p->o_s[2];
    const bool empty = s.m == -INFINITY;  /* fully masked: O = 0, LSE = -inf */
    for (int64_t d = 0; d < Dv; d++) o_i[d * p->o_s[3]] = empty ? 0.0f : s.acc[d] / s.l;
    if (m->lse)
        m->lse[b * m->lse_s[0] + i * m->lse_s[2]] = empty ? -INFINITY : s.m + logf(s.l);
    if (!m->weights) return;
    /* the weights: a second sweep with the row's final m and l */
    float *w_i = m->weights + b * m->w_s[0] + i * m->w_s[2];
    for (int64_t j = 0; j < m->Lk; j++) w_i[j * m->w_s[3]] = 0.0f;
    if (empty) return;
    for (int64_t j0 = lo; j0 < hi; j0 += ATTN_ADD_TILE) {
        const int64_t nk = hi - j0 < ATTN_ADD_TILE ? hi - j0 : ATTN_ADD_TILE;
        tile_logits(p, pr, vt, b, i, d_i, j0, nk, s.e);
        for (int64_t j = 0; j < nk; j++)
            w_i[(j0 + j) * m->w_s[3]] = expf(s.e[j] - s.m) / s.l;
    }
}

attn_status ai_additive_fused_forward(const attn_additive_params *p) {
    const attn_params *m = &p->m;
    attn_additive_proj pr;
    TRY(ai_proj_init(&pr, p, m->threads, 2 * m->Dv + ATTN_ADD_TILE, 0));
    ai_proj_vt(&pr, p);
    attn_status st = ATTN_OK;
#pragma omp parallel num_threads(m->threads)
    {
        const int t = attn_thread_num();
        float *scratch = attn_proj_thread_scratch(&pr, t);
#pragma omp for schedule(dynamic, 1)
        for (int64_t b = 0; b < m->B; b++) {
            attn_status sb = ai_proj_batch(&pr, p, b, attn_proj_gather(&pr, t));
            if (sb != ATTN_OK) {
#pragma omp critical(attn_additive_status)
                st = sb;
            }
        }
        /* the barrier of the loop above: every projection is done, st is final */
#pragma omp for schedule(dynamic, 1)
        for (int64_t r = 0; r < m->B * m->Lq; r++)
            if (st == ATTN_OK) forward_row(p, &pr, pr.vt, scratch, r / m->Lq, r % m->Lq);
    }
    ai_proj_free(&pr);
    return st;
}

/* ---- public calls --------------------------------------------------------------------------- */

attn_status ai_additive_check_aliasing(const attn_additive_params *p, const attn_tensor *q,
                                       const attn_tensor *k, const attn_tensor *v,
                                       const attn_options *opt,
                                       const attn_tensor *const more[2],
                                       const attn_additive_grads *gr) {
    const int64_t A = p->A, fs = (int64_t)sizeof(float);
    /* the weights' byte ranges (sizes within int64: params_init checked D x A) */
    const attn_tensor wq = attn_bytes_view(p->w_query, p->Dq * A * fs);
    const attn_tensor wk = attn_bytes_view(p->w_key, p->m.Dk * A * fs);
    const attn_tensor wv = attn_bytes_view(p->v, A * fs);
    const attn_tensor wb = attn_bytes_view(p->bias, A * fs);
    const attn_tensor *in[] = {q, k, v, &wq, &wk, &wv, &wb, opt ? opt->mask : NULL,
                               opt ? opt->kv_len : NULL, NULL, NULL};
    static const char *const in_names[] = {"q", "k", "v", "weights.w_query", "weights.w_key",
                                           "weights.v", "weights.bias", "options.mask",
                                           "options.kv_len", "o", "d_o"};
    int n_in = 9;
    attn_tensor go[5];
    const attn_tensor *out[10];
    const char *out_names[10];
    int n_out = 0;
    if (!gr) {  /* the forward: more = {o, NULL}, then opt's lse and weights */
        out[n_out] = more[0], out_names[n_out++] = "o";
        out[n_out] = opt ? opt->lse : NULL, out_names[n_out++] = "options.lse";
        out[n_out] = opt ? opt->weights : NULL, out_names[n_out++] = "options.weights";
    } else {    /* the backward: more = {o, d_o} are inputs; the gradients are outputs */
        in[n_in++] = more[0];
        in[n_in++] = more[1];
        go[0] = attn_bytes_view(gr->d_w_query, p->Dq * A * fs);
        go[1] = attn_bytes_view(gr->d_w_key, p->m.Dk * A * fs);
        go[2] = attn_bytes_view(gr->d_v, A * fs);
        go[3] = attn_bytes_view(gr->d_bias, A * fs);
        go[4] = attn_bytes_view(gr->d_g, p->normalize ? fs : 0);
        static const char *const g_names[] = {"grads.d_w_query", "grads.d_w_key", "grads.d_v",
                                              "grads.d_bias", "grads.d_g"};
        for (int a = 0; a < 5; a++) out[n_out] = &go[a], out_names[n_out++] = g_names[a];
    }
    return ai_check_aliasing(in, in_names, n_in, out, out_names, n_out, NULL, 0);
}

attn_status attn_additive_forward(const attn_tensor *q, const attn_tensor *k,
                                  const attn_tensor *v, const attn_additive_weights *w,
                                  const attn_tensor *o, const attn_options *opt) {
    attn_additive_params p;
    TRY(ai_additive_params_init(&p, q, k, v, w, o, opt, true));
    TRY(ai_additive_check_aliasing(&p, q, k, v, opt, (const attn_tensor *const[]){o, NULL},
                                   NULL));
    ai_fail(ATTN_OK, "%s", "");
    if (p.m.B == 0 || p.m.Lq == 0) return ATTN_OK;
    return p.m.path == ATTN_PATH_REFERENCE ? ai_additive_reference_forward(&p)
                                           : ai_additive_fused_forward(&p);
}

attn_status attn_luong_concat_forward(const attn_tensor *q, const attn_tensor *k,
                                      const attn_tensor *v, const attn_additive_weights *w,
                                      const attn_tensor *o, const attn_options *opt) {
    return attn_additive_forward(q, k, v, w, o, opt);
}

attn_status attn_luong_general_forward(const attn_tensor *q, const attn_tensor *k,
                                       const attn_tensor *v, const float *w,
                                       const attn_tensor *o, const attn_options *opt) {
    if (opt && opt->key_scores)  // the inner attn_forward would take them: refused, as elsewhere
        return ai_fail(ATTN_ERR_UNSUPPORTED, "options.key_scores: an output of attn_forward alone");
    TRY(ai_check_tensor(q, "q", ATTN_F32, true));
    TRY(ai_check_tensor(k, "k", ATTN_DTYPE_COUNT, true));
    const int64_t B = q->shape[0], H = q->shape[1], Lq = q->shape[2], Dq = q->shape[3];
    const int64_t Dk = k->shape[3];
    int64_t n;
    if (__builtin_mul_overflow(B * H, Lq, &n) || __builtin_mul_overflow(n, Dk > Dq ? Dk : Dq, &n))
        return ai_fail(ATTN_ERR_OVERFLOW, "q: [B, H, Lq, max(Dq, Dk)] overflows int64");
    if (!w && Dq > 0 && Dk > 0) return ai_fail(ATTN_ERR_NULL, "w: NULL");
    /* q and W are read through a copy the inner attn_forward does not see: the outputs
     * against them here (the rest, o against k and v, is attn_forward's own check) */
    if (o && ai_check_tensor(o, "o", ATTN_DTYPE_COUNT, true) == ATTN_OK) {
        int64_t wbytes;
        if (__builtin_mul_overflow(Dq, Dk, &wbytes) ||
            __builtin_mul_overflow(wbytes, (int64_t)sizeof(float), &wbytes))
            return ai_fail(ATTN_ERR_OVERFLOW, "w: Dq x Dk floats overflow int64 bytes");
        const attn_tensor tw = attn_bytes_view(w, n > 0 ? wbytes : 0);
        const attn_tensor *in[] = {q, &tw};
        static const char *const in_names[] = {"q", "w"};
        const attn_tensor *out[] = {o, opt ? opt->lse : NULL, opt ? opt->weights : NULL};
        static const char *const out_names[] = {"o", "options.lse", "options.weights"};
        TRY(ai_check_aliasing(in, in_names, 2, out, out_names, 3, NULL, 0));
    }
    /* qp [B, H, Lq, Dk] = q W, then plain attention on (qp, k, v): qp_i · k_j = q_i W k_jᵀ */
    float *qp = ai_malloc((size_t)(n > 0 ? 2 * n : 1) * sizeof(float)), *gather = qp + n;
    if (!qp) return ai_fail(ATTN_ERR_NOMEM, "luong general: could not allocate q W");
    attn_status st = ATTN_OK;
    for (int64_t bh = 0; st == ATTN_OK && bh < B * H; bh++) {
        int64_t ld;
        const float *rows = ai_proj_rows((const float *)q->data + (bh % H) * q->stride[1],
                                         q->stride, bh / H, Lq, Dq, gather, &ld);
        st = ai_proj_product(false, false, Lq, Dk, Dq, rows, ld, w, Dk, false,
                             qp + bh * Lq * Dk, Dk);
    }
    if (st == ATTN_OK) {
        attn_tensor qt = attn_tensor_4d(qp, ATTN_F32, B, H, Lq, Dk);
        attn_options o2 = opt ? *opt : (attn_options){0};
        if (!o2.has_scale) o2.has_scale = true, o2.scale = 1.0f;  /* Luong: no 1/√d */
        st = attn_forward(&qt, k, v, o, &o2);
    }
    ai_free(qp);
    return st;
}
