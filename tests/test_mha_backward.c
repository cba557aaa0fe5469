/*
 * test_mha_backward.c — the multi-head module's gradients (attn_mha_backward) against
 *                       central finite differences of the float64 composition
 *                       (mha_ref.h), and their promises.
 *
 * What it covers:
 *  1. dx_q, dx_kv, dW_Q, dW_K, dW_V, dW_O and the four biases for loss = Σ G ∘ y, G
 *     drawn, against (loss(θ + h) - loss(θ - h)) / 2h in double, h = 1e-6, for self-
 *     and cross-attention, GQA, Dk != Dv, both RoPE pairings, masks (causal both ways,
 *     kv_len with an empty batch, a key padding mask), PyTorch's packed [3E, E] gradient
 *     written in place, padded x and dx, bfloat16 x, weights and biases: relative Frobenius error <= 2e-6 (relative to
 *     max(norm, 0.1)) and max error <= 2e-5 · (1 + max |ref|) per gradient (float32
 *     arithmetic through two products on each side of the attention).
 *  2. Bit-identical gradients for 1 and 2 threads (the attention's and OpenMP's).
 *  3. Misuse: the status, and nothing written.
 *  4. The tolerance check rejects a planted error.
 */
#ifdef _OPENMP
#include <omp.h>
#endif

#include "mha_ref.h"

#define GRAD_REL 2e-6
#define GRAD_MAX 2e-5

static void grads_build(mgrads *gr, const mlayer *l) {
    const mcase *c = &l->c;
    memset(gr, 0, sizeof *gr);
    gr->t[G_XQ] = mrows_tensor(NULL, ATTN_F32, c->B, c->Lq, c->E, c->layout, &gr->n[G_XQ]);
    gr->t[G_XKV] = mrows_tensor(NULL, ATTN_F32, c->B, c->Lk, c->Ekv, c->layout, &gr->n[G_XKV]);
    for (int n = 0; n < 4; n++) {
        attn_tensor w = l->tw[n];
        w.dtype = ATTN_F32;
        gr->t[G_W + n] = w;
        gr->n[G_W + n] = l->in[n] * l->out[n] + 1;
        gr->t[G_B + n] = attn_tensor_4d(NULL, ATTN_F32, l->out[n], 1, 1, 1);
        gr->n[G_B + n] = l->out[n] + 1;
    }
    const bool packed = c->torch && c->self;
    if (packed) gr->n[G_W] = (l->out[0] + l->out[1] + l->out[2]) * l->in[0];
    for (int n = 0; n < G_N; n++) {
        if (packed && (n == G_W + 1 || n == G_W + 2)) continue;
        gr->buf[n] = xcalloc(gr->n[n], sizeof(float));
        fill_sentinel(gr->buf[n], gr->n[n]);
        gr->t[n].data = gr->buf[n];
    }
    if (packed) {
        gr->t[G_W + 1].data = gr->buf[G_W] + l->in[0] * l->out[0];
        gr->t[G_W + 2].data = gr->buf[G_W] + l->in[0] * (l->out[0] + l->out[1]);
    }
    mgrads_bind(gr, c);
}

/* gradient n of the module as a dense float array in the order of the double copy */
static float *grads_gather(const mgrads *gr, const mlayer *l, int n, int64_t *count) {
    const attn_tensor *t = &gr->t[n];
    const mcase *c = &l->c;
    int64_t d0 = t->shape[0], d1 = t->shape[1], d2 = n < G_W ? t->shape[2] : 1;
    *count = d0 * d1 * d2;
    float *out = xcalloc(*count, sizeof(float));
    for (int64_t a = 0; a < d0; a++)
        for (int64_t b = 0; b < d1; b++)
            for (int64_t e = 0; e < d2; e++)
                out[(a * d1 + b) * d2 + e] =
                    ((const float *)t->data)[a * t->stride[0] + b * t->stride[1] + e * t->stride[2]];
    (void)c;
    return out;
}

/* The float64 parameters the finite differences perturb: copies of the layer's, x_kv
 * the same array as x_q in self-attention (so its difference is the total). */
typedef struct fd_ctx {
    const mlayer *l;
    double *p[G_N];
    int64_t n[G_N];
    const attn_options *opt;
    const double *G;
    double *y;
} fd_ctx;

static double fd_loss(const fd_ctx *f) {
    const mcase *c = &f->l->c;
    mref_forward(f->l, f->p[G_XQ], f->p[G_XKV], f->p + G_W, f->p + G_B, f->opt, f->y, NULL);
    double s = 0;
    for (int64_t e = 0; e < c->B * c->Lq * c->E; e++) s += f->G[e] * f->y[e];
    return s;
}

