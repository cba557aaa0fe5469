/*
 * varlen.c — packed (variable-length) batches: attn_varlen_forward, attn_varlen_backward
 *            and their workspace queries (docs/CONTRACT.md, "Packed (variable-length)
 *            batches").
 *
 * What it is: the checks that belong to packing (cu_seqlens, max_seqlen, the options a
 * packed call refuses), then a loop over the sequences, each one the rectangular call
 * of B = 1 on row views of the packed tensors: sequence s is rows [cu_q[s], cu_q[s+1])
 * of q, o, lse (and d_o, dq) and rows [cu_k[s], cu_k[s+1]) of k, v (and dk, dv). The
 * whole call is checked first (the rectangular checks on the packed tensors, as one call
 * of Lq = total_q and Lk = total_k, then the sequences' own sizes), so that a refused
 * call writes nothing; one workspace, the largest any sequence needs, serves them all.
 * Dropout draws each sequence's mask as batch s of the padded call [B, Hq, max_seqlen_q,
 * max_seqlen_k] (attn_drop_layout, attn_internal.h).
 *
 * What it is not: a kernel. The arithmetic is the rectangular call's (forward.c, backward.c)
 * on each sequence, so a packed result is bit for bit the per-sequence call's; the cost
 * is Σ Lq_s·Lk_s plus one call's set-up per sequence.
 */
#include <string.h>

#include "core/alloc.h"
#include "backward/backward.h"

/* ---- the packing's checks -------------------------------------------------------------- */

/* Entry s of a cu_seqlens tensor (ATTN_I32 or ATTN_I64, {B + 1, 1, 1, 1}). */
static int64_t cu_at(const attn_tensor *t, int64_t s) {
    if (t->dtype == ATTN_I32) return ((const int32_t *)t->data)[s * t->stride[0]];
    return ((const int64_t *)t->data)[s * t->stride[0]];
}

/* One cu_seqlens tensor: int32 or int64, shape {n >= 1, 1, 1, 1}, data (always read, by
 * the workspace queries too), entries 0 = cu[0] <= cu[1] <= ... <= cu[n-1] = total and
 * each difference <= max_seqlen. */
static attn_status check_cu(const attn_tensor *t, const char *name, int64_t total,
                            int64_t max_seqlen, const char *max_name) {
    if (!t) return ai_fail(ATTN_ERR_NULL, "%s: tensor pointer is NULL", name);
    if (t->dtype != ATTN_I32 && t->dtype != ATTN_I64)
        return ai_fail(ATTN_ERR_DTYPE, "%s: dtype is %s, expected int32 or int64", name,
                       attn_dtype_name(t->dtype));
    TRY(ai_check_tensor(t, name, t->dtype, true));
    if (t->shape[0] < 1 || t->shape[1] != 1 || t->shape[2] != 1 || t->shape[3] != 1)
        return ai_fail(ATTN_ERR_SHAPE, "%s: shape [%lld, %lld, %lld, %lld], expected "
                       "[B + 1 >= 1, 1, 1, 1]", name, (long long)t->shape[0],
                       (long long)t->shape[1], (long long)t->shape[2], (long long)t->shape[3]);
    if (max_seqlen < 0)
        return ai_fail(ATTN_ERR_VALUE, "%s is %lld, expected >= 0", max_name,
                       (long long)max_seqlen);
    const int64_t n = t->shape[0];
    if (cu_at(t, 0) != 0)
        return ai_fail(ATTN_ERR_VALUE, "%s[0] = %lld, expected 0", name, (long long)cu_at(t, 0));
    for (int64_t s = 0; s + 1 < n; s++) {
        const int64_t a = cu_at(t, s), b = cu_at(t, s + 1);
        if (b < a)
            return ai_fail(ATTN_ERR_VALUE, "%s[%lld] = %lld < %s[%lld] = %lld, expected "
                           "non-decreasing offsets", name, (long long)(s + 1), (long long)b,
                           name, (long long)s, (long long)a);
        if (b > total)  // before b - a, which then cannot overflow
            return ai_fail(ATTN_ERR_VALUE, "%s[%lld] = %lld, beyond the %lld packed rows",
                           name, (long long)(s + 1), (long long)b, (long long)total);
        if (b - a > max_seqlen)
            return ai_fail(ATTN_ERR_VALUE, "sequence %lld has %lld rows (%s), more than %s "
                           "= %lld", (long long)s, (long long)(b - a), name, max_name,
                           (long long)max_seqlen);
    }
    if (cu_at(t, n - 1) != total)
        return ai_fail(ATTN_ERR_VALUE, "%s[%lld] = %lld, expected the packed rows, %lld",
                       name, (long long)(n - 1), (long long)cu_at(t, n - 1), (long long)total);
    return ATTN_OK;
}

