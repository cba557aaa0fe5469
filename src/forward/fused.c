/*
 * fused.c — the fused forward pass: FlashAttention-2's algorithm on the CPU.
 *
 * The framework half of the fused path: it splits the work into items of query rows,
 * hands them to OpenMP threads, applies every mask, and finishes each row with one
 * division. The arithmetic on a tile is the micro-kernels' (kernels.h); the weights output
 * is fused_weights.c's, and what both files share is fused_plan.h.
 *
 * Per block of query rows the rows keep a running max m, a running sum l and an
 * unnormalized accumulator; each key block rescales them by exp(m_old - m_new). Extra
 * memory is the workspace alone: a few tiles per thread, independent of Lk; the
 * Lq x Lk matrix is never formed. A row reads only the keys in its structural range
 * (key length, causal band, window): key blocks outside every row's range are skipped,
 * blocks inside every row's range take no per-element mask test, and within a boundary
 * block the keys outside a row's range are -inf before the softmax and never multiply V.
 *
 * The work items:
 * - A block holds bq query rows of one head, or, when Lq < bq, the rows of several
 *   query heads that share one key/value head (grouped-query attention), so that each
 *   key and value is read once for the whole group.
 * - Decoding-shaped calls (Lq <= SPLIT_MAX_LQ) with long key ranges also split the keys
 *   into chunks whose size depends on the shape alone; each chunk leaves its (m, l, acc)
 *   in the workspace and a merge combines them in chunk order. Both cores then stream
 *   K and V even for a single head.
 * Each item (and each chunk) is computed by one thread in a fixed order, and the merge
 * order is fixed, so results are bit-identical for any thread count.
 */
#include <math.h>
#include <string.h>

#include "core/half.h"
#include "kernels/kernels.h"
#include "merge.h"
#include "mask_summary.h"
#include "core/philox.h"
#include "fused_plan.h"
#include "core/dense_rows.h"
#include "core/team.h"

