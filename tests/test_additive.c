/*
 * test_additive.c — additive (Bahdanau) attention's forward: the vectorized tanh's bound
 *                   on every kernel this CPU runs, the fused and float64 paths against
 *                   this file's own float64 oracle over a matrix of shapes (tile edges,
 *                   0 and 1 sizes), layouts and masks, bit-identical results for any
 *                   thread count, masked keys never read, the edge-case contract, bad
 *                   arguments, Luong's forms, and every tolerance check failing on a
 *                   planted error. The backward is test_additive_backward.c.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "additive/additive.h"
#include "additive_case.h"

/* ---- the tanh ----------------------------------------------------------------------- */

/* |got - exact| in steps of float32 at the exact value's magnitude (the spacing above
 * |exact| rounded to float) */
static double ulp_error(float got, double exact) {
    const float e = fabsf((float)exact);
    const double step = (double)nextafterf(e, INFINITY) - (double)e;
    return fabs((double)got - exact) / step;
}

/* The bound of docs/CONTRACT.md */
#define TANH_ULP_BOUND 2.0

static double worst_tanh_ulp(const float *x, const float *y, int64_t n, float *at) {
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        const double u = ulp_error(y[i], tanh((double)x[i]));
        if (u > worst) worst = u, *at = x[i];
    }
    return worst;
}

static void test_tanh(const attn_additive_kernels *k) {
    enum { N = 1 << 21 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) x[i] = (float)(-12.0 + 24.0 * i / (N - 1));
    /* around the branch point and the clamp, and tiny values */
    for (int i = 0; i < 4096; i++) {
        x[i] = nextafterf(0.625f, 0.0f) + (float)(i - 2048) * 1e-7f;
        x[4096 + i] = 9.0f + (float)(i - 2048) * 1e-5f;
        x[8192 + i] = ldexpf(1.0f + (float)i / 4096.0f, -(i % 140));
    }
    k->tanh(N, x, y);
    float at = 0;
    const double worst = worst_tanh_ulp(x, y, N, &at);
    CHECK(worst <= TANH_ULP_BOUND, "%s tanh: %.2f ulp at x = %.9g (bound %g)", k->name, worst,
          (double)at, TANH_ULP_BOUND);
    printf("  %s tanh: max %.2f ulp on [-12, 12], tiny values and the branch points\n",
           k->name, worst);
    /* the planted error: one output moved 4 floats must break the bound */
    float bad = y[N / 3];
    for (int s = 0; s < 4; s++) y[N / 3] = nextafterf(y[N / 3], 2.0f);
    CHECK(worst_tanh_ulp(x, y, N, &at) > TANH_ULP_BOUND,
          "%s tanh: planted 4-float error accepted", k->name);
    y[N / 3] = bad;

    float sp[8] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, 30.0f, -1e30f}, sy[8];
    k->tanh(8, sp, sy);
    CHECK(sy[0] == 0.0f && !signbit(sy[0]) && sy[1] == 0.0f && signbit(sy[1]),
          "%s tanh(±0) = %g, %g", k->name, sy[0], sy[1]);
    CHECK(sy[2] == 1.0f && sy[3] == -1.0f, "%s tanh(±inf) = %g, %g", k->name, sy[2], sy[3]);
    CHECK(isnan(sy[4]), "%s tanh(NaN) = %g", k->name, sy[4]);
    CHECK(sy[5] == 1e-40f, "%s tanh(1e-40) = %g (subnormal kept)", k->name, sy[5]);
    CHECK(sy[6] == 1.0f && sy[7] == -1.0f, "%s tanh(30), tanh(-1e30) = %g, %g", k->name, sy[6], sy[7]);
    free(x);
    free(y);
}

/* ---- forward cases --------------------------------------------------------------------- */

static double g_worst_rel[2];  /* fused, reference */

typedef struct got_t {
    float *o, *lse, *w;
} got_t;

