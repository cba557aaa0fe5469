/*
 * backward_fused.c — the backward pass's fused path, FlashAttention-2's backward on the
 *                     CPU (ai_fused_backward, called by attn_backward in backward.c
 *                     once the arguments are checked).
 *
 * The fused path recomputes the probabilities tile by tile from Q, K and the forward's
 * LSE, P = exp(s - lse), and never forms the Lq x Lk matrix. The arithmetic on a tile is
 * the micro-kernels of the table (kernels.h): qk gives S = scale Q Kᵀ and dP = dO Vᵀ with
 * its roles swapped; gemm, the plain matrix product, gives dV += Pᵀ dO, dK += dSᵀ Q and
 * dQ += dS K.
 * What it is not: the argument checks, the 16-bit copies (backward.c) or the float64
 * reference (reference_backward.c).
 *
 * Work and determinism. A work item is (batch b, key/value head g, key chunk c): it owns
 * the dK and dV rows of its keys, summed over the group's query heads in a fixed order,
 * so they need no combining. dQ gathers contributions from every key; item (b, g, c)
 * adds its own into a partial dQ of its chunk (C of them, C fixed by the shapes alone:
 * 1 when B * Hkv gives enough items, at most 8; chunk 0's is dq itself where dq's last
 * stride is 1), and a last pass adds the other partials in chunk order. Every float is
 * therefore produced by one thread in an order fixed by the shapes: bit-identical for
 * any thread count and on repeated runs.
 *
 * Extra memory (the workspace): per thread a few tiles and packed blocks (about 300 KiB
 * at D = 64) and a table of Lq / bq query blocks; D_i = dO_i · O_i for every row
 * (B * Hq * Lq floats); the dQ partials ((C - 1) * B * Hq * Lq * Dk floats, C * ... where
 * dq's last stride is not 1). None of it grows with Lq x Lk.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backward.h"
#include "kernels/kernels.h"
#include "forward/mask_summary.h"
#include "core/philox.h"
#include "core/team.h"

/* ---- the fused path: the plan ---------------------------------------------------------
 *
 * Layout. A tile is bq query rows i against bk keys j. Unlike the forward, the tile is
 * kept in its natural layout, S (rows, keys), which the qk kernel gives when its roles are
 * swapped (the keys play its "rows", packed transposed once per key block, and the query
 * rows play its "keys", read in place). The three products are gemm calls on the tiles
 * as they lie: dV += Pᵀ dO and dK += dSᵀ Q read P and dS transposed (trans_a), dQ += dS K
 * reads them as they are; no tile is ever transposed. A zero P or dS (a masked key, a
 * fully masked row) must not multiply a NaN or Inf of dO, Q or K: gemm's skip_zeros
 * is asked for whenever those rows are not known to be finite. */

/* bq query rows and bk keys per tile (ai_choose_tiles, fused_geom.c: the kernel's
 * geometry for this CPU; bk shrinks so that the key block's copies and gradients stay
 * within the CPU's budget, 256 KiB or 512 KiB on Zen 4). C key chunks per (b, g), fixed
 * by the shapes: enough items for the threads when B * Hkv is small, never more than
 * CHUNKS_MAX copies of dQ, nor more copies than fit in PARTIALS_MAX bytes (beyond the
 * first). With a dq whose last stride is 1, chunk 0's dQ is summed in place in dq (with
 * C = 1 all of it: no copy). */
enum { TARGET_ITEMS = 16, CHUNKS_MAX = 8 };
/* The rows of the tiles (S, P, dP, dS: bq rows of bk keys) and of the packed Kᵀ and Vᵀ
 * (Dk, Dv rows of bk keys) lie bk + TILE_SKEW floats apart, not a power of two: the
 * kernels read them down their columns (gemm broadcasts P and dS along a column of keys
 * for dV and dK, qk loads a row of Kᵀ a step for each Dk), and rows 512 bytes apart
 * (bk = 128) would all fall into 8 of the L1's 64 sets. */
enum { TILE_SKEW = 16 };
#define PARTIALS_MAX ((int64_t)256 << 20)

typedef struct bwd_plan {
    int64_t bq, row_pad;    // query rows per tile (ai_choose_tiles), the kernel's row padding
    int64_t bk;             // keys per block, a multiple of row_pad
    int64_t ld;             // the row stride of the tiles, Kᵀ and Vᵀ: bk + TILE_SKEW
    int64_t k_blocks;       // ceil(Lk / bk)
    int64_t chunks;         // C
    int64_t chunk_blocks;   // key blocks per chunk
    int64_t q_blocks;       // ceil(Lq / bq)
    int64_t items;          // B * Hkv * C
    size_t thread_bytes;    // one thread's slice, a multiple of 64
    bool in_place;          // chunk 0's dQ summed in dq itself (dq's last stride 1)
    size_t off_d, off_part; // D (B, Hq, Lq) and the partials (C, B, Hq, Lq, Dk), after the slices
    size_t total;
    size_t off_kd, off_kt, off_vd, off_vt, off_q, off_do, off_s, off_dp, off_cap, off_dk,
        off_dv, off_lse, off_D, off_lo, off_hi, off_qr, off_fin, off_z, off_pd;
    size_t off_sum;         // the mask summary (mask_summary.h), after the partials
    size_t off_gb;          // a broadcast d_bias's logits (B, Hq, Lq, Lk), after the summary
    /* where each logit's bias gradient goes (options.d_bias): the bias's own gradient when
     * it broadcasts nowhere, else the (B, Hq, Lq, Lk) array at off_gb; NULL = not wanted
     * (set by ai_fused_backward) */
    float *gb;
    int64_t gb_s[4];
    /* gb is d_bias itself, written by the items directly (a bias that broadcasts nowhere
     * or over the batch alone): each item stores its tiles' gradients, or adds them when
     * an earlier batch's item of the same (g, c) has stored them (bwd_tile.db_add), and
     * stores 0 over the tiles it skips. Otherwise gb is the (B, Hq, Lq, Lk) array. */
    bool gb_direct;
    /* the summary and the params without mask and bias, for the tiles they leave open;
     * both NULL without mask or bias (set by ai_fused_backward) */
    const attn_mask_summary *sum;
    const attn_params *open;
} bwd_plan;

static size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }

/* the partial that holds chunk c's dQ (chunk 0 has none where it is summed in dq); with
 * c = C, how many partials there are */
static int64_t partial_of(const bwd_plan *plan, int64_t c) { return c - (plan->in_place ? 1 : 0); }

