/*
 * cli_bench.c — `attn bench`: measures this machine (fp32 FMA peak, memory read
 *               bandwidth), then times the fused forward pass over a sweep of shapes,
 *               each checked against the float64 reference first, optionally side by
 *               side with PyTorch's scaled_dot_product_attention (scripts/bench_torch.py).
 *
 * What it is: the measuring method written down once (docs/BENCHMARKS.md quotes it):
 *   - every case is checked against ATTN_PATH_REFERENCE with the contract's tolerance
 *     (relative Frobenius <= 1e-6 and max abs <= 1e-5 * (1 + max|ref|)) before it is
 *     timed; a large case checks a subset (the first key/value head's query heads, then
 *     the last rows, whose keys span the whole sequence: see pick_check), unless its
 *     reference is timed anyway (Lq, Lk <= --ref-max-l), which is then checked whole;
 *   - inputs are rotated through copies totalling at least rot_bytes (8x a 32 MiB L3), so
 *     that a timed call does not find its inputs in the cache left by the previous one;
 *   - warm-up calls, then at least --reps timed calls (more for short calls, until about
 *     one second has been timed, at most 50); the median is reported, min and max too;
 *   - 16-bit rows (bfloat16/float16 Q and/or K, V) are checked against the float64
 *     reference of the same 16-bit inputs by the half-precision rule of the contract: max
 *     error at most twice that of a naive same-precision implementation (tools/common/naive.c) on
 *     the checked part; each reports its speed over the float32 row of the same shape;
 *   - bwd-* rows time attn_backward alone (O and LSE made once by the forward) and check
 *     dQ, dK, dV against the reference backward at the contract's tolerance, on all rows
 *     of batch 0's first key/value group when the whole case is over the budget; their
 *     FLOPs are 2.5x the forward's (FlashAttention's convention);
 *   - FLOPs = 2 * (Dk + Dv) * B * Hq * pairs, pairs = Lq * Lk without a mask or with a
 *     bool mask (nothing can skip its keys), Lq * Lk / 2 for causal (the formula),
 *     and the exact count inside the band for a sliding window; decoding shapes also
 *     report GB/s = bytes of K and V read once / time.
 * What it is not: a test (no limit on any time; tests/test_bench.sh checks only that it
 * runs, checks and prints), nor a tuner: it changes nothing in the library. The ISA
 * loops that measure the machine are in src/kernels/<isa>/peak.c; the PyTorch side is a separate
 * Python process spoken to through pipes, one JSON line per case each way.
 */
#include <errno.h>
#include <fnmatch.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "attn.h"
#include "bench_case.h"
#include "bench_clock.h"
#include "bench_machine.h"
#include "bench_peer.h"
#include "cli.h"
#include "cliopt.h"
#include "half.h"
#include "naive.h"
#include "rng.h"
#include "tolerance.h"
#include "kernels/peak.h"

enum { EXIT_FAIL = 1, EXIT_USAGE = 2 };

/* Multiply-adds the reference may spend on one case's check by default: about a second
 * of its float64 scalar loops on this machine (--check-budget changes it). */
#define CHECK_BUDGET (256.0 * 1024 * 1024)

static const char BENCH_USAGE[] =
    "usage: attn bench [options]\n"
    "\n"
    "  Measures this machine's fp32 FMA peak and read bandwidth, then times the fused\n"
    "  forward pass over a sweep of shapes (float32, and bfloat16/float16 rows: bwd-* rows\n"
    "  time the backward); each case is checked against the float64 reference before it is\n"
    "  timed. Prints a table (or JSON); progress goes to stderr. Decoding rows (Lq = 1) also\n"
    "  report GB/s of K and V and its percent of a plain read of as many bytes, timed after\n"
    "  each of their calls.\n"
    "\n"
    "  --quick               a tiny sweep and short machine measurements (for tests)\n"
    "  --head-dims [--png FILE] [--tokens L]   (alone) the fused forward's speed against the\n"
    "                        head dimension, 8 to 256, as a table and a plot\n"
    "  --viz [--quick] [--tokens L] ...   (alone) the time and peak memory of attn viz's\n"
    "                        picture of L = 100000 causal tokens (attn bench --viz --help)\n"
    "  --models [--vs torch] ...   (alone) whole-model forwards through transformers, attn's\n"
    "                        backend beside sdpa and eager (attn bench --models --help)\n"
    "  masks [--vs torch] ...       (alone, no dashes) padding masks beside kv_len, and\n"
    "                        beside PyTorch's SDPA (attn bench masks --help)\n"
    "  --shapes PATTERNS     only the cases whose name matches one of the comma-separated\n"
    "                        shell patterns, e.g. 'fwd-L2048-*,decode-*' (see --list)\n"
    "  --list                print the names of the cases of the sweep and exit\n"
    "  --threads N           threads for both sides (default: all, OpenMP's default)\n"
    "  --reps N              at least N timed calls per case (default 5, --quick 3)\n"
    "  --warmup N            untimed calls before them (default 2, --quick 1)\n"
    "  --rounds N            time the whole sweep N times, one case after the other, and\n"
    "                        take each case's median over all its calls (default 1): a burst\n"
    "                        of other work then spoils a part of a case's calls, not all\n"
    "  --isa NAME            run these kernels of the library (ATTN_ISA; 'attn --version'\n"
    "                        lists those this CPU runs)\n"
    "  --ref-max-l N         also time the float64 reference path where Lq, Lk <= N\n"
    "                        (default 1024; 0 = never)\n"
    "  --no-machine          skip measuring the peak and the bandwidth\n"
    "  --machine-only        measure the peak and the bandwidth, run no case\n"
    "  --json                print one JSON object on stdout instead of the table\n"
    "  --json-out FILE       print the table and also write the JSON object to FILE\n"
    "  --vs torch            also time PyTorch's scaled_dot_product_attention on the CPU,\n"
    "                        same shapes, same method, same thread count, in this run\n"
    "  --setup-torch         create .venv-bench/ in the source tree and pip install torch,\n"
    "                        numpy and matplotlib into it (several GB from PyPI), then exit\n"
    "  --python PATH         the Python that has torch (default .venv-bench/bin/python)\n"
    "  --torch-script PATH   the PyTorch side (default scripts/bench_torch.py)\n"
    "  --plant-error         spoil one output element before the check (tests use it to see\n"
    "                        the check fail)\n"
    "  --check-budget N      multiply-adds the reference may spend checking one case before\n"
    "                        a subset is checked (default 268435456; a case whose reference\n"
    "                        is timed is checked whole)\n"
    "  --quiet               no progress on stderr\n"
    "\n"
    "  Exit status: 0 every case passed its check, 1 a check or a call failed, 2 usage.\n";

static int say(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("attn: bench: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return code;
}

/* ---- options ------------------------------------------------------------------------ */

typedef struct bench_args {
    bool quick, list, json, no_machine, machine_only, setup_torch, plant_error, quiet;
    const char *shapes, *isa, *vs, *python, *torch_script, *json_out;
    int threads, reps, warmup, rounds;
    int64_t ref_max_l;
    double check_budget;
} bench_args;

static bool parse_int(const char *s, int64_t lo, int64_t hi, int64_t *v) {
    if (!*s) return false;
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (*end || errno == ERANGE || x < lo || x > hi) return false;
    *v = x;
    return true;
}

static int parse_args(int argc, char **argv, bench_args *a) {
    const char *threads = NULL, *reps = NULL, *warmup = NULL, *ref_max_l = NULL, *budget = NULL,
               *rounds = NULL;
    const cli_opt opts[] = {
        {"--quick", NULL, &a->quick},           {"--list", NULL, &a->list},
        {"--json", NULL, &a->json},             {"--no-machine", NULL, &a->no_machine},
        {"--setup-torch", NULL, &a->setup_torch}, {"--plant-error", NULL, &a->plant_error},
        {"--quiet", NULL, &a->quiet},           {"--machine-only", NULL, &a->machine_only},
        {"--shapes", &a->shapes, NULL},
        {"--isa", &a->isa, NULL},               {"--vs", &a->vs, NULL},
        {"--python", &a->python, NULL},         {"--torch-script", &a->torch_script, NULL},
        {"--json-out", &a->json_out, NULL},     {"--threads", &threads, NULL},
        {"--reps", &reps, NULL},                {"--warmup", &warmup, NULL},
        {"--ref-max-l", &ref_max_l, NULL},      {"--check-budget", &budget, NULL},
        {"--rounds", &rounds, NULL},
    };
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(BENCH_USAGE, stdout);
            return -1;
        }
    const int rc = cli_scan(argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), "bench: ", "bench");
    if (rc) return rc;
    int64_t v;
    a->threads = 0;
    if (threads) {
        if (!parse_int(threads, 1, 512, &v))
            return say(EXIT_USAGE, "--threads: expected an integer from 1 to 512, got '%s'", threads);
        a->threads = (int)v;
    }
    a->reps = a->quick ? 3 : 5;
    if (reps) {
        if (!parse_int(reps, 1, 1000, &v))
            return say(EXIT_USAGE, "--reps: expected an integer from 1 to 1000, got '%s'", reps);
        a->reps = (int)v;
    }
    a->rounds = 1;
    if (rounds) {
        if (!parse_int(rounds, 1, 100, &v))
            return say(EXIT_USAGE, "--rounds: expected an integer from 1 to 100, got '%s'", rounds);
        a->rounds = (int)v;
    }
    a->warmup = a->quick ? 1 : 2;
    if (warmup) {
        if (!parse_int(warmup, 0, 1000, &v))
            return say(EXIT_USAGE, "--warmup: expected an integer from 0 to 1000, got '%s'", warmup);
        a->warmup = (int)v;
    }
    a->ref_max_l = 1024;
    if (ref_max_l) {
        if (!parse_int(ref_max_l, 0, INT64_MAX, &v))
            return say(EXIT_USAGE, "--ref-max-l: expected an integer >= 0, got '%s'", ref_max_l);
        a->ref_max_l = v;
    }
    a->check_budget = CHECK_BUDGET;
    if (budget) {
        if (!parse_int(budget, 1, INT64_MAX, &v))
            return say(EXIT_USAGE, "--check-budget: expected an integer >= 1, got '%s'", budget);
        a->check_budget = (double)v;
    }
    if (a->isa && !attn_kernel_supported(a->isa))
        return say(EXIT_USAGE, "--isa: '%s' is no kernel this build has and this CPU runs "
                   "(see 'attn --kernels')", a->isa);
    if (a->vs && strcmp(a->vs, "torch") != 0)
        return say(EXIT_USAGE, "--vs: only 'torch' is implemented, got '%s'", a->vs);
    if (a->json && a->json_out)
        return say(EXIT_USAGE, "--json and --json-out: choose one");
    if (a->machine_only && (a->no_machine || a->vs))
        return say(EXIT_USAGE, "--machine-only: runs no case, so neither --no-machine nor --vs");
    return 0;
}

