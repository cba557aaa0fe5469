/*
 * avx512/kernels.c — the AVX-512F micro-kernels (contracts in kernels.h; design notes
 *                    and the exp error bound in docs/KERNELS.md).
 *
 * Only this file is compiled with AVX-512 flags; dispatch.c calls it only on a CPU that
 * has AVX-512F/DQ/BW/VL and FMA. One zmm holds 16 query rows of S^T, so the softmax's
 * row max and row sum are element-wise across keys. The register tiles:
 *   qk: up to 4 zmm of rows x KC keys (24 accumulators at 64 rows), K broadcast from
 *       its natural layout, Q^T loaded as vectors;
 *   pv: 4 rows x 4 zmm of value columns (16 accumulators), P broadcast, V loaded;
 *       the last column chunk is masked, so any Dv works.
 */
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include <math.h>

#include "softmax.h"
#include "kernels/additive_kernels.h"
#include "kernels/kernels.h"
#include "kernels/avx2/gemv.h"
#include "core/half.h"  // attn_fp8_factor_folds
#include "core/philox.h"

#define UNROLL _Pragma("GCC unroll 16")
#define INLINE ATTN_KERNEL_INLINE

/* S^T for RV zmm of rows (16 RV rows) and KC keys starting at key c0. */
INLINE void qk_tile(int RV, int KC, int64_t dk, const float *qt, int64_t ldq, const float *k,
                    int64_t ldk, __m512 scale, float *s, int64_t lds) {
    __m512 acc[4][12];
    UNROLL for (int a = 0; a < RV; a++)
        UNROLL for (int c = 0; c < KC; c++) acc[a][c] = _mm512_setzero_ps();
    for (int64_t d = 0; d < dk; d++) {
        __m512 q[4];
        UNROLL for (int a = 0; a < RV; a++) q[a] = _mm512_loadu_ps(qt + d * ldq + 16 * a);
        UNROLL for (int c = 0; c < KC; c++) {
            const __m512 kb = _mm512_set1_ps(k[c * ldk + d]);
            UNROLL for (int a = 0; a < RV; a++) acc[a][c] = _mm512_fmadd_ps(kb, q[a], acc[a][c]);
        }
    }
    UNROLL for (int c = 0; c < KC; c++)
        UNROLL for (int a = 0; a < RV; a++)
            _mm512_storeu_ps(s + c * lds + 16 * a, _mm512_mul_ps(acc[a][c], scale));
}

/* keys in groups of KC (more keys when there are fewer row vectors, to keep enough
 * independent accumulators in flight); at 4 row vectors the last nk % KC keys in one
 * narrower tile (64 keys leave 4 after the groups of 6, which one at a time had 4
 * accumulators and 5 loads per 4 FMAs: 2.5% of a 64 x 64 x 128 tile's time), else one
 * key at a time. Each logit is the same dot product in the same order either way. */
#define QK_ROWS(RV, KC)                                                                  \
    static void qk_rows##RV(int64_t nk, int64_t dk, const float *qt, int64_t ldq,       \
                            const float *k, int64_t ldk, __m512 scale, float *s,        \
                            int64_t lds) {                                              \
        int64_t c = 0;                                                                   \
        for (; c + KC <= nk; c += KC)                                                    \
            qk_tile(RV, KC, dk, qt, ldq, k + c * ldk, ldk, scale, s + c * lds, lds);     \
        const float *kc = k + c * ldk;                                                   \
        float *sc = s + c * lds;                                                         \
        switch (RV >= 4 ? nk - c : 0) {                                                  \
        case 5: qk_tile(RV, 5, dk, qt, ldq, kc, ldk, scale, sc, lds); return;            \
        case 4: qk_tile(RV, 4, dk, qt, ldq, kc, ldk, scale, sc, lds); return;            \
        case 3: qk_tile(RV, 3, dk, qt, ldq, kc, ldk, scale, sc, lds); return;            \
        case 2: qk_tile(RV, 2, dk, qt, ldq, kc, ldk, scale, sc, lds); return;            \
        default: break;                                                                  \
        }                                                                                \
        for (; c < nk; c++)                                                              \
            qk_tile(RV, 1, dk, qt, ldq, k + c * ldk, ldk, scale, s + c * lds, lds);      \
    }
QK_ROWS(1, 12)
QK_ROWS(2, 8)
QK_ROWS(3, 6)
QK_ROWS(4, 6)

/* The 16 lane sums of acc[r][c] (4 rows x 4 keys) at once, by a transposing tree (45
 * operations rather than 16 reductions of 8): with A_(4r+c) = acc[r][c], pairs of vectors
 * are folded by 256-bit halves, then 128-bit lanes, then within lanes; 128-bit lane c of
 * the result holds rows 0..3 of key c, times scale. */
INLINE __m512 lane_sums_4x4(__m512 acc[4][4], __m512 scale) {
    __m512 t[8], u[4];
    UNROLL for (int j = 0; j < 8; j++) {
        const __m512 a = acc[(2 * j) / 4][(2 * j) % 4], b = acc[(2 * j + 1) / 4][(2 * j + 1) % 4];
        t[j] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    }
    UNROLL for (int j = 0; j < 4; j++)
        u[j] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * j], t[2 * j + 1], 0x88),
                             _mm512_shuffle_f32x4(t[2 * j], t[2 * j + 1], 0xDD));
    const __m512 v0 = _mm512_add_ps(_mm512_unpacklo_ps(u[0], u[1]), _mm512_unpackhi_ps(u[0], u[1]));
    const __m512 v1 = _mm512_add_ps(_mm512_unpacklo_ps(u[2], u[3]), _mm512_unpackhi_ps(u[2], u[3]));
    return _mm512_mul_ps(scale, _mm512_add_ps(_mm512_shuffle_ps(v0, v1, 0x44), _mm512_shuffle_ps(v0, v1, 0xEE)));
}

/* The dot-product form for a few query rows (decoding): each key row is streamed once
 * along Dk, in its natural layout, against NR query rows held in L1; KC keys at a time,
 * each (row, key) sum reduced across its lanes at the end. Cheaper than padding the rows
 * to a vector of 16 when there are at most 4 of them, and kinder to the prefetchers. */
