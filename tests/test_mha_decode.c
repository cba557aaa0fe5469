/*
 * test_mha_decode.c — the multi-head module's cached decoding step (attn_mha_decode).
 *
 * What it covers:
 *  1. A loop of steps (a prefill of several tokens, then 1, 2, 1, ... tokens) over a
 *     float32 cache gives the same y as one causal call over the whole sequence, both
 *     against the float64 composition (the contract's float32 tolerance), with GQA,
 *     biases, both RoPE pairings and an offset; the steps read x and write y through
 *     strided views of the whole sequence.
 *  2. float16 and bfloat16 caches: every stored K and V value within one rounding to the
 *     cache's dtype of its float32 projection's bound (mref_cache_bound, derived), and y
 *     within the contract's float32 tolerance of the float64 layer over the values the
 *     cache holds (attention reads the cache's values: their rounding is the cache's, not
 *     the attention's). The float32 cache is checked the same way (no rounding).
 *  3. The cache: rows beyond len + n never written; len advanced. One token a step of
 *     one sequence (every product a matrix-vector one) over bfloat16 weights.
 *  4. Misuse (too many tokens for Lmax, options the step owns, wrong cache shape or
 *     dtypes, an unknown kind): the status, nothing written, len unchanged.
 *  5. The checks reject a planted error (a step's positions off by one), on a float32
 *     and a bfloat16 cache; and a stored value moved by twice its bound.
 */
#include "mha_ref.h"

typedef struct dcache {
    void *k, *v;
    int64_t len[4], nk, nv;
    attn_kv_cache c;
} dcache;

static void dcache_build(dcache *d, const mcase *c, int64_t Lmax, attn_dtype dt) {
    memset(d, 0, sizeof *d);
    d->nk = c->B * c->Hkv * Lmax * c->Dk;
    d->nv = c->B * c->Hkv * Lmax * c->Dv;
    d->k = xcalloc(d->nk, 4);
    d->v = xcalloc(d->nv, 4);
    fill_sentinel(d->k, d->nk / (dt == ATTN_F32 ? 1 : 2));
    fill_sentinel(d->v, d->nv / (dt == ATTN_F32 ? 1 : 2));
    d->c = (attn_kv_cache){.kind = ATTN_CACHE_CONTIGUOUS,
                           .k = attn_tensor_4d(d->k, dt, c->B, c->Hkv, Lmax, c->Dk),
                           .v = attn_tensor_4d(d->v, dt, c->B, c->Hkv, Lmax, c->Dv),
                           .len = d->len};
}

static void dcache_free(dcache *d) { free(d->k); free(d->v); }

/* the largest stored-value error / its bound seen, per cache dtype (f32, f16, bf16) */
static double g_cache_worst[3];

/* The steps of `sizes` (summing to Lq) into l's y; the relative Frobenius error of y
 * against the float64 causal layer is returned (and the status in *st). plant: the
 * rotary offset moved by one after the first step (a planted position error). */
static double run_steps(mlayer *l, dcache *d, const int64_t *sizes, int nsteps,
                        attn_status *st, bool plant) {
    int64_t t0 = 0;
    *st = ATTN_OK;
    for (int s = 0; s < nsteps && *st == ATTN_OK; s++) {
        attn_tensor x = rows_slice(&l->txq, t0, sizes[s]), y = rows_slice(&l->ty, t0, sizes[s]);
        *st = attn_mha_decode(&l->m, &x, &d->c, &y, NULL);
        t0 += sizes[s];
        if (plant && s == 0) l->m.rope.offset += 1;
    }
    if (plant) l->m.rope.offset -= 1;
    tol_result r;
    double frob;
    mref_cache cache = {d->k, d->v, d->c.k.dtype, d->c.k.shape[2], 0.0};
    l->cache = &cache;
    const int ok = mlayer_vs_causal(l, &r, &frob);
    l->cache = NULL;
    if (!plant && cache.ratio > g_cache_worst[cache.dt == ATTN_F32 ? 0 : cache.dt == ATTN_F16 ? 1 : 2])
        g_cache_worst[cache.dt == ATTN_F32 ? 0 : cache.dt == ATTN_F16 ? 1 : 2] = cache.ratio;
    return ok && cache.ratio <= 1.0 ? r.rel_err : INFINITY;
}

