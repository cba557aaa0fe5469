/*
 * test_q8_0.c — the q8_0 KV cache dtype (llama.cpp's block_q8_0).
 *
 * 1. The format: blocks written by hand (scale 0x3C00 = 1.0 then 32 int8; a scale whose
 *    two bytes differ, to pin the byte order) read back bit for bit, through
 *    attn_dequantize_q8_0 and through the forward itself; quantizing them again gives
 *    the same bytes.
 * 2. Quantization on known inputs: amax from a positive and from a negative value, all
 *    zeros, rounding ties (away from zero, as roundf), the float16 rounding of the
 *    scale; a bound |x - d qs| <= d (1/2 + 127 / 2048) on random data; every kernel's
 *    dequant_q8_0 entry bit for bit against the portable one.
 * 3. The forward over q8_0 K and V (fused and reference) against the tests' own float64
 *    oracle over the dequantized cache, at the contract's float32 tolerance: prefill,
 *    GQA, decoding (Lq = 1, Lk >= 4096: the split path), bool mask and bias, window,
 *    ALiBi, softcap, kv_len with the unused rows' scales NaN, LSE and weights, the
 *    [B, L, H, D] layout of a llama.cpp cache and views of a longer cache. The same
 *    check against the oracle over the UNquantized K and V must fail: the tolerance sees
 *    quantization. Run once per kernel by scripts/check.sh (ATTN_ISA).
 * 4. Misuse refused with nothing written: D not a multiple of 32, bad strides, q8_0 as
 *    q, o, v alone, bias; the backward; the conversions' bad shapes, dtypes, overlaps,
 *    NaN / inf / too large inputs; exact byte extents in the overlap check.
 * Not here: speed (attn bench --q8), the quantization error's size (bench, docs).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "oracle.h"
#include "core/half.h"
#include "kernels/kernels.h"

enum { QB = 32, QBYTES = 34 };

static attn_tensor q8_dense(void *data, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    return attn_tensor_4d(data, ATTN_Q8_0, d0, d1, d2, d3);
}

/* ---- 1. the format ------------------------------------------------------------------- */

static void test_hand_blocks(void) {
    /* block 0: scale 0x3C00 (1.0), qs = -127, -64, ..., a ramp ending at 127;
     * block 1: scale 0x3C01 (1 + 2^-10): bytes 0x01 then 0x3C, little-endian */
    uint8_t buf[2 * QBYTES];
    const int8_t qs0[QB] = {-127, -100, -64, -33, -32, -17, -16, -9, -8, -5, -4, -3, -2, -1, 0, 0,
                            1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 64, 65, 100, 126, 127};
    buf[0] = 0x00, buf[1] = 0x3C;
    buf[QBYTES] = 0x01, buf[QBYTES + 1] = 0x3C;
    for (int i = 0; i < QB; i++) {
        buf[2 + i] = (uint8_t)qs0[i];
        buf[QBYTES + 2 + i] = (uint8_t)(int8_t)(i % 2 ? -(i * 4) : i * 4);
    }
    float out[2 * QB];
    attn_tensor src = q8_dense(buf, 1, 1, 1, 2 * QB), dst = attn_tensor_4d(out, ATTN_F32, 1, 1, 1, 2 * QB);
    CHECK(attn_dequantize_q8_0(&src, &dst) == ATTN_OK, "dequantize the hand blocks: %s", attn_last_error());
    int bad = 0;
    const float d1 = 1.0f + 0x1p-10f;
    for (int i = 0; i < QB; i++) {
        bad += out[i] != (float)qs0[i];
        bad += out[QB + i] != d1 * (float)(i % 2 ? -(i * 4) : i * 4);
    }
    CHECK(bad == 0, "hand blocks: %d of 64 values are not d * qs (0x3C00 -> 1.0, 0x3C01 -> 1 + 2^-10)", bad);

    /* quantized again: block 0 has amax 127 and d = 1 exactly, so the same bytes */
    uint8_t again[QBYTES];
    attn_tensor f0 = attn_tensor_4d(out, ATTN_F32, 1, 1, 1, QB), q0 = q8_dense(again, 1, 1, 1, QB);
    CHECK(attn_quantize_q8_0(&f0, &q0) == ATTN_OK, "quantize: %s", attn_last_error());
    CHECK(memcmp(again, buf, QBYTES) == 0, "hand block 0: dequantize then quantize changed its bytes");

    /* the forward reads the same bytes: one key per block row, V = the hand rows, one
     * query against a single key gives exactly that key's V row */
    uint8_t kv[QBYTES * 2];
    memcpy(kv, buf, sizeof kv);
    float q[QB] = {0}, o[2 * QB];
    attn_tensor tq = attn_tensor_4d(q, ATTN_F32, 1, 1, 1, QB);
    attn_tensor tk = q8_dense(kv, 1, 1, 1, QB);  // the first block as the one key
    attn_tensor tv = q8_dense(kv, 1, 1, 1, 2 * QB);
    attn_tensor to = attn_tensor_4d(o, ATTN_F32, 1, 1, 1, 2 * QB);
    for (int path = 0; path < 2; path++) {
        attn_options opt = {.path = path ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED};
        CHECK(attn_forward(&tq, &tk, &tv, &to, &opt) == ATTN_OK, "forward on the hand block: %s", attn_last_error());
        CHECK(memcmp(o, out, sizeof o) == 0, "path %d: one key's output is not its V row bit for bit", path);
    }
}

