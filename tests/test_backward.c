/*
 * test_backward.c — attn_backward: the float64 reference against finite differences,
 *                   the fused path against the reference, and the backward's promises.
 *
 * What it covers:
 *  1. The reference's float64 gradients (ai_ref64_backward) against central finite
 *     differences of its float64 forward (ai_ref64_forward), on small shapes with every
 *     feature: scale, softcap, bool mask, bias with -inf, causal under both alignments
 *     with Lq < Lk and Lq > Lk, windows, kv_len (0 included), ALiBi, GQA, Dk != Dv.
 *     Relative Frobenius error under 1e-6 per gradient. The float64 forward differenced
 *     is itself the tests' oracle's (oracle.h) to 1e-12, so the two cannot share a
 *     misreading of the contract.
 *  2. The fused path (float32) against the reference's float64 gradients over a matrix of
 *     sizes (L up to 300 around the tiles), head widths, GQA 1/2/4, every mask alone and
 *     combined, windows, kv_len, ALiBi, softcap, the [B, L, H, D] layout and K/V views of
 *     a larger NaN-filled cache: the contract's float32 tolerance (check.h). The public
 *     reference path must equal the float64 gradients rounded, bit for bit.
 *  3. Every tolerance check rejects a planted error.
 * What it is not: a test of the forward (test_forward.c), of the micro-kernels alone
 * (test_kernels.c), or of the backward's masked rows, poisoned keys, determinism and
 * misuse (test_backward_edge.c). The kernel is chosen by ATTN_ISA, as for the forward suites.
 */

#include "backward_case.h"

/* worst errors seen, reported at the end */
static double g_fd_worst[3], g_fused_worst[3], g_fused_maxerr_rel[3], g_mag_worst[3], g_cancel_worst[3];
static int g_cancel_cases;
static double g_ref64_worst;  // ai_ref64_forward against the oracle

/* ---- 1. the reference against finite differences ----------------------------------- */

/* fd_loss and fd_grad: tests/support/fd64.h */

/* the FD comparison: relative Frobenius error under 1e-6 */
static int fd_accepts(const double *got, const double *fd, int64_t n, double *err) {
    *err = rel_frob(got, fd, n);
    return *err < 1e-6;
}

/* max |a - b| / (1 + max |b|) over n values, 0 where both are the same infinity; NaN
 * anywhere else is an error of +inf */
static double max_rel(const double *a, const double *b, int64_t n) {
    double err = 0, mag = 0;
    for (int64_t e = 0; e < n; e++) {
        if (a[e] == b[e]) continue;
        const double d = fabs(a[e] - b[e]);
        err = d == d && d > err ? d : d == d ? err : INFINITY;
        if (isfinite(b[e]) && fabs(b[e]) > mag) mag = fabs(b[e]);
    }
    return err / (1.0 + mag);
}

/* The finite differences below difference ai_ref64_forward, the library's own float64
 * forward: it must be the contract too. Its O and LSE against the tests' oracle
 * (oracle.h, written from the contract without the library's code) on the same float
 * values: both are float64 sums of the same terms, so they agree to rounding (1e-12). */
