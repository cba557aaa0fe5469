/*
 * cli_run.c — `attn run`: attention over .npy files, for scripts and outside harnesses.
 *
 * What it is: option parsing, the files checked by the rules of cli_files.h before any is
 * read, loading and checking the inputs (each error one line on stderr naming the file
 * or option; the loading is shared with `attn viz`, run_args.h), one attn_forward call,
 * then the outputs written all-or-nothing (temporary files renamed once all are
 * complete, cli_files.c). Exit status: 0 success, 2 usage error (one file named twice
 * included), 1 data or library error. What it is not: a second implementation of any
 * check the library makes — it checks early only where it can name the file the user
 * gave.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attn.h"
#include "cli.h"
#include "cli_files.h"
#include "cli_run.h"
#include "cliopt.h"
#include "run_args.h"
#include "core/half.h"
#include "npy.h"


static const char RUN_USAGE[] =
    "usage: attn run --q Q.npy --k K.npy --v V.npy --out O.npy [options]\n"
    "\n"
    "  O = softmax(scale * Q K^T + bias, masked) V, for float32 or float16 .npy arrays\n"
    "    Q [B, Hq, Lq, Dk]   K [B, Hkv, Lk, Dk]   V [B, Hkv, Lk, Dv]   O [B, Hq, Lq, Dv]\n"
    "\n"
    "  --mask M.npy            bool (true = attend) or float32 (added to the logits), shape\n"
    "                          broadcasting to [B, Hq, Lq, Lk] (a lower rank is right-aligned)\n"
    "  --causal                keep keys j <= d_i\n"
    "  --align top-left|bottom-right   the diagonal d_i = i, or i + Lk_b - Lq (top-left)\n"
    "  --scale S               multiply Q K^T by S (default 1/sqrt(Dk))\n"
    "  --softcap C             C * tanh(s / C) before the mask (0 = off)\n"
    "  --window LEFT,RIGHT     keep d_i - LEFT <= j <= d_i + RIGHT; -1 = unbounded\n"
    "  --kv-len LENS.npy       int32 or int64 [B]: keys j >= LENS[b] are masked\n"
    "  --block-table BT.npy    int32 [B, max_pages]: a paged cache; K, V are then the page\n"
    "                          pools [num_pages, Hkv, page_size, D], and key j of batch b is\n"
    "                          row j % page_size of page BT[b][j / page_size]\n"
    "                          (Lk = max_pages * page_size; pages past --kv-len are not read)\n"
    "  --alibi SLOPES.npy      float32 [Hq]: bias -slope[h] * |d_i - j|\n"
    "  --lse LSE.npy           also write the log-sum-exp [B, Hq, Lq] float32\n"
    "  --weights P.npy         also write the attention weights [B, Hq, Lq, Lk] float32\n"
    "  --threads N             threads (0 = all, the default)\n"
    "  --reference             use the float64 reference path\n"
    "  --dtype f32|f16|bf16|f64  convert Q, K, V to this type before the call; O is computed\n"
    "                          in it (bf16 O is written as float32, which holds it exactly)\n"
    "  --precision default|fast  fast: P rounded to bfloat16 for P V (bf16 V only)\n"
    "\n"
    "  Without --dtype each input keeps its .npy type: float32 Q over a float16 K/V cache\n"
    "  works; O is float16 when Q, K and V all are, else float32. float64 ('<f8') Q, K and V\n"
    "  go together (no mixing) and give float64 O and LSE (weights stay float32).\n"
    "\n"
    "  Options take their value as the next argument or after '='. Exit status: 0 done,\n"
    "  1 bad data or library error, 2 usage error. Outputs are written only on success.\n";

int run_say(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    code = cli_vsay(code, "", fmt, ap);
    va_end(ap);
    return code;
}
#define say run_say

/* ---- options ------------------------------------------------------------------------ */

