/*
 * oracle.h — the test suites' own float64 attention and the case builder around it.
 *
 * What it is: a naive, obviously-correct reading of docs/CONTRACT.md (one query row at
 * a time, the full score row materialized in double, every mask rule written out as an
 * `if`), written in the tests and independent of the library's ATTN_PATH_REFERENCE;
 * strided-view helpers; and `tcall`, which builds one complete
 * attn_forward call (q, k, v, o, masks, kv_len, ALiBi, lse, weights) from a case
 * description, runs it on a chosen path and compares it with the oracle.
 * What it is not: fast, or a validator — the oracle assumes arguments the library
 * accepts (test_api.c is where bad arguments go). No code here comes from src/.
 *
 * Header-only; include it once per test program (it includes check.h).
 */
#ifndef ATTN_TEST_ORACLE_H
#define ATTN_TEST_ORACLE_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "check.h"
#include "core/half.h"
#include "rng.h"
#include "views.h"

/* ---- strided views ------------------------------------------------------------------- */

/* Element offset of [i0, i1, i2, i3] in t; a dimension of size 1 broadcasts (index 0). */
static inline int64_t t_off(const attn_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    int64_t idx[4] = {i0, i1, i2, i3}, off = 0;
    for (int d = 0; d < 4; d++) off += (t->shape[d] == 1 ? 0 : idx[d]) * t->stride[d];
    return off;
}
static double t_f32(const attn_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return ((const float *)t->data)[t_off(t, i0, i1, i2, i3)];
}
static inline int t_bool(const attn_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return ((const unsigned char *)t->data)[t_off(t, i0, i1, i2, i3)] != 0;
}
/* element b of a kv_len tensor (I32 or I64, B entries along dim 0) */
static inline int64_t t_len(const attn_tensor *t, int64_t b) {
    int64_t off = t_off(t, b, 0, 0, 0);
    if (t->dtype == ATTN_I32) return ((const int32_t *)t->data)[off];
    return ((const int64_t *)t->data)[off];
}

/* Sentinel: a NaN bit pattern no computation produces, to see what a call wrote. */
#define SENTINEL_BITS 0x7fa5a5a5u
static inline void fill_sentinel(void *p, int64_t nfloats) {
    uint32_t s = SENTINEL_BITS;
    for (int64_t i = 0; i < nfloats; i++) memcpy((char *)p + 4 * i, &s, 4);
}
static inline int is_sentinel(const void *p) {
    uint32_t u;
    memcpy(&u, p, 4);
    return u == SENTINEL_BITS;
}
/* number of floats of p[0..n) that are not the sentinel */
static inline int64_t count_written(const void *p, int64_t n) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) c += !is_sentinel((const char *)p + 4 * i);
    return c;
}

/* ---- the oracle -------------------------------------------------------------------- */

/* Is key j of (batch b, query row i) kept by the structural masks (key length, causal,
 * window)? lkb is the batch's key length, d the row's diagonal. */
static inline int oracle_structural_keep(const attn_options *opt, int64_t lkb, int64_t d, int64_t j) {
    if (j >= lkb) return 0;
    if (opt && opt->causal && j > d) return 0;
    if (opt && opt->has_window) {
        if (opt->window_left >= 0 && j < d - opt->window_left) return 0;
        if (opt->window_right >= 0 && j > d + opt->window_right) return 0;
    }
    return 1;
}
static inline int64_t oracle_lkb(const attn_options *opt, int64_t b, int64_t Lk) {
    return (opt && opt->kv_len) ? t_len(opt->kv_len, b) : Lk;
}
static inline int64_t oracle_diag(const attn_options *opt, int64_t i, int64_t lkb, int64_t Lq) {
    return (opt && opt->align == ATTN_ALIGN_BOTTOM_RIGHT) ? i + lkb - Lq : i;
}