/* ---- 2. quantization on known inputs -------------------------------------------------- */

/* how many of n floats differ in their bits (any NaN matches any NaN: which operand's
 * payload a product keeps is the compiler's choice) */
static int64_t same_bits(const float *a, const float *b, int64_t n) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += !(isnan(a[i]) && isnan(b[i])) && attn_f32_bits(a[i]) != attn_f32_bits(b[i]);
    return bad;
}

static void quantize_one(const float *x, uint8_t *b) {
    attn_tensor s = attn_tensor_4d((void *)x, ATTN_F32, 1, 1, 1, QB), d = q8_dense(b, 1, 1, 1, QB);
    attn_status st = attn_quantize_q8_0(&s, &d);
    CHECK(st == ATTN_OK, "quantize: %s", attn_last_error());
}

/* Debian's aarch64 gcc 12 stops with an internal compiler error (vect_transform_reduction)
 * vectorizing one of this function's count loops; the function is a test of values, not
 * of speed, so it is compiled without the vectorizer there (and with it everywhere else). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__aarch64__)
__attribute__((optimize("no-tree-vectorize")))
#endif
static void test_known(void) {
    float x[QB];
    uint8_t b[QBYTES];
    /* amax 127 (positive): d = 1; ties at .5 go away from zero */
    const float tie_in[8] = {127.0f, 2.5f, -2.5f, 0.5f, -0.5f, 1.5f, -1.49f, 126.5f};
    const int8_t tie_out[8] = {127, 3, -3, 1, -1, 2, -1, 127};
    for (int i = 0; i < QB; i++) x[i] = i < 8 ? tie_in[i] : (float)(i - 20);
    quantize_one(x, b);
    CHECK(b[0] == 0x00 && b[1] == 0x3C, "amax 127: scale bytes %02x %02x, expected 00 3c", b[0], b[1]);
    int bad = 0;
    for (int i = 0; i < QB; i++) bad += (int8_t)b[2 + i] != (i < 8 ? tie_out[i] : (int8_t)(i - 20));
    CHECK(bad == 0, "amax 127: %d of 32 qs wrong (ties away from zero)", bad);

    /* amax from a negative value: -254 -> d = 2, qs = -127; 3 -> 1.5 -> 2 */
    for (int i = 0; i < QB; i++) x[i] = (float)(2 * (i - 16));
    x[0] = -254.0f;
    x[1] = 3.0f;
    x[2] = -3.0f;
    quantize_one(x, b);
    CHECK(b[0] == 0x00 && b[1] == 0x40, "amax 254 (negative): scale bytes %02x %02x, expected 00 40", b[0], b[1]);
    CHECK((int8_t)b[2] == -127 && (int8_t)b[3] == 2 && (int8_t)b[4] == -2 && (int8_t)b[5] == -13,
          "amax 254: qs %d %d %d %d, expected -127 2 -2 -13", (int8_t)b[2], (int8_t)b[3], (int8_t)b[4],
          (int8_t)b[5]);

    /* all zeros (negative zeros too): d = 0, qs = 0 */
    for (int i = 0; i < QB; i++) x[i] = i % 2 ? -0.0f : 0.0f;
    memset(b, 0x55, sizeof b);
    quantize_one(x, b);
    bad = 0;
    for (int i = 0; i < QBYTES; i++) bad += b[i] != 0;
    CHECK(bad == 0, "all-zero block: %d of 34 bytes not 0", bad);

    /* the float16 rounding of d, and qs from the float32 d: amax = 1 gives d = 1/127,
     * float16 0x2008 (nearest even of 0.0078740157...); 0.5 / (1/127) = 63.5 -> 64 */
    for (int i = 0; i < QB; i++) x[i] = 0.0f;
    x[0] = 1.0f;
    x[1] = 0.5f;
    quantize_one(x, b);
    const uint16_t h = (uint16_t)(b[0] | b[1] << 8);
    CHECK(h == attn_f32_to_f16(1.0f / 127.0f) && h == 0x2008, "amax 1: scale 0x%04x, expected 0x2008", h);
    CHECK((int8_t)b[2] == 127 && (int8_t)b[3] == 64, "amax 1: qs %d %d, expected 127 64", (int8_t)b[2],
          (int8_t)b[3]);

    /* random data, rows of several blocks, a strided source: |x - d16 qs| within
     * d (1/2 + 127 |d16 - d| / d) <= d (1/2 + 127 / 2048) while d is a normal float16
     * (the magnitudes 1e-2 .. 1e5 keep it so) */
    rng_t r = {7};
    enum { ROWS = 50, D = 128 };
    float *src = malloc(sizeof(float) * ROWS * D * 2), *back = malloc(sizeof(float) * ROWS * D);
    uint8_t *q8 = malloc((size_t)ROWS * D / QB * QBYTES);
    for (int64_t i = 0; i < ROWS * D * 2; i++) src[i] = (float)(rng_normal(&r) * pow(10.0, (double)(i / 256 % 8) - 2));
    attn_tensor ts = {src, ATTN_F32, {1, 1, ROWS, D}, {0, 0, 2 * D, 2}};  // every other float
    attn_tensor tq = q8_dense(q8, 1, 1, ROWS, D), tb = attn_tensor_4d(back, ATTN_F32, 1, 1, ROWS, D);
    CHECK(attn_quantize_q8_0(&ts, &tq) == ATTN_OK, "random: %s", attn_last_error());
    CHECK(attn_dequantize_q8_0(&tq, &tb) == ATTN_OK, "random back: %s", attn_last_error());
    int64_t over = 0;
    double worst = 0;
    for (int64_t row = 0; row < ROWS; row++)
        for (int64_t c = 0; c < D / QB; c++) {
            double amax = 0;
            for (int i = 0; i < QB; i++) amax = fmax(amax, fabs(src[row * 2 * D + 2 * (c * QB + i)]));
            const double d = amax / 127.0;
            for (int i = 0; i < QB; i++) {
                const double e = fabs((double)src[row * 2 * D + 2 * (c * QB + i)] - back[row * D + c * QB + i]);
                if (d > 0 && e / d > worst) worst = e / d;
                over += e > d * (0.5 + 127.0 / 2048.0) * (1 + 1e-6);
            }
        }
    CHECK(over == 0, "random: %lld values off by more than d (1/2 + 127/2048); worst %.4f d", (long long)over, worst);
    free(src), free(back), free(q8);

    /* every kernel's vector dequantization, bit for bit against the portable one: all 256
     * qs and scales of every kind (normal, subnormal, 0, largest, NaN) */
    const uint16_t scales[] = {0x3C00, 0x2008, 0x0001, 0x03FF, 0x0000, 0x8000, 0x7BFF, 0xFBFF, 0x7E00, 0xBC00};
    enum { NS = sizeof scales / sizeof scales[0], NBLK = NS * 8 };
    uint8_t blocks[NBLK * QBYTES];
    for (int c = 0; c < NBLK; c++) {
        blocks[c * QBYTES] = (uint8_t)(scales[c / 8] & 0xFF);
        blocks[c * QBYTES + 1] = (uint8_t)(scales[c / 8] >> 8);
        for (int i = 0; i < QB; i++) blocks[c * QBYTES + 2 + i] = (uint8_t)((c % 8) * QB + i);
    }
    float want[NBLK * QB], got[NBLK * QB];
    for (int c = 0; c < NBLK; c++)
        for (int i = 0; i < QB; i++)
            want[c * QB + i] = attn_f16_to_f32(scales[c / 8]) * (float)(int8_t)((c % 8) * QB + i);
    for (const char *const *name = attn_kernel_list(); *name; name++) {
        const attn_kernels *kern = ai_kernels_named(*name);
        if (!kern || !kern->dequant_q8_0) continue;
        kern->dequant_q8_0(NBLK, blocks, got);
        CHECK(same_bits(got, want, NBLK * QB) == 0, "kernel %s: dequant_q8_0 differs from d * qs", *name);
    }
    ai_dequant_q8_0_blocks(NBLK, blocks, got);
    CHECK(same_bits(got, want, NBLK * QB) == 0, "the portable dequantization differs from d * qs");
}

