/*
 * wisdom.c — the wisdom file (wisdom.h): the shape class of a call, the file's lines
 *            parsed and written, and the process's wisdom loaded once.
 *
 * What it is not: the tuner that measures and writes the file (tune.c), nor ATTN_TUNE=auto's
 * tuning (tune/auto.c: the program asks for it, a call never does), nor what a
 * configuration does (fused_geom.c takes bq and bk, fused.c the split, params.c the
 * kernel).
 *
 * Trust is all or nothing: a file is used only when its header and cpu line are this
 * process's and every line parses into a configuration this CPU can run; anything else
 * and the whole file is ignored, with one line on stderr. A partly trusted file would
 * make a call's bits depend on which line of it happened to be broken.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/half.h"
#include "wisdom.h"

/* ---- shape classes ------------------------------------------------------------------ */

static const char *const k_phase[ATTN_PHASES] = {"prefill", "decode", "backward"};
static const char *const k_dtype[ATTN_TUNE_DTYPES] = {"f32", "bf16", "f16", "q8_0", "fp8",
                                                         "q4_0"};
static const char *const k_dim[ATTN_TUNE_DIMS] = {"d32", "d64", "d128", "d256"};
static const char *const k_mask[ATTN_TUNE_MASKS] = {"none", "causal", "keylen", "mixed"};
static const char *const k_group[ATTN_TUNE_GROUPS] = {"g1", "g2", "g4", "g8"};

attn_tune_class ai_tune_class_of(const attn_params *p, bool backward, bool key_lengths) {
    attn_tune_class c;
    c.phase = backward ? ATTN_PHASE_BACKWARD
              : p->Lq <= ATTN_DECODE_MAX_ROWS ? ATTN_PHASE_DECODE : ATTN_PHASE_PREFILL;
    c.dtype = p->kv_dt == ATTN_BF16 ? 1 : p->kv_dt == ATTN_F16 ? 2 : p->kv_dt == ATTN_Q8_0 ? 3
              : attn_is_fp8(p->kv_dt)  ? 4
              : p->kv_dt == ATTN_Q4_0 || p->kv_dt == ATTN_U4 ? 5 : 0;  // the 4-bit caches: untuned
    c.dim = p->Dk <= 32 ? 0 : p->Dk <= 64 ? 1 : p->Dk <= 128 ? 2 : 3;
    /* the masks that decide which tiles a row reads: structure (causal, window), key
     * lengths, per-element masks (bool mask, bias, block mask); two kinds at once are
     * "mixed", as is any per-element one */
    const bool band = p->causal || p->win_left >= 0 || p->win_right >= 0;
    const bool lens = key_lengths, elem = p->mask || p->bias || p->block;
    c.mask = elem || (band && lens) ? 3 : band ? 1 : lens ? 2 : 0;
    c.group = p->group <= 1 ? 0 : p->group == 2 ? 1 : p->group <= 4 ? 2 : 3;
    return c;
}

int ai_tune_class_index(attn_tune_class c) {
    return (((c.phase * ATTN_TUNE_DTYPES + c.dtype) * ATTN_TUNE_DIMS + c.dim) * ATTN_TUNE_MASKS +
            c.mask) * ATTN_TUNE_GROUPS + c.group;
}

void ai_tune_class_name(attn_tune_class c, char *buf, size_t cap) {
    snprintf(buf, cap, "%s %s %s %s %s", k_phase[c.phase], k_dtype[c.dtype], k_dim[c.dim],
             k_mask[c.mask], k_group[c.group]);
}

/* ---- the cpu line ------------------------------------------------------------------- */

static char g_cpu_line[256];
static pthread_once_t g_cpu_once = PTHREAD_ONCE_INIT;