static size_t round64(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

/* Fills *plan; false when the sizes overflow. */
static bool make_plan(const attn_params *p, fused_plan *plan) {
    const int64_t dk = p->Dk, dv = p->Dv;
    if (dk > (int64_t)1 << 40 || dv > (int64_t)1 << 40) return false;
    *plan = (fused_plan){0};
    const attn_tiles sizes = ai_choose_tiles(p->kernels, ATTN_TILES_FORWARD, p->kv_dt, dk, dv,
                                                &p->tune);
    const int64_t bq = sizes.bq, bk = sizes.bk;
    plan->bq = bq, plan->row_pad = p->kernels->geom.row_pad;
    plan->bk = bk;

    const int64_t group = p->group, lq = p->Lq > 0 ? p->Lq : 1;
    /* group = 0 (Hq = 0 over Hkv > 0 heads): no head chunk, so no item */
    plan->heads_per_block = lq >= bq || group == 0 ? 1 : (bq / lq < group ? bq / lq : group);
    plan->head_chunks = (group + plan->heads_per_block - 1) / plan->heads_per_block;
    plan->q_blocks = (lq + bq - 1) / bq;
    if (__builtin_mul_overflow(p->B * p->Hkv, plan->head_chunks * plan->q_blocks, &plan->items))
        return false;

    plan->split = 1;
    plan->split_keys = p->Lk > 0 ? p->Lk : 1;
    /* no item (B, Hkv or Lq = 0): nothing to split, and items would divide below */
    if (plan->items > 0 && p->Lq <= SPLIT_MAX_LQ && p->Lk >= 2 * SPLIT_MIN_KEYS && !p->weights) {
        /* a tuned split (wisdom.h): at most that many chunks, each of SPLIT_MIN_KEYS or
         * more; else the rule below */
        const int64_t most = p->tune.split > 0 ? p->tune.split : SPLIT_MAX;
        int64_t chunk = (p->Lk + most - 1) / most;
        if (p->tune.split == 0 && chunk < SPLIT_LONG_KEYS) {
            chunk = SPLIT_LONG_KEYS;
            if (plan->items < SPLIT_UNITS && plan->items * ((p->Lk + chunk - 1) / chunk) < SPLIT_UNITS) {
                const int64_t want = (SPLIT_UNITS + plan->items - 1) / plan->items;
                chunk = (p->Lk + want - 1) / want;
            }
        }
        if (chunk < SPLIT_MIN_KEYS) chunk = SPLIT_MIN_KEYS;
        chunk = (chunk + bk - 1) / bk * bk;
        plan->split_keys = chunk;
        plan->split = (p->Lk + chunk - 1) / chunk;
    }
    plan->partial_floats = (size_t)(2 * bq + bq * dv);
    if (plan->head_chunks * plan->q_blocks >= DENSE_ROWS_MIN_READS) {
        plan->dense_k = fused_dense_bytes(p, p->k_s, dk);
        plan->dense_v = fused_dense_bytes(p, p->v_s, dv);
        if (plan->dense_k > DENSE_ROWS_MAX_BYTES - plan->dense_v) plan->dense_k = plan->dense_v = 0;
    }

    size_t at = 0;
#define CARVE(field, nbytes) (plan->field = at, at += round64(nbytes))
    CARVE(off_q, (size_t)(bq * dk) * sizeof(float));
    CARVE(off_qt, (size_t)(dk * bq) * sizeof(float));
    CARVE(off_k, (size_t)(bk * dk) * sizeof(float));
    CARVE(off_v, (size_t)(bk * dv) * sizeof(float));
    CARVE(off_s, (size_t)(bk * bq) * sizeof(float));
    CARVE(off_acc, (size_t)(bq * dv) * sizeof(float));
    CARVE(off_m, bq * sizeof(float));
    CARVE(off_l, bq * sizeof(float));
    CARVE(off_alpha, bq * sizeof(float));
    CARVE(off_lo, bq * sizeof(int64_t));
    CARVE(off_hi, bq * sizeof(int64_t));
    CARVE(off_h, bq * sizeof(int64_t));
    CARVE(off_i, bq * sizeof(int64_t));
    if (p->q_dt == ATTN_BF16 && p->kv_dt == ATTN_BF16)  // the bf16 kernels' packed pairs
        CARVE(off_qp, (size_t)((dk + 1) / 2 * bq) * sizeof(uint32_t));
    if (p->kv_dt == ATTN_BF16 && p->precision == ATTN_PRECISION_FAST)
        CARVE(off_pairs, (size_t)((bk / 2 + 1) * (bq + (dv + 15) / 16 * 16)) * sizeof(uint32_t));
    if (p->weights) {  // the running max after each key tile, (ceil(Lk / bk), bq)
        const int64_t tiles = (p->Lk + bk - 1) / bk;
        if ((uint64_t)tiles > SIZE_MAX / 64 / (size_t)(bq * (int64_t)sizeof(float))) return false;
        CARVE(off_mt, (size_t)(tiles * bq) * sizeof(float));
    }
    if (p->block_table) {  // a paged cache: the rows of a tile that crosses pages, gathered
        CARVE(off_gk, (size_t)(bk * attn_row_bytes(p->kv_dt, dk)));
        CARVE(off_gv, (size_t)(bk * attn_row_bytes(p->kv_dt, dv)));
    }
#undef CARVE
    plan->thread_bytes = at;
    return true;
}

/* Bytes of the split partials, after the threads' slices; 0 without a split. */
static bool partial_bytes(const fused_plan *plan, size_t *bytes) {
    *bytes = 0;
    if (plan->split == 1) return true;
    int64_t units;
    if (__builtin_mul_overflow(plan->items, plan->split, &units)) return false;
    if ((size_t)units > SIZE_MAX / sizeof(float) / plan->partial_floats) return false;
    *bytes = (size_t)units * plan->partial_floats * sizeof(float);
    return true;
}

/* after the threads' slices and the partials: the mask summary (mask_summary.h) */
size_t ai_fused_workspace(const attn_params *p) {
    fused_plan plan;
    size_t partials;
    const size_t summary = ai_mask_summary_bytes(p);
    if (!make_plan(p, &plan) || !partial_bytes(&plan, &partials) || summary == (size_t)-1 ||
        partials > SIZE_MAX / 4 - summary || summary > SIZE_MAX / 4)
        return (size_t)-1;
    /* then the dense K and V (at most DENSE_ROWS_MAX_BYTES), then the summary */
    partials = round64(partials) + round64(plan.dense_k) + round64(plan.dense_v) + summary;
    if ((size_t)p->threads > (SIZE_MAX - 128 - partials) / plan.thread_bytes) return (size_t)-1;
    return (size_t)p->threads * plan.thread_bytes + partials + 64;  // + 64: to align
}

static fused_scratch carve(const fused_plan *plan, char *slice) {
    fused_scratch w = {
        .ld = plan->bq,
        .q = (float *)(slice + plan->off_q),
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
        .h = (int64_t *)(slice + plan->off_h),
        .i = (int64_t *)(slice + plan->off_i),
        .qp = (uint32_t *)(slice + plan->off_qp),
        .pairs = (uint32_t *)(slice + plan->off_pairs),
        .gk = slice + plan->off_gk,
        .gv = slice + plan->off_gv,
        .mt = (float *)(slice + plan->off_mt),
    };
    return w;
}

/* Item t: which rows, filled into w->h / w->i. Items run over (b, g, head chunk, query
 * block), the query blocks from the last: with top-left causal masks the last blocks
 * have the most keys, so dynamic scheduling starts the long items first. */
static fused_block item_rows(const attn_params *p, const fused_plan *plan,
                             const fused_scratch *w, int64_t t) {
    const int64_t qb = plan->q_blocks - 1 - t % plan->q_blocks;
    const int64_t rest = t / plan->q_blocks;
    const int64_t hc = rest % plan->head_chunks, bg = rest / plan->head_chunks;
    fused_block blk = {.b = bg / p->Hkv, .g = bg % p->Hkv};
    const int64_t h0 = blk.g * p->group + hc * plan->heads_per_block;
    const int64_t nh = p->group - hc * plan->heads_per_block < plan->heads_per_block
                           ? p->group - hc * plan->heads_per_block
                           : plan->heads_per_block;
    const int64_t i0 = qb * plan->bq, nrow = p->Lq - i0 < plan->bq ? p->Lq - i0 : plan->bq;
    blk.n = nh * nrow;
    blk.h0 = h0, blk.nh = nh, blk.qb = qb;
    blk.npad = (blk.n + plan->row_pad - 1) / plan->row_pad * plan->row_pad;
    for (int64_t r = 0; r < blk.n; r++) {
        w->h[r] = h0 + r / nrow;
        w->i[r] = i0 + r % nrow;
    }
    blk.lk_b = attn_key_len(p, blk.b);
    /* bfloat16 Q and K with unit stride along Dk: products on bf16 dot products. For a
     * few rows (decoding) the float32 dot-product kernel on converted keys is faster. */
    blk.qk_bf16 = p->q_dt == ATTN_BF16 && p->kv_dt == ATTN_BF16 && p->kernels->qk_bf16 &&
                  p->k_s[3] == 1 && blk.n > 4;
    blk.jmin = INT64_MAX, blk.jmax = 0, blk.lo_max = 0, blk.hi_min = INT64_MAX;
    blk.dense = true;
    for (int64_t r = 0; r < blk.n; r++) {
        attn_row_range(p, blk.lk_b, w->i[r], &w->lo[r], &w->hi[r]);
        /* keys outside the hull of a row's mask and bias are masked: by structure now */
        if (plan->sum)
            blk.dense &= ai_mask_summary_row(p, plan->sum, blk.b, w->h[r], w->i[r], &w->lo[r], &w->hi[r]);
        if (w->lo[r] < w->hi[r]) {
            if (w->lo[r] < blk.jmin) blk.jmin = w->lo[r];
            if (w->hi[r] > blk.jmax) blk.jmax = w->hi[r];
        }
        if (w->lo[r] > blk.lo_max) blk.lo_max = w->lo[r];
        if (w->hi[r] < blk.hi_min) blk.hi_min = w->hi[r];
    }
    return blk;
}

/* The final logits of one tile (S^T layout, keys j0..): structural masks on boundary
 * tiles, then the score function, softcap, bias, ALiBi, the bool mask and the block mask
 * where the call has them, in the order of attn_finish_logit. Row by row, with each row's
 * mask, bias and slope located once: a call with only a bool mask costs a byte test per
 * logit, one with only a block mask a code per 16 keys (and a byte per logit where it is
 * partial). */
static void finish_tile(const attn_params *p, const fused_scratch *w, const fused_block *blk,
                        int64_t nk, int64_t lds, int64_t j0, bool boundary) {
    const bool elementwise = attn_has_elementwise(p);
    const bool mask_only = p->mask && !p->bias && !p->alibi && !(p->softcap > 0.0f) &&
                           !p->block && !p->score_mod;
    const bool block_only = p->block && !p->mask && !p->bias && !p->alibi &&
                            !(p->softcap > 0.0f) && !p->score_mod;
    const int64_t b = blk->b;
    if (mask_only && p->mask_s[3] == 1 && w->h[0] == w->h[blk->n - 1]) {
        /* one head, consecutive rows: the mask's rows are ldm = mask_s[2] apart and its
         * keys contiguous, so the kernel masks the whole tile at once (the keys outside a
         * row's structural range are -inf either way) */
        if (boundary)
            for (int64_t r = 0; r < blk->n; r++)
                for (int64_t c = 0; c < nk; c++)
                    if (j0 + c < w->lo[r] || j0 + c >= w->hi[r]) w->s[c * lds + r] = -INFINITY;
        const uint8_t *m = p->mask + b * p->mask_s[0] + w->h[0] * p->mask_s[1] +
                           w->i[0] * p->mask_s[2] + j0;
        p->kernels->mask_bool(blk->n, nk, m, p->mask_s[2], w->s, lds);
        return;
    }
    for (int64_t r = 0; r < blk->n; r++) {
        float *s_r = w->s + r;  // key c of this row at s_r[c * lds]
        int64_t c_lo = 0, c_hi = nk;
        if (boundary) {  // keys outside [lo, hi) are masked by structure
            c_lo = w->lo[r] - j0 < 0 ? 0 : w->lo[r] - j0 > nk ? nk : w->lo[r] - j0;
            c_hi = w->hi[r] - j0 < c_lo ? c_lo : w->hi[r] - j0 > nk ? nk : w->hi[r] - j0;
            for (int64_t c = 0; c < c_lo; c++) s_r[c * lds] = -INFINITY;
            for (int64_t c = c_hi; c < nk; c++) s_r[c * lds] = -INFINITY;
        }
        if (!elementwise) continue;
        const int64_t h = w->h[r], i = w->i[r];
        if (block_only) {  // the block mask's elements, a run of keys at a time
            ai_block_mask_row(p->block, b, h, i, j0 + c_lo, c_hi - c_lo, s_r + c_lo * lds, lds);
            continue;
        }
        const uint8_t *m = p->mask ? p->mask + b * p->mask_s[0] + h * p->mask_s[1] +
                                         i * p->mask_s[2] + j0 * p->mask_s[3]
                                   : NULL;
        if (mask_only) {  // rows of several heads, or keys not contiguous in the mask
            /* branch-free, as the kernels' mask_bool: -inf's bits where the byte is 0 */
            uint32_t *u_r = (uint32_t *)s_r;
            for (int64_t c = c_lo; c < c_hi; c++) {
                const uint32_t keep = 0u - (uint32_t)(m[c * p->mask_s[3]] != 0);
                u_r[c * lds] = (u_r[c * lds] & keep) | (0xff800000u & ~keep);
            }
            continue;
        }
        const int64_t d_i = attn_diagonal(p, blk->lk_b, i);
        for (int64_t c = c_lo; c < c_hi; c++)
            s_r[c * lds] = attn_finish_logit(p, s_r[c * lds], b, h, i, j0 + c, d_i);
    }
}

/* The logits of the tile at keys j0 .. j0+nk-1, masked: S^T in w->s. */
static void tile_logits(const attn_params *p, const attn_kernels *kern, const fused_scratch *w,
                        const fused_block *blk, int64_t j0, int64_t nk, bool boundary) {
    const int64_t dk = p->Dk;
    const kv_tile kt = fused_kv_rows(p, blk, p->k, p->k_s, dk, j0, nk, w->gk);
    if (blk->qk_bf16) {
        kern->qk_bf16(blk->npad, nk, dk, w->qp, w->ld, (const uint16_t *)kt.data, kt.ld,
                      p->scale, w->s, w->ld);
    } else {
        int64_t ldk;
        const float *k = fused_kv_block(p, blk, false, j0, kern, p->kv_dt, kt, dk, nk,
                                  attn_kv_scale(p->k_scale, p->k_scale_s, blk->g), w->k, &ldk);
        kern->qk(blk->n, blk->npad, nk, dk, w->q, w->qt, w->ld, k, ldk, p->scale, w->s, w->ld);
    }
    if (boundary || attn_has_elementwise(p)) finish_tile(p, w, blk, nk, w->ld, j0, boundary);
}

/* A block of few rows (decoding) does little arithmetic per key and waits on memory. A
 * kernel with a decode entry prefetches itself, each stream during the other's phase (this
 * tile's V while it reads K, the next tile's K while it reads V), a few lines per step of
 * its arithmetic. For the other kernels and for the tiles a mask reaches into, the key
 * and value rows of the tile PREFETCH_TILES ahead are asked for at once by prefetch_tile,
 * into the outer caches (prefetcht2: a tile of K and V is 64 KiB, twice the L1; a burst
 * like this stalls on the miss queue: docs/KERNELS.md). A paged tile across pages
 * (decode_rows) asks for the first RUN_LINES lines of each page run of the next tile, K
 * and V, on top of the kernel's own prefetch (prefetch_runs): the hardware prefetcher
 * restarts at each page, and a run's first lines were the ones that came late; the whole
 * next tile asked for at once did no better than nothing (docs/KERNELS.md, "Paged
 * decoding"). A contiguous tile, or one whose page holds it whole, asks for one line a
 * 4 KiB page of the tile PREFETCH_TILES ahead (prefetch_pages): its page walks (docs/
 * KERNELS.md, "Decoding on 4 KiB pages"). */
enum { PREFETCH_TILES = 2, RUN_LINES = 4 };

/* The addresses of rows j0 .. j0+nk-1 of the block's head in K or V into rows[], for the
 * kernel's decode_rows: one table look-up a page, the page's rows at its stride. */
static void kv_row_addrs(const attn_params *p, const fused_block *blk, const void *base,
                         const int64_t st[4], int64_t j0, int64_t nk, const char **rows) {
    const int64_t step = attn_row_byte_offset(p->kv_dt, st[2]);  // q8_0: a multiple of 32
    for (int64_t c = 0; c < nk;) {
        const char *row = fused_kv_row(p, blk, base, st, j0 + c);
        for (int64_t run = fused_kv_segment(p, j0 + c, nk - c); run > 0; run--, c++, row += step)
            rows[c] = row;
    }
}

/* The K and V rows of keys j0 .. j0+nk-1 asked for, segment by segment (a page's rows at
 * one stride: one table look-up a page), as `how` says: every line of every row
 * (prefetch_tile's burst); the first RUN_LINES lines of each segment, no further than
 * the segment's bytes where its rows lie end to end, else than its first row's
 * (prefetch_runs); or one line in each 4 KiB page of the segment's span (prefetch_pages:
 * its page walks started early, the lines themselves asked for later by the kernel). */
typedef enum { PF_EVERY_LINE, PF_RUN_START, PF_PAGES } prefetch_how;
enum { SMALL_PAGE = 4096 };
static void prefetch_kv(const attn_params *p, const fused_block *blk, int64_t j0, int64_t nk,
                        prefetch_how how) {
    /* a row's bytes from its first: q8_0 rows are contiguous blocks (stride 1) */
    const bool q8 = attn_is_block_dtype(p->kv_dt);
    const int64_t ek = attn_elem_bytes(p->kv_dt);
    const int64_t kb = q8 ? attn_row_bytes(p->kv_dt, p->Dk) : p->Dk * p->k_s[3] * ek;
    const int64_t vb = q8 ? attn_row_bytes(p->kv_dt, p->Dv) : p->Dv * p->v_s[3] * ek;
    const int64_t ks = attn_row_byte_offset(p->kv_dt, p->k_s[2]), vs = attn_row_byte_offset(p->kv_dt, p->v_s[2]);
    for (int64_t c = j0, seg; c < j0 + nk; c += seg) {
        seg = fused_kv_segment(p, c, j0 + nk - c);
        const char *k = fused_kv_row(p, blk, p->k, p->k_s, c), *v = fused_kv_row(p, blk, p->v, p->v_s, c);
        if (how == PF_PAGES) {
            const int64_t kn = (seg - 1) * ks + kb, vn = (seg - 1) * vs + vb;  // the spans' bytes
            for (int64_t x = 0; x < kn; x += SMALL_PAGE) __builtin_prefetch(k + x, 0, 1);
            for (int64_t x = 0; x < vn; x += SMALL_PAGE) __builtin_prefetch(v + x, 0, 1);
        } else if (how == PF_RUN_START) {
            const int64_t kn = ks == kb ? seg * kb : kb, vn = vs == vb ? seg * vb : vb;
            for (int64_t x = 0; x < RUN_LINES * 64; x += 64) {
                if (x < kn) __builtin_prefetch(k + x, 0, 1);
                if (x < vn) __builtin_prefetch(v + x, 0, 1);
            }
        } else {
            for (int64_t r = 0; r < seg; r++, k += ks, v += vs) {
                for (int64_t x = 0; x < kb; x += 64) __builtin_prefetch(k + x, 0, 1);
                for (int64_t x = 0; x < vb; x += 64) __builtin_prefetch(v + x, 0, 1);
            }
        }
    }
}

static void prefetch_tile(const attn_params *p, const fused_block *blk, int64_t j0, int64_t nk) {
    prefetch_kv(p, blk, j0, nk, PF_EVERY_LINE);
}

static void prefetch_runs(const attn_params *p, const fused_block *blk, int64_t j0, int64_t nk) {
    prefetch_kv(p, blk, j0, nk, PF_RUN_START);
}

/* The page walks of a decoding tile PREFETCH_TILES ahead, started while this one
 * computes (a contiguous cache's tiles, and pages that hold a whole tile): a 4 KiB page
 * holds 16 to 64 keys' rows of a head, and under a VM's nested paging each walk is long
 * (docs/KERNELS.md, "Decoding on 4 KiB pages"). */
static void prefetch_pages(const attn_params *p, const fused_block *blk, int64_t j0, int64_t nk) {
    prefetch_kv(p, blk, j0, nk, PF_PAGES);
}

/* Dropout on the tile's probabilities (S^T layout, keys j0..j0+nk-1, rows r < n): a kept
 * one times 1 / (1 - p), a dropped one 0 (philox.h, one Philox call per four keys of a
 * row). After the softmax step, which has summed the undropped P into l; before P·V.
 * Group by group of four keys, the rows innermost: each (row, group) is an independent
 * Philox call, and the rows' calls run side by side in the kernel's `dropout` (philox.h's
 * simd loop compiled at the ISA's width; bit for bit the scalar one), then the row's
 * probabilities of a key, contiguous in S^T, are masked. */
enum { DROP_ROWS = 64 };
static void tile_dropout(const attn_params *p, const attn_kernels *kern, const fused_scratch *w,
                         const fused_block *blk, int64_t j0, int64_t nk) {
    const uint64_t per_row = (attn_drop_keys(p) + 3) / 4, thr = p->drop_threshold;
    const float scale = p->drop_scale;
    const int64_t ld = w->ld;
    uint64_t base[DROP_ROWS], grp[DROP_ROWS];
    uint32_t u[4][DROP_ROWS];
    for (int64_t r0 = 0; r0 < blk->n; r0 += DROP_ROWS) {
        const int64_t nr = blk->n - r0 < DROP_ROWS ? blk->n - r0 : DROP_ROWS;
        for (int64_t r = 0; r < nr; r++)
            base[r] = attn_drop_row(p, blk->b, w->h[r0 + r], w->i[r0 + r]) * per_row;
        for (int64_t g = j0 / 4; g * 4 < j0 + nk; g++) {
            for (int64_t r = 0; r < nr; r++) grp[r] = base[r] + (uint64_t)g;
            if (kern->dropout) kern->dropout(nr, grp, p->drop_seed, p->drop_offset, u[0], DROP_ROWS);
            else attn_dropout_words(nr, grp, p->drop_seed, p->drop_offset, u[0], DROP_ROWS);
            for (int lane = 0; lane < 4; lane++) {
                const int64_t c = g * 4 + lane - j0;
                if (c < 0 || c >= nk) continue;
                float *s_c = w->s + c * ld + r0;
                for (int64_t r = 0; r < nr; r++)
                    s_c[r] = (uint64_t)u[lane][r] >= thr && scale != 0.0f ? s_c[r] * scale : 0.0f;
            }
        }
    }
}

/* The block's query rows as the kernels read them (bfloat16 pairs for qk_bf16; float32
 * rows and their transpose, padding rows 0, for qk and the decoding step), and its
 * running max, sum and accumulator reset. */
static void block_open(const attn_params *p, const attn_kernels *kern, const fused_scratch *w,
                       const fused_block *blk, bool decode) {
    const int64_t dk = p->Dk, n = blk->n, npad = blk->npad;
    if (blk->qk_bf16) {
        /* only the bf16 pairs (2t, 2t+1) of each row are read: with unit stride along Dk
         * they are the row's own 32-bit words (element 2t in the low half) */
        const uint16_t *q16 = (const uint16_t *)p->q;
        for (int64_t r = 0; r < npad; r++) {
            const uint16_t *row = r < n ? q16 + blk->b * p->q_s[0] + w->h[r] * p->q_s[1] +
                                              w->i[r] * p->q_s[2]
                                        : NULL;
            for (int64_t t = 0; t < (dk + 1) / 2; t++) {
                const uint32_t lo = row ? row[2 * t * p->q_s[3]] : 0;
                const uint32_t hi = row && 2 * t + 1 < dk ? row[(2 * t + 1) * p->q_s[3]] : 0;
                w->qp[t * w->ld + r] = lo | hi << 16;
            }
        }
    }
    if (!blk->qk_bf16 || decode) {  // float32 rows: the qk kernels' and the decoding step's
        /* a 16-bit row with unit stride by the kernel's vector conversion (exact, so the
         * same floats): element by element was measurably slower (docs/KERNELS.md) */
        const bool half_rows = (p->q_dt == ATTN_F16 || p->q_dt == ATTN_BF16) && p->q_s[3] == 1;
        const bool f32_rows = p->q_dt == ATTN_F32 && p->q_s[3] == 1;
        for (int64_t r = 0; r < n; r++) {
            const int64_t q_bhi = blk->b * p->q_s[0] + w->h[r] * p->q_s[1] + w->i[r] * p->q_s[2];
            float *q_r = w->q + r * dk;
            if (half_rows) kern->to_f32(p->q_dt, dk, (const uint16_t *)p->q + q_bhi, q_r);
            else if (f32_rows) memcpy(q_r, (const float *)p->q + q_bhi, (size_t)dk * sizeof(float));
            else
                for (int64_t d = 0; d < dk; d++) q_r[d] = attn_load(p->q_dt, p->q, q_bhi + d * p->q_s[3]);
        }
        /* Qᵀ from the rows just packed (in L1), a row of it at a time: the rows read at
         * their stride, Qᵀ written in order; not for a block whose rows qk reads as they
         * are (kernels.h: qk_q_rows) */
        for (int64_t d = 0; n > kern->qk_q_rows && d < dk; d++) {
            float *qt_d = w->qt + d * w->ld;
            for (int64_t r = 0; r < n; r++) qt_d[r] = w->q[r * dk + d];
            for (int64_t r = n; r < npad; r++) qt_d[r] = 0.0f;
        }
    }
    for (int64_t r = 0; r < npad; r++) {
        w->m[r] = -INFINITY;
        w->l[r] = 0.0f;
    }
    memset(w->acc, 0, (size_t)(n * p->Dv) * sizeof(float));
}

/* The paged decoding tiles' K row addresses: a tile's and the next one's, in turn; at the
 * first key of those the next tile finds computed (-1: none). */
typedef struct row_addrs {
    const char *k[2][ATTN_BK_LIMIT];
    int64_t at;
} row_addrs;

/* What a pass over a decoding tile asks for (the decode entry's ask_v and next_k), 4 of
 * the block's rows a pass: the first pass this tile's V (during its Q·Kᵀ) and the next
 * tile's K (during its P·V); the last of several passes the next tile's V and, again,
 * its K; the passes between nothing. The later passes read the tile from the caches, so
 * without asks of their own the read would idle through them (docs/KERNELS.md, "A block
 * of more than 4 rows"). */
typedef struct decode_ask {
    bool next_v;     // the V rows asked for are the next tile's (else this tile's)
    int64_t nv, nk;  // V rows and next-tile K rows asked for (0: none)
} decode_ask;

static decode_ask pass_ask(int64_t r0, int64_t n, int64_t nk, int64_t next_nk) {
    if (r0 == 0) return (decode_ask){false, nk, next_nk};
    if (r0 + 4 >= n) return (decode_ask){true, next_nk, next_nk};
    return (decode_ask){false, 0, 0};
}

/* A clean tile of a decoding block across pages, in one step on its rows' addresses: the
 * arithmetic of the contiguous cache's tile, bit for bit, read in place from the pages.
 * The kernel prefetches V and the next tile's K row by row (pass_ask); the next tile's
 * K addresses are computed once, here, into the other half of ra->k, where the next tile
 * finds them. */
static void tile_decode_rows(const attn_params *p, const attn_kernels *kern,
                             const fused_plan *plan, const fused_scratch *w,
                             const fused_block *blk, int64_t ja, int64_t jb, int64_t j0,
                             int64_t nk, bool fast, row_addrs *ra) {
    const int64_t dk = p->Dk, dv = p->Dv, n = blk->n;
    const char *vr[ATTN_BK_LIMIT], *vn[ATTN_BK_LIMIT];
    const char **kr = ra->k[(j0 - ja) / plan->bk % 2], **kn = ra->k[(j0 - ja) / plan->bk % 2 ^ 1];
    if (ra->at != j0) kv_row_addrs(p, blk, p->k, p->k_s, j0, nk, kr);
    const int64_t j1 = j0 + nk, next_nk = j1 < jb ? (jb - j1 < plan->bk ? jb - j1 : plan->bk) : 0;
    if (next_nk > 0) kv_row_addrs(p, blk, p->k, p->k_s, j1, next_nk, kn);
    ra->at = next_nk > 0 ? j1 : -1;
    kv_row_addrs(p, blk, p->v, p->v_s, j0, nk, vr);
    if (n > 4 && next_nk > 0) kv_row_addrs(p, blk, p->v, p->v_s, j1, next_nk, vn);
    /* and the first lines of each page run of the next tile, K and V: the hardware
     * prefetcher stops at each page (docs/KERNELS.md, "Paged decoding") */
    if (next_nk > 0) prefetch_runs(p, blk, j1, next_nk);
    for (int64_t r0 = 0; r0 < n; r0 += 4) {
        const decode_ask ask = pass_ask(r0, n, nk, next_nk);
        kern->decode_rows(n - r0 < 4 ? n - r0 : 4, nk, dk, dv, w->q + r0 * dk, p->kv_dt, fast,
                          kr, vr, p->scale, attn_kv_scale(p->k_scale, p->k_scale_s, blk->g),
                          attn_kv_scale(p->v_scale, p->v_scale_s, blk->g), w->s, w->m + r0,
                          w->l + r0, w->alpha + r0, w->acc + r0 * dv,
                          ask.next_v ? vn : vr, ask.nv, kn, ask.nk);
    }
}

/* A clean tile of a decoding block in segments of rows at one stride: the whole tile in
 * a contiguous cache or within a page, else (a kernel without decode_rows) page by page,
 * each read in place (a copy of the rows cost more than the extra online-softmax steps:
 * docs/KERNELS.md). The calls on a segment ask for its V and the next segment's K and V
 * as pass_ask says, where there is a next segment (no pointer past the tensor
 * otherwise). */
static void tile_decode(const attn_params *p, const attn_kernels *kern, const fused_plan *plan,
                        const fused_scratch *w, const fused_block *blk, int64_t jb, int64_t j0,
                        int64_t nk, bool fast) {
    const int64_t dk = p->Dk, dv = p->Dv, n = blk->n;
    /* the fp8 scales of the block's key/value head (1 for none and the other dtypes) */
    const float ks = attn_kv_scale(p->k_scale, p->k_scale_s, blk->g);
    const float vs = attn_kv_scale(p->v_scale, p->v_scale_s, blk->g);
    const int64_t pj = j0 + PREFETCH_TILES * plan->bk;
    if (p->block_table && p->page_size < plan->bk) {
        /* small pages: the hardware prefetcher loses the stream at each page, so the rows
         * of the tile PREFETCH_TILES ahead are asked for here too */
        if (pj < jb) prefetch_tile(p, blk, pj, jb - pj < plan->bk ? jb - pj : plan->bk);
    } else if (pj < jb) {
        prefetch_pages(p, blk, pj, jb - pj < plan->bk ? jb - pj : plan->bk);
    }
    for (int64_t s0 = j0, seg; s0 < j0 + nk; s0 += seg) {
        seg = fused_kv_segment(p, s0, j0 + nk - s0);
        const int64_t j1 = s0 + seg;
        const int64_t next_nk = j1 < jb ? fused_kv_segment(p, j1, jb - j1 < plan->bk ? jb - j1 : plan->bk) : 0;
        const char *next_k = next_nk > 0 ? fused_kv_row(p, blk, p->k, p->k_s, j1) : NULL;
        const char *next_v = next_nk > 0 ? fused_kv_row(p, blk, p->v, p->v_s, j1) : NULL;
        const char *k = fused_kv_row(p, blk, p->k, p->k_s, s0), *v = fused_kv_row(p, blk, p->v, p->v_s, s0);
        for (int64_t r0 = 0; r0 < n; r0 += 4) {
            const decode_ask ask = pass_ask(r0, n, seg, next_nk);
            kern->decode(n - r0 < 4 ? n - r0 : 4, seg, dk, dv, w->q + r0 * dk, p->kv_dt, fast, k,
                         p->k_s[2], v, p->v_s[2], p->scale, ks, vs, w->s, w->m + r0, w->l + r0,
                         w->alpha + r0, w->acc + r0 * dv, ask.next_v ? next_v : v, ask.nv,
                         next_k, ask.nk);
        }
    }
}

/* Any other tile: the logits (pt's masks and options), the online softmax, dropout and
 * the weights where asked, then P·V (FAST's bfloat16 products where they apply). */
static void tile_general(const attn_params *p, const attn_params *pt, const attn_kernels *kern,
                         const fused_plan *plan, const fused_scratch *w, const fused_block *blk,
                         int64_t jb, int64_t j0, int64_t nk, bool boundary, bool clean, bool fast) {
    const int64_t dv = p->Dv, n = blk->n, npad = blk->npad;
    const int64_t pj = j0 + PREFETCH_TILES * plan->bk;
    if (n <= 4 && pj < jb) prefetch_tile(p, blk, pj, jb - pj < plan->bk ? jb - pj : plan->bk);
    tile_logits(pt, kern, w, blk, j0, nk, boundary);
    if (fast && clean && kern->pv_bf16 && p->v_s[3] == 1 && !p->dropout) {
        const kv_tile vt = fused_kv_rows(p, blk, p->v, p->v_s, dv, j0, nk, w->gv);
        const uint16_t *v = (const uint16_t *)vt.data;
        const float *probs = w->s;
        if (p->weights) {  // P kept in s for the weights: the same O (kernels.h)
            kern->softmax(npad, nk, w->s, w->ld, w->m, w->l, w->alpha);
            fused_tile_weights(p, plan, w, blk, j0, nk);
        } else if (kern->softmax_pairs) {  // P rounded to pairs as it is computed
            kern->softmax_pairs(npad, nk, w->s, w->ld, w->m, w->l, w->alpha, w->pairs, npad);
            probs = NULL;
        } else {
            kern->softmax(npad, nk, w->s, w->ld, w->m, w->l, w->alpha);
        }
        kern->pv_bf16(n, npad, nk, dv, probs, w->ld, v, vt.ld, w->alpha, w->acc, dv, w->pairs);
        return;
    }
    kern->softmax(npad, nk, w->s, w->ld, w->m, w->l, w->alpha);
    if (p->dropout) tile_dropout(p, kern, w, blk, j0, nk);
    if (p->weights) fused_tile_weights(p, plan, w, blk, j0, nk);
    if (fast)  // the same rounding where the bf16 kernel does not apply
        for (int64_t c = 0; c < nk; c++)
            for (int64_t r = 0; r < n; r++)
                w->s[c * w->ld + r] = attn_bf16_to_f32(attn_f32_to_bf16(w->s[c * w->ld + r]));
    const kv_tile vt = fused_kv_rows(p, blk, p->v, p->v_s, dv, j0, nk, w->gv);
    if (kern->pv_h && (p->kv_dt == ATTN_BF16 || p->kv_dt == ATTN_F16) && vt.es == 1) {
        /* 16-bit values converted as pv reads them (its own zero-skipping test covers a
         * dropped weight's V too) */
        kern->pv_h(n, npad, nk, dv, w->s, w->ld, p->kv_dt, (const uint16_t *)vt.data, vt.ld,
                   w->alpha, w->acc, dv, !clean || p->dropout);
        return;
    }
    int64_t ldv;
    const float *v = fused_kv_block(p, blk, true, j0, kern, p->kv_dt, vt, dv, nk,
                              attn_kv_scale(p->v_scale, p->v_scale_s, blk->g), w->v, &ldv);
    /* a dropped weight is 0, like a masked one: it must not multiply its V either, which
     * matters only where the value block holds a NaN or Inf (0 · v = 0 exactly otherwise),
     * so a clean tile tests the block first (nk·Dv, beside pv's n·nk·Dv) */
    const bool skip = !clean || (p->dropout && !attn_rows_finite(v, ldv, nk, dv));
    kern->pv(n, npad, nk, dv, w->s, w->ld, v, ldv, w->alpha, w->acc, dv, skip);
}

/* The online softmax over keys [ja, jb) of a block, into w->m, w->l, w->acc: each tile
 * the mask leaves anything of, narrowed where its rows all mask its ends, on the decoding
 * step where the block and tile allow, else the general tile. */
static void block_sweep(const attn_params *p, const attn_kernels *kern, const fused_plan *plan,
                        const fused_scratch *w, const fused_block *blk, int64_t ja,
                        int64_t jb) {
    const bool decode = fused_takes_decode(plan->open ? plan->open : p, kern, blk->n);
    block_open(p, kern, w, blk, decode);
    /* FAST precision on a bfloat16 V: P is rounded to bfloat16 for P·V */
    const bool fast = p->precision == ATTN_PRECISION_FAST && p->kv_dt == ATTN_BF16;
    row_addrs ra;
    ra.at = -1;
    for (int64_t jt = ja; jt < jb; jt += plan->bk) {
        int64_t j0 = jt, nk = jb - jt < plan->bk ? jb - jt : plan->bk;
        const attn_params *pt = fused_tile_params(p, plan, blk, j0, nk);
        if (!pt) continue;
        /* a mixed tile without the granules its rows all mask at either end (a block
         * mask's window edge, a document boundary inside the tile); not for a block of
         * few rows, whose tiles keep the decoding step's tiling */
        if (pt == p && plan->sum && !decode && fused_tile_trim(p, plan, blk, &j0, &nk))
            pt = fused_tile_params(p, plan, blk, j0, nk);
        const bool boundary = j0 < blk->lo_max || j0 + nk > blk->hi_min;
        /* a bool mask, a bias, a block mask or a score function can mask any key: their
         * tiles skip zero weights */
        const bool clean = !boundary && !pt->mask && !pt->bias && !pt->block && !pt->score_mod;
        if (decode && clean && kern->decode_rows && !attn_kv_one_run(p, j0, nk))
            tile_decode_rows(p, kern, plan, w, blk, ja, jb, j0, nk, fast, &ra);
        else if (decode && clean)
            tile_decode(p, kern, plan, w, blk, jb, j0, nk, fast);
        else
            tile_general(p, pt, kern, plan, w, blk, jb, j0, nk, boundary, clean, fast);
    }
}

/* O (and LSE) of a block from its m, l, acc: one division per element; a fully masked
 * row (m = -inf) is 0 with LSE -inf. */
static void block_store(const attn_params *p, const fused_block *blk, const float *m,
                        const float *l, const float *acc, const int64_t *h, const int64_t *i) {
    const int64_t dv = p->Dv;
    for (int64_t r = 0; r < blk->n; r++) {
        const bool masked_row = m[r] == -INFINITY;
        const int64_t o_bhi = blk->b * p->o_s[0] + h[r] * p->o_s[1] + i[r] * p->o_s[2];
        const float *acc_r = acc + r * dv;
        if (p->o_dt == ATTN_F32 && p->o_s[3] == 1) {  // a float32 row in place, vectorized
            float *o_r = (float *)p->o + o_bhi;
            const float l_r = l[r];
            if (masked_row)
                memset(o_r, 0, (size_t)dv * sizeof(float));
            else
#pragma omp simd
                for (int64_t d = 0; d < dv; d++) o_r[d] = acc_r[d] / l_r;
        } else if ((p->o_dt == ATTN_F16 || p->o_dt == ATTN_BF16) && p->o_s[3] == 1 &&
                   p->kernels->from_f32) {
            /* a 16-bit row with unit stride: the same quotients, a chunk at a time, rounded
             * by the kernel's vector form of attn_store's rounding (bit for bit), cheaper
             * than element by element (docs/KERNELS.md) */
            enum { CHUNK = 64 };
            float quot[CHUNK];
            uint16_t *o_r = (uint16_t *)p->o + o_bhi;
            const float l_r = l[r];
            for (int64_t d0 = 0; d0 < dv; d0 += CHUNK) {
                const int64_t nd = dv - d0 < CHUNK ? dv - d0 : CHUNK;
                if (masked_row)
                    memset(quot, 0, sizeof quot);
                else
#pragma omp simd
                    for (int64_t t = 0; t < nd; t++) quot[t] = acc_r[d0 + t] / l_r;
                p->kernels->from_f32(p->o_dt, nd, quot, o_r + d0);
            }
        } else {
            for (int64_t d = 0; d < dv; d++)
                attn_store(p->o_dt, p->o, o_bhi + d * p->o_s[3], masked_row ? 0.0f : acc_r[d] / l[r]);
        }
        if (p->lse)
            p->lse[blk->b * p->lse_s[0] + h[r] * p->lse_s[1] + i[r] * p->lse_s[2]] =
                masked_row ? -INFINITY : m[r] + logf(l[r]);
    }
}

/* Merge the chunks of a split item in chunk order (merge.h: a chunk with m_c = -inf holds
 * nothing, a NaN m_c makes the row NaN), into w->m, w->l, w->acc. */
static void merge_partials(const attn_params *p, const fused_plan *plan, const fused_block *blk,
                           const float *part, const fused_scratch *w) {
    const int64_t dv = p->Dv, pf = (int64_t)plan->partial_floats;
    const float *x[SPLIT_MAX];
    for (int64_t r = 0; r < blk->n; r++) {
        for (int64_t c = 0; c < plan->split; c++) x[c] = part + c * pf + 2 * plan->bq + r * dv;
        w->m[r] = ai_merge_row(plan->split, part + r, pf, part + plan->bq + r, pf, x, NULL, dv,
                               w->acc + r * dv, &w->l[r]);
    }
}

/* The sinks of the block's rows folded into their final (m, l, acc) (merge.h), before
 * the store and the weights read them: both then see the denominator with the sink. */
static void fold_sinks(const attn_params *p, const fused_block *blk, const fused_scratch *w) {
    for (int64_t r = 0; r < blk->n; r++)
        ai_merge_sink(&w->m[r], &w->l[r], w->acc + r * p->Dv, p->Dv, attn_sink(p, w->h[r]));
}

/* One unit of the forward's work: a block whole (then its store and weights), or one
 * chunk of a split block (then its partial). */
static void fused_unit(const attn_params *p, const fused_plan *plan, const fused_scratch *w,
                       float *part, int64_t u) {
    const attn_kernels *kern = p->kernels;
    const fused_block blk = item_rows(p, plan, w, u / plan->split);
    if (plan->split == 1) {
        block_sweep(p, kern, plan, w, &blk, blk.jmin, blk.jmax);
        if (p->sinks) fold_sinks(p, &blk, w);
        block_store(p, &blk, w->m, w->l, w->acc, w->h, w->i);
        if (p->weights) fused_block_weights(p, kern, plan, w, &blk);
        return;
    }
    /* one chunk of a split item: its keys within the block's range */
    const int64_t c = u % plan->split;
    int64_t ja = c * plan->split_keys, jb = ja + plan->split_keys;
    if (ja < blk.jmin) ja = blk.jmin;
    if (jb > blk.jmax) jb = blk.jmax;
    block_sweep(p, kern, plan, w, &blk, ja, ja < jb ? jb : ja);
    float *pc = part + (size_t)u * plan->partial_floats;
    memcpy(pc, w->m, plan->bq * sizeof(float));
    memcpy(pc + plan->bq, w->l, plan->bq * sizeof(float));
    memcpy(pc + 2 * plan->bq, w->acc, (size_t)(blk.n * p->Dv) * sizeof(float));
}

/* A split item's chunks merged, then stored */
static void fused_merge(const attn_params *p, const fused_plan *plan, const fused_scratch *w,
                        const float *part, int64_t t) {
    const fused_block blk = item_rows(p, plan, w, t);
    merge_partials(p, plan, &blk, part + (size_t)(t * plan->split) * plan->partial_floats, w);
    if (p->sinks) fold_sinks(p, &blk, w);
    block_store(p, &blk, w->m, w->l, w->acc, w->h, w->i);
}

/* The forward's work: for one thread of the team (team: its loops shared by the team's
 * worksharing), or all of it on the calling thread, with no OpenMP construct at all: a
 * parallel region with its if clause false still ran its loops' barriers, and libgomp
 * wakes a futex at each even in a team of one (0.6 us of a 3.3 us call: docs/KERNELS.md,
 * "Threads for tiny calls"). Not orphaned worksharing either: called from inside the
 * caller's own parallel region, that would bind to the caller's team. */
static void fused_run(const attn_params *given, const attn_params *p, const fused_plan *plan,
                      char *base, float *part, bool team) {
    const fused_scratch w = carve(plan, base + (size_t)(team ? attn_thread_num() : 0) *
                                                   plan->thread_bytes);
    const int64_t copies = p != given ? 2 * p->B * p->Hkv : 0, units = plan->items * plan->split;
    const int64_t merges = plan->split > 1 ? plan->items : 0;
    if (team) {  // each loop where it has work: an empty one would still be a barrier
        if (copies > 0) {
#pragma omp for schedule(static)
            for (int64_t s = 0; s < copies; s++) fused_dense_copy(given, p, s);
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t u = 0; u < units; u++) fused_unit(p, plan, &w, part, u);
        if (merges > 0) {
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < merges; t++) fused_merge(p, plan, &w, part, t);
        }
    } else {
        for (int64_t s = 0; s < copies; s++) fused_dense_copy(given, p, s);
        for (int64_t u = 0; u < units; u++) fused_unit(p, plan, &w, part, u);
        for (int64_t t = 0; t < merges; t++) fused_merge(p, plan, &w, part, t);
    }
}

