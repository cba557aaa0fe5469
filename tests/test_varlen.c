/*
 * test_varlen.c — packed (variable-length) batches: attn_varlen_forward and
 *                 attn_varlen_backward (docs/CONTRACT.md, "Packed (variable-length)
 *                 batches").
 *
 * What it covers:
 *  1. The forward on random packed batches (lengths 0, 1, 16, 64, ~300, Lq != Lk per
 *     sequence; GQA; causal under both alignments, window, ALiBi, softcap, sinks;
 *     float32, bfloat16, float16, float64; the [total, H, D] layout and the contiguous
 *     {1, H, total, D}): bit for bit the rectangular call on each sequence alone (fused
 *     and reference paths), and within the contract's tolerance of the float64 reference
 *     of each sequence (O, and the LSE with within_lse_tol).
 *  2. Dropout: the reference path's result is bit for bit the padded rectangular call
 *     [B, Hq, max_seqlen_q, max_seqlen_k] with kv_len = Lk_s on each sequence's rows
 *     (so the keep decisions are that call's at b = s), the fused path within tolerance
 *     of it; a per-sequence call (its own mask) is not.
 *  3. The backward: bit for bit the rectangular backward of each sequence, d_sinks the
 *     in-order sum of theirs, the same bits for 1, 2 and 3 threads; with dropout, the
 *     reference bit for bit the padded call's, the fused path close to it.
 *  4. Refusals (cu_seqlens not monotone, first != 0, last != total, max_seqlen too
 *     small, wrong dtype, B + 1 disagreeing, mask, bias, kv_len, block_table beside
 *     cu_seqlens_k, weights)
 *     with their status and nothing written.
 *  5. Planted errors: a sequence boundary off by one fails both checks.
 * What it is not: a test of the rectangular call itself (test_forward.c and the rest).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "core/half.h"
#include "oracle.h"
#include "sinks_case.h"

enum { MAXB = 8 };
static const char *const k_grad[3] = {"dq", "dk", "dv"};

typedef struct vcase {
    int B;
    int64_t lq[MAXB], lk[MAXB];
    int64_t Hq, Hkv, Dk, Dv;
    attn_dtype dt;  // q, k, v, o (and d_o, dq, dk, dv)
    bool fa;        // [total, H, D] storage, else {1, H, total, D}
    bool causal;
    attn_align align;
    bool window;
    int64_t wl, wr;
    bool alibi, sinks;
    float softcap, dropout;
    bool i64;  // cu_seqlens int64
    uint64_t seed;
} vcase;

typedef struct vdata {
    vcase c;
    int64_t tq, tk, maxq, maxk, cu_q[MAXB + 1], cu_k[MAXB + 1];
    int32_t cu_q32[MAXB + 1], cu_k32[MAXB + 1];
    void *bq, *bk, *bv, *bdo;
    attn_tensor q, k, v, d_o, tcq, tck, talibi, tsinks;
    float alibi[16], sinks[16];
    attn_options opt;
} vdata;

static attn_tensor packed(void *buf, attn_dtype dt, int64_t H, int64_t total, int64_t D, bool fa) {
    if (!fa) return attn_tensor_4d(buf, dt, 1, H, total, D);
    return (attn_tensor){buf, dt, {1, H, total, D}, {total * H * D, D, H * D, 1}};
}

/* rows [r0, r0 + n) of a packed view: the test's own slicing */
static attn_tensor slice(const attn_tensor *t, int64_t r0, int64_t n) {
    attn_tensor v = *t;
    v.shape[2] = n;
    const int64_t e = r0 * t->stride[2];  // q8_0: a whole block (stride[2] a multiple of 32)
    v.data = (char *)t->data + (size_t)(e / attn_dtype_block(t->dtype)) * attn_dtype_size(t->dtype);
    return v;
}

static int64_t nelem(const attn_tensor *t) {
    return t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3];
}
static size_t nbytes(const attn_tensor *t) { return (size_t)nelem(t) * attn_dtype_size(t->dtype); }

/* a buffer of t's rows and heads, width D and dtype dt, in t's layout, every byte `fill` */
static attn_tensor like(const attn_tensor *t, attn_dtype dt, int64_t D, int fill) {
    const int64_t n = t->shape[1] * t->shape[2] * D;
    void *b = xcalloc(n, attn_dtype_size(dt));
    memset(b, fill, (size_t)(n > 0 ? n : 1) * attn_dtype_size(dt));
    return packed(b, dt, t->shape[1], t->shape[2], D, t->stride[2] != t->shape[3]);
}

static void fill(const attn_tensor *t, rng_t *r, double amp) {
    for (int64_t h = 0; h < t->shape[1]; h++)
        for (int64_t i = 0; i < t->shape[2]; i++)
            for (int64_t d = 0; d < t->shape[3]; d++)
                attn_store_f64(t->dtype, t->data, h * t->stride[1] + i * t->stride[2] + d * t->stride[3],
                               amp * rng_sym(r));
}

/* a view's values, logical order [H, L, D], as double */
static double *gather_dbl(const attn_tensor *t) {
    double *out = xcalloc(nelem(t), sizeof(double));
    int64_t x = 0;
    for (int64_t h = 0; h < t->shape[1]; h++)
        for (int64_t i = 0; i < t->shape[2]; i++)
            for (int64_t d = 0; d < t->shape[3]; d++)
                out[x++] = attn_load_f64(t->dtype, t->data,
                                         h * t->stride[1] + i * t->stride[2] + d * t->stride[3]);
    return out;
}

