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
 *   pv: 4 rows x 2 ymm of value columns (8 accumulators); a column tail narrower than
 *       8 goes through a masked load/store; pv_h the same passes on a 16-bit value
 *       block, converted as each pass's panel is filled;
 *   decode: the AVX-512 decoding step at half the width (below).
 */
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "half.h"
#include "additive.h"
#include "kernels.h"
#include "philox.h"

#define UNROLL _Pragma("GCC unroll 16")
#define INLINE ATTN_KERNEL_INLINE

/* exp(x): n = round(x log2 e), r = x - n ln 2 (Cody-Waite, two steps), e^r by its
 * degree-7 Taylor polynomial, 2^n built in the exponent bits. The kernels call it only
 * with x <= 0 (a logit minus its row max); x is clamped to [-87.33, 88] so that 2^n is a
 * normal number, and below -87.33 the result is flushed to 0 (the exact value is below
 * 2^-126 there: at most 1.2e-38 absolute error, nothing next to a softmax sum >= 1).
 * max(lo, x) returns x when x is NaN, so NaN stays NaN; -inf gives exactly 0.
 * The rounding to an integer is the shifter's: t = x log2 e + (1.5 * 2^23 + 127) in one
 * FMA leaves n + 127 in t's low mantissa bits (|n| < 2^22), so n = t - that constant
 * exactly and t's bits shifted left by 23 are 2^n: three operations where a round, a
 * conversion, an add and a shift were five (the exp is most of the softmax's work).
 * Measured against float64 exp on [-87.33, 0]: see tests/test_kernels.c. */
INLINE __m256 exp_avx2(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33654f);
    const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(lo, x);
    x = _mm256_min_ps(_mm256_set1_ps(88.0f), x);
    const __m256 shifter = _mm256_set1_ps(12582912.0f + 127.0f);  // 1.5 * 2^23 + 127
    const __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), shifter);
    const __m256 n = _mm256_sub_ps(t, shifter);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606820309417e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    /* 2^n for n in [-126, 127]: (n + 127) << 23, from t's bits */
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(t), 23);
    return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

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
         * quarter of what hides the FMA latency: 2 of bk = 128 keys took 6% of the time) */
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
    __m256 t[4][2];
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

/* One pass of 16 value columns for all n rows: 4 rows a tile, the rows left over one at
 * a time. */
#define PV_PASS(NAME, SKIP, MASKED)                                                          \
    static void NAME(int64_t n, int64_t nk, const float *p, int64_t lds, const float *vp,   \
                     const float *alpha, float *acc, int64_t ldo, __m256i tail0,            \
                     __m256i tail1) {                                                       \
        int64_t r = 0;                                                                      \
        for (; r + 4 <= n; r += 4)                                                          \
            pv_tile(4, SKIP, MASKED, nk, p + r, lds, vp, alpha + r, acc + r * ldo, ldo, tail0, tail1); \
        for (; r < n; r++)                                                                  \
            pv_tile(1, SKIP, MASKED, nk, p + r, lds, vp, alpha + r, acc + r * ldo, ldo, tail0, tail1); \
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
 * (docs/KERNELS.md: 55 -> 90 GFLOP/s a core on a tile). The last pass of a Dv that is not
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
        if (nk8 < nk) attn_mask_bool_generic(8, nk - nk8, mr + nk8, ldm, s + nk8 * lds + r, lds);
    }
    if (n8 < n) attn_mask_bool_generic(n - n8, nk, m + n8 * ldm, ldm, s + n8, lds);
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

