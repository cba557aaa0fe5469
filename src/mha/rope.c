/*
 * rope.c — rotary position embedding on the module's projected Q and K, both pairings
 *          (half-split as GPT-NeoX and Llama, interleaved as GPT-J), and its checks.
 *
 * What it is not: a public call, or a cache of cos/sin tables. Each (row, pair) angle is
 * computed once in double and applied to every head of the row, so the cost is
 * L · rdim/2 cos/sin pairs per tensor, small beside the projections.
 */
#include <math.h>

#include "mha.h"

attn_status ai_rope_check(const attn_rope *r, int64_t Dk, int64_t *rdim, double *base) {
    *rdim = 0;
    *base = 10000.0;
    if (r->kind == ATTN_ROPE_NONE) return ATTN_OK;
    if ((unsigned)r->kind > (unsigned)ATTN_ROPE_INTERLEAVED)
        return ai_fail(ATTN_ERR_VALUE, "rope.kind is %d, expected an attn_rope_kind value",
                       (int)r->kind);
    int64_t d = r->rotary_dim ? r->rotary_dim : Dk;
    if (d < 0 || d > Dk || d % 2 != 0)
        return ai_fail(ATTN_ERR_VALUE, "rope.rotary_dim is %lld, expected an even number "
                       "0 < r <= Dk = %lld (0 = Dk)", (long long)r->rotary_dim, (long long)Dk);
    if (r->base != 0.0 && !(r->base > 0.0 && isfinite(r->base)))
        return ai_fail(ATTN_ERR_VALUE, "rope.base is %g, expected a finite positive number "
                       "(0 = 10000)", r->base);
    if (r->offset < 0)
        return ai_fail(ATTN_ERR_VALUE, "rope.offset is %lld, expected >= 0",
                       (long long)r->offset);
    *rdim = d;
    if (r->base != 0.0) *base = r->base;
    return ATTN_OK;
}

void ai_rope_apply(attn_rope_kind kind, int64_t rdim, double base, int64_t offset,
                   const int64_t *pos0, float *x, int64_t B, int64_t L, int64_t H,
                   int64_t D, bool inverse) {
    if (kind == ATTN_ROPE_NONE || rdim == 0) return;
    const int64_t half = rdim / 2;
    /* pair c of a head: elements (c, c + half) or (2c, 2c + 1) */
    const int64_t lo_step = kind == ATTN_ROPE_HALF ? 1 : 2;
    const int64_t hi_off = kind == ATTN_ROPE_HALF ? half : 1;
#pragma omp parallel for schedule(static)
    for (int64_t bi = 0; bi < B * L; bi++) {
        const int64_t b = bi / L, i = bi % L;
        const double pos = (double)(offset + (pos0 ? pos0[b] : 0) + i);
        float *row = x + bi * H * D;  /* (H, D) */
        for (int64_t c = 0; c < half; c++) {
            const double theta = pos * pow(base, -2.0 * (double)c / (double)rdim);
            const float cs = (float)cos(theta);
            const float sn = inverse ? -(float)sin(theta) : (float)sin(theta);
            for (int64_t h = 0; h < H; h++) {
                float *a = row + h * D + c * lo_step, *e = a + hi_off;
                const float x1 = *a, x2 = *e;
                /* (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) */
                *a = x1 * cs - x2 * sn;
                *e = x2 * cs + x1 * sn;
            }
        }
    }
}
