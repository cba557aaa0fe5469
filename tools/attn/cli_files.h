/*
 * cli_files.h — the file safety of every `attn` command that writes files (run, ring, viz,
 *               train, demo, seq2seq, bench): which paths may be read and written, and
 *               outputs written all-or-nothing, so that no call can lose a user's file.
 *
 * The rules (docs/CLI.md, "Files"): every input is an existing regular file; an output
 * is a regular file or a path that does not exist yet in an existing directory; an
 * output that is a symbolic link is written through to the file it names (the link
 * stays); no two outputs, and no output and input, are the same file (by device and
 * inode, after resolving links; by resolved path for an output that does not exist
 * yet). All of this is decided before anything is written. The outputs are then
 * written to temporary files in their targets' directories and renamed over the
 * targets only once every one of them is complete; on a failure the temporary files are
 * removed and every file is as it was. The first temporary file made sets SIGXFSZ to be
 * ignored, so that a file size limit fails the write (EFBIG) and the removal runs,
 * instead of killing the process with the temporary file left behind.
 *
 * Use: cli_files_check, then for each output cli_files_write (a .npy) or cli_files_open
 * (any other format), then cli_files_commit once all are complete; cli_files_abort in
 * every case at the end. cli_files_save does all of it for one output.
 */
#ifndef ATTN_CLI_FILES_H
#define ATTN_CLI_FILES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "attn.h"

typedef struct cli_path {
    const char *opt;   /* the option that named it, for messages: "--q", "--out", ... */
    const char *path;  /* as given                                                    */
    char *target;      /* outputs: the resolved file written (malloc'ed)              */
    char *tmp;         /* outputs: the temporary file, once made (malloc'ed)           */
    bool exists;
    uint64_t dev, ino;
    unsigned mode;     /* outputs that exist: their permission bits, kept             */
} cli_path;

/* Checks every path against the rules above. 0; -2 when two of the paths are one file
 * (the arguments contradict each other); -1 for any other refusal; each with a one-line
 * reason naming the file and option in err. Fills target, exists, dev, ino, mode. */
int cli_files_check(cli_path *in, int n_in, cli_path *out, int n_out, char *err, size_t errlen);

/* A new temporary file beside output o's target, with the permission bits it will have:
 * its descriptor (the caller writes and closes it), or -1 with the reason in err. It is
 * removed by cli_files_abort unless cli_files_commit renamed it. */
int cli_files_open(cli_path *o, char *err, size_t errlen);

/* Writes output o's array to a new temporary file beside its target. 0, or -1 with the
 * reason in err (the temporary files made so far stay until cli_files_abort). */
int cli_files_write(cli_path *out, attn_dtype dtype, int ndim, const int64_t *shape,
                    const void *data, char *err, size_t errlen);

/* Renames every temporary file over its target. 0, or -1 with the reason (the renames
 * done so far cannot be undone; each is of a complete file). */
int cli_files_commit(cli_path *out, int n_out, char *err, size_t errlen);

/* Removes the temporary files made and frees what cli_files_check allocated. */
void cli_files_abort(cli_path *out, int n_out);

/* Writes a file through `write` (given a descriptor, which it closes in every case; 0 or
 * -1 with the reason), the whole protocol for one output `path` of option `opt` against
 * the inputs in[]: 0; -2 (a usage error: the output is an input) or -1 with the reason. */
typedef int (*cli_writer)(int fd, const char *name, const void *ctx, char *err, size_t errlen);
int cli_files_save(const char *opt, const char *path, cli_path *in, int n_in, cli_writer write,
                   const void *ctx, char *err, size_t errlen);

/* The checks of cli_files_check for one output alone, nothing kept: for a command that
 * works a long time before cli_files_save writes its output, so that a refusal comes
 * first (the same checks run again when the file is written). 0, -2 or -1 as there. */
int cli_files_check_one(const char *opt, const char *path, char *err, size_t errlen);

/* cli_files_save for a text output: `print` writes it to a stream (a write error is found
 * from the stream afterwards). 0, or -1 with the reason. */
int cli_files_save_text(const char *opt, const char *path, void (*print)(FILE *f, const void *ctx),
                        const void *ctx, char *err, size_t errlen);

#endif /* ATTN_CLI_FILES_H */
