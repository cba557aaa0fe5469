/*
 * attn_internal.h — what the library's parts share and users never see: the params
 *                   struct every kernel reads, the structural key range of a row, and
 *                   the entry points of the paths.
 *
 * The params are filled and validated in one place (params.c, ai_params_init); the
 * paths trust them. Shapes and strides are in elements, int64 throughout.
 */
#ifndef ATTN_INTERNAL_H
#define ATTN_INTERNAL_H

#include <math.h>
#include <stdbool.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stddef.h>
#include <stdint.h>

#include "attn.h"
#include "philox.h"

#define ATTN_PRIVATE __attribute__((visibility("hidden")))

/* Return the status of expr from the calling function when it is not ATTN_OK: the
 * library's argument checks, written once. */
#define TRY(expr)                               \
    do {                                        \
        attn_status st_ = (expr);               \
        if (st_ != ATTN_OK) return st_;         \
    } while (0)

/* Bytes of one element of dtype t (0 outside the list), from the dtype list: inline, so
 * that a kernel's compile-time dtype folds it to a constant. */
static inline int64_t attn_elem_bytes(attn_dtype t) {
    switch (t) {
#define ATTN_X_SIZE(e, name, bytes) case e: return bytes;
        ATTN_DTYPE_LIST(ATTN_X_SIZE)
#undef ATTN_X_SIZE
    default: return 0;
    }
}

/* q8_0 (attn.h): 32 elements a block of 34 bytes, the float16 scale first; q4_0: 32
 * elements a block of 18 bytes, the float16 scale then 16 bytes of 4-bit pairs. The
 * block dtypes (attn_is_block_dtype) share the rules below: element offset e (any sign)
 * is position e mod 32 of block floor(e / 32), at attn_elem_bytes (the list's bytes of
 * one block) times that from data. */
enum { ATTN_Q8_0_BLOCK = 32, ATTN_Q8_0_BYTES = 34, ATTN_Q4_0_BLOCK = 32, ATTN_Q4_0_BYTES = 18 };
/* u4 (attn.h): 32 elements a block of 16 bytes, no scale inside: element i the low nibble
 * of byte i / 2 when i is even, the high one when odd; the scales and zeros are outside
 * (attn_params' u4_scale, u4_zero) */
enum { ATTN_U4_BLOCK = 32, ATTN_U4_BYTES = 16 };
static inline bool attn_is_block_dtype(attn_dtype t) {
    return t == ATTN_Q8_0 || t == ATTN_Q4_0 || t == ATTN_U4;
}
/* The code (0..15) of element pos of the run of u4 blocks that starts at blk (16 bytes a
 * block of 32: byte pos / 2, whichever block) */
static inline int attn_u4_code(const uint8_t *blk, int64_t pos) {
    return pos % 2 == 0 ? blk[pos / 2] & 0x0F : blk[pos / 2] >> 4;
}
/* The value of a u4 code: c * scale + zero rounded once (KIVI's c * scale + min) */
static inline float attn_u4_value(int c, float scale, float zero) {
    return fmaf((float)c, scale, zero);
}
static inline int64_t attn_q8_0_block_of(int64_t e) {
    const int64_t q = e / ATTN_Q8_0_BLOCK;
    return e % ATTN_Q8_0_BLOCK < 0 ? q - 1 : q;
}

/* The byte offset from a tensor's data of the row that starts at element offset e (for
 * a block dtype, e is a multiple of 32: the block's first byte, its scale). */
static inline int64_t attn_row_byte_offset(attn_dtype t, int64_t e) {
    return attn_is_block_dtype(t) ? attn_q8_0_block_of(e) * attn_elem_bytes(t) : e * attn_elem_bytes(t);
}

/* The bytes of a row of n elements at unit stride (a block dtype: n a multiple of 32). */
static inline int64_t attn_row_bytes(attn_dtype t, int64_t n) {
    return attn_is_block_dtype(t) ? n / 32 * attn_elem_bytes(t) : n * attn_elem_bytes(t);
}

/* A block dtype's layout rules (attn.h, q8_0's) on a tensor ai_check_tensor has
 * accepted otherwise: shape[3] a multiple of 32, stride[3] = 1, stride[0..2] multiples
 * of 32 (on dims of size > 1), and its byte offsets within int64 (core.c). */
