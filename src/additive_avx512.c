/*
 * additive_avx512.c — the additive-attention micro-kernels for AVX-512: the portable
 *                     body (additive_kernel.h) compiled with -mavx512f (the Makefile's
 *                     ISA_additive_avx512), 16 keys a vector. Empty on a non-x86 target.
 */
#include "additive.h"

#if defined(__x86_64__) || defined(_M_X64)
#define ADD_SUFFIX avx512
#define ADD_FMA(a, b, c) fmaf((a), (b), (c))
#include "additive_kernel.h"
#endif