/* n rounded up to the kernel's row padding */
static int64_t pad_rows(const bwd_plan *plan, int64_t n) {
    return (n + plan->row_pad - 1) / plan->row_pad * plan->row_pad;
}

/* options.d_bias written in place by the items (bwd_plan.gb_direct): a bias that
 * broadcasts nowhere, or over the batch alone */
static bool d_bias_in_place(const attn_bwd_params *bp) {
    const int64_t *dn = bp->d_bias_n;
    const attn_params *p = &bp->fwd;
    return bp->d_bias && (bp->d_bias_full || (dn[0] == 1 && dn[1] == p->Hq && dn[2] == p->Lq &&
                                              dn[3] == p->Lk));
}

static bool make_plan(const attn_bwd_params *bp, bwd_plan *plan) {
    const attn_params *p = &bp->fwd;
    const int64_t dk = p->Dk, dv = p->Dv;
    *plan = (bwd_plan){0};
    if (dk > (int64_t)1 << 32 || dv > (int64_t)1 << 32 || p->Lq > (int64_t)1 << 48) return false;
    const attn_tiles tiles = ai_choose_tiles(p->kernels, ATTN_TILES_BACKWARD, p->kv_dt, dk, dv,
                                                &p->tune);
    const int64_t bk = tiles.bk;
    plan->bq = tiles.bq, plan->row_pad = p->kernels->geom.row_pad;
    plan->bk = bk;
    plan->k_blocks = (p->Lk + bk - 1) / bk;
    plan->q_blocks = (p->Lq + plan->bq - 1) / plan->bq;
    const int64_t heads = p->B * p->Hkv;  // fits: the tensors' counts were checked
    int64_t c = heads > 0 ? (TARGET_ITEMS + heads - 1) / heads : 1, dq_bytes;
    if (c > CHUNKS_MAX) c = CHUNKS_MAX;
    if (__builtin_mul_overflow(p->B * p->Hq * p->Lq, dk * (int64_t)sizeof(float), &dq_bytes))
        return false;
    if (dq_bytes > 0 && c > 1 + PARTIALS_MAX / dq_bytes) c = 1 + PARTIALS_MAX / dq_bytes;
    if (c > plan->k_blocks) c = plan->k_blocks > 0 ? plan->k_blocks : 1;
    plan->chunk_blocks = plan->k_blocks > 0 ? (plan->k_blocks + c - 1) / c : 0;
    plan->chunks = plan->chunk_blocks > 0 ? (plan->k_blocks + plan->chunk_blocks - 1) / plan->chunk_blocks : 1;
    if (__builtin_mul_overflow(heads, plan->chunks, &plan->items)) return false;
    plan->in_place = bp->dq_s[3] == 1;

    plan->ld = bk + TILE_SKEW;
    const size_t f = sizeof(float), tile = (size_t)(plan->bq * plan->ld) * f;
    size_t at = 0;
#define CARVE(field, nbytes) (plan->field = at, at += round64(nbytes))
    CARVE(off_kd, (size_t)(bk * dk) * f);             // K block (nk, Dk)
    CARVE(off_kt, (size_t)(dk * plan->ld) * f);       // Kᵀ (Dk, ld), zero columns past nk
    CARVE(off_vd, (size_t)(bk * dv) * f);             // V block (nk, Dv)
    CARVE(off_vt, (size_t)(dv * plan->ld) * f);       // Vᵀ (Dv, ld), zero columns past nk
    CARVE(off_q, (size_t)(plan->bq * dk) * f);        // query rows, when they must be packed
    CARVE(off_do, (size_t)(plan->bq * dv) * f);       // their dO, likewise
    CARVE(off_s, tile);                               // S, then P      (bq, ld)
    CARVE(off_dp, tile);                              // dP, then dS    (bq, ld)
    CARVE(off_cap, p->softcap > 0.0f || p->score_mod ? tile : 0);  // ds/draw (bq, ld)
    CARVE(off_dk, (size_t)(bk * dk) * f);             // the block's dK (nk, Dk)
    CARVE(off_dv, (size_t)(bk * dv) * f);             // the block's dV (nk, Dv)
    CARVE(off_lse, plan->bq * f);
    CARVE(off_D, plan->bq * f);
    CARVE(off_lo, plan->bq * sizeof(int64_t));
    CARVE(off_hi, plan->bq * sizeof(int64_t));
    CARVE(off_qr, (size_t)plan->q_blocks * 2 * sizeof(int64_t));
    CARVE(off_fin, (size_t)(p->group * plan->q_blocks) * 2);  // finite-rows flags, below
    CARVE(off_z, p->dropout ? tile : 0);              // dropout factors Z (bq, ld)
    CARVE(off_pd, p->dropout ? tile : 0);             // P ∘ Z          (bq, ld)
#undef CARVE
    plan->thread_bytes = at;

    /* after the threads' slices: D, then the dQ partials */
    int64_t rows, part;
    if (__builtin_mul_overflow(p->B * p->Hq, p->Lq, &rows)) return false;
    if (__builtin_mul_overflow(rows, dk, &part) ||
        __builtin_mul_overflow(part, partial_of(plan, plan->chunks), &part))
        return false;
    if ((uint64_t)rows > SIZE_MAX / 8 || (uint64_t)part > SIZE_MAX / 8) return false;
    if ((size_t)p->threads > (SIZE_MAX / 4) / plan->thread_bytes) return false;
    size_t total = (size_t)p->threads * plan->thread_bytes;
    plan->off_d = total;
    if (__builtin_add_overflow(total, round64((size_t)rows * sizeof(float)), &total)) return false;
    plan->off_part = total;
    if (__builtin_add_overflow(total, round64((size_t)part * sizeof(float)), &total)) return false;
    plan->off_sum = total;
    const size_t sum_bytes = ai_mask_summary_bytes(p);
    if (sum_bytes == (size_t)-1 || __builtin_add_overflow(total, sum_bytes, &total)) return false;
    total = round64(total);
    plan->off_gb = total;
    const size_t gb_bytes = d_bias_in_place(bp) ? 0 : ai_d_bias_scratch(bp, sizeof(float));
    if (gb_bytes == (size_t)-1 || __builtin_add_overflow(total, gb_bytes, &total)) return false;
    if (__builtin_add_overflow(total, (size_t)64, &total)) return false;  // to align
    plan->total = total;
    return true;
}