attn_status ai_fused_forward(const attn_params *given, void *ws) {
    fused_plan plan;
    size_t partials;
    make_plan(given, &plan);  // cannot fail: the workspace query succeeded with the same p
    partial_bytes(&plan, &partials);
    char *base = (char *)(((uintptr_t)ws + 63) & ~(uintptr_t)63);
    float *part = (float *)(base + (size_t)given->threads * plan.thread_bytes);
    char *dense_at = (char *)part + round64(partials);
    attn_params dense;
    const attn_params *p =
        fused_dense_params(given, &plan, dense_at, dense_at + round64(plan.dense_k), &dense);
    attn_mask_summary sum;
    attn_params open;
    /* key padding reaches here as key lengths already (ai_key_padding, mask_summary.h) */
    if (p->mask || p->bias || p->block) {
        ai_mask_summary_init(p, dense_at + round64(plan.dense_k) + round64(plan.dense_v), &sum);
        open = *p;
        open.mask = NULL;
        open.bias = NULL;
        open.block = NULL;
        plan.sum = &sum;
        plan.open = &open;
    }
    if (attn_run_parallel(p, 1.0)) {  // team.h
#pragma omp parallel num_threads(p->threads)
        fused_run(given, p, &plan, base, part, true);
    } else {
        fused_run(given, p, &plan, base, part, false);
    }
    return ATTN_OK;
}
