/*
 * bench_time.c — the timed calls of an `attn bench` case: warm-up calls, then at least
 *                --reps timed ones cycling through the input sets (more for short calls,
 *                until about ADAPTIVE_SECONDS are timed), each on the monotonic clock
 *                (bench_clock.h); beside a decoding row, a plain read of as many bytes as
 *                K and V after each call, for the bandwidth of that moment.
 *
 * What it is not: the check (bench_check.c) or the medians' output (bench_output.c).
 */
#include <math.h>
#include <stdlib.h>

#include "bench_clock.h"
#include "bench_sweep.h"

/* A decoding row's bandwidth is measured beside it: after each timed call, one parallel
 * read of a buffer of the size of K and V that no call touches (so that the next call
 * finds none of its own data in the caches), appended to c->bws. Memory bandwidth on a
 * shared machine drifts by a third within minutes; a ratio of interleaved timings does
 * not. */
static float *bw_buffer(const bench_case *c, int threads, int64_t *n) {
    *n = (int64_t)(c->kv_bytes / 4) / (64 * threads) * (64 * threads);
    if (!machine_read_loops() || !c->decode || *n <= 0) return NULL;
    float *buf = aligned_alloc(64, (size_t)*n * sizeof(float));
    if (!buf) return NULL;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < *n; i++) buf[i] = 1e-3f * (float)(i & 7);
    return buf;
}

/* one static call of a pair (call_case_static), its seconds; *st its status */
static double time_static(const bench_case *c, const case_buffers *cb, int r, int threads,
                          attn_status *st) {
    const double t0 = now_s();
    *st = call_case_static(c, cb, r, threads);
    return now_s() - t0;
}

/* warmup untimed calls, then at least reps timed ones (more for short calls: until about
 * ADAPTIVE_SECONDS are timed, at most ADAPTIVE_REPS), cycling through the input sets;
 * their times go to t[0..*nt), at most cap of them. */
int time_path(bench_case *c, const case_buffers *cb, int threads, attn_path path,
              int warmup, int reps, bool adaptive, double *t, int cap, int *nt) {
    *nt = 0;
    int64_t bw_n = 0;
    float *bw_buf = path == ATTN_PATH_FUSED && c->bws ? bw_buffer(c, threads, &bw_n) : NULL;
    if (reps > cap) reps = cap;
    int call = 1;  /* the check used set 0: start on the next one */
    const bool pair = path == ATTN_PATH_FUSED && c->sts;
    for (int w = 0; w < warmup; w++, call++) {
        if (call_failed(c, call_case(c, cb, call % cb->rot, threads, path), "warm-up") ||
            (pair && call_failed(c, call_case_static(c, cb, ++call % cb->rot, threads),
                                 "warm-up (static)"))) {
            free(bw_buf);
            return -1;
        }
    }
    int n = 0, want = reps;
    double spent = 0;
    while (n < want) {
        const int r = call++ % cb->rot;
        /* the static call of a pair, on the next input set (neither finds the other's
         * inputs in the cache): before the tuned one on odd turns, after on even */
        const int rs = pair ? call++ % cb->rot : r;
        double ts = 0;
        attn_status ss = ATTN_OK;
        if (pair && n % 2) ts = time_static(c, cb, rs, threads, &ss);
        const double t0 = now_s();
        attn_status st = call_case(c, cb, r, threads, path);
        t[n] = now_s() - t0;
        if (pair && n % 2 == 0) ts = time_static(c, cb, rs, threads, &ss);
        if (call_failed(c, st, "timed call") || call_failed(c, ss, "timed call (static)")) {
            free(bw_buf);
            return -1;
        }
        if (pair && c->nsts < POOL) c->sts[c->nsts++] = ts;
        spent += t[n++];
        if (bw_buf && c->nbws < POOL) c->bws[c->nbws++] = machine_read_pass(machine_read_loops(), bw_buf, bw_n, threads);
        if (adaptive && n == reps && spent < ADAPTIVE_SECONDS) {
            int more = (int)ceil(ADAPTIVE_SECONDS / (spent / n));
            want = more > ADAPTIVE_REPS ? ADAPTIVE_REPS : more;
            if (want < reps) want = reps;
            if (want > cap) want = cap;
        }
    }
    *nt = n;
    free(bw_buf);
    return 0;
}

/* median, min and max of t[0..n) (t is sorted) */
void summarize(double *t, int n, double *med, double *lo, double *hi) {
    *med = median(t, n), *lo = t[0], *hi = t[n - 1];
}
