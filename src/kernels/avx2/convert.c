/*
 * avx2/convert.c — float32 rows rounded to float16 or bfloat16 (kernels.h: from_f32), for
 *                  the forward's 16-bit output rows.
 *
 * Eight floats a step, bit for bit half.h's scalar roundings, which the tail takes:
 * - float16 by F16C's vcvtps2ph with the rounding in the immediate (to nearest, ties to
 *   even): infinity from 65520 up, subnormal results rounded, NaN quieted with its top
 *   mantissa bits kept (sign | 0x7E00 | m >> 13), as attn_f32_to_f16. The MXCSR is not
 *   consulted for the rounding, and the library never sets its FTZ or DAZ bits.
 * - bfloat16 by the integer form of attn_f32_to_bf16: x + 0x7FFF + (bit 16 of x), the
 *   high half; a NaN its high half with the quiet bit set.
 * Not the 16-bit loads (to_f32 in kernels.c), nor the reference's stores.
 */
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "half.h"
#include "kernels.h"

static inline __m128i bf16x8(__m256 f) {
    const __m256i x = _mm256_castps_si256(f);
    const __m256i ax = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF));
    const __m256i nan = _mm256_cmpgt_epi32(ax, _mm256_set1_epi32(0x7F800000));  // ax <= 0x7FFFFFFF: signed compare holds
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), odd), 16);
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x0040));
    const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
    /* 8 results in the low halves of 32-bit lanes: packed to 16 bits (each < 65536) */
    const __m256i packed = _mm256_packus_epi32(r, r);  // lanes 0-3 | 0-3, 4-7 | 4-7
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

void attn_from_f32_avx2(attn_dtype dt, int64_t n, const float *src, uint16_t *dst) {
    int64_t i = 0;
    if (dt == ATTN_F16) {
        for (; i + 8 <= n; i += 8)
            _mm_storeu_si128((__m128i *)(dst + i),
                             _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
        for (; i < n; i++) dst[i] = attn_f32_to_f16(src[i]);
    } else {
        for (; i + 8 <= n; i += 8) _mm_storeu_si128((__m128i *)(dst + i), bf16x8(_mm256_loadu_ps(src + i)));
        for (; i < n; i++) dst[i] = attn_f32_to_bf16(src[i]);
    }
}
#endif
