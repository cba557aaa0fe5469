/*
 * test_varlen_paged.c — a server's whole step in one call: attn_varlen_forward over a
 * paged cache (options.block_table, each request's key count in options.kv_len, the
 * FlashAttention seqused_k), requests of 1 new token (decoding) beside chunks of prefill,
 * and speculative-decoding trees through a mask over the padded batch
 * (docs/CONTRACT.md, "Packed (variable-length) batches", "Many requests in one call").
 *
 * What it checks:
 *  1. a mixed step (decodes, prefill chunks, an empty request) is bit for bit the same
 *     requests as separate attn_forward calls (B = 1, the request's row of the table, its
 *     key count) — output and LSE — for float32, bfloat16 and q8_0 caches, page sizes 1,
 *     16 and 64, with GQA, a window, sinks; 1 and 2 threads the same bits;
 *  2. float32 against the suite's float64 oracle over each request's keys gathered into
 *     a contiguous cache (a planted error, one page read from another request, fails it);
 *  3. a draft tree per request (each draft token sees the cache and its ancestors; parents
 *     drawn at random) as the padded mask: bit for bit the separate calls, and against the
 *     oracle with the same mask;
 *  4. refusals, nothing written: cu_seqlens_k given with the table, kv_len missing, a key
 *     count over max_seqlen_k or over the request's pages, a table entry outside the pool
 *     in the LAST request, a mask of the wrong shape, the backward of a paged call.
 * Run once per kernel by scripts/check.sh (ATTN_ISA).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "oracle.h"
#include "pages.h"

enum { NREQ = 6 };

static rng_t g_rng = {38038};
static double unif(void) { return rng_unif(&g_rng); }

typedef struct step {
    attn_dtype dt;
    int64_t Hq, Hkv, D, page, maxp, pages;
    int64_t lq[NREQ], lk[NREQ];     /* new rows, keys (cached + new) per request */
    int32_t cu[NREQ + 1];
    int64_t total_q, max_q, max_k;
    float *pool_k, *pool_v;         /* float32 values of the pools */
    void *kd, *vd;                  /* the pools in dt */
    int32_t *table;
    int64_t *len;
    float *q, *o, *o2, *lse, *lse2, *sinks;
    uint8_t *mask;                  /* [NREQ, 1, max_q, maxp * page] or NULL */
    attn_tensor tk, tv, tq, to, tlse, tt, tlen, tcu, tsinks, tmask;
    attn_options opt;
} step;

static size_t dt_bytes(attn_dtype dt, int64_t n) {
    return dt == ATTN_Q8_0 ? (size_t)(n / 32 * 34) : (size_t)n * attn_dtype_size(dt);
}

/* the pools in dt from their float32 values (q8_0: quantized, then read back as floats
 * so that the oracle sees the cache's values) */
static void pools_to(step *s) {
    const int64_t n = s->pages * s->Hkv * s->page * s->D;
    s->kd = xcalloc(dt_bytes(s->dt, n), 1);
    s->vd = xcalloc(dt_bytes(s->dt, n), 1);
    float *src[2] = {s->pool_k, s->pool_v};
    void *dst[2] = {s->kd, s->vd};
    for (int x = 0; x < 2; x++) {
        if (s->dt == ATTN_F32) {
            memcpy(dst[x], src[x], (size_t)n * 4);
        } else if (s->dt == ATTN_BF16) {
            for (int64_t e = 0; e < n; e++) {
                ((uint16_t *)dst[x])[e] = attn_f32_to_bf16(src[x][e]);
                src[x][e] = attn_bf16_to_f32(((uint16_t *)dst[x])[e]);
            }
        } else {
            const attn_tensor f = attn_tensor_4d(src[x], ATTN_F32, 1, 1, n / s->D, s->D);
            const attn_tensor qt = attn_tensor_4d(dst[x], ATTN_Q8_0, 1, 1, n / s->D, s->D);
            CHECK(attn_quantize_q8_0(&f, &qt) == ATTN_OK, "quantize: %s", attn_last_error());
            CHECK(attn_dequantize_q8_0(&qt, &f) == ATTN_OK, "dequantize: %s", attn_last_error());
        }
    }
}

