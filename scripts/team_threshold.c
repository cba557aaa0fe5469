/*
 * team_threshold.c — the measurement behind ATTN_TEAM_MIN_FLOPS (src/core/team.h): the median
 *                    time of small forward and backward calls on 2 threads, for the
 *                    threshold the environment sets (run it with ATTN_TEAM_MIN_FLOPS=0,
 *                    every call wakes the team, and =1e30, none does, alternately).
 *
 *   cc -O2 -fopenmp -Iinclude scripts/team_threshold.c build/libattn.a -lm -lpthread \
 *      -o build/team_threshold   (add -lopenblas where the library was built with it)
 *   ATTN_TEAM_MIN_FLOPS=0 build/team_threshold; ATTN_TEAM_MIN_FLOPS=1e30 build/team_threshold
 *
 * Prints one line per shape: its flops (team.h's estimate) and the median microseconds
 * of REPS calls, forward and backward.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "attn.h"

enum { REPS = 101 };

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static float *buf(int64_t n) {
    float *x = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = (float)((i * 7919 % 1000) / 1000.0 - 0.5);
    return x;
}

static void shape(const char *what, int64_t H, int64_t Lq, int64_t Lk, int64_t D) {
    float *q = buf(H * Lq * D), *k = buf(H * Lk * D), *v = buf(H * Lk * D), *o = buf(H * Lq * D);
    float *lse = buf(H * Lq), *dq = buf(H * Lq * D), *dk = buf(H * Lk * D), *dv = buf(H * Lk * D);
    attn_tensor tq = attn_tensor_4d(q, ATTN_F32, 1, H, Lq, D), tk = attn_tensor_4d(k, ATTN_F32, 1, H, Lk, D);
    attn_tensor tv = attn_tensor_4d(v, ATTN_F32, 1, H, Lk, D), to = attn_tensor_4d(o, ATTN_F32, 1, H, Lq, D);
    attn_tensor tl = attn_tensor_4d(lse, ATTN_F32, 1, H, Lq, 1), tdq = attn_tensor_4d(dq, ATTN_F32, 1, H, Lq, D);
    attn_tensor tdk = attn_tensor_4d(dk, ATTN_F32, 1, H, Lk, D), tdv = attn_tensor_4d(dv, ATTN_F32, 1, H, Lk, D);
    attn_options opt = {0};
    opt.threads = 2;
    opt.lse = &tl;
    double tf[REPS], tb[REPS];
    for (int r = 0; r < REPS; r++) {
        double t0 = now_us();
        if (attn_forward(&tq, &tk, &tv, &to, &opt) != ATTN_OK) exit(1);
        tf[r] = now_us() - t0;
    }
    attn_options bo = {0};
    bo.threads = 2;
    for (int r = 0; r < REPS; r++) {
        double t0 = now_us();
        if (attn_backward(&tq, &tk, &tv, &to, &to, &tl, &tdq, &tdk, &tdv, &bo) != ATTN_OK) exit(1);
        tb[r] = now_us() - t0;
    }
    qsort(tf, REPS, sizeof(double), cmp);
    qsort(tb, REPS, sizeof(double), cmp);
    printf("%-8s H=%-2lld Lq=%-4lld Lk=%-5lld D=%lld  flops %9.3g  fwd %9.1f us  bwd %9.1f us\n", what,
           (long long)H, (long long)Lq, (long long)Lk, (long long)D, 2.0 * H * Lq * Lk * 2 * D,
           tf[REPS / 2], tb[REPS / 2]);
    free(q), free(k), free(v), free(o), free(lse), free(dq), free(dk), free(dv);
}

int main(void) {
    const char *e = getenv("ATTN_TEAM_MIN_FLOPS");
    printf("ATTN_TEAM_MIN_FLOPS=%s, 2 threads\n", e ? e : "(default)");
    for (int64_t lk = 32; lk <= 4096; lk *= 2) shape("decode", 8, 1, lk, 64);
    for (int64_t l = 8; l <= 256; l *= 2) shape("prefill", 4, l, l, 64);
    return 0;
}
