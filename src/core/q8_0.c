/*
 * q8_0.c — the q8_0 cache dtype's own parts: the quantization a cache append does once,
 *          and the dequantization users and tests read it back with (its layout rule,
 *          a tensor check, is core.c's).
 *
 * The format is llama.cpp's block_q8_0, byte for byte (attn.h): 34 bytes a block, the
 * float16 scale d little-endian in bytes 0-1, then 32 int8 qs; value = d * qs[i], exact
 * in float32 (an 11-bit by 8-bit product). Written here from that description, not
 * copied. The tensor conversions (ai_block_quantize, ai_block_dequantize) serve q4_0
 * too, and its public calls are here (q4_0.c has its blocks and calls nothing here). What
 * is not here: reading q8_0 inside attention (fused.c's
 * kv_block, the kernels' dequant_q8_0 entry, half.h's attn_load for the reference).
 */
#include <math.h>
#include <string.h>

#include "half.h"
#include "attn_internal.h"

void ai_dequant_q8_0_blocks(int64_t n, const uint8_t *src, float *dst) {
    for (int64_t c = 0; c < n; c++) {
        const uint8_t *b = src + c * ATTN_Q8_0_BYTES;
        const float d = attn_f16_to_f32((uint16_t)(b[0] | b[1] << 8));
        for (int i = 0; i < ATTN_Q8_0_BLOCK; i++) dst[c * ATTN_Q8_0_BLOCK + i] = d * (float)(int8_t)b[2 + i];
    }
}

/* The scale of a block of 32 float32 values at stride 1: d = amax / 127 (float32). */
static float block_scale(const float *x) {
    float amax = 0.0f;
    for (int i = 0; i < ATTN_Q8_0_BLOCK && !isnan(amax); i++) {
        const float a = fabsf(x[i]);
        if (isnan(a) || a > amax) amax = a;  // NaN is kept: the caller refuses it
    }
    return amax / 127.0f;
}

/* One block: the float16 scale, then qs = roundf(x / d) through the float32 reciprocal
 * of the float32 d (as llama.cpp's reference does: |x| = amax gives 127 within a few
 * ulps, so no qs leaves [-127, 127]); an all-zero block is d = 0, qs = 0. */
static void quantize_block(const float *x, uint8_t *out) {
    const float d = block_scale(x), id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t h = attn_f32_to_f16(d);
    out[0] = (uint8_t)(h & 0xFF);
    out[1] = (uint8_t)(h >> 8);
    for (int i = 0; i < ATTN_Q8_0_BLOCK; i++) out[2 + i] = (uint8_t)(int8_t)roundf(x[i] * id);
}

/* The shared checks of both conversions: f32 and the block tensor of their dtypes, one
 * shape, the output writing no element twice and sharing no byte with the input. */
static attn_status check_pair(const attn_tensor *f32, const char *fname, const attn_tensor *q8,
                              attn_dtype dt, const char *qname, const attn_tensor *out,
                              const char *oname) {
    TRY(ai_check_tensor(f32, fname, ATTN_F32, true));
    TRY(ai_check_tensor(q8, qname, dt, true));
    for (int d = 0; d < 4; d++)
        if (f32->shape[d] != q8->shape[d])
            return ai_fail(ATTN_ERR_SHAPE, "%s: shape[%d] is %lld, %s's is %lld", fname, d,
                           (long long)f32->shape[d], qname, (long long)q8->shape[d]);
    TRY(ai_check_output_strides(out, oname, 4));
    if (ai_views_overlap(f32, q8))
        return ai_fail(ATTN_ERR_STRIDE, "%s: overlaps %s in memory", oname,
                       out == f32 ? qname : fname);
    return ATTN_OK;
}

/* A success clears attn_last_error(), as every call's does. */
static attn_status ok(void) { return ai_fail(ATTN_OK, "%s", ""); }

static bool is_empty(const attn_tensor *t) {
    return t->shape[0] == 0 || t->shape[1] == 0 || t->shape[2] == 0 || t->shape[3] == 0;
}

static uint8_t *q8_row(const attn_tensor *t, int64_t i0, int64_t i1, int64_t i2) {
    return (uint8_t *)t->data + attn_row_byte_offset(t->dtype, i0 * t->stride[0] +
                                                     i1 * t->stride[1] + i2 * t->stride[2]);
}

int64_t ai_q8_0_row_check(const float *x, int64_t xs, int64_t n) {
    float buf[ATTN_Q8_0_BLOCK];
    for (int64_t c = 0; c < n / ATTN_Q8_0_BLOCK; c++) {
        for (int i = 0; i < ATTN_Q8_0_BLOCK; i++) buf[i] = x[(c * ATTN_Q8_0_BLOCK + i) * xs];
        const float d = block_scale(buf);
        if (!isfinite(d) || isinf(attn_f16_to_f32(attn_f32_to_f16(d)))) return c;
    }
    return -1;
}

