/*
 * test_nomem.c — allocation failure at every point of a call: in a build with
 * -DATTN_FAULT_INJECTION (the sanitizer run of scripts/check.sh, src/core/alloc.h), each call
 * below is run once to count its allocations, then once per allocation with that one
 * made to fail. Each failing run must return ATTN_ERR_NOMEM and leave every output byte
 * as it was; LeakSanitizer (the same build) reports anything it failed to free. In any
 * other build there is nothing to inject and the suite says so (0 checks).
 *
 * The calls: forward on both paths (with lse and weights, with a mask), forward with
 * float16 and bfloat16 tensors, backward on both paths, backward with float16 tensors
 * (which runs a forward of its own inside); and the library's other calls: attn_merge,
 * attn_weights_grid, additive attention forward and backward, the multi-head layer's
 * forward, backward and decoding step. A new attention call that allocates gets a line in CASES, another call a
 * test_*_call of its own. (Memory the BLAS allocates inside its own calls is not the
 * library's and is not injected.)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "attn.h"
#include "check.h"
#include "core/half.h"

enum { POISON = 0xA5 };

/* One call's tensors, dense, filled with small deterministic values. */
typedef struct call_bufs {
    attn_dtype in_dt, out_dt;
    int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
    void *q, *k, *v, *o, *d_o, *dq, *dk, *dv;
    float *lse, *w;
    unsigned char *mask;
} call_bufs;

static size_t dsize(attn_dtype t) { return t == ATTN_F32 ? 4 : 2; }

static void *filled(attn_dtype t, int64_t n, uint32_t seed) {
    void *p = malloc((size_t)(n > 0 ? n : 1) * dsize(t));
    if (!p) exit(2);
    for (int64_t e = 0; e < n; e++) {
        seed = seed * 1664525u + 1013904223u;
        attn_store(t, p, e, (float)((int32_t)(seed >> 8) % 2001) / 1000.0f);
    }
    return p;
}

/* Q's dtype: the inputs', except under a bfloat16 cache (float32 queries) */
static attn_dtype q_dtype(attn_dtype in_dt) { return in_dt == ATTN_BF16 ? ATTN_F32 : in_dt; }

static void bufs_init(call_bufs *c, attn_dtype in_dt, attn_dtype out_dt) {
    *c = (call_bufs){.in_dt = in_dt, .out_dt = out_dt, .B = 2, .Hq = 4, .Hkv = 2, .Lq = 37,
                     .Lk = 70, .Dk = 16, .Dv = 24};
    const int64_t nq = c->B * c->Hq * c->Lq, nk = c->B * c->Hkv * c->Lk;
    c->q = filled(q_dtype(in_dt), nq * c->Dk, 1);
    c->k = filled(in_dt, nk * c->Dk, 2);
    c->v = filled(in_dt, nk * c->Dv, 3);
    c->o = filled(out_dt, nq * c->Dv, 4);
    c->d_o = filled(out_dt, nq * c->Dv, 5);
    c->dq = filled(out_dt, nq * c->Dk, 6);
    c->dk = filled(out_dt, nk * c->Dk, 7);
    c->dv = filled(out_dt, nk * c->Dv, 8);
    c->lse = filled(ATTN_F32, nq, 9);
    c->w = filled(ATTN_F32, nq * c->Lk, 10);
    c->mask = malloc((size_t)(c->Lq * c->Lk));
    if (!c->mask) exit(2);
    for (int64_t e = 0; e < c->Lq * c->Lk; e++) c->mask[e] = (unsigned char)(e % 7 != 3);
}

