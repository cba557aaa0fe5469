/*
 * tune.c — attn_tune (attn.h): times candidate configurations of the fused path on this
 *          machine, for each shape class of a list, and writes the winners to a wisdom
 *          file (wisdom.h) that later processes read.
 *
 * What it is not: the reader of the file (wisdom.c), nor anything a call does at run
 * time: a call takes a configuration from the file, never from a clock (ATTN_TUNE=auto
 * runs attn_tune once, before the first call reads the file it wrote: auto.c).
 *
 * Per class, one representative call (class_case) and three rounds of candidates, each
 * timed as interleaved medians (the candidates take turns, so that a slow spell of a
 * shared machine hits them all alike):
 *   1. the kernel: the static choice against every other kernel this CPU runs;
 *   2. the tiles on the kernel kept: bq and bk one at a time (and the split, decoding);
 *   3. the best of 2 against the static choice again, with more samples.
 * A candidate replaces the static choice (or the previous round's) only when its median
 * and its best sample are both MARGIN faster: tuned never loses to static beyond the noise. A candidate whose first
 * sample is SLOW times the baseline's is dropped (it cannot win; the generic kernel).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/half.h"
#include "kernels/wisdom.h"

#define MARGIN 0.03
#define SLOW 2.5
enum { MAX_CANDS = 24 };

/* ---- the classes and their calls ---------------------------------------------------- */

/* One class to tune and the call that stands for it (B, Hq, Hkv, Lq, Lk, D), built by
 * class_case. */
typedef struct tune_case {
    attn_tune_class cls;
    int64_t B, Hq, Hkv, Lq, Lk, D;
} tune_case;

/* phase, dtype (f32 bf16 f16 q8_0), dim index, mask, group index */
#define C(ph, dt, dim, mask, grp) {ATTN_PHASE_##ph, dt, dim, mask, grp}
/* the common classes: what --quick tunes, and the first of the full list */
static const attn_tune_class k_quick[] = {
    C(PREFILL, 0, 1, 0, 0), C(PREFILL, 0, 2, 1, 0), C(DECODE, 0, 2, 0, 2),
    C(DECODE, 1, 2, 0, 2),  C(BACKWARD, 0, 1, 0, 0),
};
static const attn_tune_class k_full_more[] = {
    C(PREFILL, 0, 1, 1, 0), C(PREFILL, 0, 2, 0, 0), C(PREFILL, 0, 1, 2, 0), C(PREFILL, 0, 1, 3, 0),
    C(PREFILL, 1, 1, 0, 0), C(PREFILL, 1, 2, 1, 0), C(PREFILL, 2, 1, 0, 0), C(PREFILL, 0, 1, 0, 2),
    C(DECODE, 0, 1, 0, 0),  C(DECODE, 0, 2, 0, 3),  C(DECODE, 1, 2, 0, 3),  C(DECODE, 3, 2, 0, 2),
    C(DECODE, 0, 2, 2, 2),  C(BACKWARD, 0, 2, 0, 0), C(BACKWARD, 0, 1, 1, 0),
    C(BACKWARD, 0, 2, 1, 0),
};
#undef C

static const int64_t k_dim_of[ATTN_TUNE_DIMS] = {32, 64, 128, 256};
static const int64_t k_group_of[ATTN_TUNE_GROUPS] = {1, 2, 4, 8};

static tune_case class_case(attn_tune_class c, bool quick) {
    tune_case t = {.cls = c, .B = 1, .D = k_dim_of[c.dim]};
    const int64_t g = k_group_of[c.group];
    if (c.phase == ATTN_PHASE_DECODE) {  // one new row against a long cache, 8 K/V heads
        t.Hkv = 8, t.Hq = 8 * g, t.Lq = 1, t.Lk = quick ? 4096 : 8192;
    } else {  // a square call, 4 query heads (2 for the backward, which costs 2.5 forwards)
        t.Hq = c.phase == ATTN_PHASE_BACKWARD ? 2 : 4;
        t.Hkv = t.Hq / g > 0 ? t.Hq / g : 1;
        t.Hq = t.Hkv * g;
        t.Lq = t.Lk = quick ? 512 : 768;
    }
    return t;
}

/* the K/V dtype of each class's call (fp8 and q4_0: classes of their own, which the lists
 * above do not tune: they keep the static choices) */
