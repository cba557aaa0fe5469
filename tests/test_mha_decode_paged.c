/*
 * test_mha_decode_paged.c — attn_mha_decode over a paged cache (ATTN_CACHE_PAGED: page
 *                           pools and a block table), beside test_mha_decode.c's
 *                           contiguous one.
 *
 * What it covers:
 *  1. A loop of steps (a prefill of 4 tokens, then 1, 2, 1, 1, 3) over pools whose pages
 *     are handed out in a shuffled order, for page sizes 1, 3 and 4, gives the y of one
 *     causal call over the whole sequence (the float64 composition of mha_ref.h): float32
 *     within the contract's float32 tolerance; float16 and bfloat16 pools within the
 *     cache's rounding, as test_mha_decode (4e-4, 3e-3 relative Frobenius); the same steps
 *     over a contiguous cache of the dtype give the same error class. The pools in
 *     FlashAttention's [num_pages, page_size, Hkv, D] layout through strides.
 *  2. q8_0 pools (Dk = Dv = 32): within 5e-3 relative Frobenius (measured 2.0e-3 paged and
 *     contiguous: K and V quantized once, 8 bits per element), and the contiguous q8_0
 *     cache (which the step now also appends to, through attn_kv_append) the same.
 *     q4_0 the same, within 0.08 (measured 3.0e-2).
 *     fp8 pools and caches (e4m3, e5m2) with per-head scales: within 0.03 and 0.06.
 *  3. Pages not in the table and rows past len + n are never written; len advanced.
 *  4. Misuse, each with its status and nothing written (y, pools, len): no table, a
 *     table for a contiguous cache, opt->block_table given, an entry outside the pool, a
 *     page written by two sequences, too many tokens for max_pages * page_size, k and v
 *     pools of different page sizes, a page size of 0.
 *  5. The tolerance check rejects a planted error (page 0 of the two sequences swapped in
 *     the table after the first step, so each later step reads the other's first keys).
 */
#include "mha_ref.h"

typedef struct pcache {
    void *k, *v;
    int32_t *table;
    int64_t len[4], nk, nv, num_pages, page_size, max_pages;
    attn_tensor bt;
    attn_kv_cache c;
} pcache;

static int64_t dt_units(attn_dtype dt, int64_t n) {  /* floats of storage for n elements */
    if (attn_dtype_size(dt) == 1) return (n + 3) / 4;  /* the fp8 dtypes */
    if (dt == ATTN_Q4_0) return (n / 32 * 18 + 3) / 4;
    return dt == ATTN_Q8_0 ? (n / 32 * 34 + 3) / 4 : dt == ATTN_F32 ? n : (n + 1) / 2;
}

/* pools of num_pages = B * max_pages + 3 pages (3 never used), the table a shuffle of
 * the others; FlashAttention's [num_pages, page_size, Hkv, D] storage. */
static void pcache_build(pcache *p, const mcase *c, int64_t rows, int64_t page_size,
                         attn_dtype dt, uint64_t seed) {
    memset(p, 0, sizeof *p);
    p->page_size = page_size;
    p->max_pages = (rows + page_size - 1) / page_size;
    p->num_pages = c->B * p->max_pages + 3;
    const int64_t nk = p->num_pages * page_size * c->Hkv * c->Dk;
    const int64_t nv = p->num_pages * page_size * c->Hkv * c->Dv;
    p->nk = dt_units(dt, nk);
    p->nv = dt_units(dt, nv);
    p->k = xcalloc(p->nk, 4);
    p->v = xcalloc(p->nv, 4);
    fill_sentinel(p->k, p->nk);
    fill_sentinel(p->v, p->nv);
    const int64_t ps = page_size, H = c->Hkv;
    p->c.kind = ATTN_CACHE_PAGED;
    p->c.k = (attn_tensor){p->k, dt, {p->num_pages, H, ps, c->Dk},
                           {ps * H * c->Dk, c->Dk, H * c->Dk, 1}};
    p->c.v = (attn_tensor){p->v, dt, {p->num_pages, H, ps, c->Dv},
                           {ps * H * c->Dv, c->Dv, H * c->Dv, 1}};
    p->c.len = p->len;
    const int64_t nt = c->B * p->max_pages;
    p->table = xcalloc(nt + 1, sizeof(int32_t));
    for (int64_t i = 0; i < nt; i++) p->table[i] = (int32_t)(i + 2);  /* pages 0, 1 unused */
    rng_t r = {seed};
    for (int64_t i = nt - 1; i > 0; i--) {  /* Fisher-Yates */
        const int64_t j = (int64_t)(rng_range(&r, 0, 1) * (double)(i + 1)) % (i + 1);
        const int32_t t = p->table[i];
        p->table[i] = p->table[j];
        p->table[j] = t;
    }
    p->bt = (attn_tensor){p->table, ATTN_I32, {c->B, p->max_pages, 1, 1}, {p->max_pages, 1, 1, 1}};
    p->c.block_table = &p->bt;
}