static void make_cpu_line(void) {
    char vendor[13];
    unsigned family, model;
    ai_cpu_ident(vendor, &family, &model);
    int at = snprintf(g_cpu_line, sizeof g_cpu_line, "cpu vendor=%s family=%u model=%u isa=",
                      vendor, family, model);
    const char *sep = "";
    for (const char *const *k = attn_kernel_list(); *k; k++) {
        if (!attn_kernel_supported(*k)) continue;
        at += snprintf(g_cpu_line + at, sizeof g_cpu_line - (size_t)at, "%s%s", sep, *k);
        sep = ",";
    }
    snprintf(g_cpu_line + at, sizeof g_cpu_line - (size_t)at, " version=%s", attn_version());
}

const char *ai_wisdom_cpu_line(void) {
    pthread_once(&g_cpu_once, make_cpu_line);
    return g_cpu_line;
}

/* ---- configurations ----------------------------------------------------------------- */

/* the kernel a configuration's tiles are checked against: its own, or the static choice */
static const attn_kernels *config_kernels(const attn_tune_config *cfg) {
    if (cfg->kernels) return cfg->kernels;
    const attn_kernels *k = ai_select_kernels(NULL);
    return k ? k : ai_kernels_named("generic");
}

bool ai_tune_config_valid(const attn_tune_config *cfg, int phase) {
    const attn_kernel_geom *g = &config_kernels(cfg)->geom;
    if (cfg->bq != 0 && (cfg->bq < 16 || cfg->bq > ATTN_FWD_BQ_LIMIT || cfg->bq % g->row_pad != 0))
        return false;
    if (cfg->bk != 0 && (cfg->bk < g->bk_min || cfg->bk > g->bk_max || cfg->bk % g->row_pad != 0))
        return false;
    if (cfg->split < 0 || cfg->split > ATTN_TUNE_SPLIT_MAX) return false;
    return cfg->split == 0 || phase == ATTN_PHASE_DECODE;
}

static void put_value(char *buf, size_t cap, int32_t v) {
    if (v == 0) snprintf(buf, cap, "static");
    else snprintf(buf, cap, "%d", (int)v);
}

void ai_wisdom_format(attn_tune_class c, const attn_tune_config *cfg, char *buf, size_t cap) {
    char name[64], bq[16], bk[16], split[16];
    ai_tune_class_name(c, name, sizeof name);
    put_value(bq, sizeof bq, cfg->bq);
    put_value(bk, sizeof bk, cfg->bk);
    put_value(split, sizeof split, cfg->split);
    snprintf(buf, cap, "%s = kernel=%s bq=%s bk=%s split=%s", name,
             cfg->kernels ? cfg->kernels->name : "static", bq, bk, split);
}

/* ---- parsing ------------------------------------------------------------------------ */

/* the index of word among names[n], -1 when absent */
static int find_name(const char *const *names, int n, const char *word) {
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], word) == 0) return i;
    return -1;
}

/* "key=static" or "key=N" (1 to 4 digits, no sign) into *v; false otherwise */
static bool parse_value(const char *word, const char *key, int32_t *v) {
    const size_t n = strlen(key);
    if (!word || strncmp(word, key, n) != 0 || word[n] != '=') return false;
    const char *s = word + n + 1;
    if (strcmp(s, "static") == 0) return *v = 0, true;
    const size_t digits = strspn(s, "0123456789");
    if (digits == 0 || digits > 4 || s[digits] != '\0') return false;
    *v = (int32_t)atoi(s);
    return *v > 0;
}

