/*
 * test_alias.c — outputs that share memory with an input, another output or the
 *                workspace are refused (ATTN_ERR_STRIDE, nothing written, the detail
 *                naming both); views of one buffer that share no byte are accepted and
 *                give the same bits as separate buffers.
 *
 * What it covers: the overlap test itself against a byte-by-byte count on random small
 * views (sizes, negative and zero strides, offsets, element sizes 1 to 8); forward O over
 * V, O over Q, LSE over O, weights over K, the mask, the bias, kv_len and the ALiBi slopes;
 * the workspace over O and over Q; backward dQ over Q, dK over dQ, dV over dO, dQ over
 * the LSE, a float16 dK over dV, the workspace over dK; and, accepted, Q/K/V and dQ/dK/dV
 * as the interleaved slices of one packed [B, L, 3, H, D] buffer, O in the free half of a
 * buffer holding V, O right after V in one allocation.
 * What it is not: an output overlapping itself (test_api.c).
 */
#include <stdlib.h>
#include <string.h>

#include "core/attn_internal.h"
#include "check.h"
#include "oracle.h"

/* ---- the test of two views against a byte count --------------------------------------- */

static int64_t esize(attn_dtype t) {
    return t == ATTN_F16 ? 2 : t == ATTN_BOOL ? 1 : t == ATTN_I64 ? 8 : 4;
}

/* marks (or, with mark = 0, looks for) every byte of t, relative to buf */
static bool touch(const attn_tensor *t, const char *buf, unsigned char *bytes, bool mark) {
    const int64_t *n = t->shape, *s = t->stride, es = esize(t->dtype);
    const int64_t base = (const char *)t->data - buf;
    for (int64_t a = 0; a < n[0]; a++)
        for (int64_t b = 0; b < n[1]; b++)
            for (int64_t c = 0; c < n[2]; c++)
                for (int64_t d = 0; d < n[3]; d++) {
                    const int64_t at = base + (a * s[0] + b * s[1] + c * s[2] + d * s[3]) * es;
                    for (int64_t x = at; x < at + es; x++) {
                        if (mark) bytes[x] = 1;
                        else if (bytes[x]) return true;
                    }
                }
    return false;
}

static attn_tensor random_view(rng_t *r, char *buf, int64_t room, int64_t pad) {
    static const attn_dtype dts[] = {ATTN_BOOL, ATTN_F16, ATTN_F32, ATTN_I64};
    attn_tensor t = {.dtype = dts[rng_int(r, 4)]};
    int64_t lo = 0, hi = 0;
    const int64_t es = esize(t.dtype);
    for (int d = 0; d < 4; d++) {
        t.shape[d] = 1 + rng_int(r, rng_int(r, 3) == 0 ? 1 : 4);
        t.stride[d] = rng_int(r, 4) == 0 ? 0 : rng_int(r, 25) - 12;
        const int64_t e = (t.shape[d] - 1) * t.stride[d];
        if (e < 0) lo += e; else hi += e;
    }
    if (rng_int(r, 10) == 0) t.shape[rng_int(r, 4)] = 0;  // empty now and then
    /* a base that keeps every byte within [pad, pad + room) */
    const int64_t span = (hi - lo) * es + es;
    const int64_t start = pad + (span < room ? rng_int(r, room - span + 1) : 0);
    t.data = buf + start - lo * es;
    return t;
}

static void views_against_bytes(void) {
    enum { ROOM = 160, PAD = 1300, CASES = 40000 };  // PAD: more than any span (4 x 36 x 8 B)
    static char buf[ROOM + 2 * PAD];
    static unsigned char bytes[ROOM + 2 * PAD];
    rng_t r = {2024};
    int64_t wrong = 0, meet = 0;
    for (int c = 0; c < CASES; c++) {
        /* the second view near the first, so that about half the pairs meet */
        attn_tensor a = random_view(&r, buf, ROOM / (1 + rng_int(&r, 3)), PAD);
        attn_tensor b = random_view(&r, buf, ROOM / (1 + rng_int(&r, 3)), PAD);
        memset(bytes, 0, sizeof bytes);
        touch(&a, buf, bytes, true);
        const bool truth = touch(&b, buf, bytes, false);
        const bool got = ai_views_overlap(&a, &b), got2 = ai_views_overlap(&b, &a);
        meet += truth;
        if (got != truth || got2 != truth) {
            if (wrong++ < 5)
                CHECK(0, "views %lldx%lldx%lldx%lld /%lld,%lld,%lld,%lld (%lld B) at %td and "
                      "%lldx%lldx%lldx%lld /%lld,%lld,%lld,%lld (%lld B) at %td: overlap %d, "
                      "the bytes say %d", (long long)a.shape[0], (long long)a.shape[1],
                      (long long)a.shape[2], (long long)a.shape[3], (long long)a.stride[0],
                      (long long)a.stride[1], (long long)a.stride[2], (long long)a.stride[3],
                      (long long)esize(a.dtype), (char *)a.data - buf, (long long)b.shape[0],
                      (long long)b.shape[1], (long long)b.shape[2], (long long)b.shape[3],
                      (long long)b.stride[0], (long long)b.stride[1], (long long)b.stride[2],
                      (long long)b.stride[3], (long long)esize(b.dtype), (char *)b.data - buf,
                      (int)got, (int)truth);
        }
    }
    CHECK(wrong == 0, "overlap test: %lld of %d random pairs decided wrongly", (long long)wrong,
          CASES);
    CHECK(meet > CASES / 5 && meet < CASES - CASES / 5, "random pairs: %lld of %d meet (the "
          "sample should hold both kinds)", (long long)meet, CASES);
    printf("alias: %d random view pairs against a byte count, %lld meet\n", CASES, (long long)meet);
}

