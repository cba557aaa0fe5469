/*
 * test_f64.c — float64 q, k, v and o (CONTRACT.md "float64"): the fused float64 forward
 *              and the float64 backward against an independent long double computation,
 *              against the float64 reference path, and their promises.
 *
 * What it covers:
 *  1. The forward (fused float64 path, and ATTN_PATH_REFERENCE on float64) against a
 *     long double (x86: 80-bit, 64-bit mantissa) oracle written here from the contract's
 *     formulas — its own structural masks, logits, softmax — on random data over several
 *     shapes (GQA, Lq > Lk, Dk != Dv, a decoding shape, tiles of 16 x 64 and their
 *     edges) and every option: scale (negative too), softcap, causal under both
 *     alignments, windows, a bool mask (full and [B, 1, 1, Lk] broadcast), a float32 bias
 *     with -inf, kv_len (0 included), ALiBi, and all of them at once. The error bound is
 *     per element, relative to the row's magnitude sum_j p_ij |v_jd|:
 *         |o - o_ld| <= TOL_O * eps64 * (1 + max_j |s_ij|) * sum_j p_ij |v_jd|
 *     and |lse - lse_ld| <= TOL_LSE * eps64 * (1 + max_j |s_ij|) (max over the row's kept
 *     logits): the logits carry the error of the dot products, which exp turns into a
 *     relative error of p of the logit's size. The measured worst ratios are printed.
 *  2. Fused against the reference path: LSE (float64) and O within the same bound; the
 *     float32 weights within one float32 ulp; a float32 LSE equal to the float64 one
 *     rounded.
 *  3. Bit-identical O, LSE and weights for 1, 2 and 3 threads.
 *  4. The backward (float64: the fused float64 backward, backward_f64.c) against a
 *     long double backward, per element relative to the gradient's magnitude (the same sums over
 *     absolute values), TOL_G * eps64 * (1 + max |s|).
 *  5. NaN in structurally masked K/V rows reaches nothing; fully masked rows give O = 0,
 *     LSE = -inf, weights 0, gradients 0; the workspace does not grow with Lk.
 *  6. Misuse: mixed float64 / float32 refused with ATTN_ERR_DTYPE, nothing written;
 *     attn_merge and attn_weights_grid refuse float64.
 *  7. Each tolerance check rejects a planted error.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "check.h"
#include "rng.h"

/* The bounds, in units of eps64 = 2^-52 (CONTRACT.md "float64" states them). */
#define EPS64 DBL_EPSILON
#define TOL_O 16.0
#define TOL_LSE 16.0
#define TOL_G 16.0

typedef long double ld;

/* ---- a case --------------------------------------------------------------------------- */

typedef struct shape {
    int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
} shape;

enum {
    OPT_SCALE = 1 << 0, OPT_SOFTCAP = 1 << 1, OPT_CAUSAL = 1 << 2, OPT_BR = 1 << 3,
    OPT_WINDOW = 1 << 4, OPT_MASK = 1 << 5, OPT_MASK_KEYS = 1 << 6, OPT_BIAS = 1 << 7,
    OPT_KVLEN = 1 << 8, OPT_ALIBI = 1 << 9, OPT_SINKS = 1 << 10,
};

typedef struct fcase {
    shape s;
    unsigned opts;
    double *q, *k, *v;
    uint8_t *mask;      // [B, Hq, Lq, Lk] or [B, 1, 1, Lk]
    float *bias;        // [B, Hq, Lq, Lk]
    int64_t *kv_len;    // [B]
    float *slopes;      // [Hq]
    float *sinks;       // [Hq], the last head's -inf (no sink)
    attn_tensor tq, tk, tv, tmask, tbias, tkvl, tslopes, tsinks;
    attn_options opt;
} fcase;

