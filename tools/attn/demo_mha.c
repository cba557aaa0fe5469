/*
 * demo_mha.c — `attn demo`'s multi-head part: the seeds' layer examples answered by
 *              running the library's multi-head module (attn_mha_forward / _backward).
 *
 * Seed 002 §4: self-attention with W_Q, W_K, W_V on a 3-token ("I love AI") input.
 * Seed 003 §6: multi-head as a reshape (d_model 64, 8 heads of 8): the module against
 * the by-hand split / transpose / concat around attn_forward. Seed 003 exercise 1
 * (B = 2, T = 8, D = 16: shapes, every weights row sums to 1) and exercise 4 (8 heads
 * initialized alike stay alike through training; different initializations do not).
 * What it is not: a test (the suites check the module against float64) or a trainer.
 * The by-hand path's projections go through the library's BLAS door, as the module's.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "core/blas.h"
#include "cli.h"
#include "rng.h"

static rng_t g_state = {0x5eed0016};
static float unif(void) { return (float)rng_sym(&g_state); }  /* uniform in [-1, 1) */

static void fill(float *p, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) p[i] = unif() * scale;
}

static attn_tensor rows(float *p, int64_t B, int64_t L, int64_t C) {
    return attn_tensor_4d(p, ATTN_F32, B, L, C, 1);
}
static attn_tensor mat(float *p, int64_t in, int64_t out) {
    return attn_tensor_4d(p, ATTN_F32, in, out, 1, 1);
}

static int failed(attn_status st) {
    if (st == ATTN_OK) return 0;
    fprintf(stderr, "attn: demo: %s: %s\n", attn_status_string(st), attn_last_error());
    return 1;
}

/* A layer of row-major [in, out] weights, no biases. */
typedef struct layer {
    float *w[4];
    attn_tensor t[4];
    attn_mha m;
} layer;

static void layer_init(layer *l, int64_t E, int64_t H, int64_t D, float scale) {
    const int64_t in[4] = {E, E, E, H * D}, out[4] = {H * D, H * D, H * D, E};
    for (int n = 0; n < 4; n++) {
        l->w[n] = malloc((size_t)(in[n] * out[n]) * sizeof(float));
        fill(l->w[n], in[n] * out[n], scale);
        l->t[n] = mat(l->w[n], in[n], out[n]);
    }
    l->m = (attn_mha){.Hq = H, .w_q = &l->t[0], .w_k = &l->t[1], .w_v = &l->t[2],
                      .w_o = &l->t[3]};
}

static void layer_free(layer *l) {
    for (int n = 0; n < 4; n++) free(l->w[n]);
}

/* Seed 002 §4: three tokens of width 4, one head, W_O = I so y is the heads' output. */
static int demo_self(void) {
    enum { T = 3, E = 4 };
    layer l;
    layer_init(&l, E, 1, E, 1.0f);
    for (int r = 0; r < E; r++)
        for (int c = 0; c < E; c++) l.w[3][r * E + c] = r == c;
    float x[T * E], y[T * E], a[T * T];
    fill(x, T * E, 1.0f);
    attn_tensor tx = rows(x, 1, T, E), ty = rows(y, 1, T, E);
    attn_tensor tw = attn_tensor_4d(a, ATTN_F32, 1, 1, T, T);
    if (failed(attn_mha_forward(&l.m, &tx, NULL, &ty, &tw, false, NULL))) return 1;
    static const char *const words[T] = {"I", "love", "AI"};
    printf("Seed 002 section 4: self-attention of \"I love AI\" (3 tokens, E = 4), "
           "Q = x W_Q, K = x W_K, V = x W_V, W_O = identity:\n");
    for (int i = 0; i < T; i++) {
        printf("  %-5s weights [", words[i]);
        for (int j = 0; j < T; j++) printf("%s%.3f", j ? ", " : "", a[i * T + j]);
        printf("]  y = [");
        for (int e = 0; e < E; e++) printf("%s%+.3f", e ? ", " : "", y[i * E + e]);
        printf("]\n");
    }
    printf("  Each token's new representation y is its weights' mix of the value rows.\n\n");
    layer_free(&l);
    return 0;
}

