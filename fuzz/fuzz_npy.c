/*
 * fuzz_npy.c — libFuzzer harness of the .npy reader (tools/attn/npy.c).
 *
 * Each input is written to a file and read with npy_read. A refused file must leave the
 * array empty and give a one-line reason; an accepted one must be self-consistent (count
 * the product of the shape, data present) and survive a round trip: npy_write, then
 * npy_read again, gives the same dtype, shape and bytes. Files live in one private
 * directory (on /dev/shm when there is one), removed at exit.
 * Build and run: make fuzz (see the Makefile), corpus in fuzz/corpus/fuzz_npy/.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "npy.h"

static char g_dir[64], g_in[96], g_out[96];

static void cleanup(void) {
    unlink(g_in);
    unlink(g_out);
    rmdir(g_dir);
}

static void setup(void) {
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(g_dir, sizeof g_dir, "%s/fuzz_npy.XXXXXX", base);
    if (!mkdtemp(g_dir)) abort();
    snprintf(g_in, sizeof g_in, "%s/in.npy", g_dir);
    snprintf(g_out, sizeof g_out, "%s/out.npy", g_dir);
    atexit(cleanup);
}

static void write_file(const char *path, const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) abort();
}

#define REQUIRE(cond)                                                         \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "fuzz_npy: %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                          \
        }                                                                     \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_dir[0]) setup();
    write_file(g_in, data, size);
    npy_array a;
    char err[256] = "";
    if (npy_read(g_in, &a, err, sizeof err) != 0) {
        /* refused: empty array, a reason of one line */
        REQUIRE(a.data == NULL && a.ndim == 0 && a.count == 0);
        REQUIRE(err[0] != '\0' && strchr(err, '\n') == NULL);
        return 0;
    }
    REQUIRE(a.data != NULL && a.ndim >= 0 && a.ndim <= NPY_MAX_DIMS);
    const size_t es = npy_dtype_size(a.dtype);
    REQUIRE(es > 0);
    int64_t count = 1;
    for (int d = 0; d < a.ndim; d++) {
        REQUIRE(a.shape[d] >= 0);
        count *= a.shape[d];  // cannot overflow: the data is in the input
    }
    REQUIRE(count == a.count && (uint64_t)count * es <= size);

    REQUIRE(npy_write(g_out, a.dtype, a.ndim, a.shape, a.data, err, sizeof err) == 0);
    npy_array b;
    REQUIRE(npy_read(g_out, &b, err, sizeof err) == 0);
    REQUIRE(b.dtype == a.dtype && b.ndim == a.ndim && b.count == a.count);
    REQUIRE(memcmp(b.shape, a.shape, sizeof a.shape[0] * (size_t)a.ndim) == 0);
    REQUIRE(memcmp(b.data, a.data, (size_t)count * es) == 0);
    npy_free(&a);
    npy_free(&b);
    REQUIRE(a.data == NULL);
    return 0;
}
