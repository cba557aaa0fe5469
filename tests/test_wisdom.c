/*
 * test_wisdom.c — the tuner's wisdom (src/kernels/wisdom.c): the file's parser, its refusals, and
 *                 that a wisdom's configuration is what the fused path runs.
 *
 * - The parser: a file written by ai_wisdom_format reads back to the same
 *   configurations (comments and blank lines skipped); each kind of bad file (another
 *   CPU, another version, a header, a class, a value out of the kernel's limits, a split
 *   outside decoding, a duplicate class, a kernel this CPU cannot run or that does not
 *   exist, a long line, no cpu line) is refused whole: ATTN_ERR_VALUE and no class kept.
 * - The process's wisdom is read once, so each setting of the environment runs in a
 *   child (fork, before this process has used OpenMP) with its stderr in a file:
 *   a refused file gives exactly one warning line and the static choices; ATTN_TUNE=0
 *   reads nothing; a wisdom forcing the generic kernel with 32 x 32 tiles, a decoding
 *   split of 1 and backward tiles of 32 x 32 is applied (the params' kernel and tiles,
 *   smaller workspaces than the static choices', O bit for bit that of ATTN_ISA=generic
 *   ATTN_FWD_BQ=32 ATTN_FWD_BK=32), its results are the same bits on 1 and 2 threads and
 *   agree with the float64 oracle (check.h's float32 tolerance), its gradients with the
 *   static choice's.
 * The parser's tests run last: they make this process choose its kernel (dispatch.c,
 * once), and a child forked after that would keep the choice whatever its ATTN_ISA.
 * The suite never reads the developer's own wisdom: ATTN_WISDOM, XDG_CACHE_HOME and
 * ATTN_TUNE are set in every process it runs.
 * What it is not: a test of the tuner's timing (attn tune, tests/test_tune.sh).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "attn.h"
#include "check.h"
#include "oracle.h"
#include "kernels/wisdom.h"

static char g_dir[256];

static void path_of(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", g_dir, name);
}

/* a wisdom file: the header (unless header is NULL: none), cpu (NULL: this process's),
 * then body */
static void write_file(const char *name, const char *header, const char *cpu, const char *body) {
    char path[512];
    path_of(path, sizeof path, name);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "test_wisdom: cannot write %s\n", path);
        exit(2);
    }
    if (header) fprintf(f, "%s\n", header);
    fprintf(f, "%s\n%s", cpu ? cpu : ai_wisdom_cpu_line(), body);
    fclose(f);
}

static attn_status parse(const char *name, attn_wisdom *w, char *why, size_t cap) {
    char path[512];
    path_of(path, sizeof path, name);
    return ai_wisdom_parse(path, w, why, cap);
}

static int classes_in(const attn_wisdom *w) {
    int n = 0;
    for (int i = 0; i < ATTN_TUNE_CLASSES; i++) n += w->has[i];
    return n;
}

/* ---- the parser --------------------------------------------------------------------- */

