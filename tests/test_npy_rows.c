/*
 * test_npy_rows.c — npy_read_rows (tools/attn/npy.c), how each process of `attn ring` reads
 *                   only its rows of a .npy file: the rows of two ranges along an axis
 *                   for every index of the axes before it, against the whole file read
 *                   by npy_read; the file's length along the axis alone (nr = 0); empty
 *                   ranges; ranges outside the axis, an axis outside the rank and a
 *                   truncated file refused with a reason.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "npy.h"

int main(void) {
    char path[] = "/tmp/test_npy_rows.XXXXXX";
    const int fd = mkstemp(path);
    CHECK(fd >= 0, "a temporary file");
    if (fd < 0) return check_summary("npy_rows");
    close(fd);
    enum { A = 2, H = 3, L = 11, D = 4 };
    float *x = malloc(sizeof(float) * A * H * L * D);
    for (int i = 0; i < A * H * L * D; i++) x[i] = (float)i;
    char err[256];
    CHECK(npy_write(path, ATTN_F32, 4, (int64_t[]){A, H, L, D}, x, err, sizeof err) == 0, "write: %s", err);

    const int64_t cuts[][4] = {{0, 3, 8, 3}, {2, 2, 5, 0}, {0, 0, 0, 11}, {10, 1, 0, 0}, {4, 0, 9, 0}};
    for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
        const int64_t first[2] = {cuts[c][0], cuts[c][2]}, count[2] = {cuts[c][1], cuts[c][3]};
        npy_array a;
        int64_t len = -1;
        const int rc = npy_read_rows(path, 2, 2, first, count, &a, &len, err, sizeof err);
        CHECK(rc == 0 && len == L, "rows %lld+%lld, %lld+%lld: %s", (long long)first[0],
              (long long)count[0], (long long)first[1], (long long)count[1], rc ? err : "");
        if (rc) continue;
        const int64_t n = count[0] + count[1];
        CHECK(a.ndim == 4 && a.shape[0] == A && a.shape[1] == H && a.shape[2] == n && a.shape[3] == D &&
              a.count == A * H * n * D, "shape");
        int same = 1;
        const float *got = a.data;
        for (int64_t bh = 0; bh < A * H; bh++)
            for (int r = 0; r < 2; r++)
                for (int64_t i = first[r]; i < first[r] + count[r]; i++)
                    for (int d = 0; d < D; d++) same &= *got++ == x[(bh * L + i) * D + d];
        CHECK(same, "the rows read are the file's (case %zu)", c);
        npy_free(&a);
    }
    /* the length alone */
    npy_array a;
    int64_t len = 0;
    CHECK(npy_read_rows(path, 2, 0, NULL, NULL, &a, &len, err, sizeof err) == 0 && len == L &&
          a.count == 0, "nr = 0 gives the length %lld", (long long)len);
    npy_free(&a);
    /* refused */
    CHECK(npy_read_rows(path, 2, 1, (int64_t[]){9}, (int64_t[]){3}, &a, NULL, err, sizeof err) != 0 &&
          strstr(err, "outside"), "rows beyond the axis refused: %s", err);
    CHECK(npy_read_rows(path, 2, 1, (int64_t[]){-1}, (int64_t[]){1}, &a, NULL, err, sizeof err) != 0,
          "a negative first row refused");
    CHECK(npy_read_rows(path, 4, 0, NULL, NULL, &a, NULL, err, sizeof err) != 0 && strstr(err, "axis"),
          "an axis beyond the rank refused: %s", err);
    CHECK(truncate(path, 128 + 4 * 10) == 0, "truncated");
    CHECK(npy_read_rows(path, 2, 1, (int64_t[]){0}, (int64_t[]){1}, &a, NULL, err, sizeof err) != 0 &&
          strstr(err, "truncated"), "a truncated file refused like npy_read: %s", err);
    unlink(path);
    free(x);
    return check_summary("npy_rows");
}
