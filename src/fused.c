/*
 * fused.c — the fused forward pass: FlashAttention-2's algorithm on the CPU.
 *
 * The framework half of the fused path: it splits the work into (batch, head, query
 * block) items, hands them to OpenMP threads, packs each key/value block into the
 * thread's slice of the workspace, applies every mask, and finishes each row with one
 * division. The arithmetic on a tile is the micro-kernels' (kernels.h).
 *
 * Per query block the rows keep a running max m, a running sum l and an unnormalized
 * accumulator; each key block rescales them by exp(m_old - m_new). Extra memory is the
 * workspace alone: a few tiles per thread, independent of Lk; the Lq x Lk matrix is
 * never formed. A row reads only the keys in its structural range (key length, causal
 * band, window): blocks outside every row's range are skipped, and within a block the
 * keys outside a row's range are -inf before the softmax and so never multiply V.
 * Each item is computed by one thread in a fixed order, so results are bit-identical
 * for any thread count.
 */
#include <math.h>
#include <string.h>

#include "kernels.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* Tile sizes: BQ query rows share each packed key block; BK keys per block, chosen so
 * that a packed K and V block together stay near 64 KiB (a Zen 4 core has 1 MiB of L2,
 * 32 KiB of L1d) and within [16, 128]. */
enum { BQ = 32, BK_MIN = 16, BK_MAX = 128 };

typedef struct fused_plan {
    int64_t bq, bk;
    size_t thread_bytes;  // one thread's slice, a multiple of 64 bytes
    /* float offsets inside a slice */
    size_t off_q, off_kt, off_v, off_s, off_acc, off_tmp, off_m, off_l, off_alpha;
    size_t off_lo, off_hi;  // int64 arrays, in bytes
} fused_plan;

