/*
 * additive_backward.c — the gradients of additive attention on the fused path, and the
 *                       public attn_additive_backward (its argument checks, then the
 *                       fused or the float64 path).
 *
 * Two sweeps over the same tiles, each with one owner per output so that nothing is
 * summed in an order that depends on the threads:
 *   keys  — one item per (batch, key tile): every query row that reads the tile is
 *           re-scored (tanh kept for the tile), p = exp(e - lse), and the tile's dV,
 *           dKpᵀ and a partial dṽ are summed over the rows in order;
 *   rows  — one item per (batch, query row): its tiles re-scored, dQp summed in order.
 * Then, per batch, through the BLAS: dQ = dQp Wᵀ, dW += Qᵀ dQp, dK = dKp Uᵀ,
 * dU += Kᵀ dKp; d bias = Σ_j dKp_j; the dṽ partials are added in a fixed order.
 * What is not here: the scoring arithmetic (additive_body.h) or the projections
 * (additive_proj.c).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "additive.h"
#include "additive_proj.h"
#include "core/blas.h"

typedef struct bwd_mem {
    float *dqp;    /* (B, Lq, A)                      */
    float *dkpt;   /* (B, A, Lk)                      */
    float *dvt;    /* (B, tiles, A) partials of dṽ    */
    float *Dr;     /* (B, Lq) dO_i · o_i              */
    float *tmp;    /* (max(Lq Dq, Lk Dk)) a product before it is scattered */
    int64_t tiles;
} bwd_mem;

/* The per-thread scratch of one tile: t (A x TILE), e, p, de (TILE). */
typedef struct bwd_scratch {
    float *t, *e, *pr, *de;
} bwd_scratch;

static bwd_scratch carve(const attn_additive_proj *pr, int thread, int64_t A) {
    float *s = attn_proj_thread_scratch(pr, thread);
    return (bwd_scratch){s, s + A * ATTN_ADD_TILE, s + (A + 1) * ATTN_ADD_TILE,
                         s + (A + 2) * ATTN_ADD_TILE};
}

/* Row i against keys [j0, j0 + nk), all inside the row's range: t, then
 *   p_j = exp(e_j - lse_i)  (the forward's weights),  de_j = p_j (dO_i · V_j - D_i),
 * with de_j = 0 where p_j = 0 (that key's V row is not read). Returns whether any p_j
 * is nonzero. */
static bool tile_de(const attn_additive_params *p, const attn_additive_bwd *g,
                    const attn_additive_proj *pr, const bwd_mem *bm, const bwd_scratch *w,
                    int64_t b, int64_t i, int64_t d_i, int64_t j0, int64_t nk) {
    const attn_params *m = &p->m;
    const float lse = g->lse[b * g->lse_s[0] + i * g->lse_s[2]];
    p->kern->score(nk, p->A, attn_proj_qp(pr, b, i), attn_proj_kpt(pr, b) + j0, m->Lk, pr->vt,
                   w->e, w->t);
    const float *do_i = g->d_o + b * g->d_o_s[0] + i * g->d_o_s[2];
    const float Di = bm->Dr[b * m->Lq + i];
    bool any = false;
    for (int64_t j = 0; j < nk; j++) {
        const float e = m->mask ? attn_finish_logit(m, w->e[j], b, 0, i, j0 + j, d_i) : w->e[j];
        const float pj = expf(e - lse);
        w->pr[j] = pj;
        w->de[j] = 0.0f;
        if (pj == 0.0f) continue;
        any = true;
        const float *v_j = p->val + b * p->val_s[0] + (j0 + j) * p->val_s[2];
        float dp = 0.0f;
        if (g->d_o_s[3] == 1 && p->val_s[3] == 1)
            dp = p->kern->dot(m->Dv, do_i, v_j);
        else
            for (int64_t d = 0; d < m->Dv; d++) dp += do_i[d * g->d_o_s[3]] * v_j[d * p->val_s[3]];
        w->de[j] = pj * (dp - Di);
    }
    return any;
}