static void test_round_trip(void) {
    const attn_kernels *generic = ai_kernels_named("generic");
    const attn_kernels *best = ai_select_kernels(NULL);
    const struct {
        attn_tune_class c;
        attn_tune_config cfg;
    } lines[] = {
        {{ATTN_PHASE_PREFILL, 0, 1, 0, 0}, {NULL, 112, 0, 0}},
        {{ATTN_PHASE_PREFILL, 1, 2, 1, 3}, {generic, 0, 32, 0}},
        {{ATTN_PHASE_DECODE, 3, 2, 2, 2}, {best, 0, 64, 4}},
        {{ATTN_PHASE_DECODE, 0, 0, 3, 1}, {NULL, 0, 0, 0}},
        {{ATTN_PHASE_BACKWARD, 0, 3, 1, 0}, {generic, 128, 16, 0}},
    };
    const int n = (int)(sizeof lines / sizeof lines[0]);
    char body[4096] = "# a comment\n\n";
    for (int i = 0; i < n; i++) {
        char line[256];
        ai_wisdom_format(lines[i].c, &lines[i].cfg, line, sizeof line);
        strcat(body, "# the candidates' times\n");
        strcat(body, line);
        strcat(body, i % 2 ? "\r\n" : "  \n");  // a CRLF line, trailing blanks
    }
    write_file("round", "attn-wisdom 1", NULL, body);
    attn_wisdom w;
    char why[512] = "";
    const attn_status st = parse("round", &w, why, sizeof why);
    CHECK(st == ATTN_OK, "round trip: parse gave %d (%s)", (int)st, why);
    CHECK(classes_in(&w) == n, "round trip: %d classes read, %d written", classes_in(&w), n);
    for (int i = 0; i < n; i++) {
        const int x = ai_tune_class_index(lines[i].c);
        const attn_tune_config *g = &w.cfg[x], *e = &lines[i].cfg;
        CHECK(w.has[x] && g->kernels == e->kernels && g->bq == e->bq && g->bk == e->bk &&
                  g->split == e->split,
              "round trip: line %d read back as kernel %s bq %d bk %d split %d", i,
              g->kernels ? g->kernels->name : "static", g->bq, g->bk, g->split);
    }
    /* every class index is distinct and in range */
    int seen = 0;
    for (int p = 0; p < ATTN_PHASES; p++)
        for (int d = 0; d < ATTN_TUNE_DTYPES; d++)
            for (int m = 0; m < ATTN_TUNE_MASKS; m++) {
                const int x = ai_tune_class_index((attn_tune_class){p, d, 3, m, 3});
                seen += x >= 0 && x < ATTN_TUNE_CLASSES;
            }
    CHECK(seen == ATTN_PHASES * ATTN_TUNE_DTYPES * ATTN_TUNE_MASKS, "class indices out of range");
}

/* a kernel of this build this CPU cannot run, NULL when it runs them all */
static const char *kernel_not_here(void) {
    for (const char *const *k = attn_kernel_list(); *k; k++)
        if (!attn_kernel_supported(*k)) return *k;
    return NULL;
}