static void case_make(fcase *c, shape s, unsigned opts, uint64_t seed) {
    memset(c, 0, sizeof *c);
    c->s = s;
    c->opts = opts;
    rng_t r = {seed};
    const int64_t nq = s.B * s.Hq * s.Lq * s.Dk, nk = s.B * s.Hkv * s.Lk * s.Dk,
                  nv = s.B * s.Hkv * s.Lk * s.Dv, ns = s.B * s.Hq * s.Lq * s.Lk;
    c->q = xcalloc(nq, sizeof(double));
    c->k = xcalloc(nk, sizeof(double));
    c->v = xcalloc(nv, sizeof(double));
    for (int64_t e = 0; e < nq; e++) c->q[e] = 1.5 * rng_normal(&r);
    for (int64_t e = 0; e < nk; e++) c->k[e] = 1.5 * rng_normal(&r);
    for (int64_t e = 0; e < nv; e++) c->v[e] = rng_normal(&r);
    c->tq = attn_tensor_4d(c->q, ATTN_F64, s.B, s.Hq, s.Lq, s.Dk);
    c->tk = attn_tensor_4d(c->k, ATTN_F64, s.B, s.Hkv, s.Lk, s.Dk);
    c->tv = attn_tensor_4d(c->v, ATTN_F64, s.B, s.Hkv, s.Lk, s.Dv);
    attn_options o = {0};
    if (opts & OPT_SCALE) {
        o.has_scale = true;
        o.scale = 7.0f;  // not read: scale_f64 is given
        o.scale_f64 = -0.3;
    }
    if (opts & OPT_SOFTCAP) o.softcap = 5.0f;
    o.causal = (opts & OPT_CAUSAL) != 0;
    o.align = (opts & OPT_BR) ? ATTN_ALIGN_BOTTOM_RIGHT : ATTN_ALIGN_TOP_LEFT;
    if (opts & OPT_WINDOW) {
        o.has_window = true;
        o.window_left = 7;
        o.window_right = 3;
    }
    if (opts & (OPT_MASK | OPT_MASK_KEYS)) {
        const bool keys = opts & OPT_MASK_KEYS;
        const int64_t n = keys ? s.B * s.Lk : ns;
        c->mask = xcalloc(n, 1);
        for (int64_t e = 0; e < n; e++) c->mask[e] = rng_unif(&r) < 0.7;
        if (keys) {
            c->tmask = (attn_tensor){c->mask, ATTN_BOOL, {s.B, 1, 1, s.Lk}, {s.Lk, 0, 0, 1}};
        } else {
            c->tmask = attn_tensor_4d(c->mask, ATTN_BOOL, s.B, s.Hq, s.Lq, s.Lk);
        }
        o.mask = &c->tmask;
    }
    if (opts & OPT_BIAS) {
        c->bias = xcalloc(ns, sizeof(float));
        for (int64_t e = 0; e < ns; e++)
            c->bias[e] = rng_unif(&r) < 0.1 ? -INFINITY : (float)(2.0 * rng_normal(&r));
        c->tbias = attn_tensor_4d(c->bias, ATTN_F32, s.B, s.Hq, s.Lq, s.Lk);
        o.bias = &c->tbias;
    }
    if (opts & OPT_KVLEN) {
        c->kv_len = xcalloc(s.B, sizeof(int64_t));
        for (int64_t b = 0; b < s.B; b++) c->kv_len[b] = b == 1 ? 0 : rng_int(&r, s.Lk + 1);
        c->tkvl = attn_tensor_4d(c->kv_len, ATTN_I64, s.B, 1, 1, 1);
        o.kv_len = &c->tkvl;
    }
    if (opts & OPT_ALIBI) {
        c->slopes = xcalloc(s.Hq, sizeof(float));
        for (int64_t h = 0; h < s.Hq; h++) c->slopes[h] = (float)ldexp(1.0, -(int)(h + 1));
        c->tslopes = attn_tensor_4d(c->slopes, ATTN_F32, s.Hq, 1, 1, 1);
        o.alibi_slopes = &c->tslopes;
    }
    if (opts & OPT_SINKS) {
        c->sinks = xcalloc(s.Hq, sizeof(float));
        for (int64_t h = 0; h < s.Hq; h++)
            c->sinks[h] = h == s.Hq - 1 && h > 0 ? -INFINITY : (float)(1.5 * rng_normal(&r));
        c->tsinks = attn_tensor_4d(c->sinks, ATTN_F32, s.Hq, 1, 1, 1);
        o.sinks = &c->tsinks;
    }
    c->opt = o;
}

static void case_free(fcase *c) {
    free(c->q); free(c->k); free(c->v); free(c->mask); free(c->bias); free(c->kv_len);
    free(c->slopes); free(c->sinks);
}

/* ---- the long double oracle, from the contract's text --------------------------------- */

/* Row (b, h, i)'s final logits into s (Lk), -inf where masked; returns whether any key is
 * kept. Written from CONTRACT.md "The function", not from the library's helpers. */
static bool oracle_logits(const fcase *c, int64_t b, int64_t h, int64_t i, ld *s) {
    const shape S = c->s;
    const attn_options *o = &c->opt;
    const int64_t g = h / (S.Hq / S.Hkv);
    const int64_t lk_b = c->kv_len ? c->kv_len[b] : S.Lk;
    const int64_t d_i = o->align == ATTN_ALIGN_BOTTOM_RIGHT ? i + lk_b - S.Lq : i;
    /* float64: the scale in float64 (options.scale_f64), the default 1/sqrt(Dk) not
     * rounded to float32 (here exact in long double) */
    const ld scale = o->has_scale ? (ld)(o->scale_f64 != 0 ? o->scale_f64 : (double)o->scale)
                     : S.Dk > 0  ? 1 / sqrtl((ld)S.Dk)
                                 : 1;  // the contract's default for Dk = 0
    bool any = false;
    for (int64_t j = 0; j < S.Lk; j++) {
        bool keep = j < lk_b;
        if (o->causal && j > d_i) keep = false;
        if (o->has_window && o->window_left >= 0 && j < d_i - o->window_left) keep = false;
        if (o->has_window && o->window_right >= 0 && j > d_i + o->window_right) keep = false;
        if (c->mask) {
            const int64_t at = (c->opts & OPT_MASK_KEYS) ? b * S.Lk + j
                                                         : ((b * S.Hq + h) * S.Lq + i) * S.Lk + j;
            if (!c->mask[at]) keep = false;
        }
        if (!keep) {
            s[j] = -INFINITY;
            continue;
        }
        ld dot = 0;
        for (int64_t d = 0; d < S.Dk; d++)
            dot += (ld)c->q[((b * S.Hq + h) * S.Lq + i) * S.Dk + d] *
                   (ld)c->k[((b * S.Hkv + g) * S.Lk + j) * S.Dk + d];
        ld x = scale * dot;
        if (o->softcap > 0) x = (ld)o->softcap * tanhl(x / (ld)o->softcap);
        if (c->bias) {
            const float bb = c->bias[((b * S.Hq + h) * S.Lq + i) * S.Lk + j];
            if (bb == -INFINITY) {
                s[j] = -INFINITY;
                continue;
            }
            x += bb;
        }
        if (c->slopes) x -= (ld)c->slopes[h] * (ld)llabs(d_i - j);
        s[j] = x;
        any = true;
    }
    return any;
}

/* O, LSE and per element the magnitude sum_j p_ij |v_jd| (mag, for the bound) and per
 * row 1 + max |s_ij| (smax); a fully masked row: O = 0, LSE = -inf, mag = 0. */