/* ---- decoding: the whole step of one clean tile for at most 4 query rows ------------------
 * The AVX-512 step (avx512/kernels.c) at half the width: Q·Kᵀ by the dot-product form, 2
 * keys x 4 rows a call of dec_qk4 reduced by one hadd tree, the logits in a compact
 * layout (lane 4c + r for key c of a pair, row r), the online softmax on it, then P·V
 * for the 4 rows, 16 value columns a pass. 16-bit K and V are converted in registers.
 * Each stream is prefetched into the outer caches during the other's phase: this tile's
 * V rows while Q·Kᵀ reads K, the next tile's K rows while P·V reads V. */

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
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + d));
    if (DT == ATTN_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

/* line i of the V rows c, c+1 (those that exist) */
INLINE void pf_v_line(const attn_decode_pf *pf, int64_t c, int64_t i) {
    if (!pf->v || i >= pf->lines_v) return;
    for (int64_t r = c; r < c + 2 && r < pf->nv; r++)
        _mm_prefetch((pf->v_rows ? pf->v_rows[r] : pf->v + r * pf->ldv) + 64 * i, _MM_HINT_T2);
}

/* logits of NR rows x KC (1 or 2) keys at kr[0], kr[1]: lanes 4c + r, scaled; lanes of a missing
 * second key -inf. HALVES (a bfloat16 K, Dk a multiple of 16): q comes split by halves
 * and each load of 16 key values gives the even and the odd ones by a shift and an and,
 * where widening takes twice the operations (as dec_qk4_halves in avx512/kernels.c). */
INLINE __m256 dec_qk4(int DT, bool HALVES, int NR, int KC, int64_t dk, const float *q,
                       const char *const kr[2], __m256 scale, const attn_decode_pf *pf,
                       int64_t c) {
    __m256 acc[2][4];
    UNROLL for (int j = 0; j < 2; j++)
        UNROLL for (int r = 0; r < 4; r++) acc[j][r] = _mm256_setzero_ps();
    int64_t i = 0;
    if (HALVES) {  // q split by halves (split_halves); 16 values of a bfloat16 K a load
        const __m256i hi16 = _mm256_set1_epi32((int)0xFFFF0000u);
        for (int64_t d = 0; d < dk; d += 16, i++) {
            __m256 ke[2], ko[2];
            UNROLL for (int j = 0; j < KC; j++) {
                const __m256i raw = _mm256_loadu_si256((const __m256i *)((const uint16_t *)kr[j] + d));
                ke[j] = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
                ko[j] = _mm256_castsi256_ps(_mm256_and_si256(raw, hi16));
            }
            pf_v_line(pf, c, i);
            UNROLL for (int r = 0; r < NR; r++) {
                const __m256 qe = _mm256_loadu_ps(q + r * dk + d), qo = _mm256_loadu_ps(q + r * dk + d + 8);
                UNROLL for (int j = 0; j < KC; j++)
                    acc[j][r] = _mm256_fmadd_ps(qo, ko[j], _mm256_fmadd_ps(qe, ke[j], acc[j][r]));
            }
        }
    } else if (DT == ATTN_Q8_0) {  // block by block (dk a multiple of 32): a key's scale
        for (int64_t d = 0; d < dk; d += 32) {  // converted once, as load_row's product
            const uint8_t *b[2];
            __m256 sc[2];
            UNROLL for (int j = 0; j < KC; j++) {
                b[j] = (const uint8_t *)kr[j] + d / ATTN_Q8_0_BLOCK * ATTN_Q8_0_BYTES;
                sc[j] = _mm256_set1_ps(_cvtsh_ss((unsigned short)(b[j][0] | b[j][1] << 8)));
            }
            UNROLL for (int h = 0; h < 4; h++, i++) {
                __m256 kv[2];
                UNROLL for (int j = 0; j < KC; j++)
                    kv[j] = _mm256_mul_ps(sc[j], _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                     _mm_loadl_epi64((const __m128i *)(b[j] + 2 + 8 * h)))));
                pf_v_line(pf, c, i);
                UNROLL for (int r = 0; r < NR; r++) {
                    const __m256 qv = _mm256_loadu_ps(q + r * dk + d + 8 * h);
                    UNROLL for (int j = 0; j < KC; j++) acc[j][r] = _mm256_fmadd_ps(qv, kv[j], acc[j][r]);
                }
            }
        }
    } else {
        for (int64_t d = 0; d < dk; d += 8, i++) {
            const int64_t left = dk - d < 8 ? dk - d : 8;
            __m256 kv[2];
            UNROLL for (int j = 0; j < KC; j++) kv[j] = load_row(DT, kr[j], d, left);
            pf_v_line(pf, c, i);
            UNROLL for (int r = 0; r < NR; r++) {
                const __m256 qv = load_row(ATTN_F32, q + r * dk, d, left);
                UNROLL for (int j = 0; j < KC; j++) acc[j][r] = _mm256_fmadd_ps(qv, kv[j], acc[j][r]);
            }
        }
    }
    for (; i < pf->lines_v; i++) pf_v_line(pf, c, i);
    const __m256 h01 = _mm256_hadd_ps(acc[0][0], acc[0][1]), h23 = _mm256_hadd_ps(acc[0][2], acc[0][3]);
    const __m256 h45 = _mm256_hadd_ps(acc[1][0], acc[1][1]), h67 = _mm256_hadd_ps(acc[1][2], acc[1][3]);
    const __m256 a = _mm256_hadd_ps(h01, h23), b = _mm256_hadd_ps(h45, h67);
    const __m256 z = _mm256_mul_ps(scale, _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20),
                                                        _mm256_permute2f128_ps(a, b, 0x31)));
    if (KC == 2) return z;
    return _mm256_blend_ps(z, _mm256_set1_ps(-INFINITY), 0xF0);
}

