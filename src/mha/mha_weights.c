/*
 * mha_weights.c — the multi-head module's attention with its weights averaged over the
 *                 heads (need_weights with average_attn_weights): mha_attend_average.
 *
 * The heads' attention runs one batch row at a time, on a chunk of its query heads at
 * once, its weights [1, hc, Lq, Lk] written to a scratch that the reduction reads back
 * while it is still in the cache (hc · Lq · Lk within MHA_AVG_CHUNK floats, 4 MiB, when
 * one GQA group fits: for BERT's 512 x 512 four heads per call); the reduction
 * sums the chunk's heads in head order onto the batch row's running sum and, after the
 * last chunk, scales by 1 / Hq into the output. Every element is
 *     ((w_0 + w_1) + ... + w_{Hq-1}) · (1 / Hq)
 * in that order whatever the chunking or the thread count, so the result does not
 * depend on either.
 *
 * Scratch: hc · Lq · Lk floats for the chunk and Lq · Lk for the running sum (none when
 * one chunk holds every head), hc the largest multiple of the GQA group (at least one
 * group) within max(2B - 1, 1) heads and MHA_AVG_CHUNK floats (so no more than the
 * 2 · B · Lq · Lk of a head-at-a-time reduction), plus one attention workspace.
 *
 * What it is not: a second attention (each chunk is attn_forward on views of the
 * module's projections, its masks, biases, slopes, sinks and LSE narrowed to the chunk).
 */
#include <string.h>

#include "mha_ws.h"

/* the floats of a chunk's weights the reduction reads back from the cache (4 MiB, in L3):
 * 1 MiB gave BERT's 512 x 512 one head a call, too few blocks of rows to keep every thread
 * busy; 4 heads a call make enough (docs/KERNELS.md, "The weights output") */
#define MHA_AVG_CHUNK ((int64_t)1 << 20)

/* t narrowed to [i0, i0 + n) on dim (when that dim is not broadcast) */
static attn_tensor narrow(const attn_tensor *t, int dim, int64_t i0, int64_t n) {
    attn_tensor s = *t;
    if (s.shape[dim] != 1) {
        /* the count-only pass (mha_two_pass) has no data yet: NULL + an offset, even 0, is
         * undefined behaviour (clang's UBSan reports it) */
        if (s.data)
            s.data = (char *)s.data + (size_t)(i0 * s.stride[dim]) * attn_dtype_size(t->dtype);
        s.shape[dim] = n;
    }
    return s;
}

/* kv_len's entries in [0, Lk], checked before any batch row is written (attn_forward
 * checks each row's own when it runs) */
static attn_status check_kv_len(const attn_tensor *t, int64_t B, int64_t Lk) {
    if (!t || !t->data || (t->dtype != ATTN_I32 && t->dtype != ATTN_I64)) return ATTN_OK;
    for (int64_t b = 0; b < B && t->shape[0] == B; b++) {
        const char *p = (const char *)t->data + (size_t)(b * t->stride[0]) * attn_dtype_size(t->dtype);
        int64_t n;
        if (t->dtype == ATTN_I32) {
            int32_t v;
            memcpy(&v, p, sizeof v);
            n = v;
        } else {
            memcpy(&n, p, sizeof n);
        }
        if (n < 0 || n > Lk)
            return ai_fail(ATTN_ERR_VALUE, "kv_len[%lld] = %lld, expected 0 <= kv_len <= "
                           "Lk = %lld", (long long)b, (long long)n, (long long)Lk);
    }
    return ATTN_OK;
}

/* The chunk (batch row b, query heads [h0, h0 + hc)) of every operand. */
typedef struct chunk {
    attn_tensor q, k, v, o, lse, mask, bias, kv_len, slopes, sinks, w;
    attn_options opt;
} chunk;

static void chunk_views(chunk *c, const attn_tensor *q, const attn_tensor *k,
                        const attn_tensor *v, const attn_tensor *o, const attn_tensor *lse,
                        const attn_options *opt, int64_t b, int64_t h0, int64_t hc,
                        int64_t group, float *part) {
    const int64_t Lq = q->shape[2], Lk = k->shape[2];
    attn_tensor t;
    t = narrow(q, 0, b, 1), c->q = narrow(&t, 1, h0, hc);
    t = narrow(o, 0, b, 1), c->o = narrow(&t, 1, h0, hc);
    t = narrow(k, 0, b, 1), c->k = narrow(&t, 1, h0 / group, hc / group);
    t = narrow(v, 0, b, 1), c->v = narrow(&t, 1, h0 / group, hc / group);
    c->w = attn_tensor_4d(part, ATTN_F32, 1, hc, Lq, Lk);
    c->opt = *opt;
    c->opt.weights = &c->w;
    if (lse) {
        t = narrow(lse, 0, b, 1), c->lse = narrow(&t, 1, h0, hc);
        c->opt.lse = &c->lse;
    }
    if (opt->mask) {
        t = narrow(opt->mask, 0, b, 1), c->mask = narrow(&t, 1, h0, hc);
        c->opt.mask = &c->mask;
    }
    if (opt->bias) {
        t = narrow(opt->bias, 0, b, 1), c->bias = narrow(&t, 1, h0, hc);
        c->opt.bias = &c->bias;
    }
    if (opt->kv_len) {
        c->kv_len = narrow(opt->kv_len, 0, b, 1);
        c->opt.kv_len = &c->kv_len;
    }
    if (opt->alibi_slopes) {
        c->slopes = narrow(opt->alibi_slopes, 0, h0, hc);
        c->opt.alibi_slopes = &c->slopes;
    }
    if (opt->sinks) {
        c->sinks = narrow(opt->sinks, 0, h0, hc);
        c->opt.sinks = &c->sinks;
    }
}

