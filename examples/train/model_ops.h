/*
 * model_ops.h — the layers of `attn train`'s transformer other than attention, forward
 *               and backward, each written once for a real type REAL.
 *
 * A template, not an ordinary header: there is no include guard on purpose. Define
 * REAL (float or double) and OP(name) (the name of each function, e.g. name##_f), then
 * include it; examples/train/model.c instantiates it for float (the model), tests/test_model.c
 * for double (central finite differences need double). Math through <tgmath.h>, so that
 * tanh, exp, log and sqrt follow REAL.
 *
 * Conventions: N = B * T rows (tokens), row-major; every backward ADDS into the parameter
 * gradients (the model zeroes them once per step) and into dinp where stated. Loops that
 * run on threads give each output element to one thread with a fixed order of terms, so
 * results do not depend on the thread count. What it is not: a matrix product (model.c
 * calls the library's BLAS door for those), attention (the library's multi-head module,
 * in model.c), the optimizer, or anything that allocates.
 */
#include <stdint.h>
#include <tgmath.h>

#if !defined(REAL) || !defined(OP)
#error "define REAL and OP(name) before including model_ops.h"
#endif

/* ---- token and position embeddings ------------------------------------------------- */

/* out[n] = wte[tok[n]] + wpe[n % T]
 *   out (N, C)   tok (N)   wte (V, C)   wpe (T, C) */
static inline void OP(encoder_forward)(REAL *out, const int *tok, const REAL *wte,
                                       const REAL *wpe, int64_t N, int64_t T, int64_t C) {
    for (int64_t n = 0; n < N; n++) {
        const REAL *e = wte + (int64_t)tok[n] * C, *pos = wpe + (n % T) * C;
        REAL *o = out + n * C;
        for (int64_t c = 0; c < C; c++) o[c] = e[c] + pos[c];
    }
}

/* dwte[tok[n]] += dout[n], dwpe[n % T] += dout[n]; rows in order n = 0, 1, ... */
static inline void OP(encoder_backward)(REAL *dwte, REAL *dwpe, const REAL *dout,
                                        const int *tok, int64_t N, int64_t T, int64_t C) {
    for (int64_t n = 0; n < N; n++) {
        REAL *de = dwte + (int64_t)tok[n] * C, *dp = dwpe + (n % T) * C;
        const REAL *d = dout + n * C;
        for (int64_t c = 0; c < C; c++) {
            de[c] += d[c];
            dp[c] += d[c];
        }
    }
}

/* ---- layer norm ---------------------------------------------------------------------------- */

#define MODEL_LN_EPS 1e-5

/* out = (x - mean) * rstd * g + b per row; mean and rstd kept for the backward
 *   out, inp (N, C)   mean, rstd (N)   g, b (C) */
static inline void OP(layernorm_forward)(REAL *out, REAL *mean, REAL *rstd, const REAL *inp,
                                         const REAL *g, const REAL *b, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const REAL *x = inp + n * C;
        REAL m = 0, v = 0;
        for (int64_t c = 0; c < C; c++) m += x[c];
        m /= (REAL)C;
        for (int64_t c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
        v /= (REAL)C;
        const REAL rs = (REAL)1 / sqrt(v + (REAL)MODEL_LN_EPS);
        REAL *o = out + n * C;
        for (int64_t c = 0; c < C; c++) o[c] = (x[c] - m) * rs * g[c] + b[c];
        mean[n] = m;
        rstd[n] = rs;
    }
}

/* forward: y = xhat * g + b, xhat = (x - mean) * rstd, so
 *   dg += Σ_n dy xhat,   db += Σ_n dy,
 *   dx += rstd (dxhat - mean_c(dxhat) - xhat mean_c(dxhat xhat)),  dxhat = dy g
 * (the last from mean and rstd depending on every x of the row). */
