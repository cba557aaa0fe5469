/*
 * fused_f64.c — the fused forward pass for float64 q, k, v and o: FlashAttention-2's
 *               streaming algorithm in portable C, accumulated in float64 throughout.
 *
 * A work item is a block of up to BQ query rows of one (batch, query head). The block
 * walks the union of its rows' structural key ranges (key length, causal band, window)
 * in tiles of BK keys. Per tile it copies K transposed and V into dense scratch, forms
 * the rows' logits in float64 — the dot products of the tile as one product (gemm_f64.h:
 * blocked, each summed over d in order 0 .. Dk-1), times the scale, then ai_ref_finish
 * (softcap, bias, ALiBi, bool mask): the reference's own logit, bit for bit — and updates
 * each row's running max m, running sum l and unnormalized accumulator, rescaled by
 * exp(m_old - m_new) when the max grows, the tile's P·V added as one product. A row is
 * finished with one division. Keys outside a row's range are -inf and never multiply V;
 * a probability of exactly 0 never multiplies V either, so a masked key's NaN cannot
 * leak (as in reference.c). A NaN logit poisons its row, a fully masked row gives O = 0
 * and LSE = -inf, as the contract says.
 *
 * Masks by their structure (mask_summary.h, summarized once per call as the float32 path
 * does): each row's key range is narrowed to the hulls of its mask's and bias's kept keys;
 * a tile the mask or the bias masks whole for the rows' summary block is skipped (it would
 * add exp(-inf) = 0); a row whose hull is all open, and a tile whose cells are all open,
 * take the logits without the mask and the bias (no per-logit test: an open cell changes
 * nothing). A kept key is never skipped, so the answer is the per-logit one.
 *
 * Extra memory: the workspace, BQ·Dk + BK·(Dk + Dv) + BQ·BK + BQ·Dv + 2·BQ doubles per
 * thread, and with a mask or bias its summary (1/1024 of the mask): independent of Lk but
 * for that summary. Each row is computed by one thread in a fixed order, so results are
 * bit-identical for any thread count. The weights, when asked for, are a second sweep
 * over the same tiles with the final (m, l).
 */
#include <math.h>
#include <string.h>

#include "core/attn_internal.h"
#include "core/gemm_f64.h"
#include "core/half.h"
#include "mask_summary.h"
#include "core/team.h"

enum { BQ = 16, BK = 64 };

/* Doubles of one thread's slice, and its layout. */
typedef struct f64_plan {
    int64_t q_blocks, items;
    int64_t off_q, off_kt, off_v, off_s, off_acc, off_m, off_l, per_thread;
    int64_t total;  // doubles of the call: the threads' slices, then the mask summary
} f64_plan;

/* What every work item reads: the params, the mask summary (NULL without mask and bias)
 * and the params without mask and bias for the rows and tiles they leave open. */
typedef struct f64_call {
    const attn_params *p, *open;
    const attn_mask_summary *sum;
} f64_call;

static bool make_plan(const attn_params *p, f64_plan *pl) {
    *pl = (f64_plan){0};
    pl->q_blocks = (p->Lq + BQ - 1) / BQ;
    if (__builtin_mul_overflow(p->B * p->Hq, pl->q_blocks, &pl->items)) return false;
    int64_t n = 0, t;
#define CARVE(off, count)                                                              \
    do {                                                                               \
        pl->off = n;                                                                   \
        if (__builtin_mul_overflow((int64_t)1, (count), &t) ||                         \
            __builtin_add_overflow(n, (t + 7) & ~(int64_t)7, &n))                      \
            return false;                                                              \
    } while (0)
    int64_t qd, kd, vd, ad;
    if (__builtin_mul_overflow((int64_t)BQ, p->Dk, &qd) ||
        __builtin_mul_overflow((int64_t)BK, p->Dk, &kd) ||
        __builtin_mul_overflow((int64_t)BK, p->Dv, &vd) ||
        __builtin_mul_overflow((int64_t)BQ, p->Dv, &ad) || qd > INT64_MAX / 16 ||
        kd > INT64_MAX / 16 || vd > INT64_MAX / 16 || ad > INT64_MAX / 16)
        return false;
    CARVE(off_q, qd);
    CARVE(off_kt, kd);
    CARVE(off_v, vd);
    CARVE(off_s, (int64_t)BQ * BK);
    CARVE(off_acc, ad);
    CARVE(off_m, (int64_t)BQ);
    CARVE(off_l, (int64_t)BQ);
#undef CARVE
    pl->per_thread = n;
    const size_t sum_bytes = ai_mask_summary_bytes(p);
    if (__builtin_mul_overflow(pl->per_thread, (int64_t)p->threads, &t) ||
        sum_bytes == (size_t)-1 || sum_bytes / 8 > (size_t)INT64_MAX / 2 ||
        __builtin_add_overflow(t, (int64_t)(sum_bytes / 8) + (sum_bytes ? 8 : 0), &t) ||  // + 8: to align
        (uint64_t)t > SIZE_MAX / sizeof(double))
        return false;
    pl->total = t;
    return true;
}