int run_input_opts(run_args *a, cli_opt *opts) {
    const cli_opt in[RUN_INPUT_OPTS] = {
        {"--q", &a->q, NULL},           {"--k", &a->k, NULL},
        {"--v", &a->v, NULL},           {"--mask", &a->mask, NULL},
        {"--kv-len", &a->kv_len, NULL}, {"--alibi", &a->alibi, NULL},
        {"--align", &a->align, NULL},   {"--scale", &a->scale, NULL},
        {"--softcap", &a->softcap, NULL}, {"--window", &a->window, NULL},
        {"--threads", &a->threads, NULL}, {"--dtype", &a->dtype, NULL},
        {"--precision", &a->precision, NULL}, {"--causal", NULL, &a->causal},
        {"--reference", NULL, &a->reference},
    };
    memcpy(opts, in, sizeof in);
    return RUN_INPUT_OPTS;
}

int run_require_inputs(const run_args *a, const char *cmd) {
    const char *required[][2] = {{"--q", a->q}, {"--k", a->k}, {"--v", a->v}};
    for (int r = 0; r < 3; r++)
        if (!required[r][1])
            return run_say(EXIT_USAGE, "%s: missing required option %s (see 'attn %s --help')",
                           cmd, required[r][0], cmd);
    return 0;
}

static int parse_args(int argc, char **argv, run_args *a) {
    cli_opt opts[RUN_INPUT_OPTS + 4];
    int n = run_input_opts(a, opts);
    opts[n++] = (cli_opt){"--block-table", &a->block_table, NULL};
    opts[n++] = (cli_opt){"--out", &a->out, NULL};
    opts[n++] = (cli_opt){"--lse", &a->lse, NULL};
    opts[n++] = (cli_opt){"--weights", &a->weights, NULL};
    const int rc = cli_scan(argc, argv, opts, n, "run: ", "run");
    if (rc) return rc;
    if (run_require_inputs(a, "run")) return EXIT_USAGE;
    if (!a->out) return say(EXIT_USAGE, "run: missing required option --out (see 'attn run --help')");
    return 0;
}

/* The paths of a, by the rules of cli_files.h, before anything is read or written: the
 * inputs into in[], the outputs (--out first) into out[]. */
static int check_files(const run_args *a, cli_path *in, cli_path *out, int *n_out) {
    const char *ins[][2] = {{"--q", a->q},       {"--k", a->k},           {"--v", a->v},
                            {"--mask", a->mask}, {"--kv-len", a->kv_len}, {"--alibi", a->alibi},
                            {"--block-table", a->block_table}};
    const char *outs[][2] = {{"--out", a->out}, {"--lse", a->lse}, {"--weights", a->weights}};
    int n_in = 0;
    *n_out = 0;
    for (int i = 0; i < 7; i++)
        if (ins[i][1]) in[n_in++] = (cli_path){.opt = ins[i][0], .path = ins[i][1]};
    for (int i = 0; i < 3; i++)
        if (outs[i][1]) out[(*n_out)++] = (cli_path){.opt = outs[i][0], .path = outs[i][1]};
    char err[512];
    const int rc = cli_files_check(in, n_in, out, *n_out, err, sizeof err);
    if (rc) return say(rc == -2 ? EXIT_USAGE : EXIT_DATA, "%s", err);
    return 0;
}

/* Strict number parsing: the whole string, no leading space, finite. */
static bool parse_f32(const char *s, float *v) {
    if (!*s || isspace((unsigned char)*s)) return false;
    char *end;
    double d = strtod(s, &end);
    if (*end || !isfinite(d) || !isfinite((float)d)) return false;
    *v = (float)d;
    return true;
}

static bool parse_i64(const char *s, const char *stop, int64_t *v) {
    if (s == stop || isspace((unsigned char)*s)) return false;
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (end != stop || errno == ERANGE) return false;
    *v = x;
    return true;
}

