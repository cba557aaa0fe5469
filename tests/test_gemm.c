/*
 * test_gemm.c — the kernel table's plain matrix product, gemm (kernels.h), of every
 *               kernel this CPU can run, against float64: C += op(A) B for op(A) = A and
 *               Aᵀ on sizes one under, at and over each register tile and vector width,
 *               leading dimensions wider than the rows, the columns of C past n left
 *               alone, skip_zeros keeping a NaN row of B out of the rows whose A is 0
 *               there, the same bits on a second call, and the tolerance check failing
 *               on a planted error (a product term left out).
 *
 * It calls the kernel tables directly, so a kernel that dispatch never picks on this
 * machine is still tested when the CPU can run it. The backward built on it is tested
 * through the API by test_backward and test_backward_edge.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels/kernels.h"
#include "rng.h"

enum { GUARD = 3 };  // extra columns of every leading dimension
#define UNTOUCHED 777.0f

/* One call of k->gemm on random data, checked element by element against float64.
 * The bound: a sum of k products computed from zero in float32 and then added to C
 * is within γ_{k+1} = (k + 1) u / (1 - (k + 1) u) of the sum of the terms' magnitudes
 * (u = 2^-24; FMAs only tighten it). nan_row >= 0: row nan_row of B holds NaN and
 * op(A)'s column nan_row is 0 in the even rows of C, which must stay finite (skip_zeros);
 * the odd rows multiply it and must be NaN. plant: the kernel is asked for k - 1 terms
 * while the reference keeps k, and the check must fail. Returns whether it passed. */
static bool run_case(const attn_kernels *kn, bool trans, int64_t m, int64_t n, int64_t k,
                     int64_t nan_row, bool plant, bool report) {
    rng_t g = {RNG_CASE(trans, m, n, k, nan_row)};
    const int64_t lda = (trans ? m : k) + GUARD, ldb = n + GUARD, ldc = n + GUARD;
    const int64_t arows = trans ? k : m;
    float *a = xcalloc(arows * lda, sizeof(float)), *b = xcalloc(k * ldb, sizeof(float));
    float *c = xcalloc(m * ldc, sizeof(float)), *c2 = xcalloc(m * ldc, sizeof(float));
    for (int64_t x = 0; x < arows * lda; x++) a[x] = (float)rng_sym(&g);
    for (int64_t x = 0; x < k * ldb; x++) b[x] = (float)rng_sym(&g);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < ldc; j++) c[i * ldc + j] = j < n ? (float)rng_sym(&g) : UNTOUCHED;
#define OPA(i, kk) a[trans ? (kk) * lda + (i) : (i) * lda + (kk)]
    /* a few exact zeros of op(A) everywhere, and the NaN row's zeros */
    for (int64_t i = 0; i < m; i++)
        for (int64_t kk = 0; kk < k; kk++)
            if (rng_int(&g, 7) == 0) OPA(i, kk) = 0.0f;
    if (nan_row >= 0) {
        for (int64_t j = 0; j < n; j++) b[nan_row * ldb + j] = NAN;
        for (int64_t i = 0; i < m; i += 2) OPA(i, nan_row) = 0.0f;
        for (int64_t i = 1; i < m; i += 2)
            if (OPA(i, nan_row) == 0.0f) OPA(i, nan_row) = 0.5f;
    }
    memcpy(c2, c, (size_t)(m * ldc) * sizeof(float));
    const double u = 0x1p-24, gamma = (double)(k + 1) * u / (1.0 - (double)(k + 1) * u);
    kn->gemm(trans, m, n, plant ? k - 1 : k, a, lda, b, ldb, c, ldc, nan_row >= 0);

    double worst = 0;  // the error over its bound, worst element
    bool guard = true, nan_ok = true;
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) {
            double e = c2[i * ldc + j], mag = fabs(e);
            bool nan_term = false;
            for (int64_t kk = 0; kk < k; kk++) {
                const double t = (double)OPA(i, kk) * b[kk * ldb + j];
                if (OPA(i, kk) == 0.0f) continue;  // skipped (or an exact 0)
                nan_term |= isnan(t);
                e += t, mag += fabs(t);
            }
            const float got = c[i * ldc + j];
            if (nan_term) {
                nan_ok &= isnan(got) != 0;
                continue;
            }
            if (isnan(got)) {
                nan_ok = false;
                continue;
            }
            const double r = fabs((double)got - e) / (gamma * (mag > 0 ? mag : 1));
            if (!(r <= worst)) worst = r;
        }
        for (int64_t j = n; j < ldc; j++) guard &= c[i * ldc + j] == UNTOUCHED;
    }
    /* the same call again gives the same bits */
    kn->gemm(trans, m, n, plant ? k - 1 : k, a, lda, b, ldb, c2, ldc, nan_row >= 0);
    bool same = true;
    for (int64_t x = 0; x < m * ldc; x++) same &= memcmp(&c[x], &c2[x], sizeof(float)) == 0;
    const bool ok = worst <= 1.0 && guard && nan_ok && same;
    if (report)
        CHECK(ok, "%s gemm %s m=%lld n=%lld k=%lld nan_row=%lld: error %.3g of the bound, "
              "columns past n untouched %d, NaN as expected %d, repeatable %d", kn->name,
              trans ? "tn" : "nn", (long long)m, (long long)n, (long long)k,
              (long long)nan_row, worst, guard, nan_ok, same);
#undef OPA
    free(a), free(b), free(c), free(c2);
    return ok;
}

int main(void) {
    static const int64_t ms[] = {1, 2, 5, 6, 7, 8, 9, 13, 16, 17, 64, 128};
    static const int64_t ns[] = {1, 7, 8, 15, 16, 17, 31, 32, 33, 64, 65, 128};
    static const int64_t ks[] = {0, 1, 2, 7, 16, 63, 64, 65, 128, 256};
    int cases = 0;
#define X_TEST(isa, ...)                                                                   \
    if (attn_kernel_supported(#isa)) {                                                    \
        const attn_kernels *kn = &attn_kernels_##isa;                                      \
        CHECK(kn->gemm != NULL, "%s: no gemm entry", kn->name);                             \
        for (int tr = 0; tr < 2; tr++)                                                      \
            for (size_t x = 0; x < sizeof ms / sizeof ms[0]; x++)                           \
                for (size_t y = 0; y < sizeof ns / sizeof ns[0]; y++) {                     \
                    const int64_t k = ks[(x + 3 * y + tr) % 10];                            \
                    run_case(kn, tr, ms[x], ns[y], k, -1, false, true);                     \
                    if (k > 0) run_case(kn, tr, ms[x], ns[y], k, (x + y) % k, false, true); \
                    cases += 1 + (k > 0);                                                   \
                }                                                                           \
        /* the planted error: one product term left out must fail the bound */            \
        CHECK(!run_case(kn, false, 64, 64, 64, -1, true, false) &&                          \
                  !run_case(kn, true, 7, 17, 128, -1, true, false),                         \
              "%s gemm: a left-out product term passed the check", kn->name);               \
        printf("  %s gemm: %d cases\n", kn->name, cases);                                   \
        cases = 0;                                                                          \
    } else {                                                                                \
        printf("  %s: skipped, this CPU cannot run it\n", #isa);                          \
    }
    ATTN_KERNEL_LIST(X_TEST)
#undef X_TEST
    return check_summary("gemm");
}
