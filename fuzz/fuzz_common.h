/*
 * fuzz_common.h — what the serving and layer harnesses (fuzz_serving.c, fuzz_layers.c)
 *                 share: reading the input, the input-seeded random stream, the abort on
 *                 a broken rule, poisoned buffers and the contract's element rule.
 *
 * Not a harness (the Makefile builds fuzz/fuzz_*.c only) and not the library. fuzz_api.c
 * keeps its own copies of these helpers, with its padding and layout machinery.
 */
#ifndef ATTN_FUZZ_COMMON_H
#define ATTN_FUZZ_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "core/half.h"
#include "rng.h"

#ifndef FUZZ_NAME
#define FUZZ_NAME "fuzz"
#endif

#define REQUIRE(cond, ...)                                                          \
    do {                                                                            \
        if (!(cond)) {                                                              \
            fprintf(stderr, FUZZ_NAME ": %s:%d: %s: ", __FILE__, __LINE__, #cond);  \
            fprintf(stderr, __VA_ARGS__);                                           \
            fputc('\n', stderr);                                                    \
            abort();                                                                \
        }                                                                           \
    } while (0)

enum { POISON = 0xA5 };

/* ---- the input: bytes that decide the call, and a stream seeded by all of them ------ */

typedef struct reader {
    const uint8_t *p;
    size_t n;
} reader;

static inline unsigned byte(reader *r) {
    if (!r->n) return 0;
    r->n--;
    return *r->p++;
}
/* 0 .. n-1 */
static inline int64_t pick(reader *r, int64_t n) { return (int64_t)(byte(r) % (unsigned)n); }

static rng_t g_rng;
static inline void seed_from(const uint8_t *data, size_t size) {
    g_rng.s = 0;
    for (size_t i = 0; i < size; i++) g_rng.s = g_rng.s * 131 + data[i];
}
static inline double unif(void) { return rng_unif(&g_rng); }
static inline double sym(double a) { return a * (2 * unif() - 1); }

/* ---- buffers ---------------------------------------------------------------------- */

static inline void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) abort();
    return p;
}

/* bytes of n elements of dt (n a multiple of 32 for q8_0) */
static inline size_t nbytes(attn_dtype dt, int64_t n) {
    return (size_t)(n / attn_dtype_block(dt)) * attn_dtype_size(dt);
}

/* A dense [d0, d1, d2, d3] tensor over a fresh allocation filled with the poison, plus
 * `extra` poisoned bytes after it (so that a write past the end shows). */
typedef struct buf {
    attn_tensor t;
    unsigned char *base;
    size_t bytes;
} buf;

static inline void buf_new(buf *b, attn_dtype dt, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    const int64_t n = d0 * d1 * d2 * d3;
    b->bytes = nbytes(dt, n) + 16;
    b->base = xmalloc(b->bytes);
    memset(b->base, POISON, b->bytes);
    b->t = attn_tensor_4d(b->base, dt, d0, d1, d2, d3);
}
static inline void buf_free(buf *b) {
    free(b->base);
    b->base = NULL;
}
static inline void buf_twin(buf *dst, const buf *b) {
    *dst = *b;
    dst->base = xmalloc(b->bytes);
    memset(dst->base, POISON, b->bytes);
    dst->t.data = dst->base + ((unsigned char *)b->t.data - b->base);
}
static inline void buf_copy(buf *dst, const buf *b) {
    buf_twin(dst, b);
    memcpy(dst->base, b->base, b->bytes);
}
static inline bool all_poison(const buf *b) {
    for (size_t i = 0; i < b->bytes; i++)
        if (b->base[i] != POISON) return false;
    return true;
}
static inline bool same_bytes(const buf *a, const buf *b) {
    return a->bytes == b->bytes && memcmp(a->base, b->base, a->bytes) == 0;
}
static inline int64_t numel(const attn_tensor *t) {
    return t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3];
}
/* element k (C order of the indices) of a float view */
static inline int64_t elem_off(const attn_tensor *t, int64_t k) {
    int64_t off = 0;
    for (int d = 3; d >= 0; d--) {
        const int64_t n = t->shape[d] > 0 ? t->shape[d] : 1;
        off += (k % n) * t->stride[d];
        k /= n;
    }
    return off;
}
static inline double get(const attn_tensor *t, int64_t k) {
    return attn_load(t->dtype, t->data, elem_off(t, k));
}
static inline void set(const attn_tensor *t, int64_t k, double x) {
    attn_store(t->dtype, t->data, elem_off(t, k), (float)x);
}
/* uniform values in [-a, a), rounded to the tensor's (float) dtype */
static inline void fill(const attn_tensor *t, double a) {
    for (int64_t k = 0; k < numel(t); k++) set(t, k, sym(a));
}

