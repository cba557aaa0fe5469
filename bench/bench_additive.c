/*
 * bench_additive.c — `attn bench --additive`: the rows of additive (Bahdanau) attention.
 *
 * Method (docs/ADDITIVE.md quotes it):
 *   - the case is B = 8, Lq = Lk = 512, Dq = Dk = Dv = 128, A = 128 float32 (--quick: B = 2,
 *     Lq = Lk = 128); batch 0 is checked against ATTN_PATH_REFERENCE first (O and every
 *     gradient, relative Frobenius <= 1e-5 and max <= 1e-4 (1 + max|ref|), the additive
 *     tolerance of docs/CONTRACT.md); --plant-error scales one output first and must fail;
 *   - one warm-up call, then --reps timed calls (default 5); the median is reported;
 *   - the scoring rate is pairs x A / time, pairs = B Lq Lk (no mask), and it is set beside
 *     a tight loop of the same vectorized tanh (attn_additive_tanh, on an L1-resident
 *     buffer per thread, all threads) measured in the same run: tanh/s. Both by wall time
 *     and per CPU-second of the process (the second is the fairer ratio on a machine
 *     shared with other work, where the two are timed under different loads);
 *   - the extra memory is the fused path's: Qp and Kpᵀ (B (Lq + Lk) A floats) and one
 *     tile scratch per thread, beside the Lq Lk A floats per batch a broadcast
 *     implementation materializes.
 *   - --vs torch: the same inputs written to a temporary folder for a child Python
 *     (scripts/bench_additive_torch.py, --python PATH, default .venv-bench/bin/python)
 *     that runs the broadcast implementation its users write (W s + U h broadcast over
 *     [B, Lq, Lk, A], tanh, @ v, masked_fill by the key lengths, softmax, @ V, the
 *     projections inside the call as attn's); its output and gradients are checked against
 *     attn's (the additive tolerance) before anything is timed; then one attn call and one
 *     PyTorch call in turn (forward, then forward + backward), --reps of each after a
 *     warm-up, medians and the ratio; the peak memory of one call on each side, by the same
 *     method (the resident high-water mark above the resident size before it, VmHWM reset
 *     through /proc/self/clear_refs), attn's measured on its first calls of the process.
 *     Both sides get the key lengths (all Lk) in this mode.
 * What it is not: a test (no time limit anywhere).
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "attn.h"
#include "bench_clock.h"
#include "bench_peer.h"
#include "cliopt.h"
#include "json.h"

typedef struct add_case {
    int64_t B, L, D, A;
    float *q, *k, *v, *o, *lse, *d_o, *dq, *dk, *dv;
    float *W, *U, *vv, *bias, *gW, *gU, *gv, *gb;
    attn_tensor tq, tk, tv, to, tl, tdo, tdq, tdk, tdv;
    int64_t *kvl;          /* key lengths (all L), given to the calls when use_kvl */
    attn_tensor tkvl;
    bool use_kvl;
    attn_additive_weights w;
    attn_additive_grads g;
} add_case;

static float *filled(int64_t n, uint64_t seed, double scale) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        p[i] = (float)(scale * ((double)(seed >> 11) * 0x1.0p-53 * 2.0 - 1.0));
    }
    return p;
}

