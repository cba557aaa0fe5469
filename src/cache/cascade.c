/*
 * cascade.c — shared-prefix (cascade) attention: B sequences whose keys are one shared
 *             prefix followed by each sequence's own suffix, computed as two attn_forward
 *             calls and one attn_merge.
 *
 *   prefix call   the B·Lq query rows of every sequence seen as the rows of one batch,
 *                 q' [1, Hq, B·Lq, Dk] (a view when the strides allow, else a copy),
 *                 against the prefix k [1, Hkv, P, Dk]: each prefix key and value is
 *                 streamed once for all B sequences (and, by the fused path's grouping,
 *                 for the Hq / Hkv query heads of its key/value head)
 *   suffix call   q [B, Hq, Lq, Dk] against the suffixes k [B, Hkv, S, Dk] (kv_len and
 *                 a block table as attn_forward takes them), bottom-right causal if asked
 *   merge         the two partials' (O, LSE) and, with sinks, the sink as a third partial
 *                 (O = 0, LSE = sink_h), so that each sink counts once per row
 *
 * The partials are float32 in the workspace. What is not here: any arithmetic of its own
 * (attn_forward and attn_merge do it all) or masks that would have to be cut in two
 * (mask, bias, ALiBi, windows, weights, dropout: refused). docs/CONTRACT.md, "Shared-prefix
 * (cascade) attention".
 */
#include <string.h>

#include "core/alloc.h"
#include "core/attn_internal.h"

static size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }

/* A part (prefix or suffix) that is present: NULL, or k NULL, means none. */
static bool present(const attn_cascade_kv *kv) { return kv && (kv->k || kv->v); }

/* What one call is cut into: the views of the two sub-calls and the workspace's layout. */
typedef struct cascade_plan {
    int64_t B, Hq, Lq, Dk, Dv, rows;  // rows = B·Lq, the prefix call's query rows
    bool q_copy;                      // q' is a copy (q's strides do not flatten (b, i))
    attn_tensor qp;                   // q' [1, Hq, B·Lq, Dk]
    attn_tensor o_pre, lse_pre;       // [1, Hq, B·Lq, Dv], [1, Hq, B·Lq, 1] (dense)
    attn_tensor o_suf, lse_suf;       // [B, Hq, Lq, Dv], [B, Hq, Lq, 1] (dense)
    attn_options opt_pre, opt_suf;    // the sub-calls' options (workspace filled later)
    size_t off_o_pre, off_lse_pre, off_o_suf, off_lse_suf, off_zero, off_q, off_sub;
    size_t sub_bytes, total;
} cascade_plan;

static attn_status refuse_options(const attn_options *opt) {
    if (opt->mask || opt->bias || opt->alibi_slopes || opt->block_mask || opt->score_mod ||
        opt->key_scores)
        return ai_fail(ATTN_ERR_UNSUPPORTED, "cascade: options.mask, bias, alibi_slopes, "
                       "block_mask, score_mod and key_scores are not supported (they would "
                       "be cut between prefix and suffix)");
    if (opt->has_window)
        return ai_fail(ATTN_ERR_UNSUPPORTED, "cascade: a sliding window is not supported");
    if (opt->weights)
        return ai_fail(ATTN_ERR_UNSUPPORTED, "cascade: the weights output is not supported");
    if (opt->dropout_p != 0.0f)
        return ai_fail(ATTN_ERR_UNSUPPORTED, "cascade: dropout is not supported");
    if (opt->kv_len || opt->block_table)
        return ai_fail(ATTN_ERR_VALUE, "cascade: options.kv_len and options.block_table must be "
                       "NULL (the prefix's and the suffixes' own are in attn_cascade_kv)");
    if (opt->d_sinks)
        return ai_fail(ATTN_ERR_VALUE, "cascade: options.d_sinks must be NULL (a forward call)");
    if (opt->causal && opt->align != ATTN_ALIGN_BOTTOM_RIGHT)
        return ai_fail(ATTN_ERR_UNSUPPORTED, "cascade: causal needs align = "
                       "ATTN_ALIGN_BOTTOM_RIGHT (the queries are the last rows of each sequence)");
    return ATTN_OK;
}

