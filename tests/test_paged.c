/*
 * test_paged.c — attention over a paged key/value cache (attn_options.block_table) and
 *                attn_kv_append.
 *
 * Every case builds one cache twice: contiguous [B, Hkv, Lk, D] and as page pools, in
 * both layouts ([num_pages, Hkv, page_size, D] and FlashAttention's [num_pages,
 * page_size, Hkv, D] through strides), the pages in a shuffled order, with NaN in every
 * slot no valid key occupies (the tail of the last page, spare pages) and -1 or INT32_MAX
 * in every table entry past the valid pages: reading any of them poisons the answer or
 * faults. Checks:
 * - fused over pages = fused over the contiguous cache, bit for bit, O, LSE and weights,
 *   wherever the tiles are the same (every case, but on a kernel without decode_rows a
 *   decoding step on a tile that crosses pages, which is read segment by segment: those
 *   meet the reference instead);
 * - the float64 reference over pages = the reference over the contiguous cache, bit for
 *   bit, and the fused path within the contract's float32 tolerance of it;
 * - page sizes 1, 3, 16, 64, 256, lengths ending on, before and after a page boundary,
 *   float32 / float16 / bfloat16 caches, GQA, masks, bottom-right causal, windows,
 *   softcap, ALiBi, bias, Lq = 1 and prefill chunks, the split-KV decoding path;
 * - append (by slot, by position through the table, contiguous) then attend = attend
 *   over the concatenated cache, and the appended rows equal the float32 rows rounded;
 * - every misuse refused with its status and nothing written;
 * - a q8_0 pool (NaN scales in the unused slots) against the contiguous q8_0 cache and
 *   the reference over pages.
 * The kernel is chosen by ATTN_ISA, as for the other per-kernel suites.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "check.h"
#include "pages.h"
#include "core/half.h"
#include "kernels/kernels.h"
#include "oracle.h"

/* Whether a decoding step's tile across pages computes the contiguous cache's bits: one
 * step on its rows' addresses (decode_rows), or no decoding step at all (every tile
 * gathered); else it is read segment by segment, which rounds differently. */
static bool one_step_tiles(void) {
    const char *why = NULL;
    const attn_kernels *k = ai_select_kernels(&why);
    return k && (k->decode_rows || !k->decode);
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static double urand(void) {  // [0, 1)
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / 9007199254740992.0;
}
static float frand(void) { return (float)(2.0 * urand() - 1.0); }

/* One cache, contiguous and paged. */
typedef struct cache {
    int64_t B, Hkv, D, ps, max_pages, num_pages, Lk;
    attn_dtype dt;
    int64_t es;                 // bytes an element
    bool nhd;                   // pools [num_pages, page_size, Hkv, D]
    char *kc, *vc;              // contiguous [B, Hkv, Lk, D]
    char *kp, *vp;              // pools
    int32_t *bt;                // [B, max_pages]
    int32_t *len;               // [B]
    attn_tensor tk, tv, tkp, tvp, tbt, tlen;
} cache;

static int64_t pool_index(const cache *c, int64_t page, int64_t g, int64_t off, int64_t d) {
    return c->nhd ? ((page * c->ps + off) * c->Hkv + g) * c->D + d
                  : ((page * c->Hkv + g) * c->ps + off) * c->D + d;
}

static void pool_tensor(const cache *c, void *data, attn_tensor *t) {
    *t = (attn_tensor){data, c->dt, {c->num_pages, c->Hkv, c->ps, c->D}, {0, 0, 0, 1}};
    if (c->nhd) {
        t->stride[0] = c->ps * c->Hkv * c->D, t->stride[1] = c->D, t->stride[2] = c->Hkv * c->D;
    } else {
        t->stride[0] = c->Hkv * c->ps * c->D, t->stride[1] = c->ps * c->D, t->stride[2] = c->D;
    }
}

/* Copies every valid row of the contiguous cache into its page (bytes). */
static void scatter(cache *c) {
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t j = 0; j < c->len[b]; j++) {
            const int64_t page = c->bt[b * c->max_pages + j / c->ps], off = j % c->ps;
            for (int64_t g = 0; g < c->Hkv; g++) {
                const int64_t x = ((b * c->Hkv + g) * c->Lk + j) * c->D;
                const int64_t y = pool_index(c, page, g, off, 0);
                memcpy(c->kp + y * c->es, c->kc + x * c->es, (size_t)(c->D * c->es));
                memcpy(c->vp + y * c->es, c->vc + x * c->es, (size_t)(c->D * c->es));
            }
        }
}

/* lens[b] valid keys per batch; spare pages beyond those the lengths need. */
static void cache_make(cache *c, int64_t B, int64_t Hkv, int64_t D, int64_t ps,
                       int64_t max_pages, const int64_t *lens, attn_dtype dt, bool nhd,
                       int64_t spare) {
    *c = (cache){.B = B, .Hkv = Hkv, .D = D, .ps = ps, .max_pages = max_pages, .dt = dt,
                 .nhd = nhd, .es = (int64_t)attn_dtype_size(dt)};
    c->Lk = max_pages * ps;
    c->num_pages = B * max_pages + spare;
    const int64_t nc = B * Hkv * c->Lk * D, np = c->num_pages * ps * Hkv * D;
    c->kc = malloc((size_t)(nc * c->es) + 1), c->vc = malloc((size_t)(nc * c->es) + 1);
    c->kp = malloc((size_t)(np * c->es) + 1), c->vp = malloc((size_t)(np * c->es) + 1);
    c->bt = malloc((size_t)(B * max_pages) * sizeof(int32_t) + 1);
    c->len = malloc((size_t)B * sizeof(int32_t));
    for (int64_t b = 0; b < B; b++) c->len[b] = (int32_t)lens[b];
    for (int64_t x = 0; x < nc; x++) {  // keys past the length: NaN here too
        const int64_t j = (x / D) % c->Lk, b = x / (D * c->Lk * Hkv);
        attn_store(dt, c->kc, x, j < lens[b] ? 2.0f * frand() : NAN);
        attn_store(dt, c->vc, x, j < lens[b] ? frand() : NAN);
    }
    for (int64_t x = 0; x < np; x++) attn_store(dt, c->kp, x, NAN), attn_store(dt, c->vp, x, NAN);
    /* the pages in a shuffled order */
    int32_t *perm = shuffled_pages(c->num_pages, urand);  // pages.h
    int64_t next = 0;
    for (int64_t b = 0; b < B; b++) {
        const int64_t used = (lens[b] + ps - 1) / ps;
        for (int64_t pg = 0; pg < max_pages; pg++)
            c->bt[b * max_pages + pg] = pg < used ? perm[next++] : (pg % 2 ? -1 : INT32_MAX);
    }
    free(perm);
    scatter(c);
    c->tk = attn_tensor_4d(c->kc, dt, B, Hkv, c->Lk, D);
    c->tv = attn_tensor_4d(c->vc, dt, B, Hkv, c->Lk, D);
    pool_tensor(c, c->kp, &c->tkp);
    pool_tensor(c, c->vp, &c->tvp);
    c->tbt = attn_tensor_4d(c->bt, ATTN_I32, B, max_pages, 1, 1);
    c->tlen = attn_tensor_4d(c->len, ATTN_I32, B, 1, 1, 1);
}

