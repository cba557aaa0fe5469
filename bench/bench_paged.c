/*
 * bench_paged.c — `attn bench --paged`: decoding over a paged key/value cache against the
 *                 same cache contiguous (the paged-decoding speed rows).
 *
 * Method:
 *   - the shape is a decoding step, Lq = 1, Lk = 16384, Hq = 32 (--g8: and 64), Hkv = 8, D = 128, with
 *     B = 1 and B = 8 (--quick: Lk = 4096, B = 1 only), float32 queries, a float32 or
 *     bfloat16 cache; the pools are [num_pages, Hkv, page_size, D] (--nhd: FlashAttention's
 *     [num_pages, page_size, Hkv, D]) with the pages of each sequence in a shuffled order,
 *     page sizes 16, 64 and 256;
 *   - each paged answer is checked first: within the contract's float32 tolerance of the
 *     float64 reference, and bit for bit the contiguous answer where the tiles are the
 *     same (every page size on a kernel whose decoding step reads rows across pages, or
 *     without a step; else page sizes multiples of 128); --plant-error turns one key of
 *     the pool towards
 *     the query and must fail;
 *   - one warm-up call each, then --reps rounds (default 15); a round times the contiguous
 *     call and each paged call in turn, and after each call a plain read of a buffer of
 *     the size of K and V (capped at 1 GiB) that no call touches (AVX2 loads): memory
 *     bandwidth on a shared machine drifts, interleaved timings do not;
 *   - reported: medians; GB/s = bytes of K and V / time; %read = that over the median read
 *     bandwidth timed beside the row; paged/contig = the contiguous median time over the
 *     paged one (1 = paging costs nothing); cpu = the process's CPU time a call (all
 *     threads), and its ratio likewise: on a machine shared with other work the wall
 *     times include time the threads waited for a core, the CPU times do not.
 *   - rows read: a plain read (AVX2 loads) of the very K and V rows the call reads, in its
 *     order (head by head, page by page through the table), timed after each call, and
 *     the call's GB/s over it: what the layout itself costs a stream, without the
 *     arithmetic (scattered 4-8 KiB runs of 16-key pages against one stream);
 *     "prefetched": the same read with the rows 32 KiB ahead in each stream asked for
 *     through the table before each run (prefetcht2 a line), as the library asks for a
 *     paged tile's successor: whether the layout's cost is one of announcing the pages.
 *   - compute: the compute bound of the row for the kernel that runs (decode_bound.h: its
 *     step's FMAs and loads against this core's measured rates; n/a without a model) and
 *     "% of bound", the row's rate over min(read, compute); --in-cache times the step's
 *     cycles a key in L2.
 * What it is not: a test (no time limit anywhere).
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
#include "tolerance.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

static volatile double g_sink;
static bool g_thp;  // --thp: K, V and the pools in transparent huge pages
static double g_hz;  // the core clock (decode_bound.h), for --in-cache's cycles

/* bytes for a cache or a pool: 64-byte aligned, or with --thp 2 MiB aligned and on huge
 * pages by attn_huge_pages (the system may still refuse: then it is 4 KiB pages as
 * without) */
static void *kv_alloc(size_t bytes) {
    const size_t huge = (size_t)2 << 20;
    if (!g_thp) return aligned_alloc(64, (bytes + 63) / 64 * 64);
    void *p = aligned_alloc(huge, (bytes + huge - 1) / huge * huge);
    if (p) (void)attn_huge_pages(p, (bytes + huge - 1) / huge * huge);
    return p;
}

#if defined(__x86_64__)
/* n a multiple of 32 (else the tail is not read), p 32-byte aligned */
__attribute__((target("avx2"))) static double read_avx2(const float *p, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
        a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
    }
    float s[8];
    _mm256_storeu_ps(s, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}
#endif

