/*
 * _attn.c — the CPython extension behind the `attn` package: reads NumPy arrays (buffer
 *           protocol; ml_dtypes' bfloat16 through a uint16 view) and DLPack tensors
 *           (PyTorch, JAX, ...) of float32, float16 or bfloat16 as attn_tensor views
 *           without a copy, maps PyTorch's scaled_dot_product_attention arguments onto
 *           attn_options, runs attn_forward (and attn_backward, for autograd) with the
 *           GIL released, and turns a failing status into a Python exception that names
 *           the argument.
 *
 * What it is not: the public function. python/attn/__init__.py owns the signature, the
 * defaults, the docstring, the string options and the kind of the result (it passes an
 * allocator); this file owns everything that touches memory.
 *
 * Shapes: a Python tensor of rank r <= 4 is the last r dimensions of the 4-D view
 * [B, H, L, D]; the missing leading ones are size 1 with stride 0. Broadcasting follows
 * PyTorch (right-aligned, a size-1 dimension gets stride 0). Strides are converted from
 * bytes (buffer protocol) to elements; DLPack strides are in elements already.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <ctype.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "half.h"  // the library's float32 -> float16/bfloat16 rounding (src/half.h)

/* ================================================================================
 * DLPack, the parts a consumer needs, written from the public specification
 * (dmlc.github.io/dlpack, the C API of the legacy "dltensor" capsule). Field order and
 * types are the ABI: an enum is an int on every platform this builds on.
 * ================================================================================ */

enum {
    DL_CPU = 1, DL_CUDA = 2, DL_CUDA_HOST = 3, DL_OPENCL = 4, DL_VULKAN = 7, DL_METAL = 8,
    DL_VPI = 9, DL_ROCM = 10, DL_ROCM_HOST = 11, DL_EXT_DEV = 12, DL_CUDA_MANAGED = 13,
    DL_ONEAPI = 14, DL_WEBGPU = 15, DL_HEXAGON = 16, DL_MAIA = 17,
};
enum { DL_INT = 0, DL_UINT = 1, DL_FLOAT = 2, DL_OPAQUE = 3, DL_BFLOAT = 4, DL_COMPLEX = 5,
       DL_BOOL = 6 };

typedef struct dl_device {
    int32_t device_type; /* DLDeviceType */
    int32_t device_id;
} dl_device;

typedef struct dl_dtype {
    uint8_t code; /* DLDataTypeCode */
    uint8_t bits;
    uint16_t lanes;
} dl_dtype;

typedef struct dl_tensor {
    void *data;
    dl_device device;
    int32_t ndim;
    dl_dtype dtype;
    int64_t *shape;
    int64_t *strides; /* in elements; NULL = compact row-major */
    uint64_t byte_offset;
} dl_tensor;

typedef struct dl_managed_tensor {
    dl_tensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct dl_managed_tensor *self);
} dl_managed_tensor;

static const char *dl_device_name(int32_t t) {
    switch (t) {
    case DL_CPU: return "CPU";
    case DL_CUDA: return "CUDA";
    case DL_CUDA_HOST: return "CUDA host (pinned)";
    case DL_OPENCL: return "OpenCL";
    case DL_VULKAN: return "Vulkan";
    case DL_METAL: return "Metal";
    case DL_VPI: return "VPI";
    case DL_ROCM: return "ROCm";
    case DL_ROCM_HOST: return "ROCm host";
    case DL_EXT_DEV: return "extension device";
    case DL_CUDA_MANAGED: return "CUDA managed";
    case DL_ONEAPI: return "oneAPI";
    case DL_WEBGPU: return "WebGPU";
    case DL_HEXAGON: return "Hexagon";
    case DL_MAIA: return "MAIA";
    default: return "unknown device";
    }
}

/* Counters for the tests: capsules taken and deleters called (they must match). */
static long long g_dlpack_taken, g_dlpack_released;

/* ================================================================================
 * One imported tensor: a read (or write) view of someone else's memory.
 * ================================================================================ */

enum { MAX_DIMS = 8 };

typedef struct imported {
    const char *arg;            /* the Python argument's name, used in every message   */
    const char *via;            /* "buffer" or "dlpack"                                */
    Py_buffer view;             /* buffer protocol: released by imported_release        */
    bool has_view;
    PyObject *capsule;          /* DLPack: the capsule, renamed "used_dltensor"         */
    dl_managed_tensor *managed; /* DLPack: ours to delete once the call is done         */
    void *data;                 /* element [0, ..., 0]                                  */
    attn_dtype dtype;
    int ndim;
    int64_t shape[MAX_DIMS];
    int64_t stride[MAX_DIMS];   /* in elements                                          */
} imported;

/* Gives back what an import took. May run the producer's Python code (a deleter that
 * drops the last reference to an array, a buffer's release hook), so an exception being
 * raised is set aside meanwhile and restored after. */