static void test_refusals(void) {
    const char *good = "prefill f32 d64 none g1 = kernel=static bq=32 bk=32 split=static\n";
    char cpu_other[300], cpu_version[300], body[1024];
    snprintf(cpu_other, sizeof cpu_other, "cpu vendor=GenuineIntel family=6 model=106 isa=%s",
             strstr(ai_wisdom_cpu_line(), "isa=") + 4);
    snprintf(cpu_version, sizeof cpu_version, "%.*sversion=99.0.0",
             (int)(strstr(ai_wisdom_cpu_line(), "version=") - ai_wisdom_cpu_line()),
             ai_wisdom_cpu_line());
    const struct {
        const char *what, *header, *cpu, *bad;  // bad: a line after the good one
    } cases[] = {
        {"another CPU", "attn-wisdom 1", cpu_other, ""},
        {"another version", "attn-wisdom 1", cpu_version, ""},
        {"no header", NULL, NULL, ""},
        {"header version 2", "attn-wisdom 2", NULL, ""},
        {"an unknown phase", "attn-wisdom 1", NULL,
         "encode f32 d64 none g1 = kernel=static bq=static bk=static split=static\n"},
        {"an unknown dim", "attn-wisdom 1", NULL,
         "prefill f32 d48 none g1 = kernel=static bq=static bk=static split=static\n"},
        {"bq not a multiple of the row padding", "attn-wisdom 1", NULL,
         "prefill f32 d128 none g1 = kernel=static bq=40 bk=static split=static\n"},
        {"bq over the limit", "attn-wisdom 1", NULL,
         "prefill f32 d128 none g1 = kernel=static bq=512 bk=static split=static\n"},
        {"bk over the kernel's", "attn-wisdom 1", NULL,
         "prefill f32 d128 none g1 = kernel=static bq=static bk=256 split=static\n"},
        {"bq 0", "attn-wisdom 1", NULL,
         "prefill f32 d128 none g1 = kernel=static bq=0 bk=static split=static\n"},
        {"a negative bk", "attn-wisdom 1", NULL,
         "prefill f32 d128 none g1 = kernel=static bq=static bk=-64 split=static\n"},
        {"a split outside decoding", "attn-wisdom 1", NULL,
         "prefill f32 d128 none g1 = kernel=static bq=static bk=static split=2\n"},
        {"a split over 16", "attn-wisdom 1", NULL,
         "decode f32 d128 none g1 = kernel=static bq=static bk=static split=17\n"},
        {"a duplicate class", "attn-wisdom 1", NULL, good},
        {"a missing field", "attn-wisdom 1", NULL,
         "prefill f32 d128 none g1 = kernel=static bq=static bk=static\n"},
        {"a trailing word", "attn-wisdom 1", NULL,
         "prefill f32 d128 none g1 = kernel=static bq=static bk=static split=static x\n"},
        {"fields out of order", "attn-wisdom 1", NULL,
         "prefill f32 d128 none g1 = kernel=static bk=static bq=static split=static\n"},
        {"no such kernel", "attn-wisdom 1", NULL,
         "prefill f32 d128 none g1 = kernel=sse9 bq=static bk=static split=static\n"},
        {"a number with garbage", "attn-wisdom 1", NULL,
         "prefill f32 d128 none g1 = kernel=static bq=64x bk=static split=static\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(body, sizeof body, "%s%s", good, cases[i].bad);
        write_file("bad", cases[i].header, cases[i].cpu, body);
        attn_wisdom w;
        char why[512] = "";
        const attn_status st = parse("bad", &w, why, sizeof why);
        CHECK(st == ATTN_ERR_VALUE && classes_in(&w) == 0,
              "%s: parse gave %d with %d classes kept, expected ATTN_ERR_VALUE and none (%s)",
              cases[i].what, (int)st, classes_in(&w), why);
        CHECK(why[0] != '\0', "%s: no reason given", cases[i].what);
    }
    /* a kernel this CPU cannot run (avx512 on an AVX2-only CPU) */
    const char *absent = kernel_not_here();
    if (absent) {
        snprintf(body, sizeof body, "%sprefill f32 d128 none g1 = kernel=%s bq=static "
                 "bk=static split=static\n", good, absent);
        write_file("bad", "attn-wisdom 1", NULL, body);
        attn_wisdom w;
        char why[512] = "";
        const attn_status st = parse("bad", &w, why, sizeof why);
        CHECK(st == ATTN_ERR_VALUE && classes_in(&w) == 0 && strstr(why, "cannot run"),
              "kernel %s, which this CPU cannot run: parse gave %d (%s)", absent, (int)st, why);
    } else {
        printf("  this CPU runs every kernel of the build: no foreign-kernel file to refuse\n");
    }
    /* a line longer than the reader's buffer */
    char longline[2048];
    memset(longline, 'x', sizeof longline - 2);
    longline[sizeof longline - 2] = '\n';
    longline[sizeof longline - 1] = '\0';
    snprintf(body, sizeof body, "%s# %.900s", good, longline);
    write_file("bad", "attn-wisdom 1", NULL, body);
    attn_wisdom w;
    char why[512] = "";
    CHECK(parse("bad", &w, why, sizeof why) == ATTN_ERR_VALUE, "a 900-byte line was accepted");
    /* an empty file, a missing one */
    char path[512];
    path_of(path, sizeof path, "empty");
    fclose(fopen(path, "w"));
    CHECK(ai_wisdom_parse(path, &w, why, sizeof why) == ATTN_ERR_VALUE, "an empty file was accepted");
    path_of(path, sizeof path, "absent");
    CHECK(ai_wisdom_parse(path, &w, why, sizeof why) == ATTN_ERR_IO, "a missing file: not ATTN_ERR_IO");
    /* the public check agrees */
    path_of(path, sizeof path, "round");
    CHECK(attn_tune_check(path) == ATTN_OK, "attn_tune_check refused the round-trip file: %s",
          attn_last_error());
    path_of(path, sizeof path, "bad");
    CHECK(attn_tune_check(path) == ATTN_ERR_VALUE && strstr(attn_last_error(), "line"),
          "attn_tune_check on a bad file: %s", attn_last_error());
}

/* ---- children ----------------------------------------------------------------------- */

static bool write_all(int fd, const void *p, size_t n) {
    const char *b = p;
    while (n > 0) {
        const ssize_t w = write(fd, b, n);
        if (w <= 0) return false;
        b += w, n -= (size_t)w;
    }
    return true;
}

static bool read_all(int fd, void *p, size_t n) {
    char *b = p;
    while (n > 0) {
        const ssize_t r = read(fd, b, n);
        if (r <= 0) return false;
        b += r, n -= (size_t)r;
    }
    return true;
}

/* What a child sends back: a few workspace sizes and float arrays, then its counts. */
enum { PAY_FLOATS = 1 << 16 };
typedef struct payload {
    size_t ws[3];          // prefill, decode, backward workspaces
    int64_t n_o, n_dq;
    float o[PAY_FLOATS];   // the prefill case's O (2 threads)
    float dq[PAY_FLOATS];  // the backward case's dQ, then dK
} payload;

/* Runs fn in a child with the environment env ("NAME=value" or "NAME" to unset, NULL-
 * terminated) and its stderr in the file `err`; *out gets its payload. Adds its counts. */
static bool in_child(void (*fn)(payload *), const char *const *env, const char *err, payload *out) {
    int fds[2];
    if (pipe(fds) != 0) return false;
    fflush(NULL);
    const pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        g_pass = g_fail = 0;
        char path[512];
        path_of(path, sizeof path, err);
        if (!freopen(path, "w", stderr)) _exit(3);
        for (const char *const *e = env; *e; e++) {
            char name[128];
            const char *eq = strchr(*e, '=');
            snprintf(name, sizeof name, "%.*s", eq ? (int)(eq - *e) : (int)strlen(*e), *e);
            if (eq) setenv(name, eq + 1, 1);
            else unsetenv(name);
        }
        payload *p = calloc(1, sizeof *p);
        if (!p) _exit(2);
        fn(p);
        fflush(stderr);
        const int counts[2] = {g_pass, g_fail};
        write_all(fds[1], p, sizeof *p);
        write_all(fds[1], counts, sizeof counts);
        _exit(0);
    }
    close(fds[1]);
    int counts[2] = {0, 0};
    bool ok = pid > 0 && read_all(fds[0], out, sizeof *out) && read_all(fds[0], counts, sizeof counts);
    close(fds[0]);
    int status = 0;
    if (pid > 0) waitpid(pid, &status, 0);
    g_pass += counts[0];
    g_fail += counts[1];
    return ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* the child's stderr file, echoed to this process's (its failed checks) */
static void echo_err(const char *err) {
    char path[512], line[1024];
    path_of(path, sizeof path, err);
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f)) fprintf(stderr, "  [child] %s", line);
    if (f) fclose(f);
}

