/*
 * weights_grid.c — attn_weights_grid: the attention weights of a forward call recomputed
 *                  from its log-sum-exp, p_ij = exp(s_ij - lse_i), and reduced (summed or
 *                  maxed) over blocks of rows and keys into a grid of R x C cells.
 *
 * One more pass over K: each block of query rows recomputes its logits tile by tile (the
 * fused path's Q·Kᵀ micro-kernel, or float64 dot products on the reference path), applies
 * the call's masks in the contract's order (attn_finish_logit / ai_ref_finish) and
 * folds every weight into its cell at once. Memory is the grid and a few tiles per
 * thread; the Lq x Lk matrix is never held, so a picture of 100K tokens costs time, not
 * memory. With R = Lq and C = Lk the grid is the weights themselves.
 *
 * Work is split by (batch, head, grid row): each cell is written by one thread, its rows
 * folded in a fixed order, so the grid does not depend on the thread count. What it is
 * not: a second softmax — the row sums come from the caller's LSE, so a wrong LSE gives
 * wrong weights (their row sums then differ from 1; nothing here checks it).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/half.h"
#include "kernels/kernels.h"
#include "mask_summary.h"
#include "core/team.h"


/* The per-thread scratch of one tile of rows x keys (the forward's tiles, ai_choose_tiles:
 * bq rows, bk keys, rows padded to the kernel's row_pad): float32 rows for the
 * micro-kernel, the tile's logits S^T (keys, rows), the key block as float32, the rows'
 * ranges, and the cells of the current grid row in float64. */
typedef struct wg_scratch {
    int64_t rows, keys, row_pad;
    float *q, *qt, *k, *s;
    int64_t *lo, *hi;
    double *cells;  // (C)
} wg_scratch;

static size_t wg_scratch_floats(int64_t dk, int64_t rows, int64_t keys) {
    return (size_t)(rows * dk + dk * rows + keys * dk + keys * rows);
}

/* Cell of key j (or row i): floor(j * C / Lk), the blocks as equal as integers allow. */
static int64_t wg_cell(int64_t j, int64_t cells, int64_t len) { return j * cells / len; }

/* First index whose cell is c: ceil(c * len / cells). */
static int64_t wg_first(int64_t c, int64_t cells, int64_t len) {
    return (c * len + cells - 1) / cells;
}

/* Folds weight x into cell *c: masked cells hold -inf until their first weight. */
static inline void wg_fold(double *c, double x, attn_reduce reduce) {
    if (*c == -INFINITY) *c = x;
    else if (reduce == ATTN_REDUCE_MAX) *c = (x > *c || isnan(x)) ? x : *c;
    else *c += x;
}

/* Rows i0 .. i0+n-1 of (b, h) on the fused path's kernels: logits tile by tile, each
 * weight folded into w->cells. */
