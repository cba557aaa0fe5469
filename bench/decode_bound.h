/*
 * decode_bound.h — the compute bound of a decoding row (bench --paged, bench --q8): the
 *                  time the decoding step of the kernel that runs (attn_kernel_name(),
 *                  or for a quantized cache the kernel its step runs on) takes per cached
 *                  element, from its hot loops' FMAs and loads against this core's rates
 *                  of the same instructions, measured here.
 *
 * Model (docs/BENCHMARKS.md, "Decoding's two bounds"):
 *   - per kernel with a decoding step (kernels.h: decode), its loops for 4 query rows a
 *     call (every decoding row here: Hq / Hkv = 4 or 8, so calls of 4 rows): Q·Kᵀ's inner
 *     iteration and P·V's, each as FMAs and vector loads (a folded operand and a
 *     broadcast count) and the cached elements it reads. avx2: counted in `objdump -d` of
 *     build/obj/kernels/avx2/decode.o (gcc -O3 -mavx2 -mfma -mf16c; the instructions
 *     too, kept for the record); avx512 (and avx512bf16, whose table takes the same
 *     step): counted in the source of src/kernels/avx512/kernels.c (dec_qk4,
 *     dec_qk4_halves for bfloat16 K, pv_tile and dec_pv_bf16), 16-lane FMAs and loads;
 *     a kernel without a step (generic: the tiles) has no model, and its bound is n/a;
 *   - the rates, measured on this core, one thread, by thread CPU time (a wait for a
 *     core on a shared machine is not counted), the best of 5: vector FMAs a second from
 *     the peak loop of the step's ISA (src/kernels/<isa>/peak.c: independent FMAs in
 *     registers), vector loads a second from 8 independent loads of its width a round
 *     from L1 (dec_load_loop; the read loop of peak.c adds as it loads: its adds' latency
 *     would bound it);
 *   - an iteration takes the longer of FMAs / FMA rate and loads / load rate (no stalls,
 *     the other instructions issued beside them: the instructions of a key outside the
 *     loops, its exponential and reductions, are not counted), so the bound is an upper
 *     bound on the rate;
 *   - a group of G query heads on one KV head takes ceil(G / 4) calls on each tile, each
 *     doing the whole arithmetic again (the tile in L2 after the first).
 * The bound is min(memory bound, compute bound) as rates, i.e. the longer of the two
 * times: bytes / the read bandwidth timed beside the row, and the model's time / threads.
 * --in-cache prints the model in cycles, at the clock of a dependent add chain.
 */
#ifndef ATTN_BENCH_DECODE_BOUND_H
#define ATTN_BENCH_DECODE_BOUND_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attn.h"
#include "bench_clock.h"
#include "core/half.h"             // attn_is_fp8, attn_fp8_factor_folds
#include "kernels/kernels.h"       // ai_select_kernels, ai_kernels_for_* (private, linked)
#include "kernels/peak.h"  // the ISAs' peak and read loops

typedef struct dec_loop {
    double ins, fma, ld, elems;  // one iteration, and the cached elements it reads (ins 0: not counted)
    double sc;  // more FMA-port multiplies an iteration where an fp8 scale stays on the values
} dec_loop;

typedef struct dec_loops {
    const char *kernel;  // the kernel whose decoding step this is
    const char *isa;     // the peak loops its rates are measured with (kernels/peak.h)
    attn_dtype dt;
    dec_loop qk, pv;
} dec_loops;

