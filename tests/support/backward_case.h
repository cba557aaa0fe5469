/*
 * backward_case.h — what the backward suites share: a case (shapes, layout, options),
 *                   its tensors as views over sentinel-filled buffers, the float64
 *                   gradients of the reference, and the float32 tolerance of a gradient.
 *                   Used by test_backward.c (accuracy) and test_backward_edge.c (masked
 *                   rows, poisoned keys, determinism, misuse).
 */
#ifndef ATTN_TESTS_BACKWARD_CASE_H
#define ATTN_TESTS_BACKWARD_CASE_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "backward/backward.h"
#include "check.h"
#include "fd64.h"
#include "rng.h"
#include "oracle.h"
#include "views.h"


/* ---- small tools ---------------------------------------------------------------------- */


/* The backward's float32 tolerance, per gradient (docs/TRAINING.md, "Precision"): the
 * contract's (within_f32_tol: relative Frobenius error <= 1e-6, max error
 * <= 1e-5 (1 + max|ref|)) — except for a gradient that is a near-total cancellation,
 * ‖mag‖ >= 100 ‖ref‖ (mag the same gradient summed over absolute values:
 * ai_ref64_backward's magnitudes), where a relative error to the small result means
 * nothing (the exact dQ and dK are 0 when every row reads one key, as P = 1 makes dP - D
 * vanish). There the error model's worst case decides, element by element:
 * |got - ref| <= eps mag + 2^-126, eps from grad_eps below — a bound any kernel meeting
 * the contract's float32 error model meets, whatever order it sums in. Sets *cancel when
 * that branch decided, and *ratio to its largest error / bound. */
static inline int grad_within_tol(const float *got, const double *ref, const double *mag, int64_t n,
                                  double eps, tol_result *r, int *cancel, double *ratio) {
    *cancel = 0;
    *ratio = 0;
    if (within_f32_tol(got, ref, n, r)) return 1;
    if (!mag) return 0;
    double den = 0, dm = 0;
    for (int64_t e = 0; e < n; e++) {
        if (!isfinite(got[e]) || !isfinite(ref[e])) return 0;
        den += ref[e] * ref[e];
        dm += mag[e] * mag[e];
    }
    if (!(dm >= 1e4 * den)) return 0;  // not a cancellation: the contract's verdict stands
    *cancel = 1;
    for (int64_t e = 0; e < n; e++) {
        /* the floor: float32's smallest normal, for products that underflow */
        const double q = fabs((double)got[e] - ref[e]) / (eps * mag[e] + 0x1p-126);
        if (q > *ratio) *ratio = q;
    }
    return *ratio <= 1.0;
}

static const char *const k_grad[3] = {"dq", "dk", "dv"};

/* ---- a case: shapes, layout and options ----------------------------------------------- */

typedef struct bcase {
    int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
    int layout;        // 0: stored [B, H, L, D]; 1: stored [B, L, H, D]
    int cache;         // k, v (and dk, dv) are views into larger buffers (NaN / sentinel)
    int mask;          // bit 1: bool mask, bit 2: float bias
    int mshape;        // bits 1, 2, 4: mask dims B, Hq, Lq are full (else 1); 8: the bias's Lk is 1
    double mask_true;  // P(attend) in the bool mask (0 = 0.8)
    double bias_ninf;  // P(-inf) in the bias
    int empty_rows;    // the bool mask masks every key of rows i % 5 == 2
    int causal, align, window;
    int64_t wl, wr;
    int kvlen;         // 0: none; 1: int32; 2: int64
    int64_t kvlen_fixed;  // >= 0: every batch; < 0: drawn, with one batch at 0 when B > 1
    int alibi;
    float softcap;
    int has_scale;
    float scale;
    double amp;        // inputs drawn from U(-amp, amp) (0 = 1)
    uint64_t seed;
} bcase;

static uint64_t g_seed = 1;
static inline bcase base(int64_t B, int64_t Hq, int64_t Hkv, int64_t Lq, int64_t Lk, int64_t Dk,
                  int64_t Dv) {
    bcase c;
    memset(&c, 0, sizeof c);
    c.B = B; c.Hq = Hq; c.Hkv = Hkv; c.Lq = Lq; c.Lk = Lk; c.Dk = Dk; c.Dv = Dv;
    c.kvlen_fixed = -1;
    c.seed = g_seed++;
    return c;
}

