/*
 * additive_reference.c — the float64 path of additive attention, forward and backward:
 *                        the oracle the fused path is tested against, selectable with
 *                        ATTN_PATH_REFERENCE.
 *
 * Straightforward on purpose: the projections, ṽ, every score e_ij = Σ_a ṽ_a tanh(qp_ia +
 * kp_ja), the softmax and every gradient in float64 with libm's tanh and exp, one query
 * row at a time; no BLAS, no tiles. It allocates O(L·A + L·D) doubles per batch. Masks and
 * the edge cases follow docs/CONTRACT.md through the dot-product path's own helpers
 * (attn_row_range, ai_ref_finish). Serial: the same on any thread count.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "additive.h"

typedef struct ref_ws {
    double *qp, *kp;     /* (Lq, A), (Lk, A) one batch                       */
    double *vt;          /* (A)                                              */
    double *e, *pr;      /* (Lk) logits and weights of one row                */
    double *dqp, *dkp;   /* (Lq, A), (Lk, A) backward                        */
    double *dvt;         /* (A)                                              */
    double *dval;        /* (Lk, Dv)                                         */
    double *acc;         /* (max(Dv, Dq, Dk))                                */
} ref_ws;

static double *dalloc(int64_t n, bool *ok) {
    double *p = ai_calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    if (!p) *ok = false;
    return p;
}

static bool ws_alloc(const attn_additive_params *p, ref_ws *w) {
    const attn_params *m = &p->m;
    const int64_t A = p->A, wide = m->Dv > p->Dq ? (m->Dv > m->Dk ? m->Dv : m->Dk)
                                                  : (p->Dq > m->Dk ? p->Dq : m->Dk);
    bool ok = true;
    w->qp = dalloc(m->Lq * A, &ok);   w->kp = dalloc(m->Lk * A, &ok);
    w->vt = dalloc(A, &ok);           w->e = dalloc(m->Lk, &ok);
    w->pr = dalloc(m->Lk, &ok);       w->dqp = dalloc(m->Lq * A, &ok);
    w->dkp = dalloc(m->Lk * A, &ok);  w->dvt = dalloc(A, &ok);
    w->dval = dalloc(m->Lk * m->Dv, &ok);
    w->acc = dalloc(wide, &ok);
    return ok;
}

static void ws_free(ref_ws *w) {
    ai_free(w->qp); ai_free(w->kp); ai_free(w->vt); ai_free(w->e); ai_free(w->pr);
    ai_free(w->dqp); ai_free(w->dkp); ai_free(w->dvt); ai_free(w->dval); ai_free(w->acc);
}

static double at(const float *x, const int64_t s[4], int64_t b, int64_t r, int64_t d) {
    return (double)x[b * s[0] + r * s[2] + d * s[3]];
}

/* qp = Q_b W, kp = K_b U + bias, vt = ṽ, all in float64 */
static void project(const attn_additive_params *p, int64_t b, ref_ws *w) {
    const attn_params *m = &p->m;
    const int64_t A = p->A;
    for (int64_t i = 0; i < m->Lq; i++)
        for (int64_t a = 0; a < A; a++) {
            double s = 0;
            for (int64_t d = 0; d < p->Dq; d++)
                s += at(p->q, p->q_s, b, i, d) * (double)p->w_query[d * A + a];
            w->qp[i * A + a] = s;
        }
    for (int64_t j = 0; j < m->Lk; j++)
        for (int64_t a = 0; a < A; a++) {
            double s = p->bias ? (double)p->bias[a] : 0.0;
            for (int64_t d = 0; d < m->Dk; d++)
                s += at(p->k, p->k_s, b, j, d) * (double)p->w_key[d * A + a];
            w->kp[j * A + a] = s;
        }
    double n2 = 0;
    for (int64_t a = 0; a < A; a++) n2 += (double)p->v[a] * (double)p->v[a];
    const double f = p->normalize ? (n2 > 0 ? (double)p->g / sqrt(n2) : 0.0) : 1.0;
    for (int64_t a = 0; a < A; a++) w->vt[a] = f * (double)p->v[a];
}