static const dec_loops DEC_LOOPS[] = {
    /* objdump -d build/obj/kernels/avx2/decode.o, the 4-row loops of ai_decode_avx2, the
     * shortest instance of each (recounted 2026-12-07 for every cache dtype, once the
     * step's bfloat16 Q·Kᵀ widened K as float16's does and e4m3 took one multiply); fma
     * counts the FMA-port operations, a scale's multiplies among them (q8_0 and q4_0: the
     * block's; fp8: the head's, e4m3's 2^8 folded in, sc where the scale stays on the
     * values: as on the avx512 step, a power of two from 1 to 2^64 goes onto the query
     * and p instead), as the avx512 rows do; 8 lanes. Q·Kᵀ: 2 keys x 8 columns an
     * iteration (q8_0, q4_0: x 32, a block); P·V: a key's 16 columns */
    {"avx2", "avx2", ATTN_F32, {17, 8, 6, 16, 0}, {21, 8, 6, 16, 0}},
    {"avx2", "avx2", ATTN_BF16, {19, 8, 6, 16, 0}, {32, 8, 6, 16, 0}},
    {"avx2", "avx2", ATTN_F16, {17, 8, 6, 16, 0}, {21, 8, 6, 16, 0}},
    {"avx2", "avx2", ATTN_Q8_0, {85, 40, 42, 64, 0}, {32, 10, 6, 16, 0}},
    {"avx2", "avx2", ATTN_Q4_0, {100, 40, 40, 64, 0}, {42, 10, 7, 16, 0}},
    {"avx2", "avx2", ATTN_FP8_E5M2, {26, 8, 6, 16, 2}, {27, 8, 6, 16, 2}},
    {"avx2", "avx2", ATTN_FP8_E4M3, {38, 8, 10, 16, 2}, {39, 8, 10, 16, 2}},
    /* src/kernels/avx512/kernels.c, 4 rows, 16 lanes. Q·Kᵀ (dec_qk4): 4 keys x 16
     * columns an iteration, 4 K loads + 4 query loads, 16 FMAs; bfloat16 K by halves
     * (dec_qk4_halves, Dk a multiple of 32): 4 keys x 32 columns, 4 K loads + 8 query
     * loads, 32 FMAs. P·V (pv_tile, 4 zmm of columns): a key's 64 columns, 4 V loads + 4
     * broadcasts of p, 16 FMAs; bfloat16 (dec_pv_bf16): 2 V loads + 4 broadcasts */
    {"avx512", "avx512", ATTN_F32, {0, 16, 8, 64, 0}, {0, 16, 8, 64, 0}},
    {"avx512", "avx512", ATTN_BF16, {0, 32, 12, 128, 0}, {0, 16, 6, 64, 0}},
    {"avx512", "avx512", ATTN_F16, {0, 16, 8, 64, 0}, {0, 16, 8, 64, 0}},
    /* avx512bf16's table takes avx512's float32 step (ai_decode_avx512) */
    {"avx512bf16", "avx512", ATTN_F32, {0, 16, 8, 64, 0}, {0, 16, 8, 64, 0}},
    {"avx512bf16", "avx512", ATTN_BF16, {0, 32, 12, 128, 0}, {0, 16, 6, 64, 0}},
    {"avx512bf16", "avx512", ATTN_F16, {0, 16, 8, 64, 0}, {0, 16, 8, 64, 0}},
    /* the quantized caches on the avx512 step (load_kv): q8_0 and q4_0's K or V vectors
     * of 16 values each take a multiply by the block's scale on the FMA ports (loaded and
     * broadcast, one more load). Q·Kᵀ (dec_qk4): 16 FMAs + 4 multiplies, 4 K + 4 query
     * (+ 4 scale) loads; P·V (pv_tile): 16 FMAs + 4 multiplies, 4 V + 4 broadcasts (+ 4
     * scale) loads. fp8: the head's scale (e4m3's with its 2^8, kv_sc) is moved onto the
     * query and p where that is exact (attn_fp8_factor_folds: a power of two from 1 to 2^64, as
     * the default scale 1 gives), so the loops are float32's; else each vector takes
     * the multiply (sc: 4 an iteration) */
    {"avx512", "avx512", ATTN_Q8_0, {0, 20, 12, 64, 0}, {0, 20, 12, 64, 0}},
    {"avx512", "avx512", ATTN_Q4_0, {0, 20, 12, 64, 0}, {0, 20, 12, 64, 0}},
    {"avx512", "avx512", ATTN_FP8_E5M2, {0, 16, 8, 64, 4}, {0, 16, 8, 64, 4}},
    {"avx512", "avx512", ATTN_FP8_E4M3, {0, 16, 8, 64, 4}, {0, 16, 8, 64, 4}},
    {"avx512bf16", "avx512", ATTN_Q8_0, {0, 20, 12, 64, 0}, {0, 20, 12, 64, 0}},
    {"avx512bf16", "avx512", ATTN_Q4_0, {0, 20, 12, 64, 0}, {0, 20, 12, 64, 0}},
    {"avx512bf16", "avx512", ATTN_FP8_E5M2, {0, 16, 8, 64, 4}, {0, 16, 8, 64, 4}},
    {"avx512bf16", "avx512", ATTN_FP8_E4M3, {0, 16, 8, 64, 4}, {0, 16, 8, 64, 4}},
};

/* the name of the kernel a decoding call over a cache of dtype dt runs on ("none": no
 * kernel runs) */
static inline const char *dec_kernel(attn_dtype dt) {
    const attn_kernels *k = ai_select_kernels(NULL);
    if (k && dt == ATTN_Q8_0) k = ai_kernels_for_q8_0(k);
    if (k && (dt == ATTN_FP8_E4M3 || dt == ATTN_FP8_E5M2)) k = ai_kernels_for_fp8(k);
    if (k && dt == ATTN_Q4_0) k = ai_kernels_for_q4_0(k);
    return k ? k->name : "none";
}

