/*
 * peak.c (generic) — the portable loops of kernels/peak.h, compiled for the baseline ISA: what
 * `attn bench` measures on a CPU without AVX2 (or not x86 at all).
 *
 * Plain C with several independent chains so that the compiler may keep them in
 * registers. Without FMA in the baseline, a chain step is a multiply and an add (still
 * 2 flops); the figure is the peak of this build's portable code, not of the hardware.
 */
#include "kernels/peak.h"

enum { NACC = 16 };

static double fma_generic(int64_t iters, float seed) {
    float acc[NACC];
    for (int a = 0; a < NACC; a++) acc[a] = seed + (float)a * 1e-3f;
    const float x = 0.9999999f, y = seed * 1e-7f;
    for (int64_t i = 0; i < iters; i++)
        for (int a = 0; a < NACC; a++) acc[a] = acc[a] * x + y;
    double s = 0.0;
    for (int a = 0; a < NACC; a++) s += acc[a];
    return s;
}

static double read_generic(const float *p, int64_t n) {
    float acc[NACC] = {0};
    for (int64_t i = 0; i < n; i += NACC)
        for (int a = 0; a < NACC; a++) acc[a] += p[i + a];
    double s = 0.0;
    for (int a = 0; a < NACC; a++) s += acc[a];
    return s;
}

const bench_loops attn_peak_generic = {"generic", "fp32 FMA", fma_generic, (int64_t)NACC * 2, read_generic};
