/*
 * mha_decode.c — the multi-head module's cached decoding step (attn_mha_decode): the new
 *                tokens projected and rotated at their positions, their K and V written
 *                into the caller's cache, the attention over the cache with bottom-right
 *                causal alignment, the output projection.
 *
 * What it is not: the owner of the cache (the caller allocates it and its lengths; the
 * step appends), or a paged cache (attn_kv_cache.kind names the layout; contiguous is
 * the one there is). The attention reads the cache in place through its strides, of any
 * cache dtype, with kv_len = len + n per batch: row i of batch b sees keys
 * [0, len[b] + i], exactly what one causal call over the whole sequence gives it.
 */
#include "half.h"
#include "mha.h"

static attn_status check_cache(const mha_plan *pl, const attn_kv_cache *c, bool need_data) {
    if (!c) return attn_fail(ATTN_ERR_NULL, "cache: NULL");
    if (c->kind != ATTN_CACHE_CONTIGUOUS)
        return attn_fail(ATTN_ERR_UNSUPPORTED, "cache.kind is %d: only ATTN_CACHE_CONTIGUOUS "
                         "is implemented", (int)c->kind);
    TRY(attn_check_tensor(&c->k, "cache.k", ATTN_DTYPE_COUNT, need_data));
    TRY(attn_check_tensor(&c->v, "cache.v", c->k.dtype, need_data));
    const int64_t Lmax = c->k.shape[2];
    const int64_t wk[4] = {pl->B, pl->Hkv, Lmax, pl->Dk}, wv[4] = {pl->B, pl->Hkv, Lmax, pl->Dv};
    for (int d = 0; d < 4; d++)
        if (c->k.shape[d] != wk[d] || c->v.shape[d] != wv[d])
            return attn_fail(ATTN_ERR_SHAPE, "cache: k [%lld, %lld, %lld, %lld] and v [.., %lld], "
                             "expected [B = %lld, Hkv = %lld, Lmax, Dk = %lld] and Dv = %lld",
                             (long long)c->k.shape[0], (long long)c->k.shape[1],
                             (long long)c->k.shape[2], (long long)c->k.shape[3],
                             (long long)c->v.shape[3], (long long)pl->B, (long long)pl->Hkv,
                             (long long)pl->Dk, (long long)pl->Dv);
    TRY(attn_check_output_strides(&c->k, "cache.k", 4));
    TRY(attn_check_output_strides(&c->v, "cache.v", 4));
    if (!c->len) return attn_fail(ATTN_ERR_NULL, "cache.len: NULL");
    for (int64_t b = 0; need_data && b < pl->B; b++)
        if (c->len[b] < 0 || c->len[b] > Lmax - pl->Lq)
            return attn_fail(ATTN_ERR_VALUE, "cache.len[%lld] = %lld: %lld new tokens do not "
                             "fit Lmax = %lld", (long long)b, (long long)c->len[b],
                             (long long)pl->Lq, (long long)Lmax);
    return ATTN_OK;
}

/* rows [B, n, H, D] of the new tokens into cache rows len[b] + i of t [B, H, Lmax, D] */
static void append(const attn_tensor *t, const float *rows, const int64_t *len, int64_t B,
                   int64_t n, int64_t H, int64_t D) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < n; i++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < D; d++)
                    attn_store(t->dtype, t->data,
                               b * t->stride[0] + h * t->stride[1] + (len[b] + i) * t->stride[2] +
                                   d * t->stride[3],
                               rows[((b * n + i) * H + h) * D + d]);
}

static attn_status decode_ws(const mha_plan *pl, const attn_kv_cache *c, const attn_tensor *y,
                             const attn_options *opt_in, mha_ws *w) {
    static const attn_options defaults = {0};
    attn_options opt = opt_in ? *opt_in : defaults;
    if (opt.causal || opt.align != ATTN_ALIGN_TOP_LEFT || opt.kv_len)
        return attn_fail(ATTN_ERR_VALUE, "options.causal, align and kv_len are the decoding "
                         "step's own: leave them unset");
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
        TRY(mha_attend(&q, &c->k, &c->v, &o, NULL, NULL, false, &opt, w));
        if (w->overflow) return attn_fail(ATTN_ERR_OVERFLOW, "workspace size overflows size_t");
        return ATTN_OK;
    }
    for (int64_t b = 0; b < pl->B; b++) kv_len[b] = c->len[b] + pl->Lq;
    mha_qkv_project(pl, &s, c->len);
    append(&c->k, s.k, c->len, pl->B, pl->Lq, pl->Hkv, pl->Dk);
    append(&c->v, s.v, c->len, pl->B, pl->Lq, pl->Hkv, pl->Dv);
    TRY(mha_attend(&q, &c->k, &c->v, &o, NULL, NULL, false, &opt, w));
    mha_out_project(pl, &s, y, &yt);
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
    if (!y) return attn_fail(ATTN_ERR_NULL, "y: tensor pointer is NULL");
    TRY(mha_plan_init(&d.pl, m, x, NULL, y, true));
    TRY(check_cache(&d.pl, cache, true));
    return mha_two_pass(decode_body, &d, opt, NULL);
}
