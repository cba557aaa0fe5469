/*
 * test_weights_fast.c — the fused forward's `weights` output against a float64 reference,
 *                       on shapes that reach each branch of the weights' path (src/forward/fused.c:
 *                       tile_weights in the sweep, block_weights after it).
 *
 * What it covers, per kernel (run it under ATTN_ISA=avx2, generic, ...): a row's keys
 * stored contiguously (last stride 1) and strided (last stride 2, the gaps must keep
 * their sentinel); tiles at the range edges (Lq, Lk not multiples of the block and tile
 * sizes, causal under both alignments, a window, key lengths with an empty batch); a bool
 * padding mask with key lengths (the MiniLM shape, scaled down); the decoding step's
 * tiles (few rows: their logits recomputed through decode_qk) beside boundary tiles; GQA;
 * sinks (one of them -inf) with fully masked rows; dropout (the kept weights scaled, the
 * dropped 0); logits whose naive exp overflows; NaN in a query row (its unmasked weights
 * NaN) and in key rows no query may read (nothing NaN). Every masked weight, every weight
 * outside a row's range and every weight of a fully masked row must be exactly 0. What it
 * is not: a test of O or the LSE (test_forward.c, test_sinks.c, test_dropout.c).
 *
 * Tolerance per weight, from the contract's error model (tools/common/tolerance.h): a
 * weight is exp(s_ij - lse_i), so |got - ref| <= ref * (tol_dot_rel(D) mag_ij +
 * tol_lse_bound(D, Lk + 1, mag_i) + (2E + 3 + |s_ij - m_i|) u) + 1e-37, where
 * mag_ij = scale * sum_d |q_id k_jd| bounds the float32 logit's rounding and mag_i is the
 * row's largest (the LSE's). A planted error (one weight 2 bounds off) must fail it.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "check.h"
#include "oracle.h"
#include "core/philox.h"

typedef struct wcase {
    const char *name;
    int64_t B, Hq, Hkv, Lq, Lk, D;
    int causal, align, window;
    int64_t wl, wr;
    int kvlen;         // 1: per-batch lengths (batch 1 gets 0 when B > 1)
    int mask;          // 1: bool padding mask [B, 1, Lq, Lk] (keys past a drawn length), 2: random [B, Hq, Lq, Lk]
    int sinks;
    float dropout;
    float qscale;      // queries times this (large logits)
    int nan_q, nan_k;  // NaN in one query row; NaN in key rows past the key lengths
    int64_t wstride;   // the weights' last stride
} wcase;

static uint64_t g_seed = 0x9e3779b97f4a7c15ULL;
static float urand(void) {
    g_seed = g_seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(g_seed >> 40) / (double)(1ULL << 24)) * 2.0f - 1.0f;
}

/* One call of the library and the reference; plant: one weight off by 2 bounds. */
static void run_case(const wcase *c, bool plant) {
    const int64_t B = c->B, Hq = c->Hq, Hkv = c->Hkv, Lq = c->Lq, Lk = c->Lk, D = c->D;
    const int64_t nq = B * Hq * Lq * D, nk = B * Hkv * Lk * D, nw = B * Hq * Lq * Lk;
    float *q = malloc((size_t)nq * sizeof(float)), *k = malloc((size_t)nk * sizeof(float));
    float *v = malloc((size_t)nk * sizeof(float)), *o = malloc((size_t)nq * sizeof(float));
    float *wb = malloc((size_t)(nw * c->wstride) * sizeof(float));
    double *ref = calloc((size_t)nw, sizeof(double)), *tol = calloc((size_t)nw, sizeof(double));
    signed char *kind = calloc((size_t)nw, 1);  // 0: exactly 0, 1: within tol, 2: NaN
    uint8_t *mask = NULL;
    int64_t *lens = malloc((size_t)B * sizeof(int64_t));
    float sink[64];
    for (int64_t x = 0; x < nq; x++) q[x] = urand() * c->qscale;
    for (int64_t x = 0; x < nk; x++) k[x] = urand(), v[x] = urand();
    for (int64_t b = 0; b < B; b++) {
        lens[b] = Lk - (b * 37) % (Lk / 2 + 1);
        if (B > 1 && b == 1) lens[b] = 0;  // a batch with no key: every row fully masked
    }
    for (int64_t x = 0; x < nw * c->wstride; x++) wb[x] = 777.0f;  // the sentinel
    attn_tensor tq = attn_tensor_4d(q, ATTN_F32, B, Hq, Lq, D), tk = attn_tensor_4d(k, ATTN_F32, B, Hkv, Lk, D);
    attn_tensor tv = attn_tensor_4d(v, ATTN_F32, B, Hkv, Lk, D), to = attn_tensor_4d(o, ATTN_F32, B, Hq, Lq, D);
    attn_tensor tw = attn_tensor_4d(wb, ATTN_F32, B, Hq, Lq, Lk);
    for (int d = 0; d < 3; d++) tw.stride[d] *= c->wstride;
    tw.stride[3] = c->wstride;
    attn_tensor tm, tl, ts;
    attn_options opt = {0};
    opt.threads = 2;
    opt.weights = &tw;
    opt.causal = c->causal != 0;
    opt.align = c->align ? ATTN_ALIGN_BOTTOM_RIGHT : ATTN_ALIGN_TOP_LEFT;
    opt.has_window = c->window != 0, opt.window_left = c->wl, opt.window_right = c->wr;
    if (c->kvlen) {
        tl = attn_tensor_4d(lens, ATTN_I64, B, 1, 1, 1);
        opt.kv_len = &tl;
    }
    if (c->nan_k) {  // the rows past each batch's length: never read
        for (int64_t b = 0; b < B; b++)
            for (int64_t g = 0; g < Hkv; g++)
                for (int64_t j = lens[b]; j < Lk; j++) k[((b * Hkv + g) * Lk + j) * D] = NAN;
    }
    if (c->nan_q) q[((B - 1) * Hq + Hq - 1) * Lq * D + (Lq / 2) * D + 1] = NAN;
    const int64_t mh = c->mask == 2 ? Hq : 1;
    if (c->mask) {
        mask = malloc((size_t)(B * mh * Lq * Lk));
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < mh; h++)
                for (int64_t i = 0; i < Lq; i++)
                    for (int64_t j = 0; j < Lk; j++)
                        mask[((b * mh + h) * Lq + i) * Lk + j] =
                            c->mask == 1 ? j < Lk - (b * 29 + 3) % Lk : urand() > -0.6f;
        tm = attn_tensor_4d(mask, ATTN_BOOL, B, mh, Lq, Lk);
        opt.mask = &tm;
    }
    if (c->sinks) {
        for (int64_t h = 0; h < Hq; h++) sink[h] = h == 0 ? -INFINITY : 0.5f * (float)h - 1.0f;
        ts = attn_tensor_4d(sink, ATTN_F32, Hq, 1, 1, 1);
        opt.sinks = &ts;
    }
    opt.dropout_p = c->dropout, opt.dropout_seed = 1234, opt.dropout_offset = 99;
    const attn_status st = attn_forward(&tq, &tk, &tv, &to, &opt);
    CHECK(st == ATTN_OK, "%s: attn_forward: %s", c->name, attn_last_error());

    /* the reference, row by row in float64 */
    const double scale = 1.0 / sqrt((double)D);
    const uint64_t thr = attn_dropout_threshold(c->dropout);
    double *s = malloc((size_t)Lk * sizeof(double)), *mag = malloc((size_t)Lk * sizeof(double));
    int *keep = malloc((size_t)Lk * sizeof(int));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < Lq; i++) {
                const int64_t row = (b * Hq + h) * Lq + i, g = h / (Hq / Hkv);
                const int64_t lkb = c->kvlen ? lens[b] : Lk, d_i = oracle_diag(&opt, i, lkb, Lq);
                double mx = -INFINITY, magmax = 0;
                bool nan = false;
                for (int64_t j = 0; j < Lk; j++) {
                    keep[j] = oracle_structural_keep(&opt, lkb, d_i, j) &&
                              (!mask || mask[((b * mh + (mh > 1 ? h : 0)) * Lq + i) * Lk + j]);
                    if (!keep[j]) continue;
                    double dot = 0, mg = 0;
                    for (int64_t d = 0; d < D; d++) {
                        const double t = (double)q[row * D + d] * k[((b * Hkv + g) * Lk + j) * D + d];
                        dot += t, mg += fabs(t);
                    }
                    s[j] = scale * dot, mag[j] = scale * mg;
                    if (isnan(s[j])) nan = true;
                    else if (s[j] > mx) mx = s[j];
                    if (mag[j] > magmax) magmax = mag[j];
                }
                const double sk = c->sinks ? sink[h] : -INFINITY;
                if (sk > mx) mx = sk;
                double l = sk == -INFINITY ? 0.0 : exp(sk - mx);
                for (int64_t j = 0; j < Lk; j++)
                    if (keep[j] && !nan) l += exp(s[j] - mx);
                for (int64_t j = 0; j < Lk; j++) {
                    const int64_t x = row * Lk + j;
                    if (!keep[j] || mx == -INFINITY) continue;  // exactly 0
                    if (nan) {
                        kind[x] = 2;
                        continue;
                    }
                    double p = exp(s[j] - mx) / l;
                    if (c->dropout != 0.0f)
                        p = attn_dropout_kept(1234, 99, thr, (uint64_t)row, (uint64_t)Lk, (uint64_t)j)
                                ? p / (1.0 - (double)c->dropout)
                                : 0.0;
                    ref[x] = p, kind[x] = 1;
                    /* p = exp(s_j - lse): s_j's error, the LSE's bound (the row's sum and
                     * max), exp's, the subtraction's and a dropout scaling's roundings */
                    tol[x] = p * (tol_dot_rel(D) * mag[j] + tol_lse_bound(D, Lk + 1, magmax) +
                                  (2.0 * TOL_EXP_ULP + 3.0 + fabs(s[j] - mx)) * TOL_U32) +
                             1e-37;
                }
                /* a NaN row: its masked and out-of-range weights are not checked (0 or
                 * NaN, as the tile they fall in); only the unmasked must be NaN */
                if (nan)
                    for (int64_t j = 0; j < Lk; j++)
                        if (kind[row * Lk + j] == 0) kind[row * Lk + j] = 3;
            }
    if (plant) {  // the largest checked weight, 2 bounds off
        int64_t at = -1;
        for (int64_t x = 0; x < nw; x++)
            if (kind[x] == 1 && (at < 0 || ref[x] > ref[at])) at = x;
        if (at >= 0) wb[at * c->wstride] = (float)(ref[at] + 2.0 * tol[at]);
    }
    int64_t bad = 0, first = -1, gaps = 0;
    double worst = 0;
    for (int64_t x = 0; x < nw; x++) {
        const float got = wb[x * c->wstride];
        for (int64_t e = 1; e < c->wstride; e++) gaps += wb[x * c->wstride + e] != 777.0f;
        bool ok;
        switch (kind[x]) {
        case 0: ok = got == 0.0f; break;
        case 1: {
            const double e = fabs((double)got - ref[x]);
            ok = e <= tol[x];
            if (ok && e / tol[x] > worst) worst = e / tol[x];
            break;
        }
        case 2: ok = isnan(got); break;
        default: ok = got == 0.0f || isnan(got); break;
        }
        if (!ok && bad++ == 0) first = x;
    }
    const bool pass = bad == 0 && gaps == 0 && st == ATTN_OK;
    CHECK(plant ? !pass : pass,
          "%s%s (%s): %lld weights wrong (first %lld: got %.9g want %.9g kind %d), %lld gaps "
          "written, worst err / tol %.3g", c->name, plant ? " with a planted error (must fail)" : "",
          getenv("ATTN_ISA") ? getenv("ATTN_ISA") : "probed", (long long)bad, (long long)first,
          first >= 0 ? (double)wb[first * c->wstride] : 0.0, first >= 0 ? ref[first] : 0.0,
          first >= 0 ? kind[first] : -1, (long long)gaps, worst);
    free(q), free(k), free(v), free(o), free(wb), free(ref), free(tol), free(kind), free(mask);
    free(lens), free(s), free(mag), free(keep);
}

