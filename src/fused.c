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

/* Tile sizes: BQ query rows share each key block; BK keys per block, chosen so that a
 * key and a value block together stay near 64 KiB (a Zen 4 core has 32 KiB of L1d and
 * 1 MiB of L2), within [16, 128]. */
enum { BQ = 64, BK_MIN = 16, BK_MAX = 128 };

typedef struct fused_plan {
    int64_t bq, bk;
    size_t thread_bytes;  // one thread's slice, a multiple of 64 bytes
    size_t off_qt, off_k, off_v, off_s, off_acc, off_m, off_l, off_alpha, off_lo, off_hi;
} fused_plan;

static size_t round64(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

/* Fills *plan; false when the sizes overflow. */
static bool make_plan(const attn_params *p, fused_plan *plan) {
    const int64_t dk = p->Dk, dv = p->Dv;
    if (dk > (int64_t)1 << 40 || dv > (int64_t)1 << 40) return false;
    int64_t bk = BK_MAX;
    while (bk > BK_MIN && bk * (dk + dv) * (int64_t)sizeof(float) > 64 * 1024) bk /= 2;
    plan->bq = BQ;
    plan->bk = bk;

    size_t at = 0;
#define CARVE(field, nbytes) (plan->field = at, at += round64(nbytes))
    CARVE(off_qt, (size_t)(dk * BQ) * sizeof(float));
    CARVE(off_k, (size_t)(bk * dk) * sizeof(float));
    CARVE(off_v, (size_t)(bk * dv) * sizeof(float));
    CARVE(off_s, (size_t)(bk * BQ) * sizeof(float));
    CARVE(off_acc, (size_t)(BQ * dv) * sizeof(float));
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
    float *qt;     // (Dk, BQ)   the query block, transposed, padding rows zero
    float *k;      // (bk, Dk)   the key block, when K must be packed
    float *v;      // (bk, Dv)   the value block, when V must be packed
    float *s;      // (bk, BQ)   logits, then probabilities, transposed
    float *acc;    // (BQ, Dv)   unnormalized output
    float *m, *l, *alpha;  // (BQ)
    int64_t *lo, *hi;      // (BQ) each row's structural key range
} fused_scratch;

static fused_scratch carve(const fused_plan *plan, char *slice) {
    fused_scratch w = {
        .qt = (float *)(slice + plan->off_qt),
        .k = (float *)(slice + plan->off_k),
        .v = (float *)(slice + plan->off_v),
        .s = (float *)(slice + plan->off_s),
        .acc = (float *)(slice + plan->off_acc),
        .m = (float *)(slice + plan->off_m),
        .l = (float *)(slice + plan->off_l),
        .alpha = (float *)(slice + plan->off_alpha),
        .lo = (int64_t *)(slice + plan->off_lo),
        .hi = (int64_t *)(slice + plan->off_hi),
    };
    return w;
}

/* The final logits of one tile (S^T layout, rows i0.., keys j0..): structural masks on
 * boundary tiles, then softcap, bias, ALiBi and the bool mask where the call has them. */
static void finish_tile(const attn_params *p, const fused_scratch *w, int64_t n, int64_t nk,
                        int64_t lds, int64_t b, int64_t h, int64_t i0, int64_t j0,
                        int64_t lk_b, bool boundary) {
    const bool elementwise = attn_has_elementwise(p);
    for (int64_t c = 0; c < nk; c++) {
        float *s_c = w->s + c * lds;
        const int64_t j = j0 + c;
        for (int64_t r = 0; r < n; r++) {
            if (boundary && (j < w->lo[r] || j >= w->hi[r]))
                s_c[r] = -INFINITY;
            else if (elementwise)
                s_c[r] = attn_finish_logit(p, s_c[r], b, h, i0 + r, j,
                                           attn_diagonal(p, lk_b, i0 + r));
        }
    }
}

/* The key (or value) rows j0 .. j0+nk-1 of head (b, g): a pointer into the caller's
 * tensor when its last stride is 1, else a copy into buf. *ld gets the row stride. */
static const float *kv_block(const float *base, const int64_t st[4], int64_t width,
                             int64_t b, int64_t g, int64_t j0, int64_t nk, float *buf,
                             int64_t *ld) {
    const float *x = base + b * st[0] + g * st[1] + j0 * st[2];
    if (st[3] == 1 && nk > 0) {
        *ld = st[2];
        return x;
    }
    for (int64_t c = 0; c < nk; c++)
        for (int64_t d = 0; d < width; d++) buf[c * width + d] = x[c * st[2] + d * st[3]];
    *ld = width;
    return buf;
}

/* One work item: rows i0 .. i0+n-1 of query head h in batch b. */
static void fused_item(const attn_params *p, const attn_kernels *kern, const fused_plan *plan,
                       const fused_scratch *w, int64_t b, int64_t h, int64_t i0, int64_t n) {
    const int64_t bk = plan->bk, g = h / p->group, lk_b = attn_key_len(p, b);
    const int64_t dk = p->Dk, dv = p->Dv, lds = plan->bq;
    const int64_t npad = (n + ATTN_ROW_PAD - 1) / ATTN_ROW_PAD * ATTN_ROW_PAD;

    /* The block's key range is the union of its rows' structural ranges; inside it, the
     * keys every row may read ([lo_max, hi_min)) need no structural mask. */
    int64_t jmin = INT64_MAX, jmax = 0, lo_max = 0, hi_min = INT64_MAX;
    for (int64_t r = 0; r < n; r++) {
        attn_row_range(p, lk_b, i0 + r, &w->lo[r], &w->hi[r]);
        if (w->lo[r] < w->hi[r]) {
            if (w->lo[r] < jmin) jmin = w->lo[r];
            if (w->hi[r] > jmax) jmax = w->hi[r];
        }
        if (w->lo[r] > lo_max) lo_max = w->lo[r];
        if (w->hi[r] < hi_min) hi_min = w->hi[r];
    }

    /* the query block, transposed, padding rows 0 */
    const float *q_bh = p->q + b * p->q_s[0] + h * p->q_s[1];
    for (int64_t d = 0; d < dk; d++) {
        float *qt_d = w->qt + d * lds;
        for (int64_t r = 0; r < n; r++) qt_d[r] = q_bh[(i0 + r) * p->q_s[2] + d * p->q_s[3]];
        for (int64_t r = n; r < npad; r++) qt_d[r] = 0.0f;
    }
    for (int64_t r = 0; r < npad; r++) {
        w->m[r] = -INFINITY;
        w->l[r] = 0.0f;
    }
    memset(w->acc, 0, (size_t)(n * dv) * sizeof(float));

    /* a bool mask or a bias can mask any key: their tiles skip zero weights */
    const bool may_mask = p->mask || p->bias;
    for (int64_t j0 = jmin; j0 < jmax; j0 += bk) {
        const int64_t nk = jmax - j0 < bk ? jmax - j0 : bk;
        const bool boundary = j0 < lo_max || j0 + nk > hi_min;
        int64_t ldk, ldv;
        const float *k = kv_block(p->k, p->k_s, dk, b, g, j0, nk, w->k, &ldk);
        const float *v = kv_block(p->v, p->v_s, dv, b, g, j0, nk, w->v, &ldv);
        kern->qk(npad, nk, dk, w->qt, lds, k, ldk, p->scale, w->s, lds);
        if (boundary || attn_has_elementwise(p))
            finish_tile(p, w, n, nk, lds, b, h, i0, j0, lk_b, boundary);
        kern->softmax(npad, nk, w->s, lds, w->m, w->l, w->alpha);
        kern->pv(n, npad, nk, dv, w->s, lds, v, ldv, w->alpha, w->acc, dv,
                 boundary || may_mask);
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
        const bool boundary = j0 < lo_max || j0 + nk > hi_min;
        int64_t ldk;
        const float *k = kv_block(p->k, p->k_s, dk, b, g, j0, nk, w->k, &ldk);
        kern->qk(npad, nk, dk, w->qt, lds, k, ldk, p->scale, w->s, lds);
        if (boundary || attn_has_elementwise(p))
            finish_tile(p, w, n, nk, lds, b, h, i0, j0, lk_b, boundary);
        for (int64_t r = 0; r < n; r++) {
            if (w->m[r] == -INFINITY) continue;
            float *w_bhi = w_bh + (i0 + r) * p->w_s[2];
            for (int64_t c = 0; c < nk; c++)
                w_bhi[(j0 + c) * p->w_s[3]] = expf(w->s[c * lds + r] - w->m[r]) / w->l[r];
        }
    }
}

attn_status attn_fused_forward(const attn_params *p, void *ws) {
    fused_plan plan;
    make_plan(p, &plan);  // cannot fail: the workspace query succeeded with the same p
    char *base = (char *)(((uintptr_t)ws + 63) & ~(uintptr_t)63);
    const attn_kernels *kern = p->kernels;

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