/* acc[i, :] (+)= part[0 .. hc)[i, :] in head order; last: out[i, :] = that · inv.
 * first: acc holds nothing yet. acc may be NULL when first and last. */
static void reduce(const float *part, int64_t hc, int64_t Lq, int64_t Lk, float *acc,
                   bool first, bool last, float inv, float *out, int64_t so_i, int64_t so_j) {
    const int64_t plane = Lq * Lk;
#pragma omp parallel for schedule(static) if (hc * plane > (1 << 16))
    for (int64_t i = 0; i < Lq; i++) {
        float row[256];
        for (int64_t j0 = 0; j0 < Lk; j0 += 256) {
            const int64_t n = Lk - j0 < 256 ? Lk - j0 : 256;
            const float *p = part + i * Lk + j0;
            if (first) memcpy(row, p, (size_t)n * sizeof(float));
            else memcpy(row, acc + i * Lk + j0, (size_t)n * sizeof(float));
            for (int64_t h = first ? 1 : 0; h < hc; h++) {
                const float *ph = p + h * plane;
#pragma omp simd
                for (int64_t j = 0; j < n; j++) row[j] += ph[j];
            }
            if (last) {
                float *o_i = out + i * so_i + j0 * so_j;
#pragma omp simd
                for (int64_t j = 0; j < n; j++) o_i[j * so_j] = row[j] * inv;
            } else {
                memcpy(acc + i * Lk + j0, row, (size_t)n * sizeof(float));
            }
        }
    }
}

attn_status mha_attend_average(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                               const attn_tensor *o, const attn_tensor *lse,
                               const attn_tensor *weights, const attn_options *opt, mha_ws *w) {
    const int64_t B = q->shape[0], Hq = q->shape[1], Lq = q->shape[2], Lk = k->shape[2];
    const int64_t group = Hq / k->shape[1];
    int64_t hc = 2 * B - 1 > 1 ? 2 * B - 1 : 1;
    const int64_t plane = Lq * Lk > 1 ? Lq * Lk : 1;
    if (hc > MHA_AVG_CHUNK / plane) hc = MHA_AVG_CHUNK / plane;
    hc = hc < Hq ? hc : Hq;
    hc = hc / group * group;
    if (hc < group) hc = group;
    const bool one_chunk = hc == Hq;
    float *part = mha_take(w, hc * Lq * Lk);
    float *acc = one_chunk ? NULL : mha_take(w, Lq * Lk);
    /* the whole call's arguments checked as one attention over every batch row and head
     * (the chunks see only their own slices of them) */
    attn_options all = *opt;
    all.weights = NULL;
    size_t need = 0;
    TRY(attn_forward_workspace_size(q, k, v, o, &all, &need));
    need = 0;
    /* every chunk but a shorter last one has hc heads: the larger of the two sizes */
    for (int pass = 0; pass < 2; pass++) {
        const int64_t h0 = pass == 0 ? 0 : (Hq - 1) / hc * hc, n = pass == 0 ? hc : Hq - h0;
        chunk c;
        size_t got;
        chunk_views(&c, q, k, v, o, lse, opt, 0, h0, n, group, part);
        TRY(attn_forward_workspace_size(&c.q, &c.k, &c.v, &c.o, &c.opt, &got));
        need = got > need ? got : need;
    }
    void *chunk_ws = mha_take(w, (int64_t)((need + 3) / 4));
    if (w->count_only) return ATTN_OK;
    TRY(check_kv_len(opt->kv_len, B, Lk));
    const float inv = 1.0f / (float)Hq;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h0 = 0; h0 < Hq; h0 += hc) {
            const int64_t n = Hq - h0 < hc ? Hq - h0 : hc;
            chunk c;
            chunk_views(&c, q, k, v, o, lse, opt, b, h0, n, group, part);
            c.opt.workspace = chunk_ws;
            c.opt.workspace_bytes = need;
            TRY(attn_forward(&c.q, &c.k, &c.v, &c.o, &c.opt));
            float *out = (float *)weights->data + b * weights->stride[0];
            reduce(part, n, Lq, Lk, acc, h0 == 0, h0 + n == Hq, inv, out, weights->stride[2],
                   weights->stride[3]);
        }
    return ATTN_OK;
}
