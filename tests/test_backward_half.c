/*
 * test_backward_half.c — the backward pass on float16 and bfloat16 tensors.
 *
 * The rule of the half-precision issue, applied to gradients: over a few shapes and
 * masks, each gradient's max error against the float64 reference gradient (of the same
 * 16-bit inputs) is at most twice that of a naive implementation computing in the same
 * 16-bit type — every materialized step (scores, P, O, dV, dP, the softmax backward's row
 * sums, dS, dQ, dK) rounded to the type, as PyTorch's math path does in half precision.
 * Both the all-16-bit call (gradients in the inputs' dtype) and float32 queries over a
 * 16-bit K/V are checked, on both paths; a planted error must fail the check.
 * Not here: float32 gradients (test_backward), the forward (test_half).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "backward/backward.h"
#include "check.h"
#include "core/half.h"
#include "naive.h"
#include "rng.h"

static rng_t g_rng = {4242};
static float sym(void) { return (float)rng_sym(&g_rng); }

typedef struct bcase {
    int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
    bool causal, bool_mask;
} bcase;

#define R(t, x) naive_round(t, x)

/* The naive 16-bit backward of one (b, h) row block; dense [L, D] slices. keep [Lq, Lk]. */
static void naive_backward_head(attn_dtype t, const bcase *c, const float *q, const float *k,
                                const float *v, const float *d_o, const uint8_t *keep,
                                float scale, float *dq, float *dk_acc, float *dv_acc) {
    const int64_t Lq = c->Lq, Lk = c->Lk, Dk = c->Dk, Dv = c->Dv;
    float *P = malloc((size_t)(Lq * Lk) * sizeof(float)), *dS = malloc((size_t)(Lq * Lk) * sizeof(float));
    for (int64_t i = 0; i < Lq; i++) {  // P = softmax(S), S and P rounded
        float m = -INFINITY, l = 0;
        for (int64_t j = 0; j < Lk; j++) {
            float dot = 0;
            for (int64_t d = 0; d < Dk; d++) dot += q[i * Dk + d] * k[j * Dk + d];
            P[i * Lk + j] = keep[i * Lk + j] ? R(t, R(t, dot) * R(t, scale)) : -INFINITY;
            m = fmaxf(m, P[i * Lk + j]);
        }
        for (int64_t j = 0; j < Lk; j++) l += P[i * Lk + j] = m == -INFINITY ? 0 : expf(P[i * Lk + j] - m);
        for (int64_t j = 0; j < Lk; j++) P[i * Lk + j] = l > 0 ? R(t, P[i * Lk + j] / l) : 0;
    }
    for (int64_t j = 0; j < Lk; j++)  // dV += P^T dO
        for (int64_t d = 0; d < Dv; d++) {
            float a = 0;
            for (int64_t i = 0; i < Lq; i++) a += P[i * Lk + j] * d_o[i * Dv + d];
            dv_acc[j * Dv + d] += R(t, a);
        }
    for (int64_t i = 0; i < Lq; i++) {  // dP = dO V^T; dS = P (dP - sum(P dP))
        float sum = 0;
        for (int64_t j = 0; j < Lk; j++) {
            float a = 0;
            for (int64_t d = 0; d < Dv; d++) a += d_o[i * Dv + d] * v[j * Dv + d];
            dS[i * Lk + j] = R(t, a);
            sum += P[i * Lk + j] * dS[i * Lk + j];
        }
        sum = R(t, sum);
        for (int64_t j = 0; j < Lk; j++) dS[i * Lk + j] = R(t, P[i * Lk + j] * (dS[i * Lk + j] - sum));
    }
    for (int64_t i = 0; i < Lq; i++)  // dQ = scale dS K
        for (int64_t d = 0; d < Dk; d++) {
            float a = 0;
            for (int64_t j = 0; j < Lk; j++) a += dS[i * Lk + j] * k[j * Dk + d];
            dq[i * Dk + d] = R(t, R(t, a) * R(t, scale));
        }
    for (int64_t j = 0; j < Lk; j++)  // dK += scale dS^T Q
        for (int64_t d = 0; d < Dk; d++) {
            float a = 0;
            for (int64_t i = 0; i < Lq; i++) a += dS[i * Lk + j] * q[i * Dk + d];
            dk_acc[j * Dk + d] += R(t, R(t, a) * R(t, scale));
        }
    free(P);
    free(dS);
}

static double max_err(const double *ref, attn_dtype dt, const void *got, int64_t n) {
    double e = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs(attn_load(dt, got, i) - ref[i]);
        if (!(d <= e)) e = d;  // NaN counts as infinite
    }
    return e;
}

