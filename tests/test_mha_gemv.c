/*
 * test_mha_gemv.c — the decoding step's one-row bfloat16 products (mha_gemv.c and the
 *                   AVX2 loop kernels/avx2/gemv.c), bit for bit.
 *
 * What it covers:
 *  1. The AVX2 rows and dots loops (four rows per pass, vector and scalar tails) equal
 *     the portable loops' arithmetic (each product rounded, then added, in row order) bit
 *     for bit, on shapes with every tail (rows not a multiple of 4, columns not of 16
 *     or 8, ld > n); skipped with a printed reason where the CPU has no AVX2.
 *  2. mha_gemv_bf16_many (three products in one parallel region) equals mha_gemv_bf16
 *     on each alone, bit for bit, with beta 0 and 1.
 *  3. A Llama-shaped (scaled down) decoding step over bfloat16 weights, [in, out] and
 *     PyTorch's [out, in], gives the same y bits at 1, 2 and 3 threads (a reduction order independent of the team).
 *  4. The bitwise check rejects a planted difference (one ulp in one element).
 */
#include <omp.h>
#include <string.h>

#include "check.h"
#include "core/half.h"
#include "mha/mha.h"
#include "kernels/avx2/gemv.h"
#include "mha/mha_gemv.h"

static uint64_t g_seed = 12345;
static float rnd(void) {
    g_seed = g_seed * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(g_seed >> 40) / 8388608.0f - 1.0f;
}

static float bf(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* the portable loop's arithmetic, one element at a time */
static void rows_scalar(float *acc, const uint16_t *w, int64_t ld, int64_t r0, int64_t r1,
                        int64_t n, const float *a) {
    for (int64_t r = r0; r < r1; r++)
        for (int64_t j = 0; j < n; j++) {
            const float p = a[r] * bf(w[r * ld + j]);
            acc[j] = acc[j] + p;
        }
}

/* the portable dots loop's arithmetic: element j into lane j mod 8 (the tail's into
 * lanes 0 ..), the lanes combined ((0+4)+(1+5))+((2+6)+(3+7)) */
static float dot_scalar(const uint16_t *row, const float *a, int64_t n) {
    float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const int64_t body = n / 8 * 8;
    for (int64_t j = 0; j < body; j++) l[j % 8] = l[j % 8] + bf(row[j]) * a[j];
    for (int64_t j = body; j < n; j++) l[j - body] = l[j - body] + bf(row[j]) * a[j];
    return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

static bool same_bits(const float *x, const float *y, int64_t n, int64_t *at) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&x[i], &y[i], 4) != 0) {
            *at = i;
            return false;
        }
    return true;
}