static void vmake(const vcase *c, vdata *d) {
    memset(d, 0, sizeof *d);
    d->c = *c;
    rng_t r = {c->seed};
    for (int s = 0; s < c->B; s++) {
        d->cu_q[s + 1] = d->cu_q[s] + c->lq[s];
        d->cu_k[s + 1] = d->cu_k[s] + c->lk[s];
        if (c->lq[s] > d->maxq) d->maxq = c->lq[s];
        if (c->lk[s] > d->maxk) d->maxk = c->lk[s];
    }
    for (int s = 0; s <= c->B; s++) d->cu_q32[s] = (int32_t)d->cu_q[s], d->cu_k32[s] = (int32_t)d->cu_k[s];
    d->tq = d->cu_q[c->B], d->tk = d->cu_k[c->B];
    const size_t e = attn_dtype_size(c->dt);
    d->bq = xcalloc(c->Hq * d->tq * c->Dk, e), d->bk = xcalloc(c->Hkv * d->tk * c->Dk, e);
    d->bv = xcalloc(c->Hkv * d->tk * c->Dv, e), d->bdo = xcalloc(c->Hq * d->tq * c->Dv, e);
    d->q = packed(d->bq, c->dt, c->Hq, d->tq, c->Dk, c->fa);
    d->k = packed(d->bk, c->dt, c->Hkv, d->tk, c->Dk, c->fa);
    d->v = packed(d->bv, c->dt, c->Hkv, d->tk, c->Dv, c->fa);
    d->d_o = packed(d->bdo, c->dt, c->Hq, d->tq, c->Dv, c->fa);
    fill(&d->q, &r, 2.0), fill(&d->k, &r, 2.0), fill(&d->v, &r, 1.0), fill(&d->d_o, &r, 1.0);
    d->tcq = c->i64 ? attn_tensor_4d(d->cu_q, ATTN_I64, c->B + 1, 1, 1, 1)
                    : attn_tensor_4d(d->cu_q32, ATTN_I32, c->B + 1, 1, 1, 1);
    d->tck = c->i64 ? attn_tensor_4d(d->cu_k, ATTN_I64, c->B + 1, 1, 1, 1)
                    : attn_tensor_4d(d->cu_k32, ATTN_I32, c->B + 1, 1, 1, 1);
    for (int64_t h = 0; h < c->Hq; h++) {
        d->alibi[h] = (float)rng_range(&r, 0.01, 0.3);
        d->sinks[h] = h == 0 ? -INFINITY : (float)rng_range(&r, -1.0, 2.0);
    }
    d->talibi = attn_tensor_4d(d->alibi, ATTN_F32, c->Hq, 1, 1, 1);
    d->tsinks = attn_tensor_4d(d->sinks, ATTN_F32, c->Hq, 1, 1, 1);
    attn_options o = {0};
    o.causal = c->causal, o.align = c->align, o.has_window = c->window;
    o.window_left = c->wl, o.window_right = c->wr, o.softcap = c->softcap;
    o.alibi_slopes = c->alibi ? &d->talibi : NULL;
    o.sinks = c->sinks ? &d->tsinks : NULL;
    o.dropout_p = c->dropout, o.dropout_seed = 0x5eed + c->seed, o.dropout_offset = 7;
    d->opt = o;
}

static void vfree(vdata *d) { free(d->bq), free(d->bk), free(d->bv), free(d->bdo); }

static void describe(const vcase *c, char *out, size_t n) {
    snprintf(out, n, "seed %llu %s%s B %d Hq %lld Hkv %lld%s%s%s%s%s%s softcap %g p %g",
             (unsigned long long)c->seed, attn_dtype_name(c->dt), c->fa ? " [total,H,D]" : "",
             c->B, (long long)c->Hq, (long long)c->Hkv,
             c->causal ? (c->align ? " causal-br" : " causal-tl") : "", c->window ? " window" : "",
             c->alibi ? " alibi" : "", c->sinks ? " sinks" : "", c->i64 ? " cu64" : "",
             "", (double)c->softcap, (double)c->dropout);
}

/* The rectangular forward of each sequence alone into o, lse (packed; cu the boundaries,
 * shifted by the planted-error check). */
static attn_status per_seq_forward(const vdata *d, const int64_t *cu_q, const int64_t *cu_k,
                                   const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                                   const attn_tensor *o, const attn_tensor *lse, attn_options opt) {
    for (int s = 0; s < d->c.B; s++) {
        const int64_t lq = cu_q[s + 1] - cu_q[s], lk = cu_k[s + 1] - cu_k[s];
        attn_tensor qs = slice(q, cu_q[s], lq), ks = slice(k, cu_k[s], lk), vs = slice(v, cu_k[s], lk);
        attn_tensor os = slice(o, cu_q[s], lq), ls = slice(lse, cu_q[s], lq);
        attn_options so = opt;
        so.lse = &ls;
        const attn_status st = attn_forward(&qs, &ks, &vs, &os, &so);
        if (st != ATTN_OK) return st;
    }
    return ATTN_OK;
}

/* the float64 reference of each sequence: float64 copies, the reference path, o and lse
 * double, logical order */
static void reference64(const vdata *d, double *ro, double *rl, const int64_t *cu_q) {
    const vcase *c = &d->c;
    attn_tensor q = packed(xcalloc(nelem(&d->q), 8), ATTN_F64, c->Hq, d->tq, c->Dk, false);
    attn_tensor k = packed(xcalloc(nelem(&d->k), 8), ATTN_F64, c->Hkv, d->tk, c->Dk, false);
    attn_tensor v = packed(xcalloc(nelem(&d->v), 8), ATTN_F64, c->Hkv, d->tk, c->Dv, false);
    const attn_tensor *src[3] = {&d->q, &d->k, &d->v}, *dst[3] = {&q, &k, &v};
    for (int x = 0; x < 3; x++) {
        double *g = gather_dbl(src[x]);
        memcpy(dst[x]->data, g, (size_t)nelem(dst[x]) * 8);
        free(g);
    }
    attn_tensor o = packed(ro, ATTN_F64, c->Hq, d->tq, c->Dv, false);
    attn_tensor l = packed(rl, ATTN_F64, c->Hq, d->tq, 1, false);
    attn_options opt = d->opt;
    opt.path = ATTN_PATH_REFERENCE;
    const attn_status st = per_seq_forward(d, cu_q, d->cu_k, &q, &k, &v, &o, &l, opt);
    CHECK(st == ATTN_OK, "float64 reference: %s (%s)", attn_status_string(st), attn_last_error());
    free(q.data), free(k.data), free(v.data);
}