static const attn_dtype k_kv_dtype[ATTN_TUNE_DTYPES] = {ATTN_F32, ATTN_BF16, ATTN_F16,
                                                        ATTN_Q8_0, ATTN_FP8_E4M3, ATTN_Q4_0};

/* The buffers of one class's call. */
typedef struct tune_call {
    tune_case tc;
    attn_tensor q, k, v, o, d_o, lse, dq, dk, dv, kv_len_t, mask_t;
    void *mem[11];
    int32_t kv_len[1];
    attn_options opt;
    int nmem;
} tune_call;

static void *take(tune_call *c, size_t bytes) {
    void *p = calloc(bytes ? bytes : 1, 1);
    if (p) c->mem[c->nmem++] = p;
    return p;
}

static void call_free(tune_call *c) {
    for (int i = 0; i < c->nmem; i++) free(c->mem[i]);
    c->nmem = 0;
}

/* n floats in [-1, 1) from a fixed sequence */
static void fill(float *x, int64_t n, uint32_t seed) {
    uint32_t s = seed * 2654435761u + 1u;
    for (int64_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = (float)(s >> 8) / 8388608.0f - 1.0f;
    }
}

/* a tensor of dtype dt (F32, BF16, F16) of shape n filled from seed */
static bool make_tensor(tune_call *c, attn_tensor *t, attn_dtype dt, const int64_t n[4],
                        uint32_t seed) {
    const int64_t count = n[0] * n[1] * n[2] * n[3];
    float *f = take(c, (size_t)count * sizeof(float));
    if (!f) return false;
    fill(f, count, seed);
    void *data = f;
    if (dt != ATTN_F32) {
        uint16_t *h = take(c, (size_t)count * sizeof(uint16_t));
        if (!h) return false;
        for (int64_t i = 0; i < count; i++)
            h[i] = dt == ATTN_BF16 ? attn_f32_to_bf16(f[i]) : attn_f32_to_f16(f[i]);
        data = h;
    }
    *t = attn_tensor_4d(data, dt, n[0], n[1], n[2], n[3]);
    return true;
}

/* a K or V cache of the class's dtype (q8_0 quantized from float32) */
static bool make_kv(tune_call *c, attn_tensor *t, attn_dtype dt, const int64_t n[4],
                    uint32_t seed) {
    if (dt != ATTN_Q8_0) return make_tensor(c, t, dt, n, seed);
    attn_tensor f;
    if (!make_tensor(c, &f, ATTN_F32, n, seed)) return false;
    const int64_t count = n[0] * n[1] * n[2] * n[3];
    void *qd = take(c, (size_t)(count / 32 * 34));
    if (!qd) return false;
    *t = attn_tensor_4d(qd, ATTN_Q8_0, n[0], n[1], n[2], n[3]);
    return attn_quantize_q8_0(&f, t) == ATTN_OK;
}