/* ---- the cases ---------------------------------------------------------------------- */


static void add_case(bench_case *c, int *n, const char *name, int64_t B, int64_t Hq,
                     int64_t Hkv, int64_t Lq, int64_t Lk, int64_t D, mask_kind mask,
                     int64_t win_left, int64_t win_right, bool decode) {
    bench_case *x = &c[(*n)++];
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", name);
    x->B = B, x->Hq = Hq, x->Hkv = Hkv, x->Lq = Lq, x->Lk = Lk, x->Dk = D, x->Dv = D;
    x->mask = mask, x->win_left = win_left, x->win_right = win_right, x->decode = decode;
    x->ref_med = x->torch_med = x->torch_min = x->torch_max = x->base_ratio = -1.0;
    x->qdt = x->kvdt = ATTN_F32;
}

/* The last case added, made a 16-bit (or mixed) one: `base` is the float32 row of the
 * same shape that its speed is compared with. */
static void set_dtype(bench_case *c, int n, attn_dtype qdt, attn_dtype kvdt,
                      attn_precision prec, const char *base) {
    bench_case *x = &c[n - 1];
    x->qdt = qdt, x->kvdt = kvdt, x->prec = prec;
    snprintf(x->base, sizeof x->base, "%s", base);
}

static const char *dtype_short(attn_dtype t) {
    return t == ATTN_F16 ? "f16" : t == ATTN_BF16 ? "bf16" : "f32";
}

enum { MAX_CASES = 64 };

/* The default sweep (docs/BENCHMARKS.md) or, with --quick, a tiny one of the same kinds. */
static int make_sweep(bench_case *c, bool quick) {
    int n = 0;
    char name[64];
    const int64_t Ls[] = {512, 1024, 2048, 4096}, qLs[] = {64, 200};
    const int64_t Ds[] = {64, 128}, qDs[] = {16, 64};
    const int64_t H = quick ? 2 : 16;
    for (int li = 0; li < 4; li++) {
        if (quick && li >= 2) break;
        const int64_t L = quick ? qLs[li] : Ls[li];
        for (int di = 0; di < 2; di++)
            for (int causal = 0; causal < 2; causal++) {
                const int64_t D = quick ? qDs[di] : Ds[di];
                snprintf(name, sizeof name, "fwd-L%lld-D%lld%s", (long long)L, (long long)D,
                         causal ? "-causal" : "");
                add_case(c, &n, name, 1, H, H, L, L, D, causal ? MASK_CAUSAL : MASK_NONE,
                         0, 0, false);
            }
    }
    if (quick) {
        add_case(c, &n, "gqa-L96-D32-causal", 1, 4, 2, 96, 96, 32, MASK_CAUSAL, 0, 0, false);
        add_case(c, &n, "mask-L80-D32-bool", 2, 2, 2, 80, 80, 32, MASK_BOOL, 0, 0, false);
        add_case(c, &n, "win-L128-D32-w32", 1, 2, 2, 128, 128, 32, MASK_WINDOW, 31, 0, false);
        add_case(c, &n, "decode-Lk1000-D32", 1, 4, 2, 1, 1000, 32, MASK_NONE, 0, 0, true);
        add_case(c, &n, "fwd-L64-D16-bf16", 1, H, H, 64, 64, 16, MASK_NONE, 0, 0, false);
        set_dtype(c, n, ATTN_BF16, ATTN_BF16, ATTN_PRECISION_DEFAULT, "fwd-L64-D16");
        add_case(c, &n, "fwd-L64-D16-bf16-fast", 1, H, H, 64, 64, 16, MASK_NONE, 0, 0, false);
        set_dtype(c, n, ATTN_BF16, ATTN_BF16, ATTN_PRECISION_FAST, "fwd-L64-D16");
        add_case(c, &n, "decode-Lk1000-D32-kvf16", 1, 4, 2, 1, 1000, 32, MASK_NONE, 0, 0, true);
        set_dtype(c, n, ATTN_F32, ATTN_F16, ATTN_PRECISION_DEFAULT, "decode-Lk1000-D32");
        add_case(c, &n, "bwd-L64-D16", 1, H, H, 64, 64, 16, MASK_NONE, 0, 0, false);
        c[n - 1].bwd = true;
        add_case(c, &n, "bwd-L96-D32-gqa-causal", 1, 4, 2, 96, 96, 32, MASK_CAUSAL, 0, 0, false);
        c[n - 1].bwd = true;
    } else {
        add_case(c, &n, "gqa-L2048-D128", 1, 32, 8, 2048, 2048, 128, MASK_NONE, 0, 0, false);
        add_case(c, &n, "gqa-L2048-D128-causal", 1, 32, 8, 2048, 2048, 128, MASK_CAUSAL, 0, 0, false);
        add_case(c, &n, "mask-L2048-D64-bool", 1, 16, 16, 2048, 2048, 64, MASK_BOOL, 0, 0, false);
        add_case(c, &n, "win-L4096-D64-w512", 1, 16, 16, 4096, 4096, 64, MASK_WINDOW, 511, 0, false);
        add_case(c, &n, "decode-Lk16384-D128", 1, 32, 8, 1, 16384, 128, MASK_NONE, 0, 0, true);
        /* a GQA group of 8 query heads a key/value head (16 rows a tile) */
        add_case(c, &n, "decode-Lk16384-D128-g8", 1, 64, 8, 1, 16384, 128, MASK_NONE, 0, 0, true);
        /* issue 5: 16-bit forward and a 16-bit KV cache */
        add_case(c, &n, "fwd-L4096-D128-bf16", 1, 16, 16, 4096, 4096, 128, MASK_NONE, 0, 0, false);
        set_dtype(c, n, ATTN_BF16, ATTN_BF16, ATTN_PRECISION_DEFAULT, "fwd-L4096-D128");
        add_case(c, &n, "fwd-L4096-D128-bf16-fast", 1, 16, 16, 4096, 4096, 128, MASK_NONE, 0, 0, false);
        set_dtype(c, n, ATTN_BF16, ATTN_BF16, ATTN_PRECISION_FAST, "fwd-L4096-D128");
        add_case(c, &n, "fwd-L4096-D128-f16", 1, 16, 16, 4096, 4096, 128, MASK_NONE, 0, 0, false);
        set_dtype(c, n, ATTN_F16, ATTN_F16, ATTN_PRECISION_DEFAULT, "fwd-L4096-D128");
        add_case(c, &n, "decode-Lk16384-D128-kvbf16", 1, 32, 8, 1, 16384, 128, MASK_NONE, 0, 0, true);
        set_dtype(c, n, ATTN_F32, ATTN_BF16, ATTN_PRECISION_DEFAULT, "decode-Lk16384-D128");
        add_case(c, &n, "decode-Lk16384-D128-kvf16", 1, 32, 8, 1, 16384, 128, MASK_NONE, 0, 0, true);
        set_dtype(c, n, ATTN_F32, ATTN_F16, ATTN_PRECISION_DEFAULT, "decode-Lk16384-D128");
        add_case(c, &n, "decode-Lk16384-D128-bf16", 1, 32, 8, 1, 16384, 128, MASK_NONE, 0, 0, true);
        set_dtype(c, n, ATTN_BF16, ATTN_BF16, ATTN_PRECISION_DEFAULT, "decode-Lk16384-D128");
        add_case(c, &n, "decode-Lk16384-D128-bf16-fast", 1, 32, 8, 1, 16384, 128, MASK_NONE, 0, 0, true);
        set_dtype(c, n, ATTN_BF16, ATTN_BF16, ATTN_PRECISION_FAST, "decode-Lk16384-D128");
        /* issue 6: the backward, float32 */
        for (int di = 0; di < 2; di++)
            for (int causal = 0; causal < 2; causal++) {
                snprintf(name, sizeof name, "bwd-L2048-D%lld%s", (long long)Ds[di],
                         causal ? "-causal" : "");
                add_case(c, &n, name, 1, 16, 16, 2048, 2048, Ds[di],
                         causal ? MASK_CAUSAL : MASK_NONE, 0, 0, false);
                c[n - 1].bwd = true;
            }
    }
    return n;
}

