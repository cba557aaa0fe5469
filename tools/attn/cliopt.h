/*
 * cliopt.h — the option scanner the `attn` subcommands share: `--name value`,
 *            `--name=value` and `--flag`, each at most once, anything else refused.
 *
 * What it is not: a parser of the values (each subcommand checks its own) or a printer
 * of help (a subcommand answers --help before scanning).
 */
#ifndef ATTN_CLIOPT_H
#define ATTN_CLIOPT_H

#include <stdarg.h>
#include <stdbool.h>

/* One option: a value option sets *value, a flag option sets *flag (exactly one of the
 * two pointers is non-NULL). */
typedef struct cli_opt {
    const char *name;
    const char **value;
    bool *flag;
} cli_opt;

/* One line on stderr, "attn: <who><message>" (who: "bench: ", "ring: ", or ""), and
 * returns code: the error messages of every subcommand and of attn-ring. */
int cli_say(int code, const char *who, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int cli_vsay(int code, const char *who, const char *fmt, va_list ap);

/* Scans argv[1..argc-1]. Returns 0, or 2 (a usage error) after printing one line,
 * "attn: <prefix>..." on stderr, naming the argument or option. `cmd` names the
 * subcommand in the pointer to its help ("see 'attn <cmd> --help'"). */
int cli_scan(int argc, char **argv, const cli_opt *opts, int nopts, const char *prefix,
             const char *cmd);

/* The options every `attn bench --<part>` program takes: --quick, --plant-error,
 * --threads N (0..512, 0 = OpenMP's default), --reps N (1..reps_max; default
 * reps_quick with --quick, else reps_full) and --isa NAME (a kernel this CPU runs: set as
 * ATTN_ISA before the part's first call). --help prints usage. Returns -1 to go on, or
 * the exit status (0 after --help, 2 on a usage error, told on stderr). */
typedef struct bench_part_args {
    bool quick, plant;
    int threads, reps;
} bench_part_args;
int bench_part_scan(int argc, char **argv, const char *part, const char *usage, int reps_quick,
                    int reps_full, int reps_max, bench_part_args *a);
/* bench_part_scan with a part's own options too (at most 8), scanned with the shared
 * ones (each at most once); their values the part checks itself */
int bench_part_scan_more(int argc, char **argv, const char *part, const char *usage,
                         int reps_quick, int reps_full, int reps_max, const cli_opt *more,
                         int nmore, bench_part_args *a);

#endif /* ATTN_CLIOPT_H */