static void imported_release(imported *t) {
    if (!t->has_view && !t->managed && !t->capsule) return;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (t->has_view) PyBuffer_Release(&t->view);
    t->has_view = false;
    if (t->managed) {
        /* The capsule was renamed "used_dltensor", so its destructor will not delete the
         * tensor: the consumer (us) must, exactly once. */
        if (t->managed->deleter) t->managed->deleter(t->managed);
        g_dlpack_released++;
        t->managed = NULL;
    }
    Py_CLEAR(t->capsule);
    PyErr_Restore(type, value, tb);
}

static void unsupported_dtype(const imported *t, const char *what) {
    PyErr_Format(PyExc_TypeError,
                 "%s: dtype %s is not supported (attn reads float32, float16, bfloat16 or "
                 "float64 query, key and value, bool or float attention masks and int32/int64 key "
                 "lengths)",
                 t->arg, what);
}

/* The buffer protocol's struct-module format for one element, e.g. "f", "<f", "?".
 * raw_bf16: the buffer is a uint16 view of a bfloat16 array (see import_tensor), so 'H'
 * means bfloat16. */
static int buffer_dtype(imported *t, const char *fmt, Py_ssize_t itemsize, bool raw_bf16) {
    static const uint16_t probe = 1;
    bool little = *(const uint8_t *)&probe == 1;
    if (!fmt) fmt = "B";
    char order = '@';
    if (*fmt == '@' || *fmt == '=' || *fmt == '<' || *fmt == '>' || *fmt == '!') order = *fmt++;
    bool swapped = (order == '<' && !little) || ((order == '>' || order == '!') && little);
    char name[48];
    if (strlen(fmt) != 1) {
        snprintf(name, sizeof name, "with buffer format '%.20s'", fmt);
        unsupported_dtype(t, name);
        return -1;
    }
    char c = fmt[0];
    const char *known = NULL;
    switch (c) {
    case 'f': t->dtype = ATTN_F32; known = itemsize == 4 ? "" : NULL; break;
    case 'd': t->dtype = ATTN_F64; known = itemsize == 8 ? "" : NULL; break;
    case 'e': t->dtype = ATTN_F16; known = itemsize == 2 ? "" : NULL; break;
    case 'H':
        if (raw_bf16 && itemsize == 2) { t->dtype = ATTN_BF16; known = ""; }
        break;
    case '?': t->dtype = ATTN_BOOL; known = itemsize == 1 ? "" : NULL; break;
    case 'i': case 'l': case 'q': case 'n':
        if (itemsize == 4) { t->dtype = ATTN_I32; known = ""; }
        if (itemsize == 8) { t->dtype = ATTN_I64; known = ""; }
        break;
    default: break;
    }
    if (!known) {
        const char *what;
        switch (c) {
        case 'd': what = "float64"; break;
        case 'g': what = "longdouble"; break;
        case 'b': what = "int8"; break;
        case 'B': what = "uint8"; break;
        case 'h': what = "int16"; break;
        case 'H': what = "uint16"; break;
        case 'I': case 'L': case 'Q': case 'N': what = itemsize == 4 ? "uint32" : "uint64"; break;
        case 'i': case 'l': case 'q': case 'n': what = "an integer of this size"; break;
        default:
            snprintf(name, sizeof name, "with buffer format '%c' (%zd bytes)", c, itemsize);
            what = name;
        }
        unsupported_dtype(t, what);
        return -1;
    }
    if (swapped && itemsize > 1) {
        PyErr_Format(PyExc_TypeError,
                     "%s: the array is in non-native byte order; convert it first "
                     "(e.g. a.astype(a.dtype.newbyteorder('=')))", t->arg);
        return -1;
    }
    return 0;
}

static int import_buffer(PyObject *obj, imported *t, bool writable, bool raw_bf16) {
    if (PyObject_GetBuffer(obj, &t->view, writable ? PyBUF_RECORDS : PyBUF_RECORDS_RO) != 0)
        return -1;
    t->has_view = true;
    t->via = "buffer";
    Py_buffer *v = &t->view;
    if (v->ndim > MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "%s: rank %d, expected at most 4", t->arg, v->ndim);
        return -1;
    }
    if (v->suboffsets) {
        PyErr_Format(PyExc_ValueError, "%s: an indirect (suboffset) buffer cannot be read",
                     t->arg);
        return -1;
    }
    if (buffer_dtype(t, v->format, v->itemsize, raw_bf16) != 0) return -1;
    t->ndim = v->ndim;
    t->data = v->buf;
    for (int d = 0; d < v->ndim; d++) {
        Py_ssize_t s = v->strides ? v->strides[d] : 0;
        t->shape[d] = v->shape ? v->shape[d] : 1;
        if (!v->strides) { /* C-contiguous: recompute */
            s = v->itemsize;
            for (int e = d + 1; e < v->ndim; e++) s *= v->shape[e];
        }
        if (s % v->itemsize != 0) {
            PyErr_Format(PyExc_ValueError,
                         "%s: stride %zd bytes on dimension %d is not a multiple of the "
                         "element size (%zd bytes); attn reads whole elements, so copy it "
                         "first (e.g. numpy.ascontiguousarray)",
                         t->arg, s, d, v->itemsize);
            return -1;
        }
        t->stride[d] = s / v->itemsize;
    }
    if (t->data && (uintptr_t)t->data % (uintptr_t)v->itemsize != 0) {
        PyErr_Format(PyExc_ValueError,
                     "%s: data at %p is not aligned to its %zd-byte elements; copy it first "
                     "(e.g. numpy.ascontiguousarray)",
                     t->arg, t->data, v->itemsize);
        return -1;
    }
    return 0;
}

