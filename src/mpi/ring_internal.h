/*
 * ring_internal.h — what the ring's forward (ring.c) and backward (ring_backward.c)
 *                   share: the checked call, the chunks each process holds, the packed
 *                   blocks that travel, the pieces of work of a step, and messages.
 *
 * Index letters as in attn.h; r is this process, P the communicator's size, s a ring
 * step and src the process whose block this process holds at step s: src = (r + s) mod P.
 * Blocks travel from r to r - 1 (mod P), so a block visits the processes below its home
 * first and wraps round to those above it last; with the zigzag split the late chunk of
 * a block is needed only by the processes at or below its home (they hold later queries),
 * so it stops at process 0 and only the early chunk wraps round.
 */
#ifndef ATTN_RING_INTERNAL_H
#define ATTN_RING_INTERNAL_H

#include <mpi.h>

#include "attn_mpi.h"

#define RING_PRIVATE __attribute__((visibility("hidden")))

/* message tags: key/value blocks, travelling dK/dV sums, late chunks' sums sent home */
enum { RING_TAG_KV = 1, RING_TAG_ACC = 2, RING_TAG_LATE = 3 };

typedef struct ring_call {
    MPI_Comm comm;
    int P, r;
    bool causal;        /* zigzag split, two chunks a process; else one                 */
    int chunks;         /* 2 with causal, else 1                                        */
    int64_t B, Hq, Hkv, Dk, Dv;
    int64_t Lq, Lk;     /* global                                                       */
    int64_t lq_r, lk_r; /* this process's                                               */
    attn_dtype q_dt, kv_dt;
    size_t kv_es;       /* bytes of a K/V element                                       */
    int64_t *kv_len;    /* (B) global key lengths, or NULL                              */
    attn_options opt;   /* the caller's options without kv_len, lse, causal, window:
                           those are per piece                                          */
    /* the band of keys a query sees, in global positions: key - query in [lo, hi]
     * (causal and the window, on the call's diagonal); has_lo / has_hi false = unbounded */
    bool has_lo, has_hi;
    int64_t lo, hi;
    MPI_Datatype unit;  /* 64 contiguous bytes: every message is a multiple of it       */
} ring_call;

/* One attn_forward / attn_backward call of a step: local query rows [q0, q0 + qn) against
 * keys [k0, k0 + kn) of chunk c of the block held, with (top-left on those views) causal
 * or the window (left, right; -1 unbounded), which ring_clip chose so that the call sees
 * exactly the global band [lo, hi] of ring_call. */
typedef struct ring_piece {
    int64_t q0, qn;
    int c;
    int64_t k0, kn;
    bool causal, has_window;
    int64_t left, right;
} ring_piece;

/* At most one piece per (key chunk, query chunk) */
enum { RING_MAX_PIECES = 4 };

