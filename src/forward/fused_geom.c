/*
 * fused_geom.c — the tile sizes of a call (ai_choose_tiles, kernels.h), the one place
 *                the forward, its weights, attn_weights_grid and the fused backward take
 *                them from: how many query rows share a key block (bq) and how many keys
 *                a block holds (bk), from the kernel's line of kernels/list.h, its
 *                per-CPU table (the kernel table's cpu_geom, in its folder: geom.c) for
 *                the CPU dispatch.c probed, and two environment variables for measuring.
 *
 * Not the kernels' own limits: a micro-kernel takes any npad <= ATTN_FWD_BQ_LIMIT rows
 * (kernels.h).
 *
 * - bq: the per-CPU table's value for this CPU and use (forward or backward) where it has
 *   one, else the list's bq.
 * - bk, forward: the list's bk_max, halved (down to bk_min) until a key and a value block,
 *   in the cache's own dtype, fit in 64 KiB (they stay in L2 while the block's rows use
 *   them). Backward: halved until the key block's float32 copies and gradients (4 (Dk +
 *   Dv) floats a key) fit in the CPU's budget, bwd_block_bytes: 512 KiB on Zen 4, whose
 *   L2 is 1 MiB, 256 KiB elsewhere (docs/KERNELS.md, "The backward's key block on
 *   Zen 4").
 * - a tuned configuration (the call's p->tune, from the wisdom: wisdom.h) replaces the two
 *   rules above by its bq and bk where they are not 0; the environment below still wins.
 * - ATTN_FWD_BQ=N (a multiple of the kernel's row_pad, 16 <= N <= ATTN_FWD_BQ_LIMIT) and
 *   ATTN_FWD_BK=N (a multiple of row_pad, up to ATTN_BK_LIMIT) replace the forward's
 *   choices (and so attn_weights_grid's) for every call of the process, for comparing
 *   geometries on another CPU; ATTN_BWD_BQ=N does the same for the backward's bq, whose
 *   bk they leave alone. A value that is not such a number is ignored. Read once.
 *
 * Results: the sizes are fixed per process, never by the thread count, so a call gives
 * the same bits on any number of threads. Between settings the last bits may differ: bk
 * decides a tile's sums, and bq which rows end up in a block of few rows (the last of a
 * head, or a GQA stack), which the kernels compute by their decoding forms (kernels.h).
 */
#include <pthread.h>
#include <stdlib.h>

#include "kernels/kernels.h"

static int64_t g_env_bq, g_env_bk, g_env_bwd_bq;  // 0: not set (or not a number)

static int64_t env_count(const char *name) {
    const char *s = getenv(name);
    if (!s || !*s) return 0;
    char *end;
    const long long x = strtoll(s, &end, 10);
    return *end == '\0' && x > 0 && x <= 1 << 20 ? (int64_t)x : 0;
}

static void probe(void) {
    g_env_bq = env_count("ATTN_FWD_BQ");
    g_env_bk = env_count("ATTN_FWD_BK");
    g_env_bwd_bq = env_count("ATTN_BWD_BQ");
}

static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* the per-CPU table's bq for this CPU and use, 0 without one */
static int64_t cpu_bq(const attn_kernels *kern, attn_tile_use use) {
    if (!kern->cpu_geom) return 0;
    const attn_cpu_model cpu = ai_cpu_model_now();
    if (cpu == ATTN_CPU_OTHER) return 0;
    for (const attn_cpu_geom *g = kern->cpu_geom; g->cpu != ATTN_CPU_OTHER; g++)
        if (g->cpu == cpu) return use == ATTN_TILES_BACKWARD ? g->bwd_bq : g->fwd_bq;
    return 0;
}

/* the backward key block's budget for its float32 copies and gradients, per CPU: on
 * Zen 4, bk = 128 rather than 64 at D = 128 (64 rather than 32 at D = 256) measured
 * 0.91-0.97 of the time at L >= 2048 under GQA, within 1.5% elsewhere (docs/KERNELS.md);
 * the other CPUs keep the first design's 256 KiB, not measured against it */
static int64_t bwd_block_bytes(void) {
    return ai_cpu_model_now() == ATTN_CPU_ZEN4 ? 512 * 1024 : 256 * 1024;
}

attn_tiles ai_choose_tiles(const attn_kernels *kern, attn_tile_use use, attn_dtype kv_dt,
                           int64_t dk, int64_t dv, const attn_tune_config *tuned) {
    pthread_once(&g_once, probe);
    const attn_kernel_geom *geom = &kern->geom;
    const int64_t pad = geom->row_pad, per_cpu = cpu_bq(kern, use);
    attn_tiles t = {.bq = per_cpu > 0 ? per_cpu : geom->bq, .bk = geom->bk_max};
    const int64_t env_bq = use == ATTN_TILES_BACKWARD ? g_env_bwd_bq : g_env_bq;
    if (tuned && tuned->bq > 0) t.bq = tuned->bq;  // checked against the geometry (wisdom.c)
    if (env_bq >= 16 && env_bq <= ATTN_FWD_BQ_LIMIT && env_bq % pad == 0) t.bq = env_bq;
    if (use == ATTN_TILES_BACKWARD) {
        const int64_t budget = bwd_block_bytes();
        while (t.bk > geom->bk_min && t.bk * (dk + dv) * 4 * (int64_t)sizeof(float) > budget)
            t.bk /= 2;
        if (tuned && tuned->bk > 0) t.bk = tuned->bk;
        return t;
    }
    const int64_t kv_row_bytes = attn_row_bytes(kv_dt, dk + dv);  // q8_0: 34 bytes / 32
    while (t.bk > geom->bk_min && t.bk * kv_row_bytes > 64 * 1024) t.bk /= 2;
    if (tuned && tuned->bk > 0) t.bk = tuned->bk;
    if (g_env_bk <= ATTN_BK_LIMIT && g_env_bk % pad == 0 && g_env_bk > 0) t.bk = g_env_bk;
    return t;
}
