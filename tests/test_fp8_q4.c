/*
 * test_fp8_q4.c — the fp8 KV cache dtypes (ATTN_FP8_E4M3, ATTN_FP8_E5M2) and their scales,
 *                 and the q4_0 one (ATTN_Q4_0).
 *
 * 1. The formats, code by code: each of the 256 bytes of each format against a decoder
 *    written here from the OCP definition (ldexp of the fields, not bit moves), through
 *    the library's conversion and through the forward itself (one key: O is its V row).
 * 2. The conversion from float32 (attn_kv_append_scaled): every code's value back to
 *    itself, the midpoints between neighbours (ties to the even code), a float32 ulp on
 *    either side of them, subnormals, random bit patterns; saturation (beyond the largest,
 *    +-inf) and NaN, against a nearest-value search over the codes written here; scales
 *    per tensor and per head: fp8(fl32(x / scale)).
 * 3. The forward over fp8 K and V (fused and reference, 1 and 2 threads) against the tests'
 *    float64 oracle over the dequantized cache, at the contract's float32 tolerance:
 *    prefill, GQA causal, decoding on the split path, kv_len (unread rows NaN), mask and
 *    bias, window + ALiBi + softcap, LSE and weights, per-head scales; decoding (1 to 16
 *    rows a block) with no scales, per-tensor and per-head ones, which the kernel's
 *    decoding step takes where it reads fp8. The same check must fail against the
 *    oracle of the UNquantized values and on a cache with one code changed (the
 *    tolerance sees both). A paged cache (shuffled pages) gives the
 *    contiguous cache's output bit for bit; varlen gives attn_forward's per sequence;
 *    attn_weights_grid over fp8 K is the dequantized K's grid; attn_cascade_forward over
 *    fp8 parts is attention over their concatenated keys.
 * 4. Misuse refused with nothing written: bad scales (0, -0, negative, NaN, inf), a scale
 *    with a non-fp8 cache, a scale of the wrong shape or dtype, fp8 q or o, k and v of
 *    different dtypes, the backward.
 * 5. The error table of docs/CONTRACT.md: one call's error against the float64 answer on
 *    the TRUE float32 values, for caches of float32, bfloat16, float16, q8_0, fp8_e4m3,
 *    fp8_e5m2, q4_0 and u4 (printed, and each checked against a loose ceiling).
 * 6. q4_0 (llama.cpp's block_q4_0): blocks written by hand read back bit for bit (the
 *    conversion and the forward) and quantized again to the same bytes; known inputs
 *    (ties up, the clip at 15, the first max's sign, all zeros, the float16 scale); a
 *    bound on random rows; attn_kv_append's bytes are attn_quantize_q4_0's; NaN, inf and
 *    too large refused with nothing written; bad layouts and dtypes; then section 3's
 *    forward cases over a q4_0 cache.
 * Run once per kernel by scripts/check.sh (ATTN_ISA).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "core/half.h"
#include "kernels/kernels.h"
#include "oracle.h"
#include "pages.h"

/* Debian's aarch64 gcc 12 stops with an internal compiler error (vect_transform_reduction)
 * vectorizing several of this file's count loops (as in test_q8_0.c); a test of values,
 * so the file is compiled without the vectorizer there (and with it everywhere else). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__aarch64__)
#pragma GCC optimize("no-tree-vectorize")
#endif

/* ---- the formats, written here from their definitions ------------------------------ */

typedef struct fmt {
    attn_dtype dt;
    const char *name;
    int ebits, mbits, bias;
    double max;          /* largest finite */
    uint8_t max_code;    /* its positive code */
    uint8_t nan_code;    /* the NaN the conversion writes (sign added) */
} fmt;

static const fmt E4M3 = {ATTN_FP8_E4M3, "fp8_e4m3", 4, 3, 7, 448.0, 0x7E, 0x7F};
static const fmt E5M2 = {ATTN_FP8_E5M2, "fp8_e5m2", 5, 2, 15, 57344.0, 0x7B, 0x7E};
/* q4_0 in the forward cases (section 3): blocks, no scales, its own conversions */
static const fmt Q4 = {ATTN_Q4_0, "q4_0", 0, 0, 0, 0.0, 0, 0};

/* the bytes of a row of D elements */
static int64_t rowb(const fmt *f, int64_t D) { return f->dt == ATTN_Q4_0 ? D / 32 * 18 : D; }

/* the value of code x: (-1)^s 2^(e - bias) (1 + m / 2^mbits), subnormal at e = 0;
 * e4m3 has only NaN at S.1111.111, e5m2 has inf (m = 0) and NaN at e = 31 */
static double dec(const fmt *f, uint8_t x) {
    const int s = x >> 7, e = (x >> f->mbits) & ((1 << f->ebits) - 1), m = x & ((1 << f->mbits) - 1);
    const int emax = (1 << f->ebits) - 1;
    double v;
    if (f->dt == ATTN_FP8_E4M3 && e == emax && m == (1 << f->mbits) - 1) return NAN;
    if (f->dt == ATTN_FP8_E5M2 && e == emax) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp((double)m, 1 - f->bias - f->mbits);
    else v = ldexp((double)((1 << f->mbits) + m), e - f->bias - f->mbits);
    return s ? -v : v;
}

/* the code of x: NaN -> the format's NaN; |x| >= max (inf too) -> +-max; else the
 * nearest finite code by search, a tie to the even code (the even last bit) */
static uint8_t enc(const fmt *f, double x) {
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    if (isnan(x)) return (uint8_t)(sign | f->nan_code);
    const double a = fabs(x);
    if (a >= f->max) return (uint8_t)(sign | f->max_code);
    int best = 0;
    double bd = INFINITY;
    for (int c = 0; c <= f->max_code; c++) {
        const double d = fabs(a - dec(f, (uint8_t)c));
        if (d < bd || (d == bd && c % 2 == 0)) bd = d, best = c;
    }
    return (uint8_t)(sign | best);
}

static int same_float(double a, double b) { return (isnan(a) && isnan(b)) || a == b; }

/* one row of n float32 appended into an fp8 cache row [1, 1, 1, n] with a per-tensor
 * scale (NULL = 1): the bytes written */
static attn_status append_row(const fmt *f, const float *x, int64_t n, const float *scale, uint8_t *out) {
    int32_t zero = 0;
    attn_tensor tx = attn_tensor_4d((void *)x, ATTN_F32, 1, 1, 1, n);
    attn_tensor tc = attn_tensor_4d(out, f->dt, 1, 1, 1, n);
    attn_tensor tl = attn_tensor_4d(&zero, ATTN_I32, 1, 1, 1, 1);
    attn_tensor ts = attn_tensor_4d((void *)scale, ATTN_F32, 1, 1, 1, 1);
    /* the same row as K and as V: a 1-wide V of element 0 */
    attn_tensor vx = attn_tensor_4d((void *)x, ATTN_F32, 1, 1, 1, 1);
    uint8_t vout;
    attn_tensor vc = attn_tensor_4d(&vout, f->dt, 1, 1, 1, 1);
    return attn_kv_append_scaled(&tx, &vx, &tc, &vc, NULL, NULL, &tl, scale ? &ts : NULL,
                                 scale ? &ts : NULL);
}

/* ---- 1. the 256 codes ------------------------------------------------------------------ */

static void test_codes(const fmt *f) {
    int bad = 0;
    for (int c = 0; c < 256; c++) {
        const float got = attn_fp8_to_f32(f->dt, (uint8_t)c);
        const double want = dec(f, (uint8_t)c);
        const int wrong = !same_float(got, want) || (got == 0 && !signbit(got) != !signbit(want));
        if (wrong && bad < 4) fprintf(stderr, "     %s: code 0x%02x reads %.9g, expected %.9g\n", f->name, c, (double)got, want);
        bad += wrong;
    }
    CHECK(bad == 0, "%s: %d of 256 codes decode to another value than the definition's", f->name, bad);
    CHECK(dec(f, f->max_code) == f->max && dec(f, 1) == ldexp(1.0, 1 - f->bias - f->mbits),
          "%s: the hand decoder's largest or smallest value is wrong", f->name);

    /* through the forward: one key, so O is V's row, bit for bit; V = the 256 codes */
    uint8_t k[32] = {0}, v[256];
    for (int c = 0; c < 256; c++) v[c] = (uint8_t)c;
    float q[32] = {0}, o[256];
    /* with the extremes of a step that folds e4m3's 2^8 into the scale: 2^99 (the step
     * takes it), 2^110 and above (the tile path: 2^8 times it could overflow), 2^-140
     * (products below float32's normal range, rounded once) */
    enum { NS = 7 };
    const float scales[NS] = {1.0f, 0.5f, 3.0f, 0x1p99f, 0x1p110f, 0x1.3p120f, 0x1p-140f};
    attn_tensor tq = attn_tensor_4d(q, ATTN_F32, 1, 1, 1, 32), to = attn_tensor_4d(o, ATTN_F32, 1, 1, 1, 256);
    attn_tensor tk = attn_tensor_4d(k, f->dt, 1, 1, 1, 32), tv = attn_tensor_4d(v, f->dt, 1, 1, 1, 256);
    for (int si = 0; si <= NS; si++) {  // si NS: no scale given (1), the decoding step's case
        attn_tensor ts = attn_tensor_4d((void *)&scales[si % NS], ATTN_F32, 1, 1, 1, 1);
        for (int path = 0; path < 2; path++) {
            attn_options opt = {.path = path ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED, .v_scale = si < NS ? &ts : NULL};
            fill_sentinel(o, 256);
            attn_status st = attn_forward(&tq, &tk, &tv, &to, &opt);
            CHECK(st == ATTN_OK, "%s: forward over the 256 codes: %s", f->name, attn_last_error());
            bad = 0;
            for (int c = 0; c < 256; c++)  // fl32(value * scale): one rounding
                bad += !same_float(o[c], (double)(float)(dec(f, (uint8_t)c) * (double)scales[si % NS]));
            CHECK(bad == 0, "%s, v_scale %g%s, %s path: %d of 256 codes read as another value", f->name,
                  (double)scales[si % NS], si < NS ? "" : " (none given)", path ? "reference" : "fused", bad);
        }
    }

    /* as K: head h (256 of them, one query row each) has two keys, a zero row and a row
     * whose first element is code h, under q = e_0 and V = (0, 1): o = the weight of the
     * second key, sigmoid(value / 4) (Dk 16), NaN for a NaN code and for +inf, 0 for
     * -inf. The decoding step reads K codes as V codes, NaN step included. */
    enum { DK = 16 };
    uint8_t *kk = calloc(256 * 2 * DK, 1), *vv = malloc(256 * 2);
    float *qq = calloc(256 * DK, sizeof(float)), oo[256];
    for (int h = 0; h < 256; h++) {
        kk[(2 * h + 1) * DK] = (uint8_t)h;
        vv[2 * h] = 0, vv[2 * h + 1] = f->max_code;  // 0 and the largest: o times it, exact
        qq[h * DK] = 1.0f;
    }
    attn_tensor kq = attn_tensor_4d(qq, ATTN_F32, 1, 256, 1, DK), ko = attn_tensor_4d(oo, ATTN_F32, 1, 256, 1, 1);
    attn_tensor kt = attn_tensor_4d(kk, f->dt, 1, 256, 2, DK), kv = attn_tensor_4d(vv, f->dt, 1, 256, 2, 1);
    for (int path = 0; path < 2; path++) {
        attn_options opt = {.path = path ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED};
        fill_sentinel(oo, 256);
        attn_status st = attn_forward(&kq, &kt, &kv, &ko, &opt);
        CHECK(st == ATTN_OK, "%s: forward over the 256 codes as K: %s", f->name, attn_last_error());
        bad = 0;
        for (int c = 0; c < 256; c++) {
            const double s = dec(f, (uint8_t)c) / 4.0;
            const double want = isnan(s) || s == INFINITY ? NAN : f->max / (1.0 + exp(-s));
            const int wrong = isnan(want) ? !isnan(oo[c]) : !(fabs(oo[c] - want) <= 1e-6 * f->max);
            if (wrong && bad < 4) fprintf(stderr, "     %s: K code 0x%02x gives %.9g, expected %.9g\n", f->name, c, (double)oo[c], want);
            bad += wrong;
        }
        CHECK(bad == 0, "%s, %s path: %d of 256 codes as K give another weight than their value's", f->name,
              path ? "reference" : "fused", bad);
    }
    free(kk), free(vv), free(qq);
}