/* the model of that kernel's step for dt; NULL where there is none */
static inline const dec_loops *dec_model(attn_dtype dt) {
    const char *kern = dec_kernel(dt);
    for (size_t i = 0; i < sizeof DEC_LOOPS / sizeof DEC_LOOPS[0]; i++)
        if (DEC_LOOPS[i].dt == dt && strcmp(DEC_LOOPS[i].kernel, kern) == 0) return &DEC_LOOPS[i];
    return NULL;
}

static inline double thread_cpu_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* This core's vector FMAs and vector loads a second on one thread, with the loops of isa
 * (lanes floats a vector); the rates of each ISA measured once. false where the ISA has
 * no loops here or this CPU cannot run them. */
typedef struct dec_rates {
    double fma_s, ld_s;
} dec_rates;

static volatile double dec_sink;

/* iters rounds of 8 independent vector loads (bytes 32: ymm, 64: zmm) from the 8 vectors
 * at p (in L1): the load ports' throughput, no arithmetic beside them. The bench is built
 * for the baseline, so the loads are written in assembly; run only where the ISA runs. */
static inline void dec_load_loop(int bytes, int64_t iters, const float *p) {
#if defined(__x86_64__)
    if (bytes == 32)
        __asm__ volatile("1:\n\t"
                         "vmovups (%1), %%ymm0\n\tvmovups 32(%1), %%ymm1\n\t"
                         "vmovups 64(%1), %%ymm2\n\tvmovups 96(%1), %%ymm3\n\t"
                         "vmovups 128(%1), %%ymm4\n\tvmovups 160(%1), %%ymm5\n\t"
                         "vmovups 192(%1), %%ymm6\n\tvmovups 224(%1), %%ymm7\n\t"
                         "dec %0\n\tjnz 1b\n\tvzeroupper"
                         : "+r"(iters) : "r"(p)
                         : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "cc", "memory");
    else
        __asm__ volatile("1:\n\t"
                         "vmovups (%1), %%zmm0\n\tvmovups 64(%1), %%zmm1\n\t"
                         "vmovups 128(%1), %%zmm2\n\tvmovups 192(%1), %%zmm3\n\t"
                         "vmovups 256(%1), %%zmm4\n\tvmovups 320(%1), %%zmm5\n\t"
                         "vmovups 384(%1), %%zmm6\n\tvmovups 448(%1), %%zmm7\n\t"
                         "dec %0\n\tjnz 1b\n\tvzeroupper"
                         : "+r"(iters) : "r"(p)
                         : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "cc", "memory");
#else
    (void)bytes, (void)iters, (void)p;
#endif
}

static inline bool dec_measure(const char *isa, dec_rates *out) {
    static const bench_loops *const loops[] = {
#define DEC_X_LOOPS(name, ...) &attn_peak_##name,
        ATTN_KERNEL_LIST(DEC_X_LOOPS)
#undef DEC_X_LOOPS
    };
    static struct { const char *isa; dec_rates r; bool ok; } memo[8];
    static int nmemo;
    for (int i = 0; i < nmemo; i++)
        if (strcmp(memo[i].isa, isa) == 0) return *out = memo[i].r, memo[i].ok;
    const bench_loops *l = NULL;
    for (size_t i = 0; i < sizeof loops / sizeof loops[0]; i++)
        if (strcmp(loops[i]->isa, isa) == 0) l = loops[i];
    const double lanes = strncmp(isa, "avx512", 6) == 0 ? 16 : strcmp(isa, "avx2") == 0 ? 8 : 0;
    dec_rates r = {0, 0};
#if defined(__x86_64__)
    bool ok = l && lanes > 0 && attn_kernel_supported(isa);
#else
    bool ok = false;  // the load loop is x86-64 assembly
#endif
    if (ok) {
        float *buf = aligned_alloc(64, 16 * 64);  // the 8 vectors the loads read
        ok = buf != NULL;
        for (int64_t i = 0; ok && i < 16 * 16; i++) buf[i] = 1e-3f * (float)(i & 7);
        const int64_t iters = 1 << 22, loads = 1 << 20;
        for (int t = 0; ok && t < 5; t++) {
            double t0 = thread_cpu_s();
            dec_sink += l->fma(iters, 1.0f);
            double dt = thread_cpu_s() - t0;
            const double f = (double)iters * (double)l->flops_per_iter / (2 * lanes) / dt;
            t0 = thread_cpu_s();
            dec_load_loop((int)(4 * lanes), loads, buf);
            dt = thread_cpu_s() - t0;
            const double ld = 8.0 * (double)loads / dt;
            if (f > r.fma_s) r.fma_s = f;
            if (ld > r.ld_s) r.ld_s = ld;
        }
        free(buf);
        ok = ok && r.fma_s > 0 && r.ld_s > 0 && isfinite(r.fma_s) && isfinite(r.ld_s);
    }
    if (nmemo < 8) memo[nmemo].isa = isa, memo[nmemo].r = r, memo[nmemo++].ok = ok;
    *out = r;
    return ok;
}

