/*
 * demo_seed003.c — the sections of `attn demo` beyond seed 000 and seed 003's §4: §5 (the
 *                  fused call against the float64 reference), exercises 1, 4 and 5 (5
 *                  measured: peak resident set and time of the fused call inside this
 *                  process, getrusage and a monotonic clock), the six pitfalls of §7, each
 *                  run, and seed 002's comparison row by row.
 *
 * Every number is computed by the library on data drawn from the demo's fixed stream
 * (demo.h). Projections go through the BLAS door (ai_gemm_f32). What it is not: a
 * benchmark (attn bench) or a test (tests/test_viz.sh runs the small sections).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "attn.h"
#include "core/blas.h"
#include "demo.h"
#include "core/half.h"
#include "rng.h"

static double demo_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The peak resident set of this process so far, in MiB (Linux: ru_maxrss in KiB). */
static double demo_peak_mib(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return (double)r.ru_maxrss / 1024.0;
}

static int demo_fail(attn_status st) {
    fprintf(stderr, "attn: demo: %s: %s\n", attn_status_string(st), attn_last_error());
    return 1;
}

static void demo_fill(float *x, int64_t n, float scale) {
    for (int64_t e = 0; e < n; e++) x[e] = demo_normal() * scale;
}

/* ---- §5: the one-line call against the hand-written one ---------------------------- */

int demo_sdpa(void) {
    enum { T = DEMO_T, D = DEMO_D };
    float q[T][D], k[T][D], v[T][D], of[T][D], orf[T][D];
    demo_seed003_input(q, k, v);
    attn_options opt = {.causal = true};
    if (demo_attend(&q[0][0], &k[0][0], &v[0][0], &of[0][0], T, T, D, D, &opt)) return 1;
    opt.path = ATTN_PATH_REFERENCE;
    if (demo_attend(&q[0][0], &k[0][0], &v[0][0], &orf[0][0], T, T, D, D, &opt)) return 1;
    double worst = 0;
    for (int i = 0; i < T; i++)
        for (int d = 0; d < D; d++)
            if (fabs((double)of[i][d] - orf[i][d]) > worst) worst = fabs((double)of[i][d] - orf[i][d]);
    printf("\nSeed 003 section 5: the fused call (what F.scaled_dot_product_attention would do)\n"
           "  against the float64 reference path (the hand-written five lines), section 4's input:\n"
           "  max abs diff: %.3g   (the seed: \"1e-6 level\"; PyTorch is not installed here, so\n"
           "  the library's float64 path stands in for the manual version)\n", worst);
    return 0;
}

/* ---- exercise 1: B = 2, T = 8, D = 16 ------------------------------------------------ */

/* y (n, d) = x (n, d) w (d, d) through the BLAS */
static int demo_project(const float *x, const float *w, float *y, int64_t n, int64_t d) {
    attn_status st = ai_gemm_f32(false, false, n, d, d, 1.0f, x, d, w, d, 0.0f, y, d);
    return st == ATTN_OK ? 0 : demo_fail(st);
}

