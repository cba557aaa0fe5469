/*
 * u4.c — the u4 cache dtype (KIVI's and OpenVINO's scheme, attn.h): keys quantized per
 *        channel over groups of G keys, values per token over runs of 32 channels, 4-bit
 *        codes without a scale inside, the scales and zeros float32 tensors of their own.
 *        Here: the public conversions (attn_quantize_u4_keys / _values and their
 *        dequantizations), the check of a forward call's u4 options (ai_u4_fill) and the
 *        one reading of a cache row (ai_u4_row) that the fused tiles and the reference use.
 *
 * What is not here: the layout rule (core.c's, the block dtypes' with 16 bytes a block),
 * the tile walk (fused.c's kv_block calls ai_u4_row), the refusals of the calls that do
 * not read u4 (each call's own file). No kernel reads u4 itself.
 *
 * A code c of a block is the low nibble of byte c / 2 for an even element, the high one
 * for an odd element; its value is fmaf(c, scale, zero), one rounding.
 */
#include <math.h>

#include "attn_internal.h"

/* ---- reading -------------------------------------------------------------------------- */

void ai_u4_row(const attn_params *p, bool values, int64_t b, int64_t g, int64_t j,
               const uint8_t *row, int64_t n, float *dst) {
    const int v = values ? 1 : 0;
    const int64_t *ss = p->u4_scale_s[v], *zs = p->u4_zero_s[v];
    const int64_t r = values ? j : j / p->u4_group;  // the key's group, or the token
    const float *sr = p->u4_scale[v] + b * ss[0] + g * ss[1] + r * ss[2];
    const float *zr = p->u4_zero[v] + b * zs[0] + g * zs[1] + r * zs[2];
    for (int64_t d = 0; d < n; d++) {
        const int64_t c = values ? d / ATTN_U4_BLOCK : d;  // per 32 channels, or per channel
        dst[d] = attn_u4_value(attn_u4_code(row, d), sr[c * ss[3]], zr[c * zs[3]]);
    }
}

float ai_u4_load(const attn_params *p, bool values, int64_t b, int64_t g, int64_t j,
                 int64_t d) {
    const void *base = values ? p->v : p->k;
    const int64_t *st = values ? p->v_s : p->k_s;
    const uint8_t *row = (const uint8_t *)base +
                         attn_row_byte_offset(ATTN_U4, attn_kv_offset(p, st, b, g, j));
    const int v = values ? 1 : 0;
    const int64_t *ss = p->u4_scale_s[v], *zs = p->u4_zero_s[v];
    const int64_t r = values ? j : j / p->u4_group, c = values ? d / ATTN_U4_BLOCK : d;
    return attn_u4_value(attn_u4_code(row, d),
                         p->u4_scale[v][b * ss[0] + g * ss[1] + r * ss[2] + c * ss[3]],
                         p->u4_zero[v][b * zs[0] + g * zs[1] + r * zs[2] + c * zs[3]]);
}

/* ---- checks --------------------------------------------------------------------------- */

/* A scale or zero tensor: present, float32 of shape want, and (values) each value finite,
 * a scale also > 0. */
static attn_status check_side(const attn_tensor *t, const char *name, const int64_t want[4],
                              bool scale, bool need_data, bool values) {
    if (!t) return ai_fail(ATTN_ERR_NULL, "%s: NULL, required with a u4 cache", name);
    TRY(ai_check_tensor(t, name, ATTN_F32, need_data));
    for (int d = 0; d < 4; d++)
        if (t->shape[d] != want[d])
            return ai_fail(ATTN_ERR_SHAPE, "%s: shape [%lld, %lld, %lld, %lld], expected "
                           "[%lld, %lld, %lld, %lld]", name, (long long)t->shape[0],
                           (long long)t->shape[1], (long long)t->shape[2],
                           (long long)t->shape[3], (long long)want[0], (long long)want[1],
                           (long long)want[2], (long long)want[3]);
    if (!values || !t->data) return ATTN_OK;
    const float *x = t->data;
    for (int64_t i0 = 0; i0 < want[0]; i0++)
        for (int64_t i1 = 0; i1 < want[1]; i1++)
            for (int64_t i2 = 0; i2 < want[2]; i2++)
                for (int64_t i3 = 0; i3 < want[3]; i3++) {
                    const float s = x[i0 * t->stride[0] + i1 * t->stride[1] +
                                      i2 * t->stride[2] + i3 * t->stride[3]];
                    if (scale ? !(s > 0.0f) || isinf(s) : !isfinite(s))
                        return ai_fail(ATTN_ERR_VALUE, "%s[%lld, %lld, %lld, %lld] is %g, "
                                       "expected a finite %s", name, (long long)i0,
                                       (long long)i1, (long long)i2, (long long)i3, (double)s,
                                       scale ? "scale > 0" : "zero");
                }
    return ATTN_OK;
}

