/*
 * bench_mla.c — `attn bench --mla`: latent attention (MLA, DeepSeek-V2/V3's decoding) over
 *               a paged latent cache, K and V two views of the same rows
 *               (docs/CONTRACT.md, "Latent attention (MLA)").
 *
 * Method (docs/BENCHMARKS.md quotes it):
 *   - the case: B = 8 sequences of 8192 cached tokens (--quick: B 2, 1024), Hq = 128
 *     query heads on one latent head, latent rows of c_kv 512 + k_rope 64 (Dk 576, Dv 512),
 *     Lq = 1 (decoding), page 64 over a shuffled pool; float32 and bfloat16 caches,
 *     float32 queries and output;
 *   - each cache's first sequence is checked against ATTN_PATH_REFERENCE (the contract's
 *     float32 tolerance, tools/common/tolerance.h); --plant-error moves one output first
 *     and must fail;
 *   - two warm-up calls, then --reps timed calls, the median reported, as GFLOP/s
 *     (2 · B · Hq · Lq · Lk · (Dk + Dv)) and as % of the measured fp32 FMA peak of the
 *     kernel that runs (bench_machine.c): at 128 heads a cached row feeds 128 · 1088
 *     multiply-adds, so the arithmetic, not the read, bounds the step; the read rate of the
 *     cache is printed beside it.
 * What it is not: a test (no time limit anywhere).
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
#include "bench_machine.h"
#include "cliopt.h"
#include "core/half.h"
#include "rng.h"
#include "tolerance.h"

static const char USAGE[] =
    "usage: attn bench --mla [--quick] [--threads N] [--reps N] [--plant-error]\n"
    "\n"
    "  Latent attention (DeepSeek's MLA) decoding: B = 8, 8192 cached tokens each, 128 query\n"
    "  heads on one latent head, rows of 512 + 64 (K = the row, V = its first 512), page\n"
    "  64; float32 and bfloat16 caches, each checked against the float64 path, then the\n"
    "  median time as GFLOP/s and % of the measured fp32 peak.\n";

int bench_mla(int argc, char **argv) {
    bench_part_args pa;
    const int rc = bench_part_scan(argc, argv, "--mla", USAGE, 3, 7, 100, &pa);
    if (rc >= 0) return rc;
    const int threads = pa.threads, nt = threads > 0 ? threads : omp_get_max_threads();
    const int64_t B = pa.quick ? 2 : 8, Hq = 128, Lq = 1, Lk = pa.quick ? 1024 : 8192;
    const int64_t Dl = 512, Dr = 64, Dk = Dl + Dr, page = 64;
    const int64_t maxp = Lk / page, pages = B * maxp, rows = pages * page;

    machine m = {.threads = nt};
    if (machine_measure(&m, pa.quick, true)) return 1;
    machine_cpu_model(m.cpu, sizeof m.cpu);
    const char *isa;
    const double peak = machine_kernel_peak(&m, attn_kernel_name(), &isa);
    printf("MLA decoding: B=%lld Hq=%lld Hkv=1 Lq=%lld Lk=%lld Dk=%lld Dv=%lld page %lld, %d threads, "
           "kernel %s; CPU %s, fp32 peak (%s loops) %.1f GFLOP/s\n", (long long)B, (long long)Hq,
           (long long)Lq, (long long)Lk, (long long)Dk, (long long)Dl, (long long)page, nt,
           attn_kernel_name(), m.cpu, isa, peak);

    float *pool = malloc((size_t)(rows * Dk) * 4), *q = malloc((size_t)(B * Hq * Dk) * 4);
    uint16_t *pool16 = malloc((size_t)(rows * Dk) * 2);
    float *o = malloc((size_t)(B * Hq * Dl) * 4), *o_ref = malloc((size_t)(Hq * Dl) * 4);
    int32_t *table = malloc((size_t)pages * 4);
    double *t = malloc(sizeof(double) * (size_t)pa.reps);
    if (!pool || !q || !pool16 || !o || !o_ref || !table || !t)
        return fprintf(stderr, "attn: bench --mla: out of memory\n"), 1;
    rng_t r = {38};
    for (int64_t e = 0; e < rows * Dk; e++) {
        pool16[e] = attn_f32_to_bf16((float)rng_sym(&r));
        pool[e] = attn_bf16_to_f32(pool16[e]);
    }
    for (int64_t e = 0; e < B * Hq * Dk; e++) q[e] = (float)rng_sym(&r);
    for (int64_t e = 0; e < pages; e++) table[e] = (int32_t)e;
    for (int64_t e = pages - 1; e > 0; e--) {  // shuffled: no sequence reads its pages in order
        const int64_t z = rng_int(&r, e + 1);
        const int32_t x = table[e];
        table[e] = table[z], table[z] = x;
    }

    const attn_tensor tq = attn_tensor_4d(q, ATTN_F32, B, Hq, Lq, Dk);
    const attn_tensor to = attn_tensor_4d(o, ATTN_F32, B, Hq, Lq, Dl);
    const attn_tensor tt = {table, ATTN_I32, {B, maxp, 1, 1}, {maxp, 1, 0, 0}};
    const double flops = 2.0 * (double)(B * Hq * Lq * Lk) * (double)(Dk + Dl);
    printf("  %-8s %9s %10s %8s %12s %7s\n", "cache", "median ms", "GFLOP/s", "% peak", "cache GB/s", "check");
    int failed = 0;
    for (int c = 0; c < 2; c++) {
        const attn_dtype dt = c ? ATTN_BF16 : ATTN_F32;
        attn_tensor tk = {c ? (void *)pool16 : (void *)pool, dt, {pages, 1, page, Dk},
                          {page * Dk, page * Dk, Dk, 1}};
        attn_tensor tv = tk;
        tv.shape[3] = Dl;  // V = c_kv, the rows' first 512 columns
        attn_options opt = {.threads = threads, .block_table = &tt};
        attn_status st = attn_forward(&tq, &tk, &tv, &to, &opt);
        /* the check: the first sequence on the float64 path */
        const attn_tensor tq1 = attn_tensor_4d(q, ATTN_F32, 1, Hq, Lq, Dk);
        const attn_tensor tr1 = attn_tensor_4d(o_ref, ATTN_F32, 1, Hq, Lq, Dl);
        const attn_tensor tt1 = {table, ATTN_I32, {1, maxp, 1, 1}, {maxp, 1, 0, 0}};
        attn_options ro = {.threads = threads, .block_table = &tt1, .path = ATTN_PATH_REFERENCE};
        if (st == ATTN_OK) st = attn_forward(&tq1, &tk, &tv, &tr1, &ro);
        if (st != ATTN_OK) return fprintf(stderr, "attn: bench --mla: %s\n", attn_last_error()), 1;
        if (pa.plant && c == 0) o[Dl / 3] += 1e-3f * (1.0f + fabsf(o[Dl / 3]));
        tol_acc a = tol_start();
        for (int64_t e = 0; e < Hq * Dl; e++) tol_add(&a, e, o[e], o_ref[e]);
        tol_result res;
        const bool ok = tol_pass(&a, &res);
        failed += !ok;
        if (!ok) {
            printf("  %-8s check FAILED: rel %.2e max %.2e: not timed\n", c ? "bfloat16" : "float32",
                   res.rel_err, res.max_err);
            continue;
        }
        for (int w = 0; w < 2; w++) attn_forward(&tq, &tk, &tv, &to, &opt);
        for (int i = 0; i < pa.reps; i++) {
            const double t0 = now_s();
            attn_forward(&tq, &tk, &tv, &to, &opt);
            t[i] = now_s() - t0;
        }
        const double med = median(t, pa.reps), gf = flops / med * 1e-9;
        const double bytes = (double)(B * Lk * Dk) * (c ? 2.0 : 4.0);
        printf("  %-8s %9.3f %10.1f %7.1f%% %12.2f %7s\n", c ? "bfloat16" : "float32", med * 1e3, gf,
               peak > 0 ? 100.0 * gf / peak : 0.0, bytes / med * 1e-9, "ok");
    }
    free(pool), free(q), free(pool16), free(o), free(o_ref), free(table), free(t);
    return failed ? 1 : 0;
}
