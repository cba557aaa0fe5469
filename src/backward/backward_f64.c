/*
 * backward_f64.c — the fused backward pass for float64 q, k, v, o, d_o and gradients
 *                  (ai_fused_f64_backward, called by attn_backward in backward.c once
 *                  the arguments are checked): portable C, float64 throughout, never the
 *                  Lq x Lk matrix.
 *
 * Three sweeps, each over tiles of BQ query rows against BK keys, recomputing the tile's
 * logits from Q and K exactly as the forward (fused_f64.c) does — the dot product summed
 * over d in order, times the scale, then ai_ref_finish:
 *   1. rows (b, h, query block): the row's LSE in float64, an online max and sum over its
 *      structural key range plus the sink, and D_i = dO_i · O_i; both kept per row. The
 *      lse argument is not read (a float32 one would cost float64 accuracy).
 *   2. rows again: P = exp(s - lse), dP = dO Vᵀ, dS = P (dP - D) (x softcap's
 *      1 - tanh², x scale), dQ_i += Σ_j dS_ij k_j, summed over the key tiles in order.
 *   3. keys (b, g, key block): the same tiles for every query head of the group and every
 *      query block in order, dV_j += Σ_i P_ij dO_i, dK_j += Σ_i dS_ij q_i.
 * With as many (b, g) heads as threads (and dq of unit stride along Dk), 2 and 3 are one
 * sweep, an item per head (group_grads): each tile adds its dQ terms in place beside its
 * dK and dV, in the order sweep 2 adds them, so the bits are the same.
 * d_sinks (float32, as the forward's sinks): per head -Σ_{b,i} exp(sink - lse_bhi) D_bhi in
 * float64, b then i in order. A weight or dS of exactly 0 never multiplies anything, so a
 * masked key's NaN (in K, V, dO or Q of a masked row) cannot leak (the products' zero
 * skip, gemm_f64.h).
 *
 * The products are ai_gemm_f64's (gemm_f64.h), blocked in registers, each element's sum
 * in order: the logits S = Q Kᵀ and dP = dO Vᵀ from K and V transposed into the scratch,
 * over d in order 0 .. D-1 (the forward's and the reference's order, so the same bits);
 * dQ += dS K in the order of the keys, dK += dSᵀ Q and dV += Pᵀ dO in the order of the
 * rows (Pᵀ and dSᵀ read in place through their strides).
 *
 * Every float64 output element is produced by one thread in an order fixed by the
 * shapes: bit-identical for any thread count. Extra memory: per thread the tiles,
 * BQ·(Dk + Dv) + BK·(3 Dk + 2 Dv) + 3·BQ·BK doubles; two doubles per query row (LSE, D);
 * the mask summary with a mask or bias: independent of Lk but for that summary (1/1024
 * of the mask), never Lq x Lk.
 *
 * Masks by their structure (mask_summary.h, summarized once per call as the float32 path
 * does): each row's key range is narrowed to the hulls of its mask's and bias's kept keys,
 * and a tile whose cells the mask or bias masks whole is skipped. The summary's bytes
 * come after the rows' LSE and D in the workspace. A row whose hull is all open, and a
 * tile whose cells are all open, take the logits without the mask and the bias (an open
 * cell changes nothing); the tiles left mixed take them per logit.
 *
 * What it is not: the argument checks (backward.c).
 */
#include <math.h>
#include <string.h>

#include "backward.h"
#include "core/gemm_f64.h"
#include "forward/mask_summary.h"
#include "core/team.h"

enum { BQ = 16, BK = 64 };

typedef struct f64b_plan {
    int64_t q_blocks, k_blocks, row_items, key_items, rows;
    int64_t off_q, off_do, off_k, off_kt, off_vt, off_p, off_ds, off_cap, off_acc, per_thread;
    int64_t off_lse, off_D, off_sum, total;  // after the threads' slices (off_sum: the
                                             // mask summary, 64-aligned in the call)
    int64_t off_gb;  // options.d_bias: every logit's gradient (B, Hq, Lq, Lk), after the summary
    double *gb;      // set by the call: that array, or NULL without d_bias
} f64b_plan;

