/*
 * bench_block_mask.c — `attn bench --block-mask`: block-sparse masks (attn_block_mask,
 *                      options.block_mask) beside the same mask as a dense bool tensor
 *                      and beside the unmasked call.
 *
 * Method:
 *   - two masks over B 1, H 8, L 8192 (--quick: 2048), D 64, float32: 8 documents of
 *     L / 8 tokens (each attends to its own document only), and a causal sliding window
 *     of 512 keys with 64 global tokens (the first 64 keys seen by every row, the first 64
 *     rows see every key). Rows, forward and backward: the unmasked call (every block),
 *     the mask as a block mask (made once, outside the timing), and as a dense bool
 *     tensor [1, 1, L, L] (the call summarizes it, reading all of it, each time);
 *   - GFLOP/s: the unmasked row of all 4 B H L² D (backward 2.5x); the masked rows of the
 *     blocks they compute: non-empty 64 x 16 blocks x 4 x 64 x 16 x D, so that "per
 *     computed block" is comparable with the unmasked row's (and, on a line of its own,
 *     per non-empty 128 x 128 block, FlexAttention's default BLOCK_SIZE); and the block
 *     mask's time beside the dense tensor's and the unmasked call's;
 *   - the answer is checked first on a smaller case (L 640, H 2): the block mask's O and
 *     gradients the same bits as the dense tensor's and within the contract's float32
 *     bound of the reference path's (tools/common/tolerance.h); --plant-error flips one
 *     element of the block mask first, and the check must fail (exit 1);
 *   - one warm-up call per row, then rounds running the rows in turn (--reps, default 3):
 *     medians of wall and CPU time.
 * What it is not: a test (no time limit), or the PyTorch FlexAttention comparison (that
 * is `python3 bench/flex_peer.py`, which needs torch).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "bench_clock.h"
#include "cli.h"
#include "cliopt.h"
#include "rng.h"
#include "tolerance.h"

enum { HEADS = 8, DIM = 64, WINDOW = 512, GLOBAL = 64 };
enum { M_DOCS, M_WINDOW, MASKS };
static const char *const MASK_NAME[MASKS] = {"8 documents", "window 512 + 64 global"};

typedef struct kshape {
    int64_t L, docs;
    int mask;
    int64_t flip_i, flip_j;  // a planted error: this element flipped (-1: none)
} kshape;

static int keep(int64_t b, int64_t h, int64_t i, int64_t j, void *ctx) {
    (void)b, (void)h;
    const kshape *k = ctx;
    int v;
    if (k->mask == M_DOCS) {
        const int64_t n = k->L / k->docs;
        v = i / n == j / n;
    } else {
        v = (j <= i && i - j < WINDOW) || j < GLOBAL || i < GLOBAL;
    }
    return i == k->flip_i && j == k->flip_j ? !v : v;
}

typedef struct kcase {
    int64_t H, L;
    float *x[9], *lse;
    uint8_t *dense;
    attn_tensor q, k, v, o, d_o, dq, dk, dv, tl, mask;
    attn_block_mask *bm;
    double blocks;     // non-empty 64 x 16 blocks (B H of them)
    double blocks128;  // non-empty 128 x 128 blocks (FlexAttention's default BLOCK_SIZE)
} kcase;

static void release(kcase *c) {
    for (int a = 0; a < 9; a++) free(c->x[a]);
    free(c->lse), free(c->dense);
    attn_block_mask_free(c->bm);
}

static bool build(kcase *c, int64_t H, int64_t L, int mask, bool plant) {
    memset(c, 0, sizeof *c);
    c->H = H, c->L = L;
    rng_t r = {RNG_CASE(H, L, mask)};
    const int64_t n = H * L * DIM;
    attn_tensor *ts[9] = {&c->q, &c->k, &c->v, &c->o, &c->d_o, &c->dq, &c->dk, &c->dv, NULL};
    for (int a = 0; a < 8; a++) {
        if (!(c->x[a] = malloc((size_t)n * sizeof(float)))) return false;
        for (int64_t e = 0; e < n; e++) c->x[a][e] = (float)rng_sym(&r);
        *ts[a] = attn_tensor_4d(c->x[a], ATTN_F32, 1, H, L, DIM);
    }
    if (!(c->lse = malloc((size_t)(H * L) * sizeof(float))) || !(c->dense = malloc((size_t)(L * L))))
        return false;
    c->tl = attn_tensor_4d(c->lse, ATTN_F32, 1, H, L, 1);
    kshape ks = {L, 8, mask, -1, -1};
    for (int64_t i = 0; i < L; i++)
        for (int64_t j = 0; j < L; j++) c->dense[i * L + j] = (uint8_t)keep(0, 0, i, j, &ks);
    c->mask = attn_tensor_4d(c->dense, ATTN_BOOL, 1, 1, L, L);
    if (plant) ks.flip_i = L / 3, ks.flip_j = L / 3 + 5;  // inside a kept block of either mask
    if (attn_block_mask_create(1, 1, L, L, keep, &ks, &c->bm) != ATTN_OK) return false;
    attn_block_mask_info in;
    attn_block_mask_get_info(c->bm, &in);
    c->blocks = (double)(in.full + in.partial) * (double)H;
    for (int64_t i0 = 0; i0 < L; i0 += 128)
        for (int64_t j0 = 0; j0 < L; j0 += 128) {
            bool any = false;
            for (int64_t i = i0; i < i0 + 128 && i < L && !any; i++)
                for (int64_t j = j0; j < j0 + 128 && j < L && !any; j++) any = c->dense[i * L + j];
            c->blocks128 += any ? (double)H : 0.0;
        }
    return true;
}

enum { W_FULL, W_BLOCK, W_DENSE, WAYS };
static const char *const WAY_NAME[WAYS] = {"unmasked", "block mask", "dense bool mask"};

static attn_options way_opts(kcase *c, int w, int threads, attn_path path) {
    attn_options o = {.threads = threads, .path = path};
    if (w == W_BLOCK) o.block_mask = c->bm;
    if (w == W_DENSE) o.mask = &c->mask;
    return o;
}

static attn_status forward(kcase *c, int w, int threads, attn_path path) {
    attn_options o = way_opts(c, w, threads, path);
    o.lse = &c->tl;
    return attn_forward(&c->q, &c->k, &c->v, &c->o, &o);
}

static attn_status backward(kcase *c, int w, int threads, attn_path path) {
    const attn_options o = way_opts(c, w, threads, path);
    return attn_backward(&c->q, &c->k, &c->v, &c->o, &c->d_o, &c->tl, &c->dq, &c->dk, &c->dv, &o);
}

/* O, dQ, dK, dV of one way into out (4 x n floats) */
static bool outputs(kcase *c, int w, int threads, attn_path path, float *out) {
    const int64_t n = c->H * c->L * DIM;
    if (forward(c, w, threads, path) != ATTN_OK || backward(c, w, threads, path) != ATTN_OK)
        return false;
    const float *src[4] = {c->x[3], c->x[5], c->x[6], c->x[7]};
    for (int a = 0; a < 4; a++) memcpy(out + a * n, src[a], (size_t)n * sizeof(float));
    return true;
}

