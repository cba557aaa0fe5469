/*
 * peak.h — the machine-measuring loops of `attn bench` (bench/cli_bench.c): a
 *          register-resident loop of independent float32 FMAs (the FMA peak) and a
 *          streaming read of a large buffer (the read bandwidth), one set per ISA.
 *
 * Each kernel folder has its set in peak.c, compiled with that ISA's flags (its line of
 * kernels/list.h), as attn_peak_<name>; the generic folder's is compiled for the
 * baseline. The caller runs a set only on a CPU that attn_kernel_supported() says can
 * run it. These loops measure the machine, not the library: they share no code with the
 * attention kernels, and no library call uses them (they are in libattn so that an ISA's
 * loops live in its folder; hidden, not part of the API).
 */
#ifndef ATTN_KERNELS_PEAK_H
#define ATTN_KERNELS_PEAK_H

#include <stdint.h>

#include "list.h"

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

#define ATTN_X_PEAK(name, ...) \
    __attribute__((visibility("hidden"))) extern const bench_loops attn_peak_##name;
ATTN_KERNEL_LIST(ATTN_X_PEAK)
#undef ATTN_X_PEAK

#endif /* ATTN_KERNELS_PEAK_H */
