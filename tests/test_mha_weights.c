/*
 * test_mha_weights.c — the multi-head module's weights averaged over heads
 *                      (attn_mha_forward with average_weights, mha_weights.c) against the
 *                      same call's per-head weights.
 *
 * What it covers:
 *  1. Bit for bit: the averaged weights equal ((w_0 + w_1) + ... + w_{Hq-1}) · (1 / Hq) in
 *     float32 of the per-head weights that attn_mha_forward writes for the same layer,
 *     and y is the same bits with either weights output; over the chunkings the module
 *     takes (one head per chunk, a short last chunk, GQA groups, every head in one chunk)
 *     and the options narrowed per batch row and head chunk (a [B, Hq] bool mask, a
 *     [1, Hq] float bias, kv_len, causal bottom-right, ALiBi slopes, sinks).
 *  2. The same bits for 1, 2 and 3 threads; a weights output with padded rows (the
 *     padding left as it was).
 *  3. A kv_len out of range in the last batch row: the status, and the weights not
 *     written.
 *  4. The planted-error check: one averaged weight changed by one ulp is found.
 * What it is not: the weights against the float64 oracle (test_mha.c does that, per head
 * and averaged).
 */
#include "mha/mha.h"
#include "mha_ref.h"

typedef struct wcase {
    int64_t B, Hq, Hkv;
    int opts;  /* 0 none, 1 mask + bias + kv_len + causal, 2 ALiBi + sinks */
    int64_t Lq, Lk;  /* 0: 7 and 11 */
} wcase;

/* count of elements of got [B, Lq, Lk] (rows ld apart) that differ from want in bits */
static int64_t bit_mismatches(const float *got, int64_t ld, const float *want, int64_t B,
                              int64_t Lq, int64_t Lk) {
    int64_t bad = 0;
    for (int64_t r = 0; r < B * Lq; r++)
        for (int64_t j = 0; j < Lk; j++)
            bad += memcmp(&got[r * ld + j], &want[r * Lk + j], sizeof(float)) != 0;
    return bad;
}

