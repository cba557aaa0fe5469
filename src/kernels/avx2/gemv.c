/*
 * avx2/gemv.c — the AVX2 loops of the decoding step's one-row products over a bfloat16
 *               weight read in place (mha_gemv.c's rows and dots loops).
 *
 * Eight rows at a time (then four, then one): each 8-column piece of acc is loaded
 * once, the rows' products added into it in row order, stored once (an eighth of the
 * one-row loop's traffic through L1), and the rows stream side by side, each
 * contiguous. Eight beat four in an interleaved A/B of the two (the commit that chose
 * it has the figures). A
 * bfloat16 widens to float32 by its bits: zero-extend to 32 bits, shift left by 16.
 * Products and sums are separate roundings (no fused multiply-add), in the portable
 * loop's order, so the result is that loop's bit for bit on every kernel. Memory-bound:
 * the arithmetic is a few instructions per 16 bytes of weight. The dots loop (each
 * output the dot product of a contiguous row, PyTorch's [out, in] weights): four rows
 * at a time, one ymm of eight lanes each, as the portable loop's lanes.
 * Compiled only with this folder's AVX2 flags; mha_gemv.c calls it only where the
 * selected kernel is avx2 or wider.
 */
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "gemv.h"

static inline __m256 widen8(const uint16_t *p) {
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline float widen1(uint16_t h) {
    const __m128i v = _mm_cvtsi32_si128((int)((uint32_t)h << 16));
    return _mm_cvtss_f32(_mm_castsi128_ps(v));
}

/* acc += Σ_{k < K} a[r + k] · row_{r + k}, rows r .. r + K - 1, each 8-column piece of
 * acc loaded and stored once, the K products added in row order */
static inline __attribute__((always_inline)) void rows_pass(int K, float *acc, const uint16_t *w,
                                                            int64_t ld, int64_t r, int64_t n,
                                                            const float *a) {
    const uint16_t *p[8];
    __m256 av[8];
#pragma GCC unroll 8
    for (int k = 0; k < K; k++) p[k] = w + (r + k) * ld, av[k] = _mm256_set1_ps(a[r + k]);
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m256 s0 = _mm256_loadu_ps(acc + j), s1 = _mm256_loadu_ps(acc + j + 8);
#pragma GCC unroll 8
        for (int k = 0; k < K; k++) {
            s0 = _mm256_add_ps(s0, _mm256_mul_ps(av[k], widen8(p[k] + j)));
            s1 = _mm256_add_ps(s1, _mm256_mul_ps(av[k], widen8(p[k] + j + 8)));
        }
        _mm256_storeu_ps(acc + j, s0);
        _mm256_storeu_ps(acc + j + 8, s1);
    }
    for (; j + 8 <= n; j += 8) {
        __m256 s0 = _mm256_loadu_ps(acc + j);
#pragma GCC unroll 8
        for (int k = 0; k < K; k++) s0 = _mm256_add_ps(s0, _mm256_mul_ps(av[k], widen8(p[k] + j)));
        _mm256_storeu_ps(acc + j, s0);
    }
    for (; j < n; j++) {
        float t = acc[j];
        for (int k = 0; k < K; k++) t += a[r + k] * widen1(p[k][j]);
        acc[j] = t;
    }
}

void ai_gemv_rows_bf16_avx2(float *acc, const uint16_t *w, int64_t ld, int64_t r0, int64_t r1,
                            int64_t n, const float *a) {
    int64_t r = r0;
    for (; r + 8 <= r1; r += 8) rows_pass(8, acc, w, ld, r, n, a);
    for (; r + 4 <= r1; r += 4) rows_pass(4, acc, w, ld, r, n, a);
    for (; r < r1; r++) rows_pass(1, acc, w, ld, r, n, a);
}

/* the portable dots loop's lanes: element j of the row into lane j mod 8 (the tail's
 * elements into lanes 0 ..), each lane's products rounded then added in order, the
 * lanes combined ((0+4)+(1+5))+((2+6)+(3+7)) */
static inline float dot_finish(__m256 s, const uint16_t *row, const float *a, int64_t j, int64_t n) {
    float l[8];
    _mm256_storeu_ps(l, s);
    for (int k = 0; j < n; j++, k++) l[k] += widen1(row[j]) * a[j];
    return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

void ai_gemv_dots_bf16_avx2(float *dot, const uint16_t *w, int64_t ld, int64_t r0, int64_t r1,
                            int64_t n, const float *a) {
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) {  /* four rows side by side: four chains of additions */
        const uint16_t *w0 = w + r * ld, *w1 = w0 + ld, *w2 = w1 + ld, *w3 = w2 + ld;
        __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
        int64_t j = 0;
        for (; j + 8 <= n; j += 8) {
            const __m256 x = _mm256_loadu_ps(a + j);
            s0 = _mm256_add_ps(s0, _mm256_mul_ps(widen8(w0 + j), x));
            s1 = _mm256_add_ps(s1, _mm256_mul_ps(widen8(w1 + j), x));
            s2 = _mm256_add_ps(s2, _mm256_mul_ps(widen8(w2 + j), x));
            s3 = _mm256_add_ps(s3, _mm256_mul_ps(widen8(w3 + j), x));
        }
        dot[r - r0] = dot_finish(s0, w0, a, j, n);
        dot[r - r0 + 1] = dot_finish(s1, w1, a, j, n);
        dot[r - r0 + 2] = dot_finish(s2, w2, a, j, n);
        dot[r - r0 + 3] = dot_finish(s3, w3, a, j, n);
    }
    for (; r < r1; r++) {
        const uint16_t *wr = w + r * ld;
        __m256 s0 = _mm256_setzero_ps();
        int64_t j = 0;
        for (; j + 8 <= n; j += 8)
            s0 = _mm256_add_ps(s0, _mm256_mul_ps(widen8(wr + j), _mm256_loadu_ps(a + j)));
        dot[r - r0] = dot_finish(s0, wr, a, j, n);
    }
}
#endif
