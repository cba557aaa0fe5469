/*
 * backward_dense.c — the fused backward's Q and dO copied dense when their rows are not
 *                    adjacent (transformers' [B, L, H, D] memory read as [B, H, L, D]):
 *                    every key block of an item reads every query row of its heads, so a
 *                    tile of such rows would walk a page per row each time. The rule and
 *                    the copy are core/dense_rows.h's; the workspace's room for them is
 *                    backward_fused.c's plan. The bits are those of the dense call.
 */
#include "backward.h"
#include "core/dense_rows.h"

void ai_bwd_dense_bytes(const attn_bwd_params *bp, int64_t reads, size_t *q, size_t *d_o) {
    const attn_params *p = &bp->fwd;
    *q = *d_o = 0;
    if (reads < DENSE_ROWS_MIN_READS) return;
    *q = ai_dense_rows_bytes(p->q_s, sizeof(float), p->B, p->Hq, p->Lq, p->Dk);
    *d_o = ai_dense_rows_bytes(bp->do_s, sizeof(float), p->B, p->Hq, p->Lq, p->Dv);
    if (*q > DENSE_ROWS_MAX_BYTES - *d_o) *q = *d_o = 0;
}

const attn_bwd_params *ai_bwd_dense_params(const attn_bwd_params *given, char *at_q,
                                           char *at_do, attn_bwd_params *dense) {
    if (!at_q && !at_do) return given;
    const attn_params *p = &given->fwd;
    *dense = *given;
    if (at_q) {
        dense->fwd.q = at_q;
        ai_dense_rows_strides(p->Hq, p->Lq, p->Dk, dense->fwd.q_s);
    }
    if (at_do) {
        dense->d_o = (const float *)at_do;
        ai_dense_rows_strides(p->Hq, p->Lq, p->Dv, dense->do_s);
    }
    return dense;
}

void ai_bwd_dense_copy(const attn_bwd_params *given, const attn_bwd_params *bp, int64_t s) {
    const attn_params *p = &given->fwd;
    const int64_t n = p->B * p->Hq, f = sizeof(float);
    if (s < n && bp->fwd.q != p->q)
        ai_dense_rows_copy(p->q, p->q_s, f, p->Hq, p->Lq, p->Dk, (void *)bp->fwd.q, s);
    if (s >= n && bp->d_o != given->d_o)
        ai_dense_rows_copy(given->d_o, given->do_s, f, p->Hq, p->Lq, p->Dv, (void *)bp->d_o,
                           s - n);
}