static void ref64_against_oracle(const bcase *c, const attn_params *p, const attn_options *opt,
                                 double *const x[3], const char *desc) {
    const int64_t nq = c->B * c->Hq * c->Lq * c->Dk, nk = c->B * c->Hkv * c->Lk * c->Dk;
    const int64_t nv = c->B * c->Hkv * c->Lk * c->Dv, no = c->B * c->Hq * c->Lq * c->Dv;
    const int64_t nl = c->B * c->Hq * c->Lq, n[3] = {nq, nk, nv};
    float *f[3];
    for (int a = 0; a < 3; a++) {
        f[a] = xcalloc(n[a], sizeof(float));
        for (int64_t e = 0; e < n[a]; e++) f[a][e] = (float)x[a][e];
    }
    attn_tensor tq = attn_tensor_4d(f[0], ATTN_F32, c->B, c->Hq, c->Lq, c->Dk);
    attn_tensor tk = attn_tensor_4d(f[1], ATTN_F32, c->B, c->Hkv, c->Lk, c->Dk);
    attn_tensor tv = attn_tensor_4d(f[2], ATTN_F32, c->B, c->Hkv, c->Lk, c->Dv);
    double *o = xcalloc(no, sizeof(double)), *lse = xcalloc(nl, sizeof(double));
    double *oo = xcalloc(no, sizeof(double)), *olse = xcalloc(nl, sizeof(double));
    CHECK(ai_ref64_forward(p, x[0], x[1], x[2], o, lse) == ATTN_OK, "ref64 forward [%s]", desc);
    /* the library keeps its scale in float32 (1/sqrt(Dk) rounded), the oracle's default is
     * the double 1/sqrt(Dk): handed the library's float, the two agree to 1e-16 instead of
     * 1e-9, and a wrong mask or logit rule stands out */
    attn_options same = *opt;
    same.has_scale = true;
    same.scale = p->scale;
    oracle_forward(&tq, &tk, &tv, &same, oo, olse, NULL);
    const double eo = max_rel(o, oo, no), el = max_rel(lse, olse, nl);
    CHECK(eo <= 1e-12 && el <= 1e-12, "ref64 forward vs the oracle: O %.3g, LSE %.3g [%s]", eo, el, desc);
    if (eo > g_ref64_worst) g_ref64_worst = eo;
    if (el > g_ref64_worst) g_ref64_worst = el;
    for (int a = 0; a < 3; a++) free(f[a]);
    free(o), free(lse), free(oo), free(olse);
}

static void fd_case(const bcase *c) {
    if (test_case_skipped()) return;
    char desc[512];
    describe(c, desc, sizeof desc);
    rng_t r = {c->seed * 0x9e3779b97f4a7c15ULL + 7};
    opt_store s;
    attn_options opt;
    build_options(c, &r, &s, &opt);
    opt.threads = 1;
    opt.path = ATTN_PATH_REFERENCE;

    const int64_t nq = c->B * c->Hq * c->Lq * c->Dk, nk = c->B * c->Hkv * c->Lk * c->Dk;
    const int64_t nv = c->B * c->Hkv * c->Lk * c->Dv, no = c->B * c->Hq * c->Lq * c->Dv;
    attn_tensor tq = attn_tensor_4d(NULL, ATTN_F32, c->B, c->Hq, c->Lq, c->Dk);
    attn_tensor tk = attn_tensor_4d(NULL, ATTN_F32, c->B, c->Hkv, c->Lk, c->Dk);
    attn_tensor tv = attn_tensor_4d(NULL, ATTN_F32, c->B, c->Hkv, c->Lk, c->Dv);
    attn_tensor to = attn_tensor_4d(NULL, ATTN_F32, c->B, c->Hq, c->Lq, c->Dv);
    attn_params p;
    attn_status st = ai_params_init(&p, &tq, &tk, &tv, &to, &opt, false);
    CHECK(st == ATTN_OK, "fd: params: %s [%s]", attn_last_error(), desc);
    if (st != ATTN_OK) {
        free_options(&s);
        return;
    }
    const double amp = c->amp > 0 ? c->amp : 1.0;
    double *x[3], *grad[3], *fd[3], *d_o = xcalloc(no, sizeof(double)), *o = xcalloc(no, sizeof(double));
    const int64_t n[3] = {nq, nk, nv};
    for (int a = 0; a < 3; a++) {
        x[a] = xcalloc(n[a], sizeof(double));
        grad[a] = xcalloc(n[a], sizeof(double));
        fd[a] = xcalloc(n[a], sizeof(double));
        /* float values, so that the tests' own oracle (float32 inputs) sees the same ones */
        for (int64_t e = 0; e < n[a]; e++) x[a][e] = (float)(amp * rng_sym(&r));
    }
    for (int64_t e = 0; e < no; e++) d_o[e] = rng_sym(&r);
    ref64_against_oracle(c, &p, &opt, x, desc);

    st = ai_ref64_backward(&p, x[0], x[1], x[2], d_o, grad[0], grad[1], grad[2], false);
    CHECK(st == ATTN_OK, "fd: backward status %d [%s]", (int)st, desc);
    for (int a = 0; a < 3; a++) {
        fd_grad(&p, x[0], x[1], x[2], d_o, o, no, x[a], n[a], fd[a]);
        double err;
        const int ok = fd_accepts(grad[a], fd[a], n[a], &err);
        CHECK(ok, "fd: %s relative error %.3g >= 1e-6 [%s]", k_grad[a], err, desc);
        if (err > g_fd_worst[a]) g_fd_worst[a] = err;
    }
    for (int a = 0; a < 3; a++) {
        free(x[a]); free(grad[a]); free(fd[a]);
    }
    free(d_o); free(o);
    free_options(&s);
}

