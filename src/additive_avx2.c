/*
 * additive_avx2.c — the additive-attention micro-kernels for AVX2 + FMA: the portable
 *                   body (additive_kernel.h) compiled with -mavx2 -mfma (the Makefile's
 *                   ISA_additive_avx2), fused multiply-adds through fmaf. Empty on a
 *                   non-x86 target.
 */
#include "additive.h"

#if defined(__x86_64__) || defined(_M_X64)
#define ADD_SUFFIX avx2
#define ADD_FMA(a, b, c) fmaf((a), (b), (c))
#include "additive_kernel.h"
#endif
