/*
 * test_half.c — the half-precision paths: conversions and accuracy.
 *
 * 1. Conversions: every one of the 65536 float16 and bfloat16 patterns to float32 and
 *    back; float32 to 16 bits against a brute-force round-to-nearest-even (ties,
 *    overflow to inf, subnormals, NaN); each kernel's vector conversion against the
 *    scalar one.
 * 2. Accuracy, the rule FlashAttention's tests use: over a matrix of shapes and masks,
 *    each 16-bit combination (float16 / bfloat16 K and V under float16, bfloat16 or
 *    float32 queries, 16-bit or float32 outputs, both precision levels, both paths) has
 *    a max error against the float64 oracle at most twice that of a naive
 *    implementation computing in the same 16-bit type (tools/common/naive.c: every
 *    intermediate rounded to the type, as PyTorch's math path does).
 * 3. The contract's edge cases in 16 bits: fully masked rows exactly 0, NaN stays NaN,
 *    float16 output overflow becomes inf.
 * Not here: float32 accuracy (test_forward), speed (attn bench).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "check.h"
#include "core/half.h"
#include "kernels/kernels.h"
#include "naive.h"
#include "rng.h"

static rng_t g_rng = {99};
static double uniform(void) { return rng_unif(&g_rng); }


/* round x (a float) to the type dt and back: the value a 16-bit tensor would hold */
#define round_to naive_round

/* ---- 1. conversions ------------------------------------------------------------------ */

/* the correctly rounded 16-bit neighbour of x, found among all finite values of the type
 * (sorted), ties to the even pattern; beyond the largest finite value by half an ulp or
 * more: inf */
static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}
typedef struct { float value; uint16_t bits; } entry;
static int cmp_entry(const void *a, const void *b) {
    return cmp_float(&((const entry *)a)->value, &((const entry *)b)->value);
}

static uint16_t brute_round(const entry *tab, int n, float x, float ulp_top, uint16_t inf_bits) {
    const float top = tab[n - 1].value;
    if (x >= top + ulp_top / 2) return inf_bits;
    if (x <= -top - ulp_top / 2) return (uint16_t)(inf_bits | 0x8000);
    if (x < tab[0].value) return tab[0].bits;      // between -max and -max - ulp/2
    if (x > tab[n - 1].value) return tab[n - 1].bits;
    int lo = 0, hi = n - 1;  // largest entry <= x
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (tab[mid].value <= x) lo = mid; else hi = mid - 1;
    }
    if (tab[lo].value == x) {
        if (x == 0) return signbit(x) ? 0x8000 : 0;
        return tab[lo].bits;
    }
    const entry a = tab[lo], b = tab[lo + 1];
    const double da = (double)x - a.value, db = (double)b.value - x;
    uint16_t r = da < db ? a.bits : db < da ? b.bits : ((a.bits & 1) == 0 ? a.bits : b.bits);
    if ((r & 0x7FFF) == 0 && signbit(x)) r = 0x8000;  // a negative value rounding to zero
    return r;
}

