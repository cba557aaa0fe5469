/*
 * test_block_mask.c — block masks (attn_block_mask_*, options.block_mask) and score
 *                     functions (options.score_mod), docs/CONTRACT.md "Block masks" and
 *                     "Score functions".
 *
 * What it covers:
 *  1. A block mask computes what the dense bool mask it was made from computes, bit for
 *     bit (the same tiles, the same summary): O, LSE, the weights and attn_backward's
 *     dQ, dK, dV, on the fused float32 path (float32 and bfloat16 inputs), the float64
 *     path and the reference path, for 1 and 2 threads; masks of documents, a sliding
 *     window with global tokens, causal, random, all masked, all kept and random blocks,
 *     shared over B and H or per head, made from the tensor and from a callback (the
 *     same bytes), alone and beside a dense mask, a bias, causal, softcap, ALiBi, GQA,
 *     key lengths, sinks with dropout. And against the float64 reference path within the contract's float32
 *     bound (the dense mask's own check, test_masks.c, applied to the block mask).
 *  2. Its counts: documents of 64-aligned lengths have no partial block, and the counts
 *     add to the blocks there are; attn_weights_grid's grid the dense mask's bytes.
 *  3. A score function: s + f(b, h, i, j) gives the bits of the bias f (forward and
 *     backward), c tanh(s / c) with its derivative the bits of softcap = c; a NaN from it
 *     makes its row NaN.
 *  4. Misuse refused with nothing written: a block mask of other dims, the packed,
 *     cascade and multi-head calls, score_mod_grad alone, a backward without
 *     score_mod_grad, bad arguments to the makers.
 *  5. Planted errors the checks see: a block mask one element off, a derivative twice
 *     what it is.
 */
#include "attn.h"
#include "check.h"
#include "oracle.h"

enum { P_DOCS, P_WINDOW, P_CAUSAL, P_RANDOM, P_NONE, P_ALL, P_BLOCKS, P_COUNT };
static const char *const k_pattern[P_COUNT] = {"documents", "window+global", "causal",
                                               "random", "all masked", "all kept", "blocks"};

typedef struct kcase {
    int64_t B, Hq, Hkv, Lq, Lk, D;
    int pattern;
    bool per_head;        // the mask [B, Hq, Lq, Lk], else [1, 1, Lq, Lk]
    int extra;            // 0 none, 1 + dense mask, 2 + bias, 3 causal, 4 softcap + ALiBi, 5 kv_len,
                          // 6 sinks + dropout
    attn_dtype dt;        // F32, BF16 or F64
    uint64_t seed;
} kcase;

/* the pattern's cell (b, h, i, j); documents of lengths 1..L, and their boundaries */
static bool pattern_keep(const kcase *c, int64_t b, int64_t h, int64_t i, int64_t j, rng_t *r) {
    switch (c->pattern) {
    case P_DOCS: {  // documents of 37 + 11 (b + h) tokens: boundaries anywhere
        const int64_t n = 37 + 11 * (b + h);
        return i / n == j / n;
    }
    case P_WINDOW: return (j <= i && i - j < 40) || j < 8 || i < 4;
    case P_CAUSAL: return j <= i;
    case P_RANDOM: return rng_unif(r) < 0.6;
    case P_NONE: return false;
    case P_ALL: return true;
    default: return (i / 64 + j / 16 + b + h) % 3 == 0 || ((i / 64 + j / 16) % 5 == 1 && rng_unif(r) < 0.5);
    }
}

typedef struct ktensors {
    attn_tensor q, k, v, o, lse, w, mask, mask2, bias, kvlen, slopes, sinks, d_o, dq, dk, dv;
    void *buf[16];
    int64_t len[8];
    attn_block_mask *bm;
} ktensors;

static size_t esize(attn_dtype dt) { return attn_dtype_size(dt); }

static void fill(const attn_tensor *t, rng_t *r) {
    const int64_t n = t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3];
    for (int64_t x = 0; x < n; x++) {
        const double v = rng_range(r, -1, 1);
        if (t->dtype == ATTN_F64) ((double *)t->data)[x] = v;
        else if (t->dtype == ATTN_BF16) ((uint16_t *)t->data)[x] = attn_f32_to_bf16((float)v);
        else ((float *)t->data)[x] = (float)v;
    }
}

static attn_tensor dense4(ktensors *t, int slot, attn_dtype dt, int64_t a, int64_t b, int64_t c, int64_t d) {
    t->buf[slot] = xcalloc(a * b * c * d + 1, esize(dt));
    return attn_tensor_4d(t->buf[slot], dt, a, b, c, d);
}

