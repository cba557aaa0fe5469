/*
 * kernels.h — the micro-kernels of the fused forward pass, their contracts, and the
 *             run-time choice between them.
 *
 * A micro-kernel computes one tile and knows nothing of batches, heads, masks, threads
 * or workspace: fused.c (the framework) packs the query block, applies masks and owns
 * the loops. The logits of a tile are kept TRANSPOSED, S^T (nk keys, n rows): each key
 * is a vector over the query rows, so the row-wise max and sum of the softmax are
 * vertical (no horizontal reductions), the query block is packed transposed once per
 * block, and K and V are read in their natural row-major layout, straight from the
 * caller's memory when their last stride is 1.
 *
 * Shared rules for every kernel:
 * - n is the number of query rows, padded: npad = n rounded up to the kernel's
 *   geom.row_pad (its line of kernels/list.h), npad <= ATTN_FWD_BQ_LIMIT (the forward
 *   takes geom.bq rows a block, or another multiple of row_pad: fused_geom.c). Kernels
 *   may compute on all npad rows (the framework zero-fills the padding and ignores it);
 *   they never read beyond npad rows, nk keys, dk or dv columns.
 * - Leading dimensions are in floats. Row-major throughout.
 * - Results need not be bit-identical between kernels, but each kernel is deterministic:
 *   the same inputs give the same bits on any thread.
 */
#ifndef ATTN_KERNELS_H
#define ATTN_KERNELS_H

#include <stdint.h>

#include "core/attn_internal.h"
#include "list.h"

/* The kernels' templates (helpers whose tile sizes are constant arguments) are forced
 * inline, so that each expansion keeps its tile in registers. In a sanitizer build (the
 * Makefile defines ATTN_SANITIZED when SAN is set; clang's feature tests catch a plain
 * clang -fsanitize=address command) they are kept out of line instead, under gcc as under
 * clang: every expansion inlined and unrolled, with a check on each access, is one huge
 * function, and two kernel files then took longer to compile than the rest of the
 * sanitizer build together (docs/HARDENING.md). The arithmetic and the memory accesses are
 * the same either way, each access checked as before; only where the code runs from
 * changes. */
#if defined(__clang__) && defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
#define ATTN_KERNEL_OUT_OF_LINE
#endif
#endif
#if defined(ATTN_SANITIZED) && !defined(ATTN_KERNEL_OUT_OF_LINE)  /* UBSan alone has no feature test */
#define ATTN_KERNEL_OUT_OF_LINE
#endif
#ifdef ATTN_KERNEL_OUT_OF_LINE
#define ATTN_KERNEL_INLINE static __attribute__((noinline))
#else
#define ATTN_KERNEL_INLINE static inline __attribute__((always_inline))
#endif

/* Blocks of at most this many query rows (decoding) take a kernel's decode entry, 4 rows a
 * call, on their clean tiles (whether or not the weights are asked for: O must not
 * change when they are); the weights' sweep recomputes those tiles' logits with the
 * kernel's decode_qk, the step's own Q·Kᵀ, to meet the first sweep's maxima. */
#define ATTN_DECODE_MAX_ROWS 16

/* What a decoding step (the decode entry) prefetches into the outer caches, each stream
 * during the other's phase: V rows while Q·Kᵀ reads K (this tile's, or on a later pass
 * over the tile the next tile's), the next tile's K rows while P·V reads V. A phase alone
 * leaves the other stream idle, and the hardware prefetcher does not run ahead of a
 * stream nobody reads (docs/KERNELS.md). */
typedef struct attn_decode_pf {
    const char *v;                  // the V rows to ask for, or NULL for none
    int64_t ldv, lines_v, nv;       // row stride in bytes, 64-byte lines a row, rows
    const char *k;                  // the next tile's K rows, or NULL for none
    int64_t ldk, lines_k, nk;
    /* a tile whose rows are not at one stride (decode_rows): row r of V at v_rows[r] and
     * key c of the next tile at k_rows[c] instead of v + r * ldv, k + c * ldk; NULL
     * otherwise (v and k non-NULL still say whether there is anything to ask for) */
    const char *const *v_rows, *const *k_rows;
} attn_decode_pf;