/* The shape of the scales and zeros of a u4 tensor [B, H, L, D]: per channel over groups
 * of G keys (keys), or per token over runs of 32 channels (values) */
static void side_shape(const int64_t n[4], bool keys, int64_t G, int64_t out[4]) {
    out[0] = n[0], out[1] = n[1];
    out[2] = keys ? (n[2] == 0 ? 0 : (n[2] - 1) / G + 1) : n[2];
    out[3] = keys ? n[3] : n[3] / ATTN_U4_BLOCK;
}

attn_status ai_u4_fill(attn_params *p, const attn_options *opt, bool need_data) {
    for (int v = 0; v < 2; v++) p->u4_scale[v] = p->u4_zero[v] = NULL;
    p->u4_group = 0;
    if (p->kv_dt != ATTN_U4) {
        if (opt->k_zero || opt->v_zero || opt->kv_group)
            return ai_fail(ATTN_ERR_VALUE, "%s: given with a %s cache (for a u4 cache only)",
                           opt->k_zero ? "k_zero" : opt->v_zero ? "v_zero" : "kv_group",
                           attn_dtype_name(p->kv_dt));
        return ATTN_OK;
    }
    if (p->block_table)
        return ai_fail(ATTN_ERR_UNSUPPORTED, "block_table: a u4 cache is read contiguous only "
                       "(docs/CONTRACT.md, \"The u4 cache (KIVI)\")");
    if (opt->kv_group < 0)
        return ai_fail(ATTN_ERR_VALUE, "kv_group is %lld, expected >= 0 (0 = 32)",
                       (long long)opt->kv_group);
    const int64_t G = opt->kv_group ? opt->kv_group : 32;
    const int64_t kn[4] = {p->B, p->Hkv, p->Lk, p->Dk}, vn[4] = {p->B, p->Hkv, p->Lk, p->Dv};
    int64_t ks[4], vs[4];
    side_shape(kn, true, G, ks);
    side_shape(vn, false, G, vs);
    const attn_tensor *const t[4] = {opt->k_scale, opt->k_zero, opt->v_scale, opt->v_zero};
    static const char *const names[4] = {"k_scale", "k_zero", "v_scale", "v_zero"};
    for (int x = 0; x < 4; x++)
        TRY(check_side(t[x], names[x], x < 2 ? ks : vs, x % 2 == 0, need_data, need_data));
    for (int v = 0; v < 2; v++) {
        const attn_tensor *s = t[2 * v], *z = t[2 * v + 1];
        p->u4_scale[v] = s->data;
        p->u4_zero[v] = z->data;
        for (int d = 0; d < 4; d++) {
            p->u4_scale_s[v][d] = s->shape[d] == 1 ? 0 : s->stride[d];
            p->u4_zero_s[v][d] = z->shape[d] == 1 ? 0 : z->stride[d];
        }
    }
    p->u4_group = G;
    return ATTN_OK;
}

/* The four tensors of a conversion: x float32, u the u4 tensor, its scale and zero; out
 * names which are written (quantize: u, scale, zero; dequantize: x). */
static attn_status check_conversion(const attn_tensor *x, const char *xn, const attn_tensor *u,
                                    const char *un, const attn_tensor *scale,
                                    const attn_tensor *zero, bool keys, int64_t group,
                                    bool quantize) {
    if (!x || !u) return ai_fail(ATTN_ERR_NULL, "%s: tensor pointer is NULL", !x ? xn : un);
    if (keys && group < 0)
        return ai_fail(ATTN_ERR_VALUE, "group is %lld, expected >= 0 (0 = 32)", (long long)group);
    TRY(ai_check_tensor(x, xn, ATTN_F32, true));
    TRY(ai_check_tensor(u, un, ATTN_U4, true));  // and the block layout (core.c)
    for (int d = 0; d < 4; d++)
        if (x->shape[d] != u->shape[d])
            return ai_fail(ATTN_ERR_SHAPE, "%s: shape[%d] is %lld, expected %lld as %s", un, d,
                           (long long)u->shape[d], (long long)x->shape[d], xn);
    int64_t sn[4];
    side_shape(x->shape, keys, group ? group : 32, sn);
    /* a quantization writes the scales and zeros: their values are not checked */
    TRY(check_side(scale, "scale", sn, true, true, !quantize));
    TRY(check_side(zero, "zero", sn, false, true, !quantize));
    if (quantize) {
        TRY(ai_check_output_strides(u, un, 4));
        TRY(ai_check_output_strides(scale, "scale", 4));
        TRY(ai_check_output_strides(zero, "zero", 4));
        const attn_tensor *in[] = {x};
        static const char *const in_names[] = {"src"};
        const attn_tensor *out[] = {u, scale, zero};
        static const char *const out_names[] = {"dst", "scale", "zero"};
        return ai_check_aliasing(in, in_names, 1, out, out_names, 3, NULL, 0);
    }
    TRY(ai_check_output_strides(x, xn, 4));
    const attn_tensor *in[] = {u, scale, zero};
    static const char *const in_names[] = {"src", "scale", "zero"};
    const attn_tensor *out[] = {x};
    static const char *const out_names[] = {"dst"};
    return ai_check_aliasing(in, in_names, 3, out, out_names, 1, NULL, 0);
}

