/*
 * ring.c — ring attention over MPI: the checked call and the blocks that travel (shared
 *          with ring_backward.c), attn_ring_slice, and the forward attn_ring_forward.
 *
 * Each process holds the queries, keys and values of its slice of the sequence. At step
 * s = 0 .. P-1 it attends its queries to the K/V block of process src = (r + s) mod P
 * with attn_forward (an lse output: a partial result) while the block moves on to
 * process r - 1 with non-blocking MPI and the next one arrives from r + 1, and merges
 * each partial into a running float32 (O, LSE) with attn_merge, in step order and piece
 * order. Every partial is one attn_forward call on fixed arguments and the merge order
 * is fixed, so the result does not depend on the thread count or on the timing of the
 * messages. What is not here: any attention arithmetic (libattn's), the backward
 * (ring_backward.c).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/half.h"
#include "ring_internal.h"

static _Thread_local char g_ring_error[512];

const char *attn_ring_last_error(void) { return g_ring_error; }

attn_status ring_fail(attn_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_ring_error, sizeof g_ring_error, fmt, ap);
    va_end(ap);
    return status;
}

void ring_ok(void) { g_ring_error[0] = '\0'; }

attn_status attn_ring_slice(int64_t L, int size, int rank, bool zigzag, int64_t first[2],
                            int64_t count[2]) {
    if (!first || !count) return ring_fail(ATTN_ERR_NULL, "attn_ring_slice: NULL output");
    if (size < 1 || rank < 0 || rank >= size || L < 0)
        return ring_fail(ATTN_ERR_VALUE, "attn_ring_slice: L = %lld, size = %d, rank = %d",
                         (long long)L, size, rank);
    /* c * L / parts without overflow: L < 2^63 and parts <= 2^32 */
    const int64_t parts = zigzag ? 2 * (int64_t)size : size;
#define CUT(c) ((int64_t)((__int128)(c) * L / parts))
    first[0] = CUT(rank);
    count[0] = CUT(rank + 1) - first[0];
    first[1] = count[1] = 0;
    if (zigzag) {
        const int64_t late = parts - 1 - rank;
        first[1] = CUT(late);
        count[1] = CUT(late + 1) - first[1];
    }
#undef CUT
    return ATTN_OK;
}

void ring_key_chunk(const ring_call *rc, int src, int c, int64_t *first, int64_t *n) {
    int64_t f[2], cnt[2];
    attn_ring_slice(rc->Lk, rc->P, src, rc->causal, f, cnt);
    *first = f[c];
    *n = cnt[c];
}

void ring_query_chunk(const ring_call *rc, int src, int c, int64_t *first, int64_t *n) {
    int64_t f[2], cnt[2];
    attn_ring_slice(rc->Lq, rc->P, src, rc->causal, f, cnt);
    *first = f[c];
    *n = cnt[c];
}

bool ring_needs_late(const ring_call *rc, int rr, int s) {
    return rc->chunks == 2 && rr + s < rc->P;
}

size_t ring_chunk_bytes(const ring_call *rc, int64_t n, size_t es) {
    const size_t rows = (size_t)(rc->B * rc->Hkv * n);
    return ring_pad64(rows * (size_t)rc->Dk * es) + ring_pad64(rows * (size_t)rc->Dv * es);
}

void ring_chunk_views(const ring_call *rc, void *block, int src, int c, attn_dtype dt,
                      attn_tensor *k, attn_tensor *v) {
    const size_t es = ring_dtype_bytes(dt);
    char *at = block;
    int64_t first, n;
    for (int x = 0; x < c; x++) {
        ring_key_chunk(rc, src, x, &first, &n);
        at += ring_chunk_bytes(rc, n, es);
    }
    ring_key_chunk(rc, src, c, &first, &n);
    *k = attn_tensor_4d(at, dt, rc->B, rc->Hkv, n, rc->Dk);
    *v = attn_tensor_4d(at + ring_pad64((size_t)(rc->B * rc->Hkv * n * rc->Dk) * es), dt, rc->B,
                        rc->Hkv, n, rc->Dv);
}