/* Seed 003 §6: the module against split (B, T, D) -> (B, H, T, hd), attn_forward, concat. */
static int demo_reshape(void) {
    enum { B = 1, T = 4, D = 64, H = 8, HD = D / H };
    layer l;
    layer_init(&l, D, H, HD, 0.125f);
    static float x[B * T * D], y[B * T * D], p[3][B * T * D], heads[3][B * H * T * HD],
        o[B * H * T * HD], cat[B * T * D], byhand[B * T * D];
    fill(x, B * T * D, 1.0f);
    attn_tensor tx = rows(x, B, T, D), ty = rows(y, B, T, D);
    const attn_options causal = {.causal = true};
    if (failed(attn_mha_forward(&l.m, &tx, NULL, &ty, NULL, false, &causal))) return 1;
    for (int n = 0; n < 3; n++) {  /* Q, K, V = x W, then view (B, T, H, hd).transpose(1, 2) */
        if (failed(ai_gemm_f32(false, false, B * T, D, D, 1.0f, x, D, l.w[n], D, 0.0f, p[n], D)))
            return 1;
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++)
                memcpy(&heads[n][(h * T + t) * HD], &p[n][t * D + h * HD], HD * sizeof(float));
    }
    attn_tensor q = attn_tensor_4d(heads[0], ATTN_F32, B, H, T, HD);
    attn_tensor k = attn_tensor_4d(heads[1], ATTN_F32, B, H, T, HD);
    attn_tensor v = attn_tensor_4d(heads[2], ATTN_F32, B, H, T, HD);
    attn_tensor to = attn_tensor_4d(o, ATTN_F32, B, H, T, HD);
    if (failed(attn_forward(&q, &k, &v, &to, &causal))) return 1;
    for (int t = 0; t < T; t++)  /* out.transpose(1, 2).contiguous().view(B, T, D) */
        for (int h = 0; h < H; h++)
            memcpy(&cat[t * D + h * HD], &o[(h * T + t) * HD], HD * sizeof(float));
    if (failed(ai_gemm_f32(false, false, B * T, D, D, 1.0f, cat, D, l.w[3], D, 0.0f, byhand, D)))
        return 1;
    double diff = 0, norm = 0;
    for (int e = 0; e < B * T * D; e++) {
        diff = fmax(diff, fabs((double)y[e] - byhand[e]));
        norm = fmax(norm, fabs((double)y[e]));
    }
    printf("Seed 003 section 6: multi-head as a reshape (d_model %d, %d heads of %d, T = %d, "
           "causal):\n  the module (projections read as [B, T, H, hd] views, no copies) "
           "against split / transpose / attention / concat by hand:\n  max |difference| "
           "= %.3g (outputs up to %.3g)\n\n", D, H, HD, T, diff, norm);
    layer_free(&l);
    return 0;
}

/* Seed 003 exercise 1: B = 2, T = 8, D = 16 (one head): shapes and row sums. */
static int demo_exercise1(void) {
    enum { B = 2, T = 8, D = 16 };
    layer l;
    layer_init(&l, D, 1, D, 0.25f);
    static float x[B * T * D], y[B * T * D], a[B * T * T];
    fill(x, B * T * D, 1.0f);
    attn_tensor tx = rows(x, B, T, D), ty = rows(y, B, T, D);
    attn_tensor tw = attn_tensor_4d(a, ATTN_F32, B, 1, T, T);
    if (failed(attn_mha_forward(&l.m, &tx, NULL, &ty, &tw, false, NULL))) return 1;
    double worst = 0;
    for (int r = 0; r < B * T; r++) {
        double s = 0;
        for (int j = 0; j < T; j++) s += a[r * T + j];
        worst = fmax(worst, fabs(s - 1.0));
    }
    printf("Seed 003 exercise 1: B = %d, T = %d, D = %d: x (%d, %d, %d) -> y (%d, %d, %d), "
           "attn (%d, 1, %d, %d);\n  every row of attn sums to 1: max |sum - 1| = %.3g "
           "over %d rows\n\n", B, T, D, B, T, D, B, T, D, B, T, T, worst, B * T);
    layer_free(&l);
    return 0;
}

