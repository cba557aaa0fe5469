/*
 * bench_additive.c — `attn bench --additive`: the rows of additive (Bahdanau) attention.
 *
 * Method (docs/ADDITIVE.md quotes it):
 *   - the case is B = 8, Lq = Lk = 512, Dq = Dk = Dv = 128, A = 128 float32 (--quick: B = 2,
 *     Lq = Lk = 128); batch 0 is checked against ATTN_PATH_REFERENCE first (O and every
 *     gradient, relative Frobenius <= 1e-5 and max <= 1e-4 (1 + max|ref|), the additive
 *     tolerance of docs/CONTRACT.md); --plant-error scales one output first and must fail;
 *   - one warm-up call, then --reps timed calls (default 5); the median is reported;
 *   - the scoring rate is pairs x A / time, pairs = B Lq Lk (no mask), and it is set beside
 *     a tight loop of the same vectorized tanh (attn_additive_tanh, on an L1-resident
 *     buffer per thread, all threads) measured in the same run: tanh/s. Both by wall time
 *     and per CPU-second of the process (the second is the fairer ratio on a machine
 *     shared with other work, where the two are timed under different loads);
 *   - the extra memory is the fused path's: Qp and Kpᵀ (B (Lq + Lk) A floats) and one
 *     tile scratch per thread, beside the Lq Lk A floats per batch a broadcast
 *     implementation materializes.
 * What it is not: the comparison with PyTorch (not installed here: see docs/ADDITIVE.md),
 * or a test (no time limit anywhere).
 */
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attn.h"
#include "bench_clock.h"
#include "cliopt.h"

typedef struct add_case {
    int64_t B, L, D, A;
    float *q, *k, *v, *o, *lse, *d_o, *dq, *dk, *dv;
    float *W, *U, *vv, *bias, *gW, *gU, *gv, *gb;
    attn_tensor tq, tk, tv, to, tl, tdo, tdq, tdk, tdv;
    attn_additive_weights w;
    attn_additive_grads g;
} add_case;

static float *filled(int64_t n, uint64_t seed, double scale) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        p[i] = (float)(scale * ((double)(seed >> 11) * 0x1.0p-53 * 2.0 - 1.0));
    }
    return p;
}

static void build(add_case *c, int64_t B, int64_t L, int64_t D, int64_t A) {
    memset(c, 0, sizeof *c);
    c->B = B; c->L = L; c->D = D; c->A = A;
    const int64_t n = B * L * D;
    c->q = filled(n, 1, 1); c->k = filled(n, 2, 1); c->v = filled(n, 3, 1);
    c->d_o = filled(n, 4, 1);
    c->o = malloc((size_t)n * 4); c->dq = malloc((size_t)n * 4);
    c->dk = malloc((size_t)n * 4); c->dv = malloc((size_t)n * 4);
    c->lse = malloc((size_t)(B * L) * 4);
    c->W = filled(D * A, 5, 1 / sqrt((double)D)); c->U = filled(D * A, 6, 1 / sqrt((double)D));
    c->vv = filled(A, 7, 1); c->bias = filled(A, 8, 0.5);
    c->gW = malloc((size_t)(D * A) * 4); c->gU = malloc((size_t)(D * A) * 4);
    c->gv = malloc((size_t)A * 4); c->gb = malloc((size_t)A * 4);
    c->tq = attn_tensor_4d(c->q, ATTN_F32, B, 1, L, D);
    c->tk = attn_tensor_4d(c->k, ATTN_F32, B, 1, L, D);
    c->tv = attn_tensor_4d(c->v, ATTN_F32, B, 1, L, D);
    c->to = attn_tensor_4d(c->o, ATTN_F32, B, 1, L, D);
    c->tdo = attn_tensor_4d(c->d_o, ATTN_F32, B, 1, L, D);
    c->tdq = attn_tensor_4d(c->dq, ATTN_F32, B, 1, L, D);
    c->tdk = attn_tensor_4d(c->dk, ATTN_F32, B, 1, L, D);
    c->tdv = attn_tensor_4d(c->dv, ATTN_F32, B, 1, L, D);
    c->tl = attn_tensor_4d(c->lse, ATTN_F32, B, 1, L, 1);
    c->w = (attn_additive_weights){A, c->W, c->U, c->vv, c->bias, false, 0};
    c->g = (attn_additive_grads){c->gW, c->gU, c->gv, c->gb, NULL};
}

