/*
 * bench_peer.c — the PyTorch peer of `attn bench --vs torch` (bench_peer.h): the child
 *                process, its JSON Lines protocol (read through tools/common/json.c) and the
 *                --setup-torch venv.
 */
#include "bench_peer.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_clock.h"
#include "cliopt.h"
#include "json.h"

/* An error of the PyTorch side on stderr, as the bench's own ("attn: bench: ..."): 1. */
#define peer_fail(...) cli_say(1, "bench: ", __VA_ARGS__)



/* One answer line of bench_torch.py, a JSON object; NULL (with the reason in err) when the
 * line is not one. */
static jnode *torch_answer(const char *line, char *err, size_t n) {
    size_t len = strlen(line);
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
    jnode *j = json_parse(line, len, err, n);
    if (j && j->type != J_OBJ) {
        snprintf(err, n, "not a JSON object");
        json_free(j);
        j = NULL;
    }
    return j;
}

/* A string member of an answer copied into out (n bytes, truncated); false if absent. */
static bool answer_str(const jnode *j, const char *key, char *out, size_t n) {
    const char *s = jget_str(j, key);
    if (!s) return false;
    snprintf(out, n, "%s", s);
    return true;
}

bool file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* The source tree: the folder above the one holding this executable (build/attn), when
 * it has scripts/bench_torch.py; else the current folder. */
void source_root(char *out, size_t n) {
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = 0;
        for (int up = 0; up < 2; up++) {
            char *slash = strrchr(exe, '/');
            if (!slash) break;
            *slash = 0;
            char probe[PATH_MAX + 64];
            snprintf(probe, sizeof probe, "%s/scripts/bench_torch.py", exe);
            if (file_exists(probe)) {
                snprintf(out, n, "%s", exe);
                return;
            }
        }
    }
    snprintf(out, n, ".");
}

int torch_start(torch_proc *tp, const char *python, const char *script, int threads) {
    int in[2], out[2];
    if (pipe(in) || pipe(out)) return peer_fail("pipe: %s", strerror(errno));
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return peer_fail("fork: %s", strerror(errno));
    if (pid == 0) {
        dup2(in[0], 0), dup2(out[1], 1);
        close(in[0]), close(in[1]), close(out[0]), close(out[1]);
        char nt[16];
        snprintf(nt, sizeof nt, "%d", threads);
        setenv("OMP_NUM_THREADS", nt, 1);
        setenv("MKL_NUM_THREADS", nt, 1);
        execlp(python, python, script, (char *)NULL);
        fprintf(stderr, "attn: bench: cannot run %s: %s\n", python, strerror(errno));
        _exit(127);
    }
    close(in[0]), close(out[1]);
    tp->pid = pid;
    tp->to = fdopen(in[1], "w");
    tp->from = fdopen(out[0], "r");
    fprintf(tp->to, "{\"hello\": 1, \"threads\": %d}\n", threads);
    fflush(tp->to);
    static char line[65536];
    if (!fgets(line, sizeof line, tp->from))
        return peer_fail("%s %s: no answer (is torch installed? try 'attn bench "
                   "--setup-torch')", python, script);
    char err[256];
    jnode *j = torch_answer(line, err, sizeof err);
    if (!j) return peer_fail("%s: unexpected answer (%s): %.200s", script, err, line);
    int rc = 0;
    if (answer_str(j, "error", err, sizeof err))
        rc = peer_fail("%s: %s", script, err);
    else if (!answer_str(j, "torch", tp->version, sizeof tp->version))
        rc = peer_fail("%s: unexpected answer: %.200s", script, line);
    else
        answer_str(j, "info", tp->info, sizeof tp->info);
    json_free(j);
    return rc;
}

