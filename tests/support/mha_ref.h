/*
 * mha_ref.h — the multi-head suites' float64 composition of the layer and the case
 *             builder around it (test_mha.c, test_mha_backward.c).
 *
 * What it is: the layer written out in double, independent of src/mha/mha.c — projections
 * as triple loops, RoPE by its formula, the attention by the library's float64
 * reference arithmetic (ai_ref64_forward, itself checked by test_backward.c), W_O —
 * and `mcase`, which draws one layer's inputs and weights (float32 or bfloat16, dense,
 * padded or PyTorch-packed) and describes them to attn_mha_forward.
 * What it is not: a validator (it assumes arguments the module accepts).
 *
 * Header-only; include it once per test program (it includes oracle.h).
 */
#ifndef ATTN_TEST_MHA_REF_H
#define ATTN_TEST_MHA_REF_H

#include "attn.h"
#include "backward/backward.h"
#include "core/half.h"
#include "oracle.h"

enum { W_Q = 0, W_K, W_V, W_O };

/* The layer's sizes and how its tensors are stored. */
typedef struct mcase {
    int64_t B, Lq, Lk, E, Ekv, Hq, Hkv, Dk, Dv;
    bool self;     /* x_kv = x_q (Lk = Lq, Ekv = E)                                    */
    bool bias;     /* all four biases                                                   */
    bool torch;    /* weights as [out, in] rows (stride {1, in}); q, k, v packed in one
                      [(Hq + 2 Hkv)·D, E] buffer when self-attention with Dk = Dv      */
    bool bf16;     /* x, weights and biases bfloat16                                   */
    int layout;    /* x and y: 0 dense, 1 rows padded (evenly), 2 batches padded too    */
    attn_rope rope;
    uint64_t seed;
} mcase;

/* The attention's K and V read from a decoding cache instead of the float64 projections
 * (test_mha_decode.c's 16-bit caches): rows [0, Lk) of k [B, Hkv, lmax, Dk] and
 * v [B, Hkv, lmax, Dv], of dtype dt. mref_forward then also checks each stored value
 * against its float64 projection, within the bound of a float32 projection (and RoPE)
 * rounded once to dt (mref_cache_bound): ratio is the largest |stored - ref| / bound. */
typedef struct mref_cache {
    const void *k, *v;
    attn_dtype dt;
    int64_t lmax;
    double ratio;
} mref_cache;

/* One drawn layer: the float64 values (exact: bfloat16 draws are rounded first) and the
 * stored tensors the module reads. */
typedef struct mlayer {
    mcase c;
    int64_t in[4], out[4];
    double *xq, *xkv, *w[4], *b[4];  /* [B, Lq, E] [B, Lk, Ekv] [in, out] [out]           */
    void *sxq, *sxkv, *sw[4], *sb[4], *sy;  /* storage                                   */
    attn_tensor txq, txkv, tw[4], tb[4], ty;
    attn_mha m;
    mref_cache *cache;  /* NULL: the reference projects K and V itself */
} mlayer;

/* A [B, L, C] tensor of the layout: row ld and batch stride. */
static inline attn_tensor mrows_tensor(void *data, attn_dtype dt, int64_t B, int64_t L,
                                       int64_t C, int layout, int64_t *elems) {
    const int64_t ld = C + (layout ? 3 : 0), bs = L * ld + (layout == 2 ? 5 : 0);
    attn_tensor t = {data, dt, {B, L, C, 1}, {bs, ld, 1, 1}};
    *elems = B * bs + 8;
    return t;
}

static inline double mdraw(rng_t *r, bool bf16, double scale) {
    double x = rng_range(r, -1, 1) * scale;
    return bf16 ? (double)attn_bf16_to_f32(attn_f32_to_bf16((float)x)) : (double)(float)x;
}

static inline void mstore(void *base, bool bf16, int64_t idx, double x) {
    attn_store(bf16 ? ATTN_BF16 : ATTN_F32, base, idx, (float)x);
}

