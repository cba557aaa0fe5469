/*
 * test_mha_saved.c — training without the recomputation (attn_mha_forward_save,
 *                    attn_mha_backward_saved, their size queries) against the module's
 *                    own forward and recomputing backward.
 *
 * What it covers:
 *  1. y of attn_mha_forward_save is attn_mha_forward's, bit for bit, and the gradients of
 *     attn_mha_backward_saved are attn_mha_backward's, bit for bit (the recomputing
 *     backward is held to finite differences by test_mha_backward.c, so these are right
 *     by the same measure), for self- and cross-attention, GQA, Dk != Dv, RoPE both
 *     ways, masks (causal both ways, kv_len, a key padding mask), PyTorch's packed
 *     layout, padded x, bfloat16 x and weights, the averaged and the per-head weights
 *     asked for in the forward; each over a saved buffer only float-aligned, read once
 *     more from a copy elsewhere, each call once more over a caller's workspace of
 *     exactly the queried size.
 *  2. The backward reads what was saved: one bit changed in the saved Q changes dW_Q
 *     (a backward that recomputed would not see it) — the planted error of item 1's
 *     bit-for-bit comparison.
 *  3. Misuse: a buffer one byte short, a workspace one byte short (ATTN_ERR_WORKSPACE,
 *     nothing written), NULL, a buffer not aligned to a float, a buffer no forward
 *     filled or one of another layer's shapes (ATTN_ERR_VALUE, nothing written), a
 *     failed forward's buffer refused; in
 *     the fault-injection build each allocation failed in turn (ATTN_ERR_NOMEM,
 *     nothing written).
 */
#include "mha_ref.h"

static void grads_build(mgrads *gr, const mlayer *l) {
    const mcase *c = &l->c;
    memset(gr, 0, sizeof *gr);
    gr->t[G_XQ] = attn_tensor_4d(NULL, ATTN_F32, c->B, c->Lq, c->E, 1);
    gr->n[G_XQ] = c->B * c->Lq * c->E;
    gr->t[G_XKV] = attn_tensor_4d(NULL, ATTN_F32, c->B, c->Lk, c->Ekv, 1);
    gr->n[G_XKV] = c->B * c->Lk * c->Ekv;
    for (int n = 0; n < 4; n++) {
        gr->t[G_W + n] = attn_tensor_4d(NULL, ATTN_F32, l->in[n], l->out[n], 1, 1);
        gr->n[G_W + n] = l->in[n] * l->out[n];
        gr->t[G_B + n] = attn_tensor_4d(NULL, ATTN_F32, l->out[n], 1, 1, 1);
        gr->n[G_B + n] = l->out[n];
    }
    for (int n = 0; n < G_N; n++) {
        gr->buf[n] = xcalloc(gr->n[n] + 1, sizeof(float));
        fill_sentinel(gr->buf[n], gr->n[n] + 1);
        gr->t[n].data = gr->buf[n];
    }
    mgrads_bind(gr, c);
}

static int grads_same(const mgrads *a, const mgrads *b) {
    for (int n = 0; n < G_N; n++)
        if (memcmp(a->buf[n], b->buf[n], (size_t)(a->n[n] + 1) * sizeof(float)) != 0) return 0;
    return 1;
}

static int grads_untouched(const mgrads *gr) {
    for (int n = 0; n < G_N; n++)
        if (count_written(gr->buf[n], gr->n[n] + 1)) return 0;
    return 1;
}

static int64_t y_elems(const mlayer *l) {
    int64_t n;
    (void)mrows_tensor(NULL, l->ty.dtype, l->c.B, l->c.Lq, l->c.E, l->c.layout, &n);
    return n;
}

/* dy drawn, dense float32 [B, Lq, E] */
static float *draw_dy(const mcase *c, attn_tensor *dy) {
    const int64_t n = c->B * c->Lq * c->E;
    float *p = xcalloc(n, sizeof(float));
    rng_t r = {c->seed ^ 0x5eed};
    for (int64_t e = 0; e < n; e++) p[e] = (float)rng_range(&r, -1, 1);
    *dy = attn_tensor_4d(p, ATTN_F32, c->B, c->Lq, c->E, 1);
    return p;
}