static int options_from_args(const run_args *a, attn_options *opt) {
    opt->causal = a->causal;
    if (a->reference) opt->path = ATTN_PATH_REFERENCE;
    if (a->align) {
        if (strcmp(a->align, "top-left") == 0) opt->align = ATTN_ALIGN_TOP_LEFT;
        else if (strcmp(a->align, "bottom-right") == 0) opt->align = ATTN_ALIGN_BOTTOM_RIGHT;
        else return say(EXIT_USAGE, "--align: expected top-left or bottom-right, got '%s'", a->align);
    }
    if (a->scale) {
        if (!parse_f32(a->scale, &opt->scale))
            return say(EXIT_USAGE, "--scale: expected a finite number, got '%s'", a->scale);
        opt->has_scale = true;
    }
    if (a->softcap && (!parse_f32(a->softcap, &opt->softcap) || opt->softcap < 0))
        return say(EXIT_USAGE, "--softcap: expected a finite number >= 0, got '%s'", a->softcap);
    if (a->window) {
        const char *comma = strchr(a->window, ',');
        if (!comma || !parse_i64(a->window, comma, &opt->window_left) ||
            !parse_i64(comma + 1, comma + 1 + strlen(comma + 1), &opt->window_right) ||
            opt->window_left < -1 || opt->window_right < -1)
            return say(EXIT_USAGE, "--window: expected LEFT,RIGHT integers >= -1, got '%s'", a->window);
        opt->has_window = true;
    }
    if (a->precision) {
        if (strcmp(a->precision, "default") == 0) opt->precision = ATTN_PRECISION_DEFAULT;
        else if (strcmp(a->precision, "fast") == 0) opt->precision = ATTN_PRECISION_FAST;
        else return say(EXIT_USAGE, "--precision: expected default or fast, got '%s'", a->precision);
    }
    if (a->dtype && strcmp(a->dtype, "f32") != 0 && strcmp(a->dtype, "f16") != 0 &&
        strcmp(a->dtype, "bf16") != 0 && strcmp(a->dtype, "f64") != 0)
        return say(EXIT_USAGE, "--dtype: expected f32, f16, bf16 or f64, got '%s'", a->dtype);
    if (a->threads) {
        int64_t n;
        if (!parse_i64(a->threads, a->threads + strlen(a->threads), &n) || n < 0 || n > INT32_MAX)
            return say(EXIT_USAGE, "--threads: expected an integer >= 0, got '%s'", a->threads);
        opt->threads = (int32_t)n;
    }
    return 0;
}

int cli_run_parse(int argc, char **argv, run_args *a, attn_options *opt) {
    *a = (run_args){0};
    *opt = (attn_options){0};
    const int rc = parse_args(argc, argv, a);
    return rc ? rc : options_from_args(a, opt);
}

/* ---- inputs ------------------------------------------------------------------------- */

/* "[1,2,4,16]" */
static const char *shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t at = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && at < n; d++)
        at += (size_t)snprintf(buf + at, n - at, d ? ",%lld" : "%lld", (long long)shape[d]);
    if (at < n) snprintf(buf + at, n - at, "]");
    return buf;
}

static int load(const char *path, npy_array *a) {
    char err[256];
    if (npy_read(path, a, err, sizeof err)) return say(EXIT_DATA, "%s: %s", path, err);
    return 0;
}

/* Q, K or V: float32, float16 or float64, rank 4. */
static int check_qkv(const char *path, const npy_array *a) {
    char s[200];
    if (a->dtype != ATTN_F32 && a->dtype != ATTN_F16 && a->dtype != ATTN_F64)
        return say(EXIT_DATA, "%s: dtype %s, expected float32, float16 or float64", path,
                   attn_dtype_name(a->dtype));
    if (a->ndim != 4)
        return say(EXIT_DATA, "%s: shape %s has rank %d, expected rank 4 [B, H, L, D]", path,
                   shape_str(s, sizeof s, a->ndim, a->shape), a->ndim);
    return 0;
}

/* x's dimension d must equal ref's. */
static int same_dim(const char *xp, const npy_array *x, const char *rp, const npy_array *ref,
                    int d, const char *what) {
    if (x->shape[d] == ref->shape[d]) return 0;
    char s1[200], s2[200];
    return say(EXIT_DATA, "%s: shape %s does not match %s %s in dimension %d (%s)", xp,
               shape_str(s1, sizeof s1, 4, x->shape), rp, shape_str(s2, sizeof s2, 4, ref->shape),
               d, what);
}

