/*
 * test_from_f32.c — the kernels' from_f32 entry (float32 rows rounded to float16 or
 *                   bfloat16, kernels.h) against half.h's scalar attn_f32_to_f16 and
 *                   attn_f32_to_bf16, bit for bit, on every kernel this CPU runs that has
 *                   the entry.
 *
 * The floats: every bit pattern at a stride of 257 (16.7 million, all exponents and signs),
 * every pattern whose low 16 bits sit at a rounding boundary of either dtype (ties, one
 * under, one over: 0x0FFF-0x1001 and 0x1FFF-0x2001 for float16's 13 dropped bits,
 * 0x7FFF-0x8001 and 0xFFFF for bfloat16's 16) for each of the 65536 high halves, and the
 * specials (zeros, subnormals, the float16 overflow edge 65504-65520, infinities, quiet
 * and signalling NaNs). Rows of 1 to 67 elements at odd offsets, so that each vector step
 * and each tail length is used. A planted error (one expected result off by one) must
 * make the comparison fail. Not a test of the framework's output (test_half does that).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/half.h"
#include "kernels/kernels.h"

/* 1 when kern->from_f32 gives half.h's rounding of each x[i], rows of `row` elements */
static int agree(const attn_kernels *kern, attn_dtype dt, const uint32_t *bits, int64_t n,
                 int64_t row, bool plant) {
    float *x = malloc((size_t)n * sizeof(float));
    uint16_t *got = malloc((size_t)n * sizeof(uint16_t)), *want = malloc((size_t)n * sizeof(uint16_t));
    memcpy(x, bits, (size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) want[i] = dt == ATTN_F16 ? attn_f32_to_f16(x[i]) : attn_f32_to_bf16(x[i]);
    if (plant) want[n / 2] ^= 1;
    for (int64_t i0 = 0; i0 < n; i0 += row)
        kern->from_f32(dt, n - i0 < row ? n - i0 : row, x + i0, got + i0);
    int ok = memcmp(got, want, (size_t)n * sizeof(uint16_t)) == 0;
    free(x), free(got), free(want);
    return ok;
}

int main(void) {
    /* the patterns, in one list */
    const int64_t strided = (int64_t)(0x100000000ull / 257) + 1;
    static const uint16_t lows[] = {0x0000, 0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x2000, 0x2001,
                                    0x7FFF, 0x8000, 0x8001, 0xFFFF};
    const int64_t nlow = sizeof lows / sizeof lows[0];
    static const uint32_t specials[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807FFFFFu,
                                        0x33000000u, 0x33000001u, 0x387FE000u, 0x38800000u,
                                        0x477FE000u, 0x477FEFFFu, 0x477FF000u, 0x477FF001u,
                                        0x7F7FFFFFu, 0x7F800000u, 0xFF800000u, 0x7FC00000u,
                                        0xFFC00001u, 0x7F800001u, 0xFFBFFFFFu, 0x7FFFFFFFu};
    const int64_t nspec = sizeof specials / sizeof specials[0];
    const int64_t n = strided + 65536 * nlow + nspec;
    uint32_t *bits = malloc((size_t)n * sizeof(uint32_t));
    int64_t k = 0;
    for (int64_t i = 0; i < strided; i++) bits[k++] = (uint32_t)((uint64_t)i * 257u);
    for (int64_t hi = 0; hi < 65536; hi++)
        for (int64_t j = 0; j < nlow; j++) bits[k++] = (uint32_t)hi << 16 | lows[j];
    for (int64_t j = 0; j < nspec; j++) bits[k++] = specials[j];

    static const int64_t rows[] = {1, 7, 8, 9, 16, 67, 4096};
    int kernels = 0;
    for (const char *const *name = attn_kernel_list(); *name; name++) {
        const attn_kernels *kern = ai_kernels_named(*name);
        if (!kern || !kern->from_f32) continue;
        kernels++;
        for (int t = 0; t < 2; t++) {
            const attn_dtype dt = t ? ATTN_F16 : ATTN_BF16;
            for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++)
                CHECK(agree(kern, dt, bits, rows[r] < 100 ? 100000 : n, rows[r], false) &&
                          agree(kern, dt, bits + n - 100000, 100000, rows[r], false),
                      "%s %s: from_f32 differs from half.h's rounding, rows of %lld", kern->name,
                      attn_dtype_name(dt), (long long)rows[r]);
            CHECK(agree(kern, dt, bits, n, 4096, false), "%s %s: from_f32 differs on the whole list",
                  kern->name, attn_dtype_name(dt));
            CHECK(!agree(kern, dt, bits + n - 1000, 1000, 67, true),
                  "%s %s: a planted error passed the comparison", kern->name, attn_dtype_name(dt));
        }
    }
    printf("kernels with from_f32: %d\n", kernels);
    free(bits);
    return check_summary("test_from_f32");
}
