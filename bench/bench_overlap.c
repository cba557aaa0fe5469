/*
 * bench_overlap.c — `attn bench --overlap`: how much of max(read time, FMA time) this
 *                   machine reaches when one loop both streams memory and computes.
 *
 * The decoding targets (issues 35, 38) ask for 90% (GQA 8: 85%) of min(memory bound,
 * compute bound) as speeds, that is of max(t_read, t_compute) as times. Where the two
 * times are close, that asks the core to compute at its peak while the memory system
 * streams at its peak. This probe measures the best any loop does at that, with nothing
 * of attention in it: each thread streams its slice of a buffer one 64-byte line at a
 * time (one zmm load, or two ymm loads under the avx2 kernel) and issues F FMAs on the
 * loaded vector per line (12 accumulators, 8 under AVX2: more than two FMA pipes of
 * latency 4 need), for F from 0 to 32. Each time is the median of its reps. For each F:
 *   - t_read: the same stream with F = 0 (the faster of its two forms), the memory bound;
 *   - t_fma: the same loop with F FMAs a line over a slice that stays in L1 (the line
 *     index wrapped at 256 lines), the compute bound;
 *   - t: the stream with F FMAs a line, without and with a software prefetch 16 lines
 *     ahead (both printed; the faster is the one "of bound" takes);
 *   - of bound = max(t_read, t_fma) / t: the share of the roofline this machine reaches.
 * Between timed passes a buffer twice as large is read, so each pass starts from memory.
 * The decoding step's loops read two streams (K, V) and do more than FMAs (conversions,
 * the softmax), so their ceiling is at most this; docs/BENCHMARKS.md quotes the result
 * beside the decoding rows.
 * What it is not: a test (no time limit anywhere), or a measure of the library's code.
 */
#include <omp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "bench_clock.h"
#include "cli.h"
#include "cliopt.h"

#if defined(__x86_64__)
#include <immintrin.h>

static volatile float g_sink;

/* the accumulators' starting values and the FMAs' other factors, unknown to the compiler
 * (else it merges accumulators whose updates it can prove equal) */
static volatile float g_start[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
static volatile float g_fac[2] = {0.5f, 0.25f};

#define LINE_LOOP(F, PF, NA, SET1, LOAD, FMA, REDUCE, VT)                                  \
    VT acc[NA], kc[2], k0 = SET1(0.0f);                                                    \
    _Pragma("GCC unroll 12") for (int j = 0; j < NA; j++) acc[j] = SET1(g_start[j]);        \
    _Pragma("GCC unroll 2") for (int j = 0; j < 2; j++) kc[j] = SET1(g_fac[j]);             \
    for (int64_t i = 0; i < lines; i++) {                                                  \
        const float *line = p + 16 * (i & wrap);                                           \
        if (PF) _mm_prefetch((const char *)(line + 16 * 16), _MM_HINT_T0);                 \
        LOAD                                                                               \
        _Pragma("GCC unroll 32") for (int j = 0; j < F; j++) acc[j % NA] = FMA;            \
    }                                                                                       \
    REDUCE

/* one thread's pass: `lines` lines from p (index & wrap), F FMAs a line, PF a prefetch;
 * 12 accumulators in 32 zmm, 8 in AVX2's 16 ymm (12 spilled there): either is more than
 * two FMA pipes of latency 4 need */
#define AVX512_PASS(F, PF)                                                                  \
    __attribute__((target("avx512f"))) static void pass512_##F##_##PF(const float *p, int64_t lines, int64_t wrap) { \
        LINE_LOOP(F, PF, 12, _mm512_set1_ps, const __m512 x = _mm512_loadu_ps(line); k0 = _mm512_add_ps(k0, x);, \
                  _mm512_fmadd_ps(x, kc[j % 2], acc[j % 12]),                               \
                  __m512 s = k0; for (int j = 0; j < 12; j++) s = _mm512_add_ps(s, acc[j]); \
                  g_sink += _mm512_reduce_add_ps(s);, __m512)                              \
    }
#define AVX2_PASS(F, PF)                                                                    \
    __attribute__((target("avx2,fma"))) static void pass256_##F##_##PF(const float *p, int64_t lines, int64_t wrap) { \
        LINE_LOOP(F, PF, 8, _mm256_set1_ps, const __m256 x = _mm256_loadu_ps(line); const __m256 y = _mm256_loadu_ps(line + 8); \
                  k0 = _mm256_add_ps(k0, _mm256_add_ps(x, y));,                            \
                  _mm256_fmadd_ps(j % 2 ? x : y, kc[(j / 2) % 2], acc[j % 8]),               \
                  __m256 s = k0; for (int j = 0; j < 8; j++) s = _mm256_add_ps(s, acc[j]); \
                  float t[8]; _mm256_storeu_ps(t, s); g_sink += t[0] + t[7];, __m256)       \
    }

/* k0 sums the lines, so no load is dead */
#define FS(X) X(0) X(4) X(8) X(12) X(16) X(20) X(24) X(32)
#define DEF512(F) AVX512_PASS(F, 0) AVX512_PASS(F, 1)
#define DEF256(F) AVX2_PASS(F, 0) AVX2_PASS(F, 1)
FS(DEF512)
FS(DEF256)

typedef void (*pass_fn)(const float *, int64_t, int64_t);
static const int g_f[] = {0, 4, 8, 12, 16, 20, 24, 32};
enum { NF = sizeof g_f / sizeof g_f[0] };
#define PTR512(F) {pass512_##F##_0, pass512_##F##_1},
#define PTR256(F) {pass256_##F##_0, pass256_##F##_1},
static const pass_fn g_pass512[NF][2] = {FS(PTR512)};
static const pass_fn g_pass256[NF][2] = {FS(PTR256)};

