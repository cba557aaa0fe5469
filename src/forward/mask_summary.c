/*
 * mask_summary.c — one pass over a call's bool mask and float bias that records their
 *                  structure (mask_summary.h): each collapsed row's hull of kept keys and
 *                  whether it is all open, and per (block of rows, granule of keys) what
 *                  the cells hold.
 *
 * What it is not: a decision about tiles (the fused paths make those from the answers of
 * ai_mask_summary_row and ai_mask_summary_tile) or a second definition of a logit.
 *
 * Cost: each cell is read once, counted by a short vectorizable loop per granule; the
 * first and last kept key of a row are then searched within their granules only. A block
 * of rows is summarized when a tile first asks about it, by the thread asking (a state
 * per block: not begun, begun, done; a thread that finds it begun by another waits for
 * it), so the pass needs no parallel region or barrier of its own, and the threads share
 * it as they share the tiles. Whoever builds a block writes the same bytes.
 */
#include <sched.h>
#include <string.h>

#include "mask_summary.h"
#include "core/team.h"

static size_t round64(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

/* the collapsed dims of one tensor: a dim of stride 0 (shape 1, or an expanded view) is
 * summarized once */
static void collapse(attn_sum_one *t, const void *src, const int64_t st[4], const attn_params *p) {
    *t = (attn_sum_one){.src = src};
    if (!src) return;
    t->nb = st[0] == 0 ? 1 : p->B;
    t->nh = st[1] == 0 ? 1 : p->Hq;
    t->nq = st[2] == 0 ? 1 : p->Lq;
    t->qblocks = (t->nq + ATTN_SUM_ROWS - 1) / ATTN_SUM_ROWS;
    t->granules = (p->Lk + ATTN_SUM_KEYS - 1) / ATTN_SUM_KEYS;
}

/* bytes of one tensor's summary; false on overflow */
static bool one_bytes(const attn_sum_one *t, size_t *bytes) {
    *bytes = 0;
    if (!t->src) return true;
    int64_t rows, cells;
    if (__builtin_mul_overflow(t->nb * t->nh, t->nq, &rows) ||
        __builtin_mul_overflow(t->nb * t->nh * t->qblocks, t->granules, &cells) ||
        rows > INT64_MAX / 32 || cells > INT64_MAX / 2)
        return false;
    *bytes = round64((size_t)rows * 2 * sizeof(int64_t)) + round64((size_t)rows) +
             round64((size_t)cells) + round64((size_t)(t->nb * t->nh * t->qblocks) * sizeof(atomic_int));
    return true;
}

static void both(const attn_params *p, attn_mask_summary *s) {
    collapse(&s->mask, p->mask, p->mask_s, p);
    collapse(&s->bias, p->bias, p->bias_s, p);
}

/* the key lengths and their scratch: 2 x B int64, with a mask or a bias */
static size_t length_bytes(const attn_params *p) {
    return p->mask || p->bias ? round64((size_t)p->B * 2 * sizeof(int64_t)) : 0;
}

size_t ai_mask_summary_bytes(const attn_params *p) {
    attn_mask_summary s;
    both(p, &s);
    size_t a, b;
    if (!one_bytes(&s.mask, &a) || !one_bytes(&s.bias, &b) || a > SIZE_MAX / 4 - b ||
        (uint64_t)p->B > SIZE_MAX / 64)
        return (size_t)-1;
    return a + b + length_bytes(p);
}

/* carves one tensor's arrays from *at */
static void place(attn_sum_one *t, char **at) {
    size_t bytes;
    if (!t->src) return;
    one_bytes(t, &bytes);
    const size_t rows = (size_t)(t->nb * t->nh * t->nq);
    t->hull = (int64_t *)*at;
    t->dense = (uint8_t *)(*at + round64(rows * 2 * sizeof(int64_t)));
    t->code = t->dense + round64(rows);
    t->state = (atomic_int *)(t->code + round64((size_t)(t->nb * t->nh * t->qblocks * t->granules)));
    for (int64_t u = 0; u < t->nb * t->nh * t->qblocks; u++) atomic_init(&t->state[u], 0);
    *at += bytes;
}

/* ---- one row ----------------------------------------------------------------------------
 * A row of Lk cells, cell j at x[j * st] (st = 0: a mask broadcast along the keys). The
 * counts of open and masked cells of a granule come from a loop the compiler vectorizes;
 * a cell that is neither is "other" (a bias value to add). */
typedef struct row_view {
    bool is_bool;
    const uint8_t *m;  // bool cells, or
    const float *f;    // bias cells
    int64_t st, lk;
} row_view;

static bool cell_masked(const row_view *r, int64_t j) {
    return r->is_bool ? r->m[j * r->st] == 0 : r->f[j * r->st] == -INFINITY;
}

static void count_granule(const row_view *r, int64_t j0, int64_t n, int *open, int *masked) {
    int o = 0, k = 0;
    /* unit stride (a mask's usual layout) apart: vector loads rather than a strided loop */
    if (r->is_bool && r->st == 1) {
        const uint8_t *m = r->m + j0;
#pragma omp simd reduction(+ : k)
        for (int64_t c = 0; c < n; c++) k += m[c] == 0;
        o = (int)n - k;
    } else if (r->is_bool) {
        const uint8_t *m = r->m + j0 * r->st;
        const int64_t st = r->st;
#pragma omp simd reduction(+ : k)
        for (int64_t c = 0; c < n; c++) k += m[c * st] == 0;
        o = (int)n - k;
    } else if (r->st == 1) {
        const float *f = r->f + j0;
#pragma omp simd reduction(+ : o, k)
        for (int64_t c = 0; c < n; c++) {
            o += f[c] == 0.0f;
            k += f[c] == -INFINITY;
        }
    } else {
        const float *f = r->f + j0 * r->st;
        const int64_t st = r->st;
#pragma omp simd reduction(+ : o, k)
        for (int64_t c = 0; c < n; c++) {
            o += f[c * st] == 0.0f;
            k += f[c * st] == -INFINITY;
        }
    }
    *open = o;
    *masked = k;
}

/* Scans one row: ORs each granule's flags into code[], writes its hull and returns whether
 * the hull is all open. */
static bool scan_row(const row_view *r, uint8_t *code, int64_t hull[2]) {
    int64_t first = -1, last_g = -1, opens = 0;
    for (int64_t g = 0, j0 = 0; j0 < r->lk; g++, j0 += ATTN_SUM_KEYS) {
        const int64_t n = r->lk - j0 < ATTN_SUM_KEYS ? r->lk - j0 : ATTN_SUM_KEYS;
        int open, masked;
        count_granule(r, j0, n, &open, &masked);
        code[g] |= (uint8_t)((open ? ATTN_SUM_OPEN : 0) | (masked ? ATTN_SUM_MASKED : 0) |
                             (open + masked < n ? ATTN_SUM_OTHER : 0));
        opens += open;
        if (masked == n) continue;
        last_g = g;
        if (first < 0)
            for (first = j0; cell_masked(r, first); first++) continue;
    }
    if (first < 0) {
        hull[0] = hull[1] = 0;
        return true;
    }
    int64_t last = last_g * ATTN_SUM_KEYS + ATTN_SUM_KEYS - 1;
    if (last >= r->lk) last = r->lk - 1;
    while (cell_masked(r, last)) last--;
    hull[0] = first;
    hull[1] = last + 1;
    /* every open cell lies in the hull: it is all open when they fill it */
    return opens == hull[1] - hull[0];
}

/* Block u of one tensor: rows qb * ATTN_SUM_ROWS ... of (b, h), collapsed. */
static void build_block(const attn_params *p, const attn_sum_one *t, const int64_t st[4],
                        bool is_bool, int64_t u) {
    const int64_t qb = u % t->qblocks, bh = u / t->qblocks, h = bh % t->nh, b = bh / t->nh;
    uint8_t *code = t->code + u * t->granules;
    memset(code, 0, (size_t)t->granules);
    row_view r = {.is_bool = is_bool, .st = st[3], .lk = p->Lk};
    const int64_t i_end = (qb + 1) * ATTN_SUM_ROWS < t->nq ? (qb + 1) * ATTN_SUM_ROWS : t->nq;
    for (int64_t i = qb * ATTN_SUM_ROWS; i < i_end; i++) {
        const int64_t x = b * st[0] + h * st[1] + i * st[2], row = bh * t->nq + i;
        r.m = is_bool ? (const uint8_t *)t->src + x : NULL;
        r.f = is_bool ? NULL : (const float *)t->src + x;
        t->dense[row] = scan_row(&r, code, t->hull + 2 * row);
    }
}

void ai_mask_summary_init(const attn_params *p, void *mem, attn_mask_summary *s) {
    both(p, s);
    if (p->block) {  // its summary is the block mask itself
        const attn_block_mask *m = p->block;
        s->block = (attn_sum_one){.src = m, .nb = m->nb, .nh = m->nh, .nq = m->Lq,
                                  .qblocks = m->qblocks, .granules = m->granules,
                                  .hull = m->hull, .dense = m->dense, .code = m->code};
    } else {
        s->block = (attn_sum_one){0};
    }
    char *at = mem;
    place(&s->mask, &at);
    place(&s->bias, &at);
    s->lengths = length_bytes(p) ? (int64_t *)at : NULL;
    s->scratch = s->lengths ? s->lengths + p->B : NULL;
}

/* ---- the questions ---------------------------------------------------------------------- */

static int64_t row_index(const attn_sum_one *t, int64_t b, int64_t h, int64_t i) {
    return ((t->nb == 1 ? 0 : b) * t->nh + (t->nh == 1 ? 0 : h)) * t->nq + (t->nq == 1 ? 0 : i);
}

/* block u of t, summarized first if no thread has done it yet */
static void ensure(const attn_params *p, const attn_sum_one *t, bool is_bool, int64_t u) {
    if (!t->state) return;  // built in advance
    if (atomic_load_explicit(&t->state[u], memory_order_acquire) == 2) return;
    int expected = 0;
    if (atomic_compare_exchange_strong_explicit(&t->state[u], &expected, 1, memory_order_acq_rel,
                                                memory_order_acquire)) {
        build_block(p, t, is_bool ? p->mask_s : p->bias_s, is_bool, u);
        atomic_store_explicit(&t->state[u], 2, memory_order_release);
        return;
    }
    while (atomic_load_explicit(&t->state[u], memory_order_acquire) != 2) sched_yield();
}

static bool narrow(const attn_params *p, const attn_sum_one *t, bool is_bool, int64_t b,
                   int64_t h, int64_t i, int64_t *lo, int64_t *hi) {
    if (!t->src) return true;
    const int64_t row = row_index(t, b, h, i), *hull = t->hull + 2 * row;
    ensure(p, t, is_bool, row / t->nq * t->qblocks + row % t->nq / ATTN_SUM_ROWS);
    if (hull[0] > *lo) *lo = hull[0];
    if (hull[1] < *hi) *hi = hull[1];
    if (*hi < *lo) *hi = *lo;
    return t->dense[row] != 0;
}

bool ai_mask_summary_row(const attn_params *p, const attn_mask_summary *s, int64_t b,
                         int64_t h, int64_t i, int64_t *lo, int64_t *hi) {
    const bool dm = narrow(p, &s->mask, true, b, h, i, lo, hi);
    const bool db = narrow(p, &s->bias, false, b, h, i, lo, hi);
    const bool dk = narrow(p, &s->block, true, b, h, i, lo, hi);
    return dm && db && dk;
}

/* the OR of one tensor's flags over the tile; ATTN_SUM_OPEN without the tensor */
static unsigned tile_flags(const attn_params *p, const attn_sum_one *t, bool is_bool, int64_t b,
                           int64_t h0, int64_t nh, int64_t qb, int64_t j0, int64_t nk) {
    if (!t->src) return ATTN_SUM_OPEN;
    const int64_t g0 = j0 / ATTN_SUM_KEYS, g1 = (j0 + nk - 1) / ATTN_SUM_KEYS;
    const int64_t heads = t->nh == 1 ? 1 : nh, qbi = t->nq == 1 ? 0 : qb;
    unsigned f = 0;
    for (int64_t hh = 0; hh < heads; hh++) {
        const int64_t bh = (t->nb == 1 ? 0 : b) * t->nh + (t->nh == 1 ? 0 : h0 + hh);
        ensure(p, t, is_bool, bh * t->qblocks + qbi);
        const uint8_t *code = t->code + (bh * t->qblocks + qbi) * t->granules;
        for (int64_t g = g0; g <= g1; g++) f |= code[g];
    }
    return f;
}

attn_tile_class ai_mask_summary_tile(const attn_params *p, const attn_mask_summary *s,
                                     int64_t b, int64_t h0, int64_t nh, int64_t qb, int64_t j0,
                                     int64_t nk) {
    const unsigned fm = tile_flags(p, &s->mask, true, b, h0, nh, qb, j0, nk);
    const unsigned fb = tile_flags(p, &s->bias, false, b, h0, nh, qb, j0, nk);
    const unsigned fk = tile_flags(p, &s->block, true, b, h0, nh, qb, j0, nk);
    if (fm == ATTN_SUM_MASKED || fb == ATTN_SUM_MASKED || fk == ATTN_SUM_MASKED)
        return ATTN_TILE_MASKED;
    if (fm == ATTN_SUM_OPEN && fb == ATTN_SUM_OPEN && fk == ATTN_SUM_OPEN) return ATTN_TILE_OPEN;
    return ATTN_TILE_MIXED;
}

attn_tile_class ai_mask_summary_rows(const attn_params *p, const attn_mask_summary *s,
                                     int64_t b, int64_t h, int64_t i0, int64_t i1, int64_t j0,
                                     int64_t nk) {
    const attn_tile_class first = ai_mask_summary_tile(p, s, b, h, 1, i0 / ATTN_SUM_ROWS, j0, nk);
    for (int64_t sb = i0 / ATTN_SUM_ROWS + 1; sb * ATTN_SUM_ROWS < i1; sb++)
        if (ai_mask_summary_tile(p, s, b, h, 1, sb, j0, nk) != first) return ATTN_TILE_MIXED;
    return first;
}

/* ---- key padding as key lengths --------------------------------------------------------- */

/* The open prefix of one row: e when cells [0, e) are open and [e, Lk) masked, -1 when the
 * row is not of that form (an "other" cell anywhere, a masked cell before an open one).
 * A unit-stride bool row: its first false byte by memchr, then whether any byte after it
 * is true (one OR over them); a unit-stride bias row likewise, its first cell that is not
 * +-0 found PREFIX_SUB cells at a time. A strided row: chunks of PREFIX_CHUNK cells
 * counted as the summary counts granules; the chunk where the prefix ends is searched
 * cell by cell, and the scan stops at the first chunk past it that is not all masked. */
enum { PREFIX_CHUNK = 128, PREFIX_SUB = 16 };
static int64_t row_prefix(const row_view *r) {
    if (r->is_bool && r->st == 1) {
        const uint8_t *z = memchr(r->m, 0, (size_t)r->lk);
        if (!z) return r->lk;
        const int64_t e = z - r->m, n = r->lk - e;
        unsigned any = 0;
#pragma omp simd reduction(| : any)
        for (int64_t c = 0; c < n; c++) any |= z[c];
        return any ? -1 : e;
    }
    if (!r->is_bool && r->st == 1) {
        const float *f = r->f;
        int64_t e = 0;
        for (; e + PREFIX_SUB <= r->lk; e += PREFIX_SUB) {
            unsigned other = 0;
#pragma omp simd reduction(| : other)
            for (int64_t c = 0; c < PREFIX_SUB; c++) other |= f[e + c] != 0.0f;
            if (other) break;
        }
        while (e < r->lk && f[e] == 0.0f) e++;
        unsigned kept = 0;  // a cell past the prefix that is not -inf (NaN included)
#pragma omp simd reduction(| : kept)
        for (int64_t c = e; c < r->lk; c++) kept |= f[c] != -INFINITY;
        return kept ? -1 : e;
    }
    int64_t e = r->lk;
    int open, masked;
    for (int64_t j0 = 0; j0 < r->lk; j0 += PREFIX_CHUNK) {
        const int64_t n = r->lk - j0 < PREFIX_CHUNK ? r->lk - j0 : PREFIX_CHUNK;
        count_granule(r, j0, n, &open, &masked);
        if (open == n) continue;
        e = j0;  // some cell of the chunk is not open: the prefix ends within it
        while (r->is_bool ? r->m[e * r->st] != 0 : r->f[e * r->st] == 0.0f) e++;
        break;
    }
    for (int64_t j0 = e; j0 < r->lk; j0 += PREFIX_CHUNK) {
        const int64_t n = r->lk - j0 < PREFIX_CHUNK ? r->lk - j0 : PREFIX_CHUNK;
        count_granule(r, j0, n, &open, &masked);
        if (masked != n) return -1;
    }
    return e;
}

/* tensor_lengths' check of one stored row against its batch's length: clears *pad_ok
 * where the row is not that key-padding prefix, *band_ok where it is not the causal band
 * cut at the length */
static void check_length_row(const attn_params *p, const attn_sum_one *t,
                             const int64_t st[4], bool is_bool, const int64_t *len,
                             int64_t row, atomic_int *pad_ok, atomic_int *band_ok) {
    const bool pad = atomic_load_explicit(pad_ok, memory_order_relaxed);
    const bool band = atomic_load_explicit(band_ok, memory_order_relaxed);
    if (!pad && !band) return;
    const int64_t per_batch = t->nh * t->nq;
    const int64_t i = row % t->nq, h = row / t->nq % t->nh, b = row / per_batch;
    const int64_t x = b * st[0] + h * st[1] + i * st[2];
    const row_view r = {.is_bool = is_bool, .st = st[3], .lk = p->Lk,
                        .m = is_bool ? (const uint8_t *)t->src + x : NULL,
                        .f = is_bool ? NULL : (const float *)t->src + x};
    const int64_t e = row_prefix(&r), n = len[b];
    if (pad && e != n) atomic_store_explicit(pad_ok, 0, memory_order_relaxed);
    if (band && e != (i + 1 < n ? i + 1 : n)) atomic_store_explicit(band_ok, 0, memory_order_relaxed);
}

/* One tensor (t, strides st, collapsed) as lengths: len[bb] for each of its t->nb batches,
 * *causal when the rows need the top-left causal band beside them; false when it is not
 * key padding. Each batch's n is the prefix of its last stored row; then every row is
 * checked in parallel: its prefix n (padding) or, for row i, min(n, i + 1) (padding cut by
 * the band). No memory but len: the scan stops once neither form can hold. */
static bool tensor_lengths(const attn_params *p, const attn_sum_one *t, const int64_t st[4],
                           bool is_bool, int64_t *len, bool *causal) {
    const int64_t rows = t->nb * t->nh * t->nq;
    for (int64_t bb = 0; bb < t->nb; bb++) {
        const int64_t x = bb * st[0] + (t->nq - 1) * st[2];
        const row_view r = {.is_bool = is_bool, .st = st[3], .lk = p->Lk,
                            .m = is_bool ? (const uint8_t *)t->src + x : NULL,
                            .f = is_bool ? NULL : (const float *)t->src + x};
        len[bb] = row_prefix(&r);
        if (len[bb] < 0) return false;
    }
    /* with one stored row for all query rows (nq = 1), only a single query row can be
     * causal-shaped */
    atomic_int pad_ok, band_ok;
    atomic_init(&pad_ok, 1);
    atomic_init(&band_ok, t->nq > 1 || p->Lq <= 1);
    /* without the team, a plain loop: a parallel region with its if clause false still
     * ends on a barrier, a system call (docs/KERNELS.md, "Threads for tiny calls") */
    if (attn_run_parallel(p, 1.0)) {
#pragma omp parallel for schedule(static) num_threads(p->threads)
        for (int64_t row = 0; row < rows; row++)
            check_length_row(p, t, st, is_bool, len, row, &pad_ok, &band_ok);
    } else {
        for (int64_t row = 0; row < rows; row++)
            check_length_row(p, t, st, is_bool, len, row, &pad_ok, &band_ok);
    }
    const bool all_pad = atomic_load(&pad_ok), all_band = atomic_load(&band_ok);
    *causal = !all_pad;
    return all_pad || all_band;
}

/* p's mask and bias as key lengths in lengths[0 .. B) (scratch[0 .. B) for the bias's) */
static bool key_lengths(const attn_params *p, int64_t *lengths, int64_t *scratch,
                        attn_params *out) {
    if (!(p->mask || p->bias) || p->B == 0 || p->Hq == 0 || p->Lq == 0) return false;
    /* a bottom-right diagonal sits at i + kv_len - Lq: shorter lengths would move it */
    const bool banded = p->causal || p->win_left >= 0 || p->win_right >= 0 || p->alibi;
    if (p->align == ATTN_ALIGN_BOTTOM_RIGHT && banded) return false;
    attn_mask_summary s;
    both(p, &s);  // the collapsed dims only: no summary memory
    bool cm = false, cb = false;
    if (s.mask.src && !tensor_lengths(p, &s.mask, p->mask_s, true, lengths, &cm)) return false;
    if (s.bias.src && !tensor_lengths(p, &s.bias, p->bias_s, false, scratch, &cb)) return false;
    /* each batch's length: the least of the call's own, the mask's and the bias's (a
     * tensor broadcast over the batches has one) */
    for (int64_t b = p->B - 1; b >= 0; b--) {
        int64_t n = attn_key_len(p, b);
        if (s.mask.src) {
            const int64_t m = lengths[s.mask.nb == 1 ? 0 : b];
            if (m < n) n = m;
        }
        if (s.bias.src) {
            const int64_t m = scratch[s.bias.nb == 1 ? 0 : b];
            if (m < n) n = m;
        }
        lengths[b] = n;  // from the last batch: entry 0 of a broadcast mask is read last
    }
    *out = *p;
    out->mask = NULL;
    out->bias = NULL;
    out->kv_len = lengths;
    out->kv_len_dtype = ATTN_I64;
    out->kv_len_s = 1;
    if (cm || cb) {  // min(n, i + 1) and the call's own band, top-left (checked above)
        out->causal = true;
        out->align = ATTN_ALIGN_TOP_LEFT;
    }
    return true;
}

bool ai_mask_summary_lengths(const attn_params *p, const attn_mask_summary *s,
                             attn_params *out) {
    return s->lengths && key_lengths(p, s->lengths, s->scratch, out);
}

size_t ai_key_padding_bytes(const attn_params *p) {
    if (p->path != ATTN_PATH_FUSED || (uint64_t)p->B > SIZE_MAX / 64) return 0;
    const size_t bytes = length_bytes(p);
    return bytes ? bytes + 64 : 0;  // + 64: to align
}

const attn_params *ai_key_padding(const attn_params *p, void *mem, attn_params *out) {
    if (!ai_key_padding_bytes(p)) return p;
    int64_t *lengths = (int64_t *)(((uintptr_t)mem + 63) & ~(uintptr_t)63);
    return key_lengths(p, lengths, lengths + p->B, out) ? out : p;
}