/* rows [j0, j0 + n) of src (any strides, element es bytes) into the dense dst */
static void pack_rows(const attn_tensor *src, int64_t j0, int64_t n, size_t es, char *dst) {
    const char *base = src->data;
    const int64_t *st = src->stride;
    size_t at = 0;
    for (int64_t b = 0; b < src->shape[0]; b++)
        for (int64_t g = 0; g < src->shape[1]; g++)
            for (int64_t j = j0; j < j0 + n; j++)
                for (int64_t d = 0; d < src->shape[3]; d++, at += es)
                    memcpy(dst + at, base + (b * st[0] + g * st[1] + j * st[2] + d * st[3]) * (int64_t)es, es);
}

void ring_pack(const ring_call *rc, const attn_tensor *k, const attn_tensor *v, void *block) {
    int64_t local = 0;
    for (int c = 0; c < rc->chunks; c++) {
        attn_tensor kc, vc;
        ring_chunk_views(rc, block, rc->r, c, rc->kv_dt, &kc, &vc);
        pack_rows(k, local, kc.shape[2], rc->kv_es, kc.data);
        pack_rows(v, local, vc.shape[2], rc->kv_es, vc.data);
        local += kc.shape[2];
    }
}

bool ring_clip(const ring_call *rc, int64_t qf, int64_t qn, int64_t kf, int64_t kn,
               ring_piece *out) {
    if (qn <= 0 || kn <= 0) return false;
    /* key - query = d + j - i for local row i and key j: the call's band is j - i in
     * [a, b], clamped to what the rectangle holds (-(qn - 1) .. kn - 1) */
    const int64_t d = kf - qf, lo_all = -(qn - 1), hi_all = kn - 1;
    int64_t a = rc->has_lo ? rc->lo - d : lo_all, b = rc->has_hi ? rc->hi - d : hi_all;
    if (a < lo_all) a = lo_all;
    if (b > hi_all) b = hi_all;
    if (a > b) return false;  // above the diagonal, or outside every row's window
    int64_t q0 = 0, k0 = 0;
    if (a > 0) {  // no row sees keys j < a: they are dropped, and the band starts at 0
        k0 = a, kn -= a, b -= a, a = 0;
    } else if (b < 0) {  // rows i < -b see no key: dropped, the band ends at 0
        q0 = -b, qn += b, a -= b, b = 0;
    }
    if (kn > qn + b) kn = qn + b;  // keys beyond the last row's reach
    if (qn > kn - a) qn = kn - a;  // rows whose band starts beyond the last key
    *out = (ring_piece){.q0 = q0, .qn = qn, .k0 = k0, .kn = kn};
    const bool left_all = a <= -(qn - 1), right_all = b >= kn - 1;
    if (left_all && right_all) return true;  // the whole rectangle: no mask
    if (left_all && b == 0) {  // the top-left causal triangle
        out->causal = true;
        return true;
    }
    out->has_window = true;
    out->left = left_all ? -1 : -a;
    out->right = right_all ? -1 : b;
    return true;
}

static bool whole(const ring_piece *p) { return !p->causal && !p->has_window; }

int ring_pieces(const ring_call *rc, int s, ring_piece out[RING_MAX_PIECES]) {
    const int src = (rc->r + s) % rc->P;
    int n = 0;
    for (int c = 0; c < rc->chunks; c++) {
        int64_t kf, kn, local = 0;
        ring_key_chunk(rc, src, c, &kf, &kn);
        for (int cq = 0; cq < rc->chunks; cq++) {
            int64_t qf, qn;
            ring_piece p;
            ring_query_chunk(rc, rc->r, cq, &qf, &qn);
            if (ring_clip(rc, qf, qn, kf, kn, &p)) {
                p.q0 += local;
                p.c = c;
                ring_piece *last = n > 0 ? &out[n - 1] : NULL;
                if (last && last->c == c && whole(last) && whole(&p) && last->k0 == p.k0 &&
                    last->kn == p.kn && last->q0 + last->qn == p.q0)
                    last->qn += p.qn;
                else
                    out[n++] = p;
            }
            local += qn;
        }
    }
    return n;
}