int demo_exercise1(void) {
    enum { B = 2, T = 8, D = 16 };
    float x[B * T * D], w[3][D * D], qkv[3][B * T * D], o[B * T * D], a[B * T * T];
    demo_fill(x, B * T * D, 1.0f);
    for (int m = 0; m < 3; m++) demo_fill(w[m], D * D, 1.0f / sqrtf(D));
    for (int m = 0; m < 3; m++)
        if (demo_project(x, w[m], qkv[m], B * T, D)) return 1;
    attn_tensor tq = attn_tensor_4d(qkv[0], ATTN_F32, B, 1, T, D);
    attn_tensor tk = attn_tensor_4d(qkv[1], ATTN_F32, B, 1, T, D);
    attn_tensor tv = attn_tensor_4d(qkv[2], ATTN_F32, B, 1, T, D);
    attn_tensor to = attn_tensor_4d(o, ATTN_F32, B, 1, T, D);
    attn_tensor tw = attn_tensor_4d(a, ATTN_F32, B, 1, T, T);
    attn_options opt = {.causal = true, .weights = &tw};
    attn_status st = attn_forward(&tq, &tk, &tv, &to, &opt);
    if (st != ATTN_OK) return demo_fail(st);
    double worst = 0;
    int upper = 0;
    for (int r = 0; r < B * T; r++) {
        double sum = 0;
        for (int j = 0; j < T; j++) {
            sum += a[r * T + j];
            upper += j > r % T && a[r * T + j] != 0.0f;
        }
        if (fabs(sum - 1) > worst) worst = fabs(sum - 1);
    }
    printf("\nSeed 003 exercise 1: B = %d, T = %d, D = %d, causal:\n"
           "  attn shape [%d, 1, %d, %d] (one head), output shape [%d, 1, %d, %d]\n"
           "  max |attn.sum(-1) - 1| over all %d rows = %.3g; nonzero weights above the "
           "diagonal: %d\n", B, T, D, B, T, T, B, T, D, B * T, worst, upper);
    return 0;
}

/* ---- exercise 4: eight heads with one initialization ----------------------------------- */

int demo_exercise4(void) {
    enum { T = 6, DM = 64, H = 8, HD = DM / H };
    float x[T * DM], w[2][DM * DM], q[T * DM], k[T * DM], v[T * DM], o[T * DM], a[H * T * T];
    demo_fill(x, T * DM, 1.0f);
    demo_fill(w[0], DM * DM, 1.0f / sqrtf(DM));
    demo_fill(w[1], DM * DM, 1.0f / sqrtf(DM));
    printf("\nSeed 003 exercise 4: %d heads of %d over d_model = %d, T = %d, causal:\n", H, HD, DM, T);
    for (int same = 1; same >= 0; same--) {
        float wq[DM * DM], wk[DM * DM];
        memcpy(wq, w[0], sizeof wq);
        memcpy(wk, w[1], sizeof wk);
        if (same)  // every head's columns of Wq and Wk copied from head 0's
            for (int r = 0; r < DM; r++)
                for (int h = 1; h < H; h++)
                    for (int c = 0; c < HD; c++) {
                        wq[r * DM + h * HD + c] = wq[r * DM + c];
                        wk[r * DM + h * HD + c] = wk[r * DM + c];
                    }
        if (demo_project(x, wq, q, T, DM) || demo_project(x, wk, k, T, DM) ||
            demo_project(x, wk, v, T, DM))
            return 1;
        /* (T, H, HD) storage read as [1, H, T, HD]: the split of §6 as strides, no copy */
        const attn_tensor split = {NULL, ATTN_F32, {1, H, T, HD}, {T * DM, HD, DM, 1}};
        attn_tensor tq = split, tk = split, tv = split, to = split;
        tq.data = q, tk.data = k, tv.data = v, to.data = o;
        attn_tensor tw = attn_tensor_4d(a, ATTN_F32, 1, H, T, T);
        attn_options opt = {.causal = true, .weights = &tw};
        attn_status st = attn_forward(&tq, &tk, &tv, &to, &opt);
        if (st != ATTN_OK) return demo_fail(st);
        double spread = 0;
        for (int h = 1; h < H; h++)
            for (int e = 0; e < T * T; e++)
                if (fabs((double)a[h * T * T + e] - a[e]) > spread) spread = fabs((double)a[h * T * T + e] - a[e]);
        printf("  %s: max |weights of head h - weights of head 0| = %.3g\n",
               same ? "every head initialized alike  " : "each head drawn independently", spread);
    }
    printf("  Alike, the heads compute the same function, get the same gradient and stay alike:\n"
           "  eight heads are one. PyTorch's default initialization draws every weight\n"
           "  independently (nn.Linear's uniform bound 1/sqrt(fan_in)), so the heads differ from\n"
           "  the first step.\n");
    return 0;
}

