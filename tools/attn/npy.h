/*
 * npy.h — reading and writing NumPy .npy files (format 1.0, 2.0 and 3.0), for the attn
 *         command and the tests. Not part of libattn's public interface.
 *
 * What it reads: little-endian C-order arrays of float32, float16, bool, int32, int64
 * (and their '|'/'<' byte-order marks), of rank 0 to 8. Everything else is refused with
 * a one-line reason: Fortran order, big-endian, other dtypes, a header that does not
 * parse or lies about the data size, truncated data, a path that is not a regular file
 * (a FIFO, device or directory is refused before it is read). What it writes: format
 * 1.0 (2.0 when the header needs it), written to a temporary file and renamed, so that
 * a failed write leaves no partial file behind.
 */
#ifndef ATTN_NPY_H
#define ATTN_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "attn.h"

#define NPY_MAX_DIMS 8

typedef struct npy_array {
    attn_dtype dtype;              /* ATTN_F32, ATTN_F16, ATTN_BOOL, ATTN_I32, ATTN_I64, ATTN_F64 */
    int ndim;
    int64_t shape[NPY_MAX_DIMS];
    int64_t count;                 /* product of shape                                */
    void *data;                    /* malloc'ed, C order, count elements              */
} npy_array;

/* 0 on success. On failure returns -1, leaves *out empty and writes a one-line reason
 * (without the file name) into err. */
int npy_read(const char *path, npy_array *out, char *err, size_t errlen);

/* 0 on success, -1 with a reason in err. dtype as above. */
int npy_write(const char *path, attn_dtype dtype, int ndim, const int64_t *shape,
              const void *data, char *err, size_t errlen);

/* The same file written to fd, which is closed in every case; nothing is renamed. For a
 * caller that places and renames its own temporary files (tools/attn/cli_files.c). */
int npy_write_fd(int fd, attn_dtype dtype, int ndim, const int64_t *shape, const void *data,
                 char *err, size_t errlen);

/* Like npy_read, with every check of the whole file, but reading only the rows
 * [first[r], first[r] + count[r]) (r = 0 .. nr-1, in this order) along axis `axis`, for
 * every index of the axes before it (seeking to each): out has shape[axis] = the sum of
 * the counts; *axis_len (when not NULL) gets the file's own length along axis (nr = 0
 * reads only that). For a process of `attn ring`, which holds its slices of the sequence. */
int npy_read_rows(const char *path, int axis, int nr, const int64_t *first, const int64_t *count,
                  npy_array *out, int64_t *axis_len, char *err, size_t errlen);

void npy_free(npy_array *a);

/* bytes per element of a dtype npy handles, 0 for others */
size_t npy_dtype_size(attn_dtype dtype);

#endif /* ATTN_NPY_H */