static bool make_plan(const attn_bwd_params *bp, f64b_plan *pl) {
    const attn_params *p = &bp->fwd;
    *pl = (f64b_plan){0};
    if (p->Dk > (int64_t)1 << 40 || p->Dv > (int64_t)1 << 40) return false;
    pl->q_blocks = (p->Lq + BQ - 1) / BQ;
    pl->k_blocks = (p->Lk + BK - 1) / BK;
    if (__builtin_mul_overflow(p->B * p->Hq, pl->q_blocks, &pl->row_items) ||
        __builtin_mul_overflow(p->B * p->Hkv, pl->k_blocks, &pl->key_items) ||
        __builtin_mul_overflow(p->B * p->Hq, p->Lq, &pl->rows))
        return false;
    const int64_t Dk = p->Dk, Dv = p->Dv;
    int64_t n = 0;
#define CARVE(off, count) (pl->off = n, n += ((count) + 7) & ~(int64_t)7)
    CARVE(off_q, BQ * Dk);
    CARVE(off_do, BQ * Dv);
    CARVE(off_k, BK * Dk);
    CARVE(off_kt, BK * Dk);
    CARVE(off_vt, BK * Dv);
    CARVE(off_p, BQ * BK);
    CARVE(off_ds, BQ * BK);
    CARVE(off_cap, BQ * BK);
    CARVE(off_acc, BK * (Dk + Dv) > BQ * (Dk + Dv) ? BK * (Dk + Dv) : BQ * (Dk + Dv));
#undef CARVE
    pl->per_thread = n;
    int64_t t;
    if (__builtin_mul_overflow(n, (int64_t)p->threads, &t)) return false;
    pl->off_lse = t;
    if (__builtin_add_overflow(t, (pl->rows + 7) & ~(int64_t)7, &t)) return false;
    pl->off_D = t;
    if (__builtin_add_overflow(t, (pl->rows + 7) & ~(int64_t)7, &t)) return false;
    pl->off_sum = t;
    const size_t sum_bytes = ai_mask_summary_bytes(p);
    if (sum_bytes == (size_t)-1 || sum_bytes / 8 > (size_t)INT64_MAX / 2 ||
        __builtin_add_overflow(t, (int64_t)(sum_bytes / 8) + 8, &t))  // + 8: to align
        return false;
    pl->off_gb = t;
    if (bp->d_bias) {  // float64 throughout, reduced (or copied) into d_bias at the end
        int64_t g;
        if (__builtin_mul_overflow(pl->rows, p->Lk, &g) || __builtin_add_overflow(t, g, &t))
            return false;
    }
    if ((uint64_t)t > SIZE_MAX / sizeof(double)) return false;
    pl->total = t;
    return true;
}

size_t ai_fused_f64_backward_workspace(const attn_bwd_params *bp) {
    f64b_plan pl;
    if (!make_plan(bp, &pl)) return (size_t)-1;
    return (size_t)pl.total * sizeof(double);
}

/* One thread's scratch. */
typedef struct f64b_scratch {
    double *q, *d_o;     // (BQ, Dk), (BQ, Dv) the tile's query rows and their dO
    double *k;           // (BK, Dk) the tile's keys
    double *kt, *vt;     // (Dk, BK), (Dv, BK) the tile's keys and values transposed
    double *P, *dS;      // (BQ, BK) logits then P; dP then dS (scaled)
    double *cap;         // (BQ, BK) softcap factors
    double *acc;         // dQ (BQ, Dk), or dK (BK, Dk) then dV (BK, Dv)
    const attn_mask_summary *sum;  // the call's mask and bias summary, NULL: neither
    const attn_params *open;       // the params without mask and bias (with sum)
} f64b_scratch;

static f64b_scratch carve(const f64b_plan *pl, double *w, const attn_mask_summary *sum,
                          const attn_params *open) {
    return (f64b_scratch){.sum = sum, .open = open, .q = w + pl->off_q, .d_o = w + pl->off_do,
                          .k = w + pl->off_k, .kt = w + pl->off_kt, .vt = w + pl->off_vt,
                          .P = w + pl->off_p, .dS = w + pl->off_ds, .cap = w + pl->off_cap,
                          .acc = w + pl->off_acc};
}

