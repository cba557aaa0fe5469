/*
 * bench_step.c — `attn bench --step`: a server's mixed step in one call (attn_varlen_forward
 *                over a paged cache: docs/CONTRACT.md, "Many requests in one call") against
 *                the same requests as separate attn_forward calls.
 *
 * Method (docs/BENCHMARKS.md quotes it):
 *   - the step: 32 decodes (Lq 1, caches of 1024 to 4095 tokens) and 2 chunks of prefill
 *     of 512 new tokens after 1536 cached (--quick: 8 decodes, chunks of 64 after 192),
 *     Hq 32, Hkv 8, D 128, bottom-right causal, float32 queries, bfloat16 paged cache, page
 *     16 over a shuffled pool;
 *   - the check: the one call's output is the separate calls' bit for bit (--plant-error
 *     moves one element of it first and must fail);
 *   - rounds alternate the one call and the loop of separate calls (two warm-ups each, then
 *     --reps rounds), medians reported as GFLOP/s (4 · Hq · D per query row and key it
 *     sees) and their ratio.
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
#include "cliopt.h"
#include "core/half.h"
#include "rng.h"

static const char USAGE[] =
    "usage: attn bench --step [--quick] [--threads N] [--reps N] [--plant-error]\n"
    "\n"
    "  A mixed serving step, 32 decodes and 2 prefill chunks of 512 (Hq 32, Hkv 8, D 128,\n"
    "  bfloat16 paged cache, page 16), as one attn_varlen_forward call and as separate\n"
    "  attn_forward calls: checked bit for bit, then the medians of alternating rounds.\n";

int bench_step(int argc, char **argv) {
    bench_part_args pa;
    const int rc = bench_part_scan(argc, argv, "--step", USAGE, 3, 15, 200, &pa);
    if (rc >= 0) return rc;
    const int nt = pa.threads > 0 ? pa.threads : omp_get_max_threads();
    const int ndec = pa.quick ? 8 : 32, nreq = ndec + 2;
    const int64_t chunk = pa.quick ? 64 : 512, before = pa.quick ? 192 : 1536;
    const int64_t Hq = 32, Hkv = 8, D = 128, page = 16;
    int64_t *lq = malloc(sizeof(int64_t) * (size_t)nreq), *lk = malloc(sizeof(int64_t) * (size_t)nreq);
    int32_t *cu = malloc(sizeof(int32_t) * (size_t)(nreq + 1));
    if (!lq || !lk || !cu) return fprintf(stderr, "attn: bench --step: out of memory\n"), 1;
    rng_t r = {512};
    int64_t max_k = 0, max_q = 0;
    double flops = 0;
    cu[0] = 0;
    for (int s = 0; s < nreq; s++) {
        lq[s] = s < ndec ? 1 : chunk;
        lk[s] = s < ndec ? (pa.quick ? 256 : 1024) + rng_int(&r, pa.quick ? 256 : 3072) : before + chunk;
        cu[s + 1] = cu[s] + (int32_t)lq[s];
        if (lk[s] > max_k) max_k = lk[s];
        if (lq[s] > max_q) max_q = lq[s];
        for (int64_t i = 0; i < lq[s]; i++) flops += 4.0 * (double)(Hq * D) * (double)(lk[s] - lq[s] + i + 1);
    }
    const int64_t total_q = cu[nreq], maxp = (max_k + page - 1) / page, pages = nreq * maxp;
    const int64_t npool = pages * Hkv * page * D;
    printf("mixed step: %d decodes + 2 prefill chunks of %lld (after %lld cached), Hq=%lld Hkv=%lld "
           "D=%lld, bfloat16 paged cache (page %lld), %d threads, kernel %s; %.2f GFLOP a step\n",
           ndec, (long long)chunk, (long long)before, (long long)Hq, (long long)Hkv, (long long)D,
           (long long)page, nt, attn_kernel_name(), flops * 1e-9);

    uint16_t *kp = malloc((size_t)npool * 2), *vp = malloc((size_t)npool * 2);
    float *q = malloc((size_t)(total_q * Hq * D) * 4);
    float *o1 = malloc((size_t)(total_q * Hq * D) * 4), *o2 = malloc((size_t)(total_q * Hq * D) * 4);
    int32_t *table = malloc((size_t)pages * 4);
    int64_t *lens = malloc(sizeof(int64_t) * (size_t)nreq);
    double *t1 = malloc(sizeof(double) * (size_t)pa.reps), *t2 = malloc(sizeof(double) * (size_t)pa.reps);
    if (!kp || !vp || !q || !o1 || !o2 || !table || !lens || !t1 || !t2)
        return fprintf(stderr, "attn: bench --step: out of memory\n"), 1;
    for (int64_t e = 0; e < npool; e++)
        kp[e] = attn_f32_to_bf16((float)rng_sym(&r)), vp[e] = attn_f32_to_bf16((float)rng_sym(&r));
    for (int64_t e = 0; e < total_q * Hq * D; e++) q[e] = (float)rng_sym(&r);
    for (int64_t e = 0; e < pages; e++) table[e] = (int32_t)e;
    for (int64_t e = pages - 1; e > 0; e--) {
        const int64_t z = rng_int(&r, e + 1);
        const int32_t x = table[e];
        table[e] = table[z], table[z] = x;
    }
    for (int s = 0; s < nreq; s++) lens[s] = lk[s];

    const attn_tensor tk = attn_tensor_4d(kp, ATTN_BF16, pages, Hkv, page, D);
    const attn_tensor tv = attn_tensor_4d(vp, ATTN_BF16, pages, Hkv, page, D);
    const attn_tensor tq = {q, ATTN_F32, {1, Hq, total_q, D}, {0, D, Hq * D, 1}};
    const attn_tensor to1 = {o1, ATTN_F32, {1, Hq, total_q, D}, {0, D, Hq * D, 1}};
    const attn_tensor tt = attn_tensor_4d(table, ATTN_I32, nreq, maxp, 1, 1);
    const attn_tensor tl = attn_tensor_4d(lens, ATTN_I64, nreq, 1, 1, 1);
    const attn_tensor tcu = attn_tensor_4d(cu, ATTN_I32, nreq + 1, 1, 1, 1);
    const attn_options opt = {.causal = true, .align = ATTN_ALIGN_BOTTOM_RIGHT, .threads = pa.threads,
                              .block_table = &tt, .kv_len = &tl};

    /* the separate calls: request s alone, B = 1, into o */
