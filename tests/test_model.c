/*
 * test_model.c — the hand-written layers of `attn train` (examples/train/model_ops.h) and the
 *                model that composes them with the library's parts (examples/train/model.c).
 *
 * What it covers:
 *  1. Each layer's backward against central finite differences of its forward, in
 *     float64 (model_ops.h instantiated for double): embeddings, layer norm, GELU,
 *     softmax cross-entropy. Relative Frobenius error under 1e-6 per gradient. (The
 *     matrix products are the BLAS's and the attention layer the library's module,
 *     tested by test_mha*.c; their wiring is what 2. checks.)
 *  2. The whole float32 model, attention included, against finite differences of its
 *     loss along each parameter tensor's own gradient direction: within 2e-2 of the
 *     gradient's norm plus the float32 loss's noise (see tensor_check()), so that a wrong
 *     wiring (errors of order 1) cannot pass.
 *  3. Training is bit-identical on 1 and 2 threads; the model learns a periodic text.
 *  4. Both comparisons reject a planted error.
 * What it is not: a test of the attention gradients (test_backward.c) or of the command
 * (examples/train/cli_train.c). The model is compiled into this program from examples/train/model.c.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "model.c" /* examples/train/model.c, on the include path */
#include "check.h"

#define REAL double
#define OP(name) name##_d
#include "model_ops.h"
#include "rng.h"
#undef REAL
#undef OP

static rng_t g_rng = {12345};
static double unif(void) { return rng_sym(&g_rng); }
static double *rand_vec(int64_t n, double amp) {
    double *x = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    for (int64_t e = 0; e < n; e++) x[e] = amp * unif();
    return x;
}
static double *zeros(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(double)); }

