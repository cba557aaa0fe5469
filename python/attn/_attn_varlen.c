/*
 * _attn_varlen.c — varlen_forward() and varlen_backward() of the CPython extension, the
 *                  calls behind attn.varlen_attention: packed (variable-length) batches in
 *                  FlashAttention's layout, q [total_q, Hq, D], k and v [total_k, Hkv, D],
 *                  read in place through their strides as the library's packed
 *                  {1, H, total, D} views, with cu_seqlens_q / cu_seqlens_k (int32 or int64,
 *                  B + 1 entries) and max_seqlen_q / max_seqlen_k; attn_varlen_forward and
 *                  attn_varlen_backward run with the GIL released.
 *
 * As forward(): the options are parse_options' (_attn_inputs.c), the output is described
 * without memory first (attn_varlen_forward_workspace_size checks every argument, the
 * cu_seqlens' values included) and then made by the caller's allocator. As backward(): a
 * gradient passed as None is written into a float32 (float64) scratch and dropped. What
 * it is not: the public function (python/attn/_varlen.py owns the names, the defaults and
 * the autograd Function).
 */
#include "_attn.h"

#include <stdlib.h>
#include <string.h>

static const arg_name g_varlen_forward_names[] = {
    {"q", "q"}, {"k", "k"}, {"v", "v"}, {"o", "out"}, {"lse", "the lse output"},
    {"sinks", "sinks"}, {"cu_seqlens_q", "cu_seqlens_q"}, {"cu_seqlens_k", "cu_seqlens_k"},
    {"max_seqlen_q", "max_seqlen_q"}, {"max_seqlen_k", "max_seqlen_k"}, {NULL, NULL},
};
static const arg_name g_varlen_backward_names[] = {
    {"q", "q"}, {"k", "k"}, {"v", "v"}, {"o", "out"}, {"d_o", "grad_out"}, {"lse", "lse"},
    {"dq", "grad_q"}, {"dk", "grad_k"}, {"dv", "grad_v"}, {"sinks", "sinks"},
    {"d_sinks", "grad_sinks"}, {"cu_seqlens_q", "cu_seqlens_q"},
    {"cu_seqlens_k", "cu_seqlens_k"}, {"max_seqlen_q", "max_seqlen_q"},
    {"max_seqlen_k", "max_seqlen_k"}, {NULL, NULL},
};

/* A packed [total, H, D] tensor as the library's {1, H, total, D} view. */
static attn_tensor packed_view(const imported *t) {
    return (attn_tensor){t->data, t->dtype, {1, t->shape[1], t->shape[0], t->shape[2]},
                         {0, t->stride[1], t->stride[0], t->stride[2]}};
}

/* An [H, total] LSE as the library's {1, H, total, 1} view. */
static attn_tensor packed_lse_view(const imported *t) {
    return (attn_tensor){t->data, t->dtype, {1, t->shape[0], t->shape[1], 1},
                         {0, t->stride[0], t->stride[1], 0}};
}

/* A vector (cu_seqlens, alibi_slopes, sinks) as {n, 1, 1, 1}. */
static attn_tensor vector_view(const imported *t) {
    return (attn_tensor){t->data, t->dtype, {t->shape[0], 1, 1, 1}, {t->stride[0], 0, 0, 0}};
}

static int import_packed(PyObject *obj, const char *arg, bool writable, imported *t,
                         const char *expect) {
    return import_tensor(obj, arg, writable, t) || check_rank(t, 3, 3, expect) ? -1 : 0;
}

static int import_vector(PyObject *obj, const char *arg, bool writable, imported *t,
                         const char *expect) {
    return import_tensor(obj, arg, writable, t) || check_rank(t, 1, 1, expect) ? -1 : 0;
}

enum { V_Q, V_K, V_V, V_CUQ, V_CUK, V_ALIBI, V_SINKS, V_N };

/* The inputs both calls share: q, k, v, the cu_seqlens and the vectors, imported into
 * t[] and viewed; the options (already parsed into *opt) pointed at the vectors. */
typedef struct varlen_inputs {
    imported t[V_N];
    attn_tensor q, k, v, cu_q, cu_k, alibi, sinks;
} varlen_inputs;

static void varlen_release(varlen_inputs *in) {
    for (int i = 0; i < V_N; i++) imported_release(&in->t[i]);
}