static got_t gather_outputs(const acall *t) {
    const acase *c = &t->c;
    got_t g = {xcalloc(c->B * c->Lq * c->Dv, sizeof(float)), xcalloc(c->B * c->Lq, sizeof(float)),
               xcalloc(c->B * c->Lq * c->Lk, sizeof(float))};
    gather_f32(&t->o, g.o);
    memcpy(g.lse, t->lseb, (size_t)(c->B * c->Lq) * sizeof(float));
    memcpy(g.w, t->wb, (size_t)(c->B * c->Lq * c->Lk) * sizeof(float));
    return g;
}
static void free_got(got_t *g) { free(g->o); free(g->lse); free(g->w); }

static void run_case(const acase *c) {
    acall t;
    acall_build(&t, c);
    const int64_t no = c->B * c->Lq * c->Dv, nl = c->B * c->Lq, nw = c->B * c->Lq * c->Lk;
    double *o = xcalloc(no, sizeof(double)), *lse = xcalloc(nl, sizeof(double)),
           *w = xcalloc(nw, sizeof(double));
    const int64_t poisoned = poison_unread(&t);
    oracle(&t, o, lse, w);
    got_t first = {0};
    for (int path = 0; path < 2; path++) {
        const attn_path ap = path ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED;
        const char *pn = path ? "reference" : "fused";
        attn_status st = acall_forward(&t, ap, 2, 1);
        CHECK(st == ATTN_OK, "%s: status %s (%s) [%s]", pn, attn_status_string(st),
              attn_last_error(), t.desc);
        if (st != ATTN_OK) continue;
        got_t g = gather_outputs(&t);
        tol_result r;
        CHECK(within_add_tol(g.o, o, no, &r), "%s O: max_err %.3g (max|ref| %.3g) rel %.3g "
              "nonfinite %d poisoned %lld [%s]", pn, r.max_err, r.max_ref, r.rel_err,
              r.nonfinite_mismatch, (long long)poisoned, t.desc);
        if (r.rel_err > g_worst_rel[path]) g_worst_rel[path] = r.rel_err;
        CHECK(within_add_tol(g.lse, lse, nl, &r), "%s LSE: max_err %.3g rel %.3g nonfinite %d [%s]",
              pn, r.max_err, r.rel_err, r.nonfinite_mismatch, t.desc);
        CHECK(within_add_tol(g.w, w, nw, &r), "%s weights: max_err %.3g rel %.3g nonfinite %d [%s]",
              pn, r.max_err, r.rel_err, r.nonfinite_mismatch, t.desc);
        if (path == 0) first = g;
        else free_got(&g);
    }
    /* the fused path for 1 and 3 threads, without the optional outputs: the same bits */
    for (int th = 1; th <= 3 && first.o; th += 2) {
        if (acall_forward(&t, ATTN_PATH_FUSED, th, th == 3) != ATTN_OK) continue;
        got_t g = gather_outputs(&t);
        CHECK(same_bits(g.o, first.o, no) && (th == 1 || same_bits(g.w, first.w, nw)),
              "fused: %d threads give other bits than 2 [%s]", th, t.desc);
        free_got(&g);
    }
    free_got(&first);
    free(o); free(lse); free(w);
    acall_free(&t);
}

static void shape_matrix(void) {
    /* key counts one under, at and over the tile, and around two tiles */
    static const int64_t lks[] = {1, 2, 63, 64, 65, 127, 129};
    static const int64_t as[] = {1, 7, 16, 33, 128};
    uint64_t seed = 1;
    for (size_t x = 0; x < sizeof lks / sizeof lks[0]; x++)
        for (size_t y = 0; y < sizeof as / sizeof as[0]; y++) {
            acase c = mk(2, (int64_t)(1 + (x * 7 + y * 5) % 19), lks[x], 1 + (int64_t)(x + y) % 9,
                         1 + (int64_t)(2 * x + y) % 11, 1 + (int64_t)(x + 3 * y) % 13, as[y], seed++);
            c.layout = (x + y) % 2;
            c.bias = (x + y) % 3 != 0;
            c.normalize = (x + 2 * y) % 4 == 1;
            run_case(&c);
        }
}