static void oracle_forward(const fcase *c, ld *O, ld *lse, ld *mag, ld *smax, ld *P) {
    const shape S = c->s;
    ld *s = xcalloc(S.Lk, sizeof(ld));
    for (int64_t b = 0; b < S.B; b++)
        for (int64_t h = 0; h < S.Hq; h++)
            for (int64_t i = 0; i < S.Lq; i++) {
                const int64_t row = (b * S.Hq + h) * S.Lq + i, g = h / (S.Hq / S.Hkv);
                /* a sink (CONTRACT "Attention sinks") is one more logit of the row with
                 * no value: in the max and the sum, never in O */
                const ld sink = c->sinks ? (ld)c->sinks[h] : -INFINITY;
                const bool any = oracle_logits(c, b, h, i, s) || sink != -INFINITY;
                ld m = sink, big = sink == -INFINITY ? 0 : fabsl(sink);
                for (int64_t j = 0; j < S.Lk; j++)
                    if (s[j] != -INFINITY) {
                        if (s[j] > m) m = s[j];
                        if (fabsl(s[j]) > big) big = fabsl(s[j]);
                    }
                smax[row] = 1 + big;
                ld l = any && sink != -INFINITY ? expl(sink - m) : 0;
                for (int64_t j = 0; j < S.Lk; j++) l += any ? expl(s[j] - m) : 0;
                lse[row] = any ? m + logl(l) : -INFINITY;
                for (int64_t j = 0; P && j < S.Lk; j++)
                    P[row * S.Lk + j] = any ? expl(s[j] - m) / l : 0;
                for (int64_t d = 0; d < S.Dv; d++) {
                    ld acc = 0, a = 0;
                    for (int64_t j = 0; any && j < S.Lk; j++) {
                        if (s[j] == -INFINITY) continue;
                        const ld p = expl(s[j] - m) / l, x = c->v[((b * S.Hkv + g) * S.Lk + j) * S.Dv + d];
                        acc += p * x;
                        a += p * fabsl(x);
                    }
                    O[row * S.Dv + d] = acc;
                    mag[row * S.Dv + d] = a;
                }
            }
    free(s);
}

/* ---- the bound ---------------------------------------------------------------------- */

typedef struct worst {
    double o, lse, g;  // the largest err / (eps64 * scale) seen
} worst;
static worst g_worst;

/* Whether o (n = rows * Dv) is within TOL_O of the oracle; updates the worst ratio. */
static bool o_within(const double *o, const ld *O, const ld *mag, const ld *smax, int64_t rows,
                     int64_t Dv, double *worst_ratio) {
    bool ok = true;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t d = 0; d < Dv; d++) {
            const int64_t e = r * Dv + d;
            const ld err = fabsl((ld)o[e] - O[e]);
            const ld unit = (ld)EPS64 * smax[r] * mag[e];
            if (unit == 0) {  // fully masked row, or every kept p_ij v_jd = 0
                if (err != 0 || isnan(o[e])) ok = false;
                continue;
            }
            const double ratio = (double)(err / unit);
            if (!(ratio <= TOL_O)) ok = false;
            if (worst_ratio && ratio > *worst_ratio) *worst_ratio = ratio;
        }
    return ok;
}

static bool lse_within(const double *lse, const ld *L, const ld *smax, int64_t rows,
                       double *worst_ratio) {
    bool ok = true;
    for (int64_t r = 0; r < rows; r++) {
        if (L[r] == -INFINITY) {
            if (lse[r] != -INFINITY) ok = false;
            continue;
        }
        const double ratio = (double)(fabsl((ld)lse[r] - L[r]) / ((ld)EPS64 * smax[r]));
        if (!(ratio <= TOL_LSE)) ok = false;
        if (worst_ratio && ratio > *worst_ratio) *worst_ratio = ratio;
    }
    return ok;
}

/* ---- 1-3: the forward ----------------------------------------------------------------- */

typedef struct run_out {
    double *o, *lse;
    float *w, *lse32;
} run_out;

static attn_status run_forward(fcase *c, attn_path path, int threads, run_out *out) {
    const shape S = c->s;
    const int64_t rows = S.B * S.Hq * S.Lq;
    out->o = xcalloc(rows * S.Dv, sizeof(double));
    out->lse = xcalloc(rows, sizeof(double));
    out->w = xcalloc(rows * S.Lk, sizeof(float));
    out->lse32 = xcalloc(rows, sizeof(float));
    attn_tensor to = attn_tensor_4d(out->o, ATTN_F64, S.B, S.Hq, S.Lq, S.Dv);
    attn_tensor tl = attn_tensor_4d(out->lse, ATTN_F64, S.B, S.Hq, S.Lq, 1);
    attn_tensor tw = attn_tensor_4d(out->w, ATTN_F32, S.B, S.Hq, S.Lq, S.Lk);
    attn_options o = c->opt;
    o.path = path;
    o.threads = threads;
    o.lse = &tl;
    o.weights = &tw;
    attn_status st = attn_forward(&c->tq, &c->tk, &c->tv, &to, &o);
    if (st != ATTN_OK) return st;
    /* once more with a float32 LSE and no weights (the split-free call a user makes) */
    double *o2 = xcalloc(rows * S.Dv, sizeof(double));
    attn_tensor to2 = attn_tensor_4d(o2, ATTN_F64, S.B, S.Hq, S.Lq, S.Dv);
    attn_tensor tl32 = attn_tensor_4d(out->lse32, ATTN_F32, S.B, S.Hq, S.Lq, 1);
    o.lse = &tl32;
    o.weights = NULL;
    st = attn_forward(&c->tq, &c->tk, &c->tv, &to2, &o);
    if (st == ATTN_OK && memcmp(o2, out->o, (size_t)(rows * S.Dv) * sizeof(double)) != 0)
        st = ATTN_ERR_VALUE;  // the weights changed O: reported by the caller's CHECK
    free(o2);
    return st;
}

static void run_free(run_out *r) {
    free(r->o); free(r->lse); free(r->w); free(r->lse32);
}

