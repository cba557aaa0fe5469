/*
 * test_masks.c — bool masks and float biases by their structure: the fused path (which
 *                summarizes them once per call and skips, narrows or cleans tiles by that
 *                summary, src/forward/mask_summary.c) against the float64 reference path.
 *
 * What it covers: masks of every broadcast shape ([B, Hq, Lq, Lk], [B, 1, Lq, Lk],
 * [B, 1, 1, Lk], stride-0 expanded views, [1, 1, Lq, Lk]) and structure (key padding per
 * batch, left padding, causal bands, causal with padding, block-sparse, random, all
 * masked, and each of the structured ones broken by a single entry — a kept key far past
 * a padding prefix, one masked key inside it, one kept key above a causal band), as bool
 * masks, as 0 / -inf biases, as biases with other values, and as a bool mask with NaN in
 * the bias at its masked cells; NaN in the bias where it is kept (the row must be NaN);
 * -inf everywhere; NaN in K and V at masked keys; O, LSE and the weights, on blocks of
 * 64 rows, stacked heads (Lq < 64) and key-split decoding rows (Lk >= 2048); the
 * gradients of attn_backward for the same masks; bit identity over thread counts.
 * What it is not: the broad matrix of options (test_forward.c, test_backward.c). The
 * kernel is chosen by ATTN_ISA, as for the other suites.
 */
#include "attn.h"
#include "check.h"
#include "oracle.h"

enum {
    P_PAD, P_LEFTPAD, P_CAUSAL, P_CAUSAL_PAD, P_BLOCKS, P_RANDOM, P_NONE, P_ALL,
    P_COUNT
};
static const char *const k_pattern[P_COUNT] = {"padding", "left padding", "causal",
                                               "causal+padding", "blocks", "random",
                                               "all masked", "all open"};
/* how one structured pattern is broken, or not */
enum { X_NONE, X_KEEP_FAR, X_DROP_IN, X_COUNT };
static const char *const k_exception[X_COUNT] = {"", ", one kept key past it", ", one masked key in it"};
/* the tensor's broadcast form */
enum { S_FULL, S_NOHEAD, S_KEYS, S_EXPANDED, S_SHARED, S_COUNT };
static const char *const k_shape[S_COUNT] = {"[B,H,Lq,Lk]", "[B,1,Lq,Lk]", "[B,1,1,Lk]",
                                             "expanded [B,H,Lq,Lk] of [B,1,1,Lk]", "[1,1,Lq,Lk]"};
/* what carries the pattern */
enum { K_BOOL, K_BIAS01, K_BIASVAL, K_BOOL_NANBIAS, K_COUNT };
static const char *const k_kind[K_COUNT] = {"bool", "0/-inf bias", "valued bias",
                                            "bool + NaN bias where masked"};

typedef struct mcase {
    int64_t B, Hq, Hkv, Lq, Lk, D;
    int pattern, exception, shape, kind;
    bool weights, backward;
    uint64_t seed;
} mcase;

/* whether cell (b, h, i, j) of the pattern is kept */
static bool keep(const mcase *c, const int64_t *len, int64_t b, int64_t i, int64_t j, rng_t *r) {
    const int64_t n = len[b];
    switch (c->pattern) {
    case P_PAD: return j < n;
    case P_LEFTPAD: return j >= c->Lk - n;
    case P_CAUSAL: return j <= i;
    case P_CAUSAL_PAD: return j <= i && j < n;
    case P_BLOCKS: return ((i / 64 + j / 32 + b) % 3 == 0) || ((i / 64 + j / 32) % 5 == 1 && rng_unif(r) < 0.5);
    case P_RANDOM: return rng_unif(r) < 0.5;
    case P_NONE: return false;
    default: return true;
    }
}

typedef struct mtensors {
    attn_tensor q, k, v, o, mask, bias, lse, weights, kvlen;
    float *qb, *kb, *vb, *ob, *biasb, *lseb, *wb;
    uint8_t *maskb;
    int64_t cells;
} mtensors;