static void finite_differences(void) {
    /* shapes: Lq < Lk and Lq > Lk, GQA 1 and 2 and 4, Dk != Dv */
    static const int64_t shapes[][7] = {
        {1, 1, 1, 4, 6, 3, 2}, {2, 2, 1, 6, 4, 2, 3}, {1, 4, 1, 3, 5, 4, 4}, {2, 2, 2, 5, 5, 1, 3},
    };
    for (int f = 0; f < 21; f++)
        for (int si = 0; si < 4; si++) {
            if ((f + si) % 2 && f > 2) continue;  // half of the pairs beyond the first features
            const int64_t *sh = shapes[si];
            bcase c = base(sh[0], sh[1], sh[2], sh[3], sh[4], sh[5], sh[6]);
            switch (f) {
            case 0: break;
            case 1: c.has_scale = 1; c.scale = -0.7f; break;
            case 2: c.softcap = 0.8f; c.has_scale = 1; c.scale = 1.5f; c.amp = 1.5; break;
            case 3: c.mask = 1; c.mshape = 7; c.mask_true = 0.6; c.empty_rows = 1; break;
            case 4: c.mask = 2; c.mshape = 5; c.bias_ninf = 0.25; break;
            case 5: c.mask = 3; c.mshape = 4; c.bias_ninf = 0.2; c.mask_true = 0.7; break;
            case 6: c.causal = 1; break;
            case 7: c.causal = 1; c.align = 1; break;
            case 8: c.window = 1; c.wl = 1; c.wr = 1; break;
            case 9: c.window = 1; c.wl = 0; c.wr = -1; break;  // the reversed mask
            case 10: c.window = 1; c.wl = 2; c.wr = 0; c.align = 1; break;
            case 11: c.kvlen = 1; break;
            case 12: c.kvlen = 2; c.kvlen_fixed = 0; break;
            case 13: c.kvlen = 1; c.causal = 1; c.align = 1; break;
            case 14: c.alibi = 1; break;
            case 15: c.alibi = 1; c.align = 1; c.causal = 1; break;
            case 16: c.softcap = 2.0f; c.mask = 3; c.mshape = 7; c.bias_ninf = 0.1; c.alibi = 1; break;
            case 17: c.causal = 1; c.window = 1; c.wl = 1; c.wr = 0; c.kvlen = 2; c.align = 1; break;
            case 18: c.amp = 3.0; break;  // peaked softmax
            case 19: c.has_scale = 1; c.scale = 0.0f; break;
            default:  // everything at once
                c.softcap = 1.2f; c.mask = 3; c.mshape = 3; c.bias_ninf = 0.1; c.alibi = 1;
                c.causal = 1; c.align = 1; c.window = 1; c.wl = 2; c.wr = -1; c.kvlen = 1;
                c.has_scale = 1; c.scale = 0.9f;
                break;
            }
            fd_case(&c);
        }
}

/* ---- 2. the fused path against the reference ----------------------------------------- */

