/*
 * _attn_block.c — the extension's block masks: _attn._block_mask(mask) makes the library's
 *                 attn_block_mask from a bool tensor (attn_block_mask_from_tensor) and
 *                 returns it in a capsule that frees it; _attn._block_mask_info(capsule)
 *                 reads its counts. forward() and backward() take such a capsule as
 *                 attn_mask (resolve_inputs and block_mask_of, _attn_inputs.c), as
 *                 options.block_mask.
 *
 * What it is not: the Python BlockMask (python/attn/_flex.py owns it, and the mask_mod's
 * evaluation), or a copy of the mask: the library keeps only its structure and partial
 * blocks.
 */
#include "_attn.h"

static void capsule_free(PyObject *capsule) {
    attn_block_mask_free(PyCapsule_GetPointer(capsule, BLOCK_MASK_CAPSULE));
}

const char py_block_mask_doc[] =
    "_block_mask(mask) -> capsule\n--\n\n"
    "Private (attn.BlockMask): the library's block mask of a bool mask (B|1, H|1, L, S), True\n"
    "= attend; a batch or head dimension of stride 0 is stored once. The capsule frees it.";

PyObject *py_block_mask(PyObject *self, PyObject *omask) {
    imported t;
    if (import_tensor(omask, "mask", false, &t) != 0) return NULL;
    PyObject *r = NULL;
    if (t.ndim != 4 || t.dtype != ATTN_BOOL) {
        PyErr_Format(PyExc_ValueError, "mask: a 4-D bool array (B|1, H|1, L, S) expected, got "
                     "%d dimensions of %s", t.ndim, attn_dtype_name(t.dtype));
    } else {
        attn_tensor m = to_4d(&t);
        for (int d = 0; d < 2; d++)
            if (m.shape[d] == 1) m.stride[d] = 0;
        attn_block_mask *bm = NULL;
        attn_status st;
        Py_BEGIN_ALLOW_THREADS
        st = attn_block_mask_from_tensor(&m, &bm);
        Py_END_ALLOW_THREADS
        if (st != ATTN_OK) {
            PyErr_Format(st == ATTN_ERR_NOMEM ? PyExc_MemoryError : PyExc_ValueError,
                         "attn_block_mask_from_tensor: %s (%s)", attn_last_error(),
                         attn_status_string(st));
        } else if (!(r = PyCapsule_New(bm, BLOCK_MASK_CAPSULE, capsule_free))) {
            attn_block_mask_free(bm);
        }
    }
    imported_release(&t);
    return r;
}

const char py_block_mask_info_doc[] =
    "_block_mask_info(capsule) -> dict\n--\n\n"
    "Private: a block mask's dims and its blocks of 64 rows x 16 keys by kind, and its bytes.";

PyObject *py_block_mask_info(PyObject *self, PyObject *obj) {
    const attn_block_mask *bm = block_mask_of(obj);
    if (!bm) {
        PyErr_SetString(PyExc_TypeError, "expected a block mask capsule (attn._attn._block_mask)");
        return NULL;
    }
    attn_block_mask_info in;
    attn_block_mask_get_info(bm, &in);
    return Py_BuildValue("{s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:n}", "B", (long long)in.B, "H",
                         (long long)in.H, "Lq", (long long)in.Lq, "Lk", (long long)in.Lk,
                         "block_rows", (long long)in.block_rows, "block_keys",
                         (long long)in.block_keys, "empty", (long long)in.empty, "full",
                         (long long)in.full, "partial", (long long)in.partial, "bytes",
                         (Py_ssize_t)in.bytes);
}
