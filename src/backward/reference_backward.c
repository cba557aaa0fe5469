/*
 * reference_backward.c — the float64 reference backward pass: the oracle of the fused
 *                        backward, selectable at run time with ATTN_PATH_REFERENCE; and the
 *                        float64 forward and backward on dense arrays that the tests
 *                        difference (backward.h).
 *
 * Straightforward on purpose. For each batch and key/value head it copies the group's
 * inputs into float64, and for each query head of the group it materializes the Lq x Lk
 * probabilities P and the logit gradients dS, then forms
 *     dQ = dS K,   dK += dSᵀ Q,   dV += Pᵀ dO       (dK, dV summed over the group's heads)
 * in float64. Every row is recomputed from Q, K and V: the forward's O and LSE, which the
 * fused path reads, are validated by attn_backward but not used here — the oracle is the
 * exact gradient of the function at these inputs, not of the forward's float32 rounding.
 * Not fast: it needs (2 or 3) * Lq * Lk doubles of workspace. Rows (then keys) run in
 * parallel, each computed by one thread in a fixed order: results do not depend on the
 * thread count.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "backward.h"
#include "core/half.h"
#include "core/philox.h"

/* ---- one row of probabilities ------------------------------------------------------- */

/* Row i of query head h (batch b): P_i[j] = the row's softmax of the final logits, 0 for
 * a masked key and all 0 for a fully masked row. When cap_i is given (softcap > 0 or a
 * score function), cap_i[j] = d s_ij / d raw_ij = score_mod'(raw_ij) (1 - tanh²(
 * score_mod(raw_ij) / softcap)), either factor 1 when absent, for the keys of the row's
 * structural range. Returns the row's LSE (-inf when fully masked). The order of
 * operations is the contract's, as in reference.c:
 *     raw = scale * (q_i · k_j)
 *     s   = score_mod(raw, b, h, i, j)          (if given)
 *     s   = softcap * tanh(s / softcap)         (if softcap > 0)
 *     s  += bias_ij - slope_h * |d_i - j|       (if given)
 *     s   = -inf where masked
 *     P_ij = exp(s_ij - m_i) / l_i
 *   q_i (Dk)   k (Lk, Dk)   P_i, cap_i (Lk) */
static double ref_row(const attn_params *p, int64_t b, int64_t h, int64_t i,
                      const double *q_i, const double *k, double *P_i, double *cap_i,
                      double *p_sink) {
    const int64_t lk_b = attn_key_len(p, b), Dk = p->Dk;
    int64_t lo, hi;
    attn_row_range(p, lk_b, i, &lo, &hi);
    const int64_t d_i = attn_diagonal(p, lk_b, i);
    double m = -INFINITY;
    for (int64_t j = 0; j < p->Lk; j++) {
        if (j < lo || j >= hi) {  // masked by structure: k_j is never read
            P_i[j] = -INFINITY;
            continue;
        }
        const double *k_j = k + j * Dk;
        double dot = 0.0;
        for (int64_t d = 0; d < Dk; d++) dot += q_i[d] * k_j[d];
        const double s = ai_ref_finish(p, p->scale64 * dot, b, h, i, j, d_i,
                                       cap_i ? &cap_i[j] : NULL);
        P_i[j] = s;
        if (isnan(s) || s > m) m = s;  // NaN sticks, as in the forward
    }
    /* the sink, one more logit of the denominator with no value (reference.c) */
    const double sink = attn_sink(p, h);
    if (isnan(sink) || (!isnan(m) && sink > m)) m = sink;
    if (p_sink) *p_sink = 0.0;
    if (m == -INFINITY) {  // fully masked, no sink: P = 0, LSE = -inf, no gradient
        for (int64_t j = 0; j < p->Lk; j++) P_i[j] = 0.0;
        return -INFINITY;
    }
    double l = 0.0;
    for (int64_t j = 0; j < p->Lk; j++) {
        P_i[j] = exp(P_i[j] - m);  // exp(-inf - m) = 0 for masked keys
        l += P_i[j];
    }
    const double e_sink = sink == -INFINITY ? 0.0 : exp(sink - m);
    l += e_sink;
    for (int64_t j = 0; j < p->Lk; j++) P_i[j] /= l;
    if (p_sink) *p_sink = e_sink / l;  // the sink's probability, exp(sink - lse)
    return m + log(l);
}

/* ---- one key/value group ------------------------------------------------------------ */

