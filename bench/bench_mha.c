/*
 * bench_mha.c — `attn bench-mha`: the multi-head module's speed on the layers the module
 *               exists for, beside the machine's fp32 FMA peak and read bandwidth
 *               (measured as `attn bench` does, bench/cli_bench.c).
 *
 * Rows: BERT-base self-attention (B = 8, L = 512, E = 768, 12 heads, float32): forward,
 * forward with the averaged weights, forward + backward; the forward's parts timed alone
 * — its four projections through ai_gemm_f32 (GFLOP/s against the peak) and its
 * attention (attn_forward on the same [B, L, H, D] views) — for the share of time in
 * GEMM vs attention. A Llama-sized decoding step (E = 4096, Hq = 32, Hkv = 8, D = 128,
 * 4096 cached tokens, bfloat16 weights and cache, one token), its weights stored [in, out]
 * and as PyTorch's [out, in]: GB/s counting the weights and the cache read once, against
 * the read bandwidth, and against the read loop over the same buffers timed in the same
 * rounds (read loop, step, step: what the memory gave at the time; the step right after
 * the read loop is timed apart from the step after a step, so that what the loop leaves
 * in the caches shows), with the step's phases (projections, append, attention, W_O)
 * from the library's phase clock (mha_gemv.h). --decode: the decoding rows alone.
 * On a machine whose cores other processes share, OpenMP's spinning barriers can
 * dominate the many short parallel calls of a step (measured on the project's shared
 * machine: the decoding step 1.8 s spinning, 34 ms with OMP_WAIT_POLICY=passive); run it
 * with OMP_WAIT_POLICY=passive there.
 * The training rows: attn_mha_forward_save + attn_mha_backward_saved (the forward's
 * activations kept, what attn.nn runs) and attn_mha_forward + attn_mha_backward (the
 * forward recomputed inside the backward); "caller's workspace" rows pass one buffer of
 * the queried size (opt.workspace) instead of the module's malloc per call, whose fresh
 * pages the kernel faults in and zeroes on first touch (as attn.nn's extension keeps
 * one block between calls).
 * --vs torch runs scripts/bench_mha_torch.py (attn.nn.MultiheadAttention beside
 * torch.nn.MultiheadAttention, interleaved in one process) afterwards as a child, with
 * --python PATH, else .venv-bench/bin/python when `attn bench --setup-torch` made it,
 * else python3; the attn package must be importable there (PYTHONPATH).
 * What it is not: a test (it checks one answer first, fused against the float64
 * reference attention, and fails on a mismatch).
 */
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sys/wait.h>
#include <unistd.h>

#include "attn.h"
#include "bench_clock.h"
#include "bench_machine.h"
#include "bench_peer.h"
#include "core/blas.h"
#include "cli.h"
#include "core/half.h"
#include "mha/mha_clock.h"

static float *randf(int64_t n, float scale, uint64_t seed) {
    float *p = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n && p; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = scale * ((float)(seed >> 40) / 8388608.0f - 1.0f);
    }
    return p;
}

/* One self-attention layer of float32 row-major weights and biases. */
typedef struct blayer {
    int64_t B, L, E, H;
    float *x, *y, *dy, *w[4], *b[4], *g[10];
    attn_tensor tx, ty, tdy, tw[4], tb[4], tg[10];
    attn_mha m;
    attn_mha_grads grads;
} blayer;