static void forward_case(shape s, unsigned opts, uint64_t seed) {
    fcase c;
    case_make(&c, s, opts, seed);
    const int64_t rows = s.B * s.Hq * s.Lq;
    ld *O = xcalloc(rows * s.Dv, sizeof(ld)), *L = xcalloc(rows, sizeof(ld));
    ld *mag = xcalloc(rows * s.Dv, sizeof(ld)), *smax = xcalloc(rows, sizeof(ld));
    ld *P = xcalloc(rows * s.Lk, sizeof(ld));
    oracle_forward(&c, O, L, mag, smax, P);

    run_out f, r;
    const attn_status sf = run_forward(&c, ATTN_PATH_AUTO, 2, &f);
    const attn_status sr = run_forward(&c, ATTN_PATH_REFERENCE, 2, &r);
    CHECK(sf == ATTN_OK && sr == ATTN_OK, "shape %lld %lld %lld %lld %lld %lld %lld opts %#x: "
          "status fused %d reference %d (%s)", (long long)s.B, (long long)s.Hq, (long long)s.Hkv,
          (long long)s.Lq, (long long)s.Lk, (long long)s.Dk, (long long)s.Dv, opts, sf, sr,
          attn_last_error());
    if (sf == ATTN_OK && sr == ATTN_OK) {
        CHECK(o_within(f.o, O, mag, smax, rows, s.Dv, &g_worst.o),
              "fused O vs long double, opts %#x, Lq %lld Lk %lld", opts, (long long)s.Lq,
              (long long)s.Lk);
        CHECK(o_within(r.o, O, mag, smax, rows, s.Dv, &g_worst.o),
              "reference O vs long double, opts %#x", opts);
        CHECK(lse_within(f.lse, L, smax, rows, &g_worst.lse), "fused LSE vs long double, opts %#x",
              opts);
        CHECK(lse_within(r.lse, L, smax, rows, &g_worst.lse), "reference LSE, opts %#x", opts);
        /* fused against reference: O and LSE within the bound (their own difference), the
         * float32 weights within one float32 ulp (+ the smallest normal), the float32 LSE
         * the float64 one rounded */
        int bad_w = 0, bad_l32 = 0;
        for (int64_t e = 0; e < rows * s.Lk; e++) {
            const double a = f.w[e], b = r.w[e];
            if (!(fabs(a - b) <= fabs(b) * 0x1p-23 + 0x1p-126)) bad_w++;
            const double pw = (double)P[e];
            if (!(fabs(a - pw) <= pw * 0x1p-23 + 0x1p-126 + 8 * EPS64)) bad_w++;
        }
        for (int64_t e = 0; e < rows; e++)
            if (!(f.lse32[e] == (float)f.lse[e]) && !(isnan(f.lse32[e]) && isnan(f.lse[e])))
                bad_l32++;
        CHECK(bad_w == 0, "weights: %d entries off (fused vs reference or vs the oracle), opts %#x",
              bad_w, opts);
        CHECK(bad_l32 == 0, "float32 LSE is not the float64 LSE rounded in %d rows", bad_l32);
        /* bit-identical for 1, 2, 3 threads */
        run_out t1, t3;
        const attn_status s1 = run_forward(&c, ATTN_PATH_FUSED, 1, &t1);
        const attn_status s3 = run_forward(&c, ATTN_PATH_FUSED, 3, &t3);
        CHECK(s1 == ATTN_OK && s3 == ATTN_OK &&
                  !memcmp(t1.o, f.o, (size_t)(rows * s.Dv) * sizeof(double)) &&
                  !memcmp(t3.o, f.o, (size_t)(rows * s.Dv) * sizeof(double)) &&
                  !memcmp(t1.lse, f.lse, (size_t)rows * sizeof(double)) &&
                  !memcmp(t3.lse, f.lse, (size_t)rows * sizeof(double)) &&
                  !memcmp(t1.w, f.w, (size_t)(rows * s.Lk) * sizeof(float)) &&
                  !memcmp(t3.w, f.w, (size_t)(rows * s.Lk) * sizeof(float)),
              "threads 1, 2, 3 not bit-identical, opts %#x", opts);
        run_free(&t1);
        run_free(&t3);
    }
    run_free(&f);
    run_free(&r);
    free(O); free(L); free(mag); free(smax); free(P);
    case_free(&c);
}

/* ---- 4: the backward ------------------------------------------------------------------ */