static double read_plain(const float *p, int64_t n) {
    double s0 = 0, s1 = 0;
    for (int64_t i = 0; i + 1 < n; i += 2) s0 += p[i], s1 += p[i + 1];
    return s0 + s1;
}

/* GB/s of one parallel pass over buf (n floats, a multiple of 64 per thread) */
static double read_pass(const float *buf, int64_t n, int threads, bool avx2) {
    const double t0 = now_s();
#pragma omp parallel num_threads(threads)
    {
        const int me = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t chunk = n / 64 / nt * 64, lo = me * chunk, hi = me == nt - 1 ? n : lo + chunk;
        #if defined(__x86_64__)
        const double s = avx2 ? read_avx2(buf + lo, hi - lo) : read_plain(buf + lo, hi - lo);
#else
        const double s = read_plain(buf + lo, hi - lo);
        (void)avx2;
#endif
#pragma omp atomic
        g_sink += s;
    }
    return 4.0 * (double)n / (now_s() - t0) * 1e-9;
}

enum { N_PAGES = 3, MAX_REPS = 64 };
static const int64_t PAGE_SIZES[N_PAGES] = {16, 64, 256};

typedef struct layout {
    void *k, *v;                 // contiguous [B, Hkv, Lk, D], or the pools
    int32_t *bt;                 // [B, max_pages], NULL for contiguous
    attn_tensor tk, tv, tbt;
    int64_t ps;
} layout;

static uint64_t g_rng = 0x243f6a8885a308d3ull;
static uint64_t rnd(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return g_rng;
}

/* The pools of page size ps holding the rows of the contiguous cache c, pages shuffled. */
static bool make_paged(const layout *c, int64_t B, int64_t Hkv, int64_t Lk, int64_t D,
                       size_t es, attn_dtype dt, int64_t ps, bool nhd, layout *p) {
    const int64_t mp = Lk / ps, np = B * mp;
    *p = (layout){.ps = ps};
    p->k = kv_alloc((size_t)(np * Hkv * ps * D) * es);
    p->v = kv_alloc((size_t)(np * Hkv * ps * D) * es);
    p->bt = malloc((size_t)np * sizeof(int32_t));
    if (!p->k || !p->v || !p->bt) return false;
    for (int64_t a = 0; a < np; a++) p->bt[a] = (int32_t)a;
    for (int64_t a = np - 1; a > 0; a--) {
        const int64_t z = (int64_t)(rnd() % (uint64_t)(a + 1));
        const int32_t t = p->bt[a]; p->bt[a] = p->bt[z]; p->bt[z] = t;
    }
    const int64_t sp = nhd ? ps * Hkv * D : Hkv * ps * D, sg = nhd ? D : ps * D, so = nhd ? Hkv * D : D;
#pragma omp parallel for schedule(static)
    for (int64_t bp = 0; bp < np; bp++) {
        const int64_t b = bp / mp, pg = bp % mp, page = p->bt[bp];
        for (int64_t g = 0; g < Hkv; g++)
            for (int64_t o = 0; o < ps; o++) {
                const int64_t x = ((b * Hkv + g) * Lk + pg * ps + o) * D, y = page * sp + g * sg + o * so;
                memcpy((char *)p->k + y * es, (const char *)c->k + x * es, (size_t)D * es);
                memcpy((char *)p->v + y * es, (const char *)c->v + x * es, (size_t)D * es);
            }
    }
    p->tk = (attn_tensor){p->k, dt, {np, Hkv, ps, D}, {sp, sg, so, 1}};
    p->tv = (attn_tensor){p->v, dt, {np, Hkv, ps, D}, {sp, sg, so, 1}};
    p->tbt = attn_tensor_4d(p->bt, ATTN_I32, B, mp, 1, 1);
    return true;
}

static void free_layout(layout *l) { free(l->k), free(l->v), free(l->bt); }

