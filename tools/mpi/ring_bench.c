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

/* The benchmark's shape and options, this process's slice and its tensors. */
typedef struct bench {
    int rank, size;
    int64_t L, H, Hkv, D;
    int threads, reps;
    bool causal, backward;
    int64_t l;  // this process's rows
    float *q, *k, *v, *o, *lse, *dq, *dk, *dv;
    attn_tensor tq, tk, tv, to, tl, tdq, tdk, tdv;
    attn_options opt, fopt;  // fopt: the forward's, with the LSE
} bench;

/* The options into b; 0, or 2 after a line on stderr for an unknown one. */
static int parse_options(int argc, char **argv, bench *b) {
    b->L = 32768, b->H = 2, b->Hkv = 2, b->D = 64;
    b->threads = 1, b->reps = 3;
    b->causal = false, b->backward = false;
    for (int a = 1; a < argc; a++) {
        const char *x = argv[a], *val = a + 1 < argc ? argv[a + 1] : "0";
        if (!strcmp(x, "--L")) b->L = atoll(val), a++;
        else if (!strcmp(x, "--heads")) b->H = atoll(val), a++;
        else if (!strcmp(x, "--kv-heads")) b->Hkv = atoll(val), a++;
        else if (!strcmp(x, "--D")) b->D = atoll(val), a++;
        else if (!strcmp(x, "--threads")) b->threads = atoi(val), a++;
        else if (!strcmp(x, "--reps")) b->reps = atoi(val), a++;
        else if (!strcmp(x, "--causal")) b->causal = true;
        else if (!strcmp(x, "--backward")) b->backward = true;
        else {
            if (b->rank == 0) fprintf(stderr, "ring_bench: unknown option %s\n", x);
            return 2;
        }
    }
    if (b->reps < 1) b->reps = 1;
    return 0;
}

/* This process's slice filled with random numbers, its tensors, and the forward once for
 * a real O and LSE (the backward's inputs). */
static void make_inputs(bench *b) {
    const int64_t H = b->H, Hkv = b->Hkv, D = b->D;
    int64_t f[2], n[2];
    attn_ring_slice(b->L, b->size, b->rank, b->causal, f, n);
    const int64_t l = b->l = n[0] + n[1];
    b->q = randbuf(H * l * D, 1 + b->rank), b->k = randbuf(Hkv * l * D, 100 + b->rank);
    b->v = randbuf(Hkv * l * D, 200 + b->rank), b->o = randbuf(H * l * D, 300 + b->rank);
    b->lse = randbuf(H * l, 400), b->dq = malloc((size_t)(H * l * D + 1) * 4);
    b->dk = malloc((size_t)(Hkv * l * D + 1) * 4), b->dv = malloc((size_t)(Hkv * l * D + 1) * 4);
    b->tq = attn_tensor_4d(b->q, ATTN_F32, 1, H, l, D), b->tk = attn_tensor_4d(b->k, ATTN_F32, 1, Hkv, l, D);
    b->tv = attn_tensor_4d(b->v, ATTN_F32, 1, Hkv, l, D), b->to = attn_tensor_4d(b->o, ATTN_F32, 1, H, l, D);
    b->tl = attn_tensor_4d(b->lse, ATTN_F32, 1, H, l, 1), b->tdq = attn_tensor_4d(b->dq, ATTN_F32, 1, H, l, D);
    b->tdk = attn_tensor_4d(b->dk, ATTN_F32, 1, Hkv, l, D), b->tdv = attn_tensor_4d(b->dv, ATTN_F32, 1, Hkv, l, D);
    b->opt = (attn_options){.causal = b->causal, .threads = b->threads};
    b->fopt = b->opt;
    b->fopt.lse = &b->tl;
    attn_ring_forward(&b->tq, &b->tk, &b->tv, &b->to, &b->fopt, MPI_COMM_WORLD, NULL);
}

/* One untimed call and --reps timed ones: the medians of the call's total, compute, wait
 * and longest wait into mine[0..3], the bytes sent into *bytes. */
