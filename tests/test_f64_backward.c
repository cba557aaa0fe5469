/*
 * test_f64_backward.c — the fused float64 backward (src/backward/backward_f64.c, CONTRACT.md
 *                       "float64", Backward) against the float64 reference backward, its
 *                       own finite differences, and its promises. (tests/test_f64.c holds
 *                       the same path to an independent long double backward.)
 *
 * What it covers:
 *  1. Fused (ATTN_PATH_AUTO) against ATTN_PATH_REFERENCE on float64: dq, dk, dv per
 *     tensor within TOL_REF * eps64 * (1 + max|s|) * max|g_ref|, and d_sinks (float32)
 *     within 2 FLT_EPSILON of the larger (both are a float64 sum rounded once), over
 *     shapes that cross the 16 x 64 tiles (GQA, Lq > Lk, Dk != Dv, Dk = 0) and every
 *     option the float64 call takes: scale
 *     (negative), softcap, causal under both alignments, a window, a bool mask (full and
 *     [B, 1, 1, Lk]), a float32 bias with -inf, kv_len (0 included), ALiBi, sinks with
 *     d_sinks, strided gradient outputs.
 *  2. Central finite differences of the float64 forward (L = Σ dO ∘ O, step 1e-5) for
 *     every element of dq, dk, dv on a small case with all options: relative Frobenius
 *     error below FD_TOL.
 *  3. Bit-identical dq, dk, dv, d_sinks for 1, 2 and 3 threads.
 *  4. NaN where nothing may read it: K, V rows past kv_len or masked for every row, dO of
 *     fully masked rows, a NaN bias where the bool mask masks; the masks the issue calls
 *     adversarial: key padding except one entry, causal except one entry; NaN in K, V,
 *     Q and dO inside the computed tiles where the mask keeps it out; a mask that
 *     says what kv_len or causal says gives their bits (the mask summary's skipped and
 *     narrowed tiles are exactly the structure's).
 *  5. Workspace independent of Lk; dropout refused (ATTN_ERR_UNSUPPORTED).
 *  6. Each tolerance check rejects a planted error.
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

#define EPS64 DBL_EPSILON
#define TOL_REF 32.0  // fused vs reference, units of eps64 (1 + max|s|) max|g|
#define FD_TOL 1e-7   // finite differences, relative Frobenius

typedef struct shape {
    int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
} shape;

enum {
    O_SCALE = 1 << 0, O_SOFTCAP = 1 << 1, O_CAUSAL = 1 << 2, O_BR = 1 << 3, O_WINDOW = 1 << 4,
    O_MASK = 1 << 5, O_MASK_KEYS = 1 << 6, O_BIAS = 1 << 7, O_KVLEN = 1 << 8, O_ALIBI = 1 << 9,
    O_SINKS = 1 << 10, O_STRIDED = 1 << 11,
};

typedef struct bcase {
    shape s;
    unsigned opts;
    int64_t nq, nk, nv, no, rows;
    double *q, *k, *v, *o, *d_o, *lse;
    uint8_t *mask;
    float *bias, *slopes, *sinks;
    int64_t *kv_len;
    attn_tensor tq, tk, tv, to, tdo, tl, tmask, tbias, tkvl, tslopes, tsinks;
    attn_options opt;
} bcase;

static void case_free(bcase *c) {
    free(c->q); free(c->k); free(c->v); free(c->o); free(c->d_o); free(c->lse);
    free(c->mask); free(c->bias); free(c->slopes); free(c->sinks); free(c->kv_len);
}

/* Random q, k, v, dO and the options; then O and its float64 LSE by the fused forward. */
static void case_make(bcase *c, shape s, unsigned opts, uint64_t seed) {
    memset(c, 0, sizeof *c);
    c->s = s;
    c->opts = opts;
    rng_t r = {seed};
    c->nq = s.B * s.Hq * s.Lq * s.Dk, c->nk = s.B * s.Hkv * s.Lk * s.Dk;
    c->nv = s.B * s.Hkv * s.Lk * s.Dv, c->no = s.B * s.Hq * s.Lq * s.Dv;
    c->rows = s.B * s.Hq * s.Lq;
    const int64_t ns = c->rows * s.Lk;
    c->q = xcalloc(c->nq + 1, sizeof(double));
    c->k = xcalloc(c->nk + 1, sizeof(double));
    c->v = xcalloc(c->nv + 1, sizeof(double));
    c->o = xcalloc(c->no + 1, sizeof(double));
    c->d_o = xcalloc(c->no + 1, sizeof(double));
    c->lse = xcalloc(c->rows + 1, sizeof(double));
    for (int64_t e = 0; e < c->nq; e++) c->q[e] = 1.2 * rng_normal(&r);
    for (int64_t e = 0; e < c->nk; e++) c->k[e] = 1.2 * rng_normal(&r);
    for (int64_t e = 0; e < c->nv; e++) c->v[e] = rng_normal(&r);
    for (int64_t e = 0; e < c->no; e++) c->d_o[e] = rng_normal(&r);
    c->tq = attn_tensor_4d(c->q, ATTN_F64, s.B, s.Hq, s.Lq, s.Dk);
    c->tk = attn_tensor_4d(c->k, ATTN_F64, s.B, s.Hkv, s.Lk, s.Dk);
    c->tv = attn_tensor_4d(c->v, ATTN_F64, s.B, s.Hkv, s.Lk, s.Dv);
    c->to = attn_tensor_4d(c->o, ATTN_F64, s.B, s.Hq, s.Lq, s.Dv);
    c->tdo = attn_tensor_4d(c->d_o, ATTN_F64, s.B, s.Hq, s.Lq, s.Dv);
    c->tl = attn_tensor_4d(c->lse, ATTN_F64, s.B, s.Hq, s.Lq, 1);
    attn_options o = {0};
    if (opts & O_SCALE) o.has_scale = true, o.scale_f64 = -0.31;
    if (opts & O_SOFTCAP) o.softcap = 4.0f;
    o.causal = (opts & O_CAUSAL) != 0;
    o.align = (opts & O_BR) ? ATTN_ALIGN_BOTTOM_RIGHT : ATTN_ALIGN_TOP_LEFT;
    if (opts & O_WINDOW) o.has_window = true, o.window_left = 9, o.window_right = 70;
    if (opts & (O_MASK | O_MASK_KEYS)) {
        const bool keys = opts & O_MASK_KEYS;
        const int64_t n = keys ? s.B * s.Lk : ns;
        c->mask = xcalloc(n + 1, 1);
        for (int64_t e = 0; e < n; e++) c->mask[e] = rng_unif(&r) < 0.7;
        c->tmask = keys ? (attn_tensor){c->mask, ATTN_BOOL, {s.B, 1, 1, s.Lk}, {s.Lk, 0, 0, 1}}
                        : attn_tensor_4d(c->mask, ATTN_BOOL, s.B, s.Hq, s.Lq, s.Lk);
        o.mask = &c->tmask;
    }
    if (opts & O_BIAS) {
        c->bias = xcalloc(ns + 1, sizeof(float));
        for (int64_t e = 0; e < ns; e++)
            c->bias[e] = rng_unif(&r) < 0.1 ? -INFINITY : (float)(0.5 * rng_normal(&r));
        c->tbias = attn_tensor_4d(c->bias, ATTN_F32, s.B, s.Hq, s.Lq, s.Lk);
        o.bias = &c->tbias;
    }
    if (opts & O_KVLEN) {
        c->kv_len = xcalloc(s.B, sizeof(int64_t));
        for (int64_t b = 0; b < s.B; b++) c->kv_len[b] = b == 1 ? 0 : s.Lk - 3 * b - 1;
        c->tkvl = (attn_tensor){c->kv_len, ATTN_I64, {s.B, 1, 1, 1}, {1, 1, 1, 1}};
        o.kv_len = &c->tkvl;
    }
    if (opts & O_ALIBI) {
        c->slopes = xcalloc(s.Hq, sizeof(float));
        for (int64_t h = 0; h < s.Hq; h++) c->slopes[h] = 0.05f * (float)(h + 1);
        c->tslopes = attn_tensor_4d(c->slopes, ATTN_F32, s.Hq, 1, 1, 1);
        o.alibi_slopes = &c->tslopes;
    }
    if (opts & O_SINKS) {
        c->sinks = xcalloc(s.Hq, sizeof(float));
        for (int64_t h = 0; h < s.Hq; h++)
            c->sinks[h] = h == s.Hq - 1 ? -INFINITY : (float)(0.5 * rng_normal(&r));
        c->tsinks = attn_tensor_4d(c->sinks, ATTN_F32, s.Hq, 1, 1, 1);
        o.sinks = &c->tsinks;
    }
    c->opt = o;
    attn_options fo = o;
    fo.lse = &c->tl;
    const attn_status st = attn_forward(&c->tq, &c->tk, &c->tv, &c->to, &fo);
    CHECK(st == ATTN_OK, "forward, opts %#x: %s", opts, attn_last_error());
}

