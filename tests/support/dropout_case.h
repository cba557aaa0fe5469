/*
 * dropout_case.h — one call of the dropout suites (test_dropout.c, test_dropout_backward.c):
 *                  a case (shape, masks, p, seed, offset), its tensors and options filled
 *                  from the case's own stream (rng.h), the fused or reference forward and
 *                  backward on it, and the float64 reference (attn_ref64_*) of the same
 *                  call with its mask or another offset's.
 *
 * What it is not: a check (the suites hold the results to their tolerances) or a second
 * dropout: the mask is the library's (ai_params_init fills it from the options).
 */
#ifndef ATTN_TEST_DROPOUT_CASE_H
#define ATTN_TEST_DROPOUT_CASE_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "backward/backward.h"
#include "check.h"
#include "fd64.h"
#include "rng.h"

typedef struct dcase {
    int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
    int causal, align, window;
    int64_t wl, wr;
    int kvlen;     // kv_len[b] = Lk - 3 b (at least 0)
    int mask;      // a random bool mask [B, 1, Lq, Lk], 80% open
    float p;
    uint64_t seed, offset;
} dcase;

typedef struct dcall {
    dcase c;
    float *q, *k, *v, *o, *lse, *w, *d_o, *dq, *dk, *dv;
    int64_t *lens;
    uint8_t *mask;
    attn_tensor tq, tk, tv, to, tlse, tw, tdo, tdq, tdk, tdv, tlens, tmask;
    attn_options opt;
} dcall;

static inline int64_t n_of(const attn_tensor *t) {
    return t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3];
}

static inline void dcall_build(dcall *t, const dcase *c) {
    memset(t, 0, sizeof *t);
    t->c = *c;
    rng_t r = {RNG_CASE(c->B, c->Hq, c->Hkv, c->Lq, c->Lk, c->Dk, c->Dv, c->causal, c->window,
                        c->kvlen, c->mask, (int64_t)(c->p * 1000), (int64_t)c->seed)};
    t->tq = attn_tensor_4d(NULL, ATTN_F32, c->B, c->Hq, c->Lq, c->Dk);
    t->tk = attn_tensor_4d(NULL, ATTN_F32, c->B, c->Hkv, c->Lk, c->Dk);
    t->tv = attn_tensor_4d(NULL, ATTN_F32, c->B, c->Hkv, c->Lk, c->Dv);
    t->to = attn_tensor_4d(NULL, ATTN_F32, c->B, c->Hq, c->Lq, c->Dv);
    t->tlse = attn_tensor_4d(NULL, ATTN_F32, c->B, c->Hq, c->Lq, 1);
    t->tw = attn_tensor_4d(NULL, ATTN_F32, c->B, c->Hq, c->Lq, c->Lk);
    t->tdo = t->to, t->tdq = t->tq, t->tdk = t->tk, t->tdv = t->tv;
    float **bufs[] = {&t->q, &t->k, &t->v, &t->o, &t->lse, &t->w, &t->d_o, &t->dq, &t->dk, &t->dv};
    attn_tensor *ts[] = {&t->tq, &t->tk, &t->tv, &t->to, &t->tlse, &t->tw, &t->tdo, &t->tdq, &t->tdk, &t->tdv};
    for (int a = 0; a < 10; a++) {
        *bufs[a] = xcalloc(n_of(ts[a]), sizeof(float));
        ts[a]->data = *bufs[a];
    }
    for (int64_t e = 0; e < n_of(&t->tq); e++) t->q[e] = (float)(2.0 * rng_sym(&r));
    for (int64_t e = 0; e < n_of(&t->tk); e++) t->k[e] = (float)rng_sym(&r);
    for (int64_t e = 0; e < n_of(&t->tv); e++) t->v[e] = (float)rng_sym(&r);
    for (int64_t e = 0; e < n_of(&t->tdo); e++) t->d_o[e] = (float)rng_sym(&r);
    t->opt.causal = c->causal;
    t->opt.align = c->align ? ATTN_ALIGN_BOTTOM_RIGHT : ATTN_ALIGN_TOP_LEFT;
    if (c->window) {
        t->opt.has_window = true;
        t->opt.window_left = c->wl, t->opt.window_right = c->wr;
    }
    if (c->kvlen) {
        t->lens = xcalloc(c->B, sizeof(int64_t));
        for (int64_t b = 0; b < c->B; b++) t->lens[b] = c->Lk - 3 * b > 0 ? c->Lk - 3 * b : 0;
        t->tlens = attn_tensor_4d(t->lens, ATTN_I64, c->B, 1, 1, 1);
        t->opt.kv_len = &t->tlens;
    }
    if (c->mask) {
        t->mask = xcalloc(c->B * c->Lq * c->Lk, 1);
        for (int64_t e = 0; e < c->B * c->Lq * c->Lk; e++) t->mask[e] = rng_unif(&r) < 0.8;
        t->tmask = attn_tensor_4d(t->mask, ATTN_BOOL, c->B, 1, c->Lq, c->Lk);
        t->opt.mask = &t->tmask;
    }
    t->opt.dropout_p = c->p;
    t->opt.dropout_seed = c->seed;
    t->opt.dropout_offset = c->offset;
}