ATTN_PRIVATE attn_status ai_check_q8_0_layout(const attn_tensor *t, const char *name);

/* Whether one row of n float32 values (stride xs, n a multiple of 32) can be quantized
 * into q8_0 blocks (q8_0.c): the index of the first block it refuses (a NaN or infinity,
 * or a scale beyond float16), -1 when none, so that a refused append writes nothing. */
ATTN_PRIVATE int64_t ai_q8_0_row_check(const float *x, int64_t xs, int64_t n);

/* The portable dequantization of n q8_0 blocks into 32 n floats (q8_0.c); the kernels'
 * dequant_q8_0 entry where they have none. */
ATTN_PRIVATE void ai_dequant_q8_0_blocks(int64_t n, const uint8_t *src, float *dst);

/* q4_0's counterparts (q4_0.c): the first block of a row it refuses (a NaN or infinity,
 * or a scale max / -8 beyond float16) or -1; one block of 32 quantized as
 * attn_quantize_q4_0 does; n blocks dequantized, d * (nibble - 8), exact in float32. */
ATTN_PRIVATE int64_t ai_q4_0_row_check(const float *x, int64_t xs, int64_t n);
ATTN_PRIVATE void ai_q4_0_quantize_block(const float *x, uint8_t *out);
ATTN_PRIVATE void ai_dequant_q4_0_blocks(int64_t n, const uint8_t *src, float *dst);

/* Either block dtype dt (q8_0.c): its row check, and one row of n floats (stride xs, n
 * a multiple of 32) quantized into n / 32 contiguous blocks at dst. */
ATTN_PRIVATE int64_t ai_block_row_check(attn_dtype dt, const float *x, int64_t xs, int64_t n);
ATTN_PRIVATE void ai_block_quantize_row(attn_dtype dt, const float *x, int64_t xs, int64_t n,
                                        uint8_t *dst);

/* The public conversions of a block dtype, written once for both (q8_0.c): src float32
 * into dst of block dtype dt (row_check refusing first, then quantize_row), and back. */
ATTN_PRIVATE attn_status ai_block_quantize(attn_dtype dt, const attn_tensor *src,
                                           const attn_tensor *dst);
ATTN_PRIVATE attn_status ai_block_dequantize(attn_dtype dt, const attn_tensor *src,
                                             const attn_tensor *dst);

/* An fp8 cache's k_scale or v_scale (attn.h) checked against the cache's dtype and Hkv
 * (core.c): *data its first float (NULL: none given, scale 1), *stride the step between
 * key/value heads (0: one for all). */
ATTN_PRIVATE attn_status ai_check_kv_scale(const attn_tensor *t, const char *name,
                                           attn_dtype kv_dt, int64_t Hkv, bool need_data,
                                           const float **data, int64_t *stride);

/* The scale of key/value head g: 1 when none was given (every dtype but fp8). */
static inline float attn_kv_scale(const float *s, int64_t stride, int64_t g) {
    return s ? s[g * stride] : 1.0f;
}

/* options.threads above this are taken as this */
#define ATTN_MAX_THREADS 512

/* A configuration the tuner chose for a call's shape class (wisdom.h); every field 0
 * (NULL) is the static choice of that field, so the zero configuration is exactly the
 * library without wisdom.
 *   kernels  the micro-kernels (one this CPU runs), NULL: dispatch.c's choice
 *   bq, bk   the tiles of the class's use (the forward's, or the backward's): bq a
 *            multiple of the kernel's row_pad in [16, ATTN_FWD_BQ_LIMIT], bk a multiple of
 *            row_pad in [bk_min, bk_max] (kernels/list.h); 0: ai_choose_tiles' rule
 *   split    decoding only: the most key chunks of an item, 1..ATTN_TUNE_SPLIT_MAX (1: no
 *            split); 0: fused.c's rule */
typedef struct attn_tune_config {
    const struct attn_kernels *kernels;
    int32_t bq, bk, split;
} attn_tune_config;
#define ATTN_TUNE_SPLIT_MAX 16

/* Index letters: b batch, h query head, g key/value head, i query row, j key row,
 * d position along Dk or Dv. */