static void wg_rows_fused(const attn_params *p, const wg_scratch *w, const float *lse_bh,
                          int64_t lse_si, int64_t b, int64_t h, int64_t i0, int64_t n,
                          int64_t lk_b, int64_t C, attn_reduce reduce) {
    const attn_kernels *kern = p->kernels;
    const bool elementwise = attn_has_elementwise(p);
    const int64_t dk = p->Dk, g = h / p->group, npad = (n + w->row_pad - 1) / w->row_pad * w->row_pad;
    const float ks = attn_kv_scale(p->k_scale, p->k_scale_s, g);
    int64_t jmin = INT64_MAX, jmax = 0;
    for (int64_t r = 0; r < n; r++) {
        const int64_t q_bhi = b * p->q_s[0] + h * p->q_s[1] + (i0 + r) * p->q_s[2];
        for (int64_t d = 0; d < dk; d++) {
            const float x = attn_load(p->q_dt, p->q, q_bhi + d * p->q_s[3]);
            w->q[r * dk + d] = x;
            w->qt[d * w->rows + r] = x;
        }
        attn_row_range(p, lk_b, i0 + r, &w->lo[r], &w->hi[r]);
        if (w->lo[r] < w->hi[r]) {
            if (w->lo[r] < jmin) jmin = w->lo[r];
            if (w->hi[r] > jmax) jmax = w->hi[r];
        }
    }
    for (int64_t d = 0; d < dk; d++)
        for (int64_t r = n; r < npad; r++) w->qt[d * w->rows + r] = 0.0f;
    for (int64_t j0 = jmin; j0 < jmax; j0 += w->keys) {
        const int64_t nk = jmax - j0 < w->keys ? jmax - j0 : w->keys;
        const float *k = w->k;
        int64_t ldk = dk;
        if (p->kv_dt == ATTN_F32 && p->k_s[3] == 1 && attn_kv_one_run(p, j0, nk)) {
            k = (const float *)p->k + attn_kv_offset(p, p->k_s, b, g, j0);
            ldk = p->k_s[2];
        } else {  // other dtypes, and a tile across pages: row by row through the table
            for (int64_t c = 0; c < nk; c++) {
                const int64_t k_bgj = attn_kv_offset(p, p->k_s, b, g, j0 + c);
                for (int64_t d = 0; d < dk; d++)
                    w->k[c * dk + d] = attn_load(p->kv_dt, p->k, k_bgj + d * p->k_s[3]) *
                                       ks;  // an fp8 cache's scale (attn.h), else 1
            }
        }
        kern->qk(n, npad, nk, dk, w->q, w->qt, w->rows, k, ldk, p->scale, w->s, w->rows);
        for (int64_t r = 0; r < n; r++) {
            const int64_t i = i0 + r, d_i = attn_diagonal(p, lk_b, i);
            const float lse = lse_bh[i * lse_si];
            const int64_t ca = w->lo[r] > j0 ? w->lo[r] : j0;
            const int64_t cb = w->hi[r] < j0 + nk ? w->hi[r] : j0 + nk;
            if (ca >= cb) continue;
            /* the row's final logits, contiguous, then exp(s - lse) by the kernel's vector
             * exp (x <= 0 there; a lane above 0, from an LSE that is not the forward's,
             * takes expf, outside the kernel's range) */
            float sv[ATTN_BK_LIMIT], e[ATTN_BK_LIMIT];
            for (int64_t j = ca; j < cb; j++) {
                float s = w->s[(j - j0) * w->rows + r];
                if (elementwise) s = attn_finish_logit(p, s, b, h, i, j, d_i);
                sv[j - ca] = s;
                e[j - ca] = s - lse;
            }
            kern->exp(cb - ca, e, e);
            for (int64_t c = 0; c < cb - ca; c++)
                if (sv[c] - lse > 0.0f) e[c] = expf(sv[c] - lse);
            /* keys outside [lo, hi) are masked by structure and leave their cells alone */
            int64_t cell = wg_cell(ca, C, p->Lk), next = wg_first(cell + 1, C, p->Lk);
            for (int64_t j = ca; j < cb; j++) {
                while (j >= next) next = wg_first(++cell + 1, C, p->Lk);
                if (sv[j - ca] == -INFINITY) continue;
                wg_fold(&w->cells[cell], (double)e[j - ca], reduce);
            }
        }
    }
}

/* The same rows on the reference path: float64 logits, exp in float64. */
static void wg_rows_reference(const attn_params *p, const wg_scratch *w, const float *lse_bh,
                              int64_t lse_si, int64_t b, int64_t h, int64_t i0, int64_t n,
                              int64_t lk_b, int64_t C, attn_reduce reduce) {
    const int64_t g = h / p->group;
    const float ks = attn_kv_scale(p->k_scale, p->k_scale_s, g);
    for (int64_t i = i0; i < i0 + n; i++) {
        int64_t lo, hi;
        attn_row_range(p, lk_b, i, &lo, &hi);
        const int64_t d_i = attn_diagonal(p, lk_b, i);
        const int64_t q_bhi = b * p->q_s[0] + h * p->q_s[1] + i * p->q_s[2];
        const double lse = lse_bh[i * lse_si];
        int64_t cell = lo < hi ? wg_cell(lo, C, p->Lk) : 0, next = wg_first(cell + 1, C, p->Lk);
        for (int64_t j = lo; j < hi; j++) {
            const int64_t k_bgj = attn_kv_offset(p, p->k_s, b, g, j);
            double dot = 0.0;
            for (int64_t d = 0; d < p->Dk; d++)
                dot += (double)attn_load(p->q_dt, p->q, q_bhi + d * p->q_s[3]) *
                       (double)(attn_load(p->kv_dt, p->k, k_bgj + d * p->k_s[3]) * ks);
            const double s = ai_ref_finish(p, (double)p->scale * dot, b, h, i, j, d_i, NULL);
            while (j >= next) next = wg_first(++cell + 1, C, p->Lk);
            if (s == -INFINITY) continue;
            wg_fold(&w->cells[cell], exp(s - lse), reduce);
        }
    }
}

