/*
 * cli.h — the subcommands of the `attn` command, one function each, dispatched by
 *         attn_main.c. Each returns the process exit status (0 = success) and prints
 *         its own one-line errors on stderr.
 */
#ifndef ATTN_CLI_H
#define ATTN_CLI_H

#include <stdbool.h>

int cli_run(int argc, char **argv);   /* attn run ...   (tools/attn/cli_run.c)  */
int cli_demo(int argc, char **argv);  /* attn demo      (tools/attn/cli_demo.c) */
int cli_bench(int argc, char **argv); /* attn bench     (bench/cli_bench.c) */
int cli_bench_masks(int argc, char **argv);  /* attn bench masks (bench/cli_bench_masks.c) */
int cli_dtypes(int argc, char **argv);  /* attn dtypes  (tools/attn/cli_dtypes.c) */
int cli_tune(int argc, char **argv);    /* attn tune    (tools/attn/cli_tune.c) */
int cli_train(int argc, char **argv);   /* attn train   (examples/train/cli_train.c) */
int cli_seq2seq(int argc, char **argv);  /* attn seq2seq (examples/seq2seq/cli_seq2seq.c) */
int bench_additive(int argc, char **argv); /* attn bench --additive (bench/bench_additive.c) */
int bench_paged(int argc, char **argv);    /* attn bench --paged (bench/bench_paged.c) */
int bench_q8(int argc, char **argv);       /* attn bench --q8 (bench/bench_q8.c) */
int bench_overlap(int argc, char **argv);  /* attn bench --overlap (bench/bench_overlap.c) */
int bench_mla(int argc, char **argv);      /* attn bench --mla (bench/bench_mla.c) */
int bench_step(int argc, char **argv);     /* attn bench --step (bench/bench_step.c) */
int bench_f64(int argc, char **argv);      /* attn bench --f64 (bench/bench_f64.c) */
int bench_dropout(int argc, char **argv);  /* attn bench --dropout (bench/bench_dropout.c) */
int bench_bias_grad(int argc, char **argv);  /* attn bench --bias-grad (bench/bench_bias_grad.c) */
int bench_varlen(int argc, char **argv);     /* attn bench --varlen (bench/bench_varlen.c) */
int bench_block_mask(int argc, char **argv); /* attn bench --block-mask (bench/bench_block_mask.c) */
int bench_models(int argc, char **argv);   /* attn bench --models (bench/bench_models.c) */
int bench_cascade(int argc, char **argv);  /* attn bench --cascade (bench/bench_cascade.c) */
int cli_bench_mha(int argc, char **argv);  /* attn bench-mha (bench/bench_mha.c) */
int demo_mha(void);  /* attn demo's multi-head examples (tools/attn/demo_mha.c) */
/* This machine's fp32 FMA peak (GFLOP/s, the best ISA) and read bandwidth (GB/s) on
 * `threads` threads, as `attn bench` measures them (bench/cli_bench.c); short
 * measurements with quick. Returns non-zero (after a message) when out of memory. */
int bench_machine_peak(int threads, bool quick, double *fp32_gflops, double *read_gbs);
int cli_viz(int argc, char **argv);     /* attn viz     (tools/attn/cli_viz.c)   */
int cli_ring(int argc, char **argv);    /* attn ring    (tools/attn/cli_ring_exec.c: execs attn-ring) */
/* attn bench --head-dims ... (bench/bench_headdim.c): speed against the head dimension */
int bench_head_dims(int argc, char **argv);
/* attn bench --viz ... (bench/bench_viz.c): time and peak memory of the 100K-token picture */
int bench_viz(int argc, char **argv);

#endif /* ATTN_CLI_H */