/* from the decode entry's arguments (strides in elements of es bytes) */
static inline attn_decode_pf attn_decode_pf_make(const void *ask_v, int64_t ldv, int64_t ask_nv,
                                                 int64_t dv, const void *next_k, int64_t ldk,
                                                 int64_t next_nk, int64_t dk, int64_t es) {
    return (attn_decode_pf){
        .v = ask_nv > 0 ? (const char *)ask_v : NULL, .ldv = ldv * es,
        .lines_v = (dv * es + 63) / 64, .nv = ask_nv,
        .k = next_nk > 0 ? (const char *)next_k : NULL, .ldk = ldk * es,
        .lines_k = (dk * es + 63) / 64, .nk = next_nk,
    };
}

/* A decoding step's query rows (n values) for an fp8 K whose factor f (the head's scale,
 * e4m3's 2^8 in it) the step moves off K onto the query (attn_fp8_factor_folds, core/
 * half.h: a power of two from 1 to 2^64): q itself for f = 1, else q · f into out, every
 * product exact while each element is within 2^60; NULL where one is not (or is a NaN):
 * the step then keeps the multiply on K. The AVX-512 and AVX2 steps share it. */
static inline const float *attn_fp8_fold_query(int64_t n, const float *restrict q, float f,
                                               float *restrict out) {
    if (f == 1.0f) return q;
    int bad = 0;  // no branch in the loop, so that it vectorizes
    for (int64_t i = 0; i < n; i++) {
        bad |= !(q[i] >= -0x1p60f) | !(q[i] <= 0x1p60f);  // a NaN too
        out[i] = q[i] * f;
    }
    return bad ? NULL : out;
}

/* M(DT) for the K/V dtype dt (float32, bfloat16 or float16), DT a compile-time constant:
 * how the kernels instantiate their dtype templates. Any other dtype runs nothing: the
 * API admits only these three to the kernels (ai_check_tensor refuses the rest with
 * ATTN_ERR_DTYPE), and a new one needs its own branch here, never a fall-through. */
#define ATTN_KV_DTYPE_SWITCH(dt, M)                                                         \
    do {                                                                                    \
        if ((dt) == ATTN_F32) {                                                             \
            M(ATTN_F32)                                                                     \
        } else if ((dt) == ATTN_BF16) {                                                     \
            M(ATTN_BF16)                                                                    \
        } else if ((dt) == ATTN_F16) {                                                      \
            M(ATTN_F16)                                                                     \
        }                                                                                   \
    } while (0)

/* Q·Kᵀ of a decoding block (n <= ATTN_DECODE_MAX_ROWS rows, row-major q) by a kernel's
 * dot-product form, 4 rows at a time through rows[r] for a group of r rows (rows[0]
 * unused), then 0 for the padding rows up to npad (finite, unused) */
typedef void attn_qk_rows_fn(int64_t nk, int64_t dk, const float *q, const float *k,
                             int64_t ldk, float scale, float *s, int64_t lds);
static inline void attn_qk_dot_block(attn_qk_rows_fn *const rows[5], int64_t n, int64_t npad,
                                     int64_t nk, int64_t dk, const float *q, const float *k,
                                     int64_t ldk, float scale, float *s, int64_t lds) {
    for (int64_t r0 = 0; r0 < n; r0 += 4)
        rows[n - r0 < 4 ? n - r0 : 4](nk, dk, q + r0 * dk, k, ldk, scale, s + r0, lds);
    for (int64_t c = 0; c < nk; c++)
        for (int64_t r = n; r < npad; r++) s[c * lds + r] = 0.0f;
}

/* decode_qk's store: a decoding step's compact logits cs[4c + r] (its scratch layout)
 * into the tile's S^T layout s[c * lds + r], rows r < n, keys c < nk. */
static inline void attn_decode_qk_store(int64_t n, int64_t nk, const float *cs, float *s,
                                        int64_t lds) {
    for (int64_t c = 0; c < nk; c++)
        for (int64_t r = 0; r < n; r++) s[c * lds + r] = cs[4 * c + r];
}

/* A kernel's tile geometry (its line of kernels/list.h): the framework pads a block's
 * query rows to row_pad, makes blocks of at most bq rows, and key blocks of bk_min to
 * bk_max keys. */
typedef struct attn_kernel_geom {
    int32_t row_pad, bq, bk_min, bk_max;
} attn_kernel_geom;