/* Query rows i0 .. i0+nq-1 of head (b, h), and their dO, into w (dense). */
static void load_rows(const attn_bwd_params *bp, const f64b_scratch *w, int64_t b, int64_t h,
                      int64_t i0, int64_t nq) {
    const attn_params *p = &bp->fwd;
    const double *Q = p->q, *dO = (const double *)bp->d_o;
    for (int64_t r = 0; r < nq; r++) {
        const int64_t i = i0 + r;
        const double *q_i = Q + b * p->q_s[0] + h * p->q_s[1] + i * p->q_s[2];
        const double *do_i = dO + b * bp->do_s[0] + h * bp->do_s[1] + i * bp->do_s[2];
        for (int64_t d = 0; d < p->Dk; d++) w->q[r * p->Dk + d] = q_i[d * p->q_s[3]];
        for (int64_t d = 0; d < p->Dv; d++) w->d_o[r * p->Dv + d] = do_i[d * bp->do_s[3]];
    }
}

/* Keys j0 .. j0+nk-1 of head (b, g) into w: K as rows and transposed, V transposed. */
static void load_keys(const attn_params *p, const f64b_scratch *w, int64_t b, int64_t g,
                      int64_t j0, int64_t nk) {
    const double *K = p->k, *V = p->v;
    for (int64_t c = 0; c < nk; c++) {
        const int64_t j = j0 + c;
        const double *k_j = K + b * p->k_s[0] + g * p->k_s[1] + j * p->k_s[2];
        const double *v_j = V + b * p->v_s[0] + g * p->v_s[1] + j * p->v_s[2];
        for (int64_t d = 0; d < p->Dk; d++) {
            const double x = k_j[d * p->k_s[3]];
            w->k[c * p->Dk + d] = x;
            w->kt[d * BK + c] = x;
        }
        for (int64_t d = 0; d < p->Dv; d++) w->vt[d * BK + c] = v_j[d * p->v_s[3]];
    }
}

/* out[r * BK + c] = Σ_d a[r * n + d] · bt[d * BK + c] for rows r < nq and keys c < nk,
 * each sum over d in order 0 .. n-1 (as the reference's dot products: the same bits;
 * gemm_f64.h).
 *   a (nq, n)  bt (n, BK)  out (nq, BK) */
static void tile_product(const double *a, int64_t n, const double *bt, int64_t nq, int64_t nk,
                         double *out) {
    ai_gemm_f64(nq, nk, n, a, n, 1, bt, BK, out, BK, false, false);
}

/* Row i's logits over the tile's keys j0 + c, c_lo <= c < c_hi (inside the row's range),
 * from their dot products s (in place): scale * dot then ai_ref_finish under pr (the
 * forward's, fused_f64.c tile_logits, bit for bit); cap the softcap factors. The cells
 * outside are left as they are. */
static void finish_row(const attn_params *pr, double *s, double *cap, int64_t c_lo,
                       int64_t c_hi, int64_t j0, int64_t b, int64_t h, int64_t i, int64_t d_i) {
    const double scale = pr->scale64;
    if (!attn_has_elementwise(pr)) {
#pragma omp simd
        for (int64_t c = c_lo; c < c_hi; c++) {
            s[c] *= scale;
            cap[c] = 1.0;
        }
        return;
    }
    if (pr->mask && !pr->bias && !pr->alibi && !(pr->softcap > 0.0f) &&
        !pr->block && !pr->score_mod) {
        /* a bool mask alone: ai_ref_finish keeps the logit or makes it -inf, here by
         * the byte read in line */
        const uint8_t *m_i = pr->mask + b * pr->mask_s[0] + h * pr->mask_s[1] + i * pr->mask_s[2];
        for (int64_t c = c_lo; c < c_hi; c++) {
            s[c] = m_i[(j0 + c) * pr->mask_s[3]] ? scale * s[c] : -INFINITY;
            cap[c] = 1.0;
        }
        return;
    }
    for (int64_t c = c_lo; c < c_hi; c++) {
        double cp = 1.0;
        s[c] = ai_ref_finish(pr, scale * s[c], b, h, i, j0 + c, d_i, &cp);
        cap[c] = cp;
    }
}