static void build(add_case *c, int64_t B, int64_t L, int64_t D, int64_t A) {
    memset(c, 0, sizeof *c);
    c->B = B; c->L = L; c->D = D; c->A = A;
    const int64_t n = B * L * D;
    c->q = filled(n, 1, 1); c->k = filled(n, 2, 1); c->v = filled(n, 3, 1);
    c->d_o = filled(n, 4, 1);
    c->o = malloc((size_t)n * 4); c->dq = malloc((size_t)n * 4);
    c->dk = malloc((size_t)n * 4); c->dv = malloc((size_t)n * 4);
    c->lse = malloc((size_t)(B * L) * 4);
    c->W = filled(D * A, 5, 1 / sqrt((double)D)); c->U = filled(D * A, 6, 1 / sqrt((double)D));
    c->vv = filled(A, 7, 1); c->bias = filled(A, 8, 0.5);
    c->gW = malloc((size_t)(D * A) * 4); c->gU = malloc((size_t)(D * A) * 4);
    c->gv = malloc((size_t)A * 4); c->gb = malloc((size_t)A * 4);
    c->tq = attn_tensor_4d(c->q, ATTN_F32, B, 1, L, D);
    c->tk = attn_tensor_4d(c->k, ATTN_F32, B, 1, L, D);
    c->tv = attn_tensor_4d(c->v, ATTN_F32, B, 1, L, D);
    c->to = attn_tensor_4d(c->o, ATTN_F32, B, 1, L, D);
    c->tdo = attn_tensor_4d(c->d_o, ATTN_F32, B, 1, L, D);
    c->tdq = attn_tensor_4d(c->dq, ATTN_F32, B, 1, L, D);
    c->tdk = attn_tensor_4d(c->dk, ATTN_F32, B, 1, L, D);
    c->tdv = attn_tensor_4d(c->dv, ATTN_F32, B, 1, L, D);
    c->tl = attn_tensor_4d(c->lse, ATTN_F32, B, 1, L, 1);
    c->w = (attn_additive_weights){A, c->W, c->U, c->vv, c->bias, false, 0};
    c->g = (attn_additive_grads){c->gW, c->gU, c->gv, c->gb, NULL};
    c->kvl = malloc((size_t)B * sizeof(int64_t));
    for (int64_t b = 0; b < B; b++) c->kvl[b] = L;
    c->tkvl = attn_tensor_4d(c->kvl, ATTN_I64, B, 1, 1, 1);
}

static void release(add_case *c) {
    float *all[] = {c->q, c->k, c->v, c->o, c->lse, c->d_o, c->dq, c->dk, c->dv,
                    c->W, c->U, c->vv, c->bias, c->gW, c->gU, c->gv, c->gb};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    free(c->kvl);
}

static attn_status fwd(add_case *c, attn_path path, int threads) {
    attn_options opt = {.lse = &c->tl, .path = path, .threads = threads,
                        .kv_len = c->use_kvl ? &c->tkvl : NULL};
    return attn_additive_forward(&c->tq, &c->tk, &c->tv, &c->w, &c->to, &opt);
}

static attn_status bwd(add_case *c, attn_path path, int threads) {
    attn_options opt = {.path = path, .threads = threads, .kv_len = c->use_kvl ? &c->tkvl : NULL};
    return attn_additive_backward(&c->tq, &c->tk, &c->tv, &c->w, &c->to, &c->tdo, &c->tl,
                                  &c->tdq, &c->tdk, &c->tdv, &c->g, &opt);
}

/* The additive tolerance of docs/CONTRACT.md, times `loose` (1 for attn's answers). */
static bool within_x(const char *what, const float *got, const float *ref, int64_t n,
                     double loose) {
    double num = 0, den = 0, mx = 0, mref = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - ref[i]);
        if (!(d == d)) return printf("  check %s: NaN\n", what), false;
        num += d * d; den += (double)ref[i] * ref[i];
        if (d > mx) mx = d;
        if (fabs(ref[i]) > mref) mref = fabs(ref[i]);
    }
    const double rel = sqrt(num / (den > 0 ? den : 1));
    const bool ok = rel <= 1e-5 * loose && mx <= 1e-4 * loose * (1 + mref);
    printf("  check %-9s relative %.2e  max %.2e  %s\n", what, rel, mx, ok ? "ok" : "FAILED");
    return ok;
}

static bool within(const char *what, const float *got, const float *ref, int64_t n) {
    return within_x(what, got, ref, n, 1);
}