/* the finite-difference gradient of parameter array n */
static double *fd_grad(fd_ctx *f, int n) {
    const double h = 1e-6;
    double *g = xcalloc(f->n[n], sizeof(double));
    for (int64_t e = 0; e < f->n[n]; e++) {
        double keep = f->p[n][e];
        f->p[n][e] = keep + h;
        double up = fd_loss(f);
        f->p[n][e] = keep - h;
        double down = fd_loss(f);
        f->p[n][e] = keep;
        g[e] = (up - down) / (2 * h);
    }
    return g;
}

static int grad_within(const float *got, const double *ref, int64_t n, tol_result *r) {
    double num = 0, den = 0, max_err = 0, max_ref = 0;
    int bad = 0;
    for (int64_t e = 0; e < n; e++) {
        if (!isfinite(got[e])) bad++;
        double d = fabs(got[e] - ref[e]);
        num += d * d;
        den += ref[e] * ref[e];
        max_err = fmax(max_err, d);
        max_ref = fmax(max_ref, fabs(ref[e]));
    }
    r->max_err = max_err;
    /* a gradient of norm under 0.1 is held to an absolute bound on its error: db_K is exactly
     * 0 without RoPE (a bias on every key moves all logits of a row alike), and its
     * float32 value is rounding noise of the size of the other terms' */
    r->rel_err = sqrt(num) / fmax(sqrt(den), 0.1);
    r->max_ref = max_ref;
    return !bad && r->rel_err <= GRAD_REL && max_err <= GRAD_MAX * (1 + max_ref);
}

static const char *const g_names[G_N] = {"dx_q", "dx_kv", "dW_Q", "dW_K", "dW_V", "dW_O",
                                         "db_Q", "db_K", "db_V", "db_O"};

/* The module's gradients against the differences; plant > 0 perturbs the module's dW_Q
 * by that relative amount first; bit n of skip leaves gradient n unchecked (returns the
 * number of failed gradients). */
static int run_grad_case(const mcase *c, const attn_options *opt, const char *what, double plant,
                         unsigned skip) {
    mlayer l;
    mlayer_build(&l, c);
    mgrads gr;
    grads_build(&gr, &l);
    const int64_t ny = c->B * c->Lq * c->E;
    double *G = xcalloc(ny, sizeof(double));
    int64_t n_dy;
    attn_tensor dy = mrows_tensor(NULL, ATTN_F32, c->B, c->Lq, c->E, c->layout, &n_dy);
    float *sdy = xcalloc(n_dy, sizeof(float));
    dy.data = sdy;
    rng_t r = {c->seed ^ 0xabc};
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t i = 0; i < c->Lq; i++)
            for (int64_t e = 0; e < c->E; e++) {
                float x = (float)rng_range(&r, -1, 1);
                G[(b * c->Lq + i) * c->E + e] = x;
                sdy[b * dy.stride[0] + i * dy.stride[1] + e] = x;
            }
    attn_status st = attn_mha_backward(&l.m, &l.txq, c->self ? NULL : &l.txkv, &dy, &gr.g, opt);
    CHECK(st == ATTN_OK, "%s: status %d (%s)", what, st, attn_last_error());
    fd_ctx f = {.l = &l, .opt = opt, .G = G, .y = xcalloc(ny, sizeof(double))};
    const int64_t counts[G_N] = {ny, c->B * c->Lk * c->Ekv};
    for (int n = 0; n < G_N; n++) {
        int64_t cnt = n >= G_B ? l.out[n - G_B] : n >= G_W ? l.in[n - G_W] * l.out[n - G_W] : counts[n];
        const double *src = n == G_XQ ? l.xq : n == G_XKV ? l.xkv : n >= G_B ? l.b[n - G_B] : l.w[n - G_W];
        f.n[n] = cnt;
        if (n == G_XKV && c->self) { f.p[n] = f.p[G_XQ]; continue; }
        if (!src) continue;
        f.p[n] = xcalloc(cnt, sizeof(double));
        memcpy(f.p[n], src, (size_t)cnt * sizeof(double));
    }
    int failed = 0;
    for (int n = 0; n < G_N && st == ATTN_OK; n++) {
        if ((n == G_XKV && c->self) || (n >= G_B && !c->bias) || (skip >> n & 1)) continue;
        int64_t cnt;
        float *got = grads_gather(&gr, &l, n, &cnt);
        if (plant > 0 && n == G_W) got[cnt / 2] *= (float)(1 + plant);
        double *want = fd_grad(&f, n);
        tol_result t;
        int ok = grad_within(got, want, cnt, &t);
        failed += !ok;
        if (plant == 0)
            CHECK(ok, "%s: %s max err %.3g rel %.3g (max ref %.3g)", what, g_names[n],
                  t.max_err, t.rel_err, t.max_ref);
        free(got);
        free(want);
    }
    for (int n = 0; n < G_N; n++)
        if (!(n == G_XKV && c->self)) free(f.p[n]);
    free(f.y); free(G); free(sdy);
    mgrads_free(&gr);
    mlayer_free(&l);
    return failed;
}

