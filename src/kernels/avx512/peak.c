/*
 * peak.c (avx512) — the AVX-512F loops of kernels/peak.h: the fp32 FMA peak on zmm
 * registers and the read bandwidth with 64-byte loads.
 *
 * Only this file is compiled with AVX-512 flags (its line of kernels/list.h);
 * `attn bench` calls it only where attn_kernel_supported("avx512") is true. It is a
 * measuring loop, not a kernel: nothing here is used by the library.
 */
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "kernels/peak.h"

/* 24 independent accumulator chains (of the 32 zmm registers; x and y take two more):
 * far more than latency x throughput needs on current cores (4 cycles x 2 pipes = 8),
 * so the loop is bound by FMA throughput alone. acc = acc * x + y with x just under 1
 * converges to y / (1 - x): no overflow, no subnormals. */
enum { NACC = 24 };

static double fma_avx512(int64_t iters, float seed) {
    __m512 acc[NACC];
    _Pragma("GCC unroll 24")
    for (int a = 0; a < NACC; a++) acc[a] = _mm512_set1_ps(seed + (float)a * 1e-3f);
    const __m512 x = _mm512_set1_ps(0.9999999f), y = _mm512_set1_ps(seed * 1e-7f);
    for (int64_t i = 0; i < iters; i++) {
        _Pragma("GCC unroll 24")
        for (int a = 0; a < NACC; a++) acc[a] = _mm512_fmadd_ps(acc[a], x, y);
    }
    __m512 s = acc[0];
    for (int a = 1; a < NACC; a++) s = _mm512_add_ps(s, acc[a]);
    return (double)_mm512_reduce_add_ps(s);
}

/* Four accumulators of 16 floats, 64 floats (256 bytes) a round. */
static double read_avx512(const float *p, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (int64_t i = 0; i < n; i += 64) {
        s0 = _mm512_add_ps(s0, _mm512_load_ps(p + i));
        s1 = _mm512_add_ps(s1, _mm512_load_ps(p + i + 16));
        s2 = _mm512_add_ps(s2, _mm512_load_ps(p + i + 32));
        s3 = _mm512_add_ps(s3, _mm512_load_ps(p + i + 48));
    }
    return (double)_mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

const bench_loops attn_peak_avx512 = {"avx512", "fp32 FMA", fma_avx512, (int64_t)NACC * 16 * 2, read_avx512};
#endif
