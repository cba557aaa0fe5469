/*
 * overlap.c — whether two strided views can share a byte, and the calls' rule built on
 *             it: no output may overlap an input, another output or the workspace.
 *
 * What it owns: the exact overlap test of two views and the lists of what each call
 * reads and writes. What it does not: an output overlapping itself (core.c,
 * ai_check_output_strides) or any other check of a tensor's soundness, which has run
 * before (sizes >= 0, offsets within int64).
 *
 * The test. A view is a set of elements, each es bytes at base + Σ i_d·s_d (bytes, i_d <
 * n_d). Negative strides are turned positive by moving the base to the lowest element;
 * dimensions of size 1 or stride 0 are dropped (they add no element). Two views are
 * disjoint when their byte extents [lowest, highest + es) are. Otherwise the one with
 * the larger extent is cut along its largest stride into sub-views, and only those whose
 * extent meets the other view's are tested again (found by division, not by trying each
 * one); when both views have the same sizes and strides (slices of one interleaved
 * buffer, such as a packed QKV tensor or its gradient) both are cut at once and a pair
 * of sub-views depends only on the difference of their indices. This decides every
 * layout exactly; the search is bounded (OVERLAP_STEPS), and a pair it has not decided
 * within the bound is taken as overlapping (refused: never a wrong answer accepted).
 */
#include <string.h>

#include "attn_internal.h"

enum { OVERLAP_STEPS = 1 << 20 };

typedef __int128 wide;  // byte addresses and offsets: base + Σ (n-1)·|s|·es can pass int64

typedef struct span_view {
    wide base;        // the lowest byte
    wide span;        // highest byte + 1 - base
    int n;            // dimensions kept, largest stride first
    int64_t len[4];
    wide st[4];       // > 0, bytes
} span_view;

/* the dtype list's bytes (attn_elem_bytes); 4 for a value outside it, as before */
static int64_t elem_bytes(attn_dtype t) {
    const int64_t b = attn_elem_bytes(t);
    return b > 0 ? b : 4;
}

/* false when t has no element (or no data: nothing to overlap) */
static bool make_span(const attn_tensor *t, span_view *v) {
    if (!t || !t->data) return false;
    for (int d = 0; d < 4; d++)
        if (t->shape[d] <= 0) return false;
    /* q8_0 (attn.h; its layout checked before): a row of D elements is D / 32 blocks of
     * 34 contiguous bytes, one "element" here, and the other strides, multiples of 32
     * elements, are 34 bytes each 32; q4_0 the same with 18, u4 with 16 */
    const bool q8 = attn_is_block_dtype(t->dtype);
    const int64_t bb = elem_bytes(t->dtype);  // a block dtype: its block's bytes
    const int64_t es = q8 ? t->shape[3] / 32 * bb : bb;
    *v = (span_view){.base = (wide)(uintptr_t)t->data, .span = es};
    for (int d = 0; d < (q8 ? 3 : 4); d++) {
        if (t->shape[d] == 1 || t->stride[d] == 0) continue;
        wide s = q8 ? (wide)(t->stride[d] / 32) * bb : (wide)t->stride[d] * es;
        if (s < 0) {
            v->base += s * (t->shape[d] - 1);
            s = -s;
        }
        int a = v->n++;
        for (; a > 0 && v->st[a - 1] < s; a--) {  // insertion, largest stride first
            v->st[a] = v->st[a - 1];
            v->len[a] = v->len[a - 1];
        }
        v->st[a] = s;
        v->len[a] = t->shape[d];
        v->span += s * (t->shape[d] - 1);
    }
    return true;
}

/* a byte range as a view of one "element" of n bytes */
static span_view byte_span(const void *p, size_t n) {
    return (span_view){.base = (wide)(uintptr_t)p, .span = (wide)n};
}

