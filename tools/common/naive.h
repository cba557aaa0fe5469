/*
 * naive.h — attention computed naively in one floating type: the yardstick of the
 *           half-precision accuracy rule and the "naive" column of `attn dtypes`.
 *
 * What PyTorch's math path does in a 16-bit type: the scores Q·Kᵀ accumulated in float32
 * and rounded to the type, scaled and rounded again, the softmax computed in float32
 * and rounded to the type, P·V accumulated in float32 and rounded to the type. For
 * ATTN_F32 no rounding is added: plain float32 arithmetic, scores materialized. Not
 * part of the library: the library never rounds an intermediate.
 */
#ifndef ATTN_NAIVE_H
#define ATTN_NAIVE_H

#include <stdint.h>

#include "attn.h"

/* q [B, Hq, Lq, Dk], k [B, Hkv, Lk, Dk], v [B, Hkv, Lk, Dv], o [B, Hq, Lq, Dv]: dense
 * float arrays whose values are representable in t (o's will be). keep [Lq, Lk] (shared
 * by every batch and head) says which keys each row attends; NULL = all. A row with no
 * key gives 0. Returns 0, or -1 when out of memory. */
int naive_attention(attn_dtype t, int64_t B, int64_t Hq, int64_t Hkv, int64_t Lq, int64_t Lk,
                    int64_t Dk, int64_t Dv, const float *q, const float *k, const float *v,
                    const uint8_t *keep, float scale, float *o);

/* x rounded to t (round to nearest even) and back to float */
float naive_round(attn_dtype t, float x);

#endif /* ATTN_NAIVE_H */
