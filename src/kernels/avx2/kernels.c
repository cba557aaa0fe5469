/*
 * avx2/kernels.c — the AVX2 + FMA micro-kernels (contracts in kernels.h; design notes
 *                  and the exp error bound in docs/KERNELS.md).
 *
 * Only this file is compiled with AVX2 flags; dispatch.c calls it only on a CPU that has
 * AVX2 and FMA. The same design as the AVX-512 kernels at half the width and with 16
 * vector registers: one ymm holds 8 query rows of S^T. The register tiles:
 *   qk: 2 ymm of rows x 6 keys (12 accumulators); for decoding blocks (at most
 *       ATTN_DECODE_MAX_ROWS rows) the dot-product form, 4 rows x 2 keys reduced by one
 *       hadd tree;
 *   pv: 6 rows x 2 ymm of value columns (12 accumulators; 4 rows, 8, under the
 *       zero-skipping blend); a column tail narrower than 8 goes through a masked
 *       load/store; pv_h the same passes on a 16-bit value block, converted as each
 *       pass's panel is filled;
 *   decode: the AVX-512 decoding step at half the width (decode.c).
 */
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "core/half.h"
#include "kernels/additive_kernels.h"
#include "kernels/kernels.h"
#include "gemv.h"
#include "core/philox.h"
#include "exp.h"

INLINE void qk_tile(int RV, int KC, int64_t dk, const float *qt, int64_t ldq, const float *k,
                    int64_t ldk, __m256 scale, float *s, int64_t lds) {
    __m256 acc[2][6];
    UNROLL for (int a = 0; a < RV; a++)
        UNROLL for (int c = 0; c < KC; c++) acc[a][c] = _mm256_setzero_ps();
    for (int64_t d = 0; d < dk; d++) {
        __m256 q[2];
        UNROLL for (int a = 0; a < RV; a++) q[a] = _mm256_loadu_ps(qt + d * ldq + 8 * a);
        UNROLL for (int c = 0; c < KC; c++) {
            const __m256 kb = _mm256_broadcast_ss(k + c * ldk + d);
            UNROLL for (int a = 0; a < RV; a++) acc[a][c] = _mm256_fmadd_ps(kb, q[a], acc[a][c]);
        }
    }
    UNROLL for (int c = 0; c < KC; c++)
        UNROLL for (int a = 0; a < RV; a++)
            _mm256_storeu_ps(s + c * lds + 8 * a, _mm256_mul_ps(acc[a][c], scale));
}

/* The dot-product form for at most 4 query rows (decoding), as in the AVX-512 kernels:
 * each key row streamed once along Dk against the rows in L1, 2 keys at a time (8
 * accumulators), the 8 (row, key) sums reduced together by one hadd tree: lane 4c + r of
 * the result is row r of key c. The 16-row tile would do 4x the FMAs on padding. */
INLINE void qk_dot_tile(int NR, int KC, int64_t dk, const float *q, const float *k, int64_t ldk,
                    float scale, float *s, int64_t lds) {
    __m256 acc[2][4];  // [key][row]
    UNROLL for (int c = 0; c < 2; c++)
        UNROLL for (int r = 0; r < 4; r++) acc[c][r] = _mm256_setzero_ps();
    const int64_t d8 = dk / 8 * 8;
    for (int64_t d = 0; d < d8; d += 8) {
        __m256 kv[2];
        UNROLL for (int c = 0; c < KC; c++) kv[c] = _mm256_loadu_ps(k + c * ldk + d);
        UNROLL for (int r = 0; r < NR; r++) {
            const __m256 qv = _mm256_loadu_ps(q + r * dk + d);
            UNROLL for (int c = 0; c < KC; c++) acc[c][r] = _mm256_fmadd_ps(qv, kv[c], acc[c][r]);
        }
    }
    if (d8 < dk) {  // the last dk % 8 columns: masked loads, zero past dk
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256i mk = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(dk - d8)), lane);
        __m256 kv[2];
        UNROLL for (int c = 0; c < KC; c++) kv[c] = _mm256_maskload_ps(k + c * ldk + d8, mk);
        UNROLL for (int r = 0; r < NR; r++) {
            const __m256 qv = _mm256_maskload_ps(q + r * dk + d8, mk);
            UNROLL for (int c = 0; c < KC; c++) acc[c][r] = _mm256_fmadd_ps(qv, kv[c], acc[c][r]);
        }
    }
    const __m256 h01 = _mm256_hadd_ps(acc[0][0], acc[0][1]), h23 = _mm256_hadd_ps(acc[0][2], acc[0][3]);
    const __m256 h45 = _mm256_hadd_ps(acc[1][0], acc[1][1]), h67 = _mm256_hadd_ps(acc[1][2], acc[1][3]);
    const __m256 a = _mm256_hadd_ps(h01, h23), b = _mm256_hadd_ps(h45, h67);
    const __m256 sum = _mm256_mul_ps(_mm256_set1_ps(scale),
                                     _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20),
                                                   _mm256_permute2f128_ps(a, b, 0x31)));
    _mm_storeu_ps(s, _mm256_castps256_ps128(sum));
    if (KC == 2) _mm_storeu_ps(s + lds, _mm256_extractf128_ps(sum, 1));
}