static void release(add_case *c) {
    float *all[] = {c->q, c->k, c->v, c->o, c->lse, c->d_o, c->dq, c->dk, c->dv,
                    c->W, c->U, c->vv, c->bias, c->gW, c->gU, c->gv, c->gb};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

static attn_status fwd(add_case *c, attn_path path, int threads) {
    attn_options opt = {.lse = &c->tl, .path = path, .threads = threads};
    return attn_additive_forward(&c->tq, &c->tk, &c->tv, &c->w, &c->to, &opt);
}

static attn_status bwd(add_case *c, attn_path path, int threads) {
    attn_options opt = {.path = path, .threads = threads};
    return attn_additive_backward(&c->tq, &c->tk, &c->tv, &c->w, &c->to, &c->tdo, &c->tl,
                                  &c->tdq, &c->tdk, &c->tdv, &c->g, &opt);
}

static bool within(const char *what, const float *got, const float *ref, int64_t n) {
    double num = 0, den = 0, mx = 0, mref = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - ref[i]);
        if (!(d == d)) return printf("  check %s: NaN\n", what), false;
        num += d * d; den += (double)ref[i] * ref[i];
        if (d > mx) mx = d;
        if (fabs(ref[i]) > mref) mref = fabs(ref[i]);
    }
    const double rel = sqrt(num / (den > 0 ? den : 1));
    const bool ok = rel <= 1e-5 && mx <= 1e-4 * (1 + mref);
    printf("  check %-4s relative %.2e  max %.2e  %s\n", what, rel, mx, ok ? "ok" : "FAILED");
    return ok;
}

/* Batch 0 of the case against the float64 path: O, then every gradient. */
static bool check(add_case *c, int threads, bool plant) {
    add_case one;
    build(&one, 1, c->L, c->D, c->A);
    const int64_t n = c->L * c->D, nw = c->D * c->A;
    memcpy(one.q, c->q, (size_t)n * 4); memcpy(one.k, c->k, (size_t)n * 4);
    memcpy(one.v, c->v, (size_t)n * 4); memcpy(one.d_o, c->d_o, (size_t)n * 4);
    bool ok = fwd(c, ATTN_PATH_FUSED, threads) == ATTN_OK && bwd(c, ATTN_PATH_FUSED, threads) == ATTN_OK;
    ok = ok && fwd(&one, ATTN_PATH_REFERENCE, 1) == ATTN_OK && bwd(&one, ATTN_PATH_REFERENCE, 1) == ATTN_OK;
    if (!ok) {
        printf("  check: a call failed: %s\n", attn_last_error());
        release(&one);
        return false;
    }
    if (plant) c->o[17] += 1e-3f * (1.0f + fabsf(c->o[17]));
    ok &= within("O", c->o, one.o, n);
    ok &= within("dq", c->dq, one.dq, n);
    ok &= within("dk", c->dk, one.dk, n);
    ok &= within("dv", c->dv, one.dv, n);
    /* the weights' gradients sum over the batches: compared on a B = 1 run of the fused path */
    float *gW = malloc((size_t)nw * 4), *gb = malloc((size_t)c->A * 4);
    memcpy(gW, one.gW, (size_t)nw * 4); memcpy(gb, one.gb, (size_t)c->A * 4);
    ok &= bwd(&one, ATTN_PATH_FUSED, threads) == ATTN_OK || (fwd(&one, ATTN_PATH_FUSED, threads), false);
    ok &= within("dW", one.gW, gW, nw);
    ok &= within("db", one.gb, gb, c->A);
    free(gW); free(gb);
    release(&one);
    return ok;
}

/* Median wall and CPU seconds of `reps` calls after one warm-up. */
static void time_calls(add_case *c, int threads, int reps, bool backward, double *wall,
                       double *cpu) {
    double t[64], u[64];
    if (reps > 64) reps = 64;
    (backward ? bwd : fwd)(c, ATTN_PATH_FUSED, threads);  /* warm-up */
    for (int r = 0; r < reps; r++) {
        const double t0 = now_s(), u0 = cpu_s();
        (backward ? bwd : fwd)(c, ATTN_PATH_FUSED, threads);
        t[r] = now_s() - t0;
        u[r] = cpu_s() - u0;
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp_double);
    qsort(u, (size_t)reps, sizeof u[0], cmp_double);
    *wall = t[reps / 2];
    *cpu = u[reps / 2];
}

