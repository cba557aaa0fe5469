/*
 * pages.c — the checks of a block table (pages.h): its shape once per call, then its
 *           entries for the rows a call touches.
 */
#include "pages.h"

attn_status ai_pages_init(ai_pages *pg, const attn_tensor *t, const char *name, int64_t B,
                          int64_t num_pages, int64_t page_size, bool need_data) {
    TRY(ai_check_tensor(t, name, ATTN_I32, need_data));
    if (t->shape[0] != B || t->shape[2] != 1 || t->shape[3] != 1)
        return ai_fail(ATTN_ERR_SHAPE, "%s: shape [%lld, %lld, %lld, %lld], expected [B = "
                       "%lld, max_pages, 1, 1]", name, (long long)t->shape[0],
                       (long long)t->shape[1], (long long)t->shape[2],
                       (long long)t->shape[3], (long long)B);
    if (page_size == 0)
        return ai_fail(ATTN_ERR_VALUE, "%s: the pools' page size (shape[2]) is 0, expected "
                       ">= 1", name);
    pg->num_pages = num_pages;
    pg->page_size = page_size;
    pg->max_pages = t->shape[1];
    if (__builtin_mul_overflow(pg->max_pages, page_size, &pg->rows))
        return ai_fail(ATTN_ERR_OVERFLOW, "%s: max_pages * page_size overflows", name);
    pg->bt = ai_view_data(t, pg->bt_s, 2);  // NULL when the data is not given
    return ATTN_OK;
}

attn_status ai_pages_check(const ai_pages *pg, const char *name, int64_t b, int64_t r0,
                           int64_t r1) {
    if (r1 <= r0) return ATTN_OK;
    for (int64_t p = r0 / pg->page_size; p <= (r1 - 1) / pg->page_size; p++) {
        const int64_t e = pg->bt[b * pg->bt_s[0] + p * pg->bt_s[1]];
        if (e < 0 || e >= pg->num_pages)
            return ai_fail(ATTN_ERR_VALUE, "%s[%lld][%lld] = %lld, expected a page of the "
                           "pool, 0 <= entry < num_pages = %lld", name, (long long)b,
                           (long long)p, (long long)e, (long long)pg->num_pages);
    }
    return ATTN_OK;
}
