"""_options — the scalar options of attn.scaled_dot_product_attention checked strictly.

What PyTorch's scaled_dot_product_attention accepts is accepted: Python bools for the
flags, Python ints and floats for the numbers, NumPy scalars and 0-d arrays or tensors
(NumPy, PyTorch, JAX) of the right kind for either. Anything else raises TypeError (a
string is never taken as a flag or a number, a float never as a count); a value of the
right kind out of the range the library can hold raises ValueError. Every message begins
with the argument's name, as "name=value: ..." (docs/PYTHON.md, "Errors"). What it is not: the checks of the
values themselves (a negative softcap, window < -1, threads < 0 ...), which the library
makes and reports with its status.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import numpy as np

_INT64 = (-(1 << 63), (1 << 63) - 1)
_INT32 = (-(1 << 31), (1 << 31) - 1)


def _scalar(x: Any) -> Any:
    """A NumPy scalar or a 0-d array or tensor as the Python scalar it holds; anything else
    as it is."""
    if isinstance(x, np.generic):
        return x.item()
    if not isinstance(x, (str, bytes)) and getattr(x, "ndim", None) == 0 and hasattr(x, "item"):
        return x.item()
    return x


def flag(name: str, x: Any) -> bool:
    """is_causal, enable_gqa, return_lse, return_weights: a bool."""
    if x is True or x is False:  # the common case first: this runs on every call
        return x
    v = _scalar(x)
    if type(v) is not bool:
        raise TypeError("%s=%r: expected a bool, not %s" % (name, x, type(x).__name__))
    return v


def number(name: str, x: Any) -> float:
    """scale, softcap: a real number (not a bool, not a string)."""
    if type(x) is float:  # the common case first
        return x
    v = _scalar(x)
    if type(v) is bool or not isinstance(v, (int, float)):
        raise TypeError("%s=%r: expected a number, not %s" % (name, x, type(x).__name__))
    try:
        return float(v)
    except OverflowError:
        raise ValueError("%s=%r: does not fit in a float" % (name, x)) from None


def integer(name: str, x: Any, lo_hi: Tuple[int, int] = _INT64) -> int:
    """The one conversion of every integer a Python entry point passes to the library
    (counts, heads, lengths, offsets, window ends, threads): an int, a NumPy integer or a
    0-d integer array or tensor (not a bool, not a float, not even 2.0) within lo_hi
    (int64 by default), else TypeError / ValueError. Never wraps (ctypes' int64 fields
    and NumPy's casts would), never truncates."""
    if type(x) is int and lo_hi[0] <= x <= lo_hi[1]:  # the common case first
        return x
    v = _scalar(x)
    if type(v) is bool or not isinstance(v, int):
        raise TypeError("%s=%r: expected an int, not %s" % (name, x, type(x).__name__))
    if not lo_hi[0] <= v <= lo_hi[1]:
        raise ValueError("%s=%d: out of range (%d to %d)" % (name, v, lo_hi[0], lo_hi[1]))
    return v


def integers(name: str, x: Any, lo_hi: Tuple[int, int] = _INT64, dtype: Any = np.int64) -> Any:
    """An array of integers (lengths, positions) as a NumPy array of dtype: a list, tuple
    or range of ints (each as integer() takes it), or an array or tensor of an integer
    dtype; every value within lo_hi and dtype. Refused: bools and floating arrays
    (TypeError; a floating one with a fractional or non-finite value: ValueError, naming
    it), values out of range (ValueError)."""
    if isinstance(x, (list, tuple, range)):
        return np.asarray([integer(name, e, lo_hi) for e in x], dtype=dtype)
    t = x
    if hasattr(t, "detach") and hasattr(t, "cpu"):  # a torch tensor
        t = t.detach().cpu().numpy()
    a = np.asarray(t)
    if a.dtype.kind == "b" or a.dtype.kind not in "iuf":
        raise TypeError("%s: expected integers, got dtype %s" % (name, a.dtype))
    info = np.iinfo(dtype)
    lo, hi = max(lo_hi[0], int(info.min)), min(lo_hi[1], int(info.max))
    if a.dtype.kind == "f":
        if a.size and not (np.all(np.isfinite(a)) and np.all(a == np.floor(a))):
            raise ValueError("%s: values must be whole numbers, got %s" % (name, a.ravel()[
                np.flatnonzero(~np.isfinite(a.ravel()) | (a.ravel() != np.floor(a.ravel())))[0]]))
        # whole numbers in a floating array: still the wrong type, as a length tensor is
        raise TypeError("%s: dtype %s, expected an integer dtype" % (name, a.dtype))
    if a.size and (int(a.min()) < lo or int(a.max()) > hi):
        raise ValueError("%s: a value is out of range (%d to %d)" % (name, lo, hi))
    return a if a.dtype == dtype else a.astype(dtype)


def threads(x: Any) -> int:
    return integer("threads", x, _INT32)


def window(x: Any) -> Optional[Tuple[int, int]]:
    """None, or (left, right) of ints within int64."""
    if x is None:
        return None
    try:
        left, right = x
    except (TypeError, ValueError):
        raise ValueError("window=%r: expected (left, right), two ints, -1 = unbounded" % (
            x,)) from None
    return (integer("window", left, _INT64), integer("window", right, _INT64))


def sequence(name: str, x: Any, kind: str) -> Any:
    """kv_len ("int") or alibi_slopes ("float") given as a Python list, tuple or range: its
    elements checked as ints (within int64) or numbers, then a NumPy array. Arrays and
    tensors are returned as they are (the extension checks their dtype)."""
    if kind == "int":  # float and bool arrays too: refused there (integers)
        if isinstance(x, (list, tuple, range)) or getattr(getattr(x, "dtype", None), "kind",
                                                            "i") in "fb":
            return integers(name, x)
        return x
    if not isinstance(x, (list, tuple, range)):
        return x
    return np.asarray([number(name, e) for e in x], dtype=np.float32)


def flags(names: Sequence[str], values: Sequence[Any]) -> Tuple[bool, ...]:
    return tuple(flag(n, v) for n, v in zip(names, values))