/* ---- forward --------------------------------------------------------------------------- */

enum { B = 2, H = 2, L = 5, D = 4 };
#define N (B * H * L * D)

/* one float arena holding every tensor of a call at known places */
static float g_arena[16 * N];

static void fill(float *x, int64_t n, uint64_t seed) {
    rng_t r = {seed};
    for (int64_t i = 0; i < n; i++) x[i] = (float)rng_range(&r, -1, 1);
}

/* a call that must be refused: status, message, and no float of the arena changed */
static void expect_refused(attn_status st, const float *before, const char *what,
                           const char *name1, const char *name2) {
    CHECK(st == ATTN_ERR_STRIDE, "%s: status %d (%s), expected ATTN_ERR_STRIDE", what, (int)st,
          attn_status_string(st));
    CHECK(memcmp(before, g_arena, sizeof g_arena) == 0, "%s: the refused call wrote memory", what);
    const char *msg = attn_last_error();
    CHECK(strstr(msg, name1) && strstr(msg, name2) && strstr(msg, "overlap"),
          "%s: message \"%s\" does not name %s and %s", what, msg, name1, name2);
}

static void forward_refusals(void) {
    static float before[16 * N];
    float *q = g_arena, *k = q + N, *v = k + N, *o = v + N, *lse = o + N, *w = lse + N;
    fill(g_arena, 16 * N, 5);
    unsigned char *mask = (unsigned char *)(w + 4 * N);
    attn_tensor tq = attn_tensor_4d(q, ATTN_F32, B, H, L, D), tk = attn_tensor_4d(k, ATTN_F32, B, H, L, D);
    attn_tensor tv = attn_tensor_4d(v, ATTN_F32, B, H, L, D), to = attn_tensor_4d(o, ATTN_F32, B, H, L, D);
    attn_tensor tl = attn_tensor_4d(lse, ATTN_F32, B, H, L, 1);
    attn_tensor tw = attn_tensor_4d(w, ATTN_F32, B, H, L, L);
    for (int path = ATTN_PATH_FUSED; path <= ATTN_PATH_REFERENCE; path++) {
        attn_options opt = {.path = (attn_path)path, .lse = &tl, .weights = &tw};
        memset(mask, 1, (size_t)(B * L * L));
        memcpy(before, g_arena, sizeof g_arena);
        CHECK(attn_forward(&tq, &tk, &tv, &to, &opt) == ATTN_OK, "separate buffers: %s",
              attn_last_error());
        memcpy(before, g_arena, sizeof g_arena);

        attn_tensor x = to;
        x.data = v;
        expect_refused(attn_forward(&tq, &tk, &tv, &x, &opt), before, "o over v", "o", "v");
        x.data = q + 3;  // partly
        expect_refused(attn_forward(&tq, &tk, &tv, &x, &opt), before, "o over q, shifted", "o", "q");
        attn_tensor l2 = tl;
        l2.data = o + N - 1;  // its first element on o's last
        opt.lse = &l2;
        expect_refused(attn_forward(&tq, &tk, &tv, &to, &opt), before, "lse over o's last", "lse", "o");
        opt.lse = &tl;
        attn_tensor w2 = tw;
        w2.data = k + N / 2;
        opt.weights = &w2;
        expect_refused(attn_forward(&tq, &tk, &tv, &to, &opt), before, "weights over k", "weights", "k");
        opt.weights = &tw;

        attn_tensor tm = attn_tensor_4d(mask, ATTN_BOOL, B, 1, L, L);
        attn_tensor om = to;
        om.data = mask + 4;  // a float output over the bool mask's bytes
        opt.mask = &tm;
        expect_refused(attn_forward(&tq, &tk, &tv, &om, &opt), before, "o over the mask", "o", "mask");
        attn_tensor tb = attn_tensor_4d(w + 2 * N, ATTN_F32, 1, H, L, L);
        opt.bias = &tb;
        attn_tensor w3 = tw;
        w3.data = w + 2 * N + 10;
        opt.weights = &w3;
        expect_refused(attn_forward(&tq, &tk, &tv, &to, &opt), before, "weights over the bias",
                       "weights", "bias");
        opt.weights = &tw;
        opt.mask = NULL;
        opt.bias = NULL;
        static int64_t kvl[N];  // room for o's floats, should the call write them
        kvl[0] = L;
        kvl[1] = 3;
        attn_tensor tkvl = attn_tensor_4d(kvl, ATTN_I64, B, 1, 1, 1);
        attn_tensor ok = to;
        ok.data = kvl;
        opt.kv_len = &tkvl;
        memcpy(before, g_arena, sizeof g_arena);
        attn_status st = attn_forward(&tq, &tk, &tv, &ok, &opt);
        CHECK(st == ATTN_ERR_STRIDE && kvl[0] == L && kvl[1] == 3, "o over kv_len: status %d, "
              "kv_len %lld %lld", (int)st, (long long)kvl[0], (long long)kvl[1]);
        opt.kv_len = NULL;
        attn_tensor ta = attn_tensor_4d(lse + 1, ATTN_F32, H, 1, 1, 1);
        opt.alibi_slopes = &ta;
        expect_refused(attn_forward(&tq, &tk, &tv, &to, &opt), before, "lse over the ALiBi slopes",
                       "lse", "alibi");
        opt.alibi_slopes = NULL;

        size_t need = 0;
        CHECK(attn_forward_workspace_size(&tq, &tk, &tv, &to, &opt, &need) == ATTN_OK, "query");
        if (need > 0) {
            float *ws = malloc(need + 2 * N * sizeof(float));
            opt.workspace = ws;
            opt.workspace_bytes = need;
            attn_tensor ow = to;
            ow.data = ws + 8;  // o inside the workspace
            fill(ws, (int64_t)(need / sizeof(float)) + 2 * N, 9);
            st = attn_forward(&tq, &tk, &tv, &ow, &opt);
            CHECK(st == ATTN_ERR_STRIDE && strstr(attn_last_error(), "workspace"),
                  "o inside the workspace: status %d (%s)", (int)st, attn_last_error());
            attn_tensor qw = tq;
            qw.data = (char *)ws + need - 4;  // q's first element on the workspace's last
            st = attn_forward(&qw, &tk, &tv, &to, &opt);
            CHECK(st == ATTN_ERR_STRIDE && strstr(attn_last_error(), "workspace"),
                  "q on the workspace's last bytes: status %d (%s)", (int)st, attn_last_error());
            qw.data = (char *)ws + need;  // right after it: fine
            st = attn_forward(&qw, &tk, &tv, &to, &opt);
            CHECK(st == ATTN_OK, "q right after the workspace: status %d (%s)", (int)st,
                  attn_last_error());
            opt.workspace = NULL;
            opt.workspace_bytes = 0;
            free(ws);
        }
    }
}