/* The gradients of one backward call. */
typedef struct grads {
    double *dq, *dk, *dv;
    float ds[16];
    attn_status st;
} grads;

static void grads_free(grads *g) { free(g->dq); free(g->dk); free(g->dv); }

/* attn_backward on c's tensors with the path and thread count given; with O_STRIDED the
 * gradients are written through views with the last two axes swapped */
static grads run_bwd(const bcase *c, attn_path path, int threads) {
    const shape s = c->s;
    grads g = {xcalloc(c->nq + 1, sizeof(double)), xcalloc(c->nk + 1, sizeof(double)),
               xcalloc(c->nv + 1, sizeof(double)), {0}, ATTN_OK};
    double *bq = xcalloc(c->nq + 1, sizeof(double)), *bk = xcalloc(c->nk + 1, sizeof(double)),
           *bv = xcalloc(c->nv + 1, sizeof(double));
    for (int64_t e = 0; e < c->nq; e++) bq[e] = 777.0;  // every element must be written
    for (int64_t e = 0; e < c->nk; e++) bk[e] = 777.0;
    for (int64_t e = 0; e < c->nv; e++) bv[e] = 777.0;
    attn_tensor tdq = attn_tensor_4d(bq, ATTN_F64, s.B, s.Hq, s.Lq, s.Dk);
    attn_tensor tdk = attn_tensor_4d(bk, ATTN_F64, s.B, s.Hkv, s.Lk, s.Dk);
    attn_tensor tdv = attn_tensor_4d(bv, ATTN_F64, s.B, s.Hkv, s.Lk, s.Dv);
    const bool strided = c->opts & O_STRIDED;
    if (strided) {  // element (b, h, i, d) at b*H*L*D + h*L*D + d*L + i
        tdq.stride[2] = 1, tdq.stride[3] = s.Lq;
        tdk.stride[2] = 1, tdk.stride[3] = s.Lk;
        tdv.stride[2] = 1, tdv.stride[3] = s.Lk;
    }
    attn_tensor tds = attn_tensor_4d(g.ds, ATTN_F32, s.Hq, 1, 1, 1);
    attn_options o = c->opt;
    o.path = path;
    o.threads = threads;
    if (c->sinks) o.d_sinks = &tds;
    g.st = attn_backward(&c->tq, &c->tk, &c->tv, &c->to, &c->tdo, &c->tl, &tdq, &tdk, &tdv, &o);
    /* back to dense C order */
    const int64_t L[3] = {s.Lq, s.Lk, s.Lk}, D[3] = {s.Dk, s.Dk, s.Dv};
    const int64_t H[3] = {s.Hq, s.Hkv, s.Hkv};
    double *src[3] = {bq, bk, bv}, *dst[3] = {g.dq, g.dk, g.dv};
    for (int x = 0; x < 3; x++)
        for (int64_t bh = 0; bh < s.B * H[x]; bh++)
            for (int64_t i = 0; i < L[x]; i++)
                for (int64_t d = 0; d < D[x]; d++)
                    dst[x][(bh * L[x] + i) * D[x] + d] =
                        src[x][bh * L[x] * D[x] + (strided ? d * L[x] + i : i * D[x] + d)];
    free(bq); free(bk); free(bv);
    return g;
}