/* Whether process h needs chunk c of src's block. */
static bool chunk_needed(const ring_call *rc, int h, int src, int c) {
    int64_t kf, kn;
    ring_key_chunk(rc, src, c, &kf, &kn);
    for (int cq = 0; cq < rc->chunks; cq++) {
        int64_t qf, qn;
        ring_piece p;
        ring_query_chunk(rc, h, cq, &qf, &qn);
        if (ring_clip(rc, qf, qn, kf, kn, &p)) return true;
    }
    return false;
}

int ring_chunks_needed_from(const ring_call *rc, int src, int s) {
    int need = 0;
    for (int t = s; t < rc->P && need < rc->chunks; t++) {
        const int h = (src - t % rc->P + rc->P) % rc->P;  // the block's holder at step t
        for (int c = rc->chunks - 1; c >= need; c--)
            if (chunk_needed(rc, h, src, c)) {
                need = c + 1;
                break;
            }
    }
    return need;
}

attn_tensor ring_rows(const attn_tensor *t, int64_t first, int64_t n) {
    attn_tensor x = *t;
    x.data = (char *)t->data + first * t->stride[2] * (int64_t)ring_dtype_bytes(t->dtype);
    x.shape[2] = n;
    return x;
}

const attn_tensor *ring_kv_len(const ring_call *rc, int src, const ring_piece *pc,
                               int64_t *buf, attn_tensor *t) {
    if (!rc->kv_len) return NULL;
    int64_t first, n;
    ring_key_chunk(rc, src, pc->c, &first, &n);
    first += pc->k0;
    for (int64_t b = 0; b < rc->B; b++) {
        const int64_t x = rc->kv_len[b] - first;
        buf[b] = x < 0 ? 0 : x > pc->kn ? pc->kn : x;
    }
    *t = (attn_tensor){buf, ATTN_I64, {rc->B, 1, 1, 1}, {1, 1, 1, 1}};
    return t;
}

void ring_isend(const ring_call *rc, const void *buf, size_t bytes, int to, int tag,
                MPI_Request *req, attn_ring_stats *st) {
    MPI_Isend(buf, (int)(bytes / 64), rc->unit, to, tag, rc->comm, req);
    if (st) st->bytes_sent += (int64_t)bytes;
}

void ring_irecv(const ring_call *rc, void *buf, size_t bytes, int from, int tag, MPI_Request *req) {
    MPI_Irecv(buf, (int)(bytes / 64), rc->unit, from, tag, rc->comm, req);
}

void ring_wait(MPI_Request *req, int n, attn_ring_stats *st) {
    const double t0 = MPI_Wtime();
    MPI_Waitall(n, req, MPI_STATUSES_IGNORE);
    const double w = MPI_Wtime() - t0;
    if (st) {
        st->wait_s += w;
        if (w > st->max_wait_s) st->max_wait_s = w;
    }
}

size_t ring_prefix_bytes(const ring_call *rc, int src, size_t es, int n) {
    size_t b = 0;
    for (int c = 0; c < n && c < rc->chunks; c++) {
        int64_t f, cnt;
        ring_key_chunk(rc, src, c, &f, &cnt);
        b += ring_chunk_bytes(rc, cnt, es);
    }
    return b;
}

size_t ring_block_bytes(const ring_call *rc, int src, size_t es, bool late) {
    int64_t f, n;
    ring_key_chunk(rc, src, 0, &f, &n);
    size_t b = ring_chunk_bytes(rc, n, es);
    if (late && rc->chunks == 2) {
        ring_key_chunk(rc, src, 1, &f, &n);
        b += ring_chunk_bytes(rc, n, es);
    }
    return b;
}

