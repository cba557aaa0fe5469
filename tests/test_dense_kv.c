/*
 * test_dense_kv.c — tensors whose rows are not adjacent: transformers' [B, L, H, D] memory
 *                   read as [B, H, L, D], rows reversed (a negative stride), rows padded.
 *                   A prefill copies such K and V dense into its workspace
 *                   (core/dense_rows.h); the backward reads them in place. The contract
 *                   is that a view gives the bits of the same values in dense tensors.
 *                   Checked here bit for bit against the dense call — O, LSE, the
 *                   weights, and in float32 dQ, dK, dV (written into views of the same
 *                   layout) and the sinks' gradient — over dtypes (float32, bfloat16, an
 *                   fp8 cache with a scale), GQA and MQA, causal both ways, a window, a
 *                   bool mask, a float bias, key lengths, sinks, 1 and 2 threads, with the
 *                   call's own workspace and with one the caller sized by the query; and
 *                   that the forward's query asks for the copies' bytes where they are
 *                   taken (any kernel's block sizes up to their limits) and not for a
 *                   decoding step, the backward's for none.
 */
#include <string.h>

#include "attn.h"
#include "support/check.h"

static int g_cases;
static uint64_t g_state = 0x9E3779B97F4A7C15ull;
static float uniform(void) {  // in [-1, 1)
    g_state = g_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((int64_t)(g_state >> 40) - (1 << 23)) / (float)(1 << 23);
}

typedef struct dcase {
    int64_t B, Hq, Hkv, Lq, Lk, D;
    attn_dtype kv;  // q takes it too, but for fp8 (q float32)
    int layout;     // 1 [B, L, H, D]; 2 the same, rows reversed; 3 rows padded by 24 elements
    bool causal, bottom_right, window, mask, bias, kv_len, sinks, weights;
    int threads;
} dcase;

/* bytes of one element of the dtypes used here */
static int64_t esize(attn_dtype t) { return t == ATTN_F32 ? 4 : t == ATTN_FP8_E4M3 ? 1 : 2; }

/* random values of dtype t, n of them (fp8: codes away from NaN) */
static void fill(void *buf, attn_dtype t, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float x = uniform() * 2.0f;
        if (t == ATTN_F32) {
            ((float *)buf)[i] = x;
        } else if (t == ATTN_BF16) {
            uint32_t u;
            memcpy(&u, &x, 4);
            ((uint16_t *)buf)[i] = (uint16_t)(u >> 16);
        } else {
            const uint8_t c = (uint8_t)(uniform() * 120.0f + 120.0f);  // sign and 0..0x77
            ((uint8_t *)buf)[i] = (uint8_t)(c & 0x7f) == 0x7f ? 0x7e : c;
        }
    }
}

/* An (B, H, L, D) view of dtype t in the case's layout over a fresh buffer (*owned), its
 * values random, or those of the dense tensor `from` when not NULL; *dense, when not
 * NULL, gets the same values in a dense tensor over another buffer (*owned_dense). */
static attn_tensor make_view(const dcase *c, int64_t H, int64_t L, attn_dtype t, const void *from,
                             attn_tensor *dense, void **owned, void **owned_dense) {
    const int64_t es = esize(t), pad = c->layout == 3 ? 24 : 0, row = H * c->D + pad;
    char *buf = xcalloc((size_t)(c->B * L * row + 1), (size_t)es);
    fill(buf, t, c->B * L * row);
    attn_tensor v = {.data = buf, .dtype = t, .shape = {c->B, H, L, c->D},
                     .stride = {L * row, c->D, row, 1}};
    if (c->layout == 2) {  // row j at buffer row L - 1 - j
        v.data = buf + (L - 1) * row * es;
        v.stride[2] = -row;
    }
    char *dbuf = (char *)from;
    if (dense) {
        dbuf = xcalloc((size_t)(c->B * H * L * c->D + 1), (size_t)es);
        *dense = attn_tensor_4d(dbuf, t, c->B, H, L, c->D);
        *owned_dense = dbuf;
    }
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t j = 0; j < L; j++) {
                char *d = dbuf + (((b * H + h) * L + j) * c->D) * es;
                char *x = (char *)v.data + (b * v.stride[0] + h * v.stride[1] + j * v.stride[2]) * es;
                if (from)
                    memcpy(x, d, (size_t)(c->D * es));
                else
                    memcpy(d, x, (size_t)(c->D * es));
            }
    *owned = buf;
    return v;
}