/* ---- exercise 5: 10K and 100K tokens, measured ----------------------------------------- */

int demo_exercise5(const int64_t *tokens, int n) {
    enum { D = 64 };
    printf("\nSeed 003 exercise 5: the fused call at long lengths (D = %d, causal, one head,\n"
           "  float32), peak resident set (getrusage) and wall time inside this process:\n", D);
    for (int c = 0; c < n; c++) {
        const int64_t L = tokens[c];
        const double before = demo_peak_mib();
        float *x[4];
        for (int m = 0; m < 4; m++) x[m] = malloc((size_t)(L * D) * sizeof(float));
        if (!x[0] || !x[1] || !x[2] || !x[3]) {
            for (int m = 0; m < 4; m++) free(x[m]);
            fprintf(stderr, "attn: demo: out of memory for %lld tokens\n", (long long)L);
            return 1;
        }
        for (int m = 0; m < 3; m++) demo_fill(x[m], L * D, 1.0f);
        memset(x[3], 0, (size_t)(L * D) * sizeof(float));  // O: resident before the call
        attn_tensor t[4];
        for (int m = 0; m < 4; m++) t[m] = attn_tensor_4d(x[m], ATTN_F32, 1, 1, L, D);
        attn_options opt = {.causal = true};
        size_t ws = 0;
        attn_forward_workspace_size(&t[0], &t[1], &t[2], &t[3], &opt, &ws);
        const double t0 = demo_now();
        attn_status st = attn_forward(&t[0], &t[1], &t[2], &t[3], &opt);
        const double secs = demo_now() - t0, peak = demo_peak_mib();
        for (int m = 0; m < 4; m++) free(x[m]);
        if (st != ATTN_OK) return demo_fail(st);
        const double io = 4.0 * (double)L * D * 4 / 1048576.0, scores = (double)L * (double)L;
        printf("  %lld tokens: %.2f s; peak resident set %.1f MiB (%.1f MiB before the inputs, "
               "Q, K, V, O %.1f MiB, workspace %.2f MiB)\n"
               "    the score matrix it never forms: %.3g elements = %.0f MB in float32, %.0f MB "
               "in float64\n", (long long)L, secs, peak, before, io, (double)ws / 1048576.0,
               scores, scores * 4 / 1e6, scores * 8 / 1e6);
    }
    printf("  (The seed's 100 MB and 10 GB are the element counts, 1e8 and 1e10, at a byte each;\n"
           "  float32 needs four times that.) FlashAttention never materializes the score matrix:\n"
           "  it walks K and V in tiles, keeps for each query row a running maximum, a running sum\n"
           "  of exponentials and an unnormalized output, rescales them when the maximum grows,\n"
           "  and divides once at the end — exact softmax, with memory linear in the sequence and\n"
           "  tiles sized for the cache, so the time is the O(n^2) arithmetic and nothing else.\n");
    return 0;
}

/* ---- §7: the six pitfalls, run ------------------------------------------------------ */

/* the mean largest weight of the rows, and the share of rows with a weight above 0.9 */
static int demo_saturation(float *q, float *k, float *v, int64_t lq, int64_t lk, int64_t d,
                           float scale, bool has_scale, double *mean_max, double *share) {
    float *o = malloc((size_t)(lq * d) * sizeof(float)), *w = malloc((size_t)(lq * lk) * sizeof(float));
    if (!o || !w) {
        free(o), free(w);
        fprintf(stderr, "attn: demo: out of memory\n");
        return 1;
    }
    attn_tensor tw = attn_tensor_4d(w, ATTN_F32, 1, 1, lq, lk);
    attn_options opt = {.weights = &tw, .has_scale = has_scale, .scale = scale};
    int rc = demo_attend(q, k, v, o, lq, lk, d, d, &opt);
    *mean_max = *share = 0;
    for (int64_t i = 0; !rc && i < lq; i++) {
        float m = 0;
        for (int64_t j = 0; j < lk; j++) m = w[i * lk + j] > m ? w[i * lk + j] : m;
        *mean_max += m / (double)lq;
        *share += (m > 0.9f) / (double)lq;
    }
    free(o), free(w);
    return rc;
}