static double max_err_f(const double *ref, const float *got, int64_t n) {
    double e = 0;
    for (int64_t i = 0; i < n; i++) e = fmax(e, fabs(got[i] - ref[i]));
    return e;
}

static double max_abs(const double *x, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}

static double g_worst_ratio;  // the largest error / naive error seen, for the summary

static void run_case(const bcase *c, attn_dtype t) {
    const int64_t nq = c->B * c->Hq * c->Lq * c->Dk, nk = c->B * c->Hkv * c->Lk * c->Dk;
    const int64_t nv = c->B * c->Hkv * c->Lk * c->Dv, no = c->B * c->Hq * c->Lq * c->Dv;
    const int64_t g = c->Hq / c->Hkv;
    const float scale = 1.0f / sqrtf((float)c->Dk);
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nv * 4), *d_o = malloc(no * 4);
    float *ndq = calloc(nq, 4), *ndk = calloc(nk, 4), *ndv = calloc(nv, 4);
    double *xq = malloc(nq * 8), *xk = malloc(nk * 8), *xv = malloc(nv * 8), *xdo = malloc(no * 8);
    double *rdq = malloc(nq * 8), *rdk = malloc(nk * 8), *rdv = malloc(nv * 8);
    uint8_t *keep = malloc((size_t)(c->Lq * c->Lk)), *mask = malloc((size_t)(c->Lq * c->Lk));
    for (int64_t i = 0; i < nq; i++) xq[i] = q[i] = R(t, sym());
    for (int64_t i = 0; i < nk; i++) xk[i] = k[i] = R(t, sym());
    for (int64_t i = 0; i < nv; i++) xv[i] = v[i] = R(t, sym());
    for (int64_t i = 0; i < no; i++) xdo[i] = d_o[i] = R(t, sym());
    for (int64_t i = 0; i < c->Lq; i++)
        for (int64_t j = 0; j < c->Lk; j++) {
            mask[i * c->Lk + j] = !c->bool_mask || (i + 3 * j) % 7 != 2;
            keep[i * c->Lk + j] = mask[i * c->Lk + j] && !(c->causal && j > i);
        }

    /* the oracle: float64 gradients of these (16-bit) inputs */
    attn_tensor tq = attn_tensor_4d(q, ATTN_F32, c->B, c->Hq, c->Lq, c->Dk);
    attn_tensor tk = attn_tensor_4d(k, ATTN_F32, c->B, c->Hkv, c->Lk, c->Dk);
    attn_tensor tv = attn_tensor_4d(v, ATTN_F32, c->B, c->Hkv, c->Lk, c->Dv);
    attn_tensor tdo = attn_tensor_4d(d_o, ATTN_F32, c->B, c->Hq, c->Lq, c->Dv);
    attn_tensor tm = attn_tensor_4d(mask, ATTN_BOOL, 1, 1, c->Lq, c->Lk);
    attn_options opt = {.causal = c->causal, .mask = c->bool_mask ? &tm : NULL};
    attn_params p;
    CHECK(ai_params_init(&p, &tq, &tk, &tv, &tdo, &opt, false) == ATTN_OK &&
              ai_ref64_backward(&p, xq, xk, xv, xdo, rdq, rdk, rdv, false) == ATTN_OK,
          "oracle failed: %s", attn_last_error());

    /* the naive 16-bit backward, head by head */
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->Hq; h++) {
            const int64_t qo = (b * c->Hq + h) * c->Lq, ko = (b * c->Hkv + h / g) * c->Lk;
            naive_backward_head(t, c, q + qo * c->Dk, k + ko * c->Dk, v + ko * c->Dv,
                                d_o + qo * c->Dv, keep, scale, ndq + qo * c->Dk, ndk + ko * c->Dk,
                                ndv + ko * c->Dv);
        }
    for (int64_t i = 0; i < nk; i++) ndk[i] = R(t, ndk[i]);  // the group sums, rounded
    for (int64_t i = 0; i < nv; i++) ndv[i] = R(t, ndv[i]);
    const double naive[3] = {max_err_f(rdq, ndq, nq), max_err_f(rdk, ndk, nk), max_err_f(rdv, ndv, nv)};
    const double scale_of[3] = {max_abs(rdq, nq), max_abs(rdk, nk), max_abs(rdv, nv)};

    /* the library: all 16-bit (gradients in t), and float32 q/o/dO over a 16-bit K/V */
    for (int mixed = 0; mixed < 2; mixed++)
        for (int path = 0; path < 2; path++) {
            const attn_dtype qt = mixed ? ATTN_F32 : t;
            void *bq = malloc(nq * 4), *bk = malloc(nk * 4), *bv = malloc(nv * 4), *bo = malloc(no * 4);
            void *bdo = malloc(no * 4), *gq = malloc(nq * 4), *gk = malloc(nk * 4), *gv = malloc(nv * 4);
            float *lse = malloc((size_t)(c->B * c->Hq * c->Lq) * 4);
            for (int64_t i = 0; i < nq; i++) attn_store(qt, bq, i, q[i]);
            for (int64_t i = 0; i < nk; i++) attn_store(t, bk, i, k[i]);
            for (int64_t i = 0; i < nv; i++) attn_store(t, bv, i, v[i]);
            for (int64_t i = 0; i < no; i++) attn_store(qt, bdo, i, d_o[i]);
            attn_tensor hq = attn_tensor_4d(bq, qt, c->B, c->Hq, c->Lq, c->Dk);
            attn_tensor hk = attn_tensor_4d(bk, t, c->B, c->Hkv, c->Lk, c->Dk);
            attn_tensor hv = attn_tensor_4d(bv, t, c->B, c->Hkv, c->Lk, c->Dv);
            attn_tensor ho = attn_tensor_4d(bo, qt, c->B, c->Hq, c->Lq, c->Dv);
            attn_tensor hdo = attn_tensor_4d(bdo, qt, c->B, c->Hq, c->Lq, c->Dv);
            attn_tensor hgq = attn_tensor_4d(gq, qt, c->B, c->Hq, c->Lq, c->Dk);
            attn_tensor hgk = attn_tensor_4d(gk, t, c->B, c->Hkv, c->Lk, c->Dk);
            attn_tensor hgv = attn_tensor_4d(gv, t, c->B, c->Hkv, c->Lk, c->Dv);
            attn_tensor hl = attn_tensor_4d(lse, ATTN_F32, c->B, c->Hq, c->Lq, 1);
            attn_options fo = opt;
            fo.lse = &hl;
            fo.path = path ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED;
            attn_status st = attn_forward(&hq, &hk, &hv, &ho, &fo);
            fo.lse = NULL;
            if (st == ATTN_OK) st = attn_backward(&hq, &hk, &hv, &ho, &hdo, &hl, &hgq, &hgk, &hgv, &fo);
            const double got[3] = {max_err(rdq, qt, gq, nq), max_err(rdk, t, gk, nk), max_err(rdv, t, gv, nv)};
            static const char *const gname[3] = {"dq", "dk", "dv"};
            for (int a = 0; a < 3; a++) {
                if (naive[a] > 0 && got[a] / naive[a] > g_worst_ratio) g_worst_ratio = got[a] / naive[a];
                const double bound = 2 * naive[a] + 0x1p-22 * (1 + scale_of[a]);
                CHECK(st == ATTN_OK && got[a] <= bound,
                      "%s %s%s %s: B%lld H%lld/%lld L%lld/%lld D%lld/%lld causal %d mask %d: "
                      "error %.3g, naive %.3g (status %d: %s)", gname[a],
                      attn_dtype_name(t), mixed ? " K/V under float32 q" : "",
                      path ? "reference" : "fused", (long long)c->B, (long long)c->Hq,
                      (long long)c->Hkv, (long long)c->Lq, (long long)c->Lk, (long long)c->Dk,
                      (long long)c->Dv, c->causal, c->bool_mask, got[a], naive[a], (int)st,
                      attn_last_error());
            }
            /* a planted error (3 bounds, plus 2% so that rounding to the type cannot
             * undo it) at one element must fail the check */
            if (!mixed && !path && st == ATTN_OK) {
                const double bound = 2 * naive[2] + 0x1p-22 * (1 + scale_of[2]);
                attn_store(t, gv, 0, (float)(rdv[0] + 3 * bound + 0.02 * fabs(rdv[0]) + 1e-3));
                CHECK(max_err(rdv, t, gv, nv) > bound, "a planted dV error was not caught");
            }
            free(bq), free(bk), free(bv), free(bo), free(bdo), free(gq), free(gk), free(gv), free(lse);
        }
    free(q), free(k), free(v), free(d_o), free(ndq), free(ndk), free(ndv);
    free(xq), free(xk), free(xv), free(xdo), free(rdq), free(rdk), free(rdv), free(keep), free(mask);
}