static size_t round64(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

/* Fills *plan; false when the sizes overflow. */
static bool make_plan(const attn_params *p, fused_plan *plan) {
    int64_t dk = p->Dk, dv = p->Dv;
    int64_t bk = BK_MAX;
    while (bk > BK_MIN && bk * (dk + dv) * (int64_t)sizeof(float) > 64 * 1024) bk /= 2;
    plan->bq = BQ;
    plan->bk = bk;
    if (dk > (int64_t)1 << 40 || dv > (int64_t)1 << 40) return false;

    size_t at = 0;
#define CARVE(field, nbytes) (plan->field = at, at += round64(nbytes))
    CARVE(off_q, (size_t)(BQ * dk) * sizeof(float));
    CARVE(off_kt, (size_t)(dk * bk) * sizeof(float));
    CARVE(off_v, (size_t)(bk * dv) * sizeof(float));
    CARVE(off_s, (size_t)(BQ * bk) * sizeof(float));
    CARVE(off_acc, (size_t)(BQ * dv) * sizeof(float));
    CARVE(off_tmp, (size_t)dv * sizeof(float));
    CARVE(off_m, BQ * sizeof(float));
    CARVE(off_l, BQ * sizeof(float));
    CARVE(off_alpha, BQ * sizeof(float));
    CARVE(off_lo, BQ * sizeof(int64_t));
    CARVE(off_hi, BQ * sizeof(int64_t));
#undef CARVE
    plan->thread_bytes = at;
    return true;
}

size_t attn_fused_workspace(const attn_params *p) {
    fused_plan plan;
    if (!make_plan(p, &plan)) return (size_t)-1;
    if ((size_t)p->threads > (SIZE_MAX - 64) / plan.thread_bytes) return (size_t)-1;
    return (size_t)p->threads * plan.thread_bytes + 64;  // + 64: room to align the start
}

/* One thread's scratch, carved from its slice of the workspace. */
typedef struct fused_scratch {
    float *q;      // (bq, Dk)   the query block
    float *kt;     // (Dk, bk)   the key block, transposed
    float *v;      // (bk, Dv)   the value block
    float *s;      // (bq, bk)   logits, then probabilities
    float *acc;    // (bq, Dv)   unnormalized output
    float *tmp;    // (Dv)
    float *m, *l, *alpha;  // (bq)
    int64_t *lo, *hi;      // (bq) each row's structural key range
} fused_scratch;

static fused_scratch carve(const fused_plan *plan, char *slice) {
    fused_scratch w = {
        .q = (float *)(slice + plan->off_q),
        .kt = (float *)(slice + plan->off_kt),
        .v = (float *)(slice + plan->off_v),
        .s = (float *)(slice + plan->off_s),
        .acc = (float *)(slice + plan->off_acc),
        .tmp = (float *)(slice + plan->off_tmp),
        .m = (float *)(slice + plan->off_m),
        .l = (float *)(slice + plan->off_l),
        .alpha = (float *)(slice + plan->off_alpha),
        .lo = (int64_t *)(slice + plan->off_lo),
        .hi = (int64_t *)(slice + plan->off_hi),
    };
    return w;
}

/* The final logits of one tile: structural masks, then softcap, bias, ALiBi and the bool
 * mask. Rows i0.., keys j0.. (nk of them). */
static void mask_tile(const attn_params *p, const fused_scratch *w, int64_t n, int64_t nk,
                      int64_t lds, int64_t b, int64_t h, int64_t i0, int64_t j0,
                      int64_t lk_b) {
    const bool elementwise = attn_has_elementwise(p);
    for (int64_t r = 0; r < n; r++) {
        float *s_r = w->s + r * lds;
        const int64_t i = i0 + r, lo = w->lo[r], hi = w->hi[r];
        const int64_t d_i = attn_diagonal(p, lk_b, i);
        for (int64_t c = 0; c < nk; c++) {
            const int64_t j = j0 + c;
            if (j < lo || j >= hi)
                s_r[c] = -INFINITY;
            else if (elementwise)
                s_r[c] = attn_finish_logit(p, s_r[c], b, h, i, j, d_i);
        }
    }
}

/* Pack keys j0 .. j0+nk-1 of head (b, g): K transposed into kt, V row-major into v. */
static void pack_kv(const attn_params *p, const fused_scratch *w, int64_t bk, int64_t nk,
                    int64_t b, int64_t g, int64_t j0, bool with_v) {
    const float *k_bg = p->k + b * p->k_s[0] + g * p->k_s[1];
    for (int64_t c = 0; c < nk; c++) {
        const float *k_bgj = k_bg + (j0 + c) * p->k_s[2];
        for (int64_t d = 0; d < p->Dk; d++) w->kt[d * bk + c] = k_bgj[d * p->k_s[3]];
    }
    if (!with_v) return;
    const float *v_bg = p->v + b * p->v_s[0] + g * p->v_s[1];
    for (int64_t c = 0; c < nk; c++) {
        const float *v_bgj = v_bg + (j0 + c) * p->v_s[2];
        float *v_c = w->v + c * p->Dv;
        for (int64_t d = 0; d < p->Dv; d++) v_c[d] = v_bgj[d * p->v_s[3]];
    }
}

/* One work item: rows i0 .. i0+n-1 of query head h in batch b. */
static void fused_item(const attn_params *p, const attn_kernels *kern, const fused_plan *plan,
                       const fused_scratch *w, int64_t b, int64_t h, int64_t i0, int64_t n) {
    const int64_t bk = plan->bk, g = h / p->group, lk_b = attn_key_len(p, b);
    const int64_t dk = p->Dk, dv = p->Dv;

    /* the block's key range: the union of its rows' structural ranges */
    int64_t jmin = INT64_MAX, jmax = 0;
    for (int64_t r = 0; r < n; r++) {
        attn_row_range(p, lk_b, i0 + r, &w->lo[r], &w->hi[r]);
        if (w->lo[r] < w->hi[r]) {
            if (w->lo[r] < jmin) jmin = w->lo[r];
            if (w->hi[r] > jmax) jmax = w->hi[r];
        }
    }

    const float *q_bh = p->q + b * p->q_s[0] + h * p->q_s[1];
    for (int64_t r = 0; r < n; r++) {
        const float *q_bhi = q_bh + (i0 + r) * p->q_s[2];
        for (int64_t d = 0; d < dk; d++) w->q[r * dk + d] = q_bhi[d * p->q_s[3]];
        w->m[r] = -INFINITY;
        w->l[r] = 0.0f;
        memset(w->acc + r * dv, 0, (size_t)dv * sizeof(float));
    }

    for (int64_t j0 = jmin; j0 < jmax; j0 += bk) {
        const int64_t nk = jmax - j0 < bk ? jmax - j0 : bk;
        pack_kv(p, w, bk, nk, b, g, j0, true);
        kern->qk(n, nk, dk, w->q, dk, w->kt, bk, p->scale, w->s, bk);
        mask_tile(p, w, n, nk, bk, b, h, i0, j0, lk_b);
        kern->softmax(n, nk, w->s, bk, w->m, w->l, w->alpha);
        kern->pv(n, nk, dv, w->s, bk, w->v, dv, w->alpha, w->acc, dv, w->tmp);
    }

    /* one division per element; a fully masked row (m = -inf) is 0 with LSE -inf */
    float *o_bh = p->o + b * p->o_s[0] + h * p->o_s[1];
    for (int64_t r = 0; r < n; r++) {
        const bool masked_row = w->m[r] == -INFINITY;
        float *o_bhi = o_bh + (i0 + r) * p->o_s[2];
        const float *acc_r = w->acc + r * dv;
        for (int64_t d = 0; d < dv; d++)
            o_bhi[d * p->o_s[3]] = masked_row ? 0.0f : acc_r[d] / w->l[r];
        if (p->lse)
            p->lse[b * p->lse_s[0] + h * p->lse_s[1] + (i0 + r) * p->lse_s[2]] =
                masked_row ? -INFINITY : w->m[r] + logf(w->l[r]);
    }

    if (!p->weights) return;
    /* The weights, for those who ask: a second sweep recomputes each tile's logits and
     * writes exp(s - m) / l with the row's final m and l. Keys outside every row's range
     * are 0 without being read. */
    float *w_bh = p->weights + b * p->w_s[0] + h * p->w_s[1];
    for (int64_t r = 0; r < n; r++) {
        float *w_bhi = w_bh + (i0 + r) * p->w_s[2];
        for (int64_t j = 0; j < p->Lk; j++) w_bhi[j * p->w_s[3]] = 0.0f;
    }
    for (int64_t j0 = jmin; j0 < jmax; j0 += bk) {
        const int64_t nk = jmax - j0 < bk ? jmax - j0 : bk;
        pack_kv(p, w, bk, nk, b, g, j0, false);
        kern->qk(n, nk, dk, w->q, dk, w->kt, bk, p->scale, w->s, bk);
        mask_tile(p, w, n, nk, bk, b, h, i0, j0, lk_b);
        for (int64_t r = 0; r < n; r++) {
            if (w->m[r] == -INFINITY) continue;
            float *w_bhi = w_bh + (i0 + r) * p->w_s[2];
            const float *s_r = w->s + r * bk;
            for (int64_t c = 0; c < nk; c++)
                w_bhi[(j0 + c) * p->w_s[3]] = expf(s_r[c] - w->m[r]) / w->l[r];
        }
    }
}

attn_status attn_fused_forward(const attn_params *p, void *ws) {
    fused_plan plan;
    make_plan(p, &plan);  // cannot fail: the workspace query succeeded with the same p
    char *base = (char *)(((uintptr_t)ws + 63) & ~(uintptr_t)63);
    const attn_kernels *kern = &attn_kernels_generic;

    /* Items in the order (b, h, query block from the last): with top-left causal masks
     * the last blocks have the most keys, so dynamic scheduling starts the long items
     * first and the short ones fill in at the end. */
    const int64_t nqb = (p->Lq + plan.bq - 1) / plan.bq;
    const int64_t items = p->B * p->Hq * nqb;
#pragma omp parallel num_threads(p->threads)
    {
#ifdef _OPENMP
        const int tid = omp_get_thread_num();
#else
        const int tid = 0;
#endif
        const fused_scratch w = carve(&plan, base + (size_t)tid * plan.thread_bytes);
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < items; t++) {
            const int64_t qb = nqb - 1 - t % nqb, bh = t / nqb;
            const int64_t i0 = qb * plan.bq;
            const int64_t n = p->Lq - i0 < plan.bq ? p->Lq - i0 : plan.bq;
            fused_item(p, kern, &plan, &w, bh / p->Hq, bh % p->Hq, i0, n);
        }
    }
    return ATTN_OK;
}
