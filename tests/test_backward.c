/*
 * test_backward.c — attn_backward: the float64 reference against finite differences,
 *                   the fused path against the reference, and the backward's promises.
 *
 * What it covers:
 *  1. The reference's float64 gradients (attn_ref64_backward) against central finite
 *     differences of its float64 forward (attn_ref64_forward), on small shapes with every
 *     feature: scale, softcap, bool mask, bias with -inf, causal under both alignments
 *     with Lq < Lk and Lq > Lk, windows, kv_len (0 included), ALiBi, GQA, Dk != Dv.
 *     Relative Frobenius error under 1e-6 per gradient.
 *  2. The fused path (float32) against the reference's float64 gradients over a matrix of
 *     sizes (L up to 300 around the tiles), head widths, GQA 1/2/4, every mask alone and
 *     combined, windows, kv_len, ALiBi, softcap, the [B, L, H, D] layout and K/V views of
 *     a larger NaN-filled cache: the contract's float32 tolerance (check.h). The public
 *     reference path must equal the float64 gradients rounded, bit for bit.
 *  3. Fully masked rows contribute exactly 0 (even with NaN in their dO); NaN stored in
 *     structurally masked K/V rows reaches no gradient.
 *  4. Bit-identical gradients for 1, 2 and 3 threads and on repeated runs.
 *  5. Every misuse returns its status and writes nothing.
 *  6. Every tolerance check rejects a planted error.
 * What it is not: a test of the forward (test_forward.c), or of the micro-kernels alone
 * (test_kernels.c). The kernel is chosen by ATTN_ISA, as for the forward suites.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "backward.h"
#include "check.h"
#include "rng.h"
#include "views.h"

/* ---- small tools ---------------------------------------------------------------------- */


static void *xcalloc(int64_t n, size_t size) {
    void *p = calloc((size_t)(n > 0 ? n : 1), size);
    if (!p) {
        fprintf(stderr, "test_backward: out of memory\n");
        exit(2);
    }
    return p;
}

#define SENTINEL_BITS 0x7fa5a5a5u
static void fill_sentinel(float *p, int64_t n) {
    const uint32_t s = SENTINEL_BITS;
    for (int64_t i = 0; i < n; i++) memcpy(p + i, &s, 4);
}
static int64_t count_written(const float *p, int64_t n) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, p + i, 4);
        c += u != SENTINEL_BITS;
    }
    return c;
}

