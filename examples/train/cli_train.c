/*
 * cli_train.c — `attn train`: trains the small character-level transformer of
 *               model.c on this project's own source text, with the causal mask and
 *               with the seed's reversed mask, and compares them (seed 003, exercise 3).
 *
 * It reads the text at run time (src/, include/, tools/attn/, tools/common/, bench/ and
 * the examples' folders of the source tree, found from the executable's location or the
 * current directory; or --data), prints the unigram entropy of the characters, trains one
 * model per mask on the same batches, prints the losses as it goes (a progress line on
 * stderr), then both curves side by side, a sample generated one character at a time by
 * each model, and writes the curves as a PNG. Its files follow the rules of cli_files.h
 * (docs/CLI.md, "Files"): the text read and every output (--png, the --viz files) are
 * checked before training, and the outputs renamed into place only once all are written.
 * What it is not: a general trainer (one architecture; sizes are options) or a test (the
 * model's gradients are checked by tests/test_model.c).
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "attn.h"
#include "cli.h"
#include "cli_files.h"
#include "model.h"
#include "npy.h"
#include "png_plot.h"
#include "rng.h"

static const char USAGE[] =
    "usage: attn train [options]\n"
    "\n"
    "  Trains a small character-level transformer (token and position embeddings, pre-norm\n"
    "  blocks of multi-head attention on this library's forward and backward, a GELU MLP,\n"
    "  AdamW) on this project's source text, once with the causal mask and once with the\n"
    "  reversed one (each position sees itself and the future: seed 003, exercise 3), and\n"
    "  compares them: losses, samples generated one character at a time, a PNG of the curves.\n"
    "\n"
    "  --mask causal|reversed  train that model only (default: both, compared)\n"
    "  --compare               both (the default)\n"
    "  --data PATH[,PATH...]   text files, or directories whose *.c, *.h, *.md, *.txt files are\n"
    "                          read (default: the sources of this tree, src to examples)\n"
    "  --steps N               optimizer steps per model (default 300)\n"
    "  --batch B --ctx T       sequences per step and their length (default 16, 128)\n"
    "  --d-model C --heads H --layers L   the model (default 128, 4, 2)\n"
    "  --lr X                  peak learning rate (default 3e-3; warmup, then cosine to 1/10)\n"
    "  --eval-every N          validation every N steps (default 25)\n"
    "  --sample N              characters each model generates at the end (default 240)\n"
    "  --temperature X         sampling temperature (default 0.8)\n"
    "  --png FILE              the loss curves (default attn-train.png; 'none' to skip)\n"
    "  --seed S                initialization, batches and sampling (default 1)\n"
    "  --threads N             OpenMP threads (default: all)\n"
    "  --quiet                 no progress line on stderr\n"
    "  --viz DIR               after training, the causal model's attention inputs on the\n"
    "                          first line of the validation text: DIR/layerL_{q,k,v}.npy\n"
    "                          [1, H, t, D] and DIR/tokens.txt, for attn viz --causal\n";

typedef struct train_opts {
    int steps, batch, ctx, d_model, heads, layers, eval_every, sample, threads;
    double lr, temperature;
    uint64_t seed;
    const char *png, *viz;
    bool run[2];  // [0] causal, [1] reversed
    bool quiet;
    char *data[64];
    int n_data;
    /* the outputs, by cli_files.h: [0] --png (when not 'none'), then with --viz each
     * layer's q, k, v and tokens.txt; viz_out is where the --viz ones start */
    cli_path *out;
    int n_out, viz_out;
} train_opts;

/* ---- the text ---------------------------------------------------------------------------- */

typedef struct text {
    unsigned char *bytes;
    int64_t n;
    int files;
    cli_path *read;  // the files read (paths malloc'ed), checked against the outputs
    int n_read;
    char what[160];  // how it was found, for the report
} text;

