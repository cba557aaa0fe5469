/*
 * rng.h — the project's one deterministic random stream, splitmix64, for everything
 *         outside the library that needs reproducible numbers: the test suites, the
 *         bench's inputs, the demo's samples and the training example's draws.
 *
 * What it is not: a generator for the library itself (nothing in src/ draws random
 * numbers), or anything cryptographic. Header-only.
 *
 * rng_case() derives a case's own seed from its parameters, so the data a test case
 * draws depends on the case alone: not on which cases, or which CPU's kernels, ran
 * before it.
 */
#ifndef ATTN_TOOLS_RNG_H
#define ATTN_TOOLS_RNG_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

typedef struct rng_t {
    uint64_t s;  /* the whole state: {seed} starts a stream */
} rng_t;

/* the next 64 bits of the stream (splitmix64) */
static inline uint64_t rng_next(rng_t *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* uniform in [0, 1), 53 random bits */
static inline double rng_unif(rng_t *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }
/* uniform in (0, 1): never 0, so its log is finite */
static inline double rng_open(rng_t *r) { return ((double)(rng_next(r) >> 11) + 0.5) * 0x1.0p-53; }
/* uniform in [lo, hi) */
static inline double rng_range(rng_t *r, double lo, double hi) { return lo + (hi - lo) * rng_unif(r); }
/* uniform in [-1, 1) */
static inline double rng_sym(rng_t *r) { return 2.0 * rng_unif(r) - 1.0; }
/* uniform in [0, n), n > 0 */
static inline int64_t rng_int(rng_t *r, int64_t n) { return (int64_t)(rng_next(r) % (uint64_t)n); }
/* N(0, 1) by Box-Muller, the radius from 1 - u in (0, 1] (the test suites' form) */
static inline double rng_normal(rng_t *r) {
    const double u1 = 1.0 - rng_unif(r), u2 = rng_unif(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
/* N(0, 1) by Box-Muller from two open-unit draws, the radius's first (the tools' form) */
static inline double rng_gauss(rng_t *r) {
    const double u = rng_open(r), w = rng_open(r);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * w);
}

/* A seed made of a case's parameters: the same parameters give the same seed in any
 * program and on any CPU. */
static inline uint64_t rng_case(const int64_t *params, size_t n) {
    rng_t r = {0x243F6A8885A308D3ull};  /* any fixed start */
    for (size_t i = 0; i < n; i++) {
        r.s ^= (uint64_t)params[i];
        r.s = rng_next(&r);
    }
    return r.s;
}
#define RNG_CASE(...) \
    rng_case((const int64_t[]){__VA_ARGS__}, sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t))

#endif /* ATTN_TOOLS_RNG_H */
