/*
 * cli_viz.c — `attn viz`: pictures of attention weights from .npy inputs, headless.
 *
 * What it is: the inputs and options of `attn run` (run_args.h), one forward call for the
 * LSE, then attn_weights_grid for the weights in blocks of rows and keys — at most
 * --pixels cells a side, each block's sum or max, computed in one more pass over K
 * without ever holding Lq x Lk — and heatmap.c's picture of one head or of every head.
 * The files by cli_files.h's rules, as attn run's: every path checked before anything is
 * read, the picture and --grid written to temporary files and renamed into place only
 * when both are complete.
 * What it is not: a second check of the inputs (run_args.h's) or of the weights (the
 * library's); the picture's layout and colours are heatmap.h's.
 */
#define _POSIX_C_SOURCE 200809L  // getline
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "cli.h"
#include "cli_files.h"
#include "cliopt.h"
#include "heatmap.h"
#include "npy.h"
#include "run_args.h"

static const char VIZ_USAGE[] =
    "usage: attn viz --q Q.npy --k K.npy --v V.npy --png OUT.png [options]\n"
    "\n"
    "  A heatmap of the attention weights softmax(scale * Q K^T + bias, masked) of one\n"
    "  batch entry: every query head in a grid of labelled panels, or the one --head.\n"
    "  Rows are queries, columns keys; white is weight 0, dark blue the top of the scale,\n"
    "  grey a masked cell (every entry of its block masked), distinct from weight 0.\n"
    "\n"
    "  --png OUT.png         the picture (required)\n"
    "  --head H              only query head H (default: all heads, a grid)\n"
    "  --batch N             the batch entry drawn (default 0)\n"
    "  --tokens FILE         token labels, one per line, Lk lines: the keys; row i takes\n"
    "                        the token at its diagonal (i, or i + Lk - Lq bottom-right).\n"
    "                        Drawn when a cell is one weight and at least 10 pixels\n"
    "  --pixels N            at most N cells a side (default 256): beyond, each cell is a\n"
    "                        block of rows and keys, computed streaming from the LSE\n"
    "  --reduce sum|max      a block's value: sum = the weight its rows give its keys,\n"
    "                        summed over the keys and averaged over the rows (the block's\n"
    "                        share of its rows' attention); max = its largest weight\n"
    "                        (default sum; the same for a block of one entry)\n"
    "  --vmax X|auto         the top of the colour scale (default 1 for single weights,\n"
    "                        auto = the largest value drawn, for blocks)\n"
    "  --grid G.npy          also write the grid drawn [B, Hq, R, C] float32 (-inf masked)\n"
    "  --colour-scale linear|log   (or --color-scale) the colour of a value: linear from 0\n"
    "                        to vmax (default), or by log10 from --vmin to vmax, for the\n"
    "                        faint weights of long rows; the legend's ticks are then the\n"
    "                        powers of 10 and it says \"log scale\". Values at or below\n"
    "                        vmin (weight 0 too) are white, masked cells grey either way.\n"
    "                        (--scale is the softmax's, as in attn run.)\n"
    "  --vmin X|auto         the log scale's bottom, 0 < X < vmax (default auto: the\n"
    "                        smallest positive value drawn, at least vmax * 1e-6)\n"
    "\n"
    "  Inputs and every other option as for 'attn run' (attn run --help): --mask,\n"
    "  --causal, --align, --scale, --softcap, --window, --kv-len, --alibi, --threads,\n"
    "  --reference, --dtype, --precision. Exit status: 0 done, 1 bad data or library\n"
    "  error, 2 usage error.\n";

typedef struct viz_args {
    const char *png, *head, *batch, *tokens, *pixels, *reduce, *vmax, *grid;
    const char *colour_scale, *vmin;
} viz_args;

/* A whole-string integer in [lo, hi]. */
static int viz_int(const char *name, const char *s, int64_t lo, int64_t hi, int64_t *v) {
    char *end;
    const long long x = strtoll(s, &end, 10);
    if (!*s || *end || x < lo || x > hi)
        return run_say(EXIT_USAGE, "%s: expected an integer %lld..%lld, got '%s'", name,
                       (long long)lo, (long long)hi, s);
    *v = x;
    return 0;
}

