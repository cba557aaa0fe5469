/*
 * avx2/decode.c — the AVX2 decoding step: Q·Kᵀ, online softmax and P·V of one clean
 *                 tile for at most 4 query rows in one call (kernels.h: decode,
 *                 decode_qk, decode_rows), on contiguous or paged rows of any cache
 *                 dtype (fp8 read as bytes through F16C, times the head's scale, or
 *                 with the scale on the query and p where that is exact). The tile
 *                 kernels are kernels.c's; both share exp.h.
 */
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "core/half.h"
#include "kernels/kernels.h"
#include "exp.h"

/* ---- decoding: the whole step of one clean tile for at most 4 query rows ------------------
 * The AVX-512 step (avx512/kernels.c) at half the width: Q·Kᵀ by the dot-product form, 2
 * keys x 4 rows a call of dec_qk4 reduced by one hadd tree, the logits in a compact
 * layout (lane 4c + r for key c of a pair, row r), the online softmax on it, then P·V
 * for the 4 rows, 16 value columns a pass. 16-bit K and V are converted in registers.
 * Each stream is prefetched into the outer caches during the other's phase: the V rows
 * the caller asks for (this tile's, or the next tile's on a later pass over the tile)
 * while Q·Kᵀ reads K, the next tile's K rows while P·V reads V. */

/* 8 values e .. e + 7 (e a multiple of 8) of a q4_0 block's 16 bytes qs, before its scale:
 * element i < 16 is the low nibble of qs[i], element i + 16 the high one, minus 8; exact
 * as float32 (so the product with the scale is load_row's, the reference's) */
INLINE __m256 q4_eight(const uint8_t *qs, int64_t e) {
    const __m128i x = _mm_loadl_epi64((const __m128i *)(qs + e % 16));
    const __m128i nib = e < 16 ? _mm_and_si128(x, _mm_set1_epi8(0x0F))
                               : _mm_and_si128(_mm_srli_epi16(x, 4), _mm_set1_epi8(0x0F));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_sub_epi8(nib, _mm_set1_epi8(8))));
}

/* 8 e4m3 bytes from column d as float32 values x / 2^8, exact, through float16 (F16C):
 * each byte into the top of a 16-bit lane, shifted right one (the sign copied into bit
 * 14, then cleared) it is sign | (x & 0x7F) << 7, the float16 of x / 2^8 (its 4 exponent
 * bits in the low 4 of float16's 5, bias 15 = 7 + 8; subnormals too). The NaN codes
 * (x & 0x7F = 0x7F, 0x3F80 here, which would read 480 / 2^8) get float16's top exponent
 * bit too: 0x7F80, a float16 NaN. */
INLINE __m256 e4m3_eighth(const void *row, int64_t d) {
    const __m128i w = _mm_unpacklo_epi8(_mm_setzero_si128(),
                                        _mm_loadl_epi64((const __m128i *)((const uint8_t *)row + d)));
    const __m128i h = _mm_and_si128(_mm_srai_epi16(w, 1), _mm_set1_epi16((short)0xBFFF));
    const __m128i m7 = _mm_set1_epi16(0x3F80);
    const __m128i nan = _mm_and_si128(_mm_cmpeq_epi16(_mm_and_si128(h, m7), m7), _mm_set1_epi16(0x4000));
    return _mm256_cvtph_ps(_mm_or_si128(h, nan));
}