/* O within the contract's tolerance of the float64 reference (its dtype's) */
static int o_within(const attn_tensor *o, const double *ref, tol_result *r) {
    double *g = gather_dbl(o);
    const int64_t n = nelem(o);
    float *f = xcalloc(n, sizeof(float));
    for (int64_t x = 0; x < n; x++) f[x] = (float)g[x];
    double worst = 0.0;
    const int ok = o->dtype == ATTN_F32 || o->dtype == ATTN_F64 ? within_f32_tol(f, ref, n, r)
                                                                : within_half(f, ref, n, o->dtype, &worst);
    free(g), free(f);
    return ok;
}

/* the LSE within the contract's bound, each row's magnitude from its own sequence */
static int lse_within(const vdata *d, const attn_tensor *tl, const double *rl, tol_result *r) {
    const float *lse = tl->data;
    const vcase *c = &d->c;
    int ok = 1;
    for (int s = 0; s < c->B; s++) {
        const int64_t lq = c->lq[s], lk = c->lk[s];
        if (lq == 0) continue;
        attn_tensor qs = slice(&d->q, d->cu_q[s], lq), ks = slice(&d->k, d->cu_k[s], lk);
        double *m = xcalloc(c->Hq * lq, sizeof(double));
        oracle_logit_mag(&qs, &ks, &d->opt, m);
        float *g = xcalloc(c->Hq * lq, sizeof(float));
        double *rr = xcalloc(c->Hq * lq, sizeof(double));
        for (int64_t h = 0; h < c->Hq; h++)
            for (int64_t i = 0; i < lq; i++) {
                g[h * lq + i] = lse[h * tl->stride[1] + (d->cu_q[s] + i) * tl->stride[2]];
                rr[h * lq + i] = rl[h * d->tq + d->cu_q[s] + i];
                if (c->sinks && isfinite(d->sinks[h])) m[h * lq + i] = fmax(m[h * lq + i], fabs(d->sinks[h]));
            }
        ok &= within_lse_tol(g, rr, m, c->Hq * lq, c->Dk, lk + 1, r);
        free(m), free(g), free(rr);
    }
    return ok;
}

/* The padded rectangular call [B, Hq, maxq, maxk] with kv_len = Lk_s (q, k, v rows of
 * sequence s at batch s; padding rows zero, d_o's too), on the reference path: its O and
 * LSE written back to packed rows, and with bwd its gradients too. Top-left alignment
 * (the padded call's diagonal is then the sequence's). */
static void padded_call(const vdata *d, const attn_tensor *o_out, float *lse_out, bool bwd,
                        const attn_tensor *dq_out, const attn_tensor *dk_out, const attn_tensor *dv_out,
                        attn_path path) {
    const vcase *c = &d->c;
    const int64_t B = c->B, mq = d->maxq, mk = d->maxk;
    float *q = xcalloc(B * c->Hq * mq * c->Dk, 4), *k = xcalloc(B * c->Hkv * mk * c->Dk, 4);
    float *v = xcalloc(B * c->Hkv * mk * c->Dv, 4), *d_o = xcalloc(B * c->Hq * mq * c->Dv, 4);
    float *o = xcalloc(B * c->Hq * mq * c->Dv, 4), *lse = xcalloc(B * c->Hq * mq, 4);
    float *dq = xcalloc(B * c->Hq * mq * c->Dk, 4), *dk = xcalloc(B * c->Hkv * mk * c->Dk, 4);
    float *dv = xcalloc(B * c->Hkv * mk * c->Dv, 4);
    int64_t kvl[MAXB];
    const attn_tensor *src[4] = {&d->q, &d->k, &d->v, &d->d_o};
    float *dst[4] = {q, k, v, d_o};
    const int64_t Ls[4] = {mq, mk, mk, mq};
    for (int x = 0; x < 4; x++) {
        const attn_tensor *t = src[x];
        const bool key = x == 1 || x == 2;
        for (int s = 0; s < B; s++)
            for (int64_t h = 0; h < t->shape[1]; h++)
                for (int64_t i = 0; i < (key ? c->lk[s] : c->lq[s]); i++)
                    for (int64_t z = 0; z < t->shape[3]; z++)
                        dst[x][((s * t->shape[1] + h) * Ls[x] + i) * t->shape[3] + z] = attn_load(
                            t->dtype, t->data,
                            h * t->stride[1] + ((key ? d->cu_k[s] : d->cu_q[s]) + i) * t->stride[2] + z * t->stride[3]);
    }
    for (int s = 0; s < B; s++) kvl[s] = c->lk[s];
    attn_tensor tq = attn_tensor_4d(q, ATTN_F32, B, c->Hq, mq, c->Dk), tk = attn_tensor_4d(k, ATTN_F32, B, c->Hkv, mk, c->Dk);
    attn_tensor tv = attn_tensor_4d(v, ATTN_F32, B, c->Hkv, mk, c->Dv), to = attn_tensor_4d(o, ATTN_F32, B, c->Hq, mq, c->Dv);
    attn_tensor tl = attn_tensor_4d(lse, ATTN_F32, B, c->Hq, mq, 1), tkl = attn_tensor_4d(kvl, ATTN_I64, B, 1, 1, 1);
    attn_tensor tdo = attn_tensor_4d(d_o, ATTN_F32, B, c->Hq, mq, c->Dv);
    attn_tensor tdq = attn_tensor_4d(dq, ATTN_F32, B, c->Hq, mq, c->Dk), tdk = attn_tensor_4d(dk, ATTN_F32, B, c->Hkv, mk, c->Dk);
    attn_tensor tdv = attn_tensor_4d(dv, ATTN_F32, B, c->Hkv, mk, c->Dv);
    attn_options opt = d->opt;
    opt.kv_len = &tkl, opt.lse = &tl, opt.path = path;
    attn_status st = attn_forward(&tq, &tk, &tv, &to, &opt);
    CHECK(st == ATTN_OK, "padded forward: %s (%s)", attn_status_string(st), attn_last_error());
    if (bwd) {
        opt.lse = NULL;
        st = attn_backward(&tq, &tk, &tv, &to, &tdo, &tl, &tdq, &tdk, &tdv, &opt);
        CHECK(st == ATTN_OK, "padded backward: %s (%s)", attn_status_string(st), attn_last_error());
    }
    /* back to packed rows */
    const attn_tensor *outs[4] = {o_out, dq_out, dk_out, dv_out};
    const float *from[4] = {o, dq, dk, dv};
    for (int x = 0; x < (bwd ? 4 : 1); x++) {
        const attn_tensor *t = outs[x];
        const bool key = x >= 2;
        const int64_t L = key ? mk : mq;
        for (int s = 0; s < B; s++)
            for (int64_t h = 0; h < t->shape[1]; h++)
                for (int64_t i = 0; i < (key ? c->lk[s] : c->lq[s]); i++)
                    for (int64_t z = 0; z < t->shape[3]; z++)
                        attn_store(t->dtype, t->data,
                                   h * t->stride[1] + ((key ? d->cu_k[s] : d->cu_q[s]) + i) * t->stride[2] + z * t->stride[3],
                                   from[x][((s * t->shape[1] + h) * L + i) * t->shape[3] + z]);
    }
    for (int s = 0; lse_out && s < B; s++)
        for (int64_t h = 0; h < c->Hq; h++)
            for (int64_t i = 0; i < c->lq[s]; i++)
                lse_out[h * d->tq + d->cu_q[s] + i] = lse[(s * c->Hq + h) * mq + i];
    free(q), free(k), free(v), free(d_o), free(o), free(lse), free(dq), free(dk), free(dv);
}

