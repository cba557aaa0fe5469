/*
 * npy.c — the NumPy .npy reader and writer declared in npy.h, for the attn command and
 *         the tests.
 *
 * What it is: a strict reader of format 1.0/2.0/3.0 files (the header dict is parsed as
 * a small Python literal, in any key order and spacing, never by fixed offsets) and a
 * writer of format 1.0 (2.0 when the header is too long), through a temporary file and
 * rename(). What it is not: a general NumPy loader — no Fortran order, no big-endian
 * data, no structured or object dtypes, no memory mapping. Little-endian hosts only.
 * Sizes are 64-bit throughout; files over 2 GiB read and write in chunks.
 */
#define _FILE_OFFSET_BITS 64
#include "npy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char NPY_MAGIC[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};
enum { NPY_ALIGN = 64 };                 /* NumPy starts the data at a multiple of this */
static const size_t NPY_CHUNK = (size_t)1 << 30;  /* bytes per fread/fwrite call        */

static int fail(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static bool host_is_little_endian(void) {
    const uint16_t one = 1;
    return *(const unsigned char *)&one == 1;
}

/* r = a * b for a, b >= 0; false on int64 overflow. */
static bool mul_i64(int64_t a, int64_t b, int64_t *r) {
    if (a != 0 && b > INT64_MAX / a) return false;
    *r = a * b;
    return true;
}

size_t npy_dtype_size(attn_dtype dtype) {
    switch (dtype) {
    case ATTN_F32: return 4;
    case ATTN_F16: return 2;
    case ATTN_BOOL: return 1;
    case ATTN_I32: return 4;
    case ATTN_I64: return 8;
    case ATTN_F64: return 8;
    default: return 0;
    }
}

void npy_free(npy_array *a) {
    if (!a) return;
    free(a->data);
    memset(a, 0, sizeof *a);
}

/* ---- the header dict ---------------------------------------------------------------
 * {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } — exactly these three keys,
 * string values in '' or "", True/False, a tuple of non-negative integers. */

typedef struct hparser {
    const char *s, *p, *end;
    char *err;
    size_t errlen;
} hparser;

static void skip_ws(hparser *h) {
    while (h->p < h->end && (*h->p == ' ' || *h->p == '\t' || *h->p == '\n' || *h->p == '\r'))
        h->p++;
}

static int parse_error(hparser *h, const char *what) {
    return fail(h->err, h->errlen, "header does not parse: expected %s at byte %lld", what,
                (long long)(h->p - h->s));
}

/* Skip whitespace, then consume c if it is next. */
static bool accept(hparser *h, char c) {
    skip_ws(h);
    if (h->p < h->end && *h->p == c) {
        h->p++;
        return true;
    }
    return false;
}

/* A quoted string into out (printable ASCII kept, anything else as '?', so that it can be
 * quoted in a one-line message). */
static int parse_string(hparser *h, char *out, size_t cap) {
    skip_ws(h);
    if (h->p >= h->end || (*h->p != '\'' && *h->p != '"')) return parse_error(h, "a string");
    char quote = *h->p++;
    size_t n = 0;
    while (h->p < h->end && *h->p != quote) {
        char c = *h->p++;
        if (c == '\\' && h->p < h->end) c = *h->p++;
        if (n + 1 >= cap) return fail(h->err, h->errlen, "header has a string longer than %zu bytes", cap - 1);
        out[n++] = (c >= 32 && c < 127) ? c : '?';
    }
    if (h->p >= h->end) return parse_error(h, "a closing quote");
    h->p++;
    out[n] = '\0';
    return 0;
}

static int parse_bool(hparser *h, bool *v) {
    skip_ws(h);
    size_t left = (size_t)(h->end - h->p);
    if (left >= 4 && memcmp(h->p, "True", 4) == 0) { *v = true; h->p += 4; return 0; }
    if (left >= 5 && memcmp(h->p, "False", 5) == 0) { *v = false; h->p += 5; return 0; }
    return parse_error(h, "True or False");
}

/* ( ) | ( n , ) | ( n , n [,] ) ... ; Python 2's 'L' suffix accepted. */
static int parse_shape(hparser *h, int *ndim, int64_t *shape) {
    if (!accept(h, '(')) return parse_error(h, "'(' to open the shape");
    *ndim = 0;
    for (;;) {
        if (accept(h, ')')) return 0;
        skip_ws(h);
        if (h->p < h->end && *h->p == '-')
            return fail(h->err, h->errlen, "shape has a negative dimension");
        if (h->p >= h->end || *h->p < '0' || *h->p > '9') return parse_error(h, "a dimension");
        int64_t v = 0;
        while (h->p < h->end && *h->p >= '0' && *h->p <= '9') {
            int d = *h->p++ - '0';
            if (v > (INT64_MAX - d) / 10)
                return fail(h->err, h->errlen, "shape has a dimension that does not fit in 64 bits");
            v = v * 10 + d;
        }
        if (h->p < h->end && *h->p == 'L') h->p++;
        if (*ndim == NPY_MAX_DIMS)
            return fail(h->err, h->errlen, "rank is more than the %d supported", NPY_MAX_DIMS);
        shape[(*ndim)++] = v;
        if (accept(h, ',')) continue;
        if (accept(h, ')')) return 0;
        return parse_error(h, "',' or ')' in the shape");
    }
}

/* Maps a descr to a dtype; on refusal says which dtype it was. */
static int parse_descr(const char *descr, attn_dtype *dtype, char *err, size_t errlen) {
    const char *d = descr;
    char order = '=';
    if (*d == '<' || *d == '>' || *d == '|' || *d == '=') order = *d++;
    char kind = *d ? *d++ : '\0';
    long size = 0;
    while (*d >= '0' && *d <= '9' && size < 1000) size = size * 10 + (*d++ - '0');

    attn_dtype t = ATTN_DTYPE_COUNT;
    if (*d == '\0') {
        if (kind == 'f' && size == 4) t = ATTN_F32;
        else if (kind == 'f' && size == 8) t = ATTN_F64;
        else if (kind == 'f' && size == 2) t = ATTN_F16;
        else if (kind == 'b' && size == 1) t = ATTN_BOOL;
        else if (kind == 'i' && size == 4) t = ATTN_I32;
        else if (kind == 'i' && size == 8) t = ATTN_I64;
    }
    if (t == ATTN_DTYPE_COUNT) {
        char name[48];
        switch (kind) {
        case 'f': snprintf(name, sizeof name, "float%ld", size * 8); break;
        case 'i': snprintf(name, sizeof name, "int%ld", size * 8); break;
        case 'u': snprintf(name, sizeof name, "uint%ld", size * 8); break;
        case 'c': snprintf(name, sizeof name, "complex%ld", size * 8); break;
        case 'b': snprintf(name, sizeof name, "bool of %ld bytes", size); break;
        case 'U': snprintf(name, sizeof name, "unicode string"); break;
        case 'S': case 'a': snprintf(name, sizeof name, "byte string"); break;
        case 'O': snprintf(name, sizeof name, "Python object"); break;
        case 'V': snprintf(name, sizeof name, "raw void"); break;
        case 'M': snprintf(name, sizeof name, "datetime64"); break;
        case 'm': snprintf(name, sizeof name, "timedelta64"); break;
        default: snprintf(name, sizeof name, "unknown"); break;
        }
        return fail(err, errlen,
                    "dtype '%s' (%s) is not supported, expected float32, float16, bool, int32 "
                    "or int64", descr, name);
    }
    if (order == '>' && size > 1)
        return fail(err, errlen, "big-endian dtype '%s' is not supported", descr);
    *dtype = t;
    return 0;
}

/* Fills ndim, shape, dtype from the header text s[0..n). */
static int parse_header(const char *s, size_t n, npy_array *a, char *err, size_t errlen) {
    hparser h = {s, s, s + n, err, errlen};
    bool have_descr = false, have_order = false, have_shape = false, fortran = false;
    char descr[64] = "";

    if (!accept(&h, '{')) return parse_error(&h, "'{' to open the header dict");
    while (!accept(&h, '}')) {
        char key[64];
        if (parse_string(&h, key, sizeof key)) return -1;
        if (!accept(&h, ':')) return parse_error(&h, "':' after a key");
        bool *seen = NULL;
        int rc;
        if (strcmp(key, "descr") == 0) {
            seen = &have_descr;
            skip_ws(&h);
            if (h.p < h.end && *h.p == '[')
                return fail(err, errlen, "structured dtypes are not supported");
            rc = parse_string(&h, descr, sizeof descr);
        } else if (strcmp(key, "fortran_order") == 0) {
            seen = &have_order;
            rc = parse_bool(&h, &fortran);
        } else if (strcmp(key, "shape") == 0) {
            seen = &have_shape;
            rc = parse_shape(&h, &a->ndim, a->shape);
        } else {
            return fail(err, errlen, "header has an unexpected key '%s'", key);
        }
        if (rc) return -1;
        if (*seen) return fail(err, errlen, "header has the key '%s' twice", key);
        *seen = true;
        if (accept(&h, ',')) continue;
        if (accept(&h, '}')) break;
        return parse_error(&h, "',' or '}' after a value");
    }
    skip_ws(&h);
    if (h.p != h.end) return parse_error(&h, "the end of the header after the dict");
    if (!have_descr) return fail(err, errlen, "header lacks the key 'descr'");
    if (!have_order) return fail(err, errlen, "header lacks the key 'fortran_order'");
    if (!have_shape) return fail(err, errlen, "header lacks the key 'shape'");
    if (parse_descr(descr, &a->dtype, err, errlen)) return -1;
    if (fortran) return fail(err, errlen, "fortran_order arrays are not supported");
    return 0;
}

/* ---- reading ------------------------------------------------------------------------ */

static int read_all(FILE *f, void *buf, size_t n) {
    unsigned char *p = buf;
    while (n > 0) {
        size_t want = n < NPY_CHUNK ? n : NPY_CHUNK;
        size_t got = fread(p, 1, want, f);
        p += got;
        n -= got;
        if (got < want) return -1;
    }
    return 0;
}

/* The header and every check of the file's size, leaving f at the first data byte and
 * a->data NULL. */
static int read_meta(FILE *f, npy_array *a, char *err, size_t errlen) {
    struct stat st;
    if (fstat(fileno(f), &st) != 0) return fail(err, errlen, "cannot stat: %s", strerror(errno));
    if (!S_ISREG(st.st_mode)) return fail(err, errlen, "not a regular file");
    int64_t fsize = (int64_t)st.st_size;

    unsigned char pre[12];
    if (fsize < 10 || read_all(f, pre, 10)) return fail(err, errlen, "not a .npy file (too short)");
    if (memcmp(pre, NPY_MAGIC, 6) != 0) return fail(err, errlen, "not a .npy file (bad magic bytes)");
    int major = pre[6], minor = pre[7];
    if (!(major >= 1 && major <= 3 && minor == 0))
        return fail(err, errlen, "unknown .npy format version %d.%d", major, minor);
    int64_t pre_len = major == 1 ? 10 : 12, hlen;
    if (major == 1) {
        hlen = pre[8] | (int64_t)pre[9] << 8;
    } else {
        if (fsize < 12 || read_all(f, pre + 10, 2)) return fail(err, errlen, "truncated header");
        hlen = pre[8] | (int64_t)pre[9] << 8 | (int64_t)pre[10] << 16 | (int64_t)pre[11] << 24;
    }
    if (hlen > fsize - pre_len)
        return fail(err, errlen, "truncated header: it claims %lld bytes, the file has %lld after "
                    "the preamble", (long long)hlen, (long long)(fsize - pre_len));

    char *hdr = malloc((size_t)hlen + 1);
    if (!hdr) return fail(err, errlen, "out of memory reading a %lld-byte header", (long long)hlen);
    int rc = read_all(f, hdr, (size_t)hlen);
    if (rc == 0) {
        hdr[hlen] = '\0';
        rc = parse_header(hdr, (size_t)hlen, a, err, errlen);
    } else {
        fail(err, errlen, "cannot read the header: %s", ferror(f) ? strerror(errno) : "end of file");
    }
    free(hdr);
    if (rc) return -1;

    int64_t count = 1, bytes;
    for (int i = 0; i < a->ndim; i++)
        if (!mul_i64(count, a->shape[i], &count))
            return fail(err, errlen, "shape has more elements than fit in 64 bits");
    if (!mul_i64(count, (int64_t)npy_dtype_size(a->dtype), &bytes))
        return fail(err, errlen, "data size does not fit in 64 bits");
    int64_t have = fsize - pre_len - hlen;
    if (have < bytes)
        return fail(err, errlen, "truncated data: header says %lld bytes of data, file has %lld",
                    (long long)bytes, (long long)have);
    if (have > bytes)
        return fail(err, errlen, "trailing bytes: header says %lld bytes of data, file has %lld",
                    (long long)bytes, (long long)have);
    if ((uint64_t)bytes > SIZE_MAX - 1) return fail(err, errlen, "data too large for this machine");
    a->count = count;
    return 0;
}

static int read_file(FILE *f, npy_array *a, char *err, size_t errlen) {
    if (read_meta(f, a, err, errlen)) return -1;
    const int64_t bytes = a->count * (int64_t)npy_dtype_size(a->dtype);
    a->data = malloc(bytes ? (size_t)bytes : 1);  /* never NULL, even when empty */
    if (!a->data) return fail(err, errlen, "out of memory (%lld bytes of data)", (long long)bytes);
    if (read_all(f, a->data, (size_t)bytes))
        return fail(err, errlen, "cannot read the data: %s",
                    ferror(f) ? strerror(errno) : "file shrank while reading");
    return 0;
}

/* path opened for reading, checked to be a regular file first (*f NULL on failure) */
static int open_npy(const char *path, FILE **fp, char *err, size_t errlen) {
    *fp = NULL;
    if (!host_is_little_endian()) return fail(err, errlen, "only little-endian hosts are supported");
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer; the
     * file is then checked to be regular (read_file) before any read, and reads of a
     * regular file do not depend on the flag */
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) return fail(err, errlen, "cannot open: %s", strerror(errno));
    struct stat st;
    const char *why = NULL;
    if (fstat(fd, &st) != 0) why = strerror(errno);
    else if (S_ISDIR(st.st_mode)) why = "not a regular file (a directory)";
    else if (!S_ISREG(st.st_mode)) why = "not a regular file (a device, FIFO or socket)";
    if (why) {
        close(fd);
        return fail(err, errlen, "%s", why);
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return fail(err, errlen, "cannot open: %s", strerror(errno));
    }
    *fp = f;
    return 0;
}