typedef struct attn_params {
    int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
    int64_t group;                 /* Hq / Hkv: query heads per key/value head       */

    /* data of dtype q_dt, kv_dt (k and v alike) and o_dt: F32, F16 or BF16 (kv_dt also
     * Q8_0, FP8_E4M3, FP8_E5M2; the fp8 ones times k_scale, v_scale below) */
    const void *q;   int64_t q_s[4];   /* (B, Hq,  Lq, Dk) */
    const void *k;   int64_t k_s[4];   /* (B, Hkv, Lk, Dk) */
    const void *v;   int64_t v_s[4];   /* (B, Hkv, Lk, Dv) */
    void *o;         int64_t o_s[4];   /* (B, Hq,  Lq, Dv) */
    attn_dtype q_dt, kv_dt, o_dt;
    attn_precision precision;

    float scale;
    float softcap;                 /* 0 = off                                        */
    bool causal;
    attn_align align;
    int64_t win_left, win_right;   /* -1 = unbounded; both -1 when there is no window */

    /* masks broadcast as (B|1, Hq|1, Lq|1, Lk|1): stride 0 on the broadcast dims */
    const uint8_t *mask;  int64_t mask_s[4];   /* true = attend                      */
    const float *bias;    int64_t bias_s[4];   /* added to the logits                 */
    const void *kv_len;   attn_dtype kv_len_dtype;  int64_t kv_len_s;   /* (B)       */
    const float *alibi;   int64_t alibi_s;                               /* (Hq)      */

    float *lse;      int64_t lse_s[3];     /* (B, Hq, Lq)      or NULL */
    float *weights;  int64_t w_s[4];       /* (B, Hq, Lq, Lk)  or NULL */

    attn_path path;                /* resolved: never AUTO                           */
    const struct attn_kernels *kernels;  /* the fused path's micro-kernels          */
    attn_tune_config tune;         /* the wisdom's configuration of the call's class
                                      (wisdom.h); its kernels, if any, are kernels    */
    int threads;                   /* resolved: >= 1                                 */

    /* attention sinks: one extra logit per query head in each row's denominator, no
     * value (attn_options.sinks); NULL = none */
    const float *sinks;   int64_t sinks_s;                               /* (Hq)      */

    /* float64 calls only (q_dt = kv_dt = o_dt = ATTN_F64): an opt->lse of dtype float64
     * is held here (strides in lse_s) and lse is NULL; a float32 one stays in lse. */
    double *lse64;
    /* the scale the float64 arithmetic uses: (double)scale, except in a float64 call,
     * where it is options.scale_f64 (when given) or 1/sqrt(Dk) in float64 */
    double scale64;
    /* dropout (philox.h): off when !dropout. drop_threshold = round(p 2^32) (keep a
     * word u iff u >= it), drop_scale = 1 / (1 - p) in float (0 when p = 1),
     * drop_scale64 the same in double for the reference */
    bool dropout;
    float dropout_p;
    uint64_t drop_seed, drop_offset, drop_threshold;
    float drop_scale;
    double drop_scale64;
    /* dropout's layout when this call is one piece of a larger one (a sequence of a
     * packed batch, varlen.c): its batch b draws the rows of batch b + drop_b0 of a call
     * of drop_Lq rows and drop_Lk keys (philox.h's r and n). 0, 0, 0 (the default): the
     * call's own b, Lq and Lk. Read only through attn_drop_row and attn_drop_keys. */
    int64_t drop_b0, drop_Lq, drop_Lk;
    /* a paged cache (opt->block_table), NULL when k and v are contiguous: k_s, v_s are
     * then the pools' strides (page, Hkv, row in page, D) and row j of batch b is row
     * j % page_size of page block_table[b * bt_s[0] + (j / page_size) * bt_s[1]];
     * every entry a valid key reaches is in [0, num_pages) (checked by params.c) */
    const int32_t *block_table;  int64_t bt_s[2];
    int64_t page_size, num_pages;
    /* a block mask (opt->block_mask, block_mask.c), NULL = none; and a score function
     * (opt->score_mod) with its derivative (NULL in a forward call that gave none) */
    const struct attn_block_mask *block;
    float (*score_mod)(float, int64_t, int64_t, int64_t, int64_t, void *);
    float (*score_mod_grad)(float, int64_t, int64_t, int64_t, int64_t, void *);
    void *score_mod_ctx;
    /* an fp8 cache's scales (opt->k_scale, v_scale), read through attn_kv_scale: NULL =
     * 1; stride 0 = one for every key/value head */
    const float *k_scale, *v_scale;
    int64_t k_scale_s, v_scale_s;
    /* every head's e4m3 scales at most 2^100, so 2^8 times each is finite (params.c; true
     * for the other dtypes): a decoding step may fold e4m3's 2^8 into them */
    bool kv_scale_folds;
    /* a u4 cache's scales and zeros (kv_dt ATTN_U4; NULL otherwise), [0] the keys'
     * (B, Hkv, ceil(Lk / u4_group), Dk), [1] the values' (B, Hkv, Lk, Dv / 32), read
     * through ai_u4_row; u4_group the keys of a key group */
    const float *u4_scale[2], *u4_zero[2];
    int64_t u4_scale_s[2][4], u4_zero_s[2][4];
    int64_t u4_group;
} attn_params;