/* Batch 0 of the case against the float64 path: O, then every gradient. */
static bool check(add_case *c, int threads, bool plant) {
    add_case one;
    build(&one, 1, c->L, c->D, c->A);
    const int64_t n = c->L * c->D, nw = c->D * c->A;
    memcpy(one.q, c->q, (size_t)n * 4); memcpy(one.k, c->k, (size_t)n * 4);
    memcpy(one.v, c->v, (size_t)n * 4); memcpy(one.d_o, c->d_o, (size_t)n * 4);
    bool ok = fwd(c, ATTN_PATH_FUSED, threads) == ATTN_OK && bwd(c, ATTN_PATH_FUSED, threads) == ATTN_OK;
    ok = ok && fwd(&one, ATTN_PATH_REFERENCE, 1) == ATTN_OK && bwd(&one, ATTN_PATH_REFERENCE, 1) == ATTN_OK;
    if (!ok) {
        printf("  check: a call failed: %s\n", attn_last_error());
        release(&one);
        return false;
    }
    if (plant) c->o[17] += 1e-3f * (1.0f + fabsf(c->o[17]));
    ok &= within("O", c->o, one.o, n);
    ok &= within("dq", c->dq, one.dq, n);
    ok &= within("dk", c->dk, one.dk, n);
    ok &= within("dv", c->dv, one.dv, n);
    /* the weights' gradients sum over the batches: compared on a B = 1 run of the fused path */
    float *gW = malloc((size_t)nw * 4), *gb = malloc((size_t)c->A * 4);
    memcpy(gW, one.gW, (size_t)nw * 4); memcpy(gb, one.gb, (size_t)c->A * 4);
    ok &= bwd(&one, ATTN_PATH_FUSED, threads) == ATTN_OK || (fwd(&one, ATTN_PATH_FUSED, threads), false);
    ok &= within("dW", one.gW, gW, nw);
    ok &= within("db", one.gb, gb, c->A);
    free(gW); free(gb);
    release(&one);
    return ok;
}

/* Median wall and CPU seconds of `reps` calls after one warm-up. */
static void time_calls(add_case *c, int threads, int reps, bool backward, double *wall,
                       double *cpu) {
    double t[64], u[64];
    if (reps > 64) reps = 64;
    (backward ? bwd : fwd)(c, ATTN_PATH_FUSED, threads);  /* warm-up */
    for (int r = 0; r < reps; r++) {
        const double t0 = now_s(), u0 = cpu_s();
        (backward ? bwd : fwd)(c, ATTN_PATH_FUSED, threads);
        t[r] = now_s() - t0;
        u[r] = cpu_s() - u0;
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp_double);
    qsort(u, (size_t)reps, sizeof u[0], cmp_double);
    *wall = t[reps / 2];
    *cpu = u[reps / 2];
}

/* tanh per second of attn_additive_tanh on 4096 floats per thread, all threads, one
 * trial: by wall time and per CPU-second */
static void tanh_trial(int threads, double *wall_rate, double *cpu_rate) {
    enum { N = 4096, ROUNDS = 4000 };
    double t0 = 0, t1 = 0, u0 = 0, u1 = 0;
    int nt = 1;
#pragma omp parallel num_threads(threads > 0 ? threads : omp_get_max_threads())
    {
        float *x = filled(N, 9 + (uint64_t)omp_get_thread_num(), 4), *y = malloc(N * 4);
        attn_additive_tanh(N, x, y);
#pragma omp barrier
#pragma omp master
        {
            nt = omp_get_num_threads();
            t0 = now_s();
            u0 = cpu_s();
        }
        for (int r = 0; r < ROUNDS; r++) {
            attn_additive_tanh(N, x, y);
            x[r % N] = y[(r * 7) % N];  /* keeps the calls dependent on each other */
        }
#pragma omp barrier
#pragma omp master
        {
            t1 = now_s();
            u1 = cpu_s();
        }
        free(x); free(y);
    }
    const double n = (double)N * ROUNDS * nt;
    *wall_rate = n / (t1 - t0);
    *cpu_rate = n / (u1 - u0);
}

