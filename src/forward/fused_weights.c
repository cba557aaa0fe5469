/*
 * fused_weights.c — the attention weights of the fused forward (attn_forward's `weights`
 * output): each weight written once, from the P the sweep already computed where it can,
 * recomputed bit for bit on the tiles the decoding step took. The sweep itself, the
 * plan and the store of O and LSE are fused.c's.
 */
#include <math.h>
#include <string.h>

#include "fused_plan.h"

/* The weights' first half, in the sweep: the tile's P as it multiplies V (exp(s - m_t)
 * with the rows' running max m_t after this tile, dropout's factors applied), stored into
 * the weights' rows, and m_t kept in w->mt for fused_block_weights, which scales each row's
 * tile by exp(m_t - m) / l once the final m and l are known. P is read where the
 * softmax step left it: no second Q·Kᵀ and no second exp per weight. */
void fused_tile_weights(const attn_params *p, const fused_plan *plan, const fused_scratch *w,
                        const fused_block *blk, int64_t j0, int64_t nk) {
    const int64_t ld = w->ld, st = p->w_s[3];
    float *mt = w->mt + (j0 - blk->jmin) / plan->bk * ld;
    float *w_b = p->weights + blk->b * p->w_s[0] + j0 * st;
    for (int64_t r = 0; r < blk->n; r++) mt[r] = w->m[r];
    if (st == 1) {  /* each row contiguous: the kernel's transposing store, or the loop */
        float *o[ATTN_FWD_BQ_LIMIT];
        for (int64_t r = 0; r < blk->n; r++) o[r] = w_b + w->h[r] * p->w_s[1] + w->i[r] * p->w_s[2];
        if (p->kernels->rows_from_st) {
            p->kernels->rows_from_st(blk->n, nk, w->s, ld, o);
            return;
        }
        for (int64_t r = 0; r < blk->n; r++)
            for (int64_t c = 0; c < nk; c++) o[r][c] = w->s[c * ld + r];
        return;
    }
    for (int64_t r = 0; r < blk->n; r++) {
        float *w_bhi = w_b + w->h[r] * p->w_s[1] + w->i[r] * p->w_s[2];
        const float *e = w->s + r;
        for (int64_t c = 0; c < nk; c++) w_bhi[c * st] = e[c * ld];
    }
}

/* Weights w[j * st] = 0 for keys j0 .. j1-1 of one row. */
static void zero_keys(float *w, int64_t st, int64_t j0, int64_t j1) {
    if (j1 <= j0) return;
    if (st == 1) {
        memset(w + j0, 0, (size_t)(j1 - j0) * sizeof(float));
        return;
    }
    for (int64_t j = j0; j < j1; j++) w[j * st] = 0.0f;
}

/* The weights' second half, after the sweep and the sinks (block_sweep's tile_weights
 * wrote most of them), each weight written or scaled once:
 * - rows with nothing to read (m = -inf), keys outside the block's range [jmin, jmax) and
 *   the tiles the mask summary skips are zeroed;
 * - a tile the sweep took on the tile path holds exp(s - m_t) (times dropout's factors):
 *   each row's keys are scaled by exp(m_t - m) / l, the kernel's exp over the rows;
 * - a tile the decoding step took (its P stays in the step) is recomputed: its logits by
 *   the step's own Q·Kᵀ (decode_qk, bit for bit the sweep's, so none exceeds m), then
 *   exp(s - m) / l on the tile's S^T, the kernel's exp over a key's rows.
 * The weights' rows are written contiguously where their last stride is 1. A row whose
 * max is NaN is NaN over its tiles (exp(x - NaN)), as O is. */