static bool call_make(tune_call *c, const tune_case *tc, int threads) {
    memset(c, 0, sizeof *c);
    c->tc = *tc;
    const attn_tune_class cls = tc->cls;
    const attn_dtype kv = k_kv_dtype[cls.dtype];
    const attn_dtype qd = kv == ATTN_Q8_0 ? ATTN_F32 : kv;
    const int64_t nq[4] = {tc->B, tc->Hq, tc->Lq, tc->D}, nk[4] = {tc->B, tc->Hkv, tc->Lk, tc->D};
    const int64_t nl[4] = {tc->B, tc->Hq, tc->Lq, 1};
    bool ok = make_tensor(c, &c->q, qd, nq, 1) && make_kv(c, &c->k, kv, nk, 2) &&
              make_kv(c, &c->v, kv, nk, 3) && make_tensor(c, &c->o, qd, nq, 4);
    c->opt.threads = threads;
    c->opt.path = ATTN_PATH_FUSED;
    if (cls.mask == 1) {  // causal; a decoding row sees its whole cache (bottom-right)
        c->opt.causal = true;
        c->opt.align = cls.phase == ATTN_PHASE_DECODE ? ATTN_ALIGN_BOTTOM_RIGHT : ATTN_ALIGN_TOP_LEFT;
    } else if (cls.mask == 2) {  // key lengths: 7/8 of the keys
        c->kv_len[0] = (int32_t)(tc->Lk - tc->Lk / 8);
        c->kv_len_t = attn_tensor_4d(c->kv_len, ATTN_I32, tc->B, 1, 1, 1);
        c->opt.kv_len = &c->kv_len_t;
    } else if (cls.mask == 3) {  // a bool mask shared by the heads: a causal band and holes
        uint8_t *m = take(c, (size_t)(tc->B * tc->Lq * tc->Lk));
        ok = ok && m;
        for (int64_t i = 0; ok && i < tc->B * tc->Lq; i++)
            for (int64_t j = 0; j < tc->Lk; j++)
                m[i * tc->Lk + j] = j <= i % tc->Lq + tc->Lk - tc->Lq && (i + j) % 7 != 0;
        c->mask_t = attn_tensor_4d(m, ATTN_BOOL, tc->B, 1, tc->Lq, tc->Lk);
        c->opt.mask = &c->mask_t;
    }
    if (ok && cls.phase == ATTN_PHASE_BACKWARD) {
        float *lse = take(c, (size_t)(nl[0] * nl[1] * nl[2]) * sizeof(float));
        ok = lse != NULL;
        if (ok) c->lse = attn_tensor_4d(lse, ATTN_F32, nl[0], nl[1], nl[2], 1);
        ok = ok && make_tensor(c, &c->d_o, ATTN_F32, nq, 5) && make_tensor(c, &c->dq, ATTN_F32, nq, 6) &&
             make_tensor(c, &c->dk, ATTN_F32, nk, 7) && make_tensor(c, &c->dv, ATTN_F32, nk, 8);
        /* forced as the timed calls are: attn_forward would read the wisdom, and under
         * ATTN_TUNE=auto this runs inside its loading (wisdom.c), whose pthread_once a
         * call of it would wait on for ever */
        attn_options f = c->opt;
        f.lse = &c->lse;
        const attn_tune_config none = {0};
        ok = ok && ai_forward_forced(&none, &c->q, &c->k, &c->v, &c->o, &f) == ATTN_OK;
    }
    if (!ok) call_free(c);
    return ok;
}

static attn_status call_run(tune_call *c, const attn_tune_config *cfg) {
    if (c->tc.cls.phase == ATTN_PHASE_BACKWARD)
        return ai_backward_forced(cfg, &c->q, &c->k, &c->v, &c->o, &c->d_o, &c->lse, &c->dq,
                                  &c->dk, &c->dv, &c->opt);
    return ai_forward_forced(cfg, &c->q, &c->k, &c->v, &c->o, &c->opt);
}

/* ---- timing ------------------------------------------------------------------------- */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct cand {
    attn_tune_config cfg;
    double t[16];  // seconds a call, one per sample
    int n;
    bool dropped;
} cand;

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double best_of(const cand *c) {
    double b = c->n ? c->t[0] : 0.0;
    for (int i = 1; i < c->n; i++)
        if (c->t[i] < b) b = c->t[i];
    return b;
}

static double median(const cand *c) {
    double s[16];
    memcpy(s, c->t, (size_t)c->n * sizeof(double));
    qsort(s, (size_t)c->n, sizeof(double), cmp_double);
    return c->n == 0 ? 0.0 : c->n % 2 ? s[c->n / 2] : 0.5 * (s[c->n / 2 - 1] + s[c->n / 2]);
}

/* one sample of a candidate: reps calls, seconds a call; < 0 on failure */
static double sample(tune_call *c, const attn_tune_config *cfg, int reps) {
    const double t0 = now_s();
    for (int r = 0; r < reps; r++)
        if (call_run(c, cfg) != ATTN_OK) return -1.0;
    return (now_s() - t0) / reps;
}

/* Times cands[0..n) (cands[0] the baseline) in `rounds` interleaved rounds, a warm-up
 * call each first; drops a failing candidate, or one whose first sample is SLOW times
 * the baseline's. Returns the index of the winner: the fastest median, if it beats the
 * baseline's by MARGIN and its best sample the baseline's best by MARGIN too (a shared
 * machine's noise only adds time, and comes in the scheduler's slices: a median alone can
 * be moved by a few unlucky samples), else 0. false when the baseline itself fails. */
