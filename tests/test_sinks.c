/*
 * test_sinks.c — attention sinks (attn_options.sinks and d_sinks), forward and backward.
 *
 * The oracle here is the test's own, in float64 on dense arrays: each row's softmax runs
 * over its kept logits with the head's sink appended as one more logit whose value row
 * is zero (nothing of the library's reference, nor of the library's folding formula).
 * What it covers:
 *  1. The forward on both paths (fused: the kernel ATTN_ISA chooses, check.sh runs every
 *     one this CPU has; reference), with GQA, causal under both alignments, kv_len (0
 *     included), a bool mask with fully false rows, a -inf bias, LSE and weights outputs,
 *     the [B, L, H, D] layout, sinks of -inf / 0 / large, the split-KV decoding shapes
 *     (Lq = 1, Lk >= 4096) and 16-bit Q, K, V and O: the contract's float32 tolerance
 *     (a 16-bit O: two half-ulps of its type).
 *  2. The promises: a fully masked row gives O = +0 exactly and LSE = sink exactly; a sink
 *     of -inf is bit for bit the call without sinks; NaN and +inf sinks make their head's
 *     rows NaN and no other; the weights sum to 1 - exp(sink - lse); attn_weights_grid
 *     from the sink LSE gives those sums.
 *  3. The backward (fused and reference, float32 and a bfloat16 call) against central
 *     finite differences of the oracle for dQ, dK, dV and d_sinks; d_sinks bit-identical
 *     for 1 and 2 threads.
 *  4. Misuse refused with its status and nothing written; the multi-head module passes
 *     the sinks to its heads (its averaged-weights path slices them per head).
 *  5. Each tolerance check rejects a planted error.
 * What it is not: a test of the rest of attn_forward (test_forward.c, test_edge.c).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "half.h"
#include "mha_ref.h"
#include "oracle.h"

/* ---- a case and its oracle ----------------------------------------------------------- */

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

static attn_tensor layout_view(void *data, attn_dtype dt, int64_t B, int64_t H, int64_t L,
                               int64_t D, bool blhd) {
    if (!blhd) return attn_tensor_4d(data, dt, B, H, L, D);
    return (attn_tensor){data, dt, {B, H, L, D}, {L * H * D, D, H * D, 1}};
}

static void put(attn_dtype dt, void *base, int64_t idx, double x, double *back) {
    attn_store(dt, base, idx, (float)x);
    *back = attn_load(dt, base, idx);
}