/* ---- --vs torch: the PyTorch side (scripts/bench_additive_torch.py) --------------------- */

/* A field of /proc/self/status in KiB, or -1. */
static long status_kib(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long v = -1;
    const size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, field, n) == 0 && line[n] == ':') {
            v = strtol(line + n + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

/* The resident high-water mark one call of `fn` reaches above the resident size before
 * it, in bytes (the method of scripts/bench_additive_torch.py); -1 if /proc cannot tell. */
static double peak_of(void (*fn)(add_case *, int), add_case *c, int threads) {
    const long rss = status_kib("VmRSS");
    FILE *f = fopen("/proc/self/clear_refs", "w");  /* "5" resets VmHWM (Linux >= 4.0) */
    bool reset = false;
    if (f) {
        reset = fputs("5", f) >= 0;
        reset = fclose(f) == 0 && reset;
    }
    fn(c, threads);
    const long hwm = status_kib("VmHWM");
    if (!reset || rss < 0 || hwm < 0) return -1;
    return hwm > rss ? (double)(hwm - rss) * 1024 : 0;
}

static void call_fwd(add_case *c, int threads) { fwd(c, ATTN_PATH_FUSED, threads); }
static void call_train(add_case *c, int threads) {
    fwd(c, ATTN_PATH_FUSED, threads);
    bwd(c, ATTN_PATH_FUSED, threads);
}

static bool write_raw(const char *dir, const char *name, const void *p, size_t bytes) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    const bool ok = f && fwrite(p, 1, bytes, f) == bytes;
    if (f && fclose(f) != 0) return false;
    if (!ok) fprintf(stderr, "attn: bench --additive: cannot write %s\n", path);
    return ok;
}

/* n floats of the file <prefix><name>.f32 in dir; NULL (told) if absent or of another size. */
static float *read_answer(const char *dir, const char *prefix, const char *name, int64_t n) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s%s.f32", dir, prefix, name);
    FILE *f = fopen(path, "rb");
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    bool ok = f && p && fread(p, sizeof(float), (size_t)n, f) == (size_t)n && fgetc(f) == EOF;
    if (f) fclose(f);
    if (!ok) {
        printf("  check %s: %s missing or not %lld floats\n", name, path, (long long)n);
        free(p);
        return NULL;
    }
    return p;
}

/* One request line to the PyTorch side and its answer (a JSON object, the caller frees
 * it), or NULL with the reason printed. */
static jnode *ask(torch_proc *tp, const char *request) {
    fputs(request, tp->to);
    fputc('\n', tp->to);
    fflush(tp->to);
    static char line[65536];
    if (!fgets(line, sizeof line, tp->from)) {
        fprintf(stderr, "attn: bench --additive: the PyTorch process ended\n");
        return NULL;
    }
    size_t len = strlen(line);
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
    char err[256];
    jnode *j = json_parse(line, len, err, sizeof err);
    const char *e = j && j->type == J_OBJ ? jget_str(j, "error") : NULL;
    if (!j || j->type != J_OBJ || e) {
        fprintf(stderr, "attn: bench --additive: PyTorch: %s\n",
                e ? e : j ? "not a JSON object" : err);
        json_free(j);
        return NULL;
    }
    return j;
}

/* Seconds of one PyTorch call ("forward" or "train"), or -1 (told). */
static double torch_time(torch_proc *tp, const char *what) {
    char req[64];
    snprintf(req, sizeof req, "{\"time\": \"%s\"}", what);
    jnode *j = ask(tp, req);
    double s = -1;
    if (j && !jget_num(j, "s", &s)) {
        fprintf(stderr, "attn: bench --additive: PyTorch: no time in its answer\n");
        s = -1;
    }
    json_free(j);
    return s;
}

