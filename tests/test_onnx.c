/*
 * test_onnx.c — runs the ONNX `Attention` operator conformance cases (opsets 23-25, 87
 *               folders under ../shared/conformance/onnx_attention, or
 *               $ATTN_CONFORMANCE_DIR) through attn_forward and compares with ONNX's numbers.
 *
 * What it is: a harness that reads each case's manifest.json and .npy files, maps ONNX's
 * semantics onto attn_options (layouts as strided views, causal/window offsets as an
 * alignment, attn_mask as a bool mask or float bias, nonpad_kv_seqlen as kv_len,
 * qk_matmul_output_mode 3 as the weights output) and checks Y (and the mode-3
 * probabilities) on the fused and the reference path, with 1 and 2 threads, and that the
 * two thread counts give bit-identical results. ONNX's causal/window offset with a past
 * cache is past_seq, which is the library's bottom-right diagonal only when Sq == Skv;
 * for the other past cases the harness prepends past_seq dummy query rows and runs
 * top-left (see run_case).
 *
 * What it is not: a test of ONNX features the library does not have. The harness itself
 * builds present_key/present_value = concat(past, new, axis=2) (and checks them against
 * ONNX's), pads masks whose last dimension is shorter than the total key length, and
 * hands the float16 cases to the library as float16. qk_matmul_output of modes 0-2 (raw or masked logits)
 * are not library outputs and are counted, not compared. softmax_precision is ignored:
 * the library accumulates in float32 or better whatever ONNX asks for.
 *
 * The cases are read in place and never copied into the repository. Without the folder
 * (a clone outside the team has no ../shared) the suite is skipped and passes.
 * Usage: ./build/tests/test_onnx [-v]     (-v prints one line per case)
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "attn.h"
#include "check.h"
#include "core/half.h"
#include "json.h"
#include "npy.h"
#include "onnx_case.h"

#define PATH_LEN 4096

/* ================================================================================
 * float16
 * ================================================================================ */

/* IEEE binary16 bits -> float, exactly (every half is a float). */
static float half_to_float(uint16_t h) {
    int sign = h >> 15, exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
    float v;
    if (exp == 0)
        v = ldexpf((float)mant, -24); /* zero, subnormal */
    else if (exp == 31)
        v = mant ? NAN : INFINITY; /* NaN, infinity   */
    else
        v = ldexpf((float)(mant | 0x400), exp - 25); /* normal          */
    return sign ? -v : v;
}

/* Replaces a float16 array's data by its float32 widening (same shape). 0 on success. */
static int widen_to_f32(npy_array *a) {
    if (a->dtype != ATTN_F16) return 0;
    float *f = malloc((size_t)(a->count > 0 ? a->count : 1) * sizeof *f);
    if (!f) return -1;
    const uint16_t *h = a->data;
    for (int64_t i = 0; i < a->count; i++) f[i] = half_to_float(h[i]);
    free(a->data);
    a->data = f;
    a->dtype = ATTN_F32;
    return 0;
}

/* ================================================================================
 * One case
 * ================================================================================ */


/* A read-only 4-D float view: element (a,b,c,d) is p[a*st[0] + b*st[1] + c*st[2] + d*st[3]]. */
typedef struct fview {
    const float *p;
    int64_t st[4];
} fview;

static int64_t fv_off(const fview *v, int64_t a, int64_t b, int64_t c, int64_t d) {
    return a * v->st[0] + b * v->st[1] + c * v->st[2] + d * v->st[3];
}

/* Compares got with exp over the logical shape n[4]: |g - e| <= atol + rtol * |e| for
 * finite values; non-finite ones must match exactly (NaN where NaN, the same infinity).
 * On failure writes the worst element (the first non-finite mismatch, else the largest
 * excess over the tolerance) into msg. Returns 1 when all elements pass. */
