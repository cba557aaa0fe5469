/*
 * kv_append.c — attn_kv_append: the K and V rows of new tokens written into a cache the
 *               caller owns (a paged pool or a contiguous cache), float32 converted to the
 *               cache's dtype (an fp8 cache: divided by its scale first,
 *               attn_kv_append_scaled).
 *
 * Two passes: the first finds every token's destination row (a slot, page * page_size +
 * offset) and checks it — inside the pool, no two tokens on one row, and for a q8_0 cache
 * every row it will quantize finite with a scale float16 holds — and the second writes.
 * A refused call has written nothing. A q8_0 row is quantized by the one routine
 * attn_quantize_q8_0 uses (q8_0.c), so the bytes are the same. What it is not: an
 * allocator (the caller owns the pages and decides which are free) or a length counter
 * (kv_len is read, never advanced).
 */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/attn_internal.h"
#include "core/half.h"
#include "core/pages.h"

/* The one conversion of a row into the cache: width float32 values (stride ss) into the
 * cache's dtype at element `at` of base (stride ds), each rounded to nearest even; or,
 * for q8_0, quantized into the width / 32 blocks that start at element `at` (ds is 1,
 * ai_check_q8_0_layout) — checked before by ai_block_row_check. */
static void store_row(attn_dtype dt, void *base, int64_t at, int64_t ds, const float *src,
                      int64_t ss, int64_t width, float scale) {
    if (attn_is_block_dtype(dt)) {
        ai_block_quantize_row(dt, src, ss, width, (uint8_t *)base + attn_row_byte_offset(dt, at));
        return;
    }
    if (attn_is_fp8(dt)) {  // fp8(fl32(x / scale)), rounded to nearest even, saturating
        for (int64_t d = 0; d < width; d++) attn_store(dt, base, at + d * ds, src[d * ss] / scale);
        return;
    }
    for (int64_t d = 0; d < width; d++) attn_store(dt, base, at + d * ds, src[d * ss]);
}

/* A q8_0 or q4_0 cache (dt): every row the call will write quantizable (finite, its
 * scales within float16), before any is written. Padding tokens (slot -1) are not written, so not read. */
static attn_status check_q8_rows(const attn_tensor *k_new, const attn_tensor *v_new,
                                 const int64_t *slot, attn_dtype dt) {
    const char *what = dt == ATTN_Q4_0 ? "max / -8" : "amax / 127";
    const int64_t B = k_new->shape[0], Hkv = k_new->shape[1], n = k_new->shape[2];
    for (int c = 0; c < 2; c++) {
        const attn_tensor *x = c ? v_new : k_new;
        const float *x0 = x->data;
        const int64_t *xs = x->stride;
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < n; t++) {
                if (slot[b * n + t] < 0) continue;
                for (int64_t g = 0; g < Hkv; g++) {
                    const float *row = x0 + b * xs[0] + g * xs[1] + t * xs[2];
                    const int64_t blk = ai_block_row_check(dt, row, xs[3], x->shape[3]);
                    if (blk >= 0)
                        return ai_fail(ATTN_ERR_VALUE, "%s: block %lld of row (%lld, %lld, "
                                       "%lld) holds a NaN or infinity, or a scale %s beyond "
                                       "float16's range (the %s cache cannot hold it)",
                                       c ? "v_new" : "k_new", (long long)blk, (long long)b,
                                       (long long)g, (long long)t, what, attn_dtype_name(dt));
                }
            }
    }
    return ATTN_OK;
}

static int64_t load_index(const void *data, attn_dtype dt, int64_t at) {
    return dt == ATTN_I32 ? ((const int32_t *)data)[at] : ((const int64_t *)data)[at];
}