/* A CPU a kernel's geometry is tuned for: ai_cpu_model_now() (dispatch.c) says which
 * one this is, probed once (ATTN_CPU_OTHER: none of the tuned ones). */
typedef enum attn_cpu_model {
    ATTN_CPU_OTHER = 0,
    ATTN_CPU_ZEN3,  /* AuthenticAMD, family 19h, models 00-0Fh, 20-2Fh, 40-5Fh (not Zen 4) */
    ATTN_CPU_ZEN4,  /* AuthenticAMD, family 19h, models 10-1Fh, 60-7Fh, A0-AFh */
} attn_cpu_model;
ATTN_PRIVATE attn_cpu_model ai_cpu_model_now(void);
/* This CPU's CPUID vendor string, family and model ("unknown", 0, 0 off x86-64):
 * dispatch.c, for the model above and the wisdom's cpu line (wisdom.h). */
ATTN_PRIVATE void ai_cpu_ident(char vendor[13], unsigned *family, unsigned *model);

/* One line of a kernel's per-CPU geometry (its folder's table, the kernel table's
 * cpu_geom): on CPU cpu, the forward's (and attn_weights_grid's) query rows per block and
 * the backward's; 0 keeps the list's bq. A table ends with a line of ATTN_CPU_OTHER. */
typedef struct attn_cpu_geom {
    attn_cpu_model cpu;
    int32_t fwd_bq, bwd_bq;
} attn_cpu_geom;
/* the tables, each in its kernel's folder (geom.c) */
ATTN_PRIVATE extern const attn_cpu_geom attn_cpu_geom_avx2[];

struct attn_kernels {
    const char *name;
    attn_kernel_geom geom;

    /* S^T = scale * K Q^T for one tile.
     *   q  (n, dk),    row stride dk     the query rows, row-major
     *   qt (dk, npad), row stride ldq    the same rows packed transposed, padding rows 0
     *   k  (nk, dk),   row stride ldk    the key block, natural layout
     *   s  (nk, npad), row stride lds    written, every element (padding rows finite)
     * 1 <= n <= npad, 1 <= nk, 0 <= dk (dk = 0 gives s = 0). A kernel may read q or qt,
     * whichever suits the number of rows, except as qk_q_rows says. */
    void (*qk)(int64_t n, int64_t npad, int64_t nk, int64_t dk, const float *q,
               const float *qt, int64_t ldq, const float *k, int64_t ldk, float scale,
               float *s, int64_t lds);
    /* qk reads q alone, never qt, when n <= qk_q_rows (0: it may read qt for any n): the
     * framework then leaves qt unpacked (a decoding block's Qᵀ cost a sixth of a short
     * call's time; docs/KERNELS.md, "Threads for tiny calls"). */
    int64_t qk_q_rows;

    /* Online-softmax step over one tile of final logits (masked ones are -inf):
     *   s (nk, npad)  in: logits; out: p = exp(s - m_new), 0 where s = -inf
     *   m (npad)      in/out: running max; NaN once any logit of the row is NaN
     *   l (npad)      in/out: l * alpha + sum of the row's p
     *   alpha (npad)  out: exp(m_old - m_new), the factor for the row's accumulator.
     * A row whose logits are all -inf so far keeps m = -inf and gets p = 0. Every exp is
     * the kernel's own (vectorized); its error bound is in docs/KERNELS.md. */
    void (*softmax)(int64_t npad, int64_t nk, float *s, int64_t lds, float *m, float *l,
                    float *alpha);

    /* acc = acc * alpha + P V for one tile (n real rows), the tile's P V summed from zero
     * before it is added, so rounding grows with sqrt(nk) + sqrt(Lk / nk), not sqrt(Lk).
     *   p   (nk, npad), row stride lds   probabilities, transposed as s above
     *   v   (nk, dv),   row stride ldv   the value block, natural layout
     *   acc (n, dv),    row stride ldo   the running accumulator
     * skip_zeros: the tile holds masked keys; a p of exactly 0 must then not multiply its
     * value row (NaN stored in a masked key's V must not reach the row). When false, no
     * p is 0 by masking and the kernel may multiply freely. */
    void (*pv)(int64_t n, int64_t npad, int64_t nk, int64_t dv, const float *p, int64_t lds,
               const float *v, int64_t ldv, const float *alpha, float *acc, int64_t ldo,
               bool skip_zeros);

