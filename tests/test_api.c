/*
 * test_api.c — every misuse of the public API returns its own status code, leaves every
 *              output untouched, and explains itself in attn_last_error().
 *
 * What it covers: NULL tensors and NULL data, dtypes, shape disagreements, negative
 * sizes, head counts, mask/bias shapes that do not broadcast, output strides that would
 * write an element twice, option values (scale, softcap, window, kv_len entries,
 * threads, enums), int64 overflow of sizes and offsets, workspace size and use,
 * attn_forward_workspace_size's own NULL, the status strings, attn_last_error (set on
 * failure, "" after success, per thread), attn_version, attn_kernel_name and
 * attn_kernel_list, attn_huge_pages.
 * Each failing call is made with a sentinel in o, lse and weights, which must survive.
 * The status of the workspace query is checked to agree for the argument errors.
 * What it is not: a test of the numbers (test_forward.c, test_edge.c).
 */
#include <ctype.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "attn.h"
#include "check.h"
#include "oracle.h"

/* The valid call every test starts from and breaks one thing of. */
enum { B = 2, HQ = 4, HKV = 2, LQ = 3, LK = 5, DK = 4, DV = 6 };

typedef struct fx {
    float q[B * HQ * LQ * DK], k[B * HKV * LK * DK], v[B * HKV * LK * DV];
    float o[B * HQ * LQ * DV], lse[B * HQ * LQ], w[B * HQ * LQ * LK];
    unsigned char mask[B * LQ * LK]; /* [B, 1, Lq, Lk] */
    float bias[HQ * LQ * LK];        /* [1, Hq, Lq, Lk] */
    int64_t kvl[B];
    float slopes[HQ];
    attn_tensor tq, tk, tv, to, tmask, tbias, tkvl, talibi, tlse, tw;
    attn_options opt;
} fx;

static void fx_init(fx *f) {
    memset(f, 0, sizeof *f);
    rng_t r = {99};
    for (size_t i = 0; i < sizeof f->q / 4; i++) f->q[i] = (float)rng_range(&r, -1, 1);
    for (size_t i = 0; i < sizeof f->k / 4; i++) f->k[i] = (float)rng_range(&r, -1, 1);
    for (size_t i = 0; i < sizeof f->v / 4; i++) f->v[i] = (float)rng_range(&r, -1, 1);
    for (size_t i = 0; i < sizeof f->mask; i++) f->mask[i] = (unsigned char)(i % 7 != 3);
    for (size_t i = 0; i < sizeof f->bias / 4; i++) f->bias[i] = (float)rng_range(&r, -1, 1);
    f->kvl[0] = LK; f->kvl[1] = 3;
    for (int h = 0; h < HQ; h++) f->slopes[h] = 0.5f / (float)(h + 1);
    f->tq = attn_tensor_4d(f->q, ATTN_F32, B, HQ, LQ, DK);
    f->tk = attn_tensor_4d(f->k, ATTN_F32, B, HKV, LK, DK);
    f->tv = attn_tensor_4d(f->v, ATTN_F32, B, HKV, LK, DV);
    f->to = attn_tensor_4d(f->o, ATTN_F32, B, HQ, LQ, DV);
    f->tmask = attn_tensor_4d(f->mask, ATTN_BOOL, B, 1, LQ, LK);
    f->tbias = attn_tensor_4d(f->bias, ATTN_F32, 1, HQ, LQ, LK);
    f->tkvl = attn_tensor_4d(f->kvl, ATTN_I64, B, 1, 1, 1);
    f->talibi = attn_tensor_4d(f->slopes, ATTN_F32, HQ, 1, 1, 1);
    f->tlse = attn_tensor_4d(f->lse, ATTN_F32, B, HQ, LQ, 1);
    f->tw = attn_tensor_4d(f->w, ATTN_F32, B, HQ, LQ, LK);
    f->opt.mask = &f->tmask;
    f->opt.bias = &f->tbias;
    f->opt.kv_len = &f->tkvl;
    f->opt.alibi_slopes = &f->talibi;
    f->opt.lse = &f->tlse;
    f->opt.weights = &f->tw;
    f->opt.causal = true;
    f->opt.align = ATTN_ALIGN_BOTTOM_RIGHT;
}

static void fx_sentinel(fx *f) {
    fill_sentinel(f->o, (int64_t)(sizeof f->o / 4));
    fill_sentinel(f->lse, (int64_t)(sizeof f->lse / 4));
    fill_sentinel(f->w, (int64_t)(sizeof f->w / 4));
}
static int64_t fx_written(const fx *f) {
    return count_written(f->o, (int64_t)(sizeof f->o / 4)) +
           count_written(f->lse, (int64_t)(sizeof f->lse / 4)) +
           count_written(f->w, (int64_t)(sizeof f->w / 4));
}

/* Does msg mention one of the '|'-separated words (case-insensitive)? */
static int mentions(const char *msg, const char *words) {
    char lower[600];
    size_t n = 0;
    for (; msg[n] && n + 1 < sizeof lower; n++) lower[n] = (char)tolower((unsigned char)msg[n]);
    lower[n] = 0;
    char w[64];
    while (*words) {
        size_t m = strcspn(words, "|");
        if (m >= sizeof w) m = sizeof w - 1;
        for (size_t i = 0; i < m; i++) w[i] = (char)tolower((unsigned char)words[i]);
        w[m] = 0;
        if (m && strstr(lower, w)) return 1;
        words += m;
        if (*words == '|') words++;
    }
    return 0;
}

/* Call attn_forward with these arguments; want is the expected status (want2 a second
 * acceptable one, or -1). On failure: outputs untouched, a message naming one of
 * `names`, and the workspace query agreeing (unless `data_error`: errors that only the
 * data can show — NULL data, kv_len entries — which the query does not read). */