/* Row i's weights into w->pr (0 outside its keys); returns its LSE (-inf: fully masked). */
static double row_softmax(const attn_additive_params *p, int64_t b, int64_t i, ref_ws *w) {
    const attn_params *m = &p->m;
    const int64_t lk_b = attn_key_len(m, b), A = p->A;
    int64_t lo, hi;
    attn_row_range(m, lk_b, i, &lo, &hi);
    const int64_t d_i = attn_diagonal(m, lk_b, i);
    double mx = -INFINITY;
    bool nan = false;
    for (int64_t j = 0; j < m->Lk; j++) {
        w->e[j] = -INFINITY;
        w->pr[j] = 0.0;
        if (j < lo || j >= hi) continue;  /* never read */
        double s = 0;
        for (int64_t a = 0; a < A; a++) s += w->vt[a] * tanh(w->qp[i * A + a] + w->kp[j * A + a]);
        w->e[j] = ai_ref_finish(m, s, b, 0, i, j, d_i, NULL);
        if (w->e[j] > mx) mx = w->e[j];
        nan |= isnan(w->e[j]);
    }
    if (mx == -INFINITY && !nan) return -INFINITY;
    if (nan) mx = NAN;
    double l = 0;
    for (int64_t j = lo; j < hi; j++) l += exp(w->e[j] - mx);
    for (int64_t j = lo; j < hi; j++) w->pr[j] = exp(w->e[j] - mx) / l;
    return mx + log(l);
}

attn_status ai_additive_reference_forward(const attn_additive_params *p) {
    const attn_params *m = &p->m;
    ref_ws w;
    if (!ws_alloc(p, &w)) {
        ws_free(&w);
        return ai_fail(ATTN_ERR_NOMEM, "additive reference: out of memory");
    }
    for (int64_t b = 0; b < m->B; b++) {
        project(p, b, &w);
        for (int64_t i = 0; i < m->Lq; i++) {
            const double lse = row_softmax(p, b, i, &w);
            for (int64_t d = 0; d < m->Dv; d++) w.acc[d] = 0;
            for (int64_t j = 0; j < m->Lk; j++) {
                if (w.pr[j] == 0.0) continue;  /* masked or underflowed: V row not read */
                for (int64_t d = 0; d < m->Dv; d++) w.acc[d] += w.pr[j] * at(p->val, p->val_s, b, j, d);
            }
            float *o_i = p->o + b * p->o_s[0] + i * p->o_s[2];
            for (int64_t d = 0; d < m->Dv; d++) o_i[d * p->o_s[3]] = (float)w.acc[d];
            if (m->lse) m->lse[b * m->lse_s[0] + i * m->lse_s[2]] = (float)lse;
            if (m->weights)
                for (int64_t j = 0; j < m->Lk; j++)
                    m->weights[b * m->w_s[0] + i * m->w_s[2] + j * m->w_s[3]] = (float)w.pr[j];
        }
    }
    ws_free(&w);
    return ATTN_OK;
}

/* Through the forward, one batch:
 *   o_i = Σ_j p_ij V_j              ->  dV_j += p_ij dO_i,  dp_ij = dO_i · V_j
 *   p_ij = softmax_j(e_ij)          ->  de_ij = p_ij (dp_ij - Σ_j' p_ij' dp_ij')
 *   e_ij = Σ_a ṽ_a tanh(x_ija)      ->  dṽ_a += de_ij t_ija,  dx_ija = de_ij ṽ_a (1 - t²)
 *   x_ija = qp_ia + kp_ja           ->  dqp_ia += dx_ija,  dkp_ja += dx_ija            */
