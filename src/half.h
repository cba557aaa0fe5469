/*
 * half.h — scalar conversions between float32 and the 16-bit types, bit by bit.
 *
 * Every conversion to 16 bits rounds to nearest, ties to even; NaN stays NaN (quieted,
 * sign kept); float16 overflows to +-inf as IEEE says (|x| >= 65520), and values below
 * its normal range become float16 subnormals, correctly rounded. bfloat16 keeps float32's
 * exponent range, so only rounding and NaN need care. Conversions to float32 are exact.
 * The vector kernels use the CPU's own instructions (F16C, AVX512-BF16), which follow
 * the same rules; tests/test_half.c checks all 65536 patterns of each type both ways.
 */
#ifndef ATTN_HALF_H
#define ATTN_HALF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attn.h"

static inline uint32_t attn_f32_bits(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    return x;
}

static inline float attn_bits_f32(uint32_t x) {
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

static inline float attn_bf16_to_f32(uint16_t h) { return attn_bits_f32((uint32_t)h << 16); }

static inline uint16_t attn_f32_to_bf16(float f) {
    const uint32_t x = attn_f32_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((x >> 16) | 0x0040u);  // quiet NaN
    return (uint16_t)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

static inline float attn_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0x1F) return attn_bits_f32(sign | 0x7F800000u | (m << 13));
    if (e != 0) return attn_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
    return attn_bits_f32(sign | attn_f32_bits((float)m * 0x1p-24f));  // subnormal or 0
}

static inline uint16_t attn_f32_to_f16(float f) {
    const uint32_t x = attn_f32_bits(f), ax = x & 0x7FFFFFFFu;
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    if (ax > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));  // NaN
    if (ax >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);  // >= 65520: inf (RNE)
    if (ax >= 0x38800000u)  // normal: round at bit 13, then rebias the exponent 127 -> 15
        return (uint16_t)(sign | ((ax + 0x0FFFu + ((ax >> 13) & 1u) - 0x38000000u) >> 13));
    /* subnormal (or 0): in units of 2^-24; scaling by 2^24 is exact and nearbyintf rounds
     * to even. A result of 1024 is the smallest normal, which the bits spell right. */
    return (uint16_t)(sign | (uint16_t)nearbyintf(attn_bits_f32(ax) * 0x1p24f));
}

/* element idx (in elements) of a float32/float16/bfloat16 tensor, as float. Another
 * dtype never reaches here (the API refuses it first); were one added to the list and
 * not here, it would read as NaN and write nothing, never as some other dtype's bits. */
static inline float attn_load(attn_dtype dt, const void *base, int64_t idx) {
    switch (dt) {
    case ATTN_F32: return ((const float *)base)[idx];
    case ATTN_F16: return attn_f16_to_f32(((const uint16_t *)base)[idx]);
    case ATTN_BF16: return attn_bf16_to_f32(((const uint16_t *)base)[idx]);
    case ATTN_Q8_0: {  // d * qs: an 11-bit by 8-bit product, exact in float32
        const int64_t blk = idx / 32 - (idx % 32 < 0), pos = idx - blk * 32;
        const uint8_t *b = (const uint8_t *)base + blk * 34;
        return attn_f16_to_f32((uint16_t)(b[0] | b[1] << 8)) * (float)(int8_t)b[2 + pos];
    }
    default: return NAN;
    }
}

static inline void attn_store(attn_dtype dt, void *base, int64_t idx, float x) {
    switch (dt) {
    case ATTN_F32: ((float *)base)[idx] = x; break;
    case ATTN_F16: ((uint16_t *)base)[idx] = attn_f32_to_f16(x); break;
    case ATTN_BF16: ((uint16_t *)base)[idx] = attn_f32_to_bf16(x); break;
    default: break;
    }
}

#endif /* ATTN_HALF_H */
