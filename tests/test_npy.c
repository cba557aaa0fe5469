/*
 * test_npy.c — unit tests of the .npy reader and writer (tools/attn/npy.c).
 *
 * What it covers: round-trips of every dtype at rank 0 to 4 and with a zero-length
 * dimension, the byte layout of what is written (version, 64-byte alignment, '\n'),
 * hand-made format 1.0/2.0/3.0 files with headers spelled in the ways Python allows,
 * each refusal the reader promises (with a one-line reason that names no file), and
 * writes that fail leaving nothing behind. What it is not: a test of the attn command
 * (tests/test_cli.sh). Set ATTN_TEST_BIG=1 to also round-trip a file over 2 GiB.
 */
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "npy.h"

static char g_dir[] = "/tmp/test_npy.XXXXXX";

static const char *tmp_path(const char *name) {
    static char buf[4][256];
    static int slot;
    char *p = buf[slot++ % 4];
    snprintf(p, 256, "%s/%s", g_dir, name);
    return p;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n) { perror(path); exit(2); }
    fclose(f);
}

/* A .npy file of format major.minor with the given header text (written as is) followed by
 * ndata bytes 0, 1, 2, ... */
static const char *make_npy(const char *name, int major, int minor, const char *header,
                            size_t ndata) {
    size_t hl = strlen(header), pre = major == 1 ? 10 : 12;
    unsigned char *b = malloc(pre + hl + ndata + 1);
    memcpy(b, "\x93NUMPY", 6);
    b[6] = (unsigned char)major;
    b[7] = (unsigned char)minor;
    for (size_t i = 0; i < pre - 8; i++) b[8 + i] = (unsigned char)(hl >> (8 * i));
    memcpy(b + pre, header, hl);
    for (size_t i = 0; i < ndata; i++) b[pre + hl + i] = (unsigned char)i;
    const char *path = tmp_path(name);
    write_bytes(path, b, pre + hl + ndata);
    free(b);
    return path;
}

static bool is_empty(const npy_array *a) {
    return a->data == NULL && a->ndim == 0 && a->count == 0;
}

/* npy_read must refuse path with a one-line reason containing `want`. */
static void expect_refusal(const char *what, const char *path, const char *want) {
    npy_array a;
    char err[256] = "";
    int rc = npy_read(path, &a, err, sizeof err);
    CHECK(rc == -1, "%s: accepted", what);
    CHECK(is_empty(&a), "%s: output not left empty", what);
    CHECK(strstr(err, want) != NULL, "%s: reason '%s' lacks '%s'", what, err, want);
    CHECK(strchr(err, '\n') == NULL && strstr(err, g_dir) == NULL,
          "%s: reason '%s' is not one line without the file name", what, err);
    if (rc == 0) npy_free(&a);
}

/* npy_read must accept path as the given dtype and shape, data bytes 0, 1, 2, ... */
static void expect_ok(const char *what, const char *path, attn_dtype dtype, int ndim,
                      const int64_t *shape) {
    npy_array a;
    char err[256] = "";
    if (npy_read(path, &a, err, sizeof err) != 0) {
        CHECK(false, "%s: refused: %s", what, err);
        return;
    }
    bool same = a.dtype == dtype && a.ndim == ndim;
    int64_t count = 1;
    for (int d = 0; same && d < ndim; d++) {
        same = a.shape[d] == shape[d];
        count *= shape[d];
    }
    CHECK(same && a.count == count, "%s: wrong dtype, rank or shape", what);
    size_t n = (size_t)count * npy_dtype_size(dtype);
    bool bytes_ok = true;
    for (size_t i = 0; same && i < n; i++) bytes_ok &= ((unsigned char *)a.data)[i] == (unsigned char)i;
    CHECK(bytes_ok, "%s: data bytes differ", what);
    npy_free(&a);
}

