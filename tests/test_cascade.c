/*
 * test_cascade.c — attn_cascade_forward: shared-prefix attention, one call over a prefix
 *                  every sequence shares, one over the suffixes, merged.
 *
 * Every case is compared with its own float64 reference: plain attention of each
 * sequence b over its concatenated keys [prefix; suffix_b], written out here one row at a
 * time (over the values the cache holds: bfloat16 and q8_0 caches dequantized first),
 * at the contract's float32 tolerance, O and LSE. The cases cross
 *   B in {1, 3, 32}; Hq/Hkv 2/2, 4/2, 8/1; prefix and suffix lengths 0, 1, on, one under
 *   and one over a page of 16 (and pages of 1 and 64); ragged suffix lengths (kv_len)
 *   with zeros among them; a prefix kv_len under its length; float32, bfloat16 and q8_0
 *   caches, contiguous and paged (pages shuffled, every unused slot NaN); float32 and
 *   bfloat16 queries, dense and [B, Lq, Hq, D] (which cannot be seen as one batch: the
 *   copied path); Lq 1, 2, 3; sinks (one head -inf); softcap; bottom-right causal;
 *   one and two threads (bit-identical).
 * Then: empty parts (O 0, LSE -inf or the sink), the caller's workspace, every refusal
 * with its status and nothing written, and the tolerance shown failing twice: on a
 * planted error, and on the result of a merge whose partials each carried the sinks
 * (the error this call exists to avoid). The kernel is chosen by ATTN_ISA.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "check.h"
#include "core/half.h"
#include "oracle.h"

typedef struct ccase {
    int64_t B, Hq, Hkv, Lq, P, Smax, D;
    attn_dtype dt;       // the caches' dtype (prefix and suffixes)
    int64_t page;        // 0: contiguous parts; else both parts paged with this page size
    int64_t p_valid;     // the prefix's kv_len, -1 = none (all P keys)
    bool ragged;         // suffix lengths drawn per sequence (kv_len), else all Smax
    bool sinks, causal, q_bf16, q_perm;
    float softcap;
} ccase;

/* One part's keys or values: the cache (contiguous or a pool) and the float values it
 * holds, held [nb, Hkv, L, D]. */
typedef struct part {
    void *k, *v;               // cache bytes
    float *hk, *hv;            // held values, dense [nb, Hkv, L, D]
    int32_t *table;            // [nb, max_pages] or NULL
    attn_tensor tk, tv, tbl, tlen;
    int64_t *len;              // [nb] valid keys
    attn_cascade_kv kv;
} part;

static int64_t row_bytes(attn_dtype dt, int64_t D) {
    return dt == ATTN_Q8_0 ? D / 32 * 34 : D * (int64_t)attn_dtype_size(dt);
}

/* Rounds float values x [n] to dtype dt into cache bytes c, and the values it holds. */
static void to_cache(attn_dtype dt, const float *x, int64_t nb, int64_t H, int64_t L, int64_t D,
                     void *c, float *held) {
    const int64_t n = nb * H * L * D;
    if (dt == ATTN_F32) {
        memcpy(c, x, (size_t)n * 4), memcpy(held, x, (size_t)n * 4);
    } else if (dt == ATTN_BF16) {
        for (int64_t e = 0; e < n; e++)
            ((uint16_t *)c)[e] = attn_f32_to_bf16(x[e]), held[e] = attn_bf16_to_f32(((uint16_t *)c)[e]);
    } else {
        const attn_tensor src = attn_tensor_4d((void *)x, ATTN_F32, nb, H, L, D);
        const attn_tensor dst = attn_tensor_4d(c, ATTN_Q8_0, nb, H, L, D);
        const attn_tensor out = attn_tensor_4d(held, ATTN_F32, nb, H, L, D);
        if (n > 0 && (attn_quantize_q8_0(&src, &dst) != ATTN_OK || attn_dequantize_q8_0(&dst, &out) != ATTN_OK)) {
            fprintf(stderr, "q8_0: %s\n", attn_last_error());
            exit(2);
        }
    }
}