size_t ai_fused_f64_workspace(const attn_params *p) {
    f64_plan pl;
    if (!make_plan(p, &pl)) return (size_t)-1;
    return (size_t)pl.total * sizeof(double);
}

/* The tile's keys j0 .. j0+nk-1 of key/value head (b, g): K transposed, kt[d * BK + c],
 * and V, v[c * Dv + d], as dense doubles. */
static void load_tile(const attn_params *p, int64_t k_bg, int64_t v_bg, int64_t j0, int64_t nk,
                      double *kt, double *v) {
    const double *K = p->k, *V = p->v;
    for (int64_t c = 0; c < nk; c++) {
        const double *k_j = K + k_bg + (j0 + c) * p->k_s[2];
        for (int64_t d = 0; d < p->Dk; d++) kt[d * BK + c] = k_j[d * p->k_s[3]];
        const double *v_j = V + v_bg + (j0 + c) * p->v_s[2];
        for (int64_t d = 0; d < p->Dv; d++) v[c * p->Dv + d] = v_j[d * p->v_s[3]];
    }
}

/* The dot products q_r · k_c of the tile's nq rows and nk keys into s (row r at s + r BK),
 * each over d in order as reference.c's ref_logit (gemm_f64.h: blocking changes no bit). */
static void tile_dots(const attn_params *p, const double *q, const double *kt, int64_t nq,
                      int64_t nk, double *s) {
    ai_gemm_f64(nq, nk, p->Dk, q, p->Dk, 1, kt, BK, s, BK, false, false);
}

/* Row r's final logits over the tile from its dot products s_r (in place, nk of them):
 * -inf outside [lo, hi), else scale * dot then ai_ref_finish: reference.c's logit. */
static void tile_logits(const attn_params *p, int64_t j0, int64_t nk, int64_t lo, int64_t hi,
                        int64_t b, int64_t h, int64_t i, int64_t d_i, double *s_r) {
    const double scale = p->scale64;
    const bool elementwise = attn_has_elementwise(p);
    if (!elementwise && lo <= j0 && j0 + nk <= hi) {  // every key in range, nothing to add
#pragma omp simd
        for (int64_t c = 0; c < nk; c++) s_r[c] *= scale;
        return;
    }
    if (p->mask && !p->bias && !p->alibi && !(p->softcap > 0.0f) &&
        !p->block && !p->score_mod) {
        /* a bool mask alone: ai_ref_finish keeps the logit or makes it -inf, here by
         * the byte read in line */
        const uint8_t *m_i = p->mask + b * p->mask_s[0] + h * p->mask_s[1] + i * p->mask_s[2];
        for (int64_t c = 0; c < nk; c++) {
            const int64_t j = j0 + c;
            s_r[c] = j < lo || j >= hi || !m_i[j * p->mask_s[3]] ? -INFINITY : scale * s_r[c];
        }
        return;
    }
    for (int64_t c = 0; c < nk; c++) {
        const int64_t j = j0 + c;
        if (j < lo || j >= hi) {
            s_r[c] = -INFINITY;
            continue;
        }
        const double raw = scale * s_r[c];
        s_r[c] = elementwise ? ai_ref_finish(p, raw, b, h, i, j, d_i, NULL) : raw;
    }
}

