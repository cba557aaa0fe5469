/*
 * _attn_inputs.c — what forward() and backward() of the CPython extension share: the
 *                  library's failing status raised as a Python exception that names the
 *                  argument (the status decides the type), PyTorch's
 *                  scaled_dot_product_attention arguments mapped onto attn_options, and
 *                  query, key, value and the masks imported and broadcast to the library's
 *                  [B, H, L, D] views (call_inputs, _attn.h).
 *
 * Shapes: a Python tensor of rank r <= 4 is the last r dimensions of the 4-D view
 * [B, H, L, D]; the missing leading ones are size 1 with stride 0. Broadcasting follows
 * PyTorch (right-aligned, a size-1 dimension gets stride 0). What it is not: the import
 * of one tensor (_attn_import.c) or the calls themselves (_attn_forward.c,
 * _attn_backward.c).
 */
#include "_attn.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "core/huge_pages.h"  // the library's advice for big blocks (src/core/huge_pages.h)

/* ================================================================================
 * Errors from the library: the status decides the exception type, the detail's leading
 * name (q, k, mask, options.scale, ...) is replaced by the Python argument's name.
 * ================================================================================ */

static const char *const g_status_names[] = {
#define X_NAME(name, msg) #name,
    ATTN_STATUS_LIST(X_NAME)
#undef X_NAME
};

const arg_name g_forward_names[] = {
    {"q", "query"}, {"k", "key"}, {"v", "value"}, {"o", "output"},
    {"lse", "the lse output"}, {"weights", "the weights output"}, {"sinks", "sinks"},
    {NULL, NULL},
};
const arg_name g_backward_names[] = {
    {"q", "query"}, {"k", "key"}, {"v", "value"}, {"o", "out"}, {"d_o", "grad_out"},
    {"lse", "lse"}, {"dq", "grad_query"}, {"dk", "grad_key"}, {"dv", "grad_value"},
    {"sinks", "sinks"}, {"d_sinks", "grad_sinks"}, {NULL, NULL},
};
static const arg_name g_option_names[] = {
    {"mask", "attn_mask"}, {"bias", "attn_mask"}, {"kv_len", "kv_len"},
    {"alibi_slopes", "alibi_slopes"},
    {"options.scale", "scale"}, {"options.softcap", "softcap"},
    {"options.window", "window"}, {"options.threads", "threads"},
    {"options.align", "align"}, {"options.path", "path"},
    {"options.precision", "precision"}, {"options.dropout_p", "dropout_p"},
    {"options.block_mask", "block_mask"}, {NULL, NULL},
};

/* The detail after its leading name, with the library's one-letter tensor names that it
 * mentions (q, k, v, o as whole words: "like k", "as q", "k's Hkv") spelled as the Python
 * arguments (o as out_name). Returns a malloc'd string, NULL when out of memory. */
static char *rename_tensors(const char *rest, const char *out_name) {
    const char *const full[] = {"query", "key", "value", out_name};
    static const char letters[] = "qkvo";
    size_t n = strlen(rest), grow = strlen(out_name) > 5 ? strlen(out_name) : 5;
    char *out = malloc(n * (grow + 1) + 1);  // each letter grows to at most grow + 1 characters
    if (!out) return NULL;
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        const char c = rest[i], prev = i ? rest[i - 1] : ' ', next = rest[i + 1];
        const char *hit = strchr(letters, c);
        const bool word_start = !(isalnum((unsigned char)prev) || prev == '_' || prev == '.');
        const bool word_end = !(isalnum((unsigned char)next) || next == '_' || next == '[');
        if (c && hit && word_start && word_end) {
            const char *name = full[hit - letters];
            memcpy(out + w, name, strlen(name));
            w += strlen(name);
        } else {
            out[w++] = c;
        }
    }
    out[w] = '\0';
    return out;
}

/* Raises the exception of a failed library call: names, the call's argument names
 * (g_forward_names or g_backward_names), call the library function's name (used when the
 * detail names no argument). */
