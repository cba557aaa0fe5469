/*
 * mha_clock.h — the decoding step's phase clock (mha_decode.c) that `attn bench-mha`
 *               reads: where a step's time goes.
 *
 * What it is not: a timer the library uses itself (it never sets the clock).
 */
#ifndef ATTN_MHA_CLOCK_H
#define ATTN_MHA_CLOCK_H

#include "core/attn_internal.h"

/* The decoding step's phases, in the order they run (mha_decode.c):
 *   QKV     x·W_Q, x·W_K, x·W_V and RoPE on the new rows
 *   APPEND  the new K and V rows written into the cache
 *   ATTEND  the heads' attention over the cache (the library's decoding path)
 *   OUT     o·W_O and the store of y */
enum { MHA_DEC_QKV = 0, MHA_DEC_APPEND, MHA_DEC_ATTEND, MHA_DEC_OUT, MHA_DEC_NPHASE };

/* When not NULL, every decoding step adds each phase's wall time in seconds to
 * mha_decode_clock[phase]: bench-mha's breakdown (one caller at a time; the library
 * never sets it). */
ATTN_PRIVATE extern double *mha_decode_clock;

#endif /* ATTN_MHA_CLOCK_H */
