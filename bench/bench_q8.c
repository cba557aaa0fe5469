/*
 * bench_q8.c — `attn bench --q8`: decoding over float32, bfloat16, q8_0, fp8 (e4m3, e5m2,
 *              scale 1, and e4m3 with per-head scales) and q4_0 KV caches.
 *
 * Method (docs/KERNELS.md quotes it):
 *   - the case is decoding, Lq = 1, Lk = 16384, Hq = 32, Hkv = 8, D = 128, B = 1, float32
 *     queries and output (--quick: Lk = 2048); K and V drawn uniform in [-1, 1), the
 *     bfloat16 cache their rounding, the q8_0 cache attn_quantize_q8_0 of them;
 *   - first each cache's fused answer is checked against ATTN_PATH_REFERENCE over the
 *     same cache (the contract's float32 tolerance, tools/common/tolerance.h); --plant-error
 *     moves one output first and must fail; then the quantization error is printed: O of
 *     the bfloat16 and q8_0 caches against O of the float32 cache (relative Frobenius and
 *     max |diff|), on uniform and on normal data;
 *   - each timed call is followed by one parallel read of a buffer of 2 x the float32
 *     cache that no call touches, so the next call finds none of its cache in the caches,
 *     and that read is timed: the read bandwidth beside the row (its median);
 *   - two warm-up calls, then --reps timed calls (default 21), the median reported; the
 *     effective rate is the cache's bytes / time (bytes per element: 4, 2, 34 / 32).
 * What it is not: a test (no time limit anywhere), or the llama.cpp comparison.
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
#include "decode_bound.h"
#include "core/half.h"
#include "rng.h"
#include "tolerance.h"

/* uniform in [-1, 1) or standard normal values from seed (rng.h) */
static void fill(float *p, int64_t n, uint64_t seed, bool normal) {
    rng_t r = {seed};
    for (int64_t i = 0; i < n; i++) p[i] = (float)(normal ? rng_normal(&r) : rng_sym(&r));
}

typedef struct cache {
    attn_dtype dt;
    const char *name;
    double bytes_per_elem;
    void *k, *v;
    attn_tensor tk, tv;
    const attn_tensor *k_scale, *v_scale;  // an fp8 cache's per-head scales, or NULL
} cache;

static volatile double g_sink;
static double read_pass(const float *buf, int64_t n, int threads) {
    const double t0 = now_s();
    double total = 0;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : total)
    for (int64_t i = 0; i < n; i += 16) {
        float s = 0;
        for (int j = 0; j < 16; j++) s += buf[i + j];
        total += s;
    }
    g_sink += total;
    return 4.0 * (double)n / (now_s() - t0) * 1e-9;
}

static double err_rel(const float *a, const float *b, int64_t n, double *mx) {
    double num = 0, den = 0;
    *mx = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
        if (fabs(d) > *mx) *mx = fabs(d);
    }
    return sqrt(num / den);
}

static const char USAGE[] =
    "usage: attn bench --q8 [--quick] [--threads N] [--reps N] [--isa NAME] [--thp] [--plant-error]\n"
    "\n"
    "  Decoding (Lq = 1, Lk = 16384, Hq = 32, Hkv = 8, D = 128, B = 1) over float32,\n"
    "  bfloat16 and q8_0 KV caches: each checked against the float64 path, the q8_0 and\n"
    "  bfloat16 errors against the float32 cache printed, then medians timed beside the\n"
    "  read bandwidth, and the compute bound of the step of the kernel that runs\n"
    "  (bench/decode_bound.h; n/a for a kernel without a model). --isa NAME: run these\n"
    "  kernels of the library (ATTN_ISA). --thp: the filled caches and the read's buffer\n"
    "  moved onto huge pages by attn_huge_pages before the timed calls.\n";