INLINE void qk_dot_tile(int NR, int KC, int64_t dk, const float *q, const float *k, int64_t ldk,
                        float scale, float *s, int64_t lds) {
    __m512 acc[4][4];
    UNROLL for (int r = 0; r < NR; r++)
        UNROLL for (int c = 0; c < KC; c++) acc[r][c] = _mm512_setzero_ps();
    for (int64_t d = 0; d < dk; d += 16) {
        const __mmask16 mk = dk - d >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (dk - d)) - 1);
        __m512 kv[4];
        UNROLL for (int c = 0; c < KC; c++) kv[c] = _mm512_maskz_loadu_ps(mk, k + c * ldk + d);
        UNROLL for (int r = 0; r < NR; r++) {
            const __m512 qv = _mm512_maskz_loadu_ps(mk, q + r * dk + d);
            UNROLL for (int c = 0; c < KC; c++) acc[r][c] = _mm512_fmadd_ps(qv, kv[c], acc[r][c]);
        }
    }
    if (NR == 4 && KC == 4) {
        const __m512 w = lane_sums_4x4(acc, _mm512_set1_ps(scale));  // lane 4c + r
        _mm_storeu_ps(s, _mm512_castps512_ps128(w));
        _mm_storeu_ps(s + lds, _mm512_extractf32x4_ps(w, 1));
        _mm_storeu_ps(s + 2 * lds, _mm512_extractf32x4_ps(w, 2));
        _mm_storeu_ps(s + 3 * lds, _mm512_extractf32x4_ps(w, 3));
        return;
    }
    UNROLL for (int c = 0; c < KC; c++)
        UNROLL for (int r = 0; r < NR; r++) s[c * lds + r] = scale * _mm512_reduce_add_ps(acc[r][c]);
}

#define QK_DOT(NR)                                                                          \
    static void qk_dot_rows##NR(int64_t nk, int64_t dk, const float *q, const float *k,     \
                                int64_t ldk, float scale, float *s, int64_t lds) {         \
        int64_t c = 0;                                                                      \
        for (; c + 4 <= nk; c += 4) qk_dot_tile(NR, 4, dk, q, k + c * ldk, ldk, scale, s + c * lds, lds); \
        for (; c < nk; c++) qk_dot_tile(NR, 1, dk, q, k + c * ldk, ldk, scale, s + c * lds, lds); \
    }
QK_DOT(1)
QK_DOT(2)
QK_DOT(3)
QK_DOT(4)

void ai_qk_avx512(int64_t n, int64_t npad, int64_t nk, int64_t dk, const float *q,
                      const float *qt, int64_t ldq, const float *k, int64_t ldk, float scale,
                      float *s, int64_t lds) {
    if (n <= ATTN_DECODE_MAX_ROWS) {
        /* decoding blocks (their boundary and masked tiles) by the dot-product form */
        static attn_qk_rows_fn *const rows[5] = {NULL, qk_dot_rows1, qk_dot_rows2, qk_dot_rows3, qk_dot_rows4};
        attn_qk_dot_block(rows, n, npad, nk, dk, q, k, ldk, scale, s, lds);
        return;
    }
    const __m512 vs = _mm512_set1_ps(scale);
    int64_t a = 0;
    for (; a + 4 <= npad / 16; a += 4) qk_rows4(nk, dk, qt + 16 * a, ldq, k, ldk, vs, s + 16 * a, lds);
    switch (npad / 16 - a) {
    case 3: qk_rows3(nk, dk, qt + 16 * a, ldq, k, ldk, vs, s + 16 * a, lds); break;
    case 2: qk_rows2(nk, dk, qt + 16 * a, ldq, k, ldk, vs, s + 16 * a, lds); break;
    case 1: qk_rows1(nk, dk, qt + 16 * a, ldq, k, ldk, vs, s + 16 * a, lds); break;
    default: break;
    }
}

void ai_softmax_avx512(int64_t npad, int64_t nk, float *s, int64_t lds, float *m, float *l,
                           float *alpha) {
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t r = 0; r < npad; r += 16) {
        const __m512 m_old = _mm512_loadu_ps(m + r);
        __m512 shift;
        const __m512 mx = softmax_max_avx512(s + r, lds, nk, m_old, &shift);
        __m512 sum = zero;
        for (int64_t c = 0; c < nk; c++) {
            const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(s + c * lds + r), shift));
            _mm512_storeu_ps(s + c * lds + r, e);
            sum = _mm512_add_ps(sum, e);
        }
        softmax_store_avx512(m_old, shift, mx, sum, m + r, l + r, alpha + r);
    }
}

/* 16 elements of row `row` from column d, as float32; DT is a compile-time constant. A
 * block dtype's d is a multiple of 16 and its rows whole blocks (mk all ones): the 16
 * values of half a block, exact, times the block's float16 scale (exact: an 11-bit
 * significand times at most 8 bits), as avx2/decode.c's load_row. An fp8 byte through
 * float16 as there: e5m2 is a float16's top byte; e4m3 shifted right one (sign kept in
 * bit 15, bit 14 cleared) is sign | (x & 0x7F) << 7, the float16 of x / 2^8 (returned
 * so: load_kv's scale has the 2^8), its NaN codes given float16's top exponent bit
 * first; all exact. */