/* The contract, in float64.
 *   o   dense [B, Hq, Lq, Dv]   lse dense [B, Hq, Lq] or NULL   w dense [B, Hq, Lq, Lk] or NULL
 * A masked key (by structure, bool mask, or a logit of -inf) is skipped entirely: its
 * V row is never multiplied. A row with no key left gives o = 0, lse = -inf, w = 0. */
static inline void oracle_forward(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                           const attn_options *opt, double *o, double *lse, double *w) {
    const int64_t B = q->shape[0], Hq = q->shape[1], Lq = q->shape[2], Dk = q->shape[3];
    const int64_t Hkv = k->shape[1], Lk = k->shape[2], Dv = v->shape[3];
    const int64_t group = Hkv > 0 ? Hq / Hkv : 1;
    const double scale = (opt && opt->has_scale) ? (double)opt->scale : 1.0 / sqrt((double)Dk);
    const double cap = opt ? (double)opt->softcap : 0.0;
    double *s = (double *)xcalloc(Lk, sizeof(double));    /* (Lk) final logits of the row */
    char *keep = (char *)xcalloc(Lk, 1);                  /* (Lk) 1 = unmasked             */

    for (int64_t b = 0; b < B; b++) {
        const int64_t lkb = oracle_lkb(opt, b, Lk);
        for (int64_t h = 0; h < Hq; h++) {
            const int64_t hk = h / group;
            const double slope = (opt && opt->alibi_slopes) ? t_f32(opt->alibi_slopes, h, 0, 0, 0) : 0;
            for (int64_t i = 0; i < Lq; i++) {
                const int64_t d = oracle_diag(opt, i, lkb, Lq);
                const int64_t row = (b * Hq + h) * Lq + i;
                double m = -INFINITY;
                int any = 0;
                for (int64_t j = 0; j < Lk; j++) {
                    keep[j] = 0;
                    if (!oracle_structural_keep(opt, lkb, d, j)) continue;
                    if (opt && opt->mask && !t_bool(opt->mask, b, h, i, j)) continue;
                    const float *q_i = (const float *)q->data + t_off(q, b, h, i, 0);
                    const float *k_j = (const float *)k->data + t_off(k, b, hk, j, 0);
                    double dot = 0;
                    for (int64_t c = 0; c < Dk; c++)
                        dot += (double)q_i[c * q->stride[3]] * (double)k_j[c * k->stride[3]];
                    double x = scale * dot;
                    if (cap > 0) x = cap * tanh(x / cap);
                    if (opt && opt->bias) x += t_f32(opt->bias, b, h, i, j);
                    if (opt && opt->alibi_slopes) x += -slope * fabs((double)(d - j));
                    if (x == -INFINITY) continue; /* masked by the float mask */
                    s[j] = x;
                    keep[j] = 1;
                    any = 1;
                    if (x > m) m = x; /* NaN never wins; it propagates through exp below */
                }
                double *orow = o + row * Dv;
                for (int64_t c = 0; c < Dv; c++) orow[c] = 0;
                if (w)
                    for (int64_t j = 0; j < Lk; j++) w[row * Lk + j] = 0;
                if (!any) {
                    if (lse) lse[row] = -INFINITY;
                    continue;
                }
                if (m == -INFINITY) m = NAN; /* every kept logit is NaN: so is the row */
                double l = 0;
                for (int64_t j = 0; j < Lk; j++)
                    if (keep[j]) l += exp(s[j] - m);
                for (int64_t j = 0; j < Lk; j++) {
                    if (!keep[j]) continue;
                    double p = exp(s[j] - m) / l;
                    if (w) w[row * Lk + j] = p;
                    const float *v_j = (const float *)v->data + t_off(v, b, hk, j, 0);
                    for (int64_t c = 0; c < Dv; c++) orow[c] += p * (double)v_j[c * v->stride[3]];
                }
                if (lse) lse[row] = m + log(l);
            }
        }
    }
    free(s);
    free(keep);
}