static void expect(fx *f, const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                   const attn_tensor *o, const attn_options *opt, attn_status want, int want2,
                   const char *names, int data_error, const char *what) {
    fx_sentinel(f);
    attn_status st = attn_forward(q, k, v, o, opt);
    int ok = st == want || (want2 >= 0 && st == (attn_status)want2);
    CHECK(ok, "%s: status %d (%s), expected %d (%s)%s [%s]", what, (int)st, attn_status_string(st),
          (int)want, attn_status_string(want), want2 >= 0 ? " or the other one documented" : "",
          attn_last_error());
    if (want == ATTN_OK) {
        CHECK(attn_last_error()[0] == 0, "%s: last_error \"%s\" after success", what, attn_last_error());
        return;
    }
    if (st == ATTN_OK) return; /* the one failure above says it all */
    int64_t written = fx_written(f);
    CHECK(written == 0, "%s: the failing call wrote %lld output floats", what, (long long)written);
    const char *msg = attn_last_error();
    CHECK(msg && msg[0], "%s: attn_last_error() is empty after a failure", what);
    if (msg && names) CHECK(mentions(msg, names), "%s: message \"%s\" names none of %s", what, msg, names);
    if (!data_error) {
        size_t bytes = 12345;
        attn_status ws = attn_forward_workspace_size(q, k, v, o, opt, &bytes);
        CHECK(ws == st, "%s: workspace query says %d, attn_forward %d", what, (int)ws, (int)st);
        CHECK(bytes == 12345, "%s: failing workspace query wrote *bytes", what);
    }
}

/* the fixture's own call, with its options */
#define EXPECT(f, want, names, what) \
    expect((f), &(f)->tq, &(f)->tk, &(f)->tv, &(f)->to, &(f)->opt, (want), -1, (names), 0, (what))
#define EXPECT_DATA(f, want, names, what) \
    expect((f), &(f)->tq, &(f)->tk, &(f)->tv, &(f)->to, &(f)->opt, (want), -1, (names), 1, (what))

static fx g_f; /* one fixture, re-initialized per test (large-ish, kept off the stack) */

static fx *fresh(void) {
    fx_init(&g_f);
    return &g_f;
}

static attn_tensor *tensor_of(fx *f, int which) {
    attn_tensor *ts[10] = {&f->tq, &f->tk, &f->tv, &f->to, &f->tmask,
                           &f->tbias, &f->tkvl, &f->talibi, &f->tlse, &f->tw};
    return ts[which];
}
static const char *const k_tnames[10] = {"q", "k", "v", "o", "mask", "bias", "kv_len", "alibi", "lse", "weights"};

/* ---- the valid call ---------------------------------------------------------------- */

static void valid_call(void) {
    fx *f = fresh();
    EXPECT(f, ATTN_OK, NULL, "the valid fixture");
    int64_t want = (int64_t)(sizeof f->o / 4 + sizeof f->lse / 4 + sizeof f->w / 4);
    CHECK(fx_written(f) == want, "valid call: wrote %lld of %lld output floats", (long long)fx_written(f), (long long)want);
    /* and it is right: the oracle agrees */
    double o_ref[B * HQ * LQ * DV], l_ref[B * HQ * LQ];
    oracle_forward(&f->tq, &f->tk, &f->tv, &f->opt, o_ref, l_ref, NULL);
    double mag[B * HQ * LQ];
    oracle_logit_mag(&f->tq, &f->tk, &f->opt, mag);
    CHECK(within_f32_tol(f->o, o_ref, B * HQ * LQ * DV, NULL) &&
              within_lse_tol(f->lse, l_ref, mag, B * HQ * LQ, f->tq.shape[3], f->tk.shape[2], NULL),
          "valid call: result differs from the oracle");
    /* NULL options = defaults */
    fx_sentinel(f);
    CHECK(attn_forward(&f->tq, &f->tk, &f->tv, &f->to, NULL) == ATTN_OK, "NULL options: not OK");
    CHECK(count_written(f->o, B * HQ * LQ * DV) == B * HQ * LQ * DV && count_written(f->lse, B * HQ * LQ) == 0,
          "NULL options: wrote the wrong outputs");
    size_t bytes = 0;
    CHECK(attn_forward_workspace_size(&f->tq, &f->tk, &f->tv, &f->to, &f->opt, &bytes) == ATTN_OK,
          "workspace query on the valid fixture failed");
    CHECK(attn_forward_workspace_size(&f->tq, &f->tk, &f->tv, &f->to, NULL, &bytes) == ATTN_OK,
          "workspace query with NULL options failed");
}

/* ---- NULL ------------------------------------------------------------------------- */

static void nulls(void) {
    fx *f = fresh();
    expect(f, NULL, &f->tk, &f->tv, &f->to, &f->opt, ATTN_ERR_NULL, -1, "q", 0, "NULL q");
    expect(f, &f->tq, NULL, &f->tv, &f->to, &f->opt, ATTN_ERR_NULL, -1, "k", 0, "NULL k");
    expect(f, &f->tq, &f->tk, NULL, &f->to, &f->opt, ATTN_ERR_NULL, -1, "v", 0, "NULL v");
    expect(f, &f->tq, &f->tk, &f->tv, NULL, &f->opt, ATTN_ERR_NULL, -1, "o", 0, "NULL o");
    /* NULL data with elements, for every tensor */
    for (int t = 0; t < 10; t++) {
        f = fresh();
        tensor_of(f, t)->data = NULL;
        char what[64];
        snprintf(what, sizeof what, "NULL data in %s", k_tnames[t]);
        EXPECT_DATA(f, ATTN_ERR_NULL, k_tnames[t], what);
    }
    /* workspace_size with a NULL result pointer */
    f = fresh();
    CHECK(attn_forward_workspace_size(&f->tq, &f->tk, &f->tv, &f->to, &f->opt, NULL) == ATTN_ERR_NULL,
          "workspace_size(bytes = NULL) is not ATTN_ERR_NULL");
    CHECK(attn_last_error()[0] != 0, "workspace_size(bytes = NULL): no message");
    /* the query does not read data: NULL data is fine there */
    f = fresh();
    f->tq.data = f->tk.data = f->tv.data = f->to.data = NULL;
    size_t bytes;
    CHECK(attn_forward_workspace_size(&f->tq, &f->tk, &f->tv, &f->to, NULL, &bytes) == ATTN_OK,
          "workspace_size with NULL data pointers is not OK (the header says they are not read)");
}

