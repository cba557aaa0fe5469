/*
 * test_forward.c — attn_forward on the fused path (and the library's own float64
 *                  reference path) against the tests' independent oracle (oracle.h),
 *                  over a generated matrix of cases.
 *
 * What it covers: sizes (L = 1 .. 1000 around the tile edges 64/128, head widths 1 .. 256,
 * Dk != Dv), GQA ratios 1/2/4/8, every mask kind alone and combined (bool mask, float
 * bias with -inf entries, broadcast shapes by size 1 and by stride 0), causal under both
 * alignments with Lq < Lk and Lq > Lk, sliding windows (-1 and 0 included), per-batch key
 * lengths (0 and Lk included), ALiBi, softcap, custom scales (0 and negative), the
 * [B, L, H, D] layout, K/V as views of a larger NaN-filled cache, K/V broadcast over the
 * batch, the LSE and weights outputs; then 1-thread vs n-thread bit identity.
 * Every case is compared with within_f32_tol (check.h) and must not write outside O's view.
 * What it is not: the edge cases one by one (test_edge.c) or bad arguments (test_api.c).
 */
#include <time.h>

#include "attn.h"
#include "check.h"
#include "core/half.h"
#include "oracle.h"

static const int64_t k_L[] = {1, 2, 3, 17, 63, 64, 65, 127, 128, 129};
#define N_L ((int)(sizeof k_L / sizeof k_L[0]))
static const int64_t k_D[][2] = {{1, 1},    {3, 3},    {8, 8},    {64, 64},  {80, 80},
                                 {96, 96},  {128, 128}, {256, 256}, {64, 128}, {128, 64},
                                 {3, 80},   {256, 8},  {1, 96},   {80, 256}};
#define N_D ((int)(sizeof k_D / sizeof k_D[0]))

static uint64_t g_seed = 1;
static int g_cases;

static fcase base(int64_t B, int64_t Hq, int64_t Hkv, int64_t Lq, int64_t Lk, int64_t Dk,
                  int64_t Dv) {
    return fcase_new(g_seed++, B, Hq, Hkv, Lq, Lk, Dk, Dv);
}

/* One case: the oracle, then the reference path, the fused path (and AUTO if asked).
 * The fused path runs with the default thread count; the reference with one thread
 * (its thread-count identity is checked in threads()), which keeps the suite's parallel
 * regions few: on a loaded 2-core machine each one can cost a scheduler time slice. */
static void run_case(const fcase *c, int also_auto) {
    if (test_case_skipped()) return;
    tcall t;
    tcall_build(&t, c);
    tcall_oracle(&t);
    const attn_path paths[3] = {ATTN_PATH_REFERENCE, ATTN_PATH_FUSED, ATTN_PATH_AUTO};
    const char *names[3] = {"reference", "fused", "auto"};
    const int threads[3] = {1, 0, 2};
    for (int p = 0; p < (also_auto ? 3 : 2); p++) {
        attn_status st = tcall_run(&t, paths[p], threads[p]);
        CHECK(st == ATTN_OK, "%s: status %d (%s: %s) [%s]", names[p], (int)st,
              attn_status_string(st), attn_last_error(), t.desc);
        if (st == ATTN_OK) tcall_check(&t, names[p]);
    }
    g_cases++;
    tcall_free(&t);
}

/* ---- 1. sizes ------------------------------------------------------------------------ */