/* Fills the plan from the arguments (no data pointer is read). */
static attn_status make_plan(const attn_tensor *q, const attn_cascade_kv *prefix,
                             const attn_cascade_kv *suffix, const attn_tensor *o,
                             const attn_options *opt, bool need_data, cascade_plan *c) {
    memset(c, 0, sizeof *c);
    TRY(refuse_options(opt));
    TRY(ai_check_tensor(q, "q", ATTN_DTYPE_COUNT, need_data));
    TRY(ai_check_tensor(o, "o", ATTN_DTYPE_COUNT, need_data));
    TRY(ai_check_output_strides(o, "o", 4));
    const int64_t B = q->shape[0], Hq = q->shape[1], Lq = q->shape[2], Dk = q->shape[3];
    const int64_t Dv = o->shape[3];
    if (o->shape[0] != B || o->shape[1] != Hq || o->shape[2] != Lq)
        return ai_fail(ATTN_ERR_SHAPE, "cascade: o is [%lld, %lld, %lld, %lld], expected [B, Hq, "
                       "Lq] = [%lld, %lld, %lld] first", (long long)o->shape[0],
                       (long long)o->shape[1], (long long)o->shape[2], (long long)o->shape[3],
                       (long long)B, (long long)Hq, (long long)Lq);
    if (present(prefix)) {
        if (!prefix->k || !prefix->v)
            return ai_fail(ATTN_ERR_NULL, "cascade: prefix->%s is NULL", prefix->k ? "v" : "k");
        const attn_tensor *batch = prefix->block_table ? prefix->block_table : prefix->k;
        if (batch->shape[0] != 1)
            return ai_fail(ATTN_ERR_SHAPE, "cascade: the prefix's %s has shape[0] = %lld, "
                           "expected 1 (one prefix shared by the batch)",
                           prefix->block_table ? "block table" : "k", (long long)batch->shape[0]);
        if (prefix->kv_len && prefix->kv_len->shape[0] != 1)
            return ai_fail(ATTN_ERR_SHAPE, "cascade: prefix->kv_len has shape[0] = %lld, expected 1",
                           (long long)prefix->kv_len->shape[0]);
    }
    if (present(suffix) && (!suffix->k || !suffix->v))
        return ai_fail(ATTN_ERR_NULL, "cascade: suffix->%s is NULL", suffix->k ? "v" : "k");
    /* a u4 cache's scales and zeros are per key: one set could not serve both parts */
    if ((prefix && prefix->k && prefix->k->dtype == ATTN_U4) ||
        (suffix && suffix->k && suffix->k->dtype == ATTN_U4) ||
        opt->k_zero || opt->v_zero || opt->kv_group)
        return ai_fail(ATTN_ERR_UNSUPPORTED, "cascade: a u4 cache is read by attn_forward "
                       "only (its parts merged with attn_merge)");
    if (opt->sinks) {
        TRY(ai_check_tensor(opt->sinks, "sinks", ATTN_F32, need_data));
        if (opt->sinks->shape[0] != Hq || opt->sinks->shape[1] != 1 || opt->sinks->shape[2] != 1 ||
            opt->sinks->shape[3] != 1)
            return ai_fail(ATTN_ERR_SHAPE, "sinks: shape is [%lld, %lld, %lld, %lld], expected "
                           "[Hq, 1, 1, 1] = [%lld, 1, 1, 1]", (long long)opt->sinks->shape[0],
                           (long long)opt->sinks->shape[1], (long long)opt->sinks->shape[2],
                           (long long)opt->sinks->shape[3], (long long)Hq);
    }
    int64_t rows, n_o, n_q;
    if (__builtin_mul_overflow(B, Lq, &rows) || __builtin_mul_overflow(rows, Hq, &n_q) ||
        __builtin_mul_overflow(n_q, Dv, &n_o) || __builtin_mul_overflow(n_q, Dk, &n_q))
        return ai_fail(ATTN_ERR_OVERFLOW, "cascade: B·Hq·Lq·D overflows int64");
    c->B = B, c->Hq = Hq, c->Lq = Lq, c->Dk = Dk, c->Dv = Dv, c->rows = rows;

    /* q' = the rows (b, i) of each head as one run of B·Lq rows: a view when row (b, i)
     * lies at b·s0 + i·s2 = (b·Lq + i)·s2, or when one of the two indices is fixed */
    const int64_t *s = q->stride;
    int64_t row_s = s[2];
    if (Lq == 1) row_s = s[0];
    c->q_copy = !(B <= 1 || Lq == 1 || s[0] == Lq * s[2]);
    c->qp = (attn_tensor){q->data, q->dtype, {1, Hq, rows, Dk}, {0, s[1], row_s, s[3]}};
    if (c->q_copy) c->qp.stride[0] = 0, c->qp.stride[1] = rows * Dk, c->qp.stride[2] = Dk,
                   c->qp.stride[3] = 1;

    /* the workspace: partials, the sink partial's zero vector, q', the sub-calls' own */
    size_t at = 0;
    const size_t fo = (size_t)n_o * sizeof(float), fl = (size_t)(rows * Hq) * sizeof(float);
    c->off_o_pre = at, at += round64(fo);
    c->off_lse_pre = at, at += round64(fl);
    c->off_o_suf = at, at += round64(fo);
    c->off_lse_suf = at, at += round64(fl);
    c->off_zero = at, at += opt->sinks ? round64((size_t)Dv * sizeof(float)) : 0;
    c->off_q = at, at += c->q_copy ? round64((size_t)n_q * (size_t)attn_elem_bytes(q->dtype)) : 0;
    c->off_sub = at;
    c->o_pre = attn_tensor_4d(NULL, ATTN_F32, 1, Hq, rows, Dv);
    c->lse_pre = attn_tensor_4d(NULL, ATTN_F32, 1, Hq, rows, 1);
    c->o_suf = attn_tensor_4d(NULL, ATTN_F32, B, Hq, Lq, Dv);
    c->lse_suf = attn_tensor_4d(NULL, ATTN_F32, B, Hq, Lq, 1);

    /* the sub-calls: opt's scale, softcap, path, precision, threads; no sinks (folded
     * once, in the merge); each its own keys; the prefix never causal (see the check in
     * attn_cascade_forward: every row sees the whole prefix) */
    attn_options base = *opt;
    base.sinks = NULL, base.lse = NULL, base.workspace = NULL, base.workspace_bytes = 0;
    c->opt_pre = base, c->opt_suf = base;
    c->opt_pre.causal = false;
    c->opt_pre.lse = &c->lse_pre, c->opt_suf.lse = &c->lse_suf;
    size_t ws_pre = 0, ws_suf = 0;
    if (present(prefix)) {
        c->opt_pre.kv_len = prefix->kv_len, c->opt_pre.block_table = prefix->block_table;
        TRY(attn_forward_workspace_size(&c->qp, prefix->k, prefix->v, &c->o_pre, &c->opt_pre, &ws_pre));
    }
    if (present(suffix)) {
        c->opt_suf.kv_len = suffix->kv_len, c->opt_suf.block_table = suffix->block_table;
        TRY(attn_forward_workspace_size(q, suffix->k, suffix->v, &c->o_suf, &c->opt_suf, &ws_suf));
    }
    c->sub_bytes = ws_pre > ws_suf ? ws_pre : ws_suf;
    if (c->sub_bytes > SIZE_MAX - at - 64)
        return ai_fail(ATTN_ERR_OVERFLOW, "cascade: workspace size overflows size_t");
    c->total = at + round64(c->sub_bytes);
    return ATTN_OK;
}