/* The params row r of the tile computes with: p where the mask or bias is mixed in the
 * tile, the open params where they leave the row or the tile open. */
static const attn_params *row_params(const f64_call *x, bool dense, attn_tile_class cls) {
    return x->sum && (dense || cls == ATTN_TILE_OPEN) ? x->open : x->p;
}

/* The tile's class for the block of rows from i0 (BQ divides ATTN_SUM_ROWS: one summary
 * block holds the tile's rows); MIXED without a summary. */
static attn_tile_class tile_class(const f64_call *x, int64_t b, int64_t h, int64_t i0,
                                  int64_t j0, int64_t nk) {
    return x->sum ? ai_mask_summary_tile(x->p, x->sum, b, h, 1, i0 / ATTN_SUM_ROWS, j0, nk)
                  : ATTN_TILE_MIXED;
}

/* One item's rows: where they are, their structural ranges, their running max, sum and
 * accumulator (in the thread's workspace w). */
typedef struct f64_item {
    int64_t b, h, i0, nq, lk_b, k_bg, v_bg;
    int64_t blo, bhi;  // the union of the rows' ranges
    int64_t lo[BQ], hi[BQ], dg[BQ];
    bool dense[BQ];    // the row's kept keys, after the summary's hulls, are all open
    double *q, *kt, *v, *s, *acc, *m, *l;
} f64_item;

static void item_open(const f64_call *x, const f64_plan *pl, double *w, int64_t item, f64_item *it) {
    const attn_params *p = x->p;
    const int64_t bh = item / pl->q_blocks, qb = item % pl->q_blocks;
    const int64_t b = bh / p->Hq, h = bh % p->Hq, g = h / p->group;
    it->b = b, it->h = h, it->i0 = qb * BQ;
    it->nq = p->Lq - it->i0 < BQ ? p->Lq - it->i0 : BQ;
    it->lk_b = attn_key_len(p, b);
    it->q = w + pl->off_q, it->kt = w + pl->off_kt, it->v = w + pl->off_v, it->s = w + pl->off_s;
    it->acc = w + pl->off_acc, it->m = w + pl->off_m, it->l = w + pl->off_l;
    it->k_bg = b * p->k_s[0] + g * p->k_s[1], it->v_bg = b * p->v_s[0] + g * p->v_s[1];
    const double *Q = p->q;
    const int64_t q_bh = b * p->q_s[0] + h * p->q_s[1], Dk = p->Dk, Dv = p->Dv;
    it->blo = it->lk_b, it->bhi = 0;
    for (int64_t r = 0; r < it->nq; r++) {
        const int64_t i = it->i0 + r;
        attn_row_range(p, it->lk_b, i, &it->lo[r], &it->hi[r]);
        /* keys outside the hulls of the row's mask and bias are masked: by structure now */
        it->dense[r] = x->sum && ai_mask_summary_row(p, x->sum, b, h, i, &it->lo[r], &it->hi[r]);
        it->dg[r] = attn_diagonal(p, it->lk_b, i);
        if (it->lo[r] < it->hi[r]) {
            if (it->lo[r] < it->blo) it->blo = it->lo[r];
            if (it->hi[r] > it->bhi) it->bhi = it->hi[r];
        }
        for (int64_t d = 0; d < Dk; d++) it->q[r * Dk + d] = Q[q_bh + i * p->q_s[2] + d * p->q_s[3]];
        for (int64_t d = 0; d < Dv; d++) it->acc[r * Dv + d] = 0.0;
        it->m[r] = -INFINITY;
        it->l[r] = 0.0;
    }
}

/* The online softmax over one tile's dots (it->s): each row's final logits, its max and
 * sum updated (the accumulator rescaled where the max grew), s replaced by the weights
 * e = exp(s - m) that multiply V (0 for a row with no key here). */