/* The magnitude of each row's logits, for the LSE bound (check.h: within_lse_tol): over
 * every key of the row with finite q·k products, masked or not (an upper bound of the kept
 * ones: a kept key with a non-finite product makes the reference's LSE non-finite),
 *   mag[row] = max_j |scale| sum_d |q_d k_jd| + |bias_ij| + |ALiBi term| + softcap,
 * q and k [B, Hq, Lq, Dk] and [B, Hkv, Lk, Dk] views of any float dtype, the options'
 * scale, softcap, bias and ALiBi slopes (float32). mag dense [B, Hq, Lq]. */
static inline void oracle_logit_mag(const attn_tensor *q, const attn_tensor *k,
                                    const attn_options *opt, double *mag) {
    const int64_t B = q->shape[0], Hq = q->shape[1], Lq = q->shape[2], Dk = q->shape[3];
    const int64_t Hkv = k->shape[1], Lk = k->shape[2];
    const int64_t group = Hkv > 0 ? Hq / Hkv : 1;
    const double scale = fabs((opt && opt->has_scale) ? (double)opt->scale : 1.0 / sqrt((double)(Dk > 0 ? Dk : 1)));
    const double cap = opt && opt->softcap > 0 ? (double)opt->softcap : 0.0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++) {
            const double slope = (opt && opt->alibi_slopes) ? fabs(t_f32(opt->alibi_slopes, h, 0, 0, 0)) : 0;
            for (int64_t i = 0; i < Lq; i++) {
                double m = 0;
                for (int64_t j = 0; j < Lk; j++) {
                    const int64_t qo = t_off(q, b, h, i, 0), ko = t_off(k, b, h / group, j, 0);
                    double x = 0;
                    for (int64_t c = 0; c < Dk; c++)
                        x += fabs(attn_load_f64(q->dtype, q->data, qo + c * q->stride[3]) *
                                  attn_load_f64(k->dtype, k->data, ko + c * k->stride[3]));
                    if (!isfinite(x)) continue; /* a key masked for its NaN or Inf */
                    x = x * scale + cap;
                    if (opt && opt->bias && isfinite(t_f32(opt->bias, b, h, i, j)))
                        x += fabs(t_f32(opt->bias, b, h, i, j));
                    if (slope > 0) x += slope * (double)(Lq + Lk);
                    if (x > m) m = x;
                }
                mag[(b * Hq + h) * Lq + i] = m;
            }
        }
}

/* ---- one complete call, built from a case description ----------------------------- */

typedef struct fcase {
    int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
    int layout;      /* 0: q, k, v, o (and lse) stored [B, H, L, D]; 1: stored [B, L, H, D] */
    int cache;       /* k and v are views into a larger NaN-filled cache (row offset, more
                        rows, wider D); o is a view into a larger sentinel-filled buffer   */
    int kv_bcast;    /* k and v broadcast over the batch with stride 0                   */
    int mask;        /* bit 1: bool mask, bit 2: float bias                              */
    int mshape;      /* mask/bias shape: bit 1 = B, bit 2 = Hq, bit 4 = Lq are full (else 1);
                        bit 8 = the size-1 dims are presented at full size with stride 0  */
    double mask_true;/* probability of "attend" in the bool mask (0 = default 0.8)       */
    double bias_ninf;/* probability of -inf in the bias                                  */
    int causal, align;
    int window;
    int64_t wl, wr;
    int kvlen;       /* 0 none, 1 int32, 2 int64                                         */
    int64_t kvlen_fixed; /* >= 0: every batch gets this length; < 0: drawn (see below) */
    int alibi;
    float softcap;
    int has_scale;
    float scale;
    int lse, weights;
    int dist;        /* 0: U(-1, 1); 1: N(0, 1)                                         */
    uint64_t seed;
} fcase;

/* A case of the given sizes with every option at its default (no mask, kv_len unset). */
static inline fcase fcase_new(uint64_t seed, int64_t B, int64_t Hq, int64_t Hkv, int64_t Lq,
                              int64_t Lk, int64_t Dk, int64_t Dv) {
    fcase c;
    memset(&c, 0, sizeof c);
    c.B = B; c.Hq = Hq; c.Hkv = Hkv; c.Lq = Lq; c.Lk = Lk; c.Dk = Dk; c.Dv = Dv;
    c.kvlen_fixed = -1;
    c.seed = seed;
    return c;
}