static void build(const kcase *c, ktensors *t) {
    rng_t r = {c->seed};
    *t = (ktensors){0};
    const int64_t B = c->B, Hq = c->Hq, Hkv = c->Hkv, Lq = c->Lq, Lk = c->Lk, D = c->D;
    const attn_dtype io = c->dt == ATTN_F64 ? ATTN_F64 : ATTN_F32;
    t->q = dense4(t, 0, c->dt, B, Hq, Lq, D);
    t->k = dense4(t, 1, c->dt, B, Hkv, Lk, D);
    t->v = dense4(t, 2, c->dt, B, Hkv, Lk, D);
    t->o = dense4(t, 3, io, B, Hq, Lq, D);
    t->lse = dense4(t, 4, ATTN_F32, B, Hq, Lq, 1);
    t->w = dense4(t, 5, ATTN_F32, B, Hq, Lq, Lk);
    fill(&t->q, &r), fill(&t->k, &r), fill(&t->v, &r);
    const int64_t mb = c->per_head ? B : 1, mh = c->per_head ? Hq : 1;
    t->mask = dense4(t, 6, ATTN_BOOL, mb, mh, Lq, Lk);
    uint8_t *m = t->mask.data;
    for (int64_t b = 0; b < mb; b++)
        for (int64_t h = 0; h < mh; h++)
            for (int64_t i = 0; i < Lq; i++)
                for (int64_t j = 0; j < Lk; j++) *m++ = pattern_keep(c, b, h, i, j, &r);
    if (!c->per_head) {  // a [B, Hq, Lq, Lk] view of the shared mask
        t->mask.shape[0] = B, t->mask.shape[1] = Hq;
        t->mask.stride[0] = t->mask.stride[1] = 0;
    }
    t->mask2 = dense4(t, 7, ATTN_BOOL, B, 1, 1, Lk);
    for (int64_t x = 0; x < B * Lk; x++) ((uint8_t *)t->mask2.data)[x] = rng_unif(&r) < 0.85;
    t->bias = dense4(t, 8, ATTN_F32, 1, Hq, Lq, Lk);
    for (int64_t x = 0; x < Hq * Lq * Lk; x++) ((float *)t->bias.data)[x] = (float)rng_range(&r, -2, 2);
    t->kvlen = dense4(t, 9, ATTN_I64, B, 1, 1, 1);
    for (int64_t b = 0; b < B; b++) ((int64_t *)t->kvlen.data)[b] = b == 0 ? Lk : 1 + rng_int(&r, Lk);
    t->slopes = dense4(t, 10, ATTN_F32, 1, 1, 1, Hq);
    t->slopes.shape[0] = Hq, t->slopes.shape[3] = 1, t->slopes.stride[0] = 1;
    for (int64_t h = 0; h < Hq; h++) ((float *)t->slopes.data)[h] = 0.05f * (float)(h + 1);
    t->sinks = dense4(t, 15, ATTN_F32, Hq, 1, 1, 1);
    for (int64_t h = 0; h < Hq; h++) ((float *)t->sinks.data)[h] = 0.5f - 0.3f * (float)h;
    t->d_o = dense4(t, 11, io, B, Hq, Lq, D);
    fill(&t->d_o, &r);
    t->dq = dense4(t, 12, io, B, Hq, Lq, D);
    t->dk = dense4(t, 13, io, B, Hkv, Lk, D);
    t->dv = dense4(t, 14, io, B, Hkv, Lk, D);
}

static void release(ktensors *t) {
    for (int s = 0; s < 16; s++) free(t->buf[s]);
    attn_block_mask_free(t->bm);
}

/* the options of the case: the block mask or the dense mask it was made from */
static attn_options options(const kcase *c, ktensors *t, bool block, attn_path path, int threads) {
    attn_options opt = {.path = path, .threads = threads};
    if (block) opt.block_mask = t->bm;
    else opt.mask = &t->mask;
    switch (c->extra) {
    case 1:  // a dense mask beside it: the two combine (and the dense one is the extra)
        if (block) opt.mask = &t->mask2;
        break;
    case 2: opt.bias = &t->bias; break;
    case 3: opt.causal = true, opt.align = ATTN_ALIGN_BOTTOM_RIGHT; break;
    case 4: opt.softcap = 3.0f, opt.alibi_slopes = &t->slopes; break;
    case 5: opt.kv_len = &t->kvlen; break;
    case 6: opt.sinks = &t->sinks, opt.dropout_p = 0.25f, opt.dropout_seed = 42; break;
    default: break;
    }
    return opt;
}

