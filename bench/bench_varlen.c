/*
 * bench_varlen.c — `attn bench --varlen`: a packed (variable-length) batch through
 *                  attn_varlen_forward / attn_varlen_backward, beside the same sequences
 *                  as separate calls and as the padded rectangular call (issue 36, "Speed").
 *
 * Method:
 *   - the case: 8 sequences of lengths 128, 256, 512, 768, 1024, 1536, 1920, 2048 (sum
 *     8192; --quick: each / 8, sum 1024), Hq = Hkv = 8, D = 128, float32, causal (top-left:
 *     the same as bottom-right for Lq = Lk), packed contiguous as [1, H, total, D];
 *   - rows, forward and backward each: (1) one varlen call on the packed tensors; (2) 8
 *     attn_forward / attn_backward calls, one per sequence, on row views of the same packed
 *     buffers (B = 1); (3) the padded call [B 8, H, Lmax, D], sequences padded to the
 *     longest (zeros), with a key-padding bool mask [B, 1, 1, Lmax]; (4) the same padded
 *     call with kv_len instead of the mask. d_o is zero on the padding rows;
 *   - the answer is checked first, and these calls are each row's warm-up: varlen's O and
 *     LSE, then dq, dk, dv, bit for bit those of the separate calls (the contract); the
 *     padded calls' valid rows (O, LSE, dq; dk, dv of the valid keys) within the contract's
 *     float32 tolerance (tools/common/tolerance.h) of varlen's. --plant-error perturbs one
 *     element of varlen's O first, and the check must fail (exit 1);
 *   - then rounds that run the rows in turn (--reps rounds, default 3): medians of the wall
 *     and the process's CPU time, and GFLOP/s from the same useful FLOPs for every row,
 *     sum over s of 4 H L_s^2 D / 2 (causal) forward, 2.5x that backward, so the padded
 *     rows' GFLOP/s show their waste. Ratios: varlen / separate (issue 36: >= 0.95) and
 *     padded / varlen time (issue 36: >= 3x with the key-padding mask).
 * What it is not: a test (no time limit anywhere), or a comparison with another library.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "bench_clock.h"
#include "cli.h"
#include "cliopt.h"
#include "rng.h"
#include "tolerance.h"

enum { NS = 8, HEADS = 8, DIM = 128 };
static const int64_t FULL_LEN[NS] = {128, 256, 512, 768, 1024, 1536, 1920, 2048};

typedef struct vcase {
    int64_t len[NS], off[NS + 1], total, lmax;
    /* packed [1, H, total, D]: inputs, then each way's outputs (v_ varlen, s_ separate) */
    float *q, *k, *v, *d_o, *v_o, *v_lse, *v_dq, *v_dk, *v_dv, *s_o, *s_lse, *s_dq, *s_dk, *s_dv;
    /* padded [B, H, Lmax, D] */
    float *pq, *pk, *pv, *pdo, *po, *plse, *pdq, *pdk, *pdv;
    bool *mask;           /* [B, 1, 1, Lmax] */
    int32_t cu[NS + 1];   /* cu_seqlens, q and k alike */
    int64_t kvl[NS];      /* kv_len of the padded call */
} vcase;

static float *alloc_f(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(float)); }

static attn_tensor packed(const vcase *c, float *x) {
    return attn_tensor_4d(x, ATTN_F32, 1, HEADS, c->total, DIM);
}
static attn_tensor packed_lse(const vcase *c, float *x) {
    return attn_tensor_4d(x, ATTN_F32, 1, HEADS, c->total, 1);
}
/* sequence s's rows of a packed tensor (width DIM, or 1 for the LSE) */
static attn_tensor rows(const vcase *c, float *x, int s, int64_t width) {
    attn_tensor t = {x + c->off[s] * width, ATTN_F32, {1, HEADS, c->len[s], width},
                     {HEADS * c->total * width, c->total * width, width, 1}};
    return t;
}
static attn_tensor padded(const vcase *c, float *x, int64_t width) {
    return attn_tensor_4d(x, ATTN_F32, NS, HEADS, c->lmax, width);
}

