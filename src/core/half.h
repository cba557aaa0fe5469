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
#include <stdbool.h>
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

/* ---- the fp8 cache dtypes (attn.h; OCP 8-bit floating point) ----------------------------
 * To float32: exact (every fp8 value is a float32). From float32: round to nearest even,
 * saturating: a finite value beyond the largest, and an infinity, become +-largest; NaN
 * becomes the format's NaN with the sign kept. Both are bit arithmetic on the float32,
 * as for float16 above: round at the first bit dropped, rebias the exponent, and below
 * the format's normal range scale by a power of two (exact) and let nearbyintf round to
 * even (a result of 2^m is the smallest normal, which the bits then spell right). */

/* E4M3FN: sign, exponent 4 bits (bias 7), mantissa 3 bits; S.1111.111 is NaN, no inf */
static inline float attn_e4m3_to_f32(uint8_t x) {
    const uint32_t sign = (uint32_t)(x & 0x80u) << 24, e = (x >> 3) & 0xFu, m = x & 7u;
    if ((x & 0x7Fu) == 0x7Fu) return attn_bits_f32(sign | 0x7FC00000u);
    if (e != 0) return attn_bits_f32(sign | ((e + 120u) << 23) | (m << 20));
    return attn_bits_f32(sign | attn_f32_bits((float)m * 0x1p-9f));  // subnormal or 0
}

static inline uint8_t attn_f32_to_e4m3(float f) {
    const uint32_t x = attn_f32_bits(f), ax = x & 0x7FFFFFFFu;
    const uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
    if (ax > 0x7F800000u) return (uint8_t)(sign | 0x7Fu);   // NaN
    if (ax >= 0x43E00000u) return (uint8_t)(sign | 0x7Eu);  // >= 448, inf: 448
    if (ax >= 0x3C800000u) {  // normal (>= 2^-6): round at bit 20, rebias 127 -> 7
        const uint32_t c = (ax + 0x7FFFFu + ((ax >> 20) & 1u) - 0x3C000000u) >> 20;
        return (uint8_t)(sign | (c > 0x7Eu ? 0x7Eu : c));  // 464 and above round past 448
    }
    return (uint8_t)(sign | (uint8_t)nearbyintf(attn_bits_f32(ax) * 0x1p9f));  // units of 2^-9
}

/* E5M2: the top byte of a float16 (bias 15, mantissa 2 bits, inf and NaN as IEEE) */
static inline float attn_e5m2_to_f32(uint8_t x) { return attn_f16_to_f32((uint16_t)(x << 8)); }

static inline uint8_t attn_f32_to_e5m2(float f) {
    const uint32_t x = attn_f32_bits(f), ax = x & 0x7FFFFFFFu;
    const uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
    if (ax > 0x7F800000u) return (uint8_t)(sign | 0x7Eu);   // NaN (quiet)
    if (ax >= 0x47600000u) return (uint8_t)(sign | 0x7Bu);  // >= 57344, inf: 57344
    if (ax >= 0x38800000u) {  // normal (>= 2^-14): round at bit 21, rebias 127 -> 15
        const uint32_t c = (ax + 0xFFFFFu + ((ax >> 21) & 1u) - 0x38000000u) >> 21;
        return (uint8_t)(sign | (c > 0x7Bu ? 0x7Bu : c));  // 61440 and above round past
    }
    return (uint8_t)(sign | (uint8_t)nearbyintf(attn_bits_f32(ax) * 0x1p16f));  // units of 2^-16
}

static inline bool attn_is_fp8(attn_dtype dt) { return dt == ATTN_FP8_E4M3 || dt == ATTN_FP8_E5M2; }

/* Whether an fp8 decoding step may move the factor sc off the cached values onto the
 * other factor (the query or p) with the same bits: sc (the head's scale, times 2^8 for
 * e4m3, whose bytes are read as x / 2^8) a power of two from 1 to 2^64. Then x · sc is
 * exact for every value x (at most 57344 · 2^64: no overflow; at least 2^-24 · 1: no
 * loss) and so is f · sc for the other factor f (p in [0, 1]; a query of magnitude at
 * most 2^60, which the step checks), so fma(f · sc, x, a) is fma(f, x · sc, a) in every
 * bit. The AVX-512 step's rule (docs/KERNELS.md) and bench/decode_bound.h's model of it. */
static inline bool attn_fp8_factor_folds(float sc) {
    int e;
    return sc >= 1.0f && sc <= 0x1p64f && frexpf(sc, &e) == 0.5f;
}

/* the value of byte x of fp8 dtype dt (e5m2 unless dt is e4m3) */
static inline float attn_fp8_to_f32(attn_dtype dt, uint8_t x) {
    return dt == ATTN_FP8_E4M3 ? attn_e4m3_to_f32(x) : attn_e5m2_to_f32(x);
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
    case ATTN_Q4_0: {  // d * (nibble - 8): an 11-bit by 4-bit product, exact in float32
        const int64_t blk = idx / 32 - (idx % 32 < 0), pos = idx - blk * 32;
        const uint8_t *b = (const uint8_t *)base + blk * 18;
        const int q = pos < 16 ? (b[2 + pos] & 0x0F) : (b[2 + pos - 16] >> 4);
        return attn_f16_to_f32((uint16_t)(b[0] | b[1] << 8)) * (float)(q - 8);
    }
    /* fp8: the byte's own value; its scale is the caller's (attn_kv_scale) */
    case ATTN_FP8_E4M3: return attn_e4m3_to_f32(((const uint8_t *)base)[idx]);
    case ATTN_FP8_E5M2: return attn_e5m2_to_f32(((const uint8_t *)base)[idx]);
    default: return NAN;
    }
}

static inline void attn_store(attn_dtype dt, void *base, int64_t idx, float x) {
    switch (dt) {
    case ATTN_F32: ((float *)base)[idx] = x; break;
    case ATTN_F16: ((uint16_t *)base)[idx] = attn_f32_to_f16(x); break;
    case ATTN_BF16: ((uint16_t *)base)[idx] = attn_f32_to_bf16(x); break;
    case ATTN_FP8_E4M3: ((uint8_t *)base)[idx] = attn_f32_to_e4m3(x); break;
    case ATTN_FP8_E5M2: ((uint8_t *)base)[idx] = attn_f32_to_e5m2(x); break;
    default: break;
    }
}

/* The float64 paths' access (fused_f64.c, reference.c): element idx as double, exact
 * for every floating dtype (float64 itself, or a float32/16-bit value widened); and x
 * stored to dt: as it is for float64, else rounded to float32 first and then to dt, as
 * attn_store does (the reference's rounding of its float64 results, unchanged). */
static inline double attn_load_f64(attn_dtype dt, const void *base, int64_t idx) {
    if (dt == ATTN_F64) return ((const double *)base)[idx];
    return (double)attn_load(dt, base, idx);
}

static inline void attn_store_f64(attn_dtype dt, void *base, int64_t idx, double x) {
    if (dt == ATTN_F64)
        ((double *)base)[idx] = x;
    else
        attn_store(dt, base, idx, (float)x);
}

#endif /* ATTN_HALF_H */
