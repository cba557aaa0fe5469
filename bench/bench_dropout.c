/*
 * bench_dropout.c — `attn bench --dropout`: what dropout costs the fused forward and
 *                   backward.
 *
 * Method:
 *   - the case is B = 1, Hq = Hkv = 8, Lq = Lk = 1024, Dk = Dv = 64, float32, no mask
 *     (--quick: Lq = Lk = 256); rows p = 0 (no dropout) and p = 0.1, forward (with its
 *     LSE) and backward;
 *   - the answer is checked first on a smaller case (B = 1, H = 2, L = 160, D = 32, causal,
 *     p = 0.1): the fused O and dQ, dK, dV against the reference path with the same mask,
 *     the contract's float32 tolerance (tools/common/tolerance.h); --plant-error perturbs the
 *     fused O first, and the check must fail;
 *   - one warm-up call, then --reps timed calls (default 5) per row; the median wall time
 *     and the median CPU time of the process (all threads: the fairer figure on a machine
 *     shared with other work) are reported, and the dropout rows' ratios to the p = 0
 *     rows of the same run.
 * What it is not: a test (no time limit anywhere), or a comparison with PyTorch.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attn.h"
#include "bench_clock.h"
#include "cliopt.h"
#include "cli.h"
#include "rng.h"
#include "tolerance.h"

typedef struct dcase {
    int64_t H, L, D;
    float *q, *k, *v, *o, *lse, *d_o, *dq, *dk, *dv;
    attn_tensor tq, tk, tv, to, tl, tdo, tdq, tdk, tdv;
} dcase;

static float *filled(int64_t n, rng_t *r) {
    float *x = malloc((size_t)n * sizeof(float));
    if (x)
        for (int64_t e = 0; e < n; e++) x[e] = (float)rng_sym(r);
    return x;
}

static bool build(dcase *c, int64_t H, int64_t L, int64_t D) {
    memset(c, 0, sizeof *c);
    c->H = H, c->L = L, c->D = D;
    rng_t r = {RNG_CASE(H, L, D)};
    const int64_t n = H * L * D;
    float **bufs[] = {&c->q, &c->k, &c->v, &c->o, &c->d_o, &c->dq, &c->dk, &c->dv};
    for (int a = 0; a < 8; a++)
        if (!(*bufs[a] = filled(n, &r))) return false;
    if (!(c->lse = filled(H * L, &r))) return false;
    attn_tensor *ts[] = {&c->tq, &c->tk, &c->tv, &c->to, &c->tdo, &c->tdq, &c->tdk, &c->tdv};
    for (int a = 0; a < 8; a++) *ts[a] = attn_tensor_4d(*bufs[a], ATTN_F32, 1, H, L, D);
    c->tl = attn_tensor_4d(c->lse, ATTN_F32, 1, H, L, 1);
    return true;
}

static void release(dcase *c) {
    float *bufs[] = {c->q, c->k, c->v, c->o, c->d_o, c->dq, c->dk, c->dv, c->lse};
    for (int a = 0; a < 9; a++) free(bufs[a]);
}

static attn_status fwd(dcase *c, const attn_options *base) {
    attn_options o = *base;
    o.lse = &c->tl;
    return attn_forward(&c->tq, &c->tk, &c->tv, &c->to, &o);
}

static attn_status bwd(dcase *c, const attn_options *o) {
    return attn_backward(&c->tq, &c->tk, &c->tv, &c->to, &c->tdo, &c->tl, &c->tdq, &c->tdk,
                         &c->tdv, o);
}

static bool close_enough(const float *got, const float *ref, int64_t n) {
    tol_acc a = tol_start();
    for (int64_t e = 0; e < n; e++) tol_add(&a, e, got[e], ref[e]);
    return tol_pass(&a, NULL);
}

/* the fused path against the reference path with the same mask */
static bool check_answer(int threads, bool plant) {
    dcase f, r;
    if (!build(&f, 2, 160, 32) || !build(&r, 2, 160, 32)) return false;
    const attn_options o = {.causal = true, .dropout_p = 0.1f, .dropout_seed = 42, .threads = threads};
    attn_options ro = o;
    ro.path = ATTN_PATH_REFERENCE;
    bool ok = fwd(&f, &o) == ATTN_OK && fwd(&r, &ro) == ATTN_OK;
    if (plant) f.o[17] *= 1.001f;
    ok = ok && bwd(&f, &o) == ATTN_OK && bwd(&r, &ro) == ATTN_OK;
    const int64_t n = 2 * 160 * 32;
    ok = ok && close_enough(f.o, r.o, n) && close_enough(f.dq, r.dq, n) &&
         close_enough(f.dk, r.dk, n) && close_enough(f.dv, r.dv, n);
    release(&f), release(&r);
    return ok;
}

