/*
 * fuzz_serving.c — libFuzzer harness of the serving calls: the paged KV cache
 *                  (attn_kv_append, then attn_forward over the pages), attn_merge and
 *                  attn_cascade_forward. The input's first byte picks the surface; the
 *                  rest decides sizes, dtypes, layouts, options and now and then a fault,
 *                  and seeds the values.
 *
 *   (a) paged cache: page size, page count, a block table (a permutation of the pool's
 *       pages; as faults a repeated page or an entry outside the pool), old lengths and
 *       n new tokens, appended by position through the table, by slot (int32 or int64,
 *       -1 padding) or into a contiguous cache, float32 / float16 / bfloat16 / q8_0
 *       caches (a NaN row as a q8_0 fault, the caches overlapping as another). The
 *       harness predicts whether the append may succeed (every target row inside the
 *       pool, none twice); a refused append leaves both pools byte for byte, an accepted
 *       one writes exactly the rows named, each as attn_store / attn_quantize_q8_0 gives
 *       it, and nothing else. Then attn_forward over the pages (kv_len = old + n): a
 *       needed entry outside the pool must be refused with nothing written; otherwise 1
 *       and 3 threads bit-identical, the element rule against the reference path, and
 *       the element rule against the same call over a contiguous copy of the rows (bit
 *       for bit with a softcap, where the contract promises the same tiles).
 *   (b) attn_merge: keys cut into n ranges (empty ones and fully masked rows give -inf
 *       LSE parts, whose O is then overwritten with NaN: it must not be read), permuted
 *       part strides, in-place merges, faults (n < 0, threads < 0, NULL arrays, a part
 *       of another shape or dtype, an output overlapping itself); against one
 *       attn_forward over all keys: the element rule on O (both float32 results: twice
 *       1e-5) and the LSE within twice tol_lse_bound (tools/common/tolerance.h).
 *   (c) attn_cascade_forward: prefix and suffixes each contiguous or paged, each of the
 *       four cache dtypes, optional kv_len, scale, softcap, bottom-right causal, sinks,
 *       lse, faults; against attn_forward's reference path over the concatenated keys:
 *       the element rule on O, the LSE within tol_lse_bound, 1 and 3 threads
 *       bit-identical.
 *   (d) fp8 caches under scales (a first byte from 0xF0: the three surfaces above keep
 *       the corpus's other bytes): e4m3 or e5m2 K and V of random bytes (NaN codes, and
 *       e5m2's infinities, now and then), k_scale and v_scale absent, per tensor or per
 *       head, from powers of two 2^-30 .. 2^80 (both sides of the AVX-512 step's fold,
 *       1 .. 2^64 with e4m3's 2^8), other positive numbers, and as faults 0, -1, NaN,
 *       inf; queries of moderate logits, or hostile ones (magnitudes up to 2^70, an
 *       element past 2^60: the fold's guard). A fault is refused with nothing written;
 *       otherwise 1 and 3 threads bit-identical and, on moderate logits, the element
 *       rule against the call over float32 copies of fl32(value · scale) (every path
 *       reads exactly those values) and against the reference path. (The same bits as
 *       that float32 call hold for the decoding step itself, test_kernels; a whole call
 *       may tile a byte cache otherwise.)
 * A broken rule aborts. Sizes stay small (a few thousand elements). Build: make fuzz-build.
 */
#define FUZZ_NAME "fuzz_serving"
#include "fuzz_common.h"
#include "tolerance.h"

static const attn_dtype FDT[3] = {ATTN_F32, ATTN_F16, ATTN_BF16};
static const attn_dtype CDT[4] = {ATTN_F32, ATTN_F16, ATTN_BF16, ATTN_Q8_0};

/* the largest logit magnitude of each row: |scale| max_j sum_d |q_d k_d| + softcap, over
 * q [B, Hq, Lq, Dk] (values) and k [B, Hkv, L, Dk] (values, L rows) */
static void row_mags(double *mag, const attn_tensor *q, const float *k, int64_t Hkv, int64_t L,
                     double scale, double softcap) {
    const int64_t B = q->shape[0], Hq = q->shape[1], Lq = q->shape[2], Dk = q->shape[3];
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < Lq; i++) {
                double m = 0;
                const float *kh = k + ((b * Hkv + h / (Hq / Hkv)) * L) * Dk;
                for (int64_t j = 0; j < L; j++) {
                    double s = 0;
                    for (int64_t d = 0; d < Dk; d++)
                        s += fabs(get(q, ((b * Hq + h) * Lq + i) * Dk + d) * kh[j * Dk + d]);
                    if (s > m) m = s;
                }
                mag[(b * Hq + h) * Lq + i] = fabs(scale) * m + softcap;
            }
}

static void compare_lse(const char *what, const attn_tensor *got, const attn_tensor *ref,
                        const double *mag, int64_t dk, int64_t n_keys, double times) {
    for (int64_t k = 0; k < numel(got); k++) {
        const double g = get(got, k), e = get(ref, k);
        if (!isfinite(e) || !isfinite(g)) {
            REQUIRE((isnan(e) && isnan(g)) || g == e, "%s row %lld: %g vs %g", what, (long long)k, g, e);
            continue;
        }
        const double tol = times * tol_lse_bound(dk, n_keys, mag[k]);
        REQUIRE(fabs(g - e) <= tol, "%s row %lld: %.9g vs %.9g (tolerance %.3g)", what,
                (long long)k, g, e, tol);
    }
}

/* A call's queries (filled from the stream), output and LSE: [B, Hq, Lq, Dk], [.., Dv] */
static void query_out_new(buf *q, buf *o, buf *lse, attn_dtype qdt, attn_dtype odt, int64_t B,
                          int64_t Hq, int64_t Lq, int64_t Dk, int64_t Dv) {
    buf_new(q, qdt, B, Hq, Lq, Dk);
    fill(&q->t, 1.0);
    buf_new(o, odt, B, Hq, Lq, Dv);
    buf_new(lse, ATTN_F32, B, Hq, Lq, 1);
}

/* ---- (a) the paged cache ------------------------------------------------------------ */