INLINE __m512 load_row(int DT, const void *row, int64_t d, __mmask16 mk) {
    if (DT == ATTN_F32)
        return mk == 0xFFFF ? _mm512_loadu_ps((const float *)row + d)
                            : _mm512_maskz_loadu_ps(mk, (const float *)row + d);
    if (DT == ATTN_Q8_0 || DT == ATTN_Q4_0) {
        const int64_t bytes = DT == ATTN_Q8_0 ? ATTN_Q8_0_BYTES : ATTN_Q4_0_BYTES;
        const uint8_t *b = (const uint8_t *)row + d / 32 * bytes;
        const __m512 sc = _mm512_cvtph_ps(_mm256_set1_epi16((short)(b[0] | b[1] << 8)));
        __m128i x;
        if (DT == ATTN_Q8_0) {
            x = _mm_loadu_si128((const __m128i *)(b + 2 + d % 32));
        } else {  // element i < 16 the low nibble of byte i, i + 16 its high one; minus 8
            const __m128i qs = _mm_loadu_si128((const __m128i *)(b + 2));
            x = _mm_and_si128(d % 32 ? _mm_srli_epi16(qs, 4) : qs, _mm_set1_epi8(0x0F));
            x = _mm_sub_epi8(x, _mm_set1_epi8(8));
        }
        return _mm512_mul_ps(sc, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(x)));
    }
    if (DT == ATTN_FP8_E4M3 || DT == ATTN_FP8_E5M2) {
        /* byte i into the top of 16-bit lane i by one in-lane shuffle of the 16 bytes in
         * both 128-bit halves (a broadcast load; under a mask, loaded then broadcast):
         * for e5m2 that is its float16, exact */
        const __m256i top = _mm256_setr_epi8(-1, 0, -1, 1, -1, 2, -1, 3, -1, 4, -1, 5, -1, 6, -1, 7,
                                             -1, 8, -1, 9, -1, 10, -1, 11, -1, 12, -1, 13, -1, 14, -1, 15);
        const uint8_t *src = (const uint8_t *)row + d;
        const __m256i b = _mm256_broadcastsi128_si256(mk == (__mmask16)0xFFFF ? _mm_loadu_si128((const __m128i *)src)
                                                                              : _mm_maskz_loadu_epi8(mk, src));
        const __m128i x = _mm256_castsi256_si128(b);
        const __m256i w = _mm256_shuffle_epi8(b, top);
        if (DT == ATTN_FP8_E5M2) return _mm512_cvtph_ps(w);
        /* e4m3: shifted right one, bit 14 (a copy of the sign) cleared, the float16
         * sign | (x & 0x7F) << 7 of x / 2^8; the NaN codes (x | 0x80 = 0xFF, found on the
         * bytes) get float16's top exponent bit, 0x4000, added under their mask (bit 14
         * is clear: + is |). load_kv's scale has the 2^8. */
        const __m256i h = _mm256_and_si256(_mm256_srai_epi16(w, 1), _mm256_set1_epi16((short)0xBFFF));
        const __mmask16 nan = _mm_cmpeq_epi8_mask(_mm_or_si128(x, _mm_set1_epi8((char)0x80)),
                                                  _mm_set1_epi8((char)0xFF));
        return _mm512_cvtph_ps(_mm256_mask_add_epi16(h, nan, h, _mm256_set1_epi16(0x4000)));
    }
    const __m256i h = _mm256_maskz_loadu_epi16(mk, (const uint16_t *)row + d);
    if (DT == ATTN_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

/* load_row on a K or V row: an fp8 value times its head's scale (k_scale or v_scale, 1
 * where none is given), one rounding, kv_block's fl32(value · scale); the other dtypes as
 * load_row. sc is kv_sc's: for e4m3, whose load_row gives x / 2^8, the scale times 2^8
 * (exact: fused_takes_decode sends the step no scale that would overflow), so x / 2^8 ·
 * (2^8 · scale) is the exact product x · scale rounded once, as a second multiply would
 * give it. */
INLINE __m512 kv_sc(int DT, float scale) {
    return _mm512_set1_ps(DT == ATTN_FP8_E4M3 ? 256.0f * scale : scale);
}

#define IS_FP8(DT) ((DT) == ATTN_FP8_E4M3 || (DT) == ATTN_FP8_E5M2)

INLINE __m512 load_kv(int DT, const void *row, int64_t d, __mmask16 mk, __m512 sc) {
    const __m512 x = load_row(DT, row, d, mk);
    return IS_FP8(DT) ? _mm512_mul_ps(x, sc) : x;
}


/* A block dtype's (q8_0, q4_0) 32 values of row `row` from column d (a multiple of 32),
 * as load_row gives them, in two vectors: the block's float16 scale converted once */
INLINE void load_block(int DT, const void *row, int64_t d, __m512 *lo, __m512 *hi) {
    const int64_t bytes = DT == ATTN_Q8_0 ? ATTN_Q8_0_BYTES : ATTN_Q4_0_BYTES;
    const uint8_t *b = (const uint8_t *)row + d / 32 * bytes;
    const __m512 sc = _mm512_cvtph_ps(_mm256_set1_epi16((short)(b[0] | b[1] << 8)));
    __m128i x0, x1;
    if (DT == ATTN_Q8_0) {
        x0 = _mm_loadu_si128((const __m128i *)(b + 2));
        x1 = _mm_loadu_si128((const __m128i *)(b + 18));
    } else {
        const __m128i qs = _mm_loadu_si128((const __m128i *)(b + 2)), lo4 = _mm_set1_epi8(0x0F);
        x0 = _mm_sub_epi8(_mm_and_si128(qs, lo4), _mm_set1_epi8(8));
        x1 = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(qs, 4), lo4), _mm_set1_epi8(8));
    }
    *lo = _mm512_mul_ps(sc, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(x0)));
    *hi = _mm512_mul_ps(sc, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(x1)));
}

#define IS_BLOCK(DT) ((DT) == ATTN_Q8_0 || (DT) == ATTN_Q4_0)

/* line i of the V rows c..c+3 (those that exist; at pf->v_rows[c] where given) */
INLINE void pf_v_line(const attn_decode_pf *pf, int64_t c, int64_t i) {
    if (!pf->v || i >= pf->lines_v) return;
    const int64_t rows = pf->nv - c < 4 ? pf->nv - c : 4;
    for (int64_t r = 0; r < rows; r++)
        _mm_prefetch((pf->v_rows ? pf->v_rows[c + r] : pf->v + (c + r) * pf->ldv) + 64 * i, _MM_HINT_T2);
}

/* lines [i0, i1) of the next tile's K row c, if it has one */
INLINE void pf_k_lines(const attn_decode_pf *pf, int64_t c, int64_t i0, int64_t i1) {
    if (!pf || !pf->k || c >= pf->nk) return;
    const char *row = pf->k_rows ? pf->k_rows[c] : pf->k + c * pf->ldk;
    for (int64_t i = i0; i < i1; i++) _mm_prefetch(row + 64 * i, _MM_HINT_T2);
}

/* RR rows x DC zmm of value columns (V's rows of dtype DT, ldv bytes apart, or at
 * vrows[c] + voff where vrows is given; an fp8 V's values times vsc where VMUL, else
 * taken as load_row gives them: the scale is then on p, attn_fp8_factor_folds); the
 * last zmm loads and stores under `tail`. acc = acc * alpha + sum_c p[c][i] V[c], the tile's
 * sum from zero. SKIP: a p of exactly 0 leaves the accumulator untouched. pf (decoding,
 * else NULL): lines [i0, i1) of the next tile's K row c are asked for with key c. */
INLINE void pv_tile(int DT, int RR, int DC, bool SKIP, bool VMUL, int64_t nk, const float *p,
                    int64_t lds, const char *v, int64_t ldv, const char *const *vrows,
                    int64_t voff, __m512 vsc, const float *alpha, float *acc, int64_t ldo,
                    __mmask16 tail, const attn_decode_pf *pf, int64_t i0, int64_t i1) {
    __m512 t[4][4];
    UNROLL for (int i = 0; i < RR; i++)
        UNROLL for (int j = 0; j < DC; j++) t[i][j] = _mm512_setzero_ps();
    for (int64_t c = 0; c < nk; c++) {
        __m512 vv[4];
        const char *row = vrows ? vrows[c] + voff : v + c * ldv;
        if (IS_BLOCK(DT)) {  // whole blocks (Dv a multiple of 32): DC even, tail all ones
            UNROLL for (int j = 0; j + 1 < DC; j += 2) load_block(DT, row, 16 * j, &vv[j], &vv[j + 1]);
            if (DC % 2) vv[DC - 1] = load_kv(DT, row, 16 * (DC - 1), tail, vsc);
        } else {
            UNROLL for (int j = 0; j < DC; j++) {
                const __mmask16 mk = j == DC - 1 ? tail : (__mmask16)0xFFFF;
                vv[j] = VMUL ? load_kv(DT, row, 16 * j, mk, vsc) : load_row(DT, row, 16 * j, mk);
            }
        }
        pf_k_lines(pf, c, i0, i1);
        UNROLL for (int i = 0; i < RR; i++) {
            const __m512 pb = _mm512_set1_ps(p[c * lds + i]);
            if (SKIP) {
                const __mmask16 live = _mm512_cmp_ps_mask(pb, _mm512_setzero_ps(), _CMP_NEQ_UQ);
                UNROLL for (int j = 0; j < DC; j++)
                    t[i][j] = _mm512_mask3_fmadd_ps(pb, vv[j], t[i][j], live);
            } else {
                UNROLL for (int j = 0; j < DC; j++) t[i][j] = _mm512_fmadd_ps(pb, vv[j], t[i][j]);
            }
        }
    }
    UNROLL for (int i = 0; i < RR; i++) {
        const __m512 a = _mm512_set1_ps(alpha[i]);
        UNROLL for (int j = 0; j < DC; j++) {
            float *o = acc + i * ldo + 16 * j;
            const __mmask16 mk = j == DC - 1 ? tail : (__mmask16)0xFFFF;
            _mm512_mask_storeu_ps(o, mk, _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, o), a, t[i][j]));
        }
    }
}