#define QK_DOT(NR)                                                                          \
    static void qk_dot_rows##NR(int64_t nk, int64_t dk, const float *q, const float *k,     \
                                int64_t ldk, float scale, float *s, int64_t lds) {         \
        int64_t c = 0;                                                                      \
        for (; c + 2 <= nk; c += 2) qk_dot_tile(NR, 2, dk, q, k + c * ldk, ldk, scale, s + c * lds, lds); \
        if (c < nk) qk_dot_tile(NR, 1, dk, q, k + c * ldk, ldk, scale, s + c * lds, lds);      \
    }
QK_DOT(1)
QK_DOT(2)
QK_DOT(3)
QK_DOT(4)

static void qk_avx2(int64_t n, int64_t npad, int64_t nk, int64_t dk, const float *q,
                    const float *qt, int64_t ldq, const float *k, int64_t ldk, float scale, float *s, int64_t lds) {
    if (n <= ATTN_DECODE_MAX_ROWS) {
        /* decoding blocks (their boundary and masked tiles) by the dot-product form */
        static attn_qk_rows_fn *const rows[5] = {NULL, qk_dot_rows1, qk_dot_rows2, qk_dot_rows3,
                                                 qk_dot_rows4};
        attn_qk_dot_block(rows, n, npad, nk, dk, q, k, ldk, scale, s, lds);
        return;
    }
    const __m256 vs = _mm256_set1_ps(scale);
    for (int64_t r = 0; r < npad; r += 16) {  // npad is a multiple of 16: two ymm
        int64_t c = 0;
        for (; c + 6 <= nk; c += 6)
            qk_tile(2, 6, dk, qt + r, ldq, k + c * ldk, ldk, vs, s + c * lds + r, lds);
        /* the last nk % 6 keys in one tile (a key-at-a-time tail has 2 accumulators, a
         * quarter of what hides the FMA latency) */
        float *sc = s + c * lds + r;
        const float *kc = k + c * ldk;
        switch (nk - c) {
        case 5: qk_tile(2, 5, dk, qt + r, ldq, kc, ldk, vs, sc, lds); break;
        case 4: qk_tile(2, 4, dk, qt + r, ldq, kc, ldk, vs, sc, lds); break;
        case 3: qk_tile(2, 3, dk, qt + r, ldq, kc, ldk, vs, sc, lds); break;
        case 2: qk_tile(2, 2, dk, qt + r, ldq, kc, ldk, vs, sc, lds); break;
        case 1: qk_tile(2, 1, dk, qt + r, ldq, kc, ldk, vs, sc, lds); break;
        default: break;
        }
    }
}

/* RV ymm of rows (8 each) of the online-softmax step, side by side: two passes over the
 * keys (the max, then the exps and their sum), each with RV independent chains so that
 * the exps of the rows overlap. */
