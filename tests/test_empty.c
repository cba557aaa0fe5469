/*
 * test_empty.c — calls where some size is 0: every one is legal and must return ATTN_OK
 *                without crashing, dividing by zero or (under UBSan) doing pointer
 *                arithmetic on NULL, and must write what the contract says.
 *
 * What it covers: B, Hq (with Hkv = 0 or not), Lq, Lk, Dk or Dv = 0, alone and together,
 * with Lq small and Lk long enough for the forward's split over keys (Lk >= 2048); the workspace
 * queries and the calls of the forward and the backward, both paths, float32 and
 * float16, with the data pointers of empty tensors NULL and non-NULL; what is written
 * (B·Hq·Lq = 0: nothing; Lk = 0: o = 0, lse = -inf, dq = 0; Lq = 0: dk = dv = 0); and
 * attn_tensor_4d on sizes whose dense strides do not fit in int64 (refused as
 * ATTN_ERR_OVERFLOW, even when another size is 0).
 * What it is not: the numbers of non-empty calls (test_forward.c, test_backward.c).
 */
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "check.h"
#include "oracle.h"

typedef struct eshape {
    int64_t B, Hq, Hkv, Lq, Lk, Dk, Dv;
} eshape;

static const eshape g_shapes[] = {
    {0, 1, 1, 1, 2048, 4, 4},  {0, 1, 1, 16, 4096, 4, 4}, {0, 2, 1, 1, 2048, 4, 4},
    {2, 0, 0, 1, 2048, 4, 4},  {2, 0, 0, 16, 2048, 4, 4}, {1, 0, 0, 3, 5, 4, 4},
    {2, 2, 1, 0, 2048, 4, 4},  {2, 2, 2, 0, 5, 4, 4},     {2, 2, 1, 3, 0, 4, 4},
    {2, 2, 1, 1, 0, 4, 4},     {2, 2, 1, 3, 5, 0, 4},     {2, 2, 1, 1, 2048, 0, 4},
    {2, 2, 1, 3, 5, 4, 0},     {2, 2, 1, 1, 2048, 4, 0},  {0, 0, 0, 0, 0, 0, 0},
    {0, 1, 1, 0, 2048, 0, 0},  {1, 1, 1, 1, 0, 0, 0},     {3, 2, 2, 17, 0, 3, 3},
    {2, 0, 2, 1, 5, 4, 4},     {2, 0, 2, 3, 2048, 4, 4},  {1, 0, 3, 70, 5, 4, 4},
};

static int64_t count4(const int64_t n[4]) { return n[0] * n[1] * n[2] * n[3]; }

/* a float32 or float16 tensor of shape n: NULL data when empty and null_empty, else a
 * zeroed buffer of at least one element filled with the sentinel */
static attn_tensor make(attn_dtype dt, int64_t n0, int64_t n1, int64_t n2, int64_t n3,
                        bool null_empty) {
    const int64_t n[4] = {n0, n1, n2, n3}, c = count4(n);
    void *data = NULL;
    if (c > 0 || !null_empty) {
        data = xcalloc(c > 0 ? c : 1, 4);
        fill_sentinel(data, c > 0 ? c : 1);
    }
    return attn_tensor_4d(data, dt, n0, n1, n2, n3);
}

/* inputs get finite values (float32 0.25, float16 0x3400 = 0.25) */
static void fill_input(attn_tensor *t) {
    const int64_t c = count4(t->shape);
    for (int64_t i = 0; i < c; i++) {
        if (t->dtype == ATTN_F32) ((float *)t->data)[i] = 0.25f;
        else ((uint16_t *)t->data)[i] = 0x3400;
    }
}

/* every element of a float32 output equals want (bitwise for -inf and 0) */
static bool all_equal(const attn_tensor *t, float want) {
    const int64_t c = count4(t->shape);
    for (int64_t i = 0; i < c; i++) {
        if (t->dtype == ATTN_F32 ? ((const float *)t->data)[i] != want
                                 : ((const uint16_t *)t->data)[i] != 0 /* only 0 is asked */)
            return false;
    }
    return true;
}

static bool untouched(const attn_tensor *t) {
    if (!t->data) return true;
    const int64_t c = count4(t->shape);
    return count_written(t->data, c > 0 ? c : 1) == 0;
}

