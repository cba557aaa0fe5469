/*
 * test_additive_backward.c — additive attention's gradients: the float64 path against
 *                            central finite differences of the tests' float64 oracle
 *                            (one random direction per input and weight), the fused path against the
 *                            float64 one over shapes and masks, bit-identical gradients
 *                            for any thread count, masked keys never read and fully
 *                            masked rows contributing 0, and each check failing on a
 *                            planted error.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "additive_case.h"

enum { G_Q, G_K, G_V, G_W, G_U, G_VV, G_BIAS, G_G, N_GRADS };
static const char *const k_names[N_GRADS] = {"dq", "dk", "dv", "dW", "dU", "d v", "d bias", "d g"};

/* All gradients of one call, dense, float32. */
typedef struct grads_t {
    float *x[N_GRADS];
    int64_t n[N_GRADS];
} grads_t;

typedef struct bwd_call {
    acall t;
    float *dob, *dqb, *dkb, *dvb;
    attn_tensor d_o, dq, dk, dv;
} bwd_call;

static void bwd_build(bwd_call *c, const acase *ac) {
    memset(c, 0, sizeof *c);
    acall_build(&c->t, ac);
    const int64_t B = ac->B, Lq = ac->Lq, Lk = ac->Lk;
    rng_t r = {ac->seed + 991};
    c->dob = xcalloc(B * Lq * ac->Dv, sizeof(float));
    for (int64_t x = 0; x < B * Lq * ac->Dv; x++) c->dob[x] = (float)rng_range(&r, -1, 1);
    c->d_o = attn_tensor_4d(c->dob, ATTN_F32, B, 1, Lq, ac->Dv);
    /* dq stored with padded rows, dk and dv dense */
    c->dqb = xcalloc(B * Lq * (ac->Dq + 2) + 1, sizeof(float));
    c->dq = attn_tensor_4d(c->dqb, ATTN_F32, B, 1, Lq, ac->Dq);
    c->dq.stride[2] = ac->Dq + 2;
    c->dq.stride[0] = Lq * (ac->Dq + 2);
    c->dkb = xcalloc(B * Lk * ac->Dk + 1, sizeof(float));
    c->dk = attn_tensor_4d(c->dkb, ATTN_F32, B, 1, Lk, ac->Dk);
    c->dvb = xcalloc(B * Lk * ac->Dv + 1, sizeof(float));
    c->dv = attn_tensor_4d(c->dvb, ATTN_F32, B, 1, Lk, ac->Dv);
}

static void bwd_free(bwd_call *c) {
    free(c->dob); free(c->dqb); free(c->dkb); free(c->dvb);
    acall_free(&c->t);
}

static void grads_free(grads_t *g) {
    for (int a = 0; a < N_GRADS; a++) free(g->x[a]);
}

/* The forward on `path` (for o and lse), then the backward on the same path. */
static attn_status bwd_run(bwd_call *c, attn_path path, int threads, grads_t *g) {
    acall *t = &c->t;
    const acase *ac = &t->c;
    attn_status st = acall_forward(t, path, threads, 1);
    if (st != ATTN_OK) return st;
    const int64_t A = ac->A;
    const int64_t n[N_GRADS] = {ac->B * ac->Lq * ac->Dq, ac->B * ac->Lk * ac->Dk,
                                ac->B * ac->Lk * ac->Dv, ac->Dq * A, ac->Dk * A, A, A, 1};
    for (int a = 0; a < N_GRADS; a++) {
        g->n[a] = n[a];
        g->x[a] = xcalloc(n[a] + 1, sizeof(float));
        fill_sentinel(g->x[a], n[a]);
    }
    fill_sentinel(c->dqb, ac->B * ac->Lq * (ac->Dq + 2));
    fill_sentinel(c->dkb, n[G_K]);
    fill_sentinel(c->dvb, n[G_V]);
    attn_additive_grads gr = {g->x[G_W], g->x[G_U], g->x[G_VV], g->x[G_BIAS], g->x[G_G]};
    attn_options opt = t->opt;
    opt.lse = opt.weights = NULL;
    opt.path = path;
    opt.threads = threads;
    st = attn_additive_backward(&t->q, &t->k, &t->val, &t->wt, &t->o, &c->d_o, &t->lse, &c->dq,
                                &c->dk, &c->dv, &gr, &opt);
    gather_f32(&c->dq, g->x[G_Q]);
    gather_f32(&c->dk, g->x[G_K]);
    gather_f32(&c->dv, g->x[G_V]);
    if (!ac->normalize) g->x[G_G][0] = 0.0f;
    return st;
}

