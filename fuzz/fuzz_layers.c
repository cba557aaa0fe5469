/*
 * fuzz_layers.c — libFuzzer harness of the layers built on attention: the multi-head
 *                 module's forward (attn_mha_forward), its decoding step over a KV cache
 *                 (attn_mha_decode) and additive attention (attn_additive_forward). The
 *                 input's first byte picks the layer; the rest decides shapes, dtypes,
 *                 weight layouts, options and now and then a fault (a bad shape, a NULL,
 *                 an output aliasing an input, a refused option), and seeds the values.
 *
 *   (a) attn_mha_forward: self- or cross-attention, GQA, float32 / bfloat16 activations,
 *       weights (row-major [in, out] or PyTorch's [out, in] read transposed) and y,
 *       biases, RoPE (half or interleaved, partial rotary width, offset), causal in both
 *       alignments, kv_len, scale, the weights output (per head or averaged). Against a
 *       float64 composition written here from docs/CONTRACT.md (projections, RoPE,
 *       softmax attention, output projection): the contract's float32 element rule
 *       max |y - ref| <= 1e-5 (1 + max |ref|), plus an ulp of a bfloat16 y; 1 and 3
 *       threads bit-identical.
 *   (b) attn_mha_decode: one step of n tokens over a contiguous or paged cache of
 *       float32, float16, bfloat16 or q8_0, with RoPE and GQA; faults: lengths past the
 *       cache, table entries outside the pool, a row written twice, the step's own
 *       options set by the caller. A refused step leaves y, the cache and len as they
 *       were; an accepted one writes exactly the new rows (each within its dtype's
 *       rounding, or q8_0's quantization step, of the float64 projection), advances len,
 *       is bit-identical for 1 and 3 threads, and y agrees with the float64 composition
 *       over the cache's values within the element rule.
 *   (c) attn_additive_forward: shapes down to 0 (Lk, Dq, Dk, units), bias, weight
 *       normalization, kv_len, a broadcast bool mask, causal, window, lse and weights;
 *       against the reference path within the contract's additive tolerance,
 *       max |got - ref| <= 1e-4 (1 + max |ref|); 1 and 3 threads bit-identical.
 * A failed call must write nothing. A broken rule aborts. Build: make fuzz-build.
 */
#define FUZZ_NAME "fuzz_layers"
#include "fuzz_common.h"

static const attn_dtype FB[2] = {ATTN_F32, ATTN_BF16};
static const attn_dtype CDT[4] = {ATTN_F32, ATTN_F16, ATTN_BF16, ATTN_Q8_0};

/* ---- the float64 composition ------------------------------------------------------- */

/* a weight [in, out] with row-major or transposed storage, filled */
typedef struct weight {
    buf b;
    int64_t in, out;
} weight;

static void weight_new(weight *w, reader *r, attn_dtype dt, int64_t in, int64_t out, double a) {
    w->in = in, w->out = out;
    buf_new(&w->b, dt, 1, 1, in, out);
    w->b.t.shape[0] = in, w->b.t.shape[1] = out, w->b.t.shape[2] = w->b.t.shape[3] = 1;
    if (pick(r, 2)) w->b.t.stride[0] = out, w->b.t.stride[1] = 1;  // [in, out] row-major
    else w->b.t.stride[0] = 1, w->b.t.stride[1] = in;             // PyTorch's [out, in]
    w->b.t.stride[2] = w->b.t.stride[3] = 0;
    for (int64_t e = 0; e < in * out; e++) attn_store(dt, w->b.t.data, e, (float)sym(a));
}
static double wget(const weight *w, int64_t i, int64_t o) {
    return attn_load(w->b.t.dtype, w->b.t.data, i * w->b.t.stride[0] + o * w->b.t.stride[1]);
}

/* out [rows, W->out] = x [rows, W->in] W + bias (bias NULL: none); x as float64 */
static void proj(double *out, const double *x, int64_t rows, const weight *w, const buf *bias) {
    for (int64_t rr = 0; rr < rows; rr++)
        for (int64_t o = 0; o < w->out; o++) {
            double s = bias ? get(&bias->t, o) : 0;
            for (int64_t i = 0; i < w->in; i++) s += x[rr * w->in + i] * wget(w, i, o);
            out[rr * w->out + o] = s;
        }
}

/* RoPE on x [B, L, H, D] in place, position offset + pos0[b] + i (pos0 NULL: 0) */
static void rope_ref(double *x, int64_t B, int64_t L, int64_t H, int64_t D, const attn_rope *rp,
                     const int64_t *pos0) {
    if (rp->kind == ATTN_ROPE_NONE) return;
    const int64_t r = rp->rotary_dim ? rp->rotary_dim : D, half = r / 2;
    const double base = rp->base ? rp->base : 10000.0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < L; i++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t c = 0; c < half; c++) {
                    const double pos = (double)(rp->offset + (pos0 ? pos0[b] : 0) + i);
                    const double th = pos * pow(base, -2.0 * (double)c / (double)r);
                    double *row = x + ((b * L + i) * H + h) * D;
                    double *a = rp->kind == ATTN_ROPE_HALF ? row + c : row + 2 * c;
                    double *e = rp->kind == ATTN_ROPE_HALF ? a + half : a + 1;
                    const double x1 = *a, x2 = *e;
                    *a = x1 * cos(th) - x2 * sin(th);
                    *e = x2 * cos(th) + x1 * sin(th);
                }
}