/* The keys sweep: item (b, tile). */
static void keys_item(const attn_additive_params *p, const attn_additive_bwd *g,
                      const attn_additive_proj *pr, const bwd_mem *bm, const bwd_scratch *w,
                      float *dval_tile, int64_t b, int64_t tile) {
    const attn_params *m = &p->m;
    const int64_t A = p->A, Dv = m->Dv, lk_b = attn_key_len(m, b);
    const int64_t t0 = tile * ATTN_ADD_TILE;
    const int64_t tn = m->Lk - t0 < ATTN_ADD_TILE ? m->Lk - t0 : ATTN_ADD_TILE;
    float *dkpt = bm->dkpt + b * A * m->Lk + t0;  /* (A, tn) at row stride Lk */
    float *dvt = bm->dvt + (b * bm->tiles + tile) * A;
    for (int64_t a = 0; a < A; a++) {
        dvt[a] = 0.0f;
        for (int64_t j = 0; j < tn; j++) dkpt[a * m->Lk + j] = 0.0f;
    }
    for (int64_t c = 0; c < tn * Dv; c++) dval_tile[c] = 0.0f;
    for (int64_t i = 0; i < m->Lq; i++) {
        int64_t lo, hi;
        attn_row_range(m, lk_b, i, &lo, &hi);
        if (lo < t0) lo = t0;
        if (hi > t0 + tn) hi = t0 + tn;
        if (lo >= hi) continue;
        if (g->lse[b * g->lse_s[0] + i * g->lse_s[2]] == -INFINITY) continue;  /* gives 0 */
        if (!tile_de(p, g, pr, bm, w, b, i, attn_diagonal(m, lk_b, i), lo, hi - lo)) continue;
        /* o_i = Σ_j p_ij V_j  ->  dV_j += p_ij dO_i */
        const float *do_i = g->d_o + b * g->d_o_s[0] + i * g->d_o_s[2];
        for (int64_t j = 0; j < hi - lo; j++) {
            if (w->pr[j] == 0.0f) continue;
            float *dv_j = dval_tile + (lo - t0 + j) * Dv;
            if (g->d_o_s[3] == 1)  /* the common layout: the ISA's kernel */
                p->kern->axpy(Dv, w->pr[j], do_i, dv_j);
            else
                for (int64_t d = 0; d < Dv; d++) dv_j[d] += w->pr[j] * do_i[d * g->d_o_s[3]];
        }
        p->kern->grad(hi - lo, A, w->t, w->de, pr->vt, NULL, dkpt + (lo - t0), m->Lk, dvt);
    }
    for (int64_t j = 0; g->dval && j < tn; j++)
        for (int64_t d = 0; d < Dv; d++)
            g->dval[b * g->dval_s[0] + (t0 + j) * g->dval_s[2] + d * g->dval_s[3]] =
                dval_tile[j * Dv + d];
}

/* The rows sweep: item (b, i). */
static void rows_item(const attn_additive_params *p, const attn_additive_bwd *g,
                      const attn_additive_proj *pr, const bwd_mem *bm, const bwd_scratch *w,
                      int64_t b, int64_t i) {
    const attn_params *m = &p->m;
    const int64_t A = p->A, lk_b = attn_key_len(m, b);
    float *dqp = bm->dqp + (b * m->Lq + i) * A;
    for (int64_t a = 0; a < A; a++) dqp[a] = 0.0f;
    if (g->lse[b * g->lse_s[0] + i * g->lse_s[2]] == -INFINITY) return;
    int64_t lo, hi;
    attn_row_range(m, lk_b, i, &lo, &hi);
    const int64_t d_i = attn_diagonal(m, lk_b, i);
    /* the keys sweep's tiles, cut to the row's range, so t and de are the same numbers */
    for (int64_t j0 = lo, j1; j0 < hi; j0 = j1) {
        j1 = (j0 / ATTN_ADD_TILE + 1) * ATTN_ADD_TILE;
        if (j1 > hi) j1 = hi;
        if (tile_de(p, g, pr, bm, w, b, i, d_i, j0, j1 - j0))
            p->kern->grad(j1 - j0, A, w->t, w->de, pr->vt, dqp, NULL, 0, NULL);
    }
}