int main(void) {
    static const wcase cases[] = {
        /* name                 B  Hq Hkv Lq   Lk   D  causal align window wl wr kvlen mask sinks drop qscale nanq nank wstride */
        {"minilm-like padding", 3, 2, 2, 199, 199, 32, 0, 0, 0, 0, 0, 1, 1, 0, 0, 1, 0, 0, 1},
        {"minilm-like strided", 3, 2, 2, 199, 199, 32, 0, 0, 0, 0, 0, 1, 1, 0, 0, 1, 0, 0, 2},
        {"bert-like dense", 1, 2, 2, 160, 257, 64, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1},
        {"causal top-left window", 2, 2, 1, 70, 300, 24, 1, 0, 1, 50, 10, 0, 0, 0, 0, 1, 0, 0, 1},
        {"causal bottom-right few rows", 2, 4, 2, 5, 300, 64, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 1, 1},
        {"decode gqa kv_len", 3, 8, 2, 1, 1000, 64, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 1, 1},
        {"decode gqa strided", 3, 8, 2, 1, 1000, 64, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 3},
        {"decode window", 1, 4, 4, 3, 700, 32, 0, 1, 1, 200, 0, 0, 0, 0, 0, 1, 0, 0, 1},
        {"sinks, empty batch", 3, 3, 3, 67, 129, 16, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 1},
        {"sinks few rows", 3, 3, 1, 2, 400, 32, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 1},
        {"dropout random mask", 2, 2, 2, 65, 131, 32, 0, 0, 0, 0, 0, 0, 2, 0, 0.3f, 1, 0, 0, 1},
        {"dropout causal strided", 2, 2, 1, 33, 200, 16, 1, 0, 0, 0, 0, 1, 0, 0, 0.5f, 1, 0, 0, 2},
        {"large logits", 1, 2, 2, 64, 128, 32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 200, 0, 0, 1},
        {"nan query row, nan past kv_len", 2, 2, 2, 40, 150, 32, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) run_case(&cases[c], false);
    run_case(&cases[0], true);
    run_case(&cases[5], true);
    return check_summary("test_weights_fast");
}