attn_status ring_alloc(ring_call *rc, size_t bytes, size_t max_message, char **mem) {
    attn_status st = ATTN_OK;
    *mem = NULL;
    if (max_message / 64 > INT32_MAX || bytes > SIZE_MAX - 128)
        st = ring_fail(ATTN_ERR_OVERFLOW, "a block exceeds MPI's count");
    else if (!(*mem = aligned_alloc(64, ring_pad64(bytes) + 64)))
        st = ring_fail(ATTN_ERR_NOMEM, "ring: could not allocate %zu bytes", bytes);
    st = ring_agree(rc, st);
    if (st != ATTN_OK) {
        free(*mem);
        *mem = NULL;
        ring_end(rc);
    }
    return st;
}

void ring_progress(MPI_Request *req, int n) {
    int done;
    if (n > 0) MPI_Testall(n, req, &done, MPI_STATUSES_IGNORE);
}

attn_status ring_agree(const ring_call *rc, attn_status st) {
    int mine = (int)st, all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MAX, rc->comm);
    if (all != ATTN_OK && mine == ATTN_OK)
        ring_fail((attn_status)all, "another process refused the call: %s",
                  attn_status_string((attn_status)all));
    return (attn_status)all;
}

/* ---- checking a call ------------------------------------------------------------------ */

/* This process's checks: the tensors through libattn's own workspace query on the local
 * shapes, the options the ring does not take. */
static attn_status check_local(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                               const attn_tensor *o, const attn_options *opt,
                               const attn_tensor *const *bwd) {
    const bool backward = bwd != NULL;
    /* a mask or bias [.., Lq, Lk] would have to be cut into the ring's blocks on every
     * process (each holds only its rows of it): refused, as are ALiBi and the weights;
     * sinks, which each partial result would count again; and dropout, whose pieces would
     * draw the mask of their own (j, Lk), not the whole call's */
    if (opt && (opt->block_mask || opt->score_mod || opt->key_scores))
        return ring_fail(ATTN_ERR_UNSUPPORTED, "the ring takes no %s",
                         opt->block_mask ? "block mask" : opt->score_mod ? "score function"
                                                                         : "eviction scores");
    if (opt && (opt->mask || opt->bias || opt->alibi_slopes || opt->weights || opt->sinks ||
                opt->d_sinks || opt->dropout_p != 0.0f))
        return ring_fail(ATTN_ERR_UNSUPPORTED, "the ring takes no %s",
                         opt->mask ? "mask" : opt->bias ? "bias" : opt->alibi_slopes ? "ALiBi"
                         : opt->weights ? "weights" : opt->dropout_p != 0.0f ? "dropout" : "sinks");
    if (backward && opt && opt->lse)
        return ring_fail(ATTN_ERR_VALUE, "options.lse must be NULL in attn_ring_backward");
    /* the reference backward recomputes each row's softmax over the keys it is given, so
     * a block of keys alone cannot take the global LSE there */
    if (backward && opt && opt->path == ATTN_PATH_REFERENCE)
        return ring_fail(ATTN_ERR_UNSUPPORTED, "the ring's backward runs on the fused path only");
    attn_options lo = opt ? *opt : (attn_options){0};
    lo.kv_len = NULL;
    lo.causal = false;
    lo.workspace = NULL;
    size_t bytes;
    attn_status st = backward ? attn_backward_workspace_size(q, k, v, o, bwd[0], bwd[1], bwd[2],
                                                             bwd[3], bwd[4], &lo, &bytes)
                              : attn_forward_workspace_size(q, k, v, o, &lo, &bytes);
    if (st != ATTN_OK) return ring_fail(st, "%s", attn_last_error());
    /* the ring slices, packs and sends rows of 16- and 32-bit elements; a float64 or
     * q8_0 tensor (whose rows are blocks), valid for attn_forward, is refused before
     * anything is sliced */
    const attn_tensor *const tens[] = {q, k, v, o};
    const char *const names[] = {"q", "k", "v", "o"};
    for (int x = 0; x < 4; x++)
        if (tens[x] && tens[x]->dtype != ATTN_F32 && tens[x]->dtype != ATTN_F16 &&
            tens[x]->dtype != ATTN_BF16)
            return ring_fail(ATTN_ERR_UNSUPPORTED, "the ring takes float32, float16 and bfloat16 "
                             "tensors (%s is %s)", names[x], attn_dtype_name(tens[x]->dtype));
    return ATTN_OK;
}