static void scatter(const float *src, int64_t L, int64_t D, float *dst, const int64_t s[4],
                    int64_t b) {
    for (int64_t r = 0; r < L; r++)
        for (int64_t d = 0; d < D; d++) dst[b * s[0] + r * s[2] + d * s[3]] = src[r * D + d];
}

/* The products of one batch through the weights, and d bias. */
static attn_status through_weights(const attn_additive_params *p, const attn_additive_bwd *g,
                                   attn_additive_proj *pr, const bwd_mem *bm, int64_t b,
                                   double *dbias) {
    const attn_params *m = &p->m;
    const int64_t A = p->A, Lq = m->Lq, Lk = m->Lk;
    const float *dqp = bm->dqp + b * Lq * A, *dkpt = bm->dkpt + b * A * Lk;
    const attn_additive_grads *gr = &g->gr;
    int64_t ld;
    if (g->dq) {  /* x = Q W  ->  dQ = dQp Wᵀ */
        TRY(ai_proj_product(false, true, Lq, p->Dq, A, dqp, A, p->w_query, A, false, bm->tmp, p->Dq));
        scatter(bm->tmp, Lq, p->Dq, g->dq, g->dq_s, b);
    }
    if (gr->d_w_query) {  /* dW += Qᵀ dQp */
        const float *qb = ai_proj_rows(p->q, p->q_s, b, Lq, p->Dq, attn_proj_gather(pr, 0), &ld);
        TRY(ai_proj_product(true, false, p->Dq, A, Lq, qb, ld, dqp, A, b > 0, gr->d_w_query, A));
    }
    if (g->dk) {  /* Kp = K U  ->  dK = dKp Uᵀ = (dKpᵀ)ᵀ Uᵀ */
        TRY(ai_proj_product(true, true, Lk, m->Dk, A, dkpt, Lk, p->w_key, A, false, bm->tmp, m->Dk));
        scatter(bm->tmp, Lk, m->Dk, g->dk, g->dk_s, b);
    }
    if (gr->d_w_key) {  /* dU += Kᵀ dKp = Kᵀ (dKpᵀ)ᵀ, over the keys some row reads */
        int64_t j0, j1;
        ai_additive_read_keys(p, b, &j0, &j1);
        const float *kb = ai_proj_rows(p->k, p->k_s, b, Lk, m->Dk, attn_proj_gather(pr, 0), &ld);
        TRY(ai_proj_product(true, true, m->Dk, A, j1 - j0, kb + j0 * ld, ld, dkpt + j0, Lk,
                            b > 0, gr->d_w_key, A));
    }
    for (int64_t a = 0; a < A; a++)
        for (int64_t j = 0; j < Lk; j++) dbias[a] += dkpt[a * Lk + j];
    return ATTN_OK;
}

