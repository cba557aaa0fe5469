/*
 * test_merge.c — attn_merge, the public merge of partial attention results, and the
 *                split-KV decoding path that merges through the same code.
 *
 * What it covers: random splits of the keys into 1 to 64 pieces (empty pieces
 * included), each piece's (O, LSE) from attn_forward over its key range, merged and
 * compared with the float64 oracle over all keys and with one attn_forward call; the
 * contract's totality (empty partials neutral even with NaN in their O, all empty or
 * n = 0 giving O 0 and LSE -inf, NaN and +inf LSE spoiling their row only); in-place
 * merging; 16-bit outputs; bit identity across thread counts; bad arguments refused
 * with nothing written; and the tolerance check shown to reject a planted error.
 * What it is not: a test of attn_forward itself (test_forward.c, test_edge.c).
 */
#include "attn.h"
#include "check.h"
#include "oracle.h"

static float *randn(rng_t *r, int64_t n) {
    float *p = xcalloc(n, sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = (float)rng_normal(r);
    return p;
}

/* k or v rows [a, a + n) of a dense [B, H, Lk, D] tensor, as a view */
static attn_tensor key_range(const attn_tensor *t, int64_t a, int64_t n) {
    attn_tensor v = *t;
    v.data = (float *)t->data + a * t->stride[2];
    v.shape[2] = n;
    return v;
}

/* The merge's float32 error model (docs/CONTRACT.md, "Merging partial results"), for
 * partials taken as exact, n LSEs a_k, m their max, lse the float64 merge's:
 *   lse = m + ln Σ exp(a_k - m): each difference rounded (u |a_k - m|), each exp within
 *   2E u, the sum (n + 1) u (tol_sum_rel), ln's and the final addition's roundings
 *   u (|m| + |lse|) and 2u;
 *   O = Σ O_k exp(a_k - lse): each weight off by the LSE's error, its own subtraction's
 *   u |a_k - lse| and exp's 2E u, then the sum of n products, relative to Σ w_k |O_k|. */
static double merge_lse_bound(int n, const double *a, double lse) {
    double m = -INFINITY, far = 0.0;
    for (int k = 0; k < n; k++) m = fmax(m, a[k]);
    for (int k = 0; k < n; k++)
        if (isfinite(a[k])) far = fmax(far, m - a[k]);
    return TOL_U32 * (far + 2.0 * TOL_EXP_ULP + 2.0) + tol_sum_rel(n) + TOL_U32 * (fabs(m) + fabs(lse));
}
static double merge_o_bound(int n, const double *a, const double *o, double lse) {
    double far = 0.0, size = 0.0;
    for (int k = 0; k < n; k++)
        if (isfinite(a[k])) {
            far = fmax(far, fabs(a[k] - lse));
            size += exp(a[k] - lse) * fabs(o[k]);
        }
    const double w = merge_lse_bound(n, a, lse) + TOL_U32 * (far + 2.0 * TOL_EXP_ULP + 1.0);
    return (w + tol_sum_rel(n) + TOL_U32) * size;
}

typedef struct split_case {
    int64_t B, Hq, Hkv, Lq, Lk, D, pieces;
    float scale;  // 0: the default
} split_case;

/* One random split of the keys, merged; returns 1 when within tolerance of the oracle.
 * plant: add this to one merged element before the comparison. */
static int run_split(rng_t *r, split_case c, float plant, int threads, float *o_out) {
    const int64_t B = c.B, Hq = c.Hq, Hkv = c.Hkv, Lq = c.Lq, Lk = c.Lk, D = c.D, n = c.pieces;
    float *q = randn(r, B * Hq * Lq * D), *k = randn(r, B * Hkv * Lk * D), *v = randn(r, B * Hkv * Lk * D);
    if (c.scale != 0.0f) {
        /* large logits exact in float32, as the contract has large-logit tests: q and k
         * multiples of 1/16 (|x| < 9, D <= 40: every partial sum of q·k exact in any
         * order) and the scale a power of 2. Rounded logits near 100 carry errors of
         * 100 · 2^-24 each, which alone move O by more than 1e-6 on some kernels (the
         * generic one failed 2 of these cases). */
        for (int64_t i = 0; i < B * Hq * Lq * D; i++) q[i] = roundf(q[i] * 16.0f) / 16.0f;
        for (int64_t i = 0; i < B * Hkv * Lk * D; i++) k[i] = roundf(k[i] * 16.0f) / 16.0f;
    }
    attn_tensor tq = attn_tensor_4d(q, ATTN_F32, B, Hq, Lq, D);
    attn_tensor tk = attn_tensor_4d(k, ATTN_F32, B, Hkv, Lk, D);
    attn_tensor tv = attn_tensor_4d(v, ATTN_F32, B, Hkv, Lk, D);
    attn_options opt = {.has_scale = c.scale != 0.0f, .scale = c.scale};
    /* cut points: n - 1 random positions in [0, Lk], sorted; repeats give empty pieces */
    int64_t *cut = xcalloc(n + 1, sizeof(int64_t));
    cut[0] = 0;
    cut[n] = Lk;
    for (int64_t i = 1; i < n; i++) cut[i] = rng_int(r, Lk + 1);
    for (int64_t i = 1; i < n; i++)
        for (int64_t j = i; j > 1 && cut[j] < cut[j - 1]; j--) {
            int64_t x = cut[j]; cut[j] = cut[j - 1]; cut[j - 1] = x;
        }
    const int64_t on = B * Hq * Lq * D, ln = B * Hq * Lq;
    float *po = xcalloc(n * on, sizeof(float)), *pl = xcalloc(n * ln, sizeof(float));
    attn_tensor *to = xcalloc(n, sizeof(attn_tensor)), *tl = xcalloc(n, sizeof(attn_tensor));
    int ok = 1;
    for (int64_t i = 0; i < n; i++) {
        to[i] = attn_tensor_4d(po + i * on, ATTN_F32, B, Hq, Lq, D);
        tl[i] = attn_tensor_4d(pl + i * ln, ATTN_F32, B, Hq, Lq, 1);
        attn_tensor ki = key_range(&tk, cut[i], cut[i + 1] - cut[i]);
        attn_tensor vi = key_range(&tv, cut[i], cut[i + 1] - cut[i]);
        attn_options oi = opt;
        oi.lse = &tl[i];
        ok &= attn_forward(&tq, &ki, &vi, &to[i], &oi) == ATTN_OK;
    }
    float *mo = xcalloc(on, sizeof(float)), *ml = xcalloc(ln, sizeof(float));
    attn_tensor tmo = attn_tensor_4d(mo, ATTN_F32, B, Hq, Lq, D);
    attn_tensor tml = attn_tensor_4d(ml, ATTN_F32, B, Hq, Lq, 1);
    ok &= attn_merge(n, to, tl, &tmo, &tml, threads) == ATTN_OK;
    mo[on / 2] += plant;
    if (o_out) memcpy(o_out, mo, (size_t)on * sizeof(float));

    double *ro = xcalloc(on, sizeof(double)), *rl = xcalloc(ln, sizeof(double));
    oracle_forward(&tq, &tk, &tv, &opt, ro, rl, NULL);
    tol_result tr, tr2;
    ok &= within_f32_tol(mo, ro, on, &tr);
    double *mag = xcalloc(ln, sizeof(double));  // each part adds an exp and a sum to the row
    oracle_logit_mag(&tq, &tk, &opt, mag);
    ok &= within_lse_tol(ml, rl, mag, ln, tq.shape[3], tk.shape[2] + n, &tr2);
    free(mag);
    /* and beside one call over all keys */
    float *fo = xcalloc(on, sizeof(float));
    attn_tensor tfo = attn_tensor_4d(fo, ATTN_F32, B, Hq, Lq, D);
    ok &= attn_forward(&tq, &tk, &tv, &tfo, &opt) == ATTN_OK;
    double *fod = xcalloc(on, sizeof(double));
    for (int64_t i = 0; i < on; i++) fod[i] = fo[i];
    tol_result tr3;
    ok &= within_f32_tol(mo, fod, on, &tr3);
    if (!ok && plant == 0.0f)
        fprintf(stderr, "  split B=%lld Hq=%lld Hkv=%lld Lq=%lld Lk=%lld D=%lld pieces=%lld: "
                "O max %.3g rel %.3g, LSE max %.3g, vs one call max %.3g\n", (long long)B,
                (long long)Hq, (long long)Hkv, (long long)Lq, (long long)Lk, (long long)D,
                (long long)n, tr.max_err, tr.rel_err, tr2.max_err, tr3.max_err);
    free(q); free(k); free(v); free(cut); free(po); free(pl); free(to); free(tl);
    free(mo); free(ml); free(ro); free(rl); free(fo); free(fod);
    return ok;
}

static void test_random_splits(void) {
    rng_t r = {42};
    const int64_t pieces[] = {1, 2, 3, 5, 8, 13, 31, 64};
    int64_t cases = 0;
    for (int t = 0; t < 40; t++) {
        split_case c = {.B = 1 + rng_int(&r, 2), .Hkv = 1 + rng_int(&r, 2), .Lq = 1 + rng_int(&r, 9),
                        .Lk = 1 + rng_int(&r, 300), .D = 1 + rng_int(&r, 40),
                        .pieces = pieces[t % 8]};
        c.Hq = c.Hkv * (1 + rng_int(&r, 3));
        if (t % 5 == 4) c.scale = 8.0f;  // logits near 100: a naive float32 exp overflows
        CHECK(run_split(&r, c, 0.0f, 0, NULL), "random split %d of %lld keys into %lld pieces",
              t, (long long)c.Lk, (long long)c.pieces);
        cases++;
    }
    /* more pieces than keys: most of them empty */
    split_case c = {.B = 1, .Hq = 2, .Hkv = 1, .Lq = 3, .Lk = 10, .D = 8, .pieces = 64};
    CHECK(run_split(&r, c, 0.0f, 0, NULL), "64 pieces over 10 keys");
    /* the same split on 1 and 2 threads: bit-identical */
    split_case d = {.B = 2, .Hq = 4, .Hkv = 2, .Lq = 33, .Lk = 200, .D = 24, .pieces = 7};
    const int64_t on = d.B * d.Hq * d.Lq * d.D;
    float *a = xcalloc(on, sizeof(float)), *b = xcalloc(on, sizeof(float));
    rng_t r1 = {7}, r2 = {7};
    run_split(&r1, d, 0.0f, 1, a);
    run_split(&r2, d, 0.0f, 2, b);
    CHECK(memcmp(a, b, (size_t)on * sizeof(float)) == 0, "merge on 1 and 2 threads differs");
    free(a);
    free(b);
}

/* rows of a [1, 1, L, Dv] pair of partials set by hand */
static void test_totality(void) {
    enum { L = 4, DV = 3, N = 3 };
    float po[N][L][DV], pl[N][L], o[L][DV], l[L];
    attn_tensor to[N], tl[N];
    for (int c = 0; c < N; c++) {
        to[c] = attn_tensor_4d(po[c], ATTN_F32, 1, 1, L, DV);
        tl[c] = attn_tensor_4d(pl[c], ATTN_F32, 1, 1, L, 1);
        for (int i = 0; i < L; i++) {
            pl[c][i] = (float)(c + 1);
            for (int d = 0; d < DV; d++) po[c][i][d] = (float)(c * 10 + d);
        }
    }
    attn_tensor too = attn_tensor_4d(o, ATTN_F32, 1, 1, L, DV), tll = attn_tensor_4d(l, ATTN_F32, 1, 1, L, 1);
    /* row 0: partial 1 empty, with NaN in its O: neutral */
    pl[1][0] = -INFINITY;
    for (int d = 0; d < DV; d++) po[1][0][d] = NAN;
    /* row 1: every partial empty */
    for (int c = 0; c < N; c++) pl[c][1] = -INFINITY;
    /* row 2: a NaN LSE; row 3: a +inf LSE */
    pl[2][2] = NAN;
    pl[0][3] = INFINITY;
    CHECK(attn_merge(N, to, tl, &too, &tll, 1) == ATTN_OK, "merge by hand");
    /* row 0 equals the merge of partials 0 and 2 alone */
    float o2[L][DV], l2[L];
    attn_tensor to2[2] = {to[0], to[2]}, tl2[2] = {tl[0], tl[2]};
    attn_tensor t2 = attn_tensor_4d(o2, ATTN_F32, 1, 1, L, DV), tl2o = attn_tensor_4d(l2, ATTN_F32, 1, 1, L, 1);
    CHECK(attn_merge(2, to2, tl2, &t2, &tl2o, 1) == ATTN_OK, "merge of two");
    CHECK(memcmp(o[0], o2[0], sizeof o[0]) == 0 && l[0] == l2[0], "an empty partial is not neutral");
    CHECK(isfinite(o[0][0]) && isfinite(l[0]), "row 0 not finite");
    /* by hand: LSE = ln(e^1 + e^3), O = (O_0 e^1 + O_2 e^3) / (e^1 + e^3) */
    const double lse0 = log(exp(1.0) + exp(3.0)), w0 = exp(1.0 - lse0), w2 = exp(3.0 - lse0);
    const double a0[2] = {1.0, 3.0}, v0[2] = {1.0, 21.0};
    CHECK(fabs(l[0] - lse0) <= merge_lse_bound(2, a0, lse0) &&
              fabs(o[0][1] - (1.0 * w0 + 21.0 * w2)) <= merge_o_bound(2, a0, v0, lse0),
          "row 0: %.9g %.9g", l[0], o[0][1]);
    CHECK(o[1][0] == 0.0f && o[1][1] == 0.0f && o[1][2] == 0.0f && l[1] == -INFINITY,
          "all empty: O %g LSE %g", o[1][0], l[1]);
    CHECK(isnan(l[2]) && isnan(o[2][0]) && isnan(o[2][2]), "a NaN LSE must spoil its row");
    CHECK(isnan(l[3]) && isnan(o[3][1]), "a +inf LSE gives NaN (inf - inf)");
    CHECK(isfinite(o[0][2]) && isfinite(l[0]), "NaN spread to row 0");
    /* n = 0: O 0, LSE -inf */
    CHECK(attn_merge(0, NULL, NULL, &too, &tll, 0) == ATTN_OK, "n = 0");
    int zero = 1;
    for (int i = 0; i < L; i++) zero &= l[i] == -INFINITY && o[i][0] == 0.0f && o[i][2] == 0.0f;
    CHECK(zero, "n = 0 must give O 0, LSE -inf");
    /* one partial: itself, exactly */
    CHECK(attn_merge(1, &to[2], &tl[2], &too, &tll, 0) == ATTN_OK, "n = 1");
    CHECK(memcmp(o[0], po[2][0], sizeof o[0]) == 0 && l[0] == pl[2][0], "n = 1 is not the identity");
}

static void test_in_place_and_dtypes(void) {
    rng_t r = {99};
    enum { B = 2, H = 3, L = 5, DV = 7 };
    const int64_t on = B * H * L * DV, ln = B * H * L;
    float *po = randn(&r, 2 * on), *pl = randn(&r, 2 * ln);
    /* partial 1 as a permuted view [B, L, H, D] storage */
    attn_tensor to[2] = {attn_tensor_4d(po, ATTN_F32, B, H, L, DV),
                         {po + on, ATTN_F32, {B, H, L, DV}, {L * H * DV, DV, H * DV, 1}}};
    attn_tensor tl[2] = {attn_tensor_4d(pl, ATTN_F32, B, H, L, 1), attn_tensor_4d(pl + ln, ATTN_F32, B, H, L, 1)};
    float *o = xcalloc(on, sizeof(float)), *l = xcalloc(ln, sizeof(float));
    attn_tensor too = attn_tensor_4d(o, ATTN_F32, B, H, L, DV), tll = attn_tensor_4d(l, ATTN_F32, B, H, L, 1);
    CHECK(attn_merge(2, to, tl, &too, &tll, 0) == ATTN_OK, "merge out of place");
    /* the float64 merge by hand */
    int ok = 1;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < L; i++) {
                const double a[2] = {t_f32(&tl[0], b, h, i, 0), t_f32(&tl[1], b, h, i, 0)};
                double m = a[0] > a[1] ? a[0] : a[1], s = exp(a[0] - m) + exp(a[1] - m), lse = m + log(s);
                ok &= fabs(l[(b * H + h) * L + i] - lse) <= merge_lse_bound(2, a, lse);
                for (int64_t d = 0; d < DV; d++) {
                    const double ov[2] = {t_f32(&to[0], b, h, i, d), t_f32(&to[1], b, h, i, d)};
                    double want = ov[0] * exp(a[0] - lse) + ov[1] * exp(a[1] - lse);
                    ok &= fabs(o[((b * H + h) * L + i) * DV + d] - want) <= merge_o_bound(2, a, ov, lse);
                }
            }
    CHECK(ok, "merge of two strided partials against float64 by hand");
    {   /* planted: a merge that misses the second partial's weight by 1e-5 (its LSE
         * 1e-5 off), and one that takes the first partial's LSE for the merged one,
         * are rejected; the bounds are a few ulps of their values */
        const double a[2] = {t_f32(&tl[0], 0, 0, 0, 0), t_f32(&tl[1], 0, 0, 0, 0)};
        const double m = fmax(a[0], a[1]), lse = m + log(exp(a[0] - m) + exp(a[1] - m));
        const double ov[2] = {t_f32(&to[0], 0, 0, 0, 0), t_f32(&to[1], 0, 0, 0, 0)};
        const double want = ov[0] * exp(a[0] - lse) + ov[1] * exp(a[1] - lse);
        const double bad = ov[0] * exp(a[0] - lse) + ov[1] * exp(a[1] - 1e-5 - lse);
        const double ob = merge_o_bound(2, a, ov, lse), lb = merge_lse_bound(2, a, lse);
        CHECK(!(fabs(bad - want) <= ob) || fabs(ov[1] * exp(a[1] - lse)) < 1e-3,
              "planted: a weight 1e-5 off passes the merge's O bound %.3g", ob);
        CHECK(!(fabs(a[0] - lse) <= lb), "planted: partial 0's LSE passes as the merged one");
        CHECK(lb <= 16 * TOL_U32 * (2.0 + fabs(lse) + fabs(m)) && ob <= 16 * TOL_U32 * (fabs(ov[0]) + fabs(ov[1])),
              "the merge's bounds %.3g, %.3g are more than 16 ulps", lb, ob);
    }
    /* in place: the output is partial 0 itself */
    CHECK(attn_merge(2, to, tl, &to[0], &tl[0], 0) == ATTN_OK, "merge in place");
    CHECK(memcmp(po, o, (size_t)on * sizeof(float)) == 0 && memcmp(pl, l, (size_t)ln * sizeof(float)) == 0,
          "in-place merge differs");
    /* 16-bit outputs: the float32 result rounded once */
    uint16_t *h16 = xcalloc(on, sizeof(uint16_t));
    attn_tensor th = attn_tensor_4d(h16, ATTN_BF16, B, H, L, DV);
    tl[0] = attn_tensor_4d(pl, ATTN_F32, B, H, L, 1);
    to[0] = attn_tensor_4d(o, ATTN_F32, B, H, L, DV);
    float *l3 = xcalloc(ln, sizeof(float)), *o3 = xcalloc(on, sizeof(float));
    attn_tensor t3 = attn_tensor_4d(o3, ATTN_F32, B, H, L, DV), tl3 = attn_tensor_4d(l3, ATTN_F32, B, H, L, 1);
    CHECK(attn_merge(2, to, tl, &th, NULL, 0) == ATTN_OK, "bfloat16 output");
    CHECK(attn_merge(2, to, tl, &t3, &tl3, 0) == ATTN_OK, "float32 output");
    int same = 1;
    for (int64_t x = 0; x < on; x++) {
        uint32_t u;
        memcpy(&u, &o3[x], 4);
        same &= h16[x] == (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    }
    CHECK(same, "bfloat16 output is not the float32 result rounded");
    free(po); free(pl); free(o); free(l); free(h16); free(l3); free(o3);
}

static void test_bad_arguments(void) {
    float po[2][6], pl[2][3], o[6], l[3];
    attn_tensor to[2] = {attn_tensor_4d(po[0], ATTN_F32, 1, 1, 3, 2), attn_tensor_4d(po[1], ATTN_F32, 1, 1, 3, 2)};
    attn_tensor tl[2] = {attn_tensor_4d(pl[0], ATTN_F32, 1, 1, 3, 1), attn_tensor_4d(pl[1], ATTN_F32, 1, 1, 3, 1)};
    memset(po, 0, sizeof po);
    memset(pl, 0, sizeof pl);
    attn_tensor too = attn_tensor_4d(o, ATTN_F32, 1, 1, 3, 2), tll = attn_tensor_4d(l, ATTN_F32, 1, 1, 3, 1);
    fill_sentinel(o, 6);
    fill_sentinel(l, 3);
    CHECK(attn_merge(-1, to, tl, &too, &tll, 0) == ATTN_ERR_VALUE, "n < 0");
    CHECK(attn_merge(2, NULL, tl, &too, &tll, 0) == ATTN_ERR_NULL, "o_parts NULL");
    CHECK(attn_merge(2, to, tl, NULL, &tll, 0) == ATTN_ERR_NULL, "o NULL");
    CHECK(attn_merge(2, to, tl, &too, &tll, -2) == ATTN_ERR_VALUE, "threads < 0");
    to[1].shape[2] = 2;
    CHECK(attn_merge(2, to, tl, &too, &tll, 0) == ATTN_ERR_SHAPE, "a partial of other rows");
    to[1].shape[2] = 3;
    tl[1].shape[3] = 2;
    CHECK(attn_merge(2, to, tl, &too, &tll, 0) == ATTN_ERR_SHAPE, "an LSE of the wrong shape");
    tl[1].shape[3] = 1;
    to[0].dtype = ATTN_F16;
    CHECK(attn_merge(2, to, tl, &too, &tll, 0) == ATTN_ERR_DTYPE, "a 16-bit partial");
    to[0].dtype = ATTN_F32;
    too.stride[2] = 0;
    CHECK(attn_merge(2, to, tl, &too, &tll, 0) == ATTN_ERR_STRIDE, "an overlapping output");
    too.stride[2] = 2;
    CHECK(count_written(o, 6) == 0 && count_written(l, 3) == 0, "a refused merge wrote");
    CHECK(attn_merge(2, to, tl, &too, &tll, 0) == ATTN_OK, "the repaired call");
}

/* A decoding call long enough for the split-KV path (Lq = 1, Lk = 5000 keys in chunks)
 * against the oracle, and a planted error shown to fail the tolerance check. */
static void test_split_kv_and_planted(void) {
    rng_t r = {5};
    split_case c = {.B = 1, .Hq = 4, .Hkv = 1, .Lq = 1, .Lk = 5000, .D = 32, .pieces = 1};
    CHECK(run_split(&r, c, 0.0f, 0, NULL), "split-KV decoding (one call of 5000 keys)");
    c.pieces = 9;
    CHECK(run_split(&r, c, 0.0f, 0, NULL), "split-KV decoding pieces merged");
    /* planted: one merged element off by 1e-3: the check must fail */
    split_case p = {.B = 1, .Hq = 2, .Hkv = 1, .Lq = 4, .Lk = 100, .D = 16, .pieces = 5};
    CHECK(!run_split(&r, p, 1e-3f, 0, NULL), "a planted error of 1e-3 passed the tolerance");
}

int main(void) {
    test_random_splits();
    test_totality();
    test_in_place_and_dtypes();
    test_bad_arguments();
    test_split_kv_and_planted();
    return check_summary("test_merge");
}
