"""attn.ring — ring attention over MPI from Python, through mpi4py.

Each process of an MPI communicator holds its slice of the sequence (``slices`` says
which rows: contiguous, or the zigzag split when causal) and calls ``attention`` with
it; every process gets its rows of O (and of the LSE). The arithmetic is libattn_mpi's
(``attn_ring_forward``, docs/RING.md), reached with ctypes through its shared library
``libattn_mpi.so`` (``make`` builds it where mpicc exists): found through the
``ATTN_MPI_LIB`` environment variable, else beside this source tree's ``build/``, else
on the loader's path. The communicator crosses as its Fortran handle (``Comm.py2f()``,
turned back in C by ``MPI_Comm_f2c``). This module is not imported by ``attn`` itself:
``import attn.ring`` needs mpi4py and the library.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Optional, Sequence, Tuple

import numpy as np

try:
    from ._options import _INT32, integer, integers
except ImportError:  # loaded by its path outside the package (tests/python/test_ring.py)
    import importlib.util as _util

    _spec = _util.spec_from_file_location(
        "attn_options", os.path.join(os.path.dirname(os.path.abspath(__file__)), "_options.py"))
    _opts = _util.module_from_spec(_spec)
    _spec.loader.exec_module(_opts)
    _INT32, integer, integers = _opts._INT32, _opts.integer, _opts.integers

__all__ = ["attention", "slices", "take"]

_DTYPES = {np.dtype(np.float32): 0, np.dtype(np.float16): 1}
_lib = None


def _load() -> ctypes.CDLL:
    global _lib
    if _lib is not None:
        return _lib
    here = os.path.dirname(os.path.abspath(__file__))
    tries = [os.environ.get("ATTN_MPI_LIB"),
             os.path.join(here, "..", "..", "build", "libattn_mpi.so"),
             ctypes.util.find_library("attn_mpi")]
    for path in tries:
        if path and (os.path.exists(path) or not os.path.dirname(path)):
            try:
                lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                break
            except OSError:
                continue
    else:
        raise ImportError("attn.ring: libattn_mpi.so not found (set ATTN_MPI_LIB, or build "
                          "with make where mpicc exists)")
    i32, i64, f32, vp = ctypes.c_int32, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
    lib.attn_ring_forward_flat.restype = ctypes.c_int
    lib.attn_ring_forward_flat.argtypes = [vp, vp, vp, vp, vp, i32, i64, i64, i64, i64, i64,
                                           i64, i64, i32, i32, i32, f32, f32, i32, i64, i64,
                                           vp, i32, i32]
    lib.attn_ring_slice.restype = ctypes.c_int
    lib.attn_ring_slice.argtypes = [i64, ctypes.c_int, ctypes.c_int, ctypes.c_bool,
                                    ctypes.POINTER(i64), ctypes.POINTER(i64)]
    lib.attn_ring_last_error.restype = ctypes.c_char_p
    _lib = lib
    return lib


def _comm(comm):
    if comm is None:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
    return comm


def slices(L: int, comm=None, causal: bool = False) -> Sequence[Tuple[int, int]]:
    """This process's rows of a sequence of L rows: ranges (first, count), in the order
    they are held (attn_ring_slice; two ranges when causal, the zigzag split)."""
    comm = _comm(comm)
    lib = _load()
    first, count = (ctypes.c_int64 * 2)(), (ctypes.c_int64 * 2)()
    if lib.attn_ring_slice(integer("L", L), comm.Get_size(), comm.Get_rank(), bool(causal), first, count):
        raise ValueError("attn.ring.slices: " + lib.attn_ring_last_error().decode())
    return [(first[c], count[c]) for c in range(2 if causal else 1)]


def take(x: np.ndarray, comm=None, causal: bool = False, axis: int = 2) -> np.ndarray:
    """This process's rows (along axis) of a global array x."""
    parts = [np.take(x, np.arange(f, f + n), axis=axis)
             for f, n in slices(x.shape[axis], comm, causal)]
    return np.concatenate(parts, axis=axis)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, comm=None, *, causal: bool = False,
              scale: Optional[float] = None, softcap: float = 0.0,
              window: Optional[Tuple[int, int]] = None, kv_len: Optional[np.ndarray] = None,
              align: str = "top-left", threads: int = 1, return_lse: bool = False):
    """O = attention(Q, K, V) over the whole sequence, this process holding its rows.

    q [B, Hq, Lq_r, Dk], k [B, Hkv, Lk_r, Dk], v [B, Hkv, Lk_r, Dv]: this process's rows
    (``take`` / ``slices``), float32 or float16 (k and v converted to q's dtype). Every
    process of comm must call it with the same options. kv_len: the global key lengths
    [B]. Returns O float32 [B, Hq, Lq_r, Dv] (and the LSE [B, Hq, Lq_r] with
    return_lse)."""
    comm = _comm(comm)
    lib = _load()
    q = np.ascontiguousarray(q)
    dt = q.dtype if q.dtype in _DTYPES else np.dtype(np.float32)
    q, k, v = (np.ascontiguousarray(x, dtype=dt) for x in (q, k, v))
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError("attn.ring.attention: q, k, v must be rank 4 [B, H, L, D]")
    B, Hq, lq, Dk = q.shape
    Hkv, lk, Dv = k.shape[1], k.shape[2], v.shape[3]
    o = np.zeros((B, Hq, lq, Dv), dtype=np.float32)
    lse = np.zeros((B, Hq, lq), dtype=np.float32)
    kvl = None if kv_len is None else np.ascontiguousarray(integers("kv_len", kv_len))
    if kvl is not None and kvl.shape != (B,):
        raise ValueError("attn.ring.attention: kv_len must have shape [B]")
    if align not in ("top-left", "bottom-right"):
        raise ValueError("attn.ring.attention: align is 'top-left' or 'bottom-right'")
    wl, wr = (window if window is not None else (0, 0))
    wl, wr = integer("window", wl), integer("window", wr)
    threads = integer("threads", threads, _INT32)
    ptr = lambda a: None if a is None else a.ctypes.data  # noqa: E731
    st = lib.attn_ring_forward_flat(
        ptr(q), ptr(k), ptr(v), ptr(o), ptr(lse), _DTYPES[dt], B, Hq, Hkv, lq, lk, Dk, Dv,
        int(causal), int(align == "bottom-right"), int(scale is not None),
        float(scale or 0.0), float(softcap), int(window is not None), int(wl), int(wr),
        ptr(kvl), int(threads), comm.py2f())
    if st != 0:
        raise RuntimeError("attn.ring.attention: " + lib.attn_ring_last_error().decode())
    return (o, lse) if return_lse else o