size_t ai_fused_backward_workspace(const attn_bwd_params *bp) {
    bwd_plan plan;
    return make_plan(bp, &plan) ? plan.total : (size_t)-1;
}

/* ---- the fused path: one thread's scratch ------------------------------------------- */

typedef struct bwd_scratch {
    float *kd, *kt;             // the key block: (nk, Dk), (Dk, ld)
    float *vd, *vt;             // the value block: (nk, Dv), (Dv, ld)
    float *q, *d_o;             // (bq, Dk), (bq, Dv) query rows and dO, when packed
    float *s, *dp, *cap;        // (bq, ld) S then P; dP then dS (scaled); softcap factors
    float *dk, *dv;             // (bk, Dk), (bk, Dv) the key block's gradients
    float *lse, *D;             // (bq) per row: the LSE (+inf for rows without gradient), D_i
    int64_t *lo, *hi;           // (bq) each row's structural key range
    int64_t *qr;                // (q_blocks, 2) per query block: jmin, jmax of its rows' ranges
    uint8_t *fin;               // (group, q_blocks, 2) per query block of each head of the
                                // item: whether its dO rows, its Q rows hold no NaN or Inf
                                // (0 not known yet, 1 yes, 2 no)
    float *z, *pd;              // (bq, ld) with dropout: the factors Z (1/(1-p) or 0), P ∘ Z
} bwd_scratch;

static bwd_scratch carve(const bwd_plan *plan, char *slice) {
#define AT(field, type) (type *)(slice + plan->field)
    bwd_scratch w = {
        .kd = AT(off_kd, float),   .kt = AT(off_kt, float),   .vd = AT(off_vd, float),
        .vt = AT(off_vt, float),   .q = AT(off_q, float),     .d_o = AT(off_do, float),
        .s = AT(off_s, float),     .dp = AT(off_dp, float),   .cap = AT(off_cap, float),
        .dk = AT(off_dk, float),   .dv = AT(off_dv, float),   .lse = AT(off_lse, float),
        .D = AT(off_D, float),     .lo = AT(off_lo, int64_t), .hi = AT(off_hi, int64_t),
        .qr = AT(off_qr, int64_t),
        .fin = AT(off_fin, uint8_t), .z = AT(off_z, float), .pd = AT(off_pd, float),
    };
#undef AT
    return w;
}

/* D_i = dO_i · O_i for every row, in float64 then rounded: the row sum of P ∘ dP that
 * the softmax's gradient subtracts (Σ_j P_ij dP_ij = dO_i · Σ_j P_ij v_j = dO_i · O_i). */
static void row_dots(const attn_bwd_params *bp, float *D, int64_t r0, int64_t nr) {
    const attn_params *p = &bp->fwd;
    for (int64_t r = r0; r < r0 + nr; r++) {
        const int64_t i = r % p->Lq, bh = r / p->Lq, h = bh % p->Hq, b = bh / p->Hq;
        const float *o_i = (const float *)p->o + b * p->o_s[0] + h * p->o_s[1] + i * p->o_s[2];
        const float *do_i = bp->d_o + b * bp->do_s[0] + h * bp->do_s[1] + i * bp->do_s[2];
        double acc = 0.0;
        for (int64_t d = 0; d < p->Dv; d++)
            acc += (double)o_i[d * p->o_s[3]] * (double)do_i[d * bp->do_s[3]];
        D[r] = (float)acc;
    }
}

/* forward: lse_i = ln(Σ_j exp(s_ij) + exp(sink_h)), o_i = Σ_j exp(s_ij - lse_i) v_j; the
 * sink is a logit whose value is 0, so its dP is 0 and its dS is P_sink (0 - D_i):
 *     d sink_h = -Σ_{b, i} exp(sink_h - lse_bhi) D_bhi,
 * in float64, over b then i in order (one thread per head: the same sum for any thread
 * count). A row whose sink weight is 0 (sink -inf, or an LSE of -inf) adds nothing. */
static float sink_grad(const attn_bwd_params *bp, const float *D, int64_t h) {
    const attn_params *p = &bp->fwd;
    const double sink = attn_sink(p, h);
    double acc = 0.0;
    if (sink == -INFINITY) return 0.0f;
    for (int64_t b = 0; b < p->B; b++) {
        const float *lse_bh = bp->lse + b * bp->lse_s[0] + h * bp->lse_s[1];
        const float *D_bh = D + (b * p->Hq + h) * p->Lq;
        for (int64_t i = 0; i < p->Lq; i++) {
            const double lse = lse_bh[i * bp->lse_s[2]];
            const double w = lse == -INFINITY ? 0.0 : exp(sink - lse);
            if (w != 0.0) acc += w * (double)D_bh[i];
        }
    }
    return (float)-acc;
}

/* The key block j0 .. j0+nk-1 of head (b, g), in the layouts the tiles read (bwd_scratch);
 * returns whether every K value of it is finite. Done once per key block, for all the
 * query rows of the group's heads. */
static bool pack_key_block(const attn_params *p, const bwd_plan *plan, const bwd_scratch *w,
                           int64_t b, int64_t g, int64_t j0, int64_t nk) {
    const int64_t dk = p->Dk, dv = p->Dv, ld = plan->ld, nkpad = pad_rows(plan, nk);
    const float *k = (const float *)p->k + b * p->k_s[0] + g * p->k_s[1] + j0 * p->k_s[2];
    const float *v = (const float *)p->v + b * p->v_s[0] + g * p->v_s[1] + j0 * p->v_s[2];
    bool finite = true;
    for (int64_t c = 0; c < nk; c++) {
        for (int64_t d = 0; d < dk; d++) {
            const float x = k[c * p->k_s[2] + d * p->k_s[3]];
            finite &= isfinite(x) != 0;
            w->kd[c * dk + d] = x;
            w->kt[d * ld + c] = x;
        }
        for (int64_t d = 0; d < dv; d++) {
            const float x = v[c * p->v_s[2] + d * p->v_s[3]];
            w->vd[c * dv + d] = x;
            w->vt[d * ld + c] = x;
        }
    }
    for (int64_t d = 0; d < dk; d++)
        for (int64_t c = nk; c < nkpad; c++) w->kt[d * ld + c] = 0.0f;
    for (int64_t d = 0; d < dv; d++)
        for (int64_t c = nk; c < nkpad; c++) w->vt[d * ld + c] = 0.0f;
    return finite;
}

/* rows i0 .. i0+n-1 of (b, h) of a [.., .., L, width] view: the caller's memory when its
 * last stride is 1, else a packed copy in buf; *ld gets the row stride */