/* nd (1..64) value columns as *dc zmm: the mask of the last one's columns */
INLINE __mmask16 column_chunks(int64_t nd, int *dc) {
    *dc = (int)((nd + 15) / 16);
    const int rem = (int)(nd - 16 * (*dc - 1));
    return (__mmask16)(rem == 16 ? 0xFFFF : (1u << rem) - 1);
}

/* all rows for one chunk of at most 64 value columns */
#define PV_COLS(DC)                                                                         \
    static void pv_cols##DC(int64_t n, int64_t nk, const float *p, int64_t lds,           \
                            const float *v, int64_t ldv, const float *alpha, float *acc,   \
                            int64_t ldo, __mmask16 tail, bool skip) {                      \
        int64_t r = 0;                                                                      \
        if (skip) {                                                                         \
            for (; r + 4 <= n; r += 4)                                                      \
                pv_tile(ATTN_F32, 4, DC, true, true, nk, p + r, lds, (const char *)v, 4 * ldv, NULL, 0, _mm512_set1_ps(1.0f), alpha + r, acc + r * ldo, ldo, tail, NULL, 0, 0); \
            for (; r < n; r++)                                                              \
                pv_tile(ATTN_F32, 1, DC, true, true, nk, p + r, lds, (const char *)v, 4 * ldv, NULL, 0, _mm512_set1_ps(1.0f), alpha + r, acc + r * ldo, ldo, tail, NULL, 0, 0); \
        } else {                                                                            \
            for (; r + 4 <= n; r += 4)                                                      \
                pv_tile(ATTN_F32, 4, DC, false, true, nk, p + r, lds, (const char *)v, 4 * ldv, NULL, 0, _mm512_set1_ps(1.0f), alpha + r, acc + r * ldo, ldo, tail, NULL, 0, 0); \
            for (; r < n; r++)                                                              \
                pv_tile(ATTN_F32, 1, DC, false, true, nk, p + r, lds, (const char *)v, 4 * ldv, NULL, 0, _mm512_set1_ps(1.0f), alpha + r, acc + r * ldo, ldo, tail, NULL, 0, 0); \
        }                                                                                   \
    }
PV_COLS(1)
PV_COLS(2)
PV_COLS(3)
PV_COLS(4)

void ai_pv_avx512(int64_t n, int64_t npad, int64_t nk, int64_t dv, const float *p,
                      int64_t lds, const float *v, int64_t ldv, const float *alpha,
                      float *acc, int64_t ldo, bool skip_zeros) {
    (void)npad;
    for (int64_t d0 = 0; d0 < dv; d0 += 64) {
        const int64_t nd = dv - d0 < 64 ? dv - d0 : 64;
        int dc;
        const __mmask16 tail = column_chunks(nd, &dc);
        switch (dc) {
        case 4: pv_cols4(n, nk, p, lds, v + d0, ldv, alpha, acc + d0, ldo, tail, skip_zeros); break;
        case 3: pv_cols3(n, nk, p, lds, v + d0, ldv, alpha, acc + d0, ldo, tail, skip_zeros); break;
        case 2: pv_cols2(n, nk, p, lds, v + d0, ldv, alpha, acc + d0, ldo, tail, skip_zeros); break;
        default: pv_cols1(n, nk, p, lds, v + d0, ldv, alpha, acc + d0, ldo, tail, skip_zeros); break;
        }
    }
}

/* ---- decoding: the whole step of one clean tile for at most 4 query rows ------------------
 *
 * K and V are read once from the caller's rows (float32, or float16/bfloat16 converted in
 * registers), four keys at a time for Q·Kᵀ, and the logits stay in one compact layout,
 * lane 4c + r for key c and row r of a group of 4 keys, so the softmax works on 4x fewer
 * vectors than the 16-row tile. While a group of keys is multiplied, the V rows of the
 * same keys are prefetched, line by line, spread over the arithmetic rather than issued
 * in one burst (a burst stalls on the miss queue); while P·V runs over a key, the same
 * key's row of the next tile's K (attn_decode_pf). */

/* bfloat16 rows as float32 by halves: 32 values in one load; the even ones are the
 * 32-bit lanes shifted left by 16, the odd ones the lanes with the low half cleared. Two
 * operations for 32 values where widening takes four; P·V keeps its accumulators in the
 * same even/odd order and puts them back once a tile; Q·Kᵀ splits the query rows the same
 * way instead (dec_qk4_halves). */
INLINE void bf16_halves(const uint16_t *row, int64_t d, __mmask32 mk, __m512 *even, __m512 *odd) {
    const __m512i raw = _mm512_maskz_loadu_epi16(mk, row + d);
    *even = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
    *odd = _mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32((int)0xFFFF0000u)));
}

INLINE __mmask32 mask32(int64_t left) {
    return left >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << left) - 1);
}

/* logits of NR rows x 4 keys (keys c..c+3 at kr[0..3]): lanes 4c + r, scaled; the
 * FMAs and the tree of qk_dot_tile, on keys converted to float32 in registers (an fp8
 * K's values times ksc, load_kv, where KMUL; else q is the rows times ksc,
 * attn_fp8_factor_folds: each cached vector's multiply gone) */