/* Keys row i attends to structurally (top-left diagonal d_i = i). */
static int64_t band_pairs(const bench_case *c) {
    int64_t n = 0;
    for (int64_t i = 0; i < c->Lq; i++) {
        int64_t lo = c->win_left < 0 ? 0 : i - c->win_left;
        int64_t hi = c->win_right < 0 ? c->Lk - 1 : i + c->win_right;
        if (lo < 0) lo = 0;
        if (hi > c->Lk - 1) hi = c->Lk - 1;
        if (hi >= lo) n += hi - lo + 1;
    }
    return n;
}

static void count_work(bench_case *c) {
    double pairs = (double)c->Lq * (double)c->Lk;
    if (c->mask == MASK_CAUSAL) pairs *= 0.5;
    if (c->mask == MASK_WINDOW) pairs = (double)band_pairs(c);
    c->flop = 2.0 * (double)(c->Dk + c->Dv) * (double)c->B * (double)c->Hq * pairs;
    if (c->bwd) c->flop *= 2.5;  /* FlashAttention's convention (issue 6) */
    c->kv_bytes = (double)attn_dtype_size(c->kvdt) * (double)c->B * (double)c->Hkv * (double)c->Lk * (double)(c->Dk + c->Dv);
}

/* ---- inputs ------------------------------------------------------------------------- */

/* uniform in [-2, 2) from a fixed stream, so every run times the same numbers: with
 * scale 1/sqrt(Dk), logits of standard deviation about 1.3 */
static void fill_uniform(float *x, int64_t n, uint64_t seed) {
    rng_t r = {seed};
    for (int64_t i = 0; i < n; i++) x[i] = (float)rng_range(&r, -2.0, 2.0);
}

/* 16-bit storage of a float representable in t (naive_round gives one): the library's own
 * codec (half.h), exact for such a value */
static uint16_t half_bits(attn_dtype t, float x) {
    return t == ATTN_BF16 ? attn_f32_to_bf16(x) : attn_f32_to_f16(x);
}
static float half_value(attn_dtype t, uint16_t h) {
    return t == ATTN_BF16 ? attn_bf16_to_f32(h) : attn_f16_to_f32(h);
}
/* element i of a tensor's storage as float */
static float elem(attn_dtype t, const void *p, int64_t i) {
    return t == ATTN_F32 ? ((const float *)p)[i] : half_value(t, ((const uint16_t *)p)[i]);
}

typedef struct case_buffers {
    int rot;
    void *q[16], *k[16], *v[16], *o[16];   /* (B, Hq, Lq, Dk) (B, Hkv, Lk, Dk) ... in their dtypes */
    float *q32, *k32, *v32;                /* set 0's values as float (the naive check's input)  */
    float *d_o[16], *lse[16], *dq[16], *dk[16], *dv[16];  /* backward cases */
    unsigned char *mask;                   /* (1, 1, Lq, Lk), MASK_BOOL only       */
    void *ws;
    size_t ws_bytes;
} case_buffers;

static void free_buffers(case_buffers *cb) {
    for (int r = 0; r < 16; r++) {
        free(cb->q[r]), free(cb->k[r]), free(cb->v[r]), free(cb->o[r]);
        free(cb->d_o[r]), free(cb->lse[r]), free(cb->dq[r]), free(cb->dk[r]), free(cb->dv[r]);
    }
    free(cb->q32), free(cb->k32), free(cb->v32);
    free(cb->mask);
    free(cb->ws);
    memset(cb, 0, sizeof *cb);
}

static int64_t n_q(const bench_case *c) { return c->B * c->Hq * c->Lq * c->Dk; }
static int64_t n_k(const bench_case *c) { return c->B * c->Hkv * c->Lk * c->Dk; }
static int64_t n_v(const bench_case *c) { return c->B * c->Hkv * c->Lk * c->Dv; }
static int64_t n_o(const bench_case *c) { return c->B * c->Hq * c->Lq * c->Dv; }
static int64_t n_lse(const bench_case *c) { return c->B * c->Hq * c->Lq; }

/* n elements of `size` bytes, 64-byte aligned as PyTorch's tensors are (a cache line),
 * plus a spare line. */
static void *alloc64(int64_t n, size_t size) {
    return aligned_alloc(64, ((size_t)n * size + 127) / 64 * 64);
}

/* n uniform values rounded to t, stored in t, and as float in f32 (may be NULL) */
static void fill_typed(attn_dtype t, void *dst, float *f32, int64_t n, uint64_t seed) {
    float *x = t == ATTN_F32 ? dst : f32 ? f32 : malloc((size_t)n * sizeof(float));
    if (!x) abort();
    fill_uniform(x, n, seed);
    if (t != ATTN_F32)
        for (int64_t i = 0; i < n; i++) {
            x[i] = naive_round(t, x[i]);
            ((uint16_t *)dst)[i] = half_bits(t, x[i]);
        }
    if (f32 && t == ATTN_F32) memcpy(f32, x, (size_t)n * sizeof(float));
    if (x != dst && x != f32) free(x);
}

/* rot copies of the inputs and outputs, at least rot_bytes in all (at most 16 copies). */
static int alloc_buffers(const bench_case *c, double rot_bytes, case_buffers *cb) {
    memset(cb, 0, sizeof *cb);
    const size_t sq = attn_dtype_size(c->qdt), skv = attn_dtype_size(c->kvdt);
    double set_bytes = (double)sq * (double)(n_q(c) + n_o(c)) + (double)skv * (double)(n_k(c) + n_v(c));
    if (c->bwd) set_bytes += 4.0 * (double)(n_o(c) + n_lse(c) + n_q(c) + n_k(c) + n_v(c));
    int rot = (int)ceil(rot_bytes / (set_bytes > 1 ? set_bytes : 1));
    cb->rot = rot < 1 ? 1 : rot > 16 ? 16 : rot;
    if (!(cb->q32 = alloc64(n_q(c), 4)) || !(cb->k32 = alloc64(n_k(c), 4)) ||
        !(cb->v32 = alloc64(n_v(c), 4)))
        return -1;
    for (int r = 0; r < cb->rot; r++) {
        cb->q[r] = alloc64(n_q(c), sq);
        cb->k[r] = alloc64(n_k(c), skv);
        cb->v[r] = alloc64(n_v(c), skv);
        cb->o[r] = alloc64(n_o(c), sq);
        if (!cb->q[r] || !cb->k[r] || !cb->v[r] || !cb->o[r]) return -1;
        memset(cb->o[r], 0, (size_t)n_o(c) * sq);
        if (r == 0) {
            fill_typed(c->qdt, cb->q[0], cb->q32, n_q(c), 1);
            fill_typed(c->kvdt, cb->k[0], cb->k32, n_k(c), 2);
            fill_typed(c->kvdt, cb->v[0], cb->v32, n_v(c), 3);
        } else {
            memcpy(cb->q[r], cb->q[0], (size_t)n_q(c) * sq);
            memcpy(cb->k[r], cb->k[0], (size_t)n_k(c) * skv);
            memcpy(cb->v[r], cb->v[0], (size_t)n_v(c) * skv);
        }
        if (c->bwd) {
            cb->d_o[r] = alloc64(n_o(c), 4), cb->lse[r] = alloc64(n_lse(c), 4);
            cb->dq[r] = alloc64(n_q(c), 4), cb->dk[r] = alloc64(n_k(c), 4);
            cb->dv[r] = alloc64(n_v(c), 4);
            if (!cb->d_o[r] || !cb->lse[r] || !cb->dq[r] || !cb->dk[r] || !cb->dv[r]) return -1;
            if (r == 0) fill_uniform(cb->d_o[0], n_o(c), 5);
            else memcpy(cb->d_o[r], cb->d_o[0], (size_t)n_o(c) * 4);
        }
    }
    if (c->mask == MASK_BOOL) {
        if (!(cb->mask = malloc((size_t)(c->Lq * c->Lk)))) return -1;
        rng_t r = {4};
        for (int64_t i = 0; i < c->Lq * c->Lk; i++) cb->mask[i] = rng_unif(&r) < BOOL_MASK_DENSITY;
    }
    return 0;
}