static const float *query_rows(const float *base, const int64_t st[4], int64_t width, int64_t b,
                               int64_t h, int64_t i0, int64_t n, float *buf, int64_t *ld) {
    const float *x = base + b * st[0] + h * st[1] + i0 * st[2];
    if (st[3] == 1) {
        *ld = st[2];
        return x;
    }
    for (int64_t r = 0; r < n; r++)
        for (int64_t d = 0; d < width; d++) buf[r * width + d] = x[r * st[2] + d * st[3]];
    *ld = width;
    return buf;
}

/* x where w != 0 (or NaN), else +0, by the bits: w = 0 (a masked or dropped weight) gives
 * 0 whatever x holds (0 times a NaN of dP). A select of values already computed, which
 * the compiler vectorizes under the default -ftrapping-math; the conditional product
 * `w == 0 ? 0 : w * x` it computes under a branch, one element at a time (a measurable
 * share of the backward in that form). */
static inline float unless_zero(float w, float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    b &= 0u - (uint32_t)(w != 0.0f);
    memcpy(&x, &b, sizeof b);
    return x;
}

/* ---- the fused path: one tile ----------------------------------------------------------
 * Query rows i0 .. i0+n-1 of head h against the packed key block j0 .. j0+nk-1 (batch b):
 * adds the tile's dV and dK to w->dv, w->dk and its dQ to dq_acc (rows i0.., stride ldacc). */
typedef struct bwd_tile {
    int64_t b, h, lk_b, i0, n, j0, nk;
    int64_t off;  // the tile's first key, j0, is key off of the packed block (a mixed tile
                  // narrowed by bwd_trim: a multiple of 16)
    bool finite;  // every K value of the key block is finite
    bool db_add;  // options.d_bias in place: add the tile's gradients (an earlier batch stored)
} bwd_tile;

/* The tile's rows: their LSE (+inf for a fully masked row: P = exp(s - inf) = 0 rather
 * than exp(-inf - -inf) = NaN), D, structural key range; whether every row's range is
 * dense by the mask summary. */
static bool tile_rows(const attn_bwd_params *bp, const bwd_plan *plan, const bwd_scratch *w,
                      const bwd_tile *t, const float *D_bh) {
    const attn_params *p = &bp->fwd;
    const float *lse_bh = bp->lse + t->b * bp->lse_s[0] + t->h * bp->lse_s[1];
    bool dense = true;
    for (int64_t r = 0; r < t->n; r++) {
        const float l = lse_bh[(t->i0 + r) * bp->lse_s[2]];
        w->lse[r] = l == -INFINITY ? INFINITY : l;
        w->D[r] = D_bh[t->i0 + r];
        attn_row_range(p, t->lk_b, t->i0 + r, &w->lo[r], &w->hi[r]);
        /* keys outside the hull of the row's mask and bias are masked by structure */
        if (plan->sum)
            dense &= ai_mask_summary_row(p, plan->sum, t->b, t->h, t->i0 + r, &w->lo[r], &w->hi[r]);
    }
    return dense;
}

/* The forward's P over the tile, in place of the raw logits w->s (rows, keys): the final
 * logits (pt's masks and options; each logit's ds/draw into w->cap when chain), then
 * P_ij = exp(s_ij - lse_i). */
static void tile_probs(const attn_params *p, const attn_params *pt, const bwd_scratch *w,
                       const bwd_tile *t, int64_t ld, int64_t nkpad, bool chain) {
    const int64_t nk = t->nk;
    const bool elementwise = attn_has_elementwise(pt), softcap = p->softcap > 0.0f;
    for (int64_t r = 0; r < t->n; r++) {
        float *s_r = w->s + r * ld, *cap_r = w->cap + r * ld;
        /* the row's structural range within the block; keys outside it (and the padding
         * columns) are -inf, whatever K held there */
        int64_t a = w->lo[r] - t->j0, e = w->hi[r] - t->j0;
        a = a < 0 ? 0 : a > nk ? nk : a;
        e = e < a ? a : e > nk ? nk : e;
        for (int64_t c = 0; c < a; c++) s_r[c] = -INFINITY;
        for (int64_t c = e; c < nkpad; c++) s_r[c] = -INFINITY;
        if (elementwise) {
            const int64_t i = t->i0 + r, d_i = attn_diagonal(p, t->lk_b, i);
            for (int64_t c = a; c < e; c++) {
                if (chain) {
                    /* forward: s = score_mod(raw), then s = softcap * tanh(s / softcap);
                     * ds/draw = score_mod'(raw) (1 - tanh²) */
                    float x = s_r[c], f = 1.0f;
                    if (p->score_mod) {
                        f = p->score_mod_grad(x, t->b, t->h, i, t->j0 + c, p->score_mod_ctx);
                        x = p->score_mod(x, t->b, t->h, i, t->j0 + c, p->score_mod_ctx);
                    }
                    if (softcap) {
                        const float th = tanhf(x / p->softcap);
                        f *= 1.0f - th * th;
                    }
                    cap_r[c] = f;
                }
                s_r[c] = attn_finish_logit(pt, s_r[c], t->b, t->h, i, t->j0 + c, d_i);
            }
        }
        /* forward: P_ij = exp(s_ij - m_i) / l_i = exp(s_ij - lse_i). A recomputed logit may
         * exceed the float32 LSE by an ulp (the forward may have summed it in another
         * order): the argument is clamped at 0 (NaN kept, as NaN > 0 is false) so that
         * the kernel's exp is asked only for x <= 0. */
        const float l = w->lse[r];
#pragma omp simd
        for (int64_t c = 0; c < nkpad; c++) {
            const float x = s_r[c] - l;
            s_r[c] = x > 0.0f ? 0.0f : x;
        }
        p->kernels->exp(nkpad, s_r, s_r);
    }
}

/* dropout (philox.h): Z_ij = 1 / (1 - p) where the forward kept weight (i, j), 0 where
 * it dropped it, regenerated from the same counters; 0 on the padding columns. The
 * forward's P·V used P ∘ Z, kept in w->pd. */
