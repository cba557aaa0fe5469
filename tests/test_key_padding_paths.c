/*
 * test_key_padding_paths.c — key padding given as a mask or bias runs as the key lengths
 *                            it is on every fused path (ai_key_padding, mask_summary.h),
 *                            not only the float32 forward and backward.
 *
 * What it covers (B = 3 of key lengths 97, 50 and 0, Hq = 2, Hkv = 1, Lq = 40, Lk = 97,
 * D = 16: the 16- and 64-row tiles and a batch of fully masked rows): for the float64
 * forward (O and a float64 LSE), the float64 backward (dQ, dK, dV) and attn_weights_grid
 * (float32, sum and max, the full grid and a 7 x 13 one), on 1 and 2 threads, the call
 * with a bool mask [B, 1, 1, Lk], with a 0 / -inf bias [B, 1, 1, Lk], and with a
 * [B, 1, Lq, Lk] mask of padding cut by the top-left causal band, gives the bits of the
 * same call with kv_len (and causal); K and V hold NaN past every batch's length. Then
 * the detector itself on the float64 params and on a weights call's params: it turns
 * the padding into lengths there, and leaves a mask with one kept key past the prefix
 * alone. A negative control: a mask that masks one key inside batch 0's prefix must
 * change the bits (so the comparisons can see a difference).
 * What it is not: the detector's near misses (test_mask_lengths.c) or the float64 path's
 * mask accuracy (test_f64_masks.c).
 */
#include <math.h>
#include <string.h>

#include "attn.h"
#include "check.h"
#include "forward/mask_summary.h"
#include "rng.h"

enum { B = 3, HQ = 2, HKV = 1, LQ = 40, LK = 97, D = 16 };
enum { NQ = B * HQ * LQ * D, NK = B * HKV * LK * D, NROW = B * HQ * LQ, NM = B * LQ * LK };
static const int64_t g_len[B] = {97, 50, 0};

enum { FORM_MASK, FORM_BIAS, FORM_MASK_CAUSAL, FORM_SPOILED, FORM_COUNT };
static const char *const g_form[FORM_COUNT] = {"bool mask", "0/-inf bias", "mask + causal band",
                                               "mask, one key dropped"};

typedef struct inputs {
    double q[NQ], k[NK], v[NK], d_o[NQ];
    float qf[NQ], kf[NK];
    uint8_t mask[NM];   // [B, 1, Lq, Lk] (the causal form), or its row 0 as [B, 1, 1, Lk]
    float bias[NM];
    int64_t kv_len[B];
} inputs;

static void fill(inputs *in) {
    rng_t r = {77};
    for (int i = 0; i < NQ; i++) in->q[i] = rng_unif(&r) * 2 - 1, in->d_o[i] = rng_unif(&r) - 0.5;
    for (int i = 0; i < NK; i++) in->k[i] = rng_unif(&r) * 2 - 1, in->v[i] = rng_unif(&r) * 2 - 1;
    /* past each batch's length: NaN, never to be read */
    for (int b = 0; b < B; b++)
        for (int64_t j = g_len[b]; j < LK; j++)
            for (int d = 0; d < D; d++) in->k[(b * LK + j) * D + d] = in->v[(b * LK + j) * D + d] = NAN;
    for (int i = 0; i < NQ; i++) in->qf[i] = (float)in->q[i];
    for (int i = 0; i < NK; i++) in->kf[i] = (float)in->k[i];
    memcpy(in->kv_len, g_len, sizeof g_len);
}

/* the form's mask or bias into in, and the options it goes in (plain: kv_len instead) */
static void options_of(inputs *in, int form, bool plain, attn_tensor *t, attn_options *opt) {
    const bool causal = form == FORM_MASK_CAUSAL;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < LQ; i++)
            for (int j = 0; j < LK; j++) {
                const bool keep = j < g_len[b] && (!causal || j <= i);
                in->mask[(b * LQ + i) * LK + j] = keep;
                in->bias[(b * LQ + i) * LK + j] = keep ? 0.0f : -INFINITY;
            }
    if (form == FORM_SPOILED) in->mask[5] = 0;  // batch 0, key 5, inside the prefix
    *opt = (attn_options){0};
    if (plain) {
        *t = attn_tensor_4d(in->kv_len, ATTN_I64, B, 1, 1, 1);
        opt->kv_len = t;
        opt->causal = causal;
        return;
    }
    if (form == FORM_BIAS) {
        *t = attn_tensor_4d(in->bias, ATTN_F32, B, 1, 1, LK);
        t->stride[0] = LQ * LK;  // row 0 of each batch
        opt->bias = t;
    } else {
        *t = attn_tensor_4d(in->mask, ATTN_BOOL, B, 1, causal ? LQ : 1, LK);
        t->stride[0] = LQ * LK;
        opt->mask = t;
    }
}

