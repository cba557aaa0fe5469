/*
 * additive_proj.h — the projections of additive attention and the memory around them,
 *                   shared by the fused forward and backward: Qp = Q W [B, Lq, A] and
 *                   Kpᵀ = Uᵀ Kᵀ + b [B, A, Lk] through ai_gemm_f32, ṽ, and one scratch
 *                   slice per thread — all in one allocation, linear in Lq + Lk.
 */
#ifndef ATTN_ADDITIVE_PROJ_H
#define ATTN_ADDITIVE_PROJ_H

#include "additive.h"

typedef struct attn_additive_proj {
    int64_t Lq, Lk, A;
    float *qp;        /* (B, Lq, A)                                     */
    float *kpt;       /* (B, A, Lk): Kp transposed, so keys are columns  */
    float *vt;        /* (A) ṽ                                          */
    float *gather;    /* (threads, per_gather) dense copies of strided inputs */
    int64_t per_gather;
    float *scratch;   /* (threads, per_thread)                           */
    int64_t per_thread;
    float *extra;     /* (extra floats) for the caller (the backward's)  */
    void *mem;
} attn_additive_proj;

/* Sizes and allocates (ATTN_ERR_OVERFLOW, ATTN_ERR_NOMEM); nothing is computed yet. */
ATTN_PRIVATE attn_status ai_proj_init(attn_additive_proj *pr, const attn_additive_params *p,
                                      int threads, int64_t per_thread, int64_t extra);
/* Fills vt; then qp and kpt of batch b (any thread, with its own gather slice). */
ATTN_PRIVATE void ai_proj_vt(attn_additive_proj *pr, const attn_additive_params *p);
ATTN_PRIVATE attn_status ai_proj_batch(attn_additive_proj *pr, const attn_additive_params *p,
                                       int64_t b, float *gather);
static inline float *attn_proj_gather(const attn_additive_proj *pr, int t) {
    return pr->gather + (int64_t)t * pr->per_gather;
}
ATTN_PRIVATE void ai_proj_free(attn_additive_proj *pr);

/* c[m, n] = op(a) op(b) (+ c when accumulate) through ai_gemm_f32; with an inner size
 * of 0 the product is 0 (c is cleared, or left when accumulating). */
ATTN_PRIVATE attn_status ai_proj_product(bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                                         const float *a, int64_t lda, const float *b,
                                         int64_t ldb, bool accumulate, float *c,
                                         int64_t ldc);

/* Batch b of a float32 [B, 1, L, D] input as dense rows for the BLAS: the data itself when
 * its rows are unit-stride (*ld gets the row stride), else a copy into `gather`. */
ATTN_PRIVATE const float *ai_proj_rows(const float *data, const int64_t s[4], int64_t b,
                                       int64_t L, int64_t D, float *gather, int64_t *ld);

static inline const float *attn_proj_qp(const attn_additive_proj *pr, int64_t b, int64_t i) {
    return pr->qp + (b * pr->Lq + i) * pr->A;
}
static inline const float *attn_proj_kpt(const attn_additive_proj *pr, int64_t b) {
    return pr->kpt + b * pr->A * pr->Lk;
}
static inline float *attn_proj_thread_scratch(const attn_additive_proj *pr, int t) {
    return pr->scratch + (int64_t)t * pr->per_thread;
}

#endif /* ATTN_ADDITIVE_PROJ_H */
