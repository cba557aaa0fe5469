/*
 * bench_masks_peer.h — the PyTorch side of `attn bench masks --vs torch`: a child process
 *                      running scripts/bench_torch_masks.py, started by bench_peer's
 *                      torch_start (the same hello), fed the very inputs and masks of
 *                      attn's rows as .npy files in a private temporary folder.
 *
 * What it is not: a check (the caller compares the outputs it reads back) or a timer of
 * attn's side; nothing here calls the library.
 */
#ifndef ATTN_TOOLS_BENCH_MASKS_PEER_H
#define ATTN_TOOLS_BENCH_MASKS_PEER_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "attn.h"
#include "bench_peer.h"

enum { MPEER_MAX_VARIANTS = 8 };

typedef struct mpeer {
    torch_proc tp;
    char dir[PATH_MAX];                  /* the temporary folder, "" before one exists */
    int nvar;                            /* variants of the shape loaded                */
    int64_t B, H, L, D;
    char files[3 + MPEER_MAX_VARIANTS][32];  /* names written in dir, to remove       */
    int nfiles;
} mpeer;

/* Two processes taking turns on the same cores: each one's idle OpenMP threads must give
 * their cores up rather than spin (libgomp reads OMP_WAIT_POLICY once, as it loads). Where
 * OMP_WAIT_POLICY is unset this sets it to PASSIVE and re-executes this process with its
 * own arguments (/proc/self/cmdline), so that both sides inherit it; otherwise (or if the
 * exec fails) it returns and leaves the setting as it is. */
void mpeer_passive_threads(void);
/* Makes the temporary folder and starts `python script` with the hello of bench_peer;
 * 0, or 1 with the reason on stderr. */
int mpeer_start(mpeer *p, const char *python, const char *script, int threads);
/* Writes q, k, v (dense [B, L, H, D] storage) and each variant's mask (any strides: a
 * bool or float32 attn_tensor, NULL for none) and sends them; causal[i] asks for
 * is_causal (only where masks[i] is NULL). 0, or -1 with the reason in err. */
int mpeer_load(mpeer *p, const float *q, const float *k, const float *v, int64_t B, int64_t L,
               int64_t H, int64_t D, int nvar, const attn_tensor *const masks[],
               const bool causal[], char *err, size_t n);
/* Each variant's output, (B, H, L, D) float32, into outs[i] (B·H·L·D floats each). */
int mpeer_outputs(mpeer *p, float *const outs[], char *err, size_t n);
/* One round: `warm` untimed calls of variant 0, then one timed call of each variant in
 * turn; their seconds in times[0..nvar). */
int mpeer_round(mpeer *p, int warm, double times[], char *err, size_t n);
/* Drops the shape on both sides (its files removed); 0 or -1 with the reason. */
int mpeer_unload(mpeer *p, char *err, size_t n);
/* Ends the process and removes the folder. */
void mpeer_stop(mpeer *p);

#endif /* ATTN_TOOLS_BENCH_MASKS_PEER_H */