/* Every kernel a decoding call over a q8_0 cache can be dispatched to takes it to a kernel
 * with the q8_0 step when the list has one this CPU runs at or after it: an AVX-512 CPU
 * must not decode q8_0 through the tiles (a fifth of the speed, issue 38's Zen 4 run). */
static void test_q8_0_kernel_choice(void) {
    bool seen_step = false;  // walking from the end: a kernel with the step at or after this one
    const char *const *list = attn_kernel_list();
    int n = 0;
    while (list[n]) n++;
    for (int i = n - 1; i >= 0; i--) {
        const attn_kernels *kern = ai_kernels_named(list[i]);
        if (!kern) continue;
        seen_step = seen_step || kern->decode_q8_0;
        const attn_kernels *got = ai_kernels_for_q8_0(kern);
        CHECK(got != NULL, "kernel %s: no kernel for q8_0", list[i]);
        if (!got) continue;
        CHECK(!seen_step || got->decode_q8_0, "kernel %s: a q8_0 decoding call runs on %s, "
              "which has no q8_0 step", list[i], got->name);
        CHECK(!kern->decode_q8_0 || got == kern, "kernel %s has the q8_0 step, yet %s was taken",
              list[i], got->name);
        CHECK(seen_step || got == kern, "kernel %s: %s taken where no kernel after it has the step",
              list[i], got->name);
    }
}

