/*
 * scattered_read.c — what the memory system moves reading runs of RUN bytes scattered
 *                    through a 128 MiB pool, against the same pool in order: the bound a
 *                    paged KV cache's page size puts on any decoding step (a page of 16
 *                    float32 keys at D = 128 is a run of 8 KiB of K, and one of V), and
 *                    whether a software prefetch lifts it (docs/KERNELS.md, "Paged
 *                    decoding"). Not built by make:
 *
 *   cc -O2 -fopenmp scripts/scattered_read.c -o /tmp/scattered_read
 *   /tmp/scattered_read 8192      # RUN bytes, a power of two from 256 to 1 MiB
 *
 * Two threads, each half of the runs in its order, AVX2 loads (the bench's read loop);
 * medians of 9 rounds, each round every way in turn. Ways: the pool in order; the runs
 * shuffled, read as they are; the same with the first 4 lines of the next run asked for
 * as a run starts; with the whole next run asked for as a run starts; with the line
 * `dist` lines ahead in the shuffled order asked for beside each pair of lines read.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { ROUNDS = 9, LINE = 64 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* the sum of runs run[0..n) of `bytes` each; ahead: 0 none, -1 the next run's first 4
 * lines, -2 the whole next run, > 0 the line that many lines ahead */
__attribute__((target("avx2"))) static float read_runs(char *const *run, int64_t n,
                                                       int64_t bytes, int64_t ahead) {
    const int64_t lines = bytes / LINE;
    __m256 a = _mm256_setzero_ps();
    for (int64_t p = 0; p < n; p++) {
        const int64_t first = ahead == -1 ? 4 : ahead == -2 ? lines : 0;
        for (int64_t x = 0; p + 1 < n && x < first && x < lines; x++)
            _mm_prefetch(run[p + 1] + LINE * x, _MM_HINT_T0);
        for (int64_t l = 0; l < lines; l += 2) {
            const int64_t at = p * lines + l + ahead;  // the line `ahead` ahead, in order
            if (ahead > 0 && at / lines < n) {
                _mm_prefetch(run[at / lines] + LINE * (at % lines), _MM_HINT_T0);
                _mm_prefetch(run[at / lines] + LINE * (at % lines) + LINE, _MM_HINT_T0);
            }
            const float *f = (const float *)(run[p] + LINE * l);
            a = _mm256_add_ps(a, _mm256_add_ps(_mm256_add_ps(_mm256_load_ps(f), _mm256_load_ps(f + 8)),
                                               _mm256_add_ps(_mm256_load_ps(f + 16), _mm256_load_ps(f + 24))));
        }
    }
    float x[8];
    _mm256_storeu_ps(x, a);
    return x[0] + x[7];
}

int main(int argc, char **argv) {
    const int64_t bytes = argc > 1 ? atoll(argv[1]) : 8192, total = (int64_t)128 << 20;
    if (bytes < 256 || bytes > (1 << 20) || (bytes & (bytes - 1))) {
        fprintf(stderr, "scattered_read: RUN a power of two from 256 to 1048576\n");
        return 2;
    }
    const int64_t n = total / bytes;
    char *pool = aligned_alloc(4096, (size_t)total);
    char **order = malloc((size_t)n * sizeof *order), **shuf = malloc((size_t)n * sizeof *shuf);
    if (!pool || !order || !shuf) return fprintf(stderr, "scattered_read: out of memory\n"), 1;
    for (int64_t i = 0; i < total; i += 4) *(float *)(pool + i) = 1.0f;
    for (int64_t i = 0; i < n; i++) order[i] = shuf[i] = pool + i * bytes;
    uint64_t r = 88172645463325252ull;  // a fixed shuffle (xorshift)
    for (int64_t i = n - 1; i > 0; i--) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        const int64_t o = (int64_t)(r % (uint64_t)(i + 1));
        char *t = shuf[i];
        shuf[i] = shuf[o], shuf[o] = t;
    }
    static const struct way { const char *name; int shuffled; int64_t ahead; } WAYS[] = {
        {"in order", 0, 0},           {"shuffled", 1, 0},         {"+ next run's 4 lines", 1, -1},
        {"+ whole next run", 1, -2},  {"+ 16 lines ahead", 1, 16}, {"+ 64 lines ahead", 1, 64},
        {"+ 256 lines ahead", 1, 256},
    };
    enum { NW = sizeof WAYS / sizeof WAYS[0] };
    double t[NW][ROUNDS];
    float sink = 0;
    for (int round = 0; round < ROUNDS; round++)
        for (int w = 0; w < NW; w++) {
            char *const *runs = WAYS[w].shuffled ? shuf : order;
            const double t0 = now();
#pragma omp parallel num_threads(2) reduction(+ : sink)
            {
                const int64_t half = n / 2, me = omp_get_thread_num();
                sink += read_runs(runs + me * half, half, bytes, WAYS[w].ahead);
            }
            t[w][round] = now() - t0;
        }
    for (int w = 0; w < NW; w++) {
        for (int a = 0; a < ROUNDS; a++)
            for (int b = a + 1; b < ROUNDS; b++)
                if (t[w][b] < t[w][a]) {
                    const double y = t[w][a];
                    t[w][a] = t[w][b], t[w][b] = y;
                }
        printf("runs of %7lld bytes  %-22s %6.1f GB/s\n", (long long)bytes, WAYS[w].name,
               (double)total / t[w][ROUNDS / 2] * 1e-9);
    }
    printf("(%g)\n", (double)sink);
    free(pool), free(order), free(shuf);
    return 0;
}