/* lines of the child's stderr file, and whether every one contains `word` */
static int err_lines(const char *err, const char *word, bool *all_have) {
    char path[512], line[1024];
    path_of(path, sizeof path, err);
    FILE *f = fopen(path, "r");
    int n = 0;
    *all_have = true;
    while (f && fgets(line, sizeof line, f)) {
        n++;
        if (word && !strstr(line, word)) *all_have = false;
    }
    if (f) fclose(f);
    return n;
}

/* the cases of the children: one per tuned class, and one of no class in the wisdom */
static fcase case_prefill(void) { return fcase_new(7, 1, 2, 2, 200, 300, 64, 64); }
static fcase case_decode(void) { return fcase_new(8, 1, 8, 2, 1, 4500, 128, 128); }
static fcase case_other(void) {
    fcase c = fcase_new(9, 2, 4, 2, 90, 130, 64, 64);
    c.causal = 1;
    c.lse = 1;
    return c;
}

static size_t forward_ws(const fcase *c) {
    tcall t;
    tcall_build(&t, c);
    size_t ws = 0;
    t.opt.path = ATTN_PATH_FUSED;
    CHECK(attn_forward_workspace_size(&t.q, &t.k, &t.v, &t.o, &t.opt, &ws) == ATTN_OK,
          "workspace query: %s", attn_last_error());
    tcall_free(&t);
    return ws;
}