/* ---- 3. the forward over a q8_0 cache ------------------------------------------------- */

typedef struct q8case {
    fcase c;
    int q8_layout;  /* 0: [B, Hkv, Lmax, D]; 1: [B, Lmax, Hkv, D] (llama.cpp's) */
    int64_t q8_extra;  /* Lmax = Lk + q8_extra rows, the view from row 2 (when > 0) */
    const char *what;
} q8case;

/* a q8_0 view [B, Hkv, Lk, D] into buf, laid out as the case says */
static attn_tensor q8_view(uint8_t *buf, const q8case *qc, int64_t D) {
    const fcase *c = &qc->c;
    const int64_t Lmax = c->Lk + qc->q8_extra, off = qc->q8_extra > 0 ? 2 : 0;
    attn_tensor t = {NULL, ATTN_Q8_0, {c->B, c->Hkv, c->Lk, D}, {0}};
    if (qc->q8_layout == 0) {
        t.stride[0] = c->Hkv * Lmax * D, t.stride[1] = Lmax * D, t.stride[2] = D, t.stride[3] = 1;
        t.data = buf + off * D / QB * QBYTES;
    } else {
        t.stride[0] = Lmax * c->Hkv * D, t.stride[1] = D, t.stride[2] = c->Hkv * D, t.stride[3] = 1;
        t.data = buf + off * c->Hkv * D / QB * QBYTES;
    }
    return t;
}

/* Every block of row j of head g in batch b gets a NaN scale: it must never be read. */
static void poison_row(const attn_tensor *t, int64_t b, int64_t g, int64_t j) {
    uint8_t *row = (uint8_t *)t->data + (b * t->stride[0] + g * t->stride[1] + j * t->stride[2]) / QB * QBYTES;
    for (int64_t c = 0; c < t->shape[3] / QB; c++) row[c * QBYTES] = 0x00, row[c * QBYTES + 1] = 0x7E;
}