static int check_dl_device(imported *t, int32_t type, int32_t id) {
    if (type == DL_CPU) return 0;
    PyErr_Format(PyExc_ValueError,
                 "%s: the tensor is on %s device %d (DLPack device type %d); attn computes "
                 "on the CPU, so move it there first (e.g. tensor.cpu())",
                 t->arg, dl_device_name(type), (int)id, (int)type);
    return -1;
}

/* Re-raises the pending exception of a producer's __dlpack__ / __dlpack_device__ as a
 * TypeError that names the argument (and keeps the producer's words). */
static int dlpack_failed(PyObject *obj, imported *t, const char *method) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *dtype = PyObject_GetAttrString(obj, "dtype");
    if (!dtype) PyErr_Clear();
    PyObject *why = value ? value : Py_None;
    if (dtype)
        PyErr_Format(PyExc_TypeError, "%s: %s() of a %s of dtype %S failed: %S", t->arg,
                     method, Py_TYPE(obj)->tp_name, dtype, why);
    else
        PyErr_Format(PyExc_TypeError, "%s: %s() of a %s failed: %S", t->arg, method,
                     Py_TYPE(obj)->tp_name, why);
    Py_XDECREF(dtype);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return -1;
}

static int import_dlpack(PyObject *obj, imported *t) {
    t->via = "dlpack";
    /* Ask for the device first, so that a GPU tensor is refused before it is exported. */
    if (PyObject_HasAttrString(obj, "__dlpack_device__")) {
        PyObject *dev = PyObject_CallMethod(obj, "__dlpack_device__", NULL);
        if (!dev) return dlpack_failed(obj, t, "__dlpack_device__");
        int type = 0, id = 0;
        int ok = PyTuple_Check(dev) && PyArg_ParseTuple(dev, "ii", &type, &id);
        Py_DECREF(dev);
        if (!ok) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_TypeError, "%s: __dlpack_device__() did not return a "
                             "(device_type, device_id) tuple", t->arg);
            return -1;
        }
        if (check_dl_device(t, type, id) != 0) return -1;
    }
    PyObject *cap = PyObject_CallMethod(obj, "__dlpack__", NULL);
    if (!cap) return dlpack_failed(obj, t, "__dlpack__");
    if (!PyCapsule_IsValid(cap, "dltensor")) {
        Py_DECREF(cap);
        PyErr_Format(PyExc_TypeError, "%s: __dlpack__() did not return an unused "
                     "\"dltensor\" capsule", t->arg);
        return -1;
    }
    dl_managed_tensor *m = PyCapsule_GetPointer(cap, "dltensor");
    if (!m) {
        Py_DECREF(cap);
        return -1;
    }
    /* From here on the tensor is ours: rename the capsule so its destructor leaves it
     * alone, keep the capsule alive until the call is done, then call the deleter. */
    if (PyCapsule_SetName(cap, "used_dltensor") != 0) {
        Py_DECREF(cap);
        return -1;
    }
    t->capsule = cap;
    t->managed = m;
    g_dlpack_taken++;

    const dl_tensor *dl = &m->dl_tensor;
    if (check_dl_device(t, dl->device.device_type, dl->device.device_id) != 0) return -1;
    if (dl->ndim < 0 || dl->ndim > MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "%s: rank %d, expected at most 4", t->arg,
                     (int)dl->ndim);
        return -1;
    }
    dl_dtype dt = dl->dtype;
    bool known = dt.lanes == 1;
    if (known) {
        if (dt.code == DL_FLOAT && dt.bits == 32) t->dtype = ATTN_F32;
        else if (dt.code == DL_FLOAT && dt.bits == 64) t->dtype = ATTN_F64;
        else if (dt.code == DL_FLOAT && dt.bits == 16) t->dtype = ATTN_F16;
        else if (dt.code == DL_BFLOAT && dt.bits == 16) t->dtype = ATTN_BF16;
        else if (dt.code == DL_BOOL && dt.bits == 8) t->dtype = ATTN_BOOL;
        else if (dt.code == DL_INT && dt.bits == 32) t->dtype = ATTN_I32;
        else if (dt.code == DL_INT && dt.bits == 64) t->dtype = ATTN_I64;
        else known = false;
    }
    if (!known) {
        static const char *const codes[] = {"int", "uint", "float", "opaque", "bfloat",
                                            "complex", "bool"};
        char name[64];
        snprintf(name, sizeof name, "%s%d%s", dt.code < 7 ? codes[dt.code] : "code?",
                 (int)dt.bits, dt.lanes != 1 ? " (vector lanes)" : "");
        unsupported_dtype(t, name);
        return -1;
    }
    t->ndim = dl->ndim;
    t->data = dl->data ? (char *)dl->data + dl->byte_offset : NULL;
    int64_t compact = 1;
    for (int d = dl->ndim - 1; d >= 0; d--) {
        t->shape[d] = dl->shape[d];
        t->stride[d] = dl->strides ? dl->strides[d] : compact;
        compact *= dl->shape[d];
    }
    int64_t size = (int64_t)attn_dtype_size(t->dtype);
    if (t->data && (uintptr_t)t->data % (uintptr_t)size != 0) {
        PyErr_Format(PyExc_ValueError, "%s: data at %p is not aligned to its %lld-byte "
                     "elements", t->arg, t->data, (long long)size);
        return -1;
    }
    return 0;
}

