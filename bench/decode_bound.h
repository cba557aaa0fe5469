/*
 * decode_bound.h — the compute bound of a decoding row (bench --paged, bench --q8): the
 *                  cycles the AVX2 decoding step's hot loops take per cached element, from
 *                  their instructions, against the core's issue rate and measured clock.
 *
 * Model (docs/BENCHMARKS.md, "Decoding's two bounds"):
 *   - the loops are those of src/kernels/avx2/decode.c for 4 query rows a call (every
 *     decoding row here: Hq / Hkv = 4 or 8, so calls of 4 rows), counted in `objdump -d`
 *     of build/obj/kernels/avx2/decode.o (gcc, the -O3 -mavx2 -mfma -mf16c of its folder): Q·Kᵀ's inner iteration (2 keys x 8
 *     columns, a bfloat16 K by halves 2 x 16, q8_0 2 x 16) and P·V's (1 key x 16 columns),
 *     each as instructions, FMAs and 256-bit loads (a folded operand counts), plus the
 *     work of a key outside them (the reduction tree of Q·Kᵀ, the logit's store, max and
 *     NaN lanes, its exponential in the softmax loop): about DEC_KEY_INS instructions;
 *   - the core (AMD Zen 3): 6 macro-ops dispatched a cycle, 2 FMA pipes, 2 256-bit loads a
 *     cycle; an iteration takes the largest of instructions / 6, FMAs / 2, loads / 2
 *     cycles (no overlap between the phases assumed, no stalls);
 *   - a group of G query heads on one KV head takes ceil(G / 4) calls on each tile, each
 *     doing the whole arithmetic again (the tile in L2 after the first);
 *   - the clock: a chain of dependent integer adds (1 cycle each on every x86 core),
 *     timed by the thread's CPU time, so a wait for a core on a shared machine is not
 *     counted; its median of 5.
 * The bound is min(memory bound, compute bound) as rates, i.e. the longer of the two
 * times: bytes / the read bandwidth timed beside the row, and cycles / (clock x threads).
 */
#ifndef ATTN_BENCH_DECODE_BOUND_H
#define ATTN_BENCH_DECODE_BOUND_H

#include <stdint.h>
#include <string.h>
#include <time.h>

#include "attn.h"
#include "bench_clock.h"

typedef struct dec_loop {
    double ins, fma, ld, elems;  // one iteration, and the cached elements it reads
} dec_loop;

typedef struct dec_loops {
    attn_dtype dt;
    dec_loop qk, pv;
} dec_loops;

/* objdump -d build/obj/kernels/avx2/decode.o, the 4-row loops of attn_decode_avx2 (P·V
 * recounted after af1ca94: its key loop asks for a line every key, no test) */
static const dec_loops DEC_LOOPS[] = {
    {ATTN_F32, {13, 8, 10, 16}, {22, 8, 6, 16}},
    {ATTN_BF16, {28, 16, 20, 32}, {24, 8, 6, 16}},
    {ATTN_F16, {23, 8, 10, 16}, {22, 8, 6, 16}},
    {ATTN_Q8_0, {93, 32, 48, 64}, {32, 8, 7, 16}},
};
enum { DEC_KEY_INS = 22 };
#define DEC_ISSUE 6.0  // Zen 3: macro-ops dispatched a cycle
#define DEC_FMA 2.0    // FMA pipes
#define DEC_LOADS 2.0  // 256-bit loads a cycle

static inline double dec_loop_cycles(dec_loop l) {
    double c = l.ins / DEC_ISSUE;
    if (l.fma / DEC_FMA > c) c = l.fma / DEC_FMA;
    if (l.ld / DEC_LOADS > c) c = l.ld / DEC_LOADS;
    return c;
}

/* Cycles per cached element (a key's D of K and D of V: 2D elements) of the AVX2 step
 * for a group of `group` query heads on a KV head; 0 where the table has no such dtype. */
static inline double dec_cycles_per_elem(attn_dtype dt, int64_t group, int64_t d) {
    for (size_t i = 0; i < sizeof DEC_LOOPS / sizeof DEC_LOOPS[0]; i++) {
        if (DEC_LOOPS[i].dt != dt) continue;
        const dec_loops *t = &DEC_LOOPS[i];
        const double key = (double)d * dec_loop_cycles(t->qk) / t->qk.elems +
                           (double)d * dec_loop_cycles(t->pv) / t->pv.elems + DEC_KEY_INS / DEC_ISSUE;
        return (double)((group + 3) / 4) * key / (2.0 * (double)d);
    }
    return 0;
}

static inline double thread_cpu_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The core clock in Hz: 16 dependent adds an iteration (the loop's own add and branch
 * beside them), timed by this thread's CPU time; the median of 5. 0 off x86-64. */
static inline double dec_clock_hz(void) {
#if defined(__x86_64__)
    double hz[5];
    const int64_t iters = 20000000;
    for (int r = 0; r < 5; r++) {
        uint64_t x = 0;
        const double t0 = thread_cpu_s();
        for (int64_t i = 0; i < iters; i++)
            __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
                             "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
                             "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
                             "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0"
                             : "+r"(x));
        hz[r] = 16.0 * (double)iters / (thread_cpu_s() - t0);
    }
    return median(hz, 5);
#else
    return 0;
#endif
}

/* The compute bound as the cache's bytes a second: bytes of nelem cached elements over
 * their cycles on `threads` cores at hz; 0 where unknown (not the avx2 kernel, or no
 * clock). */
static inline double dec_compute_gbs(attn_dtype dt, int64_t group, int64_t d, double bytes,
                                     double nelem, double hz, int threads) {
    const double cpe = dec_cycles_per_elem(dt, group, d);
    if (cpe <= 0 || hz <= 0 || strcmp(attn_kernel_name(), "avx2") != 0) return 0;
    return bytes / (nelem * cpe / (hz * (double)threads)) * 1e-9;
}

#endif /* ATTN_BENCH_DECODE_BOUND_H */
