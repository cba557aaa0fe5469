/*
 * fused_tiles.c — what the fused forward and its weights sweep (fused.c, fused_weights.c)
 *                 ask of a tile before computing it: the params it is computed with under
 *                 the mask summary (fused_tile_params: open, mixed or skipped), the
 *                 address of a key or value row in a contiguous or paged cache
 *                 (fused_kv_row, fused_kv_segment), a tile's rows as the kernels read
 *                 them (fused_kv_rows: in place or gathered from pages; fused_kv_block: as
 *                 float32) and whether a block of few rows takes the kernels' one-pass
 *                 decoding step (fused_takes_decode). fused_plan.h declares them.
 *
 * What it is not: the tile's arithmetic (fused.c, the kernels) or the plan's sizes
 * (fused_geom.c).
 */
#include <string.h>

#include "fused_plan.h"
#include "core/dense_rows.h"
#include "core/half.h"
#include "kernels/kernels.h"
#include "mask_summary.h"

/* The params tile j0 .. j0+nk-1 of a block is computed with: p itself where the mask or
 * the bias is mixed in the tile, p without them where they leave it open (a block whose
 * rows are all dense, or a tile of open cells), NULL where they mask every key of every
 * row (the tile is skipped: it would add exp(-inf) = 0 to each row). */
const attn_params *fused_tile_params(const attn_params *p, const fused_plan *plan,
                                     const fused_block *blk, int64_t j0, int64_t nk) {
    if (!plan->sum) return p;
    if (blk->dense) return plan->open;
    /* the summary's blocks are ATTN_SUM_ROWS rows and the plan's bq rows (fused_geom.c):
     * the tile is open (masked) where it is so in every summary block its rows reach */
    const int64_t i0 = blk->qb * plan->bq, i1 = i0 + blk->n / blk->nh;
    attn_tile_class cls = ATTN_TILE_MIXED;
    for (int64_t sb = i0 / ATTN_SUM_ROWS; sb * ATTN_SUM_ROWS < i1; sb++) {
        const attn_tile_class c =
            ai_mask_summary_tile(p, plan->sum, blk->b, blk->h0, blk->nh, sb, j0, nk);
        if (sb > i0 / ATTN_SUM_ROWS && c != cls) return p;
        cls = c;
    }
    switch (cls) {
    case ATTN_TILE_MASKED: return NULL;
    case ATTN_TILE_OPEN: return plan->open;
    default: return p;
    }
}

/* Row j of the block's key/value head in K or V (base, strides st), as the bytes the
 * decoding entries take. */
const char *fused_kv_row(const attn_params *p, const fused_block *blk, const void *base,
                         const int64_t st[4], int64_t j) {
    return (const char *)base + attn_row_byte_offset(p->kv_dt, attn_kv_offset(p, st, blk->b, blk->g, j));
}

/* Of the nk >= 1 keys from j, how many lie at one stride from row j: all of them in a
 * contiguous cache, those up to the end of j's page in a paged one. */
int64_t fused_kv_segment(const attn_params *p, int64_t j, int64_t nk) {
    if (!p->block_table) return nk;
    const int64_t run = p->page_size - j % p->page_size;
    return run < nk ? run : nk;
}

/* A block of a few rows (decoding) on a kernel that has the one-pass decoding step: up to
 * 4 rows a call, so a block of up to ATTN_DECODE_MAX_ROWS rows (the query heads of a GQA
 * group) takes several calls on each clean tile, the tile then in the cache for all but
 * the first. */
bool fused_takes_decode(const attn_params *p, const attn_kernels *kern, int64_t n) {
    /* q8_0, q4_0 and fp8 (with its scales or without) where the kernel's step reads them;
     * else (u4 always) the tile path (kv_block dequantizes) */
    return kern->decode && kern->decode_qk && n <= ATTN_DECODE_MAX_ROWS &&
           (p->kv_dt != ATTN_Q8_0 || kern->decode_q8_0) &&
           (!attn_is_fp8(p->kv_dt) || kern->decode_fp8) &&
           p->kv_scale_folds &&  // e4m3 scales above 2^100: the tiles (params.c)
           (p->kv_dt != ATTN_Q4_0 || kern->decode_q4_0) &&
           p->kv_dt != ATTN_U4 &&  // no kernel's step reads u4: its scales are per key
           !attn_has_elementwise(p) &&
           !p->dropout && p->k_s[3] == 1 && p->v_s[3] == 1;
}