enum { F_STATUS, F_B, F_HQ, F_HKV, F_DK, F_DV, F_LQ, F_LK, F_QDT, F_KVDT, F_CAUSAL, F_COUNT };

/* The call's options as the ring runs them: the global key lengths read once (kv_len),
 * the causal and window band as a range of key - query on the diagonal, and the options
 * each piece's call takes (no window, kv_len, LSE, causal or workspace of the caller's:
 * the ring applies those itself). */
static attn_status ring_options(ring_call *rc, const attn_options *opt) {
    attn_status st = ATTN_OK;
    /* kv_len: the global key lengths, read here once */
    const attn_tensor *t = opt ? opt->kv_len : NULL;
    if (t) {
        if (rc->causal && opt->align == ATTN_ALIGN_BOTTOM_RIGHT)
            st = ring_fail(ATTN_ERR_UNSUPPORTED, "causal bottom-right with kv_len is not ring-split");
        else if (!t->data || (t->dtype != ATTN_I32 && t->dtype != ATTN_I64))
            st = ring_fail(ATTN_ERR_DTYPE, "kv_len: int32 or int64 data expected");
        else if (t->shape[0] != rc->B)
            st = ring_fail(ATTN_ERR_SHAPE, "kv_len: %lld entries, expected B = %lld",
                           (long long)t->shape[0], (long long)rc->B);
        else if (!(rc->kv_len = malloc((size_t)(rc->B > 0 ? rc->B : 1) * sizeof(int64_t))))
            st = ring_fail(ATTN_ERR_NOMEM, "ring: out of memory");
        for (int64_t b = 0; st == ATTN_OK && b < rc->B; b++) {
            const int64_t x = t->dtype == ATTN_I32 ? ((const int32_t *)t->data)[b * t->stride[0]]
                                                   : ((const int64_t *)t->data)[b * t->stride[0]];
            if (x < 0 || x > rc->Lk)
                st = ring_fail(ATTN_ERR_VALUE, "kv_len[%lld] = %lld outside [0, Lk = %lld]",
                               (long long)b, (long long)x, (long long)rc->Lk);
            rc->kv_len[b] = x;
        }
    }
    /* the band key - query in [lo, hi] on the call's diagonal: i (top-left) or
     * i + Lk - Lq (bottom-right; per batch with kv_len, which is not ring-split) */
    const bool win = opt && opt->has_window;
    if (st == ATTN_OK && win && t && opt->align == ATTN_ALIGN_BOTTOM_RIGHT)
        st = ring_fail(ATTN_ERR_UNSUPPORTED, "a window aligned bottom-right with kv_len is not "
                       "ring-split");
    const int64_t shift = opt && opt->align == ATTN_ALIGN_BOTTOM_RIGHT ? rc->Lk - rc->Lq : 0;
    const int64_t reach = rc->Lq + rc->Lk;  // a window side beyond it is unbounded
    if (rc->causal) rc->has_hi = true, rc->hi = shift;
    if (win && opt->window_left >= 0 && opt->window_left <= reach)
        rc->has_lo = true, rc->lo = shift - opt->window_left;
    if (win && opt->window_right >= 0 && opt->window_right <= reach &&
        (!rc->has_hi || shift + opt->window_right < rc->hi))
        rc->has_hi = true, rc->hi = shift + opt->window_right;
    rc->opt = opt ? *opt : (attn_options){0};
    rc->opt.has_window = false;
    rc->opt.window_left = rc->opt.window_right = 0;
    rc->opt.kv_len = NULL;
    rc->opt.lse = NULL;
    rc->opt.causal = false;
    rc->opt.align = ATTN_ALIGN_TOP_LEFT;
    rc->opt.workspace = NULL;
    rc->opt.workspace_bytes = 0;
    return st;
}