static void step_build(step *s, attn_dtype dt, int64_t page, bool tree, bool options) {
    memset(s, 0, sizeof *s);
    s->dt = dt, s->Hq = 8, s->Hkv = 2, s->D = 64, s->page = page;
    /* decodes, prefill chunks, an empty request, a request with nothing cached */
    static const int64_t lq_plain[NREQ] = {1, 1, 7, 0, 1, 19};
    static const int64_t lq_tree[NREQ] = {4, 9, 1, 6, 0, 12};
    s->cu[0] = 0;
    s->max_q = 0, s->max_k = 0;
    for (int r = 0; r < NREQ; r++) {
        s->lq[r] = tree ? lq_tree[r] : lq_plain[r];
        s->lk[r] = r == 5 ? s->lq[r] : s->lq[r] + 1 + rng_int(&g_rng, 150);
        s->cu[r + 1] = s->cu[r] + (int32_t)s->lq[r];
        if (s->lq[r] > s->max_q) s->max_q = s->lq[r];
        if (s->lk[r] > s->max_k) s->max_k = s->lk[r];
    }
    s->total_q = s->cu[NREQ];
    s->maxp = (s->max_k + page - 1) / page + 1;  /* a spare page column */
    s->pages = NREQ * s->maxp + 2;
    const int64_t n = s->pages * s->Hkv * page * s->D;
    s->pool_k = xcalloc((size_t)n, 4), s->pool_v = xcalloc((size_t)n, 4);
    for (int64_t e = 0; e < n; e++) s->pool_k[e] = (float)rng_sym(&g_rng), s->pool_v[e] = (float)rng_sym(&g_rng);
    pools_to(s);
    int32_t *perm = shuffled_pages(s->pages, unif);
    s->table = xcalloc((size_t)(NREQ * s->maxp), 4);
    for (int64_t e = 0; e < NREQ * s->maxp; e++) s->table[e] = perm[e];
    free(perm);
    s->len = xcalloc(NREQ, 8);
    for (int r = 0; r < NREQ; r++) s->len[r] = s->lk[r];

    const int64_t nq = s->Hq * s->total_q;
    s->q = xcalloc((size_t)(nq * s->D), 4);
    for (int64_t e = 0; e < nq * s->D; e++) s->q[e] = (float)rng_sym(&g_rng);
    s->o = xcalloc((size_t)(nq * s->D), 4), s->o2 = xcalloc((size_t)(nq * s->D), 4);
    s->lse = xcalloc((size_t)nq, 4), s->lse2 = xcalloc((size_t)nq, 4);
    s->sinks = xcalloc((size_t)s->Hq, 4);
    for (int64_t h = 0; h < s->Hq; h++) s->sinks[h] = (float)rng_sym(&g_rng);

    /* pools [pages, Hkv, page, D]; packed q, o [1, Hq, total_q, D] over [total, H, D] memory */
    s->tk = attn_tensor_4d(s->kd, dt, s->pages, s->Hkv, page, s->D);
    s->tv = attn_tensor_4d(s->vd, dt, s->pages, s->Hkv, page, s->D);
    s->tq = (attn_tensor){s->q, ATTN_F32, {1, s->Hq, s->total_q, s->D}, {0, s->D, s->Hq * s->D, 1}};
    s->to = (attn_tensor){s->o, ATTN_F32, {1, s->Hq, s->total_q, s->D}, {0, s->D, s->Hq * s->D, 1}};
    s->tlse = attn_tensor_4d(s->lse, ATTN_F32, 1, s->Hq, s->total_q, 1);
    s->tt = attn_tensor_4d(s->table, ATTN_I32, NREQ, s->maxp, 1, 1);
    s->tlen = attn_tensor_4d(s->len, ATTN_I64, NREQ, 1, 1, 1);
    s->tcu = attn_tensor_4d(s->cu, ATTN_I32, NREQ + 1, 1, 1, 1);
    s->tsinks = attn_tensor_4d(s->sinks, ATTN_F32, s->Hq, 1, 1, 1);
    s->opt = (attn_options){.causal = true, .align = ATTN_ALIGN_BOTTOM_RIGHT, .lse = &s->tlse,
                            .block_table = &s->tt, .kv_len = &s->tlen};
    if (options) {
        s->opt.has_window = true, s->opt.window_left = 40, s->opt.window_right = -1;
        s->opt.sinks = &s->tsinks;
    }
    if (tree) {  /* row i of request r: the cache before its drafts, and i's ancestors */
        const int64_t lk = s->maxp * page;
        s->mask = xcalloc((size_t)(NREQ * s->max_q * lk), 1);
        for (int r = 0; r < NREQ; r++) {
            const int64_t nd = s->lq[r], first = s->lk[r] - nd;  /* drafts at first .. lk-1 */
            int64_t parent[64];
            for (int64_t i = 0; i < nd; i++) parent[i] = i == 0 ? -1 : rng_int(&g_rng, i);
            for (int64_t i = 0; i < nd; i++) {
                uint8_t *row = s->mask + (r * s->max_q + i) * lk;
                for (int64_t j = 0; j < first; j++) row[j] = 1;
                for (int64_t a = i; a >= 0; a = parent[a]) row[first + a] = 1;
            }
        }
        s->tmask = attn_tensor_4d(s->mask, ATTN_BOOL, NREQ, 1, s->max_q, lk);
        s->opt.mask = &s->tmask;
        s->opt.causal = false;  /* the tree is the mask */
    }
}