/* ‖got - ref‖ / ‖ref‖ (or ‖got - ref‖ when ref = 0) */
static double rel_frob(const double *got, const double *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += (got[i] - ref[i]) * (got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The backward's float32 tolerance, per gradient (docs/TRAINING.md, "Precision"):
 * the contract's (within_f32_tol: relative Frobenius error <= 1e-6, max error
 * <= 1e-5 (1 + max|ref|)) — except for a gradient that is a near-total cancellation.
 * mag is the same gradient computed over absolute values (|dS| = P (|dP| + |D|), |K|,
 * |Q|, |dO|): float32 sums have an error of about u·Σ|terms| (u = 6e-8), not u·|Σ terms|.
 * When ‖mag‖ >= 100 ‖ref‖ (the exact gradient is under 1% of its terms' size: exactly 0
 * when every row reads one key, as P = 1 makes dP - D vanish), the check is instead
 * ‖got - ref‖ <= 2.5e-7 ‖mag‖ and max error <= 1e-5 (1 + max|mag|). Measured: at most
 * 1.0e-7 ‖mag‖ on those, 2.6e-7 ‖mag‖ on every case. Sets *cancel when that branch ran. */
static int grad_within_tol(const float *got, const double *ref, const double *mag, int64_t n,
                           tol_result *r, int *cancel) {
    *cancel = 0;
    if (within_f32_tol(got, ref, n, r)) return 1;
    if (!mag) return 0;
    double num = 0, den = 0, dm = 0, max_mag = 0;
    for (int64_t e = 0; e < n; e++) {
        if (!isfinite(got[e]) || !isfinite(ref[e])) return 0;
        num += ((double)got[e] - ref[e]) * ((double)got[e] - ref[e]);
        den += ref[e] * ref[e];
        dm += mag[e] * mag[e];
        if (mag[e] > max_mag) max_mag = mag[e];
    }
    if (!(dm >= 1e4 * den)) return 0;  // not a cancellation: the contract's verdict stands
    *cancel = 1;
    return sqrt(num) <= 2.5e-7 * sqrt(dm) && r->max_err <= 1e-5 * (1.0 + max_mag);
}

/* worst errors seen, reported at the end */
static double g_fd_worst[3], g_fused_worst[3], g_fused_maxerr_rel[3], g_mag_worst[3], g_cancel_worst[3];
static int g_cancel_cases;
static const char *const k_grad[3] = {"dq", "dk", "dv"};

/* ---- a case: shapes, layout and options ----------------------------------------------- */

typedef struct bcase {
    int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
    int layout;        // 0: stored [B, H, L, D]; 1: stored [B, L, H, D]
    int cache;         // k, v (and dk, dv) are views into larger buffers (NaN / sentinel)
    int mask;          // bit 1: bool mask, bit 2: float bias
    int mshape;        // bits 1, 2, 4: mask dims B, Hq, Lq are full (else 1)
    double mask_true;  // P(attend) in the bool mask (0 = 0.8)
    double bias_ninf;  // P(-inf) in the bias
    int empty_rows;    // the bool mask masks every key of rows i % 5 == 2
    int causal, align, window;
    int64_t wl, wr;
    int kvlen;         // 0: none; 1: int32; 2: int64
    int64_t kvlen_fixed;  // >= 0: every batch; < 0: drawn, with one batch at 0 when B > 1
    int alibi;
    float softcap;
    int has_scale;
    float scale;
    double amp;        // inputs drawn from U(-amp, amp) (0 = 1)
    uint64_t seed;
} bcase;

static uint64_t g_seed = 1;
static bcase base(int64_t B, int64_t Hq, int64_t Hkv, int64_t Lq, int64_t Lk, int64_t Dk,
                  int64_t Dv) {
    bcase c;
    memset(&c, 0, sizeof c);
    c.B = B; c.Hq = Hq; c.Hkv = Hkv; c.Lq = Lq; c.Lk = Lk; c.Dk = Dk; c.Dv = Dv;
    c.kvlen_fixed = -1;
    c.seed = g_seed++;
    return c;
}

static void describe(const bcase *c, char *out, size_t n) {
    snprintf(out, n,
             "B=%lld Hq=%lld Hkv=%lld Lq=%lld Lk=%lld Dk=%lld Dv=%lld layout=%d cache=%d "
             "mask=%d mshape=%d empty=%d causal=%d align=%d window=%d(%lld,%lld) kvlen=%d(%lld) "
             "alibi=%d softcap=%g scale=%s%g seed=%llu",
             (long long)c->B, (long long)c->Hq, (long long)c->Hkv, (long long)c->Lq,
             (long long)c->Lk, (long long)c->Dk, (long long)c->Dv, c->layout, c->cache, c->mask,
             c->mshape, c->empty_rows, c->causal, c->align, c->window, (long long)c->wl,
             (long long)c->wr, c->kvlen, (long long)c->kvlen_fixed, c->alibi,
             (double)c->softcap, c->has_scale ? "" : "default/", (double)c->scale,
             (unsigned long long)c->seed);
}

/* The options' own tensors (mask, bias, kv_len, ALiBi), dense. */
typedef struct opt_store {
    uint8_t *mask;
    float *bias, *slopes;
    int64_t *kvl64;
    int32_t *kvl32;
    attn_tensor tmask, tbias, tkvlen, talibi;
} opt_store;

static void build_options(const bcase *c, rng_t *r, opt_store *s, attn_options *opt) {
    memset(s, 0, sizeof *s);
    memset(opt, 0, sizeof *opt);
    const int64_t mB = (c->mshape & 1) ? c->B : 1, mH = (c->mshape & 2) ? c->Hq : 1;
    const int64_t mL = (c->mshape & 4) ? c->Lq : 1, n = mB * mH * mL * c->Lk;
    if (c->mask & 1) {
        const double pt = c->mask_true > 0 ? c->mask_true : 0.8;
        s->mask = xcalloc(n, 1);
        for (int64_t e = 0; e < n; e++) s->mask[e] = rng_unif(r) < pt;
        if (c->empty_rows && mL > 1)
            for (int64_t bh = 0; bh < mB * mH; bh++)
                for (int64_t i = 2; i < mL; i += 5) memset(s->mask + (bh * mL + i) * c->Lk, 0, (size_t)c->Lk);
        s->tmask = attn_tensor_4d(s->mask, ATTN_BOOL, mB, mH, mL, c->Lk);
        opt->mask = &s->tmask;
    }
    if (c->mask & 2) {
        s->bias = xcalloc(n, sizeof(float));
        for (int64_t e = 0; e < n; e++)
            s->bias[e] = rng_unif(r) < c->bias_ninf ? -INFINITY : (float)rng_sym(r);
        s->tbias = attn_tensor_4d(s->bias, ATTN_F32, mB, mH, mL, c->Lk);
        opt->bias = &s->tbias;
    }
    if (c->kvlen) {
        s->kvl64 = xcalloc(c->B, sizeof(int64_t));
        s->kvl32 = xcalloc(c->B, sizeof(int32_t));
        for (int64_t b = 0; b < c->B; b++) {
            int64_t len = c->kvlen_fixed >= 0 ? c->kvlen_fixed
                                              : (int64_t)(rng_next(r) % (uint64_t)(c->Lk + 1));
            if (c->kvlen_fixed < 0 && c->B > 1 && b == c->B - 1) len = 0;
            s->kvl64[b] = len;
            s->kvl32[b] = (int32_t)len;
        }
        s->tkvlen = attn_tensor_4d(c->kvlen == 1 ? (void *)s->kvl32 : (void *)s->kvl64,
                                   c->kvlen == 1 ? ATTN_I32 : ATTN_I64, c->B, 1, 1, 1);
        opt->kv_len = &s->tkvlen;
    }
    if (c->alibi) {
        s->slopes = xcalloc(c->Hq, sizeof(float));
        for (int64_t h = 0; h < c->Hq; h++) s->slopes[h] = (float)(0.5 / (double)(h + 1));
        s->talibi = attn_tensor_4d(s->slopes, ATTN_F32, c->Hq, 1, 1, 1);
        opt->alibi_slopes = &s->talibi;
    }
    opt->causal = c->causal;
    opt->align = c->align ? ATTN_ALIGN_BOTTOM_RIGHT : ATTN_ALIGN_TOP_LEFT;
    opt->has_window = c->window;
    opt->window_left = c->wl;
    opt->window_right = c->wr;
    opt->softcap = c->softcap;
    opt->has_scale = c->has_scale;
    opt->scale = c->scale;
}

static void free_options(opt_store *s) {
    free(s->mask); free(s->bias); free(s->slopes); free(s->kvl64); free(s->kvl32);
}

/* ---- 1. the reference against finite differences ----------------------------------- */

/* L = Σ dO ∘ O of the float64 forward */
static double fd_loss(const attn_params *p, const double *q, const double *k, const double *v,
                      const double *d_o, double *o, int64_t no) {
    attn_ref64_forward(p, q, k, v, o, NULL);
    double l = 0;
    for (int64_t e = 0; e < no; e++) l += d_o[e] * o[e];
    return l;
}

/* central differences of fd_loss with respect to x[0..n) */
static void fd_grad(const attn_params *p, double *q, double *k, double *v, const double *d_o,
                    double *o, int64_t no, double *x, int64_t n, double *g) {
    for (int64_t e = 0; e < n; e++) {
        const double x0 = x[e], h = 1e-5;
        x[e] = x0 + h;
        const double lp = fd_loss(p, q, k, v, d_o, o, no);
        x[e] = x0 - h;
        const double lm = fd_loss(p, q, k, v, d_o, o, no);
        x[e] = x0;
        g[e] = (lp - lm) / (2 * h);
    }
}

/* the FD comparison: relative Frobenius error under 1e-6 */
static int fd_accepts(const double *got, const double *fd, int64_t n, double *err) {
    *err = rel_frob(got, fd, n);
    return *err < 1e-6;
}

static void fd_case(const bcase *c) {
    char desc[512];
    describe(c, desc, sizeof desc);
    rng_t r = {c->seed * 0x9e3779b97f4a7c15ULL + 7};
    opt_store s;
    attn_options opt;
    build_options(c, &r, &s, &opt);
    opt.threads = 1;
    opt.path = ATTN_PATH_REFERENCE;

    const int64_t nq = c->B * c->Hq * c->Lq * c->Dk, nk = c->B * c->Hkv * c->Lk * c->Dk;
    const int64_t nv = c->B * c->Hkv * c->Lk * c->Dv, no = c->B * c->Hq * c->Lq * c->Dv;
    attn_tensor tq = attn_tensor_4d(NULL, ATTN_F32, c->B, c->Hq, c->Lq, c->Dk);
    attn_tensor tk = attn_tensor_4d(NULL, ATTN_F32, c->B, c->Hkv, c->Lk, c->Dk);
    attn_tensor tv = attn_tensor_4d(NULL, ATTN_F32, c->B, c->Hkv, c->Lk, c->Dv);
    attn_tensor to = attn_tensor_4d(NULL, ATTN_F32, c->B, c->Hq, c->Lq, c->Dv);
    attn_params p;
    attn_status st = attn_params_init(&p, &tq, &tk, &tv, &to, &opt, false);
    CHECK(st == ATTN_OK, "fd: params: %s [%s]", attn_last_error(), desc);
    if (st != ATTN_OK) {
        free_options(&s);
        return;
    }
    const double amp = c->amp > 0 ? c->amp : 1.0;
    double *x[3], *grad[3], *fd[3], *d_o = xcalloc(no, sizeof(double)), *o = xcalloc(no, sizeof(double));
    const int64_t n[3] = {nq, nk, nv};
    for (int a = 0; a < 3; a++) {
        x[a] = xcalloc(n[a], sizeof(double));
        grad[a] = xcalloc(n[a], sizeof(double));
        fd[a] = xcalloc(n[a], sizeof(double));
        for (int64_t e = 0; e < n[a]; e++) x[a][e] = amp * rng_sym(&r);
    }
    for (int64_t e = 0; e < no; e++) d_o[e] = rng_sym(&r);

    st = attn_ref64_backward(&p, x[0], x[1], x[2], d_o, grad[0], grad[1], grad[2], false);
    CHECK(st == ATTN_OK, "fd: backward status %d [%s]", (int)st, desc);
    for (int a = 0; a < 3; a++) {
        fd_grad(&p, x[0], x[1], x[2], d_o, o, no, x[a], n[a], fd[a]);
        double err;
        const int ok = fd_accepts(grad[a], fd[a], n[a], &err);
        CHECK(ok, "fd: %s relative error %.3g >= 1e-6 [%s]", k_grad[a], err, desc);
        if (err > g_fd_worst[a]) g_fd_worst[a] = err;
    }
    for (int a = 0; a < 3; a++) {
        free(x[a]); free(grad[a]); free(fd[a]);
    }
    free(d_o); free(o);
    free_options(&s);
}

static void finite_differences(void) {
    /* shapes: Lq < Lk and Lq > Lk, GQA 1 and 2 and 4, Dk != Dv */
    static const int64_t shapes[][7] = {
        {1, 1, 1, 4, 6, 3, 2}, {2, 2, 1, 6, 4, 2, 3}, {1, 4, 1, 3, 5, 4, 4}, {2, 2, 2, 5, 5, 1, 3},
    };
    for (int f = 0; f < 21; f++)
        for (int si = 0; si < 4; si++) {
            if ((f + si) % 2 && f > 2) continue;  // half of the pairs beyond the first features
            const int64_t *sh = shapes[si];
            bcase c = base(sh[0], sh[1], sh[2], sh[3], sh[4], sh[5], sh[6]);
            switch (f) {
            case 0: break;
            case 1: c.has_scale = 1; c.scale = -0.7f; break;
            case 2: c.softcap = 0.8f; c.has_scale = 1; c.scale = 1.5f; c.amp = 1.5; break;
            case 3: c.mask = 1; c.mshape = 7; c.mask_true = 0.6; c.empty_rows = 1; break;
            case 4: c.mask = 2; c.mshape = 5; c.bias_ninf = 0.25; break;
            case 5: c.mask = 3; c.mshape = 4; c.bias_ninf = 0.2; c.mask_true = 0.7; break;
            case 6: c.causal = 1; break;
            case 7: c.causal = 1; c.align = 1; break;
            case 8: c.window = 1; c.wl = 1; c.wr = 1; break;
            case 9: c.window = 1; c.wl = 0; c.wr = -1; break;  // the reversed mask
            case 10: c.window = 1; c.wl = 2; c.wr = 0; c.align = 1; break;
            case 11: c.kvlen = 1; break;
            case 12: c.kvlen = 2; c.kvlen_fixed = 0; break;
            case 13: c.kvlen = 1; c.causal = 1; c.align = 1; break;
            case 14: c.alibi = 1; break;
            case 15: c.alibi = 1; c.align = 1; c.causal = 1; break;
            case 16: c.softcap = 2.0f; c.mask = 3; c.mshape = 7; c.bias_ninf = 0.1; c.alibi = 1; break;
            case 17: c.causal = 1; c.window = 1; c.wl = 1; c.wr = 0; c.kvlen = 2; c.align = 1; break;
            case 18: c.amp = 3.0; break;  // peaked softmax
            case 19: c.has_scale = 1; c.scale = 0.0f; break;
            default:  // everything at once
                c.softcap = 1.2f; c.mask = 3; c.mshape = 3; c.bias_ninf = 0.1; c.alibi = 1;
                c.causal = 1; c.align = 1; c.window = 1; c.wl = 2; c.wr = -1; c.kvlen = 1;
                c.has_scale = 1; c.scale = 0.9f;
                break;
            }
            fd_case(&c);
        }
}

/* ---- 2. the fused path against the reference ----------------------------------------- */

/* The tensors are views.h's views: [B, H, L, D] or [B, L, H, D] over padded buffers. */
static void gather_d(const attn_tensor *t, double *out) {
    int64_t n = 0;
    for (int64_t a = 0; a < t->shape[0]; a++)
        for (int64_t b = 0; b < t->shape[1]; b++)
            for (int64_t c = 0; c < t->shape[2]; c++)
                for (int64_t d = 0; d < t->shape[3]; d++) out[n++] = *view_ptr(t, a, b, c, d);
}
static int64_t numel(const attn_tensor *t) {
    return t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3];
}