int bench_q8(int argc, char **argv) {
    bool thp = false;  // this part's own flag
    const cli_opt more[] = {{"--thp", NULL, &thp}};
    bench_part_args pa;
    const int rc = bench_part_scan_more(argc, argv, "--q8", USAGE, 5, 21, 200, more, 1, &pa);
    if (rc >= 0) return rc;
    const bool quick = pa.quick, plant = pa.plant;
    const int threads = pa.threads, reps = pa.reps;
    const int nt = threads > 0 ? threads : omp_get_max_threads();
    const int64_t B = 1, Hq = 32, Hkv = 8, Lq = 1, Lk = quick ? 2048 : 16384, D = 128;
    const int64_t nkv = B * Hkv * Lk * D, nq = B * Hq * Lq * D;
    printf("q8_0 cache, decoding: B=%lld Hq=%lld Hkv=%lld Lq=%lld Lk=%lld D=%lld, float32 q and o, "
           "%d threads, kernel %s\n", (long long)B, (long long)Hq, (long long)Hkv, (long long)Lq,
           (long long)Lk, (long long)D, nt, attn_kernel_name());

    float *kf = malloc((size_t)nkv * 4), *vf = malloc((size_t)nkv * 4), *q = malloc((size_t)nq * 4);
    float *o = malloc((size_t)nq * 4), *o_ref = malloc((size_t)nq * 4), *o_f32 = malloc((size_t)nq * 4);
    uint16_t *kb = malloc((size_t)nkv * 2), *vb = malloc((size_t)nkv * 2);
    uint8_t *k8 = malloc((size_t)(nkv / 32 * 34)), *v8 = malloc((size_t)(nkv / 32 * 34));
    uint8_t *k4 = malloc((size_t)(nkv / 32 * 18)), *v4 = malloc((size_t)(nkv / 32 * 18));
    uint8_t *ke4 = malloc((size_t)nkv), *ve4 = malloc((size_t)nkv);
    uint8_t *ke5 = malloc((size_t)nkv), *ve5 = malloc((size_t)nkv);
    uint8_t *ks4 = malloc((size_t)nkv), *vs4 = malloc((size_t)nkv);
    if (!kf || !vf || !q || !o || !o_ref || !o_f32 || !kb || !vb || !k8 || !v8 || !k4 || !v4 ||
        !ke4 || !ve4 || !ke5 || !ve5 || !ks4 || !vs4)
        return fprintf(stderr, "attn: bench --q8: out of memory\n"), 1;
    /* the scaled e4m3 cache's scales: per head, its amax / 448 (vLLM's calibration) */
    float ksc[8], vsc[8];
    const attn_tensor tks = attn_tensor_4d(ksc, ATTN_F32, Hkv, 1, 1, 1);
    const attn_tensor tvs = attn_tensor_4d(vsc, ATTN_F32, Hkv, 1, 1, 1);
    enum { NC = 7 };  // float32, bfloat16, then the smaller caches (2: q8_0)
    cache c[NC] = {
        {ATTN_F32, "float32", 4.0, kf, vf, {0}, {0}, NULL, NULL},
        {ATTN_BF16, "bfloat16", 2.0, kb, vb, {0}, {0}, NULL, NULL},
        {ATTN_Q8_0, "q8_0", 34.0 / 32.0, k8, v8, {0}, {0}, NULL, NULL},
        {ATTN_FP8_E4M3, "fp8_e4m3", 1.0, ke4, ve4, {0}, {0}, NULL, NULL},
        {ATTN_FP8_E5M2, "fp8_e5m2", 1.0, ke5, ve5, {0}, {0}, NULL, NULL},
        {ATTN_Q4_0, "q4_0", 18.0 / 32.0, k4, v4, {0}, {0}, NULL, NULL},
        {ATTN_FP8_E4M3, "e4m3+sc", 1.0, ks4, vs4, {0}, {0}, &tks, &tvs},
    };
    for (int i = 0; i < NC; i++) {
        c[i].tk = attn_tensor_4d(c[i].k, c[i].dt, B, Hkv, Lk, D);
        c[i].tv = attn_tensor_4d(c[i].v, c[i].dt, B, Hkv, Lk, D);
    }
    const attn_tensor tq = attn_tensor_4d(q, ATTN_F32, B, Hq, Lq, D), to = attn_tensor_4d(o, ATTN_F32, B, Hq, Lq, D);
    const attn_tensor tkf = c[0].tk, tvf = c[0].tv;
    int failed = 0;

    /* the quantization error, on two distributions; the uniform one is then timed */
    for (int dist = 1; dist >= 0; dist--) {
        fill(kf, nkv, 11 + dist, dist), fill(vf, nkv, 12 + dist, dist), fill(q, nq, 13 + dist, dist);
        for (int64_t i = 0; i < nkv; i++) kb[i] = attn_f32_to_bf16(kf[i]), vb[i] = attn_f32_to_bf16(vf[i]);
        const double tq0 = now_s();
        if (attn_quantize_q8_0(&tkf, &c[2].tk) != ATTN_OK || attn_quantize_q8_0(&tvf, &c[2].tv) != ATTN_OK ||
            attn_quantize_q4_0(&tkf, &c[5].tk) != ATTN_OK || attn_quantize_q4_0(&tvf, &c[5].tv) != ATTN_OK)
            return fprintf(stderr, "attn: bench --q8: quantize: %s\n", attn_last_error()), 1;
        /* fp8: the library's saturating rounding (attn_kv_append at rows 0 .., scale 1) */
        int64_t zero = 0;
        const attn_tensor tz = {&zero, ATTN_I64, {1, 1, 1, 1}, {1, 1, 1, 1}};
        for (int64_t h = 0; h < Hkv; h++) {
            float ka = 0, va = 0;
            for (int64_t e = h * Lk * D; e < (h + 1) * Lk * D; e++)
                ka = fmaxf(ka, fabsf(kf[e])), va = fmaxf(va, fabsf(vf[e]));
            ksc[h] = ka > 0 ? ka / 448.0f : 1.0f, vsc[h] = va > 0 ? va / 448.0f : 1.0f;
        }
        for (int i = 3; i < NC; i++)
            if ((c[i].dt == ATTN_FP8_E4M3 || c[i].dt == ATTN_FP8_E5M2) &&
                attn_kv_append_scaled(&tkf, &tvf, &c[i].tk, &c[i].tv, NULL, NULL, &tz,
                                      c[i].k_scale, c[i].v_scale) != ATTN_OK)
                return fprintf(stderr, "attn: bench --q8: append: %s\n", attn_last_error()), 1;
        const double tquant = now_s() - tq0;
        attn_options opt = {.threads = threads};
        for (int i = 0; i < NC; i++) {
            opt.k_scale = c[i].k_scale, opt.v_scale = c[i].v_scale;
            opt.path = ATTN_PATH_FUSED;
            attn_status st = attn_forward(&tq, &c[i].tk, &c[i].tv, &to, &opt);
            attn_tensor tr = to;
            tr.data = o_ref;
            opt.path = ATTN_PATH_REFERENCE;
            if (st == ATTN_OK) st = attn_forward(&tq, &c[i].tk, &c[i].tv, &tr, &opt);
            if (st != ATTN_OK) return fprintf(stderr, "attn: bench --q8: %s\n", attn_last_error()), 1;
            if (plant && i == 2) o[nq / 3] += 1e-3f * (1.0f + fabsf(o[nq / 3]));
            tol_acc a = tol_start();
            for (int64_t e = 0; e < nq; e++) tol_add(&a, e, o[e], o_ref[e]);
            tol_result r;
            const bool ok = tol_pass(&a, &r);
            failed += !ok;
            if (i == 0) memcpy(o_f32, o, (size_t)nq * 4);
            double mx = 0, rel = i == 0 ? 0 : err_rel(o, o_f32, nq, &mx);
            printf("  %-8s %s data: fused vs float64 over the same cache: rel %.2e max %.2e %s",
                   c[i].name, dist ? "normal " : "uniform", r.rel_err, r.max_err, ok ? "ok" : "FAILED");
            if (i > 0) printf("; O vs the float32 cache's: rel %.2e max %.2e", rel, mx);
            if (i == 2) printf("; quantized in %.1f ms", tquant * 1e3);
            printf("\n");
        }
    }
    if (failed) {
        printf("check FAILED: nothing timed\n");
        return 1;
    }

    const int64_t nflush = 2 * nkv * 2 / 16 * 16;  // floats: 2 x the float32 K and V
    float *flush = malloc((size_t)nflush * 4);
    if (!flush) return fprintf(stderr, "attn: bench --q8: out of memory\n"), 1;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < nflush; i++) flush[i] = 1e-3f * (float)(i & 7);
    if (thp) {  /* the filled caches and the read's buffer moved onto huge pages, as a server
                 * would its pool once (attn_huge_pages) */
        const double th0 = now_s();
        attn_status st = attn_huge_pages(flush, (size_t)nflush * 4);
        for (int i = 0; i < NC && st == ATTN_OK; i++) {
            const size_t bytes = (size_t)((double)nkv * c[i].bytes_per_elem);
            st = attn_huge_pages(c[i].k, bytes);
            if (st == ATTN_OK) st = attn_huge_pages(c[i].v, bytes);
        }
        if (st != ATTN_OK) return fprintf(stderr, "attn: bench --q8: --thp: %s\n", attn_last_error()), 1;
        printf("  huge pages: attn_huge_pages on the %d caches' K and V and the read's buffer: %.1f ms\n",
               NC, 1e3 * (now_s() - th0));
    }
    double *t = malloc(sizeof(double) * (size_t)reps), *bw = malloc(sizeof(double) * (size_t)reps);
    for (int i = 0; i < NC; i++) {  // the compute bound of each cache's step (decode_bound.h)
        if (c[i].k_scale) continue;  // its dtype's line is printed already
        char why[320];
        dec_describe(c[i].dt, why, sizeof why);
        printf("  compute bound, %s\n", why);
    }
    printf("  %-8s %10s %9s %9s %11s %11s %9s %10s %12s %9s\n", "cache", "bytes/el", "KV MiB", "median ms",
           "cache GB/s", "read GB/s", "of read", "Mkeys/s", "compute GB/s", "of bound");
    double ms_bf16 = 0;
    for (int i = 0; i < NC; i++) {
        attn_options opt = {.threads = threads, .k_scale = c[i].k_scale, .v_scale = c[i].v_scale};
        for (int w = 0; w < 2; w++) attn_forward(&tq, &c[i].tk, &c[i].tv, &to, &opt);
        read_pass(flush, nflush, nt);
        for (int r = 0; r < reps; r++) {
            const double t0 = now_s();
            attn_forward(&tq, &c[i].tk, &c[i].tv, &to, &opt);
            t[r] = now_s() - t0;
            bw[r] = read_pass(flush, nflush, nt);
        }
        const double med = median(t, reps), bwm = median(bw, reps);
        const double bytes = c[i].bytes_per_elem * 2.0 * (double)nkv;
        if (i == 1) ms_bf16 = med;
        /* bound = min(read, compute) as rates */
        const double cg = dec_compute_gbs(c[i].dt, Hq / Hkv, D, dec_fp8_scaled(c[i].dt, c[i].k_scale),
                                          dec_fp8_scaled(c[i].dt, c[i].v_scale), bytes, 2.0 * (double)nkv, nt);
        const double bound = cg > 0 && cg < bwm ? cg : bwm;  // no model (n/a): the read alone
        char cgs[24];
        printf("  %-8s %10.4f %9.1f %9.3f %11.2f %11.2f %8.1f%% %10.1f %12s %8.1f%%", c[i].name,
               c[i].bytes_per_elem, bytes / 1048576, med * 1e3, bytes / med * 1e-9, bwm,
               100 * bytes / med * 1e-9 / bwm, (double)(B * Hkv * Lk) / med * 1e-6,
               dec_fmt(cgs, sizeof cgs, 12, 2, cg),
               100 * bytes / med * 1e-9 / bound);
        if (i >= 2) printf("   (%.2fx bfloat16's speed)", ms_bf16 / med);
        printf("\n");
    }
    free(t), free(bw), free(flush);
    free(kf), free(vf), free(q), free(o), free(o_ref), free(o_f32), free(kb), free(vb), free(k8), free(v8);
    free(k4), free(v4), free(ke4), free(ve4), free(ke5), free(ve5), free(ks4), free(vs4);
    return 0;
}