    /* dst = src as float32, n elements of a contiguous ATTN_F16 or ATTN_BF16 row. */
    void (*to_f32)(attn_dtype dt, int64_t n, const uint16_t *src, float *dst);

    /* Optional bfloat16 entries, NULL where the CPU has no bf16 dot products.
     * qk_bf16: S^T = scale * K Q^T for bfloat16 Q and K, products on vdpbf16ps (exact
     * in float32), float32 accumulation.
     *   qp (ceil(dk/2), npad) uint32, row stride ldq: query pairs, element 2t in the low
     *      half and 2t+1 (0 past dk) in the high half, padding rows 0 (attn_pack_bf16_pairs)
     *   k  (nk, dk) bfloat16, row stride ldk: the key block, natural layout; never read
     *      past column dk - 1
     * pv_bf16: the FAST precision's P V: acc = acc * alpha + bf16(P) V for a clean tile
     * (no masked key: no p is 0 by masking), on vdpbf16ps over pairs of keys.
     *   v (nk, dv) bfloat16, row stride ldv; pairs (bk / 2 + 1) * (npad + dv) uint32 of
     *   scratch for the packed pairs of P and V; p = NULL when softmax_pairs has put the
     *   P pairs there already. */
    void (*qk_bf16)(int64_t npad, int64_t nk, int64_t dk, const uint32_t *qp, int64_t ldq,
                    const uint16_t *k, int64_t ldk, float scale, float *s, int64_t lds);
    void (*pv_bf16)(int64_t n, int64_t npad, int64_t nk, int64_t dv, const float *p,
                    int64_t lds, const uint16_t *v, int64_t ldv, const float *alpha,
                    float *acc, int64_t ldo, uint32_t *pairs);
    /* softmax_pairs: softmax's step for the FAST precision's clean tiles, its p written
     * not into s but as the bfloat16 key pairs pv_bf16 reads: pp[c][r] = (bf16 p[2c][r],
     * bf16 p[2c+1][r]) (0 past nk), row stride ldp = npad, at the start of pv_bf16's
     * pairs; pv_bf16 then takes p = NULL. m, l, alpha and the pairs are bit for bit
     * those of softmax followed by pv_bf16's own packing. */
    void (*softmax_pairs)(int64_t npad, int64_t nk, const float *s, int64_t lds, float *m,
                          float *l, float *alpha, uint32_t *pp, int64_t ldp);

    /* The bool mask on an S^T tile: s[c][r] = -inf where m[r * ldm + c] == 0, for rows
     * r < n and keys c < nk (the mask's keys contiguous). Reads only those mask bytes. */
    void (*mask_bool)(int64_t n, int64_t nk, const uint8_t *m, int64_t ldm, float *s,
                      int64_t lds);

    /* Optional, NULL where absent: one whole online-softmax step of a clean tile (no key
     * masked, by structure or element) for n <= 4 query rows, as softmax, pv and qk
     * together would do it, for decoding-shaped blocks:
     *   q (n, dk) float32 rows, row stride dk
     *   k (nk, dk), v (nk, dv) of dtype dt (F32, F16 or BF16; Q8_0 where decode_q8_0),
     *      row strides ldk, ldv in elements, unit stride along the row; read once,
     *      converted in registers
     *   round_p: the FAST precision's rounding of P to bfloat16 (nearest, ties to even)
     *      for P·V; l still sums the float32 p, as softmax does
     *   s scratch of 4 * round_up(nk, 4) floats; m, l, alpha (4) as in softmax (entries
     *      past n are scratch); acc (n, dv), row stride dv, as in pv
     *   k_scale, v_scale: an fp8 cache's scales of the tile's key/value head
     *      (attn_kv_scale: 1 where none is given); each fp8 element is read as
     *      fl32(its value · scale), one rounding, kv_block's value; the other dtypes
     *      never read them (1 by convention)
     *   ask_v, ask_nv: V rows (stride ldv) to ask for into the outer caches while Q·Kᵀ
     *      runs, ask_nv of them (0: none); next_k, next_nk: the next tile's K rows (stride
     *      ldk) to ask for while P·V runs (0: none). The framework's passes over a tile
     *      (4 rows each) share them out: the first asks for this tile's V and the next
     *      tile's K, the last of several for the next tile's V and K (fused.c) */
    void (*decode)(int64_t n, int64_t nk, int64_t dk, int64_t dv, const float *q,
                   attn_dtype dt, bool round_p, const void *k, int64_t ldk, const void *v,
                   int64_t ldv, float scale, float k_scale, float v_scale, float *s, float *m,
                   float *l, float *alpha, float *acc, const void *ask_v, int64_t ask_nv,
                   const void *next_k, int64_t next_nk);