/* A rank-1 array of n elements of one of the given dtypes. */
static int check_vector(const char *path, const npy_array *a, attn_dtype t1, attn_dtype t2,
                        const char *dtypes, int64_t n, const char *nname) {
    char s[200];
    if (a->dtype != t1 && a->dtype != t2)
        return say(EXIT_DATA, "%s: dtype %s, expected %s", path, attn_dtype_name(a->dtype), dtypes);
    if (a->ndim != 1 || a->shape[0] != n)
        return say(EXIT_DATA, "%s: shape %s, expected [%s] = [%lld]", path,
                   shape_str(s, sizeof s, a->ndim, a->shape), nname, (long long)n);
    return 0;
}

/* ---- outputs ------------------------------------------------------------------------ */

typedef struct out_file {
    const char *path;
    int ndim;
    int64_t shape[4];
    int64_t count;
    attn_dtype dtype;  // what the library writes: float32, float16 or bfloat16
    float *data;       // room for count float32 values, whatever dtype (float64 ones for float64)
} out_file;

/* room for count values of elem bytes (4, or 8 for a float64 output) */
static int alloc_out(out_file *f, const char *path, int ndim, const int64_t *shape, size_t elem) {
    int64_t n = 1, extent = 1;  // extent: the sizes other than 0, as NumPy multiplies them
    f->path = path;
    f->ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        f->shape[d] = shape[d];
        if (shape[d] != 0 && (n > INT64_MAX / shape[d] || extent > INT64_MAX / shape[d]))
            return say(EXIT_DATA, "%s: output size overflows 64 bits", path);
        n *= shape[d];
        if (shape[d] != 0) extent *= shape[d];
    }
    f->count = n;
    if ((uint64_t)n > SIZE_MAX / elem - 1 || !(f->data = calloc((size_t)n + 1, elem)))
        return say(EXIT_DATA, "%s: out of memory (%lld floats)", path, (long long)n);
    return 0;
}

/* A dense float32 output. Strides are taken over max(size, 1), so that an empty tensor
 * (some size 0) still has no stride 0 on a longer dimension: it looks like no overlap. */
static attn_tensor out_tensor(const out_file *f, int ndim) {
    attn_tensor t = {f->data, f->dtype, {1, 1, 1, 1}, {1, 1, 1, 1}};
    int64_t stride = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        t.shape[d] = f->shape[d];
        t.stride[d] = stride;
        stride *= f->shape[d] > 1 ? f->shape[d] : 1;
    }
    return t;
}

/* All or nothing: every output into a temporary file beside its target, then all renamed
 * over their targets; on a failure the temporary files are removed and no file changed. */
static int write_outputs(out_file *outs, cli_path *paths, int n) {
    char err[512];
    for (int i = 0; i < n; i++) {
        /* NumPy has no bfloat16: a bfloat16 result is written as the float32 values it
         * holds exactly (widened in place from the end) */
        if (outs[i].dtype == ATTN_BF16) {
            for (int64_t e = outs[i].count - 1; e >= 0; e--)
                outs[i].data[e] = attn_bf16_to_f32(((const uint16_t *)outs[i].data)[e]);
            outs[i].dtype = ATTN_F32;
        }
        if (cli_files_write(&paths[i], outs[i].dtype, outs[i].ndim, outs[i].shape, outs[i].data,
                            err, sizeof err))
            return say(EXIT_DATA, "%s: %s", outs[i].path, err);
    }
    if (cli_files_commit(paths, n, err, sizeof err)) return say(EXIT_DATA, "%s", err);
    return 0;
}

/* Q, K or V converted to dtype (round to nearest even), in a new buffer. */
static int convert_to(const char *path, npy_array *a, attn_dtype dtype) {
    if (a->dtype == dtype) return 0;
    void *buf = malloc((size_t)(a->count > 0 ? a->count : 1) * attn_dtype_size(dtype));
    if (!buf) return say(EXIT_DATA, "%s: out of memory converting to %s", path, attn_dtype_name(dtype));
    for (int64_t e = 0; e < a->count; e++)
        attn_store_f64(dtype, buf, e, attn_load_f64(a->dtype, a->data, e));
    free(a->data);
    a->data = buf;
    a->dtype = dtype;
    return 0;
}

