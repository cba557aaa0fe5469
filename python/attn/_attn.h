/*
 * _attn.h — what the files of the CPython extension attn._attn share: a tensor imported
 *           from Python without a copy (`imported`: buffer protocol, DLPack, or a PyTorch
 *           tensor's own attributes), the library's errors raised as Python exceptions,
 *           and the inputs of a forward or backward call (`call_inputs`: query, key,
 *           value and the masks, broadcast to the library's [B, H, L, D] views, with the
 *           options).
 *
 * The files, each owning one part (setup.py lists them):
 *   _attn.c           the module: its method table, init, and the small helpers for tests
 *   _attn_import.c    DLPack's structures and the import of one tensor
 *   _attn_inputs.c    the library's errors as exceptions; a call's inputs and options
 *   _attn_forward.c   forward(): attn_forward, the outputs from the caller's allocator
 *   _attn_backward.c  backward(): attn_backward, the broadcast gradients summed back
 *   _attn_varlen.c    varlen_forward(), varlen_backward(): packed batches (attn_varlen_*)
 *   _mha.c            _mha(): the multi-head module (its own imports; not this header)
 * What it is not: the public function (python/attn/__init__.py owns the signature, the
 * defaults and the docstring) or anything the library exports.
 */
#ifndef ATTN_PY_ATTN_H
#define ATTN_PY_ATTN_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdbool.h>
#include <stdint.h>

#include "attn.h"

/* DLPack's managed tensor (its fields: _attn_import.c) */
typedef struct dl_managed_tensor dl_managed_tensor;

/* ================================================================================
 * One imported tensor: a read (or write) view of someone else's memory.
 * ================================================================================ */

enum { MAX_DIMS = 8 };

typedef struct imported {
    const char *arg;            /* the Python argument's name, used in every message   */
    const char *via;            /* "buffer", "dlpack" or "torch"                        */
    Py_buffer view;             /* buffer protocol: released by imported_release        */
    bool has_view;
    PyObject *capsule;          /* DLPack: the capsule, renamed "used_dltensor"         */
    PyObject *owned;            /* torch: a tensor made for the call (resolve_neg)      */
    dl_managed_tensor *managed; /* DLPack: ours to delete once the call is done         */
    void *data;                 /* element [0, ..., 0]                                  */
    attn_dtype dtype;
    int ndim;
    int64_t shape[MAX_DIMS];
    int64_t stride[MAX_DIMS];   /* in elements                                          */
} imported;

/* Reads obj as a tensor without copying it: the buffer protocol for NumPy arrays (and
 * anything else that exports a strided buffer), DLPack for the rest. On failure a Python
 * exception naming arg is set and everything taken so far is released. */
int import_tensor(PyObject *obj, const char *arg, bool writable, imported *t);
/* Gives back what import_tensor took (nothing on a zeroed or released one). */
void imported_release(imported *t);
/* DLPack capsules consumed so far and deleters called (they must match; for the tests) */
extern long long g_dlpack_taken, g_dlpack_released;

/* ================================================================================
 * Errors and the inputs of a call (_attn_inputs.c)
 * ================================================================================ */

/* The library's argument names and the Python ones, per call (NULL-terminated). */
typedef struct arg_name {
    const char *c, *py;
} arg_name;

extern const arg_name g_forward_names[], g_backward_names[];
/* Raises the exception of a failed library call; returns NULL. */
PyObject *raise_status(attn_status st, const arg_name *names, const char *call);

/* The 4-D view of a rank-r (r <= 4) tensor: leading dimensions of size 1, stride 0. */
attn_tensor to_4d(const imported *t);
/* The library's LSE view {B, H, Lq, 1} of a Python LSE tensor (..., Lq). */
attn_tensor lse_view(const imported *t);
int check_rank(const imported *t, int lo, int hi, const char *expect);
PyObject *shape_tuple(const int64_t *dims, int n);
/* 0 when g has input's shape, else -1 with a ValueError naming arg and input_name (a
 * gradient written in place must have its input's shape). */