/* The files the two sides wrote into dir, then dir itself. */
static void remove_folder(const char *dir, const char *const names[8]) {
    static const char *const inputs[] = {"q.f32", "k.f32", "v.f32", "W.f32", "U.f32",
                                         "vv.f32", "b.f32", "d_o.f32", "key_len.i64"};
    static const char *const prefixes[] = {"attn_", "torch_", "ref_"};
    char path[PATH_MAX + 64];
    for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, inputs[i]);
        unlink(path);
    }
    for (int p = 0; p < 3; p++)
        for (int i = 0; i < 8; i++) {
            snprintf(path, sizeof path, "%s/%s%s.f32", dir, prefixes[p], names[i]);
            unlink(path);
        }
    if (rmdir(dir) != 0)
        fprintf(stderr, "attn: bench --additive: could not remove %s: %s\n", dir, strerror(errno));
}

typedef struct torch_args {
    const char *vs, *python, *script;
    bool plant;   /* --plant-torch-error */
} torch_args;

/* The inputs to a temporary folder, the PyTorch side's outputs checked against attn's
 * (c holds attn's full-batch fused results: check() ran), then the interleaved timing and
 * the memory rows. 0, or 1 (a failed check or a PyTorch error, told). */
static int vs_torch(add_case *c, torch_proc *tp, int threads, int nt, int reps, bool plant,
                    double attn_peak_f, double attn_peak_t) {
    const int64_t B = c->B, L = c->L, D = c->D, A = c->A, n = B * L * D, nw = D * A;
    char dir[PATH_MAX];
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/attn_bench_additive.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) return fprintf(stderr, "attn: bench --additive: mkdtemp failed\n"), 1;
    const size_t f4 = sizeof(float);
    bool ok = write_raw(dir, "q.f32", c->q, (size_t)n * f4) &&
              write_raw(dir, "k.f32", c->k, (size_t)n * f4) &&
              write_raw(dir, "v.f32", c->v, (size_t)n * f4) &&
              write_raw(dir, "W.f32", c->W, (size_t)nw * f4) &&
              write_raw(dir, "U.f32", c->U, (size_t)nw * f4) &&
              write_raw(dir, "vv.f32", c->vv, (size_t)A * f4) &&
              write_raw(dir, "b.f32", c->bias, (size_t)A * f4) &&
              write_raw(dir, "d_o.f32", c->d_o, (size_t)n * f4) &&
              write_raw(dir, "key_len.i64", c->kvl, (size_t)B * sizeof(int64_t));
    const char *names[] = {"o", "dq", "dk", "dv", "dW", "dU", "dvv", "db"};
    const float *mine[] = {c->o, c->dq, c->dk, c->dv, c->gW, c->gU, c->gv, c->gb};
    const int64_t sizes[] = {n, n, n, n, nw, nw, A, A};
    /* attn's own answers too, attn_<name>.f32: for a stand-in side (tests/test_bench.sh) */
    for (int i = 0; ok && i < 8; i++) {
        char file[32];
        snprintf(file, sizeof file, "attn_%s.f32", names[i]);
        ok = write_raw(dir, file, mine[i], (size_t)sizes[i] * f4);
    }
    double peak_f = -1, peak_t = -1;
    if (ok) {
        char req[PATH_MAX + 256];
        snprintf(req, sizeof req, "{\"load\": \"%s\", \"B\": %lld, \"Lq\": %lld, \"Lk\": %lld, "
                 "\"Dq\": %lld, \"Dk\": %lld, \"Dv\": %lld, \"A\": %lld, \"threads\": %d}", dir,
                 (long long)B, (long long)L, (long long)L, (long long)D, (long long)D,
                 (long long)D, (long long)A, nt);
        jnode *j = ask(tp, req);
        ok = j != NULL;
        if (j) {
            jget_num(j, "peak_forward_bytes", &peak_f);
            jget_num(j, "peak_train_bytes", &peak_t);
        }
        json_free(j);
    }
    /* attn's answers and PyTorch's, every batch and the weights' gradients summed over
     * them, against the float64 evaluation of the PyTorch side: attn's at the additive
     * tolerance, PyTorch's at 10 times it (the check is that it computes the same
     * function; its float32 sum of d_v over the B Lq Lk pairs is off by 2.3e-5 relative
     * at the shape, where attn's partial sums give 1.5e-6) */
    for (int i = 0; ok && i < 8; i++) {
        float *t = read_answer(dir, "torch_", names[i], sizes[i]);
        float *r = t ? read_answer(dir, "ref_", names[i], sizes[i]) : NULL;
        if (r) {
            if (plant && i == 0) {  /* twice PyTorch's max tolerance */
                float top = 0.0f;
                for (int64_t e = 0; e < sizes[i]; e++) top = fmaxf(top, fabsf(r[e]));
                t[17] += 2e-3f * (1.0f + top);
            }
            char what[32];
            snprintf(what, sizeof what, "%-3s attn", names[i]);
            ok &= within(what, mine[i], r, sizes[i]);
            snprintf(what, sizeof what, "%-3s torch", names[i]);
            ok &= within_x(what, t, r, sizes[i], 10);
        } else {
            ok = false;
        }
        free(t);
        free(r);
    }
    remove_folder(dir, names);
    if (!ok) return printf("check FAILED: PyTorch's answer is not attn's: nothing timed\n"), 1;

    /* one attn call, one PyTorch call, in turn, after a warm-up of each */
    double ta[2][64], tt[2][64];
    for (int w = 0; w < 2; w++) {
        const char *what = w ? "train" : "forward";
        void (*fn)(add_case *, int) = w ? call_train : call_fwd;
        fn(c, threads);
        if (torch_time(tp, what) < 0) return 1;
        for (int r = 0; r < reps; r++) {
            const double t0 = now_s();
            fn(c, threads);
            ta[w][r] = now_s() - t0;
            if ((tt[w][r] = torch_time(tp, what)) < 0) return 1;
        }
    }
    printf("  vs PyTorch %s (%s), the broadcast implementation, interleaved, median of %d:\n",
           tp->version, tp->info, reps);
    printf("  %-18s %9s %10s %11s %13s %13s\n", "", "attn ms", "torch ms", "torch/attn",
           "attn peak MiB", "torch peak MiB");
    const double peaks[2][2] = {{attn_peak_f, peak_f}, {attn_peak_t, peak_t}};
    for (int w = 0; w < 2; w++) {
        const double ma = median(ta[w], reps), mt = median(tt[w], reps);
        char pa[32], pt[32];
        snprintf(pa, sizeof pa, peaks[w][0] < 0 ? "n/a" : "%.1f", peaks[w][0] / 1048576);
        snprintf(pt, sizeof pt, peaks[w][1] < 0 ? "n/a" : "%.1f", peaks[w][1] / 1048576);
        printf("  %-18s %9.2f %10.2f %10.2fx %13s %13s\n", w ? "forward+backward" : "forward",
               ma * 1e3, mt * 1e3, mt / ma, pa, pt);
    }
    printf("  (peak: the resident high-water mark of one call above the resident size before "
           "it; attn's on its first calls)\n");
    return 0;
}

