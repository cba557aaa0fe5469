/*
 * gemm_f64.c — ai_gemm_f64 (gemm_f64.h): blocks of 2 rows x 8 columns of C held in
 *              sixteen doubles of registers across the whole sum over k, as two-wide
 *              vectors (GCC / Clang vector extensions: SSE2 on baseline x86-64, NEON on
 *              arm64, scalar code elsewhere), each A element broadcast once per block and
 *              each B row read once per pair of rows. Rows left over go one at a time,
 *              columns left over (n mod 8) element by element, in the same order over k.
 *
 * Per element the operations are those of `acc += a * b` in order over k (vector lanes
 * are independent elements), so blocking changes no bit. GCC in -std=c11 does not contract
 * a * b + acc into a fused multiply-add (-ffp-contract=off), and baseline x86-64 has none;
 * a compiler that contracts on a target with FMA gives other bits, still the same ones
 * for any thread count.
 */
#include <string.h>

#include "gemm_f64.h"

typedef double v2d __attribute__((vector_size(16)));
typedef long long v2l __attribute__((vector_size(16)));

static inline v2d load2(const double *p) {
    v2d v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void store2(double *p, v2d v) { memcpy(p, &v, sizeof v); }

/* x * b, or +0 where x is 0 (skip_zero) */
static inline v2d term(v2d x, v2d b, v2l keep) { return (v2d)((v2l)(x * b) & keep); }

/* rows i0, i0+1 (two = true) or i0 alone, columns j0 .. j0+7 */
static void block8(int64_t i0, bool two, int64_t j0, int64_t kk, const double *A, int64_t ar,
                   int64_t ak, const double *B, int64_t ldb, double *C, int64_t ldc,
                   bool accumulate, bool skip_zero) {
    double *c0 = C + i0 * ldc + j0, *c1 = two ? c0 + ldc : c0;
    v2d s00 = {0, 0}, s01 = s00, s02 = s00, s03 = s00, s10 = s00, s11 = s00, s12 = s00, s13 = s00;
    if (accumulate) {
        s00 = load2(c0), s01 = load2(c0 + 2), s02 = load2(c0 + 4), s03 = load2(c0 + 6);
        s10 = load2(c1), s11 = load2(c1 + 2), s12 = load2(c1 + 4), s13 = load2(c1 + 6);
    }
    const double *a0 = A + i0 * ar, *a1 = two ? a0 + ar : a0;
    const v2l all = {-1, -1};
    for (int64_t k = 0; k < kk; k++) {
        const double *b = B + k * ldb + j0;
        const v2d b0 = load2(b), b1 = load2(b + 2), b2 = load2(b + 4), b3 = load2(b + 6);
        const double x0s = a0[k * ak], x1s = a1[k * ak];
        const v2d x0 = {x0s, x0s}, x1 = {x1s, x1s};
        const v2l k0 = skip_zero ? (v2l)(x0 != 0.0) : all, k1 = skip_zero ? (v2l)(x1 != 0.0) : all;
        s00 += term(x0, b0, k0), s01 += term(x0, b1, k0), s02 += term(x0, b2, k0), s03 += term(x0, b3, k0);
        s10 += term(x1, b0, k1), s11 += term(x1, b1, k1), s12 += term(x1, b2, k1), s13 += term(x1, b3, k1);
    }
    /* row i0 + 1 first: when two is false c1 = c0, and row i0's sums are the ones kept */
    store2(c1, s10), store2(c1 + 2, s11), store2(c1 + 4, s12), store2(c1 + 6, s13);
    store2(c0, s00), store2(c0 + 2, s01), store2(c0 + 4, s02), store2(c0 + 6, s03);
}

void ai_gemm_f64(int64_t m, int64_t n, int64_t kk, const double *A, int64_t ar, int64_t ak,
                 const double *B, int64_t ldb, double *C, int64_t ldc, bool accumulate,
                 bool skip_zero) {
    const int64_t n8 = n / 8 * 8;
    for (int64_t i = 0; i < m; i += 2) {
        const bool two = i + 1 < m;
        for (int64_t j = 0; j < n8; j += 8)
            block8(i, two, j, kk, A, ar, ak, B, ldb, C, ldc, accumulate, skip_zero);
        for (int64_t r = i; r < i + (two ? 2 : 1); r++)
            for (int64_t j = n8; j < n; j++) {
                double acc = accumulate ? C[r * ldc + j] : 0.0;
                for (int64_t k = 0; k < kk; k++) {
                    const double x = A[r * ar + k * ak];
                    acc += skip_zero && x == 0.0 ? 0.0 : x * B[k * ldb + j];
                }
                C[r * ldc + j] = acc;
            }
    }
}