static double rel_err(const attn_tensor *a, const attn_tensor *b) {
    double *x = gather_dbl(a), *y = gather_dbl(b), num = 0, den = 0;
    for (int64_t e = 0; e < nelem(a); e++) num += (x[e] - y[e]) * (x[e] - y[e]), den += y[e] * y[e];
    free(x), free(y);
    return sqrt(num) / (sqrt(den) + 1e-30);
}

/* a gradient against the reference path's, both in the call's dtype: float32 the
 * contract's rule (within_f32_tol); 16-bit, the same plus a rounding of each side */
static int grad_within(const attn_tensor *got, const attn_tensor *ref) {
    double *g = gather_dbl(got), *r = gather_dbl(ref), mref = 0.0;
    const int64_t n = nelem(got);
    int ok = 1;
    if (got->dtype == ATTN_F32) {
        float *f = xcalloc(n, sizeof(float));
        for (int64_t x = 0; x < n; x++) f[x] = (float)g[x];
        ok = within_f32_tol(f, r, n, NULL);
        free(f);
    } else {
        const double eps = got->dtype == ATTN_BF16 ? 0x1p-8 : 0x1p-11;
        for (int64_t x = 0; x < n; x++) mref = fmax(mref, fabs(r[x]));
        for (int64_t x = 0; x < n; x++)
            ok &= fabs(g[x] - r[x]) <= 2 * eps * fabs(r[x]) + 1e-5 * (1.0 + mref);
    }
    free(g), free(r);
    return ok;
}

/* ---- 1, 2, 5: the forward ------------------------------------------------------------- */

