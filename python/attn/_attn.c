/*
 * _attn.c — the CPython extension behind the `attn` package: reads NumPy arrays (buffer
 *           protocol; ml_dtypes' bfloat16 through a uint16 view) and DLPack tensors
 *           (PyTorch, JAX, ...) of float32, float16 or bfloat16 as attn_tensor views
 *           without a copy, maps PyTorch's scaled_dot_product_attention arguments onto
 *           attn_options, runs attn_forward (and attn_backward, for autograd) with the
 *           GIL released, and turns a failing status into a Python exception that names
 *           the argument.
 *
 * This file is the module: its method table, its init (OPTIONS_SIZE) and the small
 * helpers for the package and its tests; the parts, one file each, are listed in _attn.h.
 * What it is not: the public function. python/attn/__init__.py owns the signature, the
 * defaults, the docstring, the string options and the kind of the result (it passes an
 * allocator); the extension owns everything that touches memory.
 */
#include "_attn.h"

/* ================================================================================
 * Small helpers for the package and its tests
 * ================================================================================ */

PyDoc_STRVAR(describe_doc,
"_describe(obj) -> dict\n--\n\n"
"Private, for the tests: what forward() would read from obj, through the same import\n"
"(buffer protocol, a torch.Tensor's attributes, or DLPack): {'data': address of element\n"
"[0, ..., 0], 'dtype', 'shape', 'strides' (in elements), 'via': 'buffer', 'dlpack' or\n"
"'torch'}. Nothing is copied.");

static PyObject *py_describe(PyObject *self, PyObject *obj) {
    imported t;
    if (import_tensor(obj, "obj", false, &t) != 0) return NULL;
    PyObject *shape = shape_tuple(t.shape, t.ndim), *strides = shape_tuple(t.stride, t.ndim);
    PyObject *r = NULL;
    if (shape && strides)
        r = Py_BuildValue("{s:K,s:s,s:O,s:O,s:s}", "data",
                          (unsigned long long)(uintptr_t)t.data, "dtype",
                          attn_dtype_name(t.dtype), "shape", shape, "strides", strides, "via",
                          t.via);
    Py_XDECREF(shape);
    Py_XDECREF(strides);
    imported_release(&t);
    return r;
}

PyDoc_STRVAR(dlpack_counts_doc,
"_dlpack_counts() -> (taken, released)\n--\n\n"
"Private, for the tests: DLPack capsules consumed so far and deleters called.");

static PyObject *py_dlpack_counts(PyObject *self, PyObject *unused) {
    return Py_BuildValue("(LL)", g_dlpack_taken, g_dlpack_released);
}

static PyObject *py_version(PyObject *self, PyObject *unused) {
    return PyUnicode_FromString(attn_version());
}

static PyObject *py_kernel_name(PyObject *self, PyObject *unused) {
    return PyUnicode_FromString(attn_kernel_name());
}

PyDoc_STRVAR(py_tune_doc,
"tune(*, quick=False, out=None, threads=0) -> None\n--\n\n"
"attn_tune: times this machine's choices of the fused path and writes them as a wisdom "
"file (out, or the default path) that later processes read (docs/KERNELS.md, 'Tuner').");

static PyObject *py_tune(PyObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"quick", "out", "threads", NULL};
    int quick = 0, threads = 0;
    const char *out = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$pzi:tune", names, &quick, &out, &threads))
        return NULL;
    const attn_tune_options opt = {.quick = quick != 0, .out = out, .threads = threads};
    attn_status st;
    Py_BEGIN_ALLOW_THREADS
    st = attn_tune(&opt);
    Py_END_ALLOW_THREADS
    if (st == ATTN_OK) Py_RETURN_NONE;
    PyErr_Format(st == ATTN_ERR_IO ? PyExc_OSError
                 : st == ATTN_ERR_UNSUPPORTED ? PyExc_RuntimeError : PyExc_ValueError,
                 "%s (%s)", attn_last_error(), attn_status_string(st));
    return NULL;
}

static PyMethodDef methods[] = {
    {"forward", (PyCFunction)(void (*)(void))py_forward, METH_VARARGS | METH_KEYWORDS,
     py_forward_doc},
    {"backward", (PyCFunction)(void (*)(void))py_backward, METH_VARARGS | METH_KEYWORDS,
     py_backward_doc},
    {"varlen_forward", (PyCFunction)(void (*)(void))py_varlen_forward,
     METH_VARARGS | METH_KEYWORDS, py_varlen_forward_doc},
    {"varlen_backward", (PyCFunction)(void (*)(void))py_varlen_backward,
     METH_VARARGS | METH_KEYWORDS, py_varlen_backward_doc},
    {"_describe", py_describe, METH_O, describe_doc},
    {"_block_mask", py_block_mask, METH_O, py_block_mask_doc},
    {"_block_mask_info", py_block_mask_info, METH_O, py_block_mask_info_doc},
    {"_mha", (PyCFunction)(void (*)(void))attn_py_mha, METH_VARARGS | METH_KEYWORDS,
     "_mha(**tensors_and_options) -> None\n--\n\nThe multi-head module (private; use "
     "attn.multi_head_attention)."},
    {"_dlpack_counts", py_dlpack_counts, METH_NOARGS, dlpack_counts_doc},
    {"version", py_version, METH_NOARGS, "version() -> str\n--\n\nThe C library's version."},
    {"tune", (PyCFunction)(void (*)(void))py_tune, METH_VARARGS | METH_KEYWORDS, py_tune_doc},
    {"kernel_name", py_kernel_name, METH_NOARGS,
     "kernel_name() -> str\n--\n\nThe kernel family a fused call runs ('generic' on the "
     "portable path)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "attn._attn",
    "The C extension of the attn package (private; use attn.scaled_dot_product_attention).",
    -1, methods, NULL, NULL, NULL, NULL,
};

/* OPTIONS_SIZE: sizeof(attn_options), for the ctypes mirror of the struct (_additive.py),
 * which a test holds to it so that a field added in attn.h cannot be read past its end.
 * ATTN_TUNE=auto: the quick tune at import when no wisdom file is there (attn_tune_auto;
 * its failure is one line on stderr, the calls keep the static choices). */
PyMODINIT_FUNC PyInit__attn(void) {
    (void)attn_tune_auto();
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "OPTIONS_SIZE", (long)sizeof(attn_options)) != 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
