/*
 * _attn_forward.c — forward() of the CPython extension, the call behind
 *                   attn.scaled_dot_product_attention: the arguments parsed and the inputs
 *                   resolved (_attn_inputs.c), the outputs first described without memory
 *                   so that the library checks every argument before anything is
 *                   allocated, then made by the caller's allocator and imported for
 *                   writing, and attn_forward run with the GIL released.
 *
 * What it is not: the public function (python/attn/__init__.py owns the signature, the
 * defaults, the string options and the kind of the result: it passes the allocator).
 */
#include "_attn.h"

#include <string.h>

/* Calls alloc(shape, which, dtype) and imports the result for writing; checks it is what
 * was asked for. The output may come back in another floating dtype than `want` (the
 * library rounds to whichever it is given): a bfloat16 query whose framework the
 * allocator cannot make bfloat16 arrays for gets float32. */
PyObject *alloc_output(PyObject *alloc, const int64_t *dims, int n, const char *which,
                       attn_dtype want, imported *t) {
    PyObject *shape = shape_tuple(dims, n);
    if (!shape) return NULL;
    PyObject *obj = PyObject_CallFunction(alloc, "Oss", shape, which, attn_dtype_name(want));
    Py_DECREF(shape);
    if (!obj) return NULL;
    if (import_tensor(obj, which, true, t) != 0) {
        Py_DECREF(obj);
        return NULL;
    }
    const bool floating = t->dtype == ATTN_F32 || t->dtype == ATTN_F16 ||
                          t->dtype == ATTN_BF16 || t->dtype == ATTN_F64;
    bool same = t->ndim == n && (t->dtype == want || (strcmp(which, "output") == 0 && floating));
    for (int d = 0; same && d < n; d++) same = t->shape[d] == dims[d];
    if (!same) {
        imported_release(t);
        Py_DECREF(obj);
        PyErr_Format(PyExc_RuntimeError, "internal: the %s allocator returned the wrong "
                     "shape or dtype", which);
        return NULL;
    }
    return obj;
}

const char py_forward_doc[] = PyDoc_STR(
"forward(query, key, value, attn_mask, is_causal, scale, enable_gqa, align, window,\n"
"        softcap, alibi_slopes, kv_len, return_lse, return_weights, path, precision,\n"
"        threads, alloc, sinks=None, *, dropout_p=0.0, dropout_seed=0, dropout_offset=0)\n"
"--\n\n"
"Private: the call behind attn.scaled_dot_product_attention. align, path and precision\n"
"are the attn_align / attn_path / attn_precision integers, window is None or (left,\n"
"right), scale None or a float, alloc(shape, which, dtype) returns a fresh writable\n"
"tensor for which in ('output', 'lse', 'weights') and dtype in ('float32', 'float16',\n"
"'bfloat16') (the output may be float32 instead of a 16-bit dtype it cannot make).\n"
"sinks: None or the attention sinks, (H,) float32, one logit per query head.\n"
"Returns (output, lse or None, weights or None).");

PyObject *py_forward(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"query", "key", "value", "attn_mask", "is_causal", "scale",
                             "enable_gqa", "align", "window", "softcap", "alibi_slopes",
                             "kv_len", "return_lse", "return_weights", "path", "precision",
                             "threads", "alloc", "sinks", "dropout_p", "dropout_seed",
                             "dropout_offset", NULL};
    PyObject *oq, *ok, *ov, *omask, *oscale, *owindow, *oalibi, *okvlen, *alloc;
    PyObject *osinks = Py_None;
    int causal, gqa, align, want_lse, want_w, path, precision, threads;
    double softcap, dropout_p = 0.0;
    unsigned long long dropout_seed = 0, dropout_offset = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOpOpiOdOOppiiiO|O$dKK:forward", kwlist,
                                     &oq, &ok, &ov, &omask, &causal, &oscale, &gqa, &align,
                                     &owindow, &softcap, &oalibi, &okvlen, &want_lse, &want_w,
                                     &path, &precision, &threads, &alloc, &osinks, &dropout_p,
                                     &dropout_seed, &dropout_offset))
        return NULL;

    call_inputs c;
    if (call_options(&c, oscale, softcap, causal, align, owindow, path, precision, threads,
                     dropout_p, dropout_seed, dropout_offset) != 0)
        return NULL;

    enum { OUT, LSE, WEIGHTS, N_T };
    imported t[N_T];
    memset(t, 0, sizeof t);
    PyObject *outs[3] = {NULL, NULL, NULL};
    PyObject *result = NULL;

    if (resolve_inputs(&c, oq, ok, ov, omask, oalibi, okvlen, gqa, false) != 0 ||
        set_sinks(&c, osinks) != 0)
        goto done;
    const int64_t B = c.B, H = c.H, Lq = c.Lq, Lk = c.Lk, Dv = c.Dv;
    const int out_rank = c.out_rank;

    /* Outputs: first described without memory, so that the library checks every argument
     * before anything is allocated; then allocated by the caller and imported. */
    attn_tensor o = attn_tensor_4d(NULL, c.q.dtype, B, H, Lq, Dv);
    /* a float64 call's LSE is float64 (the backward of a float64 model reads it) */
    const attn_dtype lse_dt = c.q.dtype == ATTN_F64 ? ATTN_F64 : ATTN_F32;
    attn_tensor lse = attn_tensor_4d(NULL, lse_dt, B, H, Lq, 1);
    attn_tensor w = attn_tensor_4d(NULL, ATTN_F32, B, H, Lq, Lk);
    if (want_lse) c.opt.lse = &lse;
    if (want_w) c.opt.weights = &w;
    size_t ws_bytes = 0;
    attn_status st = attn_forward_workspace_size(&c.q, &c.k, &c.v, &o, &c.opt, &ws_bytes);
    if (st != ATTN_OK) {
        raise_status(st, g_forward_names, "attn_forward");
        goto done;
    }

    const int64_t full_o[4] = {B, H, Lq, Dv}, full_w[4] = {B, H, Lq, Lk};
    const int64_t *o_dims = full_o + (4 - out_rank);
    outs[0] = alloc_output(alloc, o_dims, out_rank, "output", c.q.dtype, &t[OUT]);
    if (!outs[0]) goto done;
    o = to_4d(&t[OUT]);
    if (want_lse) {
        outs[1] = alloc_output(alloc, o_dims, out_rank - 1, "lse", lse_dt, &t[LSE]);
        if (!outs[1]) goto done;
        lse = lse_view(&t[LSE]);
    }
    if (want_w) {
        outs[2] = alloc_output(alloc, full_w + (4 - out_rank), out_rank, "weights", ATTN_F32,
                               &t[WEIGHTS]);
        if (!outs[2]) goto done;
        w = to_4d(&t[WEIGHTS]);
    }

    const bool kept = workspace_take(WORKSPACE_FORWARD, ws_bytes, &c.opt);
    Py_BEGIN_ALLOW_THREADS
    st = attn_forward(&c.q, &c.k, &c.v, &o, &c.opt);
    Py_END_ALLOW_THREADS
    if (kept) workspace_give(WORKSPACE_FORWARD, &c.opt);
    if (st != ATTN_OK) {
        raise_status(st, g_forward_names, "attn_forward");
        goto done;
    }
    result = Py_BuildValue("(OOO)", outs[0], outs[1] ? outs[1] : Py_None,
                           outs[2] ? outs[2] : Py_None);

done:
    inputs_release(&c);
    for (int i = 0; i < N_T; i++) imported_release(&t[i]);
    for (int i = 0; i < 3; i++) Py_XDECREF(outs[i]);
    return result;
}
