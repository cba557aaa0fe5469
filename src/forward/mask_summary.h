/*
 * mask_summary.h — the structure of a call's bool mask and float bias, found once per call
 *                  and read by the fused forward, its weights sweep and the fused backward.
 *
 * What it owns: one pass over each of the two tensors (in parallel) that records, for
 * every row of the tensor as it is stored (its broadcast dimensions collapsed: a
 * [B, 1, 1, Lk] mask has B rows, not B x Hq x Lq), the hull of its kept keys and whether
 * the hull is all open; and, per block of ATTN_SUM_ROWS rows and granule of
 * ATTN_SUM_KEYS keys, whether the cells are all open, all masked, or mixed. What it does
 * not own: the tiles themselves (fused.c, backward_fused.c decide what to skip and which
 * path a tile takes), or the meaning of a logit (attn_finish_logit).
 *
 * An entry is "open" when it changes nothing (a true mask byte, a bias of exactly +-0),
 * "masked" when its key's logit is -inf whatever Q and K hold (a false byte, a bias of
 * -inf), and "other" for every other bias value (NaN and +inf included): the bias is
 * then added, and NaN reaches the row as the contract says.
 *
 * Memory: hulls 2 int64 and a byte per collapsed row, a byte per (block, granule), a
 * state per block, and 2 int64 per batch (the key lengths of ai_mask_summary_lengths):
 * (rows / 64) x (Lk / 16) bytes — 1/1024 of the mask itself, never more than the mask.
 */
#ifndef ATTN_MASK_SUMMARY_H
#define ATTN_MASK_SUMMARY_H

#include <stdatomic.h>

#include "core/attn_internal.h"

/* the granularity of the table: rows per block (the fused paths' query blocks of the list's bq;
 * a forward block of another bq asks each block its rows reach: fused_tile_params) and keys
 * per granule (a divisor of every key tile the fused paths use) */
enum { ATTN_SUM_ROWS = ATTN_BLOCK_ROWS, ATTN_SUM_KEYS = ATTN_BLOCK_KEYS };

/* what the cells of a granule (or a tile) hold, OR-ed together (a block mask's codes,
 * attn_internal.h, are the same flags: full = open, empty = masked) */
enum { ATTN_SUM_OPEN = ATTN_BLOCK_FULL, ATTN_SUM_MASKED = ATTN_BLOCK_EMPTY, ATTN_SUM_OTHER = 4 };

/* how a tile may be computed, as far as the mask and the bias go */
typedef enum attn_tile_class {
    ATTN_TILE_MIXED = 0,  /* apply them per logit                                     */
    ATTN_TILE_OPEN,       /* every cell open: compute the tile as if neither existed   */
    ATTN_TILE_MASKED,     /* every cell masked for every row: the tile is skipped      */
} attn_tile_class;

/* One tensor's summary; its dims collapsed where the tensor broadcasts (stride 0). */
typedef struct attn_sum_one {
    const void *src;             // the mask or bias, NULL: none
    int64_t nb, nh, nq;          // B or 1, Hq or 1, Lq or 1
    int64_t qblocks, granules;   // ceil(nq / ATTN_SUM_ROWS), ceil(Lk / ATTN_SUM_KEYS)
    int64_t *hull;               // (nb, nh, nq, 2): [a, e), the first and past-the-last
                                 //  key that is not masked; [0, 0) when all are
    uint8_t *dense;              // (nb, nh, nq): every key of the hull is open
    uint8_t *code;               // (nb, nh, qblocks, granules): OR of ATTN_SUM_* flags
    atomic_int *state;           // (nb, nh, qblocks): 0 not begun, 1 begun, 2 done;
                                 //  NULL: built in advance (a block mask's)
} attn_sum_one;

typedef struct attn_mask_summary {
    attn_sum_one mask, bias;
    attn_sum_one block;  // the call's block mask's arrays (block_mask.c), read only
    int64_t *lengths;  // (B): the call's key lengths when the two are key padding
    int64_t *scratch;  // (B): the bias's lengths, before they are combined with the mask's
} attn_mask_summary;

