/*
 * sinks_case.h — a case of the sinks suites (test_sinks.c, test_sinks_backward.c) and its
 *                oracle: the shape, masks, layout and dtypes of a call with attention
 *                sinks, its data (the library's tensors, and the same values in double,
 *                16-bit rounding included), and the test's own float64 attention with
 *                the head's sink appended as one more logit whose value row is zero
 *                (nothing of the library's reference, nor of its folding formula).
 *
 * What it is not: a check (the suites hold the library to the oracle) or the library's
 * definition of sinks (docs/CONTRACT.md).
 */
#ifndef ATTN_TEST_SINKS_CASE_H
#define ATTN_TEST_SINKS_CASE_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "core/half.h"
#include "oracle.h"

typedef struct sk_case {
    int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
    bool causal;
    attn_align align;
    const int64_t *kv_len;  // (B) or NULL
    int mask;               // 0 none, 1 bool mask (row 1 of each head fully false), 2 -inf bias
    bool blhd;              // q, k, v, o stored [B, L, H, D]
    attn_dtype dt, o_dt;    // q, k, v's and o's
    double sink_lo, sink_hi;
    uint64_t seed;
} sk_case;

/* The case's data: float copies the library reads (dtype dt where 16-bit) and the same
 * values in double (the 16-bit rounding included) that the oracle reads. */
typedef struct sk_data {
    sk_case c;
    int64_t nq, nk, nv, no, nl;
    double *q, *k, *v, *sinks;  // dense [B, H, L, D], (Hq)
    void *bq, *bk, *bv;         // the library's, in c.dt, in c's layout
    float *fsinks;
    uint8_t *mask;              // [B, Hq, Lq, Lk] or NULL
    float *bias;                // [B, 1, Lq, Lk] or NULL
    attn_tensor tq, tk, tv, tmask, tbias, tkvl, tsinks;
    attn_options opt;
} sk_data;

static inline attn_tensor layout_view(void *data, attn_dtype dt, int64_t B, int64_t H,
                                      int64_t L, int64_t D, bool blhd) {
    if (!blhd) return attn_tensor_4d(data, dt, B, H, L, D);
    return (attn_tensor){data, dt, {B, H, L, D}, {L * H * D, D, H * D, 1}};
}

static inline void put(attn_dtype dt, void *base, int64_t idx, double x, double *back) {
    attn_store(dt, base, idx, (float)x);
    *back = attn_load(dt, base, idx);
}