/* Builds a part of nb sequences of L keys each (len[b] of them valid). */
static void make_part(rng_t *r, const ccase *c, int64_t nb, int64_t L, const int64_t *len,
                      bool with_len, part *p) {
    memset(p, 0, sizeof *p);
    const int64_t H = c->Hkv, D = c->D, n = nb * H * L * D, rb = row_bytes(c->dt, D);
    float *x = xcalloc(n, 4);
    p->hk = xcalloc(n, 4), p->hv = xcalloc(n, 4);
    p->len = xcalloc(nb, sizeof(int64_t));
    memcpy(p->len, len, (size_t)nb * sizeof(int64_t));
    void *ck = xcalloc(nb * H * L, (size_t)rb), *cv = xcalloc(nb * H * L, (size_t)rb);
    for (int64_t e = 0; e < n; e++) x[e] = (float)rng_normal(r);
    to_cache(c->dt, x, nb, H, L, D, ck, p->hk);
    for (int64_t e = 0; e < n; e++) x[e] = (float)rng_normal(r);
    to_cache(c->dt, x, nb, H, L, D, cv, p->hv);
    free(x);
    if (!c->page) {
        p->k = ck, p->v = cv;
        p->tk = attn_tensor_4d(ck, c->dt, nb, H, L, D);
        p->tv = attn_tensor_4d(cv, c->dt, nb, H, L, D);
    } else {
        const int64_t ps = c->page, mp = (L + ps - 1) / ps > 0 ? (L + ps - 1) / ps : 1;
        const int64_t np = nb * mp + 2;  // two spare pages, never referenced
        int64_t *order = xcalloc(np, sizeof(int64_t));
        for (int64_t i = 0; i < np; i++) order[i] = i;
        for (int64_t i = np - 1; i > 0; i--) {
            const int64_t j = rng_int(r, i + 1), t = order[i];
            order[i] = order[j], order[j] = t;
        }
        p->k = xcalloc(np * H * ps, (size_t)rb), p->v = xcalloc(np * H * ps, (size_t)rb);
        memset(p->k, 0xff, (size_t)(np * H * ps * rb));  // NaN (float32, bfloat16, q8_0's scale)
        memset(p->v, 0xff, (size_t)(np * H * ps * rb));
        p->table = xcalloc(nb * mp, sizeof(int32_t));
        for (int64_t b = 0; b < nb; b++)
            for (int64_t pg = 0; pg < mp; pg++)
                p->table[b * mp + pg] = pg * ps < len[b] ? (int32_t)order[b * mp + pg] : -1;
        for (int64_t b = 0; b < nb; b++)
            for (int64_t g = 0; g < H; g++)
                for (int64_t j = 0; j < len[b]; j++) {
                    const int64_t src = ((b * H + g) * L + j) * rb;
                    const int64_t dst = ((p->table[b * mp + j / ps] * H + g) * ps + j % ps) * rb;
                    memcpy((char *)p->k + dst, (char *)ck + src, (size_t)rb);
                    memcpy((char *)p->v + dst, (char *)cv + src, (size_t)rb);
                }
        free(ck), free(cv), free(order);
        p->tk = attn_tensor_4d(p->k, c->dt, np, H, ps, D);
        p->tv = attn_tensor_4d(p->v, c->dt, np, H, ps, D);
        p->tbl = attn_tensor_4d(p->table, ATTN_I32, nb, mp, 1, 1);
        p->kv.block_table = &p->tbl;
        with_len = true;  // the pool's pages past len are NaN: the length is always given
    }
    p->tlen = attn_tensor_4d(p->len, ATTN_I64, nb, 1, 1, 1);
    p->kv.k = &p->tk, p->kv.v = &p->tv;
    if (with_len) p->kv.kv_len = &p->tlen;
}

static void free_part(part *p) {
    free(p->k), free(p->v), free(p->hk), free(p->hv), free(p->table), free(p->len);
}

/* The float64 reference: sequence b over [prefix rows < Pv; suffix rows < S_b]; mag the
 * rows' logit magnitudes for the LSE bound (oracle.h: oracle_logit_mag). */