static double rel_err(const double *got, const double *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t e = 0; e < n; e++) {
        num += (got[e] - ref[e]) * (got[e] - ref[e]);
        den += ref[e] * ref[e];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
/* the layer checks' bound */
static int fd_ok(const double *got, const double *ref, int64_t n, double *err) {
    *err = rel_err(got, ref, n);
    return *err < 1e-6;
}

/* ---- 1. each layer against finite differences (float64) -------------------------------- */

/* A layer under test: its forward writes an output; the scalar is Σ w ∘ output. */
typedef struct layer_case {
    const char *name;
    double (*loss)(void *ctx);  // the forward, then Σ w ∘ out
    void *ctx;
} layer_case;

/* central differences of f along each element of x */
static void fd(double (*f)(void *), void *ctx, double *x, int64_t n, double *g) {
    for (int64_t e = 0; e < n; e++) {
        const double x0 = x[e], h = 1e-5 * (fabs(x0) > 1 ? fabs(x0) : 1);
        x[e] = x0 + h;
        const double lp = f(ctx);
        x[e] = x0 - h;
        const double lm = f(ctx);
        x[e] = x0;
        g[e] = (lp - lm) / (2 * h);
    }
}
static double dot(const double *a, const double *b, int64_t n) {
    double s = 0;
    for (int64_t e = 0; e < n; e++) s += a[e] * b[e];
    return s;
}
static double g_worst;  // the worst layer error, reported
static void compare(const char *layer, const char *what, const double *got, const double *fdg,
                    int64_t n) {
    double err;
    CHECK(fd_ok(got, fdg, n, &err), "%s: d%s relative error %.3g >= 1e-6", layer, what, err);
    if (err > g_worst) g_worst = err;
}

enum { N_ = 7, T_ = 3, C_ = 6, V_ = 5 };

typedef struct enc_ctx {
    double *wte, *wpe, *out, *w;
    int tok[N_];
} enc_ctx;
static double enc_loss(void *p) {
    enc_ctx *c = p;
    encoder_forward_d(c->out, c->tok, c->wte, c->wpe, N_, T_, C_);
    return dot(c->out, c->w, N_ * C_);
}
static void check_encoder(void) {
    enc_ctx c = {rand_vec(V_ * C_, 1), rand_vec(T_ * C_, 1), zeros(N_ * C_), rand_vec(N_ * C_, 1), {0}};
    for (int n = 0; n < N_; n++) c.tok[n] = (n * 3 + 1) % V_;
    double *dwte = zeros(V_ * C_), *dwpe = zeros(T_ * C_), *f1 = zeros(V_ * C_), *f2 = zeros(T_ * C_);
    encoder_backward_d(dwte, dwpe, c.w, c.tok, N_, T_, C_);  // dout = w
    fd(enc_loss, &c, c.wte, V_ * C_, f1);
    fd(enc_loss, &c, c.wpe, T_ * C_, f2);
    compare("encoder", "wte", dwte, f1, V_ * C_);
    compare("encoder", "wpe", dwpe, f2, T_ * C_);
    free(c.wte); free(c.wpe); free(c.out); free(c.w); free(dwte); free(dwpe); free(f1); free(f2);
}

typedef struct ln_ctx {
    double *x, *g, *b, *out, *mean, *rstd, *w;
} ln_ctx;
static double ln_loss(void *p) {
    ln_ctx *c = p;
    layernorm_forward_d(c->out, c->mean, c->rstd, c->x, c->g, c->b, N_, C_);
    return dot(c->out, c->w, N_ * C_);
}
static void check_layernorm(void) {
    ln_ctx c = {rand_vec(N_ * C_, 2), rand_vec(C_, 1), rand_vec(C_, 1), zeros(N_ * C_),
                zeros(N_), zeros(N_), rand_vec(N_ * C_, 1)};
    ln_loss(&c);
    double *dx = zeros(N_ * C_), *dg = zeros(C_), *db = zeros(C_);
    layernorm_backward_d(dx, dg, db, c.w, c.x, c.g, c.mean, c.rstd, N_, C_);
    double *f1 = zeros(N_ * C_), *f2 = zeros(C_), *f3 = zeros(C_);
    fd(ln_loss, &c, c.x, N_ * C_, f1);
    fd(ln_loss, &c, c.g, C_, f2);
    fd(ln_loss, &c, c.b, C_, f3);
    compare("layernorm", "x", dx, f1, N_ * C_);
    compare("layernorm", "g", dg, f2, C_);
    compare("layernorm", "b", db, f3, C_);
    free(c.x); free(c.g); free(c.b); free(c.out); free(c.mean); free(c.rstd); free(c.w);
    free(dx); free(dg); free(db); free(f1); free(f2); free(f3);
}

typedef struct gelu_ctx {
    double *x, *out, *w;
} gelu_ctx;
static double gelu_loss(void *p) {
    gelu_ctx *c = p;
    gelu_forward_d(c->out, c->x, N_ * C_);
    return dot(c->out, c->w, N_ * C_);
}
static void check_gelu(void) {
    gelu_ctx c = {rand_vec(N_ * C_, 3), zeros(N_ * C_), rand_vec(N_ * C_, 1)};
    double *dx = zeros(N_ * C_), *f1 = zeros(N_ * C_);
    gelu_backward_d(dx, c.x, c.w, N_ * C_);
    fd(gelu_loss, &c, c.x, N_ * C_, f1);
    compare("gelu", "x", dx, f1, N_ * C_);
    free(c.x); free(c.out); free(c.w); free(dx); free(f1);
}

typedef struct xent_ctx {
    double *z, *probs, *losses;
    int t[N_];
} xent_ctx;
static double xent_loss(void *p) {
    xent_ctx *c = p;
    return crossentropy_forward_d(c->probs, c->losses, c->z, c->t, N_, V_);
}
static void check_crossentropy(void) {
    xent_ctx c = {rand_vec(N_ * V_, 4), zeros(N_ * V_), zeros(N_), {0}};
    for (int n = 0; n < N_; n++) c.t[n] = (n * 2 + 1) % V_;
    xent_loss(&c);
    double *dz = zeros(N_ * V_), *f1 = zeros(N_ * V_);
    crossentropy_backward_d(dz, c.probs, c.t, N_, V_);
    fd(xent_loss, &c, c.z, N_ * V_, f1);
    compare("crossentropy", "logits", dz, f1, N_ * V_);
    free(c.z); free(c.probs); free(c.losses); free(dz); free(f1);
}

/* ---- 2. the whole model (float32, the library's attention) -------------------------------- */

static model_config tiny(bool reversed) {
    model_config c = {.vocab = 11, .ctx = 8, .d_model = 16, .heads = 2, .layers = 2,
                      .batch = 3, .reversed = reversed, .seed = 7};
    return c;
}

static double model_loss(model *m, const int *tok, const int *tgt, int b, int t) {
    double loss = NAN;
    CHECK(model_forward(m, tok, tgt, b, t, &loss) == 0, "forward: %s", model_error(m));
    return loss;
}

/* The directional derivative along u = g_T / ‖g_T‖ for the parameter tensor
 * T = [off, off + n), analytic (= ‖g_T‖) and by central differences; an error in that
 * tensor's gradient (or in how the tensor is wired) shows up as an error of order ‖g_T‖.
 * Two terms limit the comparison (both measured): truncation, h² L''' / 6, which scales
 * as h² (9e-3 ‖g_T‖ at h = 1e-2 on the worst tensor, 3e-3 at h = 6e-3), and the float32
 * evaluation of the loss, a mean of 24 cross-entropies near 2.4 that is off by about
 * 4e-8 (about 2e-8 relative), which enters as noise / h (3e-2 ‖g_T‖ at h = 1e-3 for a
 * tensor with ‖g_T‖ = 1e-3). With h = 5e-3 the check is
 *     |fd - ‖g_T‖| <= 2e-2 ‖g_T‖ + 2 * 1e-7 |L| / h,
 * the noise allowance taking 1e-7 relative per loss, 5x what was measured. Returns the
 * ratio of the error to that bound (pass: < 1). */
static double tensor_check(model *m, const int *tok, const int *tgt, int b, int t,
                           int64_t off, int64_t n, const float *g) {
    float *p = model_params(m);
    double norm = 0;
    for (int64_t e = 0; e < n; e++) norm += (double)g[off + e] * g[off + e];
    norm = sqrt(norm);
    if (norm == 0) return 0;
    const double h = 5e-3;
    float *saved = malloc((size_t)n * sizeof(float));
    memcpy(saved, p + off, (size_t)n * sizeof(float));
    for (int64_t e = 0; e < n; e++) p[off + e] = (float)(saved[e] + h * g[off + e] / norm);
    const double lp = model_loss(m, tok, tgt, b, t);
    for (int64_t e = 0; e < n; e++) p[off + e] = (float)(saved[e] - h * g[off + e] / norm);
    const double lm = model_loss(m, tok, tgt, b, t);
    memcpy(p + off, saved, (size_t)n * sizeof(float));
    free(saved);
    const double fdd = (lp - lm) / (2 * h);
    const double bound = 2e-2 * norm + 2 * 1e-7 * fabs(lp + lm) / 2 / h;
    return fabs(fdd - norm) / bound;
}

static void whole_model(void) {
    for (int rev = 0; rev < 2; rev++) {
        const model_config cfg = tiny(rev);
        const char *why = "";
        model *m = model_create(&cfg, &why);
        CHECK(m != NULL, "model_create: %s", why);
        if (!m) return;
        int tok[24], tgt[24];
        for (int e = 0; e < 24; e++) {
            tok[e] = (e * 7 + 3) % cfg.vocab;
            tgt[e] = (e * 5 + 1) % cfg.vocab;
        }
        /* a few AdamW steps first, so that no tensor sits at its initial symmetric point
         * (the layer-norm biases and gains, the zero biases) */
        for (int s = 0; s < 5; s++) {
            model_loss(m, tok, tgt, 3, 8);
            model_zero_grad(m);
            CHECK(model_backward(m) == 0, "backward: %s", model_error(m));
            model_adamw(m, 1e-2, 0.0, 0.0);
        }
        model_loss(m, tok, tgt, 3, 8);
        model_zero_grad(m);
        CHECK(model_backward(m) == 0, "backward: %s", model_error(m));
        const int64_t np = model_param_count(m);
        float *g = malloc((size_t)np * sizeof(float));
        memcpy(g, model_grads(m), (size_t)np * sizeof(float));
        double worst = 0;
        for (int s = 0; s < m->n_seg; s++) {
            const double err = tensor_check(m, tok, tgt, 3, 8, m->seg[s].off, m->seg[s].size, g);
            CHECK(err < 1, "model (%s): tensor %d: directional derivative off by %.3g of the bound",
                  rev ? "reversed" : "causal", s, err);
            if (err > worst) worst = err;
        }
        printf("model: whole %s model, %d tensors, worst directional error %.2g of the bound\n",
               rev ? "reversed" : "causal", m->n_seg, worst);
        /* planted: the gradient of one attention weight tensor scaled by 1.05 */
        const segment *sq = &m->seg[4];  // block 0's w_qkv
        for (int64_t e = 0; e < sq->size; e++) g[sq->off + e] *= 1.05f;
        const double err = tensor_check(m, tok, tgt, 3, 8, sq->off, sq->size, g);
        CHECK(err >= 1, "planted: a 5%% error in dw_qkv passes the model check (%.3g)", err);
        free(g);
        model_free(m);
    }
}

/* ---- 3. determinism and learning ----------------------------------------------------------- */

static void train_steps(model *m, int steps, double *last) {
    int tok[24], tgt[24];
    for (int s = 0; s < steps; s++) {
        for (int e = 0; e < 24; e++) {  // a periodic text: "abcdefg" over and over
            const int pos = (s * 5 + e) % 7;
            tok[e] = pos;
            tgt[e] = (pos + 1) % 7;
        }
        model_loss(m, tok, tgt, 3, 8);
        model_zero_grad(m);
        CHECK(model_backward(m) == 0, "backward: %s", model_error(m));
        model_adamw(m, 1e-2, 0.01, 1.0);
    }
    *last = model_loss(m, tok, tgt, 3, 8);
}

static void determinism_and_learning(void) {
    model_config cfg = tiny(false);
    float *saved[2] = {NULL, NULL};
    double last[2] = {0, 0};
    for (int run = 0; run < 2; run++) {
#ifdef _OPENMP
        omp_set_num_threads(run + 1);
#endif
        model *m = model_create(&cfg, NULL);
        train_steps(m, 60, &last[run]);
        saved[run] = malloc((size_t)model_param_count(m) * sizeof(float));
        memcpy(saved[run], model_params(m), (size_t)model_param_count(m) * sizeof(float));
        if (run == 1) {
            CHECK(memcmp(saved[0], saved[1], (size_t)model_param_count(m) * sizeof(float)) == 0,
                  "training differs between 1 and 2 threads");
            /* planted: one bit apart is not the same */
            saved[1][3] = nextafterf(saved[1][3], INFINITY);
            CHECK(memcmp(saved[0], saved[1], (size_t)model_param_count(m) * sizeof(float)) != 0,
                  "planted: the bit comparison misses one ulp");
        }
        model_free(m);
    }
#ifdef _OPENMP
    omp_set_num_threads(2);
#endif
    CHECK(last[0] == last[1], "losses differ between thread counts");
    printf("model: periodic text, loss after 60 steps %.4f (ln 7 = %.3f at the start)\n", last[0],
           log(7.0));
    CHECK(last[0] < 0.1, "the model does not learn a periodic text: loss %.3f", last[0]);
    free(saved[0]);
    free(saved[1]);
}

/* ---- 4. the layer check rejects a planted error -------------------------------------------- */

static void planted(void) {
    double a[20], b[20], err;
    for (int e = 0; e < 20; e++) a[e] = b[e] = unif();
    CHECK(fd_ok(a, b, 20, &err), "planted: equal gradients rejected");
    a[7] += 1e-5;
    CHECK(!fd_ok(a, b, 20, &err), "planted: an error of 1e-5 accepted (%.3g)", err);
    for (int e = 0; e < 20; e++) a[e] = 2 * b[e];
    CHECK(!fd_ok(a, b, 20, &err), "planted: a doubled gradient accepted");
}

int main(void) {
    check_encoder();
    check_layernorm();
    check_gelu();
    check_crossentropy();
    printf("model: layers vs finite differences (float64), worst relative error %.2g\n", g_worst);
    whole_model();
    determinism_and_learning();
    planted();
    return check_summary("model");
}