/* the backward case: B 1, Hq = Hkv = 2, L 150, D 64, float32 */
enum { BW_H = 2, BW_L = 150, BW_D = 64, BW_N = BW_H * BW_L * BW_D };
typedef struct bcall {
    float *q, *k, *v, *o, *d_o, *lse, *dq, *dk, *dv;
    attn_tensor tq, tk, tv, to, tdo, tlse, tdq, tdk, tdv;
} bcall;

static void bcall_make(bcall *b) {
    float **bufs[] = {&b->q, &b->k, &b->v, &b->o, &b->d_o, &b->dq, &b->dk, &b->dv};
    rng_t r = {12345};
    for (int i = 0; i < 8; i++) {
        *bufs[i] = xcalloc(BW_N, sizeof(float));
        for (int64_t e = 0; e < BW_N; e++) (*bufs[i])[e] = draw(&r, 0);
    }
    b->lse = xcalloc(BW_H * BW_L, sizeof(float));
    attn_tensor *ts[] = {&b->tq, &b->tk, &b->tv, &b->to, &b->tdo, &b->tdq, &b->tdk, &b->tdv};
    for (int i = 0; i < 8; i++) *ts[i] = attn_tensor_4d(*bufs[i], ATTN_F32, 1, BW_H, BW_L, BW_D);
    b->tlse = attn_tensor_4d(b->lse, ATTN_F32, 1, BW_H, BW_L, 1);
    attn_options f = {.lse = &b->tlse, .threads = 2};
    CHECK(attn_forward(&b->tq, &b->tk, &b->tv, &b->to, &f) == ATTN_OK, "backward case's forward: %s",
          attn_last_error());
}

static attn_status bcall_run(bcall *b, int threads) {
    const attn_options opt = {.threads = threads};
    return attn_backward(&b->tq, &b->tk, &b->tv, &b->to, &b->tdo, &b->tlse, &b->tdq, &b->tdk,
                         &b->tdv, &opt);
}

static void bcall_free(bcall *b) {
    float *bufs[] = {b->q, b->k, b->v, b->o, b->d_o, b->lse, b->dq, b->dk, b->dv};
    for (int i = 0; i < 9; i++) free(bufs[i]);
}

/* The child of every setting: the workspaces, O of the prefill case, the gradients; with
 * `checks`, the oracle and the thread counts too. */
static void run_cases(payload *pay, bool checks) {
    const fcase cases[3] = {case_prefill(), case_decode(), case_other()};
    for (int i = 0; i < 3; i++) {
        if (i < 2) pay->ws[i] = forward_ws(&cases[i]);
        tcall t;
        tcall_build(&t, &cases[i]);
        CHECK(tcall_run(&t, ATTN_PATH_FUSED, 2) == ATTN_OK, "case %d: %s", i, attn_last_error());
        tcall_gather(&t);
        if (i == 0) {
            pay->n_o = t.no < PAY_FLOATS ? t.no : PAY_FLOATS;
            memcpy(pay->o, t.o_got, (size_t)pay->n_o * sizeof(float));
        }
        if (checks) {
            float *o2 = xcalloc(t.no, sizeof(float));
            memcpy(o2, t.o_got, (size_t)t.no * sizeof(float));
            tcall_oracle(&t);
            tcall_check(&t, "with the wisdom");
            CHECK(tcall_run(&t, ATTN_PATH_FUSED, 1) == ATTN_OK, "case %d, 1 thread", i);
            tcall_gather(&t);
            CHECK(memcmp(o2, t.o_got, (size_t)t.no * sizeof(float)) == 0,
                  "case %d: O on 1 thread is not bit for bit O on 2 [%s]", i, t.desc);
            free(o2);
        }
        tcall_free(&t);
    }
    bcall b;
    bcall_make(&b);
    attn_options wo = {0};
    CHECK(attn_backward_workspace_size(&b.tq, &b.tk, &b.tv, &b.to, &b.tdo, &b.tlse, &b.tdq, &b.tdk,
                                       &b.tdv, &wo, &pay->ws[2]) == ATTN_OK,
          "backward workspace: %s", attn_last_error());
    CHECK(bcall_run(&b, 2) == ATTN_OK, "backward: %s", attn_last_error());
    pay->n_dq = 2 * BW_N;
    memcpy(pay->dq, b.dq, BW_N * sizeof(float));
    memcpy(pay->dq + BW_N, b.dk, BW_N * sizeof(float));
    if (checks) {
        CHECK(bcall_run(&b, 1) == ATTN_OK, "backward, 1 thread: %s", attn_last_error());
        CHECK(memcmp(pay->dq, b.dq, BW_N * sizeof(float)) == 0 &&
                  memcmp(pay->dq + BW_N, b.dk, BW_N * sizeof(float)) == 0,
              "backward: dQ, dK on 1 thread are not bit for bit those on 2");
    }
    bcall_free(&b);
}