/* q, k, v, o of dtype dt and a float32 lse for shape s, the inputs filled */
typedef struct etensors {
    attn_tensor q, k, v, o, lse;
} etensors;

static etensors make_call(const eshape *s, attn_dtype dt, bool null_empty) {
    etensors t = {make(dt, s->B, s->Hq, s->Lq, s->Dk, null_empty),
                  make(dt, s->B, s->Hkv, s->Lk, s->Dk, null_empty),
                  make(dt, s->B, s->Hkv, s->Lk, s->Dv, null_empty),
                  make(dt, s->B, s->Hq, s->Lq, s->Dv, null_empty),
                  make(ATTN_F32, s->B, s->Hq, s->Lq, 1, null_empty)};
    fill_input(&t.q); fill_input(&t.k); fill_input(&t.v);
    return t;
}

static void free_call(etensors *t) {
    free(t->q.data); free(t->k.data); free(t->v.data); free(t->o.data); free(t->lse.data);
}

static void forward_case(const eshape *s, attn_path path, bool null_empty) {
    etensors t = make_call(s, ATTN_F32, null_empty);
    attn_tensor q = t.q, k = t.k, v = t.v, o = t.o, lse = t.lse;
    attn_tensor w = make(ATTN_F32, s->B, s->Hq, s->Lq, s->Lk, null_empty);
    char what[160];
    snprintf(what, sizeof what, "forward B=%lld Hq=%lld Hkv=%lld Lq=%lld Lk=%lld Dk=%lld Dv=%lld "
             "path %d, empty data %s", (long long)s->B, (long long)s->Hq, (long long)s->Hkv,
             (long long)s->Lq, (long long)s->Lk, (long long)s->Dk, (long long)s->Dv, (int)path,
             null_empty ? "NULL" : "non-NULL");
    for (int with_outputs = 0; with_outputs < 2; with_outputs++) {
        attn_options opt = {.path = path, .lse = with_outputs ? &lse : NULL,
                            .weights = with_outputs ? &w : NULL, .threads = 3};
        size_t bytes = 0;
        attn_status st = attn_forward_workspace_size(&q, &k, &v, &o, &opt, &bytes);
        CHECK(st == ATTN_OK, "%s, outputs %d: workspace query status %d (%s)", what,
              with_outputs, (int)st, attn_last_error());
        st = attn_forward(&q, &k, &v, &o, &opt);
        CHECK(st == ATTN_OK, "%s, outputs %d: status %d (%s)", what, with_outputs, (int)st,
              attn_last_error());
    }
    const bool no_rows = s->B * s->Hq * s->Lq == 0;
    if (no_rows) {
        CHECK(untouched(&o) && untouched(&lse) && untouched(&w), "%s: an output written "
              "although there is no query row", what);
    } else {
        CHECK(all_equal(&o, s->Lk == 0 ? 0.0f : 0.25f), "%s: o is not %s", what,
              s->Lk == 0 ? "0 (fully masked rows)" : "0.25 (the mean of equal values)");
        if (s->Lk == 0)
            CHECK(all_equal(&lse, -INFINITY), "%s: lse is not -inf for fully masked rows", what);
    }
    free_call(&t);
    free(w.data);
}

