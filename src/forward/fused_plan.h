/*
 * fused_plan.h — what the fused forward's two files share (fused.c, fused_weights.c):
 * the plan that cuts a call into work items, a thread's scratch, one block of query rows,
 * and the few helpers both call. Internal to the library; the kernels never see it.
 */
#ifndef ATTN_FUSED_PLAN_H
#define ATTN_FUSED_PLAN_H

#include "core/attn_internal.h"
#include "kernels/kernels.h"
#include "mask_summary.h"

/* Tile sizes, from the kernel's geometry (kernels/list.h) by ai_choose_tiles
 * (fused_geom.c): bq query rows share each key block; bk keys per block, chosen so that a
 * key and a value block together, in their own dtype, stay near 64 KiB (a Zen 4 core has
 * 32 KiB of L1d and 1 MiB of L2), within the kernel's [bk_min, bk_max]. Key splitting for decoding-shaped
 * calls (Lq <= SPLIT_MAX_LQ): chunks of SPLIT_LONG_KEYS keys or more, since every chunk
 * starts its K and V streams cold (short chunks move fewer bytes a second:
 * docs/KERNELS.md); shorter, down to SPLIT_MIN_KEYS, only where the
 * call would otherwise have fewer than SPLIT_UNITS pieces of work; at most SPLIT_MAX. */
enum {
    SPLIT_MAX_LQ = 16, SPLIT_MAX = 16, SPLIT_MIN_KEYS = 1024, SPLIT_LONG_KEYS = 4096,
    SPLIT_UNITS = 16,
};
_Static_assert(SPLIT_MAX == ATTN_TUNE_SPLIT_MAX, "a tuned split is bounded by SPLIT_MAX");
_Static_assert(SPLIT_MAX_LQ == ATTN_DECODE_MAX_ROWS, "the tuner's decoding class is the split's");

/* The forward's tile sizes: ai_choose_tiles(kern, ATTN_TILES_FORWARD, ...) (kernels.h,
 * fused_geom.c): bq a multiple of the kernel's row_pad in [16, ATTN_FWD_BQ_LIMIT], bk in
 * [1, ATTN_BK_LIMIT]; the same for every call of a process. */

/* How a call is cut into work: fixed by the shapes alone, never by the thread count. */
typedef struct fused_plan {
    int64_t bq, row_pad;      // the kernel's: rows per block, their padding
    int64_t bk;
    int64_t heads_per_block;  // query heads stacked in one block (1 when Lq >= bq)
    int64_t head_chunks;      // blocks per key/value head along the query heads
    int64_t q_blocks;         // blocks along Lq
    int64_t items;            // B * Hkv * head_chunks * q_blocks
    int64_t split;            // key chunks per item (1 = no split)
    int64_t split_keys;       // keys per chunk, a multiple of bk
    size_t thread_bytes;      // one thread's slice, a multiple of 64 bytes
    size_t partial_floats;    // one (item, chunk)'s saved m, l and acc
    size_t off_q, off_qt, off_k, off_v, off_s, off_acc, off_m, off_l, off_alpha;
    size_t off_lo, off_hi, off_h, off_i, off_qp, off_pairs, off_gk, off_gv;
    size_t off_mt;            // with weights: each tile's running max of each row
    /* K's, V's dense copies after the partials, in bytes (0: read in place): rows not
     * adjacent, each read by DENSE_ROWS_MIN_READS blocks or more (core/dense_rows.h) */
    size_t dense_k, dense_v;
    /* the call's bool mask and bias, summarized once (mask_summary.h), and the params
     * without them, for the tiles they leave open; both NULL without mask or bias */
    const attn_mask_summary *sum;
    const attn_params *open;
} fused_plan;

