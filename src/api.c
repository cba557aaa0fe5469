/*
 * api.c — attn_forward and its workspace query: path choice and the workspace of the
 *         call. The params are filled in params.c; status strings, the error detail and
 *         the checks of one tensor are core.c's.
 *
 * Kernels never check arguments: everything a path relies on is established here,
 * before anything is written. A failing call writes nothing but its error detail.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "alloc.h"
#include "kernels.h"
#include "mask_summary.h"

/* the path's bytes, then the key lengths of ai_key_padding (mask_summary.h) */
static size_t path_bytes(const attn_params *p) {
    if (p->path == ATTN_PATH_REFERENCE) return ai_reference_workspace(p);
    return p->q_dt == ATTN_F64 ? ai_fused_f64_workspace(p) : ai_fused_workspace(p);
}

static size_t workspace_bytes(const attn_params *p) {
    const size_t path = path_bytes(p), pad = ai_key_padding_bytes(p);
    return path == (size_t)-1 || path > SIZE_MAX - pad ? (size_t)-1 : path + pad;
}

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
    size_t n = workspace_bytes(&p);
    if (n == (size_t)-1) return ai_fail(ATTN_ERR_OVERFLOW, "workspace size overflows size_t");
    *bytes = n;
    return ai_ok();
}

attn_status attn_forward(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                         const attn_tensor *o, const attn_options *opt) {
    if (opt && opt->key_scores) return ai_forward_key_scores(q, k, v, o, opt);  // key_scores.c
    return ai_forward_piece(q, k, v, o, opt, NULL);
}

attn_status ai_forward_piece(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                               const attn_tensor *o, const attn_options *opt,
                               const attn_drop_layout *drop) {
    attn_params p;
    TRY(ai_params_init(&p, q, k, v, o, opt, true));
    attn_set_drop_layout(&p, drop);
    if (p.B == 0 || p.Hq == 0 || p.Lq == 0) return ai_ok();  // nothing written: nothing aliases
    const size_t need = workspace_bytes(&p);
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
    *bytes = workspace_bytes(&p);
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
    const size_t need = workspace_bytes(&p);
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
