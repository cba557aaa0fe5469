/*
 * test_dropout_backward.c — dropout on the attention weights, backward: the gradients with
 *                           a mask, 16-bit inputs, and bit-identical thread counts (the
 *                           generator, the layout, the forward and misuse: test_dropout.c).
 *
 * What it covers (numbered as in test_dropout.c):
 *  5. The backward (fused) against the float64 reference's gradients with the same mask,
 *     and that reference against central finite differences of its own forward (the mask
 *     is fixed for a fixed seed and offset, so the forward is smooth in Q, K, V).
 *     16-bit (bfloat16) inputs, DEFAULT and FAST precision, forward and backward, within
 *     1e-2 of the float64 reference on the same values (another offset's mask is not).
 *  6. Bit-identical results (O, weights, dQ, dK, dV) for 1, 2 and 3 threads.
 * The call of a case is tests/support/dropout_case.h, shared with test_dropout.c.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "backward/backward.h"
#include "check.h"
#include "dropout_case.h"
#include "core/half.h"
#include "rng.h"

/* ---- 5. the backward ---------------------------------------------------------------------- */

static double g_bwd_worst_rel[3], g_fd_worst[3];
static const char *const k_grad[3] = {"dq", "dk", "dv"};

static void backward_case(const dcase *c) {
    char desc[400];
    describe(c, desc, sizeof desc);
    dcall t;
    dcall_build(&t, c);
    attn_status st = dcall_forward(&t, ATTN_PATH_FUSED, 0, false);
    if (st == ATTN_OK) st = dcall_backward(&t, ATTN_PATH_FUSED, 0);
    CHECK(st == ATTN_OK, "backward: %s [%s]", attn_last_error(), desc);
    const int64_t n[3] = {n_of(&t.tq), n_of(&t.tk), n_of(&t.tv)};
    const float *got[3] = {t.dq, t.dk, t.dv};
    double *g[3], *g2[3];
    for (int a = 0; a < 3; a++) g[a] = xcalloc(n[a], sizeof(double)), g2[a] = xcalloc(n[a], sizeof(double));
    st = dcall_ref64(&t, 0, NULL, NULL, g, false);
    CHECK(st == ATTN_OK, "ref64 backward: %s [%s]", attn_last_error(), desc);
    dcall_ref64(&t, 1, NULL, NULL, g2, false);  // planted: another offset's mask
    for (int a = 0; a < 3; a++) {
        tol_result r;
        CHECK(within_f32_tol(got[a], g[a], n[a], &r), "backward %s vs reference: rel %.3g max "
              "%.3g (max ref %.3g) [%s]", k_grad[a], r.rel_err, r.max_err, r.max_ref, desc);
        if (r.rel_err > g_bwd_worst_rel[a]) g_bwd_worst_rel[a] = r.rel_err;
        if (rel_frob(g2[a], g[a], n[a]) > 1e-5)  // where the other mask changes the answer
            CHECK(!within_f32_tol(got[a], g2[a], n[a], &r), "planted: %s with another offset's "
                  "mask passed [%s]", k_grad[a], desc);
    }
    for (int a = 0; a < 3; a++) free(g[a]), free(g2[a]);
    dcall_free(&t);
}

