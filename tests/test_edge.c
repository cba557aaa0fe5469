/*
 * test_edge.c — the contract's edge cases, one by one, on the fused and the reference
 *               path, each compared with the tests' oracle (oracle.h) and checked for
 *               the exact value the contract promises.
 *
 * What it covers: a known answer that checks the oracle itself; fully masked rows (by
 * bool mask, by -inf bias, by kv_len = 0, by a window that keeps nothing, by causal
 * bottom-right with Lk_b < Lq, by Lk = 0) giving O = 0, LSE = -inf, weights 0 and no
 * NaN; NaN and Inf stored in structurally masked K/V rows never reaching the output;
 * logits where a naive float32 exp overflows or underflows (90..100, about 1e4);
 * zero-sized calls; NaN in unmasked inputs propagating to exactly the rows that read
 * them; thread-count and repeated-run bit identity; and each tolerance check of the
 * suites shown to reject a planted error.
 * What it is not: the broad matrix of sizes and options (test_forward.c) or bad
 * arguments (test_api.c).
 */
#include "attn.h"
#include "check.h"
#include "oracle.h"

static uint64_t g_seed = 1000;
static const attn_path k_paths[2] = {ATTN_PATH_FUSED, ATTN_PATH_REFERENCE};
static const char *k_path_names[2] = {"fused", "reference"};

static fcase base(int64_t B, int64_t Hq, int64_t Hkv, int64_t Lq, int64_t Lk, int64_t Dk,
                  int64_t Dv) {
    return fcase_new(g_seed++, B, Hq, Hkv, Lq, Lk, Dk, Dv);
}

/* ---- the small checks, each shown to fail on a planted error in planted_errors() --- */

/* every p[i] == 0 (either sign) */
static int all_zero(const float *p, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (p[i] != 0.0f) return 0;
    return 1;
}
static int64_t count_nan(const float *p, int64_t n) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) c += isnan(p[i]) != 0;
    return c;
}
static int all_nan(const float *p, int64_t n) { return count_nan(p, n) == n; }

/* Dense C-order strides that stay nonzero when a dimension is 0 (attn_tensor_4d, and a
 * caller's own dense strides, give 0 there — which is fine: the tensor has no elements). */
static void nonzero_strides(attn_tensor *t) {
    int64_t s = 1;
    for (int d = 3; d >= 0; d--) {
        t->stride[d] = s;
        s *= t->shape[d] > 1 ? t->shape[d] : 1;
    }
}

/* Run both paths, compare with the oracle; returns how many runs matched. */
static int run_both(tcall *t, const char *what) {
    int good = 0;
    for (int p = 0; p < 2; p++) {
        attn_status st = tcall_run(t, k_paths[p], 0);
        CHECK(st == ATTN_OK, "%s/%s: status %d (%s) [%s]", what, k_path_names[p], (int)st,
              attn_last_error(), t->desc);
        if (st != ATTN_OK) continue;
        char name[160];
        snprintf(name, sizeof name, "%s/%s", what, k_path_names[p]);
        good += tcall_check(t, name);
    }
    return good;
}

/* ---- 1. a known answer: checks the oracle as much as the library ----------------- */

static void known_answer(void) {
    /* q = 1, k = {0, ln 3}, scale 1: p = {1/4, 3/4}; v = {1, 5}: o = 4; lse = ln 4 */
    float q[1] = {1.0f}, k[2] = {0.0f, (float)log(3.0)}, v[2] = {1.0f, 5.0f}, o[1], lse[1];
    attn_tensor tq = attn_tensor_4d(q, ATTN_F32, 1, 1, 1, 1);
    attn_tensor tk = attn_tensor_4d(k, ATTN_F32, 1, 1, 2, 1);
    attn_tensor tv = attn_tensor_4d(v, ATTN_F32, 1, 1, 2, 1);
    attn_tensor to = attn_tensor_4d(o, ATTN_F32, 1, 1, 1, 1);
    attn_tensor tl = attn_tensor_4d(lse, ATTN_F32, 1, 1, 1, 1);
    attn_options opt = {0};
    opt.has_scale = true;
    opt.scale = 1.0f;
    opt.lse = &tl;
    double oref, lref;
    oracle_forward(&tq, &tk, &tv, &opt, &oref, &lref, NULL);
    double p1 = exp((double)k[1]); /* 3, up to the rounding of ln 3 to float */
    double want_o = (1.0 + 5.0 * p1) / (1.0 + p1), want_l = log(1.0 + p1);
    CHECK(fabs(oref - want_o) < 1e-12 && fabs(lref - want_l) < 1e-12,
          "oracle known answer: o %.17g (want %.17g) lse %.17g (want %.17g)", oref, want_o, lref, want_l);
    CHECK(fabs(want_o - 4.0) < 1e-6, "known answer setup: o %.9g", want_o);
    for (int p = 0; p < 2; p++) {
        opt.path = k_paths[p];
        o[0] = lse[0] = -1.0f;
        attn_status st = attn_forward(&tq, &tk, &tv, &to, &opt);
        CHECK(st == ATTN_OK && fabs(o[0] - want_o) <= 1e-6 * want_o && fabs(lse[0] - want_l) <= 1e-6,
              "%s known answer: status %d o %.9g (want %.9g) lse %.9g (want %.9g)",
              k_path_names[p], (int)st, (double)o[0], want_o, (double)lse[0], want_l);
    }
}

/* ---- 2. fully masked rows ------------------------------------------------------- */

/* After the oracle: every row the oracle finds empty must be O = 0, LSE = -inf,
 * weights 0 on both paths, and nothing may be NaN. Returns the number of empty rows. */
