/*
 * additive_case.h — one additive-attention call built from a case description, for
 *                   test_additive.c and test_additive_backward.c: inputs (dense, or
 *                   stored column-major per batch so the library must gather them; keys
 *                   and values inside a larger NaN-filled buffer), the weights, the masks
 *                   (kv_len, bool mask, causal, window), and the outputs with their
 *                   sentinel fill. Header-only; no code from src/.
 */
#ifndef ATTN_TEST_ADDITIVE_CASE_H
#define ATTN_TEST_ADDITIVE_CASE_H

#include "oracle.h"

typedef struct acase {
    int64_t B, Lq, Lk, Dq, Dk, Dv, A;
    int layout;        /* 0: [B, 1, L, D] dense; 1: each batch's [L, D] stored column-major */
    int mask;          /* bool mask [B, 1, Lq, Lk], with row 0 of batch 0 all false    */
    int causal, align, window;
    int64_t wl, wr;
    int kvlen;         /* per-batch key lengths: batch 1 gets Lk, batch 2 gets 0        */
    int bias, normalize;
    float scale_in;    /* inputs drawn from U(-scale_in, scale_in), 0 = 1               */
    uint64_t seed;
} acase;

typedef struct acall {
    acase c;
    char desc[300];
    float *qb, *kb, *vb, *ob, *lseb, *wb;   /* buffers                                  */
    float *W, *U, *v, *bias;                /* weights                                  */
    unsigned char *maskb;
    int64_t *kvl;
    int64_t kn, vn;
    attn_tensor q, k, val, o, lse, w, mask, kvlen;
    attn_additive_weights wt;
    attn_options opt;
} acall;

static inline void acase_describe(const acase *c, char *out, size_t n) {
    snprintf(out, n, "B=%lld Lq=%lld Lk=%lld Dq=%lld Dk=%lld Dv=%lld A=%lld layout=%d mask=%d "
             "causal=%d align=%d window=%d(%lld,%lld) kvlen=%d bias=%d normalize=%d seed=%llu",
             (long long)c->B, (long long)c->Lq, (long long)c->Lk, (long long)c->Dq,
             (long long)c->Dk, (long long)c->Dv, (long long)c->A, c->layout, c->mask, c->causal,
             c->align, c->window, (long long)c->wl, (long long)c->wr, c->kvlen, c->bias,
             c->normalize, (unsigned long long)c->seed);
}

/* A [B, 1, L, D] view over buf + off: dense, or column-major per batch (layout 1). */
static inline attn_tensor acase_view(float *buf, int64_t off, int64_t B, int64_t L, int64_t D,
                                     int64_t ld, int layout) {
    attn_tensor t = attn_tensor_4d(buf + off, ATTN_F32, B, 1, L, D);
    t.stride[0] = ld * (layout ? (D > 0 ? D : 1) : (L > 0 ? L : 1));
    t.stride[1] = 0;
    if (layout) { t.stride[2] = 1; t.stride[3] = ld; }
    else { t.stride[2] = ld; t.stride[3] = 1; }
    return t;
}

static inline void acall_fill(const attn_tensor *t, rng_t *r, double s) {
    for (int64_t b = 0; b < t->shape[0]; b++)
        for (int64_t i = 0; i < t->shape[2]; i++)
            for (int64_t d = 0; d < t->shape[3]; d++)
                *view_ptr(t, b, 0, i, d) = (float)rng_range(r, -s, s);
}