static void reference(const ccase *c, const float *q, const part *pre, const part *suf,
                      const float *sinks, double *o, double *lse, double *mag) {
    const int64_t B = c->B, Hq = c->Hq, Lq = c->Lq, D = c->D, group = c->Hq / c->Hkv;
    const int64_t P = c->P, S = c->Smax;
    const double scale = 1.0 / sqrt((double)D);
    double *s = xcalloc(P + S + 1, sizeof(double));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < Lq; i++) {
                const int64_t g = h / group, pv = pre->len[0], sb = suf->len[b], n = pv + sb;
                const int64_t d_i = i + n - Lq, row = (b * Hq + h) * Lq + i;
                const float *q_i = q + row * D;
                double m = -INFINITY, a = sinks ? fabs(sinks[h]) : 0;
                int64_t kept = 0;
                for (int64_t j = 0; j < n; j++) {
                    const float *k_j = j < pv ? pre->hk + (g * P + j) * D
                                              : suf->hk + ((b * c->Hkv + g) * S + (j - pv)) * D;
                    double dot = 0, adot = 0;
                    for (int64_t e = 0; e < D; e++)
                        dot += (double)q_i[e] * k_j[e], adot += fabs((double)q_i[e] * k_j[e]);
                    double x = scale * dot;
                    if (scale * adot + c->softcap > a) a = scale * adot + c->softcap;
                    if (c->softcap > 0) x = c->softcap * tanh(x / c->softcap);
                    if (c->causal && j > d_i) x = -INFINITY;
                    s[j] = x;
                    if (x > m) m = x;
                    kept += x != -INFINITY;
                }
                mag[row] = a;
                const double sink = sinks ? sinks[h] : -INFINITY;
                if (sink > m) m = sink;
                double *o_r = o + row * D;
                for (int64_t e = 0; e < D; e++) o_r[e] = 0;
                if (!kept && sink == -INFINITY) {
                    lse[row] = -INFINITY;
                    continue;
                }
                double l = sink == -INFINITY ? 0 : exp(sink - m);
                for (int64_t j = 0; j < n; j++) l += exp(s[j] - m);
                for (int64_t j = 0; j < n; j++) {
                    if (s[j] == -INFINITY) continue;
                    const double p = exp(s[j] - m) / l;
                    const float *v_j = j < pv ? pre->hv + (g * P + j) * D
                                              : suf->hv + ((b * c->Hkv + g) * S + (j - pv)) * D;
                    for (int64_t e = 0; e < D; e++) o_r[e] += p * v_j[e];
                }
                lse[row] = m + log(l);
            }
    free(s);
}

static void describe(const ccase *c, char *out, size_t n) {
    snprintf(out, n, "B=%lld Hq=%lld Hkv=%lld Lq=%lld P=%lld(valid %lld) S=%lld%s D=%lld %s page=%lld%s%s%s%s sc=%g",
             (long long)c->B, (long long)c->Hq, (long long)c->Hkv, (long long)c->Lq, (long long)c->P,
             (long long)c->p_valid, (long long)c->Smax, c->ragged ? "(ragged)" : "", (long long)c->D,
             attn_dtype_name(c->dt), (long long)c->page, c->sinks ? " sinks" : "", c->causal ? " causal" : "",
             c->q_bf16 ? " q-bf16" : "", c->q_perm ? " q-[B,L,H,D]" : "", (double)c->softcap);
}

/* The case's inputs, built once. */
typedef struct built {
    part pre, suf;
    float *q, *sinks;         // held q values dense [B, Hq, Lq, D]; sinks [Hq] or NULL
    void *qbuf;
    attn_tensor tq, tsinks;
    attn_options opt;
    double *ro, *rl, *rmag;   // the reference, and its rows' logit magnitudes
    int64_t no, nl;
} built;