int npy_read(const char *path, npy_array *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    FILE *f;
    if (open_npy(path, &f, err, errlen)) return -1;
    npy_array a = {0};
    int rc = read_file(f, &a, err, errlen);
    fclose(f);
    if (rc) {
        npy_free(&a);
        return -1;
    }
    *out = a;
    return 0;
}

int npy_read_rows(const char *path, int axis, int nr, const int64_t *first, const int64_t *count,
                  npy_array *out, int64_t *axis_len, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    FILE *f;
    if (open_npy(path, &f, err, errlen)) return -1;
    npy_array a = {0};
    int rc = read_meta(f, &a, err, errlen);
    const long data_at = rc ? 0 : ftell(f);
    if (!rc && (axis < 0 || axis >= a.ndim))
        rc = fail(err, errlen, "has rank %d, no axis %d to take rows of", a.ndim, axis);
    const int64_t extent = rc ? 0 : a.shape[axis];
    if (axis_len) *axis_len = extent;
    int64_t outer = 1, inner = 1, rows = 0;
    for (int r = 0; !rc && r < nr; r++) {
        if (first[r] < 0 || count[r] < 0 || first[r] > extent - count[r])
            rc = fail(err, errlen, "rows [%lld, %lld) of axis %d are outside its %lld",
                      (long long)first[r], (long long)(first[r] + count[r]), axis,
                      (long long)extent);
        rows += count[r];
    }
    const size_t es = npy_dtype_size(a.dtype);
    if (!rc) {
        for (int d = 0; d < axis; d++) outer *= a.shape[d];
        for (int d = axis + 1; d < a.ndim; d++) inner *= a.shape[d];
        a.count = outer * rows * inner;  // no overflow: at most the file's count
        a.shape[axis] = rows;
        if (!(a.data = malloc(a.count > 0 ? (size_t)a.count * es : 1)))
            rc = fail(err, errlen, "out of memory (%lld elements)", (long long)a.count);
    }
    char *at = a.data;
    for (int64_t o = 0; !rc && o < outer; o++)
        for (int r = 0; !rc && r < nr; r++) {
            if (count[r] == 0 || inner == 0) continue;
            const int64_t off = ((o * extent + first[r]) * inner) * (int64_t)es;
            const size_t n = (size_t)(count[r] * inner) * es;
            if (fseeko(f, (off_t)data_at + (off_t)off, SEEK_SET) || read_all(f, at, n))
                rc = fail(err, errlen, "cannot read the data: %s",
                          ferror(f) ? strerror(errno) : "file shrank while reading");
            at += n;
        }
    fclose(f);
    if (rc) {
        npy_free(&a);
        return -1;
    }
    *out = a;
    return 0;
}

