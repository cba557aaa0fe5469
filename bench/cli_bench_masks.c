/*
 * cli_bench_masks.c — `attn bench masks`: what a mask costs beside the same call with the
 *                     library's own structural options (kv_len, causal), on the shapes
 *                     models pass, and (--vs torch) what PyTorch's SDPA takes for the
 *                     same masks in the same run.
 *
 * Rows, each timed on the fused path (median of --reps calls after 2 warm-up rounds, the
 * rows of one shape called in turn, round after round, so that a shared machine's load
 * falls on them alike; the same inputs every call; min and max printed too) and checked
 * after the first warm-up round against its group's first row (kv_len, or kv_len +
 * causal) at the contract's float32 tolerance (that row itself is checked by the test
 * suites):
 *   - a sentence-embedding model's attention: q, k, v (24, 12, 199, 32) in [B, L, H, D]
 *     storage, 24 sentences of 3 .. 199 tokens, as kv_len, as a bool [B, 1, L, L] padding
 *     mask, a bool [B, 1, 1, L], a float 0 / -inf bias [B, 1, L, L] and [B, 1, 1, L];
 *   - the same shape as a causal decoder's padded batch: kv_len + causal, the bool and
 *     float [B, 1, L, L] masks that encode both, and the [B, 1, 1, L] ones with causal;
 *   - the detector's cost: the same shape with every key masked (bool and float,
 *     [B, 1, L, L] and [B, 1, 1, L]) beside kv_len = 0, so that a row is the mask's
 *     structure found (one pass over it) plus the store of O = 0, the base the store alone;
 *   - L = 2048, B = 2, H = 16, D = 64 with a random key length per batch, the same fifteen;
 *   - L = 2048, B = 1, H = 16 with a random (unstructured) bool mask of density 0.5, [1, 1, L, L],
 *     checked against the reference path on the first head's last 64 rows.
 * --quick runs the same groups on small shapes (for tests/test_bench.sh).
 * --vs torch: torch.nn.functional.scaled_dot_product_attention on the same inputs and
 * masks (bench/bench_masks_peer.c, scripts/bench_torch_masks.py), each round of attn's
 * calls followed by one of PyTorch's; PyTorch's outputs are first compared with attn's.
 * What it is not: the sweep of `attn bench` (no machine peak, no input rotation: each
 * row's inputs stay in whatever cache holds them).
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "bench_clock.h"
#include "bench_machine.h"
#include "bench_masks_peer.h"
#include "bench_peer.h"
#include "cli.h"
#include "cli_files.h"
#include "cliopt.h"
#include "json_out.h"
#include "rng.h"

static const char MASKS_USAGE[] =
    "usage: attn bench masks [--threads N] [--reps N] [--quick] [--plant-error]\n"
    "                        [--vs torch [--python PATH] [--torch-script PATH]]\n"
    "                        [--json-out FILE]\n"
    "\n"
    "  A padding mask (bool, float 0/-inf; [B,1,L,L] and [B,1,1,L]; with and without causal)\n"
    "  beside the same call with kv_len (and causal), on a sentence-embedding model's shape and\n"
    "  at L = 2048, and a random bool mask; masks of every key masked beside kv_len = 0 (what\n"
    "  finding the mask's structure costs); every row checked before it is timed.\n"
    "\n"
    "  --threads N         threads (default 2)\n"
    "  --reps N            timed calls per row (default 15, --quick 3; at most 5 at L = 2048)\n"
    "  --quick             the same rows on small shapes (for tests)\n"
    "  --plant-error       spoil one output element of every checked row before its check\n"
    "                      (and of PyTorch's outputs): the checks must then fail\n"
    "  --vs torch          also time PyTorch's scaled_dot_product_attention on the same\n"
    "                      inputs and masks, interleaved with attn's calls, after checking its\n"
    "                      outputs against attn's\n"
    "  --python PATH       the Python that has torch and numpy (default .venv-bench/bin/python)\n"
    "  --torch-script PATH the PyTorch side (default scripts/bench_torch_masks.py)\n"
    "  --json-out FILE     also write the rows as one JSON object to FILE\n"
    "\n"
    "  Exit status: 0 every check passed, 1 a check or a call failed or the PyTorch side\n"
    "  could not start (no torch in that Python: the reason is printed), 2 usage.\n";

/* PyTorch's float32 SDPA is not held to attn's contract: its outputs must agree with
 * attn's to this much, which any difference in the mask (an attended key more or less
 * moves an output by O(0.1) on these inputs) exceeds by orders of magnitude. */
#define TORCH_REL 1e-5
#define TORCH_ABS 1e-4

enum { MAX_ROWS = 6, MB_MAX_REPS = 1000, MAX_RECORDS = 48 };