/* one complete call: inputs, the forward's O and LSE, dO, the gradient views */
typedef struct bcall {
    bcase c;
    char desc[512];
    opt_store s;
    attn_options opt;  // the forward's options, lse NULL
    float *qb, *kb, *vb, *ob, *dob, *lseb, *dqb, *dkb, *dvb;
    int64_t nqb, nkb, nvb, nob, nlb, ndqb, ndkb, ndvb;
    attn_tensor q, k, v, o, d_o, lse, dq, dk, dv;
    /* dense: the float64 gradients, and the latest run's */
    double *ref[3], *mag[3];
    bool have_mag;  // mag computed (only when a gradient misses the contract's tolerance)
    float *got[3];
    int64_t n[3];
} bcall;

static void bcall_build(bcall *t, const bcase *c) {
    memset(t, 0, sizeof *t);
    t->c = *c;
    describe(c, t->desc, sizeof t->desc);
    rng_t r = {c->seed * 0x2545f4914f6cdd1dULL + 99};
    build_options(c, &r, &t->s, &t->opt);
    const int64_t B = c->B, Hq = c->Hq, Hkv = c->Hkv, Lq = c->Lq, Lk = c->Lk, Dk = c->Dk, Dv = c->Dv;
    const int64_t loff = c->cache ? 3 : 0, lpad = c->cache ? 5 : 0, dpad = c->cache ? 3 : 0;
    const double amp = c->amp > 0 ? c->amp : 1.0;

    t->nqb = view_elems(B, Hq, Lq, Dk, 0, 0, 0);
    t->nob = view_elems(B, Hq, Lq, Dv, 0, 0, 0);
    t->nkb = t->ndkb = view_elems(B, Hkv, Lk, Dk, loff, lpad, dpad);
    t->nvb = t->ndvb = view_elems(B, Hkv, Lk, Dv, loff, lpad, dpad);
    t->ndqb = t->nqb;
    t->nlb = B * Hq * Lq;
    t->qb = xcalloc(t->nqb, 4); t->ob = xcalloc(t->nob, 4); t->dob = xcalloc(t->nob, 4);
    t->kb = xcalloc(t->nkb, 4); t->vb = xcalloc(t->nvb, 4); t->lseb = xcalloc(t->nlb, 4);
    t->dqb = xcalloc(t->ndqb, 4); t->dkb = xcalloc(t->ndkb, 4); t->dvb = xcalloc(t->ndvb, 4);
    for (int64_t e = 0; e < t->nkb; e++) t->kb[e] = NAN;  // what lies outside the cache views
    for (int64_t e = 0; e < t->nvb; e++) t->vb[e] = NAN;
    t->q = make_view(t->qb, B, Hq, Lq, Dk, c->layout, 0, 0, 0);
    t->o = make_view(t->ob, B, Hq, Lq, Dv, c->layout, 0, 0, 0);
    t->d_o = make_view(t->dob, B, Hq, Lq, Dv, c->layout, 0, 0, 0);
    t->dq = make_view(t->dqb, B, Hq, Lq, Dk, c->layout, 0, 0, 0);
    t->k = make_view(t->kb, B, Hkv, Lk, Dk, c->layout, loff, lpad, dpad);
    t->v = make_view(t->vb, B, Hkv, Lk, Dv, c->layout, loff, lpad, dpad);
    t->dk = make_view(t->dkb, B, Hkv, Lk, Dk, c->layout, loff, lpad, dpad);
    t->dv = make_view(t->dvb, B, Hkv, Lk, Dv, c->layout, loff, lpad, dpad);
    t->lse = attn_tensor_4d(t->lseb, ATTN_F32, B, Hq, Lq, 1);
    const attn_tensor *fill[4] = {&t->q, &t->k, &t->v, &t->d_o};
    for (int a = 0; a < 4; a++)
        for (int64_t i0 = 0; i0 < fill[a]->shape[0]; i0++)
            for (int64_t i1 = 0; i1 < fill[a]->shape[1]; i1++)
                for (int64_t i2 = 0; i2 < fill[a]->shape[2]; i2++)
                    for (int64_t i3 = 0; i3 < fill[a]->shape[3]; i3++)
                        *view_ptr(fill[a], i0, i1, i2, i3) = (float)((a == 3 ? 1.0 : amp) * rng_sym(&r));
    t->n[0] = numel(&t->dq); t->n[1] = numel(&t->dk); t->n[2] = numel(&t->dv);
    for (int a = 0; a < 3; a++) {
        t->ref[a] = xcalloc(t->n[a], sizeof(double));
        t->mag[a] = xcalloc(t->n[a], sizeof(double));
        t->got[a] = xcalloc(t->n[a], sizeof(float));
    }
}

