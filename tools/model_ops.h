/*
 * model_ops.h — the layers of `attn train`'s transformer other than attention, forward
 *               and backward, each written once for a real type REAL.
 *
 * A template, not an ordinary header: there is no include guard on purpose. Define
 * REAL (float or double) and OP(name) (the name of each function, e.g. name##_f), then
 * include it; tools/model.c instantiates it for float (the model), tests/test_model.c
 * for double (central finite differences need double). Math through <tgmath.h>, so that
 * tanh, exp, log and sqrt follow REAL.
 *
 * Conventions: N = B * T rows (tokens), row-major; every backward ADDS into the parameter
 * gradients (the model zeroes them once per step) and into dinp where stated. Loops that
 * run on threads give each output element to one thread with a fixed order of terms, so
 * results do not depend on the thread count. What it is not: attention (the library's
 * attn_forward / attn_backward, in model.c), the optimizer, or anything that allocates.
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

/* ---- matmul ------------------------------------------------------------------------------ */

/* C = [bias +] A B, or C += A B (accumulate), for M x NC of C:
 *   A (M, K): element (r, k) at a[r * ars + k * aks]   (so Aᵀ is A with the strides swapped)
 *   B (K, NC): element (k, c) at b[k * ldb + c]          C: element (r, c) at cm[r * ldc + c]
 * Blocks of 4 rows x 16 columns keep their sums in local arrays the compiler holds in
 * registers; each sum runs over k in order from 0 and is then added (or stored) once, so
 * the result does not depend on the thread count (threads take blocks of rows). */
static inline void OP(gemm)(REAL *cm, int64_t ldc, const REAL *a, int64_t ars, int64_t aks,
                            const REAL *b, int64_t ldb, const REAL *bias, int64_t M, int64_t NC,
                            int64_t K, int accumulate) {
    const int64_t blocks = (M + 3) / 4;
#pragma omp parallel for schedule(static)
    for (int64_t mb = 0; mb < blocks; mb++) {
        const int64_t r0 = mb * 4, nr = M - r0 < 4 ? M - r0 : 4;
        for (int64_t c0 = 0; c0 < NC; c0 += 16) {
            const int64_t nc = NC - c0 < 16 ? NC - c0 : 16;
            REAL acc[4][16];
            for (int r = 0; r < 4; r++)
                for (int c = 0; c < 16; c++) acc[r][c] = 0;
            if (nr == 4 && nc == 16) {
                const REAL *a0 = a + r0 * ars, *a1 = a0 + ars, *a2 = a1 + ars, *a3 = a2 + ars;
                for (int64_t k = 0; k < K; k++) {
                    const REAL *b_k = b + k * ldb + c0;
                    const REAL x0 = a0[k * aks], x1 = a1[k * aks], x2 = a2[k * aks], x3 = a3[k * aks];
                    for (int c = 0; c < 16; c++) {
                        const REAL y = b_k[c];
                        acc[0][c] += x0 * y;
                        acc[1][c] += x1 * y;
                        acc[2][c] += x2 * y;
                        acc[3][c] += x3 * y;
                    }
                }
            } else {  // the edges: the same sums, one at a time
                for (int64_t k = 0; k < K; k++)
                    for (int64_t r = 0; r < nr; r++) {
                        const REAL x = a[(r0 + r) * ars + k * aks];
                        for (int64_t c = 0; c < nc; c++) acc[r][c] += x * b[k * ldb + c0 + c];
                    }
            }
            for (int64_t r = 0; r < nr; r++) {
                REAL *o = cm + (r0 + r) * ldc + c0;
                for (int64_t c = 0; c < nc; c++)
                    o[c] = accumulate ? o[c] + acc[r][c] : (bias ? bias[c0 + c] : (REAL)0) + acc[r][c];
            }
        }
    }
}

/* out = inp w + bias
 *   out (N, OC)   inp (N, IC)   w (IC, OC)   bias (OC) or NULL */
static inline void OP(matmul_forward)(REAL *out, const REAL *inp, const REAL *w,
                                      const REAL *bias, int64_t N, int64_t IC, int64_t OC) {
    OP(gemm)(out, OC, inp, IC, 1, w, OC, bias, N, OC, IC, 0);
}

/* forward: out = inp w + bias, so
 *   dinp += dout wᵀ,   dw += inpᵀ dout,   dbias += Σ_n dout
 * wt (OC, IC) is scratch for wᵀ, so that every product reads B along its rows. */
static inline void OP(matmul_backward)(REAL *dinp, REAL *dw, REAL *dbias, const REAL *dout,
                                       const REAL *inp, const REAL *w, REAL *wt, int64_t N,
                                       int64_t IC, int64_t OC) {
    for (int64_t i = 0; i < IC; i++)
        for (int64_t c = 0; c < OC; c++) wt[c * IC + i] = w[i * OC + c];
    OP(gemm)(dinp, IC, dout, OC, 1, wt, IC, NULL, N, IC, OC, 1);
    OP(gemm)(dw, OC, inp, 1, IC, dout, OC, NULL, IC, OC, N, 1);
    if (dbias)
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < OC; c++) dbias[c] += dout[n * OC + c];
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