static bool race(tune_call *c, cand *cands, int n, int rounds, int reps, int *winner) {
    for (int i = 0; i < n; i++) {
        cands[i].n = 0;
        cands[i].dropped = call_run(c, &cands[i].cfg) != ATTN_OK;
    }
    if (cands[0].dropped) return false;
    for (int r = 0; r < rounds; r++) {
        for (int s = 0; s < n; s++) {
            const int i = (s + r) % n;  // each round starts one further along
            if (cands[i].dropped) continue;
            const double t = sample(c, &cands[i].cfg, reps);
            if (t < 0) {
                cands[i].dropped = true;
                if (i == 0) return false;
                continue;
            }
            cands[i].t[cands[i].n++] = t;
        }
        for (int i = 1; r == 0 && i < n; i++)  // after the first round: drop the hopeless
            if (!cands[i].dropped && cands[i].t[0] > SLOW * cands[0].t[0]) cands[i].dropped = true;
    }
    int best = 0;
    const double base = median(&cands[0]);
    for (int i = 1; i < n; i++)
        if (!cands[i].dropped && median(&cands[i]) < median(&cands[best])) best = i;
    *winner = best != 0 && median(&cands[best]) <= (1.0 - MARGIN) * base &&
                      best_of(&cands[best]) <= (1.0 - MARGIN) * best_of(&cands[0])
                  ? best : 0;
    return true;
}

/* ---- one class ---------------------------------------------------------------------- */

/* What a class's tuning decided, and the times to write beside it. */
typedef struct tune_result {
    tune_case tc;
    attn_tune_config chosen;
    char notes[4096];  // comment lines, each starting "# "
    double static_ms, chosen_ms;
    bool ok;
} tune_result;

static void note(tune_result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(tune_result *r, const char *fmt, ...) {
    const size_t at = strlen(r->notes);
    if (at + 2 >= sizeof r->notes) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->notes + at, sizeof r->notes - at, fmt, ap);
    va_end(ap);
}

static void config_label(const attn_tune_config *cfg, char *buf, size_t cap) {
    char line[160];
    ai_wisdom_format((attn_tune_class){0}, cfg, line, sizeof line);
    const char *eq = strstr(line, "= ");
    snprintf(buf, cap, "%s", eq ? eq + 2 : line);
}

static void note_race(tune_result *r, const char *what, const cand *cands, int n, int winner) {
    note(r, "#   %s:\n", what);
    for (int i = 0; i < n; i++) {
        char label[160];
        config_label(&cands[i].cfg, label, sizeof label);
        if (cands[i].n == 0 || (cands[i].dropped && cands[i].n < 2))
            note(r, "#     %-56s %s\n", label, cands[i].n ? "dropped (slow)" : "failed");
        else
            note(r, "#     %-56s %9.3f ms (best %.3f)%s%s\n", label, 1e3 * median(&cands[i]),
                 1e3 * best_of(&cands[i]),
                 cands[i].dropped ? " (dropped: slow)" : "",
                 i == winner ? (i == 0 ? " kept" : " chosen") : "");
    }
}

static attn_tile_use decode_or_fwd(int phase) {
    return phase == ATTN_PHASE_BACKWARD ? ATTN_TILES_BACKWARD : ATTN_TILES_FORWARD;
}

static void add(cand *cands, int *n, attn_tune_config cfg) {
    if (*n < MAX_CANDS) cands[(*n)++] = (cand){.cfg = cfg};
}