/* tanh per second of attn_additive_tanh on 4096 floats per thread, all threads: the best
 * of three trials by wall time, and per CPU-second */
static void tanh_rate(int threads, double *wall_rate, double *cpu_rate) {
    enum { N = 4096, ROUNDS = 4000 };
    *wall_rate = *cpu_rate = 0;
    for (int trial = 0; trial < 3; trial++) {
        double t0 = 0, t1 = 0, u0 = 0, u1 = 0;
        int nt = 1;
#pragma omp parallel num_threads(threads > 0 ? threads : omp_get_max_threads())
        {
            float *x = filled(N, 9 + (uint64_t)omp_get_thread_num(), 4), *y = malloc(N * 4);
            attn_additive_tanh(N, x, y);
#pragma omp barrier
#pragma omp master
            {
                nt = omp_get_num_threads();
                t0 = now_s();
                u0 = cpu_s();
            }
            for (int r = 0; r < ROUNDS; r++) {
                attn_additive_tanh(N, x, y);
                x[r % N] = y[(r * 7) % N];  /* keeps the calls dependent on each other */
            }
#pragma omp barrier
#pragma omp master
            {
                t1 = now_s();
                u1 = cpu_s();
            }
            free(x); free(y);
        }
        const double n = (double)N * ROUNDS * nt;
        if (n / (t1 - t0) > *wall_rate) *wall_rate = n / (t1 - t0);
        if (n / (u1 - u0) > *cpu_rate) *cpu_rate = n / (u1 - u0);
    }
}

static const char USAGE[] =
    "usage: attn bench --additive [--quick] [--threads N] [--reps N] [--plant-error]\n"
    "\n"
    "  Additive (Bahdanau) attention: B = 8, Lq = Lk = 512, D = 128, A = 128 float32, checked\n"
    "  against the float64 path, then the forward and backward timed; the scoring rate\n"
    "  (pairs x A per second) beside a tight loop of the same vectorized tanh.\n";

int bench_additive(int argc, char **argv) {
    bench_part_args pa;
    const int rc = bench_part_scan(argc, argv, "--additive", USAGE, 3, 5, 64, &pa);
    if (rc >= 0) return rc;
    const bool quick = pa.quick, plant = pa.plant;
    const int threads = pa.threads, reps = pa.reps;
    const int64_t B = quick ? 2 : 8, L = quick ? 128 : 512, D = 128, A = 128;
    const int nt = threads > 0 ? threads : omp_get_max_threads();
    printf("additive attention: B=%lld Lq=Lk=%lld Dq=Dk=Dv=%lld A=%lld float32, %d threads, "
           "kernel %s\n", (long long)B, (long long)L, (long long)D, (long long)A, nt,
           attn_kernel_name());
    add_case c;
    build(&c, B, L, D, A);
    const bool ok = check(&c, threads, plant);
    if (!ok) {
        release(&c);
        printf("check FAILED: nothing timed\n");
        return 1;
    }
    double tf, uf, tb, ub, th, uh;
    time_calls(&c, threads, reps, false, &tf, &uf);
    time_calls(&c, threads, reps, true, &tb, &ub);
    tanh_rate(threads, &th, &uh);
    const double work = (double)B * L * L * A;
    const double extra = (double)B * 2 * L * A * 4 + nt * (2.0 * D + 64) * 4;
    printf("  %-18s %9s %12s %9s   %12s %9s\n", "", "wall ms", "G pair-A/s", "of tanh",
           "per CPU-s", "of tanh");
    printf("  %-18s %9.2f %12.3f %8.1f%%   %12.3f %8.1f%%\n", "forward (fused)", tf * 1e3,
           work / tf * 1e-9, 100 * work / tf / th, work / uf * 1e-9, 100 * work / uf / uh);
    printf("  %-18s %9.2f %12.3f %9s   %12.3f\n", "backward (fused)", tb * 1e3,
           work / tb * 1e-9, "", work / ub * 1e-9);
    printf("  %-18s %9s %12.3f %9s   %12.3f   (G tanh/s)\n", "tight tanh loop", "",
           th * 1e-9, "", uh * 1e-9);
    printf("  extra memory: %.1f MiB (Qp, Kp^T, tiles); a broadcast implementation holds "
           "Lq*Lk*A floats per batch: %.1f MiB (x B = %.0f MiB)\n", extra / 1048576,
           (double)L * L * A * 4 / 1048576, (double)B * L * L * A * 4 / 1048576);
    release(&c);
    return 0;
}