attn_status ring_begin(ring_call *rc, const attn_tensor *q, const attn_tensor *k,
                       const attn_tensor *v, const attn_tensor *o, const attn_options *opt,
                       MPI_Comm comm, const attn_tensor *const *bwd) {
    *rc = (ring_call){.comm = comm, .unit = MPI_DATATYPE_NULL};
    MPI_Comm_size(comm, &rc->P);
    MPI_Comm_rank(comm, &rc->r);
    MPI_Type_contiguous(64, MPI_BYTE, &rc->unit);
    MPI_Type_commit(&rc->unit);

    attn_status st = check_local(q, k, v, o, opt, bwd);
    int64_t mine[F_COUNT] = {0};
    mine[F_STATUS] = st;
    if (st == ATTN_OK) {
        mine[F_B] = q->shape[0], mine[F_HQ] = q->shape[1], mine[F_HKV] = k->shape[1];
        mine[F_DK] = q->shape[3], mine[F_DV] = v->shape[3];
        mine[F_LQ] = q->shape[2], mine[F_LK] = k->shape[2];
        mine[F_QDT] = q->dtype, mine[F_KVDT] = k->dtype;
        mine[F_CAUSAL] = opt && opt->causal;
    }
    int64_t *all = malloc(sizeof mine * (size_t)rc->P);
    if (!all) return ring_fail(ATTN_ERR_NOMEM, "ring: out of memory");  // collective failure is moot
    MPI_Allgather(mine, F_COUNT, MPI_INT64_T, all, F_COUNT, MPI_INT64_T, comm);
    int64_t worst = 0;
    for (int p = 0; p < rc->P; p++)
        if (all[p * F_COUNT + F_STATUS] > worst) worst = all[p * F_COUNT + F_STATUS];
    if (worst != ATTN_OK) {
        free(all);
        if (st == ATTN_OK)
            ring_fail((attn_status)worst, "another process refused the call: %s",
                      attn_status_string((attn_status)worst));
        return (attn_status)worst;
    }
    /* every process must describe the same call, with its own slice */
    for (int p = 0; p < rc->P; p++) {
        const int64_t *x = all + p * F_COUNT;
        for (int f = F_B; f < F_COUNT; f++)
            if (f != F_LQ && f != F_LK && x[f] != mine[f]) {
                st = ring_fail(ATTN_ERR_SHAPE, "process %d's call differs from process %d's "
                               "(field %d: %lld against %lld)", p, rc->r, f,
                               (long long)x[f], (long long)mine[f]);
                free(all);
                return st;
            }
        rc->Lq += x[F_LQ];
        rc->Lk += x[F_LK];
    }
    rc->causal = mine[F_CAUSAL];
    rc->chunks = rc->causal ? 2 : 1;
    rc->B = mine[F_B], rc->Hq = mine[F_HQ], rc->Hkv = mine[F_HKV];
    rc->Dk = mine[F_DK], rc->Dv = mine[F_DV];
    rc->lq_r = mine[F_LQ], rc->lk_r = mine[F_LK];
    rc->q_dt = (attn_dtype)mine[F_QDT], rc->kv_dt = (attn_dtype)mine[F_KVDT];
    rc->kv_es = ring_dtype_bytes(rc->kv_dt);
    for (int p = 0; p < rc->P && st == ATTN_OK; p++) {
        int64_t fq[2], nq[2], fk[2], nk[2];
        attn_ring_slice(rc->Lq, rc->P, p, rc->causal, fq, nq);
        attn_ring_slice(rc->Lk, rc->P, p, rc->causal, fk, nk);
        if (all[p * F_COUNT + F_LQ] != nq[0] + nq[1] || all[p * F_COUNT + F_LK] != nk[0] + nk[1])
            st = ring_fail(ATTN_ERR_SHAPE, "process %d holds %lld query and %lld key rows; "
                           "attn_ring_slice gives %lld and %lld of Lq = %lld, Lk = %lld", p,
                           (long long)all[p * F_COUNT + F_LQ], (long long)all[p * F_COUNT + F_LK],
                           (long long)(nq[0] + nq[1]), (long long)(nk[0] + nk[1]),
                           (long long)rc->Lq, (long long)rc->Lk);
    }
    free(all);
    if (st != ATTN_OK) return st;  // every process found the same
    if (rc->causal && rc->Lq != rc->Lk)
        return ring_fail(ATTN_ERR_UNSUPPORTED, "causal ring attention needs Lq = Lk (%lld, %lld)",
                         (long long)rc->Lq, (long long)rc->Lk);

    st = ring_options(rc, opt);
    return ring_agree(rc, st);
}