/* the byte offset, in elements, of row j of head g of sequence b's K (V: the same) */
static int64_t row_at(const layout *l, int64_t b, int64_t g, int64_t Hkv, int64_t Lk, int64_t D, int64_t j) {
    if (!l->bt) return ((b * Hkv + g) * Lk + j) * D;
    const int64_t mp = Lk / l->ps;
    return l->bt[b * mp + j / l->ps] * l->tk.stride[0] + g * l->tk.stride[1] + (j % l->ps) * l->tk.stride[2];
}

/* GB/s of one parallel plain read (AVX2 loads, as read_pass) of the K and V rows a call
 * reads, in its order: head by head, each head's keys page by page through the block table
 * (l->bt; NULL: one run). The bound a layout leaves a stream without the arithmetic: the
 * pages' scattered runs cost it what they cost the call's reads. With pf, before each run
 * the rows PF_AHEAD_BYTES ahead in each stream (the run that starts there and on to it)
 * are asked for (prefetcht2, one a 64-byte line, through the table), as the library's
 * paged step asks for the next tile: the same read with the page changes announced. */
enum { PF_AHEAD_BYTES = 32768 };
static double read_rows(const layout *l, int64_t B, int64_t Hkv, int64_t Lk, int64_t D,
                        size_t es, int threads, bool avx2, bool pf) {
    const double t0 = now_s();
    const int64_t run = l->bt ? l->ps : Lk, rowf = D * (int64_t)es / 4;
    const int64_t rb = D * (int64_t)es, ahead = (PF_AHEAD_BYTES + run * rb - 1) / (run * rb);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t bg = 0; bg < B * Hkv; bg++) {
        const int64_t b = bg / Hkv, g = bg % Hkv;
        double s = 0;
        for (int64_t j = 0; j < Lk; j += run) {
            const int64_t at = row_at(l, b, g, Hkv, Lk, D, j);
            const int64_t st = l->bt ? l->tk.stride[2] : D;
            if (pf && l->bt) {  // the run `ahead` runs on (the first ones: those before it too)
                for (int64_t a = j == 0 ? 1 : ahead; a <= ahead && j + a * run < Lk; a++) {
                    const int64_t pa = row_at(l, b, g, Hkv, Lk, D, j + a * run);
                    for (int h = 0; h < 2; h++)
                        for (int64_t r = 0; r < run; r++) {
                            const char *row = (const char *)(h ? l->v : l->k) + (size_t)(pa + r * st) * es;
                            for (int64_t x = 0; x < rb; x += 64) __builtin_prefetch(row + x, 0, 1);
                        }
                }
            }
            for (int h = 0; h < 2; h++) {
                const float *x = (const float *)((const char *)(h ? l->v : l->k) + (size_t)at * es);
                if (st == D) {  // the run's rows one after the other
                    s += avx2 ? read_avx2(x, run * rowf) : read_plain(x, run * rowf);
                    continue;
                }
                for (int64_t r = 0; r < run; r++) {
                    const float *row = (const float *)((const char *)x + (size_t)(r * st) * es);
                    s += avx2 ? read_avx2(row, rowf) : read_plain(row, rowf);
                }
            }
        }
#pragma omp atomic
        g_sink += s;
    }
    return 2.0 * (double)(B * Hkv * Lk * D) * (double)es / (now_s() - t0) * 1e-9;
}

static attn_status call(const layout *l, const attn_tensor *q, const attn_tensor *o, int threads) {
    attn_options opt = {.threads = threads, .block_table = l->bt ? &l->tbt : NULL};
    return attn_forward(q, &l->tk, &l->tv, o, &opt);
}