static volatile double g_dsink;

/* every thread its slice of buf (n floats, n / 16 lines in all): the wall time */
static double timed(pass_fn f, const float *buf, int64_t n, int64_t wrap, int nt) {
    const int64_t lines = n / 16;
    const double t0 = now_s();
#pragma omp parallel num_threads(nt)
    {
        const int64_t t = omp_get_thread_num(), l0 = lines * t / nt, l1 = lines * (t + 1) / nt;
        f(buf + 16 * (wrap == -1 ? l0 : 256 * t), l1 - l0, wrap);
    }
    return now_s() - t0;
}

static void flush(const float *big, int64_t n, int nt) {
    double total = 0;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(+ : total)
    for (int64_t i = 0; i < n; i += 16) total += big[i];
    g_dsink += total;
}

/* n bytes, 2 MiB aligned; with huge, on huge pages (attn_huge_pages: refused, 4 KiB) */
static void *buffer(size_t n, bool huge) {
    const size_t page = (size_t)2 << 20;
    void *p = aligned_alloc(page, (n + page - 1) / page * page);
    if (p && huge) (void)attn_huge_pages(p, (n + page - 1) / page * page);
    return p;
}
#endif

static const char USAGE[] =
    "usage: attn bench --overlap [--quick] [--threads N] [--reps N] [--isa NAME] [--mib N] [--thp]\n"
    "  the share of max(read time, FMA time) one loop reaches when it streams and computes\n"
    "  at once, F FMAs per 64-byte line (bench/bench_overlap.c says how); --mib: the\n"
    "  streamed buffer (default 64); --thp: both buffers on transparent huge pages\n";

int bench_overlap(int argc, char **argv) {
    bool thp = false;  // this part's own options
    const char *mib_s = NULL;
    const cli_opt more[] = {{"--mib", &mib_s, NULL}, {"--thp", NULL, &thp}};
    bench_part_args pa;
    const int rc = bench_part_scan_more(argc, argv, "--overlap", USAGE, 3, 7, 100, more, 2, &pa);
    if (rc >= 0) return rc;
    int64_t mib = 64;  // twice this L3 (32 MiB), --quick too: a stream from memory
    if (mib_s) {
        char *end;
        mib = strtoll(mib_s, &end, 10);
        if (*end || mib < 1 || mib > 4096)
            return fprintf(stderr, "attn: bench --overlap: --mib: 1..4096, got '%s'\n", mib_s), 2;
    }
#if !defined(__x86_64__)
    (void)thp, (void)mib;
    return fprintf(stderr, "attn: bench --overlap: its loops are x86-64's (AVX2, AVX-512)\n"), 2;
#else
    const int nt = pa.threads > 0 ? pa.threads : omp_get_max_threads();
    const char *kernel = attn_kernel_name();
    const bool w512 = strncmp(kernel, "avx512", 6) == 0;
    if (!w512 && strcmp(kernel, "avx2") != 0)
        return fprintf(stderr, "attn: bench --overlap: needs the avx2 or an avx512 kernel, this one is %s\n", kernel), 2;
    const int64_t n = mib * (1 << 20) / 4, nbig = 2 * n;
    float *buf = buffer((size_t)n * 4, thp), *big = buffer((size_t)nbig * 4, thp);
    if (!buf || !big) return fprintf(stderr, "attn: bench --overlap: out of memory\n"), 1;
    for (int64_t i = 0; i < n; i++) buf[i] = (float)(i % 7) * 0x1p-20f;
    for (int64_t i = 0; i < nbig; i++) big[i] = 1.0f;
    printf("overlap probe: %lld MiB streamed%s, %d threads, %s loops (kernel %s), %d reps, medians\n",
           (long long)mib, thp ? " (huge pages asked for)" : "", nt, w512 ? "avx512" : "avx2", kernel, pa.reps);
    printf("  %4s %10s %10s %10s %12s %10s %9s\n", "F", "t_read ms", "t_fma ms", "t ms", "prefetch ms",
           "B per FMA", "of bound");
    double t_read = 0;
    for (int fi = 0; fi < NF; fi++) {
        double tr[2][100], tf[100];
        const pass_fn *fn = w512 ? g_pass512[fi] : g_pass256[fi];
        for (int r = 0; r < pa.reps; r++) {
            for (int v = 0; v < 2; v++) {
                flush(big, nbig, nt);
                tr[v][r] = timed(fn[v], buf, n, -1, nt);
            }
            tf[r] = timed(fn[0], buf, n, 255, nt);  // the same lines' work, in L1
        }
        const double t0 = median(tr[0], pa.reps), t1 = median(tr[1], pa.reps), t_fma = median(tf, pa.reps);
        if (fi == 0) t_read = t0 < t1 ? t0 : t1;
        const double t = t0 < t1 ? t0 : t1, bound = t_read > t_fma ? t_read : t_fma;
        printf("  %4d %10.2f %10.2f %10.2f %12.2f %10.1f %8.1f%%\n", g_f[fi], 1e3 * t_read, 1e3 * t_fma,
               1e3 * t0, 1e3 * t1, g_f[fi] ? 64.0 / g_f[fi] : 0.0, 100.0 * bound / t);
    }
    printf("  B per FMA: 64 / F, the bytes of cache one FMA of this width consumes; of bound:\n"
           "  max(t_read, t_fma) / the faster of the two streaming times\n");
    free(buf), free(big);
    return 0;
#endif
}
