"""_grid.py — attn.weights_grid: the attention weights of a call recomputed from its LSE
by the C library's attn_weights_grid, reduced over blocks of rows and keys — the weights
themselves for a short call, an R x C picture of a long one (100K tokens) without ever
holding the L x S matrix.

    o, lse = attn.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True)
    g = attn.weights_grid(q, k, lse, rows=256, cols=256, is_causal=True)   # (..., 256, 256)
    attn.plot.heatmap(g[0, 0], lengths=(q.shape[-2], k.shape[-2]), scale="log")

It calls the library through ctypes on the extension module's own shared object, as
_additive.py does, so the extension's C code is untouched. What it is not: a second
implementation (attn.plot.weights_from_lse is the NumPy one, for checking); Q and K are
copied to dense float32 first.
"""
from __future__ import annotations

import ctypes
from typing import Any, Optional, Tuple

import numpy as np

from . import _attn
from ._additive import _BOOL, _F32, _Options, _Tensor, _check
from ._options import _INT32, integer, window as _window

_REDUCE = {"sum": 0, "max": 1}
_ALIGN = {"top-left": 0, "bottom-right": 1}
_PATH = {"auto": 0, "fused": 1, "reference": 2}


_lib = ctypes.CDLL(_attn.__file__)
_lib.attn_weights_grid.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int, ctypes.c_void_p]
_lib.attn_weights_grid.restype = ctypes.c_int


def _dense_tensor(a: np.ndarray, dtype: int) -> _Tensor:
    """A C-order array of at most four dimensions as a 4-D tensor, leading 1s added."""
    shape = (1,) * (4 - a.ndim) + a.shape
    st, acc = [0] * 4, 1
    for d in range(3, -1, -1):
        st[d] = acc
        acc *= shape[d]
    return _Tensor(a.ctypes.data if a.size else None, dtype, (ctypes.c_int64 * 4)(*shape),
                   (ctypes.c_int64 * 4)(*st))


def _as4(x: Any, name: str, last: int) -> np.ndarray:
    """x as dense float32 with four dimensions; `last` trailing dimensions kept."""
    a = np.ascontiguousarray(np.asarray(x), dtype=np.float32)
    if not last <= a.ndim <= 4:
        raise ValueError("%s: %d dimensions, expected %d to 4" % (name, a.ndim, last))
    return a.reshape((1,) * (4 - a.ndim) + a.shape)