int check_same_shape(const imported *g, const imported *input, const char *arg,
                     const char *input_name);
int parse_options(attn_options *opt, PyObject *oscale, double softcap, int causal, int align,
                  PyObject *owindow, int path, int precision, int threads);
void parse_dropout(attn_options *opt, double p, unsigned long long seed,
                   unsigned long long offset);

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

/* *opt from the arguments every call shares: parse_options', then the dropout's; -1 with
 * an exception set. */
int parse_call_options(attn_options *opt, PyObject *oscale, double softcap, int causal,
                       int align, PyObject *owindow, int path, int precision, int threads,
                       double dropout_p, unsigned long long dropout_seed,
                       unsigned long long dropout_offset);
/* Zeroes *c and fills c->opt from the arguments forward() and backward() share
 * (parse_call_options); -1 with an exception set. */
int call_options(call_inputs *c, PyObject *oscale, double softcap, int causal, int align,
                 PyObject *owindow, int path, int precision, int threads, double dropout_p,
                 unsigned long long dropout_seed, unsigned long long dropout_offset);
void inputs_release(call_inputs *c);
int resolve_inputs(call_inputs *c, PyObject *oq, PyObject *ok, PyObject *ov, PyObject *omask,
                   PyObject *oalibi, PyObject *okvlen, int gqa, bool one_group);
int set_sinks(call_inputs *c, PyObject *osinks);

/* The library's workspace kept between calls, one for the forward and one for the
 * backward (_attn_inputs.c): a fresh workspace of tens of MiB on every call pays its page
 * faults and the kernel's zeroing (docs/PYTHON.md, "Threads and the GIL"). With the
 * GIL held: workspace_take sets opt->workspace to the kept one, grown to `need` bytes,
 * when it is free and need is at most WORKSPACE_KEEP_MAX (else leaves opt as it is: the
 * library allocates its own, as before) and returns whether it did; workspace_give frees
 * the slot for the next call. */
enum { WORKSPACE_FORWARD, WORKSPACE_BACKWARD };
#define WORKSPACE_KEEP_MAX ((size_t)256 << 20)
bool workspace_take(int slot, size_t need, attn_options *opt);
void workspace_give(int slot, attn_options *opt);

/* ================================================================================
 * The bindings, for the module's method table (_attn.c)
 * ================================================================================ */

/* Calls alloc(shape, which, dtype) and imports the result for writing, checked to be what
 * was asked for (the output may come back in another floating dtype: the library rounds
 * to it); NULL with an exception set. _attn_forward.c */
PyObject *alloc_output(PyObject *alloc, const int64_t *dims, int n, const char *which,
                       attn_dtype want, imported *t);
PyObject *py_forward(PyObject *self, PyObject *args, PyObject *kwargs);   // _attn_forward.c
extern const char py_forward_doc[];
PyObject *py_backward(PyObject *self, PyObject *args, PyObject *kwargs);  // _attn_backward.c
extern const char py_backward_doc[];
PyObject *py_varlen_forward(PyObject *self, PyObject *args, PyObject *kwargs);   // _attn_varlen.c
extern const char py_varlen_forward_doc[];
PyObject *py_varlen_backward(PyObject *self, PyObject *args, PyObject *kwargs);  // _attn_varlen.c
extern const char py_varlen_backward_doc[];
PyObject *attn_py_mha(PyObject *self, PyObject *args, PyObject *kw);      // _mha.c
/* block masks (_attn_block.c makes them): a capsule of this name holds the library's
 * attn_block_mask; block_mask_of (_attn_inputs.c) gives it, NULL when obj is not one */
#define BLOCK_MASK_CAPSULE "attn.block_mask"
const attn_block_mask *block_mask_of(PyObject *obj);
PyObject *py_block_mask(PyObject *self, PyObject *omask);
extern const char py_block_mask_doc[];
PyObject *py_block_mask_info(PyObject *self, PyObject *obj);
extern const char py_block_mask_info_doc[];

#endif /* ATTN_PY_ATTN_H */