static bool is_empty(const attn_tensor *t) {
    return t->shape[0] == 0 || t->shape[1] == 0 || t->shape[2] == 0 || t->shape[3] == 0;
}

/* The byte of u4 tensor u that holds element (i0, i1, i2, d) (stride[3] = 1, rows on
 * block starts: core.c) */
static uint8_t *u4_byte(const attn_tensor *u, int64_t i0, int64_t i1, int64_t i2, int64_t d) {
    const int64_t e = i0 * u->stride[0] + i1 * u->stride[1] + i2 * u->stride[2];
    return (uint8_t *)u->data + attn_row_byte_offset(ATTN_U4, e) + d / 2;
}

static float *f32_at(const attn_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return (float *)t->data + i0 * t->stride[0] + i1 * t->stride[1] + i2 * t->stride[2] +
           i3 * t->stride[3];
}

/* ---- quantization --------------------------------------------------------------------- */

/* The scale and zero of values lo..hi (finite): zero = lo, scale = (hi - lo) / 15, or 1
 * when that is 0 (every code then 0, every value lo) */
static void range_scale(float lo, float hi, float *scale, float *zero) {
    const float s = (hi - lo) / 15.0f;
    *scale = s > 0.0f ? s : 1.0f;
    *zero = lo;
}

/* The code of x: the nearest of 0..15 to (x - zero) / scale (ties to even), in float32 */
static int u4_code_of(float x, float scale, float zero) {
    const float t = nearbyintf((x - zero) / scale);
    return t < 0.0f ? 0 : t > 15.0f ? 15 : (int)t;
}

/* The least and largest of n values x[i * xs]; false when one is not finite or the range
 * hi - lo overflows */
static bool value_range(const float *x, int64_t xs, int64_t n, float *lo, float *hi) {
    float a = INFINITY, b = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        const float v = x[i * xs];
        if (!isfinite(v)) return false;
        a = v < a ? v : a;
        b = v > b ? v : b;
    }
    *lo = a, *hi = b;
    return isfinite(b - a);
}

/* Keys: per (i0, i1, key group, channel). refuse_only: check every group and write
 * nothing; else write (a checked call). */
static attn_status quantize_keys(const attn_tensor *src, const attn_tensor *dst,
                                 const attn_tensor *scale, const attn_tensor *zero, int64_t G,
                                 bool refuse_only) {
    const int64_t L = src->shape[2], D = src->shape[3], ng = (L - 1) / G + 1;
    for (int64_t i0 = 0; i0 < src->shape[0]; i0++)
        for (int64_t i1 = 0; i1 < src->shape[1]; i1++)
            for (int64_t r = 0; r < ng; r++) {
                const int64_t l0 = r * G, nl = L - l0 < G ? L - l0 : G;
                for (int64_t d = 0; d < D; d++) {
                    const float *x = f32_at(src, i0, i1, l0, d);
                    float lo, hi, s, z;
                    if (!value_range(x, src->stride[2], nl, &lo, &hi)) {
                        if (refuse_only)
                            return ai_fail(ATTN_ERR_VALUE, "src: channel %lld of keys %lld.. "
                                           "of (%lld, %lld) holds a NaN or infinity, or a "
                                           "range max - min beyond float32", (long long)d,
                                           (long long)l0, (long long)i0, (long long)i1);
                        continue;
                    }
                    if (refuse_only) continue;
                    range_scale(lo, hi, &s, &z);
                    *f32_at(scale, i0, i1, r, d) = s;
                    *f32_at(zero, i0, i1, r, d) = z;
                    for (int64_t l = 0; l < nl; l++) {
                        uint8_t *byte = u4_byte(dst, i0, i1, l0 + l, d);
                        const int c = u4_code_of(x[l * src->stride[2]], s, z);
                        *byte = d % 2 == 0 ? (uint8_t)((*byte & 0xF0) | c)
                                           : (uint8_t)((*byte & 0x0F) | c << 4);
                    }
                }
            }
    return ATTN_OK;
}