static void pcache_free(pcache *p) { free(p->k); free(p->v); free(p->table); }

/* a contiguous cache of the same rows, dtype dt */
static void ccache_build(pcache *p, const mcase *c, int64_t Lmax, attn_dtype dt) {
    memset(p, 0, sizeof *p);
    p->nk = dt_units(dt, c->B * c->Hkv * Lmax * c->Dk);
    p->nv = dt_units(dt, c->B * c->Hkv * Lmax * c->Dv);
    p->k = xcalloc(p->nk, 4);
    p->v = xcalloc(p->nv, 4);
    p->c = (attn_kv_cache){.kind = ATTN_CACHE_CONTIGUOUS,
                           .k = attn_tensor_4d(p->k, dt, c->B, c->Hkv, Lmax, c->Dk),
                           .v = attn_tensor_4d(p->v, dt, c->B, c->Hkv, Lmax, c->Dv),
                           .len = p->len};
}

/* The steps into l's y; returns the relative Frobenius error of y against the float64
 * causal layer, and *f32_ok whether it passes the contract's float32 tolerance. plant:
 * page 0 of sequences 0 and 1 swapped in the table after the first step (each then reads
 * the other's first keys: a finite, wrong answer). */
static double run_steps(mlayer *l, pcache *p, const int64_t *sizes, int nsteps,
                        attn_status *st, bool plant, int *f32_ok) {
    int64_t t0 = 0;
    *st = ATTN_OK;
    for (int s = 0; s < nsteps && *st == ATTN_OK; s++) {
        attn_tensor x = rows_slice(&l->txq, t0, sizes[s]), y = rows_slice(&l->ty, t0, sizes[s]);
        *st = attn_mha_decode(&l->m, &x, &p->c, &y, NULL);
        t0 += sizes[s];
        if (plant && s == 0) {
            const int32_t t = p->table[0];
            p->table[0] = p->table[p->max_pages];
            p->table[p->max_pages] = t;
        }
    }
    tol_result r;
    double frob;
    *f32_ok = mlayer_vs_causal(l, &r, &frob);
    return frob;
}

static mcase dec_case(uint64_t seed, attn_rope_kind rope, int64_t D) {
    return (mcase){.B = 2, .Lq = 12, .Lk = 12, .E = 32, .Ekv = 32, .Hq = 4, .Hkv = 2,
                   .Dk = D, .Dv = D, .self = true, .bias = true, .seed = seed, .layout = 1,
                   .rope = {.kind = rope, .offset = 5, .base = 1000}};
}

static const int64_t SIZES[] = {4, 1, 2, 1, 1, 3};

static double tol_of(attn_dtype dt) {
    if (dt == ATTN_Q4_0) return 0.08;  /* measured 3.0e-2: 4 bits an element */
    return dt == ATTN_F16 ? 4e-4 : dt == ATTN_BF16 ? 3e-3 : 5e-3;  /* q8_0: 5e-3 */
}