static int compare_views(const char *what, const int64_t n[4], fview got, fview exp,
                         double atol, double rtol, char *msg, size_t msglen) {
    double worst_excess = -1;
    int64_t wi[4] = {-1, -1, -1, -1};
    double wg = 0, we = 0;
    int64_t bad = 0;
    bool nonfinite_bad = false;
    for (int64_t a = 0; a < n[0]; a++)
        for (int64_t b = 0; b < n[1]; b++)
            for (int64_t c = 0; c < n[2]; c++)
                for (int64_t d = 0; d < n[3]; d++) {
                    double g = got.p[fv_off(&got, a, b, c, d)];
                    double e = exp.p[fv_off(&exp, a, b, c, d)];
                    double excess;
                    if (!isfinite(e) || !isfinite(g)) {
                        bool same = (isnan(e) && isnan(g)) || g == e;
                        if (same) continue;
                        excess = INFINITY;
                    } else {
                        excess = fabs(g - e) - (atol + rtol * fabs(e));
                        if (excess <= 0) continue;
                    }
                    bad++;
                    if (nonfinite_bad || excess <= worst_excess) continue;
                    nonfinite_bad = isinf(excess);
                    worst_excess = excess;
                    wi[0] = a;
                    wi[1] = b;
                    wi[2] = c;
                    wi[3] = d;
                    wg = g;
                    we = e;
                }
    if (bad == 0) return 1;
    snprintf(msg, msglen,
             "%s: %lld element(s) out of tolerance (atol %g, rtol %g); worst at "
             "[%lld,%lld,%lld,%lld]"
             " (logical B,H,S,D order): expected %.9g, got %.9g",
             what, (long long)bad, atol, rtol, (long long)wi[0], (long long)wi[1],
             (long long)wi[2], (long long)wi[3], we, wg);
    return 0;
}

/* Everything one case owns; freed by case_free. */
typedef struct case_data {
    npy_array in[IN_COUNT], out[OUT_COUNT];
    float *present_k, *present_v; /* (B, Hkv, T, D) and (B, Hkv, T, Dv), harness concat  */
    float *q_shift;               /* (B, Hq, shift+Sq, D) when dummy rows are prepended   */
    void *mask_copy;              /* padded / shifted copy of attn_mask                   */
    float *o, *o_first;           /* (B, Hq, shift+Sq, Dv) or Y's 3-D layout              */
    float *w, *w_first;           /* (B, Hq, shift+Sq, T) when mode 3 is compared         */
} case_data;

static void case_free(case_data *cd) {
    for (int i = 0; i < IN_COUNT; i++) npy_free(&cd->in[i]);
    for (int i = 0; i < OUT_COUNT; i++) npy_free(&cd->out[i]);
    free(cd->present_k);
    free(cd->present_v);
    free(cd->q_shift);
    free(cd->mask_copy);
    free(cd->o);
    free(cd->o_first);
    free(cd->w);
    free(cd->w_first);
    memset(cd, 0, sizeof *cd);
}

static bool shape_is(const npy_array *a, int ndim, const int64_t *dims) {
    if (a->ndim != ndim) return false;
    for (int i = 0; i < ndim; i++)
        if (a->shape[i] != dims[i]) return false;
    return true;
}

static void shape_str(const npy_array *a, char *buf, size_t len) {
    size_t n = (size_t)snprintf(buf, len, "(");
    for (int i = 0; i < a->ndim && n < len; i++)
        n +=
            (size_t)snprintf(buf + n, len - n, "%s%lld", i ? ", " : "", (long long)a->shape[i]);
    if (n < len) snprintf(buf + n, len - n, ")");
}

/* Checks an input/output's shape: (B, S, H*X) in the 3-D layout, else (B, H, S, X). */
static int check_bhsx(const npy_array *a, const char *what, bool layout3d, int64_t B, int64_t H,
                      int64_t S, int64_t X, char *err, size_t errlen) {
    int64_t d3[3] = {B, S, H * X}, d4[4] = {B, H, S, X};
    if (layout3d ? shape_is(a, 3, d3) : shape_is(a, 4, d4)) return 0;
    char s[128];
    shape_str(a, s, sizeof s);
    if (layout3d)
        snprintf(err, errlen, "%s has shape %s, expected (%lld, %lld, %lld)", what, s,
                 (long long)B, (long long)S, (long long)(H * X));
    else
        snprintf(err, errlen, "%s has shape %s, expected (%lld, %lld, %lld, %lld)", what, s,
                 (long long)B, (long long)H, (long long)S, (long long)X);
    return -1;
}

