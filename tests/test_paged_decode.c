/*
 * test_paged_decode.c — decoding over a paged key/value cache whose tiles cross pages:
 *                       the kernels' decode_rows entry, and the fused path that takes it.
 *
 * A decoding-shaped block (at most 16 query rows) on a kernel with a decoding step reads a
 * clean tile that crosses pages in one step on its rows' addresses (kernels.h:
 * decode_rows), so that it computes what the contiguous cache's tile does. Checks:
 * - decode_rows on rows scattered through a buffer (the free slots NaN) = decode on the
 *   same rows at one stride, bit for bit: m, l, alpha and acc, from a running state, for
 *   n = 1..4 rows, tiles of 1 to 128 keys, float32 / float16 / bfloat16 (and q8_0, and
 *   fp8_e4m3 / fp8_e5m2 with k and v scales, where the kernel reads them) K and V, the
 *   FAST precision's rounding, with and without a next tile to prefetch (its rows
 *   scattered too);
 * - through the API, a paged cache (page sizes 1, 3, 16, 48, 64, 100, pages shuffled, NaN
 *   in every slot no valid key occupies, -1 past the valid pages of the table) = the
 *   contiguous cache, bit for bit, O, LSE and weights, on decoding shapes: 1, 4 and 16
 *   rows a block (GQA groups, several query rows), the split-KV path, bottom-right causal
 *   with key lengths, float32 / float16 / bfloat16 / q8_0 caches, the FAST precision;
 *   and within the contract's float32 tolerance of the float64 reference;
 * - a planted error (one valid key of the pool turned towards the query after the copy)
 *   must fail both checks.
 * On a kernel without decode_rows (generic) such tiles are read segment by segment and
 * round differently: there the API cases meet the reference only (the bit checks are
 * reported as skipped). The kernel is chosen by ATTN_ISA.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "check.h"
#include "core/half.h"
#include "kernels/kernels.h"
#include "pages.h"

static uint64_t g_rng = 0x6a09e667f3bcc909ull;
static double urand(void) {  // [0, 1)
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / 9007199254740992.0;
}
static float frand(void) { return (float)(2.0 * urand() - 1.0); }

/* bytes of n elements of dt from a row's start (q8_0: n a multiple of 32) */
static int64_t nbytes(attn_dtype dt, int64_t n) {
    return dt == ATTN_Q8_0 ? n / 32 * 34 : n * (int64_t)attn_dtype_size(dt);
}

/* rows of `width` elements of dt, random, into buf (q8_0: quantized float32 rows) */
static void fill_rows(attn_dtype dt, int64_t rows, int64_t width, float amp, void *buf) {
    float *x = malloc((size_t)(rows * width) * sizeof(float));
    for (int64_t i = 0; i < rows * width; i++) x[i] = amp * frand();
    if (dt == ATTN_Q8_0) {
        attn_tensor src = attn_tensor_4d(x, ATTN_F32, 1, 1, rows, width);
        attn_tensor dst = attn_tensor_4d(buf, ATTN_Q8_0, 1, 1, rows, width);
        CHECK(attn_quantize_q8_0(&src, &dst) == ATTN_OK, "quantize: %s", attn_last_error());
    } else {
        for (int64_t i = 0; i < rows * width; i++) attn_store(dt, buf, i, x[i]);
    }
    free(x);
}

/* ---- the kernel entry alone ----------------------------------------------------------- */

/* decode_rows on rows scattered through slots of a NaN-filled buffer against decode on
 * the same rows at one stride (nk keys of this tile, then nk_next of the next one); ks, vs
 * the fp8 scales (1 for the other dtypes). */