static void sizes(void) {
    for (int li = 0; li < N_L; li++)
        for (int pi = 0; pi < N_D; pi++) {
            if ((li + pi) % 2) continue;
            fcase c = base(1, 2, 1, k_L[li], k_L[li], k_D[pi][0], k_D[pi][1]);
            run_case(&c, 0);
            /* Lq != Lk, with the other sizes of the list */
            c = base(2, 2, 2, k_L[li], k_L[(li + pi + 3) % N_L], k_D[pi][0], k_D[pi][1]);
            c.lse = 1;
            run_case(&c, 0);
        }
    /* L = 1000, in a few shapes only */
    fcase c = base(1, 1, 1, 1000, 1000, 64, 64);
    c.causal = 1;
    c.lse = 1;
    run_case(&c, 1);
    c = base(1, 8, 1, 1, 1000, 128, 128); /* decoding one row, GQA 8 */
    c.causal = 1; c.align = 1; c.lse = 1;
    run_case(&c, 1);
    c = base(1, 2, 2, 1000, 17, 80, 96);
    run_case(&c, 0);
    c = base(1, 1, 1, 65, 1000, 256, 8);
    c.kvlen = 2; c.kvlen_fixed = 999; c.lse = 1; c.weights = 1;
    run_case(&c, 0);
    c = base(2, 2, 1, 1000, 1000, 8, 8);
    c.window = 1; c.wl = 64; c.wr = 0; c.mask = 2; c.mshape = 4; c.bias_ninf = 0.05;
    run_case(&c, 0);
}

/* ---- 1b. decoding shapes: few query rows, long key ranges ------------------------------
 * Lq <= 16 with more than ~1024 keys is where a fused path splits the keys into chunks
 * and merges (m, l, acc) partials; Lq = 17 and Lk = 1024/1025 sit on either side of
 * such thresholds. Chunks left empty by kv_len or a window, a max that moves between
 * chunks, many chunks. */
static void decoding(void) {
    fcase c = base(1, 8, 1, 1, 1025, 128, 128);
    c.lse = 1;
    run_case(&c, 1);
    c = base(1, 2, 1, 1, 1024, 64, 64);
    c.lse = 1;
    run_case(&c, 0);
    c = base(2, 4, 2, 1, 5000, 64, 64);
    c.kvlen = 1; c.causal = 1; c.align = 1; c.lse = 1; c.cache = 1;
    run_case(&c, 1);
    c = base(3, 2, 1, 3, 2049, 16, 8); /* batch 2: kv_len 0, every chunk empty */
    c.kvlen = 2; c.lse = 1; c.weights = 1;
    run_case(&c, 0);
    c = base(1, 4, 4, 16, 3000, 32, 32);
    c.window = 1; c.wl = 100; c.wr = 0; c.align = 1; c.lse = 1;
    run_case(&c, 0);
    c = base(1, 4, 4, 16, 3000, 32, 32); /* top-left: the window sits in the first chunk */
    c.window = 1; c.wl = 5; c.wr = 40; c.lse = 1;
    run_case(&c, 0);
    c = base(2, 2, 2, 17, 2048, 8, 8);
    c.causal = 1; c.align = 1; c.lse = 1;
    run_case(&c, 0);
    c = base(1, 2, 1, 2, 4097, 16, 24);
    c.mask = 3; c.mshape = 7; c.bias_ninf = 0.5; c.alibi = 1; c.align = 1; c.softcap = 5.0f;
    c.layout = 1; c.lse = 1;
    run_case(&c, 0);
    c = base(2, 6, 2, 5, 1500, 8, 8); /* only key 0 is kept */
    c.kvlen = 1; c.kvlen_fixed = 1; c.lse = 1;
    run_case(&c, 0);
    c = base(1, 1, 1, 1, 20000, 8, 8);
    c.lse = 1; c.dist = 1;
    run_case(&c, 1);
    c = base(1, 8, 8, 1, 8200, 16, 16); /* enough heads for long chunks: 4096, 4096, 8 keys */
    c.lse = 1;
    run_case(&c, 1);
    c = base(1, 2, 2, 4, 4000, 16, 16); /* the row maximum sits in the last chunk */
    c.mask = 2; c.mshape = 4; c.lse = 1;
    {
        tcall t;
        tcall_build(&t, &c);
        for (int64_t i = 0; i < c.Lq; i++) t.biasb[i * c.Lk + c.Lk - 7 - i] = 9.0f;
        tcall_oracle(&t);
        for (int p = 0; p < 2; p++) {
            attn_status st = tcall_run(&t, p ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED, 0);
            CHECK(st == ATTN_OK, "late maximum: status %d", (int)st);
            if (st == ATTN_OK) tcall_check(&t, p ? "late maximum/reference" : "late maximum/fused");
        }
        g_cases++;
        tcall_free(&t);
    }
}

