/*
 * _mha.c — the multi-head module's part of the CPython extension attn._attn: one entry
 *          (_attn._mha) that reads NumPy-style buffers (float32, bool, int64; any
 *          strides) as attn_tensor views without a copy and runs attn_mha_forward or,
 *          with grad=True, attn_mha_backward, with the GIL released.
 *
 * What it is not: the public function (python/attn/mha.py owns the signature, the
 * PyTorch conventions of the masks, allocating the outputs) or a DLPack reader (the
 * callers pass NumPy arrays; PyTorch tensors reach it through .numpy() on the CPU).
 *
 * Shapes as the C call takes them: activations [B, L, C]; weights [in, out], or with
 * torch_layout=True PyTorch's [out, in] (read transposed through the strides); biases
 * [out]; mask [B|1, H|1, Lq|1, Lk] bool, true = attend; bias likewise float32; kv_len [B]
 * int64.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdbool.h>
#include <string.h>

#include "attn.h"

/* The module's scratch, kept between calls: the extension's one cached block (taken
 * and put back with the GIL held, so two threads never share it; a call that finds it
 * taken allocates its own). A fresh block of the layer's tens of megabytes costs the
 * kernel's page faults and zeroing on first touch (measured: a fifth of BERT-base's
 * forward, docs/BENCHMARKS.md); a kept one does not. Blocks over WS_KEEP_MAX are freed
 * after the call instead of kept. */
#define WS_KEEP_MAX ((size_t)1 << 30)
static void *g_ws;
static size_t g_ws_bytes;

/* A block of need bytes for one call (NULL when need is 0; *fail set when the
 * allocation failed) */
static void *ws_take(size_t need, size_t *got, int *fail) {
    *got = 0;
    *fail = 0;
    if (need == 0) return NULL;
    if (g_ws && g_ws_bytes >= need) {
        void *p = g_ws;
        *got = g_ws_bytes;
        g_ws = NULL;
        g_ws_bytes = 0;
        return p;
    }
    void *p = malloc(need);
    if (!p) { *fail = 1; return NULL; }
    *got = need;
    return p;
}

/* the block back: kept when it is the larger one and not too large, else freed */
static void ws_give(void *p, size_t bytes) {
    if (!p) return;
    if (bytes <= WS_KEEP_MAX && bytes > g_ws_bytes) {
        free(g_ws);
        g_ws = p;
        g_ws_bytes = bytes;
    } else {
        free(p);
    }
}

/* The buffers of one call, released together. */
#define MHA_MAX_BUFS 24
typedef struct bufs {
    Py_buffer view[MHA_MAX_BUFS];
    int n;
} bufs;

static void bufs_release(bufs *b) {
    for (int i = 0; i < b->n; i++) PyBuffer_Release(&b->view[i]);
    b->n = 0;
}

/* obj (None allowed unless required) as a tensor of dtype dt and rank ndim, its dims
 * placed at [0, ndim) and the rest 1; transpose swaps dims 0 and 1 (PyTorch's weights).
 * Returns 0 with *t set (NULL for None), -1 with an exception. */
static int get_tensor(bufs *b, PyObject *obj, const char *name, attn_dtype dt, int ndim,
                      bool writable, bool transpose, attn_tensor *storage,
                      const attn_tensor **t) {
    *t = NULL;
    if (obj == Py_None) return 0;
    if (b->n == MHA_MAX_BUFS) {
        PyErr_SetString(PyExc_RuntimeError, "_mha: too many buffers");
        return -1;
    }
    Py_buffer *v = &b->view[b->n];
    int flags = PyBUF_STRIDED_RO | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, v, flags) != 0) return -1;
    b->n++;
    const char *fmt = v->format ? v->format : "B";
    if (*fmt == '<' || *fmt == '=' || *fmt == '@') fmt++;
    const bool ok = dt == ATTN_F32 ? (strcmp(fmt, "f") == 0)
                  : dt == ATTN_BOOL ? (strcmp(fmt, "?") == 0)
                                    : (strcmp(fmt, "q") == 0 || strcmp(fmt, "l") == 0) &&
                                          v->itemsize == 8;
    if (!ok || v->ndim != ndim) {
        PyErr_Format(PyExc_TypeError, "%s: expected a %d-D %s array, got %d-D format '%s'",
                     name, ndim, dt == ATTN_F32 ? "float32" : dt == ATTN_BOOL ? "bool" : "int64",
                     v->ndim, fmt);
        return -1;
    }
    attn_tensor s = {v->buf, dt, {1, 1, 1, 1}, {0, 0, 0, 0}};
    for (int d = 0; d < ndim; d++) {
        s.shape[d] = v->shape[d];
        s.stride[d] = v->strides[d] / v->itemsize;
    }
    if (transpose) {
        int64_t x = s.shape[0]; s.shape[0] = s.shape[1]; s.shape[1] = x;
        x = s.stride[0]; s.stride[0] = s.stride[1]; s.stride[1] = x;
    }
    *storage = s;
    *t = storage;
    return 0;
}

