/*
 * bench_masks_peer.c — the PyTorch side of `attn bench masks --vs torch`
 *                      (bench_masks_peer.h): the inputs as .npy files, one JSON line per
 *                      request and per answer (scripts/bench_torch_masks.py describes them).
 */
#include "bench_masks_peer.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "json.h"
#include "npy.h"

/* s as a JSON string (with its quotes) appended to buf[*at .. n); false when full */
static bool put_str(char *buf, size_t n, size_t *at, const char *s) {
    if (*at + 2 >= n) return false;
    buf[(*at)++] = '"';
    for (; *s; s++) {
        const unsigned char c = (unsigned char)*s;
        const int w = c == '"' || c == '\\' ? snprintf(buf + *at, n - *at, "\\%c", c)
                      : c < 0x20            ? snprintf(buf + *at, n - *at, "\\u%04x", c)
                                            : snprintf(buf + *at, n - *at, "%c", c);
        if (w < 0 || *at + (size_t)w >= n) return false;
        *at += (size_t)w;
    }
    if (*at + 2 >= n) return false;
    buf[(*at)++] = '"';
    buf[*at] = 0;
    return true;
}

static bool put(char *buf, size_t n, size_t *at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool put(char *buf, size_t n, size_t *at, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const int w = vsnprintf(buf + *at, n - *at, fmt, ap);
    va_end(ap);
    if (w < 0 || *at + (size_t)w >= n) return false;
    *at += (size_t)w;
    return true;
}

static int fail(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
    return -1;
}

/* Sends one request line and reads the answer: the object, or NULL with the reason (the
 * side's own "error" member, or why the answer is none) in err. */
static jnode *request(mpeer *p, const char *line, char *err, size_t n) {
    if (fprintf(p->tp.to, "%s\n", line) < 0 || fflush(p->tp.to)) {
        fail(err, n, "the torch process ended");
        return NULL;
    }
    static char ans[65536];
    if (!fgets(ans, sizeof ans, p->tp.from)) {
        fail(err, n, "the torch process ended");
        return NULL;
    }
    size_t len = strlen(ans);
    while (len > 0 && (ans[len - 1] == '\n' || ans[len - 1] == '\r')) len--;
    char why[160];
    jnode *j = json_parse(ans, len, why, sizeof why);
    if (!j || j->type != J_OBJ) {
        fail(err, n, "unexpected answer (%s): %.80s", j ? "not an object" : why, ans);
        json_free(j);
        return NULL;
    }
    const char *e = jget_str(j, "error");
    if (e) {
        fail(err, n, "%s", e);
        json_free(j);
        return NULL;
    }
    return j;
}

/* A request whose answer carries nothing but {"ok": true}: 0 or -1. */
static int request_ok(mpeer *p, const char *line, char *err, size_t n) {
    jnode *j = request(p, line, err, n);
    if (!j) return -1;
    const jnode *ok = jget(j, "ok");
    const int rc = ok && ok->type == J_BOOL && ok->boolean ? 0 : fail(err, n, "unexpected answer");
    json_free(j);
    return rc;
}

static void path_of(const mpeer *p, const char *name, char *out, size_t n) {
    snprintf(out, n, "%s/%s", p->dir, name);
}

void mpeer_passive_threads(void) {
    if (getenv("OMP_WAIT_POLICY")) return;
    static char cmd[65536];
    FILE *f = fopen("/proc/self/cmdline", "rb");
    const size_t len = f ? fread(cmd, 1, sizeof cmd - 1, f) : 0;
    if (f) fclose(f);
    char *args[256];
    int n = 0;
    for (size_t at = 0; at < len && n < 255; at += strlen(cmd + at) + 1) args[n++] = cmd + at;
    args[n] = NULL;
    if (n == 0 || len == sizeof cmd - 1) return;
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    fflush(stdout), fflush(stderr);
    execv("/proc/self/exe", args);
    unsetenv("OMP_WAIT_POLICY");  /* the exec failed: go on as we are */
}

int mpeer_start(mpeer *p, const char *python, const char *script, int threads) {
    memset(p, 0, sizeof *p);
    const char *tmp = getenv("TMPDIR");
    snprintf(p->dir, sizeof p->dir, "%s/attn-bench-masks.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(p->dir)) {
        fprintf(stderr, "attn: bench masks: cannot make a temporary folder %s: %s\n", p->dir,
                strerror(errno));
        p->dir[0] = 0;
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    return torch_start(&p->tp, python, script, threads);
}

/* t (bool or float32, any strides, rank 4) written densely to dir/name */
static int write_tensor(mpeer *p, const char *name, const attn_tensor *t, char *err, size_t n) {
    const size_t size = t->dtype == ATTN_BOOL ? 1 : 4;
    const int64_t *s = t->shape, *st = t->stride;
    const int64_t count = s[0] * s[1] * s[2] * s[3];
    unsigned char *dense = malloc((size_t)count * size + 1), *at = dense;
    if (!dense) return fail(err, n, "out of memory");
    const unsigned char *src = t->data;
    for (int64_t a = 0; a < s[0]; a++)
        for (int64_t b = 0; b < s[1]; b++)
            for (int64_t c = 0; c < s[2]; c++)
                for (int64_t d = 0; d < s[3]; d++, at += size)
                    memcpy(at, src + (a * st[0] + b * st[1] + c * st[2] + d * st[3]) * (int64_t)size,
                           size);
    char path[PATH_MAX + 40], why[160];
    path_of(p, name, path, sizeof path);
    const int rc = npy_write(path, t->dtype, 4, s, dense, why, sizeof why);
    free(dense);
    if (rc) return fail(err, n, "%s: %s", path, why);
    snprintf(p->files[p->nfiles++], sizeof p->files[0], "%s", name);
    return 0;
}

int mpeer_load(mpeer *p, const float *q, const float *k, const float *v, int64_t B, int64_t L,
               int64_t H, int64_t D, int nvar, const attn_tensor *const masks[],
               const bool causal[], char *err, size_t n) {
    if (nvar < 1 || nvar > MPEER_MAX_VARIANTS) return fail(err, n, "%d variants", nvar);
    p->B = B, p->L = L, p->H = H, p->D = D, p->nvar = nvar, p->nfiles = 0;
    const float *x[3] = {q, k, v};
    static const char *const qkv[3] = {"q.npy", "k.npy", "v.npy"};
    for (int i = 0; i < 3; i++) {
        const attn_tensor t = attn_tensor_4d((void *)x[i], ATTN_F32, B, L, H, D);
        if (write_tensor(p, qkv[i], &t, err, n)) return -1;
    }
    static char line[16384];
    char path[PATH_MAX + 40];
    size_t at = 0;
    bool ok = put(line, sizeof line, &at, "{\"op\": \"load\"");
    for (int i = 0; i < 3 && ok; i++) {
        path_of(p, qkv[i], path, sizeof path);
        ok = put(line, sizeof line, &at, ", \"%c\": ", qkv[i][0]) && put_str(line, sizeof line, &at, path);
    }
    ok = ok && put(line, sizeof line, &at, ", \"variants\": [");
    for (int i = 0; i < nvar && ok; i++) {
        ok = put(line, sizeof line, &at, "%s{\"mask\": ", i ? ", " : "");
        if (masks[i]) {
            char name[32];
            snprintf(name, sizeof name, "mask%d.npy", i);
            if (write_tensor(p, name, masks[i], err, n)) return -1;
            path_of(p, name, path, sizeof path);
            ok = ok && put_str(line, sizeof line, &at, path);
        } else {
            ok = ok && put(line, sizeof line, &at, "null");
        }
        ok = ok && put(line, sizeof line, &at, ", \"causal\": %s}", causal[i] ? "true" : "false");
    }
    ok = ok && put(line, sizeof line, &at, "]}");
    if (!ok) return fail(err, n, "the load request is too long (the temporary folder's name?)");
    return request_ok(p, line, err, n);
}

int mpeer_outputs(mpeer *p, float *const outs[], char *err, size_t n) {
    static char line[16384];
    char path[PATH_MAX + 40];
    size_t at = 0;
    bool ok = put(line, sizeof line, &at, "{\"op\": \"check\", \"out\": [");
    for (int i = 0; i < p->nvar && ok; i++) {
        char name[32];
        snprintf(name, sizeof name, "out%d.npy", i);
        path_of(p, name, path, sizeof path);
        ok = put(line, sizeof line, &at, "%s", i ? ", " : "") && put_str(line, sizeof line, &at, path);
    }
    ok = ok && put(line, sizeof line, &at, "]}");
    if (!ok) return fail(err, n, "the check request is too long");
    if (request_ok(p, line, err, n)) return -1;
    int rc = 0;
    for (int i = 0; i < p->nvar; i++) {
        char name[32], why[160];
        snprintf(name, sizeof name, "out%d.npy", i);
        path_of(p, name, path, sizeof path);
        npy_array a;
        if (npy_read(path, &a, why, sizeof why)) {
            rc = fail(err, n, "torch's output %s: %s", name, why);
        } else {
            const int64_t want[4] = {p->B, p->H, p->L, p->D};
            bool same = a.dtype == ATTN_F32 && a.ndim == 4;
            for (int d = 0; d < 4 && same; d++) same = a.shape[d] == want[d];
            if (same) memcpy(outs[i], a.data, (size_t)a.count * 4);
            else if (!rc) rc = fail(err, n, "torch's output %s: not float32 (B, H, L, D)", name);
            npy_free(&a);
        }
        unlink(path);
    }
    return rc;
}

int mpeer_round(mpeer *p, int warm, double times[], char *err, size_t n) {
    char line[64];
    snprintf(line, sizeof line, "{\"op\": \"round\", \"warm\": %d}", warm);
    jnode *j = request(p, line, err, n);
    if (!j) return -1;
    const jnode *t = jget(j, "times");
    int got = 0;
    if (t && t->type == J_ARR)
        for (const jnode *e = t->child; e && got < p->nvar; e = e->next)
            if (e->type == J_NUM && e->num > 0) times[got++] = e->num;
    json_free(j);
    return got == p->nvar ? 0 : fail(err, n, "a round's answer without %d times", p->nvar);
}

int mpeer_unload(mpeer *p, char *err, size_t n) {
    for (int i = 0; i < p->nfiles; i++) {
        char path[PATH_MAX + 40];
        path_of(p, p->files[i], path, sizeof path);
        unlink(path);
    }
    p->nfiles = 0, p->nvar = 0;
    return request_ok(p, "{\"op\": \"free\"}", err, n);
}

void mpeer_stop(mpeer *p) {
    for (int i = 0; i < p->nfiles; i++) {
        char path[PATH_MAX + 40];
        path_of(p, p->files[i], path, sizeof path);
        unlink(path);
    }
    p->nfiles = 0;
    for (int i = 0; i < MPEER_MAX_VARIANTS && p->dir[0]; i++) {  /* a check cut short */
        char path[PATH_MAX + 40], name[32];
        snprintf(name, sizeof name, "out%d.npy", i);
        path_of(p, name, path, sizeof path);
        unlink(path);
    }
    torch_stop(&p->tp);
    if (p->dir[0]) rmdir(p->dir);
    p->dir[0] = 0;
}