static void cache_free(cache *c) {
    free(c->kc), free(c->vc), free(c->kp), free(c->vp), free(c->bt), free(c->len);
}

/* The features of a case. */
typedef struct feat {
    int64_t Hq, Lq;
    bool causal, bottom_right, window, softcap, alibi, mask, bias, lse, weights;
    attn_dtype q_dt;
} feat;

/* The outputs of one run. */
typedef struct outs {
    float *o, *lse, *w;
    attn_status st;
} outs;

static outs run(const cache *c, const feat *f, const float *q32, bool paged, attn_path path,
                const uint8_t *mask, const float *bias, const float *slopes) {
    const int64_t B = c->B, Hq = f->Hq, Lq = f->Lq, D = c->D, Lk = c->Lk;
    outs r = {calloc((size_t)(B * Hq * Lq * D) + 1, sizeof(float)),
              calloc((size_t)(B * Hq * Lq) + 1, sizeof(float)),
              calloc((size_t)(B * Hq * Lq * Lk) + 1, sizeof(float)), ATTN_OK};
    const int64_t nq = B * Hq * Lq * D;
    void *qd = malloc((size_t)nq * 4 + 1);
    for (int64_t x = 0; x < nq; x++) attn_store(f->q_dt, qd, x, q32[x]);
    attn_tensor q = attn_tensor_4d(qd, f->q_dt, B, Hq, Lq, D);
    attn_tensor o = attn_tensor_4d(r.o, ATTN_F32, B, Hq, Lq, D);
    attn_tensor lse = attn_tensor_4d(r.lse, ATTN_F32, B, Hq, Lq, 1);
    attn_tensor w = attn_tensor_4d(r.w, ATTN_F32, B, Hq, Lq, Lk);
    attn_tensor tm = attn_tensor_4d((void *)mask, ATTN_BOOL, B, 1, Lq, Lk);
    attn_tensor tb = attn_tensor_4d((void *)bias, ATTN_F32, B, Hq, Lq, Lk);
    attn_tensor ts = attn_tensor_4d((void *)slopes, ATTN_F32, Hq, 1, 1, 1);
    attn_options opt = {.causal = f->causal,
                        .align = f->bottom_right ? ATTN_ALIGN_BOTTOM_RIGHT : ATTN_ALIGN_TOP_LEFT,
                        .has_window = f->window, .window_left = 37, .window_right = 2,
                        .softcap = f->softcap ? 3.0f : 0.0f,
                        .mask = f->mask ? &tm : NULL, .bias = f->bias ? &tb : NULL,
                        .kv_len = &c->tlen, .alibi_slopes = f->alibi ? &ts : NULL,
                        .lse = f->lse ? &lse : NULL, .weights = f->weights ? &w : NULL,
                        .path = path, .block_table = paged ? &c->tbt : NULL};
    r.st = attn_forward(&q, paged ? &c->tkp : &c->tk, paged ? &c->tvp : &c->tv, &o, &opt);
    free(qd);
    return r;
}

static void outs_free(outs *r) { free(r->o), free(r->lse), free(r->w); }

static const char *dt_name(attn_dtype t) { return attn_dtype_name(t); }