/* The backward given the 16-bit O (which it recomputes in float32) against the backward
 * given the forward's own float32 O (what attn's Python autograd keeps): the same dQ, dK,
 * dV and d_sinks bit for bit, on every kernel (a recomputation on float32 copies of Q, K,
 * V ran float32 tiles where the 16-bit forward ran bf16 dot products: another last bit of
 * d_sinks on avx512bf16). With a bias and sinks, as test_compile.py's bf16 case. */
static uint16_t to16(attn_dtype t, float x) {
    return t == ATTN_BF16 ? attn_f32_to_bf16(x) : attn_f32_to_f16(x);
}

static void same_o_either_way(attn_dtype t) {
    enum { B = 2, H = 4, L = 9, D = 16, N = B * H * L * D };
    uint16_t q[N], k[N], v[N], o16[N], d_o[N], g[2][3][N];
    float o32[N], lse[B * H * L], bias[H * L * L], sinks[H] = {0.4f, -0.7f, 1.1f, 0.05f}, ds[2][H];
    for (int i = 0; i < N; i++) {
        q[i] = to16(t, 2 * sym()), k[i] = to16(t, 2 * sym());
        v[i] = to16(t, 2 * sym()), d_o[i] = to16(t, sym());
    }
    for (int i = 0; i < H * L * L; i++) bias[i] = sym();
    const attn_tensor tq = attn_tensor_4d(q, t, B, H, L, D), tk = attn_tensor_4d(k, t, B, H, L, D),
                      tv = attn_tensor_4d(v, t, B, H, L, D), tdo = attn_tensor_4d(d_o, t, B, H, L, D),
                      to16 = attn_tensor_4d(o16, t, B, H, L, D), to32 = attn_tensor_4d(o32, ATTN_F32, B, H, L, D),
                      tl = attn_tensor_4d(lse, ATTN_F32, B, H, L, 1), tb = attn_tensor_4d(bias, ATTN_F32, 1, H, L, L),
                      ts = attn_tensor_4d(sinks, ATTN_F32, H, 1, 1, 1);
    attn_options fo = {.scale = 0.3f, .bias = &tb, .sinks = &ts, .lse = &tl};
    CHECK(attn_forward(&tq, &tk, &tv, &to32, &fo) == ATTN_OK && attn_forward(&tq, &tk, &tv, &to16, &fo) == ATTN_OK,
          "%s: forward: %s", attn_dtype_name(t), attn_last_error());
    for (int w = 0; w < 2; w++) {
        const attn_tensor tds = attn_tensor_4d(ds[w], ATTN_F32, H, 1, 1, 1);
        const attn_tensor tg[3] = {attn_tensor_4d(g[w][0], t, B, H, L, D), attn_tensor_4d(g[w][1], t, B, H, L, D),
                                   attn_tensor_4d(g[w][2], t, B, H, L, D)};
        attn_options bo = {.scale = 0.3f, .bias = &tb, .sinks = &ts, .d_sinks = &tds};
        CHECK(attn_backward(&tq, &tk, &tv, w ? &to16 : &to32, &tdo, &tl, &tg[0], &tg[1], &tg[2], &bo) == ATTN_OK,
              "%s: backward: %s", attn_dtype_name(t), attn_last_error());
    }
    CHECK(memcmp(g[0], g[1], sizeof g[0]) == 0 && memcmp(ds[0], ds[1], sizeof ds[0]) == 0,
          "%s: the backward given the 16-bit O differs from the one given the float32 O (d_sinks %.9g vs %.9g)",
          attn_dtype_name(t), (double)ds[1][0], (double)ds[0][0]);
}

