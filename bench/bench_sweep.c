/*
 * bench_sweep.c — the cases of `attn bench`'s main sweep and their inputs: the default
 *                 sweep (docs/BENCHMARKS.md) and the --quick one, each case's FLOPs and
 *                 bytes, and its input sets: copies rotated through so that a timed call
 *                 does not find its inputs in the cache, filled from a fixed stream (rng.h),
 *                 16-bit ones rounded from the same values (naive_round), with the
 *                 tensors and options of each call.
 *
 * What it is not: the check (bench_check.c) or the timing (bench_time.c); the parts
 * are listed in bench_sweep.h.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_sweep.h"
#include "core/half.h"
#include "naive.h"
#include "rng.h"

/* ---- the cases ---------------------------------------------------------------------- */


static void add_case(bench_case *c, int *n, const char *name, int64_t B, int64_t Hq,
                     int64_t Hkv, int64_t Lq, int64_t Lk, int64_t D, mask_kind mask,
                     int64_t win_left, int64_t win_right, bool decode) {
    bench_case *x = &c[(*n)++];
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", name);
    x->B = B, x->Hq = Hq, x->Hkv = Hkv, x->Lq = Lq, x->Lk = Lk, x->Dk = D, x->Dv = D;
    x->mask = mask, x->win_left = win_left, x->win_right = win_right, x->decode = decode;
    x->ref_med = x->torch_med = x->torch_min = x->torch_max = x->base_ratio = -1.0;
    x->qdt = x->kvdt = ATTN_F32;
}

/* The last case added, made a 16-bit (or mixed) one: `base` is the float32 row of the
 * same shape that its speed is compared with. */
static void set_dtype(bench_case *c, int n, attn_dtype qdt, attn_dtype kvdt,
                      attn_precision prec, const char *base) {
    bench_case *x = &c[n - 1];
    x->qdt = qdt, x->kvdt = kvdt, x->prec = prec;
    snprintf(x->base, sizeof x->base, "%s", base);
}

const char *dtype_short(attn_dtype t) {
    return t == ATTN_F16 ? "f16" : t == ATTN_BF16 ? "bf16" : "f32";
}