static int64_t check_empty_rows(tcall *t, const char *what, int64_t min_rows) {
    const fcase *c = &t->c;
    int64_t empty = 0;
    for (int64_t r = 0; r < t->nl; r++) empty += t->lse_ref[r] == -INFINITY;
    CHECK(empty >= min_rows, "%s: the setup gives %lld fully masked rows, want >= %lld [%s]",
          what, (long long)empty, (long long)min_rows, t->desc);
    for (int p = 0; p < 2; p++) {
        attn_status st = tcall_run(t, k_paths[p], 0);
        CHECK(st == ATTN_OK, "%s/%s: status %d (%s)", what, k_path_names[p], (int)st, attn_last_error());
        if (st != ATTN_OK) continue;
        char name[160];
        snprintf(name, sizeof name, "%s/%s", what, k_path_names[p]);
        tcall_check(t, name);
        int64_t bad = 0;
        for (int64_t r = 0; r < t->nl; r++) {
            if (t->lse_ref[r] != -INFINITY) continue;
            int ok = all_zero(t->o_got + r * c->Dv, c->Dv);
            if (t->lseb) ok &= t->lse_got[r] == -INFINITY;
            if (t->wb) ok &= all_zero(t->w_got + r * c->Lk, c->Lk);
            bad += !ok;
        }
        CHECK(bad == 0, "%s: %lld fully masked rows are not O = 0, LSE = -inf, weights 0", name,
              (long long)bad);
        int64_t nans = count_nan(t->o_got, t->no) + (t->lseb ? count_nan(t->lse_got, t->nl) : 0) +
                       (t->wb ? count_nan(t->w_got, t->nw) : 0);
        CHECK(nans == 0, "%s: %lld NaN in the outputs", name, (long long)nans);
    }
    return empty;
}

static void fully_masked(void) {
    /* a. bool mask with all-false rows, [1, 1, Lq, Lk] */
    fcase c = base(2, 2, 1, 9, 70, 16, 8);
    c.mask = 1; c.mshape = 4; c.lse = 1; c.weights = 1;
    tcall t;
    tcall_build(&t, &c);
    for (int64_t j = 0; j < c.Lk; j++) t.maskb[2 * c.Lk + j] = t.maskb[8 * c.Lk + j] = 0;
    tcall_oracle(&t);
    check_empty_rows(&t, "bool-mask rows", 2 * 2 * 2);
    tcall_free(&t);

    /* b. -inf bias rows, [B, Hq, Lq, Lk]; also -inf bias over a bool-masked rest */
    c = base(2, 4, 2, 5, 130, 8, 8);
    c.mask = 2; c.mshape = 7; c.lse = 1; c.weights = 1; c.bias_ninf = 0.3;
    tcall_build(&t, &c);
    for (int64_t r = 0; r < 2 * 4 * 5; r += 3)
        for (int64_t j = 0; j < c.Lk; j++) t.biasb[r * c.Lk + j] = -INFINITY;
    tcall_oracle(&t);
    check_empty_rows(&t, "-inf bias rows", 14);
    tcall_free(&t);

    c = base(1, 2, 2, 4, 20, 8, 8);
    c.mask = 3; c.mshape = 4; c.lse = 1; c.weights = 1;
    tcall_build(&t, &c);
    for (int64_t j = 0; j < c.Lk; j++) { /* row 1: the mask keeps even keys, the bias kills them */
        t.maskb[1 * c.Lk + j] = (unsigned char)(j % 2 == 0);
        t.biasb[1 * c.Lk + j] = j % 2 == 0 ? -INFINITY : 0.0f;
    }
    tcall_oracle(&t);
    check_empty_rows(&t, "bool mask + -inf bias", 2);
    tcall_free(&t);

    /* c. kv_len = 0 for one batch (batch 2), int32 and int64 */
    for (int kv = 1; kv <= 2; kv++) {
        c = base(3, 2, 2, 17, 65, 8, 8);
        c.kvlen = kv; c.lse = 1; c.weights = 1;
        tcall_build(&t, &c);
        tcall_oracle(&t);
        check_empty_rows(&t, "kv_len 0", 2 * 17);
        tcall_free(&t);
    }

    /* d. a window that keeps nothing: top-left with Lq > Lk and window (0, 0) leaves rows
     * i >= Lk empty; bottom-right window (2, 0) leaves rows with d_i < 0 empty; a window
     * (0, -1) top-left too. */
    const int64_t wins[3][3] = {{0, 0, 0}, {2, 0, 1}, {0, -1, 0}};
    for (int w = 0; w < 3; w++) {
        c = base(1, 2, 1, 20, 8, 8, 8);
        c.window = 1; c.wl = wins[w][0]; c.wr = wins[w][1]; c.align = (int)wins[w][2];
        c.lse = 1; c.weights = 1;
        tcall_build(&t, &c);
        tcall_oracle(&t);
        check_empty_rows(&t, "empty window", 2 * 10);
        tcall_free(&t);
    }

    /* e. causal bottom-right with Lk_b < Lq: d_i = i + Lk_b - Lq < 0 for the first rows */
    c = base(2, 2, 2, 10, 12, 8, 8);
    c.causal = 1; c.align = 1; c.kvlen = 2; c.kvlen_fixed = 3; c.lse = 1; c.weights = 1;
    tcall_build(&t, &c);
    tcall_oracle(&t);
    check_empty_rows(&t, "causal bottom-right, Lk_b < Lq", 2 * 2 * 7);
    tcall_free(&t);
    c = base(1, 1, 1, 70, 65, 8, 8); /* no kv_len: Lk < Lq itself, across a tile edge */
    c.causal = 1; c.align = 1; c.lse = 1;
    tcall_build(&t, &c);
    tcall_oracle(&t);
    check_empty_rows(&t, "causal bottom-right, Lk < Lq", 5);
    tcall_free(&t);

    /* f. Lk = 0: every row empty (the weights [B, Hq, Lq, 0] with their natural dense
     * strides, all 0, then with nonzero ones; then without weights) */
    for (int variant = 0; variant < 3; variant++) {
        c = base(2, 2, 1, 5, 0, 8, 8);
        c.lse = 1; c.weights = variant < 2;
        tcall_build(&t, &c);
        if (variant == 1) nonzero_strides(&t.w);
        tcall_oracle(&t);
        check_empty_rows(&t, variant == 0 ? "Lk = 0" : variant == 1 ? "Lk = 0, weights with nonzero strides" : "Lk = 0, no weights", 2 * 2 * 5);
        tcall_free(&t);
    }
    c = base(2, 2, 1, 5, 0, 8, 8); /* with a kv_len of zeros and a causal mask */
    c.kvlen = 1; c.kvlen_fixed = 0; c.causal = 1; c.align = 1; c.lse = 1;
    tcall_build(&t, &c);
    tcall_oracle(&t);
    check_empty_rows(&t, "Lk = 0 + kv_len + causal", 2 * 2 * 5);
    tcall_free(&t);
}