/* One case: fused and reference, paged and contiguous. */
static void one_case(int64_t B, int64_t Hkv, int64_t D, int64_t ps, int64_t max_pages,
                     const int64_t *lens, attn_dtype dt, bool nhd, const feat *f,
                     const char *what) {
    cache c;
    cache_make(&c, B, Hkv, D, ps, max_pages, lens, dt, nhd, 3);
    const int64_t Hq = f->Hq, Lq = f->Lq, Lk = c.Lk;
    float *q = malloc((size_t)(B * Hq * Lq * D) * sizeof(float));
    for (int64_t x = 0; x < B * Hq * Lq * D; x++) q[x] = frand();
    uint8_t *mask = malloc((size_t)(B * Lq * Lk) + 1);
    for (int64_t x = 0; x < B * Lq * Lk; x++) mask[x] = urand() < 0.8;
    float *bias = malloc((size_t)(B * Hq * Lq * Lk) * sizeof(float) + 1);
    for (int64_t x = 0; x < B * Hq * Lq * Lk; x++) bias[x] = urand() < 0.05 ? -INFINITY : frand();
    float slopes[64];
    for (int64_t h = 0; h < Hq; h++) slopes[h] = 0.02f * (float)(h + 1);

    outs fp = run(&c, f, q, true, ATTN_PATH_FUSED, mask, bias, slopes);
    outs fc = run(&c, f, q, false, ATTN_PATH_FUSED, mask, bias, slopes);
    outs rp = run(&c, f, q, true, ATTN_PATH_REFERENCE, mask, bias, slopes);
    outs rc = run(&c, f, q, false, ATTN_PATH_REFERENCE, mask, bias, slopes);
    char tag[200];
    snprintf(tag, sizeof tag, "%s: page %lld, %s cache, %s, Hq %lld Hkv %lld Lq %lld, lens %lld %lld",
             what, (long long)ps, dt_name(dt), nhd ? "NHD" : "HND", (long long)Hq,
             (long long)Hkv, (long long)Lq, (long long)lens[0], (long long)lens[B - 1]);
    CHECK(fp.st == ATTN_OK && fc.st == ATTN_OK && rp.st == ATTN_OK && rc.st == ATTN_OK,
          "%s: statuses %d %d %d %d (%s)", tag, fp.st, fc.st, rp.st, rc.st, attn_last_error());
    const size_t no = (size_t)(B * Hq * Lq * D) * sizeof(float);
    const size_t nl = (size_t)(B * Hq * Lq) * sizeof(float);
    const size_t nw = (size_t)(B * Hq * Lq * Lk) * sizeof(float);
    /* The tiles are the same (so are the bits) unless a decoding-shaped block (at most 16
     * rows, no softcap, ALiBi, mask or bias: the kernels' decode step) meets a tile that
     * crosses pages on a kernel without decode_rows: it is read page by page, segment by
     * segment, in place. With page sizes that are multiples of the largest tile (128
     * keys) no tile crosses a page. */
    const int64_t group = Hq / Hkv, rows = Lq >= 64 ? 64 : Lq * (group < 64 / Lq ? group : 64 / Lq);
    const bool decode_step = rows <= 16 && !f->softcap && !f->alibi && !f->mask && !f->bias;
    if (!decode_step || ps % 128 == 0 || one_step_tiles()) {
        CHECK(memcmp(fp.o, fc.o, no) == 0, "%s: fused O paged != contiguous (bits)", tag);
        CHECK(!f->lse || memcmp(fp.lse, fc.lse, nl) == 0, "%s: fused LSE paged != contiguous", tag);
        CHECK(!f->weights || memcmp(fp.w, fc.w, nw) == 0, "%s: fused weights paged != contiguous", tag);
    }
    CHECK(memcmp(rp.o, rc.o, no) == 0, "%s: reference O paged != contiguous (bits)", tag);
    CHECK(!f->lse || memcmp(rp.lse, rc.lse, nl) == 0, "%s: reference LSE paged != contiguous", tag);
    CHECK(!f->weights || memcmp(rp.w, rc.w, nw) == 0, "%s: reference weights paged != contiguous", tag);
    /* the fused path against the float64 reference (its float32 output), over pages */
    const int64_t n = B * Hq * Lq * D;
    double *ref = malloc((size_t)(n > B * Hq * Lq * Lk ? n : B * Hq * Lq * Lk) * sizeof(double) + 8);
    tol_result tr;
    for (int64_t x = 0; x < n; x++) ref[x] = rp.o[x];
    CHECK(within_f32_tol(fp.o, ref, n, &tr), "%s: O off the reference: max err %g, rel %g", tag,
          tr.max_err, tr.rel_err);
    if (f->lse) {
        for (int64_t x = 0; x < B * Hq * Lq; x++) ref[x] = rp.lse[x];
        attn_tensor tq = attn_tensor_4d(q, ATTN_F32, B, Hq, Lq, D);
        attn_tensor tb = attn_tensor_4d(bias, ATTN_F32, B, Hq, Lq, Lk);
        attn_tensor ts = attn_tensor_4d(slopes, ATTN_F32, Hq, 1, 1, 1);
        const attn_options mo = {.softcap = f->softcap ? 3.0f : 0.0f, .bias = f->bias ? &tb : NULL,
                                 .alibi_slopes = f->alibi ? &ts : NULL};
        double *mag = malloc((size_t)(B * Hq * Lq) * sizeof(double) + 8);
        oracle_logit_mag(&tq, &c.tk, &mo, mag);
        CHECK(within_lse_tol(fp.lse, ref, mag, B * Hq * Lq, D, Lk, &tr), "%s: LSE off the "
              "reference: %g (%.3g of the bound)", tag, tr.max_err, tr.rel_err);
        free(mag);
    }
    if (f->weights) {
        for (int64_t x = 0; x < B * Hq * Lq * Lk; x++) ref[x] = rp.w[x];
        CHECK(within_f32_tol(fp.w, ref, B * Hq * Lq * Lk, &tr),
              "%s: weights off the reference: %g", tag, tr.max_err);
    }
    /* no NaN came through: nothing poisoned was read (the reference would show it too) */
    int nan = 0;
    for (int64_t x = 0; x < n; x++) nan |= isnan(fp.o[x]) | isnan(rp.o[x]);
    CHECK(!nan, "%s: NaN in O: a poisoned slot was read", tag);
    free(ref);
    outs_free(&fp), outs_free(&fc), outs_free(&rp), outs_free(&rc);
    free(q), free(mask), free(bias);
    cache_free(&c);
}

