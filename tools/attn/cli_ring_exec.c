/*
 * cli_ring_exec.c — `attn ring`: ring attention over MPI on .npy files. The attn command
 *                   itself never links MPI: this hands the arguments to the program
 *                   attn-ring (tools/mpi/attn_ring.c, built beside attn where mpicc
 *                   exists) by exec, in the same process, so that `mpirun -n P attn ring
 *                   ...` runs P copies of it. Without attn-ring it fails with a usage
 *                   exit status and says why (docs/CLI.md, docs/RING.md).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

int cli_ring(int argc, char **argv) {
    (void)argc;
    /* ATTN_RING names the program; else attn-ring beside this executable */
    char path[4096];
    const char *env = getenv("ATTN_RING");
    if (env && *env) {
        snprintf(path, sizeof path, "%s", env);
    } else {
        const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 16);
        if (n <= 0) {
            fprintf(stderr, "attn: ring: cannot find this program's directory\n");
            return 2;
        }
        path[n] = '\0';
        char *slash = strrchr(path, '/');
        snprintf(slash ? slash + 1 : path, sizeof path - (size_t)(slash ? slash + 1 - path : 0),
                 "attn-ring");
    }
    if (access(path, X_OK) != 0) {
        fprintf(stderr, "attn: ring: this attn was built without MPI (%s: %s); build it where "
                "mpicc exists (scripts/deps.sh installs Open MPI) to get attn-ring\n", path,
                strerror(errno));
        return 2;
    }
    argv[0] = path;
    execv(path, argv);
    fprintf(stderr, "attn: ring: cannot run %s: %s\n", path, strerror(errno));
    return 1;
}
