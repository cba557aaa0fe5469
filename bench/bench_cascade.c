/*
 * bench_cascade.c — `attn bench --cascade`: decoding B sequences that share a long
 *                   prompt prefix, per sequence against attn_cascade_forward.
 *
 * Method (docs/BENCHMARKS.md quotes it):
 *   - the shape is the serving one: B = 32 sequences, a shared prefix of P = 8192 keys, a
 *     suffix of S = 256 keys each, decoding (Lq = 1), Hq = 32, Hkv = 8, D = 128, float32
 *     queries and output, a bfloat16 and a float32 cache (--quick: B = 4, P = 1024, S = 64);
 *   - four ways to the same answer:
 *       per-seq   B calls, each over the sequence's own contiguous copy of prefix + suffix
 *                 (what a server without prefix sharing holds: B copies of the prefix)
 *       paged     one batched call over a page pool (pages of 64 rows) whose block
 *                 tables all begin with the same prefix pages (one copy, read B times)
 *       cascade   attn_cascade_forward, contiguous prefix [1, Hkv, P, D] and suffixes
 *       cascade-paged   the same over the pool and block tables of `paged`
 *     each checked first against ATTN_PATH_REFERENCE over the pool (float64 inside) at
 *     the contract's float32 tolerance (tools/common/tolerance.h); --plant-error moves one
 *     output of the cascade and must fail;
 *   - one warm-up call each, then --reps rounds (default 9): a round times the four in
 *     turn, each followed by a read of a buffer of 256 MiB (64 MiB with --quick) that no
 *     call touches, timed: the read bandwidth beside the rows, and no call finds the
 *     previous one's keys in the caches;
 *   - reported: medians; GB/s = the bytes of K and V the way reads / time; GFLOP/s by
 *     4·B·Hq·(P+S)·D (Q·Kᵀ and P·V, the same for all four); the speedups; and the bound:
 *     both do the same FLOPs and the cascade saves only the prefix's re-reads, so the
 *     speedup is at most (per-sequence time, memory-bound: its bytes / read bandwidth)
 *     over (the cascade's time, compute-bound: FLOPs / the kernel's FMA peak), both
 *     measured here (bench/bench_machine.h).
 * What it is not: a test (no time limit anywhere), or the PyTorch comparison.
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
    "usage: attn bench --cascade [--quick] [--threads N] [--reps N] [--plant-error]\n"
    "\n"
    "  Shared-prefix decoding: B = 32 sequences, a shared prefix of 8192 keys, 256-key\n"
    "  suffixes, Lq = 1, Hq = 32, Hkv = 8, D = 128, bfloat16 and float32 caches: B\n"
    "  per-sequence calls and one batched paged call against attn_cascade_forward\n"
    "  (contiguous and paged), each checked against the float64 path, then medians\n"
    "  beside the machine's read bandwidth and FMA peak, and the speedup's bound.\n"
    "  --quick: B = 4, prefix 1024, suffixes 64.\n";

enum { PAGE = 64, VARIANTS = 4 };
static const char *const NAMES[VARIANTS] = {"per-seq", "paged", "cascade", "cascade-paged"};

static void store(attn_dtype dt, void *base, int64_t e, float x) {
    if (dt == ATTN_F32) ((float *)base)[e] = x;
    else ((uint16_t *)base)[e] = attn_f32_to_bf16(x);
}

/* Everything of one cache dtype's run. */
typedef struct setup {
    int64_t B, P, S, Hq, Hkv, D;
    attn_dtype dt;
    size_t es;
    void *kp, *vp, *ks, *vs;   // prefix [1, Hkv, P, D], suffixes [B, Hkv, S, D]
    void **kc, **vc;           // per sequence: [1, Hkv, P + S, D], own copies
    void *kpool, *vpool;       // [num_pages, Hkv, PAGE, D]: prefix pages, then each suffix's
    int32_t *bt_all, *bt_pre, *bt_suf;
    float *q, *o;              // [B, Hq, 1, D]
    attn_tensor tq, to, tkp, tvp, tks, tvs, tkpool, tvpool, tbt_all, tbt_pre, tbt_suf;
    attn_cascade_kv pre, suf, pre_pg, suf_pg;
    attn_options opt_paged;
} setup;