/* ---- a paged cache (--block-table) ----------------------------------------------------- */

/* The table: int32 [B, max_pages] (B of Q), K's page size not 0; *Lk = max_pages *
 * page_size, the logical keys. in->bt owns the data opt->block_table points into. */
static int load_block_table(const run_args *a, run_inputs *in, int64_t *Lk) {
    npy_array *bt = &in->bt;
    char s1[200], s2[200];
    int rc;
    if ((rc = load(a->block_table, bt))) return rc;
    if (bt->dtype != ATTN_I32)
        return say(EXIT_DATA, "%s: dtype %s, expected int32", a->block_table,
                   attn_dtype_name(bt->dtype));
    if (bt->ndim != 2 || bt->shape[0] != in->B)
        return say(EXIT_DATA, "%s: shape %s, expected [B, max_pages] with B = %lld (%s is %s)",
                   a->block_table, shape_str(s1, sizeof s1, bt->ndim, bt->shape),
                   (long long)in->B, a->q, shape_str(s2, sizeof s2, 4, in->q.shape));
    const int64_t page_size = in->k.shape[2];
    if (page_size == 0)
        return say(EXIT_DATA, "%s: shape %s: a page size (dimension 2) of 0 with %s",
                   a->k, shape_str(s1, sizeof s1, 4, in->k.shape), a->block_table);
    if (bt->shape[1] > INT64_MAX / page_size)
        return say(EXIT_DATA, "%s: max_pages * page_size overflows 64 bits", a->block_table);
    *Lk = in->Lk = bt->shape[1] * page_size;
    in->tbt = attn_tensor_4d(bt->data, ATTN_I32, in->B, bt->shape[1], 1, 1);
    in->opt.block_table = &in->tbt;
    return 0;
}

/* Every entry of a page that holds valid keys (the first ceil(kv_len[b] / page_size), all
 * max_pages without --kv-len) names a page of the pools; the others are never read. */
static int check_block_table(const run_args *a, const run_inputs *in) {
    const npy_array *bt = &in->bt, *kvl = &in->kvl;
    const int64_t num_pages = in->k.shape[0], page_size = in->k.shape[2];
    const int64_t max_pages = bt->shape[1];
    for (int64_t b = 0; b < in->B; b++) {
        int64_t len = in->Lk;
        if (a->kv_len)
            len = kvl->dtype == ATTN_I32 ? ((const int32_t *)kvl->data)[b]
                                         : ((const int64_t *)kvl->data)[b];
        const int64_t used = len / page_size + (len % page_size != 0);
        for (int64_t p = 0; p < used && p < max_pages; p++) {
            const int32_t e = ((const int32_t *)bt->data)[b * max_pages + p];
            if (e < 0 || e >= num_pages)
                return say(EXIT_DATA, "%s: element [%lld][%lld] is %d, expected a page 0 <= page "
                           "< num_pages = %lld (%s's dimension 0)%s", a->block_table,
                           (long long)b, (long long)p, (int)e, (long long)num_pages, a->k,
                           a->kv_len ? "" : "; without --kv-len every page is read");
        }
    }
    return 0;
}

/* ---- the inputs of a call, shared with `attn viz` ------------------------------------ */

void run_inputs_free(run_inputs *in) {
    npy_free(&in->q);
    npy_free(&in->k);
    npy_free(&in->v);
    npy_free(&in->mask);
    npy_free(&in->kvl);
    npy_free(&in->alibi);
    npy_free(&in->bt);
}