static void bcall_free(bcall *t) {
    free(t->qb); free(t->kb); free(t->vb); free(t->ob); free(t->dob); free(t->lseb);
    free(t->dqb); free(t->dkb); free(t->dvb);
    for (int a = 0; a < 3; a++) {
        free(t->ref[a]);
        free(t->mag[a]);
        free(t->got[a]);
    }
    free_options(&t->s);
}

/* the forward on the fused path: O and LSE, the backward's inputs */
static attn_status bcall_forward(bcall *t) {
    attn_options f = t->opt;
    f.lse = &t->lse;
    f.path = ATTN_PATH_FUSED;
    return attn_forward(&t->q, &t->k, &t->v, &t->o, &f);
}

/* the float64 gradients of the inputs as stored (float), into t->ref; with magnitudes,
 * the same sums over absolute values into t->mag instead (grad_within_tol) */
static attn_status bcall_reference(bcall *t, bool magnitudes) {
    attn_params p;
    attn_options f = t->opt;
    f.path = ATTN_PATH_REFERENCE;
    attn_status st = attn_params_init(&p, &t->q, &t->k, &t->v, &t->o, &f, true);
    if (st != ATTN_OK) return st;
    double *in[4];
    const attn_tensor *src[4] = {&t->q, &t->k, &t->v, &t->d_o};
    for (int a = 0; a < 4; a++) {
        in[a] = xcalloc(numel(src[a]), sizeof(double));
        gather_d(src[a], in[a]);
    }
    double **out = magnitudes ? t->mag : t->ref;
    st = attn_ref64_backward(&p, in[0], in[1], in[2], in[3], out[0], out[1], out[2], magnitudes);
    for (int a = 0; a < 4; a++) free(in[a]);
    t->have_mag |= magnitudes && st == ATTN_OK;
    return st;
}

/* the backward on `path` with `threads`, gradients first filled with the sentinel;
 * then gathered into t->got */
static attn_status bcall_run(bcall *t, attn_path path, int threads) {
    fill_sentinel(t->dqb, t->ndqb);
    fill_sentinel(t->dkb, t->ndkb);
    fill_sentinel(t->dvb, t->ndvb);
    attn_options b = t->opt;
    b.path = path;
    b.threads = threads;
    const attn_status st = attn_backward(&t->q, &t->k, &t->v, &t->o, &t->d_o, &t->lse, &t->dq,
                                         &t->dk, &t->dv, &b);
    gather_f32(&t->dq, t->got[0]);
    gather_f32(&t->dk, t->got[1]);
    gather_f32(&t->dv, t->got[2]);
    return st;
}

/* floats of the gradient buffers written outside the views */
static int64_t outside_written(const bcall *t) {
    return count_written(t->dqb, t->ndqb) - t->n[0] + count_written(t->dkb, t->ndkb) - t->n[1] +
           count_written(t->dvb, t->ndvb) - t->n[2];
}

static int g_cases;

/* one case: the forward, the float64 gradients, the reference path (bit-equal to them
 * rounded), the fused path (within tolerance) */
static void run_case(const bcase *c) {
    bcall t;
    bcall_build(&t, c);
    attn_status st = bcall_forward(&t);
    CHECK(st == ATTN_OK, "forward: %s [%s]", attn_last_error(), t.desc);
    st = bcall_reference(&t, false);
    CHECK(st == ATTN_OK, "ref64: status %d [%s]", (int)st, t.desc);

    st = bcall_run(&t, ATTN_PATH_REFERENCE, 0);
    CHECK(st == ATTN_OK, "reference path: %s: %s [%s]", attn_status_string(st), attn_last_error(), t.desc);
    int64_t mism = 0;
    for (int a = 0; a < 3; a++)
        for (int64_t e = 0; e < t.n[a]; e++) {
            const float want = (float)t.ref[a][e];
            mism += memcmp(&want, &t.got[a][e], 4) != 0;
        }
    CHECK(mism == 0, "reference path: %lld gradients differ from the float64 ones rounded [%s]",
          (long long)mism, t.desc);

    st = bcall_run(&t, ATTN_PATH_FUSED, 0);
    CHECK(st == ATTN_OK, "fused: %s: %s [%s]", attn_status_string(st), attn_last_error(), t.desc);
    /* the magnitudes cost a third reference run: only when a gradient needs them (or
     * ATTN_TEST_STATS is set, for the error-to-magnitude figures of docs/TRAINING.md) */
    bool need_mag = getenv("ATTN_TEST_STATS") != NULL;
    for (int a = 0; a < 3; a++) need_mag |= !within_f32_tol(t.got[a], t.ref[a], t.n[a], NULL);
    if (need_mag) CHECK(bcall_reference(&t, true) == ATTN_OK, "ref64 magnitudes failed");
    for (int a = 0; a < 3; a++) {
        tol_result r;
        int cancel;
        const int ok = grad_within_tol(t.got[a], t.ref[a], t.have_mag ? t.mag[a] : NULL, t.n[a],
                                       &r, &cancel);
        CHECK(ok, "fused %s: rel %.3g max_err %.3g (max|ref| %.3g) nonfinite %d worst %lld [%s]",
              k_grad[a], r.rel_err, r.max_err, r.max_ref, r.nonfinite_mismatch,
              (long long)r.worst, t.desc);
        if (!ok && r.worst >= 0)
            fprintf(stderr, "     worst %s[%lld]: got %.9g want %.9g\n", k_grad[a],
                    (long long)r.worst, (double)t.got[a][r.worst], t.ref[a][r.worst]);
        double num = 0, dm = 0;
        for (int64_t e = 0; e < t.n[a]; e++) {
            num += (t.got[a][e] - t.ref[a][e]) * (t.got[a][e] - t.ref[a][e]);
            dm += t.mag[a][e] * t.mag[a][e];
        }
        const double relmag = dm > 0 ? sqrt(num / dm) : 0;
        if (t.have_mag && relmag > g_mag_worst[a]) g_mag_worst[a] = relmag;
        if (cancel) {
            g_cancel_cases++;
            if (relmag > g_cancel_worst[a]) g_cancel_worst[a] = relmag;
        } else {
            if (r.rel_err > g_fused_worst[a]) g_fused_worst[a] = r.rel_err;
            const double mrel = r.max_err / (1.0 + r.max_ref);
            if (mrel > g_fused_maxerr_rel[a]) g_fused_maxerr_rel[a] = mrel;
        }
    }
    const int64_t out = outside_written(&t);
    CHECK(out == 0, "fused: %lld floats written outside the gradient views [%s]", (long long)out, t.desc);
    g_cases++;
    bcall_free(&t);
}

static const int64_t k_L[] = {1, 2, 3, 17, 63, 64, 65, 127, 128, 129, 300};
#define N_L ((int)(sizeof k_L / sizeof k_L[0]))
static const int64_t k_D[][2] = {{1, 1}, {3, 3}, {8, 8}, {64, 64}, {80, 80}, {128, 128},
                                 {64, 128}, {128, 64}, {3, 80}, {80, 8}};