/* O [B, Lq, Hq, Dv] = softmax(scale Q Kᵀ, masked) V over Q [B, Lq, Hq, Dk],
 * K [B, Lk, Hkv, Dk], V [B, Lk, Hkv, Dv] (row strides kst, vst between keys, for a
 * cache's [B, Hkv, L, D] pass the layout through kidx); keys j < kvl[b] and, when causal,
 * j <= d_i (top-left i, bottom-right i + kvl[b] - Lq). W [B, Hq, Lq, Lk] (NULL: not
 * wanted): the weights, 0 in a fully masked row. */
typedef struct att_in {
    int64_t B, Lq, Lk, Hq, Hkv, Dk, Dv;
    const double *q;                                  // [B, Lq, Hq, Dk]
    double (*key)(const void *ctx, int64_t b, int64_t h, int64_t j, int64_t d, bool val);
    const void *ctx;
    double scale;
    bool causal, bottom_right;
    const int64_t *kvl;
} att_in;

static void attention_ref(const att_in *a, double *o, double *w) {
    double *s = xmalloc((size_t)(a->Lk ? a->Lk : 1) * sizeof *s);
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t h = 0; h < a->Hq; h++) {
            const int64_t hk = h / (a->Hq / a->Hkv), n = a->kvl ? a->kvl[b] : a->Lk;
            for (int64_t i = 0; i < a->Lq; i++) {
                const int64_t diag = a->bottom_right ? i + n - a->Lq : i;
                double m = -INFINITY;
                for (int64_t j = 0; j < a->Lk; j++) {
                    s[j] = -INFINITY;
                    if (j >= n || (a->causal && j > diag)) continue;
                    double dot = 0;
                    for (int64_t d = 0; d < a->Dk; d++)
                        dot += a->q[((b * a->Lq + i) * a->Hq + h) * a->Dk + d] *
                               a->key(a->ctx, b, hk, j, d, false);
                    s[j] = a->scale * dot;
                    if (s[j] > m) m = s[j];
                }
                double l = 0;
                for (int64_t j = 0; j < a->Lk; j++) l += s[j] == -INFINITY ? 0 : exp(s[j] - m);
                double *orow = o + ((b * a->Lq + i) * a->Hq + h) * a->Dv;
                for (int64_t d = 0; d < a->Dv; d++) orow[d] = 0;
                for (int64_t j = 0; j < a->Lk; j++) {
                    const double p = l > 0 && s[j] != -INFINITY ? exp(s[j] - m) / l : 0;
                    if (w) w[((b * a->Hq + h) * a->Lq + i) * a->Lk + j] = p;
                    if (p != 0)
                        for (int64_t d = 0; d < a->Dv; d++) orow[d] += p * a->key(a->ctx, b, hk, j, d, true);
                }
            }
        }
    free(s);
}

/* keys and values as float64 [B, Lk, Hkv, D] arrays */
typedef struct kv_dense {
    const double *k, *v;
    int64_t Lk, Hkv, Dk, Dv;
} kv_dense;
static double key_dense(const void *ctx, int64_t b, int64_t h, int64_t j, int64_t d, bool val) {
    const kv_dense *c = ctx;
    return val ? c->v[((b * c->Lk + j) * c->Hkv + h) * c->Dv + d]
               : c->k[((b * c->Lk + j) * c->Hkv + h) * c->Dk + d];
}

/* a tensor's values as a float64 array, C order */
static double *values(const attn_tensor *t) {
    const int64_t n = numel(t);
    double *x = xmalloc((size_t)(n ? n : 1) * sizeof *x);
    for (int64_t k = 0; k < n; k++) x[k] = get(t, k);
    return x;
}

/* ---- (a) attn_mha_forward ---------------------------------------------------------- */

typedef struct layer {
    int64_t E, Ekv, Hq, Hkv, Dk, Dv;
    weight wq, wk, wv, wo;
    buf bq, bk, bv, bo;
    bool has_b[4];
    attn_mha m;
} layer;