/* [B, L, parts, H, D] packed, part p of it as a [B, H, L, D] view */
static attn_tensor packed(float *buf, attn_dtype dt, int parts, int part) {
    attn_tensor t = {(char *)buf + (int64_t)part * H * D * esize(dt), dt, {B, H, L, D},
                     {L * parts * H * D, D, parts * H * D, 1}};
    return t;
}

static void dense_copy(const attn_tensor *t, float *out) {
    for (int64_t a = 0; a < B; a++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < L; i++)
                for (int64_t d = 0; d < D; d++)
                    *out++ = ((const float *)t->data)[a * t->stride[0] + h * t->stride[1] +
                                                      i * t->stride[2] + d * t->stride[3]];
}

static void packed_accepted(void) {
    static float qkv[3 * N], dqkv[3 * N], ov[2 * N], o1[N], o2[N], d_o[N], lse[B * H * L];
    static float g1[3][N], g2[3][N], one[N + N];
    fill(qkv, 3 * N, 11);
    fill(d_o, N, 12);
    for (int path = ATTN_PATH_FUSED; path <= ATTN_PATH_REFERENCE; path++) {
        attn_options opt = {.path = (attn_path)path, .causal = true};
        attn_tensor tq = packed(qkv, ATTN_F32, 3, 0), tk = packed(qkv, ATTN_F32, 3, 1),
                    tv = packed(qkv, ATTN_F32, 3, 2);
        attn_tensor to1 = attn_tensor_4d(o1, ATTN_F32, B, H, L, D);
        CHECK(attn_forward(&tq, &tk, &tv, &to1, &opt) == ATTN_OK, "packed qkv: %s", attn_last_error());
        /* o in the second half of a buffer whose first half holds a copy of v */
        float vd[N];
        dense_copy(&tv, vd);
        fill(ov, 2 * N, 3);
        attn_tensor tv2 = packed(ov, ATTN_F32, 2, 0), to2 = packed(ov, ATTN_F32, 2, 1);
        for (int64_t a = 0; a < B; a++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < L; i++)
                    for (int64_t d = 0; d < D; d++)
                        ov[a * tv2.stride[0] + h * tv2.stride[1] + i * tv2.stride[2] + d] =
                            vd[((a * H + h) * L + i) * D + d];
        attn_status st = attn_forward(&tq, &tk, &tv2, &to2, &opt);
        dense_copy(&to2, o2);
        CHECK(st == ATTN_OK && memcmp(o1, o2, sizeof o1) == 0, "o interleaved with v in one "
              "buffer: status %d (%s), same bits %d", (int)st, attn_last_error(),
              memcmp(o1, o2, sizeof o1) == 0);
        /* shifted by one float, o meets v */
        attn_tensor to3 = to2;
        to3.data = (float *)to2.data - 1;
        CHECK(attn_forward(&tq, &tk, &tv2, &to3, &opt) == ATTN_ERR_STRIDE, "o interleaved with "
              "v, one float into it: accepted");
        /* o right after v in one allocation */
        memcpy(one, vd, sizeof vd);
        attn_tensor tv4 = attn_tensor_4d(one, ATTN_F32, B, H, L, D);
        attn_tensor to4 = attn_tensor_4d(one + N, ATTN_F32, B, H, L, D);
        st = attn_forward(&tq, &tk, &tv4, &to4, &opt);
        CHECK(st == ATTN_OK && memcmp(o1, one + N, sizeof o1) == 0, "o right after v: status "
              "%d (%s)", (int)st, attn_last_error());

        /* backward into separate buffers, then into one packed gradient */
        attn_tensor tl = attn_tensor_4d(lse, ATTN_F32, B, H, L, 1);
        attn_options fo = opt;
        fo.lse = &tl;
        CHECK(attn_forward(&tq, &tk, &tv, &to1, &fo) == ATTN_OK, "forward with lse");
        attn_tensor tdo = attn_tensor_4d(d_o, ATTN_F32, B, H, L, D);
        attn_tensor s0 = attn_tensor_4d(g1[0], ATTN_F32, B, H, L, D),
                    s1 = attn_tensor_4d(g1[1], ATTN_F32, B, H, L, D),
                    s2 = attn_tensor_4d(g1[2], ATTN_F32, B, H, L, D);
        CHECK(attn_backward(&tq, &tk, &tv, &to1, &tdo, &tl, &s0, &s1, &s2, &opt) == ATTN_OK,
              "backward, separate gradients: %s", attn_last_error());
        attn_tensor p0 = packed(dqkv, ATTN_F32, 3, 0), p1 = packed(dqkv, ATTN_F32, 3, 1),
                    p2 = packed(dqkv, ATTN_F32, 3, 2);
        st = attn_backward(&tq, &tk, &tv, &to1, &tdo, &tl, &p0, &p1, &p2, &opt);
        dense_copy(&p0, g2[0]); dense_copy(&p1, g2[1]); dense_copy(&p2, g2[2]);
        CHECK(st == ATTN_OK && memcmp(g1, g2, sizeof g1) == 0, "backward into one packed "
              "dqkv: status %d (%s), same bits %d", (int)st, attn_last_error(),
              memcmp(g1, g2, sizeof g1) == 0);
    }
}