/* 8 values of a row from column d as float32 (n < 8: the first n, zeros after) */
INLINE __m256 load_row(int DT, const void *row, int64_t d, int64_t n) {
    if (n < 8) {
        float x[8] = {0};
        for (int64_t j = 0; j < n; j++) x[j] = attn_load(DT, row, d + j);
        return _mm256_loadu_ps(x);
    }
    if (DT == ATTN_F32) return _mm256_loadu_ps((const float *)row + d);
    if (DT == ATTN_Q8_0) {  // 8 of the 32 int8 of block d / 32 (d a multiple of 8), times d
        const uint8_t *b = (const uint8_t *)row + d / ATTN_Q8_0_BLOCK * ATTN_Q8_0_BYTES;
        const __m128i q8 = _mm_loadl_epi64((const __m128i *)(b + 2 + d % ATTN_Q8_0_BLOCK));
        return _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss((unsigned short)(b[0] | b[1] << 8))),
                             _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)));
    }
    if (DT == ATTN_Q4_0) {  // 8 of the 32 nibbles of block d / 32 (d a multiple of 8), times d
        const uint8_t *b = (const uint8_t *)row + d / ATTN_Q4_0_BLOCK * ATTN_Q4_0_BYTES;
        return _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss((unsigned short)(b[0] | b[1] << 8))),
                             q4_eight(b + 2, d % ATTN_Q4_0_BLOCK));
    }
    if (DT == ATTN_FP8_E5M2) {  // 8 bytes, each into the top of a 16-bit lane: its float16, exact
        return _mm256_cvtph_ps(_mm_unpacklo_epi8(_mm_setzero_si128(),
                                                 _mm_loadl_epi64((const __m128i *)((const uint8_t *)row + d))));
    }
    if (DT == ATTN_FP8_E4M3) return _mm256_mul_ps(e4m3_eighth(row, d), _mm256_set1_ps(256.0f));
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + d));
    if (DT == ATTN_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

#define IS_FP8(DT) ((DT) == ATTN_FP8_E4M3 || (DT) == ATTN_FP8_E5M2)

/* 8 values of a K or V row as the step multiplies them: an fp8 value x as load_row gives
 * it, e4m3's as x / 2^8 (exact; its 2^8 goes with the scale, kv_sc); the other dtypes as
 * load_row. Without a multiply where the step has moved the scale onto the query rows or
 * onto p (attn_fp8_factor_folds: a power of two from 1 to 2^64, so every product is the
 * same number either way). */
INLINE __m256 load_unscaled(int DT, const void *row, int64_t d, int64_t n) {
    if (DT == ATTN_FP8_E4M3)
        return n == 8 ? e4m3_eighth(row, d) : _mm256_mul_ps(load_row(DT, row, d, n), _mm256_set1_ps(0x1p-8f));
    return load_row(DT, row, d, n);
}

/* The multiplier load_kv takes for an fp8 cache's head scale: e4m3's times 2^8 (exact:
 * an e4m3 scale is at most 2^100, kernels.h) */
INLINE __m256 kv_sc(int DT, float scale) {
    return _mm256_set1_ps(DT == ATTN_FP8_E4M3 ? 256.0f * scale : scale);
}

/* load_unscaled times sc (kv_sc's) for an fp8 value: x · scale rounded once, kv_block's
 * fl32(value · scale), with one multiply (the value itself is exact, so is its product
 * with 1); the other dtypes as load_row */
INLINE __m256 load_kv(int DT, const void *row, int64_t d, int64_t n, __m256 sc) {
    const __m256 x = load_unscaled(DT, row, d, n);
    return IS_FP8(DT) ? _mm256_mul_ps(x, sc) : x;
}

/* the lines of the V rows c, c+1 (those that exist), asked for before the Q·Kᵀ of keys
 * c, c+1: outside its loop, whose every instruction counts where the group is large
 * (docs/BENCHMARKS.md, decoding's two bounds) */
INLINE void pf_v_rows(const attn_decode_pf *pf, int64_t c) {
    if (!pf->v) return;
    for (int64_t r = c; r < c + 2 && r < pf->nv; r++) {
        const char *row = pf->v_rows ? pf->v_rows[r] : pf->v + r * pf->ldv;
        for (int64_t i = 0; i < pf->lines_v; i++) _mm_prefetch(row + 64 * i, _MM_HINT_T2);
    }
}

/* logits of NR rows x KC (1 or 2) keys at kr[0], kr[1]: lanes 4c + r, scaled; lanes of a missing
 * second key -inf; an fp8 K's values times ksc (load_kv) where KMUL, else as they are
 * (load_unscaled: the factor is on q, dec_logits). A bfloat16 K is widened 8
 * values at a time like float16, not split into even and odd halves as the AVX-512 step
 * does: with 8 sums (2 keys x 4 rows), the halves' two FMAs on each sum a step are a
 * chain as long as the step's FMA issue (16 FMAs in 8 cycles at latency 4), which ran
 * Q·Kᵀ at the chain's pace (docs/KERNELS.md, "Designs tried"). */
INLINE __m256 dec_qk4(int DT, bool KMUL, int NR, int KC, int64_t dk, const float *q,
                       const char *const kr[2], __m256 scale, __m256 ksc,
                       const attn_decode_pf *pf, int64_t c) {
    __m256 acc[2][4];
    UNROLL for (int j = 0; j < 2; j++)
        UNROLL for (int r = 0; r < 4; r++) acc[j][r] = _mm256_setzero_ps();
    pf_v_rows(pf, c);
    if (DT == ATTN_Q8_0) {  // block by block (dk a multiple of 32): a key's scale
        for (int64_t d = 0; d < dk; d += 32) {  // converted once, as load_row's product
            const uint8_t *b[2];
            __m256 sc[2];
            UNROLL for (int j = 0; j < KC; j++) {
                b[j] = (const uint8_t *)kr[j] + d / ATTN_Q8_0_BLOCK * ATTN_Q8_0_BYTES;
                sc[j] = _mm256_set1_ps(_cvtsh_ss((unsigned short)(b[j][0] | b[j][1] << 8)));
            }
            UNROLL for (int h = 0; h < 4; h++) {
                __m256 kv[2];
                UNROLL for (int j = 0; j < KC; j++)
                    kv[j] = _mm256_mul_ps(sc[j], _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                     _mm_loadl_epi64((const __m128i *)(b[j] + 2 + 8 * h)))));
                UNROLL for (int r = 0; r < NR; r++) {
                    const __m256 qv = _mm256_loadu_ps(q + r * dk + d + 8 * h);
                    UNROLL for (int j = 0; j < KC; j++) acc[j][r] = _mm256_fmadd_ps(qv, kv[j], acc[j][r]);
                }
            }
        }
    } else if (DT == ATTN_Q4_0) {  // block by block (dk a multiple of 32), as q8_0's
        for (int64_t d = 0; d < dk; d += 32) {
            const uint8_t *b[2];
            __m256 sc[2];
            UNROLL for (int j = 0; j < KC; j++) {
                b[j] = (const uint8_t *)kr[j] + d / ATTN_Q4_0_BLOCK * ATTN_Q4_0_BYTES;
                sc[j] = _mm256_set1_ps(_cvtsh_ss((unsigned short)(b[j][0] | b[j][1] << 8)));
            }
            UNROLL for (int h = 0; h < 4; h++) {
                __m256 kv[2];
                UNROLL for (int j = 0; j < KC; j++) kv[j] = _mm256_mul_ps(sc[j], q4_eight(b[j] + 2, 8 * h));
                UNROLL for (int r = 0; r < NR; r++) {
                    const __m256 qv = _mm256_loadu_ps(q + r * dk + d + 8 * h);
                    UNROLL for (int j = 0; j < KC; j++) acc[j][r] = _mm256_fmadd_ps(qv, kv[j], acc[j][r]);
                }
            }
        }
    } else {
        /* whole vectors, then the tail: the same sums, the whole ones without its tests */
        int64_t d = 0;
        for (; d + 8 <= dk; d += 8) {
            __m256 kv[2];
            UNROLL for (int j = 0; j < KC; j++)
                kv[j] = KMUL ? load_kv(DT, kr[j], d, 8, ksc) : load_unscaled(DT, kr[j], d, 8);
            UNROLL for (int r = 0; r < NR; r++) {
                __m256 qv = _mm256_loadu_ps(q + r * dk + d);
                __asm__("" : "+x"(qv));  // one load for both keys' FMAs, not a memory operand in each
                UNROLL for (int j = 0; j < KC; j++) acc[j][r] = _mm256_fmadd_ps(qv, kv[j], acc[j][r]);
            }
        }
        for (; d < dk; d += 8) {
            const int64_t left = dk - d < 8 ? dk - d : 8;
            __m256 kv[2];
            UNROLL for (int j = 0; j < KC; j++)
                kv[j] = KMUL ? load_kv(DT, kr[j], d, left, ksc) : load_unscaled(DT, kr[j], d, left);
            UNROLL for (int r = 0; r < NR; r++) {
                const __m256 qv = load_row(ATTN_F32, q + r * dk, d, left);
                UNROLL for (int j = 0; j < KC; j++) acc[j][r] = _mm256_fmadd_ps(qv, kv[j], acc[j][r]);
            }
        }
    }
    const __m256 h01 = _mm256_hadd_ps(acc[0][0], acc[0][1]), h23 = _mm256_hadd_ps(acc[0][2], acc[0][3]);
    const __m256 h45 = _mm256_hadd_ps(acc[1][0], acc[1][1]), h67 = _mm256_hadd_ps(acc[1][2], acc[1][3]);
    const __m256 a = _mm256_hadd_ps(h01, h23), b = _mm256_hadd_ps(h45, h67);
    const __m256 z = _mm256_mul_ps(scale, _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20),
                                                        _mm256_permute2f128_ps(a, b, 0x31)));
    if (KC == 2) return z;
    return _mm256_blend_ps(z, _mm256_set1_ps(-INFINITY), 0xF0);
}