/* Row j of key/value head g, batch b, of a u4 cache (values: the V side, else K): the n
 * codes of the n / 32 blocks at row (16 bytes each) as float32 into dst, each
 * fmaf(c, scale, zero) with the row's scales and zeros (u4.c). */
ATTN_PRIVATE void ai_u4_row(const attn_params *p, bool values, int64_t b, int64_t g, int64_t j,
                            const uint8_t *row, int64_t n, float *dst);
/* Element d of that row, the same value (the reference's reading). */
ATTN_PRIVATE float ai_u4_load(const attn_params *p, bool values, int64_t b, int64_t g, int64_t j,
                              int64_t d);
/* The u4 options of a forward call (params.c): opt's k_scale, k_zero, v_scale, v_zero and
 * kv_group checked against the call's shapes and filled into p (u4.c). */
ATTN_PRIVATE attn_status ai_u4_fill(attn_params *p, const attn_options *opt, bool need_data);

/* The block mask's layout (attn.h's opaque attn_block_mask; made by block_mask.c, read
 * by the mask summary and per logit by attn_block_keep). Blocks of ATTN_BLOCK_ROWS query
 * rows x ATTN_BLOCK_KEYS keys (the mask summary's, mask_summary.h); a dim of nb or nh 1
 * is shared by every batch or head. */
enum { ATTN_BLOCK_ROWS = 64, ATTN_BLOCK_KEYS = 16 };
enum { ATTN_BLOCK_FULL = 1, ATTN_BLOCK_EMPTY = 2, ATTN_BLOCK_PARTIAL = 3 };  // OR of the two
struct attn_block_mask {
    int64_t nb, nh, Lq, Lk;       // B or 1, H or 1
    int64_t qblocks, granules;    // ceil(Lq / ATTN_BLOCK_ROWS), ceil(Lk / ATTN_BLOCK_KEYS)
    int64_t *hull;                // (nb, nh, Lq, 2): [first, past-the-last) kept key; [0, 0)
    uint8_t *dense;               // (nb, nh, Lq): every key of the hull is kept
    uint8_t *code;                // (nb, nh, qblocks, granules): ATTN_BLOCK_FULL, _EMPTY, _PARTIAL
    int64_t *slot;                // the same cells: a partial block's index in cells, else -1
    uint8_t *cells;               // (partial, ATTN_BLOCK_ROWS, ATTN_BLOCK_KEYS): 1 = kept
    int64_t empty, full, partial;
    size_t bytes;
};

/* Whether block mask m keeps key j of row i, head h, batch b (all within its dims). */
static inline bool attn_block_keep(const struct attn_block_mask *m, int64_t b, int64_t h,
                                   int64_t i, int64_t j) {
    const int64_t u = (((m->nb == 1 ? 0 : b) * m->nh + (m->nh == 1 ? 0 : h)) * m->qblocks +
                       i / ATTN_BLOCK_ROWS) * m->granules + j / ATTN_BLOCK_KEYS;
    const uint8_t c = m->code[u];
    if (c != ATTN_BLOCK_PARTIAL) return c == ATTN_BLOCK_FULL;
    return m->cells[(m->slot[u] * ATTN_BLOCK_ROWS + i % ATTN_BLOCK_ROWS) * ATTN_BLOCK_KEYS +
                    j % ATTN_BLOCK_KEYS] != 0;
}