static bool has_ext(const char *name) {
    static const char *const ext[] = {".c", ".h", ".md", ".txt"};
    const size_t n = strlen(name);
    for (size_t e = 0; e < sizeof ext / sizeof ext[0]; e++) {
        const size_t m = strlen(ext[e]);
        if (n > m && strcmp(name + n - m, ext[e]) == 0) return true;
    }
    return false;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int append_file(text *t, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "attn train: %s: %s\n", path, strerror(errno));
        return -1;
    }
    unsigned char buf[65536];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
        unsigned char *nb = realloc(t->bytes, (size_t)t->n + got);
        if (!nb) {
            fclose(f);
            fprintf(stderr, "attn train: out of memory reading %s\n", path);
            return -1;
        }
        t->bytes = nb;
        memcpy(t->bytes + t->n, buf, got);
        t->n += (int64_t)got;
    }
    const int bad = ferror(f);
    fclose(f);
    if (bad) {
        fprintf(stderr, "attn train: %s: read error\n", path);
        return -1;
    }
    t->files++;
    cli_path *grown = realloc(t->read, (size_t)(t->n_read + 1) * sizeof *grown);
    char *copy = strdup(path);
    if (grown) t->read = grown;
    if (!grown || !copy) {
        free(copy);
        fprintf(stderr, "attn train: out of memory\n");
        return -1;
    }
    t->read[t->n_read++] = (cli_path){.opt = "--data", .path = copy};
    return 0;
}

/* a file, or the matching files of a directory in name order */
static int append_path(text *t, const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "attn train: %s: %s\n", path, strerror(errno));
        return -1;
    }
    if (S_ISREG(st.st_mode)) return append_file(t, path);
    if (!S_ISDIR(st.st_mode)) {  // a FIFO would block the read
        fprintf(stderr, "attn train: %s: neither a regular file nor a directory: refused\n", path);
        return -1;
    }
    DIR *d = opendir(path);
    if (!d) {
        fprintf(stderr, "attn train: %s: %s\n", path, strerror(errno));
        return -1;
    }
    char **names = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || !has_ext(e->d_name)) continue;
        char **nn = realloc(names, (n + 1) * sizeof *names);
        if (!nn) break;
        names = nn;
        names[n] = malloc(strlen(path) + strlen(e->d_name) + 2);
        if (!names[n]) break;
        sprintf(names[n], "%s/%s", path, e->d_name);
        n++;
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_str);
    int rc = 0;
    for (size_t k = 0; k < n; k++) {
        if (rc == 0 && stat(names[k], &st) == 0 && S_ISREG(st.st_mode)) rc = append_file(t, names[k]);
        free(names[k]);
    }
    free(names);
    return rc;
}

/* The source tree: the executable's directory's parent (build/attn), the executable's
 * directory, or the current directory — the first that has src/core/attn_internal.h. */
static bool find_tree(char *root, size_t n) {
    char exe[PATH_MAX];
    const ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    const char *cands[3] = {NULL, NULL, "."};
    char up[PATH_MAX + 4], here[PATH_MAX];
    if (len > 0) {
        exe[len] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            snprintf(up, sizeof up, "%s/..", exe);
            snprintf(here, sizeof here, "%s", exe);
            cands[0] = up;
            cands[1] = here;
        }
    }
    for (int c = 0; c < 3; c++) {
        if (!cands[c]) continue;
        char probe[PATH_MAX + 64];
        snprintf(probe, sizeof probe, "%s/src/attn_internal.h", cands[c]);
        if (access(probe, R_OK) == 0) {
            snprintf(root, n, "%s", cands[c]);
            return true;
        }
    }
    return false;
}

static int load_text(const train_opts *o, text *t) {
    memset(t, 0, sizeof *t);
    if (o->n_data > 0) {
        for (int k = 0; k < o->n_data; k++)
            if (append_path(t, o->data[k]) != 0) return -1;
        snprintf(t->what, sizeof t->what, "%s%s", o->data[0], o->n_data > 1 ? ", ..." : "");
        return 0;
    }
    char root[PATH_MAX];
    if (!find_tree(root, sizeof root)) {
        fprintf(stderr, "attn train: cannot find this project's source tree (src/core/attn_internal.h) "
                        "next to the executable or in the current directory; give --data\n");
        return -1;
    }
    /* the library and the programs outside it (README.md's "Layout"), each folder's own
     * files in name order */
    static const char *const dirs[] = {"src",   "include",        "tools/attn",      "tools/common",
                                       "bench", "examples/train", "examples/seq2seq"};
    for (int k = 0; k < (int)(sizeof dirs / sizeof dirs[0]); k++) {
        char p[PATH_MAX + 16];
        snprintf(p, sizeof p, "%s/%s", root, dirs[k]);
        if (append_path(t, p) != 0) return -1;
    }
    snprintf(t->what, sizeof t->what, "the project's src/, include/, tools/, bench/ and examples/");
    return 0;
}

