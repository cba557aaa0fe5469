/*
 * test_u4.c — the u4 cache dtype (ATTN_U4, KIVI's / OpenVINO's scheme): 4-bit codes,
 *             keys per channel over groups of G keys, values per token over runs of 32
 *             channels, scales and zeros outside the data (attn.h, docs/CONTRACT.md
 *             "The u4 cache (KIVI)").
 *
 * 1. Blocks written by hand: attn_quantize_u4_keys / _values write exactly the literal
 *    bytes, scales and zeros (codes 0 and 15, ties to even, a last partial key group, a
 *    constant run: scale 1, codes 0), attn_dequantize_u4_* gives the exact values back,
 *    and a forward over the hand cache reads them.
 * 2. attn_forward over u4 K and V (fused) against the tests' float64 oracle over the
 *    dequantized cache, at the contract's float32 tolerance: Lk not a multiple of G,
 *    G = 1, 16, 32, 64, GQA, causal (both alignments), Dk != Dv, decoding rows; the
 *    reference path over u4 is the reference over the dequantized float32 cache bit for
 *    bit; the dequantization is fmaf(code, scale, zero) recomputed here from the bytes.
 *    The same check must fail on a cache with one nibble changed and against the oracle
 *    of the UNquantized values (the tolerance sees both).
 * 3. Misuse refused with nothing written: scales 0, negative, NaN, inf, a NaN zero, a
 *    missing zero, wrong shapes, kv_group < 0, zeros with a float cache, k u4 and v not,
 *    a paged cache, varlen, the backward, key_scores, attn_weights_grid, attn_kv_append,
 *    float64; the quantizers on NaN or infinite input, bad shapes, dtypes and groups.
 * 4. Outliers (KIVI's point): keys with a few channels 20 times the others; the u4
 *    per-channel error against the float keys is below q4_0's on the same keys (both
 *    printed).
 * 5. A float residual (the last keys a server has not quantized yet): forward over the
 *    u4 part with its LSE, over the float part with its LSE, attn_merge; against the
 *    oracle over the concatenated keys.
 * Run once per kernel (ATTN_ISA); no kernel's decoding step reads u4, every one takes the
 * tile path.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "oracle.h"

/* ---- helpers --------------------------------------------------------------------------- */

/* the code of element d of a u4 row (OpenVINO order: even elements in the low nibble) */
static int code_at(const uint8_t *row, int64_t d) {
    return d % 2 == 0 ? row[d / 2] & 0x0F : row[d / 2] >> 4;
}

static int64_t cdiv(int64_t a, int64_t b) { return a == 0 ? 0 : (a - 1) / b + 1; }

/* a dense u4 cache of shape n (its bytes: n / 2), its float32 dequantization, and the
 * scale and zero tensors (keys: [B, H, ceil(L / G), D]; values: [B, H, L, D / 32]) */
typedef struct u4set {
    int64_t n[4], G;
    bool keys;
    uint8_t *bytes;
    float *sc, *ze, *deq;
    attn_tensor u, ts, tz, td;
} u4set;

static void u4set_make(u4set *s, const int64_t n[4], bool keys, int64_t G) {
    memset(s, 0, sizeof *s);
    memcpy(s->n, n, sizeof s->n);
    s->keys = keys, s->G = G;
    const int64_t e = n[0] * n[1] * n[2] * n[3];
    const int64_t s2 = keys ? cdiv(n[2], G ? G : 32) : n[2], s3 = keys ? n[3] : n[3] / 32;
    s->bytes = xcalloc(e / 2, 1);
    s->sc = xcalloc(n[0] * n[1] * s2 * s3, sizeof(float));
    s->ze = xcalloc(n[0] * n[1] * s2 * s3, sizeof(float));
    s->deq = xcalloc(e, sizeof(float));
    s->u = attn_tensor_4d(s->bytes, ATTN_U4, n[0], n[1], n[2], n[3]);
    s->ts = attn_tensor_4d(s->sc, ATTN_F32, n[0], n[1], s2, s3);
    s->tz = attn_tensor_4d(s->ze, ATTN_F32, n[0], n[1], s2, s3);
    s->td = attn_tensor_4d(s->deq, ATTN_F32, n[0], n[1], n[2], n[3]);
}

static void u4set_free(u4set *s) { free(s->bytes), free(s->sc), free(s->ze), free(s->deq); }

/* quantize src into s, then dequantize into s->deq; 0 on success */
static int u4set_fill(u4set *s, const attn_tensor *src) {
    attn_status st = s->keys ? attn_quantize_u4_keys(src, &s->u, &s->ts, &s->tz, s->G)
                             : attn_quantize_u4_values(src, &s->u, &s->ts, &s->tz);
    if (st != ATTN_OK) return 1;
    st = s->keys ? attn_dequantize_u4_keys(&s->u, &s->td, &s->ts, &s->tz, s->G)
                 : attn_dequantize_u4_values(&s->u, &s->td, &s->ts, &s->tz);
    return st != ATTN_OK;
}

/* elements of s->deq that are not fmaf(code, scale, zero) recomputed from the bytes */
static int64_t u4set_recheck(const u4set *s) {
    const int64_t G = s->G ? s->G : 32, D = s->n[3];
    int64_t bad = 0;
    for (int64_t b = 0; b < s->n[0]; b++)
        for (int64_t h = 0; h < s->n[1]; h++)
            for (int64_t l = 0; l < s->n[2]; l++) {
                const int64_t row = (b * s->n[1] + h) * s->n[2] + l;
                for (int64_t d = 0; d < D; d++) {
                    const int64_t r = s->keys ? l / G : l, c = s->keys ? d : d / 32;
                    const float sc = *view_ptr(&s->ts, b, h, r, c), ze = *view_ptr(&s->tz, b, h, r, c);
                    const float want = fmaf((float)code_at(s->bytes + row * D / 2, d), sc, ze);
                    bad += memcmp(&want, &s->deq[row * D + d], 4) != 0;
                }
            }
    return bad;
}