static mcase dec_case(uint64_t seed, attn_rope_kind rope) {
    return (mcase){.B = 2, .Lq = 12, .Lk = 12, .E = 32, .Ekv = 32, .Hq = 4, .Hkv = 2,
                   .Dk = 8, .Dv = 8, .self = true, .bias = true, .seed = seed, .layout = 1,
                   .rope = {.kind = rope, .offset = 5, .base = 1000}};
}

static void test_loop(void) {
    const int64_t sizes[] = {4, 1, 2, 1, 1, 3};
    for (int rope = 0; rope < 3; rope++)
        for (int dt = 0; dt < 3; dt++) {
            mcase c = dec_case(10 + (uint64_t)rope, (attn_rope_kind)rope);
            mlayer l;
            mlayer_build(&l, &c);
            dcache d;
            const attn_dtype cdt = dt == 0 ? ATTN_F32 : dt == 1 ? ATTN_F16 : ATTN_BF16;
            dcache_build(&d, &c, c.Lq + 3, cdt);
            attn_status st;
            double err = run_steps(&l, &d, sizes, 6, &st, false);
            CHECK(st == ATTN_OK && err <= 1e-6, "rope %d cache %s: status %d (%s), rel err %.3g",
                  rope, attn_dtype_name(cdt), st, attn_last_error(), err);
            CHECK(d.len[0] == c.Lq && d.len[1] == c.Lq, "len advanced to %lld, %lld",
                  (long long)d.len[0], (long long)d.len[1]);
            /* rows len .. Lmax untouched (the f32 cache's sentinel) */
            if (cdt == ATTN_F32) {
                int64_t untouched = 0;
                for (int64_t e = 0; e < d.nk; e++)
                    untouched += is_sentinel((float *)d.k + e);
                CHECK(untouched == c.B * c.Hkv * 3 * c.Dk, "cache rows beyond len: %lld "
                      "untouched, expected %lld", (long long)untouched,
                      (long long)(c.B * c.Hkv * 3 * c.Dk));
            }
            dcache_free(&d);
            mlayer_free(&l);
        }
}

/* one sequence, one token a step: every product has one row (a matrix-vector product),
 * over bfloat16 x and weights ([in, out] and PyTorch's [out, in]), a float32 y; E = 301
 * splits the rows of W_Q, W_K, W_V into uneven chunks (mha_gemv.c) */
