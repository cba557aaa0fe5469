/*
 * test_mask_lengths.c — key padding given as a mask or a bias, run as the key lengths it
 *                       is (ai_mask_summary_lengths, src/forward/mask_summary.c).
 *
 * What it covers: the detector itself on attn_params made by ai_params_init (which
 * masks it turns into lengths, which lengths, whether it adds the causal band, and every
 * near miss it must refuse: a kept key past the prefix, a masked key inside it, a kept key
 * above the causal band, NaN, +inf or a valued bias in the masked part, one head's rows
 * unlike the others, a batch of padding beside a batch of causal rows, bottom-right
 * causal); then each case end to end: the fused forward (1 and 2 threads, bit for bit)
 * and backward against the float64 reference path, and, where the detector says yes,
 * bit for bit against the same call given kv_len (and causal) directly, with NaN and Inf
 * stored in K and V past every batch's length (such keys must never be read).
 * What it is not: the broad matrix of mask shapes and patterns (test_masks.c), which runs
 * through the same detector.
 */
#include <string.h>

#include "attn.h"
#include "check.h"
#include "rng.h"
#include "forward/mask_summary.h"
#include "oracle.h"

/* what the cells hold: an open prefix per batch, the prefix cut by the top-left causal
 * band (row i open on [0, min(n, i + 1))), or the band alone */
enum { F_PAD, F_PAD_CAUSAL, F_CAUSAL };
/* the tensor's broadcast form */
enum { SH_BLL, SH_B11L, SH_BHLL, SH_11LL, SH_KEYS_STRIDED };
/* what breaks the structure (in the last stored row of batch 0), or nothing */
enum {
    SP_NONE, SP_KEEP_FAR, SP_DROP_IN, SP_ABOVE_BAND, SP_NAN, SP_INF, SP_VALUE, SP_HEAD, SP_MIXED,
    SP_BYTE7,  // a kept byte of 7, not 1: still open
};

typedef struct lcase {
    const char *what;
    int64_t B, H, Lq, Lk, D;
    int form, shape, spoil;
    bool bias;            // a 0 / -inf bias rather than a bool mask
    bool both;            // a bool mask and a bias of other lengths
    bool causal;          // the call's own causal option
    attn_align align;
    bool kvlen;           // the call's own kv_len (Lk / 2 for every batch)
    bool window;          // the call's own window (left 7, right 5)
    bool expect;          // the detector turns it into lengths
    bool expect_causal;   // ... with the causal band
} lcase;

static int64_t len_of(const lcase *c, int64_t b, int salt) {
    const int64_t Lk = c->Lk;
    const int64_t v[4] = {Lk > 3 ? Lk / 3 : 1, Lk, 0, Lk > 5 ? Lk - 5 : 1};
    return salt ? (v[(b + 1) % 4] + 3 < Lk ? v[(b + 1) % 4] + 3 : Lk) : v[b % 4];
}

static bool keep(const lcase *c, int form, int64_t n, int64_t i, int64_t j) {
    switch (form) {
    case F_PAD: return j < n;
    case F_PAD_CAUSAL: return j < n && j <= i;
    default: return j <= i;
    }
}

typedef struct ltensors {
    float *qb, *kb, *vb;
    uint8_t *mb;
    float *fb;
    attn_tensor q, k, v, mask, bias, kvl;
    int64_t kvlen[8];
} ltensors;

