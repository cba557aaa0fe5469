/*
 * mha.h — what the multi-head module's files share (mha.c, mha_backward.c,
 *         mha_decode.c, rope.c) and users never see: the checked plan of one call,
 *         the workspace carving, the operands as the BLAS door takes them, RoPE.
 *
 * What it is not: a second attention. The heads' attention is attn_forward /
 * attn_backward on strided views of the projections' output, and every matrix product
 * is ai_gemm_f32 (blas.h).
 *
 * Layout of the module's scratch (float32, dense): the projections are kept as
 * [B, L, H, D] — what x W gives row by row — and handed to the attention as views with
 * strides {L·H·D, D, H·D, 1}; nothing is split or transposed by a copy.
 */
#ifndef ATTN_MHA_H
#define ATTN_MHA_H

#include "core/attn_internal.h"
#include "core/blas.h"
#include "mha_ws.h"

/* The four projections' index in the plan's arrays */
enum { MHA_Q = 0, MHA_K, MHA_V, MHA_O, MHA_N };

/* A float32 operand as ai_gemm_f32 reads it: op(p) is [rows, cols], p is [cols, rows]
 * row-major with leading dimension ld when trans. A weight the BLAS cannot read in place
 * (bfloat16, or no unit stride) has src set: p is then a panel of MHA_PANEL of its rows,
 * widened to float32 just before each product that reads them (mha_gemm_w). */
typedef struct mha_op {
    const float *p;
    int64_t ld;
    bool trans;
    const attn_tensor *src;
    int64_t in, out;  /* a weight's logical [in, out] */
    int64_t panel;    /* floats at p when src is set */
} mha_op;

/* rows of a widened weight panel: 256 rows of 4096 floats are 4 MiB */
#define MHA_PANEL 256


/* Every call of the module runs its body twice: once counting (the workspace's size),
 * once over opt->workspace or a malloc of that size. bytes not NULL: the size query,
 * the first pass only. */
typedef attn_status (*mha_body)(const void *ctx, const attn_options *opt, mha_ws *w);

/* What a call reads and what it writes, for overlap.c's rule (ai_check_aliasing): no
 * output may share a byte with an input, another output or the workspace. Byte ranges
 * (the saved buffer, the decoding lengths) are held as one-dimensional tensors in
 * span[]; so an mha_io is filled in place and never copied. */
enum { MHA_IO_MAX = 20 };
typedef struct mha_io {
    int n_in, n_out, n_span;
    const attn_tensor *in[MHA_IO_MAX], *out[MHA_IO_MAX];
    const char *in_name[MHA_IO_MAX], *out_name[MHA_IO_MAX];
    attn_tensor span[2];
} mha_io;
struct mha_plan;
/* the inputs every call reads: x_q, x_kv, the weights and biases, opt's tensors */
ATTN_PRIVATE void mha_io_init(mha_io *io, const struct mha_plan *pl, const attn_options *opt);
ATTN_PRIVATE void mha_io_add(mha_io *io, bool out, const attn_tensor *t, const char *name);
ATTN_PRIVATE void mha_io_bytes(mha_io *io, bool out, const void *p, size_t n, const char *name);
ATTN_PRIVATE attn_status mha_io_check(const mha_io *io, const attn_options *opt, size_t ws_need);

/* io (the call's tensors): checked between the two passes, with the workspace's size */
ATTN_PRIVATE attn_status mha_two_pass(mha_body body, const void *ctx, const attn_options *opt,
                                      const mha_io *io, size_t *bytes);

/* One call's arguments, checked (mha_plan_init) before anything is written. */
typedef struct mha_plan {
    int64_t B, Lq, Lk, E, Ekv, Hq, Hkv, Dk, Dv;
    const attn_tensor *xq, *xkv;             /* xkv == xq for self-attention      */
    bool self;                               /* x_kv was NULL                     */
    const attn_tensor *w[MHA_N], *b[MHA_N];  /* b[] may be NULL                   */
    int64_t in[MHA_N], out[MHA_N];           /* each weight's logical [in, out]   */
    attn_rope_kind rope;
    int64_t rdim;                            /* rotated width, even, <= Dk        */
    double base;
    int64_t offset;
    /* set by the callers that keep the activations (mha_saved.c): Q, K, V, O and the LSE
     * are carved from keep (mha_keep_layout) instead of the workspace; NULL otherwise */
    char *keep;
} mha_plan;