static void fuzz_paged(reader *r) {
    const int64_t B = 1 + pick(r, 3), Hkv = 1 + pick(r, 2), G = 1 + pick(r, 2), Hq = Hkv * G;
    const attn_dtype cd = CDT[pick(r, 4)];
    const bool q8 = cd == ATTN_Q8_0;
    const int64_t Dk = q8 ? 32 : 1 + pick(r, 12), Dv = q8 ? 32 * (1 + pick(r, 2)) : 1 + pick(r, 12);
    const int mode = (int)pick(r, 3);  // 0 by position through the table, 1 by slot, 2 contiguous
    int64_t ps = 1 + pick(r, 5), mp = 1 + pick(r, 4), N = B * mp + pick(r, 3);
    const int64_t Lmax = mp * ps;
    if (mode == 2) ps = Lmax, mp = 1, N = B;  // a contiguous cache: page b of size Lmax
    const int64_t n = pick(r, 4);
    const unsigned fault = byte(r) % 10;

    /* the table: a permutation of the pool's pages, then the faults */
    int32_t *table = xmalloc((size_t)(B * mp) * sizeof *table);
    {
        int64_t *perm = xmalloc((size_t)N * sizeof *perm);
        for (int64_t i = 0; i < N; i++) perm[i] = i;
        for (int64_t i = N - 1; i > 0; i--) {
            const int64_t j = (int64_t)(unif() * (double)(i + 1)), x = perm[i];
            perm[i] = perm[j], perm[j] = x;
        }
        for (int64_t i = 0; i < B * mp; i++) table[i] = (int32_t)(mode == 2 ? i : perm[i]);
        free(perm);
    }
    if (mode != 2 && fault == 1 && B * mp > 1) {  // a page in two places
        table[pick(r, B * mp)] = table[pick(r, B * mp)];
    } else if (mode != 2 && fault == 2) {  // an entry outside the pool
        table[pick(r, B * mp)] = pick(r, 2) ? (int32_t)(N + pick(r, 3)) : (int32_t)(-1 - pick(r, 3));
    }
    int64_t *len = xmalloc((size_t)B * sizeof *len);
    for (int64_t b = 0; b < B; b++) len[b] = pick(r, Lmax + 1);

    /* the pools (or contiguous caches) and their values */
    buf kc, vc;
    buf_new(&kc, cd, N, Hkv, ps, Dk);
    buf_new(&vc, cd, N, Hkv, ps, Dv);
    free(cache_fill(&kc.t, 1.0));
    free(cache_fill(&vc.t, 1.0));

    /* the new rows, float32 [B, Hkv, n, D] (FlashAttention's [B, n, Hkv, D] when permuted) */
    buf kn, vn;
    const bool perm_new = pick(r, 2);
    buf_new(&kn, ATTN_F32, B, perm_new ? n : Hkv, perm_new ? Hkv : n, Dk);
    buf_new(&vn, ATTN_F32, B, Hkv, n, Dv);
    fill(&kn.t, 1.0);
    fill(&vn.t, 1.0);
    if (perm_new) {  // view [B, n, Hkv, Dk] storage as [B, Hkv, n, Dk]
        kn.t.shape[1] = Hkv, kn.t.shape[2] = n;
        const int64_t s1 = kn.t.stride[1];
        kn.t.stride[1] = kn.t.stride[2], kn.t.stride[2] = s1;
    }
    bool nan_row = false;
    int64_t nan_b = 0, nan_t = 0;
    if (q8 && fault == 3 && n > 0) {
        nan_b = pick(r, B), nan_t = pick(r, n), nan_row = true;
        ((float *)kn.t.data)[nan_b * kn.t.stride[0] + nan_t * kn.t.stride[2]] = NAN;
    }

    /* where each token goes: (page, row), or -1 (a padding slot) */
    int64_t *slot = xmalloc((size_t)(B * (n ? n : 1)) * sizeof *slot);
    bool expect_ok = true;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < n; t++) {
            const int64_t pos = len[b] + t, p = pos / ps;
            int64_t s;
            if (p >= mp) s = N * ps + pick(r, 2);  // past the table (or the cache)
            else s = (int64_t)table[b * mp + p] * ps + pos % ps;
            if (mode == 1 && pick(r, 8) == 0) s = -1;  // padding token
            if (mode == 1 && fault == 4 && pick(r, 4) == 0) s = N * ps;  // slot outside
            slot[b * n + t] = s;
        }
    {
        unsigned char *seen = calloc((size_t)(N * ps), 1);
        if (!seen) abort();
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < n; t++) {
                const int64_t pos = len[b] + t, p = pos / ps, s = slot[b * n + t];
                if (mode == 1 && s == -1) continue;
                bool in = mode == 1 ? s >= 0 && s < N * ps
                                    : p < mp && table[b * mp + p] >= 0 && table[b * mp + p] < N;
                if (!in) { expect_ok = false; continue; }
                if (seen[s]) expect_ok = false;
                seen[s] = 1;
                if (nan_row && b == nan_b && t == nan_t) expect_ok = false;
            }
        free(seen);
    }
    buf kvl, tab, slots;
    const attn_dtype ldt = pick(r, 2) ? ATTN_I64 : ATTN_I32;
    buf_new(&kvl, ldt, B, 1, 1, 1);
    for (int64_t b = 0; b < B; b++) {
        if (ldt == ATTN_I32) ((int32_t *)kvl.t.data)[b] = (int32_t)len[b];
        else ((int64_t *)kvl.t.data)[b] = len[b];
    }
    buf_new(&tab, ATTN_I32, B, mp, 1, 1);
    memcpy(tab.t.data, table, (size_t)(B * mp) * sizeof *table);
    const attn_dtype sdt = pick(r, 2) ? ATTN_I64 : ATTN_I32;
    buf_new(&slots, sdt, B, n, 1, 1);
    for (int64_t i = 0; i < B * n; i++) {
        if (sdt == ATTN_I32) ((int32_t *)slots.t.data)[i] = (int32_t)slot[i];
        else ((int64_t *)slots.t.data)[i] = slot[i];
    }
    const attn_tensor *vcache = &vc.t;
    if (fault == 5 && Dk == Dv && n > 0 && mode == 0) {  // the caches overlap
        vcache = &kc.t;
        expect_ok = false;
    }

    /* the append */
    buf kc0, vc0;
    buf_copy(&kc0, &kc);
    buf_copy(&vc0, &vc);
    const attn_status st = attn_kv_append(&kn.t, &vn.t, &kc.t, vcache, mode == 1 ? &slots.t : NULL,
                                          mode == 0 ? &tab.t : NULL,
                                          mode == 1 && pick(r, 2) ? NULL : &kvl.t);
    if (getenv("FUZZ_VERBOSE"))
        fprintf(stderr, "paged: B %lld Hq %lld Hkv %lld Dk %lld Dv %lld cache %s mode %d ps %lld "
                "mp %lld N %lld n %lld fault %u expect %d status %d (%s)\n", (long long)B,
                (long long)Hq, (long long)Hkv, (long long)Dk, (long long)Dv, attn_dtype_name(cd),
                mode, (long long)ps, (long long)mp, (long long)N, (long long)n, fault, expect_ok,
                (int)st, attn_last_error());
    if (!expect_ok) {
        REQUIRE(st != ATTN_OK, "append accepted a fault (mode %d, fault %u)", mode, fault);
        REQUIRE(same_bytes(&kc, &kc0) && same_bytes(&vc, &vc0), "failed append (%s) wrote the cache",
                attn_last_error());
    } else {
        REQUIRE(st == ATTN_OK, "append refused (mode %d): %s", mode, attn_last_error());
        /* the expected pools: the old ones with the named rows written */
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < n; t++) {
                const int64_t s = slot[b * n + t];
                if (s < 0) continue;
                for (int64_t h = 0; h < Hkv; h++)
                    for (int c = 0; c < 2; c++) {
                        const buf *nw = c ? &vn : &kn;
                        buf *ex = c ? &vc0 : &kc0;
                        const int64_t D = c ? Dv : Dk;
                        const float *src = (const float *)nw->t.data + b * nw->t.stride[0] +
                                           h * nw->t.stride[1] + t * nw->t.stride[2];
                        unsigned char *dst = row_at(&ex->t, s / ps, h, s % ps);
                        if (q8) {
                            attn_tensor in = {(void *)src, ATTN_F32, {1, 1, 1, D}, {D, D, D, 1}};
                            attn_tensor out = {dst, ATTN_Q8_0, {1, 1, 1, D}, {D, D, D, 1}};
                            REQUIRE(attn_quantize_q8_0(&in, &out) == ATTN_OK, "%s", attn_last_error());
                        } else {
                            for (int64_t d = 0; d < D; d++) attn_store(cd, dst, d, src[d]);
                        }
                    }
            }
        REQUIRE(same_bytes(&kc, &kc0), "K pool after the append: not the rows named, as stored");
        REQUIRE(same_bytes(&vc, &vc0), "V pool after the append: not the rows named, as stored");
    }
    buf_free(&kc0);
    buf_free(&vc0);

    /* attention over the cache: kv_len = old + n where the append succeeded */
    const int64_t Lq = 1 + pick(r, 4);
    const attn_dtype qdt = FDT[pick(r, 3)], odt = FDT[pick(r, 3)];
    buf q, o, lse, kl2;
    query_out_new(&q, &o, &lse, qdt, odt, B, Hq, Lq, Dk, Dv);
    buf_new(&kl2, ATTN_I32, B, 1, 1, 1);
    bool fwd_ok = true;
    for (int64_t b = 0; b < B; b++) {
        const int64_t L = len[b] + (st == ATTN_OK ? n : 0);
        ((int32_t *)kl2.t.data)[b] = (int32_t)L;
        if (L > Lmax) fwd_ok = false;  // a padding slot past the table's pages
        for (int64_t p = 0; p < (L + ps - 1) / ps && p < mp; p++)
            if (mode != 2 && (table[b * mp + p] < 0 || table[b * mp + p] >= N)) fwd_ok = false;
    }
    const unsigned f = byte(r);
    attn_options opt = {0};
    opt.causal = f & 1;
    opt.align = ATTN_ALIGN_BOTTOM_RIGHT;
    if (f & 2) opt.softcap = (float)(1 + pick(r, 20));
    if (f & 4) opt.has_scale = true, opt.scale = (float)(pick(r, 8) - 2) / 8.0f;
    const bool want_lse = f & 8;
    opt.lse = want_lse ? &lse.t : NULL;
    opt.kv_len = &kl2.t;
    opt.block_table = mode == 2 ? NULL : &tab.t;
    opt.threads = 1;
    opt.path = ATTN_PATH_FUSED;
    const attn_status fs = attn_forward(&q.t, &kc.t, &vc.t, &o.t, &opt);
    if (!fwd_ok) {
        REQUIRE(fs != ATTN_OK, "forward read a table entry outside the pool");
        REQUIRE(all_poison(&o) && all_poison(&lse), "failed forward (%s) wrote an output",
                attn_last_error());
    } else {
        REQUIRE(fs == ATTN_OK, "forward over the cache refused: %s", attn_last_error());
        buf o3, l3, orf, lrf;
        buf_twin(&o3, &o);
        buf_twin(&l3, &lse);
        opt.threads = 3;
        opt.lse = want_lse ? &l3.t : NULL;
        REQUIRE(attn_forward(&q.t, &kc.t, &vc.t, &o3.t, &opt) == ATTN_OK, "3 threads: %s",
                attn_last_error());
        REQUIRE(same_bytes(&o, &o3) && same_bytes(&lse, &l3), "paged forward: 1 and 3 threads differ");
        buf_twin(&orf, &o);
        buf_twin(&lrf, &lse);
        opt.path = ATTN_PATH_REFERENCE;
        opt.lse = &lrf.t;
        REQUIRE(attn_forward(&q.t, &kc.t, &vc.t, &orf.t, &opt) == ATTN_OK, "reference: %s",
                attn_last_error());
        compare_t("paged O vs reference", &o.t, &orf.t, 1e-5, 2 * half_ulp(odt));
        /* a contiguous copy of the valid rows (zero bytes elsewhere: 0 in every dtype) */
        buf kg, vg;
        buf_new(&kg, cd, B, Hkv, Lmax, Dk);
        buf_new(&vg, cd, B, Hkv, Lmax, Dv);
        memset(kg.base, 0, kg.bytes);
        memset(vg.base, 0, vg.bytes);
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < Hkv; h++)
                for (int64_t j = 0; j < ((int32_t *)kl2.t.data)[b]; j++) {
                    const int64_t page = mode == 2 ? b : table[b * mp + j / ps], rr = mode == 2 ? j : j % ps;
                    memcpy(row_at(&kg.t, b, h, j), row_at(&kc.t, page, h, rr), nbytes(cd, Dk));
                    memcpy(row_at(&vg.t, b, h, j), row_at(&vc.t, page, h, rr), nbytes(cd, Dv));
                }
        if (want_lse) {
            float *kv = cache_values(&kg.t);
            double *mag = xmalloc((size_t)(B * Hq * Lq) * sizeof *mag);
            row_mags(mag, &q.t, kv, Hkv, Lmax, opt.has_scale ? opt.scale : 1 / sqrt((double)Dk),
                     opt.softcap);
            compare_lse("paged LSE vs reference", &lse.t, &lrf.t, mag, Dk, Lmax, 1);
            free(mag);
            free(kv);
        }
        if (mode != 2) {
            buf oc, lc;
            buf_twin(&oc, &o);
            buf_twin(&lc, &lse);
            opt.path = ATTN_PATH_FUSED;
            opt.threads = 2;
            opt.block_table = NULL;
            opt.lse = want_lse ? &lc.t : NULL;
            REQUIRE(attn_forward(&q.t, &kg.t, &vg.t, &oc.t, &opt) == ATTN_OK, "contiguous copy: %s",
                    attn_last_error());
            if (opt.softcap > 0)  // never decoding-shaped: the contiguous call's tiles
                REQUIRE(same_bytes(&o, &oc) && same_bytes(&lse, &lc),
                        "paged and contiguous differ with a softcap");
            compare_t("paged O vs contiguous", &o.t, &oc.t, 2e-5, 2 * half_ulp(odt));
            buf_free(&oc);
            buf_free(&lc);
        }
        buf_free(&kg);
        buf_free(&vg);
        buf_free(&o3);
        buf_free(&l3);
        buf_free(&orf);
        buf_free(&lrf);
    }
    buf *all[] = {&kc, &vc, &kn, &vn, &kvl, &tab, &slots, &q, &o, &lse, &kl2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) buf_free(all[i]);
    free(table);
    free(len);
    free(slot);
}