/* the shape and strides of the mask / bias view, over `cells` stored cells */
static attn_tensor mask_view(const mcase *c, void *data, attn_dtype dt, int64_t *cells) {
    const int64_t B = c->B, H = c->Hq, Lq = c->Lq, Lk = c->Lk;
    attn_tensor t = {data, dt, {B, H, Lq, Lk}, {H * Lq * Lk, Lq * Lk, Lk, 1}};
    switch (c->shape) {
    case S_NOHEAD: t.shape[1] = 1, t.stride[0] = Lq * Lk, t.stride[1] = 0; *cells = B * Lq * Lk; break;
    case S_KEYS: t.shape[1] = t.shape[2] = 1, t.stride[0] = Lk, t.stride[1] = t.stride[2] = 0; *cells = B * Lk; break;
    case S_EXPANDED: t.stride[0] = Lk, t.stride[1] = t.stride[2] = 0; *cells = B * Lk; break;
    case S_SHARED: t.shape[0] = t.shape[1] = 1, t.stride[0] = t.stride[1] = 0; *cells = Lq * Lk; break;
    default: *cells = B * H * Lq * Lk;
    }
    return t;
}

/* Builds q, k, v in [B, L, H, D] storage, the mask or bias of the case, the outputs. */
static void build(const mcase *c, mtensors *t) {
    rng_t r = {c->seed};
    const int64_t B = c->B, Hq = c->Hq, Hkv = c->Hkv, Lq = c->Lq, Lk = c->Lk, D = c->D;
    *t = (mtensors){0};
    t->qb = xcalloc(B * Lq * Hq * D, 4);
    t->kb = xcalloc(B * Lk * Hkv * D, 4);
    t->vb = xcalloc(B * Lk * Hkv * D, 4);
    t->ob = xcalloc(B * Hq * Lq * D, 4);
    t->lseb = xcalloc(B * Hq * Lq, 4);
    t->wb = xcalloc(c->weights ? B * Hq * Lq * Lk : 1, 4);
    for (int64_t x = 0; x < B * Lq * Hq * D; x++) t->qb[x] = (float)rng_range(&r, -1, 1);
    for (int64_t x = 0; x < B * Lk * Hkv * D; x++) t->kb[x] = (float)rng_range(&r, -1, 1);
    for (int64_t x = 0; x < B * Lk * Hkv * D; x++) t->vb[x] = (float)rng_range(&r, -1, 1);
    t->q = (attn_tensor){t->qb, ATTN_F32, {B, Hq, Lq, D}, {Lq * Hq * D, D, Hq * D, 1}};
    t->k = (attn_tensor){t->kb, ATTN_F32, {B, Hkv, Lk, D}, {Lk * Hkv * D, D, Hkv * D, 1}};
    t->v = (attn_tensor){t->vb, ATTN_F32, {B, Hkv, Lk, D}, {Lk * Hkv * D, D, Hkv * D, 1}};
    t->o = attn_tensor_4d(t->ob, ATTN_F32, B, Hq, Lq, D);
    t->lse = attn_tensor_4d(t->lseb, ATTN_F32, B, Hq, Lq, 1);
    t->weights = attn_tensor_4d(t->wb, ATTN_F32, B, Hq, Lq, Lk);

    /* key lengths: 0, Lk and values between, one per batch */
    int64_t len[8];
    for (int64_t b = 0; b < B; b++)
        len[b] = b == 0 ? (Lk > 3 ? Lk / 3 : 1) : b == 1 ? Lk : b == 2 ? 0 : 1 + rng_int(&r, Lk);
    const bool is_bool = c->kind == K_BOOL || c->kind == K_BOOL_NANBIAS;
    attn_tensor view = mask_view(c, NULL, ATTN_BOOL, &t->cells);
    uint8_t *kept = xcalloc(t->cells, 1);
    int64_t at = 0;
    const int64_t nb = view.stride[0] ? B : 1, nh = view.stride[1] ? Hq : 1, nq = view.stride[2] ? Lq : 1;
    for (int64_t b = 0; b < nb; b++)
        for (int64_t h = 0; h < nh; h++)
            for (int64_t i = 0; i < nq; i++)
                for (int64_t j = 0; j < Lk; j++) kept[at++] = keep(c, len, b, i, j, &r);
    /* the single entry that breaks the structure: in the last stored row of batch 0 */
    const int64_t row0 = nh * nq - 1, n0 = len[0];
    if (c->exception == X_KEEP_FAR) kept[row0 * Lk + Lk - 1 - (Lk > 40 ? 17 : 0)] = 1;
    if (c->exception == X_DROP_IN && n0 > 2) kept[row0 * Lk + n0 / 2] = 0;
    if (is_bool) {
        t->maskb = kept;
        t->mask = mask_view(c, kept, ATTN_BOOL, &t->cells);
    }
    if (c->kind != K_BOOL) {
        t->biasb = xcalloc(t->cells, 4);
        for (int64_t x = 0; x < t->cells; x++) {
            const float val = c->kind == K_BIASVAL ? (float)rng_range(&r, -2, 2) : 0.0f;
            t->biasb[x] = c->kind == K_BOOL_NANBIAS ? (kept[x] ? val : NAN)
                                                    : (kept[x] ? val : -INFINITY);
        }
        t->bias = mask_view(c, t->biasb, ATTN_F32, &t->cells);
    }
    if (!is_bool) free(kept);
}