typedef struct outs {
    float *o, *lse, *w;
    attn_tensor to, tlse, tw;
} outs;

static void outs_init(outs *r, const dcase *c) {
    const int64_t no = c->B * c->Hq * c->Lq * c->D, nl = c->B * c->Hq * c->Lq;
    r->o = xcalloc((size_t)no, sizeof(float));
    r->lse = xcalloc((size_t)nl, sizeof(float));
    r->w = c->weights ? xcalloc((size_t)(nl * c->Lk), sizeof(float)) : NULL;
    r->to = attn_tensor_4d(r->o, ATTN_F32, c->B, c->Hq, c->Lq, c->D);
    r->tlse = attn_tensor_4d(r->lse, ATTN_F32, c->B, c->Hq, c->Lq, 1);
    if (r->w) r->tw = attn_tensor_4d(r->w, ATTN_F32, c->B, c->Hq, c->Lq, c->Lk);
}

static void outs_free(outs *r) {
    free(r->o);
    free(r->lse);
    free(r->w);
}

static bool same_bytes(const void *a, const void *b, size_t n) { return memcmp(a, b, n) == 0; }

/* The rows of view v (H heads of L rows) gathered into the dense (B, H, L, D) dst */
static void gather(const dcase *c, const attn_tensor *v, int64_t H, int64_t L, float *dst) {
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t j = 0; j < L; j++)
                memcpy(dst + ((b * H + h) * L + j) * c->D,
                       (const float *)v->data + b * v->stride[0] + h * v->stride[1] + j * v->stride[2],
                       (size_t)c->D * sizeof(float));
}

/* The backward over the views t[3..5] (Q, K, V) with O and dO as views too, and dQ, dK
 * and dV written into views of the same layout, against the backward over the dense
 * t[0..2] into dense gradients: dQ, dK, dV (and the sinks' gradient) the same bytes.
 * fw: the dense forward's O and LSE. */
static void backward_pair(const dcase *c, const char *name, const attn_options *opt,
                          const attn_tensor *t, const outs *fw) {
    attn_tensor dod;
    void *dob, *dodb, *ob;
    const attn_tensor d_o = make_view(c, c->Hq, c->Lq, ATTN_F32, NULL, &dod, &dob, &dodb);
    const attn_tensor o = make_view(c, c->Hq, c->Lq, ATTN_F32, fw->o, NULL, &ob, NULL);
    const int64_t nq = c->B * c->Hq * c->Lq * c->D, nk = c->B * c->Hkv * c->Lk * c->D;
    float *g[2][4], *zeros = xcalloc((size_t)(nq > nk ? nq : nk), sizeof(float));
    attn_tensor tg[2][3];
    void *gv[3];
    for (int s = 0; s < 2; s++) {
        g[s][0] = xcalloc(nq, sizeof(float));
        g[s][1] = xcalloc(nk, sizeof(float));
        g[s][2] = xcalloc(nk, sizeof(float));
        g[s][3] = xcalloc(16, sizeof(float));
        tg[s][0] = attn_tensor_4d(g[s][0], ATTN_F32, c->B, c->Hq, c->Lq, c->D);
        tg[s][1] = attn_tensor_4d(g[s][1], ATTN_F32, c->B, c->Hkv, c->Lk, c->D);
        tg[s][2] = attn_tensor_4d(g[s][2], ATTN_F32, c->B, c->Hkv, c->Lk, c->D);
        if (s) {  // the views' gradients in their layout (rows apart, reversed or padded)
            tg[1][0] = make_view(c, c->Hq, c->Lq, ATTN_F32, zeros, NULL, &gv[0], NULL);
            tg[1][1] = make_view(c, c->Hkv, c->Lk, ATTN_F32, zeros, NULL, &gv[1], NULL);
            tg[1][2] = make_view(c, c->Hkv, c->Lk, ATTN_F32, zeros, NULL, &gv[2], NULL);
        }
        attn_tensor tds = attn_tensor_4d(g[s][3], ATTN_F32, c->Hq, 1, 1, 1);
        attn_options ob_opt = *opt;
        if (c->sinks) ob_opt.d_sinks = &tds;
        const attn_tensor *x = t + 3 * s;
        const attn_status st = attn_backward(&x[0], &x[1], &x[2], s ? &o : &fw->to, s ? &d_o : &dod,
                                             &fw->tlse, &tg[s][0], &tg[s][1], &tg[s][2], &ob_opt);
        CHECK(st == ATTN_OK, "%s: backward %s: %s", name, s ? "view" : "dense", attn_last_error());
        if (s) {
            gather(c, &tg[1][0], c->Hq, c->Lq, g[1][0]);
            gather(c, &tg[1][1], c->Hkv, c->Lk, g[1][1]);
            gather(c, &tg[1][2], c->Hkv, c->Lk, g[1][2]);
            for (int i = 0; i < 3; i++) free(gv[i]);
        }
    }
    free(zeros);
    CHECK(same_bytes(g[0][0], g[1][0], (size_t)nq * 4), "%s: dQ of the views differs", name);
    CHECK(same_bytes(g[0][1], g[1][1], (size_t)nk * 4) && same_bytes(g[0][2], g[1][2], (size_t)nk * 4),
          "%s: dK or dV of the views differs", name);
    CHECK(same_bytes(g[0][3], g[1][3], 16 * 4), "%s: d_sinks of the views differs", name);
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < 4; i++) free(g[s][i]);
    free(dob);
    free(dodb);
    free(ob);
}