static void backward_case(const eshape *s, attn_path path, attn_dtype dt, bool null_empty) {
    etensors t = make_call(s, dt, null_empty);
    attn_tensor q = t.q, k = t.k, v = t.v, o = t.o, lse = t.lse;
    attn_tensor d_o = make(dt, s->B, s->Hq, s->Lq, s->Dv, null_empty);
    attn_tensor dq = make(dt, s->B, s->Hq, s->Lq, s->Dk, null_empty);
    attn_tensor dk = make(dt, s->B, s->Hkv, s->Lk, s->Dk, null_empty);
    attn_tensor dv = make(dt, s->B, s->Hkv, s->Lk, s->Dv, null_empty);
    fill_input(&d_o);
    char what[180];
    snprintf(what, sizeof what, "backward %s B=%lld Hq=%lld Hkv=%lld Lq=%lld Lk=%lld Dk=%lld "
             "Dv=%lld path %d, empty data %s", dt == ATTN_F32 ? "float32" : "float16",
             (long long)s->B, (long long)s->Hq, (long long)s->Hkv, (long long)s->Lq,
             (long long)s->Lk, (long long)s->Dk, (long long)s->Dv, (int)path,
             null_empty ? "NULL" : "non-NULL");
    attn_options opt = {.path = path, .threads = 3};
    attn_options fopt = opt;
    fopt.lse = &lse;
    attn_status st = attn_forward(&q, &k, &v, &o, &fopt);
    CHECK(st == ATTN_OK, "%s: forward status %d (%s)", what, (int)st, attn_last_error());
    size_t bytes = 0;
    st = attn_backward_workspace_size(&q, &k, &v, &o, &d_o, &lse, &dq, &dk, &dv, &opt, &bytes);
    CHECK(st == ATTN_OK, "%s: workspace query status %d (%s)", what, (int)st, attn_last_error());
    st = attn_backward(&q, &k, &v, &o, &d_o, &lse, &dq, &dk, &dv, &opt);
    CHECK(st == ATTN_OK, "%s: status %d (%s)", what, (int)st, attn_last_error());
    if (s->Lk == 0 && count4(dq.shape) > 0)
        CHECK(all_equal(&dq, 0.0f), "%s: dq is not 0 with no key", what);
    if (s->Hq * s->Lq == 0 && count4(dk.shape) > 0)
        CHECK(all_equal(&dk, 0.0f) && all_equal(&dv, 0.0f), "%s: dk, dv are not 0 with no "
              "query row", what);
    free_call(&t);
    free(d_o.data); free(dq.data); free(dk.data); free(dv.data);
}

/* Dense strides that do not fit in int64: attn_tensor_4d must not overflow computing
 * them, and the library refuses the tensor, empty or not. */
static void huge_dense(void) {
    const int64_t big = (int64_t)1 << 40;
    float one = 0.0f;
    attn_tensor q = attn_tensor_4d(NULL, ATTN_F32, 0, big, big, 4);
    attn_tensor k = attn_tensor_4d(NULL, ATTN_F32, 0, 1, 1, 4);
    attn_tensor v = attn_tensor_4d(NULL, ATTN_F32, 0, 1, 1, 4);
    attn_tensor o = attn_tensor_4d(NULL, ATTN_F32, 0, big, big, 4);
    CHECK(q.stride[0] == INT64_MAX && q.stride[1] == big * 4 && q.stride[2] == 4 && q.stride[3] == 1,
          "attn_tensor_4d(0, 2^40, 2^40, 4): strides %lld %lld %lld %lld", (long long)q.stride[0],
          (long long)q.stride[1], (long long)q.stride[2], (long long)q.stride[3]);
    k.shape[1] = big;  // heads as q's
    v.shape[1] = big;
    size_t bytes = 0;
    attn_status st = attn_forward_workspace_size(&q, &k, &v, &o, NULL, &bytes);
    CHECK(st == ATTN_ERR_OVERFLOW, "0 x 2^40 x 2^40 x 4 q: workspace query status %d, expected "
          "ATTN_ERR_OVERFLOW", (int)st);
    st = attn_forward(&q, &k, &v, &o, NULL);
    CHECK(st == ATTN_ERR_OVERFLOW, "0 x 2^40 x 2^40 x 4 q: status %d, expected ATTN_ERR_OVERFLOW",
          (int)st);
    /* the largest representable strides still come out exact */
    attn_tensor t = attn_tensor_4d(&one, ATTN_F32, 1, (int64_t)1 << 20, (int64_t)1 << 21,
                                   (int64_t)1 << 21);
    CHECK(t.stride[0] == (int64_t)1 << 62 && t.stride[1] == (int64_t)1 << 42,
          "attn_tensor_4d(1, 2^20, 2^21, 2^21): stride[0] = %lld", (long long)t.stride[0]);
}

int main(void) {
    const int n = (int)(sizeof g_shapes / sizeof g_shapes[0]);
    for (int c = 0; c < n; c++)
        for (int null_empty = 0; null_empty < 2; null_empty++)
            for (int path = ATTN_PATH_FUSED; path <= ATTN_PATH_REFERENCE; path++) {
                forward_case(&g_shapes[c], (attn_path)path, null_empty);
                backward_case(&g_shapes[c], (attn_path)path, ATTN_F32, null_empty);
                backward_case(&g_shapes[c], (attn_path)path, ATTN_F16, null_empty);
            }
    huge_dense();
    return check_summary("empty");
}
