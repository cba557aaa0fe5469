/*
 * mha_decode.c — the multi-head module's cached decoding step (attn_mha_decode): the new
 *                tokens projected and rotated at their positions, their K and V written
 *                into the caller's cache, the attention over the cache with bottom-right
 *                causal alignment, the output projection.
 *
 * What it is not: the owner of the cache (the caller allocates it, its pages and its
 * lengths; the step appends). The cache is contiguous [B, Hkv, Lmax, D] or paged (page
 * pools and a block table, attn_kv_cache.kind); either way the new rows are written by
 * attn_kv_append (float32 rounded to the cache's dtype, or quantized to q8_0) and the
 * attention reads the cache in place through its strides (and the table), with kv_len =
 * len + n per batch: row i of batch b sees keys [0, len[b] + i], exactly what one causal
 * call over the whole sequence gives it.
 */
#include <omp.h>

#include "core/half.h"
#include "core/pages.h"
#include "mha.h"
#include "mha_clock.h"
#include "mha_gemv.h"

double *mha_decode_clock;

/* the phase clock: the time since *t0 added to phase's entry, *t0 moved on */
static void clock_phase(int phase, double *t0) {
    if (!mha_decode_clock) return;
    const double t = omp_get_wtime();
    mha_decode_clock[phase] += t - *t0;
    *t0 = t;
}

/* A paged cache's pools and table against the plan: pools [num_pages, Hkv, page_size, D]
 * (k and v alike in pages), table I32 [B, max_pages]; and when need_data, every entry of
 * the pages the step touches, p < ceil((len[b] + n) / page_size), inside the pool (the
 * attention would refuse one only after the append had written). *Lmax is the table's
 * rows. */
static attn_status check_pages(const mha_plan *pl, const attn_kv_cache *c, bool need_data,
                               int64_t *Lmax) {
    if (!c->block_table)
        return ai_fail(ATTN_ERR_NULL, "cache.block_table: NULL for a paged cache");
    const int64_t np = c->k.shape[0], ps = c->k.shape[2];
    if (c->v.shape[0] != np || c->v.shape[2] != ps)
        return ai_fail(ATTN_ERR_SHAPE, "cache: k pool [%lld pages, .., %lld rows, ..] and v "
                       "pool [%lld, .., %lld, ..] differ", (long long)np, (long long)ps,
                       (long long)c->v.shape[0], (long long)c->v.shape[2]);
    ai_pages pg;
    TRY(ai_pages_init(&pg, c->block_table, "cache.block_table", pl->B, np, ps, need_data));
    *Lmax = pg.rows;
    for (int64_t b = 0; need_data && b < pl->B; b++) {
        const int64_t len = c->len[b];
        if (len < 0 || len > *Lmax - pl->Lq) continue;  /* check_cache's own message */
        TRY(ai_pages_check(&pg, "cache.block_table", b, 0, len + pl->Lq));
    }
    return ATTN_OK;
}