/* the stored cells of one tensor and its view; salt 1: the bias's lengths when both */
static attn_tensor make_tensor(const lcase *c, bool is_bias, int salt, void **store) {
    const int64_t B = c->B, H = c->H, Lq = c->Lq, Lk = c->Lk;
    attn_tensor t = {NULL, is_bias ? ATTN_F32 : ATTN_BOOL, {B, 1, Lq, Lk}, {Lq * Lk, 0, Lk, 1}};
    int64_t nb = B, nh = 1, nq = Lq;
    switch (c->shape) {
    case SH_B11L: t.shape[2] = 1, t.stride[0] = Lk, t.stride[2] = 0, nq = 1; break;
    case SH_BHLL: t.shape[1] = H, t.stride[0] = H * Lq * Lk, t.stride[1] = Lq * Lk, nh = H; break;
    case SH_11LL: t.shape[0] = 1, t.stride[0] = 0, nb = 1; break;
    case SH_KEYS_STRIDED: t.stride[0] = Lq * Lk, t.stride[2] = 1, t.stride[3] = Lq; break;  // (B, Lk, Lq) storage
    default: break;
    }
    const int64_t cells = nb * nh * nq * Lk;
    uint8_t *kept = xcalloc(cells, 1);
    for (int64_t b = 0; b < nb; b++)
        for (int64_t h = 0; h < nh; h++)
            for (int64_t i = 0; i < nq; i++)
                for (int64_t j = 0; j < Lk; j++) {
                    const int64_t x = b * t.stride[0] + h * t.stride[1] + i * t.stride[2] + j * t.stride[3];
                    const int form = c->spoil == SP_MIXED && b == 0 ? F_PAD : c->form;
                    kept[x] = keep(c, form, len_of(c, b, salt), i, j);
                }
    /* the spoiler: last stored row of batch 0 (head nh - 1) */
    const int64_t i0 = nq - 1, n0 = len_of(c, 0, salt);
    const int64_t row0 = (nh - 1) * t.stride[1] + i0 * t.stride[2];
    int64_t at = -1;
    if (c->spoil == SP_KEEP_FAR) kept[row0 + (Lk - 1) * t.stride[3]] = 1;
    if (c->spoil == SP_DROP_IN) kept[row0 + n0 / 2 * t.stride[3]] = 0;
    if (c->spoil == SP_HEAD) kept[row0 + (n0 - 1) * t.stride[3]] = 0;
    if (c->spoil == SP_ABOVE_BAND) {  // a row whose band ends before the padding: row 1
        const int64_t row1 = (nh - 1) * t.stride[1] + 1 * t.stride[2];
        kept[row1 + 3 * t.stride[3]] = 1;
    }
    if (c->spoil == SP_NAN || c->spoil == SP_INF || c->spoil == SP_VALUE) at = row0 + (Lk - 2) * t.stride[3];
    if (!is_bias) {
        if (c->spoil == SP_BYTE7)
            for (int64_t x = 0; x < cells; x++) kept[x] *= 7;
        *store = kept;
        t.data = kept;
        return t;
    }
    float *f = xcalloc(cells, 4);
    for (int64_t x = 0; x < cells; x++) f[x] = kept[x] ? (x % 3 ? 0.0f : -0.0f) : -INFINITY;
    if (at >= 0) f[at] = c->spoil == SP_NAN ? NAN : c->spoil == SP_INF ? INFINITY : 0.5f;
    free(kept);
    *store = f;
    t.data = f;
    return t;
}

static void build(const lcase *c, ltensors *t) {
    const int64_t B = c->B, H = c->H, Lq = c->Lq, Lk = c->Lk, D = c->D;
    rng_t r = {(uint64_t)(B * 131 + Lq * 7 + Lk)};
    *t = (ltensors){0};
    t->qb = xcalloc(B * H * Lq * D, 4);
    t->kb = xcalloc(B * H * Lk * D, 4);
    t->vb = xcalloc(B * H * Lk * D, 4);
    for (int64_t x = 0; x < B * H * Lq * D; x++) t->qb[x] = (float)rng_range(&r, -2, 2);
    for (int64_t x = 0; x < B * H * Lk * D; x++) t->kb[x] = (float)rng_range(&r, -2, 2);
    for (int64_t x = 0; x < B * H * Lk * D; x++) t->vb[x] = (float)rng_range(&r, -1, 1);
    t->q = attn_tensor_4d(t->qb, ATTN_F32, B, H, Lq, D);
    t->k = attn_tensor_4d(t->kb, ATTN_F32, B, H, Lk, D);
    t->v = attn_tensor_4d(t->vb, ATTN_F32, B, H, Lk, D);
    void *s;
    if (!c->bias || c->both) t->mask = make_tensor(c, false, 0, &s), t->mb = s;
    if (c->bias || c->both) t->bias = make_tensor(c, true, c->both, &s), t->fb = s;
    for (int64_t b = 0; b < B; b++) t->kvlen[b] = Lk / 2;
    t->kvl = (attn_tensor){t->kvlen, ATTN_I64, {B, 1, 1, 1}, {1, 1, 1, 1}};
}

static attn_options options(const lcase *c, ltensors *t, attn_path path, int threads) {
    attn_options o = {.path = path, .threads = threads, .causal = c->causal, .align = c->align};
    o.mask = t->mb ? &t->mask : NULL;
    o.bias = t->fb ? &t->bias : NULL;
    o.kv_len = c->kvlen ? &t->kvl : NULL;
    if (c->window) o.has_window = true, o.window_left = 7, o.window_right = 5;
    return o;
}

