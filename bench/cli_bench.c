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
 * This file owns the options, the dispatch to the bench's other parts (bench_<part>.c)
 * and the loop over the cases; the sweep's own parts (cases and inputs, the check, the
 * timing, the output) are one file each, listed in bench_sweep.h.
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
#include "bench_sweep.h"
#include "cli.h"
#include "cli_files.h"
#include "cliopt.h"
#include "kernels/wisdom.h"  // ai_wisdom_in_use, and (attn_internal.h) the forced calls

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
    "                        lists those this CPU runs; a wisdom is then not used)\n"
    "  --wisdom FILE         use this wisdom file (ATTN_WISDOM; 'attn tune' writes one).\n"
    "                        Whenever a wisdom is in use, each row is timed twice, in turns:\n"
    "                        with the library's static choices and tuned; both are printed\n"
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

/* a message "attn: bench: ..." on stderr; returns code */
#define say(code, ...) cli_say(code, "bench: ", __VA_ARGS__)

/* ---- options ------------------------------------------------------------------------ */

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
        {"--rounds", &rounds, NULL},            {"--wisdom", &a->wisdom, NULL},
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
    if (a->wisdom && attn_tune_check(a->wisdom) != ATTN_OK)  // refused now, not silently
        return say(EXIT_FAIL, "--wisdom: %s", attn_last_error());
    if (a->vs && strcmp(a->vs, "torch") != 0)
        return say(EXIT_USAGE, "--vs: only 'torch' is implemented, got '%s'", a->vs);
    if (a->json && a->json_out)
        return say(EXIT_USAGE, "--json and --json-out: choose one");
    char err[512];  // refused now, not after the sweep
    const int x = a->json_out ? cli_files_check_one("--json-out", a->json_out, err, sizeof err) : 0;
    if (x) return say(x == -2 ? EXIT_USAGE : EXIT_FAIL, "%s", err);
    if (a->machine_only && (a->no_machine || a->vs))
        return say(EXIT_USAGE, "--machine-only: runs no case, so neither --no-machine nor --vs");
    return 0;
}

/* ---- main --------------------------------------------------------------------------- */

/* write_json's arguments, for cli_files_save_text */
typedef struct json_job {
    const machine *m;
    const bench_case *c;
    int n;
    const bench_args *a;
    const torch_proc *tp;
} json_job;

static void print_json(FILE *f, const void *ctx) {
    const json_job *j = ctx;
    write_json(f, j->m, j->c, j->n, j->a, j->tp);
}