static void test_conversions(void) {
    static entry f16[65536], bf16[65536];
    int nf = 0, nb = 0, bad_round_trip = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float a = attn_f16_to_f32((uint16_t)h), b = attn_bf16_to_f32((uint16_t)h);
        /* every pattern survives the round trip, NaN as a NaN */
        if (isnan(a) ? !isnan(attn_f16_to_f32(attn_f32_to_f16(a))) : attn_f32_to_f16(a) != h)
            bad_round_trip++;
        if (isnan(b) ? !isnan(attn_bf16_to_f32(attn_f32_to_bf16(b))) : attn_f32_to_bf16(b) != h)
            bad_round_trip++;
        if (isfinite(a) && !(a == 0 && h != 0)) f16[nf++] = (entry){a, (uint16_t)h};
        if (isfinite(b) && !(b == 0 && h != 0)) bf16[nb++] = (entry){b, (uint16_t)h};
    }
    CHECK(bad_round_trip == 0, "%d 16-bit patterns do not survive 16 -> 32 -> 16", bad_round_trip);
    qsort(f16, nf, sizeof f16[0], cmp_entry);
    qsort(bf16, nb, sizeof bf16[0], cmp_entry);
    CHECK(f16[nf - 1].value == 65504.0f, "largest float16 %g", f16[nf - 1].value);
    CHECK(attn_f16_to_f32(0x0001) == 0x1p-24f, "smallest float16 subnormal");

    /* float32 -> 16 bits: random floats of every magnitude, exact ties, the edges */
    int bad16 = 0, badb = 0;
    for (int t = 0; t < 400000; t++) {
        float x;
        if (t < 200000) {
            x = (float)((uniform() * 2 - 1) * ldexp(1.0, (int)(uniform() * 60) - 30));
        } else if (t < 300000) {  // halfway between two float16 values
            int k = (int)(uniform() * (nf - 1));
            x = (float)(((double)f16[k].value + f16[k + 1].value) / 2);
        } else {
            int k = (int)(uniform() * (nb - 1));
            x = (float)(((double)bf16[k].value + bf16[k + 1].value) / 2);
        }
        bad16 += attn_f32_to_f16(x) != brute_round(f16, nf, x, 32.0f, 0x7C00);
        badb += attn_f32_to_bf16(x) != brute_round(bf16, nb, x, 0x1p104f, 0x7F80);
    }
    const float edges[] = {65504.0f, 65519.99f, 65520.0f, 70000.0f, 1e30f, 0x1p-24f, 0x1p-25f,
                           0x1.000002p-25f, 0x1p-14f, 0x1.ffcp-15f, 3.0e38f, 3.4028235e38f};
    for (size_t e = 0; e < sizeof edges / sizeof edges[0]; e++)
        for (int sgn = 0; sgn < 2; sgn++) {
            const float x = sgn ? -edges[e] : edges[e];
            bad16 += attn_f32_to_f16(x) != brute_round(f16, nf, x, 32.0f, 0x7C00);
            badb += attn_f32_to_bf16(x) != brute_round(bf16, nb, x, 0x1p104f, 0x7F80);
        }
    CHECK(bad16 == 0, "%d float32 -> float16 conversions differ from round-to-nearest-even", bad16);
    CHECK(badb == 0, "%d float32 -> bfloat16 conversions differ from round-to-nearest-even", badb);
    CHECK(isnan(attn_f16_to_f32(attn_f32_to_f16(NAN))) && isnan(attn_bf16_to_f32(attn_f32_to_bf16(-NAN))),
          "NaN must stay NaN");
    CHECK(attn_f32_to_f16(1e6f) == 0x7C00 && attn_f32_to_f16(-1e6f) == 0xFC00, "float16 overflow is inf");
    /* a planted error must be seen by the brute force: 1 + 2^-11 is a tie, goes to 1 */
    CHECK(brute_round(f16, nf, 1.00048828125f, 32.0f, 0x7C00) == 0x3C00 &&
              attn_f32_to_f16(1.00048828125f) == 0x3C00, "tie to even at 1 + 2^-11");

    /* each kernel's vector conversion equals the scalar one on every pattern */
    static uint16_t all[65536];
    static float got[65536];
    for (uint32_t h = 0; h < 65536; h++) all[h] = (uint16_t)h;
#define X_CONV(name, ...)                                                                   \
    if (attn_kernel_supported(#name)) {                                                    \
        for (int d = 0; d < 2; d++) {                                                      \
            const attn_dtype dt = d ? ATTN_BF16 : ATTN_F16;                                 \
            attn_kernels_##name.to_f32(dt, 65535, all + 1, got + 1); /* odd length */      \
            int bad = 0;                                                                    \
            for (uint32_t h = 1; h < 65536; h++) {                                          \
                const float e = d ? attn_bf16_to_f32((uint16_t)h) : attn_f16_to_f32((uint16_t)h); \
                bad += isnan(e) ? !isnan(got[h]) : memcmp(&e, &got[h], 4) != 0;              \
            }                                                                               \
            CHECK(bad == 0, "%s to_f32(%s): %d patterns differ from the scalar conversion", \
                  #name, attn_dtype_name(dt), bad);                                                 \
        }                                                                                   \
    }
    ATTN_KERNEL_LIST(X_CONV)
#undef X_CONV
}

/* ---- 2. accuracy against a naive same-precision implementation ------------------------ */

typedef struct acase {
    int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
    bool causal, bottom_right, bool_mask;
    int64_t window_left;  // -2: no window
    float scale_mul;      // logits' spread
} acase;

/* The float64 oracle over dense [B, H, L, D] inputs; keep [Lq, Lk] = which keys a row
 * attends (the masks of the case, spelled out). */
static void oracle(const acase *c, const float *q, const float *k, const float *v,
                   const uint8_t *keep, float scale, double *ref) {
    const int64_t g = c->Hq / c->Hkv;
    double *s = malloc((size_t)c->Lk * sizeof(double));
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->Hq; h++)
            for (int64_t i = 0; i < c->Lq; i++) {
                const float *q_i = q + ((b * c->Hq + h) * c->Lq + i) * c->Dk;
                double m = -INFINITY, l = 0;
                for (int64_t j = 0; j < c->Lk; j++) {
                    const float *k_j = k + ((b * c->Hkv + h / g) * c->Lk + j) * c->Dk;
                    double dot = 0;
                    for (int64_t d = 0; d < c->Dk; d++) dot += (double)q_i[d] * k_j[d];
                    s[j] = keep[i * c->Lk + j] ? scale * dot : -INFINITY;
                    m = fmax(m, s[j]);
                }
                for (int64_t j = 0; j < c->Lk; j++) l += s[j] = m == -INFINITY ? 0 : exp(s[j] - m);
                for (int64_t d = 0; d < c->Dv; d++) {
                    double acc = 0;
                    for (int64_t j = 0; j < c->Lk; j++)
                        if (s[j] != 0) acc += s[j] * v[((b * c->Hkv + h / g) * c->Lk + j) * c->Dv + d];
                    ref[((b * c->Hq + h) * c->Lq + i) * c->Dv + d] = m == -INFINITY ? 0 : acc / l;
                }
            }
    free(s);
}