/* the block mask against the dense tensor (bits) and the reference (the bound) */
static bool check_answer(int mask, int threads, bool plant) {
    kcase c;
    const int64_t L = 640, n = 2 * L * DIM;
    float *blk = malloc((size_t)(4 * n) * sizeof(float)), *den = malloc((size_t)(4 * n) * sizeof(float)),
          *ref = malloc((size_t)(4 * n) * sizeof(float));
    bool ok = blk && den && ref && build(&c, 2, L, mask, plant);
    ok = ok && outputs(&c, W_BLOCK, threads, ATTN_PATH_FUSED, blk) &&
         outputs(&c, W_DENSE, threads, ATTN_PATH_FUSED, den) &&
         outputs(&c, W_DENSE, threads, ATTN_PATH_REFERENCE, ref);
    if (ok) {
        const bool bits = memcmp(blk, den, (size_t)(4 * n) * sizeof(float)) == 0;
        tol_acc a = tol_start();
        for (int64_t e = 0; e < 4 * n; e++) tol_add(&a, e, blk[e], ref[e]);
        const bool close = tol_pass(&a, NULL);
        printf("check %-22s block mask == dense bool mask, bit for bit (O, dQ, dK, dV): %s; "
               "within the float32 bound of the reference path: %s\n", MASK_NAME[mask],
               bits ? "ok" : "FAILED", close ? "ok" : "FAILED");
        ok = bits && close;
    }
    free(blk), free(den), free(ref);
    release(&c);
    return ok;
}

static const char USAGE[] =
    "usage: attn bench --block-mask [--quick] [--threads N] [--reps N] [--plant-error]\n"
    "\n"
    "  Block masks (8 documents; a causal window of 512 with 64 global tokens) over B 1,\n"
    "  H 8, L 8192 (--quick 2048), D 64, float32, forward and backward: unmasked, the mask\n"
    "  as a block mask, and as a dense bool tensor, after checking the block mask against\n"
    "  the dense tensor (bits) and the reference path (the float32 bound); medians of wall\n"
    "  and CPU time, GFLOP/s per computed block.\n";

