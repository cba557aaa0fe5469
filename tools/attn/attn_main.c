/*
 * attn_main.c — main() of the `attn` command: picks the subcommand and hands it the
 *               arguments from the subcommand's name on (argv[0] = "run", "demo", "bench").
 *
 * What it is not: any option parsing of its own beyond --help and --version; each
 * subcommand (cli.h) parses, reports and chooses its exit status itself.
 */
#include <stdio.h>
#include <string.h>

#include "attn.h"
#include "cli.h"

static const char USAGE[] =
    "usage: attn <command> [options]\n"
    "\n"
    "  run       attention over .npy files (attn run --help for its options)\n"
    "  ring      attention over .npy files on the processes of mpirun (attn ring --help)\n"
    "  demo      a short demonstration of the library\n"
    "  bench     this machine's peak, then the library's speed (attn bench --help)\n"
    "  bench-mha the multi-head module's speed: BERT-base layer, Llama decoding step\n"
    "  tune      time this machine's choices and write them as wisdom (attn tune --help)\n"
    "  dtypes    float32, float16 and bfloat16 side by side (seed 003, exercise 2)\n"
    "  train     a small transformer, causal vs reversed mask (seed 003, exercise 3)\n"
    "  seq2seq   a GRU encoder-decoder with additive attention learns to reverse (seed 002)\n"
    "  viz       heatmaps of attention weights as PNG, any length (attn viz --help)\n"
    "  help      this text\n"
    "\n"
    "  --version prints the library version, the kernel this process runs, the kernels\n"
    "            this CPU runs and the BLAS\n"
    "  --kernels prints every kernel of this build, one a line: its name, then 'runs' or\n"
    "            'cannot-run' on this CPU\n";

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "attn: missing command (try 'attn --help')\n");
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "run") == 0) return cli_run(argc - 1, argv + 1);
    if (strcmp(cmd, "demo") == 0) return cli_demo(argc - 1, argv + 1);
    if (strcmp(cmd, "bench") == 0) return cli_bench(argc - 1, argv + 1);
    if (strcmp(cmd, "bench-mha") == 0) return cli_bench_mha(argc - 1, argv + 1);
    if (strcmp(cmd, "tune") == 0) return cli_tune(argc - 1, argv + 1);
    if (strcmp(cmd, "dtypes") == 0) return cli_dtypes(argc - 1, argv + 1);
    if (strcmp(cmd, "train") == 0) return cli_train(argc - 1, argv + 1);
    if (strcmp(cmd, "seq2seq") == 0) return cli_seq2seq(argc - 1, argv + 1);
    if (strcmp(cmd, "viz") == 0) return cli_viz(argc - 1, argv + 1);
    if (strcmp(cmd, "ring") == 0) return cli_ring(argc - 1, argv + 1);
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        fputs(USAGE, stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("attn %s (kernel %s; this CPU runs:", attn_version(), attn_kernel_name());
        for (const char *const *k = attn_kernel_list(); *k; k++)
            if (attn_kernel_supported(*k)) printf(" %s", *k);
        printf(")\n");
        printf("BLAS: %s\n", attn_blas_name());
        return 0;
    }
    if (strcmp(cmd, "--kernels") == 0) {
        for (const char *const *k = attn_kernel_list(); *k; k++)
            printf("%s %s\n", *k, attn_kernel_supported(*k) ? "runs" : "cannot-run");
        return 0;
    }
    fprintf(stderr, "attn: unknown command '%s' (try 'attn --help')\n", cmd);
    return 2;
}