/* ---- backward refusals ----------------------------------------------------------------- */

static void backward_refusals(void) {
    static float before[16 * N];
    float *q = g_arena, *k = q + N, *v = k + N, *o = v + N, *d_o = o + N, *lse = d_o + N;
    float *dq = lse + N, *dk = dq + N, *dv = dk + N;
    fill(g_arena, 16 * N, 7);
    attn_tensor tq = attn_tensor_4d(q, ATTN_F32, B, H, L, D), tk = attn_tensor_4d(k, ATTN_F32, B, H, L, D);
    attn_tensor tv = attn_tensor_4d(v, ATTN_F32, B, H, L, D), to = attn_tensor_4d(o, ATTN_F32, B, H, L, D);
    attn_tensor tdo = attn_tensor_4d(d_o, ATTN_F32, B, H, L, D);
    attn_tensor tl = attn_tensor_4d(lse, ATTN_F32, B, H, L, 1);
    attn_tensor tdq = attn_tensor_4d(dq, ATTN_F32, B, H, L, D), tdk = attn_tensor_4d(dk, ATTN_F32, B, H, L, D);
    attn_tensor tdv = attn_tensor_4d(dv, ATTN_F32, B, H, L, D);
    for (int path = ATTN_PATH_FUSED; path <= ATTN_PATH_REFERENCE; path++) {
        attn_options opt = {.path = (attn_path)path};
        attn_options fo = opt;
        fo.lse = &tl;
        CHECK(attn_forward(&tq, &tk, &tv, &to, &fo) == ATTN_OK, "forward");
        CHECK(attn_backward(&tq, &tk, &tv, &to, &tdo, &tl, &tdq, &tdk, &tdv, &opt) == ATTN_OK,
              "backward, separate buffers: %s", attn_last_error());
        memcpy(before, g_arena, sizeof g_arena);
        attn_tensor x = tdq;
        x.data = q;
        expect_refused(attn_backward(&tq, &tk, &tv, &to, &tdo, &tl, &x, &tdk, &tdv, &opt), before,
                       "dq over q", "dq", "q");
        x = tdk;
        x.data = dq + 7;
        expect_refused(attn_backward(&tq, &tk, &tv, &to, &tdo, &tl, &tdq, &x, &tdv, &opt), before,
                       "dk over dq", "dk", "dq");
        x = tdv;
        x.data = d_o;
        expect_refused(attn_backward(&tq, &tk, &tv, &to, &tdo, &tl, &tdq, &tdk, &x, &opt), before,
                       "dv over d_o", "dv", "d_o");
        x = tdq;
        x.data = lse + B * H * L - 1;
        expect_refused(attn_backward(&tq, &tk, &tv, &to, &tdo, &tl, &x, &tdk, &tdv, &opt), before,
                       "dq over lse's last", "dq", "lse");
        /* float16 gradients (the path through float32 copies) */
        attn_tensor h_dk = attn_tensor_4d(dk, ATTN_F16, B, H, L, D);
        attn_tensor h_dv = attn_tensor_4d((uint16_t *)dk + N - 1, ATTN_F16, B, H, L, D);
        expect_refused(attn_backward(&tq, &tk, &tv, &to, &tdo, &tl, &tdq, &h_dk, &h_dv, &opt),
                       before, "float16 dv over dk's last element", "dv", "dk");
        size_t need = 0;
        CHECK(attn_backward_workspace_size(&tq, &tk, &tv, &to, &tdo, &tl, &tdq, &tdk, &tdv, &opt,
                                           &need) == ATTN_OK, "backward query");
        if (need > 0) {
            char *ws = malloc(need);
            opt.workspace = ws;
            opt.workspace_bytes = need;
            attn_tensor in = tdk;
            in.data = ws + need / 2;
            attn_status st = attn_backward(&tq, &tk, &tv, &to, &tdo, &tl, &tdq, &in, &tdv, &opt);
            CHECK(st == ATTN_ERR_STRIDE && strstr(attn_last_error(), "workspace"),
                  "dk inside the workspace: status %d (%s)", (int)st, attn_last_error());
            free(ws);
        }
    }
}

