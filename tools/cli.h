/*
 * cli.h — the subcommands of the `attn` command, one function each, dispatched by
 *         attn_main.c. Each returns the process exit status (0 = success) and prints
 *         its own one-line errors on stderr.
 */
#ifndef ATTN_CLI_H
#define ATTN_CLI_H

#include <stdbool.h>

int cli_run(int argc, char **argv);   /* attn run ...   (tools/cli_run.c)  */
int cli_demo(int argc, char **argv);  /* attn demo      (tools/cli_demo.c) */
int cli_bench(int argc, char **argv); /* attn bench     (tools/cli_bench.c) */
int cli_bench_masks(int argc, char **argv);  /* attn bench masks (tools/cli_bench_masks.c) */
int cli_dtypes(int argc, char **argv);  /* attn dtypes  (tools/cli_dtypes.c) */
int cli_train(int argc, char **argv);   /* attn train   (tools/cli_train.c) */
int cli_seq2seq(int argc, char **argv);  /* attn seq2seq (tools/cli_seq2seq.c) */
int bench_additive(int argc, char **argv); /* attn bench --additive (tools/bench_additive.c) */
int bench_paged(int argc, char **argv);    /* attn bench --paged (tools/bench_paged.c) */
int bench_q8(int argc, char **argv);       /* attn bench --q8 (tools/bench_q8.c) */
int bench_dropout(int argc, char **argv);  /* attn bench --dropout (tools/bench_dropout.c) */
int bench_models(int argc, char **argv);   /* attn bench --models (tools/bench_models.c) */
int cli_bench_mha(int argc, char **argv);  /* attn bench-mha (tools/bench_mha.c) */
int demo_mha(void);  /* attn demo's multi-head examples (tools/demo_mha.c) */
/* This machine's fp32 FMA peak (GFLOP/s, the best ISA) and read bandwidth (GB/s) on
 * `threads` threads, as `attn bench` measures them (tools/cli_bench.c); short
 * measurements with quick. Returns non-zero (after a message) when out of memory. */
int bench_machine_peak(int threads, bool quick, double *fp32_gflops, double *read_gbs);
int cli_viz(int argc, char **argv);     /* attn viz     (tools/cli_viz.c)   */
int cli_ring(int argc, char **argv);    /* attn ring    (tools/cli_ring_exec.c: execs attn-ring) */
/* attn bench --head-dims ... (tools/bench_headdim.c): speed against the head dimension */
int bench_head_dims(int argc, char **argv);
/* attn bench --viz ... (tools/bench_viz.c): time and peak memory of the 100K-token picture */
int bench_viz(int argc, char **argv);

#endif /* ATTN_CLI_H */