/* One shape: B, cache dtype. Returns 0 on success, 1 when a check failed. */
static int run_shape(int64_t B, int64_t Hq, int64_t Lk, attn_dtype dt, int reps, int threads, bool nhd,
                     bool plant, bool avx2) {
    const int64_t Hkv = 8, D = 128;
    const size_t es = attn_dtype_size(dt);
    const int nt = threads > 0 ? threads : omp_get_max_threads();
    layout c = {0};
    c.k = kv_alloc((size_t)(B * Hkv * Lk * D) * es);
    c.v = kv_alloc((size_t)(B * Hkv * Lk * D) * es);
    float *q = malloc((size_t)(B * Hq * D) * sizeof(float));
    float *o0 = malloc((size_t)(B * Hq * D) * sizeof(float)), *o1 = malloc((size_t)(B * Hq * D) * sizeof(float));
    const double kv_bytes = 2.0 * (double)(B * Hkv * Lk * D) * (double)es;
    int64_t nbuf = (int64_t)(kv_bytes < 1073741824.0 ? kv_bytes : 1073741824.0) / 4 / (64 * nt) * (64 * nt);
    float *rbuf = kv_alloc((size_t)nbuf * sizeof(float));  // the read's buffer as the caches
    if (!c.k || !c.v || !q || !o0 || !o1 || !rbuf) return fprintf(stderr, "attn: bench --paged: out of memory\n"), 1;
    const int64_t n = B * Hkv * Lk * D;
#pragma omp parallel for schedule(static)
    for (int64_t x = 0; x < n; x++) {
        const float kx = (float)((x * 2654435761u) % 1000) * 2e-3f - 1.0f;
        const float vx = (float)((x * 40503u + 17) % 1000) * 1e-3f - 0.5f;
        if (dt == ATTN_F32) {
            ((float *)c.k)[x] = kx, ((float *)c.v)[x] = vx;
        } else {  // bfloat16: the top half of the float32 (these values are exact there)
            uint32_t u, w;
            memcpy(&u, &kx, 4), memcpy(&w, &vx, 4);
            ((uint16_t *)c.k)[x] = (uint16_t)(u >> 16), ((uint16_t *)c.v)[x] = (uint16_t)(w >> 16);
        }
    }
#pragma omp parallel for schedule(static)
    for (int64_t x = 0; x < nbuf; x++) rbuf[x] = 1e-3f * (float)(x & 7);
    for (int64_t x = 0; x < B * Hq * D; x++) q[x] = (float)((x * 7919) % 200) * 1e-2f - 1.0f;
    c.tk = attn_tensor_4d(c.k, dt, B, Hkv, Lk, D);
    c.tv = attn_tensor_4d(c.v, dt, B, Hkv, Lk, D);
    const attn_tensor tq = attn_tensor_4d(q, ATTN_F32, B, Hq, 1, D);
    const attn_tensor to0 = attn_tensor_4d(o0, ATTN_F32, B, Hq, 1, D), to1 = attn_tensor_4d(o1, ATTN_F32, B, Hq, 1, D);
    layout pg[N_PAGES];
    for (int s = 0; s < N_PAGES; s++)
        if (!make_paged(&c, B, Hkv, Lk, D, es, dt, PAGE_SIZES[s], nhd, &pg[s]))
            return fprintf(stderr, "attn: bench --paged: out of memory for the pools\n"), 1;
    /* the check: each paged answer within the contract's float32 tolerance of the float64
     * reference, and bit for bit the contiguous answer where the tiles are the same: every
     * page size where a tile across pages is one decoding step (the kernel's decode_rows:
     * avx2's and the avx512 ones') or the kernel has no decoding step (generic: every tile
     * gathered); on another, page sizes that are multiples of the 128-key tile (smaller
     * pages would be read segment by segment there, which rounds differently) */
    int bad = 0;
    const attn_kernels *kern = ai_select_kernels(NULL);
    const bool one_step = kern && (kern->decode_rows || !kern->decode);
    float *oref = malloc((size_t)(B * Hq * D) * sizeof(float));
    const attn_tensor tref = attn_tensor_4d(oref, ATTN_F32, B, Hq, 1, D);
    attn_options ropt = {.threads = threads, .path = ATTN_PATH_REFERENCE};
    if (!oref || attn_forward(&tq, &c.tk, &c.tv, &tref, &ropt) != ATTN_OK ||
        call(&c, &tq, &to0, threads) != ATTN_OK)
        return fprintf(stderr, "attn: %s\n", attn_last_error()), 1;
    for (int s = 0; s < N_PAGES; s++) {
        if (plant && s == 0) {  // key 0 of batch 0, head 0 turned towards the query
            const int64_t at = pg[s].bt[0] * pg[s].tk.stride[0];
            for (int64_t d = 0; d < D; d++) {
                if (dt == ATTN_F32) {
                    ((float *)pg[s].k)[at + d] += 4.0f * q[d];
                } else {
                    const float x = 4.0f * q[d];
                    uint32_t u;
                    memcpy(&u, &x, 4);
                    ((uint16_t *)pg[s].k)[at + d] = (uint16_t)(u >> 16);
                }
            }
        }
        if (call(&pg[s], &tq, &to1, threads) != ATTN_OK) return fprintf(stderr, "attn: %s\n", attn_last_error()), 1;
        tol_acc acc = tol_start();
        for (int64_t x = 0; x < B * Hq * D; x++) tol_add(&acc, x, o1[x], oref[x]);
        tol_result tr;
        const bool near = tol_pass(&acc, &tr) != 0;
        const bool same = (PAGE_SIZES[s] % 128 != 0 && !one_step) ||
                          memcmp(o0, o1, (size_t)(B * Hq * D) * sizeof(float)) == 0;
        if (!near || !same) {
            printf("check FAILED: page %lld, B=%lld %s: %s (max err %.3g, rel %.3g)\n",
                   (long long)PAGE_SIZES[s], (long long)B, attn_dtype_name(dt),
                   !near ? "off the reference" : "not the contiguous answer bit for bit",
                   tr.max_err, tr.rel_err);
            bad = 1;
        }
    }
    free(oref);
    if (bad) goto done;
    /* interleaved rounds */
    double t[N_PAGES + 1][MAX_REPS], bw[N_PAGES + 1][MAX_REPS], u[N_PAGES + 1][MAX_REPS];
    double rr[N_PAGES + 1][MAX_REPS], rp[N_PAGES + 1][MAX_REPS];
    for (int r = -1; r < reps; r++)
        for (int s = 0; s <= N_PAGES; s++) {
            const layout *l = s == 0 ? &c : &pg[s - 1];
            const double t0 = now_s(), u0 = cpu_s();
            call(l, &tq, &to1, threads);
            const double dt_s = now_s() - t0, du = cpu_s() - u0;
            const double g = read_pass(rbuf, nbuf, nt, avx2);
            const double gr = read_rows(l, B, Hkv, Lk, D, es, nt, avx2, false);
            const double gp = read_rows(l, B, Hkv, Lk, D, es, nt, avx2, true);
            if (r >= 0) t[s][r] = dt_s, bw[s][r] = g, u[s][r] = du, rr[s][r] = gr, rp[s][r] = gp;
        }
    const double tc = median(t[0], reps), uc = median(u[0], reps);
    for (int s = 0; s <= N_PAGES; s++) {
        const double tm = median(t[s], reps), rb = median(bw[s], reps), gbs = kv_bytes / tm * 1e-9;
        const double um = median(u[s], reps), rm = median(rr[s], reps), pm = median(rp[s], reps);
        char name[32];
        if (s == 0) snprintf(name, sizeof name, "contiguous");
        else snprintf(name, sizeof name, "paged %lld", (long long)PAGE_SIZES[s - 1]);
        /* the compute bound of the contiguous row's arithmetic (decode_bound.h); the
         * bound = min(read, compute) as rates */
        const double cg = dec_compute_gbs(dt, Hq / Hkv, D, false, false, kv_bytes, 2.0 * (double)(B * Hkv * Lk * D), nt);
        const double bound = cg > 0 && cg < rb ? cg : rb;  // no model (n/a): the read alone
        char cgs[16];
        printf("decode B=%lld Hq=%lld Lk=%lld %-8s %-11s %8.3f ms %7.1f GB/s  read %6.1f GB/s  %5.1f%% read  "
               "compute %s GB/s  %5.1f%% of bound  "
               "paged/contig %.3f  cpu %8.3f ms  cpu paged/contig %.3f  rows read %6.1f GB/s %5.1f%%  "
               "prefetched %6.1f GB/s %5.1f%%\n",
               (long long)B, (long long)Hq, (long long)Lk, attn_dtype_name(dt), name, tm * 1e3, gbs, rb,
               100.0 * gbs / rb, dec_fmt(cgs, sizeof cgs, 6, 1, cg), 100.0 * gbs / bound, tc / tm, um * 1e3, uc / um, rm, 100.0 * gbs / rm, pm,
               100.0 * gbs / pm);
    }
done:
    for (int s = 0; s < N_PAGES; s++) free_layout(&pg[s]);
    free_layout(&c);
    free(q), free(o0), free(o1), free(rbuf);
    return bad;
}