/* 1 + max |s| over the call's logits (raw scale q · k: an upper bound of the final ones
 * up to bias and ALiBi, which the test keeps small) */
static double smax_of(const bcase *c) {
    const shape s = c->s;
    const double scale = (c->opts & O_SCALE) ? 0.31 : 1.0 / sqrt((double)(s.Dk ? s.Dk : 1));
    double m = 0;
    for (int64_t b = 0; b < s.B; b++)
        for (int64_t h = 0; h < s.Hq; h++)
            for (int64_t i = 0; i < s.Lq; i++)
                for (int64_t j = 0; j < s.Lk; j++) {
                    const int64_t g = h / (s.Hq / s.Hkv);
                    double dot = 0;
                    for (int64_t d = 0; d < s.Dk; d++)
                        dot += c->q[((b * s.Hq + h) * s.Lq + i) * s.Dk + d] *
                               c->k[((b * s.Hkv + g) * s.Lk + j) * s.Dk + d];
                    if (fabs(scale * dot) > m) m = fabs(scale * dot);
                }
    return 1 + m + 8;  // + the bias and ALiBi terms (|bias| < ~2, ALiBi < 0.05 h Lk)
}

/* |got - ref| <= tol eps64 smax max|ref| elementwise; NaN or a left-over 777 fails */
static bool within(const double *got, const double *ref, int64_t n, double smax, double tol,
                   double *worst) {
    double mx = 0;
    for (int64_t e = 0; e < n; e++) mx = fabs(ref[e]) > mx ? fabs(ref[e]) : mx;
    const double unit = EPS64 * smax * (mx > 0 ? mx : 1);
    bool ok = true;
    for (int64_t e = 0; e < n; e++) {
        const double err = fabs(got[e] - ref[e]);
        if (!(err <= tol * unit)) ok = false;
        if (worst && err / unit > *worst) *worst = err / unit;
    }
    return ok;
}