/* ---- (b) attn_merge --------------------------------------------------------------- */

static void fuzz_merge(reader *r) {
    const int64_t B = 1 + pick(r, 2), H = 1 + pick(r, 3), Lq = 1 + pick(r, 4);
    const int64_t Dk = 1 + pick(r, 8), Dv = 1 + pick(r, 8), Lk = pick(r, 4) ? pick(r, 24) : pick(r, 80);
    const int64_t n = pick(r, 5);
    const attn_dtype odt = FDT[pick(r, 3)];
    const unsigned f = byte(r), fault = byte(r) % 12;
    buf q, k, v, mask;
    buf_new(&q, ATTN_F32, B, H, Lq, Dk);
    buf_new(&k, ATTN_F32, B, H, Lk, Dk);
    buf_new(&v, ATTN_F32, B, H, Lk, Dv);
    fill(&q.t, 1.0);
    fill(&k.t, 1.0);
    fill(&v.t, 1.0);
    buf_new(&mask, ATTN_BOOL, B, H, Lq, Lk);
    const unsigned dens = 1 + byte(r) % 8;
    for (int64_t e = 0; e < B * H * Lq * Lk; e++) mask.base[e] = unif() * 8 < dens;
    attn_options opt = {0};
    if (f & 1) opt.mask = &mask.t;
    if (f & 2) opt.softcap = (float)(1 + pick(r, 20));
    opt.threads = 1;

    /* the cuts c_0 = 0 <= ... <= c_n = Lk, and each part's forward */
    int64_t cut[6];
    cut[0] = 0;
    for (int64_t c = 1; c < n; c++) cut[c] = pick(r, Lk + 1);
    cut[n > 0 ? n : 0] = Lk;
    for (int64_t c = 1; c < n; c++)  // sort
        for (int64_t d = c; d > 1 && cut[d] < cut[d - 1]; d--) {
            const int64_t x = cut[d];
            cut[d] = cut[d - 1], cut[d - 1] = x;
        }
    buf op[5], lp[5];
    attn_tensor ot[5], lt[5];
    for (int64_t c = 0; c < n; c++) {
        const bool perm = (f >> (2 + c)) & 1;  // the part stored [B, Lq, H, Dv]
        buf_new(&op[c], ATTN_F32, B, H, Lq, Dv);
        if (perm) {
            op[c].t.stride[1] = Dv, op[c].t.stride[2] = H * Dv;
        }
        buf_new(&lp[c], ATTN_F32, B, H, Lq, 1);
        attn_tensor kp = k.t, vp = v.t, mp = mask.t;
        kp.data = (float *)k.t.data + cut[c] * Dk, kp.shape[2] = cut[c + 1] - cut[c];
        vp.data = (float *)v.t.data + cut[c] * Dv, vp.shape[2] = cut[c + 1] - cut[c];
        mp.data = (unsigned char *)mask.t.data + cut[c], mp.shape[3] = cut[c + 1] - cut[c];
        attn_options po = opt;
        po.mask = opt.mask ? &mp : NULL;
        po.lse = &lp[c].t;
        REQUIRE(attn_forward(&q.t, &kp, &vp, &op[c].t, &po) == ATTN_OK, "part %lld: %s", (long long)c,
                attn_last_error());
        /* an empty part's O must not be read */
        for (int64_t row = 0; row < B * H * Lq; row++)
            if (get(&lp[c].t, row) == -INFINITY)
                for (int64_t d = 0; d < Dv; d++) set(&op[c].t, row * Dv + d, NAN);
        ot[c] = op[c].t, lt[c] = lp[c].t;
    }
    /* the whole call */
    buf of, lf;
    buf_new(&of, ATTN_F32, B, H, Lq, Dv);
    buf_new(&lf, ATTN_F32, B, H, Lq, 1);
    attn_options fo = opt;
    fo.lse = &lf.t;
    attn_tensor kw = k.t, vw = v.t, mw = mask.t;  // n = 0: the union of no keys
    if (n == 0) kw.shape[2] = vw.shape[2] = mw.shape[3] = 0;
    fo.mask = opt.mask ? &mw : NULL;
    REQUIRE(attn_forward(&q.t, &kw, &vw, &of.t, &fo) == ATTN_OK, "whole: %s", attn_last_error());

    buf o, lse;
    buf_new(&o, odt, B, H, Lq, Dv);
    buf_new(&lse, ATTN_F32, B, H, Lq, 1);
    const bool want_lse = f & 128;
    int64_t nn = n;
    int32_t threads = 1;
    bool expect_fail = true;
    attn_tensor *otp = ot, *ltp = lt;
    attn_tensor oview = o.t;
    switch (fault) {
    case 1: nn = -1 - pick(r, 2); break;
    case 2: threads = -1; break;
    case 3: if (n > 0) otp = NULL; else expect_fail = false; break;
    case 4: if (n > 0) ltp = NULL; else expect_fail = false; break;
    case 5: if (n > 0) lt[pick(r, n)].shape[2] += 1; else expect_fail = false; break;
    case 6: if (n > 0) ot[pick(r, n)].dtype = ATTN_F16; else expect_fail = false; break;
    case 7: if (Dv > 1) oview.stride[3] = 0; else expect_fail = false; break;
    default: expect_fail = false; break;
    }
    const attn_status st = attn_merge(nn, otp, ltp, &oview, want_lse ? &lse.t : NULL, threads);
    if (expect_fail) {
        REQUIRE(st != ATTN_OK, "merge accepted fault %u", fault);
        REQUIRE(all_poison(&o) && all_poison(&lse), "failed merge (%s) wrote an output", attn_last_error());
    } else {
        REQUIRE(st == ATTN_OK, "merge refused: %s", attn_last_error());
        if (!want_lse) REQUIRE(all_poison(&lse), "lse written without being asked for");
        buf o3, l3;
        buf_twin(&o3, &o);
        buf_twin(&l3, &lse);
        REQUIRE(attn_merge(n, ot, lt, &o3.t, &l3.t, 3) == ATTN_OK, "3 threads: %s", attn_last_error());
        REQUIRE(same_bytes(&o, &o3), "merge: 1 and 3 threads differ");
        compare_t("merged O vs one call", &o.t, &of.t, 2e-5, 2 * half_ulp(odt));
        float *kv = xmalloc((size_t)(B * H * (Lk ? Lk : 1) * Dk) * sizeof *kv);
        for (int64_t e = 0; e < B * H * Lk * Dk; e++) kv[e] = ((float *)k.t.data)[e];
        double *mag = xmalloc((size_t)(B * H * Lq) * sizeof *mag);
        row_mags(mag, &q.t, kv, H, n ? Lk : 0, 1 / sqrt((double)Dk), opt.softcap);
        compare_lse("merged LSE vs one call", &l3.t, &lf.t, mag, Dk, Lk, 2);
        if (want_lse) REQUIRE(memcmp(lse.base, l3.base, lse.bytes) == 0, "merge LSE: 1 and 3 threads differ");
        /* in place, into part 0 (float32 only): the same values as the merge above */
        if (n > 0 && odt == ATTN_F32 && (f & 64)) {
            REQUIRE(attn_merge(n, ot, lt, &ot[0], &lt[0], 2) == ATTN_OK, "in place: %s",
                    attn_last_error());
            for (int64_t e = 0; e < B * H * Lq * Dv; e++) {
                const double a = get(&ot[0], e), b = get(&o.t, e);
                REQUIRE((isnan(a) && isnan(b)) || a == b, "in-place merge differs at %lld", (long long)e);
            }
            for (int64_t e = 0; e < B * H * Lq; e++) {
                const double a = get(&lt[0], e), b = get(&l3.t, e);
                REQUIRE((isnan(a) && isnan(b)) || a == b, "in-place merge LSE differs at %lld", (long long)e);
            }
        }
        free(mag);
        free(kv);
        buf_free(&o3);
        buf_free(&l3);
    }
    for (int64_t c = 0; c < n; c++) buf_free(&op[c]), buf_free(&lp[c]);
    buf *all[] = {&q, &k, &v, &mask, &of, &lf, &o, &lse};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) buf_free(all[i]);
}