static bool build(vcase *c, bool quick) {
    memset(c, 0, sizeof *c);
    c->off[0] = 0;
    for (int s = 0; s < NS; s++) {
        c->len[s] = quick ? FULL_LEN[s] / 8 : FULL_LEN[s];
        c->off[s + 1] = c->off[s] + c->len[s];
        c->cu[s + 1] = (int32_t)c->off[s + 1];
        c->kvl[s] = c->len[s];
        if (c->len[s] > c->lmax) c->lmax = c->len[s];
    }
    c->total = c->off[NS];
    const int64_t n = HEADS * c->total * DIM, nl = HEADS * c->total;
    const int64_t np = NS * HEADS * c->lmax * DIM, npl = NS * HEADS * c->lmax;
    float **big[] = {&c->q, &c->k, &c->v, &c->d_o, &c->v_o, &c->v_dq, &c->v_dk, &c->v_dv,
                     &c->s_o, &c->s_dq, &c->s_dk, &c->s_dv};
    for (size_t a = 0; a < sizeof big / sizeof *big; a++)
        if (!(*big[a] = alloc_f(n))) return false;
    if (!(c->v_lse = alloc_f(nl)) || !(c->s_lse = alloc_f(nl)) || !(c->plse = alloc_f(npl)))
        return false;
    float **pad[] = {&c->pq, &c->pk, &c->pv, &c->pdo, &c->po, &c->pdq, &c->pdk, &c->pdv};
    for (size_t a = 0; a < sizeof pad / sizeof *pad; a++)
        if (!(*pad[a] = alloc_f(np))) return false;
    if (!(c->mask = calloc((size_t)(NS * c->lmax), sizeof(bool)))) return false;
    rng_t r = {RNG_CASE(HEADS, c->total, DIM)};
    float *in[] = {c->q, c->k, c->v, c->d_o};
    for (int a = 0; a < 4; a++)
        for (int64_t e = 0; e < n; e++) in[a][e] = (float)rng_sym(&r);
    /* the padded copies: sequence s at b = s, rows 0 .. len-1; zeros after (d_o too) */
    float *pin[] = {c->pq, c->pk, c->pv, c->pdo};
    for (int s = 0; s < NS; s++) {
        for (int64_t h = 0; h < HEADS; h++)
            for (int a = 0; a < 4; a++)
                memcpy(pin[a] + ((int64_t)s * HEADS + h) * c->lmax * DIM,
                       in[a] + (h * c->total + c->off[s]) * DIM,
                       (size_t)(c->len[s] * DIM) * sizeof(float));
        for (int64_t j = 0; j < c->len[s]; j++) c->mask[s * c->lmax + j] = true;
    }
    return true;
}

static void release(vcase *c) {
    float *all[] = {c->q,  c->k,    c->v,    c->d_o, c->v_o,  c->v_lse, c->v_dq, c->v_dk,
                    c->v_dv, c->s_o, c->s_lse, c->s_dq, c->s_dk, c->s_dv, c->pq,   c->pk,
                    c->pv, c->pdo,  c->po,   c->plse, c->pdq, c->pdk, c->pdv};
    for (size_t a = 0; a < sizeof all / sizeof *all; a++) free(all[a]);
    free(c->mask);
}

enum { W_VARLEN, W_SEPARATE, W_PAD_MASK, W_PAD_KVLEN, WAYS };
static const char *const WAY_NAME[WAYS] = {"varlen (1 call)", "8 separate calls",
                                           "padded + bool mask", "padded + kv_len"};

