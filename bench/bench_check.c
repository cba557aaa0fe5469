/*
 * bench_check.c — one call of an `attn bench` case, and its check against the float64
 *                 reference before it is timed: float32 rows at the contract's tolerance
 *                 (tolerance.h), 16-bit rows by the half-precision rule (at most twice the
 *                 error of a naive same-precision implementation, naive.c), backward rows
 *                 on dQ, dK and dV; a large case checks a part of itself (pick_check).
 *
 * What it is not: the inputs (bench_sweep.c) or the timing (bench_time.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/attn_internal.h"  // ai_forward_forced, ai_backward_forced
#include "bench_sweep.h"
#include "core/half.h"
#include "naive.h"
#include "tolerance.h"

/* 16-bit storage read back as float: the library's own codec (half.h) */
static float half_value(attn_dtype t, uint16_t h) {
    return t == ATTN_BF16 ? attn_bf16_to_f32(h) : attn_f16_to_f32(h);
}
/* element i of a tensor's storage as float */
static float elem(attn_dtype t, const void *p, int64_t i) {
    return t == ATTN_F32 ? ((const float *)p)[i] : half_value(t, ((const uint16_t *)p)[i]);
}

/* ---- the check against the reference ------------------------------------------------- */

typedef struct check_part { int64_t b, hq, hkv, r0, rows; } check_part;

/* The part of a case the reference recomputes: all of it when that fits the budget;
 * otherwise batch 0 and the query heads of the first key/value head (two heads when
 * there is no grouping); then, if still too large, the last rows of those heads. With
 * Lq = Lk the last rows' top-left diagonal equals a bottom-right one on the sub-problem
 * (d = t + Lk - rows), so causal and window cases are checked exactly; they are also the
 * rows that attend to the most keys. */
static check_part pick_check(const bench_case *c, double budget) {
    check_part p = {c->B, c->Hq, c->Hkv, 0, c->Lq};
    const double per_row = (double)c->Lk * (double)(c->Dk + c->Dv);
    if ((double)p.b * (double)p.hq * (double)p.rows * per_row <= budget) return p;
    p.b = 1;
    const int64_t group = c->Hq / c->Hkv;
    p.hkv = group > 1 ? 1 : (c->Hkv < 2 ? c->Hkv : 2);
    p.hq = p.hkv * group;
    const double per_head_row = (double)p.hq * per_row;
    if ((double)p.rows * per_head_row <= budget) return p;
    const bool structural = c->mask == MASK_CAUSAL || c->mask == MASK_WINDOW;
    if (structural && c->Lq != c->Lk) return p;  /* no exact sub-problem: check all rows */
    int64_t rows = (int64_t)(budget / per_head_row);
    rows = rows < 16 ? 16 : rows / 16 * 16;
    if (rows < c->Lq) p.r0 = c->Lq - rows, p.rows = rows;
    return p;
}

/* One call of the case on input set r: the forward, or for a backward case the backward
 * (its O and LSE made once by prepare_backward). */
attn_status call_case(const bench_case *c, const case_buffers *cb, int r, int threads,
                      attn_path path) {
    case_tensors x = tensors_of(c, cb, r);
    attn_options opt = case_options(c, &x.mask, threads, path);
    if (path == ATTN_PATH_FUSED) opt.workspace = cb->ws, opt.workspace_bytes = cb->ws_bytes;
    if (c->bwd)
        return attn_backward(&x.q, &x.k, &x.v, &x.o, &x.d_o, &x.lse, &x.dq, &x.dk, &x.dv, &opt);
    return attn_forward(&x.q, &x.k, &x.v, &x.o, &opt);
}

attn_status call_case_static(const bench_case *c, const case_buffers *cb, int r, int threads) {
    case_tensors x = tensors_of(c, cb, r);
    attn_options opt = case_options(c, &x.mask, threads, ATTN_PATH_FUSED);
    opt.workspace = cb->ws, opt.workspace_bytes = cb->ws_bytes;
    const attn_tune_config none = {0};  // every field the static choice's
    if (c->bwd)
        return ai_backward_forced(&none, &x.q, &x.k, &x.v, &x.o, &x.d_o, &x.lse, &x.dq, &x.dk,
                                  &x.dv, &opt);
    return ai_forward_forced(&none, &x.q, &x.k, &x.v, &x.o, &opt);
}

/* A backward case's O and LSE: the fused forward on set 0, copied to the other sets. */
int prepare_backward(bench_case *c, case_buffers *cb, int threads) {
    case_tensors t = tensors_of(c, cb, 0);
    attn_options opt = case_options(c, &t.mask, threads, ATTN_PATH_FUSED);
    opt.lse = &t.lse;
    if (call_failed(c, attn_forward(&t.q, &t.k, &t.v, &t.o, &opt), "forward for the backward"))
        return -1;
    for (int r = 1; r < cb->rot; r++) {
        memcpy(cb->o[r], cb->o[0], (size_t)n_o(c) * 4);
        memcpy(cb->lse[r], cb->lse[0], (size_t)n_lse(c) * 4);
    }
    return 0;
}

