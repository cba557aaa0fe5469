/*
 * bench_peer.h — the PyTorch side of `attn bench --vs torch`: a child process running
 *                scripts/bench_torch.py, one JSON line per case each way, and the venv
 *                that --setup-torch makes for it.
 */
#ifndef ATTN_TOOLS_BENCH_PEER_H
#define ATTN_TOOLS_BENCH_PEER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

#include "bench_case.h"

typedef struct torch_proc {
    pid_t pid;
    FILE *to, *from;
    char version[64];
    char info[200];
} torch_proc;

/* Starts `python script`, says hello with the thread count and reads the torch version;
 * 0, or 1 with the reason on stderr. */
int torch_start(torch_proc *tp, const char *python, const char *script, int threads);
/* Times case c on the PyTorch side; the times join c->tts, a failure c->torch_error. */
void torch_case(torch_proc *tp, bench_case *c, int threads, int warmup, int reps);
void torch_stop(torch_proc *tp);
/* .venv-bench/ under root with torch, numpy and matplotlib from PyPI; 0 or 1. */
int setup_torch(const char *root);
/* The source tree: the folder above the one holding this executable (build/attn), when
 * it has scripts/bench_torch.py; else the current folder. */
void source_root(char *out, size_t n);
bool file_exists(const char *path);

#endif /* ATTN_TOOLS_BENCH_PEER_H */