/* ---- 3. NaN / Inf in structurally masked keys ---------------------------------- */

static void poisoned(void) {
    struct {
        const char *name;
        fcase c;
    } cases[10];
    int n = 0;
    fcase c = base(3, 2, 1, 17, 65, 16, 8);
    c.kvlen = 1;
    cases[n].name = "beyond kv_len"; cases[n++].c = c;
    c = base(2, 2, 2, 17, 65, 8, 16);
    c.causal = 1;
    cases[n].name = "above the causal band (top-left, Lq < Lk)"; cases[n++].c = c;
    c = base(2, 4, 2, 1, 129, 32, 32);
    c.window = 1; c.wl = 16; c.wr = 0; c.align = 1;
    cases[n].name = "outside a decoding window"; cases[n++].c = c;
    c = base(1, 2, 1, 17, 129, 8, 8);
    c.window = 1; c.wl = 3; c.wr = 3;
    cases[n].name = "outside a window (top-left)"; cases[n++].c = c;
    c = base(2, 2, 2, 3, 200, 8, 8);
    c.causal = 1; c.align = 1; c.kvlen = 2; c.kvlen_fixed = 50;
    cases[n].name = "beyond kv_len, bottom-right causal"; cases[n++].c = c;
    c = base(1, 2, 2, 64, 1000, 64, 64);
    c.kvlen = 1; c.kvlen_fixed = 100; c.cache = 1; c.layout = 1;
    cases[n].name = "900 keys beyond kv_len, cache view"; cases[n++].c = c;
    c = base(2, 2, 1, 40, 300, 8, 8);
    c.causal = 1; c.window = 1; c.wl = 10; c.wr = -1; c.mask = 1; c.mshape = 1;
    cases[n].name = "causal + window + bool mask"; cases[n++].c = c;
    c = base(3, 2, 1, 1, 150, 64, 64);
    c.kvlen = 2; c.causal = 1; c.align = 1; c.alibi = 1;
    cases[n].name = "decoding: kv_len + causal + ALiBi"; cases[n++].c = c;

    c = base(2, 4, 1, 1, 5000, 16, 16);
    c.kvlen = 1; c.kvlen_fixed = 1500; c.causal = 1; c.align = 1;
    cases[n].name = "decoding over chunks: beyond kv_len"; cases[n++].c = c;
    c = base(1, 2, 2, 4, 5000, 16, 16);
    c.window = 1; c.wl = 1200; c.wr = 0; c.align = 1;
    cases[n].name = "decoding over chunks: before a window"; cases[n++].c = c;

    const float poisons[3] = {NAN, INFINITY, -INFINITY};
    for (int i = 0; i < n; i++)
        for (int p = 0; p < 3; p++) {
            fcase ci = cases[i].c;
            ci.lse = 1;
            ci.weights = p == 0;
            tcall t;
            tcall_build(&t, &ci);
            int64_t rows = tcall_poison(&t, poisons[p]);
            CHECK(rows > 0, "poison %s: no key is structurally masked [%s]", cases[i].name, t.desc);
            tcall_oracle(&t);
            char name[160];
            snprintf(name, sizeof name, "%s (%g stored)", cases[i].name, (double)poisons[p]);
            run_both(&t, name);
            tcall_free(&t);
        }
}

/* ---- 4. large logits -------------------------------------------------------------- */

/* Every entry of a float view set to a draw from U(lo, hi) (or the constant lo if lo == hi). */
static void set_view(const attn_tensor *t, rng_t *r, double lo, double hi) {
    for (int64_t a = 0; a < t->shape[0]; a++)
        for (int64_t b = 0; b < t->shape[1]; b++)
            for (int64_t c = 0; c < t->shape[2]; c++)
                for (int64_t d = 0; d < t->shape[3]; d++)
                    *view_ptr(t, a, b, c, d) = lo == hi ? (float)lo : (float)rng_range(r, lo, hi);
}

static void large_logits_case(tcall *t, const char *what) {
    tcall_oracle(t);
    int64_t nonfinite = 0;
    for (int64_t i = 0; i < t->no; i++) nonfinite += !isfinite(t->o_ref[i]);
    CHECK(nonfinite == 0, "%s: the oracle itself is not finite", what);
    run_both(t, what);
}

