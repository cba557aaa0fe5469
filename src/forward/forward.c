/*
 * forward.c — the entry: attn_forward and its workspace query. A call with
 *             options.key_scores goes to key_scores.c, every other one to the forward's
 *             body (piece.c), which the calls built on attn_forward (the backward's
 *             recomputation, varlen, the cascade, the ring) enter directly.
 *
 * Kernels never check arguments: everything a path relies on is established before
 * anything is written (params.c fills and checks the params; status strings, the error
 * detail and the checks of one tensor are core.c's). A failing call writes nothing but
 * its error detail.
 */
#include "core/attn_internal.h"

attn_status attn_forward_workspace_size(const attn_tensor *q, const attn_tensor *k,
                                        const attn_tensor *v, const attn_tensor *o,
                                        const attn_options *opt, size_t *bytes) {
    attn_params p;
    if (!bytes) return ai_fail(ATTN_ERR_NULL, "bytes: NULL output pointer");
    attn_options plain;  // the eviction scores take no workspace (key_scores.c)
    if (opt && opt->key_scores) {
        plain = *opt;
        plain.key_scores = NULL;
        opt = &plain;
    }
    TRY(ai_params_init(&p, q, k, v, o, opt, false));
    size_t n = ai_forward_bytes(&p);
    if (n == (size_t)-1) return ai_fail(ATTN_ERR_OVERFLOW, "workspace size overflows size_t");
    *bytes = n;
    return ai_ok();
}

attn_status attn_forward(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                         const attn_tensor *o, const attn_options *opt) {
    if (opt && opt->key_scores) return ai_forward_key_scores(q, k, v, o, opt);  // key_scores.c
    return ai_forward_piece(q, k, v, o, opt, NULL);
}