typedef struct mb_shape {
    int64_t B, H, L, D;
    float *q, *k, *v;  // (B, L, H, D) storage
    int64_t *len;      // (B)
} mb_shape;

typedef struct mb_time {
    double med, lo, hi;  // ms
} mb_time;

/* One row of a group: an attn call and, where PyTorch has one, its counterpart. */
typedef struct mb_row {
    const char *what;
    attn_options opt;
    const attn_tensor *torch_mask;  // what SDPA gets as attn_mask (NULL: none)
    bool torch_causal;              // is_causal=True
    const char *no_torch;           // why PyTorch has no such call, or NULL
    float *out;                     // (B, H, L, D): attn's output
    double *ts, *tts;               // ms of the timed calls, attn's and torch's
    int nts, ntts;
} mb_row;

/* What a row found, for the table and the JSON. */
typedef struct mb_record {
    char group[48], what[40];
    int64_t B, H, L, D;
    mb_time t, tt;
    double base_ratio;       // this row's median / the group's first row's, < 0 = none
    const char *check;       // "base", "pass", "FAILED"
    double rel;
    const char *torch_check; // NULL (not run), "pass", "FAILED", "error"
    double trel;
    char torch_note[200];
} mb_record;

typedef struct mb_ctx {
    int threads, reps;
    bool plant, torch;
    mpeer peer;
    mb_record rec[MAX_RECORDS];
    int nrec;
} mb_ctx;

/* the project's one random stream (tools/common/rng.h), on a bare seed */
static uint64_t mb_rng(uint64_t *s) {
    rng_t r = {*s};
    const uint64_t x = rng_next(&r);
    *s = r.s;
    return x;
}

/* q, k, v in [B, L, H, D] storage as [B, H, L, D] views */
static attn_tensor blhd(float *x, const mb_shape *s) {
    return (attn_tensor){x, ATTN_F32, {s->B, s->H, s->L, s->D},
                         {s->L * s->H * s->D, s->D, s->H * s->D, 1}};
}

static mb_time summary(double *t, int n) {
    if (n == 0) return (mb_time){-1, -1, -1};
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return (mb_time){median(t, n), t[0], t[n - 1]};
}

/* n float32 values against ref: relative Frobenius error (into *rel) <= rel_tol and max
 * error <= abs_tol (1 + max|ref|); a NaN anywhere fails */
static bool close_f32(const float *got, const float *ref, int64_t n, double rel_tol,
                      double abs_tol, double *rel) {
    double num = 0, den = 0, max_err = 0, max_ref = 0;
    for (int64_t x = 0; x < n; x++) {
        const double d = fabs((double)got[x] - ref[x]);
        if (!(d == d)) return *rel = INFINITY, false;
        num += d * d, den += (double)ref[x] * ref[x];
        if (d > max_err) max_err = d;
        if (fabs(ref[x]) > max_ref) max_ref = fabs(ref[x]);
    }
    *rel = den > 0 ? sqrt(num / den) : sqrt(num);
    return *rel <= rel_tol && max_err <= abs_tol * (1 + max_ref);
}

static int alloc_shape(mb_shape *s, int64_t B, int64_t H, int64_t L, int64_t D, uint64_t seed) {
    *s = (mb_shape){.B = B, .H = H, .L = L, .D = D};
    const int64_t n = B * L * H * D;
    s->q = malloc((size_t)n * 4), s->k = malloc((size_t)n * 4), s->v = malloc((size_t)n * 4);
    s->len = malloc((size_t)B * sizeof(int64_t));
    if (!s->q || !s->k || !s->v || !s->len) return 1;
    for (int64_t x = 0; x < n; x++) {
        s->q[x] = (float)((mb_rng(&seed) >> 11) * 0x1.0p-53 * 2 - 1);
        s->k[x] = (float)((mb_rng(&seed) >> 11) * 0x1.0p-53 * 2 - 1);
        s->v[x] = (float)((mb_rng(&seed) >> 11) * 0x1.0p-53 * 2 - 1);
    }
    return 0;
}

static void free_shape(mb_shape *s) { free(s->q), free(s->k), free(s->v), free(s->len); }

/* The reference on rows L-64 .. L-1 of batch 0, head 0 under mask m ([1, 1, L, L]),
 * against the fused output o ((B, H, L, D)); false if it disagrees or cannot run. */
