/*
 * ggml_fa.c — the llama.cpp (ggml) peer of `attn bench --q8`: ggml_flash_attn_ext on the
 *             same decoding shapes over f32, f16, q8_0 and q4_0 K/V caches.
 *
 * Not part of the library or its build: scripts/bench_ggml.sh builds ggml in a scratch
 * folder outside the repo and compiles this file against it (ggml's public API only:
 * ggml.h, ggml-cpu.h). Nothing of ggml is copied here.
 *
 * Method (as bench/bench_q8.c's):
 *   - decoding, Lq = 1, Lk = 16384 (--lk, --quick: 2048), Hq = 32, Hkv = 8, D = 128,
 *     B = 1 (--b), float32 queries; K, V and Q uniform in [-1, 1); the caches are
 *     ggml_quantize_chunk of the float32 K and V (f16: its rounding);
 *   - the call: q [D, Lq, Hq, B] f32, k and v [D, Lk, Hkv, B] (v not transposed), no mask
 *     (--mask: an all-zero f16 mask [Lk, Lq, 1, 1]), scale 1/sqrt(D), max_bias 0,
 *     softcap 0, GGML_PREC_F32 (the CPU backend has one path for both precisions);
 *   - the check, before any timing: the float64 softmax(QK^T / sqrt(D)) V over the cache
 *     dequantized with ggml's own to_float, against ggml's O (relative Frobenius); above
 *     5e-2 the call or layout is wrong: FAILED, exit 1;
 *   - a persistent ggml threadpool of --threads threads (default 2); 2 warm-up computes,
 *     then --reps (default 21) timed ggml_graph_compute calls, CLOCK_MONOTONIC around the
 *     compute alone, the median printed; between timed calls (untimed) one read of the
 *     float32 K and V (2 x the float32 cache), so no call finds its cache in the caches,
 *     as attn bench --q8 does.
 * Output: one line per dtype, "ggml <dtype> rel_err <e> median_ms <ms>" (or "skipped").
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-cpu.h"
#include "ggml.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng_next(uint64_t *s) {  // splitmix64
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fill(float *p, int64_t n, uint64_t seed) {  // uniform in [-1, 1)
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++) p[i] = (float)((double)(rng_next(&s) >> 11) * 0x1p-52 - 1.0);
}

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static volatile float g_sink;
static void flush_read(const float *a, const float *b, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i += 16) s += a[i] + b[i];
    g_sink += s;
}

/* dequantize rows [r0, r0 + nr) of a D-wide tensor into out (ggml's own to_float) */
static void to_f32(const struct ggml_tensor *t, int64_t r0, int64_t nr, float *out) {
    const int64_t d = t->ne[0];
    const size_t rs = ggml_row_size(t->type, d);
    const char *src = (const char *)t->data + (size_t)r0 * rs;
    if (t->type == GGML_TYPE_F32) {
        memcpy(out, src, (size_t)(nr * d) * 4);
        return;
    }
    ggml_get_type_traits(t->type)->to_float(src, out, nr * d);
}

static const char USAGE[] =
    "usage: ggml_fa [--b B] [--lk LK] [--threads T] [--reps N] [--quick] [--mask] [--types LIST]\n"
    "  ggml_flash_attn_ext, decoding (Lq 1, Hq 32, Hkv 8, D 128, B 1, Lk 16384), over\n"
    "  f32, f16, q8_0 and q4_0 K/V (LIST: comma-separated subset); --quick: Lk 2048, 3 reps\n";