int bench_block_mask(int argc, char **argv) {
    bench_part_args pa;
    const int rc = bench_part_scan(argc, argv, "--block-mask", USAGE, 2, 3, 100, &pa);
    if (rc >= 0) return rc;
    const int threads = pa.threads, reps = pa.reps;
    for (int m = 0; m < MASKS; m++)
        if (!check_answer(m, threads, pa.plant)) {
            fprintf(stderr, "bench --block-mask: the check failed%s\n",
                    pa.plant ? " (planted error: as it should)" : "");
            return 1;
        }
    const int64_t L = pa.quick ? 2048 : 8192;
    printf("kernel %s, threads %d (0 = default), B 1, H %d, L %lld, D %d, float32; median of "
           "%d rounds (rows interleaved)\n", attn_kernel_name(), threads, HEADS, (long long)L,
           DIM, reps);
    const double all_flops = 4.0 * HEADS * (double)L * (double)L * DIM;
    for (int m = 0; m < MASKS; m++) {
        kcase c;
        if (!build(&c, HEADS, L, m, false)) {
            fprintf(stderr, "bench --block-mask: out of memory\n");
            release(&c);
            return 1;
        }
        const double blk_flops = c.blocks * 64.0 * 16.0 * 4.0 * DIM;
        attn_block_mask_info in;
        attn_block_mask_get_info(c.bm, &in);
        printf("\n%s: blocks of 64 x 16 empty %lld, full %lld, partial %lld (%.1f%% computed); "
               "the block mask %.2f MiB, the dense tensor %.0f MiB\n", MASK_NAME[m],
               (long long)in.empty, (long long)in.full, (long long)in.partial,
               100.0 * (double)(in.full + in.partial) / (double)(in.empty + in.full + in.partial),
               (double)in.bytes / 1048576.0, (double)(L * L) / 1048576.0);
        enum { ROWS = 2 * WAYS };
        double t[ROWS][100], tc[ROWS][100];
        for (int w = 0; w < ROWS; w++) {  // warm-up, and the backward's O and LSE
            const attn_status st = w < WAYS ? forward(&c, w, threads, ATTN_PATH_FUSED)
                                            : (forward(&c, w - WAYS, threads, ATTN_PATH_FUSED),
                                               backward(&c, w - WAYS, threads, ATTN_PATH_FUSED));
            if (st != ATTN_OK) {
                fprintf(stderr, "bench --block-mask: %s\n", attn_last_error());
                release(&c);
                return 1;
            }
        }
        for (int r = 0; r < reps; r++)
            for (int w = 0; w < ROWS; w++) {
                if (w >= WAYS) forward(&c, w - WAYS, threads, ATTN_PATH_FUSED);  // its own O, LSE
                const double t0 = now_s(), c0 = cpu_s();
                if (w < WAYS) forward(&c, w, threads, ATTN_PATH_FUSED);
                else backward(&c, w - WAYS, threads, ATTN_PATH_FUSED);
                t[w][r] = now_s() - t0;
                tc[w][r] = cpu_s() - c0;
            }
        double med[ROWS], medc[ROWS];
        for (int w = 0; w < ROWS; w++) med[w] = median(t[w], reps), medc[w] = median(tc[w], reps);
        printf("%-9s %-16s %10s %10s %16s %12s %14s\n", "call", "way", "wall ms", "CPU ms",
               "GFLOP/s (blocks)", "x unmasked", "x dense mask");
        for (int w = 0; w < ROWS; w++) {
            const int way = w % WAYS, base = w - way;
            const double f = (w < WAYS ? 1.0 : 2.5) * (way == W_FULL ? all_flops : blk_flops);
            printf("%-9s %-16s %10.1f %10.1f %16.1f", w < WAYS ? "forward" : "backward",
                   WAY_NAME[way], 1e3 * med[w], 1e3 * medc[w], f / med[w] * 1e-9);
            if (way != W_FULL) printf(" %11.2fx", med[base + W_FULL] / med[w]);
            if (way == W_BLOCK) printf(" %13.2fx", med[base + W_DENSE] / med[w]);
            printf("\n");
        }
        const double flops128 = c.blocks128 * 128.0 * 128.0 * 4.0 * DIM;
        for (int base = 0; base < ROWS; base += WAYS) {
            const double full = med[base + W_FULL], blk = med[base + W_BLOCK];
            const double per_block = (blk_flops / blk) / (all_flops / full);
            printf("%s: per computed block of 128 x 128 (FlexAttention's default BLOCK_SIZE; "
                   "%.1f%% of them non-empty): %.2f of the unmasked call's GFLOP/s\n",
                   base ? "backward" : "forward", 100.0 * c.blocks128 / (HEADS * (double)((L + 127) / 128) * (double)((L + 127) / 128)),
                   (flops128 / blk) / (all_flops / full));
            printf("%s: the block mask at %.2f of the unmasked call's GFLOP/s per computed "
                   "block (target >= 0.90: %s); %.2fx faster than the unmasked call over the "
                   "same L (target >= 5x: %s); %.2fx the dense bool mask's speed\n",
                   base ? "backward" : "forward", per_block, per_block >= 0.90 ? "met" : "NOT met",
                   full / blk, full / blk >= 5 ? "met" : "NOT met", med[base + W_DENSE] / blk);
        }
        release(&c);
    }
    return 0;
}
