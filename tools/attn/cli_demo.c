/*
 * cli_demo.c — `attn demo`: the textbook's worked examples, every number computed by
 *              the library on built-in data.
 *
 * Seed 000 (chapter 3, "Anatomy: attention"): example 3.2 step by step, then exercises
 * 3.1 to 3.5. Seed 003 §4: a causal self-attention of 4 tokens. The printed digits are
 * the ones the chapters print. Not a test: tests/test_cli.sh checks its output.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "cli.h"
#include "cli_files.h"
#include "demo.h"
#include "heatmap.h"
#include "rng.h"

/* The logit of query q against the single key k: with one key, LSE = log(exp(s)) = s. */
static int demo_score(float *q, float *k, int64_t d, const attn_options *base, float *s) {
    float v = 0.0f, o;
    attn_tensor lse = attn_tensor_4d(s, ATTN_F32, 1, 1, 1, 1);
    attn_options opt = *base;
    opt.lse = &lse;
    return demo_attend(q, k, &v, &o, 1, 1, d, 1, &opt);
}



/* 3.5: softmax(s + c) = softmax(s). The scores are a bias on a zero query (Dk = 1, so
 * every logit is its bias), the same row at c = 0 and c = 1000: the library's weights
 * must agree, its LSE move by c, and exp(1000) computed naively overflows (float32 and
 * float64 alike) where the library subtracts the row's maximum, e^0 = 1, first. */
static int demo_exercise_3_5(void) {
    enum { N = 3 };
    const float base[N] = {0.0f, -1.0f, -2.0f}, shift = 1000.0f;
    float zq = 0.0f, zk[N] = {0}, v[N] = {1, 2, 3}, o[2], lse[2], w[2][N], bias[2][N];
    for (int c = 0; c < 2; c++) {
        for (int j = 0; j < N; j++) bias[c][j] = base[j] + (c ? shift : 0.0f);
        attn_tensor tb = attn_tensor_4d(bias[c], ATTN_F32, 1, 1, 1, N);
        attn_tensor tw = attn_tensor_4d(w[c], ATTN_F32, 1, 1, 1, N);
        attn_tensor tl = attn_tensor_4d(&lse[c], ATTN_F32, 1, 1, 1, 1);
        attn_options opt = {.bias = &tb, .weights = &tw, .lse = &tl};
        if (demo_attend(&zq, zk, v, &o[c], 1, N, 1, 1, &opt)) return 1;
    }
    float diff = 0.0f;
    for (int j = 0; j < N; j++) diff = fmaxf(diff, fabsf(w[1][j] - w[0][j]));
    /* the naive softmax of the shifted row: exp before any subtraction */
    volatile float big = bias[1][0];
    volatile double bigd = bias[1][0];
    const float naive_f = expf(big);
    const double naive_d = exp(bigd);
    printf("  3.5  softmax(s + c) = softmax(s): scores s = (0, -1, -2), c = 1000:\n"
           "         weights of s     [%.4f, %.4f, %.4f]   LSE %.4f\n"
           "         weights of s + c [%.4f, %.4f, %.4f]   LSE %.4f (moved by %.0f)\n"
           "         max |difference| = %g; naive exp(1000) = %g in float32, %g in float64\n"
           "         (e^1000 overflows: the library subtracts each row's running maximum, so\n"
           "         its largest exponential is e^0 = 1, and a -inf logit gives e^-inf = 0)\n\n",
           w[0][0], w[0][1], w[0][2], lse[0], w[1][0], w[1][1], w[1][2], lse[1],
           (double)(lse[1] - lse[0]), diff, naive_f, naive_d);
    return 0;
}

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
    printf("  3.4  score-matrix elements at 16384 tokens / at 4096 tokens = %g\n",
           (double)bytes[1] / (double)bytes[0]);
    return demo_exercise_3_5();
}


static int demo_causal(const char *png) {
    enum { T = DEMO_T, D = DEMO_D };
    float q[T][D], k[T][D], v[T][D], o[T][D], a[T][T];
    demo_seed003_input(q, k, v);
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
    if (!png) return 0;
    /* the picture: masked entries (j > i) as -inf, so that they are drawn as masked */
    float cells[T][T];
    for (int i = 0; i < T; i++)
        for (int j = 0; j < T; j++) cells[i][j] = j > i ? -INFINITY : a[i][j];
    static const char *const tok[T] = {"x0", "x1", "x2", "x3"};
    const heat_panel panel = {&cells[0][0], NULL};
    const heat_spec spec = {.title = "seed 003 section 4: causal self-attention, 4 tokens",
                            .panels = &panel, .n_panels = 1, .rows = T, .cols = T, .vmax = 1.0,
                            .scale_label = "weight", .row_labels = tok, .col_labels = tok,
                            .numbers = 1};
    char err[256];
    if (heat_png(png, &spec, err, sizeof err)) {
        fprintf(stderr, "attn: demo: %s\n", err);
        return 1;
    }
    printf("  (picture: %s)\n", png);
    return 0;
}