PyObject *raise_status(attn_status st, const arg_name *names, const char *call) {
    const char *detail = attn_last_error();
    size_t n = strspn(detail, "abcdefghijklmnopqrstuvwxyz_.");
    const char *py = NULL, *out_name = "output";
    const arg_name *const tables[2] = {names, g_option_names};
    for (int t = 0; t < 2; t++)
        for (const arg_name *a = tables[t]; a->c; a++) {
            if (strlen(a->c) == n && strncmp(detail, a->c, n) == 0 && !py) py = a->py;
            if (strcmp(a->c, "o") == 0) out_name = a->py;
        }
    const char *rest = py ? detail + n : detail;
    const char *note = strstr(detail, "shape[") ? " [dimensions of the 4-D (B, H, L, D) view]" : "";

    PyObject *type;
    switch (st) {
    case ATTN_ERR_DTYPE: type = PyExc_TypeError; break;
    case ATTN_ERR_NOMEM: type = PyExc_MemoryError; break;
    case ATTN_ERR_UNSUPPORTED: type = PyExc_NotImplementedError; break;
    default: type = PyExc_ValueError; break;
    }
    char *body = rename_tensors(rest, out_name);
    if (!body) return PyErr_NoMemory();
    PyObject *msg = PyUnicode_FromFormat("%s%s%s%s (%s)", py ? py : call, py ? "" : ": ", body,
                                         note, attn_status_string(st));
    free(body);
    if (!msg) return NULL;
    PyObject *exc = PyObject_CallOneArg(type, msg);
    Py_DECREF(msg);
    if (!exc) return NULL;
    const char *sname = (unsigned)st < ATTN_STATUS_COUNT ? g_status_names[st] : "unknown";
    PyObject *s = PyUnicode_FromString(sname);
    if (s) {
        PyObject_SetAttrString(exc, "status", s);
        Py_DECREF(s);
    }
    PyErr_SetObject(type, exc);
    Py_DECREF(exc);
    return NULL;
}

/* ================================================================================
 * The inputs of a call, shared by forward and backward
 * ================================================================================ */

/* (_attn.h) */
int check_same_shape(const imported *g, const imported *input, const char *arg,
                     const char *input_name) {
    bool same = g->ndim == input->ndim;
    for (int d = 0; same && d < input->ndim; d++) same = g->shape[d] == input->shape[d];
    if (same) return 0;
    PyObject *got = shape_tuple(g->shape, g->ndim), *want = shape_tuple(input->shape, input->ndim);
    if (got && want)
        PyErr_Format(PyExc_ValueError, "%s: shape %R, expected %R (the shape of %s)", arg, got,
                     want, input_name);
    Py_XDECREF(got);
    Py_XDECREF(want);
    return -1;
}

const attn_block_mask *block_mask_of(PyObject *obj) {
    if (!PyCapsule_IsValid(obj, BLOCK_MASK_CAPSULE)) return NULL;
    return PyCapsule_GetPointer(obj, BLOCK_MASK_CAPSULE);
}

attn_tensor to_4d(const imported *t) {
    attn_tensor a = {t->data, t->dtype, {1, 1, 1, 1}, {0, 0, 0, 0}};
    for (int d = 0; d < t->ndim; d++) {
        a.shape[4 - t->ndim + d] = t->shape[d];
        a.stride[4 - t->ndim + d] = t->stride[d];
    }
    return a;
}

int check_rank(const imported *t, int lo, int hi, const char *expect) {
    if (t->ndim >= lo && t->ndim <= hi) return 0;
    PyErr_Format(PyExc_ValueError, "%s: rank %d, expected %s", t->arg, t->ndim, expect);
    return -1;
}

PyObject *shape_tuple(const int64_t *dims, int n) {
    PyObject *tup = PyTuple_New(n);
    if (!tup) return NULL;
    for (int i = 0; i < n; i++) {
        PyObject *x = PyLong_FromLongLong(dims[i]);
        if (!x) {
            Py_DECREF(tup);
            return NULL;
        }
        PyTuple_SET_ITEM(tup, i, x);
    }
    return tup;
}

/* Broadcasts one leading dimension (0 = batch, 1 = heads) of the tensors in ts to `full`:
 * size 1 becomes `full` with stride 0. */
static void broadcast_dim(attn_tensor *a, int d, int64_t full) {
    if (a->shape[d] == 1 && full != 1) {
        a->shape[d] = full;
        a->stride[d] = 0;
    }
}

