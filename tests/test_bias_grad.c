/*
 * test_bias_grad.c — the float bias's gradient, attn_options.d_bias (docs/CONTRACT.md,
 *                    "The bias's gradient").
 *
 * What it covers:
 *  1. The float64 reference's d(bias) (ai_ref64_backward_bias) against Richardson-
 *     extrapolated central differences of its own forward, for every broadcast pattern
 *     of the bias ([B|1, Hq|1, Lq|1, Lk|1]), with -inf entries (gradient exactly 0),
 *     causal, GQA, softcap, ALiBi, a bool mask and key lengths.
 *  2. attn_backward's d_bias on every path against it: the public reference path the
 *     float64 sums rounded once (bit for bit); the fused float32 path within the derived
 *     bound (dbias_eps times the magnitude, tests/support/backward_case.h), dropout too;
 *     the fused float64 path within a float32 rounding; dq, dk, dv the same bits as
 *     without d_bias; d_bias the same bits for 1, 2 and 3 threads.
 *  3. Misuse, refused with nothing written: d_bias without bias, of another shape or
 *     dtype, over the bias itself, in a forward call.
 *  4. Planted errors the checks reject: d_bias summed over one batch too few (a broadcast
 *     dimension forgotten), moved by a row, one element twice its bound off.
 */
#include "backward_case.h"

static int g_cases;
static double g_fd_worst, g_fused_worst;

/* the bias's shape, from the case (build_options) */
static void bias_shape(const bcall *t, int64_t n[4]) {
    for (int d = 0; d < 4; d++) n[d] = t->s.tbias.shape[d];
}
static int64_t count4(const int64_t n[4]) { return n[0] * n[1] * n[2] * n[3]; }

/* the call's inputs as dense doubles, and its float64-reference params */
typedef struct dense_in {
    attn_params p;
    double *x[4];  // q, k, v, d_o
} dense_in;

static void dense_build(dense_in *d, bcall *t) {
    attn_options f = t->opt;
    f.path = ATTN_PATH_REFERENCE;
    CHECK(ai_params_init(&d->p, &t->q, &t->k, &t->v, &t->o, &f, true) == ATTN_OK, "params: %s",
          attn_last_error());
    const attn_tensor *src[4] = {&t->q, &t->k, &t->v, &t->d_o};
    for (int a = 0; a < 4; a++) {
        d->x[a] = xcalloc(numel(src[a]), sizeof(double));
        gather_d(src[a], d->x[a]);
    }
}
static void dense_free(dense_in *d) {
    for (int a = 0; a < 4; a++) free(d->x[a]);
}

/* The reference's d(bias) (magnitudes: the same over absolute values), into db. */
static void ref_dbias(bcall *t, dense_in *d, double *db, bool mag) {
    int64_t n[4];
    bias_shape(t, n);
    double *g[3];
    for (int a = 0; a < 3; a++) g[a] = xcalloc(t->n[a], sizeof(double));
    CHECK(ai_ref64_backward_bias(&d->p, d->x[0], d->x[1], d->x[2], d->x[3], g[0], g[1], g[2], db,
                                 n, mag) == ATTN_OK, "ref64 d_bias: %s", attn_last_error());
    for (int a = 0; a < 3; a++) free(g[a]);
}

/* Σ dO ∘ O of the float64 forward, the loss whose gradient the backward takes */
static double loss(bcall *t, dense_in *d, double *o) {
    CHECK(ai_ref64_forward(&d->p, d->x[0], d->x[1], d->x[2], o, NULL) == ATTN_OK, "ref64 forward");
    double l = 0;
    for (int64_t e = 0; e < numel(&t->d_o); e++) l += d->x[3][e] * o[e];
    return l;
}

/* ---- 1. the reference against finite differences ------------------------------------ */