/* half an ulp of a dtype, relative */
static inline double half_ulp(attn_dtype dt) {
    return dt == ATTN_F16 ? 0x1p-11 : dt == ATTN_BF16 ? 0x1p-8 : 0;
}

/* The contract's element rule: got against ref (float64 values, n of them),
 * |got - ref| <= atol (1 + max |ref|) + rel |ref|; non-finite values must match exactly. */
static inline void compare_vals(const char *what, const double *got, const double *ref, int64_t n,
                                double atol, double rel) {
    double max_ref = 0;
    for (int64_t k = 0; k < n; k++)
        if (isfinite(ref[k]) && fabs(ref[k]) > max_ref) max_ref = fabs(ref[k]);
    for (int64_t k = 0; k < n; k++) {
        const double g = got[k], e = ref[k];
        if (!isfinite(e) || !isfinite(g)) {
            REQUIRE((isnan(e) && isnan(g)) || g == e, "%s element %lld: %g vs reference %g", what,
                    (long long)k, g, e);
            continue;
        }
        const double tol = atol * (1 + max_ref) + rel * fabs(e);
        REQUIRE(fabs(g - e) <= tol, "%s element %lld of %lld: %.9g vs reference %.9g (tolerance %.3g)",
                what, (long long)k, (long long)n, g, e, tol);
    }
}

/* the same with got a tensor view and ref a tensor view */
static inline void compare_t(const char *what, const attn_tensor *got, const attn_tensor *ref,
                             double atol, double rel) {
    const int64_t n = numel(got);
    double *g = xmalloc((size_t)n * sizeof *g), *e = xmalloc((size_t)n * sizeof *e);
    for (int64_t k = 0; k < n; k++) g[k] = get(got, k), e[k] = get(ref, k);
    compare_vals(what, g, e, n, atol, rel);
    free(g);
    free(e);
}

/* ---- caches: rows of D values in a cache dtype, and their float32 shadow ----------- */

/* Fill a dense [d0, d1, d2, D] tensor of dtype dt (q8_0 included) with values in [-a, a)
 * and return, malloc'ed, the float values it holds (for q8_0 the dequantized ones). */
static inline float *cache_fill(const attn_tensor *t, double a) {
    const int64_t n = numel(t);
    float *x = xmalloc((size_t)n * sizeof *x);
    for (int64_t k = 0; k < n; k++) x[k] = (float)sym(a);
    if (t->dtype == ATTN_Q8_0) {
        attn_tensor src = attn_tensor_4d(x, ATTN_F32, t->shape[0], t->shape[1], t->shape[2],
                                         t->shape[3]);
        REQUIRE(attn_quantize_q8_0(&src, t) == ATTN_OK, "quantize: %s", attn_last_error());
        REQUIRE(attn_dequantize_q8_0(t, &src) == ATTN_OK, "dequantize: %s", attn_last_error());
    } else {
        for (int64_t k = 0; k < n; k++) {
            attn_store(t->dtype, t->data, k, x[k]);
            x[k] = attn_load(t->dtype, t->data, k);
        }
    }
    return x;
}

/* the float values a dense cache tensor holds, malloc'ed */
static inline float *cache_values(const attn_tensor *t) {
    const int64_t n = numel(t);
    float *x = xmalloc((size_t)n * sizeof *x);
    if (t->dtype == ATTN_Q8_0) {
        attn_tensor dst = attn_tensor_4d(x, ATTN_F32, t->shape[0], t->shape[1], t->shape[2],
                                         t->shape[3]);
        REQUIRE(attn_dequantize_q8_0(t, &dst) == ATTN_OK, "dequantize: %s", attn_last_error());
    } else {
        for (int64_t k = 0; k < n; k++) x[k] = attn_load(t->dtype, t->data, k);
    }
    return x;
}

/* byte address of row (page, h, r) of a dense pool [pages, H, ps, D] */
static inline unsigned char *row_at(const attn_tensor *t, int64_t page, int64_t h, int64_t r) {
    const int64_t e = ((page * t->shape[1] + h) * t->shape[2] + r) * t->shape[3];
    return (unsigned char *)t->data + nbytes(t->dtype, e);
}

#endif /* ATTN_FUZZ_COMMON_H */