/* The contract's float32 tolerance (tools/common/tolerance.h) on n values against ref; the
 * worst so far is kept in c (a non-finite mismatch counts as an infinite error). */
static bool within_f32(bench_case *c, const float *got, const float *ref, int64_t n) {
    tol_acc acc = tol_start();
    for (int64_t i = 0; i < n; i++) tol_add(&acc, i, got[i], ref[i]);
    tol_result r;
    const bool ok = tol_pass(&acc, &r);
    const double rel = r.nonfinite_mismatch ? INFINITY : r.rel_err;
    const double max_abs = r.nonfinite_mismatch ? INFINITY : r.max_err, tol = 1e-5 * (1.0 + r.max_ref);
    if (!(rel <= c->rel_fro)) c->rel_fro = rel;
    if (!(max_abs / tol <= c->max_abs / (c->tol_abs > 0 ? c->tol_abs : 1)))
        c->max_abs = max_abs, c->tol_abs = tol;
    return ok;
}

/* A backward case: the fused gradients of the whole case against the float64 reference
 * backward (ATTN_PATH_REFERENCE, which recomputes everything from Q, K, V) on batch 0 and
 * the query heads of the first key/value head (one head without grouping) when the
 * whole case is over the budget: dK and dV need every row, so no row subset. */
static int check_backward(bench_case *c, case_buffers *cb, int threads, bool plant, double budget) {
    if (call_failed(c, call_case(c, cb, 0, threads, ATTN_PATH_FUSED), "fused backward")) return -1;
    int64_t hq = c->Hq, hkv = c->Hkv, b = c->B;
    const double whole = (double)c->B * (double)c->Hq * (double)c->Lq * (double)c->Lk *
                         (double)(c->Dk + c->Dv) * 2.5;
    if (whole > budget) b = 1, hkv = 1, hq = c->Hq / c->Hkv;
    if (b == c->B && hq == c->Hq) snprintf(c->checked, sizeof c->checked, "all");
    else snprintf(c->checked, sizeof c->checked, "b 0, heads 0..%lld, all rows, dQ dK dV",
                  (long long)(hq - 1));
    const int64_t nq = b * hq * c->Lq * c->Dk, nk = b * hkv * c->Lk * c->Dk,
                  nv = b * hkv * c->Lk * c->Dv;
    float *rq = malloc((size_t)(nq + nk + nv) * sizeof(float) + 64);
    if (!rq) return snprintf(c->error, sizeof c->error, "out of memory for the check"), -1;
    float *rk = rq + nq, *rv = rk + nk;
    case_tensors t = tensors_of(c, cb, 0);
    attn_tensor *sub[] = {&t.q, &t.k, &t.v, &t.o, &t.d_o, &t.lse, &t.dq, &t.dk, &t.dv};
    for (int i = 0; i < 9; i++) {
        const bool kv = i == 1 || i == 2 || i == 7 || i == 8;
        sub[i]->shape[0] = b, sub[i]->shape[1] = kv ? hkv : hq;
    }
    t.dq.data = rq, t.dk.data = rk, t.dv.data = rv;
    attn_options ropt = case_options(c, &t.mask, threads, ATTN_PATH_REFERENCE);
    attn_status st = attn_backward(&t.q, &t.k, &t.v, &t.o, &t.d_o, &t.lse, &t.dq, &t.dk, &t.dv, &ropt);
    if (call_failed(c, st, "reference backward")) return free(rq), -1;
    if (plant) cb->dk[0][nk / 2] += 1e-3f * (1.0f + fabsf(cb->dk[0][nk / 2]));
    c->rel_fro = c->max_abs = c->tol_abs = 0;
    /* batch 0's heads are the first elements of each gradient */
    bool ok = within_f32(c, cb->dq[0], rq, nq);
    ok = within_f32(c, cb->dk[0], rk, nk) && ok;
    ok = within_f32(c, cb->dv[0], rv, nv) && ok;
    c->pass = ok;
    free(rq);
    return 0;
}