static inline void acall_build(acall *t, const acase *c) {
    memset(t, 0, sizeof *t);
    t->c = *c;
    acase_describe(c, t->desc, sizeof t->desc);
    rng_t r = {c->seed * 0x9e3779b97f4a7c15ULL + 11};
    const int64_t B = c->B, Lq = c->Lq, Lk = c->Lk, A = c->A;
    const double s = c->scale_in > 0 ? c->scale_in : 1.0;
    /* q and o: padded rows (ld = D + 3) in layout 0, padded columns (ld = L + 2) in 1 */
    const int64_t ldq = c->layout ? Lq + 2 : c->Dq + 3, ldo = c->layout ? Lq + 2 : c->Dv + 3;
    t->qb = xcalloc(B * (c->layout ? c->Dq : Lq) * ldq + 1, sizeof(float));
    t->q = acase_view(t->qb, 0, B, Lq, c->Dq, ldq, c->layout);
    acall_fill(&t->q, &r, s);
    /* k and v: inside NaN, starting 2 rows in */
    const int64_t ldk = c->layout ? Lk + 5 : c->Dk + 2, ldv = c->layout ? Lk + 5 : c->Dv + 1;
    t->kn = B * (c->layout ? c->Dk : Lk) * ldk + 3 * ldk + 8;
    t->vn = B * (c->layout ? c->Dv : Lk) * ldv + 3 * ldv + 8;
    t->kb = xcalloc(t->kn, sizeof(float));
    t->vb = xcalloc(t->vn, sizeof(float));
    for (int64_t i = 0; i < t->kn; i++) t->kb[i] = NAN;
    for (int64_t i = 0; i < t->vn; i++) t->vb[i] = NAN;
    t->k = acase_view(t->kb, c->layout ? 2 : 2 * ldk, B, Lk, c->Dk, ldk, c->layout);
    t->val = acase_view(t->vb, c->layout ? 2 : 2 * ldv, B, Lk, c->Dv, ldv, c->layout);
    acall_fill(&t->k, &r, s);
    acall_fill(&t->val, &r, s);
    t->ob = xcalloc(B * (c->layout ? c->Dv : Lq) * ldo + 1, sizeof(float));
    t->o = acase_view(t->ob, 0, B, Lq, c->Dv, ldo, c->layout);
    /* weights: W, U ~ U(-1, 1) / sqrt(D), v ~ U(-1, 1) */
    t->W = xcalloc(c->Dq * A, sizeof(float));
    t->U = xcalloc(c->Dk * A, sizeof(float));
    t->v = xcalloc(A, sizeof(float));
    t->bias = xcalloc(A, sizeof(float));
    for (int64_t x = 0; x < c->Dq * A; x++) t->W[x] = (float)(rng_range(&r, -1, 1) / sqrt((double)c->Dq));
    for (int64_t x = 0; x < c->Dk * A; x++) t->U[x] = (float)(rng_range(&r, -1, 1) / sqrt((double)c->Dk));
    for (int64_t a = 0; a < A; a++) t->v[a] = (float)rng_range(&r, -1, 1);
    for (int64_t a = 0; a < A; a++) t->bias[a] = (float)rng_range(&r, -0.5, 0.5);
    t->wt = (attn_additive_weights){.units = A, .w_query = t->W, .w_key = t->U, .v = t->v,
                                    .bias = c->bias ? t->bias : NULL,
                                    .normalize = c->normalize != 0, .g = 1.7f};
    attn_options *opt = &t->opt;
    if (c->mask) {
        t->maskb = xcalloc(B * Lq * Lk, 1);
        for (int64_t x = 0; x < B * Lq * Lk; x++) t->maskb[x] = rng_unif(&r) < 0.7;
        for (int64_t j = 0; j < Lk && Lq > 0; j++) t->maskb[j] = 0;
        t->mask = attn_tensor_4d(t->maskb, ATTN_BOOL, B, 1, Lq, Lk);
        opt->mask = &t->mask;
    }
    if (c->kvlen) {
        t->kvl = xcalloc(B, sizeof(int64_t));
        for (int64_t b = 0; b < B; b++)
            t->kvl[b] = b == 1 ? Lk : b == 2 ? 0 : rng_int(&r, Lk + 1);
        t->kvlen = attn_tensor_4d(t->kvl, ATTN_I64, B, 1, 1, 1);
        opt->kv_len = &t->kvlen;
    }
    opt->causal = c->causal != 0;
    opt->align = c->align ? ATTN_ALIGN_BOTTOM_RIGHT : ATTN_ALIGN_TOP_LEFT;
    opt->has_window = c->window != 0;
    opt->window_left = c->wl;
    opt->window_right = c->wr;
    t->lseb = xcalloc(B * Lq, sizeof(float));
    t->lse = attn_tensor_4d(t->lseb, ATTN_F32, B, 1, Lq, 1);
    t->wb = xcalloc(B * Lq * Lk, sizeof(float));
    t->w = attn_tensor_4d(t->wb, ATTN_F32, B, 1, Lq, Lk);
}

