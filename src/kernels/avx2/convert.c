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
 * Also the weights' store (rows_from_st): an S^T tile (key c's rows contiguous) written
 * out as rows, 8 rows x 8 keys a step through an 8 x 8 transpose in registers.
 */
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "core/half.h"
#include "kernels/kernels.h"

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

void ai_from_f32_avx2(attn_dtype dt, int64_t n, const float *src, uint16_t *dst) {
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

/* the 8 x 8 block at s (rows r .. r+7 of keys c .. c+7, key rows lds apart) into rows
 * out[0 .. 7] from column c */
static inline void st_block8(const float *s, int64_t lds, float *const *out, int64_t c) {
    __m256 x[8], y[8];
    for (int j = 0; j < 8; j++) x[j] = _mm256_loadu_ps(s + j * lds);
    for (int j = 0; j < 8; j += 2) {  // pairs of keys interleaved
        y[j] = _mm256_unpacklo_ps(x[j], x[j + 1]);
        y[j + 1] = _mm256_unpackhi_ps(x[j], x[j + 1]);
    }
    for (int j = 0; j < 8; j += 4) {  // four keys of two rows a 128-bit lane
        x[j] = _mm256_shuffle_ps(y[j], y[j + 2], 0x44);
        x[j + 1] = _mm256_shuffle_ps(y[j], y[j + 2], 0xEE);
        x[j + 2] = _mm256_shuffle_ps(y[j + 1], y[j + 3], 0x44);
        x[j + 3] = _mm256_shuffle_ps(y[j + 1], y[j + 3], 0xEE);
    }
    /* x[0..3]: rows 0, 1, 2, 3 (low lane) and 4, 5, 6, 7 (high lane) of keys 0-3; x[4..7]
     * the same of keys 4-7 */
    for (int r = 0; r < 4; r++) {
        _mm256_storeu_ps(out[r] + c, _mm256_permute2f128_ps(x[r], x[r + 4], 0x20));
        _mm256_storeu_ps(out[r + 4] + c, _mm256_permute2f128_ps(x[r], x[r + 4], 0x31));
    }
}

void ai_rows_from_st_avx2(int64_t n, int64_t nk, const float *s, int64_t lds, float *const *out) {
    int64_t r = 0;
    for (; r + 8 <= n; r += 8) {
        int64_t c = 0;
        for (; c + 8 <= nk; c += 8) st_block8(s + c * lds + r, lds, out + r, c);
        for (; c < nk; c++)
            for (int x = 0; x < 8; x++) out[r + x][c] = s[c * lds + r + x];
    }
    for (; r < n; r++)
        for (int64_t c = 0; c < nk; c++) out[r][c] = s[c * lds + r];
}
#endif