static void build(const ccase *c, uint64_t seed, built *t) {
    rng_t r = {seed};
    memset(t, 0, sizeof *t);
    const int64_t B = c->B, Hq = c->Hq, Lq = c->Lq, D = c->D;
    int64_t pv = c->p_valid >= 0 ? c->p_valid : c->P;
    int64_t *slen = xcalloc(B, sizeof(int64_t));
    for (int64_t b = 0; b < B; b++) {
        const int64_t lo = c->causal && Lq - 1 > 0 ? Lq - 1 : 0;
        slen[b] = c->ragged ? lo + rng_int(&r, c->Smax - lo + 1) : c->Smax;
    }
    if (c->ragged && B > 1 && !c->causal) slen[1] = 0;  // an empty suffix among full ones
    make_part(&r, c, 1, c->P, &pv, c->p_valid >= 0, &t->pre);
    make_part(&r, c, B, c->Smax, slen, c->ragged, &t->suf);
    free(slen);
    t->no = B * Hq * Lq * D, t->nl = B * Hq * Lq;
    t->q = xcalloc(t->no, 4);
    const size_t es = c->q_bf16 ? 2 : 4;
    t->qbuf = xcalloc(t->no, es);
    /* storage [B, Hq, Lq, D], or [B, Lq, Hq, D] seen through strides */
    t->tq = attn_tensor_4d(t->qbuf, c->q_bf16 ? ATTN_BF16 : ATTN_F32, B, Hq, Lq, D);
    if (c->q_perm) t->tq.stride[1] = D, t->tq.stride[2] = Hq * D;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < Lq; i++)
                for (int64_t e = 0; e < D; e++) {
                    float x = (float)rng_normal(&r);
                    const int64_t at = b * t->tq.stride[0] + h * t->tq.stride[1] + i * t->tq.stride[2] + e;
                    if (c->q_bf16) {
                        ((uint16_t *)t->qbuf)[at] = attn_f32_to_bf16(x);
                        x = attn_bf16_to_f32(((uint16_t *)t->qbuf)[at]);
                    } else {
                        ((float *)t->qbuf)[at] = x;
                    }
                    t->q[((b * Hq + h) * Lq + i) * D + e] = x;
                }
    t->opt = (attn_options){.softcap = c->softcap, .causal = c->causal, .align = ATTN_ALIGN_BOTTOM_RIGHT};
    if (c->sinks) {
        t->sinks = xcalloc(Hq, 4);
        for (int64_t h = 0; h < Hq; h++) t->sinks[h] = (float)rng_range(&r, -2, 3);
        if (Hq > 1) t->sinks[0] = -INFINITY;
        t->tsinks = attn_tensor_4d(t->sinks, ATTN_F32, Hq, 1, 1, 1);
        t->opt.sinks = &t->tsinks;
    }
    t->ro = xcalloc(t->no, sizeof(double)), t->rl = xcalloc(t->nl, sizeof(double));
    t->rmag = xcalloc(t->nl, sizeof(double));
    reference(c, t->q, &t->pre, &t->suf, t->sinks, t->ro, t->rl, t->rmag);
}

static void unbuild(built *t) {
    free_part(&t->pre), free_part(&t->suf);
    free(t->q), free(t->qbuf), free(t->sinks), free(t->ro), free(t->rl), free(t->rmag);
}

/* Runs the call on t's inputs; o and lse get float32 results. */
static attn_status run(built *t, const ccase *c, int threads, float *o, float *lse) {
    attn_tensor to = attn_tensor_4d(o, ATTN_F32, c->B, c->Hq, c->Lq, c->D);
    attn_tensor tl = attn_tensor_4d(lse, ATTN_F32, c->B, c->Hq, c->Lq, 1);
    attn_options opt = t->opt;
    opt.lse = &tl, opt.threads = threads;
    return attn_cascade_forward(&t->tq, &t->pre.kv, &t->suf.kv, &to, &opt);  // P = 0: present, empty
}

/* One case: within tolerance of the reference, O and LSE; bit-identical for 1 and 2
 * threads. Returns 1 when it passed. */
static int check_case(const ccase *c, uint64_t seed) {
    char name[256];
    describe(c, name, sizeof name);
    built t;
    build(c, seed, &t);
    float *o = xcalloc(t.no, 4), *lse = xcalloc(t.nl, 4), *o2 = xcalloc(t.no, 4), *lse2 = xcalloc(t.nl, 4);
    fill_sentinel(o, t.no), fill_sentinel(lse, t.nl);
    attn_status st = run(&t, c, 1, o, lse);
    CHECK(st == ATTN_OK, "%s: %s (%s)", name, attn_status_string(st), attn_last_error());
    tol_result ro, rl;
    // keys: the prefix, the longest suffix and a sink
    const int ok_o = within_f32_tol(o, t.ro, t.no, &ro),
              ok_l = within_lse_tol(lse, t.rl, t.rmag, t.nl, c->D, c->P + c->Smax + 1, &rl);
    CHECK(ok_o, "%s: O rel %.3g max %.3g (ref max %.3g) at %lld", name, ro.rel_err, ro.max_err, ro.max_ref,
          (long long)ro.worst);
    CHECK(ok_l, "%s: LSE error %.3g (%.3g of the bound) at %lld", name, rl.max_err, rl.rel_err,
          (long long)rl.worst);
    st = run(&t, c, 2, o2, lse2);
    CHECK(st == ATTN_OK && !memcmp(o, o2, (size_t)t.no * 4) && !memcmp(lse, lse2, (size_t)t.nl * 4),
          "%s: 1 and 2 threads differ", name);
    free(o), free(lse), free(o2), free(lse2);
    unbuild(&t);
    return ok_o && ok_l;
}