static void test_pages(void) {
    static const int64_t sizes[] = {1, 3, 16, 64, 256};
    static const attn_dtype dts[] = {ATTN_F32, ATTN_F16, ATTN_BF16};
    const feat feats[] = {
        {.Hq = 2, .Lq = 1, .lse = true, .q_dt = ATTN_F32},
        {.Hq = 8, .Lq = 1, .causal = true, .bottom_right = true, .lse = true, .weights = true,
         .q_dt = ATTN_F32},
        {.Hq = 4, .Lq = 7, .causal = true, .bottom_right = true, .window = true, .softcap = true,
         .alibi = true, .lse = true, .q_dt = ATTN_F32},
        {.Hq = 4, .Lq = 20, .causal = true, .bottom_right = true, .mask = true, .lse = true,
         .q_dt = ATTN_F32},
        {.Hq = 2, .Lq = 3, .bias = true, .lse = true, .weights = true, .q_dt = ATTN_F32},
    };
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        const int64_t ps = sizes[s];
        /* about 300 keys: lengths on a boundary, one before, one after */
        const int64_t pages = ps >= 64 ? 3 : (300 + ps - 1) / ps;
        const int64_t full = pages * ps, mid = (pages / 2 > 0 ? pages / 2 : 1) * ps;
        const int64_t lens[3] = {full, mid - 1 > 0 ? mid - 1 : 1, mid + 1 <= full ? mid + 1 : full};
        for (int d = 0; d < 3; d++)
            for (int nhd = 0; nhd < 2; nhd++)
                for (size_t v = 0; v < sizeof feats / sizeof *feats; v++) {
                    feat f = feats[v];
                    if (v == 3 && dts[d] != ATTN_F32) f.q_dt = dts[d];  // the 16-bit Q·Kᵀ paths
                    one_case(3, 2, 32, ps, pages, lens, dts[d], nhd, &f, "pages");
                }
    }
    /* decoding-shaped calls long enough for the split-KV path (chunks of keys merged) */
    static const int64_t long_ps[] = {3, 16, 64, 256};
    for (size_t s = 0; s < 4; s++) {
        const int64_t ps = long_ps[s], pages = (5000 + ps - 1) / ps;
        const int64_t lens[2] = {pages * ps - 1, 2048 + ps / 2};
        for (int d = 0; d < 3; d += 2) {
            const feat f = {.Hq = 8, .Lq = 1, .causal = true, .bottom_right = true, .lse = true,
                            .q_dt = ATTN_F32};
            one_case(2, 2, 64, ps, pages, lens, dts[d], s % 2, &f, "split");
            const feat g = {.Hq = 4, .Lq = 4, .causal = true, .bottom_right = true,
                            .window = true, .lse = true, .q_dt = ATTN_F32};
            one_case(2, 2, 64, ps, pages, lens, dts[d], s % 2 == 0, &g, "split window");
        }
    }
}

/* ---- misuse of the forward: a status, nothing written ---------------------------- */

static void test_forward_misuse(void) {
    const int64_t lens[2] = {40, 17};
    cache c;
    cache_make(&c, 2, 1, 8, 16, 3, lens, ATTN_F32, false, 1);
    float q[2 * 2 * 8], o[2 * 2 * 8], lse[4];
    for (int x = 0; x < 32; x++) q[x] = frand();
    attn_tensor tq = attn_tensor_4d(q, ATTN_F32, 2, 2, 1, 8);
    attn_tensor to = attn_tensor_4d(o, ATTN_F32, 2, 2, 1, 8);
    attn_tensor tl = attn_tensor_4d(lse, ATTN_F32, 2, 2, 1, 1);
    attn_options opt = {.kv_len = &c.tlen, .block_table = &c.tbt, .lse = &tl};
    memset(o, 0x7b, sizeof o);
    memset(lse, 0x7b, sizeof lse);
    CHECK(attn_forward(&tq, &c.tkp, &c.tvp, &to, &opt) == ATTN_OK, "valid call: %s",
          attn_last_error());
    float o_ok[32];
    memcpy(o_ok, o, sizeof o);
#define REFUSED(want, what)                                                                \
    do {                                                                                   \
        memset(o, 0x7b, sizeof o);                                                         \
        memset(lse, 0x7b, sizeof lse);                                                     \
        const attn_status st_ = attn_forward(&tq, &c.tkp, &c.tvp, &to, &opt);              \
        int untouched_ = 1;                                                                \
        for (int x_ = 0; x_ < 32; x_++) untouched_ &= ((uint8_t *)o)[x_] == 0x7b;          \
        for (int x_ = 0; x_ < 16; x_++) untouched_ &= ((uint8_t *)lse)[x_] == 0x7b;        \
        CHECK(st_ == (want), "%s: status %d, expected %d (%s)", what, st_, want,          \
              attn_last_error());                                                          \
        CHECK(untouched_, "%s: an output was written", what);                              \
    } while (0)
    int32_t saved = c.bt[1];
    c.bt[1] = (int32_t)c.num_pages;  // a valid page's entry outside the pool
    REFUSED(ATTN_ERR_VALUE, "entry = num_pages");
    c.bt[1] = -1;
    REFUSED(ATTN_ERR_VALUE, "entry -1 on a valid page");
    c.bt[1] = INT32_MIN;
    REFUSED(ATTN_ERR_VALUE, "entry INT32_MIN");
    c.bt[1] = saved;
    c.len[1] = 49;  // beyond the table's 3 pages of 16
    REFUSED(ATTN_ERR_VALUE, "kv_len beyond the table's pages");
    c.len[1] = -1;
    REFUSED(ATTN_ERR_VALUE, "negative kv_len");
    c.len[1] = 17;
    /* without kv_len every page is valid: the unused entries (-1, INT32_MAX) are refused */
    opt.kv_len = NULL;
    REFUSED(ATTN_ERR_VALUE, "no kv_len: the whole table, with unused entries");
    opt.kv_len = &c.tlen;
    attn_tensor bad = c.tbt;
    opt.block_table = &bad;
    bad.dtype = ATTN_I64;
    REFUSED(ATTN_ERR_DTYPE, "an int64 table");
    bad = c.tbt;
    bad.shape[0] = 1;
    REFUSED(ATTN_ERR_SHAPE, "a table of the wrong batch");
    bad = c.tbt;
    bad.shape[2] = 2;
    REFUSED(ATTN_ERR_SHAPE, "a table of 3 dimensions");
    opt.block_table = &c.tbt;
    attn_tensor k0 = c.tkp, v0 = c.tvp;
    k0.shape[2] = v0.shape[2] = 0;
    {
        memset(o, 0x7b, sizeof o);
        const attn_status st = attn_forward(&tq, &k0, &v0, &to, &opt);
        CHECK(st == ATTN_ERR_VALUE, "page size 0: status %d", st);
        CHECK(((uint8_t *)o)[0] == 0x7b, "page size 0: o written");
    }
    attn_tensor v1 = c.tvp;
    v1.shape[0] = c.num_pages - 1;
    {
        const attn_status st = attn_forward(&tq, &c.tkp, &v1, &to, &opt);
        CHECK(st == ATTN_ERR_SHAPE, "v with fewer pages than k: status %d", st);
    }
    /* an output over the block table */
    {
        attn_tensor ob = attn_tensor_4d(c.bt, ATTN_F32, 2, 2, 1, 1);
        attn_options o2 = opt;
        o2.lse = &ob;
        int32_t before[6];
        memcpy(before, c.bt, sizeof before);
        const attn_status st = attn_forward(&tq, &c.tkp, &c.tvp, &to, &o2);
        CHECK(st == ATTN_ERR_STRIDE, "lse over the block table: status %d", st);
        CHECK(memcmp(before, c.bt, sizeof before) == 0, "lse over the block table: table written");
    }
    /* the backward over pages: refused */
    {
        float g[32];
        attn_tensor tg = attn_tensor_4d(g, ATTN_F32, 2, 2, 1, 8);
        attn_tensor tdk = attn_tensor_4d(g, ATTN_F32, 2, 1, 48, 8);
        attn_options o2 = opt;
        o2.lse = NULL;
        const attn_status st = attn_backward(&tq, &c.tkp, &c.tvp, &to, &tg, &tl, &tg, &tdk, &tdk, &o2);
        CHECK(st == ATTN_ERR_UNSUPPORTED, "backward over pages: status %d", st);
        float grid[4];
        attn_tensor tgr = attn_tensor_4d(grid, ATTN_F32, 2, 2, 1, 1);
        /* the weights grid reads pages (its values: test_key_scores.c) */
        const attn_status sg = attn_weights_grid(&tq, &c.tkp, &tl, &tgr, ATTN_REDUCE_SUM, &o2);
        CHECK(sg == ATTN_OK, "weights grid over pages: %s (%s)", attn_status_string(sg), attn_last_error());
    }
    /* the valid call again: the same answer (nothing above left state behind) */
    memset(o, 0, sizeof o);
    CHECK(attn_forward(&tq, &c.tkp, &c.tvp, &to, &opt) == ATTN_OK &&
              memcmp(o, o_ok, sizeof o) == 0, "the valid call after the refusals differs");
#undef REFUSED
    cache_free(&c);
}

