/*
 * test_backward_edge.c — attn_backward's promises beyond accuracy (test_backward.c):
 *  1. Fully masked rows contribute exactly 0 (even with NaN in their dO); NaN stored in
 *     structurally masked K/V rows reaches no gradient.
 *  2. Bit-identical gradients for 1, 2 and 3 threads and on repeated runs.
 *  3. Every misuse returns its status and writes nothing.
 * The kernel is chosen by ATTN_ISA, as for the other suites.
 */
#include "backward_case.h"

/* ---- 1. masked rows and poisoned keys ---------------------------------------------------- */

static void masked_rows(void) {
    static const attn_path paths[2] = {ATTN_PATH_FUSED, ATTN_PATH_REFERENCE};
    /* batch 1 has kv_len 0, rows i % 5 == 2 have no key in the bool mask; their dO is NaN
     * and their Q Inf (NaN in batch 1): a zero P or dS must not multiply either */
    bcase c = base(2, 2, 1, 70, 90, 16, 24);
    c.kvlen = 2; c.kvlen_fixed = -1; c.mask = 1; c.mshape = 4; c.empty_rows = 1;
    for (int pi = 0; pi < 2; pi++) {
        bcall t;
        bcall_build(&t, &c);
        for (int64_t h = 0; h < c.Hq; h++)
            for (int64_t i = 0; i < c.Lq; i++)
                for (int64_t d = 0; d < c.Dk; d++) {
                    if (i % 5 == 2) *view_ptr(&t.q, 0, h, i, d) = d % 2 ? INFINITY : -INFINITY;
                    *view_ptr(&t.q, 1, h, i, d) = NAN;
                }
        CHECK(bcall_forward(&t) == ATTN_OK, "masked rows: forward failed");
        const int64_t lk0 = t.s.kvl64[0];
        for (int64_t h = 0; h < c.Hq; h++)
            for (int64_t i = 0; i < c.Lq; i++) {
                const int empty = i % 5 == 2;
                for (int64_t d = 0; d < c.Dv; d++) {
                    if (empty) *view_ptr(&t.d_o, 0, h, i, d) = NAN;
                    *view_ptr(&t.d_o, 1, h, i, d) = NAN;  // batch 1: every row is empty
                }
            }
        CHECK(bcall_run(&t, paths[pi], 0) == ATTN_OK, "masked rows: backward failed");
        int64_t bad_dq = 0;
        for (int64_t h = 0; h < c.Hq; h++)
            for (int64_t i = 0; i < c.Lq; i++)
                for (int64_t d = 0; d < c.Dk; d++) {
                    const float x = t.got[0][((0 * c.Hq + h) * c.Lq + i) * c.Dk + d];
                    const float y = t.got[0][((1 * c.Hq + h) * c.Lq + i) * c.Dk + d];
                    if (y != 0.0f || (i % 5 == 2 && x != 0.0f) || !isfinite(x)) bad_dq++;
                }
        CHECK(bad_dq == 0, "masked rows (%s): %lld dq entries of empty rows not 0 (or NaN elsewhere)",
              pi ? "reference" : "fused", (long long)bad_dq);
        const int64_t half_k = t.n[1] / 2, half_v = t.n[2] / 2;
        CHECK(all_zero(t.got[1] + half_k, half_k) && all_zero(t.got[2] + half_v, half_v),
              "masked rows (%s): dk/dv of the batch with kv_len 0 not 0", pi ? "reference" : "fused");
        CHECK(all_finite(t.got[1], half_k) && all_finite(t.got[2], half_v),
              "masked rows (%s): NaN dO or Inf Q of empty rows reached dk/dv", pi ? "reference" : "fused");
        int64_t beyond = 0;  // keys at or past kv_len[0] in batch 0: exactly 0
        for (int64_t j = lk0; j < c.Lk; j++) {
            for (int64_t d = 0; d < c.Dk; d++) beyond += t.got[1][j * c.Dk + d] != 0.0f;
            for (int64_t d = 0; d < c.Dv; d++) beyond += t.got[2][j * c.Dv + d] != 0.0f;
        }
        CHECK(beyond == 0, "masked rows (%s): %lld dk/dv entries past kv_len not 0",
              pi ? "reference" : "fused", (long long)beyond);
        bcall_free(&t);
    }
}

/* NaN stored in every K and V row no query row may read (past kv_len, outside the
 * causal band and window): no gradient may see it, and those rows' gradients are 0 */