static void fill_tensor(attn_dtype dt, void *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) attn_store(dt, dst, i, src[i]);
}

static double max_err_vs(const double *ref, attn_dtype dt, const void *got, int64_t n,
                         double *max_ref) {
    double e = 0;
    *max_ref = 0;
    for (int64_t i = 0; i < n; i++) {
        const double g = attn_load(dt, got, i);
        if (!(fabs(g - ref[i]) <= e)) e = fabs(g - ref[i]);  // NaN counts as infinite error
        if (fabs(ref[i]) > *max_ref) *max_ref = fabs(ref[i]);
    }
    return e;
}

static void test_accuracy_case(const acase *c) {
    if (test_case_skipped()) return;
    const int64_t nq = c->B * c->Hq * c->Lq * c->Dk, nk = c->B * c->Hkv * c->Lk * c->Dk;
    const int64_t nv = c->B * c->Hkv * c->Lk * c->Dv, no = c->B * c->Hq * c->Lq * c->Dv;
    float *q32 = malloc(nq * sizeof(float)), *k32 = malloc(nk * sizeof(float));
    float *v32 = malloc(nv * sizeof(float)), *naive = malloc(no * sizeof(float));
    float *naive32 = malloc(no * sizeof(float));
    double *ref = malloc(no * sizeof(double));
    uint8_t *mask = malloc((size_t)(c->Lq * c->Lk)), *keep = malloc((size_t)(c->Lq * c->Lk));
    void *qx = malloc(nq * 4), *kx = malloc(nk * 4), *vx = malloc(nv * 4), *ox = malloc(no * 4);
    for (int64_t i = 0; i < c->Lq; i++)
        for (int64_t j = 0; j < c->Lk; j++) {
            const int64_t d_i = c->bottom_right ? i + c->Lk - c->Lq : i;
            mask[i * c->Lk + j] = uniform() < 0.8;
            keep[i * c->Lk + j] = !(c->causal && j > d_i) &&
                                  !(c->window_left >= 0 && j < d_i - c->window_left) &&
                                  !(c->bool_mask && !mask[i * c->Lk + j]);
        }
    const float scale = c->scale_mul / sqrtf((float)c->Dk);

    static const attn_dtype kvs[] = {ATTN_F16, ATTN_BF16};
    for (int kt = 0; kt < 2; kt++) {
        const attn_dtype kv = kvs[kt];
        /* inputs drawn once and rounded to the KV type, so every dtype combination of
         * this case sees the same values */
        for (int64_t i = 0; i < nq; i++) q32[i] = round_to(kv, (float)(uniform() * 2 - 1));
        for (int64_t i = 0; i < nk; i++) k32[i] = round_to(kv, (float)(uniform() * 2 - 1));
        for (int64_t i = 0; i < nv; i++) v32[i] = round_to(kv, (float)(uniform() * 2 - 1));
        oracle(c, q32, k32, v32, keep, scale, ref);
        naive_attention(kv, c->B, c->Hq, c->Hkv, c->Lq, c->Lk, c->Dk, c->Dv, q32, k32, v32, keep,
                        scale, naive);
        double naive_err = 0;
        for (int64_t i = 0; i < no; i++)
            if (!(fabs(naive[i] - ref[i]) <= naive_err)) naive_err = fabs(naive[i] - ref[i]);
        /* the yardstick itself: computed in float32 (no rounding added) it is the oracle to
         * the float32 tolerance, so a wrong mask or scale in naive.c cannot pass as slack */
        {
            naive_attention(ATTN_F32, c->B, c->Hq, c->Hkv, c->Lq, c->Lk, c->Dk, c->Dv, q32, k32,
                            v32, keep, scale, naive32);
            double e32 = 0, m32 = 0;
            for (int64_t i = 0; i < no; i++) {
                if (!(fabs(naive32[i] - ref[i]) <= e32)) e32 = fabs(naive32[i] - ref[i]);
                if (fabs(ref[i]) > m32) m32 = fabs(ref[i]);
            }
            CHECK(e32 <= 1e-5 * (1 + m32), "naive.c in float32 vs the oracle: max error %.3g", e32);
        }

        const attn_dtype qts[] = {kv, ATTN_F32};
        const attn_dtype ots[] = {kv, ATTN_F32};
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 2; b++)
                for (int prec = 0; prec < 2; prec++)
                    for (int path = 0; path < 2; path++) {
                        if (path == 1 && prec == 1) continue;  // the reference has one precision
                        const attn_dtype qt = qts[a], ot = ots[b];
                        fill_tensor(qt, qx, q32, nq);
                        fill_tensor(kv, kx, k32, nk);
                        fill_tensor(kv, vx, v32, nv);
                        attn_tensor tq = attn_tensor_4d(qx, qt, c->B, c->Hq, c->Lq, c->Dk);
                        attn_tensor tk = attn_tensor_4d(kx, kv, c->B, c->Hkv, c->Lk, c->Dk);
                        attn_tensor tv = attn_tensor_4d(vx, kv, c->B, c->Hkv, c->Lk, c->Dv);
                        attn_tensor to = attn_tensor_4d(ox, ot, c->B, c->Hq, c->Lq, c->Dv);
                        attn_tensor tm = attn_tensor_4d(mask, ATTN_BOOL, 1, 1, c->Lq, c->Lk);
                        attn_options opt = {
                            .has_scale = true, .scale = scale, .causal = c->causal,
                            .align = c->bottom_right ? ATTN_ALIGN_BOTTOM_RIGHT : ATTN_ALIGN_TOP_LEFT,
                            .has_window = c->window_left >= 0, .window_left = c->window_left,
                            .window_right = -1, .mask = c->bool_mask ? &tm : NULL,
                            .precision = prec ? ATTN_PRECISION_FAST : ATTN_PRECISION_DEFAULT,
                            .path = path ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED,
                        };
                        attn_status st = attn_forward(&tq, &tk, &tv, &to, &opt);
                        double mr;
                        const double err = st == ATTN_OK ? max_err_vs(ref, ot, ox, no, &mr) : INFINITY;
                        /* at most twice the naive error, plus float32 noise for the cases
                         * where the naive one happens to be exact */
                        const double bound = 2 * naive_err + 0x1p-23 * (1 + mr);
                        CHECK(st == ATTN_OK && err <= bound,
                              "%s: q %s kv %s o %s %s %s, B%lld H%lld/%lld L%lld/%lld D%lld/%lld "
                              "causal %d br %d mask %d win %lld: error %.3g, naive %.3g (status %d)",
                              attn_kernel_name(), attn_dtype_name(qt), attn_dtype_name(kv), attn_dtype_name(ot),
                              prec ? "fast" : "default", path ? "reference" : "fused",
                              (long long)c->B, (long long)c->Hq, (long long)c->Hkv,
                              (long long)c->Lq, (long long)c->Lk, (long long)c->Dk,
                              (long long)c->Dv, c->causal, c->bottom_right, c->bool_mask,
                              (long long)c->window_left, err, naive_err, (int)st);
                    }
    }
    free(q32), free(k32), free(v32), free(naive), free(naive32), free(ref), free(mask), free(keep);
    free(qx), free(kx), free(vx), free(ox);
}