/* Scratch of one group: P and dS (Lq, Lk) each, the softcap factors (Lq, Lk) when
 * softcap > 0, the dropout factors Z (Lq, Lk) with dropout. */
static int64_t ref_mats(const attn_params *p) {
    return 2 + (p->softcap > 0.0f || p->score_mod ? 1 : 0) + (p->dropout ? 1 : 0);
}

/* Row i of head h (batch b): Z_i[j] = 1 / (1 - p) where dropout keeps weight (i, j), 0
 * where it drops it (philox.h); all 1 without dropout. */
static void ref_dropout_row(const attn_params *p, int64_t b, int64_t h, int64_t i, double *Z_i) {
    const uint64_t r = attn_drop_row(p, b, h, i);
    for (int64_t j = 0; j < p->Lk; j++)
        Z_i[j] = !p->dropout ? 1.0
                 : attn_dropout_kept(p->drop_seed, p->drop_offset, p->drop_threshold, r,
                                     attn_drop_keys(p), (uint64_t)j)
                     ? p->drop_scale64
                     : 0.0;
}

/* The forward of the query heads h = g*group .. of key/value head g, batch b.
 *   q (group, Lq, Dk)  k (Lk, Dk)  v (Lk, Dv)  o (group, Lq, Dv)  lse (group, Lq) or NULL
 *   P (Lq, Lk) scratch */
static void ref_group_forward(const attn_params *p, int64_t b, int64_t g, const double *q,
                              const double *k, const double *v, double *o, double *lse,
                              double *P) {
    const int64_t Lq = p->Lq, Lk = p->Lk, Dk = p->Dk, Dv = p->Dv;
    double *Z = P + (ref_mats(p) - 1) * Lq * Lk;  // the dropout factors, with dropout
    for (int64_t hh = 0; hh < p->group; hh++) {
        const int64_t h = g * p->group + hh;
#pragma omp parallel for schedule(static) num_threads(p->threads)
        for (int64_t i = 0; i < Lq; i++) {
            double *P_i = P + i * Lk;
            const double l = ref_row(p, b, h, i, q + (hh * Lq + i) * Dk, k, P_i, NULL, NULL);
            if (lse) lse[hh * Lq + i] = l;
            /* dropout: o_i = Σ_j P_ij Z_ij v_j, the LSE the undropped one */
            if (p->dropout) {
                ref_dropout_row(p, b, h, i, Z + i * Lk);
                for (int64_t j = 0; j < Lk; j++) P_i[j] *= Z[i * Lk + j];
            }
            double *o_i = o + (hh * Lq + i) * Dv;
            for (int64_t d = 0; d < Dv; d++) o_i[d] = 0.0;
            for (int64_t j = 0; j < Lk; j++) {
                if (P_i[j] == 0.0) continue;  // a masked (or dropped) key's V is never multiplied
                for (int64_t d = 0; d < Dv; d++) o_i[d] += P_i[j] * v[j * Dv + d];
            }
        }
    }
}

/* The gradients of the same heads. dq is written; dk and dv are written with the sum
 * over the group's query heads; with d_sink (Hq, else NULL) each head's sink gradient over
 * this batch's rows is added to d_sink[h], the rows in order (sink_rows: Lq scratch).
 *   q, dq (group, Lq, Dk)  k, dk (Lk, Dk)  v, dv (Lk, Dv)  d_o (group, Lq, Dv)
 *   mats: ref_mats(p) scratch matrices of (Lq, Lk) */
/* The bias's gradient (options.d_bias) in float64: acc, dense in the bias's shape n (1
 * where it broadcasts), gets each head's logit gradients P (dP - D) (magnitudes: P (|dP| +
 * |D|)) added in the order b, h, i, j; g is an (Lq, Lk) scratch for one head's. */
typedef struct ref_dbias {
    double *acc, *g;
    int64_t n[4];
} ref_dbias;

static void ref_dbias_add(const attn_params *p, const ref_dbias *db, int64_t b, int64_t h) {
    const int64_t *n = db->n;
    for (int64_t i = 0; i < p->Lq; i++)
        for (int64_t j = 0; j < p->Lk; j++) {
            const int64_t at = (((n[0] > 1 ? b : 0) * n[1] + (n[1] > 1 ? h : 0)) * n[2] +
                                (n[2] > 1 ? i : 0)) * n[3] + (n[3] > 1 ? j : 0);
            db->acc[at] += db->g[i * p->Lk + j];
        }
}