/* Draws x [B, L, C] into a double copy and a stored tensor. */
static inline void mdraw_rows(rng_t *r, const mcase *c, int64_t L, int64_t C, double **d,
                              void **s, attn_tensor *t) {
    int64_t n;
    const attn_dtype dt = c->bf16 ? ATTN_BF16 : ATTN_F32;
    *t = mrows_tensor(NULL, dt, c->B, L, C, c->layout, &n);
    *s = xcalloc(n, 4);
    t->data = *s;
    *d = (double *)xcalloc(c->B * L * C, sizeof(double));
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t i = 0; i < L; i++)
            for (int64_t e = 0; e < C; e++) {
                double x = mdraw(r, c->bf16, 1.0);
                (*d)[(b * L + i) * C + e] = x;
                mstore(*s, c->bf16, b * t->stride[0] + i * t->stride[1] + e, x);
            }
}

static inline void mlayer_build(mlayer *l, const mcase *c) {
    memset(l, 0, sizeof *l);
    l->c = *c;
    rng_t r = {c->seed};
    mdraw_rows(&r, c, c->Lq, c->E, &l->xq, &l->sxq, &l->txq);
    if (c->self) {
        l->xkv = l->xq;
    } else {
        mdraw_rows(&r, c, c->Lk, c->Ekv, &l->xkv, &l->sxkv, &l->txkv);
    }
    const int64_t in[4] = {c->E, c->Ekv, c->Ekv, c->Hq * c->Dv};
    const int64_t out[4] = {c->Hq * c->Dk, c->Hkv * c->Dk, c->Hkv * c->Dv, c->E};
    const attn_dtype dt = c->bf16 ? ATTN_BF16 : ATTN_F32;
    const bool packed = c->torch && c->self;
    void *pack = packed ? xcalloc((out[0] + out[1] + out[2]) * in[0], 4) : NULL;
    int64_t pack_at = 0;
    for (int n = 0; n < 4; n++) {
        l->in[n] = in[n];
        l->out[n] = out[n];
        const double ws = 1.0 / sqrt((double)(in[n] > 0 ? in[n] : 1));
        l->w[n] = (double *)xcalloc(in[n] * out[n], sizeof(double));
        if (packed && n < W_O) {
            l->sw[n] = (char *)pack + pack_at * (c->bf16 ? 2 : 4);
            pack_at += in[n] * out[n];
        } else {
            l->sw[n] = xcalloc(in[n] * out[n] + 1, 4);
        }
        attn_tensor t = {l->sw[n], dt, {in[n], out[n], 1, 1},
                         {c->torch ? 1 : out[n], c->torch ? in[n] : 1, 1, 1}};
        l->tw[n] = t;
        for (int64_t a = 0; a < in[n]; a++)
            for (int64_t e = 0; e < out[n]; e++) {
                double x = mdraw(&r, c->bf16, ws);
                l->w[n][a * out[n] + e] = x;
                mstore(l->sw[n], c->bf16, a * t.stride[0] + e * t.stride[1], x);
            }
        if (c->bias) {
            l->b[n] = (double *)xcalloc(out[n], sizeof(double));
            l->sb[n] = xcalloc(out[n] + 1, 4);
            attn_tensor tb = {l->sb[n], dt, {out[n], 1, 1, 1}, {1, 1, 1, 1}};
            l->tb[n] = tb;
            for (int64_t e = 0; e < out[n]; e++) {
                l->b[n][e] = mdraw(&r, c->bf16, 0.5);
                mstore(l->sb[n], c->bf16, e, l->b[n][e]);
            }
        }
    }
    l->sw[W_K] = packed ? NULL : l->sw[W_K];  /* freed through sw[W_Q] when packed */
    l->sw[W_V] = packed ? NULL : l->sw[W_V];
    int64_t ny;
    l->ty = mrows_tensor(NULL, dt, c->B, c->Lq, c->E, c->layout, &ny);
    l->sy = xcalloc(ny, 4);
    l->ty.data = l->sy;
    fill_sentinel(l->sy, ny);
    l->m = (attn_mha){.Hq = c->Hq, .Hkv = c->Hkv,
                      .w_q = &l->tw[0], .w_k = &l->tw[1], .w_v = &l->tw[2], .w_o = &l->tw[3],
                      .rope = c->rope};
    if (c->bias) {
        l->m.b_q = &l->tb[0]; l->m.b_k = &l->tb[1]; l->m.b_v = &l->tb[2]; l->m.b_o = &l->tb[3];
    }
}

