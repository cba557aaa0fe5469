/*
 * piece.c — the forward's body: the params, the overlap rule, the workspace (the
 *           caller's or allocated), key padding run as key lengths, and the path
 *           (reference, float64 fused, fused). attn_forward (forward.c) and every call
 *           built on it run it; ai_forward_forced runs it with the tuner's configuration.
 */
#include <stdint.h>

#include "core/alloc.h"
#include "mask_summary.h"

/* the path's bytes, then the key lengths of ai_key_padding (mask_summary.h) */
static size_t path_bytes(const attn_params *p) {
    if (p->path == ATTN_PATH_REFERENCE) return ai_reference_workspace(p);
    return p->q_dt == ATTN_F64 ? ai_fused_f64_workspace(p) : ai_fused_workspace(p);
}

size_t ai_forward_bytes(const attn_params *p) {
    const size_t path = path_bytes(p), pad = ai_key_padding_bytes(p);
    return path == (size_t)-1 || path > SIZE_MAX - pad ? (size_t)-1 : path + pad;
}

attn_status ai_forward_piece(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                             const attn_tensor *o, const attn_options *opt,
                             const attn_drop_layout *drop) {
    attn_params p;
    TRY(ai_params_init(&p, q, k, v, o, opt, true));
    attn_set_drop_layout(&p, drop);
    if (p.B == 0 || p.Hq == 0 || p.Lq == 0) return ai_ok();  // nothing written: nothing aliases
    const size_t need = ai_forward_bytes(&p);
    TRY(ai_check_forward_aliasing(q, k, v, o, opt, need == (size_t)-1 ? 0 : need));
    (void)ai_ok();  // the checks passed: no detail left from them

    void *ws, *owned;
    TRY(ai_workspace_acquire(opt, need, &ws, &owned));
    /* key padding runs as the key lengths it is, on every fused path (mask_summary.h);
     * the lengths after the path's bytes, which it was sized for with the mask */
    attn_params padded;
    const attn_params *run = ai_key_padding(&p, (char *)ws + (need - ai_key_padding_bytes(&p)),
                                            &padded);
    attn_status st = run->path == ATTN_PATH_REFERENCE ? ai_reference_forward(run, ws)
                     : run->q_dt == ATTN_F64          ? ai_fused_f64_forward(run, ws)
                                                      : ai_fused_forward(run, ws);
    ai_free(owned);
    return st;
}

attn_status ai_forward_forced_workspace_size(const attn_tune_config *force,
                                             const attn_tensor *q, const attn_tensor *k,
                                             const attn_tensor *v, const attn_tensor *o,
                                             const attn_options *opt, size_t *bytes) {
    attn_params p;
    TRY(ai_params_init_for(&p, q, k, v, o, opt, false, false, force));
    *bytes = ai_forward_bytes(&p);
    if (*bytes == (size_t)-1) return ai_fail(ATTN_ERR_OVERFLOW, "workspace size overflows size_t");
    return ai_ok();
}

attn_status ai_forward_forced(const attn_tune_config *force, const attn_tensor *q,
                              const attn_tensor *k, const attn_tensor *v, const attn_tensor *o,
                              const attn_options *opt) {
    attn_params p;
    TRY(ai_params_init_for(&p, q, k, v, o, opt, true, false, force));
    if (p.path != ATTN_PATH_FUSED || p.q_dt == ATTN_F64)
        return ai_fail(ATTN_ERR_UNSUPPORTED, "ai_forward_forced: float32, float16 and "
                       "bfloat16 fused calls only");
    if (p.B == 0 || p.Hq == 0 || p.Lq == 0) return ai_ok();
    const size_t need = ai_forward_bytes(&p);
    if (need == (size_t)-1) return ai_fail(ATTN_ERR_OVERFLOW, "workspace size overflows size_t");
    void *ws, *owned;
    TRY(ai_workspace_acquire(opt, need, &ws, &owned));
    /* a bool mask that is key padding runs as key lengths, as in attn_forward */
    attn_params padded;
    const attn_params *run = ai_key_padding(&p, (char *)ws + (need - ai_key_padding_bytes(&p)),
                                            &padded);
    const attn_status st = ai_fused_forward(run, ws);
    ai_free(owned);
    return st;
}