static void forward_case(const vcase *c, bool plant) {
    char what[200];
    describe(c, what, sizeof what);
    vdata d;
    vmake(c, &d);
    attn_tensor o1 = like(&d.q, c->dt, c->Dv, 0x7f), o2 = like(&d.q, c->dt, c->Dv, 0x7f);
    attn_tensor l1 = like(&d.q, ATTN_F32, 1, 0x7f), l2 = like(&d.q, ATTN_F32, 1, 0x7f);
    attn_options opt = d.opt;
    opt.lse = &l1;
    attn_status st = attn_varlen_forward(&d.q, &d.k, &d.v, &o1, &d.tcq, &d.tck, d.maxq, d.maxk, &opt);
    CHECK(st == ATTN_OK, "%s: varlen forward %s (%s)", what, attn_status_string(st), attn_last_error());
    size_t ws = 1;
    st = attn_varlen_forward_workspace_size(&d.q, &d.k, &d.v, &o1, &d.tcq, &d.tck, d.maxq, d.maxk, &opt, &ws);
    CHECK(st == ATTN_OK, "%s: workspace query %s", what, attn_status_string(st));
    {  /* the caller's workspace of the queried size: the same bits; one byte less refused */
        attn_tensor o5 = like(&d.q, c->dt, c->Dv, 0x7f), l5 = like(&d.q, ATTN_F32, 1, 0x7f);
        attn_options wo = opt;
        wo.lse = &l5, wo.workspace = xcalloc((int64_t)ws + 1, 1), wo.workspace_bytes = ws;
        st = attn_varlen_forward(&d.q, &d.k, &d.v, &o5, &d.tcq, &d.tck, d.maxq, d.maxk, &wo);
        CHECK(st == ATTN_OK && !memcmp(o1.data, o5.data, nbytes(&o1)) &&
              !memcmp(l1.data, l5.data, nbytes(&l1)), "%s: with the caller's workspace (%zu "
              "bytes): %s, or other bits", what, ws, attn_status_string(st));
        memset(o5.data, 0x7f, nbytes(&o5));
        wo.workspace_bytes = ws - 1;
        st = attn_varlen_forward(&d.q, &d.k, &d.v, &o5, &d.tcq, &d.tck, d.maxq, d.maxk, &wo);
        int untouched = 1;
        for (size_t z = 0; z < nbytes(&o5); z++) untouched &= ((unsigned char *)o5.data)[z] == 0x7f;
        CHECK(ws == 0 || (st == ATTN_ERR_WORKSPACE && untouched), "%s: a workspace one byte short: "
              "%s", what, attn_status_string(st));
        free(wo.workspace), free(o5.data), free(l5.data);
    }
    double *ro = xcalloc(nelem(&o1), 8), *rl = xcalloc(nelem(&l1), 8);
    tol_result r = {0};

    if (c->dropout == 0.0f) {
        /* bit for bit each sequence's own call (fused), and the reference through the loop */
        st = per_seq_forward(&d, d.cu_q, d.cu_k, &d.q, &d.k, &d.v, &o2, &l2, d.opt);
        CHECK(st == ATTN_OK, "%s: per-sequence forward %s", what, attn_status_string(st));
        CHECK(!memcmp(o1.data, o2.data, nbytes(&o1)) && !memcmp(l1.data, l2.data, nbytes(&l1)),
              "%s: varlen O/LSE differ from the per-sequence calls", what);
        reference64(&d, ro, rl, d.cu_q);
        CHECK(o_within(&o1, ro, &r), "%s: O rel %.3g max %.3g against the float64 reference", what,
              r.rel_err, r.max_err);
        CHECK(lse_within(&d, &l1, rl, &r), "%s: LSE error %.3g (%.3g of the bound)", what,
              r.max_err, r.rel_err);
        attn_tensor o3 = like(&d.q, c->dt, c->Dv, 0x7f), o4 = like(&d.q, c->dt, c->Dv, 0x7f);
        attn_options ro_opt = d.opt;
        ro_opt.path = ATTN_PATH_REFERENCE;
        st = attn_varlen_forward(&d.q, &d.k, &d.v, &o3, &d.tcq, &d.tck, d.maxq, d.maxk, &ro_opt);
        CHECK(st == ATTN_OK, "%s: varlen reference %s (%s)", what, attn_status_string(st), attn_last_error());
        st = per_seq_forward(&d, d.cu_q, d.cu_k, &d.q, &d.k, &d.v, &o4, &l2, ro_opt);
        CHECK(!memcmp(o3.data, o4.data, nbytes(&o3)), "%s: varlen reference differs from the "
              "per-sequence reference calls", what);
        free(o3.data), free(o4.data);
        if (plant) {  // 5: a boundary off by one is seen by both checks
            int64_t cu[MAXB + 1];
            memcpy(cu, d.cu_q, sizeof cu);
            int s = 1;
            while (s < c->B && !(cu[s] > cu[s - 1] && cu[s] < cu[s + 1])) s++;
            cu[s] += 1;
            memset(o2.data, 0x7f, nbytes(&o2)), memset(l2.data, 0x7f, nbytes(&l2));
            per_seq_forward(&d, cu, d.cu_k, &d.q, &d.k, &d.v, &o2, &l2, d.opt);
            CHECK(memcmp(o1.data, o2.data, nbytes(&o1)) != 0, "planted: a boundary off by one "
                  "passes the bit-for-bit comparison");
            CHECK(!o_within(&o2, ro, &r), "planted: a boundary off by one passes the tolerance "
                  "(rel %.3g)", r.rel_err);
        }
    } else {
        /* dropout: the padded call's mask at b = s */
        attn_tensor o3 = like(&d.q, c->dt, c->Dv, 0x7f), o4 = like(&d.q, ATTN_F32, c->Dv, 0x7f);
        attn_options ro_opt = d.opt;
        ro_opt.path = ATTN_PATH_REFERENCE;
        st = attn_varlen_forward(&d.q, &d.k, &d.v, &o3, &d.tcq, &d.tck, d.maxq, d.maxk, &ro_opt);
        CHECK(st == ATTN_OK, "%s: varlen reference %s (%s)", what, attn_status_string(st), attn_last_error());
        attn_tensor o5 = like(&d.q, c->dt, c->Dv, 0x7f);
        padded_call(&d, &o5, NULL, false, NULL, NULL, NULL, ATTN_PATH_REFERENCE);
        CHECK(!memcmp(o3.data, o5.data, nbytes(&o3)), "%s: varlen reference with dropout differs "
              "from the padded reference call at b = s", what);
        padded_call(&d, &o4, NULL, false, NULL, NULL, NULL, ATTN_PATH_REFERENCE);
        double *pref = gather_dbl(&o4);
        CHECK(o_within(&o1, pref, &r), "%s: fused O rel %.3g off the padded reference", what, r.rel_err);
        /* a per-sequence call draws its own mask: not this one */
        st = per_seq_forward(&d, d.cu_q, d.cu_k, &d.q, &d.k, &d.v, &o2, &l2, d.opt);
        CHECK(!o_within(&o2, pref, &r), "%s: the per-sequence masks pass too (the check is blind)", what);
        free(pref), free(o3.data), free(o4.data), free(o5.data);
    }
    free(ro), free(rl), free(o1.data), free(o2.data), free(l1.data), free(l2.data);
    vfree(&d);
}

/* ---- 3: the backward ---------------------------------------------------------------------- */