/* Every check of a call, before anything is written: the forward's (K standing in for V,
 * which is not read, and an output described but never written; the LSE checked as the
 * forward's LSE output), the grid's shape and strides, and the overlap rule. *p gets the
 * call's params. */
static attn_status wg_check(const attn_tensor *q, const attn_tensor *k, const attn_tensor *lse,
                            const attn_tensor *grid, attn_reduce reduce, const attn_options *base,
                            attn_params *p) {
    if (base->lse || base->weights)
        return ai_fail(ATTN_ERR_VALUE, "options.lse and options.weights must be NULL (the "
                       "LSE is an input here, the grid the output)");
    if (!lse) return ai_fail(ATTN_ERR_NULL, "lse: tensor pointer is NULL");
    if (!q) return ai_fail(ATTN_ERR_NULL, "q: tensor pointer is NULL");
    if ((unsigned)reduce > (unsigned)ATTN_REDUCE_MAX)
        return ai_fail(ATTN_ERR_VALUE, "reduce is %d, expected ATTN_REDUCE_SUM or "
                       "ATTN_REDUCE_MAX", (int)reduce);
    if (q->dtype == ATTN_F64)
        return ai_fail(ATTN_ERR_DTYPE, "q: dtype is float64, which attn_weights_grid does "
                       "not take (float32, float16 or bfloat16)");
    if (k && k->dtype == ATTN_U4)  // its key pass reads K element by element (attn_load)
        return ai_fail(ATTN_ERR_UNSUPPORTED, "k: attn_weights_grid does not read a u4 cache");
    attn_options opt = *base;
    opt.lse = lse;
    const attn_tensor o = attn_tensor_4d(q->data, ATTN_F32, q->shape[0], q->shape[1],
                                         q->shape[2], k ? k->shape[3] : 0);
    TRY(ai_params_init(p, q, k, k, &o, &opt, true));
    TRY(ai_check_tensor(grid, "grid", ATTN_F32, true));
    const int64_t R = grid->shape[2], C = grid->shape[3];
    if (grid->shape[0] != p->B || grid->shape[1] != p->Hq)
        return ai_fail(ATTN_ERR_SHAPE, "grid: shape [%lld, %lld, ...], expected [B = %lld, "
                       "Hq = %lld, R, C]", (long long)grid->shape[0],
                       (long long)grid->shape[1], (long long)p->B, (long long)p->Hq);
    if (R > p->Lq || C > p->Lk || (R == 0) != (p->Lq == 0) || (C == 0) != (p->Lk == 0))
        return ai_fail(ATTN_ERR_SHAPE, "grid: R = %lld, C = %lld, expected 1 <= R <= Lq = "
                       "%lld and 1 <= C <= Lk = %lld (0 only for an empty Lq or Lk)",
                       (long long)R, (long long)C, (long long)p->Lq, (long long)p->Lk);
    int64_t t1, t2;
    if (__builtin_mul_overflow(p->Lq, R, &t1) || __builtin_mul_overflow(p->Lk, C, &t2) ||
        __builtin_add_overflow(t1, R, &t1) || __builtin_add_overflow(t2, C, &t2))
        return ai_fail(ATTN_ERR_OVERFLOW, "grid: Lq * R or Lk * C overflows int64");
    TRY(ai_check_output_strides(grid, "grid", 4));
    /* the grid shares no byte with anything the call reads (overlap.c's rule) */
    const attn_tensor *in[] = {q, k, lse, base->mask, base->bias, base->kv_len,
                               base->alibi_slopes, base->sinks, base->block_table};
    static const char *const in_names[] = {"q", "k", "lse", "options.mask", "options.bias",
                                           "options.kv_len", "options.alibi_slopes",
                                           "options.sinks", "options.block_table"};
    const attn_tensor *out[] = {grid};
    static const char *const out_names[] = {"grid"};
    return ai_check_aliasing(in, in_names, 9, out, out_names, 1, NULL, 0);
}

