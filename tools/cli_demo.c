/*
 * cli_demo.c — `attn demo`: the textbook's worked examples, every number computed by
 *              the library on built-in data.
 *
 * Seed 000 (chapter 3, "Anatomy: attention"): example 3.2 step by step, then exercises
 * 3.1 to 3.4. Seed 003 §4: a causal self-attention of 4 tokens. The printed digits are
 * the ones the chapters print. Not a test: tests/test_cli.sh checks its output.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "attn.h"
#include "cli.h"
#include "rng.h"

/* One forward call on dense [1, 1, Lq, D] tensors; prints and returns non-zero on error. */
static int demo_attend(float *q, float *k, float *v, float *o, int64_t lq, int64_t lk,
                       int64_t dk, int64_t dv, attn_options *opt) {
    attn_tensor tq = attn_tensor_4d(q, ATTN_F32, 1, 1, lq, dk);
    attn_tensor tk = attn_tensor_4d(k, ATTN_F32, 1, 1, lk, dk);
    attn_tensor tv = attn_tensor_4d(v, ATTN_F32, 1, 1, lk, dv);
    attn_tensor to = attn_tensor_4d(o, ATTN_F32, 1, 1, lq, dv);
    attn_status st = attn_forward(&tq, &tk, &tv, &to, opt);
    if (st != ATTN_OK) {
        fprintf(stderr, "attn: demo: %s: %s\n", attn_status_string(st), attn_last_error());
        return 1;
    }
    return 0;
}

/* The logit of query q against the single key k: with one key, LSE = log(exp(s)) = s. */
static int demo_score(float *q, float *k, int64_t d, const attn_options *base, float *s) {
    float v = 0.0f, o;
    attn_tensor lse = attn_tensor_4d(s, ATTN_F32, 1, 1, 1, 1);
    attn_options opt = *base;
    opt.lse = &lse;
    return demo_attend(q, k, &v, &o, 1, 1, d, 1, &opt);
}

/* splitmix64, then Box-Muller: a fixed stream of N(0, 1) samples. */
static rng_t g_rng = {0x5eed0003};
static float demo_normal(void) { return (float)rng_gauss(&g_rng); }

static int demo_example_3_2(void) {
    float k[4] = {1, 0, 0, 1};   /* k1 = (1, 0), k2 = (0, 1)   */
    float v[4] = {10, 0, 0, 10}; /* v1 = (10, 0), v2 = (0, 10) */
    float q[2] = {2, 0};
    float s[2], a[2], o[2];
    attn_options none = {0};
    printf("Seed 000, example 3.2: keys k1 = (1, 0), k2 = (0, 1); values v1 = (10, 0), "
           "v2 = (0, 10);\n  query q = (2, 0), d_k = 2.\n");
    if (demo_score(q, k, 2, &none, &s[0]) || demo_score(q, k + 2, 2, &none, &s[1])) return 1;
    printf("  scores   q.k1/sqrt(2) = %.3f   q.k2/sqrt(2) = %.3f\n", s[0], s[1]);

    attn_tensor w = attn_tensor_4d(a, ATTN_F32, 1, 1, 1, 2);
    attn_options opt = {.weights = &w};
    if (demo_attend(q, k, v, o, 1, 2, 2, 2, &opt)) return 1;
    printf("  weights  a1 = %.3f   a2 = %.3f\n", a[0], a[1]);
    printf("  output   a1 v1 + a2 v2 = (%.2f, %.2f)\n\n", o[0], o[1]);

    printf("Exercises of seed 000, chapter 3:\n");
    float q0[2] = {0, 0};
    if (demo_attend(q0, k, v, o, 1, 2, 2, 2, &(attn_options){0})) return 1;
    printf("  3.1  query (0, 0): first component of the output = %g\n", o[0]);

    opt = (attn_options){.weights = &w, .has_scale = true, .scale = 1.0f};
    if (demo_attend(q, k, v, o, 1, 2, 2, 2, &opt)) return 1;
    printf("  3.2  without dividing by sqrt(d_k): a1 = %.4f\n", a[0]);

    /* 3.3: the standard deviation of q.k for independent N(0, 1) components, d_k = 64,
     * sampled: each of n pairs is its own batch entry with one key, scale 1, and its
     * LSE is its dot product. */
    enum { N33 = 100000, D33 = 64 };
    float *qs = malloc(sizeof(float) * N33 * D33), *ks = malloc(sizeof(float) * N33 * D33);
    float *dots = malloc(sizeof(float) * N33), *vz = calloc(N33, sizeof(float));
    float *oz = malloc(sizeof(float) * N33);
    if (!qs || !ks || !dots || !vz || !oz) {
        fprintf(stderr, "attn: demo: out of memory\n");
        free(qs), free(ks), free(dots), free(vz), free(oz);
        return 1;
    }
    for (int64_t t = 0; t < (int64_t)N33 * D33; t++) qs[t] = demo_normal(), ks[t] = demo_normal();
    attn_tensor tq = attn_tensor_4d(qs, ATTN_F32, N33, 1, 1, D33);
    attn_tensor tk = attn_tensor_4d(ks, ATTN_F32, N33, 1, 1, D33);
    attn_tensor tv = attn_tensor_4d(vz, ATTN_F32, N33, 1, 1, 1);
    attn_tensor to = attn_tensor_4d(oz, ATTN_F32, N33, 1, 1, 1);
    attn_tensor tl = attn_tensor_4d(dots, ATTN_F32, N33, 1, 1, 1);
    opt = (attn_options){.has_scale = true, .scale = 1.0f, .lse = &tl};
    attn_status st = attn_forward(&tq, &tk, &tv, &to, &opt);
    double sum = 0, sum2 = 0;
    for (int t = 0; t < N33; t++) sum += dots[t], sum2 += (double)dots[t] * dots[t];
    free(qs), free(ks), free(dots), free(vz), free(oz);
    if (st != ATTN_OK) {
        fprintf(stderr, "attn: demo: %s: %s\n", attn_status_string(st), attn_last_error());
        return 1;
    }
    double mean = sum / N33, sd = sqrt(sum2 / N33 - mean * mean);
    printf("  3.3  standard deviation of q.k, d_k = 64: %.1f  (%d sampled pairs; "
           "Theorem 3.3: sqrt(64) = %g)\n", sd, N33, sqrt((double)D33));

    /* 3.4: the reference path materializes the score matrix, so the ratio of its
     * workspace sizes is the ratio of the matrices' element counts. */
    size_t bytes[2];
    for (int c = 0; c < 2; c++) {
        int64_t len = c ? 16384 : 4096;
        attn_tensor a4 = attn_tensor_4d(NULL, ATTN_F32, 1, 1, len, 64);
        opt = (attn_options){.path = ATTN_PATH_REFERENCE};
        st = attn_forward_workspace_size(&a4, &a4, &a4, &a4, &opt, &bytes[c]);
        if (st != ATTN_OK) {
            fprintf(stderr, "attn: demo: %s: %s\n", attn_status_string(st), attn_last_error());
            return 1;
        }
    }
    printf("  3.4  score-matrix elements at 16384 tokens / at 4096 tokens = %g\n\n",
           (double)bytes[1] / (double)bytes[0]);
    return 0;
}