static void sweep(void) {
    static const int64_t B[] = {1, 3, 32};
    static const int64_t heads[][2] = {{2, 2}, {4, 2}, {8, 1}};
    static const int64_t lens[][2] = {{0, 5}, {17, 0}, {16, 16}, {15, 1}, {33, 7}, {129, 31}};
    static const attn_dtype dts[] = {ATTN_F32, ATTN_BF16, ATTN_Q8_0};
    static const int64_t lqs[] = {1, 3, 1, 2};
    int n = 0, passed = 0;
    for (int ib = 0; ib < 3; ib++)
        for (int ih = 0; ih < 3; ih++)
            for (int il = 0; il < 6; il++)
                for (int id = 0; id < 3; id++)
                    for (int pg = 0; pg < 2; pg++, n++) {
                        ccase c = {.B = B[ib], .Hq = heads[ih][0], .Hkv = heads[ih][1], .Lq = lqs[n % 4],
                                   .P = lens[il][0], .Smax = lens[il][1], .D = 32, .dt = dts[id],
                                   .page = pg ? 16 : 0, .p_valid = -1};
                        c.ragged = n % 2 == 0 || c.page;
                        c.sinks = n % 3 == 1;
                        c.softcap = n % 5 == 2 ? 3.0f : 0.0f;
                        c.q_bf16 = n % 7 == 3;
                        c.q_perm = n % 4 == 1;  // with Lq = 3: q' cannot be a view
                        c.causal = n % 6 == 5 && c.Smax + 1 >= c.Lq;
                        if (c.page && c.P > 1 && n % 3 == 0) c.p_valid = c.P - 1 - n % 2;
                        passed += check_case(&c, 1000 + (uint64_t)n);
                    }
    /* pages of 1 and 64, D = 64, a longer prefix */
    ccase extra[] = {
        {.B = 3, .Hq = 4, .Hkv = 2, .Lq = 1, .P = 7, .Smax = 3, .D = 64, .dt = ATTN_F32, .page = 1, .p_valid = -1,
         .ragged = true, .sinks = true},
        {.B = 32, .Hq = 4, .Hkv = 1, .Lq = 1, .P = 300, .Smax = 65, .D = 64, .dt = ATTN_BF16, .page = 64,
         .p_valid = 257, .ragged = true, .softcap = 5.0f},
        {.B = 3, .Hq = 8, .Hkv = 2, .Lq = 3, .P = 2100, .Smax = 40, .D = 32, .dt = ATTN_Q8_0, .page = 0,
         .p_valid = -1, .ragged = true, .sinks = true, .causal = true, .q_perm = true},
        {.B = 32, .Hq = 8, .Hkv = 2, .Lq = 1, .P = 4100, .Smax = 64, .D = 32, .dt = ATTN_F32, .page = 0,
         .p_valid = -1, .ragged = true},
    };
    for (size_t e = 0; e < sizeof extra / sizeof extra[0]; e++, n++) passed += check_case(&extra[e], 5000 + e);
    printf("sweep: %d of %d cases within tolerance\n", passed, n);
}