static void kernel_case(const attn_kernels *k, int64_t n, int64_t nk, int64_t dk, int64_t dv,
                        attn_dtype dt, bool round_p, int64_t nk_next, float ks, float vs) {
    const int64_t rk = nbytes(dt, dk), rv = nbytes(dt, dv), rows = nk + nk_next;
    const int64_t slots = 3 * rows + 1;
    char *kc = malloc((size_t)(rows * rk) + 1), *vc = malloc((size_t)(rows * rv) + 1);
    char *kp = malloc((size_t)(slots * rk) + 1), *vp = malloc((size_t)(slots * rv) + 1);
    float *q = malloc((size_t)(4 * dk) * sizeof(float));
    float *s = malloc((size_t)(4 * (nk + 4)) * sizeof(float)), *s2 = malloc((size_t)(4 * (nk + 4)) * sizeof(float));
    float *acc = malloc((size_t)(4 * dv) * sizeof(float)), *acc2 = malloc((size_t)(4 * dv) * sizeof(float));
    const char **kr = malloc((size_t)rows * sizeof(char *)), **vr = malloc((size_t)rows * sizeof(char *));
    fill_rows(dt, rows, dk, 2.0f, kc);
    fill_rows(dt, rows, dv, 1.0f, vc);
    memset(kp, 0xff, (size_t)(slots * rk));  // NaN in every format (q8_0: its scale)
    memset(vp, 0xff, (size_t)(slots * rv));
    int32_t *perm = shuffled_pages(slots, urand);
    for (int64_t c = 0; c < rows; c++) {
        kr[c] = kp + perm[c] * rk, vr[c] = vp + perm[rows + c] * rv;
        memcpy(kp + perm[c] * rk, kc + c * rk, (size_t)rk);
        memcpy(vp + perm[rows + c] * rv, vc + c * rv, (size_t)rv);
    }
    for (int64_t i = 0; i < n * dk; i++) q[i] = frand();
    float m[4], l[4], a[4], m2[4], l2[4], a2[4];
    for (int64_t r = 0; r < 4; r++) {  // row 1 fresh, the others with earlier keys
        const bool fresh = r == 1;
        m[r] = m2[r] = fresh ? -INFINITY : 0.5f * frand();
        l[r] = l2[r] = fresh ? 0.0f : 3.0f + frand();
        for (int64_t d = 0; d < dv; d++) acc[r * dv + d] = acc2[r * dv + d] = fresh ? 0.0f : frand();
    }
    const float scale = 0.37f;
    const int64_t ldk = dk, ldv = dv;  // dense rows: the stride is the width (in elements)
    /* both ask for the next tile's V and K, as a later pass over a tile does */
    k->decode(n, nk, dk, dv, q, dt, round_p, kc, ldk, vc, ldv, scale, ks, vs, s, m, l, a, acc,
              nk_next > 0 ? vc + nk * rv : NULL, nk_next, nk_next > 0 ? kc + nk * rk : NULL, nk_next);
    k->decode_rows(n, nk, dk, dv, q, dt, round_p, kr, vr, scale, ks, vs, s2, m2, l2, a2, acc2,
                   vr + nk, nk_next, kr + nk, nk_next);
    const bool same = memcmp(m, m2, (size_t)n * sizeof(float)) == 0 &&
                      memcmp(l, l2, (size_t)n * sizeof(float)) == 0 &&
                      memcmp(a, a2, (size_t)n * sizeof(float)) == 0 &&
                      memcmp(acc, acc2, (size_t)(n * dv) * sizeof(float)) == 0;
    bool finite = true;
    for (int64_t x = 0; x < n * dv; x++) finite &= isfinite(acc2[x]);
    CHECK(same && finite, "%s decode_rows n=%lld nk=%lld dk=%lld dv=%lld %s%s next %lld: %s",
          k->name, (long long)n, (long long)nk, (long long)dk, (long long)dv,
          attn_dtype_name(dt), round_p ? " FAST" : "", (long long)nk_next,
          !finite ? "NaN: a free slot was read" : "not decode's bits on the same rows");
    free(kc), free(vc), free(kp), free(vp), free(q), free(s), free(s2), free(acc), free(acc2);
    free(kr), free(vr), free(perm);
}