static void tile_dropout(const attn_params *p, const bwd_scratch *w, const bwd_tile *t,
                         int64_t ld, int64_t nkpad) {
    for (int64_t r = 0; r < t->n; r++) {
        float *z_r = w->z + r * ld, *pd_r = w->pd + r * ld;
        const float *P_r = w->s + r * ld;
        const uint64_t row = attn_drop_row(p, t->b, t->h, t->i0 + r);
        attn_dropout_factors_k(p->kernels->dropout, p->drop_seed, p->drop_offset,
                               p->drop_threshold, p->drop_scale, row, attn_drop_keys(p),
                               (uint64_t)t->j0, (uint64_t)t->nk, z_r, 1);
        for (int64_t c = t->nk; c < nkpad; c++) z_r[c] = 0.0f;
#pragma omp simd
        for (int64_t c = 0; c < nkpad; c++) pd_r[c] = unless_zero(z_r[c], P_r[c] * z_r[c]);
    }
}

/* softmax: dS_ij = P_ij (dP_ij - D_i), in place of dP in w->dp, with the undropped P (the
 * softmax's output; D_i = dO_i · O_i = Σ_j P_ij dP_ij holds with dropout too, since
 * O_i = Σ_j P_ij Z_ij v_j); then through the softcap and score function (x cap_ij) and the
 * scale (forward: s = scale q_i · k_j). P = 0 (masked) gives dS = 0 exactly, whatever dP
 * holds: a masked key's V may be NaN (unless_zero). With options.d_bias, the logit's
 * gradient g = P (dP - D) is stored first, then dS = g cap scale from it (the same bits). */
static void tile_ds(const attn_params *p, const bwd_plan *plan, const bwd_scratch *w,
                    const bwd_tile *t, int64_t ld, int64_t nkpad, bool chain) {
    const bool dropout = p->dropout;
    const int64_t nk = t->nk;
    for (int64_t r = 0; r < t->n; r++) {
        const float *P_r = w->s + r * ld, *cap_r = w->cap + r * ld;
        float *dS_r = w->dp + r * ld;
        const float D_r = w->D[r], scale = p->scale;
        const float *z_r = dropout ? w->z + r * ld : NULL;
        if (plan->gb) {
            if (dropout) {
#pragma omp simd
                for (int64_t c = 0; c < nkpad; c++)
                    dS_r[c] = unless_zero(P_r[c], P_r[c] * (unless_zero(z_r[c], dS_r[c] * z_r[c]) - D_r));
            } else {
#pragma omp simd
                for (int64_t c = 0; c < nkpad; c++) dS_r[c] = unless_zero(P_r[c], P_r[c] * (dS_r[c] - D_r));
            }
            float *gb_r = plan->gb + t->b * plan->gb_s[0] + t->h * plan->gb_s[1] +
                          (t->i0 + r) * plan->gb_s[2] + t->j0 * plan->gb_s[3];
            if (t->db_add) {
                for (int64_t c = 0; c < nk; c++) gb_r[c * plan->gb_s[3]] += dS_r[c];
            } else if (plan->gb_s[3] == 1) {
                memcpy(gb_r, dS_r, (size_t)nk * sizeof(float));
            } else {
                for (int64_t c = 0; c < nk; c++) gb_r[c * plan->gb_s[3]] = dS_r[c];
            }
            if (chain) {
#pragma omp simd
                for (int64_t c = 0; c < nkpad; c++) dS_r[c] = unless_zero(P_r[c], dS_r[c] * cap_r[c] * scale);
            } else {
#pragma omp simd
                for (int64_t c = 0; c < nkpad; c++) dS_r[c] = unless_zero(P_r[c], dS_r[c] * scale);
            }
        } else if (chain) {
#pragma omp simd
            for (int64_t c = 0; c < nkpad; c++) {
                const float dp = dropout ? unless_zero(z_r[c], dS_r[c] * z_r[c]) : dS_r[c];
                dS_r[c] = unless_zero(P_r[c], P_r[c] * (dp - D_r) * cap_r[c] * scale);
            }
        } else if (dropout) {
#pragma omp simd
            for (int64_t c = 0; c < nkpad; c++) {
                const float dp = unless_zero(z_r[c], dS_r[c] * z_r[c]);
                dS_r[c] = unless_zero(P_r[c], P_r[c] * (dp - D_r) * scale);
            }
        } else {
#pragma omp simd
            for (int64_t c = 0; c < nkpad; c++)
                dS_r[c] = unless_zero(P_r[c], P_r[c] * (dS_r[c] - D_r) * scale);
        }
    }
}

static void tile_backward(const attn_bwd_params *bp, const bwd_plan *plan, const bwd_scratch *w,
                          const bwd_tile *t, const float *D_bh, float *dq_acc, int64_t ldacc,
                          uint8_t fin[2], bool open_tile) {
    const attn_params *p = &bp->fwd;
    const attn_kernels *kern = p->kernels;
    const int64_t dk = p->Dk, dv = p->Dv, n = t->n, nk = t->nk, ld = plan->ld;
    const int64_t nkpad = pad_rows(plan, nk);
    /* the tile's keys in the packed block, and their dK, dV accumulators */
    const float *kd = w->kd + t->off * dk, *kt = w->kt + t->off;
    const float *vd = w->vd + t->off * dv, *vt = w->vt + t->off;
    float *dk_acc = w->dk + t->off * dk, *dv_acc = w->dv + t->off * dv;

    int64_t ldq, ldo;
    const float *q = query_rows((const float *)p->q, p->q_s, dk, t->b, t->h, t->i0, n, w->q, &ldq);
    const float *d_o = query_rows(bp->d_o, bp->do_s, dv, t->b, t->h, t->i0, n, w->d_o, &ldo);
    const bool dense = tile_rows(bp, plan, w, t, D_bh);
    /* the logits' params: without mask and bias where they leave the tile open (its cells,
     * or every row's whole range) */
    const attn_params *pt = plan->sum && (open_tile || dense) ? plan->open : p;
    /* ds/draw per logit, cap: the score function's derivative times softcap's */
    const bool chain = p->softcap > 0.0f || p->score_mod;

    /* forward (tile_logits): s = scale q_i · k_j, S = scale Q Kᵀ here in (rows, keys) */
    kern->qk(nk, nkpad, n, dk, kd, kt, ld, q, ldq, p->scale, w->s, ld);
    tile_probs(p, pt, w, t, ld, nkpad, chain);
    if (p->dropout) tile_dropout(p, w, t, ld, nkpad);

    /* forward: o_i = Σ_j P_ij Z_ij v_j (Z = 1 without dropout), so
     * dV_j += Σ_i P_ij Z_ij dO_i. A zero weight must not multiply a NaN or Inf of dO (a
     * fully masked row's dO is not read): gemm skips zeros, at a cost (a test per row and
     * key), only when dO's rows are not all finite; otherwise 0 · dO adds an exact 0.
     * Likewise Q below for dK. */
    if (!fin[0]) fin[0] = attn_rows_finite(d_o, ldo, n, dv) ? 1 : 2;
    if (!fin[1]) fin[1] = attn_rows_finite(q, ldq, n, dk) ? 1 : 2;
    kern->gemm(true, nk, dv, n, p->dropout ? w->pd : w->s, ld, d_o, ldo, dv_acc, dv, fin[0] == 2);

    /* dP_ij = Z_ij (dO_i · v_j): dO Vᵀ, with qk's roles swapped as for S, then times Z
     * in the same sweep that forms dS (a dropped key's dP is 0 whatever its V holds) */
    kern->qk(nk, nkpad, n, dv, vd, vt, ld, d_o, ldo, 1.0f, w->dp, ld);
    tile_ds(p, plan, w, t, ld, nkpad, chain);

    /* forward: s = scale q_i · k_j, so dK_j += Σ_i dS_ij q_i (a zero dS never multiplies
     * a non-finite q) */
    kern->gemm(true, nk, dk, n, w->dp, ld, q, ldq, dk_acc, dk, fin[1] == 2);

    /* ... and dQ_i += Σ_j dS_ij k_j, summed over the tile before it is added; a zero dS
     * never multiplies a NaN or Inf of K */
    kern->gemm(false, n, dk, nk, w->dp, ld, kd, dk, dq_acc, ldacc, !t->finite);
}