/* ---- the multi-head module and attn_merge: the same rule for every output --------------- */

enum { ME = 4, ML = 2, MMAX = 8 };  // E = Hq·D (one head of D = 4), 2 tokens, Lmax 8

/* row-major [in, out] weight and {B, L, C, 1} activations at arena offsets */
static attn_tensor mat_at(int64_t at, int64_t in, int64_t out) {
    return (attn_tensor){g_arena + at, ATTN_F32, {in, out, 1, 1}, {out, 1, 0, 0}};
}
static attn_tensor rows_at(int64_t at, int64_t b, int64_t l, int64_t c) {
    return (attn_tensor){g_arena + at, ATTN_F32, {b, l, c, 1}, {l * c, c, 1, 1}};
}

static void module_refusals(void) {
    if (strcmp(attn_blas_name(), "none") == 0) {
        printf("alias: no BLAS, the module's cases skipped\n");
        return;
    }
    static float before[16 * N];
    /* arena: W_Q W_K W_V W_O at 0, 16, 32, 48; x at 64; y at 80; dy at 96; the cache's k
     * and v at 128 and 160 (8 rows of 4); gradients from 256 (16 each) */
    attn_tensor wq = mat_at(0, ME, ME), wk = mat_at(16, ME, ME), wv = mat_at(32, ME, ME),
                wo = mat_at(48, ME, ME);
    attn_mha m = {.Hq = 1, .w_q = &wq, .w_k = &wk, .w_v = &wv, .w_o = &wo};
    attn_tensor x = rows_at(64, 1, ML, ME), y = rows_at(80, 1, ML, ME), dy = rows_at(96, 1, ML, ME);
    fill(g_arena, 16 * N, 41);
    CHECK(attn_mha_forward(&m, &x, NULL, &y, NULL, false, NULL) == ATTN_OK,
          "module forward, separate buffers: %s", attn_last_error());
    attn_tensor yw = rows_at(48 + 4, 1, ML, ME);  // y over W_O's last three rows
    memcpy(before, g_arena, sizeof g_arena);
    expect_refused(attn_mha_forward(&m, &x, NULL, &yw, NULL, false, NULL), before,
                   "module y over W_O", "y", "w_o");
    attn_tensor yx = rows_at(64 + 2, 1, ML, ME);  // y over x, shifted
    expect_refused(attn_mha_forward(&m, &x, NULL, &yx, NULL, false, NULL), before,
                   "module y over x_q", "y", "x_q");
    attn_tensor wts = {g_arena + 60, ATTN_F32, {1, 1, ML, ML}, {ML * ML, ML * ML, ML, 1}};
    expect_refused(attn_mha_forward(&m, &x, NULL, &y, &wts, false, NULL), before,
                   "module weights over W_O", "weights", "w_o");
    /* the saved buffer of forward_save over x */
    size_t sb = 0;
    CHECK(attn_mha_saved_size(&m, &x, NULL, &sb) == ATTN_OK && sb <= 64 * sizeof(float) * 8,
          "module saved size %zu", sb);
    expect_refused(attn_mha_forward_save(&m, &x, NULL, &y, NULL, false, NULL, g_arena + 64, sb),
                   before, "module saved over x_q", "saved", "x_q");

    /* backward: gradients over inputs and over each other */
    attn_tensor g0 = mat_at(256, ME, ME), g1 = mat_at(272, ME, ME);
    attn_mha_grads gr = {.dw_q = &g0, .dw_o = &g1};
    CHECK(attn_mha_backward(&m, &x, NULL, &dy, &gr, NULL) == ATTN_OK,
          "module backward, separate buffers: %s", attn_last_error());
    memcpy(before, g_arena, sizeof g_arena);
    attn_tensor gx = mat_at(64, ME, ME);  // dW_O over x and y
    gr = (attn_mha_grads){.dw_o = &gx};
    expect_refused(attn_mha_backward(&m, &x, NULL, &dy, &gr, NULL), before,
                   "module dw_o over x_q", "dw_o", "x_q");
    attn_tensor dxq = rows_at(96 + 1, 1, ML, ME);
    gr = (attn_mha_grads){.dx_q = &dxq};
    expect_refused(attn_mha_backward(&m, &x, NULL, &dy, &gr, NULL), before,
                   "module dx_q over dy", "dx_q", "dy");
    attn_tensor gq = mat_at(256 + 8, ME, ME);
    gr = (attn_mha_grads){.dw_q = &g0, .dw_k = &gq};
    expect_refused(attn_mha_backward(&m, &x, NULL, &dy, &gr, NULL), before,
                   "module dw_k over dw_q", "dw_k", "dw_q");

    /* decoding: y, x or W_K inside the cache (which the step writes) */
    int64_t len[1] = {0};
    attn_kv_cache c = {.kind = ATTN_CACHE_CONTIGUOUS,
                       .k = attn_tensor_4d(g_arena + 128, ATTN_F32, 1, 1, MMAX, ME),
                       .v = attn_tensor_4d(g_arena + 160, ATTN_F32, 1, 1, MMAX, ME), .len = len};
    CHECK(attn_mha_decode(&m, &x, &c, &y, NULL) == ATTN_OK && len[0] == ML,
          "module decode, separate buffers: %s", attn_last_error());
    memcpy(before, g_arena, sizeof g_arena);
    attn_tensor yc = rows_at(128 + 4 * (MMAX - 2), 1, ML, ME);  // y in the cache's last rows
    expect_refused(attn_mha_decode(&m, &x, &c, &yc, NULL), before, "decode y in cache.k",
                   "y", "cache.k");
    attn_tensor xc = rows_at(160 + 4 * (MMAX - 2), 1, ML, ME);
    expect_refused(attn_mha_decode(&m, &xc, &c, &y, NULL), before, "decode x in cache.v",
                   "cache.v", "x_q");
    attn_tensor wkc = mat_at(128 + 4 * (MMAX - 4), ME, ME);
    attn_mha m2 = m;
    m2.w_k = &wkc;
    expect_refused(attn_mha_decode(&m2, &x, &c, &y, NULL), before, "decode w_k in cache.k",
                   "cache.k", "w_k");
    CHECK(len[0] == ML, "decode: len %lld after refusals, expected %d", (long long)len[0], ML);

    /* attn_merge: o and lse share no byte with a partial unless they are it */
    attn_tensor op[2] = {attn_tensor_4d(g_arena + 400, ATTN_F32, 1, 1, 4, 4),
                         attn_tensor_4d(g_arena + 416, ATTN_F32, 1, 1, 4, 4)};
    attn_tensor lp[2] = {attn_tensor_4d(g_arena + 432, ATTN_F32, 1, 1, 4, 1),
                         attn_tensor_4d(g_arena + 436, ATTN_F32, 1, 1, 4, 1)};
    attn_tensor mo = attn_tensor_4d(g_arena + 440, ATTN_F32, 1, 1, 4, 4);
    attn_tensor ml = attn_tensor_4d(g_arena + 456, ATTN_F32, 1, 1, 4, 1);
    CHECK(attn_merge(2, op, lp, &mo, &ml, 1) == ATTN_OK, "merge: %s", attn_last_error());
    CHECK(attn_merge(2, op, lp, &op[0], &lp[1], 1) == ATTN_OK, "merge in place: %s",
          attn_last_error());
    memcpy(before, g_arena, sizeof g_arena);
    attn_tensor o_sh = attn_tensor_4d(g_arena + 402, ATTN_F32, 1, 1, 4, 4);
    expect_refused(attn_merge(2, op, lp, &o_sh, &ml, 1), before, "merge o over o_parts shifted",
                   "o", "o_parts");
    attn_tensor o_l = attn_tensor_4d(g_arena + 430, ATTN_F32, 1, 1, 4, 4);
    expect_refused(attn_merge(2, op, lp, &o_l, &ml, 1), before, "merge o over lse_parts",
                   "o", "lse_parts");
    attn_tensor l_o = attn_tensor_4d(g_arena + 442, ATTN_F32, 1, 1, 4, 1);
    expect_refused(attn_merge(2, op, lp, &mo, &l_o, 1), before, "merge lse over o", "lse", "o");
}

