/*
 * attn_mpi.h — the public interface of libattn_mpi: exact attention over a sequence split
 *              across the processes of an MPI communicator (ring attention), forward and
 *              backward, on top of libattn.
 *
 * What is here: which rows each process holds (attn_ring_slice), the ring's forward and
 * backward calls, and their timing counters. What is not: anything of libattn itself
 * (attn.h), which never depends on MPI. Every call is collective over `comm`: all its
 * processes call it with the same options, and all return the same status. The full
 * semantics are in docs/CONTRACT.md ("Ring attention over MPI") and docs/RING.md.
 */
#ifndef ATTN_MPI_H
#define ATTN_MPI_H

#include <mpi.h>

#include "attn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The rows of a sequence of L rows that process `rank` of `size` holds: the ranges
 * [first[c], first[c] + count[c]) for c = 0, 1, in this order in its local tensors.
 *   zigzag = false (non-causal calls): one contiguous range, rows [rank L / size,
 *            (rank + 1) L / size) (integer division); count[1] = 0.
 *   zigzag = true (causal calls): the sequence is cut into 2 size chunks, chunk c being
 *            rows [c L / (2 size), (c + 1) L / (2 size)); the process holds chunk rank
 *            (early) and chunk 2 size - 1 - rank (late), so that every process has as
 *            much of the causal triangle as the others.
 * Any L >= 0 works (slices may be empty). ATTN_ERR_VALUE for size < 1, rank outside
 * [0, size) or L < 0; ATTN_ERR_NULL for a NULL output. */
ATTN_API attn_status attn_ring_slice(int64_t L, int size, int rank, bool zigzag,
                                     int64_t first[2], int64_t count[2]);

/* Where a ring call's time went on this process (seconds, MPI_Wtime), when asked. */
typedef struct attn_ring_stats {
    int32_t steps;         /* ring steps (the communicator's size)                        */
    double total_s;        /* the whole call                                              */
    double compute_s;      /* attending and merging the blocks                            */
    double wait_s;         /* waiting for messages after the compute of a step was done,
                              and at the end for the slowest process                      */
    double max_wait_s;     /* the longest such wait of one step                           */
    int64_t bytes_sent;    /* bytes this process sent                                     */
} attn_ring_stats;

/* O = attention(Q, K, V) over the whole sequence, each process holding its slice.
 *   q [B, Hq, Lq_r, Dk]   k [B, Hkv, Lk_r, Dk]   v [B, Hkv, Lk_r, Dv]   o [B, Hq, Lq_r, Dv]
 * where Lq_r and Lk_r are this process's row counts from attn_ring_slice (zigzag when
 * opt->causal) of the global Lq and Lk, the sums of every process's local lengths.
 * Options: as attn_forward's, except that mask, bias, ALiBi and weights are refused
 * (ATTN_ERR_UNSUPPORTED: a mask would have to be cut into the ring's blocks); causal
 * needs Lq = Lk (top-left; bottom-right is the same then, and refused with kv_len); a
 * window works with either alignment (refused bottom-right with kv_len, whose diagonal
 * is per batch), and the pieces of a step outside every row's window are not computed,
 * nor, in the forward, sent to a process none of whose later holders needs them;
 * kv_len holds the global key lengths [B], the same on every process; opt->lse, when
 * given, is this process's slice [B, Hq, Lq_r].
 * stats may be NULL. */
ATTN_API attn_status attn_ring_forward(const attn_tensor *q, const attn_tensor *k,
                                       const attn_tensor *v, const attn_tensor *o,
                                       const attn_options *opt, MPI_Comm comm,
                                       attn_ring_stats *stats);

/* The gradients of attn_ring_forward, each process its slices (o and lse the forward's,
 * global ones restricted to this process's rows):
 *   o, d_o [B, Hq, Lq_r, Dv]  lse [B, Hq, Lq_r]  dq [B, Hq, Lq_r, Dk]
 *   dk [B, Hkv, Lk_r, Dk]     dv [B, Hkv, Lk_r, Dv]
 * The same options as the forward (opt->lse and opt->weights NULL). dQ stays local; each
 * block's dK and dV travel with its K and V and are returned to its process. */
ATTN_API attn_status attn_ring_backward(const attn_tensor *q, const attn_tensor *k,
                                        const attn_tensor *v, const attn_tensor *o,
                                        const attn_tensor *d_o, const attn_tensor *lse,
                                        const attn_tensor *dq, const attn_tensor *dk,
                                        const attn_tensor *dv, const attn_options *opt,
                                        MPI_Comm comm, attn_ring_stats *stats);

/* attn_ring_forward on dense C-order arrays, for bindings (python/attn/ring.py): q, k, v
 * of dtype (ATTN_F32, ATTN_F16 or ATTN_BF16), o float32 [B, Hq, lq, Dv], lse float32
 * [B, Hq, lq] or NULL, kv_len int64 [B] or NULL, the options as attn_options' fields of
 * the same names, and the communicator as its Fortran handle (MPI_Comm_c2f; mpi4py's
 * Comm.py2f()). */
ATTN_API attn_status attn_ring_forward_flat(const void *q, const void *k, const void *v, void *o,
                                            float *lse, int32_t dtype, int64_t B, int64_t Hq,
                                            int64_t Hkv, int64_t lq, int64_t lk, int64_t Dk,
                                            int64_t Dv, int32_t causal, int32_t align,
                                            int32_t has_scale, float scale, float softcap,
                                            int32_t has_window, int64_t window_left,
                                            int64_t window_right, const int64_t *kv_len,
                                            int32_t threads, int32_t comm_f);

/* The detail of the latest failed ring call on this thread ("" after a success); the
 * detail of a failure inside libattn is attn_last_error()'s. */
ATTN_API const char *attn_ring_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* ATTN_MPI_H */