/* Row i of head h, batch b under block mask m: s[c * ld] = -inf for each key j0 + c
 * (0 <= c < n) that m does not keep; the others are left as they are. */
ATTN_PRIVATE void ai_block_mask_row(const struct attn_block_mask *m, int64_t b, int64_t h,
                                    int64_t i, int64_t j0, int64_t n, float *s, int64_t ld);

/* The dropout row r of (b, h, i) and the key count of the group formula (philox.h),
 * through the call's layout (drop_b0, drop_Lq, drop_Lk above): every path that draws a
 * mask asks these, never p->Lq or p->Lk. */
static inline uint64_t attn_drop_row(const attn_params *p, int64_t b, int64_t h, int64_t i) {
    const int64_t lq = p->drop_Lq ? p->drop_Lq : p->Lq;
    return attn_dropout_row((uint64_t)(b + p->drop_b0), (uint64_t)h, (uint64_t)i,
                            (uint64_t)p->Hq, (uint64_t)lq);
}
static inline uint64_t attn_drop_keys(const attn_params *p) {
    return (uint64_t)(p->drop_Lk ? p->drop_Lk : p->Lk);
}

/* The sink logit of query head h: -inf (no sink) when the call has none. */
static inline float attn_sink(const attn_params *p, int64_t h) {
    return p->sinks ? p->sinks[h * p->sinks_s] : -INFINITY;
}

/* The page of a block table bt (strides bt_s) that holds row j of sequence b (core/pages.h
 * checks the tables). */
static inline int64_t ai_page_of(const int32_t *bt, const int64_t bt_s[2], int64_t b,
                                 int64_t j, int64_t page_size) {
    return bt[b * bt_s[0] + (j / page_size) * bt_s[1]];
}

/* The one place that decides where key/value row j of (b, g) lives: its offset in
 * elements in a tensor of strides st (k_s or v_s), contiguous or through the pages. A
 * cache dtype whose rows are not whole elements changes this and the conversion of a
 * block of rows (fused.c kv_block), nothing else. */
static inline int64_t attn_kv_offset(const attn_params *p, const int64_t st[4], int64_t b,
                                     int64_t g, int64_t j) {
    if (!p->block_table) return b * st[0] + g * st[1] + j * st[2];
    const int64_t page = ai_page_of(p->block_table, p->bt_s, b, j, p->page_size);
    return page * st[0] + g * st[1] + (j % p->page_size) * st[2];
}

/* Whether rows j0 .. j0+nk-1 lie at one stride st[2] apart from row j0 (nk >= 1): always
 * in a contiguous cache, within one page in a paged one. */
static inline bool attn_kv_one_run(const attn_params *p, int64_t j0, int64_t nk) {
    return !p->block_table || j0 / p->page_size == (j0 + nk - 1) / p->page_size;
}

/* The key length of batch b: kv_len[b], or Lk. */
static inline int64_t attn_key_len(const attn_params *p, int64_t b) {
    if (!p->kv_len) return p->Lk;
    if (p->kv_len_dtype == ATTN_I32)
        return ((const int32_t *)p->kv_len)[b * p->kv_len_s];
    return ((const int64_t *)p->kv_len)[b * p->kv_len_s];
}

/* The diagonal d_i of row i in batch b (CONTRACT: top-left d_i = i, bottom-right
 * d_i = i + Lk_b - Lq). */
static inline int64_t attn_diagonal(const attn_params *p, int64_t lk_b, int64_t i) {
    return p->align == ATTN_ALIGN_BOTTOM_RIGHT ? i + lk_b - p->Lq : i;
}

/* The keys row i may read: [*lo, *hi), possibly empty. Everything outside (beyond the
 * key length, outside the causal band or the window) is masked by structure and is
 * never read. Written to avoid overflow for any window size up to INT64_MAX. */
