/*
 * decode_ab.c — two or more builds of the AVX2 decoding step (src/kernels/avx2/decode.c of
 *               different commits) side by side in one process, round by round, on the
 *               step alone: every head of a contiguous cache [Hkv, L, D] in tiles, the
 *               query heads of a group 4 rows a call, the next tile's K passed as the
 *               framework does. This VM's speed drifts by 30% between runs; alternating
 *               the builds within each round and taking the median of each round's ratio
 *               is what lets a 5% change show (docs/KERNELS.md, "The decoding step's P·V
 *               loop"). Not built by make: scripts/decode_ab.sh builds and runs it.
 *
 *   decode_ab DTYPE BK ROUNDS G L HKV REPS  (DTYPE 0 float32, 1 bfloat16; threads: $NT, 2)
 *
 * Prints, for each build v1.. against v0, the median (and quartiles) of the per-round
 * speed ratio, then each build's median time and GB/s of K and V read, and a plain read
 * of the same buffers ("read", the bench's loop) beside them. L 16384, HKV 8 (134 MB of
 * float32) streams from memory; L 256, HKV 1, REPS 200, NT=1 keeps the cache in L2.
 * PAGE=ps (ps < BK, dividing BK): the cache in pools [L / ps, HKV, ps, D] with the pages in
 * a shuffled order, each tile across pages by decode_rows on its rows' addresses, the
 * next tile's K addresses handed on and the first 4 lines of each of its page runs, K
 * and V, asked for first, as the framework does (src/forward/fused.c, block_sweep and
 * prefetch_runs); the read is then of the pools in order.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/kernels.h"

#ifndef NV
#define NV 2
#endif
typedef void decode_fn(int64_t n, int64_t nk, int64_t dk, int64_t dv, const float *q,
                       attn_dtype dt, bool round_p, const void *k, int64_t ldk, const void *v,
                       int64_t ldv, float scale, float *s, float *m, float *l, float *alpha,
                       float *acc, bool prefetch, const void *next_k, int64_t next_nk);
/* dec_v0 .. dec_v{NV-1}: decode.c of each build, ai_decode_avx2 renamed (decode_ab.sh);
 * weak, so that those past NV are absent (NULL) */
#define DECL(i) decode_fn dec_v##i __attribute__((weak));
DECL(0) DECL(1) DECL(2) DECL(3) DECL(4) DECL(5)
static decode_fn *const BUILDS[6] = {dec_v0, dec_v1, dec_v2, dec_v3, dec_v4, dec_v5};
typedef void rows_fn(int64_t n, int64_t nk, int64_t dk, int64_t dv, const float *q,
                     attn_dtype dt, bool round_p, const char *const *kr, const char *const *vr,
                     float scale, float *s, float *m, float *l, float *alpha, float *acc,
                     bool prefetch, const char *const *next_kr, int64_t next_nk);
#define DECLR(i) rows_fn drw_v##i __attribute__((weak));
DECLR(0) DECLR(1) DECLR(2) DECLR(3) DECLR(4) DECLR(5)
static rows_fn *const ROWS[6] = {drw_v0, drw_v1, drw_v2, drw_v3, drw_v4, drw_v5};

enum { D = 128, MAX_ROUNDS = 64 };

/* The rows j0 .. j0+n-1 of head h of pooled pages (page p of the sequence at pool page
 * perm[p]; pools [L / ps, H, ps, D] of es-byte elements) into rows[]. */
static void page_rows(const char *pool, const int64_t *perm, int64_t ps, int64_t H, int64_t h,
                      int64_t es, int64_t j0, int64_t n, const char **rows) {
    for (int64_t c = 0; c < n; c++) {
        const int64_t j = j0 + c;
        rows[c] = pool + ((perm[j / ps] * H + h) * ps + j % ps) * D * es;
    }
}

/* the first 4 lines of each page run (ps rows from a multiple of ps; the tile's first
 * keys j0 % ps == 0 here) of K and V rows kr, vr: the framework's prefetch_runs */
