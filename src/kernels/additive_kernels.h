/*
 * additive_kernels.h — the contract of additive (Bahdanau) attention's scoring
 *                      micro-kernels: one table per ISA, each compiled from
 *                      additive_body.h in its kernel folder (src/kernels/<isa>/additive.c).
 *
 * What it is not: the additive layer's params and paths (src/additive/additive.h), which
 * call these tables; the kernels include this header alone, never the layer's.
 */
#ifndef ATTN_ADDITIVE_KERNELS_H
#define ATTN_ADDITIVE_KERNELS_H

#include "core/attn_internal.h"

/* Keys per scoring tile: the kernels handle any nk <= this; the fused paths never hold
 * more than A x ATTN_ADD_TILE of the Lq x Lk x A work per thread. */
#define ATTN_ADD_TILE 64

/* The scoring micro-kernels. Every loop runs in a fixed order (a = 0..A-1 for each
 * score), so a result does not depend on the thread that computes it.
 *   tanh(n, x, y)      y[c] = tanh(x[c]), the bound of docs/CONTRACT.md
 *   score(nk, A, qp, kpt, ldk, vt, e, t)
 *                      e[j] = sum_a vt[a] * tanh(qp[a] + kpt[a*ldk + j]), j < nk <=
 *                      ATTN_ADD_TILE; t (A x nk, row a at t + a*nk) receives the tanh
 *                      values when not NULL. Reads kpt columns < nk only.
 *   grad(nk, A, t, de, vt, dqp, dkpt, lddk, dvt)
 *                      with u[a][j] = de[j] * vt[a] * (1 - t[a][j]^2):
 *                      dqp[a] += sum_j u[a][j]           (dqp may be NULL)
 *                      dkpt[a*lddk + j] += u[a][j]        (dkpt may be NULL)
 *                      dvt[a] += sum_j de[j] * t[a][j]    (dvt may be NULL)
 *                      (the sums over j in a fixed lane order, see kernels/additive_body.h)
 *   dot(n, x, y)       sum_d x[d] y[d] of unit-stride vectors, in the same lane order
 *   axpy(n, a, x, y)   y[d] += a * x[d] for d < n, unit stride, each d on its own (a
 *                      fused multiply-add where the ISA has one): P V and dV's rows     */
typedef struct attn_additive_kernels {
    const char *name;
    void (*tanh)(int64_t n, const float *x, float *y);
    void (*score)(int64_t nk, int64_t A, const float *qp, const float *kpt, int64_t ldk,
                  const float *vt, float *e, float *t);
    void (*grad)(int64_t nk, int64_t A, const float *t, const float *de, const float *vt,
                 float *dqp, float *dkpt, int64_t lddk, float *dvt);
    float (*dot)(int64_t n, const float *x, const float *y);
    void (*axpy)(int64_t n, float a, const float *x, float *y);
} attn_additive_kernels;

ATTN_PRIVATE extern const attn_additive_kernels attn_additive_kernels_generic;
ATTN_PRIVATE extern const attn_additive_kernels attn_additive_kernels_avx2;
ATTN_PRIVATE extern const attn_additive_kernels attn_additive_kernels_avx512;

#endif