static void large_logits(void) {
    rng_t r = {4242};
    tcall t;
    /* a, b. logits exactly 90..100 and -100..-90: Dk = 1, q = +-1, scale 1, k ~ U(90, 100).
     * exp(90) overflows float32; exp(-100) is a denormal. Values drawn 90..100 too. */
    for (int sign = 1; sign >= -1; sign -= 2) {
        fcase c = base(2, 2, 1, 5, 300, 1, 16);
        c.has_scale = 1; c.scale = 1.0f; c.lse = 1; c.weights = 1;
        tcall_build(&t, &c);
        set_view(&t.q, &r, sign, sign);
        set_view(&t.k, &r, 90.0, 100.0);
        set_view(&t.v, &r, 90.0, 100.0);
        large_logits_case(&t, sign > 0 ? "logits 90..100" : "logits -100..-90");
        tcall_free(&t);
    }
    /* c. the same through the bias: q = 0, bias ~ U(90, 100) */
    fcase c = base(1, 2, 2, 7, 129, 8, 8);
    c.mask = 2; c.mshape = 4; c.lse = 1;
    tcall_build(&t, &c);
    set_view(&t.q, &r, 0, 0);
    for (int64_t i = 0; i < c.Lq * c.Lk; i++) t.biasb[i] = (float)rng_range(&r, 90.0, 100.0);
    large_logits_case(&t, "bias 90..100");
    tcall_free(&t);

    /* d. logits near 1e4, exact integers: q = 1, k integers in [2400, 2500], Dk = 4,
     * scale 1, so s in [9600, 10000] with gaps of 0 (ties) and up */
    c = base(2, 2, 2, 6, 200, 4, 8);
    c.has_scale = 1; c.scale = 1.0f; c.lse = 1; c.weights = 1; c.causal = 1; c.align = 1;
    tcall_build(&t, &c);
    set_view(&t.q, &r, 1, 1);
    for (int64_t b = 0; b < c.B; b++)
        for (int64_t h = 0; h < c.Hkv; h++)
            for (int64_t j = 0; j < c.Lk; j++)
                for (int64_t d = 0; d < c.Dk; d++) *view_ptr(&t.k, b, h, j, d) = (float)(2400 + rng_int(&r, 26));
    set_view(&t.v, &r, 90.0, 100.0);
    large_logits_case(&t, "integer logits near 1e4");
    tcall_free(&t);

    /* e. q, k ~ U(90, 100), Dk = 64, default scale: logits about 7e4, one key wins. The
     * top two logits of a row must be further apart than float32 noise (about 0.03 here)
     * for "the answer" to be one float32 can give: redraw until every row's gap is > 12. */
    for (int attempt = 0;; attempt++) {
        c = base(1, 2, 1, 4, 33, 64, 16);
        c.lse = 1;
        tcall_build(&t, &c);
        set_view(&t.q, &r, 90.0, 100.0);
        set_view(&t.k, &r, 90.0, 100.0);
        set_view(&t.v, &r, 90.0, 100.0);
        double min_gap = INFINITY;
        for (int64_t h = 0; h < c.Hq; h++)
            for (int64_t i = 0; i < c.Lq; i++) {
                double s1 = -INFINITY, s2 = -INFINITY;
                for (int64_t j = 0; j < c.Lk; j++) {
                    double s = 0;
                    for (int64_t d = 0; d < c.Dk; d++) s += t_f32(&t.q, 0, h, i, d) * t_f32(&t.k, 0, 0, j, d);
                    s /= 8.0;
                    if (s > s1) { s2 = s1; s1 = s; } else if (s > s2) s2 = s;
                }
                if (s1 - s2 < min_gap) min_gap = s1 - s2;
            }
        if (min_gap > 12 || attempt == 50) {
            CHECK(min_gap > 12, "could not draw a one-hot case");
            large_logits_case(&t, "logits about 7e4 (one-hot)");
            tcall_free(&t);
            break;
        }
        tcall_free(&t);
    }

    /* f. softcap 30 over those logits: tanh saturates, every logit is 30, O = mean of V */
    c = base(1, 2, 1, 4, 33, 64, 16);
    c.softcap = 30.0f; c.lse = 1; c.weights = 1;
    tcall_build(&t, &c);
    set_view(&t.q, &r, 90.0, 100.0);
    set_view(&t.k, &r, 90.0, 100.0);
    set_view(&t.v, &r, 90.0, 100.0);
    large_logits_case(&t, "softcap 30 over logits about 7e4");
    tcall_free(&t);

    /* g. a large-logit key that only the causal band hides: the unmasked keys still give
     * the exact answer (the masked 1e4 logit must not become the row maximum) */
    c = base(1, 1, 1, 8, 8, 1, 4);
    c.has_scale = 1; c.scale = 1.0f; c.causal = 1; c.lse = 1;
    tcall_build(&t, &c);
    set_view(&t.q, &r, 1, 1);
    set_view(&t.k, &r, -1.0, 1.0);
    for (int64_t d = 0; d < c.Dk; d++) *view_ptr(&t.k, 0, 0, 7, d) = 1e4f;
    large_logits_case(&t, "a masked 1e4 logit");
    tcall_free(&t);
}

/* ---- 5. zero sizes ------------------------------------------------------------------ */

