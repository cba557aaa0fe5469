/*
 * key_scores.c — attn_forward's eviction scores (options.key_scores; docs/CONTRACT.md,
 *                "Eviction scores"): the attention mass each cached key received over the
 *                call's query rows and the query heads of its key/value head, the score
 *                H2O, SnapKV and OpenVINO's paged attention keep the largest keys by.
 *
 * What it is: the forward (piece.c's ai_forward_piece, with an LSE of its own when the
 * caller wants none), then attn_weights_grid with one row cell and a cell per key, which
 * recomputes P = exp(s - lse) from that LSE and sums it over the rows (float64, rounded
 * once), then the group's heads added in head order. Every check runs before the forward
 * writes anything; the buffers are allocated before it too.
 * What it is not: a second softmax (the LSE is the forward's), or free — one more pass
 * over K, a Q·Kᵀ without P·V.
 */
#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/attn_internal.h"

/* key_scores [B, Hkv, Lk] (shape {B, Hkv, Lk, 1}), float32, an output's strides */
static attn_status check_scores(const attn_tensor *t, const attn_params *p) {
    TRY(ai_check_tensor(t, "options.key_scores", ATTN_F32, true));
    const int64_t want[4] = {p->B, p->Hkv, p->Lk, 1};
    for (int d = 0; d < 4; d++)
        if (t->shape[d] != want[d])
            return ai_fail(ATTN_ERR_SHAPE, "options.key_scores: shape [%lld, %lld, %lld, %lld], "
                           "expected [B = %lld, Hkv = %lld, Lk = %lld, 1]",
                           (long long)t->shape[0], (long long)t->shape[1], (long long)t->shape[2],
                           (long long)t->shape[3], (long long)p->B, (long long)p->Hkv,
                           (long long)p->Lk);
    return ai_check_output_strides(t, "options.key_scores", 3);
}

attn_status ai_forward_key_scores(const attn_tensor *q, const attn_tensor *k,
                                  const attn_tensor *v, const attn_tensor *o,
                                  const attn_options *opt) {
    attn_options fwd = *opt;
    fwd.key_scores = NULL;
    attn_params p;
    TRY(ai_params_init(&p, q, k, v, o, &fwd, true));
    if (p.kv_dt == ATTN_U4)  // its key pass is attn_weights_grid's
        return ai_fail(ATTN_ERR_UNSUPPORTED, "options.key_scores: a u4 cache has none");
    if (p.q_dt == ATTN_F64)
        return ai_fail(ATTN_ERR_UNSUPPORTED, "options.key_scores: float64 calls have none "
                       "(float32, 16-bit and q8_0 calls do)");
    const attn_tensor *ks = opt->key_scores;
    TRY(check_scores(ks, &p));
    {  /* the scores against every input and the forward's outputs */
        const attn_tensor *in[] = {q, k, v, opt->mask, opt->bias, opt->kv_len, opt->alibi_slopes,
                                   opt->sinks, opt->block_table, opt->k_scale, opt->v_scale};
        static const char *const in_names[] = {"q", "k", "v", "options.mask", "options.bias",
                                               "options.kv_len", "options.alibi_slopes",
                                               "options.sinks", "options.block_table",
                                               "options.k_scale", "options.v_scale"};
        const attn_tensor *out[] = {o, opt->lse, opt->weights, ks};
        static const char *const out_names[] = {"o", "options.lse", "options.weights",
                                                "options.key_scores"};
        TRY(ai_check_aliasing(in, in_names, 11, out, out_names, 4, NULL, 0));
    }
    const int64_t B = p.B, Hq = p.Hq, Hkv = p.Hkv, Lq = p.Lq, Lk = p.Lk;
    /* the LSE the grid reads (the caller's, or ours) and the grid [B, Hq, 1, Lk] */
    const size_t lse_floats = opt->lse ? 0 : (size_t)(B * Hq * Lq);
    const size_t grid_floats = Lq > 0 ? (size_t)(B * Hq * Lk) : 0;
    float *mem = NULL;
    if (lse_floats + grid_floats > 0) {
        mem = ai_malloc((lse_floats + grid_floats) * sizeof(float));
        if (!mem)
            return ai_fail(ATTN_ERR_NOMEM, "options.key_scores: could not allocate %zu bytes",
                           (lse_floats + grid_floats) * sizeof(float));
    }
    attn_tensor lse_own = attn_tensor_4d(mem, ATTN_F32, B, Hq, Lq, 1);
    if (!opt->lse) fwd.lse = &lse_own;
    attn_status st = ai_forward_piece(q, k, v, o, &fwd, NULL);
    float *grid = mem + lse_floats;
    if (st == ATTN_OK && grid_floats > 0) {
        attn_options go = *opt;
        go.lse = NULL, go.weights = NULL, go.key_scores = NULL;
        go.dropout_p = 0.0f;  // the scores are of the undropped P
        const attn_tensor tg = attn_tensor_4d(grid, ATTN_F32, B, Hq, 1, Lk);
        st = attn_weights_grid(q, k, fwd.lse, &tg, ATTN_REDUCE_SUM, &go);
    }
    if (st == ATTN_OK) {
        const int64_t group = Hkv ? Hq / Hkv : 1;
        float *out = ks->data;
        for (int64_t b = 0; b < B; b++)
            for (int64_t g = 0; g < Hkv; g++)
                for (int64_t j = 0; j < Lk; j++) {
                    double sum = 0.0;  // the group's heads in order; a masked cell is -inf: 0
                    for (int64_t h = g * group; grid_floats > 0 && h < (g + 1) * group; h++) {
                        const float c = grid[(b * Hq + h) * Lk + j];
                        if (c != -INFINITY) sum += (double)c;
                    }
                    out[b * ks->stride[0] + g * ks->stride[1] + j * ks->stride[2]] = (float)sum;
                }
    }
    ai_free(mem);
    return st == ATTN_OK ? ai_ok() : st;
}