static void poisoned_keys(void) {
    static const attn_path paths[2] = {ATTN_PATH_FUSED, ATTN_PATH_REFERENCE};
    bcase cs[3];
    cs[0] = base(2, 2, 1, 40, 150, 32, 16);
    cs[0].kvlen = 1; cs[0].kvlen_fixed = 101; cs[0].causal = 1; cs[0].align = 0;  // top-left, Lq < Lk
    cs[1] = base(1, 2, 2, 130, 140, 8, 8);
    cs[1].window = 1; cs[1].wl = 9; cs[1].wr = 3; cs[1].cache = 1; cs[1].layout = 1;
    cs[2] = base(1, 1, 1, 64, 200, 64, 64);
    cs[2].kvlen = 2; cs[2].kvlen_fixed = 70; cs[2].mask = 2; cs[2].mshape = 4; cs[2].bias_ninf = 0.2;
    for (int ci = 0; ci < 3; ci++)
        for (int pi = 0; pi < 2; pi++) {
            bcall t;
            bcall_build(&t, &cs[ci]);
            const bcase *c = &cs[ci];
            CHECK(bcall_forward(&t) == ATTN_OK, "poison: forward failed");
            /* which keys does any row read? */
            attn_params p;
            ai_params_init(&p, &t.q, &t.k, &t.v, &t.o, &t.opt, true);
            int64_t poisoned = 0;
            for (int64_t b = 0; b < c->B; b++) {
                const int64_t lkb = attn_key_len(&p, b);
                for (int64_t j = 0; j < c->Lk; j++) {
                    int used = 0;
                    for (int64_t i = 0; i < c->Lq && !used; i++) {
                        int64_t lo, hi;
                        attn_row_range(&p, lkb, i, &lo, &hi);
                        used = j >= lo && j < hi;
                    }
                    if (used) continue;
                    poisoned++;
                    for (int64_t g = 0; g < c->Hkv; g++) {
                        for (int64_t d = 0; d < c->Dk; d++) *view_ptr(&t.k, b, g, j, d) = NAN;
                        for (int64_t d = 0; d < c->Dv; d++) *view_ptr(&t.v, b, g, j, d) = NAN;
                    }
                }
            }
            CHECK(poisoned > 0, "poison: case %d has no unread key", ci);
            CHECK(bcall_run(&t, paths[pi], 0) == ATTN_OK, "poison: backward failed");
            for (int a = 0; a < 3; a++)
                CHECK(all_finite(t.got[a], t.n[a]), "poison (%s, case %d): NaN reached %s",
                      pi ? "reference" : "fused", ci, k_grad[a]);
            bcall_free(&t);
        }
}

/* ---- 2. determinism --------------------------------------------------------------------- */

static void determinism(void) {
    bcase cs[4];
    cs[0] = base(1, 1, 1, 300, 300, 64, 64);  // one head: key chunks, dQ partials summed
    cs[0].causal = 1;
    cs[1] = base(2, 4, 2, 129, 200, 80, 32);  // GQA, chunks
    cs[1].mask = 3; cs[1].mshape = 7; cs[1].bias_ninf = 0.1; cs[1].softcap = 4.0f;
    cs[2] = base(4, 8, 4, 65, 65, 16, 16);    // enough heads for one chunk
    cs[2].window = 1; cs[2].wl = 7; cs[2].wr = 7; cs[2].layout = 1;
    cs[3] = base(1, 2, 1, 1000, 1000, 32, 32);  // long
    cs[3].causal = 1; cs[3].align = 1; cs[3].alibi = 1;
    for (int ci = 0; ci < 4; ci++) {
        bcall t;
        bcall_build(&t, &cs[ci]);
        CHECK(bcall_forward(&t) == ATTN_OK, "determinism: forward failed");
        float *saved[3];
        CHECK(bcall_run(&t, ATTN_PATH_FUSED, 1) == ATTN_OK, "determinism: 1 thread failed");
        for (int a = 0; a < 3; a++) {
            saved[a] = xcalloc(t.n[a], 4);
            memcpy(saved[a], t.got[a], (size_t)t.n[a] * 4);
        }
        static const int threads[4] = {2, 3, 2, 16};
        for (int ti = 0; ti < 4; ti++) {
            CHECK(bcall_run(&t, ATTN_PATH_FUSED, threads[ti]) == ATTN_OK, "determinism: run failed");
            CHECK(same_bits(&t, saved), "determinism: %d threads (run %d) differ from 1 thread [%s]",
                  threads[ti], ti, t.desc);
        }
        for (int a = 0; a < 3; a++) free(saved[a]);
        bcall_free(&t);
    }
}

/* ---- 3. misuse ----------------------------------------------------------------------------- */