static void layer_make(layer *L, reader *r, int64_t E, int64_t Ekv, int64_t Hq, int64_t Hkv,
                       int64_t Dk, int64_t Dv, attn_dtype wdt) {
    memset(L, 0, sizeof *L);
    L->E = E, L->Ekv = Ekv, L->Hq = Hq, L->Hkv = Hkv, L->Dk = Dk, L->Dv = Dv;
    weight_new(&L->wq, r, wdt, E, Hq * Dk, 0.5);
    weight_new(&L->wk, r, wdt, Ekv, Hkv * Dk, 0.5);
    weight_new(&L->wv, r, wdt, Ekv, Hkv * Dv, 0.5);
    weight_new(&L->wo, r, wdt, Hq * Dv, E, 0.5);
    const int64_t outs[4] = {Hq * Dk, Hkv * Dk, Hkv * Dv, E};
    buf *bs[4] = {&L->bq, &L->bk, &L->bv, &L->bo};
    const unsigned hb = byte(r);
    for (int i = 0; i < 4; i++) {
        buf_new(bs[i], wdt, outs[i], 1, 1, 1);
        fill(&bs[i]->t, 0.5);
        L->has_b[i] = (hb >> i) & 1;
    }
    L->m.Hq = Hq;
    L->m.Hkv = pick(r, 4) == 0 && Hkv == Hq ? 0 : Hkv;
    L->m.w_q = &L->wq.b.t, L->m.w_k = &L->wk.b.t, L->m.w_v = &L->wv.b.t, L->m.w_o = &L->wo.b.t;
    L->m.b_q = L->has_b[0] ? &L->bq.t : NULL;
    L->m.b_k = L->has_b[1] ? &L->bk.t : NULL;
    L->m.b_v = L->has_b[2] ? &L->bv.t : NULL;
    L->m.b_o = L->has_b[3] ? &L->bo.t : NULL;
    const unsigned rk = byte(r) % 4;
    if (rk && Dk >= 2) {
        L->m.rope.kind = rk == 1 ? ATTN_ROPE_HALF : ATTN_ROPE_INTERLEAVED;
        L->m.rope.rotary_dim = pick(r, 2) && Dk % 2 == 0 ? 0 : 2 * (1 + pick(r, Dk / 2));  // 0: Dk
        L->m.rope.base = pick(r, 2) ? 0 : 100.0;
        L->m.rope.offset = pick(r, 6);
    }
}

static void layer_free(layer *L) {
    buf_free(&L->wq.b), buf_free(&L->wk.b), buf_free(&L->wv.b), buf_free(&L->wo.b);
    buf_free(&L->bq), buf_free(&L->bk), buf_free(&L->bv), buf_free(&L->bo);
}

