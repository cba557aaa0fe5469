/*
 * views.h — float32 tensor views over padded buffers for the tests: the [B, H, L, D] and
 *           [B, L, H, D] layouts with row offsets and padding, an element's address, and
 *           a copy into dense C order. Shared by oracle.h and test_backward.c.
 */
#ifndef ATTN_TEST_VIEWS_H
#define ATTN_TEST_VIEWS_H

#include <stdint.h>
#include <string.h>

#include "attn.h"

/* A logical [d0, d1, d2, d3] float view into buf. layout 0 stores it [d0, d1, L, D]
 * (the [B, H, L, D] order), layout 1 stores it [d0, L, d1, D] (the [B, L, H, D] order),
 * where L = loff + d2 + lpad rows of D = d3 + dpad floats, and the view starts at row
 * loff. view_elems() is the buffer size this needs. */
static inline int64_t view_elems(int64_t d0, int64_t d1, int64_t d2, int64_t d3, int64_t loff,
                          int64_t lpad, int64_t dpad) {
    return d0 * d1 * (loff + d2 + lpad) * (d3 + dpad);
}
static inline attn_tensor make_view(float *buf, int64_t d0, int64_t d1, int64_t d2, int64_t d3,
                             int layout, int64_t loff, int64_t lpad, int64_t dpad) {
    int64_t L = loff + d2 + lpad, D = d3 + dpad;
    attn_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = ATTN_F32;
    t.shape[0] = d0; t.shape[1] = d1; t.shape[2] = d2; t.shape[3] = d3;
    if (layout == 0) {
        t.stride[0] = d1 * L * D; t.stride[1] = L * D; t.stride[2] = D; t.stride[3] = 1;
        t.data = buf + loff * D;
    } else {
        t.stride[0] = L * d1 * D; t.stride[1] = D; t.stride[2] = d1 * D; t.stride[3] = 1;
        t.data = buf + loff * d1 * D;
    }
    return t;
}

/* Copy a float view into a dense C-order array of its shape. */
static inline void gather_f32(const attn_tensor *t, float *out) {
    int64_t n = 0;
    for (int64_t a = 0; a < t->shape[0]; a++)
        for (int64_t b = 0; b < t->shape[1]; b++)
            for (int64_t c = 0; c < t->shape[2]; c++)
                for (int64_t d = 0; d < t->shape[3]; d++)
                    out[n++] = ((const float *)t->data)[a * t->stride[0] + b * t->stride[1] +
                                                        c * t->stride[2] + d * t->stride[3]];
}
static inline float *view_ptr(const attn_tensor *t, int64_t a, int64_t b, int64_t c, int64_t d) {
    return (float *)t->data + a * t->stride[0] + b * t->stride[1] + c * t->stride[2] +
           d * t->stride[3];
}

#endif /* ATTN_TEST_VIEWS_H */