static void fd_case(const dcase *c) {
    char desc[400];
    describe(c, desc, sizeof desc);
    dcall t;
    dcall_build(&t, c);
    attn_options f = t.opt;
    f.path = ATTN_PATH_REFERENCE, f.threads = 1;
    attn_params p, p_other;
    attn_status st = ai_params_init(&p, &t.tq, &t.tk, &t.tv, &t.to, &f, true);
    f.dropout_offset++;
    if (st == ATTN_OK) st = ai_params_init(&p_other, &t.tq, &t.tk, &t.tv, &t.to, &f, true);
    CHECK(st == ATTN_OK, "fd params: %s", attn_last_error());
    const int64_t n[3] = {n_of(&t.tq), n_of(&t.tk), n_of(&t.tv)}, no = n_of(&t.to);
    double *x[3] = {to_double(t.q, n[0]), to_double(t.k, n[1]), to_double(t.v, n[2])};
    double *d_o = to_double(t.d_o, no), *o = xcalloc(no, sizeof(double));
    double *g[3], *fd[3], *g_other[3];
    for (int a = 0; a < 3; a++) {
        g[a] = xcalloc(n[a], sizeof(double)), fd[a] = xcalloc(n[a], sizeof(double));
        g_other[a] = xcalloc(n[a], sizeof(double));
    }
    ai_ref64_backward(&p, x[0], x[1], x[2], d_o, g[0], g[1], g[2], false);
    ai_ref64_backward(&p_other, x[0], x[1], x[2], d_o, g_other[0], g_other[1], g_other[2], false);
    for (int a = 0; a < 3; a++) {
        fd_grad(&p, x[0], x[1], x[2], d_o, o, no, x[a], n[a], fd[a]);  // fd64.h
        const double err = rel_frob(g[a], fd[a], n[a]);
        CHECK(err < 1e-6, "fd: %s relative error %.3g >= 1e-6 [%s]", k_grad[a], err, desc);
        if (err > g_fd_worst[a]) g_fd_worst[a] = err;
        /* planted: the gradient of another mask is far from these differences */
        const double other = rel_frob(g_other[a], fd[a], n[a]);
        CHECK(other >= 1e-6, "planted: fd of %s accepts another offset's gradient (%.3g) [%s]",
              k_grad[a], other, desc);
    }
    for (int a = 0; a < 3; a++) free(x[a]), free(g[a]), free(fd[a]), free(g_other[a]);
    free(d_o), free(o);
    dcall_free(&t);
}

static void backward(void) {
    static const int64_t shapes[][7] = {
        {1, 1, 1, 1, 3, 4, 4},      {1, 2, 1, 5, 7, 8, 6},     {2, 2, 2, 17, 63, 16, 12},
        {1, 4, 2, 64, 65, 32, 32},  {2, 2, 1, 100, 130, 16, 8}, {1, 2, 1, 3, 300, 16, 16},
    };
    static const float ps[] = {0.2f, 0.6f};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t a = 0; a < 2; a++)
            for (int f = 0; f < 4; f++) {
                const int64_t *x = shapes[s];
                dcase c = {x[0], x[1], x[2], x[3], x[4], x[5], x[6], .p = ps[a],
                           .seed = 500 + s, .offset = (uint64_t)f};
                if (f == 1) c.causal = 1, c.align = 1;
                if (f == 2) c.kvlen = 1, c.window = 1, c.wl = 5, c.wr = 2;
                if (f == 3) c.mask = 1;
                backward_case(&c);
            }
    /* finite differences on small shapes (float64 throughout) */
    static const int64_t fd_shapes[][7] = {
        {1, 1, 1, 3, 5, 4, 3}, {1, 2, 1, 4, 6, 3, 5}, {2, 2, 2, 2, 9, 4, 4},
    };
    for (size_t s = 0; s < sizeof fd_shapes / sizeof fd_shapes[0]; s++)
        for (int f = 0; f < 3; f++) {
            const int64_t *x = fd_shapes[s];
            dcase c = {x[0], x[1], x[2], x[3], x[4], x[5], x[6], .p = 0.4f, .seed = 40 + s,
                       .offset = (uint64_t)f};
            if (f == 1) c.causal = 1;
            if (f == 2) c.mask = 1;
            fd_case(&c);
        }
    printf("backward: worst relative error vs reference dq %.3g dk %.3g dv %.3g; reference vs "
           "finite differences dq %.3g dk %.3g dv %.3g\n", g_bwd_worst_rel[0], g_bwd_worst_rel[1],
           g_bwd_worst_rel[2], g_fd_worst[0], g_fd_worst[1], g_fd_worst[2]);
}