static void ref_group_backward(const attn_params *p, int64_t b, int64_t g, const double *q,
                               const double *k, const double *v, const double *d_o,
                               double *dq, double *dk, double *dv, double *mats, bool mag,
                               double *sink_rows, double *d_sink, const ref_dbias *db) {
    const int64_t Lq = p->Lq, Lk = p->Lk, Dk = p->Dk, Dv = p->Dv;
    double *P = mats, *dS = mats + Lq * Lk;
    double *cap = p->softcap > 0.0f || p->score_mod ? mats + 2 * Lq * Lk : NULL;
    double *Z = p->dropout ? mats + (ref_mats(p) - 1) * Lq * Lk : NULL;  // dropout factors
    const double scale = p->scale64;
    memset(dk, 0, (size_t)(Lk * Dk) * sizeof(double));
    memset(dv, 0, (size_t)(Lk * Dv) * sizeof(double));

    for (int64_t hh = 0; hh < p->group; hh++) {
        const int64_t h = g * p->group + hh;
        const double *q_h = q + hh * Lq * Dk, *do_h = d_o + hh * Lq * Dv;
        double *dq_h = dq + hh * Lq * Dk;

        /* rows: P, dS and dQ */
#pragma omp parallel for schedule(static) num_threads(p->threads)
        for (int64_t i = 0; i < Lq; i++) {
            double *P_i = P + i * Lk, *dS_i = dS + i * Lk, *cap_i = cap ? cap + i * Lk : NULL;
            const double *do_i = do_h + i * Dv;
            double p_sink;
            ref_row(p, b, h, i, q_h + i * Dk, k, P_i, cap_i, &p_sink);
            double *Z_i = Z ? Z + i * Lk : NULL;
            if (Z_i) ref_dropout_row(p, b, h, i, Z_i);

            /* forward: o_i = Σ_j P_ij Z_ij v_j (Z = 1 without dropout; with it, Z_ij is
             * 1 / (1 - p) where the weight is kept and 0 where dropped), so
             * dP_ij = Z_ij (dO_i · v_j); and D_i = Σ_j P_ij dP_ij (= dO_i · o_i with the
             * float64 o_i). A dropped key's v_j is not read, as a masked one's. */
            double D_i = 0.0;
            for (int64_t j = 0; j < Lk; j++) {
                dS_i[j] = 0.0;
                if (P_i[j] == 0.0) continue;  // masked: v_j is not read
                if (Z_i && Z_i[j] == 0.0) continue;  // dropped: dP_ij = 0
                double dp = 0.0;
                if (mag)  // the magnitude of the dot: its error is relative to this
                    for (int64_t d = 0; d < Dv; d++) dp += fabs(do_i[d] * v[j * Dv + d]);
                else
                    for (int64_t d = 0; d < Dv; d++) dp += do_i[d] * v[j * Dv + d];
                if (Z_i) dp *= Z_i[j];
                dS_i[j] = dp;
                D_i += P_i[j] * dp;
            }
            /* forward: the sink is a logit of the denominator with value 0, so its dP is 0
             * and d sink = P_sink (0 - D_i) */
            if (sink_rows) sink_rows[i] = p_sink == 0.0 ? 0.0 : -p_sink * D_i;
            /* forward: P_ij = exp(s_ij - m_i) / l_i, whose Jacobian is
             * dP_ij/ds_il = P_ij (δ_jl - P_il), so dS_ij = P_ij (dP_ij - D_i);
             * forward: s = softcap * tanh(raw / softcap), ds/draw = 1 - tanh²;
             * forward: raw = scale * (q_i · k_j), the scale goes to dQ and dK.
             * Bias, ALiBi and masks are constants: no gradient flows to them. */
            double *g_i = db ? db->g + i * Lk : NULL;
            for (int64_t j = 0; g_i && j < Lk; j++) g_i[j] = 0.0;
            for (int64_t j = 0; j < Lk; j++) {
                if (P_i[j] == 0.0) continue;
                double ds = mag ? P_i[j] * (fabs(dS_i[j]) + fabs(D_i)) : P_i[j] * (dS_i[j] - D_i);
                /* forward: the bias is added to the final logit, after scale and softcap */
                if (g_i) g_i[j] = ds;
                if (cap_i && !mag) ds *= cap_i[j];  // magnitudes: 1 >= tanh' and its error
                /* a score function's derivative may exceed 1: in the magnitude too */
                if (cap_i && mag && p->score_mod) ds *= fabs(cap_i[j]);
                dS_i[j] = mag ? fabs(scale * ds) : scale * ds;
            }
            /* forward: raw_ij = scale * q_i · k_j, so dq_i = Σ_j dS_ij k_j */
            double *dq_i = dq_h + i * Dk;
            for (int64_t d = 0; d < Dk; d++) dq_i[d] = 0.0;
            for (int64_t j = 0; j < Lk; j++) {
                if (dS_i[j] == 0.0) continue;
                for (int64_t d = 0; d < Dk; d++) dq_i[d] += dS_i[j] * (mag ? fabs(k[j * Dk + d]) : k[j * Dk + d]);
            }
        }

        if (d_sink)
            for (int64_t i = 0; i < Lq; i++) d_sink[h] += sink_rows[i];
        if (db) ref_dbias_add(p, db, b, h);

        /* keys: dK_j += Σ_i dS_ij q_i, dV_j += Σ_i P_ij dO_i, this head after the last */
#pragma omp parallel for schedule(static) num_threads(p->threads)
        for (int64_t j = 0; j < Lk; j++) {
            double *dk_j = dk + j * Dk, *dv_j = dv + j * Dv;
            for (int64_t i = 0; i < Lq; i++) {
                /* forward: o_i = Σ_j P_ij Z_ij v_j, so dV_j += Σ_i P_ij Z_ij dO_i */
                const double P_ij = P[i * Lk + j] * (Z ? Z[i * Lk + j] : 1.0), dS_ij = dS[i * Lk + j];
                if (P_ij != 0.0)
                    for (int64_t d = 0; d < Dv; d++)
                        dv_j[d] += P_ij * (mag ? fabs(do_h[i * Dv + d]) : do_h[i * Dv + d]);
                if (dS_ij != 0.0)
                    for (int64_t d = 0; d < Dk; d++)
                        dk_j[d] += dS_ij * (mag ? fabs(q_h[i * Dk + d]) : q_h[i * Dk + d]);
            }
        }
    }
}