static int g_cases;

/* one case: the forward, the float64 gradients, the reference path (bit-equal to them
 * rounded), the fused path (within tolerance) */
static void run_case(const bcase *c) {
    if (test_case_skipped()) return;
    bcall t;
    bcall_build(&t, c);
    attn_status st = bcall_forward(&t);
    CHECK(st == ATTN_OK, "forward: %s [%s]", attn_last_error(), t.desc);
    st = bcall_reference(&t, false);
    CHECK(st == ATTN_OK, "ref64: status %d [%s]", (int)st, t.desc);

    st = bcall_run(&t, ATTN_PATH_REFERENCE, 0);
    CHECK(st == ATTN_OK, "reference path: %s: %s [%s]", attn_status_string(st), attn_last_error(), t.desc);
    int64_t mism = 0;
    for (int a = 0; a < 3; a++)
        for (int64_t e = 0; e < t.n[a]; e++) {
            const float want = (float)t.ref[a][e];
            mism += memcmp(&want, &t.got[a][e], 4) != 0;
        }
    CHECK(mism == 0, "reference path: %lld gradients differ from the float64 ones rounded [%s]",
          (long long)mism, t.desc);

    st = bcall_run(&t, ATTN_PATH_FUSED, 0);
    CHECK(st == ATTN_OK, "fused: %s: %s [%s]", attn_status_string(st), attn_last_error(), t.desc);
    /* the magnitudes cost a third reference run: only when a gradient needs them (or
     * ATTN_TEST_STATS is set, for the error-to-magnitude figures of docs/TRAINING.md) */
    bool need_mag = getenv("ATTN_TEST_STATS") != NULL;
    for (int a = 0; a < 3; a++) need_mag |= !within_f32_tol(t.got[a], t.ref[a], t.n[a], NULL);
    if (need_mag) CHECK(bcall_reference(&t, true) == ATTN_OK, "ref64 magnitudes failed");
    for (int a = 0; a < 3; a++) {
        tol_result r;
        int cancel;
        double ratio;
        const int ok = grad_within_tol(t.got[a], t.ref[a], t.have_mag ? t.mag[a] : NULL, t.n[a],
                                       t.have_mag ? grad_eps(&t, a) : 0, &r, &cancel, &ratio);
        CHECK(ok, "fused %s: rel %.3g max_err %.3g (max|ref| %.3g) nonfinite %d worst %lld; "
              "%.3g of the derived bound [%s]",
              k_grad[a], r.rel_err, r.max_err, r.max_ref, r.nonfinite_mismatch,
              (long long)r.worst, ratio, t.desc);
        if (!ok && r.worst >= 0)
            fprintf(stderr, "     worst %s[%lld]: got %.9g want %.9g\n", k_grad[a],
                    (long long)r.worst, (double)t.got[a][r.worst], t.ref[a][r.worst]);
        double num = 0, dm = 0;
        for (int64_t e = 0; e < t.n[a]; e++) {
            num += (t.got[a][e] - t.ref[a][e]) * (t.got[a][e] - t.ref[a][e]);
            dm += t.mag[a][e] * t.mag[a][e];
        }
        const double relmag = dm > 0 ? sqrt(num / dm) : 0;
        if (t.have_mag && relmag > g_mag_worst[a]) g_mag_worst[a] = relmag;
        if (cancel) {
            g_cancel_cases++;
            if (ratio > g_cancel_worst[a]) g_cancel_worst[a] = ratio;
        } else {
            if (r.rel_err > g_fused_worst[a]) g_fused_worst[a] = r.rel_err;
            const double mrel = r.max_err / (1.0 + r.max_ref);
            if (mrel > g_fused_maxerr_rel[a]) g_fused_maxerr_rel[a] = mrel;
        }
    }
    const int64_t out = outside_written(&t);
    CHECK(out == 0, "fused: %lld floats written outside the gradient views [%s]", (long long)out, t.desc);
    g_cases++;
    bcall_free(&t);
}

