/*
 * mha_saved.c — training without the recomputation: attn_mha_forward_save (the forward
 *               that also keeps Q, K, V, O and the LSE in a caller's buffer) and
 *               attn_mha_saved_size; attn_mha_backward_saved (mha_backward.c) reads them
 *               instead of running the forward again.
 *
 * The buffer's layout (mha_keep_layout, mha.c), from its first byte (so that a copy of
 * it anywhere reads the same; float alignment is all it needs): a 64-byte header of
 * int64 {magic, B, Lq, Lk, Hq, Hkv, Dk, Dv}, then Q and K (after RoPE), V and O as
 * [B, L, H, D] float32, then the LSE [B, Hq, Lq], each piece a multiple of 64 bytes.
 * The magic is written last, once the forward succeeded, and cleared first: a buffer of
 * a failed call is refused.
 *
 * What it is not: a second forward (the same mha_forward_ws, its projections and
 * attention carved from the buffer instead of the workspace) or a check of what the
 * buffer holds beyond the header (the caller keeps it unchanged, with the same inputs,
 * weights and options, between the two calls).
 */
#include <stdint.h>
#include <string.h>

#include "mha.h"


static void keep_header(const mha_plan *pl, int64_t h[8]) {
    const int64_t v[8] = {MHA_KEEP_MAGIC, pl->B, pl->Lq, pl->Lk, pl->Hq, pl->Hkv, pl->Dk, pl->Dv};
    memcpy(h, v, sizeof v);
}

attn_status mha_keep_check(mha_plan *pl, const void *saved, size_t saved_bytes, bool written) {
    const size_t need = mha_keep_layout(pl, NULL, NULL, NULL);
    if (need == SIZE_MAX) return ai_fail(ATTN_ERR_OVERFLOW, "saved: its size overflows size_t");
    if (!saved) return ai_fail(ATTN_ERR_NULL, "saved: NULL buffer");
    if ((uintptr_t)saved % sizeof(float) != 0)
        return ai_fail(ATTN_ERR_VALUE, "saved: %p is not aligned to a float (4 bytes)", saved);
    if (saved_bytes < need)
        return ai_fail(ATTN_ERR_WORKSPACE, "saved: %zu bytes, this layer needs %zu "
                       "(attn_mha_saved_size)", saved_bytes, need);
    pl->keep = (char *)saved;
    if (written) {
        int64_t want[8], got[8];
        keep_header(pl, want);
        memcpy(got, pl->keep, sizeof got);
        if (got[0] != MHA_KEEP_MAGIC)
            return ai_fail(ATTN_ERR_VALUE, "saved: not written by a successful "
                           "attn_mha_forward_save");
        if (memcmp(got, want, sizeof got) != 0)
            return ai_fail(ATTN_ERR_VALUE, "saved: kept for B=%lld Lq=%lld Lk=%lld Hq=%lld "
                           "Hkv=%lld Dk=%lld Dv=%lld, this call has B=%lld Lq=%lld Lk=%lld "
                           "Hq=%lld Hkv=%lld Dk=%lld Dv=%lld", (long long)got[1],
                           (long long)got[2], (long long)got[3], (long long)got[4],
                           (long long)got[5], (long long)got[6], (long long)got[7],
                           (long long)want[1], (long long)want[2], (long long)want[3],
                           (long long)want[4], (long long)want[5], (long long)want[6],
                           (long long)want[7]);
    }
    return ATTN_OK;
}

attn_status attn_mha_saved_size(const attn_mha *m, const attn_tensor *x_q,
                                const attn_tensor *x_kv, size_t *bytes) {
    if (!bytes) return ai_fail(ATTN_ERR_NULL, "bytes: NULL output pointer");
    mha_plan pl;
    TRY(mha_plan_init(&pl, m, x_q, x_kv, NULL, false));
    const size_t need = mha_keep_layout(&pl, NULL, NULL, NULL);
    if (need == SIZE_MAX) return ai_fail(ATTN_ERR_OVERFLOW, "saved: its size overflows size_t");
    *bytes = need;
    return ATTN_OK;
}

typedef struct save_ctx {
    mha_plan pl;
    const attn_tensor *y, *weights;
    bool average;
} save_ctx;

static attn_status save_body(const void *ctx, const attn_options *opt, mha_ws *w) {
    const save_ctx *f = ctx;
    mha_qkv s;
    return mha_forward_ws(&f->pl, f->y, f->weights, f->average, opt, w, &s, NULL);
}

attn_status attn_mha_forward_save(const attn_mha *m, const attn_tensor *x_q,
                                  const attn_tensor *x_kv, const attn_tensor *y,
                                  const attn_tensor *weights, bool average_weights,
                                  const attn_options *opt, void *saved, size_t saved_bytes) {
    save_ctx f = {.y = y, .weights = weights, .average = average_weights};
    TRY(mha_plan_init(&f.pl, m, x_q, x_kv, y, true));
    if (!y) return ai_fail(ATTN_ERR_NULL, "y: tensor pointer is NULL");
    TRY(mha_keep_check(&f.pl, saved, saved_bytes, false));
    mha_io io;
    mha_io_init(&io, &f.pl, opt);
    mha_io_add(&io, true, y, "y");
    mha_io_add(&io, true, weights, "weights");
    mha_io_bytes(&io, true, saved, saved_bytes, "saved");
    TRY(mha_io_check(&io, NULL, 0));  /* before the header's first write; the workspace later */
    memset(f.pl.keep, 0, 8);  /* not valid until this call succeeds */
    TRY(mha_two_pass(save_body, &f, opt, &io, NULL));
    int64_t h[8];
    keep_header(&f.pl, h);
    memcpy(f.pl.keep, h, sizeof h);
    return ATTN_OK;
}

attn_status attn_mha_forward_save_workspace_size(const attn_mha *m, const attn_tensor *x_q,
                                                 const attn_tensor *x_kv, const attn_tensor *y,
                                                 const attn_tensor *weights,
                                                 bool average_weights, const attn_options *opt,
                                                 size_t *bytes) {
    if (!bytes) return ai_fail(ATTN_ERR_NULL, "bytes: NULL output pointer");
    save_ctx f = {.y = y, .weights = weights, .average = average_weights};
    TRY(mha_plan_init(&f.pl, m, x_q, x_kv, y, false));
    static float sizing[16];  /* only counted: a non-NULL keep that nothing reads */
    f.pl.keep = (char *)sizing;
    return mha_two_pass(save_body, &f, opt, NULL, bytes);
}
