/*
 * philox.h — the counter-based generator of attention dropout: Philox4x32-10, and the
 *            keep decision of one attention weight as a pure function of (seed, offset,
 *            b, h, i, j).
 *
 * Philox4x32 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3",
 * SC 2011, section 3.2): a 128-bit counter (c0, c1, c2, c3) and a 64-bit key (k0, k1).
 * One round multiplies c0 and c2 by two constants into 64-bit products and mixes:
 *     (hi0, lo0) = M0 * c0      (hi1, lo1) = M1 * c2
 *     (c0, c1, c2, c3) <- (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0)
 * and between rounds the key advances by the Weyl constants (k0 += W0, k1 += W1), so
 * round r (0-based) uses the key plus r (W0, W1). Ten rounds make Philox4x32-10, which
 * the paper reports passing TestU01's BigCrush with margin (PyTorch and FlashAttention
 * use the same generator for dropout). Written here from that description; checked by
 * tests/test_dropout.c against the paper's known-answer vectors.
 *
 * What it is not: a stream with state. Every value is computed from its counter alone,
 * so any thread, kernel or path, forward or backward, gets the same bits for the same
 * element, on every machine.
 *
 * The dropout layout (docs/CONTRACT.md, "Dropout"): element (b, h, i, j) of the weights
 * [B, Hq, Lq, Lk] of a call belongs to row r = (b Hq + h) Lq + i and to the group
 * n = r ceil(Lk / 4) + floor(j / 4) of four consecutive keys of that row (the last group
 * of a row may be short; groups never straddle rows). Group n is one Philox call:
 *     counter = (lo32(n), hi32(n), lo32(offset), hi32(offset)),  key = (lo32(seed), hi32(seed))
 * and key j takes output word j mod 4, u. The weight is kept iff u >= t, with
 * t = round(p 2^32) (exactly p 2^32 when p >= 2^-9, as float32 p then has no bits below
 * 2^-32), so the keep probability is 1 - t / 2^32; p = 1 gives t = 2^32: nothing kept.
 * All index arithmetic is unsigned 64-bit, modulo 2^64. Distinct offsets give disjoint
 * counters (the offset is the counter's high half), so one seed serves many calls.
 */
#ifndef ATTN_PHILOX_H
#define ATTN_PHILOX_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define ATTN_PHILOX_M0 0xD2511F53u
#define ATTN_PHILOX_M1 0xCD9E8D57u
#define ATTN_PHILOX_W0 0x9E3779B9u  /* the golden ratio's fraction, 2^32 (sqrt(5) - 1) / 2 */
#define ATTN_PHILOX_W1 0xBB67AE85u  /* sqrt(3) - 1, times 2^32                            */