/* (d is filled in place: its options point into it) */
static void sk_make(sk_case c, sk_data *dp) {
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

static void sk_free(sk_data *d) {
    free(d->q), free(d->k), free(d->v), free(d->sinks), free(d->bq), free(d->bk), free(d->bv);
    free(d->fsinks), free(d->mask), free(d->bias);
}

/* The oracle: for each row, its kept logits s_j (masks as docs/CONTRACT.md), the sink
 * appended as s_n with a value row of zeros, and the softmax over all n + 1:
 *   m = max(s_0..s_n), l = Σ exp(s - m), o = Σ_j exp(s_j - m) / l · v_j (+ p_n · 0),
 *   lse = m + ln l; every logit -inf (no key, no sink): o = 0, lse = -inf, w = 0.
 *   o [B, Hq, Lq, Dv], lse [B, Hq, Lq], w [B, Hq, Lq, Lk] dense; lse and w may be NULL. */
static void sink_oracle(const sk_data *d, const double *q, const double *k, const double *v,
                        const double *sinks, double *o, double *lse, double *w) {
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
static double at(const attn_tensor *t, int64_t b, int64_t h, int64_t i, int64_t z) {
    return attn_load(t->dtype, t->data,
                     b * t->stride[0] + h * t->stride[1] + i * t->stride[2] + z * t->stride[3]);
}

/* a library output view gathered dense [d0, d1, d2, d3] into float */
static void gather(const attn_tensor *t, float *out) {
    int64_t x = 0;
    for (int64_t a = 0; a < t->shape[0]; a++)
        for (int64_t b = 0; b < t->shape[1]; b++)
            for (int64_t c = 0; c < t->shape[2]; c++)
                for (int64_t z = 0; z < t->shape[3]; z++) out[x++] = (float)at(t, a, b, c, z);
}

/* The 16-bit output's bound: |o - ref| <= eps |ref| + 1e-5 (1 + max|ref|), eps two
 * half-ulps of the type (2^-8 bfloat16, 2^-11 float16): the correctly rounded value is
 * within one half-ulp, and a float32 result a hair off the tie may round the other way. */
static int within_half(const float *got, const double *ref, int64_t n, attn_dtype dt, double *worst) {
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

/* the largest relative Frobenius errors seen (printed at the end), and the fully masked
 * rows found (the exact checks must have met some) */
static double g_worst_o, g_worst_grad[4];
static int64_t g_masked_rows;

/* ---- 1, 2: the forward ------------------------------------------------------------------ */

static const char *path_name(attn_path p) { return p == ATTN_PATH_REFERENCE ? "reference" : "fused"; }

/* One case on one path against the oracle, with the exact promises; plant adds to one
 * element of O before the comparison (0: none). Returns whether O was within tolerance. */
static int forward_case(sk_case c, attn_path path, bool want_w, double plant, const char *what) {
    sk_data d;
    sk_make(c, &d);
    float *o = xcalloc(d.no, sizeof(float)), *lse = xcalloc(d.nl, sizeof(float));
    float *w = want_w ? xcalloc(d.nl * c.Lk, sizeof(float)) : NULL;
    void *ob = xcalloc(d.no, attn_dtype_size(c.o_dt));
    attn_tensor to = layout_view(ob, c.o_dt, c.B, c.Hq, c.Lq, c.Dv, c.blhd);
    attn_tensor tl = attn_tensor_4d(lse, ATTN_F32, c.B, c.Hq, c.Lq, 1);
    attn_tensor tw = attn_tensor_4d(w, ATTN_F32, c.B, c.Hq, c.Lq, c.Lk);
    attn_options opt = d.opt;
    opt.path = path, opt.lse = &tl, opt.weights = want_w ? &tw : NULL;
    const attn_status st = attn_forward(&d.tq, &d.tk, &d.tv, &to, &opt);
    CHECK(st == ATTN_OK, "%s [%s]: status %s (%s)", what, path_name(path), attn_status_string(st),
          attn_last_error());
    gather(&to, o);
    if (d.no > 0) o[d.no / 2] += (float)plant;

    double *ro = xcalloc(d.no, sizeof(double)), *rl = xcalloc(d.nl, sizeof(double));
    double *rw = want_w ? xcalloc(d.nl * c.Lk, sizeof(double)) : NULL;
    sink_oracle(&d, d.q, d.k, d.v, d.sinks, ro, rl, rw);
    tol_result r = {0};
    double worst = 0.0;
    const int ok_o = c.o_dt == ATTN_F32 ? within_f32_tol(o, ro, d.no, &r)
                                        : within_half(o, ro, d.no, c.o_dt, &worst);
    if (plant == 0.0) {
        CHECK(ok_o, "%s [%s]: O rel %.3g max %.3g (worst/bound %.3g)", what, path_name(path),
              r.rel_err, r.max_err, worst);
        if (c.o_dt == ATTN_F32) g_worst_o = fmax(g_worst_o, r.rel_err);
        CHECK(within_f32_tol(lse, rl, d.nl, &r), "%s [%s]: LSE rel %.3g max %.3g (%d non-finite "
              "mismatches)", what, path_name(path), r.rel_err, r.max_err, r.nonfinite_mismatch);
        if (want_w)
            CHECK(within_f32_tol(w, rw, d.nl * c.Lk, &r), "%s [%s]: weights rel %.3g max %.3g",
                  what, path_name(path), r.rel_err, r.max_err);
        /* fully masked rows (no key kept): O exactly +0, LSE exactly the sink */
        int64_t masked = 0, exact = 1;
        for (int64_t row = 0; row < d.nl; row++) {
            const int64_t h = row / c.Lq % c.Hq;
            bool any = false;
            for (int64_t z = 0; z < c.Dv; z++) any |= ro[row * c.Dv + z] != 0.0;
            if (any || !(rl[row] == d.sinks[h] || (rl[row] == -INFINITY && d.sinks[h] == -INFINITY)))
                continue;  // not a fully masked row (or a row whose O happens to be 0)
            masked++;
            for (int64_t z = 0; z < c.Dv; z++) {
                const float x = o[row * c.Dv + z];
                exact &= x == 0.0f && !signbit(x);
            }
            exact &= lse[row] == d.fsinks[h] || (d.fsinks[h] == -INFINITY && lse[row] == -INFINITY);
        }
        g_masked_rows += masked;
        CHECK(exact, "%s [%s]: a fully masked row is not O = +0, LSE = sink (of %lld rows)", what,
              path_name(path), (long long)masked);
        if (want_w) {  // the weights sum to 1 - exp(sink - lse)
            double worst_sum = 0.0;
            for (int64_t row = 0; row < d.nl; row++) {
                if (lse[row] == -INFINITY) continue;
                double sum = 0.0;
                for (int64_t j = 0; j < c.Lk; j++) sum += w[row * c.Lk + j];
                const double want = 1.0 - exp((double)d.fsinks[row / c.Lq % c.Hq] - (double)lse[row]);
                worst_sum = fmax(worst_sum, fabs(sum - want));
            }
            CHECK(worst_sum <= 1e-5, "%s [%s]: weights sum off 1 - exp(sink - lse) by %.3g", what,
                  path_name(path), worst_sum);
        }
    }
    sk_free(&d);
    free(o), free(lse), free(w), free(ob), free(ro), free(rl), free(rw);
    return ok_o;
}

static void test_forward(void) {
    static const int64_t kvl[3] = {13, 0, 70};
    static const int64_t kvl_dec[2] = {4133, 2500};
    const sk_case cases[] = {
        {2, 4, 2, 37, 70, 32, 32, false, 0, NULL, 0, false, ATTN_F32, ATTN_F32, -2, 2, 1},
        {3, 4, 4, 29, 70, 16, 24, true, ATTN_ALIGN_TOP_LEFT, kvl, 0, false, ATTN_F32, ATTN_F32, -1, 3, 2},
        {3, 4, 1, 45, 70, 16, 16, true, ATTN_ALIGN_BOTTOM_RIGHT, kvl, 0, true, ATTN_F32, ATTN_F32, -1, 3, 3},
        {2, 4, 2, 19, 33, 8, 8, false, 0, NULL, 1, false, ATTN_F32, ATTN_F32, -3, 1, 4},
        {2, 4, 2, 66, 130, 64, 64, true, ATTN_ALIGN_TOP_LEFT, NULL, 2, false, ATTN_F32, ATTN_F32, 0, 4, 5},
        {1, 4, 4, 17, 40, 32, 32, false, 0, NULL, 0, false, ATTN_F32, ATTN_F32, 20, 40, 6},   // sinks dominate
        {2, 4, 2, 24, 70, 32, 32, true, ATTN_ALIGN_BOTTOM_RIGHT, NULL, 0, false, ATTN_BF16, ATTN_F32, -2, 2, 7},
        {2, 4, 2, 24, 70, 32, 32, false, 0, NULL, 1, false, ATTN_F16, ATTN_F32, -2, 2, 8},
        {2, 4, 2, 24, 70, 32, 32, false, 0, NULL, 0, false, ATTN_BF16, ATTN_BF16, -2, 2, 9},
        {2, 4, 2, 24, 70, 32, 32, false, 0, NULL, 0, false, ATTN_F16, ATTN_F16, -2, 2, 10},
        /* decoding: Lq = 1 against long keys takes the split-KV path (and its merge) */
        {2, 8, 2, 1, 4133, 64, 64, false, 0, kvl_dec, 0, false, ATTN_F32, ATTN_F32, -1, 4, 11},
        {1, 8, 8, 1, 8197, 64, 64, false, 0, NULL, 0, false, ATTN_F32, ATTN_F32, 2, 6, 12},
        {1, 8, 1, 4, 4100, 64, 64, true, ATTN_ALIGN_BOTTOM_RIGHT, NULL, 0, false, ATTN_BF16, ATTN_F32, -1, 4, 13},
    };
    for (size_t x = 0; x < sizeof cases / sizeof cases[0]; x++) {
        char what[64];
        snprintf(what, sizeof what, "forward case %zu", x);
        for (int path = 0; path < 2; path++) {
            const bool decode = cases[x].Lk > 4000;
            /* the weights output turns the split off: decoding cases take it once */
            forward_case(cases[x], path ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED, !decode, 0.0, what);
            if (decode) forward_case(cases[x], path ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED, true, 0.0, what);
        }
    }
}

/* A sink of -inf is bit for bit no sink; NaN and +inf sinks spoil their head only. */
static void test_special_sinks(void) {
    for (int path = 0; path < 2; path++) {
        for (int dec = 0; dec < 2; dec++) {
            sk_case c = {2, 4, 2, dec ? 1 : 21, dec ? 5000 : 50, 16, 16, false, 0, NULL, 0, false,
                         ATTN_F32, ATTN_F32, -1, 1, 20 + (uint64_t)dec};
            sk_data d;
    sk_make(c, &d);
            attn_options opt = d.opt;
            opt.path = path ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED;
            float *o1 = xcalloc(d.no, 4), *o2 = xcalloc(d.no, 4), *l1 = xcalloc(d.nl, 4), *l2 = xcalloc(d.nl, 4);
            attn_tensor t1 = attn_tensor_4d(o1, ATTN_F32, c.B, c.Hq, c.Lq, c.Dv);
            attn_tensor t2 = attn_tensor_4d(o2, ATTN_F32, c.B, c.Hq, c.Lq, c.Dv);
            attn_tensor tl1 = attn_tensor_4d(l1, ATTN_F32, c.B, c.Hq, c.Lq, 1);
            attn_tensor tl2 = attn_tensor_4d(l2, ATTN_F32, c.B, c.Hq, c.Lq, 1);
            for (int64_t h = 0; h < c.Hq; h++) d.fsinks[h] = -INFINITY;
            opt.lse = &tl1;
            CHECK(attn_forward(&d.tq, &d.tk, &d.tv, &t1, &opt) == ATTN_OK, "-inf sinks: status");
            attn_options none = opt;
            none.sinks = NULL, none.lse = &tl2;
            CHECK(attn_forward(&d.tq, &d.tk, &d.tv, &t2, &none) == ATTN_OK, "no sinks: status");
            CHECK(!memcmp(o1, o2, (size_t)d.no * 4) && !memcmp(l1, l2, (size_t)d.nl * 4),
                  "[%s%s] sinks of -inf differ from no sinks", path_name(opt.path), dec ? ", split" : "");
            d.fsinks[1] = NAN, d.fsinks[3] = INFINITY;
            CHECK(attn_forward(&d.tq, &d.tk, &d.tv, &t1, &opt) == ATTN_OK, "NaN sinks: status");
            int64_t bad = 0;
            for (int64_t row = 0; row < d.nl; row++) {
                const int64_t h = row / c.Lq % c.Hq;
                const bool spoilt = h == 1 || h == 3;
                bad += spoilt != isnan(l1[row]);
                for (int64_t z = 0; z < c.Dv; z++) {
                    bad += spoilt != isnan(o1[row * c.Dv + z]);
                    if (!spoilt) bad += o1[row * c.Dv + z] != o2[row * c.Dv + z];
                }
            }
            CHECK(bad == 0, "[%s%s] NaN / +inf sinks: %lld elements wrong (NaN only in heads 1, 3)",
                  path_name(opt.path), dec ? ", split" : "", (long long)bad);
            sk_free(&d);
            free(o1), free(o2), free(l1), free(l2);
        }
    }
}

/* attn_weights_grid from the sink LSE: one cell per row holds the row's weight sum */
static void test_grid(void) {
    sk_case c = {2, 4, 2, 20, 45, 16, 16, true, ATTN_ALIGN_TOP_LEFT, NULL, 0, false, ATTN_F32, ATTN_F32, -1, 2, 30};
    sk_data d;
    sk_make(c, &d);
    float *o = xcalloc(d.no, 4), *lse = xcalloc(d.nl, 4), *g = xcalloc(d.nl, 4);
    attn_tensor to = attn_tensor_4d(o, ATTN_F32, c.B, c.Hq, c.Lq, c.Dv);
    attn_tensor tl = attn_tensor_4d(lse, ATTN_F32, c.B, c.Hq, c.Lq, 1);
    attn_tensor tg = attn_tensor_4d(g, ATTN_F32, c.B, c.Hq, c.Lq, 1);
    attn_options opt = d.opt;
    opt.lse = &tl;
    CHECK(attn_forward(&d.tq, &d.tk, &d.tv, &to, &opt) == ATTN_OK, "grid: forward");
    opt.lse = NULL;
    CHECK(attn_weights_grid(&d.tq, &d.tk, &tl, &tg, ATTN_REDUCE_SUM, &opt) == ATTN_OK, "grid: %s",
          attn_last_error());
    double worst = 0.0;
    for (int64_t row = 0; row < d.nl; row++)
        worst = fmax(worst, fabs(g[row] - (1.0 - exp((double)d.fsinks[row / c.Lq % c.Hq] - lse[row]))));
    CHECK(worst <= 1e-5, "grid: row sums off 1 - exp(sink - lse) by %.3g", worst);
    sk_free(&d);
    free(o), free(lse), free(g);
}

/* ---- 3: the backward ------------------------------------------------------------------ */

/* loss = Σ G ∘ O of the oracle; central differences in every input, step 1e-5 */
static double loss(const sk_data *d, const double *q, const double *k, const double *v,
                   const double *s, const double *G, double *o) {
    sink_oracle(d, q, k, v, s, o, NULL, NULL);
    double L = 0.0;
    for (int64_t x = 0; x < d->no; x++) L += G[x] * o[x];
    return L;
}

static void fd_grad(const sk_data *d, const double *G, double *x, int64_t n, double *grad) {
    double *o = xcalloc(d->no, sizeof(double));
    for (int64_t e = 0; e < n; e++) {
        const double x0 = x[e], h = 1e-5;
        x[e] = x0 + h;
        const double lp = loss(d, d->q, d->k, d->v, d->sinks, G, o);
        x[e] = x0 - h;
        const double lm = loss(d, d->q, d->k, d->v, d->sinks, G, o);
        x[e] = x0;
        grad[e] = (lp - lm) / (2 * h);
    }
    free(o);
}

/* The gradients' tolerance against finite differences: the contract's float32 rule
 * (within_f32_tol); the finite differences' own error (step 1e-5, float64) is ~1e-10. */
static int grad_ok(const float *got, const double *ref, int64_t n, tol_result *r) {
    return within_f32_tol(got, ref, n, r);
}

/* One backward case against finite differences on the given path; plant (index 0..3 of
 * dq, dk, dv, d_sinks, or -1) perturbs one element before the check. Returns the number
 * of gradients within tolerance. */
static int backward_case(sk_case c, attn_path path, int plant, const char *what) {
    sk_data d;
    sk_make(c, &d);
    rng_t r = {c.seed * 7 + 1};
    double *G = xcalloc(d.no, sizeof(double));
    float *fo = xcalloc(d.no, 4), *fdo = xcalloc(d.no, 4), *lse = xcalloc(d.nl, 4);
    for (int64_t x = 0; x < d.no; x++) fdo[x] = (float)rng_sym(&r), G[x] = fdo[x];
    attn_tensor to = attn_tensor_4d(fo, ATTN_F32, c.B, c.Hq, c.Lq, c.Dv);
    attn_tensor tdo = attn_tensor_4d(fdo, ATTN_F32, c.B, c.Hq, c.Lq, c.Dv);
    attn_tensor tl = attn_tensor_4d(lse, ATTN_F32, c.B, c.Hq, c.Lq, 1);
    attn_options opt = d.opt;
    opt.path = path;
    opt.lse = &tl;
    CHECK(attn_forward(&d.tq, &d.tk, &d.tv, &to, &opt) == ATTN_OK, "%s: forward", what);
    opt.lse = NULL;

    const int64_t n[4] = {d.nq, d.nk, d.nv, c.Hq};
    void *gb[3];
    attn_tensor tg[3];
    const int64_t sh[3][4] = {{c.B, c.Hq, c.Lq, c.Dk}, {c.B, c.Hkv, c.Lk, c.Dk}, {c.B, c.Hkv, c.Lk, c.Dv}};
    for (int a = 0; a < 3; a++) {
        gb[a] = xcalloc(n[a], attn_dtype_size(c.dt));
        tg[a] = attn_tensor_4d(gb[a], c.dt, sh[a][0], sh[a][1], sh[a][2], sh[a][3]);
    }
    float *dsink = xcalloc(c.Hq, 4);
    attn_tensor tds = attn_tensor_4d(dsink, ATTN_F32, c.Hq, 1, 1, 1);
    opt.d_sinks = &tds;
    const attn_status st = attn_backward(&d.tq, &d.tk, &d.tv, &to, &tdo, &tl, &tg[0], &tg[1], &tg[2], &opt);
    CHECK(st == ATTN_OK, "%s [%s]: backward status %s (%s)", what, path_name(path),
          attn_status_string(st), attn_last_error());

    double *fd[4];
    double *xs[4] = {d.q, d.k, d.v, d.sinks};
    int good = 0;
    static const char *const names[4] = {"dq", "dk", "dv", "d_sinks"};
    for (int a = 0; a < 4; a++) {
        fd[a] = xcalloc(n[a], sizeof(double));
        fd_grad(&d, G, xs[a], n[a], fd[a]);
        float *got = xcalloc(n[a], 4);
        if (a < 3) gather(&tg[a], got);
        else memcpy(got, dsink, (size_t)c.Hq * 4);
        double sum2 = 0.0;
        for (int64_t e = 0; e < n[a]; e++) sum2 += fd[a][e] * fd[a][e];
        if (plant == a) got[n[a] / 2] += (float)(1e-5 * sqrt(sum2));
        tol_result tr;
        int ok;
        if (c.dt == ATTN_F32 || a == 3) {
            ok = grad_ok(got, fd[a], n[a], &tr);
        } else {  // a 16-bit gradient: rounded once to its type
            double worst;
            ok = within_half(got, fd[a], n[a], c.dt, &worst);
            tr = (tol_result){.rel_err = worst};
        }
        good += ok;
        if (plant < 0 && (c.dt == ATTN_F32 || a == 3)) g_worst_grad[a] = fmax(g_worst_grad[a], tr.rel_err);
        if (plant < 0)
            CHECK(ok, "%s [%s]: %s against finite differences: rel %.3g max %.3g (max ref %.3g)",
                  what, path_name(path), names[a], tr.rel_err, tr.max_err, tr.max_ref);
        free(got);
    }
    if (plant < 0) CHECK(dsink[2] == 0.0f, "%s: the head without a sink has d_sinks %g", what, dsink[2]);
    for (int a = 0; a < 4; a++) free(fd[a]);
    for (int a = 0; a < 3; a++) free(gb[a]);
    sk_free(&d);
    free(G), free(fo), free(fdo), free(lse), free(dsink);
    return good;
}

static void test_backward(void) {
    static const int64_t kvl[2] = {11, 0};
    const sk_case cases[] = {
        {2, 4, 2, 9, 13, 8, 6, false, 0, NULL, 0, false, ATTN_F32, ATTN_F32, -1, 2, 40},
        {2, 4, 2, 9, 13, 8, 6, true, ATTN_ALIGN_BOTTOM_RIGHT, kvl, 0, false, ATTN_F32, ATTN_F32, -1, 2, 41},
        {2, 4, 4, 11, 17, 8, 8, false, 0, NULL, 1, false, ATTN_F32, ATTN_F32, -2, 1, 42},
        {1, 4, 1, 7, 70, 8, 8, true, ATTN_ALIGN_TOP_LEFT, NULL, 2, true, ATTN_F32, ATTN_F32, 0, 3, 43},
        {2, 4, 2, 9, 13, 8, 6, false, 0, NULL, 0, false, ATTN_BF16, ATTN_F32, -1, 2, 44},
    };
    for (size_t x = 0; x < sizeof cases / sizeof cases[0]; x++) {
        char what[64];
        snprintf(what, sizeof what, "backward case %zu", x);
        backward_case(cases[x], ATTN_PATH_FUSED, -1, what);
        backward_case(cases[x], ATTN_PATH_REFERENCE, -1, what);
    }
}

/* d_sinks bit-identical for 1 and 2 threads (and on a repeat) on a case of many rows */
static void test_threads(void) {
    sk_case c = {3, 4, 2, 300, 200, 32, 32, true, ATTN_ALIGN_BOTTOM_RIGHT, NULL, 0, false, ATTN_F32, ATTN_F32, -1, 3, 50};
    sk_data d;
    sk_make(c, &d);
    float *o = xcalloc(d.no, 4), *d_o = xcalloc(d.no, 4), *lse = xcalloc(d.nl, 4);
    float *dq = xcalloc(d.nq, 4), *dk = xcalloc(d.nk, 4), *dv = xcalloc(d.nv, 4), *ds[3];
    rng_t r = {99};
    for (int64_t x = 0; x < d.no; x++) d_o[x] = (float)rng_sym(&r);
    attn_tensor to = attn_tensor_4d(o, ATTN_F32, c.B, c.Hq, c.Lq, c.Dv);
    attn_tensor tdo = attn_tensor_4d(d_o, ATTN_F32, c.B, c.Hq, c.Lq, c.Dv);
    attn_tensor tl = attn_tensor_4d(lse, ATTN_F32, c.B, c.Hq, c.Lq, 1);
    attn_tensor tdq = attn_tensor_4d(dq, ATTN_F32, c.B, c.Hq, c.Lq, c.Dk);
    attn_tensor tdk = attn_tensor_4d(dk, ATTN_F32, c.B, c.Hkv, c.Lk, c.Dk);
    attn_tensor tdv = attn_tensor_4d(dv, ATTN_F32, c.B, c.Hkv, c.Lk, c.Dv);
    attn_options opt = d.opt;
    opt.lse = &tl;
    CHECK(attn_forward(&d.tq, &d.tk, &d.tv, &to, &opt) == ATTN_OK, "threads: forward");
    opt.lse = NULL;
    const int threads[3] = {1, 2, 2};
    for (int x = 0; x < 3; x++) {
        ds[x] = xcalloc(c.Hq, 4);
        attn_tensor tds = attn_tensor_4d(ds[x], ATTN_F32, c.Hq, 1, 1, 1);
        opt.d_sinks = &tds, opt.threads = threads[x];
        CHECK(attn_backward(&d.tq, &d.tk, &d.tv, &to, &tdo, &tl, &tdq, &tdk, &tdv, &opt) == ATTN_OK,
              "threads: backward");
    }
    CHECK(!memcmp(ds[0], ds[1], (size_t)c.Hq * 4) && !memcmp(ds[1], ds[2], (size_t)c.Hq * 4),
          "d_sinks differ across thread counts: %a %a %a", ds[0][0], ds[1][0], ds[2][0]);
    sk_free(&d);
    free(o), free(d_o), free(lse), free(dq), free(dk), free(dv);
    for (int x = 0; x < 3; x++) free(ds[x]);
}

/* Empty sizes: Lk = 0 makes every row fully masked (O = 0, LSE = sink); d_sinks is then
 * 0, as it is with Lq = 0 or B = 0 (no row). */
static void test_empty(void) {
    static const int64_t shapes[3][2] = {{2, 0}, {0, 5}, {2, 5}};  // (Lq, Lk) with B = 0 last
    float sinks[3] = {0.75f, -1.0f, -INFINITY}, q[64] = {0}, k[64] = {0}, o[64], lse[8], d_o[64] = {0};
    float dq[64], dk[64], dv[64], ds[3];
    for (int x = 0; x < 3; x++) {
        const int64_t B = x == 2 ? 0 : 1, Lq = shapes[x][0], Lk = shapes[x][1];
        attn_tensor tq = attn_tensor_4d(q, ATTN_F32, B, 3, Lq, 4), tk = attn_tensor_4d(k, ATTN_F32, B, 3, Lk, 4);
        attn_tensor to = attn_tensor_4d(o, ATTN_F32, B, 3, Lq, 4), tl = attn_tensor_4d(lse, ATTN_F32, B, 3, Lq, 1);
        attn_tensor tdo = attn_tensor_4d(d_o, ATTN_F32, B, 3, Lq, 4);
        attn_tensor tdq = attn_tensor_4d(dq, ATTN_F32, B, 3, Lq, 4), tdk = attn_tensor_4d(dk, ATTN_F32, B, 3, Lk, 4);
        attn_tensor tdv = attn_tensor_4d(dv, ATTN_F32, B, 3, Lk, 4);
        attn_tensor ts = attn_tensor_4d(sinks, ATTN_F32, 3, 1, 1, 1), tds = attn_tensor_4d(ds, ATTN_F32, 3, 1, 1, 1);
        for (int path = 0; path < 2; path++) {
            attn_options opt = {.sinks = &ts, .lse = &tl, .path = path ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED};
            fill_sentinel(o, 64), fill_sentinel(lse, 8), fill_sentinel(ds, 3);
            CHECK(attn_forward(&tq, &tk, &tk, &to, &opt) == ATTN_OK, "empty %d: forward %s", x, attn_last_error());
            int ok = 1;
            for (int64_t r = 0; r < B * 3 * Lq; r++) {
                ok &= lse[r] == sinks[r / Lq] || (sinks[r / Lq] == -INFINITY && lse[r] == -INFINITY);
                for (int z = 0; z < 4; z++) ok &= o[r * 4 + z] == 0.0f;
            }
            CHECK(ok, "empty %d [%s]: fully masked rows are not O = 0, LSE = sink", x, path_name(opt.path));
            opt.lse = NULL, opt.d_sinks = &tds;
            CHECK(attn_backward(&tq, &tk, &tk, &to, &tdo, &tl, &tdq, &tdk, &tdv, &opt) == ATTN_OK,
                  "empty %d: backward %s", x, attn_last_error());
            CHECK(ds[0] == 0.0f && ds[1] == 0.0f && ds[2] == 0.0f, "empty %d [%s]: d_sinks %g %g %g", x,
                  path_name(opt.path), ds[0], ds[1], ds[2]);
        }
    }
}

/* ---- 4: misuse ----------------------------------------------------------------------- */

static void test_misuse(void) {
    sk_case c = {1, 4, 2, 6, 9, 8, 8, false, 0, NULL, 0, false, ATTN_F32, ATTN_F32, -1, 1, 60};
    sk_data d;
    sk_make(c, &d);
    float *o = xcalloc(d.no, 4), *lse = xcalloc(d.nl, 4), *d_o = xcalloc(d.no, 4);
    float *g = xcalloc(d.nq + d.nk + d.nv, 4), *ds = xcalloc(c.Hq + 1, 4);
    attn_tensor to = attn_tensor_4d(o, ATTN_F32, c.B, c.Hq, c.Lq, c.Dv);
    attn_tensor tl = attn_tensor_4d(lse, ATTN_F32, c.B, c.Hq, c.Lq, 1);
    attn_tensor tdo = attn_tensor_4d(d_o, ATTN_F32, c.B, c.Hq, c.Lq, c.Dv);
    attn_tensor tdq = attn_tensor_4d(g, ATTN_F32, c.B, c.Hq, c.Lq, c.Dk);
    attn_tensor tdk = attn_tensor_4d(g + d.nq, ATTN_F32, c.B, c.Hkv, c.Lk, c.Dk);
    attn_tensor tdv = attn_tensor_4d(g + d.nq + d.nk, ATTN_F32, c.B, c.Hkv, c.Lk, c.Dv);
    attn_tensor tds = attn_tensor_4d(ds, ATTN_F32, c.Hq, 1, 1, 1);
    attn_options fwd = d.opt;
    fwd.lse = &tl;
    CHECK(attn_forward(&d.tq, &d.tk, &d.tv, &to, &fwd) == ATTN_OK, "misuse: the good forward");
    fwd.lse = NULL;

    /* forward misuse: o and lse untouched */
    uint16_t half_sinks[4] = {0};
    attn_tensor s_f16 = attn_tensor_4d(half_sinks, ATTN_F16, c.Hq, 1, 1, 1);
    attn_tensor s_shape = attn_tensor_4d(d.fsinks, ATTN_F32, c.Hq - 1, 1, 1, 1);
    attn_tensor s_shape2 = attn_tensor_4d(d.fsinks, ATTN_F32, c.Hq, 2, 1, 1);
    attn_tensor s_null = attn_tensor_4d(NULL, ATTN_F32, c.Hq, 1, 1, 1);
    attn_tensor s_in_o = attn_tensor_4d(o, ATTN_F32, c.Hq, 1, 1, 1);  // sinks inside o
    attn_tensor s_overflow = {d.fsinks, ATTN_F32, {c.Hq, 1, 1, 1}, {INT64_MAX / 2, 0, 0, 0}};
    struct { const attn_tensor *sinks, *d_sinks; attn_status want; const char *what; } fbad[] = {
        {&s_f16, NULL, ATTN_ERR_DTYPE, "float16 sinks"},
        {&s_shape, NULL, ATTN_ERR_SHAPE, "sinks of Hq - 1"},
        {&s_shape2, NULL, ATTN_ERR_SHAPE, "sinks [Hq, 2, 1, 1]"},
        {&s_null, NULL, ATTN_ERR_NULL, "sinks with NULL data"},
        {&s_in_o, NULL, ATTN_ERR_STRIDE, "sinks overlapping o"},
        {&s_overflow, NULL, ATTN_ERR_OVERFLOW, "sinks whose offsets overflow"},
        {&d.tsinks, &tds, ATTN_ERR_VALUE, "d_sinks in the forward"},
    };
    for (size_t x = 0; x < sizeof fbad / sizeof fbad[0]; x++) {
        fill_sentinel(o, d.no);
        fill_sentinel(lse, d.nl);
        attn_options opt = fwd;
        opt.lse = &tl;
        opt.sinks = fbad[x].sinks, opt.d_sinks = fbad[x].d_sinks;
        for (int path = 0; path < 2; path++) {
            opt.path = path ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED;
            const attn_status st = attn_forward(&d.tq, &d.tk, &d.tv, &to, &opt);
            CHECK(st == fbad[x].want, "forward, %s: status %s, expected %s", fbad[x].what,
                  attn_status_string(st), attn_status_string(fbad[x].want));
            CHECK(count_written(o, d.no) == 0 && count_written(lse, d.nl) == 0,
                  "forward, %s: wrote its outputs", fbad[x].what);
        }
    }
    /* the real O and LSE again, for the backward */
    fwd.lse = &tl;
    CHECK(attn_forward(&d.tq, &d.tk, &d.tv, &to, &fwd) == ATTN_OK, "misuse: the good forward");
    fwd.lse = NULL;

    /* backward misuse: dq, dk, dv and d_sinks untouched */
    attn_tensor ds_f16 = attn_tensor_4d(half_sinks, ATTN_F16, c.Hq, 1, 1, 1);
    attn_tensor ds_shape = attn_tensor_4d(ds, ATTN_F32, c.Hq + 1, 1, 1, 1);
    attn_tensor ds_null = attn_tensor_4d(NULL, ATTN_F32, c.Hq, 1, 1, 1);
    attn_tensor ds_in_dq = attn_tensor_4d(g + 3, ATTN_F32, c.Hq, 1, 1, 1);
    attn_tensor ds_is_sinks = attn_tensor_4d(d.fsinks, ATTN_F32, c.Hq, 1, 1, 1);
    attn_tensor ds_in_lse = attn_tensor_4d(lse + 1, ATTN_F32, c.Hq, 1, 1, 1);
    attn_tensor ds_self = {ds, ATTN_F32, {c.Hq, 1, 1, 1}, {0, 0, 0, 0}};  // stride 0: overlaps itself
    struct { const attn_tensor *sinks, *d_sinks; attn_status want; const char *what; } bbad[] = {
        {NULL, &tds, ATTN_ERR_VALUE, "d_sinks without sinks"},
        {&d.tsinks, &ds_f16, ATTN_ERR_DTYPE, "float16 d_sinks"},
        {&d.tsinks, &ds_shape, ATTN_ERR_SHAPE, "d_sinks of Hq + 1"},
        {&d.tsinks, &ds_null, ATTN_ERR_NULL, "d_sinks with NULL data"},
        {&d.tsinks, &ds_in_dq, ATTN_ERR_STRIDE, "d_sinks overlapping dq"},
        {&d.tsinks, &ds_is_sinks, ATTN_ERR_STRIDE, "d_sinks overlapping sinks"},
        {&d.tsinks, &ds_in_lse, ATTN_ERR_STRIDE, "d_sinks overlapping lse"},
        {&d.tsinks, &ds_self, ATTN_ERR_STRIDE, "d_sinks overlapping itself"},
        {&s_shape, &tds, ATTN_ERR_SHAPE, "sinks of Hq - 1 in the backward"},
    };
    for (size_t x = 0; x < sizeof bbad / sizeof bbad[0]; x++) {
        for (int path = 0; path < 2; path++) {
            fill_sentinel(g, d.nq + d.nk + d.nv);
            fill_sentinel(ds, c.Hq + 1);
            attn_options opt = fwd;
            opt.sinks = bbad[x].sinks, opt.d_sinks = bbad[x].d_sinks;
            opt.path = path ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED;
            const float keep_sinks = d.fsinks[0];
            const attn_status st = attn_backward(&d.tq, &d.tk, &d.tv, &to, &tdo, &tl, &tdq, &tdk, &tdv, &opt);
            CHECK(st == bbad[x].want, "backward, %s: status %s, expected %s (%s)", bbad[x].what,
                  attn_status_string(st), attn_status_string(bbad[x].want), attn_last_error());
            CHECK(count_written(g, d.nq + d.nk + d.nv) == 0 && count_written(ds, c.Hq + 1) == 0 &&
                      d.fsinks[0] == keep_sinks,
                  "backward, %s: wrote something", bbad[x].what);
        }
    }
    /* the 16-bit backward checks them too */
    uint16_t *hq = xcalloc(d.nq, 2);
    attn_tensor tq16 = attn_tensor_4d(hq, ATTN_BF16, c.B, c.Hq, c.Lq, c.Dk);
    fill_sentinel(g, d.nq + d.nk + d.nv);
    attn_options opt = fwd;
    opt.d_sinks = &ds_in_dq;
    CHECK(attn_backward(&tq16, &d.tk, &d.tv, &to, &tdo, &tl, &tdq, &tdk, &tdv, &opt) == ATTN_ERR_STRIDE &&
              count_written(g, d.nq + d.nk + d.nv) == 0,
          "16-bit backward: d_sinks overlapping dq not refused, or something written");
    free(hq);

    /* additive attention has no sinks */
    float wq[8 * 4] = {0}, wk[8 * 4] = {0}, wv[4] = {1, 1, 1, 1};
    attn_additive_weights aw = {.units = 4, .w_query = wq, .w_key = wk, .v = wv};
    attn_tensor aq = attn_tensor_4d(d.bq, ATTN_F32, 1, 1, c.Lq, c.Dk);
    attn_tensor ak = attn_tensor_4d(d.bk, ATTN_F32, 1, 1, c.Lk, c.Dk);
    attn_tensor av = attn_tensor_4d(d.bv, ATTN_F32, 1, 1, c.Lk, c.Dv);
    attn_tensor ao = attn_tensor_4d(o, ATTN_F32, 1, 1, c.Lq, c.Dv);
    attn_tensor one_sink = attn_tensor_4d(d.fsinks, ATTN_F32, 1, 1, 1, 1);
    attn_options aopt = {.sinks = &one_sink};
    fill_sentinel(o, d.no);
    const attn_status st = attn_additive_forward(&aq, &ak, &av, &aw, &ao, &aopt);
    CHECK(st == ATTN_ERR_UNSUPPORTED && count_written(o, d.no) == 0,
          "additive with sinks: status %s, expected ATTN_ERR_UNSUPPORTED", attn_status_string(st));

    sk_free(&d);
    free(o), free(lse), free(d_o), free(g), free(ds);
}

/* The multi-head module: y and the weights with sinks are the same whether the weights
 * are per head, averaged (one call per head, the sinks sliced) or not asked for; the
 * sinks change y; its backward takes sinks but refuses d_sinks. */
static void test_mha(void) {
    if (strcmp(attn_blas_name(), "none") == 0) {  // the module's projections need a BLAS
        printf("test_sinks: the multi-head module's cases skipped: this build has no BLAS\n");
        return;
    }
    const mcase c = {.B = 2, .Lq = 7, .Lk = 7, .E = 16, .Ekv = 16, .Hq = 4, .Hkv = 2, .Dk = 4,
                     .Dv = 4, .self = true, .bias = true, .seed = 70};
    mlayer l;
    mlayer_build(&l, &c);
    float sinks[4] = {0.5f, 0.0f, -INFINITY, 2.0f};
    attn_tensor ts = attn_tensor_4d(sinks, ATTN_F32, 4, 1, 1, 1);
    attn_options opt = {.causal = true, .sinks = &ts};
    const int64_t ny = c.B * c.Lq * c.E, nw = c.B * c.Hq * c.Lq * c.Lk, nm = c.B * c.Lq * c.Lk;
    float *y[4], *w = xcalloc(nw, 4), *wa = xcalloc(nm, 4);
    attn_tensor tw = attn_tensor_4d(w, ATTN_F32, c.B, c.Hq, c.Lq, c.Lk);
    attn_tensor twa = attn_tensor_4d(wa, ATTN_F32, c.B, 1, c.Lq, c.Lk);
    for (int x = 0; x < 4; x++) {
        attn_options o = opt;
        if (x == 3) o.sinks = NULL;
        const attn_status st = attn_mha_forward(&l.m, &l.txq, NULL, &l.ty, x == 1 ? &tw : x == 2 ? &twa : NULL,
                                                x == 2, &o);
        CHECK(st == ATTN_OK, "mha with sinks (%d): %s", x, attn_last_error());
        y[x] = xcalloc(ny, 4);
        for (int64_t b = 0; b < c.B; b++)
            for (int64_t i = 0; i < c.Lq; i++)
                for (int64_t e = 0; e < c.E; e++)
                    y[x][(b * c.Lq + i) * c.E + e] = attn_load(
                        l.ty.dtype, l.ty.data, b * l.ty.stride[0] + i * l.ty.stride[1] + e * l.ty.stride[2]);
    }
    double *y0 = xcalloc(ny, sizeof(double)), *mean = xcalloc(nm, sizeof(double));
    for (int64_t e = 0; e < ny; e++) y0[e] = y[0][e];
    for (int64_t b = 0; b < c.B; b++)
        for (int64_t h = 0; h < c.Hq; h++)
            for (int64_t e = 0; e < c.Lq * c.Lk; e++)
                mean[b * c.Lq * c.Lk + e] += w[(b * c.Hq + h) * c.Lq * c.Lk + e] / (double)c.Hq;
    CHECK(within_f32_tol(y[1], y0, ny, NULL) && within_f32_tol(y[2], y0, ny, NULL),
          "mha: y with sinks depends on the weights asked for");
    CHECK(within_f32_tol(wa, mean, nm, NULL), "mha: averaged weights with sinks are not the heads' mean");
    CHECK(!within_f32_tol(y[3], y0, ny, NULL), "mha: the sinks do not change y");
    double worst = 0.0;  // row sums below 1 where the head has a sink: the last row of batch 0, head 3
    for (int64_t i = 0; i < c.Lq; i++) {
        double sum = 0.0;
        for (int64_t j = 0; j < c.Lk; j++) sum += w[(3 * c.Lq + i) * c.Lk + j];
        worst = fmax(worst, sum);
    }
    CHECK(worst < 1.0 - 1e-3, "mha: weights of a head with sink 2 sum to %.6f", worst);
    /* the backward: sinks are constants there; d_sinks is refused */
    const int64_t ng = c.E * c.Hq * c.Dk;
    float *g = xcalloc(ng, 4), *dy = xcalloc(ny, 4);
    for (int64_t e = 0; e < ny; e++) dy[e] = 0.25f;
    attn_tensor tdy = attn_tensor_4d(dy, ATTN_F32, c.B, c.Lq, c.E, 1);
    attn_tensor tg = attn_tensor_4d(g, ATTN_F32, c.E, c.Hq * c.Dk, 1, 1);
    attn_mha_grads grads = {.dw_q = &tg};
    CHECK(attn_mha_backward(&l.m, &l.txq, NULL, &tdy, &grads, &opt) == ATTN_OK, "mha backward with sinks: %s",
          attn_last_error());
    float ds[4];
    attn_tensor tds = attn_tensor_4d(ds, ATTN_F32, 4, 1, 1, 1);
    opt.d_sinks = &tds;
    fill_sentinel(g, ng);
    CHECK(attn_mha_backward(&l.m, &l.txq, NULL, &tdy, &grads, &opt) == ATTN_ERR_VALUE &&
              count_written(g, ng) == 0,
          "mha backward: d_sinks not refused, or a gradient written");
    for (int x = 0; x < 4; x++) free(y[x]);
    free(w), free(wa), free(y0), free(mean), free(g), free(dy);
    mlayer_free(&l);
}

/* ---- 5: the checks reject planted errors ------------------------------------------ */

static void test_planted(void) {
    const sk_case f = {2, 4, 2, 37, 70, 32, 32, false, 0, NULL, 0, false, ATTN_F32, ATTN_F32, -2, 2, 1};
    CHECK(!forward_case(f, ATTN_PATH_FUSED, false, 2e-5 * 2.0, "planted"),
          "planted: an O element 4e-5 off is accepted");
    sk_case h = f;
    h.dt = h.o_dt = ATTN_BF16;
    CHECK(!forward_case(h, ATTN_PATH_FUSED, false, 0.05, "planted"),
          "planted: a bfloat16 O element 0.05 off is accepted");
    /* the library without its sinks against the sink oracle: rejected */
    {
        sk_data d;
    sk_make(f, &d);
        float *o = xcalloc(d.no, 4);
        double *ro = xcalloc(d.no, sizeof(double));
        attn_tensor to = attn_tensor_4d(o, ATTN_F32, f.B, f.Hq, f.Lq, f.Dv);
        attn_options none = d.opt;
        none.sinks = NULL;
        CHECK(attn_forward(&d.tq, &d.tk, &d.tv, &to, &none) == ATTN_OK, "planted: forward");
        sink_oracle(&d, d.q, d.k, d.v, d.sinks, ro, NULL, NULL);
        CHECK(!within_f32_tol(o, ro, d.no, NULL), "planted: O without sinks passes the sink oracle");
        sk_free(&d);
        free(o), free(ro);
    }
    const sk_case b = {2, 4, 2, 9, 13, 8, 6, false, 0, NULL, 0, false, ATTN_F32, ATTN_F32, -1, 2, 40};
    for (int a = 0; a < 4; a++)
        CHECK(backward_case(b, ATTN_PATH_FUSED, a, "planted") == 3,
              "planted: gradient %d one element off by 1e-5 of its norm is accepted", a);
}

int main(void) {
    printf("test_sinks: kernel %s\n", attn_kernel_name());
    test_forward();
    CHECK(g_masked_rows > 0, "no fully masked row was met by the forward cases");
    printf("test_sinks: forward O worst relative error %.3g (float32 outputs), %lld fully masked "
           "rows exact\n", g_worst_o, (long long)g_masked_rows);
    test_special_sinks();
    test_grid();
    test_backward();
    printf("test_sinks: gradients against finite differences, worst relative error: dq %.3g, "
           "dk %.3g, dv %.3g, d_sinks %.3g\n", g_worst_grad[0], g_worst_grad[1], g_worst_grad[2],
           g_worst_grad[3]);
    test_threads();
    test_empty();
    test_misuse();
    test_mha();
    test_planted();
    return check_summary("test_sinks");
}