typedef struct outputs {
    void *o, *lse, *w, *g[3];
    size_t no, nl, nw, ng[3];
} outputs;

static void take(void **dst, const attn_tensor *t, size_t *bytes) {
    *bytes = (size_t)(t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3]) * esize(t->dtype);
    *dst = xcalloc((int64_t)*bytes + 1, 1);
    memcpy(*dst, t->data, *bytes);
}

/* Forward (and backward) of the case, everything written copied out. The extra=1 case:
 * the dense call gets the AND of the two masks, made here. */
static attn_status run(const kcase *c, ktensors *t, bool block, attn_path path, int threads,
                       bool weights, bool backward, outputs *out) {
    *out = (outputs){0};
    attn_options opt = options(c, t, block, path, threads);
    attn_tensor both = {0};
    uint8_t *both_b = NULL;
    if (c->extra == 1 && !block) {
        const int64_t B = c->B, H = c->Hq, Lq = c->Lq, Lk = c->Lk;
        both_b = xcalloc(B * H * Lq * Lk, 1);
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < Lq; i++)
                    for (int64_t j = 0; j < Lk; j++)
                        both_b[((b * H + h) * Lq + i) * Lk + j] =
                            t_bool(&t->mask, b, h, i, j) && t_bool(&t->mask2, b, 0, 0, j);
        both = attn_tensor_4d(both_b, ATTN_BOOL, B, H, Lq, Lk);
        opt.mask = &both;
    }
    attn_options fo = opt;
    fo.lse = &t->lse;
    fo.weights = weights ? &t->w : NULL;
    attn_status st = attn_forward(&t->q, &t->k, &t->v, &t->o, &fo);
    if (st == ATTN_OK) {
        take(&out->o, &t->o, &out->no);
        take(&out->lse, &t->lse, &out->nl);
        if (weights) take(&out->w, &t->w, &out->nw);
    }
    if (st == ATTN_OK && backward) {
        st = attn_backward(&t->q, &t->k, &t->v, &t->o, &t->d_o, &t->lse, &t->dq, &t->dk, &t->dv, &opt);
        if (st == ATTN_OK) {
            take(&out->g[0], &t->dq, &out->ng[0]);
            take(&out->g[1], &t->dk, &out->ng[1]);
            take(&out->g[2], &t->dv, &out->ng[2]);
        }
    }
    free(both_b);
    return st;
}

static void drop(outputs *o) {
    free(o->o), free(o->lse), free(o->w);
    for (int x = 0; x < 3; x++) free(o->g[x]);
}

/* whether two runs wrote the same bytes (NaN included: bits) */
static bool same(const outputs *a, const outputs *b, char *which, size_t n) {
    struct { const char *name; void *x, *y; size_t bytes; } f[6] = {
        {"O", a->o, b->o, a->no}, {"LSE", a->lse, b->lse, a->nl}, {"weights", a->w, b->w, a->nw},
        {"dQ", a->g[0], b->g[0], a->ng[0]}, {"dK", a->g[1], b->g[1], a->ng[1]},
        {"dV", a->g[2], b->g[2], a->ng[2]}};
    for (int x = 0; x < 6; x++)
        if (f[x].bytes && memcmp(f[x].x, f[x].y, f[x].bytes)) {
            snprintf(which, n, "%s", f[x].name);
            return false;
        }
    return true;
}

/* whether b is within the contract's float32 bound of a (as of a reference): O and the
 * gradients (float32 outputs; a float64 call's are compared after rounding) */
static bool close_all(const outputs *a, const outputs *b, attn_dtype dt, char *which, size_t n) {
    struct { const char *name; void *x, *y; size_t bytes; } f[4] = {
        {"O", a->o, b->o, a->no}, {"dQ", a->g[0], b->g[0], a->ng[0]},
        {"dK", a->g[1], b->g[1], a->ng[1]}, {"dV", a->g[2], b->g[2], a->ng[2]}};
    const size_t es = dt == ATTN_F64 ? 8 : 4;
    for (int x = 0; x < 4; x++) {
        if (!f[x].bytes) continue;
        const int64_t m = (int64_t)(f[x].bytes / es);
        double *ref = xcalloc(m, sizeof(double));
        float *got = xcalloc(m, sizeof(float));
        for (int64_t e = 0; e < m; e++) {
            ref[e] = es == 8 ? ((double *)f[x].x)[e] : ((float *)f[x].x)[e];
            got[e] = es == 8 ? (float)((double *)f[x].y)[e] : ((float *)f[x].y)[e];
        }
        tol_result tr;
        const bool ok = within_f32_tol(got, ref, m, &tr);
        free(ref), free(got);
        if (!ok) {
            snprintf(which, n, "%s", f[x].name);
            return false;
        }
    }
    return true;
}