static void item_tile_softmax(const f64_call *x, f64_item *it, int64_t j0, int64_t nk,
                              attn_tile_class cls) {
    const int64_t Dv = x->p->Dv;
    for (int64_t r = 0; r < it->nq; r++) {
        double *s_r = it->s + r * BK, *acc_r = it->acc + r * Dv;
        if (it->lo[r] >= it->hi[r] || it->hi[r] <= j0 || it->lo[r] >= j0 + nk) {  // no key here
            for (int64_t c = 0; c < nk; c++) s_r[c] = 0.0;  // weights of 0 for the product
            continue;
        }
        tile_logits(row_params(x, it->dense[r], cls), j0, nk, it->lo[r], it->hi[r], it->b, it->h,
                    it->i0 + r, it->dg[r], s_r);
        double mt = -INFINITY;
        for (int64_t c = 0; c < nk; c++)
            if (isnan(s_r[c]) || s_r[c] > mt) mt = s_r[c];  // NaN sticks
        if (mt == -INFINITY) {  // every key masked
            for (int64_t c = 0; c < nk; c++) s_r[c] = 0.0;
            continue;
        }
        const double m_old = it->m[r];
        const double m_new = isnan(m_old) || isnan(mt) ? NAN : (mt > m_old ? mt : m_old);
        if (!(m_new == m_old)) {  // the max grew (or turned NaN): rescale
            const double alpha = m_old == -INFINITY ? 0.0 : exp(m_old - m_new);
            it->l[r] *= alpha;
            for (int64_t d = 0; d < Dv; d++) acc_r[d] *= alpha;
            it->m[r] = m_new;
        }
        for (int64_t c = 0; c < nk; c++) {
            const double e = exp(s_r[c] - m_new);  // exp(-inf - m) = 0 for masked keys
            it->l[r] += e;
            s_r[c] = e;
        }
    }
}

/* The head's sink (CONTRACT "Attention sinks"): one more term of the denominator with no
 * value, folded into each row's final (m, l, acc) as merge.c's ai_merge_sink does in
 * float32 (a fully masked row then has m = sink, l = 1, acc = 0); then O and the LSE. */
static void item_close(const f64_call *x, f64_item *it) {
    const attn_params *p = x->p;
    const int64_t Dv = p->Dv, b = it->b, h = it->h;
    double *m = it->m, *l = it->l, *acc = it->acc;
    const double sink = attn_sink(p, h);
    for (int64_t r = 0; sink != -INFINITY && r < it->nq; r++) {
        const double m0 = m[r];
        const double M = isnan(m0) || isnan(sink) ? NAN : m0 > sink ? m0 : sink;
        const double alpha = m0 == -INFINITY ? 0.0 : exp(m0 - M);
        l[r] = l[r] * alpha + exp(sink - M);
        for (int64_t d = 0; d < Dv; d++) acc[r * Dv + d] *= alpha;
        m[r] = M;
    }
    double *O = p->o;
    for (int64_t r = 0; r < it->nq; r++) {
        const int64_t i = it->i0 + r;
        const bool masked_row = m[r] == -INFINITY;
        const int64_t o_bhi = b * p->o_s[0] + h * p->o_s[1] + i * p->o_s[2];
        for (int64_t d = 0; d < Dv; d++)
            O[o_bhi + d * p->o_s[3]] = masked_row ? 0.0 : acc[r * Dv + d] / l[r];
        if (p->lse || p->lse64) {
            const double lse = masked_row ? -INFINITY : m[r] + log(l[r]);
            const int64_t at = b * p->lse_s[0] + h * p->lse_s[1] + i * p->lse_s[2];
            if (p->lse64)
                p->lse64[at] = lse;
            else
                p->lse[at] = (float)lse;
        }
    }
}

/* The weights: every key of every row written, 0 outside its range and for a fully masked
 * row; inside, exp(s - m) / l with the final m and l (reference.c's formula). */