/* The lines of path (without their newline, of any length) into *lines; *n gets the count. */
static int read_tokens(const char *path, char ***lines, int64_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return run_say(EXIT_DATA, "%s: cannot open", path);
    char **out = NULL, *buf = NULL;
    size_t cap = 0;
    int64_t count = 0, room = 0;
    int nomem = 0;
    ssize_t got;
    while ((got = getline(&buf, &cap, f)) >= 0) {
        buf[strcspn(buf, "\r\n")] = '\0';
        if (count == room) {
            room = room ? 2 * room : 64;
            char **grown = realloc(out, (size_t)room * sizeof *out);
            if (!grown) { nomem = 1; break; }
            out = grown;
        }
        if (!(out[count] = strdup(buf))) { nomem = 1; break; }
        count++;
    }
    const int bad = nomem || ferror(f) || !feof(f);
    free(buf);
    fclose(f);
    *lines = out;
    *n = count;
    return bad ? run_say(EXIT_DATA, "%s: read error or out of memory", path) : 0;
}

static void free_tokens(char **lines, int64_t n) {
    for (int64_t x = 0; x < n; x++) free(lines[x]);
    free(lines);
}

/* One picture's work: the options as given and as parsed, the output files, the inputs,
 * and what each step below builds from them; viz_free releases it all. */
typedef struct viz_job {
    run_args a;
    viz_args z;
    int64_t pixels, head, batch;
    attn_reduce reduce;
    int log_scale;
    double vmin, vmax;  // 0 = auto
    cli_path out_paths[2];
    int n_out;
    run_inputs in;
    int64_t R, C;  // the grid's rows and columns
    int single;    // a cell is one weight
    float *o, *lse, *grid;
    char **tokens, **row_tokens;
    int64_t ntok;
    heat_panel *panels;
    char (*titles)[32];
    int np;
    char title[200];
} viz_job;

/* The options: scanned, the required ones present, every value parsed and checked. */
static int viz_parse(int argc, char **argv, viz_job *j) {
    run_args *a = &j->a;
    viz_args *z = &j->z;
    cli_opt opts[RUN_INPUT_OPTS + 11];
    int n = run_input_opts(a, opts);
    const cli_opt own[11] = {
        {"--png", &z->png, NULL},       {"--head", &z->head, NULL},     {"--batch", &z->batch, NULL},
        {"--tokens", &z->tokens, NULL}, {"--pixels", &z->pixels, NULL}, {"--reduce", &z->reduce, NULL},
        {"--vmax", &z->vmax, NULL},     {"--grid", &z->grid, NULL},
        {"--colour-scale", &z->colour_scale, NULL}, {"--color-scale", &z->colour_scale, NULL},
        {"--vmin", &z->vmin, NULL},
    };
    memcpy(opts + n, own, sizeof own);
    n += 11;
    int rc = cli_scan(argc, argv, opts, n, "viz: ", "viz");
    if (rc || (rc = run_require_inputs(a, "viz"))) return rc;
    if (!z->png) return run_say(EXIT_USAGE, "viz: missing required option --png (see 'attn viz --help')");
    j->pixels = 256, j->head = -1, j->batch = 0;
    if (z->pixels && (rc = viz_int("--pixels", z->pixels, 1, 4096, &j->pixels))) return rc;
    if (z->head && (rc = viz_int("--head", z->head, 0, INT32_MAX, &j->head))) return rc;
    if (z->batch && (rc = viz_int("--batch", z->batch, 0, INT32_MAX, &j->batch))) return rc;
    j->reduce = ATTN_REDUCE_SUM;
    if (z->reduce) {
        if (strcmp(z->reduce, "max") == 0) j->reduce = ATTN_REDUCE_MAX;
        else if (strcmp(z->reduce, "sum") != 0)
            return run_say(EXIT_USAGE, "--reduce: expected sum or max, got '%s'", z->reduce);
    }
    j->log_scale = 0;
    if (z->colour_scale) {
        if (strcmp(z->colour_scale, "log") == 0) j->log_scale = 1;
        else if (strcmp(z->colour_scale, "linear") != 0)
            return run_say(EXIT_USAGE, "--colour-scale: expected linear or log, got '%s'",
                           z->colour_scale);
    }
    j->vmin = 0;  // 0 = auto
    if (z->vmin && strcmp(z->vmin, "auto") != 0) {
        char *end;
        j->vmin = strtod(z->vmin, &end);
        if (!*z->vmin || *end || !(j->vmin > 0) || !isfinite(j->vmin))
            return run_say(EXIT_USAGE, "--vmin: expected a number > 0 or auto, got '%s'", z->vmin);
    }
    if (z->vmin && !j->log_scale)
        return run_say(EXIT_USAGE, "--vmin: only with --colour-scale log");
    j->vmax = 0;  // 0 = auto
    if (z->vmax && strcmp(z->vmax, "auto") != 0) {
        char *end;
        j->vmax = strtod(z->vmax, &end);
        if (!*z->vmax || *end || !(j->vmax > 0) || !isfinite(j->vmax))
            return run_say(EXIT_USAGE, "--vmax: expected a number > 0 or auto, got '%s'", z->vmax);
    }
    return 0;
}

