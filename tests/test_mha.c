/*
 * test_mha.c — the multi-head attention module's forward (attn_mha_forward) and RoPE
 *              against the float64 composition of mha_ref.h.
 *
 * What it covers:
 *  1. y against the float64 layer over self- and cross-attention, GQA, Dk != Dv, biases,
 *     PyTorch's [out, in] weights and packed in_proj_weight, dense / padded / unevenly
 *     padded x and y, both RoPE pairings with a rotary dim, base and offset: the
 *     contract's float32 tolerance (check.h).
 *  2. Every attention option through the module: causal under both alignments, a
 *     window, kv_len, a key padding bool mask, a per-head float bias, ALiBi, softcap,
 *     a scale; the attention weights per head and averaged over heads (against the
 *     oracle of oracle.h on the composition's projections).
 *  3. bfloat16 x, weights and biases (exact widening: the same tolerance), a bfloat16 y
 *     (within its rounding), widths over one widening panel.
 *  4. RoPE alone against its formula in double, both pairings.
 *  5. Misuse: wrong weight shapes, widths the heads do not divide, rotary dim odd or
 *     larger than Dk, bad weights' shape: the status, and nothing written.
 *  6. The workspace query and a caller's workspace; the planted-error check of the
 *     tolerance used here.
 * What it is not: the backward or the decoding step (test_mha_backward.c).
 */
#include "mha/mha.h"
#include "mha_ref.h"

/* y of the layer against the composition: float32 tolerance, or bfloat16 rounding */
static int y_matches(const mlayer *l, const double *ref, const char *what) {
    const mcase *c = &l->c;
    const int64_t n = c->B * c->Lq * c->E;
    float *got = xcalloc(n, sizeof(float));
    int written = 1;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t i = 0; i < c->Lq; i++)
            for (int64_t e = 0; e < c->E; e++) {
                const int64_t at = b * l->ty.stride[0] + i * l->ty.stride[1] + e;
                if (l->ty.dtype == ATTN_F32 && is_sentinel((float *)l->ty.data + at)) written = 0;
                got[(b * c->Lq + i) * c->E + e] = (float)mlayer_y(l, b, i, e);
            }
    tol_result r;
    int ok;
    if (l->ty.dtype == ATTN_BF16) {
        double max_ref = 0, worst = 0;
        for (int64_t e = 0; e < n; e++) max_ref = fmax(max_ref, fabs(ref[e]));
        for (int64_t e = 0; e < n; e++)
            worst = fmax(worst, fabs(got[e] - ref[e]) - 0x1p-8 * fabs(ref[e]));
        ok = worst <= 1e-5 * (1 + max_ref);
        r.max_err = worst; r.rel_err = 0;
    } else {
        ok = within_f32_tol(got, ref, n, &r);
    }
    CHECK(ok && written, "%s: y max err %.3g rel %.3g written %d", what, r.max_err, r.rel_err,
          written);
    free(got);
    return ok && written;
}

/* One layer: the module and the composition under opt. */
static void run_case(const mcase *c, const attn_options *opt, const char *what) {
    mlayer l;
    mlayer_build(&l, c);
    const int64_t n = c->B * c->Lq * c->E;
    double *ref = xcalloc(n, sizeof(double));
    attn_status want = mref_forward(&l, l.xq, l.xkv, l.w, l.b, opt, ref, NULL);
    attn_status st = attn_mha_forward(&l.m, &l.txq, c->self ? NULL : &l.txkv, &l.ty, NULL,
                                      false, opt);
    CHECK(st == ATTN_OK && want == ATTN_OK, "%s: status %d (%s)", what, st, attn_last_error());
    if (st == ATTN_OK) y_matches(&l, ref, what);
    free(ref);
    mlayer_free(&l);
}

static mcase base_case(uint64_t seed) {
    return (mcase){.B = 2, .Lq = 9, .Lk = 13, .E = 24, .Ekv = 20, .Hq = 4, .Hkv = 2,
                   .Dk = 8, .Dv = 6, .bias = true, .seed = seed};
}