static int blayer_init(blayer *l, int64_t B, int64_t L, int64_t E, int64_t H) {
    memset(l, 0, sizeof *l);
    l->B = B, l->L = L, l->E = E, l->H = H;
    const int64_t n = B * L * E;
    l->x = randf(n, 1.0f, 1), l->y = randf(n, 0, 2), l->dy = randf(n, 1.0f, 3);
    l->tx = attn_tensor_4d(l->x, ATTN_F32, B, L, E, 1);
    l->ty = attn_tensor_4d(l->y, ATTN_F32, B, L, E, 1);
    l->tdy = attn_tensor_4d(l->dy, ATTN_F32, B, L, E, 1);
    for (int k = 0; k < 4; k++) {
        l->w[k] = randf(E * E, 1.0f / sqrtf((float)E), 10 + k);
        l->b[k] = randf(E, 0.1f, 20 + k);
        l->g[k] = randf(E * E, 0, 0);
        l->g[4 + k] = randf(E, 0, 0);
        l->tw[k] = attn_tensor_4d(l->w[k], ATTN_F32, E, E, 1, 1);
        l->tb[k] = attn_tensor_4d(l->b[k], ATTN_F32, E, 1, 1, 1);
        l->tg[k] = l->tw[k], l->tg[k].data = l->g[k];
        l->tg[4 + k] = l->tb[k], l->tg[4 + k].data = l->g[4 + k];
    }
    l->g[8] = randf(n, 0, 0);
    l->tg[8] = attn_tensor_4d(l->g[8], ATTN_F32, B, L, E, 1);
    l->m = (attn_mha){.Hq = H, .w_q = &l->tw[0], .w_k = &l->tw[1], .w_v = &l->tw[2],
                      .w_o = &l->tw[3], .b_q = &l->tb[0], .b_k = &l->tb[1],
                      .b_v = &l->tb[2], .b_o = &l->tb[3]};
    l->grads = (attn_mha_grads){.dx_q = &l->tg[8], .dw_q = &l->tg[0], .dw_k = &l->tg[1],
                                .dw_v = &l->tg[2], .dw_o = &l->tg[3], .db_q = &l->tg[4],
                                .db_k = &l->tg[5], .db_v = &l->tg[6], .db_o = &l->tg[7]};
    for (int k = 0; k < 10; k++)
        if (k != 9 && !l->g[k]) return 1;
    return !l->x || !l->y || !l->dy;
}

static void blayer_free(blayer *l) {
    free(l->x), free(l->y), free(l->dy);
    for (int k = 0; k < 4; k++) free(l->w[k]), free(l->b[k]);
    for (int k = 0; k < 10; k++) free(l->g[k]);
}

/* the median of reps timed calls of what (after one untimed); what returns a status */
typedef attn_status (*timed_fn)(void *ctx);
static double time_median(timed_fn what, void *ctx, int reps, attn_status *st) {
    double t[64];
    if (reps > 64) reps = 64;
    *st = what(ctx);
    for (int r = 0; r < reps && *st == ATTN_OK; r++) {
        double t0 = now_s();
        *st = what(ctx);
        t[r] = now_s() - t0;
    }
    for (int a = 1; a < reps; a++)
        for (int b = a; b > 0 && t[b] < t[b - 1]; b--) {
            double s = t[b]; t[b] = t[b - 1]; t[b - 1] = s;
        }
    return *st == ATTN_OK ? t[reps / 2] : NAN;
}

typedef struct fwd_arg {
    blayer *l;
    const attn_tensor *weights;
    const attn_options *opt;  /* NULL, or a caller's workspace */
    void *saved;              /* attn_mha_saved_size bytes */
    size_t saved_bytes;
    float *qkv, *o;  /* the parts: (B·L, 3E), (B·L, E) */
} fwd_arg;

static attn_status run_forward(void *ctx) {
    fwd_arg *a = ctx;
    return attn_mha_forward(&a->l->m, &a->l->tx, NULL, &a->l->ty, a->weights, true, a->opt);
}
/* forward + backward, the forward recomputed in the backward */
static attn_status run_train_recompute(void *ctx) {
    fwd_arg *a = ctx;
    attn_status st = run_forward(ctx);
    if (st == ATTN_OK)
        st = attn_mha_backward(&a->l->m, &a->l->tx, NULL, &a->l->tdy, &a->l->grads, a->opt);
    return st;
}
/* forward + backward, the forward's activations kept */
static attn_status run_train(void *ctx) {
    fwd_arg *a = ctx;
    attn_status st = attn_mha_forward_save(&a->l->m, &a->l->tx, NULL, &a->l->ty, NULL, false,
                                           a->opt, a->saved, a->saved_bytes);
    if (st == ATTN_OK)
        st = attn_mha_backward_saved(&a->l->m, &a->l->tx, NULL, &a->l->tdy, &a->l->grads,
                                     a->opt, a->saved, a->saved_bytes);
    return st;
}
/* the forward's four projections alone, as the module runs them */
static attn_status run_gemms(void *ctx) {
    fwd_arg *a = ctx;
    const blayer *l = a->l;
    const int64_t M = l->B * l->L, E = l->E;
    attn_status st = ATTN_OK;
    for (int k = 0; k < 3 && st == ATTN_OK; k++)
        st = ai_gemm_f32(false, false, M, E, E, 1.0f, l->x, E, l->w[k], E, 0.0f,
                         a->qkv + k * E, 3 * E);
    if (st == ATTN_OK)
        st = ai_gemm_f32(false, false, M, E, E, 1.0f, a->o, E, l->w[3], E, 0.0f, l->y, E);
    return st;
}
/* the forward's attention alone, on [B, L, H, D] views of the projections */
static attn_status run_attention(void *ctx) {
    fwd_arg *a = ctx;
    const blayer *l = a->l;
    const int64_t B = l->B, L = l->L, H = l->H, D = l->E / l->H, E = l->E;
    attn_tensor q = {a->qkv, ATTN_F32, {B, H, L, D}, {L * 3 * E, D, 3 * E, 1}};
    attn_tensor k = q, v = q;
    k.data = a->qkv + E, v.data = a->qkv + 2 * E;
    attn_tensor o = {a->o, ATTN_F32, {B, H, L, D}, {L * E, D, E, 1}};
    return attn_forward(&q, &k, &v, &o, NULL);
}