typedef struct outputs {
    double o[NQ], lse[NROW], dq[NQ], dk[NK], dv[NK];
    float grid_full[B * HQ * LQ * LK], grid_max[B * HQ * 7 * 13];
} outputs;

static attn_status run(inputs *in, int form, bool plain, int threads, outputs *out) {
    attn_tensor t, lse64 = attn_tensor_4d(out->lse, ATTN_F64, B, HQ, LQ, 1);
    attn_options opt;
    options_of(in, form, plain, &t, &opt);
    opt.threads = threads;
    attn_tensor q = attn_tensor_4d(in->q, ATTN_F64, B, HQ, LQ, D);
    attn_tensor k = attn_tensor_4d(in->k, ATTN_F64, B, HKV, LK, D);
    attn_tensor v = attn_tensor_4d(in->v, ATTN_F64, B, HKV, LK, D);
    attn_tensor o = attn_tensor_4d(out->o, ATTN_F64, B, HQ, LQ, D);
    attn_options f = opt;
    f.lse = &lse64;
    attn_status st = attn_forward(&q, &k, &v, &o, &f);
    if (st != ATTN_OK) return st;
    attn_tensor d_o = attn_tensor_4d(in->d_o, ATTN_F64, B, HQ, LQ, D);
    attn_tensor dq = attn_tensor_4d(out->dq, ATTN_F64, B, HQ, LQ, D);
    attn_tensor dk = attn_tensor_4d(out->dk, ATTN_F64, B, HKV, LK, D);
    attn_tensor dv = attn_tensor_4d(out->dv, ATTN_F64, B, HKV, LK, D);
    st = attn_backward(&q, &k, &v, &o, &d_o, &lse64, &dq, &dk, &dv, &opt);
    if (st != ATTN_OK) return st;
    /* the weights from a float32 LSE: the plain call's, so both grids read the same one */
    float lse32[NROW], o32[NQ];
    attn_tensor qf = attn_tensor_4d(in->qf, ATTN_F32, B, HQ, LQ, D);
    attn_tensor kf = attn_tensor_4d(in->kf, ATTN_F32, B, HKV, LK, D);
    attn_tensor of = attn_tensor_4d(o32, ATTN_F32, B, HQ, LQ, D);
    attn_tensor lf = attn_tensor_4d(lse32, ATTN_F32, B, HQ, LQ, 1);
    attn_tensor tp;
    attn_options po;
    options_of(in, form == FORM_SPOILED ? FORM_MASK : form, true, &tp, &po);
    po.lse = &lf;
    st = attn_forward(&qf, &kf, &kf, &of, &po);
    options_of(in, form, plain, &t, &opt);  // the form's tensors again (po rewrote them)
    opt.threads = threads;
    if (st != ATTN_OK) return st;
    attn_tensor g1 = attn_tensor_4d(out->grid_full, ATTN_F32, B, HQ, LQ, LK);
    attn_tensor g2 = attn_tensor_4d(out->grid_max, ATTN_F32, B, HQ, 7, 13);
    st = attn_weights_grid(&qf, &kf, &lf, &g1, ATTN_REDUCE_SUM, &opt);
    if (st != ATTN_OK) return st;
    return attn_weights_grid(&qf, &kf, &lf, &g2, ATTN_REDUCE_MAX, &opt);
}

static bool same_bits(const void *a, const void *b, size_t bytes) { return memcmp(a, b, bytes) == 0; }

/* the parts of a and b that differ, as a mask of 1 O, 2 LSE, 4 dQ, 8 dK, 16 dV, 32, 64 grids */
static int differ(const outputs *a, const outputs *b) {
    const bool part[7] = {
        same_bits(a->o, b->o, sizeof a->o),   same_bits(a->lse, b->lse, sizeof a->lse),
        same_bits(a->dq, b->dq, sizeof a->dq), same_bits(a->dk, b->dk, sizeof a->dk),
        same_bits(a->dv, b->dv, sizeof a->dv),
        same_bits(a->grid_full, b->grid_full, sizeof a->grid_full),
        same_bits(a->grid_max, b->grid_max, sizeof a->grid_max)};
    int d = 0;
    for (int i = 0; i < 7; i++) d |= !part[i] << i;
    return d;
}