enum { DEC_FOLD_MAX_DK = 256 };  // the query copy of a folded fp8 factor, on the stack

/* The tile's logits for NR rows, 2 keys a vector (lane 4c + r; lanes of a key past nk
 * -inf) into s; *mx gets their lane-wise max, *nan the lanes that saw a NaN. Key c at
 * k + c * ldk, or at rows[c] where rows is given (decode_rows); an fp8 K's values times
 * k_scale. The one Q·Kᵀ of the decoding step, for decode, decode_rows and decode_qk
 * alike. */
INLINE void dec_logits(int DT, int NR, int64_t nk, int64_t dk, const float *q, const char *k,
                        int64_t ldk, const char *const *rows, float scale, float k_scale,
                        float *s, const attn_decode_pf *pf, __m256 *mx, __m256 *nan) {
    const __m256 vscale = _mm256_set1_ps(scale), ksc = kv_sc(DT, k_scale);
    /* an fp8 K's factor on the query instead where that is exact (attn_fp8_fold_query) */
    const float ks = _mm256_cvtss_f32(ksc);
    float qf[4 * DEC_FOLD_MAX_DK];
    const float *qk = IS_FP8(DT) && attn_fp8_factor_folds(ks) && dk <= DEC_FOLD_MAX_DK
                          ? attn_fp8_fold_query(NR * dk, q, ks, qf) : NULL;
    *mx = _mm256_set1_ps(-INFINITY);
    *nan = _mm256_setzero_ps();
    for (int64_t c = 0; c < nk; c += 2) {
        const char *kr[2] = {rows ? rows[c] : k + c * ldk, NULL};
        if (c + 1 < nk) kr[1] = rows ? rows[c + 1] : kr[0] + ldk;
        const __m256 z = qk
                             ? (c + 2 <= nk ? dec_qk4(DT, false, NR, 2, dk, qk, kr, vscale, ksc, pf, c)
                                            : dec_qk4(DT, false, NR, 1, dk, qk, kr, vscale, ksc, pf, c))
                             : (c + 2 <= nk ? dec_qk4(DT, true, NR, 2, dk, q, kr, vscale, ksc, pf, c)
                                            : dec_qk4(DT, true, NR, 1, dk, q, kr, vscale, ksc, pf, c));
        _mm256_storeu_ps(s + 4 * c, z);
        *mx = _mm256_max_ps(*mx, z);
        *nan = _mm256_or_ps(*nan, _mm256_cmp_ps(z, z, _CMP_UNORD_Q));
    }
}