static const int64_t k_L[] = {1, 2, 3, 17, 63, 64, 65, 127, 128, 129, 300};
#define N_L ((int)(sizeof k_L / sizeof k_L[0]))
static const int64_t k_D[][2] = {{1, 1}, {3, 3}, {8, 8}, {64, 64}, {80, 80}, {128, 128},
                                 {64, 128}, {128, 64}, {3, 80}, {80, 8}};
#define N_D ((int)(sizeof k_D / sizeof k_D[0]))

static void sizes(void) {
    for (int li = 0; li < N_L; li++)
        for (int di = 0; di < N_D; di++) {
            if ((li + di) % 3) continue;
            const int64_t L = k_L[li], Dk = k_D[di][0], Dv = k_D[di][1];
            bcase c = base(1, 2, 1, L, L, Dk, Dv);
            run_case(&c);
            c = base(2, 2, 2, L, k_L[(li + di + 4) % N_L], Dk, Dv);  // Lq != Lk
            c.causal = (li + di) % 2;
            c.align = (li / 2) % 2;
            run_case(&c);
        }
    /* a few larger ones: key chunks and query blocks beyond one tile each way */
    bcase c = base(1, 1, 1, 300, 300, 64, 64);
    c.causal = 1;
    run_case(&c);
    c = base(1, 4, 1, 129, 300, 80, 64);
    c.causal = 1; c.align = 1;
    run_case(&c);
    c = base(1, 2, 2, 300, 65, 8, 128);
    c.mask = 2; c.mshape = 4; c.bias_ninf = 0.05;
    run_case(&c);
    c = base(1, 2, 1, 17, 33, 0, 8);  // Dk = 0: logits 0, only dv
    run_case(&c);
}

static void gqa(void) {
    static const int ratios[] = {1, 2, 4};
    for (int ri = 0; ri < 3; ri++)
        for (int64_t hkv = 1; hkv <= 2; hkv++) {
            const int64_t hq = ratios[ri] * hkv;
            bcase c = base(2, hq, hkv, 17, 65, 8, 3);
            run_case(&c);
            c = base(1, hq, hkv, 65, 64, 64, 80);
            c.causal = 1; c.align = (int)(hkv & 1);
            run_case(&c);
            c = base(3, hq, hkv, 1, 129, 128, 64);
            c.kvlen = 1; c.alibi = 1; c.mask = 1; c.mshape = 3;
            run_case(&c);
        }
}

/* feature f applied to c; 0 past the end of the list */
static int feature(bcase *c, int f) {
    static const int mshapes[] = {0, 1, 2, 4, 5, 7};
    static const int64_t wins[][2] = {{0, 0}, {3, -1}, {-1, 2}, {5, 5}, {0, -1}, {40, 7}};
    const int nm = 6, nw = 6;
    int i = f;
    if (i < nm) { c->mask = 1; c->mshape = mshapes[i]; c->empty_rows = i == 5; return 1; }
    i -= nm;
    if (i < nm) { c->mask = 2; c->mshape = mshapes[i]; c->bias_ninf = 0.1; return 1; }
    i -= nm;
    if (i < 3) { c->mask = 3; c->mshape = mshapes[3 + i]; c->bias_ninf = 0.2; c->mask_true = 0.6; return 1; }
    i -= 3;
    if (i < 2) { c->causal = 1; c->align = i; return 1; }
    i -= 2;
    if (i < 2 * nw) {
        c->window = 1; c->wl = wins[i / 2][0]; c->wr = wins[i / 2][1];
        c->align = i & 1; c->causal = (i / 2) % 2;
        return 1;
    }
    i -= 2 * nw;
    switch (i) {
    case 0: c->kvlen = 1; return 1;
    case 1: c->kvlen = 2; c->kvlen_fixed = 0; return 1;
    case 2: c->kvlen = 2; c->kvlen_fixed = c->Lk; return 1;
    case 3: c->kvlen = 1; c->align = 1; c->causal = 1; return 1;
    case 4: c->alibi = 1; return 1;
    case 5: c->alibi = 1; c->align = 1; c->causal = 1; return 1;
    case 6: c->softcap = 5.0f; return 1;
    case 7: c->softcap = 0.7f; c->has_scale = 1; c->scale = (float)(3.0 / sqrt((double)c->Dk)); return 1;
    case 8: c->has_scale = 1; c->scale = 0.0f; return 1;
    case 9: c->has_scale = 1; c->scale = (float)(-0.3 / sqrt((double)c->Dk)); return 1;
    case 10: c->has_scale = 1; c->scale = (float)(2.0 / sqrt((double)c->Dk)); return 1;
    case 11: c->layout = 1; return 1;
    case 12: c->cache = 1; return 1;
    case 13: c->cache = 1; c->layout = 1; c->kvlen = 2; return 1;
    case 14:  // everything at once
        c->softcap = 3.0f; c->mask = 3; c->mshape = 7; c->bias_ninf = 0.1; c->alibi = 1;
        c->causal = 1; c->align = 1; c->window = 1; c->wl = 20; c->wr = -1; c->kvlen = 1;
        c->layout = 1; c->cache = 1;
        return 1;
    }
    return 0;
}