/* The options of a case on a given path. */
static attn_options case_options(const bench_case *c, const attn_tensor *mask, int threads,
                                 attn_path path) {
    attn_options opt = {0};
    opt.path = path;
    opt.threads = threads;
    opt.precision = c->prec;
    opt.causal = c->mask == MASK_CAUSAL;
    if (c->mask == MASK_WINDOW) {
        opt.has_window = true;
        opt.window_left = c->win_left;
        opt.window_right = c->win_right;
    }
    if (c->mask == MASK_BOOL) opt.mask = mask;
    return opt;
}

typedef struct case_tensors { attn_tensor q, k, v, o, mask, d_o, lse, dq, dk, dv; } case_tensors;

static case_tensors tensors_of(const bench_case *c, const case_buffers *cb, int r) {
    case_tensors t;
    t.q = attn_tensor_4d(cb->q[r], c->qdt, c->B, c->Hq, c->Lq, c->Dk);
    t.k = attn_tensor_4d(cb->k[r], c->kvdt, c->B, c->Hkv, c->Lk, c->Dk);
    t.v = attn_tensor_4d(cb->v[r], c->kvdt, c->B, c->Hkv, c->Lk, c->Dv);
    t.o = attn_tensor_4d(cb->o[r], c->qdt, c->B, c->Hq, c->Lq, c->Dv);
    t.mask = attn_tensor_4d(cb->mask, ATTN_BOOL, 1, 1, c->Lq, c->Lk);
    t.d_o = attn_tensor_4d(cb->d_o[r], ATTN_F32, c->B, c->Hq, c->Lq, c->Dv);
    t.lse = attn_tensor_4d(cb->lse[r], ATTN_F32, c->B, c->Hq, c->Lq, 1);
    t.dq = attn_tensor_4d(cb->dq[r], ATTN_F32, c->B, c->Hq, c->Lq, c->Dk);
    t.dk = attn_tensor_4d(cb->dk[r], ATTN_F32, c->B, c->Hkv, c->Lk, c->Dk);
    t.dv = attn_tensor_4d(cb->dv[r], ATTN_F32, c->B, c->Hkv, c->Lk, c->Dv);
    return t;
}

static bool call_failed(bench_case *c, attn_status st, const char *what) {
    if (st == ATTN_OK) return false;
    snprintf(c->error, sizeof c->error, "%s: %s: %s", what, attn_status_string(st), attn_last_error());
    return true;
}

/* ---- the check against the reference ------------------------------------------------- */

typedef struct check_part { int64_t b, hq, hkv, r0, rows; } check_part;

/* The part of a case the reference recomputes: all of it when that fits the budget;
 * otherwise batch 0 and the query heads of the first key/value head (two heads when
 * there is no grouping); then, if still too large, the last rows of those heads. With
 * Lq = Lk the last rows' top-left diagonal equals a bottom-right one on the sub-problem
 * (d = t + Lk - rows), so causal and window cases are checked exactly; they are also the
 * rows that attend to the most keys. */
static check_part pick_check(const bench_case *c, double budget) {
    check_part p = {c->B, c->Hq, c->Hkv, 0, c->Lq};
    const double per_row = (double)c->Lk * (double)(c->Dk + c->Dv);
    if ((double)p.b * (double)p.hq * (double)p.rows * per_row <= budget) return p;
    p.b = 1;
    const int64_t group = c->Hq / c->Hkv;
    p.hkv = group > 1 ? 1 : (c->Hkv < 2 ? c->Hkv : 2);
    p.hq = p.hkv * group;
    const double per_head_row = (double)p.hq * per_row;
    if ((double)p.rows * per_head_row <= budget) return p;
    const bool structural = c->mask == MASK_CAUSAL || c->mask == MASK_WINDOW;
    if (structural && c->Lq != c->Lk) return p;  /* no exact sub-problem: check all rows */
    int64_t rows = (int64_t)(budget / per_head_row);
    rows = rows < 16 ? 16 : rows / 16 * 16;
    if (rows < c->Lq) p.r0 = c->Lq - rows, p.rows = rows;
    return p;
}

/* One call of the case on input set r: the forward, or for a backward case the backward
 * (its O and LSE made once by prepare_backward). */
static attn_status call_case(const bench_case *c, const case_buffers *cb, int r, int threads,
                             attn_path path) {
    case_tensors x = tensors_of(c, cb, r);
    attn_options opt = case_options(c, &x.mask, threads, path);
    if (path == ATTN_PATH_FUSED) opt.workspace = cb->ws, opt.workspace_bytes = cb->ws_bytes;
    if (c->bwd)
        return attn_backward(&x.q, &x.k, &x.v, &x.o, &x.d_o, &x.lse, &x.dq, &x.dk, &x.dv, &opt);
    return attn_forward(&x.q, &x.k, &x.v, &x.o, &opt);
}

/* A backward case's O and LSE: the fused forward on set 0, copied to the other sets. */
static int prepare_backward(bench_case *c, case_buffers *cb, int threads) {
    case_tensors t = tensors_of(c, cb, 0);
    attn_options opt = case_options(c, &t.mask, threads, ATTN_PATH_FUSED);
    opt.lse = &t.lse;
    if (call_failed(c, attn_forward(&t.q, &t.k, &t.v, &t.o, &opt), "forward for the backward"))
        return -1;
    for (int r = 1; r < cb->rot; r++) {
        memcpy(cb->o[r], cb->o[0], (size_t)n_o(c) * 4);
        memcpy(cb->lse[r], cb->lse[0], (size_t)n_lse(c) * 4);
    }
    return 0;
}

/* The contract's float32 tolerance (tools/common/tolerance.h) on n values against ref; the
 * worst so far is kept in c (a non-finite mismatch counts as an infinite error). */
static bool within_f32(bench_case *c, const float *got, const float *ref, int64_t n) {
    tol_acc acc = tol_start();
    for (int64_t i = 0; i < n; i++) tol_add(&acc, i, got[i], ref[i]);
    tol_result r;
    const bool ok = tol_pass(&acc, &r);
    const double rel = r.nonfinite_mismatch ? INFINITY : r.rel_err;
    const double max_abs = r.nonfinite_mismatch ? INFINITY : r.max_err, tol = 1e-5 * (1.0 + r.max_ref);
    if (!(rel <= c->rel_fro)) c->rel_fro = rel;
    if (!(max_abs / tol <= c->max_abs / (c->tol_abs > 0 ? c->tol_abs : 1)))
        c->max_abs = max_abs, c->tol_abs = tol;
    return ok;
}

/* A backward case: the fused gradients of the whole case against the float64 reference
 * backward (ATTN_PATH_REFERENCE, which recomputes everything from Q, K, V) on batch 0 and
 * the query heads of the first key/value head (one head without grouping) when the
 * whole case is over the budget: dK and dV need every row, so no row subset. */
static int check_backward(bench_case *c, case_buffers *cb, int threads, bool plant, double budget) {
    if (call_failed(c, call_case(c, cb, 0, threads, ATTN_PATH_FUSED), "fused backward")) return -1;
    int64_t hq = c->Hq, hkv = c->Hkv, b = c->B;
    const double whole = (double)c->B * (double)c->Hq * (double)c->Lq * (double)c->Lk *
                         (double)(c->Dk + c->Dv) * 2.5;
    if (whole > budget) b = 1, hkv = 1, hq = c->Hq / c->Hkv;
    if (b == c->B && hq == c->Hq) snprintf(c->checked, sizeof c->checked, "all");
    else snprintf(c->checked, sizeof c->checked, "b 0, heads 0..%lld, all rows, dQ dK dV",
                  (long long)(hq - 1));
    const int64_t nq = b * hq * c->Lq * c->Dk, nk = b * hkv * c->Lk * c->Dk,
                  nv = b * hkv * c->Lk * c->Dv;
    float *rq = malloc((size_t)(nq + nk + nv) * sizeof(float) + 64);
    if (!rq) return snprintf(c->error, sizeof c->error, "out of memory for the check"), -1;
    float *rk = rq + nq, *rv = rk + nk;
    case_tensors t = tensors_of(c, cb, 0);
    attn_tensor *sub[] = {&t.q, &t.k, &t.v, &t.o, &t.d_o, &t.lse, &t.dq, &t.dk, &t.dv};
    for (int i = 0; i < 9; i++) {
        const bool kv = i == 1 || i == 2 || i == 7 || i == 8;
        sub[i]->shape[0] = b, sub[i]->shape[1] = kv ? hkv : hq;
    }
    t.dq.data = rq, t.dk.data = rk, t.dv.data = rv;
    attn_options ropt = case_options(c, &t.mask, threads, ATTN_PATH_REFERENCE);
    attn_status st = attn_backward(&t.q, &t.k, &t.v, &t.o, &t.d_o, &t.lse, &t.dq, &t.dk, &t.dv, &ropt);
    if (call_failed(c, st, "reference backward")) return free(rq), -1;
    if (plant) cb->dk[0][nk / 2] += 1e-3f * (1.0f + fabsf(cb->dk[0][nk / 2]));
    c->rel_fro = c->max_abs = c->tol_abs = 0;
    /* batch 0's heads are the first elements of each gradient */
    bool ok = within_f32(c, cb->dq[0], rq, nq);
    ok = within_f32(c, cb->dk[0], rk, nk) && ok;
    ok = within_f32(c, cb->dv[0], rv, nv) && ok;
    c->pass = ok;
    free(rq);
    return 0;
}