static int demo_pitfall_scale(void) {
    enum { L = 256, D = 64 };
    float *q = malloc(sizeof(float) * L * D), *k = malloc(sizeof(float) * L * D),
          *v = malloc(sizeof(float) * L * D);
    int rc = !q || !k || !v;
    double mm[2], sh[2];
    if (!rc) {
        demo_fill(q, L * D, 1.0f), demo_fill(k, L * D, 1.0f), demo_fill(v, L * D, 1.0f);
        rc = demo_saturation(q, k, v, L, L, D, 0, false, &mm[0], &sh[0]) ||
             demo_saturation(q, k, v, L, L, D, 1.0f, true, &mm[1], &sh[1]);
    }
    free(q), free(k), free(v);
    if (rc) return 1;
    printf("  1. forgetting sqrt(d_k), d_k = %d, %d keys, q and k ~ N(0, 1):\n"
           "     with 1/sqrt(d_k): mean largest weight %.2f, rows with a weight > 0.9: %.0f%%\n"
           "     without:          mean largest weight %.2f, rows with a weight > 0.9: %.0f%%\n"
           "     (the logits' spread grows from 1 to sqrt(64) = 8: softmax saturates, gradients vanish)\n",
           D, L, mm[0], 100 * sh[0], mm[1], 100 * sh[1]);
    return 0;
}

static int demo_pitfall_mask_shape(void) {
    enum { T = DEMO_T, D = DEMO_D };
    float q[T][D], k[T][D], v[T][D], o[T][D];
    demo_seed003_input(q, k, v);
    uint8_t m[T * (T - 1)];
    memset(m, 1, sizeof m);
    attn_tensor tm = attn_tensor_4d(m, ATTN_BOOL, 1, 1, T, T - 1);  // (T, T-1): one key short
    attn_options opt = {.mask = &tm};
    attn_tensor tq = attn_tensor_4d(q, ATTN_F32, 1, 1, T, D), tk = attn_tensor_4d(k, ATTN_F32, 1, 1, T, D);
    attn_tensor tv = attn_tensor_4d(v, ATTN_F32, 1, 1, T, D), to = attn_tensor_4d(o, ATTN_F32, 1, 1, T, D);
    attn_status st = attn_forward(&tq, &tk, &tv, &to, &opt);
    printf("  2. a mask of the wrong shape, (4, 3) for 4 x 4 scores: %s\n"
           "     \"%s\" (attn run says which file and dimension, e.g. \"m.npy: shape [4,3] does\n"
           "     not broadcast to [B, Hq, Lq, Lk] = [1,1,4,4] (its dimension 1 is 3)\")\n",
           attn_status_string(st), attn_last_error());
    return st == ATTN_ERR_MASK ? 0 : 1;
}

static int demo_pitfall_zero_mask(void) {
    enum { T = DEMO_T, D = DEMO_D };
    float q[T][D], k[T][D], v[T][D], o[T][D], w[2][T][T], bias[2][T][T];
    demo_seed003_input(q, k, v);
    for (int i = 0; i < T; i++)
        for (int j = 0; j < T; j++) {
            bias[0][i][j] = j > i ? 1.0f : 0.0f;        // triu(diagonal=1) as float: 0 / 1
            bias[1][i][j] = j > i ? -INFINITY : 0.0f;   // what was meant
        }
    for (int c = 0; c < 2; c++) {
        attn_tensor tb = attn_tensor_4d(bias[c], ATTN_F32, 1, 1, T, T), tw = attn_tensor_4d(w[c], ATTN_F32, 1, 1, T, T);
        attn_options opt = {.bias = &tb, .weights = &tw};
        if (demo_attend(&q[0][0], &k[0][0], &v[0][0], &o[0][0], T, T, D, D, &opt)) return 1;
    }
    printf("  3. 0 instead of -inf: the causal mask as a float of 0s and 1s is added, masks nothing:\n"
           "     row 0 with the 0/1 float mask: [%.2f, %.2f, %.2f, %.2f]   with -inf: [%.2f, %.2f, "
           "%.2f, %.2f]\n     (attn run and attn viz warn on stderr for a float mask of only 0s "
           "and 1s)\n", w[0][0][0], w[0][0][1], w[0][0][2], w[0][0][3], w[1][0][0], w[1][0][1],
           w[1][0][2], w[1][0][3]);
    return 0;
}

