/*
 * additive.h — what the parts of additive (Bahdanau) attention share inside the library:
 *              the params struct filled once by ai_additive_params_init (additive.c),
 *              the entry points of the fused and float64 paths. The scoring
 *              micro-kernels' contract is the kernels' own (kernels/additive_kernels.h).
 *
 * What it is not: the dot-product attention's params (attn_internal.h), which this
 * reuses for the masks (kv_len, bool mask, causal, window) so that both calls read one
 * rule. Index letters as everywhere: b batch, i query row, j key row, a unit (0..A).
 */
#ifndef ATTN_ADDITIVE_H
#define ATTN_ADDITIVE_H

#include "core/attn_internal.h"
#include "kernels/additive_kernels.h"

typedef struct attn_additive_params {
    attn_params m;            /* sizes (Hq = Hkv = 1, Dk of k), masks, lse, weights,
                                 path, threads: filled by ai_params_init            */
    int64_t Dq, A;            /* query width, units                                    */
    const float *q;   int64_t q_s[4];   /* (B, 1, Lq, Dq) float32                      */
    const float *k;   int64_t k_s[4];   /* (B, 1, Lk, Dk) float32                      */
    const float *val; int64_t val_s[4]; /* (B, 1, Lk, Dv) float32                      */
    float *o;         int64_t o_s[4];   /* (B, 1, Lq, Dv) float32                      */
    const float *w_query;     /* (Dq, A) dense                                         */
    const float *w_key;       /* (Dk, A) dense                                         */
    const float *v;           /* (A)                                                   */
    const float *bias;        /* (A) or NULL                                           */
    bool normalize;
    float g;
    const struct attn_additive_kernels *kern;  /* fused path only                      */
} attn_additive_params;

/* The table for the kernel the dot-product path chose (attn_kernel_name(), ATTN_ISA
 * included): avx512 and avx512bf16 take avx512; NULL when none can run. */
ATTN_PRIVATE const attn_additive_kernels *ai_additive_select(void);
/* The table of the ISA called `name` if this build has it and the CPU runs it. */
ATTN_PRIVATE const attn_additive_kernels *ai_additive_kernels_named(const char *name);

/* The keys some query row of batch b reads, [*j0, *j1) (the union of the rows' structural
 * ranges, which is one interval): the products through U read only these rows of K. */
ATTN_PRIVATE void ai_additive_read_keys(const attn_additive_params *p, int64_t b,
                                        int64_t *j0, int64_t *j1);

/* ṽ = v, or g v / ‖v‖ when normalize (float64 for the norm); writes A floats. */
ATTN_PRIVATE void ai_additive_effective_v(const attn_additive_params *p, float *vt);

/* The overlap rule (overlap.c) for the additive calls: the forward's o, opt->lse and
 * opt->weights (gr NULL; more = {o, NULL}), or the backward's weight gradients gr (more =
 * {o, d_o}, inputs then), against q, k, v, the weights' arrays, the mask, kv_len and
 * each other. After ai_additive_params_init accepted p. */
ATTN_PRIVATE attn_status ai_additive_check_aliasing(const attn_additive_params *p,
                                                    const attn_tensor *q,
                                                    const attn_tensor *k,
                                                    const attn_tensor *v,
                                                    const attn_options *opt,
                                                    const attn_tensor *const more[2],
                                                    const attn_additive_grads *gr);

ATTN_PRIVATE attn_status ai_additive_params_init(
    attn_additive_params *p, const attn_tensor *q, const attn_tensor *k,
    const attn_tensor *val, const attn_additive_weights *w, const attn_tensor *o,
    const attn_options *opt, bool need_data);

ATTN_PRIVATE attn_status ai_additive_fused_forward(const attn_additive_params *p);
ATTN_PRIVATE attn_status ai_additive_reference_forward(const attn_additive_params *p);

/* The backward's extra arguments: the forward's o and lse, dO, and the outputs. */
typedef struct attn_additive_bwd {
    const float *d_o;  int64_t d_o_s[4];   /* (B, 1, Lq, Dv) */
    const float *lse;  int64_t lse_s[3];   /* (B, 1, Lq)     */
    float *dq;         int64_t dq_s[4];    /* (B, 1, Lq, Dq) */
    float *dk;         int64_t dk_s[4];    /* (B, 1, Lk, Dk) */
    float *dval;       int64_t dval_s[4];  /* (B, 1, Lk, Dv) */
    attn_additive_grads gr;                /* the weights' gradients, each optional   */
} attn_additive_bwd;

ATTN_PRIVATE attn_status ai_additive_fused_backward(const attn_additive_params *p,
                                                    const attn_additive_bwd *g);
ATTN_PRIVATE attn_status ai_additive_reference_backward(const attn_additive_params *p,
                                                        const attn_additive_bwd *g);

/* The gradient of ṽ carried back to v (and g): dv = dṽ, or, when normalize,
 * dv = (g/‖v‖) (dṽ - v (v·dṽ)/‖v‖²) and dg = v·dṽ / ‖v‖ (float64). */
ATTN_PRIVATE void ai_additive_v_grad(const attn_additive_params *p, const double *dvt,
                                     float *dv, float *dg);

#endif /* ATTN_ADDITIVE_H */