static void tune_class(const tune_case *tc, bool quick, int threads, tune_result *r) {
    memset(r, 0, sizeof *r);
    r->tc = *tc;
    tune_call c;
    char name[64];
    ai_tune_class_name(tc->cls, name, sizeof name);
    note(r, "# %s: B %lld, Hq %lld, Hkv %lld, Lq %lld, Lk %lld, D %lld; %d threads\n", name,
         (long long)tc->B, (long long)tc->Hq, (long long)tc->Hkv, (long long)tc->Lq,
         (long long)tc->Lk, (long long)tc->D, threads);
    if (!call_make(&c, tc, threads)) {
        note(r, "#   not tuned: the call could not be made (%s)\n", attn_last_error());
        return;
    }
    /* reps: calls a sample, so that one sample takes about target seconds */
    const double target = quick ? 0.004 : 0.010;
    const attn_tune_config none = {0};
    double one = sample(&c, &none, 1);
    one = sample(&c, &none, 1);
    if (one < 0) {
        note(r, "#   not tuned: the static call failed (%s)\n", attn_last_error());
        call_free(&c);
        return;
    }
    const int reps = one >= target ? 1 : (int)(target / (one > 1e-6 ? one : 1e-6)) + 1;
    const int rounds = quick ? 5 : 7;
    cand cands[MAX_CANDS];
    int n = 0, win = 0;

    /* 1. the kernel */
    const attn_kernels *stat = ai_select_kernels(NULL);
    add(cands, &n, none);
    for (const char *const *k = attn_kernel_list(); *k; k++) {
        const attn_kernels *kt = ai_kernels_named(*k);
        if (kt && kt != stat) add(cands, &n, (attn_tune_config){.kernels = kt});
    }
    bool ok = race(&c, cands, n, rounds, reps, &win);
    if (ok) note_race(r, "the kernel", cands, n, win);
    attn_tune_config kept = cands[win].cfg;

    /* 2. the tiles, one field at a time, on the kernel kept (not the static sizes again) */
    const attn_tiles st = ai_choose_tiles(kept.kernels ? kept.kernels : stat,
                                          decode_or_fwd(tc->cls.phase), k_kv_dtype[tc->cls.dtype],
                                          tc->D, tc->D, NULL);
    static const int32_t bqs[] = {32, 64, 96, 112, 128, 160};
    static const int32_t bks[] = {32, 64, 128};
    static const int32_t splits[] = {1, 2, 4, 8, 16};
    n = 0;
    add(cands, &n, kept);
    const bool decode = tc->cls.phase == ATTN_PHASE_DECODE;
    for (size_t i = 0; i < sizeof bqs / sizeof bqs[0]; i++) {
        if (decode || (quick && (bqs[i] == 32 || bqs[i] == 160))) continue;
        attn_tune_config x = kept;
        x.bq = bqs[i];
        if (bqs[i] != st.bq && ai_tune_config_valid(&x, tc->cls.phase)) add(cands, &n, x);
    }
    for (size_t i = 0; i < sizeof bks / sizeof bks[0]; i++) {
        attn_tune_config x = kept;
        x.bk = bks[i];
        if (bks[i] != st.bk && ai_tune_config_valid(&x, tc->cls.phase)) add(cands, &n, x);
    }
    for (size_t i = 0; decode && i < sizeof splits / sizeof splits[0]; i++) {
        attn_tune_config x = kept;
        x.split = splits[i];
        add(cands, &n, x);
    }
    ok = ok && race(&c, cands, n, rounds, reps, &win);
    if (ok) note_race(r, "the tiles", cands, n, win);
    const attn_tune_config best = ok ? cands[win].cfg : none;

    /* 3. the best against the static choice, again, with more samples */
    n = 0;
    add(cands, &n, none);
    win = 0;
    if (memcmp(&best, &none, sizeof none) != 0) {
        add(cands, &n, best);
        ok = ok && race(&c, cands, n, rounds + 4, reps, &win);
        if (ok) note_race(r, "the best against the static choice", cands, n, win);
    } else if (ok) {
        ok = race(&c, cands, 1, 3, reps, &win);
    }
    if (ok) {
        r->chosen = cands[win].cfg;
        r->static_ms = 1e3 * median(&cands[0]);
        r->chosen_ms = 1e3 * median(&cands[win]);
        r->ok = true;
        note(r, "#   static %.3f ms, chosen %.3f ms (%+.1f%%)\n", r->static_ms, r->chosen_ms,
             100.0 * (r->chosen_ms / r->static_ms - 1.0));
    } else {
        note(r, "#   not tuned: a call failed (%s)\n", attn_last_error());
    }
    call_free(&c);
}

/* ---- the file ----------------------------------------------------------------------- */

/* the folders above path, made where missing (as mkdir -p) */
static void make_parents(const char *path) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    for (char *s = dir + 1; *s; s++) {
        if (*s != '/') continue;
        *s = '\0';
        mkdir(dir, 0755);  // an existing one fails with EEXIST, which is what we want
        *s = '/';
    }
}

/* path's temporary sibling, written then renamed onto it */
static void temp_name(const char *path, char *tmp, size_t cap) {
    snprintf(tmp, cap, "%s.tmp.%ld", path, (long)getpid());
}

/* Whether the file can be written there, asked before the timing rather than after it:
 * its folders made, its temporary sibling created and removed. */