static void fill_normal(float *x, int64_t n, rng_t *r, double sd) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)(sd * rng_normal(r));
}

/* ---- 1. blocks written by hand --------------------------------------------------------- */

/* codes 7 i mod 16 for i = 0..31: 0, 7, 14, 5, 12, 3, 10, 1, 8, 15, 6, 13, 4, 11, 2, 9, twice;
 * the bytes, low nibble first */
static const uint8_t PATTERN[16] = {0x70, 0x5E, 0x3C, 0x1A, 0xF8, 0xD6, 0xB4, 0x92,
                                    0x70, 0x5E, 0x3C, 0x1A, 0xF8, 0xD6, 0xB4, 0x92};

static void test_hand_blocks(void) {
    /* values, per token: row 0 is -1 + 0.25 c_i (min -1, max 2.75: scale 3.75 / 15 =
     * 0.25, zero -1, exact); row 1 is all 3.5 (scale 1, zero 3.5, codes 0) */
    float x[2][32];
    for (int i = 0; i < 32; i++) x[0][i] = -1.0f + 0.25f * (float)(7 * i % 16), x[1][i] = 3.5f;
    u4set s;
    u4set_make(&s, (const int64_t[4]){1, 1, 2, 32}, false, 0);
    memset(s.bytes, 0xA5, 32);
    const attn_tensor src = attn_tensor_4d(x, ATTN_F32, 1, 1, 2, 32);
    CHECK(u4set_fill(&s, &src) == 0, "hand values: %s", attn_last_error());
    static const uint8_t zeros[16] = {0};
    CHECK(memcmp(s.bytes, PATTERN, 16) == 0 && memcmp(s.bytes + 16, zeros, 16) == 0,
          "hand values: the bytes are not the ones written by hand (first 0x%02x 0x%02x)",
          s.bytes[0], s.bytes[1]);
    CHECK(s.sc[0] == 0.25f && s.ze[0] == -1.0f && s.sc[1] == 1.0f && s.ze[1] == 3.5f,
          "hand values: scale, zero %g %g and %g %g, expected 0.25 -1 and 1 3.5", s.sc[0],
          s.ze[0], s.sc[1], s.ze[1]);
    CHECK(memcmp(s.deq, x, sizeof x) == 0, "hand values: the dequantized values are not exact");
    u4set_free(&s);

    /* keys, per channel over a group of G = 4 holding 3 keys (a partial group): key 0 is
     * zero_d = d - 8, key 1 zero_d + 7.5 (scale 0.5, codes 0 and 15), key 2 zero_d +
     * 0.5 c_d, except channels 0 and 1: zero + 1.25 and zero + 1.75, the ties 2.5 and 3.5
     * (to the even codes 2 and 4) */
    float k[3][32];
    for (int d = 0; d < 32; d++) {
        k[0][d] = (float)(d - 8);
        k[1][d] = (float)(d - 8) + 7.5f;
        k[2][d] = (float)(d - 8) + 0.5f * (float)(7 * d % 16);
    }
    k[2][0] = -8.0f + 1.25f, k[2][1] = -7.0f + 1.75f;
    static const uint8_t want_k[48] = {
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
        0x42, 0x5E, 0x3C, 0x1A, 0xF8, 0xD6, 0xB4, 0x92, 0x70, 0x5E, 0x3C, 0x1A, 0xF8, 0xD6, 0xB4, 0x92};
    u4set t;
    u4set_make(&t, (const int64_t[4]){1, 1, 3, 32}, true, 4);
    const attn_tensor ksrc = attn_tensor_4d(k, ATTN_F32, 1, 1, 3, 32);
    CHECK(u4set_fill(&t, &ksrc) == 0, "hand keys: %s", attn_last_error());
    CHECK(memcmp(t.bytes, want_k, 48) == 0, "hand keys: the bytes are not the ones written by "
          "hand (key 2: 0x%02x 0x%02x)", t.bytes[32], t.bytes[33]);
    int bad = 0;
    for (int d = 0; d < 32; d++) bad += t.sc[d] != 0.5f || t.ze[d] != (float)(d - 8);
    CHECK(bad == 0, "hand keys: %d channels' scale or zero not 0.5 and d - 8", bad);
    bad = 0;
    for (int d = 0; d < 32; d++)
        for (int j = 0; j < 3; j++) {
            const float want = j == 2 && d < 2 ? (float)(d - 8) + (d == 0 ? 1.0f : 2.0f) : k[j][d];
            bad += t.deq[j * 32 + d] != want;
        }
    CHECK(bad == 0, "hand keys: %d dequantized values not the exact ones", bad);

    /* the forward over the hand cache: one query, V = the keys' cache read as values
     * (scale 1, zero 0: the codes themselves) */
    u4set v;
    u4set_make(&v, (const int64_t[4]){1, 1, 3, 32}, false, 0);
    memcpy(v.bytes, want_k, 48);
    for (int j = 0; j < 3; j++) v.sc[j] = 1.0f, v.ze[j] = 0.0f;
    float q[32], o[32];
    for (int d = 0; d < 32; d++) q[d] = 0.01f * (float)(d % 5);
    const attn_tensor tq = attn_tensor_4d(q, ATTN_F32, 1, 1, 1, 32), to = attn_tensor_4d(o, ATTN_F32, 1, 1, 1, 32);
    attn_options opt = {.k_scale = &t.ts, .k_zero = &t.tz, .v_scale = &v.ts, .v_zero = &v.tz,
                        .kv_group = 4};
    CHECK(attn_forward(&tq, &t.u, &v.u, &to, &opt) == ATTN_OK, "hand forward: %s", attn_last_error());
    /* the oracle over the exact values */
    float vd[3][32];
    for (int j = 0; j < 3; j++)
        for (int d = 0; d < 32; d++) vd[j][d] = (float)code_at(want_k + 16 * j, d);
    const attn_tensor tk = attn_tensor_4d(t.deq, ATTN_F32, 1, 1, 3, 32), tv = attn_tensor_4d(vd, ATTN_F32, 1, 1, 3, 32);
    double ref[32];
    oracle_forward(&tq, &tk, &tv, NULL, ref, NULL, NULL);
    CHECK(within_f32_tol(o, ref, 32, NULL), "hand forward: off the oracle over the exact values");
    u4set_free(&t), u4set_free(&v);
}

