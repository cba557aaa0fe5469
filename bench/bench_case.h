/*
 * bench_case.h — one case of `attn bench`'s sweep (bench/cli_bench.c): its shape, mask,
 *                dtypes and direction, and what the run found (the check, the pooled
 *                times of both sides). Shared with the PyTorch peer (bench_peer.c).
 */
#ifndef ATTN_TOOLS_BENCH_CASE_H
#define ATTN_TOOLS_BENCH_CASE_H

#include <stdbool.h>
#include <stdint.h>

#include "attn.h"

/* Timed calls: at least --reps, more for short calls (until about ADAPTIVE_SECONDS, at
 * most ADAPTIVE_REPS); at most POOL pooled over all rounds; MAX_REPS for --reps. */
enum { MAX_REPS = 1000, ADAPTIVE_REPS = 50, POOL = 4096 };
#define ADAPTIVE_SECONDS 1.0

typedef enum { MASK_NONE, MASK_CAUSAL, MASK_BOOL, MASK_WINDOW } mask_kind;
static const char *const MASK_NAME[] = {"none", "causal", "bool", "window"};

/* The bool mask's share of attended pairs: a random [1, 1, Lq, Lk] pattern. */
#define BOOL_MASK_DENSITY 0.9

typedef struct bench_case {
    char name[64];
    int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
    mask_kind mask;
    int64_t win_left, win_right;  /* MASK_WINDOW: top-left diagonal, -1 = unbounded */
    bool decode;                  /* report GB/s of K and V                          */
    attn_dtype qdt, kvdt;         /* Q (and O), K and V: ATTN_F32, ATTN_F16, ATTN_BF16 */
    attn_precision prec;
    bool bwd;                     /* time attn_backward (FLOPs 2.5x the forward's)   */
    char base[64];                /* the float32 forward row of the same shape, or "" */
    double base_ratio;            /* its time / this row's time (same FLOPs), < 0 = none */

    /* results */
    double flop, kv_bytes;
    int rotate;                   /* input sets the timed calls cycle through */
    char checked[96];             /* which part was checked against the reference */
    double rel_fro, max_abs, tol_abs;
    double naive_err;             /* 16-bit rows: the naive same-precision max error */
    bool ran, pass;
    char error[200];              /* a failed call: its status and detail */
    int reps;
    double t_med, t_min, t_max;   /* seconds, fused path */
    double ref_med;               /* seconds, reference path; < 0 = not timed */
    double torch_med, torch_min, torch_max;  /* < 0 = not timed */
    int torch_reps;
    char torch_error[200];
    /* the timed calls of every round, pooled: the medians above are taken over these */
    double *ts, *tts;
    int nts, ntts;
    /* decoding rows: a plain read of as many bytes as K and V, timed after each timed
     * call of the fused path (GB/s), and their median */
    double *bws;
    int nbws;
    double bw_here;
    /* with a wisdom in use (cli_bench.c): the same calls with the library's static
     * choices (ai_forward_forced with no configuration), each timed right after or
     * before a tuned one (the t_* above), pooled likewise; sts NULL: no wisdom */
    double *sts;
    int nsts;
    double s_med, s_min, s_max;
} bench_case;

#endif /* ATTN_TOOLS_BENCH_CASE_H */