static void run_case(const q8case *qc) {
    tcall t;
    tcall_build(&t, &qc->c);
    const fcase *c = &qc->c;
    const int64_t Lmax = c->Lk + qc->q8_extra;
    const size_t kbytes = (size_t)(c->B * c->Hkv * Lmax * c->Dk / QB * QBYTES);
    const size_t vbytes = (size_t)(c->B * c->Hkv * Lmax * c->Dv / QB * QBYTES);
    uint8_t *kb = malloc(kbytes), *vb = malloc(vbytes);
    for (size_t i = 0; i < kbytes; i++) kb[i] = i % QBYTES == 1 ? 0x7E : 0;  // NaN scales around
    for (size_t i = 0; i < vbytes; i++) vb[i] = i % QBYTES == 1 ? 0x7E : 0;
    attn_tensor k8 = q8_view(kb, qc, c->Dk), v8 = q8_view(vb, qc, c->Dv);
    CHECK(attn_quantize_q8_0(&t.k, &k8) == ATTN_OK, "%s: quantize k: %s", qc->what, attn_last_error());
    CHECK(attn_quantize_q8_0(&t.v, &v8) == ATTN_OK, "%s: quantize v: %s", qc->what, attn_last_error());

    /* the oracle over the unquantized cache must fail the tolerance: it sees the error */
    tcall_oracle(&t);
    const attn_tensor kf = t.k, vf = t.v;
    t.k = k8, t.v = v8;
    CHECK(tcall_run(&t, ATTN_PATH_FUSED, 0) == ATTN_OK, "%s: fused: %s", qc->what, attn_last_error());
    tcall_gather(&t);
    CHECK(!within_f32_tol(t.o_got, t.o_ref, t.no, NULL), "%s: q8_0 output within the float32 tolerance "
          "of the UNquantized answer: the check cannot see quantization", qc->what);

    /* the oracle over the dequantized cache (written back into the float views) */
    t.k = kf, t.v = vf;
    CHECK(attn_dequantize_q8_0(&k8, &t.k) == ATTN_OK && attn_dequantize_q8_0(&v8, &t.v) == ATTN_OK,
          "%s: dequantize: %s", qc->what, attn_last_error());
    tcall_oracle(&t);
    /* rows no query reads: NaN scales (for kv_len cases, rows past each batch's length) */
    if (c->kvlen)
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t j = oracle_lkb(&t.opt, b, c->Lk); j < c->Lk; j++)
                for (int64_t g = 0; g < c->Hkv; g++) poison_row(&k8, b, g, j), poison_row(&v8, b, g, j);
    t.k = k8, t.v = v8;
    char what[160];
    for (int path = 0; path < 2; path++) {
        const attn_path ap = path ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED;
        for (int threads = 1; threads <= 2; threads++) {
            snprintf(what, sizeof what, "%s (%s, %s, %d threads)", qc->what, attn_kernel_name(),
                     path ? "reference" : "fused", threads);
            attn_status st = tcall_run(&t, ap, threads);
            CHECK(st == ATTN_OK, "%s: %s", what, attn_last_error());
            if (st == ATTN_OK) tcall_check(&t, what);
        }
    }
    t.k = kf, t.v = vf;
    free(kb), free(vb);
    tcall_free(&t);
}