static bool sinks_within(const float *got, const float *ref, int64_t n) {
    for (int64_t h = 0; h < n; h++) {
        const double a = fabs((double)ref[h]) > fabs((double)got[h]) ? fabs((double)ref[h]) : fabs((double)got[h]);
        if (!(fabs((double)got[h] - (double)ref[h]) <= 2 * FLT_EPSILON * a + 1e-30)) return false;
    }
    return true;
}

static double g_worst;

/* ---- 1 and 3: against the reference path, thread counts ------------------------------ */

static void against_reference(shape s, unsigned opts, uint64_t seed) {
    bcase c;
    case_make(&c, s, opts, seed);
    grads f = run_bwd(&c, ATTN_PATH_AUTO, 2), r = run_bwd(&c, ATTN_PATH_REFERENCE, 1);
    CHECK(f.st == ATTN_OK && r.st == ATTN_OK, "backward, opts %#x: %s", opts, attn_last_error());
    const double smax = smax_of(&c);
    CHECK(within(f.dq, r.dq, c.nq, smax, TOL_REF, &g_worst), "dq vs reference, opts %#x", opts);
    CHECK(within(f.dk, r.dk, c.nk, smax, TOL_REF, &g_worst), "dk vs reference, opts %#x", opts);
    CHECK(within(f.dv, r.dv, c.nv, smax, TOL_REF, &g_worst), "dv vs reference, opts %#x", opts);
    if (c.sinks) CHECK(sinks_within(f.ds, r.ds, s.Hq), "d_sinks vs reference, opts %#x", opts);
    for (int t = 1; t <= 3; t += 2) {
        grads u = run_bwd(&c, ATTN_PATH_AUTO, t);
        CHECK(u.st == ATTN_OK, "threads %d", t);
        CHECK(!memcmp(u.dq, f.dq, (size_t)c.nq * 8) && !memcmp(u.dk, f.dk, (size_t)c.nk * 8) &&
                  !memcmp(u.dv, f.dv, (size_t)c.nv * 8) && !memcmp(u.ds, f.ds, sizeof u.ds),
              "threads %d vs 2 not bit-identical, opts %#x", t, opts);
        grads_free(&u);
    }
    grads_free(&f); grads_free(&r);
    case_free(&c);
}

/* ---- 2: finite differences ----------------------------------------------------------- */