    /* With decode: the logits decode computes for the same arguments, bit for bit, in the
     * tile's layout S^T (as qk writes them): s[c * lds + r] = scale q_r · k_c for keys
     * c < nk <= ATTN_BK_LIMIT and rows r < n, lds >= n; nothing else of s is written. The
     * step's own compact lanes stay inside the kernel (attn_decode_qk_store). */
    void (*decode_qk)(int64_t n, int64_t nk, int64_t dk, const float *q, attn_dtype dt,
                      const void *k, int64_t ldk, float scale, float k_scale, float *s,
                      int64_t lds);

    /* y = exp(x) elementwise with the kernel's own exp (the one softmax uses), for x <= 0
     * (and NaN, -inf). For the tests of its error bound. */
    void (*exp)(int64_t n, const float *x, float *y);

    /* The same ISA's micro-kernels of additive attention (additive_kernels.h), in its folder. */
    const struct attn_additive_kernels *additive;

    /* Optional (NULL: ai_dequant_q8_0_blocks, the portable one): dst = the 32 n values
     * of n contiguous q8_0 blocks (attn.h), d * qs[i], exact in float32. */
    void (*dequant_q8_0)(int64_t n, const uint8_t *src, float *dst);
    /* Whether decode and decode_qk also take dt = ATTN_Q8_0 (k and v pointing at a row's
     * first block, ldk and ldv in elements, multiples of 32; dk and dv multiples of 32). */
    bool decode_q8_0;
    /* Whether decode, decode_qk and decode_rows also take dt = ATTN_FP8_E4M3 and
     * ATTN_FP8_E5M2 (k and v bytes, strides in elements): each byte's exact value times
     * its head's k_scale or v_scale in float32, one rounding (the contract's value, the
     * tile path's: with or without scales, per tensor or per head). An e4m3 scale is
     * at most 2^100 (fused_takes_decode), so 2^8 times it is finite. */
    bool decode_fp8;
    /* Whether decode, decode_qk and decode_rows also take dt = ATTN_Q4_0 (as q8_0's:
     * rows on block starts, dk and dv multiples of 32). */
    bool decode_q4_0;

    /* Optional (NULL: the portable attn_dropout_words of philox.h): dropout's Philox words
     * of n groups, grp (n) the group indices, word w of group t into u[w * ldu + t]; bit
     * for bit philox.h's scalar attn_dropout_group on every kernel. Each ISA's table
     * compiles philox.h's simd loop with its own flags. */
    void (*dropout)(int64_t n, const uint64_t *grp, uint64_t seed, uint64_t offset,
                    uint32_t *u, int64_t ldu);