static void release(mtensors *t) {
    free(t->qb), free(t->kb), free(t->vb), free(t->ob), free(t->lseb), free(t->wb);
    free(t->maskb), free(t->biasb);
}

typedef struct result {
    float *o, *lse, *w;
    attn_status st;
} result;

static result run(const mcase *c, mtensors *t, attn_path path, int threads) {
    attn_options opt = {.path = path, .threads = threads};
    opt.mask = t->maskb ? &t->mask : NULL;
    opt.bias = t->biasb ? &t->bias : NULL;
    opt.lse = &t->lse;
    opt.weights = c->weights ? &t->weights : NULL;
    const int64_t no = c->B * c->Hq * c->Lq * c->D, nl = c->B * c->Hq * c->Lq;
    const int64_t nw = c->weights ? nl * c->Lk : 0;
    result r = {xcalloc(no, 4), xcalloc(nl, 4), xcalloc(nw, 4), ATTN_OK};
    r.st = attn_forward(&t->q, &t->k, &t->v, &t->o, &opt);
    memcpy(r.o, t->ob, (size_t)no * 4);
    memcpy(r.lse, t->lseb, (size_t)nl * 4);
    if (nw) memcpy(r.w, t->wb, (size_t)nw * 4);
    return r;
}

static void describe(const mcase *c, char *out, size_t n) {
    snprintf(out, n, "%s%s as %s %s, B=%lld Hq=%lld Hkv=%lld Lq=%lld Lk=%lld D=%lld%s",
             k_pattern[c->pattern], k_exception[c->exception], k_kind[c->kind], k_shape[c->shape],
             (long long)c->B, (long long)c->Hq, (long long)c->Hkv, (long long)c->Lq,
             (long long)c->Lk, (long long)c->D, c->weights ? " +weights" : "");
}

/* the float32 tolerance against a float32 copy of the float64 reference's output: the
 * reference rounds once, so its O is within half an ulp of the exact value */
static int close_to(const float *got, const float *ref, int64_t n, tol_result *tr) {
    double *d = xcalloc(n, sizeof(double));
    for (int64_t x = 0; x < n; x++) d[x] = ref[x];
    const int ok = within_f32_tol(got, d, n, tr);
    free(d);
    return ok;
}