/* --vs, --python and --torch-script taken out of argv (the rest goes to bench_part_scan);
 * 0, or 2 on a usage error (told). */
static int scan_torch(int *argc, char **argv, torch_args *ta) {
    *ta = (torch_args){0};
    int out = 1;
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], "--plant-torch-error") == 0) {
            if (ta->plant) {
                fprintf(stderr, "attn: bench --additive: --plant-torch-error: given twice\n");
                return 2;
            }
            ta->plant = true;
            continue;
        }
        const char *names[] = {"--vs", "--python", "--torch-script"};
        const char **slots[] = {&ta->vs, &ta->python, &ta->script};
        int o = 0;
        size_t len = 0;
        for (; o < 3; o++) {
            len = strlen(names[o]);
            if (strncmp(argv[i], names[o], len) == 0 && (argv[i][len] == 0 || argv[i][len] == '='))
                break;
        }
        if (o == 3) {
            argv[out++] = argv[i];
            continue;
        }
        const char *value = argv[i][len] == '=' ? argv[i] + len + 1
                            : i + 1 < *argc && strncmp(argv[i + 1], "--", 2) != 0 ? argv[++i]
                                                                                   : NULL;
        if (!value || !*value || *slots[o]) {
            fprintf(stderr, "attn: bench --additive: %s: %s\n", names[o],
                    value && *value ? "given twice" : "missing value");
            return 2;
        }
        *slots[o] = value;
    }
    *argc = out;
    if (ta->vs && strcmp(ta->vs, "torch") != 0) {
        fprintf(stderr, "attn: bench --additive: --vs: only 'torch'\n");
        return 2;
    }
    if (!ta->vs && (ta->python || ta->script || ta->plant)) {
        fprintf(stderr, "attn: bench --additive: --python, --torch-script and "
                "--plant-torch-error go with --vs torch\n");
        return 2;
    }
    return 0;
}

