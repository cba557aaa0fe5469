/*
 * peak.c (avx2) — the AVX2+FMA loops of kernels/peak.h: the fp32 FMA peak on ymm
 * registers and the read bandwidth with 32-byte loads.
 *
 * Only this file is compiled with AVX2 flags (its line of kernels/list.h); `attn
 * bench` calls it only where attn_kernel_supported("avx2") is true. It is a measuring
 * loop, not a kernel: nothing here is used by the library.
 */
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "kernels/peak.h"

/* 12 independent accumulator chains: with x and y, 14 of the 16 ymm registers, so
 * nothing spills, and still more chains than latency x throughput (4 x 2 = 8) needs. */
enum { NACC = 12 };

static double fma_avx2(int64_t iters, float seed) {
    __m256 acc[NACC];
    _Pragma("GCC unroll 12")
    for (int a = 0; a < NACC; a++) acc[a] = _mm256_set1_ps(seed + (float)a * 1e-3f);
    const __m256 x = _mm256_set1_ps(0.9999999f), y = _mm256_set1_ps(seed * 1e-7f);
    for (int64_t i = 0; i < iters; i++) {
        _Pragma("GCC unroll 12")
        for (int a = 0; a < NACC; a++) acc[a] = _mm256_fmadd_ps(acc[a], x, y);
    }
    __m256 s = acc[0];
    for (int a = 1; a < NACC; a++) s = _mm256_add_ps(s, acc[a]);
    float lanes[8];
    _mm256_storeu_ps(lanes, s);
    double t = 0.0;
    for (int l = 0; l < 8; l++) t += lanes[l];
    return t;
}

/* Four accumulators of 8 floats, two rounds of them per 64 floats. */
static double read_avx2(const float *p, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (int64_t i = 0; i < n; i += 64) {
        s0 = _mm256_add_ps(s0, _mm256_load_ps(p + i));
        s1 = _mm256_add_ps(s1, _mm256_load_ps(p + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_load_ps(p + i + 16));
        s3 = _mm256_add_ps(s3, _mm256_load_ps(p + i + 24));
        s0 = _mm256_add_ps(s0, _mm256_load_ps(p + i + 32));
        s1 = _mm256_add_ps(s1, _mm256_load_ps(p + i + 40));
        s2 = _mm256_add_ps(s2, _mm256_load_ps(p + i + 48));
        s3 = _mm256_add_ps(s3, _mm256_load_ps(p + i + 56));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    double t = 0.0;
    for (int l = 0; l < 8; l++) t += lanes[l];
    return t;
}

const bench_loops attn_peak_avx2 = {"avx2", "fp32 FMA", fma_avx2, (int64_t)NACC * 8 * 2, read_avx2};
#endif
