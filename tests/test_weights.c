/*
 * test_weights.c — attn_weights_grid: the weights recomputed from a forward call's LSE
 *                  and reduced over blocks, against the oracle's (oracle.h) weights
 *                  aggregated directly in float64.
 *
 * What it covers: the full grid (R = Lq, C = Lk: the weights themselves) and uneven
 * blocks (R, C that do not divide Lq, Lk; R = 1, C = 1), sum and max, on the fused and
 * the reference path, over every mask kind (bool mask, -inf bias, causal under both
 * alignments, window, key lengths with an empty batch, ALiBi, softcap), GQA, the
 * [B, L, H, D] layout and K as a view of a NaN-filled cache; masked cells (-inf) exactly
 * where every entry of the block is masked; 1-thread vs 2-thread bit identity; refusals
 * that write nothing. What it is not: a test of the LSE itself (test_forward.c).
 */
#include "attn.h"
#include "check.h"
#include "oracle.h"

/* Is (b, h, i, j) masked? The oracle's rule: structure, bool mask, -inf bias. */
static int masked(const tcall *t, int64_t b, int64_t h, int64_t i, int64_t j) {
    const attn_options *opt = &t->opt;
    const int64_t lkb = oracle_lkb(opt, b, t->c.Lk);
    if (!oracle_structural_keep(opt, lkb, oracle_diag(opt, i, lkb, t->c.Lq), j)) return 1;
    if (opt->mask && !t_bool(opt->mask, b, h, i, j)) return 1;
    if (opt->bias && t_f32(opt->bias, b, h, i, j) == -INFINITY) return 1;
    return 0;
}

/* The direct grid: the oracle's weights w_ref folded into [B, Hq, R, C] in float64. */
static void direct_grid(const tcall *t, int64_t R, int64_t C, attn_reduce reduce, double *g) {
    const fcase *c = &t->c;
    const int64_t n = c->B * c->Hq * R * C;
    for (int64_t x = 0; x < n; x++) g[x] = -INFINITY;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->Hq; h++)
            for (int64_t i = 0; i < c->Lq; i++)
                for (int64_t j = 0; j < c->Lk; j++) {
                    if (masked(t, b, h, i, j)) continue;
                    const double w = t->w_ref[((b * c->Hq + h) * c->Lq + i) * c->Lk + j];
                    double *cell = &g[((b * c->Hq + h) * R + i * R / c->Lq) * C + j * C / c->Lk];
                    if (*cell == -INFINITY) *cell = w;
                    else if (reduce == ATTN_REDUCE_MAX) *cell = w > *cell ? w : *cell;
                    else *cell += w;
                }
}

/* Tolerance: a weight recomputed from a float32 LSE is off by |lse| * 2^-24 relatively,
 * and the fused path's float32 logits add a few ulps of |s|: 4e-6 per weight (weights
 * and logits here are of order 1-10), times the entries a cell sums. Masked cells must be
 * -inf exactly, the others finite. */
static int grid_ok(const float *got, const double *ref, int64_t n, double per_cell,
                   double *max_err, int64_t *bad) {
    *max_err = 0;
    *bad = -1;
    for (int64_t x = 0; x < n; x++) {
        if (ref[x] == -INFINITY || got[x] == -INFINITY) {
            if (got[x] != ref[x] && *bad < 0) *bad = x;
            continue;
        }
        const double e = fabs((double)got[x] - ref[x]);
        if (!(e <= *max_err)) *max_err = e;  // NaN sticks
        if (!(e <= per_cell) && *bad < 0) *bad = x;
    }
    return *bad < 0;
}