/* Bytes attn_mask_summary_build needs for p's mask and bias (0 without either), a
 * multiple of 64; (size_t)-1 on overflow. */
ATTN_PRIVATE size_t ai_mask_summary_bytes(const attn_params *p);

/* Lays out p's summary in mem (ai_mask_summary_bytes(p) bytes, 64-aligned), before the
 * call's parallel region. Nothing is summarized yet: each block of rows is, by the first
 * thread whose question (below) needs it; the others wait for that thread. */
ATTN_PRIVATE void ai_mask_summary_init(const attn_params *p, void *mem, attn_mask_summary *s);

/* Whether p's mask and bias are key padding, per batch a prefix of keys open and the rest
 * masked, the same prefix for every head and row (possibly cut by a top-left causal band:
 * row i open on [0, min(n_b, i + 1))); then *out is p without them, with key lengths
 * (s->lengths: the smaller of p's own and the prefixes) and, for the causal form, causal
 * top-left, so that the call runs as it would with kv_len (and causal): no summary, no
 * per-logit test. One pass over the tensors (in parallel, p->threads), ending at the first
 * row that is not such a prefix; false then, and the summary is used as before. Also false
 * where a shorter key length would move p's diagonal (bottom-right alignment with causal,
 * a window or ALiBi). Before the call's parallel region, after ai_mask_summary_init.
 * The memory is the summary's lengths; no hull is touched. */
ATTN_PRIVATE bool ai_mask_summary_lengths(const attn_params *p, const attn_mask_summary *s,
                                          attn_params *out);

/* Key padding as key lengths for every fused call (float32, 16-bit and float64 forward,
 * backward, attn_weights_grid), at the one place each passes through: the entry point
 * that runs it (forward.c attn_forward, backward.c attn_backward, weights_grid.c), after
 * ai_params_init, before the path. ai_key_padding_bytes(p): the bytes the lengths
 * take in that call's workspace (0 without mask and bias, and on the reference path,
 * which keeps the tensors as given); ai_key_padding(p, mem, out): out, filled as
 * ai_mask_summary_lengths does, when p's mask and bias are key padding, else p. The
 * conversion is exact: the call gives the bits it gives with the mask. */
ATTN_PRIVATE size_t ai_key_padding_bytes(const attn_params *p);
ATTN_PRIVATE const attn_params *ai_key_padding(const attn_params *p, void *mem,
                                               attn_params *out);

/* The class of the tile of rows i0 .. i1-1 (i0 < i1) of head h, keys j0 .. j0+nk-1, for a
 * block of rows other than the summary's: open (masked) where it is so in every summary
 * block the rows reach, mixed otherwise. */
ATTN_PRIVATE attn_tile_class ai_mask_summary_rows(const attn_params *p, const attn_mask_summary *s,
                                                  int64_t b, int64_t h, int64_t i0, int64_t i1,
                                                  int64_t j0, int64_t nk);

/* Row i of head h, batch b: narrows [*lo, *hi) to the hulls of the mask and the bias;
 * true when every key left is open in both (the row then needs neither). */
ATTN_PRIVATE bool ai_mask_summary_row(const attn_params *p, const attn_mask_summary *s,
                                      int64_t b, int64_t h, int64_t i, int64_t *lo, int64_t *hi);

/* The class of the tile of query block qb (rows qb * ATTN_SUM_ROWS ..., or all rows when
 * a block stacks heads) of heads h0 .. h0 + nh - 1, keys j0 .. j0 + nk - 1 (nk >= 1). */
ATTN_PRIVATE attn_tile_class ai_mask_summary_tile(const attn_params *p,
                                                  const attn_mask_summary *s, int64_t b,
                                                  int64_t h0, int64_t nh, int64_t qb,
                                                  int64_t j0, int64_t nk);

#endif /* ATTN_MASK_SUMMARY_H */