int main(void) {
    same_o_either_way(ATTN_F16);
    same_o_either_way(ATTN_BF16);
    static const bcase cases[] = {
        {1, 1, 1, 1, 1, 8, 8, false, false},
        {1, 2, 2, 17, 17, 16, 16, true, false},
        {2, 4, 2, 33, 40, 32, 24, false, true},
        {1, 2, 1, 64, 64, 64, 64, true, true},
        {1, 1, 1, 130, 129, 80, 64, true, false},
        /* few causal rows: dQ, dK small next to |dO| |O| (a 16-bit O would show here) */
        {1, 2, 2, 3, 40, 16, 16, true, false},
        {2, 2, 1, 5, 5, 8, 8, true, false},
        {1, 1, 1, 2, 2, 32, 32, true, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_case(&cases[i], ATTN_F16);
        run_case(&cases[i], ATTN_BF16);
    }
    /* many small causal cases at random: where a 16-bit O's rounding showed (about 1 in
     * 100 gradients over 2x the naive error, before O was recomputed in float32) */
    for (int r = 0; r < 150; r++) {
        const int64_t lq = 1 + (int64_t)((sym() + 1) * 3), dk = 4 + 4 * (int64_t)((sym() + 1) * 2);
        const bcase c = {1, 1, 1, lq, lq + (int64_t)((sym() + 1) * 2), dk, dk, true, false};
        run_case(&c, r % 2 ? ATTN_BF16 : ATTN_F16);
    }
    printf("backward_half: kernel %s, worst gradient error / naive error = %.2f (bound 2)\n",
           attn_kernel_name(), g_worst_ratio);
    return check_summary("backward_half");
}