INLINE void softmax_rows(int RV, int64_t nk, float *s, int64_t lds, float *m, float *l,
                         float *alpha) {
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY), zero = _mm256_setzero_ps();
    __m256 m_old[2], mx[2], nan[2], shift[2], sum[2];
    UNROLL for (int a = 0; a < RV; a++) {
        m_old[a] = mx[a] = _mm256_loadu_ps(m + 8 * a);
        nan[a] = _mm256_cmp_ps(m_old[a], m_old[a], _CMP_UNORD_Q);
    }
    for (int64_t c = 0; c < nk; c++)
        UNROLL for (int a = 0; a < RV; a++) {
            const __m256 x = _mm256_loadu_ps(s + c * lds + 8 * a);
            mx[a] = _mm256_max_ps(mx[a], x);
            nan[a] = _mm256_or_ps(nan[a], _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
        }
    UNROLL for (int a = 0; a < RV; a++) {
        mx[a] = _mm256_blendv_ps(mx[a], _mm256_set1_ps(NAN), nan[a]);  // a NaN logit poisons its row
        shift[a] = _mm256_blendv_ps(mx[a], zero, _mm256_cmp_ps(mx[a], neg_inf, _CMP_EQ_OQ));
        sum[a] = zero;
    }
    for (int64_t c = 0; c < nk; c++)
        UNROLL for (int a = 0; a < RV; a++) {
            float *x = s + c * lds + 8 * a;
            const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x), shift[a]));
            _mm256_storeu_ps(x, e);
            sum[a] = _mm256_add_ps(sum[a], e);
        }
    UNROLL for (int a = 0; a < RV; a++) {
        const __m256 al = exp_avx2(_mm256_sub_ps(m_old[a], shift[a]));
        _mm256_storeu_ps(alpha + 8 * a, al);
        _mm256_storeu_ps(l + 8 * a, _mm256_fmadd_ps(_mm256_loadu_ps(l + 8 * a), al, sum[a]));
        _mm256_storeu_ps(m + 8 * a, mx[a]);
    }
}

static void softmax_avx2(int64_t npad, int64_t nk, float *s, int64_t lds, float *m, float *l,
                         float *alpha) {
    int64_t r = 0;
    for (; r + 16 <= npad; r += 16) softmax_rows(2, nk, s + r, lds, m + r, l + r, alpha + r);
    for (; r < npad; r += 8) softmax_rows(1, nk, s + r, lds, m + r, l + r, alpha + r);
}

/* RR rows x 2 ymm (16 value columns) of P V, from the packed panel vp (nk rows of 16
 * floats); the columns of acc past `cols` (< 16 in the last pass) are not written. SKIP:
 * a p of exactly 0 does not multiply its value row (by a blend, no branch; pv_avx2 takes
 * it only for a value block that holds a NaN or an Inf). */
INLINE void pv_tile(int RR, bool SKIP, bool MASKED, int64_t nk, const float *p, int64_t lds,
                    const float *vp, const float *alpha, float *acc, int64_t ldo,
                    __m256i tail0, __m256i tail1) {
    __m256 t[6][2];
    UNROLL for (int i = 0; i < RR; i++) t[i][0] = t[i][1] = _mm256_setzero_ps();
    for (int64_t c = 0; c < nk; c++) {
        const __m256 v0 = _mm256_load_ps(vp + 16 * c), v1 = _mm256_load_ps(vp + 16 * c + 8);
        UNROLL for (int i = 0; i < RR; i++) {
            const __m256 pb = _mm256_broadcast_ss(p + c * lds + i);
            if (SKIP) {  // masked (p = 0): the row's sums keep their value
                const __m256 live = _mm256_cmp_ps(pb, _mm256_setzero_ps(), _CMP_NEQ_UQ);
                t[i][0] = _mm256_blendv_ps(t[i][0], _mm256_fmadd_ps(pb, v0, t[i][0]), live);
                t[i][1] = _mm256_blendv_ps(t[i][1], _mm256_fmadd_ps(pb, v1, t[i][1]), live);
            } else {
                t[i][0] = _mm256_fmadd_ps(pb, v0, t[i][0]);
                t[i][1] = _mm256_fmadd_ps(pb, v1, t[i][1]);
            }
        }
    }
    UNROLL for (int i = 0; i < RR; i++) {
        const __m256 a = _mm256_set1_ps(alpha[i]);
        float *o = acc + i * ldo;
        if (MASKED) {
            _mm256_maskstore_ps(o, tail0, _mm256_fmadd_ps(_mm256_maskload_ps(o, tail0), a, t[i][0]));
            _mm256_maskstore_ps(o + 8, tail1, _mm256_fmadd_ps(_mm256_maskload_ps(o + 8, tail1), a, t[i][1]));
        } else {
            _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_loadu_ps(o), a, t[i][0]));
            _mm256_storeu_ps(o + 8, _mm256_fmadd_ps(_mm256_loadu_ps(o + 8), a, t[i][1]));
        }
    }
}