/* ---- finite differences of the float64 path ---------------------------------------------- */

/* L = Σ dO · O, O by the tests' own float64 oracle (no rounding to float on the way) */
static double loss(bwd_call *c) {
    const acase *ac = &c->t.c;
    const int64_t no = ac->B * ac->Lq * ac->Dv;
    double *o = xcalloc(no, sizeof(double)), *lse = xcalloc(ac->B * ac->Lq, sizeof(double)),
           *w = xcalloc(ac->B * ac->Lq * ac->Lk, sizeof(double));
    oracle(&c->t, o, lse, w);
    double s = 0;
    for (int64_t x = 0; x < no; x++) s += (double)c->dob[x] * o[x];
    free(o); free(lse); free(w);
    return s;
}

/* The parameter of group a as a list of float pointers (for perturbing it). */
static int64_t params_of(bwd_call *c, int a, float **out) {
    acall *t = &c->t;
    const acase *ac = &t->c;
    int64_t n = 0;
    const attn_tensor *views[3] = {&t->q, &t->k, &t->val};
    if (a <= G_V) {
        const attn_tensor *v = views[a];
        for (int64_t b = 0; b < v->shape[0]; b++)
            for (int64_t i = 0; i < v->shape[2]; i++)
                for (int64_t d = 0; d < v->shape[3]; d++) out[n++] = view_ptr(v, b, 0, i, d);
        return n;
    }
    float *base[] = {t->W, t->U, t->v, t->bias, &t->wt.g};
    const int64_t len[] = {ac->Dq * ac->A, ac->Dk * ac->A, ac->A, ac->A, 1};
    for (int64_t x = 0; x < len[a - G_W]; x++) out[n++] = base[a - G_W] + x;
    return n;
}

/* |fd - analytic| <= 2e-5 |analytic| (+ 1e-9 for a derivative that is 0) */
static double g_fd_worst;
static int fd_accepts(double fd, double an) { return fabs(fd - an) <= 2e-5 * fabs(an) + 1e-9; }

static void fd_case(const acase *ac) {
    bwd_call c;
    bwd_build(&c, ac);
    grads_t g;
    attn_status st = bwd_run(&c, ATTN_PATH_REFERENCE, 1, &g);
    CHECK(st == ATTN_OK, "fd: reference backward %s (%s) [%s]", attn_status_string(st),
          attn_last_error(), c.t.desc);
    rng_t r = {ac->seed + 5};
    for (int a = 0; a < N_GRADS && st == ATTN_OK; a++) {
        if ((a == G_BIAS && !ac->bias) || (a == G_G && !ac->normalize)) continue;
        float **ptr = xcalloc(g.n[a] + 1, sizeof(float *));
        const int64_t n = params_of(&c, a, ptr);
        double *dir = xcalloc(n + 1, sizeof(double));
        float *keep = xcalloc(n + 1, sizeof(float));
        for (int64_t x = 0; x < n; x++) {
            dir[x] = rng_range(&r, -1, 1);
            keep[x] = *ptr[x];
        }
        const double h = 1e-3;
        double lp, lm;
        for (int64_t x = 0; x < n; x++) *ptr[x] = (float)(keep[x] + h * dir[x]);
        lp = loss(&c);
        for (int64_t x = 0; x < n; x++) *ptr[x] = (float)(keep[x] - h * dir[x]);
        lm = loss(&c);
        for (int64_t x = 0; x < n; x++) *ptr[x] = keep[x];
        /* the step actually taken, after rounding to float, is not exactly h dir: use it */
        double an_eff = 0;
        for (int64_t x = 0; x < n; x++) {
            const double step = ((double)(float)(keep[x] + h * dir[x]) -
                                 (double)(float)(keep[x] - h * dir[x])) / (2 * h);
            an_eff += step * g.x[a][x];
        }
        const double fd = (lp - lm) / (2 * h);
        if (an_eff != 0 && fabs(fd - an_eff) / fabs(an_eff) > g_fd_worst)
            g_fd_worst = fabs(fd - an_eff) / fabs(an_eff);
        CHECK(fd_accepts(fd, an_eff), "fd %s: finite difference %.9g, gradient %.9g (rel %.3g) [%s]",
              k_names[a], fd, an_eff, fabs(fd - an_eff) / fabs(an_eff), c.t.desc);
        CHECK(!fd_accepts(fd, an_eff * (1 + 1e-4)), "planted: fd %s accepts a 1e-4 scaling",
              k_names[a]);
        free(ptr); free(dir); free(keep);
    }
    grads_free(&g);
    bwd_free(&c);
}