static attn_status can_write(const char *path) {
    char tmp[4200];
    temp_name(path, tmp, sizeof tmp);
    make_parents(path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return ai_fail(ATTN_ERR_IO, "attn_tune: cannot write %s: %s", tmp, strerror(errno));
    fclose(f);
    remove(tmp);
    return ATTN_OK;
}

static attn_status write_file(const char *path, const tune_result *res, int nres, bool quick,
                              int threads, double seconds) {
    char tmp[4200];
    temp_name(path, tmp, sizeof tmp);
    make_parents(path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return ai_fail(ATTN_ERR_IO, "attn_tune: cannot write %s: %s", tmp, strerror(errno));
    fprintf(f, "attn-wisdom 1\n%s\n", ai_wisdom_cpu_line());
    fprintf(f, "# written by attn_tune%s on %d threads in %.1f s; a class line is the call's\n"
               "# configuration (static: the library's own choice), the comments above it\n"
               "# the medians of its candidates (docs/KERNELS.md, \"Tuner\")\n",
            quick ? " (quick)" : "", threads, seconds);
    for (int i = 0; i < nres; i++) {
        fputs(res[i].notes, f);
        if (!res[i].ok) continue;
        char line[256];
        ai_wisdom_format(res[i].tc.cls, &res[i].chosen, line, sizeof line);
        fprintf(f, "%s\n", line);
    }
    const bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad) {
        remove(tmp);
        return ai_fail(ATTN_ERR_IO, "attn_tune: writing %s failed", tmp);
    }
    if (rename(tmp, path) != 0) {
        const int e = errno;
        remove(tmp);
        return ai_fail(ATTN_ERR_IO, "attn_tune: cannot rename %s to %s: %s", tmp, path,
                       strerror(e));
    }
    return ATTN_OK;
}

attn_status attn_tune(const attn_tune_options *opt_in) {
    static const attn_tune_options defaults = {0};
    const attn_tune_options *opt = opt_in ? opt_in : &defaults;
    if (opt->threads < 0)
        return ai_fail(ATTN_ERR_VALUE, "attn_tune: threads is %d, expected >= 0 (0 = default)",
                       (int)opt->threads);
    /* what would make the measured calls differ from the tuned ones later */
    static const char *const env[] = {"ATTN_ISA", "ATTN_FWD_BQ", "ATTN_FWD_BK", "ATTN_BWD_BQ"};
    for (size_t i = 0; i < sizeof env / sizeof env[0]; i++) {
        const char *s = getenv(env[i]);
        if (s && *s)
            return ai_fail(ATTN_ERR_UNSUPPORTED, "attn_tune: %s is set; it overrides what the "
                           "tuner chooses, unset it to tune", env[i]);
    }
    char path[4096];
    if (opt->out) {
        if (!*opt->out) return ai_fail(ATTN_ERR_VALUE, "attn_tune: out is an empty path");
        snprintf(path, sizeof path, "%s", opt->out);
    } else if (!ai_wisdom_default_path(path, sizeof path)) {
        return ai_fail(ATTN_ERR_VALUE, "attn_tune: no out path, and none of ATTN_WISDOM, "
                       "XDG_CACHE_HOME, HOME is set");
    }
    if (!ai_select_kernels(NULL))
        return ai_fail(ATTN_ERR_UNSUPPORTED, "attn_tune: no kernel runs on this CPU");
    TRY(can_write(path));
    int threads = opt->threads;
#ifdef _OPENMP
    if (threads == 0) threads = omp_get_max_threads();
#endif
    if (threads < 1) threads = 1;

    const size_t nq = sizeof k_quick / sizeof k_quick[0], nm = sizeof k_full_more / sizeof k_full_more[0];
    const int n = (int)(opt->quick ? nq : nq + nm);
    tune_result *res = calloc((size_t)n, sizeof *res);
    if (!res) return ai_fail(ATTN_ERR_NOMEM, "attn_tune: out of memory");
    const double t0 = now_s();
    for (int i = 0; i < n; i++) {
        const attn_tune_class cls = (size_t)i < nq ? k_quick[i] : k_full_more[i - (int)nq];
        const tune_case tc = class_case(cls, opt->quick);
        tune_class(&tc, opt->quick, threads, &res[i]);
        if (opt->verbose) {
            char line[256];
            ai_wisdom_format(cls, &res[i].chosen, line, sizeof line);
            if (res[i].ok)
                fprintf(stderr, "attn tune: %s  (static %.3f ms, chosen %.3f ms)\n", line,
                        res[i].static_ms, res[i].chosen_ms);
            else
                fprintf(stderr, "attn tune: class %d not tuned\n", i);
        }
    }
    const attn_status st = write_file(path, res, n, opt->quick, threads, now_s() - t0);
    free(res);
    return st == ATTN_OK ? ai_ok() : st;
}
