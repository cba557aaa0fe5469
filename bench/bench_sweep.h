/*
 * bench_sweep.h — the parts of `attn bench`'s main sweep (cli_bench.c, the options and
 *                 the loop over the cases), one file each:
 *   bench_sweep.c   the cases of the sweep (shapes, masks, dtypes, FLOPs) and their
 *                   inputs (rotated copies, tensors, options)
 *   bench_check.c   one call of a case, and its check against the float64 reference
 *   bench_time.c    the timed calls (and a decoding row's bandwidth beside them)
 *   bench_output.c  the table and the JSON document
 * The measuring method is written down in cli_bench.c's opening comment. What it is not:
 * the bench's other parts (bench_<part>.c, each its own sweep) or the PyTorch side
 * (bench_peer.c), which share only bench_case.h.
 */
#ifndef ATTN_BENCH_SWEEP_H
#define ATTN_BENCH_SWEEP_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>

#include "attn.h"
#include "bench_case.h"
#include "bench_machine.h"
#include "bench_peer.h"

/* the options of `attn bench` (cli_bench.c parses them) */
typedef struct bench_args {
    bool tuned;  /* a wisdom is in use: static and tuned times side by side */
    bool quick, list, json, no_machine, machine_only, setup_torch, plant_error, quiet;
    const char *shapes, *isa, *vs, *python, *torch_script, *json_out, *wisdom;
    int threads, reps, warmup, rounds;
    int64_t ref_max_l;
    double check_budget;
} bench_args;

enum { MAX_CASES = 64 };

/* ---- the cases (bench_sweep.c) ---- */

/* The default sweep (docs/BENCHMARKS.md) or, with --quick, a tiny one of the same kinds;
 * returns the number of cases written to c (at most MAX_CASES). */
int make_sweep(bench_case *c, bool quick);
/* c->flop and c->kv_bytes from the case's shape, mask and direction */
void count_work(bench_case *c);
/* "f32", "f16" or "bf16" */
const char *dtype_short(attn_dtype t);

/* ---- the inputs of a case (bench_sweep.c) ---- */

typedef struct case_buffers {
    int rot;
    void *q[16], *k[16], *v[16], *o[16];   /* (B, Hq, Lq, Dk) (B, Hkv, Lk, Dk) ... in their dtypes */
    float *q32, *k32, *v32;                /* set 0's values as float (the naive check's input)  */
    float *d_o[16], *lse[16], *dq[16], *dk[16], *dv[16];  /* backward cases */
    unsigned char *mask;                   /* (1, 1, Lq, Lk), MASK_BOOL only       */
    void *ws;
    size_t ws_bytes;
} case_buffers;

static inline int64_t n_q(const bench_case *c) { return c->B * c->Hq * c->Lq * c->Dk; }
static inline int64_t n_k(const bench_case *c) { return c->B * c->Hkv * c->Lk * c->Dk; }
static inline int64_t n_v(const bench_case *c) { return c->B * c->Hkv * c->Lk * c->Dv; }
static inline int64_t n_o(const bench_case *c) { return c->B * c->Hq * c->Lq * c->Dv; }
static inline int64_t n_lse(const bench_case *c) { return c->B * c->Hq * c->Lq; }

/* rot copies of the inputs and outputs, at least rot_bytes in all (at most 16 copies);
 * -1 when out of memory (free_buffers then frees what was made) */
int alloc_buffers(const bench_case *c, double rot_bytes, case_buffers *cb);
void free_buffers(case_buffers *cb);
/* The options of a case on a given path. */
attn_options case_options(const bench_case *c, const attn_tensor *mask, int threads,
                          attn_path path);
typedef struct case_tensors { attn_tensor q, k, v, o, mask, d_o, lse, dq, dk, dv; } case_tensors;

/* the tensors of input set r */
case_tensors tensors_of(const bench_case *c, const case_buffers *cb, int r);
/* false for ATTN_OK; else c->error says what failed, and true */
bool call_failed(bench_case *c, attn_status st, const char *what);

/* ---- a call and its check (bench_check.c) ---- */

/* One call of the case on input set r: the forward, or for a backward case the backward
 * (its O and LSE made once by prepare_backward). */
attn_status call_case(const bench_case *c, const case_buffers *cb, int r, int threads,
                      attn_path path);
/* The same call with the library's static choices, whatever the wisdom says
 * (ai_forward_forced, ai_backward_forced with no configuration: the tuner's own
 * baseline), on the fused path. */
attn_status call_case_static(const bench_case *c, const case_buffers *cb, int r, int threads);
int prepare_backward(bench_case *c, case_buffers *cb, int threads);
/* The case checked against the reference (a part of it over budget multiply-adds; plant:
 * perturb one output first, to see the check fail): c->pass, c->checked and the errors;
 * -1 when a call failed (c->error). */
int check_case(bench_case *c, case_buffers *cb, int threads, bool plant, double budget);

/* ---- timing (bench_time.c) ---- */

/* warmup untimed calls, then at least reps timed ones (more when adaptive), their times
 * to t[0..*nt), at most cap of them; -1 when a call failed (c->error). On the fused path
 * with c->sts: each timed call paired with one of call_case_static, the two in turns
 * (first one, then the other), its time appended to c->sts. */
int time_path(bench_case *c, const case_buffers *cb, int threads, attn_path path, int warmup,
              int reps, bool adaptive, double *t, int cap, int *nt);
/* median, min and max of t[0..n) (t is sorted) */
void summarize(double *t, int n, double *med, double *lo, double *hi);

/* ---- output (bench_output.c) ---- */

/* GFLOP/s of the case at time t */
double gflops(const bench_case *c, double t);
void write_json(FILE *f, const machine *m, const bench_case *c, int n, const bench_args *a,
                const torch_proc *tp);
void print_table(FILE *f, const machine *m, const bench_case *c, int n, const torch_proc *tp);

#endif /* ATTN_BENCH_SWEEP_H */