/* [*c_lo, *c_hi): the tile's keys (j0 .., nk) inside [lo, hi), empty when none are */
static void tile_span(int64_t lo, int64_t hi, int64_t j0, int64_t nk, int64_t *c_lo,
                      int64_t *c_hi) {
    *c_lo = lo - j0 < 0 ? 0 : lo - j0 > nk ? nk : lo - j0;
    *c_hi = hi - j0 < *c_lo ? *c_lo : hi - j0 > nk ? nk : hi - j0;
}

/* Row i's key range: its structure (key length, causal band, window) narrowed to the
 * hulls of the mask's and the bias's kept keys (mask_summary.h); keys outside it are
 * -inf whatever Q and K hold. Returns whether the row's keys left are all open. */
static bool row_range(const attn_params *p, const f64b_scratch *w, int64_t lk_b, int64_t b,
                      int64_t h, int64_t i, int64_t *lo, int64_t *hi) {
    attn_row_range(p, lk_b, i, lo, hi);
    return w->sum && ai_mask_summary_row(p, w->sum, b, h, i, lo, hi);
}

/* The class of the tile (rows i0 .., keys j0 .. j0+nk-1 of head h, batch b) as far as the
 * mask and the bias go; MIXED without either. The summary's blocks are ATTN_SUM_ROWS
 * rows, a multiple of BQ: the block holding i0 covers the tile. */
static attn_tile_class tile_class(const attn_params *p, const f64b_scratch *w, int64_t b,
                                  int64_t h, int64_t i0, int64_t j0, int64_t nk) {
    return w->sum ? ai_mask_summary_tile(p, w->sum, b, h, 1, i0 / ATTN_SUM_ROWS, j0, nk)
                  : ATTN_TILE_MIXED;
}

/* The params a row's logits over a tile take: without mask and bias where they leave the
 * row or the tile open, else p. */
static const attn_params *row_params(const attn_params *p, const f64b_scratch *w, bool dense,
                                     attn_tile_class cls) {
    return w->sum && (dense || cls == ATTN_TILE_OPEN) ? w->open : p;
}

/* The union [*blo, *bhi) of the key ranges of rows i0 .. i0+nq-1 (empty: blo >= bhi). */
static void block_range(const attn_params *p, const f64b_scratch *w, int64_t b, int64_t h,
                        int64_t lk_b, int64_t i0, int64_t nq, int64_t *blo, int64_t *bhi) {
    *blo = INT64_MAX;
    *bhi = 0;
    for (int64_t r = 0; r < nq; r++) {
        int64_t lo, hi;
        row_range(p, w, lk_b, b, h, i0 + r, &lo, &hi);
        if (lo >= hi) continue;
        if (lo < *blo) *blo = lo;
        if (hi > *bhi) *bhi = hi;
    }
}

/* The walk of sweeps 1 and 2 over the key tiles of rows i0 .. i0+nq-1 of head (b, h):
 * from *j0 on (BK apart, up to bhi, block_range's end), the next tile that is not fully
 * masked, its nk keys loaded and its class in *cls; false when none is left. */
static bool next_key_tile(const attn_params *p, const f64b_scratch *w, int64_t b, int64_t h,
                          int64_t i0, int64_t bhi, int64_t *j0, int64_t *nk,
                          attn_tile_class *cls) {
    for (; *j0 < bhi; *j0 += BK) {
        *nk = bhi - *j0 < BK ? bhi - *j0 : BK;
        *cls = tile_class(p, w, b, h, i0, *j0, *nk);
        if (*cls == ATTN_TILE_MASKED) continue;
        load_keys(p, w, b, h / p->group, *j0, *nk);
        return true;
    }
    return false;
}