/* ---- 1c. asking for the weights changes nothing else -----------------------------------
 * Decoding blocks (1 query row, GQA groups of 4 and 8: one and two calls of the decoding
 * step a tile) with float32 and bfloat16 K/V, logits near 1e4 and of a few units: O and
 * LSE must be the same bits with and without the weights output, and no weight may
 * exceed 1 (the weights' sweep recomputes the logits and must meet the first sweep's
 * maxima). */
static void weights_keep_o(void) {
    for (int t = 0; t < 8; t++) {  // t >= 4: logits of a few units, many keys weigh
        const int64_t Hkv = 2, Hq = t % 2 ? 16 : 8, Lk = 700, D = t % 4 < 2 ? 64 : 128;
        const attn_dtype kdt = t % 2 ? ATTN_BF16 : ATTN_F32;
        const int64_t es = (int64_t)attn_dtype_size(kdt);
        rng_t r = {0x5eed + (uint64_t)t};
        float *q = xcalloc(Hq * D, sizeof(float)), *o1 = xcalloc(Hq * D, sizeof(float));
        float *o2 = xcalloc(Hq * D, sizeof(float)), *w = xcalloc(Hq * Lk, sizeof(float));
        float *l1 = xcalloc(Hq, sizeof(float)), *l2 = xcalloc(Hq, sizeof(float));
        char *k = xcalloc(Hkv * Lk * D, (size_t)es), *v = xcalloc(Hkv * Lk * D, (size_t)es);
        for (int64_t i = 0; i < Hq * D; i++) q[i] = (float)((t < 4 ? 40.0 : 0.2) * rng_normal(&r));
        for (int64_t i = 0; i < Hkv * Lk * D; i++) {
            const float kx = (float)rng_normal(&r), vx = (float)rng_normal(&r);
            if (kdt == ATTN_F32) {
                ((float *)k)[i] = kx, ((float *)v)[i] = vx;
            } else {
                ((uint16_t *)k)[i] = attn_f32_to_bf16(kx), ((uint16_t *)v)[i] = attn_f32_to_bf16(vx);
            }
        }
        attn_tensor tq = attn_tensor_4d(q, ATTN_F32, 1, Hq, 1, D), tk = attn_tensor_4d(k, kdt, 1, Hkv, Lk, D);
        attn_tensor tv = attn_tensor_4d(v, kdt, 1, Hkv, Lk, D);
        attn_tensor to1 = attn_tensor_4d(o1, ATTN_F32, 1, Hq, 1, D), to2 = attn_tensor_4d(o2, ATTN_F32, 1, Hq, 1, D);
        attn_tensor tw = attn_tensor_4d(w, ATTN_F32, 1, Hq, 1, Lk);
        attn_tensor tl1 = attn_tensor_4d(l1, ATTN_F32, 1, Hq, 1, 1), tl2 = attn_tensor_4d(l2, ATTN_F32, 1, Hq, 1, 1);
        attn_options op = {0};
        op.scale = 1.0f;
        op.lse = &tl1;
        const attn_status s1 = attn_forward(&tq, &tk, &tv, &to1, &op);
        op.lse = &tl2;
        op.weights = &tw;
        const attn_status s2 = attn_forward(&tq, &tk, &tv, &to2, &op);
        CHECK(s1 == ATTN_OK && s2 == ATTN_OK, "weights keep O (case %d): status %d, %d", t, (int)s1, (int)s2);
        CHECK(memcmp(o1, o2, (size_t)(Hq * D) * sizeof(float)) == 0 &&
                  memcmp(l1, l2, (size_t)Hq * sizeof(float)) == 0,
              "weights keep O (case %d, %s K/V, %lld query heads): O or LSE changed when the weights "
              "were asked for", t, kdt == ATTN_F32 ? "float32" : "bfloat16", (long long)Hq);
        /* each row sums to 1 within its weights' relative bound (tol_weight_rel: the
         * logit's and the LSE's errors, derived; the sum itself in double) */
        double *mag = xcalloc(Hq, sizeof(double));
        oracle_logit_mag(&tq, &tk, &op, mag);
        float wmax = 0.0f;
        double worst_sum = 0.0;
        for (int64_t h = 0; h < Hq; h++) {
            double sum = 0;
            for (int64_t j = 0; j < Lk; j++) {
                wmax = w[h * Lk + j] > wmax ? w[h * Lk + j] : wmax;
                sum += w[h * Lk + j];
            }
            worst_sum = fmax(worst_sum, fabs(sum - 1.0) / (tol_weight_rel(D, Lk, mag[h]) * fmax(sum, 1.0)));
        }
        free(mag);
        CHECK(wmax <= 1.0f && worst_sum <= 1.0, "weights keep O (case %d): max weight %.9g, "
              "worst |row sum - 1| %.3g of its bound", t, (double)wmax, worst_sum);
        g_cases++;
        free(q), free(o1), free(o2), free(w), free(l1), free(l2), free(k), free(v);
    }
}

