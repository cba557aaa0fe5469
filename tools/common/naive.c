/*
 * naive.c — attention computed naively in one floating type (see naive.h).
 */
#include "naive.h"

#include <math.h>
#include <stdlib.h>

#include "core/half.h"

float naive_round(attn_dtype t, float x) {
    if (t == ATTN_F16) return attn_f16_to_f32(attn_f32_to_f16(x));
    if (t == ATTN_BF16) return attn_bf16_to_f32(attn_f32_to_bf16(x));
    return x;
}

int naive_attention(attn_dtype t, int64_t B, int64_t Hq, int64_t Hkv, int64_t Lq, int64_t Lk,
                    int64_t Dk, int64_t Dv, const float *q, const float *k, const float *v,
                    const uint8_t *keep, float scale, float *o) {
    const int64_t group = Hkv ? Hq / Hkv : 1;
    float *s = malloc((size_t)(Lk > 0 ? Lk : 1) * sizeof(float));  // one row of scores
    if (!s) return -1;
    const float scale_t = naive_round(t, scale);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < Lq; i++) {
                const float *q_i = q + ((b * Hq + h) * Lq + i) * Dk;
                const int64_t kv = b * Hkv + h / group;
                float m = -INFINITY;
                for (int64_t j = 0; j < Lk; j++) {
                    const float *k_j = k + (kv * Lk + j) * Dk;
                    float dot = 0.0f;
                    for (int64_t d = 0; d < Dk; d++) dot += q_i[d] * k_j[d];
                    s[j] = keep && !keep[i * Lk + j]
                               ? -INFINITY
                               : naive_round(t, naive_round(t, dot) * scale_t);
                    m = fmaxf(m, s[j]);
                }
                float l = 0.0f;
                for (int64_t j = 0; j < Lk; j++) {
                    s[j] = m == -INFINITY ? 0.0f : expf(s[j] - m);
                    l += s[j];
                }
                for (int64_t j = 0; j < Lk; j++) s[j] = l > 0 ? naive_round(t, s[j] / l) : 0.0f;
                for (int64_t d = 0; d < Dv; d++) {
                    float acc = 0.0f;
                    for (int64_t j = 0; j < Lk; j++)
                        if (s[j] != 0.0f) acc += s[j] * v[(kv * Lk + j) * Dv + d];
                    o[((b * Hq + h) * Lq + i) * Dv + d] = naive_round(t, acc);
                }
            }
    free(s);
    return 0;
}