/* ---- (c) attn_cascade_forward ------------------------------------------------------- */

/* One part's keys and values: rows in a cache dtype, contiguous [Bp, Hkv, L, D] or page
 * pools with a table, their values as float32 [Bp, Hkv, L, D], and their valid lengths. */
typedef struct part {
    buf k, v, tab, kvl;
    float *kx, *vx;  // the values of the logical rows
    int64_t Bp, L, ps, mp, N;
    bool paged, has_kvl;
    int64_t valid[4];
    attn_cascade_kv kv;
} part;

static void part_make(part *p, reader *r, int64_t Bp, int64_t L, int64_t Hkv, int64_t Dk,
                      int64_t Dv, attn_dtype cd) {
    memset(p, 0, sizeof *p);
    p->Bp = Bp, p->L = L;
    buf lk, lv;  // the logical rows, contiguous, in the cache dtype
    buf_new(&lk, cd, Bp, Hkv, L, Dk);
    buf_new(&lv, cd, Bp, Hkv, L, Dv);
    p->kx = cache_fill(&lk.t, 1.0);
    p->vx = cache_fill(&lv.t, 1.0);
    p->paged = pick(r, 2);
    if (p->paged) {
        p->ps = 1 + pick(r, 4);
        p->mp = (L + p->ps - 1) / p->ps + pick(r, 2);
        p->N = Bp * p->mp + pick(r, 2);
        buf_new(&p->k, cd, p->N, Hkv, p->ps, Dk);
        buf_new(&p->v, cd, p->N, Hkv, p->ps, Dv);
        memset(p->k.base, 0, p->k.bytes);
        memset(p->v.base, 0, p->v.bytes);
        buf_new(&p->tab, ATTN_I32, Bp, p->mp, 1, 1);
        int32_t *t = (int32_t *)p->tab.t.data;
        for (int64_t i = 0; i < p->N && i < Bp * p->mp; i++) t[i] = (int32_t)i;
        for (int64_t i = Bp * p->mp - 1; i > 0; i--) {
            const int64_t j = (int64_t)(unif() * (double)(i + 1));
            const int32_t x = t[i];
            t[i] = t[j], t[j] = x;
        }
        for (int64_t b = 0; b < Bp; b++)
            for (int64_t h = 0; h < Hkv; h++)
                for (int64_t j = 0; j < L; j++) {
                    const int64_t page = t[b * p->mp + j / p->ps];
                    memcpy(row_at(&p->k.t, page, h, j % p->ps), row_at(&lk.t, b, h, j), nbytes(cd, Dk));
                    memcpy(row_at(&p->v.t, page, h, j % p->ps), row_at(&lv.t, b, h, j), nbytes(cd, Dv));
                }
        buf_free(&lk);
        buf_free(&lv);
        p->kv.block_table = &p->tab.t;
    } else {
        p->k = lk, p->v = lv;
    }
    p->kv.k = &p->k.t, p->kv.v = &p->v.t;
    p->has_kvl = pick(r, 2);
    const bool whole = !p->has_kvl;  // without kv_len a paged part's keys are all mp * ps
    if (p->paged && p->mp * p->ps != L) p->has_kvl = true;
    buf_new(&p->kvl, ATTN_I32, Bp, 1, 1, 1);
    for (int64_t b = 0; b < Bp; b++) {
        p->valid[b] = whole ? L : pick(r, L + 1);
        ((int32_t *)p->kvl.t.data)[b] = (int32_t)p->valid[b];
    }
    if (p->has_kvl) p->kv.kv_len = &p->kvl.t;
}