/* The long double gradients and their magnitudes (the same sums over absolute values). */
static void oracle_backward(const fcase *c, const double *d_o, ld *dq, ld *dk, ld *dv, ld *mq,
                            ld *mk, ld *mv, ld *smax_g) {
    const shape S = c->s;
    const attn_options *o = &c->opt;
    /* float64: the scale in float64 (options.scale_f64), the default 1/sqrt(Dk) not
     * rounded to float32 (here exact in long double) */
    const ld scale = o->has_scale ? (ld)(o->scale_f64 != 0 ? o->scale_f64 : (double)o->scale)
                     : S.Dk > 0  ? 1 / sqrtl((ld)S.Dk)
                                 : 1;  // the contract's default for Dk = 0
    ld *s = xcalloc(S.Lk, sizeof(ld)), *p = xcalloc(S.Lk, sizeof(ld));
    ld *ds = xcalloc(S.Lk, sizeof(ld)), *dsm = xcalloc(S.Lk, sizeof(ld));
    *smax_g = 1;
    for (int64_t b = 0; b < S.B; b++)
        for (int64_t h = 0; h < S.Hq; h++)
            for (int64_t i = 0; i < S.Lq; i++) {
                const int64_t row = (b * S.Hq + h) * S.Lq + i, g = h / (S.Hq / S.Hkv);
                if (!oracle_logits(c, b, h, i, s)) continue;  // fully masked: no gradient
                /* the sink is in the max and the sum of P (so in every p_ij), not in O */
                const ld sink = c->sinks ? (ld)c->sinks[h] : -INFINITY;
                ld m = sink, l = 0;
                for (int64_t j = 0; j < S.Lk; j++)
                    if (s[j] != -INFINITY) {
                        if (s[j] > m) m = s[j];
                        if (1 + fabsl(s[j]) > *smax_g) *smax_g = 1 + fabsl(s[j]);
                    }
                if (sink != -INFINITY) l = expl(sink - m);
                for (int64_t j = 0; j < S.Lk; j++) l += expl(s[j] - m);
                const double *do_i = d_o + row * S.Dv;
                ld D = 0, Dm = 0;
                for (int64_t j = 0; j < S.Lk; j++) {
                    p[j] = expl(s[j] - m) / l;
                    ds[j] = dsm[j] = 0;
                    if (p[j] == 0) continue;
                    const double *v_j = c->v + ((b * S.Hkv + g) * S.Lk + j) * S.Dv;
                    ld dp = 0, dpm = 0;
                    for (int64_t d = 0; d < S.Dv; d++) {
                        dp += (ld)do_i[d] * v_j[d];
                        dpm += fabsl((ld)do_i[d] * v_j[d]);
                    }
                    ds[j] = dp;
                    dsm[j] = dpm;
                    D += p[j] * dp;
                    Dm += p[j] * dpm;
                }
                for (int64_t j = 0; j < S.Lk; j++) {
                    if (p[j] == 0) continue;
                    ld f = scale;
                    if (o->softcap > 0) {
                        /* recompute raw for the softcap factor 1 - tanh² */
                        ld dot = 0;
                        for (int64_t d = 0; d < S.Dk; d++)
                            dot += (ld)c->q[row * S.Dk + d] *
                                   (ld)c->k[((b * S.Hkv + g) * S.Lk + j) * S.Dk + d];
                        const ld t = tanhl(scale * dot / (ld)o->softcap);
                        f *= 1 - t * t;
                    }
                    const double *v_j = c->v + ((b * S.Hkv + g) * S.Lk + j) * S.Dv;
                    (void)v_j;
                    ds[j] = f * p[j] * (ds[j] - D);
                    dsm[j] = fabsl(f) * p[j] * (dsm[j] + Dm);
                    const int64_t kj = ((b * S.Hkv + g) * S.Lk + j);
                    for (int64_t d = 0; d < S.Dk; d++) {
                        dq[row * S.Dk + d] += ds[j] * c->k[kj * S.Dk + d];
                        mq[row * S.Dk + d] += dsm[j] * fabsl((ld)c->k[kj * S.Dk + d]);
                        dk[kj * S.Dk + d] += ds[j] * c->q[row * S.Dk + d];
                        mk[kj * S.Dk + d] += dsm[j] * fabsl((ld)c->q[row * S.Dk + d]);
                    }
                    for (int64_t d = 0; d < S.Dv; d++) {
                        dv[kj * S.Dv + d] += p[j] * do_i[d];
                        mv[kj * S.Dv + d] += p[j] * fabsl((ld)do_i[d]);
                    }
                }
            }
    free(s); free(p); free(ds); free(dsm);
}

static bool g_within(const double *g, const ld *G, const ld *M, int64_t n, ld smax,
                     double *worst_ratio) {
    bool ok = true;
    for (int64_t e = 0; e < n; e++) {
        const ld err = fabsl((ld)g[e] - G[e]), unit = (ld)EPS64 * smax * M[e];
        if (unit == 0) {
            if (err != 0 || isnan(g[e])) ok = false;
            continue;
        }
        const double ratio = (double)(err / unit);
        if (!(ratio <= TOL_G)) ok = false;
        if (worst_ratio && ratio > *worst_ratio) *worst_ratio = ratio;
    }
    return ok;
}