/* weights: 0 none, 1 averaged [B, 1, Lq, Lk], 2 per head [B, Hq, Lq, Lk] */
static float *alloc_weights(const mcase *c, int weights, attn_tensor *t, int64_t *n) {
    if (!weights) { *n = 0; return NULL; }
    const int64_t h = weights == 1 ? 1 : c->Hq;
    *n = c->B * h * c->Lq * c->Lk;
    float *p = xcalloc(*n, sizeof(float));
    *t = attn_tensor_4d(p, ATTN_F32, c->B, h, c->Lq, c->Lk);
    return p;
}

/* One case: the saved pair against the plain pair, bit for bit; with a caller's
 * workspace of the queried size too. Returns the number of mismatches (0 expected).
 * plant: flip a bit of the saved Q between the two calls (then dW_Q must differ). */
static int run_case(const mcase *c, const attn_options *opt, int weights, const char *what,
                    bool plant) {
    mlayer l;
    mlayer_build(&l, c);
    const attn_tensor *xkv = c->self ? NULL : &l.txkv;
    const int64_t ny = y_elems(&l);
    attn_tensor tw0 = {0}, tw1 = {0};
    int64_t nw;
    float *w0 = alloc_weights(c, weights, &tw0, &nw), *w1 = alloc_weights(c, weights, &tw1, &nw);
    const bool avg = weights == 1;
    int bad = 0;

    /* the plain forward and backward */
    attn_status st = attn_mha_forward(&l.m, &l.txq, xkv, &l.ty, w0 ? &tw0 : NULL, avg, opt);
    CHECK(st == ATTN_OK, "%s: forward %s", what, attn_last_error());
    void *y0 = xcalloc(ny, 4);
    memcpy(y0, l.sy, (size_t)ny * 4);
    attn_tensor dy;
    float *dyb = draw_dy(c, &dy);
    mgrads g0, g1;
    grads_build(&g0, &l);
    grads_build(&g1, &l);
    st = attn_mha_backward(&l.m, &l.txq, xkv, &dy, &g0.g, opt);
    CHECK(st == ATTN_OK, "%s: backward %s", what, attn_last_error());

    /* the saved pair, the buffer 4 bytes past malloc's alignment (a float's is enough) */
    size_t sb = 0;
    st = attn_mha_saved_size(&l.m, &l.txq, xkv, &sb);
    CHECK(st == ATTN_OK && sb > 0, "%s: saved size %s", what, attn_last_error());
    char *raw = xcalloc((int64_t)sb + 8, 1);
    char *saved = raw + 4;
    fill_sentinel(l.sy, ny);
    st = attn_mha_forward_save(&l.m, &l.txq, xkv, &l.ty, w1 ? &tw1 : NULL, avg, opt, saved, sb);
    CHECK(st == ATTN_OK, "%s: forward_save %s", what, attn_last_error());
    bad += memcmp(y0, l.sy, (size_t)ny * 4) != 0;
    CHECK(memcmp(y0, l.sy, (size_t)ny * 4) == 0, "%s: y of forward_save differs", what);
    if (w0) {
        bad += memcmp(w0, w1, (size_t)nw * 4) != 0;
        CHECK(memcmp(w0, w1, (size_t)nw * 4) == 0, "%s: weights of forward_save differ", what);
    }
    if (plant) {  /* the saved Q's first element, one mantissa bit; Q sits after 64 bytes */
        float *q = (float *)saved + 16;
        uint32_t u;
        memcpy(&u, q, 4);
        u ^= 1u << 12;
        memcpy(q, &u, 4);
    }
    st = attn_mha_backward_saved(&l.m, &l.txq, xkv, &dy, &g1.g, opt, saved, sb);
    CHECK(st == ATTN_OK, "%s: backward_saved %s", what, attn_last_error());
    const int same = grads_same(&g0, &g1);
    bad += !same;
    if (!plant) CHECK(same, "%s: the saved backward's gradients differ", what);

    /* the buffer copied elsewhere reads the same */
    if (!plant) {
        char *copy = xcalloc((int64_t)sb + 64, 1);
        memcpy(copy + 8, saved, sb);
        mgrads g3;
        grads_build(&g3, &l);
        st = attn_mha_backward_saved(&l.m, &l.txq, xkv, &dy, &g3.g, opt, copy + 8, sb);
        CHECK(st == ATTN_OK && grads_same(&g0, &g3), "%s: backward_saved from a copy: %s", what,
              attn_last_error());
        bad += !grads_same(&g0, &g3);
        mgrads_free(&g3);
        free(copy);
    }
    /* once more over caller workspaces of the queried sizes */
    if (!plant) {
        size_t wf = 0, wb = 0;
        CHECK(attn_mha_forward_save_workspace_size(&l.m, &l.txq, xkv, &l.ty, w1 ? &tw1 : NULL,
                                                   avg, opt, &wf) == ATTN_OK &&
              attn_mha_backward_workspace_size(&l.m, &l.txq, xkv, &dy, &g1.g, opt, saved, sb,
                                               &wb) == ATTN_OK,
              "%s: workspace queries %s", what, attn_last_error());
        attn_options o = opt ? *opt : (attn_options){0};
        o.workspace = xcalloc((int64_t)(wf > wb ? wf : wb) + 1, 1);
        mgrads g2;
        grads_build(&g2, &l);
        fill_sentinel(l.sy, ny);
        o.workspace_bytes = wf;
        st = attn_mha_forward_save(&l.m, &l.txq, xkv, &l.ty, w1 ? &tw1 : NULL, avg, &o, saved, sb);
        CHECK(st == ATTN_OK && memcmp(y0, l.sy, (size_t)ny * 4) == 0,
              "%s: forward_save over a caller's workspace: %s", what, attn_last_error());
        o.workspace_bytes = wb;
        st = attn_mha_backward_saved(&l.m, &l.txq, xkv, &dy, &g2.g, &o, saved, sb);
        CHECK(st == ATTN_OK && grads_same(&g0, &g2),
              "%s: backward_saved over a caller's workspace: %s", what, attn_last_error());
        bad += !grads_same(&g0, &g2);
        mgrads_free(&g2);
        free(o.workspace);
    }
    mgrads_free(&g0);
    mgrads_free(&g1);
    free(raw); free(y0); free(dyb); free(w0); free(w1);
    mlayer_free(&l);
    return bad;
}