static const char USAGE[] =
    "usage: attn bench --additive [--quick] [--threads N] [--reps N] [--plant-error]\n"
    "                             [--vs torch [--python PATH] [--torch-script PATH]\n"
    "                             [--plant-torch-error]]\n"
    "\n"
    "  Additive (Bahdanau) attention: B = 8, Lq = Lk = 512, D = 128, A = 128 float32, checked\n"
    "  against the float64 path, then the forward and backward timed; the scoring rate\n"
    "  (pairs x A per second) beside a tight loop of the same vectorized tanh.\n"
    "\n"
    "  --vs torch          also PyTorch's broadcast implementation (tanh(W s + U h) @ v, masked,\n"
    "                      softmax, @ V) on the same inputs: checked against attn's answer, then\n"
    "                      timed interleaved with attn's, forward and forward+backward, and the\n"
    "                      peak memory of each (scripts/bench_additive_torch.py, a child)\n"
    "  --python PATH       the Python that has torch (default .venv-bench/bin/python)\n"
    "  --torch-script P    the PyTorch side (default scripts/bench_additive_torch.py)\n"
    "  --plant-torch-error moves one output of PyTorch's: its check must fail (exit 1)\n"
    "  --plant-error       moves one output of attn's: its check must fail (exit 1)\n";