/* median of 5 timed calls, in ms */
static double demo_time_ms(const attn_tensor *t, const attn_options *opt) {
    double best[5];
    for (int r = 0; r < 5; r++) {
        const double t0 = demo_now();
        attn_forward(&t[0], &t[1], &t[2], &t[3], opt);
        best[r] = 1e3 * (demo_now() - t0);
    }
    for (int a = 1; a < 5; a++)
        for (int b = a; b > 0 && best[b] < best[b - 1]; b--) {
            const double x = best[b];
            best[b] = best[b - 1], best[b - 1] = x;
        }
    return best[2];
}

static int demo_pitfall_mask_dtype(void) {
    enum { L = 1024, D = 64 };
    uint16_t *h[4];
    float *bias = malloc(sizeof(float) * L * L);
    uint8_t *m = malloc((size_t)L * L);
    int rc = !bias || !m;
    for (int x = 0; x < 4; x++) rc |= !(h[x] = malloc(sizeof(uint16_t) * L * D));
    if (rc) {
        for (int x = 0; x < 4; x++) free(h[x]);
        free(bias), free(m);
        fprintf(stderr, "attn: demo: out of memory\n");
        return 1;
    }
    for (int x = 0; x < 3; x++)  // float16 inputs, rounded to nearest even
        for (int64_t e = 0; e < (int64_t)L * D; e++) attn_store(ATTN_F16, h[x], e, demo_normal());
    for (int64_t e = 0; e < (int64_t)L * L; e++) {
        m[e] = (e % L) % 7 != 3;
        bias[e] = m[e] ? 0.0f : -INFINITY;
    }
    attn_tensor t[4];
    for (int x = 0; x < 4; x++) t[x] = attn_tensor_4d(h[x], ATTN_F16, 1, 1, L, D);
    attn_tensor tb = attn_tensor_4d(bias, ATTN_F32, 1, 1, L, L), tm = attn_tensor_4d(m, ATTN_BOOL, 1, 1, L, L);
    attn_options none = {0}, with_bias = {.bias = &tb}, with_mask = {.mask = &tm};
    size_t ws[2];
    attn_forward_workspace_size(&t[0], &t[1], &t[2], &t[3], &none, &ws[0]);
    attn_forward_workspace_size(&t[0], &t[1], &t[2], &t[3], &with_bias, &ws[1]);
    const double ms_none = demo_time_ms(t, &none), ms_bias = demo_time_ms(t, &with_bias),
                 ms_mask = demo_time_ms(t, &with_mask);
    for (int x = 0; x < 4; x++) free(h[x]);
    free(bias), free(m);
    printf("  4. a mask dtype other than Q's: float16 Q, K, V (%d x %d) with a float32 mask\n"
           "     (a -inf bias of %zu bytes): workspace %zu bytes, %zu more than without a mask\n"
           "     (the mask's structure summary, docs/CONTRACT.md): the mask is read in place,\n"
           "     nothing is cast or copied. Median of 5 calls: float32 bias %.2f ms,\n"
           "     bool mask of the same keys %.2f ms, no mask %.2f ms (the difference is the\n"
           "     per-logit read and add, not a conversion)\n", L, D,
           (size_t)L * L * sizeof(float), ws[1], ws[1] - ws[0], ms_bias, ms_mask, ms_none);
    return 0;
}