/* One pass of 16 value columns for all n rows. Without SKIP 6 rows a tile: 12
 * accumulators, as many as qk_tile's, so that two FMA pipes of latency 5 (Zen 2) find
 * independent work (4 rows, 8 accumulators, cover a latency of 4 at most), and 8 loads
 * for 12 FMAs where 4 rows take 6 for 8; the rows left over in one tile of their number.
 * SKIP's blend needs two more registers than 6 rows leave of the 16: 4 rows a tile, the
 * rest one at a time. A row's sums are the same whichever tile it is in. */
#define PV_PASS(NAME, SKIP, MASKED)                                                          \
    static void NAME(int64_t n, int64_t nk, const float *p, int64_t lds, const float *vp,   \
                     const float *alpha, float *acc, int64_t ldo, __m256i tail0,            \
                     __m256i tail1) {                                                       \
        int64_t r = 0;                                                                      \
        if (SKIP) {                                                                         \
            for (; r + 4 <= n; r += 4)                                                      \
                pv_tile(4, SKIP, MASKED, nk, p + r, lds, vp, alpha + r, acc + r * ldo, ldo, tail0, tail1); \
            for (; r < n; r++)                                                              \
                pv_tile(1, SKIP, MASKED, nk, p + r, lds, vp, alpha + r, acc + r * ldo, ldo, tail0, tail1); \
            return;                                                                         \
        }                                                                                   \
        for (; r + 6 <= n; r += 6)                                                          \
            pv_tile(6, SKIP, MASKED, nk, p + r, lds, vp, alpha + r, acc + r * ldo, ldo, tail0, tail1); \
        switch (n - r) {                                                                    \
        case 5: pv_tile(5, SKIP, MASKED, nk, p + r, lds, vp, alpha + r, acc + r * ldo, ldo, tail0, tail1); break; \
        case 4: pv_tile(4, SKIP, MASKED, nk, p + r, lds, vp, alpha + r, acc + r * ldo, ldo, tail0, tail1); break; \
        case 3: pv_tile(3, SKIP, MASKED, nk, p + r, lds, vp, alpha + r, acc + r * ldo, ldo, tail0, tail1); break; \
        case 2: pv_tile(2, SKIP, MASKED, nk, p + r, lds, vp, alpha + r, acc + r * ldo, ldo, tail0, tail1); break; \
        case 1: pv_tile(1, SKIP, MASKED, nk, p + r, lds, vp, alpha + r, acc + r * ldo, ldo, tail0, tail1); break; \
        default: break;                                                                     \
        }                                                                                   \
    }
PV_PASS(pv_pass, false, false)
PV_PASS(pv_pass_m, false, true)
PV_PASS(pv_pass_skip, true, false)
PV_PASS(pv_pass_skip_m, true, true)