static int build(setup *s, uint64_t seed) {
    const int64_t B = s->B, P = s->P, S = s->S, H = s->Hkv, D = s->D, L = P + S;
    const size_t es = s->es, n_pre = (size_t)(H * P * D), n_suf = (size_t)(B * H * S * D);
    s->kp = malloc(n_pre * es), s->vp = malloc(n_pre * es);
    s->ks = malloc(n_suf * es), s->vs = malloc(n_suf * es);
    s->kc = calloc((size_t)B, sizeof(void *)), s->vc = calloc((size_t)B, sizeof(void *));
    const int64_t pp = P / PAGE, sp = S / PAGE, np = pp + B * sp;
    s->kpool = malloc((size_t)(np * H * PAGE * D) * es), s->vpool = malloc((size_t)(np * H * PAGE * D) * es);
    s->bt_all = malloc(sizeof(int32_t) * (size_t)(B * (pp + sp)));
    s->bt_pre = malloc(sizeof(int32_t) * (size_t)pp), s->bt_suf = malloc(sizeof(int32_t) * (size_t)(B * sp));
    s->q = malloc(sizeof(float) * (size_t)(B * s->Hq * D)), s->o = malloc(sizeof(float) * (size_t)(B * s->Hq * D));
    if (!s->kp || !s->vp || !s->ks || !s->vs || !s->kc || !s->vc || !s->kpool || !s->vpool || !s->bt_all ||
        !s->bt_pre || !s->bt_suf || !s->q || !s->o)
        return 1;
    rng_t r = {seed};
    for (size_t e = 0; e < n_pre; e++) store(s->dt, s->kp, (int64_t)e, (float)rng_sym(&r)), store(s->dt, s->vp, (int64_t)e, (float)rng_sym(&r));
    for (size_t e = 0; e < n_suf; e++) store(s->dt, s->ks, (int64_t)e, (float)rng_sym(&r)), store(s->dt, s->vs, (int64_t)e, (float)rng_sym(&r));
    for (int64_t e = 0; e < B * s->Hq * D; e++) s->q[e] = (float)rng_sym(&r);
    const size_t row = (size_t)D * es;
    for (int64_t b = 0; b < B; b++) {  // sequence b's own copy: prefix rows, then its suffix's
        s->kc[b] = malloc((size_t)(H * L) * row), s->vc[b] = malloc((size_t)(H * L) * row);
        if (!s->kc[b] || !s->vc[b]) return 1;
        for (int64_t g = 0; g < H; g++) {
            char *kd = (char *)s->kc[b] + (size_t)(g * L) * row, *vd = (char *)s->vc[b] + (size_t)(g * L) * row;
            memcpy(kd, (char *)s->kp + (size_t)(g * P) * row, (size_t)P * row);
            memcpy(vd, (char *)s->vp + (size_t)(g * P) * row, (size_t)P * row);
            memcpy(kd + (size_t)P * row, (char *)s->ks + (size_t)((b * H + g) * S) * row, (size_t)S * row);
            memcpy(vd + (size_t)P * row, (char *)s->vs + (size_t)((b * H + g) * S) * row, (size_t)S * row);
        }
    }
    /* the pool: page i < pp holds prefix rows [64 i, 64 i + 64), then sequence b's suffix
     * pages; b's table is the prefix pages then its own */
    for (int64_t pg = 0; pg < np; pg++)
        for (int64_t g = 0; g < H; g++) {
            const bool is_pre = pg < pp;
            const int64_t b = is_pre ? 0 : (pg - pp) / sp, j0 = is_pre ? pg * PAGE : (pg - pp) % sp * PAGE;
            const size_t src = is_pre ? (size_t)(g * P + j0) * row : (size_t)((b * H + g) * S + j0) * row;
            const size_t dst = (size_t)((pg * H + g) * PAGE) * row;
            memcpy((char *)s->kpool + dst, (char *)(is_pre ? s->kp : s->ks) + src, PAGE * row);
            memcpy((char *)s->vpool + dst, (char *)(is_pre ? s->vp : s->vs) + src, PAGE * row);
        }
    for (int64_t b = 0; b < B; b++)
        for (int64_t p = 0; p < pp + sp; p++)
            s->bt_all[b * (pp + sp) + p] = (int32_t)(p < pp ? p : pp + b * sp + (p - pp));
    for (int64_t p = 0; p < pp; p++) s->bt_pre[p] = (int32_t)p;
    for (int64_t b = 0; b < B; b++)
        for (int64_t p = 0; p < sp; p++) s->bt_suf[b * sp + p] = (int32_t)(pp + b * sp + p);
    s->tq = attn_tensor_4d(s->q, ATTN_F32, B, s->Hq, 1, D);
    s->to = attn_tensor_4d(s->o, ATTN_F32, B, s->Hq, 1, D);
    s->tkp = attn_tensor_4d(s->kp, s->dt, 1, H, P, D), s->tvp = attn_tensor_4d(s->vp, s->dt, 1, H, P, D);
    s->tks = attn_tensor_4d(s->ks, s->dt, B, H, S, D), s->tvs = attn_tensor_4d(s->vs, s->dt, B, H, S, D);
    s->tkpool = attn_tensor_4d(s->kpool, s->dt, np, H, PAGE, D), s->tvpool = attn_tensor_4d(s->vpool, s->dt, np, H, PAGE, D);
    s->tbt_all = attn_tensor_4d(s->bt_all, ATTN_I32, B, pp + sp, 1, 1);
    s->tbt_pre = attn_tensor_4d(s->bt_pre, ATTN_I32, 1, pp, 1, 1);
    s->tbt_suf = attn_tensor_4d(s->bt_suf, ATTN_I32, B, sp, 1, 1);
    s->pre = (attn_cascade_kv){&s->tkp, &s->tvp, NULL, NULL};
    s->suf = (attn_cascade_kv){&s->tks, &s->tvs, NULL, NULL};
    s->pre_pg = (attn_cascade_kv){&s->tkpool, &s->tvpool, &s->tbt_pre, NULL};
    s->suf_pg = (attn_cascade_kv){&s->tkpool, &s->tvpool, &s->tbt_suf, NULL};
    return 0;
}

