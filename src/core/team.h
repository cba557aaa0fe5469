/*
 * team.h — whether a call wakes the OpenMP team or runs on the calling thread.
 *
 * Waking the team costs more than a tiny call's whole work (a decoding step of a few rows,
 * under load: docs/KERNELS.md has the figures).
 * Below ATTN_TEAM_MIN_FLOPS of work (the logits' and the values' multiply-adds,
 * 2 B Hq Lq Lk (Dk + Dv), counted as a dense call whatever the masks leave out) the
 * parallel regions of the forward, the backward and the key-padding scan run with
 * OpenMP's if clause false: one thread, the calling one, on the same workspace slice 0.
 * Results do not depend on it: every path gives the same bits on any number of threads.
 * docs/KERNELS.md, "Threads for tiny calls", has the measurement behind the value;
 * ATTN_TEAM_MIN_FLOPS (an environment variable, a count of flops) replaces it for
 * measuring, read once per process.
 */
#ifndef ATTN_TEAM_H
#define ATTN_TEAM_H

#include "attn_internal.h"

#define ATTN_TEAM_MIN_FLOPS_DEFAULT 1.0e6

/* the threshold in flops: the environment's, or ATTN_TEAM_MIN_FLOPS_DEFAULT (team.c) */
ATTN_PRIVATE double ai_team_min_flops(void);

/* the work estimate of p's forward, in flops (a double: no overflow) */
static inline double attn_call_flops(const attn_params *p) {
    return 2.0 * (double)p->B * (double)p->Hq * (double)p->Lq * (double)p->Lk *
           (double)(p->Dk + p->Dv);
}

/* the backward's work in forward passes: five products of a tile against the forward's two */
#define ATTN_TEAM_BACKWARD_PASSES 2.5

/* whether a parallel region of p's call, of passes times the forward's work, takes p's
 * threads (true) or the calling thread alone */
static inline bool attn_run_parallel(const attn_params *p, double passes) {
    return p->threads > 1 && passes * attn_call_flops(p) >= ai_team_min_flops();
}

#endif