static void run_case(const dcase *c, const char *name) {
    const attn_dtype qt = c->kv == ATTN_FP8_E4M3 ? ATTN_F32 : c->kv;
    attn_tensor qd, kd, vd;
    void *qb, *qdb, *kb, *kdb, *vb, *vdb;
    const attn_tensor q = make_view(c, c->Hq, c->Lq, qt, NULL, &qd, &qb, &qdb);
    const attn_tensor k = make_view(c, c->Hkv, c->Lk, c->kv, NULL, &kd, &kb, &kdb);
    const attn_tensor v = make_view(c, c->Hkv, c->Lk, c->kv, NULL, &vd, &vb, &vdb);

    uint8_t *mbuf = NULL;
    float *bbuf = NULL, sinks[16], kscale = 0.37f;
    int64_t lens[8];
    attn_tensor tm, tb, tl, ts, tks;
    attn_options opt = {0};
    opt.threads = c->threads;
    opt.causal = c->causal;
    opt.align = c->bottom_right ? ATTN_ALIGN_BOTTOM_RIGHT : ATTN_ALIGN_TOP_LEFT;
    if (c->window) opt.has_window = true, opt.window_left = 97, opt.window_right = 5;
    if (c->mask) {
        mbuf = xcalloc((size_t)(c->Lq * c->Lk), 1);
        for (int64_t i = 0; i < c->Lq * c->Lk; i++) mbuf[i] = uniform() > -0.6f;
        tm = attn_tensor_4d(mbuf, ATTN_BOOL, 1, 1, c->Lq, c->Lk);
        opt.mask = &tm;
    }
    if (c->bias) {
        bbuf = xcalloc((size_t)(c->Hq * c->Lq * c->Lk), sizeof(float));
        fill(bbuf, ATTN_F32, c->Hq * c->Lq * c->Lk);
        tb = attn_tensor_4d(bbuf, ATTN_F32, 1, c->Hq, c->Lq, c->Lk);
        opt.bias = &tb;
    }
    if (c->kv_len) {
        for (int64_t b = 0; b < c->B; b++) lens[b] = b % 2 ? c->Lk : c->Lk * 2 / 3;
        tl = attn_tensor_4d(lens, ATTN_I64, c->B, 1, 1, 1);
        opt.kv_len = &tl;
    }
    if (c->sinks) {
        for (int64_t h = 0; h < c->Hq; h++) sinks[h] = uniform();
        ts = attn_tensor_4d(sinks, ATTN_F32, c->Hq, 1, 1, 1);
        opt.sinks = &ts;
    }
    if (c->kv == ATTN_FP8_E4M3) {
        tks = attn_tensor_4d(&kscale, ATTN_F32, 1, 1, 1, 1);
        opt.k_scale = &tks;
        opt.v_scale = &tks;
    }

    outs dense, view, given;
    outs_init(&dense, c);
    outs_init(&view, c);
    outs_init(&given, c);
    attn_options od = opt, ov = opt, og = opt;
    od.lse = &dense.tlse, ov.lse = &view.tlse, og.lse = &given.tlse;
    if (c->weights) od.weights = &dense.tw, ov.weights = &view.tw, og.weights = &given.tw;

    attn_status st = attn_forward(&qd, &kd, &vd, &dense.to, &od);
    CHECK(st == ATTN_OK, "%s: dense call: %s", name, attn_last_error());
    st = attn_forward(&q, &k, &v, &view.to, &ov);
    CHECK(st == ATTN_OK, "%s: view call: %s", name, attn_last_error());
    size_t need = 0;
    st = attn_forward_workspace_size(&q, &k, &v, &given.to, &og, &need);
    CHECK(st == ATTN_OK, "%s: workspace query: %s", name, attn_last_error());
    void *ws = xcalloc(need + 1, 1);
    og.workspace = ws, og.workspace_bytes = need;
    st = attn_forward(&q, &k, &v, &given.to, &og);
    CHECK(st == ATTN_OK, "%s: view call, caller's workspace: %s", name, attn_last_error());

    const size_t nl = (size_t)(c->B * c->Hq * c->Lq) * 4, no = nl * (size_t)c->D;
    CHECK(same_bytes(dense.o, view.o, no), "%s: O of the view differs from the dense call's", name);
    CHECK(same_bytes(dense.lse, view.lse, nl), "%s: LSE of the view differs", name);
    CHECK(same_bytes(dense.o, given.o, no) && same_bytes(dense.lse, given.lse, nl),
          "%s: O or LSE with the caller's workspace differs", name);
    if (c->weights)
        CHECK(same_bytes(dense.w, view.w, nl * (size_t)c->Lk) &&
              same_bytes(dense.w, given.w, nl * (size_t)c->Lk),
              "%s: the weights of the view differ", name);
    if (c->kv == ATTN_F32) backward_pair(c, name, &opt, (attn_tensor[]){qd, kd, vd, q, k, v},
                                         &dense);
    g_cases++;

    outs_free(&dense);
    outs_free(&view);
    outs_free(&given);
    free(ws);
    free(mbuf);
    free(bbuf);
    free(qb);
    free(qdb);
    free(kb);
    free(kdb);
    free(vb);
    free(vdb);
}