static void part_free(part *p) {
    buf_free(&p->k), buf_free(&p->v), buf_free(&p->kvl);
    if (p->paged) buf_free(&p->tab);
    free(p->kx), free(p->vx);
}

static void fuzz_cascade(reader *r) {
    const int64_t B = 1 + pick(r, 3), Hkv = 1 + pick(r, 2), G = 1 + pick(r, 2), Hq = Hkv * G;
    const int64_t Lq = 1 + pick(r, 3), P = pick(r, 13), S = pick(r, 9);
    const attn_dtype pd = CDT[pick(r, 4)], sd = CDT[pick(r, 4)];
    const bool q8 = pd == ATTN_Q8_0 || sd == ATTN_Q8_0;
    const int64_t Dk = q8 ? 32 : 1 + pick(r, 10), Dv = q8 ? 32 : 1 + pick(r, 10);
    const attn_dtype qdt = FDT[pick(r, 3)], odt = FDT[pick(r, 3)];
    part pre, suf;
    part_make(&pre, r, 1, P, Hkv, Dk, Dv, pd);
    part_make(&suf, r, B, S, Hkv, Dk, Dv, sd);
    buf q, o, lse, sinks;
    query_out_new(&q, &o, &lse, qdt, odt, B, Hq, Lq, Dk, Dv);
    buf_new(&sinks, ATTN_F32, Hq, 1, 1, 1);
    for (int64_t h = 0; h < Hq; h++) ((float *)sinks.t.data)[h] = unif() < 0.2 ? -INFINITY : (float)sym(2);
    const unsigned f = byte(r), fault = byte(r) % 14;
    attn_options opt = {0};
    if (f & 1) opt.causal = true, opt.align = ATTN_ALIGN_BOTTOM_RIGHT;
    if (f & 2) opt.softcap = (float)(1 + pick(r, 20));
    if (f & 4) opt.has_scale = true, opt.scale = (float)(pick(r, 8) - 2) / 8.0f;
    if (f & 8) opt.sinks = &sinks.t;
    const bool want_lse = f & 16;
    opt.lse = want_lse ? &lse.t : NULL;
    opt.threads = 1;
    const bool no_pre = (f & 32) && (f & 64), no_suf = (f & 32) && !(f & 64) && (f & 128);
    attn_cascade_kv *prep = no_pre ? NULL : &pre.kv, *sufp = no_suf ? NULL : &suf.kv;
    const int64_t Pv = no_pre ? 0 : pre.valid[0];
    /* causal needs every suffix to hold Lq - 1 keys at least */
    bool short_suffix = false;
    for (int64_t b = 0; b < B; b++)
        if ((no_suf ? 0 : suf.valid[b]) < Lq - 1) short_suffix = true;
    int expect = 0;  // 0 ok, 1 refused, 2 either (a refusal the contract leaves open)
    if (opt.causal && short_suffix) expect = Pv > 0 ? 1 : 2;
    int32_t saved_entry = 0;
    int32_t *entry = NULL;
    switch (fault) {
    case 1: opt.mask = &sinks.t; expect = 1; break;  // any mask: refused before it is read
    case 2: opt.kv_len = &suf.kvl.t; expect = 1; break;
    case 3: opt.has_window = true, opt.window_left = 1, opt.window_right = -1; expect = 1; break;
    case 4: if (!no_suf) { suf.kv.v = NULL; expect = 1; } break;
    case 5:
        if (Dk == Dv && qdt == odt) { o.t.data = q.t.data; expect = 1; }  // o is q
        break;
    case 6:  // a needed page entry outside the pool
        if (suf.paged && !no_suf && suf.valid[0] > 0) {
            entry = (int32_t *)suf.tab.t.data + pick(r, (suf.valid[0] + suf.ps - 1) / suf.ps);
            saved_entry = *entry;
            *entry = pick(r, 2) ? (int32_t)suf.N : -1;
            expect = 1;
        }
        break;
    case 7: opt.d_sinks = &sinks.t; expect = 1; break;
    default: break;
    }
    const attn_status st = attn_cascade_forward(&q.t, prep, sufp, &o.t, &opt);
    if (getenv("FUZZ_VERBOSE"))
        fprintf(stderr, "cascade: B %lld Hq %lld Hkv %lld Lq %lld P %lld S %lld Dk %lld Dv %lld "
                "%s/%s paged %d/%d flags %#x fault %u expect %d status %d (%s)\n", (long long)B,
                (long long)Hq, (long long)Hkv, (long long)Lq, (long long)P, (long long)S,
                (long long)Dk, (long long)Dv, attn_dtype_name(pd), attn_dtype_name(sd), pre.paged,
                suf.paged, f, fault, expect, (int)st, attn_last_error());
    if (getenv("FUZZ_VERBOSE"))
        fprintf(stderr, "  prefix ps %lld mp %lld N %lld valid %lld (kv_len %d); suffix ps %lld mp %lld "
                "N %lld valid %lld (kv_len %d)\n", (long long)pre.ps, (long long)pre.mp, (long long)pre.N,
                (long long)pre.valid[0], pre.has_kvl, (long long)suf.ps, (long long)suf.mp,
                (long long)suf.N, (long long)suf.valid[0], suf.has_kvl);
    if (fault == 5 && expect == 1) o.t.data = o.base;  // o back on its own buffer
    if (expect == 1 || (expect == 2 && st != ATTN_OK)) {
        REQUIRE(st != ATTN_OK, "cascade accepted fault %u (causal with a short suffix: %d)", fault,
                opt.causal && short_suffix);
        REQUIRE(all_poison(&o) && all_poison(&lse), "failed cascade (%s) wrote an output", attn_last_error());
        if (entry) *entry = saved_entry;
    } else {
        REQUIRE(st == ATTN_OK, "cascade refused: %s", attn_last_error());
        buf o3, l3;
        buf_twin(&o3, &o);
        buf_twin(&l3, &lse);
        opt.threads = 3;
        opt.lse = want_lse ? &l3.t : NULL;
        REQUIRE(attn_cascade_forward(&q.t, prep, sufp, &o3.t, &opt) == ATTN_OK, "3 threads: %s",
                attn_last_error());
        REQUIRE(same_bytes(&o, &o3) && same_bytes(&lse, &l3), "cascade: 1 and 3 threads differ");
        /* the reference: attn_forward's reference path over [prefix valid; suffix_b] */
        const int64_t L = Pv + S;
        buf kc, vc, kl, orf, lrf;
        buf_new(&kc, ATTN_F32, B, Hkv, L, Dk);
        buf_new(&vc, ATTN_F32, B, Hkv, L, Dv);
        memset(kc.base, 0, kc.bytes);
        memset(vc.base, 0, vc.bytes);
        buf_new(&kl, ATTN_I32, B, 1, 1, 1);
        float *kx = (float *)kc.t.data, *vx = (float *)vc.t.data;
        for (int64_t b = 0; b < B; b++) {
            const int64_t Sv = no_suf ? 0 : suf.valid[b];
            ((int32_t *)kl.t.data)[b] = (int32_t)(Pv + Sv);
            for (int64_t h = 0; h < Hkv; h++) {
                for (int64_t j = 0; j < Pv; j++) {
                    memcpy(kx + ((b * Hkv + h) * L + j) * Dk, pre.kx + (h * P + j) * Dk, (size_t)Dk * 4);
                    memcpy(vx + ((b * Hkv + h) * L + j) * Dv, pre.vx + (h * P + j) * Dv, (size_t)Dv * 4);
                }
                for (int64_t j = 0; j < Sv; j++) {
                    memcpy(kx + ((b * Hkv + h) * L + Pv + j) * Dk, suf.kx + ((b * Hkv + h) * S + j) * Dk,
                           (size_t)Dk * 4);
                    memcpy(vx + ((b * Hkv + h) * L + Pv + j) * Dv, suf.vx + ((b * Hkv + h) * S + j) * Dv,
                           (size_t)Dv * 4);
                }
            }
        }
        buf_twin(&orf, &o);
        buf_new(&lrf, ATTN_F32, B, Hq, Lq, 1);
        attn_options ro = opt;
        ro.path = ATTN_PATH_REFERENCE;
        ro.kv_len = &kl.t;
        ro.lse = &lrf.t;
        ro.threads = 1;
        REQUIRE(attn_forward(&q.t, &kc.t, &vc.t, &orf.t, &ro) == ATTN_OK, "reference: %s",
                attn_last_error());
        compare_t("cascade O vs reference", &o.t, &orf.t, 1e-5, 2 * half_ulp(odt));
        if (want_lse) {
            double *mag = xmalloc((size_t)(B * Hq * Lq) * sizeof *mag);
            row_mags(mag, &q.t, kx, Hkv, L, opt.has_scale ? opt.scale : 1 / sqrt((double)Dk), opt.softcap);
            compare_lse("cascade LSE vs reference", &lse.t, &lrf.t, mag, Dk, L, 1);
            free(mag);
        }
        buf *b5[] = {&o3, &l3, &kc, &vc, &kl, &orf, &lrf};
        for (size_t i = 0; i < sizeof b5 / sizeof *b5; i++) buf_free(b5[i]);
    }
    part_free(&pre);
    part_free(&suf);
    buf *all[] = {&q, &o, &lse, &sinks};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) buf_free(all[i]);
}