static int64_t count_nan(const double *x, int64_t n) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) c += isnan(x[i]) != 0;
    return c;
}

/* the detector on the params of a float64 call and of a weights call (float32 q, k) */
static void check_detector(inputs *in, int form, bool f64) {
    attn_tensor t;
    attn_options opt;
    options_of(in, form, false, &t, &opt);
    double o64[NQ];
    float o32[NQ];
    attn_tensor q = f64 ? attn_tensor_4d(in->q, ATTN_F64, B, HQ, LQ, D) : attn_tensor_4d(in->qf, ATTN_F32, B, HQ, LQ, D);
    attn_tensor k = f64 ? attn_tensor_4d(in->k, ATTN_F64, B, HKV, LK, D) : attn_tensor_4d(in->kf, ATTN_F32, B, HKV, LK, D);
    attn_tensor o = f64 ? attn_tensor_4d(o64, ATTN_F64, B, HQ, LQ, D) : attn_tensor_4d(o32, ATTN_F32, B, HQ, LQ, D);
    attn_params p, out;
    CHECK(ai_params_init(&p, &q, &k, &k, &o, &opt, true) == ATTN_OK, "params: %s", attn_last_error());
    const size_t bytes = ai_key_padding_bytes(&p);
    void *mem = xcalloc((int64_t)bytes, 1);
    const attn_params *r = ai_key_padding(&p, mem, &out);
    const char *what = f64 ? "float64" : "float32 (weights)";
    if (form == FORM_SPOILED) {
        CHECK(r == &p && p.mask, "%s, %s: not key padding, yet converted", what, g_form[form]);
    } else {
        int bad = r != &out || r->mask || r->bias;
        /* the causal form's lengths: its last row's prefix, which the band cuts at Lq */
        for (int b = 0; !bad && b < B; b++)
            bad = attn_key_len(r, b) != (form == FORM_MASK_CAUSAL && LQ < g_len[b] ? LQ : g_len[b]);
        bad |= r == &out && r->causal != (form == FORM_MASK_CAUSAL);
        CHECK(bytes > 0 && !bad, "%s, %s: key padding not turned into lengths (%zu bytes, "
              "converted %d)", what, g_form[form], bytes, r == &out);
    }
    /* the reference path keeps the tensors as given */
    opt.path = ATTN_PATH_REFERENCE;
    CHECK(ai_params_init(&p, &q, &k, &k, &o, &opt, true) == ATTN_OK && ai_key_padding_bytes(&p) == 0 &&
          ai_key_padding(&p, mem, &out) == &p, "%s, %s: the reference path converts", what, g_form[form]);
    free(mem);
}

int main(void) {
    static inputs in;
    static outputs plain, got;
    fill(&in);
    for (int form = 0; form < FORM_COUNT; form++) {
        check_detector(&in, form, true);
        check_detector(&in, form, false);
        const int plain_form = form == FORM_SPOILED ? FORM_MASK : form;
        for (int threads = 1; threads <= 2; threads++) {
            CHECK(run(&in, plain_form, true, threads, &plain) == ATTN_OK, "kv_len call: %s", attn_last_error());
            CHECK(run(&in, form, false, threads, &got) == ATTN_OK, "%s call: %s", g_form[form], attn_last_error());
            const int d = differ(&plain, &got);
            if (form == FORM_SPOILED)
                CHECK((d & 1) != 0, "%s, %d threads: the bits equal kv_len's, so a comparison "
                      "cannot see a changed key", g_form[form], threads);
            else
                CHECK(d == 0, "%s, %d threads: the bits differ from kv_len's (parts 0x%x: 1 O, 2 LSE, "
                      "4 dQ, 8 dK, 16 dV, 32 grid, 64 max grid)", g_form[form], threads, d);
            CHECK(count_nan(got.o, NQ) + count_nan(got.dq, NQ) == 0 && got.lse[2 * HQ * LQ - 1] != -INFINITY &&
                  got.lse[NROW - 1] == -INFINITY, "%s, %d threads: NaN read, or the empty batch's LSE "
                  "is not -inf", g_form[form], threads);
        }
    }
    return check_summary("key_padding_paths");
}