static void describe(const kcase *c, char *out, size_t n) {
    static const char *const extra[] = {"", " + dense mask", " + bias", " + causal (bottom-right)",
                                        " + softcap + ALiBi", " + kv_len", " + sinks + dropout"};
    snprintf(out, n, "%s %s%s, %s, B=%lld Hq=%lld Hkv=%lld Lq=%lld Lk=%lld D=%lld",
             k_pattern[c->pattern], c->per_head ? "[B,H,Lq,Lk]" : "[1,1,Lq,Lk]", extra[c->extra],
             attn_dtype_name(c->dt), (long long)c->B, (long long)c->Hq, (long long)c->Hkv,
             (long long)c->Lq, (long long)c->Lk, (long long)c->D);
}

/* Whether the dense call runs the mask as key lengths (CONTRACT "Masks by their
 * structure": every stored row an open prefix, the same per batch, or that prefix cut by
 * the top-left causal band; not with a bottom-right band). Then the dense call has no
 * summary and its backward tiles are the structural ones, while the block mask's mixed
 * tiles leave out the granules their rows all mask: the gradients may differ in their
 * last bits (other sums of the same terms), and are checked against the reference path
 * instead; O, LSE and the weights are the same bits either way. */
/* row (b, h, i)'s open prefix: e when keys [0, e) are kept and the rest masked, else -1 */
static int64_t open_prefix(const kcase *c, const ktensors *t, int64_t b, int64_t h, int64_t i) {
    int64_t e = 0;
    while (e < c->Lk && t_bool(&t->mask, b, h, i, e)) e++;
    for (int64_t j = e; j < c->Lk; j++)
        if (t_bool(&t->mask, b, h, i, j)) return -1;
    return e;
}

static bool dense_runs_as_lengths(const kcase *c, const ktensors *t) {
    if (c->extra == 1 || c->extra == 2 || c->extra == 3) return false;  // another mask, a bias, bottom-right
    bool pad = true, band = true;
    for (int64_t b = 0; b < c->B; b++) {
        const int64_t n = open_prefix(c, t, b, 0, c->Lq - 1);  // the batch's, from its last row
        for (int64_t h = 0; h < c->Hq; h++)
            for (int64_t i = 0; i < c->Lq; i++) {
                const int64_t e = open_prefix(c, t, b, h, i);
                if (e < 0 || n < 0) return false;
                pad &= e == n;
                band &= e == (i + 1 < n ? i + 1 : n);
            }
    }
    return pad || band;
}

/* the callback maker's source: the case's mask tensor, read back */
static int keep_from_tensor(int64_t b, int64_t h, int64_t i, int64_t j, void *ctx) {
    return t_bool((const attn_tensor *)ctx, b, h, i, j);
}

/* ---- 1. block mask = dense mask, bit for bit ------------------------------------------ */