static void zero_sizes(void) {
    /* B = 0, H = 0, Lq = 0 (and Dv = 0): the call succeeds; there is nothing to write.
     * With NULL data pointers too: NULL is an error only for a tensor with elements.
     * strides 0: the dense strides as attn_tensor_4d computes them (0 above a dimension
     * of size 0); 1: the same with strides forced nonzero, to tell an over-strict stride
     * check from a failure of the empty call itself. */
    const int64_t shapes[][7] = {
        {0, 2, 1, 5, 7, 8, 8}, {2, 0, 0, 5, 7, 8, 8}, {2, 0, 2, 5, 7, 8, 8},
        {2, 2, 1, 0, 7, 8, 8}, {2, 2, 1, 0, 0, 8, 8},
    };
    for (int s = 0; s < 5; s++) {
        for (int p = 0; p < 2; p++) {
            for (int variant = 0; variant < 3; variant++) {
                int use_null = variant == 1, fix_strides = variant == 2;
                fcase c = base(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], shapes[s][4],
                               shapes[s][5], shapes[s][6]);
                c.lse = 1; c.weights = 1; c.causal = s & 1; c.kvlen = s == 0 ? 0 : 1;
                tcall t;
                tcall_build(&t, &c);
                tcall_oracle(&t);
                attn_tensor q = t.q, k = t.k, v = t.v, o = t.o, lse = t.lse, w = t.w;
                if (use_null) {
                    if (q.shape[0] * q.shape[1] * q.shape[2] * q.shape[3] == 0) q.data = NULL;
                    if (k.shape[0] * k.shape[1] * k.shape[2] * k.shape[3] == 0) k.data = NULL;
                    if (v.shape[0] * v.shape[1] * v.shape[2] * v.shape[3] == 0) v.data = NULL;
                    o.data = lse.data = w.data = NULL; /* all of them empty */
                }
                if (fix_strides) {
                    nonzero_strides(&q); nonzero_strides(&k); nonzero_strides(&v);
                    nonzero_strides(&o); nonzero_strides(&lse); nonzero_strides(&w);
                }
                t.opt.lse = &lse;
                t.opt.weights = &w;
                t.opt.path = k_paths[p];
                attn_status st = attn_forward(&q, &k, &v, &o, &t.opt);
                CHECK(st == ATTN_OK, "%s zero-size call%s: status %d (%s) [%s]", k_path_names[p],
                      use_null ? " with NULL data" : fix_strides ? " with nonzero strides" : "",
                      (int)st, attn_last_error(), t.desc);
                tcall_free(&t);
            }
        }
    }

    /* Dv = 0: O is empty but the LSE is still a result (o with its natural dense strides,
     * then with nonzero ones) */
    for (int fix = 0; fix < 2; fix++) {
        fcase c = base(2, 2, 1, 17, 65, 8, 0);
        c.lse = 1; c.causal = 1;
        tcall t;
        tcall_build(&t, &c);
        if (fix) nonzero_strides(&t.o);
        tcall_oracle(&t);
        run_both(&t, fix ? "Dv = 0, o with nonzero strides" : "Dv = 0");
        tcall_free(&t);
    }
    fcase c;
    tcall t;

    /* Dk = 0 with an explicit scale: every logit is 0, O is the mean of the kept V rows.
     * (With the default scale 1/sqrt(0) = inf the logits would be inf * 0 = NaN; the
     * contract does not decide that case, so it is not tested.) */
    c = base(2, 2, 1, 17, 65, 0, 8);
    c.has_scale = 1; c.scale = 1.0f; c.lse = 1; c.causal = 1;
    tcall_build(&t, &c);
    tcall_oracle(&t);
    run_both(&t, "Dk = 0, scale 1");
    tcall_free(&t);
}

/* ---- 6. NaN / Inf in unmasked inputs ------------------------------------------------ */