static inline void OP(layernorm_backward)(REAL *dinp, REAL *dg, REAL *db, const REAL *dout,
                                          const REAL *inp, const REAL *g, const REAL *mean,
                                          const REAL *rstd, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const REAL *x = inp + n * C, *dy = dout + n * C;
        const REAL m = mean[n], rs = rstd[n];
        REAL s1 = 0, s2 = 0;  // mean of dxhat and of dxhat * xhat
        for (int64_t c = 0; c < C; c++) {
            const REAL dxh = dy[c] * g[c];
            s1 += dxh;
            s2 += dxh * (x[c] - m) * rs;
        }
        s1 /= (REAL)C;
        s2 /= (REAL)C;
        REAL *dx = dinp + n * C;
        for (int64_t c = 0; c < C; c++) {
            const REAL xh = (x[c] - m) * rs;
            dx[c] += rs * (dy[c] * g[c] - s1 - xh * s2);
        }
    }
    /* the parameters: rows summed in order by one thread */
    for (int64_t n = 0; n < N; n++) {
        const REAL *x = inp + n * C, *dy = dout + n * C;
        const REAL m = mean[n], rs = rstd[n];
        for (int64_t c = 0; c < C; c++) {
            dg[c] += dy[c] * (x[c] - m) * rs;
            db[c] += dy[c];
        }
    }
}

/* ---- GELU (the tanh form) ------------------------------------------------------------- */

#define MODEL_GELU_K 0.7978845608028654  /* sqrt(2 / pi) */

/* out = x/2 (1 + tanh(k (x + 0.044715 x³))), elementwise over n values */
static inline void OP(gelu_forward)(REAL *out, const REAL *inp, int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < n; e++) {
        const REAL x = inp[e];
        const REAL u = (REAL)MODEL_GELU_K * (x + (REAL)0.044715 * x * x * x);
        out[e] = (REAL)0.5 * x * ((REAL)1 + tanh(u));
    }
}

/* forward: y = x/2 (1 + tanh u), u = k (x + 0.044715 x³), so
 *   dy/dx = (1 + tanh u)/2 + x/2 (1 - tanh² u) k (1 + 3 * 0.044715 x²);  dinp += dout dy/dx */
static inline void OP(gelu_backward)(REAL *dinp, const REAL *inp, const REAL *dout, int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < n; e++) {
        const REAL x = inp[e];
        const REAL u = (REAL)MODEL_GELU_K * (x + (REAL)0.044715 * x * x * x);
        const REAL t = tanh(u);
        const REAL du = (REAL)MODEL_GELU_K * ((REAL)1 + (REAL)(3 * 0.044715) * x * x);
        dinp[e] += dout[e] * ((REAL)0.5 * ((REAL)1 + t) + (REAL)0.5 * x * ((REAL)1 - t * t) * du);
    }
}

/* ---- softmax and cross-entropy ------------------------------------------------------------ */

/* Per row n: probs = softmax(logits), losses[n] = -log probs[target[n]] computed as
 * lse - logit (no log of a rounded probability). Returns the mean loss (in double).
 *   probs, logits (N, V) (probs may be logits)   targets, losses (N) */
static inline double OP(crossentropy_forward)(REAL *probs, REAL *losses, const REAL *logits,
                                              const int *targets, int64_t N, int64_t V) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const REAL *z = logits + n * V;
        REAL *p = probs + n * V;
        REAL m = z[0];
        for (int64_t v = 1; v < V; v++)
            if (z[v] > m) m = z[v];
        REAL s = 0;
        const REAL zt = z[targets[n]];
        for (int64_t v = 0; v < V; v++) {
            p[v] = exp(z[v] - m);
            s += p[v];
        }
        for (int64_t v = 0; v < V; v++) p[v] /= s;
        losses[n] = m + log(s) - zt;
    }
    double total = 0;  // summed in row order: the same bits for any thread count
    for (int64_t n = 0; n < N; n++) total += (double)losses[n];
    return N > 0 ? total / (double)N : 0.0;
}

/* forward: loss = mean_n (-log softmax(z_n)[t_n]), so dz_nv = (p_nv - [v = t_n]) / N */
static inline void OP(crossentropy_backward)(REAL *dlogits, const REAL *probs, const int *targets,
                                             int64_t N, int64_t V) {
    const REAL scale = (REAL)1 / (REAL)N;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const REAL *p = probs + n * V;
        REAL *d = dlogits + n * V;
        for (int64_t v = 0; v < V; v++) d[v] = p[v] * scale;
        d[targets[n]] -= scale;
    }
}
