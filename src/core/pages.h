/*
 * pages.h — the one block-table rule of a paged KV cache (docs/CONTRACT.md, "A paged KV
 *           cache"): pools [num_pages, Hkv, page_size, D], a table int32 [B, max_pages,
 *           1, 1], row j of sequence b at row j % page_size of page
 *           table[b][j / page_size]. attn_forward (params.c), attn_kv_append and the
 *           multi-head decoding step check a table here and nowhere else; every path
 *           finds a row's page through ai_page_of (attn_internal.h, beside the params).
 *
 * What it is not: the pools' own checks (dtype, Hkv, D, strides: each call's), or which
 * rows a call reads or writes (the caller says, as [r0, r1)).
 */
#ifndef ATTN_PAGES_H
#define ATTN_PAGES_H

#include "attn_internal.h"

typedef struct ai_pages {
    const int32_t *bt;  int64_t bt_s[2];  /* the entries (NULL: no data, a size query) */
    int64_t num_pages, page_size;
    int64_t max_pages, rows;              /* rows = max_pages * page_size                 */
} ai_pages;

/* The table `t` (named `name` in errors) of B sequences over num_pages pages of page_size
 * rows: int32, shape [B, max_pages, 1, 1], page_size >= 1 (ATTN_ERR_VALUE), max_pages *
 * page_size within int64 (ATTN_ERR_OVERFLOW); with need_data its data too. */
ATTN_PRIVATE attn_status ai_pages_init(ai_pages *pg, const attn_tensor *t, const char *name,
                                       int64_t B, int64_t num_pages, int64_t page_size,
                                       bool need_data);

/* Every entry of the pages that hold rows [r0, r1) of sequence b (0 <= r0 <= r1 <=
 * pg->rows) is a page of the pool, in [0, num_pages); ATTN_ERR_VALUE naming the first that
 * is not. Entries of other pages are never read (-1 or garbage there is allowed). */
ATTN_PRIVATE attn_status ai_pages_check(const ai_pages *pg, const char *name, int64_t b,
                                        int64_t r0, int64_t r1);

#endif