static void backward_case(const vcase *c) {
    char what[200];
    describe(c, what, sizeof what);
    vdata d;
    vmake(c, &d);
    attn_tensor o = like(&d.q, c->dt, c->Dv, 0), l = like(&d.q, ATTN_F32, 1, 0);
    attn_options fo = d.opt;
    fo.lse = &l;
    attn_status st = attn_varlen_forward(&d.q, &d.k, &d.v, &o, &d.tcq, &d.tck, d.maxq, d.maxk, &fo);
    CHECK(st == ATTN_OK, "%s: forward %s (%s)", what, attn_status_string(st), attn_last_error());
    attn_tensor g1[3], g2[3];
    for (int t = 0; t < 3; t++) {
        const attn_tensor *shape = t == 0 ? &d.q : &d.k;
        const int64_t D = t == 2 ? c->Dv : c->Dk;
        g1[t] = like(shape, c->dt, D, 0x7f), g2[t] = like(shape, c->dt, D, 0x7f);
    }
    float ds1[16], ds2[16], acc[16] = {0};
    attn_tensor tds1 = attn_tensor_4d(ds1, ATTN_F32, c->Hq, 1, 1, 1), tds2 = attn_tensor_4d(ds2, ATTN_F32, c->Hq, 1, 1, 1);
    attn_options bo = d.opt;
    bo.d_sinks = c->sinks ? &tds1 : NULL;
    st = attn_varlen_backward(&d.q, &d.k, &d.v, &o, &d.d_o, &l, &g1[0], &g1[1], &g1[2], &d.tcq, &d.tck,
                              d.maxq, d.maxk, &bo);
    CHECK(st == ATTN_OK, "%s: varlen backward %s (%s)", what, attn_status_string(st), attn_last_error());
    if (c->dropout == 0.0f) {
        for (int s = 0; s < c->B; s++) {  // each sequence's own backward
            const int64_t q0 = d.cu_q[s], k0 = d.cu_k[s], lq = c->lq[s], lk = c->lk[s];
            attn_tensor qs = slice(&d.q, q0, lq), ks = slice(&d.k, k0, lk), vs = slice(&d.v, k0, lk);
            attn_tensor os = slice(&o, q0, lq), dos = slice(&d.d_o, q0, lq), ls = slice(&l, q0, lq);
            attn_tensor a = slice(&g2[0], q0, lq), b = slice(&g2[1], k0, lk), e = slice(&g2[2], k0, lk);
            attn_options so = d.opt;
            so.d_sinks = c->sinks ? &tds2 : NULL;
            if (lq == 0 && lk == 0) continue;
            for (int64_t h = 0; h < c->Hq; h++) ds2[h] = 0.0f;
            st = attn_backward(&qs, &ks, &vs, &os, &dos, &ls, &a, &b, &e, &so);
            CHECK(st == ATTN_OK, "%s: sequence %d backward %s", what, s, attn_status_string(st));
            for (int64_t h = 0; c->sinks && h < c->Hq; h++) acc[h] += ds2[h];
        }
        for (int t = 0; t < 3; t++)
            CHECK(!memcmp(g1[t].data, g2[t].data, nbytes(&g1[t])), "%s: varlen %s differs from "
                  "the per-sequence backward", what, k_grad[t]);
        if (c->sinks)
            CHECK(!memcmp(ds1, acc, (size_t)c->Hq * 4), "%s: d_sinks is not the in-order sum", what);
    } else {  // the reference bit for bit the padded call's, the fused path close to it
        attn_tensor r1[3], r2[3];
        for (int t = 0; t < 3; t++) {
            const attn_tensor *shape = t == 0 ? &d.q : &d.k;
            const int64_t D = t == 2 ? c->Dv : c->Dk;
            r1[t] = like(shape, c->dt, D, 0), r2[t] = like(shape, c->dt, D, 0);
        }
        attn_options ro = d.opt;
        ro.path = ATTN_PATH_REFERENCE;
        st = attn_varlen_backward(&d.q, &d.k, &d.v, &o, &d.d_o, &l, &r1[0], &r1[1], &r1[2], &d.tcq,
                                  &d.tck, d.maxq, d.maxk, &ro);
        CHECK(st == ATTN_OK, "%s: varlen reference backward %s (%s)", what, attn_status_string(st), attn_last_error());
        attn_tensor po = like(&d.q, ATTN_F32, c->Dv, 0);
        padded_call(&d, &po, NULL, true, &r2[0], &r2[1], &r2[2], ATTN_PATH_REFERENCE);
        for (int t = 0; t < 3; t++) {
            const double e = rel_err(&r1[t], &r2[t]);
            CHECK(e < 1e-5, "%s: varlen reference %s off the padded reference by %.3g", what, k_grad[t], e);
            /* the fused gradients against the varlen reference's (the same mask, shown
             * above to be the padded call's): the contract's float32 rule; in a 16-bit
             * dtype each side rounded once to it (eps |ref| each) on top of that rule */
            CHECK(grad_within(&g1[t], &r1[t]), "%s: fused %s outside the tolerance of the reference",
                  what, k_grad[t]);
            free(r1[t].data), free(r2[t].data);
        }
        free(po.data);
    }
    for (int threads = 1; threads <= 3; threads++) {  // the same bits for any thread count
        attn_tensor g3[3];
        for (int t = 0; t < 3; t++) g3[t] = like(&g1[t], c->dt, g1[t].shape[3], 0);
        attn_options to = bo;
        to.threads = threads, to.d_sinks = c->sinks ? &tds2 : NULL;
        size_t ws = 0;  // thread 2 with the caller's workspace, of the queried size
        if (threads == 2) {
            st = attn_varlen_backward_workspace_size(&d.q, &d.k, &d.v, &o, &d.d_o, &l, &g3[0], &g3[1],
                                                     &g3[2], &d.tcq, &d.tck, d.maxq, d.maxk, &to, &ws);
            CHECK(st == ATTN_OK, "%s: backward workspace query %s", what, attn_status_string(st));
            to.workspace = xcalloc((int64_t)ws, 1), to.workspace_bytes = ws;
        }
        st = attn_varlen_backward(&d.q, &d.k, &d.v, &o, &d.d_o, &l, &g3[0], &g3[1], &g3[2], &d.tcq,
                                  &d.tck, d.maxq, d.maxk, &to);
        int same = st == ATTN_OK && (!c->sinks || !memcmp(ds1, ds2, (size_t)c->Hq * 4));
        for (int t = 0; t < 3; t++) {
            double *a = gather_dbl(&g1[t]), *b = gather_dbl(&g3[t]);
            same &= !memcmp(a, b, (size_t)nelem(&g1[t]) * 8);
            free(a), free(b), free(g3[t].data);
        }
        CHECK(same, "%s: backward with %d threads differs", what, threads);
        free(to.workspace);
    }
    for (int t = 0; t < 3; t++) free(g1[t].data), free(g2[t].data);
    free(o.data), free(l.data);
    vfree(&d);
}