int main(int argc, char **argv) {
    int64_t B = 1, Lk = 16384;
    int threads = 2, reps = 21, use_mask = 0;
    const char *types = "f32,f16,q8_0,q4_0";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const int more = i + 1 < argc;
        if (!strcmp(a, "--b") && more) B = atoll(argv[++i]);
        else if (!strcmp(a, "--lk") && more) Lk = atoll(argv[++i]);
        else if (!strcmp(a, "--threads") && more) threads = atoi(argv[++i]);
        else if (!strcmp(a, "--reps") && more) reps = atoi(argv[++i]);
        else if (!strcmp(a, "--types") && more) types = argv[++i];
        else if (!strcmp(a, "--quick")) Lk = 2048, reps = 3;
        else if (!strcmp(a, "--mask")) use_mask = 1;
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) return fputs(USAGE, stdout), 0;
        else return fprintf(stderr, "ggml_fa: unknown option %s\n%s", a, USAGE), 2;
    }
    if (B < 1 || Lk < 1 || threads < 1 || reps < 1) return fputs(USAGE, stderr), 2;
    const int64_t Hq = 32, Hkv = 8, Lq = 1, D = 128;
    const int64_t nkv = B * Hkv * Lk * D, nq = B * Hq * Lq * D;
    const float scale = 1.0f / sqrtf((float)D);
    printf("ggml flash_attn_ext, decoding: B=%lld Hq=%lld Hkv=%lld Lq=%lld Lk=%lld D=%lld, f32 q, "
           "%d threads, %s, %d reps, ggml %s\n", (long long)B, (long long)Hq, (long long)Hkv,
           (long long)Lq, (long long)Lk, (long long)D, threads, use_mask ? "zero f16 mask" : "no mask",
           reps, ggml_version());

    float *kf = malloc((size_t)nkv * 4), *vf = malloc((size_t)nkv * 4), *qf = malloc((size_t)nq * 4);
    float *kd = malloc((size_t)(Lk * D) * 4), *vd = malloc((size_t)(Lk * D) * 4);
    double *ref = malloc((size_t)nq * 8), *p = malloc((size_t)Lk * 8), *t = malloc((size_t)reps * 8);
    if (!kf || !vf || !qf || !kd || !vd || !ref || !p || !t) return fprintf(stderr, "ggml_fa: out of memory\n"), 1;
    fill(kf, nkv, 11), fill(vf, nkv, 12), fill(qf, nq, 13);

    struct ggml_threadpool_params tpp = ggml_threadpool_params_default(threads);
    struct ggml_threadpool *tp = ggml_threadpool_new(&tpp);
    if (!tp) return fprintf(stderr, "ggml_fa: ggml_threadpool_new failed\n"), 1;

    static const struct { const char *name; enum ggml_type type; } T[] = {
        {"f32", GGML_TYPE_F32}, {"f16", GGML_TYPE_F16}, {"q8_0", GGML_TYPE_Q8_0}, {"q4_0", GGML_TYPE_Q4_0}};
    int failed = 0;
    for (size_t ti = 0; ti < sizeof T / sizeof T[0]; ti++) {
        {  // in the --types list?
            const size_t n = strlen(T[ti].name);
            const char *s = types;
            int found = 0;
            while (*s) {
                const char *e = strchr(s, ',');
                const size_t m = e ? (size_t)(e - s) : strlen(s);
                if (m == n && !strncmp(s, T[ti].name, n)) found = 1;
                if (!e) break;
                s = e + 1;
            }
            if (!found) continue;
        }
        const enum ggml_type ty = T[ti].type;
        const size_t kv_bytes = ggml_row_size(ty, D) * (size_t)(Lk * Hkv * B);
        const size_t mask_bytes = use_mask ? (size_t)(Lk * Lq) * 2 : 0;
        const size_t mem = 2 * kv_bytes + 2 * (size_t)nq * 4 + mask_bytes + 16 * ggml_tensor_overhead() +
                           ggml_graph_overhead() + (1u << 20);
        struct ggml_init_params ip = {mem, NULL, false};
        struct ggml_context *ctx = ggml_init(ip);
        if (!ctx) return fprintf(stderr, "ggml_fa: ggml_init of %zu bytes failed\n", mem), 1;
        struct ggml_tensor *q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, D, Lq, Hq, B);
        struct ggml_tensor *k = ggml_new_tensor_4d(ctx, ty, D, Lk, Hkv, B);
        struct ggml_tensor *v = ggml_new_tensor_4d(ctx, ty, D, Lk, Hkv, B);
        struct ggml_tensor *m = NULL;
        memcpy(q->data, qf, (size_t)nq * 4);  // [B][Hq][Lq][D], as ggml's ne order
        ggml_quantize_chunk(ty, kf, k->data, 0, B * Hkv * Lk, D, NULL);
        ggml_quantize_chunk(ty, vf, v->data, 0, B * Hkv * Lk, D, NULL);
        if (use_mask) {
            m = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, Lk, Lq, 1, 1);
            memset(m->data, 0, ggml_nbytes(m));  // 0 is +0.0 in f16
        }
        struct ggml_tensor *o = ggml_flash_attn_ext(ctx, q, k, v, m, scale, 0.0f, 0.0f);
        ggml_flash_attn_ext_set_prec(o, GGML_PREC_F32);
        struct ggml_cgraph *gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, o);
        struct ggml_cplan plan = ggml_graph_plan(gf, threads, tp);
        void *work = plan.work_size ? malloc(plan.work_size) : NULL;
        if (plan.work_size && !work) return fprintf(stderr, "ggml_fa: out of memory\n"), 1;
        plan.work_data = work;
        if (ggml_graph_compute(gf, &plan) != GGML_STATUS_SUCCESS) {
            printf("ggml %-5s skipped: ggml_graph_compute failed\n", T[ti].name);
            free(work), ggml_free(ctx);
            continue;
        }

        /* the float64 reference over the dequantized cache; o is [D, Hq, Lq, B] */
        const int64_t g = Hq / Hkv;
        for (int64_t b = 0; b < B; b++)
            for (int64_t hk = 0; hk < Hkv; hk++) {
                const int64_t r0 = (b * Hkv + hk) * Lk;
                to_f32(k, r0, Lk, kd), to_f32(v, r0, Lk, vd);
                for (int64_t h = hk * g; h < (hk + 1) * g; h++)
                    for (int64_t i = 0; i < Lq; i++) {
                        const float *qi = qf + ((b * Hq + h) * Lq + i) * D;
                        double mx = -INFINITY, sum = 0;
                        for (int64_t j = 0; j < Lk; j++) {
                            double s = 0;
                            for (int64_t d = 0; d < D; d++) s += (double)qi[d] * kd[j * D + d];
                            p[j] = s / sqrt((double)D);
                            if (p[j] > mx) mx = p[j];
                        }
                        for (int64_t j = 0; j < Lk; j++) sum += (p[j] = exp(p[j] - mx));
                        double *r = ref + ((b * Lq + i) * Hq + h) * D;
                        for (int64_t d = 0; d < D; d++) r[d] = 0;
                        for (int64_t j = 0; j < Lk; j++)
                            for (int64_t d = 0; d < D; d++) r[d] += p[j] * vd[j * D + d];
                        for (int64_t d = 0; d < D; d++) r[d] /= sum;
                    }
            }
        const float *of = (const float *)o->data;
        double num = 0, den = 0, mxe = 0;
        for (int64_t e = 0; e < nq; e++) {
            const double dlt = (double)of[e] - ref[e];
            num += dlt * dlt, den += ref[e] * ref[e];
            if (fabs(dlt) > mxe) mxe = fabs(dlt);
        }
        const double rel = sqrt(num / den);
        if (!(rel <= 5e-2)) {
            printf("ggml %-5s rel_err %.2e max_err %.2e FAILED (above 5e-2: a wrong call or layout%s); "
                   "not timed\n", T[ti].name, rel, mxe,
                   ty == GGML_TYPE_F16 ? ", or at a long Lk ggml's float16 P.V accumulator" : "");
            failed = 1;
            free(work), ggml_free(ctx);
            continue;
        }

        for (int w = 0; w < 2; w++) ggml_graph_compute(gf, &plan);
        for (int r = 0; r < reps; r++) {
            flush_read(kf, vf, nkv);
            const double t0 = now_s();
            ggml_graph_compute(gf, &plan);
            t[r] = now_s() - t0;
        }
        qsort(t, (size_t)reps, sizeof *t, cmp_d);
        const double med = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
        printf("ggml %-5s rel_err %.2e max_err %.2e median_ms %.3f cache_MiB %.1f GB/s %.2f\n", T[ti].name, rel,
               mxe, med * 1e3, 2.0 * (double)kv_bytes / 1048576, 2.0 * (double)kv_bytes / med * 1e-9);
        fflush(stdout);
        free(work), ggml_free(ctx);
    }
    ggml_threadpool_free(tp);
    free(kf), free(vf), free(qf), free(kd), free(vd), free(ref), free(p), free(t);
    return failed;
}