static void check_case(const kcase *c) {
    char what[256], which[16];
    describe(c, what, sizeof what);
    ktensors t;
    build(c, &t);
    CHECK(attn_block_mask_from_tensor(&t.mask, &t.bm) == ATTN_OK, "%s: from_tensor: %s", what,
          attn_last_error());
    /* the callback's maker stores the same bytes */
    attn_block_mask *cb = NULL;
    const int64_t mb = c->per_head ? c->B : 1, mh = c->per_head ? c->Hq : 1;
    CHECK(attn_block_mask_create(mb, mh, c->Lq, c->Lk, keep_from_tensor, &t.mask, &cb) == ATTN_OK,
          "%s: create: %s", what, attn_last_error());
    attn_block_mask_info a, b;
    attn_block_mask_get_info(t.bm, &a), attn_block_mask_get_info(cb, &b);
    CHECK(!memcmp(&a, &b, sizeof a) && a.empty + a.full + a.partial == a.B * a.H *
          ((c->Lq + 63) / 64) * ((c->Lk + 15) / 16), "%s: the two makers' counts differ or do "
          "not add up", what);
    attn_block_mask_free(cb);

    const bool bwd = true;
    const attn_path paths[2] = {ATTN_PATH_FUSED, ATTN_PATH_REFERENCE};
    for (int pi = 0; pi < 2; pi++) {
        if (pi == 1 && (c->Lq > 200 || c->dt == ATTN_F64)) continue;
        for (int threads = 1; threads <= 2 - pi; threads++) {  // the reference has no tiles
            outputs d, k;
            const attn_status sd = run(c, &t, false, paths[pi], threads, true, bwd, &d);
            const attn_status sk = run(c, &t, true, paths[pi], threads, true, bwd, &k);
            CHECK(sd == ATTN_OK && sk == ATTN_OK, "%s: status %d %d (%s)", what, sd, sk,
                  attn_last_error());
            /* beside a second mask, the dense call's AND of the two has other hulls and
             * skips other tiles than the two summaries do: the same within the bound, not
             * the same bits (the reference path has no tiles: bits) */
            if (sd == ATTN_OK && sk == ATTN_OK && (c->extra != 1 || pi == 1)) {
                const bool lengths = pi == 0 && bwd && dense_runs_as_lengths(c, &t);
                outputs dq = d, kq = k;
                for (int x = 0; lengths && x < 3; x++) dq.ng[x] = kq.ng[x] = 0;  // see below
                CHECK(same(&dq, &kq, which, sizeof which), "%s, %s path, %d threads: %s differs "
                      "from the dense mask's", what, pi ? "reference" : "fused", threads, which);
                if (lengths && c->dt != ATTN_F64) {
                    outputs r;
                    run(c, &t, false, ATTN_PATH_REFERENCE, threads, false, true, &r);
                    CHECK(close_all(&r, &k, c->dt, which, sizeof which), "%s, %d threads: %s "
                          "beyond the bound of the reference's (the dense mask runs as key "
                          "lengths)", what, threads, which);
                    drop(&r);
                }
            }
            if (sd == ATTN_OK && sk == ATTN_OK && c->extra == 1 && pi == 0)
                CHECK(close_all(&d, &k, c->dt, which, sizeof which), "%s, %d threads: %s "
                      "beyond the bound of the dense mask's", what, threads, which);
            drop(&d), drop(&k);
        }
    }
    /* and against the float64 reference: the dense mask's own bound */
    if (c->dt == ATTN_F32 && c->Lq <= 200 && c->extra != 1 && c->extra != 6) {
        outputs f, r;
        run(c, &t, true, ATTN_PATH_FUSED, 0, false, false, &f);
        run(c, &t, true, ATTN_PATH_REFERENCE, 0, false, false, &r);
        const int64_t n = (int64_t)(f.no / 4);
        double *ref = xcalloc(n, sizeof(double));
        for (int64_t x = 0; x < n; x++) ref[x] = ((float *)r.o)[x];
        tol_result tr;
        CHECK(within_f32_tol(f.o, ref, n, &tr), "%s: O against the reference: rel %.3g", what,
              tr.rel_err);
        free(ref);
        drop(&f), drop(&r);
    }
    release(&t);
}

static void matrix(void) {
    typedef struct { int64_t B, Hq, Hkv, Lq, Lk, D; } shape_t;
    static const shape_t shapes[] = {
        {2, 2, 1, 130, 260, 16},   // 64-row blocks, several key tiles, GQA
        {1, 4, 2, 7, 300, 8},      // stacked heads (Lq < 64)
        {2, 1, 1, 1, 2100, 16},    // a decoding row, key splits
        {1, 2, 2, 333, 333, 32},   // nothing aligned
    };
    int n = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int pat = 0; pat < P_COUNT; pat++)
            for (int extra = 0; extra < 7; extra++)
                for (int ph = 0; ph < 2; ph++) {
                    const attn_dtype dts[3] = {ATTN_F32, ATTN_BF16, ATTN_F64};
                    const attn_dtype dt = dts[(pat + extra + (int)s) % 3];
                    n++;
                    if (test_case_skipped()) continue;  // ATTN_TEST_EVERY (check.h)
                    /* the per-head mask on half the combinations (its layout is the same
                     * code path as the shared one's, the strides aside) */
                    if (ph && (pat + extra + (int)s) % 2) continue;
                    const shape_t *h = &shapes[s];
                    if (dt == ATTN_F64 && extra >= 4) continue;  // (float32's; float64 has no dropout)
                    kcase c = {h->B, h->Hq, h->Hkv, h->Lq, h->Lk, h->D, pat, ph != 0, extra, dt,
                               0x1234u + 97u * (uint64_t)n};
                    check_case(&c);
                }
}