/* The default sweep (docs/BENCHMARKS.md) or, with --quick, a tiny one of the same kinds. */
int make_sweep(bench_case *c, bool quick) {
    int n = 0;
    char name[64];
    const int64_t Ls[] = {512, 1024, 2048, 4096}, qLs[] = {64, 200};
    const int64_t Ds[] = {64, 128}, qDs[] = {16, 64};
    const int64_t H = quick ? 2 : 16;
    for (int li = 0; li < 4; li++) {
        if (quick && li >= 2) break;
        const int64_t L = quick ? qLs[li] : Ls[li];
        for (int di = 0; di < 2; di++)
            for (int causal = 0; causal < 2; causal++) {
                const int64_t D = quick ? qDs[di] : Ds[di];
                snprintf(name, sizeof name, "fwd-L%lld-D%lld%s", (long long)L, (long long)D,
                         causal ? "-causal" : "");
                add_case(c, &n, name, 1, H, H, L, L, D, causal ? MASK_CAUSAL : MASK_NONE,
                         0, 0, false);
            }
    }
    if (quick) {
        add_case(c, &n, "gqa-L96-D32-causal", 1, 4, 2, 96, 96, 32, MASK_CAUSAL, 0, 0, false);
        add_case(c, &n, "mask-L80-D32-bool", 2, 2, 2, 80, 80, 32, MASK_BOOL, 0, 0, false);
        add_case(c, &n, "win-L128-D32-w32", 1, 2, 2, 128, 128, 32, MASK_WINDOW, 31, 0, false);
        add_case(c, &n, "decode-Lk1000-D32", 1, 4, 2, 1, 1000, 32, MASK_NONE, 0, 0, true);
        add_case(c, &n, "fwd-L64-D16-bf16", 1, H, H, 64, 64, 16, MASK_NONE, 0, 0, false);
        set_dtype(c, n, ATTN_BF16, ATTN_BF16, ATTN_PRECISION_DEFAULT, "fwd-L64-D16");
        add_case(c, &n, "fwd-L64-D16-bf16-fast", 1, H, H, 64, 64, 16, MASK_NONE, 0, 0, false);
        set_dtype(c, n, ATTN_BF16, ATTN_BF16, ATTN_PRECISION_FAST, "fwd-L64-D16");
        add_case(c, &n, "decode-Lk1000-D32-kvf16", 1, 4, 2, 1, 1000, 32, MASK_NONE, 0, 0, true);
        set_dtype(c, n, ATTN_F32, ATTN_F16, ATTN_PRECISION_DEFAULT, "decode-Lk1000-D32");
        add_case(c, &n, "bwd-L64-D16", 1, H, H, 64, 64, 16, MASK_NONE, 0, 0, false);
        c[n - 1].bwd = true;
        add_case(c, &n, "bwd-L96-D32-gqa-causal", 1, 4, 2, 96, 96, 32, MASK_CAUSAL, 0, 0, false);
        c[n - 1].bwd = true;
    } else {
        add_case(c, &n, "gqa-L2048-D128", 1, 32, 8, 2048, 2048, 128, MASK_NONE, 0, 0, false);
        add_case(c, &n, "gqa-L2048-D128-causal", 1, 32, 8, 2048, 2048, 128, MASK_CAUSAL, 0, 0, false);
        add_case(c, &n, "mask-L2048-D64-bool", 1, 16, 16, 2048, 2048, 64, MASK_BOOL, 0, 0, false);
        add_case(c, &n, "win-L4096-D64-w512", 1, 16, 16, 4096, 4096, 64, MASK_WINDOW, 511, 0, false);
        add_case(c, &n, "decode-Lk16384-D128", 1, 32, 8, 1, 16384, 128, MASK_NONE, 0, 0, true);
        /* a GQA group of 8 query heads a key/value head (16 rows a tile) */
        add_case(c, &n, "decode-Lk16384-D128-g8", 1, 64, 8, 1, 16384, 128, MASK_NONE, 0, 0, true);
        /* the 16-bit forward and a 16-bit KV cache */
        add_case(c, &n, "fwd-L4096-D128-bf16", 1, 16, 16, 4096, 4096, 128, MASK_NONE, 0, 0, false);
        set_dtype(c, n, ATTN_BF16, ATTN_BF16, ATTN_PRECISION_DEFAULT, "fwd-L4096-D128");
        add_case(c, &n, "fwd-L4096-D128-bf16-fast", 1, 16, 16, 4096, 4096, 128, MASK_NONE, 0, 0, false);
        set_dtype(c, n, ATTN_BF16, ATTN_BF16, ATTN_PRECISION_FAST, "fwd-L4096-D128");
        add_case(c, &n, "fwd-L4096-D128-f16", 1, 16, 16, 4096, 4096, 128, MASK_NONE, 0, 0, false);
        set_dtype(c, n, ATTN_F16, ATTN_F16, ATTN_PRECISION_DEFAULT, "fwd-L4096-D128");
        add_case(c, &n, "decode-Lk16384-D128-kvbf16", 1, 32, 8, 1, 16384, 128, MASK_NONE, 0, 0, true);
        set_dtype(c, n, ATTN_F32, ATTN_BF16, ATTN_PRECISION_DEFAULT, "decode-Lk16384-D128");
        add_case(c, &n, "decode-Lk16384-D128-kvf16", 1, 32, 8, 1, 16384, 128, MASK_NONE, 0, 0, true);
        set_dtype(c, n, ATTN_F32, ATTN_F16, ATTN_PRECISION_DEFAULT, "decode-Lk16384-D128");
        add_case(c, &n, "decode-Lk16384-D128-bf16", 1, 32, 8, 1, 16384, 128, MASK_NONE, 0, 0, true);
        set_dtype(c, n, ATTN_BF16, ATTN_BF16, ATTN_PRECISION_DEFAULT, "decode-Lk16384-D128");
        add_case(c, &n, "decode-Lk16384-D128-bf16-fast", 1, 32, 8, 1, 16384, 128, MASK_NONE, 0, 0, true);
        set_dtype(c, n, ATTN_BF16, ATTN_BF16, ATTN_PRECISION_FAST, "decode-Lk16384-D128");
        /* the backward, float32 */
        for (int di = 0; di < 2; di++)
            for (int causal = 0; causal < 2; causal++) {
                snprintf(name, sizeof name, "bwd-L2048-D%lld%s", (long long)Ds[di],
                         causal ? "-causal" : "");
                add_case(c, &n, name, 1, 16, 16, 2048, 2048, Ds[di],
                         causal ? MASK_CAUSAL : MASK_NONE, 0, 0, false);
                c[n - 1].bwd = true;
            }
    }
    return n;
}