enum { DEC_HALVES_MAX_DK = 256 };

/* the rows q (NR x dk, dk a multiple of 16) with each 16 columns as 8 even, 8 odd */
INLINE void split_halves(int NR, int64_t dk, const float *q, float *qh) {
    for (int r = 0; r < NR; r++)
        for (int64_t d = 0; d < dk; d += 16)
            for (int x = 0; x < 8; x++) {
                qh[r * dk + d + x] = q[r * dk + d + 2 * x];
                qh[r * dk + d + 8 + x] = q[r * dk + d + 2 * x + 1];
            }
}

/* The tile's logits for NR rows, 2 keys a vector (lane 4c + r; lanes of a key past nk
 * -inf) into s; *mx gets their lane-wise max, *nan the lanes that saw a NaN. Key c at
 * k + c * ldk, or at rows[c] where rows is given (decode_rows). The one Q·Kᵀ of the
 * decoding step, for decode, decode_rows and decode_qk alike. */
INLINE void dec_logits(int DT, int NR, int64_t nk, int64_t dk, const float *q, const char *k,
                        int64_t ldk, const char *const *rows, float scale, float *s,
                        const attn_decode_pf *pf, __m256 *mx, __m256 *nan) {
    const __m256 vscale = _mm256_set1_ps(scale);
    const bool halves = DT == ATTN_BF16 && dk % 16 == 0 && dk <= DEC_HALVES_MAX_DK;
    float qh[4 * DEC_HALVES_MAX_DK];
    if (halves) split_halves(NR, dk, q, qh);
    *mx = _mm256_set1_ps(-INFINITY);
    *nan = _mm256_setzero_ps();
    for (int64_t c = 0; c < nk; c += 2) {
        __m256 z;
        const char *kr[2] = {rows ? rows[c] : k + c * ldk, NULL};
        if (c + 1 < nk) kr[1] = rows ? rows[c + 1] : kr[0] + ldk;
        if (halves)
            z = c + 2 <= nk ? dec_qk4(DT, true, NR, 2, dk, qh, kr, vscale, pf, c)
                            : dec_qk4(DT, true, NR, 1, dk, qh, kr, vscale, pf, c);
        else
            z = c + 2 <= nk ? dec_qk4(DT, false, NR, 2, dk, q, kr, vscale, pf, c)
                            : dec_qk4(DT, false, NR, 1, dk, q, kr, vscale, pf, c);
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

/* acc rows 0..NR-1, value columns d0..d0+15 (nd of them), from the compact p (key c of
 * row r at s[4c + r]; its V row at v + c * ldv, or vrows[c] where vrows is given); lines
 * [i0, i1) of the next tile's K row c asked for with key c */
INLINE void dec_pv(int DT, int NR, int64_t nk, const float *s, const char *v, int64_t ldv,
                    const char *const *vrows, int64_t d0, int64_t nd, const float *alpha,
                    float *acc, int64_t dv, const attn_decode_pf *pf, int64_t i0, int64_t i1) {
    __m256 t[4][2];
    UNROLL for (int r = 0; r < 4; r++) t[r][0] = t[r][1] = _mm256_setzero_ps();
    const int64_t n0 = nd < 8 ? nd : 8, n1 = nd - n0;
    /* a bfloat16 V by halves when the pass is 16 columns wide: t[r][0] sums the even
     * columns, t[r][1] the odd ones, put back in order once, below */
    const bool halves = DT == ATTN_BF16 && nd == 16;
    for (int64_t c = 0; c < nk; c++) {
        const char *row = vrows ? vrows[c] : v + c * ldv;
        __m256 v0, v1;
        if (halves) {
            const __m256i raw = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + d0));
            v0 = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
            v1 = _mm256_castsi256_ps(_mm256_and_si256(raw, _mm256_set1_epi32((int)0xFFFF0000u)));
        } else if (DT == ATTN_Q8_0) {  // dv a multiple of 32: the 16 columns in one block,
            const uint8_t *b = (const uint8_t *)row + d0 / ATTN_Q8_0_BLOCK * ATTN_Q8_0_BYTES;
            const __m256 sc = _mm256_set1_ps(_cvtsh_ss((unsigned short)(b[0] | b[1] << 8)));
            const __m128i q16 = _mm_loadu_si128((const __m128i *)(b + 2 + d0 % ATTN_Q8_0_BLOCK));
            /* its scale converted once for both halves, each product as load_row's */
            v0 = _mm256_mul_ps(sc, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q16)));
            v1 = _mm256_mul_ps(sc, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q16, 8))));
        } else {
            v0 = load_row(DT, row, d0, n0);
            v1 = n1 > 0 ? load_row(DT, row, d0 + 8, n1) : _mm256_setzero_ps();
        }
        if (pf->k && c < pf->nk)
            for (int64_t i = i0; i < i1; i++)
                _mm_prefetch((pf->k_rows ? pf->k_rows[c] : pf->k + c * pf->ldk) + 64 * i, _MM_HINT_T2);
        UNROLL for (int r = 0; r < NR; r++) {
            const __m256 pb = _mm256_set1_ps(s[4 * c + r]);
            t[r][0] = _mm256_fmadd_ps(pb, v0, t[r][0]);
            t[r][1] = _mm256_fmadd_ps(pb, v1, t[r][1]);
        }
    }
    if (halves)
        UNROLL for (int r = 0; r < NR; r++) {
            const __m256 lo = _mm256_unpacklo_ps(t[r][0], t[r][1]), hi = _mm256_unpackhi_ps(t[r][0], t[r][1]);
            t[r][0] = _mm256_permute2f128_ps(lo, hi, 0x20);
            t[r][1] = _mm256_permute2f128_ps(lo, hi, 0x31);
        }
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
 * where those are given (decode_rows); the same arithmetic either way */