void torch_case(torch_proc *tp, bench_case *c, int threads, int warmup, int reps) {
    fprintf(tp->to,
            "{\"name\": \"%s\", \"B\": %lld, \"Hq\": %lld, \"Hkv\": %lld, \"Lq\": %lld, "
            "\"Lk\": %lld, \"Dk\": %lld, \"Dv\": %lld, \"mask\": \"%s\", \"window_left\": %lld, "
            "\"window_right\": %lld, \"mask_density\": %g, \"threads\": %d, \"warmup\": %d, "
            "\"reps\": %d, \"max_reps\": %d, \"adaptive_seconds\": %g, \"rotate\": %d, "
            "\"dtype\": \"%s\", \"kv_dtype\": \"%s\", \"direction\": \"%s\"}\n",
            c->name, (long long)c->B, (long long)c->Hq, (long long)c->Hkv, (long long)c->Lq,
            (long long)c->Lk, (long long)c->Dk, (long long)c->Dv, MASK_NAME[c->mask],
            (long long)c->win_left, (long long)c->win_right, BOOL_MASK_DENSITY, threads, warmup,
            reps, ADAPTIVE_REPS, ADAPTIVE_SECONDS, c->rotate, attn_dtype_name(c->qdt),
            attn_dtype_name(c->kvdt), c->bwd ? "backward" : "forward");
    fflush(tp->to);
    static char line[65536];
    if (!fgets(line, sizeof line, tp->from)) {
        snprintf(c->torch_error, sizeof c->torch_error, "the torch process ended");
        return;
    }
    char err[160];
    jnode *j = torch_answer(line, err, sizeof err);
    if (!j) {
        snprintf(c->torch_error, sizeof c->torch_error, "unexpected answer (%s)", err);
        return;
    }
    double v;
    const jnode *times = jget(j, "times");
    if (answer_str(j, "error", c->torch_error, sizeof c->torch_error)) {
        /* the PyTorch side could not run the case: its reason is the row's */
    } else if (!jget_num(j, "median_s", &v)) {
        snprintf(c->torch_error, sizeof c->torch_error, "unexpected answer");
    } else if (!times || times->type != J_ARR) {
        snprintf(c->torch_error, sizeof c->torch_error, "no times in the answer");
    } else {
        /* the times of the calls, pooled with those of the other rounds */
        for (const jnode *t = times->child; t && c->ntts < POOL; t = t->next)
            if (t->type == J_NUM) c->tts[c->ntts++] = t->num;
    }
    json_free(j);
}

void torch_stop(torch_proc *tp) {
    if (tp->to) fclose(tp->to);
    if (tp->from) fclose(tp->from);
    if (tp->pid > 0) waitpid(tp->pid, NULL, 0);
}

/* Runs argv to completion; its exit status, or -1. */
static int run_child(char *const argv[]) {
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        execvp(argv[0], argv);
        fprintf(stderr, "attn: bench: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    int st;
    if (waitpid(pid, &st, 0) < 0) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int setup_torch(const char *root) {
    char venv[PATH_MAX + 32], py[PATH_MAX + 64];
    snprintf(venv, sizeof venv, "%s/.venv-bench", root);
    snprintf(py, sizeof py, "%s/bin/python", venv);
    const double t0 = now_s();
    if (!file_exists(py)) {
        fprintf(stderr, "attn bench: python3 -m venv %s\n", venv);
        char *mk[] = {"python3", "-m", "venv", venv, NULL};
        if (run_child(mk) != 0) return peer_fail("could not create the venv %s", venv);
    }
    fprintf(stderr, "attn bench: %s -m pip install torch numpy matplotlib (PyPI's default "
            "torch wheel brings its CUDA libraries: several GB)\n", py);
    char *pip[] = {py, "-m", "pip", "install", "torch", "numpy", "matplotlib", NULL};
    if (run_child(pip) != 0) return peer_fail("pip install failed (see above)");
    char *ver[] = {py, "-c", "import torch; print('torch', torch.__version__, 'threads', "
                   "torch.get_num_threads())", NULL};
    if (run_child(ver) != 0) return peer_fail("torch does not import (see above)");
    fprintf(stderr, "attn bench: ready in %.0f s; run 'attn bench --vs torch'\n", now_s() - t0);
    return 0;
}