attn_status attn_weights_grid(const attn_tensor *q, const attn_tensor *k,
                              const attn_tensor *lse, const attn_tensor *grid,
                              attn_reduce reduce, const attn_options *opt_in) {
    static const attn_options defaults = {0};
    attn_params p;
    TRY(wg_check(q, k, lse, grid, reduce, opt_in ? opt_in : &defaults, &p));
    const int64_t R = grid->shape[2], C = grid->shape[3];
    ai_fail(ATTN_OK, "%s", "");
    if (p.B == 0 || p.Hq == 0 || R == 0 || C == 0) return ATTN_OK;
    /* key padding as the key lengths it is (mask_summary.h), in lengths_mem */
    const size_t pad = ai_key_padding_bytes(&p);
    void *lengths_mem = pad ? ai_malloc(pad) : NULL;
    if (pad && !lengths_mem)
        return ai_fail(ATTN_ERR_NOMEM, "grid: could not allocate %zu bytes of key lengths", pad);
    attn_params padded;
    if (pad && ai_key_padding(&p, lengths_mem, &padded) == &padded) p = padded;

    /* the forward's tiles (ai_choose_tiles: the same blocks of rows and keys); the
     * reference path takes the generic kernel's */
    const attn_kernels *tk = p.kernels ? p.kernels : ai_kernels_named("generic");
    const attn_tiles tiles = ai_choose_tiles(tk, ATTN_TILES_FORWARD, p.kv_dt, p.Dk, p.Dv,
                                                p.kernels ? &p.tune : NULL);
    const attn_kernel_geom geom = tk->geom;
    const int64_t rows = tiles.bq, keys = tiles.bk;
    const size_t per_thread = wg_scratch_floats(p.Dk, rows, keys) * sizeof(float) +
                              2 * (size_t)rows * sizeof(int64_t) + (size_t)C * sizeof(double);
    char *ws = ai_malloc(per_thread * (size_t)p.threads);
    if (!ws) ai_free(lengths_mem);
    if (!ws) return ai_fail(ATTN_ERR_NOMEM, "grid: could not allocate %zu bytes of scratch",
                            per_thread * (size_t)p.threads);
    float *g_out = grid->data;
    const float *lse_data = lse->data;
    const int64_t units = p.B * p.Hq * R;
#pragma omp parallel num_threads(p.threads) if (attn_run_parallel(&p, 0.5))  // team.h: Q·Kᵀ only
    {
        char *slice = ws + per_thread * (size_t)attn_thread_num();
        const int64_t dk = p.Dk;
        wg_scratch w = {.rows = rows, .keys = keys, .row_pad = geom.row_pad, .cells = (double *)slice};
        w.lo = (int64_t *)(slice + (size_t)C * sizeof(double));
        w.hi = w.lo + rows;
        w.q = (float *)(w.hi + rows);
        w.qt = w.q + rows * dk;
        w.k = w.qt + dk * rows;
        w.s = w.k + keys * dk;
#pragma omp for schedule(dynamic, 1)
        for (int64_t u = 0; u < units; u++) {
            const int64_t r = u % R, h = (u / R) % p.Hq, b = u / R / p.Hq;
            const int64_t lk_b = attn_key_len(&p, b);
            const float *lse_bh = lse_data + b * p.lse_s[0] + h * p.lse_s[1];
            for (int64_t c = 0; c < C; c++) w.cells[c] = -INFINITY;
            const int64_t ia = wg_first(r, R, p.Lq), ib = wg_first(r + 1, R, p.Lq);
            for (int64_t i0 = ia; i0 < ib; i0 += rows) {
                const int64_t n = ib - i0 < rows ? ib - i0 : rows;
                if (p.path == ATTN_PATH_REFERENCE)
                    wg_rows_reference(&p, &w, lse_bh, p.lse_s[2], b, h, i0, n, lk_b, C, reduce);
                else
                    wg_rows_fused(&p, &w, lse_bh, p.lse_s[2], b, h, i0, n, lk_b, C, reduce);
            }
            float *g_bhr = g_out + b * grid->stride[0] + h * grid->stride[1] + r * grid->stride[2];
            for (int64_t c = 0; c < C; c++) g_bhr[c * grid->stride[3]] = (float)w.cells[c];
        }
    }
    ai_free(ws);
    ai_free(lengths_mem);
    return ATTN_OK;
}
