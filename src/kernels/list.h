/*
 * list.h — the one list of the fused path's micro-kernels, best first: everything about
 *          each ISA in one line, expanded by whoever needs a fact of it.
 *
 *   X(name, flags, row_pad, bq, bk_min, bk_max, probe)
 *
 *   name     the kernel's name (ATTN_ISA, attn_kernel_list(), `attn --kernels`) and
 *            its folder: src/kernels/<name>/ holds its kernel table (attn_kernels_<name>)
 *            and its peak loops (attn_peak_<name>, peak.h)
 *   flags    the compiler flags of every file in that folder, as one string: the
 *            Makefile and setup.py read them from this line (so an entry stays on one
 *            line and its flags in one string literal), nothing else is compiled with them
 *   row_pad  query rows are padded to a multiple of this (kernels.h)
 *   bq       query rows per block; bk_min, bk_max: the range of keys per block, which
 *            the framework sizes by the dtype's bytes within it (fused.c, backward.c)
 *   probe    a C expression, true where this CPU can run the kernel: ATTN_CPU(feature)
 *            is __builtin_cpu_supports("feature"), ATTN_CPU_F16C the F16C bit (dispatch.c)
 *
 * Who expands it: dispatch.c (the probe and the table), attn_kernel_list(), the test
 * suites (every kernel this CPU runs), `attn bench` (the peak loops), the Makefile and
 * setup.py (flags). Adding an ISA: one line here and one folder (docs/KERNELS.md).
 * The x86-64 kernels exist only in x86-64 builds; generic exists everywhere.
 */
#ifndef ATTN_KERNELS_LIST_H
#define ATTN_KERNELS_LIST_H

#if defined(__x86_64__) || defined(_M_X64)
#define ATTN_KERNEL_LIST_X86_64(X) \
    X(avx512bf16, "-O3 -mavx512f -mavx512dq -mavx512bw -mavx512vl -mfma -mavx512bf16", 16, 64, 16, 128, ATTN_CPU(avx512f) && ATTN_CPU(avx512dq) && ATTN_CPU(avx512bw) && ATTN_CPU(avx512vl) && ATTN_CPU(fma) && ATTN_CPU(avx512bf16)) \
    X(avx512, "-O3 -mavx512f -mavx512dq -mavx512bw -mavx512vl -mfma", 16, 64, 16, 128, ATTN_CPU(avx512f) && ATTN_CPU(avx512dq) && ATTN_CPU(avx512bw) && ATTN_CPU(avx512vl) && ATTN_CPU(fma)) \
    X(avx2, "-O3 -mavx2 -mfma -mf16c", 16, 64, 16, 128, ATTN_CPU(avx2) && ATTN_CPU(fma) && ATTN_CPU_F16C)
#else
#define ATTN_KERNEL_LIST_X86_64(X)
#endif

#define ATTN_KERNEL_LIST(X)   \
    ATTN_KERNEL_LIST_X86_64(X) \
    X(generic, "", 16, 64, 16, 128, 1)

#endif /* ATTN_KERNELS_LIST_H */
