/*
 * test_threads.c — the library called from 8 threads at once: mixed forward and backward
 * calls with different options (causal, window, mask, softcap, kv_len, lse, weights,
 * float16, the reference path, own workspace or the call's), each thread running every
 * call several times in its own order. Every result must be bit-identical to the same
 * call made alone beforehand, and every call must leave attn_last_error() of its own
 * thread alone. Built with -fsanitize=thread and without the OpenMP runtime
 * (OPENMP=-fopenmp-simd), scripts/check.sh runs it under ThreadSanitizer, where any data
 * race in the library is a report (a failure); in the ordinary build it is a plain
 * concurrency test (each call then also uses OpenMP threads of its own).
 * What it is not: a test of the numbers (test_forward, test_backward).
 */
#include <pthread.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "check.h"
#include "core/half.h"

enum { NTHREADS = 8, ROUNDS = 3, NCALLS = 8 };

/* shared inputs, read by every thread */
static const int64_t B = 2, Hq = 4, Hkv = 2, Lq = 33, Lk = 75, Dk = 16, Dv = 20;
static float g_q[2 * 4 * 33 * 16], g_k[2 * 2 * 75 * 16], g_v[2 * 2 * 75 * 20],
    g_do[2 * 4 * 33 * 20];
static uint16_t g_q16[2 * 4 * 33 * 16], g_k16[2 * 2 * 75 * 16], g_v16[2 * 2 * 75 * 20];
static unsigned char g_mask[33 * 75];
static int32_t g_kvl[2] = {75, 40};

/* One call's outputs: O (or dQ), LSE (or dK), weights (or dV); sized for the largest. */
typedef struct result {
    float a[2 * 4 * 33 * (20 + 75)], b[2 * 4 * 33 * 20], c[2 * 2 * 75 * 20];
} result;

static result g_alone[NCALLS];

/* call i, its outputs into r */
static attn_status run_call(int i, result *r, int threads_opt) {
    const bool half = i == 3;
    attn_tensor q = attn_tensor_4d(half ? (void *)g_q16 : g_q, half ? ATTN_F16 : ATTN_F32, B, Hq, Lq, Dk);
    attn_tensor k = attn_tensor_4d(half ? (void *)g_k16 : g_k, half ? ATTN_F16 : ATTN_F32, B, Hkv, Lk, Dk);
    attn_tensor v = attn_tensor_4d(half ? (void *)g_v16 : g_v, half ? ATTN_F16 : ATTN_F32, B, Hkv, Lk, Dv);
    attn_tensor mask = attn_tensor_4d(g_mask, ATTN_BOOL, 1, 1, Lq, Lk);
    mask.stride[0] = mask.stride[1] = 0;
    attn_tensor kvl = attn_tensor_4d(g_kvl, ATTN_I32, B, 1, 1, 1);
    attn_tensor lse = attn_tensor_4d(r->b, ATTN_F32, B, Hq, Lq, 1);
    attn_tensor w = attn_tensor_4d(r->a + B * Hq * Lq * Dv, ATTN_F32, B, Hq, Lq, Lk);
    attn_options opt = {.threads = threads_opt};
    static _Thread_local unsigned char ws[1 << 20];
    switch (i) {
    case 0: break;
    case 1: opt.causal = true; opt.lse = &lse; break;
    case 2: opt.has_window = true; opt.window_left = 7; opt.window_right = 3;
            opt.mask = &mask; opt.weights = &w; break;
    case 3: opt.causal = true; opt.align = ATTN_ALIGN_BOTTOM_RIGHT; break;
    case 4: opt.softcap = 5; opt.kv_len = &kvl; opt.path = ATTN_PATH_REFERENCE; opt.lse = &lse; break;
    case 5: opt.causal = true; opt.workspace = ws; opt.workspace_bytes = sizeof ws; break;
    default: opt.causal = i == 6; opt.mask = i == 7 ? &mask : NULL; break;
    }
    attn_tensor o = attn_tensor_4d(r->a, half ? ATTN_F16 : ATTN_F32, B, Hq, Lq, Dv);
    if (i < 6) return attn_forward(&q, &k, &v, &o, &opt);

    /* backward: the forward's O and LSE first (into c and b), then dQ, dK, dV */
    attn_tensor of = attn_tensor_4d(r->c, ATTN_F32, B, Hq, Lq, Dv);
    opt.lse = &lse;
    attn_status st = attn_forward(&q, &k, &v, &of, &opt);
    if (st != ATTN_OK) return st;
    opt.lse = NULL;
    if (i == 7) opt.path = ATTN_PATH_REFERENCE;
    attn_tensor d_o = attn_tensor_4d(g_do, ATTN_F32, B, Hq, Lq, Dv);
    attn_tensor dq = attn_tensor_4d(r->a, ATTN_F32, B, Hq, Lq, Dk);
    attn_tensor dk = attn_tensor_4d(r->a + B * Hq * Lq * Dk, ATTN_F32, B, Hkv, Lk, Dk);
    attn_tensor dv = attn_tensor_4d(r->a + B * Hq * Lq * Dk + B * Hkv * Lk * Dk, ATTN_F32, B, Hkv, Lk, Dv);
    return attn_backward(&q, &k, &v, &of, &d_o, &lse, &dq, &dk, &dv, &opt);
}

