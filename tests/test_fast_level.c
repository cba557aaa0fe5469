/*
 * test_fast_level.c — where the FAST precision runs the default level: on a kernel with
 *                     no bf16 dot products (no pv_bf16 in its table: avx512, avx2,
 *                     generic) a bfloat16 call at FAST gives the default level's O and
 *                     LSE bit for bit (docs/CONTRACT.md, "Precision": rounding P there
 *                     buys nothing and costs a pass over each tile); on avx512bf16 FAST
 *                     rounds P, so on inputs large enough to show it O differs while the
 *                     LSE does not.
 *
 * Run it per kernel (ATTN_ISA=avx2, generic, ...). The shapes reach each place the
 * level is read: the 64-row tile path (clean and boundary tiles, Lq and Lk not multiples
 * of the block), a bool mask (masked tiles), the weights output, a decoding block (the
 * kernel's one-pass step, whose round_p is the level), and a float32 query over a
 * bfloat16 cache. What it is not: a test of FAST's accuracy (test_half.c holds every
 * level to the half-precision rule) or of its speed (attn bench's -fast rows).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "check.h"
#include "core/half.h"
#include "rng.h"

typedef struct fcase {
    const char *name;
    int64_t B, H, Lq, Lk, D;
    attn_dtype qdt;
    int causal, mask, weights;
} fcase;

static void fill(attn_dtype dt, void *x, int64_t n, uint64_t seed) {
    rng_t r = {seed};
    for (int64_t i = 0; i < n; i++) {
        const float f = (float)rng_range(&r, -2.0, 2.0);
        if (dt == ATTN_F32) ((float *)x)[i] = f;
        else ((uint16_t *)x)[i] = attn_f32_to_bf16(f);
    }
}

/* O (in the query's dtype), LSE and, when asked, the weights of one call at `prec` */
static attn_status run(const fcase *c, attn_precision prec, const void *q, const void *k,
                       const void *v, const uint8_t *mask, void *o, float *lse, float *w) {
    attn_tensor tq = attn_tensor_4d((void *)q, c->qdt, c->B, c->H, c->Lq, c->D);
    attn_tensor tk = attn_tensor_4d((void *)k, ATTN_BF16, c->B, c->H, c->Lk, c->D);
    attn_tensor tv = attn_tensor_4d((void *)v, ATTN_BF16, c->B, c->H, c->Lk, c->D);
    attn_tensor to = attn_tensor_4d(o, c->qdt, c->B, c->H, c->Lq, c->D);
    attn_tensor tl = attn_tensor_4d(lse, ATTN_F32, c->B, c->H, c->Lq, 1);
    attn_tensor tm = attn_tensor_4d((void *)mask, ATTN_BOOL, 1, 1, c->Lq, c->Lk);
    attn_tensor tw = attn_tensor_4d(w, ATTN_F32, c->B, c->H, c->Lq, c->Lk);
    attn_options opt = {.causal = c->causal, .precision = prec, .lse = &tl,
                        .mask = c->mask ? &tm : NULL, .weights = c->weights ? &tw : NULL};
    return attn_forward(&tq, &tk, &tv, &to, &opt);
}

int main(void) {
    const fcase cases[] = {
        {"tiles L130/300 D64", 1, 3, 130, 300, 64, ATTN_BF16, 0, 0, 0},
        {"causal L200 D128", 2, 2, 200, 200, 128, ATTN_BF16, 1, 0, 0},
        {"bool mask L97/260 D32", 1, 2, 97, 260, 32, ATTN_BF16, 0, 1, 0},
        {"weights L70/190 D64", 1, 2, 70, 190, 64, ATTN_BF16, 0, 0, 1},
        {"decode Lq1 Lk2000 D128", 1, 4, 1, 2000, 128, ATTN_BF16, 0, 0, 0},
        {"decode Lq3 Lk700 D64 q f32", 2, 2, 3, 700, 64, ATTN_F32, 0, 0, 0},
        {"q f32 kv bf16 L150/400 D64", 1, 2, 150, 400, 64, ATTN_F32, 0, 0, 0},
    };
    const char *kern = attn_kernel_name();
    /* the kernels whose table has bf16 dot products (kernels/list.h): FAST rounds P there */
    const bool rounds = strcmp(kern, "avx512bf16") == 0;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const fcase *c = &cases[ci];
        const int64_t nq = c->B * c->H * c->Lq * c->D, nkv = c->B * c->H * c->Lk * c->D;
        const int64_t nl = c->B * c->H * c->Lq, nw = nl * c->Lk;
        const size_t qes = c->qdt == ATTN_F32 ? 4 : 2;
        void *q = xcalloc(nq, qes), *k = xcalloc(nkv, 2), *v = xcalloc(nkv, 2);
        void *od = xcalloc(nq, qes), *of = xcalloc(nq, qes);
        float *ld = xcalloc(nl, 4), *lf = xcalloc(nl, 4), *wd = xcalloc(nw, 4), *wf = xcalloc(nw, 4);
        uint8_t *mask = xcalloc(c->Lq * c->Lk, 1);
        fill(c->qdt, q, nq, 11 + ci), fill(ATTN_BF16, k, nkv, 23 + ci), fill(ATTN_BF16, v, nkv, 37 + ci);
        rng_t r = {5 + ci};
        for (int64_t i = 0; i < c->Lq * c->Lk; i++) mask[i] = rng_unif(&r) < 0.8;
        const attn_status sd = run(c, ATTN_PRECISION_DEFAULT, q, k, v, mask, od, ld, wd);
        const attn_status sf = run(c, ATTN_PRECISION_FAST, q, k, v, mask, of, lf, wf);
        CHECK(sd == ATTN_OK && sf == ATTN_OK, "%s: status %d %d: %s", c->name, sd, sf, attn_last_error());
        const bool same_o = memcmp(od, of, (size_t)nq * qes) == 0;
        CHECK(memcmp(ld, lf, (size_t)nl * 4) == 0, "%s [%s]: the LSE depends on the level", c->name, kern);
        if (c->weights)
            CHECK(memcmp(wd, wf, (size_t)nw * 4) == 0, "%s [%s]: the weights depend on the level", c->name, kern);
        if (rounds)
            CHECK(!same_o, "%s [%s]: FAST rounds P on bf16 dot products, yet O is the default's", c->name, kern);
        else
            CHECK(same_o, "%s [%s]: no bf16 dot products, so FAST must be the default level bit for bit",
                  c->name, kern);
        free(q), free(k), free(v), free(od), free(of), free(ld), free(lf), free(wd), free(wf), free(mask);
    }
    return check_summary("test_fast_level");
}
