/*
 * linear.h — a dense layer over the library's BLAS door (src/core/blas.h): the forward
 *            out = inp w + bias and its backward, for the tools' models (`attn train`'s
 *            transformer, `attn seq2seq`'s GRU). Header-only; not the library's API.
 */
#ifndef ATTN_TOOLS_LINEAR_H
#define ATTN_TOOLS_LINEAR_H

#include <stdint.h>
#include <string.h>

#include "core/blas.h"

/* out (N, OC) = inp (N, IC) w (IC, OC) + bias (OC, or NULL) */
static inline attn_status linear_forward(float *out, const float *inp, const float *w,
                                  const float *bias, int64_t N, int64_t IC, int64_t OC) {
    if (bias)
        for (int64_t n = 0; n < N; n++) memcpy(out + n * OC, bias, (size_t)OC * sizeof(float));
    return ai_gemm_f32(false, false, N, OC, IC, 1.0f, inp, IC, w, OC, bias ? 1.0f : 0.0f,
                         out, OC);
}

/* forward: out = inp w + bias, so (each ADDED, as model_ops.h's backwards do)
 *   dinp += dout wᵀ,   dw += inpᵀ dout,   dbias += Σ_n dout (in row order) */
static inline attn_status linear_backward(float *dinp, float *dw, float *dbias, const float *dout,
                                   const float *inp, const float *w, int64_t N, int64_t IC,
                                   int64_t OC) {
    attn_status st = ai_gemm_f32(false, true, N, IC, OC, 1.0f, dout, OC, w, OC, 1.0f, dinp, IC);
    if (st == ATTN_OK)
        st = ai_gemm_f32(true, false, IC, OC, N, 1.0f, inp, IC, dout, OC, 1.0f, dw, OC);
    if (st == ATTN_OK && dbias)
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < OC; c++) dbias[c] += dout[n * OC + c];
    return st;
}

#endif /* ATTN_TOOLS_LINEAR_H */