static bool check_last_rows(const mb_shape *s, const uint8_t *m, const float *out, int threads,
                            bool plant, double *rel) {
    const int64_t L = s->L, r0 = L - 64;
    attn_tensor q = blhd(s->q, s), k = blhd(s->k, s), v = blhd(s->v, s);
    q.shape[0] = k.shape[0] = v.shape[0] = 1, q.shape[1] = k.shape[1] = v.shape[1] = 1;
    q.data = s->q + r0 * q.stride[2], q.shape[2] = 64;
    float *o = malloc(64 * (size_t)s->D * 4), *got = malloc(64 * (size_t)s->D * 4);
    *rel = INFINITY;
    if (!o || !got) return free(o), free(got), false;
    attn_tensor ot = attn_tensor_4d(o, ATTN_F32, 1, 1, 64, s->D);
    attn_tensor msub = {(void *)(m + r0 * L), ATTN_BOOL, {1, 1, 64, L}, {0, 0, L, 1}};
    attn_options ro = {.threads = threads, .mask = &msub, .path = ATTN_PATH_REFERENCE};
    bool ok = attn_forward(&q, &k, &v, &ot, &ro) == ATTN_OK;
    memcpy(got, out + r0 * s->D, 64 * (size_t)s->D * 4);  // batch 0, head 0, rows r0 ..
    if (plant) got[7] += 1e-3f;
    ok = ok && close_f32(got, o, 64 * s->D, 1e-6, 1e-5, rel);
    free(o), free(got);
    return ok;
}

static void json_time(FILE *f, const char *key, mb_time t) {
    fprintf(f, ", \"%s_median_ms\": %.6g, \"%s_min_ms\": %.6g, \"%s_max_ms\": %.6g", key, t.med,
            key, t.lo, key, t.hi);
}

static void print_record(const mb_ctx *c, const mb_record *r) {
    char name[96];
    snprintf(name, sizeof name, "%s %s", r->group, r->what);
    printf("%-50s", name);
    if (r->t.med >= 0) printf(" %9.2f ms  (%8.2f .. %8.2f)", r->t.med, r->t.lo, r->t.hi);
    else printf(" %9s     %22s", "-", "");
    if (r->base_ratio > 0) printf("  %5.2fx base", r->base_ratio);
    else printf("  %11s", "");
    if (strcmp(r->check, "base") == 0) printf("  %-15s", "(base)");
    else printf("  %-6s rel %-5.2g", r->check, r->rel);
    if (c->torch) {
        if (r->tt.med > 0 && r->t.med > 0)
            printf("  | torch %9.2f ms  (%8.2f .. %8.2f)  attn/torch %5.2f  %s rel %.2g", r->tt.med,
                   r->tt.lo, r->tt.hi, r->t.med / r->tt.med, r->torch_check, r->trel);
        else if (r->torch_check)
            printf("  | torch %s rel %.2g%s%s", r->torch_check, r->trel,
                   r->torch_note[0] ? ": " : "", r->torch_note);
        else
            printf("  | torch -  (%s)", r->torch_note);
    }
    printf("\n");
    fflush(stdout);
}

typedef struct json_job {
    const mb_ctx *c;
    const double *load0, *load1;
} json_job;

/* The --json-out file, printed to f (cli_files_save_text places it). */
static void print_json(FILE *f, const void *ctx) {
    const json_job *job = ctx;
    const mb_ctx *c = job->c;
    const double *load0 = job->load0, *load1 = job->load1;
    char cpu[128];
    machine_cpu_model(cpu, sizeof cpu);
    fprintf(f, "{\"bench\": \"masks\", \"version\": ");
    json_out_str(f, attn_version());
    fprintf(f, ", \"kernel\": ");
    json_out_str(f, attn_kernel_name());
    fprintf(f, ", \"cpu\": ");
    json_out_str(f, cpu);
    fprintf(f, ", \"threads\": %d, \"reps\": %d, \"plant_error\": %s", c->threads, c->reps,
            c->plant ? "true" : "false");
    fprintf(f, ", \"load_start\": [%.2f, %.2f, %.2f], \"load_end\": [%.2f, %.2f, %.2f]", load0[0],
            load0[1], load0[2], load1[0], load1[1], load1[2]);
    fprintf(f, ", \"torch\": ");
    if (c->torch) {
        fprintf(f, "{\"version\": ");
        json_out_str(f, c->peer.tp.version);
        fprintf(f, ", \"info\": ");
        json_out_str(f, c->peer.tp.info);
        fprintf(f, ", \"rel_tol\": %g, \"abs_tol\": %g, \"omp_wait_policy\": ", TORCH_REL,
                TORCH_ABS);
        json_out_str(f, getenv("OMP_WAIT_POLICY") ? getenv("OMP_WAIT_POLICY") : "");
        fprintf(f, "}");
    } else {
        fprintf(f, "null");
    }
    fprintf(f, ", \"rows\": [");
    for (int i = 0; i < c->nrec; i++) {
        const mb_record *r = &c->rec[i];
        fprintf(f, "%s\n  {\"group\": ", i ? "," : "");
        json_out_str(f, r->group);
        fprintf(f, ", \"what\": ");
        json_out_str(f, r->what);
        fprintf(f, ", \"B\": %lld, \"H\": %lld, \"L\": %lld, \"D\": %lld", (long long)r->B,
                (long long)r->H, (long long)r->L, (long long)r->D);
        if (r->t.med >= 0) json_time(f, "attn", r->t);
        if (r->base_ratio > 0) fprintf(f, ", \"ratio_vs_base\": %.6g", r->base_ratio);
        fprintf(f, ", \"check\": \"%s\"", r->check);
        if (strcmp(r->check, "base") != 0) fprintf(f, ", \"rel\": %.6g", isfinite(r->rel) ? r->rel : 1e308);
        if (r->torch_check) {
            fprintf(f, ", \"torch_check\": \"%s\", \"torch_rel\": %.6g", r->torch_check,
                    isfinite(r->trel) ? r->trel : 1e308);
            if (r->tt.med > 0) {
                json_time(f, "torch", r->tt);
                if (r->t.med > 0) fprintf(f, ", \"attn_over_torch\": %.6g", r->t.med / r->tt.med);
            }
        }
        if (r->torch_note[0]) {
            fprintf(f, ", \"torch_note\": ");
            json_out_str(f, r->torch_note);
        }
        fprintf(f, "}");
    }
    fprintf(f, "\n]}\n");
}