/* ---- 2. grouped-query attention ------------------------------------------------------ */

static void gqa(void) {
    const int ratios[] = {1, 2, 4, 8};
    for (int ri = 0; ri < 4; ri++)
        for (int64_t hkv = 1; hkv <= 3; hkv++) {
            int64_t hq = ratios[ri] * hkv;
            fcase c = base(2, hq, hkv, 17, 65, 8, 3);
            run_case(&c, 0);
            c = base(1, hq, hkv, 65, 64, 64, 80);
            c.causal = 1; c.align = (int)(hkv & 1); c.lse = 1;
            run_case(&c, 0);
            c = base(3, hq, hkv, 1, 129, 128, 64);
            c.kvlen = 1; c.alibi = 1; c.mask = 1; c.mshape = 2 | 1;
            run_case(&c, 0);
            c = base(2, hq, hkv, 3, 63, 3, 8);
            c.kv_bcast = 1; c.weights = 1;
            run_case(&c, 0);
        }
}

/* ---- 3. every feature alone, on a few shapes ------------------------------------------ */

/* A custom scale of m / sqrt(Dk). Why relative: the contract's float32 tolerance
 * (relative error 1e-6) sits at the float32 rounding floor of the logits once |s| is
 * about 10 — a logit s rounded to float is already off by |s| * 6e-8, and the weights
 * inherit that relative error — so a case whose logits reach 20..30 (scale 2.5 on
 * Dk = 96) fails with any float32 implementation, the naive one included (measured:
 * 1.1e-6 to 1.6e-6). Scaling with 1/sqrt(Dk) keeps the logits where the tolerance is
 * meaningful; the value is still not the default, so has_scale is still tested. */
static float rel_scale(double m, int64_t Dk) { return (float)(m / sqrt((double)Dk)); }