/* Whether the nk x dv block v holds only finite values (no NaN, no Inf). */
static bool rows_finite(const float *v, int64_t ldv, int64_t nk, int64_t dv) {
    const __m256i expo = _mm256_set1_epi32(0x7f800000);
    __m256i bad = _mm256_setzero_si256();
    uint32_t bad_s = 0;
    for (int64_t c = 0; c < nk; c++) {
        const float *row = v + c * ldv;
        int64_t d = 0;
        for (; d + 8 <= dv; d += 8) {
            const __m256i x = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(row + d)), expo);
            bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(x, expo));
        }
        for (; d < dv; d++) {
            uint32_t u;
            memcpy(&u, row + d, sizeof u);
            bad_s |= (u & 0x7f800000u) == 0x7f800000u;
        }
    }
    return !bad_s && _mm256_testz_si256(bad, bad);
}

/* P V in passes of 16 value columns, 4 rows x 2 ymm a register tile. Each pass first
 * copies its columns of the nk value rows into a contiguous panel (64 bytes a key): the
 * value rows of a caller's [.., L, D] tensor lie a power of two apart (256 bytes for
 * D = 64, 512 for D = 128), so the rows of one pass share a few L1 sets and evict each
 * other (and the logits' lines) on every sweep of the rows; the panel streams instead
 * (docs/KERNELS.md has the figures). The last pass of a Dv that is not
 * a multiple of 16 is zero-padded in the panel and stored under a lane mask.
 * skip_zeros matters only where the value block holds a NaN or an Inf (0 * v = 0 exactly
 * otherwise, and adding a zero changes no sum), so a masked tile checks the block first
 * (nk * dv loads, beside the n * nk * dv FMAs) and takes the blend only where it must:
 * no per-probability branch, which a random bool mask mispredicts half the time. */
static void pv_avx2(int64_t n, int64_t npad, int64_t nk, int64_t dv, const float *p,
                    int64_t lds, const float *v, int64_t ldv, const float *alpha, float *acc,
                    int64_t ldo, bool skip_zeros) {
    (void)npad;
    _Alignas(32) float panel[ATTN_BK_LIMIT * 16];
    const bool skip = skip_zeros && !rows_finite(v, ldv, nk, dv);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t d0 = 0; d0 < dv; d0 += 16) {
        const int64_t nd = dv - d0 < 16 ? dv - d0 : 16;
        const __m256i tail0 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)nd), lane);
        const __m256i tail1 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)nd - 8), lane);
        const float *vc = v + d0;
        if (nd == 16) {
            for (int64_t c = 0; c < nk; c++) {
                _mm256_store_ps(panel + 16 * c, _mm256_loadu_ps(vc + c * ldv));
                _mm256_store_ps(panel + 16 * c + 8, _mm256_loadu_ps(vc + c * ldv + 8));
            }
            if (skip) pv_pass_skip(n, nk, p, lds, panel, alpha, acc + d0, ldo, tail0, tail1);
            else pv_pass(n, nk, p, lds, panel, alpha, acc + d0, ldo, tail0, tail1);
        } else {
            for (int64_t c = 0; c < nk; c++) {
                _mm256_store_ps(panel + 16 * c, _mm256_maskload_ps(vc + c * ldv, tail0));
                _mm256_store_ps(panel + 16 * c + 8, _mm256_maskload_ps(vc + c * ldv + 8, tail1));
            }
            if (skip) pv_pass_skip_m(n, nk, p, lds, panel, alpha, acc + d0, ldo, tail0, tail1);
            else pv_pass_m(n, nk, p, lds, panel, alpha, acc + d0, ldo, tail0, tail1);
        }
    }
}

/* 8 elements of a 16-bit row as float32 (exact): bfloat16 by a 16-bit shift, float16 by
 * F16C's vcvtph2ps. */
INLINE __m256 half8_avx2(bool BF, __m128i h) {
    return BF ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
              : _mm256_cvtph_ps(h);
}

/* pv_h (kernels.h) for one 16-bit dtype: pv_avx2's passes, each panel filled straight from
 * the 16-bit rows (no float32 copy of the block in between), and the finiteness test that
 * decides the skip made on the panel's own values as they are stored: a pass skips zeros
 * only where its 16 columns hold a NaN or an Inf (0 * v = 0 exactly elsewhere). */