/* The logical (B, H, S, X) view of a float tensor stored 3-D (B, S, H*X) or 4-D. */
static fview bhsx_view(const float *p, bool layout3d, int64_t H, int64_t S, int64_t X) {
    fview v = {p, {H * S * X, S * X, X, 1}};
    if (layout3d) {
        v.st[0] = S * H * X;
        v.st[1] = X;
        v.st[2] = H * X;
        v.st[3] = 1;
    }
    return v;
}

static attn_tensor view_tensor(const float *p, const int64_t shape[4], const int64_t st[4]) {
    attn_tensor t = {(void *)p,
                     ATTN_F32,
                     {shape[0], shape[1], shape[2], shape[3]},
                     {st[0], st[1], st[2], st[3]}};
    return t;
}

/* A dense float16 copy of a float32 view whose values are float16 (the widened inputs of a
 * float16 case): exact. NULL when out of memory; the caller frees *owned. */
static attn_tensor dense_f16(const attn_tensor *t, uint16_t **owned) {
    const int64_t *n = t->shape;
    attn_tensor d = attn_tensor_4d(NULL, ATTN_F16, n[0], n[1], n[2], n[3]);
    uint16_t *h = malloc((size_t)(n[0] * n[1] * n[2] * n[3] + 1) * sizeof(uint16_t));
    *owned = h;
    if (!h) return d;
    const float *f = t->data;
    int64_t e = 0;
    for (int64_t a = 0; a < n[0]; a++)
        for (int64_t b = 0; b < n[1]; b++)
            for (int64_t c = 0; c < n[2]; c++)
                for (int64_t x = 0; x < n[3]; x++)
                    h[e++] = attn_f32_to_f16(f[a * t->stride[0] + b * t->stride[1] +
                                               c * t->stride[2] + x * t->stride[3]]);
    d.data = h;
    return d;
}

/* present = concat(past, new, axis 2), dense (B, Hkv, T, X). new is a (B, Hkv, Skv, X)
 * logical view (3-D or 4-D storage); past is always 4-D (B, Hkv, past, X). */
static float *concat_present(const float *past, fview cur, int64_t B, int64_t H, int64_t P,
                             int64_t S, int64_t X) {
    int64_t T = P + S;
    float *pr = malloc((size_t)(B * H * T * X > 0 ? B * H * T * X : 1) * sizeof *pr);
    if (!pr) return NULL;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            float *dst_bh = pr + (b * H + h) * T * X;
            memcpy(dst_bh, past + (b * H + h) * P * X, (size_t)(P * X) * sizeof *pr);
            for (int64_t j = 0; j < S; j++)
                for (int64_t x = 0; x < X; x++)
                    dst_bh[(P + j) * X + x] = cur.p[fv_off(&cur, b, h, j, x)];
        }
    return pr;
}

/* Builds the attn_mask descriptor. ONNX broadcasts the mask right-aligned to
 * (B, Hq, Sq, T); missing or size-1 dimensions get stride 0. Two things need a copy:
 * a last dimension shorter than T (ONNX pads with False / -inf), and `shift` dummy query
 * rows in front (see run_case), which attend everything (their output is discarded).
 * The mask array has been widened to float32 already if it was float16. */
