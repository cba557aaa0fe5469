/*
 * q4_0.c — the q4_0 cache dtype's blocks: the quantization a cache append (or
 *          attn_quantize_q4_0) does once, and the portable dequantization attention and
 *          users read it back with. The tensor-level calls (attn_quantize_q4_0,
 *          attn_dequantize_q4_0) are q8_0.c's, which walks the tensors for both block
 *          dtypes with this file's block functions; the layout rule is core.c's.
 *
 * The format is llama.cpp's block_q4_0, byte for byte (attn.h): 18 bytes a block, the
 * float16 scale d little-endian in bytes 0-1, then 16 bytes qs; element i < 16 is the low
 * nibble of qs[i], element i + 16 its high nibble, each value d * (nibble - 8), exact in
 * float32 (an 11-bit by 4-bit product). The quantization follows the description of
 * llama.cpp's reference quantize_row_q4_0 (written here from it, not copied). No kernel
 * reads q4_0 itself: fused.c's kv_block converts a tile with ai_dequant_q4_0_blocks.
 */
#include <math.h>

#include "half.h"
#include "attn_internal.h"

void ai_dequant_q4_0_blocks(int64_t n, const uint8_t *src, float *dst) {
    for (int64_t c = 0; c < n; c++) {
        const uint8_t *b = src + c * ATTN_Q4_0_BYTES;
        const float d = attn_f16_to_f32((uint16_t)(b[0] | b[1] << 8));
        float *y = dst + c * ATTN_Q4_0_BLOCK;
        for (int i = 0; i < 16; i++) {
            y[i] = d * (float)((b[2 + i] & 0x0F) - 8);
            y[i + 16] = d * (float)((b[2 + i] >> 4) - 8);
        }
    }
}

/* The block's scale d = max / -8, max the first element of the largest magnitude with
 * its sign (so that it quantizes to -8, the nibble 0, exactly); NaN when the block holds
 * one (the callers refuse it). */
static float block_scale(const float *x) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < ATTN_Q4_0_BLOCK; i++) {
        if (isnan(x[i])) return NAN;
        if (amax < fabsf(x[i])) amax = fabsf(x[i]), max = x[i];
    }
    return max / -8.0f;
}

/* One block: the float16 scale, then q = min(15, trunc(x * (1 / d) + 8.5)) from the
 * float32 d (x * (1 / d) lies in [-8, 8] up to a few ulps, so the sum is >= 0 and the
 * truncation is the rounding of x / d + 8 to nearest, ties up); d = 0 gives q = 8. */
void ai_q4_0_quantize_block(const float *x, uint8_t *out) {
    const float d = block_scale(x), id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t h = attn_f32_to_f16(d);
    out[0] = (uint8_t)(h & 0xFF);
    out[1] = (uint8_t)(h >> 8);
    for (int i = 0; i < 16; i++) {
        /* the product rounded to float32 first, then the sum: two statements, so that no
         * compiler fuses them into one rounding (clang contracts within an expression) */
        const float a = x[i] * id, b = x[i + 16] * id;
        int lo = (int)(a + 8.5f), hi = (int)(b + 8.5f);
        lo = lo > 15 ? 15 : lo;
        hi = hi > 15 ? 15 : hi;
        out[2 + i] = (uint8_t)(lo | hi << 4);
    }
}

int64_t ai_q4_0_row_check(const float *x, int64_t xs, int64_t n) {
    float buf[ATTN_Q4_0_BLOCK];
    for (int64_t c = 0; c < n / ATTN_Q4_0_BLOCK; c++) {
        for (int i = 0; i < ATTN_Q4_0_BLOCK; i++) {
            buf[i] = x[(c * ATTN_Q4_0_BLOCK + i) * xs];
            if (!isfinite(buf[i])) return c;
        }
        if (isinf(attn_f16_to_f32(attn_f32_to_f16(block_scale(buf))))) return c;
    }
    return -1;
}