static int varlen_resolve(varlen_inputs *in, attn_options *opt, PyObject *oq, PyObject *ok,
                          PyObject *ov, PyObject *ocuq, PyObject *ocuk, PyObject *oalibi,
                          PyObject *osinks) {
    imported *t = in->t;
    if (import_packed(oq, "q", false, &t[V_Q], "3 (total_q, Hq, D)") ||
        import_packed(ok, "k", false, &t[V_K], "3 (total_k, Hkv, D)") ||
        import_packed(ov, "v", false, &t[V_V], "3 (total_k, Hkv, Dv)") ||
        import_vector(ocuq, "cu_seqlens_q", false, &t[V_CUQ], "1 (B + 1 offsets)") ||
        import_vector(ocuk, "cu_seqlens_k", false, &t[V_CUK], "1 (B + 1 offsets)"))
        return -1;
    in->q = packed_view(&t[V_Q]);
    in->k = packed_view(&t[V_K]);
    in->v = packed_view(&t[V_V]);
    in->cu_q = vector_view(&t[V_CUQ]);
    in->cu_k = vector_view(&t[V_CUK]);
    if (oalibi != Py_None) {
        if (import_vector(oalibi, "alibi_slopes", false, &t[V_ALIBI],
                          "1 (one slope per query head)"))
            return -1;
        in->alibi = vector_view(&t[V_ALIBI]);
        opt->alibi_slopes = &in->alibi;
    }
    if (osinks != Py_None) {
        if (import_vector(osinks, "sinks", false, &t[V_SINKS],
                          "1 (one sink logit per query head)"))
            return -1;
        in->sinks = vector_view(&t[V_SINKS]);
        opt->sinks = &in->sinks;
    }
    return 0;
}

const char py_varlen_forward_doc[] = PyDoc_STR(
"varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,\n"
"               is_causal, scale, align, window, softcap, alibi_slopes, return_lse, path,\n"
"               precision, threads, alloc, sinks=None, *, dropout_p=0.0, dropout_seed=0,\n"
"               dropout_offset=0)\n"
"--\n\n"
"Private: the call behind attn.varlen_attention (attn_varlen_forward). q (total_q, Hq, D),\n"
"k (total_k, Hkv, D), v (total_k, Hkv, Dv), any strides (Hq a multiple of Hkv: grouped-\n"
"query attention); cu_seqlens_q, cu_seqlens_k int32 or int64 (B + 1,); max_seqlen_q,\n"
"max_seqlen_k ints. align, path, precision: the attn_align / attn_path / attn_precision\n"
"integers; window None or (left, right); scale None or a float. alloc(shape, which,\n"
"dtype) returns a fresh writable tensor for which in ('output', 'lse'). Returns\n"
"(output (total_q, Hq, Dv), lse (Hq, total_q) or None). On error nothing is written.");

PyObject *py_varlen_forward(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                             "max_seqlen_k", "is_causal", "scale", "align", "window",
                             "softcap", "alibi_slopes", "return_lse", "path", "precision",
                             "threads", "alloc", "sinks", "dropout_p", "dropout_seed",
                             "dropout_offset", NULL};
    PyObject *oq, *ok, *ov, *ocuq, *ocuk, *oscale, *owindow, *oalibi, *alloc;
    PyObject *osinks = Py_None;
    long long max_q, max_k;
    int causal, align, want_lse, path, precision, threads;
    double softcap, dropout_p = 0.0;
    unsigned long long dropout_seed = 0, dropout_offset = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOLLpOiOdOpiiiO|O$dKK:varlen_forward",
                                     kwlist, &oq, &ok, &ov, &ocuq, &ocuk, &max_q, &max_k,
                                     &causal, &oscale, &align, &owindow, &softcap, &oalibi,
                                     &want_lse, &path, &precision, &threads, &alloc, &osinks,
                                     &dropout_p, &dropout_seed, &dropout_offset))
        return NULL;
    attn_options opt;
    if (parse_call_options(&opt, oscale, softcap, causal, align, owindow, path, precision,
                           threads, dropout_p, dropout_seed, dropout_offset) != 0)
        return NULL;

    varlen_inputs in;
    memset(&in, 0, sizeof in);
    enum { OUT, LSE, N_T };
    imported t[N_T];
    memset(t, 0, sizeof t);
    PyObject *outs[2] = {NULL, NULL};
    PyObject *result = NULL;
    if (varlen_resolve(&in, &opt, oq, ok, ov, ocuq, ocuk, oalibi, osinks) != 0) goto done;

    const int64_t H = in.q.shape[1], total_q = in.q.shape[2], Dv = in.v.shape[3];
    /* described without memory: the library checks everything before anything is made */
    attn_tensor o = attn_tensor_4d(NULL, in.q.dtype, 1, H, total_q, Dv);
    const attn_dtype lse_dt = in.q.dtype == ATTN_F64 ? ATTN_F64 : ATTN_F32;
    attn_tensor lse = attn_tensor_4d(NULL, lse_dt, 1, H, total_q, 1);
    if (want_lse) opt.lse = &lse;
    size_t ws_bytes = 0;
    attn_status st = attn_varlen_forward_workspace_size(&in.q, &in.k, &in.v, &o, &in.cu_q,
                                                        &in.cu_k, max_q, max_k, &opt,
                                                        &ws_bytes);
    if (st != ATTN_OK) {
        raise_status(st, g_varlen_forward_names, "attn_varlen_forward");
        goto done;
    }
    const int64_t o_dims[3] = {total_q, H, Dv}, lse_dims[2] = {H, total_q};
    outs[0] = alloc_output(alloc, o_dims, 3, "output", in.q.dtype, &t[OUT]);
    if (!outs[0]) goto done;
    o = packed_view(&t[OUT]);
    if (want_lse) {
        outs[1] = alloc_output(alloc, lse_dims, 2, "lse", lse_dt, &t[LSE]);
        if (!outs[1]) goto done;
        lse = packed_lse_view(&t[LSE]);
    }
    const bool kept = workspace_take(WORKSPACE_FORWARD, ws_bytes, &opt);
    Py_BEGIN_ALLOW_THREADS
    st = attn_varlen_forward(&in.q, &in.k, &in.v, &o, &in.cu_q, &in.cu_k, max_q, max_k, &opt);
    Py_END_ALLOW_THREADS
    if (kept) workspace_give(WORKSPACE_FORWARD, &opt);
    if (st != ATTN_OK) {
        raise_status(st, g_varlen_forward_names, "attn_varlen_forward");
        goto done;
    }
    result = Py_BuildValue("(OO)", outs[0], outs[1] ? outs[1] : Py_None);