static inline void attn_row_range(const attn_params *p, int64_t lk_b, int64_t i,
                                  int64_t *lo, int64_t *hi) {
    int64_t d = attn_diagonal(p, lk_b, i);
    int64_t a = 0, e = lk_b;
    if (p->causal && d + 1 < e) e = d + 1;
    if (p->win_left >= 0 && p->win_left < d) a = d - p->win_left;
    if (p->win_right >= 0 && p->win_right < lk_b - d) {
        int64_t r = d + p->win_right + 1;
        if (r < e) e = r;
    }
    if (e < a) e = a;
    if (a > lk_b) a = e = lk_b;
    *lo = a;
    *hi = e;
}

/* Everything about logit s_ij beyond scale·dot: score function, softcap, float bias,
 * ALiBi, bool mask, block mask.
 * Returns the final logit, -INFINITY when masked. Shared by every path so that they
 * cannot disagree on the order of operations (CONTRACT: softcap, then bias, then masks). */
static inline float attn_finish_logit(const attn_params *p, float s, int64_t b, int64_t h,
                                      int64_t i, int64_t j, int64_t d_i) {
    if (p->score_mod) s = p->score_mod(s, b, h, i, j, p->score_mod_ctx);
    if (p->softcap > 0.0f) s = p->softcap * tanhf(s / p->softcap);
    if (p->bias) {  // a -inf bias masks its key whatever s is (NaN and +inf included)
        const float x =
            p->bias[b * p->bias_s[0] + h * p->bias_s[1] + i * p->bias_s[2] + j * p->bias_s[3]];
        if (x == -INFINITY) return -INFINITY;
        s += x;
    }
    if (p->alibi) {
        int64_t dist = d_i > j ? d_i - j : j - d_i;
        s -= p->alibi[h * p->alibi_s] * (float)dist;
    }
    if (p->mask &&
        !p->mask[b * p->mask_s[0] + h * p->mask_s[1] + i * p->mask_s[2] + j * p->mask_s[3]])
        s = -INFINITY;
    if (p->block && !attn_block_keep(p->block, b, h, i, j)) s = -INFINITY;
    return s;
}

/* True when the n rows of width `width` (stride ld) hold no NaN or Inf: a sum of x * 0 is
 * 0 exactly then, NaN otherwise. Where a weight of 0 (masked or dropped) must not multiply
 * its row, a tile that passes may still take the kernels' plain product. */
static inline bool attn_rows_finite(const float *x, int64_t ld, int64_t n, int64_t width) {
    float z = 0.0f;
    for (int64_t r = 0; r < n; r++) {
        const float *x_r = x + r * ld;
#pragma omp simd reduction(+ : z)
        for (int64_t d = 0; d < width; d++) z += x_r[d] * 0.0f;
    }
    return z == 0.0f;
}

/* True when the call has per-element terms beyond scale·dot. */
static inline bool attn_has_elementwise(const attn_params *p) {
    return p->softcap > 0.0f || p->bias || p->alibi || p->mask || p->block || p->score_mod;
}

/* The one place that fills attn_params from the public arguments (params.c). need_data =
 * false for workspace queries, which may come before any buffer exists. On failure the
 * detail is in attn_last_error(). */
ATTN_PRIVATE attn_status ai_params_init(attn_params *p, const attn_tensor *q,
                                        const attn_tensor *k, const attn_tensor *v,
                                        const attn_tensor *o, const attn_options *opt,
                                        bool need_data);
/* ai_params_init for a call of a given use: backward (the backward's forward params)
 * or a forward; its fused path takes the configuration of its shape class, force when
 * not NULL (the tuner's candidates, tune.c), else the process's wisdom (wisdom.h). */
ATTN_PRIVATE attn_status ai_params_init_for(attn_params *p, const attn_tensor *q,
                                            const attn_tensor *k, const attn_tensor *v,
                                            const attn_tensor *o, const attn_options *opt,
                                            bool need_data, bool backward,
                                            const attn_tune_config *force);

/* Dropout's layout for a call that is one piece of a larger one (attn_params' drop_b0,
 * drop_Lq, drop_Lk): the packed batches of varlen.c run each sequence as a call of
 * B = 1 whose batch 0 is batch b0 of a padded [B, Hq, Lq, Lk] call. */
typedef struct attn_drop_layout {
    int64_t b0, Lq, Lk;
} attn_drop_layout;