/* Philox4x32 with `rounds` rounds on counter ctr and key key, into out (may alias ctr). */
static inline void attn_philox4x32_r(int rounds, const uint32_t ctr[4], const uint32_t key[2],
                                     uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    /* unrolled, so that a loop of independent calls (a simd loop) has no inner loop */
#pragma GCC unroll 16
    for (int r = 0; r < rounds; r++) {
        const uint64_t p0 = (uint64_t)ATTN_PHILOX_M0 * c0, p1 = (uint64_t)ATTN_PHILOX_M1 * c2;
        const uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        const uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += ATTN_PHILOX_W0;  // the key of the next round
        k1 += ATTN_PHILOX_W1;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* Philox4x32-10 */
static inline void attn_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    attn_philox4x32_r(10, ctr, key, out);
}

/* The four words of group n under (seed, offset), as the layout above. */
static inline void attn_dropout_group(uint64_t seed, uint64_t offset, uint64_t n, uint32_t out[4]) {
    const uint32_t ctr[4] = {(uint32_t)n, (uint32_t)(n >> 32), (uint32_t)offset,
                             (uint32_t)(offset >> 32)};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    attn_philox4x32(ctr, key, out);
}

/* t = round(p 2^32) for 0 <= p <= 1 (the caller has checked p): 0 keeps everything,
 * 2^32 nothing. p * 2^32 is computed in double, exactly for a float p. */
static inline uint64_t attn_dropout_threshold(float p) {
    const double x = (double)p * 4294967296.0;
    return (uint64_t)(x + 0.5);
}

/* The one keep test: word u is kept iff u >= t. */
static inline bool attn_dropout_keeps(uint32_t u, uint64_t threshold) {
    return (uint64_t)u >= threshold;
}

/* The row index r of (b, h, i) in a call of Hq heads and Lq rows. */
static inline uint64_t attn_dropout_row(uint64_t b, uint64_t h, uint64_t i, uint64_t Hq,
                                        uint64_t Lq) {
    return (b * Hq + h) * Lq + i;
}

/* Whether element (row r, key j) of a call with Lk keys is kept: the scalar definition
 * every path agrees with. */
static inline bool attn_dropout_kept(uint64_t seed, uint64_t offset, uint64_t threshold,
                                     uint64_t r, uint64_t Lk, uint64_t j) {
    uint32_t u[4];
    attn_dropout_group(seed, offset, r * ((Lk + 3) / 4) + j / 4, u);
    return attn_dropout_keeps(u[j % 4], threshold);
}

/* The factors of keys j0 .. j0+nk-1 of row r: f[c * fs] = keep ? scale : 0, one Philox
 * call per group of four keys (the first and last may be partial). The groups' calls are
 * independent: they run side by side, up to 64 at a time, as one simd loop. */
static inline void attn_dropout_factors(uint64_t seed, uint64_t offset, uint64_t threshold,
                                        float scale, uint64_t r, uint64_t Lk, uint64_t j0,
                                        uint64_t nk, float *f, int64_t fs) {
    enum { CHUNK = 64 };
    const uint64_t base = r * ((Lk + 3) / 4), g_end = (j0 + nk + 3) / 4;
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t u[4][CHUNK];
    for (uint64_t g0 = j0 / 4; g0 < g_end; g0 += CHUNK) {
        const uint64_t ng = g_end - g0 < CHUNK ? g_end - g0 : CHUNK;
#pragma omp simd
        for (uint64_t t = 0; t < ng; t++) {
            const uint64_t n = base + g0 + t;
            const uint32_t ctr[4] = {(uint32_t)n, (uint32_t)(n >> 32), (uint32_t)offset,
                                     (uint32_t)(offset >> 32)};
            uint32_t out[4];
            attn_philox4x32(ctr, key, out);
            u[0][t] = out[0], u[1][t] = out[1], u[2][t] = out[2], u[3][t] = out[3];
        }
        const uint64_t ja = g0 * 4 > j0 ? g0 * 4 : j0, jb = (g0 + ng) * 4 < j0 + nk ? (g0 + ng) * 4 : j0 + nk;
        for (uint64_t j = ja; j < jb; j++)
            f[(int64_t)(j - j0) * fs] =
                attn_dropout_keeps(u[j % 4][j / 4 - g0], threshold) ? scale : 0.0f;
    }
}

/* The words of n Philox groups at once: for t < n, group grp[t] under (seed, offset) as
 * attn_dropout_group, its word w into u[w * ldu + t]. One simd loop over the groups (the
 * 32 x 32 -> 64 bit products are vpmuludq lanes): each ISA's kernel table compiles it with
 * its own flags (kernels.h, `dropout`), so that it runs at the ISA's width; bit for bit
 * attn_dropout_group, which tests/test_dropout_words.c checks. */
static inline void attn_dropout_words(int64_t n, const uint64_t *grp, uint64_t seed,
                                      uint64_t offset, uint32_t *u, int64_t ldu) {
    const uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    const uint32_t o0 = (uint32_t)offset, o1 = (uint32_t)(offset >> 32);
    uint32_t *u0 = u, *u1 = u + ldu, *u2 = u + 2 * ldu, *u3 = u + 3 * ldu;
#pragma omp simd
    for (int64_t t = 0; t < n; t++) {
        uint32_t c0 = (uint32_t)grp[t], c1 = (uint32_t)(grp[t] >> 32), c2 = o0, c3 = o1;
        uint32_t a = k0, b = k1;
#pragma GCC unroll 16
        for (int r = 0; r < 10; r++) {
            const uint64_t p0 = (uint64_t)ATTN_PHILOX_M0 * c0, p1 = (uint64_t)ATTN_PHILOX_M1 * c2;
            c0 = (uint32_t)(p1 >> 32) ^ c1 ^ a;
            c1 = (uint32_t)p1;
            c2 = (uint32_t)(p0 >> 32) ^ c3 ^ b;
            c3 = (uint32_t)p0;
            a += ATTN_PHILOX_W0;
            b += ATTN_PHILOX_W1;
        }
        u0[t] = c0, u1[t] = c1, u2[t] = c2, u3[t] = c3;
    }
}

/* The type of a kernel table's `dropout` entry (kernels.h): attn_dropout_words. */
typedef void (*attn_dropout_words_fn)(int64_t n, const uint64_t *grp, uint64_t seed,
                                      uint64_t offset, uint32_t *u, int64_t ldu);

/* attn_dropout_factors with the words from `words` (a kernel's `dropout`; NULL: the
 * portable attn_dropout_words): the same factors, bit for bit. */
static inline void attn_dropout_factors_k(attn_dropout_words_fn words, uint64_t seed,
                                          uint64_t offset, uint64_t threshold, float scale,
                                          uint64_t r, uint64_t Lk, uint64_t j0, uint64_t nk,
                                          float *f, int64_t fs) {
    enum { CHUNK = 64 };
    const uint64_t base = r * ((Lk + 3) / 4), g_end = (j0 + nk + 3) / 4;
    const bool none = threshold > UINT32_MAX;
    const uint32_t t32 = (uint32_t)threshold;
    uint32_t sbits;  // scale's bits, or 0 when nothing is kept
    memcpy(&sbits, &scale, sizeof sbits);
    if (none) sbits = 0;
    uint64_t grp[CHUNK];
    uint32_t u[4 * CHUNK], kf[4 * CHUNK];
    for (uint64_t g0 = j0 / 4; g0 < g_end; g0 += CHUNK) {
        const uint64_t ng = g_end - g0 < CHUNK ? g_end - g0 : CHUNK;
        for (uint64_t t = 0; t < ng; t++) grp[t] = base + g0 + t;
        if (words) words((int64_t)ng, grp, seed, offset, u, CHUNK);
        else attn_dropout_words((int64_t)ng, grp, seed, offset, u, CHUNK);
        /* the keep test word by word (a simd compare: t < 2^32 is a 32-bit one, t = 2^32
         * keeps nothing) giving the factor's bits, scale or +0, by a mask rather than a
         * float select (which stays a branch), then the factors in key order */
        for (int w = 0; w < 4; w++)
#pragma omp simd
            for (uint64_t t = 0; t < ng; t++)
                kf[w * CHUNK + t] = sbits & (0u - (uint32_t)(u[w * CHUNK + t] >= t32));
        const uint64_t ja = g0 * 4 > j0 ? g0 * 4 : j0,
                       jb = (g0 + ng) * 4 < j0 + nk ? (g0 + ng) * 4 : j0 + nk;
        for (uint64_t j = ja; j < jb; j++)
            memcpy(&f[(int64_t)(j - j0) * fs], &kf[(j % 4) * CHUNK + (j / 4 - g0)], sizeof(float));
    }
}

#endif /* ATTN_PHILOX_H */