typedef struct tcall {
    fcase c;
    char desc[400];
    float *qb, *kb, *vb, *ob, *lseb, *wb, *biasb, *slopeb;
    unsigned char *maskb, *ocover;
    void *kvlb;
    int64_t qn, kn, vn, on, lsen, wn;
    attn_tensor q, k, v, o, lse, w, mask, bias, kvlen, alibi;
    attn_options opt;
    double *o_ref, *lse_ref, *w_ref; /* dense oracle outputs */
    float *o_got, *lse_got, *w_got;  /* dense gathers of the library's */
    int64_t no, nl, nw;              /* their element counts           */
} tcall;

static inline void fcase_describe(const fcase *c, char *out, size_t n) {
    snprintf(out, n,
             "B=%lld Hq=%lld Hkv=%lld Lq=%lld Lk=%lld Dk=%lld Dv=%lld layout=%d cache=%d "
             "kvb=%d mask=%d mshape=%d causal=%d align=%d window=%d(%lld,%lld) kvlen=%d(%lld) "
             "alibi=%d softcap=%g scale=%s%g lse=%d w=%d dist=%d seed=%llu",
             (long long)c->B, (long long)c->Hq, (long long)c->Hkv, (long long)c->Lq,
             (long long)c->Lk, (long long)c->Dk, (long long)c->Dv, c->layout, c->cache,
             c->kv_bcast, c->mask, c->mshape, c->causal, c->align, c->window, (long long)c->wl,
             (long long)c->wr, c->kvlen, (long long)c->kvlen_fixed, c->alibi, (double)c->softcap,
             c->has_scale ? "" : "default/", (double)c->scale, c->lse, c->weights, c->dist,
             (unsigned long long)c->seed);
}

static inline float draw(rng_t *r, int dist) {
    return dist ? (float)rng_normal(r) : (float)rng_range(r, -1.0, 1.0);
}

/* Fill a float view with draws (the rest of the buffer keeps what it had). */
static inline void fill_view(const attn_tensor *t, rng_t *r, int dist) {
    for (int64_t a = 0; a < t->shape[0]; a++)
        for (int64_t b = 0; b < t->shape[1]; b++)
            for (int64_t c = 0; c < t->shape[2]; c++)
                for (int64_t d = 0; d < t->shape[3]; d++) *view_ptr(t, a, b, c, d) = draw(r, dist);
}