/* The answer first: the module's fused attention against the float64 reference path. */
static int check_answer(int64_t E, int64_t H) {
    blayer l;
    if (blayer_init(&l, 1, 96, E, H)) return 1;
    float *ref = malloc((size_t)(96 * E) * sizeof(float));
    attn_status st = attn_mha_forward(&l.m, &l.tx, NULL, &l.ty, NULL, false,
                                      &(attn_options){.causal = true, .path = ATTN_PATH_REFERENCE});
    if (ref) memcpy(ref, l.y, (size_t)(96 * E) * sizeof(float));
    if (st == ATTN_OK)
        st = attn_mha_forward(&l.m, &l.tx, NULL, &l.ty, NULL, false, &(attn_options){.causal = true});
    double num = 0, den = 0;
    for (int64_t e = 0; ref && e < 96 * E; e++) {
        num += ((double)l.y[e] - ref[e]) * ((double)l.y[e] - ref[e]);
        den += (double)ref[e] * ref[e];
    }
    const bool ok = st == ATTN_OK && ref && sqrt(num / den) <= 1e-5;
    if (!ok)
        fprintf(stderr, "attn bench-mha: the answer check failed (%s, relative error %.3g)\n",
                attn_status_string(st), sqrt(num / (den > 0 ? den : 1)));
    free(ref);
    blayer_free(&l);
    return !ok;
}

/* The BLAS alone on the module's projection shapes: c[M, N] = a[M, K] · op(w), w stored
 * [K, N] (nn, the module's [in, out] weights) or [N, K] (nt, PyTorch's [out, in]); N =
 * 3K the packed in_proj, N = K one projection. The ceiling the projections' share of the
 * peak can reach through this BLAS. */
typedef struct gemm_arg {
    int64_t M, N, K;
    bool nt;
    const float *a, *w;
    float *c;
} gemm_arg;

static attn_status run_gemm_alone(void *ctx) {
    const gemm_arg *g = ctx;
    return ai_gemm_f32(false, g->nt, g->M, g->N, g->K, 1.0f, g->a, g->K, g->w,
                       g->nt ? g->K : g->N, 0.0f, g->c, g->N);
}

static int bench_gemm_alone(int64_t M, int64_t K, int reps, double peak) {
    float *a = randf(M * K, 1.0f, 31), *w = randf(3 * K * K, 0.05f, 32), *c = randf(M * 3 * K, 0, 0);
    if (!a || !w || !c) return 1;
    printf("  %s alone on these shapes (M=%lld K=%lld, %% of the fp32 FMA peak):",
           attn_blas_name(), (long long)M, (long long)K);
    attn_status st = ATTN_OK;
    for (int wide = 1; wide >= 0 && st == ATTN_OK; wide--)
        for (int nt = 0; nt < 2 && st == ATTN_OK; nt++) {
            gemm_arg g = {M, wide ? 3 * K : K, K, nt != 0, a, w, c};
            const double t = time_median(run_gemm_alone, &g, reps, &st);
            const double gf = 2.0 * (double)M * (double)g.N * (double)K / t * 1e-9;
            printf(" N=%lld %s %.0f%%", (long long)g.N, nt ? "nt" : "nn", 100 * gf / peak);
        }
    printf("\n");
    free(a), free(w), free(c);
    return st != ATTN_OK;
}

