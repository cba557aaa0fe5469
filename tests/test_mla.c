/*
 * test_mla.c — latent attention (MLA, as DeepSeek-V2/V3 serve it) through attn_forward:
 * one latent cache row per token, c_kv [Dl] then the shared rotary key k_rope [Dr], read
 * as K = [c_kv, k_rope] (Dk = Dl + Dr) and V = c_kv (Dv = Dl) from the same memory, by
 * two views of one buffer (docs/CONTRACT.md, "Latent attention (MLA)"), many query heads
 * on one latent head, contiguous or paged.
 *
 * What it checks, per case (shapes from 16 to 128 heads, Dl + Dr up to 512 + 64, page
 * sizes 1 to 64, decoding and chunked prefill under bottom-right causal, per-sequence
 * cache lengths):
 *  1. the call over the shared views is bit for bit the call over K and V copied out
 *     into separate dense tensors (the views change what is read, not the arithmetic);
 *  2. O and LSE against the suite's float64 oracle (oracle.h) over the copies, within the
 *     float32 bounds of check.h; a planted error (V shifted by one column: V = c_kv[1..])
 *     must fail that same bound;
 *  3. the same bits for 1 and 2 threads; a bfloat16 latent cache likewise bit for bit its
 *     copies.
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

typedef struct mla_case {
    int64_t B, Hq, Dl, Dr, Lk, Lq, page;  /* page 0: a contiguous cache */
    bool lens;                            /* per-sequence cache lengths (kv_len) */
} mla_case;

static rng_t g_rng = {20261203};
static double unif(void) { return rng_unif(&g_rng); }

/* The latent rows of one case: pool [P, 1, page, Dk] (P pages) or [B, 1, Lk, Dk], with
 * K and V views over it, and the copies [B, 1, Lk, Dk], [B, 1, Lk, Dv] in logical order. */
typedef struct mla_call {
    float *pool, *kc, *vc, *q, *o, *o2, *lse, *lse2;
    uint16_t *pool16, *kc16, *vc16;
    int32_t *table;
    int64_t *len;
    attn_tensor k, v, k16, v16, kx, vx, kx16, vx16, tq, to, to2, tlse, tlse2, tt, tlen;
    attn_options opt;
    int64_t rows;  /* rows of the pool */
} mla_call;

static const float *latent_row(const mla_call *m, const mla_case *c, int64_t b, int64_t j) {
    const int64_t Dk = c->Dl + c->Dr;
    if (!c->page) return m->pool + (b * c->Lk + j) * Dk;
    const int64_t maxp = (c->Lk + c->page - 1) / c->page;
    return m->pool + ((int64_t)m->table[b * maxp + j / c->page] * c->page + j % c->page) * Dk;
}