/* The files, by the rules of cli_files.h, before anything is read or written. */
static int viz_check_files(viz_job *j) {
    const run_args *a = &j->a;
    const viz_args *z = &j->z;
    const char *ins[][2] = {{"--q", a->q},           {"--k", a->k},         {"--v", a->v},
                            {"--mask", a->mask},     {"--kv-len", a->kv_len}, {"--alibi", a->alibi},
                            {"--tokens", z->tokens}};
    cli_path in_paths[7];
    int n_in = 0;
    for (int i = 0; i < 7; i++)
        if (ins[i][1]) in_paths[n_in++] = (cli_path){.opt = ins[i][0], .path = ins[i][1]};
    j->out_paths[j->n_out++] = (cli_path){.opt = "--png", .path = z->png};
    if (z->grid) j->out_paths[j->n_out++] = (cli_path){.opt = "--grid", .path = z->grid};
    char err[512];
    const int x = cli_files_check(in_paths, n_in, j->out_paths, j->n_out, err, sizeof err);
    if (x) {
        cli_files_abort(j->out_paths, j->n_out);
        return run_say(x == -2 ? EXIT_USAGE : EXIT_DATA, "%s", err);
    }
    return 0;
}

/* The inputs and the tokens, read and checked against the options. */
static int viz_load(viz_job *j) {
    int rc;
    if ((rc = run_load_inputs(&j->a, &j->in))) return rc;
    const int64_t B = j->in.B, Hq = j->in.Hq, Lq = j->in.Lq, Lk = j->in.Lk;
    if (B == 0 || Hq == 0 || Lq == 0 || Lk == 0)
        return run_say(EXIT_DATA, "viz: nothing to draw: B, Hq, Lq and Lk must be > 0 (%lld, %lld, "
                       "%lld, %lld)", (long long)B, (long long)Hq, (long long)Lq, (long long)Lk);
    if (j->batch >= B || j->head >= Hq)
        return run_say(EXIT_USAGE, "viz: %s %lld is out of range (B = %lld, Hq = %lld)",
                       j->batch >= B ? "--batch" : "--head",
                       (long long)(j->batch >= B ? j->batch : j->head), (long long)B, (long long)Hq);
    if (j->z.tokens) {
        if ((rc = read_tokens(j->z.tokens, &j->tokens, &j->ntok))) return rc;
        if (j->ntok != Lk)
            return run_say(EXIT_DATA, "%s: %lld lines, expected one token per key (Lk = %lld)",
                           j->z.tokens, (long long)j->ntok, (long long)Lk);
    }
    return 0;
}

/* The forward's LSE (O is computed and dropped), then the grid from it; --grid's file
 * written to its temporary now, before viz_scale changes the grid. */