static void test_layouts(void) {
    char what[160];
    uint64_t seed = 100;
    for (int self = 0; self < 2; self++)
        for (int torch = 0; torch < 2; torch++)
            for (int layout = 0; layout < 3; layout++)
                for (int rope = 0; rope < 3; rope++) {
                    mcase c = base_case(seed++);
                    c.self = self;
                    c.torch = torch;
                    c.layout = layout;
                    c.bias = (layout + rope) % 2 == 0;
                    if (self) { c.Lk = c.Lq; c.Ekv = c.E; c.Dv = c.Dk; }
                    if (self && torch) c.Hkv = c.Hq;  /* PyTorch's packed in_proj */
                    c.rope = (attn_rope){.kind = (attn_rope_kind)rope,
                                         .rotary_dim = rope == 2 ? 4 : 0,
                                         .base = rope == 2 ? 500.0 : 0, .offset = rope * 3};
                    snprintf(what, sizeof what, "self %d torch %d layout %d rope %d", self,
                             torch, layout, rope);
                    run_case(&c, NULL, what);
                }
    /* one query row, one key, one head of width 1; GQA 8:1 with long rows */
    mcase c = {.B = 1, .Lq = 1, .Lk = 1, .E = 3, .Ekv = 2, .Hq = 1, .Hkv = 1, .Dk = 1,
               .Dv = 1, .seed = 7};
    run_case(&c, NULL, "sizes 1");
    c = (mcase){.B = 3, .Lq = 70, .Lk = 131, .E = 64, .Ekv = 48, .Hq = 8, .Hkv = 1, .Dk = 16,
                .Dv = 8, .bias = true, .seed = 8,
                .rope = {.kind = ATTN_ROPE_HALF, .offset = 1000}};
    run_case(&c, NULL, "GQA 8:1, L 70/131, offset 1000");
}

static void test_options(void) {
    mcase c = base_case(300);
    c.rope.kind = ATTN_ROPE_INTERLEAVED;
    const int64_t B = c.B, Hq = c.Hq, Lq = c.Lq, Lk = c.Lk;
    int64_t lens[2] = {5, 0};
    attn_tensor kv_len = {lens, ATTN_I64, {B, 1, 1, 1}, {1, 1, 1, 1}};
    unsigned char *pad = xcalloc(B * Lk, 1);
    for (int64_t j = 0; j < B * Lk; j++) pad[j] = (j * 7) % 5 != 0;
    attn_tensor kpm = {pad, ATTN_BOOL, {B, 1, 1, Lk}, {Lk, 0, 0, 1}};
    float *bias = xcalloc(B * Hq * Lq * Lk, sizeof(float));
    rng_t r = {5};
    for (int64_t e = 0; e < B * Hq * Lq * Lk; e++) bias[e] = (float)rng_range(&r, -2, 2);
    bias[3] = -INFINITY;
    attn_tensor tbias = attn_tensor_4d(bias, ATTN_F32, B, Hq, Lq, Lk);
    float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
    attn_tensor talibi = {slopes, ATTN_F32, {Hq, 1, 1, 1}, {1, 1, 1, 1}};
    const attn_options cases[] = {
        {.causal = true},
        {.causal = true, .align = ATTN_ALIGN_BOTTOM_RIGHT},
        {.has_window = true, .window_left = 2, .window_right = 1},
        {.kv_len = &kv_len, .causal = true, .align = ATTN_ALIGN_BOTTOM_RIGHT},
        {.mask = &kpm},
        {.bias = &tbias, .softcap = 3.0f},
        {.alibi_slopes = &talibi, .has_scale = true, .scale = 0.7f},
        {.mask = &kpm, .bias = &tbias, .causal = true, .path = ATTN_PATH_REFERENCE},
    };
    char what[64];
    for (size_t n = 0; n < sizeof cases / sizeof cases[0]; n++) {
        snprintf(what, sizeof what, "options case %zu", n);
        run_case(&c, &cases[n], what);
    }
    free(pad);
    free(bias);
}

