/*
 * test_f64_masks.c — the float64 fused forward (src/forward/fused_f64.c) under bool masks and
 *                    biases read through their summary (src/forward/mask_summary.h): tiles the
 *                    mask masks whole are skipped, rows and tiles it leaves open take no
 *                    per-logit test, and no kept key is ever skipped.
 *
 * What it covers (shape B = 2, Hq = 2, Hkv = 1, Lq = 70, Lk = 150, D = 8: the 16 x 64 tiles
 * and the summary's 64-row blocks both crossed):
 *  1. Adversarial masks, fused against ATTN_PATH_REFERENCE (O and the float64 LSE, per
 *     element within TOL * eps64 * (1 + max|s|) * max|o_ref|; the LSE within
 *     TOL * eps64 * (1 + max|s|)): key padding except one entry (a key in a tile every
 *     other row masks), causal except one entry (a key far right of a row's band), a
 *     NaN bias wherever the bool mask masks, a random mask keeping 1/2 of the keys and a
 *     sparse one keeping 1/50 (fully masked tiles and rows among them); NaN in K and V
 *     rows no row keeps, NaN in Q of rows the mask masks whole; O = 0 and LSE = -inf
 *     for those rows.
 *  2. The one entry counts: the reference with it removed fails the check (so a path
 *     that skipped it would).
 *  3. A mask or bias that says what the structure says gives the structure's bits: key
 *     padding as a bool mask and as a 0 / -inf bias vs kv_len, a causal mask vs causal.
 *  4. Bit-identical O, LSE and weights for 1, 2 and 3 threads; the weights of masked keys
 *     exactly 0.
 *  5. Each tolerance check rejects a planted error.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "check.h"
#include "rng.h"

#define EPS64 DBL_EPSILON
#define TOL 32.0  // units of eps64 (1 + max|s|) max|o_ref|

enum { B = 2, HQ = 2, HKV = 1, LQ = 70, LK = 150, D = 8 };
enum { NQ = B * HQ * LQ * D, NK = B * HKV * LK * D, NS = B * HQ * LQ * LK, ROWS = B * HQ * LQ };

typedef struct mcase {
    double q[NQ], k[NK], v[NK];
    uint8_t mask[NS];  // [B, Hq, Lq, Lk]
    float bias[NS];    // [B, Hq, Lq, Lk]
    int64_t kv_len[B];
    attn_tensor tq, tk, tv, tmask, tbias, tkvl;
    attn_options opt;
} mcase;

typedef struct out {
    double o[NQ], lse[ROWS];
    float w[NS];
    attn_status st;
} out;

static void make(mcase *c, uint64_t seed) {
    memset(c, 0, sizeof *c);
    rng_t r = {seed};
    for (int e = 0; e < NQ; e++) c->q[e] = 1.5 * rng_normal(&r);
    for (int e = 0; e < NK; e++) c->k[e] = 1.5 * rng_normal(&r);
    for (int e = 0; e < NK; e++) c->v[e] = rng_normal(&r);
    c->tq = attn_tensor_4d(c->q, ATTN_F64, B, HQ, LQ, D);
    c->tk = attn_tensor_4d(c->k, ATTN_F64, B, HKV, LK, D);
    c->tv = attn_tensor_4d(c->v, ATTN_F64, B, HKV, LK, D);
    c->tmask = attn_tensor_4d(c->mask, ATTN_BOOL, B, HQ, LQ, LK);
    c->tbias = attn_tensor_4d(c->bias, ATTN_F32, B, HQ, LQ, LK);
    c->tkvl = attn_tensor_4d(c->kv_len, ATTN_I64, B, 1, 1, 1);
}

static int64_t cell(int64_t b, int64_t h, int64_t i, int64_t j) {
    return ((b * HQ + h) * LQ + i) * LK + j;
}

static void run(const mcase *c, attn_path path, int threads, out *r) {
    attn_tensor to = attn_tensor_4d(r->o, ATTN_F64, B, HQ, LQ, D);
    attn_tensor tl = attn_tensor_4d(r->lse, ATTN_F64, B, HQ, LQ, 1);
    attn_tensor tw = attn_tensor_4d(r->w, ATTN_F32, B, HQ, LQ, LK);
    attn_options o = c->opt;
    o.path = path;
    o.threads = threads;
    o.lse = &tl;
    o.weights = &tw;
    r->st = attn_forward(&c->tq, &c->tk, &c->tv, &to, &o);
}

/* 1 + the largest |scale q_i · k_j| over the cells the call keeps (mask and bias), the
 * bias added where it is finite */