static mcase small_case(uint64_t seed) {
    return (mcase){.B = 2, .Lq = 4, .Lk = 5, .E = 6, .Ekv = 5, .Hq = 4, .Hkv = 2, .Dk = 2,
                   .Dv = 3, .bias = true, .seed = seed};
}

static const attn_options opts_causal = {.causal = true};

static void test_gradients(void) {
    int64_t lens[2] = {3, 0};
    attn_tensor kv_len = {lens, ATTN_I64, {2, 1, 1, 1}, {1, 1, 1, 1}};
    unsigned char pad[10] = {1, 1, 0, 1, 1, 0, 1, 1, 1, 1};
    attn_tensor kpm = {pad, ATTN_BOOL, {2, 1, 1, 5}, {5, 0, 0, 1}};
    char what[128];
    uint64_t seed = 10;
    for (int self = 0; self < 2; self++)
        for (int v = 0; v < 4; v++) {
            mcase c = small_case(seed++);
            c.self = self;
            if (self) { c.Lk = c.Lq; c.Ekv = c.E; c.Dv = c.Dk; }
            c.torch = v >= 2;
            if (self && c.torch) { c.Hkv = c.Hq; c.Dk = c.Dv = 2; c.E = 8; c.Ekv = 8; }
            c.layout = v % 3;
            c.bias = v != 1;
            c.rope = (attn_rope){.kind = (attn_rope_kind)(v % 3), .offset = v, .base = 50};
            const attn_options opts[3] = {
                {.causal = true},
                {.causal = true, .align = ATTN_ALIGN_BOTTOM_RIGHT, .kv_len = self ? NULL : &kv_len},
                {.mask = self ? NULL : &kpm, .softcap = 2.0f},
            };
            snprintf(what, sizeof what, "self %d variant %d", self, v);
            run_grad_case(&c, &opts[v % 3], what, 0, 0);
        }
    mcase c = small_case(99);
    c.Hkv = 1;
    run_grad_case(&c, NULL, "GQA 4:1, no options", 0, 0);
    c = small_case(98);
    c.bf16 = true;
    c.layout = 2;
    c.rope.kind = ATTN_ROPE_HALF;
    run_grad_case(&c, &opts_causal, "bfloat16 x, weights and biases", 0, 0);
    /* one row (B = Lq = 1): the products by Wᵀ are matrix-vector ones */
    c = (mcase){.B = 1, .Lq = 1, .Lk = 3, .E = 6, .Ekv = 5, .Hq = 2, .Hkv = 1, .Dk = 2,
                .Dv = 3, .bias = true, .torch = true, .seed = 96};
    run_grad_case(&c, NULL, "one query row, PyTorch's layout", 0, 0);
    c.bf16 = true;
    run_grad_case(&c, NULL, "one query row, bfloat16", 0, 0);
    c.torch = false;  /* bfloat16 [in, out] rows read in place by the one-row products */
    run_grad_case(&c, NULL, "one query row, bfloat16 [in, out]", 0, 0);
    /* E = 301: the one-row products by W_Oᵀ (PyTorch's layout) and W (the other) over
     * rows split into uneven chunks */
    c = (mcase){.B = 1, .Lq = 1, .Lk = 3, .E = 301, .Ekv = 5, .Hq = 2, .Hkv = 1, .Dk = 2,
                .Dv = 3, .bias = true, .bf16 = true, .seed = 95};
    for (int torch = 0; torch < 2; torch++) {
        c.torch = torch;
        run_grad_case(&c, NULL, torch ? "one query row, bfloat16, E 301, PyTorch's layout"
                                      : "one query row, bfloat16, E 301 [in, out]", 0, 0);
    }
    /* widths over a widening panel (MHA_PANEL rows): the products by W and Wᵀ in
     * several panels, seen in dx_q, dx_kv, dW_O and the biases */
    c = (mcase){.B = 2, .Lq = 3, .Lk = 4, .E = 300, .Ekv = 270, .Hq = 2, .Hkv = 1, .Dk = 4,
                .Dv = 3, .bias = true, .bf16 = true, .seed = 97,
                .rope = {.kind = ATTN_ROPE_HALF}};  /* (db_K is then not 0) */
    run_grad_case(&c, &opts_causal, "bfloat16, E 300 / 270 over two panels", 0,
                  1u << G_W | 1u << (G_W + 1) | 1u << (G_W + 2));
}