INLINE __m512 dec_qk4(int DT, bool KMUL, int NR, int64_t dk, const float *q, int64_t ldq,
                      const char *const kr[4], __m512 scale, __m512 ksc,
                      const attn_decode_pf *pf, int64_t c) {
    __m512 acc[4][4];
    UNROLL for (int r = 0; r < 4; r++)
        UNROLL for (int j = 0; j < 4; j++) acc[r][j] = _mm512_setzero_ps();
    if (IS_BLOCK(DT)) {  // dk a multiple of 32: a block's two halves in turn, as below
        for (int64_t d = 0; d < dk; d += 32) {
            __m512 klo[4], khi[4];
            UNROLL for (int j = 0; j < 4; j++) load_block(DT, kr[j], d, &klo[j], &khi[j]);
            pf_v_line(pf, c, d / 16);
            pf_v_line(pf, c, d / 16 + 1);
            UNROLL for (int r = 0; r < NR; r++) {
                const __m512 q0 = _mm512_loadu_ps(q + r * ldq + d), q1 = _mm512_loadu_ps(q + r * ldq + d + 16);
                UNROLL for (int j = 0; j < 4; j++)
                    acc[r][j] = _mm512_fmadd_ps(q1, khi[j], _mm512_fmadd_ps(q0, klo[j], acc[r][j]));
            }
        }
        for (int64_t i = dk / 16; i < pf->lines_v; i++) pf_v_line(pf, c, i);
        return lane_sums_4x4(acc, scale);
    }
    for (int64_t d = 0; d < dk; d += 16) {
        const __mmask16 mk = dk - d >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (dk - d)) - 1);
        __m512 kv[4];
        UNROLL for (int j = 0; j < 4; j++)
            kv[j] = KMUL ? load_kv(DT, kr[j], d, mk, ksc) : load_row(DT, kr[j], d, mk);
        pf_v_line(pf, c, d / 16);
        UNROLL for (int r = 0; r < NR; r++) {
            const __m512 qv = _mm512_maskz_loadu_ps(mk, q + r * ldq + d);
            UNROLL for (int j = 0; j < 4; j++) acc[r][j] = _mm512_fmadd_ps(qv, kv[j], acc[r][j]);
        }
    }
    for (int64_t i = (dk + 15) / 16; i < pf->lines_v; i++) pf_v_line(pf, c, i);
    return lane_sums_4x4(acc, scale);  // 128-bit lane j: rows 0..3 of key j
}

/* dec_qk4 on a bfloat16 K by halves (Dk a multiple of 32, at most DEC_HALVES_MAX_DK):
 * the query rows come split into their even and odd columns (qh, per 32 columns: the 16
 * even ones, then the 16 odd ones), so one load of a key's 32 values gives two float32
 * vectors by a shift and an and (bf16_halves) where widening takes twice the operations.
 * Its sums run in another order than qk's on converted keys: the weights' sweep takes
 * its logits from decode_qk, this same code, not from qk (kernels.h). */
enum { DEC_HALVES_MAX_DK = 256 };

INLINE __m512 dec_qk4_halves(int NR, int64_t dk, const float *qh, const char *const kr[4],
                             __m512 scale, const attn_decode_pf *pf, int64_t c) {
    __m512 acc[4][4];
    UNROLL for (int r = 0; r < 4; r++)
        UNROLL for (int j = 0; j < 4; j++) acc[r][j] = _mm512_setzero_ps();
    for (int64_t d = 0; d < dk; d += 32) {
        __m512 ke[4], ko[4];
        UNROLL for (int j = 0; j < 4; j++)
            bf16_halves((const uint16_t *)kr[j], d, (__mmask32)0xFFFFFFFFu, &ke[j], &ko[j]);
        pf_v_line(pf, c, d / 32);
        UNROLL for (int r = 0; r < NR; r++) {
            const __m512 qe = _mm512_loadu_ps(qh + r * dk + d), qo = _mm512_loadu_ps(qh + r * dk + d + 16);
            UNROLL for (int j = 0; j < 4; j++)
                acc[r][j] = _mm512_fmadd_ps(qo, ko[j], _mm512_fmadd_ps(qe, ke[j], acc[r][j]));
        }
    }
    for (int64_t i = dk / 32; i < pf->lines_v; i++) pf_v_line(pf, c, i);
    return lane_sums_4x4(acc, scale);
}

/* the rows q (NR x dk, dk a multiple of 32) with each 32 columns as 16 even, 16 odd */
INLINE void split_halves(int NR, int64_t dk, const float *q, float *qh) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    for (int r = 0; r < NR; r++)
        for (int64_t d = 0; d < dk; d += 32) {
            const __m512 a = _mm512_loadu_ps(q + r * dk + d), b = _mm512_loadu_ps(q + r * dk + d + 16);
            _mm512_storeu_ps(qh + r * dk + d, _mm512_permutex2var_ps(a, even, b));
            _mm512_storeu_ps(qh + r * dk + d + 16, _mm512_permutex2var_ps(a, odd, b));
        }
}

/* the max (or sum) of each row over the 4 key lanes of a compact vector, in every
 * 128-bit lane */
INLINE __m512 rows_max(__m512 x) {
    x = _mm512_max_ps(x, _mm512_shuffle_f32x4(x, x, 0x4E));
    return _mm512_max_ps(x, _mm512_shuffle_f32x4(x, x, 0xB1));
}
INLINE __m512 rows_sum(__m512 x) {
    x = _mm512_add_ps(x, _mm512_shuffle_f32x4(x, x, 0x4E));
    return _mm512_add_ps(x, _mm512_shuffle_f32x4(x, x, 0xB1));
}

/* The next tile's K lines asked for during the P·V pass over value columns d0..d0+63:
 * its share [i0, i1) of each row's lines, the passes (64 columns each) in turn. */
INLINE void pass_lines(const attn_decode_pf *pf, int64_t d0, int64_t dv, int64_t *i0, int64_t *i1) {
    const int64_t passes = (dv + 63) / 64, p = d0 / 64;
    *i0 = p * pf->lines_k / passes;
    *i1 = (p + 1) * pf->lines_k / passes;
}

/* acc rows r0..r0+RR-1, value columns d0.. in DC zmm (the last under `tail`), from the
 * compact probabilities (key c of row r at s[4c + r]); pf as in pv_tile */
INLINE void dec_pv(int DT, bool VMUL, int RR, int DC, int64_t nk, const float *s, int r0, const char *v,
                   int64_t ldv, const char *const *vrows, __m512 vsc, int64_t d0,
                   const float *alpha, float *acc, int64_t dv, __mmask16 tail,
                   const attn_decode_pf *pf) {
    int64_t i0, i1;
    pass_lines(pf, d0, dv, &i0, &i1);
    /* a block dtype's d0 (a multiple of 64) starts a block */
    const int64_t off = attn_row_byte_offset((attn_dtype)DT, d0);
    pv_tile(DT, RR, DC, false, VMUL, nk, s + r0, 4, v + off, ldv, vrows, off, vsc, alpha + r0,
            acc + r0 * dv + d0, dv, tail, pf, i0, i1);
}

/* dec_pv for bfloat16 V by halves: NC chunks of 32 columns from d0 (nd columns in all,
 * at most 64); the tile's sums of the even and odd columns are put back in order once,
 * before they meet the accumulator. */