static inline void mlayer_free(mlayer *l) {
    free(l->xq); free(l->sxq);
    if (!l->c.self) { free(l->xkv); free(l->sxkv); }
    for (int n = 0; n < 4; n++) { free(l->w[n]); free(l->sw[n]); free(l->b[n]); free(l->sb[n]); }
    free(l->sy);
}

/* y element (b, i, e) of the stored output, as double */
static inline double mlayer_y(const mlayer *l, int64_t b, int64_t i, int64_t e) {
    return attn_load(l->ty.dtype, l->ty.data, b * l->ty.stride[0] + i * l->ty.stride[1] + e);
}

/* ---- the float64 composition -------------------------------------------------------- */

/* out[M, N] = a[M, K] w[K, N] (+ bias) */
static inline void mref_project(double *out, const double *a, const double *w,
                                const double *bias, int64_t M, int64_t N, int64_t K) {
    for (int64_t r = 0; r < M; r++)
        for (int64_t c = 0; c < N; c++) {
            double s = bias ? bias[c] : 0;
            for (int64_t k = 0; k < K; k++) s += a[r * K + k] * w[k * N + c];
            out[r * N + c] = s;
        }
}

/* RoPE by its formula on x [B, L, H, D] */
static inline void mref_rope(const attn_rope *rp, double *x, int64_t B, int64_t L, int64_t H,
                             int64_t D, const int64_t *pos0) {
    if (rp->kind == ATTN_ROPE_NONE) return;
    const int64_t r = rp->rotary_dim ? rp->rotary_dim : D;
    const double base = rp->base ? rp->base : 10000.0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < L; i++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t c = 0; c < r / 2; c++) {
                    double pos = (double)(rp->offset + (pos0 ? pos0[b] : 0) + i);
                    double th = pos / pow(base, 2.0 * (double)c / (double)r);
                    double *row = x + ((b * L + i) * H + h) * D;
                    int64_t lo = rp->kind == ATTN_ROPE_HALF ? c : 2 * c;
                    int64_t hi = rp->kind == ATTN_ROPE_HALF ? c + r / 2 : 2 * c + 1;
                    double x1 = row[lo], x2 = row[hi];
                    row[lo] = x1 * cos(th) - x2 * sin(th);
                    row[hi] = x2 * cos(th) + x1 * sin(th);
                }
}

/* The magnitude of RoPE's output on magnitudes m [B, L, H, D]: each rotated element
 * |x1 cos - x2 sin| <= m1 + m2 (and its rounding is relative to that) */
static inline void mref_rope_mag(const attn_rope *rp, double *m, int64_t B, int64_t L,
                                 int64_t H, int64_t D) {
    if (rp->kind == ATTN_ROPE_NONE) return;
    const int64_t r = rp->rotary_dim ? rp->rotary_dim : D;
    for (int64_t row = 0; row < B * L * H; row++)
        for (int64_t c = 0; c < r / 2; c++) {
            const int64_t lo = rp->kind == ATTN_ROPE_HALF ? c : 2 * c;
            const int64_t hi = rp->kind == ATTN_ROPE_HALF ? c + r / 2 : 2 * c + 1;
            const double s = m[row * D + lo] + m[row * D + hi];
            m[row * D + lo] = m[row * D + hi] = s;
        }
}

/* The bound on a cached K or V value against its float64 projection ref, mag the
 * projection's magnitude (sum |x w| + |b|, through RoPE's): the float32 product of K_in
 * terms plus the bias (tol_dot_rel + u), RoPE's products, sum and float32 angle (its
 * error u |angle| moves cos and sin by as much, plus their own ulps: (|angle| + 4) u),
 * then one rounding to dt (unit roundoff 2^-11 float16, 2^-8 bfloat16, 0 float32; float16
 * subnormals below 2^-14 in steps of 2^-24, half a step absolute). */
static inline double mref_cache_bound(attn_dtype dt, double ref, double mag, int64_t k_in,
                                      double angle_max) {
    const double u = TOL_U32;
    const double f32 = (tol_dot_rel(k_in) + u + (angle_max + 4.0) * u) * mag;
    const double uh = dt == ATTN_F16 ? 0x1p-11 : dt == ATTN_BF16 ? 0x1p-8 : 0.0;
    return f32 + uh * (fabs(ref) + f32) + (dt == ATTN_F16 ? 0x1p-25 : 0.0);
}