static void prefetch_runs(const char *const *kr, const char *const *vr, int64_t n, int64_t ps) {
    for (int64_t c = 0; c < n; c += ps)
        for (int x = 0; x < 4; x++) {
            _mm_prefetch(kr[c] + 64 * x, _MM_HINT_T2);
            _mm_prefetch(vr[c] + 64 * x, _MM_HINT_T2);
        }
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* the sum of p[0..n) (n a multiple of 32, p 32-byte aligned): one add of four lines' sums
 * a step, its chain far from the memory's rate */
__attribute__((target("avx2"))) static float read_all(const float *p, int64_t n) {
    __m256 a = _mm256_setzero_ps();
    for (const float *e = p + n; p + 32 <= e; p += 32)
        a = _mm256_add_ps(a, _mm256_add_ps(_mm256_add_ps(_mm256_load_ps(p), _mm256_load_ps(p + 8)),
                                           _mm256_add_ps(_mm256_load_ps(p + 16), _mm256_load_ps(p + 24))));
    float x[8];
    _mm256_storeu_ps(x, a);
    return x[0] + x[7];
}

static void sort(double *x, int n) {
    for (int a = 0; a < n; a++)
        for (int b = a + 1; b < n; b++)
            if (x[b] < x[a]) {
                const double y = x[a];
                x[a] = x[b], x[b] = y;
            }
}

int main(int argc, char **argv) {
    const int bf16 = argc > 1 ? atoi(argv[1]) : 0;
    const int64_t bk = argc > 2 ? atoll(argv[2]) : (bf16 ? 128 : 64);
    int rounds = argc > 3 ? atoi(argv[3]) : 9;
    const int g = argc > 4 ? atoi(argv[4]) : 4;
    const int64_t L = argc > 5 ? atoll(argv[5]) : 16384, H = argc > 6 ? atoll(argv[6]) : 8;
    const int64_t reps = argc > 7 ? atoll(argv[7]) : 1;
    const int nt = getenv("NT") ? atoi(getenv("NT")) : 2;
    const int64_t ps = getenv("PAGE") ? atoll(getenv("PAGE")) : 0;
    if (rounds > MAX_ROUNDS) rounds = MAX_ROUNDS;
    if (bk < 1 || bk > ATTN_BK_LIMIT || g < 1 || g > 16 || L < bk || L % bk || H < 1 || reps < 1 ||
        ps < 0 || (ps > 0 && (ps >= bk || bk % ps))) {
        fprintf(stderr, "decode_ab: 1 <= BK <= %d dividing L, 1 <= G <= 16, HKV, REPS >= 1, "
                        "PAGE < BK dividing BK\n", ATTN_BK_LIMIT);
        return 2;
    }
    const attn_dtype dt = bf16 ? ATTN_BF16 : ATTN_F32;
    const int64_t es = bf16 ? 2 : 4;
    const size_t bytes = (size_t)(H * L * D * es);
    char *k = aligned_alloc(4096, bytes), *v = aligned_alloc(4096, bytes);
    float *q = malloc((size_t)(H * 16 * D) * sizeof(float));
    if (!k || !v || !q) return fprintf(stderr, "decode_ab: out of memory\n"), 1;
    for (size_t i = 0; i < bytes / 2; i++) {  // values in [0, 0.1): finite in either dtype
        ((uint16_t *)k)[i] = bf16 ? (uint16_t)(0x3C00 + i % 97) : (uint16_t)(i % 2 ? 0x3C00 : 0);
        ((uint16_t *)v)[i] = bf16 ? (uint16_t)(0x3C00 + i % 89) : (uint16_t)(i % 2 ? 0x3C80 : 0);
    }
    for (int64_t i = 0; i < H * 16 * D; i++) q[i] = sinf(0.1f * (float)i);
    int64_t *perm = ps ? malloc((size_t)(L / ps) * sizeof *perm) : NULL;
    if (ps && !perm) return fprintf(stderr, "decode_ab: out of memory\n"), 1;
    for (int64_t p = 0; ps && p < L / ps; p++) perm[p] = p;
    for (int64_t p = ps ? L / ps - 1 : 0, x = 0x2545F491; p > 0; p--) {  // a fixed shuffle
        x = x * 6364136223846793005 + 1442695040888963407;
        const int64_t o = (int64_t)((uint64_t)x >> 33) % (p + 1), y = perm[p];
        perm[p] = perm[o], perm[o] = y;
    }
    double t[NV + 1][MAX_ROUNDS];
    float sink = 0;
    for (int r = 0; r < rounds; r++)
        for (int b = 0; b <= NV; b++) {
            const double t0 = now();
            if (b == NV) {  // the plain read, the same buffers, the same threads
#pragma omp parallel for num_threads(nt) reduction(+ : sink) schedule(static)
                for (int64_t x = 0; x < reps * nt; x++) {
                    const int64_t part = (int64_t)bytes / 4 / nt, at = x % nt * part;
                    sink += read_all((const float *)k + at, part) + read_all((const float *)v + at, part);
                }
            } else {
#pragma omp parallel for num_threads(nt) reduction(+ : sink) schedule(static)
                for (int64_t x = 0; x < H * reps; x++) {
                    const int64_t h = x % H;
                    float s[4 * (ATTN_BK_LIMIT + 4)], m[16], l[16], al[16], acc[16 * D];
                    for (int i = 0; i < 16; i++) m[i] = -INFINITY, l[i] = 0.0f;
                    memset(acc, 0, sizeof acc);
                    if (ps) {  // tiles across pages, as block_sweep hands them on
                        const char *kr2[2][ATTN_BK_LIMIT], *vr[ATTN_BK_LIMIT];
                        page_rows(k, perm, ps, H, h, es, 0, bk, kr2[0]);
                        for (int64_t j = 0, t = 0; j < L; j += bk, t ^= 1) {
                            const int64_t nn = j + bk < L ? bk : 0;
                            page_rows(v, perm, ps, H, h, es, j, bk, vr);
                            if (nn) {
                                const char *nv[ATTN_BK_LIMIT];
                                page_rows(k, perm, ps, H, h, es, j + bk, nn, kr2[t ^ 1]);
                                page_rows(v, perm, ps, H, h, es, j + bk, nn, nv);
                                prefetch_runs(kr2[t ^ 1], nv, nn, ps);
                            }
                            for (int r0 = 0; r0 < g; r0 += 4)
                                ROWS[b](g - r0 < 4 ? g - r0 : 4, bk, D, D, q + (h * 16 + r0) * D, dt,
                                        false, kr2[t], vr, 0.088f, s, m + r0, l + r0, al + r0,
                                        acc + r0 * D, r0 == 0, kr2[t ^ 1], nn);
                        }
                        sink += acc[5];
                        continue;
                    }
                    const char *kh = k + h * L * D * es, *vh = v + h * L * D * es;
                    for (int64_t j = 0; j < L; j += bk)
                        for (int r0 = 0; r0 < g; r0 += 4)
                            BUILDS[b](g - r0 < 4 ? g - r0 : 4, bk, D, D, q + (h * 16 + r0) * D, dt,
                                      false, kh + j * D * es, D, vh + j * D * es, D, 0.088f, s,
                                      m + r0, l + r0, al + r0, acc + r0 * D, r0 == 0,
                                      kh + (j + bk) * D * es, j + bk < L ? bk : 0);
                    sink += acc[5];
                }
            }
            t[b][r] = now() - t0;
        }
    for (int b = 1; b <= NV; b++) {
        double ratio[MAX_ROUNDS];
        for (int r = 0; r < rounds; r++) ratio[r] = t[0][r] / t[b][r];
        sort(ratio, rounds);
        printf("%s%d speed / v0: median %.3f [%.3f .. %.3f]\n", b == NV ? "read " : "v", b,
               ratio[rounds / 2], ratio[rounds / 4], ratio[3 * rounds / 4]);
    }
    for (int b = 0; b <= NV; b++) {
        sort(t[b], rounds);
        printf("%s%d: median %8.3f ms %6.1f GB/s\n", b == NV ? "read " : "v", b, t[b][rounds / 2] * 1e3,
               2.0 * (double)reps * (double)bytes / t[b][rounds / 2] * 1e-9);
    }
    printf("(%g)\n", (double)sink);
    free(k), free(v), free(q);
    return 0;
}
