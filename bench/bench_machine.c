/*
 * bench_machine.c — the machine under a bench run (bench_machine.h): peaks by each
 *                   kernel's own loops (src/kernels/<isa>/peak.c), the read bandwidth of a
 *                   buffer far larger than the caches, the CPU's model and what other
 *                   processes took from it.
 */
#include "bench_machine.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "attn.h"
#include "bench_clock.h"
#include "kernels/list.h"

/* The read loop of the bandwidth measurement (the widest loads), once it ran. */
static const bench_loops *g_read_loops;

cpu_sample machine_cpu_now(void) {
    cpu_sample c = {NAN, NAN, NAN};
    unsigned long long v[8] = {0};
    FILE *f = fopen("/proc/stat", "r");
    if (f) {
        if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                   &v[4], &v[5], &v[6], &v[7]) == 8) {
            const double tick = (double)sysconf(_SC_CLK_TCK);
            c.busy = (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / tick;
            c.total = c.busy + (double)(v[3] + v[4]) / tick;
        }
        fclose(f);
    }
    struct rusage self, kids;
    if (getrusage(RUSAGE_SELF, &self) == 0 && getrusage(RUSAGE_CHILDREN, &kids) == 0)
        c.own = (double)(self.ru_utime.tv_sec + self.ru_stime.tv_sec + kids.ru_utime.tv_sec +
                         kids.ru_stime.tv_sec) +
                1e-6 * (double)(self.ru_utime.tv_usec + self.ru_stime.tv_usec +
                                kids.ru_utime.tv_usec + kids.ru_stime.tv_usec);
    return c;
}

double machine_others_pct(cpu_sample a, cpu_sample b) {
    const double total = b.total - a.total, others = (b.busy - a.busy) - (b.own - a.own);
    if (!(total > 0)) return NAN;
    return others < 0 ? 0 : 100 * others / total;
}

void machine_loadavg(double l[3]) {
    l[0] = l[1] = l[2] = NAN;
    FILE *f = fopen("/proc/loadavg", "r");
    if (!f) return;
    if (fscanf(f, "%lf %lf %lf", &l[0], &l[1], &l[2]) != 3) l[0] = l[1] = l[2] = NAN;
    fclose(f);
}

/* every kernel's peak loops (kernels/list.h), best first */
static const bench_loops *const LOOPS[] = {
#define X_LOOPS(name, ...) &attn_peak_##name,
    ATTN_KERNEL_LIST(X_LOOPS)
#undef X_LOOPS
};
enum { N_LOOPS = sizeof LOOPS / sizeof LOOPS[0] };

static volatile double g_sink;

/* GFLOP/s of `loops` on `threads` threads: iterations sized for about `seconds` a trial,
 * the best of `trials` (a peak is the best the core does, not its median). */
static double fma_gflops(const bench_loops *l, int threads, double seconds, int trials) {
    int64_t iters = 1 << 16;
    for (;;) {  /* calibrate on one thread */
        double t0 = now_s();
        g_sink += l->fma(iters, 1.0f);
        double dt = now_s() - t0;
        if (dt > 0.02 * seconds || iters > ((int64_t)1 << 40)) {
            iters = (int64_t)((double)iters * seconds / (dt > 1e-9 ? dt : 1e-9)) + 1;
            break;
        }
        iters *= 4;
    }
    double best = 0;
    for (int t = 0; t < trials; t++) {
        double t0 = now_s();
#pragma omp parallel num_threads(threads)
        {
            double s = l->fma(iters, 1.0f + (float)omp_get_thread_num());
#pragma omp atomic
            g_sink += s;
        }
        double dt = now_s() - t0;
        double g = (double)iters * (double)l->flops_per_iter * threads / dt * 1e-9;
        if (g > best) best = g;
    }
    return best;
}

/* GB/s of one parallel pass over buf (n floats), each thread its own contiguous part
 * (the same parts that first touched it). */
double machine_read_pass(const bench_loops *l, const float *buf, int64_t n, int threads) {
    double t0 = now_s();
#pragma omp parallel num_threads(threads)
    {
        const int me = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t chunk = n / 64 / nt * 64;
        const int64_t lo = me * chunk, hi = me == nt - 1 ? n : lo + chunk;
        double s = l->read(buf + lo, hi - lo);
#pragma omp atomic
        g_sink += s;
    }
    return 4.0 * (double)n / (now_s() - t0) * 1e-9;
}