static inline void describe(const bcase *c, char *out, size_t n) {
    snprintf(out, n,
             "B=%lld Hq=%lld Hkv=%lld Lq=%lld Lk=%lld Dk=%lld Dv=%lld layout=%d cache=%d "
             "mask=%d mshape=%d empty=%d causal=%d align=%d window=%d(%lld,%lld) kvlen=%d(%lld) "
             "alibi=%d softcap=%g scale=%s%g seed=%llu",
             (long long)c->B, (long long)c->Hq, (long long)c->Hkv, (long long)c->Lq,
             (long long)c->Lk, (long long)c->Dk, (long long)c->Dv, c->layout, c->cache, c->mask,
             c->mshape, c->empty_rows, c->causal, c->align, c->window, (long long)c->wl,
             (long long)c->wr, c->kvlen, (long long)c->kvlen_fixed, c->alibi,
             (double)c->softcap, c->has_scale ? "" : "default/", (double)c->scale,
             (unsigned long long)c->seed);
}

/* The options' own tensors (mask, bias, kv_len, ALiBi), dense. */
typedef struct opt_store {
    uint8_t *mask;
    float *bias, *slopes;
    int64_t *kvl64;
    int32_t *kvl32;
    attn_tensor tmask, tbias, tkvlen, talibi;
} opt_store;

static inline void build_options(const bcase *c, rng_t *r, opt_store *s, attn_options *opt) {
    memset(s, 0, sizeof *s);
    memset(opt, 0, sizeof *opt);
    const int64_t mB = (c->mshape & 1) ? c->B : 1, mH = (c->mshape & 2) ? c->Hq : 1;
    const int64_t mL = (c->mshape & 4) ? c->Lq : 1, n = mB * mH * mL * c->Lk;
    const int64_t mK = (c->mshape & 8) ? 1 : c->Lk;  // the bias only: one value for every key
    if (c->mask & 1) {
        const double pt = c->mask_true > 0 ? c->mask_true : 0.8;
        s->mask = xcalloc(n, 1);
        for (int64_t e = 0; e < n; e++) s->mask[e] = rng_unif(r) < pt;
        if (c->empty_rows && mL > 1)
            for (int64_t bh = 0; bh < mB * mH; bh++)
                for (int64_t i = 2; i < mL; i += 5) memset(s->mask + (bh * mL + i) * c->Lk, 0, (size_t)c->Lk);
        s->tmask = attn_tensor_4d(s->mask, ATTN_BOOL, mB, mH, mL, c->Lk);
        opt->mask = &s->tmask;
    }
    if (c->mask & 2) {
        const int64_t nb = mB * mH * mL * mK;
        s->bias = xcalloc(nb, sizeof(float));
        for (int64_t e = 0; e < nb; e++)
            s->bias[e] = rng_unif(r) < c->bias_ninf ? -INFINITY : (float)rng_sym(r);
        s->tbias = attn_tensor_4d(s->bias, ATTN_F32, mB, mH, mL, mK);
        opt->bias = &s->tbias;
    }
    if (c->kvlen) {
        s->kvl64 = xcalloc(c->B, sizeof(int64_t));
        s->kvl32 = xcalloc(c->B, sizeof(int32_t));
        for (int64_t b = 0; b < c->B; b++) {
            int64_t len = c->kvlen_fixed >= 0 ? c->kvlen_fixed
                                              : (int64_t)(rng_next(r) % (uint64_t)(c->Lk + 1));
            if (c->kvlen_fixed < 0 && c->B > 1 && b == c->B - 1) len = 0;
            s->kvl64[b] = len;
            s->kvl32[b] = (int32_t)len;
        }
        s->tkvlen = attn_tensor_4d(c->kvlen == 1 ? (void *)s->kvl32 : (void *)s->kvl64,
                                   c->kvlen == 1 ? ATTN_I32 : ATTN_I64, c->B, 1, 1, 1);
        opt->kv_len = &s->tkvlen;
    }
    if (c->alibi) {
        s->slopes = xcalloc(c->Hq, sizeof(float));
        for (int64_t h = 0; h < c->Hq; h++) s->slopes[h] = (float)(0.5 / (double)(h + 1));
        s->talibi = attn_tensor_4d(s->slopes, ATTN_F32, c->Hq, 1, 1, 1);
        opt->alibi_slopes = &s->talibi;
    }
    opt->causal = c->causal;
    opt->align = c->align ? ATTN_ALIGN_BOTTOM_RIGHT : ATTN_ALIGN_TOP_LEFT;
    opt->has_window = c->window;
    opt->window_left = c->wl;
    opt->window_right = c->wr;
    opt->softcap = c->softcap;
    opt->has_scale = c->has_scale;
    opt->scale = c->scale;
}