static void one_grid(tcall *t, attn_path path, int64_t R, int64_t C, attn_reduce reduce) {
    const fcase *c = &t->c;
    const int64_t n = c->B * c->Hq * R * C;
    float *got = xcalloc(n > 0 ? n : 1, sizeof(float)), *again = xcalloc(n > 0 ? n : 1, sizeof(float));
    double *ref = xcalloc(n > 0 ? n : 1, sizeof(double));
    attn_tensor grid = attn_tensor_4d(got, ATTN_F32, c->B, c->Hq, R, C);
    attn_options opt = t->opt;
    opt.lse = NULL;
    opt.weights = NULL;
    opt.path = path;
    opt.threads = 2;
    attn_status st = attn_weights_grid(&t->q, &t->k, &t->lse, &grid, reduce, &opt);
    CHECK(st == ATTN_OK, "grid %lldx%lld: %s (%s) [%s]", (long long)R, (long long)C,
          attn_status_string(st), attn_last_error(), t->desc);
    direct_grid(t, R, C, reduce, ref);
    const int64_t rows = (c->Lq + R - 1) / R, keys = (c->Lk + C - 1) / C;
    const double tol = (path == ATTN_PATH_REFERENCE ? 1e-6 : 4e-6) *
                       (reduce == ATTN_REDUCE_SUM ? (double)(rows * keys) : 1.0);
    double max_err;
    int64_t bad;
    const int good = grid_ok(got, ref, n, tol, &max_err, &bad);
    CHECK(good, "%s grid %lldx%lld %s: max_err %.3g (tol %.3g), first bad cell %lld: got %.9g "
          "want %.9g [%s]", path == ATTN_PATH_REFERENCE ? "reference" : "fused", (long long)R,
          (long long)C, reduce == ATTN_REDUCE_MAX ? "max" : "sum", max_err, tol, (long long)bad,
          bad >= 0 ? (double)got[bad] : 0.0, bad >= 0 ? ref[bad] : 0.0, t->desc);
    /* one thread: the same bits */
    grid.data = again;
    opt.threads = 1;
    st = attn_weights_grid(&t->q, &t->k, &t->lse, &grid, reduce, &opt);
    CHECK(st == ATTN_OK && memcmp(got, again, (size_t)n * sizeof(float)) == 0,
          "grid %lldx%lld: 1 thread differs from 2 [%s]", (long long)R, (long long)C, t->desc);
    free(got);
    free(again);
    free(ref);
}

static void one_case(fcase c) {
    c.lse = 1;
    c.weights = 0;
    tcall t;
    tcall_build(&t, &c);
    /* the oracle's weights need a weights buffer: the oracle fills w_ref when asked */
    t.w_ref = xcalloc(t.nw > 0 ? t.nw : 1, sizeof(double));
    tcall_oracle(&t);
    const attn_path paths[2] = {ATTN_PATH_FUSED, ATTN_PATH_REFERENCE};
    for (int pi = 0; pi < 2; pi++) {
        attn_status st = tcall_run(&t, paths[pi], 2);
        CHECK(st == ATTN_OK, "forward: %s [%s]", attn_status_string(st), t.desc);
        const int64_t sizes[][2] = {{c.Lq, c.Lk}, {c.Lq > 5 ? 5 : c.Lq, c.Lk > 7 ? 7 : c.Lk},
                                    {1, 1}, {c.Lq > 1 ? c.Lq - 1 : 1, c.Lk > 3 ? 3 : c.Lk}};
        for (int s = 0; s < 4; s++)
            for (int r = 0; r < 2; r++)
                one_grid(&t, paths[pi], sizes[s][0], sizes[s][1], r ? ATTN_REDUCE_MAX : ATTN_REDUCE_SUM);
    }
    tcall_free(&t);
}