/* The options a packed call refuses: each would be a tensor over the padded batch. A
 * paged forward (paged: options.block_table given) takes the block table, kv_len (each
 * sequence's cached keys, FlashAttention's seqused_k) and a bool mask over the padded
 * batch [B, Hq|1, max_seqlen_q, Lk] (Lk = max_pages * page_size, the cache's rows). */
static attn_status refuse_options(const attn_tensor *k, const attn_options *opt, bool paged_ok) {
    static const char *const what = "packed (varlen) calls take no %s (%s)";
    /* a u4 cache's per-key scales would have to be cut per sequence too */
    if (k && k->dtype == ATTN_U4)
        return ai_fail(ATTN_ERR_UNSUPPORTED, what, "u4 cache", "attn_forward reads one");
    if (!opt) return ATTN_OK;
    if (opt->k_zero || opt->v_zero || opt->kv_group)
        return ai_fail(ATTN_ERR_UNSUPPORTED, what, "u4 options", "attn_forward takes them");
    const bool paged = paged_ok && opt->block_table;
    if (opt->mask && !paged)
        return ai_fail(ATTN_ERR_UNSUPPORTED, what, "options.mask",
                       "a [B, Hq, Lq, Lk] tensor; a paged forward takes one");
    if (opt->bias) return ai_fail(ATTN_ERR_UNSUPPORTED, what, "options.bias", "a [B, Hq, Lq, Lk] tensor");
    if (opt->kv_len && !paged)
        return ai_fail(ATTN_ERR_UNSUPPORTED, what, "options.kv_len", "cu_seqlens_k gives the keys");
    if (opt->block_mask)
        return ai_fail(ATTN_ERR_UNSUPPORTED, what, "options.block_mask", "a mask over the padded batch");
    if (opt->score_mod)
        return ai_fail(ATTN_ERR_UNSUPPORTED, what, "options.score_mod",
                       "its indices would be each sequence's own");
    if (opt->block_table && !paged_ok)
        return ai_fail(ATTN_ERR_UNSUPPORTED, what, "options.block_table",
                       "the backward of a paged cache");
    if (opt->weights)
        return ai_fail(ATTN_ERR_UNSUPPORTED, what, "options.weights", "a [B, Hq, Lq, Lk] tensor");
    return ATTN_OK;
}

/* Entry s of a kv_len tensor (ATTN_I32 or ATTN_I64, B entries along dim 0). */
static int64_t len_at(const attn_tensor *t, int64_t s) {
    if (t->dtype == ATTN_I32) return ((const int32_t *)t->data)[s * t->stride[0]];
    return ((const int64_t *)t->data)[s * t->stride[0]];
}

/* A paged call's per-sequence key counts: options.kv_len, int32 or int64 with B entries
 * along dim 0 (shape {B, 1, 1, 1}), each in [0, max_seqlen_k] (data always read); its
 * bound by the cache's rows is each sequence's own call's check. */