#define SEPARATE(o)                                                                          \
    for (int s = 0; s < nreq; s++) {                                                       \
        attn_tensor sq = tq, so = to1, st = tt, sl = tl;                                    \
        sq.shape[2] = so.shape[2] = lq[s];                                                  \
        sq.data = q + cu[s] * Hq * D, so.data = (o) + cu[s] * Hq * D;                       \
        st.shape[0] = 1, st.data = table + s * maxp;                                        \
        sl.shape[0] = 1, sl.data = lens + s;                                                \
        attn_options so_opt = opt;                                                          \
        so_opt.block_table = &st, so_opt.kv_len = &sl;                                      \
        if (attn_forward(&sq, &tk, &tv, &so, &so_opt) != ATTN_OK)                           \
            return fprintf(stderr, "attn: bench --step: %s\n", attn_last_error()), 1;       \
    }
    if (attn_varlen_forward(&tq, &tk, &tv, &to1, &tcu, NULL, max_q, max_k, &opt) != ATTN_OK)
        return fprintf(stderr, "attn: bench --step: %s\n", attn_last_error()), 1;
    SEPARATE(o2)
    if (pa.plant) o1[total_q * Hq * D / 2] += 1e-3f;
    const bool same = memcmp(o1, o2, (size_t)(total_q * Hq * D) * 4) == 0;
    printf("  check: one call vs separate calls, bit for bit: %s\n", same ? "ok" : "FAILED");
    if (!same) return 1;
    for (int w = 0; w < 2; w++) {
        attn_varlen_forward(&tq, &tk, &tv, &to1, &tcu, NULL, max_q, max_k, &opt);
        SEPARATE(o2)
    }
    for (int i = 0; i < pa.reps; i++) {
        double t0 = now_s();
        attn_varlen_forward(&tq, &tk, &tv, &to1, &tcu, NULL, max_q, max_k, &opt);
        t1[i] = now_s() - t0;
        t0 = now_s();
        SEPARATE(o2)
        t2[i] = now_s() - t0;
    }
#undef SEPARATE
    const double m1 = median(t1, pa.reps), m2 = median(t2, pa.reps);
    printf("  %-16s %10s %10s\n", "", "median ms", "GFLOP/s");
    printf("  %-16s %10.3f %10.1f\n", "one call", m1 * 1e3, flops / m1 * 1e-9);
    printf("  %-16s %10.3f %10.1f\n", "separate calls", m2 * 1e3, flops / m2 * 1e-9);
    printf("  one call / separate calls: %.3f of their GFLOP/s\n", m2 / m1);
    free(lq), free(lk), free(cu), free(kp), free(vp), free(q), free(o1), free(o2), free(table), free(lens);
    free(t1), free(t2);
    return 0;
}