static void test_forward(void) {
    q8case cases[16];
    int n = 0;
    fcase f;

    f = fcase_new(1, 2, 4, 4, 67, 300, 64, 64);  /* prefill, plain */
    cases[n++] = (q8case){f, 0, 0, "prefill"};

    f = fcase_new(2, 2, 8, 2, 5, 257, 64, 64);  /* GQA, bottom-right causal, llama.cpp layout */
    f.causal = 1, f.align = 1;
    cases[n++] = (q8case){f, 1, 0, "GQA causal"};

    f = fcase_new(3, 1, 8, 2, 1, 4133, 128, 128);  /* decoding, the split path */
    cases[n++] = (q8case){f, 1, 11, "decode split"};

    f = fcase_new(4, 3, 4, 1, 1, 4500, 64, 64);  /* decoding, kv_len (NaN rows after), MQA */
    f.kvlen = 1;
    cases[n++] = (q8case){f, 0, 5, "decode kv_len"};

    f = fcase_new(5, 2, 4, 2, 33, 130, 64, 64);  /* bool mask and bias */
    f.mask = 3, f.mshape = 7, f.bias_ninf = 0.1;
    cases[n++] = (q8case){f, 0, 0, "mask+bias"};

    f = fcase_new(6, 1, 4, 2, 40, 200, 32, 32);  /* window, ALiBi, softcap */
    f.window = 1, f.wl = 30, f.wr = 5, f.alibi = 1, f.softcap = 5.0f;
    cases[n++] = (q8case){f, 1, 3, "window+alibi+softcap"};

    f = fcase_new(7, 2, 6, 3, 3, 90, 64, 32);  /* LSE and weights, Dk != Dv */
    f.lse = 1, f.weights = 1, f.causal = 1, f.align = 1;
    cases[n++] = (q8case){f, 0, 0, "lse+weights"};

    f = fcase_new(8, 1, 16, 8, 16, 512, 128, 128);  /* a prefill chunk against a cache */
    f.causal = 1, f.align = 1, f.dist = 1;
    cases[n++] = (q8case){f, 1, 7, "prefill chunk"};

    f = fcase_new(9, 1, 32, 8, 1, 2048, 128, 128);  /* GQA-4 decoding, the bench's group */
    f.lse = 1;
    cases[n++] = (q8case){f, 1, 0, "decode GQA-4"};

    for (int i = 0; i < n; i++) run_case(&cases[i]);

    /* 16-bit queries over a q8_0 cache: widened, the answer of the float32 queries they hold */
    {
        enum { L = 70, D = 64 };
        rng_t r = {11};
        float *kf = malloc(sizeof(float) * L * D), *qf = malloc(sizeof(float) * 2 * D);
        uint16_t q16[2 * D];
        uint8_t *k8 = malloc(L * D / QB * QBYTES);
        for (int i = 0; i < L * D; i++) kf[i] = (float)rng_sym(&r);
        for (int i = 0; i < 2 * D; i++) q16[i] = attn_f32_to_bf16((float)rng_sym(&r)), qf[i] = attn_bf16_to_f32(q16[i]);
        attn_tensor tkf = attn_tensor_4d(kf, ATTN_F32, 1, 1, L, D), tk8 = q8_dense(k8, 1, 1, L, D);
        CHECK(attn_quantize_q8_0(&tkf, &tk8) == ATTN_OK, "bf16 q: %s", attn_last_error());
        float o16[2 * D], o32[2 * D];
        attn_tensor tq16 = attn_tensor_4d(q16, ATTN_BF16, 1, 1, 2, D), tq32 = attn_tensor_4d(qf, ATTN_F32, 1, 1, 2, D);
        attn_tensor to16 = attn_tensor_4d(o16, ATTN_F32, 1, 1, 2, D), to32 = attn_tensor_4d(o32, ATTN_F32, 1, 1, 2, D);
        CHECK(attn_forward(&tq16, &tk8, &tk8, &to16, NULL) == ATTN_OK, "bf16 q: %s", attn_last_error());
        CHECK(attn_forward(&tq32, &tk8, &tk8, &to32, NULL) == ATTN_OK, "f32 q: %s", attn_last_error());
        CHECK(memcmp(o16, o32, sizeof o16) == 0, "bfloat16 queries: not the float32 queries' answer bit for bit");

        /* attn_weights_grid reads a q8_0 K too: its grid against the float64 one over the
         * dequantized keys */
        float lse[2], grid[2 * 7];
        double gref[2 * 7];
        float kd[L * D];
        attn_tensor tkd = attn_tensor_4d(kd, ATTN_F32, 1, 1, L, D), tl = attn_tensor_4d(lse, ATTN_F32, 1, 1, 2, 1);
        attn_tensor tg = attn_tensor_4d(grid, ATTN_F32, 1, 1, 2, 7);
        CHECK(attn_dequantize_q8_0(&tk8, &tkd) == ATTN_OK, "grid: %s", attn_last_error());
        attn_options lo = {.lse = &tl, .path = ATTN_PATH_REFERENCE};
        CHECK(attn_forward(&tq32, &tkd, &tkd, &to32, &lo) == ATTN_OK, "grid lse: %s", attn_last_error());
        attn_options go = {.path = ATTN_PATH_REFERENCE};
        CHECK(attn_weights_grid(&tq32, &tkd, &tl, &tg, ATTN_REDUCE_SUM, &go) == ATTN_OK, "grid ref: %s", attn_last_error());
        for (int i = 0; i < 14; i++) gref[i] = grid[i];
        go.path = ATTN_PATH_FUSED;
        CHECK(attn_weights_grid(&tq32, &tk8, &tl, &tg, ATTN_REDUCE_SUM, &go) == ATTN_OK, "grid q8_0: %s", attn_last_error());
        tol_result tr;
        CHECK(within_f32_tol(grid, gref, 14, &tr), "weights grid over q8_0 K: max err %.3g rel %.3g", tr.max_err, tr.rel_err);
        free(kf), free(qf), free(k8);
    }
}

/* ---- 4. misuse -------------------------------------------------------------------------- */