/* ---- the fused path against the float64 one ------------------------------------------------ */

static double g_worst[N_GRADS];

static void fused_case(const acase *ac) {
    bwd_call c;
    bwd_build(&c, ac);
    const int64_t poisoned = poison_unread(&c.t);
    grads_t ref, got;
    attn_status st = bwd_run(&c, ATTN_PATH_REFERENCE, 1, &ref);
    CHECK(st == ATTN_OK, "reference backward: %s [%s]", attn_status_string(st), c.t.desc);
    st = bwd_run(&c, ATTN_PATH_FUSED, 2, &got);
    CHECK(st == ATTN_OK, "fused backward: %s (%s) [%s]", attn_status_string(st),
          attn_last_error(), c.t.desc);
    for (int a = 0; a < N_GRADS; a++) {
        double *rd = xcalloc(ref.n[a] + 1, sizeof(double));
        for (int64_t x = 0; x < ref.n[a]; x++) rd[x] = ref.x[a][x];
        tol_result r;
        CHECK(within_add_tol(got.x[a], rd, ref.n[a], &r), "fused %s: max_err %.3g (max|ref| %.3g) "
              "rel %.3g nonfinite %d poisoned %lld [%s]", k_names[a], r.max_err, r.max_ref,
              r.rel_err, r.nonfinite_mismatch, (long long)poisoned, c.t.desc);
        if (r.rel_err > g_worst[a]) g_worst[a] = r.rel_err;
        free(rd);
    }
    /* 1 and 3 threads: the same bits */
    for (int th = 1; th <= 3; th += 2) {
        grads_t other;
        bwd_run(&c, ATTN_PATH_FUSED, th, &other);
        int same = 1;
        for (int a = 0; a < N_GRADS; a++) same &= same_bits(other.x[a], got.x[a], got.n[a]);
        CHECK(same, "fused backward: %d threads give other bits than 2 [%s]", th, c.t.desc);
        grads_free(&other);
    }
    grads_free(&ref);
    grads_free(&got);
    bwd_free(&c);
}

/* Keys no row reads get dk = dv = 0 exactly; a batch with kv_len 0 gets dq = 0. */
static void masked_contract(void) {
    acase ac = mk(3, 5, 80, 4, 3, 6, 12, 700);
    ac.kvlen = 1;
    ac.causal = 1;
    bwd_call c;
    bwd_build(&c, &ac);
    poison_unread(&c.t);
    grads_t g;
    attn_status st = bwd_run(&c, ATTN_PATH_FUSED, 2, &g);
    CHECK(st == ATTN_OK, "masked: %s", attn_status_string(st));
    int bad = 0, nonfinite = 0;
    for (int64_t b = 0; b < 3; b++) {
        const int64_t lkb = c.t.kvl[b];
        for (int64_t j = 0; j < 80; j++) {
            const int unread = j >= lkb || j > 4;  /* causal top-left: row 4 reads j <= 4 */
            for (int64_t d = 0; d < 3; d++) {
                const float x = g.x[G_K][(b * 80 + j) * 3 + d];
                nonfinite += !isfinite(x);
                bad += unread && x != 0.0f;
            }
            for (int64_t d = 0; d < 6; d++) bad += unread && g.x[G_V][(b * 80 + j) * 6 + d] != 0.0f;
        }
        for (int64_t i = 0; b == 2 && i < 5; i++)
            for (int64_t d = 0; d < 4; d++) bad += g.x[G_Q][(b * 5 + i) * 4 + d] != 0.0f;
    }
    for (int a = 0; a < N_GRADS; a++)
        for (int64_t x = 0; x < g.n[a]; x++) nonfinite += !isfinite(g.x[a][x]);
    CHECK(bad == 0 && nonfinite == 0, "masked: %d gradients of unread keys or empty rows not 0, "
          "%d non-finite (NaN planted in the unread rows)", bad, nonfinite);
    grads_free(&g);
    bwd_free(&c);
}