static int dir_entries(const char *path) {
    DIR *d = opendir(path);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

static void test_round_trips(void) {
    const attn_dtype dtypes[] = {ATTN_F32, ATTN_F16, ATTN_BOOL, ATTN_I32, ATTN_I64};
    const char *descr[] = {"'<f4'", "'<f2'", "'|b1'", "'<i4'", "'<i8'"};
    const int64_t shapes[][4] = {{0}, {5}, {2, 3}, {2, 1, 3}, {1, 2, 3, 4}, {3, 0, 2, 1}};
    const int ranks[] = {0, 1, 2, 3, 4, 4};
    for (int t = 0; t < 5; t++) {
        for (int s = 0; s < 6; s++) {
            int64_t count = 1;
            for (int d = 0; d < ranks[s]; d++) count *= shapes[s][d];
            size_t es = npy_dtype_size(dtypes[t]), n = (size_t)count * es;
            unsigned char *data = malloc(n + 1);
            for (size_t i = 0; i < n; i++)  /* bools as 0/1, the rest a byte pattern */
                data[i] = dtypes[t] == ATTN_BOOL ? (unsigned char)(i % 3 == 0) : (unsigned char)(i * 7 + 1);
            char err[256], what[64];
            snprintf(what, sizeof what, "round trip %s rank %d", descr[t], ranks[s]);
            const char *path = tmp_path("rt.npy");
            int rc = npy_write(path, dtypes[t], ranks[s], shapes[s], data, err, sizeof err);
            CHECK(rc == 0, "%s: write failed: %s", what, err);

            npy_array a;
            rc = npy_read(path, &a, err, sizeof err);
            CHECK(rc == 0, "%s: read failed: %s", what, err);
            if (rc == 0) {
                bool same = a.dtype == dtypes[t] && a.ndim == ranks[s] && a.count == count &&
                            a.data != NULL && memcmp(a.data, data, n) == 0;
                for (int d = 0; d < ranks[s]; d++) same &= a.shape[d] == shapes[s][d];
                CHECK(same, "%s: what was read differs from what was written", what);
                npy_free(&a);
            }

            /* the layout NumPy writes: version 1.0, data at a multiple of 64, '\n' before it,
             * the header naming the dtype */
            FILE *f = fopen(path, "rb");
            unsigned char b[256] = {0};
            size_t got = f ? fread(b, 1, sizeof b, f) : 0;
            if (f) fclose(f);
            size_t start = 10 + (size_t)(b[8] | b[9] << 8);
            CHECK(got >= 10 && memcmp(b, "\x93NUMPY\x01\x00", 8) == 0 && start % 64 == 0 &&
                  start <= sizeof b && b[start - 1] == '\n' &&
                  strstr((char *)b + 10, descr[t]) != NULL,
                  "%s: file layout is not NumPy's", what);
            struct stat st;
            CHECK(stat(path, &st) == 0 && (size_t)st.st_size == start + n,
                  "%s: file size is not header + data", what);
            free(data);
        }
    }
    CHECK(dir_entries(g_dir) == 1, "round trips left temporary files behind");
    unlink(tmp_path("rt.npy"));
}

static void test_headers(void) {
    const int64_t s23[] = {2, 3}, s3[] = {3};
    /* format 2.0 and 3.0: a 4-byte header length; 3.0's header is utf-8 */
    expect_ok("format 2.0", make_npy("v2.npy", 2, 0,
              "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", 24),
              ATTN_F32, 2, s23);
    expect_ok("format 3.0", make_npy("v3.npy", 3, 0,
              "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }          \n", 12),
              ATTN_I32, 1, s3);
    /* spellings Python allows */
    expect_ok("other key order, no trailing comma",
              make_npy("h1.npy", 1, 0, "{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}\n", 24),
              ATTN_F32, 2, s23);
    expect_ok("extra whitespace, double quotes",
              make_npy("h2.npy", 1, 0, "  {  \"descr\"  :  \"<f2\" ,\n 'fortran_order':False,'shape':( 2 ,3 , ) , }  \n", 12),
              ATTN_F16, 2, s23);
    expect_ok("shape ()", make_npy("h3.npy", 1, 0,
              "{'descr': '<i8', 'fortran_order': False, 'shape': (), }\n", 8), ATTN_I64, 0, NULL);
    expect_ok("shape (3,) and '|b1'", make_npy("h4.npy", 1, 0,
              "{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }\n", 3), ATTN_BOOL, 1, s3);
    expect_ok("'=' byte order, Python 2 'L' dims", make_npy("h5.npy", 1, 0,
              "{'descr': '=f4', 'fortran_order': False, 'shape': (2L, 3L), }\n", 24), ATTN_F32, 2, s23);
    expect_ok("a zero-length dimension", make_npy("h6.npy", 1, 0,
              "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 3), }\n", 0),
              ATTN_F32, 2, (const int64_t[]){0, 3});
}

static void test_refusals(void) {
    const char *ok_hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n";
    char buf[256];

    expect_refusal("missing file", tmp_path("absent.npy"), "cannot open");
    expect_refusal("a directory", g_dir, "not a regular file");
    write_bytes(tmp_path("short.npy"), "\x93NUM", 4);
    expect_refusal("too short", tmp_path("short.npy"), "not a .npy file");
    const char zip[] = "PK\x03\x04 not numpy at all, a zip";
    write_bytes(tmp_path("magic.npy"), zip, sizeof zip - 1);
    expect_refusal("bad magic", tmp_path("magic.npy"), "not a .npy file");
    expect_refusal("version 4.0", make_npy("v4.npy", 4, 0, ok_hdr, 24), "version 4.0");
    expect_refusal("version 1.1", make_npy("v11.npy", 1, 1, ok_hdr, 24), "version 1.1");
    expect_refusal("fortran order", make_npy("fo.npy", 1, 0,
                   "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }\n", 24), "fortran_order");
    expect_refusal("big-endian", make_npy("be.npy", 1, 0,
                   "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }\n", 24), "big-endian");
    /* float64 ('<f8') is read since the library takes it (tests/test_cli.sh runs it) */
    expect_refusal("float128", make_npy("f16.npy", 1, 0,
                   "{'descr': '<f16', 'fortran_order': False, 'shape': (2, 3), }\n", 96),
                   "dtype '<f16' (float128) is not supported");
    expect_refusal("uint8", make_npy("u1.npy", 1, 0,
                   "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 3), }\n", 6), "(uint8)");
    expect_refusal("structured", make_npy("st.npy", 1, 0,
                   "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }\n", 8), "structured");
    expect_refusal("rank 9", make_npy("r9.npy", 1, 0,
                   "{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }\n", 4), "rank");
    expect_refusal("negative dimension", make_npy("neg.npy", 1, 0,
                   "{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }\n", 24), "negative");
    expect_refusal("dimension over int64", make_npy("big1.npy", 1, 0,
                   "{'descr': '<f4', 'fortran_order': False, 'shape': (9223372036854775808,), }\n", 0), "64 bits");
    expect_refusal("element count over int64", make_npy("big2.npy", 1, 0,
                   "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }\n", 0), "64 bits");
    expect_refusal("byte count over int64", make_npy("big3.npy", 1, 0,
                   "{'descr': '<i8', 'fortran_order': False, 'shape': (2305843009213693952,), }\n", 0), "64 bits");

    /* headers that do not parse */
    const char *bad[][2] = {
        {"{'descr' '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", "does not parse"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), \n", "does not parse"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } x\n", "does not parse"},
        {"{'descr': '<f4, 'fortran_order': False, 'shape': (2, 3), }\n", "does not parse"},
        {"{'descr': '<f4', 'fortran_order': false, 'shape': (2, 3), }\n", "does not parse"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3], }\n", "does not parse"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2 3), }\n", "does not parse"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,,3), }\n", "does not parse"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}\n", "unexpected key 'x'"},
        {"{'descr': '<f4', 'fortran_order': False, }\n", "lacks the key 'shape'"},
        {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", "twice"},
        {"", "does not parse"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(buf, sizeof buf, "header %zu", i);
        expect_refusal(buf, make_npy("bad.npy", 1, 0, bad[i][0], 24), bad[i][1]);
    }

    /* data and header sizes that disagree with the file */
    expect_refusal("truncated data", make_npy("tr.npy", 1, 0, ok_hdr, 23),
                   "header says 24 bytes of data, file has 23");
    expect_refusal("header bigger than the data", make_npy("lie.npy", 1, 0,
                   "{'descr': '<f4', 'fortran_order': False, 'shape': (20, 3), }\n", 24),
                   "header says 240 bytes of data, file has 24");
    expect_refusal("trailing bytes", make_npy("tb.npy", 1, 0, ok_hdr, 25),
                   "header says 24 bytes of data, file has 25");
    unsigned char th[] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0x00, 0x10, '{', '}'};
    write_bytes(tmp_path("th.npy"), th, sizeof th);
    expect_refusal("truncated header", tmp_path("th.npy"), "truncated header");
    unsigned char th2[] = {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 0x40, 0, 0};
    write_bytes(tmp_path("th2.npy"), th2, sizeof th2);
    expect_refusal("format 2.0 cut in its length", tmp_path("th2.npy"), "truncated header");
}

