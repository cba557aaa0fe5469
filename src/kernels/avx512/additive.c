/*
 * avx512/additive.c — the additive-attention micro-kernels for AVX-512: the portable
 *                     body (additive_body.h) compiled with the avx512 folder's flags
 *                     (src/kernels/list.h), 16 keys a vector. Empty on a non-x86 target.
 */
#include "kernels/additive_kernels.h"

#if defined(__x86_64__) || defined(_M_X64)
#define ADD_SUFFIX avx512
#define ADD_FMA(a, b, c) fmaf((a), (b), (c))
#include "kernels/additive_body.h"
#endif