static void test_kernel(const attn_kernels *k) {
    static const int64_t nks[] = {1, 2, 3, 16, 17, 64, 127, 128};
    static const attn_dtype dts[] = {ATTN_F32, ATTN_F16, ATTN_BF16, ATTN_Q8_0, ATTN_FP8_E4M3,
                                     ATTN_FP8_E5M2};
    static const int64_t dims[][2] = {{64, 64}, {128, 128}, {40, 24}, {17, 65}, {96, 160}};
    for (size_t t = 0; t < sizeof dts / sizeof dts[0]; t++) {
        if (dts[t] == ATTN_Q8_0 && !k->decode_q8_0) continue;
        if (attn_is_fp8(dts[t]) && !k->decode_fp8) continue;
        /* fp8: scales whose products round (not powers of two), k's and v's different */
        const float ks = attn_is_fp8(dts[t]) ? 0.0123f : 1.0f, vs = attn_is_fp8(dts[t]) ? 3.7f : 1.0f;
        for (int64_t n = 1; n <= 4; n++)
            for (size_t b = 0; b < sizeof nks / sizeof nks[0]; b++) {
                const size_t di = (size_t)(n + (int64_t)b) % 5;
                int64_t dk = dims[di][0], dv = dims[di][1];
                if (dts[t] == ATTN_Q8_0) dk = (dk + 31) / 32 * 32, dv = (dv + 31) / 32 * 32;
                const int64_t next = b % 3 == 0 ? 0 : b % 3 == 1 ? nks[b] : 5;
                kernel_case(k, n, nks[b], dk, dv, dts[t], false, next, ks, vs);
                if (dts[t] == ATTN_BF16) kernel_case(k, n, nks[b], dk, dv, dts[t], true, next, ks, vs);
            }
    }
}

/* ---- through the API ----------------------------------------------------------------- */

typedef struct shape {
    int64_t B, Hq, Hkv, Lq, D, lens[2];
    bool causal, lse, weights, fast;
} shape;

/* One case: the cache contiguous and paged (page size ps), fused both ways and the float64
 * reference over the contiguous cache. plant: one valid key of the pool is turned towards
 * the query after the copy, and the checks must fail. */