/* Whether keys j .. j+n-1 are masked for every row of the block (fused_tile_params' NULL) */
static bool keys_masked(const attn_params *p, const fused_plan *plan, const fused_block *blk,
                        int64_t j, int64_t n) {
    return fused_tile_params(p, plan, blk, j, n) == NULL;
}

bool fused_tile_trim(const attn_params *p, const fused_plan *plan, const fused_block *blk,
                     int64_t *j0, int64_t *nk) {
    int64_t a = *j0, e = *j0 + *nk;
    for (;;) {  // from the front, a granule (or what of it the tile holds) at a time
        const int64_t g = (a / ATTN_SUM_KEYS + 1) * ATTN_SUM_KEYS, to = g < e ? g : e;
        if (to >= e || !keys_masked(p, plan, blk, a, to - a)) break;
        a = to;
    }
    for (;;) {  // from the back
        const int64_t g = (e - 1) / ATTN_SUM_KEYS * ATTN_SUM_KEYS, from = g > a ? g : a;
        if (from <= a || !keys_masked(p, plan, blk, from, e - from)) break;
        e = from;
    }
    if (a == *j0 && e == *j0 + *nk) return false;
    *j0 = a;
    *nk = e - a;
    return true;
}

/* Rows j0 .. j0+nk-1 (nk >= 1) of the block's head (b, g) in K or V (base, strides st,
 * rows of `width` elements): in place when they lie at one stride (a contiguous cache,
 * or a tile within one page: the pages' own memory, no copy), else gathered page by page
 * into gbuf as nk dense rows. The values are the same either way, so a paged call
 * computes what the contiguous one does on the same tiles, bit for bit. */
kv_tile fused_kv_rows(const attn_params *p, const fused_block *blk, const void *base,
                      const int64_t st[4], int64_t width, int64_t j0, int64_t nk, char *gbuf) {
    const attn_dtype dt = p->kv_dt;
    const int64_t ek = attn_elem_bytes(dt), rb = attn_row_bytes(dt, width);  // q8_0: blocks
    if (attn_kv_one_run(p, j0, nk))
        return (kv_tile){(const char *)base +
                             attn_row_byte_offset(dt, attn_kv_offset(p, st, blk->b, blk->g, j0)),
                         st[2], st[3]};
    for (int64_t c = 0; c < nk;) {
        const int64_t j = j0 + c;
        int64_t run = p->page_size - j % p->page_size;  // rows left in j's page
        if (run > nk - c) run = nk - c;
        const int64_t at = attn_kv_offset(p, st, blk->b, blk->g, j);
        if (st[3] == 1 && st[2] == width) {  // the run's rows are one block: one copy
            memcpy(gbuf + c * rb, (const char *)base + attn_row_byte_offset(dt, at), (size_t)(run * rb));
            c += run;
            continue;
        }
        for (int64_t r = 0; r < run; r++, c++) {
            char *dst = gbuf + c * rb;
            const char *row = (const char *)base + attn_row_byte_offset(dt, at + r * st[2]);
            if (st[3] == 1) {
                memcpy(dst, row, (size_t)rb);
            } else {
                for (int64_t d = 0; d < width; d++) memcpy(dst + d * ek, row + d * st[3] * ek, (size_t)ek);
            }
        }
    }
    return (kv_tile){gbuf, width, 1};
}

/* The conversion of a block of nk rows (t, as fused_kv_rows gives them) to float32: t itself
 * when it is float32 with unit element stride, else converted into buf (the kernel's
 * vector conversion for 16-bit rows with unit element stride). *ld gets the row stride.
 * scale is the rows' fp8 scale (attn_kv_scale; 1 for the other dtypes, not read). A u4
 * cache's rows are keys j0 .. j0+nk-1 of the block's head, of V when values, each read
 * with its own scales and zeros (ai_u4_row). */