static int demo_pitfall_causal_and_mask(void) {
    enum { T = DEMO_T, D = DEMO_D };
    float q[T][D], k[T][D], v[T][D], o[T][D], w[T][T];
    demo_seed003_input(q, k, v);
    uint8_t m[T] = {0, 1, 1, 1};  // key 0 hidden from every row, broadcast as (1, T)
    attn_tensor tm = {m, ATTN_BOOL, {1, 1, T, T}, {0, 0, 0, 1}}, tw = attn_tensor_4d(w, ATTN_F32, 1, 1, T, T);
    attn_options opt = {.causal = true, .mask = &tm, .weights = &tw};
    if (demo_attend(&q[0][0], &k[0][0], &v[0][0], &o[0][0], T, T, D, D, &opt)) return 1;
    printf("  5. is_causal together with a mask hiding key 0: attn applies both, once each:\n"
           "     row 2: [%.2f, %.2f, %.2f, %.2f]   row 3: [%.2f, %.2f, %.2f, %.2f]\n"
           "     (row 0 sees nothing left: its weights are all 0 and its output 0, not NaN)\n",
           w[2][0], w[2][1], w[2][2], w[2][3], w[3][0], w[3][1], w[3][2], w[3][3]);
    return 0;
}

static int demo_pitfall_transpose(void) {
    enum { T = DEMO_T, D = DEMO_D };
    float q[T][D], k[T][D], v[T][D], o[2][T][D], kt[D][T];
    demo_seed003_input(q, k, v);
    for (int j = 0; j < T; j++)
        for (int d = 0; d < D; d++) kt[d][j] = k[j][d];  // K stored as its transpose
    attn_tensor tq = attn_tensor_4d(q, ATTN_F32, 1, 1, T, D), tv = attn_tensor_4d(v, ATTN_F32, 1, 1, T, D);
    attn_tensor tk = attn_tensor_4d(k, ATTN_F32, 1, 1, T, D);
    attn_tensor tkt = {kt, ATTN_F32, {1, 1, T, D}, {D * T, D * T, 1, T}};  // (T, D) view of Kᵀ
    attn_options opt = {.causal = true};
    attn_tensor to0 = attn_tensor_4d(o[0], ATTN_F32, 1, 1, T, D), to1 = attn_tensor_4d(o[1], ATTN_F32, 1, 1, T, D);
    attn_status st = attn_forward(&tq, &tk, &tv, &to0, &opt);
    if (st == ATTN_OK) st = attn_forward(&tq, &tkt, &tv, &to1, &opt);
    if (st != ATTN_OK) return demo_fail(st);
    double worst = 0;
    for (int i = 0; i < T; i++)
        for (int d = 0; d < D; d++) worst = fmax(worst, fabs((double)o[0][i][d] - o[1][i][d]));
    printf("  6. .T vs transpose(-2, -1): attn takes K as a strided view, so K stored transposed\n"
           "     (strides (1, T) instead of (D, 1)) is read in place: max |O - O_transposed| = %g.\n"
           "     The shapes say which axes are which; no .T can reverse a batch axis by mistake.\n",
           worst);
    return 0;
}

int demo_pitfalls(void) {
    printf("\nSeed 003 section 7, the six pitfalls, run:\n");
    return demo_pitfall_scale() || demo_pitfall_mask_shape() || demo_pitfall_zero_mask() ||
           demo_pitfall_mask_dtype() || demo_pitfall_causal_and_mask() || demo_pitfall_transpose();
}

/* ---- seed 002: dot-product, additive, multi-head --------------------------------------- */