/* Q, K and V loaded and checked, their shapes into in (Lk from the block table when paged). */
static int load_qkv(const run_args *a, run_inputs *in) {
    int rc;
    npy_array *q = &in->q, *k = &in->k, *v = &in->v;
    if ((rc = load(a->q, q)) || (rc = check_qkv(a->q, q)) || (rc = load(a->k, k)) ||
        (rc = check_qkv(a->k, k)) || (rc = load(a->v, v)) || (rc = check_qkv(a->v, v)))
        return rc;
    /* q [B, Hq, Lq, Dk]   k [B, Hkv, Lk, Dk]   v [B, Hkv, Lk, Dv], or paged
     * k [num_pages, Hkv, page_size, Dk]   v [num_pages, Hkv, page_size, Dv] */
    const bool paged = a->block_table != NULL;
    in->B = q->shape[0];
    const int64_t Hq = in->Hq = q->shape[1];
    in->Lq = q->shape[2];
    in->Dk = q->shape[3];
    const int64_t Hkv = in->Hkv = k->shape[1];
    in->Dv = v->shape[3];
    int64_t Lk = in->Lk = k->shape[2];
    if ((!paged && (rc = same_dim(a->k, k, a->q, q, 0, "B"))) ||
        (rc = same_dim(a->k, k, a->q, q, 3, "Dk")) ||
        (rc = same_dim(a->v, v, a->k, k, 0, paged ? "num_pages" : "B")) ||
        (rc = same_dim(a->v, v, a->k, k, 1, "Hkv")) ||
        (rc = same_dim(a->v, v, a->k, k, 2, paged ? "page_size" : "Lk")))
        return rc;
    if (paged && (rc = load_block_table(a, in, &Lk))) return rc;
    if (Hkv == 0 ? Hq != 0 : Hq % Hkv != 0)
        return say(EXIT_DATA, "%s: its %lld heads do not divide the %lld query heads of %s", a->k,
                   (long long)Hkv, (long long)Hq, a->q);
    return 0;
}

/* The dtypes: --dtype converts all three; otherwise each keeps its file's type, K and V
 * alike, and O is float16 only when all three are. */
static int qkv_dtypes(const run_args *a, run_inputs *in) {
    int rc;
    npy_array *q = &in->q, *k = &in->k, *v = &in->v;
    in->o_dtype = q->dtype == ATTN_F16 && k->dtype == ATTN_F16 && v->dtype == ATTN_F16
                      ? ATTN_F16 : ATTN_F32;
    if (a->dtype) {
        const attn_dtype want = strcmp(a->dtype, "f16") == 0    ? ATTN_F16
                                : strcmp(a->dtype, "bf16") == 0 ? ATTN_BF16
                                : strcmp(a->dtype, "f64") == 0  ? ATTN_F64
                                                                : ATTN_F32;
        if ((rc = convert_to(a->q, q, want)) || (rc = convert_to(a->k, k, want)) ||
            (rc = convert_to(a->v, v, want)))
            return rc;
        in->o_dtype = want;
    } else if ((q->dtype == ATTN_F64) != (k->dtype == ATTN_F64) ||
               (q->dtype == ATTN_F64) != (v->dtype == ATTN_F64)) {
        const bool q64 = q->dtype == ATTN_F64;
        const bool k_odd = (k->dtype == ATTN_F64) != q64;
        const npy_array *odd = k_odd ? k : v;
        return say(EXIT_DATA, "%s: dtype %s but %s is %s: float64 needs Q, K and V all "
                   "float64 (or use --dtype)", k_odd ? a->k : a->v, attn_dtype_name(odd->dtype),
                   a->q, attn_dtype_name(q->dtype));
    } else if (k->dtype != v->dtype) {
        return say(EXIT_DATA, "%s: dtype %s, expected %s like %s (K and V share one dtype; "
                   "or use --dtype)", a->v, attn_dtype_name(v->dtype), attn_dtype_name(k->dtype), a->k);
    }
    if (q->dtype == ATTN_F64) in->o_dtype = ATTN_F64;
    return 0;
}