INLINE void pv_h_tile(bool BF, int64_t n, int64_t nk, int64_t dv, const float *p, int64_t lds,
                      const uint16_t *v, int64_t ldv, const float *alpha, float *acc,
                      int64_t ldo, bool skip_zeros) {
    _Alignas(32) float panel[ATTN_BK_LIMIT * 16];
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i expo = _mm256_set1_epi32(0x7f800000);
    for (int64_t d0 = 0; d0 < dv; d0 += 16) {
        const int64_t nd = dv - d0 < 16 ? dv - d0 : 16;
        const __m256i tail0 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)nd), lane);
        const __m256i tail1 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)nd - 8), lane);
        __m256i bad = _mm256_setzero_si256();
        for (int64_t c = 0; c < nk; c++) {
            const uint16_t *row = v + c * ldv + d0;
            __m128i h0, h1;
            if (nd == 16) {
                h0 = _mm_loadu_si128((const __m128i *)row);
                h1 = _mm_loadu_si128((const __m128i *)(row + 8));
            } else {  // the last columns of a Dv that is not a multiple of 16: zero past dv
                uint16_t t[16] = {0};
                memcpy(t, row, (size_t)nd * sizeof(uint16_t));
                h0 = _mm_loadu_si128((const __m128i *)t);
                h1 = _mm_loadu_si128((const __m128i *)(t + 8));
            }
            const __m256 x0 = half8_avx2(BF, h0), x1 = half8_avx2(BF, h1);
            _mm256_store_ps(panel + 16 * c, x0);
            _mm256_store_ps(panel + 16 * c + 8, x1);
            bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(x0), expo), expo));
            bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(x1), expo), expo));
        }
        const bool skip = skip_zeros && !_mm256_testz_si256(bad, bad);
        if (nd == 16) {
            if (skip) pv_pass_skip(n, nk, p, lds, panel, alpha, acc + d0, ldo, tail0, tail1);
            else pv_pass(n, nk, p, lds, panel, alpha, acc + d0, ldo, tail0, tail1);
        } else {
            if (skip) pv_pass_skip_m(n, nk, p, lds, panel, alpha, acc + d0, ldo, tail0, tail1);
            else pv_pass_m(n, nk, p, lds, panel, alpha, acc + d0, ldo, tail0, tail1);
        }
    }
}

static void pv_h_avx2(int64_t n, int64_t npad, int64_t nk, int64_t dv, const float *p,
                      int64_t lds, attn_dtype dt, const uint16_t *v, int64_t ldv,
                      const float *alpha, float *acc, int64_t ldo, bool skip_zeros) {
    (void)npad;
    if (dt == ATTN_BF16) pv_h_tile(true, n, nk, dv, p, lds, v, ldv, alpha, acc, ldo, skip_zeros);
    else pv_h_tile(false, n, nk, dv, p, lds, v, ldv, alpha, acc, ldo, skip_zeros);
}

/* The bool mask on an S^T tile (kernels.h: mask_bool) without a branch or a gather: for
 * 8 rows x 8 keys, eight 8-byte loads (one per row) transposed by three rounds of byte,
 * word and dword unpacks into 8 bytes per key (the 8 rows), each widened to a lane mask
 * that blends -inf into the key's 8 logits. Keys past a multiple of 8 and rows past a
 * multiple of 8 take the portable loop. */