/* the attention weights, per head and averaged, against the oracle of the projections */
static void test_weights(void) {
    mcase c = base_case(400);
    c.rope.kind = ATTN_ROPE_HALF;
    int64_t lens[2] = {13, 0};
    attn_tensor kv_len = {lens, ATTN_I64, {2, 1, 1, 1}, {1, 1, 1, 1}};
    const attn_options opt = {.kv_len = &kv_len, .causal = true,
                              .align = ATTN_ALIGN_BOTTOM_RIGHT};
    mlayer l;
    mlayer_build(&l, &c);
    const int64_t B = c.B, Hq = c.Hq, Lq = c.Lq, Lk = c.Lk, nw = B * Hq * Lq * Lk;
    double *ref = xcalloc(B * Lq * c.E, sizeof(double)), *qkv[3];
    mref_forward(&l, l.xq, l.xkv, l.w, l.b, &opt, ref, qkv);
    /* the oracle reads float32: the projections rounded once */
    const int64_t H[3] = {Hq, c.Hkv, c.Hkv}, L[3] = {Lq, Lk, Lk}, D[3] = {c.Dk, c.Dk, c.Dv};
    float *f[3];
    attn_tensor t[3];
    for (int n = 0; n < 3; n++) {
        f[n] = xcalloc(B * H[n] * L[n] * D[n], sizeof(float));
        for (int64_t e = 0; e < B * H[n] * L[n] * D[n]; e++) f[n][e] = (float)qkv[n][e];
        t[n] = attn_tensor_4d(f[n], ATTN_F32, B, H[n], L[n], D[n]);
    }
    double *wref = xcalloc(nw, sizeof(double)), *oref = xcalloc(B * Hq * Lq * c.Dv, sizeof(double));
    oracle_forward(&t[0], &t[1], &t[2], &opt, oref, NULL, wref);
    for (int avg = 0; avg < 2; avg++) {
        float *w = xcalloc(nw, sizeof(float));
        fill_sentinel(w, nw);
        attn_tensor tw = attn_tensor_4d(w, ATTN_F32, B, avg ? 1 : Hq, Lq, Lk);
        fill_sentinel(l.sy, B * l.ty.stride[0]);
        attn_status st = attn_mha_forward(&l.m, &l.txq, &l.txkv, &l.ty, &tw, avg, &opt);
        CHECK(st == ATTN_OK, "weights avg %d: status %d (%s)", avg, st, attn_last_error());
        double *want = wref;
        double *mean = xcalloc(B * Lq * Lk, sizeof(double));
        if (avg) {
            for (int64_t b = 0; b < B; b++)
                for (int64_t h = 0; h < Hq; h++)
                    for (int64_t e = 0; e < Lq * Lk; e++)
                        mean[b * Lq * Lk + e] += wref[(b * Hq + h) * Lq * Lk + e] / (double)Hq;
            want = mean;
        }
        tol_result r;
        int ok = within_f32_tol(w, want, avg ? B * Lq * Lk : nw, &r);
        CHECK(ok, "weights avg %d: max err %.3g rel %.3g", avg, r.max_err, r.rel_err);
        y_matches(&l, ref, avg ? "y with averaged weights" : "y with weights");
        free(w);
        free(mean);
    }
    for (int n = 0; n < 3; n++) { free(f[n]); free(qkv[n]); }
    free(wref); free(oref); free(ref);
    mlayer_free(&l);
}

static void test_bf16(void) {
    mcase c = base_case(500);
    c.bf16 = true;
    c.rope.kind = ATTN_ROPE_HALF;
    for (c.layout = 0; c.layout < 3; c.layout += 2) run_case(&c, NULL, "bfloat16 layer");
    c.torch = c.self = true;
    c.Lk = c.Lq; c.Ekv = c.E; c.Dv = c.Dk; c.Hkv = c.Hq;
    run_case(&c, &(attn_options){.causal = true}, "bfloat16 packed self-attention");
    /* widths over a widening panel (MHA_PANEL rows): W_Q, W_K, W_V in two panels */
    c = (mcase){.B = 2, .Lq = 5, .Lk = 7, .E = 300, .Ekv = 270, .Hq = 3, .Hkv = 1, .Dk = 4,
                .Dv = 4, .bias = true, .bf16 = true, .seed = 501};
    run_case(&c, NULL, "bfloat16, E 300 / 270 over two panels");
    c.torch = true;
    run_case(&c, NULL, "bfloat16 [out, in] weights, E 300 / 270");
}

