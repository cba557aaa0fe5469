/*
 * bench_f64.c — `attn bench --f64`: the float64 path, forward under bool masks and the
 *               fused backward beside the materializing reference backward.
 *
 * Method:
 *   - the case is B = 1, Hq = Hkv = 4, Lq = Lk = 1024, Dk = Dv = 64, float64 throughout
 *     (--quick: Hq = Hkv = 2, L = 256); q, k, v and dO standard normal (rng.h);
 *   - the forward rows: no mask; a key-padding bool mask [B, 1, 1, Lk] keeping the first
 *     3/4 of the keys; a random bool mask [B, Hq, Lq, Lk] keeping each key with
 *     probability 1/2. The backward rows: fused and ATTN_PATH_REFERENCE, with no mask and
 *     with the key-padding mask;
 *   - first each row's fused answer is checked against ATTN_PATH_REFERENCE: every element
 *     within 1e-10 of the largest |reference| element of its tensor (the float64 error
 *     is near 1e-14 here); --plant-error moves one fused element by 1e-8 of that scale
 *     and must fail;
 *   - one warm-up call of each row, then --reps rounds (default 7), each timing every
 *     row once in turn (the rows interleaved, so a load that changes over the run reaches
 *     every row alike); the median of each row reported, its wall time and the CPU time
 *     of the process over all threads (the fairer figure on a machine other processes
 *     share), with GFLOP/s (of the wall time) from
 *     4 Lq Lk D Hq (forward) and 10 Lq Lk D Hq (backward: five products) whatever the
 *     masks skip.
 * What it is not: a test (no time limit anywhere), or a comparison with PyTorch.
 */
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "bench_clock.h"
#include "cliopt.h"
#include "rng.h"

static const char USAGE[] =
    "usage: attn bench --f64 [--quick] [--threads N] [--reps N] [--plant-error]\n"
    "\n"
    "  float64 (B = 1, H = 4, L = 1024, D = 64): the fused forward with no mask, a\n"
    "  key-padding bool mask and a random bool mask; the fused backward and the reference\n"
    "  backward, with no mask and with the key-padding mask. Each checked against the\n"
    "  reference path first, then medians of interleaved rounds.\n";

enum { ROW_FWD, ROW_FWD_PAD, ROW_FWD_RAND, ROW_BWD, ROW_BWD_REF, ROW_BWD_PAD, ROW_BWD_PAD_REF, ROWS };
static const char *const ROW_NAME[ROWS] = {
    "forward, no mask", "forward, key-padding mask", "forward, random mask",
    "backward fused, no mask", "backward reference, no mask", "backward fused, key padding",
    "backward reference, key padding",
};

typedef struct f64_case {
    int64_t B, H, L, D, nq, nr;  // nq: elements of q (= k = v = o), nr: rows
    double *q, *k, *v, *o, *d_o, *lse, *g[3];
    attn_tensor tq, tk, tv, to, tdo, tlse, tg[3], tpad, trand;
    uint8_t *pad, *rand_mask;
    int threads;
} f64_case;

static void fill(double *x, int64_t n, uint64_t seed) {
    rng_t r = {seed};
    for (int64_t e = 0; e < n; e++) x[e] = rng_normal(&r);
}

/* Row `row` once, into the case's o (forward) or g (backward), through `path`. */
static attn_status run_row(f64_case *c, int row, attn_path path) {
    attn_options opt = {.threads = c->threads, .path = path};
    if (row == ROW_FWD_PAD || row == ROW_BWD_PAD || row == ROW_BWD_PAD_REF) opt.mask = &c->tpad;
    if (row == ROW_FWD_RAND) opt.mask = &c->trand;
    if (row < ROW_BWD) return attn_forward(&c->tq, &c->tk, &c->tv, &c->to, &opt);
    if (row == ROW_BWD_REF || row == ROW_BWD_PAD_REF) opt.path = ATTN_PATH_REFERENCE;
    return attn_backward(&c->tq, &c->tk, &c->tv, &c->to, &c->tdo, &c->tlse, &c->tg[0], &c->tg[1],
                         &c->tg[2], &opt);
}