/* ---- the fused path: the items ------------------------------------------------------- */

/* Item u = (b, g, c): the keys of chunk c of head (b, g), against every query row of the
 * group's heads that reads them. */
/* options.d_bias in place, an item that stores (not adds): 0 over the rows [i0, i0 + n)
 * and keys [j0, j0 + nk) of head h, a tile it skips */
static void d_bias_clear(const bwd_plan *plan, int64_t b, int64_t h, int64_t i0, int64_t n,
                         int64_t j0, int64_t nk) {
    for (int64_t r = 0; r < n; r++) {
        float *row = plan->gb + b * plan->gb_s[0] + h * plan->gb_s[1] + (i0 + r) * plan->gb_s[2] +
                     j0 * plan->gb_s[3];
        if (plan->gb_s[3] == 1) memset(row, 0, (size_t)nk * sizeof(float));
        else
            for (int64_t c = 0; c < nk; c++) row[c * plan->gb_s[3]] = 0.0f;
    }
}

/* *t narrowed to its keys [a, e) (off its offset into the packed block; a and e on
 * granules of ATTN_SUM_KEYS, or e the tile's end); the d_bias of the keys left out, when
 * written in place, is cleared. */
static void tile_keys(const bwd_plan *plan, bwd_tile *t, int64_t a, int64_t e, bool clear) {
    if (clear && a > t->j0) d_bias_clear(plan, t->b, t->h, t->i0, t->n, t->j0, a - t->j0);
    if (clear && e < t->j0 + t->nk) d_bias_clear(plan, t->b, t->h, t->i0, t->n, e, t->j0 + t->nk - e);
    t->off += a - t->j0;
    t->j0 = a;
    t->nk = e - a;
}

/* The granules of keys [*a, *e) of tile t that its rows reach by structure, [jmin, jmax)
 * the union of their ranges (item_backward's w->qr); whether that leaves some of the
 * tile's keys out (a causal band's first tile on the diagonal reaches half its keys when
 * bk = 2 bq). The keys left out have P = 0 in every row and add exact zeros to dQ, dK and
 * dV; a tile left with 16 keys or fewer runs qk's dot-product form, another summation
 * order (docs/KERNELS.md). */
static bool reached_keys(const bwd_tile *t, int64_t jmin, int64_t jmax, int64_t *a, int64_t *e) {
    const int64_t g = ATTN_SUM_KEYS, lo = jmin / g * g, hi = (jmax + g - 1) / g * g;
    *a = lo > t->j0 ? lo : t->j0;
    *e = hi < t->j0 + t->nk ? hi : t->j0 + t->nk;
    return *a > t->j0 || *e < t->j0 + t->nk;
}

/* A mixed tile (rows i0 .. i1-1 of head h against keys j0 .. j0+nk-1 of the packed
 * block) narrowed to the keys from its first to its last granule of ATTN_SUM_KEYS that
 * some row keeps (the forward's fused_tile_trim): the granules masked for every row at
 * either end add nothing (P = 0 there). */
static void bwd_trim(const attn_params *p, const bwd_plan *plan, bwd_tile *t, int64_t i1,
                     bool clear) {
    int64_t a = t->j0, e = t->j0 + t->nk;
    for (;;) {
        const int64_t g = (a / ATTN_SUM_KEYS + 1) * ATTN_SUM_KEYS, to = g < e ? g : e;
        if (to >= e || ai_mask_summary_rows(p, plan->sum, t->b, t->h, t->i0, i1, a, to - a) !=
                           ATTN_TILE_MASKED)
            break;
        a = to;
    }
    for (;;) {
        const int64_t g = (e - 1) / ATTN_SUM_KEYS * ATTN_SUM_KEYS, from = g > a ? g : a;
        if (from <= a || ai_mask_summary_rows(p, plan->sum, t->b, t->h, t->i0, i1, from, e - from) !=
                             ATTN_TILE_MASKED)
            break;
        e = from;
    }
    tile_keys(plan, t, a, e, clear);
}

/* Whether rows i0 .. i0+n-1 of head h have an LSE that is a number or -inf (a fully
 * masked row): a NaN or +inf one makes every P of its row NaN, the masked keys' too (as
 * the reference computes them), so its tiles are not narrowed. */
static bool lse_ordinary(const attn_bwd_params *bp, int64_t b, int64_t h, int64_t i0, int64_t n) {
    const float *l = bp->lse + b * bp->lse_s[0] + h * bp->lse_s[1];
    for (int64_t r = 0; r < n; r++) {
        const float x = l[(i0 + r) * bp->lse_s[2]];
        if (isnan(x) || x == INFINITY) return false;
    }
    return true;
}

