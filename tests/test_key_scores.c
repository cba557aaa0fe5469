/*
 * test_key_scores.c — attn_forward's eviction scores (options.key_scores; docs/CONTRACT.md,
 * "Eviction scores"): key_scores[b, g, j] = the sum over the query rows and the query heads
 * of key/value head g of the softmax weights P_bhij.
 *
 * What it checks, per case (GQA groups of 1 and 4, decoding and prefill rows under
 * bottom-right causal, key lengths, a window, sinks, a bool mask; float32, bfloat16 and
 * q8_0 caches, contiguous and paged over shuffled pages):
 *  1. the scores against the column sums, in float64, of the float64 reference path's
 *     weights output for the same call, under the contract's float32 rule
 *     (tools/common/tolerance.h); a planted error (the sums without the group's last head)
 *     must fail that rule;
 *  2. the forward's own outputs (O, LSE) are those of the call without key_scores, bit for
 *     bit; the scores the same bits for 1 and 2 threads; the reference path's scores
 *     within the same rule;
 *  3. a key no row attends scores 0; Lq = 0 gives all zeros;
 *  4. refusals, nothing written: a wrong shape or dtype, scores overlapping o, a float64
 *     call, attn_backward and attn_varlen_forward given key_scores.
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

static rng_t g_rng = {4242};
static double unif(void) { return rng_unif(&g_rng); }

typedef struct ks_case {
    attn_dtype dt;
    int64_t B, Hq, Hkv, Lq, Lk, D, page;  /* page 0: contiguous */
    int opts;                             /* bit 0 lengths, 1 window, 2 sinks, 3 mask */
} ks_case;

typedef struct ks_call {
    float *kf, *vf, *q, *o, *o2, *lse, *lse2, *w, *ks, *ks2, *sinks;
    void *kd, *vd;
    int32_t *table;
    int32_t *len;
    uint8_t *mask;
    int64_t Lk_call, rows;
    attn_tensor tk, tv, tq, to, tlse, tw, tks, tt, tlen, tsinks, tmask;
    attn_options opt;
} ks_call;

static size_t bytes_of(attn_dtype dt, int64_t n) {
    return dt == ATTN_Q8_0 ? (size_t)(n / 32 * 34) : (size_t)n * attn_dtype_size(dt);
}