static void backward_case(shape s, unsigned opts, uint64_t seed, int plant) {
    fcase c;
    case_make(&c, s, opts, seed);
    const int64_t nq = s.B * s.Hq * s.Lq * s.Dk, nk = s.B * s.Hkv * s.Lk * s.Dk,
                  nv = s.B * s.Hkv * s.Lk * s.Dv, no = s.B * s.Hq * s.Lq * s.Dv,
                  rows = s.B * s.Hq * s.Lq;
    double *o = xcalloc(no, sizeof(double)), *lse = xcalloc(rows, sizeof(double));
    double *d_o = xcalloc(no, sizeof(double));
    rng_t r = {seed ^ 0x5eed};
    for (int64_t e = 0; e < no; e++) d_o[e] = rng_normal(&r);
    attn_tensor to = attn_tensor_4d(o, ATTN_F64, s.B, s.Hq, s.Lq, s.Dv);
    attn_tensor tl = attn_tensor_4d(lse, ATTN_F64, s.B, s.Hq, s.Lq, 1);
    attn_tensor tdo = attn_tensor_4d(d_o, ATTN_F64, s.B, s.Hq, s.Lq, s.Dv);
    attn_options fo = c.opt;
    fo.lse = &tl;
    attn_status st = attn_forward(&c.tq, &c.tk, &c.tv, &to, &fo);
    CHECK(st == ATTN_OK, "backward case forward: %s", attn_last_error());

    double *dq = xcalloc(nq, sizeof(double)), *dk = xcalloc(nk, sizeof(double)),
           *dv = xcalloc(nv, sizeof(double));
    attn_tensor tdq = attn_tensor_4d(dq, ATTN_F64, s.B, s.Hq, s.Lq, s.Dk);
    attn_tensor tdk = attn_tensor_4d(dk, ATTN_F64, s.B, s.Hkv, s.Lk, s.Dk);
    attn_tensor tdv = attn_tensor_4d(dv, ATTN_F64, s.B, s.Hkv, s.Lk, s.Dv);
    st = attn_backward(&c.tq, &c.tk, &c.tv, &to, &tdo, &tl, &tdq, &tdk, &tdv, &c.opt);
    CHECK(st == ATTN_OK, "float64 backward, opts %#x: %s", opts, attn_last_error());

    ld *Gq = xcalloc(nq, sizeof(ld)), *Gk = xcalloc(nk, sizeof(ld)), *Gv = xcalloc(nv, sizeof(ld));
    ld *Mq = xcalloc(nq, sizeof(ld)), *Mk = xcalloc(nk, sizeof(ld)), *Mv = xcalloc(nv, sizeof(ld));
    ld smax;
    oracle_backward(&c, d_o, Gq, Gk, Gv, Mq, Mk, Mv, &smax);
    if (plant) {  // 7: a planted error of 1e-12 relative in one gradient element
        int64_t e = 0;
        while (e < nk - 1 && Mk[e] == 0) e++;
        dk[e] += 1e-12 * (double)Mk[e] + 1e-300;
        CHECK(!g_within(dk, Gk, Mk, nk, smax, NULL), "planted: dk error of 1e-12 not caught");
    } else {
        CHECK(g_within(dq, Gq, Mq, nq, smax, &g_worst.g), "dq vs long double, opts %#x", opts);
        CHECK(g_within(dk, Gk, Mk, nk, smax, &g_worst.g), "dk vs long double, opts %#x", opts);
        CHECK(g_within(dv, Gv, Mv, nv, smax, &g_worst.g), "dv vs long double, opts %#x", opts);
        /* the float32 LSE is accepted too, and gives the same gradients (not read) */
        float *l32 = xcalloc(rows, sizeof(float));
        for (int64_t e = 0; e < rows; e++) l32[e] = (float)lse[e];
        attn_tensor tl32 = attn_tensor_4d(l32, ATTN_F32, s.B, s.Hq, s.Lq, 1);
        double *dq2 = xcalloc(nq, sizeof(double));
        attn_tensor tdq2 = attn_tensor_4d(dq2, ATTN_F64, s.B, s.Hq, s.Lq, s.Dk);
        attn_options ot = c.opt;
        ot.threads = 3;
        st = attn_backward(&c.tq, &c.tk, &c.tv, &to, &tdo, &tl32, &tdq2, &tdk, &tdv, &ot);
        CHECK(st == ATTN_OK && !memcmp(dq2, dq, (size_t)nq * sizeof(double)),
              "backward with float32 LSE and 3 threads differs: %s", attn_last_error());
        free(l32);
        free(dq2);
    }
    free(o); free(lse); free(d_o); free(dq); free(dk); free(dv);
    free(Gq); free(Gk); free(Gv); free(Mq); free(Mk); free(Mv);
    case_free(&c);
}

/* ---- 5: NaN in masked rows, fully masked rows, memory ---------------------------------- */

static void nan_and_masked(void) {
    const int64_t Lq = 20, Lk = 150, D = 8, kvl = 70;
    const int64_t cap = 200;  // a cache of cap rows, the view shows Lk of them
    double *q = xcalloc(Lq * D, sizeof(double)), *k = xcalloc(cap * D, sizeof(double)),
           *v = xcalloc(cap * D, sizeof(double)), *o = xcalloc(Lq * D, sizeof(double));
    rng_t r = {77};
    for (int64_t e = 0; e < Lq * D; e++) q[e] = rng_normal(&r);
    for (int64_t e = 0; e < cap * D; e++) {
        k[e] = e / D < kvl ? rng_normal(&r) : NAN;
        v[e] = e / D < kvl ? rng_normal(&r) : NAN;
    }
    attn_tensor tq = attn_tensor_4d(q, ATTN_F64, 1, 1, Lq, D);
    attn_tensor tk = {k, ATTN_F64, {1, 1, Lk, D}, {cap * D, cap * D, D, 1}};
    attn_tensor tv = {v, ATTN_F64, {1, 1, Lk, D}, {cap * D, cap * D, D, 1}};
    attn_tensor to = attn_tensor_4d(o, ATTN_F64, 1, 1, Lq, D);
    int64_t len = kvl;
    attn_tensor tl = attn_tensor_4d(&len, ATTN_I64, 1, 1, 1, 1);
    attn_options opt = {.kv_len = &tl};
    CHECK(attn_forward(&tq, &tk, &tv, &to, &opt) == ATTN_OK, "kv_len over NaN rows: %s",
          attn_last_error());
    int nan = 0;
    for (int64_t e = 0; e < Lq * D; e++) nan += isnan(o[e]);
    CHECK(nan == 0, "NaN beyond kv_len reached O (%d elements)", nan);

    /* fully masked rows: a window that holds no key for the first rows (right = -1
     * unbounded, left = 0 with causal bottom-right and kv_len 0 in batch 0) */
    len = 0;
    double lse[20];
    float w[20 * 150];
    memset(w, 0x7f, sizeof w);
    for (int e = 0; e < 20; e++) lse[e] = 1.0;
    attn_tensor tlse = attn_tensor_4d(lse, ATTN_F64, 1, 1, Lq, 1);
    attn_tensor tw = attn_tensor_4d(w, ATTN_F32, 1, 1, Lq, Lk);
    opt.lse = &tlse;
    opt.weights = &tw;
    CHECK(attn_forward(&tq, &tk, &tv, &to, &opt) == ATTN_OK, "kv_len 0: %s", attn_last_error());
    int bad = 0;
    for (int64_t e = 0; e < Lq * D; e++) bad += o[e] != 0.0 || signbit(o[e]);
    for (int64_t e = 0; e < Lq; e++) bad += lse[e] != -INFINITY;
    for (int64_t e = 0; e < Lq * Lk; e++) bad += w[e] != 0.0f;
    CHECK(bad == 0, "fully masked rows: %d values not O = +0, LSE = -inf, weights 0", bad);

    /* the workspace does not depend on Lk */
    size_t a = 0, b = 0;
    attn_tensor k1 = attn_tensor_4d(NULL, ATTN_F64, 1, 1, 100, D), v1 = k1;
    attn_tensor k2 = attn_tensor_4d(NULL, ATTN_F64, 1, 1, 1000000, D), v2 = k2;
    attn_tensor q1 = attn_tensor_4d(NULL, ATTN_F64, 1, 4, 300, D);
    attn_tensor o1 = q1;
    attn_options wo = {.threads = 2};
    CHECK(attn_forward_workspace_size(&q1, &k1, &v1, &o1, &wo, &a) == ATTN_OK &&
              attn_forward_workspace_size(&q1, &k2, &v2, &o1, &wo, &b) == ATTN_OK && a == b &&
              a > 0,
          "workspace: %zu bytes at Lk = 100, %zu at Lk = 10^6", a, b);
    free(q); free(k); free(v); free(o);
}

