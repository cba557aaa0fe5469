/*
 * bench_viz.c — `attn bench --viz`: what `attn viz` costs at long lengths, measured. The
 *               picture of a causal self-attention of L tokens (default 100000, seed 003's
 *               exercise 5 length; --quick 4096), D = 64, one head, float32, in P x P
 *               cells (default 256, attn viz's --pixels): the forward for the LSE, then
 *               attn_weights_grid's one more pass over K, summing each block.
 *
 * Method:
 *   - Q, K, V ~ N(0, 1) (rng.h), O [L, 64], the LSE [L] and the grid [P, P] allocated
 *     (O, the LSE and the grid are first touched by the calls: the compiler may turn
 *     malloc + memset into calloc); the peak resident set is read once Q, K, V are
 *     filled, and the
 *     process's peak after them (VmHWM of /proc/self/status, getrusage's ru_maxrss where
 *     /proc is absent) is checked against --bound-mib (default 200 MiB): the whole
 *     process, inputs included, far below the L x L float32 matrix a materialized
 *     picture would hold (40 GB at 100000 tokens);
 *   - --reps N (default 1: a 100K-token call takes minutes on 2 cores; --quick 3) timed
 *     forward calls and grid calls, each reported as its median (min, max);
 *   - the grid is checked: every row of weights sums to 1, so the cells of grid row r
 *     sum to the number of query rows in block r (relative error <= 1e-4: the float32
 *     LSE, |lse| 2^-24 relative on every weight, and float32 exp), and a cell whose
 *     keys all come after its rows is masked (-inf). --plant-error moves the LSE by
 *     1e-3 first, which the check must catch (each row then sums to e^-0.001).
 * Exit status: 0 when the check passes and the peak is within the bound, 1 otherwise,
 * 2 on a usage error. What it is not: a test with a time limit (none here) or the main
 * sweep (cli_bench.c).
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "attn.h"
#include "cli.h"
#include "cliopt.h"
#include "rng.h"

static const char BV_USAGE[] =
    "usage: attn bench --viz [--quick] [--tokens L] [--pixels P] [--reps N]\n"
    "                        [--bound-mib M] [--threads N] [--plant-error]\n"
    "\n"
    "  The cost of attn viz's picture of a causal self-attention of L tokens (default\n"
    "  100000; --quick 4096), D = 64, one head, float32, in P x P cells (default 256): the\n"
    "  forward call for the LSE and attn_weights_grid's pass over K, each timed (median of\n"
    "  --reps, default 1, --quick 3), the grid checked (every row's weights sum to 1), and\n"
    "  the process's peak resident set (VmHWM) checked against --bound-mib (default 200).\n"
    "  Exit status 1 when the check fails or the peak exceeds the bound.\n";

static double bv_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int bv_cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The process's peak resident set in MiB: VmHWM, or ru_maxrss (KiB on Linux). */
static double bv_peak_mib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0) kib = strtol(line + 6, NULL, 10);
    if (f) fclose(f);
    if (kib < 0) {
        struct rusage ru;
        kib = getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : 0;
    }
    return (double)kib / 1024.0;
}

static int bv_long(const char *name, const char *s, long lo, long hi, long *v) {
    char *end;
    const long x = s ? strtol(s, &end, 10) : 0;
    if (!s) return 0;
    if (!*s || *end || x < lo || x > hi) {
        fprintf(stderr, "attn: bench --viz: %s: expected an integer %ld..%ld, got '%s'\n", name,
                lo, hi, s);
        return 2;
    }
    *v = x;
    return 0;
}

static void bv_times(const double *t, int n, double *med, double *lo, double *hi) {
    double s[64];
    memcpy(s, t, (size_t)n * sizeof *t);
    qsort(s, (size_t)n, sizeof *s, bv_cmp);
    *med = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    *lo = s[0];
    *hi = s[n - 1];
}