INLINE void dec_pv_bf16(int RR, int NC, int64_t nk, const float *s, int r0, const char *v,
                        int64_t ldv, const char *const *vrows, int64_t d0, int64_t nd, const float *alpha, float *acc,
                        int64_t dv, const attn_decode_pf *pf) {
    int64_t i0, i1;
    pass_lines(pf, d0, dv, &i0, &i1);
    __m512 t[4][4];
    UNROLL for (int i = 0; i < RR; i++)
        UNROLL for (int j = 0; j < 2 * NC; j++) t[i][j] = _mm512_setzero_ps();
    __mmask32 mk[2];
    UNROLL for (int h = 0; h < NC; h++) mk[h] = mask32(nd - 32 * h);
    for (int64_t c = 0; c < nk; c++) {
        __m512 vv[4];
        UNROLL for (int h = 0; h < NC; h++)
            bf16_halves((const uint16_t *)(vrows ? vrows[c] : v + c * ldv), d0 + 32 * h, mk[h],
                        &vv[2 * h], &vv[2 * h + 1]);
        pf_k_lines(pf, c, i0, i1);
        UNROLL for (int i = 0; i < RR; i++) {
            const __m512 pb = _mm512_set1_ps(s[4 * c + r0 + i]);
            UNROLL for (int j = 0; j < 2 * NC; j++) t[i][j] = _mm512_fmadd_ps(pb, vv[j], t[i][j]);
        }
    }
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    UNROLL for (int i = 0; i < RR; i++) {
        const __m512 a = _mm512_set1_ps(alpha[r0 + i]);
        UNROLL for (int h = 0; h < NC; h++) {
            const __m512 part[2] = {_mm512_permutex2var_ps(t[i][2 * h], lo, t[i][2 * h + 1]),
                                    _mm512_permutex2var_ps(t[i][2 * h], hi, t[i][2 * h + 1])};
            UNROLL for (int x = 0; x < 2; x++) {
                const int64_t col = 32 * h + 16 * x, left = nd - col;
                if (left <= 0) break;
                const __mmask16 m16 = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
                float *o = acc + (r0 + i) * dv + d0 + col;
                _mm512_mask_storeu_ps(o, m16, _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m16, o), a, part[x]));
            }
        }
    }
}

/* P V over rows 0..n-1 in groups of RR rows, columns in chunks of DC zmm */
#define DEC_PV_ROWS(DT, VMUL, DC, RR)                                                        \
    for (int r0 = 0; r0 < n; r0 += RR) {                                                          \
        if (n - r0 >= RR) dec_pv(DT, VMUL, RR, DC, nk, s, r0, v, ldv, vrows, vsc, d0, alpha, acc, dv, tail, pf);   \
        else if (n - r0 == 3) dec_pv(DT, VMUL, 3, DC, nk, s, r0, v, ldv, vrows, vsc, d0, alpha, acc, dv, tail, pf);\
        else if (n - r0 == 2) dec_pv(DT, VMUL, 2, DC, nk, s, r0, v, ldv, vrows, vsc, d0, alpha, acc, dv, tail, pf);\
        else dec_pv(DT, VMUL, 1, DC, nk, s, r0, v, ldv, vrows, vsc, d0, alpha, acc, dv, tail, pf);                 \
    }

/* P V over every value column, 64 a pass */
#define DEC_PV_ALL(DT, VMUL)                                                                 \
    for (int64_t d0 = 0; d0 < dv; d0 += 64) {                                                \
        const int64_t nd = dv - d0 < 64 ? dv - d0 : 64;                                      \
        int dc;                                                                              \
        const __mmask16 tail = column_chunks(nd, &dc);                                       \
        switch (dc) {                                                                        \
        case 4: DEC_PV_ROWS(DT, VMUL, 4, 4) break;                                           \
        case 3: DEC_PV_ROWS(DT, VMUL, 3, 4) break;                                           \
        case 2: DEC_PV_ROWS(DT, VMUL, 2, 4) break;                                           \
        default: DEC_PV_ROWS(DT, VMUL, 1, 4) break;                                          \
        }                                                                                    \
    }

/* x rounded to the nearest bfloat16, ties to even, as attn_f32_to_bf16 (half.h) rounds
 * it: NaN stays NaN (quiet), the rest by adding 0x7FFF plus the kept lowest bit. */
INLINE __m512 round_bf16(__m512 x) {
    const __m512i b = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_and_si512(_mm512_add_epi32(b, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))),
                                       _mm512_set1_epi32((int)0xFFFF0000u));
    const __m512i quiet = _mm512_and_si512(_mm512_or_si512(b, _mm512_set1_epi32(0x00400000)),
                                           _mm512_set1_epi32((int)0xFFFF0000u));
    return _mm512_castsi512_ps(_mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), quiet));
}

/* The tile's logits for NR rows, 4 keys a vector (lane 4c + r; the lanes of keys past nk
 * -inf) into s; *mx gets their lane-wise max, *nan the lanes that saw a NaN. Key c at
 * k + c * ldk, or at rows[c] where rows is given (decode_rows); an fp8 K's
 * values times k_scale. The one Q·Kᵀ of the decoding step, for decode and for decode_qk
 * alike. */
INLINE void dec_logits(int DT, int NR, int64_t nk, int64_t dk, const float *q, const char *k,
                       int64_t ldk, const char *const *rows, float scale, float k_scale,
                       float *s, const attn_decode_pf *pf, __m512 *mx, __mmask16 *nan) {
    const __m512 vscale = _mm512_set1_ps(scale), ksc = kv_sc(DT, k_scale);
    const int64_t nv = (nk + 3) / 4;
    const bool halves = DT == ATTN_BF16 && dk % 32 == 0 && dk <= DEC_HALVES_MAX_DK;
    float qh[4 * DEC_HALVES_MAX_DK];
    if (halves) split_halves(NR, dk, q, qh);
    /* an fp8 K's scale on the query instead where that is exact (attn_fp8_fold_query) */
    const float ks = _mm512_cvtss_f32(ksc);
    const float *qk = IS_FP8(DT) && attn_fp8_factor_folds(ks) && dk <= DEC_HALVES_MAX_DK
                          ? attn_fp8_fold_query(NR * dk, q, ks, qh) : NULL;
    *mx = _mm512_set1_ps(-INFINITY);
    *nan = 0;
    for (int64_t x = 0; x < nv; x++) {
        /* the tile's last keys (nk % 4 of them) in a group of 4 too, the last one repeated
         * and its copies' lanes -inf: each key's logit is the same sum wherever it falls,
         * so a tile read in segments (pages, the weights' sweep) has the whole tile's bits */
        const int64_t c = 4 * x, live = nk - c < 4 ? nk - c : 4;
        const char *kr[4];
        UNROLL for (int j = 0; j < 4; j++) {
            const int64_t key = c + (j < live ? j : live - 1);
            kr[j] = rows ? rows[key] : k + key * ldk;
        }
        __m512 z = halves ? dec_qk4_halves(NR, dk, qh, kr, vscale, pf, c)
                   : qk   ? dec_qk4(DT, false, NR, dk, qk, dk, kr, vscale, ksc, pf, c)
                          : dec_qk4(DT, true, NR, dk, q, dk, kr, vscale, ksc, pf, c);
        if (live < 4) z = _mm512_mask_mov_ps(z, (__mmask16)(0xFFFFu << (4 * live)), _mm512_set1_ps(-INFINITY));
        _mm512_storeu_ps(s + 16 * x, z);
        *mx = _mm512_max_ps(*mx, z);
        *nan |= _mm512_cmp_ps_mask(z, z, _CMP_UNORD_Q);
    }
}

