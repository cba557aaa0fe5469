/*
 * block_mask.c — the block mask (attn.h, attn_block_mask): a bool mask made once into its
 *                structure, which every call given it reads instead of the mask.
 *
 * What it owns: making one (from a callback or a bool tensor), freeing it, its counts,
 * and the one row operation the fused forward asks of it (ai_block_mask_row). The
 * layout is attn_internal.h's struct attn_block_mask: per block of ATTN_BLOCK_ROWS rows x
 * ATTN_BLOCK_KEYS keys a code (full, empty, partial) and, for a partial block only, its
 * elements; per row the hull of its kept keys and whether the hull is all kept. Those are
 * exactly what the mask summary (mask_summary.h) finds in a dense mask, so the calls'
 * tiles are classified from it with no pass over any mask (mask_summary.c takes the
 * arrays as a summary built in advance), and a tile the summary calls mixed reads
 * elements per logit (attn_block_keep). What it is not: a second definition of a logit.
 *
 * Cost of making one: each element is read (or keep() called) once, then the elements of
 * the partial blocks a second time, into their storage; serial, in order (b, h, i, j).
 */
#include <string.h>

#include "core/alloc.h"
#include "core/attn_internal.h"

/* Where the elements come from: keep() or a bool tensor (data, strides). */
typedef struct source {
    int (*keep)(int64_t, int64_t, int64_t, int64_t, void *);
    void *ctx;
    const uint8_t *data;
    int64_t st[4];
} source;

static uint8_t element(const source *src, int64_t b, int64_t h, int64_t i, int64_t j) {
    if (src->keep) return src->keep(b, h, i, j, src->ctx) != 0;
    return src->data[b * src->st[0] + h * src->st[1] + i * src->st[2] + j * src->st[3]] != 0;
}

static size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }

/* The arrays of m's dims in one allocation (the partial blocks' cells apart, later);
 * false on overflow or no memory. */
static bool alloc_arrays(attn_block_mask *m) {
    int64_t rows, cells;
    if (__builtin_mul_overflow(m->nb * m->nh, m->Lq, &rows) ||
        __builtin_mul_overflow(m->nb * m->nh * m->qblocks, m->granules, &cells) ||
        rows > INT64_MAX / 64 || cells > INT64_MAX / 64)
        return false;
    const size_t a = round64((size_t)rows * 2 * sizeof(int64_t)), b = round64((size_t)rows),
                 c = round64((size_t)cells), d = round64((size_t)cells * sizeof(int64_t));
    char *mem = ai_malloc(a + b + c + d);
    if (!mem) return false;
    m->hull = (int64_t *)mem;
    m->dense = (uint8_t *)(mem + a);
    m->code = (uint8_t *)(mem + a + b);
    m->slot = (int64_t *)(mem + a + b + c);
    m->bytes = sizeof *m + a + b + c + d;
    return true;
}

/* Pass 1, one block row (bh, qb): its rows' hulls and dense flags, its blocks' codes;
 * row is a scratch of Lk bytes. Returns its partial blocks. */
static int64_t scan_block_row(attn_block_mask *m, const source *src, int64_t bh, int64_t qb,
                              uint8_t *row, int64_t *kept) {
    const int64_t b = bh / m->nh, h = bh % m->nh, G = m->granules;
    const int64_t i0 = qb * ATTN_BLOCK_ROWS,
                  i1 = i0 + ATTN_BLOCK_ROWS < m->Lq ? i0 + ATTN_BLOCK_ROWS : m->Lq;
    uint8_t *code = m->code + (bh * m->qblocks + qb) * G;
    memset(kept, 0, (size_t)G * sizeof *kept);
    for (int64_t i = i0; i < i1; i++) {
        int64_t first = -1, last = -1, n = 0;
        for (int64_t j = 0; j < m->Lk; j++) {
            row[j] = element(src, b, h, i, j);
            if (!row[j]) continue;
            if (first < 0) first = j;
            last = j;
            n++;
            kept[j / ATTN_BLOCK_KEYS]++;
        }
        int64_t *hull = m->hull + 2 * (bh * m->Lq + i);
        hull[0] = first < 0 ? 0 : first;
        hull[1] = first < 0 ? 0 : last + 1;
        m->dense[bh * m->Lq + i] = n == hull[1] - hull[0];
    }
    int64_t partial = 0;
    for (int64_t g = 0; g < G; g++) {
        const int64_t keys = m->Lk - g * ATTN_BLOCK_KEYS < ATTN_BLOCK_KEYS
                                 ? m->Lk - g * ATTN_BLOCK_KEYS : ATTN_BLOCK_KEYS;
        const int64_t all = keys * (i1 - i0);
        code[g] = kept[g] == 0 ? ATTN_BLOCK_EMPTY : kept[g] == all ? ATTN_BLOCK_FULL
                                                                    : ATTN_BLOCK_PARTIAL;
        partial += code[g] == ATTN_BLOCK_PARTIAL;
    }
    return partial;
}