/* One thread's scratch, carved from its slice of the workspace. */
typedef struct fused_scratch {
    int64_t ld;    // bq: the row stride of qt, s and qp (the plan's rows per block)
    float *q;      // (bq, Dk)   the query rows, row-major
    float *qt;     // (Dk, bq)   the same, transposed, padding rows zero
    float *k;      // (bk, Dk)   the key block, when K must be packed
    float *v;      // (bk, Dv)   the value block, when V must be packed
    float *s;      // (bk, bq)   logits, then probabilities, transposed
    float *acc;    // (bq, Dv)   unnormalized output
    float *m, *l, *alpha;  // (bq)
    int64_t *lo, *hi;      // (bq) each row's structural key range
    int64_t *h, *i;        // (bq) each row's query head and row index
    uint32_t *qp;          // (ceil(Dk/2), bq) bf16 query pairs, for qk_bf16
    uint32_t *pairs;       // the packed P and V pairs of pv_bf16
    char *gk, *gv;         // (bk, Dk), (bk, Dv) in the cache's dtype: a paged tile's rows
    float *mt;             // (tiles, bq) with weights: m after each tile of the sweep
} fused_scratch;

/* One block of query rows: batch b, key/value head g, rows r = 0..n-1 with query head
 * w->h[r] and row index w->i[r]; its key range and which keys need no structural mask. */
typedef struct fused_block {
    int64_t b, g, n, npad, lk_b;
    int64_t h0, nh, qb;      // query heads h0 .. h0+nh-1, query block qb
    bool dense;              // every row's mask and bias open on its whole range
    int64_t jmin, jmax;      // union of the rows' ranges
    int64_t lo_max, hi_min;  // [lo_max, hi_min): keys every row may read
    bool qk_bf16;            // Q·Kᵀ on the kernel's bf16 dot products
} fused_block;

/* A tile's key or value rows in the cache's own dtype: row c at data + c * ld elements,
 * element d of a row at + d * es. */
typedef struct kv_tile {
    const char *data;
    int64_t ld, es;
} kv_tile;

/* fused_tiles.c: the params a tile is computed with (NULL: every key of every row masked);
 * row j of the block's key/value head as bytes; the keys from j at one stride; whether a
 * block of n rows takes the kernel's one-pass decoding step. */
const attn_params *fused_tile_params(const attn_params *p, const fused_plan *plan,
                                     const fused_block *blk, int64_t j0, int64_t nk);
const char *fused_kv_row(const attn_params *p, const fused_block *blk, const void *base,
                         const int64_t st[4], int64_t j);
int64_t fused_kv_segment(const attn_params *p, int64_t j, int64_t nk);
bool fused_takes_decode(const attn_params *p, const attn_kernels *kern, int64_t n);
/* fused_tiles.c: K and V copied dense for a prefill (fused_plan.dense_k): the bytes
 * of one copy (0 = read in place), slice s of the 2 * B * Hkv slices copied from the
 * caller's tensors (given) to run's, and the params the sweep reads (given, or *dense
 * with K and V at at_k, at_v) */
size_t fused_dense_bytes(const attn_params *p, const int64_t st[4], int64_t d);
void fused_dense_copy(const attn_params *given, const attn_params *run, int64_t s);
const attn_params *fused_dense_params(const attn_params *given, const fused_plan *plan,
                                      char *at_k, char *at_v, attn_params *dense);
kv_tile fused_kv_rows(const attn_params *p, const fused_block *blk, const void *base,
                      const int64_t st[4], int64_t width, int64_t j0, int64_t nk, char *gbuf);
const float *fused_kv_block(const attn_params *p, const fused_block *blk, bool values,
                            int64_t j0, const attn_kernels *kern, attn_dtype dt, kv_tile t,
                            int64_t width, int64_t nk, float scale, float *buf, int64_t *ld);
/* A tile of mixed class (fused_tile_params gave p) narrowed to the keys from its first to
 * its last granule of ATTN_SUM_KEYS keys that some row of the block keeps: the granules
 * masked for every row at either end are left out (their logits are -inf, their weights
 * 0: the result is the same). Returns whether *j0, *nk moved. */
bool fused_tile_trim(const attn_params *p, const fused_plan *plan, const fused_block *blk,
                     int64_t *j0, int64_t *nk);

/* fused_weights.c: the weights output, in the sweep (per tile) and after it (per block). */
void fused_tile_weights(const attn_params *p, const fused_plan *plan, const fused_scratch *w,
                        const fused_block *blk, int64_t j0, int64_t nk);
void fused_block_weights(const attn_params *p, const attn_kernels *kern,
                         const fused_plan *plan, const fused_scratch *w, const fused_block *blk);

#endif /* ATTN_FUSED_PLAN_H */