static void test_single_rows(void) {
    const int64_t sizes[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    for (int run = 0; run < 4; run++) {
        const int torch = run % 2;
        mcase c = dec_case(90 + (uint64_t)run, ATTN_ROPE_INTERLEAVED);
        if (run >= 2) c.E = c.Ekv = 301;
        c.B = 1;
        c.bf16 = true;
        c.torch = torch;
        c.Hkv = c.Hq;  /* (packed q, k, v in the PyTorch layout) */
        mlayer l;
        mlayer_build(&l, &c);
        l.ty.dtype = ATTN_F32;  /* y float32 (its storage has room): the float32 tolerance */
        dcache d;
        dcache_build(&d, &c, c.Lq, ATTN_F32);
        attn_status st;
        double err = run_steps(&l, &d, sizes, 12, &st, false);
        CHECK(st == ATTN_OK && err <= 1e-6, "one row a step, E %lld, torch %d: status %d, "
              "rel err %.3g", (long long)c.E, torch, st, err);
        dcache_free(&d);
        mlayer_free(&l);
    }
}

static void expect_refused(mlayer *l, dcache *d, int64_t n, const attn_options *opt,
                           attn_status want, const char *what) {
    int64_t len0 = d->len[0];
    fill_sentinel(l->sy, l->c.B * l->ty.stride[0]);
    attn_tensor x = rows_slice(&l->txq, 0, n), y = rows_slice(&l->ty, 0, n);
    attn_status st = attn_mha_decode(&l->m, &x, &d->c, &y, opt);
    CHECK(st == want, "%s: status %d, expected %d (%s)", what, st, want, attn_last_error());
    CHECK(count_written(l->sy, l->c.B * l->ty.stride[0]) == 0 && d->len[0] == len0 &&
              count_written(d->k, d->nk) == 0,
          "%s: something written", what);
}

static void test_misuse(void) {
    mcase c = dec_case(50, ATTN_ROPE_HALF);
    mlayer l;
    mlayer_build(&l, &c);
    dcache d;
    dcache_build(&d, &c, 8, ATTN_F32);
    d.len[0] = 5;
    expect_refused(&l, &d, 4, NULL, ATTN_ERR_VALUE, "5 + 4 tokens in Lmax 8");
    d.len[0] = 0;
    expect_refused(&l, &d, 1, &(attn_options){.causal = true}, ATTN_ERR_VALUE, "causal given");
    d.c.v.dtype = ATTN_F16;
    expect_refused(&l, &d, 1, NULL, ATTN_ERR_DTYPE, "k float32, v float16");
    d.c.v.dtype = ATTN_F32;
    d.c.k.shape[1] = 4;
    expect_refused(&l, &d, 1, NULL, ATTN_ERR_SHAPE, "cache heads");
    d.c.k.shape[1] = 2;
    d.c.kind = (attn_cache_kind)2;
    expect_refused(&l, &d, 1, NULL, ATTN_ERR_UNSUPPORTED, "unknown cache kind");
    d.c.kind = ATTN_CACHE_CONTIGUOUS;
    d.c.len = NULL;
    expect_refused(&l, &d, 1, NULL, ATTN_ERR_NULL, "len NULL");
    dcache_free(&d);
    mlayer_free(&l);
}

int main(void) {
    test_loop();
    test_single_rows();
    test_misuse();
    /* planted: a second step whose positions are one late must fail the float32 check */
    mcase c = dec_case(70, ATTN_ROPE_HALF);
    mlayer l;
    mlayer_build(&l, &c);
    dcache d;
    dcache_build(&d, &c, c.Lq, ATTN_F32);
    const int64_t sizes[] = {6, 6};
    attn_status st;
    double err = run_steps(&l, &d, sizes, 2, &st, true);
    CHECK(st == ATTN_OK && !(err <= 1e-6), "the planted position error was not caught (%.3g)",
          err);
    dcache_free(&d);
    dcache_build(&d, &c, c.Lq, ATTN_BF16);
    err = run_steps(&l, &d, sizes, 2, &st, true);
    CHECK(st == ATTN_OK && !(err <= 1e-6), "bfloat16 cache: the planted position error was "
          "not caught (%.3g)", err);
    fprintf(stderr, "planted position error: rel err %.3g with a bfloat16 cache\n", err);
    dcache_free(&d);
    /* a float16 cache right but for its largest K value, 4 ulps (over twice its bound) off */
    dcache_build(&d, &c, c.Lq, ATTN_F16);
    err = run_steps(&l, &d, sizes, 2, &st, false);
    CHECK(st == ATTN_OK && err <= 1e-6, "float16 cache before the plant: rel err %.3g", err);
    uint16_t *kh = d.k;
    int64_t big = 0;
    for (int64_t e = 0; e < d.nk / 2; e++)
        if (!is_sentinel((float *)d.k + e / 2) &&
            fabs(attn_f16_to_f32(kh[e])) > fabs(attn_f16_to_f32(kh[big]))) big = e;
    kh[big] += 4;
    tol_result r;
    double frob;
    mref_cache planted = {d.k, d.v, ATTN_F16, c.Lq, 0.0};
    l.cache = &planted;
    mlayer_vs_causal(&l, &r, &frob);
    l.cache = NULL;
    CHECK(planted.ratio > 1.0, "a float16 K value 4 ulps off passed the cache check (%.3g of "
          "its bound)", planted.ratio);
    dcache_free(&d);
    mlayer_free(&l);
    printf("test_mha_decode: cached K, V against their bound: worst %.3g (float32), %.3g "
           "(float16), %.3g (bfloat16) of it\n", g_cache_worst[0], g_cache_worst[1], g_cache_worst[2]);
    return check_summary("test_mha_decode");
}