/* (d is filled in place: its options point into it) */
static inline void sk_make(sk_case c, sk_data *dp) {
    sk_data d = {.c = c};
    rng_t r = {c.seed};
    d.nq = c.B * c.Hq * c.Lq * c.Dk, d.nk = c.B * c.Hkv * c.Lk * c.Dk;
    d.nv = c.B * c.Hkv * c.Lk * c.Dv, d.no = c.B * c.Hq * c.Lq * c.Dv, d.nl = c.B * c.Hq * c.Lq;
    d.q = xcalloc(d.nq, sizeof(double)), d.k = xcalloc(d.nk, sizeof(double));
    d.v = xcalloc(d.nv, sizeof(double)), d.sinks = xcalloc(c.Hq, sizeof(double));
    const size_t e = attn_dtype_size(c.dt);
    d.bq = xcalloc(d.nq, e), d.bk = xcalloc(d.nk, e), d.bv = xcalloc(d.nv, e);
    d.tq = layout_view(d.bq, c.dt, c.B, c.Hq, c.Lq, c.Dk, c.blhd);
    d.tk = layout_view(d.bk, c.dt, c.B, c.Hkv, c.Lk, c.Dk, c.blhd);
    d.tv = layout_view(d.bv, c.dt, c.B, c.Hkv, c.Lk, c.Dv, c.blhd);
    const attn_tensor *lib[3] = {&d.tq, &d.tk, &d.tv};
    double *dense[3] = {d.q, d.k, d.v};
    for (int x = 0; x < 3; x++) {
        const attn_tensor *t = lib[x];
        for (int64_t a = 0; a < t->shape[0]; a++)
            for (int64_t h = 0; h < t->shape[1]; h++)
                for (int64_t i = 0; i < t->shape[2]; i++)
                    for (int64_t z = 0; z < t->shape[3]; z++)
                        put(c.dt, t->data,
                            a * t->stride[0] + h * t->stride[1] + i * t->stride[2] + z * t->stride[3],
                            rng_sym(&r),
                            &dense[x][((a * t->shape[1] + h) * t->shape[2] + i) * t->shape[3] + z]);
    }
    d.fsinks = xcalloc(c.Hq, sizeof(float));
    for (int64_t h = 0; h < c.Hq; h++) {
        d.fsinks[h] = (float)rng_range(&r, c.sink_lo, c.sink_hi);
        if (h == 1) d.fsinks[h] = 0.0f;           // the off-by-one softmax
        if (h == 2) d.fsinks[h] = -INFINITY;      // no sink for this head
        d.sinks[h] = d.fsinks[h];
    }
    d.tsinks = attn_tensor_4d(d.fsinks, ATTN_F32, c.Hq, 1, 1, 1);
    d.opt = (attn_options){.causal = c.causal, .align = c.align, .sinks = &d.tsinks};
    if (c.kv_len) {
        d.tkvl = attn_tensor_4d((void *)c.kv_len, ATTN_I64, c.B, 1, 1, 1);
        d.opt.kv_len = &d.tkvl;
    }
    if (c.mask == 1) {
        d.mask = xcalloc(c.B * c.Hq * c.Lq * c.Lk, 1);
        for (int64_t x = 0; x < c.B * c.Hq * c.Lq * c.Lk; x++)
            d.mask[x] = rng_unif(&r) < 0.7 && (x / c.Lk) % c.Lq != 1;
        d.tmask = attn_tensor_4d(d.mask, ATTN_BOOL, c.B, c.Hq, c.Lq, c.Lk);
        d.opt.mask = &d.tmask;
    } else if (c.mask == 2) {
        d.bias = xcalloc(c.B * c.Lq * c.Lk, sizeof(float));
        for (int64_t x = 0; x < c.B * c.Lq * c.Lk; x++)
            d.bias[x] = rng_unif(&r) < 0.2 ? -INFINITY : (float)rng_sym(&r);
        d.tbias = attn_tensor_4d(d.bias, ATTN_F32, c.B, 1, c.Lq, c.Lk);
        d.opt.bias = &d.tbias;
    }
    *dp = d;
    dp->tq.data = d.bq, dp->tk.data = d.bk, dp->tv.data = d.bv;
    dp->opt.sinks = &dp->tsinks;
    if (c.kv_len) dp->opt.kv_len = &dp->tkvl;
    if (c.mask == 1) dp->opt.mask = &dp->tmask;
    if (c.mask == 2) dp->opt.bias = &dp->tbias;
}

static inline void sk_free(sk_data *d) {
    free(d->q), free(d->k), free(d->v), free(d->sinks), free(d->bq), free(d->bk), free(d->bv);
    free(d->fsinks), free(d->mask), free(d->bias);
}

/* The oracle: for each row, its kept logits s_j (masks as docs/CONTRACT.md), the sink
 * appended as s_n with a value row of zeros, and the softmax over all n + 1:
 *   m = max(s_0..s_n), l = Σ exp(s - m), o = Σ_j exp(s_j - m) / l · v_j (+ p_n · 0),
 *   lse = m + ln l; every logit -inf (no key, no sink): o = 0, lse = -inf, w = 0.
 *   o [B, Hq, Lq, Dv], lse [B, Hq, Lq], w [B, Hq, Lq, Lk] dense; lse and w may be NULL. */