static void mla_build(mla_call *m, const mla_case *c) {
    memset(m, 0, sizeof *m);
    const int64_t B = c->B, Dk = c->Dl + c->Dr, Dv = c->Dl, Lk = c->Lk;
    const int64_t maxp = c->page ? (Lk + c->page - 1) / c->page : 0;
    const int64_t pages = B * maxp + 3;  /* a few pages no sequence maps */
    m->rows = c->page ? pages * c->page : B * Lk;
    m->pool = xcalloc((size_t)(m->rows * Dk), sizeof(float));
    m->pool16 = xcalloc((size_t)(m->rows * Dk), sizeof(uint16_t));
    for (int64_t e = 0; e < m->rows * Dk; e++) {
        m->pool16[e] = attn_f32_to_bf16((float)rng_sym(&g_rng));
        m->pool[e] = attn_bf16_to_f32(m->pool16[e]);  /* the same values in both caches */
    }
    if (c->page) {
        int32_t *perm = shuffled_pages(pages, unif);
        m->table = xcalloc((size_t)(B * maxp), sizeof(int32_t));
        for (int64_t e = 0; e < B * maxp; e++) m->table[e] = perm[e];
        free(perm);
        m->tt = (attn_tensor){m->table, ATTN_I32, {B, maxp, 1, 1}, {maxp, 1, 0, 0}};
        m->opt.block_table = &m->tt;
        m->k = (attn_tensor){m->pool, ATTN_F32, {pages, 1, c->page, Dk}, {c->page * Dk, c->page * Dk, Dk, 1}};
    } else {
        m->k = attn_tensor_4d(m->pool, ATTN_F32, B, 1, Lk, Dk);
    }
    m->v = m->k;
    m->v.shape[3] = Dv;  /* V = c_kv: the first Dl columns of the same rows */
    m->k16 = m->k, m->k16.data = m->pool16, m->k16.dtype = ATTN_BF16;
    m->v16 = m->v, m->v16.data = m->pool16, m->v16.dtype = ATTN_BF16;

    const int64_t Lk_call = c->page ? maxp * c->page : Lk;  /* the call's Lk */
    m->len = xcalloc((size_t)B, sizeof(int64_t));
    for (int64_t b = 0; b < B; b++)
        m->len[b] = c->lens ? c->Lq + rng_int(&g_rng, Lk - c->Lq + 1) : Lk;
    m->tlen = (attn_tensor){m->len, ATTN_I64, {B, 1, 1, 1}, {1, 0, 0, 0}};
    if (c->lens || Lk_call != Lk) m->opt.kv_len = &m->tlen;

    /* the copies, in logical order, Lk_call rows (rows past the pages' end: 0) */
    m->kc = xcalloc((size_t)(B * Lk_call * Dk), sizeof(float));
    m->vc = xcalloc((size_t)(B * Lk_call * Dv), sizeof(float));
    m->kc16 = xcalloc((size_t)(B * Lk_call * Dk), sizeof(uint16_t));
    m->vc16 = xcalloc((size_t)(B * Lk_call * Dv), sizeof(uint16_t));
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < Lk; j++) {
            const float *row = latent_row(m, c, b, j);
            for (int64_t d = 0; d < Dk; d++) {
                m->kc[(b * Lk_call + j) * Dk + d] = row[d];
                m->kc16[(b * Lk_call + j) * Dk + d] = attn_f32_to_bf16(row[d]);
            }
            for (int64_t d = 0; d < Dv; d++) {
                m->vc[(b * Lk_call + j) * Dv + d] = row[d];
                m->vc16[(b * Lk_call + j) * Dv + d] = attn_f32_to_bf16(row[d]);
            }
        }
    m->kx = attn_tensor_4d(m->kc, ATTN_F32, B, 1, Lk_call, Dk);
    m->vx = attn_tensor_4d(m->vc, ATTN_F32, B, 1, Lk_call, Dv);
    m->kx16 = attn_tensor_4d(m->kc16, ATTN_BF16, B, 1, Lk_call, Dk);
    m->vx16 = attn_tensor_4d(m->vc16, ATTN_BF16, B, 1, Lk_call, Dv);

    const int64_t nq = B * c->Hq * c->Lq;
    m->q = xcalloc((size_t)(nq * Dk), sizeof(float));
    for (int64_t e = 0; e < nq * Dk; e++) m->q[e] = (float)rng_sym(&g_rng);
    m->o = xcalloc((size_t)(nq * Dv), sizeof(float));
    m->o2 = xcalloc((size_t)(nq * Dv), sizeof(float));
    m->lse = xcalloc((size_t)nq, sizeof(float));
    m->lse2 = xcalloc((size_t)nq, sizeof(float));
    m->tq = attn_tensor_4d(m->q, ATTN_F32, B, c->Hq, c->Lq, Dk);
    m->to = attn_tensor_4d(m->o, ATTN_F32, B, c->Hq, c->Lq, Dv);
    m->to2 = attn_tensor_4d(m->o2, ATTN_F32, B, c->Hq, c->Lq, Dv);
    m->tlse = attn_tensor_4d(m->lse, ATTN_F32, B, c->Hq, c->Lq, 1);
    m->tlse2 = attn_tensor_4d(m->lse2, ATTN_F32, B, c->Hq, c->Lq, 1);
    m->opt.causal = c->Lq > 1;
    m->opt.align = ATTN_ALIGN_BOTTOM_RIGHT;
}

static void mla_free(mla_call *m) {
    free(m->pool), free(m->pool16), free(m->kc), free(m->vc), free(m->kc16), free(m->vc16);
    free(m->q), free(m->o), free(m->o2), free(m->lse), free(m->lse2), free(m->table), free(m->len);
}

static int same_bits(const float *a, const float *b, int64_t n) {
    return memcmp(a, b, (size_t)n * sizeof(float)) == 0;
}

/* O and LSE of one call: k, v views (shared or copies), threads, table or not */
static attn_status run(mla_call *m, const attn_tensor *k, const attn_tensor *v, bool paged,
                       int threads, float *o, float *lse) {
    attn_options opt = m->opt;
    if (!paged) opt.block_table = NULL;
    opt.threads = threads;
    attn_tensor to = m->to, tl = m->tlse;
    to.data = o, tl.data = lse;
    opt.lse = &tl;
    return attn_forward(&m->tq, k, v, &to, &opt);
}