/* [B, L, H, D] <-> [B, H, L, D] */
static inline void mref_swap(const double *src, double *dst, int64_t B, int64_t L, int64_t H,
                             int64_t D, bool to_heads) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < L; i++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < D; d++) {
                    int64_t rows = ((b * L + i) * H + h) * D + d, heads = ((b * H + h) * L + i) * D + d;
                    if (to_heads) dst[heads] = src[rows];
                    else dst[rows] = src[heads];
                }
}

/* K (n = 1) or V (n = 2) of the attention, [B, Hkv, Lk, D] in heads, replaced by the
 * cache's stored values, each first checked against its float64 value (l->cache->ratio) */
static inline void mref_from_cache(const mlayer *l, const double *xkv, const double *w,
                                   const double *bias, int n, double *heads) {
    const mcase *c = &l->c;
    const int64_t B = c->B, Lk = c->Lk, H = c->Hkv, D = n == 1 ? c->Dk : c->Dv, K = l->in[n];
    const int64_t rows = B * Lk;
    double *ax = xcalloc(rows * K, sizeof(double)), *aw = xcalloc(K * H * D, sizeof(double));
    double *ab = bias ? xcalloc(H * D, sizeof(double)) : NULL;
    double *mrows = xcalloc(rows * H * D, sizeof(double)), *mag = xcalloc(rows * H * D, sizeof(double));
    for (int64_t e = 0; e < rows * K; e++) ax[e] = fabs(xkv[e]);
    for (int64_t e = 0; e < K * H * D; e++) aw[e] = fabs(w[e]);
    for (int64_t e = 0; ab && e < H * D; e++) ab[e] = fabs(bias[e]);
    mref_project(mrows, ax, aw, ab, rows, H * D, K);
    if (n == 1) mref_rope_mag(&c->rope, mrows, B, Lk, H, D);
    mref_swap(mrows, mag, B, Lk, H, D, true);
    const double angle = n == 1 && c->rope.kind != ATTN_ROPE_NONE ? (double)(c->rope.offset + Lk) : 0.0;
    const void *src = n == 1 ? l->cache->k : l->cache->v;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t j = 0; j < Lk; j++)
                for (int64_t d = 0; d < D; d++) {
                    const int64_t at = ((b * H + h) * Lk + j) * D + d;
                    const double got = attn_load(l->cache->dt, src, ((b * H + h) * l->cache->lmax + j) * D + d);
                    const double q = fabs(got - heads[at]) /
                                     mref_cache_bound(l->cache->dt, heads[at], mag[at], K, angle);
                    if (!(q <= l->cache->ratio)) l->cache->ratio = isnan(q) ? INFINITY : q;
                    heads[at] = got;
                }
    free(ax); free(aw); free(ab); free(mrows); free(mag);
}

/* The layer in double: y [B, Lq, E]; qkv (if not NULL) gets the rotated projections
 * [B, H, L, D] as the attention reads them, in three arrays the caller frees. x_q and x_kv may differ from l's (the
 * finite differences perturb copies). Returns the attention's status. */
static inline attn_status mref_forward(const mlayer *l, const double *xq, const double *xkv,
                                       double *const w[4], double *const bias[4],
                                       const attn_options *opt, double *y, double **qkv) {
    const mcase *c = &l->c;
    const int64_t B = c->B, Lq = c->Lq, Lk = c->Lk;
    double *rows[3], *heads[3], *o = xcalloc(B * Lq * c->Hq * c->Dv, sizeof(double));
    double *orows = xcalloc(B * Lq * c->Hq * c->Dv, sizeof(double));
    const int64_t L[3] = {Lq, Lk, Lk}, H[3] = {c->Hq, c->Hkv, c->Hkv};
    const int64_t D[3] = {c->Dk, c->Dk, c->Dv};
    for (int n = 0; n < 3; n++) {
        rows[n] = xcalloc(B * L[n] * H[n] * D[n], sizeof(double));
        heads[n] = xcalloc(B * L[n] * H[n] * D[n], sizeof(double));
        mref_project(rows[n], n == 0 ? xq : xkv, w[n], bias[n], B * L[n], H[n] * D[n], l->in[n]);
        if (n < 2) mref_rope(&c->rope, rows[n], B, L[n], H[n], D[n], NULL);
        mref_swap(rows[n], heads[n], B, L[n], H[n], D[n], true);
        if (n > 0 && l->cache) mref_from_cache(l, xkv, w[n], bias[n], n, heads[n]);
    }
    attn_tensor tq = attn_tensor_4d(NULL, ATTN_F32, B, c->Hq, Lq, c->Dk);
    attn_tensor tk = attn_tensor_4d(NULL, ATTN_F32, B, c->Hkv, Lk, c->Dk);
    attn_tensor tv = attn_tensor_4d(NULL, ATTN_F32, B, c->Hkv, Lk, c->Dv);
    attn_tensor to = attn_tensor_4d(NULL, ATTN_F32, B, c->Hq, Lq, c->Dv);
    attn_params p;
    attn_status st = ai_params_init(&p, &tq, &tk, &tv, &to, opt, false);
    if (st == ATTN_OK) st = ai_ref64_forward(&p, heads[0], heads[1], heads[2], o, NULL);
    mref_swap(o, orows, B, Lq, c->Hq, c->Dv, false);
    mref_project(y, orows, w[W_O], bias[W_O], B * Lq, c->E, c->Hq * c->Dv);
    for (int n = 0; n < 3; n++) {
        free(rows[n]);
        if (qkv) qkv[n] = heads[n];
        else free(heads[n]);
    }
    free(o);
    free(orows);
    return st;
}

