/*
 * ring_bench.c — times ring attention over MPI (libattn_mpi) and how much of its
 *                communication the computation hides; a separate program, run under
 *                mpirun (docs/RING.md has the commands and the figures).
 *
 *   mpirun -n P build/ring_bench [--L 32768] [--heads 2] [--kv-heads 2] [--D 64]
 *          [--causal] [--backward] [--threads 1] [--reps 3]
 *
 * Each process fills its own slice with random numbers (nothing global is formed), runs
 * one untimed call and then --reps timed ones, and reports per process the medians of
 * the call's time, its compute, its waits for messages after a step's compute was done
 * (the communication not hidden, and any imbalance), the bytes it sent, and the time one
 * block's transfer to the next process takes alone (a plain MPI_Sendrecv). With one process it also times
 * one plain attn_forward (or attn_backward) call on the whole sequence: the ring's
 * baseline. What it is not: a test (tests/mpi/test_ring.c checks the answers).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_mpi.h"

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *x, int n) {
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static float *randbuf(int64_t n, uint64_t seed) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        p[i] = (float)((seed >> 40) * 0x1p-24) - 0.5f;
    }
    return p;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int64_t L = 32768, H = 2, Hkv = 2, D = 64;
    int threads = 1, reps = 3;
    bool causal = false, backward = false;
    for (int a = 1; a < argc; a++) {
        const char *x = argv[a], *val = a + 1 < argc ? argv[a + 1] : "0";
        if (!strcmp(x, "--L")) L = atoll(val), a++;
        else if (!strcmp(x, "--heads")) H = atoll(val), a++;
        else if (!strcmp(x, "--kv-heads")) Hkv = atoll(val), a++;
        else if (!strcmp(x, "--D")) D = atoll(val), a++;
        else if (!strcmp(x, "--threads")) threads = atoi(val), a++;
        else if (!strcmp(x, "--reps")) reps = atoi(val), a++;
        else if (!strcmp(x, "--causal")) causal = true;
        else if (!strcmp(x, "--backward")) backward = true;
        else {
            if (rank == 0) fprintf(stderr, "ring_bench: unknown option %s\n", x);
            MPI_Finalize();
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    int64_t f[2], n[2];
    attn_ring_slice(L, size, rank, causal, f, n);
    const int64_t l = n[0] + n[1];
    float *q = randbuf(H * l * D, 1 + rank), *k = randbuf(Hkv * l * D, 100 + rank);
    float *v = randbuf(Hkv * l * D, 200 + rank), *o = randbuf(H * l * D, 300 + rank);
    float *lse = randbuf(H * l, 400), *dq = malloc((size_t)(H * l * D + 1) * 4);
    float *dk = malloc((size_t)(Hkv * l * D + 1) * 4), *dv = malloc((size_t)(Hkv * l * D + 1) * 4);
    attn_tensor tq = attn_tensor_4d(q, ATTN_F32, 1, H, l, D), tk = attn_tensor_4d(k, ATTN_F32, 1, Hkv, l, D);
    attn_tensor tv = attn_tensor_4d(v, ATTN_F32, 1, Hkv, l, D), to = attn_tensor_4d(o, ATTN_F32, 1, H, l, D);
    attn_tensor tl = attn_tensor_4d(lse, ATTN_F32, 1, H, l, 1), tdq = attn_tensor_4d(dq, ATTN_F32, 1, H, l, D);
    attn_tensor tdk = attn_tensor_4d(dk, ATTN_F32, 1, Hkv, l, D), tdv = attn_tensor_4d(dv, ATTN_F32, 1, Hkv, l, D);
    attn_options opt = {.causal = causal, .threads = threads};
    attn_options fopt = opt;
    fopt.lse = &tl;
    /* the forward once for a real O and LSE (the backward's inputs) */
    attn_ring_forward(&tq, &tk, &tv, &to, &fopt, MPI_COMM_WORLD, NULL);

    double *tot = calloc((size_t)reps, sizeof(double)), *comp = calloc((size_t)reps, sizeof(double));
    double *wait = calloc((size_t)reps, sizeof(double)), *maxw = calloc((size_t)reps, sizeof(double));
    int64_t bytes = 0;
    attn_status st = ATTN_OK;
    for (int r = -1; r < reps; r++) {  // r = -1: untimed
        attn_ring_stats s;
        MPI_Barrier(MPI_COMM_WORLD);
        st = backward ? attn_ring_backward(&tq, &tk, &tv, &to, &to, &tl, &tdq, &tdk, &tdv, &opt,
                                           MPI_COMM_WORLD, &s)
                      : attn_ring_forward(&tq, &tk, &tv, &to, &fopt, MPI_COMM_WORLD, &s);
        if (st != ATTN_OK) break;
        if (r < 0) continue;
        tot[r] = s.total_s, comp[r] = s.compute_s, wait[r] = s.wait_s, maxw[r] = s.max_wait_s;
        bytes = s.bytes_sent;
    }
    if (st != ATTN_OK) {
        if (rank == 0) fprintf(stderr, "ring_bench: %s (%s)\n", attn_status_string(st), attn_ring_last_error());
        MPI_Finalize();
        return 1;
    }
    /* the transfer alone: one K/V block (this process's size) to the next process and one
     * from the previous, with no computation beside it, per step */
    double xfer = 0;
    if (size > 1) {
        const size_t blk = (size_t)(2 * Hkv * l * D) * sizeof(float);
        char *sb = calloc(blk + 1, 1), *rb = calloc(blk + 64 + (size_t)(2 * Hkv * 2 * D) * 4, 1);
        double *t = calloc((size_t)reps, sizeof(double));
        for (int r = -1; r < reps; r++) {
            MPI_Barrier(MPI_COMM_WORLD);
            const double t0 = MPI_Wtime();
            MPI_Sendrecv(sb, (int)blk, MPI_BYTE, (rank + size - 1) % size, 9, rb,
                         (int)blk + 64 + (int)(2 * Hkv * 2 * D) * 4, MPI_BYTE, (rank + 1) % size, 9,
                         MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (r >= 0) t[r] = MPI_Wtime() - t0;
        }
        xfer = median(t, reps);
        free(sb); free(rb); free(t);
    }
    double mine[5] = {median(tot, reps), median(comp, reps), median(wait, reps), median(maxw, reps), xfer};
    double *all = rank == 0 ? malloc(sizeof mine * (size_t)size) : NULL;
    int64_t *all_bytes = rank == 0 ? malloc(sizeof(int64_t) * (size_t)size) : NULL;
    MPI_Gather(mine, 5, MPI_DOUBLE, all, 5, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    MPI_Gather(&bytes, 1, MPI_INT64_T, all_bytes, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        const double flops = (backward ? 10.0 : 4.0) * (double)L * (double)L * (double)D * (double)H *
                             (causal ? 0.5 : 1.0);
        printf("ring %s L=%lld H=%lld/%lld D=%lld %s P=%d threads=%d reps=%d\n",
               backward ? "backward" : "forward", (long long)L, (long long)H, (long long)Hkv,
               (long long)D, causal ? "causal" : "full", size, threads, reps);
        printf("%-6s %10s %10s %10s %8s %12s %10s %12s\n", "proc", "total_ms", "compute_ms", "wait_ms",
               "wait_%", "max_step_ms", "sent_MB", "xfer_step_ms");
        double worst = 0;
        for (int p = 0; p < size; p++) {
            const double *x = all + 5 * p;
            printf("%-6d %10.1f %10.1f %10.2f %7.2f%% %12.2f %10.2f %12.3f\n", p, 1e3 * x[0], 1e3 * x[1],
                   1e3 * x[2], 100.0 * x[2] / x[0], 1e3 * x[3], all_bytes[p] / 1e6, 1e3 * x[4]);
            if (x[0] > worst) worst = x[0];
        }
        printf("slowest process: %.1f ms, %.1f GFLOP/s (%s formula: %g L^2 D H%s)\n", 1e3 * worst,
               flops / worst / 1e9, backward ? "backward" : "forward", backward ? 10.0 : 4.0,
               causal ? " / 2" : "");
    }
    if (size == 1) {  // the baseline: one plain call on the whole sequence
        double *t = calloc((size_t)reps, sizeof(double));
        for (int r = -1; r < reps; r++) {
            const double t0 = MPI_Wtime();
            if (backward)
                attn_backward(&tq, &tk, &tv, &to, &to, &tl, &tdq, &tdk, &tdv, &opt);
            else
                attn_forward(&tq, &tk, &tv, &to, &fopt);
            if (r >= 0) t[r] = MPI_Wtime() - t0;
        }
        printf("one plain attn_%s call: %.1f ms\n", backward ? "backward" : "forward", 1e3 * median(t, reps));
        free(t);
    }
    free(q); free(k); free(v); free(o); free(lse); free(dq); free(dk); free(dv);
    free(tot); free(comp); free(wait); free(maxw); free(all); free(all_bytes);
    MPI_Finalize();
    return 0;
}