/* ---- append ----------------------------------------------------------------------- */

static attn_tensor new_rows(float *x, int64_t B, int64_t Hkv, int64_t n, int64_t D, bool bnhd) {
    attn_tensor t = attn_tensor_4d(x, ATTN_F32, B, Hkv, n, D);
    if (bnhd) {  // FlashAttention's [B, n, Hkv, D]
        t.stride[0] = n * Hkv * D, t.stride[1] = D, t.stride[2] = Hkv * D;
    }
    return t;
}

/* Append n tokens to a paged cache (by slot or by position), then attend; against the
 * contiguous cache with the same rows appended by hand. */
static void append_case(int64_t ps, attn_dtype dt, bool nhd, bool by_slot, int64_t n) {
    const int64_t B = 2, Hkv = 2, Hq = 4, D = 16;
    const int64_t pages = (200 + ps - 1) / ps + 1;
    const int64_t lens[2] = {(pages - 1) * ps - n + (ps > 1), 5};  // one crosses a boundary
    cache c;
    cache_make(&c, B, Hkv, D, ps, pages, lens, dt, nhd, 2);
    /* a table whose pages cover the new lengths too, in reverse order of the pool */
    int64_t next = 0;
    int32_t *perm = malloc((size_t)c.num_pages * sizeof(int32_t));
    for (int64_t a = 0; a < c.num_pages; a++) perm[a] = (int32_t)(c.num_pages - 1 - a);
    for (int64_t b = 0; b < B; b++)
        for (int64_t pg = 0; pg < pages; pg++)
            c.bt[b * pages + pg] = pg < (lens[b] + n + ps - 1) / ps ? perm[next++] : -1;
    free(perm);
    const int64_t np = c.num_pages * ps * Hkv * D;
    for (int64_t x = 0; x < np; x++) attn_store(dt, c.kp, x, NAN), attn_store(dt, c.vp, x, NAN);
    scatter(&c);

    float *kn = malloc((size_t)(B * Hkv * n * D) * sizeof(float) + 4);
    float *vn = malloc((size_t)(B * Hkv * n * D) * sizeof(float) + 4);
    const bool bnhd = ps % 2 == 1;
    attn_tensor tkn = new_rows(kn, B, Hkv, n, D, bnhd), tvn = new_rows(vn, B, Hkv, n, D, bnhd);
    for (int64_t b = 0; b < B; b++)
        for (int64_t g = 0; g < Hkv; g++)
            for (int64_t t = 0; t < n; t++)
                for (int64_t d = 0; d < D; d++) {
                    const int64_t x = b * tkn.stride[0] + g * tkn.stride[1] + t * tkn.stride[2] + d;
                    kn[x] = 2.0f * frand(), vn[x] = frand();
                    /* the contiguous cache gets the same rows, rounded by hand */
                    const int64_t y = ((b * Hkv + g) * c.Lk + lens[b] + t) * D + d;
                    attn_store(dt, c.kc, y, kn[x]);
                    attn_store(dt, c.vc, y, vn[x]);
                }
    int64_t *slots = malloc((size_t)(B * n) * sizeof(int64_t) + 8);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < n; t++) {
            const int64_t pos = lens[b] + t;
            slots[b * n + t] = (int64_t)c.bt[b * pages + pos / ps] * ps + pos % ps;
        }
    attn_tensor tslot = attn_tensor_4d(slots, ATTN_I64, B, n, 1, 1);
    const attn_status st = by_slot ? attn_kv_append(&tkn, &tvn, &c.tkp, &c.tvp, &tslot, NULL, NULL)
                                   : attn_kv_append(&tkn, &tvn, &c.tkp, &c.tvp, NULL, &c.tbt, &c.tlen);
    char tag[160];
    snprintf(tag, sizeof tag, "append %s: page %lld, %s, %s, n %lld", by_slot ? "by slot" : "by position",
             (long long)ps, dt_name(dt), nhd ? "NHD" : "HND", (long long)n);
    CHECK(st == ATTN_OK, "%s: status %d (%s)", tag, st, attn_last_error());
    /* the rows written are the rounded float32 rows, bit for bit */
    int same = 1;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < n; t++) {
            const int64_t pos = lens[b] + t, page = c.bt[b * pages + pos / ps];
            for (int64_t g = 0; g < Hkv; g++) {
                const int64_t x = pool_index(&c, page, g, pos % ps, 0);
                const int64_t y = ((b * Hkv + g) * c.Lk + pos) * D;
                same &= memcmp(c.kp + x * c.es, c.kc + y * c.es, (size_t)(D * c.es)) == 0;
                same &= memcmp(c.vp + x * c.es, c.vc + y * c.es, (size_t)(D * c.es)) == 0;
            }
        }
    CHECK(same, "%s: the appended rows are not the rounded float32 rows", tag);
    /* attend with the new lengths: queries at the last n positions, bottom-right causal */
    for (int64_t b = 0; b < B; b++) c.len[b] = (int32_t)(lens[b] + n);
    const feat f = {.Hq = Hq, .Lq = n, .causal = true, .bottom_right = true, .lse = true,
                    .q_dt = ATTN_F32};
    float *q = malloc((size_t)(B * Hq * n * D) * sizeof(float));
    for (int64_t x = 0; x < B * Hq * n * D; x++) q[x] = frand();
    outs fp = run(&c, &f, q, true, ATTN_PATH_FUSED, NULL, NULL, NULL);
    outs fc = run(&c, &f, q, false, ATTN_PATH_FUSED, NULL, NULL, NULL);
    outs rc = run(&c, &f, q, false, ATTN_PATH_REFERENCE, NULL, NULL, NULL);
    CHECK(fp.st == ATTN_OK && fc.st == ATTN_OK && rc.st == ATTN_OK, "%s: attend: %s", tag,
          attn_last_error());
    double *ref = malloc((size_t)(B * Hq * n * D) * sizeof(double));
    tol_result tr;
    /* Lq = 5 rows x group 2 = 10 rows: a decoding step; bit for bit where no tile
     * crosses a page, or where the kernel reads such a tile in one step */
    if (ps % 128 == 0 || one_step_tiles())
        CHECK(memcmp(fp.o, fc.o, (size_t)(B * Hq * n * D) * sizeof(float)) == 0,
              "%s: attend after append != attend over the concatenated cache", tag);
    for (int64_t x = 0; x < B * Hq * n * D; x++) ref[x] = rc.o[x];
    CHECK(within_f32_tol(fc.o, ref, B * Hq * n * D, &tr), "%s: contiguous off the reference",
          tag);
    CHECK(within_f32_tol(fp.o, ref, B * Hq * n * D, &tr), "%s: off the reference by %g", tag,
          tr.max_err);
    free(ref), free(q), free(kn), free(vn), free(slots);
    outs_free(&fp), outs_free(&fc), outs_free(&rc);
    cache_free(&c);
}