/* ---- 2. the conversion from float32 ---------------------------------------------------- */

static void test_encode(const fmt *f) {
    enum { N = 4096 };
    float *x = malloc(sizeof(float) * N);
    uint8_t *got = malloc(N);
    int64_t n = 0;
    /* every finite code's value, and the midpoints between neighbours (exact in float32:
     * two more bits than the format), each with a float32 ulp either side */
    for (int c = 0; c <= f->max_code; c++)
        for (int sgn = 0; sgn < 2; sgn++) {
            const double a = dec(f, (uint8_t)c), s = sgn ? -1.0 : 1.0;
            x[n++] = (float)(s * a);
            if (c < f->max_code) {
                const float mid = (float)(s * (a + dec(f, (uint8_t)(c + 1))) / 2);
                x[n++] = mid;
                x[n++] = nextafterf(mid, INFINITY);
                x[n++] = nextafterf(mid, -INFINITY);
            }
        }
    /* beyond the largest: the rounding boundary (max + half a step), far, inf; NaN */
    const double step = f->max - dec(f, (uint8_t)(f->max_code - 1));
    const float edge[] = {(float)(f->max + step / 2), (float)(f->max + step / 4), (float)(f->max * 2),
                          1e30f, INFINITY, 3.4e38f, NAN, 0x1p-30f, 0x1p-149f, 0.0f};
    for (size_t e = 0; e < sizeof edge / sizeof edge[0]; e++) x[n++] = edge[e], x[n++] = -edge[e];
    /* random bit patterns over the format's range and below it */
    rng_t r = {99};
    while (n < N) {
        const double mag = ldexp(1.0, (int)rng_int(&r, 2 * f->bias + 8) - f->bias - f->mbits - 3);
        x[n++] = (float)(rng_range(&r, -2.0, 2.0) * mag);
    }
    CHECK(append_row(f, x, N, NULL, got) == ATTN_OK, "%s: append: %s", f->name, attn_last_error());
    int bad = 0;
    for (int64_t i = 0; i < N; i++)
        if (got[i] != enc(f, x[i])) {
            if (bad++ < 5)
                fprintf(stderr, "     %s: %.9g -> 0x%02x, expected 0x%02x\n", f->name, (double)x[i],
                        got[i], enc(f, x[i]));
        }
    CHECK(bad == 0, "%s: %d of %d float32 values converted to another code than the nearest "
          "(ties even, saturating)", f->name, bad, N);

    /* the rules spelled out */
    const float rules[] = {INFINITY, -INFINITY, NAN, -NAN, 1e9f, -1e9f};
    uint8_t rb[6];
    CHECK(append_row(f, rules, 6, NULL, rb) == ATTN_OK, "%s: append rules: %s", f->name, attn_last_error());
    CHECK(rb[0] == f->max_code && rb[1] == (0x80 | f->max_code), "%s: +-inf became 0x%02x 0x%02x, "
          "expected +-largest", f->name, rb[0], rb[1]);
    CHECK(isnan(dec(f, rb[2])) && isnan(dec(f, rb[3])) && (rb[3] & 0x80), "%s: NaN did not stay NaN "
          "(0x%02x 0x%02x)", f->name, rb[2], rb[3]);
    CHECK(rb[4] == f->max_code && rb[5] == (0x80 | f->max_code), "%s: 1e9 did not saturate", f->name);

    /* a scale: fp8(fl32(x / scale)) */
    const float sc = 0.37f;
    CHECK(append_row(f, x, N, &sc, got) == ATTN_OK, "%s: append scaled: %s", f->name, attn_last_error());
    bad = 0;
    for (int64_t i = 0; i < N; i++) bad += got[i] != enc(f, x[i] / sc);
    CHECK(bad == 0, "%s: scale 0.37: %d of %d codes are not fp8(fl32(x / scale))", f->name, bad, N);
    free(x), free(got);
}

/* ---- 3. the forward over an fp8 cache -------------------------------------------------- */

typedef struct fp8case {
    fcase c;
    int per_head;      /* scales {Hkv, 1, 1, 1}; 0: one per tensor; -1: none given (1: the
                          kernels' decoding step reads the bytes, where it can) */
    const char *what;
} fp8case;

typedef struct fp8cache {
    uint8_t *kb, *vb;            /* [B, Hkv, Lk, D] dense (q4_0: rows of D / 32 blocks) */
    bool scaled;                 /* fp8: the scales below given to every call */
    attn_tensor k, v;
    float *ks, *vs;              /* the scales */
    attn_tensor tks, tvs;
} fp8cache;

/* the case's float K and V appended into a dense fp8 cache with scales amax / max (vLLM's
 * calibration, per tensor or per head), then the float views overwritten with the values
 * the cache stands for (the oracle's input) */
static void fp8_build(fp8cache *fc, tcall *t, const fmt *f, int per_head) {
    const fcase *c = &t->c;
    const int64_t nh = per_head > 0 ? c->Hkv : 1;
    fc->kb = malloc((size_t)(c->B * c->Hkv * c->Lk * rowb(f, c->Dk)) + 1);
    fc->vb = malloc((size_t)(c->B * c->Hkv * c->Lk * rowb(f, c->Dv)) + 1);
    fc->scaled = f->dt != ATTN_Q4_0 && per_head >= 0;
    fc->ks = malloc(sizeof(float) * (size_t)nh);
    fc->vs = malloc(sizeof(float) * (size_t)nh);
    fc->k = attn_tensor_4d(fc->kb, f->dt, c->B, c->Hkv, c->Lk, c->Dk);
    fc->v = attn_tensor_4d(fc->vb, f->dt, c->B, c->Hkv, c->Lk, c->Dv);
    if (f->dt == ATTN_Q4_0) {
        fc->ks[0] = fc->vs[0] = 1.0f;
        fc->tks = attn_tensor_4d(fc->ks, ATTN_F32, 1, 1, 1, 1);
        fc->tvs = attn_tensor_4d(fc->vs, ATTN_F32, 1, 1, 1, 1);
        CHECK(attn_quantize_q4_0(&t->k, &fc->k) == ATTN_OK && attn_quantize_q4_0(&t->v, &fc->v) == ATTN_OK,
              "q4_0: quantize the case's cache: %s", attn_last_error());
        return;
    }
    for (int x = 0; x < 2; x++) {
        const attn_tensor *src = x ? &t->v : &t->k;
        float *s = x ? fc->vs : fc->ks;
        for (int64_t g = 0; g < nh; g++) {
            double amax = 0;
            for (int64_t b = 0; b < c->B; b++)
                for (int64_t gg = per_head ? g : 0; gg < (per_head ? g + 1 : c->Hkv); gg++)
                    for (int64_t j = 0; j < c->Lk; j++)
                        for (int64_t d = 0; d < src->shape[3]; d++)
                            amax = fmax(amax, fabs(*view_ptr(src, b, gg, j, d)));
            /* V's scale 3 times its calibration (the values still fit, in a third of the
             * range): K's and V's scales differ even where K and V have one range, so
             * that a kernel applying one in place of the other is seen */
            s[g] = amax > 0 ? (float)(amax / f->max) * (per_head ? (float)(1 + g) : 1.0f) * (x ? 3.0f : 1.0f)
                            : 1.0f;
            if (per_head < 0) s[g] = 1.0f;  // none given: the values must fit (U(-1, 1) do)
        }
    }
    fc->tks = attn_tensor_4d(fc->ks, ATTN_F32, nh, 1, 1, 1);
    fc->tvs = attn_tensor_4d(fc->vs, ATTN_F32, nh, 1, 1, 1);
    int64_t *zero = calloc((size_t)c->B, sizeof(int64_t));
    attn_tensor tl = attn_tensor_4d(zero, ATTN_I64, c->B, 1, 1, 1);
    CHECK(attn_kv_append_scaled(&t->k, &t->v, &fc->k, &fc->v, NULL, NULL, &tl, fc->scaled ? &fc->tks : NULL,
                                fc->scaled ? &fc->tvs : NULL) == ATTN_OK,
          "%s: append the case's cache: %s", f->name, attn_last_error());
    free(zero);
}