static void build(ks_call *c, const ks_case *k) {
    memset(c, 0, sizeof *c);
    const int64_t B = k->B, D = k->D;
    const int64_t maxp = k->page ? (k->Lk + k->page - 1) / k->page : 0;
    const int64_t pages = B * maxp + 1;
    c->Lk_call = k->page ? maxp * k->page : k->Lk;
    c->rows = k->page ? pages * k->page : B * k->Lk;  /* rows of one head's pool */
    const int64_t n = c->rows * k->Hkv * D;
    c->kf = xcalloc((size_t)n, 4), c->vf = xcalloc((size_t)n, 4);
    for (int64_t e = 0; e < n; e++) c->kf[e] = (float)rng_sym(&g_rng), c->vf[e] = (float)rng_sym(&g_rng);
    c->kd = xcalloc(bytes_of(k->dt, n), 1), c->vd = xcalloc(bytes_of(k->dt, n), 1);
    if (k->page) {
        c->tk = attn_tensor_4d(c->kd, k->dt, pages, k->Hkv, k->page, D);
        c->tv = attn_tensor_4d(c->vd, k->dt, pages, k->Hkv, k->page, D);
        int32_t *perm = shuffled_pages(pages, unif);
        c->table = xcalloc((size_t)(B * maxp), 4);
        for (int64_t e = 0; e < B * maxp; e++) c->table[e] = perm[e];
        free(perm);
        c->tt = attn_tensor_4d(c->table, ATTN_I32, B, maxp, 1, 1);
        c->opt.block_table = &c->tt;
    } else {
        c->tk = attn_tensor_4d(c->kd, k->dt, B, k->Hkv, k->Lk, D);
        c->tv = attn_tensor_4d(c->vd, k->dt, B, k->Hkv, k->Lk, D);
    }
    const attn_tensor fk = attn_tensor_4d(c->kf, ATTN_F32, 1, 1, n / D, D);
    const attn_tensor fv = attn_tensor_4d(c->vf, ATTN_F32, 1, 1, n / D, D);
    if (k->dt == ATTN_F32) {
        memcpy(c->kd, c->kf, (size_t)n * 4), memcpy(c->vd, c->vf, (size_t)n * 4);
    } else if (k->dt == ATTN_BF16) {
        for (int64_t e = 0; e < n; e++)
            ((uint16_t *)c->kd)[e] = attn_f32_to_bf16(c->kf[e]), ((uint16_t *)c->vd)[e] = attn_f32_to_bf16(c->vf[e]);
    } else {
        const attn_tensor qk = attn_tensor_4d(c->kd, ATTN_Q8_0, 1, 1, n / D, D);
        const attn_tensor qv = attn_tensor_4d(c->vd, ATTN_Q8_0, 1, 1, n / D, D);
        CHECK(attn_quantize_q8_0(&fk, &qk) == ATTN_OK && attn_quantize_q8_0(&fv, &qv) == ATTN_OK,
              "quantize: %s", attn_last_error());
    }
    const int64_t nq = B * k->Hq * k->Lq;
    c->q = xcalloc((size_t)(nq * D + 1), 4);
    for (int64_t e = 0; e < nq * D; e++) c->q[e] = (float)(2.0 * rng_sym(&g_rng));
    c->o = xcalloc((size_t)(nq * D + 1), 4), c->o2 = xcalloc((size_t)(nq * D + 1), 4);
    c->lse = xcalloc((size_t)nq + 1, 4), c->lse2 = xcalloc((size_t)nq + 1, 4);
    c->w = xcalloc((size_t)(nq * c->Lk_call + 1), 4);
    c->ks = xcalloc((size_t)(B * k->Hkv * c->Lk_call + 1), 4);
    c->ks2 = xcalloc((size_t)(B * k->Hkv * c->Lk_call + 1), 4);
    c->tq = attn_tensor_4d(c->q, ATTN_F32, B, k->Hq, k->Lq, D);
    c->to = attn_tensor_4d(c->o, ATTN_F32, B, k->Hq, k->Lq, D);
    c->tlse = attn_tensor_4d(c->lse, ATTN_F32, B, k->Hq, k->Lq, 1);
    c->tw = attn_tensor_4d(c->w, ATTN_F32, B, k->Hq, k->Lq, c->Lk_call);
    c->tks = attn_tensor_4d(c->ks, ATTN_F32, B, k->Hkv, c->Lk_call, 1);
    c->opt.causal = true, c->opt.align = ATTN_ALIGN_BOTTOM_RIGHT;
    c->len = xcalloc((size_t)B, 4);
    for (int64_t b = 0; b < B; b++)
        c->len[b] = (int32_t)((k->opts & 1) ? k->Lq + rng_int(&g_rng, k->Lk - k->Lq + 1) : k->Lk);
    c->tlen = attn_tensor_4d(c->len, ATTN_I32, B, 1, 1, 1);
    if ((k->opts & 1) || c->Lk_call != k->Lk) c->opt.kv_len = &c->tlen;
    if (k->opts & 2) c->opt.has_window = true, c->opt.window_left = 9, c->opt.window_right = 0;
    if (k->opts & 4) {
        c->sinks = xcalloc((size_t)k->Hq, 4);
        for (int64_t h = 0; h < k->Hq; h++) c->sinks[h] = (float)rng_sym(&g_rng);
        c->tsinks = attn_tensor_4d(c->sinks, ATTN_F32, k->Hq, 1, 1, 1);
        c->opt.sinks = &c->tsinks;
    }
    if (k->opts & 8) {  /* about a third of the keys dropped, per batch and row */
        c->mask = xcalloc((size_t)(B * k->Lq * c->Lk_call), 1);
        for (int64_t e = 0; e < B * k->Lq * c->Lk_call; e++) c->mask[e] = rng_unif(&g_rng) > 0.35;
        c->tmask = attn_tensor_4d(c->mask, ATTN_BOOL, B, 1, k->Lq, c->Lk_call);
        c->opt.mask = &c->tmask;
    }
}