static void fd_case(bcase c) {
    bcall t;
    bcall_build(&t, &c);
    int64_t n[4];
    bias_shape(&t, n);
    const int64_t nb = count4(n);
    /* bias values on a grid of 2^-10, so that x ± h and x ± 2h (h = 2^-10) are exact in
     * float32 and the differences are those of the float64 forward alone */
    for (int64_t e = 0; e < nb; e++)
        if (isfinite(t.s.bias[e])) t.s.bias[e] = ldexpf(rintf(ldexpf(t.s.bias[e], 10)), -10);
    dense_in d;
    dense_build(&d, &t);
    double *db = xcalloc(nb, sizeof(double)), *o = xcalloc(numel(&t.o), sizeof(double));
    ref_dbias(&t, &d, db, false);
    /* Richardson: R = (4 D(h) - D(2h)) / 3, D the central difference, error O(h^4): at
     * h = 2^-10 about 1e-12 of the gradient for these smooth softmaxes, and float64's
     * rounding of the loss, eps64 |loss| / h, about 1e-13 */
    const double h = 0x1p-10;
    double num = 0, den = 0;
    int exact_zero = 1;
    const int64_t step = nb > 48 ? nb / 48 : 1;
    for (int64_t e = 0; e < nb; e += step) {
        const float x = t.s.bias[e];
        if (!isfinite(x)) {  // a -inf logit: P = 0, no gradient
            exact_zero &= db[e] == 0.0;
            continue;
        }
        double Lp[2], Lm[2];
        for (int s = 0; s < 2; s++) {
            t.s.bias[e] = x + (float)((s + 1) * h);
            Lp[s] = loss(&t, &d, o);
            t.s.bias[e] = x - (float)((s + 1) * h);
            Lm[s] = loss(&t, &d, o);
        }
        t.s.bias[e] = x;
        const double d1 = (Lp[0] - Lm[0]) / (2 * h), d2 = (Lp[1] - Lm[1]) / (4 * h);
        const double r = (4 * d1 - d2) / 3;
        num += (r - db[e]) * (r - db[e]);
        den += r * r;
    }
    const double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    if (rel > g_fd_worst) g_fd_worst = rel;
    CHECK(rel <= 1e-6 && exact_zero, "d_bias against finite differences: relative error %.3g, "
          "-inf entries 0: %d [bias %lldx%lldx%lldx%lld, %s]", rel, exact_zero, (long long)n[0],
          (long long)n[1], (long long)n[2], (long long)n[3], t.desc);
    free(db), free(o);
    dense_free(&d);
    bcall_free(&t);
}

/* ---- 2. the paths -------------------------------------------------------------------- */

/* attn_backward with d_bias into got (float, the bias's shape, dense); the gradients into
 * t->got as bcall_run does */
static attn_status run_dbias(bcall *t, attn_path path, int threads, float *got) {
    int64_t n[4];
    bias_shape(t, n);
    attn_tensor tdb = attn_tensor_4d(got, ATTN_F32, n[0], n[1], n[2], n[3]);
    fill_sentinel(got, count4(n));
    attn_options b = t->opt;
    b.path = path;
    b.threads = threads;
    b.d_bias = &tdb;
    return bcall_run_with(t, &b);
}

/* every element within eps magnitude (+ float32's smallest normal, for underflow) of ref;
 * *ratio the largest error / bound */
static int within_bound(const float *got, const double *ref, const double *mag, int64_t n,
                        double eps, double *ratio) {
    *ratio = 0;
    for (int64_t e = 0; e < n; e++) {
        if (!isfinite(got[e])) return 0;
        const double q = fabs(got[e] - ref[e]) / (eps * mag[e] + 0x1p-126);
        if (!(q <= *ratio)) *ratio = q;
    }
    return *ratio <= 1.0;
}

/* the scale a float32 call uses, as a double */
static double dense_scale(const bcall *t) {
    return t->c.has_scale ? (double)t->c.scale : (double)(float)(1.0 / sqrt((double)t->c.Dk));
}

