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
 *  3. The backward: test_sinks_backward.c.
 *  4. Misuse refused with its status and nothing written; the multi-head module passes
 *     the sinks to its heads (its averaged-weights path slices them per head).
 *  5. Each tolerance check of the forward rejects a planted error.
 * The case and the oracle are tests/support/sinks_case.h, shared with
 * test_sinks_backward.c. What it is not: a test of the rest of attn_forward
 * (test_forward.c, test_edge.c).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "core/half.h"
#include "mha_ref.h"
#include "oracle.h"
#include "sinks_case.h"

/* the largest relative Frobenius error of O seen (printed at the end), and the fully
 * masked rows found (the exact checks must have met some) */
static double g_worst_o;
static int64_t g_masked_rows;

/* ---- 1, 2: the forward ------------------------------------------------------------------ */

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
    double *mag = xcalloc(d.nl, sizeof(double));  // the sink is one more term of the row
    oracle_logit_mag(&d.tq, &d.tk, &d.opt, mag);
    for (int64_t x = 0; d.sinks && x < d.nl; x++)
        if (isfinite(d.sinks[(x / c.Lq) % c.Hq])) mag[x] = fmax(mag[x], fabs(d.sinks[(x / c.Lq) % c.Hq]));
    tol_result r = {0};
    double worst = 0.0;
    const int ok_o = c.o_dt == ATTN_F32 ? within_f32_tol(o, ro, d.no, &r)
                                        : within_half(o, ro, d.no, c.o_dt, &worst);
    if (plant == 0.0) {
        CHECK(ok_o, "%s [%s]: O rel %.3g max %.3g (worst/bound %.3g)", what, path_name(path),
              r.rel_err, r.max_err, worst);
        if (c.o_dt == ATTN_F32) g_worst_o = fmax(g_worst_o, r.rel_err);
        CHECK(within_lse_tol(lse, rl, mag, d.nl, c.Dk, c.Lk + 1, &r), "%s [%s]: LSE error %.3g "
              "(%.3g of the bound; %d non-finite mismatches)", what, path_name(path), r.max_err,
              r.rel_err, r.nonfinite_mismatch);
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
                /* the row's weights and the sink's together sum to 1 within the weights'
                 * relative bound (tol_weight_rel: derived; the sum here in double) */
                const double want = 1.0 - exp((double)d.fsinks[row / c.Lq % c.Hq] - (double)lse[row]);
                const double bound = tol_weight_rel(c.Dk, c.Lk + 1, mag[row]) * fmax(1.0, sum);
                worst_sum = fmax(worst_sum, fabs(sum - want) / bound);
            }
            CHECK(worst_sum <= 1.0, "%s [%s]: weights sum off 1 - exp(sink - lse) by %.3g of its "
                  "bound", what, path_name(path), worst_sum);
        }
    }
    sk_free(&d);
    free(o), free(lse), free(w), free(ob), free(ro), free(rl), free(rw), free(mag);
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
    /* the grid's float32 sum of a row's weights: their relative bound and the sum's own */
    double *mag = xcalloc(d.nl, sizeof(double)), worst = 0.0;
    oracle_logit_mag(&d.tq, &d.tk, &opt, mag);
    for (int64_t row = 0; row < d.nl; row++) {
        const double m = fmax(mag[row], fabs(d.sinks[row / c.Lq % c.Hq]));
        const double bound = tol_weight_rel(c.Dk, c.Lk + 1, m) + tol_sum_rel(c.Lk);
        worst = fmax(worst, fabs(g[row] - (1.0 - exp((double)d.fsinks[row / c.Lq % c.Hq] - lse[row]))) / bound);
    }
    free(mag);
    CHECK(worst <= 1.0, "grid: row sums off 1 - exp(sink - lse) by %.3g of the bound", worst);
    sk_free(&d);
    free(o), free(lse), free(g);
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
}

int main(void) {
    printf("test_sinks: kernel %s\n", attn_kernel_name());
    test_forward();
    CHECK(g_masked_rows > 0, "no fully masked row was met by the forward cases");
    printf("test_sinks: forward O worst relative error %.3g (float32 outputs), %lld fully masked "
           "rows exact\n", g_worst_o, (long long)g_masked_rows);
    test_special_sinks();
    test_grid();
    test_misuse();
    test_mha();
    test_planted();
    return check_summary("test_sinks");
}