int cli_bench(int argc, char **argv) {
    /* additive attention's rows have their own file (bench/bench_additive.c) */
    if (argc > 1 && strcmp(argv[1], "--additive") == 0) return bench_additive(argc - 1, argv + 1);
    /* the paged cache's decoding rows: bench/bench_paged.c */
    if (argc > 1 && strcmp(argv[1], "--paged") == 0) return bench_paged(argc - 1, argv + 1);
    /* the q8_0 cache's decoding rows: bench/bench_q8.c */
    if (argc > 1 && strcmp(argv[1], "--q8") == 0) return bench_q8(argc - 1, argv + 1);
    /* streaming and computing at once, the decoding targets' ceiling: bench/bench_overlap.c */
    if (argc > 1 && strcmp(argv[1], "--overlap") == 0) return bench_overlap(argc - 1, argv + 1);
    /* latent attention's decoding rows: bench/bench_mla.c */
    if (argc > 1 && strcmp(argv[1], "--mla") == 0) return bench_mla(argc - 1, argv + 1);
    /* a mixed serving step in one call: bench/bench_step.c */
    if (argc > 1 && strcmp(argv[1], "--step") == 0) return bench_step(argc - 1, argv + 1);
    /* the float64 path's masked forward and its backward: bench/bench_f64.c */
    if (argc > 1 && strcmp(argv[1], "--f64") == 0) return bench_f64(argc - 1, argv + 1);
    /* shared-prefix (cascade) decoding rows: bench/bench_cascade.c */
    if (argc > 1 && strcmp(argv[1], "--cascade") == 0) return bench_cascade(argc - 1, argv + 1);
    /* dropout's cost: bench/bench_dropout.c */
    if (argc > 1 && strcmp(argv[1], "--dropout") == 0) return bench_dropout(argc - 1, argv + 1);
    /* the bias's gradient's cost: bench/bench_bias_grad.c */
    if (argc > 1 && strcmp(argv[1], "--bias-grad") == 0) return bench_bias_grad(argc - 1, argv + 1);
    /* packed (variable-length) batches beside separate and padded calls: bench/bench_varlen.c */
    if (argc > 1 && strcmp(argv[1], "--varlen") == 0) return bench_varlen(argc - 1, argv + 1);
    /* block-sparse masks beside the dense mask and the unmasked call: bench/bench_block_mask.c */
    if (argc > 1 && strcmp(argv[1], "--block-mask") == 0) return bench_block_mask(argc - 1, argv + 1);
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

    /* ATTN_ISA is read once, at the library's first kernel choice, and ATTN_WISDOM at its
     * first call: set them before. */
    if (a.isa) setenv("ATTN_ISA", a.isa, 1);
    if (a.wisdom) setenv("ATTN_WISDOM", a.wisdom, 1);
    if (strcmp(attn_kernel_name(), "none") == 0)
        return say(EXIT_FAIL, "no kernel can run (ATTN_ISA=%s?)", getenv("ATTN_ISA"));
    /* a wisdom in use (this one, or ATTN_WISDOM's, or the default file): static and tuned
     * side by side */
    a.tuned = ai_wisdom_in_use();
    if (a.wisdom && !a.tuned && !a.quiet)
        fprintf(stderr, "attn bench: --wisdom %s is not used (%s): one column\n", a.wisdom,
                getenv("ATTN_ISA") && *getenv("ATTN_ISA") ? "ATTN_ISA forces the kernel"
                                                          : "ATTN_TUNE=0");

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
        cases[i].sts = a.tuned ? malloc(POOL * sizeof(double)) : NULL;
        if (!cases[i].ts || !cases[i].tts || (cases[i].decode && !cases[i].bws) ||
            (a.tuned && !cases[i].sts))
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
            if (st == ATTN_OK && c->sts) {  // one workspace for the static calls too
                const attn_tune_config none = {0};
                size_t sb = 0;
                st = c->bwd ? ai_backward_forced_workspace_size(&none, &t.q, &t.k, &t.v, &t.o,
                                                                &t.d_o, &t.lse, &t.dq, &t.dk,
                                                                &t.dv, &wopt, &sb)
                            : ai_forward_forced_workspace_size(&none, &t.q, &t.k, &t.v, &t.o,
                                                               &wopt, &sb);
                if (sb > cb.ws_bytes) cb.ws_bytes = sb;
            }
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
            if (c->nsts) {
                qsort(c->sts, (size_t)c->nsts, sizeof(double), cmp_double);
                summarize(c->sts, c->nsts, &c->s_med, &c->s_min, &c->s_max);
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
                else if (c->s_med > 0)
                    fprintf(stderr, ": %.3f ms, %.1f GFLOP/s; static %.3f ms: %.2fx%s\n",
                            c->t_med * 1e3, gflops(c, c->t_med), c->s_med * 1e3,
                            c->s_med / c->t_med, a.rounds > 1 ? " (so far)" : "");
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
        if (a.json_out) {  // by the file rules of cli_files.h: a temporary file renamed
            const json_job job = {&m, cases, n, &a, torch ? &tp : NULL};
            char err[512];
            if (cli_files_save_text("--json-out", a.json_out, print_json, &job, err, sizeof err))
                return say(EXIT_FAIL, "%s", err);
        }
    }
    fflush(stdout);
    for (int i = 0; i < n; i++)
        free(cases[i].ts), free(cases[i].tts), free(cases[i].bws), free(cases[i].sts);
    return failed ? EXIT_FAIL : 0;
}