/* the float views := the values the fp8 cache stands for */
static void fp8_dequant_into(const fp8cache *fc, tcall *t, const fmt *f) {
    const fcase *c = &t->c;
    if (f->dt == ATTN_Q4_0) {
        CHECK(attn_dequantize_q4_0(&fc->k, &t->k) == ATTN_OK && attn_dequantize_q4_0(&fc->v, &t->v) == ATTN_OK,
              "q4_0: dequantize: %s", attn_last_error());
        return;
    }
    for (int x = 0; x < 2; x++) {
        const attn_tensor *dst = x ? &t->v : &t->k;
        const uint8_t *bytes = x ? fc->vb : fc->kb;
        const float *s = x ? fc->vs : fc->ks;
        const int64_t D = dst->shape[3], nh = fc->tks.shape[0];
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t g = 0; g < c->Hkv; g++)
                for (int64_t j = 0; j < c->Lk; j++)
                    for (int64_t d = 0; d < D; d++)
                        *view_ptr(dst, b, g, j, d) =
                            (float)dec(f, bytes[((b * c->Hkv + g) * c->Lk + j) * D + d]) * s[nh == 1 ? 0 : g];
    }
}

static void fp8_free(fp8cache *fc) { free(fc->kb), free(fc->vb), free(fc->ks), free(fc->vs); }

/* the fused output of the fp8 cache, gathered; 1 when within the tolerance of o_ref */
static int fp8_within(tcall *t, const fp8cache *fc) {
    const attn_tensor kf = t->k, vf = t->v;
    t->k = fc->k, t->v = fc->v;
    if (fc->scaled) t->opt.k_scale = &fc->tks, t->opt.v_scale = &fc->tvs;
    const attn_status st = tcall_run(t, ATTN_PATH_FUSED, 0);
    t->k = kf, t->v = vf;
    t->opt.k_scale = t->opt.v_scale = NULL;
    if (st != ATTN_OK) return -1;
    tcall_gather(t);
    return within_f32_tol(t->o_got, t->o_ref, t->no, NULL);
}

static uint64_t g_u = 0x9e3779b97f4a7c15ull;
static double u(void) {  // [0, 1), the page shuffle's draws
    g_u ^= g_u << 13, g_u ^= g_u >> 7, g_u ^= g_u << 17;
    return (double)(g_u >> 11) / 9007199254740992.0;
}

/* the same call over a paged copy of the cache (pages of 16, shuffled): o bit for bit */
static void paged_same(tcall *t, const fp8cache *fc, const fmt *f, const char *what) {
    const fcase *c = &t->c;
    enum { PS = 16 };
    const int64_t mp = (c->Lk + PS - 1) / PS, np = c->B * mp + 3;
    int32_t *perm = shuffled_pages(np, u), *bt = malloc(sizeof(int32_t) * (size_t)(c->B * mp));
    const int64_t rk = rowb(f, c->Dk), rv = rowb(f, c->Dv);
    uint8_t *pk = malloc((size_t)(np * c->Hkv * PS * rk)), *pv = malloc((size_t)(np * c->Hkv * PS * rv));
    memset(pk, 0x7F, (size_t)(np * c->Hkv * PS * rk));  // NaN in every format (q4_0: its scales)
    memset(pv, 0x7F, (size_t)(np * c->Hkv * PS * rv));
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t pg = 0; pg < mp; pg++) bt[b * mp + pg] = perm[b * mp + pg];
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t g = 0; g < c->Hkv; g++)
            for (int64_t j = 0; j < c->Lk; j++) {
                const int64_t page = bt[b * mp + j / PS];
                memcpy(pk + ((page * c->Hkv + g) * PS + j % PS) * rk, fc->kb + ((b * c->Hkv + g) * c->Lk + j) * rk, (size_t)rk);
                memcpy(pv + ((page * c->Hkv + g) * PS + j % PS) * rv, fc->vb + ((b * c->Hkv + g) * c->Lk + j) * rv, (size_t)rv);
            }
    float *o1 = malloc(sizeof(float) * (size_t)t->no), *o2 = malloc(sizeof(float) * (size_t)t->no);
    const attn_tensor kf = t->k, vf = t->v;
    attn_tensor tbt = attn_tensor_4d(bt, ATTN_I32, c->B, mp, 1, 1);
    if (fc->scaled) t->opt.k_scale = &fc->tks, t->opt.v_scale = &fc->tvs;
    for (int path = 0; path < 2; path++) {
        const attn_path ap = path ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED;
        t->k = fc->k, t->v = fc->v;
        attn_status st = tcall_run(t, ap, 2);
        tcall_gather(t);
        memcpy(o1, t->o_got, sizeof(float) * (size_t)t->no);
        /* the paged call reads Lk = mp * PS keys: kv_len (the case's, or Lk) bounds them */
        t->k = attn_tensor_4d(pk, f->dt, np, c->Hkv, PS, c->Dk);
        t->v = attn_tensor_4d(pv, f->dt, np, c->Hkv, PS, c->Dv);
        int64_t *lens = malloc(sizeof(int64_t) * (size_t)c->B);
        for (int64_t b = 0; b < c->B; b++) lens[b] = oracle_lkb(&t->opt, b, c->Lk);
        attn_tensor tl = attn_tensor_4d(lens, ATTN_I64, c->B, 1, 1, 1);
        const attn_tensor *kvl = t->opt.kv_len;
        t->opt.kv_len = &tl;
        t->opt.block_table = &tbt;
        attn_status st2 = ATTN_OK;
        if (mp * PS == c->Lk || (!c->mask && !c->weights)) {  // their shapes name Lk
            st2 = tcall_run(t, ap, 2);
            tcall_gather(t);
            memcpy(o2, t->o_got, sizeof(float) * (size_t)t->no);
            CHECK(st == ATTN_OK && st2 == ATTN_OK && memcmp(o1, o2, sizeof(float) * (size_t)t->no) == 0,
                  "%s %s (%s): the paged cache's output is not the contiguous one's bit for bit (%s)",
                  f->name, what, path ? "reference" : "fused", attn_last_error());
        }
        t->opt.block_table = NULL;
        t->opt.kv_len = kvl;
        free(lens);
    }
    t->k = kf, t->v = vf;
    t->opt.k_scale = t->opt.v_scale = NULL;
    free(perm), free(bt), free(pk), free(pv), free(o1), free(o2);
}

static void run_case(const fp8case *fc_, const fmt *f) {
    tcall t;
    tcall_build(&t, &fc_->c);
    const fcase *c = &fc_->c;
    fp8cache fc;
    fp8_build(&fc, &t, f, fc_->per_head);

    /* the oracle of the unquantized values must fail: the tolerance sees fp8 */
    tcall_oracle(&t);
    CHECK(fp8_within(&t, &fc) == 0, "%s %s: within the float32 tolerance of the UNquantized "
          "answer: the check cannot see the format", f->name, fc_->what);

    fp8_dequant_into(&fc, &t, f);
    tcall_oracle(&t);
    /* unread rows (past each batch's kv_len) NaN in the cache: never read */
    if (c->kvlen) {
        const int64_t rk = rowb(f, c->Dk), rv = rowb(f, c->Dv);
        for (int64_t b = 0; b < c->B; b++)  // 0x7F: NaN in every format (q4_0: the scales)
            for (int64_t j = oracle_lkb(&t.opt, b, c->Lk); j < c->Lk; j++)
                for (int64_t g = 0; g < c->Hkv; g++) {
                    memset(fc.kb + ((b * c->Hkv + g) * c->Lk + j) * rk, 0x7F, (size_t)rk);
                    memset(fc.vb + ((b * c->Hkv + g) * c->Lk + j) * rv, 0x7F, (size_t)rv);
                }
    }
    const attn_tensor kf = t.k, vf = t.v;
    char what[200];
    for (int path = 0; path < 2; path++)
        for (int threads = 1; threads <= 2; threads++) {
            snprintf(what, sizeof what, "%s %s (%s, %s, %d threads)", f->name, fc_->what,
                     attn_kernel_name(), path ? "reference" : "fused", threads);
            t.k = fc.k, t.v = fc.v;
            if (fc.scaled) t.opt.k_scale = &fc.tks, t.opt.v_scale = &fc.tvs;
            attn_status st = tcall_run(&t, path ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED, threads);
            /* the check's LSE bound reads K as floats: the dequantized views */
            t.k = kf, t.v = vf;
            t.opt.k_scale = t.opt.v_scale = NULL;
            CHECK(st == ATTN_OK, "%s: %s", what, attn_last_error());
            if (st == ATTN_OK) tcall_check(&t, what);
        }

    /* a planted error: one code of V (a read row, near the largest magnitude) changed by
     * a few steps; the check must see it */
    {
        int64_t at = 2;  // q4_0: the first byte of nibbles of row 0, its top nibble's high bit
        uint8_t best = 0;
        const int64_t lk0 = c->kvlen ? oracle_lkb(&t.opt, 0, c->Lk) : c->Lk;
        for (int64_t j = 0; f->dt != ATTN_Q4_0 && j < (lk0 < 32 ? lk0 : 32) * c->Dv; j++)  // keys every case reads
            if ((fc.vb[j] & 0x7F) > best && (fc.vb[j] & 0x7F) < f->max_code) best = fc.vb[j] & 0x7F, at = j;
        const uint8_t keep = fc.vb[at];
        fc.vb[at] = (uint8_t)(keep ^ 0x80);  // the sign flipped (q4_0: 8 steps of d)
        CHECK(fp8_within(&t, &fc) == 0, "%s %s: one V code's sign flipped and the output still "
              "within the tolerance", f->name, fc_->what);
        fc.vb[at] = keep;
    }
    paged_same(&t, &fc, f, fc_->what);
    fp8_free(&fc);
    tcall_free(&t);
}