static void api_case(const shape *sh, attn_dtype dt, int64_t ps, bool bits, bool plant) {
    const int64_t B = sh->B, Hq = sh->Hq, Hkv = sh->Hkv, Lq = sh->Lq, D = sh->D;
    int64_t Lk = 0;
    for (int64_t b = 0; b < B; b++) Lk = sh->lens[b] > Lk ? sh->lens[b] : Lk;
    const int64_t pages = (Lk + ps - 1) / ps, np = B * pages + 3, rb = nbytes(dt, D);
    const size_t cbytes = (size_t)(B * Hkv * Lk * rb), pbytes = (size_t)(np * Hkv * ps * rb);
    char *kc = malloc(cbytes), *vc = malloc(cbytes), *kp = malloc(pbytes), *vp = malloc(pbytes);
    fill_rows(dt, B * Hkv * Lk, D, 2.0f, kc);
    fill_rows(dt, B * Hkv * Lk, D, 1.0f, vc);
    memset(kp, 0xff, pbytes);  // NaN in every slot no valid key occupies
    memset(vp, 0xff, pbytes);
    int32_t *perm = shuffled_pages(np, urand), *bt = malloc((size_t)(B * pages) * sizeof(int32_t));
    int32_t len[2];
    int64_t next = 0;
    for (int64_t b = 0; b < B; b++) {
        len[b] = (int32_t)sh->lens[b];
        for (int64_t pg = 0; pg < pages; pg++)
            bt[b * pages + pg] = pg < (sh->lens[b] + ps - 1) / ps ? perm[next++] : -1;
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < sh->lens[b]; j++)
            for (int64_t g = 0; g < Hkv; g++) {
                const int64_t x = ((b * Hkv + g) * Lk + j) * rb;
                const int64_t y = ((bt[b * pages + j / ps] * Hkv + g) * ps + j % ps) * rb;
                memcpy(kp + y, kc + x, (size_t)rb), memcpy(vp + y, vc + x, (size_t)rb);
            }
    float *q = malloc((size_t)(B * Hq * Lq * D) * sizeof(float));
    for (int64_t x = 0; x < B * Hq * Lq * D; x++) q[x] = frand();
    if (plant) {  // key len/2 of batch 0, head 0: made the query's (float32 and 16-bit)
        const int64_t j = sh->lens[0] / 2, y = ((bt[j / ps] * Hkv) * ps + j % ps) * rb;
        if (dt == ATTN_Q8_0) {
            attn_tensor src = attn_tensor_4d(q, ATTN_F32, 1, 1, 1, D);
            attn_tensor dst = attn_tensor_4d(kp + y, ATTN_Q8_0, 1, 1, 1, D);
            CHECK(attn_quantize_q8_0(&src, &dst) == ATTN_OK, "plant: %s", attn_last_error());
        } else {
            for (int64_t d = 0; d < D; d++) attn_store(dt, kp + y, d, 3.0f * q[d]);
        }
    }
    /* the paged call's weights have a key for each slot of the table's pages */
    const int64_t no = B * Hq * Lq * D, nl = B * Hq * Lq, nw = B * Hq * Lq * Lk, Lkp = pages * ps;
    float *o[3], *lse[3], *w[3];
    attn_status st[3];
    attn_tensor tk = attn_tensor_4d(kc, dt, B, Hkv, Lk, D), tv = attn_tensor_4d(vc, dt, B, Hkv, Lk, D);
    attn_tensor tkp = attn_tensor_4d(kp, dt, np, Hkv, ps, D), tvp = attn_tensor_4d(vp, dt, np, Hkv, ps, D);
    attn_tensor tbt = attn_tensor_4d(bt, ATTN_I32, B, pages, 1, 1), tl = attn_tensor_4d(len, ATTN_I32, B, 1, 1, 1);
    attn_tensor tq = attn_tensor_4d(q, ATTN_F32, B, Hq, Lq, D);
    for (int r = 0; r < 3; r++) {  // paged, contiguous, reference
        o[r] = calloc((size_t)no, sizeof(float)), lse[r] = calloc((size_t)nl, sizeof(float));
        w[r] = calloc((size_t)(nl * Lkp), sizeof(float));
        attn_tensor to = attn_tensor_4d(o[r], ATTN_F32, B, Hq, Lq, D);
        attn_tensor tlse = attn_tensor_4d(lse[r], ATTN_F32, B, Hq, Lq, 1);
        attn_tensor tw = attn_tensor_4d(w[r], ATTN_F32, B, Hq, Lq, r == 0 ? Lkp : Lk);
        attn_options opt = {.causal = sh->causal, .align = ATTN_ALIGN_BOTTOM_RIGHT, .kv_len = &tl,
                            .block_table = r == 0 ? &tbt : NULL,
                            .lse = sh->lse ? &tlse : NULL, .weights = sh->weights ? &tw : NULL,
                            .precision = sh->fast ? ATTN_PRECISION_FAST : ATTN_PRECISION_DEFAULT,
                            .path = r == 2 ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED, .threads = 2};
        st[r] = attn_forward(&tq, r == 0 ? &tkp : &tk, r == 0 ? &tvp : &tv, &to, &opt);
    }
    char tag[200];
    snprintf(tag, sizeof tag, "page %lld, %s, B %lld Hq %lld Hkv %lld Lq %lld D %lld, lens %lld %lld%s%s%s",
             (long long)ps, attn_dtype_name(dt), (long long)B, (long long)Hq, (long long)Hkv,
             (long long)Lq, (long long)D, (long long)sh->lens[0], (long long)sh->lens[B - 1],
             sh->causal ? ", causal" : "", sh->fast ? ", FAST" : "", plant ? " (planted error)" : "");
    CHECK(st[0] == ATTN_OK && st[1] == ATTN_OK && st[2] == ATTN_OK, "%s: statuses %d %d %d (%s)",
          tag, st[0], st[1], st[2], attn_last_error());
    bool same = memcmp(o[0], o[1], (size_t)no * sizeof(float)) == 0 &&
                (!sh->lse || memcmp(lse[0], lse[1], (size_t)nl * sizeof(float)) == 0);
    for (int64_t x = 0; sh->weights && x < nl; x++)  // row x: Lk keys, then the slots' 0
        for (int64_t j = 0; j < Lkp; j++) {
            const float a = w[0][x * Lkp + j], b = j < Lk ? w[1][x * Lk + j] : 0.0f;
            same &= memcmp(&a, &b, sizeof a) == 0;
        }
    double *ref = malloc((size_t)(no > nw ? no : nw) * sizeof(double));
    tol_result tr = {0}, tw = {0};
    for (int64_t x = 0; x < no; x++) ref[x] = o[2][x];
    bool near = within_f32_tol(o[0], ref, no, &tr) != 0;
    if (sh->weights) {  // the paged weights' first Lk keys of each row, packed
        float *wp = malloc((size_t)nw * sizeof(float));
        for (int64_t x = 0; x < nw; x++) ref[x] = w[2][x], wp[x] = w[0][x / Lk * Lkp + x % Lk];
        near &= within_f32_tol(wp, ref, nw, &tw) != 0;
        free(wp);
    }
    /* the FAST precision rounds P to bfloat16: its own bound, checked in test_half;
     * here the paged call is held to the contiguous one's bits */
    if (plant) {
        CHECK(!same, "%s: the bit check missed it", tag);
        CHECK(!near, "%s: the tolerance missed it (max err %g, rel %g)", tag, tr.max_err, tr.rel_err);
    } else {
        if (bits) CHECK(same, "%s: paged != contiguous (bits)", tag);
        CHECK(near || sh->fast, "%s: paged off the reference (max err %g, rel %g; weights %g)", tag,
              tr.max_err, tr.rel_err, tw.max_err);
    }
    for (int r = 0; r < 3; r++) free(o[r]), free(lse[r]), free(w[r]);
    free(ref), free(q), free(kc), free(vc), free(kp), free(vp), free(perm), free(bt);
}