static void step_free(step *s) {
    free(s->pool_k), free(s->pool_v), free(s->kd), free(s->vd), free(s->table), free(s->len);
    free(s->q), free(s->o), free(s->o2), free(s->lse), free(s->lse2), free(s->sinks), free(s->mask);
}

static attn_status packed(step *s, int threads, float *o, float *lse) {
    attn_options opt = s->opt;
    opt.threads = threads;
    attn_tensor to = s->to, tl = s->tlse;
    to.data = o, tl.data = lse;
    opt.lse = &tl;
    return attn_varlen_forward(&s->tq, &s->tk, &s->tv, &to, &s->tcu, NULL, s->max_q, s->max_k, &opt);
}

/* request r alone: attn_forward with B = 1 on its rows, its table row, its key count */
static attn_status alone(step *s, int r, float *o, float *lse) {
    const int64_t q0 = s->cu[r];
    attn_tensor tq = s->tq, to = s->to, tl = s->tlse, tt = s->tt, tm = s->tmask;
    tq.shape[2] = to.shape[2] = tl.shape[2] = s->lq[r];
    tq.data = s->q + q0 * s->Hq * s->D;
    to.data = o + q0 * s->Hq * s->D;
    tl.data = lse + q0;
    tt.shape[0] = 1, tt.data = s->table + r * s->maxp;
    int64_t len = s->lk[r];
    attn_tensor tlen = {&len, ATTN_I64, {1, 1, 1, 1}, {1, 1, 1, 1}};
    attn_options opt = s->opt;
    opt.lse = &tl, opt.block_table = &tt, opt.kv_len = &tlen;
    if (s->mask) {
        tm.shape[0] = 1, tm.shape[2] = s->lq[r];
        tm.data = s->mask + r * tm.stride[0];
        opt.mask = &tm;
    }
    return attn_forward(&tq, &s->tk, &s->tv, &to, &opt);
}