static int check_case(bench_case *c, case_buffers *cb, int threads, bool plant,
                      double budget) {
    if (c->bwd) return check_backward(c, cb, threads, plant, budget);
    if (call_failed(c, call_case(c, cb, 0, threads, ATTN_PATH_FUSED), "fused")) return -1;
    case_tensors t = tensors_of(c, cb, 0);

    const check_part p = pick_check(c, budget);
    const bool whole = p.b == c->B && p.hq == c->Hq && p.rows == c->Lq;
    if (whole)
        snprintf(c->checked, sizeof c->checked, "all");
    else
        snprintf(c->checked, sizeof c->checked, "b 0..%lld, heads 0..%lld, rows %lld..%lld",
                 (long long)(p.b - 1), (long long)(p.hq - 1), (long long)p.r0,
                 (long long)(p.r0 + p.rows - 1));
    const int64_t n_ref = p.b * p.hq * p.rows * c->Dv;
    float *ref = malloc((size_t)n_ref * sizeof(float) + 64);
    if (!ref) return snprintf(c->error, sizeof c->error, "out of memory for the check"), -1;
    attn_tensor q = t.q, mask = t.mask;
    q.data = (char *)cb->q[0] + p.r0 * c->Dk * attn_dtype_size(c->qdt);
    q.shape[0] = p.b, q.shape[1] = p.hq, q.shape[2] = p.rows;
    attn_tensor k = t.k, v = t.v;
    k.shape[0] = v.shape[0] = p.b;
    k.shape[1] = v.shape[1] = p.hkv;
    mask.data = cb->mask ? cb->mask + p.r0 * c->Lk : NULL;
    mask.shape[2] = p.rows;
    /* the reference of the same (16-bit) inputs, its output in float32 */
    attn_tensor o = attn_tensor_4d(ref, ATTN_F32, p.b, p.hq, p.rows, c->Dv);
    attn_options ropt = case_options(c, &mask, threads, ATTN_PATH_REFERENCE);
    if (p.r0 > 0) ropt.align = ATTN_ALIGN_BOTTOM_RIGHT;  /* see pick_check */
    attn_status st = attn_forward(&q, &k, &v, &o, &ropt);
    if (call_failed(c, st, "reference")) return free(ref), -1;

    /* the fused output of the checked part, as float */
    float *fused = malloc((size_t)n_ref * sizeof(float) + 64);
    if (!fused) return free(ref), snprintf(c->error, sizeof c->error, "out of memory for the check"), -1;
    for (int64_t b = 0; b < p.b; b++)
        for (int64_t h = 0; h < p.hq; h++)
            for (int64_t i = 0; i < p.rows; i++)
                for (int64_t d = 0; d < c->Dv; d++)
                    fused[((b * p.hq + h) * p.rows + i) * c->Dv + d] =
                        elem(c->qdt, cb->o[0], ((b * c->Hq + h) * c->Lq + p.r0 + i) * c->Dv + d);
    const bool half = c->qdt != ATTN_F32 || c->kvdt != ATTN_F32;
    if (plant) {
        const int64_t at = (p.rows / 2) * c->Dv;
        fused[at] += (half ? 0.25f : 1e-3f) * (1.0f + fabsf(fused[at]));
    }
    if (!half) {
        c->rel_fro = c->max_abs = c->tol_abs = 0;
        c->pass = within_f32(c, fused, ref, n_ref);
        free(fused), free(ref);
        return 0;
    }
    /* 16-bit: the half-precision rule of the contract (tests/test_half.c): max error
     * against float64 at most twice that of a naive implementation computing in the same
     * 16-bit type (tools/common/naive.c, the KV type), on the same inputs and the same part,
     * plus float32 noise (2^-23 (1 + max|ref|)) for where the naive one happens to be exact */
    const int64_t nq = p.b * p.hq * p.rows * c->Dk;
    float *q32 = malloc((size_t)(nq + n_ref) * sizeof(float) + 64);
    if (!q32) return free(fused), free(ref), snprintf(c->error, sizeof c->error, "out of memory"), -1;
    float *naive = q32 + nq;
    for (int64_t b = 0; b < p.b; b++)
        for (int64_t h = 0; h < p.hq; h++)
            memcpy(q32 + ((b * p.hq + h) * p.rows) * c->Dk,
                   cb->q32 + ((b * c->Hq + h) * c->Lq + p.r0) * c->Dk,
                   (size_t)(p.rows * c->Dk) * sizeof(float));
    if (naive_attention(c->kvdt, p.b, p.hq, p.hkv, p.rows, c->Lk, c->Dk, c->Dv, q32, cb->k32,
                        cb->v32, NULL, (float)(1.0 / sqrt((double)c->Dk)), naive) != 0)
        return free(q32), free(fused), free(ref),
               snprintf(c->error, sizeof c->error, "out of memory for the naive check"), -1;
    double err2 = 0, ref2 = 0, max_abs = 0, max_ref = 0, naive_err = 0;
    for (int64_t i = 0; i < n_ref; i++) {
        const double e = (double)fused[i] - (double)ref[i];
        err2 += e * e;
        ref2 += (double)ref[i] * (double)ref[i];
        if (!(fabs(e) <= max_abs)) max_abs = fabs(e);
        if (fabs((double)ref[i]) > max_ref) max_ref = fabs((double)ref[i]);
        const double ne = fabs((double)naive[i] - (double)ref[i]);
        if (!(ne <= naive_err)) naive_err = ne;
    }
    c->rel_fro = ref2 > 0 ? sqrt(err2 / ref2) : sqrt(err2);
    c->max_abs = max_abs;
    c->naive_err = naive_err;
    c->tol_abs = 2 * naive_err + 0x1p-23 * (1 + max_ref);
    c->pass = max_abs <= c->tol_abs;
    free(q32), free(fused), free(ref);
    return 0;
}

/* ---- timing ------------------------------------------------------------------------- */


/* warmup untimed calls, then at least reps timed ones (more for short calls: until about
 * ADAPTIVE_SECONDS are timed, at most ADAPTIVE_REPS), cycling through the input sets;
 * their times go to t[0..*nt), at most cap of them. */

/* A decoding row's bandwidth is measured beside it: after each timed call, one parallel
 * read of a buffer of the size of K and V that no call touches (so that the next call
 * finds none of its own data in the caches), appended to c->bws. Memory bandwidth on a
 * shared machine drifts by a third within minutes; a ratio of interleaved timings does
 * not. */
static float *bw_buffer(const bench_case *c, int threads, int64_t *n) {
    *n = (int64_t)(c->kv_bytes / 4) / (64 * threads) * (64 * threads);
    if (!machine_read_loops() || !c->decode || *n <= 0) return NULL;
    float *buf = aligned_alloc(64, (size_t)*n * sizeof(float));
    if (!buf) return NULL;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < *n; i++) buf[i] = 1e-3f * (float)(i & 7);
    return buf;
}

static int time_path(bench_case *c, const case_buffers *cb, int threads, attn_path path,
                     int warmup, int reps, bool adaptive, double *t, int cap, int *nt) {
    *nt = 0;
    int64_t bw_n = 0;
    float *bw_buf = path == ATTN_PATH_FUSED && c->bws ? bw_buffer(c, threads, &bw_n) : NULL;
    if (reps > cap) reps = cap;
    int call = 1;  /* the check used set 0: start on the next one */
    for (int w = 0; w < warmup; w++, call++) {
        if (call_failed(c, call_case(c, cb, call % cb->rot, threads, path), "warm-up")) return -1;
    }
    int n = 0, want = reps;
    double spent = 0;
    while (n < want) {
        const int r = call++ % cb->rot;
        const double t0 = now_s();
        attn_status st = call_case(c, cb, r, threads, path);
        t[n] = now_s() - t0;
        if (call_failed(c, st, "timed call")) {
            free(bw_buf);
            return -1;
        }
        spent += t[n++];
        if (bw_buf && c->nbws < POOL) c->bws[c->nbws++] = machine_read_pass(machine_read_loops(), bw_buf, bw_n, threads);
        if (adaptive && n == reps && spent < ADAPTIVE_SECONDS) {
            int more = (int)ceil(ADAPTIVE_SECONDS / (spent / n));
            want = more > ADAPTIVE_REPS ? ADAPTIVE_REPS : more;
            if (want < reps) want = reps;
            if (want > cap) want = cap;
        }
    }
    *nt = n;
    free(bw_buf);
    return 0;
}