/* Keys row i attends to structurally (top-left diagonal d_i = i). */
static int64_t band_pairs(const bench_case *c) {
    int64_t n = 0;
    for (int64_t i = 0; i < c->Lq; i++) {
        int64_t lo = c->win_left < 0 ? 0 : i - c->win_left;
        int64_t hi = c->win_right < 0 ? c->Lk - 1 : i + c->win_right;
        if (lo < 0) lo = 0;
        if (hi > c->Lk - 1) hi = c->Lk - 1;
        if (hi >= lo) n += hi - lo + 1;
    }
    return n;
}

void count_work(bench_case *c) {
    double pairs = (double)c->Lq * (double)c->Lk;
    if (c->mask == MASK_CAUSAL) pairs *= 0.5;
    if (c->mask == MASK_WINDOW) pairs = (double)band_pairs(c);
    c->flop = 2.0 * (double)(c->Dk + c->Dv) * (double)c->B * (double)c->Hq * pairs;
    if (c->bwd) c->flop *= 2.5;  /* FlashAttention's convention */
    c->kv_bytes = (double)attn_dtype_size(c->kvdt) * (double)c->B * (double)c->Hkv * (double)c->Lk * (double)(c->Dk + c->Dv);
}

/* ---- inputs ------------------------------------------------------------------------- */

/* uniform in [-2, 2) from a fixed stream, so every run times the same numbers: with
 * scale 1/sqrt(Dk), logits of standard deviation about 1.3 */
static void fill_uniform(float *x, int64_t n, uint64_t seed) {
    rng_t r = {seed};
    for (int64_t i = 0; i < n; i++) x[i] = (float)rng_range(&r, -2.0, 2.0);
}

/* 16-bit storage of a float representable in t (naive_round gives one): the library's own
 * codec (half.h), exact for such a value */
static uint16_t half_bits(attn_dtype t, float x) {
    return t == ATTN_BF16 ? attn_f32_to_bf16(x) : attn_f32_to_f16(x);
}

void free_buffers(case_buffers *cb) {
    for (int r = 0; r < 16; r++) {
        free(cb->q[r]), free(cb->k[r]), free(cb->v[r]), free(cb->o[r]);
        free(cb->d_o[r]), free(cb->lse[r]), free(cb->dq[r]), free(cb->dk[r]), free(cb->dv[r]);
    }
    free(cb->q32), free(cb->k32), free(cb->v32);
    free(cb->mask);
    free(cb->ws);
    memset(cb, 0, sizeof *cb);
}

/* n elements of `size` bytes, 64-byte aligned as PyTorch's tensors are (a cache line),
 * plus a spare line. */
static void *alloc64(int64_t n, size_t size) {
    return aligned_alloc(64, ((size_t)n * size + 127) / 64 * 64);
}

/* n uniform values rounded to t, stored in t, and as float in f32 (may be NULL) */
static void fill_typed(attn_dtype t, void *dst, float *f32, int64_t n, uint64_t seed) {
    float *x = t == ATTN_F32 ? dst : f32 ? f32 : malloc((size_t)n * sizeof(float));
    if (!x) abort();
    fill_uniform(x, n, seed);
    if (t != ATTN_F32)
        for (int64_t i = 0; i < n; i++) {
            x[i] = naive_round(t, x[i]);
            ((uint16_t *)dst)[i] = half_bits(t, x[i]);
        }
    if (f32 && t == ATTN_F32) memcpy(f32, x, (size_t)n * sizeof(float));
    if (x != dst && x != f32) free(x);
}