static double loss(bcase *c) {
    attn_options o = c->opt;
    CHECK(attn_forward(&c->tq, &c->tk, &c->tv, &c->to, &o) == ATTN_OK, "fd forward");
    double l = 0;
    for (int64_t e = 0; e < c->no; e++) l += c->d_o[e] * c->o[e];
    return l;
}

static double rel_frob(const double *got, const double *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t e = 0; e < n; e++) num += (got[e] - ref[e]) * (got[e] - ref[e]), den += ref[e] * ref[e];
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void finite_differences(unsigned opts, int plant) {
    const shape s = {2, 2, 1, 5, 7, 3, 2};
    bcase c;
    case_make(&c, s, opts, 4242 + opts);
    grads g = run_bwd(&c, ATTN_PATH_AUTO, 2);
    CHECK(g.st == ATTN_OK, "fd backward: %s", attn_last_error());
    double *x[3] = {c.q, c.k, c.v}, *an[3] = {g.dq, g.dk, g.dv};
    const int64_t n[3] = {c.nq, c.nk, c.nv};
    const double h = 1e-5;
    for (int t = 0; t < 3; t++) {
        double *fd = xcalloc(n[t] + 1, sizeof(double));
        for (int64_t e = 0; e < n[t]; e++) {
            const double x0 = x[t][e];
            x[t][e] = x0 + h;
            const double lp = loss(&c);
            x[t][e] = x0 - h;
            const double lm = loss(&c);
            x[t][e] = x0;
            fd[e] = (lp - lm) / (2 * h);
        }
        if (plant && t == 1) an[t][n[t] / 2] += 1e-6 * (1 + fabs(an[t][n[t] / 2]));
        const double err = rel_frob(an[t], fd, n[t]);
        if (plant && t == 1)
            CHECK(!(err < FD_TOL), "planted: a 1e-6 error in dk passed the finite differences");
        else
            CHECK(err < FD_TOL, "finite differences, tensor %d, opts %#x: %.3g", t, opts, err);
        if (!plant) printf("finite differences opts %#x tensor %d: rel err %.2g\n", opts, t, err);
        free(fd);
    }
    grads_free(&g);
    case_free(&c);
}

/* ---- 4: NaN nothing may read; adversarial masks -------------------------------------- */

static bool all_finite(const double *x, int64_t n) {
    for (int64_t e = 0; e < n; e++)
        if (!isfinite(x[e])) return false;
    return true;
}

/* f's gradients finite (no NaN of a masked key or row reached them) and within TOL_REF
 * of the reference's r */
static void check_vs_reference(const grads *f, const grads *r, int64_t nq, int64_t nk, int64_t nv,
                               double smax, const char *what) {
    CHECK(all_finite(f->dq, nq) && all_finite(f->dk, nk) && all_finite(f->dv, nv),
          "%s: NaN reached a gradient", what);
    CHECK(within(f->dq, r->dq, nq, smax, TOL_REF, &g_worst) &&
              within(f->dk, r->dk, nk, smax, TOL_REF, &g_worst) &&
              within(f->dv, r->dv, nv, smax, TOL_REF, &g_worst),
          "%s vs reference", what);
}