/* The contiguous kind: rows kv_len[b] + t of [B, Hkv, Lmax, D]. */
static void append_contiguous(attn_dtype dt) {
    const int64_t B = 2, Hkv = 1, Lmax = 10, D = 4, n = 3;
    const int64_t es = (int64_t)attn_dtype_size(dt);
    char *kc = calloc((size_t)(B * Hkv * Lmax * D), (size_t)es), *vc = calloc((size_t)(B * Hkv * Lmax * D), (size_t)es);
    float kn[24], vn[24];
    for (int x = 0; x < 24; x++) kn[x] = frand(), vn[x] = frand();
    int64_t len[2] = {7, 0};
    attn_tensor tk = attn_tensor_4d(kc, dt, B, Hkv, Lmax, D), tv = attn_tensor_4d(vc, dt, B, Hkv, Lmax, D);
    attn_tensor tkn = attn_tensor_4d(kn, ATTN_F32, B, Hkv, n, D), tvn = attn_tensor_4d(vn, ATTN_F32, B, Hkv, n, D);
    attn_tensor tl = attn_tensor_4d(len, ATTN_I64, B, 1, 1, 1);
    CHECK(attn_kv_append(&tkn, &tvn, &tk, &tv, NULL, NULL, &tl) == ATTN_OK, "contiguous append: %s",
          attn_last_error());
    int ok = 1;
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < Lmax; j++)
            for (int64_t d = 0; d < D; d++) {
                const bool fresh = j >= len[b] && j < len[b] + n;
                const float want_k = fresh ? attn_load(dt, (float[]){kn[(b * n + j - len[b]) * D + d]}, 0) : 0.0f;
                const float got_k = attn_load(dt, kc, (b * Lmax + j) * D + d);
                /* the rounding of the float32 value to the cache's dtype */
                float rk = want_k;
                if (fresh) {
                    char tmp[64] = {0};
                    attn_store(dt, tmp, 0, kn[(b * n + j - len[b]) * D + d]);
                    rk = attn_load(dt, tmp, 0);
                }
                ok &= got_k == rk;
            }
    CHECK(ok, "contiguous append (%s): rows not where kv_len says, or not rounded", dt_name(dt));
    len[0] = 8;  // 8 + 3 > 10: beyond the cache
    char *before = malloc((size_t)(B * Hkv * Lmax * D * es));
    memcpy(before, kc, (size_t)(B * Hkv * Lmax * D * es));
    CHECK(attn_kv_append(&tkn, &tvn, &tk, &tv, NULL, NULL, &tl) == ATTN_ERR_VALUE,
          "contiguous append beyond Lmax: not refused");
    CHECK(memcmp(before, kc, (size_t)(B * Hkv * Lmax * D * es)) == 0, "refused append wrote");
    free(before), free(kc), free(vc);
}