typedef struct worker {
    int id, mismatches, errors;
    result *r;
} worker;

static void *work(void *arg) {
    worker *w = arg;
    for (int round = 0; round < ROUNDS; round++)
        for (int n = 0; n < NCALLS; n++) {
            const int i = (n * 3 + w->id + round) % NCALLS;  // each thread its own order
            memset(w->r, 0, sizeof *w->r);
            if (run_call(i, w->r, 1 + (w->id + n) % 2) != ATTN_OK || attn_last_error()[0])
                w->errors++;
            else if (memcmp(w->r, &g_alone[i], sizeof *w->r) != 0)
                w->mismatches++;
        }
    return NULL;
}

int main(void) {
    uint32_t s = 12345;
    float *all[] = {g_q, g_k, g_v, g_do};
    const size_t n[] = {sizeof g_q / 4, sizeof g_k / 4, sizeof g_v / 4, sizeof g_do / 4};
    for (int a = 0; a < 4; a++)
        for (size_t e = 0; e < n[a]; e++) {
            s = s * 1664525u + 1013904223u;
            all[a][e] = (float)((int32_t)(s >> 8) % 2001) / 1000.0f;
        }
    for (size_t e = 0; e < sizeof g_q16 / 2; e++) g_q16[e] = attn_f32_to_f16(g_q[e]);
    for (size_t e = 0; e < sizeof g_k16 / 2; e++) g_k16[e] = attn_f32_to_f16(g_k[e]);
    for (size_t e = 0; e < sizeof g_v16 / 2; e++) g_v16[e] = attn_f32_to_f16(g_v[e]);
    for (size_t e = 0; e < sizeof g_mask; e++) g_mask[e] = (e * 7) % 5 != 0;

    for (int i = 0; i < NCALLS; i++) {
        memset(&g_alone[i], 0, sizeof g_alone[i]);
        const attn_status st = run_call(i, &g_alone[i], 1);
        CHECK(st == ATTN_OK, "call %d alone: %s", i, attn_last_error());
    }
    worker w[NTHREADS];
    pthread_t tid[NTHREADS];
    for (int t = 0; t < NTHREADS; t++) {
        w[t] = (worker){.id = t, .r = malloc(sizeof(result))};
        if (!w[t].r || pthread_create(&tid[t], NULL, work, &w[t]) != 0) {
            fprintf(stderr, "test_threads: cannot start thread %d\n", t);
            return 2;
        }
    }
    for (int t = 0; t < NTHREADS; t++) {
        pthread_join(tid[t], NULL);
        CHECK(w[t].errors == 0, "thread %d: %d calls failed", t, w[t].errors);
        CHECK(w[t].mismatches == 0, "thread %d: %d of %d results differ from the same call "
              "alone", t, w[t].mismatches, ROUNDS * NCALLS);
        free(w[t].r);
    }
#ifdef _OPENMP
    /* The same calls from inside the caller's own OpenMP team, each of its threads its own
     * calls at once: a call's worksharing must bind to a team of the library's own (or to
     * none), never to the caller's, and its scratch must be its own thread's. */
    int omp_errors = 0, omp_mismatches = 0;
#pragma omp parallel num_threads(4) reduction(+ : omp_errors, omp_mismatches)
    {
        worker ow = {.id = omp_get_thread_num(), .r = malloc(sizeof(result))};
        if (ow.r) {
            work(&ow);
            free(ow.r);
        } else {
            ow.errors = 1;
        }
        omp_errors += ow.errors;
        omp_mismatches += ow.mismatches;
    }
    CHECK(omp_errors == 0, "inside the caller's OpenMP team: %d calls failed", omp_errors);
    CHECK(omp_mismatches == 0, "inside the caller's OpenMP team: %d results differ from the "
          "same call alone", omp_mismatches);
#endif
    printf("test_threads: %d threads x %d calls, compared bit for bit\n", NTHREADS,
           ROUNDS * NCALLS);
    return check_summary("test_threads");
}