attn_status attn_cascade_forward_workspace_size(const attn_tensor *q, const attn_cascade_kv *prefix,
                                                const attn_cascade_kv *suffix, const attn_tensor *o,
                                                const attn_options *opt, size_t *bytes) {
    if (!bytes) return ai_fail(ATTN_ERR_NULL, "bytes: NULL output pointer");
    const attn_options none = {0};
    cascade_plan c;
    TRY(make_plan(q, prefix, suffix, o, opt ? opt : &none, false, &c));
    *bytes = c.total;
    ai_fail(ATTN_OK, "%s", "");
    return ATTN_OK;
}

/* A byte range as a view, for the overlap test of the workspace. */
static attn_tensor bytes_view(void *p, size_t n) {
    return (attn_tensor){p, ATTN_BOOL, {(int64_t)n, 1, 1, 1}, {1, 1, 1, 1}};
}

/* o, lse and a caller's workspace overlap no input and no other of the three (the
 * sub-calls check their own arguments again; the copy of q is written before the prefix
 * call's check, so the workspace is checked here). */
static attn_status check_aliasing(const attn_tensor *q, const attn_cascade_kv *prefix,
                                  const attn_cascade_kv *suffix, const attn_tensor *o,
                                  const attn_options *opt, const attn_tensor *ws) {
    const attn_tensor *in[10] = {q, opt->sinks};
    int n = 2;
    const attn_cascade_kv *parts[2] = {present(prefix) ? prefix : NULL, present(suffix) ? suffix : NULL};
    for (int p = 0; p < 2; p++)
        if (parts[p]) {
            in[n++] = parts[p]->k, in[n++] = parts[p]->v;
            in[n++] = parts[p]->block_table, in[n++] = parts[p]->kv_len;
        }
    const attn_tensor *out[3] = {o, opt->lse, ws};
    static const char *const names[3] = {"o", "options.lse", "options.workspace"};
    for (int a = 0; a < 3; a++) {
        if (!out[a]) continue;
        for (int b = 0; b < n; b++)
            if (in[b] && ai_views_overlap(out[a], in[b]))
                return ai_fail(ATTN_ERR_STRIDE, "cascade: %s overlaps an input", names[a]);
        for (int b = a + 1; b < 3; b++)
            if (out[b] && ai_views_overlap(out[a], out[b]))
                return ai_fail(ATTN_ERR_STRIDE, "cascade: %s overlaps %s", names[a], names[b]);
    }
    return ATTN_OK;
}

