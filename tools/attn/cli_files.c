/*
 * cli_files.c — the file rules of the `attn` commands declared in cli_files.h: paths
 *               checked by identity before anything is written, outputs through temporary
 *               files renamed only when all are complete.
 *
 * What it is not: the .npy or PNG format (npy.c, canvas.c) or the choice of what to write
 * (cli_run.c, cli_viz.c, ...).
 */
#define _FILE_OFFSET_BITS 64
#define _XOPEN_SOURCE 700  // realpath
#include "cli_files.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "npy.h"

/* returns `code` with the reason in err */
static int fail_code(int code, char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return code;
}
#define fail(...) fail_code(-1, __VA_ARGS__)

static const char *kind(mode_t m) {
    return S_ISDIR(m) ? "a directory" : S_ISCHR(m) ? "a character device"
         : S_ISBLK(m) ? "a block device" : S_ISFIFO(m) ? "a FIFO"
         : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

/* An output's target: the file a link names (resolved fully), or, for a path that does
 * not exist, the resolved directory and the last name. */
static int resolve_output(cli_path *o, char *err, size_t errlen) {
    struct stat st, lst;
    if (stat(o->path, &st) == 0) {
        if (!S_ISREG(st.st_mode))
            return fail(err, errlen, "%s: %s exists and is %s: refused (outputs are regular files)",
                        o->opt, o->path, kind(st.st_mode));
        o->target = realpath(o->path, NULL);
        if (!o->target) return fail(err, errlen, "%s: %s: %s", o->opt, o->path, strerror(errno));
        o->exists = true;
        o->dev = (uint64_t)st.st_dev;
        o->ino = (uint64_t)st.st_ino;
        o->mode = (unsigned)(st.st_mode & 07777);
        return 0;
    }
    if (errno != ENOENT) return fail(err, errlen, "%s: %s: %s", o->opt, o->path, strerror(errno));
    if (lstat(o->path, &lst) == 0)  // a link to nothing: where it points is not decided here
        return fail(err, errlen, "%s: %s is a symbolic link to a file that does not exist: "
                    "refused", o->opt, o->path);
    const char *slash = strrchr(o->path, '/');
    const char *name = slash ? slash + 1 : o->path;
    if (!*name) return fail(err, errlen, "%s: %s names a directory, not a file", o->opt, o->path);
    char *dir = slash ? strndup(o->path, (size_t)(slash - o->path) + (slash == o->path))
                      : strdup(".");
    char *rdir = dir ? realpath(dir, NULL) : NULL;
    const int e = errno;
    free(dir);
    if (!rdir) return fail(err, errlen, "%s: %s: its directory: %s", o->opt, o->path, strerror(e));
    const size_t n = strlen(rdir) + strlen(name) + 2;
    o->target = malloc(n);
    if (o->target) snprintf(o->target, n, "%s/%s", strcmp(rdir, "/") ? rdir : "", name);
    free(rdir);
    if (!o->target) return fail(err, errlen, "%s: out of memory", o->opt);
    return 0;
}

int cli_files_check(cli_path *in, int n_in, cli_path *out, int n_out, char *err, size_t errlen) {
    for (int i = 0; i < n_in; i++) {
        struct stat st;
        if (stat(in[i].path, &st) != 0)
            return fail(err, errlen, "%s: cannot open: %s", in[i].path, strerror(errno));
        if (!S_ISREG(st.st_mode))
            return fail(err, errlen, "%s: not a regular file (%s): refused before reading it",
                        in[i].path, kind(st.st_mode));
        in[i].exists = true;
        in[i].dev = (uint64_t)st.st_dev;
        in[i].ino = (uint64_t)st.st_ino;
    }
    for (int i = 0; i < n_out; i++) {
        if (resolve_output(&out[i], err, errlen)) return -1;
        for (int j = 0; j < i; j++)
            if (out[i].exists ? out[j].exists && out[i].dev == out[j].dev && out[i].ino == out[j].ino
                              : strcmp(out[i].target, out[j].target) == 0)
                return fail_code(-2, err, errlen, "%s: %s is the same file as %s %s: refused", out[i].opt,
                            out[i].path, out[j].opt, out[j].path);
        for (int j = 0; j < n_in && out[i].exists; j++)
            if (out[i].dev == in[j].dev && out[i].ino == in[j].ino)
                return fail_code(-2, err, errlen, "%s: %s is the input %s %s: refused (it would be "
                            "overwritten)", out[i].opt, out[i].path, in[j].opt, in[j].path);
    }
    return 0;
}

int cli_files_open(cli_path *o, char *err, size_t errlen) {
    /* a file size limit: the write fails with EFBIG and the caller's cleanup runs (the
     * default action would kill the process and leave the temporary file) */
    signal(SIGXFSZ, SIG_IGN);
    const size_t n = strlen(o->target) + 16;
    free(o->tmp);
    o->tmp = malloc(n);
    if (!o->tmp) return fail(err, errlen, "out of memory");
    snprintf(o->tmp, n, "%s.tmp.XXXXXX", o->target);
    const int fd = mkstemp(o->tmp);  // in the target's directory, so that rename replaces it
    if (fd < 0) {
        const int e = errno;
        free(o->tmp);
        o->tmp = NULL;
        return fail(err, errlen, "cannot create a temporary file beside %s: %s", o->target,
                    strerror(e));
    }
    /* the permissions of the file replaced, or the usual ones of a new file */
    mode_t mask = umask(0);
    umask(mask);
    fchmod(fd, o->exists ? (mode_t)o->mode : (mode_t)(0666 & ~mask));
    return fd;
}

int cli_files_write(cli_path *o, attn_dtype dtype, int ndim, const int64_t *shape,
                    const void *data, char *err, size_t errlen) {
    const int fd = cli_files_open(o, err, errlen);
    if (fd < 0) return -1;
    return npy_write_fd(fd, dtype, ndim, shape, data, err, errlen);
}

int cli_files_commit(cli_path *out, int n_out, char *err, size_t errlen) {
    for (int i = 0; i < n_out; i++) {
        if (!out[i].tmp) return fail(err, errlen, "%s: %s was not written", out[i].opt, out[i].path);
        if (rename(out[i].tmp, out[i].target) != 0)
            return fail(err, errlen, "cannot rename into place: %s", strerror(errno));
        free(out[i].tmp);
        out[i].tmp = NULL;
    }
    return 0;
}

void cli_files_abort(cli_path *out, int n_out) {
    for (int i = 0; i < n_out; i++) {
        if (out[i].tmp) unlink(out[i].tmp);
        free(out[i].tmp);
        free(out[i].target);
        out[i].tmp = out[i].target = NULL;
    }
}

int cli_files_save(const char *opt, const char *path, cli_path *in, int n_in, cli_writer write,
                   const void *ctx, char *err, size_t errlen) {
    cli_path o = {.opt = opt, .path = path};
    int rc = cli_files_check(in, n_in, &o, 1, err, errlen);
    if (rc == 0) {
        const int fd = cli_files_open(&o, err, errlen);
        rc = fd < 0 || write(fd, path, ctx, err, errlen) || cli_files_commit(&o, 1, err, errlen)
                 ? -1 : 0;
    }
    cli_files_abort(&o, 1);
    return rc;
}

typedef struct text_job {
    void (*print)(FILE *f, const void *ctx);
    const void *ctx;
} text_job;

static int text_writer(int fd, const char *name, const void *ctx, char *err, size_t errlen) {
    const text_job *job = ctx;
    FILE *f = fdopen(fd, "w");
    if (!f) {
        close(fd);
        return fail(err, errlen, "%s: cannot write: %s", name, strerror(errno));
    }
    errno = 0;
    job->print(f, job->ctx);
    const int bad = fflush(f) != 0 || ferror(f);
    const int e = errno;
    if (fclose(f) != 0 || bad)
        return fail(err, errlen, "%s: cannot write: %s", name, strerror(bad && e ? e : errno));
    return 0;
}

int cli_files_save_text(const char *opt, const char *path, void (*print)(FILE *f, const void *ctx),
                        const void *ctx, char *err, size_t errlen) {
    const text_job job = {print, ctx};
    return cli_files_save(opt, path, NULL, 0, text_writer, &job, err, errlen) ? -1 : 0;
}

int cli_files_check_one(const char *opt, const char *path, char *err, size_t errlen) {
    cli_path o = {.opt = opt, .path = path};
    const int rc = cli_files_check(NULL, 0, &o, 1, err, errlen);
    cli_files_abort(&o, 1);
    return rc;
}