/* One class line (its words in place, NUL-separated by strtok_r): false with why. */
static bool parse_class_line(char *line, attn_wisdom *w, char *why, size_t cap) {
    char *save = NULL, *word[16];
    int n = 0;
    for (char *t = strtok_r(line, " \t", &save); t; t = strtok_r(NULL, " \t", &save)) {
        if (n == 16) break;
        word[n++] = t;
    }
    if (n != 10 || strcmp(word[5], "=") != 0) {
        snprintf(why, cap, "expected '<phase> <dtype> <dim> <mask> <group> = kernel=K bq=N "
                 "bk=N split=N'");
        return false;
    }
    attn_tune_class c = {find_name(k_phase, ATTN_PHASES, word[0]),
                         find_name(k_dtype, ATTN_TUNE_DTYPES, word[1]),
                         find_name(k_dim, ATTN_TUNE_DIMS, word[2]),
                         find_name(k_mask, ATTN_TUNE_MASKS, word[3]),
                         find_name(k_group, ATTN_TUNE_GROUPS, word[4])};
    if (c.phase < 0 || c.dtype < 0 || c.dim < 0 || c.mask < 0 || c.group < 0) {
        snprintf(why, cap, "no such class '%s %s %s %s %s'", word[0], word[1], word[2],
                 word[3], word[4]);
        return false;
    }
    attn_tune_config cfg = {0};
    if (strncmp(word[6], "kernel=", 7) != 0) {
        snprintf(why, cap, "expected kernel=NAME, found '%s'", word[6]);
        return false;
    }
    const char *kname = word[6] + 7;
    if (strcmp(kname, "static") != 0) {
        cfg.kernels = ai_kernels_named(kname);
        if (!cfg.kernels) {
            bool known = false;
            for (const char *const *k = attn_kernel_list(); *k; k++) known |= strcmp(*k, kname) == 0;
            snprintf(why, cap, "kernel %.32s: %s", kname,
                     known ? "this CPU cannot run it" : "not a kernel of this build");
            return false;
        }
    }
    if (!parse_value(word[7], "bq", &cfg.bq) || !parse_value(word[8], "bk", &cfg.bk) ||
        !parse_value(word[9], "split", &cfg.split)) {
        snprintf(why, cap, "expected bq=N bk=N split=N (a number or 'static'), found '%s %s %s'",
                 word[7], word[8], word[9]);
        return false;
    }
    if (!ai_tune_config_valid(&cfg, c.phase)) {
        snprintf(why, cap, "bq=%s bk=%s split=%s: outside the kernel's limits (or a split "
                 "outside decoding)", word[7] + 3, word[8] + 3, word[9] + 6);
        return false;
    }
    const int i = ai_tune_class_index(c);
    if (w->has[i]) {
        snprintf(why, cap, "a second line for the class");
        return false;
    }
    w->has[i] = true;
    w->cfg[i] = cfg;
    return true;
}

/* s without its trailing newline, carriage return, spaces and tabs */
static void trim_end(char *s) {
    size_t n = strlen(s);
    while (n > 0 && strchr("\r\n \t", s[n - 1])) s[--n] = '\0';
}

attn_status ai_wisdom_parse(const char *path, attn_wisdom *w, char *why, size_t cap) {
    memset(w, 0, sizeof *w);
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(why, cap, "cannot open it: %s", strerror(errno));
        return ATTN_ERR_IO;
    }
    char line[512], detail[256] = "";
    int lineno = 0, stage = 0;  // 0: header next, 1: cpu line next, 2: class lines
    bool ok = true;
    while (ok && fgets(line, sizeof line, f)) {
        lineno++;
        if (!strchr(line, '\n') && !feof(f)) {
            snprintf(detail, sizeof detail, "longer than %d bytes", (int)sizeof line - 2);
            ok = false;
            break;
        }
        trim_end(line);
        if (stage == 0) {
            ok = strcmp(line, "attn-wisdom 1") == 0;
            if (!ok) snprintf(detail, sizeof detail, "expected the header 'attn-wisdom 1'");
            stage = 1;
            continue;
        }
        if (line[0] == '#' || line[strspn(line, " \t")] == '\0') continue;
        if (stage == 1) {
            ok = strcmp(line, ai_wisdom_cpu_line()) == 0;
            if (!ok)
                snprintf(detail, sizeof detail, "made for '%.100s', this is '%.100s'", line,
                         ai_wisdom_cpu_line());
            stage = 2;
            continue;
        }
        ok = parse_class_line(line, w, detail, sizeof detail);
    }
    if (ok && ferror(f)) snprintf(detail, sizeof detail, "a read error"), ok = false;
    if (ok && stage < 2) {
        snprintf(detail, sizeof detail, "no %s line", stage == 0 ? "header" : "cpu");
        ok = false;
    }
    fclose(f);
    if (ok) return ATTN_OK;
    memset(w, 0, sizeof *w);  // never partly trusted
    if (lineno > 0 && stage > 0)
        snprintf(why, cap, "line %d: %s", lineno, detail);
    else
        snprintf(why, cap, "%s", detail);
    return ATTN_ERR_VALUE;
}