/* Whether obj is a NumPy array (or a subclass) of the bfloat16 dtype that ml_dtypes (and
 * so JAX) adds to NumPy. NumPy exports such an array neither as a buffer ("cannot include
 * dtype 'E' in a buffer") nor through DLPack, so import_tensor reads it through a uint16
 * view of the same memory. Checked by names: this file does not link against NumPy. */
static bool is_numpy_bfloat16(PyObject *obj) {
    PyObject *mro = Py_TYPE(obj)->tp_mro;
    bool ndarray = false;
    for (Py_ssize_t i = 0; mro && PyTuple_Check(mro) && i < PyTuple_GET_SIZE(mro); i++)
        if (strcmp(((PyTypeObject *)PyTuple_GET_ITEM(mro, i))->tp_name, "numpy.ndarray") == 0)
            ndarray = true;
    if (!ndarray) return false;
    bool yes = false;
    PyObject *dtype = PyObject_GetAttrString(obj, "dtype");
    PyObject *name = dtype ? PyObject_GetAttrString(dtype, "name") : NULL;
    PyObject *size = dtype ? PyObject_GetAttrString(dtype, "itemsize") : NULL;
    if (name && size && PyUnicode_Check(name) && PyLong_Check(size))
        yes = PyUnicode_CompareWithASCIIString(name, "bfloat16") == 0 &&
              PyLong_AsLong(size) == 2;
    Py_XDECREF(dtype);
    Py_XDECREF(name);
    Py_XDECREF(size);
    PyErr_Clear();
    return yes;
}

/* Whether obj exports a read-only buffer but no writable one. */
static bool is_read_only(PyObject *obj) {
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_RECORDS) == 0) {
        PyBuffer_Release(&v);
        return false;
    }
    PyErr_Clear();
    if (PyObject_GetBuffer(obj, &v, PyBUF_RECORDS_RO) != 0) {
        PyErr_Clear();
        return false;  // no buffer at all: the import says why
    }
    PyBuffer_Release(&v);
    return true;
}

/* Reads obj as a tensor without copying it: the buffer protocol for NumPy arrays (and
 * anything else that exports a strided buffer), DLPack for the rest. On failure a Python
 * exception naming t->arg is set and everything taken so far is released. */
static int import_tensor(PyObject *obj, const char *arg, bool writable, imported *t) {
    memset(t, 0, sizeof *t);
    t->arg = arg;
    int rc;
    if (is_numpy_bfloat16(obj)) {
        /* obj.view("uint16"): the same memory and strides; the buffer keeps the view (and
         * through it obj) alive until imported_release. */
        PyObject *raw = PyObject_CallMethod(obj, "view", "s", "uint16");
        if (!raw) {
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyErr_Format(PyExc_TypeError, "%s: cannot read the memory of a bfloat16 array "
                         "(%S)", arg, value ? value : Py_None);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
            return -1;
        }
        rc = import_buffer(raw, t, writable, true);
        Py_DECREF(raw);
    } else if (PyObject_CheckBuffer(obj) && writable && is_read_only(obj)) {
        PyErr_Format(PyExc_ValueError, "%s: the array is read-only, and attn writes it in "
                     "place (a broadcast_to view, say): pass a writable array", arg);
        rc = -1;
    } else if (PyObject_CheckBuffer(obj)) {
        rc = import_buffer(obj, t, writable, false);
        if (rc != 0 && !t->has_view && PyObject_HasAttrString(obj, "__dlpack__")) {
            /* The exporter refused a buffer (a dtype the struct module cannot spell, say):
             * DLPack may still describe it. */
            PyErr_Clear();
            rc = import_dlpack(obj, t);
        } else if (rc != 0 && !t->has_view) {
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyObject *dtype = PyObject_GetAttrString(obj, "dtype");
            PyObject *dstr = dtype ? PyObject_Str(dtype) : NULL;
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s: cannot read the array's memory%s%s (%S)", arg,
                         dstr ? " of dtype " : "", dstr ? PyUnicode_AsUTF8(dstr) : "",
                         value ? value : Py_None);
            Py_XDECREF(dstr);
            Py_XDECREF(dtype);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
        }
    } else if (PyObject_HasAttrString(obj, "__dlpack__")) {
        rc = import_dlpack(obj, t);
    } else {
        PyErr_Format(PyExc_TypeError,
                     "%s: expected a NumPy array or a tensor with __dlpack__ (PyTorch, JAX), "
                     "got %s", arg, Py_TYPE(obj)->tp_name);
        rc = -1;
    }
    if (rc != 0) imported_release(t);
    return rc;
}