static inline void free_options(opt_store *s) {
    free(s->mask); free(s->bias); free(s->slopes); free(s->kvl64); free(s->kvl32);
}

/* ---- a call: the tensors of a case and the float64 gradients --------------------------- */

/* The tensors are views.h's views: [B, H, L, D] or [B, L, H, D] over padded buffers. */
static inline void gather_d(const attn_tensor *t, double *out) {
    int64_t n = 0;
    for (int64_t a = 0; a < t->shape[0]; a++)
        for (int64_t b = 0; b < t->shape[1]; b++)
            for (int64_t c = 0; c < t->shape[2]; c++)
                for (int64_t d = 0; d < t->shape[3]; d++) out[n++] = *view_ptr(t, a, b, c, d);
}
static inline int64_t numel(const attn_tensor *t) {
    return t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3];
}

/* one complete call: inputs, the forward's O and LSE, dO, the gradient views */
typedef struct bcall {
    bcase c;
    char desc[512];
    opt_store s;
    attn_options opt;  // the forward's options, lse NULL
    float *qb, *kb, *vb, *ob, *dob, *lseb, *dqb, *dkb, *dvb;
    int64_t nqb, nkb, nvb, nob, nlb, ndqb, ndkb, ndvb;
    attn_tensor q, k, v, o, d_o, lse, dq, dk, dv;
    /* dense: the float64 gradients, and the latest run's */
    double *ref[3], *mag[3];
    bool have_mag;  // mag computed (only when a gradient misses the contract's tolerance)
    float *got[3];
    int64_t n[3];
} bcall;

static inline void bcall_build(bcall *t, const bcase *c) {
    memset(t, 0, sizeof *t);
    t->c = *c;
    describe(c, t->desc, sizeof t->desc);
    rng_t r = {c->seed * 0x2545f4914f6cdd1dULL + 99};
    build_options(c, &r, &t->s, &t->opt);
    const int64_t B = c->B, Hq = c->Hq, Hkv = c->Hkv, Lq = c->Lq, Lk = c->Lk, Dk = c->Dk, Dv = c->Dv;
    const int64_t loff = c->cache ? 3 : 0, lpad = c->cache ? 5 : 0, dpad = c->cache ? 3 : 0;
    const double amp = c->amp > 0 ? c->amp : 1.0;

    t->nqb = view_elems(B, Hq, Lq, Dk, 0, 0, 0);
    t->nob = view_elems(B, Hq, Lq, Dv, 0, 0, 0);
    t->nkb = t->ndkb = view_elems(B, Hkv, Lk, Dk, loff, lpad, dpad);
    t->nvb = t->ndvb = view_elems(B, Hkv, Lk, Dv, loff, lpad, dpad);
    t->ndqb = t->nqb;
    t->nlb = B * Hq * Lq;
    t->qb = xcalloc(t->nqb, 4); t->ob = xcalloc(t->nob, 4); t->dob = xcalloc(t->nob, 4);
    t->kb = xcalloc(t->nkb, 4); t->vb = xcalloc(t->nvb, 4); t->lseb = xcalloc(t->nlb, 4);
    t->dqb = xcalloc(t->ndqb, 4); t->dkb = xcalloc(t->ndkb, 4); t->dvb = xcalloc(t->ndvb, 4);
    for (int64_t e = 0; e < t->nkb; e++) t->kb[e] = NAN;  // what lies outside the cache views
    for (int64_t e = 0; e < t->nvb; e++) t->vb[e] = NAN;
    t->q = make_view(t->qb, B, Hq, Lq, Dk, c->layout, 0, 0, 0);
    t->o = make_view(t->ob, B, Hq, Lq, Dv, c->layout, 0, 0, 0);
    t->d_o = make_view(t->dob, B, Hq, Lq, Dv, c->layout, 0, 0, 0);
    t->dq = make_view(t->dqb, B, Hq, Lq, Dk, c->layout, 0, 0, 0);
    t->k = make_view(t->kb, B, Hkv, Lk, Dk, c->layout, loff, lpad, dpad);
    t->v = make_view(t->vb, B, Hkv, Lk, Dv, c->layout, loff, lpad, dpad);
    t->dk = make_view(t->dkb, B, Hkv, Lk, Dk, c->layout, loff, lpad, dpad);
    t->dv = make_view(t->dvb, B, Hkv, Lk, Dv, c->layout, loff, lpad, dpad);
    t->lse = attn_tensor_4d(t->lseb, ATTN_F32, B, Hq, Lq, 1);
    const attn_tensor *fill[4] = {&t->q, &t->k, &t->v, &t->d_o};
    for (int a = 0; a < 4; a++)
        for (int64_t i0 = 0; i0 < fill[a]->shape[0]; i0++)
            for (int64_t i1 = 0; i1 < fill[a]->shape[1]; i1++)
                for (int64_t i2 = 0; i2 < fill[a]->shape[2]; i2++)
                    for (int64_t i3 = 0; i3 < fill[a]->shape[3]; i3++)
                        *view_ptr(fill[a], i0, i1, i2, i3) = (float)((a == 3 ? 1.0 : amp) * rng_sym(&r));
    t->n[0] = numel(&t->dq); t->n[1] = numel(&t->dk); t->n[2] = numel(&t->dv);
    for (int a = 0; a < 3; a++) {
        t->ref[a] = xcalloc(t->n[a], sizeof(double));
        t->mag[a] = xcalloc(t->n[a], sizeof(double));
        t->got[a] = xcalloc(t->n[a], sizeof(float));
    }
}