static void features(void) {
    static const int64_t shapes[][7] = {
        {2, 4, 2, 17, 65, 8, 3},     /* Lq < Lk */
        {3, 2, 1, 65, 17, 64, 80},   /* Lq > Lk */
        {1, 2, 2, 64, 64, 80, 80},   /* square, one tile */
        {1, 2, 1, 129, 127, 3, 128}, /* across tiles both ways */
    };
    for (int f = 0;; f++) {
        bcase probe = base(1, 1, 1, 1, 1, 1, 1);
        if (!feature(&probe, f)) break;
        for (int si = 0; si < 4; si++) {
            if (si == 3 && f % 3) continue;
            const int64_t *sh = shapes[si];
            bcase c = base(sh[0], sh[1], sh[2], sh[3], sh[4], sh[5], sh[6]);
            feature(&c, f);
            run_case(&c);
        }
    }
}

/* ---- 3. every check rejects a planted error ---------------------------------------------- */

/* grad_within_tol's cancellation rule alone (the contract's relative rule skipped) */
static int derived_only(const float *g, const bcall *t, int a, double eps) {
    for (int64_t e = 0; e < t->n[a]; e++)
        if (!(fabs(g[e] - t->ref[a][e]) <= eps * t->mag[a][e] + 0x1p-126)) return 0;
    return 1;
}

