/*
 * cli_bench_masks.c — `attn bench masks`: what a mask costs beside the same call with the
 *                     library's own structural options (kv_len), on the shapes models pass.
 *
 * Rows, each timed on the fused path (median of --reps calls after 2 warm-up calls, the
 * variants of one shape called in turn, rep after rep, so that a shared machine's load
 * falls on them alike; the same inputs every call; min and max printed too) and checked
 * against its kv_len row at the contract's float32 tolerance (the kv_len row itself is
 * checked by the test suites):
 *   - a sentence-embedding model's attention: q, k, v (24, 12, 199, 32) in [B, L, H, D]
 *     storage, 24 sentences of 3 .. 199 tokens, as kv_len, as a bool [B, 1, L, L] padding
 *     mask, a bool [B, 1, 1, L], a float 0 / -inf bias [B, 1, L, L] and [B, 1, 1, L];
 *   - L = 2048, B = 2, H = 16, D = 64 with a random key length per batch, the same five;
 *   - L = 2048, B = 1, H = 16 with a random (unstructured) bool mask of density 0.5, [1, 1, L, L],
 *     checked against the reference path on the first head's last 64 rows.
 * What it is not: the sweep of `attn bench` (no machine peak, no PyTorch side, no input
 * rotation: each row's inputs stay in whatever cache holds them).
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "bench_clock.h"
#include "cli.h"

typedef struct mb_shape {
    int64_t B, H, L, D;
    float *q, *k, *v, *o, *ref;
    int64_t *len;
} mb_shape;

static uint64_t mb_rng(uint64_t *s) {  // splitmix64
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* q, k, v in [B, L, H, D] storage as [B, H, L, D] views */
static attn_tensor blhd(float *x, const mb_shape *s) {
    return (attn_tensor){x, ATTN_F32, {s->B, s->H, s->L, s->D},
                         {s->L * s->H * s->D, s->D, s->H * s->D, 1}};
}

typedef struct mb_time {
    double med, lo, hi;  // ms
} mb_time;

/* n variants of one call timed in turn, rep after rep (so that a machine's changing load
 * falls on all of them alike): each one's median, min and max; false on a failed call.
 * O is left by the last call of each variant, in outs[v] (s->o when NULL). */
static bool time_calls(const mb_shape *s, const attn_options *const opts[], int n, int reps,
                       mb_time *out, float *const outs[]) {
    attn_tensor q = blhd(s->q, s), k = blhd(s->k, s), v = blhd(s->v, s);
    static double t[8][1000];
    for (int r = -2; r < reps; r++)
        for (int x = 0; x < n; x++) {
            attn_tensor o = attn_tensor_4d(outs && outs[x] ? outs[x] : s->o, ATTN_F32, s->B, s->H,
                                           s->L, s->D);
            const double t0 = omp_get_wtime();
            if (attn_forward(&q, &k, &v, &o, opts[x]) != ATTN_OK) return false;
            if (r >= 0) t[x][r] = (omp_get_wtime() - t0) * 1e3;
        }
    for (int x = 0; x < n; x++) {
        qsort(t[x], (size_t)reps, sizeof t[x][0], cmp_double);
        out[x] = (mb_time){t[x][reps / 2], t[x][0], t[x][reps - 1]};
    }
    return true;
}

/* the contract's tolerance of n values against ref (float32 values of the same function) */
static bool close_f32(const float *got, const float *ref, int64_t n, double *rel) {
    double num = 0, den = 0, max_err = 0, max_ref = 0;
    for (int64_t x = 0; x < n; x++) {
        const double d = fabs((double)got[x] - ref[x]);
        if (!(d == d)) return *rel = INFINITY, false;
        num += d * d, den += (double)ref[x] * ref[x];
        if (d > max_err) max_err = d;
        if (fabs(ref[x]) > max_ref) max_ref = fabs(ref[x]);
    }
    *rel = den > 0 ? sqrt(num / den) : sqrt(num);
    return *rel <= 1e-6 && max_err <= 1e-5 * (1 + max_ref);
}

