/*
 * ring_flat.c — attn_ring_forward_flat: the ring's forward with plain arguments, for a
 *               binding that cannot build attn_tensor / attn_options itself (Python's
 *               ctypes in python/attn/ring.py, whose mirror of attn_options would break
 *               each time a field is added) and that holds its communicator as a Fortran
 *               handle (mpi4py's Comm.py2f(), turned back with MPI_Comm_f2c).
 */
#include "ring_internal.h"

attn_status attn_ring_forward_flat(const void *q, const void *k, const void *v, void *o,
                                   float *lse, int32_t dtype, int64_t B, int64_t Hq,
                                   int64_t Hkv, int64_t lq, int64_t lk, int64_t Dk, int64_t Dv,
                                   int32_t causal, int32_t align, int32_t has_scale, float scale,
                                   float softcap, int32_t has_window, int64_t window_left,
                                   int64_t window_right, const int64_t *kv_len, int32_t threads,
                                   int32_t comm_f) {
    if (dtype != ATTN_F32 && dtype != ATTN_F16 && dtype != ATTN_BF16)
        return ring_fail(ATTN_ERR_DTYPE, "attn_ring_forward_flat: dtype %d", (int)dtype);
    const attn_tensor tq = attn_tensor_4d((void *)q, (attn_dtype)dtype, B, Hq, lq, Dk);
    const attn_tensor tk = attn_tensor_4d((void *)k, (attn_dtype)dtype, B, Hkv, lk, Dk);
    const attn_tensor tv = attn_tensor_4d((void *)v, (attn_dtype)dtype, B, Hkv, lk, Dv);
    const attn_tensor to = attn_tensor_4d(o, ATTN_F32, B, Hq, lq, Dv);
    const attn_tensor tl = attn_tensor_4d(lse, ATTN_F32, B, Hq, lq, 1);
    const attn_tensor tkv = attn_tensor_4d((void *)kv_len, ATTN_I64, B, 1, 1, 1);
    const attn_options opt = {
        .causal = causal != 0, .align = (attn_align)align, .has_scale = has_scale != 0,
        .scale = scale, .softcap = softcap, .has_window = has_window != 0,
        .window_left = window_left, .window_right = window_right,
        .kv_len = kv_len ? &tkv : NULL, .lse = lse ? &tl : NULL, .threads = threads};
    return attn_ring_forward(&tq, &tk, &tv, &to, &opt, MPI_Comm_f2c((MPI_Fint)comm_f), NULL);
}