static void test_loop(void) {
    const int64_t page_sizes[] = {1, 3, 4};
    const attn_dtype dts[] = {ATTN_F32, ATTN_F16, ATTN_BF16};
    for (int ps = 0; ps < 3; ps++)
        for (int d = 0; d < 3; d++) {
            const attn_dtype dt = dts[d];
            mcase c = dec_case(20 + (uint64_t)(ps * 3 + d), (attn_rope_kind)(d % 3), 8);
            mlayer l;
            mlayer_build(&l, &c);
            pcache p;
            pcache_build(&p, &c, c.Lq + 2, page_sizes[ps], dt, 7 + (uint64_t)ps);
            attn_status st;
            int f32_ok;
            double err = run_steps(&l, &p, SIZES, 6, &st, false, &f32_ok);
            const bool ok = dt == ATTN_F32 ? f32_ok : err <= tol_of(dt);
            CHECK(st == ATTN_OK && ok, "page size %lld, %s pools: status %d (%s), rel err %.3g",
                  (long long)page_sizes[ps], attn_dtype_name(dt), st, attn_last_error(), err);
            CHECK(p.len[0] == c.Lq && p.len[1] == c.Lq, "len advanced to %lld, %lld",
                  (long long)p.len[0], (long long)p.len[1]);
            if (dt == ATTN_F32) {
                /* written: exactly B * Lq rows of Hkv * Dk; pages 0 and 1, and the rows of
                 * the last pages past Lq, untouched */
                int64_t written = 0;
                for (int64_t e = 0; e < p.nk; e++) written += !is_sentinel((float *)p.k + e);
                CHECK(written == c.B * c.Lq * c.Hkv * c.Dk, "page size %lld: %lld K elements "
                      "written, expected %lld", (long long)page_sizes[ps], (long long)written,
                      (long long)(c.B * c.Lq * c.Hkv * c.Dk));
                int64_t spare = 0;
                for (int64_t e = 0; e < 2 * page_sizes[ps] * c.Hkv * c.Dk; e++)
                    spare += !is_sentinel((float *)p.k + e);
                CHECK(spare == 0, "unused pages 0 and 1 written (%lld elements)", (long long)spare);
            }
            pcache_free(&p);
            mlayer_free(&l);
        }
}

/* q8_0 (and q4_0) pools and contiguous caches (D = 32: one block a row) */
static void test_q8_0(void) {
    mcase c = dec_case(40, ATTN_ROPE_HALF, 32);
    c.E = c.Ekv = 64;
    for (int q4 = 0; q4 < 2; q4++)
    for (int paged = 0; paged < 2; paged++) {
        const attn_dtype qdt = q4 ? ATTN_Q4_0 : ATTN_Q8_0;
        mlayer l;
        mlayer_build(&l, &c);
        pcache p;
        if (paged) pcache_build(&p, &c, c.Lq, 4, qdt, 3);
        else ccache_build(&p, &c, c.Lq + 1, qdt);
        attn_status st;
        int f32_ok;
        double err = run_steps(&l, &p, SIZES, 6, &st, false, &f32_ok);
        CHECK(st == ATTN_OK && err <= tol_of(qdt), "%s %s cache: status %d (%s), rel "
              "err %.3g", attn_dtype_name(qdt), paged ? "paged" : "contiguous", st, attn_last_error(), err);
        fprintf(stderr, "%s %s cache: rel err %.3g\n", attn_dtype_name(qdt), paged ? "paged" : "contiguous", err);
        pcache_free(&p);
        mlayer_free(&l);
    }
}

/* fp8 pools and an fp8 contiguous cache with per-head scales (the cache's k_scale,
 * v_scale): the steps write through attn_kv_append_scaled and read through attn_forward
 * with them; within 0.03 (e4m3) and 0.06 (e5m2) relative Frobenius of the float64 layer
 * (measured 8.7e-3 and 2.1e-2, paged and contiguous alike: the formats' 3 and 2 mantissa
 * bits), and opt's own scales
 * refused (the cache's are the step's) */