/* ---- the process's wisdom ----------------------------------------------------------- */

bool ai_wisdom_default_path(char *buf, size_t cap) {
    const char *env = getenv("ATTN_WISDOM"), *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    int n;
    if (env && *env) n = snprintf(buf, cap, "%s", env);
    else if (xdg && *xdg) n = snprintf(buf, cap, "%s/attn/wisdom", xdg);
    else if (home && *home) n = snprintf(buf, cap, "%s/.cache/attn/wisdom", home);
    else return false;
    return n > 0 && (size_t)n < cap;
}

static attn_wisdom g_wisdom;
static bool g_loaded, g_forced_isa;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static bool env_on(const char *name) {
    const char *s = getenv(name);
    return s && *s && strcmp(s, "0") != 0;
}

static void load(void) {
    const char *tune = getenv("ATTN_TUNE"), *isa = getenv("ATTN_ISA");
    g_forced_isa = isa && *isa;
    if (tune && strcmp(tune, "0") == 0) return;
    char path[4096], why[512];
    if (!ai_wisdom_default_path(path, sizeof path)) return;
    FILE *probe = fopen(path, "r");
    if (!probe && errno == ENOENT) return;  // no file: the static choices, silently
    if (probe) fclose(probe);
    if (ai_wisdom_parse(path, &g_wisdom, why, sizeof why) != ATTN_OK) {
        fprintf(stderr, "attn: wisdom %s ignored: %s\n", path, why);
        return;
    }
    g_loaded = true;
    if (env_on("ATTN_VERBOSE")) {
        int n = 0;
        for (int i = 0; i < ATTN_TUNE_CLASSES; i++) n += g_wisdom.has[i];
        fprintf(stderr, "attn: wisdom %s: %d classes%s\n", path, n,
                g_forced_isa ? " (not used: ATTN_ISA is set)" : "");
    }
}

const attn_wisdom *ai_wisdom_get(void) {
    pthread_once(&g_once, load);
    return g_loaded ? &g_wisdom : NULL;
}

attn_tune_config ai_wisdom_lookup(attn_tune_class c) {
    const attn_wisdom *w = ai_wisdom_get();
    const int i = ai_tune_class_index(c);
    if (!w || g_forced_isa || !w->has[i]) return (attn_tune_config){0};
    return w->cfg[i];
}

bool ai_wisdom_in_use(void) { return ai_wisdom_get() != NULL && !g_forced_isa; }

attn_status attn_tune_check(const char *path) {
    char buf[4096], why[512];
    if (!path) {
        if (!ai_wisdom_default_path(buf, sizeof buf))
            return ai_fail(ATTN_ERR_VALUE, "no wisdom path: none of ATTN_WISDOM, "
                           "XDG_CACHE_HOME, HOME is set");
        path = buf;
    }
    attn_wisdom *w = malloc(sizeof *w);
    if (!w) return ai_fail(ATTN_ERR_NOMEM, "attn_tune_check: out of memory");
    const attn_status st = ai_wisdom_parse(path, w, why, sizeof why);
    free(w);
    if (st != ATTN_OK) return ai_fail(st, "wisdom %s: %s", path, why);
    return ai_ok();
}