static void fuzz_mha(reader *r) {
    const int64_t B = 1 + pick(r, 2), Lq = 1 + pick(r, 5), Hkv = 1 + pick(r, 2), G = 1 + pick(r, 2);
    const int64_t Hq = Hkv * G, Dk = 1 + pick(r, 6), Dv = 1 + pick(r, 6), E = 1 + pick(r, 10);
    const bool self = pick(r, 2);
    const int64_t Ekv = self ? E : 1 + pick(r, 10), Lk = self ? Lq : pick(r, 7);
    const attn_dtype xdt = FB[pick(r, 2)], wdt = FB[pick(r, 2)], ydt = FB[pick(r, 2)];
    layer L;
    layer_make(&L, r, E, Ekv, Hq, Hkv, Dk, Dv, wdt);
    buf xq, xkv, y, wts, kvl;
    buf_new(&xq, xdt, B, Lq, E, 1);
    fill(&xq.t, 1.0);
    buf_new(&xkv, xdt, B, Lk, Ekv, 1);
    fill(&xkv.t, 1.0);
    buf_new(&y, ydt, B, Lq, E, 1);
    const unsigned f = byte(r), fault = byte(r) % 16;
    const bool want_w = f & 1, avg = f & 2;
    buf_new(&wts, ATTN_F32, B, avg ? 1 : Hq, Lq, Lk);
    attn_options opt = {0};
    int64_t *len = xmalloc((size_t)B * sizeof *len);
    for (int64_t b = 0; b < B; b++) len[b] = Lk;
    buf_new(&kvl, ATTN_I32, B, 1, 1, 1);
    if (f & 4) {
        for (int64_t b = 0; b < B; b++) len[b] = pick(r, Lk + 1), ((int32_t *)kvl.t.data)[b] = (int32_t)len[b];
        opt.kv_len = &kvl.t;
    }
    if (f & 8) opt.causal = true, opt.align = (f & 16) ? ATTN_ALIGN_BOTTOM_RIGHT : ATTN_ALIGN_TOP_LEFT;
    if (f & 32) opt.has_scale = true, opt.scale = (float)(pick(r, 8) - 2) / 8.0f;
    opt.threads = 1;
    const attn_tensor *xkvp = self ? NULL : &xkv.t;
    attn_tensor *yp = &y.t;
    int expect = 0;  // 0 ok, 1 refused, 2 refused or right (an output on an input)
    buf lse;
    buf_new(&lse, ATTN_F32, B, Hq, Lq, 1);
    attn_mha m = L.m;
    attn_tensor wbad, xnull;
    const attn_tensor *xqp = &xq.t;
    switch (fault) {
    case 1: opt.lse = &lse.t; expect = 1; break;
    case 2: m.Hq = Hq + 1, m.Hkv = Hkv; expect = 1; break;  // W_O's rows, or the heads, disagree
    case 3: xnull = xq.t, xnull.data = NULL, xqp = &xnull; expect = numel(&xq.t) ? 1 : 2; break;
    case 4: m.rope.kind = ATTN_ROPE_HALF, m.rope.rotary_dim = 1; expect = 1; break;
    case 5: opt.block_table = &kvl.t; expect = 1; break;
    case 6: wbad = *m.w_o; wbad.shape[1] += 1; m.w_o = &wbad; expect = 1; break;
    case 7:
        if (xdt == ydt) { yp = &xq.t; expect = 2; }  // y on x_q itself
        break;
    case 8: m.rope.kind = ATTN_ROPE_HALF, m.rope.offset = -1; expect = 1; break;
    default: break;
    }
    if (getenv("FUZZ_VERBOSE"))
        fprintf(stderr, "mha: B %lld Lq %lld Lk %lld E %lld Ekv %lld Hq %lld Hkv %lld Dk %lld "
                "Dv %lld self %d dtypes x %d w %d y %d flags %#x fault %u rope %d/%lld\n",
                (long long)B, (long long)Lq, (long long)Lk, (long long)E, (long long)Ekv,
                (long long)Hq, (long long)Hkv, (long long)Dk, (long long)Dv, self, xdt, wdt, ydt,
                f, fault, (int)m.rope.kind, (long long)m.rope.rotary_dim);

    /* the float64 composition, from the inputs before the call */
    double *x = values(&xq.t), *xk = self ? x : values(&xkv.t);
    double *Q = xmalloc((size_t)(B * Lq * Hq * Dk + 1) * sizeof *Q);
    double *K = xmalloc((size_t)(B * Lk * Hkv * Dk + 1) * sizeof *K);
    double *V = xmalloc((size_t)(B * Lk * Hkv * Dv + 1) * sizeof *V);
    double *O = xmalloc((size_t)(B * Lq * Hq * Dv + 1) * sizeof *O);
    double *Y = xmalloc((size_t)(B * Lq * E + 1) * sizeof *Y);
    double *W = xmalloc((size_t)(B * Hq * Lq * Lk + 1) * sizeof *W);
    proj(Q, x, B * Lq, &L.wq, L.has_b[0] ? &L.bq : NULL);
    proj(K, xk, B * Lk, &L.wk, L.has_b[1] ? &L.bk : NULL);
    proj(V, xk, B * Lk, &L.wv, L.has_b[2] ? &L.bv : NULL);
    rope_ref(Q, B, Lq, Hq, Dk, &L.m.rope, NULL);
    rope_ref(K, B, Lk, Hkv, Dk, &L.m.rope, NULL);
    kv_dense ctx = {K, V, Lk, Hkv, Dk, Dv};
    att_in a = {B, Lq, Lk, Hq, Hkv, Dk, Dv, Q, key_dense, &ctx,
                opt.has_scale ? opt.scale : 1 / sqrt((double)Dk), opt.causal,
                opt.align == ATTN_ALIGN_BOTTOM_RIGHT, len};
    attention_ref(&a, O, W);
    proj(Y, O, B * Lq, &L.wo, L.has_b[3] ? &L.bo : NULL);

    const attn_status st = attn_mha_forward(&m, xqp, xkvp, yp, want_w ? &wts.t : NULL, avg, &opt);
    if (expect == 1 || (expect == 2 && st != ATTN_OK)) {
        REQUIRE(st != ATTN_OK, "mha forward accepted fault %u", fault);
        if (fault != 7) {
            REQUIRE(all_poison(&y), "failed mha forward (%s) wrote y", attn_last_error());
        } else {  // y is x_q: x_q as it was
            double *now = values(&xq.t);
            REQUIRE(memcmp(now, x, (size_t)numel(&xq.t) * sizeof *x) == 0,
                    "failed mha forward (%s) wrote y, which is x_q", attn_last_error());
            free(now);
        }
        REQUIRE(all_poison(&wts), "failed mha forward (%s) wrote the weights", attn_last_error());
    } else {
        REQUIRE(st == ATTN_OK, "mha forward refused: %s", attn_last_error());
        double *got = values(yp);
        compare_vals("mha y vs float64", got, Y, B * Lq * E, 1e-5, 2 * half_ulp(ydt));
        free(got);
        if (want_w) {
            double *wref = W;
            double *wavg = NULL;
            if (avg) {
                wavg = xmalloc((size_t)(B * Lq * Lk + 1) * sizeof *wavg);
                for (int64_t b = 0; b < B; b++)
                    for (int64_t e = 0; e < Lq * Lk; e++) {
                        double s = 0;
                        for (int64_t h = 0; h < Hq; h++) s += W[(b * Hq + h) * Lq * Lk + e];
                        wavg[b * Lq * Lk + e] = s / (double)Hq;
                    }
                wref = wavg;
            }
            double *gw = values(&wts.t);
            compare_vals("mha weights vs float64", gw, wref, numel(&wts.t), 1e-5, 0);
            free(gw);
            free(wavg);
        } else {
            REQUIRE(all_poison(&wts), "weights written without being asked for");
        }
        if (fault != 7) {
            buf y3, w3;
            buf_twin(&y3, &y);
            buf_twin(&w3, &wts);
            opt.threads = 3;
            REQUIRE(attn_mha_forward(&m, &xq.t, xkvp, &y3.t, want_w ? &w3.t : NULL, avg, &opt) == ATTN_OK,
                    "3 threads: %s", attn_last_error());
            REQUIRE(same_bytes(&y, &y3) && same_bytes(&wts, &w3), "mha forward: 1 and 3 threads differ");
            buf_free(&y3);
            buf_free(&w3);
        }
    }
    free(x);
    if (!self) free(xk);
    free(Q), free(K), free(V), free(O), free(Y), free(W), free(len);
    layer_free(&L);
    buf *all[] = {&xq, &xkv, &y, &wts, &kvl, &lse};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) buf_free(all[i]);
}