/* cycles of one call (median of 15 rounds of `calls` calls, thread CPU time x the clock) */
static double call_cycles(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                          const attn_tensor *o, int64_t calls) {
    attn_options opt = {.threads = 1};
    double cyc[15];
    for (int w = 0; w < 50; w++) attn_forward(q, k, v, o, &opt);
    for (int r = 0; r < 15; r++) {
        const double t0 = thread_cpu_s();
        for (int64_t c = 0; c < calls; c++) attn_forward(q, k, v, o, &opt);
        cyc[r] = (thread_cpu_s() - t0) * g_hz / (double)calls;
    }
    return median(cyc, 15);
}

/* --in-cache: the step's arithmetic without the memory: one key/value head, Hq = group
 * query heads, one thread, calls timed by the thread's CPU time (a wait for a core not
 * counted), at Lk = 64 and 256 (float32 K and V 256 KiB: in L2); cycles a key = the
 * difference of the two calls' cycles / 192 keys, so the call's own set-up drops out;
 * beside the model's (decode_bound.h) and the whole call's cycles a key at 256. Every
 * cache dtype with a decoding step: float32, bfloat16, q8_0 and q4_0 (quantized from the
 * float32 values), and the fp8 ones without scales (finite bytes of a fixed pattern). */
static void in_cache_rows(void) {
    const int64_t Lk = 256, D = 128, calls = 400;
    static const attn_dtype DTS[] = {ATTN_F32, ATTN_BF16, ATTN_Q8_0, ATTN_Q4_0, ATTN_FP8_E4M3, ATTN_FP8_E5M2};
    for (size_t d = 0; d < sizeof DTS / sizeof DTS[0]; d++) {
        const attn_dtype dt = DTS[d];
        const size_t bytes = (size_t)attn_dtype_size(dt) * (size_t)(Lk * D / attn_dtype_block(dt));
        void *k = kv_alloc(bytes), *v = kv_alloc(bytes);
        float *kf = malloc((size_t)(Lk * D) * sizeof(float)), *vf = malloc((size_t)(Lk * D) * sizeof(float));
        float *q = malloc((size_t)(8 * D) * sizeof(float)), *o = malloc((size_t)(8 * D) * sizeof(float));
        if (!k || !v || !kf || !vf || !q || !o) {
            fprintf(stderr, "attn: bench --paged --in-cache: out of memory\n");
            free(k), free(v), free(kf), free(vf), free(q), free(o);
            return;
        }
        for (int64_t x = 0; x < Lk * D; x++) {
            kf[x] = (float)((x * 2654435761u) % 1000) * 2e-3f - 1.0f;
            vf[x] = (float)((x * 40503u + 17) % 1000) * 1e-3f - 0.5f;
        }
        const attn_tensor tkf = attn_tensor_4d(kf, ATTN_F32, 1, 1, Lk, D), tvf = attn_tensor_4d(vf, ATTN_F32, 1, 1, Lk, D);
        const attn_tensor tk = attn_tensor_4d(k, dt, 1, 1, Lk, D), tv = attn_tensor_4d(v, dt, 1, 1, Lk, D);
        const attn_tensor tk64 = attn_tensor_4d(k, dt, 1, 1, 64, D), tv64 = attn_tensor_4d(v, dt, 1, 1, 64, D);
        bool ok = true;
        if (dt == ATTN_F32) {
            memcpy(k, kf, bytes), memcpy(v, vf, bytes);
        } else if (dt == ATTN_BF16) {  // the top half (run_shape's values)
            for (int64_t x = 0; x < Lk * D; x++) {
                uint32_t u, w;
                memcpy(&u, &kf[x], 4), memcpy(&w, &vf[x], 4);
                ((uint16_t *)k)[x] = (uint16_t)(u >> 16), ((uint16_t *)v)[x] = (uint16_t)(w >> 16);
            }
        } else if (dt == ATTN_Q8_0) {
            ok = attn_quantize_q8_0(&tkf, &tk) == ATTN_OK && attn_quantize_q8_0(&tvf, &tv) == ATTN_OK;
        } else if (dt == ATTN_Q4_0) {
            ok = attn_quantize_q4_0(&tkf, &tk) == ATTN_OK && attn_quantize_q4_0(&tvf, &tv) == ATTN_OK;
        } else {  // fp8: bytes below 0x70 with either sign, never a NaN or an infinity
            for (int64_t x = 0; x < Lk * D; x++) {
                ((uint8_t *)k)[x] = (uint8_t)(((x * 37) % 0x70) | (x & 1) << 7);
                ((uint8_t *)v)[x] = (uint8_t)(((x * 53 + 5) % 0x70) | (x & 2) << 6);
            }
        }
        if (!ok)
            fprintf(stderr, "attn: bench --paged --in-cache: %s: the cache could not be written\n", attn_dtype_name(dt));
        for (int64_t g = 4; ok && g <= 8; g += 4) {  // the same cache for both groups
            for (int64_t x = 0; x < g * D; x++) q[x] = (float)((x * 7919) % 200) * 1e-2f - 1.0f;
            const attn_tensor tq = attn_tensor_4d(q, ATTN_F32, 1, g, 1, D), to = attn_tensor_4d(o, ATTN_F32, 1, g, 1, D);
            const double c64 = call_cycles(&tq, &tk64, &tv64, &to, calls), c256 = call_cycles(&tq, &tk, &tv, &to, calls);
            char model[16];
            printf("in cache: %-8s Hq/Hkv %lld  %6.1f cycles a key (model %s; the whole call at Lk 256: "
                   "%6.1f a key)\n", attn_dtype_name(dt), (long long)g, (c256 - c64) / (double)(Lk - 64),
                   dec_fmt(model, sizeof model, 5, 1, dec_s_per_elem(dt, g, D, false, false) * 2.0 * (double)D * g_hz),
                   c256 / (double)Lk);
        }
        free(k), free(v), free(kf), free(vf), free(q), free(o);
    }
}