static double smax_of(const mcase *c) {
    double big = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < HQ; h++)
            for (int64_t i = 0; i < LQ; i++)
                for (int64_t j = 0; j < LK; j++) {
                    const int64_t x = cell(b, h, i, j);
                    if ((c->opt.mask && !c->mask[x]) || (c->opt.bias && !isfinite(c->bias[x]))) continue;
                    double dot = 0;
                    for (int64_t d = 0; d < D; d++)
                        dot += c->q[((b * HQ + h) * LQ + i) * D + d] * c->k[(b * LK + j) * D + d];
                    const double s = fabs(dot / sqrt((double)D)) + (c->opt.bias ? fabs(c->bias[x]) : 0);
                    if (isfinite(s) && s > big) big = s;
                }
    return 1 + big;
}

/* O and LSE of got within the bound of ref; fully masked rows exactly O = 0, LSE = -inf */
static bool within(const out *got, const out *ref, double smax) {
    double scale = 0;
    for (int e = 0; e < NQ; e++)
        if (isfinite(ref->o[e])) scale = fmax(scale, fabs(ref->o[e]));
    bool ok = true;
    for (int e = 0; e < NQ; e++)
        if (!(fabs(got->o[e] - ref->o[e]) <= TOL * EPS64 * smax * scale)) ok = false;
    for (int r = 0; r < ROWS; r++) {
        if (ref->lse[r] == -INFINITY) {
            if (got->lse[r] != -INFINITY) ok = false;
            for (int d = 0; d < D; d++)
                if (got->o[r * D + d] != 0.0) ok = false;
            continue;
        }
        if (!(fabs(got->lse[r] - ref->lse[r]) <= TOL * EPS64 * smax)) ok = false;
    }
    return ok;
}

static bool same_bits(const out *a, const out *b) {
    return !memcmp(a->o, b->o, sizeof a->o) && !memcmp(a->lse, b->lse, sizeof a->lse) &&
           !memcmp(a->w, b->w, sizeof a->w);
}

static bool all_finite(const double *x, int n) {
    for (int e = 0; e < n; e++)
        if (!isfinite(x[e])) return false;
    return true;
}

/* kinds of mask */
enum { PAD_BUT_ONE, CAUSAL_BUT_ONE, NAN_BIAS, RANDOM_HALF, SPARSE, KINDS };
static const char *const KIND[KINDS] = {"key padding but one", "causal but one",
                                        "NaN bias under the mask", "random 1/2", "sparse 1/50"};

/* the mask of a kind; *one: the single kept entry the kind's structure lacks (or -1) */
static void fill_mask(mcase *c, int kind, rng_t *r, int64_t *one) {
    *one = -1;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < HQ; h++)
            for (int64_t i = 0; i < LQ; i++)
                for (int64_t j = 0; j < LK; j++) {
                    uint8_t m = 0;
                    if (kind == PAD_BUT_ONE) m = j < 100 || (b == 1 && h == 1 && i == 33 && j == 149);
                    if (kind == CAUSAL_BUT_ONE) m = j <= i || (b == 0 && h == 0 && i == 3 && j == 140);
                    if (kind == NAN_BIAS || kind == RANDOM_HALF) m = rng_unif(r) < 0.5;
                    if (kind == SPARSE) m = rng_unif(r) < 0.02 && i != 5;  // row 5: fully masked
                    c->mask[cell(b, h, i, j)] = m;
                }
    if (kind == PAD_BUT_ONE) *one = cell(1, 1, 33, 149);
    if (kind == CAUSAL_BUT_ONE) *one = cell(0, 0, 3, 140);
    if (kind == NAN_BIAS)
        for (int64_t x = 0; x < NS; x++) c->bias[x] = c->mask[x] ? (float)rng_normal(r) : NAN;
}

/* NaN where no kept cell reads: K and V rows of keys no row keeps, Q of rows keeping none */
static void poison_unread(mcase *c) {
    for (int64_t b = 0; b < B; b++) {
        for (int64_t j = 0; j < LK; j++) {
            bool read = false;
            for (int64_t x = 0; x < HQ * LQ && !read; x++) read = c->mask[cell(b, 0, 0, 0) + x * LK + j];
            for (int64_t d = 0; !read && d < D; d++) c->k[(b * LK + j) * D + d] = c->v[(b * LK + j) * D + d] = NAN;
        }
        for (int64_t x = 0; x < HQ * LQ; x++) {
            bool any = false;
            for (int64_t j = 0; j < LK && !any; j++) any = c->mask[cell(b, 0, 0, 0) + x * LK + j];
            for (int64_t d = 0; !any && d < D; d++) c->q[(b * HQ * LQ + x) * D + d] = NAN;
        }
    }
}