void fused_block_weights(const attn_params *p, const attn_kernels *kern,
                         const fused_plan *plan, const fused_scratch *w,
                         const fused_block *blk) {
    const int64_t n = blk->n, ld = w->ld, lk = p->Lk, st = p->w_s[3];
    float *w_b = p->weights + blk->b * p->w_s[0];
    const float *m = w->m;
    float *inv_l = w->alpha;  // the sweep's scratch, free now: 1 / l of each row
    for (int64_t r = 0; r < n; r++) {
        float *w_bhi = w_b + w->h[r] * p->w_s[1] + w->i[r] * p->w_s[2];
        inv_l[r] = 1.0f / w->l[r];
        if (m[r] == -INFINITY) {  // a fully masked row (or none of its keys in range)
            zero_keys(w_bhi, st, 0, lk);
            continue;
        }
        zero_keys(w_bhi, st, 0, blk->jmin < lk ? blk->jmin : lk);
        zero_keys(w_bhi, st, blk->jmax > blk->jmin ? blk->jmax : 0, lk);
    }
    const bool decode = fused_takes_decode(plan->open ? plan->open : p, kern, n);
    for (int64_t j0 = blk->jmin; j0 < blk->jmax; j0 += plan->bk) {
        const int64_t nk = blk->jmax - j0 < plan->bk ? blk->jmax - j0 : plan->bk;
        const attn_params *pt = fused_tile_params(p, plan, blk, j0, nk);
        if (!pt) {  // every weight of the tile is 0
            for (int64_t r = 0; r < n; r++)
                if (m[r] != -INFINITY)
                    zero_keys(w_b + w->h[r] * p->w_s[1] + w->i[r] * p->w_s[2], st, j0, j0 + nk);
            continue;
        }
        const bool boundary = j0 < blk->lo_max || j0 + nk > blk->hi_min;
        if (!(decode && !boundary && !pt->mask && !pt->bias && !pt->block && !pt->score_mod)) {
            /* the sweep's P of this tile: row r times exp(m_t - m) / l */
            float *x = w->mt + (j0 - blk->jmin) / plan->bk * ld;
            for (int64_t r = 0; r < n; r++) x[r] = m[r] == -INFINITY ? 0.0f : x[r] - m[r];
            kern->exp(n, x, x);
            for (int64_t r = 0; r < n; r++) {
                if (m[r] == -INFINITY) continue;
                float *w_bhi = w_b + w->h[r] * p->w_s[1] + w->i[r] * p->w_s[2] + j0 * st;
                const float a = x[r] * inv_l[r];
                if (st == 1)
#pragma omp simd
                    for (int64_t c = 0; c < nk; c++) w_bhi[c] *= a;
                else
                    for (int64_t c = 0; c < nk; c++) w_bhi[c * st] *= a;
            }
            continue;
        }
        /* a tile the decoding step took: its own logits, in block_sweep's segments */
        for (int64_t s0 = j0, seg; s0 < j0 + nk; s0 += seg) {
            seg = fused_kv_segment(p, s0, j0 + nk - s0);
            const char *k = fused_kv_row(p, blk, p->k, p->k_s, s0);
            for (int64_t r0 = 0; r0 < n; r0 += 4)
                kern->decode_qk(n - r0 < 4 ? n - r0 : 4, seg, p->Dk, w->q + r0 * p->Dk,
                                p->kv_dt, k, p->k_s[2], p->scale,
                                attn_kv_scale(p->k_scale, p->k_scale_s, blk->g),
                                w->s + (s0 - j0) * ld + r0, ld);
        }
        /* x = s - m, a key's rows contiguous, and the kernel's exp over them in place (a
         * row with m = -inf is skipped below; 0 keeps its lanes finite) */
        for (int64_t c = 0; c < nk; c++) {
            float *s_c = w->s + c * ld;
#pragma omp simd
            for (int64_t r = 0; r < n; r++) s_c[r] -= m[r] == -INFINITY ? 0.0f : m[r];
            kern->exp(n, s_c, s_c);
        }
        for (int64_t r = 0; r < n; r++) {
            if (m[r] == -INFINITY) continue;
            float *w_bhi = w_b + w->h[r] * p->w_s[1] + w->i[r] * p->w_s[2] + j0 * st;
            const float *e = w->s + r, a = inv_l[r];
            for (int64_t c = 0; c < nk; c++) w_bhi[c * st] = e[c * ld] * a;
        }
    }
}
