/*
 * test_fwd_geom.c — the fused forward's tile sizes (src/forward/fused_geom.c): the query block
 *                   (bq) of the kernel's list line, of the Zen 3 avx2 choice, or of
 *                   ATTN_FWD_BQ, and the key block (bk) of ATTN_FWD_BK.
 *
 * The sizes are fixed per process (read once), so each setting runs in a child process
 * (fork, before this process has used OpenMP) with ATTN_ISA and ATTN_FWD_BQ / ATTN_FWD_BK
 * set, over the same cases at the block edges of every bq tried (Lq = bq - 1, bq, bq + 1),
 * GQA heads stacked into one block (Lq < bq), causal, window, key lengths, a bool mask,
 * the LSE, Dk != Dv, on every kernel this CPU runs. Each child checks its outputs against
 * the oracle (check.h's float32 tolerance) and the bits of O for 1, 2 and 3 threads (the
 * same for any thread count, whatever the tile sizes), and sends its workspace sizes back;
 * the parent requires a workspace that follows the bq or bk asked for (so the setting took
 * effect), and the default's workspace for values the override must ignore (not a
 * multiple of the row padding, out of range, not a number). O's bits may differ between
 * settings: which rows share a block decides which of them form a block of few rows, and
 * those take the kernels' decoding forms (kernels.h).
 * With ATTN_TEST_EVERY=n (the sanitizer run of scripts/check.sh) each child still sends the
 * workspace of every case, so the parent's checks stay whole, but checks the outputs of one
 * case in n, the cases taken in turn from child to child: every case is still run and
 * checked on every kernel, under some of the settings.
 * What it is not: the forward's numbers at large (test_forward) or speed (docs/KERNELS.md).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "attn.h"
#include "check.h"
#include "oracle.h"

/* one setting of the environment: ATTN_FWD_BQ, ATTN_FWD_BK (NULL: unset) */
typedef struct setting {
    const char *bq, *bk;
    int ws;          // workspace: 0 the default's, 1 larger, -1 smaller, 2 any
} setting;

static const setting k_settings[] = {
    {NULL, NULL, 0},  {"64", NULL, 2},  {"80", NULL, 2},   {"112", NULL, 2},
    {"256", NULL, 1}, {"16", NULL, -1}, {"100", NULL, 0},  {"512", NULL, 0},
    {"abc", NULL, 0}, {"8", NULL, 0},   {NULL, "32", -1},  {"112", "16", 2},
    {NULL, "24", 0},  {NULL, "0", 0},
};
#define N_SETTINGS ((int)(sizeof k_settings / sizeof k_settings[0]))

static const int64_t k_lq[] = {15, 17, 63, 64, 65, 79, 80, 81, 111, 112, 113, 129, 257};
#define N_LQ ((int)(sizeof k_lq / sizeof k_lq[0]))

/* case i of the list; false past its end */
static bool make_case(int i, fcase *c) {
    if (i < 2 * N_LQ) {  // block edges, two head widths, a few options by turn
        const int64_t lq = k_lq[i / 2], d = i % 2 ? 64 : 40;
        *c = fcase_new(100 + (uint64_t)i, 1, 2, 1, lq, 150 + (i % 3) * 61, d, i % 2 ? 64 : 72);
        c->causal = i % 3 == 1;
        c->align = i % 5 == 1;
        c->lse = i % 4 == 0;
        if (i % 7 == 3) c->window = 1, c->wl = 37, c->wr = 5;
        if (i % 6 == 5) c->kvlen = 1, c->kvlen_fixed = 90;
        if (i % 8 == 6) c->mask = 1, c->mshape = 4;
        return true;
    }
    i -= 2 * N_LQ;
    static const int64_t gqa_lq[] = {1, 3, 9, 17, 31};  // heads stacked into one block
    if (i < 5) {
        *c = fcase_new(200 + (uint64_t)i, 2, 8, 2, gqa_lq[i], 140, 32, 32);
        c->causal = i % 2;
        c->lse = 1;
        return true;
    }
    return false;
}

static int count_cases(void) {
    int n = 0;
    fcase c;
    while (make_case(n, &c)) n++;
    return n;
}

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

/* The child: every case under this setting; per case its workspace bytes, then its pass
 * and fail counts. Under ATTN_TEST_EVERY=n it runs and checks the cases c with
 * (c + turn) % n == the phase only (turn: this child's number, kernels by settings). */