/* rot copies of the inputs and outputs, at least rot_bytes in all (at most 16 copies). */
int alloc_buffers(const bench_case *c, double rot_bytes, case_buffers *cb) {
    memset(cb, 0, sizeof *cb);
    const size_t sq = attn_dtype_size(c->qdt), skv = attn_dtype_size(c->kvdt);
    double set_bytes = (double)sq * (double)(n_q(c) + n_o(c)) + (double)skv * (double)(n_k(c) + n_v(c));
    if (c->bwd) set_bytes += 4.0 * (double)(n_o(c) + n_lse(c) + n_q(c) + n_k(c) + n_v(c));
    int rot = (int)ceil(rot_bytes / (set_bytes > 1 ? set_bytes : 1));
    cb->rot = rot < 1 ? 1 : rot > 16 ? 16 : rot;
    if (!(cb->q32 = alloc64(n_q(c), 4)) || !(cb->k32 = alloc64(n_k(c), 4)) ||
        !(cb->v32 = alloc64(n_v(c), 4)))
        return -1;
    for (int r = 0; r < cb->rot; r++) {
        cb->q[r] = alloc64(n_q(c), sq);
        cb->k[r] = alloc64(n_k(c), skv);
        cb->v[r] = alloc64(n_v(c), skv);
        cb->o[r] = alloc64(n_o(c), sq);
        if (!cb->q[r] || !cb->k[r] || !cb->v[r] || !cb->o[r]) return -1;
        memset(cb->o[r], 0, (size_t)n_o(c) * sq);
        if (r == 0) {
            fill_typed(c->qdt, cb->q[0], cb->q32, n_q(c), 1);
            fill_typed(c->kvdt, cb->k[0], cb->k32, n_k(c), 2);
            fill_typed(c->kvdt, cb->v[0], cb->v32, n_v(c), 3);
        } else {
            memcpy(cb->q[r], cb->q[0], (size_t)n_q(c) * sq);
            memcpy(cb->k[r], cb->k[0], (size_t)n_k(c) * skv);
            memcpy(cb->v[r], cb->v[0], (size_t)n_v(c) * skv);
        }
        if (c->bwd) {
            cb->d_o[r] = alloc64(n_o(c), 4), cb->lse[r] = alloc64(n_lse(c), 4);
            cb->dq[r] = alloc64(n_q(c), 4), cb->dk[r] = alloc64(n_k(c), 4);
            cb->dv[r] = alloc64(n_v(c), 4);
            if (!cb->d_o[r] || !cb->lse[r] || !cb->dq[r] || !cb->dk[r] || !cb->dv[r]) return -1;
            if (r == 0) fill_uniform(cb->d_o[0], n_o(c), 5);
            else memcpy(cb->d_o[r], cb->d_o[0], (size_t)n_o(c) * 4);
        }
    }
    if (c->mask == MASK_BOOL) {
        if (!(cb->mask = malloc((size_t)(c->Lq * c->Lk)))) return -1;
        rng_t r = {4};
        for (int64_t i = 0; i < c->Lq * c->Lk; i++) cb->mask[i] = rng_unif(&r) < BOOL_MASK_DENSITY;
    }
    return 0;
}

/* The options of a case on a given path. */
attn_options case_options(const bench_case *c, const attn_tensor *mask, int threads,
                          attn_path path) {
    attn_options opt = {0};
    opt.path = path;
    opt.threads = threads;
    opt.precision = c->prec;
    opt.causal = c->mask == MASK_CAUSAL;
    if (c->mask == MASK_WINDOW) {
        opt.has_window = true;
        opt.window_left = c->win_left;
        opt.window_right = c->win_right;
    }
    if (c->mask == MASK_BOOL) opt.mask = mask;
    return opt;
}

case_tensors tensors_of(const bench_case *c, const case_buffers *cb, int r) {
    case_tensors t;
    t.q = attn_tensor_4d(cb->q[r], c->qdt, c->B, c->Hq, c->Lq, c->Dk);
    t.k = attn_tensor_4d(cb->k[r], c->kvdt, c->B, c->Hkv, c->Lk, c->Dk);
    t.v = attn_tensor_4d(cb->v[r], c->kvdt, c->B, c->Hkv, c->Lk, c->Dv);
    t.o = attn_tensor_4d(cb->o[r], c->qdt, c->B, c->Hq, c->Lq, c->Dv);
    t.mask = attn_tensor_4d(cb->mask, ATTN_BOOL, 1, 1, c->Lq, c->Lk);
    t.d_o = attn_tensor_4d(cb->d_o[r], ATTN_F32, c->B, c->Hq, c->Lq, c->Dv);
    t.lse = attn_tensor_4d(cb->lse[r], ATTN_F32, c->B, c->Hq, c->Lq, 1);
    t.dq = attn_tensor_4d(cb->dq[r], ATTN_F32, c->B, c->Hq, c->Lq, c->Dk);
    t.dk = attn_tensor_4d(cb->dk[r], ATTN_F32, c->B, c->Hkv, c->Lk, c->Dk);
    t.dv = attn_tensor_4d(cb->dv[r], ATTN_F32, c->B, c->Hkv, c->Lk, c->Dv);
    return t;
}

bool call_failed(bench_case *c, attn_status st, const char *what) {
    if (st == ATTN_OK) return false;
    snprintf(c->error, sizeof c->error, "%s: %s: %s", what, attn_status_string(st), attn_last_error());
    return true;
}