def weights_grid(query: Any, key: Any, lse: Any, rows: Optional[int] = None,
                 cols: Optional[int] = None, reduce: str = "sum", attn_mask: Any = None,
                 is_causal: bool = False, scale: Optional[float] = None, *,
                 softcap: float = 0.0, window: Optional[Tuple[int, int]] = None,
                 align: str = "top-left", share: bool = False, path: str = "auto",
                 threads: int = 0) -> np.ndarray:
    """The weights exp(s_ij - lse_i) of the call whose log-sum-exp is lse, in blocks:
    cell (r, c) covers the rows i with floor(i R / L) = r and the keys j with
    floor(j C / S) = c, and holds their sum (reduce="sum") or their largest weight
    ("max"); -inf where every entry of the block is masked. Returns float32 of shape
    (B, Hq, R, C) with query's leading dimensions (the 2-D and 3-D forms of query give
    (R, C) and (H, R, C)).

    query (.., Hq, L, D), key (.., Hkv, S, D) (Hq a multiple of Hkv) and lse (.., Hq, L)
    exactly as in the call (attn.scaled_dot_product_attention(..., return_lse=True)),
    with the call's masks: attn_mask (bool, True = attend, or float added to the logits,
    broadcasting to (B, Hq, L, S)), is_causal, scale, softcap, window (left, right; -1 =
    unbounded) and align ("top-left" or "bottom-right", the diagonal of causal and
    window), the names of attn.scaled_dot_product_attention. rows, cols: R and C, 1 <= R <= L, 1 <= C <= S (default: min(L, 256) and
    min(S, 256)); R = L, C = S gives the weights themselves. share=True divides each sum
    by its block's row count (the block's share of its rows' attention, in [0, 1], as
    `attn viz` draws it). path="reference" recomputes on the float64 reference path
    ("auto" and "fused": the fused path's kernels).

    Memory: the grid and a few tiles per thread; time: one pass over K, as the forward.
    The weights come from the given LSE: a wrong one gives wrong weights (rows that do
    not sum to 1), not an error. Raises ValueError for bad shapes or options (the C
    library's message).
    """
    if reduce not in _REDUCE:
        raise ValueError("reduce: %r, expected 'sum' or 'max'" % (reduce,))
    if align not in _ALIGN:
        raise ValueError("align: %r, expected 'top-left' or 'bottom-right'" % (align,))
    if path not in _PATH:
        raise ValueError("path: %r, expected 'auto', 'fused' or 'reference'" % (path,))
    qin = np.asarray(query)
    nd = qin.ndim
    q, k = _as4(query, "query", 2), _as4(key, "key", 2)
    L, S = q.shape[2], k.shape[2]
    lse_a = np.ascontiguousarray(np.asarray(lse), dtype=np.float32)
    if lse_a.shape != qin.shape[:-1]:
        raise ValueError("lse: shape %s, expected query's without its last dimension %s"
                         % (lse_a.shape, qin.shape[:-1]))
    lse4 = lse_a.reshape(q.shape[:3] + (1,))
    R = min(L, 256) if rows is None else integer("rows", rows, _INT32)
    C = min(S, 256) if cols is None else integer("cols", cols, _INT32)
    grid = np.empty(q.shape[:2] + (max(R, 0), max(C, 0)), dtype=np.float32)

    o = _Options()
    if scale is not None:
        o.has_scale, o.scale = True, float(scale)
    o.softcap = float(softcap)
    o.causal = bool(is_causal)
    o.align = _ALIGN[align]
    if window is not None:
        o.has_window = True
        o.window_left, o.window_right = _window(window)
    o.path = _PATH[path]
    o.threads = integer("threads", threads, _INT32)
    keep = []
    if attn_mask is not None:
        m = np.asarray(attn_mask)
        if m.ndim > 4:
            raise ValueError("attn_mask: %d dimensions, expected at most 4" % m.ndim)
        if m.dtype == np.bool_:
            m = np.ascontiguousarray(m)
            t = _dense_tensor(m, _BOOL)
            o.mask = ctypes.addressof(t)
        else:
            m = np.ascontiguousarray(m, dtype=np.float32)
            t = _dense_tensor(m, _F32)
            o.bias = ctypes.addressof(t)
        keep += [m, t]
    tq, tk = _dense_tensor(q, _F32), _dense_tensor(k, _F32)
    tl, tg = _dense_tensor(lse4, _F32), _dense_tensor(grid, _F32)
    st = _lib.attn_weights_grid(ctypes.addressof(tq), ctypes.addressof(tk), ctypes.addressof(tl),
                                ctypes.addressof(tg), _REDUCE[reduce], ctypes.addressof(o))
    _check(st, "weights_grid")
    del keep
    if share and reduce == "sum" and R > 0:
        n = np.diff((np.arange(R + 1) * L + R - 1) // R).astype(np.float32)
        fin = np.isfinite(grid)
        grid = np.where(fin, grid / n[:, None], grid)
    return grid.reshape(qin.shape[:-2] + grid.shape[2:]) if nd < 4 else grid


def block_edges(length: int, cells: int) -> np.ndarray:
    """The first index of each of `cells` blocks of `length` (and `length` at the end):
    the rows or keys cell c covers are edges[c] .. edges[c + 1] - 1."""
    c = np.arange(cells + 1, dtype=np.int64)
    return (c * length + cells - 1) // cells if cells > 0 else np.zeros(1, np.int64)


__all__ = ["weights_grid", "block_edges"]