static void mask_bool_avx2(int64_t n, int64_t nk, const uint8_t *m, int64_t ldm, float *s,
                           int64_t lds) {
    const int64_t n8 = n / 8 * 8, nk8 = nk / 8 * 8;
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
    const __m256i zero = _mm256_setzero_si256();
    for (int64_t r = 0; r < n8; r += 8) {
        const uint8_t *mr = m + r * ldm;
        for (int64_t c = 0; c < nk8; c += 8) {
            __m128i x[8];
            UNROLL for (int i = 0; i < 8; i++) x[i] = _mm_loadl_epi64((const __m128i *)(mr + i * ldm + c));
            // a[j]: keys 0..7 of rows 2j, 2j+1 interleaved
            const __m128i a0 = _mm_unpacklo_epi8(x[0], x[1]), a1 = _mm_unpacklo_epi8(x[2], x[3]);
            const __m128i a2 = _mm_unpacklo_epi8(x[4], x[5]), a3 = _mm_unpacklo_epi8(x[6], x[7]);
            // rows 0..3 (b0: keys 0..3, b1: keys 4..7), rows 4..7 (b2, b3)
            const __m128i b0 = _mm_unpacklo_epi16(a0, a1), b1 = _mm_unpackhi_epi16(a0, a1);
            const __m128i b2 = _mm_unpacklo_epi16(a2, a3), b3 = _mm_unpackhi_epi16(a2, a3);
            // two keys each, 8 rows a key
            const __m128i k[4] = {_mm_unpacklo_epi32(b0, b2), _mm_unpackhi_epi32(b0, b2),
                                  _mm_unpacklo_epi32(b1, b3), _mm_unpackhi_epi32(b1, b3)};
            UNROLL for (int t = 0; t < 8; t++) {
                const __m128i bytes = t % 2 ? _mm_srli_si128(k[t / 2], 8) : k[t / 2];
                const __m256i masked = _mm256_cmpeq_epi32(_mm256_cvtepu8_epi32(bytes), zero);
                float *x_t = s + (c + t) * lds + r;
                _mm256_storeu_ps(x_t, _mm256_blendv_ps(_mm256_loadu_ps(x_t), neg_inf, _mm256_castsi256_ps(masked)));
            }
        }
        if (nk8 < nk) ai_mask_bool_generic(8, nk - nk8, mr + nk8, ldm, s + nk8 * lds + r, lds);
    }
    if (n8 < n) ai_mask_bool_generic(n - n8, nk, m + n8 * ldm, ldm, s + n8, lds);
}

static void exp_array_avx2(int64_t n, const float *x, float *y) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp_avx2(_mm256_loadu_ps(x + i)));
    if (i < n) {
        float in[8] = {0}, out[8];
        for (int64_t j = i; j < n; j++) in[j - i] = x[j];
        _mm256_storeu_ps(out, exp_avx2(_mm256_loadu_ps(in)));
        for (int64_t j = i; j < n; j++) y[j] = out[j - i];
    }
}

/* 16-bit rows to float32: F16C's vcvtph2ps (exact), bfloat16 by a 16-bit shift. */
static void to_f32_avx2(attn_dtype dt, int64_t n, const uint16_t *src, float *dst) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm_loadu_si128((const __m128i *)(src + i));
        const __m256 f = dt == ATTN_BF16
                             ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                             : _mm256_cvtph_ps(h);
        _mm256_storeu_ps(dst + i, f);
    }
    for (; i < n; i++)
        dst[i] = dt == ATTN_BF16 ? attn_bf16_to_f32(src[i]) : attn_f16_to_f32(src[i]);
}

/* q8_0 blocks to float32: the scale by F16C (exact), each 8 int8 widened to int32 and
 * converted (exact), one multiply (exact: an 11-bit by 8-bit product). */
static void dequant_q8_0_avx2(int64_t n, const uint8_t *src, float *dst) {
    for (int64_t c = 0; c < n; c++) {
        const uint8_t *b = src + c * ATTN_Q8_0_BYTES;
        const __m256 d = _mm256_set1_ps(_cvtsh_ss((unsigned short)(b[0] | b[1] << 8)));
        for (int i = 0; i < 4; i++) {
            const __m128i q8 = _mm_loadl_epi64((const __m128i *)(b + 2 + 8 * i));
            const __m256 x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
            _mm256_storeu_ps(dst + c * ATTN_Q8_0_BLOCK + 8 * i, _mm256_mul_ps(d, x));
        }
    }
}

/* hi and lo 32-bit halves of the eight products m * x (unsigned 32 x 32 -> 64): the even
 * lanes by one vpmuludq, the odd ones by a second on x shifted down */
static inline void mulhilo_avx2(__m256i m, __m256i x, __m256i *hi, __m256i *lo) {
    const __m256i pe = _mm256_mul_epu32(m, x), po = _mm256_mul_epu32(m, _mm256_srli_epi64(x, 32));
    *hi = _mm256_blend_epi32(_mm256_srli_epi64(pe, 32), po, 0xAA);
    *lo = _mm256_blend_epi32(pe, _mm256_slli_epi64(po, 32), 0xAA);
}