/* q8_0 k and v (forward only): bit for bit the per-sequence calls, and a backward refused */
static void test_q8_0(void) {
    vcase c = {.B = 4, .lq = {3, 40, 0, 17}, .lk = {33, 1, 5, 70}, .Hq = 4, .Hkv = 2, .Dk = 32,
               .Dv = 64, .dt = ATTN_F32, .fa = true, .causal = true, .align = ATTN_ALIGN_BOTTOM_RIGHT,
               .sinks = true, .seed = 50};
    vdata d;
    vmake(&c, &d);
    attn_tensor kq = packed(xcalloc(c.Hkv * d.tk * c.Dk / 32, 34), ATTN_Q8_0, c.Hkv, d.tk, c.Dk, true);
    attn_tensor vq = packed(xcalloc(c.Hkv * d.tk * c.Dv / 32, 34), ATTN_Q8_0, c.Hkv, d.tk, c.Dv, true);
    CHECK(attn_quantize_q8_0(&d.k, &kq) == ATTN_OK && attn_quantize_q8_0(&d.v, &vq) == ATTN_OK,
          "q8_0: quantize: %s", attn_last_error());
    attn_tensor o1 = like(&d.q, ATTN_F32, c.Dv, 0x7f), o2 = like(&d.q, ATTN_F32, c.Dv, 0x7f);
    attn_tensor l1 = like(&d.q, ATTN_F32, 1, 0x7f), l2 = like(&d.q, ATTN_F32, 1, 0x7f);
    attn_options opt = d.opt;
    opt.lse = &l1;
    attn_status st = attn_varlen_forward(&d.q, &kq, &vq, &o1, &d.tcq, &d.tck, d.maxq, d.maxk, &opt);
    CHECK(st == ATTN_OK, "q8_0 varlen forward: %s (%s)", attn_status_string(st), attn_last_error());
    st = per_seq_forward(&d, d.cu_q, d.cu_k, &d.q, &kq, &vq, &o2, &l2, d.opt);
    CHECK(st == ATTN_OK, "q8_0 per-sequence forward: %s", attn_status_string(st));
    CHECK(!memcmp(o1.data, o2.data, nbytes(&o1)) && !memcmp(l1.data, l2.data, nbytes(&l1)),
          "q8_0: varlen O/LSE differ from the per-sequence calls");
    attn_tensor g[3] = {like(&d.q, ATTN_F32, c.Dk, 0), like(&d.k, ATTN_F32, c.Dk, 0), like(&d.k, ATTN_F32, c.Dv, 0)};
    st = attn_varlen_backward(&d.q, &kq, &vq, &o1, &d.d_o, &l1, &g[0], &g[1], &g[2], &d.tcq, &d.tck,
                              d.maxq, d.maxk, &d.opt);
    CHECK(st == ATTN_ERR_DTYPE, "q8_0 varlen backward: %s, expected the dtype refusal",
          attn_status_string(st));
    for (int x = 0; x < 3; x++) free(g[x].data);
    free(kq.data), free(vq.data), free(o1.data), free(o2.data), free(l1.data), free(l2.data);
    vfree(&d);
}

/* ---- 4: refusals ------------------------------------------------------------------------ */

static void test_refusals(void) {
    vcase c = {3, {5, 0, 17}, {9, 4, 17}, 4, 2, 16, 16, ATTN_F32, true, .seed = 90};
    vdata d;
    vmake(&c, &d);
    attn_tensor o = like(&d.q, ATTN_F32, c.Dv, 0x7f);
    void *keep = xcalloc(1, nbytes(&o));
    memcpy(keep, o.data, nbytes(&o));
    int64_t bad[MAXB + 1];
    attn_tensor tb = attn_tensor_4d(bad, ATTN_I64, c.B + 1, 1, 1, 1);
    uint8_t mask[4] = {1, 1, 1, 1};
    float bias[4] = {0};
    int32_t kvl[3] = {1, 1, 1}, bt[3] = {0, 0, 0};
    attn_tensor tm = attn_tensor_4d(mask, ATTN_BOOL, 1, 1, 1, 1), tbias = attn_tensor_4d(bias, ATTN_F32, 1, 1, 1, 1);
    attn_tensor tkv = attn_tensor_4d(kvl, ATTN_I32, 1, 1, 1, 1), tbt = attn_tensor_4d(bt, ATTN_I32, 1, 1, 1, 1);
    attn_tensor tw = attn_tensor_4d(xcalloc(4 * 22 * 30, 4), ATTN_F32, 1, 4, 22, 30);
    attn_tensor tf = attn_tensor_4d((float[4]){0, 5, 5, 22}, ATTN_F32, 4, 1, 1, 1);
    attn_tensor short_cu = attn_tensor_4d(d.cu_k, ATTN_I64, c.B, 1, 1, 1);
    struct {
        const char *what;
        int edit;  // which cu_seqlens_q entries to break (bad[] replaces it)
        int64_t vals[4];
        int64_t maxq;
        const attn_tensor *cu_q, *cu_k;
        attn_status want;
        int opt;  // 1 mask, 2 bias, 3 kv_len, 4 block_table, 5 weights
    } t[] = {
        {"not monotone", 1, {0, 10, 5, 22}, 17, &tb, &d.tck, ATTN_ERR_VALUE, 0},
        {"first != 0", 1, {1, 5, 5, 22}, 17, &tb, &d.tck, ATTN_ERR_VALUE, 0},
        {"last != total", 1, {0, 5, 5, 21}, 17, &tb, &d.tck, ATTN_ERR_VALUE, 0},
        {"last > total", 1, {0, 5, 5, 23}, 18, &tb, &d.tck, ATTN_ERR_VALUE, 0},
        {"max_seqlen too small", 0, {0}, 16, &d.tcq, &d.tck, ATTN_ERR_VALUE, 0},
        {"max_seqlen negative", 0, {0}, -1, &d.tcq, &d.tck, ATTN_ERR_VALUE, 0},
        {"float cu_seqlens", 0, {0}, 17, &tf, &d.tck, ATTN_ERR_DTYPE, 0},
        {"B + 1 disagrees", 0, {0}, 17, &d.tcq, &short_cu, ATTN_ERR_SHAPE, 0},
        {"NULL cu_seqlens", 0, {0}, 17, NULL, &d.tck, ATTN_ERR_NULL, 0},
        {"mask", 0, {0}, 17, &d.tcq, &d.tck, ATTN_ERR_UNSUPPORTED, 1},
        {"bias", 0, {0}, 17, &d.tcq, &d.tck, ATTN_ERR_UNSUPPORTED, 2},
        {"kv_len", 0, {0}, 17, &d.tcq, &d.tck, ATTN_ERR_UNSUPPORTED, 3},
        /* a paged packed call takes its key counts in kv_len, not cu_seqlens_k
         * (test_varlen_paged.c) */
        {"block_table with cu_seqlens_k", 0, {0}, 17, &d.tcq, &d.tck, ATTN_ERR_VALUE, 4},
        {"weights", 0, {0}, 17, &d.tcq, &d.tck, ATTN_ERR_UNSUPPORTED, 5},
    };
    for (size_t x = 0; x < sizeof t / sizeof t[0]; x++) {
        if (t[x].edit) memcpy(bad, t[x].vals, sizeof(int64_t) * 4);
        attn_options opt = d.opt;
        if (t[x].opt == 1) opt.mask = &tm;
        if (t[x].opt == 2) opt.bias = &tbias;
        if (t[x].opt == 3) opt.kv_len = &tkv;
        if (t[x].opt == 4) opt.block_table = &tbt;
        if (t[x].opt == 5) opt.weights = &tw;
        const attn_status st = attn_varlen_forward(&d.q, &d.k, &d.v, &o, t[x].cu_q, t[x].cu_k,
                                                   t[x].maxq, d.maxk, &opt);
        CHECK(st == t[x].want, "refusal '%s': status %s, expected %s", t[x].what,
              attn_status_string(st), attn_status_string(t[x].want));
        CHECK(attn_last_error()[0] != '\0', "refusal '%s': no detail", t[x].what);
        CHECK(!memcmp(keep, o.data, nbytes(&o)), "refusal '%s': o was written", t[x].what);
        /* the backward refuses the same */
        attn_tensor g[3] = {like(&d.q, ATTN_F32, c.Dk, 0x7f), like(&d.k, ATTN_F32, c.Dk, 0x7f),
                            like(&d.k, ATTN_F32, c.Dv, 0x7f)};
        attn_tensor l = like(&d.q, ATTN_F32, 1, 0);
        opt.weights = NULL;
        const attn_status sb = attn_varlen_backward(&d.q, &d.k, &d.v, &o, &d.d_o, &l, &g[0], &g[1],
                                                    &g[2], t[x].cu_q, t[x].cu_k, t[x].maxq, d.maxk, &opt);
        /* the backward takes no paged cache at all: UNSUPPORTED */
        const attn_status want_b = t[x].opt == 4 ? ATTN_ERR_UNSUPPORTED : t[x].want;
        if (t[x].opt != 5)
            CHECK(sb == want_b, "backward refusal '%s': status %s", t[x].what, attn_status_string(sb));
        int untouched = 1;
        for (int y = 0; y < 3; y++) {
            for (size_t z = 0; z < nbytes(&g[y]); z++) untouched &= ((unsigned char *)g[y].data)[z] == 0x7f;
            free(g[y].data);
        }
        if (t[x].opt != 5) CHECK(untouched, "backward refusal '%s': a gradient was written", t[x].what);
        free(l.data);
    }
    /* B = 0: nothing to do, OK */
    int64_t zero = 0;
    attn_tensor tz = attn_tensor_4d(&zero, ATTN_I64, 1, 1, 1, 1);
    attn_tensor q0 = packed(NULL, ATTN_F32, 4, 0, 16, false), k0 = packed(NULL, ATTN_F32, 2, 0, 16, false);
    attn_tensor v0 = packed(NULL, ATTN_F32, 2, 0, 16, false), o0 = packed(NULL, ATTN_F32, 4, 0, 16, false);
    CHECK(attn_varlen_forward(&q0, &k0, &v0, &o0, &tz, &tz, 0, 0, NULL) == ATTN_OK, "B = 0: %s",
          attn_last_error());
    free(tw.data), free(keep), free(o.data);
    vfree(&d);
}