static mcase small_case(uint64_t seed) {
    return (mcase){.B = 2, .Lq = 5, .Lk = 7, .E = 12, .Ekv = 10, .Hq = 4, .Hkv = 2, .Dk = 4,
                   .Dv = 3, .bias = true, .seed = seed};
}

static void test_same_bits(void) {
    int64_t lens[2] = {4, 0};
    attn_tensor kv_len = {lens, ATTN_I64, {2, 1, 1, 1}, {1, 1, 1, 1}};
    unsigned char pad[14] = {1, 1, 0, 1, 1, 0, 1, 1, 1, 1, 1, 1, 0, 1};
    attn_tensor kpm = {pad, ATTN_BOOL, {2, 1, 1, 7}, {7, 0, 0, 1}};
    char what[160];
    uint64_t seed = 10;
    for (int self = 0; self < 2; self++)
        for (int v = 0; v < 6; v++) {
            mcase c = small_case(seed++);
            c.self = self;
            if (self) { c.Lk = c.Lq; c.Ekv = c.E; c.Dv = c.Dk; }
            c.torch = v >= 3;
            if (self && c.torch) { c.Hkv = c.Hq; c.Dk = c.Dv = 2; }
            c.layout = v % 3;
            c.bias = v != 1;
            c.bf16 = v == 5;
            c.rope = (attn_rope){.kind = (attn_rope_kind)(v % 3), .offset = v, .base = 50};
            const attn_options opts[3] = {
                {.causal = true},
                {.causal = true, .align = ATTN_ALIGN_BOTTOM_RIGHT, .kv_len = self ? NULL : &kv_len},
                {.mask = self ? NULL : &kpm, .softcap = 2.0f},
            };
            for (int weights = 0; weights < 3; weights++) {
                snprintf(what, sizeof what, "self %d variant %d weights %d", self, v, weights);
                run_case(&c, &opts[v % 3], weights, what, false);
            }
        }
    mcase c = small_case(99);
    c.Hkv = 1;
    run_case(&c, NULL, 0, "GQA 4:1, no options", false);
    /* one query row: the products by W are matrix-vector ones */
    c = (mcase){.B = 1, .Lq = 1, .Lk = 3, .E = 6, .Ekv = 5, .Hq = 2, .Hkv = 1, .Dk = 2,
                .Dv = 3, .bias = true, .torch = true, .seed = 96};
    run_case(&c, NULL, 1, "one query row, averaged weights", false);
    /* BERT-like proportions, larger than a block of the attention */
    c = (mcase){.B = 2, .Lq = 70, .Lk = 70, .E = 48, .Ekv = 48, .Hq = 4, .Hkv = 4, .Dk = 12,
                .Dv = 12, .bias = true, .torch = true, .self = true, .seed = 95};
    run_case(&c, NULL, 0, "self-attention L 70, packed", false);
    run_case(&c, NULL, 1, "self-attention L 70, packed, averaged weights", false);
}