/* The workspace query over a view asks for the dense copies of K and V exactly where the
 * rule takes them: a prefill whose key rows are read by many blocks whatever the kernel's
 * rows per block, never a decoding step. */
static void workspace_rule(void) {
    const int64_t Lk = 100, D = 32;
    float *k = xcalloc((size_t)(Lk * 2 * D), sizeof(float));
    float *q = xcalloc((size_t)(2048 * 2 * D), sizeof(float));
    const attn_tensor kview = {.data = k, .dtype = ATTN_F32, .shape = {1, 1, Lk, D},
                               .stride = {Lk * 2 * D, D, 2 * D, 1}};
    const attn_tensor kdense = attn_tensor_4d(k, ATTN_F32, 1, 1, Lk, D);
    const int64_t lqs[] = {1, 2048};
    for (int n = 0; n < 2; n++) {
        const int64_t Lq = lqs[n];
        const attn_tensor tq = attn_tensor_4d(q, ATTN_F32, 1, 2, Lq, D);
        const attn_tensor to = attn_tensor_4d(q, ATTN_F32, 1, 2, Lq, D);
        attn_options opt = {0};
        opt.threads = 1;
        size_t a = 0, b = 0;
        CHECK(attn_forward_workspace_size(&tq, &kview, &kview, &to, &opt, &a) == ATTN_OK &&
              attn_forward_workspace_size(&tq, &kdense, &kdense, &to, &opt, &b) == ATTN_OK,
              "workspace queries: %s", attn_last_error());
        const size_t copies = 2 * (size_t)(Lk * D) * sizeof(float);
        if (Lq == 1)
            CHECK(a == b, "decoding step: the view asks %zu bytes, the dense call %zu", a, b);
        else
            CHECK(a >= b + copies,
                  "prefill of %lld rows: the view asks %zu bytes, the dense call %zu "
                  "(no room for the %zu bytes of dense K and V)", (long long)Lq, a, b, copies);
    }
    free(k);
    free(q);
}