#define N_D ((int)(sizeof k_D / sizeof k_D[0]))

static void sizes(void) {
    for (int li = 0; li < N_L; li++)
        for (int di = 0; di < N_D; di++) {
            if ((li + di) % 3) continue;
            const int64_t L = k_L[li], Dk = k_D[di][0], Dv = k_D[di][1];
            bcase c = base(1, 2, 1, L, L, Dk, Dv);
            run_case(&c);
            c = base(2, 2, 2, L, k_L[(li + di + 4) % N_L], Dk, Dv);  // Lq != Lk
            c.causal = (li + di) % 2;
            c.align = (li / 2) % 2;
            run_case(&c);
        }
    /* a few larger ones: key chunks and query blocks beyond one tile each way */
    bcase c = base(1, 1, 1, 300, 300, 64, 64);
    c.causal = 1;
    run_case(&c);
    c = base(1, 4, 1, 129, 300, 80, 64);
    c.causal = 1; c.align = 1;
    run_case(&c);
    c = base(1, 2, 2, 300, 65, 8, 128);
    c.mask = 2; c.mshape = 4; c.bias_ninf = 0.05;
    run_case(&c);
    c = base(1, 2, 1, 17, 33, 0, 8);  // Dk = 0: logits 0, only dv
    run_case(&c);
}

static void gqa(void) {
    static const int ratios[] = {1, 2, 4};
    for (int ri = 0; ri < 3; ri++)
        for (int64_t hkv = 1; hkv <= 2; hkv++) {
            const int64_t hq = ratios[ri] * hkv;
            bcase c = base(2, hq, hkv, 17, 65, 8, 3);
            run_case(&c);
            c = base(1, hq, hkv, 65, 64, 64, 80);
            c.causal = 1; c.align = (int)(hkv & 1);
            run_case(&c);
            c = base(3, hq, hkv, 1, 129, 128, 64);
            c.kvlen = 1; c.alibi = 1; c.mask = 1; c.mshape = 3;
            run_case(&c);
        }
}

/* feature f applied to c; 0 past the end of the list */
static int feature(bcase *c, int f) {
    static const int mshapes[] = {0, 1, 2, 4, 5, 7};
    static const int64_t wins[][2] = {{0, 0}, {3, -1}, {-1, 2}, {5, 5}, {0, -1}, {40, 7}};
    const int nm = 6, nw = 6;
    int i = f;
    if (i < nm) { c->mask = 1; c->mshape = mshapes[i]; c->empty_rows = i == 5; return 1; }
    i -= nm;
    if (i < nm) { c->mask = 2; c->mshape = mshapes[i]; c->bias_ninf = 0.1; return 1; }
    i -= nm;
    if (i < 3) { c->mask = 3; c->mshape = mshapes[3 + i]; c->bias_ninf = 0.2; c->mask_true = 0.6; return 1; }
    i -= 3;
    if (i < 2) { c->causal = 1; c->align = i; return 1; }
    i -= 2;
    if (i < 2 * nw) {
        c->window = 1; c->wl = wins[i / 2][0]; c->wr = wins[i / 2][1];
        c->align = i & 1; c->causal = (i / 2) % 2;
        return 1;
    }
    i -= 2 * nw;
    switch (i) {
    case 0: c->kvlen = 1; return 1;
    case 1: c->kvlen = 2; c->kvlen_fixed = 0; return 1;
    case 2: c->kvlen = 2; c->kvlen_fixed = c->Lk; return 1;
    case 3: c->kvlen = 1; c->align = 1; c->causal = 1; return 1;
    case 4: c->alibi = 1; return 1;
    case 5: c->alibi = 1; c->align = 1; c->causal = 1; return 1;
    case 6: c->softcap = 5.0f; return 1;
    case 7: c->softcap = 0.7f; c->has_scale = 1; c->scale = (float)(3.0 / sqrt((double)c->Dk)); return 1;
    case 8: c->has_scale = 1; c->scale = 0.0f; return 1;
    case 9: c->has_scale = 1; c->scale = (float)(-0.3 / sqrt((double)c->Dk)); return 1;
    case 10: c->has_scale = 1; c->scale = (float)(2.0 / sqrt((double)c->Dk)); return 1;
    case 11: c->layout = 1; return 1;
    case 12: c->cache = 1; return 1;
    case 13: c->cache = 1; c->layout = 1; c->kvlen = 2; return 1;
    case 14:  // everything at once
        c->softcap = 3.0f; c->mask = 3; c->mshape = 7; c->bias_ninf = 0.1; c->alibi = 1;
        c->causal = 1; c->align = 1; c->window = 1; c->wl = 20; c->wr = -1; c->kvlen = 1;
        c->layout = 1; c->cache = 1;
        return 1;
    }
    return 0;
}

static void features(void) {
    static const int64_t shapes[][7] = {
        {2, 4, 2, 17, 65, 8, 3},     /* Lq < Lk */
        {3, 2, 1, 65, 17, 64, 80},   /* Lq > Lk */
        {1, 2, 2, 64, 64, 80, 80},   /* square, one tile */
        {1, 2, 1, 129, 127, 3, 128}, /* across tiles both ways */
    };
    for (int f = 0;; f++) {
        bcase probe = base(1, 1, 1, 1, 1, 1, 1);
        if (!feature(&probe, f)) break;
        for (int si = 0; si < 4; si++) {
            if (si == 3 && f % 3) continue;
            const int64_t *sh = shapes[si];
            bcase c = base(sh[0], sh[1], sh[2], sh[3], sh[4], sh[5], sh[6]);
            feature(&c, f);
            run_case(&c);
        }
    }
}

/* ---- 3. masked rows and poisoned keys ---------------------------------------------------- */

static int all_zero(const float *p, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (p[i] != 0.0f) return 0;
    return 1;
}
static int all_finite(const float *p, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(p[i])) return 0;
    return 1;
}