static int write_json(const mb_ctx *c, const char *path, const double load0[3],
                      const double load1[3]) {
    const json_job job = {c, load0, load1};
    char err[512];
    if (cli_files_save_text("--json-out", path, print_json, &job, err, sizeof err) == 0) return 0;
    fprintf(stderr, "attn: bench masks: %s\n", err);
    return 1;
}

/* Times the rows of one shape, round after round (attn's rows, then PyTorch's), checks
 * them after the first warm-up round and records them. Rows 1.. are checked against row 0
 * (its output is the base) unless last_rows_mask: then row 0 alone, against the reference
 * on its last 64 rows under that mask. Returns the number of failed checks or calls. */
static int run_group(mb_ctx *c, const char *group, const mb_shape *s, mb_row *rows, int n,
                     int reps, const uint8_t *last_rows_mask) {
    const int64_t no = s->B * s->H * s->L * s->D;
    attn_tensor q = blhd(s->q, s), k = blhd(s->k, s), v = blhd(s->v, s);
    float *tout[MAX_ROWS] = {0};
    int tmap[MAX_ROWS], nt = 0;  // the PyTorch variants: rows tmap[0..nt)
    int bad = 0;
    char terr[200] = "";
    for (int x = 0; x < n; x++) {
        rows[x].out = malloc((size_t)no * 4);
        rows[x].ts = malloc(MB_MAX_REPS * sizeof(double));
        rows[x].tts = malloc(MB_MAX_REPS * sizeof(double));
        rows[x].nts = rows[x].ntts = 0;
        if (!rows[x].out || !rows[x].ts || !rows[x].tts) bad = 1;
        if (c->torch && !rows[x].no_torch) tmap[nt++] = x;
    }
    if (bad) {
        fprintf(stderr, "attn: bench masks: out of memory\n");
        goto done;
    }
    if (nt) {
        const attn_tensor *masks[MAX_ROWS];
        bool causal[MAX_ROWS];
        for (int i = 0; i < nt; i++) masks[i] = rows[tmap[i]].torch_mask, causal[i] = rows[tmap[i]].torch_causal;
        if (mpeer_load(&c->peer, s->q, s->k, s->v, s->B, s->L, s->H, s->D, nt, masks, causal, terr,
                       sizeof terr))
            nt = 0;
    }
    bool checked[MAX_ROWS] = {0}, tok[MAX_ROWS] = {0};
    double rel[MAX_ROWS] = {0}, trel[MAX_ROWS];
    for (int x = 0; x < n; x++) trel[x] = NAN;
    for (int r = -2; r < reps && !bad; r++) {
        /* Beside PyTorch, each side's round opens with an untimed call of its first row:
         * the other side's calls left this one's threads asleep, and on a loaded machine
         * a woken thread waits for a core (whole scheduler ticks) before it runs. */
        if (c->torch) {
            attn_tensor o = attn_tensor_4d(rows[0].out, ATTN_F32, s->B, s->H, s->L, s->D);
            if (attn_forward(&q, &k, &v, &o, &rows[0].opt) != ATTN_OK) {
                fprintf(stderr, "attn: bench masks: %s %s: %s\n", group, rows[0].what,
                        attn_last_error());
                bad = 1;
                break;
            }
        }
        for (int x = 0; x < n; x++) {
            attn_tensor o = attn_tensor_4d(rows[x].out, ATTN_F32, s->B, s->H, s->L, s->D);
            const double t0 = omp_get_wtime();
            if (attn_forward(&q, &k, &v, &o, &rows[x].opt) != ATTN_OK) {
                fprintf(stderr, "attn: bench masks: %s %s: %s\n", group, rows[x].what,
                        attn_last_error());
                bad = 1;
                break;
            }
            if (r >= 0) rows[x].ts[rows[x].nts++] = (omp_get_wtime() - t0) * 1e3;
        }
        if (bad) break;
        if (r == -2) {  /* the checks, on the first warm-up round's outputs */
            for (int x = 0; x < n; x++) {
                if (last_rows_mask) {
                    checked[x] = check_last_rows(s, last_rows_mask, rows[x].out, c->threads,
                                                 c->plant, &rel[x]);
                } else if (x > 0) {
                    if (c->plant) rows[x].out[no / 2] += 1e-3f;
                    checked[x] = close_f32(rows[x].out, rows[0].out, no, 1e-6, 1e-5, &rel[x]);
                } else {
                    checked[x] = true;
                }
                bad += !checked[x];
            }
            if (nt) {
                bool mem = true;
                for (int i = 0; i < nt; i++) mem &= (tout[i] = malloc((size_t)no * 4)) != NULL;
                if (!mem) snprintf(terr, sizeof terr, "out of memory"), nt = 0;
                else if (mpeer_outputs(&c->peer, tout, terr, sizeof terr)) nt = 0;
                for (int i = 0; i < nt; i++) {
                    if (c->plant) tout[i][no / 3] += 1e-2f;
                    tok[tmap[i]] = close_f32(tout[i], rows[tmap[i]].out, no, TORCH_REL, TORCH_ABS,
                                             &trel[tmap[i]]);
                    if (!tok[tmap[i]]) bad++;
                }
                for (int i = 0; i < nt; i++) {
                    if (!tok[tmap[i]]) nt = 0;  // no times for an answer that is not attn's
                    free(tout[i]), tout[i] = NULL;
                }
                if (!nt && !terr[0]) snprintf(terr, sizeof terr, "not timed: its output disagrees");
            }
        }
        if (nt) {
            double tt[MAX_ROWS];
            if (mpeer_round(&c->peer, 1, tt, terr, sizeof terr)) nt = 0;
            for (int i = 0; i < nt && r >= 0; i++)
                rows[tmap[i]].tts[rows[tmap[i]].ntts++] = tt[i] * 1e3;
        }
    }
    if (c->torch && c->peer.nvar) {
        char e2[200];
        if (mpeer_unload(&c->peer, e2, sizeof e2) && !terr[0]) snprintf(terr, sizeof terr, "%s", e2);
    }
    mb_time base = {-1, -1, -1};
    for (int x = 0; x < n && c->nrec < MAX_RECORDS; x++) {
        mb_record *rec = &c->rec[c->nrec++];
        memset(rec, 0, sizeof *rec);
        snprintf(rec->group, sizeof rec->group, "%s", group);
        snprintf(rec->what, sizeof rec->what, "%s", rows[x].what);
        rec->B = s->B, rec->H = s->H, rec->L = s->L, rec->D = s->D;
        rec->t = summary(rows[x].ts, rows[x].nts);
        rec->tt = summary(rows[x].tts, rows[x].ntts);
        if (x == 0) base = rec->t;
        rec->base_ratio = x > 0 && !last_rows_mask && base.med > 0 && rec->t.med > 0
                              ? rec->t.med / base.med : -1;
        rec->check = x == 0 && !last_rows_mask ? "base" : checked[x] ? "pass" : "FAILED";
        rec->rel = rel[x];
        rec->trel = trel[x];
        if (c->torch && rows[x].no_torch) {
            snprintf(rec->torch_note, sizeof rec->torch_note, "%s", rows[x].no_torch);
        } else if (c->torch) {
            rec->torch_check = isnan(trel[x]) ? "error" : tok[x] ? "pass" : "FAILED";
            if (terr[0]) snprintf(rec->torch_note, sizeof rec->torch_note, "%s", terr);
        }
        print_record(c, rec);
    }
done:
    for (int x = 0; x < n; x++) free(rows[x].out), free(rows[x].ts), free(rows[x].tts);
    for (int i = 0; i < MAX_ROWS; i++) free(tout[i]);
    return bad;
}