attn_status ai_additive_fused_backward(const attn_additive_params *p,
                                       const attn_additive_bwd *g) {
    const attn_params *m = &p->m;
    const int64_t A = p->A, B = m->B, Lq = m->Lq, Lk = m->Lk, Dv = m->Dv;
    bwd_mem bm = {.tiles = (Lk + ATTN_ADD_TILE - 1) / ATTN_ADD_TILE};
    const int64_t wide = Lq * p->Dq > Lk * m->Dk ? Lq * p->Dq : Lk * m->Dk;  /* bm.tmp */
    const int64_t extra = B * Lq * A + B * A * Lk + B * bm.tiles * A + B * Lq + wide + 64;
    attn_additive_proj pr;
    /* per thread: the tile's t, e, p, de, and a dV tile */
    TRY(ai_proj_init(&pr, p, m->threads, (A + 3) * ATTN_ADD_TILE + ATTN_ADD_TILE * Dv, extra));
    bm.dqp = pr.extra;
    bm.dkpt = bm.dqp + B * Lq * A;
    bm.dvt = bm.dkpt + B * A * Lk;
    bm.Dr = bm.dvt + B * bm.tiles * A;
    bm.tmp = bm.Dr + B * Lq;
    ai_proj_vt(&pr, p);
    attn_status st = ATTN_OK;
    /* the sums of d bias and d ṽ over the batches, allocated before any output is written */
    double *acc = ai_calloc((size_t)(2 * A + 1), sizeof(double));
    if (!acc) {
        ai_proj_free(&pr);
        return ai_fail(ATTN_ERR_NOMEM, "additive backward: out of memory");
    }
#pragma omp parallel num_threads(m->threads)
    {
        const int th = attn_thread_num();
        const bwd_scratch w = carve(&pr, th, A);
        float *dval_tile = w.de + ATTN_ADD_TILE;
#pragma omp for schedule(dynamic, 1)
        for (int64_t b = 0; b < B; b++) {
            attn_status sb = ai_proj_batch(&pr, p, b, attn_proj_gather(&pr, th));
            if (sb != ATTN_OK) {
#pragma omp critical(attn_additive_bwd_status)
                st = sb;
            }
        }
        /* D_i = dO_i · o_i, which equals Σ_j p_ij dp_ij */
#pragma omp for schedule(static)
        for (int64_t r = 0; r < B * Lq; r++) {
            const int64_t b = r / Lq, i = r % Lq;
            const float *do_i = g->d_o + b * g->d_o_s[0] + i * g->d_o_s[2];
            const float *o_i = p->o + b * p->o_s[0] + i * p->o_s[2];
            float s = 0.0f;
            for (int64_t d = 0; d < Dv; d++) s += do_i[d * g->d_o_s[3]] * o_i[d * p->o_s[3]];
            bm.Dr[r] = s;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < B * bm.tiles; it++)
            if (st == ATTN_OK) keys_item(p, g, &pr, &bm, &w, dval_tile, it / bm.tiles, it % bm.tiles);
#pragma omp for schedule(dynamic, 1)
        for (int64_t r = 0; r < B * Lq; r++)
            if (st == ATTN_OK) rows_item(p, g, &pr, &bm, &w, r / Lq, r % Lq);
    }
    /* the weights' gradients sum over the batches in order: one thread (the products
     * through the BLAS's own threads) */
    for (int64_t b = 0; st == ATTN_OK && b < B; b++) st = through_weights(p, g, &pr, &bm, b, acc);
    if (st == ATTN_OK) {
        const attn_additive_grads *gr = &g->gr;
        if (B == 0 || Lq == 0 || Lk == 0) {  /* no product ran: the gradients are 0 */
            if (gr->d_w_query) memset(gr->d_w_query, 0, (size_t)(p->Dq * A) * sizeof(float));
            if (gr->d_w_key) memset(gr->d_w_key, 0, (size_t)(m->Dk * A) * sizeof(float));
        }
        for (int64_t c = 0; c < B * bm.tiles; c++)
            for (int64_t a = 0; a < A; a++) acc[A + a] += bm.dvt[c * A + a];
        for (int64_t a = 0; gr->d_bias && a < A; a++) gr->d_bias[a] = (float)acc[a];
        ai_additive_v_grad(p, acc + A, gr->d_v, gr->d_g);
    }
    ai_free(acc);
    ai_proj_free(&pr);
    return st;
}

/* ---- the public call ---------------------------------------------------------------------- */

static attn_status check_grad_tensor(const attn_tensor *t, const char *name, int64_t B,
                                     int64_t L, int64_t D, bool output, bool need) {
    if (!t) return need ? ai_fail(ATTN_ERR_NULL, "%s: NULL", name) : ATTN_OK;
    TRY(ai_check_tensor(t, name, ATTN_F32, true));
    if (t->shape[0] != B || t->shape[1] != 1 || t->shape[2] != L || t->shape[3] != D)
        return ai_fail(ATTN_ERR_SHAPE, "%s: shape [%lld, %lld, %lld, %lld], expected "
                       "[%lld, 1, %lld, %lld]", name, (long long)t->shape[0],
                       (long long)t->shape[1], (long long)t->shape[2],
                       (long long)t->shape[3], (long long)B, (long long)L, (long long)D);
    return output ? ai_check_output_strides(t, name, 4) : ATTN_OK;
}