/* ---- sizes ---------------------------------------------------------------------------- */

/* a * b + c without overflow, into *r; false when it overflows */
static bool madd(int64_t a, int64_t b, int64_t c, int64_t *r) {
    int64_t t;
    return !__builtin_mul_overflow(a, b, &t) && !__builtin_add_overflow(t, c, r);
}

/* Doubles of one group's scratch: the matrices, then (when dense_io) the group's copies
 * of q, dq, d_o, k, dk, v, dv. -1 on overflow. */
static int64_t group_doubles(const attn_params *p, bool dense_io) {
    int64_t n = 0, lqlk;
    if (__builtin_mul_overflow(p->Lq, p->Lk, &lqlk) || !madd(ref_mats(p), lqlk, 0, &n))
        return -1;
    if (!dense_io) return n;
    int64_t rows_q;
    if (__builtin_mul_overflow(p->group, p->Lq, &rows_q)) return -1;
    if (!madd(rows_q, 2 * p->Dk + p->Dv, n, &n)) return -1;      // q, dq, d_o
    if (!madd(p->Lk, 2 * p->Dk + 2 * p->Dv, n, &n)) return -1;   // k, dk, v, dv
    return n;
}

/* ---- the public path ------------------------------------------------------------------ */

/* after the group's scratch, with d_sinks: the rows' sink terms (Lq) and the heads'
 * sums (Hq) */
static int64_t sink_doubles(const attn_bwd_params *bp) {
    return bp->d_sinks ? bp->fwd.Lq + bp->fwd.Hq : 0;
}

/* after those, with d_bias: one head's logit gradients (Lq, Lk) and the float64 sums in
 * the bias's shape */
static int64_t dbias_doubles(const attn_bwd_params *bp) {
    if (!bp->d_bias) return 0;
    int64_t n, m = bp->d_bias_n[0] * bp->d_bias_n[1] * bp->d_bias_n[2] * bp->d_bias_n[3];
    if (__builtin_mul_overflow(bp->fwd.Lq, bp->fwd.Lk, &n) || __builtin_add_overflow(n, m, &n))
        return -1;
    return n;
}