static void masked_rows(void) {
    static const attn_path paths[2] = {ATTN_PATH_FUSED, ATTN_PATH_REFERENCE};
    /* batch 1 has kv_len 0, rows i % 5 == 2 have no key in the bool mask; their dO is NaN
     * and their Q Inf (NaN in batch 1): a zero P or dS must not multiply either */
    bcase c = base(2, 2, 1, 70, 90, 16, 24);
    c.kvlen = 2; c.kvlen_fixed = -1; c.mask = 1; c.mshape = 4; c.empty_rows = 1;
    for (int pi = 0; pi < 2; pi++) {
        bcall t;
        bcall_build(&t, &c);
        for (int64_t h = 0; h < c.Hq; h++)
            for (int64_t i = 0; i < c.Lq; i++)
                for (int64_t d = 0; d < c.Dk; d++) {
                    if (i % 5 == 2) *view_ptr(&t.q, 0, h, i, d) = d % 2 ? INFINITY : -INFINITY;
                    *view_ptr(&t.q, 1, h, i, d) = NAN;
                }
        CHECK(bcall_forward(&t) == ATTN_OK, "masked rows: forward failed");
        const int64_t lk0 = t.s.kvl64[0];
        for (int64_t h = 0; h < c.Hq; h++)
            for (int64_t i = 0; i < c.Lq; i++) {
                const int empty = i % 5 == 2;
                for (int64_t d = 0; d < c.Dv; d++) {
                    if (empty) *view_ptr(&t.d_o, 0, h, i, d) = NAN;
                    *view_ptr(&t.d_o, 1, h, i, d) = NAN;  // batch 1: every row is empty
                }
            }
        CHECK(bcall_run(&t, paths[pi], 0) == ATTN_OK, "masked rows: backward failed");
        int64_t bad_dq = 0;
        for (int64_t h = 0; h < c.Hq; h++)
            for (int64_t i = 0; i < c.Lq; i++)
                for (int64_t d = 0; d < c.Dk; d++) {
                    const float x = t.got[0][((0 * c.Hq + h) * c.Lq + i) * c.Dk + d];
                    const float y = t.got[0][((1 * c.Hq + h) * c.Lq + i) * c.Dk + d];
                    if (y != 0.0f || (i % 5 == 2 && x != 0.0f) || !isfinite(x)) bad_dq++;
                }
        CHECK(bad_dq == 0, "masked rows (%s): %lld dq entries of empty rows not 0 (or NaN elsewhere)",
              pi ? "reference" : "fused", (long long)bad_dq);
        const int64_t half_k = t.n[1] / 2, half_v = t.n[2] / 2;
        CHECK(all_zero(t.got[1] + half_k, half_k) && all_zero(t.got[2] + half_v, half_v),
              "masked rows (%s): dk/dv of the batch with kv_len 0 not 0", pi ? "reference" : "fused");
        CHECK(all_finite(t.got[1], half_k) && all_finite(t.got[2], half_v),
              "masked rows (%s): NaN dO or Inf Q of empty rows reached dk/dv", pi ? "reference" : "fused");
        int64_t beyond = 0;  // keys at or past kv_len[0] in batch 0: exactly 0
        for (int64_t j = lk0; j < c.Lk; j++) {
            for (int64_t d = 0; d < c.Dk; d++) beyond += t.got[1][j * c.Dk + d] != 0.0f;
            for (int64_t d = 0; d < c.Dv; d++) beyond += t.got[2][j * c.Dv + d] != 0.0f;
        }
        CHECK(beyond == 0, "masked rows (%s): %lld dk/dv entries past kv_len not 0",
              pi ? "reference" : "fused", (long long)beyond);
        bcall_free(&t);
    }
}

/* NaN stored in every K and V row no query row may read (past kv_len, outside the
 * causal band and window): no gradient may see it, and those rows' gradients are 0 */
static void poisoned_keys(void) {
    static const attn_path paths[2] = {ATTN_PATH_FUSED, ATTN_PATH_REFERENCE};
    bcase cs[3];
    cs[0] = base(2, 2, 1, 40, 150, 32, 16);
    cs[0].kvlen = 1; cs[0].kvlen_fixed = 101; cs[0].causal = 1; cs[0].align = 0;  // top-left, Lq < Lk
    cs[1] = base(1, 2, 2, 130, 140, 8, 8);
    cs[1].window = 1; cs[1].wl = 9; cs[1].wr = 3; cs[1].cache = 1; cs[1].layout = 1;
    cs[2] = base(1, 1, 1, 64, 200, 64, 64);
    cs[2].kvlen = 2; cs[2].kvlen_fixed = 70; cs[2].mask = 2; cs[2].mshape = 4; cs[2].bias_ninf = 0.2;
    for (int ci = 0; ci < 3; ci++)
        for (int pi = 0; pi < 2; pi++) {
            bcall t;
            bcall_build(&t, &cs[ci]);
            const bcase *c = &cs[ci];
            CHECK(bcall_forward(&t) == ATTN_OK, "poison: forward failed");
            /* which keys does any row read? */
            attn_params p;
            attn_params_init(&p, &t.q, &t.k, &t.v, &t.o, &t.opt, true);
            int64_t poisoned = 0;
            for (int64_t b = 0; b < c->B; b++) {
                const int64_t lkb = attn_key_len(&p, b);
                for (int64_t j = 0; j < c->Lk; j++) {
                    int used = 0;
                    for (int64_t i = 0; i < c->Lq && !used; i++) {
                        int64_t lo, hi;
                        attn_row_range(&p, lkb, i, &lo, &hi);
                        used = j >= lo && j < hi;
                    }
                    if (used) continue;
                    poisoned++;
                    for (int64_t g = 0; g < c->Hkv; g++) {
                        for (int64_t d = 0; d < c->Dk; d++) *view_ptr(&t.k, b, g, j, d) = NAN;
                        for (int64_t d = 0; d < c->Dv; d++) *view_ptr(&t.v, b, g, j, d) = NAN;
                    }
                }
            }
            CHECK(poisoned > 0, "poison: case %d has no unread key", ci);
            CHECK(bcall_run(&t, paths[pi], 0) == ATTN_OK, "poison: backward failed");
            for (int a = 0; a < 3; a++)
                CHECK(all_finite(t.got[a], t.n[a]), "poison (%s, case %d): NaN reached %s",
                      pi ? "reference" : "fused", ci, k_grad[a]);
            bcall_free(&t);
        }
}

/* ---- 4. determinism --------------------------------------------------------------------- */

static int same_bits(const bcall *t, float *const saved[3]) {
    for (int a = 0; a < 3; a++)
        if (memcmp(t->got[a], saved[a], (size_t)t->n[a] * 4) != 0) return 0;
    return 1;
}

static void determinism(void) {
    bcase cs[4];
    cs[0] = base(1, 1, 1, 300, 300, 64, 64);  // one head: key chunks, dQ partials summed
    cs[0].causal = 1;
    cs[1] = base(2, 4, 2, 129, 200, 80, 32);  // GQA, chunks
    cs[1].mask = 3; cs[1].mshape = 7; cs[1].bias_ninf = 0.1; cs[1].softcap = 4.0f;
    cs[2] = base(4, 8, 4, 65, 65, 16, 16);    // enough heads for one chunk
    cs[2].window = 1; cs[2].wl = 7; cs[2].wr = 7; cs[2].layout = 1;
    cs[3] = base(1, 2, 1, 1000, 1000, 32, 32);  // long
    cs[3].causal = 1; cs[3].align = 1; cs[3].alibi = 1;
    for (int ci = 0; ci < 4; ci++) {
        bcall t;
        bcall_build(&t, &cs[ci]);
        CHECK(bcall_forward(&t) == ATTN_OK, "determinism: forward failed");
        float *saved[3];
        CHECK(bcall_run(&t, ATTN_PATH_FUSED, 1) == ATTN_OK, "determinism: 1 thread failed");
        for (int a = 0; a < 3; a++) {
            saved[a] = xcalloc(t.n[a], 4);
            memcpy(saved[a], t.got[a], (size_t)t.n[a] * 4);
        }
        static const int threads[4] = {2, 3, 2, 16};
        for (int ti = 0; ti < 4; ti++) {
            CHECK(bcall_run(&t, ATTN_PATH_FUSED, threads[ti]) == ATTN_OK, "determinism: run failed");
            CHECK(same_bits(&t, saved), "determinism: %d threads (run %d) differ from 1 thread [%s]",
                  threads[ti], ti, t.desc);
        }
        for (int a = 0; a < 3; a++) free(saved[a]);
        bcall_free(&t);
    }
}

/* ---- 5. misuse ----------------------------------------------------------------------------- */