void ring_end(ring_call *rc) {
    free(rc->kv_len);
    rc->kv_len = NULL;
    if (rc->unit != MPI_DATATYPE_NULL) MPI_Type_free(&rc->unit);
}

/* ---- the forward ----------------------------------------------------------------------- */

/* The forward's step s: every piece's partial, merged into (acc, acc_lse) in order. The
 * step's messages (req, n) are prodded between pieces (ring_progress). */
static attn_status forward_step(const ring_call *rc, int s, void *block, const attn_tensor *q,
                                const attn_tensor *acc, const attn_tensor *acc_lse,
                                const attn_tensor *part, const attn_tensor *part_lse,
                                MPI_Request *req, int nreq) {
    const int src = (rc->r + s) % rc->P;
    ring_piece pc[RING_MAX_PIECES];
    const int n = ring_pieces(rc, s, pc);
    for (int x = 0; x < n; x++) {
        attn_tensor kc, vc, len_t;
        int64_t len[64], *lenp = rc->B <= 64 ? len : malloc((size_t)rc->B * sizeof(int64_t));
        if (!lenp) return ring_fail(ATTN_ERR_NOMEM, "ring: out of memory");
        ring_chunk_views(rc, block, src, pc[x].c, rc->kv_dt, &kc, &vc);
        const attn_tensor k = ring_rows(&kc, pc[x].k0, pc[x].kn), v = ring_rows(&vc, pc[x].k0, pc[x].kn);
        attn_tensor qx = ring_rows(q, pc[x].q0, pc[x].qn), ox = ring_rows(part, pc[x].q0, pc[x].qn);
        attn_tensor lx = ring_rows(part_lse, pc[x].q0, pc[x].qn);
        attn_options po = rc->opt;
        po.causal = pc[x].causal;
        po.has_window = pc[x].has_window;
        po.window_left = pc[x].left;
        po.window_right = pc[x].right;
        po.kv_len = ring_kv_len(rc, src, &pc[x], lenp, &len_t);
        po.lse = &lx;
        attn_status st = attn_forward(&qx, &k, &v, &ox, &po);
        if (st == ATTN_OK) {
            attn_tensor parts[2] = {ring_rows(acc, pc[x].q0, pc[x].qn), ox};
            attn_tensor lses[2] = {ring_rows(acc_lse, pc[x].q0, pc[x].qn), lx};
            st = attn_merge(2, parts, lses, &parts[0], &lses[0], rc->opt.threads);
        }
        ring_progress(req, nreq);
        if (lenp != len) free(lenp);
        if (st != ATTN_OK) return ring_fail(st, "step %d: %s", s, attn_last_error());
    }
    return ATTN_OK;
}