/* ---- dtypes ------------------------------------------------------------------------- */

static void dtypes(void) {
    /* float16 and bfloat16 are legal for q, k, v and o, with k and v of one dtype: q or
     * o alone in 16 bits is a valid call; k or v alone is a k/v mismatch (DTYPE, the
     * message naming the one changed). Any other type (bool, int, an out-of-range enum)
     * is DTYPE everywhere. */
    const attn_dtype half[2] = {ATTN_F16, ATTN_BF16};
    const int bad[4] = {ATTN_BOOL, ATTN_I32, ATTN_I64, 99};
    char what[96];
    for (int t = 0; t < 4; t++) { /* q, k, v, o */
        for (int i = 0; i < 2; i++) {
            fx *f = fresh();
            tensor_of(f, t)->dtype = half[i];
            snprintf(what, sizeof what, "%s dtype %d (half)", k_tnames[t], (int)half[i]);
            if (t == 0 || t == 3) {
                EXPECT(f, ATTN_OK, NULL, what);
            } else {
                EXPECT(f, ATTN_ERR_DTYPE, k_tnames[t], what);
            }
        }
        for (int i = 0; i < 4; i++) {
            fx *f = fresh();
            tensor_of(f, t)->dtype = (attn_dtype)bad[i];
            snprintf(what, sizeof what, "%s dtype %d", k_tnames[t], bad[i]);
            EXPECT(f, ATTN_ERR_DTYPE, k_tnames[t], what);
        }
    }
    /* mask must be BOOL, bias F32, kv_len I32/I64, alibi F32, lse and weights F32 */
    struct { int t; int dtype; } cases[] = {
        {4, ATTN_F32}, {4, ATTN_I32}, {4, ATTN_I64}, {4, -1},
        {5, ATTN_BOOL}, {5, ATTN_I32}, {5, ATTN_F16},
        {6, ATTN_F32}, {6, ATTN_BOOL}, {6, ATTN_F16},
        {7, ATTN_I32}, {7, ATTN_BOOL},
        {8, ATTN_I32}, {8, ATTN_F16}, {9, ATTN_I64}, {9, ATTN_BF16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fx *f = fresh();
        tensor_of(f, cases[i].t)->dtype = (attn_dtype)cases[i].dtype;
        snprintf(what, sizeof what, "%s dtype %d", k_tnames[cases[i].t], cases[i].dtype);
        int half_out = cases[i].dtype == ATTN_F16 || cases[i].dtype == ATTN_BF16;
        expect(f, &f->tq, &f->tk, &f->tv, &f->to, &f->opt, ATTN_ERR_DTYPE,
               half_out ? ATTN_ERR_UNSUPPORTED : -1, k_tnames[cases[i].t], 0, what);
    }
    /* k and v both 16-bit: legal */
    for (int i = 0; i < 2; i++) {
        fx *f = fresh();
        f->tk.dtype = f->tv.dtype = half[i];
        snprintf(what, sizeof what, "k and v dtype %d (half)", (int)half[i]);
        EXPECT(f, ATTN_OK, NULL, what);
    }
    /* kv_len as I32 is legal */
    fx *f = fresh();
    int32_t l32[B] = {LK, 2};
    f->tkvl = attn_tensor_4d(l32, ATTN_I32, B, 1, 1, 1);
    EXPECT(f, ATTN_OK, NULL, "kv_len as int32");
}

/* ---- shapes -------------------------------------------------------------------------- */

static void shapes(void) {
    /* one dimension of one tensor changed (data stays big enough for the checks) */
    struct { int t, d; int64_t val; attn_status want; const char *names; const char *what; } cases[] = {
        {1, 3, DK + 1, ATTN_ERR_SHAPE, "k|Dk", "Dk of k differs from q"},
        {0, 3, DK - 1, ATTN_ERR_SHAPE, "k|Dk|q", "Dk of q differs from k"},
        {2, 2, LK - 1, ATTN_ERR_SHAPE, "v|Lk", "Lk of v differs from k"},
        {1, 2, LK - 1, ATTN_ERR_SHAPE, "v|k|Lk", "Lk of k differs from v"},
        {1, 0, 1, ATTN_ERR_SHAPE, "k|B|batch", "batch of k differs from q"},
        {2, 0, 1, ATTN_ERR_SHAPE, "v|B|batch", "batch of v differs from q"},
        {2, 1, 1, ATTN_ERR_SHAPE, "v|Hkv|head", "heads of v differ from k"},
        {3, 0, 1, ATTN_ERR_SHAPE, "o|B", "o batch"},
        {3, 1, HQ - 1, ATTN_ERR_SHAPE, "o|Hq", "o heads"},
        {3, 2, LQ - 1, ATTN_ERR_SHAPE, "o|Lq", "o rows"},
        {3, 3, DV - 1, ATTN_ERR_SHAPE, "o|Dv", "o width"},
        {8, 0, 1, ATTN_ERR_SHAPE, "lse", "lse batch"},
        {8, 1, 1, ATTN_ERR_SHAPE, "lse", "lse heads"},
        {8, 2, 2, ATTN_ERR_SHAPE, "lse", "lse rows"},
        {8, 3, 2, ATTN_ERR_SHAPE, "lse", "lse last dim 2"},
        {9, 0, 1, ATTN_ERR_SHAPE, "weights", "weights batch"},
        {9, 1, 2, ATTN_ERR_SHAPE, "weights", "weights heads"},
        {9, 2, 2, ATTN_ERR_SHAPE, "weights", "weights rows"},
        {9, 3, LK - 1, ATTN_ERR_SHAPE, "weights", "weights keys"},
        {6, 0, 1, ATTN_ERR_SHAPE, "kv_len", "kv_len with 1 entry for 2 batches"},
        {6, 1, 2, ATTN_ERR_SHAPE, "kv_len", "kv_len [B, 2, 1, 1]"},
        {7, 0, HKV, ATTN_ERR_SHAPE, "alibi", "alibi slopes per kv head, not per query head"},
        {7, 1, 2, ATTN_ERR_SHAPE, "alibi", "alibi [Hq, 2, 1, 1]"},
        /* masks that do not broadcast: a dimension neither 1 nor the score's */
        {4, 0, 3, ATTN_ERR_MASK, "mask", "mask batch 3 (B = 2)"},
        {4, 1, 2, ATTN_ERR_MASK, "mask", "mask heads 2 (Hq = 4)"},
        {4, 2, 2, ATTN_ERR_MASK, "mask", "mask rows 2 (Lq = 3)"},
        {4, 3, LK + 1, ATTN_ERR_MASK, "mask", "mask keys Lk + 1"},
        {4, 3, LK - 1, ATTN_ERR_MASK, "mask", "mask keys Lk - 1"},
        {5, 0, 3, ATTN_ERR_MASK, "bias", "bias batch 3"},
        {5, 1, HKV, ATTN_ERR_MASK, "bias", "bias heads Hkv (Hq = 4)"},
        {5, 2, LQ + 1, ATTN_ERR_MASK, "bias", "bias rows Lq + 1"},
        {5, 3, 2, ATTN_ERR_MASK, "bias", "bias keys 2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fx *f = fresh();
        tensor_of(f, cases[i].t)->shape[cases[i].d] = cases[i].val;
        EXPECT(f, cases[i].want, cases[i].names, cases[i].what);
    }
    /* negative sizes, every dimension of every tensor */
    char what[64];
    for (int t = 0; t < 10; t++)
        for (int d = 0; d < 4; d++) {
            fx *f = fresh();
            tensor_of(f, t)->shape[d] = -1 - d;
            snprintf(what, sizeof what, "%s shape[%d] negative", k_tnames[t], d);
            EXPECT(f, ATTN_ERR_SHAPE, k_tnames[t], what);
        }
}

/* ---- heads ------------------------------------------------------------------------ */

static void heads(void) {
    float kbig[B * 8 * LK * DK], vbig[B * 8 * LK * DV];
    memset(kbig, 0, sizeof kbig);
    memset(vbig, 0, sizeof vbig);
    const int64_t hkvs[3] = {3, 8, 0}; /* 4 % 3, Hkv > Hq, Hkv = 0 with Hq = 4 */
    for (int i = 0; i < 3; i++) {
        fx *f = fresh();
        f->tk = attn_tensor_4d(kbig, ATTN_F32, B, hkvs[i], LK, DK);
        f->tv = attn_tensor_4d(vbig, ATTN_F32, B, hkvs[i], LK, DV);
        if (hkvs[i] == 0) { f->tk.data = f->tv.data = NULL; } /* empty: NULL is allowed */
        char what[64];
        snprintf(what, sizeof what, "Hq = 4, Hkv = %lld", (long long)hkvs[i]);
        EXPECT(f, ATTN_ERR_HEADS, "Hq|Hkv|head", what);
    }
}

/* ---- strides ------------------------------------------------------------------------ */

static void strides(void) {
    char what[64];
    for (int d = 0; d < 4; d++) { /* every dimension of o is > 1 in the fixture */
        fx *f = fresh();
        f->to.stride[d] = 0;
        snprintf(what, sizeof what, "o stride[%d] = 0", d);
        EXPECT(f, ATTN_ERR_STRIDE, "o|stride", what);
    }
    for (int d = 0; d < 3; d++) {
        fx *f = fresh();
        f->tlse.stride[d] = 0;
        snprintf(what, sizeof what, "lse stride[%d] = 0", d);
        EXPECT(f, ATTN_ERR_STRIDE, "lse|stride", what);
        f = fresh();
        f->tw.stride[d + 1] = 0;
        snprintf(what, sizeof what, "weights stride[%d] = 0", d + 1);
        EXPECT(f, ATTN_ERR_STRIDE, "weights|stride", what);
    }
    /* nonzero strides that still make an output overlap itself (the header's
     * ATTN_ERR_STRIDE: "an output would overlap itself"): o rows 1 float apart while a
     * row is 6 wide; lse heads and rows both at stride 1 */
    fx *f = fresh();
    f->to.stride[2] = 1;
    EXPECT(f, ATTN_ERR_STRIDE, "o|stride|overlap", "o rows overlapping (stride[2] = 1 < Dv)");
    f = fresh();
    f->tlse.stride[1] = 1;
    f->tlse.stride[2] = 1;
    EXPECT(f, ATTN_ERR_STRIDE, "lse|stride|overlap", "lse heads and rows both at stride 1");
    /* legal: stride 0 on a dimension of size 1 (lse's last), and on inputs (broadcast) */
    f = fresh();
    f->tlse.stride[3] = 0;
    EXPECT(f, ATTN_OK, NULL, "lse stride[3] = 0 on a dimension of size 1");
    f = fresh();
    f->tk.stride[0] = f->tv.stride[0] = 0;
    f->tq.stride[2] = 0;
    EXPECT(f, ATTN_OK, NULL, "stride 0 on inputs (broadcast)");
    /* every element at a multiple of its size (docs/CONTRACT.md, Errors): a float32 q or
     * o, an int64 kv_len starting at an odd or half-aligned address */
    f = fresh();
    f->tq.data = (char *)f->q + 1;
    EXPECT(f, ATTN_ERR_STRIDE, "q|align", "q at an odd address");
    f = fresh();
    f->to.data = (char *)f->o + 2;
    f->to.shape[3] = DV - 1;
    EXPECT(f, ATTN_ERR_STRIDE, "o|align", "o at an address 2 past a float's");
    f = fresh();
    f->tkvl.data = (char *)f->kvl + 4;
    f->tkvl.shape[0] = 1;
    f->tkvl.stride[0] = 0;
    EXPECT(f, ATTN_ERR_STRIDE, "kv_len|align", "kv_len at an address 4 past an int64's");
    f = fresh(); /* negative strides on an output: a reversed view, legal */
    f->to.stride[2] = -DV;
    f->to.data = f->o + (LQ - 1) * DV;
    EXPECT(f, ATTN_OK, NULL, "o with a negative row stride");
}

/* ---- option values ------------------------------------------------------------------ */

static void values(void) {
    const float bad_scales[3] = {NAN, INFINITY, -INFINITY};
    char what[80];
    for (int i = 0; i < 3; i++) {
        fx *f = fresh();
        f->opt.has_scale = true;
        f->opt.scale = bad_scales[i];
        snprintf(what, sizeof what, "scale %g", (double)bad_scales[i]);
        EXPECT(f, ATTN_ERR_VALUE, "scale", what);
    }
    /* has_scale false: scale is not used (header: "Used only when has_scale is true") */
    fx *f = fresh();
    f->opt.scale = NAN;
    EXPECT(f, ATTN_OK, NULL, "NaN scale without has_scale is ignored");
    f = fresh();
    f->opt.has_scale = true;
    f->opt.scale = 0.0f;
    EXPECT(f, ATTN_OK, NULL, "scale 0");
    f->opt.scale = -3.0f;
    EXPECT(f, ATTN_OK, NULL, "scale -3");

    /* softcap: negative or NaN is an error; +inf too (inf * tanh(s / inf) is inf * 0) */
    const float bad_caps[4] = {-1.0f, -1e-30f, NAN, INFINITY};
    for (int i = 0; i < 4; i++) {
        f = fresh();
        f->opt.softcap = bad_caps[i];
        snprintf(what, sizeof what, "softcap %g", (double)bad_caps[i]);
        EXPECT(f, ATTN_ERR_VALUE, "softcap", what);
    }
    f = fresh();
    f->opt.softcap = -0.0f; /* == 0: off */
    EXPECT(f, ATTN_OK, NULL, "softcap -0");

    /* window: each side >= -1 */
    const int64_t wins[4][2] = {{-2, 0}, {0, -2}, {INT64_MIN, -1}, {-1, -100}};
    for (int i = 0; i < 4; i++) {
        f = fresh();
        f->opt.has_window = true;
        f->opt.window_left = wins[i][0];
        f->opt.window_right = wins[i][1];
        snprintf(what, sizeof what, "window (%lld, %lld)", (long long)wins[i][0], (long long)wins[i][1]);
        EXPECT(f, ATTN_ERR_VALUE, "window", what);
    }
    f = fresh();
    f->opt.window_left = -5; /* has_window false: not used */
    EXPECT(f, ATTN_OK, NULL, "window -5 without has_window is ignored");

    /* kv_len entries outside [0, Lk], as int64 and int32 */
    const int64_t lens[3] = {-1, LK + 1, INT64_MIN};
    for (int i = 0; i < 3; i++) {
        f = fresh();
        f->kvl[1] = lens[i];
        snprintf(what, sizeof what, "kv_len entry %lld (int64)", (long long)lens[i]);
        EXPECT_DATA(f, ATTN_ERR_VALUE, "kv_len", what);
    }
    int32_t l32[B] = {LK, LK + 1};
    for (int i = 0; i < 2; i++) {
        f = fresh();
        l32[1] = i == 0 ? -1 : LK + 1;
        f->tkvl = attn_tensor_4d(l32, ATTN_I32, B, 1, 1, 1);
        snprintf(what, sizeof what, "kv_len entry %d (int32)", (int)l32[1]);
        EXPECT_DATA(f, ATTN_ERR_VALUE, "kv_len", what);
    }

    /* threads and enums */
    f = fresh();
    f->opt.threads = -1;
    EXPECT(f, ATTN_ERR_VALUE, "threads", "threads -1");
    f = fresh();
    f->opt.align = (attn_align)7;
    EXPECT(f, ATTN_ERR_VALUE, "align", "align 7");
    f = fresh();
    f->opt.align = (attn_align)-1;
    EXPECT(f, ATTN_ERR_VALUE, "align", "align -1");
    f = fresh();
    f->opt.path = (attn_path)9;
    EXPECT(f, ATTN_ERR_VALUE, "path", "path 9");
    f = fresh();
    f->opt.path = (attn_path)-1;
    EXPECT(f, ATTN_ERR_VALUE, "path", "path -1");
    f = fresh();
    f->opt.precision = (attn_precision)5;
    EXPECT(f, ATTN_ERR_VALUE, "precision", "precision 5");
}

/* ---- overflow ------------------------------------------------------------------------ */

static void overflow(void) {
    /* Validation must refuse before touching data: the buffers are the fixture's small ones.
     * q, k, v, o all [2^22, 2^22, 2^22, 1], dense: the last offset is about 2^66. */
    const int64_t n = (int64_t)1 << 22;
    fx *f = fresh();
    attn_tensor *ts[4] = {&f->tq, &f->tk, &f->tv, &f->to};
    for (int i = 0; i < 4; i++) {
        ts[i]->shape[0] = ts[i]->shape[1] = ts[i]->shape[2] = n;
        ts[i]->shape[3] = 1;
        ts[i]->stride[0] = n * n; ts[i]->stride[1] = n; ts[i]->stride[2] = 1; ts[i]->stride[3] = 1;
    }
    f->opt = (attn_options){0};
    EXPECT(f, ATTN_ERR_OVERFLOW, "q|overflow|offset|count", "q, k, v, o of 2^66 elements");

    /* an element count past int64 with harmless strides */
    f = fresh();
    f->tq.shape[0] = (int64_t)1 << 40;
    f->tq.shape[1] = (int64_t)1 << 40;
    EXPECT(f, ATTN_ERR_OVERFLOW, "q|overflow|count", "q of 2^80 elements");

    /* one huge stride, on an input and on the output */
    f = fresh();
    f->tk.stride[2] = INT64_MAX;
    EXPECT(f, ATTN_ERR_OVERFLOW, "k|overflow|stride|offset", "k stride INT64_MAX");
    f = fresh();
    f->tv.stride[0] = INT64_MIN;
    EXPECT(f, ATTN_ERR_OVERFLOW, "v|overflow|stride|offset", "v stride INT64_MIN");
    f = fresh();
    f->to.stride[1] = INT64_MAX / 2;
    EXPECT(f, ATTN_ERR_OVERFLOW, "o|overflow|stride|offset", "o stride INT64_MAX / 2 over 4 heads");
    f = fresh();
    f->tmask.stride[3] = INT64_MAX / 3;
    EXPECT(f, ATTN_ERR_OVERFLOW, "mask|overflow|stride|offset", "mask stride INT64_MAX / 3 over 5 keys");

    /* the weights of an [1, 1, 2^40, 2^40] score matrix: 2^80 elements. q, k, v are
     * one row broadcast over 2^40 (stride 0), o has real strides (6 * 2^40 fits). */
    f = fresh();
    const int64_t big = (int64_t)1 << 40;
    f->tq = (attn_tensor){f->q, ATTN_F32, {1, 1, big, DK}, {0, 0, 0, 1}};
    f->tk = (attn_tensor){f->k, ATTN_F32, {1, 1, big, DK}, {0, 0, 0, 1}};
    f->tv = (attn_tensor){f->v, ATTN_F32, {1, 1, big, DV}, {0, 0, 0, 1}};
    f->to = (attn_tensor){f->o, ATTN_F32, {1, 1, big, DV}, {0, 0, DV, 1}};
    f->opt = (attn_options){0};
    attn_tensor w = {f->w, ATTN_F32, {1, 1, big, big}, {0, 0, big, 1}};
    f->opt.weights = &w;
    EXPECT(f, ATTN_ERR_OVERFLOW, "weights|overflow|count", "weights of 2^80 elements");

    /* the workspace query for a huge but representable call: OVERFLOW or a size, no crash */
    for (int p = 0; p < 2; p++) {
        attn_options o = {0};
        o.path = p ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED;
        attn_tensor tq = attn_tensor_4d(NULL, ATTN_F32, B, HQ, (int64_t)1 << 31, DK);
        attn_tensor tk = attn_tensor_4d(NULL, ATTN_F32, B, HKV, (int64_t)1 << 31, DK);
        attn_tensor tv = attn_tensor_4d(NULL, ATTN_F32, B, HKV, (int64_t)1 << 31, DV);
        attn_tensor to = attn_tensor_4d(NULL, ATTN_F32, B, HQ, (int64_t)1 << 31, DV);
        size_t bytes = 0;
        attn_status st = attn_forward_workspace_size(&tq, &tk, &tv, &to, &o, &bytes);
        CHECK(st == ATTN_OK || st == ATTN_ERR_OVERFLOW, "workspace query for Lq = Lk = 2^31, path %d: status %d",
              (int)o.path, (int)st);
    }
}

/* ---- workspace ------------------------------------------------------------------------ */

static void workspace(void) {
    for (int p = 0; p < 3; p++) {
        const attn_path path = p == 0 ? ATTN_PATH_FUSED : p == 1 ? ATTN_PATH_REFERENCE : ATTN_PATH_AUTO;
        char what[96];
        fx *f = fresh();
        f->opt.path = path;
        size_t need = 0;
        CHECK(attn_forward_workspace_size(&f->tq, &f->tk, &f->tv, &f->to, &f->opt, &need) == ATTN_OK,
              "workspace query, path %d", (int)path);
        /* the call's own allocation, for comparison */
        fx_sentinel(f);
        CHECK(attn_forward(&f->tq, &f->tk, &f->tv, &f->to, &f->opt) == ATTN_OK, "path %d without workspace", (int)path);
        float o1[sizeof f->o / 4], l1[sizeof f->lse / 4], w1[sizeof f->w / 4];
        memcpy(o1, f->o, sizeof o1);
        memcpy(l1, f->lse, sizeof l1);
        memcpy(w1, f->w, sizeof w1);

        unsigned char *ws = (unsigned char *)xcalloc((int64_t)need + 64, 1);
        if (need > 0) {
            f->opt.workspace = ws;
            f->opt.workspace_bytes = need - 1;
            snprintf(what, sizeof what, "path %d: workspace of %zu bytes, %zu needed", (int)path, need - 1, need);
            EXPECT_DATA(f, ATTN_ERR_WORKSPACE, "workspace", what);
            f->opt.workspace_bytes = 0;
            snprintf(what, sizeof what, "path %d: workspace of 0 bytes", (int)path);
            EXPECT_DATA(f, ATTN_ERR_WORKSPACE, "workspace", what);
        } else {
            fprintf(stderr, "api: note: path %d needs no workspace for the fixture; the too-small case is not testable\n", (int)path);
        }
        for (int extra = 0; extra <= 64; extra += 64) {
            f->opt.workspace = ws;
            f->opt.workspace_bytes = need + (size_t)extra;
            fx_sentinel(f);
            attn_status st = attn_forward(&f->tq, &f->tk, &f->tv, &f->to, &f->opt);
            CHECK(st == ATTN_OK, "path %d: workspace of %zu bytes (need %zu): status %d", (int)path,
                  need + (size_t)extra, need, (int)st);
            CHECK(memcmp(o1, f->o, sizeof o1) == 0 && memcmp(l1, f->lse, sizeof l1) == 0 &&
                      memcmp(w1, f->w, sizeof w1) == 0,
                  "path %d: the result with a caller's workspace differs from the allocated one", (int)path);
        }
        /* NULL workspace with a size: the call allocates (NULL = "the call allocates") */
        f->opt.workspace = NULL;
        f->opt.workspace_bytes = 1;
        EXPECT(f, ATTN_OK, NULL, "NULL workspace with workspace_bytes 1");
        free(ws);
    }
}

/* ---- status strings, last_error, version ------------------------------------------- */

static void strings(void) {
    for (int a = 0; a < ATTN_STATUS_COUNT; a++) {
        const char *s = attn_status_string((attn_status)a);
        CHECK(s && s[0], "status %d has an empty string", a);
        for (int b = 0; b < a; b++)
            CHECK(s && attn_status_string((attn_status)b) && strcmp(s, attn_status_string((attn_status)b)) != 0,
                  "statuses %d and %d share a string", a, b);
    }
    CHECK(attn_status_string(ATTN_STATUS_COUNT) != NULL, "attn_status_string(COUNT) is NULL");
    CHECK(attn_status_string((attn_status)-1) != NULL, "attn_status_string(-1) is NULL");
    CHECK(attn_status_string((attn_status)1000) != NULL, "attn_status_string(1000) is NULL");

    /* last_error: set by a failure, cleared by a success (of either call) */
    fx *f = fresh();
    f->tk.shape[3] = DK + 1;
    attn_forward(&f->tq, &f->tk, &f->tv, &f->to, &f->opt);
    CHECK(attn_last_error()[0] != 0, "no message after a failure");
    f = fresh();
    attn_forward(&f->tq, &f->tk, &f->tv, &f->to, &f->opt);
    CHECK(attn_last_error()[0] == 0, "message \"%s\" after a success", attn_last_error());
    f->tk.shape[3] = DK + 1;
    attn_forward(&f->tq, &f->tk, &f->tv, &f->to, &f->opt);
    f = fresh();
    size_t bytes;
    attn_forward_workspace_size(&f->tq, &f->tk, &f->tv, &f->to, &f->opt, &bytes);
    CHECK(attn_last_error()[0] == 0, "message \"%s\" after a successful workspace query", attn_last_error());

#ifdef _OPENMP
    /* per thread: a failure on thread 1 leaves thread 0's "" alone */
    f = fresh();
    attn_forward(&f->tq, &f->tk, &f->tv, &f->to, &f->opt); /* success here: "" */
    int other_saw = 0, nthreads = 0;
    static fx f2;
    fx_init(&f2);
    f2.tk.shape[3] = DK + 1;
#pragma omp parallel num_threads(2)
    {
#pragma omp single
        nthreads = omp_get_num_threads();
        if (omp_get_thread_num() == 1) {
            attn_forward(&f2.tq, &f2.tk, &f2.tv, &f2.to, &f2.opt);
            other_saw = attn_last_error()[0] != 0;
        }
    }
    if (nthreads == 2) {
        CHECK(other_saw, "thread 1: no message after its failure");
        CHECK(attn_last_error()[0] == 0, "thread 0 sees thread 1's message \"%s\"", attn_last_error());
    }
#endif

    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", ATTN_VERSION_MAJOR, ATTN_VERSION_MINOR, ATTN_VERSION_PATCH);
    CHECK(attn_version() && strcmp(attn_version(), want) == 0, "attn_version() is \"%s\", want \"%s\"",
          attn_version() ? attn_version() : "(null)", want);
    CHECK(attn_kernel_name() && attn_kernel_name()[0], "attn_kernel_name() is empty");

    /* attn_kernel_list(): NULL-terminated, ends with generic (every build has it and every
     * CPU runs it), holds the kernel this process runs, and no name twice */
    const char *const *list = attn_kernel_list();
    int n = 0, has_chosen = 0, dup = 0;
    for (; list && list[n]; n++) {
        has_chosen |= strcmp(list[n], attn_kernel_name()) == 0;
        for (int j = 0; j < n; j++) dup |= strcmp(list[j], list[n]) == 0;
    }
    CHECK(list && n >= 1 && strcmp(list[n - 1], "generic") == 0 && attn_kernel_supported("generic"),
          "attn_kernel_list(): %d names, the last not a runnable generic", n);
    CHECK(has_chosen || strcmp(attn_kernel_name(), "none") == 0,
          "attn_kernel_name() \"%s\" is not in attn_kernel_list()", attn_kernel_name());
    CHECK(!dup, "attn_kernel_list() names a kernel twice");
    CHECK(!attn_kernel_supported("no-such-kernel") && !attn_kernel_supported(NULL),
          "attn_kernel_supported() accepts a name the list does not have");

    /* the dtype table: every dtype its name and size, an unknown one neither */
    static const struct { attn_dtype t; const char *name; size_t bytes; } dts[] = {
        {ATTN_F32, "float32", 4}, {ATTN_F16, "float16", 2}, {ATTN_BF16, "bfloat16", 2},
        {ATTN_BOOL, "bool", 1},   {ATTN_I32, "int32", 4},   {ATTN_I64, "int64", 8},
        {ATTN_F64, "float64", 8}};
    for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++)
        CHECK(strcmp(attn_dtype_name(dts[i].t), dts[i].name) == 0 && attn_dtype_size(dts[i].t) == dts[i].bytes,
              "dtype %d: name \"%s\", %zu bytes; want \"%s\", %zu", (int)dts[i].t,
              attn_dtype_name(dts[i].t), attn_dtype_size(dts[i].t), dts[i].name, dts[i].bytes);
    CHECK(strcmp(attn_dtype_name(ATTN_DTYPE_COUNT), "unknown") == 0 && attn_dtype_size(ATTN_DTYPE_COUNT) == 0 &&
              attn_dtype_size((attn_dtype)-1) == 0,
          "a dtype outside the list has a name or a size");
}

/* ---- attn_kv_append and attn_merge: a success clears the error; no overflow in
 * describing a position beyond the cache ---------------------------------------------- */

static void append_and_merge(void) {
    enum { CB = 1, CH = 1, CL = 4, CD = 2 };
    float kc[CB * CH * CL * CD] = {0}, vc[CB * CH * CL * CD] = {0}, kn[CD] = {1, 2}, vn[CD] = {3, 4};
    int64_t len[CB] = {0};
    attn_tensor tkc = attn_tensor_4d(kc, ATTN_F32, CB, CH, CL, CD);
    attn_tensor tvc = attn_tensor_4d(vc, ATTN_F32, CB, CH, CL, CD);
    attn_tensor tkn = attn_tensor_4d(kn, ATTN_F32, CB, CH, 1, CD);
    attn_tensor tvn = attn_tensor_4d(vn, ATTN_F32, CB, CH, 1, CD);
    attn_tensor tlen = attn_tensor_4d(len, ATTN_I64, CB, 1, 1, 1);
    /* kv_len = INT64_MAX: refused, and its message computed without overflow (UBSan) */
    len[0] = INT64_MAX;
    CHECK(attn_kv_append(&tkn, &tvn, &tkc, &tvc, NULL, NULL, &tlen) == ATTN_ERR_VALUE,
          "kv_append with kv_len = INT64_MAX: %s", attn_last_error());
    CHECK(mentions(attn_last_error(), "kv_len"), "kv_append: message \"%s\"", attn_last_error());
    float before[CL * CD];
    memcpy(before, kc, sizeof kc);
    len[0] = CL;  // one past the end: refused
    CHECK(attn_kv_append(&tkn, &tvn, &tkc, &tvc, NULL, NULL, &tlen) == ATTN_ERR_VALUE &&
          memcmp(before, kc, sizeof kc) == 0, "kv_append at kv_len = Lmax: refused, nothing written");
    CHECK(attn_last_error()[0] != 0, "kv_append: error set after a failure");
    len[0] = 1;
    CHECK(attn_kv_append(&tkn, &tvn, &tkc, &tvc, NULL, NULL, &tlen) == ATTN_OK && kc[2] == 1 &&
          vc[3] == 4, "kv_append at kv_len = 1: %s", attn_last_error());
    CHECK(attn_last_error()[0] == 0, "kv_append: last_error \"%s\" after success",
          attn_last_error());
    /* a misaligned float32 source: refused, nothing written */
    static float src[CD + 1];
    attn_tensor tmis = attn_tensor_4d((char *)src + 2, ATTN_F32, CB, CH, 1, CD - 1);
    attn_tensor tkc1 = tkc, tvc1 = tvc;
    tkc1.shape[3] = tvc1.shape[3] = CD - 1;
    memcpy(before, kc, sizeof kc);
    CHECK(attn_kv_append(&tmis, &tmis, &tkc1, &tvc1, NULL, NULL, &tlen) == ATTN_ERR_STRIDE &&
          memcmp(before, kc, sizeof kc) == 0, "kv_append, misaligned k_new: %s", attn_last_error());

    /* attn_merge: fails, then succeeds: the error is cleared */
    attn_tensor mo = attn_tensor_4d(kc, ATTN_F32, 1, 1, CL, CD);
    attn_tensor ml = attn_tensor_4d(before, ATTN_F32, 1, 1, CL, 1);
    attn_tensor po[1] = {attn_tensor_4d(vc, ATTN_F32, 1, 1, CL, CD)};
    float lp[CL] = {0};
    attn_tensor pl[1] = {attn_tensor_4d(lp, ATTN_F32, 1, 1, CL, 1)};
    CHECK(attn_merge(-1, po, pl, &mo, &ml, 0) == ATTN_ERR_VALUE && attn_last_error()[0] != 0,
          "merge n = -1: refused");
    CHECK(attn_merge(1, po, pl, &mo, &ml, 0) == ATTN_OK, "merge: %s", attn_last_error());
    CHECK(attn_last_error()[0] == 0, "merge: last_error \"%s\" after success", attn_last_error());
}

/* attn_huge_pages: NULL refused, 0 bytes and a range without a whole 2 MiB page fine, and
 * no byte of a range that holds several changes. Whether the pages became huge is the
 * system's (its settings, free memory): printed from /proc/self/smaps_rollup where there
 * is one, not checked; the status is, where the system says it gives huge pages on
 * request (Linux's transparent_hugepage/enabled other than [never]). */
static long anon_huge_kib(void) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f) return -1;
    char line[256];
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "AnonHugePages: %ld kB", &kib) == 1) break;
    fclose(f);
    return kib;
}