/* Feature f applied to c; returns 0 when f is past the end of the list. */
static int feature(fcase *c, int f, char *name, size_t n) {
    static const int mshapes[] = {0, 1, 2, 4, 1 | 4, 1 | 2 | 4, 8 | 4, 8 | 1, 8, 8 | 2};
    static const int64_t wins[][2] = {{-1, -1}, {0, 0}, {3, -1}, {-1, 2}, {5, 5},
                                      {0, -1},  {-1, 0}, {2, 1},  {40, 7}};
    const int nm = (int)(sizeof mshapes / sizeof mshapes[0]);
    const int nw = (int)(sizeof wins / sizeof wins[0]);
    int i = f;
    if (i < nm) { c->mask = 1; c->mshape = mshapes[i]; snprintf(name, n, "bool mask shape %d", mshapes[i]); return 1; }
    i -= nm;
    if (i < nm) { c->mask = 2; c->mshape = mshapes[i]; c->bias_ninf = 0.1; snprintf(name, n, "bias shape %d", mshapes[i]); return 1; }
    i -= nm;
    if (i < nm) { c->mask = 3; c->mshape = mshapes[i]; c->bias_ninf = 0.2; c->mask_true = 0.6; snprintf(name, n, "mask+bias shape %d", mshapes[i]); return 1; }
    i -= nm;
    if (i < 2) { c->causal = 1; c->align = i; snprintf(name, n, "causal align %d", i); return 1; }
    i -= 2;
    if (i < 4 * nw) {
        c->window = 1; c->wl = wins[i / 4][0]; c->wr = wins[i / 4][1];
        c->align = i & 1; c->causal = (i >> 1) & 1;
        snprintf(name, n, "window %lld %lld align %d causal %d", (long long)c->wl, (long long)c->wr, c->align, c->causal);
        return 1;
    }
    i -= 4 * nw;
    switch (i) {
    case 0: c->kvlen = 1; snprintf(name, n, "kv_len i32"); return 1;
    case 1: c->kvlen = 2; snprintf(name, n, "kv_len i64"); return 1;
    case 2: c->kvlen = 1; c->kvlen_fixed = 0; snprintf(name, n, "kv_len 0"); return 1;
    case 3: c->kvlen = 2; c->kvlen_fixed = c->Lk; snprintf(name, n, "kv_len Lk"); return 1;
    case 4: c->kvlen = 1; c->kvlen_fixed = 1; snprintf(name, n, "kv_len 1"); return 1;
    case 5: c->kvlen = 2; c->align = 1; c->causal = 1; snprintf(name, n, "kv_len + causal bottom-right"); return 1;
    case 6: c->alibi = 1; snprintf(name, n, "alibi"); return 1;
    case 7: c->alibi = 1; c->align = 1; snprintf(name, n, "alibi bottom-right"); return 1;
    case 8: c->softcap = 5.0f; snprintf(name, n, "softcap 5"); return 1;
    case 9: c->softcap = 0.7f; c->dist = 1; c->has_scale = 1; c->scale = rel_scale(3.0, c->Dk); snprintf(name, n, "softcap 0.7"); return 1;
    /* custom scales as multiples of 1/sqrt(Dk): see rel_scale() */
    case 10: c->has_scale = 1; c->scale = 0.0f; snprintf(name, n, "scale 0"); return 1;
    case 11: c->has_scale = 1; c->scale = rel_scale(-0.3, c->Dk); snprintf(name, n, "scale -0.3/sqrt(Dk)"); return 1;
    case 12: c->has_scale = 1; c->scale = rel_scale(2.5, c->Dk); snprintf(name, n, "scale 2.5/sqrt(Dk)"); return 1;
    case 13: c->has_scale = 1; c->scale = 1e-3f; snprintf(name, n, "scale 1e-3"); return 1;
    case 23: c->has_scale = 1; c->scale = -2.5f; c->Dk = 3; snprintf(name, n, "scale -2.5, Dk 3"); return 1;
    case 14: c->layout = 1; snprintf(name, n, "[B, L, H, D]"); return 1;
    case 15: c->cache = 1; snprintf(name, n, "kv cache view"); return 1;
    case 16: c->cache = 1; c->layout = 1; snprintf(name, n, "[B, L, H, D] cache view"); return 1;
    case 17: c->kv_bcast = 1; snprintf(name, n, "k/v batch stride 0"); return 1;
    case 18: c->lse = 1; snprintf(name, n, "lse"); return 1;
    case 19: c->weights = 1; snprintf(name, n, "weights"); return 1;
    case 20: c->lse = 1; c->weights = 1; c->layout = 1; snprintf(name, n, "lse + weights, [B, L, H, D]"); return 1;
    case 21: c->dist = 1; snprintf(name, n, "N(0, 1) inputs"); return 1;
    case 22: c->lse = 1; c->weights = 1; c->causal = 1; c->align = 1; c->kvlen = 1; snprintf(name, n, "lse + weights with empty rows"); return 1;
    }
    return 0;
}

