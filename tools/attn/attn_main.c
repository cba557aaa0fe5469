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

/* The subcommands, in the order `attn --help` lists them: the one table of both the
 * dispatch and the usage text. */
static const struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *what;
} COMMANDS[] = {
    {"run", cli_run, "attention over .npy files (attn run --help for its options)"},
    {"ring", cli_ring, "attention over .npy files on the processes of mpirun (attn ring --help)"},
    {"demo", cli_demo, "a short demonstration of the library"},
    {"bench", cli_bench, "this machine's peak, then the library's speed (attn bench --help)"},
    {"bench-mha", cli_bench_mha, "the multi-head module's speed: BERT-base layer, Llama decoding step"},
    {"tune", cli_tune, "time this machine's choices and write them as wisdom (attn tune --help)"},
    {"dtypes", cli_dtypes, "float32, float16 and bfloat16 side by side (seed 003, exercise 2)"},
    {"train", cli_train, "a small transformer, causal vs reversed mask (seed 003, exercise 3)"},
    {"seq2seq", cli_seq2seq, "a GRU encoder-decoder with additive attention learns to reverse (seed 002)"},
    {"viz", cli_viz, "heatmaps of attention weights as PNG, any length (attn viz --help)"},
};
enum { N_COMMANDS = sizeof COMMANDS / sizeof COMMANDS[0] };

static void usage(void) {
    fputs("usage: attn <command> [options]\n\n", stdout);
    for (int i = 0; i < N_COMMANDS; i++) printf("  %-9s %s\n", COMMANDS[i].name, COMMANDS[i].what);
    fputs("  help      this text\n"
          "\n"
          "  --version prints the library version, the kernel this process runs, the kernels\n"
          "            this CPU runs and the BLAS\n"
          "  --kernels prints every kernel of this build, one a line: its name, then 'runs' or\n"
          "            'cannot-run' on this CPU\n",
          stdout);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "attn: missing command (try 'attn --help')\n");
        return 2;
    }
    const char *cmd = argv[1];
    for (int i = 0; i < N_COMMANDS; i++)
        if (strcmp(cmd, COMMANDS[i].name) == 0) {
            /* ATTN_TUNE=auto: the quick tune before the first call reads the wisdom; `attn
             * tune` measures and writes a file itself */
            if (COMMANDS[i].run != cli_tune) (void)attn_tune_auto();
            return COMMANDS[i].run(argc - 1, argv + 1);
        }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage();
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