/* ---- 6: misuse ------------------------------------------------------------------------ */

static void misuse(void) {
    double q[16], k[16], v[16], o[16];
    float f[16];
    for (int e = 0; e < 16; e++) q[e] = k[e] = v[e] = 1.0, o[e] = 42.0, f[e] = 1.0f;
    attn_tensor tq = attn_tensor_4d(q, ATTN_F64, 1, 1, 4, 4), tk = attn_tensor_4d(k, ATTN_F64, 1, 1, 4, 4);
    attn_tensor tv = attn_tensor_4d(v, ATTN_F64, 1, 1, 4, 4), to = attn_tensor_4d(o, ATTN_F64, 1, 1, 4, 4);
    attn_tensor f32 = attn_tensor_4d(f, ATTN_F32, 1, 1, 4, 4);
    CHECK(attn_forward(&tq, &tk, &tv, &f32, NULL) == ATTN_ERR_DTYPE, "float64 q, float32 o");
    CHECK(attn_forward(&f32, &tk, &tv, &to, NULL) == ATTN_ERR_DTYPE, "float32 q, float64 k/v/o");
    CHECK(attn_forward(&tq, &f32, &f32, &to, NULL) == ATTN_ERR_DTYPE, "float64 q, float32 k/v");
    CHECK(attn_forward(&tq, &tk, &f32, &to, NULL) == ATTN_ERR_DTYPE, "k float64, v float32");
    int written = 0;
    for (int e = 0; e < 16; e++) written += o[e] != 42.0;
    CHECK(written == 0, "a refused float64 call wrote o");
    CHECK(strstr(attn_last_error(), "float64") != NULL, "the detail names float64: '%s'",
          attn_last_error());
    attn_options od = {.dropout_p = 0.25f};  // the float64 path draws no dropout mask
    CHECK(attn_forward(&tq, &tk, &tv, &to, &od) == ATTN_ERR_UNSUPPORTED, "float64 with dropout");
    int32_t table[1] = {0};
    attn_tensor tbt = attn_tensor_4d(table, ATTN_I32, 1, 1, 1, 1);
    attn_options ob = {.block_table = &tbt};  // nor does it read pages
    CHECK(attn_forward(&tq, &tk, &tv, &to, &ob) == ATTN_ERR_UNSUPPORTED, "float64 over pages");
    for (int e = 0; e < 16; e++) written += o[e] != 42.0;
    CHECK(written == 0, "a float64 call with dropout wrote o");
    /* the weights are float32 only; a float64 LSE under float32 q is refused */
    double wd[16];
    attn_tensor tw = attn_tensor_4d(wd, ATTN_F64, 1, 1, 4, 4);
    attn_options opt = {.weights = &tw};
    CHECK(attn_forward(&tq, &tk, &tv, &to, &opt) == ATTN_ERR_DTYPE, "float64 weights refused");
    double l64[4];
    attn_tensor tl = attn_tensor_4d(l64, ATTN_F64, 1, 1, 4, 1);
    attn_tensor f32q = attn_tensor_4d(f, ATTN_F32, 1, 1, 4, 4);
    float fo[16];
    attn_tensor f32o = attn_tensor_4d(fo, ATTN_F32, 1, 1, 4, 4);
    attn_options ol = {.lse = &tl};
    CHECK(attn_forward(&f32q, &f32q, &f32q, &f32o, &ol) == ATTN_ERR_DTYPE,
          "float64 LSE under float32 q refused");
    /* backward: float32 gradients under float64 q */
    double d_o[16] = {0}, lse[4] = {0};
    attn_tensor tdo = attn_tensor_4d(d_o, ATTN_F64, 1, 1, 4, 4), tlse = attn_tensor_4d(lse, ATTN_F64, 1, 1, 4, 1);
    float g[3][16];
    attn_tensor tg[3];
    for (int x = 0; x < 3; x++) tg[x] = attn_tensor_4d(g[x], ATTN_F32, 1, 1, 4, 4);
    CHECK(attn_backward(&tq, &tk, &tv, &to, &tdo, &tlse, &tg[0], &tg[1], &tg[2], NULL) ==
              ATTN_ERR_DTYPE, "float32 gradients under float64 q refused");
    /* attn_merge and attn_weights_grid do not take float64 */
    attn_tensor lp = attn_tensor_4d(lse, ATTN_F64, 1, 1, 4, 1);
    CHECK(attn_merge(1, &to, &lp, &to, NULL, 1) != ATTN_OK, "attn_merge refuses float64");
    float grid[4], l32[4] = {0};
    attn_tensor tgrid = attn_tensor_4d(grid, ATTN_F32, 1, 1, 1, 1), tl32 = attn_tensor_4d(l32, ATTN_F32, 1, 1, 4, 1);
    CHECK(attn_weights_grid(&tq, &tk, &tl32, &tgrid, ATTN_REDUCE_SUM, NULL) == ATTN_ERR_DTYPE,
          "attn_weights_grid refuses float64");
    CHECK(strcmp(attn_dtype_name(ATTN_F64), "float64") == 0 && attn_dtype_size(ATTN_F64) == 8,
          "dtype name/size of ATTN_F64");
}