static void test_forward(const fmt *f) {
    fp8case cases[16];
    int n = 0;
    fcase c;
    c = fcase_new(1, 1, 2, 2, 37, 200, 64, 64);
    cases[n++] = (fp8case){c, 0, "prefill"};
    c = fcase_new(2, 2, 8, 2, 5, 150, 64, 32);
    c.causal = 1, c.align = 1;
    cases[n++] = (fp8case){c, 1, "GQA causal, per-head scales"};
    c = fcase_new(3, 1, 4, 1, 1, 4133, 64, 64);
    cases[n++] = (fp8case){c, 1, "decode split"};
    c = fcase_new(4, 3, 4, 2, 1, 300, 64, 64);
    c.kvlen = 1;
    cases[n++] = (fp8case){c, 1, "decode kv_len"};
    c = fcase_new(5, 2, 4, 2, 17, 70, 32, 32);
    c.mask = 3, c.mshape = 7, c.bias_ninf = 0.1;
    cases[n++] = (fp8case){c, 0, "mask+bias"};
    c = fcase_new(6, 1, 4, 2, 40, 120, 32, 48);
    c.window = 1, c.wl = 30, c.wr = 5, c.alibi = 1, c.softcap = 5.0f, c.dist = 1;
    cases[n++] = (fp8case){c, 1, "window+alibi+softcap"};
    c = fcase_new(7, 2, 6, 3, 3, 90, 64, 32);
    c.lse = 1, c.weights = 1, c.causal = 1, c.align = 1, c.layout = 1;
    cases[n++] = (fp8case){c, 0, "lse+weights, [B, L, H, D]"};
    /* no scales: where the kernel's decoding step reads fp8, it runs these (and their
     * paged copies through decode_rows) */
    c = fcase_new(8, 1, 4, 2, 1, 4133, 64, 64);
    cases[n++] = (fp8case){c, -1, "decode split, no scales"};
    c = fcase_new(9, 3, 4, 2, 2, 300, 64, 64);
    c.kvlen = 1, c.lse = 1, c.weights = 1;
    cases[n++] = (fp8case){c, -1, "decode kv_len+lse+weights, no scales"};
    c = fcase_new(10, 2, 4, 4, 3, 161, 40, 24);
    c.causal = 1, c.align = 1;
    cases[n++] = (fp8case){c, -1, "decode causal, D 40/24 (tails), no scales"};
    /* scales per tensor and per head on the decoding step (the step multiplies each fp8
     * value by its head's scale as it reads it), 1 to 16 rows a block: GQA groups, several
     * query rows, the weights' sweep (decode_qk), tails; and their paged copies
     * (decode_rows) */
    c = fcase_new(11, 2, 8, 2, 1, 300, 64, 64);
    cases[n++] = (fp8case){c, 0, "decode GQA 4, per-tensor scales"};
    c = fcase_new(12, 2, 8, 2, 4, 208, 64, 64);  // batch 1 all 208 keys: clean tiles
    c.causal = 1, c.align = 1, c.kvlen = 1;
    cases[n++] = (fp8case){c, 1, "decode 16 rows (GQA 4 x Lq 4) causal kv_len, per-head scales"};
    c = fcase_new(13, 2, 3, 3, 16, 160, 40, 24);
    c.lse = 1, c.weights = 1;
    cases[n++] = (fp8case){c, 1, "decode Lq 16, D 40/24 (tails), lse+weights, per-head scales"};
    c = fcase_new(14, 1, 6, 2, 3, 4133, 128, 128);
    cases[n++] = (fp8case){c, 0, "decode split, Lq 3 GQA 3, D 128, per-tensor scales"};
    for (int i = 0; i < n; i++) {
        if (test_case_skipped()) continue;  // ATTN_TEST_EVERY (the emulated run)
        if (f->dt == ATTN_Q4_0 && cases[i].c.Dv % 32) cases[i].c.Dv = 64;  // whole blocks
        if (f->dt == ATTN_Q4_0 && cases[i].c.Dk % 32) cases[i].c.Dk = 64;
        run_case(&cases[i], f);
    }
}

/* varlen: each sequence's rows, bit for bit attn_forward on them alone */
static void test_varlen(const fmt *f) {
    enum { H = 2, D = 32, TQ = 7, TK = 50 };
    const int32_t cq[3] = {0, 3, 7}, ck[3] = {0, 20, 50};
    float q[H * TQ * D], o[H * TQ * D], o1[H * 4 * D], kf[H * TK * D];
    uint8_t k8[H * TK * D], v8[H * TK * D];
    rng_t r = {3};
    for (int i = 0; i < H * TQ * D; i++) q[i] = (float)rng_range(&r, -1, 1);
    for (int i = 0; i < H * TK * D; i++) kf[i] = (float)rng_range(&r, -2, 2);
    for (int i = 0; i < H * TK * D; i++) k8[i] = attn_f32_to_e4m3(kf[i]), v8[i] = (uint8_t)(k8[(i * 7) % (H * TK * D)]);
    if (f->dt == ATTN_FP8_E5M2)
        for (int i = 0; i < H * TK * D; i++) k8[i] = attn_f32_to_e5m2(kf[i]), v8[i] = attn_f32_to_e5m2(-kf[i] / 2);
    const float sc[H] = {0.5f, 1.25f};
    attn_tensor ts = attn_tensor_4d((void *)sc, ATTN_F32, H, 1, 1, 1);
    attn_tensor tq = attn_tensor_4d(q, ATTN_F32, 1, H, TQ, D), to = attn_tensor_4d(o, ATTN_F32, 1, H, TQ, D);
    attn_tensor tk = attn_tensor_4d(k8, f->dt, 1, H, TK, D), tv = attn_tensor_4d(v8, f->dt, 1, H, TK, D);
    attn_tensor tcq = attn_tensor_4d((void *)cq, ATTN_I32, 3, 1, 1, 1), tck = attn_tensor_4d((void *)ck, ATTN_I32, 3, 1, 1, 1);
    attn_options opt = {.causal = true, .align = ATTN_ALIGN_BOTTOM_RIGHT, .k_scale = &ts, .v_scale = &ts};
    CHECK(attn_varlen_forward(&tq, &tk, &tv, &to, &tcq, &tck, 4, 30, &opt) == ATTN_OK, "%s varlen: %s",
          f->name, attn_last_error());
    int bad = 0;
    for (int s = 0; s < 2; s++) {
        const int64_t nq = cq[s + 1] - cq[s], nk = ck[s + 1] - ck[s];
        attn_tensor sq = {q + cq[s] * D, ATTN_F32, {1, H, nq, D}, {0, TQ * D, D, 1}};
        attn_tensor sk = {k8 + ck[s] * D, f->dt, {1, H, nk, D}, {0, TK * D, D, 1}};
        attn_tensor sv = {v8 + ck[s] * D, f->dt, {1, H, nk, D}, {0, TK * D, D, 1}};
        attn_tensor so = attn_tensor_4d(o1, ATTN_F32, 1, H, nq, D);
        CHECK(attn_forward(&sq, &sk, &sv, &so, &opt) == ATTN_OK, "%s varlen piece: %s", f->name, attn_last_error());
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < nq; i++)
                bad += memcmp(&o[(h * TQ + cq[s] + i) * D], &o1[(h * nq + i) * D], sizeof(float) * D) != 0;
    }
    CHECK(bad == 0, "%s varlen: %d rows differ from attn_forward on the sequence alone", f->name, bad);
}

/* attn_cascade_forward over an fp8 prefix and fp8 suffixes with one pair of scales (opt's,
 * for both parts): per batch, attn_forward's reference over the concatenated keys, within
 * the float32 rule */
static void test_cascade(const fmt *f) {
    enum { B = 2, H = 2, LQ = 3, P = 40, S = 9, D = 32 };
    float q[B * H * LQ * D], o[B * H * LQ * D], o1[H * LQ * D];
    uint8_t kp[H * P * D], vp[H * P * D], ks[B * H * S * D], vs[B * H * S * D], kc[H * (P + S) * D], vc[H * (P + S) * D];
    rng_t r = {41};
    for (int i = 0; i < B * H * LQ * D; i++) q[i] = (float)rng_range(&r, -1, 1);
    uint8_t *all[4] = {kp, vp, ks, vs};
    const int sizes[4] = {H * P * D, H * P * D, B * H * S * D, B * H * S * D};
    for (int a = 0; a < 4; a++)
        for (int i = 0; i < sizes[a]; i++) all[a][i] = (uint8_t)rng_int(&r, 256) & 0xBF;  // |x| < 2
    const float sk[H] = {0.5f, 2.0f}, sv[H] = {1.5f, 0.25f};
    attn_tensor tsk = attn_tensor_4d((void *)sk, ATTN_F32, H, 1, 1, 1), tsv = attn_tensor_4d((void *)sv, ATTN_F32, H, 1, 1, 1);
    attn_tensor tkp = attn_tensor_4d(kp, f->dt, 1, H, P, D), tvp = attn_tensor_4d(vp, f->dt, 1, H, P, D);
    attn_tensor tks = attn_tensor_4d(ks, f->dt, B, H, S, D), tvs = attn_tensor_4d(vs, f->dt, B, H, S, D);
    attn_cascade_kv pre = {&tkp, &tvp, NULL, NULL}, suf = {&tks, &tvs, NULL, NULL};
    attn_tensor tq = attn_tensor_4d(q, ATTN_F32, B, H, LQ, D), to = attn_tensor_4d(o, ATTN_F32, B, H, LQ, D);
    attn_options opt = {.causal = true, .align = ATTN_ALIGN_BOTTOM_RIGHT, .k_scale = &tsk, .v_scale = &tsv};
    attn_status st = attn_cascade_forward(&tq, &pre, &suf, &to, &opt);
    CHECK(st == ATTN_OK, "%s cascade: %s", f->name, attn_last_error());
    int bad = 0;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t g = 0; g < H; g++) {
            memcpy(kc + g * (P + S) * D, kp + g * P * D, P * D), memcpy(vc + g * (P + S) * D, vp + g * P * D, P * D);
            memcpy(kc + (g * (P + S) + P) * D, ks + (b * H + g) * S * D, S * D);
            memcpy(vc + (g * (P + S) + P) * D, vs + (b * H + g) * S * D, S * D);
        }
        attn_tensor bq = attn_tensor_4d(q + b * H * LQ * D, ATTN_F32, 1, H, LQ, D), bo = attn_tensor_4d(o1, ATTN_F32, 1, H, LQ, D);
        attn_tensor bk = attn_tensor_4d(kc, f->dt, 1, H, P + S, D), bv = attn_tensor_4d(vc, f->dt, 1, H, P + S, D);
        attn_options ro = opt;
        ro.path = ATTN_PATH_REFERENCE;
        CHECK(attn_forward(&bq, &bk, &bv, &bo, &ro) == ATTN_OK, "%s cascade reference: %s", f->name, attn_last_error());
        double ref[H * LQ * D];
        for (int i = 0; i < H * LQ * D; i++) ref[i] = o1[i];
        bad += !within_f32_tol(o + b * H * LQ * D, ref, H * LQ * D, NULL);
    }
    CHECK(st == ATTN_OK && bad == 0, "%s cascade: %d batches off the concatenated keys' answer", f->name, bad);
}