/* Both parts empty, or absent: O 0 and LSE -inf, or the sink. */
static void empty_parts(void) {
    for (int with_sinks = 0; with_sinks < 2; with_sinks++) {
        ccase c = {.B = 3, .Hq = 4, .Hkv = 2, .Lq = 1, .P = 0, .Smax = 4, .D = 32, .dt = ATTN_F32,
                   .p_valid = 0, .ragged = true, .sinks = with_sinks};
        built t;
        build(&c, 77, &t);
        for (int64_t b = 0; b < c.B; b++) t.suf.len[b] = 0;
        reference(&c, t.q, &t.pre, &t.suf, t.sinks, t.ro, t.rl, t.rmag);
        float *o = xcalloc(t.no, 4), *lse = xcalloc(t.nl, 4);
        fill_sentinel(o, t.no);
        CHECK(run(&t, &c, 0, o, lse) == ATTN_OK, "empty parts: %s", attn_last_error());
        int good = 1;
        for (int64_t e = 0; e < t.no; e++) good &= o[e] == 0.0f;
        for (int64_t e = 0; e < t.nl; e++)
            good &= with_sinks ? lse[e] == t.sinks[e / c.Lq % c.Hq] : lse[e] == -INFINITY;
        CHECK(good, "empty parts%s: O must be 0 and LSE %s", with_sinks ? " with sinks" : "",
              with_sinks ? "the sink" : "-inf");
        /* no parts at all */
        attn_tensor to = attn_tensor_4d(o, ATTN_F32, c.B, c.Hq, c.Lq, c.D);
        attn_tensor tl = attn_tensor_4d(lse, ATTN_F32, c.B, c.Hq, c.Lq, 1);
        attn_options opt = t.opt;
        opt.lse = &tl;
        fill_sentinel(o, t.no), fill_sentinel(lse, t.nl);
        CHECK(attn_cascade_forward(&t.tq, NULL, NULL, &to, &opt) == ATTN_OK, "no parts: %s", attn_last_error());
        good = 1;
        for (int64_t e = 0; e < t.no; e++) good &= o[e] == 0.0f;
        for (int64_t e = 0; e < t.nl; e++)
            good &= with_sinks ? lse[e] == t.sinks[e / c.Lq % c.Hq] : lse[e] == -INFINITY;
        CHECK(good, "no parts%s: O must be 0 and LSE %s", with_sinks ? " with sinks" : "",
              with_sinks ? "the sink" : "-inf");
        free(o), free(lse);
        unbuild(&t);
    }
}

