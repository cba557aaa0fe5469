/*
 * bench_bias_grad.c — `attn bench --bias-grad`: what the bias's gradient
 *                     (attn_options.d_bias) costs the fused backward.
 *
 * Method:
 *   - the case is B = 2, H = 8, Lq = Lk = 1024, D = 64, float32, causal, with a float bias
 *     (--quick: L = 256). Rows, all the backward with the bias: without d_bias; with it
 *     for a bias of T5's shape [1, H, L, L] (broadcast over the batch: every logit's
 *     gradient stored, then summed over b); and a full [B, H, L, L] bias (written in
 *     place) without and with it;
 *   - the answer is checked first on a smaller case (B 2, H 2, L 160, D 32, the full bias):
 *     the fused d_bias against the reference path's, the contract's float32 tolerance
 *     (tools/common/tolerance.h); --plant-error perturbs the fused d_bias first, and the
 *     check must fail;
 *   - one warm-up call per row, then rounds that run the rows in turn (--reps rounds,
 *     default 5): medians of the wall and the process's CPU time, and each d_bias row's
 *     ratio to the row without it.
 * What it is not: a test (no time limit anywhere), or a comparison with PyTorch.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "bench_clock.h"
#include "cli.h"
#include "cliopt.h"
#include "rng.h"
#include "tolerance.h"

typedef struct bcase {
    int64_t B, H, L, D;
    float *q, *k, *v, *o, *lse, *d_o, *dq, *dk, *dv, *bias, *db;
    attn_tensor tq, tk, tv, to, tl, tdo, tdq, tdk, tdv, tbias, tdb;
} bcase;

static float *filled(int64_t n, rng_t *r, double a) {
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (x)
        for (int64_t e = 0; e < n; e++) x[e] = (float)(a * rng_sym(r));
    return x;
}

/* bias_b: the bias's batch dimension, 1 (shared) or B */
static bool build(bcase *c, int64_t B, int64_t H, int64_t L, int64_t D, int64_t bias_b) {
    memset(c, 0, sizeof *c);
    c->B = B, c->H = H, c->L = L, c->D = D;
    rng_t r = {RNG_CASE(H, L, D)};
    const int64_t n = B * H * L * D, nb = bias_b * H * L * L;
    float **bufs[] = {&c->q, &c->k, &c->v, &c->o, &c->d_o, &c->dq, &c->dk, &c->dv};
    for (int a = 0; a < 8; a++)
        if (!(*bufs[a] = filled(n, &r, 1.0))) return false;
    if (!(c->lse = filled(B * H * L, &r, 1.0)) || !(c->bias = filled(nb, &r, 2.0)) ||
        !(c->db = filled(nb, &r, 1.0)))
        return false;
    attn_tensor *ts[] = {&c->tq, &c->tk, &c->tv, &c->to, &c->tdo, &c->tdq, &c->tdk, &c->tdv};
    for (int a = 0; a < 8; a++) *ts[a] = attn_tensor_4d(*bufs[a], ATTN_F32, B, H, L, D);
    c->tl = attn_tensor_4d(c->lse, ATTN_F32, B, H, L, 1);
    c->tbias = attn_tensor_4d(c->bias, ATTN_F32, bias_b, H, L, L);
    c->tdb = attn_tensor_4d(c->db, ATTN_F32, bias_b, H, L, L);
    return true;
}

static void release(bcase *c) {
    float *bufs[] = {c->q, c->k, c->v, c->o, c->d_o, c->dq, c->dk, c->dv, c->lse, c->bias, c->db};
    for (int a = 0; a < 11; a++) free(bufs[a]);
}

static attn_options opts(bcase *c, bool want_db, int threads, attn_path path) {
    attn_options o = {.causal = true, .bias = &c->tbias, .threads = threads, .path = path};
    if (want_db) o.d_bias = &c->tdb;
    return o;
}

static attn_status fwd(bcase *c, int threads, attn_path path) {
    attn_options o = opts(c, false, threads, path);
    o.lse = &c->tl;
    return attn_forward(&c->tq, &c->tk, &c->tv, &c->to, &o);
}

static attn_status bwd(bcase *c, bool want_db, int threads, attn_path path) {
    const attn_options o = opts(c, want_db, threads, path);
    return attn_backward(&c->tq, &c->tk, &c->tv, &c->to, &c->tdo, &c->tl, &c->tdq, &c->tdk,
                         &c->tdv, &o);
}

