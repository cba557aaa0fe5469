/*
 * test_dropout.c — dropout on the attention weights: the generator, its statistics, the
 *                  forward and the backward with a mask, and its misuse.
 *
 * What it covers:
 *  1. Philox4x32-10 (src/core/philox.h) against the published known-answer vectors, and the
 *     7-round ones (the round count is a parameter: a key schedule off by one round fails
 *     both).
 *  2. The keep decisions' statistics (bounds a biased generator fails, each shown failing
 *     once on a planted bias): the kept fraction, chi-square of the kept counts per lane
 *     (j mod 4) and per row, and the correlation of neighbours along j, along i, and
 *     between two offsets of one seed.
 *  3. The layout: the fused and reference paths' weights output is 0 exactly where the
 *     scalar definition (attn_dropout_kept) drops, for every (b, h, i, j).
 *  4. The forward of the fused path (the kernel ATTN_ISA picks: scripts/check.sh runs this
 *     suite once per kernel) against the float64 reference with the same mask, over
 *     sizes around the tiles, GQA, causal, windows, kv_len, a bool mask, the split-key
 *     path of decoding shapes; the contract's float32 tolerance, which a reference with
 *     another offset's mask fails. LSE is the undropped one; p = 1 gives O = 0.
 *  5, 6. The backward, 16-bit inputs and thread counts: test_dropout_backward.c.
 *  7. Misuse: p < 0, p > 1, NaN, inf: ATTN_ERR_VALUE and nothing written; additive
 *     attention with dropout: ATTN_ERR_UNSUPPORTED.
 * The call of a case is tests/support/dropout_case.h, shared with test_dropout_backward.c.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "check.h"
#include "dropout_case.h"
#include "oracle.h"
#include "core/philox.h"
#include "rng.h"

/* ---- 1. known answers -------------------------------------------------------------------
 * The Random123 distribution's known-answer file (D. E. Shaw Research, examples/
 * kat_vectors; the vectors of Salmon et al., SC 2011), lines "philox4x32 10" and
 * "philox4x32 7": counter (4 words), key (2 words), expected output (4 words). Found
 * through the code search, reproduced verbatim in several independent implementations'
 * tests (e.g. E. Sarmas's philox.py TEST_CASES). */