/* The backward's inputs for a mask: O and the float64 LSE of the forward with it. */
static attn_status forward_for(f64_case *c, const attn_tensor *mask) {
    attn_options opt = {.threads = c->threads, .mask = mask, .lse = &c->tlse};
    return attn_forward(&c->tq, &c->tk, &c->tv, &c->to, &opt);
}

/* |got - ref| <= 1e-10 max |ref| for every element */
static bool close_to(const double *got, const double *ref, int64_t n, double *err) {
    double scale = 0, worst = 0;
    for (int64_t e = 0; e < n; e++) scale = fmax(scale, fabs(ref[e]));
    bool ok = true;
    for (int64_t e = 0; e < n; e++) {
        const double d = fabs(got[e] - ref[e]);
        if (!(d <= 1e-10 * scale)) ok = false;
        if (d > worst) worst = d;
    }
    *err = scale > 0 ? worst / scale : worst;
    return ok;
}

/* Checks one fused row against the reference; prints the line. */
static bool check_row(f64_case *c, int row, bool plant, double *scratch) {
    const int nout = row < ROW_BWD ? 1 : 3;
    double *out[3] = {c->o, c->g[1], c->g[2]};
    if (row >= ROW_BWD) out[0] = c->g[0];
    const int64_t n = c->nq;
    if (row >= ROW_BWD) {
        const attn_tensor *m = row == ROW_BWD_PAD ? &c->tpad : NULL;
        if (forward_for(c, m) != ATTN_OK) return false;
    }
    if (run_row(c, row, ATTN_PATH_REFERENCE) != ATTN_OK) return false;
    for (int t = 0; t < nout; t++) memcpy(scratch + t * n, out[t], (size_t)n * sizeof(double));
    if (run_row(c, row, ATTN_PATH_AUTO) != ATTN_OK) return false;
    if (plant) out[0][n / 3] += 1e-8 * (1.0 + fabs(out[0][n / 3]));
    bool ok = true;
    double worst = 0;
    for (int t = 0; t < nout; t++) {
        double e;
        ok &= close_to(out[t], scratch + t * n, n, &e);
        if (e > worst) worst = e;
    }
    printf("  %-32s fused vs reference: max |diff| / max |ref| %.2e %s\n", ROW_NAME[row], worst,
           ok ? "ok" : "FAILED");
    return ok;
}