done:
    varlen_release(&in);
    for (int i = 0; i < N_T; i++) imported_release(&t[i]);
    for (int i = 0; i < 2; i++) Py_XDECREF(outs[i]);
    return result;
}

/* One gradient: the caller's tensor (written in place, any strides, its own dtype), or a
 * dense scratch of the input's packed shape when the caller passed None. */
typedef struct varlen_grad {
    imported imp;
    attn_tensor view;
    void *temp;
} varlen_grad;

static int varlen_grad_setup(varlen_grad *g, PyObject *obj, const char *arg,
                             const imported *input, const char *input_name,
                             const attn_tensor *x) {
    if (obj != Py_None) {
        if (import_tensor(obj, arg, true, &g->imp) != 0 ||
            check_same_shape(&g->imp, input, arg, input_name) != 0)
            return -1;
        g->view = packed_view(&g->imp);
        return 0;
    }
    const attn_dtype dt = x->dtype == ATTN_F64 ? ATTN_F64 : ATTN_F32;
    const size_t esz = dt == ATTN_F64 ? sizeof(double) : sizeof(float);
    int64_t count = 1;
    for (int d = 0; d < 4; d++)
        if (__builtin_mul_overflow(count, x->shape[d], &count) ||
            count > (int64_t)(SIZE_MAX / esz)) {
            PyErr_Format(PyExc_ValueError, "%s: the scratch gradient's size overflows", arg);
            return -1;
        }
    g->temp = malloc((size_t)(count > 0 ? count : 1) * esz);
    if (!g->temp) {
        PyErr_NoMemory();
        return -1;
    }
    g->view = attn_tensor_4d(g->temp, dt, x->shape[0], x->shape[1], x->shape[2], x->shape[3]);
    return 0;
}

static void varlen_grad_release(varlen_grad *g) {
    imported_release(&g->imp);
    free(g->temp);
    g->temp = NULL;
}

const char py_varlen_backward_doc[] = PyDoc_STR(
"varlen_backward(q, k, v, out, grad_out, lse, grad_q, grad_k, grad_v, cu_seqlens_q,\n"
"                cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, scale, align,\n"
"                window, softcap, alibi_slopes, path, precision, threads, sinks=None,\n"
"                grad_sinks=None, *, dropout_p=0.0, dropout_seed=0, dropout_offset=0)\n"
"--\n\n"
"Private: the gradients of varlen_forward() (attn_varlen_backward). q ... threads are the\n"
"forward call's arguments; out (total_q, Hq, Dv) and lse (Hq, total_q) the forward's,\n"
"grad_out = dLoss/dout. grad_q, grad_k, grad_v: writable tensors of the shapes of q, k\n"
"and v (any strides, each in its own dtype; None = not wanted), written in place.\n"
"grad_sinks: None or a writable (Hq,) float32 tensor (the sum over the sequences).\n"
"The GIL is released. Returns None; on error nothing is written.");