size_t ai_reference_backward_workspace(const attn_bwd_params *bp) {
    int64_t n = group_doubles(&bp->fwd, true);
    const int64_t nb = dbias_doubles(bp);
    if (n < 0 || nb < 0 || __builtin_add_overflow(n, sink_doubles(bp), &n) ||
        __builtin_add_overflow(n, nb, &n) || (uint64_t)n > SIZE_MAX / sizeof(double))
        return (size_t)-1;
    return (size_t)n * sizeof(double);
}

/* the rows of a strided view of dtype dt (float32, or float64 in a float64 call) into
 * dense doubles, and back (rounded to float32 once, or stored as they are) */
static void gather(attn_dtype dt, const void *x, int64_t at, int64_t s_row, int64_t s_col,
                   int64_t rows, int64_t cols, double *out) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            out[r * cols + c] = attn_load_f64(dt, x, at + r * s_row + c * s_col);
}
static void scatter(const double *in, int64_t rows, int64_t cols, attn_dtype dt, void *x,
                    int64_t at, int64_t s_row, int64_t s_col) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            attn_store_f64(dt, x, at + r * s_row + c * s_col, in[r * cols + c]);
}

attn_status ai_reference_backward(const attn_bwd_params *bp, void *ws) {
    const attn_params *p = &bp->fwd;
    const int64_t Lq = p->Lq, Lk = p->Lk, Dk = p->Dk, Dv = p->Dv, G = p->group;
    double *mats = ws;
    double *q = mats + ref_mats(p) * Lq * Lk;  // (G, Lq, Dk)
    double *dq = q + G * Lq * Dk;              // (G, Lq, Dk)
    double *d_o = dq + G * Lq * Dk;            // (G, Lq, Dv)
    double *k = d_o + G * Lq * Dv;             // (Lk, Dk)
    double *dk = k + Lk * Dk;                  // (Lk, Dk)
    double *v = dk + Lk * Dk;                  // (Lk, Dv)
    double *dv = v + Lk * Dv;                  // (Lk, Dv)
    double *sink_rows = bp->d_sinks ? dv + Lk * Dv : NULL;  // (Lq)
    double *d_sink = bp->d_sinks ? sink_rows + Lq : NULL;   // (Hq)
    for (int64_t h = 0; d_sink && h < p->Hq; h++) d_sink[h] = 0.0;
    ref_dbias db = {0};
    if (bp->d_bias) {  // after the sinks' doubles
        db.g = dv + Lk * Dv + sink_doubles(bp);
        db.acc = db.g + Lq * Lk;
        memcpy(db.n, bp->d_bias_n, sizeof db.n);
        memset(db.acc, 0, (size_t)(db.n[0] * db.n[1] * db.n[2] * db.n[3]) * sizeof(double));
    }
    /* d_o and the gradients: float32, or float64 in a float64 call (then the pointers of
     * bp hold doubles); q, k, v are read in their own dtype */
    const attn_dtype gdt = p->q_dt == ATTN_F64 ? ATTN_F64 : ATTN_F32;

    for (int64_t b = 0; b < p->B; b++)
        for (int64_t g = 0; g < p->Hkv; g++) {
            for (int64_t hh = 0; hh < G; hh++) {
                const int64_t h = g * G + hh;
                gather(p->q_dt, p->q, b * p->q_s[0] + h * p->q_s[1], p->q_s[2], p->q_s[3], Lq,
                       Dk, q + hh * Lq * Dk);
                gather(gdt, bp->d_o, b * bp->do_s[0] + h * bp->do_s[1], bp->do_s[2],
                       bp->do_s[3], Lq, Dv, d_o + hh * Lq * Dv);
            }
            /* all Lk rows, the structurally masked ones included: ref_row never reads
             * them, and a NaN copied here goes nowhere */
            gather(p->kv_dt, p->k, b * p->k_s[0] + g * p->k_s[1], p->k_s[2], p->k_s[3], Lk, Dk, k);
            gather(p->kv_dt, p->v, b * p->v_s[0] + g * p->v_s[1], p->v_s[2], p->v_s[3], Lk, Dv, v);

            ref_group_backward(p, b, g, q, k, v, d_o, dq, dk, dv, mats, false, sink_rows, d_sink,
                               bp->d_bias ? &db : NULL);

            for (int64_t hh = 0; hh < G; hh++) {
                const int64_t h = g * G + hh;
                scatter(dq + hh * Lq * Dk, Lq, Dk, gdt, bp->dq,
                        b * bp->dq_s[0] + h * bp->dq_s[1], bp->dq_s[2], bp->dq_s[3]);
            }
            scatter(dk, Lk, Dk, gdt, bp->dk, b * bp->dk_s[0] + g * bp->dk_s[1], bp->dk_s[2],
                    bp->dk_s[3]);
            scatter(dv, Lk, Dv, gdt, bp->dv, b * bp->dv_s[0] + g * bp->dv_s[1], bp->dv_s[2],
                    bp->dv_s[3]);
        }
    for (int64_t h = 0; d_sink && h < p->Hq; h++) bp->d_sinks[h * bp->d_sinks_s] = (float)d_sink[h];
    if (bp->d_bias) {  // the float64 sums rounded once
        const int64_t *n = db.n, *st = bp->d_bias_s;
        for (int64_t a = 0; a < n[0]; a++)
            for (int64_t c = 0; c < n[1]; c++)
                for (int64_t i = 0; i < n[2]; i++)
                    for (int64_t j = 0; j < n[3]; j++)
                        bp->d_bias[a * st[0] + c * st[1] + i * st[2] + j * st[3]] =
                            (float)db.acc[((a * n[1] + c) * n[2] + i) * n[3] + j];
    }
    return ATTN_OK;
}

