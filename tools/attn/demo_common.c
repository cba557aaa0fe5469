/*
 * demo_common.c — what the sections of `attn demo` share (demo.h): the one forward call
 *                 on small dense tensors, the demo's fixed stream of normal samples, and
 *                 seed 003's section 4 input, drawn where the full demo's stream has it.
 *
 * What it is not: a section of the demo (cli_demo.c, demo_seed003.c, demo_mha.c).
 */
#include <math.h>
#include <stdio.h>

#include "attn.h"
#include "demo.h"
#include "rng.h"

int demo_attend(float *q, float *k, float *v, float *o, int64_t lq, int64_t lk,
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

/* splitmix64, then Box-Muller: a fixed stream of N(0, 1) samples. */
enum { RNG_SEED = 0x5eed0003 };
static rng_t g_rng = {RNG_SEED};
float demo_normal(void) { return (float)rng_gauss(&g_rng); }


/* Seed 003 §4: x (4 tokens, D = 8), Q = x Wq, K = x Wk, V = x Wv, causal attention.
 * The seed draws W from N(0, 1), which makes the logits' spread sqrt(D) times larger
 * than a trained layer's and every row one-hot; here W is N(0, 1/D), the scale of
 * nn.Linear's initialization, so that the weights show the spread the seed prints. The
 * stream starts where seed 000's exercises leave it (3.3 drew 2 * N33 * D33 normals of
 * two uniforms each: the splitmix64 state advances by a constant per uniform). */
void demo_seed003_input(float q[DEMO_T][DEMO_D], float k[DEMO_T][DEMO_D], float v[DEMO_T][DEMO_D]) {
    enum { T = DEMO_T, D = DEMO_D };
    g_rng.s = RNG_SEED + (uint64_t)4 * N33 * D33 * 0x9E3779B97F4A7C15ull;
    float x[T][D], wq[D][D], wk[D][D], wv[D][D];
    for (int t = 0; t < T; t++)
        for (int d = 0; d < D; d++) x[t][d] = demo_normal();
    for (int r = 0; r < D; r++)
        for (int c = 0; c < D; c++)
            wq[r][c] = demo_normal() / sqrtf(D), wk[r][c] = demo_normal() / sqrtf(D),
            wv[r][c] = demo_normal() / sqrtf(D);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < D; c++) {
            q[t][c] = k[t][c] = v[t][c] = 0.0f;
            for (int r = 0; r < D; r++) {
                q[t][c] += x[t][r] * wq[r][c];
                k[t][c] += x[t][r] * wk[r][c];
                v[t][c] += x[t][r] * wv[r][c];
            }
        }
}