static void nan_propagation(void) {
    /* K row 5 of (batch 0, kv head 0) is NaN. Causal top-left: rows i >= 5 of the query
     * heads that read kv head 0 in batch 0 read it -> all NaN; every other row is exact. */
    fcase c = base(2, 4, 2, 20, 20, 8, 6);
    c.causal = 1; c.lse = 1;
    tcall t;
    tcall_build(&t, &c);
    for (int64_t d = 0; d < c.Dk; d++) *view_ptr(&t.k, 0, 0, 5, d) = NAN;
    tcall_oracle(&t);
    run_both(&t, "NaN key (oracle)");
    for (int p = 0; p < 2; p++) {
        if (tcall_run(&t, k_paths[p], 0) != ATTN_OK) continue;
        tcall_gather(&t);
        int64_t want_nan_rows = 0, nan_rows = 0, wrong = 0;
        for (int64_t b = 0; b < c.B; b++)
            for (int64_t h = 0; h < c.Hq; h++)
                for (int64_t i = 0; i < c.Lq; i++) {
                    int reads = b == 0 && h / 2 == 0 && i >= 5;
                    const float *row = t.o_got + ((b * c.Hq + h) * c.Lq + i) * c.Dv;
                    want_nan_rows += reads;
                    if (reads) { nan_rows += all_nan(row, c.Dv) && isnan(t.lse_got[(b * c.Hq + h) * c.Lq + i]); }
                    else wrong += count_nan(row, c.Dv) != 0;
                }
        CHECK(nan_rows == want_nan_rows && wrong == 0,
              "%s NaN key: %lld of %lld reading rows all NaN, %lld other rows with NaN",
              k_path_names[p], (long long)nan_rows, (long long)want_nan_rows, (long long)wrong);
    }
    tcall_free(&t);

    /* decoding over a long key range (split into chunks by a fused path): a NaN key in
     * one chunk makes the rows that read it NaN, for every head of its group */
    c = base(1, 4, 2, 2, 5000, 8, 8);
    c.lse = 1;
    tcall_build(&t, &c);
    for (int64_t d = 0; d < c.Dk; d++) *view_ptr(&t.k, 0, 1, 3000, d) = NAN;
    tcall_oracle(&t);
    run_both(&t, "NaN key in a middle chunk (oracle)");
    for (int p = 0; p < 2; p++) {
        if (tcall_run(&t, k_paths[p], 0) != ATTN_OK) continue;
        tcall_gather(&t);
        int64_t bad = 0;
        for (int64_t h = 0; h < c.Hq; h++)
            for (int64_t i = 0; i < c.Lq; i++)
                bad += all_nan(t.o_got + (h * c.Lq + i) * c.Dv, c.Dv) != (h / 2 == 1) ||
                       (count_nan(t.o_got + (h * c.Lq + i) * c.Dv, c.Dv) != 0) != (h / 2 == 1);
        CHECK(bad == 0, "%s NaN key in a middle chunk: %lld rows wrong", k_path_names[p], (long long)bad);
    }
    tcall_free(&t);

    /* V row 5, column 2 NaN: only column 2 of the rows that read key 5 */
    c = base(1, 2, 1, 20, 20, 8, 6);
    c.causal = 1;
    tcall_build(&t, &c);
    *view_ptr(&t.v, 0, 0, 5, 2) = NAN;
    tcall_oracle(&t);
    run_both(&t, "NaN value (oracle)");
    for (int p = 0; p < 2; p++) {
        if (tcall_run(&t, k_paths[p], 0) != ATTN_OK) continue;
        tcall_gather(&t);
        int64_t bad = 0;
        for (int64_t h = 0; h < c.Hq; h++)
            for (int64_t i = 0; i < c.Lq; i++)
                for (int64_t d = 0; d < c.Dv; d++) {
                    int want = i >= 5 && d == 2;
                    bad += (isnan(t.o_got[(h * c.Lq + i) * c.Dv + d]) != 0) != want;
                }
        CHECK(bad == 0, "%s NaN value: %lld entries NaN where they should not be or not NaN where they should",
              k_path_names[p], (long long)bad);
    }
    tcall_free(&t);

    /* NaN in one query row -> that row only; NaN in one unmasked bias entry -> that row */
    c = base(1, 2, 1, 9, 30, 8, 4);
    c.mask = 2; c.mshape = 4;
    tcall_build(&t, &c);
    for (int64_t d = 0; d < c.Dk; d++) *view_ptr(&t.q, 0, 1, 3, d) = NAN;
    t.biasb[6 * c.Lk + 11] = NAN;
    tcall_oracle(&t);
    run_both(&t, "NaN query row and NaN bias entry");
    tcall_free(&t);

    /* +Inf and -Inf in unmasked K and V entries, large finite q: IEEE says what happens
     * (NaN or a masked key); the oracle follows IEEE, the library must agree and not crash */
    const float infs[2] = {INFINITY, -INFINITY};
    for (int s = 0; s < 2; s++) {
        c = base(1, 2, 1, 6, 12, 4, 4);
        c.causal = 1; c.lse = 1;
        tcall_build(&t, &c);
        rng_t r = {7};
        set_view(&t.q, &r, 0.5, 1.0); /* q > 0: s of key 2 is infs[s] for the rows reading it */
        *view_ptr(&t.k, 0, 0, 2, 0) = infs[s];
        *view_ptr(&t.v, 0, 0, 1, 1) = infs[s]; /* row 1 reads it (not key 2): O[1][1] = infs[s] */
        tcall_oracle(&t);
        run_both(&t, s == 0 ? "+Inf in K and V" : "-Inf in K and V");
        tcall_free(&t);
    }
}

/* ---- 7. bit identity: thread counts, repeated runs ----------------------------------- */

static void bit_identity(void) {
    fcase cs[3];
    cs[0] = base(2, 4, 2, 130, 257, 64, 32);
    cs[0].causal = 1; cs[0].align = 1; cs[0].kvlen = 1; cs[0].lse = 1; cs[0].weights = 1;
    cs[1] = base(1, 8, 1, 1, 3000, 128, 128);
    cs[1].lse = 1; cs[1].window = 1; cs[1].wl = 2000; cs[1].wr = 0; cs[1].align = 1;
    cs[2] = base(3, 2, 2, 200, 200, 16, 16);
    cs[2].mask = 3; cs[2].mshape = 5; cs[2].bias_ninf = 0.2; cs[2].lse = 1;
    for (int i = 0; i < 3; i++) {
        tcall t;
        tcall_build(&t, &cs[i]);
        tcall_poison(&t, NAN);
        for (int p = 0; p < 2; p++) {
            attn_status st = tcall_run(&t, k_paths[p], 1);
            CHECK(st == ATTN_OK, "bit identity %s: status %d", k_path_names[p], (int)st);
            if (st != ATTN_OK) continue;
            float *o1 = (float *)xcalloc(t.on, sizeof(float)), *l1 = (float *)xcalloc(t.lsen, sizeof(float));
            float *w1 = (float *)xcalloc(t.wn, sizeof(float));
            memcpy(o1, t.ob, (size_t)t.on * 4);
            memcpy(l1, t.lseb, (size_t)t.lsen * 4);
            if (t.wb) memcpy(w1, t.wb, (size_t)t.wn * 4);
            const int counts[5] = {2, 2, 1, 0, 4};
            for (int n = 0; n < 5; n++) {
                st = tcall_run(&t, k_paths[p], counts[n]);
                int same = st == ATTN_OK && memcmp(o1, t.ob, (size_t)t.on * 4) == 0 &&
                           memcmp(l1, t.lseb, (size_t)t.lsen * 4) == 0 &&
                           (!t.wb || memcmp(w1, t.wb, (size_t)t.wn * 4) == 0);
                CHECK(same, "%s: run %d with threads=%d is not bit-identical to threads=1 [%s]",
                      k_path_names[p], n, counts[n], t.desc);
            }
            free(o1); free(l1); free(w1);
        }
        tcall_free(&t);
    }
}