/* Values: per (i0, i1, token, run of 32 channels), as quantize_keys. */
static attn_status quantize_values(const attn_tensor *src, const attn_tensor *dst,
                                   const attn_tensor *scale, const attn_tensor *zero,
                                   bool refuse_only) {
    const int64_t L = src->shape[2], D = src->shape[3];
    for (int64_t i0 = 0; i0 < src->shape[0]; i0++)
        for (int64_t i1 = 0; i1 < src->shape[1]; i1++)
            for (int64_t l = 0; l < L; l++)
                for (int64_t c = 0; c < D / ATTN_U4_BLOCK; c++) {
                    const int64_t d0 = c * ATTN_U4_BLOCK;
                    const float *x = f32_at(src, i0, i1, l, d0);
                    float lo, hi, s, z;
                    if (!value_range(x, src->stride[3], ATTN_U4_BLOCK, &lo, &hi)) {
                        if (refuse_only)
                            return ai_fail(ATTN_ERR_VALUE, "src: channels %lld..%lld of token "
                                           "%lld of (%lld, %lld) hold a NaN or infinity, or a "
                                           "range max - min beyond float32", (long long)d0,
                                           (long long)d0 + 31, (long long)l, (long long)i0,
                                           (long long)i1);
                        continue;
                    }
                    if (refuse_only) continue;
                    range_scale(lo, hi, &s, &z);
                    *f32_at(scale, i0, i1, l, c) = s;
                    *f32_at(zero, i0, i1, l, c) = z;
                    uint8_t *blk = u4_byte(dst, i0, i1, l, d0);
                    for (int i = 0; i < ATTN_U4_BLOCK; i += 2)
                        blk[i / 2] = (uint8_t)(u4_code_of(x[i * src->stride[3]], s, z) |
                                               u4_code_of(x[(i + 1) * src->stride[3]], s, z) << 4);
                }
    return ATTN_OK;
}

attn_status attn_quantize_u4_keys(const attn_tensor *src, const attn_tensor *dst,
                                  const attn_tensor *scale, const attn_tensor *zero,
                                  int64_t group) {
    TRY(check_conversion(src, "src", dst, "dst", scale, zero, true, group, true));
    if (is_empty(src)) return ai_ok();
    const int64_t G = group ? group : 32;
    TRY(quantize_keys(src, dst, scale, zero, G, true));  // every group checked first
    quantize_keys(src, dst, scale, zero, G, false);
    return ai_ok();
}

attn_status attn_quantize_u4_values(const attn_tensor *src, const attn_tensor *dst,
                                    const attn_tensor *scale, const attn_tensor *zero) {
    TRY(check_conversion(src, "src", dst, "dst", scale, zero, false, 0, true));
    if (is_empty(src)) return ai_ok();
    TRY(quantize_values(src, dst, scale, zero, true));
    quantize_values(src, dst, scale, zero, false);
    return ai_ok();
}

/* ---- dequantization ------------------------------------------------------------------- */

static attn_status dequantize(const attn_tensor *src, const attn_tensor *dst,
                              const attn_tensor *scale, const attn_tensor *zero, bool keys,
                              int64_t group) {
    TRY(check_conversion(dst, "dst", src, "src", scale, zero, keys, group, false));
    if (is_empty(src)) return ai_ok();
    const int64_t G = group ? group : 32;
    for (int64_t i0 = 0; i0 < src->shape[0]; i0++)
        for (int64_t i1 = 0; i1 < src->shape[1]; i1++)
            for (int64_t l = 0; l < src->shape[2]; l++) {
                const uint8_t *row = u4_byte(src, i0, i1, l, 0);
                for (int64_t d = 0; d < src->shape[3]; d++) {
                    const int64_t r = keys ? l / G : l, c = keys ? d : d / ATTN_U4_BLOCK;
                    *f32_at(dst, i0, i1, l, d) =
                        attn_u4_value(attn_u4_code(row, d), *f32_at(scale, i0, i1, r, c),
                                      *f32_at(zero, i0, i1, r, c));
                }
            }
    return ai_ok();
}

attn_status attn_dequantize_u4_keys(const attn_tensor *src, const attn_tensor *dst,
                                    const attn_tensor *scale, const attn_tensor *zero,
                                    int64_t group) {
    return dequantize(src, dst, scale, zero, true, group);
}

attn_status attn_dequantize_u4_values(const attn_tensor *src, const attn_tensor *dst,
                                      const attn_tensor *scale, const attn_tensor *zero) {
    return dequantize(src, dst, scale, zero, false, 0);
}
