/*
 * wisdom.h — the tuner's wisdom: per shape class of a call, the configuration the fused
 *            path takes instead of its static choice (the kernel, the tile sizes, the
 *            decoding split), read once from a file that `attn tune` (tune.c) wrote on
 *            this machine (wisdom.c). Internal; the public part is attn_tune (attn.h).
 *
 * What it is not: a timer (tune.c measures), nor anything that changes between calls of
 * a process: the wisdom is read once, and a configuration depends on the call's shape
 * class alone, never on its thread count, so a call gives the same bits on any number
 * of threads (docs/CONTRACT.md, "Wisdom").
 *
 * The file (docs/KERNELS.md, "Tuner"):
 *   attn-wisdom 1
 *   cpu vendor=AuthenticAMD family=23 model=49 isa=avx2,generic version=0.1.0
 *   prefill f32 d64 none g1 = kernel=avx2 bq=static bk=64 split=static
 *   # comments (the candidates' times), blank lines
 * A file whose cpu line is not this process's (ai_wisdom_cpu_line), or any line of
 * which does not parse or names what this CPU cannot run, is refused whole.
 */
#ifndef ATTN_WISDOM_H
#define ATTN_WISDOM_H

#include <stdio.h>

#include "kernels.h"

/* A call's shape class: the fields of a class line, each an index into its names
 * (wisdom.c: k_phase, k_dtype, k_dim, k_mask, k_group). */
typedef enum attn_tune_phase {
    ATTN_PHASE_PREFILL,   /* a forward with Lq > ATTN_DECODE_MAX_ROWS                    */
    ATTN_PHASE_DECODE,    /* a forward with Lq <= ATTN_DECODE_MAX_ROWS                   */
    ATTN_PHASE_BACKWARD,  /* the fused backward (16-bit calls run it on float32 copies)  */
    ATTN_PHASES
} attn_tune_phase;
enum {
    ATTN_TUNE_DTYPES = 6,  /* K/V: f32, bf16, f16, q8_0, fp8 (either), q4_0 (and u4)     */
    ATTN_TUNE_DIMS = 4,    /* Dk up to 32, 64, 128, more                                  */
    ATTN_TUNE_MASKS = 4,   /* none, causal (causal or window), keylen, mixed (the rest)   */
    ATTN_TUNE_GROUPS = 4,  /* Hq / Hkv: 1, 2, 3-4, 5 or more                              */
    ATTN_TUNE_CLASSES = ATTN_PHASES * ATTN_TUNE_DTYPES * ATTN_TUNE_DIMS * ATTN_TUNE_MASKS *
                        ATTN_TUNE_GROUPS,
};
typedef struct attn_tune_class {
    int phase, dtype, dim, mask, group;
} attn_tune_class;

/* attn_tune_config, the configuration of a class: attn_internal.h (the params hold one). */

/* The class of a call whose params ai_params_init has filled (backward: its forward
 * params); key_lengths: whether the call gave options.kv_len (p->kv_len is NULL in a
 * workspace query without data, whose class must be the call's). And the class's index
 * in [0, ATTN_TUNE_CLASSES). */
ATTN_PRIVATE attn_tune_class ai_tune_class_of(const attn_params *p, bool backward,
                                              bool key_lengths);
ATTN_PRIVATE int ai_tune_class_index(attn_tune_class c);

/* The class as its line names it ("prefill f32 d64 none g1"), into buf. */
ATTN_PRIVATE void ai_tune_class_name(attn_tune_class c, char *buf, size_t cap);

/* This process's cpu line (no newline): vendor, family, model, the kernels this CPU runs
 * and attn_version(), probed once. */
ATTN_PRIVATE const char *ai_wisdom_cpu_line(void);

/* A parsed wisdom: the configuration of each class it names. */
typedef struct attn_wisdom {
    bool has[ATTN_TUNE_CLASSES];
    attn_tune_config cfg[ATTN_TUNE_CLASSES];
} attn_wisdom;

/* Parses the file at path into *w (zeroed first). ATTN_OK; or ATTN_ERR_IO when it cannot
 * be opened, ATTN_ERR_VALUE when it is not a wisdom this process may trust (another CPU
 * or version, a line that does not parse, a kernel this CPU cannot run, a duplicate
 * class): then *w is all static and why (cap bytes) says which line and what. */
ATTN_PRIVATE attn_status ai_wisdom_parse(const char *path, attn_wisdom *w, char *why,
                                         size_t cap);

/* The file ai_wisdom_get reads: $ATTN_WISDOM, else $XDG_CACHE_HOME/attn/wisdom, else
 * $HOME/.cache/attn/wisdom (into buf); false when none can be named. */
ATTN_PRIVATE bool ai_wisdom_default_path(char *buf, size_t cap);

/* The process's wisdom, loaded once (pthread_once) from ai_wisdom_default_path unless
 * ATTN_TUNE=0; NULL when there is none (no file, refused, disabled). A refused file gives
 * one line on stderr, once. ATTN_TUNE=auto and no file there: the quick tune first
 * (attn_tune), written at that path, then read as any file, with one line on stderr
 * saying so (or one saying why not: then NULL); an existing file is never rewritten.
 * Any other value of ATTN_TUNE, or none, reads the file if there is one. */
ATTN_PRIVATE const attn_wisdom *ai_wisdom_get(void);

/* The configuration a call of class c takes from the process's wisdom: zero (static)
 * without one, without a line for c, or when ATTN_ISA forces the kernel. */
ATTN_PRIVATE attn_tune_config ai_wisdom_lookup(attn_tune_class c);

/* Whether this process's calls take configurations from a wisdom: one was loaded (at the
 * first call of this, or of any call) and ATTN_ISA does not force the kernel. `attn bench`
 * times its rows static and tuned side by side when it does. */
ATTN_PRIVATE bool ai_wisdom_in_use(void);

/* One class line of a configuration ("prefill f32 d64 none g1 = kernel=... split=..."),
 * without a newline, into buf. */
ATTN_PRIVATE void ai_wisdom_format(attn_tune_class c, const attn_tune_config *cfg,
                                   char *buf, size_t cap);

/* Whether cfg is one a call of phase `phase` may take (the bounds above). */
ATTN_PRIVATE bool ai_tune_config_valid(const attn_tune_config *cfg, int phase);

#endif /* ATTN_WISDOM_H */