    /* C += op(A) B, a plain matrix product on row-major tiles: the backward's dV += Pᵀ dO,
     * dK += dSᵀ Q (trans_a) and dQ += dS K (src/kernels/<isa>/gemm.c, docs/KERNELS.md).
     *   op(A) (m, k): A itself, m rows of k with row stride lda (trans_a false), or the
     *         transpose of an A stored as k rows of m with row stride lda (trans_a true)
     *   b (k, n), row stride ldb;  c (m, n), row stride ldc: each element's k products
     *         are summed from zero, then added to it (the rounding of a tile's sum grows
     *         with its k, not with the number of tiles added into C)
     * 0 <= m, n; 0 <= k <= ATTN_BK_LIMIT. Reads exactly those elements of a and b, writes
     * exactly the m x n of c. skip_zeros: an element of op(A) that is exactly 0 must not
     * multiply its row of B (a NaN or Inf there, a masked key's or row's garbage, must
     * not reach C); when false the kernel may multiply freely. */
    void (*gemm)(bool trans_a, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                 const float *b, int64_t ldb, float *c, int64_t ldc, bool skip_zeros);
    /* Optional (NULL where absent): decode on a tile whose rows do not lie at one stride
     * (a paged cache's tile across pages), each row given by its address: key c at
     * k_rows[c], value row c at v_rows[c] (bytes: the row's first element, or its first
     * q8_0 block; unit stride along the row); the V rows to ask for at ask_v_rows[c],
     * c < ask_nv, the next tile's keys at next_k_rows[c], c < next_nk. Everything else as
     * decode, and bit for bit decode's result on the same rows at one stride: the tile is
     * one online-softmax step whichever pages its rows are in. */
    void (*decode_rows)(int64_t n, int64_t nk, int64_t dk, int64_t dv, const float *q,
                        attn_dtype dt, bool round_p, const char *const *k_rows,
                        const char *const *v_rows, float scale, float k_scale, float v_scale,
                        float *s, float *m, float *l, float *alpha, float *acc,
                        const char *const *ask_v_rows, int64_t ask_nv,
                        const char *const *next_k_rows, int64_t next_nk);
    /* Optional (NULL: the framework converts the value block to float32 and calls pv): pv
     * on a 16-bit value block, converted as it is read, so that the block is not written
     * out in float32 first. Arguments and results as pv's, bit for bit pv on the block's
     * float32 values (the conversion is exact), with
     *   v (nk, dv) of dtype dt (ATTN_F16 or ATTN_BF16), row stride ldv in elements, unit
     *     stride along the row; never read past column dv - 1 */
    void (*pv_h)(int64_t n, int64_t npad, int64_t nk, int64_t dv, const float *p,
                 int64_t lds, attn_dtype dt, const uint16_t *v, int64_t ldv,
                 const float *alpha, float *acc, int64_t ldo, bool skip_zeros);
    /* Optional (NULL: the framework rounds element by element, attn_store): dst = src
     * rounded to dt (ATTN_F16 or ATTN_BF16), n elements of contiguous rows, bit for bit
     * half.h's attn_f32_to_f16 / attn_f32_to_bf16 on every float (ties to even, the same
     * NaN, infinity and subnormal results): the output rows of a 16-bit O. */
    void (*from_f32)(attn_dtype dt, int64_t n, const float *src, uint16_t *dst);
    /* Optional (NULL: the list's geometry on every CPU): the kernel's per-CPU geometry,
     * read by ai_choose_tiles alone. */
    const attn_cpu_geom *cpu_geom;
    /* Optional (NULL: the portable loops of mha_gemv.c): the decoding step's one-row
     * bfloat16 products, bit for bit those loops (mha_gemv.h): rows over [in, out]
     * weights (acc += Σ a[r] row_r), dots over [out, in] ones (dot[r] = row_r · a). */
    void (*gemv_rows_bf16)(float *acc, const uint16_t *w, int64_t ld, int64_t r0, int64_t r1,
                           int64_t n, const float *a);
    void (*gemv_dots_bf16)(float *dot, const uint16_t *w, int64_t ld, int64_t r0, int64_t r1,
                           int64_t n, const float *a);
    /* Optional (NULL: the framework's scalar loop): an S^T tile written out as rows,
     * out[r][c] = s[c * lds + r] for r < n, c < nk, each out[r] nk contiguous floats (the
     * weights' rows, fused_weights.c); a copy, so bit for bit. */
    void (*rows_from_st)(int64_t n, int64_t nk, const float *s, int64_t lds, float *const *out);
};
typedef struct attn_kernels attn_kernels;

/* The tiles of a call: the one place the forward (fused.c, its weights), the backward
 * (backward_fused.c) and attn_weights_grid take their block sizes from (fused_geom.c);
 * tuned: the call's tuned configuration (p->tune, wisdom.h), whose non-zero bq and bk
 * replace the static rule's, or NULL for none. */
typedef enum attn_tile_use {
    ATTN_TILES_FORWARD,   /* the forward and attn_weights_grid                          */
    ATTN_TILES_BACKWARD,  /* the fused backward                                         */
} attn_tile_use;
typedef struct attn_tiles {
    int64_t bq, bk;  /* query rows per block, keys per block */
} attn_tiles;
ATTN_PRIVATE attn_tiles ai_choose_tiles(const attn_kernels *kern, attn_tile_use use,
                                        attn_dtype kv_dt, int64_t dk, int64_t dv,
                                        const attn_tune_config *tuned);