static attn_status check_seqused(const attn_tensor *t, int64_t B, int64_t max_k) {
    if (!t)
        return ai_fail(ATTN_ERR_NULL, "options.kv_len: NULL; a paged packed call takes each "
                       "sequence's key count there (seqused_k), cu_seqlens_k NULL");
    if (t->dtype != ATTN_I32 && t->dtype != ATTN_I64)
        return ai_fail(ATTN_ERR_DTYPE, "options.kv_len: dtype is %s, expected int32 or int64",
                       attn_dtype_name(t->dtype));
    TRY(ai_check_tensor(t, "options.kv_len", t->dtype, true));
    if (t->shape[0] != B || t->shape[1] != 1 || t->shape[2] != 1 || t->shape[3] != 1)
        return ai_fail(ATTN_ERR_SHAPE, "options.kv_len: shape [%lld, %lld, %lld, %lld], expected "
                       "[B = %lld, 1, 1, 1]", (long long)t->shape[0], (long long)t->shape[1],
                       (long long)t->shape[2], (long long)t->shape[3], (long long)B);
    if (max_k < 0)
        return ai_fail(ATTN_ERR_VALUE, "max_seqlen_k is %lld, expected >= 0", (long long)max_k);
    for (int64_t s = 0; s < B; s++) {
        const int64_t n = len_at(t, s);
        if (n < 0 || n > max_k)
            return ai_fail(ATTN_ERR_VALUE, "options.kv_len[%lld] = %lld, expected 0 .. "
                           "max_seqlen_k = %lld", (long long)s, (long long)n, (long long)max_k);
    }
    return ATTN_OK;
}

/* The packing itself: q is {1, Hq, total_q, Dk} (the rest follows from the rectangular
 * checks against q), both cu_seqlens sound and of one length; a paged call (paged) has
 * cu_seqlens_k NULL and its key counts in kv_len. *B gets the sequences. */
static attn_status check_packing(const attn_tensor *q, const attn_tensor *k,
                                 const attn_tensor *cu_q, const attn_tensor *cu_k,
                                 int64_t max_q, int64_t max_k, const attn_tensor *kv_len,
                                 bool paged, int64_t *B) {
    if (q->shape[0] != 1)
        return ai_fail(ATTN_ERR_SHAPE, "q: shape[0] is %lld, expected 1 (packed tensors are "
                       "{1, H, total, D})", (long long)q->shape[0]);
    TRY(check_cu(cu_q, "cu_seqlens_q", q->shape[2], max_q, "max_seqlen_q"));
    *B = cu_q->shape[0] - 1;
    if (paged) {
        if (cu_k)
            return ai_fail(ATTN_ERR_VALUE, "cu_seqlens_k: given with options.block_table; a "
                           "paged packed call takes each sequence's key count in "
                           "options.kv_len (seqused_k) and cu_seqlens_k NULL");
        return check_seqused(kv_len, *B, max_k);
    }
    if (cu_k && cu_k->shape[0] != cu_q->shape[0])  // before its entries are read
        return ai_fail(ATTN_ERR_SHAPE, "cu_seqlens_k: %lld entries, expected %lld as "
                       "cu_seqlens_q (B + 1)", (long long)cu_k->shape[0],
                       (long long)cu_q->shape[0]);
    TRY(check_cu(cu_k, "cu_seqlens_k", k->shape[2], max_k, "max_seqlen_k"));
    return ATTN_OK;
}

/* Rows [r0, r0 + n) of a packed tensor (NULL stays NULL). An empty view keeps the data
 * pointer (no path reads it); a q8_0 one starts at a block, as stride[2] is a multiple of
 * 32 whenever there are two rows or more (attn.h). */
static attn_tensor rows(const attn_tensor *t, int64_t r0, int64_t n) {
    attn_tensor v = *t;
    v.shape[2] = n;
    if (n > 0 && r0 > 0 && t->data)
        v.data = (char *)t->data + attn_row_byte_offset(t->dtype, r0 * t->stride[2]);
    return v;
}

/* One sequence's tensors: the row views, and the options pointing at its lse view. */
typedef struct seq_views {
    attn_tensor q, k, v, o, lse, d_o, dq, dk, dv;
    attn_tensor table, len, mask;  /* a paged call's: its row of the block table, its key
                                      count, its rows of the padded mask */
    int64_t len_value;
    attn_options opt;
    attn_drop_layout drop;
    int64_t lq, lk;
} seq_views;