/* per row, the max (sum) over the 2 key lanes of a compact vector, in both halves */
INLINE __m256 rows_max(__m256 x) { return _mm256_max_ps(x, _mm256_permute2f128_ps(x, x, 0x01)); }
INLINE __m256 rows_sum(__m256 x) { return _mm256_add_ps(x, _mm256_permute2f128_ps(x, x, 0x01)); }

/* x rounded to the nearest bfloat16, ties to even (half.h's attn_f32_to_bf16); NaN stays
 * NaN, made quiet */
INLINE __m256 round_bf16(__m256 x) {
    const __m256i b = _mm256_castps_si256(x), hi = _mm256_set1_epi32((int)0xFFFF0000u);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_and_si256(_mm256_add_epi32(b, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), hi);
    const __m256i quiet = _mm256_and_si256(_mm256_or_si256(b, _mm256_set1_epi32(0x00400000)), hi);
    return _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(quiet), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* The lines [l0, l1) of the next tile's K (pf->nk rows of lines_k lines, counted in
 * address order: line x is line x % lines_k of row x / lines_k, not line i of every row in
 * pass i: docs/KERNELS.md, "The decoding step's prefetch order on Zen 3") that a P·V pass
 * asks for beside its FMAs: returns how many its loop asks for (at most cap), *flat the
 * first of them where the rows lie end to end (line i at *flat + 64 i), else NULL and
 * their addresses in pa; any past cap are asked for here. Found before the pass, so that
 * its loop carries one pointer for them: counting rows and lines inside it spilled the
 * loop's own pointers to the stack (docs/KERNELS.md, "The decoding step's P·V loop"). */
INLINE bool pf_k_flat(const attn_decode_pf *pf) { return !pf->k_rows && pf->ldk == 64 * pf->lines_k; }

INLINE int64_t pf_k_lines(const attn_decode_pf *pf, int64_t l0, int64_t l1, int64_t cap,
                          const char **pa, const char **flat) {
    *flat = NULL;
    if (!pf->k || l1 <= l0) return 0;
    const int64_t lines = pf->lines_k, n = l1 - l0 < cap ? l1 - l0 : cap;
    if (pf_k_flat(pf)) {  // rows end to end: line x at k + 64 x
        *flat = pf->k + 64 * l0;
        for (int64_t x = l0 + n; x < l1; x++) _mm_prefetch(pf->k + 64 * x, _MM_HINT_T2);
        return n;
    }
    /* row by row: the lines of a row at one pointer, no per-line test of the row's end */
    int64_t x = l0, m = 0;
    for (int64_t row = l0 / lines; x < l1; row++) {
        const char *base = pf->k_rows ? pf->k_rows[row] : pf->k + row * pf->ldk;
        const int64_t c1 = (row + 1) * lines < l1 ? (row + 1) * lines : l1;
        for (; x < c1; x++, m++) {
            const char *line = base + 64 * (x - row * lines);
            if (m < n) pa[m] = line;
            else _mm_prefetch(line, _MM_HINT_T2);
        }
    }
    return n;
}

/* t[r][0..1] += the compact p (key c of row r at s[4c + r]) times value columns d0.. of
 * the nk V rows (at v + c * ldv, or vrows[c] where vrows is given), asking beside key c
 * for the line at flat + c * step bytes (FLAT) or at pa[c >> step]: the caller spreads
 * the next tile's K lines evenly over the keys that way (a burst of them in half the keys
 * cost a bfloat16 tile of 128 keys its gain), a line asked for twice where there are fewer
 * lines than keys, so that the loop has no test of its own for it (docs/KERNELS.md, "The
 * decoding step's P·V loop"). WHOLE: a pass of 16 columns, a bfloat16 V by halves
 * (t[r][0] the even columns, t[r][1] the odd ones); else the last pass of a row, nd < 16
 * columns. Each kind of pass in a loop of its own, its tests hoisted out of it. An fp8
 * V's values times vsc (load_kv) where VMUL, else as they are (the factor is on p). */