/* --mask: loaded, checked and set as the call's mask (bool) or bias (float32). */
static int load_mask(const run_args *a, run_inputs *in) {
    int rc;
    attn_options *opt = &in->opt;
    /* right-aligned to [B, Hq, Lq, Lk]; a size-1 dimension broadcasts through stride 0 */
    npy_array *mask = &in->mask;
    const int64_t full[4] = {in->B, in->Hq, in->Lq, in->Lk};
    char s1[200], s2[200];
    if ((rc = load(a->mask, mask))) return rc;
    if (mask->dtype != ATTN_BOOL && mask->dtype != ATTN_F32)
        return say(EXIT_DATA, "%s: dtype %s, expected bool or float32", a->mask,
                   attn_dtype_name(mask->dtype));
    if (mask->ndim > 4)
        return say(EXIT_DATA, "%s: shape %s has rank %d, expected at most 4 [B, Hq, Lq, Lk]",
                   a->mask, shape_str(s1, sizeof s1, mask->ndim, mask->shape), mask->ndim);
    in->tmask = (attn_tensor){mask->data, mask->dtype, {0}, {0}};
    int64_t stride = 1;
    for (int d = 3; d >= 0; d--) {
        int md = d - (4 - mask->ndim);  /* the mask's own dimension, < 0 if absent */
        int64_t m = md >= 0 ? mask->shape[md] : 1;
        if (m != full[d] && m != 1)
            return say(EXIT_DATA, "%s: shape %s does not broadcast to [B, Hq, Lq, Lk] = %s "
                       "(its dimension %d is %lld)", a->mask,
                       shape_str(s1, sizeof s1, mask->ndim, mask->shape),
                       shape_str(s2, sizeof s2, 4, full), md, (long long)m);
        in->tmask.shape[d] = full[d];
        in->tmask.stride[d] = m == 1 ? 0 : stride;
        stride *= m > 1 ? m : 1;
    }
    if (mask->dtype == ATTN_BOOL) opt->mask = &in->tmask;
    else opt->bias = &in->tmask;
    /* seed 003's pitfall: 0 where -inf was meant. A float mask of only 0s and 1s is
     * almost always a bool mask saved as float: added to the logits, it masks nothing */
    bool zero_one = mask->dtype == ATTN_F32 && mask->count > 0;
    for (int64_t e = 0; zero_one && e < mask->count; e++)
        zero_one = ((const float *)mask->data)[e] == 0.0f || ((const float *)mask->data)[e] == 1.0f;
    if (zero_one)
        fprintf(stderr, "attn: warning: %s: a float32 mask of only 0s and 1s is added to the "
                "logits and masks nothing; for a mask save it as bool (true = attend) or "
                "use -inf for the masked keys\n", a->mask);
    return 0;
}

/* --kv-len: loaded, each length checked against Lk, set as the call's kv_len. */
static int load_kv_len(const run_args *a, run_inputs *in) {
    int rc;
    const int64_t B = in->B, Lk = in->Lk;
    npy_array *kvl = &in->kvl;
    if ((rc = load(a->kv_len, kvl)) ||
        (rc = check_vector(a->kv_len, kvl, ATTN_I32, ATTN_I64, "int32 or int64", B, "B")))
        return rc;
    for (int64_t b = 0; b < B; b++) {
        int64_t len = kvl->dtype == ATTN_I32 ? ((int32_t *)kvl->data)[b] : ((int64_t *)kvl->data)[b];
        if (len < 0 || len > Lk)
            return say(EXIT_DATA, "%s: element %lld is %lld, expected 0 <= length <= Lk = %lld",
                       a->kv_len, (long long)b, (long long)len, (long long)Lk);
    }
    in->tkvl = attn_tensor_4d(kvl->data, kvl->dtype, B, 1, 1, 1);
    in->opt.kv_len = &in->tkvl;
    return 0;
}

/* --alibi: loaded, checked, set as the call's slopes. */
static int load_alibi(const run_args *a, run_inputs *in) {
    int rc;
    if ((rc = load(a->alibi, &in->alibi)) ||
        (rc = check_vector(a->alibi, &in->alibi, ATTN_F32, ATTN_F32, "float32", in->Hq, "Hq")))
        return rc;
    in->talibi = attn_tensor_4d(in->alibi.data, ATTN_F32, in->Hq, 1, 1, 1);
    in->opt.alibi_slopes = &in->talibi;
    return 0;
}