/* Sweep 1: the LSE and D of rows i0 .. of head (b, h). */
static void rows_stats(const attn_bwd_params *bp, const f64b_scratch *w, int64_t b, int64_t h,
                       int64_t i0, int64_t nq, double *lse, double *D) {
    const attn_params *p = &bp->fwd;
    const int64_t lk_b = attn_key_len(p, b);
    double m[BQ], l[BQ];
    int64_t lo[BQ], hi[BQ], dg[BQ];
    bool dense[BQ];
    load_rows(bp, w, b, h, i0, nq);
    for (int64_t r = 0; r < nq; r++) {
        dense[r] = row_range(p, w, lk_b, b, h, i0 + r, &lo[r], &hi[r]);
        dg[r] = attn_diagonal(p, lk_b, i0 + r);
        m[r] = -INFINITY;
        l[r] = 0.0;
    }
    int64_t blo, bhi;
    block_range(p, w, b, h, lk_b, i0, nq, &blo, &bhi);
    attn_tile_class cls;
    for (int64_t j0 = blo, nk; next_key_tile(p, w, b, h, i0, bhi, &j0, &nk, &cls); j0 += BK) {
        tile_product(w->q, p->Dk, w->kt, nq, nk, w->P);
        for (int64_t r = 0; r < nq; r++) {
            double *s = w->P + r * BK, mt = -INFINITY;
            int64_t c_lo, c_hi;
            tile_span(lo[r], hi[r], j0, nk, &c_lo, &c_hi);
            if (c_lo == c_hi) continue;  // no key of the row here
            for (int64_t c = 0; c < c_lo; c++) s[c] = -INFINITY;  // outside the row's range
            for (int64_t c = c_hi; c < nk; c++) s[c] = -INFINITY;
            finish_row(row_params(p, w, dense[r], cls), s, w->cap + r * BK, c_lo, c_hi, j0, b, h,
                       i0 + r, dg[r]);
            for (int64_t c = 0; c < nk; c++)
                if (isnan(s[c]) || s[c] > mt) mt = s[c];  // NaN sticks
            if (mt == -INFINITY) continue;
            const double m_old = m[r];
            const double m_new = isnan(m_old) || isnan(mt) ? NAN : (mt > m_old ? mt : m_old);
            if (!(m_new == m_old)) {
                l[r] *= m_old == -INFINITY ? 0.0 : exp(m_old - m_new);
                m[r] = m_new;
            }
            for (int64_t c = 0; c < nk; c++) l[r] += exp(s[c] - m_new);
        }
    }
    const double sink = attn_sink(p, h);
    const double *O = p->o;
    for (int64_t r = 0; r < nq; r++) {
        if (sink != -INFINITY) {  // one more term of the denominator (fused_f64.c)
            const double m0 = m[r];
            const double M = isnan(m0) || isnan(sink) ? NAN : m0 > sink ? m0 : sink;
            l[r] = l[r] * (m0 == -INFINITY ? 0.0 : exp(m0 - M)) + exp(sink - M);
            m[r] = M;
        }
        lse[r] = m[r] == -INFINITY ? -INFINITY : m[r] + log(l[r]);
        /* D_i = dO_i · O_i = Σ_j P_ij dP_ij (O_i = Σ_j P_ij v_j) */
        const double *o_i = O + b * p->o_s[0] + h * p->o_s[1] + (i0 + r) * p->o_s[2];
        double acc = 0.0;
        for (int64_t d = 0; d < p->Dv; d++) acc += w->d_o[r * p->Dv + d] * o_i[d * p->o_s[3]];
        D[r] = lse[r] == -INFINITY ? 0.0 : acc;  // a fully masked row's O is 0, dO unread
    }
}

/* The tile of loaded rows (i0.., nq) of head (b, h) against loaded keys (j0.., nk):
 * w->P and w->dS for every (r, c < nk); a masked cell 0. */