/* options.key_scores over an fp8 cache with per-head scales: the scores over the
 * dequantized float32 cache, within the float32 rule (a paged fp8 cache the same) */
static void test_key_scores(const fmt *f) {
    enum { B = 2, H = 4, HKV = 2, LQ = 3, LK = 48, D = 32 };
    float q[B * H * LQ * D], o[B * H * LQ * D], kd[B * HKV * LK * D], vd[B * HKV * LK * D];
    float sc1[B * HKV * LK], sc2[B * HKV * LK];
    uint8_t k8[B * HKV * LK * D], v8[B * HKV * LK * D];
    rng_t r = {53};
    const float sk[HKV] = {0.25f, 0.75f}, sv[HKV] = {1.0f, 0.5f};
    for (int i = 0; i < B * H * LQ * D; i++) q[i] = (float)rng_range(&r, -1, 1);
    for (int i = 0; i < B * HKV * LK * D; i++) {
        const int g = i / (LK * D) % HKV;
        k8[i] = (uint8_t)rng_int(&r, 256) & 0xBF, v8[i] = (uint8_t)rng_int(&r, 256) & 0xBF;
        kd[i] = (float)dec(f, k8[i]) * sk[g], vd[i] = (float)dec(f, v8[i]) * sv[g];
    }
    attn_tensor tsk = attn_tensor_4d((void *)sk, ATTN_F32, HKV, 1, 1, 1), tsv = attn_tensor_4d((void *)sv, ATTN_F32, HKV, 1, 1, 1);
    attn_tensor tq = attn_tensor_4d(q, ATTN_F32, B, H, LQ, D), to = attn_tensor_4d(o, ATTN_F32, B, H, LQ, D);
    attn_tensor tkd = attn_tensor_4d(kd, ATTN_F32, B, HKV, LK, D), tvd = attn_tensor_4d(vd, ATTN_F32, B, HKV, LK, D);
    attn_tensor tk8 = attn_tensor_4d(k8, f->dt, B, HKV, LK, D), tv8 = attn_tensor_4d(v8, f->dt, B, HKV, LK, D);
    attn_tensor ts1 = attn_tensor_4d(sc1, ATTN_F32, B, HKV, LK, 1), ts2 = attn_tensor_4d(sc2, ATTN_F32, B, HKV, LK, 1);
    attn_options o1 = {.causal = true, .align = ATTN_ALIGN_BOTTOM_RIGHT, .key_scores = &ts1};
    attn_options o2 = o1;
    o2.key_scores = &ts2, o2.k_scale = &tsk, o2.v_scale = &tsv;
    CHECK(attn_forward(&tq, &tkd, &tvd, &to, &o1) == ATTN_OK && attn_forward(&tq, &tk8, &tv8, &to, &o2) == ATTN_OK,
          "%s key_scores: %s", f->name, attn_last_error());
    double ref[B * HKV * LK];
    for (int i = 0; i < B * HKV * LK; i++) ref[i] = sc1[i];
    tol_result tr = {0};
    CHECK(within_f32_tol(sc2, ref, B * HKV * LK, &tr), "%s key_scores: max err %.3g against the "
          "dequantized cache's", f->name, tr.max_err);
}

/* attn_weights_grid over an fp8 (or q4_0) K with per-head scales: the grid of the
 * dequantized float32 K, bit for bit on the reference path, within the float32 rule on
 * the fused one */
static void test_grid(const fmt *f) {
    enum { H = 2, LQ = 5, LK = 70, D = 64, R = 3, C = 7 };
    float q[H * LQ * D], kd[H * LK * D], o[H * LQ * D], lse[H * LQ], g1[H * R * C], g2[H * R * C];
    uint8_t k8[H * LK * D];
    double gref[H * R * C];
    rng_t r = {31};
    for (int i = 0; i < H * LQ * D; i++) q[i] = (float)rng_range(&r, -1, 1);
    for (int i = 0; i < H * LK * D; i++) kd[i] = (float)rng_range(&r, -3, 3);
    const float sc[H] = {0.75f, 0.03125f};
    attn_tensor ts = attn_tensor_4d((void *)sc, ATTN_F32, H, 1, 1, 1);
    attn_tensor tkd = attn_tensor_4d(kd, ATTN_F32, 1, H, LK, D), tk8 = attn_tensor_4d(k8, f->dt, 1, H, LK, D);
    const bool q4 = f->dt == ATTN_Q4_0;
    if (q4) {
        CHECK(attn_quantize_q4_0(&tkd, &tk8) == ATTN_OK && attn_dequantize_q4_0(&tk8, &tkd) == ATTN_OK,
              "grid q4_0: %s", attn_last_error());
    } else {
        for (int64_t g = 0; g < H; g++)
            for (int64_t e = 0; e < LK * D; e++) {
                /* codes with the exponent's top bit clear: |value| < 2, no NaN or inf */
                k8[g * LK * D + e] = (uint8_t)(e * 37 % 256) & 0xBF;
                kd[g * LK * D + e] = (float)dec(f, k8[g * LK * D + e]) * sc[g];
            }
    }
    attn_tensor tq = attn_tensor_4d(q, ATTN_F32, 1, H, LQ, D), to = attn_tensor_4d(o, ATTN_F32, 1, H, LQ, D);
    attn_tensor tl = attn_tensor_4d(lse, ATTN_F32, 1, H, LQ, 1);
    attn_tensor tg1 = attn_tensor_4d(g1, ATTN_F32, 1, H, R, C), tg2 = attn_tensor_4d(g2, ATTN_F32, 1, H, R, C);
    attn_options lo = {.lse = &tl, .path = ATTN_PATH_REFERENCE};
    CHECK(attn_forward(&tq, &tkd, &tkd, &to, &lo) == ATTN_OK, "grid lse: %s", attn_last_error());
    attn_options ref = {.path = ATTN_PATH_REFERENCE}, ref8 = ref;
    if (!q4) ref8.k_scale = &ts;
    CHECK(attn_weights_grid(&tq, &tkd, &tl, &tg1, ATTN_REDUCE_SUM, &ref) == ATTN_OK &&
          attn_weights_grid(&tq, &tk8, &tl, &tg2, ATTN_REDUCE_SUM, &ref8) == ATTN_OK, "%s grid: %s", f->name,
          attn_last_error());
    CHECK(memcmp(g1, g2, sizeof g1) == 0, "%s: the reference grid is not the dequantized K's bit for bit", f->name);
    for (int i = 0; i < H * R * C; i++) gref[i] = g1[i];
    ref8.path = ATTN_PATH_FUSED;
    tol_result tr = {0};
    CHECK(attn_weights_grid(&tq, &tk8, &tl, &tg2, ATTN_REDUCE_SUM, &ref8) == ATTN_OK &&
          within_f32_tol(g2, gref, H * R * C, &tr), "%s: the fused grid: %s, max err %.3g", f->name,
          attn_last_error(), tr.max_err);
}

/* the kernel a decoding call (with scales or without) runs on: one with the fp8 step where a kernel
 * this CPU runs has it at or after the chosen one in the list, else the chosen one */
static void test_fp8_kernel_choice(void) {
    int bad = 0;
    const char *const *list = attn_kernel_list();
    for (int i = 0; list[i]; i++) {
        const attn_kernels *k = ai_kernels_named(list[i]);
        if (!k) continue;  // this CPU cannot run it
        const attn_kernels *c = ai_kernels_for_fp8(k);
        bool later = false;
        for (int j = i; list[j]; j++) {
            const attn_kernels *kj = ai_kernels_named(list[j]);
            later |= kj && kj->decode_fp8;
        }
        bad += later ? !c->decode_fp8 : c != k;
    }
    CHECK(bad == 0, "ai_kernels_for_fp8: %d kernels mapped wrong", bad);
}

/* the same for a q4_0 cache and the q4_0 step */
static void test_q4_kernel_choice(void) {
    int bad = 0;
    const char *const *list = attn_kernel_list();
    for (int i = 0; list[i]; i++) {
        const attn_kernels *k = ai_kernels_named(list[i]);
        if (!k) continue;
        const attn_kernels *c = ai_kernels_for_q4_0(k);
        bool later = false;
        for (int j = i; list[j]; j++) {
            const attn_kernels *kj = ai_kernels_named(list[j]);
            later |= kj && kj->decode_q4_0;
        }
        bad += later ? !c->decode_q4_0 : c != k;
    }
    CHECK(bad == 0, "ai_kernels_for_q4_0: %d kernels mapped wrong", bad);
}

/* Every kernel with a decoding step reads every cache dtype in it, so no format's decoding
 * call leaves the kernel dispatch picked for another one (issue 38: a q8_0 cache on
 * AVX-512 CPUs took the tiles, 0.20x the bfloat16 cache, while only avx2 had the step) */
static void test_steps_complete(void) {
    const char *const *list = attn_kernel_list();
    for (int i = 0; list[i]; i++) {
        const attn_kernels *k = ai_kernels_named(list[i]);
        if (!k || !k->decode) continue;
        CHECK(k->decode_q8_0 && k->decode_fp8 && k->decode_q4_0 && k->decode_rows,
              "kernel %s has a decoding step without q8_0 %d, fp8 %d, q4_0 %d or decode_rows %d",
              list[i], k->decode_q8_0, k->decode_fp8, k->decode_q4_0, k->decode_rows != NULL);
    }
}

/* ---- 4. misuse ------------------------------------------------------------------------- */