static const char USAGE[] =
    "usage: attn bench --dropout [--quick] [--threads N] [--reps N] [--plant-error]\n"
    "\n"
    "  The cost of dropout: the forward and the backward at p = 0 and p = 0.1 (B 1, H 8,\n"
    "  L 1024, D 64, float32; --quick L 256), after checking the fused answer against the\n"
    "  reference with the same mask; medians of wall and CPU time.\n";

int bench_dropout(int argc, char **argv) {
    bench_part_args pa;
    const int rc = bench_part_scan(argc, argv, "--dropout", USAGE, 5, 5, 200, &pa);
    if (rc >= 0) return rc;
    const bool quick = pa.quick, plant = pa.plant;
    const int threads = pa.threads, reps = pa.reps;
    if (!check_answer(threads, plant)) {
        fprintf(stderr, "bench --dropout: the fused answer differs from the reference's "
                "(with the same mask)%s\n", plant ? " (planted error: as it should)" : "");
        return 1;
    }
    printf("answer: fused O, dQ, dK, dV within the float32 tolerance of the reference "
           "(p = 0.1, same mask)\n");
    const int64_t L = quick ? 256 : 1024;
    dcase c;
    if (!build(&c, 8, L, 64)) {
        fprintf(stderr, "bench --dropout: out of memory\n");
        return 1;
    }
    double *t = malloc((size_t)reps * sizeof(double)), *tc = malloc((size_t)reps * sizeof(double));
    double med[2][2], medc[2][2];
    printf("kernel %s, B 1, H 8, L %lld, D 64, float32, threads %d (0 = default), median of %d\n",
           attn_kernel_name(), (long long)L, threads, reps);
    for (int dir = 0; dir < 2; dir++)
        for (int d = 0; d < 2; d++) {
            const attn_options o = {.dropout_p = d ? 0.1f : 0.0f, .dropout_seed = 7, .threads = threads};
            fwd(&c, &o);  // warm-up (and the backward's O, LSE)
            if (dir) bwd(&c, &o);
            for (int r = 0; r < reps; r++) {
                const double t0 = now_s(), c0 = cpu_s();
                if (dir) bwd(&c, &o);
                else fwd(&c, &o);
                t[r] = now_s() - t0;
                tc[r] = cpu_s() - c0;
            }
            qsort(t, (size_t)reps, sizeof(double), cmp_double);
            qsort(tc, (size_t)reps, sizeof(double), cmp_double);
            med[dir][d] = t[reps / 2];
            medc[dir][d] = tc[reps / 2];
            printf("%-8s p = %.1f   %8.2f ms wall  %8.2f ms CPU%s", dir ? "backward" : "forward",
                   d ? 0.1 : 0.0, 1e3 * med[dir][d], 1e3 * medc[dir][d], d ? "" : "\n");
            if (d) printf("   (%.2fx p = 0 wall, %.2fx CPU)\n", med[dir][1] / med[dir][0],
                          medc[dir][1] / medc[dir][0]);
        }
    free(t), free(tc);
    release(&c);
    return 0;
}