/* the float64 fused path on float64 copies of the call: d_bias against the reference */
static void f64_path(bcall *t, const double *db, const double *dbm) {
    const attn_tensor *src[6] = {&t->q, &t->k, &t->v, &t->d_o, &t->q, &t->k};
    double *x[4];
    for (int a = 0; a < 4; a++) {
        x[a] = xcalloc(numel(src[a]), sizeof(double));
        gather_d(src[a], x[a]);
    }
    const bcase *c = &t->c;
    attn_tensor q = attn_tensor_4d(x[0], ATTN_F64, c->B, c->Hq, c->Lq, c->Dk);
    attn_tensor k = attn_tensor_4d(x[1], ATTN_F64, c->B, c->Hkv, c->Lk, c->Dk);
    attn_tensor v = attn_tensor_4d(x[2], ATTN_F64, c->B, c->Hkv, c->Lk, c->Dv);
    attn_tensor d_o = attn_tensor_4d(x[3], ATTN_F64, c->B, c->Hq, c->Lq, c->Dv);
    double *ob = xcalloc(numel(&d_o), sizeof(double)), *lb = xcalloc(c->B * c->Hq * c->Lq, sizeof(double));
    double *g[3] = {xcalloc(numel(&q), sizeof(double)), xcalloc(numel(&k), sizeof(double)),
                    xcalloc(numel(&v), sizeof(double))};
    attn_tensor o = attn_tensor_4d(ob, ATTN_F64, c->B, c->Hq, c->Lq, c->Dv);
    attn_tensor lse = attn_tensor_4d(lb, ATTN_F64, c->B, c->Hq, c->Lq, 1);
    attn_tensor dq = attn_tensor_4d(g[0], ATTN_F64, c->B, c->Hq, c->Lq, c->Dk);
    attn_tensor dk = attn_tensor_4d(g[1], ATTN_F64, c->B, c->Hkv, c->Lk, c->Dk);
    attn_tensor dv = attn_tensor_4d(g[2], ATTN_F64, c->B, c->Hkv, c->Lk, c->Dv);
    int64_t n[4];
    bias_shape(t, n);
    float *got = xcalloc(count4(n), sizeof(float));
    attn_tensor tdb = attn_tensor_4d(got, ATTN_F32, n[0], n[1], n[2], n[3]);
    /* the float32 call's scale, exactly (a float64 call's default is 1/sqrt(Dk) unrounded) */
    attn_options f = t->opt;
    f.has_scale = true;
    f.scale_f64 = dense_scale(t);
    f.scale = (float)f.scale_f64;
    attn_options b = f;
    f.lse = &lse;
    attn_status st = attn_forward(&q, &k, &v, &o, &f);
    b.d_bias = &tdb;
    if (st == ATTN_OK) st = attn_backward(&q, &k, &v, &o, &d_o, &lse, &dq, &dk, &dv, &b);
    CHECK(st == ATTN_OK, "float64 backward with d_bias: %s [%s]", attn_last_error(), t->desc);
    /* float64 arithmetic (the float32 bound scaled by 2^-29) rounded once to float32 */
    double ratio = 0;
    const double eps = 0x1p-29 * dbias_eps(t);
    for (int64_t e = 0; e < count4(n); e++) {
        const double bound = 0x1p-24 * fabs(db[e]) + eps * dbm[e] + 0x1p-149;
        const double q2 = fabs(got[e] - db[e]) / bound;
        if (!(q2 <= ratio)) ratio = q2;
    }
    CHECK(ratio <= 1.0, "float64 fused d_bias: %.3g of its bound [%s]", ratio, t->desc);
    free(got), free(ob), free(lb);
    for (int a = 0; a < 3; a++) free(g[a]);
    for (int a = 0; a < 4; a++) free(x[a]);
}

static void path_case(bcase c, float dropout, bool f64) {
    if (test_case_skipped()) return;
    bcall t;
    bcall_build(&t, &c);
    if (dropout > 0) {
        t.opt.dropout_p = dropout;
        t.opt.dropout_seed = 77;
    }
    CHECK(bcall_forward(&t) == ATTN_OK, "forward: %s [%s]", attn_last_error(), t.desc);
    int64_t n[4];
    bias_shape(&t, n);
    const int64_t nb = count4(n);
    dense_in d;
    dense_build(&d, &t);
    double *db = xcalloc(nb, sizeof(double)), *dbm = xcalloc(nb, sizeof(double));
    ref_dbias(&t, &d, db, false);
    ref_dbias(&t, &d, dbm, true);
    float *got = xcalloc(nb, sizeof(float)), *again = xcalloc(nb, sizeof(float));
    float *plain[3];
    for (int path = 0; path < 2; path++) {
        const attn_path pa = path ? ATTN_PATH_FUSED : ATTN_PATH_REFERENCE;
        /* the gradients without d_bias, then with it: the same bits */
        CHECK(bcall_run(&t, pa, 0) == ATTN_OK, "backward: %s [%s]", attn_last_error(), t.desc);
        for (int a = 0; a < 3; a++) {
            plain[a] = xcalloc(t.n[a], sizeof(float));
            memcpy(plain[a], t.got[a], (size_t)t.n[a] * sizeof(float));
        }
        const attn_status st = run_dbias(&t, pa, 0, got);
        CHECK(st == ATTN_OK, "%s backward with d_bias: %s [%s]", path ? "fused" : "reference",
              attn_last_error(), t.desc);
        for (int a = 0; a < 3; a++) {
            CHECK(memcmp(plain[a], t.got[a], (size_t)t.n[a] * sizeof(float)) == 0,
                  "%s: %s changed when d_bias was asked for [%s]", path ? "fused" : "reference",
                  k_grad[a], t.desc);
            free(plain[a]);
        }
        if (!path) {  // the reference path: the float64 sums rounded once
            int64_t diff = 0;
            for (int64_t e = 0; e < nb; e++) diff += got[e] != (float)db[e];
            CHECK(diff == 0, "reference d_bias: %lld elements are not the float64 sums rounded [%s]",
                  (long long)diff, t.desc);
            continue;
        }
        double ratio;
        const double eps = dbias_eps(&t);
        CHECK(within_bound(got, db, dbm, nb, eps, &ratio), "fused d_bias: %.3g of its "
              "derived bound (eps %.3g) [%s]", ratio, eps, t.desc);
        if (ratio > g_fused_worst) g_fused_worst = ratio;
        for (int threads = 1; threads <= 3; threads++) {
            CHECK(run_dbias(&t, pa, threads, again) == ATTN_OK, "threads %d", threads);
            CHECK(memcmp(got, again, (size_t)nb * sizeof(float)) == 0,
                  "fused d_bias differs with %d threads [%s]", threads, t.desc);
        }
    }
    if (f64 && dropout == 0) f64_path(&t, db, dbm);
    g_cases++;
    free(db), free(dbm), free(got), free(again);
    dense_free(&d);
    bcall_free(&t);
}