int bench_additive(int argc, char **argv) {
    torch_args ta;
    if (scan_torch(&argc, argv, &ta)) return 2;
    bench_part_args pa;
    const int rc = bench_part_scan(argc, argv, "--additive", USAGE, 3, 5, 64, &pa);
    if (rc >= 0) return rc;
    const bool quick = pa.quick, plant = pa.plant;
    const int threads = pa.threads, reps = pa.reps;
    const int64_t B = quick ? 2 : 8, L = quick ? 128 : 512, D = 128, A = 128;
    const int nt = threads > 0 ? threads : omp_get_max_threads();
    char py[PATH_MAX + 64] = "", script[PATH_MAX + 64] = "";
    if (ta.vs) {
        char root[PATH_MAX];
        source_root(root, sizeof root);
        snprintf(py, sizeof py, "%s", ta.python ? ta.python : "");
        if (!ta.python) snprintf(py, sizeof py, "%s/.venv-bench/bin/python", root);
        snprintf(script, sizeof script, "%s", ta.script ? ta.script : "");
        if (!ta.script) snprintf(script, sizeof script, "%s/scripts/bench_additive_torch.py", root);
        if (!ta.python && !file_exists(py)) {
            fprintf(stderr, "attn: bench --additive: --vs torch: %s not found: run 'attn bench "
                    "--setup-torch' first, or give --python\n", py);
            return 2;
        }
        if (!file_exists(script)) {
            fprintf(stderr, "attn: bench --additive: --vs torch: %s not found\n", script);
            return 2;
        }
    }
    printf("additive attention: B=%lld Lq=Lk=%lld Dq=Dk=Dv=%lld A=%lld float32, %d threads, "
           "kernel %s\n", (long long)B, (long long)L, (long long)D, (long long)A, nt,
           attn_kernel_name());
    add_case c;
    build(&c, B, L, D, A);
    torch_proc tp = {0};
    double attn_peak_f = -1, attn_peak_t = -1;
    if (ta.vs) {
        c.use_kvl = true;  /* PyTorch's side masks by the key lengths: so does attn's */
        /* the first calls of the process: nothing of theirs is resident before */
        attn_peak_f = peak_of(call_fwd, &c, threads);
        attn_peak_t = peak_of(call_train, &c, threads);
        signal(SIGPIPE, SIG_IGN);
        if (torch_start(&tp, py, script, nt)) {
            torch_stop(&tp);
            release(&c);
            return 1;
        }
    }
    const bool ok = check(&c, threads, plant);
    if (!ok) {
        torch_stop(&tp);
        release(&c);
        printf("check FAILED: nothing timed\n");
        return 1;
    }
    /* the forward and the tanh loop interleaved: one call, one trial of the loop, in turn */
    double tf[64], uf[64], th[64], uh[64], tb, ub;
    fwd(&c, ATTN_PATH_FUSED, threads);
    tanh_trial(threads, &th[0], &uh[0]);
    for (int r = 0; r < reps; r++) {
        const double t0 = now_s(), u0 = cpu_s();
        fwd(&c, ATTN_PATH_FUSED, threads);
        tf[r] = now_s() - t0;
        uf[r] = cpu_s() - u0;
        tanh_trial(threads, &th[r], &uh[r]);
    }
    double th_best = 0, uh_best = 0;
    for (int r = 0; r < reps; r++) {
        th_best = th[r] > th_best ? th[r] : th_best;
        uh_best = uh[r] > uh_best ? uh[r] : uh_best;
    }
    const double tfm = median(tf, reps), ufm = median(uf, reps);
    const double thm = median(th, reps), uhm = median(uh, reps);
    time_calls(&c, threads, reps, true, &tb, &ub);
    const double work = (double)B * L * L * A;
    const double extra = (double)B * 2 * L * A * 4 + nt * (2.0 * D + 64) * 4;
    printf("  %-18s %9s %12s %9s   %12s %9s\n", "", "wall ms", "G pair-A/s", "of tanh",
           "per CPU-s", "of tanh");
    printf("  %-18s %9.2f %12.3f %8.1f%%   %12.3f %8.1f%%\n", "forward (fused)", tfm * 1e3,
           work / tfm * 1e-9, 100 * work / tfm / thm, work / ufm * 1e-9, 100 * work / ufm / uhm);
    printf("  %-18s %9.2f %12.3f %9s   %12.3f\n", "backward (fused)", tb * 1e3,
           work / tb * 1e-9, "", work / ub * 1e-9);
    printf("  %-18s %9s %12.3f %9s   %12.3f   (G tanh/s; best trial %.3f, %.3f)\n",
           "tight tanh loop", "", thm * 1e-9, "", uhm * 1e-9, th_best * 1e-9, uh_best * 1e-9);
    printf("  (forward and tanh loop interleaved, medians of %d; the backward after them)\n", reps);
    printf("  extra memory: %.1f MiB (Qp, Kp^T, tiles); a broadcast implementation holds "
           "Lq*Lk*A floats per batch: %.1f MiB (x B = %.0f MiB)\n", extra / 1048576,
           (double)L * L * A * 4 / 1048576, (double)B * L * L * A * 4 / 1048576);
    int status = 0;
    if (ta.vs) status = vs_torch(&c, &tp, threads, nt, reps, ta.plant, attn_peak_f, attn_peak_t);
    torch_stop(&tp);
    release(&c);
    return status;
}