/* ---- 7: planted errors in the forward checks ------------------------------------------ */

static void planted_forward(void) {
    const shape s = {1, 2, 1, 33, 80, 16, 16};
    fcase c;
    case_make(&c, s, OPT_CAUSAL | OPT_BIAS, 1234);
    const int64_t rows = s.B * s.Hq * s.Lq;
    ld *O = xcalloc(rows * s.Dv, sizeof(ld)), *L = xcalloc(rows, sizeof(ld));
    ld *mag = xcalloc(rows * s.Dv, sizeof(ld)), *smax = xcalloc(rows, sizeof(ld));
    oracle_forward(&c, O, L, mag, smax, NULL);
    run_out f;
    CHECK(run_forward(&c, ATTN_PATH_AUTO, 2, &f) == ATTN_OK, "planted case: %s", attn_last_error());
    CHECK(o_within(f.o, O, mag, smax, rows, s.Dv, NULL), "planted case is clean before planting");
    CHECK(lse_within(f.lse, L, smax, rows, NULL), "planted case LSE clean before planting");
    double *clean = xcalloc(rows * s.Dv, sizeof(double));
    memcpy(clean, f.o, (size_t)(rows * s.Dv) * sizeof(double));
    /* an error of 1e-12 of the element's magnitude in one element of O (a few thousand
     * eps64, above the bound), and of 1e-13 in one LSE */
    const int64_t e = 5 * s.Dv + 3;
    f.o[e] += 1e-12 * (double)mag[e];
    CHECK(!o_within(f.o, O, mag, smax, rows, s.Dv, NULL), "planted: O error of 1e-12 not caught");
    f.lse[7] += 1e-13 * (double)smax[7];
    CHECK(!lse_within(f.lse, L, smax, rows, NULL), "planted: LSE error of 1e-13 not caught");
    /* and a planted error in the computation: the oracle drops one key (the last kept
     * key of row 5 of head 0, masked by a bias of -inf); the library's clean output on
     * the original input must then fail the check */
    int dropped = 0;
    for (int64_t j = 5; j >= 0 && !dropped; j--)
        if (c.bias[5 * s.Lk + j] != -INFINITY) {
            c.bias[5 * s.Lk + j] = -INFINITY;
            dropped = 1;
        }
    CHECK(dropped, "planted: row 5 has a key to drop");
    oracle_forward(&c, O, L, mag, smax, NULL);
    CHECK(!o_within(clean, O, mag, smax, rows, s.Dv, NULL), "planted: a dropped key not caught");
    free(clean);
    run_free(&f);
    free(O); free(L); free(mag); free(smax);
    case_free(&c);
}

int main(void) {
    static const shape shapes[] = {
        {1, 1, 1, 1, 1, 1, 1},      {2, 4, 2, 37, 91, 16, 24}, {1, 2, 1, 130, 200, 64, 64},
        {2, 3, 3, 16, 300, 8, 5},   {1, 4, 1, 5, 513, 32, 32}, {1, 2, 2, 70, 33, 16, 16},
        {3, 2, 1, 17, 65, 0, 4},
    };
    static const unsigned opts[] = {
        0, OPT_SCALE, OPT_SOFTCAP, OPT_CAUSAL, OPT_CAUSAL | OPT_BR, OPT_WINDOW | OPT_BR,
        OPT_WINDOW, OPT_MASK, OPT_MASK_KEYS, OPT_BIAS, OPT_KVLEN, OPT_KVLEN | OPT_CAUSAL | OPT_BR,
        OPT_ALIBI | OPT_CAUSAL,
        OPT_SCALE | OPT_SOFTCAP | OPT_CAUSAL | OPT_BR | OPT_WINDOW | OPT_MASK | OPT_BIAS |
            OPT_KVLEN | OPT_ALIBI,
        OPT_SINKS, OPT_SINKS | OPT_CAUSAL | OPT_KVLEN | OPT_MASK,
    };
    const int ns = (int)(sizeof shapes / sizeof *shapes), no = (int)(sizeof opts / sizeof *opts);
    for (int a = 0; a < ns; a++)
        for (int b = 0; b < no; b++) {
            if ((opts[b] & OPT_KVLEN) && shapes[a].B < 2) continue;  // kv_len[1] = 0 needs B >= 2
            forward_case(shapes[a], opts[b], 1000u + 37u * (unsigned)a + (unsigned)b);
        }
    printf("forward: worst |o - o_ld| / (eps64 (1 + max|s|) sum p|v|) = %.3g (bound %g), "
           "LSE %.3g (bound %g)\n", g_worst.o, TOL_O, g_worst.lse, TOL_LSE);

    static const shape bshapes[] = {
        {2, 4, 2, 19, 41, 8, 12}, {1, 2, 1, 40, 23, 16, 16}, {2, 2, 2, 7, 90, 4, 6},
    };
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < no; b++) {
            if ((opts[b] & OPT_KVLEN) && bshapes[a].B < 2) continue;
            backward_case(bshapes[a], opts[b], 5000u + 41u * (unsigned)a + (unsigned)b, 0);
        }
    backward_case(bshapes[0], OPT_CAUSAL, 99, 1);
    printf("backward: worst |g - g_ld| / (eps64 (1 + max|s|) |g|_mag) = %.3g (bound %g)\n",
           g_worst.g, TOL_G);

    nan_and_masked();
    misuse();
    planted_forward();
    return check_summary("test_f64");
}