static int build_mask(const npy_array *m, const onnx_case *c, int64_t shift, case_data *cd,
                      attn_tensor *t, char *err, size_t errlen) {
    if (m->ndim < 1 || m->ndim > 4) {
        snprintf(err, errlen, "attn_mask of rank %d", m->ndim);
        return -1;
    }
    if (m->dtype != ATTN_BOOL && m->dtype != ATTN_F32) {
        snprintf(err, errlen, "attn_mask dtype is neither bool nor float");
        return -1;
    }
    int64_t md[4] = {1, 1, 1, 1};
    for (int i = 0; i < m->ndim; i++) md[4 - m->ndim + i] = m->shape[i];
    const int64_t full[4] = {c->B, c->Hq, c->Sq, c->T};
    for (int i = 0; i < 3; i++)
        if (md[i] != 1 && md[i] != full[i]) {
            snprintf(err, errlen, "attn_mask dim %d is %lld, broadcasts to neither 1 nor %lld",
                     i, (long long)md[i], (long long)full[i]);
            return -1;
        }
    if (md[3] < 1 || md[3] > c->T) {
        snprintf(err, errlen, "attn_mask last dim %lld vs total_seq %lld", (long long)md[3],
                 (long long)c->T);
        return -1;
    }
    int64_t st[4] = {md[1] * md[2] * md[3], md[2] * md[3], md[3], 1};
    bool copy = md[3] < c->T || (shift > 0 && md[2] > 1);
    if (!copy) {
        for (int i = 0; i < 4; i++)
            if (md[i] == 1) st[i] = 0;
        *t = (attn_tensor){
            m->data, m->dtype, {md[0], md[1], md[2], md[3]}, {st[0], st[1], st[2], st[3]}};
        return 0;
    }
    int64_t rows = md[2] > 1 ? shift + md[2] : 1;
    int64_t count = md[0] * md[1] * rows * c->T;
    size_t esz = m->dtype == ATTN_BOOL ? 1 : sizeof(float);
    cd->mask_copy = malloc((size_t)(count > 0 ? count : 1) * esz);
    if (!cd->mask_copy) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    uint8_t *mb = cd->mask_copy;
    float *mf = cd->mask_copy;
    const uint8_t *sb = m->data;
    const float *sf = m->data;
    int64_t k = 0;
    for (int64_t a = 0; a < md[0]; a++)
        for (int64_t h = 0; h < md[1]; h++)
            for (int64_t r = 0; r < rows; r++)
                for (int64_t j = 0; j < c->T; j++, k++) {
                    int64_t sr = md[2] > 1 ? r - shift : 0; /* source row */
                    int64_t src = a * st[0] + h * st[1] + sr * st[2] + j;
                    bool dummy = sr < 0, pad = j >= md[3];
                    if (m->dtype == ATTN_BOOL)
                        mb[k] = dummy ? 1 : pad ? 0 : sb[src];
                    else
                        mf[k] = dummy ? 0.0f : pad ? -INFINITY : sf[src];
                }
    *t = attn_tensor_4d(cd->mask_copy, m->dtype, md[0], md[1], rows, c->T);
    for (int i = 0; i < 3; i++)
        if (t->shape[i] == 1) t->stride[i] = 0;
    return 0;
}

/* Per-run bookkeeping shown at the end. */
typedef struct tally {
    int cases, cases_ok_path[2], fp16_cases, qk_skipped, softmax_precision, shifted;
    int harness_errors;
} tally;

static const attn_path paths[2] = {ATTN_PATH_FUSED, ATTN_PATH_REFERENCE};
static const char *const path_names[2] = {"fused", "reference"};