static inline void dcall_free(dcall *t) {
    float *bufs[] = {t->q, t->k, t->v, t->o, t->lse, t->w, t->d_o, t->dq, t->dk, t->dv};
    for (int a = 0; a < 10; a++) free(bufs[a]);
    free(t->lens), free(t->mask);
}

static inline attn_status dcall_forward(dcall *t, attn_path path, int threads, bool weights) {
    attn_options o = t->opt;
    o.path = path, o.threads = threads;
    o.lse = &t->tlse;
    o.weights = weights ? &t->tw : NULL;
    return attn_forward(&t->tq, &t->tk, &t->tv, &t->to, &o);
}

static inline attn_status dcall_backward(dcall *t, attn_path path, int threads) {
    attn_options o = t->opt;
    o.path = path, o.threads = threads;
    return attn_backward(&t->tq, &t->tk, &t->tv, &t->to, &t->tdo, &t->tlse, &t->tdq, &t->tdk,
                         &t->tdv, &o);
}

static inline double *to_double(const float *x, int64_t n) {
    double *d = xcalloc(n, sizeof(double));
    for (int64_t e = 0; e < n; e++) d[e] = x[e];
    return d;
}

/* The float64 reference's O and LSE (and gradients, when grads) of the call, with its
 * options except the offset, which is offset_shift more (0 for the call's own mask). */
static inline attn_status dcall_ref64(const dcall *t, uint64_t offset_shift, double *o,
                                      double *lse, double *grads[3], bool magnitudes) {
    attn_options f = t->opt;
    f.dropout_offset += offset_shift;
    f.path = ATTN_PATH_REFERENCE;
    attn_params p;
    TRY(ai_params_init(&p, &t->tq, &t->tk, &t->tv, &t->to, &f, true));
    double *q = to_double(t->q, n_of(&t->tq)), *k = to_double(t->k, n_of(&t->tk));
    double *v = to_double(t->v, n_of(&t->tv)), *d_o = to_double(t->d_o, n_of(&t->tdo));
    attn_status st = ATTN_OK;
    if (o) st = ai_ref64_forward(&p, q, k, v, o, lse);
    if (st == ATTN_OK && grads)
        st = ai_ref64_backward(&p, q, k, v, d_o, grads[0], grads[1], grads[2], magnitudes);
    free(q), free(k), free(v), free(d_o);
    return st;
}

static inline void describe(const dcase *c, char *s, size_t n) {
    snprintf(s, n, "B%lld Hq%lld Hkv%lld Lq%lld Lk%lld Dk%lld Dv%lld causal%d align%d win%d(%lld,%lld) "
             "kvlen%d mask%d p%g seed%llu off%llu", (long long)c->B, (long long)c->Hq,
             (long long)c->Hkv, (long long)c->Lq, (long long)c->Lk, (long long)c->Dk,
             (long long)c->Dv, c->causal, c->align, c->window, (long long)c->wl, (long long)c->wr,
             c->kvlen, c->mask, (double)c->p, (unsigned long long)c->seed,
             (unsigned long long)c->offset);
}


#endif /* ATTN_TEST_DROPOUT_CASE_H */