/* Records a failure's detail (attn_ring_last_error) and returns status. */
RING_PRIVATE attn_status ring_fail(attn_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
RING_PRIVATE void ring_ok(void);

/* Checks the call on this process, agrees with every process on the outcome (all return
 * the same status) and fills *rc. bwd: NULL for the forward, else the backward's d_o,
 * lse, dq, dk, dv. A failure here is collective; *rc needs ring_end either way. */
RING_PRIVATE attn_status ring_begin(ring_call *rc, const attn_tensor *q, const attn_tensor *k,
                                    const attn_tensor *v, const attn_tensor *o,
                                    const attn_options *opt, MPI_Comm comm,
                                    const attn_tensor *const *bwd);
RING_PRIVATE void ring_end(ring_call *rc);

/* The MAX of every process's status: all see the first failure's code. */
RING_PRIVATE attn_status ring_agree(const ring_call *rc, attn_status st);

/* Key chunk c of process src: global first row and count (count 0 for a missing chunk);
 * and the same for query chunks. */
RING_PRIVATE void ring_key_chunk(const ring_call *rc, int src, int c, int64_t *first, int64_t *n);
RING_PRIVATE void ring_query_chunk(const ring_call *rc, int src, int c, int64_t *first, int64_t *n);

/* Whether the process rr, at step s, needs (and so receives) the late chunk of its block. */
RING_PRIVATE bool ring_needs_late(const ring_call *rc, int rr, int s);

/* The piece of global query rows [qf, qf + qn) against global keys [kf, kf + kn): false
 * when no query there sees any of the keys (the piece is skipped); else *out's q0
 * (relative to qf), qn, k0 (relative to kf), kn and its causal / window flags, the
 * rows and keys that see nothing trimmed off. out->c is not set. */
RING_PRIVATE bool ring_clip(const ring_call *rc, int64_t qf, int64_t qn, int64_t kf, int64_t kn,
                            ring_piece *out);

/* How many of src's chunks (counted from the first: a message holds a prefix) the
 * holders of its block at steps s .. P-1 need: the forward sends no more than this. */
RING_PRIVATE int ring_chunks_needed_from(const ring_call *rc, int src, int s);

/* Bytes of one chunk of n keys in a K/V block (dtype es bytes an element), each of its
 * K and V parts padded to 64 bytes; K first, then V, both dense [B, Hkv, n, D]. */
RING_PRIVATE size_t ring_chunk_bytes(const ring_call *rc, int64_t n, size_t es);

/* Bytes of src's block: its chunks of elements of es bytes (the K/V dtype, or 4 for the
 * float32 dK/dV sums); late = with its late chunk. ring_prefix_bytes: its first n chunks. */
RING_PRIVATE size_t ring_block_bytes(const ring_call *rc, int src, size_t es, bool late);
RING_PRIVATE size_t ring_prefix_bytes(const ring_call *rc, int src, size_t es, int n);

/* One allocation of `bytes` (64-aligned) for a call whose largest message has
 * max_message bytes, agreed by every process; on failure nothing is held and rc is ended. */
RING_PRIVATE attn_status ring_alloc(ring_call *rc, size_t bytes, size_t max_message, char **mem);

/* The dense views of chunk c of a packed block (chunks one after the other) of process
 * src, elements of dtype dt. */
RING_PRIVATE void ring_chunk_views(const ring_call *rc, void *block, int src, int c,
                                   attn_dtype dt, attn_tensor *k, attn_tensor *v);

/* Packs this process's K and V (any strides) into a block of its own chunks. */
RING_PRIVATE void ring_pack(const ring_call *rc, const attn_tensor *k, const attn_tensor *v,
                            void *block);

/* The pieces of step s (at most RING_MAX_PIECES), in the fixed order they are computed
 * and merged: key chunk by key chunk, query chunk by query chunk, two whole pieces of
 * one key chunk on adjacent rows joined into one call. */
RING_PRIVATE int ring_pieces(const ring_call *rc, int s, ring_piece out[RING_MAX_PIECES]);

/* Rows [first, first + n) of a [B, H, L, D] view, as a view. */
RING_PRIVATE attn_tensor ring_rows(const attn_tensor *t, int64_t first, int64_t n);

/* The local kv_len of a piece's keys of process src (kv_len minus the piece's first
 * global key, clamped to [0, kn]) into buf (B int64), as a tensor in *t; NULL without
 * kv_len. */
RING_PRIVATE const attn_tensor *ring_kv_len(const ring_call *rc, int src, const ring_piece *pc,
                                            int64_t *buf, attn_tensor *t);

/* Non-blocking send / receive of `bytes` (a multiple of 64) bytes. */
RING_PRIVATE void ring_isend(const ring_call *rc, const void *buf, size_t bytes, int to, int tag,
                             MPI_Request *req, attn_ring_stats *st);
RING_PRIVATE void ring_irecv(const ring_call *rc, void *buf, size_t bytes, int from, int tag,
                             MPI_Request *req);

/* Lets MPI move the messages of n requests on without waiting: Open MPI has no progress
 * thread, so a large (rendezvous) message advances only inside MPI calls, and a step
 * calls this between its pieces. */
RING_PRIVATE void ring_progress(MPI_Request *req, int n);

/* Waits for n requests; the time waited is added to the stats. */
RING_PRIVATE void ring_wait(MPI_Request *req, int n, attn_ring_stats *st);

static inline size_t ring_pad64(size_t x) { return (x + 63) & ~(size_t)63; }

static inline size_t ring_dtype_bytes(attn_dtype t) { return attn_dtype_size(t); }  // 2 or 4: check_local

#endif /* ATTN_RING_INTERNAL_H */
