/*
 * _attn_import.c — one tensor of the CPython extension read from Python without a copy:
 *                  NumPy arrays through the buffer protocol (ml_dtypes' bfloat16 through a
 *                  uint16 view), PyTorch's own tensors from their attributes, anything
 *                  else with __dlpack__ (JAX, tensor subclasses, ...) through DLPack, as
 *                  an `imported` view (_attn.h): dtype, shape, strides in elements. A
 *                  GPU tensor, an unsupported dtype, a misaligned or non-native-order
 *                  buffer is refused with a message naming the argument.
 *
 * What it is not: the broadcasting of a call's inputs or the mapping of the library's
 * errors (_attn_inputs.c). Strides are converted from bytes (buffer protocol) to elements;
 * DLPack strides are in elements already.
 */
#include "_attn.h"

#include <stdlib.h>
#include <string.h>

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
long long g_dlpack_taken, g_dlpack_released;

/* Gives back what an import took. May run the producer's Python code (a deleter that
 * drops the last reference to an array, a buffer's release hook), so an exception being
 * raised is set aside meanwhile and restored after. */
void imported_release(imported *t) {
    if (!t->has_view && !t->managed && !t->capsule && !t->owned) return;
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
    Py_CLEAR(t->owned);
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

/* ================================================================================
 * PyTorch's own tensors, read from their attributes
 *
 * torch.Tensor's __dlpack__ and __dlpack_device__ are Python methods: the two took 4 us
 * a tensor, a third of a short decoding call's time from Python (docs/PYTHON.md, "The
 * cost of a call"). An object whose type is exactly torch.Tensor (not a subclass: those
 * may override anything through __torch_function__, and go through DLPack) is read
 * from data_ptr(), shape, stride() and dtype instead, the same memory DLPack would
 * give, when it is a strided CPU tensor that does not require grad (the public calls
 * detach first); anything else goes through DLPack and its messages. A tensor with the
 * negative bit (torch._neg_view: its memory holds -x) is read through resolve_neg(), a
 * copy of the values it stands for, where DLPack would export the memory as it is.
 * ================================================================================ */

enum { TORCH_DTYPES = 7 };
static PyObject *g_torch_tensor;              /* torch.Tensor, once seen               */
static PyObject *g_torch_strided;             /* torch.strided                         */
static PyObject *g_torch_dtype[TORCH_DTYPES]; /* torch.float32, ... as k_torch_attn    */
static const attn_dtype k_torch_attn[TORCH_DTYPES] = {ATTN_F32, ATTN_F64, ATTN_F16, ATTN_BF16,
                                                      ATTN_BOOL, ATTN_I32, ATTN_I64};
static const char *const k_torch_names[TORCH_DTYPES] = {"float32", "float64", "float16",
                                                        "bfloat16", "bool", "int32", "int64"};

/* torch's Tensor type, strided layout and dtypes from the loaded torch module (kept for
 * the process); false, with no exception, where torch is not loaded or lacks one. */
static bool learn_torch(void) {
    PyObject *name = PyUnicode_FromString("torch");
    PyObject *torch = name ? PyImport_GetModule(name) : NULL;
    Py_XDECREF(name);
    bool ok = torch != NULL;
    PyObject *tensor = ok ? PyObject_GetAttrString(torch, "Tensor") : NULL;
    PyObject *strided = ok ? PyObject_GetAttrString(torch, "strided") : NULL;
    PyObject *dtypes[TORCH_DTYPES] = {NULL};
    for (int i = 0; ok && i < TORCH_DTYPES; i++)
        ok = (dtypes[i] = PyObject_GetAttrString(torch, k_torch_names[i])) != NULL;
    ok = ok && tensor && strided && PyType_Check(tensor);
    if (ok) {
        g_torch_tensor = tensor, g_torch_strided = strided;  // the references are kept
        memcpy(g_torch_dtype, dtypes, sizeof dtypes);
    } else {
        Py_XDECREF(tensor);
        Py_XDECREF(strided);
        for (int i = 0; i < TORCH_DTYPES; i++) Py_XDECREF(dtypes[i]);
    }
    Py_XDECREF(torch);
    PyErr_Clear();
    return ok;
}

/* Whether obj's type is exactly torch.Tensor (learnt the first time an object of a type
 * named "Tensor" arrives) */
static bool is_torch_tensor(PyObject *obj) {
    if (!g_torch_tensor && (strcmp(Py_TYPE(obj)->tp_name, "Tensor") != 0 || !learn_torch()))
        return false;
    return (PyObject *)Py_TYPE(obj) == g_torch_tensor;
}

/* obj.name() or obj.name as a C truth value; -1 with an exception on failure */
static int torch_flag(PyObject *obj, const char *name, bool call) {
    PyObject *x = call ? PyObject_CallMethod(obj, name, NULL) : PyObject_GetAttrString(obj, name);
    if (!x) return -1;
    const int r = PyObject_IsTrue(x);
    Py_DECREF(x);
    return r;
}

/* A tuple (or torch.Size) of n ints into out; -1 with an exception otherwise */
static int torch_ints(PyObject *seq, int64_t *out, int n) {
    if (!PyTuple_Check(seq) || PyTuple_GET_SIZE(seq) != n) {
        PyErr_SetString(PyExc_TypeError, "expected a tuple of the tensor's rank");
        return -1;
    }
    for (int i = 0; i < n; i++) {
        out[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(seq, i));
        if (out[i] == -1 && PyErr_Occurred()) return -1;
    }
    return 0;
}

/* obj (exactly torch.Tensor) into t from its attributes: 1 done, 0 not this path's
 * (DLPack then reads it, or refuses it with its message), -1 an exception. */
static int import_torch(PyObject *obj, imported *t) {
    int r = torch_flag(obj, "is_cpu", false);
    if (r <= 0) return r;
    if ((r = torch_flag(obj, "requires_grad", false)) != 0) return r < 0 ? -1 : 0;
    PyObject *layout = PyObject_GetAttrString(obj, "layout");
    if (!layout) return -1;
    Py_DECREF(layout);  // compared by identity: torch.strided is kept alive by g_torch_strided
    if (layout != g_torch_strided) return 0;
    PyObject *dtype = PyObject_GetAttrString(obj, "dtype");
    if (!dtype) return -1;
    Py_DECREF(dtype);  // likewise
    int which = -1;
    for (int i = 0; i < TORCH_DTYPES; i++)
        if (dtype == g_torch_dtype[i]) which = i;
    if (which < 0) return 0;
    if ((r = torch_flag(obj, "is_neg", true)) != 0) {
        if (r < 0) return -1;
        PyObject *plain = PyObject_CallMethod(obj, "resolve_neg", NULL);
        if (!plain) return -1;
        if ((PyObject *)Py_TYPE(plain) != g_torch_tensor) {
            Py_DECREF(plain);
            return 0;
        }
        r = import_torch(plain, t);
        if (r == 1) t->owned = plain;
        else Py_DECREF(plain);
        return r;
    }
    PyObject *shape = PyObject_GetAttrString(obj, "shape");
    if (!shape) return -1;
    const Py_ssize_t ndim = PyTuple_Check(shape) ? PyTuple_GET_SIZE(shape) : -1;
    if (ndim < 0 || ndim > MAX_DIMS) {
        Py_DECREF(shape);
        return 0;
    }
    PyObject *stride = PyObject_CallMethod(obj, "stride", NULL);
    PyObject *ptr = stride ? PyObject_CallMethod(obj, "data_ptr", NULL) : NULL;
    const int ok = ptr && torch_ints(shape, t->shape, (int)ndim) == 0 &&
                   torch_ints(stride, t->stride, (int)ndim) == 0;
    void *data = ok ? PyLong_AsVoidPtr(ptr) : NULL;
    Py_DECREF(shape);
    Py_XDECREF(stride);
    Py_XDECREF(ptr);
    if (!ok || PyErr_Occurred()) return -1;
    t->via = "torch";
    t->dtype = k_torch_attn[which];
    t->ndim = (int)ndim;
    t->data = data;
    const int64_t size = (int64_t)attn_dtype_size(t->dtype);
    if (t->data && (uintptr_t)t->data % (uintptr_t)size != 0) {
        PyErr_Format(PyExc_ValueError, "%s: data at %p is not aligned to its %lld-byte "
                     "elements", t->arg, t->data, (long long)size);
        return -1;
    }
    return 1;
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

/* (_attn.h) */
int import_tensor(PyObject *obj, const char *arg, bool writable, imported *t) {
    memset(t, 0, sizeof *t);
    t->arg = arg;
    int rc;
    if (is_torch_tensor(obj) && (rc = import_torch(obj, t)) != 0) {
        if (rc > 0) rc = 0;
    } else if (PyErr_Occurred()) {
        rc = -1;
    } else if (is_numpy_bfloat16(obj)) {
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