/* ---- the other calls that write: additive and Luong attention, the weights grid, tanh -- */

static void other_refusals(void) {
    static float before[16 * N];
    enum { AB = 1, AL = 3, AD = 4, AA = 5 };  // q, k, v [1, 1, 3, 4]; A = 5 units
    fill(g_arena, 16 * N, 43);
    /* q k v o at 0, 12, 24, 36; W U at 48, 68; v b at 88, 93; lse 100; d_o 104; dq dk dv
     * 116 128 140; dW dU dv db 160 180 200 205 */
    attn_tensor q = attn_tensor_4d(g_arena, ATTN_F32, AB, 1, AL, AD);
    attn_tensor k = attn_tensor_4d(g_arena + 12, ATTN_F32, AB, 1, AL, AD);
    attn_tensor v = attn_tensor_4d(g_arena + 24, ATTN_F32, AB, 1, AL, AD);
    attn_tensor o = attn_tensor_4d(g_arena + 36, ATTN_F32, AB, 1, AL, AD);
    attn_additive_weights w = {.units = AA, .w_query = g_arena + 48, .w_key = g_arena + 68,
                               .v = g_arena + 88, .bias = g_arena + 93};
    const bool blas = strcmp(attn_blas_name(), "none") != 0;
    attn_options ref = {.path = ATTN_PATH_REFERENCE};
    CHECK(attn_additive_forward(&q, &k, &v, &w, &o, &ref) == ATTN_OK, "additive: %s",
          attn_last_error());
    memcpy(before, g_arena, sizeof g_arena);
    attn_tensor ow = attn_tensor_4d(g_arena + 60, ATTN_F32, AB, 1, AL, AD);  // o over W, U
    expect_refused(attn_additive_forward(&q, &k, &v, &w, &ow, &ref), before,
                   "additive o over w_query", "o", "w_query");
    attn_tensor ov = attn_tensor_4d(g_arena + 90, ATTN_F32, AB, 1, 1, 2);  // a 1-row o over v
    attn_tensor q1 = q, v1 = v;
    q1.shape[2] = 1;
    v1.shape[3] = 2;
    expect_refused(attn_additive_forward(&q1, &k, &v1, &w, &ov, &ref), before,
                   "additive o over weights.v", "o", "weights.v");
    /* the backward: dU over k, dq over d_o */
    attn_tensor lse = attn_tensor_4d(g_arena + 100, ATTN_F32, AB, 1, AL, 1);
    attn_tensor d_o = attn_tensor_4d(g_arena + 104, ATTN_F32, AB, 1, AL, AD);
    attn_tensor dq = attn_tensor_4d(g_arena + 116, ATTN_F32, AB, 1, AL, AD);
    attn_tensor dk = attn_tensor_4d(g_arena + 128, ATTN_F32, AB, 1, AL, AD);
    attn_tensor dv = attn_tensor_4d(g_arena + 140, ATTN_F32, AB, 1, AL, AD);
    attn_additive_grads gr = {.d_w_query = g_arena + 160, .d_w_key = g_arena + 180,
                              .d_v = g_arena + 200, .d_bias = g_arena + 205};
    ref.lse = &lse;
    CHECK(attn_additive_forward(&q, &k, &v, &w, &o, &ref) == ATTN_OK, "additive lse: %s",
          attn_last_error());
    ref.lse = NULL;
    CHECK(attn_additive_backward(&q, &k, &v, &w, &o, &d_o, &lse, &dq, &dk, &dv, &gr, &ref) ==
          ATTN_OK, "additive backward: %s", attn_last_error());
    memcpy(before, g_arena, sizeof g_arena);
    attn_additive_grads gk = gr;
    gk.d_w_key = g_arena + 14;
    expect_refused(attn_additive_backward(&q, &k, &v, &w, &o, &d_o, &lse, &dq, &dk, &dv, &gk,
                                          &ref), before, "additive d_w_key over k", "d_w_key",
                   "k");
    gk = gr;
    gk.d_bias = g_arena + 130;
    expect_refused(attn_additive_backward(&q, &k, &v, &w, &o, &d_o, &lse, &dq, &dk, &dv, &gk,
                                          &ref), before, "additive d_bias over dk", "d_bias",
                   "dk");
    attn_tensor dqo = attn_tensor_4d(g_arena + 106, ATTN_F32, AB, 1, AL, AD);
    expect_refused(attn_additive_backward(&q, &k, &v, &w, &o, &d_o, &lse, &dqo, &dk, &dv, &gr,
                                          &ref), before, "additive dq over d_o", "dq", "d_o");

    /* Luong general: o over q or over W (read through a projection attn_forward never sees) */
    if (blas) {
        const float *wl = g_arena + 48;  // W [Dq = 4, Dk = 4]
        CHECK(attn_luong_general_forward(&q, &k, &v, wl, &o, NULL) == ATTN_OK, "luong: %s",
              attn_last_error());
        memcpy(before, g_arena, sizeof g_arena);
        attn_tensor oq = attn_tensor_4d(g_arena + 1, ATTN_F32, AB, 1, 1, AD);  // q1's row
        expect_refused(attn_luong_general_forward(&q1, &k, &v, wl, &oq, NULL), before,
                       "luong o over q", "o", "q");
        attn_tensor olw = attn_tensor_4d(g_arena + 50, ATTN_F32, AB, 1, AL, AD);
        expect_refused(attn_luong_general_forward(&q, &k, &v, wl, &olw, NULL), before,
                       "luong o over w", "o", "w");
    }

    /* the weights grid over the LSE */
    attn_tensor grid = attn_tensor_4d(g_arena + 300, ATTN_F32, AB, 1, AL, AL);
    attn_tensor lse4 = attn_tensor_4d(g_arena + 100, ATTN_F32, AB, 1, AL, 1);
    attn_tensor q4 = attn_tensor_4d(g_arena, ATTN_F32, AB, 1, AL, AD);
    CHECK(attn_weights_grid(&q4, &k, &lse4, &grid, ATTN_REDUCE_SUM, NULL) == ATTN_OK,
          "grid: %s", attn_last_error());
    memcpy(before, g_arena, sizeof g_arena);
    attn_tensor gl = attn_tensor_4d(g_arena + 98, ATTN_F32, AB, 1, AL, AL);
    expect_refused(attn_weights_grid(&q4, &k, &lse4, &gl, ATTN_REDUCE_SUM, NULL), before,
                   "grid over lse", "grid", "lse");

    /* tanh: y = x in place is fine, y one float past x is not */
    CHECK(attn_additive_tanh(8, g_arena + 400, g_arena + 400) == ATTN_OK, "tanh in place: %s",
          attn_last_error());
    memcpy(before, g_arena, sizeof g_arena);
    expect_refused(attn_additive_tanh(8, g_arena + 400, g_arena + 401), before,
                   "tanh y one float past x", "y", "x");
}

int main(void) {
    views_against_bytes();
    forward_refusals();
    packed_accepted();
    backward_refusals();
    module_refusals();
    other_refusals();
    return check_summary("alias");
}