static void adversarial(void) {
    static mcase c;
    static out f, ref, t1, t3, gone;
    for (int kind = 0; kind < KINDS; kind++) {
        make(&c, 300 + (uint64_t)kind);
        rng_t r = {900 + (uint64_t)kind};
        int64_t one;
        fill_mask(&c, kind, &r, &one);
        c.opt.mask = &c.tmask;
        if (kind == NAN_BIAS) c.opt.bias = &c.tbias;
        poison_unread(&c);
        const double smax = smax_of(&c);
        run(&c, ATTN_PATH_AUTO, 2, &f);
        run(&c, ATTN_PATH_REFERENCE, 1, &ref);
        CHECK(f.st == ATTN_OK && ref.st == ATTN_OK, "%s: %s", KIND[kind], attn_last_error());
        CHECK(within(&f, &ref, smax), "%s: fused vs reference", KIND[kind]);
        CHECK(all_finite(f.o, NQ), "%s: NaN in an unread input reached O", KIND[kind]);
        int bad_w = 0, masked_rows = 0;
        for (int64_t x = 0; x < NS; x++)
            if (!c.mask[x] && f.w[x] != 0.0f) bad_w++;
        for (int64_t x = 0; x < ROWS; x++) masked_rows += f.lse[x] == -INFINITY;
        CHECK(bad_w == 0, "%s: %d masked cells with a weight", KIND[kind], bad_w);
        if (kind == SPARSE) CHECK(masked_rows >= B * HQ, "sparse: rows 5 are fully masked (%d)", masked_rows);
        run(&c, ATTN_PATH_FUSED, 1, &t1);
        run(&c, ATTN_PATH_FUSED, 3, &t3);
        CHECK(t1.st == ATTN_OK && t3.st == ATTN_OK && same_bits(&t1, &f) && same_bits(&t3, &f),
              "%s: threads 1, 2, 3 not bit-identical", KIND[kind]);
        if (one >= 0) {  // 2: without the one entry the answer is another
            c.mask[one] = 0;
            run(&c, ATTN_PATH_REFERENCE, 1, &gone);
            CHECK(gone.st == ATTN_OK && !within(&f, &gone, smax),
                  "%s: the one entry changes nothing the check sees", KIND[kind]);
            CHECK(f.w[one] > 0.0f, "%s: the one entry has no weight", KIND[kind]);
        }
        printf("  %-24s fused = reference within the bound, %d fully masked rows\n", KIND[kind],
               masked_rows);
    }
}

/* 3: the structure said by a mask or a bias */
static void as_structure(void) {
    static mcase a, m;
    static out oa, om;
    for (int kind = 0; kind < 3; kind++) {
        make(&a, 77);
        make(&m, 77);
        a.kv_len[0] = 100, a.kv_len[1] = 37;
        if (kind < 2) a.opt.kv_len = &a.tkvl;
        else a.opt.causal = true;
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < HQ; h++)
                for (int64_t i = 0; i < LQ; i++)
                    for (int64_t j = 0; j < LK; j++) {
                        const bool keep = kind < 2 ? j < a.kv_len[b] : j <= i;
                        m.mask[cell(b, h, i, j)] = keep;
                        m.bias[cell(b, h, i, j)] = keep ? 0.0f : -INFINITY;
                    }
        if (kind == 1) m.opt.bias = &m.tbias;
        else m.opt.mask = &m.tmask;
        run(&a, ATTN_PATH_FUSED, 2, &oa);
        run(&m, ATTN_PATH_FUSED, 3, &om);
        CHECK(oa.st == ATTN_OK && om.st == ATTN_OK && same_bits(&oa, &om),
              "%s as a %s: not the structure's bits", kind == 2 ? "causal" : "key padding",
              kind == 1 ? "bias" : "mask");
    }
}

/* 5: the checks reject planted errors */
static void planted(void) {
    static mcase c;
    static out f, ref;
    make(&c, 5);
    rng_t r = {6};
    int64_t one;
    fill_mask(&c, RANDOM_HALF, &r, &one);
    c.opt.mask = &c.tmask;
    const double smax = smax_of(&c);
    run(&c, ATTN_PATH_AUTO, 2, &f);
    run(&c, ATTN_PATH_REFERENCE, 1, &ref);
    CHECK(within(&f, &ref, smax), "planted case is clean before planting");
    f.o[123] += 1e-12 * (1 + fabs(f.o[123]));
    CHECK(!within(&f, &ref, smax), "planted: an O error of 1e-12 passed");
    f.o[123] = ref.o[123];
    f.lse[17] += 1e-12 * (1 + fabs(f.lse[17]));
    CHECK(!within(&f, &ref, smax), "planted: an LSE error of 1e-12 passed");
    f.lse[17] = ref.lse[17];
    static out copy;
    copy = f;
    CHECK(same_bits(&copy, &f), "planted case: a copy has the same bits");
    copy.w[cell(0, 0, 0, 1)] = nextafterf(copy.w[cell(0, 0, 0, 1)], 1.0f);
    CHECK(!same_bits(&copy, &f), "planted: a weight one ulp off has the same bits");
}

int main(void) {
    adversarial();
    as_structure();
    planted();
    return check_summary("test_f64_masks");
}