static int bench_bert(int64_t B, int64_t L, int64_t E, int64_t H, int reps, double peak) {
    blayer l;
    if (blayer_init(&l, B, L, E, H)) return 1;
    float *wts = malloc((size_t)(B * L * L) * sizeof(float));
    float *qkv = randf(B * L * 3 * E, 1.0f, 7), *o = randf(B * L * E, 1.0f, 8);
    if (!wts || !qkv || !o) return 1;
    attn_tensor tw = attn_tensor_4d(wts, ATTN_F32, B, 1, L, L);
    fwd_arg a = {.l = &l, .qkv = qkv, .o = o};
    attn_status st = attn_mha_saved_size(&l.m, &l.tx, NULL, &a.saved_bytes);
    a.saved = st == ATTN_OK ? malloc(a.saved_bytes) : NULL;
    /* one caller's workspace for every call: the largest of the queries */
    size_t need[3] = {0, 0, 0};
    if (st == ATTN_OK)
        st = attn_mha_forward_workspace_size(&l.m, &l.tx, NULL, &l.ty, &tw, true, NULL, &need[0]);
    if (st == ATTN_OK)
        st = attn_mha_backward_workspace_size(&l.m, &l.tx, NULL, &l.tdy, &l.grads, NULL, NULL, 0,
                                              &need[1]);
    if (st == ATTN_OK)
        st = attn_mha_forward_save_workspace_size(&l.m, &l.tx, NULL, &l.ty, NULL, false, NULL,
                                                  &need[2]);
    size_t ws_bytes = need[0] > need[1] ? need[0] : need[1];
    ws_bytes = ws_bytes > need[2] ? ws_bytes : need[2];
    attn_options own = {.workspace = st == ATTN_OK ? malloc(ws_bytes) : NULL, .workspace_bytes = ws_bytes};
    if (st != ATTN_OK || !a.saved || !own.workspace) {
        fprintf(stderr, "attn bench-mha: setup: %s\n", st != ATTN_OK ? attn_last_error() : "out of memory");
        return 1;
    }
    memset(own.workspace, 0, ws_bytes);  /* its pages faulted in once, here */
    const double t_fwd = time_median(run_forward, &a, reps, &st);
    a.opt = &own;
    const double t_fwd_ws = st == ATTN_OK ? time_median(run_forward, &a, reps, &st) : NAN;
    a.opt = NULL;
    a.weights = &tw;
    const double t_w = st == ATTN_OK ? time_median(run_forward, &a, reps, &st) : NAN;
    a.weights = NULL;
    const double t_gemm = st == ATTN_OK ? time_median(run_gemms, &a, reps, &st) : NAN;
    const double t_att = st == ATTN_OK ? time_median(run_attention, &a, reps, &st) : NAN;
    const double t_train = st == ATTN_OK ? time_median(run_train, &a, reps, &st) : NAN;
    a.opt = &own;
    const double t_train_ws = st == ATTN_OK ? time_median(run_train, &a, reps, &st) : NAN;
    a.opt = NULL;
    const double t_train_re = st == ATTN_OK ? time_median(run_train_recompute, &a, reps, &st) : NAN;
    const double gemm_gf = 2.0 * (double)(B * L) * (double)E * (double)E * 4.0;
    printf("BERT-base self-attention B=%lld L=%lld E=%lld heads=%lld float32 (median of %d):\n",
           (long long)B, (long long)L, (long long)E, (long long)H, reps);
    printf("  forward                 %9.2f ms\n", t_fwd * 1e3);
    printf("  forward, caller's workspace %5.2f ms\n", t_fwd_ws * 1e3);
    printf("  forward + weights (avg) %9.2f ms\n", t_w * 1e3);
    printf("  forward + backward      %9.2f ms (activations kept: forward_save + backward_saved)\n",
           t_train * 1e3);
    printf("  the same, caller's workspace %4.2f ms\n", t_train_ws * 1e3);
    printf("  forward + backward      %9.2f ms (recomputed: forward + backward)\n", t_train_re * 1e3);
    printf("  forward's parts: projections (4 GEMMs) %.2f ms = %.1f%%, attention %.2f ms = "
           "%.1f%%, the rest %.1f%%\n", t_gemm * 1e3, 100 * t_gemm / t_fwd, t_att * 1e3,
           100 * t_att / t_fwd, 100 * (t_fwd - t_gemm - t_att) / t_fwd);
    printf("  GEMM %.1f GFLOP/s = %.0f%% of the fp32 FMA peak %.1f GFLOP/s\n",
           gemm_gf / t_gemm * 1e-9, 100 * gemm_gf / t_gemm * 1e-9 / peak, peak);
    if (st != ATTN_OK) fprintf(stderr, "attn bench-mha: %s\n", attn_last_error());
    free(wts), free(qkv), free(o), free(a.saved), free(own.workspace);
    blayer_free(&l);
    /* the BLAS alone on the projections' shapes (M = B·L, K = E; N = 3E the packed
     * in_proj, N = E; weights [in, out] "nn", PyTorch's [out, in] "nt"), the ceiling of
     * the GEMM row above */
    return st != ATTN_OK || bench_gemm_alone(B * L, E, reps, peak);
}