static inline void tcall_build(tcall *t, const fcase *c) {
    memset(t, 0, sizeof *t);
    t->c = *c;
    fcase_describe(c, t->desc, sizeof t->desc);
    rng_t r = {c->seed * 0x2545f4914f6cdd1dULL + 12345};
    const int64_t B = c->B, Hq = c->Hq, Hkv = c->Hkv, Lq = c->Lq, Lk = c->Lk;
    const int64_t Dk = c->Dk, Dv = c->Dv;

    /* q: dense in its layout */
    t->qn = view_elems(B, Hq, Lq, Dk, 0, 0, 0);
    t->qb = (float *)xcalloc(t->qn, sizeof(float));
    t->q = make_view(t->qb, B, Hq, Lq, Dk, c->layout, 0, 0, 0);
    fill_view(&t->q, &r, c->dist);

    /* k, v: dense, a cache view (NaN around), or one batch broadcast with stride 0 */
    int64_t loff = c->cache ? 3 : 0, lpad = c->cache ? 7 : 0, dpad = c->cache ? 5 : 0;
    int64_t Bs = c->kv_bcast ? 1 : B;
    t->kn = view_elems(Bs, Hkv, Lk, Dk, loff, lpad, dpad);
    t->vn = view_elems(Bs, Hkv, Lk, Dv, loff, lpad, dpad);
    t->kb = (float *)xcalloc(t->kn, sizeof(float));
    t->vb = (float *)xcalloc(t->vn, sizeof(float));
    for (int64_t i = 0; i < t->kn; i++) t->kb[i] = NAN;
    for (int64_t i = 0; i < t->vn; i++) t->vb[i] = NAN;
    t->k = make_view(t->kb, Bs, Hkv, Lk, Dk, c->layout, loff, lpad, dpad);
    t->v = make_view(t->vb, Bs, Hkv, Lk, Dv, c->layout, loff, lpad, dpad);
    fill_view(&t->k, &r, c->dist);
    fill_view(&t->v, &r, c->dist);
    if (c->kv_bcast) {
        t->k.shape[0] = B; t->k.stride[0] = 0;
        t->v.shape[0] = B; t->v.stride[0] = 0;
    }

    /* o: in the layout; inside a bigger buffer for cache cases */
    int64_t ooff = c->cache ? 1 : 0, olpad = c->cache ? 2 : 0, odpad = c->cache ? 3 : 0;
    t->on = view_elems(B, Hq, Lq, Dv, ooff, olpad, odpad);
    t->ob = (float *)xcalloc(t->on, sizeof(float));
    t->o = make_view(t->ob, B, Hq, Lq, Dv, c->layout, ooff, olpad, odpad);
    t->ocover = (unsigned char *)xcalloc(t->on, 1);
    for (int64_t a = 0; a < B; a++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < Lq; i++)
                for (int64_t d = 0; d < Dv; d++) t->ocover[view_ptr(&t->o, a, h, i, d) - t->ob] = 1;

    attn_options *opt = &t->opt;
    /* bool mask and float bias: [B|1, Hq|1, Lq|1, Lk] */
    if (c->mask & 3) {
        int64_t mb = (c->mshape & 1) ? B : 1, mh = (c->mshape & 2) ? Hq : 1;
        int64_t ml = (c->mshape & 4) ? Lq : 1;
        int64_t n = mb * mh * ml * Lk;
        attn_tensor mt = attn_tensor_4d(NULL, ATTN_BOOL, mb, mh, ml, Lk);
        if (c->mshape & 8) {
            int64_t full[3] = {B, Hq, Lq};
            for (int d = 0; d < 3; d++)
                if (mt.shape[d] == 1 && full[d] != 1) { mt.shape[d] = full[d]; mt.stride[d] = 0; }
        }
        if (c->mask & 1) {
            double p = c->mask_true > 0 ? c->mask_true : 0.8;
            t->maskb = (unsigned char *)xcalloc(n, 1);
            for (int64_t i = 0; i < n; i++)
                t->maskb[i] = rng_unif(&r) < p ? (unsigned char)(1 + rng_int(&r, 3) * 127) : 0;
            t->mask = mt;
            t->mask.data = t->maskb;
            opt->mask = &t->mask;
        }
        if (c->mask & 2) {
            t->biasb = (float *)xcalloc(n, sizeof(float));
            for (int64_t i = 0; i < n; i++)
                t->biasb[i] = rng_unif(&r) < c->bias_ninf ? -INFINITY : (float)rng_normal(&r);
            t->bias = mt;
            t->bias.dtype = ATTN_F32;
            t->bias.data = t->biasb;
            opt->bias = &t->bias;
        }
    }
    /* per-batch key lengths: batch 1 gets Lk, batch 2 gets 0, the others a draw */
    if (c->kvlen) {
        int64_t *l64 = (int64_t *)xcalloc(B, sizeof(int64_t));
        for (int64_t b = 0; b < B; b++) {
            if (c->kvlen_fixed >= 0) l64[b] = c->kvlen_fixed;
            else if (b == 1) l64[b] = Lk;
            else if (b == 2) l64[b] = 0;
            else l64[b] = rng_int(&r, Lk + 1);
        }
        if (c->kvlen == 1) {
            int32_t *l32 = (int32_t *)xcalloc(B, sizeof(int32_t));
            for (int64_t b = 0; b < B; b++) l32[b] = (int32_t)l64[b];
            free(l64);
            t->kvlb = l32;
            t->kvlen = attn_tensor_4d(l32, ATTN_I32, B, 1, 1, 1);
        } else {
            t->kvlb = l64;
            t->kvlen = attn_tensor_4d(l64, ATTN_I64, B, 1, 1, 1);
        }
        opt->kv_len = &t->kvlen;
    }
    if (c->alibi) {
        t->slopeb = (float *)xcalloc(Hq, sizeof(float));
        for (int64_t h = 0; h < Hq; h++) t->slopeb[h] = (float)pow(2.0, -8.0 * (double)(h + 1) / (double)Hq);
        t->alibi = attn_tensor_4d(t->slopeb, ATTN_F32, Hq, 1, 1, 1);
        opt->alibi_slopes = &t->alibi;
    }
    opt->softcap = c->softcap;
    opt->has_scale = c->has_scale != 0;
    opt->scale = c->scale;
    opt->causal = c->causal != 0;
    opt->align = c->align ? ATTN_ALIGN_BOTTOM_RIGHT : ATTN_ALIGN_TOP_LEFT;
    opt->has_window = c->window != 0;
    opt->window_left = c->wl;
    opt->window_right = c->wr;

    t->no = B * Hq * Lq * Dv;
    t->nl = B * Hq * Lq;
    t->nw = B * Hq * Lq * Lk;
    if (c->lse) {
        t->lsen = t->nl;
        t->lseb = (float *)xcalloc(t->lsen, sizeof(float));
        t->lse = attn_tensor_4d(t->lseb, ATTN_F32, B, Hq, Lq, 1);
        if (c->layout == 1) { /* stored [B, Lq, Hq] */
            t->lse.stride[0] = Lq * Hq; t->lse.stride[1] = 1; t->lse.stride[2] = Hq; t->lse.stride[3] = 1;
        }
        opt->lse = &t->lse;
    }
    if (c->weights) {
        t->wn = t->nw;
        t->wb = (float *)xcalloc(t->wn, sizeof(float));
        t->w = attn_tensor_4d(t->wb, ATTN_F32, B, Hq, Lq, Lk);
        opt->weights = &t->w;
    }
    t->o_ref = (double *)xcalloc(t->no, sizeof(double));
    t->lse_ref = (double *)xcalloc(t->nl, sizeof(double));
    t->w_ref = c->weights ? (double *)xcalloc(t->nw, sizeof(double)) : NULL;
    t->o_got = (float *)xcalloc(t->no, sizeof(float));
    t->lse_got = (float *)xcalloc(t->nl, sizeof(float));
    t->w_got = c->weights ? (float *)xcalloc(t->nw, sizeof(float)) : NULL;
}