static void planted_errors(void) {
    /* the FD comparison: a gradient one element off by 1e-5 of its norm is rejected */
    {
        double g[50], fd[50], err, norm = 0;
        rng_t r = {42};
        for (int e = 0; e < 50; e++) {
            fd[e] = rng_sym(&r);
            norm += fd[e] * fd[e];
        }
        norm = sqrt(norm);
        memcpy(g, fd, sizeof g);
        CHECK(fd_accepts(g, fd, 50, &err), "planted: an exact gradient is rejected by the FD check");
        g[17] += 1e-5 * norm;
        CHECK(!fd_accepts(g, fd, 50, &err), "planted: the FD check accepts an error of 1e-5 (%.3g)", err);
        memcpy(g, fd, sizeof g);
        g[17] += 0.5e-6 * norm;
        CHECK(fd_accepts(g, fd, 50, &err), "planted: the FD check rejects an error of 5e-7");
        /* a gradient with its sign flipped, or scaled by 1 + 2e-6 */
        for (int e = 0; e < 50; e++) g[e] = -fd[e];
        CHECK(!fd_accepts(g, fd, 50, &err), "planted: the FD check accepts a flipped sign");
        for (int e = 0; e < 50; e++) g[e] = fd[e] * (1 + 2e-6);
        CHECK(!fd_accepts(g, fd, 50, &err), "planted: the FD check accepts a 2e-6 scaling");
    }
    /* the fused-vs-reference tolerance, on a real case */
    bcase c = base(2, 2, 1, 65, 70, 32, 32);
    c.causal = 1; c.kvlen = 1;
    bcall t;
    bcall_build(&t, &c);
    CHECK(bcall_forward(&t) == ATTN_OK && bcall_reference(&t, false) == ATTN_OK &&
              bcall_run(&t, ATTN_PATH_FUSED, 0) == ATTN_OK, "planted: the base case failed");
    for (int a = 0; a < 3; a++) {
        const int64_t n = t.n[a];
        float *g = xcalloc(n, 4);
        tol_result r;
        CHECK(within_f32_tol(t.got[a], t.ref[a], n, &r), "planted: the unperturbed %s is rejected", k_grad[a]);
        int64_t big = 0;
        for (int64_t e = 0; e < n; e++)
            if (fabs(t.ref[a][e]) > fabs(t.ref[a][big])) big = e;
        /* every element scaled by 1 + 3e-6: the Frobenius bound must reject it */
        for (int64_t e = 0; e < n; e++) g[e] = (float)(t.ref[a][e] * (1 + 3e-6));
        CHECK(!within_f32_tol(g, t.ref[a], n, NULL), "planted: %s scaled by 1+3e-6 accepted", k_grad[a]);
        /* one element off by 2e-5 (1 + max|ref|): the max bound must reject it */
        memcpy(g, t.got[a], (size_t)n * 4);
        g[big] += (float)(2e-5 * (1.0 + r.max_ref));
        CHECK(!within_f32_tol(g, t.ref[a], n, NULL), "planted: %s off by 2e-5(1+max) at one element accepted", k_grad[a]);
        /* a wrong gradient of the right size: the other head's */
        for (int64_t e = 0; e < n; e++) g[e] = t.got[a][(e + n / 2) % n];
        CHECK(!within_f32_tol(g, t.ref[a], n, NULL), "planted: %s shifted by half accepted", k_grad[a]);
        free(g);
    }
    /* the derived bound (grad_within_tol's cancellation rule), alone: the unperturbed gradients
     * meet it; one element off by twice its bound, the other head's gradient and a
     * gradient without D (dS = P dP, a plausible kernel bug) are rejected */
    CHECK(bcall_reference(&t, true) == ATTN_OK, "planted: magnitudes failed");
    for (int a = 0; a < 3; a++) {
        const int64_t n = t.n[a];
        const double eps = grad_eps(&t, a);
        float *g = xcalloc(n, 4);
        double worst = 0;
        int64_t at = 0;
        for (int64_t e = 0; e < n; e++) {
            const double q = fabs(t.got[a][e] - t.ref[a][e]) / (eps * t.mag[a][e] + 0x1p-126);
            if (q > worst) worst = q;
            if (t.mag[a][e] > t.mag[a][at]) at = e;
        }
        CHECK(worst <= 1.0, "planted: the unperturbed %s is %.3g of its derived bound", k_grad[a], worst);
        if (a == 0) printf("backward: planted case: eps dq %.3g (%.3g of the bound reached)\n", eps, worst);
        memcpy(g, t.got[a], (size_t)n * 4);
        g[at] = (float)(t.ref[a][at] + 2.0 * (eps * t.mag[a][at] + 0x1p-126));
        CHECK(!derived_only(g, &t, a, eps), "planted: %s off by twice its bound at one element accepted", k_grad[a]);
        for (int64_t e = 0; e < n; e++) g[e] = t.got[a][(e + n / 2) % n];
        CHECK(!derived_only(g, &t, a, eps), "planted: %s shifted by half accepted by the derived bound", k_grad[a]);
        free(g);
    }
    {
        /* one key per row: the exact dQ and dK are 0 (P = 1, dP - D = 0); a backward that
         * forgets D returns scale dP K, which the derived bound must reject */
        bcase c1 = base(1, 2, 1, 9, 1, 16, 16);
        bcall u;
        bcall_build(&u, &c1);
        CHECK(bcall_forward(&u) == ATTN_OK && bcall_reference(&u, false) == ATTN_OK &&
                  bcall_run(&u, ATTN_PATH_FUSED, 0) == ATTN_OK && bcall_reference(&u, true) == ATTN_OK,
              "planted: the one-key case failed");
        const double eps = grad_eps(&u, 0);
        CHECK(derived_only(u.got[0], &u, 0, eps), "planted: the one-key dq misses its derived bound");
        float *g = xcalloc(u.n[0], 4);
        /* dq_i = scale dP_i k_0 with dP_i = dO_i . v_0 (the D-less dS) */
        const float scale = 1.0f / sqrtf((float)c1.Dk);
        for (int64_t h = 0; h < c1.Hq; h++)
            for (int64_t i = 0; i < c1.Lq; i++) {
                double dp = 0;
                for (int64_t d = 0; d < c1.Dv; d++)
                    dp += (double)*view_ptr(&u.d_o, 0, h, i, d) * *view_ptr(&u.v, 0, 0, 0, d);
                for (int64_t d = 0; d < c1.Dk; d++)
                    g[(h * c1.Lq + i) * c1.Dk + d] = (float)(scale * dp * *view_ptr(&u.k, 0, 0, 0, d));
            }
        CHECK(!derived_only(g, &u, 0, eps), "planted: a dq without D accepted by the derived bound");
        free(g);
        bcall_free(&u);
    }
    /* the exactly-0 and finiteness checks */
    {
        float z[4] = {0, -0.0f, 0, 0};
        CHECK(all_zero(z, 4), "planted: all_zero rejects zeros");
        z[2] = 1e-30f;
        CHECK(!all_zero(z, 4), "planted: all_zero accepts 1e-30");
        z[2] = NAN;
        CHECK(!all_finite(z, 4) && !all_zero(z, 4), "planted: NaN accepted");
    }
    /* bit identity: one ulp apart is not the same */
    {
        float *saved[3];
        for (int a = 0; a < 3; a++) {
            saved[a] = xcalloc(t.n[a], 4);
            memcpy(saved[a], t.got[a], (size_t)t.n[a] * 4);
        }
        CHECK(same_bits(&t, saved), "planted: same_bits rejects a copy");
        saved[1][3] = nextafterf(saved[1][3], INFINITY);
        CHECK(!same_bits(&t, saved), "planted: same_bits accepts one ulp");
        for (int a = 0; a < 3; a++) free(saved[a]);
    }
    bcall_free(&t);
}