static void misuse(void) {
    bcase c = base(2, 4, 2, 9, 11, 5, 6);
    bcall t;
    bcall_build(&t, &c);
    CHECK(bcall_forward(&t) == ATTN_OK, "misuse: forward failed");
    float dummy[8];
    uint8_t mask[4] = {1, 1, 1, 1};

    for (int m = 0;; m++) {
        attn_tensor q = t.q, k = t.k, v = t.v, o = t.o, d_o = t.d_o, lse = t.lse;
        attn_tensor dq = t.dq, dk = t.dk, dv = t.dv, extra;
        attn_tensor *pq = &q, *pdo = &d_o, *plse = &lse, *pdq = &dq, *pdk = &dk, *pdv = &dv;
        attn_options opt = t.opt;
        attn_status want;
        const char *what;
        int64_t kvl[2] = {11, 12};
        switch (m) {
        case 0: pq = NULL; want = ATTN_ERR_NULL; what = "q NULL"; break;
        case 1: pdo = NULL; want = ATTN_ERR_NULL; what = "d_o NULL"; break;
        case 2: plse = NULL; want = ATTN_ERR_NULL; what = "lse NULL"; break;
        case 3: pdq = NULL; want = ATTN_ERR_NULL; what = "dq NULL"; break;
        case 4: pdk = NULL; want = ATTN_ERR_NULL; what = "dk NULL"; break;
        case 5: pdv = NULL; want = ATTN_ERR_NULL; what = "dv NULL"; break;
        case 6: dv.data = NULL; want = ATTN_ERR_NULL; what = "dv data NULL"; break;
        /* 16-bit tensors are valid (test_backward_half); k and v must still agree */
        case 7: k.dtype = ATTN_F16; want = ATTN_ERR_DTYPE; what = "k float16, v float32"; break;
        case 8: d_o.dtype = ATTN_BOOL; want = ATTN_ERR_DTYPE; what = "d_o bool"; break;
        case 9: dq.dtype = ATTN_I32; want = ATTN_ERR_DTYPE; what = "dq int32"; break;
        case 10: d_o.shape[3] = 5; want = ATTN_ERR_SHAPE; what = "d_o Dv"; break;
        case 11: lse.shape[3] = 2; want = ATTN_ERR_SHAPE; what = "lse last dim"; break;
        case 12: lse.shape[2] = 8; want = ATTN_ERR_SHAPE; what = "lse Lq"; break;
        case 13: dq.shape[3] = 6; want = ATTN_ERR_SHAPE; what = "dq Dk"; break;
        case 14: dk.shape[1] = 4; want = ATTN_ERR_SHAPE; what = "dk Hkv"; break;
        case 15: dv.shape[2] = 10; want = ATTN_ERR_SHAPE; what = "dv Lk"; break;
        case 16: dq.stride[2] = 0; want = ATTN_ERR_STRIDE; what = "dq rows overlap"; break;
        case 17: dk.stride[1] = dk.stride[2]; want = ATTN_ERR_STRIDE; what = "dk heads overlap"; break;
        case 18: dv.stride[3] = 0; want = ATTN_ERR_STRIDE; what = "dv columns overlap"; break;
        case 19: dq.stride[0] = INT64_MAX; want = ATTN_ERR_OVERFLOW; what = "dq offsets overflow"; break;
        case 20: opt.lse = &t.lse; want = ATTN_ERR_VALUE; what = "options.lse set"; break;
        case 21:
            extra = attn_tensor_4d(dummy, ATTN_F32, 2, 4, 9, 11);
            opt.weights = &extra; want = ATTN_ERR_VALUE; what = "options.weights set"; break;
        case 22: q.shape[1] = 3; o.shape[1] = 3; d_o.shape[1] = 3; want = ATTN_ERR_HEADS; what = "Hq = 3, Hkv = 2"; break;
        case 23: opt.has_scale = 1; opt.scale = NAN; want = ATTN_ERR_VALUE; what = "scale NaN"; break;
        case 24: opt.path = (attn_path)7; want = ATTN_ERR_VALUE; what = "bad path"; break;
        case 25: opt.threads = -1; want = ATTN_ERR_VALUE; what = "threads -1"; break;
        case 26:
            extra = attn_tensor_4d(kvl, ATTN_I64, 2, 1, 1, 1);
            opt.kv_len = &extra; want = ATTN_ERR_VALUE; what = "kv_len > Lk"; break;
        case 27:
            extra = attn_tensor_4d(mask, ATTN_BOOL, 1, 1, 2, 2);
            opt.mask = &extra; want = ATTN_ERR_MASK; what = "mask shape"; break;
        case 28: opt.workspace = dummy; opt.workspace_bytes = sizeof dummy; want = ATTN_ERR_WORKSPACE; what = "workspace too small"; break;
        case 29: k.shape[3] = 4; want = ATTN_ERR_SHAPE; what = "k Dk"; break;
        case 30: o.shape[2] = 8; want = ATTN_ERR_SHAPE; what = "o Lq"; break;
        case 31: lse.dtype = ATTN_F16; want = ATTN_ERR_DTYPE; what = "lse float16"; break;
        default: want = ATTN_OK; what = NULL; break;
        }
        if (!what) break;
        for (int pi = 0; pi < 2; pi++) {
            opt.path = m == 24 ? opt.path : (pi ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED);
            fill_sentinel(t.dqb, t.ndqb);
            fill_sentinel(t.dkb, t.ndkb);
            fill_sentinel(t.dvb, t.ndvb);
            const attn_status st = attn_backward(pq, &k, &v, &o, pdo, plse, pdq, pdk, pdv, &opt);
            CHECK(st == want, "misuse %s (%s): status %d (%s), expected %d", what,
                  pi ? "reference" : "fused", (int)st, attn_last_error(), (int)want);
            CHECK(attn_last_error()[0] != '\0', "misuse %s: no detail", what);
            const int64_t w = count_written(t.dqb, t.ndqb) + count_written(t.dkb, t.ndkb) +
                              count_written(t.dvb, t.ndvb);
            CHECK(w == 0, "misuse %s (%s): %lld floats written", what, pi ? "reference" : "fused",
                  (long long)w);
            if (m != 28) {
                size_t bytes = 12345;
                const attn_status sw = attn_backward_workspace_size(pq, &k, &v, &o, pdo, plse, pdq,
                                                                    pdk, pdv, &opt, &bytes);
                /* the workspace query does not read data: a NULL data pointer or a kv_len
                 * value is not its business */
                if (m != 6 && m != 26)
                    CHECK(sw == want, "misuse %s: workspace query status %d, expected %d", what,
                          (int)sw, (int)want);
                CHECK(sw != ATTN_OK || bytes != 12345, "misuse %s: bytes not written", what);
            }
        }
    }
    size_t bytes;
    CHECK(attn_backward_workspace_size(&t.q, &t.k, &t.v, &t.o, &t.d_o, &t.lse, &t.dq, &t.dk,
                                       &t.dv, &t.opt, NULL) == ATTN_ERR_NULL,
          "misuse: workspace query with bytes NULL");

    /* the caller's workspace, exactly the size asked: the same bits as the call's own */
    for (int pi = 0; pi < 2; pi++) {
        attn_options opt = t.opt;
        opt.path = pi ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED;
        CHECK(attn_backward_workspace_size(&t.q, &t.k, &t.v, &t.o, &t.d_o, &t.lse, &t.dq, &t.dk,
                                           &t.dv, &opt, &bytes) == ATTN_OK,
              "workspace query failed");
        CHECK(bcall_run(&t, opt.path, 0) == ATTN_OK, "workspace: own run failed");
        float *saved[3];
        for (int a = 0; a < 3; a++) {
            saved[a] = xcalloc(t.n[a], 4);
            memcpy(saved[a], t.got[a], (size_t)t.n[a] * 4);
        }
        void *ws = malloc(bytes);
        attn_options keep = t.opt;
        t.opt.workspace = ws;
        t.opt.workspace_bytes = bytes;
        CHECK(bcall_run(&t, opt.path, 0) == ATTN_OK, "workspace: run with the caller's failed: %s",
              attn_last_error());
        CHECK(same_bits(&t, saved), "workspace: the caller's workspace changed the result");
        t.opt = keep;
        free(ws);
        for (int a = 0; a < 3; a++) free(saved[a]);
    }
    bcall_free(&t);

    /* empty sizes: Lq = 0 writes dk, dv as 0; Lk = 0 writes dq as 0; B = 0 nothing */
    static const int64_t empties[][7] = {{1, 2, 1, 0, 5, 3, 4}, {2, 2, 2, 4, 0, 3, 4},
                                         {0, 2, 1, 4, 5, 3, 4}, {1, 0, 3, 4, 5, 3, 4},
                                         {1, 2, 1, 4, 5, 0, 4}, {1, 2, 1, 4, 5, 3, 0}};
    for (int e = 0; e < 6; e++) {
        const int64_t *s = empties[e];
        for (int pi = 0; pi < 2; pi++) {
            bcase ce = base(s[0], s[1], s[2], s[3], s[4], s[5], s[6]);
            bcall te;
            bcall_build(&te, &ce);
            CHECK(bcall_forward(&te) == ATTN_OK, "empty %d: forward failed", e);
            CHECK(bcall_run(&te, pi ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED, 0) == ATTN_OK,
                  "empty %d: backward failed: %s", e, attn_last_error());
            for (int a = 0; a < 3; a++)
                CHECK(all_zero(te.got[a], te.n[a]) || (a == 2 && s[4] > 0 && s[3] > 0 && s[1] > 0),
                      "empty %d (%s): %s not all 0", e, pi ? "reference" : "fused", k_grad[a]);
            CHECK(outside_written(&te) == 0, "empty %d: wrote outside", e);
            bcall_free(&te);
        }
    }
}