static inline void attn_set_drop_layout(attn_params *p, const attn_drop_layout *d) {
    if (!d) return;
    p->drop_b0 = d->b0;
    p->drop_Lq = d->Lq;
    p->drop_Lk = d->Lk;
}

/* attn_forward with dropout's layout `drop` (NULL: the call's own), and everything else
 * as attn_forward: the checks, the workspace (opt's or allocated), the path (piece.c). */
/* The workspace a forward call of params p takes: its path's, then the key lengths of
 * ai_key_padding; (size_t)-1 when the size overflows (piece.c). */
ATTN_PRIVATE size_t ai_forward_bytes(const attn_params *p);
ATTN_PRIVATE attn_status ai_forward_piece(const attn_tensor *q, const attn_tensor *k,
                                          const attn_tensor *v, const attn_tensor *o,
                                          const attn_options *opt,
                                          const attn_drop_layout *drop);
/* attn_forward with options.key_scores: the forward, then the eviction scores from its
 * LSE (key_scores.c). */
ATTN_PRIVATE attn_status ai_forward_key_scores(const attn_tensor *q, const attn_tensor *k,
                                               const attn_tensor *v, const attn_tensor *o,
                                               const attn_options *opt);
/* attn_backward likewise (backward.c). */
ATTN_PRIVATE attn_status ai_backward_piece(const attn_tensor *q, const attn_tensor *k,
                                           const attn_tensor *v, const attn_tensor *o,
                                           const attn_tensor *d_o, const attn_tensor *lse,
                                           const attn_tensor *dq, const attn_tensor *dk,
                                           const attn_tensor *dv, const attn_options *opt,
                                           const attn_drop_layout *drop);

/* attn_forward and attn_backward on the fused path with the configuration force instead
 * of the wisdom's (the tuner's candidates, tune.c; force's fields 0 keep the static
 * choice): float32 backward calls without key padding, forward calls of any cache dtype
 * but float64 (a bool mask that is key padding runs as key lengths, as in attn_forward;
 * `attn bench` times its masked rows' static column so), ATTN_ERR_UNSUPPORTED otherwise; no aliasing check (the tuner's own
 * buffers). piece.c and backward.c. */
ATTN_PRIVATE attn_status ai_forward_forced(const attn_tune_config *force, const attn_tensor *q,
                                           const attn_tensor *k, const attn_tensor *v,
                                           const attn_tensor *o, const attn_options *opt);
ATTN_PRIVATE attn_status ai_backward_forced(const attn_tune_config *force,
                                            const attn_tensor *q, const attn_tensor *k,
                                            const attn_tensor *v, const attn_tensor *o,
                                            const attn_tensor *d_o, const attn_tensor *lse,
                                            const attn_tensor *dq, const attn_tensor *dk,
                                            const attn_tensor *dv, const attn_options *opt);

/* The workspace the two above need with force (as attn_forward_workspace_size and
 * attn_backward_workspace_size do with the wisdom's): `attn bench` sizes one workspace
 * for both of a pair of static and tuned calls. */
ATTN_PRIVATE attn_status ai_forward_forced_workspace_size(
    const attn_tune_config *force, const attn_tensor *q, const attn_tensor *k,
    const attn_tensor *v, const attn_tensor *o, const attn_options *opt, size_t *bytes);
ATTN_PRIVATE attn_status ai_backward_forced_workspace_size(
    const attn_tune_config *force, const attn_tensor *q, const attn_tensor *k,
    const attn_tensor *v, const attn_tensor *o, const attn_tensor *d_o,
    const attn_tensor *lse, const attn_tensor *dq, const attn_tensor *dk,
    const attn_tensor *dv, const attn_options *opt, size_t *bytes);

/* The workspace of a call needing `need` bytes ((size_t)-1: the size overflowed): the
 * caller's opt->workspace if it is large enough, else ATTN_ERR_WORKSPACE; or, without
 * one, a malloc the caller frees through *owned. */
ATTN_PRIVATE attn_status ai_workspace_acquire(const attn_options *opt, size_t need,
                                              void **ws, void **owned);

/* A tensor's soundness: present, of dtype `want` (ATTN_DTYPE_COUNT: any of float32,
 * float16, bfloat16), sizes >= 0, element count and extreme offsets within int64, data
 * present when non-empty. And an output's: no element reachable twice through its first
 * `dims` strides. Both record the failure's detail (core.c). */