PyObject *py_varlen_backward(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"q", "k", "v", "out", "grad_out", "lse", "grad_q", "grad_k",
                             "grad_v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                             "max_seqlen_k", "is_causal", "scale", "align", "window",
                             "softcap", "alibi_slopes", "path", "precision", "threads",
                             "sinks", "grad_sinks", "dropout_p", "dropout_seed",
                             "dropout_offset", NULL};
    PyObject *oq, *ok, *ov, *oo, *odo, *olse, *odq, *odk, *odv, *ocuq, *ocuk, *oscale,
        *owindow, *oalibi, *osinks = Py_None, *odsinks = Py_None;
    long long max_q, max_k;
    int causal, align, path, precision, threads;
    double softcap, dropout_p = 0.0;
    unsigned long long dropout_seed = 0, dropout_offset = 0;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs, "OOOOOOOOOOOLLpOiOdOiii|OO$dKK:varlen_backward", kwlist, &oq, &ok,
            &ov, &oo, &odo, &olse, &odq, &odk, &odv, &ocuq, &ocuk, &max_q, &max_k, &causal,
            &oscale, &align, &owindow, &softcap, &oalibi, &path, &precision, &threads, &osinks,
            &odsinks, &dropout_p, &dropout_seed, &dropout_offset))
        return NULL;
    attn_options opt;
    if (parse_call_options(&opt, oscale, softcap, causal, align, owindow, path, precision,
                           threads, dropout_p, dropout_seed, dropout_offset) != 0)
        return NULL;

    varlen_inputs in;
    memset(&in, 0, sizeof in);
    enum { OUT, DOUT, LSE, DSINKS, N_T };
    imported t[N_T];
    memset(t, 0, sizeof t);
    varlen_grad g[3];
    memset(g, 0, sizeof g);
    PyObject *result = NULL;
    if (varlen_resolve(&in, &opt, oq, ok, ov, ocuq, ocuk, oalibi, osinks) != 0) goto done;
    attn_tensor d_sinks;
    if (odsinks != Py_None) {
        if (import_vector(odsinks, "grad_sinks", true, &t[DSINKS],
                          "1 (one per query head)"))
            goto done;
        d_sinks = vector_view(&t[DSINKS]);
        opt.d_sinks = &d_sinks;
    }
    if (import_packed(oo, "out", false, &t[OUT], "3 (total_q, Hq, Dv)") ||
        import_packed(odo, "grad_out", false, &t[DOUT], "3 (total_q, Hq, Dv)") ||
        import_tensor(olse, "lse", false, &t[LSE]) ||
        check_rank(&t[LSE], 2, 2, "2 (Hq, total_q)"))
        goto done;
    const attn_tensor o = packed_view(&t[OUT]), d_o = packed_view(&t[DOUT]),
                      lse = packed_lse_view(&t[LSE]);
    if (varlen_grad_setup(&g[0], odq, "grad_q", &in.t[V_Q], "q", &in.q) ||
        varlen_grad_setup(&g[1], odk, "grad_k", &in.t[V_K], "k", &in.k) ||
        varlen_grad_setup(&g[2], odv, "grad_v", &in.t[V_V], "v", &in.v))
        goto done;

    attn_status st;
    size_t need = 0;
    const bool kept = attn_varlen_backward_workspace_size(&in.q, &in.k, &in.v, &o, &d_o, &lse,
                                                          &g[0].view, &g[1].view, &g[2].view,
                                                          &in.cu_q, &in.cu_k, max_q, max_k,
                                                          &opt, &need) == ATTN_OK &&
                      workspace_take(WORKSPACE_BACKWARD, need, &opt);
    Py_BEGIN_ALLOW_THREADS
    st = attn_varlen_backward(&in.q, &in.k, &in.v, &o, &d_o, &lse, &g[0].view, &g[1].view,
                              &g[2].view, &in.cu_q, &in.cu_k, max_q, max_k, &opt);
    Py_END_ALLOW_THREADS
    if (kept) workspace_give(WORKSPACE_BACKWARD, &opt);
    if (st != ATTN_OK) {
        raise_status(st, g_varlen_backward_names, "attn_varlen_backward");
        goto done;
    }
    Py_INCREF(Py_None);
    result = Py_None;

done:
    varlen_release(&in);
    for (int i = 0; i < N_T; i++) imported_release(&t[i]);
    for (int i = 0; i < 3; i++) varlen_grad_release(&g[i]);
    return result;
}