static void test_avx2_rows(void) {
#if defined(__x86_64__) || defined(_M_X64)
    if (!__builtin_cpu_supports("avx2")) {
        printf("test_mha_gemv: the AVX2 rows loop skipped: no AVX2 on this CPU\n");
        return;
    }
    const int64_t shapes[][4] = {{0, 7, 37, 40}, {3, 130, 1024, 1030}, {0, 256, 4096, 4096},
                                 {5, 6, 9, 9},   {0, 64, 15, 16},     {1, 1, 1, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t r0 = shapes[s][0], r1 = shapes[s][1], n = shapes[s][2], ld = shapes[s][3];
        uint16_t *w = xcalloc(r1 * ld, 2);
        float *a = xcalloc(r1, 4), *x = xcalloc(n, 4), *y = xcalloc(n, 4);
        for (int64_t e = 0; e < r1 * ld; e++) w[e] = attn_f32_to_bf16(rnd());
        for (int64_t r = 0; r < r1; r++) a[r] = rnd();
        for (int64_t j = 0; j < n; j++) x[j] = y[j] = rnd();
        ai_gemv_rows_bf16_avx2(x, w, ld, r0, r1, n, a);
        rows_scalar(y, w, ld, r0, r1, n, a);
        int64_t at = -1;
        CHECK(same_bits(x, y, n, &at), "avx2 rows [%lld, %lld) x %lld (ld %lld): element %lld "
              "%.9g vs %.9g", (long long)r0, (long long)r1, (long long)n, (long long)ld,
              (long long)at, at >= 0 ? x[at] : 0.0, at >= 0 ? y[at] : 0.0);
        float *d = xcalloc(r1, 4), *e = xcalloc(r1, 4);
        ai_gemv_dots_bf16_avx2(d, w, ld, r0, r1, n, x);
        for (int64_t r = r0; r < r1; r++) e[r - r0] = dot_scalar(w + r * ld, x, n);
        CHECK(same_bits(d, e, r1 - r0, &at), "avx2 dots [%lld, %lld) x %lld (ld %lld): row "
              "%lld", (long long)r0, (long long)r1, (long long)n, (long long)ld, (long long)at);
        free(d), free(e);
        if (s == 0) {  /* 4. the check itself, on one planted ulp */
            uint32_t u;
            memcpy(&u, &y[n / 2], 4);
            u ^= 1;
            memcpy(&y[n / 2], &u, 4);
            CHECK(!same_bits(x, y, n, &at) && at == n / 2, "a planted ulp went unseen");
        }
        free(w), free(a), free(x), free(y);
    }
#else
    printf("test_mha_gemv: the AVX2 rows loop skipped: not an x86-64 build\n");
#endif
}

static void test_many(void) {
    const int64_t in = 512, outs[3] = {512, 128, 136};
    attn_tensor t[3];
    uint16_t *w[3];
    for (int k = 0; k < 3; k++) {
        w[k] = xcalloc(in * outs[k], 2);
        for (int64_t e = 0; e < in * outs[k]; e++) w[k][e] = attn_f32_to_bf16(rnd());
        t[k] = attn_tensor_4d(w[k], ATTN_BF16, in, outs[k], 1, 1);
    }
    float *a = xcalloc(in, 4);
    for (int64_t i = 0; i < in; i++) a[i] = rnd();
    for (int beta1 = 0; beta1 < 2; beta1++) {
        mha_ws count = {.count_only = true};
        for (int k = 0; k < 3; k++) (void)mha_weight_op(&t[k], 1, &count);
        char *base = xcalloc((int64_t)count.used, 1);
        mha_ws ws = {.base = base};
        mha_op op[3];
        const mha_op *ops[3];
        float *one[3], *many[3], beta[3];
        for (int k = 0; k < 3; k++) {
            op[k] = mha_weight_op(&t[k], 1, &ws), ops[k] = &op[k];
            one[k] = xcalloc(outs[k], 4), many[k] = xcalloc(outs[k], 4);
            for (int64_t j = 0; j < outs[k]; j++) one[k][j] = many[k][j] = rnd();
            beta[k] = beta1 ? 1.0f : 0.0f;
        }
        for (int k = 0; k < 3; k++)
            CHECK(mha_gemv_bf16(false, a, &op[k], beta[k], one[k]), "mha_gemv_bf16 refused");
        CHECK(mha_gemv_bf16_many(3, a, ops, beta, many), "mha_gemv_bf16_many refused");
        for (int k = 0; k < 3; k++) {
            int64_t at = -1;
            CHECK(same_bits(one[k], many[k], outs[k], &at), "many vs one, product %d beta %d: "
                  "element %lld", k, beta1, (long long)at);
            free(one[k]), free(many[k]);
        }
        free(base);
    }
    for (int k = 0; k < 3; k++) free(w[k]);
    free(a);
}

static void test_threads(bool torch) {
    const int64_t E = 512, Hq = 8, Hkv = 2, D = 64, Lc = 96;
    const int64_t in[4] = {E, E, E, Hq * D}, out[4] = {Hq * D, Hkv * D, Hkv * D, E};
    uint16_t *w[4];
    attn_tensor tw[4];
    for (int k = 0; k < 4; k++) {
        w[k] = xcalloc(in[k] * out[k], 2);
        for (int64_t e = 0; e < in[k] * out[k]; e++) w[k][e] = attn_f32_to_bf16(0.05f * rnd());
        tw[k] = attn_tensor_4d(w[k], ATTN_BF16, in[k], out[k], 1, 1);
        if (torch)  /* PyTorch's [out, in] storage: the dots loop */
            tw[k].stride[0] = 1, tw[k].stride[1] = in[k];
    }
    float *x = xcalloc(E, 4), *y[3];
    for (int64_t i = 0; i < E; i++) x[i] = rnd();
    const int64_t nc = Hkv * Lc * D;
    uint16_t *kc0 = xcalloc(nc, 2), *vc0 = xcalloc(nc, 2), *kc = xcalloc(nc, 2), *vc = xcalloc(nc, 2);
    for (int64_t e = 0; e < nc; e++) kc0[e] = attn_f32_to_bf16(rnd()), vc0[e] = attn_f32_to_bf16(rnd());
    attn_mha m = {.Hq = Hq, .Hkv = Hkv, .w_q = &tw[0], .w_k = &tw[1], .w_v = &tw[2],
                  .w_o = &tw[3], .rope = {.kind = ATTN_ROPE_HALF}};
    attn_tensor tx = attn_tensor_4d(x, ATTN_F32, 1, 1, E, 1);
    const int saved = omp_get_max_threads();
    for (int nt = 1; nt <= 3; nt++) {
        y[nt - 1] = xcalloc(E, 4);
        memcpy(kc, kc0, (size_t)nc * 2), memcpy(vc, vc0, (size_t)nc * 2);
        int64_t len[1] = {Lc - 1};
        attn_kv_cache c = {.kind = ATTN_CACHE_CONTIGUOUS,
                           .k = attn_tensor_4d(kc, ATTN_BF16, 1, Hkv, Lc, D),
                           .v = attn_tensor_4d(vc, ATTN_BF16, 1, Hkv, Lc, D), .len = len};
        attn_tensor ty = attn_tensor_4d(y[nt - 1], ATTN_F32, 1, 1, E, 1);
        omp_set_num_threads(nt);
        const attn_status st = attn_mha_decode(&m, &tx, &c, &ty, NULL);
        CHECK(st == ATTN_OK, "decode at %d threads: %s", nt, attn_last_error());
        CHECK(len[0] == Lc, "len not advanced");
    }
    omp_set_num_threads(saved);
    double norm = 0;
    for (int64_t i = 0; i < E; i++) norm += (double)y[0][i] * y[0][i];
    CHECK(norm > 0 && isfinite(norm), "y is all zero or not finite: %g", norm);
    for (int nt = 2; nt <= 3; nt++) {
        int64_t at = -1;
        CHECK(same_bits(y[0], y[nt - 1], E, &at), "y at %d threads differs from 1 thread at "
              "element %lld (%s weights)", nt, (long long)at, torch ? "[out, in]" : "[in, out]");
    }
    for (int k = 0; k < 4; k++) free(w[k]);
    for (int k = 0; k < 3; k++) free(y[k]);
    free(x), free(kc0), free(vc0), free(kc), free(vc);
}

int main(void) {
    test_avx2_rows();
    test_many();
    test_threads(false);
    test_threads(true);
    return check_summary("test_mha_gemv");
}