int main(void) {
    const vcase base = {.B = 6, .lq = {1, 0, 16, 64, 300, 5}, .lk = {1, 7, 64, 16, 290, 0}, .Hq = 4,
                        .Hkv = 2, .Dk = 32, .Dv = 32, .dt = ATTN_F32};
    vcase cases[24];
    int n = 0;
    cases[n] = base, cases[n].seed = 1, n++;
    cases[n] = base, cases[n].fa = true, cases[n].causal = true, cases[n].seed = 2, n++;
    cases[n] = base, cases[n].fa = true, cases[n].causal = true, cases[n].align = ATTN_ALIGN_BOTTOM_RIGHT,
    cases[n].i64 = true, cases[n].seed = 3, n++;
    cases[n] = base, cases[n].window = true, cases[n].wl = 20, cases[n].wr = 3, cases[n].alibi = true,
    cases[n].seed = 4, n++;
    cases[n] = base, cases[n].fa = true, cases[n].softcap = 5.0f, cases[n].sinks = true, cases[n].causal = true,
    cases[n].align = ATTN_ALIGN_BOTTOM_RIGHT, cases[n].seed = 5, n++;
    cases[n] = base, cases[n].Hkv = 4, cases[n].Dv = 24, cases[n].sinks = true, cases[n].alibi = true, cases[n].seed = 6, n++;
    cases[n] = base, cases[n].dt = ATTN_BF16, cases[n].fa = true, cases[n].causal = true, cases[n].sinks = true,
    cases[n].seed = 7, n++;
    cases[n] = base, cases[n].dt = ATTN_F16, cases[n].causal = true, cases[n].align = ATTN_ALIGN_BOTTOM_RIGHT,
    cases[n].seed = 8, n++;
    cases[n] = base, cases[n].dt = ATTN_F64, cases[n].fa = true, cases[n].causal = true, cases[n].sinks = true,
    cases[n].seed = 9, n++;
    cases[n] = base, cases[n].Hkv = 1, cases[n].dropout = 0.2f, cases[n].seed = 10, n++;
    cases[n] = base, cases[n].fa = true, cases[n].dropout = 0.3f, cases[n].causal = true, cases[n].window = true,
    cases[n].wl = 30, cases[n].wr = -1, cases[n].alibi = true, cases[n].sinks = true, cases[n].seed = 11, n++;
    cases[n] = base, cases[n].dt = ATTN_BF16, cases[n].dropout = 0.25f, cases[n].seed = 12, n++;
    /* every case here; one in ATTN_TEST_EVERY under emulation (scripts/check.sh's AArch64
     * run), the planted case always */
    for (int x = 0; x < n; x++)
        if (x == 0 || !test_case_skipped()) forward_case(&cases[x], x == 0);
    for (int x = 0; x < n; x++)
        if (!test_case_skipped()) backward_case(&cases[x]);
    test_q8_0();
    test_refusals();
    return check_summary("test_varlen");
}