INLINE void decode_tile(int DT, int NR, bool round_p, int64_t n, int64_t nk, int64_t dk, int64_t dv,
                        const float *q, const char *k, int64_t ldk, const char *v, int64_t ldv,
                        const char *const *k_rows, const char *const *vrows, float scale,
                        float k_scale, float v_scale, float *s, float *m, float *l,
                        float *alpha, float *acc, const attn_decode_pf *pf) {
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
    const int64_t nv = (nk + 3) / 4;
    __m512 mx;
    __mmask16 nan;
    dec_logits(DT, NR, nk, dk, q, k, ldk, k_rows, scale, k_scale, s, pf, &mx, &nan);
    /* the online-softmax update of ai_softmax_avx512, on the compact layout */
    const __m512 m_old = _mm512_broadcast_f32x4(_mm_loadu_ps(m));
    nan |= _mm512_cmp_ps_mask(m_old, m_old, _CMP_UNORD_Q);
    nan = (__mmask16)(((nan | nan >> 4 | nan >> 8 | nan >> 12) & 0xF) * 0x1111u);
    __m512 m_new = _mm512_max_ps(m_old, rows_max(mx));
    m_new = _mm512_mask_mov_ps(m_new, nan, _mm512_set1_ps(NAN));
    const __m512 shift = _mm512_mask_mov_ps(m_new, _mm512_cmp_ps_mask(m_new, neg_inf, _CMP_EQ_OQ),
                                            _mm512_setzero_ps());
    __m512 sum = _mm512_setzero_ps();
    /* an fp8 V's scale on p instead (attn_fp8_factor_folds), the sum l of the unscaled p */
    const __m512 vsc = kv_sc(DT, v_scale);
    const bool vfold = IS_FP8(DT) && attn_fp8_factor_folds(_mm512_cvtss_f32(vsc));
    const __m512 pmul = vfold ? vsc : _mm512_set1_ps(1.0f);
    for (int64_t x = 0; x < nv; x++) {
        const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(s + 16 * x), shift));
        /* FAST precision: P rounded to bfloat16 for P V, the sum l of the float32 p */
        const __m512 p = round_p ? round_bf16(e) : e;
        _mm512_storeu_ps(s + 16 * x, IS_FP8(DT) ? _mm512_mul_ps(p, pmul) : p);
        sum = _mm512_add_ps(sum, e);
    }
    const __m512 a = exp_avx512(_mm512_sub_ps(m_old, shift));
    const __m128 l_new = _mm_fmadd_ps(_mm_loadu_ps(l), _mm512_castps512_ps128(a),
                                      _mm512_castps512_ps128(rows_sum(sum)));
    _mm_storeu_ps(alpha, _mm512_castps512_ps128(a));
    _mm_storeu_ps(l, l_new);
    _mm_storeu_ps(m, _mm512_castps512_ps128(m_new));
    /* P V: up to 64 value columns a pass, 4 zmm x 4 rows */
    if (DT == ATTN_BF16) {
        for (int64_t d0 = 0; d0 < dv; d0 += 64) {
            const int64_t nd = dv - d0 < 64 ? dv - d0 : 64;
            for (int r0 = 0; r0 < n; r0 += 4) {
                const int rr = n - r0 < 4 ? (int)(n - r0) : 4;
#define PV_BF16(RR) (nd > 32 ? dec_pv_bf16(RR, 2, nk, s, r0, v, ldv, vrows, d0, nd, alpha, acc, dv, pf) \
                             : dec_pv_bf16(RR, 1, nk, s, r0, v, ldv, vrows, d0, nd, alpha, acc, dv, pf))
                switch (rr) {
                case 4: PV_BF16(4); break;
                case 3: PV_BF16(3); break;
                case 2: PV_BF16(2); break;
                default: PV_BF16(1); break;
                }
#undef PV_BF16
            }
        }
        return;
    }
    if (IS_FP8(DT) && vfold) DEC_PV_ALL(DT, false)
    else DEC_PV_ALL(DT, true)
}

#define DECODE_DT(DT)                                                                           \
    switch (n) {                                                                                \
    case 1: decode_tile(DT, 1, round_p, n, nk, dk, dv, q, kb, ldkb, vb, ldvb, kr, vr, scale, k_scale, v_scale, s, m, l, alpha, acc, &pf); break; \
    case 2: decode_tile(DT, 2, round_p, n, nk, dk, dv, q, kb, ldkb, vb, ldvb, kr, vr, scale, k_scale, v_scale, s, m, l, alpha, acc, &pf); break; \
    case 3: decode_tile(DT, 3, round_p, n, nk, dk, dv, q, kb, ldkb, vb, ldvb, kr, vr, scale, k_scale, v_scale, s, m, l, alpha, acc, &pf); break; \
    default: decode_tile(DT, 4, round_p, n, nk, dk, dv, q, kb, ldkb, vb, ldvb, kr, vr, scale, k_scale, v_scale, s, m, l, alpha, acc, &pf); break; \
    }

/* DECODE_DT for every cache dtype: float32, the 16-bit ones, q8_0, q4_0 and fp8 */
#define DECODE_ANY(dt)                                                                          \
    do {                                                                                        \
        if ((dt) == ATTN_Q8_0) DECODE_DT(ATTN_Q8_0)                                             \
        else if ((dt) == ATTN_Q4_0) DECODE_DT(ATTN_Q4_0)                                        \
        else if ((dt) == ATTN_FP8_E4M3) DECODE_DT(ATTN_FP8_E4M3)                                \
        else if ((dt) == ATTN_FP8_E5M2) DECODE_DT(ATTN_FP8_E5M2)                                \
        else ATTN_KV_DTYPE_SWITCH(dt, DECODE_DT);                                               \
    } while (0)

void ai_decode_avx512(int64_t n, int64_t nk, int64_t dk, int64_t dv, const float *q,
                      attn_dtype dt, bool round_p, const void *k, int64_t ldk, const void *v,
                      int64_t ldv, float scale, float k_scale, float v_scale, float *s,
                      float *m, float *l, float *alpha, float *acc, const void *ask_v,
                      int64_t ask_nv, const void *next_k, int64_t next_nk) {
    const int64_t es = attn_elem_bytes(dt);
    const char *kb = (const char *)k, *vb = (const char *)v;
    const int64_t ldkb = attn_row_byte_offset(dt, ldk), ldvb = attn_row_byte_offset(dt, ldv);
    const char *const *kr = NULL, *const *vr = NULL;  // at one stride
    attn_decode_pf pf = attn_decode_pf_make(ask_v, ldv, ask_nv, dv, next_k, ldk, next_nk, dk, es);
    if (attn_is_block_dtype(dt)) {  // rows of blocks: strides and lines in bytes of blocks
        pf.ldv = ldvb, pf.ldk = ldkb;
        pf.lines_v = (attn_row_bytes(dt, dv) + 63) / 64, pf.lines_k = (attn_row_bytes(dt, dk) + 63) / 64;
    }
    DECODE_ANY(dt);
}

