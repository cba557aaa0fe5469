/*
 * test_kernels_half.c — the kernels' pv_h entry (P·V on a 16-bit value block converted as
 *                       it is read, kernels.h) against the same kernel's pv on the block's
 *                       float32 values: bit for bit, for bfloat16 and float16 values, on
 *                       tiles of awkward sizes (rows, keys and value columns one under, at
 *                       and over each register tile and vector width; rows of the block
 *                       further apart than Dv), and with NaN and Inf stored in the value rows
 *                       of masked keys (p = 0), which must not reach the accumulator.
 *
 * It calls the kernel tables directly (src/kernels/kernels.h), every kernel this CPU runs that has
 * the entry. A planted error (one value of the float32 copy changed by 2^-11 of itself) must make
 * the comparison fail. Not a test of the framework (test_half does that through the API).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/half.h"
#include "kernels/kernels.h"
#include "rng.h"

/* One case: 1 when pv_h and pv agree bit for bit (and, with zeros, nothing is NaN);
 * plant: one element of pv's float32 block nudged by one ulp first. */
static int one_case(const attn_kernels *kern, attn_dtype dt, int64_t n, int64_t nk, int64_t dv,
                    int64_t ldv, bool zeros, bool plant) {
    rng_t r = {(uint64_t)(n * 1000003 + nk * 1009 + dv * 17 + ldv + (dt == ATTN_BF16) * 7 + zeros)};
    const int64_t npad = (n + kern->geom.row_pad - 1) / kern->geom.row_pad * kern->geom.row_pad;
    const int64_t lds = npad;
    float *p = xcalloc(nk * lds, sizeof(float)), *alpha = xcalloc(npad, sizeof(float));
    float *a1 = xcalloc(n * dv, sizeof(float)), *a2 = xcalloc(n * dv, sizeof(float));
    uint16_t *v = xcalloc(nk * ldv, sizeof(uint16_t));
    float *v32 = xcalloc(nk * dv, sizeof(float));
    for (int64_t c = 0; c < nk; c++) {
        const bool masked = zeros && rng_unif(&r) < 0.3;
        for (int64_t i = 0; i < npad; i++) p[c * lds + i] = masked ? 0.0f : (float)rng_unif(&r);
        for (int64_t d = 0; d < ldv; d++) {
            float x = (float)rng_sym(&r) * 3.0f;
            if (masked && d % 5 == 1) x = d % 2 ? NAN : INFINITY;  // never multiplied
            v[c * ldv + d] = dt == ATTN_BF16 ? attn_f32_to_bf16(x) : attn_f32_to_f16(x);
        }
        for (int64_t d = 0; d < dv; d++)
            v32[c * dv + d] = dt == ATTN_BF16 ? attn_bf16_to_f32(v[c * ldv + d]) : attn_f16_to_f32(v[c * ldv + d]);
    }
    for (int64_t i = 0; i < npad; i++) alpha[i] = 0.5f + (float)rng_unif(&r);
    for (int64_t i = 0; i < n * dv; i++) a1[i] = a2[i] = (float)rng_sym(&r);
    if (plant) {  // the one value of a live key the comparison must notice
        int64_t c = 0;
        while (c + 1 < nk && p[c * lds] == 0.0f) c++;
        uint32_t u;
        memcpy(&u, &v32[c * dv + dv / 2], 4);
        u += 1u << 12;  // 2^-11 relative: past the sum's rounding
        memcpy(&v32[c * dv + dv / 2], &u, 4);
    }
    kern->pv_h(n, npad, nk, dv, p, lds, dt, v, ldv, alpha, a1, dv, zeros);
    kern->pv(n, npad, nk, dv, p, lds, v32, dv, alpha, a2, dv, zeros);
    bool ok = memcmp(a1, a2, (size_t)(n * dv) * sizeof(float)) == 0;
    for (int64_t i = 0; i < n * dv; i++) ok &= !isnan(a1[i]);
    free(p), free(alpha), free(a1), free(a2), free(v), free(v32);
    return ok;
}

int main(void) {
    const int64_t ns[] = {1, 3, 4, 5, 8, 16, 17, 64};
    const int64_t nks[] = {1, 2, 7, 64, 128, 256};
    const int64_t dvs[] = {1, 7, 8, 15, 16, 17, 32, 64, 100, 128};
    int kernels = 0;
    for (const char *const *name = attn_kernel_list(); *name; name++) {
        const attn_kernels *kern = ai_kernels_named(*name);
        if (!kern || !kern->pv_h) continue;
        kernels++;
        for (int t = 0; t < 2; t++) {
            const attn_dtype dt = t ? ATTN_F16 : ATTN_BF16;
            for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
                for (size_t b = 0; b < sizeof nks / sizeof nks[0]; b++)
                    for (size_t c = 0; c < sizeof dvs / sizeof dvs[0]; c++)
                        for (int z = 0; z < 2; z++) {
                            const int64_t dv = dvs[c], ldv = z ? dv + 3 : dv;
                            CHECK(one_case(kern, dt, ns[a], nks[b], dv, ldv, z, false),
                                  "%s %s: pv_h differs from pv: n %lld nk %lld dv %lld ldv %lld zeros %d",
                                  kern->name, attn_dtype_name(dt), (long long)ns[a],
                                  (long long)nks[b], (long long)dv, (long long)ldv, z);
                        }
            CHECK(!one_case(kern, dt, 16, 128, 64, 64, false, true),
                  "%s %s: a planted change passed the comparison", kern->name, attn_dtype_name(dt));
            CHECK(!one_case(kern, dt, 5, 7, 17, 20, true, true),
                  "%s %s: a planted change passed the comparison (zeros)", kern->name, attn_dtype_name(dt));
        }
    }
    printf("kernels with pv_h: %d\n", kernels);
    return check_summary("test_kernels_half");
}