/* request r against the oracle over its keys gathered contiguously; table: the one read */
static int oracle_ok(step *s, int r, const float *o, const int32_t *table) {
    const int64_t lk = s->lk[r], lq = s->lq[r], D = s->D, Hkv = s->Hkv;
    if (lq == 0) return 1;
    float *kc = xcalloc((size_t)(Hkv * lk * D), 4), *vc = xcalloc((size_t)(Hkv * lk * D), 4);
    for (int64_t g = 0; g < Hkv; g++)
        for (int64_t j = 0; j < lk; j++) {
            const int64_t pg = table[r * s->maxp + j / s->page];
            const int64_t at = ((pg * Hkv + g) * s->page + j % s->page) * D;
            memcpy(kc + (g * lk + j) * D, s->pool_k + at, (size_t)D * 4);
            memcpy(vc + (g * lk + j) * D, s->pool_v + at, (size_t)D * 4);
        }
    const attn_tensor tk = attn_tensor_4d(kc, ATTN_F32, 1, Hkv, lk, D);
    const attn_tensor tv = attn_tensor_4d(vc, ATTN_F32, 1, Hkv, lk, D);
    attn_tensor tq = s->tq;
    tq.shape[2] = lq, tq.data = s->q + s->cu[r] * s->Hq * D;
    uint8_t *m = NULL;
    attn_tensor tm;
    attn_options oo = {.causal = s->opt.causal, .align = ATTN_ALIGN_BOTTOM_RIGHT,
                       .has_window = s->opt.has_window, .window_left = s->opt.window_left,
                       .window_right = s->opt.window_right};
    if (s->mask) {  /* the request's rows, its first lk keys */
        m = xcalloc((size_t)(lq * lk), 1);
        for (int64_t i = 0; i < lq; i++)
            memcpy(m + i * lk, s->mask + (r * s->max_q + i) * s->tmask.shape[3], (size_t)lk);
        tm = attn_tensor_4d(m, ATTN_BOOL, 1, 1, lq, lk);
        oo.mask = &tm;
    }
    const int64_t no = s->Hq * lq * D;
    double *ref = xcalloc((size_t)no, 8);
    oracle_forward(&tq, &tk, &tv, &oo, ref, NULL, NULL);
    float *got = xcalloc((size_t)no, 4);  /* [Hq, lq, D] from the packed [total, Hq, D] */
    for (int64_t h = 0; h < s->Hq; h++)
        for (int64_t i = 0; i < lq; i++)
            memcpy(got + (h * lq + i) * D, o + ((s->cu[r] + i) * s->Hq + h) * D, (size_t)D * 4);
    tol_result res;
    const int ok = within_f32_tol(got, ref, no, &res);
    free(kc), free(vc), free(m), free(ref), free(got);
    return ok;
}

static void check_step(attn_dtype dt, int64_t page, bool tree, bool options) {
    char desc[96];
    snprintf(desc, sizeof desc, "%s page %lld%s%s", attn_dtype_name(dt), (long long)page,
             tree ? " tree" : "", options ? " window+sinks" : "");
    step s;
    step_build(&s, dt, page, tree, options);
    const int64_t no = s.Hq * s.total_q * s.D, nl = s.Hq * s.total_q;
    attn_status st = packed(&s, 2, s.o, s.lse);
    CHECK(st == ATTN_OK, "%s: %s (%s)", desc, attn_status_string(st), attn_last_error());
    fill_sentinel(s.o2, no);
    fill_sentinel(s.lse2, nl);
    for (int r = 0; r < NREQ && st == ATTN_OK; r++) {
        if (s.lq[r] == 0) continue;
        st = alone(&s, r, s.o2, s.lse2);
        CHECK(st == ATTN_OK, "%s: request %d alone: %s", desc, r, attn_last_error());
    }
    CHECK(memcmp(s.o, s.o2, (size_t)no * 4) == 0, "%s: the step's O differs from the separate calls'", desc);
    CHECK(memcmp(s.lse, s.lse2, (size_t)nl * 4) == 0, "%s: the step's LSE differs", desc);
    st = packed(&s, 1, s.o2, s.lse2);
    CHECK(st == ATTN_OK && memcmp(s.o, s.o2, (size_t)no * 4) == 0, "%s: 1 and 2 threads differ", desc);
    if (!options) {  /* the oracle (no sinks in its reading) */
        int bad = 0;
        for (int r = 0; r < NREQ; r++) bad += !oracle_ok(&s, r, s.o, s.table);
        CHECK(bad == 0, "%s: %d requests off the float64 oracle", desc, bad);
        /* planted: the oracle reads request 1's first page where request 0's is (the
         * call read its own: attention does not see the order of its keys, only them) */
        int32_t *other = xcalloc((size_t)(NREQ * s.maxp), 4);
        memcpy(other, s.table, (size_t)(NREQ * s.maxp) * 4);
        other[1 * s.maxp] = other[0];
        CHECK(s.lq[1] == 0 || !oracle_ok(&s, 1, s.o, other), "%s: a wrong page passed the oracle", desc);
        free(other);
    }
    step_free(&s);
}