static void test_append_misuse(void) {
    const int64_t B = 2, Hkv = 1, D = 4, ps = 4, n = 2;
    const int64_t lens[2] = {5, 2};
    cache c;
    cache_make(&c, B, Hkv, D, ps, 3, lens, ATTN_F32, false, 1);
    float kn[16], vn[16];
    for (int x = 0; x < 16; x++) kn[x] = frand(), vn[x] = frand();
    attn_tensor tkn = attn_tensor_4d(kn, ATTN_F32, B, Hkv, n, D), tvn = attn_tensor_4d(vn, ATTN_F32, B, Hkv, n, D);
    int32_t slots[4] = {0, 1, 2, 3};
    attn_tensor ts = attn_tensor_4d(slots, ATTN_I32, B, n, 1, 1);
    const size_t pool = (size_t)(c.num_pages * ps * Hkv * D) * sizeof(float);
    char *k0 = malloc(pool), *v0 = malloc(pool);
    memcpy(k0, c.kp, pool), memcpy(v0, c.vp, pool);
#define APPEND_REFUSED(want, what, call)                                                   \
    do {                                                                                   \
        const attn_status st_ = (call);                                                    \
        CHECK(st_ == (want), "%s: status %d, expected %d (%s)", what, st_, want,          \
              attn_last_error());                                                          \
        CHECK(memcmp(k0, c.kp, pool) == 0 && memcmp(v0, c.vp, pool) == 0,                 \
              "%s: the cache was written", what);                                          \
    } while (0)
    const int64_t top = c.num_pages * ps;
    slots[3] = (int32_t)top;
    APPEND_REFUSED(ATTN_ERR_VALUE, "slot = num_pages * page_size",
                   attn_kv_append(&tkn, &tvn, &c.tkp, &c.tvp, &ts, NULL, NULL));
    slots[3] = -2;
    APPEND_REFUSED(ATTN_ERR_VALUE, "slot -2", attn_kv_append(&tkn, &tvn, &c.tkp, &c.tvp, &ts, NULL, NULL));
    slots[3] = 1;
    APPEND_REFUSED(ATTN_ERR_VALUE, "two tokens on one slot",
                   attn_kv_append(&tkn, &tvn, &c.tkp, &c.tvp, &ts, NULL, NULL));
    slots[3] = 3;
    /* by position: kv_len 5 + 2 tokens = page 1 of batch 0 (valid); batch 1 at 2, 3 */
    c.bt[0 * 3 + 1] = (int32_t)c.num_pages;
    APPEND_REFUSED(ATTN_ERR_VALUE, "table entry outside the pool",
                   attn_kv_append(&tkn, &tvn, &c.tkp, &c.tvp, NULL, &c.tbt, &c.tlen));
    c.bt[0 * 3 + 1] = -1;
    APPEND_REFUSED(ATTN_ERR_VALUE, "negative table entry",
                   attn_kv_append(&tkn, &tvn, &c.tkp, &c.tvp, NULL, &c.tbt, &c.tlen));
    c.bt[0 * 3 + 1] = c.bt[1 * 3 + 0];  // batch 1's page 0: positions 2, 3 are in both
    c.bt[0 * 3 + 1] = c.bt[1 * 3 + 0];
    {
        /* batch 0 writes rows 1, 2 of that page (positions 5, 6); batch 1 writes 2, 3 */
        APPEND_REFUSED(ATTN_ERR_VALUE, "two batches on one row through shared pages",
                       attn_kv_append(&tkn, &tvn, &c.tkp, &c.tvp, NULL, &c.tbt, &c.tlen));
    }
    c.bt[0 * 3 + 1] = (int32_t)(c.num_pages - 1);  // the spare page
    c.len[0] = 11;  // 11 + 2 > 3 pages of 4
    APPEND_REFUSED(ATTN_ERR_VALUE, "position beyond the table's pages",
                   attn_kv_append(&tkn, &tvn, &c.tkp, &c.tvp, NULL, &c.tbt, &c.tlen));
    c.len[0] = -1;
    APPEND_REFUSED(ATTN_ERR_VALUE, "negative kv_len",
                   attn_kv_append(&tkn, &tvn, &c.tkp, &c.tvp, NULL, &c.tbt, &c.tlen));
    c.len[0] = 5;
    APPEND_REFUSED(ATTN_ERR_NULL, "by position without kv_len",
                   attn_kv_append(&tkn, &tvn, &c.tkp, &c.tvp, NULL, &c.tbt, NULL));
    attn_tensor kz = c.tkp, vz = c.tvp;
    kz.shape[2] = vz.shape[2] = 0;
    APPEND_REFUSED(ATTN_ERR_VALUE, "page size 0", attn_kv_append(&tkn, &tvn, &kz, &vz, &ts, NULL, NULL));
    /* k_new inside the pool it is written to */
    attn_tensor kin = attn_tensor_4d(c.kp, ATTN_F32, B, Hkv, n, D);
    APPEND_REFUSED(ATTN_ERR_STRIDE, "k_new overlaps k_cache",
                   attn_kv_append(&kin, &tvn, &c.tkp, &c.tvp, &ts, NULL, NULL));
    APPEND_REFUSED(ATTN_ERR_STRIDE, "v_cache = k_cache",
                   attn_kv_append(&tkn, &tvn, &c.tkp, &c.tkp, &ts, NULL, NULL));
    attn_tensor kv16 = c.tvp;
    kv16.dtype = ATTN_BF16;
    APPEND_REFUSED(ATTN_ERR_DTYPE, "k and v caches of two dtypes",
                   attn_kv_append(&tkn, &tvn, &c.tkp, &kv16, &ts, NULL, NULL));
    attn_tensor ts_bad = ts;
    ts_bad.shape[1] = 1;
    APPEND_REFUSED(ATTN_ERR_SHAPE, "slot_mapping of the wrong shape",
                   attn_kv_append(&tkn, &tvn, &c.tkp, &c.tvp, &ts_bad, NULL, NULL));
    /* vLLM's padding slot -1: that token is skipped, the others written */
    slots[1] = -1;
    CHECK(attn_kv_append(&tkn, &tvn, &c.tkp, &c.tvp, &ts, NULL, NULL) == ATTN_OK, "slot -1: %s",
          attn_last_error());
    CHECK(memcmp(c.kp + 1 * D * sizeof(float), k0 + 1 * D * sizeof(float), D * sizeof(float)) == 0,
          "slot -1 was written");
    CHECK(memcmp(c.kp, kn, D * sizeof(float)) == 0, "slot 0 not written");
#undef APPEND_REFUSED
    free(k0), free(v0);
    cache_free(&c);
}

/* ---- a q8_0 pool: the same addressing, rows of whole blocks -------------------------- */