static int viz_compute_grid(viz_job *j) {
    const int64_t B = j->in.B, Hq = j->in.Hq, Lq = j->in.Lq, Lk = j->in.Lk, Dv = j->in.Dv;
    const int64_t R = j->R = Lq < j->pixels ? Lq : j->pixels;
    const int64_t C = j->C = Lk < j->pixels ? Lk : j->pixels;
    j->o = malloc((size_t)(B * Hq * Lq * Dv + 1) * sizeof(float));
    j->lse = malloc((size_t)(B * Hq * Lq) * sizeof(float));
    j->grid = malloc((size_t)(B * Hq * R * C) * sizeof(float));
    j->panels = calloc((size_t)Hq, sizeof *j->panels);
    j->titles = calloc((size_t)Hq, sizeof *j->titles);
    if (!j->o || !j->lse || !j->grid || !j->panels || !j->titles)
        return run_say(EXIT_DATA, "viz: out of memory");
    const attn_tensor to = attn_tensor_4d(j->o, ATTN_F32, B, Hq, Lq, Dv);
    const attn_tensor tl = attn_tensor_4d(j->lse, ATTN_F32, B, Hq, Lq, 1);
    const attn_tensor tg = attn_tensor_4d(j->grid, ATTN_F32, B, Hq, R, C);
    attn_options opt = j->in.opt;
    opt.lse = &tl;
    attn_status st = attn_forward(&j->in.tq, &j->in.tk, &j->in.tv, &to, &opt);
    opt.lse = NULL;
    if (st == ATTN_OK) st = attn_weights_grid(&j->in.tq, &j->in.tk, &tl, &tg, j->reduce, &opt);
    if (st != ATTN_OK) return run_library_error(st);
    if (j->z.grid) {
        char err[512];
        if (cli_files_write(&j->out_paths[1], ATTN_F32, 4, (int64_t[]){B, Hq, R, C}, j->grid, err,
                            sizeof err))
            return run_say(EXIT_DATA, "%s: %s", j->z.grid, err);
    }
    return 0;
}

/* What is drawn: a sum as its rows' average, so that every cell lies in [0, 1]; then the
 * colour scale's top (vmax) and, on a log scale, its bottom (vmin). */
static int viz_scale(viz_job *j) {
    const int64_t Hq = j->in.Hq, Lq = j->in.Lq, Lk = j->in.Lk, R = j->R, C = j->C;
    const int64_t head = j->head, batch = j->batch;
    j->single = R == Lq && C == Lk;
    double top = 0;
    for (int64_t h = 0; h < Hq; h++) {
        float *g = j->grid + (batch * Hq + h) * R * C;
        for (int64_t r = 0; r < R; r++) {
            /* rows i with floor(i R / Lq) = r: from ceil(r Lq / R) to ceil((r + 1) Lq / R) */
            const int64_t rows = ((r + 1) * Lq + R - 1) / R - (r * Lq + R - 1) / R;
            for (int64_t c = 0; c < C; c++) {
                float *x = &g[r * C + c];
                if (j->reduce == ATTN_REDUCE_SUM && *x != -INFINITY) *x /= (float)rows;
                if ((head < 0 || h == head) && isfinite(*x) && *x > top) top = *x;
            }
        }
    }
    if (j->vmax == 0) j->vmax = j->single ? 1.0 : top > 0 ? top : 1.0;
    const double vmax = j->vmax;
    if (j->log_scale && j->vmin == 0) {  // auto: the smallest positive value drawn, >= vmax * 1e-6
        double low = vmax;
        for (int64_t h = 0; h < Hq; h++) {
            const float *g = j->grid + (batch * Hq + h) * R * C;
            for (int64_t x = 0; (head < 0 || h == head) && x < R * C; x++)
                if (isfinite(g[x]) && g[x] > 0 && g[x] < low) low = g[x];
        }
        j->vmin = low > vmax * 1e-6 ? low : vmax * 1e-6;
        if (!(j->vmin < vmax)) j->vmin = vmax * 1e-3;  // one value drawn: a scale of 3 decades below it
    }
    if (j->log_scale && !(j->vmin < vmax))
        return run_say(EXIT_USAGE, "--vmin %g: expected below the scale's top %g", j->vmin, vmax);
    return 0;
}