static attn_status time_ring(bench *b, double mine[4], int64_t *bytes) {
    const int reps = b->reps;
    double *tot = calloc((size_t)reps, sizeof(double)), *comp = calloc((size_t)reps, sizeof(double));
    double *wait = calloc((size_t)reps, sizeof(double)), *maxw = calloc((size_t)reps, sizeof(double));
    attn_status st = ATTN_OK;
    for (int r = -1; r < reps; r++) {  // r = -1: untimed
        attn_ring_stats s;
        MPI_Barrier(MPI_COMM_WORLD);
        st = b->backward ? attn_ring_backward(&b->tq, &b->tk, &b->tv, &b->to, &b->to, &b->tl, &b->tdq,
                                              &b->tdk, &b->tdv, &b->opt, MPI_COMM_WORLD, &s)
                         : attn_ring_forward(&b->tq, &b->tk, &b->tv, &b->to, &b->fopt, MPI_COMM_WORLD, &s);
        if (st != ATTN_OK) break;
        if (r < 0) continue;
        tot[r] = s.total_s, comp[r] = s.compute_s, wait[r] = s.wait_s, maxw[r] = s.max_wait_s;
        *bytes = s.bytes_sent;
    }
    if (st == ATTN_OK) {
        mine[0] = median(tot, reps), mine[1] = median(comp, reps);
        mine[2] = median(wait, reps), mine[3] = median(maxw, reps);
    }
    free(tot); free(comp); free(wait); free(maxw);
    return st;
}

/* The transfer alone: one K/V block (this process's size) to the next process and one
 * from the previous, with no computation beside it, per step; its median (0 for P = 1). */
static double time_transfer(const bench *b) {
    const int rank = b->rank, size = b->size, reps = b->reps;
    const int64_t Hkv = b->Hkv, D = b->D;
    double xfer = 0;
    if (size > 1) {
        const size_t blk = (size_t)(2 * Hkv * b->l * D) * sizeof(float);
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
    return xfer;
}

/* Every process's figures gathered and printed by process 0, with the slowest's GFLOP/s. */
static void report(const bench *b, const double mine[5], int64_t bytes) {
    const int size = b->size;
    double *all = b->rank == 0 ? malloc(sizeof(double) * 5 * (size_t)size) : NULL;
    int64_t *all_bytes = b->rank == 0 ? malloc(sizeof(int64_t) * (size_t)size) : NULL;
    MPI_Gather(mine, 5, MPI_DOUBLE, all, 5, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    MPI_Gather(&bytes, 1, MPI_INT64_T, all_bytes, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
    if (b->rank == 0) {
        const double flops = (b->backward ? 10.0 : 4.0) * (double)b->L * (double)b->L * (double)b->D *
                             (double)b->H * (b->causal ? 0.5 : 1.0);
        printf("ring %s L=%lld H=%lld/%lld D=%lld %s P=%d threads=%d reps=%d\n",
               b->backward ? "backward" : "forward", (long long)b->L, (long long)b->H, (long long)b->Hkv,
               (long long)b->D, b->causal ? "causal" : "full", size, b->threads, b->reps);
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
               flops / worst / 1e9, b->backward ? "backward" : "forward", b->backward ? 10.0 : 4.0,
               b->causal ? " / 2" : "");
    }
    free(all); free(all_bytes);
}

/* The baseline with one process: one plain call on the whole sequence. */
static void time_plain(const bench *b) {
    double *t = calloc((size_t)b->reps, sizeof(double));
    for (int r = -1; r < b->reps; r++) {
        const double t0 = MPI_Wtime();
        if (b->backward)
            attn_backward(&b->tq, &b->tk, &b->tv, &b->to, &b->to, &b->tl, &b->tdq, &b->tdk, &b->tdv, &b->opt);
        else
            attn_forward(&b->tq, &b->tk, &b->tv, &b->to, &b->fopt);
        if (r >= 0) t[r] = MPI_Wtime() - t0;
    }
    printf("one plain attn_%s call: %.1f ms\n", b->backward ? "backward" : "forward", 1e3 * median(t, b->reps));
    free(t);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    bench b = {0};
    MPI_Comm_rank(MPI_COMM_WORLD, &b.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &b.size);
    int rc = parse_options(argc, argv, &b);
    if (!rc) {
        make_inputs(&b);
        double mine[5];
        int64_t bytes = 0;
        const attn_status st = time_ring(&b, mine, &bytes);
        if (st != ATTN_OK) {
            if (b.rank == 0) fprintf(stderr, "ring_bench: %s (%s)\n", attn_status_string(st), attn_ring_last_error());
            rc = 1;
        } else {
            mine[4] = time_transfer(&b);
            report(&b, mine, bytes);
            if (b.size == 1) time_plain(&b);
        }
        free(b.q); free(b.k); free(b.v); free(b.o); free(b.lse); free(b.dq); free(b.dk); free(b.dv);
    }
    MPI_Finalize();
    return rc;
}