/* Bad arguments: each refused with its code, the grid untouched. */
static void refusals(void) {
    fcase c = fcase_new(99, 1, 2, 1, 6, 9, 4, 4);
    c.lse = 1;
    tcall t;
    tcall_build(&t, &c);
    CHECK(tcall_run(&t, ATTN_PATH_FUSED, 1) == ATTN_OK, "refusals: forward");
    float g[2 * 7 * 10];
    fill_sentinel(g, 2 * 7 * 10);
    attn_options opt = t.opt;
    opt.lse = NULL;
    struct {
        int64_t R, C;
        attn_reduce reduce;
        int with_lse_opt;
        attn_status want;
        const char *what;
    } bad[] = {
        {7, 9, ATTN_REDUCE_SUM, 0, ATTN_ERR_SHAPE, "R > Lq"},
        {6, 10, ATTN_REDUCE_SUM, 0, ATTN_ERR_SHAPE, "C > Lk"},
        {0, 9, ATTN_REDUCE_SUM, 0, ATTN_ERR_SHAPE, "R = 0 with Lq > 0"},
        {6, 9, (attn_reduce)7, 0, ATTN_ERR_VALUE, "reduce out of range"},
        {6, 9, ATTN_REDUCE_SUM, 1, ATTN_ERR_VALUE, "options.lse set"},
    };
    for (size_t x = 0; x < sizeof bad / sizeof bad[0]; x++) {
        attn_tensor grid = attn_tensor_4d(g, ATTN_F32, 1, 2, bad[x].R, bad[x].C);
        opt.lse = bad[x].with_lse_opt ? &t.lse : NULL;
        attn_status st = attn_weights_grid(&t.q, &t.k, &t.lse, &grid, bad[x].reduce, &opt);
        CHECK(st == bad[x].want, "refusal %s: got %s, want %s", bad[x].what,
              attn_status_string(st), attn_status_string(bad[x].want));
    }
    opt.lse = NULL;
    attn_tensor short_lse = t.lse;
    short_lse.shape[2] = 5;
    attn_tensor grid = attn_tensor_4d(g, ATTN_F32, 1, 2, 6, 9);
    CHECK(attn_weights_grid(&t.q, &t.k, &short_lse, &grid, ATTN_REDUCE_SUM, &opt) == ATTN_ERR_SHAPE,
          "refusal: an LSE of the wrong length");
    CHECK(attn_weights_grid(&t.q, &t.k, NULL, &grid, ATTN_REDUCE_SUM, &opt) == ATTN_ERR_NULL,
          "refusal: NULL lse");
    /* empty sides: R = 0 exactly when Lq = 0 (C likewise), nothing to write */
    attn_tensor q0 = t.q, k0 = t.k, lse0 = t.lse;
    q0.shape[2] = 0;
    lse0.shape[2] = 0;
    grid = attn_tensor_4d(g, ATTN_F32, 1, 2, 0, 9);
    CHECK(attn_weights_grid(&q0, &t.k, &lse0, &grid, ATTN_REDUCE_SUM, &opt) == ATTN_OK,
          "Lq = 0, R = 0: %s", attn_last_error());
    k0.shape[2] = 0;
    grid = attn_tensor_4d(g, ATTN_F32, 1, 2, 6, 0);
    CHECK(attn_weights_grid(&t.q, &k0, &t.lse, &grid, ATTN_REDUCE_MAX, &opt) == ATTN_OK,
          "Lk = 0, C = 0: %s", attn_last_error());
    CHECK(count_written(g, 2 * 7 * 10) == 0, "refusals wrote %lld floats of the grid",
          (long long)count_written(g, 2 * 7 * 10));
    tcall_free(&t);
}

int main(void) {
    uint64_t seed = 1;
    fcase c = fcase_new(seed++, 2, 4, 2, 37, 53, 24, 24);
    one_case(c);
    c = fcase_new(seed++, 1, 2, 2, 70, 150, 16, 16);  // more rows than a tile, keys over two
    c.causal = 1;
    one_case(c);
    c.align = 1;
    c.dist = 1;
    one_case(c);
    c = fcase_new(seed++, 3, 2, 1, 23, 31, 8, 8);  // batch 2 has no keys at all
    c.kvlen = 2;
    c.causal = 1;
    c.align = 1;
    one_case(c);
    c = fcase_new(seed++, 1, 3, 3, 29, 29, 12, 12);
    c.window = 1;
    c.wl = 4;
    c.wr = 2;
    c.alibi = 1;
    c.softcap = 2.5f;
    one_case(c);
    c = fcase_new(seed++, 2, 2, 1, 19, 41, 8, 8);  // masks over whole rows and blocks
    c.mask = 3;
    c.mshape = 7;
    c.mask_true = 0.3;
    c.bias_ninf = 0.3;
    one_case(c);
    c = fcase_new(seed++, 2, 4, 2, 33, 45, 16, 16);  // [B, L, H, D], K in a NaN cache
    c.layout = 1;
    c.cache = 1;
    c.causal = 1;
    one_case(c);
    refusals();
    return check_summary("weights");
}