/* the same case with NaN planted where the call must not read, against the clean one */
static void nan_unread(void) {
    const shape s = {2, 2, 1, 20, 70, 5, 6};
    bcase c;
    case_make(&c, s, O_KVLEN | O_MASK | O_CAUSAL | O_BR, 77);
    grads clean = run_bwd(&c, ATTN_PATH_AUTO, 2);
    /* batch 0: keys >= kv_len[0] = Lk - 1; batch 1: kv_len 0, every row fully masked */
    for (int64_t j = c.kv_len[0]; j < s.Lk; j++)
        for (int64_t d = 0; d < s.Dk; d++) c.k[j * s.Dk + d] = NAN;
    for (int64_t j = c.kv_len[0]; j < s.Lk; j++)
        for (int64_t d = 0; d < s.Dv; d++) c.v[j * s.Dv + d] = NAN;
    for (int64_t e = s.Hq * s.Lq * s.Dv; e < c.no; e++) c.d_o[e] = NAN;  // batch 1's dO
    grads g = run_bwd(&c, ATTN_PATH_AUTO, 2);
    CHECK(g.st == ATTN_OK, "nan_unread: %s", attn_last_error());
    CHECK(!memcmp(g.dq, clean.dq, (size_t)c.nq * 8), "NaN in unread K/V/dO changed dq");
    /* dk, dv of keys nobody reads are 0, the rest as clean */
    for (int64_t e = 0; e < c.nk; e++)
        CHECK(g.dk[e] == clean.dk[e] || (isnan(g.dk[e]) == 0 && e >= c.kv_len[0] * s.Dk && g.dk[e] == 0),
              "dk[%lld] changed by unread NaN", (long long)e);
    CHECK(all_finite(g.dk, c.nk) && all_finite(g.dv, c.nv), "unread NaN reached dk or dv");
    for (int64_t e = s.Hq * s.Lq * s.Dk; e < c.nq; e++)
        CHECK(g.dq[e] == 0.0, "a fully masked row's dq is not 0");
    for (int64_t e = s.Hkv * s.Lk * s.Dk; e < c.nk; e++)
        CHECK(g.dk[e] == 0.0, "dk of batch 1 (kv_len 0) is not 0");
    grads_free(&g); grads_free(&clean);
    case_free(&c);
}

/* key padding except one entry, causal except one entry, a NaN bias where the bool mask
 * masks: fused against reference, NaN-free */
static void adversarial_masks(void) {
    const shape s = {1, 2, 2, 40, 150, 8, 8};
    for (int kind = 0; kind < 3; kind++) {
        bcase c;
        case_make(&c, s, O_MASK | (kind == 2 ? O_BIAS : 0), 900 + (uint64_t)kind);
        for (int64_t h = 0; h < s.Hq; h++)
            for (int64_t i = 0; i < s.Lq; i++)
                for (int64_t j = 0; j < s.Lk; j++) {
                    uint8_t *m = &c.mask[(h * s.Lq + i) * s.Lk + j];
                    if (kind == 0) *m = j < 100 || (h == 1 && i == 33 && j == 149);
                    if (kind == 1) *m = j <= i || (h == 0 && i == 3 && j == 140);
                    if (kind == 2 && !*m) c.bias[(h * s.Lq + i) * s.Lk + j] = NAN;
                }
        attn_options fo = c.opt;
        fo.lse = &c.tl;
        CHECK(attn_forward(&c.tq, &c.tk, &c.tv, &c.to, &fo) == ATTN_OK, "adv forward");
        if (kind != 2)  // masked keys' V unread: poison those no row reads
            for (int64_t j = 100; j < s.Lk; j++)
                if (j != 149 && j != 140 && (kind == 0 || j >= s.Lq))
                    for (int64_t d = 0; d < s.Dv; d++) c.v[j * s.Dv + d] = c.v[(s.Lk + j) * s.Dv + d] = NAN;
        grads f = run_bwd(&c, ATTN_PATH_AUTO, 3), r = run_bwd(&c, ATTN_PATH_REFERENCE, 1);
        CHECK(f.st == ATTN_OK && r.st == ATTN_OK, "adversarial %d: %s", kind, attn_last_error());
        const double smax = smax_of(&c);
        char what[64];
        snprintf(what, sizeof what, "adversarial mask %d", kind);
        check_vs_reference(&f, &r, c.nq, c.nk, c.nv, smax, what);
        grads_free(&f); grads_free(&r);
        case_free(&c);
    }
}

/* NaN inside the tiles the backward computes, where nothing may multiply it: K and V rows
 * of keys every row masks but that share a tile with kept keys, and Q and dO of a row the
 * mask masks whole among rows it keeps. Through 1 thread (one item per (b, g) head) and
 * 2 (the row and key sweeps), against the reference, NaN-free, O = 0 for the row. */