/* the same gradients, bit for bit, on 1 and 2 threads */
static void test_determinism(void) {
    mcase c = small_case(200);
    c.Lq = 70; c.Lk = 90; c.E = 32; c.Ekv = 24; c.Dk = 8; c.Dv = 8;
    c.rope.kind = ATTN_ROPE_HALF;
    mlayer l;
    mlayer_build(&l, &c);
    mgrads gr[2];
    float *dyb = xcalloc(c.B * c.Lq * c.E, sizeof(float));
    rng_t r = {3};
    for (int64_t e = 0; e < c.B * c.Lq * c.E; e++) dyb[e] = (float)rng_range(&r, -1, 1);
    attn_tensor dy = {dyb, ATTN_F32, {c.B, c.Lq, c.E, 1}, {c.Lq * c.E, c.E, 1, 1}};
    for (int t = 0; t < 2; t++) {
        grads_build(&gr[t], &l);
#ifdef _OPENMP
        omp_set_num_threads(t + 1);
#endif
        attn_options opt = {.causal = true, .threads = t + 1};
        CHECK(attn_mha_backward(&l.m, &l.txq, &l.txkv, &dy, &gr[t].g, &opt) == ATTN_OK,
              "determinism: %s", attn_last_error());
    }
    for (int n = 0; n < G_N; n++)
        CHECK(memcmp(gr[0].buf[n], gr[1].buf[n], (size_t)gr[0].n[n] * sizeof(float)) == 0,
              "determinism: %s differs between 1 and 2 threads", g_names[n]);
    for (int t = 0; t < 2; t++) mgrads_free(&gr[t]);
    free(dyb);
    mlayer_free(&l);
}

static int all_untouched(const mgrads *gr) {
    for (int n = 0; n < G_N; n++)
        if (gr->buf[n] && count_written(gr->buf[n], gr->n[n])) return 0;
    return 1;
}

static void test_misuse(void) {
    mcase c = small_case(300);
    mlayer l;
    mlayer_build(&l, &c);
    mgrads gr;
    grads_build(&gr, &l);
    float dyb[2 * 4 * 6] = {0};
    attn_tensor dy = attn_tensor_4d(dyb, ATTN_F32, 2, 4, 6, 1);
    mcase cs = c;
    cs.self = true; cs.Lk = c.Lq; cs.Ekv = c.E; cs.Dv = c.Dk;
    mlayer ls;
    mlayer_build(&ls, &cs);
    mgrads gs;
    grads_build(&gs, &ls);
    gs.g.dx_kv = &gs.t[G_XQ];
    attn_status st = attn_mha_backward(&ls.m, &ls.txq, NULL, &dy, &gs.g, NULL);
    CHECK(st == ATTN_ERR_VALUE && all_untouched(&gs), "dx_kv in self-attention: %d", st);
    mgrads_free(&gs);
    mlayer_free(&ls);
    gr.t[G_W + 1].shape[1] += 1;
    st = attn_mha_backward(&l.m, &l.txq, &l.txkv, &dy, &gr.g, NULL);
    CHECK(st == ATTN_ERR_SHAPE && all_untouched(&gr), "dW_K shape: %d", st);
    gr.t[G_W + 1].shape[1] -= 1;
    dy.shape[1] = 3;
    st = attn_mha_backward(&l.m, &l.txq, &l.txkv, &dy, &gr.g, NULL);
    CHECK(st == ATTN_ERR_SHAPE && all_untouched(&gr), "dy shape: %d", st);
    dy.shape[1] = 4;
    gr.t[G_B].dtype = ATTN_BF16;
    st = attn_mha_backward(&l.m, &l.txq, &l.txkv, &dy, &gr.g, NULL);
    CHECK(st == ATTN_ERR_DTYPE && all_untouched(&gr), "db_Q bfloat16: %d", st);
    gr.t[G_B].dtype = ATTN_F32;
    int64_t lens[2] = {9, 0};
    attn_tensor kv_len = {lens, ATTN_I64, {2, 1, 1, 1}, {1, 1, 1, 1}};
    st = attn_mha_backward(&l.m, &l.txq, &l.txkv, &dy, &gr.g, &(attn_options){.kv_len = &kv_len});
    CHECK(st == ATTN_ERR_VALUE && all_untouched(&gr), "kv_len > Lk: %d", st);
    mgrads_free(&gr);
    mlayer_free(&l);
}

int main(void) {
    test_gradients();
    test_determinism();
    test_misuse();
    /* planted: dW_Q off by 1e-4 of one entry's value must fail the gradient check */
    mcase c = small_case(400);
    c.rope.kind = ATTN_ROPE_INTERLEAVED;
    CHECK(run_grad_case(&c, NULL, "planted", 0, 0) == 0, "unplanted case fails");
    CHECK(run_grad_case(&c, NULL, "planted", 1e-4, 0) == 1, "the planted dW_Q error was not caught");
    return check_summary("test_mha_backward");
}