static int cmp_i64(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static attn_status expect(const attn_tensor *t, const char *name, int d, int64_t want,
                          const char *what) {
    if (t->shape[d] != want)
        return ai_fail(ATTN_ERR_SHAPE, "%s: shape[%d] (%s) is %lld, expected %lld", name, d,
                       what, (long long)t->shape[d], (long long)want);
    return ATTN_OK;
}

/* An index tensor: int32 (or int64 where allowed) of shape {n0, n1, 1, 1}. */
static attn_status check_index(const attn_tensor *t, const char *name, bool i64_ok, int64_t n0,
                               int64_t n1) {
    const attn_dtype dt = i64_ok && t->dtype == ATTN_I64 ? ATTN_I64 : ATTN_I32;
    TRY(ai_check_tensor(t, name, dt, true));
    TRY(expect(t, name, 0, n0, "B"));
    if (n1 >= 0) TRY(expect(t, name, 1, n1, "n, the new tokens"));
    TRY(expect(t, name, 2, 1, "1"));
    TRY(expect(t, name, 3, 1, "1"));
    return ATTN_OK;
}

/* The destination slot of every token (b, t) into slot[b * n + t], -1 for a padding
 * token, each checked. */
static attn_status find_slots(int64_t B, int64_t n, int64_t num_pages, int64_t page_size,
                              const attn_tensor *slot_mapping, const ai_pages *pg,
                              const attn_tensor *kv_len, int64_t *slot) {
    int64_t s_st[2], len_st[1];
    const void *sm = slot_mapping ? ai_view_data(slot_mapping, s_st, 2) : NULL;
    const void *len = kv_len ? ai_view_data(kv_len, len_st, 1) : NULL;
    const int64_t rows = pg ? pg->rows : page_size;
    for (int64_t b = 0; b < B; b++) {
        int64_t lb = 0;
        if (!sm) {
            lb = load_index(len, kv_len->dtype, b * len_st[0]);
            /* positions lb .. lb+n-1 within the table's pages (or the contiguous rows) */
            if (lb < 0 || lb > rows - n)
                /* "kv_len + n - 1" in words: it overflows int64 for kv_len near INT64_MAX */
                return ai_fail(ATTN_ERR_VALUE, "kv_len[%lld] = %lld: the %lld new tokens' "
                               "positions from there lie beyond the %s (%lld rows)",
                               (long long)b, (long long)lb, (long long)n,
                               pg ? "block table's pages" : "cache", (long long)rows);
            if (pg) TRY(ai_pages_check(pg, "block_table", b, lb, lb + n));
        }
        for (int64_t t = 0; t < n; t++) {
            int64_t s;
            if (sm) {
                s = load_index(sm, slot_mapping->dtype, b * s_st[0] + t * s_st[1]);
                if (s == -1) {  // a padding token: vLLM's slot -1, not written
                    slot[b * n + t] = -1;
                    continue;
                }
                if (s < 0 || s / page_size >= num_pages)
                    return ai_fail(ATTN_ERR_VALUE, "slot_mapping[%lld][%lld] = %lld, expected "
                                   "-1 or 0 <= slot < num_pages * page_size = %lld * %lld",
                                   (long long)b, (long long)t, (long long)s,
                                   (long long)num_pages, (long long)page_size);
            } else if (pg) {
                const int64_t pos = lb + t;
                s = ai_page_of(pg->bt, pg->bt_s, b, pos, page_size) * page_size + pos % page_size;
            } else {
                s = b * page_size + lb + t;  // the contiguous cache: one "page" per batch
            }
            slot[b * n + t] = s;
        }
    }
    return ATTN_OK;
}

attn_status attn_kv_append(const attn_tensor *k_new, const attn_tensor *v_new,
                           const attn_tensor *k_cache, const attn_tensor *v_cache,
                           const attn_tensor *slot_mapping, const attn_tensor *block_table,
                           const attn_tensor *kv_len) {
    return attn_kv_append_scaled(k_new, v_new, k_cache, v_cache, slot_mapping, block_table,
                                 kv_len, NULL, NULL);
}

/* An fp8 cache's scales (NULL: 1), each with its stride over the key/value heads. */
typedef struct append_scales {
    const float *k, *v;
    int64_t k_s, v_s;
} append_scales;

/* Every check of an append before anything is read past the arguments or written: the
 * tensors, their shapes and strides, the scales (into *sc), the index tensors (a block
 * table's shape into *pg), and that no cache shares a byte with an input or the other
 * cache. */
static attn_status append_check(const attn_tensor *k_new, const attn_tensor *v_new,
                                const attn_tensor *k_cache, const attn_tensor *v_cache,
                                const attn_tensor *slot_mapping, const attn_tensor *block_table,
                                const attn_tensor *kv_len, const attn_tensor *k_scale,
                                const attn_tensor *v_scale, append_scales *sc, ai_pages *pg) {
    TRY(ai_check_tensor(k_new, "k_new", ATTN_F32, true));
    TRY(ai_check_tensor(v_new, "v_new", ATTN_F32, true));
    /* a u4 cache is written whole by attn_quantize_u4_keys / _values (its key scales span
     * groups of keys an append would cut) */
    if ((k_cache && k_cache->dtype == ATTN_U4) || (v_cache && v_cache->dtype == ATTN_U4))
        return ai_fail(ATTN_ERR_UNSUPPORTED, "k_cache, v_cache: a u4 cache takes no append "
                       "(attn_quantize_u4_keys and attn_quantize_u4_values write it)");
    /* the cache: float32, float16 or bfloat16 (ATTN_DTYPE_COUNT), or q8_0 with its layout,
     * or an fp8 dtype */
    const bool cache_dt = k_cache && (attn_is_block_dtype(k_cache->dtype) || attn_is_fp8(k_cache->dtype));
    TRY(ai_check_tensor(k_cache, "k_cache", cache_dt ? k_cache->dtype : ATTN_DTYPE_COUNT,
                        true));
    if (v_cache && v_cache->dtype != k_cache->dtype)
        return ai_fail(ATTN_ERR_DTYPE, "v_cache: dtype is %s, expected %s like k_cache",
                       attn_dtype_name(v_cache->dtype), attn_dtype_name(k_cache->dtype));
    TRY(ai_check_tensor(v_cache, "v_cache", k_cache->dtype, true));
    const int64_t B = k_new->shape[0], Hkv = k_new->shape[1], n = k_new->shape[2];
    const int64_t Dk = k_new->shape[3], Dv = v_new->shape[3];
    TRY(expect(v_new, "v_new", 0, B, "B, as k_new"));
    TRY(expect(v_new, "v_new", 1, Hkv, "Hkv, as k_new"));
    TRY(expect(v_new, "v_new", 2, n, "n, as k_new"));
    TRY(expect(k_cache, "k_cache", 1, Hkv, "Hkv, as k_new"));
    TRY(expect(k_cache, "k_cache", 3, Dk, "Dk, as k_new"));
    TRY(expect(v_cache, "v_cache", 0, k_cache->shape[0], "as k_cache"));
    TRY(expect(v_cache, "v_cache", 1, Hkv, "Hkv, as k_new"));
    TRY(expect(v_cache, "v_cache", 2, k_cache->shape[2], "as k_cache"));
    TRY(expect(v_cache, "v_cache", 3, Dv, "Dv, as v_new"));
    TRY(ai_check_output_strides(k_cache, "k_cache", 4));
    TRY(ai_check_output_strides(v_cache, "v_cache", 4));
    /* an fp8 cache's scales, per tensor or per key/value head (attn.h) */
    TRY(ai_check_kv_scale(k_scale, "k_scale", k_cache->dtype, Hkv, true, &sc->k, &sc->k_s));
    TRY(ai_check_kv_scale(v_scale, "v_scale", k_cache->dtype, Hkv, true, &sc->v, &sc->v_s));

    const bool paged = slot_mapping || block_table;
    const int64_t page_size = k_cache->shape[2];
    if (paged && page_size == 0)
        return ai_fail(ATTN_ERR_VALUE, "k_cache: page size (shape[2]) is 0, expected >= 1");
    if (!paged) TRY(expect(k_cache, "k_cache", 0, B, "B, as k_new (a contiguous cache)"));
    if (slot_mapping) {
        TRY(check_index(slot_mapping, "slot_mapping", true, B, n));
    } else {
        if (!kv_len)
            return ai_fail(ATTN_ERR_NULL, "kv_len: required to append by position (no "
                           "slot_mapping)");
        TRY(check_index(kv_len, "kv_len", true, B, 1));
        if (block_table)  // its entries: those of the rows written, in find_slots
            TRY(ai_pages_init(pg, block_table, "block_table", B, k_cache->shape[0], page_size,
                              true));
    }
    /* the caches are written: no byte shared with an input or with each other */
    const attn_tensor *in[] = {k_new, v_new, slot_mapping, block_table, kv_len, k_scale, v_scale};
    static const char *const in_names[] = {"k_new", "v_new", "slot_mapping", "block_table",
                                           "kv_len", "k_scale", "v_scale"};
    for (int c = 0; c < 2; c++) {
        const attn_tensor *out = c ? v_cache : k_cache;
        for (int a = 0; a < 7; a++)
            if (in[a] && ai_views_overlap(out, in[a]))
                return ai_fail(ATTN_ERR_STRIDE, "%s overlaps %s", c ? "v_cache" : "k_cache",
                               in_names[a]);
    }
    if (ai_views_overlap(k_cache, v_cache))
        return ai_fail(ATTN_ERR_STRIDE, "v_cache overlaps k_cache");
    return ATTN_OK;
}

/* The rows of every token with a slot (s >= 0) written into the caches, head by head,
 * rounded or quantized to the cache's dtype. */
static void append_store(const attn_tensor *k_new, const attn_tensor *v_new,
                         const attn_tensor *k_cache, const attn_tensor *v_cache,
                         const int64_t *slot, int64_t ps, const append_scales *sc) {
    const int64_t B = k_new->shape[0], Hkv = k_new->shape[1], n = k_new->shape[2];
    const int64_t Dk = k_new->shape[3], Dv = v_new->shape[3];
    const int64_t *ks = k_cache->stride, *vs = v_cache->stride;
    const int64_t *kn = k_new->stride, *vn = v_new->stride;
    const float *kx = k_new->data, *vx = v_new->data;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < n; t++) {
            const int64_t s = slot[b * n + t];
            if (s < 0) continue;
            const int64_t page = s / ps, off = s % ps;
            for (int64_t g = 0; g < Hkv; g++) {
                if (Dk > 0)
                    store_row(k_cache->dtype, k_cache->data, page * ks[0] + g * ks[1] + off * ks[2],
                              ks[3], kx + b * kn[0] + g * kn[1] + t * kn[2], kn[3], Dk,
                              attn_kv_scale(sc->k, sc->k_s, g));
                if (Dv > 0)
                    store_row(v_cache->dtype, v_cache->data, page * vs[0] + g * vs[1] + off * vs[2],
                              vs[3], vx + b * vn[0] + g * vn[1] + t * vn[2], vn[3], Dv,
                              attn_kv_scale(sc->v, sc->v_s, g));
            }
        }
}