attn_status attn_ring_forward(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                              const attn_tensor *o, const attn_options *opt, MPI_Comm comm,
                              attn_ring_stats *stats) {
    const double t0 = MPI_Wtime();
    if (stats) *stats = (attn_ring_stats){0};
    ring_call rc;
    attn_status st = ring_begin(&rc, q, k, v, o, opt, comm, NULL);
    if (st != ATTN_OK) {
        ring_end(&rc);
        return st;
    }
    /* two blocks (the one attended, the one arriving), the running (O, LSE), a partial */
    size_t block_bytes = 0;
    for (int p = 0; p < rc.P; p++) {
        const size_t b = ring_block_bytes(&rc, p, rc.kv_es, true);
        block_bytes = b > block_bytes ? b : block_bytes;
    }
    const size_t o_bytes = ring_pad64((size_t)(rc.B * rc.Hq * rc.lq_r * rc.Dv) * 4);
    const size_t l_bytes = ring_pad64((size_t)(rc.B * rc.Hq * rc.lq_r) * 4);
    char *mem;
    st = ring_alloc(&rc, 2 * block_bytes + 2 * (o_bytes + l_bytes), block_bytes, &mem);
    if (st != ATTN_OK) return st;
    void *blk[2] = {mem, mem + block_bytes};
    float *acc_o = (float *)(mem + 2 * block_bytes), *part_o = (float *)((char *)acc_o + o_bytes);
    float *acc_l = (float *)((char *)part_o + o_bytes), *part_l = (float *)((char *)acc_l + l_bytes);
    const attn_tensor acc = attn_tensor_4d(acc_o, ATTN_F32, rc.B, rc.Hq, rc.lq_r, rc.Dv);
    const attn_tensor part = attn_tensor_4d(part_o, ATTN_F32, rc.B, rc.Hq, rc.lq_r, rc.Dv);
    const attn_tensor acc_lse = attn_tensor_4d(acc_l, ATTN_F32, rc.B, rc.Hq, rc.lq_r, 1);
    const attn_tensor part_lse = attn_tensor_4d(part_l, ATTN_F32, rc.B, rc.Hq, rc.lq_r, 1);
    for (int64_t x = 0; x < rc.B * rc.Hq * rc.lq_r; x++) acc_l[x] = -INFINITY;  // empty
    memset(acc_o, 0, (size_t)(rc.B * rc.Hq * rc.lq_r * rc.Dv) * 4);
    ring_pack(&rc, k, v, blk[0]);

    const int to = (rc.r + rc.P - 1) % rc.P, from = (rc.r + 1) % rc.P;
    /* a failure inside a step (out of memory) does not change the messages: every process
     * goes round the whole ring and they agree once, at the end */
    for (int s = 0; s < rc.P; s++) {
        MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
        int nreq = 0;
        if (s + 1 < rc.P) {  // the block moves on while it is attended
            const int next = (rc.r + s + 1) % rc.P, cur = (rc.r + s) % rc.P;
            /* only the chunks some later holder needs (a prefix; none: no message) */
            const size_t in = ring_prefix_bytes(&rc, next, rc.kv_es, ring_chunks_needed_from(&rc, next, s + 1));
            const size_t out = ring_prefix_bytes(&rc, cur, rc.kv_es, ring_chunks_needed_from(&rc, cur, s + 1));
            if (in) ring_irecv(&rc, blk[(s + 1) % 2], in, from, RING_TAG_KV, &req[nreq++]);
            if (out) ring_isend(&rc, blk[s % 2], out, to, RING_TAG_KV, &req[nreq++], stats);
        }
        const double c0 = MPI_Wtime();
        if (st == ATTN_OK) st = forward_step(&rc, s, blk[s % 2], q, &acc, &acc_lse, &part, &part_lse, req, nreq);
        if (stats) stats->compute_s += MPI_Wtime() - c0;
        ring_wait(req, nreq, stats);
    }
    const double a0 = MPI_Wtime();  // waiting here is waiting for the slowest process
    st = ring_agree(&rc, st);
    if (stats) stats->wait_s += MPI_Wtime() - a0;
    /* O in its dtype (attn_merge of one partial is exact), and the LSE */
    if (st == ATTN_OK) {
        st = attn_merge(1, &acc, &acc_lse, o, opt ? opt->lse : NULL, rc.opt.threads);
        if (st != ATTN_OK) ring_fail(st, "%s", attn_last_error());
    }
    free(mem);
    ring_end(&rc);
    if (stats) {
        stats->steps = rc.P;
        stats->total_s = MPI_Wtime() - t0;
    }
    if (st == ATTN_OK) ring_ok();
    return st;
}