static void test_api(bool bits) {
    static const int64_t pss[] = {1, 3, 16, 48, 64, 100};
    static const attn_dtype dts[] = {ATTN_F32, ATTN_F16, ATTN_BF16, ATTN_Q8_0};
    const shape shapes[] = {
        {.B = 2, .Hq = 8, .Hkv = 2, .Lq = 1, .D = 64, .lens = {700, 333}, .lse = true},
        {.B = 1, .Hq = 16, .Hkv = 1, .Lq = 1, .D = 128, .lens = {5000}, .lse = true},  // split
        {.B = 2, .Hq = 2, .Hkv = 2, .Lq = 3, .D = 96, .lens = {517, 260}, .causal = true},
        {.B = 2, .Hq = 4, .Hkv = 2, .Lq = 2, .D = 64, .lens = {300, 129}, .causal = true,
         .lse = true, .weights = true, .fast = true},
    };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t t = 0; t < 4; t++)
            for (size_t i = 0; i < sizeof pss / sizeof pss[0]; i++) {
                if (shapes[s].fast && dts[t] != ATTN_BF16) continue;
                api_case(&shapes[s], dts[t], pss[i], bits, false);
            }
    api_case(&shapes[0], ATTN_F32, 16, bits, true);
    api_case(&shapes[1], ATTN_BF16, 48, bits, true);
    api_case(&shapes[2], ATTN_Q8_0, 3, bits, true);
}

int main(void) {
#define X_TEST(name, ...)                                                 \
    if (attn_kernel_supported(#name) && attn_kernels_##name.decode_rows) \
        test_kernel(&attn_kernels_##name);
    ATTN_KERNEL_LIST(X_TEST)
#undef X_TEST
    const char *why = NULL;
    const attn_kernels *k = ai_select_kernels(&why);
    /* the tiles across pages in one step (decode_rows), or no decoding step at all (every
     * tile gathered): the contiguous cache's bits */
    const bool bits = k && (k->decode_rows || !k->decode);
    if (!bits) printf("  kernel %s: no decode_rows, paged = contiguous bit for bit not checked\n", k ? k->name : "?");
    test_api(bits);
    return check_summary("paged_decode");
}