static void features(void) {
    const int64_t shapes[][7] = {
        {2, 4, 2, 17, 65, 8, 3},     /* Lq < Lk */
        {3, 2, 1, 65, 17, 64, 80},   /* Lq > Lk */
        {1, 2, 2, 64, 64, 96, 96},   /* square, one tile */
        {2, 8, 2, 1, 129, 128, 128}, /* decoding */
        {1, 2, 2, 129, 127, 1, 256},
    };
    char name[128];
    for (int f = 0;; f++) {
        fcase probe = base(1, 1, 1, 1, 1, 1, 1);
        if (!feature(&probe, f, name, sizeof name)) break;
        for (int s = 0; s < 5; s++) {
            if (s == 4 && f % 4) continue; /* the widest shape for a quarter of them */
            fcase c = base(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], shapes[s][4],
                           shapes[s][5], shapes[s][6]);
            feature(&c, f, name, sizeof name);
            run_case(&c, s == 0);
        }
    }
}

/* ---- 3b. unusual strides on everything else ------------------------------------------
 * mask and bias stored transposed ([B, Hq, Lk, Lq] storage), kv_len and ALiBi slopes
 * with stride 2 and 3, weights written transposed, q read with its rows reversed
 * (negative stride), v with a non-unit stride in D. */
static void odd_strides(void) {
    /* variants 4..7: the bool mask alone (no bias, no slopes), the library's mask-only
     * path, on rows of stacked query heads (Lq < 64 under GQA) with keys not contiguous */
    for (int variant = 0; variant < 8; variant++) {
        const int v = variant & 3;
        fcase c = base(3, 4, 2, 17, 65, 16, 8);
        c.mask = variant < 4 ? 3 : 1; c.mshape = v & 1 ? 7 : 4; c.bias_ninf = 0.1;
        c.kvlen = 2 - (v >> 1); c.alibi = variant < 4; c.lse = 1; c.weights = 1;
        c.causal = v >> 1; c.align = v & 1;
        tcall t;
        tcall_build(&t, &c);
        /* mask and bias: the same logical values, stored with Lq and Lk swapped */
        attn_tensor *ms[2] = {&t.mask, &t.bias};
        void *copies[2] = {NULL, NULL};
        for (int m = 0; m < 2; m++) {
            if (!(c.mask & (1 << m))) continue;
            attn_tensor *x = ms[m];
            int64_t d0 = x->shape[0], d1 = x->shape[1], d2 = x->shape[2], d3 = x->shape[3];
            size_t es = m == 0 ? 1 : 4;
            char *buf = (char *)xcalloc(d0 * d1 * d2 * d3, es);
            attn_tensor y = *x;
            y.data = buf;
            y.stride[0] = d1 * d3 * d2; y.stride[1] = d3 * d2; y.stride[2] = 1; y.stride[3] = d2;
            for (int64_t a = 0; a < d0; a++)
                for (int64_t b = 0; b < d1; b++)
                    for (int64_t i = 0; i < d2; i++)
                        for (int64_t j = 0; j < d3; j++)
                            memcpy(buf + es * (a * y.stride[0] + b * y.stride[1] + i * y.stride[2] + j * y.stride[3]),
                                   (char *)x->data + es * (a * x->stride[0] + b * x->stride[1] + i * x->stride[2] + j * x->stride[3]), es);
            *x = y;
            copies[m] = buf;
        }
        /* kv_len with stride 2, slopes with stride 3 */
        int64_t *kl = (int64_t *)xcalloc(2 * c.B, 8);
        int32_t *kl32 = (int32_t *)xcalloc(2 * c.B, 4);
        for (int64_t b = 0; b < c.B; b++) {
            kl[2 * b] = t_len(&t.kvlen, b); kl[2 * b + 1] = -77;
            kl32[2 * b] = (int32_t)kl[2 * b]; kl32[2 * b + 1] = -77;
        }
        t.kvlen.data = t.kvlen.dtype == ATTN_I64 ? (void *)kl : (void *)kl32;
        t.kvlen.stride[0] = 2;
        float *sl = (float *)xcalloc(3 * c.Hq, 4);
        if (c.alibi) {
            for (int64_t h = 0; h < c.Hq; h++) { sl[3 * h] = t.slopeb[h]; sl[3 * h + 1] = NAN; }
            t.alibi.data = sl;
            t.alibi.stride[0] = 3;
        }
        /* weights written [B, Hq, Lk, Lq] */
        t.w.stride[2] = 1; t.w.stride[3] = c.Lq;
        /* q rows reversed */
        t.q.data = (float *)t.q.data + (c.Lq - 1) * t.q.stride[2];
        t.q.stride[2] = -t.q.stride[2];
        tcall_oracle(&t);
        for (int p = 0; p < 2; p++) {
            attn_path path = p ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED;
            attn_status st = tcall_run(&t, path, 0);
            CHECK(st == ATTN_OK, "odd strides %d path %d: status %d (%s)", variant, (int)path, (int)st, attn_last_error());
            if (st == ATTN_OK) tcall_check(&t, p ? "odd strides/reference" : "odd strides/fused");
        }
        g_cases++;
        free(copies[0]); free(copies[1]); free(kl); free(kl32); free(sl);
        tcall_free(&t);
    }
}

