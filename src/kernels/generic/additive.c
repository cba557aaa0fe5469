/*
 * generic/additive.c — the additive-attention micro-kernels for any CPU: the portable
 *                      body (additive_kernel.h) compiled for the baseline ISA, a*b + c
 *                      as two roundings (fmaf would be a library call without FMA).
 */
#include "additive.h"

#define ADD_SUFFIX generic
#define ADD_FMA(a, b, c) ((a) * (b) + (c))
#include "additive_kernel.h"
