/*
 * peak.c (avx512bf16) — the AVX512-BF16 loop of kernels/peak.h: the peak of
 * vdpbf16ps, bfloat16 pairs multiplied and summed into float32,
 * the instruction of the bfloat16 kernels.
 *
 * Only this file is compiled with AVX512-BF16 flags (its line of kernels/list.h);
 * `attn bench` calls it only where attn_kernel_supported("avx512bf16") is true. It is not
 * an fp32 FMA figure and `attn bench` reports it apart (percent of peak of the float32 rows
 * is taken against the fp32 FMA peak). Nothing here is used by the library.
 */
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "kernels/peak.h"

/* 24 independent chains, as in the avx512 peak.c. One vdpbf16ps does 16 lanes x 2 pairs:
 * 32 multiplies and 32 adds, 64 flops. The accumulators grow by 2e-6 a round: no overflow. */
enum { NACC = 24 };

static double dot_bf16(int64_t iters, float seed) {
    __m512 acc[NACC];
    _Pragma("GCC unroll 24")
    for (int a = 0; a < NACC; a++) acc[a] = _mm512_set1_ps(seed + (float)a * 1e-3f);
    const __m512bh x = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(seed * 1e-3f));
    const __m512bh y = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
    for (int64_t i = 0; i < iters; i++) {
        _Pragma("GCC unroll 24")
        for (int a = 0; a < NACC; a++) acc[a] = _mm512_dpbf16_ps(acc[a], x, y);
    }
    __m512 s = acc[0];
    for (int a = 1; a < NACC; a++) s = _mm512_add_ps(s, acc[a]);
    return (double)_mm512_reduce_add_ps(s);
}

/* The read loop is the AVX-512 one's: loads do not change with the arithmetic. */
static double read_bf16(const float *p, int64_t n) { return attn_peak_avx512.read(p, n); }

const bench_loops attn_peak_avx512bf16 = {"avx512bf16", "bf16 dot (vdpbf16ps)", dot_bf16,
                                            (int64_t)NACC * 64, read_bf16};
#endif