/* ---- 4. random combinations --------------------------------------------------------- */

static void combos(int n) {
    rng_t r = {20240601};
    static const int ratios[] = {1, 2, 4, 8};
    static const int64_t wv[] = {-1, 0, 1, 3, 8, 40};
    static const float caps[] = {0.5f, 5.0f, 30.0f};
    static const float scales[] = {0.0f, -0.5f, 2.0f, 0.1f};
    static const double trues[] = {0.8, 0.3, 0.95};
    for (int it = 0; it < n; it++) {
        int64_t Hkv = 1 + rng_int(&r, 2), Hq = Hkv * ratios[rng_int(&r, 4)];
        int64_t B = 1 + rng_int(&r, 3), Lq, Lk, Dk, Dv;
        do { /* keep a case under ~3M multiply-adds */
            Lq = k_L[rng_int(&r, N_L)];
            Lk = k_L[rng_int(&r, N_L)];
            int pi = (int)rng_int(&r, N_D);
            Dk = k_D[pi][0];
            Dv = k_D[pi][1];
        } while (B * Hq * Lq * Lk * (Dk + Dv) > 4000000);
        fcase c = base(B, Hq, Hkv, Lq, Lk, Dk, Dv);
        c.layout = (int)rng_int(&r, 2);
        c.cache = rng_int(&r, 3) == 0;
        c.kv_bcast = !c.cache && rng_int(&r, 6) == 0;
        c.mask = (int)rng_int(&r, 4);
        c.mshape = (int)rng_int(&r, 16);
        c.bias_ninf = rng_int(&r, 3) == 0 ? 0.3 : 0.05;
        c.mask_true = trues[rng_int(&r, 3)];
        c.causal = (int)rng_int(&r, 2);
        c.align = (int)rng_int(&r, 2);
        c.window = rng_int(&r, 3) == 0;
        c.wl = wv[rng_int(&r, 6)];
        c.wr = wv[rng_int(&r, 6)];
        c.kvlen = (int)rng_int(&r, 3);
        c.alibi = rng_int(&r, 4) == 0;
        c.softcap = rng_int(&r, 4) == 0 ? caps[rng_int(&r, 3)] : 0.0f;
        c.has_scale = rng_int(&r, 3) == 0;
        float sv = scales[rng_int(&r, 4)];
        c.scale = sv == 0.0f ? 0.0f : rel_scale(sv, Dk);
        c.lse = (int)rng_int(&r, 2);
        c.weights = rng_int(&r, 4) == 0;
        c.dist = (int)rng_int(&r, 2);
        run_case(&c, rng_int(&r, 4) == 0);
    }
}

