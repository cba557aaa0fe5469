/*
 * generic/gemm.c — the portable plain matrix product of the kernel table (kernels.h:
 *                  gemm), the backward's dV += Pᵀ dO, dK += dSᵀ Q and dQ += dS K.
 *
 * One row of C at a time, its columns in chunks of 256 summed from zero over k in a
 * buffer, then added: the loop over columns has independent outputs, so a compiler
 * vectorizes it without reordering any sum (no fast-math). The yardstick of the vector
 * versions, and what a non-x86 build runs.
 */
#include "kernels/kernels.h"

void ai_gemm_generic(bool trans_a, int64_t m, int64_t n, int64_t k, const float *a,
                     int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc,
                     bool skip_zeros) {
    float tmp[256];
    for (int64_t i = 0; i < m; i++) {
        float *c_i = c + i * ldc;
        for (int64_t j0 = 0; j0 < n; j0 += 256) {
            const int64_t nd = n - j0 < 256 ? n - j0 : 256;
            for (int64_t j = 0; j < nd; j++) tmp[j] = 0.0f;
            for (int64_t kk = 0; kk < k; kk++) {
                const float a_ik = trans_a ? a[kk * lda + i] : a[i * lda + kk];
                if (skip_zeros && a_ik == 0.0f) continue;  // row kk of B is not read
                const float *b_k = b + kk * ldb + j0;
                for (int64_t j = 0; j < nd; j++) tmp[j] += a_ik * b_k[j];
            }
            for (int64_t j = 0; j < nd; j++) c_i[j0 + j] += tmp[j];
        }
    }
}