/* ---- helpers -------------------------------------------------------------------------------- */

static rng_t g_rng;
static double rng_unit(void) { return rng_unif(&g_rng); }

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool parse_int(const char *s, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    const long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}
static bool parse_double(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    const double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

/* ---- training ------------------------------------------------------------------------------ */

/* what one model's run leaves for the report */
typedef struct run_log {
    double *step_loss;              // (steps) training loss of every step
    double *smooth;                 // (steps) its mean over the last 10 steps, for the plot
    double *ev_step, *ev_train, *ev_val, *ev_last;  // at each evaluation
    int n_ev;
    double seconds;
    char *sample;
} run_log;

/* the learning rate of step s (0-based): linear warmup over the first 10%, then a cosine
 * from lr to lr / 10 */
static double lr_at(const train_opts *o, int s) {
    const int warm = o->steps / 10 > 0 ? o->steps / 10 : 1;
    if (s < warm) return o->lr * (s + 1) / warm;
    const double f = (double)(s - warm) / (double)(o->steps - warm > 1 ? o->steps - warm : 1);
    return o->lr * (0.1 + 0.9 * 0.5 * (1 + cos(3.141592653589793 * f)));
}

/* a batch of windows starting at starts[b]: tokens x[t], targets x[t + 1] */
static void make_batch(const int *ids, const int64_t *starts, int b, int t, int *tok, int *tgt) {
    for (int s = 0; s < b; s++)
        for (int k = 0; k < t; k++) {
            tok[s * t + k] = ids[starts[s] + k];
            tgt[s * t + k] = ids[starts[s] + k + 1];
        }
}

/* validation: mean loss over every position, and over the last position only (the only
 * one that, under the reversed mask, cannot see the character it predicts: what
 * generation one character at a time sees) */
static int evaluate(model *m, const train_opts *o, const int *ids, int64_t v0, int64_t v1,
                    double *all, double *last) {
    const int B = o->batch, T = o->ctx, batches = 4;
    int *tok = malloc(sizeof(int) * (size_t)(B * T)), *tgt = malloc(sizeof(int) * (size_t)(B * T));
    int64_t starts[4096];
    double sum = 0, sum_last = 0;
    int rc = 0;
    const int64_t span = v1 - v0 - T - 1;
    for (int k = 0; k < batches && rc == 0; k++) {
        for (int s = 0; s < B; s++) starts[s] = v0 + (span * (k * B + s)) / (batches * B);
        make_batch(ids, starts, B, T, tok, tgt);
        double loss;
        rc = model_forward(m, tok, tgt, B, T, &loss);
        sum += loss;
        const float *l = model_losses(m);
        for (int s = 0; s < B; s++) sum_last += l[s * T + T - 1];
    }
    *all = sum / batches;
    *last = sum_last / (batches * B);
    free(tok);
    free(tgt);
    return rc;
}

/* n characters after a prompt, one at a time: each step runs the model on the last
 * (at most ctx) characters and draws the next from the last position's distribution */
static char *generate(model *m, const train_opts *o, const int *prompt, int np, int n,
                      const unsigned char *vocab, int V) {
    const int total = np + n;
    int *ids = malloc(sizeof(int) * (size_t)total);
    float *w = malloc(sizeof(float) * (size_t)V);
    char *out = malloc((size_t)n + 1);
    if (!ids || !w || !out) {
        free(ids);
        free(w);
        free(out);
        return NULL;
    }
    memcpy(ids, prompt, sizeof(int) * (size_t)np);
    int len = np;
    for (int k = 0; k < n; k++) {
        const int t = len < o->ctx ? len : o->ctx;
        if (model_forward(m, ids + len - t, NULL, 1, t, NULL) != 0) break;
        const float *p = model_probs(m) + (int64_t)(t - 1) * V;
        /* temperature: p^(1/temp), renormalized */
        double z = 0;
        for (int v = 0; v < V; v++) z += w[v] = (float)pow(p[v], 1.0 / o->temperature);
        double r = rng_unit() * z, acc = 0;
        int pick = V - 1;
        for (int v = 0; v < V; v++) {
            acc += w[v];
            if (r < acc) {
                pick = v;
                break;
            }
        }
        ids[len++] = pick;
        out[k] = (char)vocab[pick];
    }
    out[len - np] = '\0';
    free(ids);
    free(w);
    return out;
}

static void progress(const train_opts *o, const char *name, int s, double loss, double t0) {
    if (o->quiet) return;
    const double el = seconds() - t0, eta = s > 0 ? el / s * (o->steps - s) : 0;
    const bool tty = isatty(2);
    if (!tty && s % (o->steps / 10 > 0 ? o->steps / 10 : 1) != 0 && s != o->steps) return;
    fprintf(stderr, "%s[%s] step %d/%d  loss %.3f  %.1f s, %.0f s to go%s", tty ? "\r" : "", name,
            s, o->steps, loss, el, eta, tty ? "   " : "\n");
    fflush(stderr);
}

/* --viz: one forward of the trained model over the line starting at ids[line0] (at most
 * ctx characters, the newline excluded), then each block's Q, K, V as .npy files and the
 * characters as tokens, one a line: to the temporary files of o->out[o->viz_out ...]
 * (layer l's q, k, v, then tokens.txt), renamed into place by cli_train. */
static int dump_attention(model *m, const train_opts *o, const int *ids, int64_t line0,
                          const unsigned char *vocab) {
    int t = 0;
    while (t < o->ctx && vocab[ids[line0 + t]] != '\n') t++;
    if (t < 2) t = 2;
    const int64_t H = o->heads, D = o->d_model / o->heads;
    float *qkv = malloc(sizeof(float) * (size_t)(3 * H * t * D));
    cli_path *out = o->out + o->viz_out;
    char err[512];
    int rc = !qkv || model_forward(m, ids + line0, NULL, 1, t, NULL) != 0;
    for (int l = 0; !rc && l < o->layers; l++) {
        rc = model_attention_inputs(m, l, qkv) != 0;
        for (int x = 0; !rc && x < 3; x++) {
            cli_path *p = &out[3 * l + x];
            rc = cli_files_write(p, ATTN_F32, 4, (int64_t[]){1, H, t, D}, qkv + x * H * t * D,
                                 err, sizeof err) != 0;
            if (rc) fprintf(stderr, "attn train: %s: %s\n", p->path, err);
        }
    }
    cli_path *tp = &out[3 * o->layers];
    const int fd = rc ? -1 : cli_files_open(tp, err, sizeof err);
    FILE *f = fd < 0 ? NULL : fdopen(fd, "w");
    if (fd >= 0 && !f) close(fd);
    for (int i = 0; f && i < t; i++) fprintf(f, "%c\n", vocab[ids[line0 + i]]);
    if (!rc && (!f || fclose(f) != 0)) {
        fprintf(stderr, "attn train: %s: cannot write%s%s\n", tp->path, fd < 0 ? ": " : "",
                fd < 0 ? err : "");
        rc = 1;
    }
    free(qkv);
    if (!rc)
        printf("attention inputs of the causal model on %d characters of the validation text: "
               "%s/layer*_{q,k,v}.npy, %s/tokens.txt\n", t, o->viz, o->viz);
    return rc;
}

/* The outputs of o (--png, the --viz files) into o->out, checked by cli_files.h's rules
 * against the text read and each other before training: 0, or the exit status. */
static int check_outputs(train_opts *o, text *tx) {
    const bool viz = o->viz && o->run[0];  // the causal model's: none with --mask reversed
    const int n = 1 + (viz ? 3 * o->layers + 1 : 0);
    o->out = calloc((size_t)n, sizeof *o->out);
    if (!o->out) return 1;
    if (o->png) o->out[o->n_out++] = (cli_path){.opt = "--png", .path = o->png};
    o->viz_out = o->n_out;
    for (int k = 0; viz && k <= 3 * o->layers; k++) {
        char name[64];
        if (k < 3 * o->layers) snprintf(name, sizeof name, "layer%d_%c.npy", k / 3, "qkv"[k % 3]);
        else snprintf(name, sizeof name, "tokens.txt");
        const size_t len = strlen(o->viz) + strlen(name) + 2;
        char *path = malloc(len);
        if (!path) return 1;
        snprintf(path, len, "%s/%s", o->viz, name);
        o->out[o->n_out++] = (cli_path){.opt = "--viz", .path = path};
    }
    char err[512];
    const int x = cli_files_check(tx->read, tx->n_read, o->out, o->n_out, err, sizeof err);
    if (x) fprintf(stderr, "attn train: %s\n", err);
    return x == -2 ? 2 : x ? 1 : 0;
}

static int train_one(const train_opts *o, bool reversed, const int *ids, int64_t n_train,
                     int64_t v0, int64_t v1, int64_t prompt0, int V, const unsigned char *vocab,
                     run_log *log) {
    const char *name = reversed ? "reversed" : "causal";
    const model_config cfg = {.vocab = V, .ctx = o->ctx, .d_model = o->d_model, .heads = o->heads,
                              .layers = o->layers, .batch = o->batch, .reversed = reversed,
                              .seed = o->seed};
    const char *why = "";
    model *m = model_create(&cfg, &why);
    if (!m) {
        fprintf(stderr, "attn train: %s\n", why);
        return 1;
    }
    const int B = o->batch, T = o->ctx;
    int *tok = malloc(sizeof(int) * (size_t)(B * T)), *tgt = malloc(sizeof(int) * (size_t)(B * T));
    int64_t *starts = malloc(sizeof(int64_t) * (size_t)B);
    const int n_ev_max = o->steps / o->eval_every + 2;
    log->step_loss = calloc((size_t)o->steps, sizeof(double));
    log->ev_step = calloc((size_t)n_ev_max, sizeof(double));
    log->ev_train = calloc((size_t)n_ev_max, sizeof(double));
    log->ev_val = calloc((size_t)n_ev_max, sizeof(double));
    log->ev_last = calloc((size_t)n_ev_max, sizeof(double));
    if (!tok || !tgt || !starts || !log->step_loss || !log->ev_step || !log->ev_train ||
        !log->ev_val || !log->ev_last) {
        fprintf(stderr, "attn train: out of memory\n");
        model_free(m);
        return 1;
    }
    printf("\n[%s] %s mask: row i attends to keys j %s i\n", name,
           reversed ? "reversed (window left 0, right unbounded)" : "causal", reversed ? ">=" : "<=");
    printf("%8s %10s %10s %22s %8s\n", "step", "train", "val", "val, last position", "time");

    g_rng.s = o->seed * 0x9E3779B97F4A7C15ull + 17;  // the same batches for both models
    const double t0 = seconds();
    double window = 0;
    int in_window = 0, rc = 0;
    for (int s = 0; s <= o->steps && rc == 0; s++) {
        if (s % o->eval_every == 0 || s == o->steps) {
            double all, last;
            rc = evaluate(m, o, ids, v0, v1, &all, &last);
            const int e = log->n_ev++;
            log->ev_step[e] = s;
            log->ev_train[e] = in_window ? window / in_window : NAN;
            log->ev_val[e] = all;
            log->ev_last[e] = last;
            if (in_window) printf("%8d %10.4f %10.4f %22.4f %7.1fs\n", s, log->ev_train[e], all, last, seconds() - t0);
            else printf("%8d %10s %10.4f %22.4f %7.1fs\n", s, "-", all, last, seconds() - t0);
            fflush(stdout);
            window = 0;
            in_window = 0;
        }
        if (s == o->steps || rc) break;
        for (int b = 0; b < B; b++) starts[b] = (int64_t)(rng_unit() * (double)(n_train - T - 1));
        make_batch(ids, starts, B, T, tok, tgt);
        double loss;
        rc = model_forward(m, tok, tgt, B, T, &loss);
        if (rc == 0) {
            model_zero_grad(m);
            rc = model_backward(m);
        }
        if (rc == 0) model_adamw(m, lr_at(o, s), 0.1, 1.0);
        log->step_loss[s] = loss;
        window += loss;
        in_window++;
        progress(o, name, s + 1, loss, t0);
    }
    if (!o->quiet && isatty(2)) fputc('\n', stderr);
    log->seconds = seconds() - t0;
    if (rc != 0) {
        fprintf(stderr, "attn train: %s\n", model_error(m));
    } else if (o->sample > 0) {
        g_rng.s = o->seed * 0x9E3779B97F4A7C15ull + 99;  // the same draws for both models
        log->sample = generate(m, o, ids + prompt0, o->ctx / 2, o->sample, vocab, V);
    }
    if (rc == 0 && o->viz && !reversed) rc = dump_attention(m, o, ids, prompt0, vocab);
    free(tok);
    free(tgt);
    free(starts);
    model_free(m);
    return rc != 0;
}

/* printable: control characters other than newline and tab, and bytes of broken UTF-8
 * sequences, as '?' */
static void print_text(const char *s, const char *indent) {
    fputs(indent, stdout);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '\n') {
            fputc('\n', stdout);
            fputs(indent, stdout);
        } else if (*c == '\t' || (*c >= 0x20 && *c < 0x7f)) {
            fputc(*c, stdout);
        } else {
            fputc('?', stdout);
        }
    }
    fputc('\n', stdout);
}