static void test_misuse(void) {
    mcase c = small_case(300);
    mlayer l;
    mlayer_build(&l, &c);
    const int64_t ny = y_elems(&l);
    size_t sb = 0;
    CHECK(attn_mha_saved_size(&l.m, &l.txq, &l.txkv, &sb) == ATTN_OK, "size");
    CHECK(attn_mha_saved_size(&l.m, &l.txq, &l.txkv, NULL) == ATTN_ERR_NULL, "size NULL");
    char *saved = xcalloc((int64_t)sb, 1);
    fill_sentinel(l.sy, ny);
    attn_status st = attn_mha_forward_save(&l.m, &l.txq, &l.txkv, &l.ty, NULL, false, NULL,
                                           saved, sb - 1);
    CHECK(st == ATTN_ERR_WORKSPACE && !count_written(l.sy, ny), "saved one byte short: %d", st);
    st = attn_mha_forward_save(&l.m, &l.txq, &l.txkv, &l.ty, NULL, false, NULL, NULL, sb);
    CHECK(st == ATTN_ERR_NULL && !count_written(l.sy, ny), "saved NULL: %d", st);
    st = attn_mha_forward_save(&l.m, &l.txq, &l.txkv, NULL, NULL, false, NULL, saved, sb);
    CHECK(st == ATTN_ERR_NULL, "y NULL: %d", st);
    char *odd = xcalloc((int64_t)sb + 8, 1);
    st = attn_mha_forward_save(&l.m, &l.txq, &l.txkv, &l.ty, NULL, false, NULL, odd + 1, sb);
    CHECK(st == ATTN_ERR_VALUE && !count_written(l.sy, ny), "saved not float-aligned: %d", st);
    free(odd);

    attn_tensor dy;
    float *dyb = draw_dy(&c, &dy);
    mgrads g;
    grads_build(&g, &l);
    /* a buffer no forward filled */
    st = attn_mha_backward_saved(&l.m, &l.txq, &l.txkv, &dy, &g.g, NULL, saved, sb);
    CHECK(st == ATTN_ERR_VALUE && grads_untouched(&g), "unfilled buffer: %d", st);
    st = attn_mha_backward_saved(&l.m, &l.txq, &l.txkv, &dy, &g.g, NULL, NULL, sb);
    CHECK(st == ATTN_ERR_NULL && grads_untouched(&g), "backward saved NULL: %d", st);
    /* a caller's workspace one byte short */
    size_t wf = 0;
    CHECK(attn_mha_forward_save_workspace_size(&l.m, &l.txq, &l.txkv, &l.ty, NULL, false, NULL,
                                               &wf) == ATTN_OK, "ws size");
    void *ws = xcalloc((int64_t)wf + 1, 1);
    attn_options o = {.workspace = ws, .workspace_bytes = wf - 1};
    st = attn_mha_forward_save(&l.m, &l.txq, &l.txkv, &l.ty, NULL, false, &o, saved, sb);
    CHECK(st == ATTN_ERR_WORKSPACE && !count_written(l.sy, ny), "workspace short: %d", st);
    /* filled, then read by a layer of other shapes (B = 1 of the same tensors) */
    st = attn_mha_forward_save(&l.m, &l.txq, &l.txkv, &l.ty, NULL, false, NULL, saved, sb);
    CHECK(st == ATTN_OK, "forward_save: %s", attn_last_error());
    attn_tensor xq1 = l.txq, xkv1 = l.txkv, dy1 = dy, dx1 = g.t[G_XQ], dkv1 = g.t[G_XKV];
    xq1.shape[0] = xkv1.shape[0] = dy1.shape[0] = dx1.shape[0] = dkv1.shape[0] = 1;
    attn_mha_grads g1 = g.g;
    g1.dx_q = &dx1;
    g1.dx_kv = &dkv1;
    st = attn_mha_backward_saved(&l.m, &xq1, &xkv1, &dy1, &g1, NULL, saved, sb);
    CHECK(st == ATTN_ERR_VALUE && grads_untouched(&g), "other shapes: %d", st);
    /* a forward that fails (kv_len past Lk) leaves a buffer the backward refuses */
    int64_t lens[2] = {99, 0};
    attn_tensor kv_len = {lens, ATTN_I64, {2, 1, 1, 1}, {1, 1, 1, 1}};
    const attn_options bad = {.kv_len = &kv_len};
    st = attn_mha_forward_save(&l.m, &l.txq, &l.txkv, &l.ty, NULL, false, &bad, saved, sb);
    CHECK(st == ATTN_ERR_VALUE, "failing forward_save: %d", st);
    st = attn_mha_backward_saved(&l.m, &l.txq, &l.txkv, &dy, &g.g, NULL, saved, sb);
    CHECK(st == ATTN_ERR_VALUE && grads_untouched(&g), "a failed forward's buffer: %d", st);
    mgrads_free(&g);
    free(ws); free(dyb); free(saved);
    mlayer_free(&l);
}

