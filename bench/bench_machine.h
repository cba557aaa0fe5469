/*
 * bench_machine.h — what a bench run knows of the machine under it: the CPU's model, each
 *                   kernel's fp32 FMA peak (and other instructions' rates) on one thread
 *                   and on all, the read bandwidth, and how much of the CPU other
 *                   processes took while it ran (/proc/stat, /proc/loadavg).
 */
#ifndef ATTN_TOOLS_BENCH_MACHINE_H
#define ATTN_TOOLS_BENCH_MACHINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/peak.h"


typedef struct isa_peak { const char *isa, *what; double gflops_1, gflops_n; } isa_peak;

typedef struct machine {
    char cpu[128];
    int procs, threads;
    bool measured;
    isa_peak peaks[4];        /* fp32 FMA, one per ISA                          */
    int npeaks;
    isa_peak others[2];       /* other instructions (vdpbf16ps), reported apart */
    int nothers;
    const char *peak_isa;     /* the best */
    double peak_1, peak_n;    /* GFLOP/s, 1 thread and `threads` threads */
    const char *bw_isa;
    double bw_1, bw_n;        /* GB/s (1e9 bytes) */
    double bw_mib;            /* the buffer streamed */
    double load_start[3], load_end[3];  /* /proc/loadavg: other work shares the cores */
    double others_pct;        /* % of all CPU time used by other processes during the run */
} machine;

/* Busy and total CPU seconds of the whole machine so far (/proc/stat), and this process's
 * own (with its waited-for children, the PyTorch side): their difference over the run is
 * what other processes took from the cores the timings ran on. */
typedef struct cpu_sample { double busy, total, own; } cpu_sample;

/* the CPU's model name (/proc/cpuinfo), "unknown" without one */
void machine_cpu_model(char *out, size_t n);
/* /proc/loadavg's three figures, NaN where unreadable */
void machine_loadavg(double l[3]);
cpu_sample machine_cpu_now(void);
/* % of the machine's CPU time between a and b that other processes used */
double machine_others_pct(cpu_sample a, cpu_sample b);
/* Measures m's peaks and bandwidth (m->threads set by the caller); 0 or 1 (told on stderr).
 * Afterwards machine_read_loops() is the read loop it used. */
int machine_measure(machine *m, bool quick, bool quiet);
/* The fp32 FMA peak on m->threads threads of the loops that measure `kernel` (a name of
 * kernels/list.h): its own set where it has one, else the machine's best (avx512bf16's
 * float32 arithmetic is avx512's: its own loops time vdpbf16ps, reported apart); the ISA
 * of those loops into *isa where isa is not NULL. */
double machine_kernel_peak(const machine *m, const char *kernel, const char **isa);
/* The read loop of the bandwidth measurement; before one ran, the widest fp32 loads this
 * CPU has. */
const bench_loops *machine_read_loops(void);
/* GB/s of one parallel pass over buf (n floats), each thread its own contiguous part */
double machine_read_pass(const bench_loops *l, const float *buf, int64_t n, int threads);

#endif /* ATTN_TOOLS_BENCH_MACHINE_H */