/* --vs torch: scripts/bench_mha_torch.py as a child, its report on our stdout */
static int run_torch_side(const char *python, int threads, int reps, bool quick) {
    char root[4096], script[4200], venv_py[4200], th[16], rp[16];
    source_root(root, sizeof root);
    snprintf(script, sizeof script, "%s/scripts/bench_mha_torch.py", root);
    snprintf(venv_py, sizeof venv_py, "%s/.venv-bench/bin/python", root);
    if (!python) python = file_exists(venv_py) ? venv_py : "python3";
    snprintf(th, sizeof th, "%d", threads);
    snprintf(rp, sizeof rp, "%d", reps);
    printf("PyTorch beside attn.nn (%s %s --threads %s --reps %s%s):\n", python, script, th, rp,
           quick ? " and --quick's layer" : "");
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {
        char *argv[] = {(char *)python, script, "--threads", th, "--reps", rp, "--warmup", "1",
                        "--B", "2", "--L", "64", "--E", "64", "--heads", "4", NULL};
        if (!quick) argv[6] = NULL;  /* the layer, the script's defaults */
        execvp(argv[0], argv);
        fprintf(stderr, "attn bench-mha: cannot run %s\n", python);
        _exit(127);
    }
    int st;
    if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "attn bench-mha: the PyTorch side failed (PyTorch and the attn "
                "package importable by %s? attn bench --setup-torch, PYTHONPATH)\n", python);
        return 1;
    }
    return 0;
}

static void sort_doubles(double *t, int n) {
    for (int a = 1; a < n; a++)
        for (int b = a; b > 0 && t[b] < t[b - 1]; b--) {
            double u = t[b]; t[b] = t[b - 1]; t[b - 1] = u;
        }
}

static void *alloc64(size_t bytes) { return aligned_alloc(64, (bytes + 63) & ~(size_t)63); }

typedef struct dec_arg {
    attn_mha m;
    attn_tensor x, y;
    attn_kv_cache cache;
    int64_t len[1], start;
} dec_arg;

static attn_status run_decode(void *ctx) {
    dec_arg *d = ctx;
    d->len[0] = d->start;
    return attn_mha_decode(&d->m, &d->x, &d->cache, &d->y, NULL);
}

/* One token of a layer with bfloat16 weights and cache; every buffer freed at the end.
 * Beside each timed step, one pass of the bandwidth measurement's read loop over the same
 * buffers (the four weights and the cache): on a machine other processes share, the
 * bandwidth the step could have had at the time it ran. */