static void test_fp8(void) {
    mcase c = dec_case(50, ATTN_ROPE_HALF, 16);
    const float ks[2] = {0.004f, 0.008f}, vs[2] = {0.006f, 0.003f};
    attn_tensor tks = attn_tensor_4d((void *)ks, ATTN_F32, 2, 1, 1, 1);
    attn_tensor tvs = attn_tensor_4d((void *)vs, ATTN_F32, 2, 1, 1, 1);
    for (int f = 0; f < 2; f++)
        for (int paged = 0; paged < 2; paged++) {
            const attn_dtype dt = f ? ATTN_FP8_E5M2 : ATTN_FP8_E4M3;
            mlayer l;
            mlayer_build(&l, &c);
            pcache p;
            if (paged) pcache_build(&p, &c, c.Lq, 4, dt, 5);
            else ccache_build(&p, &c, c.Lq + 1, dt);
            p.c.k_scale = &tks, p.c.v_scale = &tvs;
            attn_options bad = {.k_scale = &tks};
            attn_tensor x = rows_slice(&l.txq, 0, 1), y = rows_slice(&l.ty, 0, 1);
            CHECK(attn_mha_decode(&l.m, &x, &p.c, &y, &bad) == ATTN_ERR_VALUE && p.len[0] == 0,
                  "%s: options.k_scale beside the cache's: not refused", attn_dtype_name(dt));
            attn_status st;
            int f32_ok;
            double err = run_steps(&l, &p, SIZES, 6, &st, false, &f32_ok);
            CHECK(st == ATTN_OK && err <= (f ? 0.06 : 0.03), "%s %s cache: status %d (%s), rel err "
                  "%.3g", attn_dtype_name(dt), paged ? "paged" : "contiguous", st,
                  attn_last_error(), err);
            fprintf(stderr, "%s %s cache: rel err %.3g\n", attn_dtype_name(dt),
                    paged ? "paged" : "contiguous", err);
            pcache_free(&p);
            mlayer_free(&l);
        }
}

/* the same dtype, paged and contiguous: the same error class (both float32 caches pass
 * the float32 tolerance; 16-bit ones within the rounding bound) */
static void test_same_as_contiguous(void) {
    mcase c = dec_case(60, ATTN_ROPE_INTERLEAVED, 8);
    for (int d = 0; d < 2; d++) {
        const attn_dtype dt = d ? ATTN_BF16 : ATTN_F32;
        mlayer l;
        mlayer_build(&l, &c);
        pcache p;
        ccache_build(&p, &c, c.Lq, dt);
        attn_status st;
        int f32_ok;
        double err = run_steps(&l, &p, SIZES, 6, &st, false, &f32_ok);
        CHECK(st == ATTN_OK && (dt == ATTN_F32 ? f32_ok : err <= tol_of(dt)),
              "contiguous %s: status %d, rel err %.3g", attn_dtype_name(dt), st, err);
        pcache_free(&p);
        mlayer_free(&l);
    }
}

static void expect_refused(mlayer *l, pcache *p, int64_t n, const attn_options *opt,
                           attn_status want, const char *what) {
    const int64_t len0 = p->len[0], len1 = p->len[1];
    fill_sentinel(l->sy, l->c.B * l->ty.stride[0]);
    fill_sentinel(p->k, p->nk);
    fill_sentinel(p->v, p->nv);
    attn_tensor x = rows_slice(&l->txq, 0, n), y = rows_slice(&l->ty, 0, n);
    attn_status st = attn_mha_decode(&l->m, &x, &p->c, &y, opt);
    CHECK(st == want, "%s: status %d, expected %d (%s)", what, st, want, attn_last_error());
    CHECK(count_written(l->sy, l->c.B * l->ty.stride[0]) == 0 && p->len[0] == len0 &&
              p->len[1] == len1 && count_written(p->k, p->nk) == 0 &&
              count_written(p->v, p->nv) == 0,
          "%s: something written", what);
}