int64_t ai_block_row_check(attn_dtype dt, const float *x, int64_t xs, int64_t n) {
    return dt == ATTN_Q4_0 ? ai_q4_0_row_check(x, xs, n) : ai_q8_0_row_check(x, xs, n);
}

void ai_block_quantize_row(attn_dtype dt, const float *x, int64_t xs, int64_t n, uint8_t *dst) {
    void (*block)(const float *, uint8_t *) =
        dt == ATTN_Q4_0 ? ai_q4_0_quantize_block : quantize_block;
    const int64_t bytes = attn_row_bytes(dt, ATTN_Q8_0_BLOCK);  // both blocks hold 32 values
    float buf[ATTN_Q8_0_BLOCK];
    for (int64_t c = 0; c < n / ATTN_Q8_0_BLOCK; c++) {
        const float *xb = x + c * ATTN_Q8_0_BLOCK * xs;
        if (xs != 1) {
            for (int i = 0; i < ATTN_Q8_0_BLOCK; i++) buf[i] = xb[i * xs];
            xb = buf;
        }
        block(xb, dst + c * bytes);
    }
}

attn_status ai_block_quantize(attn_dtype dt, const attn_tensor *src, const attn_tensor *dst) {
    if (!src || !dst) return ai_fail(ATTN_ERR_NULL, "%s: tensor pointer is NULL", src ? "dst" : "src");
    TRY(check_pair(src, "src", dst, dt, "dst", dst, "dst"));
    if (is_empty(src)) return ok();
    const int64_t n1 = src->shape[1], n2 = src->shape[2], D = src->shape[3];
    const int64_t rows = src->shape[0] * n1 * n2;
    const float *x0 = src->data;
    /* first every block's scale checked: a refused call writes nothing */
    for (int64_t r = 0; r < rows; r++) {
        const int64_t i0 = r / (n1 * n2), i1 = r / n2 % n1, i2 = r % n2;
        const int64_t c = ai_block_row_check(dt, x0 + i0 * src->stride[0] + i1 * src->stride[1] +
                                        i2 * src->stride[2], src->stride[3], D);
        if (c >= 0)
            return ai_fail(ATTN_ERR_VALUE, "src: block %lld of row (%lld, %lld, %lld) holds a "
                           "NaN or infinity, or a value whose scale (%s) is beyond "
                           "float16's range", (long long)c, (long long)i0, (long long)i1,
                           (long long)i2, dt == ATTN_Q4_0 ? "max / -8" : "amax / 127");
    }
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t i0 = r / (n1 * n2), i1 = r / n2 % n1, i2 = r % n2;
        ai_block_quantize_row(dt, x0 + i0 * src->stride[0] + i1 * src->stride[1] + i2 * src->stride[2],
                     src->stride[3], D, q8_row(dst, i0, i1, i2));
    }
    return ok();
}

attn_status ai_block_dequantize(attn_dtype dt, const attn_tensor *src, const attn_tensor *dst) {
    if (!src || !dst) return ai_fail(ATTN_ERR_NULL, "%s: tensor pointer is NULL", src ? "dst" : "src");
    TRY(check_pair(dst, "dst", src, dt, "src", dst, "dst"));
    if (is_empty(src)) return ok();
    void (*deq)(int64_t, const uint8_t *, float *) =
        dt == ATTN_Q4_0 ? ai_dequant_q4_0_blocks : ai_dequant_q8_0_blocks;
    const int64_t bb = attn_elem_bytes(dt);
    const int64_t n1 = src->shape[1], n2 = src->shape[2], D = src->shape[3];
    const int64_t rows = src->shape[0] * n1 * n2;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t i0 = r / (n1 * n2), i1 = r / n2 % n1, i2 = r % n2;
        const uint8_t *in = q8_row(src, i0, i1, i2);
        float *y = (float *)dst->data + i0 * dst->stride[0] + i1 * dst->stride[1] +
                   i2 * dst->stride[2];
        for (int64_t c = 0; c < D / 32; c++) {
            float blk[32];
            deq(1, in + c * bb, blk);
            for (int i = 0; i < 32; i++) y[(c * 32 + i) * dst->stride[3]] = blk[i];
        }
    }
    return ok();
}

attn_status attn_quantize_q8_0(const attn_tensor *src, const attn_tensor *dst) {
    return ai_block_quantize(ATTN_Q8_0, src, dst);
}

attn_status attn_dequantize_q8_0(const attn_tensor *src, const attn_tensor *dst) {
    return ai_block_dequantize(ATTN_Q8_0, src, dst);
}

attn_status attn_quantize_q4_0(const attn_tensor *src, const attn_tensor *dst) {
    return ai_block_quantize(ATTN_Q4_0, src, dst);
}

attn_status attn_dequantize_q4_0(const attn_tensor *src, const attn_tensor *dst) {
    return ai_block_dequantize(ATTN_Q4_0, src, dst);
}