static void test_misuse(void) {
    enum { L = 8, D = 64 };
    float q[L * D], o[L * D], kf[L * D];
    uint8_t k8[L * D / QB * QBYTES + 64], v8[L * D / QB * QBYTES];
    for (int i = 0; i < L * D; i++) q[i] = kf[i] = (float)(i % 7) * 0.25f;
    memset(k8, 0, sizeof k8);
    memset(v8, 0, sizeof v8);
    attn_tensor tq = attn_tensor_4d(q, ATTN_F32, 1, 1, L, D), to = attn_tensor_4d(o, ATTN_F32, 1, 1, L, D);
    attn_tensor tk = q8_dense(k8, 1, 1, L, D), tv = q8_dense(v8, 1, 1, L, D);
    CHECK(attn_forward(&tq, &tk, &tv, &to, NULL) == ATTN_OK, "the sound call: %s", attn_last_error());

    typedef struct { attn_tensor q, k, v, o; attn_status want; const char *what; } bad_call;
    bad_call bad[12];
    int n = 0;
    attn_tensor x;
#define BAD(Q, K, V, O, W, WHAT) (bad[n++] = (bad_call){Q, K, V, O, W, WHAT})
    x = q8_dense(k8, 1, 1, L / 2, 48); BAD(tq, x, x, to, ATTN_ERR_SHAPE, "D = 48");
    x = tk; x.stride[3] = 2; x.shape[3] = 32; BAD(tq, x, x, to, ATTN_ERR_STRIDE, "stride[3] = 2");
    x = tk; x.stride[2] = D + 8; x.shape[2] = 4; BAD(tq, x, x, to, ATTN_ERR_STRIDE, "stride[2] = 72");
    x = tk; x.stride[2] = 16; x.shape[2] = 4; BAD(tq, x, x, to, ATTN_ERR_STRIDE, "stride[2] = 16");
    x = q8_dense(q, 1, 1, L, D); BAD(x, tk, tv, to, ATTN_ERR_DTYPE, "q8_0 q");
    x = q8_dense(o, 1, 1, L, D); BAD(tq, tk, tv, x, ATTN_ERR_DTYPE, "q8_0 o");
    x = attn_tensor_4d(kf, ATTN_F32, 1, 1, L, D); BAD(tq, tk, x, to, ATTN_ERR_DTYPE, "q8_0 k, float32 v");
    BAD(tq, x, tv, to, ATTN_ERR_DTYPE, "float32 k, q8_0 v");
#undef BAD
    for (int i = 0; i < n; i++) {
        fill_sentinel(o, L * D);
        attn_status st = attn_forward(&bad[i].q, &bad[i].k, &bad[i].v, &bad[i].o, NULL);
        CHECK(st == bad[i].want, "%s: status %s (%s), expected %s", bad[i].what, attn_status_string(st),
              attn_last_error(), attn_status_string(bad[i].want));
        CHECK(count_written(o, L * D) == 0, "%s: o written on a refused call", bad[i].what);
    }

    /* a q8_0 bias or mask, and the backward over a q8_0 cache */
    {
        attn_tensor bias = q8_dense(k8, 1, 1, L, L * 4);
        attn_options opt = {.bias = &bias};
        fill_sentinel(o, L * D);
        CHECK(attn_forward(&tq, &tk, &tv, &to, &opt) == ATTN_ERR_DTYPE && count_written(o, L * D) == 0,
              "q8_0 bias: accepted or wrote: %s", attn_last_error());
        opt = (attn_options){.mask = &bias};
        CHECK(attn_forward(&tq, &tk, &tv, &to, &opt) == ATTN_ERR_DTYPE && count_written(o, L * D) == 0,
              "q8_0 mask: accepted or wrote: %s", attn_last_error());
        float lse[L], dq[L * D], dk[L * D], dv[L * D];
        attn_tensor tl = attn_tensor_4d(lse, ATTN_F32, 1, 1, L, 1), tdq = attn_tensor_4d(dq, ATTN_F32, 1, 1, L, D);
        attn_tensor tdk = attn_tensor_4d(dk, ATTN_F32, 1, 1, L, D), tdv = attn_tensor_4d(dv, ATTN_F32, 1, 1, L, D);
        fill_sentinel(dq, L * D);
        attn_status st = attn_backward(&tq, &tk, &tv, &to, &to, &tl, &tdq, &tdk, &tdv, NULL);
        CHECK(st == ATTN_ERR_DTYPE && count_written(dq, L * D) == 0, "backward over q8_0: %s (%s)",
              attn_status_string(st), attn_last_error());
    }

    /* the overlap check's q8_0 extents, exact: o right after K's last byte is fine, o on
     * its last byte is refused (k: 8 rows of 2 blocks = 544 bytes) */
    {
        _Alignas(16) uint8_t big[L * D / QB * QBYTES + L * D * 4 + 64];
        memset(big, 0, sizeof big);
        const size_t kb = L * D / QB * QBYTES;
        attn_tensor k2 = q8_dense(big, 1, 1, L, D);
        attn_tensor o2 = attn_tensor_4d(big + kb, ATTN_F32, 1, 1, L, D);
        CHECK(attn_forward(&tq, &k2, &k2, &o2, NULL) == ATTN_OK, "o just past q8_0 k: %s", attn_last_error());
        o2.data = big + kb - 4;
        attn_status st = attn_forward(&tq, &k2, &k2, &o2, NULL);
        CHECK(st == ATTN_ERR_STRIDE, "o over q8_0 k's last block: %s, expected ATTN_ERR_STRIDE", attn_status_string(st));
    }

    /* the conversions */
    {
        uint8_t dst[L * D / QB * QBYTES];
        float src[L * D];
        for (int i = 0; i < L * D; i++) src[i] = (float)i;
        attn_tensor ts = attn_tensor_4d(src, ATTN_F32, 1, 1, L, D), td = q8_dense(dst, 1, 1, L, D);
        typedef struct { attn_tensor s, d; attn_status want; const char *what; float poke; } bad_conv;
        bad_conv cv[8];
        int m = 0;
        cv[m++] = (bad_conv){ts, q8_dense(dst, 1, 1, L, 32), ATTN_ERR_SHAPE, "shapes differ", 0};
        cv[m++] = (bad_conv){attn_tensor_4d(src, ATTN_F32, 1, 1, L, 48), q8_dense(dst, 1, 1, L, 48), ATTN_ERR_SHAPE, "D = 48", 0};
        cv[m++] = (bad_conv){attn_tensor_4d(src, ATTN_F16, 1, 1, L, D), td, ATTN_ERR_DTYPE, "float16 src", 0};
        cv[m++] = (bad_conv){ts, attn_tensor_4d(dst, ATTN_F32, 1, 1, 4, D), ATTN_ERR_DTYPE, "float32 dst", 0};
        attn_tensor bc = td; bc.stride[2] = 0;
        cv[m++] = (bad_conv){ts, bc, ATTN_ERR_STRIDE, "dst broadcast", 0};
        cv[m++] = (bad_conv){ts, q8_dense(src, 1, 1, L, D), ATTN_ERR_STRIDE, "dst over src", 0};
        cv[m++] = (bad_conv){ts, td, ATTN_ERR_VALUE, "a NaN", NAN};
        cv[m++] = (bad_conv){ts, td, ATTN_ERR_VALUE, "amax 1e7: the scale beyond float16", 1e7f};
        for (int i = 0; i < m; i++) {
            memset(dst, 0xA5, sizeof dst);
            for (int e = 0; e < L * D; e++) src[e] = (float)(e % 100);
            if (cv[i].poke != 0) src[L * D - 3] = cv[i].poke;
            attn_status st = attn_quantize_q8_0(&cv[i].s, &cv[i].d);
            int written = 0;
            for (size_t e = 0; e < sizeof dst; e++) written += dst[e] != 0xA5;
            CHECK(st == cv[i].want, "quantize, %s: %s (%s), expected %s", cv[i].what, attn_status_string(st),
                  attn_last_error(), attn_status_string(cv[i].want));
            CHECK(written == 0, "quantize, %s: %d bytes written on a refused call", cv[i].what, written);
        }
        src[5] = INFINITY;
        memset(dst, 0xA5, sizeof dst);
        CHECK(attn_quantize_q8_0(&ts, &td) == ATTN_ERR_VALUE, "quantize an inf: accepted");
        for (int e = 0; e < L * D; e++) src[e] = (float)(e % 100);
        CHECK(attn_quantize_q8_0(&ts, &td) == ATTN_OK, "quantize: %s", attn_last_error());
        fill_sentinel(src, L * D);
        attn_tensor wrong = q8_dense(dst, 1, 1, L / 2, D);
        CHECK(attn_dequantize_q8_0(&wrong, &ts) == ATTN_ERR_SHAPE && count_written(src, L * D) == 0,
              "dequantize, shapes differ: accepted or wrote");
        attn_tensor tbad = td; tbad.stride[2] = 40;
        CHECK(attn_dequantize_q8_0(&tbad, &ts) == ATTN_ERR_STRIDE && count_written(src, L * D) == 0,
              "dequantize, stride[2] = 40: accepted or wrote");
        CHECK(attn_dequantize_q8_0(NULL, &ts) == ATTN_ERR_NULL, "dequantize NULL: accepted");
        CHECK(attn_dtype_size(ATTN_Q8_0) == 34 && attn_dtype_block(ATTN_Q8_0) == 32 &&
                  attn_dtype_block(ATTN_F32) == 1 && attn_dtype_block(ATTN_DTYPE_COUNT) == 0 &&
                  strcmp(attn_dtype_name(ATTN_Q8_0), "q8_0") == 0,
              "q8_0's size, block or name");
    }
}

int main(void) {
    test_hand_blocks();
    test_known();
    test_q8_0_kernel_choice();
    test_forward();
    test_misuse();
    printf("(kernel %s)\n", attn_kernel_name());
    return check_summary("test_q8_0");
}