/* ---- 2. the forward against the oracle ------------------------------------------------- */

typedef struct fcase_u4 {
    int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv, G;
    bool causal, bottom_right;
} fcase_u4;

static int64_t g_tried;

static void run_forward_case(const fcase_u4 *c, uint64_t seed) {
    char what[160];
    snprintf(what, sizeof what, "B %lld Hq %lld Hkv %lld Lq %lld Lk %lld Dk %lld Dv %lld G %lld%s%s",
             (long long)c->B, (long long)c->Hq, (long long)c->Hkv, (long long)c->Lq,
             (long long)c->Lk, (long long)c->Dk, (long long)c->Dv, (long long)c->G,
             c->causal ? " causal" : "", c->bottom_right ? " bottom-right" : "");
    rng_t r = {seed};
    const int64_t nq = c->B * c->Hq * c->Lq * c->Dk, no = c->B * c->Hq * c->Lq * c->Dv;
    const int64_t nk = c->B * c->Hkv * c->Lk * c->Dk, nv = c->B * c->Hkv * c->Lk * c->Dv;
    float *q = xcalloc(nq, 4), *kf = xcalloc(nk, 4), *vf = xcalloc(nv, 4), *o = xcalloc(no, 4);
    float *o2 = xcalloc(no, 4);
    double *ref = xcalloc(no, 8), *ref_true = xcalloc(no, 8);
    fill_normal(q, nq, &r, 1.0), fill_normal(kf, nk, &r, 1.0), fill_normal(vf, nv, &r, 1.0);
    const attn_tensor tq = attn_tensor_4d(q, ATTN_F32, c->B, c->Hq, c->Lq, c->Dk);
    const attn_tensor to = attn_tensor_4d(o, ATTN_F32, c->B, c->Hq, c->Lq, c->Dv);
    const attn_tensor to2 = attn_tensor_4d(o2, ATTN_F32, c->B, c->Hq, c->Lq, c->Dv);
    const attn_tensor tkf = attn_tensor_4d(kf, ATTN_F32, c->B, c->Hkv, c->Lk, c->Dk);
    const attn_tensor tvf = attn_tensor_4d(vf, ATTN_F32, c->B, c->Hkv, c->Lk, c->Dv);
    u4set ks, vs;
    u4set_make(&ks, tkf.shape, true, c->G);
    u4set_make(&vs, tvf.shape, false, 0);
    CHECK(u4set_fill(&ks, &tkf) == 0 && u4set_fill(&vs, &tvf) == 0, "%s: quantize: %s", what,
          attn_last_error());
    CHECK(u4set_recheck(&ks) == 0 && u4set_recheck(&vs) == 0, "%s: the dequantization is not "
          "fmaf(code, scale, zero) of the bytes", what);
    attn_options opt = {.causal = c->causal,
                        .align = c->bottom_right ? ATTN_ALIGN_BOTTOM_RIGHT : ATTN_ALIGN_TOP_LEFT,
                        .k_scale = &ks.ts, .k_zero = &ks.tz, .v_scale = &vs.ts, .v_zero = &vs.tz,
                        .kv_group = c->G};
    attn_options fopt = {.causal = c->causal, .align = opt.align};
    oracle_forward(&tq, &ks.td, &vs.td, &fopt, ref, NULL, NULL);
    oracle_forward(&tq, &tkf, &tvf, &fopt, ref_true, NULL, NULL);

    attn_status st = attn_forward(&tq, &ks.u, &vs.u, &to, &opt);
    tol_result tr = {0};
    CHECK(st == ATTN_OK && within_f32_tol(o, ref, no, &tr), "%s: fused: %s, max err %.3g", what,
          st == ATTN_OK ? "off the oracle" : attn_last_error(), tr.max_err);
    opt.threads = 2;
    st = attn_forward(&tq, &ks.u, &vs.u, &to2, &opt);
    CHECK(st == ATTN_OK && memcmp(o, o2, (size_t)no * 4) == 0, "%s: 2 threads differ", what);
    opt.threads = 0;

    /* the reference path over u4 is the reference over the dequantized float32 cache */
    opt.path = fopt.path = ATTN_PATH_REFERENCE;
    st = attn_forward(&tq, &ks.u, &vs.u, &to, &opt);
    const attn_status st2 = attn_forward(&tq, &ks.td, &vs.td, &to2, &fopt);
    CHECK(st == ATTN_OK && st2 == ATTN_OK && memcmp(o, o2, (size_t)no * 4) == 0,
          "%s: the reference over u4 is not the reference over its values bit for bit (%s)",
          what, attn_last_error());
    opt.path = ATTN_PATH_FUSED;

    /* the tolerance sees the quantization (the oracle of the UNquantized values) and one
     * changed nibble (key 0's first value code: every row attends key 0) */
    CHECK(attn_forward(&tq, &ks.u, &vs.u, &to, &opt) == ATTN_OK && !within_f32_tol(o, ref_true, no, NULL),
          "%s: within the tolerance of the UNquantized values' oracle", what);
    vs.bytes[0] ^= 0x08;
    CHECK(attn_forward(&tq, &ks.u, &vs.u, &to, &opt) == ATTN_OK && !within_f32_tol(o, ref, no, NULL),
          "%s: one V code changed and the output still within the tolerance", what);
    vs.bytes[0] ^= 0x08;
    ks.bytes[0] ^= 0x80;
    CHECK(attn_forward(&tq, &ks.u, &vs.u, &to, &opt) == ATTN_OK && !within_f32_tol(o, ref, no, NULL),
          "%s: one K code changed and the output still within the tolerance", what);
    g_tried++;
    u4set_free(&ks), u4set_free(&vs);
    free(q), free(kf), free(vf), free(o), free(o2), free(ref), free(ref_true);
}