static void tile_grads(const attn_bwd_params *bp, const f64b_scratch *w, int64_t b, int64_t h,
                       int64_t i0, int64_t nq, int64_t j0, int64_t nk, attn_tile_class cls,
                       const double *lse, const double *D, double *gb) {
    const attn_params *p = &bp->fwd;
    const int64_t lk_b = attn_key_len(p, b);
    /* raw_ij = q_i · k_j, and (forward: o_i = Σ_j P_ij v_j) dP_ij = dO_i · v_j, for every
     * cell; a cell of a masked key is overwritten below without being read (dropout:
     * refused for float64 by ai_params_init, as in the forward) */
    tile_product(w->q, p->Dk, w->kt, nq, nk, w->P);
    tile_product(w->d_o, p->Dv, w->vt, nq, nk, w->dS);
    for (int64_t r = 0; r < nq; r++) {
        const int64_t i = i0 + r, d_i = attn_diagonal(p, lk_b, i);
        int64_t lo, hi, c_lo, c_hi;
        const bool dense = row_range(p, w, lk_b, b, h, i, &lo, &hi);
        double *P = w->P + r * BK, *dS = w->dS + r * BK, *cap = w->cap + r * BK;
        const double l = lse[r];
        tile_span(lo, hi, j0, nk, &c_lo, &c_hi);
        if (l == -INFINITY) c_hi = c_lo;  // a fully masked row: no gradient through it
        for (int64_t c = 0; c < c_lo; c++) P[c] = dS[c] = 0.0;
        for (int64_t c = c_hi; c < nk; c++) P[c] = dS[c] = 0.0;
        if (c_lo == c_hi) continue;
        finish_row(row_params(p, w, dense, cls), P, cap, c_lo, c_hi, j0, b, h, i, d_i);
        for (int64_t c = c_lo; c < c_hi; c++) {
            /* forward: P_ij = exp(s_ij - lse_i) */
            const double pij = exp(P[c] - l);
            if (pij == 0.0) {  // masked (s = -inf): its dP (v_j) is not used
                P[c] = dS[c] = 0.0;
                continue;
            }
            P[c] = pij;
            /* softmax: dS = P (dP - D); softcap: x (1 - tanh²); raw = scale q · k. The
             * bias is added to the final logit: its gradient is P (dP - D) (gb: the
             * tile's row r of the (B, Hq, Lq, Lk) array, when asked for) */
            if (gb) gb[(((b * p->Hq + h) * p->Lq) + i0 + r) * p->Lk + j0 + c] = pij * (dS[c] - D[r]);
            dS[c] = p->scale64 * (pij * (dS[c] - D[r]) * cap[c]);
        }
    }
}

/* Sweep 2: dQ of rows i0 .. of head (b, h), written to dq. */
static void rows_dq(const attn_bwd_params *bp, const f64b_scratch *w, int64_t b, int64_t h,
                    int64_t i0, int64_t nq, const double *lse, const double *D) {
    const attn_params *p = &bp->fwd;
    const int64_t lk_b = attn_key_len(p, b), Dk = p->Dk;
    load_rows(bp, w, b, h, i0, nq);
    for (int64_t e = 0; e < nq * Dk; e++) w->acc[e] = 0.0;
    int64_t blo, bhi;
    block_range(p, w, b, h, lk_b, i0, nq, &blo, &bhi);
    attn_tile_class cls;
    for (int64_t j0 = blo, nk; next_key_tile(p, w, b, h, i0, bhi, &j0, &nk, &cls); j0 += BK) {
        tile_grads(bp, w, b, h, i0, nq, j0, nk, cls, lse, D, NULL);
        /* forward: raw_ij = scale q_i · k_j, so dQ_i += Σ_j dS_ij k_j, the keys in order; a
         * dS of 0 adds +0 (skip_zero): a masked key's K is not multiplied */
        ai_gemm_f64(nq, Dk, nk, w->dS, BK, 1, w->k, Dk, w->acc, Dk, true, true);
    }
    double *dq = (double *)bp->dq;
    for (int64_t r = 0; r < nq; r++) {
        double *dq_i = dq + b * bp->dq_s[0] + h * bp->dq_s[1] + (i0 + r) * bp->dq_s[2];
        for (int64_t d = 0; d < Dk; d++) dq_i[d * bp->dq_s[3]] = w->acc[r * Dk + d];
    }
}

/* Sweep 3: dK and dV of keys j0 .. of head (b, g), written to dk and dv; with_dq: also
 * each tile's dQ terms added to dq in place (unit stride along Dk), for group_grads. */