static mb_row row_of(const char *what, attn_options opt, const attn_tensor *torch_mask,
                     const char *no_torch) {
    return (mb_row){.what = what, .opt = opt, .torch_mask = torch_mask, .no_torch = no_torch};
}

static const char *const NO_KV_LEN = "SDPA has no key lengths";
static const char *const NO_CAUSAL_MASK = "SDPA refuses is_causal with attn_mask";

/* What the mask's structure costs to find: masks that mask every key, so that the call is
 * the detector's pass over the mask (each row read, found a prefix of 0 open keys) and the
 * store of O = 0, beside kv_len = 0 (the store alone). A row's time less the base's is the
 * detector's cost for that mask; SDPA has no such call (a fully masked row is NaN there). */
static const char *const NO_ALL_MASKED = "SDPA gives NaN for a fully masked row";
static int detector_group(mb_ctx *c, const char *tag, const mb_shape *s, int reps) {
    const int64_t B = s->B, L = s->L;
    int64_t *zero = calloc((size_t)B, sizeof *zero);
    uint8_t *m = calloc((size_t)(B * L * L), 1);
    float *f = malloc((size_t)(B * L * L) * 4);
    if (!zero || !m || !f) {
        free(zero), free(m), free(f);
        return fprintf(stderr, "attn: bench masks: out of memory\n"), 1;
    }
    for (int64_t x = 0; x < B * L * L; x++) f[x] = -INFINITY;
    const attn_tensor kvl = {zero, ATTN_I64, {B, 1, 1, 1}, {1, 1, 1, 1}},
                      mfull = {m, ATTN_BOOL, {B, 1, L, L}, {L * L, 0, L, 1}},
                      mkeys = {m, ATTN_BOOL, {B, 1, 1, L}, {L * L, 0, 0, 1}},
                      ffull = {f, ATTN_F32, {B, 1, L, L}, {L * L, 0, L, 1}},
                      fkeys = {f, ATTN_F32, {B, 1, 1, L}, {L * L, 0, 0, 1}};
    const int t = c->threads;
    mb_row rows[5] = {
        row_of("kv_len 0 (O = 0 alone)", (attn_options){.threads = t, .kv_len = &kvl}, NULL,
               NO_KV_LEN),
        row_of("bool [B,1,L,L] all masked", (attn_options){.threads = t, .mask = &mfull}, NULL,
               NO_ALL_MASKED),
        row_of("bool [B,1,1,L] all masked", (attn_options){.threads = t, .mask = &mkeys}, NULL,
               NO_ALL_MASKED),
        row_of("float [B,1,L,L] all -inf", (attn_options){.threads = t, .bias = &ffull}, NULL,
               NO_ALL_MASKED),
        row_of("float [B,1,1,L] all -inf", (attn_options){.threads = t, .bias = &fkeys}, NULL,
               NO_ALL_MASKED),
    };
    char group[48];
    snprintf(group, sizeof group, "%s detector", tag);
    const int bad = run_group(c, group, s, rows, 5, reps, NULL);
    free(zero), free(m), free(f);
    return bad;
}