static void test_misuse(const fmt *f) {
    enum { L = 8, D = 32, H = 2 };
    float q[H * L * D], o[H * L * D], kf[H * L * D];
    uint8_t k8[H * L * D], v8[H * L * D];
    for (int i = 0; i < H * L * D; i++) q[i] = kf[i] = (float)(i % 7) * 0.25f, k8[i] = v8[i] = (uint8_t)(i % 0x70);
    attn_tensor tq = attn_tensor_4d(q, ATTN_F32, 1, H, L, D), to = attn_tensor_4d(o, ATTN_F32, 1, H, L, D);
    attn_tensor tk = attn_tensor_4d(k8, f->dt, 1, H, L, D), tv = attn_tensor_4d(v8, f->dt, 1, H, L, D);
    attn_tensor tkf = attn_tensor_4d(kf, ATTN_F32, 1, H, L, D);
    const float good = 0.5f, scales_bad[5] = {0.0f, -0.0f, -1.0f, NAN, INFINITY};
    float two[2] = {1.0f, 2.0f}, three[3] = {1, 1, 1};
    uint16_t half1 = 0x3C00;
    attn_tensor tgood = attn_tensor_4d((void *)&good, ATTN_F32, 1, 1, 1, 1);
    attn_tensor ttwo = attn_tensor_4d(two, ATTN_F32, H, 1, 1, 1), tthree = attn_tensor_4d(three, ATTN_F32, 3, 1, 1, 1);
    attn_tensor thalf = attn_tensor_4d(&half1, ATTN_F16, 1, 1, 1, 1);
    attn_tensor twide = attn_tensor_4d(two, ATTN_F32, 1, 1, 1, 2);
    attn_options ok = {.k_scale = &tgood, .v_scale = &ttwo};
    CHECK(attn_forward(&tq, &tk, &tv, &to, &ok) == ATTN_OK, "%s: the sound call: %s", f->name, attn_last_error());

    /* the forward: o untouched */
    for (int i = 0; i < 5 + 4; i++) {
        attn_tensor ts = attn_tensor_4d((void *)&scales_bad[i < 5 ? i : 0], ATTN_F32, 1, 1, 1, 1);
        attn_options opt = {.v_scale = &ts};
        attn_tensor k = tk, v = tv;
        attn_status want = ATTN_ERR_VALUE;
        const char *what = "a bad scale";
        if (i == 5) opt.v_scale = &tgood, k = v = tkf, what = "a scale with a float32 cache";
        if (i == 6) opt.k_scale = &tthree, opt.v_scale = NULL, want = ATTN_ERR_SHAPE, what = "3 scales, Hkv 2";
        if (i == 7) opt.k_scale = &thalf, opt.v_scale = NULL, want = ATTN_ERR_DTYPE, what = "a float16 scale";
        if (i == 8) opt.k_scale = &twide, opt.v_scale = NULL, want = ATTN_ERR_SHAPE, what = "a scale {1,1,1,2}";
        for (int path = 0; path < 2; path++) {
            opt.path = path ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED;
            fill_sentinel(o, H * L * D);
            attn_status st = attn_forward(&tq, &k, &v, &to, &opt);
            CHECK(st == want, "%s: forward with %s (%g): %s, expected %s", f->name, what,
                  (double)scales_bad[i < 5 ? i : 0], attn_status_string(st), attn_status_string(want));
            CHECK(count_written(o, H * L * D) == 0, "%s: %s: o written", f->name, what);
        }
    }
    /* o sharing bytes with a scale: ATTN_ERR_STRIDE, nothing else written */
    {
        float ob[H * L * D + 1];
        fill_sentinel(ob, H * L * D + 1);
        ob[0] = 0.5f;
        attn_tensor tob = attn_tensor_4d(ob, ATTN_F32, 1, H, L, D), tsc = attn_tensor_4d(ob, ATTN_F32, 1, 1, 1, 1);
        attn_options opt = {.v_scale = &tsc};
        attn_status st = attn_forward(&tq, &tk, &tv, &tob, &opt);
        CHECK(st == ATTN_ERR_STRIDE && ob[0] == 0.5f && count_written(ob + 1, H * L * D) == 0,
              "%s: o overlapping v_scale: %s, expected ATTN_ERR_STRIDE with nothing written", f->name,
              attn_status_string(st));
    }
    /* dtypes: fp8 q or o, k and v of different dtypes, the backward */
    attn_tensor q8 = attn_tensor_4d(k8, f->dt, 1, H, L, D);
    const attn_tensor *other_dt = f->dt == ATTN_FP8_E4M3 ? &(attn_tensor){v8, ATTN_FP8_E5M2, {1, H, L, D}, {H * L * D, L * D, D, 1}}
                                                          : &(attn_tensor){v8, ATTN_FP8_E4M3, {1, H, L, D}, {H * L * D, L * D, D, 1}};
    const struct { const attn_tensor *q, *k, *v, *o; const char *what; } dts[4] = {
        {&q8, &tk, &tv, &to, "fp8 q"}, {&tq, &tk, &tv, &q8, "fp8 o"},
        {&tq, &tk, other_dt, &to, "k and v of two fp8 dtypes"}, {&tq, &tk, &tkf, &to, "fp8 k, float32 v"}};
    for (int i = 0; i < 4; i++) {
        fill_sentinel(o, H * L * D);
        attn_status st = attn_forward(dts[i].q, dts[i].k, dts[i].v, dts[i].o, NULL);
        CHECK(st == ATTN_ERR_DTYPE, "%s: %s: %s, expected ATTN_ERR_DTYPE", f->name, dts[i].what, attn_status_string(st));
        CHECK(count_written(o, H * L * D) == 0 || dts[i].o != &to, "%s: %s: o written", f->name, dts[i].what);
    }
    {
        float lse[H * L], dq[H * L * D];
        attn_tensor tl = attn_tensor_4d(lse, ATTN_F32, 1, H, L, 1), tdq = attn_tensor_4d(dq, ATTN_F32, 1, H, L, D);
        fill_sentinel(dq, H * L * D);
        attn_status st = attn_backward(&tq, &tk, &tv, &to, &to, &tl, &tdq, NULL, NULL, NULL);
        CHECK(st == ATTN_ERR_DTYPE, "%s: the backward: %s, expected ATTN_ERR_DTYPE", f->name, attn_status_string(st));
        CHECK(count_written(dq, H * L * D) == 0, "%s: the backward wrote dq", f->name);
    }

    /* the append: the cache untouched */
    uint8_t cache[H * L * D], cache_v[H * L * D];
    float fcache[H * L * D];
    int32_t len = 0;
    attn_tensor tl = attn_tensor_4d(&len, ATTN_I32, 1, 1, 1, 1);
    attn_tensor kn = attn_tensor_4d(kf, ATTN_F32, 1, H, 2, D);
    attn_tensor tc = attn_tensor_4d(cache, f->dt, 1, H, L, D), tcv = attn_tensor_4d(cache_v, f->dt, 1, H, L, D);
    attn_tensor tfc = attn_tensor_4d(fcache, ATTN_F32, 1, H, L, D);
    for (int i = 0; i < 5 + 4; i++) {
        attn_tensor ts = attn_tensor_4d((void *)&scales_bad[i < 5 ? i : 0], ATTN_F32, 1, 1, 1, 1);
        const attn_tensor *ksc = &tgood, *vsc = &ts, *c = &tc, *cv = &tcv;
        attn_status want = ATTN_ERR_VALUE;
        if (i == 5) c = cv = &tfc, vsc = &tgood;
        if (i == 6) vsc = &tthree, want = ATTN_ERR_SHAPE;
        if (i == 7) ksc = &thalf, want = ATTN_ERR_DTYPE;
        if (i == 8) ksc = &twide, want = ATTN_ERR_SHAPE;
        memset(cache, 0xA5, sizeof cache), memset(cache_v, 0xA5, sizeof cache_v);
        fill_sentinel(fcache, H * L * D);
        attn_status st = attn_kv_append_scaled(&kn, &kn, c, cv, NULL, NULL, &tl, ksc, vsc);
        CHECK(st == want, "%s: append case %d: %s, expected %s", f->name, i, attn_status_string(st),
              attn_status_string(want));
        int written = 0;
        for (int e = 0; e < H * L * D; e++) written += cache[e] != 0xA5 || cache_v[e] != 0xA5;
        CHECK(written == 0 && count_written(fcache, H * L * D) == 0, "%s: append case %d wrote the cache",
              f->name, i);
    }
    /* the old call on an fp8 cache: scale 1 */
    memset(cache, 0xA5, sizeof cache);
    CHECK(attn_kv_append(&kn, &kn, &tc, &tcv, NULL, NULL, &tl) == ATTN_OK, "%s: attn_kv_append: %s",
          f->name, attn_last_error());
    int bad = 0;
    for (int64_t g = 0; g < H; g++)
        for (int e = 0; e < 2 * D; e++) bad += cache[g * L * D + e] != enc(f, kf[g * 2 * D + e]);
    CHECK(bad == 0, "%s: attn_kv_append (no scales): %d codes are not fp8(x)", f->name, bad);
}

/* ---- 5. the error table ------------------------------------------------------------------ */