/* the wisdom that forces a configuration on each tuned class of the cases */
static const char *const k_forcing =
    "prefill f32 d64 none g1 = kernel=generic bq=32 bk=32 split=static\n"
    "decode f32 d128 none g4 = kernel=static bq=static bk=32 split=1\n"
    "backward f32 d64 none g1 = kernel=static bq=32 bk=32 split=static\n";

static void child_applied(payload *pay) {
    CHECK(ai_wisdom_get() != NULL, "the forcing wisdom was not loaded");
    /* the params of the prefill case take the class's kernel and tiles */
    const fcase pc = case_prefill();
    tcall t;
    tcall_build(&t, &pc);
    attn_params p;
    t.opt.path = ATTN_PATH_FUSED;
    CHECK(ai_params_init(&p, &t.q, &t.k, &t.v, &t.o, &t.opt, true) == ATTN_OK, "params: %s",
          attn_last_error());
    CHECK(p.kernels == ai_kernels_named("generic") && p.tune.bq == 32 && p.tune.bk == 32,
          "prefill: the params run %s with bq %d bk %d, the wisdom says generic 32 32",
          p.kernels ? p.kernels->name : "(none)", p.tune.bq, p.tune.bk);
    const attn_tiles tl = ai_choose_tiles(p.kernels, ATTN_TILES_FORWARD, p.kv_dt, p.Dk, p.Dv, &p.tune);
    CHECK(tl.bq == 32 && tl.bk == 32, "prefill: tiles %lld x %lld, expected 32 x 32",
          (long long)tl.bq, (long long)tl.bk);
    CHECK(ai_params_init_for(&p, &t.q, &t.k, &t.v, &t.o, &t.opt, true, true, NULL) == ATTN_OK &&
              p.tune.bq == 32 && p.tune.bk == 32 && p.kernels == ai_select_kernels(NULL),
          "the backward class of the same shapes: bq %d bk %d kernel %s", p.tune.bq, p.tune.bk,
          p.kernels ? p.kernels->name : "(none)");
    tcall_free(&t);
    run_cases(pay, true);
}

static void child_static(payload *pay) {
    CHECK(ai_wisdom_get() == NULL, "a wisdom was loaded with ATTN_TUNE=0");
    run_cases(pay, false);
}

/* whatever the environment says: the cases alone */
static void child_plain(payload *pay) { run_cases(pay, false); }

/* a refused file: the static choices, whatever the file says */
static void child_refused(payload *pay) {
    CHECK(ai_wisdom_get() == NULL, "a refused wisdom was loaded");
    const attn_tune_config z = ai_wisdom_lookup((attn_tune_class){ATTN_PHASE_PREFILL, 0, 1, 0, 0});
    CHECK(z.kernels == NULL && z.bq == 0 && z.bk == 0 && z.split == 0,
          "a refused wisdom's configuration was used");
    run_cases(pay, false);
    ai_wisdom_get();  // asked again: no second warning
}

