/*
 * geom.c — the avx2 kernel's per-CPU geometry (kernels.h, attn_cpu_geom), read by
 *          ai_choose_tiles (fused_geom.c) through the kernel table's cpu_geom.
 *
 * Zen 3: the forward's blocks are 112 rows. The query block's transposed rows (qt) and
 * the logits (S^T) are bq floats a row; at bq = 64 that is 256 bytes, a power of two, so
 * a 16-row strip of either falls into 16 of the L1's 64 sets and its lines evict each
 * other; 448 bytes (7 lines) reach all 64, and each K and V block is streamed for 112
 * rows instead of 64. The backward's blocks are 112 rows too: not slower in its A/B
 * under load (docs/KERNELS.md, "The backward's query block on Zen 3").
 */
#include "kernels/kernels.h"

const attn_cpu_geom attn_cpu_geom_avx2[] = {
    {ATTN_CPU_ZEN3, 112, 112},  // forward, backward
    {ATTN_CPU_OTHER, 0, 0},
};
