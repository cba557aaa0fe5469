/*
 * fused_geom.c — the fused forward's tile sizes for a call: how many query rows share a
 *                key block (bq) and how many keys a block holds (bk), from the kernel's
 *                line of kernels/list.h, the CPU it runs on, and two environment
 *                variables for measuring.
 *
 * Not the backward's tiles (backward_fused.c reads the list's geometry itself), nor the
 * kernels': a micro-kernel takes any npad <= ATTN_FWD_BQ_LIMIT rows (kernels.h).
 *
 * - bk: the list's bk_max, halved (down to bk_min) until a key and a value block, in the
 *   cache's own dtype, fit in 64 KiB (they stay in L2 while the block's rows use them).
 * - bq: the list's bq, except for the avx2 kernel on Zen 3 (AMD family 19h, the Zen 3
 *   model ranges; Zen 4 runs avx512 and keeps the list's value, as every other CPU does).
 *   There the rows of a block are ZEN3_AVX2_BQ = 112: the query block's transposed rows
 *   (qt) and the logits (S^T) are bq floats a row, and at bq = 64 that is 256 bytes, a
 *   power of two, so a 16-row strip of either falls into 16 of the L1's 64 sets and its
 *   lines evict each other; 448 bytes (7 lines) reach all 64, and each K and V block is
 *   streamed for 112 rows instead of 64. docs/KERNELS.md has the measurements.
 * - ATTN_FWD_BQ=N (a multiple of the kernel's row_pad, 16 <= N <= ATTN_FWD_BQ_LIMIT) and
 *   ATTN_FWD_BK=N (a multiple of row_pad, up to ATTN_BK_LIMIT) replace the choices above
 *   for every call of the process, for comparing geometries on another CPU; a value that
 *   is not such a number is ignored. Read once, the first time a forward is planned.
 *
 * Results: both sizes are fixed per process, never by the thread count, so a call gives
 * the same bits on any number of threads. Between settings the last bits may differ: bk
 * decides a tile's sums, and bq which rows end up in a block of few rows (the last of a
 * head, or a GQA stack), which the kernels compute by their decoding forms (kernels.h).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "fused_plan.h"
#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#endif

enum { ZEN3_AVX2_BQ = 112 };

/* Whether this CPU is a Zen 3 core: AuthenticAMD, family 19h, models 00-0Fh (Milan),
 * 20-2Fh (Vermeer), 40-5Fh (Rembrandt, Cezanne). Zen 4 (10-1Fh, 60-7Fh, A0-AFh) is not. */
static bool cpu_is_zen3(void) {
#if defined(__x86_64__) || defined(_M_X64)
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
    char vendor[12];
    memcpy(vendor, &b, 4), memcpy(vendor + 4, &d, 4), memcpy(vendor + 8, &c, 4);
    if (memcmp(vendor, "AuthenticAMD", 12) != 0 || !__get_cpuid(1, &a, &b, &c, &d)) return false;
    const unsigned base = (a >> 8) & 0xF;
    const unsigned family = base == 0xF ? base + ((a >> 20) & 0xFF) : base;
    const unsigned model = ((a >> 4) & 0xF) | (base == 0xF ? ((a >> 16) & 0xF) << 4 : 0);
    return family == 0x19 && (model <= 0x0F || (model >= 0x20 && model <= 0x2F) ||
                              (model >= 0x40 && model <= 0x5F));
#else
    return false;
#endif
}

static bool g_zen3;
static int64_t g_env_bq, g_env_bk;  // 0: not set (or not a number)

static int64_t env_count(const char *name) {
    const char *s = getenv(name);
    if (!s || !*s) return 0;
    char *end;
    const long long x = strtoll(s, &end, 10);
    return *end == '\0' && x > 0 && x <= 1 << 20 ? (int64_t)x : 0;
}

static void probe(void) {
    g_zen3 = cpu_is_zen3();
    g_env_bq = env_count("ATTN_FWD_BQ");
    g_env_bk = env_count("ATTN_FWD_BK");
}

static pthread_once_t g_once = PTHREAD_ONCE_INIT;

fused_tiles fused_choose_tiles(const attn_kernels *kern, attn_dtype kv_dt, int64_t dk, int64_t dv) {
    pthread_once(&g_once, probe);
    const attn_kernel_geom *geom = &kern->geom;
    fused_tiles t = {.bq = geom->bq, .bk = geom->bk_max};
    if (g_zen3 && strcmp(kern->name, "avx2") == 0) t.bq = ZEN3_AVX2_BQ;
    const int64_t kv_row_bytes = attn_row_bytes(kv_dt, dk + dv);  // q8_0: 34 bytes / 32
    while (t.bk > geom->bk_min && t.bk * kv_row_bytes > 64 * 1024) t.bk /= 2;
    const int64_t pad = geom->row_pad;
    if (g_env_bq >= 16 && g_env_bq <= ATTN_FWD_BQ_LIMIT && g_env_bq % pad == 0) t.bq = g_env_bq;
    if (g_env_bk <= ATTN_BK_LIMIT && g_env_bk % pad == 0 && g_env_bk > 0) t.bk = g_env_bk;
    return t;
}