/* ---- 2. counts ---------------------------------------------------------------------- */

static int keep_docs(int64_t b, int64_t h, int64_t i, int64_t j, void *ctx) {
    (void)b, (void)h;
    const int64_t n = *(const int64_t *)ctx;
    return i / n == j / n;
}

static void counts(void) {
    int64_t n = 1024;  // 8 documents of 1024 in 8192 tokens
    attn_block_mask *m = NULL;
    CHECK(attn_block_mask_create(1, 1, 8192, 8192, keep_docs, &n, &m) == ATTN_OK, "docs: %s",
          attn_last_error());
    attn_block_mask_info in;
    attn_block_mask_get_info(m, &in);
    /* each document: 16 row blocks x 64 key blocks full; nothing partial */
    CHECK(in.partial == 0 && in.full == 8 * 16 * 64 && in.empty == 128 * 512 - in.full,
          "docs: empty %lld full %lld partial %lld", (long long)in.empty, (long long)in.full,
          (long long)in.partial);
    CHECK(in.bytes < (size_t)2 << 20, "docs: %zu bytes, expected under 2 MiB", in.bytes);
    attn_block_mask_free(m);
}

/* ---- 3. score functions ----------------------------------------------------------------- */

typedef struct mod_ctx {
    const attn_tensor *bias;
    float cap, grad_factor;
    int64_t nan_row;
} mod_ctx;

static float mod_add(float s, int64_t b, int64_t h, int64_t i, int64_t j, void *ctx) {
    (void)b;
    const mod_ctx *m = ctx;
    if (i == m->nan_row && j == 3) return NAN;
    return s + (float)t_f32(m->bias, 0, h, i, j);
}
static float mod_add_grad(float s, int64_t b, int64_t h, int64_t i, int64_t j, void *ctx) {
    (void)s, (void)b, (void)h, (void)i, (void)j, (void)ctx;
    return 1.0f;
}
static float mod_cap(float s, int64_t b, int64_t h, int64_t i, int64_t j, void *ctx) {
    (void)b, (void)h, (void)i, (void)j;
    const mod_ctx *m = ctx;
    return m->cap * tanhf(s / m->cap);
}
static float mod_cap_grad(float s, int64_t b, int64_t h, int64_t i, int64_t j, void *ctx) {
    (void)b, (void)h, (void)i, (void)j;
    const mod_ctx *m = ctx;
    const float th = tanhf(s / m->cap);
    return m->grad_factor * (1.0f - th * th);
}

/* the case's call with options opt (causal), both passes, outputs copied out */
static attn_status run_opt(ktensors *t, attn_options opt, outputs *out) {
    *out = (outputs){0};
    attn_options fo = opt;
    fo.lse = &t->lse;
    attn_status st = attn_forward(&t->q, &t->k, &t->v, &t->o, &fo);
    if (st != ATTN_OK) return st;
    take(&out->o, &t->o, &out->no);
    take(&out->lse, &t->lse, &out->nl);
    st = attn_backward(&t->q, &t->k, &t->v, &t->o, &t->d_o, &t->lse, &t->dq, &t->dk, &t->dv, &opt);
    if (st != ATTN_OK) return st;
    take(&out->g[0], &t->dq, &out->ng[0]);
    take(&out->g[1], &t->dk, &out->ng[1]);
    take(&out->g[2], &t->dv, &out->ng[2]);
    return ATTN_OK;
}