static void mask_matrix(void) {
    uint64_t seed = 100;
    for (int variant = 0; variant < 14; variant++) {
        acase c = mk(4, 1 + variant * 5 % 23, 40 + variant * 11 % 60, 6, 5, 7, 24, seed++);
        c.layout = variant % 2;
        c.bias = 1;
        switch (variant % 7) {
        case 0: c.kvlen = 1; break;
        case 1: c.mask = 1; break;
        case 2: c.causal = 1; break;
        case 3: c.causal = 1; c.align = 1; c.kvlen = 1; break;
        case 4: c.window = 1; c.wl = 5; c.wr = 3; break;
        case 5: c.mask = 1; c.causal = 1; c.kvlen = 1; break;
        case 6: c.window = 1; c.wl = 0; c.wr = -1; c.align = 1; c.normalize = 1; break;
        }
        run_case(&c);
    }
    /* the contract's edge sizes: Lk = 0, A = 0, Dq = 0, Dk = 0, Lq = Lk = 1 */
    acase e[] = {mk(2, 3, 0, 4, 4, 3, 8, 201), mk(2, 3, 5, 4, 4, 3, 0, 202),
                 mk(2, 3, 5, 0, 4, 3, 8, 203), mk(2, 3, 5, 4, 0, 3, 8, 204),
                 mk(1, 1, 1, 1, 1, 1, 1, 205), mk(3, 9, 70, 3, 3, 0, 5, 206)};
    for (size_t x = 0; x < sizeof e / sizeof e[0]; x++) run_case(&e[x]);
}

/* ---- the edge-case contract and bad arguments ------------------------------------------ */

static void edge_contract(void) {
    /* batch 2 has kv_len 0, batch 0 row 0 has an all-false mask: O = +0, LSE = -inf,
     * weights 0, on both paths */
    acase c = mk(3, 4, 20, 3, 3, 5, 9, 300);
    c.kvlen = 1;
    c.mask = 1;
    acall t;
    acall_build(&t, &c);
    for (int path = 0; path < 2; path++) {
        attn_status st = acall_forward(&t, path ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED, 2, 1);
        CHECK(st == ATTN_OK, "edge: status %s", attn_status_string(st));
        int bad = 0;
        for (int64_t b = 0; b < 3; b++)
            for (int64_t i = 0; i < 4; i++) {
                if (!(b == 2 || (b == 0 && i == 0))) continue;
                for (int64_t d = 0; d < 5; d++) {
                    const float x = *view_ptr(&t.o, b, 0, i, d);
                    bad += !(x == 0.0f && !signbit(x));
                }
                bad += t.lseb[b * 4 + i] != -INFINITY;
                for (int64_t j = 0; j < 20; j++) bad += t.wb[(b * 4 + i) * 20 + j] != 0.0f;
            }
        CHECK(bad == 0, "edge (%s): %d values of fully masked rows are not O = +0, LSE = -inf, "
              "weights 0", path ? "reference" : "fused", bad);
    }
    /* a NaN in an unmasked key makes its rows NaN, and only those */
    *view_ptr(&t.k, 1, 0, 3, 1) = NAN;  /* batch 1 has kv_len = Lk */
    t.opt.mask = NULL;
    acall_forward(&t, ATTN_PATH_FUSED, 2, 0);
    int nan_rows = 0, nan_elsewhere = 0;
    for (int64_t b = 0; b < 3; b++)
        for (int64_t i = 0; i < 4; i++) {
            const int isn = isnan(*view_ptr(&t.o, b, 0, i, 0));
            if (b == 1) nan_rows += isn;
            else nan_elsewhere += isn;
        }
    CHECK(nan_rows == 4 && nan_elsewhere == 0, "edge: NaN key: %d of 4 rows NaN, %d NaN elsewhere",
          nan_rows, nan_elsewhere);
    acall_free(&t);
}