/* t[0..8] = q, k, v, o, lse (opt's in the forward, the argument in the backward), d_o,
 * dq, dk, dv; those of the query rows take cu_q's rows, the others cu_k's. A paged call
 * (opt->block_table; cu_k NULL) keeps the whole page pools as k and v and gives sequence s
 * row s of the block table, kv_len[s] keys and batch s of the padded mask. The views
 * point into sv itself: sv is not copied afterwards. */
static void seq_make(seq_views *sv, const attn_tensor *const t[9], const attn_tensor *cu_q,
                     const attn_tensor *cu_k, int64_t max_q, int64_t max_k,
                     const attn_options *opt, int64_t s) {
    const bool paged = opt && opt->block_table;
    const int64_t q0 = cu_at(cu_q, s), k0 = paged ? 0 : cu_at(cu_k, s);
    sv->lq = cu_at(cu_q, s + 1) - q0;
    sv->lk = paged ? len_at(opt->kv_len, s) : cu_at(cu_k, s + 1) - k0;
    attn_tensor *const out[9] = {&sv->q, &sv->k, &sv->v, &sv->o, &sv->lse,
                                 &sv->d_o, &sv->dq, &sv->dk, &sv->dv};
    static const bool key_rows[9] = {false, true, true, false, false, false, false, true, true};
    for (int x = 0; x < 9; x++)
        if (t[x]) *out[x] = key_rows[x] ? (paged ? *t[x] : rows(t[x], k0, sv->lk)) : rows(t[x], q0, sv->lq);
    sv->opt = opt ? *opt : (attn_options){0};
    sv->drop = (attn_drop_layout){s, max_q, max_k};
    if (!paged) return;
    const attn_tensor *bt = opt->block_table;
    sv->table = *bt;
    sv->table.shape[0] = 1;
    sv->table.data = (char *)bt->data + (size_t)(s * bt->stride[0]) * sizeof(int32_t);
    sv->opt.block_table = &sv->table;
    sv->len_value = sv->lk;
    sv->len = (attn_tensor){&sv->len_value, ATTN_I64, {1, 1, 1, 1}, {1, 1, 1, 1}};
    sv->opt.kv_len = &sv->len;
    if (opt->mask) {  // [B, Hq|1, max_seqlen_q, Lk]: batch s, its first lq rows
        sv->mask = *opt->mask;
        sv->mask.shape[0] = 1;
        sv->mask.shape[2] = sv->lq;
        sv->mask.data = (char *)opt->mask->data + s * opt->mask->stride[0];
        sv->opt.mask = &sv->mask;
    }
}

/* A paged call's padded mask: bool, [B, Hq|1, max_seqlen_q, Lk] with B the sequences and
 * Lk the cache's rows, max_pages * page_size (its data and strides are the rectangular
 * calls' business, on each sequence's view). */
static attn_status check_padded_mask(const attn_options *opt, const attn_tensor *k,
                                     int64_t B, int64_t max_q) {
    const attn_tensor *m = opt->mask;
    if (!m) return ATTN_OK;
    const int64_t lk = opt->block_table->shape[1] * k->shape[2];
    if (m->dtype != ATTN_BOOL)
        return ai_fail(ATTN_ERR_DTYPE, "options.mask: dtype is %s, expected bool",
                       attn_dtype_name(m->dtype));
    if (m->shape[0] != B || m->shape[2] != max_q || m->shape[3] != lk)
        return ai_fail(ATTN_ERR_MASK, "options.mask: shape [%lld, %lld, %lld, %lld], expected "
                       "the padded batch [B = %lld, Hq or 1, max_seqlen_q = %lld, Lk = %lld]",
                       (long long)m->shape[0], (long long)m->shape[1], (long long)m->shape[2],
                       (long long)m->shape[3], (long long)B, (long long)max_q, (long long)lk);
    return ATTN_OK;
}

/* ---- the forward ------------------------------------------------------------------------- */

