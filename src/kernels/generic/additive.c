/*
 * generic/additive.c — the additive-attention micro-kernels for any CPU: the portable
 *                      body (additive_body.h) compiled for the baseline ISA, a*b + c
 *                      as two roundings (fmaf would be a library call without FMA).
 */
#include "kernels/additive_kernels.h"

#define ADD_SUFFIX generic
#define ADD_FMA(a, b, c) ((a) * (b) + (c))
#include "kernels/additive_body.h"