static PyObject *raise_mha(attn_status st) {
    PyObject *type = st == ATTN_ERR_NOMEM ? PyExc_MemoryError
                   : st == ATTN_ERR_DTYPE ? PyExc_TypeError
                   : st == ATTN_ERR_UNSUPPORTED ? PyExc_NotImplementedError
                                                : PyExc_ValueError;
    PyErr_Format(type, "%s: %s", attn_status_string(st), attn_last_error());
    return NULL;
}

enum { T_XQ, T_XKV, T_WQ, T_WK, T_WV, T_WO, T_BQ, T_BK, T_BV, T_BO, T_Y, T_W, T_DY,
       T_DXQ, T_DXKV, T_DWQ, T_DWK, T_DWV, T_DWO, T_DBQ, T_DBK, T_DBV, T_DBO,
       T_MASK, T_BIAS, T_KVLEN, T_N };

PyObject *attn_py_mha(PyObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {
        "x_q", "x_kv", "w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o", "y",
        "weights", "dy", "dx_q", "dx_kv", "dw_q", "dw_k", "dw_v", "dw_o", "db_q", "db_k",
        "db_v", "db_o", "mask", "bias", "kv_len", "heads", "kv_heads", "torch_layout",
        "grad", "average", "causal", "bottom_right", "scale", "rope", "rotary_dim",
        "rope_base", "rope_offset", "threads", "keep", "saved", NULL};
    PyObject *o[T_N];
    for (int i = 0; i < T_N; i++) o[i] = Py_None;
    long long heads = 0, kv_heads = 0, rotary_dim = 0, rope_offset = 0;
    int torch_layout = 0, grad = 0, average = 0, causal = 0, bottom_right = 0, rope = 0,
        threads = 0;
    PyObject *scale = Py_None, *saved_obj = Py_None;
    double rope_base = 0;
    int keep = 0;
    if (!PyArg_ParseTupleAndKeywords(
            args, kw, "|OOOOOOOOOOOOOOOOOOOOOOOOOOLLpppppOiLdLipO", kwlist, &o[T_XQ], &o[T_XKV],
            &o[T_WQ], &o[T_WK], &o[T_WV], &o[T_WO], &o[T_BQ], &o[T_BK], &o[T_BV], &o[T_BO],
            &o[T_Y], &o[T_W], &o[T_DY], &o[T_DXQ], &o[T_DXKV], &o[T_DWQ], &o[T_DWK],
            &o[T_DWV], &o[T_DWO], &o[T_DBQ], &o[T_DBK], &o[T_DBV], &o[T_DBO], &o[T_MASK],
            &o[T_BIAS], &o[T_KVLEN], &heads, &kv_heads, &torch_layout, &grad, &average,
            &causal, &bottom_right, &scale, &rope, &rotary_dim, &rope_base, &rope_offset,
            &threads, &keep, &saved_obj))
        return NULL;
    bufs b = {.n = 0};
    attn_tensor st[T_N];
    const attn_tensor *t[T_N];
    for (int i = 0; i < T_N; i++) {
        const char *name = kwlist[i];  /* kwlist lists the tensors in T_ order */
        const bool weight = (i >= T_WQ && i <= T_WO) || (i >= T_DWQ && i <= T_DWO);
        const bool bias = (i >= T_BQ && i <= T_BO) || (i >= T_DBQ && i <= T_DBO) || i == T_KVLEN;
        const bool out = i == T_Y || i == T_W || (i >= T_DXQ && i <= T_DBO);
        const attn_dtype dt = i == T_MASK ? ATTN_BOOL : i == T_KVLEN ? ATTN_I64 : ATTN_F32;
        const int ndim = i == T_W || i == T_MASK || i == T_BIAS ? 4 : weight ? 2 : bias ? 1 : 3;
        if (get_tensor(&b, o[i], name, dt, ndim, out, weight && torch_layout, &st[i], &t[i])) {
            bufs_release(&b);
            return NULL;
        }
    }
    attn_options opt = {.mask = t[T_MASK], .bias = t[T_BIAS], .kv_len = t[T_KVLEN],
                        .causal = causal != 0, .threads = threads,
                        .align = bottom_right ? ATTN_ALIGN_BOTTOM_RIGHT : ATTN_ALIGN_TOP_LEFT};
    if (scale != Py_None) {
        opt.has_scale = true;
        opt.scale = (float)PyFloat_AsDouble(scale);
        if (PyErr_Occurred()) { bufs_release(&b); return NULL; }
    }
    const attn_mha m = {.Hq = heads, .Hkv = kv_heads,
                        .w_q = t[T_WQ], .w_k = t[T_WK], .w_v = t[T_WV], .w_o = t[T_WO],
                        .b_q = t[T_BQ], .b_k = t[T_BK], .b_v = t[T_BV], .b_o = t[T_BO],
                        .rope = {.kind = (attn_rope_kind)rope, .rotary_dim = rotary_dim,
                                 .base = rope_base, .offset = rope_offset}};
    const attn_mha_grads g = {.dx_q = t[T_DXQ], .dx_kv = t[T_DXKV], .dw_q = t[T_DWQ],
                              .dw_k = t[T_DWK], .dw_v = t[T_DWV], .dw_o = t[T_DWO],
                              .db_q = t[T_DBQ], .db_k = t[T_DBK], .db_v = t[T_DBV],
                              .db_o = t[T_DBO]};
    /* keep (forward): the activations kept for the backward, returned as a bytearray
     * (saved's, when one large enough is given, else a new one); saved (grad): such a
     * bytearray, read instead of recomputing */
    PyObject *kept = NULL;
    Py_buffer sv = {0};
    void *saved = NULL;
    size_t saved_bytes = 0, need = 0;
    attn_status status;
    if (keep && !grad) {
        status = attn_mha_saved_size(&m, t[T_XQ], t[T_XKV], &saved_bytes);
        if (status != ATTN_OK) { bufs_release(&b); return raise_mha(status); }
        /* saved given with keep: a bytearray of an earlier forward to write again when it
         * is large enough (its pages already faulted in), else a new one */
        if (saved_obj != Py_None && PyByteArray_Check(saved_obj) &&
            (size_t)PyByteArray_GET_SIZE(saved_obj) >= saved_bytes) {
            /* the export keeps its size fixed while the call runs without the GIL */
            if (PyObject_GetBuffer(saved_obj, &sv, PyBUF_WRITABLE) != 0) {
                bufs_release(&b);
                return NULL;
            }
            Py_INCREF(saved_obj);
            kept = saved_obj;
            saved = sv.buf;
            saved_bytes = (size_t)sv.len;
        } else {
            kept = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)saved_bytes);
            if (!kept) { bufs_release(&b); return NULL; }
            saved = PyByteArray_AS_STRING(kept);
        }
    } else if (grad && saved_obj != Py_None) {
        if (PyObject_GetBuffer(saved_obj, &sv, PyBUF_SIMPLE) != 0) {
            bufs_release(&b);
            return NULL;
        }
        saved = sv.buf;
        saved_bytes = (size_t)sv.len;
    }
    /* the call's whole scratch from the kept block */
    status = grad ? attn_mha_backward_workspace_size(&m, t[T_XQ], t[T_XKV], t[T_DY], &g, &opt,
                                                     saved, saved_bytes, &need)
           : saved ? attn_mha_forward_save_workspace_size(&m, t[T_XQ], t[T_XKV], t[T_Y], t[T_W],
                                                          average != 0, &opt, &need)
                   : attn_mha_forward_workspace_size(&m, t[T_XQ], t[T_XKV], t[T_Y], t[T_W],
                                                     average != 0, &opt, &need);
    size_t got = 0;
    int fail = 0;
    void *ws = status == ATTN_OK ? ws_take(need, &got, &fail) : NULL;
    if (fail) status = ATTN_ERR_NOMEM;  /* ws NULL: the call's own malloc says so */
    opt.workspace = ws;
    opt.workspace_bytes = got;
    if (status == ATTN_OK || status == ATTN_ERR_NOMEM) {
        Py_BEGIN_ALLOW_THREADS
        if (grad && saved)
            status = attn_mha_backward_saved(&m, t[T_XQ], t[T_XKV], t[T_DY], &g, &opt, saved,
                                             saved_bytes);
        else if (grad)
            status = attn_mha_backward(&m, t[T_XQ], t[T_XKV], t[T_DY], &g, &opt);
        else if (saved)
            status = attn_mha_forward_save(&m, t[T_XQ], t[T_XKV], t[T_Y], t[T_W], average != 0,
                                           &opt, saved, saved_bytes);
        else
            status = attn_mha_forward(&m, t[T_XQ], t[T_XKV], t[T_Y], t[T_W], average != 0, &opt);
        Py_END_ALLOW_THREADS
    }
    ws_give(ws, got);
    if (sv.obj) PyBuffer_Release(&sv);
    bufs_release(&b);
    if (status != ATTN_OK) {
        Py_XDECREF(kept);
        return raise_mha(status);
    }
    if (kept) return kept;
    Py_RETURN_NONE;
}
