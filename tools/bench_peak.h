/*
 * bench_peak.h — the machine-measuring loops of `attn bench` (tools/cli_bench.c): a
 *                register-resident loop of independent float32 FMAs (the FMA peak) and
 *                a streaming read of a large buffer (the read bandwidth), one set per ISA.
 *
 * Each ISA's loops live in their own file compiled with that ISA's flags
 * (bench_peak_avx512bf16.c, bench_peak_avx512.c, bench_peak_avx2.c; the Makefile's
 * ISA_bench_peak_* lines); the
 * portable set is in bench_peak.c, compiled for the baseline. The caller runs a set only
 * on a CPU that attn_kernel_supported() says can run it. These loops measure the
 * machine, not the library: they share no code with the attention kernels.
 */
#ifndef ATTN_BENCH_PEAK_H
#define ATTN_BENCH_PEAK_H

#include <stdint.h>

typedef struct bench_loops {
    const char *isa;  /* "avx512", "avx2", "generic": the name attn_kernel_supported() takes */
    const char *what; /* "fp32 FMA", or another instruction whose peak is reported apart */
    /* iters rounds of independent multiply-adds held in registers (FMAs, or the
     * instruction `what` names): flops_per_iter flops per round (2 per multiply-add). Returns the sum of the accumulators so that the
     * compiler keeps the loop; seed keeps it from being folded at compile time. */
    double (*fma)(int64_t iters, float seed);
    int64_t flops_per_iter;
    /* Sums n floats from p (64-byte aligned, n a multiple of 64) with vector loads into
     * several independent accumulators. */
    double (*read)(const float *p, int64_t n);
} bench_loops;

extern const bench_loops bench_loops_generic;
#if defined(__x86_64__) || defined(_M_X64)
extern const bench_loops bench_loops_avx512bf16;
extern const bench_loops bench_loops_avx512;
extern const bench_loops bench_loops_avx2;
#endif

/* This machine's fp32 FMA peak (GFLOP/s, the best ISA) and read bandwidth (GB/s) on
 * `threads` threads, as `attn bench` measures them (tools/cli_bench.c); short
 * measurements with quick. Returns non-zero (after a message) when out of memory. */
#include <stdbool.h>
int bench_machine_peak(int threads, bool quick, double *fp32_gflops, double *read_gbs);

#endif /* ATTN_BENCH_PEAK_H */