attn_status attn_cascade_forward(const attn_tensor *q, const attn_cascade_kv *prefix,
                                 const attn_cascade_kv *suffix, const attn_tensor *o,
                                 const attn_options *opt) {
    const attn_options none = {0};
    if (!opt) opt = &none;
    cascade_plan c;
    TRY(make_plan(q, prefix, suffix, o, opt, true, &c));
    if (opt->lse) {  // attn_merge checks it too, after the sub-calls: refused before them
        TRY(ai_check_tensor(opt->lse, "lse", ATTN_F32, true));
        if (opt->lse->shape[0] != c.B || opt->lse->shape[1] != c.Hq || opt->lse->shape[2] != c.Lq ||
            opt->lse->shape[3] != 1)
            return ai_fail(ATTN_ERR_SHAPE, "lse: expected shape [B, Hq, Lq, 1]");
        TRY(ai_check_output_strides(opt->lse, "lse", 3));
    }
    void *ws, *owned;
    TRY(ai_workspace_acquire(opt, c.total, &ws, &owned));
    const attn_tensor ws_view = bytes_view(ws, c.total);
    attn_status st = check_aliasing(q, prefix, suffix, o, opt, opt->workspace ? &ws_view : NULL);
    if (st != ATTN_OK) goto done;
    char *w = ws;
    c.o_pre.data = w + c.off_o_pre, c.lse_pre.data = w + c.off_lse_pre;
    c.o_suf.data = w + c.off_o_suf, c.lse_suf.data = w + c.off_lse_suf;
    c.opt_pre.workspace = c.opt_suf.workspace = w + c.off_sub;
    c.opt_pre.workspace_bytes = c.opt_suf.workspace_bytes = c.sub_bytes;

    /* the partials in the order of the merge: prefix, suffix, sink */
    attn_tensor parts_o[3], parts_lse[3];
    int64_t n = 0;
    if (present(suffix)) {  // first: it checks kv_len, which the causal check below reads
        st = attn_forward(q, suffix->k, suffix->v, &c.o_suf, &c.opt_suf);
        if (st != ATTN_OK) goto done;
    }
    if (present(prefix)) {
        /* causal, bottom-right over [prefix; suffix_b]: row i's diagonal is
         * i + P + S_b - Lq, so it sees the whole prefix iff S_b >= Lq - 1 - i; all rows do
         * iff S_b >= Lq - 1. The suffix call accepted kv_len, so reading it is safe. */
        if (opt->causal && c.Lq > 1 && c.B > 0) {
            for (int64_t b = 0; b < c.B; b++) {
                int64_t s_b = 0;
                if (present(suffix)) {
                    const attn_tensor *kl = suffix->kv_len;
                    s_b = !kl ? suffix->k->shape[2] * (suffix->block_table ? suffix->block_table->shape[1] : 1)
                        : kl->dtype == ATTN_I32 ? ((const int32_t *)kl->data)[b * kl->stride[0]]
                                                : ((const int64_t *)kl->data)[b * kl->stride[0]];
                }
                if (s_b < c.Lq - 1) {
                    st = ai_fail(ATTN_ERR_UNSUPPORTED, "cascade: causal with sequence %lld's "
                                 "suffix of %lld keys under Lq = %lld query rows: its first rows "
                                 "would see only part of the prefix (needs S_b >= Lq - 1)",
                                 (long long)b, (long long)s_b, (long long)c.Lq);
                    goto done;
                }
            }
        }
        if (c.q_copy && c.rows > 0 && c.Hq > 0 && c.Dk > 0) {
            /* q' [Hq, B·Lq, Dk] dense, element by element in q's own dtype */
            const int64_t es = attn_elem_bytes(q->dtype);
            char *dst = w + c.off_q;
            const char *src = q->data;
            for (int64_t h = 0; h < c.Hq; h++)
                for (int64_t b = 0; b < c.B; b++)
                    for (int64_t i = 0; i < c.Lq; i++)
                        for (int64_t d = 0; d < c.Dk; d++, dst += es)
                            memcpy(dst, src + (b * q->stride[0] + h * q->stride[1] + i * q->stride[2] +
                                               d * q->stride[3]) * es, (size_t)es);
            c.qp.data = w + c.off_q;
        }
        st = attn_forward(&c.qp, prefix->k, prefix->v, &c.o_pre, &c.opt_pre);
        if (st != ATTN_OK) goto done;
        /* the same partial as [B, Hq, Lq, ·]: row (b, i) of head h is row b·Lq + i */
        attn_tensor po = c.o_pre, pl = c.lse_pre;
        po.shape[0] = pl.shape[0] = c.B, po.shape[2] = pl.shape[2] = c.Lq;
        po.stride[0] = c.Lq * c.Dv, po.stride[1] = c.rows * c.Dv, po.stride[2] = c.Dv;
        pl.stride[0] = c.Lq, pl.stride[1] = c.rows, pl.stride[2] = 1;
        parts_o[n] = po, parts_lse[n] = pl, n++;
    }
    if (present(suffix)) parts_o[n] = c.o_suf, parts_lse[n] = c.lse_suf, n++;
    if (opt->sinks) {
        /* the sink of head h as one more partial of every row: LSE = sink_h, O = 0 */
        float *zero = (float *)(w + c.off_zero);
        memset(zero, 0, (size_t)c.Dv * sizeof(float));
        parts_o[n] = (attn_tensor){zero, ATTN_F32, {c.B, c.Hq, c.Lq, c.Dv}, {0, 0, 0, 1}};
        parts_lse[n] = (attn_tensor){opt->sinks->data, ATTN_F32, {c.B, c.Hq, c.Lq, 1},
                                     {0, opt->sinks->stride[0], 0, 0}};
        n++;
    }
    st = attn_merge(n, parts_o, parts_lse, o, opt->lse, opt->threads);
done:
    ai_free(owned);
    return st;
}