static void known_answers(void) {
    static const struct {
        int rounds;
        uint32_t ctr[4], key[2], want[4];
    } kat[] = {
        {10, {0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {10, {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {10, {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
        {7, {0, 0, 0, 0}, {0, 0}, {0x5f6fb709, 0x0d893f64, 0x4f121f81, 0x4f730a48}},
        {7, {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
         {0x5207ddc2, 0x45165e59, 0x4d8ee751, 0x8c52f662}},
        {7, {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
         {0x4dfccaba, 0x190a87f0, 0xc47362ba, 0xb6b5242a}},
    };
    for (size_t t = 0; t < sizeof kat / sizeof kat[0]; t++) {
        uint32_t out[4];
        attn_philox4x32_r(kat[t].rounds, kat[t].ctr, kat[t].key, out);
        CHECK(memcmp(out, kat[t].want, sizeof out) == 0,
              "philox4x32-%d KAT %zu: got %08x %08x %08x %08x, want %08x %08x %08x %08x",
              kat[t].rounds, t, out[0], out[1], out[2], out[3], kat[t].want[0], kat[t].want[1],
              kat[t].want[2], kat[t].want[3]);
        /* planted: one round fewer never matches */
        attn_philox4x32_r(kat[t].rounds - 1, kat[t].ctr, kat[t].key, out);
        CHECK(memcmp(out, kat[t].want, sizeof out) != 0, "KAT %zu: %d rounds match too", t,
              kat[t].rounds - 1);
    }
    uint32_t out[4];
    attn_philox4x32(kat[0].ctr, kat[0].key, out);
    CHECK(out[0] == kat[0].want[0], "attn_philox4x32 is not the 10-round one");
    /* the group layout: group n of (seed, offset) is counter (n lo, n hi, offset lo,
     * offset hi), key (seed lo, seed hi) */
    const uint64_t seed = 0x299f31d0a4093822ull, offset = 0x037073441319 * 0x100000ull + 0x8a2e;
    const uint64_t n = 0x85a308d3243f6a88ull;
    const uint64_t offset2 = 0x0370734413198a2eull;
    (void)offset;
    attn_dropout_group(seed, offset2, n, out);
    CHECK(memcmp(out, kat[2].want, sizeof out) == 0, "attn_dropout_group: not the documented "
          "counter/key layout");
}

/* ---- 2. statistics ------------------------------------------------------------------------
 * keep(variant, seed, offset, t, r, Lk, j): the library's decision (variant 0) or a planted
 * biased one, to show each bound rejects a generator with that fault. */
enum { GEN_TRUE, GEN_FRACTION, GEN_LANE, GEN_ROW, GEN_NEIGHBOUR, GEN_OFFSET, GEN_COUNT };
static const char *const k_gen[GEN_COUNT] = {"philox", "fraction+1%", "lane-3 bias",
                                              "odd-row bias", "lane 1 = lane 0", "offset ignored"};

static bool keep(int variant, uint64_t seed, uint64_t offset, uint64_t t, uint64_t r,
                 uint64_t Lk, uint64_t j) {
    const uint64_t n = r * ((Lk + 3) / 4) + j / 4;
    uint32_t u[4];
    switch (variant) {
    case GEN_FRACTION:  // threshold for p + 0.01
        attn_dropout_group(seed, offset, n, u);
        return u[j % 4] >= t + (uint64_t)(0.01 * 4294967296.0);
    case GEN_LANE:  // lane 3 keeps 2% less
        attn_dropout_group(seed, offset, n, u);
        return u[j % 4] >= t + (j % 4 == 3 ? (uint64_t)(0.02 * 4294967296.0) : 0);
    case GEN_ROW:  // odd rows keep 2% less
        attn_dropout_group(seed, offset, n, u);
        return u[j % 4] >= t + (r % 2 ? (uint64_t)(0.02 * 4294967296.0) : 0);
    case GEN_NEIGHBOUR:  // lane 1 repeats lane 0's word
        attn_dropout_group(seed, offset, n, u);
        return u[j % 4 == 1 ? 0 : j % 4] >= t;
    case GEN_OFFSET:  // the offset is not part of the counter
        attn_dropout_group(seed, 0, n, u);
        return u[j % 4] >= t;
    default: return attn_dropout_kept(seed, offset, t, r, Lk, j);
    }
}

/* The verdicts of every statistic for one generator, over R rows of Lk keys each at p. */
typedef struct stats {
    double z_fraction;   // (kept - N q) / sqrt(N q (1 - q)), q = 1 - p
    double chi_lane;     // chi-square of kept counts per j mod 4 (3 degrees of freedom)
    double z_row;        // (chi-square per row - (R - 1)) / sqrt(2 (R - 1))
    double z_corr_j, z_corr_i, z_corr_offset;  // correlation coefficients times sqrt(pairs)
} stats;

/* bounds: at most about 1e-6 chance each for an unbiased generator (normal 5 sigma; the
 * 3-degree chi-square beyond 30 has probability 1.4e-6) */
#define Z_BOUND 5.0
#define CHI3_BOUND 30.0

static bool stats_pass(const stats *s, char *why, size_t n) {
    snprintf(why, n, "z_fraction %.2f, chi_lane %.2f, z_row %.2f, z_corr j %.2f i %.2f offset %.2f",
             s->z_fraction, s->chi_lane, s->z_row, s->z_corr_j, s->z_corr_i, s->z_corr_offset);
    return fabs(s->z_fraction) < Z_BOUND && s->chi_lane < CHI3_BOUND && fabs(s->z_row) < Z_BOUND &&
           fabs(s->z_corr_j) < Z_BOUND && fabs(s->z_corr_i) < Z_BOUND &&
           fabs(s->z_corr_offset) < Z_BOUND;
}

/* the correlation coefficient of two 0/1 sequences from their counts */
static double corr(double n, double sx, double sy, double sxy) {
    const double mx = sx / n, my = sy / n;
    const double cov = sxy / n - mx * my, vx = mx * (1 - mx), vy = my * (1 - my);
    return vx > 0 && vy > 0 ? cov / sqrt(vx * vy) : 0.0;
}

static stats measure(int variant, float p, uint64_t seed, int64_t R, int64_t Lk) {
    const uint64_t t = attn_dropout_threshold(p);
    const double q = 1.0 - (double)t / 4294967296.0;
    uint8_t *prev = xcalloc(Lk, 1), *cur = xcalloc(Lk, 1);
    double kept = 0, lane[4] = {0}, chi_row = 0;
    double jn = 0, jx = 0, jy = 0, jxy = 0, in_ = 0, ix = 0, iy = 0, ixy = 0;
    double on = 0, ox = 0, oy = 0, oxy = 0;
    for (int64_t r = 0; r < R; r++) {
        double row_kept = 0;
        for (int64_t j = 0; j < Lk; j++) {
            cur[j] = keep(variant, seed, 7, t, (uint64_t)r, (uint64_t)Lk, (uint64_t)j);
            row_kept += cur[j];
            lane[j % 4] += cur[j];
            const bool other = keep(variant, seed, 8, t, (uint64_t)r, (uint64_t)Lk, (uint64_t)j);
            on++, ox += cur[j], oy += other, oxy += cur[j] && other;
            if (j > 0) jn++, jx += cur[j - 1], jy += cur[j], jxy += cur[j - 1] && cur[j];
            if (r > 0) in_++, ix += prev[j], iy += cur[j], ixy += prev[j] && cur[j];
        }
        kept += row_kept;
        const double e = Lk * q;
        chi_row += (row_kept - e) * (row_kept - e) / (e * (1 - q));  // binomial variance
        uint8_t *s = prev;
        prev = cur, cur = s;
    }
    free(prev), free(cur);
    const double N = (double)R * (double)Lk;
    stats s = {0};
    s.z_fraction = (kept - N * q) / sqrt(N * q * (1 - q));
    const double mean_lane = kept / 4;  // lanes equally filled: Lk % 4 == 0 here
    for (int l = 0; l < 4; l++) s.chi_lane += (lane[l] - mean_lane) * (lane[l] - mean_lane) / mean_lane;
    /* per row: chi_row has R degrees of freedom around the true q */
    s.z_row = (chi_row - (double)R) / sqrt(2.0 * (double)R);
    s.z_corr_j = corr(jn, jx, jy, jxy) * sqrt(jn);
    s.z_corr_i = corr(in_, ix, iy, ixy) * sqrt(in_);
    s.z_corr_offset = corr(on, ox, oy, oxy) * sqrt(on);
    return s;
}

static void statistics(void) {
    static const float ps[] = {0.1f, 0.5f, 0.9f};
    char why[256];
    for (size_t a = 0; a < sizeof ps / sizeof ps[0]; a++)
        for (uint64_t seed = 1; seed <= 2; seed++) {
            const stats s = measure(GEN_TRUE, ps[a], seed * 0x9e3779b97f4a7c15ull, 512, 1024);
            CHECK(stats_pass(&s, why, sizeof why), "statistics p = %g seed %llu: %s",
                  (double)ps[a], (unsigned long long)seed, why);
            if (a == 1 && seed == 1) printf("statistics (philox, p = 0.5): %s\n", why);
        }
    /* each planted bias fails its bound */
    for (int v = GEN_FRACTION; v < GEN_COUNT; v++) {
        const stats s = measure(v, 0.5f, 12345, 512, 1024);
        const bool failed = v == GEN_FRACTION    ? fabs(s.z_fraction) >= Z_BOUND
                            : v == GEN_LANE      ? s.chi_lane >= CHI3_BOUND
                            : v == GEN_ROW       ? fabs(s.z_row) >= Z_BOUND
                            : v == GEN_NEIGHBOUR ? fabs(s.z_corr_j) >= Z_BOUND
                                                 : fabs(s.z_corr_offset) >= Z_BOUND;
        stats_pass(&s, why, sizeof why);
        CHECK(failed && !stats_pass(&s, why, sizeof why), "planted %s passed: %s", k_gen[v], why);
        printf("planted %-16s rejected: %s\n", k_gen[v], why);
    }
    /* the threshold: exactly p 2^32 for these p; 0 and 1 at the ends */
    CHECK(attn_dropout_threshold(0.5f) == 2147483648ull, "threshold(0.5)");
    CHECK(attn_dropout_threshold(0.1f) == (uint64_t)((double)0.1f * 4294967296.0 + 0.5), "threshold(0.1)");
    CHECK(attn_dropout_threshold(1.0f) == 4294967296ull, "threshold(1)");
    CHECK(attn_dropout_threshold(0.0f) == 0, "threshold(0)");
    CHECK(!attn_dropout_keeps(0xffffffffu, attn_dropout_threshold(1.0f)), "p = 1 keeps");
    CHECK(attn_dropout_keeps(0, 0), "p = 0 drops");
}

/* ---- 3. the layout: weights are 0 exactly where the scalar definition drops ---------- */

static void layout(void) {
    const dcase c = {2, 3, 1, 5, 37, 8, 8, .p = 0.3f, .seed = 99, .offset = 5};
    for (int path = 0; path < 2; path++) {
        dcall t;
        dcall_build(&t, &c);
        attn_status st = dcall_forward(&t, path ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED, 0, true);
        CHECK(st == ATTN_OK, "layout: forward %s", attn_last_error());
        const uint64_t thr = attn_dropout_threshold(c.p);
        int64_t wrong = 0, dropped = 0;
        for (int64_t b = 0; b < c.B; b++)
            for (int64_t h = 0; h < c.Hq; h++)
                for (int64_t i = 0; i < c.Lq; i++)
                    for (int64_t j = 0; j < c.Lk; j++) {
                        const uint64_t r = attn_dropout_row(b, h, i, c.Hq, c.Lq);
                        const bool k = attn_dropout_kept(c.seed, c.offset, thr, r, c.Lk, j);
                        const float w = t.w[((b * c.Hq + h) * c.Lq + i) * c.Lk + j];
                        wrong += k != (w != 0.0f);
                        dropped += !k;
                    }
        CHECK(wrong == 0 && dropped > 0, "layout (%s): %lld weights disagree with "
              "attn_dropout_kept (%lld dropped)", path ? "reference" : "fused", (long long)wrong,
              (long long)dropped);
        /* a dropped weight never multiplies its V: NaN in V row 5 reaches exactly the rows
         * that keep key 5 */
        for (int64_t b = 0; b < c.B; b++)
            for (int64_t d = 0; d < c.Dv; d++) t.v[(b * c.Hkv * c.Lk + 5) * c.Dv + d] = NAN;
        st = dcall_forward(&t, path ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED, 0, false);
        int64_t leaks = 0, kept_rows = 0;
        for (int64_t b = 0; b < c.B; b++)
            for (int64_t h = 0; h < c.Hq; h++)
                for (int64_t i = 0; i < c.Lq; i++) {
                    const bool k = attn_dropout_kept(c.seed, c.offset, thr,
                                                     attn_dropout_row(b, h, i, c.Hq, c.Lq), c.Lk, 5);
                    const float o0 = t.o[((b * c.Hq + h) * c.Lq + i) * c.Dv];
                    leaks += k != (isnan(o0) != 0);
                    kept_rows += k;
                }
        CHECK(st == ATTN_OK && leaks == 0 && kept_rows > 0, "layout (%s): NaN of a dropped "
              "key's V: %lld rows wrong (%lld keep it)", path ? "reference" : "fused",
              (long long)leaks, (long long)kept_rows);
        dcall_free(&t);
    }
}

/* ---- 4. the forward ----------------------------------------------------------------------- */

static double g_fwd_worst_rel;

static void forward_case(const dcase *c) {
    char desc[400];
    describe(c, desc, sizeof desc);
    dcall t;
    dcall_build(&t, c);
    const int64_t no = n_of(&t.to), nl = n_of(&t.tlse), nw = n_of(&t.tw);
    attn_status st = dcall_forward(&t, ATTN_PATH_FUSED, 0, false);
    CHECK(st == ATTN_OK, "forward: %s [%s]", attn_last_error(), desc);
    double *o = xcalloc(no, sizeof(double)), *lse = xcalloc(nl, sizeof(double));
    double *o2 = xcalloc(no, sizeof(double));
    st = dcall_ref64(&t, 0, o, lse, NULL, false);
    CHECK(st == ATTN_OK, "ref64: %s [%s]", attn_last_error(), desc);
    tol_result r;
    CHECK(within_f32_tol(t.o, o, no, &r), "forward O vs reference: rel %.3g max %.3g [%s]",
          r.rel_err, r.max_err, desc);
    if (r.rel_err > g_fwd_worst_rel) g_fwd_worst_rel = r.rel_err;
    /* the LSE is the undropped one: the same as the reference's */
    double *mag = xcalloc(nl, sizeof(double));
    oracle_logit_mag(&t.tq, &t.tk, &t.opt, mag);
    CHECK(within_lse_tol(t.lse, lse, mag, nl, c->Dk, c->Lk, &r), "forward LSE: error %.3g, %.3g "
          "of the bound [%s]", r.max_err, r.rel_err, desc);
    free(mag);
    /* planted: the reference with the next offset's mask is rejected, wherever that mask
     * changes the answer (a tiny call's two masks can coincide) */
    if (c->p > 0.0f && c->p < 1.0f) {
        dcall_ref64(&t, 1, o2, NULL, NULL, false);
        if (rel_frob(o2, o, no) > 1e-5)
            CHECK(!within_f32_tol(t.o, o2, no, &r), "planted: another offset's mask passed [%s]", desc);
    }
    /* the public reference path: its weights output is the dropped and scaled P, and
     * its O is the float64 one rounded */
    float *o_fused = xcalloc(no, sizeof(float));
    memcpy(o_fused, t.o, (size_t)no * sizeof(float));
    st = dcall_forward(&t, ATTN_PATH_REFERENCE, 0, true);
    CHECK(st == ATTN_OK, "reference path: %s [%s]", attn_last_error(), desc);
    int64_t bad = 0;
    for (int64_t e = 0; e < no; e++) bad += t.o[e] != (float)o[e];
    CHECK(bad == 0, "reference path O != float64 O rounded at %lld [%s]", (long long)bad, desc);
    float *w_ref = xcalloc(nw, sizeof(float));
    memcpy(w_ref, t.w, (size_t)nw * sizeof(float));
    /* the fused path's weights against the reference path's */
    st = dcall_forward(&t, ATTN_PATH_FUSED, 0, true);
    CHECK(st == ATTN_OK, "fused with weights: %s [%s]", attn_last_error(), desc);
    double *wd = to_double(w_ref, nw);
    CHECK(within_f32_tol(t.w, wd, nw, &r), "fused weights vs reference: rel %.3g [%s]", r.rel_err, desc);
    /* O is the same bits with the weights asked for, except on decoding shapes with long
     * keys, whose key split the weights turn off (fused.c) */
    if (!(c->Lq <= 16 && c->Lk >= 2048)) {
        bad = 0;
        for (int64_t e = 0; e < no; e++) bad += t.o[e] != o_fused[e];
        CHECK(bad == 0, "O changes when the weights are asked for (%lld) [%s]", (long long)bad, desc);
    }
    free(o), free(lse), free(o2), free(o_fused), free(w_ref), free(wd);
    dcall_free(&t);
}

static void forward(void) {
    /* sizes around the tiles (bq 64, bk 16..128) and decoding shapes, GQA, Dk != Dv */
    static const int64_t shapes[][7] = {
        {1, 1, 1, 1, 1, 4, 4},     {1, 2, 1, 3, 5, 8, 8},      {2, 2, 2, 17, 63, 16, 12},
        {1, 4, 2, 64, 64, 32, 32}, {1, 2, 1, 65, 129, 8, 16},  {2, 4, 1, 100, 300, 16, 16},
        {1, 8, 2, 1, 257, 64, 64}, {2, 4, 4, 4, 130, 32, 32},  {1, 2, 1, 2, 2500, 16, 16},
        {1, 1, 1, 1, 4100, 8, 8},
    };
    static const float ps[] = {0.1f, 0.5f, 0.9f};
    int n = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t a = 0; a < sizeof ps / sizeof ps[0]; a++)
            for (int f = 0; f < 5; f++) {
                const int64_t *x = shapes[s];
                dcase c = {x[0], x[1], x[2], x[3], x[4], x[5], x[6], .p = ps[a],
                           .seed = 1000 + s * 7 + a, .offset = (uint64_t)f * 3};
                if (f == 1) c.causal = 1, c.align = (int)(s % 2);
                if (f == 2) c.window = 1, c.wl = 7, c.wr = 3, c.align = 1;
                if (f == 3) c.kvlen = 1;
                if (f == 4) c.mask = 1, c.causal = 1;
                if (x[4] > 1000 && f != 0 && f != 3) continue;  // long keys: plain and kv_len
                forward_case(&c);
                n++;
            }
    /* p = 1: every weight dropped, O = 0 (PyTorch's dropout(p = 1) gives zeros); LSE kept */
    for (int path = 0; path < 2; path++) {
        dcase c = {1, 2, 1, 9, 70, 8, 8, .p = 1.0f, .seed = 3};
        dcall t;
        dcall_build(&t, &c);
        attn_status st = dcall_forward(&t, path ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED, 0, true);
        int64_t nonzero = 0;
        for (int64_t e = 0; e < n_of(&t.to); e++) nonzero += t.o[e] != 0.0f || signbit(t.o[e]);
        for (int64_t e = 0; e < n_of(&t.tw); e++) nonzero += t.w[e] != 0.0f;
        int64_t bad_lse = 0;
        for (int64_t e = 0; e < n_of(&t.tlse); e++) bad_lse += !isfinite(t.lse[e]);
        CHECK(st == ATTN_OK && nonzero == 0 && bad_lse == 0, "p = 1 (%s): status %d, %lld "
              "nonzero outputs, %lld non-finite LSE", path ? "reference" : "fused", (int)st,
              (long long)nonzero, (long long)bad_lse);
        st = dcall_backward(&t, path ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED, 0);
        nonzero = 0;
        for (int64_t e = 0; e < n_of(&t.tq); e++) nonzero += t.dq[e] != 0.0f;
        for (int64_t e = 0; e < n_of(&t.tk); e++) nonzero += t.dk[e] != 0.0f;
        for (int64_t e = 0; e < n_of(&t.tv); e++) nonzero += t.dv[e] != 0.0f;
        CHECK(st == ATTN_OK && nonzero == 0, "p = 1 backward (%s): %lld nonzero gradients",
              path ? "reference" : "fused", (long long)nonzero);
        dcall_free(&t);
    }
    /* p = 0 with a seed: the same bits as no dropout at all */
    {
        dcase c = {1, 2, 1, 20, 70, 8, 8, .p = 0.0f, .seed = 77, .offset = 4};
        dcall t;
        dcall_build(&t, &c);
        dcall_forward(&t, ATTN_PATH_FUSED, 0, false);
        float *a = xcalloc(n_of(&t.to), sizeof(float));
        memcpy(a, t.o, (size_t)n_of(&t.to) * sizeof(float));
        t.opt.dropout_seed = 0, t.opt.dropout_offset = 0;
        dcall_forward(&t, ATTN_PATH_FUSED, 0, false);
        CHECK(memcmp(a, t.o, (size_t)n_of(&t.to) * sizeof(float)) == 0, "p = 0 depends on the seed");
        free(a);
        dcall_free(&t);
    }
    printf("forward: %d cases on kernel %s, worst relative error %.3g\n", n, attn_kernel_name(),
           g_fwd_worst_rel);
}

/* ---- 7. misuse ------------------------------------------------------------------------------ */

static void misuse(void) {
    const float bad[] = {-0.1f, 1.0001f, NAN, INFINITY, -INFINITY};
    const dcase c = {1, 1, 1, 4, 4, 4, 4, .seed = 1};
    for (size_t a = 0; a < sizeof bad / sizeof bad[0]; a++) {
        dcall t;
        dcall_build(&t, &c);
        t.opt.dropout_p = bad[a];
        for (int64_t e = 0; e < n_of(&t.to); e++) t.o[e] = 42.0f;
        attn_status st = dcall_forward(&t, ATTN_PATH_FUSED, 0, false);
        int64_t written = 0;
        for (int64_t e = 0; e < n_of(&t.to); e++) written += t.o[e] != 42.0f;
        CHECK(st == ATTN_ERR_VALUE && written == 0, "dropout_p = %g: status %d, %lld written",
              (double)bad[a], (int)st, (long long)written);
        CHECK(strstr(attn_last_error(), "dropout_p") != NULL, "detail names dropout_p: %s",
              attn_last_error());
        size_t bytes;
        st = attn_forward_workspace_size(&t.tq, &t.tk, &t.tv, &t.to, &t.opt, &bytes);
        CHECK(st == ATTN_ERR_VALUE, "workspace query, dropout_p = %g: %d", (double)bad[a], (int)st);
        st = dcall_backward(&t, ATTN_PATH_FUSED, 0);
        CHECK(st == ATTN_ERR_VALUE, "backward, dropout_p = %g: %d", (double)bad[a], (int)st);
        dcall_free(&t);
    }
    /* additive attention has no dropout: refused, not ignored */
    float q[4] = {1, 2, 3, 4}, k[4] = {1, 0, 0, 1}, v[4] = {1, 2, 3, 4}, o[4] = {0};
    float wq[4] = {1, 0, 0, 1}, wk[4] = {1, 0, 0, 1}, wv[2] = {1, 1};
    attn_tensor tq = attn_tensor_4d(q, ATTN_F32, 1, 1, 2, 2), tk = attn_tensor_4d(k, ATTN_F32, 1, 1, 2, 2);
    attn_tensor tv = attn_tensor_4d(v, ATTN_F32, 1, 1, 2, 2), to = attn_tensor_4d(o, ATTN_F32, 1, 1, 2, 2);
    attn_additive_weights w = {.units = 2, .w_query = wq, .w_key = wk, .v = wv};
    attn_options opt = {.dropout_p = 0.5f};
    attn_status st = attn_additive_forward(&tq, &tk, &tv, &w, &to, &opt);
    CHECK(st == ATTN_ERR_UNSUPPORTED, "additive with dropout: %d (%s)", (int)st, attn_last_error());
    opt.dropout_p = 0.0f;
    if (strcmp(attn_blas_name(), "none") != 0) {  // its projections need a BLAS
        st = attn_additive_forward(&tq, &tk, &tv, &w, &to, &opt);
        CHECK(st == ATTN_OK, "additive without dropout: %d (%s)", (int)st, attn_last_error());
    }

    /* neither has the multi-head module (it calls the attention head by head for averaged
     * weights), nor the forward or backward of its layer: refused, not ignored */
    float eye[4] = {1, 0, 0, 1}, x[4] = {1, 2, 3, 4}, y[4] = {0}, dy[4] = {1, 1, 1, 1}, dx[4];
    attn_tensor tw = attn_tensor_4d(eye, ATTN_F32, 2, 2, 1, 1);
    attn_tensor tx = attn_tensor_4d(x, ATTN_F32, 1, 2, 2, 1), ty = attn_tensor_4d(y, ATTN_F32, 1, 2, 2, 1);
    attn_tensor tdy = attn_tensor_4d(dy, ATTN_F32, 1, 2, 2, 1), tdx = attn_tensor_4d(dx, ATTN_F32, 1, 2, 2, 1);
    attn_mha m = {.Hq = 1, .w_q = &tw, .w_k = &tw, .w_v = &tw, .w_o = &tw};
    attn_mha_grads g = {.dx_q = &tdx};
    opt.dropout_p = 0.1f;
    st = attn_mha_forward(&m, &tx, NULL, &ty, NULL, false, &opt);
    CHECK(st == ATTN_ERR_UNSUPPORTED, "mha forward with dropout: %d (%s)", (int)st, attn_last_error());
    st = attn_mha_backward(&m, &tx, NULL, &tdy, &g, &opt);
    CHECK(st == ATTN_ERR_UNSUPPORTED, "mha backward with dropout: %d (%s)", (int)st, attn_last_error());
    opt.dropout_p = 0.0f;
    st = attn_mha_forward(&m, &tx, NULL, &ty, NULL, false, &opt);
    CHECK(st == ATTN_OK || st == ATTN_ERR_UNSUPPORTED, "mha forward: %d (%s)", (int)st, attn_last_error());
}

int main(void) {
    known_answers();
    statistics();
    layout();
    forward();
    misuse();
    return check_summary("test_dropout");
}