/* attn_options from the Python arguments both calls share (without the tensors). */
int parse_options(attn_options *opt, PyObject *oscale, double softcap, int causal,
                  int align, PyObject *owindow, int path, int precision, int threads) {
    *opt = (attn_options){0};
    if (oscale != Py_None) {
        double s = PyFloat_AsDouble(oscale);
        if (s == -1.0 && PyErr_Occurred()) return -1;
        opt->has_scale = true;
        opt->scale = (float)s;
        opt->scale_f64 = s;  // read by float64 calls only: their scale is not rounded
    }
    opt->softcap = (float)softcap;
    opt->causal = causal;
    opt->align = (attn_align)align;
    if (owindow != Py_None) {
        long long l, r;
        if (!PyArg_ParseTuple(owindow, "LL", &l, &r)) return -1;
        opt->has_window = true;
        opt->window_left = l;
        opt->window_right = r;
    }
    opt->path = (attn_path)path;
    opt->precision = (attn_precision)precision;
    opt->threads = threads;
    return 0;
}

/* The dropout options (keyword-only, 0 = off): the library checks dropout_p's range. A
 * NaN or out-of-range double stays such as a float (the library refuses it). */
void parse_dropout(attn_options *opt, double p, unsigned long long seed,
                   unsigned long long offset) {
    opt->dropout_p = (float)p;
    opt->dropout_seed = seed;
    opt->dropout_offset = offset;
}

int parse_call_options(attn_options *opt, PyObject *oscale, double softcap, int causal,
                       int align, PyObject *owindow, int path, int precision, int threads,
                       double dropout_p, unsigned long long dropout_seed,
                       unsigned long long dropout_offset) {
    if (parse_options(opt, oscale, softcap, causal, align, owindow, path, precision, threads) != 0)
        return -1;
    parse_dropout(opt, dropout_p, dropout_seed, dropout_offset);
    return 0;
}

int call_options(call_inputs *c, PyObject *oscale, double softcap, int causal, int align,
                 PyObject *owindow, int path, int precision, int threads, double dropout_p,
                 unsigned long long dropout_seed, unsigned long long dropout_offset) {
    memset(c, 0, sizeof *c);
    return parse_call_options(&c->opt, oscale, softcap, causal, align, owindow, path, precision,
                              threads, dropout_p, dropout_seed, dropout_offset);
}

void inputs_release(call_inputs *c) {
    for (int i = 0; i < IN_N; i++) imported_release(&c->t[i]);
}

/* Imports and broadcasts the inputs into *c (c->opt already parsed). one_group: when key
 * and value both have one head and query several (without enable_gqa), read them as one
 * group of grouped-query attention instead of broadcasting them to every head: the same
 * logits, and the backward then sums dK and dV over the heads itself. */