static inline void tcall_oracle(tcall *t) {
    oracle_forward(&t->q, &t->k, &t->v, &t->opt, t->o_ref, t->lse_ref, t->w_ref);
}

/* Run the library on `path` with `threads`, outputs first filled with the sentinel. */
static inline attn_status tcall_run(tcall *t, attn_path path, int threads) {
    fill_sentinel(t->ob, t->on);
    if (t->lseb) fill_sentinel(t->lseb, t->lsen);
    if (t->wb) fill_sentinel(t->wb, t->wn);
    t->opt.path = path;
    t->opt.threads = threads;
    return attn_forward(&t->q, &t->k, &t->v, &t->o, &t->opt);
}

/* Gather the library's outputs into o_got / lse_got / w_got. */
static inline void tcall_gather(tcall *t) {
    gather_f32(&t->o, t->o_got);
    if (t->lseb) gather_f32(&t->lse, t->lse_got);
    if (t->wb) gather_f32(&t->w, t->w_got);
}

/* Floats of o's buffer outside the view that are no longer the sentinel. */
static inline int64_t tcall_o_outside_written(const tcall *t) {
    int64_t n = 0;
    for (int64_t i = 0; i < t->on; i++) n += !t->ocover[i] && !is_sentinel(t->ob + i);
    return n;
}