static const char USAGE[] =
    "usage: attn bench --paged [--quick] [--threads N] [--reps N] [--nhd] [--b1] [--g8] [--thp]\n"
    "                          [--isa NAME] [--plant-error]\n"
    "\n"
    "  Decoding (Lq = 1, Lk = 16384, Hq = 32, Hkv = 8, D = 128, B = 1 and 8) over a paged\n"
    "  cache of page sizes 16, 64, 256 against the contiguous cache, float32 and bfloat16;\n"
    "  medians of interleaved rounds, the read bandwidth timed beside each row.\n"
    "  --nhd: pools [num_pages, page_size, Hkv, D]; --b1: B = 1 only; --thp: the caches\n"
    "  and pools in transparent huge pages (madvise), as a serving pool allocated once may be.\n"
    "  --g8: Hq = 64 (8 query heads a KV head) as well as 32. Each row also prints the\n"
    "  compute bound of the decoding step of the kernel that runs (bench/decode_bound.h; n/a\n"
    "  for a kernel without a model) and the row's %% of min(read, compute).\n"
    "  --isa NAME: run these kernels of the library (ATTN_ISA).\n"
    "  --in-cache: instead, the step's cycles a key with K and V in L2 (one thread, CPU time),\n"
    "  every cache dtype with a decoding step, Hq/Hkv 4 and 8, beside the model's.\n";