INLINE void decode_tile(int DT, int NR, bool round_p, int64_t nk, int64_t dk, int64_t dv,
                             const float *q, const char *k, int64_t ldk, const char *v,
                             int64_t ldv, const char *const *k_rows, const char *const *v_rows,
                             float scale, float *s, float *m, float *l,
                             float *alpha, float *acc, const attn_decode_pf *pf) {
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
    const int64_t nv = (nk + 1) / 2;
    __m256 mx, nan;
    dec_logits(DT, NR, nk, dk, q, k, ldk, k_rows, scale, s, pf, &mx, &nan);
    /* the online-softmax update of softmax_avx2, on the compact layout */
    const __m256 m_old = _mm256_broadcast_ps((const __m128 *)m);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(m_old, m_old, _CMP_UNORD_Q));
    nan = _mm256_or_ps(nan, _mm256_permute2f128_ps(nan, nan, 0x01));
    __m256 m_new = _mm256_max_ps(m_old, rows_max(mx));
    m_new = _mm256_blendv_ps(m_new, _mm256_set1_ps(NAN), nan);
    const __m256 shift = _mm256_blendv_ps(m_new, _mm256_setzero_ps(), _mm256_cmp_ps(m_new, neg_inf, _CMP_EQ_OQ));
    __m256 sum = _mm256_setzero_ps();
    for (int64_t x = 0; x < nv; x++) {
        const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + 8 * x), shift));
        /* FAST precision: P rounded to bfloat16 for P V, the sum l of the float32 p */
        _mm256_storeu_ps(s + 8 * x, round_p ? round_bf16(e) : e);
        sum = _mm256_add_ps(sum, e);
    }
    const __m256 a = exp_avx2(_mm256_sub_ps(m_old, shift));
    const __m128 l_new = _mm_fmadd_ps(_mm_loadu_ps(l), _mm256_castps256_ps128(a),
                                      _mm256_castps256_ps128(rows_sum(sum)));
    _mm_storeu_ps(alpha, _mm256_castps256_ps128(a));
    _mm_storeu_ps(l, l_new);
    _mm_storeu_ps(m, _mm256_castps256_ps128(m_new));
    /* P V, 16 columns a pass; the next tile's K lines shared out over the passes */
    const int64_t passes = (dv + 15) / 16;
    for (int64_t p = 0; p < passes; p++) {
        const int64_t d0 = 16 * p, nd = dv - d0 < 16 ? dv - d0 : 16;
        dec_pv(DT, NR, nk, s, v, ldv, v_rows, d0, nd, alpha, acc, dv, pf, p * pf->lines_k / passes,
                (p + 1) * pf->lines_k / passes);
    }
}