/* ---- 3. misuse -------------------------------------------------------------------------- */

static void expect(bcall *t, const attn_options *b, attn_status want, const float *db_poison,
                   const char *what) {
    fill_sentinel(t->dqb, t->ndqb);
    const attn_status st = attn_backward(&t->q, &t->k, &t->v, &t->o, &t->d_o, &t->lse, &t->dq,
                                         &t->dk, &t->dv, b);
    CHECK(st == want, "%s: status %s, expected %s (%s)", what, attn_status_string(st),
          attn_status_string(want), attn_last_error());
    CHECK(count_written(t->dqb, t->ndqb) == 0, "%s: dq written", what);
    if (db_poison) CHECK(count_written(db_poison, 2 * 3 * 9 * 11) == 0, "%s: d_bias written", what);
}

static void misuse(void) {
    bcase c = base(2, 3, 3, 9, 11, 8, 8);
    c.mask = 2, c.mshape = 7;
    bcall t;
    bcall_build(&t, &c);
    CHECK(bcall_forward(&t) == ATTN_OK, "misuse: forward");
    float *db = xcalloc(2 * 3 * 9 * 11 + 8, sizeof(float));
    fill_sentinel(db, 2 * 3 * 9 * 11);
    attn_tensor tdb = attn_tensor_4d(db, ATTN_F32, 2, 3, 9, 11);
    attn_options b = t.opt;
    b.d_bias = &tdb;
    b.bias = NULL;
    expect(&t, &b, ATTN_ERR_VALUE, db, "d_bias without bias");
    b.bias = t.opt.bias;
    tdb.shape[2] = 1;
    expect(&t, &b, ATTN_ERR_SHAPE, db, "d_bias of another shape than the bias");
    tdb.shape[2] = 9;
    tdb.dtype = ATTN_BF16;
    expect(&t, &b, ATTN_ERR_DTYPE, db, "d_bias bfloat16");
    tdb.dtype = ATTN_F32;
    attn_tensor over = *t.opt.bias;  // the bias itself as its gradient
    b.d_bias = &over;
    expect(&t, &b, ATTN_ERR_STRIDE, NULL, "d_bias over the bias");
    b.d_bias = &tdb;
    attn_options f = b;  // a forward call
    f.path = ATTN_PATH_FUSED;
    fill_sentinel(t.ob, t.nob);
    CHECK(attn_forward(&t.q, &t.k, &t.v, &t.o, &f) == ATTN_ERR_VALUE && count_written(t.ob, t.nob) == 0,
          "attn_forward with d_bias: not refused, or O written");
    free(db);
    bcall_free(&t);
}

/* ---- 4. planted errors ------------------------------------------------------------------- */

