"""_huge.py — attn.huge_pages: a KV cache or page pool onto 2 MiB pages (attn_huge_pages,
docs/CONTRACT.md "Huge pages for a cache").

    k = torch.empty(num_pages, page_size, Hkv, D, dtype=torch.bfloat16)
    attn.huge_pages(k)        # once, before or after the cache is filled

The decoding step reads every cached row on every step; on 4 KiB pages a virtual
machine's nested paging costs it a page walk every few dozen keys (docs/BENCHMARKS.md,
"Huge pages"). What it is not: an allocator (the memory stays the caller's array's or
tensor's) or a copy (no value changes; the kernel moves the pages in place).
"""
from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ._additive import _lib

__all__ = ["huge_pages"]

_lib.attn_huge_pages.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_lib.attn_huge_pages.restype = ctypes.c_int
_OK, _UNSUPPORTED = 0, 11  # attn_status: ATTN_OK, ATTN_ERR_UNSUPPORTED


def _span(x: Any) -> tuple:
    """The first byte and the byte count of the memory x's elements lie in."""
    if isinstance(x, np.ndarray):
        try:  # NumPy 2 moved it
            from numpy.lib.array_utils import byte_bounds
        except ImportError:
            byte_bounds = np.byte_bounds
        lo, hi = byte_bounds(x)
        return lo, hi - lo
    if type(x).__module__.startswith("torch") and hasattr(x, "untyped_storage"):
        if x.device.type != "cpu":
            raise ValueError("huge_pages: a CPU tensor expected, got one on %s" % x.device)
        s = x.untyped_storage()
        return s.data_ptr(), s.nbytes()
    raise TypeError("huge_pages: a NumPy array or a torch tensor expected, got %s" % type(x).__name__)


def huge_pages(x: Any) -> bool:
    """Asks that the memory of x (a NumPy array, or a CPU torch tensor's whole storage) be
    backed by 2 MiB pages: the pages already touched moved now, later ones faulted so.
    True where the system took the request, False where it gives no huge pages on request
    (not Linux, or transparent huge pages "never"); x's values never change. Only the
    whole 2 MiB pages inside the memory are covered: an array under 4 MiB may have none."""
    ptr, n = _span(x)
    if n == 0:
        return True
    st = _lib.attn_huge_pages(ptr, n)
    if st == _UNSUPPORTED:
        return False
    if st != _OK:
        raise RuntimeError("attn_huge_pages: " + _lib.attn_last_error().decode())
    return True