static inline void sink_oracle(const sk_data *d, const double *q, const double *k,
                               const double *v, const double *sinks, double *o, double *lse,
                               double *w) {
    const sk_case *c = &d->c;
    const int64_t Lk = c->Lk, G = c->Hq / c->Hkv;
    const double scale = 1.0 / sqrt((double)c->Dk);
    double *s = xcalloc(Lk + 1, sizeof(double)), *val0 = xcalloc(c->Dv, sizeof(double));
    int64_t *key = xcalloc(Lk + 1, sizeof(int64_t));
    for (int64_t b = 0; b < c->B; b++) {
        const int64_t lkb = oracle_lkb(&d->opt, b, Lk);
        for (int64_t h = 0; h < c->Hq; h++)
            for (int64_t i = 0; i < c->Lq; i++) {
                const int64_t row = (b * c->Hq + h) * c->Lq + i, di = oracle_diag(&d->opt, i, lkb, c->Lq);
                int64_t n = 0;
                for (int64_t j = 0; j < Lk; j++) {
                    if (!oracle_structural_keep(&d->opt, lkb, di, j)) continue;
                    if (d->mask && !d->mask[row * Lk + j]) continue;
                    double x = 0.0;
                    for (int64_t z = 0; z < c->Dk; z++)
                        x += q[row * c->Dk + z] * k[((b * c->Hkv + h / G) * Lk + j) * c->Dk + z];
                    x *= scale;
                    if (d->bias) {
                        const double bx = d->bias[(b * c->Lq + i) * Lk + j];
                        if (bx == -INFINITY) continue;
                        x += bx;
                    }
                    s[n] = x, key[n++] = j;
                }
                s[n] = sinks[h], key[n] = -1;  // the sink: one more logit, value row 0
                double m = -INFINITY;
                bool nan = false;
                for (int64_t t = 0; t <= n; t++) {
                    nan |= isnan(s[t]);
                    if (s[t] > m) m = s[t];
                }
                if (nan) m = NAN;
                double *o_r = o + row * c->Dv;
                for (int64_t z = 0; z < c->Dv; z++) o_r[z] = 0.0;
                if (w)
                    for (int64_t j = 0; j < Lk; j++) w[row * Lk + j] = 0.0;
                if (m == -INFINITY) {
                    if (lse) lse[row] = -INFINITY;
                    continue;
                }
                double l = 0.0;
                for (int64_t t = 0; t <= n; t++) l += exp(s[t] - m);
                for (int64_t t = 0; t <= n; t++) {
                    const double p = exp(s[t] - m) / l;
                    const double *v_t = key[t] < 0 ? val0
                                                   : v + ((b * c->Hkv + h / G) * Lk + key[t]) * c->Dv;
                    for (int64_t z = 0; z < c->Dv; z++) o_r[z] += p * v_t[z];
                    if (w && key[t] >= 0) w[row * Lk + key[t]] = p;
                }
                if (lse) lse[row] = m + log(l);
            }
    }
    free(s), free(val0), free(key);
}

/* element [b, h, i, z] of a library output view, as double */
static inline double at(const attn_tensor *t, int64_t b, int64_t h, int64_t i, int64_t z) {
    return attn_load(t->dtype, t->data,
                     b * t->stride[0] + h * t->stride[1] + i * t->stride[2] + z * t->stride[3]);
}

/* a library output view gathered dense [d0, d1, d2, d3] into float */
static inline void gather(const attn_tensor *t, float *out) {
    int64_t x = 0;
    for (int64_t a = 0; a < t->shape[0]; a++)
        for (int64_t b = 0; b < t->shape[1]; b++)
            for (int64_t c = 0; c < t->shape[2]; c++)
                for (int64_t z = 0; z < t->shape[3]; z++) out[x++] = (float)at(t, a, b, c, z);
}

/* The 16-bit output's bound: |o - ref| <= eps |ref| + 1e-5 (1 + max|ref|), eps two
 * half-ulps of the type (2^-8 bfloat16, 2^-11 float16): the correctly rounded value is
 * within one half-ulp, and a float32 result a hair off the tie may round the other way. */
static inline int within_half(const float *got, const double *ref, int64_t n, attn_dtype dt,
                              double *worst) {
    const double eps = dt == ATTN_BF16 ? 0x1p-8 : 0x1p-11;
    double mref = 0.0;
    for (int64_t x = 0; x < n; x++) mref = fmax(mref, fabs(ref[x]));
    *worst = 0.0;
    int ok = 1;
    for (int64_t x = 0; x < n; x++) {
        const double e = fabs(got[x] - ref[x]), bound = eps * fabs(ref[x]) + 1e-5 * (1.0 + mref);
        if (!(e <= bound)) ok = 0;
        if (e / bound > *worst) *worst = e / bound;
    }
    return ok;
}

static inline const char *path_name(attn_path p) {
    return p == ATTN_PATH_REFERENCE ? "reference" : "fused";
}

#endif /* ATTN_TEST_SINKS_CASE_H */