/* The backward reads views of Q and dO in place (its dense copies were taken out:
 * docs/KERNELS.md, "Designs tried"): its query asks the same bytes for views as for dense
 * tensors, over a few keys and over many. */
static void backward_workspace_rule(void) {
    const int64_t Lq = 40, D = 32, H = 2;
    float *x = xcalloc((size_t)(Lq * H * D), sizeof(float));
    float *kv = xcalloc((size_t)(2100 * D), sizeof(float));
    const attn_tensor view = {.data = x, .dtype = ATTN_F32, .shape = {1, H, Lq, D},
                              .stride = {Lq * H * D, D, H * D, 1}};
    const attn_tensor dense = attn_tensor_4d(x, ATTN_F32, 1, H, Lq, D);
    const attn_tensor lse = attn_tensor_4d(x, ATTN_F32, 1, H, Lq, 1);
    const int64_t lks[] = {16, 2100};
    for (int n = 0; n < 2; n++) {
        const attn_tensor k = attn_tensor_4d(kv, ATTN_F32, 1, 1, lks[n], D);
        attn_options opt = {0};
        opt.threads = 1;
        size_t a = 0, b = 0;
        CHECK(attn_backward_workspace_size(&view, &k, &k, &dense, &view, &lse, &dense, &k, &k,
                                           &opt, &a) == ATTN_OK &&
              attn_backward_workspace_size(&dense, &k, &k, &dense, &dense, &lse, &dense, &k,
                                           &k, &opt, &b) == ATTN_OK,
              "backward workspace queries: %s", attn_last_error());
        CHECK(a == b, "backward over %lld keys: the views ask %zu bytes, dense %zu",
              (long long)lks[n], a, b);
    }
    free(x);
    free(kv);
}

int main(void) {
    /* the base case: a prefill of 600 rows (10 blocks of 64 rows) over 150 keys, GQA 2 */
    const dcase base = {.B = 2, .Hq = 4, .Hkv = 2, .Lq = 600, .Lk = 150, .D = 32,
                        .kv = ATTN_F32, .layout = 1, .threads = 2};
    char name[160];
    for (int layout = 1; layout <= 3; layout++) {
        for (int f = 0; f < 15; f++) {
            dcase c = base;
            c.layout = layout;
            const char *what = "plain";
            switch (f) {
            case 1: c.causal = true, what = "causal"; break;
            case 2:
                c.causal = c.bottom_right = true, c.Lq = 520, c.Lk = 600;
                what = "causal bottom-right, Lq 520, Lk 600";
                break;
            case 3: c.window = true, what = "window"; break;
            case 4: c.mask = true, what = "bool mask"; break;
            case 5: c.bias = c.weights = true, what = "float bias, weights"; break;
            case 6: c.kv_len = c.sinks = true, what = "key lengths, sinks"; break;
            case 7: c.kv = ATTN_BF16, c.causal = true, what = "bfloat16 causal"; break;
            case 8: c.kv = ATTN_FP8_E4M3, what = "fp8_e4m3 cache, scale"; break;
            case 9: c.threads = 1, c.Lk = 77, c.D = 80, what = "1 thread, Lk 77, D 80"; break;
            case 10: c.Hq = 8, c.Hkv = 1, c.Lq = 130, c.causal = true, what = "MQA, Lq 130"; break;
            case 11: c.Lq = 3, c.Lk = 2000, what = "Lq 3 (no copy)"; break;
            case 12: c.Lq = 70, c.Lk = 1100, what = "Lq 70, Lk 1100"; break;
            case 13:
                c.Lq = 90, c.Lk = 1300, c.causal = c.bottom_right = c.mask = c.sinks = true;
                what = "Lq 90, Lk 1300, causal bottom-right, mask, sinks";
                break;
            case 14:  // B * Hkv >= 16: one key chunk, dQ summed without partials where dense
                c.Hq = 16, c.Hkv = 8, c.Lq = 200, c.causal = true;
                what = "16 key/value heads (one chunk), causal";
                break;
            default: break;
            }
            snprintf(name, sizeof name, "layout %d, %s", layout, what);
            run_case(&c, name);
        }
    }
    workspace_rule();
    backward_workspace_rule();
    printf("(%d cases)\n", g_cases);
    return check_summary("test_dense_kv");
}