/* Every kernel's geometry, from its line of the list (kernels/list.h), as constants:
 * ATTN_ROW_PAD_<name>, ATTN_BQ_<name>, ATTN_BK_MIN_<name>, ATTN_BK_MAX_<name>; a
 * kernel table takes its own by ATTN_GEOM(name). */
#define ATTN_X_GEOM(name, flags, row_pad, bq, bk_min, bk_max, probe)                    \
    enum { ATTN_ROW_PAD_##name = row_pad, ATTN_BQ_##name = bq, ATTN_BK_MIN_##name = bk_min, \
           ATTN_BK_MAX_##name = bk_max };
ATTN_KERNEL_LIST(ATTN_X_GEOM)
#undef ATTN_X_GEOM
#define ATTN_GEOM(name) \
    {ATTN_ROW_PAD_##name, ATTN_BQ_##name, ATTN_BK_MIN_##name, ATTN_BK_MAX_##name}

/* Bounds every kernel's geometry keeps, checked at compile time: the framework's stack
 * scratch is sized by ATTN_BK_LIMIT, and the decoding blocks (ATTN_DECODE_MAX_ROWS rows)
 * must fit a block. */
#define ATTN_BK_LIMIT 256
/* the most query rows a forward block may hold (fused_geom.c), for every kernel */
#define ATTN_FWD_BQ_LIMIT 256
#define ATTN_X_GEOM_CHECK(name, flags, row_pad, bq, bk_min, bk_max, probe)                 \
    _Static_assert(row_pad >= 1 && bq % row_pad == 0 && bq >= 16 && 1 <= bk_min &&          \
                       bk_min <= bk_max && bk_max <= ATTN_BK_LIMIT && bk_min % row_pad == 0, \
                   "the geometry of kernel " #name " breaks the framework's bounds");
ATTN_KERNEL_LIST(ATTN_X_GEOM_CHECK)
#undef ATTN_X_GEOM_CHECK

/* the AVX-512 float32 kernels, shared by the avx512bf16 table */
ATTN_PRIVATE void ai_qk_avx512(int64_t n, int64_t npad, int64_t nk, int64_t dk, const float *q,
                               const float *qt, int64_t ldq, const float *k, int64_t ldk,
                               float scale, float *s, int64_t lds);
ATTN_PRIVATE void ai_softmax_avx512(int64_t npad, int64_t nk, float *s, int64_t lds, float *m,
                                    float *l, float *alpha);
ATTN_PRIVATE void ai_pv_avx512(int64_t n, int64_t npad, int64_t nk, int64_t dv, const float *p,
                               int64_t lds, const float *v, int64_t ldv, const float *alpha,
                               float *acc, int64_t ldo, bool skip_zeros);
ATTN_PRIVATE void ai_decode_avx512(int64_t n, int64_t nk, int64_t dk, int64_t dv, const float *q,
                                   attn_dtype dt, bool round_p, const void *k, int64_t ldk,
                                   const void *v, int64_t ldv, float scale, float k_scale,
                                   float v_scale, float *s, float *m, float *l, float *alpha,
                                   float *acc, const void *ask_v, int64_t ask_nv,
                                   const void *next_k, int64_t next_nk);
ATTN_PRIVATE void ai_decode_qk_avx512(int64_t n, int64_t nk, int64_t dk, const float *q,
                                      attn_dtype dt, const void *k, int64_t ldk, float scale,
                                      float k_scale, float *s, int64_t lds);
ATTN_PRIVATE void ai_decode_rows_avx512(int64_t n, int64_t nk, int64_t dk, int64_t dv,
                                        const float *q, attn_dtype dt, bool round_p,
                                        const char *const *k_rows, const char *const *v_rows,
                                        float scale, float k_scale, float v_scale, float *s,
                                        float *m, float *l, float *alpha, float *acc,
                                        const char *const *ask_v_rows, int64_t ask_nv,
                                        const char *const *next_k_rows, int64_t next_nk);
ATTN_PRIVATE void ai_exp_array_avx512(int64_t n, const float *x, float *y);
ATTN_PRIVATE void ai_to_f32_avx512(attn_dtype dt, int64_t n, const uint16_t *src, float *dst);
ATTN_PRIVATE void ai_mask_bool_avx512(int64_t n, int64_t nk, const uint8_t *m, int64_t ldm,
                                      float *s, int64_t lds);
/* the AVX2 decoding step (avx2/decode.c) */
ATTN_PRIVATE void ai_decode_avx2(int64_t n, int64_t nk, int64_t dk, int64_t dv, const float *q,
                                 attn_dtype dt, bool round_p, const void *k, int64_t ldk,
                                 const void *v, int64_t ldv, float scale, float k_scale,
                                 float v_scale, float *s, float *m, float *l, float *alpha,
                                 float *acc, const void *ask_v, int64_t ask_nv,
                                 const void *next_k, int64_t next_nk);
ATTN_PRIVATE void ai_decode_qk_avx2(int64_t n, int64_t nk, int64_t dk, const float *q,
                                    attn_dtype dt, const void *k, int64_t ldk, float scale,
                                    float k_scale, float *s, int64_t lds);
ATTN_PRIVATE void ai_decode_rows_avx2(int64_t n, int64_t nk, int64_t dk, int64_t dv,
                                      const float *q, attn_dtype dt, bool round_p,
                                      const char *const *k_rows, const char *const *v_rows,
                                      float scale, float k_scale, float v_scale, float *s,
                                      float *m, float *l, float *alpha, float *acc,
                                      const char *const *ask_v_rows, int64_t ask_nv,
                                      const char *const *next_k_rows, int64_t next_nk);
/* the AVX2 rounding of float32 rows to 16 bits (avx2/convert.c) */
ATTN_PRIVATE void ai_from_f32_avx2(attn_dtype dt, int64_t n, const float *src, uint16_t *dst);
ATTN_PRIVATE void ai_rows_from_st_avx2(int64_t n, int64_t nk, const float *s, int64_t lds,
                                       float *const *out);
/* the gemm entries (each in its folder's gemm.c); avx512bf16 shares the avx512 one */
#define ATTN_GEMM_DECLARE(name)                                                            \
    ATTN_PRIVATE void name(bool trans_a, int64_t m, int64_t n, int64_t k, const float *a,    \
                           int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc, \
                           bool skip_zeros);
ATTN_GEMM_DECLARE(ai_gemm_generic)
ATTN_GEMM_DECLARE(ai_gemm_avx2)
ATTN_GEMM_DECLARE(ai_gemm_avx512)
#undef ATTN_GEMM_DECLARE
/* the portable bool mask, shared by the kernels with no vector version */
ATTN_PRIVATE void ai_mask_bool_generic(int64_t n, int64_t nk, const uint8_t *m, int64_t ldm,
                                       float *s, int64_t lds);

#define ATTN_X_DECLARE(name, ...) ATTN_PRIVATE extern const attn_kernels attn_kernels_##name;
ATTN_KERNEL_LIST(ATTN_X_DECLARE)
#undef ATTN_X_DECLARE

/* The table of the kernel `name`, NULL when this build has none of that name or this CPU
 * cannot run it. */
ATTN_PRIVATE const attn_kernels *ai_kernels_named(const char *name);

/* The kernels this process uses: probed once, or forced by ATTN_ISA. NULL when ATTN_ISA
 * names a kernel this CPU cannot run (or none at all): the call then fails with
 * ATTN_ERR_UNSUPPORTED and attn_last_error() says why. */
ATTN_PRIVATE const attn_kernels *ai_select_kernels(const char **why);

/* The kernel a decoding-shaped call over a q8_0 cache runs on when `kern` was chosen:
 * kern itself when it has the q8_0 decoding step (decode_q8_0), else the best kernel
 * after it in the list that has the step and this CPU runs (an AVX-512 CPU: avx2, whose
 * step reads the blocks in registers, where avx512's tiles would dequantize every block
 * to float32 first: docs/KERNELS.md, "The q8_0 cache"), else kern (generic). */
ATTN_PRIVATE const attn_kernels *ai_kernels_for_q8_0(const attn_kernels *kern);
/* The same for an fp8 cache (with or without scales) and the fp8 decoding step
 * (decode_fp8). */
ATTN_PRIVATE const attn_kernels *ai_kernels_for_fp8(const attn_kernels *kern);
/* The same for a q4_0 cache and the q4_0 decoding step (decode_q4_0). */
ATTN_PRIVATE const attn_kernels *ai_kernels_for_q4_0(const attn_kernels *kern);

#endif /* ATTN_KERNELS_H */