/* The padding of s->len, without and with causal, as kv_len and as each mask. */
static int padding_groups(mb_ctx *c, const char *tag, const mb_shape *s, int reps) {
    const int64_t B = s->B, L = s->L;
    attn_tensor kvl = {s->len, ATTN_I64, {B, 1, 1, 1}, {1, 1, 1, 1}};
    uint8_t *m = malloc((size_t)(B * L * L)), *mc = malloc((size_t)(B * L * L));
    float *f = malloc((size_t)(B * L * L) * 4), *fc = malloc((size_t)(B * L * L) * 4);
    if (!m || !mc || !f || !fc) {
        free(m), free(mc), free(f), free(fc);
        return fprintf(stderr, "attn: bench masks: out of memory\n"), 1;
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < L; i++)
            for (int64_t j = 0; j < L; j++) {
                const int64_t at = (b * L + i) * L + j;
                m[at] = j < s->len[b], mc[at] = j < s->len[b] && j <= i;
                f[at] = m[at] ? 0.0f : -INFINITY, fc[at] = mc[at] ? 0.0f : -INFINITY;
            }
    /* [B, 1, 1, L] is row 0 of the [B, 1, L, L] padding mask, seen with a query stride of 0 */
    const attn_tensor mfull = {m, ATTN_BOOL, {B, 1, L, L}, {L * L, 0, L, 1}},
                      mkeys = {m, ATTN_BOOL, {B, 1, 1, L}, {L * L, 0, 0, 1}},
                      ffull = {f, ATTN_F32, {B, 1, L, L}, {L * L, 0, L, 1}},
                      fkeys = {f, ATTN_F32, {B, 1, 1, L}, {L * L, 0, 0, 1}},
                      mcfull = {mc, ATTN_BOOL, {B, 1, L, L}, {L * L, 0, L, 1}},
                      fcfull = {fc, ATTN_F32, {B, 1, L, L}, {L * L, 0, L, 1}};
    const int t = c->threads;
    const mb_row pad[5] = {
        row_of("kv_len", (attn_options){.threads = t, .kv_len = &kvl}, NULL, NO_KV_LEN),
        row_of("bool [B,1,L,L]", (attn_options){.threads = t, .mask = &mfull}, &mfull, NULL),
        row_of("bool [B,1,1,L]", (attn_options){.threads = t, .mask = &mkeys}, &mkeys, NULL),
        row_of("float 0/-inf [B,1,L,L]", (attn_options){.threads = t, .bias = &ffull}, &ffull, NULL),
        row_of("float 0/-inf [B,1,1,L]", (attn_options){.threads = t, .bias = &fkeys}, &fkeys, NULL),
    };
    /* a causal decoder's padded batch: SDPA takes the [B, 1, L, L] mask encoding both */
    const mb_row cpad[5] = {
        row_of("kv_len+causal", (attn_options){.threads = t, .kv_len = &kvl, .causal = true}, NULL,
               NO_KV_LEN),
        row_of("bool [B,1,L,L] pad&causal", (attn_options){.threads = t, .mask = &mcfull}, &mcfull,
               NULL),
        row_of("bool [B,1,1,L]+causal", (attn_options){.threads = t, .mask = &mkeys, .causal = true},
               NULL, NO_CAUSAL_MASK),
        row_of("float [B,1,L,L] pad&causal", (attn_options){.threads = t, .bias = &fcfull}, &fcfull,
               NULL),
        row_of("float [B,1,1,L]+causal", (attn_options){.threads = t, .bias = &fkeys, .causal = true},
               NULL, NO_CAUSAL_MASK),
    };
    mb_row rows[5];
    char group[48];
    snprintf(group, sizeof group, "%s", tag);
    memcpy(rows, pad, sizeof rows);
    int bad = run_group(c, group, s, rows, 5, reps, NULL);
    snprintf(group, sizeof group, "%s causal", tag);
    memcpy(rows, cpad, sizeof rows);
    bad += run_group(c, group, s, rows, 5, reps, NULL);
    free(m), free(mc), free(f), free(fc);
    return bad + detector_group(c, tag, s, reps);
}