/* ---- 5. thread-count bit identity ------------------------------------------------ */

static void thread_identity(const fcase *c, int with_reference) {
    tcall t;
    tcall_build(&t, c);
    tcall_oracle(&t);
    const attn_path paths[2] = {ATTN_PATH_FUSED, ATTN_PATH_REFERENCE};
    for (int p = 0; p < 1 + with_reference; p++) {
        attn_status st = tcall_run(&t, paths[p], 1);
        CHECK(st == ATTN_OK, "threads=1 path %d: status %d [%s]", (int)paths[p], (int)st, t.desc);
        if (st != ATTN_OK) continue;
        if (p == 0) tcall_check(&t, "fused threads=1");
        float *o1 = (float *)xcalloc(t.on, sizeof(float));
        float *l1 = (float *)xcalloc(t.lsen, sizeof(float));
        float *w1 = (float *)xcalloc(t.wn, sizeof(float));
        memcpy(o1, t.ob, (size_t)t.on * sizeof(float));
        if (t.lseb) memcpy(l1, t.lseb, (size_t)t.lsen * sizeof(float));
        if (t.wb) memcpy(w1, t.wb, (size_t)t.wn * sizeof(float));
        const int counts[4] = {2, 3, 0, 2}; /* the last 2 is a repeated run */
        for (int n = 0; n < 4; n++) {
            st = tcall_run(&t, paths[p], counts[n]);
            CHECK(st == ATTN_OK, "threads=%d: status %d [%s]", counts[n], (int)st, t.desc);
            CHECK(memcmp(o1, t.ob, (size_t)t.on * sizeof(float)) == 0,
                  "path %d: O with threads=%d differs from threads=1 [%s]", (int)paths[p], counts[n], t.desc);
            if (t.lseb)
                CHECK(memcmp(l1, t.lseb, (size_t)t.lsen * sizeof(float)) == 0,
                      "path %d: LSE with threads=%d differs from threads=1 [%s]", (int)paths[p], counts[n], t.desc);
            if (t.wb)
                CHECK(memcmp(w1, t.wb, (size_t)t.wn * sizeof(float)) == 0,
                      "path %d: weights with threads=%d differ from threads=1 [%s]", (int)paths[p], counts[n], t.desc);
        }
        free(o1); free(l1); free(w1);
    }
    g_cases++;
    tcall_free(&t);
}

static void threads(void) {
    fcase c = base(2, 8, 2, 200, 200, 64, 64);
    c.causal = 1; c.mask = 1; c.mshape = 1 | 4; c.lse = 1;
    thread_identity(&c, 0);
    c = base(1, 4, 1, 1, 4000, 128, 128); /* one-row decoding over a long cache */
    c.lse = 1; c.layout = 1; c.cache = 1;
    thread_identity(&c, 0);
    c = base(2, 4, 1, 3, 3000, 16, 16);   /* a few rows, GQA, over a long cache */
    c.lse = 1; c.kvlen = 1; c.mask = 2; c.mshape = 2;
    thread_identity(&c, 0);
    c = base(3, 2, 2, 129, 600, 64, 32);
    c.kvlen = 2; c.lse = 1; c.weights = 1; c.alibi = 1; c.causal = 1; c.align = 1;
    thread_identity(&c, 1);
}

static double now(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(void) {
    struct { const char *name; void (*fn)(void); } parts[] = {
        {"sizes", sizes}, {"decoding", decoding}, {"weights", weights_keep_o}, {"gqa", gqa}, {"features", features}, {"strides", odd_strides},
        {"threads", threads}};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        double t0 = now();
        int c0 = g_cases;
        parts[i].fn();
        fprintf(stderr, "forward: %-9s %4d cases %6.2f s\n", parts[i].name, g_cases - c0, now() - t0);
    }
    double t0 = now();
    int c0 = g_cases;
    combos(500);
    fprintf(stderr, "forward: %-9s %4d cases %6.2f s\n", "combos", g_cases - c0, now() - t0);
    return check_summary("forward");
}
