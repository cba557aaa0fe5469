/*
 * call_phases.c — one thread's CPU time of whole float32 forward calls beside the
 *                 single-core FMA peak loop timed the same way, for comparing tile
 *                 geometries (ATTN_AVX2_BQ, ATTN_AVX2_BK) or kernel builds on a machine
 *                 shared with other jobs (docs/KERNELS.md, "The AVX2 kernel on Zen 3").
 *                 Not built by make:
 *   make build/libattn.a && cc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -Iinclude -Isrc \
 *     -o /tmp/call_phases scripts/call_phases.c build/libattn.a -lopenblas -lm -fopenmp
 *   /tmp/call_phases L D [causal=0] [heads=2] [runs=7]
 * Prints the minimum and the median of `runs` calls (process CPU time, 1 thread) as
 * GFLOP/s = 2 (Dk + Dv) H pairs / time, and their share of the peak loop's minimum.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <attn.h>
#include "kernels/kernels.h"
#include "kernels/peak.h"
static double now(void) { struct timespec t; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
static int cmpd(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv) {
    if (argc < 3) return 2;
    const int64_t L = atoll(argv[1]), D = atoll(argv[2]);
    const int causal = argc > 3 ? atoi(argv[3]) : 0, H = argc > 4 ? atoi(argv[4]) : 2;
    const int runs = argc > 5 ? atoi(argv[5]) : 7;
    const size_t n = (size_t)(H * L * D);
    float *q = malloc(n * 4), *k = malloc(n * 4), *v = malloc(n * 4), *o = malloc(n * 4);
    srand(1);
    for (size_t i = 0; i < n; i++) q[i] = rand() / (float)RAND_MAX - 0.5f, k[i] = rand() / (float)RAND_MAX - 0.5f, v[i] = rand() / (float)RAND_MAX - 0.5f;
    attn_tensor tq = attn_tensor_4d(q, ATTN_F32, 1, H, L, D), tk = attn_tensor_4d(k, ATTN_F32, 1, H, L, D);
    attn_tensor tv = attn_tensor_4d(v, ATTN_F32, 1, H, L, D), to = attn_tensor_4d(o, ATTN_F32, 1, H, L, D);
    attn_options opt = {.causal = causal != 0, .threads = 1};
    const double pairs = causal ? (double)L * (L + 1) / 2 : (double)L * L, fl = 4.0 * D * H * pairs;
    double pk[31];
    for (int r = 0; r < 31; r++) {
        volatile double sink;
        const double t0 = now();
        sink = attn_peak_avx2.fma(100000, 1.0f);
        (void)sink;
        pk[r] = 100000.0 * attn_peak_avx2.flops_per_iter / (now() - t0);
    }
    qsort(pk, 31, sizeof(double), cmpd);
    double *ts = malloc(runs * sizeof(double));
    if (attn_forward(&tq, &tk, &tv, &to, &opt) != ATTN_OK) return 1;
    for (int r = 0; r < runs; r++) {
        const double t0 = now();
        attn_forward(&tq, &tk, &tv, &to, &opt);
        ts[r] = now() - t0;
    }
    qsort(ts, runs, sizeof(double), cmpd);
    const double peak = pk[30];
    printf("L%lld D%lld %s H%d: best %.1f GFLOP/s (%.1f%% of %.1f peak), median %.1f (%.1f%%)  o[1]=%.7g\n",
           (long long)L, (long long)D, causal ? "causal" : "none", H, fl / ts[0], 100 * fl / ts[0] / peak,
           peak, fl / ts[runs / 2], 100 * fl / ts[runs / 2] / peak, o[1]);
    return 0;
}