int main(void) {
    finite_differences();
    printf("backward: reference vs finite differences, worst relative error: dq %.2g, dk %.2g, dv %.2g; "
           "its float64 forward vs the tests' oracle: %.2g\n",
           g_fd_worst[0], g_fd_worst[1], g_fd_worst[2], g_ref64_worst);
    sizes();
    gqa();
    features();
    printf("backward: fused vs reference over %d cases (kernel %s), worst relative Frobenius "
           "error: dq %.2g, dk %.2g, dv %.2g; worst max|err|/(1+max|ref|): %.2g, %.2g, %.2g\n",
           g_cases, attn_kernel_name(), g_fused_worst[0], g_fused_worst[1], g_fused_worst[2],
           g_fused_maxerr_rel[0], g_fused_maxerr_rel[1], g_fused_maxerr_rel[2]);
    printf("backward: error / |magnitude| (cases that computed it): dq %.2g, dk %.2g, dv %.2g; %d gradients "
           "judged as cancellations (the derived bound), worst error / bound: dq %.2g, dk %.2g, dv %.2g\n",
           g_mag_worst[0], g_mag_worst[1], g_mag_worst[2], g_cancel_cases, g_cancel_worst[0],
           g_cancel_worst[1], g_cancel_worst[2]);
    planted_errors();
    return check_summary("backward");
}