int bench_viz(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(BV_USAGE, stdout);
            return 0;
        }
    bool quick = false, plant = false;
    const char *s_tokens = NULL, *s_pixels = NULL, *s_reps = NULL, *s_bound = NULL, *s_threads = NULL;
    const cli_opt opts[] = {
        {"--quick", NULL, &quick},         {"--plant-error", NULL, &plant},
        {"--tokens", &s_tokens, NULL},     {"--pixels", &s_pixels, NULL},
        {"--reps", &s_reps, NULL},         {"--bound-mib", &s_bound, NULL},
        {"--threads", &s_threads, NULL},
    };
    int rc = cli_scan(argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), "bench --viz: ",
                      "bench --viz");
    if (rc) return rc;
    long L = quick ? 4096 : 100000, P = 256, reps = quick ? 3 : 1, bound = 200, threads = 0;
    if ((rc = bv_long("--tokens", s_tokens, 1, 10000000, &L)) ||
        (rc = bv_long("--pixels", s_pixels, 1, 4096, &P)) ||
        (rc = bv_long("--reps", s_reps, 1, 64, &reps)) ||
        (rc = bv_long("--bound-mib", s_bound, 1, 1 << 30, &bound)) ||
        (rc = bv_long("--threads", s_threads, 0, 512, &threads)))
        return rc;
    enum { D = 64 };
    const int64_t R = L < P ? L : P, C = R;
    const double start_mib = bv_peak_mib();
    float *q = malloc((size_t)L * D * sizeof(float)), *k = malloc((size_t)L * D * sizeof(float));
    float *v = malloc((size_t)L * D * sizeof(float)), *o = malloc((size_t)L * D * sizeof(float));
    float *lse = malloc((size_t)L * sizeof(float)), *grid = malloc((size_t)(R * C) * sizeof(float));
    if (!q || !k || !v || !o || !lse || !grid) {
        fprintf(stderr, "attn: bench --viz: out of memory for %ld tokens\n", L);
        free(q), free(k), free(v), free(o), free(lse), free(grid);
        return 1;
    }
    rng_t rng = {0xb1e5f00dull};
    for (int64_t x = 0; x < (int64_t)L * D; x++)
        q[x] = (float)rng_gauss(&rng), k[x] = (float)rng_gauss(&rng), v[x] = (float)rng_gauss(&rng);
    memset(o, 0, (size_t)L * D * sizeof(float));
    memset(lse, 0, (size_t)L * sizeof(float));
    memset(grid, 0, (size_t)(R * C) * sizeof(float));
    const double inputs_mib = bv_peak_mib();

    const attn_tensor tq = attn_tensor_4d(q, ATTN_F32, 1, 1, L, D);
    const attn_tensor tk = attn_tensor_4d(k, ATTN_F32, 1, 1, L, D);
    const attn_tensor tv = attn_tensor_4d(v, ATTN_F32, 1, 1, L, D);
    const attn_tensor to = attn_tensor_4d(o, ATTN_F32, 1, 1, L, D);
    const attn_tensor tl = attn_tensor_4d(lse, ATTN_F32, 1, 1, L, 1);
    const attn_tensor tg = attn_tensor_4d(grid, ATTN_F32, 1, 1, R, C);
    attn_options fo = {.causal = true, .lse = &tl, .threads = (int32_t)threads};
    attn_options go = {.causal = true, .threads = (int32_t)threads};
    double t_fwd[64], t_grid[64];
    attn_status st = ATTN_OK;
    for (int r = 0; r < reps && st == ATTN_OK; r++) {
        double t0 = bv_now();
        st = attn_forward(&tq, &tk, &tv, &to, &fo);
        t_fwd[r] = bv_now() - t0;
        if (st != ATTN_OK) break;
        if (plant)
            for (int64_t i = 0; i < L; i++) lse[i] += 1e-3f;
        t0 = bv_now();
        st = attn_weights_grid(&tq, &tk, &tl, &tg, ATTN_REDUCE_SUM, &go);
        t_grid[r] = bv_now() - t0;
    }
    if (st != ATTN_OK) {
        fprintf(stderr, "attn: bench --viz: %s: %s\n", attn_status_string(st), attn_last_error());
        free(q), free(k), free(v), free(o), free(lse), free(grid);
        return 1;
    }
    const double peak_mib = bv_peak_mib();

    /* the check: grid row r sums to its number of rows; cells past the diagonal masked */
    double worst = 0;
    int64_t wrong_mask = 0;
    for (int64_t r = 0; r < R; r++) {
        const int64_t ia = (r * L + R - 1) / R, ib = ((r + 1) * L + R - 1) / R;
        double sum = 0;
        for (int64_t c = 0; c < C; c++) {
            const float x = grid[r * C + c];
            const int64_t ja = (c * L + C - 1) / C;  // the block's first key
            if ((ja > ib - 1) != (x == -INFINITY)) wrong_mask++;
            if (x != -INFINITY) sum += x;
        }
        const double rel = fabs(sum - (double)(ib - ia)) / (double)(ib - ia);
        if (!(rel <= worst)) worst = rel;  // NaN sticks
    }
    const bool check_ok = worst <= 1e-4 && wrong_mask == 0;
    const bool bound_ok = peak_mib <= (double)bound;

    double fm, fl, fh, gm, gl, gh;
    bv_times(t_fwd, (int)reps, &fm, &fl, &fh);
    bv_times(t_grid, (int)reps, &gm, &gl, &gh);
    const double dense_gb = (double)L * (double)L * 4.0 * 1e-9;
    printf("attn bench --viz: causal self-attention, L = %ld tokens, D = %d, one head, float32,\n"
           "  a %lld x %lld picture (blocks of %lld x %lld, summed); kernel %s, %s threads\n",
           L, D, (long long)R, (long long)C, (long long)((L + R - 1) / R),
           (long long)((L + C - 1) / C), attn_kernel_name(), threads ? s_threads : "default");
    printf("  forward (for the LSE)     median %9.3f s  (min %.3f, max %.3f, %ld run%s)\n", fm,
           fl, fh, reps, reps > 1 ? "s" : "");
    printf("  attn_weights_grid (sum)   median %9.3f s  (min %.3f, max %.3f)\n", gm, gl, gh);
    printf("  picture total             median %9.3f s\n", fm + gm);
    printf("  peak resident set %.1f MiB (%.1f MiB at the start, %.1f MiB once Q, K, V were "
           "filled; Q, K, V, O, LSE and the grid: %.1f MiB)\n", peak_mib, start_mib, inputs_mib,
           ((double)L * D * 4 * 4 + (double)L * 4 + (double)(R * C) * 4) / 1048576.0);
    printf("  bound: peak <= %ld MiB: %s   (the materialized L x L float32 weights: %.3g GB)\n",
           bound, bound_ok ? "within" : "EXCEEDED", dense_gb);
    printf("  check: grid rows sum to their rows' count, max relative error %.3g (limit 1e-4); "
           "%lld cells masked wrongly: %s\n", worst, (long long)wrong_mask,
           check_ok ? "ok" : "check FAILED");
    free(q), free(k), free(v), free(o), free(lse), free(grid);
    return check_ok && bound_ok ? 0 : 1;
}