ATTN_PRIVATE attn_status ai_check_tensor(const attn_tensor *t, const char *name,
                                         attn_dtype want, bool need_data);
ATTN_PRIVATE attn_status ai_check_output_strides(const attn_tensor *t, const char *name,
                                                 int dims);

/* Whether two views can share a byte (exact; overlap.c says how). Empty views and views
 * with NULL data share none. */
ATTN_PRIVATE bool ai_views_overlap(const attn_tensor *a, const attn_tensor *b);

/* ATTN_ERR_STRIDE (with the detail) when an output of attn_forward — o, opt->lse,
 * opt->weights, or the first ws_need bytes of opt->workspace — shares a byte with any
 * input (q, k, v, mask, bias, kv_len, alibi_slopes) or another output (overlap.c). Run on
 * the call's own tensors after ai_params_init accepted them; not by the workspace
 * query, which reads no data pointer. */
ATTN_PRIVATE attn_status ai_check_forward_aliasing(const attn_tensor *q, const attn_tensor *k,
                                                   const attn_tensor *v, const attn_tensor *o,
                                                   const attn_options *opt, size_t ws_need);

/* The same rule for any call: each output (NULL entries skipped) against every input and
 * every output before it, then the first ws_need bytes of opt->workspace against all of
 * them; ATTN_ERR_STRIDE naming both. At most 32 tensors in all. */
ATTN_PRIVATE attn_status ai_check_aliasing(const attn_tensor *const *in,
                                           const char *const *in_names, int n_in,
                                           const attn_tensor *const *out,
                                           const char *const *out_names, int n_out,
                                           const attn_options *opt, size_t ws_need);

/* n bytes at p as a one-dimensional tensor (of bool), for the overlap rule of a raw array
 * (the additive weights, a saved buffer): empty when p is NULL or n <= 0. */
static inline attn_tensor attn_bytes_view(const void *p, int64_t n) {
    return (attn_tensor){(void *)(uintptr_t)p, ATTN_BOOL, {n > 0 && p ? n : 0, 1, 1, 1},
                         {1, 1, 1, 1}};
}

/* What the params hold for tensor t: its data and its first n strides into s, or, when
 * t is empty, the address of a small static block no path touches and strides 0 (core.c). */
ATTN_PRIVATE const void *ai_view_data(const attn_tensor *t, int64_t *s, int n);

/* "float32", "float16", ... for messages */

/* Records the detail of a failure for attn_last_error() and returns status. */
ATTN_PRIVATE attn_status ai_fail(attn_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* A success: clears attn_last_error() (every call's success does) and returns ATTN_OK. */
ATTN_PRIVATE attn_status ai_ok(void);

/* paths; each returns ATTN_OK or ATTN_ERR_WORKSPACE/NOMEM. The workspace functions
 * return the bytes the path needs, (size_t)-1 on overflow. */
ATTN_PRIVATE size_t ai_fused_workspace(const attn_params *p);
ATTN_PRIVATE attn_status ai_fused_forward(const attn_params *p, void *ws);
/* The float64 fused path (fused_f64.c): q, k, v, o all ATTN_F64. */
ATTN_PRIVATE size_t ai_fused_f64_workspace(const attn_params *p);
ATTN_PRIVATE attn_status ai_fused_f64_forward(const attn_params *p, void *ws);
ATTN_PRIVATE size_t ai_reference_workspace(const attn_params *p);
ATTN_PRIVATE attn_status ai_reference_forward(const attn_params *p, void *ws);
/* The float64 reference's logit from raw = scale * (q_i · k_j), in the CONTRACT's order:
 * softcap (*cap gets its factor 1 - tanh² when cap is not NULL), + bias, - ALiBi, then the
 * bool mask (-inf). Shared by the reference forward and the reference backward. */
ATTN_PRIVATE double ai_ref_finish(const attn_params *p, double raw, int64_t b, int64_t h,
                                  int64_t i, int64_t j, int64_t d_i, double *cap);

/* This thread's number in the enclosing OpenMP team (0 without OpenMP). */
static inline int attn_thread_num(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

#endif /* ATTN_INTERNAL_H */