static void item_backward(const attn_bwd_params *bp, const bwd_plan *plan, const bwd_scratch *w,
                          const float *D, float *part, int64_t u, bool db_add) {
    const attn_params *p = &bp->fwd;
    const int64_t c = u % plan->chunks, bg = u / plan->chunks;
    const int64_t b = bg / p->Hkv, g = bg % p->Hkv, G = p->group;
    const int64_t Lq = p->Lq, Dk = p->Dk, Dv = p->Dv, bk = plan->bk;
    const int64_t lk_b = attn_key_len(p, b);

    /* this chunk's dQ of the group's heads, from 0: in dq itself (chunk 0), or the chunk's
     * partial (G, Lq, Dk) */
    float *part_c = NULL;
    const bool in_dq = plan->in_place && c == 0;
    if (in_dq) {
        for (int64_t h = g * G; h < (g + 1) * G; h++)
            for (int64_t i = 0; i < Lq; i++)
                memset(bp->dq + b * bp->dq_s[0] + h * bp->dq_s[1] + i * bp->dq_s[2], 0,
                       (size_t)Dk * sizeof(float));
    } else {
        part_c = part + ((partial_of(plan, c) * p->B + b) * p->Hq + g * G) * Lq * Dk;
        memset(part_c, 0, (size_t)(G * Lq * Dk) * sizeof(float));
    }

    /* each query block's union of key ranges, [jmin, jmax) (empty: jmin = jmax = 0) */
    for (int64_t qb = 0; qb < plan->q_blocks; qb++) {
        int64_t jmin = INT64_MAX, jmax = 0;
        for (int64_t i = qb * plan->bq; i < (qb + 1) * plan->bq && i < Lq; i++)
            for (int64_t hh = 0; hh < (plan->sum ? G : 1); hh++) {  // the mask's hulls per head
                int64_t lo, hi;
                attn_row_range(p, lk_b, i, &lo, &hi);
                if (plan->sum) ai_mask_summary_row(p, plan->sum, b, g * G + hh, i, &lo, &hi);
                if (lo >= hi) continue;
                if (lo < jmin) jmin = lo;
                if (hi > jmax) jmax = hi;
            }
        w->qr[2 * qb] = jmin == INT64_MAX ? 0 : jmin;
        w->qr[2 * qb + 1] = jmax;
    }
    memset(w->fin, 0, (size_t)(G * plan->q_blocks) * 2);  // found out once, at first use

    const int64_t kb_end = (c + 1) * plan->chunk_blocks < plan->k_blocks
                               ? (c + 1) * plan->chunk_blocks
                               : plan->k_blocks;
    for (int64_t kb = c * plan->chunk_blocks; kb < kb_end; kb++) {
        bwd_tile t = {.b = b, .lk_b = lk_b, .j0 = kb * bk, .db_add = db_add};
        t.nk = p->Lk - t.j0 < bk ? p->Lk - t.j0 : bk;
        const bool clear = plan->gb_direct && !db_add;  // skipped tiles: their d_bias is 0
        memset(w->dk, 0, (size_t)(t.nk * Dk) * sizeof(float));
        memset(w->dv, 0, (size_t)(t.nk * Dv) * sizeof(float));
        bool packed = false;
        for (int64_t hh = 0; hh < G; hh++) {
            t.h = g * G + hh;
            for (int64_t qb = 0; qb < plan->q_blocks; qb++) {
                const int64_t qi0 = qb * plan->bq, qn = Lq - qi0 < plan->bq ? Lq - qi0 : plan->bq;
                if (w->qr[2 * qb + 1] <= t.j0 || w->qr[2 * qb] >= t.j0 + t.nk) {
                    if (clear) d_bias_clear(plan, b, t.h, qi0, qn, t.j0, t.nk);
                    continue;
                }
                /* a tile the mask or bias masks whole adds nothing; an open one needs neither */
                const attn_tile_class cls =
                    plan->sum ? ai_mask_summary_rows(p, plan->sum, b, t.h, qb * plan->bq,
                                                     (qb + 1) * plan->bq < Lq ? (qb + 1) * plan->bq : Lq,
                                                     t.j0, t.nk)
                              : ATTN_TILE_MIXED;
                if (cls == ATTN_TILE_MASKED) {
                    if (clear) d_bias_clear(plan, b, t.h, qi0, qn, t.j0, t.nk);
                    continue;
                }
                if (!packed) {  // only a block some row reads is packed
                    t.finite = pack_key_block(p, plan, w, b, g, t.j0, t.nk);
                    packed = true;
                }
                t.i0 = qb * plan->bq;
                t.n = Lq - t.i0 < plan->bq ? Lq - t.i0 : plan->bq;
                uint8_t *fin = w->fin + 2 * (hh * plan->q_blocks + qb);
                /* the tile without the key granules its rows all leave out: by structure,
                 * and a mixed tile's by the mask at either end */
                bwd_tile tt = t;
                attn_tile_class tc = cls;
                int64_t ka, ke;
                const bool narrow = reached_keys(&t, w->qr[2 * qb], w->qr[2 * qb + 1], &ka, &ke);
                const bool trim = cls == ATTN_TILE_MIXED && plan->sum;
                if ((narrow || trim) && lse_ordinary(bp, b, t.h, t.i0, t.n)) {
                    if (narrow) tile_keys(plan, &tt, ka, ke, clear);
                    if (trim) {
                        bwd_trim(p, plan, &tt, t.i0 + t.n, clear);
                        tc = ai_mask_summary_rows(p, plan->sum, b, t.h, t.i0, t.i0 + t.n, tt.j0, tt.nk);
                    }
                }
                if (in_dq)
                    tile_backward(bp, plan, w, &tt, D + (b * p->Hq + t.h) * Lq,
                                  bp->dq + b * bp->dq_s[0] + t.h * bp->dq_s[1] + t.i0 * bp->dq_s[2],
                                  bp->dq_s[2], fin, tc == ATTN_TILE_OPEN);
                else
                    tile_backward(bp, plan, w, &tt, D + (b * p->Hq + t.h) * Lq,
                                  part_c + (hh * Lq + t.i0) * Dk, Dk, fin, tc == ATTN_TILE_OPEN);
            }
        }
        float *dk_b = bp->dk + b * bp->dk_s[0] + g * bp->dk_s[1] + t.j0 * bp->dk_s[2];
        float *dv_b = bp->dv + b * bp->dv_s[0] + g * bp->dv_s[1] + t.j0 * bp->dv_s[2];
        for (int64_t r = 0; r < t.nk; r++) {
            for (int64_t d = 0; d < Dk; d++) dk_b[r * bp->dk_s[2] + d * bp->dk_s[3]] = w->dk[r * Dk + d];
            for (int64_t d = 0; d < Dv; d++) dv_b[r * bp->dv_s[2] + d * bp->dv_s[3]] = w->dv[r * Dv + d];
        }
    }
}