static int load_npy(const char *dir, const char *name, npy_array *a, char *err, size_t errlen) {
    char path[PATH_LEN], why[256];
    if (snprintf(path, sizeof path, "%s/%s.npy", dir, name) >= (int)sizeof path) {
        snprintf(err, errlen, "path too long");
        return -1;
    }
    if (npy_read(path, a, why, sizeof why) != 0) {
        snprintf(err, errlen, "%s.npy: %s", name, why);
        return -1;
    }
    if (widen_to_f32(a) != 0) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

/* Loads, maps and runs one case; every comparison is a CHECK. Returns -1 on a harness
 * error (reported through a failed CHECK as well). */
static int run_case(const char *dir, const char *name, tally *ty, bool verbose) {
    char err[512] = "";
    onnx_case c;
    memset(&c, 0, sizeof c);
    c.name = name;
    case_data cd;
    memset(&cd, 0, sizeof cd);
    int rc = -1;

    char path[PATH_LEN];
    if (snprintf(path, sizeof path, "%s/manifest.json", dir) >= (int)sizeof path) {
        snprintf(err, sizeof err, "path too long");
        goto harness_error;
    }
    jnode *man = json_read_file(path, err, sizeof err);
    if (!man) goto harness_error;
    int prc = parse_manifest(man, &c, err, sizeof err);
    json_free(man);
    if (prc != 0) goto harness_error;

    /* ---- inputs and expected outputs --------------------------------------------- */
    for (int i = 0; i < IN_COUNT; i++)
        if (c.has_in[i] && load_npy(dir, in_names[i], &cd.in[i], err, sizeof err) != 0)
            goto harness_error;
    for (int i = 0; i < OUT_COUNT; i++) {
        bool compared = i != OUT_QK || c.qk_mode == 3;
        if (c.has_out[i] && compared &&
            load_npy(dir, out_names[i], &cd.out[i], err, sizeof err) != 0)
            goto harness_error;
    }
    for (int i = 0; i < IN_COUNT; i++)
        if (c.has_in[i] && i != IN_MASK && i != IN_NONPAD && cd.in[i].dtype != ATTN_F32) {
            snprintf(err, sizeof err, "%s is neither float32 nor float16", in_names[i]);
            goto harness_error;
        }
    for (int i = 0; i < OUT_COUNT; i++)
        if (cd.out[i].dtype != ATTN_F32) { /* a zeroed (not loaded) array reads as F32 */
            snprintf(err, sizeof err, "%s is neither float32 nor float16", out_names[i]);
            goto harness_error;
        }
    if (check_bhsx(&cd.in[IN_Q], "Q", c.layout3d, c.B, c.Hq, c.Sq, c.D, err, sizeof err) ||
        check_bhsx(&cd.in[IN_K], "K", c.layout3d, c.B, c.Hkv, c.Skv, c.D, err, sizeof err) ||
        check_bhsx(&cd.in[IN_V], "V", c.layout3d, c.B, c.Hkv, c.Skv, c.Dv, err, sizeof err) ||
        check_bhsx(&cd.out[OUT_Y], "Y", c.layout3d, c.B, c.Hq, c.Sq, c.Dv, err, sizeof err))
        goto harness_error;
    if (c.has_in[IN_PAST_K] && (check_bhsx(&cd.in[IN_PAST_K], "past_key", false, c.B, c.Hkv,
                                           c.past, c.D, err, sizeof err) ||
                                check_bhsx(&cd.in[IN_PAST_V], "past_value", false, c.B, c.Hkv,
                                           c.past, c.Dv, err, sizeof err)))
        goto harness_error;
    if (c.has_out[OUT_QK] && c.qk_mode == 3 &&
        check_bhsx(&cd.out[OUT_QK], "qk_matmul_output", false, c.B, c.Hq, c.Sq, c.T, err,
                   sizeof err))
        goto harness_error;
    const npy_array *nonpad = c.has_in[IN_NONPAD] ? &cd.in[IN_NONPAD] : NULL;
    if (nonpad) {
        if ((nonpad->dtype != ATTN_I64 && nonpad->dtype != ATTN_I32) || nonpad->ndim != 1 ||
            nonpad->shape[0] != c.B) {
            snprintf(err, sizeof err,
                     "nonpad_kv_seqlen is not an int32/int64 vector of length B");
            goto harness_error;
        }
    }

    ty->fp16_cases += c.fp16;
    ty->softmax_precision += c.has_softmax_precision;
    if (c.has_out[OUT_QK] && c.qk_mode != 3) ty->qk_skipped++;

    /* ---- past/present: present = concat(past, new, axis=2), checked exactly ---------- */
    fview kview = bhsx_view(cd.in[IN_K].data, c.layout3d, c.Hkv, c.Skv, c.D);
    fview vview = bhsx_view(cd.in[IN_V].data, c.layout3d, c.Hkv, c.Skv, c.Dv);
    int64_t kshape[4] = {c.B, c.Hkv, c.Skv, c.D}, vshape[4] = {c.B, c.Hkv, c.Skv, c.Dv};
    if (c.has_in[IN_PAST_K]) {
        cd.present_k =
            concat_present(cd.in[IN_PAST_K].data, kview, c.B, c.Hkv, c.past, c.Skv, c.D);
        cd.present_v =
            concat_present(cd.in[IN_PAST_V].data, vview, c.B, c.Hkv, c.past, c.Skv, c.Dv);
        if (!cd.present_k || !cd.present_v) {
            snprintf(err, sizeof err, "out of memory");
            goto harness_error;
        }
        kview = (fview){cd.present_k, {c.Hkv * c.T * c.D, c.T * c.D, c.D, 1}};
        vview = (fview){cd.present_v, {c.Hkv * c.T * c.Dv, c.T * c.Dv, c.Dv, 1}};
        kshape[2] = vshape[2] = c.T;
        for (int i = OUT_PRESENT_K; i <= OUT_PRESENT_V; i++) {
            if (!c.has_out[i]) continue;
            bool is_k = i == OUT_PRESENT_K;
            const int64_t *sh = is_k ? kshape : vshape;
            if (!shape_is(&cd.out[i], 4, sh)) {
                snprintf(err, sizeof err, "%s.npy has an unexpected shape", out_names[i]);
                goto harness_error;
            }
            fview e = {cd.out[i].data, {sh[1] * sh[2] * sh[3], sh[2] * sh[3], sh[3], 1}};
            char msg[512];
            int ok =
                compare_views(out_names[i], sh, is_k ? kview : vview, e, 0, 0, msg, sizeof msg);
            CHECK(ok, "%s: harness concat(past, new): %s", name, msg);
        }
    }

    /* ---- the causal / window diagonal ------------------------------------------------
     * ONNX: query i attends key j <= i + offset (causal) and offset + i - left <= j <=
     * offset + i + right (window), where offset = past_seq with a past cache,
     * nonpad_kv_seqlen[b] - Sq with nonpad_kv_seqlen and no past, else 0.
     *   - offset 0: top-left (d_i = i).
     *   - nonpad, no past: bottom-right with kv_len = nonpad (d_i = i + Lk_b - Lq).
     *   - past: bottom-right gives d_i = i + T - Sq = i + past + (Skv - Sq), which is
     *     ONNX's i + past only when Skv == Sq. Otherwise the harness prepends `past` dummy
     *     query rows (zeros) and runs top-left: row past + i then has diagonal past + i,
     *     and the dummy rows' outputs are discarded. (The library has no "explicit
     *     offset" alignment; this keeps the causal/window masking in the library.) */
    bool structural = c.causal || c.has_window;
    attn_align align = ATTN_ALIGN_TOP_LEFT;
    int64_t shift = 0;
    if (structural) {
        if (c.has_in[IN_PAST_K]) {
            if (!nonpad && c.past > 0 && c.Skv == c.Sq)
                align = ATTN_ALIGN_BOTTOM_RIGHT;
            else
                shift = c.past;
        } else if (nonpad) {
            align = ATTN_ALIGN_BOTTOM_RIGHT;
        }
    }
    ty->shifted += shift > 0;
    int64_t Lq = shift + c.Sq;

    /* ---- attention inputs ------------------------------------------------------------ */
    fview qview = bhsx_view(cd.in[IN_Q].data, c.layout3d, c.Hq, c.Sq, c.D);
    int64_t qshape[4] = {c.B, c.Hq, c.Sq, c.D};
    if (shift > 0) {
        int64_t n = c.B * c.Hq * Lq * c.D;
        cd.q_shift = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
        if (!cd.q_shift) {
            snprintf(err, sizeof err, "out of memory");
            goto harness_error;
        }
        for (int64_t b = 0; b < c.B; b++)
            for (int64_t h = 0; h < c.Hq; h++)
                for (int64_t i = 0; i < c.Sq; i++)
                    for (int64_t x = 0; x < c.D; x++)
                        cd.q_shift[((b * c.Hq + h) * Lq + shift + i) * c.D + x] =
                            qview.p[fv_off(&qview, b, h, i, x)];
        qview = (fview){cd.q_shift, {c.Hq * Lq * c.D, Lq * c.D, c.D, 1}};
        qshape[2] = Lq;
    }
    attn_tensor q = view_tensor(qview.p, qshape, qview.st);
    attn_tensor k = view_tensor(kview.p, kshape, kview.st);
    attn_tensor v = view_tensor(vview.p, vshape, vview.st);
    /* float16 cases run as float16 inputs (dense copies; the float32 cases test the
     * strided views), with a float32 output compared at float16's tolerance */
    uint16_t *q16 = NULL, *k16 = NULL, *v16 = NULL;
    if (c.fp16) {
        q = dense_f16(&q, &q16);
        k = dense_f16(&k, &k16);
        v = dense_f16(&v, &v16);
        if (!q16 || !k16 || !v16) {
            free(q16), free(k16), free(v16);
            snprintf(err, sizeof err, "out of memory");
            goto harness_error;
        }
    }

    attn_tensor mask = {0}, kv_len = {0};
    bool has_mask = c.has_in[IN_MASK];
    if (has_mask && build_mask(&cd.in[IN_MASK], &c, shift, &cd, &mask, err, sizeof err) != 0)
        goto harness_error;
    if (nonpad) kv_len = attn_tensor_4d(nonpad->data, nonpad->dtype, c.B, 1, 1, 1);

    /* Y: written in place in ONNX's layout (3-D through strides, no copy) unless dummy rows
     * are prepended, then into a dense (B, Hq, shift+Sq, Dv) buffer. */
    int64_t on = c.B * c.Hq * Lq * c.Dv;
    cd.o = malloc((size_t)(on > 0 ? on : 1) * sizeof(float));
    cd.o_first = malloc((size_t)(on > 0 ? on : 1) * sizeof(float));
    fview oview = shift > 0 ? (fview){cd.o, {c.Hq * Lq * c.Dv, Lq * c.Dv, c.Dv, 1}}
                            : bhsx_view(cd.o, c.layout3d, c.Hq, c.Sq, c.Dv);
    int64_t oshape[4] = {c.B, c.Hq, Lq, c.Dv};
    bool want_w = c.has_out[OUT_QK] && c.qk_mode == 3;
    int64_t wn = c.B * c.Hq * Lq * c.T;
    if (want_w) {
        cd.w = malloc((size_t)(wn > 0 ? wn : 1) * sizeof(float));
        cd.w_first = malloc((size_t)(wn > 0 ? wn : 1) * sizeof(float));
    }
    if (!cd.o || !cd.o_first || (want_w && (!cd.w || !cd.w_first))) {
        snprintf(err, sizeof err, "out of memory");
        goto harness_error;
    }
    attn_tensor o = view_tensor(cd.o, oshape, oview.st);
    attn_tensor w = attn_tensor_4d(cd.w, ATTN_F32, c.B, c.Hq, Lq, c.T);

    /* What is compared: the last Sq rows of the outputs with ONNX's arrays. */
    const int64_t ydims[4] = {c.B, c.Hq, c.Sq, c.Dv}, wdims[4] = {c.B, c.Hq, c.Sq, c.T};
    fview ygot = {cd.o + shift * oview.st[2],
                  {oview.st[0], oview.st[1], oview.st[2], oview.st[3]}};
    fview yexp = bhsx_view(cd.out[OUT_Y].data, c.layout3d, c.Hq, c.Sq, c.Dv);
    fview wgot = {cd.w ? cd.w + shift * c.T : NULL, {c.Hq * Lq * c.T, Lq * c.T, c.T, 1}};
    fview wexp = {cd.out[OUT_QK].data, {c.Hq * c.Sq * c.T, c.Sq * c.T, c.T, 1}};
    /* float32: |got - exp| <= 1e-5 + 1e-5 |exp| (ONNX's own numbers are within 1.2e-7 of
     * a float64 recomputation). float16: atol 1e-3, since ONNX computed those in float16
     * (its numbers are up to 2.4e-4 off); the library gets float16 Q, K, V and writes a
     * float32 O (the Python suite runs them with a float16 O too). */
    double atol = c.fp16 ? 1e-3 : 1e-5, rtol = c.fp16 ? 0.0 : 1e-5;

    for (int pi = 0; pi < 2; pi++) {
        bool path_ok = true, have_first = false;
        for (int threads = 1; threads <= 2; threads++) {
            attn_options opt = {0};
            opt.has_scale = c.has_scale;
            opt.scale = (float)c.scale;
            opt.softcap = (float)c.softcap;
            opt.causal = c.causal;
            opt.align = align;
            opt.has_window = c.has_window;
            opt.window_left = c.window_left;
            opt.window_right = c.window_right;
            if (has_mask) {
                if (mask.dtype == ATTN_BOOL)
                    opt.mask = &mask;
                else
                    opt.bias = &mask;
            }
            if (nonpad) opt.kv_len = &kv_len;
            if (want_w) opt.weights = &w;
            opt.path = paths[pi];
            opt.threads = threads;

            /* NaN everywhere first, so that an element the library does not write fails. */
            for (int64_t i = 0; i < on; i++) cd.o[i] = NAN;
            for (int64_t i = 0; want_w && i < wn; i++) cd.w[i] = NAN;

            attn_status st = attn_forward(&q, &k, &v, &o, &opt);
            char msg[600] = "";
            int ok = st == ATTN_OK;
            if (!ok)
                snprintf(msg, sizeof msg, "attn_forward returned %s (%s)",
                         attn_status_string(st), attn_last_error());
            if (ok) ok = compare_views("Y", ydims, ygot, yexp, atol, rtol, msg, sizeof msg);
            if (ok && want_w)
                ok = compare_views("qk_matmul_output (mode 3, weights)", wdims, wgot, wexp,
                                   atol, rtol, msg, sizeof msg);
            CHECK(ok, "%s [%s path, %d thread%s]: %s", name, path_names[pi], threads,
                  threads > 1 ? "s" : "", msg);
            path_ok = path_ok && ok;
            if (!ok) continue;
            if (threads == 1) {
                memcpy(cd.o_first, cd.o, (size_t)on * sizeof(float));
                if (want_w) memcpy(cd.w_first, cd.w, (size_t)wn * sizeof(float));
                have_first = true;
            } else if (have_first) {
                bool same =
                    memcmp(cd.o_first, cd.o, (size_t)on * sizeof(float)) == 0 &&
                    (!want_w || memcmp(cd.w_first, cd.w, (size_t)wn * sizeof(float)) == 0);
                CHECK(same, "%s [%s path]: 1 and 2 threads are not bit-identical", name,
                      path_names[pi]);
                path_ok = path_ok && same;
            }
        }
        ty->cases_ok_path[pi] += path_ok;
        if (verbose)
            printf("  %-60s %-9s %s%s\n", name, path_names[pi], path_ok ? "ok" : "FAILED",
                   shift > 0 ? " (dummy-row shift)" : "");
    }
    free(q16), free(k16), free(v16);
    rc = 0;
    goto done;

harness_error:
    ty->harness_errors++;
    CHECK(0, "%s: harness could not map the case: %s", name, err);
done:
    case_free(&cd);
    return rc;
}

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv) {
    bool verbose = argc > 1 && strcmp(argv[1], "-v") == 0;
    const char *root = getenv("ATTN_CONFORMANCE_DIR");
    if (!root || !root[0]) root = "../shared/conformance/onnx_attention";

    DIR *d = opendir(root);
    if (!d) {
        printf("onnx: skipped: %s not found (a clone outside the team has no ../shared)\n",
               root);
        return check_summary("onnx");
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "test_attention_", 15) != 0) continue;
        char p[PATH_LEN];
        struct stat sb;
        if (snprintf(p, sizeof p, "%s/%s", root, e->d_name) >= (int)sizeof p) continue;
        if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) continue;
        if (n == cap) {
            size_t ncap = cap ? 2 * cap : 128;
            char **nn = realloc(names, ncap * sizeof *nn);
            if (!nn) break;
            names = nn;
            cap = ncap;
        }
        names[n] = malloc(strlen(e->d_name) + 1);
        if (!names[n]) break;
        strcpy(names[n++], e->d_name);
    }
    closedir(d);
    if (n > 0) qsort(names, n, sizeof *names, cmp_names);

    tally ty = {0};
    for (size_t i = 0; i < n; i++) {
        char dir[PATH_LEN];
        snprintf(dir, sizeof dir, "%s/%s", root, names[i]);
        run_case(dir, names[i], &ty, verbose);
        ty.cases++;
    }
    CHECK(n > 0, "no test_attention_* folders in %s", root);
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);

    printf("onnx: %d cases from %s; all comparisons passed on the fused path for %d, on the "
           "reference path for %d\n",
           ty.cases, root, ty.cases_ok_path[0], ty.cases_ok_path[1]);
    if (ty.harness_errors)
        printf("onnx: %d case(s) could not be mapped by the harness (see FAIL lines)\n",
               ty.harness_errors);
    printf("onnx: %d qk_matmul_output tensor(s) of modes 0-2 not compared: raw or masked "
           "logits are not an output of the library (mode 3, the probabilities, is compared)\n",
           ty.qk_skipped);
    printf("onnx: %d float16 case(s) run with float16 Q, K, V (float32 O) and compared with "
           "atol 1e-3\n",
           ty.fp16_cases);
    printf("onnx: softmax_precision set in %d case(s), ignored: the library accumulates in "
           "float32 or better\n",
           ty.softmax_precision);
    printf("onnx: %d case(s) with a past cache and Sq != Skv ran top-left with past_seq "
           "dummy query rows (ONNX's causal offset there is past_seq, not T - Sq)\n",
           ty.shifted);
    return check_summary("onnx");
}
