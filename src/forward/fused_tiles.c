/*
 * fused_tiles.c — what the fused forward and its weights sweep (fused.c, fused_weights.c)
 *                 ask of a tile before computing it: the params it is computed with under
 *                 the mask summary (fused_tile_params: open, mixed or skipped), the
 *                 address of a key or value row in a contiguous or paged cache
 *                 (fused_kv_row, fused_kv_segment) and whether a block of few rows takes
 *                 the kernels' one-pass decoding step (fused_takes_decode). fused_plan.h
 *                 declares them.
 *
 * What it is not: the tile's arithmetic (fused.c, the kernels) or the plan's sizes
 * (fused_geom.c).
 */
#include "fused_plan.h"
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
