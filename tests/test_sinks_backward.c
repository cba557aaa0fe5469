/*
 * test_sinks_backward.c — attention sinks (attn_options.sinks and d_sinks), backward: the
 *                         gradients against finite differences of the test's own oracle
 *                         (tests/support/sinks_case.h, shared with test_sinks.c, which
 *                         covers the forward and misuse).
 *
 * What it covers (numbered as in test_sinks.c):
 *  3. The backward (fused and reference, float32 and a bfloat16 call) against central
 *     finite differences of the oracle for dQ, dK, dV and d_sinks; d_sinks bit-identical
 *     for 1 and 2 threads; empty sizes (Lk = 0: O = 0, LSE = sink; d_sinks = 0).
 *  5. The gradients' tolerance check rejects a planted error in each gradient.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "oracle.h"
#include "sinks_case.h"

/* the largest relative Frobenius errors of the gradients seen (printed at the end) */
static double g_worst_grad[4];

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

/* ---- 5: the gradients' check rejects planted errors ----------------------------------- */

static void test_planted(void) {
    const sk_case b = {2, 4, 2, 9, 13, 8, 6, false, 0, NULL, 0, false, ATTN_F32, ATTN_F32, -1, 2, 40};
    for (int a = 0; a < 4; a++)
        CHECK(backward_case(b, ATTN_PATH_FUSED, a, "planted") == 3,
              "planted: gradient %d one element off by 1e-5 of its norm is accepted", a);
}

int main(void) {
    printf("test_sinks_backward: kernel %s\n", attn_kernel_name());
    test_backward();
    printf("test_sinks_backward: gradients against finite differences, worst relative error: "
           "dq %.3g, dk %.3g, dv %.3g, d_sinks %.3g\n", g_worst_grad[0], g_worst_grad[1],
           g_worst_grad[2], g_worst_grad[3]);
    test_threads();
    test_empty();
    test_planted();
    return check_summary("test_sinks_backward");
}