static void bad_arguments(void) {
    acase c = mk(2, 3, 5, 4, 6, 3, 8, 400);
    acall t;
    acall_build(&t, &c);
    attn_options opt = {0};
    attn_tensor bias = attn_tensor_4d(t.wb, ATTN_F32, 2, 1, 3, 5);
    struct {
        const char *what;
        attn_status want;
    } cases[] = {
        {"has_scale", ATTN_ERR_UNSUPPORTED},
        {"softcap", ATTN_ERR_UNSUPPORTED},
        {"bias", ATTN_ERR_UNSUPPORTED},
        {"workspace", ATTN_ERR_UNSUPPORTED},
        {"k batch", ATTN_ERR_SHAPE},
        {"heads", ATTN_ERR_SHAPE},
        {"dtype", ATTN_ERR_DTYPE},
        {"units", ATTN_ERR_SHAPE},
        {"g", ATTN_ERR_VALUE},
        {"weights NULL", ATTN_ERR_NULL},
    };
    for (size_t x = 0; x < sizeof cases / sizeof cases[0]; x++) {
        opt = (attn_options){0};
        attn_tensor q = t.q, k = t.k, o = t.o;
        attn_additive_weights wt = t.wt;
        const attn_additive_weights *wp = &wt;
        char ws[16];
        switch (x) {
        case 0: opt.has_scale = true; opt.scale = 1; break;
        case 1: opt.softcap = 5; break;
        case 2: opt.bias = &bias; break;
        case 3: opt.workspace = ws; opt.workspace_bytes = sizeof ws; break;
        case 4: k.shape[0] = 1; break;
        case 5: q.shape[1] = 2; o.shape[1] = 2; break;
        case 6: q.dtype = ATTN_F16; break;
        case 7: wt.units = -1; break;
        case 8: wt.normalize = true; wt.g = NAN; break;
        case 9: wp = NULL; break;
        }
        fill_sentinel(t.ob, 2 * 3 * 6);
        attn_status st = attn_additive_forward(&q, &k, &t.val, wp, &o, &opt);
        CHECK(st == cases[x].want, "bad argument %s: %s, expected %s", cases[x].what,
              attn_status_string(st), attn_status_string(cases[x].want));
        CHECK(count_written(t.ob, 2 * 3 * 6) == 0, "bad argument %s: o was written", cases[x].what);
    }
    float y[3];
    CHECK(attn_additive_tanh(-1, y, y) == ATTN_ERR_SHAPE, "tanh: n < 0 accepted");
    CHECK(attn_additive_tanh(3, NULL, y) == ATTN_ERR_NULL, "tanh: NULL accepted");
    acall_free(&t);
}

/* ---- Luong's forms ------------------------------------------------------------------------ */