/* The forward on `path`, outputs first filled with the sentinel. */
static inline attn_status acall_forward(acall *t, attn_path path, int threads, int outputs) {
    const acase *c = &t->c;
    fill_sentinel(t->ob, c->B * (c->layout ? c->Dv : c->Lq) *
                             (c->layout ? c->Lq + 2 : c->Dv + 3) + 1);
    fill_sentinel(t->lseb, c->B * c->Lq);
    fill_sentinel(t->wb, c->B * c->Lq * c->Lk);
    t->opt.lse = outputs ? &t->lse : NULL;
    t->opt.weights = outputs ? &t->w : NULL;
    t->opt.path = path;
    t->opt.threads = threads;
    return attn_additive_forward(&t->q, &t->k, &t->val, &t->wt, &t->o, &t->opt);
}

/* docs/CONTRACT.md's additive tolerance: the float32 rule with 10x its bounds (each logit
 * sums A tanh values of a few ulp each), and non-finite entries matching exactly. */
static inline int within_add_tol(const float *got, const double *ref, int64_t n, tol_result *r) {
    tol_result rr;
    within_f32_tol(got, ref, n, &rr);
    if (r) *r = rr;
    return rr.nonfinite_mismatch == 0 && rr.rel_err <= 1e-5 &&
           rr.max_err <= 1e-4 * (1.0 + rr.max_ref);
}

static inline int same_bits(const float *a, const float *b, int64_t n) {
    return n == 0 || memcmp(a, b, (size_t)n * sizeof(float)) == 0;
}

/* Overwrite with NaN every K and V row no query row may read (by structure). */
static inline int64_t poison_unread(acall *t) {
    const acase *c = &t->c;
    int64_t n = 0;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t j = 0; j < c->Lk; j++) {
            int used = 0;
            const int64_t lkb = c->kvlen ? t->kvl[b] : c->Lk;
            for (int64_t i = 0; i < c->Lq && !used; i++) {
                const int64_t d = c->align ? i + lkb - c->Lq : i;
                used = j < lkb && !(c->causal && j > d) &&
                       !(c->window && c->wl >= 0 && j < d - c->wl) &&
                       !(c->window && c->wr >= 0 && j > d + c->wr);
            }
            if (used) continue;
            for (int64_t d = 0; d < c->Dk; d++) *view_ptr(&t->k, b, 0, j, d) = NAN;
            for (int64_t d = 0; d < c->Dv; d++) *view_ptr(&t->val, b, 0, j, d) = NAN;
            n++;
        }
    return n;
}

static inline acase mk(int64_t B, int64_t Lq, int64_t Lk, int64_t Dq, int64_t Dk, int64_t Dv,
                int64_t A, uint64_t seed) {
    acase c;
    memset(&c, 0, sizeof c);
    c.B = B; c.Lq = Lq; c.Lk = Lk; c.Dq = Dq; c.Dk = Dk; c.Dv = Dv; c.A = A;
    c.wl = c.wr = -1;
    c.seed = seed;
    return c;
}

/* ---- the tests' float64 oracle ------------------------------------------------------- */