INLINE void dec_pv_keys(int DT, int NR, bool VMUL, bool WHOLE, bool FLAT, int64_t nk, const float *s,
                        const char *v, int64_t ldv, const char *const *vrows, int64_t d0,
                        int64_t nd, const char *const *pa, const char *flat, int64_t step,
                        __m256 vsc, __m256 t[4][2]) {
    const __m256i hi16 = _mm256_set1_epi32((int)0xFFFF0000u);
    const int64_t n0 = nd < 8 ? nd : 8, n1 = nd - n0;
    /* a whole pass's columns from a pointer at column d0: one pointer a key in the loop */
    const int64_t at = WHOLE && !attn_is_block_dtype((attn_dtype)DT) ? d0 * (int64_t)attn_elem_bytes((attn_dtype)DT) : 0;
    for (int64_t c = 0; c < nk; c++) {
        const char *row = (vrows ? vrows[c] : v + c * ldv) + at;
        __m256 v0, v1;
        if (WHOLE && DT == ATTN_BF16) {
            const __m256i raw = _mm256_loadu_si256((const __m256i *)row);
            v0 = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
            v1 = _mm256_castsi256_ps(_mm256_and_si256(raw, hi16));
        } else if (DT == ATTN_Q8_0) {  // dv a multiple of 32: the 16 columns in one block,
            const uint8_t *b = (const uint8_t *)row + d0 / ATTN_Q8_0_BLOCK * ATTN_Q8_0_BYTES;
            const __m256 sc = _mm256_set1_ps(_cvtsh_ss((unsigned short)(b[0] | b[1] << 8)));
            const __m128i q16 = _mm_loadu_si128((const __m128i *)(b + 2 + d0 % ATTN_Q8_0_BLOCK));
            /* its scale converted once for both halves, each product as load_row's */
            v0 = _mm256_mul_ps(sc, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q16)));
            v1 = _mm256_mul_ps(sc, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q16, 8))));
        } else if (DT == ATTN_Q4_0) {  // dv a multiple of 32: the 16 columns in one block
            const uint8_t *b = (const uint8_t *)row + d0 / ATTN_Q4_0_BLOCK * ATTN_Q4_0_BYTES;
            const __m256 sc = _mm256_set1_ps(_cvtsh_ss((unsigned short)(b[0] | b[1] << 8)));
            v0 = _mm256_mul_ps(sc, q4_eight(b + 2, d0 % ATTN_Q4_0_BLOCK));
            v1 = _mm256_mul_ps(sc, q4_eight(b + 2, d0 % ATTN_Q4_0_BLOCK + 8));
        } else if (WHOLE) {
            v0 = VMUL ? load_kv(DT, row, 0, 8, vsc) : load_unscaled(DT, row, 0, 8);
            v1 = VMUL ? load_kv(DT, row, 8, 8, vsc) : load_unscaled(DT, row, 8, 8);
        } else {
            v0 = VMUL ? load_kv(DT, row, d0, n0, vsc) : load_unscaled(DT, row, d0, n0);
            v1 = n1 <= 0 ? _mm256_setzero_ps()
                 : VMUL  ? load_kv(DT, row, d0 + 8, n1, vsc) : load_unscaled(DT, row, d0 + 8, n1);
        }
        _mm_prefetch(FLAT ? flat + c * step : pa[c >> step], _MM_HINT_T2);
        UNROLL for (int r = 0; r < NR; r++) {
            const __m256 pb = _mm256_set1_ps(s[4 * c + r]);
            t[r][0] = _mm256_fmadd_ps(pb, v0, t[r][0]);
            t[r][1] = _mm256_fmadd_ps(pb, v1, t[r][1]);
        }
    }
}

/* acc rows 0..NR-1, value columns d0..d0+nd-1 (nd <= 16), from the compact p (key c of row
 * r at s[4c + r]; its V row at v + c * ldv, or vrows[c] where vrows is given), rescaled by
 * alpha; lines [l0, l1) of the next tile's K (pf_k_lines) asked for over the pass's keys;
 * an fp8 V's values times v_scale where VMUL (else decode_tile put it on p) */