/* The caller's workspace, the size query, and every refusal (nothing written). */
static void workspace_and_errors(void) {
    ccase c = {.B = 3, .Hq = 4, .Hkv = 2, .Lq = 2, .P = 20, .Smax = 6, .D = 32, .dt = ATTN_F32,
               .p_valid = -1, .ragged = true, .sinks = true, .q_perm = true};
    built t;
    build(&c, 99, &t);
    float *o = xcalloc(t.no, 4), *lse = xcalloc(t.nl, 4), *o1 = xcalloc(t.no, 4);
    attn_tensor to = attn_tensor_4d(o, ATTN_F32, c.B, c.Hq, c.Lq, c.D);
    attn_tensor tl = attn_tensor_4d(lse, ATTN_F32, c.B, c.Hq, c.Lq, 1);
    attn_options opt = t.opt;
    opt.lse = &tl;
    CHECK(attn_cascade_forward(&t.tq, &t.pre.kv, &t.suf.kv, &to, &opt) == ATTN_OK, "%s", attn_last_error());
    memcpy(o1, o, (size_t)t.no * 4);
    size_t need = 0;
    CHECK(attn_cascade_forward_workspace_size(&t.tq, &t.pre.kv, &t.suf.kv, &to, &opt, &need) == ATTN_OK &&
          need > 0, "workspace size: %s", attn_last_error());
    char *ws = xcalloc((int64_t)need + 64, 1);
    attn_options ow = opt;
    ow.workspace = ws, ow.workspace_bytes = need;
    fill_sentinel(o, t.no);
    CHECK(attn_cascade_forward(&t.tq, &t.pre.kv, &t.suf.kv, &to, &ow) == ATTN_OK &&
          !memcmp(o, o1, (size_t)t.no * 4), "the caller's workspace: %s", attn_last_error());
    ow.workspace_bytes = need - 1;

    /* each refusal: its status, and o and lse untouched */
#define REFUSED(want, call, what)                                                              \
    do {                                                                                       \
        fill_sentinel(o, t.no), fill_sentinel(lse, t.nl);                                      \
        const attn_status st_ = (call);                                                        \
        CHECK(st_ == (want) && count_written(o, t.no) == 0 && count_written(lse, t.nl) == 0,   \
              "%s: got %s (%s), expected %s and nothing written", what, attn_status_string(st_), \
              attn_last_error(), attn_status_string(want));                                    \
    } while (0)
    REFUSED(ATTN_ERR_WORKSPACE, attn_cascade_forward(&t.tq, &t.pre.kv, &t.suf.kv, &to, &ow), "workspace short");
    attn_options bad = opt;
    uint8_t mask = 1;
    attn_tensor tm = attn_tensor_4d(&mask, ATTN_BOOL, 1, 1, 1, 1);
    bad.mask = &tm;
    REFUSED(ATTN_ERR_UNSUPPORTED, attn_cascade_forward(&t.tq, &t.pre.kv, &t.suf.kv, &to, &bad), "mask");
    bad = opt, bad.has_window = true, bad.window_left = 3, bad.window_right = -1;
    REFUSED(ATTN_ERR_UNSUPPORTED, attn_cascade_forward(&t.tq, &t.pre.kv, &t.suf.kv, &to, &bad), "window");
    bad = opt, bad.dropout_p = 0.5f;
    REFUSED(ATTN_ERR_UNSUPPORTED, attn_cascade_forward(&t.tq, &t.pre.kv, &t.suf.kv, &to, &bad), "dropout");
    bad = opt, bad.kv_len = &t.suf.tlen;
    REFUSED(ATTN_ERR_VALUE, attn_cascade_forward(&t.tq, &t.pre.kv, &t.suf.kv, &to, &bad), "options.kv_len");
    bad = opt, bad.causal = true, bad.align = ATTN_ALIGN_TOP_LEFT;
    REFUSED(ATTN_ERR_UNSUPPORTED, attn_cascade_forward(&t.tq, &t.pre.kv, &t.suf.kv, &to, &bad), "causal top-left");
    /* causal with a suffix shorter than Lq - 1 = 1: sequence 1's suffix is made empty */
    const int64_t keep = t.suf.len[1];
    t.suf.len[1] = 0;
    bad = opt, bad.causal = true;
    REFUSED(ATTN_ERR_UNSUPPORTED, attn_cascade_forward(&t.tq, &t.pre.kv, &t.suf.kv, &to, &bad),
            "causal, a suffix under Lq - 1");
    t.suf.len[1] = keep;
    /* a prefix of batch 3 (not shared) */
    attn_cascade_kv wide = t.suf.kv;
    wide.kv_len = NULL;
    REFUSED(ATTN_ERR_SHAPE, attn_cascade_forward(&t.tq, &wide, &t.suf.kv, &to, &opt), "prefix batch 3");
    attn_cascade_kv half = t.pre.kv;
    half.v = NULL;
    REFUSED(ATTN_ERR_NULL, attn_cascade_forward(&t.tq, &half, &t.suf.kv, &to, &opt), "prefix v NULL");
    /* the suffixes' keys of another width */
    attn_tensor k16 = t.suf.tk;
    k16.shape[3] = 16;
    attn_cascade_kv narrow = t.suf.kv;
    narrow.k = &k16;
    REFUSED(ATTN_ERR_SHAPE, attn_cascade_forward(&t.tq, &t.pre.kv, &narrow, &to, &opt), "suffix Dk 16");
    attn_tensor sk = attn_tensor_4d(t.sinks, ATTN_F32, c.Hq + 1, 1, 1, 1);
    bad = opt, bad.sinks = &sk;
    REFUSED(ATTN_ERR_SHAPE, attn_cascade_forward(&t.tq, &t.pre.kv, &t.suf.kv, &to, &bad), "sinks [Hq + 1]");
    /* o over the prefix's keys; lse over o */
    attn_tensor o_on_k = to;
    o_on_k.data = t.pre.k;
    fill_sentinel(lse, t.nl);
    CHECK(attn_cascade_forward(&t.tq, &t.pre.kv, &t.suf.kv, &o_on_k, &opt) == ATTN_ERR_STRIDE &&
          count_written(lse, t.nl) == 0, "o overlapping the prefix's k: %s", attn_last_error());
    attn_tensor l_on_o = tl;
    l_on_o.data = o;
    bad = opt, bad.lse = &l_on_o;
    fill_sentinel(o, t.no);
    CHECK(attn_cascade_forward(&t.tq, &t.pre.kv, &t.suf.kv, &to, &bad) == ATTN_ERR_STRIDE &&
          count_written(o, t.no) == 0, "lse overlapping o: %s", attn_last_error());
    /* a caller's workspace over the suffixes' keys */
    bad = opt, bad.workspace = t.suf.k, bad.workspace_bytes = need;
    REFUSED(ATTN_ERR_STRIDE, attn_cascade_forward(&t.tq, &t.pre.kv, &t.suf.kv, &to, &bad),
            "workspace overlapping an input");
    attn_tensor t64 = t.tq;
    t64.dtype = ATTN_F64;
    REFUSED(ATTN_ERR_DTYPE, attn_cascade_forward(&t64, &t.pre.kv, &t.suf.kv, &to, &opt), "float64 q");
#undef REFUSED
    free(ws), free(o), free(lse), free(o1);
    unbuild(&t);
}