static void score_mods(void) {
    const kcase c = {2, 2, 1, 130, 200, 16, P_ALL, false, 0, ATTN_F32, 77};
    ktensors t;
    build(&c, &t);
    const attn_path paths[2] = {ATTN_PATH_FUSED, ATTN_PATH_REFERENCE};
    char which[16];
    for (int pi = 0; pi < 2; pi++) {
        const char *path = pi ? "reference" : "fused";
        /* s + bias(h, i, j): the bias's bits */
        mod_ctx m = {.bias = &t.bias, .cap = 2.5f, .grad_factor = 1.0f, .nan_row = -1};
        outputs a, b;
        attn_options o1 = {.path = paths[pi], .causal = true, .bias = &t.bias};
        attn_options o2 = {.path = paths[pi], .causal = true, .score_mod = mod_add,
                           .score_mod_grad = mod_add_grad, .score_mod_ctx = &m};
        CHECK(run_opt(&t, o1, &a) == ATTN_OK && run_opt(&t, o2, &b) == ATTN_OK, "additive: %s",
              attn_last_error());
        /* fused: the same float32 operations, bits; reference: the function sees the logit
         * rounded to float32, the bias is added in float64: within the float32 bound */
        CHECK(pi ? close_all(&a, &b, ATTN_F32, which, sizeof which) : same(&a, &b, which, sizeof which),
              "%s: s + f differs from the bias f in %s", path, which);
        drop(&a), drop(&b);
        /* c tanh(s / c): softcap's bits */
        o1 = (attn_options){.path = paths[pi], .softcap = 2.5f, .mask = &t.mask2};
        o2 = (attn_options){.path = paths[pi], .mask = &t.mask2, .score_mod = mod_cap,
                            .score_mod_grad = mod_cap_grad, .score_mod_ctx = &m};
        CHECK(run_opt(&t, o1, &a) == ATTN_OK && run_opt(&t, o2, &b) == ATTN_OK, "softcap: %s",
              attn_last_error());
        CHECK(pi ? close_all(&a, &b, ATTN_F32, which, sizeof which) : same(&a, &b, which, sizeof which),
              "%s: c tanh(s / c) differs from softcap in %s", path, which);
        drop(&b);
        /* planted: the derivative twice what it is */
        m.grad_factor = 2.0f;
        CHECK(run_opt(&t, o2, &b) == ATTN_OK, "softcap x2");
        CHECK(!close_all(&a, &b, ATTN_F32, which, sizeof which) && strcmp(which, "dQ") == 0,
              "%s: a derivative twice too large went unseen", path);
        drop(&a), drop(&b);
        m.grad_factor = 1.0f;
        /* NaN from the function: its row is NaN, the others not */
        m.nan_row = 5;
        attn_options o3 = {.path = paths[pi], .score_mod = mod_add, .score_mod_ctx = &m};
        o3.lse = &t.lse;
        CHECK(attn_forward(&t.q, &t.k, &t.v, &t.o, &o3) == ATTN_OK, "NaN: %s", attn_last_error());
        const float *o = t.o.data;
        CHECK(isnan(o[5 * c.D]) && !isnan(o[4 * c.D]) && !isnan(o[6 * c.D]),
              "%s: a NaN score reached its row %d, the others %d %d", path, isnan(o[5 * c.D]),
              isnan(o[4 * c.D]), isnan(o[6 * c.D]));
    }
    release(&t);
}

/* ---- 4. misuse ---------------------------------------------------------------------- */

static void misuse(void) {
    const kcase c = {2, 2, 2, 70, 90, 8, P_CAUSAL, false, 0, ATTN_F32, 5};
    ktensors t;
    build(&c, &t);
    attn_block_mask *other = NULL;
    attn_tensor small = t.mask;
    small.shape[2] = 69;
    CHECK(attn_block_mask_from_tensor(&small, &other) == ATTN_OK, "69 rows: %s", attn_last_error());
    fill_sentinel(t.o.data, 2 * 2 * 70 * 8);
    attn_options opt = {.block_mask = other};
    CHECK(attn_forward(&t.q, &t.k, &t.v, &t.o, &opt) == ATTN_ERR_MASK, "a block mask of 69 rows "
          "for 70: accepted");
    CHECK(count_written(t.o.data, 2 * 2 * 70 * 8) == 0, "a refused call wrote O");
    attn_block_mask_free(other);
    /* score_mod_grad alone; a backward without the derivative */
    mod_ctx m = {.bias = &t.bias, .nan_row = -1};
    opt = (attn_options){.score_mod_grad = mod_add_grad, .score_mod_ctx = &m};
    CHECK(attn_forward(&t.q, &t.k, &t.v, &t.o, &opt) == ATTN_ERR_VALUE, "score_mod_grad alone: accepted");
    opt = (attn_options){.score_mod = mod_add, .score_mod_ctx = &m};
    fill_sentinel(t.dq.data, 2 * 2 * 70 * 8);
    CHECK(attn_backward(&t.q, &t.k, &t.v, &t.o, &t.d_o, &t.lse, &t.dq, &t.dk, &t.dv, &opt) ==
          ATTN_ERR_VALUE, "a backward without score_mod_grad: accepted");
    CHECK(count_written(t.dq.data, 2 * 2 * 70 * 8) == 0, "a refused backward wrote dQ");
    /* the calls that refuse them */
    CHECK(attn_block_mask_from_tensor(&t.mask, &t.bm) == ATTN_OK, "make: %s", attn_last_error());
    attn_options bo = {.block_mask = t.bm}, so = {.score_mod = mod_add, .score_mod_ctx = &m};
    int32_t cu[2] = {0, 70}, cuk[2] = {0, 90};
    attn_tensor cq = attn_tensor_4d(cu, ATTN_I32, 2, 1, 1, 1), ck = attn_tensor_4d(cuk, ATTN_I32, 2, 1, 1, 1);
    attn_tensor q1 = t.q, k1 = t.k, v1 = t.v, o1 = t.o;
    q1.shape[0] = k1.shape[0] = v1.shape[0] = o1.shape[0] = 1;
    CHECK(attn_varlen_forward(&q1, &k1, &v1, &o1, &cq, &ck, 70, 90, &bo) == ATTN_ERR_UNSUPPORTED,
          "varlen with a block mask: accepted (%s)", attn_last_error());
    CHECK(attn_varlen_forward(&q1, &k1, &v1, &o1, &cq, &ck, 70, 90, &so) == ATTN_ERR_UNSUPPORTED,
          "varlen with a score function: accepted (%s)", attn_last_error());
    /* the makers' arguments */
    attn_block_mask *x = NULL;
    CHECK(attn_block_mask_create(0, 1, 4, 4, keep_from_tensor, &t.mask, &x) == ATTN_ERR_SHAPE && !x,
          "B = 0: accepted");
    CHECK(attn_block_mask_create(1, 1, 4, 4, NULL, NULL, &x) == ATTN_ERR_NULL && !x, "keep NULL: accepted");
    attn_tensor wrong = t.bias;
    CHECK(attn_block_mask_from_tensor(&wrong, &x) == ATTN_ERR_DTYPE && !x, "a float tensor: accepted");
    CHECK(attn_block_mask_get_info(NULL, NULL) == ATTN_ERR_NULL, "info of NULL: accepted");
    attn_block_mask_free(NULL);
    release(&t);
}