/* ---- float64 helpers for the tests -------------------------------------------------- */

static double *alloc_mats(const attn_params *p) {
    const int64_t n = group_doubles(p, false);
    if (n < 0 || (uint64_t)n > SIZE_MAX / sizeof(double)) return NULL;
    return ai_malloc(n > 0 ? (size_t)n * sizeof(double) : 1);
}

attn_status ai_ref64_forward(const attn_params *p, const double *q, const double *k,
                             const double *v, double *o, double *lse) {
    double *P = alloc_mats(p);
    if (!P) return ai_fail(ATTN_ERR_NOMEM, "ai_ref64_forward: scratch");
    const int64_t Lq = p->Lq, Lk = p->Lk, G = p->group;
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t g = 0; g < p->Hkv; g++) {
            const int64_t h0 = b * p->Hq + g * G, g0 = b * p->Hkv + g;
            ref_group_forward(p, b, g, q + h0 * Lq * p->Dk, k + g0 * Lk * p->Dk,
                              v + g0 * Lk * p->Dv, o + h0 * Lq * p->Dv,
                              lse ? lse + h0 * Lq : NULL, P);
        }
    ai_free(P);
    return ATTN_OK;
}

attn_status ai_ref64_backward(const attn_params *p, const double *q, const double *k,
                              const double *v, const double *d_o, double *dq, double *dk,
                              double *dv, bool magnitudes) {
    return ai_ref64_backward_bias(p, q, k, v, d_o, dq, dk, dv, NULL, NULL, magnitudes);
}

attn_status ai_ref64_backward_bias(const attn_params *p, const double *q, const double *k,
                                   const double *v, const double *d_o, double *dq, double *dk,
                                   double *dv, double *d_bias, const int64_t d_bias_n[4],
                                   bool magnitudes) {
    double *mats = alloc_mats(p);
    if (!mats) return ai_fail(ATTN_ERR_NOMEM, "ai_ref64_backward: scratch");
    ref_dbias db = {0};
    if (d_bias) {
        db.g = ai_malloc((size_t)(p->Lq * p->Lk + 1) * sizeof(double));
        if (!db.g) {
            ai_free(mats);
            return ai_fail(ATTN_ERR_NOMEM, "ai_ref64_backward: scratch");
        }
        db.acc = d_bias;
        memcpy(db.n, d_bias_n, sizeof db.n);
        memset(d_bias, 0, (size_t)(db.n[0] * db.n[1] * db.n[2] * db.n[3]) * sizeof(double));
    }
    const int64_t Lq = p->Lq, Lk = p->Lk, Dk = p->Dk, Dv = p->Dv, G = p->group;
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t g = 0; g < p->Hkv; g++) {
            const int64_t h0 = b * p->Hq + g * G, g0 = b * p->Hkv + g;
            ref_group_backward(p, b, g, q + h0 * Lq * Dk, k + g0 * Lk * Dk, v + g0 * Lk * Dv,
                               d_o + h0 * Lq * Dv, dq + h0 * Lq * Dk, dk + g0 * Lk * Dk,
                               dv + g0 * Lk * Dv, mats, magnitudes, NULL, NULL,
                               d_bias ? &db : NULL);
        }
    ai_free(mats);
    ai_free(db.g);
    return ATTN_OK;
}