static int print_row(const char *name, const mb_time *t, double base_ms, const float *got,
                     const float *ref, int64_t n) {
    double rel = 0;
    const bool ok = !ref || close_f32(got, ref, n, &rel);
    printf("%-44s %9.2f ms  (%8.2f .. %8.2f)", name, t->med, t->lo, t->hi);
    if (base_ms > 0) printf("  %5.2fx kv_len", t->med / base_ms);
    if (ref) printf("  %s rel %.2g", ok ? "ok" : "FAILED", rel);
    printf("\n");
    fflush(stdout);
    return !ok;
}

static int alloc_shape(mb_shape *s, int64_t B, int64_t H, int64_t L, int64_t D, uint64_t seed) {
    *s = (mb_shape){.B = B, .H = H, .L = L, .D = D};
    const int64_t n = B * L * H * D;
    s->q = malloc((size_t)n * 4), s->k = malloc((size_t)n * 4), s->v = malloc((size_t)n * 4);
    s->o = malloc((size_t)n * 4), s->ref = malloc((size_t)n * 4);
    s->len = malloc((size_t)B * sizeof(int64_t));
    if (!s->q || !s->k || !s->v || !s->o || !s->ref || !s->len) return 1;
    for (int64_t x = 0; x < n; x++) {
        s->q[x] = (float)((mb_rng(&seed) >> 11) * 0x1.0p-53 * 2 - 1);
        s->k[x] = (float)((mb_rng(&seed) >> 11) * 0x1.0p-53 * 2 - 1);
        s->v[x] = (float)((mb_rng(&seed) >> 11) * 0x1.0p-53 * 2 - 1);
    }
    return 0;
}

static void free_shape(mb_shape *s) {
    free(s->q), free(s->k), free(s->v), free(s->o), free(s->ref), free(s->len);
}

/* the kv_len row, then the padding as a bool and a float mask of each shape, timed in
 * turn and checked against the kv_len row */
static int padding_rows(const char *tag, mb_shape *s, int threads, int reps) {
    const int64_t B = s->B, L = s->L, n = B * s->H * L * s->D;
    attn_tensor kvl = {s->len, ATTN_I64, {B, 1, 1, 1}, {1, 1, 1, 1}};
    uint8_t *m = malloc((size_t)(B * L * L));
    float *f = malloc((size_t)(B * L * L) * 4), *outs[5] = {s->ref};
    for (int x = 1; x < 5; x++) outs[x] = malloc((size_t)n * 4);
    int bad = 0;
    for (int x = 1; x < 5; x++) bad |= !outs[x];
    if (!m || !f || bad) return free(m), free(f), 1;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < L; i++)
            for (int64_t j = 0; j < L; j++) {
                m[(b * L + i) * L + j] = j < s->len[b];
                f[(b * L + i) * L + j] = j < s->len[b] ? 0.0f : -INFINITY;
            }
    attn_tensor mfull = {m, ATTN_BOOL, {B, 1, L, L}, {L * L, 0, L, 1}};
    attn_tensor mkeys = {m, ATTN_BOOL, {B, 1, 1, L}, {L * L, 0, 0, 1}};
    attn_tensor ffull = {f, ATTN_F32, {B, 1, L, L}, {L * L, 0, L, 1}};
    attn_tensor fkeys = {f, ATTN_F32, {B, 1, 1, L}, {L * L, 0, 0, 1}};
    const attn_options o[5] = {
        {.threads = threads, .kv_len = &kvl},  {.threads = threads, .mask = &mfull},
        {.threads = threads, .mask = &mkeys},  {.threads = threads, .bias = &ffull},
        {.threads = threads, .bias = &fkeys},
    };
    const attn_options *const opts[5] = {&o[0], &o[1], &o[2], &o[3], &o[4]};
    static const char *const what[5] = {"kv_len", "bool [B,1,L,L]", "bool [B,1,1,L]",
                                        "float 0/-inf [B,1,L,L]", "float 0/-inf [B,1,1,L]"};
    mb_time t[5];
    if (!time_calls(s, opts, 5, reps, t, outs)) {
        fprintf(stderr, "attn bench masks: %s\n", attn_last_error());
        bad = 1;
    }
    for (int x = 0; x < 5 && !bad; x++) {
        char name[96];
        snprintf(name, sizeof name, "%s %s", tag, what[x]);
        bad += print_row(name, &t[x], x ? t[0].med : 0, outs[x], x ? s->ref : NULL, n);
    }
    for (int x = 1; x < 5; x++) free(outs[x]);
    free(m), free(f);
    return bad;
}