/* the fused d_bias (a full bias) against the reference path's */
static bool check_answer(int threads, bool plant) {
    bcase f, r;
    bool ok = build(&f, 2, 2, 160, 32, 2) && build(&r, 2, 2, 160, 32, 2);
    ok = ok && fwd(&f, threads, ATTN_PATH_FUSED) == ATTN_OK && fwd(&r, threads, ATTN_PATH_REFERENCE) == ATTN_OK;
    ok = ok && bwd(&f, true, threads, ATTN_PATH_FUSED) == ATTN_OK &&
         bwd(&r, true, threads, ATTN_PATH_REFERENCE) == ATTN_OK;
    if (ok) {
        if (plant) f.db[160 * 17 + 3] *= 1.01f;
        tol_acc a = tol_start();
        for (int64_t e = 0; e < 2 * 2 * 160 * 160; e++) tol_add(&a, e, f.db[e], r.db[e]);
        ok = tol_pass(&a, NULL);
    }
    release(&f), release(&r);
    return ok;
}

static const char USAGE[] =
    "usage: attn bench --bias-grad [--quick] [--threads N] [--reps N] [--plant-error]\n"
    "\n"
    "  The cost of the bias's gradient: the backward with a float bias (B 2, H 8, L 1024,\n"
    "  D 64, float32, causal; --quick L 256) without d_bias, with it for a [1, H, L, L]\n"
    "  bias (T5's) and for a [B, H, L, L] one, after checking the fused d_bias against the\n"
    "  reference path's; medians of wall and CPU time.\n";

int bench_bias_grad(int argc, char **argv) {
    bench_part_args pa;
    const int rc = bench_part_scan(argc, argv, "--bias-grad", USAGE, 5, 5, 200, &pa);
    if (rc >= 0) return rc;
    const int threads = pa.threads, reps = pa.reps;
    if (!check_answer(threads, pa.plant)) {
        fprintf(stderr, "bench --bias-grad: the fused d_bias differs from the reference's%s\n",
                pa.plant ? " (planted error: as it should)" : "");
        return 1;
    }
    printf("answer: fused d_bias within the float32 tolerance of the reference path's "
           "(B 2, H 2, L 160, D 32, causal, a full bias)\n");
    const int64_t L = pa.quick ? 256 : 1024;
    bcase shared, full;
    if (!build(&shared, 2, 8, L, 64, 1) || !build(&full, 2, 8, L, 64, 2)) {
        fprintf(stderr, "bench --bias-grad: out of memory\n");
        return 1;
    }
    /* rows: each bias without d_bias, then with it (its ratio to the row before) */
    enum { ROWS = 4 };
    bcase *cs[ROWS] = {&shared, &shared, &full, &full};
    const bool want[ROWS] = {false, true, false, true};
    static const char *const name[ROWS] = {"bias [1,H,L,L]", "  + d_bias", "bias [B,H,L,L]",
                                           "  + d_bias"};
    double *t = malloc((size_t)(ROWS * reps) * sizeof(double)), *tc = malloc((size_t)(ROWS * reps) * sizeof(double));
    if (!t || !tc) return 1;
    for (int w = 0; w < ROWS; w++) {  // the backward's O and LSE, and a warm-up
        if (!want[w] && fwd(cs[w], threads, ATTN_PATH_FUSED) != ATTN_OK) return 1;
        if (bwd(cs[w], want[w], threads, ATTN_PATH_FUSED) != ATTN_OK) {
            fprintf(stderr, "bench --bias-grad: %s\n", attn_last_error());
            return 1;
        }
    }
    for (int r = 0; r < reps; r++)
        for (int w = 0; w < ROWS; w++) {
            const double t0 = now_s(), c0 = cpu_s();
            bwd(cs[w], want[w], threads, ATTN_PATH_FUSED);
            t[w * reps + r] = now_s() - t0;
            tc[w * reps + r] = cpu_s() - c0;
        }
    printf("kernel %s, B 2, H 8, L %lld, D 64, float32, causal, threads %d (0 = default), "
           "median of %d rounds\n", attn_kernel_name(), (long long)L, threads, reps);
    double med[ROWS], medc[ROWS];
    for (int w = 0; w < ROWS; w++) {
        qsort(t + w * reps, (size_t)reps, sizeof(double), cmp_double);
        qsort(tc + w * reps, (size_t)reps, sizeof(double), cmp_double);
        med[w] = t[w * reps + reps / 2];
        medc[w] = tc[w * reps + reps / 2];
        printf("backward, %-18s %8.2f ms wall  %8.2f ms CPU", name[w], 1e3 * med[w], 1e3 * medc[w]);
        if (want[w]) printf("   (%.2fx without, wall; %.2fx CPU)", med[w] / med[w - 1], medc[w] / medc[w - 1]);
        printf("\n");
    }
    free(t), free(tc);
    release(&shared), release(&full);
    return 0;
}