#ifdef ATTN_FAULT_INJECTION
#include "core/alloc.h"
/* each allocation of the saved pair failed in turn (the sanitizer build of
 * scripts/check.sh): ATTN_ERR_NOMEM, y and the gradients not written, nothing leaked */
static void test_nomem(void) {
    mcase c = small_case(500);
    mlayer l;
    mlayer_build(&l, &c);
    const int64_t ny = y_elems(&l);
    size_t sb = 0;
    CHECK(attn_mha_saved_size(&l.m, &l.txq, &l.txkv, &sb) == ATTN_OK, "size");
    char *saved = xcalloc((int64_t)sb, 1);
    attn_tensor dy;
    float *dyb = draw_dy(&c, &dy);
    mgrads g;
    grads_build(&g, &l);
    int points = 0;
    for (int64_t n = 1; n < 100; n++) {
        fill_sentinel(l.sy, ny);
        ai_fault_arm(n);
        attn_status st = attn_mha_forward_save(&l.m, &l.txq, &l.txkv, &l.ty, NULL, false, NULL,
                                               saved, sb);
        ai_fault_arm(0);
        if (st == ATTN_OK) break;
        points++;
        CHECK(st == ATTN_ERR_NOMEM && !count_written(l.sy, ny), "forward_save, allocation %lld "
              "failed: %d", (long long)n, st);
    }
    CHECK(attn_mha_forward_save(&l.m, &l.txq, &l.txkv, &l.ty, NULL, false, NULL, saved, sb) ==
          ATTN_OK, "forward_save");
    for (int64_t n = 1; n < 100; n++) {
        ai_fault_arm(n);
        attn_status st = attn_mha_backward_saved(&l.m, &l.txq, &l.txkv, &dy, &g.g, NULL, saved, sb);
        ai_fault_arm(0);
        if (st == ATTN_OK) break;
        points++;
        CHECK(st == ATTN_ERR_NOMEM && grads_untouched(&g), "backward_saved, allocation %lld "
              "failed: %d", (long long)n, st);
    }
    CHECK(points >= 2, "only %d allocation points failed", points);
    mgrads_free(&g);
    free(dyb); free(saved);
    mlayer_free(&l);
}
#endif

int main(void) {
#ifdef ATTN_FAULT_INJECTION
    test_nomem();
#endif
    test_same_bits();
    test_misuse();
    /* planted: one bit of the saved Q must change the gradients (the backward reads the
     * saved activations, and the bit-for-bit comparison sees a difference) */
    mcase c = small_case(400);
    CHECK(run_case(&c, NULL, 0, "planted", true) == 1, "the planted bit in the saved Q was not "
          "seen in the gradients");
    return check_summary("test_mha_saved");
}