static const char DEMO_USAGE[] =
    "usage: attn demo [--section NAME] [--png FILE] [--tokens N,N...]\n"
    "\n"
    "  Without --section: seed 000's example and exercises, and seed 003's causal example.\n"
    "  --section seed000    seed 000, example 3.2 and exercises 3.1-3.5\n"
    "            causal     seed 003 section 4 (--png FILE also draws it)\n"
    "            sdpa       seed 003 section 5: fused against the float64 reference\n"
    "            ex1        seed 003 exercise 1: B = 2, T = 8, D = 16, shapes and row sums\n"
    "            ex4        seed 003 exercise 4: 8 heads with the same weights\n"
    "            ex5        seed 003 exercise 5: peak memory and time of the fused call\n"
    "                       (--tokens, default 10000; 100000 takes minutes)\n"
    "            pitfalls   seed 003 section 7, the six pitfalls, run\n"
    "            compare    seed 002: dot-product, additive and multi-head attention\n"
    "            all        every section (ex5 at --tokens)\n"
    "  (seed 003 exercise 2: attn dtypes; exercise 3: attn train)\n";

/* "10000,100000" into at most 8 sizes */
static int parse_tokens(const char *s, int64_t *out, int *n) {
    *n = 0;
    while (*s && *n < 8) {
        char *end;
        const long long x = strtoll(s, &end, 10);
        if (end == s || x < 1 || x > 10000000 || (*end && *end != ',')) return -1;
        out[(*n)++] = x;
        s = *end ? end + 1 : end;
    }
    return *s ? -1 : 0;
}

int cli_demo(int argc, char **argv) {
    const char *section = NULL, *png = NULL, *tokens = NULL;
    for (int i = 1; i < argc; i++) {
        const char **slot = strcmp(argv[i], "--section") == 0 ? &section
                            : strcmp(argv[i], "--png") == 0   ? &png
                            : strcmp(argv[i], "--tokens") == 0 ? &tokens
                                                               : NULL;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(DEMO_USAGE, stdout);
            return 0;
        }
        if (!slot || i + 1 >= argc) {
            fprintf(stderr, "attn: demo: unknown or incomplete option '%s' (see 'attn demo --help')\n",
                    argv[i]);
            return 2;
        }
        *slot = argv[++i];
    }
    char ferr[512];  // the picture's path refused before any section runs
    const int x = png ? cli_files_check_one("--png", png, ferr, sizeof ferr) : 0;
    if (x) return fprintf(stderr, "attn: demo: %s\n", ferr), x == -2 ? 2 : 1;
    int64_t sizes[8] = {10000};
    int nsizes = 1;
    if (tokens && parse_tokens(tokens, sizes, &nsizes)) {
        fprintf(stderr, "attn: demo: --tokens: expected sizes 1..10000000 separated by commas, "
                "got '%s'\n", tokens);
        return 2;
    }
    static const char *const names[] = {"seed000", "causal", "sdpa", "ex1", "ex4",
                                        "ex5", "pitfalls", "compare", "all"};
    int which = -1;
    for (int s = 0; section && s < (int)(sizeof names / sizeof names[0]); s++)
        if (strcmp(section, names[s]) == 0) which = s;
    if (section && which < 0) {
        fprintf(stderr, "attn: demo: --section: unknown section '%s' (see 'attn demo --help')\n",
                section);
        return 2;
    }
    printf("attn %s demo (kernel: %s)\n\n", attn_version(), attn_kernel_name());
    const bool all = which == 8, plain = which < 0;
    if ((plain || all || which == 0) && demo_example_3_2()) return 1;
    if ((plain || all || which == 1) && demo_causal(png)) return 1;
    if (plain) {
        printf("\n");
        if (demo_mha()) return 1;
        printf("\nMore sections: attn demo --section sdpa|ex1|ex4|ex5|pitfalls|compare|all "
               "(attn demo --help)\n");
        return 0;
    }
    if ((all || which == 2) && demo_sdpa()) return 1;
    if ((all || which == 3) && demo_exercise1()) return 1;
    if ((all || which == 4) && demo_exercise4()) return 1;
    if ((all || which == 5) && demo_exercise5(sizes, nsizes)) return 1;
    if ((all || which == 6) && demo_pitfalls()) return 1;
    if ((all || which == 7) && demo_compare()) return 1;
    return 0;
}