static void bufs_free(call_bufs *c) {
    void *all[] = {c->q, c->k, c->v, c->o, c->d_o, c->dq, c->dk, c->dv, c->lse, c->w, c->mask};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

/* ---- the calls ------------------------------------------------------------------------
 * Each writes its outputs (listed by outputs()) and returns the call's status. */

typedef struct call_case {
    const char *name;
    attn_dtype in_dt, out_dt;
    attn_path path;
    bool backward, extras;  // extras: lse, weights and a bool mask (forward only)
} call_case;

static const call_case CASES[] = {
    {"forward fused f32 (lse, weights, mask)", ATTN_F32, ATTN_F32, ATTN_PATH_FUSED, false, true},
    {"forward reference f32 (lse, weights, mask)", ATTN_F32, ATTN_F32, ATTN_PATH_REFERENCE, false, true},
    {"forward fused f16", ATTN_F16, ATTN_F16, ATTN_PATH_FUSED, false, false},
    {"forward fused bf16 K/V, f32 Q/O", ATTN_BF16, ATTN_F32, ATTN_PATH_FUSED, false, false},
    {"backward fused f32", ATTN_F32, ATTN_F32, ATTN_PATH_FUSED, true, false},
    {"backward reference f32", ATTN_F32, ATTN_F32, ATTN_PATH_REFERENCE, true, false},
    {"backward fused f16", ATTN_F16, ATTN_F16, ATTN_PATH_FUSED, true, false},
    {"backward reference f16", ATTN_F16, ATTN_F16, ATTN_PATH_REFERENCE, true, false},
};

typedef struct out_span {
    void *p;
    size_t bytes;
} out_span;

/* The buffers the call may write, with their sizes; returns how many. */
static int outputs(const call_case *cc, const call_bufs *c, out_span *s) {
    const int64_t nq = c->B * c->Hq * c->Lq, nk = c->B * c->Hkv * c->Lk;
    const size_t es = dsize(c->out_dt);
    int n = 0;
    if (cc->backward) {
        s[n++] = (out_span){c->dq, (size_t)(nq * c->Dk) * es};
        s[n++] = (out_span){c->dk, (size_t)(nk * c->Dk) * es};
        s[n++] = (out_span){c->dv, (size_t)(nk * c->Dv) * es};
    } else {
        s[n++] = (out_span){c->o, (size_t)(nq * c->Dv) * es};
        if (cc->extras) {
            s[n++] = (out_span){c->lse, (size_t)nq * 4};
            s[n++] = (out_span){c->w, (size_t)(nq * c->Lk) * 4};
        }
    }
    return n;
}

static attn_status run_case(const call_case *cc, call_bufs *c) {
    const attn_dtype qdt = q_dtype(cc->in_dt);
    attn_tensor q = attn_tensor_4d(c->q, qdt, c->B, c->Hq, c->Lq, c->Dk);
    attn_tensor k = attn_tensor_4d(c->k, cc->in_dt, c->B, c->Hkv, c->Lk, c->Dk);
    attn_tensor v = attn_tensor_4d(c->v, cc->in_dt, c->B, c->Hkv, c->Lk, c->Dv);
    attn_tensor o = attn_tensor_4d(c->o, c->out_dt, c->B, c->Hq, c->Lq, c->Dv);
    attn_tensor lse = attn_tensor_4d(c->lse, ATTN_F32, c->B, c->Hq, c->Lq, 1);
    attn_tensor w = attn_tensor_4d(c->w, ATTN_F32, c->B, c->Hq, c->Lq, c->Lk);
    attn_tensor mask = attn_tensor_4d(c->mask, ATTN_BOOL, 1, 1, c->Lq, c->Lk);
    mask.stride[0] = mask.stride[1] = 0;
    attn_options opt = {.causal = true, .path = cc->path, .threads = 2};
    if (!cc->backward) {
        if (cc->extras) {
            opt.lse = &lse;
            opt.weights = &w;
            opt.mask = &mask;
        }
        return attn_forward(&q, &k, &v, &o, &opt);
    }
    attn_tensor d_o = attn_tensor_4d(c->d_o, c->out_dt, c->B, c->Hq, c->Lq, c->Dv);
    attn_tensor dq = attn_tensor_4d(c->dq, c->out_dt, c->B, c->Hq, c->Lq, c->Dk);
    attn_tensor dk = attn_tensor_4d(c->dk, c->out_dt, c->B, c->Hkv, c->Lk, c->Dk);
    attn_tensor dv = attn_tensor_4d(c->dv, c->out_dt, c->B, c->Hkv, c->Lk, c->Dv);
    return attn_backward(&q, &k, &v, &o, &d_o, &lse, &dq, &dk, &dv, &opt);
}

#ifdef ATTN_FAULT_INJECTION
static int64_t g_points;  // allocation points failed, over all cases

static bool untouched(const out_span *s, int n) {
    for (int i = 0; i < n; i++)
        for (size_t b = 0; b < s[i].bytes; b++)
            if (((const unsigned char *)s[i].p)[b] != POISON) return false;
    return true;
}

static void poison(const out_span *s, int n) {
    for (int i = 0; i < n; i++) memset(s[i].p, POISON, s[i].bytes);
}

/* The call run(ctx), whose outputs are s[0..ns): once to count its allocations, then
 * once per allocation with that one failing (ATTN_ERR_NOMEM, nothing written, no later
 * allocation tried), then once more with memory again. */
static void fail_each(const char *name, attn_status (*run)(void *), void *ctx, const out_span *s,
                      int ns) {
    ai_fault_arm(0);
    poison(s, ns);
    attn_status st = run(ctx);
    const int64_t n_alloc = ai_fault_count();
    CHECK(st == ATTN_OK, "%s: clean call: status %d (%s)", name, (int)st, attn_last_error());
    CHECK(n_alloc >= 1, "%s: no allocation counted: the call allocates its workspace",
          name);
    CHECK(!untouched(s, ns), "%s: clean call wrote nothing", name);

    for (int64_t n = 1; n <= n_alloc; n++) {
        poison(s, ns);
        ai_fault_arm(n);
        st = run(ctx);
        const int64_t tried = ai_fault_count();
        ai_fault_arm(0);
        CHECK(st == ATTN_ERR_NOMEM, "%s: allocation %lld of %lld failed: status %d, expected "
              "ATTN_ERR_NOMEM", name, (long long)n, (long long)n_alloc, (int)st);
        CHECK(untouched(s, ns), "%s: allocation %lld of %lld failed, yet an output was "
              "written", name, (long long)n, (long long)n_alloc);
        CHECK(tried == n, "%s: allocation %lld failed, yet the call went on to %lld", name,
              (long long)n, (long long)tried);
        g_points++;
    }
    /* and the next call, with memory again, succeeds */
    poison(s, ns);
    st = run(ctx);
    CHECK(st == ATTN_OK && !untouched(s, ns), "%s: the call after the failures: status %d",
          name, (int)st);
    printf("  %-44s %lld allocation point(s) failed\n", name, (long long)n_alloc);
}

typedef struct case_ctx {
    const call_case *cc;
    call_bufs *c;
} case_ctx;
static attn_status run_case_ctx(void *x) {
    const case_ctx *k = x;
    return run_case(k->cc, k->c);
}

static void test_case(const call_case *cc) {
    call_bufs c;
    bufs_init(&c, cc->in_dt, cc->out_dt);
    out_span s[3];
    const int ns = outputs(cc, &c, s);

    /* the forward's O and LSE for a backward call, from a clean forward */
    if (cc->backward) {
        attn_tensor lse = attn_tensor_4d(c.lse, ATTN_F32, c.B, c.Hq, c.Lq, 1);
        attn_options opt = {.causal = true, .lse = &lse};
        const attn_dtype qdt = q_dtype(cc->in_dt);
        attn_tensor q = attn_tensor_4d(c.q, qdt, c.B, c.Hq, c.Lq, c.Dk);
        attn_tensor k = attn_tensor_4d(c.k, cc->in_dt, c.B, c.Hkv, c.Lk, c.Dk);
        attn_tensor v = attn_tensor_4d(c.v, cc->in_dt, c.B, c.Hkv, c.Lk, c.Dv);
        attn_tensor o = attn_tensor_4d(c.o, c.out_dt, c.B, c.Hq, c.Lq, c.Dv);
        CHECK(attn_forward(&q, &k, &v, &o, &opt) == ATTN_OK, "%s: the forward before: %s",
              cc->name, attn_last_error());
    }

    fail_each(cc->name, run_case_ctx, &(case_ctx){cc, &c}, s, ns);
    bufs_free(&c);
}

/* ---- the other calls of the library: the merge, the weights' grid, additive attention
 * and the multi-head layer, each on small dense float32 tensors ------------------------ */

static float *fill32(int64_t n, uint32_t seed) { return filled(ATTN_F32, n, seed); }

static attn_tensor t4(float *p, int64_t a, int64_t b, int64_t c, int64_t d) {
    return attn_tensor_4d(p, ATTN_F32, a, b, c, d);
}

typedef struct merge_ctx {
    attn_tensor o_parts[3], lse_parts[3], o, lse;
} merge_ctx;
static attn_status run_merge(void *x) {
    merge_ctx *m = x;
    return attn_merge(3, m->o_parts, m->lse_parts, &m->o, &m->lse, 2);
}
static void test_merge_call(void) {
    enum { B = 2, H = 2, L = 5, D = 8 };
    merge_ctx m;
    float *buf[8];
    for (int c = 0; c < 3; c++) {
        buf[2 * c] = fill32(B * H * L * D, 20 + c), buf[2 * c + 1] = fill32(B * H * L, 30 + c);
        m.o_parts[c] = t4(buf[2 * c], B, H, L, D), m.lse_parts[c] = t4(buf[2 * c + 1], B, H, L, 1);
    }
    buf[6] = fill32(B * H * L * D, 40), buf[7] = fill32(B * H * L, 41);
    m.o = t4(buf[6], B, H, L, D), m.lse = t4(buf[7], B, H, L, 1);
    const out_span s[2] = {{buf[6], B * H * L * D * 4}, {buf[7], B * H * L * 4}};
    fail_each("attn_merge (3 partials)", run_merge, &m, s, 2);
    for (int i = 0; i < 8; i++) free(buf[i]);
}

typedef struct grid_ctx {
    attn_tensor q, k, lse, grid;
    attn_options opt;
} grid_ctx;
static attn_status run_grid(void *x) {
    grid_ctx *g = x;
    return attn_weights_grid(&g->q, &g->k, &g->lse, &g->grid, ATTN_REDUCE_SUM, &g->opt);
}
static void test_grid_call(void) {
    enum { B = 1, H = 2, LQ = 9, LK = 13, D = 8, R = 3, C = 4 };
    float *q = fill32(B * H * LQ * D, 50), *k = fill32(B * H * LK * D, 51);
    float *v = fill32(B * H * LK * D, 52), *o = fill32(B * H * LQ * D, 53);
    float *lse = fill32(B * H * LQ, 54), *grid = fill32(B * H * R * C, 55);
    grid_ctx g = {t4(q, B, H, LQ, D), t4(k, B, H, LK, D), t4(lse, B, H, LQ, 1),
                  t4(grid, B, H, R, C), {.causal = true, .threads = 2}};
    attn_tensor tv = t4(v, B, H, LK, D), to = t4(o, B, H, LQ, D);
    attn_options fo = {.causal = true, .lse = &g.lse};
    CHECK(attn_forward(&g.q, &g.k, &tv, &to, &fo) == ATTN_OK, "weights grid: the forward before");
    const out_span s[1] = {{grid, B * H * R * C * 4}};
    fail_each("attn_weights_grid (fused)", run_grid, &g, s, 1);
    free(q), free(k), free(v), free(o), free(lse), free(grid);
}

typedef struct additive_ctx {
    attn_tensor q, k, v, o, lse, d_o, dq, dk, dv;
    attn_additive_weights w;
    attn_additive_grads g;
    attn_options opt;
    bool backward;
} additive_ctx;
static attn_status run_additive(void *x) {
    additive_ctx *a = x;
    if (!a->backward) return attn_additive_forward(&a->q, &a->k, &a->v, &a->w, &a->o, &a->opt);
    attn_options bo = a->opt;
    bo.lse = NULL;
    return attn_additive_backward(&a->q, &a->k, &a->v, &a->w, &a->o, &a->d_o, &a->lse, &a->dq,
                                  &a->dk, &a->dv, &a->g, &bo);
}
static void test_additive_calls(void) {
    enum { B = 2, LQ = 7, LK = 11, DQ = 6, DK = 5, DV = 4, A = 8 };
    float *q = fill32(B * LQ * DQ, 60), *k = fill32(B * LK * DK, 61), *v = fill32(B * LK * DV, 62);
    float *o = fill32(B * LQ * DV, 63), *lse = fill32(B * LQ, 64), *d_o = fill32(B * LQ * DV, 65);
    float *dq = fill32(B * LQ * DQ, 66), *dk = fill32(B * LK * DK, 67), *dv = fill32(B * LK * DV, 68);
    float *W = fill32(DQ * A, 69), *U = fill32(DK * A, 70), *va = fill32(A, 71), *ba = fill32(A, 72);
    float *dW = fill32(DQ * A, 73), *dU = fill32(DK * A, 74), *dva = fill32(A, 75), *dba = fill32(A, 76);
    additive_ctx a = {t4(q, B, 1, LQ, DQ), t4(k, B, 1, LK, DK), t4(v, B, 1, LK, DV),
                      t4(o, B, 1, LQ, DV), t4(lse, B, 1, LQ, 1), t4(d_o, B, 1, LQ, DV),
                      t4(dq, B, 1, LQ, DQ), t4(dk, B, 1, LK, DK), t4(dv, B, 1, LK, DV),
                      {A, W, U, va, ba, false, 0.0f}, {dW, dU, dva, dba, NULL},
                      {.causal = true, .threads = 2}, false};
    a.opt.lse = &a.lse;
    const out_span fs[2] = {{o, B * LQ * DV * 4}, {lse, B * LQ * 4}};
    fail_each("attn_additive_forward (fused, lse)", run_additive, &a, fs, 2);
    CHECK(run_additive(&a) == ATTN_OK, "additive: the forward before the backward");
    a.backward = true;
    const out_span bs[7] = {{dq, B * LQ * DQ * 4}, {dk, B * LK * DK * 4}, {dv, B * LK * DV * 4},
                            {dW, DQ * A * 4},      {dU, DK * A * 4},      {dva, A * 4},
                            {dba, A * 4}};
    fail_each("attn_additive_backward (fused)", run_additive, &a, bs, 7);
    float *all[] = {q, k, v, o, lse, d_o, dq, dk, dv, W, U, va, ba, dW, dU, dva, dba};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

typedef struct mha_ctx {
    attn_mha m;
    attn_tensor x, y, wt[4], bt[4], dy, dx, dw[4], db[4];
    attn_mha_grads g;
    attn_kv_cache cache;
    int64_t len0[2];
    attn_options opt;
    int which;  /* 0 forward, 1 backward, 2 a decoding step */
} mha_ctx;
static attn_status run_mha(void *p) {
    mha_ctx *c = p;
    if (c->which == 0) return attn_mha_forward(&c->m, &c->x, NULL, &c->y, NULL, false, &c->opt);
    if (c->which == 1) return attn_mha_backward(&c->m, &c->x, NULL, &c->dy, &c->g, &c->opt);
    memcpy(c->cache.len, c->len0, sizeof c->len0);  /* each step from the same cache state */
    attn_options o = {.threads = 2};
    return attn_mha_decode(&c->m, &c->x, &c->cache, &c->y, &o);
}
static void test_mha_call(void) {
    enum { B = 2, L = 5, E = 16, HQ = 4, HKV = 2, D = 4 };
    const int64_t out[4] = {HQ * D, HKV * D, HKV * D, E}, in[4] = {E, E, E, HQ * D};
    float *x = fill32(B * L * E, 80), *y = fill32(B * L * E, 81), *w[4], *b[4];
    mha_ctx c = {.x = t4(x, B, L, E, 1), .y = t4(y, B, L, E, 1), .opt = {.causal = true, .threads = 2}};
    for (int i = 0; i < 4; i++) {
        w[i] = fill32(in[i] * out[i], 82 + i), b[i] = fill32(out[i], 90 + i);
        c.wt[i] = t4(w[i], in[i], out[i], 1, 1), c.bt[i] = t4(b[i], out[i], 1, 1, 1);
    }
    c.m = (attn_mha){HQ, HKV, &c.wt[0], &c.wt[1], &c.wt[2], &c.wt[3],
                     &c.bt[0], &c.bt[1], &c.bt[2], &c.bt[3], {0}};
    const out_span s[1] = {{y, B * L * E * 4}};
    fail_each("attn_mha_forward (self, causal, GQA)", run_mha, &c, s, 1);

    /* the backward: dx and every weight's and bias's gradient */
    float *dy = fill32(B * L * E, 100), *dx = fill32(B * L * E, 101), *dw[4], *db[4];
    out_span bs[9] = {{dx, B * L * E * 4}};
    c.dy = t4(dy, B, L, E, 1), c.dx = t4(dx, B, L, E, 1);
    for (int i = 0; i < 4; i++) {
        dw[i] = fill32(in[i] * out[i], 102 + i), db[i] = fill32(out[i], 110 + i);
        c.dw[i] = t4(dw[i], in[i], out[i], 1, 1), c.db[i] = t4(db[i], out[i], 1, 1, 1);
        bs[1 + i] = (out_span){dw[i], (size_t)(in[i] * out[i]) * 4};
        bs[5 + i] = (out_span){db[i], (size_t)out[i] * 4};
    }
    c.g = (attn_mha_grads){&c.dx, NULL, &c.dw[0], &c.dw[1], &c.dw[2], &c.dw[3],
                           &c.db[0], &c.db[1], &c.db[2], &c.db[3]};
    c.which = 1;
    fail_each("attn_mha_backward (self, causal, GQA)", run_mha, &c, bs, 9);

    /* a decoding step of 2 new tokens into a cache of 8 rows holding 3: y, the cache's
     * rows and its lengths must stay as they were when it fails */
    enum { LMAX = 8, NEW = 2 };
    float *ck = fill32(B * HKV * LMAX * D, 120), *cv = fill32(B * HKV * LMAX * D, 121);
    float *xn = fill32(B * NEW * E, 122), *yn = fill32(B * NEW * E, 123);
    int64_t len[2] = {3, 3};
    c.len0[0] = c.len0[1] = 3;
    c.cache = (attn_kv_cache){ATTN_CACHE_CONTIGUOUS, t4(ck, B, HKV, LMAX, D), t4(cv, B, HKV, LMAX, D), len, NULL, NULL, NULL};
    c.x = t4(xn, B, NEW, E, 1), c.y = t4(yn, B, NEW, E, 1);
    c.which = 2;
    const out_span ds[3] = {{yn, B * NEW * E * 4}, {ck, B * HKV * LMAX * D * 4}, {cv, B * HKV * LMAX * D * 4}};
    fail_each("attn_mha_decode (contiguous cache)", run_mha, &c, ds, 3);
    /* the same step over a paged cache (ATTN_CACHE_PAGED): the same storage as pools of
     * 8 pages of 2 rows, sequence b on pages 4b .. 4b + 3 in reverse order */
    int32_t table[2 * 4] = {3, 2, 1, 0, 7, 6, 5, 4};
    attn_tensor bt = {table, ATTN_I32, {B, 4, 1, 1}, {4, 1, 1, 1}};
    c.cache = (attn_kv_cache){ATTN_CACHE_PAGED, t4(ck, 8, HKV, 2, D), t4(cv, 8, HKV, 2, D), len, &bt, NULL, NULL};
    fail_each("attn_mha_decode (paged cache)", run_mha, &c, ds, 3);
    free(x), free(y), free(dy), free(dx), free(ck), free(cv), free(xn), free(yn);
    for (int i = 0; i < 4; i++) free(w[i]), free(b[i]), free(dw[i]), free(db[i]);
}
#endif

int main(void) {
#ifdef ATTN_FAULT_INJECTION
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) test_case(&CASES[i]);
    test_merge_call();
    test_grid_call();
    test_additive_calls();
    test_mha_call();
    printf("test_nomem: %lld allocation points failed over %zu calls\n", (long long)g_points,
           sizeof CASES / sizeof CASES[0] + 7);
#else
    (void)CASES;
    (void)run_case;
    (void)outputs;
    (void)bufs_init;
    (void)bufs_free;
    printf("test_nomem: skipped, not a fault-injection build (make SAN=-DATTN_FAULT_INJECTION, "
           "as scripts/check.sh's sanitizer run does)\n");
#endif
    return check_summary("test_nomem");
}