/* rows [t0, t0 + n) of a [B, L, C] tensor (float32 or a 16-bit type): the decoding
 * suites' steps */
static inline attn_tensor rows_slice(const attn_tensor *t, int64_t t0, int64_t n) {
    attn_tensor s = *t;
    s.data = (char *)t->data + (size_t)(t0 * t->stride[1]) * (t->dtype == ATTN_F32 ? 4 : 2);
    s.shape[1] = n;
    return s;
}

/* The module's gradients as float32 tensors over one arena, gathered as [in, out]. */
enum { G_XQ = 0, G_XKV, G_W, G_B = G_W + 4, G_N = G_B + 4 };

typedef struct mgrads {
    float *buf[G_N];
    int64_t n[G_N];
    attn_tensor t[G_N];
    attn_mha_grads g;
} mgrads;

/* gr->g pointing at gr->t: dx_kv only for cross-attention, the biases' gradients only
 * for a layer with biases */
static inline void mgrads_bind(mgrads *gr, const mcase *c) {
    gr->g = (attn_mha_grads){.dx_q = &gr->t[G_XQ], .dx_kv = c->self ? NULL : &gr->t[G_XKV],
                             .dw_q = &gr->t[G_W], .dw_k = &gr->t[G_W + 1],
                             .dw_v = &gr->t[G_W + 2], .dw_o = &gr->t[G_W + 3]};
    if (c->bias) {
        gr->g.db_q = &gr->t[G_B]; gr->g.db_k = &gr->t[G_B + 1];
        gr->g.db_v = &gr->t[G_B + 2]; gr->g.db_o = &gr->t[G_B + 3];
    }
}

static inline void mgrads_free(mgrads *gr) {
    for (int n = 0; n < G_N; n++) free(gr->buf[n]);
}

/* l's y against the float64 causal layer over the same inputs (the decoding suites: a
 * loop of steps must be one causal call): 1 when within the float32 tolerance (*r
 * filled), and *frob the relative Frobenius error */
static inline int mlayer_vs_causal(const mlayer *l, tol_result *r, double *frob) {
    const mcase *c = &l->c;
    const int64_t ny = c->B * c->Lq * c->E;
    double *ref = xcalloc(ny, sizeof(double)), num = 0, den = 0;
    mref_forward(l, l->xq, l->xq, l->w, l->b, &(attn_options){.causal = true}, ref, NULL);
    float *got = xcalloc(ny, sizeof(float));
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t i = 0; i < c->Lq; i++)
            for (int64_t e = 0; e < c->E; e++) {
                const int64_t at = (b * c->Lq + i) * c->E + e;
                got[at] = (float)mlayer_y(l, b, i, e);
                num += (got[at] - ref[at]) * (got[at] - ref[at]);
                den += ref[at] * ref[at];
            }
    const int ok = within_f32_tol(got, ref, ny, r);
    free(ref);
    free(got);
    *frob = sqrt(num / den);
    return ok;
}

#endif /* ATTN_TEST_MHA_REF_H */