/* 16-bit inputs: bfloat16 K and V (DEFAULT and FAST precision) and a bfloat16 query, the
 * forward and the backward (the 16-bit backward runs the float32 one on copies, with the
 * forward's options) against the float64 reference on the same 16-bit values, with the
 * same mask. Tolerance: the float32 contract for the DEFAULT forward (float32 output of
 * exactly widened inputs), and 1e-2 relative Frobenius for all (bfloat16 has 8 bits: FAST
 * rounds P to it, the gradients are rounded to it; measured 1.4e-3 and 1.7e-3), which the
 * next offset's mask exceeds (measured 0.68 to 0.79). */
static void half_inputs(void) {
    const dcase c = {1, 4, 2, 40, 150, 32, 32, .causal = 1, .p = 0.3f, .seed = 21, .offset = 2};
    dcall t;
    dcall_build(&t, &c);
    /* the float32 values rounded to bfloat16, so that the reference sees the same inputs */
    float *xs[] = {t.q, t.k, t.v, t.d_o};
    const int64_t ns[] = {n_of(&t.tq), n_of(&t.tk), n_of(&t.tv), n_of(&t.tdo)};
    uint16_t *h[4];
    for (int a = 0; a < 4; a++) {
        h[a] = xcalloc(ns[a], sizeof(uint16_t));
        for (int64_t e = 0; e < ns[a]; e++) {
            h[a][e] = attn_f32_to_bf16(xs[a][e]);
            xs[a][e] = attn_bf16_to_f32(h[a][e]);
        }
    }
    const int64_t no = n_of(&t.to);
    double *o = xcalloc(no, sizeof(double)), *o2 = xcalloc(no, sizeof(double));
    dcall_ref64(&t, 0, o, NULL, NULL, false);
    dcall_ref64(&t, 1, o2, NULL, NULL, false);
    attn_tensor hq = t.tq, hk = t.tk, hv = t.tv, hdo = t.tdo, hdq = t.tdq, hdk = t.tdk, hdv = t.tdv;
    hq.dtype = hk.dtype = hv.dtype = hdo.dtype = hdq.dtype = hdk.dtype = hdv.dtype = ATTN_BF16;
    hq.data = h[0], hk.data = h[1], hv.data = h[2], hdo.data = h[3];
    uint16_t *hg[3] = {xcalloc(ns[0], 2), xcalloc(ns[1], 2), xcalloc(ns[2], 2)};
    hdq.data = hg[0], hdk.data = hg[1], hdv.data = hg[2];
    for (int prec = 0; prec < 2; prec++)
        for (int qhalf = 0; qhalf < 2; qhalf++) {
            attn_options o_ = t.opt;
            o_.precision = prec ? ATTN_PRECISION_FAST : ATTN_PRECISION_DEFAULT;
            o_.lse = &t.tlse;
            attn_status st = attn_forward(qhalf ? &hq : &t.tq, &hk, &hv, &t.to, &o_);
            CHECK(st == ATTN_OK, "16-bit forward: %s", attn_last_error());
            double *od = to_double(t.o, no);
            const double err = rel_frob(od, o, no), err2 = rel_frob(od, o2, no);
            tol_result r;
            if (!prec)  // float32 P·V on exactly widened inputs: the float32 contract
                CHECK(within_f32_tol(t.o, o, no, &r), "16-bit forward (default, bf16 q %d): "
                      "rel %.3g max %.3g", qhalf, r.rel_err, r.max_err);
            CHECK(err < 1e-2 && err2 >= 1e-2, "16-bit forward (precision %d, bf16 q %d): error "
                  "%.3g, against another mask %.3g", prec, qhalf, err, err2);
            printf("16-bit forward (precision %s, %s query): error %.3g (another mask: %.3g)\n",
                   prec ? "fast" : "default", qhalf ? "bfloat16" : "float32", err, err2);
            free(od);
        }
    /* the backward, every tensor bfloat16 (O recomputed in float32 by the library) */
    double *g[3], *g2[3];
    for (int a = 0; a < 3; a++) g[a] = xcalloc(ns[a], sizeof(double)), g2[a] = xcalloc(ns[a], sizeof(double));
    dcall_ref64(&t, 0, NULL, NULL, g, false);
    dcall_ref64(&t, 1, NULL, NULL, g2, false);
    attn_tensor ho = t.to;
    ho.dtype = ATTN_BF16;
    uint16_t *oh = xcalloc(no, 2);
    for (int64_t e = 0; e < no; e++) oh[e] = attn_f32_to_bf16(t.o[e]);
    ho.data = oh;
    attn_status st = attn_backward(&hq, &hk, &hv, &ho, &hdo, &t.tlse, &hdq, &hdk, &hdv, &t.opt);
    CHECK(st == ATTN_OK, "16-bit backward: %s", attn_last_error());
    for (int a = 0; a < 3; a++) {
        double *gd = xcalloc(ns[a], sizeof(double));
        for (int64_t e = 0; e < ns[a]; e++) gd[e] = attn_bf16_to_f32(hg[a][e]);
        const double err = rel_frob(gd, g[a], ns[a]), err2 = rel_frob(gd, g2[a], ns[a]);
        CHECK(err < 1e-2 && err2 >= 1e-2, "16-bit backward %s: error %.3g, against another "
              "mask %.3g", k_grad[a], err, err2);
        printf("16-bit backward %s: error %.3g (another mask: %.3g)\n", k_grad[a], err, err2);
        free(gd), free(g[a]), free(g2[a]), free(hg[a]);
    }
    for (int a = 0; a < 4; a++) free(h[a]);
    free(oh), free(o), free(o2);
    dcall_free(&t);
}