/* The checks of a forward call, and its workspace: the largest a sequence needs. */
static attn_status forward_plan(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                                const attn_tensor *o, const attn_tensor *cu_q,
                                const attn_tensor *cu_k, int64_t max_q, int64_t max_k,
                                const attn_options *opt, bool need_data, int64_t *B,
                                size_t *need) {
    TRY(refuse_options(k, opt, true));
    const bool paged = opt && opt->block_table;
    attn_params whole;  // the rectangular checks on the packed tensors
    if (paged) {  // q, o, lse and the options against K and V of no key (k, v are pools)
        attn_tensor k0 = *k, v0 = *v;
        k0.shape[0] = v0.shape[0] = 1;
        k0.shape[2] = v0.shape[2] = 0;
        attn_options o0 = *opt;
        o0.block_table = NULL, o0.kv_len = NULL, o0.mask = NULL;
        TRY(ai_params_init(&whole, q, &k0, &v0, o, &o0, need_data));
    } else {
        TRY(ai_params_init(&whole, q, k, v, o, opt, need_data));
    }
    TRY(check_packing(q, k, cu_q, cu_k, max_q, max_k, opt ? opt->kv_len : NULL, paged, B));
    if (paged) TRY(check_padded_mask(opt, k, *B, max_q));
    const attn_tensor *const t[9] = {q, k, v, o, opt ? opt->lse : NULL, NULL, NULL, NULL, NULL};
    *need = 0;
    for (int64_t s = 0; s < *B; s++) {
        seq_views sv;
        seq_make(&sv, t, cu_q, cu_k, max_q, max_k, opt, s);
        if (sv.lq == 0) continue;  // nothing to compute or write
        sv.opt.lse = opt && opt->lse ? &sv.lse : NULL;
        if (paged) {  // every sequence's pool, table row, key count before any writes
            attn_params ps;
            TRY(ai_params_init(&ps, &sv.q, &sv.k, &sv.v, &sv.o, &sv.opt, need_data));
        }
        size_t n;
        TRY(attn_forward_workspace_size(&sv.q, &sv.k, &sv.v, &sv.o, &sv.opt, &n));
        if (n > *need) *need = n;
    }
    return ATTN_OK;
}

attn_status attn_varlen_forward_workspace_size(const attn_tensor *q, const attn_tensor *k,
                                               const attn_tensor *v, const attn_tensor *o,
                                               const attn_tensor *cu_seqlens_q,
                                               const attn_tensor *cu_seqlens_k,
                                               int64_t max_seqlen_q, int64_t max_seqlen_k,
                                               const attn_options *opt, size_t *bytes) {
    if (!bytes) return ai_fail(ATTN_ERR_NULL, "bytes: NULL output pointer");
    int64_t B;
    size_t need;
    TRY(forward_plan(q, k, v, o, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, opt,
                     false, &B, &need));
    *bytes = need;
    return ai_ok();
}

attn_status attn_varlen_forward(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                                const attn_tensor *o, const attn_tensor *cu_seqlens_q,
                                const attn_tensor *cu_seqlens_k, int64_t max_seqlen_q,
                                int64_t max_seqlen_k, const attn_options *opt) {
    int64_t B;
    size_t need;
    TRY(forward_plan(q, k, v, o, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, opt,
                     true, &B, &need));
    /* the outputs against every input, cu_seqlens included, and the workspace */
    TRY(ai_check_forward_aliasing(q, k, v, o, opt, need));
    {
        static const char *const in_names[] = {"cu_seqlens_q", "cu_seqlens_k"};
        static const char *const out_names[] = {"o", "lse"};
        const attn_tensor *in[] = {cu_seqlens_q, cu_seqlens_k};
        const attn_tensor *out[] = {o, opt ? opt->lse : NULL};
        TRY(ai_check_aliasing(in, in_names, 2, out, out_names, 2, opt, need));
    }
    void *ws, *owned;
    TRY(ai_workspace_acquire(opt, need, &ws, &owned));
    const attn_tensor *const t[9] = {q, k, v, o, opt ? opt->lse : NULL, NULL, NULL, NULL, NULL};
    attn_status st = ATTN_OK;
    for (int64_t s = 0; s < B && st == ATTN_OK; s++) {
        seq_views sv;
        seq_make(&sv, t, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, opt, s);
        if (sv.lq == 0) continue;
        sv.opt.lse = opt && opt->lse ? &sv.lse : NULL;
        sv.opt.workspace = ws;
        sv.opt.workspace_bytes = need;
        st = ai_forward_piece(&sv.q, &sv.k, &sv.v, &sv.o, &sv.opt, &sv.drop);
    }
    ai_free(owned);
    return st == ATTN_OK ? ai_ok() : st;
}