static int bench_decode(int64_t E, int64_t Hq, int64_t Hkv, int64_t D, int64_t Lc, int reps,
                        double bw, int threads, bool torch) {
    const int64_t in[4] = {E, E, E, Hq * D}, out[4] = {Hq * D, Hkv * D, Hkv * D, E};
    /* 64-byte aligned, whole 64-byte lines: the read loop's aligned loads */
    uint16_t *w[4], *kc = alloc64((size_t)(Hkv * Lc * D) * 2), *vc = alloc64((size_t)(Hkv * Lc * D) * 2);
    float *x = randf(E, 1.0f, 5), *y = randf(E, 0, 6);
    dec_arg d = {.start = Lc - 1};
    double bytes = 2.0 * 2.0 * (double)(Hkv * Lc * D);
    int bad = !kc || !vc || !x || !y;
    for (int k = 0; k < 4; k++) {
        w[k] = alloc64((size_t)(in[k] * out[k]) * 2);
        bad |= !w[k];
        for (int64_t e = 0; w[k] && e < in[k] * out[k]; e++)
            w[k][e] = attn_f32_to_bf16((float)((e * 2654435761u) % 1000) * 1e-5f - 5e-3f);
        bytes += 2.0 * (double)(in[k] * out[k]);
    }
    for (int64_t e = 0; !bad && e < Hkv * Lc * D; e++) kc[e] = vc[e] = attn_f32_to_bf16(0.01f * (float)(e % 7));
    attn_tensor tw[4];
    for (int k = 0; k < 4; k++) {
        tw[k] = attn_tensor_4d(w[k], ATTN_BF16, in[k], out[k], 1, 1);
        if (torch)  /* PyTorch's nn.Linear storage, [out, in]: the same bytes */
            tw[k].stride[0] = 1, tw[k].stride[1] = in[k];
    }
    d.m = (attn_mha){.Hq = Hq, .Hkv = Hkv, .w_q = &tw[0], .w_k = &tw[1], .w_v = &tw[2],
                     .w_o = &tw[3], .rope = {.kind = ATTN_ROPE_HALF}};
    d.x = attn_tensor_4d(x, ATTN_F32, 1, 1, E, 1);
    d.y = attn_tensor_4d(y, ATTN_F32, 1, 1, E, 1);
    d.cache = (attn_kv_cache){.kind = ATTN_CACHE_CONTIGUOUS,
                              .k = attn_tensor_4d(kc, ATTN_BF16, 1, Hkv, Lc, D),
                              .v = attn_tensor_4d(vc, ATTN_BF16, 1, Hkv, Lc, D), .len = d.len};
    attn_status st = bad ? ATTN_ERR_NOMEM : run_decode(&d);  /* untimed: pages touched */
    /* Rounds of: the read loop over the same bytes, a step right after it, a step right
     * after that step. The two steps' medians tell apart what the read loop in between
     * does to the step (the caches it leaves, the team's threads it parks) from what the
     * machine's load does to both at the time; the read loop's median is the bandwidth
     * the memory gave during those rounds. */
    const bench_loops *rl = machine_read_loops();
    const void *bufs[6] = {w[0], w[1], w[2], w[3], kc, vc};
    const double nbytes[6] = {2.0 * (double)(in[0] * out[0]), 2.0 * (double)(in[1] * out[1]),
                              2.0 * (double)(in[2] * out[2]), 2.0 * (double)(in[3] * out[3]),
                              2.0 * (double)(Hkv * Lc * D), 2.0 * (double)(Hkv * Lc * D)};
    double ts[64], ta[64], tr[64], ph[MHA_DEC_NPHASE][64], rest[64];
    int n = 0;
    bool whole = true;  /* the read loop takes 64 floats at a time */
    for (int k = 0; k < 6; k++) whole &= (int64_t)nbytes[k] % 256 == 0;
    for (; rl && whole && st == ATTN_OK && n < reps && n < 64; n++) {
        tr[n] = 0;
        for (int k = 0; k < 6; k++)
            tr[n] += nbytes[k] / (1e9 * machine_read_pass(rl, bufs[k], (int64_t)(nbytes[k] / 4),
                                                          threads));
        double t0 = now_s();
        st = run_decode(&d);
        ta[n] = now_s() - t0;
        double clock[MHA_DEC_NPHASE] = {0};
        mha_decode_clock = clock;
        t0 = now_s();
        if (st == ATTN_OK) st = run_decode(&d);
        ts[n] = now_s() - t0;
        mha_decode_clock = NULL;
        rest[n] = ts[n];
        for (int p = 0; p < MHA_DEC_NPHASE; p++) ph[p][n] = clock[p], rest[n] -= clock[p];
    }
    sort_doubles(ts, n), sort_doubles(ta, n), sort_doubles(tr, n), sort_doubles(rest, n);
    for (int p = 0; p < MHA_DEC_NPHASE; p++) sort_doubles(ph[p], n);
    printf("Decoding step E=%lld Hq=%lld Hkv=%lld D=%lld, %lld cached tokens, bfloat16 weights "
           "and cache, 1 token, weights stored %s:\n", (long long)E, (long long)Hq, (long long)Hkv,
           (long long)D, (long long)Lc, torch ? "[out, in] (PyTorch's)" : "[in, out]");
    if (n > 0) {
        const double t = ts[n / 2], r = tr[n / 2];
        printf("  %.2f ms (a step after a step), %.1f GB/s over %.1f MB (weights + cache once) = "
               "%.0f%% of the read bandwidth %.1f GB/s\n", t * 1e3, bytes / t * 1e-9,
               bytes * 1e-6, 100 * bytes / t * 1e-9 / bw, bw);
        printf("  interleaved with the read loop over the same buffers (medians of %d rounds): "
               "read %.2f ms = %.1f GB/s; the step at %.0f%% of it; a step right after the "
               "read loop %.2f ms\n", n, r * 1e3, bytes / r * 1e-9, 100 * r / t, ta[n / 2] * 1e3);
        printf("  the step's phases (medians of the steps after a step; each its own median): x.W_Q,K,V + RoPE %.2f ms, append %.3f ms, "
               "attention %.2f ms, o.W_O %.2f ms, the rest (checks, workspace) %.2f ms\n",
               ph[MHA_DEC_QKV][n / 2] * 1e3, ph[MHA_DEC_APPEND][n / 2] * 1e3,
               ph[MHA_DEC_ATTEND][n / 2] * 1e3, ph[MHA_DEC_OUT][n / 2] * 1e3, rest[n / 2] * 1e3);
    } else if (st == ATTN_OK) {
        printf("  not timed: the read loop cannot take these buffers\n");
    }
    for (int k = 0; k < 4; k++) free(w[k]);
    free(kc), free(vc), free(x), free(y);
    return st != ATTN_OK;
}