int demo_compare(void) {
    enum { T = DEMO_T, D = DEMO_D, A = 8, H = 2 };
    float q[T][D], k[T][D], v[T][D], o[T][D], w[T][T];
    demo_seed003_input(q, k, v);
    attn_tensor tw = attn_tensor_4d(w, ATTN_F32, 1, 1, T, T);
    attn_options opt = {.weights = &tw};
    if (demo_attend(&q[0][0], &k[0][0], &v[0][0], &o[0][0], T, T, D, D, &opt)) return 1;
    printf("\nSeed 002: three attentions on section 4's input (4 tokens, D = 8, no mask):\n"
           "  scaled dot-product  row 0 weights [%.2f, %.2f, %.2f, %.2f], O[0][0] = %.4f\n",
           w[0][0], w[0][1], w[0][2], w[0][3], o[0][0]);

    /* the random weights below from a stream of their own: the same numbers whichever
     * sections ran before */
    rng_t rs = {0x5eed0002};
    /* additive: e_ij = v . tanh(q_i W + k_j U), with W, U, v drawn once (A = 8 units) */
    float W[D][A], U[D][A], va[A], oa[T][D], wa[T][T];
    for (int r = 0; r < D; r++)
        for (int c = 0; c < A; c++) W[r][c] = (float)rng_gauss(&rs) / 3.0f, U[r][c] = (float)rng_gauss(&rs) / 3.0f;
    for (int c = 0; c < A; c++) va[c] = (float)rng_gauss(&rs);
    const attn_additive_weights aw = {A, &W[0][0], &U[0][0], va, NULL, false, 0.0f};
    attn_tensor tq = attn_tensor_4d(q, ATTN_F32, 1, 1, T, D), tk = attn_tensor_4d(k, ATTN_F32, 1, 1, T, D);
    attn_tensor tv = attn_tensor_4d(v, ATTN_F32, 1, 1, T, D), to = attn_tensor_4d(oa, ATTN_F32, 1, 1, T, D);
    attn_tensor twa = attn_tensor_4d(wa, ATTN_F32, 1, 1, T, T);
    attn_status st = attn_additive_forward(&tq, &tk, &tv, &aw, &to, &(attn_options){.weights = &twa});
    if (st != ATTN_OK) return fprintf(stderr, "attn: demo: additive: %s\n", attn_last_error()), 1;
    printf("  additive (Bahdanau) row 0 weights [%.2f, %.2f, %.2f, %.2f], O[0][0] = %.4f\n"
           "                      (v . tanh(q W + k U), %d units, random W, U, v)\n",
           wa[0][0], wa[0][1], wa[0][2], wa[0][3], oa[0][0], A);

    /* multi-head self-attention on the rows of q: W_Q, W_K, W_V, W_O drawn once, 2 heads
     * of 4; the weights averaged over the heads */
    float wm[4][D][D], y[T][D], wh[T][T];
    attn_tensor wt[4];
    for (int m = 0; m < 4; m++) {
        for (int r = 0; r < D; r++)
            for (int c = 0; c < D; c++) wm[m][r][c] = (float)rng_gauss(&rs) / sqrtf(D);
        wt[m] = attn_tensor_4d(&wm[m][0][0], ATTN_F32, D, D, 1, 1);
    }
    const attn_mha mha = {H, H, &wt[0], &wt[1], &wt[2], &wt[3], NULL, NULL, NULL, NULL, {0}};
    attn_tensor tx = attn_tensor_4d(q, ATTN_F32, 1, T, D, 1), ty = attn_tensor_4d(y, ATTN_F32, 1, T, D, 1);
    attn_tensor twh = attn_tensor_4d(wh, ATTN_F32, 1, 1, T, T);
    st = attn_mha_forward(&mha, &tx, NULL, &ty, &twh, true, &(attn_options){0});
    if (st != ATTN_OK) return fprintf(stderr, "attn: demo: multi-head: %s\n", attn_last_error()), 1;
    printf("  multi-head          row 0 weights [%.2f, %.2f, %.2f, %.2f] (mean of %d heads),\n"
           "                      y[0][0] = %.4f (self-attention on Q's rows, W_Q W_K W_V W_O random)\n",
           wh[0][0], wh[0][1], wh[0][2], wh[0][3], H, y[0][0]);
    return 0;
}