int cli_train(int argc, char **argv) {
    train_opts o = {.steps = 300, .batch = 16, .ctx = 128, .d_model = 128, .heads = 4,
                    .layers = 2, .eval_every = 25, .sample = 240, .threads = 0, .lr = 3e-3,
                    .temperature = 0.8, .seed = 1, .png = "attn-train.png", .run = {true, true}};
    for (int a = 1; a < argc; a++) {
        const char *arg = argv[a], *val = a + 1 < argc ? argv[a + 1] : NULL;
        bool ok = true, takes = true;
        int seed;
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            fputs(USAGE, stdout);
            return 0;
        } else if (strcmp(arg, "--compare") == 0) {
            o.run[0] = o.run[1] = true;
            takes = false;
        } else if (strcmp(arg, "--quiet") == 0) {
            o.quiet = true;
            takes = false;
        } else if (!val) {
            fprintf(stderr, "attn train: %s: missing value (or unknown option; try --help)\n", arg);
            return 2;
        } else if (strcmp(arg, "--mask") == 0) {
            ok = strcmp(val, "causal") == 0 || strcmp(val, "reversed") == 0;
            o.run[0] = strcmp(val, "causal") == 0;
            o.run[1] = strcmp(val, "reversed") == 0;
        } else if (strcmp(arg, "--data") == 0) {
            char *copy = strdup(val), *save = NULL;
            for (char *p = strtok_r(copy, ",", &save); p && o.n_data < 64; p = strtok_r(NULL, ",", &save))
                o.data[o.n_data++] = strdup(p);
            free(copy);
        } else if (strcmp(arg, "--steps") == 0) ok = parse_int(val, 1, 1000000, &o.steps);
        else if (strcmp(arg, "--batch") == 0) ok = parse_int(val, 1, 4096, &o.batch);
        else if (strcmp(arg, "--ctx") == 0) ok = parse_int(val, 2, 65536, &o.ctx);
        else if (strcmp(arg, "--d-model") == 0) ok = parse_int(val, 1, 8192, &o.d_model);
        else if (strcmp(arg, "--heads") == 0) ok = parse_int(val, 1, 8192, &o.heads);
        else if (strcmp(arg, "--layers") == 0) ok = parse_int(val, 1, 64, &o.layers);
        else if (strcmp(arg, "--eval-every") == 0) ok = parse_int(val, 1, 1000000, &o.eval_every);
        else if (strcmp(arg, "--sample") == 0) ok = parse_int(val, 0, 100000, &o.sample);
        else if (strcmp(arg, "--threads") == 0) ok = parse_int(val, 1, 512, &o.threads);
        else if (strcmp(arg, "--lr") == 0) ok = parse_double(val, 0, 10, &o.lr);
        else if (strcmp(arg, "--temperature") == 0) ok = parse_double(val, 0.01, 100, &o.temperature);
        else if (strcmp(arg, "--png") == 0) o.png = strcmp(val, "none") == 0 ? NULL : val;
        else if (strcmp(arg, "--viz") == 0) ok = (o.viz = val) != NULL;
        else if (strcmp(arg, "--seed") == 0) {
            ok = parse_int(val, 0, INT_MAX, &seed);
            o.seed = (uint64_t)seed;
        } else {
            fprintf(stderr, "attn train: unknown option %s (try --help)\n", arg);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "attn train: %s: invalid value '%s'\n", arg, val);
            return 2;
        }
        if (takes) a++;
    }
    if (o.d_model % o.heads != 0) {
        fprintf(stderr, "attn train: --d-model %d is not a multiple of --heads %d\n", o.d_model, o.heads);
        return 2;
    }