/* The largest difference between any head's block and head 0's, over W_Q, W_K, W_V
 * (column blocks) and W_O (row blocks). */
static double head_spread(const layer *l, int64_t E, int64_t H, int64_t D) {
    double s = 0;
    for (int n = 0; n < 3; n++)
        for (int64_t r = 0; r < E; r++)
            for (int64_t h = 1; h < H; h++)
                for (int64_t d = 0; d < D; d++)
                    s = fmax(s, fabs((double)l->w[n][r * H * D + h * D + d] - l->w[n][r * H * D + d]));
    for (int64_t h = 1; h < H; h++)
        for (int64_t d = 0; d < D * E; d++)
            s = fmax(s, fabs((double)l->w[3][h * D * E + d] - l->w[3][d]));
    return s;
}

/* Seed 003 exercise 4: 8 heads trained on one regression task by plain gradient descent
 * (loss = mean (y - target)^2, 50 steps), once from identical heads, once from heads
 * initialized differently. */
static int demo_exercise4(void) {
    enum { B = 2, T = 6, E = 16, H = 8, D = 2, STEPS = 50 };
    static float x[B * T * E], target[B * T * E], y[B * T * E], dy[B * T * E];
    fill(x, B * T * E, 1.0f);
    fill(target, B * T * E, 1.0f);
    printf("Seed 003 exercise 4: %d heads of width %d trained %d steps (E = %d, causal):\n",
           H, D, STEPS, E);
    for (int same = 1; same >= 0; same--) {
        layer l, g;
        layer_init(&l, E, H, D, 0.3f);
        layer_init(&g, E, H, D, 0.0f);
        if (same) {  /* every head a copy of head 0 */
            for (int n = 0; n < 3; n++)
                for (int64_t r = 0; r < E; r++)
                    for (int64_t h = 1; h < H; h++)
                        memcpy(&l.w[n][r * H * D + h * D], &l.w[n][r * H * D], D * sizeof(float));
            for (int64_t h = 1; h < H; h++)
                memcpy(&l.w[3][h * D * E], l.w[3], D * E * sizeof(float));
        }
        const double before = head_spread(&l, E, H, D);
        attn_tensor tx = rows(x, B, T, E), ty = rows(y, B, T, E), tdy = rows(dy, B, T, E);
        const attn_options causal = {.causal = true};
        const attn_mha_grads grads = {.dw_q = &g.t[0], .dw_k = &g.t[1], .dw_v = &g.t[2],
                                      .dw_o = &g.t[3]};
        double loss0 = 0, loss = 0;
        for (int s = 0; s <= STEPS; s++) {
            if (failed(attn_mha_forward(&l.m, &tx, NULL, &ty, NULL, false, &causal))) return 1;
            loss = 0;
            for (int e = 0; e < B * T * E; e++) {
                loss += (double)(y[e] - target[e]) * (y[e] - target[e]) / (B * T * E);
                dy[e] = 2.0f * (y[e] - target[e]) / (B * T * E);
            }
            if (s == 0) loss0 = loss;
            if (s == STEPS) break;
            if (failed(attn_mha_backward(&l.m, &tx, NULL, &tdy, &grads, &causal))) return 1;
            const int64_t size[4] = {E * H * D, E * H * D, E * H * D, H * D * E};
            for (int n = 0; n < 4; n++)
                for (int64_t e = 0; e < size[n]; e++) l.w[n][e] -= 0.5f * g.w[n][e];
        }
        printf("  %s: loss %.4f -> %.4f, largest difference between heads %.3g -> %.3g\n",
               same ? "identical heads" : "different heads", loss0, loss, before,
               head_spread(&l, E, H, D));
        layer_free(&l);
        layer_free(&g);
    }
    printf("  Identical heads get identical gradients and stay copies of one another (up "
           "to float32 rounding):\n  8 heads are then worth 1. Random initialization (as "
           "PyTorch's) breaks the symmetry from the start.\n");
    return 0;
}

int demo_mha(void) {
    return demo_self() || demo_reshape() || demo_exercise1() || demo_exercise4();
}