static void nan_in_tiles(void) {
    const shape s = {1, 2, 1, 40, 150, 8, 8};
    bcase c;
    case_make(&c, s, O_MASK, 606);
    for (int64_t h = 0; h < s.Hq; h++)
        for (int64_t i = 0; i < s.Lq; i++)
            for (int64_t j = 0; j < s.Lk; j++)
                c.mask[(h * s.Lq + i) * s.Lk + j] =
                    !(h == 0 && i == 5) && (j < 100 || (h == 1 && i == 33 && j == 149));
    for (int64_t j = 100; j < 149; j++)
        for (int64_t d = 0; d < s.Dk; d++) c.k[j * s.Dk + d] = c.v[j * s.Dv + d] = NAN;
    for (int64_t d = 0; d < s.Dk; d++) c.q[5 * s.Dk + d] = c.d_o[5 * s.Dv + d] = NAN;
    attn_options fo = c.opt;
    fo.lse = &c.tl;
    CHECK(attn_forward(&c.tq, &c.tk, &c.tv, &c.to, &fo) == ATTN_OK, "nan_in_tiles forward");
    CHECK(c.lse[5] == -INFINITY && c.o[5 * s.Dv] == 0.0 && all_finite(c.o, c.no),
          "nan_in_tiles: the masked row's O is not 0, or NaN reached O");
    grads r = run_bwd(&c, ATTN_PATH_REFERENCE, 1);
    const double smax = smax_of(&c);
    for (int t = 1; t <= 2; t++) {
        grads f = run_bwd(&c, ATTN_PATH_AUTO, t);
        CHECK(f.st == ATTN_OK && r.st == ATTN_OK, "nan_in_tiles %d: %s", t, attn_last_error());
        char what[64];
        snprintf(what, sizeof what, "nan_in_tiles, %d threads", t);
        check_vs_reference(&f, &r, c.nq, c.nk, c.nv, smax, what);
        grads_free(&f);
    }
    grads_free(&r);
    case_free(&c);
}

/* A bool mask that says what the structure says gives the same bits as the structure:
 * key padding as a mask vs kv_len, a causal mask vs causal (the summarized mask's tiles
 * skipped or narrowed exactly where the structure's are). */
static void mask_as_structure(void) {
    const shape s = {2, 2, 1, 70, 200, 8, 8};
    for (int kind = 0; kind < 2; kind++) {
        bcase a, m;
        case_make(&a, s, kind == 0 ? O_KVLEN : O_CAUSAL, 123);
        case_make(&m, s, O_MASK, 123);  // the same q, k, v, dO (same seed, same draws first)
        for (int64_t b = 0; b < s.B; b++)
            for (int64_t h = 0; h < s.Hq; h++)
                for (int64_t i = 0; i < s.Lq; i++)
                    for (int64_t j = 0; j < s.Lk; j++)
                        m.mask[((b * s.Hq + h) * s.Lq + i) * s.Lk + j] =
                            kind == 0 ? j < a.kv_len[b] : j <= i;
        attn_options fo = m.opt;
        fo.lse = &m.tl;
        CHECK(attn_forward(&m.tq, &m.tk, &m.tv, &m.to, &fo) == ATTN_OK, "mask forward");
        CHECK(!memcmp(a.o, m.o, (size_t)a.no * 8), "mask-as-structure %d: O differs", kind);
        grads ga = run_bwd(&a, ATTN_PATH_AUTO, 2), gm = run_bwd(&m, ATTN_PATH_AUTO, 3);
        CHECK(ga.st == ATTN_OK && gm.st == ATTN_OK, "mask-as-structure %d", kind);
        CHECK(!memcmp(ga.dq, gm.dq, (size_t)a.nq * 8) && !memcmp(ga.dk, gm.dk, (size_t)a.nk * 8) &&
                  !memcmp(ga.dv, gm.dv, (size_t)a.nv * 8),
              "mask-as-structure %d: gradients differ from the structure's", kind);
        grads_free(&ga); grads_free(&gm);
        case_free(&a); case_free(&m);
    }
}

/* ---- 5: memory, refusals ------------------------------------------------------------- */