/* ---- attn_weights_grid: the block mask's grid is the dense mask's ------------------- */

static void grid(void) {
    const kcase c = {2, 2, 2, 130, 200, 16, P_WINDOW, false, 0, ATTN_F32, 31};
    ktensors t;
    build(&c, &t);
    CHECK(attn_block_mask_from_tensor(&t.mask, &t.bm) == ATTN_OK, "make: %s", attn_last_error());
    attn_options fo = {.mask = &t.mask, .lse = &t.lse};
    CHECK(attn_forward(&t.q, &t.k, &t.v, &t.o, &fo) == ATTN_OK, "forward: %s", attn_last_error());
    float *g[2];
    for (int w = 0; w < 2; w++) {
        g[w] = xcalloc(2 * 2 * 13 * 20, sizeof(float));
        attn_tensor tg = attn_tensor_4d(g[w], ATTN_F32, 2, 2, 13, 20);
        attn_options o = {0};
        if (w) o.block_mask = t.bm;
        else o.mask = &t.mask;
        CHECK(attn_weights_grid(&t.q, &t.k, &t.lse, &tg, ATTN_REDUCE_SUM, &o) == ATTN_OK,
              "grid %d: %s", w, attn_last_error());
    }
    CHECK(!memcmp(g[0], g[1], 2 * 2 * 13 * 20 * sizeof(float)), "attn_weights_grid: the block "
          "mask's grid differs from the dense mask's");
    free(g[0]), free(g[1]);
    release(&t);
}

/* ---- 5. planted: a block mask one element off is seen ------------------------------- */

static int keep_off_by_one(int64_t b, int64_t h, int64_t i, int64_t j, void *ctx) {
    const int v = t_bool((const attn_tensor *)ctx, b, h, i, j);
    return i == 40 && j == 17 ? !v : v;
}

static void planted(void) {
    const kcase c = {1, 1, 1, 100, 100, 8, P_RANDOM, false, 0, ATTN_F32, 9};
    ktensors t;
    build(&c, &t);
    CHECK(attn_block_mask_create(1, 1, 100, 100, keep_off_by_one, &t.mask, &t.bm) == ATTN_OK,
          "make: %s", attn_last_error());
    outputs d, k;
    char which[16];
    run(&c, &t, false, ATTN_PATH_FUSED, 1, true, true, &d);
    run(&c, &t, true, ATTN_PATH_FUSED, 1, true, true, &k);
    CHECK(!same(&d, &k, which, sizeof which), "a block mask one element off went unseen");
    drop(&d), drop(&k);
    release(&t);
}

int main(void) {
    matrix();
    counts();
    score_mods();
    misuse();
    grid();
    planted();
    return check_summary("block_mask");
}