static inline void bcall_free(bcall *t) {
    free(t->qb); free(t->kb); free(t->vb); free(t->ob); free(t->dob); free(t->lseb);
    free(t->dqb); free(t->dkb); free(t->dvb);
    for (int a = 0; a < 3; a++) {
        free(t->ref[a]);
        free(t->mag[a]);
        free(t->got[a]);
    }
    free_options(&t->s);
}

/* the forward on the fused path: O and LSE, the backward's inputs */
static inline attn_status bcall_forward(bcall *t) {
    attn_options f = t->opt;
    f.lse = &t->lse;
    f.path = ATTN_PATH_FUSED;
    return attn_forward(&t->q, &t->k, &t->v, &t->o, &f);
}

/* the float64 gradients of the inputs as stored (float), into t->ref; with magnitudes,
 * the same sums over absolute values into t->mag instead (grad_within_tol) */
static inline attn_status bcall_reference(bcall *t, bool magnitudes) {
    attn_params p;
    attn_options f = t->opt;
    f.path = ATTN_PATH_REFERENCE;
    attn_status st = ai_params_init(&p, &t->q, &t->k, &t->v, &t->o, &f, true);
    if (st != ATTN_OK) return st;
    double *in[4];
    const attn_tensor *src[4] = {&t->q, &t->k, &t->v, &t->d_o};
    for (int a = 0; a < 4; a++) {
        in[a] = xcalloc(numel(src[a]), sizeof(double));
        gather_d(src[a], in[a]);
    }
    double **out = magnitudes ? t->mag : t->ref;
    st = ai_ref64_backward(&p, in[0], in[1], in[2], in[3], out[0], out[1], out[2], magnitudes);
    for (int a = 0; a < 4; a++) free(in[a]);
    t->have_mag |= magnitudes && st == ATTN_OK;
    return st;
}

/* The relative bound, to its magnitude, on the error of gradient a (0 dQ, 1 dK, 2 dV)
 * of any float32 backward meeting the error model of docs/CONTRACT.md ("The float32 error
 * model"; tools/common/tolerance.h's constants), with A the largest logit magnitude of
 * the case (oracle_logit_mag):
 *   P = exp(s - lse), s and the forward's float32 lse each off by their bounds:
 *       eP = (Dk + 5) u A + tol_lse_bound(Dk, Lk, A) + (2E + 1) u
 *   O (in D = dO . O) the forward's weighted sum: eO = eP + tol_sum_rel(Lk) + 2u
 *   dS = scale P (dP - D) cap': dP a dot of Dv terms, D one of Dv terms over O:
 *       eS = 2 tol_dot_rel(Dv) + eO + eP + 4u, and with softcap c the factor
 *       cap' = 1 - tanh^2 off by (Dk + 2) u A / c (the raw logit's error) + (4E + 2) u
 *   dQ a sum over Lk keys of dS K, dK over Lq x group rows of dS Q (+ u each product,
 *   + u the dropout's 1 / (1 - p)); dV a sum of P Z dO over the same rows: eP, not eS. */