static int64_t count_nan(const float *x, int64_t n) {
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) k += isnan(x[i]) != 0;
    return k;
}

/* The gradients of the case on both paths, from the fused forward's O and LSE (in t). */
static void check_backward(const mcase *c, mtensors *t, const char *what) {
    const int64_t B = c->B, Hq = c->Hq, Hkv = c->Hkv, Lq = c->Lq, Lk = c->Lk, D = c->D;
    rng_t r = {c->seed ^ 0x5bd1e995u};
    float *dob = xcalloc(B * Hq * Lq * D, 4), *g[2][3];
    for (int64_t x = 0; x < B * Hq * Lq * D; x++) dob[x] = (float)rng_range(&r, -1, 1);
    attn_tensor d_o = attn_tensor_4d(dob, ATTN_F32, B, Hq, Lq, D);
    for (int path = 0; path < 2; path++) {
        g[path][0] = xcalloc(B * Hq * Lq * D, 4);
        g[path][1] = xcalloc(B * Hkv * Lk * D, 4);
        g[path][2] = xcalloc(B * Hkv * Lk * D, 4);
        attn_tensor dq = attn_tensor_4d(g[path][0], ATTN_F32, B, Hq, Lq, D);
        attn_tensor dk = attn_tensor_4d(g[path][1], ATTN_F32, B, Hkv, Lk, D);
        attn_tensor dv = attn_tensor_4d(g[path][2], ATTN_F32, B, Hkv, Lk, D);
        attn_options opt = {.path = path ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED};
        opt.mask = t->maskb ? &t->mask : NULL;
        opt.bias = t->biasb ? &t->bias : NULL;
        const attn_status st = attn_backward(&t->q, &t->k, &t->v, &t->o, &d_o, &t->lse, &dq, &dk,
                                             &dv, &opt);
        CHECK(st == ATTN_OK, "%s: backward status %d (%s)", what, st, attn_last_error());
    }
    static const char *const names[3] = {"dQ", "dK", "dV"};
    const int64_t n[3] = {B * Hq * Lq * D, B * Hkv * Lk * D, B * Hkv * Lk * D};
    for (int x = 0; x < 3; x++) {
        tol_result tr;
        CHECK(close_to(g[0][x], g[1][x], n[x], &tr), "%s: %s rel %.3g max %.3g, %d non-finite "
              "mismatches", what, names[x], tr.rel_err, tr.max_err, tr.nonfinite_mismatch);
        free(g[0][x]), free(g[1][x]);
    }
    free(dob);
}

/* One case on the fused path against the reference; returns the number of failures. */
static int check_case(const mcase *c) {
    char what[256];
    describe(c, what, sizeof what);
    mtensors t;
    build(c, &t);
    const int before = g_fail;
    result ref = run(c, &t, ATTN_PATH_REFERENCE, 0);
    result f1 = run(c, &t, ATTN_PATH_FUSED, 1);
    result f2 = run(c, &t, ATTN_PATH_FUSED, 2);
    const int64_t no = c->B * c->Hq * c->Lq * c->D, nl = c->B * c->Hq * c->Lq;
    CHECK(ref.st == ATTN_OK && f1.st == ATTN_OK && f2.st == ATTN_OK, "%s: status %d %d %d", what,
          ref.st, f1.st, f2.st);
    tol_result tr;
    CHECK(close_to(f1.o, ref.o, no, &tr), "%s: O rel %.3g max %.3g, %d non-finite mismatches", what,
          tr.rel_err, tr.max_err, tr.nonfinite_mismatch);
    CHECK(close_to(f1.lse, ref.lse, nl, &tr), "%s: LSE rel %.3g max %.3g, %d non-finite mismatches",
          what, tr.rel_err, tr.max_err, tr.nonfinite_mismatch);
    if (c->weights)
        CHECK(close_to(f1.w, ref.w, nl * c->Lk, &tr), "%s: weights rel %.3g max %.3g, %d non-finite "
              "mismatches", what, tr.rel_err, tr.max_err, tr.nonfinite_mismatch);
    CHECK(!memcmp(f1.o, f2.o, (size_t)no * 4) && !memcmp(f1.lse, f2.lse, (size_t)nl * 4),
          "%s: 1 and 2 threads differ", what);
    if (c->kind == K_BOOL_NANBIAS)
        CHECK(count_nan(f1.o, no) == 0, "%s: NaN reached O from masked cells", what);
    if (c->backward) check_backward(c, &t, what);  // t.o and t.lse: the last fused call's
    free(ref.o), free(ref.lse), free(ref.w), free(f1.o), free(f1.lse), free(f1.w);
    free(f2.o), free(f2.lse), free(f2.w);
    release(&t);
    return g_fail - before;
}