static void test_error_table(void) {
    enum { B = 1, H = 4, LQ = 16, LK = 512, D = 128 };
    const int64_t nk = (int64_t)B * H * LK * D, nq = (int64_t)B * H * LQ * D;
    float *q = malloc(sizeof(float) * nq), *k = malloc(sizeof(float) * nk), *v = malloc(sizeof(float) * nk);
    float *o = malloc(sizeof(float) * nq);
    double *ref = malloc(sizeof(double) * nq);
    rng_t r = {2024};
    for (int64_t i = 0; i < nq; i++) q[i] = (float)rng_normal(&r);
    for (int64_t i = 0; i < nk; i++) k[i] = (float)rng_normal(&r), v[i] = (float)rng_normal(&r);
    attn_tensor tq = attn_tensor_4d(q, ATTN_F32, B, H, LQ, D), to = attn_tensor_4d(o, ATTN_F32, B, H, LQ, D);
    attn_tensor tk = attn_tensor_4d(k, ATTN_F32, B, H, LK, D), tv = attn_tensor_4d(v, ATTN_F32, B, H, LK, D);
    oracle_forward(&tq, &tk, &tv, NULL, ref, NULL, NULL);
    void *kc = malloc((size_t)nk * 4), *vc = malloc((size_t)nk * 4);
    const attn_dtype dts[8] = {ATTN_F32, ATTN_BF16, ATTN_F16, ATTN_Q8_0, ATTN_FP8_E4M3, ATTN_FP8_E5M2, ATTN_Q4_0,
                               ATTN_U4};
    const double ceiling[8] = {1e-5, 1e-2, 2e-3, 1e-2, 1e-1, 2e-1, 3e-1, 3e-1};
    /* u4 (KIVI): keys per channel over groups of 32 keys, values per token per 32 channels */
    float *u4s = malloc(sizeof(float) * 4 * (size_t)(B * H * LK * D / 32));
    float *kss = u4s, *kzs = u4s + nk / 32, *vss = u4s + 2 * (nk / 32), *vzs = u4s + 3 * (nk / 32);
    attn_tensor tkss = attn_tensor_4d(kss, ATTN_F32, B, H, LK / 32, D), tkzs = attn_tensor_4d(kzs, ATTN_F32, B, H, LK / 32, D);
    attn_tensor tvss = attn_tensor_4d(vss, ATTN_F32, B, H, LK, D / 32), tvzs = attn_tensor_4d(vzs, ATTN_F32, B, H, LK, D / 32);
    printf("error against float64 on the true float32 values, B=%d H=%d Lq=%d Lk=%d D=%d, N(0,1) q k v;\n"
           "fp8 scales amax / largest per tensor (vLLM's calibration):\n", B, H, LQ, LK, D);
    printf("  %-10s %12s %12s\n", "cache", "max |err|", "rel Frob");
    for (int x = 0; x < 8; x++) {
        const attn_dtype dt = dts[x];
        attn_tensor ck = attn_tensor_4d(kc, dt, B, H, LK, D), cv = attn_tensor_4d(vc, dt, B, H, LK, D);
        attn_options opt = {0};
        float ks = 1, vs = 1;
        attn_tensor tks = attn_tensor_4d(&ks, ATTN_F32, 1, 1, 1, 1), tvs = attn_tensor_4d(&vs, ATTN_F32, 1, 1, 1, 1);
        if (dt == ATTN_Q8_0) {
            CHECK(attn_quantize_q8_0(&tk, &ck) == ATTN_OK && attn_quantize_q8_0(&tv, &cv) == ATTN_OK, "table q8_0");
        } else if (dt == ATTN_Q4_0) {
            CHECK(attn_quantize_q4_0(&tk, &ck) == ATTN_OK && attn_quantize_q4_0(&tv, &cv) == ATTN_OK, "table q4_0");
        } else if (dt == ATTN_U4) {
            CHECK(attn_quantize_u4_keys(&tk, &ck, &tkss, &tkzs, 32) == ATTN_OK &&
                  attn_quantize_u4_values(&tv, &cv, &tvss, &tvzs) == ATTN_OK, "table u4: %s", attn_last_error());
            opt.k_scale = &tkss, opt.k_zero = &tkzs, opt.v_scale = &tvss, opt.v_zero = &tvzs;
        } else {
            if (attn_is_fp8(dt)) {
                const double mx = dt == ATTN_FP8_E4M3 ? 448.0 : 57344.0;
                double ka = 0, va = 0;
                for (int64_t i = 0; i < nk; i++) ka = fmax(ka, fabs(k[i])), va = fmax(va, fabs(v[i]));
                ks = (float)(ka / mx), vs = (float)(va / mx);
                opt.k_scale = &tks, opt.v_scale = &tvs;
            }
            int64_t zero = 0;
            attn_tensor tl = attn_tensor_4d(&zero, ATTN_I64, 1, 1, 1, 1);
            CHECK(attn_kv_append_scaled(&tk, &tv, &ck, &cv, NULL, NULL, &tl, opt.k_scale, opt.v_scale) == ATTN_OK,
                  "table %s: %s", attn_dtype_name(dt), attn_last_error());
        }
        CHECK(attn_forward(&tq, &ck, &cv, &to, &opt) == ATTN_OK, "table %s: %s", attn_dtype_name(dt), attn_last_error());
        double me = 0, se = 0, sr = 0;
        for (int64_t i = 0; i < nq; i++) {
            const double e = fabs(o[i] - ref[i]);
            me = fmax(me, e), se += e * e, sr += ref[i] * ref[i];
        }
        printf("  %-10s %12.3e %12.3e\n", attn_dtype_name(dt), me, sqrt(se / sr));
        CHECK(sqrt(se / sr) < ceiling[x], "table %s: relative error %.3g above %.3g", attn_dtype_name(dt),
              sqrt(se / sr), ceiling[x]);
    }
    free(q), free(k), free(v), free(o), free(ref), free(kc), free(vc), free(u4s);
}

/* ---- 6. q4_0 ------------------------------------------------------------------------------ */

/* a block of 18 bytes written by hand: scale bytes lo, hi, then element i < 16 the low
 * nibble of byte 2 + i and element i + 16 its high nibble */
static void q4_hand(uint8_t *b, uint8_t lo, uint8_t hi, const int *nib) {
    b[0] = lo, b[1] = hi;
    for (int i = 0; i < 16; i++) b[2 + i] = (uint8_t)(nib[i] | nib[i + 16] << 4);
}

static void q4_quantize_one(const float *x, uint8_t *b) {
    attn_tensor s = attn_tensor_4d((void *)x, ATTN_F32, 1, 1, 1, 32), d = attn_tensor_4d(b, ATTN_Q4_0, 1, 1, 1, 32);
    CHECK(attn_quantize_q4_0(&s, &d) == ATTN_OK, "q4_0 quantize: %s", attn_last_error());
}