/* median, min and max of t[0..n) (t is sorted) */
static void summarize(double *t, int n, double *med, double *lo, double *hi) {
    *med = median(t, n), *lo = t[0], *hi = t[n - 1];
}

/* ---- output ------------------------------------------------------------------------- */

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

static void json_num(FILE *f, double v) {
    if (isfinite(v)) fprintf(f, "%.6g", v);
    else fputs("null", f);
}

static double gflops(const bench_case *c, double t) { return t > 0 ? c->flop / t * 1e-9 : NAN; }

/* a decoding row's GB/s of K and V at its median time */
static double case_gbs(const bench_case *x) { return x->kv_bytes / x->t_med * 1e-9; }

static void write_json(FILE *f, const machine *m, const bench_case *c, int n, const bench_args *a,
                       const torch_proc *tp) {
    fprintf(f, "{\n  \"attn_version\": ");
    json_string(f, attn_version());
    fprintf(f, ",\n  \"kernel\": ");
    json_string(f, attn_kernel_name());
    fprintf(f, ",\n  \"threads\": %d,\n  \"reps\": %d,\n  \"warmup\": %d,\n  \"rounds\": %d,\n"
            "  \"quick\": %s,\n", m->threads, a->reps, a->warmup, a->rounds, a->quick ? "true" : "false");
    fprintf(f, "  \"machine\": {\"cpu\": ");
    json_string(f, m->cpu);
    fprintf(f, ", \"procs\": %d, \"measured\": %s", m->procs, m->measured ? "true" : "false");
    fprintf(f, ", \"others_cpu_pct\": ");
    json_num(f, m->others_pct);
    fprintf(f, ", \"loadavg_start\": [");
    for (int i = 0; i < 3; i++) json_num(f, m->load_start[i]), fputs(i < 2 ? ", " : "]", f);
    fprintf(f, ", \"loadavg_end\": [");
    for (int i = 0; i < 3; i++) json_num(f, m->load_end[i]), fputs(i < 2 ? ", " : "]", f);
    if (m->measured) {
        fprintf(f, ",\n    \"fma_peak\": [");
        for (int i = 0; i < m->npeaks; i++)
            fprintf(f, "%s{\"isa\": \"%s\", \"gflops_1\": %.1f, \"gflops_n\": %.1f}",
                    i ? ", " : "", m->peaks[i].isa, m->peaks[i].gflops_1, m->peaks[i].gflops_n);
        fprintf(f, "],\n    \"other_peaks\": [");
        for (int i = 0; i < m->nothers; i++)
            fprintf(f, "%s{\"isa\": \"%s\", \"what\": \"%s\", \"gflops_1\": %.1f, \"gflops_n\": %.1f}",
                    i ? ", " : "", m->others[i].isa, m->others[i].what, m->others[i].gflops_1,
                    m->others[i].gflops_n);
        fprintf(f, "],\n    \"peak_isa\": \"%s\", \"peak_gflops_1\": %.1f, \"peak_gflops_n\": %.1f,\n",
                m->peak_isa, m->peak_1, m->peak_n);
        fprintf(f, "    \"bw_isa\": \"%s\", \"bw_mib\": %g, \"bw_gbs_1\": %.4g, \"bw_gbs_n\": %.4g",
                m->bw_isa, m->bw_mib, m->bw_1, m->bw_n);
    }
    fprintf(f, "},\n  \"torch\": ");
    if (tp && tp->version[0]) {
        fprintf(f, "{\"version\": ");
        json_string(f, tp->version);
        fprintf(f, ", \"info\": ");
        json_string(f, tp->info);
        fprintf(f, "}");
    } else {
        fprintf(f, "null");
    }
    fprintf(f, ",\n  \"cases\": [\n");
    for (int i = 0; i < n; i++) {
        const bench_case *x = &c[i];
        fprintf(f, "    {\"name\": \"%s\", \"B\": %lld, \"Hq\": %lld, \"Hkv\": %lld, \"Lq\": %lld, "
                "\"Lk\": %lld, \"Dk\": %lld, \"Dv\": %lld, \"mask\": \"%s\", \"dtype\": \"float32\"",
                x->name, (long long)x->B, (long long)x->Hq, (long long)x->Hkv, (long long)x->Lq,
                (long long)x->Lk, (long long)x->Dk, (long long)x->Dv, MASK_NAME[x->mask]);
        if (x->mask == MASK_WINDOW)
            fprintf(f, ", \"window_left\": %lld, \"window_right\": %lld", (long long)x->win_left,
                    (long long)x->win_right);
        if (x->mask == MASK_BOOL) fprintf(f, ", \"mask_density\": %g", BOOL_MASK_DENSITY);
        fprintf(f, ", \"dtype\": \"%s\", \"kv_dtype\": \"%s\", \"precision\": \"%s\", "
                "\"direction\": \"%s\"", attn_dtype_name(x->qdt), attn_dtype_name(x->kvdt),
                x->prec == ATTN_PRECISION_FAST ? "fast" : "default",
                x->bwd ? "backward" : "forward");
        if (x->base[0]) fprintf(f, ", \"base\": \"%s\"", x->base);
        if (x->base_ratio > 0) fprintf(f, ", \"speedup_vs_base\": %.4g", x->base_ratio);
        if (x->qdt != ATTN_F32 || x->kvdt != ATTN_F32) {
            fprintf(f, ", \"naive_max_abs\": ");
            json_num(f, x->naive_err);
        }
        fprintf(f, ",\n     \"decode\": %s, \"flop\": %.6g, \"kv_bytes\": %.6g, \"rotate\": %d, "
                "\"threads\": %d, \"kernel\": \"%s\", \"ran\": %s, \"check\": \"%s\", \"checked\": ",
                x->decode ? "true" : "false", x->flop, x->kv_bytes, x->rotate, m->threads,
                attn_kernel_name(), x->ran ? "true" : "false",
                !x->ran ? "skipped" : x->error[0] ? "error" : x->pass ? "pass" : "fail");
        json_string(f, x->checked);
        fprintf(f, ", \"rel_fro\": ");
        json_num(f, x->rel_fro);
        fprintf(f, ", \"max_abs\": ");
        json_num(f, x->max_abs);
        fprintf(f, ", \"tol_abs\": ");
        json_num(f, x->tol_abs);
        if (x->error[0]) {
            fprintf(f, ", \"error\": ");
            json_string(f, x->error);
        }
        if (x->ran && !x->error[0] && x->pass) {
            fprintf(f, ",\n     \"reps\": %d, \"median_s\": %.6g, \"min_s\": %.6g, \"max_s\": %.6g, "
                    "\"gflops\": %.4g", x->reps, x->t_med, x->t_min, x->t_max, gflops(x, x->t_med));
            if (m->measured) fprintf(f, ", \"pct_peak\": %.1f", 100 * gflops(x, x->t_med) / m->peak_n);
            if (x->decode) {
                fprintf(f, ", \"gbs\": %.4g", case_gbs(x));
                if (x->bw_here > 0)
                    fprintf(f, ", \"bw_here_gbs\": %.4g, \"pct_bw\": %.1f", x->bw_here,
                            100 * case_gbs(x) / x->bw_here);
                if (m->measured) fprintf(f, ", \"pct_bw_start\": %.1f", 100 * case_gbs(x) / m->bw_n);
            }
        }
        if (x->ref_med > 0)
            fprintf(f, ", \"ref_median_s\": %.6g, \"ref_gflops\": %.3f", x->ref_med, gflops(x, x->ref_med));
        if (x->torch_med > 0) {
            fprintf(f, ",\n     \"torch_reps\": %d, \"torch_median_s\": %.6g, \"torch_min_s\": %.6g, "
                    "\"torch_max_s\": %.6g, \"torch_gflops\": %.2f", x->torch_reps, x->torch_med,
                    x->torch_min, x->torch_max, gflops(x, x->torch_med));
            if (x->decode) fprintf(f, ", \"torch_gbs\": %.2f", x->kv_bytes / x->torch_med * 1e-9);
            if (x->ran && !x->error[0] && x->pass) fprintf(f, ", \"speedup_vs_torch\": %.4g", x->torch_med / x->t_med);
        }
        if (x->torch_error[0]) {
            fprintf(f, ", \"torch_error\": ");
            json_string(f, x->torch_error);
        }
        fprintf(f, "}%s\n", i + 1 < n ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
}

static void print_table(FILE *f, const machine *m, const bench_case *c, int n, const torch_proc *tp) {
    fprintf(f, "attn %s, kernel %s, %d threads, CPU: %s (%d logical); other processes used "
            "%.0f%% of the CPU time during this run (load average %.2f at the start, %.2f at the "
            "end)\n", attn_version(), attn_kernel_name(), m->threads, m->cpu, m->procs,
            m->others_pct, m->load_start[0], m->load_end[0]);
    if (m->measured) {
        fprintf(f, "fp32 FMA peak:");
        for (int i = 0; i < m->npeaks; i++)
            fprintf(f, "%s %s %.1f GFLOP/s on 1 thread, %.1f on %d", i ? ";" : "", m->peaks[i].isa,
                    m->peaks[i].gflops_1, m->peaks[i].gflops_n, m->threads);
        for (int i = 0; i < m->nothers; i++)
            fprintf(f, "\n%s peak: %.1f GFLOP/s on 1 thread, %.1f on %d (not the peak of the "
                    "fp32 rows)", m->others[i].what, m->others[i].gflops_1, m->others[i].gflops_n,
                    m->threads);
        fprintf(f, "\nread bandwidth (%g MiB, %s loads): %.1f GB/s on 1 thread, %.1f on %d\n",
                m->bw_mib, m->bw_isa, m->bw_1, m->bw_n, m->threads);
    }
    if (tp && tp->version[0]) fprintf(f, "torch %s (%s)\n", tp->version, tp->info);
    if (n == 0) return;
    fprintf(f, "medians; GFLOP/s = 2*(Dk+Dv)*B*Hq*pairs/time (x2.5 for bwd-* rows); %%peak of the "
            "%d-thread fp32 FMA peak; GB/s = K and V bytes/time; %%bw of the median GB/s of a plain "
            "read of as many bytes, timed after each call (memory bandwidth drifts); dtype Q/KV, "
            "+F = FAST precision; x f32 = this row's speed over the float32 row of the same shape\n\n",
            m->threads);
    fprintf(f, "%-29s %-22s %-6s %-10s %3s %-10s %-5s %9s %8s %6s %7s %5s %9s %7s %9s %8s %7s %6s\n",
            "case", "B Hq/Hkv Lq Lk D", "mask", "dtype", "thr", "kernel", "check", "ms",
            "GFLOP/s", "%peak", "GB/s", "%bw", "ref ms", "x ref", "torch ms", "t GF/s", "x torch",
            "x f32");
    for (int i = 0; i < n; i++) {
        const bench_case *x = &c[i];
        char shape[64], cell[16][24];
        snprintf(shape, sizeof shape, "%lld %lld/%lld %lld %lld %lld", (long long)x->B,
                 (long long)x->Hq, (long long)x->Hkv, (long long)x->Lq, (long long)x->Lk,
                 (long long)x->Dk);
        for (int k = 0; k < 16; k++) snprintf(cell[k], sizeof cell[k], "-");
        const bool ok = x->ran && !x->error[0] && x->pass;
        if (ok) {
            snprintf(cell[0], 24, "%.3f", x->t_med * 1e3);
            snprintf(cell[1], 24, "%.1f", gflops(x, x->t_med));
            if (m->measured) snprintf(cell[2], 24, "%.0f%%", 100 * gflops(x, x->t_med) / m->peak_n);
            if (x->decode) {
                snprintf(cell[3], 24, "%.1f", case_gbs(x));
                const double bw = x->bw_here > 0 ? x->bw_here : m->measured ? m->bw_n : 0;
                if (bw > 0) snprintf(cell[4], 24, "%.0f%%", 100 * case_gbs(x) / bw);
            }
            if (x->ref_med > 0) {
                snprintf(cell[5], 24, "%.1f", x->ref_med * 1e3);
                snprintf(cell[6], 24, "%.0fx", x->ref_med / x->t_med);
            }
        }
        if (x->torch_med > 0) {
            snprintf(cell[7], 24, "%.3f", x->torch_med * 1e3);
            snprintf(cell[8], 24, "%.1f", gflops(x, x->torch_med));
            if (ok) snprintf(cell[9], 24, "%.2fx", x->torch_med / x->t_med);
        } else if (x->torch_error[0]) {
            snprintf(cell[7], 24, "error");
        }
        if (ok && x->base_ratio > 0) snprintf(cell[10], 24, "%.2fx", x->base_ratio);
        char dt[24];
        if (x->qdt == x->kvdt) snprintf(dt, sizeof dt, "%s", dtype_short(x->qdt));
        else snprintf(dt, sizeof dt, "%s/%s", dtype_short(x->qdt), dtype_short(x->kvdt));
        if (x->prec == ATTN_PRECISION_FAST) strcat(dt, "+F");
        fprintf(f, "%-29s %-22s %-6s %-10s %3d %-10s %-5s %9s %8s %6s %7s %5s %9s %7s %9s %8s %7s %6s\n",
                x->name, shape, MASK_NAME[x->mask], dt, m->threads, attn_kernel_name(),
                !x->ran ? "skip" : x->error[0] ? "ERROR" : x->pass ? "ok" : "FAIL", cell[0],
                cell[1], cell[2], cell[3], cell[4], cell[5], cell[6], cell[7], cell[8], cell[9],
                cell[10]);
    }
    for (int i = 0; i < n; i++) {
        const bench_case *x = &c[i];
        if (x->error[0]) fprintf(f, "%s: %s\n", x->name, x->error);
        else if (x->ran && !x->pass && (x->qdt != ATTN_F32 || x->kvdt != ATTN_F32))
            fprintf(f, "%s: check FAILED (%s): max abs %.3g, limit %.3g = 2 x the naive "
                    "same-precision max abs %.3g + 2^-23 (1 + max|ref|)\n", x->name, x->checked,
                    x->max_abs, x->tol_abs, x->naive_err);
        else if (x->ran && !x->pass)
            fprintf(f, "%s: check FAILED (%s): relative Frobenius %.3g (limit 1e-6), max abs "
                    "%.3g (limit %.3g)\n", x->name, x->checked, x->rel_fro, x->max_abs, x->tol_abs);
        if (x->torch_error[0]) fprintf(f, "%s: torch: %s\n", x->name, x->torch_error);
    }
}

/* ---- main --------------------------------------------------------------------------- */

int cli_bench(int argc, char **argv) {
    /* additive attention's rows have their own file (bench/bench_additive.c) */
    if (argc > 1 && strcmp(argv[1], "--additive") == 0) return bench_additive(argc - 1, argv + 1);
    /* the paged cache's decoding rows: bench/bench_paged.c */
    if (argc > 1 && strcmp(argv[1], "--paged") == 0) return bench_paged(argc - 1, argv + 1);
    /* the q8_0 cache's decoding rows: bench/bench_q8.c */
    if (argc > 1 && strcmp(argv[1], "--q8") == 0) return bench_q8(argc - 1, argv + 1);
    /* shared-prefix (cascade) decoding rows: bench/bench_cascade.c */
    if (argc > 1 && strcmp(argv[1], "--cascade") == 0) return bench_cascade(argc - 1, argv + 1);
    /* dropout's cost: bench/bench_dropout.c */
    if (argc > 1 && strcmp(argv[1], "--dropout") == 0) return bench_dropout(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "masks") == 0) return cli_bench_masks(argc - 1, argv + 1);
    /* whole models through transformers, beside PyTorch's backends: bench/bench_models.c */
    if (argc > 1 && strcmp(argv[1], "--models") == 0) return bench_models(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "--head-dims") == 0) return bench_head_dims(argc - 1, argv + 1);
    /* the 100K-token picture's cost (bench/bench_viz.c) */
    if (argc > 1 && strcmp(argv[1], "--viz") == 0) return bench_viz(argc - 1, argv + 1);
    bench_args a = {0};
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;

    char root[PATH_MAX];
    source_root(root, sizeof root);
    if (a.setup_torch) return setup_torch(root);

    static bench_case cases[MAX_CASES];
    int all = make_sweep(cases, a.quick), n = 0;
    for (int i = 0; i < all; i++) {
        bool keep = !a.shapes;
        if (a.shapes) {
            char pats[1024];
            snprintf(pats, sizeof pats, "%s", a.shapes);
            char *save = NULL;
            for (char *p = strtok_r(pats, ",", &save); p && !keep; p = strtok_r(NULL, ",", &save))
                keep = fnmatch(p, cases[i].name, 0) == 0;
        }
        if (keep) cases[n++] = cases[i];
    }
    if (a.list) {
        for (int i = 0; i < n; i++) printf("%s\n", cases[i].name);
        return 0;
    }
    if (n == 0) return say(EXIT_USAGE, "--shapes '%s' matches no case (see --list)", a.shapes);
    if (a.machine_only) n = 0;

    /* ATTN_ISA is read once, at the library's first kernel choice: set it before. */
    if (a.isa) setenv("ATTN_ISA", a.isa, 1);
    if (strcmp(attn_kernel_name(), "none") == 0)
        return say(EXIT_FAIL, "no kernel can run (ATTN_ISA=%s?)", getenv("ATTN_ISA"));

    machine m = {0};
    machine_cpu_model(m.cpu, sizeof m.cpu);
    m.procs = omp_get_num_procs();
    m.threads = a.threads ? a.threads : omp_get_max_threads();
    machine_loadavg(m.load_start);
    const cpu_sample cpu_start = machine_cpu_now();

    torch_proc tp = {0};
    bool torch = a.vs != NULL;
    if (torch) {
        char py[PATH_MAX + 64], script[PATH_MAX + 64];
        snprintf(py, sizeof py, "%s", a.python ? a.python : "");
        if (!a.python) snprintf(py, sizeof py, "%s/.venv-bench/bin/python", root);
        snprintf(script, sizeof script, "%s", a.torch_script ? a.torch_script : "");
        if (!a.torch_script) snprintf(script, sizeof script, "%s/scripts/bench_torch.py", root);
        if (!a.python && !file_exists(py))
            return say(EXIT_USAGE, "--vs torch: %s not found: run 'attn bench --setup-torch' "
                       "first, or give --python", py);
        if (!file_exists(script)) return say(EXIT_USAGE, "--vs torch: %s not found", script);
        signal(SIGPIPE, SIG_IGN);
        if (torch_start(&tp, py, script, m.threads)) {
            torch_stop(&tp);
            return EXIT_FAIL;
        }
        if (!a.quiet) fprintf(stderr, "attn bench: torch %s (%s)\n", tp.version, tp.info);
    }

    if (!a.no_machine && machine_measure(&m, a.quick, a.quiet)) return torch_stop(&tp), EXIT_FAIL;
    if (!a.quiet && m.measured)
        fprintf(stderr, "attn bench: peak %.1f GFLOP/s (%s, %d threads), %.1f on 1; read %.1f GB/s "
                "(%d threads), %.1f on 1\n", m.peak_n, m.peak_isa, m.threads, m.peak_1, m.bw_n,
                m.threads, m.bw_1);

    /* 8x a 32 MiB L3 (1 MiB with --quick, where only the logic is tested) */
    const double rot_bytes = a.quick ? 1024.0 * 1024 : 256.0 * 1024 * 1024;
    bool failed = false;
    for (int i = 0; i < n; i++) {
        count_work(&cases[i]);
        cases[i].ts = malloc(POOL * sizeof(double));
        cases[i].tts = malloc(POOL * sizeof(double));
        cases[i].bws = cases[i].decode ? malloc(POOL * sizeof(double)) : NULL;
        if (!cases[i].ts || !cases[i].tts || (cases[i].decode && !cases[i].bws))
            return say(EXIT_FAIL, "out of memory");
    }
    for (int r = 0; r < a.rounds; r++)
        for (int i = 0; i < n; i++) {
            bench_case *c = &cases[i];
            if (r > 0 && (c->error[0] || !c->pass)) continue;
            case_buffers cb;
            if (alloc_buffers(c, rot_bytes, &cb)) {
                snprintf(c->error, sizeof c->error, "out of memory for the inputs");
                free_buffers(&cb);
                continue;
            }
            c->rotate = cb.rot;
            c->ran = true;
            if (!a.quiet) {
                fprintf(stderr, "attn bench: ");
                if (a.rounds > 1) fprintf(stderr, "round %d/%d ", r + 1, a.rounds);
                fprintf(stderr, "[%d/%d] %s:", i + 1, n, c->name);
            }
            case_tensors t = tensors_of(c, &cb, 0);
            attn_options wopt = case_options(c, &t.mask, m.threads, ATTN_PATH_FUSED);
            attn_status st = c->bwd ? attn_backward_workspace_size(&t.q, &t.k, &t.v, &t.o, &t.d_o,
                                                                   &t.lse, &t.dq, &t.dk, &t.dv,
                                                                   &wopt, &cb.ws_bytes)
                                    : attn_forward_workspace_size(&t.q, &t.k, &t.v, &t.o, &wopt,
                                                                  &cb.ws_bytes);
            if (!call_failed(c, st, "workspace size") && cb.ws_bytes && !(cb.ws = malloc(cb.ws_bytes)))
                snprintf(c->error, sizeof c->error, "out of memory for the workspace");
            if (c->bwd && !c->error[0]) prepare_backward(c, &cb, m.threads);
            /* a case whose reference is timed anyway is checked whole */
            const bool ref_timed = a.ref_max_l > 0 && c->Lq <= a.ref_max_l && c->Lk <= a.ref_max_l;
            const double budget = ref_timed ? INFINITY : a.check_budget;
            if (r == 0 && !c->error[0]) {
                if (!a.quiet) fprintf(stderr, " check");
                if (check_case(c, &cb, m.threads, a.plant_error, budget) == 0 && !a.quiet)
                    fprintf(stderr, " %s (%s),", c->pass ? "ok" : "FAILED", c->checked);
            }
            if (c->pass && !c->error[0]) {
                int nt;
                if (!a.quiet) fprintf(stderr, " time");
                if (time_path(c, &cb, m.threads, ATTN_PATH_FUSED, a.warmup, a.reps, true,
                              c->ts + c->nts, POOL - c->nts, &nt) == 0)
                    c->nts += nt;
            }
            if (r == 0 && c->pass && !c->error[0] && ref_timed) {
                double tr[8], lo, hi;
                int nr;
                if (!a.quiet) fprintf(stderr, ", reference");
                if (time_path(c, &cb, m.threads, ATTN_PATH_REFERENCE, 0, a.reps < 3 ? a.reps : 3,
                              false, tr, 8, &nr) == 0)
                    summarize((qsort(tr, (size_t)nr, sizeof *tr, cmp_double), tr), nr, &c->ref_med,
                              &lo, &hi);
            }
            free_buffers(&cb);
            if (torch && c->pass && !c->error[0] && !c->torch_error[0]) {
                if (!a.quiet) fprintf(stderr, ", torch");
                torch_case(&tp, c, m.threads, a.warmup, a.reps);
            }
            if (c->nts) {
                qsort(c->ts, (size_t)c->nts, sizeof(double), cmp_double);
                summarize(c->ts, c->nts, &c->t_med, &c->t_min, &c->t_max);
                c->reps = c->nts;
            }
            if (c->nbws) {
                qsort(c->bws, (size_t)c->nbws, sizeof(double), cmp_double);
                c->bw_here = median(c->bws, c->nbws);
            }
            if (c->ntts) {
                qsort(c->tts, (size_t)c->ntts, sizeof(double), cmp_double);
                summarize(c->tts, c->ntts, &c->torch_med, &c->torch_min, &c->torch_max);
                c->torch_reps = c->ntts;
            }
            if (!a.quiet) {
                if (c->error[0]) fprintf(stderr, ": %s\n", c->error);
                else if (!c->pass) fprintf(stderr, "\n");
                else if (c->torch_med > 0)
                    fprintf(stderr, ": %.3f ms, %.1f GFLOP/s; torch %.3f ms, %.1f GFLOP/s: %.2fx%s\n",
                            c->t_med * 1e3, gflops(c, c->t_med), c->torch_med * 1e3,
                            gflops(c, c->torch_med), c->torch_med / c->t_med,
                            a.rounds > 1 ? " (so far)" : "");
                else
                    fprintf(stderr, ": %.3f ms, %.1f GFLOP/s%s\n", c->t_med * 1e3,
                            gflops(c, c->t_med), a.rounds > 1 ? " (so far)" : "");
            }
        }
    for (int i = 0; i < n; i++)
        if (cases[i].error[0] || !cases[i].pass) failed = true;
    /* each 16-bit row against the float32 row of the same shape, if it ran */
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n && cases[i].base[0]; j++)
            if (strcmp(cases[j].name, cases[i].base) == 0 && cases[i].t_med > 0 && cases[j].t_med > 0)
                cases[i].base_ratio = cases[j].t_med / cases[i].t_med;
    if (torch) torch_stop(&tp);
    machine_loadavg(m.load_end);
    m.others_pct = machine_others_pct(cpu_start, machine_cpu_now());

    if (a.json) {
        write_json(stdout, &m, cases, n, &a, torch ? &tp : NULL);
    } else {
        print_table(stdout, &m, cases, n, torch ? &tp : NULL);
        if (a.json_out) {
            FILE *f = fopen(a.json_out, "w");
            if (!f) return say(EXIT_FAIL, "%s: %s", a.json_out, strerror(errno));
            write_json(f, &m, cases, n, &a, torch ? &tp : NULL);
            if (fclose(f)) return say(EXIT_FAIL, "%s: %s", a.json_out, strerror(errno));
        }
    }
    fflush(stdout);
    for (int i = 0; i < n; i++) free(cases[i].ts), free(cases[i].tts), free(cases[i].bws);
    return failed ? EXIT_FAIL : 0;
}