/* ---- the matrix -------------------------------------------------------------------------- */

typedef struct shape_t {
    int64_t B, Hq, Hkv, Lq, Lk, D;
} shape_t;

static void matrix(void) {
    static const shape_t shapes[] = {
        {4, 1, 1, 130, 260, 16},  // 64-row blocks, several key tiles
        {4, 4, 2, 5, 200, 32},    // stacked heads (Lq < 64)
        {4, 2, 1, 70, 17, 8},     // fewer keys than a tile
        {3, 2, 2, 1, 2500, 16},   // decoding: the keys split into chunks
        {4, 2, 2, 199, 199, 32},  // the sentence-embedding shape, smaller B and H
    };
    uint64_t seed = 77;
    int cases = 0, failed = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int pat = 0; pat < P_COUNT; pat++)
            for (int ex = 0; ex < X_COUNT; ex++) {
                const bool structured = pat == P_PAD || pat == P_LEFTPAD || pat == P_CAUSAL ||
                                        pat == P_CAUSAL_PAD;
                if (ex != X_NONE && !structured) continue;
                for (int sh = 0; sh < S_COUNT; sh++) {
                    /* patterns that vary along the rows need the rows */
                    const bool rows = pat == P_CAUSAL || pat == P_CAUSAL_PAD || pat == P_BLOCKS;
                    if (rows && (sh == S_KEYS || sh == S_EXPANDED)) continue;
                    for (int kind = 0; kind < K_COUNT; kind++) {
                        /* the exceptions and the rarer kinds on the two row-wise shapes */
                        if ((ex != X_NONE || kind >= K_BIASVAL) && sh != S_NOHEAD && sh != S_KEYS &&
                            !(rows && sh == S_FULL))
                            continue;
                        const shape_t s = shapes[si];
                        mcase c = {s.B, s.Hq, s.Hkv, s.Lq, s.Lk, s.D, pat, ex, sh, kind,
                                   .seed = seed++};
                        /* the weights on part of the matrix (they cost Lq x Lk each) */
                        c.weights = s.Lk <= 300 && (sh + kind + pat) % 3 == 0;
                        c.backward = s.Lq > 1 && (sh + kind + pat + ex) % 3 == 1;
                        if (test_case_skipped()) continue;  // ATTN_TEST_EVERY (check.h)
                        cases++;
                        failed += check_case(&c) > 0;
                    }
                }
            }
    printf("masks: matrix %d cases, %d failing\n", cases, failed);
}

/* ---- the cases beside the matrix ---------------------------------------------------------- */

/* NaN in the bias where it is kept (one cell, past a padding prefix in a tile otherwise
 * masked): the row that reads it is NaN on both paths, no other row. */