/* dropout's Philox words (kernels.h): eight groups per vector, Philox4x32-10 as philox.h's
 * scalar rounds, lane by lane; the tail (n mod 8) by philox.h's portable loop */
static void dropout_avx2(int64_t n, const uint64_t *grp, uint64_t seed, uint64_t offset,
                         uint32_t *u, int64_t ldu) {
    const __m256i m0 = _mm256_set1_epi32((int)ATTN_PHILOX_M0), m1 = _mm256_set1_epi32((int)ATTN_PHILOX_M1);
    const __m256i o0 = _mm256_set1_epi32((int)(uint32_t)offset),
                  o1 = _mm256_set1_epi32((int)(uint32_t)(offset >> 32));
    const __m256i lo_idx = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    __m256i ka[10], kb[10];
    for (int r = 0; r < 10; r++) {
        ka[r] = _mm256_set1_epi32((int)((uint32_t)seed + (uint32_t)r * ATTN_PHILOX_W0));
        kb[r] = _mm256_set1_epi32((int)((uint32_t)(seed >> 32) + (uint32_t)r * ATTN_PHILOX_W1));
    }
    int64_t t = 0;
    for (; t + 8 <= n; t += 8) {
        /* the counters' low and high words, deinterleaved from four + four 64-bit indices */
        const __m256i g0 = _mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i *)(grp + t)), lo_idx);
        const __m256i g1 = _mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i *)(grp + t + 4)), lo_idx);
        __m256i c0 = _mm256_permute2x128_si256(g0, g1, 0x20), c1 = _mm256_permute2x128_si256(g0, g1, 0x31);
        __m256i c2 = o0, c3 = o1;
        for (int r = 0; r < 10; r++) {
            __m256i hi0, lo0, hi1, lo1;
            mulhilo_avx2(m0, c0, &hi0, &lo0);
            mulhilo_avx2(m1, c2, &hi1, &lo1);
            c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), ka[r]);
            c1 = lo1;
            c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), kb[r]);
            c3 = lo0;
        }
        _mm256_storeu_si256((__m256i *)(u + t), c0);
        _mm256_storeu_si256((__m256i *)(u + ldu + t), c1);
        _mm256_storeu_si256((__m256i *)(u + 2 * ldu + t), c2);
        _mm256_storeu_si256((__m256i *)(u + 3 * ldu + t), c3);
    }
    if (t < n) attn_dropout_words(n - t, grp + t, seed, offset, u + t, ldu);
}

const attn_kernels attn_kernels_avx2 = {
    .name = "avx2",
    .geom = ATTN_GEOM(avx2),
    .cpu_geom = attn_cpu_geom_avx2,  // geom.c
    .qk = qk_avx2,
    .qk_q_rows = ATTN_DECODE_MAX_ROWS,  // the dot-product form on q
    .softmax = softmax_avx2,
    .pv = pv_avx2,
    .mask_bool = mask_bool_avx2,
    .to_f32 = to_f32_avx2,
    .decode = ai_decode_avx2,
    .decode_qk = ai_decode_qk_avx2,
    .exp = exp_array_avx2,
    .additive = &attn_additive_kernels_avx2,
    .dequant_q8_0 = dequant_q8_0_avx2,
    .decode_q8_0 = true,
    .decode_fp8 = true,
    .decode_q4_0 = true,
    .dropout = dropout_avx2,
    .gemm = ai_gemm_avx2,
    .decode_rows = ai_decode_rows_avx2,
    .pv_h = pv_h_avx2,
    .from_f32 = ai_from_f32_avx2,
    .gemv_rows_bf16 = ai_gemv_rows_bf16_avx2,  // avx2/gemv.c
    .gemv_dots_bf16 = ai_gemv_dots_bf16_avx2,
    .rows_from_st = ai_rows_from_st_avx2,  // avx2/convert.c
};
#endif