/* a random bool mask of density 0.5, checked on the reference's last 64 rows of head 0 */
static int random_row(mb_shape *s, int threads, int reps) {
    const int64_t L = s->L;
    uint8_t *m = malloc((size_t)(L * L));
    if (!m) return 1;
    uint64_t seed = 99;
    for (int64_t x = 0; x < L * L; x++) m[x] = mb_rng(&seed) >> 63;
    attn_tensor mask = attn_tensor_4d(m, ATTN_BOOL, 1, 1, L, L);
    const attn_options opt = {.threads = threads, .mask = &mask}, *opts[1] = {&opt};
    mb_time tm;
    if (!time_calls(s, opts, 1, reps, &tm, NULL)) return free(m), 1;
    /* the reference on rows L-64 .. L-1 of batch 0, head 0 */
    const int64_t r0 = L - 64;
    attn_tensor q = blhd(s->q, s), k = blhd(s->k, s), v = blhd(s->v, s);
    q.shape[0] = k.shape[0] = v.shape[0] = 1, q.shape[1] = k.shape[1] = v.shape[1] = 1;
    q.data = s->q + r0 * q.stride[2], q.shape[2] = 64;
    float *o = malloc(64 * (size_t)s->D * 4);
    attn_tensor ot = attn_tensor_4d(o, ATTN_F32, 1, 1, 64, s->D);
    attn_tensor msub = {m + r0 * L, ATTN_BOOL, {1, 1, 64, L}, {0, 0, L, 1}};
    attn_options ro = {.threads = threads, .mask = &msub, .path = ATTN_PATH_REFERENCE};
    int bad = attn_forward(&q, &k, &v, &ot, &ro) != ATTN_OK;
    float *got = malloc(64 * (size_t)s->D * 4);
    for (int64_t i = 0; i < 64; i++)
        memcpy(got + i * s->D, s->o + (r0 + i) * s->D, (size_t)s->D * 4);  // O is [B, H, L, D]
    double rel = INFINITY;
    const bool ok = !bad && close_f32(got, o, 64 * s->D, &rel);
    printf("%-44s %9.2f ms  (%8.2f .. %8.2f)  %s rel %.2g\n", "L2048 random bool [1,1,L,L] (0.5)",
           tm.med, tm.lo, tm.hi, ok ? "ok" : "FAILED", rel);
    free(m), free(o), free(got);
    return !ok;
}

int cli_bench_masks(int argc, char **argv) {
    int threads = 2, reps = 15;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: attn bench masks [--threads N] [--reps N]\n");
            return 2;
        }
    }
    if (threads < 1 || threads > 512 || reps < 1 || reps > 1000) {
        fprintf(stderr, "attn bench masks: --threads 1..512, --reps 1..1000\n");
        return 2;
    }
    printf("attn bench masks: kernel %s, %d threads, median of %d calls\n", attn_kernel_name(),
           threads, reps);
    int bad = 0;
    mb_shape s;
    if (alloc_shape(&s, 24, 12, 199, 32, 1)) return fprintf(stderr, "out of memory\n"), 1;
    for (int64_t b = 0; b < 24; b++) s.len[b] = 3 + 196 * b / 23;  // 3 .. 199 tokens
    bad += padding_rows("minilm 24x12x199x32", &s, threads, reps);
    free_shape(&s);

    if (alloc_shape(&s, 2, 16, 2048, 64, 2)) return fprintf(stderr, "out of memory\n"), 1;
    uint64_t seed = 7;
    for (int64_t b = 0; b < 2; b++) s.len[b] = 1 + (int64_t)(mb_rng(&seed) % 2048);
    bad += padding_rows("L2048 2x16 random padding", &s, threads, reps > 5 ? 5 : reps);
    free_shape(&s);

    if (alloc_shape(&s, 1, 16, 2048, 64, 3)) return fprintf(stderr, "out of memory\n"), 1;
    bad += random_row(&s, threads, reps > 5 ? 5 : reps);
    free_shape(&s);
    return bad ? 1 : 0;
}