static void test_write_failures(void) {
    char err[256] = "";
    float x[6] = {0};
    const int64_t shape[] = {2, 3}, neg[] = {2, -3};
    mkdir(tmp_path("w"), 0777);
    CHECK(npy_write(tmp_path("w/missing/o.npy"), ATTN_F32, 2, shape, x, err, sizeof err) == -1 &&
          strstr(err, "temporary") && !strchr(err, '\n'),
          "write into a missing directory: rc or reason '%s'", err);
    mkdir(tmp_path("w/isdir.npy"), 0777);
    CHECK(npy_write(tmp_path("w/isdir.npy"), ATTN_F32, 2, shape, x, err, sizeof err) == -1 &&
          strstr(err, "rename"), "write over a directory: rc or reason '%s'", err);
    CHECK(dir_entries(tmp_path("w")) == 1, "a failed write left a temporary file behind");
    rmdir(tmp_path("w/isdir.npy"));
    rmdir(tmp_path("w"));

    CHECK(npy_write(tmp_path("o.npy"), ATTN_BF16, 2, shape, x, err, sizeof err) == -1,
          "wrote a dtype npy does not handle");
    CHECK(npy_write(tmp_path("o.npy"), ATTN_F32, 9, shape, x, err, sizeof err) == -1,
          "wrote rank 9");
    CHECK(npy_write(tmp_path("o.npy"), ATTN_F32, 2, neg, x, err, sizeof err) == -1,
          "wrote a negative dimension");
    CHECK(access(tmp_path("o.npy"), F_OK) != 0, "a refused write left a file");

    /* an existing file is replaced whole */
    const int64_t one[] = {1};
    CHECK(npy_write(tmp_path("o.npy"), ATTN_F32, 2, shape, x, err, sizeof err) == 0, "%s", err);
    CHECK(npy_write(tmp_path("o.npy"), ATTN_I64, 1, one, (int64_t[]){42}, err, sizeof err) == 0, "%s", err);
    npy_array a;
    CHECK(npy_read(tmp_path("o.npy"), &a, err, sizeof err) == 0 && a.dtype == ATTN_I64 &&
          a.count == 1 && ((int64_t *)a.data)[0] == 42, "overwrite: %s", err);
    npy_free(&a);
    unlink(tmp_path("o.npy"));
}