/* Checks m, x_q, x_kv (NULL = x_q) and y (NULL: not checked): shapes, dtypes, strides,
 * divisibility, RoPE, sizes the BLAS can take; fills *pl. Records the detail. */
ATTN_PRIVATE attn_status mha_plan_init(mha_plan *pl, const attn_mha *m, const attn_tensor *x_q,
                                       const attn_tensor *x_kv, const attn_tensor *y,
                                       bool need_data);

/* x [B, L, C] (shape {B, L, C, 1}) as a float32 [B·L, C] operand: in place when it is
 * float32 with unit last stride and evenly spaced rows, else widened into the workspace
 * (w->base NULL: only counted). */
ATTN_PRIVATE mha_op mha_rows_op(const attn_tensor *x, mha_ws *w);
/* A weight (logical [in, out]) as a float32 operand: in place when float32 with one unit
 * stride, else a panel of the workspace (src set). rows: the rows of a in every product
 * with it; 1 with a bfloat16 weight of one unit stride (read in place, mha_gemv.c): the
 * panel is only the one-row products' partials (MHA_GEMV_PARTS · max(in, out) floats). */
ATTN_PRIVATE mha_op mha_weight_op(const attn_tensor *wt, int64_t rows, mha_ws *w);

/* With w a weight of logical [in, out]:
 *   transposed false:  c[M, out] = a[M, in] · w    + beta · c
 *   transposed true:   c[M, in]  = a[M, out] · wᵀ  + beta · c
 * a and c row-major with leading dimensions lda and ldc. A panelled weight is widened
 * MHA_PANEL rows at a time, each panel's product added to c. */
ATTN_PRIVATE void mha_gemm_w(bool transposed, int64_t M, const float *a, int64_t lda,
                             const mha_op *w, float beta, float *c, int64_t ldc);

/* mha_gemm_w's one-row product (M = 1) over a panelled bfloat16 weight read in place,
 * either of its strides 1 (mha_gemv.c); false, nothing written: another weight, which
 * takes the panels. */
ATTN_PRIVATE bool mha_gemv_bf16(bool transposed, const float *a, const mha_op *w, float beta,
                                float *c);
/* whether mha_gemv_bf16 reads this weight in place, and the most partials it keeps */
ATTN_PRIVATE bool mha_gemv_reads(const attn_tensor *wt);
#define MHA_GEMV_PARTS 16

/* out[M, out] (rows ldc apart) = a[M, in] · w (+ bias[out] on every row when bias is not
 * NULL), for w a weight of logical [in, out]. */
ATTN_PRIVATE void mha_project(float *out, int64_t ldc, int64_t M, mha_op a, mha_op w,
                              const attn_tensor *bias);

/* An output [B, L, C] of float32 or bfloat16 (shape {B, L, C, 1}) as a float32 [B·L, C]
 * target: in place (dst = y's data, *scatter false) when float32 with unit last stride
 * and evenly spaced rows, else a dense scratch that mha_scatter stores afterwards. */
typedef struct mha_target {
    float *p;
    int64_t ld;
    bool scatter;
} mha_target;
ATTN_PRIVATE mha_target mha_rows_target(const attn_tensor *y, mha_ws *w);
ATTN_PRIVATE void mha_scatter(const attn_tensor *y, const mha_target *t);

/* The heads' views of a [B, L, H, D] float32 buffer: shape {B, H, L, D}. */
static inline attn_tensor mha_heads_view(float *p, int64_t B, int64_t L, int64_t H, int64_t D) {
    attn_tensor t = {p, ATTN_F32, {B, H, L, D}, {L * H * D, D, H * D, 1}};
    return t;
}