static void unbuild(setup *s) {
    for (int64_t b = 0; s->kc && s->vc && b < s->B; b++) free(s->kc[b]), free(s->vc[b]);
    free(s->kc), free(s->vc), free(s->kp), free(s->vp), free(s->ks), free(s->vs), free(s->kpool), free(s->vpool);
    free(s->bt_all), free(s->bt_pre), free(s->bt_suf), free(s->q), free(s->o);
}

/* Runs variant v into s->o. */
static attn_status run(setup *s, int v, int threads) {
    attn_options opt = {.threads = threads};
    switch (v) {
    case 0:
        for (int64_t b = 0; b < s->B; b++) {
            attn_tensor q = s->tq, o = s->to;
            q.data = s->q + b * s->tq.stride[0], o.data = s->o + b * s->to.stride[0];
            q.shape[0] = o.shape[0] = 1;
            const attn_tensor k = attn_tensor_4d(s->kc[b], s->dt, 1, s->Hkv, s->P + s->S, s->D);
            const attn_tensor vv = attn_tensor_4d(s->vc[b], s->dt, 1, s->Hkv, s->P + s->S, s->D);
            const attn_status st = attn_forward(&q, &k, &vv, &o, &opt);
            if (st != ATTN_OK) return st;
        }
        return ATTN_OK;
    case 1:
        opt.block_table = &s->tbt_all;
        return attn_forward(&s->tq, &s->tkpool, &s->tvpool, &s->to, &opt);
    case 2: return attn_cascade_forward(&s->tq, &s->pre, &s->suf, &s->to, &opt);
    case 3: return attn_cascade_forward(&s->tq, &s->pre_pg, &s->suf_pg, &s->to, &opt);
    default: return ATTN_ERR_UNSUPPORTED;
    }
}