static void test_forward_cases(void) {
    static const fcase_u4 cases[] = {
        {1, 2, 2, 5, 37, 32, 64, 32, false, false},   // Lk not a multiple of G, Dk != Dv
        {2, 4, 2, 7, 70, 64, 32, 64, true, false},    // GQA, causal, G = 64
        {1, 4, 1, 1, 45, 32, 32, 1, false, false},    // decoding, a GQA group, G = 1
        {1, 8, 2, 4, 100, 32, 32, 16, true, true},    // decoding rows, bottom-right causal
        {1, 2, 1, 3, 100, 96, 64, 0, true, true},     // G = 0 (32), Dk = 96
        {1, 1, 1, 64, 129, 32, 32, 32, true, false},  // one past a tile of keys
        {2, 2, 2, 33, 300, 128, 128, 128, false, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_forward_case(&cases[i], 1000 + i);
    printf("forward: %lld cases against the oracle\n", (long long)g_tried);
}

/* ---- 3. refusals ----------------------------------------------------------------------- */

static void test_refusals(void) {
    enum { B = 1, H = 2, L = 40, D = 32, G = 16 };
    rng_t r = {77};
    float q[B * H * 2 * D], kf[B * H * L * D], vf[B * H * L * D], o[B * H * 2 * D];
    fill_normal(q, B * H * 2 * D, &r, 1.0), fill_normal(kf, B * H * L * D, &r, 1.0);
    fill_normal(vf, B * H * L * D, &r, 1.0);
    const attn_tensor tq = attn_tensor_4d(q, ATTN_F32, B, H, 2, D), to = attn_tensor_4d(o, ATTN_F32, B, H, 2, D);
    const attn_tensor tkf = attn_tensor_4d(kf, ATTN_F32, B, H, L, D), tvf = attn_tensor_4d(vf, ATTN_F32, B, H, L, D);
    u4set ks, vs;
    u4set_make(&ks, tkf.shape, true, G);
    u4set_make(&vs, tvf.shape, false, 0);
    CHECK(u4set_fill(&ks, &tkf) == 0 && u4set_fill(&vs, &tvf) == 0, "refusals: quantize: %s", attn_last_error());
    const attn_options good = {.k_scale = &ks.ts, .k_zero = &ks.tz, .v_scale = &vs.ts,
                               .v_zero = &vs.tz, .kv_group = G};
    fill_sentinel(o, B * H * 2 * D);
    CHECK(attn_forward(&tq, &ks.u, &vs.u, &to, &good) == ATTN_OK, "refusals: the good call: %s", attn_last_error());
    {  /* any strides: the key scales and zeros stored channel-major, the same answer; and
        * the workspace query (no data read) */
        enum { NG = (L + G - 1) / G };
        float sct[B * H * D * NG], zet[B * H * D * NG], o2[B * H * 2 * D];
        attn_tensor tst = {sct, ATTN_F32, {B, H, NG, D}, {H * D * NG, D * NG, 1, NG}}, tzt = tst;
        tzt.data = zet;
        for (int64_t h = 0; h < H; h++)
            for (int64_t r0 = 0; r0 < NG; r0++)
                for (int64_t d = 0; d < D; d++) {
                    *view_ptr(&tst, 0, h, r0, d) = *view_ptr(&ks.ts, 0, h, r0, d);
                    *view_ptr(&tzt, 0, h, r0, d) = *view_ptr(&ks.tz, 0, h, r0, d);
                }
        attn_options ot = good;
        ot.k_scale = &tst, ot.k_zero = &tzt;
        const attn_tensor to2 = attn_tensor_4d(o2, ATTN_F32, B, H, 2, D);
        CHECK(attn_forward(&tq, &ks.u, &vs.u, &to2, &ot) == ATTN_OK && memcmp(o, o2, sizeof o2) == 0,
              "strided scales: another answer (%s)", attn_last_error());
        size_t bytes = 0;
        attn_tensor nq = tq, nk = ks.u, nv = vs.u, no = to;
        nq.data = nk.data = nv.data = no.data = NULL;
        attn_tensor s1 = ks.ts, s2 = ks.tz, s3 = vs.ts, s4 = vs.tz;
        s1.data = s2.data = s3.data = s4.data = NULL;
        ot = good;
        ot.k_scale = &s1, ot.k_zero = &s2, ot.v_scale = &s3, ot.v_zero = &s4;
        CHECK(attn_forward_workspace_size(&nq, &nk, &nv, &no, &ot, &bytes) == ATTN_OK,
              "workspace query over u4: %s", attn_last_error());
    }

#define REFUSED(want, opt, what)                                                              \
    do {                                                                                      \
        fill_sentinel(o, B * H * 2 * D);                                                      \
        const attn_status st_ = attn_forward(&tq, &ks.u, &vs.u, &to, opt);                    \
        CHECK(st_ == (want) && count_written(o, B * H * 2 * D) == 0, "%s: status %s (%s), "   \
              "expected %s, %lld written", what, attn_status_string(st_), attn_last_error(),   \
              attn_status_string(want), (long long)count_written(o, B * H * 2 * D));          \
    } while (0)

    /* bad values in each of the four tensors */
    static const float bad_scales[] = {0.0f, -0.0f, -1.0f, NAN, INFINITY};
    for (size_t i = 0; i < sizeof bad_scales / sizeof *bad_scales; i++) {
        const float keep = ks.sc[5];
        ks.sc[5] = bad_scales[i];
        REFUSED(ATTN_ERR_VALUE, &good, "k_scale bad");
        ks.sc[5] = keep;
        const float keep_v = vs.sc[7];
        vs.sc[7] = bad_scales[i];
        REFUSED(ATTN_ERR_VALUE, &good, "v_scale bad");
        vs.sc[7] = keep_v;
    }
    static const float bad_zeros[] = {NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof bad_zeros / sizeof *bad_zeros; i++) {
        const float keep = ks.ze[3];
        ks.ze[3] = bad_zeros[i];
        REFUSED(ATTN_ERR_VALUE, &good, "k_zero bad");
        ks.ze[3] = keep;
        const float keep_v = vs.ze[9];
        vs.ze[9] = bad_zeros[i];
        REFUSED(ATTN_ERR_VALUE, &good, "v_zero bad");
        vs.ze[9] = keep_v;
    }
    /* missing ones, wrong shapes and dtypes, kv_group */
    attn_options o1 = good;
    o1.k_zero = NULL;
    REFUSED(ATTN_ERR_NULL, &o1, "k_zero missing");
    o1 = good, o1.v_scale = NULL;
    REFUSED(ATTN_ERR_NULL, &o1, "v_scale missing");
    o1 = good, o1.kv_group = 8;  // the scales are of G = 16: 3 groups, not 5
    REFUSED(ATTN_ERR_SHAPE, &o1, "kv_group not the scales'");
    o1 = good, o1.kv_group = -1;
    REFUSED(ATTN_ERR_VALUE, &o1, "kv_group < 0");
    attn_tensor wrong = vs.ts;
    wrong.shape[3] = 2;
    o1 = good, o1.v_scale = &wrong;
    REFUSED(ATTN_ERR_SHAPE, &o1, "v_scale of the wrong shape");
    wrong = ks.tz;
    wrong.dtype = ATTN_F16;
    o1 = good, o1.k_zero = &wrong;
    REFUSED(ATTN_ERR_DTYPE, &o1, "k_zero float16");

    /* the u4 options with another cache, and k u4 with v not */
    {
        attn_options f = {.k_zero = &ks.tz};
        fill_sentinel(o, B * H * 2 * D);
        attn_status st = attn_forward(&tq, &tkf, &tvf, &to, &f);
        CHECK(st == ATTN_ERR_VALUE && count_written(o, B * H * 2 * D) == 0, "k_zero with a float cache: %s",
              attn_status_string(st));
        f = (attn_options){.kv_group = 32};
        st = attn_forward(&tq, &tkf, &tvf, &to, &f);
        CHECK(st == ATTN_ERR_VALUE && count_written(o, B * H * 2 * D) == 0, "kv_group with a float cache: %s",
              attn_status_string(st));
        st = attn_forward(&tq, &ks.u, &tvf, &to, &good);
        CHECK(st == ATTN_ERR_DTYPE && count_written(o, B * H * 2 * D) == 0, "k u4, v float32: %s",
              attn_status_string(st));
    }
    /* a paged cache */
    {
        int32_t bt[2] = {0, 1};
        const attn_tensor tbt = attn_tensor_4d(bt, ATTN_I32, 1, 2, 1, 1);
        attn_tensor kp = attn_tensor_4d(ks.bytes, ATTN_U4, 2, H, L / 2, D);
        attn_tensor vp = attn_tensor_4d(vs.bytes, ATTN_U4, 2, H, L / 2, D);
        o1 = good, o1.block_table = &tbt;
        fill_sentinel(o, B * H * 2 * D);
        const attn_status st = attn_forward(&tq, &kp, &vp, &to, &o1);
        CHECK(st == ATTN_ERR_UNSUPPORTED && count_written(o, B * H * 2 * D) == 0, "paged u4: %s (%s)",
              attn_status_string(st), attn_last_error());
    }
    /* varlen: the packed call */
    {
        int32_t cq[2] = {0, 2}, ck[2] = {0, L};
        const attn_tensor tcq = attn_tensor_4d(cq, ATTN_I32, 2, 1, 1, 1), tck = attn_tensor_4d(ck, ATTN_I32, 2, 1, 1, 1);
        fill_sentinel(o, B * H * 2 * D);
        const attn_status st = attn_varlen_forward(&tq, &ks.u, &vs.u, &to, &tcq, &tck, 2, L, &good);
        CHECK(st == ATTN_ERR_UNSUPPORTED && count_written(o, B * H * 2 * D) == 0, "varlen u4: %s",
              attn_status_string(st));
    }
    /* the backward (forward-only cache dtypes: ATTN_ERR_DTYPE, as q8_0, q4_0 and fp8) */
    {
        float lse[B * H * 2], dq[B * H * 2 * D], dk[B * H * L * D], dv[B * H * L * D];
        const attn_tensor tl = attn_tensor_4d(lse, ATTN_F32, B, H, 2, 1);
        const attn_tensor tdq = attn_tensor_4d(dq, ATTN_F32, B, H, 2, D);
        const attn_tensor tdk = attn_tensor_4d(dk, ATTN_F32, B, H, L, D), tdv = attn_tensor_4d(dv, ATTN_F32, B, H, L, D);
        for (int i = 0; i < B * H * 2; i++) lse[i] = 1.0f;
        fill_sentinel(dq, B * H * 2 * D), fill_sentinel(dk, B * H * L * D), fill_sentinel(dv, B * H * L * D);
        const attn_status st = attn_backward(&tq, &ks.u, &vs.u, &tq, &tq, &tl, &tdq, &tdk, &tdv, &good);
        CHECK(st == ATTN_ERR_DTYPE && count_written(dq, B * H * 2 * D) == 0 &&
              count_written(dk, B * H * L * D) == 0 && count_written(dv, B * H * L * D) == 0,
              "backward u4: %s", attn_status_string(st));
    }
    /* key_scores and attn_weights_grid */
    {
        float sc[B * H * L];
        const attn_tensor ts = attn_tensor_4d(sc, ATTN_F32, B, H, L, 1);
        o1 = good, o1.key_scores = &ts;
        fill_sentinel(sc, B * H * L);
        REFUSED(ATTN_ERR_UNSUPPORTED, &o1, "key_scores u4");
        CHECK(count_written(sc, B * H * L) == 0, "key_scores u4: scores written");
        float lse[B * H * 2], grid[B * H * 2 * 2];
        for (int i = 0; i < B * H * 2; i++) lse[i] = 1.0f;
        const attn_tensor tl = attn_tensor_4d(lse, ATTN_F32, B, H, 2, 1), tg = attn_tensor_4d(grid, ATTN_F32, B, H, 2, 2);
        fill_sentinel(grid, B * H * 4);
        const attn_status st = attn_weights_grid(&tq, &ks.u, &tl, &tg, ATTN_REDUCE_SUM, &good);
        CHECK(st == ATTN_ERR_UNSUPPORTED && count_written(grid, B * H * 4) == 0, "weights_grid u4: %s",
              attn_status_string(st));
    }
    /* float64 calls */
    {
        double q64[B * H * 2 * D] = {0}, o64[B * H * 2 * D];
        memset(o64, 0x5A, sizeof o64);
        const attn_tensor tq64 = attn_tensor_4d(q64, ATTN_F64, B, H, 2, D), to64 = attn_tensor_4d(o64, ATTN_F64, B, H, 2, D);
        const attn_status st = attn_forward(&tq64, &ks.u, &vs.u, &to64, &good);
        const uint8_t *ob = (const uint8_t *)o64;
        int written = 0;
        for (size_t i = 0; i < sizeof o64; i++) written += ob[i] != 0x5A;
        CHECK(st == ATTN_ERR_DTYPE && written == 0, "float64 q over u4: %s", attn_status_string(st));
    }
    /* attn_kv_append into a u4 cache */
    {
        float kn[B * H * 1 * D] = {0};
        const attn_tensor tkn = attn_tensor_4d(kn, ATTN_F32, B, H, 1, D);
        int64_t len = 3;
        const attn_tensor tlen = attn_tensor_4d(&len, ATTN_I64, 1, 1, 1, 1);
        uint8_t before[B * H * L * D / 2];
        memcpy(before, ks.bytes, sizeof before);
        const attn_status st = attn_kv_append(&tkn, &tkn, &ks.u, &vs.u, NULL, NULL, &tlen);
        CHECK(st == ATTN_ERR_UNSUPPORTED && memcmp(before, ks.bytes, sizeof before) == 0,
              "kv_append into u4: %s", attn_status_string(st));
    }

    /* the quantizers: NaN and inf refused with nothing written, bad shapes and groups */
    {
        u4set t;
        u4set_make(&t, tkf.shape, true, G);
        const int64_t nsc = B * H * cdiv(L, G) * D;
        static const float bad_in[] = {NAN, INFINITY, -INFINITY};
        for (size_t i = 0; i < 3; i++) {
            for (int keys = 0; keys < 2; keys++) {
                u4set *s = keys ? &t : &vs;
                const int64_t ns = keys ? nsc : B * H * L;
                memset(s->bytes, 0x3C, B * H * L * D / 2);
                fill_sentinel(s->sc, ns), fill_sentinel(s->ze, ns);
                const float keep = kf[B * H * L * D - 5];
                kf[B * H * L * D - 5] = bad_in[i];
                const attn_status st = keys ? attn_quantize_u4_keys(&tkf, &s->u, &s->ts, &s->tz, G)
                                            : attn_quantize_u4_values(&tkf, &s->u, &s->ts, &s->tz);
                kf[B * H * L * D - 5] = keep;
                int bytes_written = 0;
                for (int64_t b = 0; b < B * H * L * D / 2; b++) bytes_written += s->bytes[b] != 0x3C;
                CHECK(st == ATTN_ERR_VALUE && bytes_written == 0 && count_written(s->sc, ns) == 0 &&
                          count_written(s->ze, ns) == 0,
                      "quantize %s with %g: %s, %d bytes written", keys ? "keys" : "values",
                      (double)bad_in[i], attn_status_string(st), bytes_written);
            }
        }
        /* a range max - min beyond float32 */
        float big[32];
        for (int i = 0; i < 32; i++) big[i] = i % 2 ? 3e38f : -3e38f;
        const attn_tensor tb = attn_tensor_4d(big, ATTN_F32, 1, 1, 1, 32);
        uint8_t bb[16];
        float bs, bz;
        const attn_tensor tbu = attn_tensor_4d(bb, ATTN_U4, 1, 1, 1, 32);
        const attn_tensor tbs = attn_tensor_4d(&bs, ATTN_F32, 1, 1, 1, 1), tbz = attn_tensor_4d(&bz, ATTN_F32, 1, 1, 1, 1);
        CHECK(attn_quantize_u4_values(&tb, &tbu, &tbs, &tbz) == ATTN_ERR_VALUE, "a range beyond float32 quantized");
        /* shapes, dtypes, groups */
        attn_tensor bad = t.ts;
        bad.shape[2] = 2;
        CHECK(attn_quantize_u4_keys(&tkf, &t.u, &bad, &t.tz, G) == ATTN_ERR_SHAPE, "keys: scale of the wrong shape taken");
        CHECK(attn_quantize_u4_keys(&tkf, &t.u, &t.ts, &t.tz, -2) == ATTN_ERR_VALUE, "keys: group -2 taken");
        CHECK(attn_quantize_u4_keys(&tkf, &t.u, &t.ts, &t.tz, 32) == ATTN_ERR_SHAPE, "keys: scales of G 16 taken for G 32");
        CHECK(attn_quantize_u4_keys(&tkf, &t.u, &t.ts, NULL, G) == ATTN_ERR_NULL, "keys: a NULL zero taken");
        bad = t.u;
        bad.dtype = ATTN_Q4_0;
        CHECK(attn_quantize_u4_keys(&tkf, &bad, &t.ts, &t.tz, G) == ATTN_ERR_DTYPE, "keys: a q4_0 dst taken");
        const attn_tensor half = attn_tensor_4d(t.bytes, ATTN_U4, B, H, L, 16);
        const attn_tensor halfsrc = attn_tensor_4d(kf, ATTN_F32, B, H, L, 16);
        CHECK(attn_quantize_u4_keys(&halfsrc, &half, &t.ts, &t.tz, G) == ATTN_ERR_SHAPE, "keys: D = 16 taken");
        CHECK(attn_quantize_u4_keys(&tkf, &t.u, &t.ts, &t.ts, G) == ATTN_ERR_STRIDE, "keys: scale and zero one buffer");
        /* the dequantizations refuse a bad scale */
        t.sc[0] = 0.0f;
        CHECK(attn_dequantize_u4_keys(&t.u, &t.td, &t.ts, &t.tz, G) == ATTN_ERR_VALUE, "dequantize: scale 0 taken");
        u4set_free(&t);
    }
#undef REFUSED
    u4set_free(&ks), u4set_free(&vs);
}

/* ---- 4. outliers ------------------------------------------------------------------------ */

static void test_outliers(void) {
    enum { L = 256, D = 128 };
    static const int outlier[] = {3, 17, 40, 77, 101};
    rng_t r = {2024};
    float *k = xcalloc(L * D, 4), *k4 = xcalloc(L * D, 4);
    uint8_t *q4 = xcalloc(L * D / 32 * 18, 1);
    fill_normal(k, L * D, &r, 1.0);
    for (int j = 0; j < L; j++)
        for (size_t c = 0; c < sizeof outlier / sizeof *outlier; c++) k[j * D + outlier[c]] *= 20.0f;
    const attn_tensor tk = attn_tensor_4d(k, ATTN_F32, 1, 1, L, D);
    u4set s;
    u4set_make(&s, tk.shape, true, 32);
    CHECK(u4set_fill(&s, &tk) == 0, "outliers: u4: %s", attn_last_error());
    const attn_tensor tq4 = attn_tensor_4d(q4, ATTN_Q4_0, 1, 1, L, D), tk4 = attn_tensor_4d(k4, ATTN_F32, 1, 1, L, D);
    CHECK(attn_quantize_q4_0(&tk, &tq4) == ATTN_OK && attn_dequantize_q4_0(&tq4, &tk4) == ATTN_OK,
          "outliers: q4_0: %s", attn_last_error());
    double e_u4 = 0, e_q4 = 0, nrm = 0;
    for (int64_t i = 0; i < L * D; i++) {
        e_u4 += ((double)s.deq[i] - k[i]) * ((double)s.deq[i] - k[i]);
        e_q4 += ((double)k4[i] - k[i]) * ((double)k4[i] - k[i]);
        nrm += (double)k[i] * k[i];
    }
    e_u4 = sqrt(e_u4 / nrm), e_q4 = sqrt(e_q4 / nrm);
    printf("outlier keys (%d of %d channels x20, %d keys): relative Frobenius error u4 "
           "per-channel (G = 32) %.4f, q4_0 %.4f\n", (int)(sizeof outlier / sizeof *outlier), D, L,
           e_u4, e_q4);
    CHECK(e_u4 < e_q4, "outliers: u4's error %.4f not below q4_0's %.4f", e_u4, e_q4);
    u4set_free(&s);
    free(k), free(k4), free(q4);
}

/* ---- 5. a float residual, merged ------------------------------------------------------- */

static void test_residual_merge(void) {
    enum { B = 2, Hq = 4, Hkv = 2, Lq = 3, D = 64, G = 32, LQ4 = 64, LR = 7, LK = LQ4 + LR };
    rng_t r = {31337};
    float *q = xcalloc(B * Hq * Lq * D, 4), *kf = xcalloc(B * Hkv * LK * D, 4), *vf = xcalloc(B * Hkv * LK * D, 4);
    fill_normal(q, B * Hq * Lq * D, &r, 1.0), fill_normal(kf, B * Hkv * LK * D, &r, 1.0);
    fill_normal(vf, B * Hkv * LK * D, &r, 1.0);
    const attn_tensor tq = attn_tensor_4d(q, ATTN_F32, B, Hq, Lq, D);
    /* the two parts as views of the float cache: keys 0..63 (quantized), 64..70 (float) */
    attn_tensor kq = attn_tensor_4d(kf, ATTN_F32, B, Hkv, LK, D), vq = attn_tensor_4d(vf, ATTN_F32, B, Hkv, LK, D);
    attn_tensor kr = kq, vr = vq;
    kq.shape[2] = vq.shape[2] = LQ4;
    kr.shape[2] = vr.shape[2] = LR;
    kr.data = kf + LQ4 * D, vr.data = vf + LQ4 * D;
    u4set ks, vs;
    u4set_make(&ks, kq.shape, true, G);
    u4set_make(&vs, vq.shape, false, 0);
    CHECK(u4set_fill(&ks, &kq) == 0 && u4set_fill(&vs, &vq) == 0, "residual: quantize: %s", attn_last_error());
    float *o1 = xcalloc(B * Hq * Lq * D, 4), *o2 = xcalloc(B * Hq * Lq * D, 4), *o = xcalloc(B * Hq * Lq * D, 4);
    float l1[B * Hq * Lq], l2[B * Hq * Lq];
    attn_tensor to[2] = {attn_tensor_4d(o1, ATTN_F32, B, Hq, Lq, D), attn_tensor_4d(o2, ATTN_F32, B, Hq, Lq, D)};
    attn_tensor tl[2] = {attn_tensor_4d(l1, ATTN_F32, B, Hq, Lq, 1), attn_tensor_4d(l2, ATTN_F32, B, Hq, Lq, 1)};
    const attn_tensor tout = attn_tensor_4d(o, ATTN_F32, B, Hq, Lq, D);
    attn_options ou = {.lse = &tl[0], .k_scale = &ks.ts, .k_zero = &ks.tz, .v_scale = &vs.ts,
                       .v_zero = &vs.tz, .kv_group = G};
    attn_options of = {.lse = &tl[1]};
    CHECK(attn_forward(&tq, &ks.u, &vs.u, &to[0], &ou) == ATTN_OK &&
              attn_forward(&tq, &kr, &vr, &to[1], &of) == ATTN_OK &&
              attn_merge(2, to, tl, &tout, NULL, 0) == ATTN_OK,
          "residual: %s", attn_last_error());
    /* the oracle over the whole keys: the dequantized part, then the float residual */
    float *kc = xcalloc(B * Hkv * LK * D, 4), *vc = xcalloc(B * Hkv * LK * D, 4);
    for (int64_t b = 0; b < B; b++)
        for (int64_t g = 0; g < Hkv; g++)
            for (int64_t j = 0; j < LK; j++)
                for (int64_t d = 0; d < D; d++) {
                    const int64_t at = ((b * Hkv + g) * LK + j) * D + d;
                    kc[at] = j < LQ4 ? *view_ptr(&ks.td, b, g, j, d) : kf[at];
                    vc[at] = j < LQ4 ? *view_ptr(&vs.td, b, g, j, d) : vf[at];
                }
    const attn_tensor tkc = attn_tensor_4d(kc, ATTN_F32, B, Hkv, LK, D), tvc = attn_tensor_4d(vc, ATTN_F32, B, Hkv, LK, D);
    double *ref = xcalloc(B * Hq * Lq * D, 8);
    oracle_forward(&tq, &tkc, &tvc, NULL, ref, NULL, NULL);
    tol_result tr = {0};
    CHECK(within_f32_tol(o, ref, B * Hq * Lq * D, &tr), "residual: the merge is off the oracle "
          "over the concatenated keys (max err %.3g)", tr.max_err);
    /* and the tolerance sees a residual left out */
    CHECK(!within_f32_tol(o1, ref, B * Hq * Lq * D, NULL), "residual: the u4 part alone passes");
    u4set_free(&ks), u4set_free(&vs);
    free(q), free(kf), free(vf), free(o1), free(o2), free(o), free(kc), free(vc), free(ref);
}

int main(void) {
    printf("kernel: %s\n", attn_kernel_name());
    CHECK(attn_dtype_size(ATTN_U4) == 16 && attn_dtype_block(ATTN_U4) == 32 &&
              strcmp(attn_dtype_name(ATTN_U4), "u4") == 0 && ATTN_U4 == ATTN_DTYPE_COUNT - 1,
          "u4: size %zu, block %lld, name %s", attn_dtype_size(ATTN_U4),
          (long long)attn_dtype_block(ATTN_U4), attn_dtype_name(ATTN_U4));
    test_hand_blocks();
    test_forward_cases();
    test_refusals();
    test_outliers();
    test_residual_merge();
    return check_summary("test_u4");
}