/* attn_forward for the module: the heads' attention of q/k/v views into o, with the
 * attention weights [B, Hq, Lq, Lk] (or their mean over heads [B, 1, Lq, Lk] when
 * average) written to weights, if not NULL. Sizes its own part of the workspace when
 * w->base is NULL. */
ATTN_PRIVATE attn_status mha_attend(const attn_tensor *q, const attn_tensor *k,
                                    const attn_tensor *v, const attn_tensor *o,
                                    const attn_tensor *lse, const attn_tensor *weights,
                                    bool average, const attn_options *opt, mha_ws *w);

/* mha_attend's averaged weights: mha_attend_average, mha_ws.h */

/* The layer's operands and projections in the workspace, taken in one order by the
 * forward and the backward (mha.c). */
typedef struct mha_qkv {
    mha_op xq, xkv, w[MHA_N];
    float *q, *k, *v, *o;  /* (B, Lq, Hq, Dk) (B, Lk, Hkv, Dk) (B, Lk, Hkv, Dv) (B, Lq, Hq, Dv) */
} mha_qkv;
ATTN_PRIVATE void mha_qkv_layout(const mha_plan *pl, mha_ws *w, mha_qkv *s);

/* The kept activations (attn_mha_forward_save's buffer from its first byte, keep;
 * NULL: only sized): a header of the shapes, then Q, K, V, O as mha_qkv's and the LSE
 * [B, Hq, Lq]. Returns the bytes from keep; each pointer (lse too) may be NULL. */
ATTN_PRIVATE size_t mha_keep_layout(const mha_plan *pl, char *keep, mha_qkv *s, float **lse);
/* the header's first word once a forward completed (mha_saved.c) */
#define MHA_KEEP_MAGIC 0x6d68615f6b656570ll
/* saved (float-aligned, saved_bytes long) as pl->keep: big enough for pl's layer, and
 * when written, holding a completed forward's header for the same shapes (mha_saved.c) */
ATTN_PRIVATE attn_status mha_keep_check(mha_plan *pl, const void *saved, size_t saved_bytes,
                                        bool written);
/* Q, K, V projected and rotated (row i of batch b at position offset + pos0[b] + i) */
ATTN_PRIVATE void mha_qkv_project(const mha_plan *pl, const mha_qkv *s, const int64_t *pos0);
/* y = O W_O + b_O through target yt (mha_rows_target of y) */
ATTN_PRIVATE void mha_out_project(const mha_plan *pl, const mha_qkv *s, const attn_tensor *y,
                                  const mha_target *yt);
/* The whole forward over workspace w (count_only: sizes it). y may be NULL (the
 * backward's recomputation); lse_out not NULL: the LSE [B, Hq, Lq] is taken from the
 * workspace too and returned. */
ATTN_PRIVATE attn_status mha_forward_ws(const mha_plan *pl, const attn_tensor *y,
                                        const attn_tensor *weights, bool average,
                                        const attn_options *opt, mha_ws *w, mha_qkv *s,
                                        float **lse_out);

/* ---- RoPE (rope.c) ----------------------------------------------------------------------
 * x [B, L, H, D] dense float32; the first rdim of each D rotated in pairs (half-split:
 * d and d + rdim/2; interleaved: 2d and 2d + 1) by theta = pos · base^(-2d / rdim), pos =
 * offset + (pos0 ? pos0[b] : 0) + i. inverse rotates by -theta (the backward's
 * transpose). Angles and their cos/sin in double, applied in float32. */
ATTN_PRIVATE attn_status ai_rope_check(const attn_rope *r, int64_t Dk, int64_t *rdim,
                                       double *base);
ATTN_PRIVATE void ai_rope_apply(attn_rope_kind kind, int64_t rdim, double base,
                                int64_t offset, const int64_t *pos0, float *x, int64_t B,
                                int64_t L, int64_t H, int64_t D, bool inverse);

#endif /* ATTN_MHA_H */
