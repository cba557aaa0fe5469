/*
 * ring_backward.c — the backward of ring attention over MPI: attn_ring_backward.
 *
 * The same ring and the same pieces as the forward (ring.c). At step s each process
 * runs attn_backward on its queries against the block of src from the forward's global
 * O and LSE (the gradient of attention restricted to a block of keys needs nothing
 * else), adds the pieces' dQ to its own float32 dQ, and their dK, dV to the block's
 * travelling float32 sums: the sums arrive from process r + 1 while the step computes,
 * take this process's contribution (incoming + own, always in that order) and leave for
 * r - 1; after P steps they are home. A late chunk's sums stop at process 0 with its K
 * and V and go straight home from there. Each float is produced in an order fixed by P
 * alone: bit-identical for any thread count and any timing. What is not here: the
 * checks and the blocks (ring.c), any attention arithmetic (libattn's).
 */
#include <stdlib.h>
#include <string.h>

#include "core/half.h"
#include "ring_internal.h"

/* x[i] += y[i] over n floats */
static void add_into(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

/* rows [q0, q0 + qn) of the dense [B, H, L, D] float32 buffers: acc += part */
static void add_rows(float *acc, const float *part, int64_t BH, int64_t L, int64_t D, int64_t q0,
                     int64_t qn) {
    for (int64_t bh = 0; bh < BH; bh++)
        add_into(acc + (bh * L + q0) * D, part + (bh * L + q0) * D, qn * D);
}

typedef struct bwd_io {
    const attn_tensor *q, *o, *d_o, *lse;
    const attn_tensor *dq_part;  // float32 [B, Hq, Lq_r, Dk]
    float *dq_acc;               // the same shape, dense
    void *mine;                  // this step's dK, dV of the block, float32 chunks
    void *tmp;                   // one piece's dK, dV, float32, one chunk
} bwd_io;

/* Step s: every piece's gradients; dQ into io->dq_acc, dK and dV into io->mine. */
static attn_status backward_step(const ring_call *rc, int s, void *block, const bwd_io *io,
                                 MPI_Request *req, int nreq) {
    const int src = (rc->r + s) % rc->P;
    ring_piece pc[RING_MAX_PIECES];
    const int n = ring_pieces(rc, s, pc);
    for (int c = 0; c < rc->chunks; c++) {
        attn_tensor mk, mv;
        ring_chunk_views(rc, io->mine, src, c, ATTN_F32, &mk, &mv);
        memset(mk.data, 0, ring_chunk_bytes(rc, mk.shape[2], 4));
    }
    for (int x = 0; x < n; x++) {
        attn_tensor kc, vc, mk, mv, tk, tv, len_t;
        int64_t len[64], *lenp = rc->B <= 64 ? len : malloc((size_t)rc->B * sizeof(int64_t));
        if (!lenp) return ring_fail(ATTN_ERR_NOMEM, "ring: out of memory");
        ring_chunk_views(rc, block, src, pc[x].c, rc->kv_dt, &kc, &vc);
        const int64_t nc = kc.shape[2], k0 = pc[x].k0, kn = pc[x].kn;
        const attn_tensor k = ring_rows(&kc, k0, kn), v = ring_rows(&vc, k0, kn);
        ring_chunk_views(rc, io->mine, src, pc[x].c, ATTN_F32, &mk, &mv);
        /* the piece's dK, dV: rows [k0, k0 + kn) of a whole chunk's float32 scratch */
        tk = attn_tensor_4d(io->tmp, ATTN_F32, rc->B, rc->Hkv, nc, rc->Dk);
        tv = attn_tensor_4d((char *)io->tmp + ((char *)mv.data - (char *)mk.data), ATTN_F32, rc->B,
                            rc->Hkv, nc, rc->Dv);
        const attn_tensor tkx = ring_rows(&tk, k0, kn), tvx = ring_rows(&tv, k0, kn);
        attn_tensor qx = ring_rows(io->q, pc[x].q0, pc[x].qn), ox = ring_rows(io->o, pc[x].q0, pc[x].qn);
        attn_tensor dox = ring_rows(io->d_o, pc[x].q0, pc[x].qn), lx = ring_rows(io->lse, pc[x].q0, pc[x].qn);
        attn_tensor dqx = ring_rows(io->dq_part, pc[x].q0, pc[x].qn);
        attn_options po = rc->opt;
        po.causal = pc[x].causal;
        po.has_window = pc[x].has_window;
        po.window_left = pc[x].left;
        po.window_right = pc[x].right;
        po.kv_len = ring_kv_len(rc, src, &pc[x], lenp, &len_t);
        attn_status st = attn_backward(&qx, &k, &v, &ox, &dox, &lx, &dqx, &tkx, &tvx, &po);
        if (lenp != len) free(lenp);
        if (st != ATTN_OK) return ring_fail(st, "step %d: %s", s, attn_last_error());
        add_rows(io->dq_acc, io->dq_part->data, rc->B * rc->Hq, rc->lq_r, rc->Dk, pc[x].q0, pc[x].qn);
        add_rows(mk.data, tk.data, rc->B * rc->Hkv, nc, rc->Dk, k0, kn);
        add_rows(mv.data, tv.data, rc->B * rc->Hkv, nc, rc->Dv, k0, kn);
        ring_progress(req, nreq);
    }
    return ATTN_OK;
}

/* float32 chunk (dK then dV, dense) into the caller's dk, dv rows [j0, j0 + n) */
static void store_chunk(const ring_call *rc, const void *sums, int64_t n, const attn_tensor *dk,
                        const attn_tensor *dv, int64_t j0) {
    const float *sk = sums, *sv = (const float *)((const char *)sums +
                                                  ring_pad64((size_t)(rc->B * rc->Hkv * n * rc->Dk) * 4));
    for (int64_t b = 0; b < rc->B; b++)
        for (int64_t g = 0; g < rc->Hkv; g++)
            for (int64_t j = 0; j < n; j++) {
                const int64_t row = (b * rc->Hkv + g) * n + j;
                for (int64_t d = 0; d < rc->Dk; d++)
                    attn_store(dk->dtype, dk->data, b * dk->stride[0] + g * dk->stride[1] +
                               (j0 + j) * dk->stride[2] + d * dk->stride[3], sk[row * rc->Dk + d]);
                for (int64_t d = 0; d < rc->Dv; d++)
                    attn_store(dv->dtype, dv->data, b * dv->stride[0] + g * dv->stride[1] +
                               (j0 + j) * dv->stride[2] + d * dv->stride[3], sv[row * rc->Dv + d]);
            }
}

/* The backward's buffers, in one allocation (ring_alloc): the two K/V blocks the ring
 * moves, the three accumulator blocks (two travelling, one this process's), a chunk of
 * scratch, the late chunk's sums coming home, dQ's accumulator and one step's part. */
typedef struct bwd_mem {
    char *mem;
    void *blk[2], *acc[2], *mine, *tmp, *late_home;
    float *dq_acc, *dq_part;
    size_t late_bytes;
    int64_t n_early, n_late;  // this process's key chunks' lengths (late: 0 without one)
} bwd_mem;

static attn_status bwd_mem_alloc(ring_call *rc, bwd_mem *m) {
    const int P = rc->P, r = rc->r;
    size_t kv_max = 0, acc_max = 0, chunk_max = 0;
    for (int p = 0; p < P; p++) {
        const size_t a = ring_block_bytes(rc, p, rc->kv_es, true), b = ring_block_bytes(rc, p, 4, true);
        kv_max = a > kv_max ? a : kv_max;
        acc_max = b > acc_max ? b : acc_max;
        for (int c = 0; c < rc->chunks; c++) {
            int64_t f, n;
            ring_key_chunk(rc, p, c, &f, &n);
            const size_t x = ring_chunk_bytes(rc, n, 4);
            chunk_max = x > chunk_max ? x : chunk_max;
        }
    }
    int64_t f_late = 0, f_early;
    m->n_late = 0;
    ring_key_chunk(rc, r, 0, &f_early, &m->n_early);
    if (rc->chunks == 2) ring_key_chunk(rc, r, 1, &f_late, &m->n_late);
    m->late_bytes = ring_chunk_bytes(rc, m->n_late, 4);
    const size_t dq_bytes = ring_pad64((size_t)(rc->B * rc->Hq * rc->lq_r * rc->Dk) * 4);
    const size_t total = 2 * kv_max + 3 * acc_max + chunk_max + m->late_bytes + 2 * dq_bytes;
    const attn_status st = ring_alloc(rc, total, acc_max > kv_max ? acc_max : kv_max, &m->mem);
    if (st != ATTN_OK) return st;
    char *at = m->mem;
    m->blk[0] = at, m->blk[1] = at + kv_max;
    at += 2 * kv_max;
    m->acc[0] = at, m->acc[1] = at + acc_max, m->mine = at + 2 * acc_max;
    at += 3 * acc_max;
    m->tmp = at, m->late_home = at + chunk_max;
    at += chunk_max + m->late_bytes;
    m->dq_acc = (float *)at, m->dq_part = (float *)(at + dq_bytes);
    memset(m->dq_acc, 0, dq_bytes);
    return ATTN_OK;
}

/* dQ's float32 accumulator [B, Hq, lq_r, Dk] into the caller's dq, rounded to its dtype */
static void store_dq(const ring_call *rc, const float *dq_acc, const attn_tensor *dq) {
    for (int64_t b = 0; b < rc->B; b++)
        for (int64_t h = 0; h < rc->Hq; h++)
            for (int64_t i = 0; i < rc->lq_r; i++)
                for (int64_t d = 0; d < rc->Dk; d++)
                    attn_store(dq->dtype, dq->data, b * dq->stride[0] + h * dq->stride[1] +
                               i * dq->stride[2] + d * dq->stride[3],
                               dq_acc[((b * rc->Hq + h) * rc->lq_r + i) * rc->Dk + d]);
}

/* The messages of the travelling sums in flight: the sends from acc[x] (the ring's, and
 * process 0's late one home) pending until acc[x] is reused, the next step's incoming
 * sums, and this process's late chunk's sums coming home from process 0. */
typedef struct bwd_flow {
    MPI_Request acc_send[2][2], acc_recv, late_recv;
    int n_acc_send[2];
} bwd_flow;

/* After step s: the block's sums, incoming (none at step 0) + this process's, sent on to
 * r - 1 (the late chunk's, at process 0, home), and the next step's incoming posted. */
static void pass_sums(const ring_call *rc, int s, const bwd_mem *m, bwd_flow *f,
                      attn_ring_stats *stats) {
    const int P = rc->P, r = rc->r, to = (r + P - 1) % P, from = (r + 1) % P;
    const int src = (r + s) % P;
    const size_t held = ring_block_bytes(rc, src, 4, ring_needs_late(rc, r, s));
    float *sums = m->acc[s % 2];
    if (s == 0) {
        memcpy(sums, m->mine, held);
    } else {
        ring_wait(&f->acc_recv, 1, stats);
        add_into(sums, m->mine, (int64_t)(held / 4));
    }
    if (P > 1) {
        const bool late_on = ring_needs_late(rc, to, s + 1) && s + 1 < P;
        ring_isend(rc, sums, ring_block_bytes(rc, src, 4, late_on), to, RING_TAG_ACC,
                   &f->acc_send[s % 2][0], stats);
        f->n_acc_send[s % 2] = 1;
        if (r == 0 && rc->chunks == 2) {  // the late chunk's last user: its sums go home
            const size_t early = ring_block_bytes(rc, src, 4, false);
            if (src == 0)
                memcpy(m->late_home, (char *)sums + early, m->late_bytes);
            else
                ring_isend(rc, (char *)sums + early, ring_block_bytes(rc, src, 4, true) - early, src,
                           RING_TAG_LATE, &f->acc_send[s % 2][f->n_acc_send[s % 2]++], stats);
        }
        /* the next step's incoming sums (after the last step: this block's own) */
        const int nx = (s + 1) % 2;
        ring_wait(f->acc_send[nx], f->n_acc_send[nx], stats);
        f->n_acc_send[nx] = 0;
        ring_irecv(rc, m->acc[nx], ring_block_bytes(rc, (r + s + 1) % P, 4, ring_needs_late(rc, r, s + 1) && s + 1 < P),
                   from, RING_TAG_ACC, &f->acc_recv);
    }
}

/* The P steps: K and V move on as in the forward while a step computes, its sums after
 * it; then the last messages in. *home gets this process's early chunk's finished sums
 * (the late chunk's are in m->late_home). Returns this process's first error. */
static attn_status backward_ring(const ring_call *rc, const bwd_mem *m, const bwd_io *io,
                                 attn_ring_stats *stats, const void **home) {
    const int P = rc->P, r = rc->r, to = (r + P - 1) % P, from = (r + 1) % P;
    attn_status st = ATTN_OK;
    bwd_flow f = {.acc_recv = MPI_REQUEST_NULL, .late_recv = MPI_REQUEST_NULL, .n_acc_send = {0, 0}};
    if (rc->chunks == 2 && r != 0 && P > 1)
        ring_irecv(rc, m->late_home, m->late_bytes, 0, RING_TAG_LATE, &f.late_recv);
    for (int s = 0; s < P; s++) {
        const int src = (r + s) % P;
        MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
        int nreq = 0;
        if (s + 1 < P) {  // K and V move on as in the forward
            const int next = (r + s + 1) % P;
            ring_irecv(rc, m->blk[(s + 1) % 2], ring_block_bytes(rc, next, rc->kv_es, ring_needs_late(rc, r, s + 1)),
                       from, RING_TAG_KV, &req[nreq++]);
            ring_isend(rc, m->blk[s % 2], ring_block_bytes(rc, src, rc->kv_es, ring_needs_late(rc, to, s + 1)),
                       to, RING_TAG_KV, &req[nreq++], stats);
        }
        const double c0 = MPI_Wtime();
        if (st == ATTN_OK) {
            /* the travelling sums of the previous step move with this step's K and V */
            MPI_Request all[4] = {req[0], req[1], f.acc_recv, MPI_REQUEST_NULL};
            st = backward_step(rc, s, m->blk[s % 2], io, all, 3);
            req[0] = all[0], req[1] = all[1], f.acc_recv = all[2];
        }
        if (stats) stats->compute_s += MPI_Wtime() - c0;
        ring_wait(req, nreq, stats);
        pass_sums(rc, s, m, &f, stats);
    }
    *home = m->acc[0];
    if (P > 1) {
        ring_wait(&f.acc_recv, 1, stats);
        *home = m->acc[P % 2];
        for (int x = 0; x < 2; x++) ring_wait(f.acc_send[x], f.n_acc_send[x], stats);
        ring_wait(&f.late_recv, 1, stats);
    } else if (rc->chunks == 2) {
        memcpy(m->late_home, (const char *)m->acc[0] + ring_block_bytes(rc, 0, 4, false), m->late_bytes);
    }
    return st;
}

attn_status attn_ring_backward(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                               const attn_tensor *o, const attn_tensor *d_o, const attn_tensor *lse,
                               const attn_tensor *dq, const attn_tensor *dk, const attn_tensor *dv,
                               const attn_options *opt, MPI_Comm comm, attn_ring_stats *stats) {
    const double t0 = MPI_Wtime();
    if (stats) *stats = (attn_ring_stats){0};
    ring_call rc;
    const attn_tensor *bwd[5] = {d_o, lse, dq, dk, dv};
    attn_status st = ring_begin(&rc, q, k, v, o, opt, comm, bwd);
    if (st != ATTN_OK) {
        ring_end(&rc);
        return st;
    }
    bwd_mem bm;
    st = bwd_mem_alloc(&rc, &bm);
    if (st != ATTN_OK) return st;
    const attn_tensor dq_part_t = attn_tensor_4d(bm.dq_part, ATTN_F32, rc.B, rc.Hq, rc.lq_r, rc.Dk);
    const bwd_io io = {q, o, d_o, lse, &dq_part_t, bm.dq_acc, bm.mine, bm.tmp};
    ring_pack(&rc, k, v, bm.blk[0]);
    const void *home;
    st = backward_ring(&rc, &bm, &io, stats, &home);
    const double a0 = MPI_Wtime();  // waiting here is waiting for the slowest process
    st = ring_agree(&rc, st);
    if (stats) stats->wait_s += MPI_Wtime() - a0;
    if (st == ATTN_OK) {
        store_chunk(&rc, home, bm.n_early, dk, dv, 0);
        if (rc.chunks == 2) store_chunk(&rc, bm.late_home, bm.n_late, dk, dv, bm.n_early);
        store_dq(&rc, bm.dq_acc, dq);
    }
    free(bm.mem);
    ring_end(&rc);
    if (stats) {
        stats->steps = rc.P;
        stats->total_s = MPI_Wtime() - t0;
    }
    if (st == ATTN_OK) ring_ok();
    return st;
}