static inline double grad_eps_in(const bcall *t, int a, bool logit) {
    const bcase *c = &t->c;
    const double u = TOL_U32, E = TOL_EXP_ULP;
    const int64_t rows = c->B * c->Hq * c->Lq, group = c->Hkv > 0 ? c->Hq / c->Hkv : 1;
    double A = 0;
    if (rows > 0) {
        double *m = xcalloc(rows, sizeof(double));
        oracle_logit_mag(&t->q, &t->k, &t->opt, m);
        for (int64_t i = 0; i < rows; i++) A = m[i] > A ? m[i] : A;
        free(m);
    }
    const double eP = ((double)c->Dk + 5.0) * u * A + tol_lse_bound(c->Dk, c->Lk, A) + (2 * E + 1) * u;
    const double eO = eP + tol_sum_rel(c->Lk) + 2 * u;
    double eS = 2 * tol_dot_rel(c->Dv) + eO + eP + 4 * u;
    if (logit) return eS + 2 * u;
    if (c->softcap > 0) eS += ((double)c->Dk + 2.0) * u * A / c->softcap + (4 * E + 2) * u;
    const int64_t n = a == 0 ? c->Lk : c->Lq * group;
    return (a == 2 ? eP : eS) + tol_sum_rel(n) + 2 * u;
}
static inline double grad_eps(const bcall *t, int a) { return grad_eps_in(t, a, false); }

/* The same for the bias's gradient (options.d_bias), relative to its magnitude (the sum
 * of P (|dP| + |D|) over the logits it gathers): each logit's P (dP - D) off by dS's
 * relative error before softcap's factor and the scale (neither multiplies it), rounded
 * once (+ 2u), and summed over the n logits it gathers (tol_sum_rel(n)). */
static inline double dbias_eps(const bcall *t) {
    /* + the sum of the logits an element gathers, in float32 on the fused path's in-place
     * batch sum (the bias's element count from its shape) */
    const attn_tensor *b = &t->s.tbias;
    const int64_t elems = b->shape[0] * b->shape[1] * b->shape[2] * b->shape[3];
    const int64_t n = elems > 0 ? t->c.B * t->c.Hq * t->c.Lq * t->c.Lk / elems : 0;
    return grad_eps_in(t, 0, true) + tol_sum_rel(n);
}

/* the backward on `path` with `threads`, gradients first filled with the sentinel;
 * then gathered into t->got */
static inline attn_status bcall_run_with(bcall *t, const attn_options *b);
static inline attn_status bcall_run(bcall *t, attn_path path, int threads) {
    attn_options b = t->opt;
    b.path = path;
    b.threads = threads;
    return bcall_run_with(t, &b);
}

/* the same with options of the caller's (t->opt's, with outputs such as d_bias added) */
static inline attn_status bcall_run_with(bcall *t, const attn_options *b) {
    fill_sentinel(t->dqb, t->ndqb);
    fill_sentinel(t->dkb, t->ndkb);
    fill_sentinel(t->dvb, t->ndvb);
    const attn_status st = attn_backward(&t->q, &t->k, &t->v, &t->o, &t->d_o, &t->lse, &t->dq,
                                         &t->dk, &t->dv, b);
    gather_f32(&t->dq, t->got[0]);
    gather_f32(&t->dk, t->got[1]);
    gather_f32(&t->dv, t->got[2]);
    return st;
}

/* floats of the gradient buffers written outside the views */
static inline int64_t outside_written(const bcall *t) {
    return count_written(t->dqb, t->ndqb) - t->n[0] + count_written(t->dkb, t->ndkb) - t->n[1] +
           count_written(t->dvb, t->ndvb) - t->n[2];
}


/* checks of the gradients (both suites) */
static inline int all_zero(const float *p, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (p[i] != 0.0f) return 0;
    return 1;
}

static inline int all_finite(const float *p, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(p[i])) return 0;
    return 1;
}

static inline int same_bits(const bcall *t, float *const saved[3]) {
    for (int a = 0; a < 3; a++)
        if (memcmp(t->got[a], saved[a], (size_t)t->n[a] * 4) != 0) return 0;
    return 1;
}

#endif /* ATTN_TESTS_BACKWARD_CASE_H */