/* ---- writing ------------------------------------------------------------------------ */

static int write_all(FILE *f, const void *buf, size_t n) {
    const unsigned char *p = buf;
    while (n > 0) {
        size_t want = n < NPY_CHUNK ? n : NPY_CHUNK;
        if (fwrite(p, 1, want, f) != want) return -1;
        p += want;
        n -= want;
    }
    return 0;
}

/* The file's preamble and header dict into pre/hdr (lengths *pre_len, *hdr_len) and its
 * data size into *bytes; -1 with a reason when it cannot be written. */
static int make_header(attn_dtype dtype, int ndim, const int64_t *shape, const void *data,
                       unsigned char pre[12], int *pre_len, char *hdr, int *hdr_len,
                       int64_t *bytes, char *err, size_t errlen) {
    if (!host_is_little_endian()) return fail(err, errlen, "only little-endian hosts are supported");
    const char *descr = dtype == ATTN_F32 ? "<f4" : dtype == ATTN_F16 ? "<f2"
                      : dtype == ATTN_BOOL ? "|b1" : dtype == ATTN_I32 ? "<i4"
                      : dtype == ATTN_I64 ? "<i8" : dtype == ATTN_F64 ? "<f8" : NULL;
    if (!descr) return fail(err, errlen, "cannot write dtype %d", (int)dtype);
    if (ndim < 0 || ndim > NPY_MAX_DIMS)
        return fail(err, errlen, "cannot write rank %d (0 to %d supported)", ndim, NPY_MAX_DIMS);

    /* the dict, then spaces and '\n' so that the data starts at a multiple of 64 */
    int64_t count = 1;
    int n = snprintf(hdr, 512, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return fail(err, errlen, "cannot write a negative dimension");
        if (!mul_i64(count, shape[i], &count))
            return fail(err, errlen, "shape has more elements than fit in 64 bits");
        n += snprintf(hdr + n, 512 - (size_t)n, ndim == 1 ? "%lld," : i ? ", %lld" : "%lld",
                      (long long)shape[i]);
    }
    n += snprintf(hdr + n, 512 - (size_t)n, "), }");
    if (n <= 0 || n >= 512) return fail(err, errlen, "header too long");  /* rank <= 8: < 300 */
    if (!mul_i64(count, (int64_t)npy_dtype_size(dtype), bytes) || (uint64_t)*bytes > SIZE_MAX)
        return fail(err, errlen, "data size does not fit in memory sizes");
    if (*bytes > 0 && !data) return fail(err, errlen, "no data to write");

    /* format 1.0 unless the header needs more than 65535 bytes (never at rank <= 8) */
    *pre_len = n + 1 + NPY_ALIGN <= 65535 ? 10 : 12;
    int pad = NPY_ALIGN - (*pre_len + n + 1) % NPY_ALIGN;
    if (pad == NPY_ALIGN) pad = 0;
    memset(hdr + n, ' ', (size_t)pad);
    n += pad;
    hdr[n++] = '\n';
    memcpy(pre, NPY_MAGIC, 6);
    pre[6] = *pre_len == 10 ? 1 : 2;
    pre[7] = 0;
    for (int i = 0; i < *pre_len - 8; i++) pre[8 + i] = (unsigned char)((uint32_t)n >> (8 * i));
    *hdr_len = n;
    return 0;
}