/* ---- the backward ------------------------------------------------------------------------
 * Each sequence's call writes its rows of dq, dk, dv (disjoint) and, with d_sinks, its
 * own sinks' gradient into a temporary [Hq] after the sequences' workspace; those are
 * added in sequence order into a second [Hq], then written to d_sinks: the same bits for
 * any thread count, as each sequence's are. */

/* the bytes after the sequences' workspace: two [Hq] float arrays, 64-byte aligned (the
 * 64 cover the alignment) */
static size_t sinks_bytes(const attn_tensor *q, const attn_options *opt) {
    return opt && opt->d_sinks ? 64 + 2 * (size_t)q->shape[1] * sizeof(float) : 0;
}

static attn_status backward_plan(const attn_tensor *const t[9], const attn_tensor *cu_q,
                                 const attn_tensor *cu_k, int64_t max_q, int64_t max_k,
                                 const attn_options *opt, bool need_data, int64_t *B,
                                 size_t *seq_need, size_t *need) {
    TRY(refuse_options(t[1], opt, false));
    /* the rectangular checks on the packed tensors (data and alignment below) */
    size_t unused;
    TRY(attn_backward_workspace_size(t[0], t[1], t[2], t[3], t[5], t[4], t[6], t[7], t[8], opt,
                                     &unused));
    static const char *const names[9] = {"q", "k", "v", "o", "lse", "d_o", "dq", "dk", "dv"};
    for (int x = 0; need_data && x < 9; x++)
        TRY(ai_check_tensor(t[x], names[x], t[x]->dtype, true));
    if (need_data && opt && opt->d_sinks) TRY(ai_check_tensor(opt->d_sinks, "d_sinks", ATTN_F32, true));
    TRY(check_packing(t[0], t[1], cu_q, cu_k, max_q, max_k, NULL, false, B));
    /* a sequence's d_sinks: a stand-in of the right shape (the workspace query reads no
     * data pointer) */
    static _Alignas(64) float g_shape_only[1];
    const attn_tensor ds = {g_shape_only, ATTN_F32, {t[0]->shape[1], 1, 1, 1}, {1, 1, 1, 1}};
    *seq_need = 0;
    for (int64_t s = 0; s < *B; s++) {
        seq_views sv;
        seq_make(&sv, t, cu_q, cu_k, max_q, max_k, opt, s);
        if (sv.lq == 0 && sv.lk == 0) continue;
        sv.opt.d_sinks = opt && opt->d_sinks ? &ds : NULL;
        size_t n;
        TRY(attn_backward_workspace_size(&sv.q, &sv.k, &sv.v, &sv.o, &sv.d_o, &sv.lse, &sv.dq,
                                         &sv.dk, &sv.dv, &sv.opt, &n));
        if (n > *seq_need) *seq_need = n;
    }
    const size_t extra = sinks_bytes(t[0], opt);
    *need = *seq_need > SIZE_MAX - extra ? (size_t)-1 : *seq_need + extra;
    if (*need == (size_t)-1) return ai_fail(ATTN_ERR_OVERFLOW, "workspace size overflows size_t");
    return ATTN_OK;
}