static void release(ks_call *c) {
    free(c->kf), free(c->vf), free(c->kd), free(c->vd), free(c->q), free(c->o), free(c->o2);
    free(c->lse), free(c->lse2), free(c->w), free(c->ks), free(c->ks2), free(c->sinks);
    free(c->table), free(c->len), free(c->mask);
}

/* the float64 column sums of the reference path's weights, over rows and the group's
 * heads (heads_used of each group: the planted error leaves one out) */
static void want_scores(ks_call *c, const ks_case *k, int64_t heads_used, double *want) {
    attn_options ro = c->opt;
    ro.path = ATTN_PATH_REFERENCE;
    ro.weights = &c->tw;
    attn_tensor to = c->to;
    to.data = c->o2;
    CHECK(attn_forward(&c->tq, &c->tk, &c->tv, &to, &ro) == ATTN_OK, "reference weights: %s",
          attn_last_error());
    const int64_t group = k->Hq / k->Hkv, Lk = c->Lk_call;
    for (int64_t b = 0; b < k->B; b++)
        for (int64_t g = 0; g < k->Hkv; g++)
            for (int64_t j = 0; j < Lk; j++) {
                double s = 0;
                for (int64_t h = g * group; h < g * group + heads_used; h++)
                    for (int64_t i = 0; i < k->Lq; i++) s += c->w[((b * k->Hq + h) * k->Lq + i) * Lk + j];
                want[(b * k->Hkv + g) * Lk + j] = s;
            }
}

static int within(const float *got, const double *want, int64_t n, tol_result *r) {
    tol_acc a = tol_start();
    for (int64_t e = 0; e < n; e++) tol_add(&a, e, got[e], want[e]);
    return tol_pass(&a, r);
}

static void check_case(const ks_case *k) {
    char desc[128];
    snprintf(desc, sizeof desc, "%s B %lld Hq %lld Hkv %lld Lq %lld Lk %lld page %lld opts %d",
             attn_dtype_name(k->dt), (long long)k->B, (long long)k->Hq, (long long)k->Hkv,
             (long long)k->Lq, (long long)k->Lk, (long long)k->page, k->opts);
    ks_call c;
    build(&c, k);
    const int64_t nq = k->B * k->Hq * k->Lq, ns = k->B * k->Hkv * c.Lk_call;
    attn_options opt = c.opt;
    opt.lse = &c.tlse;
    opt.key_scores = &c.tks;
    opt.threads = 2;
    attn_status st = attn_forward(&c.tq, &c.tk, &c.tv, &c.to, &opt);
    CHECK(st == ATTN_OK, "%s: %s (%s)", desc, attn_status_string(st), attn_last_error());

    /* 2. O and LSE as without the scores; the scores' bits for 1 thread */
    attn_options plain = opt;
    plain.key_scores = NULL;
    attn_tensor to2 = c.to, tl2 = c.tlse;
    to2.data = c.o2, tl2.data = c.lse2;
    plain.lse = &tl2;
    st = attn_forward(&c.tq, &c.tk, &c.tv, &to2, &plain);
    CHECK(st == ATTN_OK && !memcmp(c.o, c.o2, (size_t)nq * k->D * 4) && !memcmp(c.lse, c.lse2, (size_t)nq * 4),
          "%s: O or LSE differ from the call without key_scores", desc);
    attn_tensor tks2 = c.tks;
    tks2.data = c.ks2;
    attn_options one = opt;
    one.threads = 1, one.key_scores = &tks2, one.lse = NULL;
    st = attn_forward(&c.tq, &c.tk, &c.tv, &to2, &one);
    CHECK(st == ATTN_OK && !memcmp(c.ks, c.ks2, (size_t)ns * 4), "%s: 1 and 2 threads differ", desc);

    /* 1. against the reference weights' column sums; the planted error fails */
    double *want = xcalloc((size_t)ns, 8);
    want_scores(&c, k, k->Hq / k->Hkv, want);
    tol_result r;
    CHECK(within(c.ks, want, ns, &r), "%s: scores max_err %.3g rel %.3g worst %lld", desc, r.max_err,
          r.rel_err, (long long)r.worst);
    attn_options ro = opt;
    ro.path = ATTN_PATH_REFERENCE, ro.key_scores = &tks2, ro.lse = NULL;
    st = attn_forward(&c.tq, &c.tk, &c.tv, &to2, &ro);
    CHECK(st == ATTN_OK && within(c.ks2, want, ns, &r), "%s: reference path's scores: %s max_err %.3g",
          desc, attn_status_string(st), r.max_err);
    /* 3. keys no row attends: 0 */
    int64_t unattended = 0, nonzero = 0;
    for (int64_t e = 0; e < ns; e++)
        if (want[e] == 0.0) unattended++, nonzero += c.ks[e] != 0.0f;
    CHECK(nonzero == 0, "%s: %lld of %lld keys no row attends score above 0", desc, (long long)nonzero,
          (long long)unattended);
    if (k->Hq / k->Hkv > 1) {
        want_scores(&c, k, k->Hq / k->Hkv - 1, want);
        CHECK(!within(c.ks, want, ns, &r), "%s: scores without one head passed", desc);
    }
    free(want);
    release(&c);
}