/* the lengths the detector should give: the least of the call's, the mask's, the bias's */
static int64_t expected_len(const lcase *c, int64_t b) {
    int64_t n = c->kvlen ? c->Lk / 2 : c->Lk;
    const int64_t bb = c->shape == SH_11LL ? 0 : b;
    if (c->form != F_CAUSAL) {
        if ((!c->bias || c->both) && len_of(c, bb, 0) < n) n = len_of(c, bb, 0);
        if ((c->bias || c->both) && len_of(c, bb, c->both) < n) n = len_of(c, bb, c->both);
    }
    /* the causal forms: the prefix of the last row, which the band cuts at Lq */
    if (c->form != F_PAD && c->Lq < n) n = c->Lq;
    return n;
}

static void check_detector(const lcase *c, ltensors *t) {
    attn_params p, out;
    attn_tensor o = attn_tensor_4d(NULL, ATTN_F32, c->B, c->H, c->Lq, c->D);
    float *ob = xcalloc(c->B * c->H * c->Lq * c->D, 4);
    o.data = ob;
    const attn_options opt = options(c, t, ATTN_PATH_FUSED, 2);
    CHECK(ai_params_init(&p, &t->q, &t->k, &t->v, &o, &opt, true) == ATTN_OK, "%s: params: %s",
          c->what, attn_last_error());
    const size_t bytes = ai_mask_summary_bytes(&p);
    void *mem = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    attn_mask_summary s;
    ai_mask_summary_init(&p, mem, &s);
    const bool got = ai_mask_summary_lengths(&p, &s, &out);
    CHECK(got == c->expect, "%s: detector says %d, expected %d", c->what, got, c->expect);
    if (got && c->expect) {
        int bad = 0;
        for (int64_t b = 0; b < c->B; b++) bad += attn_key_len(&out, b) != expected_len(c, b);
        CHECK(bad == 0 && !out.mask && !out.bias, "%s: %d wrong lengths (batch 0: %lld, expected "
              "%lld), mask %p bias %p", c->what, bad, (long long)attn_key_len(&out, 0),
              (long long)expected_len(c, 0), (const void *)out.mask, (const void *)out.bias);
        const bool band = c->expect_causal || c->causal;
        CHECK(out.causal == band && (!c->expect_causal || out.align == ATTN_ALIGN_TOP_LEFT),
              "%s: causal %d align %d, expected causal %d", c->what, out.causal, out.align, band);
    }
    free(mem);
    free(ob);
}

