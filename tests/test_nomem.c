/*
 * test_nomem.c — allocation failure at every point of a call: in a build with
 * -DATTN_FAULT_INJECTION (the sanitizer run of scripts/check.sh, src/alloc.h), each call
 * below is run once to count its allocations, then once per allocation with that one
 * made to fail. Each failing run must return ATTN_ERR_NOMEM and leave every output byte
 * as it was; LeakSanitizer (the same build) reports anything it failed to free. In any
 * other build there is nothing to inject and the suite says so (0 checks).
 *
 * The calls: forward on both paths (with lse and weights, with a mask), forward with
 * float16 and bfloat16 tensors, backward on both paths, backward with float16 tensors
 * (which runs a forward of its own inside). A new call that allocates gets a line in
 * CASES.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "attn.h"
#include "check.h"
#include "half.h"

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

    attn_fault_arm(0);
    poison(s, ns);
    attn_status st = run_case(cc, &c);
    const int64_t n_alloc = attn_fault_count();
    CHECK(st == ATTN_OK, "%s: clean call: status %d (%s)", cc->name, (int)st, attn_last_error());
    CHECK(n_alloc >= 1, "%s: no allocation counted: the call allocates its workspace",
          cc->name);
    CHECK(!untouched(s, ns), "%s: clean call wrote nothing", cc->name);

    for (int64_t n = 1; n <= n_alloc; n++) {
        poison(s, ns);
        attn_fault_arm(n);
        st = run_case(cc, &c);
        const int64_t tried = attn_fault_count();
        attn_fault_arm(0);
        CHECK(st == ATTN_ERR_NOMEM, "%s: allocation %lld of %lld failed: status %d, expected "
              "ATTN_ERR_NOMEM", cc->name, (long long)n, (long long)n_alloc, (int)st);
        CHECK(untouched(s, ns), "%s: allocation %lld of %lld failed, yet an output was "
              "written", cc->name, (long long)n, (long long)n_alloc);
        CHECK(tried == n, "%s: allocation %lld failed, yet the call went on to %lld", cc->name,
              (long long)n, (long long)tried);
        g_points++;
    }
    /* and the next call, with memory again, succeeds */
    poison(s, ns);
    st = run_case(cc, &c);
    CHECK(st == ATTN_OK && !untouched(s, ns), "%s: the call after the failures: status %d",
          cc->name, (int)st);
    printf("  %-44s %lld allocation point(s) failed\n", cc->name, (long long)n_alloc);
    bufs_free(&c);
}
#endif

int main(void) {
#ifdef ATTN_FAULT_INJECTION
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) test_case(&CASES[i]);
    printf("test_nomem: %lld allocation points failed over %zu calls\n", (long long)g_points,
           sizeof CASES / sizeof CASES[0]);
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
