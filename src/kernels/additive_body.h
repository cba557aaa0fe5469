/*
 * additive_body.h — the body of the additive-attention micro-kernels (contracts in
 *                   additive_kernels.h), written once in portable C and compiled per
 *                   ISA by src/kernels/{generic,avx2,avx512}/additive.c, each with its
 *                   own flags, so that the compiler vectorizes the loops over keys for
 *                   that ISA. No intrinsics, no fast-math.
 *
 * The including file defines ADD_SUFFIX (the ISA's name) and ADD_FMA(a, b, c), a*b + c
 * (fmaf where the ISA has the instruction, a plain expression otherwise).
 *
 * The tanh. For |x| < 0.625: x + x³ P(x²), P of degree 4 fitted (weighted least squares,
 * then Lawson iterations, float64) to the relative error of tanh on [0, 0.625]; for
 * |x| >= 0.625: (1 - t) / (1 + t) with t = exp(-2|x|), the exp by Cody–Waite reduction
 * n = rint(-2|x| / ln 2), r = -2|x| - n ln2_hi - n ln2_lo, a degree-7 Taylor polynomial
 * on |r| <= ln2 / 2 (truncation 6e-9) and 2ⁿ built in the exponent bits. |x| is clamped
 * at 9 for this branch (tanh(9) rounds to 1 in float32), so n >= -26 and 2ⁿ is never
 * subnormal. Both branches are computed and one is selected by a bit blend, so the loop
 * has no branch. The sign is copied from x at the end: tanh(-0) = -0, ±inf gives ±1,
 * NaN gives NaN.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define ADD_CAT2(a, b) a##_##b
#define ADD_CAT(a, b) ADD_CAT2(a, b)
#define ADD_NAME(f) ADD_CAT(f, ADD_SUFFIX)
#define ADD_STR2(x) #x
#define ADD_STR(x) ADD_STR2(x)

/* bits of x where m is all ones, of y where it is 0 */
static inline float ADD_NAME(add_blend)(uint32_t m, float x, float y) {
    uint32_t xb, yb, rb;
    memcpy(&xb, &x, sizeof xb);
    memcpy(&yb, &y, sizeof yb);
    rb = (xb & m) | (yb & ~m);
    float r;
    memcpy(&r, &rb, sizeof r);
    return r;
}

static inline float ADD_NAME(add_tanh1)(float x) {
    const float a = fabsf(x);
    /* small branch: a + a³ P(a²) */
    const float y = a * a;
    float p = -5.765362177e-03f;
    p = ADD_FMA(p, y, 2.069285512e-02f);
    p = ADD_FMA(p, y, -5.375606194e-02f);
    p = ADD_FMA(p, y, 1.333163530e-01f);
    p = ADD_FMA(p, y, -3.333328962e-01f);
    const float small = ADD_FMA(a * y, p, a);
    /* large branch: t = exp(-2 min(a, 9)); n = rint(z / ln 2) by the 1.5·2²³ shifter,
     * whose low mantissa bits then hold n */
    const float z = -2.0f * ADD_NAME(add_blend)(-(uint32_t)(a > 9.0f), 9.0f, a);
    const float sh = ADD_FMA(z, 1.442695041f, 12582912.0f);
    uint32_t sh_bits;
    memcpy(&sh_bits, &sh, sizeof sh_bits);
    const float n = sh - 12582912.0f;
    float r = ADD_FMA(n, -6.931471825e-01f, z);
    r = ADD_FMA(n, 1.904654323e-09f, r);
    float e = 1.0f / 5040.0f;
    e = ADD_FMA(e, r, 1.0f / 720.0f);
    e = ADD_FMA(e, r, 1.0f / 120.0f);
    e = ADD_FMA(e, r, 1.0f / 24.0f);
    e = ADD_FMA(e, r, 1.0f / 6.0f);
    e = ADD_FMA(e, r, 0.5f);
    e = ADD_FMA(e, r, 1.0f);
    e = ADD_FMA(e, r, 1.0f);
    const uint32_t two_n_bits = (sh_bits - 0x4B400000u + 127u) << 23;  /* n in [-26, 0] */
    float two_n;
    memcpy(&two_n, &two_n_bits, sizeof two_n);
    const float t = e * two_n;
    const float large = (1.0f - t) / (1.0f + t);
    /* the selects are bit blends: conditional expressions here would not be if-converted
     * (trapping math), and the loop would stay scalar. NaN: a >= 0.625 is false, so the
     * polynomial, which keeps the NaN, is taken. */
    return copysignf(ADD_NAME(add_blend)(-(uint32_t)(a >= 0.625f), large, small), x);
}