attn_status attn_kv_append_scaled(const attn_tensor *k_new, const attn_tensor *v_new,
                                  const attn_tensor *k_cache, const attn_tensor *v_cache,
                                  const attn_tensor *slot_mapping, const attn_tensor *block_table,
                                  const attn_tensor *kv_len, const attn_tensor *k_scale,
                                  const attn_tensor *v_scale) {
    append_scales sc;
    ai_pages pg;
    TRY(append_check(k_new, v_new, k_cache, v_cache, slot_mapping, block_table, kv_len, k_scale,
                     v_scale, &sc, &pg));
    const int64_t B = k_new->shape[0], Hkv = k_new->shape[1], n = k_new->shape[2];
    const bool paged = slot_mapping || block_table;
    const int64_t num_pages = k_cache->shape[0], page_size = k_cache->shape[2];
    int64_t tokens;
    if (__builtin_mul_overflow(B, n, &tokens) || (uint64_t)tokens > SIZE_MAX / 16)
        return ai_fail(ATTN_ERR_OVERFLOW, "B * n overflows");
    if (tokens == 0) return ai_ok();
    int64_t *slot = ai_malloc((size_t)tokens * 2 * sizeof(int64_t));
    if (!slot) return ai_fail(ATTN_ERR_NOMEM, "attn_kv_append: %lld slots",
                              (long long)tokens);
    attn_status st = find_slots(B, n, num_pages, paged ? page_size : k_cache->shape[2],
                                slot_mapping, block_table && !slot_mapping ? &pg : NULL, kv_len,
                                slot);
    if (st == ATTN_OK) {  // two tokens on one row: which one wins would be an accident
        int64_t *sorted = slot + tokens;
        memcpy(sorted, slot, (size_t)tokens * sizeof(int64_t));
        qsort(sorted, (size_t)tokens, sizeof(int64_t), cmp_i64);
        for (int64_t a = 1; a < tokens && st == ATTN_OK; a++)
            if (sorted[a] >= 0 && sorted[a] == sorted[a - 1])
                st = ai_fail(ATTN_ERR_VALUE, "two new tokens are aimed at one cache row "
                             "(slot %lld)", (long long)sorted[a]);
    }
    if (st == ATTN_OK && attn_is_block_dtype(k_cache->dtype))
        st = check_q8_rows(k_new, v_new, slot, k_cache->dtype);
    if (st != ATTN_OK || Hkv == 0) {
        ai_free(slot);
        return st == ATTN_OK ? ai_ok() : st;
    }
    append_store(k_new, v_new, k_cache, v_cache, slot, paged ? page_size : k_cache->shape[2], &sc);
    ai_free(slot);
    return ai_ok();
}
