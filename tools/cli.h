/*
 * cli.h — the subcommands of the `attn` command, one function each, dispatched by
 *         attn_main.c. Each returns the process exit status (0 = success) and prints
 *         its own one-line errors on stderr.
 */
#ifndef ATTN_CLI_H
#define ATTN_CLI_H

int cli_run(int argc, char **argv);   /* attn run ...   (tools/cli_run.c)  */
int cli_demo(int argc, char **argv);  /* attn demo      (tools/cli_demo.c) */
int cli_bench(int argc, char **argv); /* attn bench     (tools/cli_bench.c) */
int cli_dtypes(int argc, char **argv);  /* attn dtypes  (tools/cli_dtypes.c) */
int cli_train(int argc, char **argv);   /* attn train   (tools/cli_train.c) */
int cli_viz(int argc, char **argv);     /* attn viz     (tools/cli_viz.c)   */
/* attn bench --head-dims ... (tools/bench_headdim.c): speed against the head dimension */
int bench_head_dims(int argc, char **argv);

#endif /* ATTN_CLI_H */
