/*
 * dense_rows.h — a [n0, n1, L, D] view whose rows are not adjacent (transformers'
 *                [B, L, H, D] memory read as [B, H, L, D], a packed [T, H, D] batch,
 *                reversed or padded rows) copied dense once, for a pass that reads each
 *                row many times: the forward's K and V in a prefill (forward/fused.c;
 *                the backward's Q and dO so copied were slower inside a training step:
 *                docs/KERNELS.md, "Designs tried"). A tile of 64 such rows spans 64
 *                pages of 4 KiB, against 8 once dense. The copy changes addresses only,
 *                so the bits are those of the dense call.
 */
#ifndef ATTN_DENSE_ROWS_H
#define ATTN_DENSE_ROWS_H

#include "attn_internal.h"

/* A row is worth copying when the pass reads it DENSE_ROWS_MIN_READS times or more; the
 * copies of one call take at most DENSE_ROWS_MAX_BYTES, above which the rows are read
 * in place. */
#define DENSE_ROWS_MIN_READS 8
#define DENSE_ROWS_MAX_BYTES ((size_t)256 << 20)

/* Bytes of the dense (n0, n1, L, D) copy of a view of strides st and elements of es bytes:
 * 0 when its rows are adjacent already (st[2] == D, or L < 2), it has no unit stride along
 * D, or the copy would pass DENSE_ROWS_MAX_BYTES. */
ATTN_PRIVATE size_t ai_dense_rows_bytes(const int64_t st[4], int64_t es, int64_t n0,
                                        int64_t n1, int64_t L, int64_t D);

/* Slice s (of n0 * n1) of that view copied from src into dst, dense (n0, n1, L, D). */
ATTN_PRIVATE void ai_dense_rows_copy(const void *src, const int64_t st[4], int64_t es,
                                     int64_t n1, int64_t L, int64_t D, void *dst, int64_t s);

/* The strides of a dense (n0, n1, L, D) tensor. */
static inline void ai_dense_rows_strides(int64_t n1, int64_t L, int64_t D, int64_t st[4]) {
    st[0] = n1 * L * D, st[1] = L * D, st[2] = D, st[3] = 1;
}

#endif /* ATTN_DENSE_ROWS_H */