static void ADD_NAME(add_tanh)(int64_t n, const float *x, float *y) {
    for (int64_t c = 0; c < n; c++) y[c] = ADD_NAME(add_tanh1)(x[c]);
}

/* e[j] = Σ_a vt[a] tanh(qp[a] + kpt[a, j]): rank-1 sweeps over a, the loop over j
 * vectorized, each e[j] summed in a order. */
static void ADD_NAME(add_score)(int64_t nk, int64_t A, const float *qp, const float *kpt,
                                int64_t ldk, const float *vt, float *e, float *t) {
    float acc[ATTN_ADD_TILE];
    for (int64_t j = 0; j < nk; j++) acc[j] = 0.0f;
    for (int64_t a = 0; a < A; a++) {
        const float q_a = qp[a], v_a = vt[a];
        const float *k_a = kpt + a * ldk;
        if (t) {
            float *t_a = t + a * nk;
            for (int64_t j = 0; j < nk; j++) {
                const float th = ADD_NAME(add_tanh1)(q_a + k_a[j]);
                t_a[j] = th;
                acc[j] = ADD_FMA(v_a, th, acc[j]);
            }
        } else {
            for (int64_t j = 0; j < nk; j++)
                acc[j] = ADD_FMA(v_a, ADD_NAME(add_tanh1)(q_a + k_a[j]), acc[j]);
        }
    }
    for (int64_t j = 0; j < nk; j++) e[j] = acc[j];
}

/* Σ_j x[j] in a fixed order that vectorizes without reassociation: ADD_LANES partial
 * sums, lane l taking j ≡ l (mod ADD_LANES), added up in lane order at the end. */
#define ADD_LANES 16
static inline float ADD_NAME(add_sum)(int64_t n, const float *x) {
    float lane[ADD_LANES] = {0};
    int64_t j = 0;
    for (; j + ADD_LANES <= n; j += ADD_LANES)
        for (int l = 0; l < ADD_LANES; l++) lane[l] += x[j + l];
    for (int l = 0; j < n; j++, l++) lane[l] += x[j];
    float s = 0.0f;
    for (int l = 0; l < ADD_LANES; l++) s += lane[l];
    return s;
}

/* Through e_ij = Σ_a ṽ_a tanh(x_ija):  ∂e/∂x_ija = ṽ_a (1 - t²),  ∂e/∂ṽ_a = t. */
static void ADD_NAME(add_grad)(int64_t nk, int64_t A, const float *t, const float *de,
                               const float *vt, float *dqp, float *dkpt, int64_t lddk,
                               float *dvt) {
    float u[ATTN_ADD_TILE];
    for (int64_t a = 0; a < A; a++) {
        const float *t_a = t + a * nk;
        const float v_a = vt[a];
        if (dkpt || dqp) {
            for (int64_t j = 0; j < nk; j++) u[j] = de[j] * v_a * (1.0f - t_a[j] * t_a[j]);
            if (dkpt) {
                float *dk_a = dkpt + a * lddk;
                for (int64_t j = 0; j < nk; j++) dk_a[j] += u[j];
            }
            if (dqp) dqp[a] += ADD_NAME(add_sum)(nk, u);
        }
        if (dvt) {
            for (int64_t j = 0; j < nk; j++) u[j] = de[j] * t_a[j];
            dvt[a] += ADD_NAME(add_sum)(nk, u);
        }
    }
}

/* Σ_d x[d] y[d] over unit-stride vectors, in the lane order of add_sum */
static float ADD_NAME(add_dot)(int64_t n, const float *x, const float *y) {
    float lane[ADD_LANES] = {0};
    int64_t d = 0;
    for (; d + ADD_LANES <= n; d += ADD_LANES)
        for (int l = 0; l < ADD_LANES; l++) lane[l] = ADD_FMA(x[d + l], y[d + l], lane[l]);
    for (int l = 0; d < n; d++, l++) lane[l] = ADD_FMA(x[d], y[d], lane[l]);
    float s = 0.0f;
    for (int l = 0; l < ADD_LANES; l++) s += lane[l];
    return s;
}

/* y[d] += a x[d]: the rows of P V (forward) and of dV (backward), vectorized over d (the
 * restrict lets the compiler do it without an overlap test) */
static void ADD_NAME(add_axpy)(int64_t n, float a, const float *x, float *restrict y) {
    for (int64_t d = 0; d < n; d++) y[d] = ADD_FMA(a, x[d], y[d]);
}

const attn_additive_kernels ADD_NAME(attn_additive_kernels) = {
    .name = ADD_STR(ADD_SUFFIX),
    .tanh = ADD_NAME(add_tanh),
    .score = ADD_NAME(add_score),
    .grad = ADD_NAME(add_grad),
    .dot = ADD_NAME(add_dot),
    .axpy = ADD_NAME(add_axpy),
};