int cli_bench_mha(int argc, char **argv) {
    bool quick = false, vs_torch = false, decode_only = false;
    const char *python = NULL;
    int threads = omp_get_max_threads(), reps = 5;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) quick = true, reps = 2;
        else if (strcmp(argv[i], "--decode") == 0) decode_only = true;
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--vs") == 0 && i + 1 < argc && strcmp(argv[i + 1], "torch") == 0)
            vs_torch = true, i++;
        else if (strcmp(argv[i], "--python") == 0 && i + 1 < argc) python = argv[++i];
        else {
            fprintf(stderr, "usage: attn bench-mha [--quick] [--decode] [--threads N] [--reps N] "
                    "[--vs torch [--python PATH]]\n");
            return 2;
        }
    }
    if (threads < 1 || threads > 512 || reps < 1) {
        fprintf(stderr, "attn bench-mha: --threads 1..512 and --reps >= 1\n");
        return 2;
    }
    omp_set_num_threads(threads);  /* the attention's threads and the OpenMP BLAS's */
    double peak, bw;
    if (bench_machine_peak(threads, quick, &peak, &bw)) return 1;
    printf("attn bench-mha: %d threads, kernel %s, BLAS %s\n", threads, attn_kernel_name(),
           attn_blas_name());
    if (check_answer(quick ? 64 : 768, quick ? 4 : 12)) return 1;
    if (decode_only)  /* the decoding step's rows alone */
        return quick ? bench_decode(256, 8, 2, 32, 128, reps, bw, threads, false) ||
                           bench_decode(256, 8, 2, 32, 128, reps, bw, threads, true)
                     : bench_decode(4096, 32, 8, 128, 4096, reps, bw, threads, false) ||
                           bench_decode(4096, 32, 8, 128, 4096, reps, bw, threads, true);
    if (quick ? bench_bert(2, 64, 64, 4, reps, peak) || bench_decode(256, 8, 2, 32, 128, reps, bw, threads, false)
              : bench_bert(8, 512, 768, 12, reps, peak) ||
                    bench_decode(4096, 32, 8, 128, 4096, reps, bw, threads, false) ||
                    bench_decode(4096, 32, 8, 128, 4096, reps, bw, threads, true))
        return 1;
    return vs_torch ? run_torch_side(python, threads, reps, quick) : 0;
}
