/*
 * bench_headdim.c — `attn bench --head-dims [--png FILE] [--tokens L]`: the fused
 *                   forward's speed against the head dimension, 8 to 256 with the sizes
 *                   that are not multiples of 16 among them, as a table and a line plot
 *                   (seed 003 §8's "head_dim a multiple of 16", answered for this CPU).
 *
 * Each size: B = 1, H = 4, L tokens (default 2048), causal, float32, random normal data;
 * one warm-up call, then the median of 5, GFLOP/s = 2 · 2 · H · D · L² / 2 / t (Q·Kᵀ and
 * P·V, half the pairs under the causal mask). What it is not: the main benchmark
 * (cli_bench.c, its sweep, its checks against PyTorch) — a quick picture, timings only.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attn.h"
#include "cli.h"
#include "png_plot.h"
#include "rng.h"

static double hd_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int bench_head_dims(int argc, char **argv) {
    const char *png = NULL;
    long L = 2048;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--png") == 0 && i + 1 < argc) png = argv[++i];
        else if (strcmp(argv[i], "--tokens") == 0 && i + 1 < argc) {
            char *end;
            L = strtol(argv[++i], &end, 10);
            if (*end || L < 1 || L > 1000000) {
                fprintf(stderr, "attn: bench --head-dims: --tokens: expected 1..1000000, got '%s'\n", argv[i]);
                return 2;
            }
        } else {
            fprintf(stderr, "attn: bench --head-dims: unknown option '%s' (takes --png FILE, --tokens L)\n",
                    argv[i]);
            return 2;
        }
    }
    static const int dims[] = {8, 12, 16, 24, 32, 40, 48, 56, 64, 72, 80, 96, 100, 112, 128,
                               144, 160, 192, 200, 224, 256};
    enum { ND = sizeof dims / sizeof dims[0], H = 4 };
    double x[ND], y[ND], x16[ND], y16[ND];
    int n16 = 0;
    printf("fused forward, B = 1, H = %d, L = %ld, causal, float32, kernel %s (median of 5)\n"
           "%8s %10s %10s\n", H, L, attn_kernel_name(), "head dim", "ms", "GFLOP/s");
    for (int c = 0; c < ND; c++) {
        const int64_t D = dims[c], n = (int64_t)H * L * D;
        float *buf = malloc(sizeof(float) * (size_t)(4 * n));
        if (!buf) {
            fprintf(stderr, "attn: bench --head-dims: out of memory\n");
            return 1;
        }
        rng_t g = {0x5eed16 + (uint64_t)D};
        for (int64_t e = 0; e < 3 * n; e++) buf[e] = (float)rng_sym(&g);  // U(-1, 1)
        attn_tensor t[4];
        for (int m = 0; m < 4; m++) t[m] = attn_tensor_4d(buf + m * n, ATTN_F32, 1, H, L, D);
        attn_options opt = {.causal = true};
        double ms[5];
        attn_status st = attn_forward(&t[0], &t[1], &t[2], &t[3], &opt);
        for (int r = 0; r < 5 && st == ATTN_OK; r++) {
            const double t0 = hd_now();
            st = attn_forward(&t[0], &t[1], &t[2], &t[3], &opt);
            ms[r] = 1e3 * (hd_now() - t0);
        }
        free(buf);
        if (st != ATTN_OK) {
            fprintf(stderr, "attn: bench --head-dims: %s: %s\n", attn_status_string(st), attn_last_error());
            return 1;
        }
        for (int a = 1; a < 5; a++)
            for (int b = a; b > 0 && ms[b] < ms[b - 1]; b--) {
                const double tmp = ms[b];
                ms[b] = ms[b - 1], ms[b - 1] = tmp;
            }
        x[c] = (double)D;
        y[c] = 2.0 * H * (double)D * (double)L * (double)L / (ms[2] * 1e-3) / 1e9;
        if (D % 16 == 0) x16[n16] = x[c], y16[n16++] = y[c];
        printf("%8lld %10.2f %10.1f%s\n", (long long)D, ms[2], y[c], D % 16 ? "   (not a multiple of 16)" : "");
    }
    if (!png) return 0;
    double ymax = 0;
    for (int c = 0; c < ND; c++) ymax = y[c] > ymax ? y[c] : ymax;
    const plot_series series[2] = {
        {"every head dim", x, y, ND, 0x1F5FBF, 0},
        {"multiples of 16", x16, y16, n16, 0xE0601A, 1},
    };
    char title[160], err[256];
    snprintf(title, sizeof title, "fused forward vs head dim (L = %ld, H = %d, causal, %s)", L, H,
             attn_kernel_name());
    const plot_spec spec = {title, "head dim", "GFLOP/s", 264, ymax * 1.15, series, 2};
    if (plot_png(png, &spec, err, sizeof err)) {
        fprintf(stderr, "attn: bench --head-dims: %s\n", err);
        return 1;
    }
    printf("plot: %s\n", png);
    return 0;
}