#ifdef _OPENMP
    if (o.threads > 0) omp_set_num_threads(o.threads);
#endif

    int rc = 1;
    text tx;
    int *ids = NULL;
    run_log logs[2];
    memset(logs, 0, sizeof logs);
    if (load_text(&o, &tx) != 0) goto done;
    if ((rc = check_outputs(&o, &tx)) != 0) goto done;
    rc = 1;
    const int64_t n = tx.n;
    if (n < 4 * ((int64_t)o.ctx + 2)) {
        fprintf(stderr, "attn train: %lld characters of text, too few for --ctx %d\n",
                (long long)n, o.ctx);
        goto done;
    }

    /* the vocabulary: every byte value present, in order; the unigram entropy */
    int64_t count[256] = {0};
    for (int64_t k = 0; k < n; k++) count[tx.bytes[k]]++;
    unsigned char vocab[256];
    int index[256], V = 0;
    double H = 0;
    for (int c = 0; c < 256; c++) {
        index[c] = -1;
        if (!count[c]) continue;
        index[c] = V;
        vocab[V++] = (unsigned char)c;
        const double pc = (double)count[c] / (double)n;
        H -= pc * log(pc);
    }
    ids = malloc(sizeof(int) * (size_t)n);
    if (!ids) goto done;
    for (int64_t k = 0; k < n; k++) ids[k] = index[tx.bytes[k]];
    const int64_t n_train = n - n / 10;  // the last tenth is for validation

    const int64_t C = o.d_model, L = o.layers, T = o.ctx;
    const long long params = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C + C * V;
    printf("attn train: %lld characters of %s (%d files), %d distinct bytes\n", (long long)n,
           tx.what, tx.files, V);
    printf("unigram entropy of the text: %.4f nats per character (%.3f bits); a uniform guess: "
           "ln %d = %.3f\n", H, H / log(2.0), V, log((double)V));
    printf("model: %d layers, d_model %d, %d heads of %d, context %d, %lld parameters; batch %d; "
           "%d steps of AdamW (lr %g, warmup then cosine, weight decay 0.1, clip 1); kernel %s, "
           "%d threads\n", o.layers, o.d_model, o.heads, o.d_model / o.heads, o.ctx, params,
           o.batch, o.steps, o.lr, attn_kernel_name(),
#ifdef _OPENMP
           omp_get_max_threads()
#else
           1
#endif
    );
    printf("training text: the first %lld characters; validation: the last %lld\n",
           (long long)n_train, (long long)(n - n_train));
    /* the samples' prompt: ctx/2 characters of the validation text from a line's start */
    int64_t prompt0 = n_train;
    while (prompt0 < n - o.ctx && tx.bytes[prompt0 - 1] != '\n') prompt0++;

    for (int r = 0; r < 2; r++)
        if (o.run[r] && train_one(&o, r == 1, ids, n_train, n_train, n, prompt0, V, vocab, &logs[r]) != 0)
            goto done;

    /* side by side */
    const bool both = o.run[0] && o.run[1];
    const run_log *a = &logs[o.run[0] ? 0 : 1];
    printf("\nsummary (losses in nats per character; unigram entropy %.4f)\n", H);
    if (both) {
        printf("%8s | %10s %10s %12s | %10s %10s %12s\n", "step", "causal", "", "", "reversed", "", "");
        printf("%8s | %10s %10s %12s | %10s %10s %12s\n", "", "train", "val", "val, last", "train", "val", "val, last");
    } else {
        printf("%8s | %10s %10s %12s\n", "step", "train", "val", "val, last");
    }
    for (int e = 0; e < a->n_ev; e++) {
        printf("%8.0f |", a->ev_step[e]);
        for (int r = 0; r < 2; r++) {
            if (!o.run[r]) continue;
            const run_log *g = &logs[r];
            if (isnan(g->ev_train[e])) printf(" %10s", "-");
            else printf(" %10.4f", g->ev_train[e]);
            printf(" %10.4f %12.4f%s", g->ev_val[e], g->ev_last[e], r == 0 && both ? " |" : "");
        }
        printf("\n");
    }
    for (int r = 0; r < 2; r++) {
        if (!o.run[r]) continue;
        const run_log *g = &logs[r];
        const int e = g->n_ev - 1;
        printf("%-8s: final train %.4f, val %.4f, val at the last position %.4f (%.2f x the "
               "unigram entropy); %.1f s\n", r ? "reversed" : "causal", g->ev_train[e],
               g->ev_val[e], g->ev_last[e], g->ev_last[e] / H, g->seconds);
    }
    if (o.sample > 0) {
        printf("\nsamples: %d characters generated one at a time at temperature %g after the "
               "prompt (the first %d characters of the validation text):\n", o.sample,
               o.temperature, o.ctx / 2);
        char *prompt = malloc((size_t)o.ctx / 2 + 1);
        if (prompt) {
            for (int k = 0; k < o.ctx / 2; k++) prompt[k] = (char)tx.bytes[prompt0 + k];
            prompt[o.ctx / 2] = '\0';
            printf("\n--- prompt\n");
            print_text(prompt, "  ");
            free(prompt);
        }
        for (int r = 0; r < 2; r++)
            if (o.run[r] && logs[r].sample) {
                printf("--- %s model\n", r ? "reversed" : "causal");
                print_text(logs[r].sample, "  ");
            }
    }

    /* the curves */
    if (o.png) {
        plot_series s[5];
        int ns = 0;
        double *xs = malloc(sizeof(double) * (size_t)o.steps);
        double hx[2] = {0, o.steps}, hy[2] = {H, H};
        static const uint32_t colour[2] = {0x1F5FBF, 0xE0601A};
        double ymax = log((double)V) + 0.5;
        for (int k = 0; k < o.steps && xs; k++) xs[k] = k + 1;
        for (int r = 0; r < 2 && xs; r++) {
            if (!o.run[r]) continue;
            /* each step's training loss as the mean of the last 10 steps' */
            double *sm = logs[r].smooth = malloc(sizeof(double) * (size_t)o.steps);
            for (int k = 0; sm && k < o.steps; k++) {
                double acc = 0;
                const int k0 = k >= 9 ? k - 9 : 0;
                for (int j = k0; j <= k; j++) acc += logs[r].step_loss[j];
                sm[k] = acc / (k - k0 + 1);
            }
            s[ns++] = (plot_series){r ? "reversed: training loss" : "causal: training loss", xs,
                                    sm ? sm : logs[r].step_loss, o.steps, colour[r], 0};
            s[ns++] = (plot_series){r ? "reversed: validation, last position"
                                      : "causal: validation, last position",
                                    logs[r].ev_step, logs[r].ev_last, logs[r].n_ev, colour[r], 1};
        }
        s[ns++] = (plot_series){"unigram entropy", hx, hy, 2, 0x808080, 1};
        const plot_spec spec = {"attn train: causal vs reversed mask", "step", "loss (nats per character)",
                                (double)o.steps, ceil(ymax), s, ns};
        char err[512];
        const int fd = xs ? cli_files_open(&o.out[0], err, sizeof err) : -1;
        const int bad = fd < 0 || plot_png_fd(fd, o.png, &spec, err, sizeof err) != 0;
        if (bad) fprintf(stderr, "attn train: %s%s%s\n", fd < 0 ? o.png : "", fd < 0 ? ": " : "",
                         xs ? err : "out of memory");
        free(xs);
        if (bad) goto done;
    }
    {  // every output complete: into place
        char err[512];
        if (cli_files_commit(o.out, o.n_out, err, sizeof err) != 0) {
            fprintf(stderr, "attn train: %s\n", err);
            goto done;
        }
    }
    if (o.png) printf("\nloss curves written to %s\n", o.png);
    rc = 0;

done:
    for (int r = 0; r < 2; r++) {
        free(logs[r].step_loss);
        free(logs[r].smooth);
        free(logs[r].ev_step);
        free(logs[r].ev_train);
        free(logs[r].ev_val);
        free(logs[r].ev_last);
        free(logs[r].sample);
    }
    for (int k = 0; k < o.n_data; k++) free(o.data[k]);
    for (int k = o.viz_out; k < o.n_out; k++) free((char *)o.out[k].path);
    cli_files_abort(o.out, o.n_out);
    free(o.out);
    for (int k = 0; k < tx.n_read; k++) free((char *)tx.read[k].path);
    free(tx.read);
    free(ids);
    free(tx.bytes);
    return rc;
}