int check_case(bench_case *c, case_buffers *cb, int threads, bool plant,
               double budget) {
    if (c->bwd) return check_backward(c, cb, threads, plant, budget);
    if (call_failed(c, call_case(c, cb, 0, threads, ATTN_PATH_FUSED), "fused")) return -1;
    case_tensors t = tensors_of(c, cb, 0);

    const check_part p = pick_check(c, budget);
    const bool whole = p.b == c->B && p.hq == c->Hq && p.rows == c->Lq;
    if (whole)
        snprintf(c->checked, sizeof c->checked, "all");
    else
        snprintf(c->checked, sizeof c->checked, "b 0..%lld, heads 0..%lld, rows %lld..%lld",
                 (long long)(p.b - 1), (long long)(p.hq - 1), (long long)p.r0,
                 (long long)(p.r0 + p.rows - 1));
    const int64_t n_ref = p.b * p.hq * p.rows * c->Dv;
    float *ref = malloc((size_t)n_ref * sizeof(float) + 64);
    if (!ref) return snprintf(c->error, sizeof c->error, "out of memory for the check"), -1;
    attn_tensor q = t.q, mask = t.mask;
    q.data = (char *)cb->q[0] + p.r0 * c->Dk * attn_dtype_size(c->qdt);
    q.shape[0] = p.b, q.shape[1] = p.hq, q.shape[2] = p.rows;
    attn_tensor k = t.k, v = t.v;
    k.shape[0] = v.shape[0] = p.b;
    k.shape[1] = v.shape[1] = p.hkv;
    mask.data = cb->mask ? cb->mask + p.r0 * c->Lk : NULL;
    mask.shape[2] = p.rows;
    /* the reference of the same (16-bit) inputs, its output in float32 */
    attn_tensor o = attn_tensor_4d(ref, ATTN_F32, p.b, p.hq, p.rows, c->Dv);
    attn_options ropt = case_options(c, &mask, threads, ATTN_PATH_REFERENCE);
    if (p.r0 > 0) ropt.align = ATTN_ALIGN_BOTTOM_RIGHT;  /* see pick_check */
    attn_status st = attn_forward(&q, &k, &v, &o, &ropt);
    if (call_failed(c, st, "reference")) return free(ref), -1;

    /* the fused output of the checked part, as float */
    float *fused = malloc((size_t)n_ref * sizeof(float) + 64);
    if (!fused) return free(ref), snprintf(c->error, sizeof c->error, "out of memory for the check"), -1;
    for (int64_t b = 0; b < p.b; b++)
        for (int64_t h = 0; h < p.hq; h++)
            for (int64_t i = 0; i < p.rows; i++)
                for (int64_t d = 0; d < c->Dv; d++)
                    fused[((b * p.hq + h) * p.rows + i) * c->Dv + d] =
                        elem(c->qdt, cb->o[0], ((b * c->Hq + h) * c->Lq + p.r0 + i) * c->Dv + d);
    const bool half = c->qdt != ATTN_F32 || c->kvdt != ATTN_F32;
    if (plant) {
        const int64_t at = (p.rows / 2) * c->Dv;
        fused[at] += (half ? 0.25f : 1e-3f) * (1.0f + fabsf(fused[at]));
    }
    if (!half) {
        c->rel_fro = c->max_abs = c->tol_abs = 0;
        c->pass = within_f32(c, fused, ref, n_ref);
        free(fused), free(ref);
        return 0;
    }
    /* 16-bit: the half-precision rule of the contract (tests/test_half.c): max error
     * against float64 at most twice that of a naive implementation computing in the same
     * 16-bit type (tools/common/naive.c, the KV type), on the same inputs and the same part,
     * plus float32 noise (2^-23 (1 + max|ref|)) for where the naive one happens to be exact */
    const int64_t nq = p.b * p.hq * p.rows * c->Dk;
    float *q32 = malloc((size_t)(nq + n_ref) * sizeof(float) + 64);
    if (!q32) return free(fused), free(ref), snprintf(c->error, sizeof c->error, "out of memory"), -1;
    float *naive = q32 + nq;
    for (int64_t b = 0; b < p.b; b++)
        for (int64_t h = 0; h < p.hq; h++)
            memcpy(q32 + ((b * p.hq + h) * p.rows) * c->Dk,
                   cb->q32 + ((b * c->Hq + h) * c->Lq + p.r0) * c->Dk,
                   (size_t)(p.rows * c->Dk) * sizeof(float));
    if (naive_attention(c->kvdt, p.b, p.hq, p.hkv, p.rows, c->Lk, c->Dk, c->Dv, q32, cb->k32,
                        cb->v32, NULL, (float)(1.0 / sqrt((double)c->Dk)), naive) != 0)
        return free(q32), free(fused), free(ref),
               snprintf(c->error, sizeof c->error, "out of memory for the naive check"), -1;
    double err2 = 0, ref2 = 0, max_abs = 0, max_ref = 0, naive_err = 0;
    for (int64_t i = 0; i < n_ref; i++) {
        const double e = (double)fused[i] - (double)ref[i];
        err2 += e * e;
        ref2 += (double)ref[i] * (double)ref[i];
        if (!(fabs(e) <= max_abs)) max_abs = fabs(e);
        if (fabs((double)ref[i]) > max_ref) max_ref = fabs((double)ref[i]);
        const double ne = fabs((double)naive[i] - (double)ref[i]);
        if (!(ne <= naive_err)) naive_err = ne;
    }
    c->rel_fro = ref2 > 0 ? sqrt(err2 / ref2) : sqrt(err2);
    c->max_abs = max_abs;
    c->naive_err = naive_err;
    c->tol_abs = 2 * naive_err + 0x1p-23 * (1 + max_ref);
    c->pass = max_abs <= c->tol_abs;
    free(q32), free(fused), free(ref);
    return 0;
}