/* Seed 003 §4: x (4 tokens, D = 8), Q = x Wq, K = x Wk, V = x Wv, causal attention.
 * The seed draws W from N(0, 1), which makes the logits' spread sqrt(D) times larger
 * than a trained layer's and every row one-hot; here W is N(0, 1/D), the scale of
 * nn.Linear's initialization, so that the weights show the spread the seed prints. */
static int demo_causal(void) {
    enum { T = 4, D = 8 };
    float x[T][D], wq[D][D], wk[D][D], wv[D][D], q[T][D] = {{0}}, k[T][D] = {{0}},
                                                 v[T][D] = {{0}}, o[T][D], a[T][T];
    for (int t = 0; t < T; t++)
        for (int d = 0; d < D; d++) x[t][d] = demo_normal();
    for (int r = 0; r < D; r++)
        for (int c = 0; c < D; c++)
            wq[r][c] = demo_normal() / sqrtf(D), wk[r][c] = demo_normal() / sqrtf(D),
            wv[r][c] = demo_normal() / sqrtf(D);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < D; c++)
            for (int r = 0; r < D; r++) {
                q[t][c] += x[t][r] * wq[r][c];
                k[t][c] += x[t][r] * wk[r][c];
                v[t][c] += x[t][r] * wv[r][c];
            }
    attn_tensor w = attn_tensor_4d(a, ATTN_F32, 1, 1, T, T);
    attn_options opt = {.causal = true, .weights = &w};
    if (demo_attend(&q[0][0], &k[0][0], &v[0][0], &o[0][0], T, T, D, D, &opt)) return 1;
    printf("Seed 003 section 4: causal self-attention of %d tokens (D = %d, random x and "
           "projections, W ~ N(0, 1/D)):\n", T, D);
    for (int i = 0; i < T; i++) {
        printf("  attention weights row %d: [", i);
        for (int j = 0; j < T; j++) printf("%s%.2f", j ? ", " : "", a[i][j]);
        printf("]\n");
    }
    printf("  Row i sees only positions 0..i: the weights are lower-triangular and each row "
           "sums to 1.\n");
    return 0;
}

int cli_demo(int argc, char **argv) {
    (void)argv;
    if (argc > 1) {
        fprintf(stderr, "attn: demo takes no arguments\n");
        return 2;
    }
    printf("attn %s demo (kernel: %s)\n\n", attn_version(), attn_kernel_name());
    if (demo_example_3_2()) return 1;
    if (demo_causal()) return 1;
    printf("\n");
    return demo_mha();
}