/* the loop's seconds per cached element; scaled: an fp8 scale stays on these values */
static inline double dec_loop_s(dec_loop l, bool scaled, dec_rates r) {
    const double f = (l.fma + (scaled ? l.sc : 0)) / r.fma_s, m = l.ld / r.ld_s;
    return (f > m ? f : m) / l.elems;
}

/* Whether an fp8 step keeps the head's scale on the values: any scale of the tensor
 * (NULL: scale 1), with e4m3's 2^8 in it, that attn_fp8_factor_folds refuses */
static inline bool dec_fp8_scaled(attn_dtype dt, const attn_tensor *scale) {
    if (!scale || !attn_is_fp8(dt)) return false;
    const int64_t n = scale->shape[0] * scale->shape[1] * scale->shape[2] * scale->shape[3];
    for (int64_t i = 0; i < n; i++)
        if (!attn_fp8_factor_folds((dt == ATTN_FP8_E4M3 ? 256.0f : 1.0f) * ((const float *)scale->data)[i]))
            return true;
    return false;
}

/* Seconds per cached element (a key's D of K and D of V: 2D elements) of the step that
 * runs for dt, on one thread, for a group of `group` query heads on a KV head; NaN where
 * there is no model (or no rate). */
static inline double dec_s_per_elem(attn_dtype dt, int64_t group, int64_t d, bool k_scaled,
                                     bool v_scaled) {
    const dec_loops *t = dec_model(dt);
    dec_rates r;
    if (!t || !dec_measure(t->isa, &r)) return NAN;
    const double key = (double)d * dec_loop_s(t->qk, k_scaled, r) + (double)d * dec_loop_s(t->pv, v_scaled, r);
    return (double)((group + 3) / 4) * key / (2.0 * (double)d);
}

/* The core clock in Hz: 16 dependent adds an iteration (the loop's own add and branch
 * beside them), timed by this thread's CPU time; the median of 5. 0 off x86-64. For
 * --in-cache's cycles only: the bound itself takes no clock. */
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
 * the model's time on `threads` cores; NaN where there is no model (print "n/a"). */
static inline double dec_compute_gbs(attn_dtype dt, int64_t group, int64_t d, bool k_scaled,
                                     bool v_scaled, double bytes, double nelem, int threads) {
    const double spe = dec_s_per_elem(dt, group, d, k_scaled, v_scaled);
    if (!(spe > 0) || threads < 1) return NAN;
    return bytes / (nelem * spe / (double)threads) * 1e-9;
}

/* "%*.*f" of x into buf, or "n/a" (right-aligned in width) where x is not a number */
static inline const char *dec_fmt(char *buf, size_t cap, int width, int prec, double x) {
    if (isfinite(x) && x > 0) snprintf(buf, cap, "%*.*f", width, prec, x);
    else snprintf(buf, cap, "%*s", width, "n/a");
    return buf;
}

/* One line on what the bound is for dt (no newline): the kernel, the rates, or why n/a. */
static inline void dec_describe(attn_dtype dt, char *buf, size_t cap) {
    const dec_loops *t = dec_model(dt);
    dec_rates r;
    if (!t)
        snprintf(buf, cap, "%s: n/a (kernel %s has no model of a decoding step)",
                 attn_dtype_name(dt), dec_kernel(dt));
    else if (!dec_measure(t->isa, &r))
        snprintf(buf, cap, "%s: n/a (the %s loops cannot run)", attn_dtype_name(dt), t->isa);
    else if (t->qk.sc > 0 || t->pv.sc > 0)
        snprintf(buf, cap, "%s: the %s step, %s loops: %.2f G vector FMAs/s, %.2f G vector "
                 "loads/s a thread; %.3f ns a cached element (Hq/Hkv 4, D 128; %.3f with "
                 "scales kept on the values)",
                 attn_dtype_name(dt), t->kernel, t->isa, r.fma_s * 1e-9, r.ld_s * 1e-9,
                 1e9 * dec_s_per_elem(dt, 4, 128, false, false), 1e9 * dec_s_per_elem(dt, 4, 128, true, true));
    else
        snprintf(buf, cap, "%s: the %s step, %s loops: %.2f G vector FMAs/s, %.2f G vector "
                 "loads/s a thread; %.3f ns a cached element (Hq/Hkv 4, D 128)",
                 attn_dtype_name(dt), t->kernel, t->isa, r.fma_s * 1e-9, r.ld_s * 1e-9,
                 1e9 * dec_s_per_elem(dt, 4, 128, false, false));
}

#endif /* ATTN_BENCH_DECODE_BOUND_H */