static void child(int fd, const char *isa, const setting *s, int turn) {
    int64_t every, phase;
    test_sampling(&every, &phase);
    g_pass = g_fail = 0;  // this process's own checks, not the parent's before the fork
    setenv("ATTN_ISA", isa, 1);
    if (s->bq) setenv("ATTN_FWD_BQ", s->bq, 1);
    else unsetenv("ATTN_FWD_BQ");
    if (s->bk) setenv("ATTN_FWD_BK", s->bk, 1);
    else unsetenv("ATTN_FWD_BK");
    fcase c;
    for (int i = 0; make_case(i, &c); i++) {
        tcall t;
        tcall_build(&t, &c);
        size_t ws = 0;
        t.opt.path = ATTN_PATH_FUSED;
        t.opt.threads = 2;
        CHECK(attn_forward_workspace_size(&t.q, &t.k, &t.v, &t.o, &t.opt, &ws) == ATTN_OK,
              "workspace size [%s]", t.desc);
        if ((i + turn) % every != phase) {  // sampled out: its workspace only
            write_all(fd, &ws, sizeof ws);
            tcall_free(&t);
            continue;
        }
        tcall_oracle(&t);
        const attn_status st = tcall_run(&t, ATTN_PATH_FUSED, 2);
        CHECK(st == ATTN_OK, "%s ATTN_FWD_BQ=%s ATTN_FWD_BK=%s: %s [%s]", isa,
              s->bq ? s->bq : "-", s->bk ? s->bk : "-", attn_last_error(), t.desc);
        char what[96];
        snprintf(what, sizeof what, "%s bq=%s bk=%s", isa, s->bq ? s->bq : "-", s->bk ? s->bk : "-");
        tcall_check(&t, what);
        float *o2 = xcalloc(t.no, sizeof(float));
        memcpy(o2, t.o_got, (size_t)t.no * sizeof(float));
        for (int threads = 1; threads <= 3; threads += 2) {
            CHECK(tcall_run(&t, ATTN_PATH_FUSED, threads) == ATTN_OK, "%s, %d threads [%s]", what,
                  threads, t.desc);
            tcall_gather(&t);
            CHECK(memcmp(o2, t.o_got, (size_t)t.no * sizeof(float)) == 0,
                  "%s: O with %d threads not bit-identical to 2 threads' [%s]", what, threads, t.desc);
        }
        free(o2);
        write_all(fd, &ws, sizeof ws);
        tcall_free(&t);
    }
    const int counts[2] = {g_pass, g_fail};
    write_all(fd, counts, sizeof counts);
}

/* One setting's results, read from its child. */
typedef struct outcome {
    size_t *ws;
    bool ok;  // the child ran to its end
} outcome;

static outcome run_setting(const char *isa, const setting *s, int ncases, int turn) {
    outcome r = {xcalloc(ncases, sizeof(size_t)), false};
    int fds[2];
    if (pipe(fds) != 0) return r;
    fflush(NULL);
    const pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        child(fds[1], isa, s, turn);
        close(fds[1]);
        _exit(0);
    }
    close(fds[1]);
    bool ok = pid > 0;
    for (int i = 0; ok && i < ncases; i++) ok = read_all(fds[0], &r.ws[i], sizeof r.ws[i]);
    int counts[2] = {0, 0};
    ok = ok && read_all(fds[0], counts, sizeof counts);
    close(fds[0]);
    int status = 0;
    if (pid > 0) waitpid(pid, &status, 0);
    r.ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    g_pass += counts[0];
    g_fail += counts[1];
    return r;
}

static void outcome_free(outcome *r) { free(r->ws); }

int main(void) {
    const int ncases = count_cases();
    int64_t every, phase;
    test_sampling(&every, &phase);  // its line printed once, before the children
    int kernels = 0;
    for (const char *const *name = attn_kernel_list(); *name; name++) {
        if (!attn_kernel_supported(*name)) continue;
        kernels++;
        outcome base = run_setting(*name, &k_settings[0], ncases, kernels * N_SETTINGS);
        CHECK(base.ok, "%s: the default setting's child did not finish", *name);
        for (int si = 1; si < N_SETTINGS && base.ok; si++) {
            const setting *s = &k_settings[si];
            outcome r = run_setting(*name, s, ncases, kernels * N_SETTINGS + si);
            CHECK(r.ok, "%s ATTN_FWD_BQ=%s ATTN_FWD_BK=%s: the child did not finish", *name,
                  s->bq ? s->bq : "-", s->bk ? s->bk : "-");
            int ws_wrong = 0;
            for (int i = 0; r.ok && i < ncases; i++) {
                ws_wrong += s->ws == 0 ? r.ws[i] != base.ws[i]
                          : s->ws == 1 ? r.ws[i] <= base.ws[i]
                          : s->ws == -1 ? r.ws[i] >= base.ws[i] : 0;
            }
            CHECK(ws_wrong == 0, "%s ATTN_FWD_BQ=%s ATTN_FWD_BK=%s: workspace of %d cases not %s the default's",
                  *name, s->bq ? s->bq : "-", s->bk ? s->bk : "-", ws_wrong,
                  s->ws == 0 ? "equal to" : s->ws == 1 ? "above" : "below");
            outcome_free(&r);
        }
        outcome_free(&base);
    }
    CHECK(kernels >= 1, "no kernel runs on this CPU");
    printf("  %d kernels x %d settings x %d cases\n", kernels, N_SETTINGS, ncases);
    return check_summary("test_fwd_geom");
}