static void item_weights(const f64_call *x, f64_item *it) {
    const attn_params *p = x->p;
    const int64_t b = it->b, h = it->h;
    for (int64_t r = 0; r < it->nq; r++) {
        float *w_r = p->weights + b * p->w_s[0] + h * p->w_s[1] + (it->i0 + r) * p->w_s[2];
        for (int64_t j = 0; j < p->Lk; j++) w_r[j * p->w_s[3]] = 0.0f;
    }
    for (int64_t j0 = it->blo; j0 < it->bhi; j0 += BK) {
        const int64_t nk = it->bhi - j0 < BK ? it->bhi - j0 : BK;
        const attn_tile_class cls = tile_class(x, b, h, it->i0, j0, nk);
        if (cls == ATTN_TILE_MASKED) continue;  // its weights are the 0 written above
        load_tile(p, it->k_bg, it->v_bg, j0, nk, it->kt, it->v);
        tile_dots(p, it->q, it->kt, it->nq, nk, it->s);
        for (int64_t r = 0; r < it->nq; r++) {
            if (it->m[r] == -INFINITY || it->lo[r] >= it->hi[r] || it->hi[r] <= j0 ||
                it->lo[r] >= j0 + nk)
                continue;
            double *s_r = it->s + r * BK;
            tile_logits(row_params(x, it->dense[r], cls), j0, nk, it->lo[r], it->hi[r], b, h,
                        it->i0 + r, it->dg[r], s_r);
            float *w_r = p->weights + b * p->w_s[0] + h * p->w_s[1] + (it->i0 + r) * p->w_s[2];
            for (int64_t c = 0; c < nk; c++)
                w_r[(j0 + c) * p->w_s[3]] = (float)(exp(s_r[c] - it->m[r]) / it->l[r]);
        }
    }
}

/* Item (b, h, a block of BQ query rows): its tiles streamed through the online softmax,
 * then the sink, O, the LSE and the weights. */
static void item_forward(const f64_call *x, const f64_plan *pl, double *w, int64_t item) {
    const attn_params *p = x->p;
    f64_item it;
    item_open(x, pl, w, item, &it);
    for (int64_t j0 = it.blo; j0 < it.bhi; j0 += BK) {
        const int64_t nk = it.bhi - j0 < BK ? it.bhi - j0 : BK;
        const attn_tile_class cls = tile_class(x, it.b, it.h, it.i0, j0, nk);
        if (cls == ATTN_TILE_MASKED) continue;  // every key of every row masked: adds 0
        load_tile(p, it.k_bg, it.v_bg, j0, nk, it.kt, it.v);
        tile_dots(p, it.q, it.kt, it.nq, nk, it.s);
        item_tile_softmax(x, &it, j0, nk, cls);
        /* acc_r += Σ_c e_rc v_c, over the keys in order; a weight of exactly 0 adds +0
         * (skip_zero): a masked key's V is never multiplied */
        ai_gemm_f64(it.nq, p->Dv, nk, it.s, BK, 1, it.v, p->Dv, it.acc, p->Dv, true, true);
    }
    item_close(x, &it);
    if (p->weights) item_weights(x, &it);
}

attn_status ai_fused_f64_forward(const attn_params *p, void *ws) {
    f64_plan pl;
    if (!make_plan(p, &pl)) return ai_fail(ATTN_ERR_OVERFLOW, "float64 fused plan overflows");
    double *base = ws;
    attn_mask_summary sum;
    attn_params open;
    f64_call x = {.p = p};
    if (p->mask || p->bias || p->block) {
        void *at = (void *)(((uintptr_t)(base + pl.per_thread * p->threads) + 63) & ~(uintptr_t)63);
        ai_mask_summary_init(p, at, &sum);
        open = *p;
        open.mask = NULL;
        open.bias = NULL;
        open.block = NULL;
        x.sum = &sum;
        x.open = &open;
    }
#pragma omp parallel num_threads(p->threads) if (attn_run_parallel(p, 1.0))  // team.h
    {
        double *w = base + (int64_t)attn_thread_num() * pl.per_thread;
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < pl.items; t++) item_forward(&x, &pl, w, t);
    }
    return ATTN_OK;
}