static void run(const wcase *w, uint64_t seed) {
    mcase c = {.B = w->B, .Lq = w->Lq ? w->Lq : 7, .Lk = w->Lk ? w->Lk : 11, .E = 16, .Ekv = 12, .Hq = w->Hq, .Hkv = w->Hkv,
               .Dk = 4, .Dv = 6, .bias = true, .seed = seed};
    mlayer l;
    mlayer_build(&l, &c);
    const int64_t B = c.B, Hq = c.Hq, Lq = c.Lq, Lk = c.Lk;
    rng_t r = {seed * 7 + 1};
    bool *mask = xcalloc(B * Hq * Lq * Lk, 1);
    float *bias = xcalloc(Hq * Lq * Lk, sizeof(float)), *slopes = xcalloc(Hq, sizeof(float));
    float *sinks = xcalloc(Hq, sizeof(float));
    int64_t *lens = xcalloc(B, sizeof(int64_t));
    for (int64_t e = 0; e < B * Hq * Lq * Lk; e++) mask[e] = rng_sym(&r) > -0.6;
    for (int64_t e = 0; e < Hq * Lq * Lk; e++) bias[e] = (float)rng_sym(&r);
    for (int64_t h = 0; h < Hq; h++) slopes[h] = 0.1f * (float)(h + 1), sinks[h] = (float)rng_sym(&r);
    for (int64_t b = 0; b < B; b++) lens[b] = Lk - (b * 3) % Lk;
    attn_tensor tm = attn_tensor_4d(mask, ATTN_BOOL, B, Hq, Lq, Lk);
    attn_tensor tb = attn_tensor_4d(bias, ATTN_F32, 1, Hq, Lq, Lk);
    attn_tensor ts = attn_tensor_4d(slopes, ATTN_F32, Hq, 1, 1, 1);
    attn_tensor tk = attn_tensor_4d(sinks, ATTN_F32, Hq, 1, 1, 1);
    attn_tensor tl = {lens, ATTN_I64, {B, 1, 1, 1}, {1, 1, 1, 1}};
    attn_options opt = {0};
    if (w->opts == 1)
        opt = (attn_options){.mask = &tm, .bias = &tb, .kv_len = &tl, .causal = true,
                             .align = ATTN_ALIGN_BOTTOM_RIGHT};
    else if (w->opts == 2)
        opt = (attn_options){.alibi_slopes = &ts, .sinks = &tk};
    char what[96];
    snprintf(what, sizeof what, "B=%lld Hq=%lld Hkv=%lld opts %d", (long long)B, (long long)Hq,
             (long long)c.Hkv, w->opts);

    /* the per-head weights and their mean in head order, in float32 */
    const int64_t nw = B * Hq * Lq * Lk, ny = B * l.ty.stride[0];
    float *per = xcalloc(nw, sizeof(float)), *want = xcalloc(B * Lq * Lk, sizeof(float));
    float *y_per = xcalloc(ny, sizeof(float));
    attn_tensor tper = attn_tensor_4d(per, ATTN_F32, B, Hq, Lq, Lk);
    attn_status st = attn_mha_forward(&l.m, &l.txq, &l.txkv, &l.ty, &tper, false, &opt);
    CHECK(st == ATTN_OK, "%s: per-head weights: status %d (%s)", what, st, attn_last_error());
    memcpy(y_per, l.sy, (size_t)ny * sizeof(float));
    const float inv = 1.0f / (float)Hq;
    for (int64_t b = 0; b < B; b++)
        for (int64_t e = 0; e < Lq * Lk; e++) {
            float s = per[b * Hq * Lq * Lk + e];
            for (int64_t h = 1; h < Hq; h++) s += per[(b * Hq + h) * Lq * Lk + e];
            want[b * Lq * Lk + e] = s * inv;
        }

    /* the averaged weights, rows padded by 3, for 1, 2 and 3 threads */
    const int64_t ld = Lk + 3;
    float *avg = xcalloc(B * Lq * ld, sizeof(float));
    attn_tensor tavg = {avg, ATTN_F32, {B, 1, Lq, Lk}, {Lq * ld, Lq * ld, ld, 1}};
    for (int threads = 1; threads <= 3; threads++) {
        fill_sentinel(avg, B * Lq * ld);
        fill_sentinel(l.sy, ny);
        attn_options o = opt;
        o.threads = threads;
        st = attn_mha_forward(&l.m, &l.txq, &l.txkv, &l.ty, &tavg, true, &o);
        CHECK(st == ATTN_OK, "%s threads %d: status %d (%s)", what, threads, st,
              attn_last_error());
        const int64_t bad = bit_mismatches(avg, ld, want, B, Lq, Lk);
        CHECK(bad == 0, "%s threads %d: %lld averaged weights differ from the per-head mean",
              what, threads, (long long)bad);
        int64_t pad_bad = 0;
        for (int64_t rr = 0; rr < B * Lq; rr++)
            for (int64_t j = Lk; j < ld; j++) pad_bad += !is_sentinel(&avg[rr * ld + j]);
        CHECK(pad_bad == 0, "%s threads %d: %lld padding floats written", what, threads,
              (long long)pad_bad);
        CHECK(memcmp(l.sy, y_per, (size_t)ny * sizeof(float)) == 0,
              "%s threads %d: y differs from the per-head call's", what, threads);
    }
    /* planted: one weight one ulp off is found */
    if (w->opts == 1 && B == 2) {
        float *planted = xcalloc(B * Lq * Lk, sizeof(float));
        memcpy(planted, want, (size_t)(B * Lq * Lk) * sizeof(float));
        planted[B * Lq * Lk - 1] = nextafterf(planted[B * Lq * Lk - 1], 2.0f);
        CHECK(bit_mismatches(avg, ld, planted, B, Lq, Lk) == 1,
              "%s: the planted one-ulp error is not found", what);
        free(planted);
    }
    /* a bad kv_len in the last batch row: refused, nothing written */
    if (w->opts == 1) {
        lens[B - 1] = Lk + 1;
        fill_sentinel(avg, B * Lq * ld);
        st = attn_mha_forward(&l.m, &l.txq, &l.txkv, &l.ty, &tavg, true, &opt);
        CHECK(st == ATTN_ERR_VALUE, "%s: kv_len out of range: status %d", what, st);
        int64_t written = 0;
        for (int64_t e = 0; e < B * Lq * ld; e++) written += !is_sentinel(&avg[e]);
        CHECK(written == 0, "%s: kv_len out of range: %lld weights written", what,
              (long long)written);
    }
    free(mask), free(bias), free(slopes), free(sinks), free(lens);
    free(per), free(want), free(y_per), free(avg);
    mlayer_free(&l);
}

int main(void) {
    /* chunks of min(2B - 1, Hq) heads (these planes are far under the 2^18-float
     * bound), a multiple of the group: 1 per chunk (B = 1, as BERT-sized planes get),
     * 3 + 1, 2 + 2 (GQA), 4 + 2 (GQA), all in one; then planes of 300 x 450 floats,
     * where the 2^18-float bound makes it 1 head (or one GQA group of 2) per chunk */
    const wcase cases[] = {{1, 4, 4, 0, 0, 0}, {2, 4, 4, 0, 0, 0}, {2, 4, 2, 0, 0, 0},
                           {3, 6, 3, 0, 0, 0}, {5, 4, 4, 0, 0, 0},
                           {1, 3, 1, 0, 0, 0}, {2, 4, 4, 0, 300, 450}, {2, 4, 2, 0, 300, 450}};
    uint64_t seed = 900;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int opts = 0; opts < 3; opts++) {
            wcase w = cases[i];
            w.opts = opts;
            run(&w, seed++);
        }
    return check_summary("test_mha_weights");
}