int main(void) {
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/test_wisdom.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) {
        fprintf(stderr, "test_wisdom: cannot make a temporary folder\n");
        return 2;
    }
    /* never the developer's own wisdom, in this process or its children */
    setenv("XDG_CACHE_HOME", g_dir, 1);
    setenv("ATTN_TUNE", "0", 1);
    unsetenv("ATTN_WISDOM");
    unsetenv("ATTN_ISA");
    unsetenv("ATTN_FWD_BQ");
    unsetenv("ATTN_FWD_BK");
    unsetenv("ATTN_BWD_BQ");

    /* the children first: the parser's tests make this process choose its kernel
     * (dispatch.c, once), which a child's ATTN_ISA could then not change */
    write_file("forcing", "attn-wisdom 1", NULL, k_forcing);
    char forcing[512], foreign[512], corrupt[512], avx[512];
    path_of(forcing, sizeof forcing, "forcing");
    char cpu_other[300];
    snprintf(cpu_other, sizeof cpu_other, "cpu vendor=GenuineIntel family=6 model=143 isa=avx512,%s",
             strstr(ai_wisdom_cpu_line(), "isa=") + 4);
    write_file("foreign", "attn-wisdom 1", cpu_other, k_forcing);
    path_of(foreign, sizeof foreign, "foreign");
    char body[1024];
    snprintf(body, sizeof body, "%sprefill f32 d64 causal g1 = kernel=static bq=33 bk=32 split=static\n",
             k_forcing);
    write_file("corrupt", "attn-wisdom 1", NULL, body);
    path_of(corrupt, sizeof corrupt, "corrupt");
    const char *absent = kernel_not_here();
    snprintf(body, sizeof body, "%sprefill f32 d64 causal g1 = kernel=%s bq=static bk=static "
             "split=static\n", k_forcing, absent ? absent : "generic");
    write_file("absent_kernel", "attn-wisdom 1", NULL, body);
    path_of(avx, sizeof avx, "absent_kernel");

    char env_forcing[600], env_foreign[600], env_corrupt[600], env_avx[600];
    snprintf(env_forcing, sizeof env_forcing, "ATTN_WISDOM=%s", forcing);
    snprintf(env_foreign, sizeof env_foreign, "ATTN_WISDOM=%s", foreign);
    snprintf(env_corrupt, sizeof env_corrupt, "ATTN_WISDOM=%s", corrupt);
    snprintf(env_avx, sizeof env_avx, "ATTN_WISDOM=%s", avx);

    static payload applied, stat, same, refused;
    bool all;
    /* the static choices (no wisdom) */
    const char *const e_static[] = {"ATTN_TUNE=0", env_forcing, NULL};
    CHECK(in_child(child_static, e_static, "err_static", &stat), "the static child did not finish");
    CHECK(err_lines("err_static", NULL, &all) == 0, "ATTN_TUNE=0: something on stderr");
    /* the forcing wisdom, from ATTN_WISDOM */
    const char *const e_applied[] = {"ATTN_TUNE", env_forcing, NULL};
    CHECK(in_child(child_applied, e_applied, "err_applied", &applied), "the wisdom's child did not finish");
    CHECK(err_lines("err_applied", NULL, &all) == 0, "an accepted wisdom: something on stderr");
    if (err_lines("err_applied", NULL, &all) != 0) echo_err("err_applied");
    CHECK(applied.ws[0] < stat.ws[0], "prefill: workspace %zu with 32 x 32 tiles, not below the "
          "static %zu", applied.ws[0], stat.ws[0]);
    CHECK(applied.ws[1] < stat.ws[1], "decode: workspace %zu with split 1, not below the static "
          "%zu (its split partials)", applied.ws[1], stat.ws[1]);
    CHECK(applied.ws[2] < stat.ws[2], "backward: workspace %zu with 32 x 32 tiles, not below the "
          "static %zu", applied.ws[2], stat.ws[2]);
    /* the same configuration from the environment's overrides: the same bits */
    const char *const e_same[] = {"ATTN_TUNE=0", "ATTN_ISA=generic", "ATTN_FWD_BQ=32",
                                  "ATTN_FWD_BK=32", NULL};
    CHECK(in_child(child_static, e_same, "err_same", &same), "the ATTN_ISA child did not finish");
    CHECK(applied.n_o > 0 && applied.n_o == same.n_o &&
              memcmp(applied.o, same.o, (size_t)applied.n_o * sizeof(float)) == 0,
          "prefill: O under the wisdom is not bit for bit O under ATTN_ISA=generic ATTN_FWD_BQ=32 "
          "ATTN_FWD_BK=32");
    /* the gradients with the wisdom's backward tiles agree with the static ones */
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < applied.n_dq; i++) {
        const double d = fabs((double)applied.dq[i] - stat.dq[i]);
        if (d > worst) worst = d;
        if (fabs(stat.dq[i]) > scale) scale = fabs(stat.dq[i]);
    }
    CHECK(applied.n_dq == stat.n_dq && worst <= 1e-5 * (scale > 1 ? scale : 1),
          "backward: dQ, dK with the wisdom differ from the static ones by %.3g (largest %.3g)",
          worst, scale);
    /* ATTN_ISA set: the wisdom is not used */
    const char *const e_isa[] = {"ATTN_TUNE", env_forcing, "ATTN_ISA=generic", NULL};
    payload *isa = calloc(1, sizeof *isa);
    CHECK(isa && in_child(child_plain, e_isa, "err_isa", isa), "the ATTN_ISA child did not finish");
    CHECK(isa && isa->ws[0] == stat.ws[0] && isa->ws[1] == stat.ws[1],
          "ATTN_ISA set: the wisdom's tiles or split were used");
    free(isa);
    /* refused files: one warning each, the static choices' results */
    const struct {
        const char *what, *env, *err;
    } refusals[] = {
        {"another CPU", env_foreign, "err_foreign"},
        {"a corrupt line", env_corrupt, "err_corrupt"},
        {"a kernel this CPU cannot run", env_avx, "err_avx"},
    };
    for (int i = 0; i < 3; i++) {
        if (i == 2 && !absent) continue;
        const char *const e[] = {"ATTN_TUNE", refusals[i].env, NULL};
        memset(&refused, 0, sizeof refused);
        CHECK(in_child(child_refused, e, refusals[i].err, &refused), "%s: the child did not finish",
              refusals[i].what);
        const int lines = err_lines(refusals[i].err, "ignored", &all);
        CHECK(lines == 1 && all, "%s: %d lines on stderr, expected one warning", refusals[i].what, lines);
        CHECK(refused.ws[0] == stat.ws[0] && refused.ws[1] == stat.ws[1] && refused.ws[2] == stat.ws[2] &&
                  memcmp(refused.o, stat.o, sizeof stat.o) == 0,
              "%s: the calls did not take the static choices", refusals[i].what);
    }
    /* the default path: $XDG_CACHE_HOME/attn/wisdom, read when ATTN_WISDOM is unset */
    char dir[600], dflt[640];
    snprintf(dir, sizeof dir, "%s/attn", g_dir);
    mkdir(dir, 0755);
    snprintf(dflt, sizeof dflt, "%s/wisdom", dir);
    char src[512];
    path_of(src, sizeof src, "forcing");
    FILE *in = fopen(src, "r"), *out = fopen(dflt, "w");
    int ch;
    while (in && out && (ch = fgetc(in)) != EOF) fputc(ch, out);
    if (in) fclose(in);
    if (out) fclose(out);
    const char *const e_default[] = {"ATTN_TUNE", "ATTN_WISDOM", NULL};
    memset(&refused, 0, sizeof refused);
    CHECK(in_child(child_plain, e_default, "err_default", &refused), "the default-path child did not finish");
    CHECK(refused.ws[0] == applied.ws[0] && refused.ws[1] == applied.ws[1],
          "the wisdom at $XDG_CACHE_HOME/attn/wisdom was not used");
    remove(dflt);
    rmdir(dir);

    test_round_trip();
    test_refusals();

    /* tidy up */
    static const char *const files[] = {"round", "bad", "empty", "forcing", "foreign", "corrupt",
                                        "absent_kernel", "err_static", "err_applied", "err_same",
                                        "err_isa", "err_foreign", "err_corrupt", "err_avx",
                                        "err_default"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[512];
        path_of(path, sizeof path, files[i]);
        remove(path);
    }
    rmdir(g_dir);
    return check_summary("test_wisdom");
}