int bench_paged(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) return fputs(USAGE, stdout), 0;
    const char *threads_s = NULL, *reps_s = NULL, *isa = NULL;
    bool quick = false, plant = false, nhd = false, b1 = false, g8 = false, in_cache = false;
    g_thp = false;
    const cli_opt opts[] = {{"--quick", NULL, &quick}, {"--plant-error", NULL, &plant},
                            {"--nhd", NULL, &nhd}, {"--b1", NULL, &b1}, {"--thp", NULL, &g_thp},
                            {"--g8", NULL, &g8}, {"--in-cache", NULL, &in_cache},
                            {"--threads", &threads_s, NULL}, {"--reps", &reps_s, NULL},
                            {"--isa", &isa, NULL}};
    int rc = cli_scan(argc, argv, opts, 10, "bench --paged: ", "bench");
    if (rc) return rc;
    if (isa && !attn_kernel_supported(isa))
        return fprintf(stderr, "attn: bench --paged: --isa: '%s' is no kernel this build has and "
                       "this CPU runs (see 'attn --kernels')\n", isa), 2;
    if (isa) setenv("ATTN_ISA", isa, 1);  // read once, at the library's first kernel choice
    const int threads = threads_s ? atoi(threads_s) : 0, reps = reps_s ? atoi(reps_s) : (quick ? 3 : 15);
    if (threads < 0 || threads > 512 || reps < 1 || reps > MAX_REPS)
        return fprintf(stderr, "attn: bench --paged: --threads 0..512, --reps 1..%d\n", MAX_REPS), 2;
    #if defined(__x86_64__)
    const bool avx2 = __builtin_cpu_supports("avx2");