/* ---- 8. every tolerance check rejects a planted error -------------------------------- */

static void planted_errors(void) {
    fcase c = base(3, 2, 1, 33, 65, 16, 16); /* batch 2 has kv_len 0: empty rows */
    c.lse = 1; c.causal = 1; c.align = 1; c.kvlen = 1;
    tcall t;
    tcall_build(&t, &c);
    tcall_oracle(&t);
    CHECK(tcall_run(&t, ATTN_PATH_FUSED, 0) == ATTN_OK, "planted: the base call failed");
    tcall_gather(&t);
    const int64_t n = t.no;
    float *g = (float *)xcalloc(n, sizeof(float));
    tol_result r;
    CHECK(within_f32_tol(t.o_got, t.o_ref, n, &r), "planted: the unperturbed output is rejected");
    double max_ref = r.max_ref;
    int64_t big = 0; /* the element of largest |ref| */
    for (int64_t i = 0; i < n; i++)
        if (fabs(t.o_ref[i]) > fabs(t.o_ref[big])) big = i;

    /* the reference itself, rounded to float, is accepted */
    for (int64_t i = 0; i < n; i++) g[i] = (float)t.o_ref[i];
    CHECK(within_f32_tol(g, t.o_ref, n, NULL), "planted: the rounded reference is rejected");
    /* one element off by 2e-5 * (1 + max|ref|): the max-error bound must catch it */
    memcpy(g, t.o_got, (size_t)n * 4);
    g[n / 2] += (float)(2e-5 * (1.0 + max_ref));
    CHECK(!within_f32_tol(g, t.o_ref, n, NULL), "planted: one element off by 2e-5(1+max) accepted");
    /* ... but off by 0.3e-5 * (1 + max|ref|), it is within both bounds */
    memcpy(g, t.o_got, (size_t)n * 4);
    g[n / 2] += (float)(0.3e-5 * (1.0 + max_ref));
    CHECK(within_f32_tol(g, t.o_ref, n, NULL), "planted: one element off by 0.3e-5(1+max) rejected");
    /* every element shifted by 1e-5 relative: the max bound alone would pass it, the
     * relative Frobenius bound (1e-6) must not */
    for (int64_t i = 0; i < n; i++) g[i] = (float)(t.o_ref[i] * (1.0 + 1e-5));
    CHECK(!within_f32_tol(g, t.o_ref, n, &r), "planted: a 1e-5 relative shift of all elements accepted (rel %.3g)", r.rel_err);
    CHECK(r.max_err <= 1e-5 * (1.0 + r.max_ref), "planted: the 1e-5 shift should be inside the max bound");
    for (int64_t i = 0; i < n; i++) g[i] = (float)(t.o_ref[i] * (1.0 + 3e-7));
    CHECK(within_f32_tol(g, t.o_ref, n, NULL), "planted: a 3e-7 relative shift rejected");
    /* the sign of everything flipped (a tolerance with fabs(ref) in it would accept) */
    for (int64_t i = 0; i < n; i++) g[i] = -t.o_got[i];
    CHECK(!within_f32_tol(g, t.o_ref, n, NULL), "planted: sign-flipped output accepted");
    /* the largest element zeroed */
    memcpy(g, t.o_got, (size_t)n * 4);
    g[big] = 0.0f;
    CHECK(!within_f32_tol(g, t.o_ref, n, NULL), "planted: a zeroed element accepted");
    /* a NaN, an Inf, an unwritten (sentinel) element */
    memcpy(g, t.o_got, (size_t)n * 4);
    g[3] = NAN;
    CHECK(!within_f32_tol(g, t.o_ref, n, NULL), "planted: NaN accepted");
    memcpy(g, t.o_got, (size_t)n * 4);
    g[3] = INFINITY;
    CHECK(!within_f32_tol(g, t.o_ref, n, NULL), "planted: Inf accepted");
    memcpy(g, t.o_got, (size_t)n * 4);
    fill_sentinel(g + 3, 1);
    CHECK(!within_f32_tol(g, t.o_ref, n, NULL), "planted: an unwritten element accepted");

    /* LSE: -inf rows must be -inf exactly */
    int64_t ninf = -1;
    for (int64_t i = 0; i < t.nl; i++)
        if (t.lse_ref[i] == -INFINITY) { ninf = i; break; }
    CHECK(ninf >= 0, "planted: the LSE setup has no empty row");
    double *mag = (double *)xcalloc(t.nl, sizeof(double));
    oracle_logit_mag(&t.q, &t.k, &t.opt, mag);
    const int64_t dk = t.q.shape[3], lk = t.k.shape[2];
#define LSE_OK(g) within_lse_tol((g), t.lse_ref, mag, t.nl, dk, lk, NULL)
    CHECK(LSE_OK(t.lse_got), "planted: the unperturbed LSE is rejected");
    float *gl = (float *)xcalloc(t.nl, sizeof(float));
    if (ninf >= 0) {
        memcpy(gl, t.lse_got, (size_t)t.nl * 4);
        gl[ninf] = -1e30f;
        CHECK(!LSE_OK(gl), "planted: finite LSE for an empty row accepted");
        gl[ninf] = NAN;
        CHECK(!LSE_OK(gl), "planted: NaN LSE for an empty row accepted");
        gl[ninf] = INFINITY;
        CHECK(!LSE_OK(gl), "planted: +inf LSE for an empty row accepted");
    }
    /* the bound itself: a finite row off the reference by 1.5 times its bound is rejected,
     * by 0.5 times accepted (in float64, then rounded: 0.5 keeps a margin of the rounding) */
    int64_t fin = -1;
    for (int64_t i = 0; i < t.nl && fin < 0; i++)
        if (isfinite(t.lse_ref[i])) fin = i;
    CHECK(fin >= 0, "planted: the LSE setup has no finite row");
    if (fin >= 0) {
        const double bnd = tol_lse_bound(dk, lk, mag[fin]);
        memcpy(gl, t.lse_got, (size_t)t.nl * 4);
        gl[fin] = (float)(t.lse_ref[fin] + 1.5 * bnd);
        CHECK(!LSE_OK(gl), "planted: an LSE 1.5 bounds off accepted (bound %.3g)", bnd);
        gl[fin] = (float)(t.lse_ref[fin] - 1.5 * bnd);
        CHECK(!LSE_OK(gl), "planted: an LSE 1.5 bounds below accepted");
        gl[fin] = (float)(t.lse_ref[fin] + 0.5 * bnd);
        CHECK(LSE_OK(gl), "planted: an LSE half a bound off rejected");
        /* the bound is of the row's own size: at this case's Lk and Dk it is below 1e-4,
         * so a key of a row's Lk left out of a uniform row (ln(1 - 1/Lk)) is caught */
        CHECK(bnd < -log1p(-1.0 / (double)lk), "the LSE bound %.3g does not catch one key of %lld",
              bnd, (long long)lk);
    }
    /* a cancelling row: the logit's rounding error is of the magnitude, not of the LSE,
     * which the relative rule got wrong (issue 33): ref 1e-6 of mag, got off by mag * 2^-24 */
    {
        const double m1 = 1.0, ref1 = 1e-6;
        const float got1 = (float)(ref1 + m1 * 0x1p-24);
        CHECK(within_lse_tol(&got1, &ref1, &m1, 1, 4, 1, NULL) &&
                  !within_f32_tol(&got1, &ref1, 1, NULL),
              "planted: an LSE near 0 off by an ulp of its logits' magnitude (accepted by the "
              "bound, rejected by the relative rule)");
    }
#undef LSE_OK
    free(gl);
    free(mag);

    /* the small checks of this file */
    float z[4] = {0.0f, -0.0f, 0.0f, 0.0f};
    CHECK(all_zero(z, 4), "planted: all_zero rejects zeros");
    z[2] = 1e-30f;
    CHECK(!all_zero(z, 4), "planted: all_zero accepts 1e-30");
    z[2] = NAN;
    CHECK(!all_zero(z, 4), "planted: all_zero accepts NaN");
    float q4[4] = {NAN, NAN, NAN, NAN};
    CHECK(all_nan(q4, 4) && count_nan(q4, 4) == 4, "planted: all_nan rejects NaNs");
    q4[1] = 0.0f;
    CHECK(!all_nan(q4, 4) && count_nan(q4, 4) == 3, "planted: all_nan accepts a number");

    /* the bit-identity comparison sees a one-ulp change */
    memcpy(g, t.o_got, (size_t)n * 4);
    g[big] = nextafterf(g[big], INFINITY);
    CHECK(memcmp(g, t.o_got, (size_t)n * 4) != 0, "planted: memcmp misses one ulp");

    /* tcall_check's two parts: a write outside O's view, a wrong element inside */
    {
        fcase cc = base(1, 2, 1, 5, 9, 4, 4);
        cc.cache = 1;
        tcall u;
        tcall_build(&u, &cc);
        tcall_oracle(&u);
        CHECK(tcall_run(&u, ATTN_PATH_FUSED, 0) == ATTN_OK, "planted: cache call failed");
        CHECK(tcall_o_outside_written(&u) == 0, "planted: clean run flagged as writing outside O");
        int64_t pad = 0;
        while (pad < u.on && u.ocover[pad]) pad++;
        u.ob[pad] = 0.0f;
        CHECK(tcall_o_outside_written(&u) == 1, "planted: a write outside O's view is missed");
        tcall_free(&u);
    }

    /* the oracle's masking: a planted NaN in a kept key does reach its output */
    {
        fcase cc = base(1, 1, 1, 4, 6, 2, 2);
        cc.causal = 1;
        tcall u;
        tcall_build(&u, &cc);
        tcall_poison(&u, NAN); /* poisons keys 4 and 5, which no row reads */
        tcall_oracle(&u);
        CHECK(!isnan(u.o_ref[3 * 2]), "planted: oracle reads a poisoned key");
        *view_ptr(&u.v, 0, 0, 3, 0) = NAN; /* key 3 is kept by row 3 */
        tcall_oracle(&u);
        CHECK(isnan(u.o_ref[3 * 2]) && !isnan(u.o_ref[2 * 2]), "planted: the oracle hides a NaN in a kept key");
        tcall_free(&u);
    }

    free(g);
    tcall_free(&t);
}

int main(void) {
    known_answer();
    fully_masked();
    poisoned();
    large_logits();
    zero_sizes();
    nan_propagation();
    bit_identity();
    planted_errors();
    return check_summary("edge");
}