int resolve_inputs(call_inputs *c, PyObject *oq, PyObject *ok, PyObject *ov,
                   PyObject *omask, PyObject *oalibi, PyObject *okvlen, int gqa,
                   bool one_group) {
    imported *t = c->t;
    if (import_tensor(oq, "query", false, &t[IN_Q]) || import_tensor(ok, "key", false, &t[IN_K]) ||
        import_tensor(ov, "value", false, &t[IN_V]))
        return -1;
    const char *qkv_rank = "2 (L, D), 3 (H, L, D) or 4 (B, H, L, D)";
    if (check_rank(&t[IN_Q], 2, 4, qkv_rank) || check_rank(&t[IN_K], 2, 4, qkv_rank) ||
        check_rank(&t[IN_V], 2, 4, qkv_rank))
        return -1;
    c->q = to_4d(&t[IN_Q]);
    c->k = to_4d(&t[IN_K]);
    c->v = to_4d(&t[IN_V]);
    attn_tensor *q = &c->q, *k = &c->k, *v = &c->v;

    /* Batch: PyTorch broadcasts the leading dimensions of query, key and value. */
    const attn_tensor *qkv[3] = {q, k, v};
    const char *qkv_names[3] = {"query", "key", "value"};
    int64_t B = 1;
    for (int i = 0; i < 3; i++)
        if (qkv[i]->shape[0] != 1) B = qkv[i]->shape[0];
    for (int i = 0; i < 3; i++)
        if (qkv[i]->shape[0] != 1 && qkv[i]->shape[0] != B) {
            PyErr_Format(PyExc_ValueError,
                         "%s: batch size %lld (dimension -4) does not broadcast with %lld "
                         "of the other inputs", qkv_names[i], (long long)qkv[i]->shape[0],
                         (long long)B);
            return -1;
        }
    broadcast_dim(q, 0, B);
    broadcast_dim(k, 0, B);
    broadcast_dim(v, 0, B);

    /* Heads: with enable_gqa, query head h reads key/value head h / (Hq / Hkv) (the
     * library's rule); without it, PyTorch broadcasts (equal, or 1). */
    int64_t Hkv = k->shape[1] != 1 ? k->shape[1] : v->shape[1];
    if ((k->shape[1] != 1 && k->shape[1] != Hkv) || (v->shape[1] != 1 && v->shape[1] != Hkv)) {
        PyErr_Format(PyExc_ValueError, "value: %lld heads (dimension -3) do not match key's "
                     "%lld", (long long)v->shape[1], (long long)k->shape[1]);
        return -1;
    }
    int64_t H = q->shape[1];
    if (gqa) {
        if (Hkv == 0 ? H != 0 : H % Hkv != 0) {
            PyErr_Format(PyExc_ValueError,
                         "query: %lld heads (dimension -3) are not a multiple of key/value's "
                         "%lld (enable_gqa=True needs Hq %% Hkv == 0)", (long long)H,
                         (long long)Hkv);
            return -1;
        }
    } else {
        if (H == 1) H = Hkv;
        if (Hkv != 1 && Hkv != H) {
            PyErr_Format(PyExc_ValueError,
                         "key: %lld heads (dimension -3) do not match query's %lld; pass "
                         "enable_gqa=True for grouped-query attention (PyTorch refuses this "
                         "too)", (long long)Hkv, (long long)q->shape[1]);
            return -1;
        }
        broadcast_dim(q, 1, H);
        if (!(one_group && Hkv == 1)) Hkv = H;
    }
    broadcast_dim(k, 1, Hkv);
    broadcast_dim(v, 1, Hkv);
    c->B = B;
    c->H = H;
    c->Hkv = Hkv;
    c->Lq = q->shape[2];
    c->Lk = k->shape[2];
    c->Dv = v->shape[3];
    c->out_rank = t[IN_Q].ndim;
    if (t[IN_K].ndim > c->out_rank) c->out_rank = t[IN_K].ndim;
    if (t[IN_V].ndim > c->out_rank) c->out_rank = t[IN_V].ndim;

    /* attn_mask: a block mask (attn.BlockMask's capsule) -> options.block_mask, which
     * the library checks against (B, H, Lq, Lk); bool -> mask, float -> bias, right-
     * aligned to (B, H, Lq, Lk). */
    const attn_block_mask *bm = omask != Py_None ? block_mask_of(omask) : NULL;
    if (bm) {
        c->opt.block_mask = bm;
    } else if (omask != Py_None) {
        if (import_tensor(omask, "attn_mask", false, &t[IN_MASK]) ||
            check_rank(&t[IN_MASK], 0, 4, "at most 4 (broadcast to B, H, L, S)"))
            return -1;
        if (t[IN_MASK].dtype == ATTN_I32 || t[IN_MASK].dtype == ATTN_I64) {
            PyErr_Format(PyExc_TypeError, "attn_mask: dtype %s, expected bool (True = attend) "
                         "or float32 (added to the logits)", attn_dtype_name(t[IN_MASK].dtype));
            return -1;
        }
        attn_tensor *mask = &c->mask;
        *mask = to_4d(&t[IN_MASK]);
        const int64_t full[4] = {B, H, c->Lq, c->Lk};
        for (int d = 0; d < 4; d++) {
            if (mask->shape[d] == 1) {
                mask->stride[d] = 0;
                continue;
            }
            if (mask->shape[d] != full[d]) {
                PyObject *ms = shape_tuple(t[IN_MASK].shape, t[IN_MASK].ndim);
                PyObject *fs = shape_tuple(full, 4);
                if (ms && fs)
                    PyErr_Format(PyExc_ValueError,
                                 "attn_mask: shape %R does not broadcast to the attention "
                                 "scores (B, H, L, S) = %R", ms, fs);
                Py_XDECREF(ms);
                Py_XDECREF(fs);
                return -1;
            }
        }
        if (mask->dtype == ATTN_BOOL)
            c->opt.mask = mask;
        else
            c->opt.bias = mask;
    }

    /* The per-batch key lengths [B] and the ALiBi slopes [H]: vectors on dimension 0. */
    if (okvlen != Py_None) {
        imported *kl = &t[IN_KVLEN];
        if (import_tensor(okvlen, "kv_len", false, kl) ||
            check_rank(kl, 1, 1, "1 (one key length per batch)"))
            return -1;
        c->kvlen = (attn_tensor){kl->data, kl->dtype, {kl->shape[0], 1, 1, 1},
                                 {kl->stride[0], 0, 0, 0}};
        if (kl->dtype != ATTN_I32 && kl->dtype != ATTN_I64) {
            PyErr_Format(PyExc_TypeError, "kv_len: dtype %s, expected int32 or int64",
                         attn_dtype_name(kl->dtype));
            return -1;
        }
        c->opt.kv_len = &c->kvlen;
    }
    if (oalibi != Py_None) {
        imported *al = &t[IN_ALIBI];
        if (import_tensor(oalibi, "alibi_slopes", false, al) ||
            check_rank(al, 1, 1, "1 (one slope per query head)"))
            return -1;
        c->alibi = (attn_tensor){al->data, al->dtype, {al->shape[0], 1, 1, 1},
                                 {al->stride[0], 0, 0, 0}};
        c->opt.alibi_slopes = &c->alibi;
    }
    return 0;
}

