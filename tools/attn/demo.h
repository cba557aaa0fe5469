/*
 * demo.h — what the sections of `attn demo` share: one forward call on small dense
 *          tensors, the demo's fixed stream of normal samples, and seed 003's §4 input.
 *          (demo_common.c). The sections of seed 000 and the causal example are in
 *          cli_demo.c, the other
 *          seed 003 sections (§5, exercises 1, 4, 5, the §7 pitfalls, seed 002's
 *          comparison) in demo_seed003.c.
 */
#ifndef ATTN_DEMO_H
#define ATTN_DEMO_H

#include <stdint.h>

#include "attn.h"

/* One forward call on dense [1, 1, L, D] tensors; prints the error and returns 1 on one. */
int demo_attend(float *q, float *k, float *v, float *o, int64_t lq, int64_t lk, int64_t dk,
                int64_t dv, attn_options *opt);

/* The next N(0, 1) sample of the demo's fixed stream (splitmix64, then Box-Muller). */
float demo_normal(void);

/* Exercise 3.3's sample: N33 pairs of D33 normals, two uniforms each (the stream's
 * position of seed 003's input counts them) */
enum { N33 = 100000, D33 = 64 };

/* Seed 003 §4's input: 4 tokens of D = 8, Q = x Wq, K = x Wk, V = x Wv, with the stream
 * where the full demo has it (after seed 000's exercises), so that every section that
 * uses it prints the same numbers alone or in the full run. */
enum { DEMO_T = 4, DEMO_D = 8 };
void demo_seed003_input(float q[DEMO_T][DEMO_D], float k[DEMO_T][DEMO_D], float v[DEMO_T][DEMO_D]);

/* The sections of demo_seed003.c; each prints its part and returns 0, or 1 on an error. */
int demo_sdpa(void);
int demo_exercise1(void);
int demo_exercise4(void);
int demo_exercise5(const int64_t *tokens, int n);
int demo_pitfalls(void);
int demo_compare(void);

#endif /* ATTN_DEMO_H */