static void check_edges_and_refusals(void) {
    const ks_case k = {ATTN_F32, 2, 4, 2, 3, 40, 32, 0, 0};
    ks_call c;
    build(&c, &k);
    const int64_t ns = k.B * k.Hkv * k.Lk, no = k.B * k.Hq * k.Lq * k.D;
    /* Lq = 0: all zeros */
    attn_tensor tq0 = c.tq, to0 = c.to;
    tq0.shape[2] = to0.shape[2] = 0;
    attn_options opt = c.opt;
    opt.key_scores = &c.tks;
    fill_sentinel(c.ks, ns);
    attn_status st = attn_forward(&tq0, &c.tk, &c.tv, &to0, &opt);
    int64_t zeros = 0;
    for (int64_t e = 0; e < ns; e++) zeros += c.ks[e] == 0.0f;
    CHECK(st == ATTN_OK && zeros == ns, "Lq = 0: %s, %lld of %lld zeros", attn_status_string(st),
          (long long)zeros, (long long)ns);

    /* refusals: nothing written */
#define REFUSED(what, want, q_, o_, opt_)                                                     \
    do {                                                                                      \
        fill_sentinel(c.o, no);                                                               \
        fill_sentinel(c.ks, ns);                                                              \
        const attn_status s_ = attn_forward(q_, &c.tk, &c.tv, o_, opt_);                      \
        CHECK(s_ == (want), "%s: %s, expected %s (%s)", what, attn_status_string(s_),         \
              attn_status_string(want), attn_last_error());                                   \
        CHECK(count_written(c.o, no) == 0 && count_written(c.ks, ns) == 0,                    \
              "%s: something was written", what);                                             \
    } while (0)
    attn_tensor bad = c.tks;
    bad.shape[1] = k.Hq;
    opt.key_scores = &bad;
    REFUSED("scores of Hq heads", ATTN_ERR_SHAPE, &c.tq, &c.to, &opt);
    bad = c.tks;
    bad.dtype = ATTN_BF16;
    REFUSED("bfloat16 scores", ATTN_ERR_DTYPE, &c.tq, &c.to, &opt);
    bad = c.tks;
    bad.data = c.o;  /* the scores over o */
    opt.key_scores = &bad;
    {
        fill_sentinel(c.o, no);
        const attn_status s_ = attn_forward(&c.tq, &c.tk, &c.tv, &c.to, &opt);
        CHECK(s_ == ATTN_ERR_STRIDE, "scores over o: %s", attn_status_string(s_));
        CHECK(count_written(c.o, no) == 0, "scores over o: written");
    }
    opt.key_scores = &c.tks;
    double q64[4 * 32], k64[40 * 32], o64[4 * 32];
    memset(q64, 0, sizeof q64), memset(k64, 0, sizeof k64);
    attn_tensor tq64 = attn_tensor_4d(q64, ATTN_F64, 1, 2, 2, 32), tk64 = attn_tensor_4d(k64, ATTN_F64, 1, 2, 20, 32);
    attn_tensor to64 = attn_tensor_4d(o64, ATTN_F64, 1, 2, 2, 32);
    attn_tensor ks64 = attn_tensor_4d(c.ks, ATTN_F32, 1, 2, 20, 1);
    attn_options o64opt = {.key_scores = &ks64};
    st = attn_forward(&tq64, &tk64, &tk64, &to64, &o64opt);
    CHECK(st == ATTN_ERR_UNSUPPORTED, "float64 with key_scores: %s", attn_status_string(st));
    /* other calls refuse it */
    attn_options bo = c.opt;
    bo.key_scores = &c.tks;
    st = attn_backward(&c.tq, &c.tk, &c.tv, &c.to, &c.to, &c.tlse, &c.tq, &c.tk, &c.tv, &bo);
    CHECK(st == ATTN_ERR_UNSUPPORTED, "attn_backward with key_scores: %s", attn_status_string(st));
    int32_t cu[2] = {0, (int32_t)k.Lq}, cuk[2] = {0, (int32_t)k.Lk};
    attn_tensor tcu = attn_tensor_4d(cu, ATTN_I32, 2, 1, 1, 1), tcuk = attn_tensor_4d(cuk, ATTN_I32, 2, 1, 1, 1);
    attn_tensor vq = c.tq, vo = c.to, vk = c.tk, vv = c.tv;
    vq.shape[0] = vo.shape[0] = vk.shape[0] = vv.shape[0] = 1;
    attn_options vo_opt = {.key_scores = &c.tks};
    st = attn_varlen_forward(&vq, &vk, &vv, &vo, &tcu, &tcuk, k.Lq, k.Lk, &vo_opt);
    CHECK(st == ATTN_ERR_UNSUPPORTED, "attn_varlen_forward with key_scores: %s", attn_status_string(st));
    /* the calls built on attn_forward refuse it before anything is written: Luong's
     * general form (its inner attn_forward would otherwise take it) */
    float wl[32 * 32] = {0};
    fill_sentinel(c.o, no);
    attn_options lo = {.key_scores = &c.tks};
    st = attn_luong_general_forward(&c.tq, &c.tk, &c.tv, wl, &c.to, &lo);
    CHECK(st == ATTN_ERR_UNSUPPORTED && count_written(c.o, no) == 0,
          "attn_luong_general_forward with key_scores: %s", attn_status_string(st));
#undef REFUSED
    release(&c);
}

int main(void) {
    static const ks_case cases[] = {
        /* dt        B  Hq Hkv Lq  Lk   D  page opts */
        {ATTN_F32, 2, 8, 2, 1, 300, 64, 0, 1},
        {ATTN_F32, 2, 8, 2, 1, 300, 64, 16, 1},
        {ATTN_F32, 1, 4, 4, 23, 90, 32, 0, 2 | 8},
        {ATTN_F32, 2, 8, 2, 5, 130, 64, 1, 1 | 4},
        {ATTN_BF16, 2, 8, 2, 1, 257, 64, 64, 1},
        {ATTN_BF16, 1, 8, 1, 7, 100, 64, 0, 8},
        {ATTN_Q8_0, 2, 8, 2, 1, 200, 64, 16, 1},
        {ATTN_Q8_0, 1, 4, 2, 9, 96, 32, 0, 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (test_case_skipped()) continue;
        check_case(&cases[i]);
    }
    check_edges_and_refusals();
    printf("(kernel %s)\n", attn_kernel_name());
    return check_summary("test_key_scores");
}