/* The attention sinks [H] (one logit per query head), or None: a vector on dimension 0,
 * as the slopes. After resolve_inputs. */
int set_sinks(call_inputs *c, PyObject *osinks) {
    if (osinks == Py_None) return 0;
    imported *sk = &c->t[IN_SINKS];
    if (import_tensor(osinks, "sinks", false, sk) ||
        check_rank(sk, 1, 1, "1 (one sink logit per query head)"))
        return -1;
    c->sinks = (attn_tensor){sk->data, sk->dtype, {sk->shape[0], 1, 1, 1},
                             {sk->stride[0], 0, 0, 0}};
    c->opt.sinks = &c->sinks;
    return 0;
}

/* (_attn.h): forward's output, backward's input */
attn_tensor lse_view(const imported *t) {
    attn_tensor l3 = to_4d(t); /* (.., Lq) -> (1, B, H, Lq): shift to (B, H, Lq, 1) */
    return (attn_tensor){l3.data, l3.dtype, {l3.shape[1], l3.shape[2], l3.shape[3], 1},
                         {l3.stride[1], l3.stride[2], l3.stride[3], 0}};
}

/* ================================================================================
 * The workspaces kept between calls (_attn.h). Each slot is taken and given back with
 * the GIL held, so one call at a time uses it; a second call meanwhile (another Python
 * thread, the GIL released during the first) finds it taken and lets the library
 * allocate. The memory stays until the process ends; WORKSPACE_KEEP_MAX bounds it.
 * ================================================================================ */

typedef struct workspace_slot {
    void *p;
    size_t n;
    bool busy;
} workspace_slot;

static workspace_slot g_workspace[2];

bool workspace_take(int slot, size_t need, attn_options *opt) {
    workspace_slot *s = &g_workspace[slot];
    if (s->busy || need == 0 || need > WORKSPACE_KEEP_MAX || opt->workspace) return false;
    if (s->n < need) {
        free(s->p);
        s->p = malloc(need);
        s->n = s->p ? need : 0;
        if (!s->p) return false;
        ai_huge_pages(s->p, need);  // as the library advises its own
    }
    s->busy = true;
    opt->workspace = s->p;
    opt->workspace_bytes = s->n;
    return true;
}

void workspace_give(int slot, attn_options *opt) {
    g_workspace[slot].busy = false;
    opt->workspace = NULL;
    opt->workspace_bytes = 0;
}