#define DECODE_AVX2(DT)                                                                       \
    switch (n) {                                                                              \
    case 1: decode_tile(DT, 1, round_p, nk, dk, dv, q, kb, ldkb, vb, ldvb, kr, vr, scale, s, m, l, alpha, acc, &pf); break; \
    case 2: decode_tile(DT, 2, round_p, nk, dk, dv, q, kb, ldkb, vb, ldvb, kr, vr, scale, s, m, l, alpha, acc, &pf); break; \
    case 3: decode_tile(DT, 3, round_p, nk, dk, dv, q, kb, ldkb, vb, ldvb, kr, vr, scale, s, m, l, alpha, acc, &pf); break; \
    default: decode_tile(DT, 4, round_p, nk, dk, dv, q, kb, ldkb, vb, ldvb, kr, vr, scale, s, m, l, alpha, acc, &pf); break; \
    }

static void decode_avx2(int64_t n, int64_t nk, int64_t dk, int64_t dv, const float *q,
                        attn_dtype dt, bool round_p, const void *k, int64_t ldk, const void *v,
                        int64_t ldv, float scale, float *s, float *m, float *l, float *alpha,
                        float *acc, bool prefetch, const void *next_k, int64_t next_nk) {
    const int64_t es = attn_elem_bytes(dt);
    const char *kb = (const char *)k, *vb = (const char *)v;
    const int64_t ldkb = attn_row_byte_offset(dt, ldk), ldvb = attn_row_byte_offset(dt, ldv);
    attn_decode_pf pf = attn_decode_pf_make(prefetch, v, ldv, nk, dv, next_k, ldk, next_nk, dk, es);
    const char *const *kr = NULL, *const *vr = NULL;  // at one stride
    if (dt == ATTN_Q8_0) {  // rows of blocks: strides and lines in bytes of blocks
        pf.ldv = ldvb, pf.ldk = ldkb;
        pf.lines_v = (attn_row_bytes(dt, dv) + 63) / 64, pf.lines_k = (attn_row_bytes(dt, dk) + 63) / 64;
        DECODE_AVX2(ATTN_Q8_0);
        return;
    }
    ATTN_KV_DTYPE_SWITCH(dt, DECODE_AVX2);
}