int npy_write_fd(int fd, attn_dtype dtype, int ndim, const int64_t *shape, const void *data,
                 char *err, size_t errlen) {
    char hdr[512 + NPY_ALIGN];
    unsigned char pre[12];
    int pre_len = 0, n = 0;
    int64_t bytes = 0;
    if (make_header(dtype, ndim, shape, data, pre, &pre_len, hdr, &n, &bytes, err, errlen)) {
        close(fd);
        return -1;
    }
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        const int e = errno;
        close(fd);
        return fail(err, errlen, "cannot write: %s", strerror(e));
    }
    int rc = 0;
    if (write_all(f, pre, (size_t)pre_len) || write_all(f, hdr, (size_t)n) ||
        write_all(f, data, (size_t)bytes) || fflush(f) != 0)
        rc = -1;
    int e = errno;
    if (fclose(f) != 0 && rc == 0) { rc = -1; e = errno; }
    if (rc) fail(err, errlen, "cannot write: %s", strerror(e));
    return rc;
}

int npy_write(const char *path, attn_dtype dtype, int ndim, const int64_t *shape,
              const void *data, char *err, size_t errlen) {
    char hdr[512 + NPY_ALIGN];  // refused before a temporary file exists
    unsigned char pre[12];
    int pre_len = 0, n = 0;
    int64_t bytes = 0;
    if (make_header(dtype, ndim, shape, data, pre, &pre_len, hdr, &n, &bytes, err, errlen))
        return -1;
    size_t tlen = strlen(path) + 32;
    char *tmp = malloc(tlen);
    if (!tmp) return fail(err, errlen, "out of memory");
    snprintf(tmp, tlen, "%s.tmp.%ld", path, (long)getpid());
    unlink(tmp);  /* a leftover of an earlier process with the same pid */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0666);
    if (fd < 0) {
        int e = errno;
        free(tmp);
        return fail(err, errlen, "cannot create a temporary file: %s", strerror(e));
    }
    int rc = npy_write_fd(fd, dtype, ndim, shape, data, err, errlen);
    if (rc == 0 && rename(tmp, path) != 0) {
        rc = -1;
        fail(err, errlen, "cannot rename into place: %s", strerror(errno));
    }
    if (rc) unlink(tmp);
    free(tmp);
    return rc;
}