static attn_status forward(vcase *c, int way, int threads) {
    attn_options o = {.causal = true, .threads = threads};
    if (way == W_VARLEN) {
        attn_tensor tq = packed(c, c->q), tk = packed(c, c->k), tv = packed(c, c->v),
                    to = packed(c, c->v_o), tl = packed_lse(c, c->v_lse),
                    cu = {c->cu, ATTN_I32, {NS + 1, 1, 1, 1}, {1, 1, 1, 1}};
        o.lse = &tl;
        return attn_varlen_forward(&tq, &tk, &tv, &to, &cu, &cu, c->lmax, c->lmax, &o);
    }
    if (way == W_SEPARATE) {
        for (int s = 0; s < NS; s++) {
            attn_tensor tq = rows(c, c->q, s, DIM), tk = rows(c, c->k, s, DIM),
                        tv = rows(c, c->v, s, DIM), to = rows(c, c->s_o, s, DIM),
                        tl = rows(c, c->s_lse, s, 1);
            o.lse = &tl;
            const attn_status st = attn_forward(&tq, &tk, &tv, &to, &o);
            if (st != ATTN_OK) return st;
        }
        return ATTN_OK;
    }
    attn_tensor tq = padded(c, c->pq, DIM), tk = padded(c, c->pk, DIM), tv = padded(c, c->pv, DIM),
                to = padded(c, c->po, DIM), tl = padded(c, c->plse, 1),
                tm = {c->mask, ATTN_BOOL, {NS, 1, 1, c->lmax}, {c->lmax, 0, 0, 1}},
                tkv = {c->kvl, ATTN_I64, {NS, 1, 1, 1}, {1, 1, 1, 1}};
    o.lse = &tl;
    if (way == W_PAD_MASK) o.mask = &tm;
    else o.kv_len = &tkv;
    return attn_forward(&tq, &tk, &tv, &to, &o);
}

static attn_status backward(vcase *c, int way, int threads) {
    attn_options o = {.causal = true, .threads = threads};
    if (way == W_VARLEN) {
        attn_tensor tq = packed(c, c->q), tk = packed(c, c->k), tv = packed(c, c->v),
                    to = packed(c, c->v_o), tdo = packed(c, c->d_o), tl = packed_lse(c, c->v_lse),
                    tdq = packed(c, c->v_dq), tdk = packed(c, c->v_dk), tdv = packed(c, c->v_dv),
                    cu = {c->cu, ATTN_I32, {NS + 1, 1, 1, 1}, {1, 1, 1, 1}};
        return attn_varlen_backward(&tq, &tk, &tv, &to, &tdo, &tl, &tdq, &tdk, &tdv, &cu, &cu,
                                    c->lmax, c->lmax, &o);
    }
    if (way == W_SEPARATE) {
        for (int s = 0; s < NS; s++) {
            attn_tensor tq = rows(c, c->q, s, DIM), tk = rows(c, c->k, s, DIM),
                        tv = rows(c, c->v, s, DIM), to = rows(c, c->s_o, s, DIM),
                        tdo = rows(c, c->d_o, s, DIM), tl = rows(c, c->s_lse, s, 1),
                        tdq = rows(c, c->s_dq, s, DIM), tdk = rows(c, c->s_dk, s, DIM),
                        tdv = rows(c, c->s_dv, s, DIM);
            const attn_status st = attn_backward(&tq, &tk, &tv, &to, &tdo, &tl, &tdq, &tdk, &tdv, &o);
            if (st != ATTN_OK) return st;
        }
        return ATTN_OK;
    }
    attn_tensor tq = padded(c, c->pq, DIM), tk = padded(c, c->pk, DIM), tv = padded(c, c->pv, DIM),
                to = padded(c, c->po, DIM), tdo = padded(c, c->pdo, DIM), tl = padded(c, c->plse, 1),
                tdq = padded(c, c->pdq, DIM), tdk = padded(c, c->pdk, DIM),
                tdv = padded(c, c->pdv, DIM),
                tm = {c->mask, ATTN_BOOL, {NS, 1, 1, c->lmax}, {c->lmax, 0, 0, 1}},
                tkv = {c->kvl, ATTN_I64, {NS, 1, 1, 1}, {1, 1, 1, 1}};
    if (way == W_PAD_MASK) o.mask = &tm;
    else o.kv_len = &tkv;
    return attn_backward(&tq, &tk, &tv, &to, &tdo, &tl, &tdq, &tdk, &tdv, &o);
}

static bool same_bits(const char *what, const float *a, const float *b, int64_t n) {
    if (memcmp(a, b, (size_t)n * sizeof(float)) == 0) {
        printf("check %-4s varlen == separate calls, bit for bit: ok\n", what);
        return true;
    }
    int64_t e = 0;
    while (e < n && memcmp(a + e, b + e, sizeof(float)) == 0) e++;
    printf("check %-4s varlen != separate calls at element %lld (%.9g vs %.9g): FAILED\n", what,
           (long long)e, (double)a[e], (double)b[e]);
    return false;
}