static void memory_and_refusals(void) {
    size_t w[2];
    for (int x = 0; x < 2; x++) {
        const int64_t Lk = x ? 65536 : 64;
        attn_tensor q = attn_tensor_4d(NULL, ATTN_F64, 1, 2, 32, 16);
        attn_tensor k = attn_tensor_4d(NULL, ATTN_F64, 1, 2, Lk, 16);
        attn_tensor o = attn_tensor_4d(NULL, ATTN_F64, 1, 2, 32, 16);
        attn_tensor l = attn_tensor_4d(NULL, ATTN_F64, 1, 2, 32, 1);
        attn_options opt = {.threads = 2};
        CHECK(attn_backward_workspace_size(&q, &k, &k, &o, &o, &l, &q, &k, &k, &opt, &w[x]) == ATTN_OK,
              "workspace query: %s", attn_last_error());
    }
    CHECK(w[0] == w[1], "float64 backward workspace grows with Lk: %zu vs %zu", w[0], w[1]);
    printf("workspace (Hq 2, Lq 32, D 16, 2 threads): %zu bytes at Lk 64 and 65536\n", w[0]);
    bcase c;
    case_make(&c, (shape){1, 1, 1, 4, 4, 4, 4}, 0, 5);
    c.opt.dropout_p = 0.2f;
    grads g = run_bwd(&c, ATTN_PATH_AUTO, 1);
    CHECK(g.st == ATTN_ERR_UNSUPPORTED, "float64 backward with dropout: status %d", (int)g.st);
    grads_free(&g);
    case_free(&c);
}

/* ---- 6: planted errors ---------------------------------------------------------------- */

static void planted(void) {
    bcase c;
    case_make(&c, (shape){1, 2, 1, 33, 80, 8, 8}, O_CAUSAL | O_SINKS, 31);
    grads f = run_bwd(&c, ATTN_PATH_AUTO, 2), r = run_bwd(&c, ATTN_PATH_REFERENCE, 1);
    const double smax = smax_of(&c);
    f.dk[17] += 1e-12 * (1 + fabs(f.dk[17]));
    CHECK(!within(f.dk, r.dk, c.nk, smax, TOL_REF, NULL), "planted: dk error of 1e-12 passed");
    f.ds[0] = nextafterf(nextafterf(nextafterf(nextafterf(nextafterf(r.ds[0], INFINITY),
                         INFINITY), INFINITY), INFINITY), INFINITY);
    CHECK(!sinks_within(f.ds, r.ds, 1), "planted: d_sinks off by 5 ulps passed");
    grads_free(&f); grads_free(&r);
    case_free(&c);
    finite_differences(O_CAUSAL, 1);
}

int main(void) {
    static const shape shapes[] = {
        {2, 4, 2, 19, 41, 8, 12}, {1, 2, 1, 40, 150, 16, 16}, {2, 2, 2, 70, 23, 4, 6},
        {2, 3, 3, 17, 65, 0, 5},
    };
    static const unsigned opts[] = {
        0, O_SCALE, O_SOFTCAP, O_CAUSAL, O_CAUSAL | O_BR, O_WINDOW, O_WINDOW | O_CAUSAL | O_BR,
        O_MASK, O_MASK_KEYS, O_BIAS, O_KVLEN, O_ALIBI, O_SINKS, O_STRIDED | O_CAUSAL,
        O_SCALE | O_SOFTCAP | O_CAUSAL | O_BR | O_WINDOW | O_MASK | O_BIAS | O_KVLEN | O_ALIBI |
            O_SINKS | O_STRIDED,
    };
    const int ns = (int)(sizeof shapes / sizeof *shapes), no = (int)(sizeof opts / sizeof *opts);
    for (int a = 0; a < ns; a++)
        for (int b = 0; b < no; b++) {
            if ((opts[b] & O_KVLEN) && shapes[a].B < 2) continue;
            against_reference(shapes[a], opts[b], 7000u + 31u * (unsigned)a + (unsigned)b);
        }
    printf("fused vs reference: worst |g - g_ref| / (eps64 smax max|g_ref|) = %.3g (bound %g)\n",
           g_worst, TOL_REF);
    finite_differences(0, 0);
    finite_differences(O_SOFTCAP | O_CAUSAL | O_BR | O_MASK | O_BIAS | O_KVLEN | O_ALIBI | O_SINKS, 0);
    nan_unread();
    adversarial_masks();
    nan_in_tiles();
    mask_as_structure();
    memory_and_refusals();
    planted();
    return check_summary("test_f64_backward");
}