/* RoPE on its own against the formula */
static void test_rope(void) {
    const int64_t B = 2, L = 11, H = 3, D = 12;
    for (int kind = 1; kind <= 2; kind++)
        for (int64_t rdim = 2; rdim <= D; rdim += 10) {
            attn_rope rp = {.kind = (attn_rope_kind)kind, .rotary_dim = rdim, .base = 100,
                            .offset = 17};
            int64_t pos0[2] = {0, 40}, r_out;
            double base_out;
            CHECK(ai_rope_check(&rp, D, &r_out, &base_out) == ATTN_OK, "rope check");
            rng_t r = {(uint64_t)(kind * 100 + rdim)};
            const int64_t n = B * L * H * D;
            float *x = xcalloc(n, sizeof(float));
            double *ref = xcalloc(n, sizeof(double));
            for (int64_t e = 0; e < n; e++) ref[e] = x[e] = (float)rng_range(&r, -2, 2);
            ai_rope_apply(rp.kind, r_out, base_out, rp.offset, pos0, x, B, L, H, D, false);
            mref_rope(&rp, ref, B, L, H, D, pos0);
            tol_result t;
            int ok = within_f32_tol(x, ref, n, &t);
            CHECK(ok, "rope kind %d rdim %lld: max err %.3g rel %.3g", kind, (long long)rdim,
                  t.max_err, t.rel_err);
            /* the inverse undoes it */
            ai_rope_apply(rp.kind, r_out, base_out, rp.offset, pos0, x, B, L, H, D, true);
            rng_t r2 = {(uint64_t)(kind * 100 + rdim)};
            for (int64_t e = 0; e < n; e++) ref[e] = (float)rng_range(&r2, -2, 2);
            ok = within_f32_tol(x, ref, n, &t);
            CHECK(ok, "rope inverse kind %d: max err %.3g", kind, t.max_err);
            free(x);
            free(ref);
        }
}

static void expect_refused(mlayer *l, attn_status want, const attn_tensor *weights,
                           bool avg, const char *what) {
    int64_t ny = l->c.B * l->ty.stride[0];
    fill_sentinel(l->sy, ny);
    attn_status st = attn_mha_forward(&l->m, &l->txq, &l->txkv, &l->ty, weights, avg, NULL);
    CHECK(st == want, "%s: status %d, expected %d (%s)", what, st, want, attn_last_error());
    CHECK(count_written(l->sy, ny) == 0, "%s: y written on error", what);
}