static void q8_case(int64_t ps, int64_t Lq, bool softcap) {
    const int64_t B = 2, Hkv = 2, Hq = 4, D = 64, rb = D / 32 * 34;
    const int64_t pages = (260 + ps - 1) / ps, Lk = pages * ps;
    const int64_t lens[2] = {Lk - (ps > 1), Lk / 2 + 1};
    const int64_t n = B * Hkv * Lk * D;
    float *k32 = malloc((size_t)n * sizeof(float)), *v32 = malloc((size_t)n * sizeof(float));
    for (int64_t x = 0; x < n; x++) k32[x] = 2.0f * frand(), v32[x] = frand();
    const size_t cbytes = (size_t)B * (size_t)Hkv * (size_t)Lk * (size_t)rb;
    uint8_t *kc = malloc(cbytes), *vc = malloc(cbytes);
    attn_tensor f32k = attn_tensor_4d(k32, ATTN_F32, B, Hkv, Lk, D), f32v = attn_tensor_4d(v32, ATTN_F32, B, Hkv, Lk, D);
    attn_tensor tk = attn_tensor_4d(kc, ATTN_Q8_0, B, Hkv, Lk, D), tv = attn_tensor_4d(vc, ATTN_Q8_0, B, Hkv, Lk, D);
    CHECK(attn_quantize_q8_0(&f32k, &tk) == ATTN_OK && attn_quantize_q8_0(&f32v, &tv) == ATTN_OK,
          "q8_0: quantize: %s", attn_last_error());
    const int64_t np = B * pages + 2;
    const size_t pool = (size_t)np * (size_t)Hkv * (size_t)ps * (size_t)rb;
    uint8_t *kp = malloc(pool), *vp = malloc(pool);
    memset(kp, 0xff, pool);  // scale 0xffff: a float16 NaN
    memset(vp, 0xff, pool);
    int32_t *bt = malloc((size_t)(B * pages) * sizeof(int32_t)), len[2] = {(int32_t)lens[0], (int32_t)lens[1]};
    int64_t next = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t pg = 0; pg < pages; pg++)
            bt[b * pages + pg] = pg < (lens[b] + ps - 1) / ps ? (int32_t)(np - 1 - next++) : -1;
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < lens[b]; j++)
            for (int64_t g = 0; g < Hkv; g++) {
                const int64_t x = ((b * Hkv + g) * Lk + j) * rb;
                const int64_t y = ((bt[b * pages + j / ps] * Hkv + g) * ps + j % ps) * rb;
                memcpy(kp + y, kc + x, (size_t)rb), memcpy(vp + y, vc + x, (size_t)rb);
            }
    attn_tensor tkp = attn_tensor_4d(kp, ATTN_Q8_0, np, Hkv, ps, D), tvp = attn_tensor_4d(vp, ATTN_Q8_0, np, Hkv, ps, D);
    attn_tensor tbt = attn_tensor_4d(bt, ATTN_I32, B, pages, 1, 1), tl = attn_tensor_4d(len, ATTN_I32, B, 1, 1, 1);
    float *q = malloc((size_t)(B * Hq * Lq * D) * sizeof(float));
    for (int64_t x = 0; x < B * Hq * Lq * D; x++) q[x] = frand();
    attn_tensor tq = attn_tensor_4d(q, ATTN_F32, B, Hq, Lq, D);
    float *o[3];
    attn_status st[3];
    for (int r = 0; r < 3; r++) {
        o[r] = calloc((size_t)(B * Hq * Lq * D), sizeof(float));
        attn_tensor to = attn_tensor_4d(o[r], ATTN_F32, B, Hq, Lq, D);
        attn_options opt = {.causal = true, .align = ATTN_ALIGN_BOTTOM_RIGHT, .kv_len = &tl,
                            .softcap = softcap ? 3.0f : 0.0f,
                            .block_table = r == 1 ? NULL : &tbt,
                            .path = r == 2 ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED};
        st[r] = attn_forward(&tq, r == 1 ? &tk : &tkp, r == 1 ? &tv : &tvp, &to, &opt);
    }
    CHECK(st[0] == ATTN_OK && st[1] == ATTN_OK && st[2] == ATTN_OK, "q8_0 page %lld: %d %d %d (%s)",
          (long long)ps, st[0], st[1], st[2], attn_last_error());
    const bool same_tiles = softcap || ps % 128 == 0 || one_step_tiles();
    if (same_tiles)
        CHECK(memcmp(o[0], o[1], (size_t)(B * Hq * Lq * D) * sizeof(float)) == 0,
              "q8_0 page %lld, Lq %lld: paged != contiguous (bits)", (long long)ps, (long long)Lq);
    double *ref = malloc((size_t)(B * Hq * Lq * D) * sizeof(double));
    for (int64_t x = 0; x < B * Hq * Lq * D; x++) ref[x] = o[2][x];
    tol_result tr;
    CHECK(within_f32_tol(o[0], ref, B * Hq * Lq * D, &tr),
          "q8_0 page %lld, Lq %lld: off the reference over pages by %g", (long long)ps,
          (long long)Lq, tr.max_err);
    free(ref), free(q), free(bt), free(kp), free(vp), free(kc), free(vc), free(k32), free(v32);
    for (int r = 0; r < 3; r++) free(o[r]);
}

int main(void) {
    printf("test_paged: kernel %s\n", attn_kernel_name());
    test_pages();
    test_forward_misuse();
    static const int64_t sizes[] = {1, 3, 16, 64, 256};
    static const attn_dtype dts[] = {ATTN_F32, ATTN_F16, ATTN_BF16};
    for (int s = 0; s < 5; s++)
        for (int d = 0; d < 3; d++) {
            append_case(sizes[s], dts[d], d == 1, s % 2 == 0, 1);
            append_case(sizes[s], dts[d], d != 1, s % 2 == 1, 5);
        }
    for (int d = 0; d < 3; d++) append_contiguous(dts[d]);
    test_append_misuse();
    for (int s = 0; s < 5; s++) {
        q8_case(sizes[s], 1, false);
        q8_case(sizes[s], 6, true);
    }
    return check_summary("test_paged");
}