/* a refused call writes nothing */
static void refused(step *s, const char *what, attn_status want, const attn_tensor *cu_k,
                    int64_t max_k, const attn_options *opt) {
    const int64_t no = s->Hq * s->total_q * s->D;
    fill_sentinel(s->o, no);
    fill_sentinel(s->lse, s->Hq * s->total_q);
    const attn_status st = attn_varlen_forward(&s->tq, &s->tk, &s->tv, &s->to, &s->tcu, cu_k,
                                               s->max_q, max_k, opt);
    CHECK(st == want, "%s: got %s, expected %s (%s)", what, attn_status_string(st),
          attn_status_string(want), attn_last_error());
    CHECK(count_written(s->o, no) == 0 && count_written(s->lse, s->Hq * s->total_q) == 0,
          "%s: something was written", what);
}

static void check_refusals(void) {
    step s;
    step_build(&s, ATTN_F32, 16, false, false);
    attn_options opt = s.opt;
    refused(&s, "cu_seqlens_k with a block table", ATTN_ERR_VALUE, &s.tcu, s.max_k, &opt);
    opt.kv_len = NULL;
    refused(&s, "no kv_len", ATTN_ERR_NULL, NULL, s.max_k, &opt);
    opt = s.opt;
    refused(&s, "a key count over max_seqlen_k", ATTN_ERR_VALUE, NULL, s.max_k - 1, &opt);
    const int64_t keep = s.len[NREQ - 1];
    s.len[NREQ - 1] = s.maxp * s.page + 1;
    refused(&s, "a key count over the request's pages", ATTN_ERR_VALUE, NULL, s.len[NREQ - 1], &opt);
    s.len[NREQ - 1] = keep;
    const int32_t e = s.table[(NREQ - 1) * s.maxp];
    s.table[(NREQ - 1) * s.maxp] = (int32_t)s.pages;
    refused(&s, "a table entry outside the pool, last request", ATTN_ERR_VALUE, NULL, s.max_k, &opt);
    s.table[(NREQ - 1) * s.maxp] = e;
    uint8_t m[4] = {1, 1, 1, 1};
    attn_tensor tm = attn_tensor_4d(m, ATTN_BOOL, 1, 1, 2, 2);
    opt.mask = &tm;
    refused(&s, "a mask not over the padded batch", ATTN_ERR_MASK, NULL, s.max_k, &opt);
    /* the backward of a paged call */
    opt = s.opt;
    opt.lse = NULL;
    const attn_status st = attn_varlen_backward(&s.tq, &s.tk, &s.tv, &s.to, &s.to, &s.tlse, &s.to,
                                                &s.tk, &s.tv, &s.tcu, &s.tcu, s.max_q, s.max_k, &opt);
    CHECK(st == ATTN_ERR_UNSUPPORTED, "the backward of a paged call: %s", attn_status_string(st));
    step_free(&s);
}

int main(void) {
    static const attn_dtype dts[] = {ATTN_F32, ATTN_BF16, ATTN_Q8_0};
    static const int64_t pages[] = {1, 16, 64};
    for (int d = 0; d < 3; d++)
        for (int p = 0; p < 3; p++) {
            if (test_case_skipped()) continue;
            check_step(dts[d], pages[p], false, false);
            check_step(dts[d], pages[p], false, true);
            check_step(dts[d], pages[p], true, false);
        }
    check_refusals();
    printf("(kernel %s)\n", attn_kernel_name());
    return check_summary("test_varlen_paged");
}