attn_status attn_additive_backward(const attn_tensor *q, const attn_tensor *k,
                                   const attn_tensor *v, const attn_additive_weights *w,
                                   const attn_tensor *o, const attn_tensor *d_o,
                                   const attn_tensor *lse, const attn_tensor *dq,
                                   const attn_tensor *dk, const attn_tensor *dv,
                                   const attn_additive_grads *grads, const attn_options *opt) {
    if (opt && (opt->lse || opt->weights))
        return ai_fail(ATTN_ERR_VALUE, "options.lse and options.weights must be NULL in a "
                       "backward call (they are forward outputs)");
    attn_additive_params p;
    TRY(ai_additive_params_init(&p, q, k, v, w, o, opt, true));
    const int64_t B = p.m.B, Lq = p.m.Lq, Lk = p.m.Lk;
    TRY(check_grad_tensor(d_o, "d_o", B, Lq, p.m.Dv, false, true));
    TRY(check_grad_tensor(lse, "lse", B, Lq, 1, false, true));
    TRY(check_grad_tensor(dq, "dq", B, Lq, p.Dq, true, false));
    TRY(check_grad_tensor(dk, "dk", B, Lk, p.m.Dk, true, false));
    TRY(check_grad_tensor(dv, "dv", B, Lk, p.m.Dv, true, false));
    /* dq, dk, dv against every input and each other (attn_backward's rule), then the
     * weights' gradients against the inputs (the weights too) and each other */
    {
        const attn_tensor *in[] = {q, k, v, o, d_o, lse, opt ? opt->mask : NULL,
                                   opt ? opt->kv_len : NULL};
        static const char *const in_names[] = {"q", "k", "v", "o", "d_o", "lse",
                                               "options.mask", "options.kv_len"};
        const attn_tensor *out[] = {dq, dk, dv};
        static const char *const out_names[] = {"dq", "dk", "dv"};
        TRY(ai_check_aliasing(in, in_names, 8, out, out_names, 3, NULL, 0));
        const attn_additive_grads none = {0};
        TRY(ai_additive_check_aliasing(&p, q, k, v, opt, (const attn_tensor *const[]){o, d_o},
                                       grads ? grads : &none));
        /* and the weight gradients against dq, dk, dv */
        const int64_t A = p.A, fs = (int64_t)sizeof(float);
        if (grads) {
            const attn_tensor go[5] = {attn_bytes_view(grads->d_w_query, p.Dq * A * fs),
                                       attn_bytes_view(grads->d_w_key, p.m.Dk * A * fs),
                                       attn_bytes_view(grads->d_v, A * fs),
                                       attn_bytes_view(grads->d_bias, A * fs),
                                       attn_bytes_view(grads->d_g, p.normalize ? fs : 0)};
            const attn_tensor *gin[] = {dq, dk, dv, lse};
            static const char *const gin_names[] = {"dq", "dk", "dv", "lse"};
            const attn_tensor *gout[] = {&go[0], &go[1], &go[2], &go[3], &go[4]};
            static const char *const gout_names[] = {"grads.d_w_query", "grads.d_w_key",
                                                     "grads.d_v", "grads.d_bias", "grads.d_g"};
            TRY(ai_check_aliasing(gin, gin_names, 4, gout, gout_names, 5, NULL, 0));
        }
    }
    attn_additive_bwd g = {0};
    g.d_o = d_o->data;  memcpy(g.d_o_s, d_o->stride, sizeof g.d_o_s);
    g.lse = lse->data;  memcpy(g.lse_s, lse->stride, sizeof g.lse_s);
    if (dq) { g.dq = dq->data; memcpy(g.dq_s, dq->stride, sizeof g.dq_s); }
    if (dk) { g.dk = dk->data; memcpy(g.dk_s, dk->stride, sizeof g.dk_s); }
    if (dv) { g.dval = dv->data; memcpy(g.dval_s, dv->stride, sizeof g.dval_s); }
    if (grads) g.gr = *grads;
    ai_fail(ATTN_OK, "%s", "");
    return p.m.path == ATTN_PATH_REFERENCE ? ai_additive_reference_backward(&p, &g)
                                           : ai_additive_fused_backward(&p, &g);
}