/* ---- (d) fp8 caches under scales ----------------------------------------------------- */

/* a scale: a power of two, another positive number, or (a fault) 0, -1, NaN or inf */
static float fp8_scale(reader *r) {
    const unsigned f = byte(r);
    if (f < 160) return ldexpf(1.0f, (int)(f % 111) - 30);  // 2^-30 .. 2^80
    if (f < 240) return (float)(0.001 + unif() * 3.0);
    static const float bad[4] = {0.0f, -1.0f, NAN, INFINITY};
    return bad[f % 4];
}

static void fuzz_fp8(reader *r) {
    static const int64_t DS[7] = {16, 32, 48, 64, 128, 256, 288};
    const attn_dtype dt = pick(r, 2) ? ATTN_FP8_E4M3 : ATTN_FP8_E5M2;
    const int64_t B = 1 + pick(r, 2), Hkv = 1 + pick(r, 2), Hq = Hkv * (1 + pick(r, 8));
    const int64_t Lq = pick(r, 3) ? 1 : 1 + pick(r, 3), Lk = 1 + pick(r, 200);
    const int64_t Dk = DS[pick(r, 7)], Dv = pick(r, 2) ? Dk : DS[pick(r, 7)];
    const unsigned f = byte(r);
    buf kc, vc, ks, vs, q, o, lse;
    buf_new(&kc, dt, B, Hkv, Lk, Dk);
    buf_new(&vc, dt, B, Hkv, Lk, Dv);
    const bool special = f & 1;  // NaN codes (and e5m2's infinities) among the bytes
    for (int64_t i = 0; i < numel(&kc.t) + numel(&vc.t); i++) {
        uint8_t x = (uint8_t)(unif() * 256.0);
        if (!special && !isfinite(attn_fp8_to_f32(dt, x))) x &= 0x3F;
        if (i < numel(&kc.t)) ((uint8_t *)kc.t.data)[i] = x;
        else ((uint8_t *)vc.t.data)[i - numel(&kc.t)] = x;
    }
    /* scales: none, one for the tensor, or one per head */
    bool fault;
    const int64_t kn = pick(r, 3), vn = pick(r, 3);  // 0 none, 1 per tensor, 2 per head
    buf_new(&ks, ATTN_F32, kn == 2 ? Hkv : 1, 1, 1, 1);
    buf_new(&vs, ATTN_F32, vn == 2 ? Hkv : 1, 1, 1, 1);
    for (int64_t h = 0; h < (kn == 2 ? Hkv : 1); h++) ((float *)ks.t.data)[h] = fp8_scale(r);
    for (int64_t h = 0; h < (vn == 2 ? Hkv : 1); h++) ((float *)vs.t.data)[h] = fp8_scale(r);
    fault = false;  // only a tensor that is passed can be at fault
    for (int64_t h = 0; kn && h < (kn == 2 ? Hkv : 1); h++)
        fault |= !(((float *)ks.t.data)[h] > 0 && isfinite(((float *)ks.t.data)[h]));
    for (int64_t h = 0; vn && h < (vn == 2 ? Hkv : 1); h++)
        fault |= !(((float *)vs.t.data)[h] > 0 && isfinite(((float *)vs.t.data)[h]));
    /* queries: logits of moderate size (from the largest |k|), or hostile magnitudes */
    const bool hostile = f & 2;
    double kmax = 1e-30;
    for (int64_t h = 0; h < Hkv; h++) {
        const float sc = kn ? ((float *)ks.t.data)[kn == 2 ? h : 0] : 1.0f;
        const double m = (dt == ATTN_FP8_E4M3 ? 448.0 : 57344.0) * fabs((double)sc);
        if (isfinite(m) && m > kmax) kmax = m;
    }
    buf_new(&q, ATTN_F32, B, Hq, Lq, Dk);
    const double qa = hostile ? ldexp(1.0, (int)pick(r, 111) - 40) : 4.0 / (kmax * sqrt((double)Dk));
    fill(&q.t, qa);
    if (hostile && (f & 4)) ((float *)q.t.data)[pick(r, Dk)] = (f & 8) ? 0x1p61f : -0x1p62f;
    buf_new(&o, ATTN_F32, B, Hq, Lq, Dv);
    buf_new(&lse, ATTN_F32, B, Hq, Lq, 1);
    attn_options opt = {0};
    opt.k_scale = kn ? &ks.t : NULL;
    opt.v_scale = vn ? &vs.t : NULL;
    opt.causal = (f & 16) && Lq <= Lk;
    opt.align = ATTN_ALIGN_BOTTOM_RIGHT;
    opt.lse = &lse.t;
    opt.threads = 1;
    opt.path = ATTN_PATH_FUSED;
    const attn_status st = attn_forward(&q.t, &kc.t, &vc.t, &o.t, &opt);
    if (fault) {
        REQUIRE(st == ATTN_ERR_VALUE, "fp8: a bad scale was not refused (status %d)", (int)st);
        REQUIRE(all_poison(&o) && all_poison(&lse), "fp8: a refused call wrote an output");
    } else {
        REQUIRE(st == ATTN_OK, "fp8: %s", attn_last_error());
        buf o3, l3, of, lf, kf, vf;
        buf_twin(&o3, &o);
        buf_twin(&l3, &lse);
        opt.threads = 3;
        opt.lse = &l3.t;
        REQUIRE(attn_forward(&q.t, &kc.t, &vc.t, &o3.t, &opt) == ATTN_OK, "fp8, 3 threads: %s",
                attn_last_error());
        REQUIRE(same_bytes(&o, &o3) && same_bytes(&lse, &l3), "fp8: 1 and 3 threads differ");
        /* float32 copies of fl32(value · scale) */
        buf_new(&kf, ATTN_F32, B, Hkv, Lk, Dk);
        buf_new(&vf, ATTN_F32, B, Hkv, Lk, Dv);
        for (int64_t i = 0; i < numel(&kf.t); i++) {
            const int64_t h = i / (Lk * Dk) % Hkv;
            const float sc = kn ? ((float *)ks.t.data)[kn == 2 ? h : 0] : 1.0f;
            ((float *)kf.t.data)[i] = attn_fp8_to_f32(dt, ((uint8_t *)kc.t.data)[i]) * sc;
        }
        for (int64_t i = 0; i < numel(&vf.t); i++) {
            const int64_t h = i / (Lk * Dv) % Hkv;
            const float sc = vn ? ((float *)vs.t.data)[vn == 2 ? h : 0] : 1.0f;
            ((float *)vf.t.data)[i] = attn_fp8_to_f32(dt, ((uint8_t *)vc.t.data)[i]) * sc;
        }
        buf_twin(&of, &o);
        buf_twin(&lf, &lse);
        attn_options fo = opt;
        fo.k_scale = fo.v_scale = NULL;
        fo.threads = 1;
        fo.lse = &lf.t;
        REQUIRE(attn_forward(&q.t, &kf.t, &vf.t, &of.t, &fo) == ATTN_OK, "fp8's float32 copy: %s",
                attn_last_error());
        if (!hostile) {  // both within the float32 rule of the same function (its NaNs too)
            compare_t("fp8 O vs its float32 copy", &o.t, &of.t, 2e-5, 0);
            compare_t("fp8 LSE vs its float32 copy", &lse.t, &lf.t, 2e-5, 1e-6);
        }
        if (!hostile && !special) {
            buf orf, lrf;
            buf_twin(&orf, &o);
            buf_twin(&lrf, &lse);
            opt.path = ATTN_PATH_REFERENCE;
            opt.threads = 1;
            opt.lse = &lrf.t;
            REQUIRE(attn_forward(&q.t, &kc.t, &vc.t, &orf.t, &opt) == ATTN_OK, "fp8 reference: %s",
                    attn_last_error());
            compare_t("fp8 O vs reference", &o.t, &orf.t, 1e-5, 0);
            buf_free(&orf);
            buf_free(&lrf);
        }
        buf *more[] = {&o3, &l3, &of, &lf, &kf, &vf};
        for (size_t i = 0; i < sizeof more / sizeof *more; i++) buf_free(more[i]);
    }
    buf *all[] = {&kc, &vc, &ks, &vs, &q, &o, &lse};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) buf_free(all[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    reader r = {data, size};
    seed_from(data, size);
    const unsigned first = byte(&r);
    if (first >= 0xF0) {
        fuzz_fp8(&r);
        return 0;
    }
    switch (first % 3) {
    case 0: fuzz_paged(&r); break;
    case 1: fuzz_merge(&r); break;
    default: fuzz_cascade(&r); break;
    }
    return 0;
}