/* one dtype's rows; 1 when a check failed */
static int bench_dtype(setup *s, const machine *m, const bench_part_args *pa, int nt, const float *flush,
                       int64_t nflush, double *gbs_read) {
    const int64_t no = s->B * s->Hq * s->D;
    float *ref = malloc(sizeof(float) * (size_t)no);
    if (!ref) return fprintf(stderr, "attn: bench --cascade: out of memory\n"), 1;
    attn_tensor tr = s->to;
    tr.data = ref;
    attn_options ro = {.threads = pa->threads, .block_table = &s->tbt_all, .path = ATTN_PATH_REFERENCE};
    attn_status st = attn_forward(&s->tq, &s->tkpool, &s->tvpool, &tr, &ro);
    if (st != ATTN_OK) return fprintf(stderr, "attn: bench --cascade: reference: %s\n", attn_last_error()), 1;
    int failed = 0;
    printf("  check against the float64 path:");
    for (int v = 0; v < VARIANTS; v++) {
        st = run(s, v, pa->threads);
        if (st != ATTN_OK) return fprintf(stderr, "attn: bench --cascade: %s: %s\n", NAMES[v], attn_last_error()), 1;
        if (pa->plant && v == 2) s->o[no / 3] += 1e-3f * (1.0f + fabsf(s->o[no / 3]));
        tol_acc a = tol_start();
        for (int64_t e = 0; e < no; e++) tol_add(&a, e, s->o[e], ref[e]);
        tol_result r;
        const bool ok = tol_pass(&a, &r);
        failed += !ok;
        printf(" %s %s (rel %.1e)%s", NAMES[v], ok ? "ok" : "FAILED", r.rel_err, v + 1 < VARIANTS ? "," : "\n");
    }
    free(ref);
    if (failed) return printf("check FAILED: nothing timed\n"), 1;

    const int reps = pa->reps;
    double *t = malloc(sizeof(double) * (size_t)(reps * VARIANTS)), *bw = malloc(sizeof(double) * (size_t)(reps * VARIANTS));
    double med[VARIANTS], bwm[VARIANTS];
    if (!t || !bw) return fprintf(stderr, "attn: bench --cascade: out of memory\n"), 1;
    for (int v = 0; v < VARIANTS; v++) run(s, v, pa->threads);
    for (int rep = 0; rep < reps; rep++)
        for (int v = 0; v < VARIANTS; v++) {
            machine_read_pass(machine_read_loops(), flush, nflush, nt);
            const double t0 = now_s();
            run(s, v, pa->threads);
            t[v * reps + rep] = now_s() - t0;
            bw[v * reps + rep] = machine_read_pass(machine_read_loops(), flush, nflush, nt);
        }
    const double B = (double)s->B, Hkv = (double)s->Hkv, D = (double)s->D, P = (double)s->P, S = (double)s->S;
    const double flop = 4.0 * B * (double)s->Hq * (P + S) * D;
    const double kv_row = 2.0 * D * (double)s->es * Hkv;  // K and V of one key, all heads
    const double bytes[VARIANTS] = {B * (P + S) * kv_row, B * (P + S) * kv_row, (P + B * S) * kv_row, (P + B * S) * kv_row};
    printf("  %-14s %10s %12s %9s %10s %9s %9s\n", "row", "median ms", "K,V GB read", "GB/s", "GFLOP/s", "read GB/s", "speedup");
    for (int v = 0; v < VARIANTS; v++) {
        med[v] = median(t + v * reps, reps), bwm[v] = median(bw + v * reps, reps);
        printf("  %-14s %10.2f %12.3f %9.1f %10.1f %9.1f %8.2fx\n", NAMES[v], med[v] * 1e3, bytes[v] * 1e-9,
               bytes[v] / med[v] * 1e-9, flop / med[v] * 1e-9, bwm[v], med[0] / med[v]);
    }
    double read_all[VARIANTS * 64];
    int nr = 0;
    for (int i = 0; i < reps * VARIANTS && nr < VARIANTS * 64; i++) read_all[nr++] = bw[i];
    *gbs_read = median(read_all, nr);
    /* the bound: per-seq at the read bandwidth against the cascade at the FMA peak */
    const char *isa;
    const double peak = machine_kernel_peak(m, attn_kernel_name(), &isa);
    const double bw_best = m->bw_n > *gbs_read ? m->bw_n : *gbs_read;
    const double t_mem = bytes[0] / (bw_best * 1e9), t_comp = flop / (peak * 1e9);
    const double intensity = flop / bytes[0];  // flop per byte the per-seq calls read
    printf("  bound: FLOPs 4*B*Hq*(P+S)*D = %.3f GFLOP in every row; per-seq reads %.3f GB of K,V: "
           "%.1f flop/byte\n"
           "         per-seq >= %.3f GB / %.1f GB/s (best read) = %.2f ms (memory-bound); cascade >= "
           "%.3f GFLOP / %.1f GFLOP/s (%s FMA peak, %d threads) = %.2f ms (compute-bound)\n"
           "         speedup <= %.2f / %.2f = %.2fx; 8x needs peak/bandwidth >= 8 x %.1f = %.0f flop/byte, "
           "this machine has %.1f: 8x %s\n"
           "         measured: cascade %.2fx per-seq, %.2fx paged; the cascade at %.0f%% of the FMA peak\n",
           flop * 1e-9, bytes[0] * 1e-9, intensity, bytes[0] * 1e-9, bw_best, t_mem * 1e3, flop * 1e-9, peak,
           isa, nt, t_comp * 1e3, t_mem * 1e3, t_comp * 1e3, t_mem / t_comp, intensity, 8 * intensity,
           peak / bw_best, t_mem / t_comp >= 8.0 ? "is not excluded by the bound" : "is impossible on this CPU",
           med[0] / med[2], med[1] / med[2], 100.0 * flop / med[2] * 1e-9 / peak);
    free(t), free(bw);
    return 0;
}