static void planted(void) {
    /* the FD check: exact passes, 1e-4 off fails, a flipped sign fails */
    CHECK(fd_accepts(1.2345, 1.2345), "planted: exact FD rejected");
    CHECK(!fd_accepts(1.2345 * (1 + 1e-4), 1.2345), "planted: FD accepts 1e-4");
    CHECK(!fd_accepts(-0.5, 0.5), "planted: FD accepts a flipped sign");
    /* the fused-vs-reference check on a real gradient: scaled by 1 + 3e-5 must fail */
    acase ac = mk(2, 9, 70, 5, 4, 3, 16, 800);
    ac.bias = 1;
    bwd_call c;
    bwd_build(&c, &ac);
    grads_t ref, got;
    bwd_run(&c, ATTN_PATH_REFERENCE, 1, &ref);
    bwd_run(&c, ATTN_PATH_FUSED, 2, &got);
    for (int a = 0; a < G_G; a++) {
        double *rd = xcalloc(ref.n[a] + 1, sizeof(double));
        for (int64_t x = 0; x < ref.n[a]; x++) rd[x] = ref.x[a][x];
        CHECK(within_add_tol(got.x[a], rd, ref.n[a], NULL), "planted: unperturbed %s rejected",
              k_names[a]);
        for (int64_t x = 0; x < got.n[a]; x++) got.x[a][x] *= 1.0f + 3e-5f;
        CHECK(!within_add_tol(got.x[a], rd, ref.n[a], NULL), "planted: %s scaled by 1 + 3e-5 "
              "accepted", k_names[a]);
        free(rd);
    }
    grads_free(&ref);
    grads_free(&got);
    bwd_free(&c);
}

int main(void) {
    if (acall_without_blas()) return check_summary("additive_backward");
    planted();
    uint64_t seed = 1;
    /* finite differences: small shapes, each option */
    for (int v = 0; v < 8; v++) {
        acase ac = mk(2, 3 + v % 3, 5 + v * 3, 3, 4, 2, 6 + v, seed++);
        ac.bias = v % 2;
        ac.normalize = v % 4 >= 2;
        ac.mask = v == 3 || v == 6;
        ac.causal = v == 4 || v == 7;
        ac.kvlen = v == 5;
        ac.layout = v % 3 == 1;
        fd_case(&ac);
    }
    /* fused against float64: tile edges, masks, layouts */
    static const int64_t lks[] = {1, 63, 64, 65, 130};
    for (size_t x = 0; x < sizeof lks / sizeof lks[0]; x++)
        for (int v = 0; v < 4; v++) {
            acase ac = mk(3, 1 + (int64_t)(x * 5 + v * 3) % 17, lks[x], 5, 6, 7, 8 + 9 * v, seed++);
            ac.bias = v != 1;
            ac.normalize = v == 2;
            ac.layout = v % 2;
            ac.mask = v == 3;
            ac.kvlen = v == 1 || v == 3;
            ac.causal = v == 2;
            ac.align = x % 2;
            ac.window = v == 0 && x > 2;
            ac.wl = 7;
            ac.wr = 2;
            fused_case(&ac);
        }
    acase e[] = {mk(2, 3, 0, 4, 4, 3, 8, 901), mk(2, 3, 5, 4, 4, 3, 0, 902),
                 mk(2, 0, 5, 4, 4, 3, 8, 903), mk(2, 3, 5, 0, 4, 3, 8, 904)};
    for (size_t x = 0; x < sizeof e / sizeof e[0]; x++) fused_case(&e[x]);
    masked_contract();
    printf("  worst relative error of a finite difference: %.2g\n", g_fd_worst);
    printf("  worst relative error of the fused gradients:");
    for (int a = 0; a < N_GRADS; a++) printf(" %s %.2g", k_names[a], g_worst[a]);
    printf("\n");
    return check_summary("additive_backward");
}