const float *fused_kv_block(const attn_params *p, const fused_block *blk, bool values,
                             int64_t j0, const attn_kernels *kern, attn_dtype dt, kv_tile t,
                             int64_t width, int64_t nk, float scale, float *buf, int64_t *ld) {
    *ld = width;
    if (dt == ATTN_U4) {  // unit stride along the row, rows on block starts (params.c)
        for (int64_t c = 0; c < nk; c++)
            ai_u4_row(p, values, blk->b, blk->g, j0 + c,
                      (const uint8_t *)t.data + attn_row_byte_offset(dt, c * t.ld), width,
                      buf + c * width);
        return buf;
    }
    if (attn_is_fp8(dt)) {
        /* the 256 values a byte can stand for, fl32(fp8 * scale) each (attn.h), then one
         * look-up an element: the same value as converting each one, for 256 products a
         * tile instead of nk * width */
        float val[256];
        for (int x = 0; x < 256; x++) val[x] = attn_fp8_to_f32(dt, (uint8_t)x) * scale;
        for (int64_t c = 0; c < nk; c++) {
            const uint8_t *row = (const uint8_t *)t.data + c * t.ld;
            for (int64_t d = 0; d < width; d++) buf[c * width + d] = val[row[d * t.es]];
        }
        return buf;
    }
    if (attn_is_block_dtype(dt)) {  // unit stride along the row, rows on block starts (params.c)
        void (*deq)(int64_t, const uint8_t *, float *) =
            dt == ATTN_Q4_0 ? ai_dequant_q4_0_blocks  // the portable one: no kernel has its own
            : kern->dequant_q8_0 ? kern->dequant_q8_0 : ai_dequant_q8_0_blocks;
        for (int64_t c = 0; c < nk; c++)
            deq(width / 32, (const uint8_t *)t.data + attn_row_byte_offset(dt, c * t.ld),
                buf + c * width);
        return buf;
    }
    if (t.es == 1) {
        if (dt == ATTN_F32) {
            *ld = t.ld;
            return (const float *)t.data;
        }
        for (int64_t c = 0; c < nk; c++)
            kern->to_f32(dt, width, (const uint16_t *)t.data + c * t.ld, buf + c * width);
        return buf;
    }
    for (int64_t c = 0; c < nk; c++)
        for (int64_t d = 0; d < width; d++)
            buf[c * width + d] = attn_load(dt, t.data, c * t.ld + d * t.es);
    return buf;
}

/* Bytes of the dense copy of K or V (strides st, rows of d elements) as (B, Hkv, Lk, d):
 * 0 where its rows are read in place — a paged cache, a block dtype, or as
 * ai_dense_rows_bytes says (core/dense_rows.h). */
size_t fused_dense_bytes(const attn_params *p, const int64_t st[4], int64_t d) {
    if (p->block_table || attn_is_block_dtype(p->kv_dt)) return 0;
    return ai_dense_rows_bytes(st, attn_elem_bytes(p->kv_dt), p->B, p->Hkv, p->Lk, d);
}

/* Slice s of the 2 * B * Hkv slices of K and V (K's first) copied from the caller's
 * tensors (given) into the dense ones of run (the same params but for K's and V's data
 * and strides) where the plan copies them. */
void fused_dense_copy(const attn_params *given, const attn_params *run, int64_t s) {
    const int64_t n = given->B * given->Hkv, es = attn_elem_bytes(given->kv_dt);
    if (s < n && run->k != given->k)
        ai_dense_rows_copy(given->k, given->k_s, es, given->Hkv, given->Lk, given->Dk,
                           (void *)run->k, s);
    if (s >= n && run->v != given->v)
        ai_dense_rows_copy(given->v, given->v_s, es, given->Hkv, given->Lk, given->Dv,
                           (void *)run->v, s - n);
}

/* The params the sweep reads: given itself, or a copy in *dense whose K and V (those the
 * plan copies) are (B, Hkv, Lk, D) at at_k and at_v in the workspace */
const attn_params *fused_dense_params(const attn_params *given, const fused_plan *plan,
                                      char *at_k, char *at_v, attn_params *dense) {
    if (!plan->dense_k && !plan->dense_v) return given;
    *dense = *given;
    if (plan->dense_k) {
        dense->k = at_k;
        ai_dense_rows_strides(given->Hkv, given->Lk, given->Dk, dense->k_s);
    }
    if (plan->dense_v) {
        dense->v = at_v;
        ai_dense_rows_strides(given->Hkv, given->Lk, given->Dv, dense->v_s);
    }
    return dense;
}