static void huge_pages(void) {
    CHECK(attn_huge_pages(NULL, 16) == ATTN_ERR_NULL && attn_last_error()[0], "attn_huge_pages(NULL, 16) not ATTN_ERR_NULL");
    CHECK(attn_huge_pages(NULL, 0) == ATTN_OK, "attn_huge_pages(NULL, 0): %s", attn_last_error());
    const size_t n = (size_t)9 << 20;  // at least 3 whole 2 MiB pages wherever it starts
    uint32_t *buf = malloc(n);
    CHECK(buf != NULL, "malloc");
    if (!buf) return;
    for (size_t i = 0; i < n / 4; i++) buf[i] = (uint32_t)(i * 2654435761u);
    CHECK(attn_huge_pages(buf, 4096) == ATTN_OK, "attn_huge_pages on 4 KiB: %s", attn_last_error());
    const long before = anon_huge_kib();
    const attn_status st = attn_huge_pages(buf, n);
    const long after = anon_huge_kib();
    size_t bad = 0;
    for (size_t i = 0; i < n / 4; i++) bad += buf[i] != (uint32_t)(i * 2654435761u);
    CHECK(bad == 0, "attn_huge_pages changed %zu of %zu words", bad, n / 4);
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char mode[128] = "";
    if (f) {
        if (!fgets(mode, sizeof mode, f)) mode[0] = '\0';
        fclose(f);
    }
    if (f && !strstr(mode, "[never]"))
        CHECK(st == ATTN_OK, "attn_huge_pages on 9 MiB: %s (transparent huge pages: %s)", attn_last_error(), mode);
    else
        CHECK(st == ATTN_OK || st == ATTN_ERR_UNSUPPORTED, "attn_huge_pages on 9 MiB: status %d", (int)st);
    printf("     attn_huge_pages on 9 MiB: %s; the process's AnonHugePages %ld -> %ld KiB\n",
           attn_status_string(st), before, after);
    free(buf);
}

int main(void) {
    huge_pages();
    valid_call();
    nulls();
    dtypes();
    shapes();
    heads();
    strides();
    values();
    workspace();
    strings();
    append_and_merge();
    overflow(); /* last: a library that misses it reads far out of bounds */
    return check_summary("api");
}