static void planted(void) {
    /* a bias shared by the batch ([1, Hq, Lq, Lk]) and the per-logit gradients of the
     * full shape: the right reduction is their sum over b; batch 0's alone is rejected */
    bcase c = base(2, 2, 1, 12, 13, 8, 8);
    c.mask = 2, c.mshape = 6, c.causal = 1;
    bcall t;
    bcall_build(&t, &c);
    CHECK(bcall_forward(&t) == ATTN_OK, "planted: forward");
    dense_in d;
    dense_build(&d, &t);
    const int64_t per = 2 * 12 * 13, nb = per;
    double *db = xcalloc(nb, sizeof(double)), *dbm = xcalloc(nb, sizeof(double));
    double *full = xcalloc(2 * per, sizeof(double));
    ref_dbias(&t, &d, db, false);
    ref_dbias(&t, &d, dbm, true);
    const int64_t nf[4] = {2, 2, 12, 13};
    double *g[3];
    for (int a = 0; a < 3; a++) g[a] = xcalloc(t.n[a], sizeof(double));
    CHECK(ai_ref64_backward_bias(&d.p, d.x[0], d.x[1], d.x[2], d.x[3], g[0], g[1], g[2], full, nf,
                                 false) == ATTN_OK, "planted: full d_bias");
    float *got = xcalloc(nb, sizeof(float));
    CHECK(run_dbias(&t, ATTN_PATH_FUSED, 0, got) == ATTN_OK, "planted: backward");
    double ratio;
    const double eps = dbias_eps(&t);
    CHECK(within_bound(got, db, dbm, nb, eps, &ratio), "planted: the fused d_bias misses its bound");
    const double reached = ratio;
    float *bad = xcalloc(nb, sizeof(float));
    double sum_err = 0;
    for (int64_t e = 0; e < nb; e++) bad[e] = (float)full[e];  // batch 0's only: the sum forgotten
    /* (a loop of its own, and no fmax: GCC 12's AArch64 vectorizer fails on the fused one) */
    for (int64_t e = 0; e < nb; e++) {
        const double err = fabs(full[e] + full[per + e] - db[e]);
        if (err > sum_err) sum_err = err;
    }
    CHECK(sum_err <= 1e-12 * (1 + fabs(db[0])), "planted: the full gradient's batch sum is not d_bias");
    CHECK(!within_bound(bad, db, dbm, nb, eps, &ratio), "planted: d_bias without the batch sum accepted");
    for (int64_t e = 0; e < nb; e++) bad[e] = got[(e + 13) % nb];  // a row off
    CHECK(!within_bound(bad, db, dbm, nb, eps, &ratio), "planted: d_bias a row off accepted");
    int64_t big = 0;
    for (int64_t e = 0; e < nb; e++)
        if (dbm[e] > dbm[big]) big = e;
    memcpy(bad, got, (size_t)nb * sizeof(float));
    bad[big] = (float)(db[big] + 2.5 * (eps * dbm[big] + 0x1p-126));
    CHECK(!within_bound(bad, db, dbm, nb, eps, &ratio), "planted: an element 2.5 bounds off accepted");
    printf("bias_grad: planted case: eps %.3g, the fused d_bias at %.3g of its bound\n", eps, reached);
    for (int a = 0; a < 3; a++) free(g[a]);
    free(db), free(dbm), free(full), free(got), free(bad);
    dense_free(&d);
    bcall_free(&t);
}

int main(void) {
    /* 1: every broadcast pattern (mshape bits: B, Hq, Lq full; 8: Lk of 1) */
    for (int m = 0; m < 16; m++) {
        bcase c = base(2, 2, 1, 7, 9, 5, 4);
        c.mask = 2, c.mshape = m, c.bias_ninf = 0.15;
        c.causal = m & 1, c.align = (m >> 1) & 1;
        if (m == 5) c.softcap = 1.5f;
        if (m == 6) c.alibi = 1;
        if (m == 9) c.mask = 3, c.mask_true = 0.7;
        if (m == 10) c.kvlen = 1;
        fd_case(c);
    }
    printf("bias_grad: reference d_bias against finite differences, worst relative error %.3g\n",
           g_fd_worst);
    /* 2: the paths, over shapes that cross the fused tiles (Lq, Lk > 128), GQA, layouts */
    static const int64_t shapes[][7] = {{2, 4, 2, 33, 40, 16, 16}, {1, 2, 2, 130, 150, 32, 24},
                                        {2, 2, 1, 1, 200, 8, 8},   {1, 3, 1, 70, 1, 4, 4},
                                        {1, 2, 2, 0, 5, 8, 8},     {1, 2, 1, 5, 0, 8, 8}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int m = 0; m < 16; m++) {
            const int64_t *sh = shapes[si];
            bcase c = base(sh[0], sh[1], sh[2], sh[3], sh[4], sh[5], sh[6]);
            c.mask = 2, c.mshape = m, c.bias_ninf = 0.1;
            c.layout = m & 1;
            c.causal = (m >> 1) & 1, c.align = (m >> 2) & 1;
            if (m == 3) c.softcap = 2.0f;
            if (m == 12) c.window = 1, c.wl = 3, c.wr = 1;
            if (m == 14) c.mask = 3;
            path_case(c, m == 7 ? 0.3f : 0.0f, m % 4 == 0);
        }
    printf("bias_grad: %d cases on the kernel %s: fused d_bias at worst %.3g of its derived bound\n",
           g_cases, attn_kernel_name(), g_fused_worst);
    misuse();
    planted();
    return check_summary("bias_grad");
}