int bench_cascade(int argc, char **argv) {
    bench_part_args pa;
    const int rc = bench_part_scan(argc, argv, "--cascade", USAGE, 3, 9, 100, &pa);
    if (rc >= 0) return rc;
    const int nt = pa.threads > 0 ? pa.threads : omp_get_max_threads();
    machine m = {.threads = nt, .procs = omp_get_num_procs()};
    machine_cpu_model(m.cpu, sizeof m.cpu);
    machine_loadavg(m.load_start);
    if (machine_measure(&m, pa.quick, true)) return 1;
    printf("cascade (shared prefix), decoding: %s, %d threads, kernel %s\n", m.cpu, nt, attn_kernel_name());
    printf("  machine: read bandwidth %.1f GB/s (%s loads, %d threads); fp32 FMA peak", m.bw_n, m.bw_isa, nt);
    for (int i = 0; i < m.npeaks; i++) printf(" %s %.1f", m.peaks[i].isa, m.peaks[i].gflops_n);
    printf(" GFLOP/s; load average %.2f %.2f %.2f\n", m.load_start[0], m.load_start[1], m.load_start[2]);
    const int64_t nflush = (pa.quick ? 16 : 64) * 1024 * 1024;  // floats: 64 or 256 MiB
    float *flush = aligned_alloc(64, (size_t)nflush * sizeof(float));
    if (!flush) return fprintf(stderr, "attn: bench --cascade: out of memory\n"), 1;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < nflush; i++) flush[i] = 1e-3f * (float)(i & 7);
    static const attn_dtype dts[2] = {ATTN_BF16, ATTN_F32};
    int failed = 0;
    for (int d = 0; d < 2 && !failed; d++) {
        setup s = {.B = pa.quick ? 4 : 32, .P = pa.quick ? 1024 : 8192, .S = pa.quick ? 64 : 256,
                   .Hq = 32, .Hkv = 8, .D = 128, .dt = dts[d], .es = attn_dtype_size(dts[d])};
        printf("B=%lld P=%lld S=%lld Lq=1 Hq=%lld Hkv=%lld D=%lld, %s cache, float32 q and o\n", (long long)s.B,
               (long long)s.P, (long long)s.S, (long long)s.Hq, (long long)s.Hkv, (long long)s.D,
               attn_dtype_name(s.dt));
        if (build(&s, 31 + (uint64_t)d)) {
            unbuild(&s);
            free(flush);
            return fprintf(stderr, "attn: bench --cascade: out of memory\n"), 1;
        }
        double gbs = 0;
        failed = bench_dtype(&s, &m, &pa, nt, flush, nflush, &gbs);
        unbuild(&s);
    }
    machine_loadavg(m.load_end);
    printf("load average at the end %.2f %.2f %.2f%s\n", m.load_end[0], m.load_end[1], m.load_end[2],
           m.load_end[0] > 0.5 * m.procs + 0.5 ? " (under load: figures are noisy)" : "");
    free(flush);
    return failed;
}