static wide floor_div(wide a, wide b) {  // b > 0
    wide q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

/* v without its first (largest-stride) dimension, at base + i·st[0] */
static span_view cut(const span_view *v, wide i) {
    span_view s = *v;
    s.base = v->base + i * v->st[0];
    s.span = v->span - v->st[0] * (v->len[0] - 1);
    s.n = v->n - 1;
    memmove(s.len, v->len + 1, sizeof s.len[0] * (size_t)s.n);
    memmove(s.st, v->st + 1, sizeof s.st[0] * (size_t)s.n);
    return s;
}

static bool same_layout(const span_view *a, const span_view *b) {
    if (a->n != b->n || a->span != b->span) return false;
    for (int d = 0; d < a->n; d++)
        if (a->len[d] != b->len[d] || a->st[d] != b->st[d]) return false;
    return true;
}

static bool overlap(const span_view *a, const span_view *b, int64_t *steps) {
    if (--*steps < 0) return true;  // undecided within the bound: refused
    if (a->base + a->span <= b->base || b->base + b->span <= a->base) return false;
    if (a->n == 0 && b->n == 0) return true;  // two byte ranges that meet
    if (a->n > 0 && same_layout(a, b)) {
        /* pairs (a_i, b_j) meet as (a_0, b_(j-i)) does: k = j - i with
         * -span' < d + k·s < span', |k| < len */
        const wide s = a->st[0], d = b->base - a->base;
        const span_view sa = cut(a, 0);
        wide k0 = floor_div(-sa.span - d, s) + 1, k1 = -floor_div(-(sa.span - d), s) - 1;
        if (k0 < -(wide)(a->len[0] - 1)) k0 = -(wide)(a->len[0] - 1);
        if (k1 > a->len[0] - 1) k1 = a->len[0] - 1;
        for (wide k = k0; k <= k1; k++) {
            span_view sb = sa;
            sb.base = a->base + d + k * s;
            if (overlap(&sa, &sb, steps)) return true;
        }
        return false;
    }
    /* cut the larger one, x, against y: x_i meets y when
     * y.base - span' < x.base + i·s < y.base + y.span */
    const bool cut_a = a->n > 0 && (b->n == 0 || a->span >= b->span);
    const span_view *x = cut_a ? a : b, *y = cut_a ? b : a;
    const wide s = x->st[0];
    const span_view sx = cut(x, 0);
    wide i0 = floor_div(y->base - sx.span - x->base, s) + 1;
    wide i1 = -floor_div(-(y->base + y->span - x->base), s) - 1;
    if (i0 < 0) i0 = 0;
    if (i1 > x->len[0] - 1) i1 = x->len[0] - 1;
    for (wide i = i0; i <= i1; i++) {
        span_view xi = sx;
        xi.base = x->base + i * s;
        if (overlap(&xi, y, steps)) return true;
    }
    return false;
}

bool ai_views_overlap(const attn_tensor *a, const attn_tensor *b) {
    span_view va, vb;
    if (!make_span(a, &va) || !make_span(b, &vb)) return false;
    int64_t steps = OVERLAP_STEPS;
    return overlap(&va, &vb, &steps);
}

/* Each output (the workspace last: the ws_need bytes of it the call uses, which it writes
 * too) against every input and every output before it. */
enum { MAX_VIEWS = 32 };
static attn_status check_outputs(const attn_tensor *const *in, const char *const *in_names,
                                 int n_in, const attn_tensor *const *out,
                                 const char *const *out_names, int n_out,
                                 const attn_options *opt, size_t ws_need) {
    span_view v[MAX_VIEWS];
    bool has[MAX_VIEWS];
    const char *names[MAX_VIEWS];
    const int n = n_in + n_out + 1;
    if (n > MAX_VIEWS)  // a call with more tensors than this needs MAX_VIEWS raised
        return ai_fail(ATTN_ERR_UNSUPPORTED, "overlap check: %d tensors, at most %d", n,
                       (int)MAX_VIEWS);
    for (int a = 0; a < n_in + n_out; a++) {
        has[a] = make_span(a < n_in ? in[a] : out[a - n_in], &v[a]);
        names[a] = a < n_in ? in_names[a] : out_names[a - n_in];
    }
    has[n - 1] = opt && opt->workspace && ws_need > 0;
    if (has[n - 1]) v[n - 1] = byte_span(opt->workspace, ws_need);
    names[n - 1] = "options.workspace";
    for (int a = n_in; a < n; a++) {
        if (!has[a]) continue;
        for (int b = 0; b < a; b++) {
            int64_t steps = OVERLAP_STEPS;
            if (has[b] && overlap(&v[a], &v[b], &steps))
                return ai_fail(ATTN_ERR_STRIDE, "%s: overlaps %s %s in memory (what a call "
                               "writes may share no byte with anything else it reads or "
                               "writes)", names[a], b < n_in ? "the input" : "the output",
                               names[b]);
        }
    }
    return ATTN_OK;
}

/* the entries of an array (the inputs and outputs below, each with its name) */
#define COUNT(a) ((int)(sizeof(a) / sizeof *(a)))

attn_status ai_check_forward_aliasing(const attn_tensor *q, const attn_tensor *k,
                                      const attn_tensor *v, const attn_tensor *o,
                                      const attn_options *opt, size_t ws_need) {
    static const char *const in_names[] = {"q", "k", "v", "mask", "bias", "kv_len",
                                           "alibi_slopes", "sinks", "block_table",
                                           "k_scale", "v_scale", "k_zero", "v_zero"};
    static const char *const out_names[] = {"o", "lse", "weights"};
    const attn_tensor *in[] = {q, k, v, opt ? opt->mask : NULL, opt ? opt->bias : NULL,
                               opt ? opt->kv_len : NULL, opt ? opt->alibi_slopes : NULL,
                               opt ? opt->sinks : NULL, opt ? opt->block_table : NULL,
                               opt ? opt->k_scale : NULL, opt ? opt->v_scale : NULL,
                               opt ? opt->k_zero : NULL, opt ? opt->v_zero : NULL};
    const attn_tensor *out[] = {o, opt ? opt->lse : NULL, opt ? opt->weights : NULL};
    return check_outputs(in, in_names, COUNT(in), out, out_names, COUNT(out), opt, ws_need);
}

attn_status ai_check_aliasing(const attn_tensor *const *in, const char *const *in_names,
                              int n_in, const attn_tensor *const *out,
                              const char *const *out_names, int n_out,
                              const attn_options *opt, size_t ws_need) {
    return check_outputs(in, in_names, n_in, out, out_names, n_out, opt, ws_need);
}
