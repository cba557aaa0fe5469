/*
 * test_dropout_words.c — the vectorized dropout generator equals the scalar one.
 *
 * Each kernel table's `dropout` entry (kernels.h: philox.h's simd loop compiled at that
 * ISA's width), the portable attn_dropout_words and attn_dropout_factors_k (the backward's
 * factors) against philox.h's scalar definition, attn_dropout_group / attn_dropout_kept,
 * bit for bit, over many (seed, offset, row, column) tuples: random 64-bit seeds and
 * offsets (their high halves too), group indices near 0, near 2^32 (the carry into the
 * counter's second word) and near 2^64, runs of every length 1 .. 67 (the simd loop's
 * tails at every width), and rows of Lk = 1 .. 13 keys (short last groups).
 * Every kernel this CPU can run is checked (ATTN_ISA plays no part: all are named).
 * What it is not: a test of Philox itself (tests/test_dropout.c holds its known answers).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "attn.h"
#include "check.h"
#include "kernels/kernels.h"
#include "core/philox.h"
#include "rng.h"

static rng_t g_state = {0x243F6A8885A308D3ull};
static uint64_t next64(void) { return rng_next(&g_state); }

enum { MAXN = 67, LDU = 80 };

/* words(n, grp, ...) against attn_dropout_group for each group; the count of differing words */
static int64_t words_differ(attn_dropout_words_fn words, int64_t n, const uint64_t *grp,
                            uint64_t seed, uint64_t offset) {
    uint32_t u[4 * LDU];
    memset(u, 0xA5, sizeof u);
    if (words) words(n, grp, seed, offset, u, LDU);
    else attn_dropout_words(n, grp, seed, offset, u, LDU);
    int64_t bad = 0;
    for (int64_t t = 0; t < n; t++) {
        uint32_t want[4];
        attn_dropout_group(seed, offset, grp[t], want);
        for (int k = 0; k < 4; k++) bad += u[k * LDU + t] != want[k];
    }
    return bad;
}

static void check_words(const char *name, attn_dropout_words_fn words) {
    static const uint64_t starts[] = {0, 1, 0xFFFFFFF0ull, 0x100000000ull - 30,
                                      0xFFFFFFFFFFFFFFF0ull, 0x7FFFFFFFFFFFFFE0ull};
    int64_t bad = 0, tuples = 0;
    for (int trial = 0; trial < 400; trial++) {
        const uint64_t seed = trial == 0 ? 0 : next64(), offset = trial == 1 ? 0 : next64();
        const int64_t n = 1 + trial % MAXN;
        uint64_t grp[MAXN];
        const int kind = trial % 8;
        const uint64_t g0 = kind < 6 ? starts[kind] : next64();
        for (int64_t t = 0; t < n; t++)  // consecutive groups (a row) or scattered (a tile's rows)
            grp[t] = kind == 7 ? next64() : g0 + (uint64_t)t;
        bad += words_differ(words, n, grp, seed, offset);
        tuples += n;
    }
    CHECK(bad == 0, "kernel %s: %lld of %lld Philox words differ from the scalar ones", name,
          (long long)bad, (long long)(4 * tuples));
}

/* attn_dropout_factors_k against attn_dropout_kept, key by key */
static void check_factors(const char *name, attn_dropout_words_fn words) {
    int64_t bad = 0, n = 0;
    for (int trial = 0; trial < 300; trial++) {
        const uint64_t seed = next64(), offset = next64();
        const uint64_t Lk = 1 + (uint64_t)(trial % 13) + (trial % 3 == 0 ? 300 : 0);
        const uint64_t r = trial % 4 == 0 ? next64() >> 8 : (uint64_t)trial;
        const float p = (float)(trial % 11) / 10.0f;  // 0 .. 1: p = 1 keeps nothing (t = 2^32)
        const uint64_t thr = attn_dropout_threshold(p);
        /* p = 1 with a nonzero scale: the threshold 2^32 alone must drop every key */
        const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 2.0f;
        const uint64_t j0 = next64() % Lk, nk = 1 + next64() % (Lk - j0);
        float f[320];
        attn_dropout_factors_k(words, seed, offset, thr, scale, r, Lk, j0, nk, f, 1);
        for (uint64_t c = 0; c < nk; c++) {
            const float want = attn_dropout_kept(seed, offset, thr, r, Lk, j0 + c) ? scale : 0.0f;
            bad += memcmp(&f[c], &want, sizeof want) != 0;
            n++;
        }
    }
    CHECK(bad == 0, "kernel %s: %lld of %lld dropout factors differ from attn_dropout_kept",
          name, (long long)bad, (long long)n);
}

int main(void) {
    int kernels = 0;
    for (const char *const *name = attn_kernel_list(); *name; name++) {
        const attn_kernels *kern = ai_kernels_named(*name);
        if (!kern) {
            printf("test_dropout_words: kernel %s not runnable on this CPU, skipped\n", *name);
            continue;
        }
        CHECK(kern->dropout != NULL, "kernel %s has no dropout entry", *name);
        if (!kern->dropout) continue;
        check_words(*name, kern->dropout);
        check_factors(*name, kern->dropout);
        kernels++;
    }
    CHECK(kernels >= 1, "no kernel was checked");
    check_words("portable", NULL);
    check_factors("portable", NULL);
    printf("test_dropout_words: %d kernels checked\n", kernels);
    return check_summary("test_dropout_words");
}