/* Pass 2: the elements of the partial blocks into their cells, in block order. */
static void store_partials(attn_block_mask *m, const source *src) {
    int64_t next = 0;
    const int64_t units = m->nb * m->nh * m->qblocks * m->granules;
    for (int64_t u = 0; u < units; u++) {
        if (m->code[u] != ATTN_BLOCK_PARTIAL) {
            m->slot[u] = -1;
            m->empty += m->code[u] == ATTN_BLOCK_EMPTY;
            m->full += m->code[u] == ATTN_BLOCK_FULL;
            continue;
        }
        const int64_t g = u % m->granules, qb = u / m->granules % m->qblocks,
                      bh = u / m->granules / m->qblocks;
        const int64_t b = bh / m->nh, h = bh % m->nh;
        uint8_t *cell = m->cells + next * ATTN_BLOCK_ROWS * ATTN_BLOCK_KEYS;
        memset(cell, 0, ATTN_BLOCK_ROWS * ATTN_BLOCK_KEYS);
        for (int64_t r = 0; r < ATTN_BLOCK_ROWS && qb * ATTN_BLOCK_ROWS + r < m->Lq; r++)
            for (int64_t c = 0; c < ATTN_BLOCK_KEYS && g * ATTN_BLOCK_KEYS + c < m->Lk; c++)
                cell[r * ATTN_BLOCK_KEYS + c] =
                    element(src, b, h, qb * ATTN_BLOCK_ROWS + r, g * ATTN_BLOCK_KEYS + c);
        m->slot[u] = next++;
    }
}

static attn_status make(int64_t B, int64_t H, int64_t Lq, int64_t Lk, const source *src,
                        attn_block_mask **out) {
    const char *what = src->keep ? "attn_block_mask_create" : "attn_block_mask_from_tensor";
    attn_block_mask *m = ai_calloc(1, sizeof *m);
    if (!m) return ai_fail(ATTN_ERR_NOMEM, "%s: out of memory", what);
    m->nb = B, m->nh = H, m->Lq = Lq, m->Lk = Lk;
    m->qblocks = (Lq + ATTN_BLOCK_ROWS - 1) / ATTN_BLOCK_ROWS;
    m->granules = (Lk + ATTN_BLOCK_KEYS - 1) / ATTN_BLOCK_KEYS;
    uint8_t *row = NULL;
    int64_t *kept = NULL;
    int64_t total;
    if (__builtin_mul_overflow(B * H, Lq, &total) || __builtin_mul_overflow(total, Lk, &total)) {
        ai_free(m);
        return ai_fail(ATTN_ERR_OVERFLOW, "%s: B x H x Lq x Lk does not fit in 64 bits", what);
    }
    if (!alloc_arrays(m) || !(row = ai_malloc((size_t)Lk)) ||
        !(kept = ai_malloc((size_t)m->granules * sizeof *kept))) {
        ai_free(row);
        attn_block_mask_free(m);
        return ai_fail(ATTN_ERR_NOMEM, "%s: out of memory", what);
    }
    for (int64_t bh = 0; bh < B * H; bh++)
        for (int64_t qb = 0; qb < m->qblocks; qb++)
            m->partial += scan_block_row(m, src, bh, qb, row, kept);
    ai_free(row);
    ai_free(kept);
    const size_t cell_bytes = (size_t)ATTN_BLOCK_ROWS * ATTN_BLOCK_KEYS;
    if ((uint64_t)m->partial > SIZE_MAX / cell_bytes ||
        (m->partial && !(m->cells = ai_malloc((size_t)m->partial * cell_bytes)))) {
        attn_block_mask_free(m);
        return ai_fail(ATTN_ERR_NOMEM, "%s: out of memory (%lld partial blocks)", what,
                       (long long)m->partial);
    }
    m->bytes += (size_t)m->partial * cell_bytes;
    store_partials(m, src);
    *out = m;
    return ai_ok();
}