static attn_status check_cache(const mha_plan *pl, const attn_kv_cache *c, bool need_data) {
    if (!c) return ai_fail(ATTN_ERR_NULL, "cache: NULL");
    if (c->kind != ATTN_CACHE_CONTIGUOUS && c->kind != ATTN_CACHE_PAGED)
        return ai_fail(ATTN_ERR_UNSUPPORTED, "cache.kind is %d: expected ATTN_CACHE_CONTIGUOUS "
                       "or ATTN_CACHE_PAGED", (int)c->kind);
    const bool paged = c->kind == ATTN_CACHE_PAGED;
    if (!paged && c->block_table)
        return ai_fail(ATTN_ERR_VALUE, "cache.block_table: given for a contiguous cache "
                       "(kind ATTN_CACHE_PAGED takes one)");
    if (c->k.dtype == ATTN_U4 || c->v.dtype == ATTN_U4)  // no append writes one (kv_append.c)
        return ai_fail(ATTN_ERR_UNSUPPORTED, "cache.k, cache.v: a u4 cache is read by "
                       "attn_forward only");
    const bool cache_dt = attn_is_block_dtype(c->k.dtype) || c->k.dtype == ATTN_FP8_E4M3 ||
                          c->k.dtype == ATTN_FP8_E5M2;
    TRY(ai_check_tensor(&c->k, "cache.k", cache_dt ? c->k.dtype : ATTN_DTYPE_COUNT, need_data));
    TRY(ai_check_tensor(&c->v, "cache.v", c->k.dtype, need_data));
    if (attn_is_block_dtype(c->k.dtype)) {
        TRY(ai_check_q8_0_layout(&c->k, "cache.k"));
        TRY(ai_check_q8_0_layout(&c->v, "cache.v"));
    }
    {  // an fp8 cache's scales (attn_kv_append_scaled and attn_forward check them again)
        const float *sd;
        int64_t ss;
        TRY(ai_check_kv_scale(c->k_scale, "cache.k_scale", c->k.dtype, pl->Hkv, need_data, &sd, &ss));
        TRY(ai_check_kv_scale(c->v_scale, "cache.v_scale", c->k.dtype, pl->Hkv, need_data, &sd, &ss));
    }
    if (!c->len) return ai_fail(ATTN_ERR_NULL, "cache.len: NULL");
    /* rows per sequence: Lmax, or the table's max_pages * page_size */
    int64_t Lmax = c->k.shape[2];
    const int64_t n0 = paged ? c->k.shape[0] : pl->B;
    const int64_t wk[4] = {n0, pl->Hkv, c->k.shape[2], pl->Dk};
    const int64_t wv[4] = {n0, pl->Hkv, c->k.shape[2], pl->Dv};
    for (int d = 0; d < 4; d++)
        if (c->k.shape[d] != wk[d] || c->v.shape[d] != wv[d])
            return ai_fail(ATTN_ERR_SHAPE, "cache: k [%lld, %lld, %lld, %lld] and v [.., %lld], "
                           "expected [%s, Hkv = %lld, %s, Dk = %lld] and Dv = %lld",
                           (long long)c->k.shape[0], (long long)c->k.shape[1],
                           (long long)c->k.shape[2], (long long)c->k.shape[3],
                           (long long)c->v.shape[3], paged ? "num_pages" : "B",
                           (long long)pl->Hkv, paged ? "page_size" : "Lmax",
                           (long long)pl->Dk, (long long)pl->Dv);
    if (!paged && c->k.shape[0] != pl->B)
        return ai_fail(ATTN_ERR_SHAPE, "cache: k has %lld sequences, expected B = %lld",
                       (long long)c->k.shape[0], (long long)pl->B);
    if (paged) TRY(check_pages(pl, c, false, &Lmax));
    TRY(ai_check_output_strides(&c->k, "cache.k", 4));
    TRY(ai_check_output_strides(&c->v, "cache.v", 4));
    for (int64_t b = 0; need_data && b < pl->B; b++)
        if (c->len[b] < 0 || c->len[b] > Lmax - pl->Lq)
            return ai_fail(ATTN_ERR_VALUE, "cache.len[%lld] = %lld: %lld new tokens do not "
                           "fit Lmax = %lld", (long long)b, (long long)c->len[b],
                           (long long)pl->Lq, (long long)Lmax);
    if (paged && need_data) TRY(check_pages(pl, c, true, &Lmax));
    return ATTN_OK;
}

/* The heads' attention over a paged cache: attn_forward on the pools with the cache's
 * table (mha_attend refuses a table, which in the module's other calls would be the
 * caller's; here it is the cache's own). No weights output in a step. */