INLINE void dec_pv(int DT, int NR, bool VMUL, int64_t nk, const float *s, const char *v, int64_t ldv,
                    const char *const *vrows, int64_t d0, int64_t nd, float v_scale,
                    const float *alpha, float *acc, int64_t dv, const attn_decode_pf *pf,
                    int64_t l0, int64_t l1) {
    const __m256 vsc = kv_sc(DT, v_scale);
    __m256 t[4][2];
    UNROLL for (int r = 0; r < 4; r++) t[r][0] = t[r][1] = _mm256_setzero_ps();
    /* the lines over the nk keys, at most one a key: at one pointer, line floor(c npa / nk)
     * beside key c; from the list, line c >> step, step the least shift that keeps it in
     * the lines, the loop's list of ((nk - 1) >> step) + 1 (all of them where the lines
     * are nk / 2^step: float32 tiles of 64 keys ask 64 lines a pass, bfloat16 of 128 ask
     * 64); pf_k_lines asks for any past the loop's */
    const int64_t kmax = nk < ATTN_BK_LIMIT ? nk : ATTN_BK_LIMIT;
    const int64_t want = pf->k && l1 > l0 ? (l1 - l0 < kmax ? l1 - l0 : kmax) : 0;
    int64_t step = 0;
    if (want > 0 && !pf_k_flat(pf))
        while (((nk - 1) >> step) + 1 > want) step++;
    const char *pa[ATTN_BK_LIMIT], *flat;
    const int64_t npa = pf_k_lines(pf, l0, l1, step ? ((nk - 1) >> step) + 1 : kmax, pa, &flat);
    if (npa == 0) flat = (const char *)s;  // nothing to ask for: a line of the loop's own, in L1
    else if (flat) step = (64 * npa + nk - 1) / nk;  // up to (nk - 1) / 64 lines past l1's: a hint
    /* a q8_0 or q4_0 V has dv a multiple of 32, so every pass is whole */
    if (nd == 16 || attn_is_block_dtype((attn_dtype)DT)) {
        if (flat) dec_pv_keys(DT, NR, VMUL, true, true, nk, s, v, ldv, vrows, d0, 16, pa, flat, step, vsc, t);
        else dec_pv_keys(DT, NR, VMUL, true, false, nk, s, v, ldv, vrows, d0, 16, pa, flat, step, vsc, t);
        if (DT == ATTN_BF16)  // even and odd columns back in order
            UNROLL for (int r = 0; r < NR; r++) {
                const __m256 lo = _mm256_unpacklo_ps(t[r][0], t[r][1]), hi = _mm256_unpackhi_ps(t[r][0], t[r][1]);
                t[r][0] = _mm256_permute2f128_ps(lo, hi, 0x20);
                t[r][1] = _mm256_permute2f128_ps(lo, hi, 0x31);
            }
        UNROLL for (int r = 0; r < NR; r++) {
            const __m256 a = _mm256_set1_ps(alpha[r]);
            float *o = acc + r * dv + d0;
            _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_loadu_ps(o), a, t[r][0]));
            _mm256_storeu_ps(o + 8, _mm256_fmadd_ps(_mm256_loadu_ps(o + 8), a, t[r][1]));
        }
        return;
    }
    if (flat) dec_pv_keys(DT, NR, VMUL, false, true, nk, s, v, ldv, vrows, d0, nd, pa, flat, step, vsc, t);
    else dec_pv_keys(DT, NR, VMUL, false, false, nk, s, v, ldv, vrows, d0, nd, pa, flat, step, vsc, t);
    const int64_t n0 = nd < 8 ? nd : 8, n1 = nd - n0;
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    UNROLL for (int r = 0; r < NR; r++) {
        const __m256 a = _mm256_set1_ps(alpha[r]);
        UNROLL for (int h = 0; h < 2; h++) {
            const int64_t cols = h == 0 ? n0 : n1;
            if (cols <= 0) break;
            float *o = acc + r * dv + d0 + 8 * h;
            const __m256i mk = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)cols), lane);
            _mm256_maskstore_ps(o, mk, _mm256_fmadd_ps(_mm256_maskload_ps(o, mk), a, t[r][h]));
        }
    }
}

/* one step on the tile's rows: at k + c * ldk, v + c * ldv, or at k_rows[c], v_rows[c]
 * where those are given (decode_rows); the same arithmetic either way. An fp8 cache's
 * values times k_scale, v_scale (kernels.h: decode). */