/* Is key j of row i kept (key length, causal, window, bool mask)? */
static inline int oracle_keep(const acall *t, int64_t b, int64_t i, int64_t j) {
    const acase *c = &t->c;
    const int64_t lkb = c->kvlen ? t->kvl[b] : c->Lk;
    const int64_t d = c->align ? i + lkb - c->Lq : i;
    if (j >= lkb || (c->causal && j > d)) return 0;
    if (c->window && c->wl >= 0 && j < d - c->wl) return 0;
    if (c->window && c->wr >= 0 && j > d + c->wr) return 0;
    return !c->mask || t->maskb[(b * c->Lq + i) * c->Lk + j];
}

/* o [B, Lq, Dv], lse [B, Lq], w [B, Lq, Lk] dense float64 */
static inline void oracle(const acall *t, double *o, double *lse, double *w) {
    const acase *c = &t->c;
    const int64_t A = c->A;
    double *vt = xcalloc(A, sizeof(double)), *e = xcalloc(c->Lk, sizeof(double));
    double n2 = 0;
    for (int64_t a = 0; a < A; a++) n2 += (double)t->v[a] * t->v[a];
    for (int64_t a = 0; a < A; a++)
        vt[a] = c->normalize ? (n2 > 0 ? (double)t->wt.g * t->v[a] / sqrt(n2) : 0) : t->v[a];
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t i = 0; i < c->Lq; i++) {
            double m = -INFINITY, l = 0;
            for (int64_t j = 0; j < c->Lk; j++) {
                e[j] = -INFINITY;
                if (!oracle_keep(t, b, i, j)) continue;
                double s = 0;
                for (int64_t a = 0; a < A; a++) {
                    double x = c->bias ? t->bias[a] : 0;
                    for (int64_t d = 0; d < c->Dq; d++) x += *view_ptr(&t->q, b, 0, i, d) * (double)t->W[d * A + a];
                    for (int64_t d = 0; d < c->Dk; d++) x += *view_ptr(&t->k, b, 0, j, d) * (double)t->U[d * A + a];
                    s += vt[a] * tanh(x);
                }
                e[j] = s;
                if (s > m) m = s;
            }
            for (int64_t j = 0; j < c->Lk; j++) l += e[j] == -INFINITY ? 0 : exp(e[j] - m);
            double *o_i = o + (b * c->Lq + i) * c->Dv;
            for (int64_t d = 0; d < c->Dv; d++) o_i[d] = 0;
            for (int64_t j = 0; j < c->Lk; j++) {
                const double p = m == -INFINITY || e[j] == -INFINITY ? 0 : exp(e[j] - m) / l;
                w[(b * c->Lq + i) * c->Lk + j] = p;
                for (int64_t d = 0; p > 0 && d < c->Dv; d++) o_i[d] += p * *view_ptr(&t->val, b, 0, j, d);
            }
            lse[b * c->Lq + i] = m == -INFINITY ? -INFINITY : m + log(l);
        }
    free(vt);
    free(e);
}

/* In a build without a BLAS the fused path must refuse (ATTN_ERR_UNSUPPORTED): checked,
 * and 1 is returned so that a suite skips the rest. 0 in a build with one. */
static inline void acall_free(acall *t);
static inline int acall_without_blas(void) {
    if (strcmp(attn_blas_name(), "none") != 0) return 0;
    acase c = mk(1, 2, 3, 2, 2, 2, 4, 1);
    acall t;
    acall_build(&t, &c);
    CHECK(acall_forward(&t, ATTN_PATH_FUSED, 1, 0) == ATTN_ERR_UNSUPPORTED,
          "no BLAS: the fused path must return ATTN_ERR_UNSUPPORTED");
    acall_free(&t);
    printf("  this build has no BLAS: the fused path's refusal checked, the rest skipped\n");
    return 1;
}

static inline void acall_free(acall *t) {
    free(t->qb); free(t->kb); free(t->vb); free(t->ob); free(t->lseb); free(t->wb);
    free(t->W); free(t->U); free(t->v); free(t->bias); free(t->maskb); free(t->kvl);
    memset(t, 0, sizeof *t);
}

#endif /* ATTN_TEST_ADDITIVE_CASE_H */