/* the padded call's valid rows (width DIM, or 1) against varlen's packed ones */
static bool padded_close(const vcase *c, const char *what, const char *way, const float *pad,
                         const float *pk, int64_t width) {
    tol_acc a = tol_start();
    for (int s = 0; s < NS; s++)
        for (int64_t h = 0; h < HEADS; h++) {
            const float *x = pad + ((int64_t)s * HEADS + h) * c->lmax * width,
                        *y = pk + (h * c->total + c->off[s]) * width;
            for (int64_t e = 0; e < c->len[s] * width; e++)
                tol_add(&a, (h * c->total + c->off[s]) * width + e, x[e], y[e]);
        }
    tol_result r;
    const bool ok = tol_pass(&a, &r);
    printf("check %-4s %-18s vs varlen, valid rows: relative %.2e, max %.2e  %s\n", what, way,
           r.rel_err, r.max_err, ok ? "ok" : "FAILED");
    return ok;
}

/* Runs every row once (the warm-up) and checks the answers. */
static bool check_and_warm(vcase *c, int threads, bool plant) {
    const int64_t n = HEADS * c->total * DIM, nl = HEADS * c->total;
    for (int w = 0; w < WAYS; w++)
        if (forward(c, w, threads) != ATTN_OK) {
            fprintf(stderr, "bench --varlen: forward, %s: %s\n", WAY_NAME[w], attn_last_error());
            return false;
        }
    if (plant) c->v_o[(HEADS / 2 * c->total + c->off[5] + 7) * DIM + 3] += 1e-3f;
    bool ok = same_bits("O", c->v_o, c->s_o, n);
    ok = same_bits("LSE", c->v_lse, c->s_lse, nl) && ok;
    const char *km = WAY_NAME[W_PAD_KVLEN], *bm = WAY_NAME[W_PAD_MASK];
    ok = padded_close(c, "O", km, c->po, c->v_o, DIM) && ok;  // kv_len's, the last written
    ok = padded_close(c, "LSE", km, c->plse, c->v_lse, 1) && ok;
    if (forward(c, W_PAD_MASK, threads) != ATTN_OK) return false;
    ok = padded_close(c, "O", bm, c->po, c->v_o, DIM) && ok;  // the bool mask's: the backward's
    ok = padded_close(c, "LSE", bm, c->plse, c->v_lse, 1) && ok;
    for (int w = 0; w < WAYS; w++)
        if (backward(c, w, threads) != ATTN_OK) {
            fprintf(stderr, "bench --varlen: backward, %s: %s\n", WAY_NAME[w], attn_last_error());
            return false;
        }
    ok = same_bits("dq", c->v_dq, c->s_dq, n) && ok;
    ok = same_bits("dk", c->v_dk, c->s_dk, n) && ok;
    ok = same_bits("dv", c->v_dv, c->s_dv, n) && ok;
    if (backward(c, W_PAD_MASK, threads) != ATTN_OK) return false;  // its grads, then kv_len's
    const char *nm[3] = {"dq", "dk", "dv"};
    float *pg[3] = {c->pdq, c->pdk, c->pdv}, *vg[3] = {c->v_dq, c->v_dk, c->v_dv};
    for (int g = 0; g < 3; g++) ok = padded_close(c, nm[g], bm, pg[g], vg[g], DIM) && ok;
    if (backward(c, W_PAD_KVLEN, threads) != ATTN_OK) return false;
    for (int g = 0; g < 3; g++) ok = padded_close(c, nm[g], km, pg[g], vg[g], DIM) && ok;
    return ok;
}

static const char USAGE[] =
    "usage: attn bench --varlen [--quick] [--threads N] [--reps N] [--plant-error]\n"
    "\n"
    "  A packed batch of 8 causal sequences (lengths 128 .. 2048, sum 8192; --quick / 8),\n"
    "  H 8, D 128, float32, forward and backward: one attn_varlen_* call, 8 separate calls,\n"
    "  and the padded [8, H, 2048, D] call with a key-padding bool mask and with kv_len,\n"
    "  after checking varlen against the separate calls (bit for bit) and the padded calls\n"
    "  (the float32 tolerance); medians of wall and CPU time, GFLOP/s of the useful FLOPs.\n";