static void keys_dkdv(const attn_bwd_params *bp, const f64b_plan *pl, const f64b_scratch *w,
                      int64_t b, int64_t g, int64_t j0, const double *LSE, const double *Dall,
                      bool with_dq) {
    const attn_params *p = &bp->fwd;
    const int64_t nk = p->Lk - j0 < BK ? p->Lk - j0 : BK, Dk = p->Dk, Dv = p->Dv;
    const int64_t lk_b = attn_key_len(p, b);
    double *dK = w->acc, *dV = w->acc + nk * Dk;
    for (int64_t e = 0; e < nk * (Dk + Dv); e++) w->acc[e] = 0.0;
    bool loaded = false;
    for (int64_t hh = 0; hh < p->group; hh++) {
        const int64_t h = g * p->group + hh;
        for (int64_t qb = 0; qb < pl->q_blocks; qb++) {
            const int64_t i0 = qb * BQ, nq = p->Lq - i0 < BQ ? p->Lq - i0 : BQ;
            int64_t blo, bhi;
            block_range(p, w, b, h, lk_b, i0, nq, &blo, &bhi);
            if (blo >= bhi || bhi <= j0 || blo >= j0 + nk) continue;  // no key of this block
            const attn_tile_class cls = tile_class(p, w, b, h, i0, j0, nk);
            if (cls == ATTN_TILE_MASKED) continue;
            if (!loaded) {
                load_keys(p, w, b, g, j0, nk);
                loaded = true;
            }
            load_rows(bp, w, b, h, i0, nq);
            const int64_t row0 = (b * p->Hq + h) * p->Lq + i0;
            tile_grads(bp, w, b, h, i0, nq, j0, nk, cls, LSE + row0, Dall + row0, pl->gb);
            /* dV_j += Σ_i P_ij dO_i;  dK_j += Σ_i dS_ij q_i: the tile's rows in order, Pᵀ
             * and dSᵀ read in place (A[c][r] at r BK + c); a weight of 0 adds +0, so a
             * fully masked row's dO and Q are not multiplied */
            ai_gemm_f64(nk, Dv, nq, w->P, 1, BK, w->d_o, Dv, dV, Dv, true, true);
            ai_gemm_f64(nk, Dk, nq, w->dS, 1, BK, w->q, Dk, dK, Dk, true, true);
            /* dQ_i += Σ_j dS_ij k_j, as rows_dq adds them: this block's keys in order */
            if (with_dq)
                ai_gemm_f64(nq, Dk, nk, w->dS, BK, 1, w->k, Dk,
                            (double *)bp->dq + b * bp->dq_s[0] + h * bp->dq_s[1] + i0 * bp->dq_s[2],
                            bp->dq_s[2], true, true);
        }
    }
    double *dk = (double *)bp->dk, *dv = (double *)bp->dv;
    for (int64_t c = 0; c < nk; c++) {
        double *dk_j = dk + b * bp->dk_s[0] + g * bp->dk_s[1] + (j0 + c) * bp->dk_s[2];
        double *dv_j = dv + b * bp->dv_s[0] + g * bp->dv_s[1] + (j0 + c) * bp->dv_s[2];
        for (int64_t d = 0; d < Dk; d++) dk_j[d * bp->dk_s[3]] = dK[c * Dk + d];
        for (int64_t d = 0; d < Dv; d++) dv_j[d * bp->dv_s[3]] = dV[c * Dv + d];
    }
}

/* Sweeps 2 and 3 in one, for the whole of head (b, g): dq of its query heads zeroed, then
 * the key blocks in order, each adding its dQ terms beside its dK and dV (5 products per
 * tile, not 3 + 4). Each dQ element gets the terms of rows_dq in the same order (the keys
 * in order, the +0 of a skipped or masked key changing no bit of a sum that starts at
 * +0), so the bits are those of the two sweeps. */
static void group_grads(const attn_bwd_params *bp, const f64b_plan *pl, const f64b_scratch *w,
                        int64_t b, int64_t g, const double *LSE, const double *Dall) {
    const attn_params *p = &bp->fwd;
    double *dq = (double *)bp->dq;
    for (int64_t hh = 0; hh < p->group; hh++)
        for (int64_t i = 0; i < p->Lq; i++) {
            double *dq_i = dq + b * bp->dq_s[0] + (g * p->group + hh) * bp->dq_s[1] + i * bp->dq_s[2];
            for (int64_t d = 0; d < p->Dk; d++) dq_i[d] = 0.0;
        }
    for (int64_t kb = 0; kb < pl->k_blocks; kb++) keys_dkdv(bp, pl, w, b, g, kb * BK, LSE, Dall, true);
}