static void test_q4_blocks(void) {
    /* block 0: scale 0x3C00 (1.0), nibbles 0..15 then 15..0: values -8..7, 7..-8; block 1:
     * scale 0x3C01 (1 + 2^-10: the byte order), nibbles (3 i) mod 16 */
    int nib0[32], nib1[32];
    for (int i = 0; i < 16; i++) nib0[i] = i, nib0[16 + i] = 15 - i;
    for (int i = 0; i < 32; i++) nib1[i] = (3 * i) % 16;
    uint8_t buf[36];
    q4_hand(buf, 0x00, 0x3C, nib0);
    q4_hand(buf + 18, 0x01, 0x3C, nib1);
    float out[64];
    attn_tensor src = attn_tensor_4d(buf, ATTN_Q4_0, 1, 1, 1, 64), dst = attn_tensor_4d(out, ATTN_F32, 1, 1, 1, 64);
    CHECK(attn_dtype_size(ATTN_Q4_0) == 18 && attn_dtype_block(ATTN_Q4_0) == 32 &&
          strcmp(attn_dtype_name(ATTN_Q4_0), "q4_0") == 0, "q4_0: size, block or name wrong");
    CHECK(attn_dequantize_q4_0(&src, &dst) == ATTN_OK, "q4_0 dequantize the hand blocks: %s", attn_last_error());
    int bad = 0;
    const float d1 = 1.0f + 0x1p-10f;
    for (int i = 0; i < 32; i++) bad += out[i] != (float)(nib0[i] - 8) || out[32 + i] != d1 * (float)(nib1[i] - 8);
    CHECK(bad == 0, "q4_0 hand blocks: %d of 64 values are not d * (nibble - 8)", bad);

    /* quantized again: block 0 holds -8 first (its largest magnitude, element 0), so d = 1
     * and the same 18 bytes, bit for bit */
    uint8_t again[18];
    q4_quantize_one(out, again);
    CHECK(memcmp(again, buf, 18) == 0, "q4_0 hand block 0: dequantize then quantize changed its bytes");

    /* the forward reads the same bytes: one key (block 0), V the two blocks */
    float q[32] = {0}, o[64];
    attn_tensor tq = attn_tensor_4d(q, ATTN_F32, 1, 1, 1, 32), to = attn_tensor_4d(o, ATTN_F32, 1, 1, 1, 64);
    attn_tensor tk = attn_tensor_4d(buf, ATTN_Q4_0, 1, 1, 1, 32), tv = attn_tensor_4d(buf, ATTN_Q4_0, 1, 1, 1, 64);
    for (int path = 0; path < 2; path++) {
        attn_options opt = {.path = path ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED};
        CHECK(attn_forward(&tq, &tk, &tv, &to, &opt) == ATTN_OK, "q4_0 forward on the hand blocks: %s", attn_last_error());
        CHECK(memcmp(o, out, sizeof o) == 0, "q4_0, path %d: one key's output is not its V row bit for bit", path);
    }

    /* known inputs. max -8 first: d = 1; x / d + 8.5 truncated: 0.5 -> 9, -0.5 -> 8 (ties
     * up), 1.49 -> 9, 7.6 -> 15 (clipped at 15 from 16), -7.6 -> 0 */
    float x[32] = {0};
    uint8_t b[18];
    x[0] = -8.0f, x[1] = 0.5f, x[2] = -0.5f, x[3] = 1.49f, x[4] = 7.6f, x[5] = -7.6f, x[17] = 8.0f;
    q4_quantize_one(x, b);
    CHECK(b[0] == 0x00 && b[1] == 0x3C, "q4_0 max -8: scale bytes %02x %02x, expected 00 3c", b[0], b[1]);
    CHECK((b[2] & 15) == 0 && (b[3] & 15) == 9 && (b[4] & 15) == 8 && (b[5] & 15) == 9 && (b[6] & 15) == 15 &&
          (b[7] & 15) == 0 && (b[8] & 15) == 8 && (b[3] >> 4) == 15,
          "q4_0 max -8: nibbles %d %d %d %d %d %d %d / %d, expected 0 9 8 9 15 0 8 / 15", b[2] & 15, b[3] & 15,
          b[4] & 15, b[5] & 15, b[6] & 15, b[7] & 15, b[8] & 15, b[3] >> 4);
    /* a positive max: d = 4 / -8 = -0.5; 4 -> nibble 0 (value 4), -4 -> 16 clipped to 15
     * (value -3.5); the first of two equal magnitudes decides the sign */
    memset(x, 0, sizeof x);
    x[3] = 4.0f, x[7] = -4.0f;
    q4_quantize_one(x, b);
    CHECK(b[0] == 0x00 && b[1] == 0xB8 && (b[5] >> 4) == 8 && (b[9] >> 4) == 8 && (b[5] & 15) == 0 &&
          (b[9] & 15) == 15, "q4_0 max +4 first: bytes %02x %02x, nibbles %d %d", b[0], b[1], b[5] & 15, b[9] & 15);
    x[3] = -4.0f, x[7] = 4.0f;
    q4_quantize_one(x, b);
    CHECK(b[0] == 0x00 && b[1] == 0x38, "q4_0 max -4 first: scale bytes %02x %02x, expected 00 38", b[0], b[1]);
    /* all zeros: d = 0 / -8 = -0 (float16 0x8000, as llama.cpp's reference stores it),
     * every nibble 8 */
    memset(x, 0, sizeof x);
    q4_quantize_one(x, b);
    bad = b[0] != 0 || b[1] != 0x80;
    for (int i = 2; i < 18; i++) bad += b[i] != 0x88;
    CHECK(bad == 0, "q4_0 all-zero block: not d = 0 and nibbles 8");
    /* the float16 rounding of d: max -1/3 gives d = 1/24 */
    x[0] = -1.0f / 3.0f;
    q4_quantize_one(x, b);
    CHECK((uint16_t)(b[0] | b[1] << 8) == attn_f32_to_f16((-1.0f / 3.0f) / -8.0f), "q4_0: scale not float16(max / -8)");

    /* random rows, strided source: |x - d16 (q - 8)| <= |d| (1 + 8 2^-11) (the clip at 15
     * costs up to one step; float16's rounding of d 8 half-ulps at the ends) */
    enum { ROWS = 40, D = 96 };
    rng_t r = {17};
    float *src2 = malloc(sizeof(float) * ROWS * D * 2), *back = malloc(sizeof(float) * ROWS * D);
    uint8_t *q4 = malloc((size_t)ROWS * D / 32 * 18);
    for (int64_t i = 0; i < ROWS * D * 2; i++) src2[i] = (float)(rng_normal(&r) * pow(10.0, (double)(i / 192 % 6) - 2));
    attn_tensor ts = {src2, ATTN_F32, {1, 1, ROWS, D}, {0, 0, 2 * D, 2}};
    attn_tensor tq4 = attn_tensor_4d(q4, ATTN_Q4_0, 1, 1, ROWS, D), tb = attn_tensor_4d(back, ATTN_F32, 1, 1, ROWS, D);
    CHECK(attn_quantize_q4_0(&ts, &tq4) == ATTN_OK && attn_dequantize_q4_0(&tq4, &tb) == ATTN_OK, "q4_0 random: %s",
          attn_last_error());
    int64_t over = 0;
    for (int64_t row = 0; row < ROWS; row++)
        for (int64_t c = 0; c < D / 32; c++) {
            double amax = 0;
            for (int i = 0; i < 32; i++) amax = fmax(amax, fabs(src2[row * 2 * D + 2 * (c * 32 + i)]));
            for (int i = 0; i < 32; i++)
                over += fabs((double)src2[row * 2 * D + 2 * (c * 32 + i)] - back[row * D + c * 32 + i]) >
                        amax / 8 * (1 + 8.0 / 2048) * (1 + 1e-6);
        }
    CHECK(over == 0, "q4_0 random: %lld values off by more than |d| (1 + 8/2048)", (long long)over);

    /* attn_kv_append into a q4_0 cache: attn_quantize_q4_0's bytes; refused inputs */
    uint8_t cache[4 * 64 / 32 * 18], want[4 * 64 / 32 * 18];
    int32_t len = 1;
    attn_tensor tl = attn_tensor_4d(&len, ATTN_I32, 1, 1, 1, 1);
    attn_tensor kn = attn_tensor_4d(src2, ATTN_F32, 1, 1, 2, 64);
    attn_tensor tc = attn_tensor_4d(cache, ATTN_Q4_0, 1, 1, 4, 64);
    memset(cache, 0xA5, sizeof cache);
    memcpy(want, cache, sizeof want);
    attn_tensor tw = attn_tensor_4d(want + 2 * 18, ATTN_Q4_0, 1, 1, 2, 64);  // rows 1, 2
    CHECK(attn_quantize_q4_0(&kn, &tw) == ATTN_OK, "q4_0: %s", attn_last_error());
    attn_tensor vn = kn, vc = tc;
    uint8_t vcache[sizeof cache];
    vc.data = vcache;
    CHECK(attn_kv_append(&kn, &vn, &tc, &vc, NULL, NULL, &tl) == ATTN_OK && memcmp(cache, want, sizeof cache) == 0,
          "q4_0: attn_kv_append's bytes are not attn_quantize_q4_0's (%s)", attn_last_error());
    const float one = 1.0f;
    attn_tensor tone = attn_tensor_4d((void *)&one, ATTN_F32, 1, 1, 1, 1);
    float keep = src2[70];
    const float poison[3] = {NAN, INFINITY, 1e6f};
    for (int i = 0; i < 4; i++) {
        memset(cache, 0xA5, sizeof cache);
        attn_status st, want_st = ATTN_ERR_VALUE;
        if (i < 3) {
            src2[70] = poison[i];
            st = attn_kv_append(&kn, &vn, &tc, &vc, NULL, NULL, &tl);
            src2[70] = keep;
        } else {
            st = attn_kv_append_scaled(&kn, &vn, &tc, &vc, NULL, NULL, &tl, &tone, NULL);
        }
        int written = 0;
        for (size_t e = 0; e < sizeof cache; e++) written += cache[e] != 0xA5;
        CHECK(st == want_st && written == 0, "q4_0 append, bad case %d: %s, %d bytes written", i,
              attn_status_string(st), written);
        /* the same refusals from attn_quantize_q4_0, nothing written */
        if (i < 3) {
            src2[70] = poison[i];
            memset(want, 0xA5, sizeof want);
            st = attn_quantize_q4_0(&kn, &tw);
            src2[70] = keep;
            written = 0;
            for (size_t e = 0; e < sizeof want; e++) written += want[e] != 0xA5;
            CHECK(st == ATTN_ERR_VALUE && written == 0, "q4_0 quantize, bad case %d: %s, %d bytes written", i,
                  attn_status_string(st), written);
        }
    }
    free(src2), free(back), free(q4);

    /* layouts and dtypes refused, o untouched */
    enum { L = 8, DD = 64 };
    float qq[L * DD], oo[L * DD], kf[L * DD];
    uint8_t k4[L * DD / 32 * 18 + 64] = {0}, v4[L * DD / 32 * 18] = {0};
    for (int i = 0; i < L * DD; i++) qq[i] = kf[i] = (float)(i % 5) * 0.5f;
    attn_tensor tq2 = attn_tensor_4d(qq, ATTN_F32, 1, 1, L, DD), to2 = attn_tensor_4d(oo, ATTN_F32, 1, 1, L, DD);
    attn_tensor k2 = attn_tensor_4d(k4, ATTN_Q4_0, 1, 1, L, DD), v2 = attn_tensor_4d(v4, ATTN_Q4_0, 1, 1, L, DD);
    CHECK(attn_forward(&tq2, &k2, &v2, &to2, NULL) == ATTN_OK, "q4_0: the sound call: %s", attn_last_error());
    typedef struct { attn_tensor q, k, v, o; attn_status want; const char *what; const attn_tensor *scale; } bad_call;
    bad_call bc[9];
    int n = 0;
    attn_tensor xx;
    xx = attn_tensor_4d(k4, ATTN_Q4_0, 1, 1, L / 2, 48); bc[n++] = (bad_call){tq2, xx, xx, to2, ATTN_ERR_SHAPE, "D = 48", NULL};
    xx = k2; xx.stride[3] = 2; xx.shape[3] = 32; bc[n++] = (bad_call){tq2, xx, xx, to2, ATTN_ERR_STRIDE, "stride[3] = 2", NULL};
    xx = k2; xx.stride[2] = DD + 8; xx.shape[2] = 4; bc[n++] = (bad_call){tq2, xx, xx, to2, ATTN_ERR_STRIDE, "stride[2] = 72", NULL};
    xx = k2; xx.stride[2] = 16; xx.shape[2] = 4; bc[n++] = (bad_call){tq2, xx, xx, to2, ATTN_ERR_STRIDE, "stride[2] = 16", NULL};
    xx = attn_tensor_4d(qq, ATTN_Q4_0, 1, 1, L, DD); bc[n++] = (bad_call){xx, k2, v2, to2, ATTN_ERR_DTYPE, "q4_0 q", NULL};
    xx = attn_tensor_4d(oo, ATTN_Q4_0, 1, 1, L, DD); bc[n++] = (bad_call){tq2, k2, v2, xx, ATTN_ERR_DTYPE, "q4_0 o", NULL};
    xx = attn_tensor_4d(kf, ATTN_F32, 1, 1, L, DD); bc[n++] = (bad_call){tq2, k2, xx, to2, ATTN_ERR_DTYPE, "q4_0 k, float32 v", NULL};
    xx = attn_tensor_4d(k4, ATTN_Q8_0, 1, 1, L, DD); bc[n++] = (bad_call){tq2, k2, xx, to2, ATTN_ERR_DTYPE, "q4_0 k, q8_0 v", NULL};
    bc[n++] = (bad_call){tq2, k2, v2, to2, ATTN_ERR_VALUE, "a scale with q4_0", &tone};
    for (int i = 0; i < n; i++) {
        fill_sentinel(oo, L * DD);
        attn_options opt = {.k_scale = bc[i].scale};
        attn_status st = attn_forward(&bc[i].q, &bc[i].k, &bc[i].v, &bc[i].o, &opt);
        CHECK(st == bc[i].want, "q4_0 %s: %s (%s), expected %s", bc[i].what, attn_status_string(st), attn_last_error(),
              attn_status_string(bc[i].want));
        CHECK(count_written(oo, L * DD) == 0, "q4_0 %s: o written on a refused call", bc[i].what);
    }
    {
        float lse[L], dq[L * DD];
        attn_tensor tl2 = attn_tensor_4d(lse, ATTN_F32, 1, 1, L, 1), tdq = attn_tensor_4d(dq, ATTN_F32, 1, 1, L, DD);
        fill_sentinel(dq, L * DD);
        attn_status st = attn_backward(&tq2, &k2, &v2, &to2, &to2, &tl2, &tdq, NULL, NULL, NULL);
        CHECK(st == ATTN_ERR_DTYPE && count_written(dq, L * DD) == 0, "q4_0: the backward: %s, expected "
              "ATTN_ERR_DTYPE, nothing written", attn_status_string(st));
    }
}

int main(void) {
    const fmt *fmts[2] = {&E4M3, &E5M2};
    for (int i = 0; i < 2; i++) {
        test_codes(fmts[i]);
        test_encode(fmts[i]);
        test_forward(fmts[i]);
        test_varlen(fmts[i]);
        test_grid(fmts[i]);
        test_cascade(fmts[i]);
        test_key_scores(fmts[i]);
        test_misuse(fmts[i]);
    }
    test_fp8_kernel_choice();
    test_q4_kernel_choice();
    test_steps_complete();
    test_q4_blocks();
    test_forward(&Q4);
    test_grid(&Q4);
    test_error_table();
    return check_summary("test_fp8_q4");
}