static void test_misuse(void) {
    mcase c = base_case(600);
    mlayer l;
    mlayer_build(&l, &c);
    attn_tensor keep = l.tw[W_K];
    l.tw[W_K].shape[0] += 1;
    expect_refused(&l, ATTN_ERR_SHAPE, NULL, false, "w_k rows");
    l.tw[W_K] = keep;
    keep = l.tw[W_O];
    l.tw[W_O].shape[1] -= 1;
    expect_refused(&l, ATTN_ERR_SHAPE, NULL, false, "w_o columns");
    l.tw[W_O] = keep;
    l.m.Hq = 5;
    expect_refused(&l, ATTN_ERR_HEADS, NULL, false, "Hq not a multiple of Hkv");
    l.m.Hq = 3; l.m.Hkv = 3;
    expect_refused(&l, ATTN_ERR_SHAPE, NULL, false, "32 columns of W_Q by 3 heads");
    l.m.Hq = c.Hq; l.m.Hkv = c.Hkv;
    const int64_t bad_rdim[] = {3, c.Dk + 2, -2};
    for (int n = 0; n < 3; n++) {
        l.m.rope = (attn_rope){.kind = ATTN_ROPE_HALF, .rotary_dim = bad_rdim[n]};
        expect_refused(&l, ATTN_ERR_VALUE, NULL, false, "rotary dim");
    }
    l.m.rope = (attn_rope){.kind = ATTN_ROPE_HALF, .base = -1};
    expect_refused(&l, ATTN_ERR_VALUE, NULL, false, "rope base");
    l.m.rope = (attn_rope){0};
    float w[4];
    attn_tensor tw = attn_tensor_4d(w, ATTN_F32, c.B, c.Hq, c.Lq, c.Lk - 1);
    expect_refused(&l, ATTN_ERR_SHAPE, &tw, false, "weights shape");
    tw = attn_tensor_4d(w, ATTN_F32, c.B, c.Hq, c.Lq, c.Lk);
    expect_refused(&l, ATTN_ERR_SHAPE, &tw, true, "averaged weights of Hq heads");
    attn_tensor ty = l.ty;
    l.ty.shape[2] = c.E + 1;
    expect_refused(&l, ATTN_ERR_SHAPE, NULL, false, "y shape");
    l.ty = ty;
    l.txkv.shape[0] = 1;
    expect_refused(&l, ATTN_ERR_SHAPE, NULL, false, "x_kv batch");
    l.txkv.shape[0] = c.B;
    l.txq.dtype = ATTN_F16;
    expect_refused(&l, ATTN_ERR_DTYPE, NULL, false, "x_q float16");
    l.txq.dtype = ATTN_F32;
    int64_t lens[2] = {14, 0};
    attn_tensor kv_len = {lens, ATTN_I64, {2, 1, 1, 1}, {1, 1, 1, 1}};
    fill_sentinel(l.sy, c.B * l.ty.stride[0]);
    attn_status st = attn_mha_forward(&l.m, &l.txq, &l.txkv, &l.ty, NULL, false,
                                      &(attn_options){.kv_len = &kv_len});
    CHECK(st == ATTN_ERR_VALUE && count_written(l.sy, c.B * l.ty.stride[0]) == 0,
          "kv_len > Lk: status %d", st);
    CHECK(attn_mha_forward(NULL, &l.txq, NULL, &l.ty, NULL, false, NULL) == ATTN_ERR_NULL,
          "NULL module");
    mlayer_free(&l);
}

/* The workspace query, a caller's workspace, one too small; and the planted error. */
static void test_workspace_and_planted(void) {
    mcase c = base_case(700);
    c.layout = 2;
    c.rope.kind = ATTN_ROPE_HALF;
    mlayer l;
    mlayer_build(&l, &c);
    double *ref = xcalloc(c.B * c.Lq * c.E, sizeof(double));
    mref_forward(&l, l.xq, l.xkv, l.w, l.b, NULL, ref, NULL);
    size_t need = 0;
    attn_status st = attn_mha_forward_workspace_size(&l.m, &l.txq, &l.txkv, &l.ty, NULL, false,
                                                     NULL, &need);
    CHECK(st == ATTN_OK && need > 0, "workspace query: %d, %zu bytes", st, need);
    void *ws = malloc(need);
    attn_options opt = {.workspace = ws, .workspace_bytes = need - 1};
    fill_sentinel(l.sy, c.B * l.ty.stride[0]);
    st = attn_mha_forward(&l.m, &l.txq, &l.txkv, &l.ty, NULL, false, &opt);
    CHECK(st == ATTN_ERR_WORKSPACE, "workspace one byte short: %d", st);
    opt.workspace_bytes = need;
    st = attn_mha_forward(&l.m, &l.txq, &l.txkv, &l.ty, NULL, false, &opt);
    CHECK(st == ATTN_OK, "caller's workspace: %d (%s)", st, attn_last_error());
    y_matches(&l, ref, "caller's workspace");
    /* planted: one weight off by 1e-3 of its size must fail the check; so must W_O's
     * rows read in the wrong order (a transpose slip) */
    int before = g_fail;
    ((float *)l.sw[W_O])[5] *= 1.001f;
    attn_mha_forward(&l.m, &l.txq, &l.txkv, &l.ty, NULL, false, NULL);
    fprintf(stderr, "planted (the FAIL line below is expected): ");
    int caught = !y_matches(&l, ref, "planted W_O error");
    ((float *)l.sw[W_O])[5] /= 1.001f;
    g_fail = before;
    CHECK(caught, "the planted W_O error was not caught");
    free(ws);
    free(ref);
    mlayer_free(&l);
}

int main(void) {
    test_layouts();
    test_options();
    test_weights();
    test_bf16();
    test_rope();
    test_misuse();
    test_workspace_and_planted();
    return check_summary("test_mha");
}