attn_status ai_fused_f64_backward(const attn_bwd_params *bp, void *ws) {
    const attn_params *p = &bp->fwd;
    f64b_plan pl;
    if (!make_plan(bp, &pl)) return ai_fail(ATTN_ERR_OVERFLOW, "float64 backward plan overflows");
    double *base = ws, *LSE = base + pl.off_lse, *D = base + pl.off_D;
    attn_mask_summary sum;
    attn_params open;
    if (p->mask || p->bias || p->block) {
        ai_mask_summary_init(p, (void *)(((uintptr_t)(base + pl.off_sum) + 63) & ~(uintptr_t)63),
                             &sum);
        open = *p;
        open.mask = NULL;
        open.bias = NULL;
        open.block = NULL;
    }
    const attn_mask_summary *sp = p->mask || p->bias || p->block ? &sum : NULL;
    /* options.d_bias: each logit's gradient from the key sweep (which visits every tile
     * once) into the array, from 0 (the tiles no row reads are never visited) */
    if (bp->d_bias) {
        pl.gb = base + pl.off_gb;
        memset(pl.gb, 0, (size_t)(pl.rows * p->Lk) * sizeof(double));
    }
    /* keys no query row reads (beyond kv_len, outside every band) get dK = dV = 0: the
     * key sweep writes every key it owns, so nothing is left unwritten. With as many
     * (b, g) heads as threads, and dq of unit stride along Dk, one item per head does
     * sweeps 2 and 3 together (group_grads): the same bits, fewer products */
    const bool whole = bp->dq_s[3] == 1 && p->B * p->Hkv >= p->threads;
#pragma omp parallel num_threads(p->threads) if (attn_run_parallel(p, ATTN_TEAM_BACKWARD_PASSES))
    {
        const f64b_scratch w =
            carve(&pl, base + (int64_t)attn_thread_num() * pl.per_thread, sp, sp ? &open : NULL);
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < pl.row_items; t++) {
            const int64_t bh = t / pl.q_blocks, qb = t % pl.q_blocks;
            const int64_t i0 = qb * BQ, nq = p->Lq - i0 < BQ ? p->Lq - i0 : BQ;
            rows_stats(bp, &w, bh / p->Hq, bh % p->Hq, i0, nq, LSE + bh * p->Lq + i0,
                       D + bh * p->Lq + i0);
        }
        /* implicit barrier: every LSE and D is ready */
        if (bp->d_sinks) {
#pragma omp for schedule(static)
            for (int64_t h = 0; h < p->Hq; h++) {
                /* d sink_h = -Σ_{b,i} exp(sink_h - lse_bhi) D_bhi (its dP is 0) */
                const double sink = attn_sink(p, h);
                double acc = 0.0;
                for (int64_t b = 0; sink != -INFINITY && b < p->B; b++)
                    for (int64_t i = 0; i < p->Lq; i++) {
                        const int64_t r = (b * p->Hq + h) * p->Lq + i;
                        const double wgt = LSE[r] == -INFINITY ? 0.0 : exp(sink - LSE[r]);
                        if (wgt != 0.0) acc += wgt * D[r];
                    }
                bp->d_sinks[h * bp->d_sinks_s] = (float)-acc;
            }
        }
        if (whole) {
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < p->B * p->Hkv; t++)
                group_grads(bp, &pl, &w, t / p->Hkv, t % p->Hkv, LSE, D);
        } else {
#pragma omp for schedule(dynamic, 1) nowait
            for (int64_t t = 0; t < pl.row_items; t++) {
                const int64_t bh = t / pl.q_blocks, qb = t % pl.q_blocks;
                const int64_t i0 = qb * BQ, nq = p->Lq - i0 < BQ ? p->Lq - i0 : BQ;
                rows_dq(bp, &w, bh / p->Hq, bh % p->Hq, i0, nq, LSE + bh * p->Lq + i0,
                        D + bh * p->Lq + i0);
            }
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < pl.key_items; t++) {
                const int64_t bg = t / pl.k_blocks, kb = t % pl.k_blocks;
                keys_dkdv(bp, &pl, &w, bg / p->Hkv, bg % p->Hkv, kb * BK, LSE, D, false);
            }
        }
    }
    if (bp->d_bias) ai_d_bias_reduce(bp, pl.gb, true);
    return ATTN_OK;
}