#else
    const bool avx2 = false;
#endif
    printf("paged decoding: Lq=1 Hq=32 Hkv=8 D=128, float32 queries, %s pools, %d threads, "
           "kernel %s, %d rounds%s\n", nhd ? "[pages, page_size, Hkv, D]" : "[pages, Hkv, page_size, D]",
           threads > 0 ? threads : omp_get_max_threads(), attn_kernel_name(), reps,
           g_thp ? ", huge pages asked for" : "");
    char f32[320], bf16[320];
    dec_describe(ATTN_F32, f32, sizeof f32), dec_describe(ATTN_BF16, bf16, sizeof bf16);
    printf("compute bound (bench/decode_bound.h: the step's FMAs and loads at this core's "
           "measured rates): %s; %s\n", f32, bf16);
    if (in_cache) {
        g_hz = dec_clock_hz();
        printf("clock %.2f GHz (a dependent add chain, thread CPU time)\n", g_hz * 1e-9);
        return in_cache_rows(), 0;
    }
    const int64_t Lk = quick ? 4096 : 16384;
    int bad = 0;
    for (int hq = 32; hq <= (g8 ? 64 : 32); hq += 32)
        for (int bi = 0; bi < (quick || b1 ? 1 : 2); bi++)
            for (int d = 0; d < 2; d++)
                bad |= run_shape(bi ? 8 : 1, hq, Lk, d ? ATTN_BF16 : ATTN_F32, reps, threads, nhd, plant, avx2);
    return bad;
}