/* decode on rows given by their addresses (kernels.h: decode_rows): a paged tile's rows
 * read in place from their pages, the same arithmetic as decode's */
void ai_decode_rows_avx512(int64_t n, int64_t nk, int64_t dk, int64_t dv, const float *q,
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
    if (attn_is_block_dtype(dt))  // rows of blocks: lines in bytes of blocks
        pf.lines_v = (attn_row_bytes(dt, dv) + 63) / 64, pf.lines_k = (attn_row_bytes(dt, dk) + 63) / 64;
    DECODE_ANY(dt);
}

/* decode's logits alone (kernels.h: decode_qk), for the weights' sweep */
void ai_decode_qk_avx512(int64_t n, int64_t nk, int64_t dk, const float *q, attn_dtype dt,
                         const void *k, int64_t ldk, float scale, float k_scale, float *st,
                         int64_t lds) {
    const attn_decode_pf none = {0};
    float s[4 * (ATTN_BK_LIMIT + 4)];  // the step's compact lanes, then into st
    const char *kb = (const char *)k;
    const int64_t ldkb = attn_row_byte_offset(dt, ldk);
    __m512 mx;
    __mmask16 nan;
#define LOGITS(DT)                                                                            \
    switch (n) {                                                                              \
    case 1: dec_logits(DT, 1, nk, dk, q, kb, ldkb, NULL, scale, k_scale, s, &none, &mx, &nan); break;         \
    case 2: dec_logits(DT, 2, nk, dk, q, kb, ldkb, NULL, scale, k_scale, s, &none, &mx, &nan); break;         \
    case 3: dec_logits(DT, 3, nk, dk, q, kb, ldkb, NULL, scale, k_scale, s, &none, &mx, &nan); break;         \
    default: dec_logits(DT, 4, nk, dk, q, kb, ldkb, NULL, scale, k_scale, s, &none, &mx, &nan); break;        \
    }
    if (dt == ATTN_Q8_0) LOGITS(ATTN_Q8_0)
    else if (dt == ATTN_Q4_0) LOGITS(ATTN_Q4_0)
    else if (dt == ATTN_FP8_E4M3) LOGITS(ATTN_FP8_E4M3)
    else if (dt == ATTN_FP8_E5M2) LOGITS(ATTN_FP8_E5M2)
    else ATTN_KV_DTYPE_SWITCH(dt, LOGITS);
#undef LOGITS
    attn_decode_qk_store(n, nk, s, st, lds);
}

void ai_exp_array_avx512(int64_t n, const float *x, float *y) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 mk = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, mk, exp_avx512(_mm512_maskz_loadu_ps(mk, x + i)));
    }
}

/* The bool mask over 16 rows at a time: one gather brings 4 mask bytes (keys c..c+3) of
 * each of the 16 rows (two 8-lane gathers: row offsets are 64-bit), then each key's byte
 * becomes a lane mask that sets the masked logits to -inf. Keys left over (nk not a
 * multiple of 4) and rows past a multiple of 16 take the portable loop. */
void ai_mask_bool_avx512(int64_t n, int64_t nk, const uint8_t *m, int64_t ldm, float *s,
                         int64_t lds) {
    const int64_t n16 = n / 16 * 16, nk4 = nk / 4 * 4;
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
    for (int64_t r = 0; r < n16; r += 16) {
        const __m512i lanes = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
        const __m512i off_lo = _mm512_mullo_epi64(_mm512_add_epi64(lanes, _mm512_set1_epi64(r)),
                                                  _mm512_set1_epi64(ldm));
        const __m512i off_hi = _mm512_add_epi64(off_lo, _mm512_set1_epi64(8 * ldm));
        for (int64_t c = 0; c < nk4; c += 4) {
            const __m256i lo = _mm512_i64gather_epi32(off_lo, m + c, 1);
            const __m256i hi = _mm512_i64gather_epi32(off_hi, m + c, 1);
            const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            UNROLL for (int t = 0; t < 4; t++) {
                const __mmask16 masked = _mm512_testn_epi32_mask(w, _mm512_set1_epi32((int)(0xffu << (8 * t))));
                float *x = s + (c + t) * lds + r;
                _mm512_mask_storeu_ps(x, masked, neg_inf);
            }
        }
        if (nk4 < nk) ai_mask_bool_generic(16, nk - nk4, m + r * ldm + nk4, ldm, s + nk4 * lds + r, lds);
    }
    if (n16 < n) ai_mask_bool_generic(n - n16, nk, m + n16 * ldm, ldm, s + n16, lds);
}

/* 16-bit rows to float32: F16C's vcvtph2ps (exact), bfloat16 by a 16-bit shift. */
void ai_to_f32_avx512(attn_dtype dt, int64_t n, const uint16_t *src, float *dst) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 mk = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m256i h = _mm256_maskz_loadu_epi16(mk, src + i);
        const __m512 f = dt == ATTN_BF16
                             ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
                             : _mm512_cvtph_ps(h);
        _mm512_mask_storeu_ps(dst + i, mk, f);
    }
}

/* dropout's Philox words (kernels.h): philox.h's simd loop at this ISA's width */
static void dropout_avx512(int64_t n, const uint64_t *grp, uint64_t seed, uint64_t offset,
                          uint32_t *u, int64_t ldu) {
    attn_dropout_words(n, grp, seed, offset, u, ldu);
}

const attn_kernels attn_kernels_avx512 = {
    .name = "avx512",
    .geom = ATTN_GEOM(avx512),
    .qk = ai_qk_avx512,
    .qk_q_rows = ATTN_DECODE_MAX_ROWS,  // the dot-product form on q
    .softmax = ai_softmax_avx512,
    .pv = ai_pv_avx512,
    .mask_bool = ai_mask_bool_avx512,
    .to_f32 = ai_to_f32_avx512,
    .decode = ai_decode_avx512,
    .decode_qk = ai_decode_qk_avx512,
    .decode_q8_0 = true,
    .decode_fp8 = true,
    .decode_q4_0 = true,
    .decode_rows = ai_decode_rows_avx512,
    .exp = ai_exp_array_avx512,
    .additive = &attn_additive_kernels_avx512,
    .dropout = dropout_avx512,
    .gemm = ai_gemm_avx512,
    .gemv_rows_bf16 = ai_gemv_rows_bf16_avx2,  // avx2/gemv.c
    .gemv_dots_bf16 = ai_gemv_dots_bf16_avx2,
    .rows_from_st = ai_rows_from_st_avx2,  // avx2/convert.c
};
#endif