/* decode_avx2's logits alone (kernels.h: decode_qk), for the weights' sweep */
static void decode_qk_avx2(int64_t n, int64_t nk, int64_t dk, const float *q, attn_dtype dt,
                           const void *k, int64_t ldk, float scale, float *st, int64_t lds) {
    const attn_decode_pf none = {0};
    float s[4 * (ATTN_BK_LIMIT + 4)];  // the step's compact lanes, then into st
    const char *kb = (const char *)k;
    const int64_t ldkb = attn_row_byte_offset(dt, ldk);
    __m256 mx, nan;
#define LOGITS(DT)                                                                              \
    switch (n) {                                                                                \
    case 1: dec_logits(DT, 1, nk, dk, q, kb, ldkb, NULL, scale, s, &none, &mx, &nan); break;    \
    case 2: dec_logits(DT, 2, nk, dk, q, kb, ldkb, NULL, scale, s, &none, &mx, &nan); break;    \
    case 3: dec_logits(DT, 3, nk, dk, q, kb, ldkb, NULL, scale, s, &none, &mx, &nan); break;    \
    default: dec_logits(DT, 4, nk, dk, q, kb, ldkb, NULL, scale, s, &none, &mx, &nan); break;   \
    }
    if (dt == ATTN_Q8_0) LOGITS(ATTN_Q8_0)
    else ATTN_KV_DTYPE_SWITCH(dt, LOGITS);
#undef LOGITS
    attn_decode_qk_store(n, nk, s, st, lds);
}

/* decode_avx2 on rows given by their addresses (kernels.h: decode_rows): a paged tile's
 * rows read in place from their pages, in one step */
static void decode_rows_avx2(int64_t n, int64_t nk, int64_t dk, int64_t dv, const float *q,
                             attn_dtype dt, bool round_p, const char *const *kr,
                             const char *const *vr, float scale, float *s, float *m, float *l,
                             float *alpha, float *acc, bool prefetch,
                             const char *const *next_kr, int64_t next_nk) {
    const int64_t es = attn_elem_bytes(dt);
    const char *kb = kr[0], *vb = vr[0];
    const int64_t ldkb = 0, ldvb = 0;  // unused: every row from kr, vr
    attn_decode_pf pf = attn_decode_pf_make(prefetch, vr[0], 0, nk, dv,
                                            next_nk > 0 ? next_kr[0] : NULL, 0, next_nk, dk, es);
    pf.v_rows = vr, pf.k_rows = next_kr;
    if (dt == ATTN_Q8_0) {  // rows of blocks: lines in bytes of blocks
        pf.lines_v = (attn_row_bytes(dt, dv) + 63) / 64, pf.lines_k = (attn_row_bytes(dt, dk) + 63) / 64;
        DECODE_AVX2(ATTN_Q8_0);
        return;
    }
    ATTN_KV_DTYPE_SWITCH(dt, DECODE_AVX2);
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
    .qk = qk_avx2,
    .softmax = softmax_avx2,
    .pv = pv_avx2,
    .mask_bool = mask_bool_avx2,
    .to_f32 = to_f32_avx2,
    .decode = decode_avx2,
    .decode_qk = decode_qk_avx2,
    .exp = exp_array_avx2,
    .additive = &attn_additive_kernels_avx2,
    .dequant_q8_0 = dequant_q8_0_avx2,
    .decode_q8_0 = true,
    .dropout = dropout_avx2,
    .gemm = attn_gemm_avx2,
    .decode_rows = decode_rows_avx2,
    .pv_h = pv_h_avx2,
};
#endif
