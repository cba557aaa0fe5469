/*
 * tile_phases.c — per-phase timing of one tile of a kernel table (qk, softmax, pv with and
 *                 without skip_zeros, mask_bool) and the single-core FMA peak loop, as
 *                 quoted in docs/KERNELS.md ("The AVX2 kernel on Zen 3"). Not built by make:
 *   make build/libattn.a && cc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -Iinclude -Isrc \
 *     -o /tmp/tile_phases scripts/tile_phases.c build/libattn.a -lopenblas -lm -fopenmp
 *   /tmp/tile_phases avx2 [D=64] [nk=128] [logit stride=64] [value stride=D]
 * Thread CPU time; the minimum of 301 runs of 10 calls is the least disturbed by other jobs.
 */
/* per-phase timing of one tile of the avx2 kernels: median thread-CPU ns per call */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "kernels/kernels.h"
#include "kernels/peak.h"
static double now(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
static int cmpd(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
#define TIME(label, flops, ...) do { double ts[301]; for (int rr = 0; rr < 301; rr++) { double t0 = now(); for (int it = 0; it < REPS; it++) { __VA_ARGS__; } ts[rr] = (now() - t0) / REPS; } qsort(ts, 301, sizeof(double), cmpd); printf("%-22s med %8.0f ns min %8.0f ns  %6.1f GFLOP/s (min)\n", label, ts[150], ts[0], (flops) / ts[0]); } while (0)
int main(int argc, char **argv) {
    const char *isa = argc > 1 ? argv[1] : "avx2";
    const int64_t D = argc > 2 ? atoll(argv[2]) : 64, nk = argc > 3 ? atoll(argv[3]) : 128, n = 64, npad = 64;
    const int64_t lds = argc > 4 ? atoll(argv[4]) : 64, ldv = argc > 5 ? atoll(argv[5]) : D;
    const attn_kernels *k = ai_kernels_named(isa);
    if (!k) return 1;
    enum { REPS = 10 };
    float *q = malloc(n * D * 4), *qt = malloc(D * npad * 4), *kk = malloc(nk * D * 4), *v = malloc(nk * ldv * 4);
    float *s = malloc(nk * lds * 4), *s0 = malloc(nk * lds * 4), *acc = calloc(n * D, 4), m[64], l[64], al[64];
    uint8_t *mask = malloc(n * nk);
    srand(1);
    for (int64_t i = 0; i < n * D; i++) q[i] = rand() / (float)RAND_MAX - 0.5f;
    for (int64_t r = 0; r < n; r++) for (int64_t d = 0; d < D; d++) qt[d * npad + r] = q[r * D + d];
    for (int64_t i = 0; i < nk * D; i++) kk[i] = rand() / (float)RAND_MAX - 0.5f, v[i % D + i / D * ldv] = rand() / (float)RAND_MAX - 0.5f;
    for (int64_t i = 0; i < n * nk; i++) mask[i] = rand() & 1;
    const float sc = 1.0f / sqrtf((float)D);
    k->qk(n, npad, nk, D, q, qt, npad, kk, D, sc, s0, lds);
    const double fl = 2.0 * n * nk * D;
    printf("%s tile: %lld rows x %lld keys, D = %lld\n", isa, (long long)n, (long long)nk, (long long)D);
    { volatile double sink; TIME("peak loop (1 core)", 1000.0 * attn_peak_avx2.flops_per_iter, sink = attn_peak_avx2.fma(1000, 1.0f)); (void)sink; }
    TIME("qk", fl, k->qk(n, npad, nk, D, q, qt, npad, kk, D, sc, s, lds));
    TIME("softmax", 0, { for (int r = 0; r < 64; r++) m[r] = 2.0f, l[r] = 1.0f; memcpy(s, s0, nk * lds * 4); k->softmax(npad, nk, s, lds, m, l, al); });
    TIME("copy(for softmax)", 0, memcpy(s, s0, nk * lds * 4));
    for (int r = 0; r < 64; r++) m[r] = 2.0f, l[r] = 1.0f;
    memcpy(s, s0, nk * lds * 4); k->softmax(npad, nk, s, lds, m, l, al);
    for (int r = 0; r < 64; r++) al[r] = 1.0f;
    TIME("pv", fl, k->pv(n, npad, nk, D, s, lds, v, ldv, al, acc, D, false));
    TIME("pv skip_zeros", fl, k->pv(n, npad, nk, D, s, lds, v, ldv, al, acc, D, true));
    memcpy(s0, s, nk * lds * 4);
    k->mask_bool(n, nk, mask, nk, s, lds);
    TIME("pv skip, masked p", fl, k->pv(n, npad, nk, D, s, lds, v, ldv, al, acc, D, true));
    TIME("mask_bool", 0, k->mask_bool(n, nk, mask, nk, s, lds));
    return 0;
}