/* ---- (b) attn_mha_decode ----------------------------------------------------------- */

/* the cache's values after the step: pools as float32 [pages, Hkv, ps, D] */
typedef struct kv_cache_vals {
    const float *k, *v;
    const int32_t *table;  // NULL: contiguous (page b of size ps)
    int64_t mp, ps, Hkv, Dk, Dv;
} kv_cache_vals;
static double key_cache(const void *ctx, int64_t b, int64_t h, int64_t j, int64_t d, bool val) {
    const kv_cache_vals *c = ctx;
    const int64_t page = c->table ? c->table[b * c->mp + j / c->ps] : b, rr = c->table ? j % c->ps : j;
    const int64_t row = (page * c->Hkv + h) * c->ps + rr;
    return val ? c->v[row * c->Dv + d] : c->k[row * c->Dk + d];
}

static void fuzz_decode(reader *r) {
    const int64_t B = 1 + pick(r, 2), Hkv = 1 + pick(r, 2), G = 1 + pick(r, 2), Hq = Hkv * G;
    const attn_dtype cd = CDT[pick(r, 4)];
    const bool q8 = cd == ATTN_Q8_0;
    const int64_t Dk = q8 ? 32 : 1 + pick(r, 6), Dv = q8 ? 32 : 1 + pick(r, 6), E = 1 + pick(r, 8);
    const int64_t n = 1 + pick(r, 3);
    const bool paged = pick(r, 2);
    int64_t ps = 1 + pick(r, 4), mp = 1 + pick(r, 3), N = B * mp + pick(r, 2);
    if (!paged) ps = 1 + pick(r, 8), mp = 1, N = B;
    const int64_t Lmax = mp * ps;
    const attn_dtype xdt = FB[pick(r, 2)], wdt = FB[pick(r, 2)], ydt = FB[pick(r, 2)];
    layer L;
    layer_make(&L, r, E, E, Hq, Hkv, Dk, Dv, wdt);
    buf kc, vc, tab, x, y;
    buf_new(&kc, cd, N, Hkv, ps, Dk);
    buf_new(&vc, cd, N, Hkv, ps, Dv);
    free(cache_fill(&kc.t, 1.0));
    free(cache_fill(&vc.t, 1.0));
    buf_new(&tab, ATTN_I32, B, mp, 1, 1);
    int32_t *table = (int32_t *)tab.t.data;
    for (int64_t i = 0; i < B * mp; i++) table[i] = (int32_t)i;
    for (int64_t i = B * mp - 1; i > 0; i--) {
        const int64_t j = (int64_t)(unif() * (double)(i + 1));
        const int32_t t = table[i];
        table[i] = table[j], table[j] = t;
    }
    int64_t *len = xmalloc((size_t)B * sizeof *len), *len0 = xmalloc((size_t)B * sizeof *len0);
    for (int64_t b = 0; b < B; b++) len[b] = pick(r, 3) ? pick(r, Lmax - n + 1 > 0 ? Lmax - n + 1 : 1) : pick(r, Lmax + 1);
    const unsigned f = byte(r), fault = byte(r) % 14;
    if (paged && fault == 1) table[pick(r, B * mp)] = pick(r, 2) ? (int32_t)N : -1;  // outside
    if (paged && fault == 2 && B * mp > 1) table[pick(r, B * mp)] = table[pick(r, B * mp)];
    memcpy(len0, len, (size_t)B * sizeof *len);
    buf_new(&x, xdt, B, n, E, 1);
    fill(&x.t, 1.0);
    buf_new(&y, ydt, B, n, E, 1);
    attn_options opt = {0};
    if (f & 1) opt.has_scale = true, opt.scale = (float)(pick(r, 8) - 2) / 8.0f;
    opt.threads = 1;
    attn_kv_cache cache = {paged ? ATTN_CACHE_PAGED : ATTN_CACHE_CONTIGUOUS, kc.t, vc.t, len,
                           paged ? &tab.t : NULL, NULL, NULL};
    /* the prediction: every row written inside the pool, none twice, every page read in */
    bool expect_ok = true;
    {
        unsigned char *seen = calloc((size_t)(N * ps), 1);
        if (!seen) abort();
        for (int64_t b = 0; b < B; b++) {
            if (len[b] + n > Lmax) { expect_ok = false; continue; }
            for (int64_t p = 0; p < (len[b] + n + ps - 1) / ps; p++) {
                const int64_t e = paged ? table[b * mp + p] : b;
                if (e < 0 || e >= N) expect_ok = false;
            }
            if (!expect_ok) continue;
            for (int64_t t = len[b]; t < len[b] + n; t++) {
                const int64_t s = (paged ? table[b * mp + t / ps] : b) * ps + t % ps;
                if (seen[s]) expect_ok = false;
                seen[s] = 1;
            }
        }
        free(seen);
    }
    buf kvl;
    buf_new(&kvl, ATTN_I32, B, 1, 1, 1);
    switch (fault) {
    case 3: opt.causal = true; expect_ok = false; break;
    case 4: memset(kvl.t.data, 0, 4 * (size_t)B); opt.kv_len = &kvl.t; expect_ok = false; break;
    case 5: opt.block_table = &tab.t; expect_ok = false; break;
    case 6: if (!paged) { cache.block_table = &tab.t; expect_ok = false; } break;
    case 7: if (paged) { cache.block_table = NULL; expect_ok = false; } break;
    case 8: opt.lse = &kvl.t; expect_ok = false; break;
    default: break;
    }
    if (getenv("FUZZ_VERBOSE"))
        fprintf(stderr, "decode: B %lld n %lld E %lld Hq %lld Hkv %lld Dk %lld Dv %lld cache %s "
                "paged %d ps %lld mp %lld N %lld fault %u expect %d\n", (long long)B, (long long)n,
                (long long)E, (long long)Hq, (long long)Hkv, (long long)Dk, (long long)Dv,
                attn_dtype_name(cd), paged, (long long)ps, (long long)mp, (long long)N, fault, expect_ok);
    buf kc0, vc0, k3, v3;
    buf_copy(&kc0, &kc);
    buf_copy(&vc0, &vc);
    buf_copy(&k3, &kc);
    buf_copy(&v3, &vc);
    const attn_status st = attn_mha_decode(&L.m, &x.t, &cache, &y.t, &opt);
    if (!expect_ok) {
        REQUIRE(st != ATTN_OK, "decode step accepted fault %u", fault);
        REQUIRE(all_poison(&y), "failed step (%s) wrote y", attn_last_error());
        REQUIRE(same_bytes(&kc, &kc0) && same_bytes(&vc, &vc0), "failed step (%s) wrote the cache",
                attn_last_error());
        REQUIRE(memcmp(len, len0, (size_t)B * sizeof *len) == 0, "failed step (%s) moved len",
                attn_last_error());
    } else {
        REQUIRE(st == ATTN_OK, "decode step refused: %s", attn_last_error());
        for (int64_t b = 0; b < B; b++) REQUIRE(len[b] == len0[b] + n, "len not advanced by n");
        /* the float64 projections of the new tokens, rotated at len0[b] + i */
        double *xv = values(&x.t);
        double *Q = xmalloc((size_t)(B * n * Hq * Dk) * sizeof *Q);
        double *K = xmalloc((size_t)(B * n * Hkv * Dk) * sizeof *K);
        double *V = xmalloc((size_t)(B * n * Hkv * Dv) * sizeof *V);
        proj(Q, xv, B * n, &L.wq, L.has_b[0] ? &L.bq : NULL);
        proj(K, xv, B * n, &L.wk, L.has_b[1] ? &L.bk : NULL);
        proj(V, xv, B * n, &L.wv, L.has_b[2] ? &L.bv : NULL);
        rope_ref(Q, B, n, Hq, Dk, &L.m.rope, len0);
        rope_ref(K, B, n, Hkv, Dk, &L.m.rope, len0);
        float *kx = cache_values(&kc.t), *vx = cache_values(&vc.t);
        /* the new rows: within the dtype's rounding of the float64 projection; the
         * rest of the cache as it was (the new rows copied into the old one) */
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < n; t++)
                for (int64_t h = 0; h < Hkv; h++)
                    for (int c = 0; c < 2; c++) {
                        const int64_t D = c ? Dv : Dk, pos = len0[b] + t;
                        const int64_t page = paged ? table[b * mp + pos / ps] : b;
                        const double *ref = (c ? V : K) + ((b * n + t) * Hkv + h) * D;
                        const float *got = (c ? vx : kx) + ((page * Hkv + h) * ps + pos % ps) * D;
                        double amax = 0;
                        for (int64_t d = 0; d < D; d++) amax = fmax(amax, fabs(ref[d]));
                        for (int64_t d = 0; d < D; d++) {
                            const double tol = 1e-5 * (1 + amax) + 2 * half_ulp(cd) * fabs(ref[d]) +
                                               (q8 ? amax / 127 * (0.5 + 127 * 0x1p-11) * 1.01 + 0x1p-24 : 0);
                            REQUIRE(fabs(got[d] - ref[d]) <= tol, "new %s row (b %lld, t %lld, h %lld) "
                                    "element %lld: %.9g vs %.9g (tolerance %.3g)", c ? "V" : "K",
                                    (long long)b, (long long)t, (long long)h, (long long)d, got[d],
                                    ref[d], tol);
                        }
                        const buf *now = c ? &vc : &kc;
                        buf *old = c ? &vc0 : &kc0;
                        memcpy(row_at(&old->t, page, h, pos % ps), row_at(&now->t, page, h, pos % ps),
                               nbytes(cd, D));
                    }
        REQUIRE(same_bytes(&kc, &kc0) && same_bytes(&vc, &vc0), "the step wrote outside its new rows");
        /* y against the float64 composition over the cache's values */
        double *O = xmalloc((size_t)(B * n * Hq * Dv) * sizeof *O), *Y = xmalloc((size_t)(B * n * E) * sizeof *Y);
        kv_cache_vals ctx = {kx, vx, paged ? table : NULL, mp, ps, Hkv, Dk, Dv};
        att_in a = {B, n, Lmax, Hq, Hkv, Dk, Dv, Q, key_cache, &ctx,
                    opt.has_scale ? opt.scale : 1 / sqrt((double)Dk), true, true, len};
        attention_ref(&a, O, NULL);
        proj(Y, O, B * n, &L.wo, L.has_b[3] ? &L.bo : NULL);
        double *gy = values(&y.t);
        compare_vals("decode y vs float64", gy, Y, B * n * E, 1e-5, 2 * half_ulp(ydt));
        /* again from the same cache with 3 threads: the same bytes */
        buf y3;
        buf_twin(&y3, &y);
        int64_t *len3 = xmalloc((size_t)B * sizeof *len3);
        memcpy(len3, len0, (size_t)B * sizeof *len3);
        attn_kv_cache c3 = cache;
        c3.k = k3.t, c3.v = v3.t, c3.len = len3;
        c3.k.data = k3.base, c3.v.data = v3.base;
        opt.threads = 3;
        REQUIRE(attn_mha_decode(&L.m, &x.t, &c3, &y3.t, &opt) == ATTN_OK, "3 threads: %s",
                attn_last_error());
        REQUIRE(same_bytes(&y, &y3) && same_bytes(&k3, &kc) && same_bytes(&v3, &vc),
                "decode step: 1 and 3 threads differ");
        free(gy), free(O), free(Y), free(xv), free(Q), free(K), free(V), free(kx), free(vx), free(len3);
        buf_free(&y3);
    }
    buf_free(&kc0), buf_free(&vc0), buf_free(&k3), buf_free(&v3);
    free(len), free(len0);
    layer_free(&L);
    buf *all[] = {&kc, &vc, &tab, &x, &y, &kvl};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) buf_free(all[i]);
}