/* ---- 6. every check rejects a planted error ---------------------------------------------- */

static void planted_errors(void) {
    /* the FD comparison: a gradient one element off by 1e-5 of its norm is rejected */
    {
        double g[50], fd[50], err, norm = 0;
        rng_t r = {42};
        for (int e = 0; e < 50; e++) {
            fd[e] = rng_sym(&r);
            norm += fd[e] * fd[e];
        }
        norm = sqrt(norm);
        memcpy(g, fd, sizeof g);
        CHECK(fd_accepts(g, fd, 50, &err), "planted: an exact gradient is rejected by the FD check");
        g[17] += 1e-5 * norm;
        CHECK(!fd_accepts(g, fd, 50, &err), "planted: the FD check accepts an error of 1e-5 (%.3g)", err);
        memcpy(g, fd, sizeof g);
        g[17] += 0.5e-6 * norm;
        CHECK(fd_accepts(g, fd, 50, &err), "planted: the FD check rejects an error of 5e-7");
        /* a gradient with its sign flipped, or scaled by 1 + 2e-6 */
        for (int e = 0; e < 50; e++) g[e] = -fd[e];
        CHECK(!fd_accepts(g, fd, 50, &err), "planted: the FD check accepts a flipped sign");
        for (int e = 0; e < 50; e++) g[e] = fd[e] * (1 + 2e-6);
        CHECK(!fd_accepts(g, fd, 50, &err), "planted: the FD check accepts a 2e-6 scaling");
    }
    /* the fused-vs-reference tolerance, on a real case */
    bcase c = base(2, 2, 1, 65, 70, 32, 32);
    c.causal = 1; c.kvlen = 1;
    bcall t;
    bcall_build(&t, &c);
    CHECK(bcall_forward(&t) == ATTN_OK && bcall_reference(&t, false) == ATTN_OK &&
              bcall_run(&t, ATTN_PATH_FUSED, 0) == ATTN_OK, "planted: the base case failed");
    for (int a = 0; a < 3; a++) {
        const int64_t n = t.n[a];
        float *g = xcalloc(n, 4);
        tol_result r;
        CHECK(within_f32_tol(t.got[a], t.ref[a], n, &r), "planted: the unperturbed %s is rejected", k_grad[a]);
        int64_t big = 0;
        for (int64_t e = 0; e < n; e++)
            if (fabs(t.ref[a][e]) > fabs(t.ref[a][big])) big = e;
        /* every element scaled by 1 + 3e-6: the Frobenius bound must reject it */
        for (int64_t e = 0; e < n; e++) g[e] = (float)(t.ref[a][e] * (1 + 3e-6));
        CHECK(!within_f32_tol(g, t.ref[a], n, NULL), "planted: %s scaled by 1+3e-6 accepted", k_grad[a]);
        /* one element off by 2e-5 (1 + max|ref|): the max bound must reject it */
        memcpy(g, t.got[a], (size_t)n * 4);
        g[big] += (float)(2e-5 * (1.0 + r.max_ref));
        CHECK(!within_f32_tol(g, t.ref[a], n, NULL), "planted: %s off by 2e-5(1+max) at one element accepted", k_grad[a]);
        /* a wrong gradient of the right size: the other head's */
        for (int64_t e = 0; e < n; e++) g[e] = t.got[a][(e + n / 2) % n];
        CHECK(!within_f32_tol(g, t.ref[a], n, NULL), "planted: %s shifted by half accepted", k_grad[a]);
        free(g);
    }
    /* the exactly-0 and finiteness checks */
    {
        float z[4] = {0, -0.0f, 0, 0};
        CHECK(all_zero(z, 4), "planted: all_zero rejects zeros");
        z[2] = 1e-30f;
        CHECK(!all_zero(z, 4), "planted: all_zero accepts 1e-30");
        z[2] = NAN;
        CHECK(!all_finite(z, 4) && !all_zero(z, 4), "planted: NaN accepted");
    }
    /* bit identity: one ulp apart is not the same */
    {
        float *saved[3];
        for (int a = 0; a < 3; a++) {
            saved[a] = xcalloc(t.n[a], 4);
            memcpy(saved[a], t.got[a], (size_t)t.n[a] * 4);
        }
        CHECK(same_bits(&t, saved), "planted: same_bits rejects a copy");
        saved[1][3] = nextafterf(saved[1][3], INFINITY);
        CHECK(!same_bits(&t, saved), "planted: same_bits accepts one ulp");
        for (int a = 0; a < 3; a++) free(saved[a]);
    }
    bcall_free(&t);
}

int main(void) {
    finite_differences();
    printf("backward: reference vs finite differences, worst relative error: dq %.2g, dk %.2g, dv %.2g\n",
           g_fd_worst[0], g_fd_worst[1], g_fd_worst[2]);
    sizes();
    gqa();
    features();
    printf("backward: fused vs reference over %d cases (kernel %s), worst relative Frobenius "
           "error: dq %.2g, dk %.2g, dv %.2g; worst max|err|/(1+max|ref|): %.2g, %.2g, %.2g\n",
           g_cases, attn_kernel_name(), g_fused_worst[0], g_fused_worst[1], g_fused_worst[2],
           g_fused_maxerr_rel[0], g_fused_maxerr_rel[1], g_fused_maxerr_rel[2]);
    printf("backward: error / |magnitude| (cases that computed it): dq %.2g, dk %.2g, dv %.2g; %d gradients "
           "judged as cancellations, worst there: dq %.2g, dk %.2g, dv %.2g\n",
           g_mag_worst[0], g_mag_worst[1], g_mag_worst[2], g_cancel_cases, g_cancel_worst[0],
           g_cancel_worst[1], g_cancel_worst[2]);
    masked_rows();
    poisoned_keys();
    determinism();
    misuse();
    planted_errors();
    return check_summary("backward");
}