static void test_misuse(void) {
    mcase c = dec_case(80, ATTN_ROPE_HALF, 8);
    mlayer l;
    mlayer_build(&l, &c);
    pcache p;
    pcache_build(&p, &c, 8, 4, ATTN_F32, 5);  /* max_pages 2: 8 rows a sequence */
    p.c.block_table = NULL;
    expect_refused(&l, &p, 1, NULL, ATTN_ERR_NULL, "paged without a table");
    p.c.block_table = &p.bt;
    expect_refused(&l, &p, 1, &(attn_options){.block_table = &p.bt}, ATTN_ERR_VALUE,
                   "options.block_table given");
    p.len[1] = 6;
    expect_refused(&l, &p, 3, NULL, ATTN_ERR_VALUE, "6 + 3 tokens in 2 pages of 4");
    p.len[1] = 0;
    const int32_t keep = p.table[1];
    p.table[1] = (int32_t)p.num_pages;
    p.len[0] = 3;  /* 3 + 2 tokens: page 1 of sequence 0 is written */
    expect_refused(&l, &p, 2, NULL, ATTN_ERR_VALUE, "an entry past the pool");
    p.table[1] = -1;
    expect_refused(&l, &p, 2, NULL, ATTN_ERR_VALUE, "an entry of -1 for a page written");
    p.table[1] = keep;
    p.len[0] = 0;
    p.table[p.max_pages] = p.table[0];  /* sequences 0 and 1 write one page */
    expect_refused(&l, &p, 1, NULL, ATTN_ERR_VALUE, "one page written by two sequences");
    p.table[p.max_pages] = (int32_t)(p.num_pages - 1);
    p.c.v.shape[2] = 3;
    expect_refused(&l, &p, 1, NULL, ATTN_ERR_SHAPE, "v pool of another page size");
    p.c.v.shape[2] = 0;
    p.c.k.shape[2] = 0;
    expect_refused(&l, &p, 1, NULL, ATTN_ERR_VALUE, "a page size of 0");
    p.c.k.shape[2] = p.c.v.shape[2] = 4;
    p.c.kind = ATTN_CACHE_CONTIGUOUS;
    expect_refused(&l, &p, 1, NULL, ATTN_ERR_VALUE, "a table for a contiguous cache");
    p.c.kind = ATTN_CACHE_PAGED;
    /* and once more accepted (the entries restored) */
    attn_tensor x = rows_slice(&l.txq, 0, 1), y = rows_slice(&l.ty, 0, 1);
    attn_status st = attn_mha_decode(&l.m, &x, &p.c, &y, NULL);
    CHECK(st == ATTN_OK && p.len[0] == 1 && p.len[1] == 1, "restored: status %d (%s)", st,
          attn_last_error());
    pcache_free(&p);
    mlayer_free(&l);
}

int main(void) {
    test_loop();
    test_q8_0();
    test_fp8();
    test_same_as_contiguous();
    test_misuse();
    /* planted: two pages of sequence 0 swapped after the first step */
    const attn_dtype dts[] = {ATTN_F32, ATTN_BF16};
    for (int d = 0; d < 2; d++) {
        mcase c = dec_case(90, ATTN_ROPE_HALF, 8);
        mlayer l;
        mlayer_build(&l, &c);
        pcache p;
        pcache_build(&p, &c, c.Lq, 4, dts[d], 9);
        attn_status st;
        int f32_ok;
        double err = run_steps(&l, &p, SIZES, 6, &st, true, &f32_ok);
        const bool passes = dts[d] == ATTN_F32 ? f32_ok : err <= tol_of(dts[d]);
        CHECK(st == ATTN_OK && !passes, "%s: the planted page swap was not caught (%.3g)",
              attn_dtype_name(dts[d]), err);
        fprintf(stderr, "planted page swap, %s pools: rel err %.3g\n", attn_dtype_name(dts[d]),
                err);
        pcache_free(&p);
        mlayer_free(&l);
    }
    return check_summary("test_mha_decode_paged");
}