int bench_f64(int argc, char **argv) {
    bench_part_args pa;
    const int rc = bench_part_scan(argc, argv, "--f64", USAGE, 3, 7, 200, &pa);
    if (rc >= 0) return rc;
    f64_case c = {.B = 1, .H = pa.quick ? 2 : 4, .L = pa.quick ? 256 : 1024, .D = 64,
                  .threads = pa.threads};
    const int nt = pa.threads > 0 ? pa.threads : omp_get_max_threads();
    c.nq = c.B * c.H * c.L * c.D;
    c.nr = c.B * c.H * c.L;
    printf("float64: B=%lld H=%lld Lq=Lk=%lld D=%lld, %d threads\n", (long long)c.B,
           (long long)c.H, (long long)c.L, (long long)c.D, nt);
    double *buf = malloc((size_t)(9 * c.nq + c.nr) * sizeof(double));
    c.pad = malloc((size_t)(c.B * c.L));
    c.rand_mask = malloc((size_t)(c.B * c.H * c.L * c.L));
    if (!buf || !c.pad || !c.rand_mask) return fprintf(stderr, "attn: bench --f64: out of memory\n"), 1;
    double *scratch = buf + 6 * c.nq;  // 3 tensors of the reference's answer
    c.q = buf, c.k = buf + c.nq, c.v = buf + 2 * c.nq, c.o = buf + 3 * c.nq;
    c.d_o = buf + 4 * c.nq, c.g[0] = buf + 5 * c.nq;
    c.lse = buf + 9 * c.nq;
    double *g12 = malloc((size_t)(2 * c.nq) * sizeof(double));
    if (!g12) return fprintf(stderr, "attn: bench --f64: out of memory\n"), 1;
    c.g[1] = g12, c.g[2] = g12 + c.nq;
    fill(c.q, c.nq, 1), fill(c.k, c.nq, 2), fill(c.v, c.nq, 3), fill(c.d_o, c.nq, 4);
    rng_t r = {5};
    for (int64_t j = 0; j < c.B * c.L; j++) c.pad[j] = j % c.L < c.L * 3 / 4;
    for (int64_t e = 0; e < c.B * c.H * c.L * c.L; e++) c.rand_mask[e] = rng_unif(&r) < 0.5;
    c.tq = attn_tensor_4d(c.q, ATTN_F64, c.B, c.H, c.L, c.D);
    c.tk = attn_tensor_4d(c.k, ATTN_F64, c.B, c.H, c.L, c.D);
    c.tv = attn_tensor_4d(c.v, ATTN_F64, c.B, c.H, c.L, c.D);
    c.to = attn_tensor_4d(c.o, ATTN_F64, c.B, c.H, c.L, c.D);
    c.tdo = attn_tensor_4d(c.d_o, ATTN_F64, c.B, c.H, c.L, c.D);
    c.tlse = attn_tensor_4d(c.lse, ATTN_F64, c.B, c.H, c.L, 1);
    for (int t = 0; t < 3; t++) c.tg[t] = attn_tensor_4d(c.g[t], ATTN_F64, c.B, c.H, c.L, c.D);
    c.tpad = (attn_tensor){c.pad, ATTN_BOOL, {c.B, 1, 1, c.L}, {c.L, 0, 0, 1}};
    c.trand = attn_tensor_4d(c.rand_mask, ATTN_BOOL, c.B, c.H, c.L, c.L);

    int failed = 0;
    const int checked[] = {ROW_FWD, ROW_FWD_PAD, ROW_FWD_RAND, ROW_BWD, ROW_BWD_PAD};
    for (int x = 0; x < 5; x++) failed += !check_row(&c, checked[x], pa.plant && x == 3, scratch);
    if (failed) {
        printf("check FAILED: nothing timed\n");
        return 1;
    }

    /* the backward rows read O and LSE of the unmasked forward (the timing does not
     * depend on their values) */
    forward_for(&c, NULL);
    double *t = malloc(sizeof(double) * (size_t)(2 * pa.reps * ROWS)), *tc = t + pa.reps * ROWS;
    if (!t) return fprintf(stderr, "attn: bench --f64: out of memory\n"), 1;
    for (int row = 0; row < ROWS; row++) run_row(&c, row, ATTN_PATH_AUTO);
    for (int rep = 0; rep < pa.reps; rep++)
        for (int row = 0; row < ROWS; row++) {
            const double t0 = now_s(), c0 = cpu_s();
            run_row(&c, row, ATTN_PATH_AUTO);
            t[row * pa.reps + rep] = now_s() - t0;
            tc[row * pa.reps + rep] = cpu_s() - c0;
        }
    const double flop = (double)(c.B * c.H) * (double)c.L * (double)c.L * (double)c.D;
    double med[ROWS], cpu[ROWS];
    printf("  %-32s %10s %9s %9s\n", "row", "median ms", "CPU ms", "GFLOP/s");
    for (int row = 0; row < ROWS; row++) {
        med[row] = median(t + row * pa.reps, pa.reps);
        cpu[row] = median(tc + row * pa.reps, pa.reps);
        const double f = (row < ROW_BWD ? 4.0 : 10.0) * flop;
        printf("  %-32s %10.2f %9.2f %9.2f", ROW_NAME[row], med[row] * 1e3, cpu[row] * 1e3,
               f / med[row] * 1e-9);
        if (row == ROW_FWD_PAD || row == ROW_FWD_RAND)
            printf("   (time / no mask's: wall %.2fx, CPU %.2fx)", med[row] / med[ROW_FWD], cpu[row] / cpu[ROW_FWD]);
        if (row == ROW_BWD_REF || row == ROW_BWD_PAD_REF)
            printf("   (reference / fused: wall %.2fx, CPU %.2fx)", med[row] / med[row - 1], cpu[row] / cpu[row - 1]);
        printf("\n");
    }
    free(t), free(buf), free(g12), free(c.pad), free(c.rand_mask);
    return 0;
}