static void backward_batch(const attn_additive_params *p, const attn_additive_bwd *g,
                           int64_t b, ref_ws *w) {
    const attn_params *m = &p->m;
    const int64_t A = p->A, Dv = m->Dv;
    memset(w->dqp, 0, (size_t)(m->Lq * A) * sizeof(double));
    memset(w->dkp, 0, (size_t)(m->Lk * A) * sizeof(double));
    memset(w->dval, 0, (size_t)(m->Lk * Dv) * sizeof(double));
    for (int64_t i = 0; i < m->Lq; i++) {
        if (row_softmax(p, b, i, w) == -INFINITY) continue;  /* contributes 0 */
        double D = 0;
        for (int64_t j = 0; j < m->Lk; j++) {
            if (w->pr[j] == 0.0) { w->e[j] = 0; continue; }
            double dp = 0;
            for (int64_t d = 0; d < Dv; d++)
                dp += at(g->d_o, g->d_o_s, b, i, d) * at(p->val, p->val_s, b, j, d);
            w->e[j] = dp;  /* e now holds dp */
            D += w->pr[j] * dp;
            for (int64_t d = 0; d < Dv; d++)
                w->dval[j * Dv + d] += w->pr[j] * at(g->d_o, g->d_o_s, b, i, d);
        }
        for (int64_t j = 0; j < m->Lk; j++) {
            if (w->pr[j] == 0.0) continue;
            const double de = w->pr[j] * (w->e[j] - D);
            for (int64_t a = 0; a < A; a++) {
                const double t = tanh(w->qp[i * A + a] + w->kp[j * A + a]);
                w->dvt[a] += de * t;
                const double dx = de * w->vt[a] * (1.0 - t * t);
                w->dqp[i * A + a] += dx;
                w->dkp[j * A + a] += dx;
            }
        }
    }
}

/* out[r, c] (strided, float) = Σ_a dx[r, a] W[c, a];  grad[c, a] += Σ_r in[r, c] dx[r, a]
 * over the rows [r0, r1) that are read */
static void through_weights(const float *W, int64_t Dw, int64_t A, const double *dx,
                            int64_t L, int64_t r0, int64_t r1, const float *in,
                            const int64_t in_s[4], int64_t b, float *out,
                            const int64_t out_s[4], double *grad) {
    for (int64_t r = 0; out && r < L; r++)
        for (int64_t c = 0; c < Dw; c++) {
            double s = 0;
            for (int64_t a = 0; a < A; a++) s += dx[r * A + a] * (double)W[c * A + a];
            out[b * out_s[0] + r * out_s[2] + c * out_s[3]] = (float)s;
        }
    for (int64_t c = 0; grad && c < Dw; c++)
        for (int64_t a = 0; a < A; a++)
            for (int64_t r = r0; r < r1; r++) grad[c * A + a] += at(in, in_s, b, r, c) * dx[r * A + a];
}

attn_status ai_additive_reference_backward(const attn_additive_params *p,
                                           const attn_additive_bwd *g) {
    const attn_params *m = &p->m;
    const int64_t A = p->A;
    ref_ws w;
    bool ok = ws_alloc(p, &w);
    double *gw = dalloc(p->Dq * A, &ok), *gu = dalloc(m->Dk * A, &ok), *gb = dalloc(A, &ok);
    if (!ok) {
        ws_free(&w); ai_free(gw); ai_free(gu); ai_free(gb);
        return ai_fail(ATTN_ERR_NOMEM, "additive reference: out of memory");
    }
    for (int64_t b = 0; b < m->B; b++) {
        project(p, b, &w);
        backward_batch(p, g, b, &w);
        int64_t j0, j1;
        ai_additive_read_keys(p, b, &j0, &j1);
        through_weights(p->w_query, p->Dq, A, w.dqp, m->Lq, 0, m->Lq, p->q, p->q_s, b, g->dq,
                        g->dq_s, gw);
        through_weights(p->w_key, m->Dk, A, w.dkp, m->Lk, j0, j1, p->k, p->k_s, b, g->dk,
                        g->dk_s, gu);
        for (int64_t j = 0; j < m->Lk; j++)
            for (int64_t a = 0; a < A; a++) gb[a] += w.dkp[j * A + a];
        for (int64_t j = 0; g->dval && j < m->Lk; j++)
            for (int64_t d = 0; d < m->Dv; d++)
                g->dval[b * g->dval_s[0] + j * g->dval_s[2] + d * g->dval_s[3]] =
                    (float)w.dval[j * m->Dv + d];
    }
    const attn_additive_grads *gr = &g->gr;
    for (int64_t c = 0; gr->d_w_query && c < p->Dq * A; c++) gr->d_w_query[c] = (float)gw[c];
    for (int64_t c = 0; gr->d_w_key && c < m->Dk * A; c++) gr->d_w_key[c] = (float)gu[c];
    for (int64_t a = 0; gr->d_bias && a < A; a++) gr->d_bias[a] = (float)gb[a];
    ai_additive_v_grad(p, w.dvt, gr->d_v, gr->d_g);
    ws_free(&w); ai_free(gw); ai_free(gu); ai_free(gb);
    return ATTN_OK;
}