static void nan_kept(void) {
    mcase c = {2, 2, 2, 100, 300, 16, P_PAD, X_NONE, S_NOHEAD, K_BIAS01, .seed = 5};
    mtensors t;
    build(&c, &t);
    t.biasb[0 * c.Lq * c.Lk + 7 * c.Lk + 250] = NAN;  // batch 0 (length 100), row 7, key 250
    result ref = run(&c, &t, ATTN_PATH_REFERENCE, 0), f = run(&c, &t, ATTN_PATH_FUSED, 0);
    const int64_t no = c.B * c.Hq * c.Lq * c.D;
    tol_result tr;
    CHECK(close_to(f.o, ref.o, no, &tr), "NaN kept in a bias: O differs (%d non-finite)",
          tr.nonfinite_mismatch);
    CHECK(count_nan(f.o, no) == 2 * c.D, "NaN kept in a bias: %lld NaN in O, expected %lld "
          "(row 7 of both heads)", (long long)count_nan(f.o, no), (long long)(2 * c.D));
    free(ref.o), free(ref.lse), free(ref.w), free(f.o), free(f.lse), free(f.w);
    release(&t);
}

/* -inf everywhere, and NaN in K and V at masked keys: O = 0, LSE = -inf / finite rows. */
static void inf_and_nan(void) {
    for (int kind = K_BOOL; kind <= K_BIAS01; kind++) {
        mcase c = {3, 2, 2, 80, 260, 16, P_NONE, X_NONE, S_NOHEAD, kind, .weights = true, .seed = 9};
        mtensors t;
        build(&c, &t);
        result f = run(&c, &t, ATTN_PATH_FUSED, 0);
        const int64_t no = c.B * c.Hq * c.Lq * c.D, nl = c.B * c.Hq * c.Lq;
        int bad = 0;
        for (int64_t x = 0; x < no; x++) bad += f.o[x] != 0.0f;
        for (int64_t x = 0; x < nl; x++) bad += f.lse[x] != -INFINITY;
        for (int64_t x = 0; x < nl * c.Lk; x++) bad += f.w[x] != 0.0f;
        CHECK(f.st == ATTN_OK && bad == 0, "%s masking everything: %d wrong values", k_kind[kind], bad);
        free(f.o), free(f.lse), free(f.w);
        release(&t);
    }
    /* padding as a bias, NaN and +inf stored in K and V past each batch's length */
    for (int kind = K_BOOL; kind <= K_BIAS01; kind++) {
        mcase c = {4, 2, 2, 90, 300, 16, P_PAD, X_NONE, S_KEYS, kind, .seed = 11};
        mtensors t;
        build(&c, &t);
        for (int64_t b = 0; b < c.B; b++)
            for (int64_t j = 0; j < c.Lk; j++) {
                const int64_t x = b * c.Lk + j;
                const bool masked = kind == K_BOOL ? !t.maskb[x] : t.biasb[x] == -INFINITY;
                if (!masked) continue;
                for (int64_t d = 0; d < c.Hkv * c.D; d++) {
                    t.kb[(b * c.Lk + j) * c.Hkv * c.D + d] = d % 2 ? NAN : INFINITY;
                    t.vb[(b * c.Lk + j) * c.Hkv * c.D + d] = NAN;
                }
            }
        result ref = run(&c, &t, ATTN_PATH_REFERENCE, 0), f = run(&c, &t, ATTN_PATH_FUSED, 0);
        const int64_t no = c.B * c.Hq * c.Lq * c.D;
        tol_result tr;
        CHECK(close_to(f.o, ref.o, no, &tr) && count_nan(f.o, no) == 0 && count_nan(ref.o, no) == 0,
              "%s padding with NaN/Inf K, V at masked keys: O differs or NaN (%lld, reference %lld)",
              k_kind[kind], (long long)count_nan(f.o, no), (long long)count_nan(ref.o, no));
        free(ref.o), free(ref.lse), free(ref.w), free(f.o), free(f.lse), free(f.w);
        release(&t);
    }
}

int main(void) {
    matrix();
    nan_kept();
    inf_and_nan();
    return check_summary("masks");
}