/* a random bool mask of density 0.5, checked on the reference's last 64 rows of head 0 */
static int random_group(mb_ctx *c, const char *tag, const mb_shape *s, int reps) {
    const int64_t L = s->L;
    uint8_t *m = malloc((size_t)(L * L));
    if (!m) return fprintf(stderr, "attn: bench masks: out of memory\n"), 1;
    uint64_t seed = 99;
    for (int64_t x = 0; x < L * L; x++) m[x] = mb_rng(&seed) >> 63;
    const attn_tensor mask = attn_tensor_4d(m, ATTN_BOOL, 1, 1, L, L);
    mb_row row[1] = {row_of("random bool [1,1,L,L] (0.5)",
                            (attn_options){.threads = c->threads, .mask = &mask}, &mask, NULL)};
    const int bad = run_group(c, tag, s, row, 1, reps, m);
    free(m);
    return bad;
}

int cli_bench_masks(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return fputs(MASKS_USAGE, stdout), 0;
    const char *threads_s = NULL, *reps_s = NULL, *vs = NULL, *python = NULL, *script = NULL,
               *json_out = NULL;
    bool quick = false, plant = false;
    const cli_opt opts[] = {
        {"--threads", &threads_s, NULL}, {"--reps", &reps_s, NULL},
        {"--quick", NULL, &quick},       {"--plant-error", NULL, &plant},
        {"--vs", &vs, NULL},             {"--python", &python, NULL},
        {"--torch-script", &script, NULL}, {"--json-out", &json_out, NULL},
    };
    const int rc = cli_scan(argc, argv, opts, (int)(sizeof opts / sizeof opts[0]),
                            "bench masks: ", "bench masks");
    if (rc) return rc;
    char ferr[512];  // refused now, not after the runs
    if (json_out && cli_files_check_one("--json-out", json_out, ferr, sizeof ferr))
        return fprintf(stderr, "attn: bench masks: %s\n", ferr), 1;
    static mb_ctx c;
    memset(&c, 0, sizeof c);
    char *end;
    c.threads = threads_s ? (int)strtol(threads_s, &end, 10) : 2;
    if (threads_s && *end) c.threads = 0;
    c.reps = reps_s ? (int)strtol(reps_s, &end, 10) : quick ? 3 : 15;
    if (reps_s && *end) c.reps = 0;
    if (c.threads < 1 || c.threads > 512 || c.reps < 1 || c.reps > MB_MAX_REPS) {
        fprintf(stderr, "attn: bench masks: --threads 1..512, --reps 1..%d\n", MB_MAX_REPS);
        return 2;
    }
    if (vs && strcmp(vs, "torch") != 0) {
        fprintf(stderr, "attn: bench masks: --vs: only 'torch' is implemented, got '%s'\n", vs);
        return 2;
    }
    if (!vs && (python || script)) {
        fprintf(stderr, "attn: bench masks: --python and --torch-script go with --vs torch\n");
        return 2;
    }
    c.plant = plant;
    c.torch = vs != NULL;
    if (c.torch) {
        char root[PATH_MAX], py[PATH_MAX + 64], sc[PATH_MAX + 64];
        source_root(root, sizeof root);
        snprintf(py, sizeof py, "%s", python ? python : "");
        if (!python) snprintf(py, sizeof py, "%s/.venv-bench/bin/python", root);
        snprintf(sc, sizeof sc, "%s", script ? script : "");
        if (!script) snprintf(sc, sizeof sc, "%s/scripts/bench_torch_masks.py", root);
        if (!python && !file_exists(py)) {
            fprintf(stderr, "attn: bench masks: --vs torch: %s not found: run 'attn bench "
                    "--setup-torch' first, or give --python\n", py);
            return 2;
        }
        if (!file_exists(sc)) {
            fprintf(stderr, "attn: bench masks: --vs torch: %s not found\n", sc);
            return 2;
        }
        mpeer_passive_threads();  /* returns where OMP_WAIT_POLICY is set */
        if (mpeer_start(&c.peer, py, sc, c.threads)) {
            mpeer_stop(&c.peer);
            return 1;
        }
    }
    double load0[3], load1[3];
    machine_loadavg(load0);
    printf("attn bench masks: kernel %s, %d threads, median of %d calls (at most 5 at L = %d)",
           attn_kernel_name(), c.threads, c.reps, quick ? 256 : 2048);
    if (c.torch)
        printf("; torch %s (%s); OMP_WAIT_POLICY=%s on both sides", c.peer.tp.version,
               c.peer.tp.info, getenv("OMP_WAIT_POLICY"));
    printf("\nload average %.2f %.2f %.2f; base = the group's first row; attn/torch = the "
           "medians' ratio (< 1: attn faster)\n", load0[0], load0[1], load0[2]);
    /* quick: the same groups on small shapes; the L = 2048 groups stay at 5 calls at most */
    const int64_t mB = quick ? 4 : 24, mH = quick ? 2 : 12, mL = quick ? 37 : 199,
                  mD = quick ? 16 : 32, bL = quick ? 256 : 2048, bH = quick ? 2 : 16,
                  bD = quick ? 32 : 64;
    const int big_reps = c.reps > 5 ? 5 : c.reps;
    char tag[48];
    int bad = 0;
    mb_shape s;
    if (alloc_shape(&s, mB, mH, mL, mD, 1)) goto oom;
    for (int64_t b = 0; b < mB; b++) s.len[b] = 3 + (mL - 3) * b / (mB - 1);  // 3 .. L tokens
    snprintf(tag, sizeof tag, "%s %lldx%lldx%lldx%lld", quick ? "small" : "minilm", (long long)mB,
             (long long)mH, (long long)mL, (long long)mD);
    bad += padding_groups(&c, tag, &s, c.reps);
    free_shape(&s);

    if (alloc_shape(&s, 2, bH, bL, bD, 2)) goto oom;
    uint64_t seed = 7;
    for (int64_t b = 0; b < 2; b++) s.len[b] = 1 + (int64_t)(mb_rng(&seed) % (uint64_t)bL);
    snprintf(tag, sizeof tag, "L%lld 2x%lld padding", (long long)bL, (long long)bH);
    bad += padding_groups(&c, tag, &s, big_reps);
    free_shape(&s);

    if (alloc_shape(&s, 1, bH, bL, bD, 3)) goto oom;
    snprintf(tag, sizeof tag, "L%lld 1x%lld", (long long)bL, (long long)bH);
    bad += random_group(&c, tag, &s, big_reps);
    free_shape(&s);

    machine_loadavg(load1);
    printf("load average at the end %.2f %.2f %.2f\n", load1[0], load1[1], load1[2]);
    if (c.torch) mpeer_stop(&c.peer);
    if (json_out && write_json(&c, json_out, load0, load1)) return 1;
    return bad ? 1 : 0;
oom:
    free_shape(&s);
    if (c.torch) mpeer_stop(&c.peer);
    return fprintf(stderr, "attn: bench masks: out of memory\n"), 1;
}
