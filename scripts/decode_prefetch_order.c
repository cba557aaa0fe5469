/*
 * decode_prefetch_order.c — the decoding step's memory pattern without the library: 8 heads
 *                           of a float32 cache (K and V [16384, 128] each, 64 MiB a
 *                           tensor), 4 query rows a head, tiles of 64 keys. Phase A reads
 *                           each K row whole (4 rows x 2 keys of FMAs, as dec_qk4) and
 *                           asks for this tile's V rows; phase B reads V in 16-column
 *                           passes (as dec_pv) and asks for the next tile's K lines, in one
 *                           of two orders. Quoted in docs/KERNELS.md ("The decoding step's
 *                           prefetch order on Zen 3"). Not built by make:
 *   cc -O3 -mavx2 -mfma -fopenmp -o /tmp/dpo scripts/decode_prefetch_order.c
 *   OMP_NUM_THREADS=2 /tmp/dpo [rounds=3]
 * Prints GB/s of K and V (the median of 5 calls) for: no software prefetch; the next K
 * asked for by passes (line i of every row in pass i, the step before this change); the
 * next K in address order (the step now); the same arithmetic with K and V in L2 (the
 * arithmetic alone); and a plain read of K and V.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { D = 128, BK = 64, L = 16384, H = 8, PASSES = D / 16, LINES = D * 4 / 64 };
static float q[4 * D];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* one tile: k, v this tile's rows, nk the next tile's K; order 0: no prefetch, 1: by
 * passes, 2: address order */
static void tile(const float *k, const float *v, const float *nk, int order, float *acc, float *s) {
    for (int c = 0; c < BK; c += 2) {
        if (order)
            for (int r = c; r < c + 2; r++)
                for (int x = 0; x < LINES; x++) _mm_prefetch((const char *)(v + r * D) + 64 * x, _MM_HINT_T2);
        __m256 a[2][4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) a[0][r] = a[1][r] = _mm256_setzero_ps();
        for (int d = 0; d < D; d += 8) {
            const __m256 k0 = _mm256_loadu_ps(k + c * D + d), k1 = _mm256_loadu_ps(k + (c + 1) * D + d);
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                const __m256 qv = _mm256_loadu_ps(q + r * D + d);
                a[0][r] = _mm256_fmadd_ps(qv, k0, a[0][r]);
                a[1][r] = _mm256_fmadd_ps(qv, k1, a[1][r]);
            }
        }
        __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a[0][0], a[0][1]), _mm256_hadd_ps(a[1][0], a[1][1]));
        h = _mm256_add_ps(h, _mm256_hadd_ps(_mm256_hadd_ps(a[0][2], a[0][3]), _mm256_hadd_ps(a[1][2], a[1][3])));
        _mm256_storeu_ps(s + 4 * c, _mm256_mul_ps(h, _mm256_set1_ps(1e-3f)));
    }
    for (int p = 0; p < PASSES; p++) {
        __m256 t[4][2];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) t[r][0] = t[r][1] = _mm256_setzero_ps();
        int line = p * BK * LINES / PASSES;  // address order: this pass's share of the lines
        for (int c = 0; c < BK; c++) {
            const float *row = v + c * D + 16 * p;
            const __m256 v0 = _mm256_loadu_ps(row), v1 = _mm256_loadu_ps(row + 8);
            if (order == 1) _mm_prefetch((const char *)(nk + c * D) + 64 * p, _MM_HINT_T2);
            if (order == 2) _mm_prefetch((const char *)nk + 64 * line++, _MM_HINT_T2);
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                const __m256 pb = _mm256_broadcast_ss(s + 4 * c + r);
                t[r][0] = _mm256_fmadd_ps(pb, v0, t[r][0]);
                t[r][1] = _mm256_fmadd_ps(pb, v1, t[r][1]);
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            float *o = acc + r * D + 16 * p;
            _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), t[r][0]));
            _mm256_storeu_ps(o + 8, _mm256_add_ps(_mm256_loadu_ps(o + 8), t[r][1]));
        }
    }
}

static int cmpd(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const int rounds = argc > 1 ? atoi(argv[1]) : 3;
    const int64_t per = (int64_t)L * D;
    float *K = aligned_alloc(64, H * per * 4), *V = aligned_alloc(64, H * per * 4);
    for (int64_t i = 0; i < H * per; i++) K[i] = V[i] = 1e-3f * (float)(i & 255);
    for (int i = 0; i < 4 * D; i++) q[i] = 0.01f;
    static const char *name[] = {"no software prefetch", "next K by passes (before)",
                                 "next K in address order (now)", "address order, K and V in L2"};
    float sink = 0;
    for (int round = 0; round < rounds; round++) {
        for (int mode = 0; mode < 4; mode++) {
            double t[5];
            for (int rep = 0; rep < 5; rep++) {
                const double t0 = now();
#pragma omp parallel for schedule(static) reduction(+ : sink)
                for (int h = 0; h < H; h++) {
                    float acc[4 * D] = {0}, s[4 * BK];
                    for (int64_t j = 0; j < L; j += BK) {
                        const int64_t at = mode == 3 ? j % (4 * BK) : j;  // 256 KiB: in L2
                        const int64_t next = at + BK < L ? at + BK : at;
                        tile(K + h * per + at * D, V + h * per + at * D, K + h * per + next * D,
                             mode == 3 ? 2 : mode, acc, s);
                    }
                    sink += acc[0];
                }
                t[rep] = now() - t0;
            }
            qsort(t, 5, sizeof t[0], cmpd);
            printf("%-32s %6.1f GB/s\n", name[mode], 2.0 * H * per * 4 / t[2] / 1e9);
        }
        double t[5];
        for (int rep = 0; rep < 5; rep++) {
            const double t0 = now();
#pragma omp parallel for reduction(+ : sink)
            for (int64_t i = 0; i < H * per; i += 16) {
                const __m256 x = _mm256_add_ps(_mm256_load_ps(K + i), _mm256_load_ps(V + i + 8));
                sink += _mm256_cvtss_f32(x);
            }
            t[rep] = now() - t0;
        }
        qsort(t, 5, sizeof t[0], cmpd);
        printf("%-32s %6.1f GB/s\n\n", "plain read of K and V", 2.0 * H * per * 4 / t[2] / 1e9);
    }
    return sink == 12345.0f;
}