static attn_status attend_paged(const attn_tensor *q, const attn_kv_cache *c,
                                const attn_tensor *o, const attn_options *opt_in, mha_ws *w) {
    attn_options opt = *opt_in;
    if (opt.lse || opt.weights)
        return ai_fail(ATTN_ERR_VALUE, "options.%s must be NULL for the module",
                       opt.lse ? "lse" : "weights");
    if (opt.dropout_p != 0.0f)  /* as mha_attend */
        return ai_fail(ATTN_ERR_UNSUPPORTED, "options.dropout_p = %g: the multi-head "
                       "module has no dropout", (double)opt.dropout_p);
    if (opt.block_mask || opt.score_mod || opt.key_scores)  /* as mha_attend */
        return ai_fail(ATTN_ERR_UNSUPPORTED, "multi-head layer: options.%s is not supported",
                       opt.block_mask ? "block_mask" : opt.score_mod ? "score_mod" : "key_scores");
    opt.block_table = c->block_table;
    opt.workspace = NULL;
    opt.workspace_bytes = 0;
    size_t need;
    TRY(attn_forward_workspace_size(q, &c->k, &c->v, o, &opt, &need));
    opt.workspace = mha_take(w, (int64_t)((need + 3) / 4));
    opt.workspace_bytes = need;
    if (w->count_only) return ATTN_OK;
    return attn_forward(q, &c->k, &c->v, o, &opt);
}

/* One token's x·W_Q, x·W_K, x·W_V (B·n = 1) in one parallel region when every weight is
 * a bfloat16 one the rows loop reads in place (mha_gemv_bf16_many), each bias first
 * written into its output as mha_project does: the same bits as mha_qkv_project's three
 * products, one wake-up of the team instead of three pairs. false, nothing written:
 * another case, which takes mha_qkv_project (the biases it may have written are
 * written again there). */
static bool project_qkv_one_token(const mha_plan *pl, const mha_qkv *s) {
    if (pl->B * pl->Lq != 1 || pl->B * pl->Lk != 1) return false;
    const mha_op *w[3] = {&s->w[MHA_Q], &s->w[MHA_K], &s->w[MHA_V]};
    float *c[3] = {s->q, s->k, s->v}, beta[3];
    for (int n = 0; n < 3; n++) {
        const attn_tensor *t = w[n]->src;
        if (!t || t->dtype != ATTN_BF16 || !(w[n]->out <= 1 || t->stride[1] == 1)) return false;
    }
    for (int n = 0; n < 3; n++) {
        const attn_tensor *bias = pl->b[n];
        beta[n] = bias ? 1.0f : 0.0f;
        for (int64_t j = 0; bias && j < w[n]->out; j++)
            c[n][j] = attn_load(bias->dtype, bias->data, j * bias->stride[0]);
    }
    /* false (its partials do not fit, too few rows): mha_qkv_project writes all again */
    return mha_gemv_bf16_many(3, s->xq.p, w, beta, c);
}