/* ---- 6. threads --------------------------------------------------------------------------- */

static void threads(void) {
    static const dcase cases[] = {
        {2, 4, 2, 100, 300, 16, 16, .p = 0.3f, .seed = 5, .offset = 1},
        {1, 2, 1, 2, 5000, 16, 16, .p = 0.5f, .seed = 6},  // the split-key path
        {1, 4, 1, 70, 90, 8, 8, .causal = 1, .mask = 1, .p = 0.7f, .seed = 7},
    };
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        dcall t;
        dcall_build(&t, &cases[s]);
        const int64_t no = n_of(&t.to), nw = n_of(&t.tw), n[3] = {n_of(&t.tq), n_of(&t.tk), n_of(&t.tv)};
        float *saved[5] = {0};
        int differ = 0;
        for (int th = 1; th <= 3; th++) {
            /* the weights only where they do not disable the split (cases 0 and 2) */
            attn_status st = dcall_forward(&t, ATTN_PATH_FUSED, th, s != 1);
            if (st == ATTN_OK) st = dcall_backward(&t, ATTN_PATH_FUSED, th);
            CHECK(st == ATTN_OK, "threads %d: %s", th, attn_last_error());
            float *now[5] = {t.o, t.w, t.dq, t.dk, t.dv};
            const int64_t sz[5] = {no, s != 1 ? nw : 0, n[0], n[1], n[2]};
            for (int a = 0; a < 5; a++) {
                if (th == 1) {
                    saved[a] = xcalloc(sz[a], sizeof(float));
                    memcpy(saved[a], now[a], (size_t)sz[a] * sizeof(float));
                } else {
                    differ += memcmp(saved[a], now[a], (size_t)sz[a] * sizeof(float)) != 0;
                }
            }
        }
        CHECK(differ == 0, "threads: case %zu differs between 1, 2 and 3 threads (%d arrays)", s, differ);
        for (int a = 0; a < 5; a++) free(saved[a]);
        dcall_free(&t);
    }
}

int main(void) {
    backward();
    half_inputs();
    threads();
    return check_summary("test_dropout_backward");
}