/* the best of `trials` passes after one untimed */
static double read_gbs(const bench_loops *l, const float *buf, int64_t n, int threads, int trials) {
    double best = 0;
    for (int t = 0; t <= trials; t++) {
        double g = machine_read_pass(l, buf, n, threads);
        if (t > 0 && g > best) best = g;
    }
    return best;
}

void machine_cpu_model(char *out, size_t n) {
    snprintf(out, n, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        const char *colon = strchr(line, ':');
        if (!colon) continue;
        colon++;
        while (*colon == ' ' || *colon == '\t') colon++;
        snprintf(out, n, "%s", colon);
        out[strcspn(out, "\n")] = 0;
        break;
    }
    fclose(f);
}

double machine_kernel_peak(const machine *m, const char *kernel, const char **isa) {
    for (int i = 0; i < m->npeaks; i++)
        if (strcmp(m->peaks[i].isa, kernel) == 0) {
            if (isa) *isa = m->peaks[i].isa;
            return m->peaks[i].gflops_n;
        }
    if (isa) *isa = m->peak_isa;
    return m->peak_n;
}

int machine_measure(machine *m, bool quick, bool quiet) {
    const double seconds = quick ? 0.005 : 0.1;
    const int trials = quick ? 2 : 5;
    for (int i = 0; i < N_LOOPS; i++) {
        const bench_loops *l = LOOPS[i];
        if (!attn_kernel_supported(l->isa)) continue;
        if (!quiet) fprintf(stderr, "attn bench: %s peak, %s ...\n", l->what, l->isa);
        const bool fp32 = strcmp(l->what, "fp32 FMA") == 0;
        isa_peak *p = fp32 ? &m->peaks[m->npeaks++] : &m->others[m->nothers++];
        p->isa = l->isa, p->what = l->what;
        p->gflops_1 = fma_gflops(l, 1, seconds, trials);
        p->gflops_n = m->threads > 1 ? fma_gflops(l, m->threads, seconds, trials) : p->gflops_1;
        if (!fp32) continue;
        if (p->gflops_n > m->peak_n) {
            m->peak_isa = p->isa, m->peak_1 = p->gflops_1, m->peak_n = p->gflops_n;
        }
        if (!m->bw_isa) m->bw_isa = l->isa;  /* the widest loads this CPU has */
    }
    /* Bandwidth: a buffer far larger than the caches (1 GiB; 64 MiB with --quick),
     * first touched by the same threads and parts that read it. */
    const bench_loops *bl = NULL;
    for (int i = 0; i < N_LOOPS; i++)
        if (strcmp(LOOPS[i]->isa, m->bw_isa) == 0) bl = LOOPS[i];
    m->bw_mib = quick ? 64 : 1024;
    const int64_t n = (int64_t)(m->bw_mib * 1024 * 1024 / 4);
    float *buf = aligned_alloc(64, (size_t)n * sizeof(float));
    if (!buf) {
        fprintf(stderr, "attn: bench: out of memory for the %g MiB bandwidth buffer\n", m->bw_mib);
        return 1;
    }
    if (!quiet) fprintf(stderr, "attn bench: read bandwidth, %g MiB, %s loads ...\n", m->bw_mib, bl->isa);
#pragma omp parallel num_threads(m->threads)
    {
        const int me = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t chunk = n / 64 / nt * 64;
        const int64_t lo = me * chunk, hi = me == nt - 1 ? n : lo + chunk;
        for (int64_t i = lo; i < hi; i++) buf[i] = 1e-3f * (float)(i & 7);
    }
    m->bw_1 = read_gbs(bl, buf, n, 1, quick ? 2 : 5);
    m->bw_n = m->threads > 1 ? read_gbs(bl, buf, n, m->threads, quick ? 2 : 5) : m->bw_1;
    free(buf);
    g_read_loops = bl;
    m->measured = true;
    return 0;
}

const bench_loops *machine_read_loops(void) {
    for (int i = 0; i < N_LOOPS && !g_read_loops; i++)  // not measured: the same widest loads
        if (attn_kernel_supported(LOOPS[i]->isa) && strcmp(LOOPS[i]->what, "fp32 FMA") == 0)
            g_read_loops = LOOPS[i];
    return g_read_loops;
}

/* ---- the machine for the other bench files (cli.h) -------------------------------- */
int bench_machine_peak(int threads, bool quick, double *fp32_gflops, double *read_gbs) {
    machine m = {.threads = threads};
    if (machine_measure(&m, quick, true)) return 1;
    *fp32_gflops = m.peak_n;
    *read_gbs = m.bw_n;
    return 0;
}