static void test_accuracy(void) {
    static const acase cases[] = {
        {1, 1, 1, 1, 1, 8, 8, false, false, false, -2, 1},
        {1, 2, 1, 1, 300, 64, 64, false, false, false, -2, 1},      // decoding, GQA
        {1, 4, 2, 3, 2500, 64, 48, true, true, false, -2, 1},       // split keys
        {2, 2, 2, 17, 17, 3, 5, false, false, true, -2, 1},
        {1, 2, 2, 64, 64, 64, 64, true, false, false, -2, 2},
        {1, 1, 1, 65, 130, 80, 96, true, true, true, 20, 1},
        {1, 2, 1, 129, 127, 128, 128, false, false, false, -2, 3},
        {1, 1, 1, 200, 200, 17, 33, false, false, true, 7, 1},
        {1, 2, 2, 100, 100, 256, 64, true, false, false, -2, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_accuracy_case(&cases[i]);
}

/* ---- 3. edge cases in 16 bits ---------------------------------------------------------- */

static void test_edges(void) {
    enum { L = 5, D = 8 };
    uint16_t q[L * D], k[L * D], v[L * D], o[L * D];
    float of[L * D], lse[L];
    for (int t = 0; t < 2; t++) {
        const attn_dtype dt = t ? ATTN_BF16 : ATTN_F16;
        for (int i = 0; i < L * D; i++) {
            attn_store(dt, q, i, (float)(uniform() - 0.5));
            attn_store(dt, k, i, (float)(uniform() - 0.5));
            attn_store(dt, v, i, (float)(uniform() - 0.5));
        }
        /* keys 3 and 4 beyond kv_len hold NaN: they must not be read */
        for (int d = 0; d < D; d++) attn_store(dt, k, 3 * D + d, NAN), attn_store(dt, v, 4 * D + d, NAN);
        int64_t len = 3;
        attn_tensor tq = attn_tensor_4d(q, dt, 1, 1, L, D), tk = attn_tensor_4d(k, dt, 1, 1, L, D);
        attn_tensor tv = attn_tensor_4d(v, dt, 1, 1, L, D), to = attn_tensor_4d(o, dt, 1, 1, L, D);
        attn_tensor tl = attn_tensor_4d(&len, ATTN_I64, 1, 1, 1, 1);
        attn_tensor tlse = attn_tensor_4d(lse, ATTN_F32, 1, 1, L, 1);
        /* a window (0, 0) at bottom-right with kv_len 3: rows 0, 1 see keys -2, -1 (none),
         * rows 2..4 see keys 0..2 */
        attn_options opt = {.kv_len = &tl, .align = ATTN_ALIGN_BOTTOM_RIGHT, .has_window = true,
                            .window_left = 0, .window_right = 0, .lse = &tlse};
        for (int prec = 0; prec < 2; prec++) {
            opt.precision = (attn_precision)prec;
            memset(o, 0xFF, sizeof o);  // NaN patterns: every element must be written
            CHECK(attn_forward(&tq, &tk, &tv, &to, &opt) == ATTN_OK, "16-bit edge call failed: %s",
                  attn_last_error());
            bool zero_rows = true, finite = true;
            for (int d = 0; d < D; d++) {
                zero_rows &= o[0 * D + d] == 0 && o[1 * D + d] == 0;
                for (int i = 2; i < L; i++) finite &= isfinite(attn_load(dt, o, i * D + d));
            }
            CHECK(zero_rows && lse[0] == -INFINITY && lse[1] == -INFINITY,
                  "%s: fully masked rows must be exactly +0 with LSE -inf", attn_dtype_name(dt));
            CHECK(finite, "%s: NaN in keys beyond kv_len reached the output", attn_dtype_name(dt));
        }
        /* NaN in an unmasked query propagates to its row only */
        for (int d = 0; d < D; d++) attn_store(dt, k, 3 * D + d, 0.5f), attn_store(dt, v, 4 * D + d, 0.5f);
        attn_store(dt, q, 0, NAN);
        opt = (attn_options){0};
        CHECK(attn_forward(&tq, &tk, &tv, &to, &opt) == ATTN_OK, "call failed");
        CHECK(isnan(attn_load(dt, o, 0)) && !isnan(attn_load(dt, o, D)),
              "%s: NaN in q row 0 must reach row 0 only", attn_dtype_name(dt));
    }
    /* float32 values beyond float16's range become inf in a float16 output */
    float big_v[2 * D], qf[D] = {0}, kf[2 * D] = {0};
    for (int i = 0; i < 2 * D; i++) big_v[i] = 1e5f;
    attn_tensor tq = attn_tensor_4d(qf, ATTN_F32, 1, 1, 1, D), tk = attn_tensor_4d(kf, ATTN_F32, 1, 1, 2, D);
    attn_tensor tv = attn_tensor_4d(big_v, ATTN_F32, 1, 1, 2, D), to = attn_tensor_4d(o, ATTN_F16, 1, 1, 1, D);
    CHECK(attn_forward(&tq, &tk, &tv, &to, NULL) == ATTN_OK && o[0] == 0x7C00,
          "1e5 into a float16 output must be +inf, got 0x%04x", o[0]);
    (void)of;
}

int main(void) {
    printf("  kernel: %s\n", attn_kernel_name());
    test_conversions();
    test_accuracy();
    test_edges();
    return check_summary("half");
}