int bench_varlen(int argc, char **argv) {
    bench_part_args pa;
    const int rc = bench_part_scan(argc, argv, "--varlen", USAGE, 3, 3, 200, &pa);
    if (rc >= 0) return rc;
    const int threads = pa.threads, reps = pa.reps;
    vcase c;
    if (!build(&c, pa.quick)) {
        fprintf(stderr, "bench --varlen: out of memory\n");
        release(&c);
        return 1;
    }
    printf("kernel %s, threads %d (0 = default), %d sequences of lengths", attn_kernel_name(),
           threads, NS);
    for (int s = 0; s < NS; s++) printf(" %lld", (long long)c.len[s]);
    printf(" (total %lld, padded to %lld), Hq = Hkv = %d, D %d, float32, causal\n",
           (long long)c.total, (long long)c.lmax, HEADS, DIM);
    if (!check_and_warm(&c, threads, pa.plant)) {
        fprintf(stderr, "bench --varlen: the check failed%s\n",
                pa.plant ? " (planted error: as it should)" : "");
        release(&c);
        return 1;
    }
    double flops = 0;
    for (int s = 0; s < NS; s++)
        flops += 4.0 * HEADS * (double)c.len[s] * (double)c.len[s] * DIM / 2;
    enum { ROWS = 2 * WAYS };
    double *t = malloc((size_t)(ROWS * reps) * sizeof(double)),
           *tc = malloc((size_t)(ROWS * reps) * sizeof(double));
    if (!t || !tc) return 1;
    for (int r = 0; r < reps; r++)
        for (int w = 0; w < ROWS; w++) {
            const double t0 = now_s(), c0 = cpu_s();
            const attn_status st = w < WAYS ? forward(&c, w, threads) : backward(&c, w - WAYS, threads);
            t[w * reps + r] = now_s() - t0;
            tc[w * reps + r] = cpu_s() - c0;
            if (st != ATTN_OK) {
                fprintf(stderr, "bench --varlen: %s\n", attn_last_error());
                return 1;
            }
        }
    printf("median of %d rounds (rows interleaved); GFLOP/s of the useful FLOPs, %.2f GFLOP "
           "forward, %.2f backward (2.5x), for every row\n", reps, flops * 1e-9, 2.5 * flops * 1e-9);
    printf("%-9s %-20s %10s %10s %9s %9s %12s %8s\n", "call", "way", "wall ms", "CPU ms",
           "GFLOP/s", "/CPU-s", "time/varlen", "(CPU)");
    double med[ROWS], medc[ROWS];
    for (int w = 0; w < ROWS; w++) {
        med[w] = median(t + w * reps, reps);
        medc[w] = median(tc + w * reps, reps);
        const int v = w < WAYS ? 0 : WAYS;  // the varlen row of this call
        const double f = (w < WAYS ? 1.0 : 2.5) * flops;
        printf("%-9s %-20s %10.1f %10.1f %9.1f %9.1f", w < WAYS ? "forward" : "backward",
               WAY_NAME[w % WAYS], 1e3 * med[w], 1e3 * medc[w], f / med[w] * 1e-9,
               f / (medc[w] > 0 ? medc[w] : 1e-30) * 1e-9);
        if (w != v) printf(" %11.2fx %7.2fx", med[w] / med[v], medc[w] / medc[v]);
        printf("\n");
    }
    for (int v = 0; v < ROWS; v += WAYS) {
        const char *call = v ? "backward" : "forward";
        const double sep = med[v + W_SEPARATE] / med[v], sepc = medc[v + W_SEPARATE] / medc[v];
        const double pad = med[v + W_PAD_MASK] / med[v], padc = medc[v + W_PAD_MASK] / medc[v];
        printf("%s: varlen at %.2f of the separate calls' GFLOP/s (%.2f CPU; target >= 0.95: %s); "
               "%.2fx faster than padded + bool mask (%.2fx CPU; target >= 3x: %s)\n",
               call, sep, sepc, sep >= 0.95 ? "met" : "NOT met", pad, padc,
               pad >= 3 ? "met" : "NOT met");
    }
    free(t), free(tc);
    release(&c);
    return 0;
}