/* Row r of dQ: the chunks' partials summed in chunk order (chunk 0's in dq itself where
 * in place: the others added to it) */
static void dq_row(const attn_bwd_params *bp, const bwd_plan *plan, const float *part,
                   int64_t rows, int64_t r) {
    const attn_params *p = &bp->fwd;
    const int64_t Dk = p->Dk;
    const int64_t i = r % p->Lq, bh = r / p->Lq, h = bh % p->Hq, b = bh / p->Hq;
    float *dq_i = bp->dq + b * bp->dq_s[0] + h * bp->dq_s[1] + i * bp->dq_s[2];
    for (int64_t d = 0; d < Dk; d++) {
        float acc = plan->in_place ? dq_i[d] : part[r * Dk + d];
        for (int64_t c = 1; c < plan->chunks; c++)
            acc += part[(partial_of(plan, c) * rows + r) * Dk + d];
        dq_i[d * bp->dq_s[3]] = acc;
    }
}

/* Unit u of the backward's items: item u; or, per_b > 0 (a bias shared by the batch, its
 * gradient in place), item (g, c) = u for every batch in turn, the first storing, the
 * rest adding (the same order for any thread count) */
static void bwd_unit(const attn_bwd_params *bp, const bwd_plan *plan, const bwd_scratch *w,
                     const float *D, float *part, int64_t u, int64_t per_b) {
    if (per_b == 0) {
        item_backward(bp, plan, w, D, part, u, false);
        return;
    }
    for (int64_t b = 0; b < bp->fwd.B; b++) item_backward(bp, plan, w, D, part, b * per_b + u, b > 0);
}

/* The backward's work: for one thread of the team (team: its loops shared by the team's
 * worksharing), or all of it on the calling thread with no OpenMP construct (as the
 * forward's fused_run, src/forward/fused.c: no barrier's system call, and nothing that
 * could bind to a caller's own parallel region). */
static void bwd_run(const attn_bwd_params *bp, const bwd_plan *plan, char *base, float *D,
                    float *part, bool batch_shared, bool team) {
    const attn_params *p = &bp->fwd;
    const int64_t rows = p->B * p->Hq * p->Lq;
    const int64_t row_chunks = (rows + 255) / 256;
    const bwd_scratch w = carve(plan, base + (size_t)(team ? attn_thread_num() : 0) *
                                                 plan->thread_bytes);
    const int64_t sink_heads = bp->d_sinks ? p->Hq : 0;
    const int64_t per_b = batch_shared && p->B > 1 ? plan->items / p->B : 0;
    const int64_t units = per_b > 0 ? per_b : plan->items;
    const int64_t dq_rows = partial_of(plan, plan->chunks) > 0 ? rows : 0;
    if (team) {
#pragma omp for schedule(static)
        for (int64_t rc = 0; rc < row_chunks; rc++)
            row_dots(bp, D, rc * 256, rows - rc * 256 < 256 ? rows - rc * 256 : 256);
        /* implicit barrier: every D_i is ready */
        if (sink_heads > 0) {
#pragma omp for schedule(static)
            for (int64_t h = 0; h < sink_heads; h++) bp->d_sinks[h * bp->d_sinks_s] = sink_grad(bp, D, h);
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t u = 0; u < units; u++) bwd_unit(bp, plan, &w, D, part, u, per_b);
        if (dq_rows > 0) {
#pragma omp for schedule(static)
            for (int64_t r = 0; r < dq_rows; r++) dq_row(bp, plan, part, rows, r);
        }
        return;
    }
    for (int64_t rc = 0; rc < row_chunks; rc++)
        row_dots(bp, D, rc * 256, rows - rc * 256 < 256 ? rows - rc * 256 : 256);
    for (int64_t h = 0; h < sink_heads; h++) bp->d_sinks[h * bp->d_sinks_s] = sink_grad(bp, D, h);
    for (int64_t u = 0; u < units; u++) bwd_unit(bp, plan, &w, D, part, u, per_b);
    for (int64_t r = 0; r < dq_rows; r++) dq_row(bp, plan, part, rows, r);
}

attn_status ai_fused_backward(const attn_bwd_params *bp, void *ws) {
    bwd_plan plan;
    make_plan(bp, &plan);  // cannot fail: the workspace query succeeded with the same bp
    char *base = (char *)(((uintptr_t)ws + 63) & ~(uintptr_t)63);
    const attn_params *p = &bp->fwd;
    float *D = (float *)(base + plan.off_d);
    float *part = (float *)(base + plan.off_part);
    attn_mask_summary sum;
    attn_params open;
    /* key padding reaches here as key lengths already (ai_key_padding, mask_summary.h) */
    if (p->mask || p->bias || p->block) {
        ai_mask_summary_init(p, base + plan.off_sum, &sum);
        open = *p;
        open.mask = NULL;
        open.bias = NULL;
        open.block = NULL;
        plan.sum = &sum;
        plan.open = &open;
    }
    const int64_t rows = p->B * p->Hq * p->Lq;
    /* options.d_bias: every logit's gradient into d_bias itself (in place) or the
     * (B, Hq, Lq, Lk) array, from 0 (the tiles no row reads are never visited) */
    const bool batch_shared = d_bias_in_place(bp) && !bp->d_bias_full;
    if (d_bias_in_place(bp)) {
        plan.gb = bp->d_bias;
        plan.gb_direct = true;
        memcpy(plan.gb_s, bp->d_bias_s, sizeof plan.gb_s);
        if (batch_shared) plan.gb_s[0] = 0;  // every batch's logits on the one bias
    } else if (bp->d_bias) {
        plan.gb = (float *)(base + plan.off_gb);
        memset(plan.gb, 0, (size_t)(rows * p->Lk) * sizeof(float));
        const int64_t gs[4] = {p->Hq * p->Lq * p->Lk, p->Lq * p->Lk, p->Lk, 1};
        memcpy(plan.gb_s, gs, sizeof gs);
    }

    if (attn_run_parallel(p, ATTN_TEAM_BACKWARD_PASSES)) {  // team.h
#pragma omp parallel num_threads(p->threads)
        bwd_run(bp, &plan, base, D, part, batch_shared, true);
    } else {
        bwd_run(bp, &plan, base, D, part, batch_shared, false);
    }
    if (bp->d_bias && !plan.gb_direct) ai_d_bias_reduce(bp, plan.gb, false);
    return ATTN_OK;
}