/* The panels (one head, or every head titled), the tokens of the rows and the title. */
static int viz_layout(viz_job *j) {
    const int64_t Hq = j->in.Hq, Lq = j->in.Lq, Lk = j->in.Lk, R = j->R, C = j->C;
    const int64_t batch = j->batch;
    for (int64_t h = 0; h < Hq; h++) {
        if (j->head >= 0 && h != j->head) continue;
        snprintf(j->titles[j->np], sizeof j->titles[j->np], "head %lld", (long long)h);
        j->panels[j->np].cells = j->grid + (batch * Hq + h) * R * C;
        j->panels[j->np].title = Hq > 1 ? j->titles[j->np] : NULL;
        j->np++;
    }
    if (j->tokens && j->single) {
        j->row_tokens = calloc((size_t)Lq, sizeof *j->row_tokens);
        if (!j->row_tokens) return run_say(EXIT_DATA, "viz: out of memory");
        for (int64_t i = 0; i < Lq; i++) {
            const int64_t d = j->in.opt.align == ATTN_ALIGN_BOTTOM_RIGHT ? i + Lk - Lq : i;
            j->row_tokens[i] = d >= 0 && d < Lk ? j->tokens[d] : "";
        }
    }
    if (j->single)
        snprintf(j->title, sizeof j->title, "attention weights, batch %lld, %lld queries x %lld keys",
                 (long long)batch, (long long)Lq, (long long)Lk);
    else
        snprintf(j->title, sizeof j->title, "attention, batch %lld, %lld x %lld in blocks of %lld x %lld "
                 "(%s)", (long long)batch, (long long)Lq, (long long)Lk, (long long)((Lq + R - 1) / R),
                 (long long)((Lk + C - 1) / C), j->reduce == ATTN_REDUCE_MAX ? "max" : "row share");
    return 0;
}

/* The picture drawn into its temporary file, then every output renamed into place. */
static int viz_draw(viz_job *j) {
    const heat_spec spec = {
        .title = j->title, .panels = j->panels, .n_panels = j->np, .rows = j->R, .cols = j->C,
        .vmax = j->vmax,
        .scale_label = j->reduce == ATTN_REDUCE_MAX || j->single ? "weight" : "share",
        .row_labels = (const char *const *)j->row_tokens,
        .col_labels = j->single ? (const char *const *)j->tokens : NULL,
        .numbers = j->single, .log = j->log_scale, .vmin = j->vmin,
    };
    char err[512];
    const int fd = cli_files_open(&j->out_paths[0], err, sizeof err);
    if (fd < 0 || heat_png_fd(fd, j->z.png, &spec, err, sizeof err))
        return run_say(EXIT_DATA, "%s%s%s", fd < 0 ? j->z.png : "", fd < 0 ? ": " : "", err);
    if (cli_files_commit(j->out_paths, j->n_out, err, sizeof err))  // all complete: into place
        return run_say(EXIT_DATA, "%s", err);
    return 0;
}

static void viz_free(viz_job *j) {
    cli_files_abort(j->out_paths, j->n_out);
    run_inputs_free(&j->in);
    free(j->o);
    free(j->lse);
    free(j->grid);
    free(j->panels);
    free(j->titles);
    free(j->row_tokens);
    if (j->tokens) free_tokens(j->tokens, j->ntok);
}

int cli_viz(int argc, char **argv) {
    if (run_help(argc, argv, VIZ_USAGE)) return 0;
    viz_job j = {0};
    int rc = viz_parse(argc, argv, &j);
    if (rc || (rc = viz_check_files(&j))) return rc;
    if (!(rc = viz_load(&j)) && !(rc = viz_compute_grid(&j)) && !(rc = viz_scale(&j)) &&
        !(rc = viz_layout(&j)))
        rc = viz_draw(&j);
    viz_free(&j);
    return rc;
}