static double *widen(const float *x, int64_t n) {
    double *d = xcalloc(n, sizeof(double));
    for (int64_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

static int64_t count_nan(const float *x, int64_t n) {
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) k += isnan(x[i]) != 0;
    return k;
}

/* the fused forward at 1 and 2 threads and the backward against the reference; where
 * the detector converts, against the kv_len call too, with NaN / Inf past the lengths */
static void check_end_to_end(const lcase *c, ltensors *t) {
    const int64_t B = c->B, H = c->H, Lq = c->Lq, Lk = c->Lk, D = c->D;
    const int64_t no = B * H * Lq * D, nl = B * H * Lq, nkv = B * H * Lk * D;
    if (c->expect)  /* keys past every row's length: the converted call must not read them */
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = expected_len(c, b); j < Lk; j++)
                for (int64_t h = 0; h < H; h++)
                    for (int64_t d = 0; d < D; d++) {
                        const int64_t x = ((b * H + h) * Lk + j) * D + d;
                        t->kb[x] = d % 2 ? NAN : INFINITY;
                        t->vb[x] = NAN;
                    }
    float *o[4], *lse[4];
    const attn_path path[4] = {ATTN_PATH_REFERENCE, ATTN_PATH_FUSED, ATTN_PATH_FUSED, ATTN_PATH_FUSED};
    const int threads[4] = {1, 1, 2, 2};
    for (int x = 0; x < 4; x++) {
        o[x] = xcalloc(no, 4), lse[x] = xcalloc(nl, 4);
        attn_tensor to = attn_tensor_4d(o[x], ATTN_F32, B, H, Lq, D);
        attn_tensor tl = attn_tensor_4d(lse[x], ATTN_F32, B, H, Lq, 1);
        attn_options opt = options(c, t, path[x], threads[x]);
        opt.lse = &tl;
        attn_tensor kvl = {NULL, ATTN_I64, {B, 1, 1, 1}, {1, 1, 1, 1}};
        int64_t lens[8];
        if (x == 3) {  // the same call as kv_len (and causal), without mask and bias
            if (!c->expect) continue;
            for (int64_t b = 0; b < B; b++) lens[b] = expected_len(c, b);
            kvl.data = lens;
            opt.mask = NULL, opt.bias = NULL, opt.kv_len = &kvl;
            if (c->expect_causal) opt.causal = true, opt.align = ATTN_ALIGN_TOP_LEFT;
        }
        const attn_status st = attn_forward(&t->q, &t->k, &t->v, &to, &opt);
        CHECK(st == ATTN_OK, "%s: forward %d status %d (%s)", c->what, x, st, attn_last_error());
    }
    tol_result tr;
    double *ro = widen(o[0], no), *rl = widen(lse[0], nl);
    CHECK(within_f32_tol(o[1], ro, no, &tr), "%s: O rel %.3g max %.3g, %d non-finite mismatches",
          c->what, tr.rel_err, tr.max_err, tr.nonfinite_mismatch);
    double *mag = xcalloc(nl, sizeof(double));
    {
        attn_options opt = options(c, t, ATTN_PATH_FUSED, 1);
        oracle_logit_mag(&t->q, &t->k, &opt, mag);
    }
    CHECK(within_lse_tol(lse[1], rl, mag, nl, D, Lk, &tr), "%s: LSE error %.3g (%.3g of the "
          "bound), %d non-finite mismatches", c->what, tr.max_err, tr.rel_err, tr.nonfinite_mismatch);
    free(mag);
    CHECK(!memcmp(o[1], o[2], (size_t)no * 4) && !memcmp(lse[1], lse[2], (size_t)nl * 4),
          "%s: 1 and 2 threads differ", c->what);
    if (c->expect) {
        CHECK(!memcmp(o[1], o[3], (size_t)no * 4) && !memcmp(lse[1], lse[3], (size_t)nl * 4),
              "%s: not the bits of the kv_len call", c->what);
        CHECK(count_nan(o[1], no) == 0, "%s: NaN in O from keys past the lengths", c->what);
    }
    /* the gradients from the fused forward's O and LSE, both paths */
    rng_t r = {(uint64_t)(no + 17)};
    float *dob = xcalloc(no, 4), *g[2][3];
    for (int64_t x = 0; x < no; x++) dob[x] = (float)rng_range(&r, -1, 1);
    attn_tensor d_o = attn_tensor_4d(dob, ATTN_F32, B, H, Lq, D);
    attn_tensor to = attn_tensor_4d(o[1], ATTN_F32, B, H, Lq, D);
    attn_tensor tl = attn_tensor_4d(lse[1], ATTN_F32, B, H, Lq, 1);
    for (int x = 0; x < 2; x++) {
        g[x][0] = xcalloc(no, 4), g[x][1] = xcalloc(nkv, 4), g[x][2] = xcalloc(nkv, 4);
        attn_tensor dq = attn_tensor_4d(g[x][0], ATTN_F32, B, H, Lq, D);
        attn_tensor dk = attn_tensor_4d(g[x][1], ATTN_F32, B, H, Lk, D);
        attn_tensor dv = attn_tensor_4d(g[x][2], ATTN_F32, B, H, Lk, D);
        attn_options opt = options(c, t, x ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED, 2);
        const attn_status st = attn_backward(&t->q, &t->k, &t->v, &to, &d_o, &tl, &dq, &dk, &dv, &opt);
        CHECK(st == ATTN_OK, "%s: backward status %d (%s)", c->what, st, attn_last_error());
    }
    static const char *const names[3] = {"dQ", "dK", "dV"};
    const int64_t n[3] = {no, nkv, nkv};
    for (int x = 0; x < 3; x++) {
        double *ref = widen(g[1][x], n[x]);
        /* the reference multiplies a masked key's NaN by 0 nowhere either: its dK, dV there
         * are 0, as the fused path's */
        CHECK(within_f32_tol(g[0][x], ref, n[x], &tr), "%s: %s rel %.3g max %.3g, %d non-finite "
              "mismatches", c->what, names[x], tr.rel_err, tr.max_err, tr.nonfinite_mismatch);
        free(ref), free(g[0][x]), free(g[1][x]);
    }
    free(dob), free(ro), free(rl);
    for (int x = 0; x < 4; x++) free(o[x]), free(lse[x]);
}

