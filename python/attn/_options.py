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
    v = _scalar(x)
    if type(v) is not bool:
        raise TypeError("%s=%r: expected a bool, not %s" % (name, x, type(x).__name__))
    return v


def number(name: str, x: Any) -> float:
    """scale, softcap: a real number (not a bool, not a string)."""
    v = _scalar(x)
    if type(v) is bool or not isinstance(v, (int, float)):
        raise TypeError("%s=%r: expected a number, not %s" % (name, x, type(x).__name__))
    try:
        return float(v)
    except OverflowError:
        raise ValueError("%s=%r: does not fit in a float" % (name, x)) from None


def integer(name: str, x: Any, lo_hi: Tuple[int, int]) -> int:
    """threads and the window's ends: an int (not a bool, not a float) within lo_hi."""
    v = _scalar(x)
    if type(v) is bool or not isinstance(v, int):
        raise TypeError("%s=%r: expected an int, not %s" % (name, x, type(x).__name__))
    if not lo_hi[0] <= v <= lo_hi[1]:
        raise ValueError("%s=%d: out of range (%d to %d)" % (name, v, lo_hi[0], lo_hi[1]))
    return v


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
    if not isinstance(x, (list, tuple, range)):
        return x
    if kind == "int":
        return np.asarray([integer(name, e, _INT64) for e in x], dtype=np.int64)
    return np.asarray([number(name, e) for e in x], dtype=np.float32)


def flags(names: Sequence[str], values: Sequence[Any]) -> Tuple[bool, ...]:
    return tuple(flag(n, v) for n, v in zip(names, values))