/* ================================================================================
 * Errors from the library: the status decides the exception type, the detail's leading
 * name (q, k, mask, options.scale, ...) is replaced by the Python argument's name.
 * ================================================================================ */

static const char *const g_status_names[] = {
#define X_NAME(name, msg) #name,
    ATTN_STATUS_LIST(X_NAME)
#undef X_NAME
};

/* The library's argument names and the Python ones, per call (NULL-terminated). */
typedef struct arg_name {
    const char *c, *py;
} arg_name;

static const arg_name g_forward_names[] = {
    {"q", "query"}, {"k", "key"}, {"v", "value"}, {"o", "output"},
    {"lse", "the lse output"}, {"weights", "the weights output"}, {"sinks", "sinks"},
    {NULL, NULL},
};
static const arg_name g_backward_names[] = {
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
    {"options.precision", "precision"}, {"options.dropout_p", "dropout_p"}, {NULL, NULL},
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
static PyObject *raise_status(attn_status st, const arg_name *names, const char *call) {
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

/* The 4-D view of a rank-r (r <= 4) tensor: leading dimensions of size 1, stride 0. */
static attn_tensor to_4d(const imported *t) {
    attn_tensor a = {t->data, t->dtype, {1, 1, 1, 1}, {0, 0, 0, 0}};
    for (int d = 0; d < t->ndim; d++) {
        a.shape[4 - t->ndim + d] = t->shape[d];
        a.stride[4 - t->ndim + d] = t->stride[d];
    }
    return a;
}

static int check_rank(const imported *t, int lo, int hi, const char *expect) {
    if (t->ndim >= lo && t->ndim <= hi) return 0;
    PyErr_Format(PyExc_ValueError, "%s: rank %d, expected %s", t->arg, t->ndim, expect);
    return -1;
}

static PyObject *shape_tuple(const int64_t *dims, int n) {
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
static int parse_options(attn_options *opt, PyObject *oscale, double softcap, int causal,
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
static void parse_dropout(attn_options *opt, double p, unsigned long long seed,
                          unsigned long long offset) {
    opt->dropout_p = (float)p;
    opt->dropout_seed = seed;
    opt->dropout_offset = offset;
}

enum { IN_Q, IN_K, IN_V, IN_MASK, IN_ALIBI, IN_KVLEN, IN_SINKS, IN_N };

/* query, key, value and the masks of a call, imported and broadcast to the library's
 * [B, H, L, D] views, with the options pointing at them. Lives where it was made (opt
 * points into it); zero it before resolve_inputs and release it with inputs_release. */
typedef struct call_inputs {
    imported t[IN_N];
    attn_tensor q, k, v, mask, kvlen, alibi;
    attn_options opt;
    int64_t B, H, Hkv, Lq, Lk, Dv;
    int out_rank;  // the rank of the output: the largest of query's, key's, value's
    attn_tensor sinks;  // the attention sinks [H], when given (set_sinks)
} call_inputs;

static void inputs_release(call_inputs *c) {
    for (int i = 0; i < IN_N; i++) imported_release(&c->t[i]);
}

/* Imports and broadcasts the inputs into *c (c->opt already parsed). one_group: when key
 * and value both have one head and query several (without enable_gqa), read them as one
 * group of grouped-query attention instead of broadcasting them to every head: the same
 * logits, and the backward then sums dK and dV over the heads itself. */
static int resolve_inputs(call_inputs *c, PyObject *oq, PyObject *ok, PyObject *ov,
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

    /* attn_mask: bool -> mask, float -> bias; right-aligned to (B, H, Lq, Lk). */
    if (omask != Py_None) {
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
static int set_sinks(call_inputs *c, PyObject *osinks) {
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

/* ================================================================================
 * forward
 * ================================================================================ */

/* Calls alloc(shape, which, dtype) and imports the result for writing; checks it is what
 * was asked for. The output may come back in another floating dtype than `want` (the
 * library rounds to whichever it is given): a bfloat16 query whose framework the
 * allocator cannot make bfloat16 arrays for gets float32. */
static PyObject *alloc_output(PyObject *alloc, const int64_t *dims, int n, const char *which,
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
    const bool floating = t->dtype == ATTN_F32 || t->dtype == ATTN_F16 || t->dtype == ATTN_BF16;
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

/* The library's LSE view {B, H, Lq, 1} of a Python LSE tensor (..., Lq). */
static attn_tensor lse_view(const imported *t) {
    attn_tensor l3 = to_4d(t); /* (.., Lq) -> (1, B, H, Lq): shift to (B, H, Lq, 1) */
    return (attn_tensor){l3.data, l3.dtype, {l3.shape[1], l3.shape[2], l3.shape[3], 1},
                         {l3.stride[1], l3.stride[2], l3.stride[3], 0}};
}

PyDoc_STRVAR(forward_doc,
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

static PyObject *py_forward(PyObject *self, PyObject *args, PyObject *kwargs) {
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
    memset(&c, 0, sizeof c);
    if (parse_options(&c.opt, oscale, softcap, causal, align, owindow, path, precision,
                      threads) != 0)
        return NULL;
    parse_dropout(&c.opt, dropout_p, dropout_seed, dropout_offset);

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

    Py_BEGIN_ALLOW_THREADS
    st = attn_forward(&c.q, &c.k, &c.v, &o, &c.opt);
    Py_END_ALLOW_THREADS
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

/* ================================================================================
 * backward
 * ================================================================================ */

/* One gradient the library writes. Where the caller's tensor has every size of the call's
 * view (dX of the broadcast input), the library writes it in place, whatever its strides
 * and whatever its dtype (float32, float16 or bfloat16: the library rounds each gradient
 * once to it). Where it has a size-1 batch or head dimension that the call broadcast (a
 * query of rank 2 under a key of rank 4, a key shared by every batch, ...), or where the
 * caller passed None, the library writes a dense float32 scratch of the call's shape,
 * which is then summed over the broadcast dimensions (in float64) into the caller's
 * tensor, rounded once to its dtype. */
typedef struct grad_slot {
    imported imp;      // the caller's tensor, when given
    bool given;
    attn_tensor call;  // what the library writes
    attn_tensor dest;  // the caller's 4-D view, summed into from call when temp is set
    void *temp;        // owned scratch (float32, or float64 for a float64 input), NULL
                       // when the library writes the caller's memory
    bool reduce[2];    // batch, heads
} grad_slot;

static int grad_setup(grad_slot *g, PyObject *obj, const char *arg, const imported *input,
                      const char *input_name, const attn_tensor *x) {
    const int64_t *shape = x->shape;
    bool need_temp = obj == Py_None;
    if (obj != Py_None) {
        if (import_tensor(obj, arg, true, &g->imp) != 0) return -1;
        g->given = true;
        bool same = g->imp.ndim == input->ndim;
        for (int d = 0; same && d < input->ndim; d++) same = g->imp.shape[d] == input->shape[d];
        if (!same) {
            PyObject *got = shape_tuple(g->imp.shape, g->imp.ndim);
            PyObject *want = shape_tuple(input->shape, input->ndim);
            if (got && want)
                PyErr_Format(PyExc_ValueError, "%s: shape %R, expected %R (the shape of %s)",
                             arg, got, want, input_name);
            Py_XDECREF(got);
            Py_XDECREF(want);
            return -1;
        }
        g->dest = to_4d(&g->imp);
        for (int d = 0; d < 2; d++) {
            g->reduce[d] = g->dest.shape[d] != shape[d];  // 1 under a broadcast size
            need_temp |= g->reduce[d];
        }
        if (!need_temp) {
            g->call = g->dest;
            return 0;
        }
        if (g->imp.dtype != ATTN_F32 && g->imp.dtype != ATTN_F16 &&
            g->imp.dtype != ATTN_BF16 && g->imp.dtype != ATTN_F64) {
            PyErr_Format(PyExc_TypeError, "%s: dtype %s, expected float32, float16, "
                         "bfloat16 or float64", arg, attn_dtype_name(g->imp.dtype));
            return -1;
        }
        for (int d = 0; d < 4; d++)
            if (g->dest.shape[d] > 1 && g->dest.stride[d] == 0) {
                PyErr_Format(PyExc_ValueError, "%s: stride 0 on dimension %d of size %lld: "
                             "its elements would overlap", arg, d - (4 - g->imp.ndim),
                             (long long)g->dest.shape[d]);
                return -1;
            }
    }
    int64_t count = 1;
    for (int d = 0; d < 4; d++)
        if (__builtin_mul_overflow(count, shape[d], &count) || count > (int64_t)(SIZE_MAX / 8)) {
            PyErr_Format(PyExc_ValueError, "%s: the broadcast gradient's size overflows", arg);
            return -1;
        }
    const attn_dtype tdt = x->dtype == ATTN_F64 ? ATTN_F64 : ATTN_F32;
    const size_t tsz = tdt == ATTN_F64 ? sizeof(double) : sizeof(float);
    g->temp = malloc((size_t)(count > 0 ? count : 1) * tsz);
    if (!g->temp) {
        PyErr_Format(PyExc_MemoryError, "%s: could not allocate %lld bytes for the broadcast "
                     "gradient", arg, (long long)count * (long long)tsz);
        return -1;
    }
    g->call = attn_tensor_4d(g->temp, tdt, shape[0], shape[1], shape[2], shape[3]);
    return 0;
}

/* x rounded once to dt (float32, float16 or bfloat16), to nearest even, stored at
 * base[idx]. For a 16-bit dt, x is first rounded to float32 *to odd* (the float32 nearest
 * x, moved one step towards x when it is inexact and even): float32 keeps at least two
 * more bits than either 16-bit type, so the library's float32 -> 16-bit rounding of that
 * is the correct rounding of x itself, with no double rounding. */
static void store_rounded(attn_dtype dt, void *base, int64_t idx, double x) {
    if (dt == ATTN_F64) {  // a float64 gradient: the float64 sum as it is
        ((double *)base)[idx] = x;
        return;
    }
    float f = (float)x;
    if (dt != ATTN_F32 && isfinite(f) && (double)f != x && !(attn_f32_bits(f) & 1u))
        f = nextafterf(f, x > (double)f ? INFINITY : -INFINITY);
    attn_store(dt, base, idx, f);
}

/* dest[b', h', i, e] = the sum of call[b, h, i, e] over the broadcast batch and head
 * indices (those of a dimension dest has as 1), in float64, in index order, rounded once
 * to dest's dtype. Runs without the GIL. */
static void grad_reduce(const grad_slot *g) {
    const attn_tensor *c = &g->call, *d = &g->dest;
    const float *src = c->data;
    const double *src64 = c->data;  // when the scratch is float64
    const int64_t B = c->shape[0], H = c->shape[1], L = c->shape[2], D = c->shape[3];
    for (int64_t b2 = 0; b2 < d->shape[0]; b2++)
        for (int64_t h2 = 0; h2 < d->shape[1]; h2++) {
            const int64_t b_lo = g->reduce[0] ? 0 : b2, b_hi = g->reduce[0] ? B : b2 + 1;
            const int64_t h_lo = g->reduce[1] ? 0 : h2, h_hi = g->reduce[1] ? H : h2 + 1;
            for (int64_t i = 0; i < L; i++)
                for (int64_t e = 0; e < D; e++) {
                    double s = 0.0;
                    for (int64_t b = b_lo; b < b_hi; b++)
                        for (int64_t h = h_lo; h < h_hi; h++)
                            s += c->dtype == ATTN_F64 ? src64[((b * H + h) * L + i) * D + e]
                                                      : src[((b * H + h) * L + i) * D + e];
                    store_rounded(d->dtype, d->data, b2 * d->stride[0] + h2 * d->stride[1] +
                                  i * d->stride[2] + e * d->stride[3], s);
                }
        }
}

static void grad_release(grad_slot *g) {
    imported_release(&g->imp);
    free(g->temp);
    g->temp = NULL;
}

PyDoc_STRVAR(backward_doc,
"backward(query, key, value, out, grad_out, lse, grad_query, grad_key, grad_value,\n"
"         attn_mask, is_causal, scale, enable_gqa, align, window, softcap, alibi_slopes,\n"
"         kv_len, path, precision, threads, sinks=None, grad_sinks=None, *,\n"
"         dropout_p=0.0, dropout_seed=0, dropout_offset=0)\n"
"--\n\n"
"Private: the gradients of forward() (attn_backward), behind the autograd of\n"
"attn.scaled_dot_product_attention. query ... threads are exactly the forward call's\n"
"arguments; out and lse are the forward's output and LSE (lse float32), grad_out =\n"
"dLoss/dout (any strides, stride 0 too). grad_query, grad_key and grad_value are writable\n"
"tensors of the shapes of query, key and value (any strides; None = not wanted), written\n"
"in place: the gradients of a broadcast batch or head dimension are summed (dK and dV\n"
"over the query heads of a group too). query, key/value (alike), out, grad_out and each\n"
"gradient may be float32, float16 or bfloat16: the library computes in float32 and\n"
"rounds each gradient once to its own dtype. No gradient for the masks, the bias or the\n"
"slopes. sinks: the forward's (H,) float32 or None; grad_sinks: None or a writable\n"
"(H,) float32 tensor that gets the sinks' gradient (summed over the batch and rows).\n"
"The GIL is released. Returns None; on error nothing is written.");

static PyObject *py_backward(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"query", "key", "value", "out", "grad_out", "lse", "grad_query",
                             "grad_key", "grad_value", "attn_mask", "is_causal", "scale",
                             "enable_gqa", "align", "window", "softcap", "alibi_slopes",
                             "kv_len", "path", "precision", "threads", "sinks", "grad_sinks",
                             "dropout_p", "dropout_seed", "dropout_offset", NULL};
    PyObject *oq, *ok, *ov, *oo, *odo, *olse, *odq, *odk, *odv, *omask, *oscale, *owindow,
        *oalibi, *okvlen, *osinks = Py_None, *odsinks = Py_None;
    int causal, gqa, align, path, precision, threads;
    double softcap, dropout_p = 0.0;
    unsigned long long dropout_seed = 0, dropout_offset = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOOOOpOpiOdOOiii|OO$dKK:backward",
                                     kwlist, &oq, &ok, &ov, &oo, &odo, &olse, &odq, &odk, &odv,
                                     &omask, &causal, &oscale, &gqa, &align, &owindow, &softcap,
                                     &oalibi, &okvlen, &path, &precision, &threads, &osinks,
                                     &odsinks, &dropout_p, &dropout_seed, &dropout_offset))
        return NULL;

    call_inputs c;
    memset(&c, 0, sizeof c);
    if (parse_options(&c.opt, oscale, softcap, causal, align, owindow, path, precision,
                      threads) != 0)
        return NULL;
    parse_dropout(&c.opt, dropout_p, dropout_seed, dropout_offset);

    enum { OUT, DOUT, LSE, DSINKS, N_T };
    imported t[N_T];
    memset(t, 0, sizeof t);
    grad_slot g[3];
    memset(g, 0, sizeof g);
    PyObject *result = NULL;

    if (resolve_inputs(&c, oq, ok, ov, omask, oalibi, okvlen, gqa, true) != 0 ||
        set_sinks(&c, osinks) != 0)
        goto done;
    /* the sinks' gradient [H], float32, written in place */
    attn_tensor d_sinks;
    if (odsinks != Py_None) {
        if (import_tensor(odsinks, "grad_sinks", true, &t[DSINKS]) ||
            check_rank(&t[DSINKS], 1, 1, "1 (one per query head)"))
            goto done;
        d_sinks = (attn_tensor){t[DSINKS].data, t[DSINKS].dtype, {t[DSINKS].shape[0], 1, 1, 1},
                                {t[DSINKS].stride[0], 0, 0, 0}};
        c.opt.d_sinks = &d_sinks;
    }
    if (import_tensor(oo, "out", false, &t[OUT]) ||
        import_tensor(odo, "grad_out", false, &t[DOUT]) ||
        import_tensor(olse, "lse", false, &t[LSE]))
        goto done;
    const char *o_rank = "2 to 4 (..., L, Dv)";
    if (check_rank(&t[OUT], 2, 4, o_rank) || check_rank(&t[DOUT], 2, 4, o_rank) ||
        check_rank(&t[LSE], 1, 3, "1 to 3 (..., L)"))
        goto done;
    const attn_tensor o = to_4d(&t[OUT]), d_o = to_4d(&t[DOUT]), lse = lse_view(&t[LSE]);

    if (grad_setup(&g[0], odq, "grad_query", &c.t[IN_Q], "query", &c.q) ||
        grad_setup(&g[1], odk, "grad_key", &c.t[IN_K], "key", &c.k) ||
        grad_setup(&g[2], odv, "grad_value", &c.t[IN_V], "value", &c.v))
        goto done;

    attn_status st;
    Py_BEGIN_ALLOW_THREADS
    st = attn_backward(&c.q, &c.k, &c.v, &o, &d_o, &lse, &g[0].call, &g[1].call, &g[2].call,
                       &c.opt);
    if (st == ATTN_OK)
        for (int i = 0; i < 3; i++)
            if (g[i].given && g[i].temp) grad_reduce(&g[i]);
    Py_END_ALLOW_THREADS
    if (st != ATTN_OK) {
        raise_status(st, g_backward_names, "attn_backward");
        goto done;
    }
    Py_INCREF(Py_None);
    result = Py_None;

done:
    inputs_release(&c);
    for (int i = 0; i < N_T; i++) imported_release(&t[i]);
    for (int i = 0; i < 3; i++) grad_release(&g[i]);
    return result;
}

/* ================================================================================
 * Small helpers for the package and its tests
 * ================================================================================ */

PyDoc_STRVAR(describe_doc,
"_describe(obj) -> dict\n--\n\n"
"Private, for the tests: what forward() would read from obj, through the same import\n"
"(buffer protocol or DLPack): {'data': address of element [0, ..., 0], 'dtype',\n"
"'shape', 'strides' (in elements), 'via': 'buffer' or 'dlpack'}. Nothing is copied.");

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

/* the multi-head module's entry (_mha.c) */
PyObject *attn_py_mha(PyObject *self, PyObject *args, PyObject *kw);

static PyMethodDef methods[] = {
    {"forward", (PyCFunction)(void (*)(void))py_forward, METH_VARARGS | METH_KEYWORDS,
     forward_doc},
    {"backward", (PyCFunction)(void (*)(void))py_backward, METH_VARARGS | METH_KEYWORDS,
     backward_doc},
    {"_describe", py_describe, METH_O, describe_doc},
    {"_mha", (PyCFunction)(void (*)(void))attn_py_mha, METH_VARARGS | METH_KEYWORDS,
     "_mha(**tensors_and_options) -> None\n--\n\nThe multi-head module (private; use "
     "attn.multi_head_attention)."},
    {"_dlpack_counts", py_dlpack_counts, METH_NOARGS, dlpack_counts_doc},
    {"version", py_version, METH_NOARGS, "version() -> str\n--\n\nThe C library's version."},
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
 * which a test holds to it so that a field added in attn.h cannot be read past its end */
PyMODINIT_FUNC PyInit__attn(void) {
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "OPTIONS_SIZE", (long)sizeof(attn_options)) != 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