int main(void) {
    const attn_align TL = ATTN_ALIGN_TOP_LEFT, BR = ATTN_ALIGN_BOTTOM_RIGHT;
    /* what, B H Lq Lk D, form shape spoil, bias both causal align kvlen window, expect, causal */
    const lcase cases[] = {
        {"bool [B,1,L,L] padding", 4, 2, 199, 199, 32, F_PAD, SH_BLL, SP_NONE, .expect = true},
        {"bool [B,1,1,L] padding", 4, 2, 70, 150, 16, F_PAD, SH_B11L, SP_NONE, .expect = true},
        {"bool [B,H,L,L] padding", 4, 3, 65, 130, 16, F_PAD, SH_BHLL, SP_NONE, .expect = true},
        {"bool padding, keys strided", 4, 2, 40, 90, 16, F_PAD, SH_KEYS_STRIDED, SP_NONE, .expect = true},
        {"bool padding, kept bytes of 7", 4, 2, 40, 90, 16, F_PAD, SH_BLL, SP_BYTE7, .expect = true},
        {"0/-inf bias [B,1,L,L] padding", 4, 2, 199, 199, 32, F_PAD, SH_BLL, SP_NONE, .bias = true, .expect = true},
        {"0/-inf bias [B,1,1,L] padding", 4, 2, 5, 300, 16, F_PAD, SH_B11L, SP_NONE, .bias = true, .expect = true},
        {"bool padding & causal", 4, 2, 130, 130, 16, F_PAD_CAUSAL, SH_BLL, SP_NONE, .expect = true, .expect_causal = true},
        {"bias padding & causal", 4, 2, 130, 130, 16, F_PAD_CAUSAL, SH_BLL, SP_NONE, .bias = true, .expect = true, .expect_causal = true},
        {"bool causal alone [1,1,Lq,Lk], Lq < Lk", 3, 2, 37, 100, 16, F_CAUSAL, SH_11LL, SP_NONE, .expect = true, .expect_causal = true},
        {"bool [B,1,1,L] padding + causal option", 4, 2, 90, 90, 16, F_PAD, SH_B11L, SP_NONE, .causal = true, .expect = true},
        {"bool padding + window", 4, 2, 90, 90, 16, F_PAD, SH_BLL, SP_NONE, .window = true, .expect = true},
        {"bool padding & causal + window", 4, 2, 90, 90, 16, F_PAD_CAUSAL, SH_BLL, SP_NONE, .window = true, .expect = true, .expect_causal = true},
        {"bool padding + kv_len", 4, 2, 60, 120, 16, F_PAD, SH_BLL, SP_NONE, .kvlen = true, .expect = true},
        {"bool and bias, other lengths", 4, 2, 60, 120, 16, F_PAD, SH_BLL, SP_NONE, .both = true, .expect = true},
        {"bool padding, bottom-right, no band", 4, 2, 30, 120, 16, F_PAD, SH_BLL, SP_NONE, .align = BR, .expect = true},
        /* refused: the summary path */
        {"bool padding + bottom-right causal", 4, 2, 30, 120, 16, F_PAD, SH_BLL, SP_NONE, .causal = true, .align = BR},
        {"bool padding, one kept key past it", 4, 2, 70, 150, 16, F_PAD, SH_BLL, SP_KEEP_FAR, .expect = false},
        {"bool padding, one masked key in it", 4, 2, 70, 150, 16, F_PAD, SH_BLL, SP_DROP_IN, .expect = false},
        {"bool [B,1,1,L] padding, one kept key past it", 4, 2, 70, 150, 16, F_PAD, SH_B11L, SP_KEEP_FAR, .expect = false},
        {"bool [B,H,L,L], one head unlike", 4, 3, 65, 130, 16, F_PAD, SH_BHLL, SP_HEAD, .expect = false},
        {"bool padding & causal, one kept key above the band", 4, 2, 130, 130, 16, F_PAD_CAUSAL, SH_BLL, SP_ABOVE_BAND, .expect = false},
        {"bool padding beside causal batches", 4, 2, 130, 130, 16, F_PAD_CAUSAL, SH_BLL, SP_MIXED, .expect = false},
        {"bias padding, NaN past it", 4, 2, 70, 150, 16, F_PAD, SH_BLL, SP_NAN, .bias = true},
        {"bias padding, +inf past it", 4, 2, 70, 150, 16, F_PAD, SH_BLL, SP_INF, .bias = true},
        {"bias padding, 0.5 past it", 4, 2, 70, 150, 16, F_PAD, SH_BLL, SP_VALUE, .bias = true},
    };
    (void)TL;
    int n = 0;
    for (size_t x = 0; x < sizeof cases / sizeof cases[0]; x++) {
        const lcase *c = &cases[x];
        ltensors t;
        build(c, &t);
        check_detector(c, &t);
        check_end_to_end(c, &t);
        free(t.qb), free(t.kb), free(t.vb), free(t.mb), free(t.fb);
        n++;
    }
    printf("mask_lengths: %d cases\n", n);
    return check_summary("mask_lengths");
}