/* Compare the latest run with the oracle (run tcall_oracle first), counting CHECKs. */
static inline int tcall_check(tcall *t, const char *what) {
    tol_result r;
    int ok = 1;
    tcall_gather(t);
    int good = within_f32_tol(t->o_got, t->o_ref, t->no, &r);
    CHECK(good, "%s O: max_err %.3g (max|ref| %.3g) rel %.3g nonfinite %d worst %lld [%s]", what,
          r.max_err, r.max_ref, r.rel_err, r.nonfinite_mismatch, (long long)r.worst, t->desc);
    if (!good && r.worst >= 0)
        fprintf(stderr, "     worst O[%lld]: got %.9g want %.9g\n", (long long)r.worst,
                (double)t->o_got[r.worst], t->o_ref[r.worst]);
    ok &= good;
    int64_t outside = tcall_o_outside_written(t);
    CHECK(outside == 0, "%s: %lld floats written outside the o view [%s]", what, (long long)outside,
          t->desc);
    ok &= outside == 0;
    if (t->lseb) {
        double *mag = (double *)xcalloc(t->nl, sizeof(double));
        oracle_logit_mag(&t->q, &t->k, &t->opt, mag);
        good = within_lse_tol(t->lse_got, t->lse_ref, mag, t->nl, t->q.shape[3], t->k.shape[2], &r);
        free(mag);
        CHECK(good, "%s LSE: max_err %.3g (%.3g of the bound) nonfinite %d worst %lld [%s]", what,
              r.max_err, r.rel_err, r.nonfinite_mismatch, (long long)r.worst, t->desc);
        if (!good && r.worst >= 0)
            fprintf(stderr, "     worst LSE[%lld]: got %.9g want %.9g\n", (long long)r.worst,
                    (double)t->lse_got[r.worst], t->lse_ref[r.worst]);
        ok &= good;
    }
    if (t->wb) {
        good = within_f32_tol(t->w_got, t->w_ref, t->nw, &r);
        CHECK(good, "%s weights: max_err %.3g rel %.3g nonfinite %d worst %lld [%s]", what,
              r.max_err, r.rel_err, r.nonfinite_mismatch, (long long)r.worst, t->desc);
        ok &= good;
    }
    return ok;
}

/* Overwrite with `val` every K and V row that the structural masks (key length, causal,
 * window) hide from every query row that reads it. Returns how many rows were poisoned.
 * Not for kv_bcast cases (the rows are shared across batches). */
static inline int64_t tcall_poison(tcall *t, float val) {
    const fcase *c = &t->c;
    int64_t n = 0;
    for (int64_t b = 0; b < c->B; b++) {
        int64_t lkb = oracle_lkb(&t->opt, b, c->Lk);
        for (int64_t j = 0; j < c->Lk; j++) {
            int used = 0;
            for (int64_t i = 0; i < c->Lq && !used; i++)
                used = oracle_structural_keep(&t->opt, lkb, oracle_diag(&t->opt, i, lkb, c->Lq), j);
            if (used) continue;
            for (int64_t hk = 0; hk < c->Hkv; hk++) {
                for (int64_t d = 0; d < c->Dk; d++) *view_ptr(&t->k, b, hk, j, d) = val;
                for (int64_t d = 0; d < c->Dv; d++) *view_ptr(&t->v, b, hk, j, d) = val;
            }
            n++;
        }
    }
    return n;
}

static inline void tcall_free(tcall *t) {
    free(t->qb); free(t->kb); free(t->vb); free(t->ob); free(t->ocover);
    free(t->lseb); free(t->wb); free(t->biasb); free(t->slopeb); free(t->maskb); free(t->kvlb);
    free(t->o_ref); free(t->lse_ref); free(t->w_ref);
    free(t->o_got); free(t->lse_got); free(t->w_got);
    memset(t, 0, sizeof *t);
}

#endif /* ATTN_TEST_ORACLE_H */