static void misuse(void) {
    bcase c = base(2, 4, 2, 9, 11, 5, 6);
    bcall t;
    bcall_build(&t, &c);
    CHECK(bcall_forward(&t) == ATTN_OK, "misuse: forward failed");
    float dummy[8];
    uint8_t mask[4] = {1, 1, 1, 1};

    for (int m = 0;; m++) {
        attn_tensor q = t.q, k = t.k, v = t.v, o = t.o, d_o = t.d_o, lse = t.lse;
        attn_tensor dq = t.dq, dk = t.dk, dv = t.dv, extra;
        attn_tensor *pq = &q, *pdo = &d_o, *plse = &lse, *pdq = &dq, *pdk = &dk, *pdv = &dv;
        attn_options opt = t.opt;
        attn_status want;
        const char *what;
        int64_t kvl[2] = {11, 12};
        switch (m) {
        case 0: pq = NULL; want = ATTN_ERR_NULL; what = "q NULL"; break;
        case 1: pdo = NULL; want = ATTN_ERR_NULL; what = "d_o NULL"; break;
        case 2: plse = NULL; want = ATTN_ERR_NULL; what = "lse NULL"; break;
        case 3: pdq = NULL; want = ATTN_ERR_NULL; what = "dq NULL"; break;
        case 4: pdk = NULL; want = ATTN_ERR_NULL; what = "dk NULL"; break;
        case 5: pdv = NULL; want = ATTN_ERR_NULL; what = "dv NULL"; break;
        case 6: dv.data = NULL; want = ATTN_ERR_NULL; what = "dv data NULL"; break;
        /* 16-bit tensors are valid (test_backward_half); k and v must still agree */
        case 7: k.dtype = ATTN_F16; want = ATTN_ERR_DTYPE; what = "k float16, v float32"; break;
        case 8: d_o.dtype = ATTN_BOOL; want = ATTN_ERR_DTYPE; what = "d_o bool"; break;
        case 9: dq.dtype = ATTN_I32; want = ATTN_ERR_DTYPE; what = "dq int32"; break;
        case 10: d_o.shape[3] = 5; want = ATTN_ERR_SHAPE; what = "d_o Dv"; break;
        case 11: lse.shape[3] = 2; want = ATTN_ERR_SHAPE; what = "lse last dim"; break;
        case 12: lse.shape[2] = 8; want = ATTN_ERR_SHAPE; what = "lse Lq"; break;
        case 13: dq.shape[3] = 6; want = ATTN_ERR_SHAPE; what = "dq Dk"; break;
        case 14: dk.shape[1] = 4; want = ATTN_ERR_SHAPE; what = "dk Hkv"; break;
        case 15: dv.shape[2] = 10; want = ATTN_ERR_SHAPE; what = "dv Lk"; break;
        case 16: dq.stride[2] = 0; want = ATTN_ERR_STRIDE; what = "dq rows overlap"; break;
        case 17: dk.stride[1] = dk.stride[2]; want = ATTN_ERR_STRIDE; what = "dk heads overlap"; break;
        case 18: dv.stride[3] = 0; want = ATTN_ERR_STRIDE; what = "dv columns overlap"; break;
        case 19: dq.stride[0] = INT64_MAX; want = ATTN_ERR_OVERFLOW; what = "dq offsets overflow"; break;
        case 20: opt.lse = &t.lse; want = ATTN_ERR_VALUE; what = "options.lse set"; break;
        case 21:
            extra = attn_tensor_4d(dummy, ATTN_F32, 2, 4, 9, 11);
            opt.weights = &extra; want = ATTN_ERR_VALUE; what = "options.weights set"; break;
        case 22: q.shape[1] = 3; o.shape[1] = 3; d_o.shape[1] = 3; want = ATTN_ERR_HEADS; what = "Hq = 3, Hkv = 2"; break;
        case 23: opt.has_scale = 1; opt.scale = NAN; want = ATTN_ERR_VALUE; what = "scale NaN"; break;
        case 24: opt.path = (attn_path)7; want = ATTN_ERR_VALUE; what = "bad path"; break;
        case 25: opt.threads = -1; want = ATTN_ERR_VALUE; what = "threads -1"; break;
        case 26:
            extra = attn_tensor_4d(kvl, ATTN_I64, 2, 1, 1, 1);
            opt.kv_len = &extra; want = ATTN_ERR_VALUE; what = "kv_len > Lk"; break;
        case 27:
            extra = attn_tensor_4d(mask, ATTN_BOOL, 1, 1, 2, 2);
            opt.mask = &extra; want = ATTN_ERR_MASK; what = "mask shape"; break;
        case 28: opt.workspace = dummy; opt.workspace_bytes = sizeof dummy; want = ATTN_ERR_WORKSPACE; what = "workspace too small"; break;
        case 29: k.shape[3] = 4; want = ATTN_ERR_SHAPE; what = "k Dk"; break;
        case 30: o.shape[2] = 8; want = ATTN_ERR_SHAPE; what = "o Lq"; break;
        case 31: lse.dtype = ATTN_F16; want = ATTN_ERR_DTYPE; what = "lse float16"; break;
        default: want = ATTN_OK; what = NULL; break;
        }
        if (!what) break;
        for (int pi = 0; pi < 2; pi++) {
            opt.path = m == 24 ? opt.path : (pi ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED);
            fill_sentinel(t.dqb, t.ndqb);
            fill_sentinel(t.dkb, t.ndkb);
            fill_sentinel(t.dvb, t.ndvb);
            const attn_status st = attn_backward(pq, &k, &v, &o, pdo, plse, pdq, pdk, pdv, &opt);
            CHECK(st == want, "misuse %s (%s): status %d (%s), expected %d", what,
                  pi ? "reference" : "fused", (int)st, attn_last_error(), (int)want);
            CHECK(attn_last_error()[0] != '\0', "misuse %s: no detail", what);
            const int64_t w = count_written(t.dqb, t.ndqb) + count_written(t.dkb, t.ndkb) +
                              count_written(t.dvb, t.ndvb);
            CHECK(w == 0, "misuse %s (%s): %lld floats written", what, pi ? "reference" : "fused",
                  (long long)w);
            if (m != 28) {
                size_t bytes = 12345;
                const attn_status sw = attn_backward_workspace_size(pq, &k, &v, &o, pdo, plse, pdq,
                                                                    pdk, pdv, &opt, &bytes);
                /* the workspace query does not read data: a NULL data pointer or a kv_len
                 * value is not its business */
                if (m != 6 && m != 26)
                    CHECK(sw == want, "misuse %s: workspace query status %d, expected %d", what,
                          (int)sw, (int)want);
                CHECK(sw != ATTN_OK || bytes != 12345, "misuse %s: bytes not written", what);
            }
        }
    }
    size_t bytes;
    CHECK(attn_backward_workspace_size(&t.q, &t.k, &t.v, &t.o, &t.d_o, &t.lse, &t.dq, &t.dk,
                                       &t.dv, &t.opt, NULL) == ATTN_ERR_NULL,
          "misuse: workspace query with bytes NULL");

    /* the caller's workspace, exactly the size asked: the same bits as the call's own */
    for (int pi = 0; pi < 2; pi++) {
        attn_options opt = t.opt;
        opt.path = pi ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED;
        CHECK(attn_backward_workspace_size(&t.q, &t.k, &t.v, &t.o, &t.d_o, &t.lse, &t.dq, &t.dk,
                                           &t.dv, &opt, &bytes) == ATTN_OK,
              "workspace query failed");
        CHECK(bcall_run(&t, opt.path, 0) == ATTN_OK, "workspace: own run failed");
        float *saved[3];
        for (int a = 0; a < 3; a++) {
            saved[a] = xcalloc(t.n[a], 4);
            memcpy(saved[a], t.got[a], (size_t)t.n[a] * 4);
        }
        void *ws = malloc(bytes);
        attn_options keep = t.opt;
        t.opt.workspace = ws;
        t.opt.workspace_bytes = bytes;
        CHECK(bcall_run(&t, opt.path, 0) == ATTN_OK, "workspace: run with the caller's failed: %s",
              attn_last_error());
        CHECK(same_bits(&t, saved), "workspace: the caller's workspace changed the result");
        t.opt = keep;
        free(ws);
        for (int a = 0; a < 3; a++) free(saved[a]);
    }
    bcall_free(&t);

    /* empty sizes: Lq = 0 writes dk, dv as 0; Lk = 0 writes dq as 0; B = 0 nothing */
    static const int64_t empties[][7] = {{1, 2, 1, 0, 5, 3, 4}, {2, 2, 2, 4, 0, 3, 4},
                                         {0, 2, 1, 4, 5, 3, 4}, {1, 0, 3, 4, 5, 3, 4},
                                         {1, 2, 1, 4, 5, 0, 4}, {1, 2, 1, 4, 5, 3, 0}};
    for (int e = 0; e < 6; e++) {
        const int64_t *s = empties[e];
        for (int pi = 0; pi < 2; pi++) {
            bcase ce = base(s[0], s[1], s[2], s[3], s[4], s[5], s[6]);
            bcall te;
            bcall_build(&te, &ce);
            CHECK(bcall_forward(&te) == ATTN_OK, "empty %d: forward failed", e);
            CHECK(bcall_run(&te, pi ? ATTN_PATH_REFERENCE : ATTN_PATH_FUSED, 0) == ATTN_OK,
                  "empty %d: backward failed: %s", e, attn_last_error());
            for (int a = 0; a < 3; a++)
                CHECK(all_zero(te.got[a], te.n[a]) || (a == 2 && s[4] > 0 && s[3] > 0 && s[1] > 0),
                      "empty %d (%s): %s not all 0", e, pi ? "reference" : "fused", k_grad[a]);
            CHECK(outside_written(&te) == 0, "empty %d: wrote outside", e);
            bcall_free(&te);
        }
    }
}

int main(void) {
    masked_rows();
    poisoned_keys();
    determinism();
    misuse();
    return check_summary("backward_edge");
}