INLINE void decode_tile(int DT, int NR, bool round_p, int64_t nk, int64_t dk, int64_t dv,
                             const float *q, const char *k, int64_t ldk, const char *v,
                             int64_t ldv, const char *const *k_rows, const char *const *v_rows,
                             float scale, float k_scale, float v_scale, float *s, float *m,
                             float *l, float *alpha, float *acc, const attn_decode_pf *pf) {
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
    const int64_t nv = (nk + 1) / 2;
    __m256 mx, nan;
    dec_logits(DT, NR, nk, dk, q, k, ldk, k_rows, scale, k_scale, s, pf, &mx, &nan);
    /* the online-softmax update of softmax_avx2, on the compact layout */
    const __m256 m_old = _mm256_broadcast_ps((const __m128 *)m);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(m_old, m_old, _CMP_UNORD_Q));
    nan = _mm256_or_ps(nan, _mm256_permute2f128_ps(nan, nan, 0x01));
    __m256 m_new = _mm256_max_ps(m_old, rows_max(mx));
    m_new = _mm256_blendv_ps(m_new, _mm256_set1_ps(NAN), nan);
    const __m256 shift = _mm256_blendv_ps(m_new, _mm256_setzero_ps(), _mm256_cmp_ps(m_new, neg_inf, _CMP_EQ_OQ));
    __m256 sum = _mm256_setzero_ps();
    /* an fp8 V's factor on p instead (attn_fp8_factor_folds), the sum l of the unscaled p */
    const float vs = _mm256_cvtss_f32(kv_sc(DT, v_scale));
    const bool vfold = IS_FP8(DT) && attn_fp8_factor_folds(vs);
    const __m256 pmul = _mm256_set1_ps(vs);
    for (int64_t x = 0; x < nv; x++) {
        const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + 8 * x), shift));
        /* FAST precision: P rounded to bfloat16 for P V, the sum l of the float32 p */
        const __m256 p = round_p ? round_bf16(e) : e;
        _mm256_storeu_ps(s + 8 * x, vfold ? _mm256_mul_ps(p, pmul) : p);
        sum = _mm256_add_ps(sum, e);
    }
    const __m256 a = exp_avx2(_mm256_sub_ps(m_old, shift));
    const __m128 l_new = _mm_fmadd_ps(_mm_loadu_ps(l), _mm256_castps256_ps128(a),
                                      _mm256_castps256_ps128(rows_sum(sum)));
    _mm_storeu_ps(alpha, _mm256_castps256_ps128(a));
    _mm_storeu_ps(l, l_new);
    _mm_storeu_ps(m, _mm256_castps256_ps128(m_new));
    /* P V, 16 columns a pass; the next tile's K lines (pf->nk rows of lines_k) shared out
     * over the passes in address order */
    const int64_t passes = (dv + 15) / 16, lines = pf->k ? pf->nk * pf->lines_k : 0;
    for (int64_t p = 0; p < passes; p++) {
        const int64_t d0 = 16 * p, nd = dv - d0 < 16 ? dv - d0 : 16;
        if (vfold)
            dec_pv(DT, NR, false, nk, s, v, ldv, v_rows, d0, nd, v_scale, alpha, acc, dv, pf,
                   p * lines / passes, (p + 1) * lines / passes);
        else
            dec_pv(DT, NR, true, nk, s, v, ldv, v_rows, d0, nd, v_scale, alpha, acc, dv, pf,
                   p * lines / passes, (p + 1) * lines / passes);
    }
}

#define DECODE_AVX2(DT)                                                                       \
    switch (n) {                                                                              \
    case 1: decode_tile(DT, 1, round_p, nk, dk, dv, q, kb, ldkb, vb, ldvb, kr, vr, scale, k_scale, v_scale, s, m, l, alpha, acc, &pf); break; \
    case 2: decode_tile(DT, 2, round_p, nk, dk, dv, q, kb, ldkb, vb, ldvb, kr, vr, scale, k_scale, v_scale, s, m, l, alpha, acc, &pf); break; \
    case 3: decode_tile(DT, 3, round_p, nk, dk, dv, q, kb, ldkb, vb, ldvb, kr, vr, scale, k_scale, v_scale, s, m, l, alpha, acc, &pf); break; \
    default: decode_tile(DT, 4, round_p, nk, dk, dv, q, kb, ldkb, vb, ldvb, kr, vr, scale, k_scale, v_scale, s, m, l, alpha, acc, &pf); break; \
    }

void ai_decode_avx2(int64_t n, int64_t nk, int64_t dk, int64_t dv, const float *q,
                    attn_dtype dt, bool round_p, const void *k, int64_t ldk, const void *v,
                    int64_t ldv, float scale, float k_scale, float v_scale, float *s, float *m,
                    float *l, float *alpha, float *acc, const void *ask_v,
                    int64_t ask_nv, const void *next_k, int64_t next_nk) {
    const int64_t es = attn_elem_bytes(dt);
    const char *kb = (const char *)k, *vb = (const char *)v;
    const int64_t ldkb = attn_row_byte_offset(dt, ldk), ldvb = attn_row_byte_offset(dt, ldv);
    attn_decode_pf pf = attn_decode_pf_make(ask_v, ldv, ask_nv, dv, next_k, ldk, next_nk, dk, es);
    const char *const *kr = NULL, *const *vr = NULL;  // at one stride
    if (attn_is_block_dtype(dt)) {  // rows of blocks: strides and lines in bytes of blocks
        pf.ldv = ldvb, pf.ldk = ldkb;
        pf.lines_v = (attn_row_bytes(dt, dv) + 63) / 64, pf.lines_k = (attn_row_bytes(dt, dk) + 63) / 64;
    }
    if (pf.k && ldkb == attn_row_bytes(dt, dk)) {
        /* rows end to end (a contiguous cache's head): the next tile's K as one span, one
         * "row" of its lines, each asked for once (rows of 136 bytes, q8_0 at D = 128,
         * share lines: row by row asked for 384 lines of a 272-line span) */
        const int64_t skew = (int64_t)((uintptr_t)pf.k & 63);
        pf.k -= skew;
        pf.lines_k = (next_nk * ldkb + skew + 63) / 64, pf.nk = 1, pf.ldk = 64 * pf.lines_k;
    }
    if (dt == ATTN_Q8_0) {
        DECODE_AVX2(ATTN_Q8_0);
        return;
    }
    if (dt == ATTN_Q4_0) {
        DECODE_AVX2(ATTN_Q4_0);
        return;
    }
    if (dt == ATTN_FP8_E4M3) {  // bytes, each value times its head's scale (load_kv)
        DECODE_AVX2(ATTN_FP8_E4M3);
        return;
    }
    if (dt == ATTN_FP8_E5M2) {
        DECODE_AVX2(ATTN_FP8_E5M2);
        return;
    }
    ATTN_KV_DTYPE_SWITCH(dt, DECODE_AVX2);
}