attn_status attn_varlen_backward_workspace_size(
    const attn_tensor *q, const attn_tensor *k, const attn_tensor *v, const attn_tensor *o,
    const attn_tensor *d_o, const attn_tensor *lse, const attn_tensor *dq, const attn_tensor *dk,
    const attn_tensor *dv, const attn_tensor *cu_seqlens_q, const attn_tensor *cu_seqlens_k,
    int64_t max_seqlen_q, int64_t max_seqlen_k, const attn_options *opt, size_t *bytes) {
    if (!bytes) return ai_fail(ATTN_ERR_NULL, "bytes: NULL output pointer");
    const attn_tensor *const t[9] = {q, k, v, o, lse, d_o, dq, dk, dv};
    int64_t B;
    size_t seq_need, need;
    TRY(backward_plan(t, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, opt, false, &B,
                      &seq_need, &need));
    *bytes = need;
    return ai_ok();
}

attn_status attn_varlen_backward(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                                 const attn_tensor *o, const attn_tensor *d_o,
                                 const attn_tensor *lse, const attn_tensor *dq,
                                 const attn_tensor *dk, const attn_tensor *dv,
                                 const attn_tensor *cu_seqlens_q, const attn_tensor *cu_seqlens_k,
                                 int64_t max_seqlen_q, int64_t max_seqlen_k,
                                 const attn_options *opt) {
    const attn_tensor *const t[9] = {q, k, v, o, lse, d_o, dq, dk, dv};
    int64_t B;
    size_t seq_need, need;
    TRY(backward_plan(t, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, opt, true, &B,
                      &seq_need, &need));
    const attn_tensor *const bt[8] = {q, k, v, o, d_o, dq, dk, dv};
    TRY(ai_check_backward_aliasing(bt, lse, opt, need));
    {
        static const char *const in_names[] = {"cu_seqlens_q", "cu_seqlens_k"};
        static const char *const out_names[] = {"dq", "dk", "dv", "d_sinks"};
        const attn_tensor *in[] = {cu_seqlens_q, cu_seqlens_k};
        const attn_tensor *out[] = {dq, dk, dv, opt ? opt->d_sinks : NULL};
        TRY(ai_check_aliasing(in, in_names, 2, out, out_names, 4, opt, need));
    }
    void *ws, *owned;
    TRY(ai_workspace_acquire(opt, need, &ws, &owned));
    const int64_t Hq = q->shape[1];
    const bool sinks = opt && opt->d_sinks;
    float *ds_seq = NULL, *ds_sum = NULL;  // (Hq) each
    attn_tensor ds = {0};
    if (sinks) {
        ds_seq = (float *)(((uintptr_t)ws + seq_need + 63) & ~(uintptr_t)63);
        ds_sum = ds_seq + Hq;
        for (int64_t h = 0; h < Hq; h++) ds_sum[h] = 0.0f;
        ds = (attn_tensor){ds_seq, ATTN_F32, {Hq, 1, 1, 1}, {1, 1, 1, 1}};
    }
    attn_status st = ATTN_OK;
    for (int64_t s = 0; s < B && st == ATTN_OK; s++) {
        seq_views sv;
        seq_make(&sv, t, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, opt, s);
        if (sv.lq == 0 && sv.lk == 0) continue;  // no row of any output
        sv.opt.workspace = ws;
        sv.opt.workspace_bytes = seq_need;
        sv.opt.d_sinks = sinks ? &ds : NULL;
        if (sinks)
            for (int64_t h = 0; h < Hq; h++) ds_seq[h] = 0.0f;
        st = ai_backward_piece(&sv.q, &sv.k, &sv.v, &sv.o, &sv.d_o, &sv.lse, &sv.dq, &sv.dk,
                               &sv.dv, &sv.opt, &sv.drop);
        if (sinks)
            for (int64_t h = 0; h < Hq; h++) ds_sum[h] += ds_seq[h];
    }
    if (st == ATTN_OK && sinks) {
        float *d = (float *)opt->d_sinks->data;  // (Hq), stride[0]
        for (int64_t h = 0; h < Hq; h++) d[h * opt->d_sinks->stride[0]] = ds_sum[h];
    }
    ai_free(owned);
    return st == ATTN_OK ? ai_ok() : st;
}