static void check_case(const mla_case *c) {
    char desc[160];
    snprintf(desc, sizeof desc, "B %lld Hq %lld Dl %lld Dr %lld Lk %lld Lq %lld page %lld%s",
             (long long)c->B, (long long)c->Hq, (long long)c->Dl, (long long)c->Dr,
             (long long)c->Lk, (long long)c->Lq, (long long)c->page, c->lens ? " lens" : "");
    mla_call m;
    mla_build(&m, c);
    const int64_t no = c->B * c->Hq * c->Lq * c->Dl, nl = c->B * c->Hq * c->Lq;
    const bool paged = c->page > 0;

    /* 1. shared views = copies, bit for bit */
    attn_status st = run(&m, &m.k, &m.v, paged, 2, m.o, m.lse);
    CHECK(st == ATTN_OK, "%s: %s (%s)", desc, attn_status_string(st), attn_last_error());
    st = run(&m, &m.kx, &m.vx, false, 2, m.o2, m.lse2);
    CHECK(st == ATTN_OK, "%s: copies: %s (%s)", desc, attn_status_string(st), attn_last_error());
    if (!paged) {  /* a paged tile may split at a page end where the copy's does not */
        CHECK(same_bits(m.o, m.o2, no), "%s: O over the shared views differs from the copies'", desc);
        CHECK(same_bits(m.lse, m.lse2, nl), "%s: LSE over the shared views differs", desc);
    }

    /* 2. against the float64 oracle over the copies */
    attn_options oo = m.opt;
    oo.block_table = NULL;
    double *o_ref = xcalloc((size_t)no, sizeof(double)), *l_ref = xcalloc((size_t)nl, sizeof(double));
    oracle_forward(&m.tq, &m.kx, &m.vx, &oo, o_ref, l_ref, NULL);
    tol_result r;
    CHECK(within_f32_tol(m.o, o_ref, no, &r), "%s: O max_err %.3g rel %.3g worst %lld", desc,
          r.max_err, r.rel_err, (long long)r.worst);
    double *mag = xcalloc((size_t)nl, sizeof(double));
    oracle_logit_mag(&m.tq, &m.kx, &oo, mag);
    CHECK(within_lse_tol(m.lse, l_ref, mag, nl, c->Dl + c->Dr, m.kx.shape[2], &r),
          "%s: LSE max_err %.3g (%.3g of the bound)", desc, r.max_err, r.rel_err);
    /* the planted error: V read one column on (c_kv[1..Dl], k_rope's first) */
    attn_tensor vbad = m.v;
    vbad.data = m.pool + 1;
    st = run(&m, &m.k, &vbad, paged, 2, m.o2, m.lse2);
    CHECK(st == ATTN_OK && !within_f32_tol(m.o2, o_ref, no, &r),
          "%s: V shifted by one column passed the bound", desc);

    /* 3. one thread: the same bits; a bfloat16 latent cache = its copies */
    st = run(&m, &m.k, &m.v, paged, 1, m.o2, m.lse2);
    CHECK(st == ATTN_OK && same_bits(m.o, m.o2, no) && same_bits(m.lse, m.lse2, nl),
          "%s: 1 and 2 threads differ", desc);
    if (!paged) {
        st = run(&m, &m.k16, &m.v16, false, 2, m.o, m.lse);
        attn_status st2 = run(&m, &m.kx16, &m.vx16, false, 2, m.o2, m.lse2);
        CHECK(st == ATTN_OK && st2 == ATTN_OK && same_bits(m.o, m.o2, no),
              "%s: bfloat16 shared views differ from the copies", desc);
    } else {  /* the paged bfloat16 cache against its float32 twin: same values, same bound */
        st = run(&m, &m.k16, &m.v16, true, 2, m.o2, m.lse2);
        CHECK(st == ATTN_OK && within_f32_tol(m.o2, o_ref, no, &r),
              "%s: bfloat16 paged: %s, max_err %.3g", desc, attn_status_string(st), r.max_err);
    }
    free(o_ref), free(l_ref), free(mag);
    mla_free(&m);
}

int main(void) {
    static const mla_case cases[] = {
        /* B  Hq  Dl   Dr  Lk   Lq page lens */
        {2, 16, 64, 16, 300, 1, 0, false},
        {2, 16, 64, 16, 300, 1, 16, true},
        {2, 128, 64, 16, 200, 1, 64, true},
        {3, 32, 64, 16, 257, 5, 1, true},
        {1, 8, 512, 64, 100, 4, 16, false},
        {1, 16, 512, 64, 130, 1, 0, false},
        {2, 128, 128, 32, 96, 2, 32, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (test_case_skipped()) continue;
        check_case(&cases[i]);
    }
    printf("(kernel %s)\n", attn_kernel_name());
    return check_summary("test_mla");
}