static void luong(void) {
    acase c = mk(2, 7, 70, 5, 6, 4, 3, 500);
    c.causal = 1;
    c.align = 1;
    acall t;
    acall_build(&t, &c);
    /* general: e_ij = q_i W k_jᵀ, W [Dq, Dk] */
    float *W = xcalloc(5 * 6, sizeof(float));
    rng_t r = {77};
    for (int x = 0; x < 30; x++) W[x] = (float)rng_range(&r, -0.5, 0.5);
    const int64_t no = 2 * 7 * 4;
    double *o = xcalloc(no, sizeof(double)), *e = xcalloc(70, sizeof(double));
    for (int64_t b = 0; b < 2; b++)
        for (int64_t i = 0; i < 7; i++) {
            double m = -INFINITY, l = 0;
            for (int64_t j = 0; j < 70; j++) {
                e[j] = -INFINITY;
                if (j > i + 70 - 7) continue;  /* causal, bottom-right */
                double s = 0;
                for (int64_t a = 0; a < 5; a++)
                    for (int64_t d = 0; d < 6; d++)
                        s += *view_ptr(&t.q, b, 0, i, a) * (double)W[a * 6 + d] * *view_ptr(&t.k, b, 0, j, d);
                e[j] = s;
                if (s > m) m = s;
            }
            for (int64_t j = 0; j < 70; j++) l += exp(e[j] - m);
            for (int64_t j = 0; j < 70; j++)
                for (int64_t d = 0; d < 4; d++)
                    o[(b * 7 + i) * 4 + d] += exp(e[j] - m) / l * *view_ptr(&t.val, b, 0, j, d);
        }
    fill_sentinel(t.ob, 2 * 7 * 7);
    attn_status st = attn_luong_general_forward(&t.q, &t.k, &t.val, W, &t.o, &t.opt);
    CHECK(st == ATTN_OK, "luong general: %s (%s)", attn_status_string(st), attn_last_error());
    float *got = xcalloc(no, sizeof(float));
    gather_f32(&t.o, got);
    tol_result tr;
    CHECK(within_f32_tol(got, o, no, &tr), "luong general: max_err %.3g rel %.3g", tr.max_err,
          tr.rel_err);
    /* concat is the additive form */
    float *add = xcalloc(no, sizeof(float));
    acall_forward(&t, ATTN_PATH_FUSED, 2, 0);
    gather_f32(&t.o, add);
    fill_sentinel(t.ob, 2 * 7 * 7);
    st = attn_luong_concat_forward(&t.q, &t.k, &t.val, &t.wt, &t.o, &t.opt);
    gather_f32(&t.o, got);
    CHECK(st == ATTN_OK && same_bits(got, add, no), "luong concat differs from additive");
    free(W); free(o); free(e); free(got); free(add);
    acall_free(&t);
}

/* ---- every tolerance check fails on a planted error --------------------------------------- */

static void planted(void) {
    enum { N = 64 };
    double ref[N];
    float got[N], copy[N];
    rng_t r = {9};
    for (int x = 0; x < N; x++) ref[x] = rng_range(&r, -1, 1), got[x] = (float)ref[x];
    CHECK(within_add_tol(got, ref, N, NULL), "planted: the exact answer is rejected");
    memcpy(copy, got, sizeof got);
    copy[5] += 3e-4f;  /* above 1e-4 (1 + max|ref|) */
    CHECK(!within_add_tol(copy, ref, N, NULL), "planted: a 3e-4 error in one element accepted");
    for (int x = 0; x < N; x++) copy[x] = got[x] * (1.0f + 2e-5f);
    CHECK(!within_add_tol(copy, ref, N, NULL), "planted: a 2e-5 scaling accepted");
    memcpy(copy, got, sizeof got);
    copy[9] = NAN;
    CHECK(!within_add_tol(copy, ref, N, NULL), "planted: a NaN accepted");
    memcpy(copy, got, sizeof got);
    copy[0] = nextafterf(copy[0], 2.0f);
    CHECK(!same_bits(copy, got, N), "planted: a 1-ulp change passes the bit comparison");
}

int main(void) {
    if (acall_without_blas()) return check_summary("additive");
    planted();
    static const char *const isas[] = {"generic", "avx2", "avx512"};
    for (int x = 0; x < 3; x++) {
        const attn_additive_kernels *k = ai_additive_kernels_named(isas[x]);
        if (k) test_tanh(k);
        else printf("  %s tanh: skipped, this CPU cannot run it\n", isas[x]);
    }
    shape_matrix();
    mask_matrix();
    edge_contract();
    bad_arguments();
    luong();
    printf("  kernel %s; worst relative error of O: fused %.3g, reference %.3g\n",
           attn_kernel_name(), g_worst_rel[0], g_worst_rel[1]);
    return check_summary("additive");
}
