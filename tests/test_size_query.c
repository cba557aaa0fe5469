/*
 * test_size_query.c — attn_forward_workspace_size promises that the tensors' data
 * pointers "are not read and may be NULL": the size must then be the size of the call
 * with data. Each option that shapes the workspace (the weights output, a block table,
 * a bool mask, a float bias, and all of them together) is asked for with data and
 * without, on shapes that take the decoding step, the split and the tile path, and for
 * float32 and bfloat16 caches; and a call given the data-less answer as its workspace
 * must succeed (under AddressSanitizer that run is what would catch an overflow).
 * What it is not: a test of what the calls compute (the forward suites do that).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "check.h"

enum { OPT_WEIGHTS = 1, OPT_PAGED = 2, OPT_MASK = 4, OPT_BIAS = 8 };

typedef struct shape { int64_t B, Hq, Hkv, Lq, Lk, D; attn_dtype kv; } shape;

/* the call's tensors, with data when `data`, else the same shapes and strides without */
static size_t size_of(const shape *s, int opts, bool data, void **bufs, attn_options *opt_out,
                      attn_tensor *t) {
    const int64_t page = 16, pages = (s->Lk + page - 1) / page;
    const size_t es = s->kv == ATTN_F32 ? 4 : 2;
    void *q = data ? bufs[0] : NULL, *k = data ? bufs[1] : NULL, *v = data ? bufs[2] : NULL;
    t[0] = attn_tensor_4d(q, ATTN_F32, s->B, s->Hq, s->Lq, s->D);
    if (opts & OPT_PAGED) {
        t[1] = attn_tensor_4d(k, s->kv, s->B * pages, s->Hkv, page, s->D);
        t[2] = attn_tensor_4d(v, s->kv, s->B * pages, s->Hkv, page, s->D);
    } else {
        t[1] = attn_tensor_4d(k, s->kv, s->B, s->Hkv, s->Lk, s->D);
        t[2] = attn_tensor_4d(v, s->kv, s->B, s->Hkv, s->Lk, s->D);
    }
    (void)es;
    const int64_t Lk = opts & OPT_PAGED ? pages * page : s->Lk;  /* the pools' key count */
    t[3] = attn_tensor_4d(data ? bufs[3] : NULL, ATTN_F32, s->B, s->Hq, s->Lq, s->D);
    attn_options opt = {0};
    if (opts & OPT_WEIGHTS) {
        t[4] = attn_tensor_4d(data ? bufs[4] : NULL, ATTN_F32, s->B, s->Hq, s->Lq, Lk);
        opt.weights = &t[4];
    }
    if (opts & OPT_PAGED) {
        t[5] = attn_tensor_4d(data ? bufs[5] : NULL, ATTN_I32, s->B, pages, 1, 1);
        opt.block_table = &t[5];
    }
    if (opts & OPT_MASK) {
        t[6] = attn_tensor_4d(data ? bufs[6] : NULL, ATTN_BOOL, s->B, 1, s->Lq, Lk);
        opt.mask = &t[6];
    }
    if (opts & OPT_BIAS) {
        t[7] = attn_tensor_4d(data ? bufs[7] : NULL, ATTN_F32, s->B, 1, 1, Lk);
        opt.bias = &t[7];
    }
    size_t bytes = 0;
    attn_status st = attn_forward_workspace_size(&t[0], &t[1], &t[2], &t[3], &opt, &bytes);
    CHECK(st == ATTN_OK, "size query failed: %s", attn_last_error());
    *opt_out = opt;
    return bytes;
}

int main(void) {
    const shape shapes[] = {
        {2, 4, 2, 1, 1000, 64, ATTN_F32},   /* decoding: the step, and a split without weights */
        {1, 4, 4, 3, 4100, 32, ATTN_F32},   /* few rows, long keys: split */
        {2, 4, 2, 77, 199, 32, ATTN_F32},   /* the tile path */
        {1, 8, 2, 1, 700, 64, ATTN_BF16},   /* a 16-bit cache */
        {2, 4, 4, 130, 130, 64, ATTN_BF16},
    };
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        const shape *s = &shapes[c];
        const int64_t page = 16, pages = (s->Lk + page - 1) / page;
        const size_t es = s->kv == ATTN_F32 ? 4 : 2;
        void *bufs[8];
        const int64_t kv_el = s->B * pages * page * s->Hkv * s->D;
        bufs[0] = xcalloc(s->B * s->Hq * s->Lq * s->D, 4);
        bufs[1] = xcalloc(kv_el, es);
        bufs[2] = xcalloc(kv_el, es);
        bufs[3] = xcalloc(s->B * s->Hq * s->Lq * s->D, 4);
        const int64_t lk_max = pages * page;  /* >= Lk: the paged calls' key count */
        bufs[4] = xcalloc(s->B * s->Hq * s->Lq * lk_max, 4);
        int32_t *bt = xcalloc(s->B * pages, 4);
        for (int64_t i = 0; i < s->B * pages; i++) bt[i] = (int32_t)i;
        bufs[5] = bt;
        uint8_t *m = xcalloc(s->B * s->Lq * lk_max, 1);
        for (int64_t i = 0; i < s->B * s->Lq * lk_max; i++) m[i] = (uint8_t)(i % 7 != 3);
        bufs[6] = m;
        bufs[7] = xcalloc(s->B * lk_max, 4);
        for (int opts = 0; opts < 16; opts++) {
            attn_tensor t_with[8], t_without[8];
            attn_options o_with, o_without;
            const size_t with = size_of(s, opts, true, bufs, &o_with, t_with);
            const size_t without = size_of(s, opts, false, bufs, &o_without, t_without);
            CHECK(with == without,
                  "case %zu options %d: workspace %zu bytes with data, %zu without", c, opts,
                  with, without);
            /* the call, given the data-less answer as its workspace */
            void *ws = xcalloc((int64_t)without + 1, 1);
            o_with.workspace = ws;
            o_with.workspace_bytes = without;
            const attn_status st = attn_forward(&t_with[0], &t_with[1], &t_with[2], &t_with[3], &o_with);
            CHECK(st == ATTN_OK, "case %zu options %d: the call with the queried workspace: %s",
                  c, opts, attn_last_error());
            free(ws);
        }
        for (int i = 0; i < 8; i++) free(bufs[i]);
    }
    return check_summary("test_size_query");
}