static attn_status decode_ws(const mha_plan *pl, const attn_kv_cache *c, const attn_tensor *y,
                             const attn_options *opt_in, mha_ws *w) {
    static const attn_options defaults = {0};
    attn_options opt = opt_in ? *opt_in : defaults;
    if (opt.causal || opt.align != ATTN_ALIGN_TOP_LEFT || opt.kv_len)
        return ai_fail(ATTN_ERR_VALUE, "options.causal, align and kv_len are the decoding "
                       "step's own: leave them unset");
    if (opt.block_table)
        return ai_fail(ATTN_ERR_VALUE, "options.block_table: a paged cache's table is "
                       "cache.block_table (kind ATTN_CACHE_PAGED)");
    if (opt.k_scale || opt.v_scale)
        return ai_fail(ATTN_ERR_VALUE, "options.%s: an fp8 cache's scales are "
                       "cache.k_scale and cache.v_scale", opt.k_scale ? "k_scale" : "v_scale");
    opt.k_scale = c->k_scale;
    opt.v_scale = c->v_scale;
    const bool paged = c->kind == ATTN_CACHE_PAGED;
    mha_qkv s;
    mha_qkv_layout(pl, w, &s);
    mha_target yt = mha_rows_target(y, w);
    int64_t *kv_len = mha_take(w, 2 * pl->B);  /* (B) int64: len + n */
    attn_tensor tl = {kv_len, ATTN_I64, {pl->B, 1, 1, 1}, {1, 1, 1, 1}};
    opt.causal = true;
    opt.align = ATTN_ALIGN_BOTTOM_RIGHT;
    opt.kv_len = &tl;
    attn_tensor q = mha_heads_view(s.q, pl->B, pl->Lq, pl->Hq, pl->Dk);
    attn_tensor o = mha_heads_view(s.o, pl->B, pl->Lq, pl->Hq, pl->Dv);
    if (w->count_only) {
        if (paged) TRY(attend_paged(&q, c, &o, &opt, w));
        else TRY(mha_attend(&q, &c->k, &c->v, &o, NULL, NULL, false, &opt, w));
        if (w->overflow) return ai_fail(ATTN_ERR_OVERFLOW, "workspace size overflows size_t");
        return ATTN_OK;
    }
    double t0 = mha_decode_clock ? omp_get_wtime() : 0;
    for (int64_t b = 0; b < pl->B; b++) kv_len[b] = c->len[b] + pl->Lq;
    if (project_qkv_one_token(pl, &s)) {
        ai_rope_apply(pl->rope, pl->rdim, pl->base, pl->offset, c->len, s.q, pl->B, pl->Lq,
                      pl->Hq, pl->Dk, false);
        ai_rope_apply(pl->rope, pl->rdim, pl->base, pl->offset, c->len, s.k, pl->B, pl->Lk,
                      pl->Hkv, pl->Dk, false);
    } else {
        mha_qkv_project(pl, &s, c->len);
    }
    clock_phase(MHA_DEC_QKV, &t0);
    /* the new rows [B, n, Hkv, D] of the workspace into the cache at positions len[b] + i
     * (through the table when paged); attn_kv_append checks everything before it writes */
    attn_tensor kn = mha_heads_view(s.k, pl->B, pl->Lq, pl->Hkv, pl->Dk);
    attn_tensor vn = mha_heads_view(s.v, pl->B, pl->Lq, pl->Hkv, pl->Dv);
    attn_tensor tpos = {c->len, ATTN_I64, {pl->B, 1, 1, 1}, {1, 1, 1, 1}};
    TRY(attn_kv_append_scaled(&kn, &vn, &c->k, &c->v, NULL, paged ? c->block_table : NULL, &tpos,
                              c->k_scale, c->v_scale));
    clock_phase(MHA_DEC_APPEND, &t0);
    if (paged) TRY(attend_paged(&q, c, &o, &opt, w));
    else TRY(mha_attend(&q, &c->k, &c->v, &o, NULL, NULL, false, &opt, w));
    clock_phase(MHA_DEC_ATTEND, &t0);
    mha_out_project(pl, &s, y, &yt);
    clock_phase(MHA_DEC_OUT, &t0);
    for (int64_t b = 0; b < pl->B; b++) c->len[b] += pl->Lq;
    return ATTN_OK;
}

typedef struct dec_ctx {
    mha_plan pl;
    const attn_kv_cache *cache;
    const attn_tensor *y;
} dec_ctx;

static attn_status decode_body(const void *ctx, const attn_options *opt, mha_ws *w) {
    const dec_ctx *d = ctx;
    return decode_ws(&d->pl, d->cache, d->y, opt, w);
}

attn_status attn_mha_decode(const attn_mha *m, const attn_tensor *x, const attn_kv_cache *cache,
                            const attn_tensor *y, const attn_options *opt) {
    dec_ctx d = {.cache = cache, .y = y};
    if (!y) return ai_fail(ATTN_ERR_NULL, "y: tensor pointer is NULL");
    TRY(mha_plan_init(&d.pl, m, x, NULL, y, true));
    TRY(check_cache(&d.pl, cache, true));
    /* the cache's rows and lengths are written too: nothing read may lie in them */
    mha_io io;
    mha_io_init(&io, &d.pl, opt);
    mha_io_add(&io, false, cache->block_table, "cache.block_table");
    mha_io_add(&io, true, y, "y");
    mha_io_add(&io, true, &cache->k, "cache.k");
    mha_io_add(&io, true, &cache->v, "cache.v");
    mha_io_bytes(&io, true, cache->len, (size_t)d.pl.B * sizeof(int64_t), "cache.len");
    return mha_two_pass(decode_body, &d, opt, &io, NULL);
}