attn_status attn_block_mask_create(int64_t B, int64_t H, int64_t Lq, int64_t Lk,
                                   int (*keep)(int64_t, int64_t, int64_t, int64_t, void *),
                                   void *ctx, attn_block_mask **out) {
    if (!out || !keep)
        return ai_fail(ATTN_ERR_NULL, "attn_block_mask_create: %s is NULL", out ? "keep" : "out");
    if (B < 1 || H < 1 || Lq < 1 || Lk < 1)
        return ai_fail(ATTN_ERR_SHAPE, "attn_block_mask_create: B, H, Lq, Lk = %lld, %lld, "
                       "%lld, %lld, expected each >= 1", (long long)B, (long long)H,
                       (long long)Lq, (long long)Lk);
    const source src = {.keep = keep, .ctx = ctx};
    return make(B, H, Lq, Lk, &src, out);
}

attn_status attn_block_mask_from_tensor(const attn_tensor *mask, attn_block_mask **out) {
    if (!out) return ai_fail(ATTN_ERR_NULL, "attn_block_mask_from_tensor: out is NULL");
    attn_status st = ai_check_tensor(mask, "mask", ATTN_BOOL, true);
    if (st != ATTN_OK) return st;
    const int64_t *n = mask->shape;
    if (n[0] < 1 || n[1] < 1 || n[2] < 1 || n[3] < 1)
        return ai_fail(ATTN_ERR_SHAPE, "attn_block_mask_from_tensor: mask shape [%lld, %lld, "
                       "%lld, %lld], expected every size >= 1", (long long)n[0],
                       (long long)n[1], (long long)n[2], (long long)n[3]);
    source src = {.data = mask->data};
    memcpy(src.st, mask->stride, sizeof src.st);
    /* a batch or head dim of stride 0 holds one mask for all: stored once */
    const int64_t B = mask->stride[0] == 0 ? 1 : n[0], H = mask->stride[1] == 0 ? 1 : n[1];
    return make(B, H, n[2], n[3], &src, out);
}

void attn_block_mask_free(attn_block_mask *m) {
    if (!m) return;
    ai_free(m->cells);
    ai_free(m->hull);  // the one allocation of hull, dense, code and slot
    ai_free(m);
}

attn_status attn_block_mask_get_info(const attn_block_mask *m, attn_block_mask_info *info) {
    if (!m || !info)
        return ai_fail(ATTN_ERR_NULL, "attn_block_mask_get_info: %s is NULL", m ? "info" : "mask");
    *info = (attn_block_mask_info){.B = m->nb, .H = m->nh, .Lq = m->Lq, .Lk = m->Lk,
                                   .block_rows = ATTN_BLOCK_ROWS, .block_keys = ATTN_BLOCK_KEYS,
                                   .empty = m->empty, .full = m->full, .partial = m->partial,
                                   .bytes = m->bytes};
    return ai_ok();
}

void ai_block_mask_row(const attn_block_mask *m, int64_t b, int64_t h, int64_t i, int64_t j0,
                       int64_t n, float *s, int64_t ld) {
    const int64_t bh = (m->nb == 1 ? 0 : b) * m->nh + (m->nh == 1 ? 0 : h);
    const int64_t u0 = (bh * m->qblocks + i / ATTN_BLOCK_ROWS) * m->granules;
    const int64_t r = i % ATTN_BLOCK_ROWS;
    for (int64_t c = 0; c < n;) {
        const int64_t j = j0 + c, g = j / ATTN_BLOCK_KEYS;
        const int64_t run_end = (g + 1) * ATTN_BLOCK_KEYS - j0 < n ? (g + 1) * ATTN_BLOCK_KEYS - j0 : n;
        const uint8_t code = m->code[u0 + g];
        if (code == ATTN_BLOCK_EMPTY) {
            for (; c < run_end; c++) s[c * ld] = -INFINITY;
        } else if (code == ATTN_BLOCK_PARTIAL) {
            const uint8_t *cell = m->cells + (m->slot[u0 + g] * ATTN_BLOCK_ROWS + r) * ATTN_BLOCK_KEYS;
            for (; c < run_end; c++)
                if (!cell[j0 + c - g * ATTN_BLOCK_KEYS]) s[c * ld] = -INFINITY;
        } else {
            c = run_end;
        }
    }
}