/* ---- (c) attn_additive_forward ----------------------------------------------------- */

static void fuzz_additive(reader *r) {
    const int64_t B = 1 + pick(r, 2), Lq = 1 + pick(r, 6), Lk = pick(r, 11);
    const int64_t Dq = pick(r, 7), Dk = pick(r, 7), Dv = 1 + pick(r, 6), A = pick(r, 9);
    buf q, k, v, o, lse, wts, mask, kvl;
    buf_new(&q, ATTN_F32, B, 1, Lq, Dq);
    buf_new(&k, ATTN_F32, B, 1, Lk, Dk);
    buf_new(&v, ATTN_F32, B, 1, Lk, Dv);
    fill(&q.t, 1.0), fill(&k.t, 1.0), fill(&v.t, 1.0);
    buf_new(&o, ATTN_F32, B, 1, Lq, Dv);
    buf_new(&lse, ATTN_F32, B, 1, Lq, 1);
    buf_new(&wts, ATTN_F32, B, 1, Lq, Lk);
    float *wq = xmalloc((size_t)(Dq * A + 1) * 4), *wk = xmalloc((size_t)(Dk * A + 1) * 4);
    float *wv = xmalloc((size_t)(A + 1) * 4), *wb = xmalloc((size_t)(A + 1) * 4);
    for (int64_t i = 0; i < Dq * A; i++) wq[i] = (float)sym(0.7);
    for (int64_t i = 0; i < Dk * A; i++) wk[i] = (float)sym(0.7);
    for (int64_t i = 0; i < A; i++) wv[i] = (float)sym(1), wb[i] = (float)sym(0.5);
    const unsigned f = byte(r) | byte(r) << 8, fault = byte(r) % 16;
    attn_additive_weights w = {A, wq, wk, wv, (f & 1) ? wb : NULL, (f & 2) != 0, (float)sym(2)};
    attn_options opt = {0};
    if (f & 4) {
        const attn_dtype dt = pick(r, 2) ? ATTN_I64 : ATTN_I32;
        buf_new(&kvl, dt, B, 1, 1, 1);
        for (int64_t b = 0; b < B; b++) {
            if (dt == ATTN_I32) ((int32_t *)kvl.t.data)[b] = (int32_t)pick(r, Lk + 1);
            else ((int64_t *)kvl.t.data)[b] = pick(r, Lk + 1);
        }
        opt.kv_len = &kvl.t;
    } else {
        buf_new(&kvl, ATTN_I32, B, 1, 1, 1);
    }
    const unsigned mb = byte(r);
    const int64_t md[4] = {mb & 1 ? B : 1, 1, mb & 2 ? Lq : 1, mb & 4 ? Lk : 1};
    buf_new(&mask, ATTN_BOOL, md[0], 1, md[2], md[3]);
    for (int64_t e = 0; e < md[0] * md[2] * md[3]; e++) mask.base[e] = unif() < 0.75;
    if (f & 8) {
        for (int i = 0; i < 4; i++)
            if (md[i] == 1) mask.t.stride[i] = 0;
        mask.t.shape[0] = B, mask.t.shape[2] = Lq, mask.t.shape[3] = Lk;
        opt.mask = &mask.t;
    }
    if (f & 16) opt.causal = true, opt.align = (f & 32) ? ATTN_ALIGN_BOTTOM_RIGHT : ATTN_ALIGN_TOP_LEFT;
    if (f & 64) opt.has_window = true, opt.window_left = pick(r, 6) - 1, opt.window_right = pick(r, 6) - 1;
    const bool want_lse = f & 128, want_w = f & 256;
    opt.lse = want_lse ? &lse.t : NULL;
    opt.weights = want_w ? &wts.t : NULL;
    opt.threads = 1;
    opt.path = ATTN_PATH_FUSED;
    bool expect_ok = true;
    attn_tensor *op = &o.t;
    attn_tensor qbad;
    const attn_tensor *qp = &q.t;
    switch (fault) {
    case 1: opt.has_scale = true, opt.scale = 1; expect_ok = false; break;
    case 2: opt.softcap = 5; expect_ok = false; break;
    case 3: qbad = q.t; qbad.dtype = ATTN_F16; qp = &qbad; expect_ok = false; break;
    /* o on q: refused, or the right O. The contract's rule on shared memory names
     * attn_forward and attn_backward only; this call has no overlap check and takes it. */
    case 4: if (Dq == Dv && Dq > 0) op = &q.t; break;
    case 5: if (A > 0 && Dq > 0) { w.w_query = NULL; expect_ok = false; } break;
    case 6: w.normalize = true, w.g = NAN; expect_ok = false; break;
    case 7: qbad = q.t; qbad.shape[1] = 2; qp = &qbad; expect_ok = false; break;
    case 8: opt.workspace = wb, opt.workspace_bytes = 4; expect_ok = false; break;
    case 9: w.units = -1; expect_ok = false; break;
    default: break;
    }
    if (getenv("FUZZ_VERBOSE"))
        fprintf(stderr, "additive: B %lld Lq %lld Lk %lld Dq %lld Dk %lld Dv %lld A %lld flags %#x "
                "fault %u\n", (long long)B, (long long)Lq, (long long)Lk, (long long)Dq, (long long)Dk,
                (long long)Dv, (long long)A, f, fault);
    buf q0;
    buf_copy(&q0, &q);
    buf oal;  // o on q: the reference from a copy of q, for a call that takes it
    buf_twin(&oal, &o);
    if (op == &q.t) {
        attn_options ro = opt;
        ro.path = ATTN_PATH_REFERENCE, ro.lse = ro.weights = NULL;
        REQUIRE(attn_additive_forward(&q0.t, &k.t, &v.t, &w, &oal.t, &ro) == ATTN_OK, "%s",
                attn_last_error());
    }
    const attn_status st = attn_additive_forward(qp, &k.t, &v.t, &w, op, &opt);
    if (op == &q.t) {
        if (st == ATTN_OK)
            compare_t("additive O written over q vs reference", &q.t, &oal.t, 1e-4, 0);
        else
            REQUIRE(same_bytes(&q, &q0), "failed additive forward (%s) wrote q", attn_last_error());
    } else if (!expect_ok) {
        REQUIRE(st != ATTN_OK, "additive forward accepted fault %u", fault);
        REQUIRE(all_poison(&o) && all_poison(&lse) && all_poison(&wts) && same_bytes(&q, &q0),
                "failed additive forward (%s) wrote an output", attn_last_error());
    } else {
        REQUIRE(st == ATTN_OK, "additive forward refused: %s", attn_last_error());
        if (!want_lse) REQUIRE(all_poison(&lse), "lse written without being asked for");
        if (!want_w) REQUIRE(all_poison(&wts), "weights written without being asked for");
        buf o3, l3, w3, orf, lrf, wrf;
        buf_twin(&o3, &o), buf_twin(&l3, &lse), buf_twin(&w3, &wts);
        opt.threads = 3;
        opt.lse = want_lse ? &l3.t : NULL;
        opt.weights = want_w ? &w3.t : NULL;
        REQUIRE(attn_additive_forward(&q.t, &k.t, &v.t, &w, &o3.t, &opt) == ATTN_OK, "3 threads: %s",
                attn_last_error());
        REQUIRE(same_bytes(&o, &o3) && same_bytes(&lse, &l3) && same_bytes(&wts, &w3),
                "additive forward: 1 and 3 threads differ");
        buf_twin(&orf, &o), buf_twin(&lrf, &lse), buf_twin(&wrf, &wts);
        opt.path = ATTN_PATH_REFERENCE;
        opt.threads = 2;
        opt.lse = want_lse ? &lrf.t : NULL;
        opt.weights = want_w ? &wrf.t : NULL;
        REQUIRE(attn_additive_forward(&q.t, &k.t, &v.t, &w, &orf.t, &opt) == ATTN_OK, "reference: %s",
                attn_last_error());
        compare_t("additive O vs reference", &o.t, &orf.t, 1e-4, 0);
        if (want_lse) compare_t("additive LSE vs reference", &lse.t, &lrf.t, 1e-4, 0);
        if (want_w) compare_t("additive weights vs reference", &wts.t, &wrf.t, 1e-4, 0);
        buf *t6[] = {&o3, &l3, &w3, &orf, &lrf, &wrf};
        for (size_t i = 0; i < 6; i++) buf_free(t6[i]);
    }
    buf_free(&q0), buf_free(&oal);
    free(wq), free(wk), free(wv), free(wb);
    buf *all[] = {&q, &k, &v, &o, &lse, &wts, &mask, &kvl};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) buf_free(all[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    reader r = {data, size};
    seed_from(data, size);
    switch (byte(&r) % 3) {
    case 0: fuzz_mha(&r); break;
    case 1: fuzz_decode(&r); break;
    default: fuzz_additive(&r); break;
    }
    return 0;
}