/* decode_avx2's logits alone (kernels.h: decode_qk), for the weights' sweep */
void ai_decode_qk_avx2(int64_t n, int64_t nk, int64_t dk, const float *q, attn_dtype dt,
                       const void *k, int64_t ldk, float scale, float k_scale, float *st,
                       int64_t lds) {
    const attn_decode_pf none = {0};
    float s[4 * (ATTN_BK_LIMIT + 4)];  // the step's compact lanes, then into st
    const char *kb = (const char *)k;
    const int64_t ldkb = attn_row_byte_offset(dt, ldk);
    __m256 mx, nan;
#define LOGITS(DT)                                                                              \
    switch (n) {                                                                                \
    case 1: dec_logits(DT, 1, nk, dk, q, kb, ldkb, NULL, scale, k_scale, s, &none, &mx, &nan); break;    \
    case 2: dec_logits(DT, 2, nk, dk, q, kb, ldkb, NULL, scale, k_scale, s, &none, &mx, &nan); break;    \
    case 3: dec_logits(DT, 3, nk, dk, q, kb, ldkb, NULL, scale, k_scale, s, &none, &mx, &nan); break;    \
    default: dec_logits(DT, 4, nk, dk, q, kb, ldkb, NULL, scale, k_scale, s, &none, &mx, &nan); break;   \
    }
    if (dt == ATTN_Q8_0) LOGITS(ATTN_Q8_0)
    else if (dt == ATTN_Q4_0) LOGITS(ATTN_Q4_0)
    else if (dt == ATTN_FP8_E4M3) LOGITS(ATTN_FP8_E4M3)
    else if (dt == ATTN_FP8_E5M2) LOGITS(ATTN_FP8_E5M2)
    else ATTN_KV_DTYPE_SWITCH(dt, LOGITS);
#undef LOGITS
    attn_decode_qk_store(n, nk, s, st, lds);
}

/* decode_avx2 on rows given by their addresses (kernels.h: decode_rows): a paged tile's
 * rows read in place from their pages, in one step */
void ai_decode_rows_avx2(int64_t n, int64_t nk, int64_t dk, int64_t dv, const float *q,
                         attn_dtype dt, bool round_p, const char *const *kr,
                         const char *const *vr, float scale, float k_scale, float v_scale,
                         float *s, float *m, float *l, float *alpha, float *acc,
                         const char *const *ask_vr, int64_t ask_nv,
                         const char *const *next_kr, int64_t next_nk) {
    const int64_t es = attn_elem_bytes(dt);
    const char *kb = kr[0], *vb = vr[0];
    const int64_t ldkb = 0, ldvb = 0;  // unused: every row from kr, vr
    attn_decode_pf pf = attn_decode_pf_make(ask_nv > 0 ? ask_vr[0] : NULL, 0, ask_nv, dv,
                                            next_nk > 0 ? next_kr[0] : NULL, 0, next_nk, dk, es);
    pf.v_rows = ask_vr, pf.k_rows = next_kr;
    if (attn_is_block_dtype(dt)) {  // rows of blocks: lines in bytes of blocks
        pf.lines_v = (attn_row_bytes(dt, dv) + 63) / 64, pf.lines_k = (attn_row_bytes(dt, dk) + 63) / 64;
        if (dt == ATTN_Q8_0) DECODE_AVX2(ATTN_Q8_0)
        else DECODE_AVX2(ATTN_Q4_0)
        return;
    }
    if (dt == ATTN_FP8_E4M3) {
        DECODE_AVX2(ATTN_FP8_E4M3);
        return;
    }
    if (dt == ATTN_FP8_E5M2) {
        DECODE_AVX2(ATTN_FP8_E5M2);
        return;
    }
    ATTN_KV_DTYPE_SWITCH(dt, DECODE_AVX2);
}
#endif