/* Over 2 GiB of data: sizes past int32 and chunked I/O. Opt-in: it needs ~4.5 GB of memory. */
static void test_big(void) {
    const int64_t n = ((int64_t)1 << 29) + 17;  /* float32: 2 GiB + 68 bytes */
    float *x = calloc((size_t)n, sizeof *x);
    if (!x) { CHECK(false, "big: out of memory"); return; }
    x[0] = 1.5f;
    x[n - 1] = -2.5f;
    x[(int64_t)1 << 28] = 3.0f;
    char err[256] = "";
    CHECK(npy_write(tmp_path("big.npy"), ATTN_F32, 1, &n, x, err, sizeof err) == 0, "big: %s", err);
    free(x);
    npy_array a;
    int rc = npy_read(tmp_path("big.npy"), &a, err, sizeof err);
    CHECK(rc == 0 && a.count == n, "big: read back: %s", err);
    if (rc == 0) {
        float *y = a.data;
        CHECK(y[0] == 1.5f && y[n - 1] == -2.5f && y[(int64_t)1 << 28] == 3.0f && y[n / 2 + 1] == 0,
              "big: values differ");
        npy_free(&a);
    }
    unlink(tmp_path("big.npy"));
}

int main(void) {
    (void)within_f32_tol;  /* check.h's float tolerance is for the numerical suites */
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 2; }
    test_round_trips();
    test_headers();
    test_refusals();
    test_write_failures();
    const char *big = getenv("ATTN_TEST_BIG");
    if (big && *big == '1') test_big();

    /* clean up what the tests made */
    DIR *d = opendir(g_dir);
    for (struct dirent *e; d && (e = readdir(d));)
        if (e->d_name[0] != '.') unlink(tmp_path(e->d_name));
    if (d) closedir(d);
    rmdir(g_dir);
    return check_summary("npy");
}