/* The tolerance fails on a planted error, and on the answer of a merge whose partials
 * each carried the sinks. */
static void planted(void) {
    ccase c = {.B = 3, .Hq = 4, .Hkv = 2, .Lq = 1, .P = 40, .Smax = 9, .D = 32, .dt = ATTN_F32,
               .p_valid = -1, .ragged = true, .sinks = true};
    built t;
    build(&c, 123, &t);
    for (int64_t h = 0; h < c.Hq; h++) t.sinks[h] = 1.0f;  // sinks that weigh on every row
    reference(&c, t.q, &t.pre, &t.suf, t.sinks, t.ro, t.rl, t.rmag);
    float *o = xcalloc(t.no, 4), *lse = xcalloc(t.nl, 4);
    CHECK(run(&t, &c, 0, o, lse) == ATTN_OK && within_f32_tol(o, t.ro, t.no, NULL), "planted: the clean run");
    const int64_t at = t.no / 2;
    o[at] += 1e-4f * (1.0f + fabsf(o[at]));
    CHECK(!within_f32_tol(o, t.ro, t.no, NULL), "a planted error of 1e-4 passed the tolerance");

    /* the sink in each partial: prefix and suffix each with opt.sinks, then attn_merge */
    const int64_t B = c.B, Hq = c.Hq, D = c.D;
    float *op = xcalloc(t.no, 4), *lp = xcalloc(t.nl, 4), *os = xcalloc(t.no, 4), *ls = xcalloc(t.nl, 4);
    attn_tensor q1 = t.tq;  // Lq = 1: the batch as the rows of one sequence
    q1.shape[0] = 1, q1.shape[2] = B, q1.stride[2] = t.tq.stride[0];
    attn_tensor top = {op, ATTN_F32, {1, Hq, B, D}, {0, B * D, D, 1}}, tlp = {lp, ATTN_F32, {1, Hq, B, 1}, {0, B, 1, 1}};
    attn_options o1 = {.sinks = t.opt.sinks, .lse = &tlp};
    CHECK(attn_forward(&q1, t.pre.kv.k, t.pre.kv.v, &top, &o1) == ATTN_OK, "prefix with sinks: %s", attn_last_error());
    attn_tensor tos = attn_tensor_4d(os, ATTN_F32, B, Hq, 1, D), tls = attn_tensor_4d(ls, ATTN_F32, B, Hq, 1, 1);
    attn_options o2 = {.sinks = t.opt.sinks, .lse = &tls, .kv_len = t.suf.kv.kv_len};
    CHECK(attn_forward(&t.tq, t.suf.kv.k, t.suf.kv.v, &tos, &o2) == ATTN_OK, "suffix with sinks: %s", attn_last_error());
    attn_tensor parts_o[2] = {{op, ATTN_F32, {B, Hq, 1, D}, {D, B * D, D, 1}}, tos};
    attn_tensor parts_l[2] = {{lp, ATTN_F32, {B, Hq, 1, 1}, {1, B, 1, 1}}, tls};
    attn_tensor to = attn_tensor_4d(o, ATTN_F32, B, Hq, 1, D);
    CHECK(attn_merge(2, parts_o, parts_l, &to, NULL, 0) == ATTN_OK, "merge: %s", attn_last_error());
    tol_result r;
    CHECK(!within_f32_tol(o, t.ro, t.no, &r), "sinks counted once per partial passed the tolerance");
    printf("planted: 1e-4 in one element and the sink counted twice both fail (the latter rel %.2e)\n", r.rel_err);
    free(o), free(lse), free(op), free(lp), free(os), free(ls);
    unbuild(&t);
}

int main(void) {
    printf("test_cascade: kernel %s\n", attn_kernel_name());
    sweep();
    empty_parts();
    workspace_and_errors();
    planted();
    return check_summary("test_cascade");
}