int run_load_inputs(const run_args *a, run_inputs *in) {
    int rc;
    in->opt = (attn_options){0};
    if ((rc = options_from_args(a, &in->opt)) || (rc = load_qkv(a, in)) || (rc = qkv_dtypes(a, in)))
        return rc;
    const npy_array *q = &in->q, *k = &in->k, *v = &in->v;
    in->tq = attn_tensor_4d(q->data, q->dtype, in->B, in->Hq, in->Lq, in->Dk);
    /* the pools as they are in the files (paged), or the contiguous cache */
    in->tk = attn_tensor_4d(k->data, k->dtype, k->shape[0], in->Hkv, k->shape[2], in->Dk);
    in->tv = attn_tensor_4d(v->data, v->dtype, v->shape[0], in->Hkv, v->shape[2], in->Dv);
    if ((a->mask && (rc = load_mask(a, in))) || (a->kv_len && (rc = load_kv_len(a, in))) ||
        (a->block_table && (rc = check_block_table(a, in))) || (a->alibi && (rc = load_alibi(a, in))))
        return rc;
    return 0;
}

int run_library_error(attn_status st) {
    const char *detail = attn_last_error();
    return *detail ? say(EXIT_DATA, "%s (%s)", detail, attn_status_string(st))
                   : say(EXIT_DATA, "%s", attn_status_string(st));
}

/* ---- the command -------------------------------------------------------------------- */

bool run_help(int argc, char **argv, const char *usage) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(usage, stdout);
            return true;
        }
    return false;
}

int cli_run(int argc, char **argv) {
    if (run_help(argc, argv, RUN_USAGE)) return 0;
    run_args a = {0};
    cli_path in_paths[7], out_paths[3];
    int n_paths = 0;
    int rc = parse_args(argc, argv, &a);
    if (!rc) rc = check_files(&a, in_paths, out_paths, &n_paths);
    if (rc) {
        cli_files_abort(out_paths, n_paths);
        return rc;
    }

    run_inputs in = {0};
    out_file outs[3] = {{0}};
    int nouts = 0;
    attn_tensor to, tlse, tw;
    attn_options *opt = &in.opt;
    if ((rc = run_load_inputs(&a, &in))) goto done;
    const int64_t B = in.B, Hq = in.Hq, Lq = in.Lq, Lk = in.Lk, Dv = in.Dv;

    /* outputs: O [B, Hq, Lq, Dv], LSE [B, Hq, Lq], P [B, Hq, Lq, Lk] */
    /* a float64 call writes O and LSE in float64 */
    const bool f64 = in.o_dtype == ATTN_F64;
    const size_t o_elem = f64 ? sizeof(double) : sizeof(float);
    if ((rc = alloc_out(&outs[nouts++], a.out, 4, (int64_t[]){B, Hq, Lq, Dv}, o_elem))) goto done;
    outs[0].dtype = in.o_dtype;
    to = out_tensor(&outs[0], 4);
    if (a.lse) {
        if ((rc = alloc_out(&outs[nouts++], a.lse, 3, (int64_t[]){B, Hq, Lq}, o_elem))) goto done;
        if (f64) outs[nouts - 1].dtype = ATTN_F64;
        tlse = out_tensor(&outs[nouts - 1], 3);  /* [B, Hq, Lq, 1] */
        opt->lse = &tlse;
    }
    if (a.weights) {
        if ((rc = alloc_out(&outs[nouts++], a.weights, 4, (int64_t[]){B, Hq, Lq, Lk}, sizeof(float))))
            goto done;
        tw = out_tensor(&outs[nouts - 1], 4);
        opt->weights = &tw;
    }

    attn_status st = attn_forward(&in.tq, &in.tk, &in.tv, &to, opt);
    if (st != ATTN_OK) {
        rc = run_library_error(st);
        goto done;
    }
    rc = write_outputs(outs, out_paths, nouts);

done:
    cli_files_abort(out_paths, n_paths);
    run_inputs_free(&in);
    for (int i = 0; i < nouts; i++) free(outs[i].data);
    return rc;
}
